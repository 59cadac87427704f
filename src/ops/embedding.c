/* accel_embedding: rows of weight [V, D] picked by integer ids of any shape. */
#include <omp.h>
#include <string.h>

#include "nn_internal.h"

static accel_status embedding_backward(accel_node *node, accel_tensor *grad_out) {
    const int64_t *ids = node->saved[0]->data;
    int64_t n = node->iarg[0], D = node->iarg[1];
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    const float *g = gt->data;
    accel__gbuf gw;
    if (!accel__gbuf_begin_zeroed(&gw, node->inputs[1])) return accel_last_status();
    if (!gw.p) return ACCEL_OK;
    /* Scatter-add; ids may repeat, so threads split the columns, not the ids. */
#pragma omp parallel if (n * D > 65536)
    {
        int nt = omp_get_num_threads(), me = omp_get_thread_num();
        int64_t c0 = D * me / nt, c1 = D * (me + 1) / nt;
        for (int64_t i = 0; i < n; i++) {
            float *dst = gw.p + ids[i] * D;
            const float *src = g + i * D;
            for (int64_t j = c0; j < c1; j++) dst[j] += src[j];
        }
    }
    return accel__gbuf_end(&gw);
}

accel_tensor *accel_embedding(accel_tensor *ids, accel_tensor *weight) {
    static const char *OP = "accel_embedding";
    accel_tensor *in[2] = {ids, weight};
    accel_device dev;
    if (!accel__op_begin(OP, 2, in, &dev)) return NULL;
    if (ids->dtype != ACCEL_I64 && ids->dtype != ACCEL_I32) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: ids must be int64 or int32, got %s", OP, accel_dtype_name(ids->dtype));
        return NULL;
    }
    if (!accel__op_check_float(OP, weight, "weight")) return NULL;
    if (weight->ndim != 2 || ids->ndim + 1 > ACCEL_MAX_DIMS) {
        accel__shape_error2(OP, ids, weight, "do not fit (weight must be [V, D])");
        return NULL;
    }
    int64_t V = weight->shape[0], D = weight->shape[1];
    int64_t oshape[ACCEL_MAX_DIMS];
    memcpy(oshape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    oshape[ids->ndim] = D;
    accel_tensor *out = accel__op_out(weight->dtype, ids->ndim + 1, oshape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t n = accel_numel(ids);
    accel_tensor *idt = accel_empty(ACCEL_I64, ids->ndim, ids->shape);
    if (!idt || accel_to_int64s(ids, idt->data) != ACCEL_OK) return NULL;
    const int64_t *id = idt->data;
    for (int64_t i = 0; i < n; i++)
        if (id[i] < 0 || id[i] >= V) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: id %lld at position %lld is out of range for %lld embeddings",
                            OP, (long long)id[i], (long long)i, (long long)V);
            return NULL;
        }
    accel_tensor *w = accel__contig(weight);
    if (!w) return NULL;
    size_t es = accel_dtype_size(w->dtype), row = (size_t)D * es;
    const char *wp = w->data;
    char *op = out->data;
    if (accel_reference_kernels()) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < D; j++)
                accel__store_elem(op, w->dtype, (size_t)(i * D + j),
                                  accel__load_elem(wp, w->dtype, (size_t)(id[i] * D + j)));
    } else {
#pragma omp parallel for if (n * D > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) memcpy(op + (size_t)i * row, wp + (size_t)id[i] * row, row);
    }
    accel_node *nd = accel_tape_record("embedding", embedding_backward, out, 2, in);
    if (nd) {
        nd->saved[0] = idt;
        nd->iarg[0] = n;
        nd->iarg[1] = D;
    }
    return out;
}
