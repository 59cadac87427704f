/* nn.Embedding(num, dim, padding_idx): the plain Embedding (layers.c) whose
 * backward leaves row padding_idx out, as BERT's word embeddings and the
 * decoders' embed_tokens are built by transformers. */
#include "nn_internal.h"
#include "ops/embedding.h"

/* impl: the padding_idx (int64_t, accel_malloc'd; freed with the module) */
static accel_tensor *padded_forward(accel_module *m, accel_tensor *ids) {
    return accel__embedding_padded(ids, accel__module_tensor(m, "weight"), *(const int64_t *)m->impl);
}

/* The type name of the plain one: the same module to the state dict, the
 * tensor-parallel plans and the checkpoint loaders. */
static const accel_module_ops PADDED_OPS = {"Embedding", padded_forward, NULL};

accel_module *accel__padded_embedding_create(int64_t num, int64_t dim, accel_device dev, accel_dtype dt, double std,
                                             int64_t padding_idx) {
    if (padding_idx < -1 || padding_idx >= num) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_embedding_new: padding_idx %lld is not below num_embeddings "
                        "%lld (-1: none)", (long long)padding_idx, (long long)num);
        return NULL;
    }
    accel_module *m = accel__embedding_create(num, dim, dev, dt, std);
    if (!m || padding_idx < 0) return m;
    int64_t *pad = accel_malloc(sizeof *pad);
    accel_tensor *w = accel__module_tensor(m, "weight");
    /* transformers' init zeroes the row (a checkpoint's load replaces it); meta has no storage to zero */
    bool meta = w->device.type == ACCEL_DEV_META;
    accel_tensor *row = pad && !meta ? accel_view_raw(w, 2, (int64_t[]){1, dim}, w->stride, padding_idx * dim) : NULL;
    if (!pad || (!meta && (!row || accel_zero_(row) != ACCEL_OK))) {
        accel_free(pad);
        accel_module_free(m);
        return NULL;
    }
    *pad = padding_idx;
    m->ops = &PADDED_OPS;
    m->impl = pad;
    return m;
}

int64_t accel__embedding_padding_idx(const accel_module *m) {
    return m->ops == &PADDED_OPS ? *(const int64_t *)m->impl : -1;
}
