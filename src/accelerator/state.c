/* The Accelerator's state: options and environment, process queries and
 * control, prepare of optimizers/schedulers/loaders, autocast. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "accelerator_internal.h"

accel_accelerator_opts accel_accelerator_opts_default(void) {
    accel_accelerator_opts o;
    memset(&o, 0, sizeof o);
    o.even_batches = true;
    o.sync_with_dataloader = true;
    o.step_scheduler_with_optimizer = true;
    o.bucket_cap_bytes = 25 << 20;
    o.init_scale = 65536.0;
    o.growth_factor = 2.0;
    o.backoff_factor = 0.5;
    o.growth_interval = 2000;
    return o;
}

static const char *env2(const char *a, const char *b) {
    const char *v = getenv(a);
    if (v && *v) return v;
    v = getenv(b);
    return v && *v ? v : NULL;
}

static bool truthy(const char *v) {
    return v && (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
}

static accel_status parse_precision(const char *s, accel_mixed_precision *out) {
    if (!s || !strcasecmp(s, "no")) *out = ACCEL_MP_NO;
    else if (!strcasecmp(s, "bf16")) *out = ACCEL_MP_BF16;
    else if (!strcasecmp(s, "fp16")) *out = ACCEL_MP_FP16;
    else if (!strcasecmp(s, "fp8"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "accel_accelerator_new: fp8 mixed precision is not supported by accel "
                               "(no fp8 kernels on this build); use bf16 or fp16");
    else
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_new: Unknown mixed_precision mode: %s. Choose between "
                               "['no', 'fp16', 'bf16']",
                               s);
    return ACCEL_OK;
}

accel_accelerator *accel_accelerator_new(const accel_accelerator_opts *opts) {
    accel_accelerator_opts o = opts ? *opts : accel_accelerator_opts_default();
    accel_mixed_precision mp = ACCEL_MP_NO;
    const char *mps = o.mixed_precision ? o.mixed_precision
                                        : env2("ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION");
    if (parse_precision(mps, &mp)) return NULL;
    accel__zero_cfg zc;
    if (accel__zero_config(&o, &zc)) return NULL;
    if (zc.mp >= 0 && (accel_mixed_precision)zc.mp != mp) {
        /* The DeepSpeed JSON decides unless the code or the launcher chose another precision. */
        if (o.mixed_precision || mp != ACCEL_MP_NO) {
            accel_set_error(ACCEL_ERR_INVALID_ARG,
                            "accel_accelerator_new: mixed precision %s disagrees with the DeepSpeed config's %s",
                            accel_mixed_precision_name(mp), accel_mixed_precision_name((accel_mixed_precision)zc.mp));
            return NULL;
        }
        mp = (accel_mixed_precision)zc.mp;
    }
    int steps = o.gradient_accumulation_steps;
    if (steps == 0) {
        const char *v = env2("ACCEL_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
        steps = v ? atoi(v) : 1;
        if (zc.accum) {
            /* The launcher always sets 1; anything else must agree with the JSON. */
            if (steps != 1 && steps != zc.accum) {
                accel_set_error(ACCEL_ERR_INVALID_ARG,
                                "accel_accelerator_new: gradient_accumulation_steps %d disagrees with the DeepSpeed "
                                "config's %d", steps, zc.accum);
                return NULL;
            }
            steps = zc.accum;
        }
    }
    if (steps < 1) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_accelerator_new: gradient_accumulation_steps must be >= 1 (got %d)", steps);
        return NULL;
    }
    if (zc.bucket_bytes && o.bucket_cap_bytes == accel_accelerator_opts_default().bucket_cap_bytes)
        o.bucket_cap_bytes = zc.bucket_bytes;
    if (o.bucket_cap_bytes <= 0) o.bucket_cap_bytes = 25 << 20;
    if (accel_dist_init() != ACCEL_OK) return NULL;
    accel_accelerator *acc = accel_calloc(1, sizeof *acc);
    if (!acc) return NULL;
    acc->o = o;
    acc->o.mixed_precision = NULL;
    acc->project_dir = accel_strdup(o.project_dir ? o.project_dir : ".");
    acc->o.project_dir = acc->project_dir;
    acc->mp = mp;
    acc->pg = accel_dist_default_group();
    acc->rank = accel_pg_rank(acc->pg);
    acc->world = accel_pg_size(acc->pg);
    acc->local_rank = accel_dist_local_rank();
    acc->local_world = accel_dist_local_world_size();
    bool cpu = o.cpu || truthy(env2("ACCEL_USE_CPU", "ACCELERATE_USE_CPU"));
    accel_device cuda = {ACCEL_DEV_CUDA, acc->local_rank};
    acc->device = !cpu && accel_device_available(cuda) ? cuda : ACCEL_CPU_DEVICE;
    acc->accum_steps = steps;
    acc->sync_gradients = true;
    acc->scale = mp == ACCEL_MP_FP16 ? o.init_scale : 1.0;
    acc->zero_stage = zc.stage;
    acc->fsdp = zc.fsdp;
    acc->clip = zc.clip;
    acc->o.deepspeed_config_file = acc->o.fsdp_sharding_strategy = NULL; /* borrowed: not kept */
    return acc;
}

void accel_accelerator_free(accel_accelerator *acc) {
    if (!acc) return;
    accel_accelerator_clear(acc);
    accel_free(acc->project_dir);
    accel_free(acc);
    accel_dist_finalize();
}

/* ---------------------------------------------------------------- queries */

bool accel__acc_null(const accel_accelerator *acc, const char *fn) {
    if (acc) return false;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: accelerator is NULL", fn);
    return true;
}

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
    return mp == ACCEL_MP_BF16 ? "bf16" : mp == ACCEL_MP_FP16 ? "fp16" : "no";
}

int accel_accelerator_gradient_accumulation_steps(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 1 : acc->accum_steps;
}
void accel_accelerator_set_gradient_accumulation_steps(accel_accelerator *acc, int steps) {
    if (!accel__acc_null(acc, __func__) && steps >= 1) acc->accum_steps = steps;
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
    return accel__acc_null(acc, __func__) ? 0 : acc->zero_stage;
}
double accel_accelerator_gradient_clipping(const accel_accelerator *acc) {
    return accel__acc_null(acc, __func__) ? 0.0 : acc->clip;
}

accel_status accel_accelerator_zero_shard(accel_accelerator *acc, const accel_module *model, int64_t *lo,
                                          int64_t *hi, int64_t *padded) {
    accel__model *pm = acc ? accel__find_model(acc, model) : NULL;
    if (!pm) return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_zero_shard: the model was not prepared");
    if (pm->zero_stage == 3)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_zero_shard: under ZeRO stage 3 a rank's shard is "
                               "one piece per wrap unit, not one range");
    int64_t n = pm->fp->buffers[ACCEL_F32].numel;
    *lo = pm->zero_stage ? pm->zlo : 0;
    *hi = pm->zero_stage ? pm->zhi : n;
    if (padded) *padded = n;
    return ACCEL_OK;
}

bool accel_accelerator_optimizer_step_was_skipped(const accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return false;
    for (int i = 0; i < acc->n_opts; i++)
        if (acc->skipped[i]) return true;
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
    if (accel__acc_null(acc, __func__)) return ACCEL_ERR_INVALID_ARG;
    return acc->world > 1 ? accel_pg_barrier(acc->pg) : ACCEL_OK;
}

accel_status accel_accelerator_main_process_first_begin(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return ACCEL_ERR_INVALID_ARG;
    return acc->rank != 0 ? accel_accelerator_wait_for_everyone(acc) : ACCEL_OK;
}

accel_status accel_accelerator_main_process_first_end(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return ACCEL_ERR_INVALID_ARG;
    return acc->rank == 0 ? accel_accelerator_wait_for_everyone(acc) : ACCEL_OK;
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

void accel_set_seed(const accel_accelerator *acc, uint64_t seed, bool device_specific) {
    accel_manual_seed(seed + (device_specific && acc ? (uint64_t)acc->rank : 0));
}

/* ---------------------------------------------------------------- prepare */

accel__model *accel__find_model(accel_accelerator *acc, const accel_module *m) {
    if (!acc) return NULL;
    for (int i = 0; i < acc->n_models; i++)
        if (acc->models[i].m == m) return &acc->models[i];
    return NULL;
}

accel_dataloader *accel__active_dataloader(const accel_accelerator *acc) {
    for (int i = acc->n_dls - 1; i >= 0; i--)
        if (accel_dataloader_active(acc->dls[i])) return acc->dls[i];
    return NULL;
}

static accel_status too_many(const char *what) {
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare: more than %d %s",
                           ACCEL__MAX_PREPARED, what);
}

accel_status accel_accelerator_prepare_model(accel_accelerator *acc, accel_module *model) {
    if (!acc || !model)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare_model: NULL argument");
    if (accel__find_model(acc, model)) return ACCEL_OK;
    if (acc->n_models == ACCEL__MAX_PREPARED) return too_many("models");
    accel__model *pm = &acc->models[acc->n_models];
    memset(pm, 0, sizeof *pm);
    pm->m = model;
    accel_status st = accel__ddp_prepare(acc, pm);
    if (st) {
        memset(pm, 0, sizeof *pm);
        return st;
    }
    acc->n_models++;
    return ACCEL_OK;
}

accel_status accel_accelerator_prepare_optimizer(accel_accelerator *acc, accel_optimizer *opt) {
    if (!acc || !opt)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare_optimizer: NULL argument");
    for (int i = 0; i < acc->n_opts; i++)
        if (acc->opts[i] == opt) return ACCEL_OK;
    if (acc->n_opts == ACCEL__MAX_PREPARED) return too_many("optimizers");
    acc->skipped[acc->n_opts] = false;
    acc->opts[acc->n_opts] = opt;
    acc->zopts[acc->n_opts] = NULL;
    if (acc->zero_stage) {
        accel_status st = accel__zero_prepare_optimizer(acc, acc->n_opts);
        if (st) return st;
    }
    acc->n_opts++;
    return ACCEL_OK;
}

accel_status accel_accelerator_prepare_scheduler(accel_accelerator *acc, accel_lr_scheduler *s) {
    if (!acc || !s)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare_scheduler: NULL argument");
    for (int i = 0; i < acc->n_scheds; i++)
        if (acc->scheds[i] == s) return ACCEL_OK;
    if (acc->n_scheds == ACCEL__MAX_PREPARED) return too_many("schedulers");
    acc->scheds[acc->n_scheds++] = s;
    return ACCEL_OK;
}

accel_status accel_accelerator_prepare_dataloader(accel_accelerator *acc, accel_dataloader *dl) {
    if (!acc || !dl)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare_dataloader: NULL argument");
    for (int i = 0; i < acc->n_dls; i++)
        if (acc->dls[i] == dl) return ACCEL_OK;
    if (acc->n_dls == ACCEL__MAX_PREPARED) return too_many("data loaders");
    accel_status st = accel_dataloader_shard(dl, acc->world, acc->rank, acc->o.split_batches,
                                             acc->o.even_batches);
    if (st) return st;
    if (acc->world > 1) {
        /* synchronize_rng_states: every rank shuffles with rank 0's seed. */
        uint64_t seed = accel_dataloader_options(dl)->seed;
        if ((st = accel_pg_broadcast(acc->pg, &seed, 1, ACCEL_I64, 0))) return st;
        accel_dataloader_set_seed(dl, seed);
    }
    acc->dls[acc->n_dls++] = dl;
    return ACCEL_OK;
}

accel_status accel_accelerator_prepare(accel_accelerator *acc, accel_module *model, accel_optimizer *opt,
                                       accel_dataloader *dl, accel_lr_scheduler *sched) {
    if (!acc) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_prepare: accelerator is NULL");
    accel_status st = ACCEL_OK;
    if (model && (st = accel_accelerator_prepare_model(acc, model))) return st;
    if (opt && (st = accel_accelerator_prepare_optimizer(acc, opt))) return st;
    if (dl && (st = accel_accelerator_prepare_dataloader(acc, dl))) return st;
    if (sched && (st = accel_accelerator_prepare_scheduler(acc, sched))) return st;
    return ACCEL_OK;
}

void accel_accelerator_clear(accel_accelerator *acc) {
    if (!acc) return;
    for (int i = 0; i < acc->n_opts; i++) accel__zero_release(acc, i);
    for (int i = 0; i < acc->n_models; i++) accel__ddp_release(acc, &acc->models[i]);
    acc->n_models = acc->n_opts = acc->n_scheds = acc->n_dls = 0;
    acc->step = 0;
    acc->sync_gradients = true;
    acc->scale = acc->mp == ACCEL_MP_FP16 ? acc->o.init_scale : 1.0;
    acc->growth_tracker = 0;
    acc->unscaled = acc->found_inf = false;
}

accel_status accel_accelerator_unwrap_model(accel_accelerator *acc, accel_module *model) {
    accel__model *pm = acc ? accel__find_model(acc, model) : NULL;
    if (!pm)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_unwrap_model: the model was not prepared");
    for (int i = 0; i < acc->n_opts; i++)
        if (acc->zopts[i] && acc->zopts[i]->m == model) accel__zero_release(acc, i);
    accel__ddp_release(acc, pm);
    int i = (int)(pm - acc->models);
    memmove(&acc->models[i], &acc->models[i + 1], (size_t)(acc->n_models - i - 1) * sizeof *pm);
    acc->n_models--;
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- autocast */

static accel_dtype autocast_dtype(const accel_accelerator *acc) {
    return acc->mp == ACCEL_MP_BF16 ? ACCEL_BF16 : acc->mp == ACCEL_MP_FP16 ? ACCEL_F16 : ACCEL_F32;
}

accel_dtype accel_accelerator_autocast_begin(const accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return accel_autocast_dtype();
    accel_dtype dt = autocast_dtype(acc);
    return dt == ACCEL_F32 ? accel_autocast_dtype() : accel_autocast_begin(dt);
}

void accel_accelerator_autocast_end(const accel_accelerator *acc, accel_dtype previous) {
    if (accel__acc_null(acc, __func__)) return;
    if (autocast_dtype(acc) != ACCEL_F32) accel_autocast_end(previous);
}
