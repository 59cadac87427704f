/* Cross-entropy (mean over targets != ignore_index) and MSE losses, in f32,
 * forward and backward. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"
#include "vec_math.h"

/* The loss of one row: logsumexp(x) - x[t]; lse written for the backward. */
static double ce_row(const float *x, int64_t C, int64_t t, float *lse, bool ref) {
    if (ref) {
        double m = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < C; j++) m = fmax(m, x[j]);
        for (int64_t j = 0; j < C; j++) s += exp((double)x[j] - m);
        *lse = (float)(m + log(s));
        return m + log(s) - x[t];
    }
    float m = accel__row_max(x, C);
    *lse = m + logf(accel__row_sum_exp(x, C, m));
    return (double)*lse - x[t];
}

/* d (+)= (softmax(x) - onehot(t)) * scale for one row; lse its logsumexp
 * (of the whole row: a vocabulary-parallel rank passes the logsumexp over
 * every rank's columns, and t outside [0, C), no one-hot, for a row whose
 * target another rank holds). */
ACCEL__VEC_MATH static void ce_row_grad(const float *x, float *d, int64_t C, int64_t t, float lse,
                                        float scale, float beta) {
    if (beta == 0.0f) {
#pragma omp simd
        for (int64_t j = 0; j < C; j++) d[j] = accel__expf(x[j] - lse) * scale;
    } else {
#pragma omp simd
        for (int64_t j = 0; j < C; j++) d[j] += accel__expf(x[j] - lse) * scale;
    }
    if (t >= 0 && t < C) d[t] -= scale;
}

/* *count = the targets that are not ignore; an error names the first one
 * outside [0, C). */
static accel_status count_targets(const int64_t *t, int64_t N, int64_t C, int64_t ignore, int64_t *count) {
    *count = 0;
    for (int64_t i = 0; i < N; i++) {
        if (t[i] == ignore) continue;
        if (t[i] < 0 || t[i] >= C)
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_cross_entropy: target %lld at position %lld is out of range for %lld classes",
                                   (long long)t[i], (long long)i, (long long)C);
        ++*count;
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_cross_entropy(accel_k_cross_entropy *k) {
    int64_t N = k->N, C = k->C, ignore = k->ignore, count;
    const int64_t *t = k->targets->data;
    if (count_targets(t, N, C, ignore, &count) != ACCEL_OK) return accel_last_status();
    const float *x = k->x->data;
    float *lp = k->lse->data;
    bool ref = accel_reference_kernels();
    double total = 0.0;
#pragma omp parallel for if (!ref && N * C > 16384) reduction(+ : total) schedule(static)
    for (int64_t i = 0; i < N; i++)
        if (t[i] != ignore) total += ce_row(x + i * C, C, t[i], &lp[i], ref);
    /* All targets ignored: 0/0 = nan, as PyTorch. */
    *(float *)k->out->data = count ? (float)(total / (double)count) : NAN;
    *(int64_t *)k->count->data = count;
    return ACCEL_OK;
}

accel_status accel__cpuk_cross_entropy_backward(accel_k_cross_entropy_backward *k) {
    int64_t N = k->N, C = k->C, ignore = k->ignore;
    const float *x = k->x->data, *lse = k->lse->data;
    const int64_t *t = k->targets->data;
    float scale = (float)((double)*(const float *)k->g->data / (double)*(const int64_t *)k->count->data);
    float *dx = k->dx->data, beta = k->beta;
#pragma omp parallel for if (N * C > 16384) schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float *d = dx + i * C;
        if (t[i] != ignore) ce_row_grad(x + i * C, d, C, t[i], lse[i], scale, beta);
        else if (beta == 0.0f) memset(d, 0, (size_t)C * sizeof *d);
    }
    return ACCEL_OK;
}

/* The rows run in fused_kernels.c (per ISA); the reference of this kernel
 * is the pair cross_entropy + cross_entropy_backward, which the op uses under
 * accel_set_reference_kernels(true). */
accel_status accel__cpuk_cross_entropy_fused(accel_k_cross_entropy_fused *k) {
    int64_t count;
    if (count_targets(k->targets->data, k->N, k->C, k->ignore, &count) != ACCEL_OK) return accel_last_status();
    int nt = accel_num_threads();
    float *scratch = accel_arena_alloc(accel_step_arena(), (size_t)nt * (size_t)k->C * sizeof(float), 64);
    if (!scratch) return accel_last_status();
    double total = 0.0;
    accel__cpu_cross_entropy_fused(k, count, nt, scratch, &total);
    /* All targets ignored: 0/0 = nan, as PyTorch. */
    *(float *)k->out->data = count ? (float)(total / (double)count) : NAN;
    *(int64_t *)k->count->data = count;
    return ACCEL_OK;
}

accel_status accel__cpuk_mse(accel_k_mse *k) {
    int64_t n = accel_numel(k->pred);
    const float *p = k->pred->data, *t = k->target->data;
    double total = 0.0;
    if (accel_reference_kernels()) {
        for (int64_t i = 0; i < n; i++) total += ((double)p[i] - t[i]) * ((double)p[i] - t[i]);
    } else {
#pragma omp parallel for if (n > 65536) reduction(+ : total) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float d = p[i] - t[i];
            total += d * d;
        }
    }
    *(float *)k->out->data = n ? (float)(total / (double)n) : NAN;
    return ACCEL_OK;
}

accel_status accel__cpuk_mse_backward(accel_k_mse_backward *k) {
    int64_t n = accel_numel(k->pred);
    const float *p = k->pred->data, *t = k->target->data;
    float s = k->sign * (float)(2.0 * (double)*(const float *)k->g->data / (double)n), beta = k->beta;
    float *d = k->d->data;
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float v = s * (p[i] - t[i]);
        d[i] = beta == 0.0f ? v : d[i] + v;
    }
    return ACCEL_OK;
}
