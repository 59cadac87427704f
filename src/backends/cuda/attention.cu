/* Scaled dot-product attention with grouped-query heads and a bottom-right
 * aligned causal mask, forward and backward, computed in f32 (the CPU's
 * src/backends/cpu/attention_kernels.c computes the same). q, k, v, the
 * output, dO and dq, dk, dv are each f32, bf16 or f16: tiles are widened to
 * f32 as they are staged in shared memory and results rounded as they are
 * stored, so the op needs no f32 copies of bf16 tensors.
 *
 * Forward, flash-style: one block per (batch*head, tile of BQ queries) keeps
 * its Q tile in shared memory, walks the key tiles the causal mask lets it
 * see (K and V tiles staged in shared memory), and keeps the softmax online
 * (running max and sum per row, O rescaled in shared memory), all in f32. The
 * table also asks for the probabilities P (the backward reads them): each
 * raw score is stored as it is computed and normalised in one pass at the
 * end. P's columns are written as the CPU writes them (a row gets the
 * columns its CPU query block of 64 sees, zeros past its own last key), so
 * the two backends' P are the same tensor.
 *
 * Backward from P: a query-tile pass computes delta_i = sum_j P_ij dP_ij
 * (dP = dO V^T) and dQ = scale * P o (dP - delta) K; a key-tile pass, one
 * block per (batch*kv head, tile of BK keys), walks the G query heads of its
 * kv head and every query that sees its keys, and accumulates dV = P^T dO
 * and dK = scale * dS^T Q in shared memory before adding them to dk and dv
 * (no atomics: a key belongs to one block).
 *
 * Thread layout: 256 threads, TPR = 8 per row of a tile (a row's threads are
 * one aligned group of a warp, so row reductions are three shuffles). Not
 * tuned: CUDA cores, no tensor cores. */
#include "cuda_common.cuh"

enum { BQ = 32, BK = 32, ATT_THREADS = 256, TPR = ATT_THREADS / BQ, CPU_QB = 64 };

/* Last key query i may see (inclusive); -1 when none. */
__device__ inline int64_t last_key(const accel_k_sdpa_dims &d, int64_t i) {
    if (!d.causal) return d.Tk - 1;
    int64_t l = i + d.Tk - d.Tq;
    return l < -1 ? -1 : l < d.Tk - 1 ? l : d.Tk - 1;
}

/* P's columns [0, n) written for row i: those its CPU block of 64 queries sees. */
__device__ inline int64_t written_keys(const accel_k_sdpa_dims &d, int64_t i) {
    int64_t i0 = i / CPU_QB * CPU_QB, last = (i0 + CPU_QB < d.Tq ? i0 + CPU_QB : d.Tq) - 1;
    return last_key(d, last) + 1;
}

/* Max and sum over the TPR threads of a row (an aligned group of a warp). */
__device__ inline float row_max(float v) {
    for (int o = TPR / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ inline float row_sum(float v) {
    for (int o = TPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A tensor's elements as the kernels see them: data and dtype (f32, bf16 or
 * f16); p NULL for a gradient that is not wanted. */
typedef struct elems {
    void *p;
    accel_dtype dt;
} elems;

static elems elems_of(const accel_tensor *t) { return t ? elems{t->data, t->dtype} : elems{NULL, ACCEL_F32}; }

__device__ inline float load(elems e, int64_t i) { return load_f(e.p, e.dt, i); }

__device__ inline void store(elems e, int64_t i, float v) {
    if (e.dt == ACCEL_F32) ((float *)e.p)[i] = v;
    else accel__elem_set(e.p, e.dt, i, v);
}

/* rows x cols of a matrix (element off of src, row stride `stride`) into
 * shared memory with row stride `ld`, as f32. */
__device__ inline void stage(float *dst, int64_t ld, elems src, int64_t off, int64_t stride, int rows, int64_t cols) {
    for (int64_t e = threadIdx.x; e < rows * cols; e += ATT_THREADS) {
        int64_t r = e / cols, c = e % cols;
        dst[r * ld + c] = load(src, off + r * stride + c);
    }
}

/* ---- forward */

/* Shared memory: Q [BQ][D], K [BK][D+1], V [BK][Dv], S [BQ][BK+1], O [BQ][Dv]. */
static size_t fwd_smem(const accel_k_sdpa_dims *d) {
    return sizeof(float) * (size_t)(BQ * d->D + BK * (d->D + 1) + BK * d->Dv + BQ * (BK + 1) + BQ * d->Dv);
}

__global__ void __launch_bounds__(ATT_THREADS)
    sdpa_fwd_k(elems o, float *p, elems q, elems k, elems v, accel_k_sdpa_dims d) {
    extern __shared__ float sm[];
    const int64_t D = d.D, Dv = d.Dv;
    float *sq = sm, *sk = sq + BQ * D, *sv = sk + BK * (D + 1), *ss = sv + BK * Dv, *so = ss + BQ * (BK + 1);
    const int64_t bh = blockIdx.x, b = bh / d.H, hk = bh % d.H / (d.H / d.Hkv), i0 = (int64_t)blockIdx.y * BQ;
    const int nq = (int)(d.Tq - i0 < BQ ? d.Tq - i0 : BQ);
    const int64_t kh = b * d.ks[0] + hk * d.ks[1], vh = b * d.vs[0] + hk * d.vs[1];
    const int r = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int64_t i = i0 + r, L = r < nq ? last_key(d, i) : -1;
    float *prow = p + (bh * d.Tq + i) * d.Tk;
    stage(sq, D, q, (bh * d.Tq + i0) * D, D, nq, D);
    for (int64_t e = threadIdx.x; e < BQ * Dv; e += ATT_THREADS) so[e] = 0.0f;
    __syncthreads(); /* O is read below even when no key tile runs */
    float m = -INFINITY, l = 0.0f;
    const int64_t kend = last_key(d, i0 + nq - 1) + 1; /* the keys the tile's last query sees */
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        const int nk = (int)(kend - j0 < BK ? kend - j0 : BK);
        __syncthreads(); /* the previous tile's K, V and S are no longer read */
        stage(sk, D + 1, k, kh + j0 * d.ks[2], d.ks[2], nk, D);
        stage(sv, Dv, v, vh + j0 * d.vs[2], d.vs[2], nk, Dv);
        __syncthreads();
        float sc[BK / TPR], tmax = -INFINITY;
        for (int t = 0; t < BK / TPR; t++) {
            const int c = sub + TPR * t;
            float s = -INFINITY;
            if (c < nk && j0 + c <= L) {
                const float *qr = sq + r * D, *kc = sk + c * (D + 1);
                float acc = 0.0f;
                for (int64_t x = 0; x < D; x++) acc += qr[x] * kc[x];
                s = acc * d.scale;
                prow[j0 + c] = s; /* raw score, normalised below by this same thread */
            }
            sc[t] = s;
            tmax = fmaxf(tmax, s);
        }
        const float mnew = fmaxf(m, row_max(tmax));
        const float corr = mnew == -INFINITY ? 1.0f : expf(m - mnew);
        float lsum = 0.0f;
        for (int t = 0; t < BK / TPR; t++) {
            float e = sc[t] == -INFINITY ? 0.0f : expf(sc[t] - mnew);
            ss[r * (BK + 1) + sub + TPR * t] = e;
            lsum += e;
        }
        l = l * corr + row_sum(lsum);
        m = mnew;
        __syncwarp(); /* the row's S entries come from its own TPR threads, in this warp */
        for (int64_t e = sub; e < Dv; e += TPR) {
            float acc = so[r * Dv + e] * corr;
            for (int c = 0; c < nk; c++) acc += ss[r * (BK + 1) + c] * sv[c * Dv + e];
            so[r * Dv + e] = acc;
        }
    }
    if (r >= nq) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f; /* a row that sees no key: O and P are 0 */
    for (int64_t e = sub; e < Dv; e += TPR) store(o, (bh * d.Tq + i) * Dv + e, so[r * Dv + e] * inv);
    const int64_t wk = written_keys(d, i);
    for (int64_t j = sub; j < wk; j += TPR) prow[j] = j <= L ? expf(prow[j] - m) * inv : 0.0f;
}

/* ---- backward */

/* Shared memory of the query pass: dO [BQ][Dv], V [BK][Dv+1], K [BK][D],
 * S [BQ][BK+1], dQ [BQ][D]. */
static size_t bwd_q_smem(const accel_k_sdpa_dims *d) {
    return sizeof(float) * (size_t)(BQ * d->Dv + BK * (d->Dv + 1) + BK * d->D + BQ * (BK + 1) + BQ * d->D);
}

/* P[i, j] for j <= L (P past a row's last key is not read). */
__device__ inline float p_at(const float *prow, int64_t j, int64_t L) { return j <= L ? prow[j] : 0.0f; }

/* delta [B*H*Tq] and, when dq is given, dq (dq_beta 0 overwrites, 1 adds).
 * q, k, v contiguous. */
__global__ void __launch_bounds__(ATT_THREADS)
    sdpa_bwd_q_k(elems dq, float *delta, elems go, elems k, elems v, const float *p, accel_k_sdpa_dims d,
                 float dq_beta) {
    extern __shared__ float sm[];
    const int64_t D = d.D, Dv = d.Dv;
    float *sg = sm, *sv = sg + BQ * Dv, *sk = sv + BK * (Dv + 1), *ss = sk + BK * D, *sdq = ss + BQ * (BK + 1);
    const int64_t bh = blockIdx.x, b = bh / d.H, kvb = b * d.Hkv + bh % d.H / (d.H / d.Hkv);
    const int64_t i0 = (int64_t)blockIdx.y * BQ;
    const int nq = (int)(d.Tq - i0 < BQ ? d.Tq - i0 : BQ);
    const int64_t kh = kvb * d.Tk * D, vh = kvb * d.Tk * Dv;
    const int r = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int64_t i = i0 + r, L = r < nq ? last_key(d, i) : -1;
    const float *prow = p + (bh * d.Tq + i) * d.Tk;
    stage(sg, Dv, go, (bh * d.Tq + i0) * Dv, Dv, nq, Dv);
    for (int64_t e = threadIdx.x; e < BQ * D; e += ATT_THREADS) sdq[e] = 0.0f;
    __syncthreads(); /* dQ is read below even when no key tile runs */
    const int64_t kend = last_key(d, i0 + nq - 1) + 1;
    /* Pass 1: delta_i = sum_j P_ij (dO_i . V_j). Pass 2: dQ_i = scale sum_j P_ij (dP_ij - delta_i) K_j. */
    float dl = 0.0f;
    for (int pass = 0; pass < (dq.p ? 2 : 1); pass++) {
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            const int nk = (int)(kend - j0 < BK ? kend - j0 : BK);
            __syncthreads();
            stage(sv, Dv + 1, v, vh + j0 * Dv, Dv, nk, Dv);
            if (pass) stage(sk, D, k, kh + j0 * D, D, nk, D);
            __syncthreads();
            float part = 0.0f;
            for (int t = 0; t < BK / TPR; t++) {
                const int c = sub + TPR * t;
                float ds = 0.0f;
                if (c < nk && j0 + c <= L) {
                    const float *gr = sg + r * Dv, *vc = sv + c * (Dv + 1);
                    float dp = 0.0f;
                    for (int64_t x = 0; x < Dv; x++) dp += gr[x] * vc[x];
                    const float pij = p_at(prow, j0 + c, L);
                    part += pij * dp;
                    ds = pij * (dp - dl);
                }
                ss[r * (BK + 1) + c] = ds;
            }
            if (!pass) {
                dl += row_sum(part);
                continue;
            }
            __syncwarp();
            for (int64_t e = sub; e < D; e += TPR) {
                float acc = sdq[r * D + e];
                for (int c = 0; c < nk; c++) acc += ss[r * (BK + 1) + c] * sk[c * D + e];
                sdq[r * D + e] = acc;
            }
        }
    }
    if (r >= nq) return;
    if (sub == 0) delta[bh * d.Tq + i] = dl;
    if (!dq.p) return;
    const int64_t dqr = (bh * d.Tq + i) * D;
    for (int64_t e = sub; e < D; e += TPR) {
        float val = d.scale * sdq[r * D + e];
        store(dq, dqr + e, dq_beta == 0.0f ? val : load(dq, dqr + e) + val);
    }
}

/* Shared memory of the key pass: V [BK][Dv+1], Q [BQ][D], dO [BQ][Dv+1],
 * P and dS [BQ][BK+1] each, dK [BK][D], dV [BK][Dv]. */
static size_t bwd_kv_smem(const accel_k_sdpa_dims *d) {
    return sizeof(float) *
           (size_t)(BK * (d->Dv + 1) + BQ * d->D + BQ * (d->Dv + 1) + 2 * BQ * (BK + 1) + BK * d->D + BK * d->Dv);
}

/* dk, dv (each optional; added into) of the kv head b*Hkv + kv of blockIdx.x
 * for its tile of keys. Thread layout: key c = threadIdx.x / TPR of the tile. */
__global__ void __launch_bounds__(ATT_THREADS)
    sdpa_bwd_kv_k(elems dk, elems dv, const float *delta, elems go, elems q, elems v, const float *p,
                  accel_k_sdpa_dims d) {
    extern __shared__ float sm[];
    const int64_t D = d.D, Dv = d.Dv, G = d.H / d.Hkv;
    float *sv = sm, *sq = sv + BK * (Dv + 1), *sg = sq + BQ * D, *sp = sg + BQ * (Dv + 1), *sds = sp + BQ * (BK + 1);
    float *sdk = sds + BQ * (BK + 1), *sdv = sdk + BK * D;
    const int64_t kvb = blockIdx.x, b = kvb / d.Hkv, kv = kvb % d.Hkv, j0 = (int64_t)blockIdx.y * BK;
    const int nk = (int)(d.Tk - j0 < BK ? d.Tk - j0 : BK);
    const int c = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    stage(sv, Dv + 1, v, (kvb * d.Tk + j0) * Dv, Dv, nk, Dv);
    for (int64_t e = threadIdx.x; e < BK * D; e += ATT_THREADS) sdk[e] = 0.0f;
    for (int64_t e = threadIdx.x; e < BK * Dv; e += ATT_THREADS) sdv[e] = 0.0f;
    __syncthreads();
    /* The first query that sees key j0: last_key(i) >= j0. */
    int64_t first = d.causal ? j0 - (d.Tk - d.Tq) : 0;
    if (first < 0) first = 0;
    for (int64_t gi = 0; gi < G; gi++) {
        const int64_t bh = b * d.H + kv * G + gi;
        for (int64_t i0 = first; i0 < d.Tq; i0 += BQ) {
            const int nq = (int)(d.Tq - i0 < BQ ? d.Tq - i0 : BQ);
            __syncthreads(); /* the previous tile's Q, dO, P and dS are no longer read */
            stage(sq, D, q, (bh * d.Tq + i0) * D, D, nq, D);
            stage(sg, Dv + 1, go, (bh * d.Tq + i0) * Dv, Dv, nq, Dv);
            __syncthreads();
            /* P and dS of (query r, key c) for r = sub + TPR t. */
            for (int t = 0; t < BQ / TPR; t++) {
                const int rr = sub + TPR * t;
                const int64_t i = i0 + rr, j = j0 + c;
                float pij = 0.0f, ds = 0.0f;
                if (rr < nq && c < nk) {
                    const int64_t L = last_key(d, i);
                    pij = p_at(p + (bh * d.Tq + i) * d.Tk, j, L);
                    if (dk.p && j <= L) {
                        const float *gr = sg + rr * (Dv + 1), *vc = sv + c * (Dv + 1);
                        float dp = 0.0f;
                        for (int64_t x = 0; x < Dv; x++) dp += gr[x] * vc[x];
                        ds = pij * (dp - delta[bh * d.Tq + i]);
                    }
                }
                sp[rr * (BK + 1) + c] = pij;
                sds[rr * (BK + 1) + c] = ds;
            }
            __syncwarp(); /* column c's entries come from its own TPR threads, in this warp */
            for (int64_t e = sub; dv.p && e < Dv; e += TPR) {
                float acc = sdv[c * Dv + e];
                for (int rr = 0; rr < nq; rr++) acc += sp[rr * (BK + 1) + c] * sg[rr * (Dv + 1) + e];
                sdv[c * Dv + e] = acc;
            }
            for (int64_t e = sub; dk.p && e < D; e += TPR) {
                float acc = sdk[c * D + e];
                for (int rr = 0; rr < nq; rr++) acc += sds[rr * (BK + 1) + c] * sq[rr * D + e];
                sdk[c * D + e] = acc;
            }
        }
    }
    if (c >= nk) return;
    const int64_t j = j0 + c;
    const int64_t kr = (kvb * d.Tk + j) * D, vr = (kvb * d.Tk + j) * Dv;
    for (int64_t e = sub; dk.p && e < D; e += TPR) store(dk, kr + e, load(dk, kr + e) + d.scale * sdk[c * D + e]);
    for (int64_t e = sub; dv.p && e < Dv; e += TPR) store(dv, vr + e, load(dv, vr + e) + sdv[c * Dv + e]);
}

/* ---- launches */

/* Lets `fn` use `bytes` of dynamic shared memory (beyond the default 48 KiB
 * when the GPU allows it); an error naming the head dims when it does not. */
static accel_status shared_memory(int index, const void *fn, size_t bytes, const accel_k_sdpa_dims *d,
                                  const char *op) {
    int optin = 0;
    accel_status st = accel__cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, index),
                                        index, op);
    if (st != ACCEL_OK) return st;
    if (bytes > (size_t)optin)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "cuda:%d: %s: head dims D=%lld Dv=%lld need %zu bytes of shared memory per block, "
                               "the GPU allows %d",
                               index, op, (long long)d->D, (long long)d->Dv, bytes, optin);
    return accel__cuda_check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), index,
                             op);
}

static unsigned tiles(int64_t n, int64_t per) { return (unsigned)((n + per - 1) / per); }

extern "C" accel_status accel__cudak_sdpa(accel_k_sdpa *k) {
    int index = k->o->device.index;
    const accel_k_sdpa_dims *d = &k->dims;
    if (!d->B || !d->H || !d->Tq || !d->Dv) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    size_t bytes = fwd_smem(d);
    accel_status st = shared_memory(index, (const void *)sdpa_fwd_k, bytes, d, "sdpa");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->H), tiles(d->Tq, BQ));
    sdpa_fwd_k<<<grid, ATT_THREADS, bytes, s>>>(elems_of(k->o), (float *)k->p->data, elems_of(k->q), elems_of(k->k),
                                                elems_of(k->v), *d);
    return launched(index, "sdpa");
}

extern "C" accel_status accel__cudak_sdpa_backward(accel_k_sdpa_backward *k) {
    int index = k->g->device.index;
    const accel_k_sdpa_dims *d = &k->dims;
    if (!d->B || !d->H || !d->Tq) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    elems dq = elems_of(k->dq), dk = elems_of(k->dk), dv = elems_of(k->dv);
    elems go = elems_of(k->g), q = elems_of(k->q), kk = elems_of(k->k), v = elems_of(k->v);
    const float *p = (const float *)k->p->data;
    float *delta = NULL;
    if (dq.p || dk.p) {
        delta = (float *)accel__cuda_step_alloc(index, (size_t)(d->B * d->H * d->Tq) * sizeof(float), 256);
        if (!delta) return accel_last_status();
        size_t bytes = bwd_q_smem(d);
        accel_status st = shared_memory(index, (const void *)sdpa_bwd_q_k, bytes, d, "sdpa_backward");
        if (st != ACCEL_OK) return st;
        dim3 grid((unsigned)(d->B * d->H), tiles(d->Tq, BQ));
        sdpa_bwd_q_k<<<grid, ATT_THREADS, bytes, s>>>(dq, delta, go, kk, v, p, *d, k->dq_beta);
        if ((st = launched(index, "sdpa_backward")) != ACCEL_OK) return st;
    }
    if ((!dk.p && !dv.p) || !d->Tk) return ACCEL_OK; /* no key: dK and dV have no rows (dQ was zeroed) */
    size_t bytes = bwd_kv_smem(d);
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_kv_k, bytes, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->Hkv), tiles(d->Tk, BK));
    sdpa_bwd_kv_k<<<grid, ATT_THREADS, bytes, s>>>(dk, dv, delta, go, q, v, p, *d);
    return launched(index, "sdpa_backward");
}
