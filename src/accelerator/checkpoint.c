/* save_state / load_state / save_model (accelerate.md §6) with crash-safe
 * directory replacement: everything is written into a hidden sibling
 * directory, which then takes the target's place in one rename. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/io.h"
#include "accelerator_internal.h"

#define PATHN 4096

/* ---------------------------------------------------------------- files */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    return remove(p);
}

static void rm_rf(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) == 0) nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static accel_status mkdir_p(const char *path) {
    char buf[PATHN];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *s = buf + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) break;
            *s = '/';
        }
    if (mkdir(buf, 0755) == 0 || (errno == EEXIST && is_dir(buf))) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_IO, "accel_accelerator_save_state: cannot create directory %s: %s", path,
                           strerror(errno));
}

static void fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* parent and basename of path (no trailing slash). */
static void split_path(const char *path, char *parent, char *base) {
    char buf[PATHN + 64];
    snprintf(buf, sizeof buf, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash) {
        strcpy(parent, ".");
        snprintf(base, PATHN + 64, "%s", buf);
    } else {
        snprintf(base, PATHN + 64, "%s", slash + 1);
        *slash = 0;
        snprintf(parent, PATHN + 64, "%s", slash == buf ? "/" : buf);
    }
}

/* "name.safetensors" for the first object, "name_<i>.safetensors" after. */
static void numbered(char *out, size_t n, const char *dir, const char *name, int i) {
    if (i == 0) snprintf(out, n, "%s/%s.safetensors", dir, name);
    else snprintf(out, n, "%s/%s_%d.safetensors", dir, name, i);
}

/* checkpoint_<N> entries of dir: the highest N (-1 when none) and, sorted
 * ascending, their numbers into nums (count in *count, at most cap). */
static int64_t list_checkpoints(const char *dir, int64_t *nums, int cap, int *count) {
    int64_t best = -1;
    int k = 0;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "checkpoint_", 11)) continue;
            char *end;
            long long v = strtoll(e->d_name + 11, &end, 10);
            if (*end || end == e->d_name + 11 || v < 0) continue;
            if (v > best) best = v;
            if (nums && k < cap) nums[k++] = v;
        }
        closedir(d);
    }
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && nums[j - 1] > nums[j]; j--) {
            int64_t t = nums[j];
            nums[j] = nums[j - 1];
            nums[j - 1] = t;
        }
    if (count) *count = k;
    return best;
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
            else ((double *)ts[i]->data)[0] = st[i].value;
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
    if (os->acc->zopts[os->i]) return accel__zero_load_state(os->acc, os->i, n, st);
    return accel_optimizer_load_state(os->acc->opts[os->i], n, st);
}
static accel_status load_sched(void *s, int n, const accel_named_state *st) {
    return accel_lr_scheduler_load_state(s, n, st);
}

/* ---------------------------------------------------------------- model */

static accel_status save_model_file(const char *path, accel_module *m) {
    accel_state_dict *sd = accel_module_state_dict(m);
    if (!sd) return accel_last_status();
    const char **names = accel_calloc((size_t)(sd->n ? sd->n : 1), sizeof *names);
    accel_tensor **ts = accel_calloc((size_t)(sd->n ? sd->n : 1), sizeof *ts);
    accel_status s = names && ts ? ACCEL_OK : accel_last_status();
    int k = 0;
    for (int i = 0; i < sd->n && !s; i++) {
        if (sd->entries[i].is_tied_alias) continue; /* shared tensors de-duplicated */
        names[k] = sd->entries[i].name;
        ts[k++] = sd->entries[i].t;
    }
    if (!s) s = accel_safetensors_save(path, k, names, ts, 0, NULL);
    accel_free(names);
    accel_free(ts);
    accel_state_dict_free(sd);
    return s;
}

static accel_status load_model_file(const char *path, accel_module *m) {
    accel_safetensors *f = accel_safetensors_open(path);
    if (!f) return accel_last_status();
    accel_state_dict *sd = accel_module_state_dict(m);
    accel_status s = sd ? ACCEL_OK : accel_last_status();
    for (int i = 0; sd && i < sd->n && !s; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        if (!accel_safetensors_find(f, sd->entries[i].name)) {
            s = accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s has no tensor %s", path,
                                sd->entries[i].name);
            break;
        }
        s = accel_safetensors_load_into(f, sd->entries[i].name, sd->entries[i].t);
    }
    accel_state_dict_free(sd);
    accel_safetensors_close(f);
    return s;
}

/* ---------------------------------------------------------------- per-rank state */

static accel_status save_rank_state(accel_accelerator *acc, const char *dir) {
    char path[3 * PATHN];
    snprintf(path, sizeof path, "%s/random_states_%d.safetensors", dir, acc->rank);
    const char *names[4 + ACCEL__MAX_PREPARED];
    accel_tensor *ts[4 + ACCEL__MAX_PREPARED] = {0};
    int n = 0;
    accel_rng *r = accel_default_rng();
    int64_t rng[2] = {(int64_t)r->seed, (int64_t)r->offset};
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
    for (int i = 0; i < n; i++)
        if (!ts[i]) s = accel_last_status();
    if (!s) s = accel_safetensors_save(path, n, names, ts, 0, NULL);
    for (int i = 0; i < n; i++) accel_tensor_free(ts[i]);
    return s;
}

static accel_status read_i64(accel_safetensors *f, const char *name, int64_t *out, int n) {
    accel_tensor *t = accel_safetensors_tensor(f, name, ACCEL_I64);
    if (!t || accel_numel(t) != n) {
        accel_tensor_free(t);
        return accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s: bad or missing \"%s\"",
                               accel_safetensors_path(f), name);
    }
    memcpy(out, t->data, (size_t)n * sizeof(int64_t));
    accel_tensor_free(t);
    return ACCEL_OK;
}

static accel_status load_rank_state(accel_accelerator *acc, const char *dir) {
    char path[3 * PATHN];
    snprintf(path, sizeof path, "%s/random_states_%d.safetensors", dir, acc->rank);
    accel_safetensors *f = accel_safetensors_open(path);
    if (!f) return accel_last_status();
    int64_t rng[2], step[2];
    accel_status s = read_i64(f, "rng", rng, 2);
    if (!s) s = read_i64(f, "step", step, 2);
    accel_tensor *sc = s ? NULL : accel_safetensors_tensor(f, "scaler", ACCEL_F64);
    if (!s && (!sc || accel_numel(sc) != 2))
        s = accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s: bad or missing \"scaler\"", path);
    for (int i = 0; i < acc->n_dls && !s; i++) {
        char name[32];
        int64_t d[3];
        snprintf(name, sizeof name, "dataloader_%d", i);
        if ((s = read_i64(f, name, d, 3))) break;
        accel_dataloader_state st = {d[0], d[1], (uint64_t)d[2]};
        if ((s = accel_dataloader_set_state(acc->dls[i], &st))) break;
    }
    if (!s) {
        accel_rng *r = accel_default_rng();
        r->seed = (uint64_t)rng[0];
        r->offset = (uint64_t)rng[1];
        acc->step = step[0];
        acc->sync_gradients = step[1] != 0;
        acc->scale = ((double *)sc->data)[0];
        acc->growth_tracker = (int64_t)((double *)sc->data)[1];
    }
    accel_tensor_free(sc);
    accel_safetensors_close(f);
    return s;
}

/* ---------------------------------------------------------------- save_state */

/* Every rank learns whether any rank failed (a collective all ranks reach). */
static accel_status agree(accel_accelerator *acc, accel_status mine) {
    if (acc->world == 1) return mine;
    int32_t v = mine != ACCEL_OK;
    accel_status st = accel_pg_all_reduce(acc->pg, &v, 1, ACCEL_I32, ACCEL_REDUCE_MAX);
    if (st) return st;
    if (v && !mine)
        return accel_set_error(ACCEL_ERR_IO, "accel_accelerator_save_state: another rank failed to write its state");
    return mine;
}

static accel_status write_all(accel_accelerator *acc, const char *tmp) {
    char path[3 * PATHN];
    accel_status s = ACCEL_OK;
    if (acc->rank == 0) {
        for (int i = 0; i < acc->n_models && !s; i++) {
            numbered(path, sizeof path, tmp, "model", i);
            s = save_model_file(path, acc->models[i].m);
        }
        for (int i = 0; i < acc->n_scheds && !s; i++) {
            accel_named_state *st = NULL;
            int n = accel_lr_scheduler_state(acc->scheds[i], &st);
            numbered(path, sizeof path, tmp, "scheduler", i);
            s = n < 0 ? accel_last_status() : save_named(path, n, st);
            if (n >= 0) accel_named_state_free(st, n);
        }
    }
    /* Optimizers: ZeRO state is consolidated first (a collective every rank
     * joins, even after a local failure), then written in the per-tensor
     * vocabulary DDP uses, so the file loads at any world size. */
    for (int i = 0; i < acc->n_opts; i++) {
        accel_named_state *st = NULL;
        float *bufs[2] = {NULL, NULL};
        int n = acc->zopts[i] ? accel__zero_state(acc, i, &st, bufs)
                              : acc->rank == 0 ? accel_optimizer_state(acc->opts[i], &st) : 0;
        numbered(path, sizeof path, tmp, "optimizer", i);
        if (!s && n < 0) s = accel_last_status();
        else if (!s && acc->rank == 0) s = save_named(path, n, st);
        if (n >= 0) accel_named_state_free(st, n);
        accel_free(bufs[0]);
        accel_free(bufs[1]);
    }
    if (!s) s = save_rank_state(acc, tmp);
    return s;
}

accel_status accel_accelerator_save_state(accel_accelerator *acc, const char *output_dir, char *out_dir,
                                          size_t out_n) {
    if (!acc) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_save_state: accelerator is NULL");
    char dir[PATHN + 64], parent[PATHN + 64], base[PATHN + 64], tmp[2 * PATHN + 160];
    accel_status s = ACCEL_OK;
    if (acc->o.automatic_checkpoint_naming) {
        char root[PATHN];
        snprintf(root, sizeof root, "%s/checkpoints", acc->project_dir);
        /* The next number comes from the directory (so it survives restarts), as rank 0 sees it. */
        int64_t next = list_checkpoints(root, NULL, 0, NULL) + 1;
        if (acc->world > 1 && (s = accel_pg_broadcast(acc->pg, &next, 1, ACCEL_I64, 0))) return s;
        snprintf(dir, sizeof dir, "%s/checkpoint_%lld", root, (long long)next);
        if (acc->rank == 0 && acc->o.total_limit > 0) {
            int64_t nums[1024];
            int count = 0;
            list_checkpoints(root, nums, 1024, &count);
            int excess = count + 1 - acc->o.total_limit;
            if (excess > 0)
                fprintf(stderr, "Deleting %d checkpoints to make room for new checkpoint.\n", excess);
            for (int i = 0; i < excess; i++) {
                char old[PATHN + 32];
                snprintf(old, sizeof old, "%s/checkpoint_%lld", root, (long long)nums[i]);
                rm_rf(old);
            }
        }
    } else if (output_dir) {
        snprintf(dir, sizeof dir, "%s", output_dir);
    } else {
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_save_state: no output_dir given and automatic checkpoint "
                               "naming is disabled");
    }
    split_path(dir, parent, base);
    snprintf(tmp, sizeof tmp, "%s/.tmp_%s", parent, base);
    if (acc->rank == 0) {
        rm_rf(tmp); /* left over by a crashed save */
        s = mkdir_p(parent);
        if (!s) s = mkdir_p(tmp);
    }
    if ((s = agree(acc, s))) return s;
    s = agree(acc, write_all(acc, tmp));
    if (!s && acc->rank == 0) {
        /* Swap the complete new directory into place atomically. */
        if (is_dir(dir)) {
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE))
                s = accel_set_error(ACCEL_ERR_IO, "accel_accelerator_save_state: cannot replace %s: %s", dir,
                                    strerror(errno));
            else
                rm_rf(tmp);
        } else if (rename(tmp, dir)) {
            s = accel_set_error(ACCEL_ERR_IO, "accel_accelerator_save_state: cannot rename %s to %s: %s", tmp, dir,
                                strerror(errno));
        }
        fsync_dir(parent);
    }
    if ((s = agree(acc, s))) return s;
    acc->save_iteration++;
    if (out_dir && out_n) snprintf(out_dir, out_n, "%s", dir);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- load_state */

/* Where training resumes: the first prepared loader's epoch and position, the step counter. */
static accel_resume_point resume_point(const accel_accelerator *acc) {
    accel_resume_point at = {0, 0, acc->step};
    if (acc->n_dls) {
        accel_dataloader_state st = accel_dataloader_get_state(acc->dls[0]);
        at.epoch = st.epoch;
        at.batch = st.position;
    }
    return at;
}

accel_status accel_accelerator_load_state(accel_accelerator *acc, const char *input_dir, accel_resume_point *at) {
    if (!acc) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_load_state: accelerator is NULL");
    char dir[PATHN + 64], path[2 * PATHN];
    if (input_dir) {
        snprintf(dir, sizeof dir, "%s", input_dir);
    } else if (acc->o.automatic_checkpoint_naming) {
        char root[PATHN];
        snprintf(root, sizeof root, "%s/checkpoints", acc->project_dir);
        int64_t last = list_checkpoints(root, NULL, 0, NULL);
        if (last < 0)
            return accel_set_error(ACCEL_ERR_IO, "accel_accelerator_load_state: no checkpoint_* in %s", root);
        snprintf(dir, sizeof dir, "%s/checkpoint_%lld", root, (long long)last);
    } else {
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_load_state: No input_dir provided and automatic checkpoint "
                               "naming is disabled.");
    }
    if (!is_dir(dir))
        return accel_set_error(ACCEL_ERR_IO, "accel_accelerator_load_state: Tried to find %s but folder does not exist",
                               dir);
    accel_status s = ACCEL_OK;
    for (int i = 0; i < acc->n_models && !s; i++) {
        numbered(path, sizeof path, dir, "model", i);
        s = load_model_file(path, acc->models[i].m);
    }
    for (int i = 0; i < acc->n_opts && !s; i++) {
        numbered(path, sizeof path, dir, "optimizer", i);
        opt_slot os = {acc, i};
        s = load_file(path, &os, load_opt);
    }
    for (int i = 0; i < acc->n_scheds && !s; i++) {
        numbered(path, sizeof path, dir, "scheduler", i);
        s = load_file(path, acc->scheds[i], load_sched);
    }
    if (!s) s = load_rank_state(acc, dir);
    s = agree(acc, s);
    if (!s && at) *at = resume_point(acc);
    return s;
}

/* ---------------------------------------------------------------- save_model */

accel_status accel_accelerator_save_model(accel_accelerator *acc, accel_module *model, const char *dir,
                                          const char *max_shard_size) {
    if (!acc || !model || !dir)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_save_model: NULL argument");
    int64_t max = 0;
    accel_status s = accel_parse_size(max_shard_size ? max_shard_size : "10GB", &max);
    if (!s && acc->rank == 0) {
        struct stat sb;
        if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
            s = accel_set_error(ACCEL_ERR_IO, "accel_accelerator_save_model: Provided path (%s) should be a "
                                              "directory, not a file", dir);
        else if (!(s = mkdir_p(dir)))
            s = accel_save_module(dir, model, max);
    }
    return agree(acc, s);
}
