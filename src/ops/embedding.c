/* accel_embedding: rows of weight [V, D] picked by integer ids of any shape. */
#include <string.h>

#include "embedding.h"
#include "nn_internal.h"

static accel_status embedding_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    accel__gbuf gw;
    if (!accel__gbuf_begin_zeroed(&gw, node->inputs[1])) return accel_last_status();
    if (!gw.dst) return ACCEL_OK;
    accel_k_embedding_backward k = {.gw = gw.dst, .g = gt, .ids = node->saved[0], .n = node->iarg[0],
                                    .D = node->iarg[1], .pad = node->iarg[2]};
    accel_status st = ACCEL_KERNEL("embedding backward", gt->device, embedding_backward, &k);
    return st == ACCEL_OK ? accel__gbuf_end(&gw) : st;
}

accel_tensor *accel_embedding(accel_tensor *ids, accel_tensor *weight) {
    return accel__embedding_padded(ids, weight, -1);
}

accel_tensor *accel__embedding_padded(accel_tensor *ids, accel_tensor *weight, int64_t padding_idx) {
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
    if (padding_idx < -1 || padding_idx >= V) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: padding_idx %lld is not below the %lld embeddings (-1: none)", OP,
                        (long long)padding_idx, (long long)V);
        return NULL;
    }
    int64_t oshape[ACCEL_MAX_DIMS];
    memcpy(oshape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    oshape[ids->ndim] = D;
    accel_tensor *out = accel__op_out(weight->dtype, ids->ndim + 1, oshape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t n = accel_numel(ids);
    accel_tensor *i64 = ids->dtype == ACCEL_I64 ? ids : accel_to_dtype(ids, ACCEL_I64);
    accel_tensor *idt = i64 ? accel__contig(i64) : NULL, *w = accel__contig(weight);
    if (!idt || !w) return NULL;
    accel_k_embedding k = {.out = out, .w = w, .ids = idt, .n = n, .D = D, .V = V};
    if (ACCEL_KERNEL(OP, dev, embedding, &k) != ACCEL_OK) return NULL;
    accel_node *nd = accel_tape_record("embedding", embedding_backward, out, 2, in);
    if (nd) {
        nd->saved[0] = idt;
        nd->iarg[0] = n;
        nd->iarg[1] = D;
        nd->iarg[2] = padding_idx;
    }
    return out;
}
