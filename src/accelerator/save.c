/* register_for_checkpointing, accelerator.save, and reading a file back. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/io.h"
#include "accelerator/accelerator_internal.h"
#include "accelerator/strategy.h"
#include "accelerator/tracking_internal.h"
#include "io/io_internal.h"
#include "io/safetensors_internal.h"
#include "nn/family.h"

static accel_status register_one(accel_accelerator *acc, accel__custom c) {
    accel__tracking *tk = acc->tracking;
    accel__custom *grown = accel_calloc((size_t)tk->n_objs + 1, sizeof *grown);
    if (!grown) return accel_last_status();
    if (tk->n_objs) memcpy(grown, tk->objs, (size_t)tk->n_objs * sizeof *grown);
    accel_free(tk->objs);
    tk->objs = grown;
    tk->objs[tk->n_objs++] = c;
    return ACCEL_OK;
}

accel_status accel_accelerator_register_for_checkpointing(accel_accelerator *acc, void *obj,
                                                          accel_state_save_fn save, accel_state_load_fn load) {
    if (accel__acc_null(acc, "accel_accelerator_register_for_checkpointing")) return accel_last_status();
    if (!save || !load)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "All `objects` must include a `state_dict` and `load_state_dict` function to be "
                               "stored. The following inputs are invalid:\n\t- Item at index %d, `%s`",
                               acc->tracking->n_objs, !save ? "save is NULL" : "load is NULL");
    return register_one(acc, (accel__custom){.obj = obj, .save = save, .load = load});
}

accel_status accel_accelerator_register_blob_for_checkpointing(accel_accelerator *acc, void *data, size_t len) {
    if (accel__acc_null(acc, "accel_accelerator_register_blob_for_checkpointing")) return accel_last_status();
    if (!data || !len)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_register_blob_for_checkpointing: blob is NULL or empty");
    return register_one(acc, (accel__custom){.obj = data, .blob_len = len});
}

static void custom_path(char *out, size_t n, const char *dir, int i) {
    snprintf(out, n, "%s/custom_checkpoint_%d.bin", dir, i);
}

accel_status accel__custom_save(accel_accelerator *acc, const char *dir) {
    accel__tracking *tk = acc->tracking;
    accel_status st = ACCEL_OK;
    for (int i = 0; i < tk->n_objs && !st && acc->rank == 0; i++) {
        accel__custom *c = &tk->objs[i];
        char path[4200];
        custom_path(path, sizeof path, dir, i);
        if (!c->save) {
            st = accel__afile_write_all(path, c->obj, c->blob_len);
            continue;
        }
        void *data = NULL;
        size_t len = 0;
        st = c->save(c->obj, &data, &len);
        if (!st && !data && len)
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_save_state: registered object %d "
                                                        "returned %zu bytes at NULL", i, len);
        if (!st) st = accel__afile_write_all(path, data ? data : "", len);
        free(data);
    }
    return st;
}

/* How many custom_checkpoint_<N>.bin files dir holds (Accelerate counts
 * ^custom_checkpoint_\d+\.pkl$). */
static int count_custom(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *s = e->d_name;
        if (strncmp(s, "custom_checkpoint_", 18)) continue;
        s += 18;
        size_t digits = strspn(s, "0123456789");
        if (digits && !strcmp(s + digits, ".bin")) n++;
    }
    closedir(d);
    return n;
}

accel_status accel__custom_load(accel_accelerator *acc, const char *dir) {
    accel__tracking *tk = acc->tracking;
    int found = count_custom(dir);
    if (found < 0) return accel_set_error(ACCEL_ERR_IO, "accel_accelerator_load_state: cannot list %s", dir);
    if (found != tk->n_objs)
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "Number of custom checkpoints in folder %s does not match the number of registered "
                               "objects:\n\tFound checkpoints: %d\n\tRegistered objects: %d\nPlease make sure to "
                               "only load checkpoints from folders that were created with the same set of "
                               "registered objects, or avoid using `custom_checkpoint` in the filename for files "
                               "in that same directory and load them in manually.",
                               dir, found, tk->n_objs);
    accel_status st = ACCEL_OK;
    for (int i = 0; i < tk->n_objs && !st; i++) {
        accel__custom *c = &tk->objs[i];
        char path[4200];
        custom_path(path, sizeof path, dir, i);
        void *data = NULL;
        size_t len = 0;
        if ((st = accel_load_bytes(path, &data, &len))) break;
        if (c->save) st = c->load(c->obj, data, len);
        else if (len != c->blob_len)
            st = accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s holds %zu bytes, the registered "
                                                   "blob %d is %zu", path, len, i, c->blob_len);
        else memcpy(c->obj, data, len);
        free(data);
    }
    return st;
}

accel_status accel_accelerator_save_tensors(accel_accelerator *acc, const char *path, int n,
                                            const char *const *names, accel_tensor *const *tensors) {
    if (accel__acc_null(acc, "accel_accelerator_save_tensors")) return accel_last_status();
    if (!path) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_save_tensors: path is NULL");
    return acc->rank == 0 ? accel_safetensors_save(path, n, names, tensors, 0, NULL) : ACCEL_OK;
}

accel_status accel_accelerator_save_bytes(accel_accelerator *acc, const char *path, const void *data, size_t len) {
    if (accel__acc_null(acc, "accel_accelerator_save_bytes")) return accel_last_status();
    if (!path || (!data && len))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_save_bytes: path or data is NULL");
    return acc->rank == 0 ? accel__afile_write_all(path, len ? data : "", len) : ACCEL_OK;
}

accel_status accel_load_bytes(const char *path, void **data, size_t *len) {
    if (!path || !data || !len) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_load_bytes: NULL argument");
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode)) {
        int e = errno;
        if (f) fclose(f);
        return accel_set_error(ACCEL_ERR_IO, "accel_load_bytes: cannot read %s: %s", path,
                               f ? "not a regular file" : strerror(e));
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n ? n : 1);
    size_t got = buf ? fread(buf, 1, n, f) : 0;
    fclose(f);
    if (!buf) return accel_set_error(ACCEL_ERR_OOM, "accel_load_bytes: out of memory (%zu bytes)", n);
    if (got != n) {
        free(buf);
        return accel_set_error(ACCEL_ERR_IO, "accel_load_bytes: %s: short read (%zu of %zu bytes)", path, got, n);
    }
    *data = buf;
    *len = n;
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- save_model */

/* max_shard_size as bytes: the int form, else the string, else Accelerate's "10GB". */
static accel_status shard_bytes(const accel_save_model_opts *o, int64_t *out) {
    if (o->max_shard_bytes < 0 || (o->max_shard_bytes && o->max_shard_size))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_accelerator_save_model: give max_shard_size as a string or as a byte count "
                               "(max_shard_bytes > 0), not both (got \"%s\" and %lld)",
                               o->max_shard_size ? o->max_shard_size : "", (long long)o->max_shard_bytes);
    *out = o->max_shard_bytes;
    return o->max_shard_bytes ? ACCEL_OK : accel_parse_size(o->max_shard_size ? o->max_shard_size : "10GB", out);
}

/* safetensors cannot alias: the later names of a shared tensor are dropped
 * with Accelerate's warning; torch.save keeps them all over one storage. */
accel_status accel__write_model(accel_accelerator *acc, accel_module *model, const char *dir, int64_t max,
                               accel_weights_format fmt, bool write) {
    accel_state_dict *sd = accel_module_state_dict(model);
    if (!sd) return accel_last_status();
    /* tensor parallelism: the whole tensors, gathered from the tp group (collective) */
    accel_tensor **whole = NULL;
    accel_status gst = accel__tp_gather_state(acc, sd, &whole);
    if (gst != ACCEL_OK || !write) {
        accel__tp_gather_state_free(sd, whole);
        accel_state_dict_free(sd);
        return gst;
    }
    const char **names = accel_calloc((size_t)sd->n + 1, sizeof *names);
    accel_tensor **ts = accel_calloc((size_t)sd->n + 1, sizeof *ts);
    accel_status st = names && ts ? ACCEL_OK : accel_last_status();
    int k = 0;
    for (int i = 0; i < sd->n && !st; i++) {
        if (fmt == ACCEL_WEIGHTS_SAFETENSORS && sd->entries[i].is_tied_alias) {
            accel_log_warning(accel_get_logger(NULL), "Removed shared tensor {'%s'} while saving. This should be "
                              "OK, but check by loading the model back.", sd->entries[i].name);
            continue;
        }
        names[k] = sd->entries[i].name;
        ts[k++] = whole && whole[i] ? whole[i] : sd->entries[i].t;
    }
    if (!st) st = accel__write_sharded(dir, k, names, ts, max, fmt, NULL, NULL); /* dir: save_model's staged one */
    accel_free(names);
    accel_free(ts);
    accel__tp_gather_state_free(sd, whole);
    accel_state_dict_free(sd);
    return st;
}

/* The dtype config.json names: the weights' (the last float tensor's), or
 * the one a strategy writes f32 weights in (ZeRO-3's 16-bit save). */
static accel_dtype written_dtype(accel_accelerator *acc, accel_module *model, const accel__model *pm,
                                 accel_dtype dt) {
    accel_state_dict *sd = accel_module_state_dict(model);
    for (int i = 0; sd && i < sd->n; i++)
        if (accel_dtype_is_float(sd->entries[i].t->dtype)) dt = sd->entries[i].t->dtype;
    accel_state_dict_free(sd);
    return pm && pm->strat->saved_dtype && dt == ACCEL_F32 ? pm->strat->saved_dtype(acc) : dt;
}

/* config.json beside the weights when the model's family gives its root one
 * (nn/family.h: a causal LM of the architecture table, a BERT of
 * accel_bert_new), as transformers' save_pretrained writes it, so the
 * directory loads by itself: torch_dtype is the dtype the weights were
 * written in. */
static accel_status write_config(accel_accelerator *acc, accel_module *model, const accel__model *pm,
                                 const char *dir) {
    const accel__family *f = accel__family_of(model);
    accel_dtype dt;
    if (!f || !f->config_dtype(model, &dt)) return ACCEL_OK; /* no config of its own: none written */
    return accel__family_config_save(f, model, dir, written_dtype(acc, model, pm, dt));
}

accel_status accel_accelerator_save_model_with(accel_accelerator *acc, accel_module *model, const char *dir,
                                               const accel_save_model_opts *opts) {
    if (accel__acc_null(acc, "accel_accelerator_save_model")) return accel_last_status();
    if (!model || !dir) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_save_model: NULL argument");
    accel_save_model_opts o = opts ? *opts : (accel_save_model_opts){0};
    int64_t max = 0;
    accel_status st = shard_bytes(&o, &max);
    accel__model *pm = accel__find_model(acc, model);
    if (!st && pm) st = accel__pipeline_gather_weights(acc, model); /* pp: the stages' layers to every rank */
    bool gathered = pm && pm->strat->save_model; /* the strategy writes the weights (ZeRO-3 gathers them) */
    if (!st && gathered && o.no_safe_serialization)
        st = accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_accelerator_save_model: safe_serialization=False of a "
                                                    "ZeRO-3 model is not written yet: save safetensors");
    /* Crash-safe: written into a hidden sibling (holding links to the files it
     * does not rewrite) that replaces dir in one rename: killed or out of
     * space at any point, dir holds the previous model or the new one. */
    accel_weights_format fmt = o.no_safe_serialization ? ACCEL_WEIGHTS_PYTORCH : ACCEL_WEIGHTS_SAFETENSORS;
    accel__weights_save ws; /* every rank's names; rank 0 stages (a mount point refused: see docs/accelerator.md) */
    accel_status begun = accel__weights_begin(&ws, dir, !st && acc->rank == 0, false, "accel_accelerator_save_model");
    if (!st) st = begun;
    const char *tmp = ws.to;
    if (gathered) { /* the real weights, gathered unit by unit (collective: every rank joins) */
        accel_status st2 = pm->strat->save_model(acc, pm, tmp, max, st != ACCEL_OK);
        if (!st) st = st2;
    } else if (acc->mesh.size[ACCEL__MESH_TP] > 1) { /* every rank joins the gather, even after a failure */
        accel_status st2 = accel__write_model(acc, model, tmp, max, fmt, !st && acc->rank == 0);
        if (!st) st = st2;
    } else if (!st && acc->rank == 0) {
        st = accel__write_model(acc, model, tmp, max, fmt, true);
    }
    if (!st && acc->rank == 0) st = write_config(acc, model, pm, tmp);
    st = accel__ranks_agree(acc, st, "accel_accelerator_save_model");
    if (pm) { /* pp: the other stages' parameters gathered above go again */
        accel_status rel = accel__pipeline_release(acc, model, "accel_accelerator_save_model");
        if (!st) st = rel;
    }
    if (acc->rank == 0) {
        if (!st) st = accel__weights_commit(&ws, "accel_accelerator_save_model");
        if (st) accel__weights_abort(&ws);
    }
    return accel__ranks_agree(acc, st, "accel_accelerator_save_model");
}

accel_status accel_accelerator_save_model(accel_accelerator *acc, accel_module *model, const char *dir,
                                          const char *max_shard_size) {
    return accel_accelerator_save_model_with(acc, model, dir,
                                             &(accel_save_model_opts){.max_shard_size = max_shard_size});
}
