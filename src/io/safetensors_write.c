/* src/io/safetensors_write.c — writing safetensors files (atomic). */
#include <string.h>

#include "accel/io.h"
#include "accel/tracking.h"
#include "io/io_internal.h"
#include "io/safetensors_internal.h"

static accel_status check_inputs(const char *path, int n, const char *const *names,
                                 accel_tensor *const *tensors) {
    if (!path || n < 0 || (n > 0 && (!names || !tensors)))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_safetensors_save: bad arguments");
    for (int i = 0; i < n; i++) {
        if (!names[i] || !names[i][0])
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_safetensors_save %s: tensor %d has no name",
                                   path, i);
        if (strcmp(names[i], "__metadata__") == 0)
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_safetensors_save %s: '__metadata__' is reserved", path);
        if (!accel_tensor_check(tensors[i], "accel_safetensors_save", names[i])) return accel_last_status();
        if (tensors[i]->device.type == ACCEL_DEV_META && accel_numel(tensors[i]) > 0)
            return accel_set_error(ACCEL_ERR_DEVICE,
                                   "accel_safetensors_save %s: tensor '%s' is on meta (it has no data to save)",
                                   path, names[i]);
    }
    return ACCEL_OK;
}

/* The header object; NULL + error for a name given twice (found through the
 * object's hash: a scan of the earlier names would make saving a model of many
 * layers quadratic), a name or metadata that is not UTF-8, or out of memory. */
static json_t *build_header(const char *path, int n, const char *const *names, accel_tensor *const *tensors,
                            int n_meta, const accel_kv *meta) {
    json_t *root = json_object(), *md = json_object();
    if (!root || !md) {
        json_decref(root);
        json_decref(md);
        accel_set_error(ACCEL_ERR_OOM, "accel_safetensors_save %s: cannot build header", path);
        return NULL;
    }
    json_object_set_new(md, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", md);
    /* JSON holds UTF-8 only: jansson refuses other keys and strings, which
     * were dropped without a word (a tensor's bytes then in no entry: a file
     * every reader refuses). */
    for (int i = 0; i < n_meta; i++)
        if (meta[i].key && meta[i].value && json_object_set_new(md, meta[i].key, json_string(meta[i].value))) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_safetensors_save %s: metadata '%s' is not valid UTF-8",
                            path, meta[i].key);
            json_decref(root);
            return NULL;
        }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (json_object_get(root, names[i])) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_safetensors_save %s: tensor name '%s' given twice", path,
                            names[i]);
            json_decref(root);
            return NULL;
        }
        const accel_tensor *t = tensors[i];
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
        uint64_t nb = accel_nbytes(t);
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + nb)));
        off += nb;
        json_object_set_new(e, "dtype", json_string(accel_dtype_st_name(t->dtype)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", of);
        if (json_object_set_new(root, names[i], e)) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_safetensors_save %s: tensor name '%s' is not valid UTF-8",
                            path, names[i]);
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

static accel_status afile_sink(void *f, const void *p, size_t n) { return accel__afile_write(f, p, n); }

accel_status accel_safetensors_save(const char *path, int n, const char *const *names,
                                    accel_tensor *const *tensors, int n_meta, const accel_kv *meta) {
    return accel__safetensors_save_with(path, n, names, tensors, n_meta, meta, NULL, NULL);
}

accel_status accel__safetensors_save_with(const char *path, int n, const char *const *names,
                                          accel_tensor *const *tensors, int n_meta, const accel_kv *meta,
                                          accel__tensor_ready_fn ready, void *ctx) {
    if (check_inputs(path, n, names, tensors)) return accel_last_status();
    if (n_meta < 0 || (n_meta > 0 && !meta))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_safetensors_save %s: bad metadata", path);
    json_t *root = build_header(path, n, names, tensors, n_meta, meta);
    if (!root) return accel_last_status();
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return accel_set_error(ACCEL_ERR_OOM, "accel_safetensors_save %s: cannot build header", path);
    size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8;
    if (hl + pad > ACCEL__ST_MAX_HEADER) {
        free(hdr);
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_safetensors_save %s: the header of %d tensors takes %zu bytes, over the 100 MB "
                               "that readers accept: save in shards",
                               path, n, hl + pad);
    }
    unsigned char len8[8];
    uint64_t total = hl + pad;
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(total >> (8 * i));
    accel__afile f;
    accel_status st = accel__afile_open(&f, path);
    if (st == ACCEL_OK) {
        static const char spaces[8] = "        ";
        st = accel__afile_write(&f, len8, 8);
        if (!st) st = accel__afile_write(&f, hdr, hl);
        if (!st) st = accel__afile_write(&f, spaces, pad);
        /* merge-weights, save_model and save_state spend their time here. */
        const char *base = strrchr(path, '/');
        char desc[96];
        snprintf(desc, sizeof desc, "Writing %s", base ? base + 1 : path);
        accel_progress *bar = accel_progress_new(n, &(accel_progress_opts){.desc = desc, .unit = "tensor", .delay = 1});
        for (int i = 0; i < n && !st; i++, accel_progress_update(bar, 1)) {
            if (ready) st = ready(ctx, tensors[i]);
            if (!st) st = accel__tensor_stream(tensors[i], afile_sink, &f, "accel_safetensors_save");
        }
        accel_progress_close(bar);
        if (!st) st = accel__afile_commit(&f);
        else accel__afile_abort(&f);
    }
    free(hdr);
    return st;
}
