/* accel_rms_norm (transformers' LlamaRMSNorm) and accel_layer_norm (torch),
 * over the last dim, computed in f32. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "nn_internal.h"

/* Out dtype: f32 under autocast, else the promotion of the inputs. */
static accel_dtype norm_dtype(accel_tensor *x, accel_tensor *w, accel_tensor *b) {
    if (accel_autocast_dtype() != ACCEL_F32) return ACCEL_F32;
    accel_dtype dt = x->dtype;
    if (w) dt = accel__promote(dt, w->dtype);
    if (b) dt = accel__promote(dt, b->dtype);
    return dt;
}

static bool norm_check(const char *op, accel_tensor *x, accel_tensor *p, const char *what) {
    if (!p) return true;
    if (!accel__op_check_float(op, p, what)) return false;
    if (p->ndim != 1 || p->shape[0] != x->shape[x->ndim - 1]) {
        char why[64];
        snprintf(why, sizeof why, "do not fit (%s must be [%lld])", what,
                 (long long)x->shape[x->ndim - 1]);
        accel__shape_error2(op, x, p, why);
        return false;
    }
    return true;
}

/* Rounds v to dtype dt and back (identity for f32). */
static inline float round_to(float v, accel_dtype dt) {
    if (dt == ACCEL_BF16) return accel_bf16_to_f32(accel_f32_to_bf16(v));
    if (dt == ACCEL_F16) return accel_f16_to_f32(accel_f32_to_f16(v));
    return v;
}

/* What the backward of a norm needs besides its saved tensors. */
typedef struct norm_saved {
    int64_t R, D;
    float eps;
    accel_dtype x_dt;
} norm_saved;

/* ------------------------------------------------------------------ rms_norm */

/* sum of a[j] * b[j] (vectorised: 8 partial sums). */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < n; j++) acc += a[j] * b[j];
    return acc;
}

/* y[r] = w * round(x[r] * rstd[r]); rstd[r] = 1/sqrt(mean(x^2) + eps). */
static void rms_fwd(const float *x, const float *w, float *y, float *rstd, int64_t R, int64_t D,
                    float eps, accel_dtype xdt, bool ref) {
#pragma omp parallel for if (!ref && R * D > 16384) schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        float s;
        if (ref) {
            double acc = 0.0;
            for (int64_t j = 0; j < D; j++) acc += (double)xr[j] * xr[j];
            s = (float)(1.0 / sqrt(acc / (double)D + eps));
        } else {
            s = 1.0f / sqrtf(dot_f32(xr, xr, D) / (float)D + eps);
        }
        rstd[r] = s;
        if (xdt == ACCEL_F32 && w) { /* the common case, vectorised */
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = w[j] * (xr[j] * s);
            continue;
        }
        for (int64_t j = 0; j < D; j++) {
            float v = round_to(xr[j] * s, xdt);
            yr[j] = w ? w[j] * v : v;
        }
    }
}

/* dx[r] (+)= s (gw - x s mean(gw x s)) with gw = g * w, for rows [r0, r1). */
static void rms_dx_rows(const float *x, const float *g, const float *w, const float *rstd, float *dx,
                        float beta, int64_t r0, int64_t r1, int64_t D, float *tmp) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * D, *gr = g + r * D;
        float *d = dx + r * D, s = rstd[r];
        const float *gw = gr;
        if (w) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) tmp[j] = gr[j] * w[j];
            gw = tmp;
        }
        float c = s * s * dot_f32(gw, xr, D) / (float)D;
        if (beta == 0.0f) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) d[j] = s * gw[j] - xr[j] * (s * c);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) d[j] += s * gw[j] - xr[j] * (s * c);
        }
    }
}

/* gw[j] += sum over rows of g * round(x * rstd), for columns [c0, c1). */
static void rms_dw_cols(const float *x, const float *g, const float *rstd, float *gw, int64_t R, int64_t D,
                        int64_t c0, int64_t c1, accel_dtype xdt) {
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D, *gr = g + r * D;
        float s = rstd[r];
        if (xdt == ACCEL_F32) {
#pragma omp simd
            for (int64_t j = c0; j < c1; j++) gw[j] += gr[j] * (xr[j] * s);
        } else {
            for (int64_t j = c0; j < c1; j++) gw[j] += gr[j] * round_to(xr[j] * s, xdt);
        }
    }
}

static accel_status rms_backward(accel_node *node, accel_tensor *grad_out) {
    const norm_saved *sv = node->ctx;
    int64_t R = sv->R, D = sv->D;
    const float *x = node->saved[0]->data, *rstd = node->saved[2]->data;
    const float *w = node->saved[1] ? node->saved[1]->data : NULL;
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    const float *g = gt->data;
    accel__gbuf gx, gw;
    if (!accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin_zeroed(&gw, node->inputs[1]))
        return accel_last_status();
    int nt = R * D > 16384 ? accel_num_threads() : 1;
    float *tmp = gx.p && w ? accel_arena_alloc(accel_step_arena(), (size_t)(nt * D) * sizeof(float), 64) : NULL;
    if (gx.p && w && !tmp) return accel_last_status();
    /* Threads take row blocks for dx and column blocks for the weight grad. */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        int64_t cblk = ((D + n - 1) / n + 15) / 16 * 16;
        if (gx.p)
            rms_dx_rows(x, g, w, rstd, gx.p, gx.beta, R * t / n, R * (t + 1) / n, D, tmp ? tmp + t * D : NULL);
        int64_t c0 = t * cblk, c1 = c0 + cblk < D ? c0 + cblk : D;
        if (gw.p && c0 < c1) rms_dw_cols(x, g, rstd, gw.p, R, D, c0, c1, sv->x_dt);
    }
    accel_status st = accel__gbuf_end(&gx);
    return st == ACCEL_OK ? accel__gbuf_end(&gw) : st;
}

accel_tensor *accel_rms_norm(accel_tensor *x, accel_tensor *w, double eps) {
    static const char *OP = "accel_rms_norm";
    accel_tensor *in[2] = {x, w};
    accel_device dev;
    if (!accel__op_begin_opt(OP, 2, in, 2u, &dev)) return NULL;
    if (!accel__op_check_float(OP, x, "x")) return NULL;
    if (x->ndim == 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x must have at least 1 dim", OP);
        return NULL;
    }
    if (!norm_check(OP, x, w, "weight")) return NULL;
    accel_tensor *out = accel__op_out(norm_dtype(x, w, NULL), x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t D = x->shape[x->ndim - 1], R = D ? accel_numel(x) / D : 0;
    accel_tensor *xf = accel__f32_contig(x), *wf = w ? accel__f32_contig(w) : NULL;
    accel_tensor *y = out->dtype == ACCEL_F32 ? out : accel_empty(ACCEL_F32, x->ndim, x->shape);
    accel_tensor *rstd = accel_empty(ACCEL_F32, ACCEL_SHAPE(R));
    norm_saved *sv = accel_arena_alloc(accel_step_arena(), sizeof *sv, 64);
    if (!xf || (w && !wf) || !y || !rstd || !sv) return NULL;
    *sv = (norm_saved){R, D, (float)eps, x->dtype};
    rms_fwd(xf->data, wf ? wf->data : NULL, y->data, rstd->data, R, D, (float)eps, x->dtype,
            accel_reference_kernels());
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("rms_norm", rms_backward, out, 2, in);
    if (n) {
        n->saved[0] = xf;
        n->saved[1] = wf;
        n->saved[2] = rstd;
        n->ctx = sv;
    }
    return out;
}

/* ------------------------------------------------------------------ layer_norm */

static void ln_fwd(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
                   int64_t R, int64_t D, float eps, bool ref) {
#pragma omp parallel for if (!ref && R * D > 16384) schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        float mu, s;
        if (ref) {
            double m = 0.0, v = 0.0;
            for (int64_t j = 0; j < D; j++) m += xr[j];
            m /= (double)D;
            for (int64_t j = 0; j < D; j++) v += ((double)xr[j] - m) * ((double)xr[j] - m);
            mu = (float)m;
            s = (float)(1.0 / sqrt(v / (double)D + eps));
        } else {
            float m = 0.0f, v = 0.0f;
            for (int64_t j = 0; j < D; j++) m += xr[j];
            m /= (float)D;
            for (int64_t j = 0; j < D; j++) v += (xr[j] - m) * (xr[j] - m);
            mu = m;
            s = 1.0f / sqrtf(v / (float)D + eps);
        }
        mean[r] = mu;
        rstd[r] = s;
        for (int64_t j = 0; j < D; j++) {
            float v = (xr[j] - mu) * s;
            if (w) v *= w[j];
            if (b) v += b[j];
            yr[j] = v;
        }
    }
}

static accel_status ln_backward(accel_node *node, accel_tensor *grad_out) {
    const norm_saved *sv = node->ctx;
    int64_t R = sv->R, D = sv->D;
    const float *x = node->saved[0]->data, *mean = node->saved[2]->data, *rstd = node->saved[3]->data;
    const float *w = node->saved[1] ? node->saved[1]->data : NULL;
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    const float *g = gt->data;
    accel__gbuf gx, gw, gb;
    if (!accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin_zeroed(&gw, node->inputs[1]) ||
        !accel__gbuf_begin_zeroed(&gb, node->inputs[2]))
        return accel_last_status();
    if (gx.p) {
        float *dx = gx.p;
        float beta = gx.beta;
#pragma omp parallel for if (R * D > 16384) schedule(static)
        for (int64_t r = 0; r < R; r++) {
            const float *xr = x + r * D, *gr = g + r * D;
            float mu = mean[r], s = rstd[r], sum_g = 0.0f, sum_gx = 0.0f;
            for (int64_t j = 0; j < D; j++) {
                float dxn = gr[j] * (w ? w[j] : 1.0f);
                sum_g += dxn;
                sum_gx += dxn * (xr[j] - mu) * s;
            }
            sum_g /= (float)D;
            sum_gx /= (float)D;
            float *d = dx + r * D;
            for (int64_t j = 0; j < D; j++) {
                float v = s * (gr[j] * (w ? w[j] : 1.0f) - sum_g - (xr[j] - mu) * s * sum_gx);
                d[j] = beta == 0.0f ? v : d[j] + v;
            }
        }
    }
    for (int64_t r = 0; r < R && (gw.p || gb.p); r++) {
        const float *xr = x + r * D, *gr = g + r * D;
        for (int64_t j = 0; j < D; j++) {
            if (gw.p) gw.p[j] += gr[j] * (xr[j] - mean[r]) * rstd[r];
            if (gb.p) gb.p[j] += gr[j];
        }
    }
    accel_status st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    return st == ACCEL_OK ? accel__gbuf_end(&gb) : st;
}

accel_tensor *accel_layer_norm(accel_tensor *x, accel_tensor *w, accel_tensor *b, double eps) {
    static const char *OP = "accel_layer_norm";
    accel_tensor *in[3] = {x, w, b};
    accel_device dev;
    if (!accel__op_begin_opt(OP, 3, in, 6u, &dev)) return NULL;
    if (!accel__op_check_float(OP, x, "x")) return NULL;
    if (x->ndim == 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x must have at least 1 dim", OP);
        return NULL;
    }
    if (!norm_check(OP, x, w, "weight") || !norm_check(OP, x, b, "bias")) return NULL;
    accel_tensor *out = accel__op_out(norm_dtype(x, w, b), x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t D = x->shape[x->ndim - 1], R = D ? accel_numel(x) / D : 0;
    accel_tensor *xf = accel__f32_contig(x);
    accel_tensor *wf = w ? accel__f32_contig(w) : NULL, *bf = b ? accel__f32_contig(b) : NULL;
    accel_tensor *y = out->dtype == ACCEL_F32 ? out : accel_empty(ACCEL_F32, x->ndim, x->shape);
    accel_tensor *mean = accel_empty(ACCEL_F32, ACCEL_SHAPE(R)), *rstd = accel_empty(ACCEL_F32, ACCEL_SHAPE(R));
    norm_saved *sv = accel_arena_alloc(accel_step_arena(), sizeof *sv, 64);
    if (!xf || (w && !wf) || (b && !bf) || !y || !mean || !rstd || !sv) return NULL;
    *sv = (norm_saved){R, D, (float)eps, x->dtype};
    ln_fwd(xf->data, wf ? wf->data : NULL, bf ? bf->data : NULL, y->data, mean->data, rstd->data, R, D,
           (float)eps, accel_reference_kernels());
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("layer_norm", ln_backward, out, 3, in);
    if (n) {
        n->saved[0] = xf;
        n->saved[1] = wf;
        n->saved[2] = mean;
        n->saved[3] = rstd;
        n->ctx = sv;
    }
    return out;
}
