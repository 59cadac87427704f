/* Scaled dot-product attention with grouped-query heads and a bottom-right
 * aligned causal mask: f32 scores, softmax and accumulation. q, k, v, the
 * output, the output's gradient and dq, dk, dv are each f32, bf16 or f16.
 * Two paths for the six tile GEMMs of a block of queries:
 *   - the native path (below, "the tile GEMMs on bf16/f16 operands"), where
 *     oneDNN multiplies the operands' bf16/f16 dtype itself on this CPU and
 *     the blocks are whole: every GEMM in that dtype reading q, k, v and dO
 *     as stored, P and dS rounded to it for the GEMMs that take them;
 *   - the f32 tiles elsewhere: a bf16/f16 tensor is read and written a tile
 *     at a time (one head's keys and values, one block of queries) through
 *     per-thread f32 scratch with the vectorised conversions of
 *     fused_kernels.c, never as a whole-tensor f32 copy, f32 tensors in
 *     place, on OpenBLAS's sgemm.
 * Gradients are accumulated in f32 tiles on both. The forward keeps the
 * softmax probabilities P [B, H, Tq, Tk] (f32) for the backward (under the
 * causal mask only the blocks left of the diagonal are written and read).
 * Heads run in parallel by kv head (its K and V read once for the H / Hkv
 * query heads that share them, forward and backward alike), one OpenMP
 * thread per kv head calling single-threaded GEMMs on blocks of queries;
 * with too few kv heads the forward runs query heads in parallel instead,
 * and with too few heads of either kind they run one after another and
 * each GEMM is split across the threads. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "gemm.h"

/* Queries per block. Under the causal mask the query block [i0, i0+QB) sees
 * keys [0, last_key(i0+QB-1)] only, so the GEMMs skip the masked upper
 * triangle (62% of the square work at T = 4 QB, 53% at 16 QB). */
enum { QB = 64 };

/* Last key query i may see (inclusive); -1 when none. */
static inline int64_t last_key(const accel_k_sdpa_dims *d, int64_t i) {
    if (!d->causal) return d->Tk - 1;
    int64_t l = i + d->Tk - d->Tq;
    return l < -1 ? -1 : l < d->Tk - 1 ? l : d->Tk - 1;
}

/* Keys the query block starting at i0 (nq rows) needs: [0, kend). */
static inline int64_t block_keys(const accel_k_sdpa_dims *d, int64_t i0, int64_t nq) {
    return last_key(d, i0 + nq - 1) + 1;
}

/* ---- tiles: rows of a tensor as f32 */

/* A tile of `rows` rows of `cols` elements of t, row r at element off + r *
 * stride, as f32 with row stride ld: t's own memory when t is f32, else the
 * caller's scratch (rows x cols, dense). */
typedef struct tile {
    float *p;
    int64_t ld;
} tile;

static tile tile_at(const accel_tensor *t, int64_t off, int64_t stride, float *scratch, int64_t cols) {
    if (t->dtype == ACCEL_F32) return (tile){(float *)t->data + off, stride};
    return (tile){scratch, cols};
}

static void *elem_ptr(const accel_tensor *t, int64_t off) {
    return (char *)t->data + off * (int64_t)accel_dtype_size(t->dtype);
}

/* tile_at, with the scratch filled from t (read, or read then updated). */
static tile tile_load(const accel_tensor *t, int64_t off, int64_t rows, int64_t cols, int64_t stride,
                      float *scratch) {
    tile w = tile_at(t, off, stride, scratch, cols);
    if (t->dtype == ACCEL_F32) return w;
    if (stride == cols) {
        accel__cpu_to_f32(scratch, elem_ptr(t, off), t->dtype, rows * cols);
        return w;
    }
    for (int64_t r = 0; r < rows; r++) accel__cpu_to_f32(scratch + r * cols, elem_ptr(t, off + r * stride), t->dtype, cols);
    return w;
}

/* Writes a dense tile (stride == cols) that tile_at gave back into t: nothing
 * to do when it is t's own memory. */
static void tile_store(accel_tensor *t, int64_t off, int64_t rows, int64_t cols, tile w) {
    if (t->dtype != ACCEL_F32) accel__cpu_from_f32(elem_ptr(t, off), t->dtype, w.p, rows * cols);
}

/* Floats of scratch a tile of n elements of t needs (0 when t is f32 or absent). */
static int64_t scratch_of(const accel_tensor *t, int64_t n) {
    return t && t->dtype != ACCEL_F32 ? n : 0;
}

/* ---- the tile GEMMs on bf16/f16 operands as stored
 *
 * Where oneDNN multiplies the operands' bf16/f16 dtype itself (its units,
 * not f32 panels per call), all six tile GEMMs run on it in that dtype with
 * f32 accumulation, reading q, k, v and dO as stored (none of them widened):
 * S = s Q K^T and dP = dO V^T multiply two tensors of that dtype, and each
 * product of two such values is exact in f32, so they give the f32 tiles'
 * values up to the order of the additions; O = P V, dV += P^T dO,
 * dQ = s dS K and dK += s dS^T Q take P and dS rounded once to the dtype
 * (as PyTorch's CPU flash attention and FlashAttention do), the softmax,
 * its gradient and every accumulator staying f32 (P kept for the backward
 * is the f32 one). The GEMMs run only on whole query blocks (Tq and Tk
 * multiples of QB) and with the keys cut into chunks of at most KC, so
 * each is a QB x (64 .. KC) x D(v) GEMM with leading dims fixed per
 * sequence length: oneDNN makes and keeps a primitive per shape and
 * leading dims (~0.1-1 ms of JIT each, in a table of 512 that the linear
 * layers share), and decode's or ragged blocks' shapes, new at every
 * length, would fill it. Everywhere else the tiles are f32 on OpenBLAS. */
enum { KC = 256 };

bool accel__cpu_sdpa_native(accel_dtype dt, const accel_k_sdpa_dims *d) {
    return d->Tq % QB == 0 && d->Tk % QB == 0 && dt != ACCEL_F32 && !accel__gemm_widens_per_call(dt) &&
           accel__gemm_provider_for(dt, false, true, QB, KC, d->D) == ACCEL__GEMM_PROVIDER_DNNL;
}

/* The dtype every operand of a tile GEMM shares on the native path, or
 * ACCEL_F32 (the f32 tiles) when they differ or the path is not taken. */
static accel_dtype native_dtype(const accel_tensor *const *t, int n, const accel_k_sdpa_dims *d) {
    for (int i = 1; i < n; i++)
        if (t[i]->dtype != t[0]->dtype) return ACCEL_F32;
    return accel__cpu_sdpa_native(t[0]->dtype, d) ? t[0]->dtype : ACCEL_F32;
}

/* Which dim of a tile GEMM runs over the block's kend keys (cut into KC
 * chunks); the others are the block's QB queries and a head dim n:
 *   KEYS_N  C [QB, kend]  = alpha A [QB, n] B [kend, n]^T        (S, dP)
 *   KEYS_K  C [QB, n]     = alpha A [QB, kend] B [kend, n] + beta C   (O, dQ)
 *   KEYS_M  C [kend, n]  += alpha A [QB, kend]^T B [QB, n]       (dV, dK; beta 1) */
typedef enum keys_dim { KEYS_N, KEYS_K, KEYS_M } keys_dim;

/* One of those on oneDNN, A and B of dtype dt (row strides lda, ldb), C f32
 * (row stride ldc). */
static accel_status tiles_gemm(keys_dim kd, accel_dtype dt, int64_t kend, int64_t n, float alpha, const void *A,
                               int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    size_t es = accel_dtype_size(dt);
    for (int64_t j = 0; j < kend; j += KC) {
        int64_t c = kend - j < KC ? kend - j : KC;
        /* A's chunk starts j columns in (KEYS_K, KEYS_M), B's j rows down (KEYS_N, KEYS_K) */
        const char *a = (const char *)A + (size_t)(kd == KEYS_N ? 0 : j) * es;
        const char *b = (const char *)B + (size_t)(kd == KEYS_M ? 0 : j * ldb) * es;
        accel_status st;
        if (kd == KEYS_N)
            st = accel__gemm_on(ACCEL__GEMM_PROVIDER_DNNL, false, true, QB, c, n, alpha, a, dt, lda, b, dt, ldb, beta,
                                C + j, ldc);
        else if (kd == KEYS_K)
            st = accel__gemm_on(ACCEL__GEMM_PROVIDER_DNNL, false, false, QB, n, c, alpha, a, dt, lda, b, dt, ldb,
                                j ? 1.0f : beta, C, ldc);
        else
            st = accel__gemm_on(ACCEL__GEMM_PROVIDER_DNNL, true, false, c, n, QB, alpha, a, dt, lda, b, dt, ldb, beta,
                                C + j * ldc, ldc);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

/* dst [QB, kend] of dtype dt = src [QB, kend] rounded to nearest even, both
 * with row stride ld. */
static void round_block(void *dst, accel_dtype dt, const float *src, int64_t kend, int64_t ld) {
    size_t es = accel_dtype_size(dt);
    if (kend == ld) {
        accel__cpu_from_f32(dst, dt, src, QB * ld);
        return;
    }
    for (int64_t r = 0; r < QB; r++) accel__cpu_from_f32((char *)dst + (size_t)(r * ld) * es, dt, src + r * ld, kend);
}

/* Floats that n elements of dtype dt take (scratch is counted in floats). */
static int64_t floats_of(accel_dtype dt, int64_t n) {
    return ((int64_t)accel_dtype_size(dt) * n + 3) / 4;
}

/* The first error of a parallel loop (each thread's error state is its
 * own), kept with its message to be raised on the calling thread. */
typedef struct first_error {
    accel_status st;
    char msg[512];
} first_error;

static void keep_error(first_error *e, accel_status st) {
    if (st == ACCEL_OK) return;
#pragma omp critical(accel_sdpa_first_error)
    if (e->st == ACCEL_OK) {
        e->st = st;
        snprintf(e->msg, sizeof e->msg, "%s", accel_last_error());
    }
}

static accel_status raise_error(const first_error *e) {
    return e->st == ACCEL_OK ? ACCEL_OK : accel_set_error(e->st, "%s", e->msg);
}

/* ---- forward */

/* Masked softmax of nq score rows (query i0 + r) over their first kend
 * columns, in place (row stride ld). Columns past a row's last key are set
 * to 0 up to kend; a row that sees no key is all zeros. */
static void masked_softmax(const accel_k_sdpa_dims *d, int64_t i0, int64_t nq, int64_t kend, float *p, int64_t ld) {
    for (int64_t r = 0; r < nq; r++) {
        float *row = p + r * ld;
        int64_t n = last_key(d, i0 + r) + 1;
        if (n > 0) accel__cpu_softmax_row(row, n);
        for (int64_t j = n < 0 ? 0 : n; j < kend; j++) row[j] = 0.0f;
    }
}

/* One thread's scratch of the forward: on the f32 tiles, the head's K
 * [Tk, D] and V [Tk, Dv] and a block's Q [QB, D], each only when that
 * tensor is not f32; on the native path (lp, the operands' dtype) instead a
 * block's P rounded to lp [QB, Tk]; a block's O [QB, Dv] when O is not f32. */
typedef struct fwd_scratch {
    float *k, *v, *q, *o;
    void *pl;
} fwd_scratch;

static int64_t fwd_scratch_floats(const accel_k_sdpa *a, accel_dtype lp) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t o = scratch_of(a->o, QB * d->Dv);
    if (lp != ACCEL_F32) return floats_of(lp, QB * d->Tk) + o;
    return scratch_of(a->k, d->Tk * d->D) + scratch_of(a->v, d->Tk * d->Dv) + scratch_of(a->q, QB * d->D) + o;
}

static fwd_scratch fwd_scratch_at(const accel_k_sdpa *a, accel_dtype lp, float *base) {
    const accel_k_sdpa_dims *d = &a->dims;
    fwd_scratch s = {0};
    if (lp != ACCEL_F32) {
        s.pl = base;
        s.o = base + floats_of(lp, QB * d->Tk);
        return s;
    }
    s.k = base;
    s.v = s.k + scratch_of(a->k, d->Tk * d->D);
    s.q = s.v + scratch_of(a->v, d->Tk * d->Dv);
    s.o = s.q + scratch_of(a->q, QB * d->D);
    return s;
}

/* The keys and values of one kv head: f32 tiles (kh, vh), or on the native
 * path where they are stored (k, v: rows ks[2] and vs[2] apart). */
typedef struct kv_head {
    tile kh, vh;
    const void *k, *v;
} kv_head;

/* S = s Q K^T, P = softmax(S) (into pb, row stride Tk) and O = P V for
 * the query block at element qoff of q, nq rows, keys [0, kend). */
static accel_status block_forward(const accel_k_sdpa *a, accel_dtype lp, int64_t i0, int64_t nq, int64_t kend,
                                  int64_t qoff, const kv_head *kv, float *pb, tile ob, fwd_scratch s) {
    const accel_k_sdpa_dims *d = &a->dims;
    if (lp == ACCEL_F32) {
        tile qb = tile_load(a->q, qoff, nq, d->D, d->D, s.q);
        accel__sgemm(false, true, nq, kend, d->D, d->scale, qb.p, qb.ld, kv->kh.p, kv->kh.ld, 0.0f, pb, d->Tk);
        masked_softmax(d, i0, nq, kend, pb, d->Tk);
        accel__sgemm(false, false, nq, d->Dv, kend, 1.0f, pb, d->Tk, kv->vh.p, kv->vh.ld, 0.0f, ob.p, ob.ld);
        return ACCEL_OK;
    }
    accel_status st = tiles_gemm(KEYS_N, lp, kend, d->D, d->scale, elem_ptr(a->q, qoff), d->D, kv->k, d->ks[2], 0.0f,
                                 pb, d->Tk);
    if (st != ACCEL_OK) return st;
    masked_softmax(d, i0, nq, kend, pb, d->Tk);
    round_block(s.pl, lp, pb, kend, d->Tk);
    return tiles_gemm(KEYS_K, lp, kend, d->Dv, 1.0f, s.pl, d->Tk, kv->v, d->vs[2], 0.0f, ob.p, ob.ld);
}

/* One (batch, head) bh on its kv head: P [Tq, Tk] (only each block's
 * [0, kend) columns are written) and O [Tq, Dv]. */
static accel_status head_forward(const accel_k_sdpa *a, accel_dtype lp, int64_t bh, const kv_head *kv,
                                 fwd_scratch s) {
    const accel_k_sdpa_dims *d = &a->dims;
    float *ph = (float *)a->p->data + bh * d->Tq * d->Tk;
    for (int64_t i0 = 0; i0 < d->Tq; i0 += QB) {
        int64_t nq = d->Tq - i0 < QB ? d->Tq - i0 : QB, kend = block_keys(d, i0, nq);
        int64_t qoff = (bh * d->Tq + i0) * d->D, ooff = (bh * d->Tq + i0) * d->Dv;
        tile ob = tile_at(a->o, ooff, d->Dv, s.o, d->Dv);
        if (kend <= 0) { /* no query of the block sees a key */
            memset(ob.p, 0, (size_t)(nq * d->Dv) * sizeof(float));
        } else {
            accel_status st = block_forward(a, lp, i0, nq, kend, qoff, kv, ph + i0 * d->Tk, ob, s);
            if (st != ACCEL_OK) return st;
        }
        tile_store(a->o, ooff, nq, d->Dv, ob);
    }
    return ACCEL_OK;
}

/* Query heads [bh0, bh0 + n) of one kv head: its K and V are read (widened
 * to f32 when they are bf16/f16) once for all n, or used as stored on the
 * native path. */
static accel_status heads_forward(const accel_k_sdpa *a, accel_dtype lp, int64_t bh0, int64_t n, fwd_scratch s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t b = bh0 / d->H, hk = bh0 % d->H / (d->H / d->Hkv);
    int64_t koff = b * d->ks[0] + hk * d->ks[1], voff = b * d->vs[0] + hk * d->vs[1];
    kv_head kv = {{NULL, d->ks[2]}, {NULL, d->vs[2]}, NULL, NULL};
    if (lp == ACCEL_F32) {
        kv.kh = tile_load(a->k, koff, d->Tk, d->D, d->ks[2], s.k);
        kv.vh = tile_load(a->v, voff, d->Tk, d->Dv, d->vs[2], s.v);
    } else {
        kv.k = elem_ptr(a->k, koff);
        kv.v = elem_ptr(a->v, voff);
    }
    for (int64_t i = 0; i < n; i++) {
        accel_status st = head_forward(a, lp, bh0 + i, &kv, s);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

/* t (n elements, contiguous) as f32: t's memory, or an arena conversion. */
static float *whole_f32(const accel_tensor *t, int64_t n) {
    if (t->dtype == ACCEL_F32) return t->data;
    float *c = accel_arena_alloc(accel_step_arena(), (size_t)(n + 1) * sizeof(float), 64);
    if (c) accel__cpu_to_f32(c, t->data, t->dtype, n);
    return c;
}

/* The reference: one query row at a time, double accumulation, on dense f32
 * q, k, v (the op hands the reference dense tensors). */
static void sdpa_reference(const accel_k_sdpa_dims *d, const float *q, const float *k, const float *v, float *p, float *o,
                           double *sc) {
    for (int64_t bh = 0; bh < d->B * d->H; bh++) {
        int64_t b = bh / d->H, h = bh % d->H, kvh = b * d->Hkv + h / (d->H / d->Hkv);
        for (int64_t i = 0; i < d->Tq; i++) {
            const float *qi = q + (bh * d->Tq + i) * d->D;
            float *pi = p + (bh * d->Tq + i) * d->Tk, *oi = o + (bh * d->Tq + i) * d->Dv;
            int64_t L = last_key(d, i);
            double m = -INFINITY, s = 0.0;
            for (int64_t j = 0; j <= L; j++) {
                const float *kj = k + (kvh * d->Tk + j) * d->D;
                double dot = 0.0;
                for (int64_t e = 0; e < d->D; e++) dot += (double)qi[e] * kj[e];
                sc[j] = dot * d->scale;
                m = fmax(m, sc[j]);
            }
            for (int64_t j = 0; j <= L; j++) s += exp(sc[j] - m);
            for (int64_t j = 0; j < d->Tk; j++) pi[j] = j <= L ? (float)(exp(sc[j] - m) / s) : 0.0f;
            for (int64_t e = 0; e < d->Dv; e++) {
                double acc = 0.0;
                for (int64_t j = 0; j <= L; j++) acc += (double)pi[j] * v[(kvh * d->Tk + j) * d->Dv + e];
                oi[e] = (float)acc;
            }
        }
    }
}

static accel_status reference_forward(const accel_k_sdpa *a) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t nq = d->B * d->H * d->Tq, nkv = d->B * d->Hkv * d->Tk;
    const float *q = whole_f32(a->q, nq * d->D), *k = whole_f32(a->k, nkv * d->D), *v = whole_f32(a->v, nkv * d->Dv);
    float *o = a->o->dtype == ACCEL_F32 ? a->o->data
                                        : accel_arena_alloc(accel_step_arena(), (size_t)(nq * d->Dv + 1) * sizeof(float), 64);
    double *sc = accel_arena_alloc(accel_step_arena(), (size_t)(d->Tk + 1) * sizeof(double), 64);
    if (!q || !k || !v || !o || !sc) return accel_last_status();
    sdpa_reference(d, q, k, v, a->p->data, o, sc);
    if (a->o->dtype != ACCEL_F32) accel__cpu_from_f32(a->o->data, a->o->dtype, o, nq * d->Dv);
    return ACCEL_OK;
}

/* ---- backward */

/* dS = P (dP - rowsum(dP P)) in place over nq rows of kend columns. */
static void softmax_grad_rows(int64_t nq, int64_t kend, const float *p, int64_t ldp, float *dp, int64_t ldd) {
    for (int64_t r = 0; r < nq; r++) accel__cpu_softmax_grad_row(p + r * ldp, dp + r * ldd, kend);
}

/* One thread's scratch of the backward: dP [QB, Tk] always; the kv head's
 * dK, dV [Tk, D(v)] and a block's dQ [QB, D] when that tensor is not f32;
 * on the f32 tiles the kv head's K, V [Tk, D(v)] and a block's Q, dO
 * [QB, D(v)] when that tensor is not f32, on the native path (lp) instead
 * a block's P, then dS, rounded to lp [QB, Tk]. */
typedef struct bwd_scratch {
    float *dp, *k, *v, *dk, *dv, *q, *g, *dq;
    void *pl;
} bwd_scratch;

static int64_t bwd_scratch_floats(const accel_k_sdpa_backward *a, accel_dtype lp) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t kd = d->Tk * d->D, kv = d->Tk * d->Dv;
    int64_t n = QB * d->Tk + scratch_of(a->dk, kd) + scratch_of(a->dv, kv) + scratch_of(a->dq, QB * d->D);
    if (lp != ACCEL_F32) return n + floats_of(lp, QB * d->Tk);
    return n + scratch_of(a->k, kd) + scratch_of(a->v, kv) + scratch_of(a->q, QB * d->D) +
           scratch_of(a->g, QB * d->Dv);
}

static bwd_scratch bwd_scratch_at(const accel_k_sdpa_backward *a, accel_dtype lp, float *base) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t kd = d->Tk * d->D, kv = d->Tk * d->Dv;
    bool f32 = lp == ACCEL_F32;
    bwd_scratch s = {0};
    s.dp = base;
    s.dk = s.dp + QB * d->Tk;
    s.dv = s.dk + scratch_of(a->dk, kd);
    s.dq = s.dv + scratch_of(a->dv, kv);
    float *rest = s.dq + scratch_of(a->dq, QB * d->D);
    if (!f32) {
        s.pl = rest;
        return s;
    }
    s.k = rest;
    s.v = s.k + scratch_of(a->k, kd);
    s.q = s.v + scratch_of(a->v, kv);
    s.g = s.q + scratch_of(a->q, QB * d->D);
    return s;
}

/* A kv head's gradient accumulators, f32: dK and dV [Tk, D(v)]. */
typedef struct kv_grads {
    tile dkh, dvh;
} kv_grads;

/* The gradients of query block i0 (nq rows, keys [0, kend), its P at pb)
 * of head bh on the f32 tiles. dP's rows are Tk apart whatever kend. */
static void block_backward_f32(const accel_k_sdpa_backward *a, int64_t bh, int64_t i0, int64_t nq, int64_t kend,
                               const float *pb, const kv_head *kv, const kv_grads *gr, const bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t qoff = (bh * d->Tq + i0) * d->D, goff = (bh * d->Tq + i0) * d->Dv;
    tile gob = tile_load(a->g, goff, nq, d->Dv, d->Dv, s->g);
    if (a->dv) /* dV[0:kend] += P^T dO */
        accel__sgemm(true, false, kend, d->Dv, nq, 1.0f, pb, d->Tk, gob.p, gob.ld, 1.0f, gr->dvh.p, gr->dvh.ld);
    if (!a->dq && !a->dk) return;
    /* dP = dO V^T, then dS */
    accel__sgemm(false, true, nq, kend, d->Dv, 1.0f, gob.p, gob.ld, kv->vh.p, kv->vh.ld, 0.0f, s->dp, d->Tk);
    softmax_grad_rows(nq, kend, pb, d->Tk, s->dp, d->Tk);
    if (a->dq) { /* dQ = s dS K (+ dQ) */
        tile dqb = a->dq_beta != 0.0f ? tile_load(a->dq, qoff, nq, d->D, d->D, s->dq)
                                      : tile_at(a->dq, qoff, d->D, s->dq, d->D);
        accel__sgemm(false, false, nq, d->D, kend, d->scale, s->dp, d->Tk, kv->kh.p, kv->kh.ld, a->dq_beta, dqb.p,
                     dqb.ld);
        tile_store(a->dq, qoff, nq, d->D, dqb);
    }
    if (a->dk) { /* dK[0:kend] += s dS^T Q */
        tile qb = tile_load(a->q, qoff, nq, d->D, d->D, s->q);
        accel__sgemm(true, false, kend, d->D, nq, d->scale, s->dp, d->Tk, qb.p, qb.ld, 1.0f, gr->dkh.p, gr->dkh.ld);
    }
}

/* The same on the native path (nq = QB): dO, Q, K, V read as stored, P
 * and dS rounded to lp for the GEMMs that take them. */
static accel_status block_backward_lp(const accel_k_sdpa_backward *a, accel_dtype lp, int64_t bh, int64_t i0,
                                      int64_t kend, const float *pb, const kv_head *kv, const kv_grads *gr,
                                      const bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t qoff = (bh * d->Tq + i0) * d->D;
    const void *go = elem_ptr(a->g, (bh * d->Tq + i0) * d->Dv);
    accel_status st = ACCEL_OK;
    if (a->dv) { /* dV[0:kend] += P^T dO */
        round_block(s->pl, lp, pb, kend, d->Tk);
        st = tiles_gemm(KEYS_M, lp, kend, d->Dv, 1.0f, s->pl, d->Tk, go, d->Dv, 1.0f, gr->dvh.p, gr->dvh.ld);
    }
    if (st != ACCEL_OK || (!a->dq && !a->dk)) return st;
    /* dP = dO V^T, then dS, rounded */
    st = tiles_gemm(KEYS_N, lp, kend, d->Dv, 1.0f, go, d->Dv, kv->v, d->Dv, 0.0f, s->dp, d->Tk);
    if (st != ACCEL_OK) return st;
    softmax_grad_rows(QB, kend, pb, d->Tk, s->dp, d->Tk);
    round_block(s->pl, lp, s->dp, kend, d->Tk);
    if (a->dq) { /* dQ = s dS K (+ dQ) */
        tile dqb = a->dq_beta != 0.0f ? tile_load(a->dq, qoff, QB, d->D, d->D, s->dq)
                                      : tile_at(a->dq, qoff, d->D, s->dq, d->D);
        st = tiles_gemm(KEYS_K, lp, kend, d->D, d->scale, s->pl, d->Tk, kv->k, d->D, a->dq_beta, dqb.p, dqb.ld);
        if (st != ACCEL_OK) return st;
        tile_store(a->dq, qoff, QB, d->D, dqb);
    }
    if (a->dk) /* dK[0:kend] += s dS^T Q */
        st = tiles_gemm(KEYS_M, lp, kend, d->D, d->scale, s->pl, d->Tk, elem_ptr(a->q, qoff), d->D, 1.0f, gr->dkh.p,
                        gr->dkh.ld);
    return st;
}

/* The gradients of query block i0 (nq rows) of head bh. */
static accel_status block_backward(const accel_k_sdpa_backward *a, accel_dtype lp, int64_t bh, int64_t i0, int64_t nq,
                                   const kv_head *kv, const kv_grads *gr, const bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t kend = block_keys(d, i0, nq), qoff = (bh * d->Tq + i0) * d->D;
    if (kend <= 0) { /* no key: dQ is zero, nothing reaches dK, dV */
        if (a->dq && a->dq_beta == 0.0f) memset(elem_ptr(a->dq, qoff), 0, (size_t)(nq * d->D) * accel_dtype_size(a->dq->dtype));
        return ACCEL_OK;
    }
    const float *pb = (const float *)a->p->data + (bh * d->Tq + i0) * d->Tk;
    if (lp != ACCEL_F32) return block_backward_lp(a, lp, bh, i0, kend, pb, kv, gr, s);
    block_backward_f32(a, bh, i0, nq, kend, pb, kv, gr, s);
    return ACCEL_OK;
}

/* The gradients of the G query heads of kv head `kvb` (= b * Hkv + kv), block
 * by block of queries as in the forward. dK and dV of the kv head are
 * accumulated in f32 over the G heads and written once. K and V are widened
 * on the f32 tiles, read as stored on the native path. */
static accel_status kv_backward(const accel_k_sdpa_backward *a, accel_dtype lp, int64_t kvb, const bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t G = d->H / d->Hkv, b = kvb / d->Hkv, kv = kvb % d->Hkv;
    int64_t koff = kvb * d->Tk * d->D, voff = kvb * d->Tk * d->Dv;
    kv_head kvh = {{NULL, d->D}, {NULL, d->Dv}, NULL, NULL};
    if (lp == ACCEL_F32) {
        kvh.kh = tile_load(a->k, koff, d->Tk, d->D, d->D, s->k);
        kvh.vh = tile_load(a->v, voff, d->Tk, d->Dv, d->Dv, s->v);
    } else {
        kvh.k = elem_ptr(a->k, koff);
        kvh.v = elem_ptr(a->v, voff);
    }
    kv_grads gr = {{NULL, d->D}, {NULL, d->Dv}};
    if (a->dk) gr.dkh = tile_load(a->dk, koff, d->Tk, d->D, d->D, s->dk);
    if (a->dv) gr.dvh = tile_load(a->dv, voff, d->Tk, d->Dv, d->Dv, s->dv);
    accel_status st = ACCEL_OK;
    for (int64_t gi = 0; gi < G && st == ACCEL_OK; gi++)
        for (int64_t i0 = 0; i0 < d->Tq && st == ACCEL_OK; i0 += QB)
            st = block_backward(a, lp, b * d->H + kv * G + gi, i0, d->Tq - i0 < QB ? d->Tq - i0 : QB, &kvh, &gr, s);
    if (st != ACCEL_OK) return st;
    if (a->dk) tile_store(a->dk, koff, d->Tk, d->D, gr.dkh);
    if (a->dv) tile_store(a->dv, voff, d->Tk, d->Dv, gr.dvh);
    return ACCEL_OK;
}

/* Heads run in parallel (one serial sgemm per block) when there are enough of
 * them to keep the threads busy; otherwise one after another on the
 * multi-threaded GEMM. */
static bool heads_parallel(int64_t n_heads) { return n_heads >= 2 * accel_num_threads(); }

/* Per-thread scratch of `floats` floats for nt threads (one spare float so
 * that none is a zero-size allocation). */
static float *thread_scratch(int nt, int64_t floats) {
    return accel_arena_alloc(accel_step_arena(), (size_t)(nt * floats + 1) * sizeof(float), 64);
}

accel_status accel__cpuk_sdpa(accel_k_sdpa *k) {
    const accel_k_sdpa_dims *d = &k->dims;
    if (accel_reference_kernels()) return reference_forward(k);
    /* A unit of work is the G query heads of a kv head (its K and V read
     * once), or one query head when too few kv heads would keep the
     * threads busy and enough query heads would. */
    const accel_tensor *ops[3] = {k->q, k->k, k->v};
    accel_dtype lp = native_dtype(ops, 3, d);
    int64_t G = d->H / d->Hkv, per = fwd_scratch_floats(k, lp);
    int64_t heads = heads_parallel(d->B * d->Hkv) || !heads_parallel(d->B * d->H) ? G : 1;
    int64_t units = d->B * d->H / heads;
    bool par = heads_parallel(units);
    int nt = par ? accel_num_threads() : 1;
    float *scratch = thread_scratch(nt, per);
    if (!scratch) return accel_last_status();
    first_error err = {ACCEL_OK, ""};
    if (par) {
        accel__blas_single_thread();
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t i = 0; i < units; i++)
            keep_error(&err, heads_forward(k, lp, i * heads, heads,
                                           fwd_scratch_at(k, lp, scratch + omp_get_thread_num() * per)));
    } else {
        for (int64_t i = 0; i < units && err.st == ACCEL_OK; i++)
            keep_error(&err, heads_forward(k, lp, i * heads, heads, fwd_scratch_at(k, lp, scratch)));
    }
    return raise_error(&err);
}

accel_status accel__cpuk_sdpa_backward(accel_k_sdpa_backward *k) {
    const accel_k_sdpa_dims *d = &k->dims;
    const accel_tensor *ops[4] = {k->g, k->q, k->k, k->v};
    accel_dtype lp = native_dtype(ops, 4, d);
    int64_t nkv = d->B * d->Hkv, per = bwd_scratch_floats(k, lp);
    bool par = heads_parallel(nkv);
    int nt = par ? accel_num_threads() : 1;
    float *scratch = thread_scratch(nt, per);
    if (!scratch) return accel_last_status();
    first_error err = {ACCEL_OK, ""};
    if (par) {
        accel__blas_single_thread();
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t i = 0; i < nkv; i++) {
            bwd_scratch s = bwd_scratch_at(k, lp, scratch + omp_get_thread_num() * per);
            keep_error(&err, kv_backward(k, lp, i, &s));
        }
    } else {
        bwd_scratch s = bwd_scratch_at(k, lp, scratch);
        for (int64_t i = 0; i < nkv && err.st == ACCEL_OK; i++) keep_error(&err, kv_backward(k, lp, i, &s));
    }
    return raise_error(&err);
}
