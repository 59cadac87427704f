/* accel__masked_attention (attention_masked.h): the sliding-window mask and
 * soft-capping over explicit scores, composed of differentiable ops. */
#include <math.h>

#include "attention_masked.h"
#include "nn_internal.h"

accel_tensor *accel__window_mask(int64_t rows, int64_t T, int64_t S, int64_t pos, int64_t k0, int64_t W) {
    float *m = accel_arena_alloc(accel_step_arena(), (size_t)(rows * S) * sizeof *m, 64);
    if (!m) return NULL;
    for (int64_t r = 0; r < rows; r++) {
        int64_t qpos = pos + r % T;
        for (int64_t j = k0; j < k0 + S; j++)
            m[r * S + j - k0] = j <= qpos && (!W || j > qpos - W) ? 0.0f : -INFINITY;
    }
    return accel_from_data(ACCEL_F32, 2, (int64_t[]){rows, S}, m);
}

accel_tensor *accel__masked_attention(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos, int64_t W,
                                      double scale, double cap, double drop) {
    if (!q || !k || !v) return NULL;
    int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], Hkv = k->shape[1], S = k->shape[2];
    int64_t G = H / Hkv;
    /* query head h uses kv head h / G: rows of one kv head's G query heads together */
    accel_tensor *qg = accel_reshape(accel_contiguous(q), 4, (int64_t[]){B, Hkv, G * T, D});
    accel_tensor *mask = qg ? accel__window_mask(G * T, T, S, pos, 0, W) : NULL;
    if (mask && mask->dtype != qg->dtype) mask = accel_to_dtype(mask, qg->dtype);
    if (mask && !accel_device_eq(mask->device, qg->device)) mask = accel_to_device(mask, qg->device);
    accel_tensor *scores = accel_mul_scalar(accel_matmul(qg, accel_transpose(k, 2, 3)),
                                            scale > 0 ? scale : 1.0 / sqrt((double)D));
    if (cap > 0) scores = accel_mul_scalar(accel_tanh(accel_mul_scalar(scores, 1.0 / cap)), cap);
    accel_tensor *probs = accel_softmax(accel_add(scores, mask), 3);
    if (drop > 0) probs = accel_dropout(probs, drop, true, NULL);
    accel_tensor *o = accel_matmul(probs, v); /* [B, Hkv, G T, D] */
    return accel_reshape(o, 4, (int64_t[]){B, H, T, D});
}
