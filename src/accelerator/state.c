/* The Accelerator's state: options and environment, process queries and
 * control, prepare of optimizers/schedulers/loaders, autocast. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "accelerator_internal.h"
#include "device_pick.h"
#include "strategy.h"
#include "backends/fp8.h"
#include "fp8_scaling.h"
#include "parallelism_env.h"
#include "accel/cpu.h"
#include "backends/cpu/gemm.h"
#include "gemm_choices.h"
#include "core/env.h"
#include "dist/backend.h"
#include "dist/env_rank.h"

accel_accelerator_opts accel_accelerator_opts_default(void) {
    accel_accelerator_opts o;
    memset(&o, 0, sizeof o); /* every zero field means its default */
    return o;
}

/* The zero fields get their defaults; a value no default can fix is refused. */
static accel_status resolve_scaler(accel_accelerator_opts *o) {
    if (o->init_scale == 0) o->init_scale = 65536.0;
    if (o->growth_factor == 0) o->growth_factor = 2.0;
    if (o->backoff_factor == 0) o->backoff_factor = 0.5;
    if (o->growth_interval == 0) o->growth_interval = 2000;
    /* torch.amp.GradScaler asserts growth_factor > 1 and backoff_factor < 1
     * (a factor of 1 was taken here), and keeps the scale in float32: an
     * init_scale past FLT_MAX is its inf */
    const char *bad = !(o->init_scale > 0 && o->init_scale <= FLT_MAX) ? "init_scale must be > 0 and at most "
                                                                         "float32's largest, 3.4e38"
                      : !(o->growth_factor > 1 && isfinite(o->growth_factor)) ? "growth_factor must be > 1"
                      : !(o->backoff_factor > 0 && o->backoff_factor < 1)    ? "backoff_factor must be in (0, 1)"
                      : o->growth_interval < 0                                ? "growth_interval must be >= 1 (0: the default, 2000)"
                                                                              : NULL;
    if (bad)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_new: fp16 scaler option %s, as torch.amp.GradScaler's (init_scale "
                               "%g, growth_factor %g, backoff_factor %g, growth_interval %lld)",
                               bad, o->init_scale, o->growth_factor, o->backoff_factor, (long long)o->growth_interval);
    o->init_scale = (float)o->init_scale; /* GradScaler's scale is a float32 tensor */
    return ACCEL_OK;
}

/* The first of a and b that is set (empty counts: core/env.h), or NULL. */
static const char *env2(const char *a, const char *b) { return getenv(a) ? a : getenv(b) ? b : NULL; }

/* Whether ACCELERATE_USE_CPU or ACCEL_USE_CPU says cpu (either, as `accel
 * launch` reads them), each as Accelerate's str_to_bool reads it: a value
 * that is no boolean is refused, not read as false. Not read when the code
 * asked for the cpu (Accelerate's `cpu or parse_flag_from_env(...)`). */
static accel_status use_cpu_env(const accel_accelerator_opts *o, bool *out) {
    static const char *const NAMES[] = {"ACCELERATE_USE_CPU", "ACCEL_USE_CPU"};
    *out = false;
    for (int i = 0; i < 2 && !o->cpu; i++) {
        bool on;
        if (accel__env_bool(NAMES[i], false, &on)) return accel_last_status();
        *out = *out || on;
    }
    return ACCEL_OK;
}

/* The device: cpu when the code asks; else the one ACCEL_DEFAULT_DEVICE names
 * (an explicit choice, so it wins over the ACCEL_USE_CPU that `accel launch`
 * sets on a machine without a GPU); else cuda:<local_rank> when present. */
static accel_device pick_device(const accel_accelerator_opts *o, bool cpu_env, int local_rank) {
    accel_device cuda = {ACCEL_DEV_CUDA, local_rank}, dflt = accel_default_device();
    return o->cpu                                    ? ACCEL_CPU_DEVICE
           : dflt.type != ACCEL_DEV_CPU             ? dflt
           : !cpu_env && accel_device_available(cuda) ? cuda
                                                     : ACCEL_CPU_DEVICE;
}

accel_status accel__accelerator_device(int local_rank, accel_device *out) {
    accel_accelerator_opts o = {0};
    bool cpu_env;
    *out = ACCEL_CPU_DEVICE;
    if (use_cpu_env(&o, &cpu_env)) return accel_last_status();
    *out = pick_device(&o, cpu_env, local_rank);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- fp8 */

/* fp8's configuration is checked before the device, so that a bad recipe or
 * ZeRO is refused on every machine: the recipe, then no ZeRO (stages 1-3:
 * see docs/cuda.md "fp8"), then a device with fp8 GEMMs (a CUDA GPU of
 * compute capability >= 8.9), refused elsewhere with the device's reason:
 * the cpu, a GPU below 8.9 (Accelerate falls back to fp16 there; accel
 * refuses). */
static accel_status accept_fp8(const accel_accelerator_opts *o, bool cpu_env, const accel__zero_cfg *zc) {
    if (!accel__strategy_of(zc->stage)->fp8)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "accel_accelerator_new: fp8 mixed precision with ZeRO stage %d (DeepSpeed / FSDP) is "
                               "not supported; use fp8 with DDP or a single process",
                               zc->stage);
    return accel__fp8_device_check(pick_device(o, cpu_env, accel_dist_local_rank()), "accel_accelerator_new");
}

/* s: the option's text, or that of the variable `var` (NULL: the option's). */
static accel_status parse_precision(const char *s, const char *var, const accel_accelerator_opts *o,
                                    accel_mixed_precision *out, accel__fp8_recipe *fp8) {
    bool is_fp8 = s && !strcasecmp(s, "fp8");
    if (accel__fp8_recipe_resolve(o, is_fp8, fp8) != ACCEL_OK) return accel_last_status();
    if (!s || !strcasecmp(s, "no")) *out = ACCEL_MP_NO;
    else if (!strcasecmp(s, "bf16")) *out = ACCEL_MP_BF16;
    else if (!strcasecmp(s, "fp16")) *out = ACCEL_MP_FP16;
    else if (is_fp8) *out = ACCEL_MP_FP8;
    else
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_new: %s%sUnknown mixed_precision mode: %s. Choose between "
                               "['no', 'fp8', 'fp16', 'bf16']",
                               var ? var : "", var ? ": " : "", s);
    return ACCEL_OK;
}

/* What accel_accelerator_new settles from its options and the environment
 * before it joins the job's group. */
typedef struct settled {
    accel_accelerator_opts o;
    accel__parallelism_env pe;
    accel_mixed_precision mp;
    accel__fp8_recipe fp8;
    accel__zero_cfg zc;
    bool cpu_env;
    int steps;
} settled;

static accel_status settle(const accel_accelerator_opts *opts, settled *s) {
    s->o = opts ? *opts : accel_accelerator_opts_default();
    accel_accelerator_opts *o = &s->o;
    /* before the ZeRO stage and clipping are read: Megatron's may set them */
    if (resolve_scaler(o) || accel__parallelism_env_read(o, &s->pe)) return accel_last_status();
    s->mp = ACCEL_MP_NO;
    const char *mp_var = o->mixed_precision ? NULL : env2("ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION");
    const char *mps = mp_var ? getenv(mp_var) : o->mixed_precision;
    if (parse_precision(mps, mp_var, o, &s->mp, &s->fp8) || accel__zero_config(o, &s->zc) ||
        use_cpu_env(o, &s->cpu_env))
        return accel_last_status();
    if (s->mp == ACCEL_MP_FP8 && accept_fp8(o, s->cpu_env, &s->zc)) return accel_last_status();
    if (s->zc.mp >= 0 && (accel_mixed_precision)s->zc.mp != s->mp) {
        /* The DeepSpeed JSON decides unless the code or the launcher chose another precision. */
        if (o->mixed_precision || s->mp != ACCEL_MP_NO)
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_accelerator_new: mixed precision %s disagrees with the DeepSpeed config's %s",
                                   accel_mixed_precision_name(s->mp),
                                   accel_mixed_precision_name((accel_mixed_precision)s->zc.mp));
        s->mp = (accel_mixed_precision)s->zc.mp;
    }
    s->steps = o->gradient_accumulation_steps;
    if (s->steps == 0) {
        const char *var = env2("ACCEL_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
        long from_env = 1;
        if (var && accel__env_long(var, 1, 1, INT_MAX, &from_env)) return accel_last_status();
        s->steps = (int)from_env;
        if (s->zc.accum) {
            /* The launcher always sets 1; anything else must agree with the JSON. */
            if (s->steps != 1 && s->steps != s->zc.accum)
                return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                       "accel_accelerator_new: gradient_accumulation_steps %d disagrees with the "
                                       "DeepSpeed config's %d", s->steps, s->zc.accum);
            s->steps = s->zc.accum;
        }
    }
    if (s->steps < 1)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_new: gradient_accumulation_steps must be >= 1 (got %d)", s->steps);
    if (o->total_limit < 0) /* 0 keeps them all; a negative count kept them all too, silently */
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_new: total_limit must be >= 0 (0 keeps every checkpoint; got %d)",
                               o->total_limit);
    if (o->bucket_cap_bytes < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_new: bucket_cap_bytes must be >= 0 (got %lld)",
                               (long long)o->bucket_cap_bytes);
    if (o->bucket_cap_bytes == 0) o->bucket_cap_bytes = s->zc.bucket_bytes ? s->zc.bucket_bytes : 25 << 20;
    return ACCEL_OK;
}

accel_accelerator *accel_accelerator_new(const accel_accelerator_opts *opts) {
    settled s;
    if (settle(opts, &s) != ACCEL_OK) {
        accel__dist_failed_early(); /* the other ranks are told at exit, not left waiting for this one */
        return NULL;
    }
    accel_accelerator_opts *o = &s.o;
    if (accel_dist_init() != ACCEL_OK) return NULL; /* this accelerator's reference to the group */
    accel_accelerator *acc = accel_calloc(1, sizeof *acc);
    if (!acc) {
        accel_dist_finalize();
        return NULL;
    }
    acc->magic = ACCEL__MAGIC_ACCELERATOR;
    acc->o = *o;
    acc->o.mixed_precision = NULL;
    /* "" is the working directory, as os.path.join("", "checkpoints") is Accelerate's
     * (not "/checkpoints" at the file system's root) */
    acc->project_dir =
        accel_strdup(!o->project_dir ? accel__default_project_dir() : *o->project_dir ? o->project_dir : ".");
    acc->o.project_dir = acc->project_dir;
    acc->mp = s.mp;
    if (s.mp == ACCEL_MP_FP8) {
        acc->fp8 = s.fp8;
        acc->fp8.deferred_update = true; /* once per forward and backward, amaxes reduced (fp8_scaling.h) */
    }
    acc->pg = accel_dist_default_group();
    acc->rank = accel_pg_rank(acc->pg);
    acc->world = accel_pg_size(acc->pg);
    acc->local_rank = accel_dist_local_rank();
    acc->local_world = accel_dist_local_world_size();
    acc->device = pick_device(o, s.cpu_env, acc->local_rank);
    acc->accum_steps = s.steps;
    acc->sync_gradients = true;
    acc->scale = acc->backward_scale = s.mp == ACCEL_MP_FP16 ? o->init_scale : 1.0;
    acc->strat = accel__strategy_of(s.zc.stage);
    acc->fsdp = s.zc.fsdp;
    acc->offload = s.zc.offload;
    acc->clip = s.zc.clip;
    acc->recompute_layers = s.pe.recompute_activations;
    acc->o.deepspeed_config_file = acc->o.fsdp_sharding_strategy = NULL; /* borrowed: not kept */
    /* every rank multiplies on rank 0's GEMM choices (docs/cpu.md "Measured choice") */
    if (accel__gemm_choices_share(acc->pg)) return accel_accelerator_free(acc), NULL;
    accel_status laid = accel__offload_check_device(acc) ? accel_last_status()
                                                          : accel__parallelism_env_resolve(o, &s.pe, acc->world, &acc->par);
    if (accel__parallelism_agree(acc->pg, laid, &acc->par, acc->strat->stage, s.zc.hybrid) ||
        accel__zero_groups(acc, s.zc.hybrid, &acc->par) || accel__cp_setup(acc))
        return accel_accelerator_free(acc), NULL;
    if (accel__tracking_attach(acc)) return accel_accelerator_free(acc), NULL;
    return acc;
}

void accel_accelerator_free(accel_accelerator *acc) {
    if (!acc || accel__acc_null(acc, "accel_accelerator_free")) return;
    accel__tracking_detach(acc);
    /* a free returns nothing: what the releases lost is said on stderr
     * (accel_accelerator_clear first returns it) */
    if (accel_accelerator_clear(acc))
        fprintf(stderr, "accel: warning: accel_accelerator_free: %s\n", accel_last_error());
    accel__zero_groups_free(acc);
    accel__fp8_log_free(&acc->fp8_backward);
    accel_free(acc->project_dir);
    acc->magic = 0;
    accel_free(acc);
    accel_dist_finalize();
}

/* ---------------------------------------------------------------- queries */

accel_device accel_accelerator_device(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? ACCEL_CPU_DEVICE : acc->device;
}
int accel_accelerator_num_processes(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 1 : acc->world;
}
int accel_accelerator_process_index(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 0 : acc->rank;
}
int accel_accelerator_local_process_index(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 0 : acc->local_rank;
}
bool accel_accelerator_is_main_process(const accel_accelerator *acc) {
    return !accel__acc_null(acc, __func__) && acc->rank == 0;
}
bool accel_accelerator_is_local_main_process(const accel_accelerator *acc) {
    return !accel__acc_null(acc, __func__) && acc->local_rank == 0;
}
bool accel_accelerator_is_last_process(const accel_accelerator *acc) {
    return !accel__acc_null(acc, __func__) && acc->rank == acc->world - 1;
}
accel_mixed_precision accel_accelerator_mixed_precision(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? ACCEL_MP_NO : acc->mp;
}

const char *accel_mixed_precision_name(accel_mixed_precision mp) {
    return mp == ACCEL_MP_BF16 ? "bf16" : mp == ACCEL_MP_FP16 ? "fp16" : mp == ACCEL_MP_FP8 ? "fp8" : "no";
}

int accel_accelerator_gradient_accumulation_steps(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 1 : acc->accum_steps;
}
accel_status accel_accelerator_set_gradient_accumulation_steps(accel_accelerator *acc, int steps) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    if (steps < 1)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_set_gradient_accumulation_steps: steps must be >= 1 (got %d)", steps);
    acc->accum_steps = steps;
    return ACCEL_OK;
}
bool accel_accelerator_sync_gradients(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? false : acc->sync_gradients;
}
int64_t accel_accelerator_step(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 0 : acc->step;
}
double accel_accelerator_loss_scale(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 1.0 : acc->scale;
}
int accel_accelerator_zero_stage(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 0 : acc->strat->stage;
}
double accel_accelerator_gradient_clipping(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 0.0 : acc->clip;
}

accel_status accel_accelerator_zero_shard(accel_accelerator *acc, const accel_module *model, int64_t *lo,
                                          int64_t *hi, int64_t *padded) {
    accel__model *pm = acc ? accel__find_model(acc, model) : NULL;
    if (!pm) return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_zero_shard: the model was not prepared");
    int64_t n = pm->fp->buffers[ACCEL_F32].numel;
    accel_status st = pm->strat->shard_range(acc, pm, lo, hi);
    if (st) return st;
    if (padded) *padded = n;
    return ACCEL_OK;
}

bool accel_accelerator_optimizer_step_was_skipped(const accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return false;
    for (int i = 0; i < acc->n_opts; i++)
        if (acc->scaler_of[i].skipped) return true;
    return false;
}

const char *accel_accelerator_describe(const accel_accelerator *acc, char *buf, size_t n) {
    if (accel__acc_null(acc, __func__)) return NULL;
    if (!buf || !n) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_describe: buf is NULL or empty");
        return NULL;
    }
    char dev[32];
    if (acc->world > 1)
        snprintf(buf, n,
                 "Distributed environment: %s  Backend: %s\nNum processes: %d\nProcess index: %d\n"
                 "Local process index: %d\nDevice: %s\nMixed precision type: %s\n",
                 acc->device.type == ACCEL_DEV_CUDA ? "MULTI_GPU" : "MULTI_CPU", accel_pg_backend(acc->pg),
                 acc->world, acc->rank, acc->local_rank, accel_device_str(acc->device, dev, sizeof dev),
                 accel_mixed_precision_name(acc->mp));
    else
        snprintf(buf, n,
                 "Distributed environment: NO\nNum processes: 1\nProcess index: 0\nLocal process index: 0\n"
                 "Device: %s\nMixed precision type: %s\n",
                 accel_device_str(acc->device, dev, sizeof dev), accel_mixed_precision_name(acc->mp));
    accel__gemm_describe(buf + strlen(buf), n - strlen(buf)); /* "GEMM f32: ...\nGEMM bf16: ...\n..." */
    accel_cpu_describe(buf + strlen(buf), n - strlen(buf)); /* "CPU: ...\nISA: ...\nCPU kernels: ...\n" */
    return buf;
}

/* ---------------------------------------------------------------- process control */

void accel_accelerator_print(const accel_accelerator *acc, const char *fmt, ...) {
    if (!acc || acc->local_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

accel_status accel_accelerator_wait_for_everyone(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    return acc->world > 1 ? accel_pg_barrier(acc->pg) : ACCEL_OK;
}

/* The others' barrier in begin meets the main process's in end: from other
 * lines by design, so its call site is not compared across ranks. */
accel_status accel_accelerator_main_process_first_begin(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    /* Unpaired, the main process's barrier in end would meet none on the
     * others (a hang); every rank makes the same calls, so each refuses. */
    if (acc->main_first_open)
        return accel_set_error(ACCEL_ERR_STATE, "%s: already inside main_process_first (call _end first)", __func__);
    acc->main_first_open = true;
    if (acc->rank == 0) return ACCEL_OK;
    accel_dist_allow_other_call_sites();
    return accel_accelerator_wait_for_everyone(acc);
}

accel_status accel_accelerator_main_process_first_end(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    if (!acc->main_first_open)
        return accel_set_error(ACCEL_ERR_STATE, "%s: not inside main_process_first (no _begin before it)", __func__);
    acc->main_first_open = false;
    if (acc->rank != 0) return ACCEL_OK;
    accel_dist_allow_other_call_sites();
    return accel_accelerator_wait_for_everyone(acc);
}

accel_process_split accel_accelerator_split_between_processes(const accel_accelerator *acc, int64_t n) {
    if (accel__acc_null(acc, __func__)) return (accel_process_split){0, 0, 0};
    int64_t N = acc->world, r = acc->rank, q = n / N, rem = n % N;
    accel_process_split s;
    s.start = r * q + (r < rem ? r : rem);
    s.end = s.start + q + (r < rem ? 1 : 0);
    s.padded = q + (rem > 0 ? 1 : 0);
    return s;
}

/* device_specific: seed + the rank, but one seed for the ranks of a tp group
 * (consecutive ranks, mesh.h): they hold replicas of the activations
 * outside the tp regions, whose dropout masks (the default generator's)
 * must agree; their sharded activations draw from the model's per-rank
 * stream (nn/tp_internal.h). No accelerator: Accelerate's set_seed(seed),
 * a module function ported code calls before making one, seeds the process
 * all the same, + the launcher's rank (PartialState's process_index) when
 * device_specific; a no-op here lost that seeding silently. */
accel_status accel_set_seed(const accel_accelerator *acc, uint64_t seed, bool device_specific) {
    if (!acc) {
        /* the tp size the environment gives the accelerator to come (its options' defaults) */
        int rank = 0;
        accel_accelerator_opts o = accel_accelerator_opts_default();
        accel__parallelism_env pe;
        if (device_specific && accel__dist_env_rank(&rank) != ACCEL_OK) return accel_last_status();
        if (device_specific && accel__parallelism_env_read(&o, &pe) != ACCEL_OK) {
            char inner[768];
            snprintf(inner, sizeof inner, "%s", accel_last_error());
            return accel_set_error(accel_last_status(), "accel_set_seed (the tensor-parallel size the rank is "
                                   "divided by): %s", inner);
        }
        int tp = o.parallelism.tp_size;
        accel_manual_seed(seed + (uint64_t)(rank / (tp > 0 ? tp : 1)));
        return ACCEL_OK;
    }
    int tp = acc->mesh.size[ACCEL__MESH_TP];
    accel_manual_seed(seed + (device_specific ? (uint64_t)(acc->rank / (tp > 0 ? tp : 1)) : 0));
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- prepared objects */

static accel_status too_many(const char *what) {
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare: more than %d %s",
                           ACCEL__MAX_PREPARED, what);
}

/* Removes element i of an array of n elements of the given size. */
static void remove_at(void *array, int *n, int i, size_t size) {
    char *a = array;
    memmove(a + (size_t)i * size, a + (size_t)(i + 1) * size, (size_t)(*n - i - 1) * size);
    (*n)--;
}

/* ---------------------------------------------------------------- forgetting
 * Each prepared object carries a link back to its accelerator (core/link.h):
 * freeing the object first calls the *_detached function below, freeing the
 * accelerator first removes the links. */

/* Both forget whatever their releases lose and return the first loss (with
 * its message): the object is the user's again either way. */
static accel_status forget_model(accel_accelerator *acc, accel__model *pm) {
    accel__first_error first = {0};
    for (int i = 0; i < acc->n_opts; i++)
        if (accel__optimizer_model(acc, i) == pm)
            accel__first_error_note(&first, acc->strat->release_optimizer(acc, i, true));
    accel__first_error_note(&first, accel__model_release(acc, pm));
    remove_at(acc->models, &acc->n_models, (int)(pm - acc->models), sizeof *pm);
    return accel__first_error_return(&first);
}

/* consolidate: give a ZeRO-sharded optimizer its full state back (collective);
 * false when the optimizer is being freed. */
static accel_status forget_optimizer(accel_accelerator *acc, int i, bool consolidate) {
    accel_status st = acc->strat_opt[i] ? acc->strat->release_optimizer(acc, i, consolidate) : ACCEL_OK;
    int n = acc->n_opts;
    accel_free(acc->pp_opt[i]);
    remove_at(acc->pp_opt, &n, i, sizeof acc->pp_opt[0]);
    n = acc->n_opts;
    remove_at(acc->strat_opt, &n, i, sizeof acc->strat_opt[0]);
    n = acc->n_opts;
    remove_at(acc->scaler_of, &n, i, sizeof acc->scaler_of[0]);
    remove_at(acc->opts, &acc->n_opts, i, sizeof acc->opts[0]);
    return st;
}

static int index_of(void *const *objs, int n, const void *obj) {
    for (int i = 0; i < n; i++)
        if (objs[i] == obj) return i;
    return -1;
}

/* The model is being freed, and a free returns nothing: a release that
 * fails (an optimizer re-targeted to it, which lives on, could not get its
 * consolidated state back) is printed as a warning. */
static void model_detached(void *owner, void *obj) {
    accel_accelerator *acc = owner;
    accel__model *pm = accel__find_model(acc, obj);
    if (pm && forget_model(acc, pm)) fprintf(stderr, "accel: warning: accel_module_free: %s\n", accel_last_error());
}

/* The model's parameters are sharded (its strategy writes the weights:
 * ZeRO-3 gathers them): its tensors hold the pieces this process keeps, the
 * rest unmapped (zeros if read). */
static const char *model_away(void *owner, const void *obj) {
    const accel__model *pm = accel__find_model(owner, obj);
    return pm && pm->strat->save_model ? "the model's parameters are sharded across processes (FSDP FULL_SHARD / "
                                         "ZeRO-3): each holds only its pieces; save it with "
                                         "accel_accelerator_save_model, which gathers the full weights"
                                       : NULL;
}

static void optimizer_detached(void *owner, void *obj) {
    accel_accelerator *acc = owner;
    int i = index_of((void *const *)acc->opts, acc->n_opts, obj);
    if (i >= 0) (void)forget_optimizer(acc, i, false); /* no consolidation: cannot fail */
}

static void dataloader_detached(void *owner, void *obj) {
    accel_accelerator *acc = owner;
    accel__dataloader_place(obj, ACCEL_CPU_DEVICE); /* its batches back in host memory */
    int i = index_of((void *const *)acc->dls, acc->n_dls, obj);
    if (i >= 0) remove_at(acc->dls, &acc->n_dls, i, sizeof acc->dls[0]);
}

static void scheduler_detached(void *owner, void *obj) {
    accel_accelerator *acc = owner;
    int i = index_of((void *const *)acc->scheds, acc->n_scheds, obj);
    if (i >= 0) remove_at(acc->scheds, &acc->n_scheds, i, sizeof acc->scheds[0]);
}

/* ACCEL_OK with *mine set when acc already prepared the object; an error when
 * another accelerator did (an object has one accelerator, as in Accelerate). */
static accel_status check_owner(const accel_accelerator *acc, accel__link *links, accel__detach_fn fn,
                                const char *fn_name, const char *what, bool *mine) {
    void *owner = accel__link_owner(links, fn);
    *mine = owner == acc;
    if (owner && !*mine)
        return accel_set_error(ACCEL_ERR_STATE, "%s: the %s is already prepared by another accelerator "
                               "(un-prepare it there first)", fn_name, what);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- prepare */

/* Megatron's recompute_activations: every decoder layer checkpointed, as
 * accel_module_set_gradient_checkpointing on the model does. */
static accel_status recompute_layers(accel_module *model) {
    if (!accel_module_set_gradient_checkpointing(model, true)) return ACCEL_OK;
    char inner[768];
    snprintf(inner, sizeof inner, "%s", accel_last_error());
    return accel_set_error(accel_last_status(), "accel_accelerator_prepare_model: MEGATRON_LM_RECOMPUTE_ACTIVATIONS "
                           "asks to recompute the model's activations, and %s", inner);
}

/* Whether the optimizer's first parameter lies in the prepared model's f32 flat buffer. */
static bool over_model(const accel__model *pm, accel_optimizer *opt) {
    accel_tensor *p = accel_optimizer_num_segments(opt) > 0 ? accel_optimizer_segment_param(opt, 0, NULL) : NULL;
    const accel_flat_buffer *b = pm->fp ? &pm->fp->buffers[ACCEL_F32] : NULL;
    for (int t = 0; p && b && t < b->n; t++)
        if (b->tensors[t] == p) return true;
    return false;
}

accel_status accel_accelerator_prepare_model(accel_accelerator *acc, accel_module *model) {
    if (!acc || !model)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare_model: NULL argument");
    bool mine;
    accel_status st = check_owner(acc, model->links, model_detached, __func__, "model", &mine);
    if (mine) return ACCEL_OK;
    if (!st && acc->n_models == ACCEL__MAX_PREPARED) st = too_many("models");
    if (!st && acc->recompute_layers) st = recompute_layers(model);
    /* this rank's refusals agreed on before the prepare's first collective: ranks that built
     * different models (one recompute refused) left the others there until ACCEL_DIST_TIMEOUT */
    if ((st = accel__prepare_agree(acc, st, "accept the model"))) return st;
    accel__model *pm = &acc->models[acc->n_models];
    memset(pm, 0, sizeof *pm);
    pm->m = model;
    if ((st = accel__model_prepare(acc, pm))) {
        memset(pm, 0, sizeof *pm);
        return st;
    }
    acc->n_models++;
    accel__first_error first = {0}; /* the first failure, whatever the undoing adds */
    /* An optimizer prepared before this model (listed first in a prepare
     * call, or its own call first) keeps its state where the parameters
     * were: it follows them to where the placement put them. Local steps,
     * agreed on before the undo, whose release is collective under ZeRO. */
    for (int i = 0; i < acc->n_opts && !st; i++) st = accel__optimizer_follow_params(acc->opts[i]);
    if (!st) st = accel__link_add(&model->links, model_detached, acc);
    if (!st) accel__link_set_away(model->links, acc, model_away);
    accel__first_error_note(&first, accel__prepare_agree(acc, st, "take the model"));
    /* An optimizer over this model that its strategy let go of when the model
     * was unprepared (ZeRO: its shard given back) is sharded again: stepped
     * whole, it read the full parameters ZeRO-3 no longer maps and the
     * gradients ZeRO-2 reduced only in each rank's shard. */
    for (int i = 0; i < acc->n_opts && !first.st && acc->strat->prepare_optimizer; i++)
        if (!acc->strat_opt[i] && over_model(pm, acc->opts[i]))
            accel__first_error_note(&first, acc->strat->prepare_optimizer(acc, i));
    if (first.st) {
        accel__link_remove(&model->links, acc); /* else a retry would find it prepared */
        accel__first_error_note(&first, forget_model(acc, pm));
    }
    return accel__first_error_return(&first);
}

accel_status accel_accelerator_prepare_optimizer(accel_accelerator *acc, accel_optimizer *opt) {
    if (!acc || !opt)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare_optimizer: NULL argument");
    bool mine = false;
    accel__link **links = accel__optimizer_links(opt);
    accel_status st = accel__optimizer_usable(opt, __func__) ? ACCEL_OK : accel_last_status();
    if (!st) st = check_owner(acc, *links, optimizer_detached, __func__, "optimizer", &mine);
    if (mine) return ACCEL_OK;
    if (!st && acc->n_opts == ACCEL__MAX_PREPARED) st = too_many("optimizers");
    /* this rank's refusals agreed on before the first collective (the agreement below, ZeRO's
     * shard): an optimizer refused on one rank alone (its model freed there) left the others there */
    if ((st = accel__prepare_agree(acc, st, "accept the optimizer"))) return st;
    acc->scaler_of[acc->n_opts] = (accel__opt_scaler){0};
    acc->opts[acc->n_opts] = opt;
    acc->strat_opt[acc->n_opts] = NULL;
    /* its state where prepare placed the model, then the stage's parameters (pp), then its link:
     * local steps, agreed on before the strategy's shard of them (ZeRO), which agrees on itself; undone
     * locally, so every rank returns the first failure with nothing prepared */
    st = accel__optimizer_follow_params(opt);
    if (!st) st = accel__pipeline_prepare_optimizer(acc, acc->n_opts);
    if (!st) st = accel__link_add(links, optimizer_detached, acc);
    st = accel__prepare_agree(acc, st, "take the optimizer");
    if (!st && acc->strat->prepare_optimizer) st = acc->strat->prepare_optimizer(acc, acc->n_opts);
    if (st) {
        accel__link_remove(links, acc);
        accel__pipeline_unprepare_optimizer(acc, acc->n_opts);
        return st;
    }
    acc->n_opts++;
    return ACCEL_OK;
}

accel_status accel_accelerator_prepare_scheduler(accel_accelerator *acc, accel_lr_scheduler *s) {
    if (!acc || !s)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare_scheduler: NULL argument");
    bool mine;
    accel__link **links = accel__scheduler_links(s);
    accel_status st = check_owner(acc, *links, scheduler_detached, __func__, "scheduler", &mine);
    if (st || mine) return st;
    if (acc->n_scheds == ACCEL__MAX_PREPARED) return too_many("schedulers");
    if ((st = accel__link_add(links, scheduler_detached, acc))) return st;
    acc->scheds[acc->n_scheds++] = s;
    return ACCEL_OK;
}

accel_status accel_accelerator_prepare_dataloader(accel_accelerator *acc, accel_dataloader *dl) {
    if (!acc || !dl)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare_dataloader: NULL argument");
    bool mine;
    accel__link **links = accel__dataloader_links(dl);
    accel_status st = check_owner(acc, *links, dataloader_detached, __func__, "data loader", &mine);
    if (mine) return ACCEL_OK;
    if (!st && acc->n_dls == ACCEL__MAX_PREPARED) st = too_many("data loaders");
    /* agreed on before the sharding's agreement and the seed's broadcast, as the model's */
    if ((st = accel__prepare_agree(acc, st, "accept the data loader"))) return st;
    int data_rank, data_world;
    accel__tp_data_rank(acc, &data_rank, &data_world);
    /* Each local step agreed before the next collective (a rank that
     * stopped alone left the others in the seed's broadcast or in the first
     * step's); a failure anywhere gives the loader back as it came, on
     * every rank. */
    accel_dataloader_opts before = *accel_dataloader_get_opts(dl);
    st = accel_dataloader_shard(dl, data_world, data_rank, acc->o.split_batches, !acc->o.no_even_batches);
    st = accel__prepare_agree(acc, st, "shard the data loader");
    if (!st && acc->world > 1) {
        /* synchronize_rng_states: every rank shuffles with rank 0's seed. */
        uint64_t seed = before.seed;
        st = accel_pg_broadcast(acc->pg, &seed, 1, ACCEL_I64, 0);
        if (!st) accel_dataloader_set_seed(dl, seed);
    }
    if (!st) {
        st = accel__prepare_agree(acc, accel__link_add(links, dataloader_detached, acc), "link the data loader");
        if (st) accel__link_remove(links, acc); /* made here, another rank's failed */
    }
    if (st) { /* its sharding and seed as they were (both valid: it had them) */
        accel_dataloader_shard(dl, before.num_processes, before.process_index, before.split_batches,
                               !before.no_even_batches);
        accel_dataloader_set_seed(dl, before.seed);
        return st;
    }
    if (!acc->o.no_device_placement) accel__dataloader_place(dl, acc->device);
    acc->dls[acc->n_dls++] = dl;
    return ACCEL_OK;
}

static accel_status prepare_one(accel_accelerator *acc, const accel_preparable *p) {
    if (!p->obj) return ACCEL_OK; /* a NULL argument: nothing to prepare */
    switch (p->kind) {
    case ACCEL_PREPARE_MODEL: return accel_accelerator_prepare_model(acc, p->obj);
    case ACCEL_PREPARE_OPTIMIZER: return accel_accelerator_prepare_optimizer(acc, p->obj);
    case ACCEL_PREPARE_DATALOADER: return accel_accelerator_prepare_dataloader(acc, p->obj);
    case ACCEL_PREPARE_SCHEDULER: return accel_accelerator_prepare_scheduler(acc, p->obj);
    case ACCEL_PREPARE_NONE: break;
    }
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare: object of unknown kind %d",
                           (int)p->kind);
}

/* Model objs[i]: under tensor parallelism the plan replaces its parameters
 * with their slices, so the optimizers of the call (prepared after every
 * model: accel_accelerator_prepare_array's passes), made over the whole
 * model as Accelerate's prepare(model, optimizer) expects, are re-targeted
 * to the slices before their own prepare (tp.c). */
static accel_status prepare_model_of_call(accel_accelerator *acc, const accel_preparable *objs, int i, int n) {
    accel_module *m = objs[i].obj;
    int **where = accel_calloc((size_t)n, sizeof *where);
    accel_status st = where ? ACCEL_OK : accel_last_status();
    bool fresh = !accel__find_model(acc, m);
    for (int j = 0; fresh && !st && j < n; j++)
        if (objs[j].kind == ACCEL_PREPARE_OPTIMIZER && objs[j].obj)
            st = accel__tp_segment_entries(acc, m, objs[j].obj, &where[j]);
    /* every rank into the model's prepare, or none */
    st = accel__prepare_agree(acc, st, "list the optimizers' parameters for the model's tensor-parallel plan");
    accel__first_error first = {0};
    accel__first_error_note(&first, st ? st : accel_accelerator_prepare_model(acc, m));
    /* The optimizers follow the model's parameters also when its prepare
     * failed after the tensor-parallel plan cut them (it frees each whole
     * weight as its slice replaces it): else they would name freed tensors. */
    for (int j = 0; where && j < n; j++)
        if (where[j]) accel__first_error_note(&first, accel__tp_retarget_optimizer(m, objs[j].obj, where[j]));
    for (int j = 0; where && j < n; j++) accel_free(where[j]);
    accel_free(where);
    return accel__first_error_return(&first);
}

/* The pass of prepare that takes an object of kind k: models and data
 * loaders first (an unknown kind with them, refused in its turn), then
 * optimizers, then schedulers. */
static int prepare_pass(accel_prepare_kind k) {
    return k == ACCEL_PREPARE_OPTIMIZER ? 1 : k == ACCEL_PREPARE_SCHEDULER ? 2 : 0;
}

/* Accelerate's prepare(*args) takes its arguments in passes, models and
 * data loaders before optimizers and schedulers, so prepare(opt, model) is
 * prepare(model, opt): an optimizer under ZeRO needs its model prepared
 * first, a scheduler its optimizer. Within a pass, the call's order. */
accel_status accel_accelerator_prepare_array(accel_accelerator *acc, int n, const accel_preparable *objs) {
    if (accel__acc_null(acc, "accel_accelerator_prepare")) return accel_last_status();
    if (n < 0 || (n > 0 && !objs))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare: bad object list (%d objects)", n);
    accel_status st = ACCEL_OK;
    for (int pass = 0; pass < 3; pass++)
        for (int i = 0; i < n && !st; i++)
            if (prepare_pass(objs[i].kind) == pass)
                st = objs[i].kind == ACCEL_PREPARE_MODEL && objs[i].obj ? prepare_model_of_call(acc, objs, i, n)
                                                                        : prepare_one(acc, &objs[i]);
    return st;
}

accel_status accel_accelerator_clear(accel_accelerator *acc) {
    if (accel__acc_null(acc, "accel_accelerator_clear")) return accel_last_status();
    accel__first_error first = {0};
    /* Optimizers first: a ZeRO optimizer's state is consolidated from its model's flat buffers. */
    while (acc->n_opts) {
        accel__link_remove(accel__optimizer_links(acc->opts[0]), acc);
        accel__first_error_note(&first, forget_optimizer(acc, 0, true));
    }
    while (acc->n_models) {
        accel__link_remove(&acc->models[0].m->links, acc);
        accel__first_error_note(&first, forget_model(acc, &acc->models[0]));
    }
    for (int i = 0; i < acc->n_scheds; i++) accel__link_remove(accel__scheduler_links(acc->scheds[i]), acc);
    for (int i = 0; i < acc->n_dls; i++) {
        accel__link_remove(accel__dataloader_links(acc->dls[i]), acc);
        accel__dataloader_place(acc->dls[i], ACCEL_CPU_DEVICE); /* its batches back in host memory */
    }
    acc->n_scheds = acc->n_dls = 0;
    acc->step = 0;
    acc->sync_gradients = true;
    acc->scale = acc->backward_scale = acc->mp == ACCEL_MP_FP16 ? acc->o.init_scale : 1.0;
    acc->growth_tracker = 0;
    return first.st ? accel_set_error(first.st, "accel_accelerator_clear: %s", first.msg) : ACCEL_OK;
}

accel_module *accel_accelerator_unwrap_model(const accel_accelerator *acc, accel_module *model) {
    if (accel__acc_null(acc, __func__)) return NULL;
    if (!model) accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_unwrap_model: model is NULL");
    return model; /* prepare works in place: the prepared model is the plain model */
}

accel_status accel_accelerator_unprepare_model(accel_accelerator *acc, accel_module *model) {
    accel__model *pm = acc ? accel__find_model(acc, model) : NULL;
    if (!pm)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_unprepare_model: the model was not prepared");
    accel__link_remove(&model->links, acc);
    accel_status st = forget_model(acc, pm);
    return st ? accel_set_error(st, "accel_accelerator_unprepare_model: %s", accel_last_error()) : ACCEL_OK;
}

/* ---------------------------------------------------------------- autocast */

accel_dtype accel_accelerator_autocast_begin(const accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return accel_autocast_dtype();
    accel_dtype dt = accel__acc_autocast_dtype(acc);
    return dt == ACCEL_F32 ? accel_autocast_dtype() : accel_autocast_begin(dt);
}

accel_status accel_accelerator_autocast_end(const accel_accelerator *acc, accel_dtype previous) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    if (accel__acc_autocast_dtype(acc) == ACCEL_F32) return ACCEL_OK;
    accel_autocast_end(previous);
    return accel_autocast_dtype() == previous ? ACCEL_OK : accel_last_status(); /* refused: not an autocast dtype */
}

accel_pg *accel_accelerator_dp_group(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return NULL;
    return acc->dp_pg;
}
