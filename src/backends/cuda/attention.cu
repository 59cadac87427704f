/* Scaled dot-product attention with grouped-query heads and a bottom-right
 * aligned causal mask, forward and backward, f32 softmax and accumulation
 * (the CPU's src/backends/cpu/attention_kernels.c computes the same). q, k,
 * v, the output, dO and dq, dk, dv are each f32, bf16 or f16: tiles are
 * staged in shared memory and results rounded as they are stored, so the op
 * needs no f32 copies of bf16 tensors.
 *
 * Two kernel families compute the same thing:
 * - tensor cores (bf16/f16): when q, k, v (and dO) share one 16-bit dtype and
 *   both head dims are multiples of 16, the products Q K^T, P V, dO V^T,
 *   dS K, P^T dO and dS^T Q run on nvcuda::wmma 16x16x16 fragments with f32
 *   accumulators (tiles of 64 queries x 64 keys, 8 warps); the softmax and
 *   every sum stay in f32, P and dS are rounded to the 16-bit dtype for the
 *   products (as FlashAttention does);
 * - CUDA cores (everything else: f32, mixed dtypes, odd head dims, head dims
 *   whose tensor-core tiles do not fit the GPU's shared memory): the same
 *   algorithm in f32 on tiles of 32.
 *
 * Forward, flash-style: one block per (batch*head, tile of queries) keeps
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
 * block per (batch*kv head, tile of keys), walks the G query heads of its
 * kv head and every query that sees its keys, and accumulates dV = P^T dO
 * and dK = scale * dS^T Q in shared memory before adding them to dk and dv
 * (no atomics: a key belongs to one block). Each pass picks its family on
 * its own; both read and write delta alike.
 *
 * CUDA-core thread layout: 256 threads, TPR = 8 per row of a tile (a row's
 * threads are one aligned group of a warp, so row reductions are three
 * shuffles). Neither family has run on a GPU yet. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <pthread.h>

#include <type_traits>

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

/* Max and sum over the n threads of a row (an aligned group of a warp, n a
 * power of two); every lane of the warp must call them. */
template <int n> __device__ inline float row_max(float v) {
    for (int o = n / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int n> __device__ inline float row_sum(float v) {
    for (int o = n / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One key tile of the online softmax of a row held by n threads, each with
 * its k scores sc of the tile (-inf where masked): the row's running max mx
 * moves to the tile's, its running sum l is rescaled and grows by the tile's
 * exponentials, which replace the scores in sc. Returns the factor that
 * rescales the row's O (1 while the row has seen no key). */
template <int n, int k> __device__ __forceinline__ float online_softmax(float (&sc)[k], float &mx, float &l) {
    float tmax = -INFINITY;
#pragma unroll
    for (int t = 0; t < k; t++) tmax = fmaxf(tmax, sc[t]);
    const float mnew = fmaxf(mx, row_max<n>(tmax));
    const float corr = mnew == -INFINITY ? 1.0f : expf(mx - mnew);
    float lsum = 0.0f;
#pragma unroll
    for (int t = 0; t < k; t++) {
        sc[t] = sc[t] == -INFINITY ? 0.0f : expf(sc[t] - mnew);
        lsum += sc[t];
    }
    l = l * corr + row_sum<n>(lsum);
    mx = mnew;
    return corr;
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
        float sc[BK / TPR];
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
        }
        const float corr = online_softmax<TPR>(sc, m, l);
        for (int t = 0; t < BK / TPR; t++) ss[r * (BK + 1) + sub + TPR * t] = sc[t];
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
                dl += row_sum<TPR>(part);
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

/* ---- tensor cores (q, k, v and dO all bf16 or all f16) */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention.cu: the bf16/f16 wmma fragments need compute capability 8.0 or above (ACCEL_CUDA_ARCHITECTURES)"
#endif

namespace wmma = nvcuda::wmma;

/* Tiles of TQ queries x TK keys, TC_WARPS warps, TC_TPR threads per row of a
 * tile in the elementwise steps; fragments FR x FR x FR. Shared-memory rows
 * are padded (PAD_H 16-bit or PAD_F f32 elements: 16 bytes) against bank
 * conflicts, which keeps every row stride a multiple of 16 bytes as wmma
 * asks (ldm a multiple of 8 16-bit or 4 f32 elements). */
enum { TQ = 64, TK = 64, TC_WARPS = 8, TC_THREADS = 32 * TC_WARPS, TC_TPR = TC_THREADS / TQ, FR = 16 };
enum { PAD_H = 8, PAD_F = 4 };
static_assert(TQ % FR == 0 && TK % FR == 0 && TK % TC_TPR == 0, "tiles of whole fragments and row groups");
static_assert(TC_THREADS % TK == 0 && TC_THREADS / TC_TPR == TK, "the key pass's thread layouts cover a key tile");

/* A kernel's shared memory: regions of rows x cols elements (16-bit or f32),
 * rows padded (PAD_H or PAD_F elements), each region aligned to 128 bytes.
 * Every fragment then starts 32-byte aligned (wmma's requirement): fragment
 * rows and columns start at multiples of 16 elements and row strides are
 * multiples of 16 bytes. The same arithmetic runs on the host (the launch's
 * size) and in the kernel (the pointers). */
enum { MAX_REGIONS = 8 };

struct smem_region {
    int rows, cols, elem_bytes;
};

struct tc_smem {
    size_t off[MAX_REGIONS], bytes;
    int ld[MAX_REGIONS]; /* row strides, in elements */
};

__host__ __device__ inline tc_smem tc_smem_of(int n, const smem_region *r) {
    tc_smem m = {};
    for (int i = 0; i < n; i++) {
        m.ld[i] = r[i].cols + (r[i].elem_bytes == 2 ? PAD_H : PAD_F);
        m.off[i] = m.bytes;
        m.bytes += ((size_t)r[i].rows * (size_t)m.ld[i] * (size_t)r[i].elem_bytes + 127) / 128 * 128;
    }
    return m;
}

/* Forward: Q [TQ][D], K [TK][D], V [TK][Dv], P [TQ][TK] (16-bit), S [TQ][TK]
 * and O [TQ][Dv] (f32). */
enum { FQ, FK, FV, FP, FS, FO, F_REGIONS };

__host__ __device__ inline tc_smem fwd_tc_smem_of(int D, int Dv) {
    const smem_region r[F_REGIONS] = {{TQ, D, 2}, {TK, D, 2}, {TK, Dv, 2}, {TQ, TK, 2}, {TQ, TK, 4}, {TQ, Dv, 4}};
    return tc_smem_of(F_REGIONS, r);
}

/* Query pass: dO [TQ][Dv], V [TK][Dv], K [TK][D], dS [TQ][TK] (16-bit), dP
 * [TQ][TK] and dQ [TQ][D] (f32). */
enum { QG, QV, QK, QDS, QDP, QDQ, Q_REGIONS };

__host__ __device__ inline tc_smem bwd_q_tc_smem_of(int D, int Dv) {
    const smem_region r[Q_REGIONS] = {{TQ, Dv, 2}, {TK, Dv, 2}, {TK, D, 2}, {TQ, TK, 2}, {TQ, TK, 4}, {TQ, D, 4}};
    return tc_smem_of(Q_REGIONS, r);
}

/* Key pass: V [TK][Dv], Q [TQ][D], dO [TQ][Dv], P and dS [TQ][TK] (16-bit),
 * dP [TQ][TK], dK [TK][D] and dV [TK][Dv] (f32). */
enum { KV, KQ, KG, KP, KDS, KDP, KDK, KDV, K_REGIONS };

__host__ __device__ inline tc_smem bwd_kv_tc_smem_of(int D, int Dv) {
    const smem_region r[K_REGIONS] = {{TK, Dv, 2}, {TQ, D, 2},  {TQ, Dv, 2}, {TQ, TK, 2},
                                      {TQ, TK, 2}, {TQ, TK, 4}, {TK, D, 4},  {TK, Dv, 4}};
    return tc_smem_of(K_REGIONS, r);
}
static_assert((int)F_REGIONS <= (int)MAX_REGIONS && (int)Q_REGIONS <= (int)MAX_REGIONS &&
                  (int)K_REGIONS <= (int)MAX_REGIONS,
              "regions of the kernels' shared memory");

/* f32 to the 16-bit element type, rounded to nearest even. */
template <typename T> __device__ inline T to_half(float v);
template <> __device__ inline __nv_bfloat16 to_half<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ inline __half to_half<__half>(float v) { return __float2half_rn(v); }

/* rows_tile rows of cols (a multiple of 8) 16-bit elements into dst (row
 * stride ld): row r < rows from src + off + r * stride, the rows after it
 * zeros (a partial tile's products then add exact zeros). 16-byte copies
 * when the source rows allow them. */
template <typename T>
__device__ inline void stage_half(T *dst, int ld, const T *src, int64_t off, int64_t stride, int rows, int rows_tile,
                                  int cols) {
    const uint16_t *s = (const uint16_t *)src + off;
    uint16_t *t = (uint16_t *)dst;
    if ((uintptr_t)s % 16 == 0 && stride % 8 == 0) {
        const int per_row = cols / 8;
        for (int e = threadIdx.x; e < rows_tile * per_row; e += TC_THREADS) {
            const int r = e / per_row, c = e % per_row * 8;
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (r < rows) x = *(const uint4 *)(s + r * stride + c);
            *(uint4 *)(t + r * ld + c) = x;
        }
        return;
    }
    for (int e = threadIdx.x; e < rows_tile * cols; e += TC_THREADS) {
        const int r = e / cols, c = e % cols;
        t[r * ld + c] = r < rows ? s[r * stride + c] : (uint16_t)0;
    }
}

__device__ inline void zero_f32(float *dst, int n) {
    for (int e = threadIdx.x; e < n; e += TC_THREADS) dst[e] = 0.0f;
}

/* The FR x FR fragment at fragment row rt, column ct of a matrix stored in
 * Layout (row_major: element (r, c) at m[r * ld + c]; col_major: at
 * m[c * ld + r]). */
template <typename Layout, typename T> __device__ inline const T *frag_at(const T *m, int ld, int rt, int ct) {
    return std::is_same<Layout, wmma::row_major>::value ? m + rt * FR * ld + ct * FR : m + ct * FR * ld + rt * FR;
}

/* C = (accumulate ? C : 0) + A B in shared memory: C [mt*FR][nt*FR] f32
 * row-major (ldc), A [mt*FR][ks*FR] stored as LA (lda), B [ks*FR][nt*FR]
 * stored as LB (ldb). Each warp computes every TC_WARPS-th fragment of C (a
 * fragment is one warp's alone). The caller synchronises the block before
 * (A, B and C written) and after (C read by other warps). */
template <typename LA, typename LB, typename T>
__device__ inline void tile_mma(float *c, int ldc, const T *a, int lda, const T *b, int ldb, int mt, int nt, int ks,
                                bool accumulate) {
    for (int f = (int)threadIdx.x / 32; f < mt * nt; f += TC_WARPS) {
        const int fr = f / nt, fc = f % nt;
        float *cf = c + fr * FR * ldc + fc * FR;
        wmma::fragment<wmma::accumulator, FR, FR, FR, float> acc;
        if (accumulate) wmma::load_matrix_sync(acc, cf, (unsigned)ldc, wmma::mem_row_major);
        else wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < ks; kk++) {
            wmma::fragment<wmma::matrix_a, FR, FR, FR, T, LA> fa;
            wmma::fragment<wmma::matrix_b, FR, FR, FR, T, LB> fb;
            wmma::load_matrix_sync(fa, frag_at<LA>(a, lda, fr, kk), (unsigned)lda);
            wmma::load_matrix_sync(fb, frag_at<LB>(b, ldb, kk, fc), (unsigned)ldb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(cf, acc, (unsigned)ldc, wmma::mem_row_major);
    }
}

/* The forward on tensor cores: as sdpa_fwd_k, with S = Q K^T and O += P V
 * on fragments (P rounded to T) and the softmax in f32, TC_TPR threads per
 * query row. */
template <typename T>
__global__ void __launch_bounds__(TC_THREADS)
    sdpa_fwd_tc_k(elems o, float *p, const T *q, const T *k, const T *v, accel_k_sdpa_dims d) {
    extern __shared__ __align__(128) unsigned char tc_sm[];
    const int D = (int)d.D, Dv = (int)d.Dv;
    const tc_smem m = fwd_tc_smem_of(D, Dv);
    T *sq = (T *)(tc_sm + m.off[FQ]), *sk = (T *)(tc_sm + m.off[FK]), *sv = (T *)(tc_sm + m.off[FV]);
    T *sp = (T *)(tc_sm + m.off[FP]);
    float *ss = (float *)(tc_sm + m.off[FS]), *so = (float *)(tc_sm + m.off[FO]);
    const int ldq = m.ld[FQ], ldk = m.ld[FK], ldv = m.ld[FV], ldp = m.ld[FP], lds = m.ld[FS], ldo = m.ld[FO];
    const int64_t bh = blockIdx.x, b = bh / d.H, hk = bh % d.H / (d.H / d.Hkv), i0 = (int64_t)blockIdx.y * TQ;
    const int nq = (int)(d.Tq - i0 < TQ ? d.Tq - i0 : TQ);
    const int64_t kh = b * d.ks[0] + hk * d.ks[1], vh = b * d.vs[0] + hk * d.vs[1];
    const int r = threadIdx.x / TC_TPR, sub = threadIdx.x % TC_TPR;
    const int64_t i = i0 + r, L = r < nq ? last_key(d, i) : -1;
    float *prow = p + (bh * d.Tq + i) * d.Tk;
    stage_half(sq, ldq, q, (bh * d.Tq + i0) * D, D, nq, TQ, D);
    zero_f32(so, TQ * ldo);
    float mx = -INFINITY, l = 0.0f;
    const int64_t kend = last_key(d, i0 + nq - 1) + 1; /* the keys the tile's last query sees */
    for (int64_t j0 = 0; j0 < kend; j0 += TK) {
        const int nk = (int)(kend - j0 < TK ? kend - j0 : TK);
        __syncthreads(); /* Q and O staged; the previous tile's K, V and P no longer read */
        stage_half(sk, ldk, k, kh + j0 * d.ks[2], d.ks[2], nk, TK, D);
        stage_half(sv, ldv, v, vh + j0 * d.vs[2], d.vs[2], nk, TK, Dv);
        __syncthreads();
        tile_mma<wmma::row_major, wmma::col_major>(ss, lds, sq, ldq, sk, ldk, TQ / FR, TK / FR, D / FR, false);
        __syncthreads(); /* S complete */
        float sc[TK / TC_TPR];
        for (int t = 0; t < TK / TC_TPR; t++) {
            const int c = sub + TC_TPR * t;
            float s = -INFINITY;
            if (c < nk && j0 + c <= L) {
                s = ss[r * lds + c] * d.scale;
                prow[j0 + c] = s; /* raw score, normalised below by this same thread */
            }
            sc[t] = s;
        }
        const float corr = online_softmax<TC_TPR>(sc, mx, l);
        for (int t = 0; t < TK / TC_TPR; t++) sp[r * ldp + sub + TC_TPR * t] = to_half<T>(sc[t]);
        for (int e = sub; e < Dv; e += TC_TPR) so[r * ldo + e] *= corr;
        __syncthreads(); /* P written, O rescaled */
        tile_mma<wmma::row_major, wmma::row_major>(so, ldo, sp, ldp, sv, ldv, TQ / FR, Dv / FR, TK / FR, true);
    }
    __syncthreads(); /* O's fragments come from every warp */
    if (r >= nq) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f; /* a row that sees no key: O and P are 0 */
    for (int e = sub; e < Dv; e += TC_TPR) store(o, (bh * d.Tq + i) * Dv + e, so[r * ldo + e] * inv);
    const int64_t wk = written_keys(d, i);
    for (int64_t j = sub; j < wk; j += TC_TPR) prow[j] = j <= L ? expf(prow[j] - mx) * inv : 0.0f;
}

/* The backward's query pass on tensor cores: as sdpa_bwd_q_k, with dP = dO
 * V^T and dQ += dS K on fragments (dS rounded to T), TC_TPR threads per
 * query row. */
template <typename T>
__global__ void __launch_bounds__(TC_THREADS)
    sdpa_bwd_q_tc_k(elems dq, float *delta, const T *go, const T *k, const T *v, const float *p, accel_k_sdpa_dims d,
                    float dq_beta) {
    extern __shared__ __align__(128) unsigned char tc_sm[];
    const int D = (int)d.D, Dv = (int)d.Dv;
    const tc_smem m = bwd_q_tc_smem_of(D, Dv);
    T *sg = (T *)(tc_sm + m.off[QG]), *sv = (T *)(tc_sm + m.off[QV]), *sk = (T *)(tc_sm + m.off[QK]);
    T *sds = (T *)(tc_sm + m.off[QDS]);
    float *sdp = (float *)(tc_sm + m.off[QDP]), *sdq = (float *)(tc_sm + m.off[QDQ]);
    const int ldg = m.ld[QG], ldv = m.ld[QV], ldk = m.ld[QK], ldds = m.ld[QDS], lddp = m.ld[QDP], lddq = m.ld[QDQ];
    const int64_t bh = blockIdx.x, b = bh / d.H, kvb = b * d.Hkv + bh % d.H / (d.H / d.Hkv);
    const int64_t i0 = (int64_t)blockIdx.y * TQ;
    const int nq = (int)(d.Tq - i0 < TQ ? d.Tq - i0 : TQ);
    const int64_t kh = kvb * d.Tk * D, vh = kvb * d.Tk * Dv;
    const int r = threadIdx.x / TC_TPR, sub = threadIdx.x % TC_TPR;
    const int64_t i = i0 + r, L = r < nq ? last_key(d, i) : -1;
    const float *prow = p + (bh * d.Tq + i) * d.Tk;
    stage_half(sg, ldg, go, (bh * d.Tq + i0) * Dv, Dv, nq, TQ, Dv);
    if (dq.p) zero_f32(sdq, TQ * lddq);
    const int64_t kend = last_key(d, i0 + nq - 1) + 1;
    /* Pass 0: delta_i = sum_j P_ij dP_ij. Pass 1: dQ_i = scale sum_j P_ij (dP_ij - delta_i) K_j. */
    float dl = 0.0f;
    for (int pass = 0; pass < (dq.p ? 2 : 1); pass++) {
        float part = 0.0f;
        for (int64_t j0 = 0; j0 < kend; j0 += TK) {
            const int nk = (int)(kend - j0 < TK ? kend - j0 : TK);
            __syncthreads(); /* dO and dQ staged; the previous tile's V, K, dP and dS no longer read */
            stage_half(sv, ldv, v, vh + j0 * Dv, Dv, nk, TK, Dv);
            if (pass) stage_half(sk, ldk, k, kh + j0 * D, D, nk, TK, D);
            __syncthreads();
            tile_mma<wmma::row_major, wmma::col_major>(sdp, lddp, sg, ldg, sv, ldv, TQ / FR, TK / FR, Dv / FR,
                                                       false);
            __syncthreads(); /* dP complete */
            for (int t = 0; t < TK / TC_TPR; t++) {
                const int c = sub + TC_TPR * t;
                float ds = 0.0f;
                if (c < nk && j0 + c <= L) {
                    const float dp = sdp[r * lddp + c], pij = prow[j0 + c];
                    part += pij * dp;
                    ds = pij * (dp - dl);
                }
                if (pass) sds[r * ldds + c] = to_half<T>(ds);
            }
            if (!pass) continue;
            __syncthreads(); /* dS written */
            tile_mma<wmma::row_major, wmma::row_major>(sdq, lddq, sds, ldds, sk, ldk, TQ / FR, D / FR, TK / FR,
                                                       true);
        }
        if (!pass) dl = row_sum<TC_TPR>(part);
    }
    __syncthreads(); /* dQ's fragments come from every warp */
    if (r >= nq) return;
    if (sub == 0) delta[bh * d.Tq + i] = dl;
    if (!dq.p) return;
    const int64_t dqr = (bh * d.Tq + i) * D;
    for (int e = sub; e < D; e += TC_TPR) {
        float val = d.scale * sdq[r * lddq + e];
        store(dq, dqr + e, dq_beta == 0.0f ? val : load(dq, dqr + e) + val);
    }
}

/* The backward's key pass on tensor cores: as sdpa_bwd_kv_k, with dP = dO
 * V^T, dV += P^T dO and dK += dS^T Q on fragments (P and dS rounded to T).
 * In the elementwise step thread t takes key t % TK of the tile (P's reads
 * coalesce along a row) and every TC_THREADS / TK-th query. */
template <typename T>
__global__ void __launch_bounds__(TC_THREADS)
    sdpa_bwd_kv_tc_k(elems dk, elems dv, const float *delta, const T *go, const T *q, const T *v, const float *p,
                     accel_k_sdpa_dims d) {
    extern __shared__ __align__(128) unsigned char tc_sm[];
    const int D = (int)d.D, Dv = (int)d.Dv;
    const int64_t G = d.H / d.Hkv;
    const tc_smem m = bwd_kv_tc_smem_of(D, Dv);
    T *sv = (T *)(tc_sm + m.off[KV]), *sq = (T *)(tc_sm + m.off[KQ]), *sg = (T *)(tc_sm + m.off[KG]);
    T *sp = (T *)(tc_sm + m.off[KP]), *sds = (T *)(tc_sm + m.off[KDS]);
    float *sdp = (float *)(tc_sm + m.off[KDP]), *sdk = (float *)(tc_sm + m.off[KDK]);
    float *sdv = (float *)(tc_sm + m.off[KDV]);
    const int ldv = m.ld[KV], ldq = m.ld[KQ], ldg = m.ld[KG], ldp = m.ld[KP], ldds = m.ld[KDS], lddp = m.ld[KDP];
    const int lddk = m.ld[KDK], lddv = m.ld[KDV];
    const int64_t kvb = blockIdx.x, b = kvb / d.Hkv, kv = kvb % d.Hkv, j0 = (int64_t)blockIdx.y * TK;
    const int nk = (int)(d.Tk - j0 < TK ? d.Tk - j0 : TK);
    const int c = threadIdx.x % TK, r0 = threadIdx.x / TK;
    const int64_t j = j0 + c;
    stage_half(sv, ldv, v, (kvb * d.Tk + j0) * Dv, Dv, nk, TK, Dv);
    if (dk.p) zero_f32(sdk, TK * lddk);
    if (dv.p) zero_f32(sdv, TK * lddv);
    /* The first query that sees key j0: last_key(i) >= j0. */
    int64_t first = d.causal ? j0 - (d.Tk - d.Tq) : 0;
    if (first < 0) first = 0;
    for (int64_t gi = 0; gi < G; gi++) {
        const int64_t bh = b * d.H + kv * G + gi;
        for (int64_t i0 = first; i0 < d.Tq; i0 += TQ) {
            const int nq = (int)(d.Tq - i0 < TQ ? d.Tq - i0 : TQ);
            __syncthreads(); /* V, dK and dV staged; the previous tile's Q, dO, P and dS no longer read */
            if (dk.p) stage_half(sq, ldq, q, (bh * d.Tq + i0) * D, D, nq, TQ, D);
            stage_half(sg, ldg, go, (bh * d.Tq + i0) * Dv, Dv, nq, TQ, Dv);
            __syncthreads();
            if (dk.p) {
                tile_mma<wmma::row_major, wmma::col_major>(sdp, lddp, sg, ldg, sv, ldv, TQ / FR, TK / FR,
                                                           Dv / FR, false);
                __syncthreads(); /* dP complete */
            }
            for (int rr = r0; rr < TQ; rr += TC_THREADS / TK) {
                const int64_t i = i0 + rr;
                float pij = 0.0f, ds = 0.0f;
                if (rr < nq && c < nk && j <= last_key(d, i)) {
                    pij = p[(bh * d.Tq + i) * d.Tk + j];
                    if (dk.p) ds = pij * (sdp[rr * lddp + c] - delta[bh * d.Tq + i]);
                }
                sp[rr * ldp + c] = to_half<T>(pij);
                sds[rr * ldds + c] = to_half<T>(ds);
            }
            __syncthreads(); /* P and dS written */
            if (dv.p)
                tile_mma<wmma::col_major, wmma::row_major>(sdv, lddv, sp, ldp, sg, ldg, TK / FR, Dv / FR,
                                                           TQ / FR, true);
            if (dk.p)
                tile_mma<wmma::col_major, wmma::row_major>(sdk, lddk, sds, ldds, sq, ldq, TK / FR, D / FR,
                                                           TQ / FR, true);
        }
    }
    __syncthreads(); /* dK's and dV's fragments come from every warp */
    const int kc = threadIdx.x / TC_TPR, sub = threadIdx.x % TC_TPR;
    if (kc >= nk) return;
    const int64_t kr = (kvb * d.Tk + j0 + kc) * D, vr = (kvb * d.Tk + j0 + kc) * Dv;
    for (int e = sub; dk.p && e < D; e += TC_TPR) store(dk, kr + e, load(dk, kr + e) + d.scale * sdk[kc * lddk + e]);
    for (int e = sub; dv.p && e < Dv; e += TC_TPR) store(dv, vr + e, load(dv, vr + e) + sdv[kc * lddv + e]);
}

/* ---- launches */

/* Per device: its shared-memory limit, and the kernels already allowed it
 * (cudaFuncSetAttribute once per kernel and device, not per launch). */
enum { ATT_KERNELS_MAX = 32 };
static struct {
    size_t limit; /* 0: not asked yet */
    const void *allowed[ATT_KERNELS_MAX];
    int n_allowed;
} g_smem[ACCEL_CUDA_MAX_DEVICES];
static pthread_mutex_t g_smem_lock = PTHREAD_MUTEX_INITIALIZER;

/* The dynamic shared memory a block may use on device index (beyond the
 * default 48 KiB once a kernel is allowed it). */
static accel_status smem_limit(int index, const char *op, size_t *limit) {
    pthread_mutex_lock(&g_smem_lock);
    *limit = g_smem[index].limit;
    pthread_mutex_unlock(&g_smem_lock);
    if (*limit) return ACCEL_OK;
    int optin = 0;
    accel_status st = accel__cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, index),
                                        index, op);
    *limit = optin > 0 ? (size_t)optin : 0;
    pthread_mutex_lock(&g_smem_lock);
    g_smem[index].limit = *limit;
    pthread_mutex_unlock(&g_smem_lock);
    return st;
}

/* Lets `fn` use up to `limit` bytes of dynamic shared memory, after an error
 * naming the head dims when it needs (`bytes`) more. The attribute is set to
 * the GPU's limit, never to this call's need: two threads launching `fn` for
 * other head dims then set the same value, and neither's launch can find a
 * smaller one set between its check and its launch. */
static accel_status shared_memory(int index, const void *fn, size_t bytes, size_t limit, const accel_k_sdpa_dims *d,
                                  const char *op) {
    if (bytes > limit)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "cuda:%d: %s: head dims D=%lld Dv=%lld need %zu bytes of shared memory per block, "
                               "the GPU allows %zu",
                               index, op, (long long)d->D, (long long)d->Dv, bytes, limit);
    pthread_mutex_lock(&g_smem_lock);
    bool seen = false;
    for (int i = 0; i < g_smem[index].n_allowed && !seen; i++) seen = g_smem[index].allowed[i] == fn;
    accel_status st = ACCEL_OK;
    if (!seen) {
        st = accel__cuda_check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)limit), index,
                               op);
        if (!st && g_smem[index].n_allowed < ATT_KERNELS_MAX) g_smem[index].allowed[g_smem[index].n_allowed++] = fn;
    }
    pthread_mutex_unlock(&g_smem_lock);
    return st;
}

static unsigned tiles(int64_t n, int64_t per) { return (unsigned)((n + per - 1) / per); }

/* The 16-bit dtype (bf16 or f16) in which the tensor-core kernels can take
 * the n operands ts: all of them in it and both head dims multiples of FR
 * (at most 1024: beyond any GPU's shared memory); ACCEL_F32 (the CUDA-core
 * kernels) otherwise. */
static accel_dtype tc_dtype(const accel_k_sdpa_dims *d, const accel_tensor *const *ts, int n) {
    if (d->D < FR || d->Dv < FR || d->D % FR || d->Dv % FR || d->D > 1024 || d->Dv > 1024) return ACCEL_F32;
    const accel_dtype dt = ts[0]->dtype;
    if (dt != ACCEL_BF16 && dt != ACCEL_F16) return ACCEL_F32;
    for (int i = 1; i < n; i++)
        if (ts[i]->dtype != dt) return ACCEL_F32;
    return dt;
}

template <typename T>
static accel_status fwd_tc(const accel_k_sdpa *k, cudaStream_t s, int index, size_t bytes, size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    accel_status st = shared_memory(index, (const void *)sdpa_fwd_tc_k<T>, bytes, limit, d, "sdpa");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->H), tiles(d->Tq, TQ));
    sdpa_fwd_tc_k<T><<<grid, TC_THREADS, bytes, s>>>(elems_of(k->o), (float *)k->p->data, (const T *)k->q->data,
                                                     (const T *)k->k->data, (const T *)k->v->data, *d);
    return launched(index, "sdpa");
}

extern "C" accel_status accel__cudak_sdpa(accel_k_sdpa *k) {
    int index = k->o->device.index;
    const accel_k_sdpa_dims *d = &k->dims;
    if (!d->B || !d->H || !d->Tq || !d->Dv) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    size_t limit = 0;
    accel_status st = smem_limit(index, "sdpa", &limit);
    if (st != ACCEL_OK) return st;
    const accel_tensor *in[3] = {k->q, k->k, k->v};
    const accel_dtype tdt = tc_dtype(d, in, 3);
    const size_t tc_bytes = tdt == ACCEL_F32 ? 0 : fwd_tc_smem_of((int)d->D, (int)d->Dv).bytes;
    if (tdt != ACCEL_F32 && tc_bytes <= limit)
        return tdt == ACCEL_BF16 ? fwd_tc<__nv_bfloat16>(k, s, index, tc_bytes, limit)
                                 : fwd_tc<__half>(k, s, index, tc_bytes, limit);
    size_t bytes = fwd_smem(d);
    if ((st = shared_memory(index, (const void *)sdpa_fwd_k, bytes, limit, d, "sdpa")) != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->H), tiles(d->Tq, BQ));
    sdpa_fwd_k<<<grid, ATT_THREADS, bytes, s>>>(elems_of(k->o), (float *)k->p->data, elems_of(k->q), elems_of(k->k),
                                                elems_of(k->v), *d);
    return launched(index, "sdpa");
}

template <typename T>
static accel_status bwd_q_tc(const accel_k_sdpa_backward *k, float *delta, cudaStream_t s, int index, size_t bytes,
                             size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_q_tc_k<T>, bytes, limit, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->H), tiles(d->Tq, TQ));
    sdpa_bwd_q_tc_k<T><<<grid, TC_THREADS, bytes, s>>>(elems_of(k->dq), delta, (const T *)k->g->data,
                                                       (const T *)k->k->data, (const T *)k->v->data,
                                                       (const float *)k->p->data, *d, k->dq_beta);
    return launched(index, "sdpa_backward");
}

template <typename T>
static accel_status bwd_kv_tc(const accel_k_sdpa_backward *k, const float *delta, cudaStream_t s, int index,
                              size_t bytes, size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_kv_tc_k<T>, bytes, limit, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->Hkv), tiles(d->Tk, TK));
    sdpa_bwd_kv_tc_k<T><<<grid, TC_THREADS, bytes, s>>>(elems_of(k->dk), elems_of(k->dv), delta,
                                                        (const T *)k->g->data, (const T *)k->q->data,
                                                        (const T *)k->v->data, (const float *)k->p->data, *d);
    return launched(index, "sdpa_backward");
}

/* delta and dq: the query pass, on tensor cores when tdt is 16-bit and its tiles fit. */
static accel_status bwd_q(const accel_k_sdpa_backward *k, float *delta, accel_dtype tdt, cudaStream_t s, int index,
                          size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    const size_t tc_bytes = tdt == ACCEL_F32 ? 0 : bwd_q_tc_smem_of((int)d->D, (int)d->Dv).bytes;
    if (tdt != ACCEL_F32 && tc_bytes <= limit)
        return tdt == ACCEL_BF16 ? bwd_q_tc<__nv_bfloat16>(k, delta, s, index, tc_bytes, limit)
                                 : bwd_q_tc<__half>(k, delta, s, index, tc_bytes, limit);
    size_t bytes = bwd_q_smem(d);
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_q_k, bytes, limit, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->H), tiles(d->Tq, BQ));
    sdpa_bwd_q_k<<<grid, ATT_THREADS, bytes, s>>>(elems_of(k->dq), delta, elems_of(k->g), elems_of(k->k),
                                                  elems_of(k->v), (const float *)k->p->data, *d, k->dq_beta);
    return launched(index, "sdpa_backward");
}

/* dk and dv: the key pass, on tensor cores when tdt is 16-bit and its tiles fit. */
static accel_status bwd_kv(const accel_k_sdpa_backward *k, const float *delta, accel_dtype tdt, cudaStream_t s,
                           int index, size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    const size_t tc_bytes = tdt == ACCEL_F32 ? 0 : bwd_kv_tc_smem_of((int)d->D, (int)d->Dv).bytes;
    if (tdt != ACCEL_F32 && tc_bytes <= limit)
        return tdt == ACCEL_BF16 ? bwd_kv_tc<__nv_bfloat16>(k, delta, s, index, tc_bytes, limit)
                                 : bwd_kv_tc<__half>(k, delta, s, index, tc_bytes, limit);
    size_t bytes = bwd_kv_smem(d);
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_kv_k, bytes, limit, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->Hkv), tiles(d->Tk, BK));
    sdpa_bwd_kv_k<<<grid, ATT_THREADS, bytes, s>>>(elems_of(k->dk), elems_of(k->dv), delta, elems_of(k->g),
                                                   elems_of(k->q), elems_of(k->v), (const float *)k->p->data, *d);
    return launched(index, "sdpa_backward");
}

extern "C" accel_status accel__cudak_sdpa_backward(accel_k_sdpa_backward *k) {
    int index = k->g->device.index;
    const accel_k_sdpa_dims *d = &k->dims;
    if (!d->B || !d->H || !d->Tq) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    size_t limit = 0;
    accel_status st = smem_limit(index, "sdpa_backward", &limit);
    if (st != ACCEL_OK) return st;
    const accel_tensor *in[4] = {k->q, k->k, k->v, k->g};
    const accel_dtype tdt = tc_dtype(d, in, 4);
    float *delta = NULL;
    if (k->dq || k->dk) {
        delta = (float *)accel__cuda_step_alloc(index, (size_t)(d->B * d->H * d->Tq) * sizeof(float), 256);
        if (!delta) return accel_last_status();
        if ((st = bwd_q(k, delta, tdt, s, index, limit)) != ACCEL_OK) return st;
    }
    if ((!k->dk && !k->dv) || !d->Tk) return ACCEL_OK; /* no key: dK and dV have no rows (dQ was zeroed) */
    return bwd_kv(k, delta, tdt, s, index, limit);
}
