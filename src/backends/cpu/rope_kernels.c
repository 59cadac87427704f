/* Rotary position embedding (transformers' Llama rotate_half layout): the
 * cos/sin tables and the rotation, forward (+angle) and backward (-angle).
 * The rotation's fast path (bf16 read and written in registers) is in
 * fused_kernels.c. */
#include <math.h>

#include "cpu_kernels.h"

/* As transformers computes them: angle = f32(pos) * inv_freq in f32, cos/sin times the scale in f32. */
accel_status accel__cpuk_rope_tables(accel_k_rope_tables *k) {
    float *c = k->cos->data, *s = k->sin->data;
    const float *inv = k->inv_freq->data;
    int64_t T = k->T, half = k->half;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            float ang = (float)(k->pos0 + t) * inv[i];
            c[t * half + i] = cosf(ang) * k->scale;
            s[t * half + i] = sinf(ang) * k->scale;
        }
    return ACCEL_OK;
}

static bool fast_dtype(accel_dtype dt) { return dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16; }

/* The reference: the textbook form x * cos + rotate_half(x) * sign * sin,
 * element by element through generic loads (any float dtypes and strides). */
static void rope_reference(const accel_k_rope *k) {
    const accel_tensor *x = k->x, *y = k->y;
    const float *cs = k->cos->data, *sn = k->sin->data;
    int64_t H = x->shape[1], T = k->T, half = k->half, D = 2 * half, s3 = x->stride[3];
    for (int64_t r = 0; r < k->BH * T; r++) {
        int64_t t = r % T, bh = r / T;
        int64_t row = (bh / H) * x->stride[0] + (bh % H) * x->stride[1] + t * x->stride[2];
        int64_t yrow = (bh / H) * y->stride[0] + (bh % H) * y->stride[1] + t * y->stride[2];
        for (int64_t j = 0; j < D; j++) {
            int64_t i = j % half;
            float xj = (float)accel__load_elem(x->data, x->dtype, (size_t)(row + j * s3));
            float rot = j < half ? -(float)accel__load_elem(x->data, x->dtype, (size_t)(row + (j + half) * s3))
                                 : (float)accel__load_elem(x->data, x->dtype, (size_t)(row + (j - half) * s3));
            float v = xj * cs[t * half + i] + rot * (k->sign * sn[t * half + i]);
            size_t o = (size_t)(yrow + j * y->stride[3]);
            if (k->beta != 0.0f) v += (float)accel__load_elem(y->data, y->dtype, o);
            accel__store_elem(y->data, y->dtype, o, v);
        }
    }
}

accel_status accel__cpuk_rope(accel_k_rope *k) {
    if (k->BH * k->T * k->half == 0) return ACCEL_OK;
    if (accel_reference_kernels() || !fast_dtype(k->x->dtype) || !fast_dtype(k->y->dtype) || k->x->stride[3] != 1 ||
        k->y->stride[3] != 1)
        rope_reference(k);
    else
        accel__cpu_rope(k);
    return ACCEL_OK;
}
