/* accel_cp_attention: causal attention over a sequence split across the
 * ranks of pg in the load-balanced layout of accel/cp.h (rank r holds global
 * chunks r and 2*cp-1-r of c positions each), composed of differentiable ops
 * so that the backward follows from the forward:
 *
 *   allgather  K, V [B, Hkv, 2c, D] -all_gather-> [cp, B, Hkv, 2c, D] ->
 *              global order [B, Hkv, T, D]; local query chunk g attends
 *              causally to the first (g+1)*c keys (accel_sdpa's bottom-right
 *              causal mask then lines up: query i sees key j <= i + g*c).
 *              Backward: the all_gather's reduce-scatter of dK, dV.
 *   alltoall   (Ulysses) Q, K, V [B, H, 2c, D] -> [cp, B, H/cp, 2c, D] (head
 *              group k for rank k) -all_to_all-> rank k's chunks of my head
 *              group -> global order [B, H/cp, T, D]; causal sdpa; the output
 *              goes back the reverse way. */
#include <string.h>

#include "accel/cp.h"
#include "nn_internal.h"

/* Rank-ordered blocks [cp, B, h, 2c, D] (block r: rank r's chunks r and
 * 2cp-1-r) <-> the sequence in global order [B, h, T, D]: one copy of rows
 * each way. A single op (not 2cp slices and a concat) so that its backward,
 * the copy the other way, allocates one gradient instead of one of the whole
 * tensor per chunk. */
typedef struct reorder_dims {
    int cp;
    int64_t BH, c, D;
} reorder_dims;

static void move_chunks(const reorder_dims *d, const char *src, char *dst, bool to_global, size_t es) {
    int64_t T = 2 * d->cp * d->c;
    size_t row = (size_t)(d->c * d->D) * es;
    for (int r = 0; r < d->cp; r++)
        for (int64_t bh = 0; bh < d->BH; bh++)
            for (int half = 0; half < 2; half++) {
                int64_t g = half == 0 ? r : 2 * d->cp - 1 - r;
                size_t b = (size_t)(((r * d->BH + bh) * 2 * d->c + half * d->c) * d->D) * es;
                size_t q = (size_t)((bh * T + g * d->c) * d->D) * es;
                if (to_global) memcpy(dst + q, src + b, row);
                else memcpy(dst + b, src + q, row);
            }
}

static accel_tensor *reorder(accel_tensor *x, const reorder_dims *d, bool to_global);

static accel_status reorder_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *gx = reorder(g, n->ctx, !n->iarg[0]);
    return gx ? accel_grad_accumulate(n->inputs[0], gx) : accel_last_status();
}

/* to_global: x [cp, B, h, 2c, D] -> [B, h, T, D]; else the reverse. */
static accel_tensor *reorder(accel_tensor *x, const reorder_dims *d, bool to_global) {
    accel_tensor *xc = x ? accel__contig(x) : NULL;
    if (!xc) return NULL;
    int64_t B = to_global ? x->shape[1] : x->shape[0], h = d->BH / B;
    int64_t gshape[4] = {B, h, 2 * d->cp * d->c, d->D}, bshape[5] = {d->cp, B, h, 2 * d->c, d->D};
    accel_tensor *out = accel__op_out(x->dtype, to_global ? 4 : 5, to_global ? gshape : bshape, x->device);
    reorder_dims *dc = out ? accel_arena_alloc(accel_step_arena(), sizeof *dc, 64) : NULL;
    if (!dc) return NULL;
    *dc = *d;
    move_chunks(d, xc->data, out->data, to_global, accel_dtype_size(x->dtype));
    accel_node *n = accel_tape_record(to_global ? "cp_to_global" : "cp_to_blocks", reorder_backward, out, 1, &x);
    if (n) {
        n->ctx = dc;
        n->iarg[0] = to_global;
    }
    return out;
}

/* ---- a collective and the reorder to global order as one op
 * all_gather: x [B, h, 2c, D] -> every rank's [cp, B, h, 2c, D] -> [B, h, T, D];
 * all_to_all: x [cp, B, h, 2c, D] -> [cp, B, h, 2c, D] -> [B, h, T, D].
 * The rank-ordered blocks live in a heap scratch for the length of the call,
 * forward and backward, not in the step arena: there the all-gathered K and
 * V would be held twice per layer (the blocks and the reordered copy) until
 * the step ends, and their gradients twice more, a fixed cost per rank of
 * the whole sequence's length whatever cp is. The backward reorders the
 * gradient into the scratch and sends it back: reduce-scatter (the sum of
 * the ranks' gradients of my block) or all_to_all (its own adjoint). */
typedef struct gather_ctx {
    accel_pg *pg;
    reorder_dims d;
    bool a2a;
} gather_ctx;

static accel_status gather_global_backward(accel_node *n, accel_tensor *g) {
    const gather_ctx *gc = n->ctx;
    accel_tensor *x = n->inputs[0], *gcontig = accel__contig(g);
    size_t es = accel_dtype_size(g->dtype), block = (size_t)(accel_numel(g) / gc->d.cp);
    char *scratch = gcontig ? accel_malloc(block * gc->d.cp * es) : NULL;
    accel_tensor *gx = scratch ? accel_empty_on(g->dtype, x->ndim, x->shape, x->device) : NULL;
    accel_status st = gx ? ACCEL_OK : accel_last_status();
    if (!st) {
        move_chunks(&gc->d, gcontig->data, scratch, false, es);
        st = gc->a2a ? accel_pg_all_to_all(gc->pg, scratch, gx->data, block, g->dtype)
                     : accel_pg_reduce_scatter(gc->pg, scratch, gx->data, block, g->dtype, ACCEL_REDUCE_SUM);
    }
    accel_free(scratch);
    return st ? st : accel_grad_accumulate(x, gx);
}

static accel_tensor *gather_global(accel_pg *pg, accel_tensor *x, int cp, int64_t c, bool a2a) {
    accel_tensor *xc = x ? accel__contig(x) : NULL;
    if (!xc) return NULL;
    int o = a2a ? 1 : 0; /* x's B, h, 2c, D start at dim o */
    int64_t B = x->shape[o], h = x->shape[o + 1], D = x->shape[o + 3];
    size_t es = accel_dtype_size(x->dtype), block = (size_t)(B * h * 2 * c * D);
    accel_tensor *out = accel__op_out(x->dtype, 4, (int64_t[]){B, h, 2 * cp * c, D}, x->device);
    gather_ctx *ctx = out ? accel_arena_alloc(accel_step_arena(), sizeof *ctx, 64) : NULL;
    char *scratch = ctx ? accel_malloc(block * (size_t)cp * es) : NULL;
    if (!scratch) return NULL;
    *ctx = (gather_ctx){pg, {cp, B * h, c, D}, a2a};
    accel_status st = a2a ? accel_pg_all_to_all(pg, xc->data, scratch, block, x->dtype)
                          : accel_pg_all_gather(pg, xc->data, scratch, block, x->dtype);
    if (!st) move_chunks(&ctx->d, scratch, out->data, true, es);
    accel_free(scratch);
    if (st) return NULL;
    accel_node *n = accel_tape_record(a2a ? "cp_all_to_all_global" : "cp_all_gather_global", gather_global_backward,
                                      out, 1, &x);
    if (n) n->ctx = ctx;
    return out;
}

static accel_tensor *to_blocks(accel_tensor *x, int cp, int64_t c) {
    if (!x) return NULL;
    reorder_dims d = {cp, x->shape[0] * x->shape[1], c, x->shape[3]};
    return reorder(x, &d, false);
}

/* ---- the first `keys` positions of every (b, h) row of x [B, h, T, D], as a
 * contiguous [B, h, keys, D]: the key prefix a query chunk attends to. Its
 * backward adds into x's gradient in place (accel__gbuf), so the two chunks'
 * prefixes share one whole-sequence gradient where slices would allocate one
 * each and a third to add them. The copy is the one accel_sdpa makes of a
 * strided slice (a contiguous input it reads as it is). */
static accel_status prefix_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0], *gc = accel__contig_as(g, ACCEL_F32);
    accel__gbuf gb;
    if (!gc || !accel__gbuf_begin_zeroed(&gb, x)) return accel_last_status();
    if (!gb.dst) return ACCEL_OK; /* x needs no gradient */
    int64_t BH = x->shape[0] * x->shape[1], row = x->shape[2] * x->shape[3], pre = g->shape[2] * g->shape[3];
    float *dst = gb.dst->data;
    const float *src = gc->data;
    for (int64_t bh = 0; bh < BH; bh++)
        for (int64_t i = 0; i < pre; i++) dst[bh * row + i] += src[bh * pre + i];
    return accel__gbuf_end(&gb);
}

static accel_tensor *key_prefix(accel_tensor *x, int64_t keys) {
    accel_tensor *xc = accel__contig(x);
    int64_t B = x->shape[0], h = x->shape[1], T = x->shape[2], D = x->shape[3];
    accel_tensor *out = xc ? accel__op_out(x->dtype, 4, (int64_t[]){B, h, keys, D}, x->device) : NULL;
    if (!out) return NULL;
    size_t es = accel_dtype_size(x->dtype);
    for (int64_t bh = 0; bh < B * h; bh++)
        memcpy((char *)out->data + (size_t)(bh * keys * D) * es, (const char *)xc->data + (size_t)(bh * T * D) * es,
               (size_t)(keys * D) * es);
    accel_tape_record("cp_key_prefix", prefix_backward, out, 1, &x);
    return out;
}

static accel_tensor *allgather_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                         double scale, int cp, int rank, int64_t c) {
    accel_tensor *kg = gather_global(pg, k, cp, c, false);
    accel_tensor *vg = kg ? gather_global(pg, v, cp, c, false) : NULL;
    if (!vg) return NULL;
    accel_tensor *out[2];
    for (int half = 0; half < 2; half++) {
        int64_t g = half == 0 ? rank : 2 * cp - 1 - rank, keys = (g + 1) * c;
        accel_tensor *qh = accel_slice(q, 2, half * c, (half + 1) * c, 1);
        accel_tensor *kh = key_prefix(kg, keys), *vh = kh ? key_prefix(vg, keys) : NULL;
        out[half] = qh && kh && vh ? accel_sdpa(qh, kh, vh, true, scale) : NULL;
        if (!out[half]) return NULL;
    }
    return accel_concat(2, out, 2);
}

/* x [B, h, 2c, D] -> [B, h/cp, T, D]: my head group over the whole sequence. */
static accel_tensor *heads_to_me(accel_pg *pg, accel_tensor *x, int cp, int64_t c) {
    int64_t B = x->shape[0], h = x->shape[1], D = x->shape[3];
    accel_tensor *r = accel_reshape(x, 5, (int64_t[]){B, cp, h / cp, 2 * c, D});
    accel_tensor *p = r ? accel_permute(r, (int[]){1, 0, 2, 3, 4}) : NULL; /* [cp, B, h/cp, 2c, D] */
    return p ? gather_global(pg, p, cp, c, true) : NULL;
}

static accel_tensor *alltoall_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                        double scale, int cp, int64_t c) {
    int64_t B = q->shape[0], H = q->shape[1], Hkv = k->shape[1], D = q->shape[3], Dv = v->shape[3];
    if (Hkv % cp != 0) { /* too few kv heads to split: each query head gets its own copy */
        int64_t rep = H / Hkv;
        accel_tensor *kx = accel_expand(accel_unsqueeze(k, 2), 5, (int64_t[]){B, Hkv, rep, 2 * c, D});
        accel_tensor *vx = accel_expand(accel_unsqueeze(v, 2), 5, (int64_t[]){B, Hkv, rep, 2 * c, Dv});
        k = kx ? accel_reshape(kx, 4, (int64_t[]){B, H, 2 * c, D}) : NULL;
        v = vx ? accel_reshape(vx, 4, (int64_t[]){B, H, 2 * c, Dv}) : NULL;
        if (!k || !v) return NULL;
    }
    accel_tensor *qs = heads_to_me(pg, q, cp, c), *ks = qs ? heads_to_me(pg, k, cp, c) : NULL;
    accel_tensor *vs = ks ? heads_to_me(pg, v, cp, c) : NULL;
    accel_tensor *o = vs ? accel_sdpa(qs, ks, vs, true, scale) : NULL; /* [B, H/cp, T, Dv] */
    accel_tensor *ob = o ? accel_cp_all_to_all(pg, to_blocks(o, cp, c)) : NULL; /* [cp(head group), B, H/cp, 2c, Dv] */
    accel_tensor *p = ob ? accel_permute(ob, (int[]){1, 0, 2, 3, 4}) : NULL;
    return p ? accel_reshape(p, 4, (int64_t[]){B, H, 2 * c, Dv}) : NULL;
}

accel_tensor *accel_cp_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                 accel_cp_strategy strategy, double scale) {
    static const char *OP = "accel_cp_attention";
    accel_tensor *in[3] = {q, k, v};
    accel_device dev;
    if (!pg) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: process group is NULL", OP);
        return NULL;
    }
    if (!accel__op_begin(OP, 3, in, &dev)) return NULL;
    int cp = accel_pg_size(pg), rank = accel_pg_rank(pg);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) {
        accel__shape_error2(OP, q, k, "do not fit (q [B, H, 2c, D], k and v [B, Hkv, 2c, D] expected)");
        return NULL;
    }
    int64_t T2 = q->shape[2];
    if (T2 % 2 != 0 || k->shape[2] != T2 || v->shape[2] != T2) {
        accel__shape_error2(OP, q, k, "do not fit (each rank holds two chunks of c positions: the local "
                                      "sequence 2c must be even and the same in q, k and v)");
        return NULL;
    }
    if (dev.type != ACCEL_DEV_CPU) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: runs on cpu tensors (these are on %s)", OP,
                        accel_device_type_name(dev.type));
        return NULL;
    }
    if (strategy == ACCEL_CP_ALLGATHER) return allgather_attention(pg, q, k, v, scale, cp, rank, T2 / 2);
    if (strategy != ACCEL_CP_ALLTOALL) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: unknown strategy %d", OP, (int)strategy);
        return NULL;
    }
    int64_t H = q->shape[1], Hkv = k->shape[1];
    if (H % cp != 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: the all-to-all strategy splits the %lld query heads over cp = %d "
                        "ranks: %lld %% %d != 0 (use the all-gather strategy, or a cp size dividing the heads)",
                        OP, (long long)H, cp, (long long)H, cp);
        return NULL;
    }
    if (Hkv == 0 || H % Hkv != 0) {
        accel__shape_error2(OP, q, k, "do not fit (query heads must be a multiple of kv heads)");
        return NULL;
    }
    return alltoall_attention(pg, q, k, v, scale, cp, T2 / 2);
}
