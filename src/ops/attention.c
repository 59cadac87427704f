/* accel_sdpa: scaled dot-product attention with grouped-query heads and a
 * bottom-right aligned causal mask, computed in f32. The forward keeps the
 * softmax probabilities P [B, H, Tq, Tk] for the backward. Large heads run
 * one after another on the threaded BLAS; small heads run in parallel (one
 * OpenMP thread per head) on a serial kernel. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "nn_internal.h"

typedef struct sdpa_dims {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    float scale;
    bool causal;
} sdpa_dims;

typedef void (*gemm_fn)(bool, bool, int64_t, int64_t, int64_t, float, const float *, int64_t,
                        const float *, int64_t, float, float *, int64_t);

/* Heads big enough for the threaded BLAS to pay off (and to be run serially). */
static bool big_heads(const sdpa_dims *d) { return d->Tq * d->Tk * (d->D > d->Dv ? d->D : d->Dv) >= (1 << 18); }

/* Last key query i may see (inclusive); -1 when none. */
static inline int64_t last_key(const sdpa_dims *d, int64_t i) {
    if (!d->causal) return d->Tk - 1;
    int64_t l = i + d->Tk - d->Tq;
    return l < -1 ? -1 : l < d->Tk - 1 ? l : d->Tk - 1;
}

/* Masked softmax of the score rows of one head, in place: p [Tq, Tk]. A row
 * that sees no key is all zeros. */
static void masked_softmax(const sdpa_dims *d, float *p) {
    for (int64_t i = 0; i < d->Tq; i++) {
        float *r = p + i * d->Tk;
        int64_t L = last_key(d, i);
        float m = -INFINITY, s = 0.0f;
        for (int64_t j = 0; j <= L; j++) m = fmaxf(m, r[j]);
        for (int64_t j = 0; j <= L; j++) {
            r[j] = expf(r[j] - m);
            s += r[j];
        }
        float inv = L >= 0 ? 1.0f / s : 0.0f;
        for (int64_t j = 0; j <= L; j++) r[j] *= inv;
        for (int64_t j = L + 1; j < d->Tk; j++) r[j] = 0.0f;
    }
}

static void head_forward(const sdpa_dims *d, int64_t bh, const float *q, const float *k, const float *v,
                         float *p, float *o, gemm_fn gemm) {
    int64_t b = bh / d->H, h = bh % d->H, kvh = b * d->Hkv + h / (d->H / d->Hkv);
    const float *qh = q + bh * d->Tq * d->D, *kh = k + kvh * d->Tk * d->D, *vh = v + kvh * d->Tk * d->Dv;
    float *ph = p + bh * d->Tq * d->Tk, *oh = o + bh * d->Tq * d->Dv;
    gemm(false, true, d->Tq, d->Tk, d->D, d->scale, qh, d->D, kh, d->D, 0.0f, ph, d->Tk); /* S = s Q K^T */
    masked_softmax(d, ph);
    gemm(false, false, d->Tq, d->Dv, d->Tk, 1.0f, ph, d->Tk, vh, d->Dv, 0.0f, oh, d->Dv); /* O = P V */
}

/* The reference: one query row at a time, double accumulation. */
static void sdpa_reference(const sdpa_dims *d, const float *q, const float *k, const float *v, float *p, float *o,
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
    float *dq, *dk, *dv; /* NULL when not needed; accumulated into (zeroed first) */
    float *scratch;      /* [threads, Tq, Tk] */
} sdpa_grads;

/* The gradients of the G query heads of kv head `kvb` (= b * Hkv + kv). */
static void kv_backward(const sdpa_dims *d, int64_t kvb, const float *q, const float *k, const float *v,
                        const float *p, const float *go, const sdpa_grads *g, float *dp, gemm_fn gemm) {
    int64_t G = d->H / d->Hkv, b = kvb / d->Hkv, kv = kvb % d->Hkv;
    const float *kh = k + kvb * d->Tk * d->D, *vh = v + kvb * d->Tk * d->Dv;
    for (int64_t gi = 0; gi < G; gi++) {
        int64_t bh = b * d->H + kv * G + gi;
        const float *ph = p + bh * d->Tq * d->Tk, *goh = go + bh * d->Tq * d->Dv, *qh = q + bh * d->Tq * d->D;
        if (g->dv) /* dV += P^T dO */
            gemm(true, false, d->Tk, d->Dv, d->Tq, 1.0f, ph, d->Tk, goh, d->Dv, 1.0f, g->dv + kvb * d->Tk * d->Dv, d->Dv);
        if (!g->dq && !g->dk) continue;
        gemm(false, true, d->Tq, d->Tk, d->Dv, 1.0f, goh, d->Dv, vh, d->Dv, 0.0f, dp, d->Tk); /* dP = dO V^T */
        for (int64_t i = 0; i < d->Tq; i++) { /* dS = P (dP - rowsum(dP P)) */
            const float *pr = ph + i * d->Tk;
            float *r = dp + i * d->Tk, s = 0.0f;
            for (int64_t j = 0; j < d->Tk; j++) s += r[j] * pr[j];
            for (int64_t j = 0; j < d->Tk; j++) r[j] = pr[j] * (r[j] - s);
        }
        if (g->dq) /* dQ = s dS K */
            gemm(false, false, d->Tq, d->D, d->Tk, d->scale, dp, d->Tk, kh, d->D, 1.0f, g->dq + bh * d->Tq * d->D, d->D);
        if (g->dk) /* dK += s dS^T Q */
            gemm(true, false, d->Tk, d->D, d->Tq, d->scale, dp, d->Tk, qh, d->D, 1.0f, g->dk + kvb * d->Tk * d->D, d->D);
    }
}

static accel_status sdpa_backward(accel_node *node, accel_tensor *grad_out) {
    const sdpa_dims *d = node->ctx;
    const float *q = node->saved[0]->data, *k = node->saved[1]->data, *v = node->saved[2]->data,
                *p = node->saved[3]->data;
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    accel__gbuf gq, gk, gv;
    if (!accel__gbuf_begin_zeroed(&gq, node->inputs[0]) || !accel__gbuf_begin_zeroed(&gk, node->inputs[1]) ||
        !accel__gbuf_begin_zeroed(&gv, node->inputs[2]))
        return accel_last_status();
    bool serial = big_heads(d) || accel_reference_kernels();
    int nt = serial ? 1 : accel_num_threads();
    sdpa_grads g = {gq.p, gk.p, gv.p, NULL};
    g.scratch = accel_arena_alloc(accel_step_arena(), (size_t)(nt * d->Tq * d->Tk + 1) * sizeof(float), 64);
    if (!g.scratch) return accel_last_status();
    int64_t nkv = d->B * d->Hkv;
    if (serial) {
        for (int64_t i = 0; i < nkv; i++) kv_backward(d, i, q, k, v, p, gt->data, &g, g.scratch, accel__sgemm);
    } else {
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t i = 0; i < nkv; i++)
            kv_backward(d, i, q, k, v, p, gt->data, &g, g.scratch + omp_get_thread_num() * d->Tq * d->Tk,
                        accel__sgemm_serial);
    }
    accel_status st = accel__gbuf_end(&gq);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gk);
    return st == ACCEL_OK ? accel__gbuf_end(&gv) : st;
}

static bool sdpa_shapes(accel_tensor *q, accel_tensor *k, accel_tensor *v, sdpa_dims *d) {
    static const char *OP = "accel_sdpa";
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) {
        accel__shape_error2(OP, q, k, "do not fit (q [B, H, Tq, D], k and v [B, Hkv, Tk, D] expected)");
        return false;
    }
    *d = (sdpa_dims){q->shape[0], q->shape[1], k->shape[1], q->shape[2], k->shape[2], q->shape[3], v->shape[3], 0, false};
    if (k->shape[0] != d->B || k->shape[3] != d->D) {
        accel__shape_error2(OP, q, k, "do not fit (batch and head dim of q and k must match)");
        return false;
    }
    if (v->shape[0] != d->B || v->shape[1] != d->Hkv || v->shape[2] != d->Tk) {
        accel__shape_error2(OP, k, v, "do not fit (k and v must agree on B, Hkv and Tk)");
        return false;
    }
    if (d->Hkv == 0 || d->H % d->Hkv != 0) {
        accel__shape_error2(OP, q, k, "do not fit (query heads must be a multiple of kv heads)");
        return false;
    }
    return true;
}

accel_tensor *accel_sdpa(accel_tensor *q, accel_tensor *k, accel_tensor *v, bool causal, double scale) {
    static const char *OP = "accel_sdpa";
    accel_tensor *in[3] = {q, k, v};
    accel_device dev;
    if (!accel__op_begin(OP, 3, in, &dev)) return NULL;
    int dt = accel__mm_dtype(OP, 3, in);
    if (dt < 0) return NULL;
    sdpa_dims dims;
    if (!sdpa_shapes(q, k, v, &dims)) return NULL;
    dims.causal = causal;
    dims.scale = (float)(scale > 0.0 ? scale : 1.0 / sqrt((double)(dims.D ? dims.D : 1)));
    int64_t oshape[4] = {dims.B, dims.H, dims.Tq, dims.Dv};
    accel_tensor *out = accel__op_out((accel_dtype)dt, 4, oshape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *qf = accel__mm_operand(q, (accel_dtype)dt), *kf = accel__mm_operand(k, (accel_dtype)dt),
                 *vf = accel__mm_operand(v, (accel_dtype)dt);
    if (!qf || !kf || !vf) return NULL;
    qf = accel__f32_contig(qf);
    kf = accel__f32_contig(kf);
    vf = accel__f32_contig(vf);
    accel_tensor *p = accel_empty(ACCEL_F32, ACCEL_SHAPE(dims.B, dims.H, dims.Tq, dims.Tk));
    accel_tensor *o = (accel_dtype)dt == ACCEL_F32 ? out : accel_empty(ACCEL_F32, 4, oshape);
    sdpa_dims *dc = accel_arena_alloc(accel_step_arena(), sizeof *dc, 64);
    if (!qf || !kf || !vf || !p || !o || !dc) return NULL;
    *dc = dims;
    const float *qp = qf->data, *kp = kf->data, *vp = vf->data;
    float *pp = p->data, *op = o->data;
    int64_t nbh = dims.B * dims.H;
    if (accel_reference_kernels()) {
        double *sc = accel_arena_alloc(accel_step_arena(), (size_t)(dims.Tk + 1) * sizeof(double), 64);
        if (!sc) return NULL;
        sdpa_reference(&dims, qp, kp, vp, pp, op, sc);
    } else if (big_heads(&dims)) {
        for (int64_t i = 0; i < nbh; i++) head_forward(&dims, i, qp, kp, vp, pp, op, accel__sgemm);
    } else {
#pragma omp parallel for schedule(dynamic) if (nbh > 1)
        for (int64_t i = 0; i < nbh; i++) head_forward(&dims, i, qp, kp, vp, pp, op, accel__sgemm_serial);
    }
    if (o != out && accel_copy_(out, o) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("sdpa", sdpa_backward, out, 3, in);
    if (n) {
        n->saved[0] = qf;
        n->saved[1] = kf;
        n->saved[2] = vf;
        n->saved[3] = p;
        n->ctx = dc;
    }
    return out;
}
