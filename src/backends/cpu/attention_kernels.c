/* Scaled dot-product attention with grouped-query heads and a bottom-right
 * aligned causal mask, in f32. The forward keeps the softmax probabilities P
 * [B, H, Tq, Tk] for the backward (under the causal mask only the blocks
 * left of the diagonal are written and read). Heads run in parallel, one
 * OpenMP thread per head calling the single-threaded sgemm on blocks of
 * queries; with fewer heads than threads, heads run one after another and
 * each GEMM is split across the threads. */
#include <math.h>
#include <omp.h>
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

/* Masked softmax of nq score rows (query i0 + r) over their first kend
 * columns, in place (row stride ld). Columns past a row's last key are set
 * to 0 up to kend; a row that sees no key is all zeros. */
static void masked_softmax(const accel_k_sdpa_dims *d, int64_t i0, int64_t nq, int64_t kend, float *p, int64_t ld) {
    for (int64_t r = 0; r < nq; r++) {
        float *row = p + r * ld;
        int64_t n = last_key(d, i0 + r) + 1;
        if (n > 0) {
            float m = accel__row_max(row, n);
            float inv = 1.0f / accel__row_exp(row, row, n, m);
            for (int64_t j = 0; j < n; j++) row[j] *= inv;
        }
        for (int64_t j = n < 0 ? 0 : n; j < kend; j++) row[j] = 0.0f;
    }
}

/* One (batch, head): P [Tq, Tk] (only each block's [0, kend) columns are
 * written) and O [Tq, Dv]. */
static void head_forward(const accel_k_sdpa_dims *d, int64_t bh, const float *q, const float *k, const float *v,
                         float *p, float *o) {
    int64_t b = bh / d->H, h = bh % d->H, hk = h / (d->H / d->Hkv);
    const float *qh = q + bh * d->Tq * d->D, *kh = k + b * d->ks[0] + hk * d->ks[1],
                *vh = v + b * d->vs[0] + hk * d->vs[1];
    float *ph = p + bh * d->Tq * d->Tk, *oh = o + bh * d->Tq * d->Dv;
    for (int64_t i0 = 0; i0 < d->Tq; i0 += QB) {
        int64_t nq = d->Tq - i0 < QB ? d->Tq - i0 : QB, kend = block_keys(d, i0, nq);
        float *pb = ph + i0 * d->Tk, *ob = oh + i0 * d->Dv;
        if (kend <= 0) { /* no query of the block sees a key */
            memset(ob, 0, (size_t)(nq * d->Dv) * sizeof(float));
            continue;
        }
        /* S = s Q K^T */
        accel__sgemm(false, true, nq, kend, d->D, d->scale, qh + i0 * d->D, d->D, kh, d->ks[2], 0.0f, pb, d->Tk);
        masked_softmax(d, i0, nq, kend, pb, d->Tk);
        /* O = P V */
        accel__sgemm(false, false, nq, d->Dv, kend, 1.0f, pb, d->Tk, vh, d->vs[2], 0.0f, ob, d->Dv);
    }
}

/* The reference: one query row at a time, double accumulation. */
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

typedef struct sdpa_grads {
    float *dq, *dk, *dv; /* NULL when not needed; dk, dv accumulated into (zeroed first) */
    float dq_beta;       /* each dq block is written once: 0 overwrites, 1 adds */
    float *scratch;      /* [threads, QB, Tk] */
} sdpa_grads;

/* dS = P (dP - rowsum(dP P)) in place over nq rows of kend columns. */
static void softmax_grad_rows(int64_t nq, int64_t kend, const float *p, int64_t ldp, float *dp, int64_t ldd) {
    for (int64_t r = 0; r < nq; r++) {
        const float *pr = p + r * ldp;
        float *g = dp + r * ldd, s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < kend; j++) s += g[j] * pr[j];
#pragma omp simd
        for (int64_t j = 0; j < kend; j++) g[j] = pr[j] * (g[j] - s);
    }
}

/* The gradients of the G query heads of kv head `kvb` (= b * Hkv + kv), block
 * by block of queries as in the forward. dp: scratch [QB, Tk]. */
static void kv_backward(const accel_k_sdpa_dims *d, int64_t kvb, const float *q, const float *k, const float *v,
                        const float *p, const float *go, const sdpa_grads *g, float *dp) {
    int64_t G = d->H / d->Hkv, b = kvb / d->Hkv, kv = kvb % d->Hkv;
    const float *kh = k + kvb * d->Tk * d->D, *vh = v + kvb * d->Tk * d->Dv;
    float *dkh = g->dk ? g->dk + kvb * d->Tk * d->D : NULL, *dvh = g->dv ? g->dv + kvb * d->Tk * d->Dv : NULL;
    for (int64_t gi = 0; gi < G; gi++) {
        int64_t bh = b * d->H + kv * G + gi;
        const float *ph = p + bh * d->Tq * d->Tk, *goh = go + bh * d->Tq * d->Dv, *qh = q + bh * d->Tq * d->D;
        float *dqh = g->dq ? g->dq + bh * d->Tq * d->D : NULL;
        for (int64_t i0 = 0; i0 < d->Tq; i0 += QB) {
            int64_t nq = d->Tq - i0 < QB ? d->Tq - i0 : QB, kend = block_keys(d, i0, nq);
            const float *pb = ph + i0 * d->Tk, *gob = goh + i0 * d->Dv, *qb = qh + i0 * d->D;
            if (kend <= 0) {
                if (dqh && g->dq_beta == 0.0f) memset(dqh + i0 * d->D, 0, (size_t)(nq * d->D) * sizeof(float));
                continue;
            }
            if (dvh) /* dV[0:kend] += P^T dO */
                accel__sgemm(true, false, kend, d->Dv, nq, 1.0f, pb, d->Tk, gob, d->Dv, 1.0f, dvh, d->Dv);
            if (!dqh && !dkh) continue;
            /* dP = dO V^T, then dS */
            accel__sgemm(false, true, nq, kend, d->Dv, 1.0f, gob, d->Dv, vh, d->Dv, 0.0f, dp, kend);
            softmax_grad_rows(nq, kend, pb, d->Tk, dp, kend);
            if (dqh) /* dQ = s dS K */
                accel__sgemm(false, false, nq, d->D, kend, d->scale, dp, kend, kh, d->D, g->dq_beta,
                             dqh + i0 * d->D, d->D);
            if (dkh) /* dK[0:kend] += s dS^T Q */
                accel__sgemm(true, false, kend, d->D, nq, d->scale, dp, kend, qb, d->D, 1.0f, dkh, d->D);
        }
    }
}

/* Heads run in parallel (one serial sgemm per block) when there are enough of
 * them to keep the threads busy; otherwise one after another on the
 * multi-threaded GEMM. */
static bool heads_parallel(int64_t n_heads) { return n_heads >= 2 * accel_num_threads(); }

accel_status accel__cpuk_sdpa(accel_k_sdpa *k) {
    const accel_k_sdpa_dims *d = &k->dims;
    const float *qp = k->q->data, *kp = k->k->data, *vp = k->v->data;
    float *pp = k->p->data, *op = k->o->data;
    int64_t nbh = d->B * d->H;
    if (accel_reference_kernels()) {
        double *sc = accel_arena_alloc(accel_step_arena(), (size_t)(d->Tk + 1) * sizeof(double), 64);
        if (!sc) return accel_last_status();
        sdpa_reference(d, qp, kp, vp, pp, op, sc);
    } else if (heads_parallel(nbh)) {
        accel__blas_single_thread();
#pragma omp parallel for schedule(dynamic)
        for (int64_t i = 0; i < nbh; i++) head_forward(d, i, qp, kp, vp, pp, op);
    } else {
        for (int64_t i = 0; i < nbh; i++) head_forward(d, i, qp, kp, vp, pp, op);
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_sdpa_backward(accel_k_sdpa_backward *k) {
    const accel_k_sdpa_dims *d = &k->dims;
    const float *q = k->q->data, *kk = k->k->data, *v = k->v->data, *p = k->p->data, *go = k->g->data;
    int64_t nkv = d->B * d->Hkv;
    bool par = heads_parallel(nkv);
    int nt = par ? accel_num_threads() : 1;
    sdpa_grads g = {k->dq ? k->dq->data : NULL, k->dk ? k->dk->data : NULL, k->dv ? k->dv->data : NULL,
                    k->dq_beta, NULL};
    g.scratch = accel_arena_alloc(accel_step_arena(), (size_t)(nt * QB * d->Tk + 1) * sizeof(float), 64);
    if (!g.scratch) return accel_last_status();
    if (par) {
        accel__blas_single_thread();
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t i = 0; i < nkv; i++)
            kv_backward(d, i, q, kk, v, p, go, &g, g.scratch + omp_get_thread_num() * QB * d->Tk);
    } else {
        for (int64_t i = 0; i < nkv; i++) kv_backward(d, i, q, kk, v, p, go, &g, g.scratch);
    }
    return ACCEL_OK;
}
