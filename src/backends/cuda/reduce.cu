/* Reductions (sum over a set of dims, max over one dim), softmax and the
 * losses (cross-entropy over the vocabulary, MSE), forward and backward.
 * One block per reduced row with block-wide reductions in f32; the loss
 * totals are accumulated in f64 as the CPU's. */
#include "cuda_common.cuh"

/* ---- sum */

__global__ void sum_k(float *out, accel_dtype odt, const void *x, accel_dtype xdt, kview kept, kview red,
                      int64_t kn, int64_t rn, float scale) {
    ROW_LOOP(o, kn) {
        int64_t base = offset_of(kept, o);
        float acc = 0.0f;
        for (int64_t j = threadIdx.x; j < rn; j += blockDim.x) acc += load_f(x, xdt, base + offset_of(red, j));
        acc = block_sum(acc);
        if (threadIdx.x == 0) accel__elem_set(out, odt, o, (double)(acc * scale));
    }
}

extern "C" accel_status accel__cudak_sum(accel_k_sum *k) {
    int index = k->out->device.index;
    const accel_tensor *x = k->x;
    kview kept = {}, red = {};
    int64_t kn = 1, rn = 1;
    for (int d = 0; d < x->ndim; d++) {
        kview *v = (k->mask >> d) & 1u ? &red : &kept;
        v->shape[v->ndim] = x->shape[d];
        v->stride[v->ndim++] = x->stride[d];
        *((k->mask >> d) & 1u ? &rn : &kn) *= x->shape[d];
    }
    if (!kn) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    sum_k<<<row_blocks(kn), KTHREADS, 0, s>>>((float *)k->out->data, k->out->dtype, x->data, x->dtype, kept, red, kn,
                                             rn, (float)k->scale);
    return launched(index, "sum");
}

/* ---- max: one thread per output, scanning its dim in order (first index of
 * the max; a NaN wins and stops the scan), as the CPU. */

__global__ void max_k(void *values, accel_dtype vdt, int64_t *indices, const void *x, accel_dtype xdt, kview kept,
                      int64_t kn, int64_t len, int64_t st) {
    GRID_STRIDE(o, kn) {
        int64_t base = offset_of(kept, o);
        double best = accel__elem_get(x, xdt, base);
        int64_t bi = 0;
        for (int64_t j = 1; j < len && !isnan(best); j++) {
            double v = accel__elem_get(x, xdt, base + j * st);
            if (v > best || isnan(v)) {
                best = v;
                bi = j;
            }
        }
        accel__elem_set(values, vdt, o, best);
        indices[o] = bi;
    }
}

extern "C" accel_status accel__cudak_max(accel_k_max *k) {
    int index = k->values->device.index;
    const accel_tensor *x = k->x;
    kview kept = {};
    int64_t kn = 1;
    for (int d = 0; d < x->ndim; d++)
        if (d != k->dim) {
            kept.shape[kept.ndim] = x->shape[d];
            kept.stride[kept.ndim++] = x->stride[d];
            kn *= x->shape[d];
        }
    if (!kn) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    max_k<<<blocks_for(kn), KTHREADS, 0, s>>>(k->values->data, k->values->dtype, (int64_t *)k->indices->data, x->data,
                                             x->dtype, kept, kn, x->shape[k->dim], x->stride[k->dim]);
    return launched(index, "max");
}

__global__ void max_scatter_k(float *gx, const float *g, const int64_t *idx, int64_t outer, int64_t len, int64_t inner) {
    GRID_STRIDE(l, outer * inner) {
        int64_t o = l / inner, i = l % inner;
        gx[(o * len + idx[l]) * inner + i] = g[l];
    }
}

extern "C" accel_status accel__cudak_max_backward(accel_k_max_backward *k) {
    int index = k->gx->device.index;
    const accel_tensor *x = k->gx;
    int d = k->dim;
    int64_t outer = 1, inner = 1, len = x->shape[d];
    for (int i = 0; i < d; i++) outer *= x->shape[i];
    for (int i = d + 1; i < x->ndim; i++) inner *= x->shape[i];
    cudaStream_t s = accel__cuda_enter(index);
    size_t bytes = (size_t)accel_numel(x) * sizeof(float);
    if (!bytes) return ACCEL_OK;
    if (accel__cuda_check(cudaMemsetAsync(x->data, 0, bytes, s), index, "max_backward") != ACCEL_OK)
        return accel_last_status();
    if (outer * inner == 0) return ACCEL_OK;
    max_scatter_k<<<blocks_for(outer * inner), KTHREADS, 0, s>>>((float *)x->data, (const float *)k->g->data,
                                                                 (const int64_t *)k->indices->data, outer, len, inner);
    return launched(index, "max_backward");
}

/* ---- softmax over the middle dim of [outer, D, inner]: one block per (outer, inner) line */

__global__ void softmax_k(float *y, const float *x, int64_t outer, int64_t D, int64_t inner, bool log_) {
    ROW_LOOP(l, outer * inner) {
        int64_t base = (l / inner) * D * inner + l % inner;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, x[base + j * inner]);
        m = block_max(m);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += expf(x[base + j * inner] - m);
        sum = block_sum(sum);
        float lse = m + logf(sum), inv = 1.0f / sum;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            int64_t o = base + j * inner;
            y[o] = log_ ? x[o] - lse : expf(x[o] - m) * inv;
        }
    }
}

extern "C" accel_status accel__cudak_softmax(accel_k_softmax *k) {
    int index = k->y->device.index;
    int64_t lines = k->outer * k->inner;
    if (!lines || !k->D) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    softmax_k<<<row_blocks(lines), KTHREADS, 0, s>>>((float *)k->y->data, (const float *)k->x->data, k->outer, k->D,
                                                    k->inner, k->log);
    return launched(index, "softmax");
}

/* softmax: dx = y (g - sum(g y));  log_softmax: dx = g - exp(y) sum(g) */
__global__ void softmax_backward_k(float *dx, const float *g, const float *y, int64_t outer, int64_t D, int64_t inner,
                                   bool log_, float beta) {
    ROW_LOOP(l, outer * inner) {
        int64_t base = (l / inner) * D * inner + l % inner;
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            int64_t o = base + j * inner;
            s += log_ ? g[o] : g[o] * y[o];
        }
        s = block_sum(s);
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            int64_t o = base + j * inner;
            float v = log_ ? g[o] - expf(y[o]) * s : y[o] * (g[o] - s);
            dx[o] = beta == 0.0f ? v : dx[o] + v;
        }
    }
}

extern "C" accel_status accel__cudak_softmax_backward(accel_k_softmax_backward *k) {
    int index = k->dx->device.index;
    int64_t lines = k->outer * k->inner;
    if (!lines || !k->D) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    softmax_backward_k<<<row_blocks(lines), KTHREADS, 0, s>>>((float *)k->dx->data, (const float *)k->g->data,
                                                             (const float *)k->y->data, k->outer, k->D, k->inner,
                                                             k->log, k->beta);
    return launched(index, "softmax_backward");
}

/* ---- cross-entropy */

/* Loss scratch in step memory: the f64 total, the counted rows and the first
 * row whose target is out of range (INT64_MAX when none). */
typedef struct loss_scratch {
    double total;
    unsigned long long count;
    long long bad_row;
} loss_scratch;

__global__ void scratch_init_k(loss_scratch *sc) {
    sc->total = 0.0;
    sc->count = 0;
    sc->bad_row = INT64_MAX;
}

__global__ void ce_rows_k(const float *x, const int64_t *t, float *lse, loss_scratch *sc, int64_t N, int64_t C,
                          int64_t ignore) {
    ROW_LOOP(i, N) {
        int64_t ti = t[i];
        if (ti == ignore) continue;
        if (ti < 0 || ti >= C) {
            if (threadIdx.x == 0) atomicMin(&sc->bad_row, (long long)i);
            continue;
        }
        const float *xr = x + i * C;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, xr[j]);
        m = block_max(m);
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(xr[j] - m);
        s = block_sum(s);
        if (threadIdx.x == 0) {
            float l = m + logf(s);
            lse[i] = l;
            atomicAdd(&sc->total, (double)l - xr[ti]);
            atomicAdd(&sc->count, 1ull);
        }
    }
}

__global__ void ce_finish_k(float *out, int64_t *count, const loss_scratch *sc) {
    *count = (int64_t)sc->count;
    *out = sc->count ? (float)(sc->total / (double)sc->count) : NAN; /* all ignored: 0/0, as PyTorch */
}

/* A bad target is an error naming it at the device's next synchronisation
 * (checks.cu: no host wait here); the rows with bad targets are skipped. */
static accel_status check_targets(int index, cudaStream_t s, const loss_scratch *sc, const int64_t *targets,
                                  int64_t C, accel__cuda_check_op op) {
    return accel__cuda_check_report(index, s, op, &sc->bad_row, targets, C);
}

extern "C" accel_status accel__cudak_cross_entropy(accel_k_cross_entropy *k) {
    int index = k->out->device.index;
    cudaStream_t s = accel__cuda_enter(index);
    loss_scratch *sc = (loss_scratch *)accel__cuda_step_alloc(index, sizeof *sc, 256);
    if (!sc) return accel_last_status();
    scratch_init_k<<<1, 1, 0, s>>>(sc);
    if (k->N)
        ce_rows_k<<<row_blocks(k->N), KTHREADS, 0, s>>>((const float *)k->x->data, (const int64_t *)k->targets->data,
                                                       (float *)k->lse->data, sc, k->N, k->C, k->ignore);
    ce_finish_k<<<1, 1, 0, s>>>((float *)k->out->data, (int64_t *)k->count->data, sc);
    if (launched(index, "cross_entropy") != ACCEL_OK) return accel_last_status();
    return check_targets(index, s, sc, (const int64_t *)k->targets->data, k->C, ACCEL_CUDA_CHECK_CROSS_ENTROPY);
}

__global__ void ce_backward_k(float *dx, const float *g, const float *x, const float *lse, const int64_t *t,
                              const int64_t *count, int64_t N, int64_t C, int64_t ignore, float beta) {
    float scale = (float)((double)*g / (double)*count);
    ROW_LOOP(i, N) {
        float *d = dx + i * C;
        const float *xr = x + i * C;
        int64_t ti = t[i];
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
            float v = ti == ignore ? 0.0f : (expf(xr[j] - lse[i]) - (j == ti ? 1.0f : 0.0f)) * scale;
            d[j] = beta == 0.0f ? v : d[j] + v;
        }
    }
}

extern "C" accel_status accel__cudak_cross_entropy_backward(accel_k_cross_entropy_backward *k) {
    int index = k->dx->device.index;
    if (!k->N || !k->C) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    ce_backward_k<<<row_blocks(k->N), KTHREADS, 0, s>>>((float *)k->dx->data, (const float *)k->g->data,
                                                       (const float *)k->x->data, (const float *)k->lse->data,
                                                       (const int64_t *)k->targets->data,
                                                       (const int64_t *)k->count->data, k->N, k->C, k->ignore, k->beta);
    return launched(index, "cross_entropy_backward");
}

/* ---- cross-entropy with its gradient in one pass (cross_entropy_fused):
 * the counted rows first (dx is scaled by 1 / count), then one block per row
 * computes the loss and writes dx. x and dx in their own float dtypes; g
 * (NULL: 1, a product that changes no value) one more f32 product before
 * dx's rounding. */

__global__ void ce_count_k(const int64_t *t, loss_scratch *sc, int64_t N, int64_t C, int64_t ignore) {
    unsigned long long counted = 0;
    GRID_STRIDE(i, N) {
        int64_t ti = t[i];
        if (ti == ignore) continue;
        if (ti < 0 || ti >= C) atomicMin(&sc->bad_row, (long long)i);
        else counted++;
    }
    if (counted) atomicAdd(&sc->count, counted);
}

__global__ void ce_fused_rows_k(void *dx, accel_dtype ddt, const void *x, accel_dtype xdt, const int64_t *t,
                                const float *g, loss_scratch *sc, int64_t N, int64_t C, int64_t ignore) {
    float inv_count = sc->count ? (float)(1.0 / (double)sc->count) : 0.0f, gv = g ? *g : 1.0f;
    ROW_LOOP(i, N) {
        int64_t ti = t[i], base = i * C;
        if (ti == ignore) { /* 0 * gv: -0 for a negative g, nan for a nan one */
            for (int64_t j = threadIdx.x; j < C; j += blockDim.x) accel__elem_set(dx, ddt, base + j, 0.0f * gv);
            continue;
        }
        if (ti < 0 || ti >= C) continue; /* reported by ce_count_k */
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, load_f(x, xdt, base + j));
        m = block_max(m);
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(load_f(x, xdt, base + j) - m);
        s = block_sum(s);
        float scale = inv_count / s;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
            float v = expf(load_f(x, xdt, base + j) - m) * scale;
            accel__elem_set(dx, ddt, base + j, (j == ti ? v - inv_count : v) * gv);
        }
        if (threadIdx.x == 0) atomicAdd(&sc->total, (double)(m + logf(s)) - load_f(x, xdt, base + ti));
    }
}

extern "C" accel_status accel__cudak_cross_entropy_fused(accel_k_cross_entropy_fused *k) {
    int index = k->out->device.index;
    cudaStream_t s = accel__cuda_enter(index);
    loss_scratch *sc = (loss_scratch *)accel__cuda_step_alloc(index, sizeof *sc, 256);
    if (!sc) return accel_last_status();
    const int64_t *t = (const int64_t *)k->targets->data;
    scratch_init_k<<<1, 1, 0, s>>>(sc);
    if (k->N) {
        ce_count_k<<<blocks_for(k->N), KTHREADS, 0, s>>>(t, sc, k->N, k->C, k->ignore);
        if (k->C)
            ce_fused_rows_k<<<row_blocks(k->N), KTHREADS, 0, s>>>(
                k->dx->data, k->dx->dtype, k->x->data, k->x->dtype, t, k->g ? (const float *)k->g->data : NULL, sc,
                k->N, k->C, k->ignore);
    }
    ce_finish_k<<<1, 1, 0, s>>>((float *)k->out->data, (int64_t *)k->count->data, sc);
    if (launched(index, "cross_entropy_fused") != ACCEL_OK) return accel_last_status();
    return check_targets(index, s, sc, t, k->C, ACCEL_CUDA_CHECK_CROSS_ENTROPY_FUSED);
}

/* ---- MSE */

__global__ void mse_k(const float *p, const float *t, int64_t n, loss_scratch *sc) {
    float acc = 0.0f;
    GRID_STRIDE(i, n) {
        float d = p[i] - t[i];
        acc += d * d;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) atomicAdd(&sc->total, (double)acc);
}

__global__ void mse_finish_k(float *out, const loss_scratch *sc, int64_t n) {
    *out = n ? (float)(sc->total / (double)n) : NAN;
}

extern "C" accel_status accel__cudak_mse(accel_k_mse *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->pred);
    cudaStream_t s = accel__cuda_enter(index);
    loss_scratch *sc = (loss_scratch *)accel__cuda_step_alloc(index, sizeof *sc, 256);
    if (!sc) return accel_last_status();
    scratch_init_k<<<1, 1, 0, s>>>(sc);
    if (n) mse_k<<<blocks_for(n), KTHREADS, 0, s>>>((const float *)k->pred->data, (const float *)k->target->data, n, sc);
    mse_finish_k<<<1, 1, 0, s>>>((float *)k->out->data, sc, n);
    return launched(index, "mse");
}

__global__ void mse_backward_k(float *d, const float *g, const float *p, const float *t, int64_t n, float sign,
                               float beta) {
    float s = sign * (float)(2.0 * (double)*g / (double)n);
    GRID_STRIDE(i, n) {
        float v = s * (p[i] - t[i]);
        d[i] = beta == 0.0f ? v : d[i] + v;
    }
}

extern "C" accel_status accel__cudak_mse_backward(accel_k_mse_backward *k) {
    int index = k->d->device.index;
    int64_t n = accel_numel(k->pred);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    mse_backward_k<<<blocks_for(n), KTHREADS, 0, s>>>((float *)k->d->data, (const float *)k->g->data,
                                                      (const float *)k->pred->data, (const float *)k->target->data, n,
                                                      k->sign, k->beta);
    return launched(index, "mse_backward");
}
