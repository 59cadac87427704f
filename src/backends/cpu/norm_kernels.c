/* RMSNorm (transformers' LlamaRMSNorm) and LayerNorm over the last dim, in
 * f32, forward and backward. */
#include <math.h>
#include <omp.h>

#include "cpu_kernels.h"

/* Rounds v to dtype dt and back (identity for f32). */
static inline float round_to(float v, accel_dtype dt) {
    if (dt == ACCEL_BF16) return accel_bf16_to_f32(accel_f32_to_bf16(v));
    if (dt == ACCEL_F16) return accel_f16_to_f32(accel_f32_to_f16(v));
    return v;
}

/* Row r of y rounded into y16 (dtype dt; NULL: none) while it is in L1,
 * with a copy's conversion (round to nearest even). */
static void row_rounded(void *y16, accel_dtype dt, const float *y, int64_t r, int64_t D) {
    if (y16) accel__cpu_from_f32((char *)y16 + (size_t)(r * D) * accel_dtype_size(dt), dt, y + r * D, D);
}

/* y[r] = w * round(x[r] * rstd[r]); rstd[r] = 1/sqrt(mean(x^2) + eps): the
 * rows of norm_rows.c, or the reference (mean(x^2) in double); each row
 * then rounded into y16 where there is one. */
static void rms_fwd(const accel_k_rms_norm *k, bool ref) {
    const float *x = k->x->data, *w = k->w ? k->w->data : NULL;
    float *y = k->y->data, *rstd = k->rstd->data, eps = k->eps;
    int64_t R = k->R, D = k->D;
    accel_dtype xdt = k->x_dt, dt16 = k->y16 ? k->y16->dtype : ACCEL_F32;
    void *y16 = k->y16 ? k->y16->data : NULL;
    if (!ref) {
#pragma omp parallel for if (R * D > 16384) schedule(static)
        for (int64_t r = 0; r < R; r++) {
            accel__cpu_rms_norm_row(x + r * D, w, y + r * D, rstd + r, D, eps, xdt);
            row_rounded(y16, dt16, y, r, D);
        }
        return;
    }
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D;
        double acc = 0.0;
        for (int64_t j = 0; j < D; j++) acc += (double)xr[j] * xr[j];
        float s = (float)(1.0 / sqrt(acc / (double)D + eps));
        rstd[r] = s;
        for (int64_t j = 0; j < D; j++) {
            float v = round_to(xr[j] * s, xdt);
            y[r * D + j] = w ? w[j] * v : v;
        }
        row_rounded(y16, dt16, y, r, D);
    }
}

accel_status accel__cpuk_rms_norm(accel_k_rms_norm *k) {
    rms_fwd(k, accel_reference_kernels());
    return ACCEL_OK;
}

/* The rows' blocks of the backward (one per 64 rows, rounded up, at most 64): the
 * weight gradient sums each block's rows into a partial of its own, then the
 * partials in block order, so its bits depend on R alone, never on the
 * thread count (which only spreads the blocks). */
static int64_t rms_row_blocks(int64_t R) {
    int64_t nb = (R + 63) / 64;
    return nb < 1 ? 1 : nb > 64 ? 64 : nb;
}

/* The weight gradient of R <= 64 rows (one block) with the threads on
 * column slices [c0, c1) (multiples of 16 floats), the rows added in order
 * as the one block adds them; dx by rows before it. */
static void rms_backward_few_rows(const accel_k_rms_norm_backward *k, int nt) {
    int64_t R = k->R, D = k->D;
    const float *x = k->x->data, *rstd = k->rstd->data, *g = k->g->data, *w = k->w ? k->w->data : NULL;
    float *dx = k->dx ? k->dx->data : NULL, *dw = k->dw ? k->dw->data : NULL;
    void *dx16 = k->dx16 ? k->dx16->data : NULL;
    accel_dtype dt16 = k->dx16 ? k->dx16->dtype : ACCEL_F32;
#pragma omp parallel num_threads(nt)
    {
        if (dx) {
#pragma omp for schedule(static) nowait
            for (int64_t r = 0; r < R; r++) {
                accel__cpu_rms_norm_dx_row(x + r * D, g + r * D, w, rstd[r], dx + r * D, k->dx_beta, D);
                row_rounded(dx16, dt16, dx, r, D);
            }
        }
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        int64_t cblk = ((D + n - 1) / n + 15) / 16 * 16, c0 = t * cblk, c1 = c0 + cblk < D ? c0 + cblk : D;
        for (int64_t r = 0; r < R && dw && c0 < c1; r++)
            accel__cpu_rms_norm_dw_row(x + r * D + c0, g + r * D + c0, rstd[r], dw + c0, c1 - c0, k->x_dt);
    }
}

/* One pass over x and g: the threads take blocks of rows, write their dx and
 * add their weight gradient into the block's partial (the rows are in L1 for
 * both); the partials are then summed into dw by column blocks. With one
 * block (R <= 64) and more than one thread, rms_backward_few_rows instead. */
accel_status accel__cpuk_rms_norm_backward(accel_k_rms_norm_backward *k) {
    int64_t R = k->R, D = k->D, nb = rms_row_blocks(R);
    const float *x = k->x->data, *rstd = k->rstd->data, *g = k->g->data;
    const float *w = k->w ? k->w->data : NULL;
    float *dx = k->dx ? k->dx->data : NULL, *dw = k->dw ? k->dw->data : NULL;
    void *dx16 = k->dx16 ? k->dx16->data : NULL;
    accel_dtype dt16 = k->dx16 ? k->dx16->dtype : ACCEL_F32;
    int nt = R * D > 16384 ? accel_num_threads() : 1;
    if (nb == 1 && nt > 1) {
        rms_backward_few_rows(k, nt);
        return ACCEL_OK;
    }
    /* D floats of dw partial per block (one block adds into dw itself); freed on return */
    size_t n_part = dw && nb > 1 ? (size_t)nb : 0;
    accel_arena *arena = accel_step_arena();
    accel_arena_mark mark = accel_arena_mark_now(arena);
    float *part = n_part ? accel_arena_alloc(arena, n_part * (size_t)D * sizeof(float), 64) : NULL;
    if (n_part && !part) return accel_last_status();
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            float *pdw = !dw ? NULL : nb == 1 ? dw : part + b * D;
            if (pdw && pdw != dw)
                for (int64_t j = 0; j < D; j++) pdw[j] = 0.0f;
            for (int64_t r = R * b / nb; r < R * (b + 1) / nb; r++) {
                if (dx) {
                    accel__cpu_rms_norm_dx_row(x + r * D, g + r * D, w, rstd[r], dx + r * D, k->dx_beta, D);
                    row_rounded(dx16, dt16, dx, r, D);
                }
                if (pdw) accel__cpu_rms_norm_dw_row(x + r * D, g + r * D, rstd[r], pdw, D, k->x_dt);
            }
        }
        if (n_part) { /* after the for's barrier: every partial is written */
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            int64_t cblk = ((D + n - 1) / n + 15) / 16 * 16, c0 = t * cblk, c1 = c0 + cblk < D ? c0 + cblk : D;
            for (int64_t u = 0; u < nb; u++)
                for (int64_t j = c0; j < c1; j++) dw[j] += part[u * D + j];
        }
    }
    return accel_arena_rewind(arena, mark);
}

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

accel_status accel__cpuk_layer_norm(accel_k_layer_norm *k) {
    ln_fwd(k->x->data, k->w ? k->w->data : NULL, k->b ? k->b->data : NULL, k->y->data, k->mean->data,
           k->rstd->data, k->R, k->D, k->eps, accel_reference_kernels());
    return ACCEL_OK;
}

accel_status accel__cpuk_layer_norm_backward(accel_k_layer_norm_backward *k) {
    int64_t R = k->R, D = k->D;
    const float *x = k->x->data, *mean = k->mean->data, *rstd = k->rstd->data, *g = k->g->data;
    const float *w = k->w ? k->w->data : NULL;
    float *gw = k->dw ? k->dw->data : NULL, *gb = k->db ? k->db->data : NULL;
    if (k->dx) {
        float *dx = k->dx->data;
        float beta = k->dx_beta;
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
    for (int64_t r = 0; r < R && (gw || gb); r++) {
        const float *xr = x + r * D, *gr = g + r * D;
        for (int64_t j = 0; j < D; j++) {
            if (gw) gw[j] += gr[j] * (xr[j] - mean[r]) * rstd[r];
            if (gb) gb[j] += gr[j];
        }
    }
    return ACCEL_OK;
}

/* ---- BatchNorm: per channel c over x [N, C, S], the N runs of S values
 * c owns. One channel per iteration (OpenMP). A channel holds N * S values
 * (a batch of images: 10^5 and more): each run is summed in f32 across
 * SIMD lanes (16 partial sums, vectorised: a double sum element by element
 * is a chain of dependent adds, 4 cycles each, which made BatchNorm a
 * sixth of a small ResNet's step) and the runs' sums are added in double. */

/* sum of r[i] over a run of S */
static inline float run_sum(const float *r, int64_t S) {
    float a = 0.0f;
#pragma omp simd reduction(+ : a)
    for (int64_t i = 0; i < S; i++) a += r[i];
    return a;
}

/* sum of (r[i] - m)^2 over a run of S */
static inline float run_sq(const float *r, int64_t S, float m) {
    float a = 0.0f;
#pragma omp simd reduction(+ : a)
    for (int64_t i = 0; i < S; i++) a += (r[i] - m) * (r[i] - m);
    return a;
}

/* sum of r[i] - m into *dev and of (r[i] - m)^2 into *sq over a run of S:
 * one read of the run for both */
static inline void run_dev_sq(const float *r, int64_t S, float m, double *dev, double *sq) {
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
    for (int64_t i = 0; i < S; i++) {
        float d = r[i] - m;
        a += d;
        b += d * d;
    }
    *dev += a;
    *sq += b;
}

accel_status accel__cpuk_batch_norm(accel_k_batch_norm *k) {
    int64_t N = k->N, C = k->C, S = k->S, M = N * S;
    const float *x = k->x->data, *w = k->w ? k->w->data : NULL, *b = k->b ? k->b->data : NULL;
    float *y = k->y ? k->y->data : NULL, *mean = k->mean->data, *invstd = k->invstd ? k->invstd->data : NULL;
    float *rm = k->running_mean ? k->running_mean->data : NULL, *rv = k->running_var ? k->running_var->data : NULL;
#pragma omp parallel for if (M * C > 16384) schedule(static)
    for (int64_t c = 0; c < C; c++) {
        float mu, is;
        if (k->training) {
            double s = 0.0, v = 0.0;
            for (int64_t n = 0; n < N; n++) s += run_sum(x + (n * C + c) * S, S);
            double m = M ? s / (double)M : 0.0;
            mu = (float)m;
            if (!y) {
                /* SyncBatchNorm's local statistics, f64: the f32 sums of a large mean lose digits the
                 * group's variance is made of (the ranks' means differ by little), so the mean is mu plus
                 * the mean deviation from it (small numbers: exact enough), and v, taken about mu, moves
                 * to that mean (sum (x - a)^2 = sum (x - m)^2 + M (m - a)^2) */
                double d = 0.0;
                for (int64_t n = 0; n < N; n++) run_dev_sq(x + (n * C + c) * S, S, mu, &d, &v);
                double mt = mu + (M ? d / (double)M : 0.0);
                ((double *)k->mean->data)[c] = mt;
                ((double *)k->m2->data)[c] = v - (double)M * (mt - mu) * (mt - mu);
                continue;
            }
            for (int64_t n = 0; n < N; n++) v += run_sq(x + (n * C + c) * S, S, mu);
            is = (float)(1.0 / sqrt(v / (double)M + k->eps));
            if (rm) rm[c] = (1.0f - k->momentum) * rm[c] + k->momentum * mu;
            if (rv) rv[c] = (1.0f - k->momentum) * rv[c] + k->momentum * (float)(v / (double)(M - 1));
        } else {
            mu = rm[c];
            is = 1.0f / sqrtf(rv[c] + k->eps);
        }
        mean[c] = mu;
        invstd[c] = is;
        float scale = is * (w ? w[c] : 1.0f), shift = (b ? b[c] : 0.0f) - mu * scale;
        for (int64_t n = 0; n < N; n++) {
            const float *xr = x + (n * C + c) * S;
            float *yr = y + (n * C + c) * S;
#pragma omp simd
            for (int64_t i = 0; i < S; i++) yr[i] = xr[i] * scale + shift;
        }
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_batch_norm_backward(accel_k_batch_norm_backward *k) {
    int64_t N = k->N, C = k->C, S = k->S, M = N * S;
    const float *x = k->x->data, *g = k->g->data, *w = k->w ? k->w->data : NULL;
    const float *mean = k->mean->data, *invstd = k->invstd->data;
    float *dx = k->dx ? k->dx->data : NULL, *dw = k->dw ? k->dw->data : NULL, *db = k->db ? k->db->data : NULL;
#pragma omp parallel for if (M * C > 16384) schedule(static)
    for (int64_t c = 0; c < C; c++) {
        float mu = mean[c], is = invstd[c];
        double sg = 0.0, sgx = 0.0; /* sums of g and of g * xhat */
        if (k->sums) { /* the group's (dw, db: none asked) */
            sg = ((const float *)k->sums->data)[c];
            sgx = ((const float *)k->sums->data)[C + c];
        }
        for (int64_t n = 0; n < N && !k->sums; n++) {
            const float *xr = x + (n * C + c) * S, *gr = g + (n * C + c) * S;
            float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
            for (int64_t i = 0; i < S; i++) {
                a += gr[i];
                b += gr[i] * (xr[i] - mu);
            }
            sg += a;
            sgx += (double)b * is;
        }
        if (dw) dw[c] += (float)sgx;
        if (db) db[c] += (float)sg;
        if (!dx) continue;
        float ws = (w ? w[c] : 1.0f) * is;
        /* training: xhat depends on the batch's mean and var, which take
         * their share of every gradient (the two means subtracted) */
        double cnt = (double)(k->sums ? k->count : M);
        float mg = k->training ? (float)(sg / cnt) : 0.0f, mgx = k->training ? (float)(sgx / cnt) : 0.0f;
        for (int64_t n = 0; n < N; n++) {
            const float *xr = x + (n * C + c) * S, *gr = g + (n * C + c) * S;
            float *d = dx + (n * C + c) * S;
            /* vectorised (each element as the scalar loop computed it):
             * beta's test per element kept this loop scalar */
            if (k->dx_beta == 0.0f) {
#pragma omp simd
                for (int64_t i = 0; i < S; i++) d[i] = ws * (gr[i] - mg - (xr[i] - mu) * is * mgx);
            } else {
#pragma omp simd
                for (int64_t i = 0; i < S; i++) d[i] += ws * (gr[i] - mg - (xr[i] - mu) * is * mgx);
            }
        }
    }
    return ACCEL_OK;
}
