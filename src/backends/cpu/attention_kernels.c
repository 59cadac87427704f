/* Scaled dot-product attention with grouped-query heads and a bottom-right
 * aligned causal mask, computed in f32. q, k, v, the output, the output's
 * gradient and dq, dk, dv are each f32, bf16 or f16: a bf16/f16 tensor is
 * read and written a tile at a time (one head's keys and values, one block of
 * queries) through per-thread f32 scratch with the vectorised conversions of
 * fused_kernels.c, never as a whole-tensor f32 copy; f32 tensors are used in
 * place. The forward keeps the softmax probabilities P [B, H, Tq, Tk] (f32)
 * for the backward (under the causal mask only the blocks left of the
 * diagonal are written and read). Heads run in parallel by kv head (its K
 * and V read once for the H / Hkv query heads that share them, forward and
 * backward alike), one OpenMP thread per kv head calling the single-threaded
 * sgemm on blocks of queries; with too few kv heads the forward runs query
 * heads in parallel instead, and with too few heads of either kind they run
 * one after another and each GEMM is split across the threads. The score
 * GEMMs of bf16/f16 operands (S = s Q K^T, dP = dO V^T) run on oneDNN from
 * the tensors as stored where it multiplies their dtype itself (below). */
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

/* ---- the score GEMMs on bf16/f16 operands as stored
 *
 * S = s Q K^T and dP = dO V^T multiply two tensors of one bf16/f16 dtype:
 * each product of two such values is exact in f32, so a GEMM of that dtype
 * with f32 accumulation (oneDNN on AVX512-BF16 or AMX) gives the values the
 * f32 tiles give, up to the order of the additions, with no tile widened for
 * them. It runs only on whole query blocks (Tq and Tk multiples of QB) and
 * in chunks of at most KC keys, so each is a QB x (64 .. KC) GEMM: oneDNN
 * makes and keeps a primitive per shape and leading dims (~0.1-1 ms of JIT
 * each, in a table of 512 that the linear layers share), and decode's or
 * ragged blocks' shapes, new at every length, would fill it. The other four
 * tile GEMMs multiply f32 values (P, dS) and stay f32. */
enum { KC = 256 };

/* Whether a score GEMM of dtypes a and b with K-long rows runs on oneDNN
 * from the operands as stored. */
static bool scores_native(accel_dtype a, accel_dtype b, int64_t K) {
    return a == b && a != ACCEL_F32 && !accel__gemm_widens_per_call(a) &&
           accel__gemm_provider_for(a, false, true, QB, KC, K) == ACCEL__GEMM_PROVIDER_DNNL;
}

bool accel__cpu_sdpa_scores_native(accel_dtype a, accel_dtype b, const accel_k_sdpa_dims *d) {
    return d->Tq % QB == 0 && d->Tk % QB == 0 && scores_native(a, b, d->D);
}

/* C [QB, kend] (row stride ldc) = alpha A B^T, A [QB, K] and B [kend, K]
 * of dtype dt (row strides lda, ldb), on oneDNN, KC columns at a time. */
static accel_status scores_gemm(accel_dtype dt, int64_t kend, int64_t K, float alpha, const void *A, int64_t lda,
                                const void *B, int64_t ldb, float *C, int64_t ldc) {
    size_t es = accel_dtype_size(dt);
    for (int64_t j = 0; j < kend; j += KC) {
        int64_t n = kend - j < KC ? kend - j : KC;
        accel_status st = accel__gemm_on(ACCEL__GEMM_PROVIDER_DNNL, false, true, QB, n, K, alpha, A, dt, lda,
                                         (const char *)B + (size_t)(j * ldb) * es, dt, ldb, 0.0f, C + j, ldc);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
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

/* One thread's scratch of the forward: the head's K [Tk, D] and V [Tk, Dv],
 * a block's Q [QB, D] and O [QB, Dv], each only when that tensor is not f32. */
typedef struct fwd_scratch {
    float *k, *v, *q, *o;
} fwd_scratch;

static int64_t fwd_scratch_floats(const accel_k_sdpa *a) {
    const accel_k_sdpa_dims *d = &a->dims;
    return scratch_of(a->k, d->Tk * d->D) + scratch_of(a->v, d->Tk * d->Dv) + scratch_of(a->q, QB * d->D) +
           scratch_of(a->o, QB * d->Dv);
}

static fwd_scratch fwd_scratch_at(const accel_k_sdpa *a, float *base) {
    const accel_k_sdpa_dims *d = &a->dims;
    fwd_scratch s;
    s.k = base;
    s.v = s.k + scratch_of(a->k, d->Tk * d->D);
    s.q = s.v + scratch_of(a->v, d->Tk * d->Dv);
    s.o = s.q + scratch_of(a->q, QB * d->D);
    return s;
}

/* One (batch, head) bh on its kv head's K kh [Tk, D] and V vh [Tk, Dv]: P
 * [Tq, Tk] (only each block's [0, kend) columns are written) and O [Tq, Dv].
 * With k_lp (K as stored, rows of ks[2]: scores_native) the scores are
 * multiplied from q and K as stored and kh is unused. */
static accel_status head_forward(const accel_k_sdpa *a, int64_t bh, tile kh, const void *k_lp, tile vh,
                                 fwd_scratch s) {
    const accel_k_sdpa_dims *d = &a->dims;
    float *ph = (float *)a->p->data + bh * d->Tq * d->Tk;
    for (int64_t i0 = 0; i0 < d->Tq; i0 += QB) {
        int64_t nq = d->Tq - i0 < QB ? d->Tq - i0 : QB, kend = block_keys(d, i0, nq);
        int64_t qoff = (bh * d->Tq + i0) * d->D, ooff = (bh * d->Tq + i0) * d->Dv;
        float *pb = ph + i0 * d->Tk;
        tile ob = tile_at(a->o, ooff, d->Dv, s.o, d->Dv);
        if (kend <= 0) { /* no query of the block sees a key */
            memset(ob.p, 0, (size_t)(nq * d->Dv) * sizeof(float));
        } else {
            /* S = s Q K^T */
            if (k_lp) {
                accel_status st = scores_gemm(a->q->dtype, kend, d->D, d->scale, elem_ptr(a->q, qoff), d->D, k_lp,
                                              d->ks[2], pb, d->Tk);
                if (st != ACCEL_OK) return st;
            } else {
                tile qb = tile_load(a->q, qoff, nq, d->D, d->D, s.q);
                accel__sgemm(false, true, nq, kend, d->D, d->scale, qb.p, qb.ld, kh.p, kh.ld, 0.0f, pb, d->Tk);
            }
            masked_softmax(d, i0, nq, kend, pb, d->Tk);
            /* O = P V */
            accel__sgemm(false, false, nq, d->Dv, kend, 1.0f, pb, d->Tk, vh.p, vh.ld, 0.0f, ob.p, ob.ld);
        }
        tile_store(a->o, ooff, nq, d->Dv, ob);
    }
    return ACCEL_OK;
}

/* Query heads [bh0, bh0 + n) of one kv head: its K and V are read (widened
 * to f32 when they are bf16/f16) once for all n; K not at all when the
 * scores are multiplied from it as stored (lp). */
static accel_status heads_forward(const accel_k_sdpa *a, int64_t bh0, int64_t n, bool lp, fwd_scratch s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t b = bh0 / d->H, hk = bh0 % d->H / (d->H / d->Hkv), koff = b * d->ks[0] + hk * d->ks[1];
    tile kh = lp ? (tile){NULL, d->ks[2]} : tile_load(a->k, koff, d->Tk, d->D, d->ks[2], s.k),
         vh = tile_load(a->v, b * d->vs[0] + hk * d->vs[1], d->Tk, d->Dv, d->vs[2], s.v);
    const void *k_lp = lp ? elem_ptr(a->k, koff) : NULL;
    for (int64_t i = 0; i < n; i++) {
        accel_status st = head_forward(a, bh0 + i, kh, k_lp, vh, s);
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

/* One thread's scratch of the backward: dP [QB, Tk] always; the kv head's K,
 * V, dK, dV [Tk, D(v)] and a block's Q, dO, dQ [QB, D(v)] when that tensor is
 * not f32. */
typedef struct bwd_scratch {
    float *dp, *k, *v, *dk, *dv, *q, *g, *dq;
} bwd_scratch;

static int64_t bwd_scratch_floats(const accel_k_sdpa_backward *a) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t kd = d->Tk * d->D, kv = d->Tk * d->Dv;
    return QB * d->Tk + scratch_of(a->k, kd) + scratch_of(a->v, kv) + scratch_of(a->dk, kd) +
           scratch_of(a->dv, kv) + scratch_of(a->q, QB * d->D) + scratch_of(a->g, QB * d->Dv) +
           scratch_of(a->dq, QB * d->D);
}

static bwd_scratch bwd_scratch_at(const accel_k_sdpa_backward *a, float *base) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t kd = d->Tk * d->D, kv = d->Tk * d->Dv;
    bwd_scratch s;
    s.dp = base;
    s.k = s.dp + QB * d->Tk;
    s.v = s.k + scratch_of(a->k, kd);
    s.dk = s.v + scratch_of(a->v, kv);
    s.dv = s.dk + scratch_of(a->dk, kd);
    s.q = s.dv + scratch_of(a->dv, kv);
    s.g = s.q + scratch_of(a->q, QB * d->D);
    s.dq = s.g + scratch_of(a->g, QB * d->Dv);
    return s;
}

/* The gradients of query block i0 (nq rows, keys [0, kend)) of head bh.
 * With v_lp (V as stored: scores_native) dP is multiplied from dO and V as
 * stored and vh is unused. dP's rows are Tk apart whatever kend (one leading
 * dim per sequence length for oneDNN's primitives). */
static accel_status block_backward(const accel_k_sdpa_backward *a, int64_t bh, int64_t i0, int64_t nq, tile kh,
                                   tile vh, const void *v_lp, tile dkh, tile dvh, const bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t kend = block_keys(d, i0, nq), qoff = (bh * d->Tq + i0) * d->D, goff = (bh * d->Tq + i0) * d->Dv;
    if (kend <= 0) { /* no key: dQ is zero, nothing reaches dK, dV */
        if (a->dq && a->dq_beta == 0.0f) memset(elem_ptr(a->dq, qoff), 0, (size_t)(nq * d->D) * accel_dtype_size(a->dq->dtype));
        return ACCEL_OK;
    }
    const float *pb = (const float *)a->p->data + (bh * d->Tq + i0) * d->Tk;
    tile gob = {NULL, d->Dv};
    if (a->dv || !v_lp) gob = tile_load(a->g, goff, nq, d->Dv, d->Dv, s->g);
    if (a->dv) /* dV[0:kend] += P^T dO */
        accel__sgemm(true, false, kend, d->Dv, nq, 1.0f, pb, d->Tk, gob.p, gob.ld, 1.0f, dvh.p, dvh.ld);
    if (!a->dq && !a->dk) return ACCEL_OK;
    /* dP = dO V^T, then dS */
    if (v_lp) {
        accel_status st = scores_gemm(a->g->dtype, kend, d->Dv, 1.0f, elem_ptr(a->g, goff), d->Dv, v_lp, d->Dv,
                                      s->dp, d->Tk);
        if (st != ACCEL_OK) return st;
    } else {
        accel__sgemm(false, true, nq, kend, d->Dv, 1.0f, gob.p, gob.ld, vh.p, vh.ld, 0.0f, s->dp, d->Tk);
    }
    softmax_grad_rows(nq, kend, pb, d->Tk, s->dp, d->Tk);
    if (a->dq) { /* dQ = s dS K (+ dQ) */
        tile dqb = a->dq_beta != 0.0f ? tile_load(a->dq, qoff, nq, d->D, d->D, s->dq)
                                      : tile_at(a->dq, qoff, d->D, s->dq, d->D);
        accel__sgemm(false, false, nq, d->D, kend, d->scale, s->dp, d->Tk, kh.p, kh.ld, a->dq_beta, dqb.p, dqb.ld);
        tile_store(a->dq, qoff, nq, d->D, dqb);
    }
    if (a->dk) { /* dK[0:kend] += s dS^T Q */
        tile qb = tile_load(a->q, qoff, nq, d->D, d->D, s->q);
        accel__sgemm(true, false, kend, d->D, nq, d->scale, s->dp, d->Tk, qb.p, qb.ld, 1.0f, dkh.p, dkh.ld);
    }
    return ACCEL_OK;
}

/* The gradients of the G query heads of kv head `kvb` (= b * Hkv + kv), block
 * by block of queries as in the forward. dK and dV of the kv head are
 * accumulated in f32 over the G heads and written once. V is not widened
 * when dP is multiplied from it as stored (lp). */
static accel_status kv_backward(const accel_k_sdpa_backward *a, int64_t kvb, bool lp, const bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t G = d->H / d->Hkv, b = kvb / d->Hkv, kv = kvb % d->Hkv;
    int64_t koff = kvb * d->Tk * d->D, voff = kvb * d->Tk * d->Dv;
    tile kh = tile_load(a->k, koff, d->Tk, d->D, d->D, s->k);
    tile vh = lp ? (tile){NULL, d->Dv} : tile_load(a->v, voff, d->Tk, d->Dv, d->Dv, s->v);
    const void *v_lp = lp ? elem_ptr(a->v, voff) : NULL;
    tile dkh = {NULL, d->D}, dvh = {NULL, d->Dv};
    if (a->dk) dkh = tile_load(a->dk, koff, d->Tk, d->D, d->D, s->dk);
    if (a->dv) dvh = tile_load(a->dv, voff, d->Tk, d->Dv, d->Dv, s->dv);
    accel_status st = ACCEL_OK;
    for (int64_t gi = 0; gi < G && st == ACCEL_OK; gi++)
        for (int64_t i0 = 0; i0 < d->Tq && st == ACCEL_OK; i0 += QB)
            st = block_backward(a, b * d->H + kv * G + gi, i0, d->Tq - i0 < QB ? d->Tq - i0 : QB, kh, vh, v_lp, dkh,
                                dvh, s);
    if (st != ACCEL_OK) return st;
    if (a->dk) tile_store(a->dk, koff, d->Tk, d->D, dkh);
    if (a->dv) tile_store(a->dv, voff, d->Tk, d->Dv, dvh);
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
    int64_t G = d->H / d->Hkv, per = fwd_scratch_floats(k);
    int64_t heads = heads_parallel(d->B * d->Hkv) || !heads_parallel(d->B * d->H) ? G : 1;
    int64_t units = d->B * d->H / heads;
    bool par = heads_parallel(units), lp = accel__cpu_sdpa_scores_native(k->q->dtype, k->k->dtype, d);
    int nt = par ? accel_num_threads() : 1;
    float *scratch = thread_scratch(nt, per);
    if (!scratch) return accel_last_status();
    first_error err = {ACCEL_OK, ""};
    if (par) {
        accel__blas_single_thread();
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t i = 0; i < units; i++)
            keep_error(&err, heads_forward(k, i * heads, heads, lp,
                                           fwd_scratch_at(k, scratch + omp_get_thread_num() * per)));
    } else {
        for (int64_t i = 0; i < units && err.st == ACCEL_OK; i++)
            keep_error(&err, heads_forward(k, i * heads, heads, lp, fwd_scratch_at(k, scratch)));
    }
    return raise_error(&err);
}

accel_status accel__cpuk_sdpa_backward(accel_k_sdpa_backward *k) {
    const accel_k_sdpa_dims *d = &k->dims;
    int64_t nkv = d->B * d->Hkv, per = bwd_scratch_floats(k);
    bool par = heads_parallel(nkv), lp = accel__cpu_sdpa_scores_native(k->g->dtype, k->v->dtype, d);
    int nt = par ? accel_num_threads() : 1;
    float *scratch = thread_scratch(nt, per);
    if (!scratch) return accel_last_status();
    first_error err = {ACCEL_OK, ""};
    if (par) {
        accel__blas_single_thread();
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t i = 0; i < nkv; i++) {
            bwd_scratch s = bwd_scratch_at(k, scratch + omp_get_thread_num() * per);
            keep_error(&err, kv_backward(k, i, lp, &s));
        }
    } else {
        bwd_scratch s = bwd_scratch_at(k, scratch);
        for (int64_t i = 0; i < nkv && err.st == ACCEL_OK; i++) keep_error(&err, kv_backward(k, i, lp, &s));
    }
    return raise_error(&err);
}
