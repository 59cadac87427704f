/* accel_sdpa: scaled dot-product attention with grouped-query heads and a
 * bottom-right aligned causal mask, computed in f32 by the device's sdpa
 * kernel, which keeps each query row's log-sum-exp (f32 [B, H, Tq]) for
 * the backward to recompute the probabilities from: O(T) saved a layer, not
 * the O(T^2) probability matrix.
 * Under autocast (or on bf16/f16 inputs) q, k, v, the output and the
 * gradients stay in that dtype, as torch.autocast's SDPA gives them: the
 * kernels read and write bf16/f16 themselves, a tile at a time, so the op
 * makes no f32 copy of q, k, v or the output. */
#include <math.h>

#include "attention.h"
#include "nn_internal.h"

typedef accel_k_sdpa_dims sdpa_dims;

/* Whether dev's sdpa kernels honour every tensor's strides (backend.h). */
static bool strided_on(accel_device dev) {
    const accel_backend *be = accel__backend_of(dev);
    return be && be->sdpa_strided;
}

/* The strides s[3] over batch, head and row of t [B, heads, T, n] as the
 * kernels read or write it in place: t's own when its rows of n elements
 * are contiguous, rows a row apart or more and no stride negative (a dim of
 * one element gets a stride that fits); false otherwise. */
static bool rows_of(const accel_tensor *t, int64_t n, int64_t s[3]) {
    if (n > 1 && t->stride[3] != 1) return false;
    s[0] = t->shape[0] == 1 ? 0 : t->stride[0];
    s[1] = t->shape[1] == 1 ? 0 : t->stride[1];
    s[2] = t->shape[2] == 1 ? n : t->stride[2];
    return s[0] >= 0 && s[1] >= 0 && s[2] >= n;
}

/* t [B, heads, T, n] as a kernel of dtype dt reads it, its strides into s:
 * t itself where `in_place` and rows_of allow, else a dense copy in dt
 * (under autocast the rounding of the input). NULL on error. */
static accel_tensor *operand_rows(accel_tensor *t, accel_dtype dt, int64_t n, bool in_place, int64_t s[3]) {
    if (in_place && t->dtype == dt && rows_of(t, n, s)) return t;
    accel_tensor *c = accel__contig_as(t, dt);
    if (c) accel_k_sdpa_dense_rows(s, t->shape[1], t->shape[2], n);
    return c;
}

/* The gradient buffer of input t [B, heads, T, n], its strides into s: on a
 * strided device a first gradient in t's own layout (the transposed view of
 * a projection's output gets a contiguous [B, T, heads, n] block that the
 * transpose's backward passes on), else dense. */
static bool grad_rows(accel__gbuf *g, accel_tensor *t, int64_t n, bool strided, int64_t s[3]) {
    bool layout = strided && (n <= 1 || t->stride[3] == 1);
    if (!(layout ? accel__gbuf_begin_native_layout(g, t) : accel__gbuf_begin_native(g, t))) return false;
    /* dst is contiguous or in t's layout, whose rows are: rows_of fits */
    if (g->dst) rows_of(g->dst, n, s);
    return true;
}

/* g's fresh memory (beta 0) zeroed to be added into (beta 1): contiguous
 * or (in t's layout) a permutation of one dense block, zeroed as that
 * block, one memset, where the fill kernel would walk the permuted strides
 * element by element. */
static bool zeroed(accel__gbuf *g) {
    if (!g->dst || g->beta != 0.0f) return true;
    int64_t numel = accel_numel(g->dst), one = 1;
    accel_tensor *block = accel_is_contiguous(g->dst) ? g->dst : accel_view_raw(g->dst, 1, &numel, &one, 0);
    if (!block || accel_zero_(block) != ACCEL_OK) return false;
    g->beta = 1.0f;
    return true;
}

/* The kernel call's status once the step-arena memory it took since mark
 * m is given back (the CPU kernels' per-thread tiles: a block's P rows, K
 * and V widened, ...), as the context-parallel op does around the same
 * kernels: one call's scratch at a time, not every layer's kept to the end
 * of the step (with heads in parallel, threads x (64 Tk + ...) floats a
 * call). Everything the kernels write (o, lse, the gradients) is allocated
 * before the mark. */
static accel_status scratch_given_back(accel_arena_mark m, accel_status st) {
    accel_status rw = accel_arena_rewind(accel_step_arena(), m);
    return st != ACCEL_OK ? st : rw;
}

static accel_status sdpa_backward(accel_node *node, accel_tensor *grad_out) {
    bool strided = strided_on(grad_out->device);
    /* o is the node's output: the tensor the kernel wrote at dims.os (on a
     * strided device the [B, Tq, H, Dv] block its view was cut from) */
    accel_k_sdpa_backward k = {.q = node->saved[0], .k = node->saved[1], .v = node->saved[2], .o = node->out,
                               .lse = node->saved[3], .dims = *(const sdpa_dims *)node->ctx};
    const sdpa_dims *d = &k.dims;
    /* o's gradient as it arrives (seen as [B, H, Tq, Dv]): on a strided
     * device read in place */
    accel_tensor *go = node->iarg[0] ? accel_transpose(grad_out, 1, 2) : grad_out;
    k.g = go ? operand_rows(go, go->dtype, d->Dv, strided, k.gs) : NULL;
    if (!k.g) return accel_last_status();
    accel__gbuf gq, gk, gv;
    if (!grad_rows(&gq, node->inputs[0], d->D, strided, k.dqs) || !grad_rows(&gk, node->inputs[1], d->D, strided, k.dks) ||
        !grad_rows(&gv, node->inputs[2], d->Dv, strided, k.dvs))
        return accel_last_status();
    /* the kernels add into dk and dv, or overwrite both: fresh ones are
     * written as they are (no memset, no old values read), else each fresh
     * one is zeroed to be added into with the other; with no query at all
     * too (kernels.h: one may return before writing anything) */
    k.dkv_overwrite = d->B > 0 && d->H > 0 && d->Tq > 0 && gk.beta == 0.0f && gv.beta == 0.0f;
    if (!k.dkv_overwrite && (!zeroed(&gk) || !zeroed(&gv))) return accel_last_status();
    k.dq = gq.dst, k.dk = gk.dst, k.dv = gv.dst, k.dq_beta = gq.beta;
    accel_arena_mark m = accel_arena_mark_now(accel_step_arena());
    accel_status st = scratch_given_back(m, ACCEL_KERNEL("sdpa backward", k.g->device, sdpa_backward, &k));
    if (st == ACCEL_OK) st = accel__gbuf_end(&gq);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gk);
    return st == ACCEL_OK ? accel__gbuf_end(&gv) : st;
}

static bool sdpa_shapes(accel_tensor *q, accel_tensor *k, accel_tensor *v, sdpa_dims *d) {
    static const char *OP = "accel_sdpa";
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) {
        accel__shape_error2(OP, q, k, "do not fit (q [B, H, Tq, D], k and v [B, Hkv, Tk, D] expected)");
        return false;
    }
    *d = (sdpa_dims){.B = q->shape[0], .H = q->shape[1], .Hkv = k->shape[1], .Tq = q->shape[2], .Tk = k->shape[2],
                     .D = q->shape[3], .Dv = v->shape[3]};
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

bool accel__sdpa_key_range_on(accel_device dev) {
    const accel_backend *be = accel__backend_of(dev);
    return dev.type == ACCEL_DEV_META || (be && be->sdpa_key_range);
}

/* key_range [B, 2] checked (0 <= lo <= hi <= Tk each row) and copied to
 * the step arena, where the backward reads it; *out NULL for none. */
static bool key_range_of(const char *OP, const int64_t *key_range, const sdpa_dims *d, accel_device dev,
                         const int64_t **out) {
    *out = NULL;
    if (!key_range || dev.type == ACCEL_DEV_META) return true; /* meta: shapes only (no cache grew there) */
    if (!accel__sdpa_key_range_on(dev)) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a key range (a padded batch's keys) is not implemented on %s",
                        OP, accel_device_type_name(dev.type));
        return false;
    }
    int64_t *r = accel_arena_alloc(accel_step_arena(), (size_t)(2 * d->B + 1) * sizeof *r, 64);
    if (!r) return false;
    for (int64_t b = 0; b < d->B; b++) {
        int64_t lo = key_range[2 * b], hi = key_range[2 * b + 1];
        if (lo < 0 || lo > hi || hi > d->Tk) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: key_range of batch row %lld is [%lld, %lld): it must lie "
                            "within the %lld keys, first <= end", OP, (long long)b, (long long)lo, (long long)hi,
                            (long long)d->Tk);
            return false;
        }
        r[2 * b] = lo, r[2 * b + 1] = hi;
    }
    *out = r;
    return true;
}

bool accel__sdpa_key_start_on(accel_device dev) {
    const accel_backend *be = accel__backend_of(dev);
    return dev.type == ACCEL_DEV_META || (be && be->sdpa_key_start);
}

/* key_start [B, Tq] checked (0 <= each <= Tk) and copied to the step arena
 * as the kernels' int32, where the backward reads it; *out NULL for none. */
static bool key_start_of(const char *OP, const int64_t *key_start, const sdpa_dims *d, accel_device dev,
                         const int32_t **out) {
    *out = NULL;
    if (!key_start || dev.type == ACCEL_DEV_META) return true;
    if (!accel__sdpa_key_start_on(dev)) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a key start per query (packed sequences) is not implemented on %s",
                        OP, accel_device_type_name(dev.type));
        return false;
    }
    if (d->Tk > INT32_MAX) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a key start per query takes at most %d keys, got %lld", OP,
                        INT32_MAX, (long long)d->Tk);
        return false;
    }
    int32_t *s = accel_arena_alloc(accel_step_arena(), (size_t)(d->B * d->Tq + 1) * sizeof *s, 64);
    if (!s) return false;
    for (int64_t i = 0; i < d->B * d->Tq; i++) {
        if (key_start[i] < 0 || key_start[i] > d->Tk) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: key_start of batch row %lld, query %lld is %lld: it must lie "
                            "within 0 and the %lld keys", OP, (long long)(i / d->Tq), (long long)(i % d->Tq),
                            (long long)key_start[i], (long long)d->Tk);
            return false;
        }
        s[i] = (int32_t)key_start[i];
    }
    *out = s;
    return true;
}

/* accel_sdpa, its output [B, H, Tq, Dv], or with heads_last [B, Tq, H, Dv]
 * (accel__sdpa_heads_last); key_range as accel__sdpa_padded's, key_start
 * as accel__sdpa_packed's (NULL: none). */
static accel_tensor *sdpa(accel_tensor *q, accel_tensor *k, accel_tensor *v, bool causal, double scale,
                          bool heads_last, const int64_t *key_range, const int64_t *key_start) {
    static const char *OP = "accel_sdpa";
    accel_tensor *in[3] = {q, k, v};
    accel_device dev;
    if (!accel__op_begin(OP, 3, in, &dev)) return NULL;
    int idt = accel__mm_dtype(OP, 3, in);
    if (idt < 0) return NULL;
    accel_dtype dt = (accel_dtype)idt;
    sdpa_dims dims;
    if (!sdpa_shapes(q, k, v, &dims) || !key_range_of(OP, key_range, &dims, dev, &dims.key_range) ||
        !key_start_of(OP, key_start, &dims, dev, &dims.key_start))
        return NULL;
    dims.causal = causal;
    dims.scale = (float)(scale > 0.0 ? scale : 1.0 / sqrt((double)(dims.D ? dims.D : 1)));
    int64_t oshape[4] = {dims.B, dims.H, dims.Tq, dims.Dv}, bthd[4] = {dims.B, dims.Tq, dims.H, dims.Dv};
    if (dev.type == ACCEL_DEV_META) return accel__op_out(dt, 4, heads_last ? bthd : oshape, dev);
    /* On a strided device q, k and v are read where they are (the
     * projections' [B, T, H, D] seen as [B, H, T, D]) and o is written in
     * that layout, [B, Tq, H, Dv] memory. Elsewhere they are dense, but for
     * decode's k and v, read in the KV cache (no copy of the whole cache
     * per token) when nothing is recorded for the backward. A k or v that
     * needs no gradient while q does (a KV cache's view, written again
     * later) is copied to be saved. The reference kernels take dense
     * tensors. */
    bool ref = accel_reference_kernels(), strided = strided_on(dev) && !ref, grad = accel_needs_grad(3, in);
    bool kv_in_place = !ref && (strided || !grad);
    accel_tensor *qc = operand_rows(q, dt, dims.D, strided, dims.qs),
                 *kc = operand_rows(k, dt, dims.D, kv_in_place && (!grad || k->requires_grad), dims.ks),
                 *vc = operand_rows(v, dt, dims.Dv, kv_in_place && (!grad || v->requires_grad), dims.vs);
    if (!qc || !kc || !vc) return NULL;
    /* o as the kernel sees it, and the tensor recorded and returned */
    accel_tensor *o, *out;
    if (strided) {
        int64_t ostride[4] = {dims.Tq * dims.H * dims.Dv, dims.Dv, dims.H * dims.Dv, 1};
        accel_tensor *block = accel__op_out(dt, 4, bthd, dev);
        o = block ? accel_view_raw(block, 4, oshape, ostride, 0) : NULL;
        out = heads_last ? block : o;
        for (int i = 0; i < 3; i++) dims.os[i] = ostride[i];
    } else {
        o = out = accel__op_out(dt, 4, oshape, dev);
        accel_k_sdpa_dense_rows(dims.os, dims.H, dims.Tq, dims.Dv);
    }
    if (!o) return NULL;
    accel_tensor *lse = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(dims.B, dims.H, dims.Tq), dev);
    sdpa_dims *dc = accel_arena_alloc(accel_step_arena(), sizeof *dc, 64);
    if (!lse || !dc) return NULL;
    *dc = dims;
    accel_k_sdpa ks = {.o = o, .lse = lse, .q = qc, .k = kc, .v = vc, .dims = dims};
    accel_arena_mark m = accel_arena_mark_now(accel_step_arena());
    if (scratch_given_back(m, ACCEL_KERNEL(OP, dev, sdpa, &ks)) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("sdpa", sdpa_backward, out, 3, in);
    if (n) {
        n->saved[0] = qc;
        n->saved[1] = kc;
        n->saved[2] = vc;
        n->saved[3] = lse;
        n->ctx = dc;
        n->iarg[0] = out != o; /* the gradient arrives [B, Tq, H, Dv] */
    }
    /* a dense device's heads_last: the transposed copy, recorded */
    return heads_last && out == o ? accel_contiguous(accel_transpose(out, 1, 2)) : out;
}

accel_tensor *accel_sdpa(accel_tensor *q, accel_tensor *k, accel_tensor *v, bool causal, double scale) {
    return sdpa(q, k, v, causal, scale, false, NULL, NULL);
}

accel_tensor *accel__sdpa_heads_last(accel_tensor *q, accel_tensor *k, accel_tensor *v, bool causal, double scale) {
    return sdpa(q, k, v, causal, scale, true, NULL, NULL);
}

accel_tensor *accel__sdpa_padded(accel_tensor *q, accel_tensor *k, accel_tensor *v, const int64_t *key_range,
                                 double scale) {
    return sdpa(q, k, v, true, scale, true, key_range, NULL);
}

accel_tensor *accel__sdpa_packed(accel_tensor *q, accel_tensor *k, accel_tensor *v, const int64_t *key_start,
                                 double scale) {
    return sdpa(q, k, v, true, scale, true, NULL, key_start);
}
