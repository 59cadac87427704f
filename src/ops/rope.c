/* accel_rope: rotary position embedding, transformers' Llama rotate_half
 * layout: out = x * cos + rotate_half(x) * sin with rotate_half(x) =
 * cat(-x2, x1), cos/sin of angle pos * inv_freq[i] duplicated over both halves. */
#include <math.h>

#include "nn_internal.h"

/* cos/sin tables [T, D/2] in f32, as transformers computes them: inv_freq in
 * f32, angle = f32(pos) * inv_freq in f32. */
static bool rope_tables(int64_t T, int64_t half, int64_t pos0, double theta, accel_tensor **cs,
                        accel_tensor **sn) {
    *cs = accel_empty(ACCEL_F32, ACCEL_SHAPE(T, half));
    *sn = accel_empty(ACCEL_F32, ACCEL_SHAPE(T, half));
    if (!*cs || !*sn) return false;
    float *c = (*cs)->data, *s = (*sn)->data;
    for (int64_t i = 0; i < half; i++) {
        float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)(2 * half)));
        for (int64_t t = 0; t < T; t++) {
            float ang = (float)(pos0 + t) * inv;
            c[t * half + i] = cosf(ang);
            s[t * half + i] = sinf(ang);
        }
    }
    return true;
}

/* Rotates every row [D] of x [BH, T, D] by +angle (sign 1) or -angle (-1).
 * y may accumulate (beta 1). */
static void rope_apply(const float *x, float *y, int64_t BH, int64_t T, int64_t half, const float *cs,
                       const float *sn, float sign, float beta, bool ref) {
    int64_t D = 2 * half;
#pragma omp parallel for if (!ref && BH * T * D > 16384) schedule(static)
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

static accel_status rope_backward(accel_node *node, accel_tensor *grad_out) {
    int64_t BH = node->iarg[0], T = node->iarg[1], half = node->iarg[2];
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    accel__gbuf gx;
    if (!accel__gbuf_begin(&gx, node->inputs[0])) return accel_last_status();
    if (!gx.p) return ACCEL_OK;
    /* The inverse rotation. */
    rope_apply(gt->data, gx.p, BH, T, half, node->saved[0]->data, node->saved[1]->data, -1.0f, gx.beta,
               false);
    return accel__gbuf_end(&gx);
}

accel_tensor *accel_rope(accel_tensor *x, int64_t pos_offset, double theta) {
    static const char *OP = "accel_rope";
    accel_tensor *in[1] = {x};
    accel_device dev;
    if (!accel__op_begin(OP, 1, in, &dev) || !accel__op_check_float(OP, x, "x")) return NULL;
    if (x->ndim != 4 || x->shape[3] % 2 != 0) {
        char b[96];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_rope: x must be [B, H, T, D] with D even, got %s",
                        accel_shape_str(x, b, sizeof b));
        return NULL;
    }
    if (!(theta > 0.0) || pos_offset < 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rope: theta must be > 0 and pos_offset >= 0 (got %g, %lld)",
                        theta, (long long)pos_offset);
        return NULL;
    }
    accel_tensor *out = accel__op_out(x->dtype, 4, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t BH = x->shape[0] * x->shape[1], T = x->shape[2], half = x->shape[3] / 2;
    accel_tensor *cst, *snt;
    accel_tensor *xf = accel__f32_contig(x);
    accel_tensor *y = out->dtype == ACCEL_F32 ? out : accel_empty(ACCEL_F32, 4, x->shape);
    if (!xf || !y || !rope_tables(T, half, pos_offset, theta, &cst, &snt)) return NULL;
    const float *cs = cst->data, *sn = snt->data;
    bool ref = accel_reference_kernels();
    if (ref) { /* the textbook form: x * cos + rotate_half(x) * sin, element by element */
        const float *xp = xf->data;
        float *yp = y->data;
        int64_t D = 2 * half;
        for (int64_t r = 0; r < BH * T; r++)
            for (int64_t j = 0; j < D; j++) {
                int64_t i = j % half, t = r % T;
                float rot = j < half ? -xp[r * D + j + half] : xp[r * D + j - half];
                yp[r * D + j] = xp[r * D + j] * cs[t * half + i] + rot * sn[t * half + i];
            }
    } else {
        rope_apply(xf->data, y->data, BH, T, half, cs, sn, 1.0f, 0.0f, false);
    }
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("rope", rope_backward, out, 1, in);
    if (n) {
        n->saved[0] = cst;
        n->saved[1] = snt;
        n->iarg[0] = BH;
        n->iarg[1] = T;
        n->iarg[2] = half;
    }
    return out;
}
