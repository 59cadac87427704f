/* Optimizer updates (SGD, Adam/AdamW with PyTorch's rules, as the CPU
 * kernels of src/backends/cpu/optim_kernels.c compute them, operation for
 * operation in f32), the partial gradient norm of gradient clipping and
 * GradScaler's unscale with its inf/nan check. One thread per element. */
#include "cuda_common.cuh"

/* ---- SGD */

__global__ void sgd_k(float *p, const float *g, float *buf, int64_t n, float lr, float wd, float mom, float damp,
                      bool first, bool nesterov) {
    GRID_STRIDE(i, n) {
        /* fused multiply-adds, as torch's adds with alpha (the CPU kernel says why) */
        float d = g[i];
        if (wd != 0.0f) d = __fmaf_rn(wd, p[i], d);
        if (buf) {
            float b = first ? d : __fmaf_rn(damp, d, __fmul_rn(buf[i], mom));
            buf[i] = b;
            d = nesterov ? __fmaf_rn(mom, b, d) : b;
        }
        p[i] = __fmaf_rn(-lr, d, p[i]);
    }
}

extern "C" accel_status accel__cudak_sgd(accel_k_sgd *k) {
    int index = k->p->device.index;
    int64_t n = accel_numel(k->p);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    sgd_k<<<blocks_for(n), KTHREADS, 0, s>>>((float *)k->p->data, (const float *)k->g->data,
                                             k->buf ? (float *)k->buf->data : NULL, n, k->lr, k->weight_decay,
                                             k->momentum, k->undamped, k->first, k->nesterov);
    return launched(index, "sgd");
}

/* ---- Adam / AdamW: the step's constants are computed on the host in double
 * and rounded to f32, as the CPU kernel does. */

typedef struct adam_consts {
    float step_size, bc2_sqrt, w1, b2, w2, eps, decay, l2;
} adam_consts;

/* cast (NULL: none): the new p rounded to cast_dt, stored as cast_store
 * (cast_dt, or f32 widened back), kernels.h's accel_k_adam, by the scalar
 * conversions the CPU's match bit for bit. */
__global__ void adam_k(float *p, const float *g, float *m, float *v, int64_t n, adam_consts c, void *cast,
                       accel_dtype cast_store, accel_dtype cast_dt) {
    GRID_STRIDE(i, n) {
        float pi = p[i];
        float gi = c.l2 != 0.0f ? __fmaf_rn(c.l2, pi, g[i]) : g[i]; /* fused, as torch's add with alpha */
        pi *= c.decay;
        /* lerp(m, g, 1 - beta1) as PyTorch computes it (the CPU kernel says why) */
        float mi = c.w1 < 0.5f ? m[i] + c.w1 * (gi - m[i]) : gi + (c.w1 - 1.0f) * (gi - m[i]);
        float vi = v[i] * c.b2 + c.w2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
        float pn = pi + -c.step_size * mi / denom; /* addcdiv_: (value * m) / denom, as torch */
        p[i] = pn;
        if (cast) accel__elem_set(cast, cast_store, i, cast_store == ACCEL_F32 ? accel__round_to(pn, cast_dt) : pn);
    }
}

extern "C" accel_status accel__cudak_adam(accel_k_adam *k) {
    if (k->cast && k->cast_dt != ACCEL_BF16 && k->cast_dt != ACCEL_F16)
        return accel_set_error(ACCEL_ERR_DTYPE, "adam: the weight's copy is rounded to bfloat16 or float16, not %s",
                               accel_dtype_name(k->cast_dt));
    int index = k->p->device.index;
    int64_t n = accel_numel(k->p);
    if (!n) return ACCEL_OK;
    const double t = (double)k->step;
    const double bc1 = 1.0 - pow(k->beta1, t), bc2 = 1.0 - pow(k->beta2, t);
    adam_consts c;
    c.step_size = (float)(k->lr / bc1);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.w1 = (float)(1.0 - k->beta1);
    c.b2 = (float)k->beta2;
    c.w2 = (float)(1.0 - k->beta2);
    c.eps = (float)k->eps;
    /* AdamW decays the parameter (p *= 1 - lr*wd), Adam adds wd*p to the gradient (L2). */
    c.decay = k->decoupled ? (float)(1.0 - k->lr * k->weight_decay) : 1.0f;
    c.l2 = k->decoupled ? 0.0f : (float)k->weight_decay;
    cudaStream_t s = accel__cuda_enter(index);
    adam_k<<<blocks_for(n), KTHREADS, 0, s>>>((float *)k->p->data, (const float *)k->g->data, (float *)k->m->data,
                                              (float *)k->v->data, n, c, k->cast ? k->cast->data : NULL,
                                              k->cast ? k->cast->dtype : ACCEL_F32, k->cast_dt);
    return launched(index, "adam");
}

/* ---- gradient-norm partials: per-thread f64 sums, one atomic per warp into
 * out (zeroed first). The max of |g| (norm_type inf) is an integer atomicMax
 * on the f64 bits, which order as integers for values >= 0; a NaN is kept
 * (its bits, sign cleared by fabs, are above inf's), as the CPU keeps it: the
 * inf-norm of a NaN gradient is NaN, as torch's. */

enum norm_kind { NORM_L2, NORM_L1, NORM_P, NORM_INF };

__device__ inline double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* max(v, x) that keeps a NaN of either (fmax drops it) */
__device__ inline double max_nan(double v, double x) { return x > v || x != x ? x : v; }

__device__ inline double warp_max_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__global__ void norm_partial_k(double *out, const float *g, int64_t n, norm_kind kind, double p) {
    double acc = 0.0;
    GRID_STRIDE(i, n) {
        double a = fabs((double)g[i]);
        switch (kind) {
        /* each term rounded to f32, as the CPU kernel (kernels.h's accel_k_norm_partial) */
        case NORM_L2: acc += __fmul_rn(g[i], g[i]); break;
        case NORM_L1: acc += a; break;
        case NORM_P: acc += (float)pow(a, p); break;
        case NORM_INF: acc = max_nan(acc, a); break;
        }
    }
    if (kind == NORM_INF) {
        acc = warp_max_d(acc);
        if ((threadIdx.x & 31) == 0)
            atomicMax((unsigned long long *)out, (unsigned long long)__double_as_longlong(acc));
    } else {
        acc = warp_sum_d(acc);
        if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
    }
}

extern "C" accel_status accel__cudak_norm_partial(accel_k_norm_partial *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->g);
    cudaStream_t s = accel__cuda_enter(index);
    accel_status st = accel__cuda_check(cudaMemsetAsync(k->out->data, 0, sizeof(double), s), index, "norm_partial");
    if (st != ACCEL_OK || !n) return st;
    double p = k->norm_type;
    norm_kind kind = isinf(p) ? NORM_INF : p == 2.0 ? NORM_L2 : p == 1.0 ? NORM_L1 : NORM_P;
    norm_partial_k<<<blocks_for(n), KTHREADS, 0, s>>>((double *)k->out->data, (const float *)k->g->data, n, kind, p);
    return launched(index, "norm_partial");
}

/* ---- GradScaler's unscale_: found is set by any thread that sees an inf or
 * nan (every writer stores the same 1), never cleared: the caller clears it
 * once for the many gradients it checks. */

__global__ void unscale_k(float *g, float *found, int64_t n, float inv) {
    bool bad = false;
    GRID_STRIDE(i, n) {
        float v = g[i] * inv;
        g[i] = v;
        bad |= !isfinite(v);
    }
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *found = 1.0f;
}

extern "C" accel_status accel__cudak_unscale(accel_k_unscale *k) {
    int index = k->g->device.index;
    int64_t n = accel_numel(k->g);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    unscale_k<<<blocks_for(n), KTHREADS, 0, s>>>((float *)k->g->data, (float *)k->found->data, n, k->inv);
    return launched(index, "unscale");
}
