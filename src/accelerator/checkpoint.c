/* save_state / load_state / save_model (Accelerate's accelerator.py and checkpointing.py), crash-safe: at every
 * instant of a save there is a complete checkpoint to load.
 *   - A checkpoint is written into a hidden sibling directory, which gets a
 *     completion marker (its files with their sizes and CRC-32C,
 *     src/io/checkpoint_marker.h) last, is
 *     fsynced and then takes its name with one rename: a directory named like a
 *     checkpoint is never half-written.
 *   - total_limit deletes old checkpoints only after the new one is in place, and
 *     each victim is first renamed to a hidden name, so a half-deleted directory
 *     never carries a checkpoint name either.
 *   - load_state trusts only directories whose marker matches their files,
 *     byte for byte (a bit flipped on disk is caught and the file named); with
 *     automatic naming it skips (and names on stderr) anything else and loads
 *     the newest intact checkpoint. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/io.h"
#include "accelerator_internal.h"
#include "strategy.h"
#include "gemm_choices.h"
#include "core/afile.h"
#include "core/core_internal.h"
#include "core/staged_dir.h"
#include "io/checkpoint_marker.h"
#include "io/io_internal.h"
#include "nn/tp_internal.h" /* accel__tp_dropout_rng */

#define PATHN 4096
/* The name load_state's agreements give the other ranks' errors. */
#define FN_LOAD_STATE "accel_accelerator_load_state"

/* ---------------------------------------------------------------- files */

/* "name.safetensors" for the first object, "name_<i>.safetensors" after. */
static void numbered(char *out, size_t n, const char *dir, const char *name, int i) {
    if (i == 0) snprintf(out, n, "%s/%s.safetensors", dir, name);
    else snprintf(out, n, "%s/%s_%d.safetensors", dir, name, i);
}

/* The GEMM choices a save keeps for a bit-exact resume (docs/cpu.md). */
#define GEMM_CHOICES "gemm_choices.json"

/* Whether name is stem, then "_<digits>" (or nothing, with plain), then ext. */
static bool numbered_name(const char *name, const char *stem, bool plain, const char *ext) {
    size_t n = strlen(stem);
    if (strncmp(name, stem, n)) return false;
    name += n;
    if (*name == '_' && isdigit((unsigned char)name[1])) name += 1 + strspn(name + 1, "0123456789");
    else if (!plain) return false;
    return !strcmp(name, ext);
}

/* Whether a top-level entry of a checkpoint directory is one save_state
 * writes (for any set of objects, so an older save's too): the marker,
 * model/optimizer/scheduler[_<i>].safetensors, random_states_<r>.safetensors,
 * custom_checkpoint_<i>.bin, the GEMM choices, ZeRO-3's pytorch_model_fsdp_<i>/ and
 * optimizer_<i>/. Anything else in the directory is the user's (notes, logs,
 * a save_model's config and tokenizer): a save carries it over and its
 * marker does not list it. An older save's own files are not carried: a
 * stale model_1.safetensors or custom_checkpoint_3.bin would be read by a
 * later load of more objects; nor the atomic writer's scratch file of one
 * (<name>.tmp, a killed write's), which it refuses to reuse while another
 * link to it exists. */
static bool state_entry(const char *name) {
    size_t n = strlen(name), t = strlen(ACCEL__AFILE_TMP_SUFFIX);
    if (n > t && !strcmp(name + n - t, ACCEL__AFILE_TMP_SUFFIX)) { /* a killed write's scratch file of one */
        char base[NAME_MAX + 1];
        snprintf(base, sizeof base, "%.*s", (int)(n - t), name);
        return state_entry(base);
    }
    return !strcmp(name, ACCEL__MARKER) || !strcmp(name, GEMM_CHOICES) ||
           numbered_name(name, "model", true, ".safetensors") ||
           numbered_name(name, "optimizer", true, ".safetensors") ||
           numbered_name(name, "scheduler", true, ".safetensors") ||
           numbered_name(name, "random_states", false, ".safetensors") ||
           numbered_name(name, "custom_checkpoint", false, ".bin") ||
           numbered_name(name, "pytorch_model_fsdp", false, "") || numbered_name(name, "optimizer", false, "");
}

static bool user_entry(const char *name, void *ctx) {
    (void)ctx;
    return !state_entry(name);
}

/* ---------------------------------------------------------------- checkpoint directories */

/* The highest checkpoint number: 18 digits, so that N + 1 never overflows. */
#define CHECKPOINT_MAX 999999999999999999LL

/* N for an entry named exactly "checkpoint_<N>" (decimal, no sign or leading
 * zero, so that checkpoint_path(N) names the same entry; N <= CHECKPOINT_MAX),
 * else -1. */
static int64_t checkpoint_number(const char *name) {
    if (strncmp(name, "checkpoint_", 11)) return -1;
    const char *digits = name + 11;
    size_t n = strspn(digits, "0123456789");
    if (n == 0 || n > 18 || digits[n] || (digits[0] == '0' && n > 1)) return -1;
    return strtoll(digits, NULL, 10);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The numbers of root's checkpoint_<N> entries (of any kind), ascending, in
 * *nums (accel_free it). Returns their count (0 when root does not exist), -1
 * when out of memory. */
static int list_checkpoints(const char *root, int64_t **nums) {
    DIR *d = opendir(root);
    int n = 0, cap = 0;
    for (struct dirent *e; d && (e = readdir(d));) cap += checkpoint_number(e->d_name) >= 0;
    *nums = accel_malloc((size_t)(cap ? cap : 1) * sizeof **nums);
    if (d && *nums) rewinddir(d);
    for (struct dirent *e; d && *nums && n < cap && (e = readdir(d));) {
        int64_t v = checkpoint_number(e->d_name);
        if (v >= 0) (*nums)[n++] = v;
    }
    if (d) closedir(d);
    if (!*nums) return -1;
    qsort(*nums, (size_t)n, sizeof **nums, cmp_i64);
    return n;
}

static void checkpoint_path(char *out, size_t n, const char *root, int64_t num) {
    snprintf(out, n, "%s/checkpoint_%lld", root, (long long)num);
}

/* OK when dir is a complete checkpoint (accel__marker_check): its files are
 * all there with their sizes and, with `checksums`, their CRC-32C. */
static accel_status check_complete(const char *dir, bool checksums) {
    return accel__marker_check(dir, checksums, NULL, "accel_accelerator_load_state");
}

/* The highest N whose checkpoint_<N> is complete and intact (checksums
 * verified; -1 when none, -2 when out of memory); every newer entry it skips
 * is named on stderr with why (a missing, short or corrupted file). */
static int64_t newest_complete(const char *root) {
    int64_t *nums;
    int n = list_checkpoints(root, &nums);
    if (n < 0) return -2;
    int64_t found = -1;
    for (int i = n - 1; i >= 0 && found < 0; i--) {
        char dir[PATHN + 32];
        checkpoint_path(dir, sizeof dir, root, nums[i]);
        if (check_complete(dir, true) == ACCEL_OK) {
            found = nums[i];
        } else {
            fprintf(stderr, "accel: warning: skipping incomplete checkpoint %s (%s)\n", dir, accel_last_error());
            accel_clear_error();
        }
    }
    accel_free(nums);
    return found;
}

/* Deletes a checkpoint so that no half-deleted directory keeps its name: it is
 * renamed to ".checkpoint_<N>.deleting" first (swept by the next rotation when
 * a kill interrupts the removal). */
static void remove_checkpoint(const char *root, int64_t num) {
    char dir[PATHN + 32], doomed[PATHN + 48];
    checkpoint_path(dir, sizeof dir, root, num);
    snprintf(doomed, sizeof doomed, "%s/.checkpoint_%lld.deleting", root, (long long)num);
    if (rename(dir, doomed)) {
        fprintf(stderr, "accel: warning: cannot delete old checkpoint %s: %s\n", dir, strerror(errno));
        return;
    }
    accel__fsync_dir(root);
    KILL_POINT("rotation: checkpoint renamed for deletion");
    accel__rm_rf(doomed);
}

/* Deletions interrupted by a kill: ".checkpoint_<N>.deleting" entries. */
static void sweep_deletions(const char *root) {
    DIR *d = opendir(root);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, ".checkpoint_", 12) || n < 9 || strcmp(e->d_name + n - 9, ".deleting")) continue;
        char path[2 * PATHN];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        accel__rm_rf(path);
    }
    if (d) closedir(d);
}

/* total_limit, once the new checkpoint is in place: the oldest complete
 * checkpoints beyond the limit go (entries that are not complete checkpoints
 * are left alone: they do not count and are not ours to delete). Completeness
 * here is by sizes only: checksumming every kept checkpoint at each save would
 * read them all back, and the one just written is verified whole. */
static void rotate(const char *root, int limit) {
    int64_t *nums;
    int n = list_checkpoints(root, &nums);
    if (n < 0) return;
    int complete = 0;
    for (int i = 0; i < n; i++) {
        char dir[PATHN + 32];
        checkpoint_path(dir, sizeof dir, root, nums[i]);
        if (check_complete(dir, false) == ACCEL_OK) nums[complete++] = nums[i];
    }
    accel_clear_error();
    int excess = complete - limit;
    if (excess > 0) fprintf(stderr, "Deleting %d checkpoints to make room for new checkpoint.\n", excess);
    for (int i = 0; i < excess; i++) remove_checkpoint(root, nums[i]);
    accel_free(nums);
    sweep_deletions(root);
}

/* ---------------------------------------------------------------- named state <-> safetensors */

static accel_status save_named(const char *path, int n, accel_named_state *st) {
    const char **names = accel_calloc((size_t)(n ? n : 1), sizeof *names);
    accel_tensor **ts = accel_calloc((size_t)(n ? n : 1), sizeof *ts);
    accel_tensor **owned = accel_calloc((size_t)(n ? n : 1), sizeof *owned);
    accel_status s = names && ts && owned ? ACCEL_OK : accel_last_status();
    for (int i = 0; i < n && !s; i++) {
        names[i] = st[i].name;
        if (st[i].t) {
            ts[i] = st[i].t;
        } else {
            owned[i] = ts[i] = accel_tensor_new(ACCEL_F64, ACCEL_SHAPE(1), ACCEL_CPU_DEVICE);
            if (!ts[i]) s = accel_last_status();
            else s = accel__tensor_write_bytes(ts[i], 0, &st[i].value, sizeof(double));
        }
    }
    if (!s) s = accel_safetensors_save(path, n, names, ts, 0, NULL);
    for (int i = 0; i < n && owned; i++) accel_tensor_free(owned[i]);
    accel_free(names);
    accel_free(ts);
    accel_free(owned);
    return s;
}

/* Every entry of a file as named state (tensors; scalars as one-element tensors). */
static int load_named(accel_safetensors *f, accel_named_state **out) {
    int n = accel_safetensors_count(f);
    accel_named_state *st = accel_calloc((size_t)(n ? n : 1), sizeof *st);
    if (!st) return -1;
    for (int i = 0; i < n; i++) {
        const accel_st_info *info = accel_safetensors_at(f, i);
        st[i].name = accel_strdup(info->name);
        st[i].t = accel_safetensors_tensor(f, info->name, -1);
        if (!st[i].name || !st[i].t) {
            accel_named_state_free(st, i + 1);
            return -1;
        }
    }
    *out = st;
    return n;
}

typedef accel_status (*load_fn)(void *obj, int n, const accel_named_state *st);

static accel_status load_file(const char *path, void *obj, load_fn fn) {
    accel_safetensors *f = accel_safetensors_open(path);
    if (!f) return accel_last_status();
    accel_named_state *st = NULL;
    int n = load_named(f, &st);
    accel_status s = n < 0 ? accel_last_status() : fn(obj, n, st);
    if (n >= 0) accel_named_state_free(st, n);
    accel_safetensors_close(f);
    return s;
}

typedef struct opt_slot {
    accel_accelerator *acc;
    int i;
} opt_slot;

static accel_status load_opt(void *o, int n, const accel_named_state *st) {
    opt_slot *os = o;
    /* under tp: this rank's slices of the whole states (load_named's tensors, owned); under tp x pp every
     * stage's are cut, in the file's numbering, before the pipeline keeps this stage's */
    if (accel__tp_slice_optimizer(os->acc, os->i, n, (accel_named_state *)st)) return accel_last_status();
    /* under pp: this stage's part of the whole state */
    if (os->acc->pp_opt[os->i]) return accel__pipeline_load_optimizer(os->acc, os->i, n, st);
    if (accel__optimizer_model(os->acc, os->i)) return os->acc->strat->load_optimizer_state(os->acc, os->i, n, st);
    return accel_optimizer_load_state(os->acc->opts[os->i], n, st);
}
/* load_opt's check without the load (no pipeline part): its entries (tp:
 * this rank's slices) against the optimizer, or against the shard of the
 * strategy that re-targeted it (check_optimizer_state), nothing written. */
static accel_status check_opt(void *o, int n, const accel_named_state *st) {
    opt_slot *os = o;
    if (accel__tp_slice_optimizer(os->acc, os->i, n, (accel_named_state *)st)) return accel_last_status();
    if (accel__optimizer_model(os->acc, os->i)) return os->acc->strat->check_optimizer_state(os->acc, os->i, n, st);
    return accel__optimizer_check_state(os->acc->opts[os->i], n, st);
}

/* check_opt's part for a pipeline stage: the entries' parameters and the
 * param groups' counts against the whole optimizer's (the stage's part is
 * checked as it loads). */
static accel_status check_pp_opt(void *o, int n, const accel_named_state *st) {
    opt_slot *os = o;
    return accel__pipeline_check_optimizer(os->acc, os->i, n, st);
}

/* load_state's check of optimizer i in dir before anything loads: its file
 * (check_opt), or a strategy's state in its own format (ZeRO-3's shards,
 * check_own_optimizer); for a pipeline's part its parameters and
 * groups (check_pp_opt); none for a strategy without a check (checked as it
 * loads). */
static accel_status check_opt_first(accel_accelerator *acc, int i, const char *dir) {
    char path[2 * PATHN];
    numbered(path, sizeof path, dir, "optimizer", i);
    opt_slot os = {acc, i};
    if (acc->pp_opt[i]) return load_file(path, &os, check_pp_opt);
    const accel__strategy *st = acc->strat;
    bool own = accel__optimizer_model(acc, i) && st->has_own_optimizer && st->has_own_optimizer(dir, i);
    if (own) return st->check_own_optimizer ? st->check_own_optimizer(acc, i, dir) : ACCEL_OK;
    if (accel__optimizer_model(acc, i) && !st->check_optimizer_state) return ACCEL_OK;
    return load_file(path, &os, check_opt);
}
static accel_status load_sched(void *s, int n, const accel_named_state *st) {
    return accel_lr_scheduler_load_state(s, n, st);
}

/* ---------------------------------------------------------------- model */

/* Model m's file, written by rank 0 (with write); under tp every rank calls
 * it, even after a failure (write false), for the gather of the whole
 * tensors over its tp group (collective), so the file is a one-process
 * model's; under pp likewise for the gather of every stage's parameters
 * (released again after). */
accel_status accel__save_model_file(accel_accelerator *acc, const char *path, accel_module *m, bool write) {
    accel_status pst = accel__pipeline_gather_weights(acc, m);
    accel_state_dict *sd = pst ? NULL : accel_module_state_dict(m);
    accel_tensor **whole = NULL;
    accel_status s = sd ? accel__tp_gather_state(acc, sd, &whole) : accel_last_status();
    if (!s && acc->rank == 0 && write) {
        const char **names = accel_calloc((size_t)(sd->n ? sd->n : 1), sizeof *names);
        accel_tensor **ts = accel_calloc((size_t)(sd->n ? sd->n : 1), sizeof *ts);
        s = names && ts ? ACCEL_OK : accel_last_status();
        int k = 0;
        for (int i = 0; i < sd->n && !s; i++) {
            if (sd->entries[i].is_tied_alias) continue; /* shared tensors de-duplicated */
            names[k] = sd->entries[i].name;
            ts[k++] = whole && whole[i] ? whole[i] : sd->entries[i].t;
        }
        if (!s) s = accel_safetensors_save(path, k, names, ts, 0, NULL);
        accel_free(names);
        accel_free(ts);
    }
    if (sd) accel__tp_gather_state_free(sd, whole);
    accel_state_dict_free(sd);
    if (acc->par.size[ACCEL__MESH_PP] > 1) { /* the other stages' parameters go again */
        accel_status rel = accel__pipeline_release(acc, m, "accel_accelerator_save_state");
        if (!s) s = rel;
    }
    return s;
}

/* A model loading the plain format: an error when dir holds model i in a
 * strategy's own format instead (another strategy wrote it). */
static accel_status refuse_foreign(const char *dir, int i) {
    for (int k = 0; k < ACCEL__STAGES; k++) {
        const accel__strategy *s = accel__strategy_of(k);
        accel_status st = s->refuse_foreign ? s->refuse_foreign(dir, i) : ACCEL_OK;
        if (st) return st;
    }
    return ACCEL_OK;
}

/* Whether entry i of sd is one a model load reads (pp: a stage loads its
 * part, the other stages' parameters being on meta). */
static bool loads_entry(const accel_state_dict *sd, int i, bool pp) {
    return !sd->entries[i].is_tied_alias && !(pp && sd->entries[i].t->device.type == ACCEL_DEV_META);
}

accel_status accel__refuse_unexpected_name(const accel_state_dict *sd, const char *path, const char *verb,
                                           const char *name) {
    for (int i = 0; i < sd->n; i++)
        if (!strcmp(sd->entries[i].name, name)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD_STATE ": %s %s %s, which the model does not have (a checkpoint "
                           "of another model?; nothing was loaded)", path, verb, name);
}

accel_status accel__refuse_unexpected(accel_safetensors *f, const char *path, const accel_state_dict *sd) {
    int own = 0, n = accel_safetensors_count(f);
    for (int i = 0; i < sd->n; i++) own += !sd->entries[i].is_tied_alias;
    accel_status s = ACCEL_OK;
    for (int k = 0; !s && n > own && k < n; k++)
        s = accel__refuse_unexpected_name(sd, path, "holds", accel_safetensors_at(f, k)->name);
    return s;
}

/* Every tensor of sd that a load reads present in f (path) with the shape it
 * is read at (a tp slice's whole tensor): checked before anything is
 * written, so that a checkpoint of another model (a layer resized, a tensor
 * renamed) fails the load with the model as it was, not half-loaded. */
static accel_status check_model_entries(accel_safetensors *f, const char *path, const accel_state_dict *sd, bool pp) {
    accel_status s = accel__refuse_unexpected(f, path, sd);
    for (int i = 0; i < sd->n && !s; i++) {
        if (!loads_entry(sd, i, pp)) continue;
        const accel_state_entry *e = &sd->entries[i];
        const accel_st_info *info = accel_safetensors_find(f, e->name);
        if (!info) return accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s has no tensor %s", path,
                                          e->name);
        int64_t want[ACCEL_MAX_DIMS];
        bool sliced = accel__tp_file_shape(e, want), same = info->ndim == e->t->ndim;
        for (int d = 0; same && d < info->ndim; d++) same = info->shape[d] == want[d];
        if (!same) {
            char got[128], need[128];
            accel_shape_str_n(info->ndim, info->shape, got, sizeof got);
            accel_shape_str_n(e->t->ndim, want, need, sizeof need);
            return accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s: %s %s: %s in the file, %s %s "
                                   "(nothing was loaded)", path, e->name,
                                   sliced ? "has the wrong shape for this rank's tensor-parallel slice" : "does not fit",
                                   got, sliced ? "the slices' whole" : "the model's", need);
        }
    }
    return s;
}

/* Model m's file checked whole (check_model_entries), then loaded. */
static accel_status load_model_file(const char *path, accel_module *m, bool pp, bool load) {
    accel_safetensors *f = accel_safetensors_open(path);
    if (!f) return accel_last_status();
    accel_state_dict *sd = accel_module_state_dict(m);
    accel_status s = sd ? check_model_entries(f, path, sd, pp) : accel_last_status();
    for (int i = 0; load && sd && i < sd->n && !s; i++) {
        if (!loads_entry(sd, i, pp)) continue;
        bool sliced; /* a tp slice: cut from the whole tensor */
        if (!(s = accel__tp_load_entry(f, &sd->entries[i], &sliced)) && !sliced)
            s = accel_safetensors_load_into(f, sd->entries[i].name, sd->entries[i].t);
    }
    accel_state_dict_free(sd);
    accel_safetensors_close(f);
    return s;
}

/* ---------------------------------------------------------------- per-rank state */

/* The entry of model i's tensor-parallel dropout stream (nn/tp_internal.h)
 * in a random_states file: this tp rank's (seed, offset). */
static const char *const TP_RNG_NAMES[ACCEL__MAX_PREPARED] = {"tp_rng_0", "tp_rng_1", "tp_rng_2", "tp_rng_3",
                                                              "tp_rng_4", "tp_rng_5", "tp_rng_6", "tp_rng_7"};

static accel_status save_rank_state(accel_accelerator *acc, const char *dir) {
    char path[3 * PATHN];
    snprintf(path, sizeof path, "%s/random_states_%d.safetensors", dir, acc->rank);
    const char *names[4 + 2 * ACCEL__MAX_PREPARED];
    accel_tensor *ts[4 + 2 * ACCEL__MAX_PREPARED] = {0};
    int n = 0;
    accel_rng r = accel__rng_get(accel_default_rng());
    int64_t rng[2] = {(int64_t)r.seed, (int64_t)r.offset};
    int64_t step[2] = {acc->step, acc->sync_gradients};
    double scaler[2] = {acc->scale, (double)acc->growth_tracker};
    int64_t dls[ACCEL__MAX_PREPARED][3];
    static const char *DL_NAMES[ACCEL__MAX_PREPARED] = {"dataloader_0", "dataloader_1", "dataloader_2",
                                                        "dataloader_3", "dataloader_4", "dataloader_5",
                                                        "dataloader_6", "dataloader_7"};
    accel_status s = ACCEL_OK;
    names[n] = "rng";
    ts[n++] = accel_tensor_wrap(rng, ACCEL_I64, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    names[n] = "step";
    ts[n++] = accel_tensor_wrap(step, ACCEL_I64, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    names[n] = "scaler";
    ts[n++] = accel_tensor_wrap(scaler, ACCEL_F64, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    for (int i = 0; i < acc->n_dls; i++) {
        accel_dataloader_state st = accel_dataloader_get_state(acc->dls[i]);
        dls[i][0] = st.epoch;
        dls[i][1] = st.position;
        dls[i][2] = (int64_t)st.seed;
        names[n] = DL_NAMES[i];
        ts[n++] = accel_tensor_wrap(dls[i], ACCEL_I64, ACCEL_SHAPE(3), ACCEL_CPU_DEVICE);
    }
    int64_t tp_rngs[ACCEL__MAX_PREPARED][2];
    for (int i = 0; i < acc->n_models; i++) {
        accel_rng *tr = accel__tp_dropout_rng(acc->models[i].m);
        if (!tr) continue;
        tp_rngs[i][0] = (int64_t)tr->seed;
        tp_rngs[i][1] = (int64_t)tr->offset;
        names[n] = TP_RNG_NAMES[i];
        ts[n++] = accel_tensor_wrap(tp_rngs[i], ACCEL_I64, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    }
    for (int i = 0; i < n; i++)
        if (!ts[i]) s = accel_last_status();
    if (!s) s = accel_safetensors_save(path, n, names, ts, 0, NULL);
    for (int i = 0; i < n; i++) accel_tensor_free(ts[i]);
    /* rank 0's GEMM provider choices: every rank resumes on them (docs/cpu.md) */
    snprintf(path, sizeof path, "%s/" GEMM_CHOICES, dir);
    if (!s && acc->rank == 0) s = accel__gemm_choices_save(path);
    return s;
}

static accel_status read_i64(accel_safetensors *f, const char *name, int64_t *out, int n) {
    accel_tensor *t = accel_safetensors_tensor(f, name, ACCEL_I64);
    if (!t || accel_numel(t) != n) {
        accel_tensor_free(t);
        return accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s: bad or missing \"%s\"",
                               accel_safetensors_path(f), name);
    }
    accel_status s = accel__tensor_read_bytes(t, 0, out, (size_t)n * sizeof(int64_t));
    accel_tensor_free(t);
    return s;
}

/* Sets tp dropout stream r to saved (seed, offset) when it is this tp
 * rank's stream of the job seeded base (the tp group's default generator's
 * seed, as loaded); a stream another tp rank saved (a resume on another mesh, where
 * this process has another tp rank) would repeat that rank's masks on this
 * rank's shards: r starts afresh from base then, as prepare seeds it. */
static void restore_tp_rng(const accel_accelerator *acc, accel_rng *r, const int64_t saved[2], uint64_t base) {
    uint64_t mine = accel__tp_dropout_seed(base, acc->mesh.coord[ACCEL__MESH_TP]);
    if ((uint64_t)saved[0] == mine) r->seed = mine, r->offset = (uint64_t)saved[1];
    else accel_rng_init(r, mine);
}

/* The models' tp dropout streams a rank's file holds (restored once the
 * default generator is the tp group's: tp_streams_restore). */
typedef struct saved_tp_streams {
    int64_t rng[ACCEL__MAX_PREPARED][2];
    bool saved[ACCEL__MAX_PREPARED];
} saved_tp_streams;

static accel_status load_rank_state(accel_accelerator *acc, const char *dir, saved_tp_streams *tps) {
    char path[3 * PATHN];
    snprintf(path, sizeof path, "%s/random_states_%d.safetensors", dir, acc->rank);
    /* A complete checkpoint saved on fewer processes (a ZeRO-3 sharded one
     * loads at any world size): the ranks it did not have take rank 0's
     * step, loaders and scaler (the job's, the same on every rank) and keep
     * their own generator, as Accelerate keeps a rank's RNG when its
     * random_states file is missing (rank 0's would give them its stream). */
    bool own = accel__is_file(path);
    if (!own) snprintf(path, sizeof path, "%s/random_states_0.safetensors", dir);
    char choices[3 * PATHN];
    snprintf(choices, sizeof choices, "%s/" GEMM_CHOICES, dir);
    if (accel__gemm_choices_load(choices) != ACCEL_OK) return accel_last_status();
    accel_safetensors *f = accel_safetensors_open(path);
    if (!f) return accel_last_status();
    int64_t rng[2], step[2];
    accel_status s = read_i64(f, "rng", rng, 2);
    if (!s) s = read_i64(f, "step", step, 2);
    accel_tensor *sc = s ? NULL : accel_safetensors_tensor(f, "scaler", ACCEL_F64);
    double scaler[2];
    if (!s && (!sc || accel_numel(sc) != 2))
        s = accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s: bad or missing \"scaler\"", path);
    if (!s) s = accel__tensor_read_bytes(sc, 0, scaler, sizeof scaler);
    for (int i = 0; i < acc->n_dls && !s; i++) {
        char name[32];
        int64_t d[3];
        snprintf(name, sizeof name, "dataloader_%d", i);
        if ((s = read_i64(f, name, d, 3))) break;
        accel_dataloader_state st = {d[0], d[1], (uint64_t)d[2]};
        if ((s = accel_dataloader_set_state(acc->dls[i], &st))) break;
    }
    /* the models' tp dropout streams, where this rank's file has them (one
     * saved without tensor parallelism has none: the streams stay as seeded;
     * one of another tp rank, saved on another mesh, is not this rank's:
     * restore_tp_rng) */
    memset(tps, 0, sizeof *tps);
    for (int i = 0; i < acc->n_models && own && !s; i++) {
        tps->saved[i] = accel__tp_dropout_rng(acc->models[i].m) && accel_safetensors_find(f, TP_RNG_NAMES[i]);
        if (tps->saved[i]) s = read_i64(f, TP_RNG_NAMES[i], tps->rng[i], 2);
    }
    if (!s) {
        if (own) accel__rng_set(accel_default_rng(), (accel_rng){(uint64_t)rng[0], (uint64_t)rng[1]});
        acc->step = step[0];
        acc->sync_gradients = step[1] != 0;
        acc->scale = acc->backward_scale = scaler[0];
        acc->growth_tracker = (int64_t)scaler[1];
        for (int i = 0; i < acc->n_opts; i++) /* the loaded state's gradients are no backward's of this run */
            acc->scaler_of[i] = (accel__opt_scaler){0};
    }
    accel_tensor_free(sc);
    accel_safetensors_close(f);
    return s;
}

/* After every rank restored its file: the default generator of the tp
 * group's first rank on the whole group, whose replicated activations'
 * dropout draws from it and must agree (nn/tp_internal.h). Saved on this
 * mesh the files agree already; saved on another (dp_shard 2 x tp 2 loaded
 * at tp 4, device-specific seeds), or with ranks the checkpoint did not
 * have (they keep their own generator), they do not. Then the models' tp
 * streams, from the group's seed. Collective over the tp group. */
static accel_status tp_streams_restore(accel_accelerator *acc, const saved_tp_streams *tps) {
    accel_rng r = accel__rng_get(accel_default_rng());
    if (acc->mesh.size[ACCEL__MESH_TP] > 1) {
        accel_pg *tp = accel__mesh_group(&acc->mesh, ACCEL__MESH_TP);
        int64_t v[2] = {(int64_t)r.seed, (int64_t)r.offset};
        accel_status s = tp ? accel_pg_broadcast(tp, v, 2, ACCEL_I64, 0) : accel_last_status();
        if (s) return s;
        r = (accel_rng){(uint64_t)v[0], (uint64_t)v[1]};
        accel__rng_set(accel_default_rng(), r);
    }
    for (int i = 0; i < acc->n_models; i++)
        if (tps->saved[i]) restore_tp_rng(acc, accel__tp_dropout_rng(acc->models[i].m), tps->rng[i], r.seed);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- save_state */

/* Every rank learns whether any rank failed (a collective all ranks reach). */
accel_status accel__ranks_agree(accel_accelerator *acc, accel_status mine, const char *op) {
    if (acc->world == 1) return mine;
    int32_t v = mine != ACCEL_OK;
    accel_status st = accel_pg_all_reduce(acc->pg, &v, 1, ACCEL_I32, ACCEL_REDUCE_MAX);
    if (st) return st;
    if (v && !mine) return accel_set_error(ACCEL_ERR_IO, "%s: another rank failed (its error is reported there)", op);
    return mine;
}

static accel_status agree(accel_accelerator *acc, accel_status mine) {
    return accel__ranks_agree(acc, mine, "accel_accelerator_save_state");
}

/* A bar over a save's or load's files, shown when it takes more than a second. */
static accel_progress *files_bar(const accel_accelerator *acc, const char *desc) {
    int64_t n = acc->n_models + acc->n_opts + acc->n_scheds + 1;
    return accel_progress_new(n, &(accel_progress_opts){.desc = desc, .unit = "file", .delay = 1});
}

static accel_status write_all(accel_accelerator *acc, const char *tmp) {
    char path[3 * PATHN];
    accel_status s = ACCEL_OK;
    accel_progress *bar = files_bar(acc, "save_state");
    /* > 1: every rank joins the gathers of the whole tensors (tp) or of every stage's (pp) */
    int tp = acc->mesh.size[ACCEL__MESH_TP], pp = acc->par.size[ACCEL__MESH_PP];
    for (int i = 0; i < acc->n_models; i++) {
        const accel__strategy *strat = acc->models[i].strat;
        if (strat->save_state) { /* collective: every rank its shards, or its part of the gathers */
            accel_status s2 = strat->save_state(acc, i, tmp, s != ACCEL_OK);
            if (!s) s = s2;
        } else if (tp > 1 || pp > 1 || (acc->rank == 0 && !s)) {
            numbered(path, sizeof path, tmp, "model", i);
            accel_status s2 = accel__save_model_file(acc, path, acc->models[i].m, !s);
            if (!s) s = s2;
        }
        KILL_POINT("save: model file written");
        accel_progress_update(bar, 1);
    }
    if (acc->rank == 0) {
        for (int i = 0; i < acc->n_scheds && !s; i++) {
            accel_named_state *st = NULL;
            int n = accel_lr_scheduler_state(acc->scheds[i], &st);
            numbered(path, sizeof path, tmp, "scheduler", i);
            s = n < 0 ? accel_last_status() : save_named(path, n, st);
            if (n >= 0) accel_named_state_free(st, n);
            KILL_POINT("save: scheduler file written");
            accel_progress_update(bar, 1);
        }
    }
    /* Optimizers: ZeRO state is consolidated first (a collective every rank
     * joins, even after a local failure), then written in the per-tensor
     * vocabulary DDP uses, so the file loads at any world size. */
    for (int i = 0; i < acc->n_opts; i++) {
        bool own = false;
        if (accel__optimizer_model(acc, i) && acc->strat->save_optimizer) { /* a format of the strategy's own */
            accel_status s2 = acc->strat->save_optimizer(acc, i, tmp, s != ACCEL_OK, &own);
            if (!s) s = s2;
        }
        if (own) {
            KILL_POINT("save: optimizer file written");
            accel_progress_update(bar, 1);
            continue;
        }
        accel_named_state *st = NULL;
        float *bufs[2] = {NULL, NULL};
        int n = acc->pp_opt[i]                   ? accel__pipeline_optimizer_state(acc, i, &st, bufs)
                : accel__optimizer_model(acc, i) ? acc->strat->optimizer_state(acc, i, &st, bufs)
                : acc->rank == 0 || tp > 1       ? accel_optimizer_state(acc->opts[i], &st)
                                                 : 0;
        numbered(path, sizeof path, tmp, "optimizer", i);
        if (!s && n < 0) s = accel_last_status();
        /* under tp every rank joins the gathers of the whole states, even after a local failure */
        accel_status gs = n >= 0 ? accel__tp_gather_optimizer(acc, i, n, st) : ACCEL_OK;
        if (!s) s = gs;
        if (!s && acc->rank == 0) s = save_named(path, n, st);
        if (n >= 0) accel_named_state_free(st, n);
        accel_free(bufs[0]);
        accel_free(bufs[1]);
        KILL_POINT("save: optimizer file written");
        accel_progress_update(bar, 1);
    }
    if (!s) s = accel__custom_save(acc, tmp);
    if (!s) s = save_rank_state(acc, tmp);
    KILL_POINT("save: random states written");
    accel_progress_update(bar, 1);
    accel_progress_close(bar);
    return s;
}

/* Rank 0, once every rank's files are in tmp: the marker, then the swap. */
static accel_status commit(const char *tmp, const char *dir, int world, accel__staging *sg) {
    accel_status s = accel__marker_write(tmp, world, state_entry, "accel_accelerator_save_state");
    if (s) return s;
    KILL_POINT("commit: marker written"); /* the staged tree is fsynced by the commit */
    return accel__staged_commit(tmp, dir, sg, "accel_accelerator_save_state");
}

accel_status accel_accelerator_save_state(accel_accelerator *acc, const char *output_dir, char *out_dir,
                                          size_t out_n) {
    if (accel__acc_null(acc, "accel_accelerator_save_state")) return accel_last_status();
    char root[PATHN], dir[PATHN + 64], tmp[2 * PATHN + 160];
    accel_status s = ACCEL_OK;
    bool automatic = acc->o.automatic_checkpoint_naming;
    if (automatic) {
        snprintf(root, sizeof root, "%s/checkpoints", acc->project_dir);
        /* One past the highest number of any entry (so it survives restarts and
         * never meets a stray), as rank 0 sees it. */
        int64_t *nums = NULL, next = 0;
        int n = acc->rank == 0 ? list_checkpoints(root, &nums) : 0;
        if (n < 0) next = -1;
        else if (acc->rank == 0) {
            next = n ? nums[n - 1] + 1 : 0;
            accel_free(nums);
        }
        if (acc->world > 1 && (s = accel_pg_broadcast(acc->pg, &next, 1, ACCEL_I64, 0))) return s;
        if (next < 0) return accel_set_error(ACCEL_ERR_OOM, "accel_accelerator_save_state: out of memory");
        if (next > CHECKPOINT_MAX) /* a name no listing would see: every later save would reuse it */
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_save_state: %s holds checkpoint_%lld, the "
                                   "highest number automatic naming counts to: the next save has no name (rename or "
                                   "remove that entry)", root, CHECKPOINT_MAX);
        checkpoint_path(dir, sizeof dir, root, next);
    } else if (output_dir) {
        snprintf(dir, sizeof dir, "%s", output_dir);
    } else {
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_save_state: no output_dir given and automatic checkpoint "
                               "naming is disabled");
    }
    char given[PATHN + 64];
    snprintf(given, sizeof given, "%s", dir);
    accel__staged_resolve(given, dir, sizeof dir); /* a link to the directory: the directory is replaced, the link kept */
    accel__staged_path(dir, tmp, sizeof tmp);
    accel__staging sg = {.carry = user_entry, .lock = -1};
    if (acc->rank == 0) s = accel__staged_begin(dir, tmp, &sg, "accel_accelerator_save_state");
    bool began = acc->rank == 0 && s == ACCEL_OK;
    s = agree(acc, s);
    if (!s && acc->rank != 0 && !accel__is_dir(tmp)) /* every rank writes its files into rank 0's staged directory */
        s = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_save_state: rank %d does not see %s, where rank "
                            "0 stages the save of %s: output_dir must name the same directory on every rank (on a "
                            "filesystem they share)", acc->rank, tmp, dir);
    if ((s = agree(acc, s))) {
        if (began) accel__staged_abort(tmp, &sg); /* another rank failed, or the agreement itself */
        return s;
    }
    s = agree(acc, write_all(acc, tmp));
    if (!s && acc->rank == 0) {
        s = commit(tmp, dir, acc->world, &sg);
        if (!s && automatic && acc->o.total_limit > 0) rotate(root, acc->o.total_limit);
    }
    if ((s = agree(acc, s))) {
        /* a failed save (a full disk) leaves the previous checkpoint and no staged copy taking the space */
        if (acc->rank == 0) accel__staged_abort(tmp, &sg);
        return s;
    }
    acc->save_iteration++;
    if (out_dir && out_n) snprintf(out_dir, out_n, "%s", given);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- load_state */

/* Every rank takes rank 0's verdict on a checkpoint, in rank 0's words (they
 * name the corrupted file), then any rank's own failure: no rank starts
 * loading (ZeRO-3 loads are collective) unless all can. */
static accel_status share_verdict(accel_accelerator *acc, accel_status mine) {
    if (acc->world == 1) return mine;
    int32_t first = mine;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mine ? accel_last_error() : "");
    accel_status s = accel_pg_broadcast(acc->pg, &first, 1, ACCEL_I32, 0);
    if (!s) s = accel_pg_broadcast(acc->pg, msg, sizeof msg, ACCEL_U8, 0);
    if (s) return s;
    if (acc->rank != 0 && first) mine = accel_set_error((accel_status)first, "%s (found by rank 0)", msg);
    return accel__ranks_agree(acc, mine, FN_LOAD_STATE);
}

/* With automatic naming: the newest complete checkpoint, as rank 0 finds it. */
static accel_status pick_newest(accel_accelerator *acc, char *dir, size_t n) {
    char root[PATHN];
    snprintf(root, sizeof root, "%s/checkpoints", acc->project_dir);
    int64_t num = acc->rank == 0 ? newest_complete(root) : 0;
    accel_status s = acc->world > 1 ? accel_pg_broadcast(acc->pg, &num, 1, ACCEL_I64, 0) : ACCEL_OK;
    if (s) return s;
    if (num == -2) return accel_set_error(ACCEL_ERR_OOM, "accel_accelerator_load_state: out of memory");
    if (num < 0)
        return accel_set_error(ACCEL_ERR_IO, "accel_accelerator_load_state: no complete checkpoint_* in %s", root);
    checkpoint_path(dir, n, root, num);
    return ACCEL_OK;
}

/* Where training resumes: the first prepared loader's epoch and position, the
 * step counter, the first prepared optimizer's update count. */
static accel_resume_point resume_point(const accel_accelerator *acc) {
    accel_resume_point at = {0, 0, acc->step, acc->n_opts ? accel_optimizer_step_count(acc->opts[0]) : 0};
    if (acc->n_dls) {
        accel_dataloader_state st = accel_dataloader_get_state(acc->dls[0]);
        at.epoch = st.epoch;
        at.batch = st.position;
    }
    return at;
}

/* load_state's reads from dir (pinned): every object checked, then loaded;
 * each rank's RNG and tp streams into tps. Collective. */
static accel_status load_pinned(accel_accelerator *acc, const char *dir, saved_tp_streams *tps) {
    char path[2 * PATHN];
    accel_status s = ACCEL_OK;
    accel_progress *bar = files_bar(acc, "load_state");
    /* Every plain model file, every optimizer that loads itself, the
     * schedulers' optimizers and the registered blobs' sizes checked before
     * any is loaded: a later object's mismatch leaves the earlier ones as
     * they were. */
    bool pp = acc->par.size[ACCEL__MESH_PP] > 1;
    for (int i = 0; i < acc->n_models && !s; i++) {
        numbered(path, sizeof path, dir, "model", i);
        if (!acc->models[i].strat->load_state && !(s = refuse_foreign(dir, i)))
            s = load_model_file(path, acc->models[i].m, pp, false);
    }
    for (int i = 0; i < acc->n_opts && !s; i++) s = check_opt_first(acc, i, dir);
    for (int i = 0; i < acc->n_scheds && !s; i++) /* a scheduler whose optimizer was freed refuses its load */
        if (!accel__scheduler_alive(acc->scheds[i], FN_LOAD_STATE)) s = accel_last_status();
    if (!s) s = accel__custom_check(acc, dir);
    s = accel__ranks_agree(acc, s, FN_LOAD_STATE);
    /* Each model and optimizer ends agreed: some loads have collectives of
     * their own (ZeRO-3's shard agreement), and a rank that stopped after a
     * local failure met the next object's collectives of the others. */
    for (int i = 0; i < acc->n_models && !s; i++) {
        numbered(path, sizeof path, dir, "model", i);
        if (acc->models[i].strat->load_state) s = acc->models[i].strat->load_state(acc, i, dir);
        else s = load_model_file(path, acc->models[i].m, pp, true);
        s = accel__ranks_agree(acc, s, FN_LOAD_STATE);
        accel_progress_update(bar, 1);
    }
    for (int i = 0; i < acc->n_opts && !s; i++) {
        bool sharded = false;
        if (accel__optimizer_model(acc, i) && acc->strat->load_optimizer) s = acc->strat->load_optimizer(acc, i, dir, &sharded);
        numbered(path, sizeof path, dir, "optimizer", i);
        opt_slot os = {acc, i};
        if (!s && !sharded) s = load_file(path, &os, load_opt);
        s = accel__ranks_agree(acc, s, FN_LOAD_STATE);
        accel_progress_update(bar, 1);
    }
    for (int i = 0; i < acc->n_scheds && !s; i++) {
        numbered(path, sizeof path, dir, "scheduler", i);
        s = load_file(path, acc->scheds[i], load_sched);
        accel_progress_update(bar, 1);
    }
    KILL_POINT("load: models and optimizers read"); /* the tests swap the directory here */
    if (!s) s = accel__custom_load(acc, dir);
    if (!s) s = load_rank_state(acc, dir, tps);
    accel_progress_update(bar, 1);
    accel_progress_close(bar);
    return accel__ranks_agree(acc, s, FN_LOAD_STATE);
}

/* ---- the directory a load reads, pinned: a save over the same directory by
 * another process swaps a new directory in under its name at any moment
 * (accel__staged_commit), and a load reading some files before the swap and
 * some after would mix two checkpoints that each passed their checks. The
 * load opens the directory once and reads every file through that open
 * directory, "/proc/self/fd/<fd>/<file>": the one it checked, whatever its
 * name holds meanwhile (a save that then removes it makes the load fail on a
 * missing file, never mix). Without /proc the name is read, as before. */
typedef struct pinned_dir {
    int fd;
    char at[64]; /* "/proc/self/fd/<fd>", or "" when not pinned */
} pinned_dir;

/* The path to read dir's files by: p->at, else dir. */
static const char *pin(pinned_dir *p, const char *dir) {
    p->fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    p->at[0] = 0;
    if (p->fd >= 0) {
        snprintf(p->at, sizeof p->at, "/proc/self/fd/%d", p->fd);
        if (!accel__is_dir(p->at)) p->at[0] = 0;
    }
    return p->at[0] ? p->at : dir;
}

static void unpin(pinned_dir *p) {
    if (p->fd >= 0) close(p->fd);
}

/* s, with its message naming dir where it names the pinned path: the errors
 * of the reads speak of the user's directory. */
static accel_status named_by(accel_status s, const pinned_dir *p, const char *dir) {
    if (!s || !p->at[0]) return s;
    const char *msg = accel_last_error();
    size_t n = strlen(p->at), o = 0;
    char out[4096];
    for (const char *c = msg; *c && o + 1 < sizeof out;) {
        if (!strncmp(c, p->at, n) && !isdigit((unsigned char)c[n])) {
            o += (size_t)snprintf(out + o, sizeof out - o, "%s", dir);
            c += n;
        } else {
            out[o++] = *c++;
        }
    }
    out[o < sizeof out ? o : sizeof out - 1] = 0;
    return accel_set_error(s, "%s", out);
}

/* Every rank opened the checkpoint rank 0 checked: their markers' own
 * checksums agree (a save swapped in between two ranks' opens, or ranks given
 * different directories, would have them load different checkpoints). */
static accel_status same_checkpoint(accel_accelerator *acc, const char *at, const char *dir) {
    if (acc->world == 1) return ACCEL_OK;
    char mine[9], first[9], dir0[PATHN + 64];
    accel__marker_id(at, mine);
    memcpy(first, mine, sizeof first);
    snprintf(dir0, sizeof dir0, "%s", dir);
    accel_status s = accel_pg_broadcast(acc->pg, first, sizeof first, ACCEL_U8, 0);
    if (!s) s = accel_pg_broadcast(acc->pg, dir0, sizeof dir0, ACCEL_U8, 0);
    if (s) return s;
    if (strcmp(first, mine))
        s = accel_set_error(ACCEL_ERR_FORMAT, "%s: rank %d's checkpoint %s is not rank 0's %s (their completion "
                            "markers differ: the ranks were given different directories, or another process saved "
                            "into it while they opened it)", FN_LOAD_STATE, acc->rank, dir, dir0);
    return accel__ranks_agree(acc, s, FN_LOAD_STATE);
}

accel_status accel_accelerator_load_state(accel_accelerator *acc, const char *input_dir, accel_resume_point *at) {
    if (accel__acc_null(acc, "accel_accelerator_load_state")) return accel_last_status();
    char dir[PATHN + 64];
    accel_status s = ACCEL_OK;
    if (input_dir) snprintf(dir, sizeof dir, "%s", input_dir);
    else if (acc->o.automatic_checkpoint_naming) s = pick_newest(acc, dir, sizeof dir);
    else
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_load_state: No input_dir provided and automatic checkpoint "
                               "naming is disabled.");
    if (s) return s;
    pinned_dir p;
    const char *rd = pin(&p, dir);
    /* Rank 0 verifies every file's checksum (pick_newest did when it chose
     * dir): once, not once per rank; the other ranks check sizes. */
    s = share_verdict(acc, named_by(check_complete(rd, acc->rank == 0 && input_dir), &p, dir));
    if (!s) s = same_checkpoint(acc, rd, dir);
    saved_tp_streams tps;
    if (!s) s = named_by(load_pinned(acc, rd, &tps), &p, dir);
    unpin(&p);
    if (!s) s = accel__ranks_agree(acc, tp_streams_restore(acc, &tps), FN_LOAD_STATE);
    if (!s) {
        accel_resume_point r = resume_point(acc);
        accel__tracking_resumed(acc, dir, &r);
        if (at) *at = r;
    }
    return s;
}

