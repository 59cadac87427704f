/* Rotary position embedding (transformers' Llama rotate_half layout): the
 * cos/sin tables and the rotation, forward (+angle) and backward (-angle). */
#include <math.h>

#include "cpu_kernels.h"

/* As transformers computes them: inv_freq in f32, angle = f32(pos) * inv_freq in f32. */
accel_status accel__cpuk_rope_tables(accel_k_rope_tables *k) {
    float *c = k->cos->data, *s = k->sin->data;
    int64_t T = k->T, half = k->half;
    for (int64_t i = 0; i < half; i++) {
        float inv = (float)(1.0 / pow(k->theta, (double)(2 * i) / (double)(2 * half)));
        for (int64_t t = 0; t < T; t++) {
            float ang = (float)(k->pos0 + t) * inv;
            c[t * half + i] = cosf(ang);
            s[t * half + i] = sinf(ang);
        }
    }
    return ACCEL_OK;
}

/* Rotates every row [D] of x [BH, T, D] by sign * angle; y may accumulate (beta 1). */
static void rope_apply(const float *x, float *y, int64_t BH, int64_t T, int64_t half, const float *cs,
                       const float *sn, float sign, float beta) {
    int64_t D = 2 * half;
#pragma omp parallel for if (BH * T * D > 16384) schedule(static)
    for (int64_t r = 0; r < BH * T; r++) {
        const float *xr = x + r * D, *c = cs + (r % T) * half, *s = sn + (r % T) * half;
        float *yr = y + r * D;
        for (int64_t i = 0; i < half; i++) {
            float x1 = xr[i], x2 = xr[i + half], si = sign * s[i];
            float a = x1 * c[i] - x2 * si, b = x2 * c[i] + x1 * si;
            yr[i] = beta == 0.0f ? a : yr[i] + a;
            yr[i + half] = beta == 0.0f ? b : yr[i + half] + b;
        }
    }
}

/* The reference: the textbook form x * cos + rotate_half(x) * sin, element by element. */
static void rope_reference(const float *xp, float *yp, int64_t BH, int64_t T, int64_t half, const float *cs,
                           const float *sn) {
    int64_t D = 2 * half;
    for (int64_t r = 0; r < BH * T; r++)
        for (int64_t j = 0; j < D; j++) {
            int64_t i = j % half, t = r % T;
            float rot = j < half ? -xp[r * D + j + half] : xp[r * D + j - half];
            yp[r * D + j] = xp[r * D + j] * cs[t * half + i] + rot * sn[t * half + i];
        }
}

accel_status accel__cpuk_rope(accel_k_rope *k) {
    if (accel_reference_kernels() && k->sign == 1.0f && k->beta == 0.0f)
        rope_reference(k->x->data, k->y->data, k->BH, k->T, k->half, k->cos->data, k->sin->data);
    else
        rope_apply(k->x->data, k->y->data, k->BH, k->T, k->half, k->cos->data, k->sin->data, k->sign, k->beta);
    return ACCEL_OK;
}
