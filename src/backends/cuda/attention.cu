/* Scaled dot-product attention with grouped-query heads and a bottom-right
 * aligned causal mask, forward and backward, f32 softmax and accumulation
 * (the CPU's src/backends/cpu/attention_kernels.c computes the same),
 * FlashAttention-2 style: the probabilities P are never stored, the forward
 * keeps one log-sum-exp per query row and the backward recomputes P from it.
 * q, k, v, o, dO and dq, dk, dv are each f32, bf16 or f16, read and written
 * in place at their strides (dims' qs, ks, vs, os and the backward's gs, dqs,
 * dks, dvs: the backend sets sdpa_strided): tiles are staged in shared memory
 * and results rounded as they are stored, so the op needs no f32 or dense
 * copies.
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
 * Forward: one block per (batch*head, tile of queries) keeps its Q tile in
 * shared memory, walks the key tiles the causal mask lets it see (K and V
 * tiles staged in shared memory), and keeps the softmax online (running max
 * m and sum l per row, O rescaled in shared memory), all in f32. It writes O
 * and lse = m + log l per row (scaled units; -inf for a row that sees no
 * key, whose O is 0).
 *
 * Backward: a small kernel computes delta_i = sum_e dO_ie O_ie (the softmax
 * gradient's row term, from O as stored); a query-tile pass walks the key
 * tiles its queries see, recomputes S = Q K^T, P = exp(scale S - lse),
 * dP = dO V^T and dS = P o (dP - delta), and accumulates dQ = scale dS K; a
 * key-tile pass, one block per (batch*kv head, tile of keys), walks the G
 * query heads of its kv head and every query tile that sees its keys,
 * recomputes S, P, dP and dS likewise, and accumulates dV = P^T dO and
 * dK = scale dS^T Q in shared memory before adding them to dk and dv (no
 * atomics: a key belongs to one block). Each pass picks its family on its
 * own.
 *
 * CUDA-core thread layout: 256 threads, TPR = 8 per row of a tile (a row's
 * threads are one aligned group of a warp, so row reductions are three
 * shuffles).
 *
 * Both families ran on an H200 on 2026-12-04 in the design before this one,
 * which stored P (the forward wrote it, the backward read it). This design
 * (lse kept, P recomputed, every operand strided) has compiled for sm_90 but
 * has not run on a GPU. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <pthread.h>

#include <type_traits>

#include "cuda_common.cuh"

enum { BQ = 32, BK = 32, ATT_THREADS = 256, TPR = ATT_THREADS / BQ };

/* Last key query i may see (inclusive); -1 when none. */
__device__ inline int64_t last_key(const accel_k_sdpa_dims &d, int64_t i) {
    if (!d.causal) return d.Tk - 1;
    int64_t l = i + d.Tk - d.Tq;
    return l < -1 ? -1 : l < d.Tk - 1 ? l : d.Tk - 1;
}

/* The first query that sees key j (last_key(i) >= j). */
__device__ inline int64_t first_query(const accel_k_sdpa_dims &d, int64_t j) {
    const int64_t f = d.causal ? j - (d.Tk - d.Tq) : 0;
    return f > 0 ? f : 0;
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

/* The log-sum-exp of a row from its online softmax's max mx and sum l: -inf
 * for a row that saw no key (l 0; one that saw a key has l >= 1). */
__device__ inline float lse_of(float mx, float l) { return l > 0.0f ? mx + logf(l) : -INFINITY; }

/* P_ij = exp(s - lse_i) for key j of row i, s the scaled score, when `seen`
 * (the mask lets the row see the key); 0 otherwise, and for every key of a
 * row that sees none (lse -inf: exp(-inf - -inf) would be NaN). */
__device__ inline float prob(float s, float lse, bool seen) {
    return seen && lse != -INFINITY ? expf(s - lse) : 0.0f;
}

/* A [B, heads, T, n] tensor as the kernels see it: data, dtype (f32, bf16 or
 * f16) and element strides over batch, head and row (a row's n elements
 * contiguous); p NULL for a gradient that is not wanted. */
typedef struct elems {
    void *p;
    accel_dtype dt;
    int64_t s[3];
} elems;

static elems elems_of(const accel_tensor *t, const int64_t s[3]) {
    elems e = {t ? t->data : NULL, t ? t->dtype : ACCEL_F32, {s[0], s[1], s[2]}};
    return e;
}

/* The element offset of row i of head h of batch b. */
__device__ inline int64_t row_at(const elems &e, int64_t b, int64_t h, int64_t i) {
    return b * e.s[0] + h * e.s[1] + i * e.s[2];
}

__device__ inline float load(const elems &e, int64_t i) { return load_f(e.p, e.dt, i); }

__device__ inline void store(const elems &e, int64_t i, float v) {
    if (e.dt == ACCEL_F32) ((float *)e.p)[i] = v;
    else accel__elem_set(e.p, e.dt, i, v);
}

/* Element i of e = v (`overwrite`: its old value not read) or e[i] + v. */
__device__ inline void add_or_store(const elems &e, int64_t i, float v, bool overwrite) {
    store(e, i, overwrite ? v : load(e, i) + v);
}

/* rows x cols of a matrix (element off of src, row stride `stride`) into
 * shared memory with row stride `ld`, as f32. */
__device__ inline void stage(float *dst, int64_t ld, const elems &src, int64_t off, int64_t stride, int rows,
                             int64_t cols) {
    for (int64_t e = threadIdx.x; e < rows * cols; e += ATT_THREADS) {
        int64_t r = e / cols, c = e % cols;
        dst[r * ld + c] = load(src, off + r * stride + c);
    }
}

/* sum_x a[x] b[x] over n elements of shared memory, in order (the forward
 * and the backward add a score's products alike, so the backward's P is the
 * forward's). */
__device__ inline float dot(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t x = 0; x < n; x++) acc += a[x] * b[x];
    return acc;
}

/* ---- forward */

/* Shared memory: Q [BQ][D], K [BK][D+1], V [BK][Dv], S [BQ][BK+1], O [BQ][Dv]. */
static size_t fwd_smem(const accel_k_sdpa_dims *d) {
    return sizeof(float) * (size_t)(BQ * d->D + BK * (d->D + 1) + BK * d->Dv + BQ * (BK + 1) + BQ * d->Dv);
}

/* o and lse [B*H*Tq] of the tile of queries blockIdx.y of head blockIdx.x. */
__global__ void __launch_bounds__(ATT_THREADS)
    sdpa_fwd_k(elems o, float *lse, elems q, elems k, elems v, accel_k_sdpa_dims d) {
    extern __shared__ float sm[];
    const int64_t D = d.D, Dv = d.Dv;
    float *sq = sm, *sk = sq + BQ * D, *sv = sk + BK * (D + 1), *ss = sv + BK * Dv, *so = ss + BQ * (BK + 1);
    const int64_t bh = blockIdx.x, b = bh / d.H, h = bh % d.H, hk = h / (d.H / d.Hkv);
    const int64_t i0 = (int64_t)blockIdx.y * BQ;
    const int nq = (int)(d.Tq - i0 < BQ ? d.Tq - i0 : BQ);
    const int r = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int64_t i = i0 + r, L = r < nq ? last_key(d, i) : -1;
    stage(sq, D, q, row_at(q, b, h, i0), q.s[2], nq, D);
    for (int64_t e = threadIdx.x; e < BQ * Dv; e += ATT_THREADS) so[e] = 0.0f;
    __syncthreads(); /* O is read below even when no key tile runs */
    float m = -INFINITY, l = 0.0f;
    const int64_t kend = last_key(d, i0 + nq - 1) + 1; /* the keys the tile's last query sees */
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        const int nk = (int)(kend - j0 < BK ? kend - j0 : BK);
        __syncthreads(); /* the previous tile's K, V and S are no longer read */
        stage(sk, D + 1, k, row_at(k, b, hk, j0), k.s[2], nk, D);
        stage(sv, Dv, v, row_at(v, b, hk, j0), v.s[2], nk, Dv);
        __syncthreads();
        float sc[BK / TPR];
        for (int t = 0; t < BK / TPR; t++) {
            const int c = sub + TPR * t;
            sc[t] = c < nk && j0 + c <= L ? dot(sq + r * D, sk + c * (D + 1), D) * d.scale : -INFINITY;
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
    const float inv = l > 0.0f ? 1.0f / l : 0.0f; /* a row that sees no key: O is 0 */
    const int64_t orow = row_at(o, b, h, i);
    for (int64_t e = sub; e < Dv; e += TPR) store(o, orow + e, so[r * Dv + e] * inv);
    if (sub == 0) lse[bh * d.Tq + i] = lse_of(m, l);
}

/* ---- backward */

/* delta [B*H*Tq] (f32): delta_i = sum_e dO_ie O_ie, which equals
 * sum_j P_ij dP_ij without P. One warp per row. */
enum { DELTA_ROWS = ATT_THREADS / 32 };

__global__ void __launch_bounds__(ATT_THREADS) sdpa_delta_k(float *delta, elems go, elems o, accel_k_sdpa_dims d) {
    const int64_t row = (int64_t)blockIdx.x * DELTA_ROWS + threadIdx.x / 32;
    if (row >= d.B * d.H * d.Tq) return; /* the whole warp: its lanes share the row */
    const int64_t bh = row / d.Tq, i = row % d.Tq, b = bh / d.H, h = bh % d.H;
    const int64_t gr = row_at(go, b, h, i), orow = row_at(o, b, h, i);
    float acc = 0.0f;
    for (int64_t e = threadIdx.x % 32; e < d.Dv; e += 32) acc += load(go, gr + e) * load(o, orow + e);
    acc = warp_sum(acc);
    if (threadIdx.x % 32 == 0) delta[row] = acc;
}

/* Shared memory of the query pass: Q [BQ][D], dO [BQ][Dv], K [BK][D+1],
 * V [BK][Dv+1], dS [BQ][BK+1], dQ [BQ][D]. */
static size_t bwd_q_smem(const accel_k_sdpa_dims *d) {
    return sizeof(float) * (size_t)(2 * BQ * d->D + BQ * d->Dv + BK * (d->D + 1) + BK * (d->Dv + 1) + BQ * (BK + 1));
}

/* dq (dq_beta 0 overwrites, 1 adds) of the tile of queries blockIdx.y of
 * head blockIdx.x. */
__global__ void __launch_bounds__(ATT_THREADS)
    sdpa_bwd_q_k(elems dq, const float *lse, const float *delta, elems go, elems q, elems k, elems v,
                 accel_k_sdpa_dims d, float dq_beta) {
    extern __shared__ float sm[];
    const int64_t D = d.D, Dv = d.Dv;
    float *sq = sm, *sg = sq + BQ * D, *sk = sg + BQ * Dv, *sv = sk + BK * (D + 1), *ss = sv + BK * (Dv + 1);
    float *sdq = ss + BQ * (BK + 1);
    const int64_t bh = blockIdx.x, b = bh / d.H, h = bh % d.H, hk = h / (d.H / d.Hkv);
    const int64_t i0 = (int64_t)blockIdx.y * BQ;
    const int nq = (int)(d.Tq - i0 < BQ ? d.Tq - i0 : BQ);
    const int r = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int64_t i = i0 + r, L = r < nq ? last_key(d, i) : -1;
    const float li = r < nq ? lse[bh * d.Tq + i] : -INFINITY, dl = r < nq ? delta[bh * d.Tq + i] : 0.0f;
    stage(sq, D, q, row_at(q, b, h, i0), q.s[2], nq, D);
    stage(sg, Dv, go, row_at(go, b, h, i0), go.s[2], nq, Dv);
    for (int64_t e = threadIdx.x; e < BQ * D; e += ATT_THREADS) sdq[e] = 0.0f;
    __syncthreads(); /* dQ is read below even when no key tile runs */
    const int64_t kend = last_key(d, i0 + nq - 1) + 1;
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        const int nk = (int)(kend - j0 < BK ? kend - j0 : BK);
        __syncthreads(); /* the previous tile's K, V and dS are no longer read */
        stage(sk, D + 1, k, row_at(k, b, hk, j0), k.s[2], nk, D);
        stage(sv, Dv + 1, v, row_at(v, b, hk, j0), v.s[2], nk, Dv);
        __syncthreads();
        for (int t = 0; t < BK / TPR; t++) {
            const int c = sub + TPR * t;
            float ds = 0.0f;
            if (c < nk && j0 + c <= L) {
                const float pij = prob(dot(sq + r * D, sk + c * (D + 1), D) * d.scale, li, true);
                ds = pij * (dot(sg + r * Dv, sv + c * (Dv + 1), Dv) - dl);
            }
            ss[r * (BK + 1) + c] = ds;
        }
        __syncwarp(); /* the row's dS entries come from its own TPR threads, in this warp */
        for (int64_t e = sub; e < D; e += TPR) {
            float acc = sdq[r * D + e];
            for (int c = 0; c < nk; c++) acc += ss[r * (BK + 1) + c] * sk[c * (D + 1) + e];
            sdq[r * D + e] = acc;
        }
    }
    if (r >= nq) return;
    const int64_t dqr = row_at(dq, b, h, i);
    for (int64_t e = sub; e < D; e += TPR) {
        float val = d.scale * sdq[r * D + e];
        store(dq, dqr + e, dq_beta == 0.0f ? val : load(dq, dqr + e) + val);
    }
}

/* Shared memory of the key pass: K [BK][D+1], V [BK][Dv+1], Q [BQ][D+1],
 * dO [BQ][Dv+1], P and dS [BQ][BK+1] each, dK [BK][D], dV [BK][Dv]. */
static size_t bwd_kv_smem(const accel_k_sdpa_dims *d) {
    return sizeof(float) * (size_t)((BK + BQ) * (d->D + 1) + (BK + BQ) * (d->Dv + 1) + 2 * BQ * (BK + 1) +
                                    BK * d->D + BK * d->Dv);
}

/* dk, dv (each optional; added into, or written where `overwrite`: one
 * block writes each element once) of the kv head b*Hkv + kv of blockIdx.x
 * for its tile of keys blockIdx.y. Thread layout: key c = threadIdx.x / TPR
 * of the tile. */
__global__ void __launch_bounds__(ATT_THREADS)
    sdpa_bwd_kv_k(elems dk, elems dv, const float *lse, const float *delta, elems go, elems q, elems k, elems v,
                  accel_k_sdpa_dims d, bool overwrite) {
    extern __shared__ float sm[];
    const int64_t D = d.D, Dv = d.Dv, G = d.H / d.Hkv;
    float *sk = sm, *sv = sk + BK * (D + 1), *sq = sv + BK * (Dv + 1), *sg = sq + BQ * (D + 1);
    float *sp = sg + BQ * (Dv + 1), *sds = sp + BQ * (BK + 1), *sdk = sds + BQ * (BK + 1), *sdv = sdk + BK * D;
    const int64_t kvb = blockIdx.x, b = kvb / d.Hkv, kv = kvb % d.Hkv, j0 = (int64_t)blockIdx.y * BK;
    const int nk = (int)(d.Tk - j0 < BK ? d.Tk - j0 : BK);
    const int c = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int64_t j = j0 + c;
    stage(sk, D + 1, k, row_at(k, b, kv, j0), k.s[2], nk, D);
    stage(sv, Dv + 1, v, row_at(v, b, kv, j0), v.s[2], nk, Dv);
    for (int64_t e = threadIdx.x; e < BK * D; e += ATT_THREADS) sdk[e] = 0.0f;
    for (int64_t e = threadIdx.x; e < BK * Dv; e += ATT_THREADS) sdv[e] = 0.0f;
    for (int64_t gi = 0; gi < G; gi++) {
        const int64_t h = kv * G + gi, bh = b * d.H + h;
        for (int64_t i0 = first_query(d, j0); i0 < d.Tq; i0 += BQ) {
            const int nq = (int)(d.Tq - i0 < BQ ? d.Tq - i0 : BQ);
            __syncthreads(); /* K, V staged; the previous tile's Q, dO, P and dS no longer read */
            stage(sq, D + 1, q, row_at(q, b, h, i0), q.s[2], nq, D);
            stage(sg, Dv + 1, go, row_at(go, b, h, i0), go.s[2], nq, Dv);
            __syncthreads();
            /* P and dS of (query rr, key c) for rr = sub + TPR t. */
            for (int t = 0; t < BQ / TPR; t++) {
                const int rr = sub + TPR * t;
                const int64_t i = i0 + rr;
                float pij = 0.0f, ds = 0.0f;
                if (rr < nq && c < nk && j <= last_key(d, i)) {
                    const int64_t row = bh * d.Tq + i;
                    pij = prob(dot(sq + rr * (D + 1), sk + c * (D + 1), D) * d.scale, lse[row], true);
                    if (dk.p) ds = pij * (dot(sg + rr * (Dv + 1), sv + c * (Dv + 1), Dv) - delta[row]);
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
                for (int rr = 0; rr < nq; rr++) acc += sds[rr * (BK + 1) + c] * sq[rr * (D + 1) + e];
                sdk[c * D + e] = acc;
            }
        }
    }
    if (c >= nk) return;
    const int64_t kr = row_at(dk, b, kv, j), vr = row_at(dv, b, kv, j);
    for (int64_t e = sub; dk.p && e < D; e += TPR) add_or_store(dk, kr + e, d.scale * sdk[c * D + e], overwrite);
    for (int64_t e = sub; dv.p && e < Dv; e += TPR) add_or_store(dv, vr + e, sdv[c * Dv + e], overwrite);
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

/* Query pass: Q [TQ][D], dO [TQ][Dv], K [TK][D], V [TK][Dv], dS [TQ][TK]
 * (16-bit), S then dP [TQ][TK] (one region: P is taken from S into
 * registers before dP is computed) and dQ [TQ][D] (f32). */
enum { QQ, QG, QK, QV, QDS, QS, QDQ, Q_REGIONS };

__host__ __device__ inline tc_smem bwd_q_tc_smem_of(int D, int Dv) {
    const smem_region r[Q_REGIONS] = {{TQ, D, 2},  {TQ, Dv, 2}, {TK, D, 2}, {TK, Dv, 2},
                                      {TQ, TK, 2}, {TQ, TK, 4}, {TQ, D, 4}};
    return tc_smem_of(Q_REGIONS, r);
}

/* Key pass: K [TK][D], V [TK][Dv], Q [TQ][D], dO [TQ][Dv], P then dS
 * [TQ][TK] (16-bit, one region: dS is written once dV's product P^T dO has
 * read P), S then dP [TQ][TK] (as in the query pass), dK [TK][D] and dV [TK][Dv]
 * (f32). */
enum { KK, KV, KQ, KG, KP, KS, KDK, KDV, K_REGIONS };

__host__ __device__ inline tc_smem bwd_kv_tc_smem_of(int D, int Dv) {
    const smem_region r[K_REGIONS] = {{TK, D, 2},  {TK, Dv, 2}, {TQ, D, 2}, {TQ, Dv, 2},
                                      {TQ, TK, 2}, {TQ, TK, 4}, {TK, D, 4}, {TK, Dv, 4}};
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
 * query row. q, k, v of dtype T. */
template <typename T>
__global__ void __launch_bounds__(TC_THREADS)
    sdpa_fwd_tc_k(elems o, float *lse, elems q, elems k, elems v, accel_k_sdpa_dims d) {
    extern __shared__ __align__(128) unsigned char tc_sm[];
    const int D = (int)d.D, Dv = (int)d.Dv;
    const tc_smem m = fwd_tc_smem_of(D, Dv);
    T *sq = (T *)(tc_sm + m.off[FQ]), *sk = (T *)(tc_sm + m.off[FK]), *sv = (T *)(tc_sm + m.off[FV]);
    T *sp = (T *)(tc_sm + m.off[FP]);
    float *ss = (float *)(tc_sm + m.off[FS]), *so = (float *)(tc_sm + m.off[FO]);
    const int ldq = m.ld[FQ], ldk = m.ld[FK], ldv = m.ld[FV], ldp = m.ld[FP], lds = m.ld[FS], ldo = m.ld[FO];
    const int64_t bh = blockIdx.x, b = bh / d.H, h = bh % d.H, hk = h / (d.H / d.Hkv);
    const int64_t i0 = (int64_t)blockIdx.y * TQ;
    const int nq = (int)(d.Tq - i0 < TQ ? d.Tq - i0 : TQ);
    const int r = threadIdx.x / TC_TPR, sub = threadIdx.x % TC_TPR;
    const int64_t i = i0 + r, L = r < nq ? last_key(d, i) : -1;
    stage_half(sq, ldq, (const T *)q.p, row_at(q, b, h, i0), q.s[2], nq, TQ, D);
    zero_f32(so, TQ * ldo);
    float mx = -INFINITY, l = 0.0f;
    const int64_t kend = last_key(d, i0 + nq - 1) + 1; /* the keys the tile's last query sees */
    for (int64_t j0 = 0; j0 < kend; j0 += TK) {
        const int nk = (int)(kend - j0 < TK ? kend - j0 : TK);
        __syncthreads(); /* Q and O staged; the previous tile's K, V and P no longer read */
        stage_half(sk, ldk, (const T *)k.p, row_at(k, b, hk, j0), k.s[2], nk, TK, D);
        stage_half(sv, ldv, (const T *)v.p, row_at(v, b, hk, j0), v.s[2], nk, TK, Dv);
        __syncthreads();
        tile_mma<wmma::row_major, wmma::col_major>(ss, lds, sq, ldq, sk, ldk, TQ / FR, TK / FR, D / FR, false);
        __syncthreads(); /* S complete */
        float sc[TK / TC_TPR];
        for (int t = 0; t < TK / TC_TPR; t++) {
            const int c = sub + TC_TPR * t;
            sc[t] = c < nk && j0 + c <= L ? ss[r * lds + c] * d.scale : -INFINITY;
        }
        const float corr = online_softmax<TC_TPR>(sc, mx, l);
        for (int t = 0; t < TK / TC_TPR; t++) sp[r * ldp + sub + TC_TPR * t] = to_half<T>(sc[t]);
        for (int e = sub; e < Dv; e += TC_TPR) so[r * ldo + e] *= corr;
        __syncthreads(); /* P written, O rescaled */
        tile_mma<wmma::row_major, wmma::row_major>(so, ldo, sp, ldp, sv, ldv, TQ / FR, Dv / FR, TK / FR, true);
    }
    __syncthreads(); /* O's fragments come from every warp */
    if (r >= nq) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f; /* a row that sees no key: O is 0 */
    const int64_t orow = row_at(o, b, h, i);
    for (int e = sub; e < Dv; e += TC_TPR) store(o, orow + e, so[r * ldo + e] * inv);
    if (sub == 0) lse[bh * d.Tq + i] = lse_of(mx, l);
}

/* The backward's query pass on tensor cores: as sdpa_bwd_q_k, with S = Q K^T,
 * dP = dO V^T and dQ += dS K on fragments (dS rounded to T), TC_TPR threads
 * per query row, each holding its row's P of the key tile in registers
 * while dP takes S's memory. q, k, v, dO of dtype T. */
template <typename T>
__global__ void __launch_bounds__(TC_THREADS)
    sdpa_bwd_q_tc_k(elems dq, const float *lse, const float *delta, elems go, elems q, elems k, elems v,
                    accel_k_sdpa_dims d, float dq_beta) {
    extern __shared__ __align__(128) unsigned char tc_sm[];
    const int D = (int)d.D, Dv = (int)d.Dv;
    const tc_smem m = bwd_q_tc_smem_of(D, Dv);
    T *sq = (T *)(tc_sm + m.off[QQ]), *sg = (T *)(tc_sm + m.off[QG]), *sk = (T *)(tc_sm + m.off[QK]);
    T *sv = (T *)(tc_sm + m.off[QV]), *sds = (T *)(tc_sm + m.off[QDS]);
    float *ss = (float *)(tc_sm + m.off[QS]), *sdq = (float *)(tc_sm + m.off[QDQ]);
    const int ldq = m.ld[QQ], ldg = m.ld[QG], ldk = m.ld[QK], ldv = m.ld[QV], ldds = m.ld[QDS], lds = m.ld[QS];
    const int lddq = m.ld[QDQ];
    const int64_t bh = blockIdx.x, b = bh / d.H, h = bh % d.H, hk = h / (d.H / d.Hkv);
    const int64_t i0 = (int64_t)blockIdx.y * TQ;
    const int nq = (int)(d.Tq - i0 < TQ ? d.Tq - i0 : TQ);
    const int r = threadIdx.x / TC_TPR, sub = threadIdx.x % TC_TPR;
    const int64_t i = i0 + r, L = r < nq ? last_key(d, i) : -1;
    const float li = r < nq ? lse[bh * d.Tq + i] : -INFINITY, dl = r < nq ? delta[bh * d.Tq + i] : 0.0f;
    stage_half(sq, ldq, (const T *)q.p, row_at(q, b, h, i0), q.s[2], nq, TQ, D);
    stage_half(sg, ldg, (const T *)go.p, row_at(go, b, h, i0), go.s[2], nq, TQ, Dv);
    zero_f32(sdq, TQ * lddq);
    const int64_t kend = last_key(d, i0 + nq - 1) + 1;
    for (int64_t j0 = 0; j0 < kend; j0 += TK) {
        const int nk = (int)(kend - j0 < TK ? kend - j0 : TK);
        __syncthreads(); /* Q, dO and dQ staged; the previous tile's K, V and dS no longer read */
        stage_half(sk, ldk, (const T *)k.p, row_at(k, b, hk, j0), k.s[2], nk, TK, D);
        stage_half(sv, ldv, (const T *)v.p, row_at(v, b, hk, j0), v.s[2], nk, TK, Dv);
        __syncthreads();
        tile_mma<wmma::row_major, wmma::col_major>(ss, lds, sq, ldq, sk, ldk, TQ / FR, TK / FR, D / FR, false);
        __syncthreads(); /* S complete */
        float pr[TK / TC_TPR];
        for (int t = 0; t < TK / TC_TPR; t++) {
            const int c = sub + TC_TPR * t;
            pr[t] = prob(ss[r * lds + c] * d.scale, li, c < nk && j0 + c <= L);
        }
        __syncthreads(); /* S read: its memory takes dP */
        tile_mma<wmma::row_major, wmma::col_major>(ss, lds, sg, ldg, sv, ldv, TQ / FR, TK / FR, Dv / FR, false);
        __syncthreads(); /* dP complete */
        for (int t = 0; t < TK / TC_TPR; t++) {
            const int c = sub + TC_TPR * t;
            sds[r * ldds + c] = to_half<T>(pr[t] * (ss[r * lds + c] - dl));
        }
        __syncthreads(); /* dS written */
        tile_mma<wmma::row_major, wmma::row_major>(sdq, lddq, sds, ldds, sk, ldk, TQ / FR, D / FR, TK / FR, true);
    }
    __syncthreads(); /* dQ's fragments come from every warp */
    if (r >= nq) return;
    const int64_t dqr = row_at(dq, b, h, i);
    for (int e = sub; e < D; e += TC_TPR) {
        float val = d.scale * sdq[r * lddq + e];
        store(dq, dqr + e, dq_beta == 0.0f ? val : load(dq, dqr + e) + val);
    }
}

/* The backward's key pass on tensor cores: as sdpa_bwd_kv_k, with S = Q K^T,
 * dP = dO V^T, dV += P^T dO and dK += dS^T Q on fragments (P and dS rounded
 * to T). In the elementwise steps thread t takes key t % TK of the tile
 * (S's reads coalesce along a row) and every KV_RSTEP-th query, holding
 * their P in registers while dP takes S's memory. q, k, v, dO of dtype T. */
enum { KV_RSTEP = TC_THREADS / TK };

template <typename T>
__global__ void __launch_bounds__(TC_THREADS)
    sdpa_bwd_kv_tc_k(elems dk, elems dv, const float *lse, const float *delta, elems go, elems q, elems k, elems v,
                     accel_k_sdpa_dims d, bool overwrite) {
    extern __shared__ __align__(128) unsigned char tc_sm[];
    const int D = (int)d.D, Dv = (int)d.Dv;
    const int64_t G = d.H / d.Hkv;
    const tc_smem m = bwd_kv_tc_smem_of(D, Dv);
    T *sk = (T *)(tc_sm + m.off[KK]), *sv = (T *)(tc_sm + m.off[KV]), *sq = (T *)(tc_sm + m.off[KQ]);
    T *sg = (T *)(tc_sm + m.off[KG]), *sp = (T *)(tc_sm + m.off[KP]);
    float *ss = (float *)(tc_sm + m.off[KS]), *sdk = (float *)(tc_sm + m.off[KDK]);
    float *sdv = (float *)(tc_sm + m.off[KDV]);
    const int ldk = m.ld[KK], ldv = m.ld[KV], ldq = m.ld[KQ], ldg = m.ld[KG], ldp = m.ld[KP], lds = m.ld[KS];
    const int lddk = m.ld[KDK], lddv = m.ld[KDV];
    const int64_t kvb = blockIdx.x, b = kvb / d.Hkv, kv = kvb % d.Hkv, j0 = (int64_t)blockIdx.y * TK;
    const int nk = (int)(d.Tk - j0 < TK ? d.Tk - j0 : TK);
    const int c = threadIdx.x % TK, r0 = threadIdx.x / TK;
    const int64_t j = j0 + c;
    stage_half(sk, ldk, (const T *)k.p, row_at(k, b, kv, j0), k.s[2], nk, TK, D);
    stage_half(sv, ldv, (const T *)v.p, row_at(v, b, kv, j0), v.s[2], nk, TK, Dv);
    if (dk.p) zero_f32(sdk, TK * lddk);
    if (dv.p) zero_f32(sdv, TK * lddv);
    for (int64_t gi = 0; gi < G; gi++) {
        const int64_t h = kv * G + gi, bh = b * d.H + h;
        for (int64_t i0 = first_query(d, j0); i0 < d.Tq; i0 += TQ) {
            const int nq = (int)(d.Tq - i0 < TQ ? d.Tq - i0 : TQ);
            __syncthreads(); /* K, V, dK and dV staged; the previous tile's Q, dO and dS no longer read */
            stage_half(sq, ldq, (const T *)q.p, row_at(q, b, h, i0), q.s[2], nq, TQ, D);
            stage_half(sg, ldg, (const T *)go.p, row_at(go, b, h, i0), go.s[2], nq, TQ, Dv);
            __syncthreads();
            tile_mma<wmma::row_major, wmma::col_major>(ss, lds, sq, ldq, sk, ldk, TQ / FR, TK / FR, D / FR, false);
            __syncthreads(); /* S complete */
            float pr[TQ / KV_RSTEP];
            for (int u = 0; u < TQ / KV_RSTEP; u++) {
                const int rr = r0 + KV_RSTEP * u;
                const int64_t i = i0 + rr;
                const bool seen = rr < nq && c < nk && j <= last_key(d, i);
                pr[u] = seen ? prob(ss[rr * lds + c] * d.scale, lse[bh * d.Tq + i], true) : 0.0f;
                sp[rr * ldp + c] = to_half<T>(pr[u]);
            }
            __syncthreads(); /* P written; S read: its memory takes dP */
            if (dv.p)
                tile_mma<wmma::col_major, wmma::row_major>(sdv, lddv, sp, ldp, sg, ldg, TK / FR, Dv / FR,
                                                           TQ / FR, true);
            if (!dk.p) continue;
            tile_mma<wmma::row_major, wmma::col_major>(ss, lds, sg, ldg, sv, ldv, TQ / FR, TK / FR, Dv / FR, false);
            __syncthreads(); /* dP complete; P read: its memory takes dS */
            for (int u = 0; u < TQ / KV_RSTEP; u++) {
                const int rr = r0 + KV_RSTEP * u;
                const float ds = rr < nq ? pr[u] * (ss[rr * lds + c] - delta[bh * d.Tq + i0 + rr]) : 0.0f;
                sp[rr * ldp + c] = to_half<T>(ds);
            }
            __syncthreads(); /* dS written */
            tile_mma<wmma::col_major, wmma::row_major>(sdk, lddk, sp, ldp, sq, ldq, TK / FR, D / FR, TQ / FR, true);
        }
    }
    __syncthreads(); /* dK's and dV's fragments come from every warp */
    const int kc = threadIdx.x / TC_TPR, sub = threadIdx.x % TC_TPR;
    if (kc >= nk) return;
    const int64_t kr = row_at(dk, b, kv, j0 + kc), vr = row_at(dv, b, kv, j0 + kc);
    for (int e = sub; dk.p && e < D; e += TC_TPR) add_or_store(dk, kr + e, d.scale * sdk[kc * lddk + e], overwrite);
    for (int e = sub; dv.p && e < Dv; e += TC_TPR) add_or_store(dv, vr + e, sdv[kc * lddv + e], overwrite);
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

/* The strides s of `what` as kernels.h promises them (and the CPU kernels
 * check them): none negative, rows of n elements at least a row apart, so
 * that no two rows written overlap; an error naming the tensor otherwise. */
static bool rows_fit(const char *op, const char *what, const int64_t s[3], int64_t n) {
    if (s[0] >= 0 && s[1] >= 0 && s[2] >= n) return true;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s's strides (%lld, %lld, %lld) do not fit rows of %lld elements", op,
                    what, (long long)s[0], (long long)s[1], (long long)s[2], (long long)n);
    return false;
}

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
    sdpa_fwd_tc_k<T><<<grid, TC_THREADS, bytes, s>>>(elems_of(k->o, d->os), (float *)k->lse->data,
                                                     elems_of(k->q, d->qs), elems_of(k->k, d->ks),
                                                     elems_of(k->v, d->vs), *d);
    return launched(index, "sdpa");
}

extern "C" accel_status accel__cudak_sdpa(accel_k_sdpa *k) {
    int index = k->o->device.index;
    const accel_k_sdpa_dims *d = &k->dims;
    if (!rows_fit("sdpa", "q", d->qs, d->D) || !rows_fit("sdpa", "k", d->ks, d->D) ||
        !rows_fit("sdpa", "v", d->vs, d->Dv) || !rows_fit("sdpa", "o", d->os, d->Dv))
        return accel_last_status();
    if (!d->B || !d->H || !d->Tq) return ACCEL_OK; /* Dv 0 still has an lse per row */
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
    sdpa_fwd_k<<<grid, ATT_THREADS, bytes, s>>>(elems_of(k->o, d->os), (float *)k->lse->data, elems_of(k->q, d->qs),
                                                elems_of(k->k, d->ks), elems_of(k->v, d->vs), *d);
    return launched(index, "sdpa");
}

/* The backward's tensors as its kernels take them, and delta [B*H*Tq]. */
struct bwd_operands {
    elems dq, dk, dv, go, q, k, v, o;
    const float *lse, *delta;
};

template <typename T>
static accel_status bwd_q_tc(const accel_k_sdpa_backward *k, const bwd_operands &x, cudaStream_t s, int index,
                             size_t bytes, size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_q_tc_k<T>, bytes, limit, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->H), tiles(d->Tq, TQ));
    sdpa_bwd_q_tc_k<T><<<grid, TC_THREADS, bytes, s>>>(x.dq, x.lse, x.delta, x.go, x.q, x.k, x.v, *d, k->dq_beta);
    return launched(index, "sdpa_backward");
}

template <typename T>
static accel_status bwd_kv_tc(const accel_k_sdpa_backward *k, const bwd_operands &x, cudaStream_t s, int index,
                              size_t bytes, size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_kv_tc_k<T>, bytes, limit, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->Hkv), tiles(d->Tk, TK));
    sdpa_bwd_kv_tc_k<T><<<grid, TC_THREADS, bytes, s>>>(x.dk, x.dv, x.lse, x.delta, x.go, x.q, x.k, x.v, *d,
                                                        k->dkv_overwrite);
    return launched(index, "sdpa_backward");
}

/* dq: the query pass, on tensor cores when tdt is 16-bit and its tiles fit. */
static accel_status bwd_q(const accel_k_sdpa_backward *k, const bwd_operands &x, accel_dtype tdt, cudaStream_t s,
                          int index, size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    const size_t tc_bytes = tdt == ACCEL_F32 ? 0 : bwd_q_tc_smem_of((int)d->D, (int)d->Dv).bytes;
    if (tdt != ACCEL_F32 && tc_bytes <= limit)
        return tdt == ACCEL_BF16 ? bwd_q_tc<__nv_bfloat16>(k, x, s, index, tc_bytes, limit)
                                 : bwd_q_tc<__half>(k, x, s, index, tc_bytes, limit);
    size_t bytes = bwd_q_smem(d);
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_q_k, bytes, limit, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->H), tiles(d->Tq, BQ));
    sdpa_bwd_q_k<<<grid, ATT_THREADS, bytes, s>>>(x.dq, x.lse, x.delta, x.go, x.q, x.k, x.v, *d, k->dq_beta);
    return launched(index, "sdpa_backward");
}

/* dk and dv: the key pass, on tensor cores when tdt is 16-bit and its tiles fit. */
static accel_status bwd_kv(const accel_k_sdpa_backward *k, const bwd_operands &x, accel_dtype tdt, cudaStream_t s,
                           int index, size_t limit) {
    const accel_k_sdpa_dims *d = &k->dims;
    const size_t tc_bytes = tdt == ACCEL_F32 ? 0 : bwd_kv_tc_smem_of((int)d->D, (int)d->Dv).bytes;
    if (tdt != ACCEL_F32 && tc_bytes <= limit)
        return tdt == ACCEL_BF16 ? bwd_kv_tc<__nv_bfloat16>(k, x, s, index, tc_bytes, limit)
                                 : bwd_kv_tc<__half>(k, x, s, index, tc_bytes, limit);
    size_t bytes = bwd_kv_smem(d);
    accel_status st = shared_memory(index, (const void *)sdpa_bwd_kv_k, bytes, limit, d, "sdpa_backward");
    if (st != ACCEL_OK) return st;
    dim3 grid((unsigned)(d->B * d->Hkv), tiles(d->Tk, BK));
    sdpa_bwd_kv_k<<<grid, ATT_THREADS, bytes, s>>>(x.dk, x.dv, x.lse, x.delta, x.go, x.q, x.k, x.v, *d,
                                                   k->dkv_overwrite);
    return launched(index, "sdpa_backward");
}

extern "C" accel_status accel__cudak_sdpa_backward(accel_k_sdpa_backward *k) {
    int index = k->g->device.index;
    const accel_k_sdpa_dims *d = &k->dims;
    static const char *OP = "sdpa_backward";
    if (!k->o || !k->lse)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the forward's o and lse are required", OP);
    if (!rows_fit(OP, "q", d->qs, d->D) || !rows_fit(OP, "k", d->ks, d->D) || !rows_fit(OP, "v", d->vs, d->Dv) ||
        !rows_fit(OP, "o", d->os, d->Dv) || !rows_fit(OP, "g", k->gs, d->Dv) ||
        (k->dq && !rows_fit(OP, "dq", k->dqs, d->D)) || (k->dk && !rows_fit(OP, "dk", k->dks, d->D)) ||
        (k->dv && !rows_fit(OP, "dv", k->dvs, d->Dv)))
        return accel_last_status();
    if (!d->B || !d->H || !d->Tq) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    size_t limit = 0;
    accel_status st = smem_limit(index, "sdpa_backward", &limit);
    if (st != ACCEL_OK) return st;
    const accel_tensor *in[4] = {k->q, k->k, k->v, k->g};
    const accel_dtype tdt = tc_dtype(d, in, 4);
    bwd_operands x = {elems_of(k->dq, k->dqs), elems_of(k->dk, k->dks), elems_of(k->dv, k->dvs),
                      elems_of(k->g, k->gs),   elems_of(k->q, d->qs),   elems_of(k->k, d->ks),
                      elems_of(k->v, d->vs),   elems_of(k->o, d->os),   (const float *)k->lse->data,
                      NULL};
    if (k->dq || k->dk) { /* delta, which both passes read, before either runs */
        const int64_t rows = d->B * d->H * d->Tq;
        float *delta = (float *)accel__cuda_step_alloc(index, (size_t)rows * sizeof(float), 256);
        if (!delta) return accel_last_status();
        sdpa_delta_k<<<tiles(rows, DELTA_ROWS), ATT_THREADS, 0, s>>>(delta, x.go, x.o, *d);
        if ((st = launched(index, "sdpa_backward")) != ACCEL_OK) return st;
        x.delta = delta;
    }
    if (k->dq && (st = bwd_q(k, x, tdt, s, index, limit)) != ACCEL_OK) return st;
    if ((!k->dk && !k->dv) || !d->Tk) return ACCEL_OK; /* no key: dK and dV have no rows */
    return bwd_kv(k, x, tdt, s, index, limit);
}
