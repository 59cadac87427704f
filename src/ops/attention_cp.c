/* accel_cp_attention: causal attention over a sequence split across the
 * ranks of pg in the load-balanced layout of accel/cp.h (rank r holds global
 * chunks r and 2*cp-1-r of c positions each):
 *
 *   allgather  K, V [B, Hkv, 2c, D] -all_gather-> [cp, B, Hkv, 2c, D]; local
 *              query chunk g attends causally to the first (g+1)*c keys
 *              (the bottom-right causal mask then lines up: query i sees key
 *              j <= i + g*c). One op whose backward gathers K and V again
 *              and reduce-scatters dK, dV, so that no whole-sequence tensor
 *              outlives the call; with a sliding window or soft-capping
 *              (explicit scores), composed ops over the gathered K and V
 *              (f32 under bf16/f16, so that their gradients are summed in
 *              f32, as the fused op's are).
 *   alltoall   (Ulysses) Q, K, V [B, H, 2c, D] -> [cp, B, H/cp, 2c, D] (head
 *              group k for rank k) -all_to_all-> rank k's chunks of my head
 *              group -> global order [B, H/cp, T, D]; causal attention by
 *              blocks of queries over the band of keys each sees (one op:
 *              by the sdpa kernels, which keep each query row's
 *              log-sum-exp, or with a sliding window or soft-capping by
 *              explicit scores, which keep the probabilities of the band);
 *              the output goes back the reverse way. Each crossing is one
 *              op.
 *
 * Windows and soft-capping apply at the global positions, their explicit
 * scores under bf16/f16 with the numerics the caller names (cp_mask's
 * upcast), as the one-process decoder computes them. Scratch memory
 * (the rank-ordered blocks, the key prefixes) is step-arena memory given
 * back before each op returns. Tensor memory is read and written through
 * the device layer (views and accel_copy_, the sdpa kernels); the process
 * group is handed cpu tensors' memory (accel__device_ptr). */
#include <math.h>

#include "accel/cp.h"
#include "attention_masked.h"
#include "nn_internal.h"

/* What each query chunk's attention applies: the scale (<= 0: 1/sqrt(D)), a
 * sliding window of W keys (0: none), soft-capping at cap (0: none), and
 * the explicit scores' numerics under bf16/f16 (upcast: torch's SDPA's,
 * else transformers' eager attention's; accel__scores_attention): the
 * decoder's choice for its family, as its one-process path takes it. */
typedef struct cp_mask {
    double scale;
    int64_t W;
    double cap;
    bool upcast;
} cp_mask;

/* ---- the sequence's chunks between rank-ordered blocks [cp, B, h, 2c, D]
 * (block r: rank r's chunks r and 2cp-1-r) and global order [B, h, T, D],
 * as views copied through the device layer (accel_copy_). */

/* Block k of blocks [cp, B, h, L, D]: a view [B, h, L, D]. */
static accel_tensor *block(accel_tensor *blocks, int64_t k) {
    const int64_t *s = blocks->shape;
    return accel_reshape(accel_slice(blocks, 0, k, k + 1, 1), 4, (int64_t[]){s[1], s[2], s[3], s[4]});
}

/* Chunk j (0 <= j < 2cp) of the sequence where it lies in blocks: a view
 * [B, h, c, D]. */
static accel_tensor *block_chunk(accel_tensor *blocks, int cp, int64_t j, int64_t c) {
    int64_t half = j < cp ? 0 : 1;
    return accel_slice(block(blocks, j < cp ? j : 2 * cp - 1 - j), 2, half * c, (half + 1) * c, 1);
}

/* Rows [r0, r0 + n) of x [B, h, L, D]: a view. */
static accel_tensor *rows(accel_tensor *x, int64_t r0, int64_t n) { return accel_slice(x, 2, r0, r0 + n, 1); }

/* Rows [j c, (j+1) c) of x [B, h, L, D]: a view. */
static accel_tensor *chunk_rows(accel_tensor *x, int64_t j, int64_t c) { return rows(x, j * c, c); }

/* Rows [r0, r0 + n) of x as a contiguous tensor of dtype dt (a copy). */
static accel_tensor *rows_copy(accel_tensor *x, int64_t r0, int64_t n, accel_dtype dt) {
    accel_tensor *r = rows(x, r0, n);
    return r ? accel__contig_as(r, dt) : NULL;
}

/* Rows [r0, r0 + n) of x overwritten with src. */
static accel_status copy_rows(accel_tensor *x, int64_t r0, int64_t n, const accel_tensor *src) {
    accel_tensor *r = rows(x, r0, n);
    return r ? accel_copy_(r, src) : accel_last_status();
}

/* Copies blocks (contiguous) to global order, or back (to_global false).
 * Views only: no node is recorded whatever needs a gradient. */
static accel_status move_chunks(accel_tensor *blocks, accel_tensor *global, int cp, int64_t c, bool to_global) {
    bool grad = accel_set_grad_enabled(false);
    accel_status st = ACCEL_OK;
    for (int64_t j = 0; j < 2 * cp && !st; j++) {
        accel_tensor *b = block_chunk(blocks, cp, j, c), *g = chunk_rows(global, j, c);
        st = !b || !g ? accel_last_status() : to_global ? accel_copy_(g, b) : accel_copy_(b, g);
    }
    accel_set_grad_enabled(grad);
    return st;
}

/* ---- the sequence between this rank's chunks and global order, as one op
 * each way (the collective and the reorder together):
 *   allgather  to_global: x [B, h, 2c, D] -all_gather-> blocks [cp, B, h, 2c, D]
 *              -> [B, h, T, D]; from_global (its adjoint): the blocks of a
 *              [B, h, T, D] -reduce_scatter (sum)-> [B, h, 2c, D].
 *   alltoall   to_global: x [B, H, 2c, D] -> head group k to rank k
 *              -all_to_all-> my head group's chunks of every rank -> [B, H/cp,
 *              T, D]; from_global: the reverse (all_to_all is its own adjoint).
 * The send and receive blocks are step-arena scratch given back before the
 * op returns (accel_arena_rewind): only the result stays to the step's end,
 * and no permuted or reordered copy of q, k, v or the output does. */
typedef struct seq_ctx {
    accel_pg *pg;
    int cp;
    int64_t c;
    bool a2a;
} seq_ctx;

/* Head group k (of cp) of x [B, H, L, D]: a view [B, H/cp, L, D]. */
static accel_tensor *head_group(accel_tensor *x, int cp, int k) {
    int64_t h = x->shape[1] / cp;
    return accel_slice(x, 1, k * h, (k + 1) * h, 1);
}

/* Between x [B, H, L, D] and blocks [cp, B, H/cp, L, D], head group k <->
 * block k. */
static accel_status move_heads(accel_tensor *x, accel_tensor *blocks, int cp, bool to_blocks) {
    accel_status st = ACCEL_OK;
    for (int k = 0; k < cp && !st; k++) {
        accel_tensor *hg = head_group(x, cp, k), *b = block(blocks, k);
        st = !hg || !b ? accel_last_status() : to_blocks ? accel_copy_(b, hg) : accel_copy_(hg, b);
    }
    return st;
}

static accel_tensor *blocks_like(const accel_tensor *x, int cp, int64_t h, int64_t rows) {
    int64_t shape[5] = {cp, x->shape[0], h, rows, x->shape[3]};
    return accel_empty_on(x->dtype, 5, shape, x->device);
}

/* x (this rank's chunks) -> out [B, h, T, D] in global order. */
static accel_status to_global(const seq_ctx *g, accel_tensor *x, accel_tensor *out) {
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    int64_t h = out->shape[1], n = accel_numel(out) / g->cp;
    accel_tensor *send = g->a2a ? blocks_like(x, g->cp, h, 2 * g->c) : accel__contig(x);
    accel_tensor *recv = send ? blocks_like(x, g->cp, h, 2 * g->c) : NULL;
    accel_status st = recv ? ACCEL_OK : accel_last_status();
    if (!st && g->a2a) st = move_heads(x, send, g->cp, true);
    if (!st)
        st = g->a2a ? accel_pg_all_to_all(g->pg, accel__device_ptr(send), accel__device_ptr(recv), (size_t)n, x->dtype)
                    : accel_pg_all_gather(g->pg, accel__device_ptr(send), accel__device_ptr(recv), (size_t)n, x->dtype);
    if (!st) st = move_chunks(recv, out, g->cp, g->c, true);
    accel_status rw = accel_arena_rewind(a, m);
    return st ? st : rw;
}

/* y [B, h, T, D] in global order -> out (this rank's chunks): its head
 * groups' (all_to_all), or the sum over the ranks of its rows
 * (reduce_scatter). */
static accel_status from_global(const seq_ctx *g, accel_tensor *y, accel_tensor *out) {
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    int64_t h = y->shape[1], n = accel_numel(y) / g->cp;
    accel_tensor *send = blocks_like(y, g->cp, h, 2 * g->c);
    accel_tensor *recv = send && g->a2a ? blocks_like(y, g->cp, h, 2 * g->c) : out;
    accel_status st = send && recv ? move_chunks(send, y, g->cp, g->c, false) : accel_last_status();
    if (!st)
        st = g->a2a ? accel_pg_all_to_all(g->pg, accel__device_ptr(send), accel__device_ptr(recv), (size_t)n, y->dtype)
                    : accel_pg_reduce_scatter(g->pg, accel__device_ptr(send), accel__device_ptr(out), (size_t)n,
                                              y->dtype, ACCEL_REDUCE_SUM);
    if (!st && g->a2a) st = move_heads(out, recv, g->cp, false);
    accel_status rw = accel_arena_rewind(a, m);
    return st ? st : rw;
}

/* The shape on the other side: this rank's chunks [B, H or h, 2c, D] <->
 * global order [B, h, T, D] (h = H/cp under all_to_all). */
static accel_tensor *other_side(const seq_ctx *g, const accel_tensor *x, bool global, accel_dtype dt) {
    int64_t H = x->shape[1], heads = !g->a2a ? H : global ? H / g->cp : H * g->cp;
    int64_t rows = global ? 2 * g->cp * g->c : 2 * g->c;
    return accel_empty_on(dt, 4, (int64_t[]){x->shape[0], heads, rows, x->shape[3]}, x->device);
}

static accel_status seq_backward(accel_node *n, accel_tensor *g) {
    const seq_ctx *c = n->ctx;
    bool to = n->iarg[0];
    accel_tensor *gc = accel__contig(g), *gx = gc ? other_side(c, gc, !to, gc->dtype) : NULL;
    accel_status st = gx ? (to ? from_global(c, gc, gx) : to_global(c, gc, gx)) : accel_last_status();
    return st ? st : accel_grad_accumulate(n->inputs[0], gx);
}

/* to_global (x: this rank's chunks) or from_global (x in global order), as an
 * op whose backward is the other; to_global's result of dtype dt (x's
 * exchanged in x's dtype, converted on arrival), from_global's x's. */
static accel_tensor *seq_exchange_as(accel_pg *pg, accel_tensor *x, int cp, int64_t c, bool a2a, bool to,
                                     accel_dtype dt) {
    accel_tensor *xs = x && !to ? accel__contig(x) : x, *out = NULL;
    seq_ctx *ctx = xs ? accel_arena_alloc(accel_step_arena(), sizeof *ctx, 64) : NULL;
    if (ctx) {
        *ctx = (seq_ctx){pg, cp, c, a2a};
        out = other_side(ctx, x, to, to ? dt : x->dtype);
    }
    if (!out) return NULL;
    bool grad = accel_set_grad_enabled(false);
    accel_status st = to ? to_global(ctx, xs, out) : from_global(ctx, xs, out);
    accel_set_grad_enabled(grad);
    if (st) return NULL;
    accel_node *n = accel_tape_record(a2a ? "cp_all_to_all_seq" : "cp_all_gather_seq", seq_backward, out, 1, &x);
    if (n) {
        n->ctx = ctx;
        n->iarg[0] = to;
    }
    return out;
}

static accel_tensor *seq_exchange(accel_pg *pg, accel_tensor *x, int cp, int64_t c, bool a2a, bool to) {
    return x ? seq_exchange_as(pg, x, cp, c, a2a, to, x->dtype) : NULL;
}

/* ---- a block of queries against the key prefix it sees, by the sdpa
 * kernels: what both strategies' causal attention is made of. The bottom-right
 * causal mask of a block of Tq queries over Tk keys lines the block's last
 * query up with the prefix's last key. */

/* [x's B, x's h, n, x's D] of dtype dt, zeroed or not. */
static accel_tensor *empty_like_shape(accel_dtype dt, const accel_tensor *x, int64_t n, bool zero) {
    accel_tensor *t = accel_empty_on(dt, 4, (int64_t[]){x->shape[0], x->shape[1], n, x->shape[3]}, x->device);
    return t && zero && accel_zero_(t) != ACCEL_OK ? NULL : t;
}

/* The kernels' dims of a block of Tq query rows over Tk keys of a call
 * whose output out is [B, H, T, Dv]: q, k and v dense, o the block's rows of
 * out (written in place, read back by the backward). */
static accel_k_sdpa_dims block_dims(const accel_tensor *out, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D,
                                    float scale) {
    const int64_t *os = out->shape;
    accel_k_sdpa_dims d = {.B = os[0], .H = os[1], .Hkv = Hkv, .Tq = Tq, .Tk = Tk, .D = D, .Dv = os[3],
                           .scale = scale, .causal = true};
    accel_k_sdpa_dense(&d);
    for (int i = 0; i < 3; i++) d.os[i] = out->stride[i];
    return d;
}

/* Query rows [r0, r0 + d->Tq) of q (copied in dtype dt) over the key prefix
 * kp, vp [B, Hkv, d->Tk, D] (dense, dt): the output into out's rows, each
 * row's log-sum-exp into lse [B, H, Tq]. */
static accel_status block_forward(const accel_k_sdpa_dims *d, accel_tensor *lse, accel_tensor *q, accel_tensor *kp,
                                  accel_tensor *vp, accel_tensor *out, int64_t r0, accel_dtype dt) {
    accel_tensor *qh = kp && vp ? rows_copy(q, r0, d->Tq, dt) : NULL;
    accel_tensor *oh = qh ? rows(out, r0, d->Tq) : NULL;
    accel_k_sdpa ks = {.o = oh, .lse = lse, .q = qh, .k = kp, .v = vp, .dims = *d};
    return oh ? ACCEL_KERNEL("accel_cp_attention", q->device, sdpa, &ks) : accel_last_status();
}

/* Its backward from the output's gradient g (out the forward's output):
 * dq's rows [r0, r0 + Tq) written, the prefix's gradients added into dkp,
 * dvp (f32 [B, Hkv, Tk, D]). */
static accel_status block_backward(const accel_k_sdpa_dims *d, accel_tensor *lse, accel_tensor *out, accel_tensor *g,
                                   accel_tensor *q, accel_tensor *kp, accel_tensor *vp, accel_tensor *dq,
                                   accel_tensor *dkp, accel_tensor *dvp, int64_t r0, accel_dtype dt) {
    accel_tensor *gh = kp && vp && dkp && dvp ? rows_copy(g, r0, d->Tq, g->dtype) : NULL;
    accel_tensor *qh = gh ? rows_copy(q, r0, d->Tq, dt) : NULL;
    accel_tensor *dqh = qh ? empty_like_shape(ACCEL_F32, q, d->Tq, false) : NULL;
    accel_tensor *oh = dqh ? rows(out, r0, d->Tq) : NULL;
    accel_k_sdpa_backward kb = {.dq = dqh, .dk = dkp, .dv = dvp, .g = gh, .q = qh, .k = kp, .v = vp, .o = oh,
                                .lse = lse, .dims = *d, .dq_beta = 0.0f};
    accel_k_sdpa_backward_dense(&kb);
    accel_status st = oh ? ACCEL_KERNEL("accel_cp_attention backward", g->device, sdpa_backward, &kb)
                         : accel_last_status();
    return st ? st : copy_rows(dq, r0, d->Tq, dqh);
}

/* f32 gradients [B, h, L, D] for the node's q, k, v (dk, dv zeroed when
 * zero_kv): made before any scratch, so they outlive its rewinds. */
static bool grads_for(accel_node *n, bool zero_kv, accel_tensor *d[3]) {
    for (int i = 0; i < 3; i++) {
        const accel_tensor *x = n->inputs[i];
        if (!(d[i] = empty_like_shape(ACCEL_F32, x, x->shape[2], i > 0 && zero_kv))) return false;
    }
    return true;
}

/* d added into the gradients of the node's q, k, v. */
static accel_status accumulate_grads(accel_node *n, accel_tensor *d[3]) {
    accel_status st = ACCEL_OK;
    for (int i = 0; i < 3 && !st; i++) st = accel_grad_accumulate(n->inputs[i], d[i]);
    return st;
}

/* ---- allgather without a window or soft-capping: one op for both query
 * chunks that keeps nothing of the whole sequence for the backward. The
 * forward all-gathers K and V into a scratch, copies each chunk's key prefix
 * [B, Hkv, (g+1)c, D] out of it for the sdpa kernel (which keeps each
 * query row's log-sum-exp [B, H, c], as accel_sdpa does), and gives the
 * scratch back; the backward gathers K and V again, adds each chunk's dK,
 * dV prefix into a scratch of the whole sequence's blocks and
 * reduce-scatters it into this rank's dk, dv. Per layer the step keeps q, k, v's gradients and the
 * two chunks' log-sum-exps. */
typedef struct ag_ctx {
    accel_pg *pg;
    int cp;
    int64_t c, g[2];           /* the global chunk of each local half */
    accel_dtype dt;            /* the kernels' dtype (autocast's, at the forward) */
    accel_k_sdpa_dims dims[2]; /* per half: Tq c, Tk (g+1)c, dense k, v */
} ag_ctx;

/* Every rank's x [B, h, 2c, D] in dtype dt: blocks [cp, B, h, 2c, D]. */
static accel_tensor *gathered(accel_pg *pg, accel_tensor *x, int cp, accel_dtype dt) {
    accel_tensor *xc = accel__contig_as(x, dt);
    int64_t shape[5] = {cp, x->shape[0], x->shape[1], x->shape[2], x->shape[3]};
    accel_tensor *b = xc ? accel_empty_on(dt, 5, shape, x->device) : NULL;
    if (!b || accel_pg_all_gather(pg, accel__device_ptr(xc), accel__device_ptr(b), (size_t)accel_numel(xc), dt))
        return NULL;
    return b;
}

/* Chunks 0..g of the sequence, in order, out of blocks: [B, h, (g+1)c, D]. */
static accel_tensor *prefix_of(accel_tensor *blocks, int cp, int64_t g, int64_t c) {
    const int64_t *s = blocks->shape;
    accel_tensor *p = accel_empty_on(blocks->dtype, 4, (int64_t[]){s[1], s[2], (g + 1) * c, s[4]}, blocks->device);
    for (int64_t j = 0; p && j <= g; j++) {
        accel_tensor *d = chunk_rows(p, j, c), *b = block_chunk(blocks, cp, j, c);
        if (!d || !b || accel_copy_(d, b) != ACCEL_OK) return NULL;
    }
    return p;
}

/* view += x (a view of a scratch: through a copy of the sum). */
static accel_status add_into(accel_tensor *view, accel_tensor *x) {
    accel_tensor *sum = view && x ? accel_add(view, x) : NULL;
    return sum ? accel_copy_(view, sum) : accel_last_status();
}

/* The chunks' prefixes of dK (or dV) [B, h, (g+1)c, D] added into the
 * whole sequence's blocks. */
static accel_status add_prefix(accel_tensor *blocks, accel_tensor *dp, int cp, int64_t g, int64_t c) {
    accel_status st = ACCEL_OK;
    for (int64_t j = 0; j <= g && !st; j++) st = add_into(block_chunk(blocks, cp, j, c), chunk_rows(dp, j, c));
    return st;
}

/* One half's backward: dq's rows, and its dK, dV prefix added into dkb, dvb. */
static accel_status half_backward(const ag_ctx *x, accel_node *n, int half, accel_tensor *g, accel_tensor *kb,
                                  accel_tensor *vb, accel_tensor *dq, accel_tensor *dkb, accel_tensor *dvb) {
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    int64_t c = x->c, gi = x->g[half], Tk = (gi + 1) * c;
    accel_tensor *k = n->inputs[1], *v = n->inputs[2];
    accel_tensor *kp = prefix_of(kb, x->cp, gi, c), *vp = kp ? prefix_of(vb, x->cp, gi, c) : NULL;
    accel_tensor *dkp = empty_like_shape(ACCEL_F32, k, Tk, true), *dvp = empty_like_shape(ACCEL_F32, v, Tk, true);
    accel_status st = block_backward(&x->dims[half], n->saved[half], n->out, g, n->inputs[0], kp, vp, dq, dkp, dvp,
                                     half * c, x->dt);
    if (!st) st = add_prefix(dkb, dkp, x->cp, gi, c);
    if (!st) st = add_prefix(dvb, dvp, x->cp, gi, c);
    accel_status rw = accel_arena_rewind(a, m);
    return st ? st : rw;
}

static accel_status allgather_sdpa_backward(accel_node *n, accel_tensor *g) {
    const ag_ctx *x = n->ctx;
    accel_tensor *k = n->inputs[1], *v = n->inputs[2], *d[3]; /* this rank's dq, dk, dv */
    if (!grads_for(n, false, d)) return accel_last_status();
    accel_tensor *dq = d[0], *dk = d[1], *dv = d[2];
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    accel_tensor *kb = gathered(x->pg, k, x->cp, x->dt), *vb = kb ? gathered(x->pg, v, x->cp, x->dt) : NULL;
    accel_tensor *dkb = vb ? accel_empty_on(ACCEL_F32, 5, kb->shape, k->device) : NULL;
    accel_tensor *dvb = dkb ? accel_empty_on(ACCEL_F32, 5, vb->shape, v->device) : NULL;
    accel_status st = dvb && !accel_zero_(dkb) && !accel_zero_(dvb) ? ACCEL_OK : accel_last_status();
    for (int half = 0; half < 2 && !st; half++) st = half_backward(x, n, half, g, kb, vb, dq, dkb, dvb);
    if (!st)
        st = accel_pg_reduce_scatter(x->pg, accel__device_ptr(dkb), accel__device_ptr(dk), (size_t)accel_numel(dk),
                                     ACCEL_F32, ACCEL_REDUCE_SUM);
    if (!st)
        st = accel_pg_reduce_scatter(x->pg, accel__device_ptr(dvb), accel__device_ptr(dv), (size_t)accel_numel(dv),
                                     ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_status rw = accel_arena_rewind(a, m);
    if (st || rw) return st ? st : rw;
    return accumulate_grads(n, d);
}

/* q [B, H, 2c, D], k [B, Hkv, 2c, D], v [B, Hkv, 2c, Dv] (checked) ->
 * [B, H, 2c, Dv]. */
static accel_tensor *allgather_sdpa(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v, double scale,
                                    int cp, int rank, int64_t c) {
    static const char *OP = "accel_cp_attention";
    accel_tensor *in[3] = {q, k, v};
    int idt = accel__mm_dtype(OP, 3, in);
    if (idt < 0) return NULL;
    int64_t B = q->shape[0], H = q->shape[1], Hkv = k->shape[1], D = q->shape[3], Dv = v->shape[3];
    accel_tensor *out = accel__op_out((accel_dtype)idt, 4, (int64_t[]){B, H, 2 * c, Dv}, q->device);
    ag_ctx *x = out ? accel_arena_alloc(accel_step_arena(), sizeof *x, 64) : NULL;
    if (!x) return NULL;
    *x = (ag_ctx){.pg = pg, .cp = cp, .c = c, .g = {rank, 2 * cp - 1 - rank}, .dt = (accel_dtype)idt};
    accel_tensor *lse[2];
    for (int half = 0; half < 2; half++) {
        x->dims[half] = block_dims(out, Hkv, c, (x->g[half] + 1) * c, D,
                                   (float)(scale > 0 ? scale : 1.0 / sqrt((double)D)));
        lse[half] = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(B, H, c), q->device);
        if (!lse[half]) return NULL;
    }
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    bool grad = accel_set_grad_enabled(false);
    accel_tensor *kb = gathered(pg, k, cp, x->dt), *vb = kb ? gathered(pg, v, cp, x->dt) : NULL;
    accel_status st = vb ? ACCEL_OK : accel_last_status();
    for (int half = 0; half < 2 && !st; half++) {
        accel_tensor *kp = prefix_of(kb, cp, x->g[half], c), *vp = kp ? prefix_of(vb, cp, x->g[half], c) : NULL;
        st = block_forward(&x->dims[half], lse[half], q, kp, vp, out, half * c, x->dt);
    }
    accel_set_grad_enabled(grad);
    accel_status rw = accel_arena_rewind(a, m);
    if (st || rw) return NULL;
    accel_node *n = accel_tape_record("cp_allgather_sdpa", allgather_sdpa_backward, out, 3, in);
    if (n) {
        n->saved[0] = lse[0];
        n->saved[1] = lse[1];
        n->ctx = x;
    }
    return out;
}

/* ---- alltoall: causal attention of the rank's head group over the whole
 * sequence, q [B, h, T, D], k, v [B, hkv, T, D] in global order, by blocks
 * of query rows, each over the band of keys it sees: the prefix up to its
 * last row, from its first row's window start under a sliding window.
 * Without a window or soft-capping a block runs the sdpa kernels, which keep
 * each query row's log-sum-exp [B, h, rows] (the band's keys a copy in the
 * kernels' dtype given back before the next block: the backward kernel
 * takes dense k, v; the backward copies each block's dK, dV band out of the
 * whole gradient for the kernel to add into, and back). With them (which
 * the kernels lack) a block computes explicit scores over its band with
 * the window's mask, soft-capped (explicit_dtype: f32 from q, k, v rounded
 * to the kernels' dtype, as torch's SDPA, or eager's rounding), and keeps
 * its probabilities [B, h, rows, band] (f32): of the [T, T] square per head
 * only the band left of the diagonal, about rows + W columns per row with a
 * window; its backward, in f32 from those probabilities and the rounded q,
 * k, v, recomputes the scores where the soft-cap's derivative needs them,
 * rather than keeping them. */

/* Query rows per block: multiples of the kernel's 64-query blocks, at most
 * BLOCKS blocks. More blocks would keep a little less of the explicit
 * blocks' probabilities ((n+1)/(2n) of the square: 53% at 16, 51% at 64)
 * but copy more key prefixes and call the kernel more often (each call's
 * shapes are new to oneDNN's primitives). */
enum { KERNEL_QB = 64, BLOCKS = 16 };

static int64_t block_rows(int64_t T) {
    int64_t r = (T + BLOCKS - 1) / BLOCKS;
    return r > KERNEL_QB ? (r + KERNEL_QB - 1) / KERNEL_QB * KERNEL_QB : KERNEL_QB;
}

typedef struct band_ctx {
    int64_t rows, n;           /* query rows per block, blocks */
    accel_dtype dt;            /* the kernels' dtype (autocast's, at the forward) */
    cp_mask m;                 /* explicit blocks when m.W or m.cap */
    int64_t *k0;               /* per block: its band's first key */
    accel_k_sdpa_dims *dims;   /* per block: Tq its rows, Tk its band, dense k, v */
    accel_tensor **p;          /* per block: lse [B, h, Tq] (kernels), else the probabilities [B, h, Tq, Tk] */
} band_ctx;

static bool explicit_band(const band_ctx *x) { return x->m.W || x->m.cap > 0; }

/* Keys k0 .. k0 + n - 1 of x [B, h, T, D]: a contiguous copy in dtype dt. */
static accel_tensor *key_band(accel_tensor *x, int64_t k0, int64_t n, accel_dtype dt) { return rows_copy(x, k0, n, dt); }

/* The dtype an explicit block's forward computes in: f32 where its
 * numerics are torch's SDPA's (or the kernels' dtype is f32), else the
 * kernels' dtype (transformers' eager attention: the scores, their
 * soft-capping, the probabilities and P V rounded to it). Its backward
 * computes in f32 either way. */
static accel_dtype explicit_dtype(const band_ctx *x) { return accel__scores_dtype_of(x->dt, x->m.upcast); }

/* Rows [r0, r0 + n) of t [B, h, T, D] rounded to the kernels' dtype (as
 * torch's autocast hands q, k, v to the attention; already so when t is of
 * it) and made dt: a contiguous copy. */
static accel_tensor *rounded_rows(const band_ctx *x, accel_tensor *t, int64_t r0, int64_t n, accel_dtype dt) {
    accel_tensor *r = rows_copy(t, r0, n, t->dtype == x->dt ? dt : x->dt);
    return r && r->dtype != dt ? accel_to_dtype(r, dt) : r;
}

/* Block b's query (or output gradient) rows of x [B, H, T, D] as dt [B,
 * hkv, G rows, D] (rounded_rows): the G query heads of a kv head together,
 * as the explicit scores take them (accel__masked_attention). */
static accel_tensor *grouped_rows(const band_ctx *x, int64_t b, accel_tensor *t, int64_t hkv, accel_dtype dt) {
    const accel_k_sdpa_dims *d = &x->dims[b];
    accel_tensor *r = rounded_rows(x, t, b * x->rows, d->Tq, dt);
    return r ? accel_reshape(r, 4, (int64_t[]){d->B, hkv, d->H / hkv * d->Tq, t->shape[3]}) : NULL;
}

/* Block b's scores over its band (qg [B, hkv, G rows, D], kb [B, hkv, Tk,
 * D]), scaled and soft-capped, unmasked. */
static accel_tensor *band_scores(const band_ctx *x, int64_t b, accel_tensor *qg, accel_tensor *kb) {
    accel_tensor *s = accel_mul_scalar(accel_matmul(qg, accel_transpose(kb, 2, 3)), x->dims[b].scale);
    return x->m.cap > 0 ? accel_mul_scalar(accel_tanh(accel_mul_scalar(s, 1.0 / x->m.cap)), x->m.cap) : s;
}

/* Block b's probabilities as [B, hkv, G rows, Tk] (a view of x->p[b]). */
static accel_tensor *grouped_p(const band_ctx *x, int64_t b, int64_t hkv) {
    const accel_k_sdpa_dims *d = &x->dims[b];
    return accel_reshape(x->p[b], 4, (int64_t[]){d->B, hkv, d->H / hkv * d->Tq, d->Tk});
}

/* An explicit block, in explicit_dtype: its probabilities into x->p[b],
 * its output rows into out. */
static accel_status explicit_forward(const band_ctx *x, int64_t b, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                     accel_tensor *out) {
    const accel_k_sdpa_dims *d = &x->dims[b];
    int64_t r0 = b * x->rows, hkv = d->Hkv;
    accel_dtype dt = explicit_dtype(x);
    accel_tensor *qg = grouped_rows(x, b, q, hkv, dt), *kb = qg ? rounded_rows(x, k, x->k0[b], d->Tk, dt) : NULL;
    accel_tensor *vb = kb ? rounded_rows(x, v, x->k0[b], d->Tk, dt) : NULL;
    accel_tensor *mask = vb ? accel__window_mask(d->H / hkv * d->Tq, d->Tq, d->Tk, r0, x->k0[b], x->m.W) : NULL;
    if (mask && dt != ACCEL_F32) mask = accel_to_dtype(mask, dt);
    accel_tensor *p = mask ? accel_softmax(accel_add(band_scores(x, b, qg, kb), mask), 3) : NULL;
    accel_tensor *pv = p ? grouped_p(x, b, hkv) : NULL;
    if (!pv || accel_copy_(pv, p) != ACCEL_OK) return accel_last_status();
    accel_tensor *o = accel_matmul(p, vb); /* [B, hkv, G rows, Dv] */
    o = o ? accel_reshape(o, 4, (int64_t[]){d->B, d->H, d->Tq, d->Dv}) : NULL;
    return o ? copy_rows(out, r0, d->Tq, o) : accel_last_status();
}

/* Its backward from the output's gradient g: dq's rows written, the band's
 * dK, dV added into dk, dv (f32). dS = P (dP - rowsum(dP P)), times the
 * soft-cap's derivative 1 - tanh^2 = 1 - (capped score / cap)^2. */
static accel_status explicit_backward(const band_ctx *x, int64_t b, accel_tensor *g, accel_tensor *q, accel_tensor *k,
                                      accel_tensor *v, accel_tensor *dq, accel_tensor *dk, accel_tensor *dv) {
    const accel_k_sdpa_dims *d = &x->dims[b];
    int64_t r0 = b * x->rows, hkv = d->Hkv, k0 = x->k0[b];
    accel_tensor *gg = grouped_rows(x, b, g, hkv, ACCEL_F32), *qg = gg ? grouped_rows(x, b, q, hkv, ACCEL_F32) : NULL;
    accel_tensor *kb = qg ? rounded_rows(x, k, k0, d->Tk, ACCEL_F32) : NULL;
    accel_tensor *vb = kb ? rounded_rows(x, v, k0, d->Tk, ACCEL_F32) : NULL;
    accel_tensor *p = vb ? grouped_p(x, b, hkv) : NULL;
    accel_status st = p ? add_into(rows(dv, k0, d->Tk), accel_matmul(accel_transpose(p, 2, 3), gg))
                        : accel_last_status();
    accel_tensor *dp = st ? NULL : accel_matmul(gg, accel_transpose(vb, 2, 3));
    accel_tensor *ds = dp ? accel_mul(p, accel_sub(dp, accel_sum(accel_mul(dp, p), 1, (int[]){3}, true))) : NULL;
    if (ds && x->m.cap > 0) {
        accel_tensor *t = accel_mul_scalar(band_scores(x, b, qg, kb), 1.0 / x->m.cap);
        ds = accel_mul(ds, accel_add_scalar(accel_neg(accel_mul(t, t)), 1.0));
    }
    accel_tensor *dqb = ds ? accel_mul_scalar(accel_matmul(ds, kb), d->scale) : NULL;
    dqb = dqb ? accel_reshape(dqb, 4, (int64_t[]){d->B, d->H, d->Tq, d->D}) : NULL;
    if (!st) st = dqb ? copy_rows(dq, r0, d->Tq, dqb) : accel_last_status();
    if (!st) st = add_into(rows(dk, k0, d->Tk), accel_mul_scalar(accel_matmul(accel_transpose(ds, 2, 3), qg), d->scale));
    return st;
}

static accel_status band_backward(accel_node *n, accel_tensor *g) {
    const band_ctx *x = n->ctx;
    accel_tensor *q = n->inputs[0], *k = n->inputs[1], *v = n->inputs[2], *d[3];
    if (!grads_for(n, true, d)) return accel_last_status();
    accel_tensor *dq = d[0], *dk = d[1], *dv = d[2];
    accel_arena *a = accel_step_arena();
    accel_status st = ACCEL_OK;
    bool grad = accel_set_grad_enabled(false);
    accel_dtype ac = accel_autocast_begin(ACCEL_F32); /* the explicit blocks' ops in f32 */
    for (int64_t b = 0; b < x->n && !st; b++) {
        accel_arena_mark m = accel_arena_mark_now(a);
        int64_t Tk = x->dims[b].Tk, k0 = x->k0[b];
        if (explicit_band(x)) {
            st = explicit_backward(x, b, g, q, k, v, dq, dk, dv);
        } else {
            /* the band's gradients so far, added to by the kernel and written back */
            accel_tensor *kp = key_band(k, k0, Tk, x->dt), *vp = kp ? key_band(v, k0, Tk, x->dt) : NULL;
            accel_tensor *dkp = vp ? key_band(dk, k0, Tk, ACCEL_F32) : NULL;
            accel_tensor *dvp = dkp ? key_band(dv, k0, Tk, ACCEL_F32) : NULL;
            st = block_backward(&x->dims[b], x->p[b], n->out, g, q, kp, vp, dq, dkp, dvp, b * x->rows, x->dt);
            if (!st) st = copy_rows(dk, k0, Tk, dkp);
            if (!st) st = copy_rows(dv, k0, Tk, dvp);
        }
        accel_status rw = accel_arena_rewind(a, m);
        st = st ? st : rw;
    }
    accel_autocast_end(ac);
    accel_set_grad_enabled(grad);
    return st ? st : accumulate_grads(n, d);
}

/* q [B, h, T, D], k [B, hkv, T, D], v [B, hkv, T, Dv] (h % hkv == 0) ->
 * [B, h, T, Dv], the window and soft-cap of m applied. */
static accel_tensor *band_sdpa(accel_tensor *q, accel_tensor *k, accel_tensor *v, const cp_mask *m) {
    accel_tensor *in[3] = {q, k, v};
    int idt = accel__mm_dtype("accel_cp_attention", 3, in);
    if (idt < 0) return NULL;
    int64_t B = q->shape[0], H = q->shape[1], Hkv = k->shape[1], T = q->shape[2], D = q->shape[3], Dv = v->shape[3];
    accel_arena *a = accel_step_arena();
    accel_tensor *out = accel__op_out((accel_dtype)idt, 4, (int64_t[]){B, H, T, Dv}, q->device);
    band_ctx *x = out ? accel_arena_alloc(a, sizeof *x, 64) : NULL;
    if (!x) return NULL;
    int64_t rows = block_rows(T), n = (T + rows - 1) / rows;
    *x = (band_ctx){.rows = rows, .n = n, .dt = (accel_dtype)idt, .m = *m,
                    .k0 = accel_arena_alloc(a, (size_t)n * sizeof *x->k0, 64),
                    .dims = accel_arena_alloc(a, (size_t)n * sizeof *x->dims, 64),
                    .p = accel_arena_alloc(a, (size_t)n * sizeof *x->p, 64)};
    if (!x->k0 || !x->dims || !x->p) return NULL;
    float s = (float)(m->scale > 0 ? m->scale : 1.0 / sqrt((double)D));
    bool grad = accel_set_grad_enabled(false);
    accel_dtype ac = accel_autocast_begin(ACCEL_F32);
    accel_status st = ACCEL_OK;
    for (int64_t b = 0; b < n && !st; b++) {
        /* the band: keys up to the block's last row, from its first row's window start */
        int64_t r0 = b * rows, nq = T - r0 < rows ? T - r0 : rows, k0 = m->W && r0 >= m->W ? r0 - m->W + 1 : 0;
        int64_t Tk = r0 + nq - k0;
        x->k0[b] = k0;
        x->dims[b] = block_dims(out, Hkv, nq, Tk, D, s);
        x->p[b] = explicit_band(x) ? accel_empty_on(ACCEL_F32, ACCEL_SHAPE(B, H, nq, Tk), q->device)
                                   : accel_empty_on(ACCEL_F32, ACCEL_SHAPE(B, H, nq), q->device);
        if (!x->p[b]) {
            st = accel_last_status();
            break;
        }
        accel_arena_mark mk = accel_arena_mark_now(a);
        if (explicit_band(x)) {
            st = explicit_forward(x, b, q, k, v, out);
        } else {
            accel_tensor *kp = key_band(k, k0, Tk, x->dt), *vp = kp ? key_band(v, k0, Tk, x->dt) : NULL;
            st = block_forward(&x->dims[b], x->p[b], q, kp, vp, out, r0, x->dt);
        }
        accel_status rw = accel_arena_rewind(a, mk);
        st = st ? st : rw;
    }
    accel_autocast_end(ac);
    accel_set_grad_enabled(grad);
    if (st) return NULL;
    accel_node *nd = accel_tape_record("cp_alltoall_sdpa", band_backward, out, 3, in);
    if (nd) nd->ctx = x;
    return out;
}

/* The attention of queries at global positions pos.. over keys from 0: the
 * fused causal sdpa, or the explicit scores when a window or soft-capping
 * applies. */
static accel_tensor *attend(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos, const cp_mask *m) {
    return m->W || m->cap > 0
               ? accel__masked_attention(q, k, v, pos, m->W, NULL, false, m->scale, m->cap, 0.0, NULL, m->upcast)
               : accel_sdpa(q, k, v, true, m->scale);
}

static bool low_precision(accel_dtype dt) { return dt == ACCEL_BF16 || dt == ACCEL_F16; }

/* t rounded to dt (when it is not dt): a differentiable op. */
static accel_tensor *rounded(accel_tensor *t, accel_dtype dt) {
    return t && t->dtype != dt ? accel_to_dtype(t, dt) : t;
}

/* A query chunk's attention over the gathered key prefix k, v, f32 holding
 * values of the compute dtype dt (bf16/f16): as attend computes it on k, v
 * of dt (scores in f32 from q rounded to dt where torch's SDPA's numerics
 * apply, else eager's in dt), with the gradients of k, v f32 (rounding k,
 * v to dt is exact, and the gradient's way back through it too). */
static accel_tensor *attend_f32_keys(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos,
                                     const cp_mask *m, accel_dtype dt) {
    if (accel__scores_dtype_of(dt, m->upcast) != ACCEL_F32) return attend(q, rounded(k, dt), rounded(v, dt), pos, m);
    accel_tensor *q32 = rounded(rounded(q, dt), ACCEL_F32);
    accel_dtype ac = accel_autocast_begin(ACCEL_F32);
    accel_tensor *o = q32 ? attend(q32, k, v, pos, m) : NULL;
    accel_autocast_end(ac);
    return rounded(o, dt);
}

/* x (this rank's K or V) gathered in global order [B, h, T, D]: computing
 * in bf16/f16 (f32_keys), x rounded to dt (as the attention would round
 * it), gathered in dt and kept f32, so that the gradients of the two
 * chunks' key prefixes are added, and reduce-scattered over the ranks, in
 * f32 and rounded once into x's dtype (one process's gradient of the whole
 * sequence's keys is one f32 sum over its queries, rounded once); else in
 * x's dtype. */
static accel_tensor *gathered_keys(accel_pg *pg, accel_tensor *x, int cp, int64_t c, bool f32_keys, accel_dtype dt) {
    if (!f32_keys) return seq_exchange(pg, x, cp, c, false, true);
    accel_tensor *xr = rounded(x, dt);
    return xr ? seq_exchange_as(pg, xr, cp, c, false, true, ACCEL_F32) : NULL;
}

/* allgather with a window or soft-capping: the gathered K, V [B, Hkv, T, D]
 * kept for the backward (composed ops; f32 under bf16/f16: gathered_keys),
 * each chunk's queries over the key prefix it can see. */
static accel_tensor *allgather_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                         const cp_mask *m, int cp, int rank, int64_t c) {
    if (!m->W && !(m->cap > 0)) return allgather_sdpa(pg, q, k, v, m->scale, cp, rank, c);
    accel_tensor *in[3] = {q, k, v};
    int idt = accel__mm_dtype("accel_cp_attention", 3, in);
    if (idt < 0) return NULL;
    accel_dtype dt = (accel_dtype)idt;
    bool f32_keys = low_precision(dt);
    accel_tensor *kg = gathered_keys(pg, k, cp, c, f32_keys, dt);
    accel_tensor *vg = kg ? gathered_keys(pg, v, cp, c, f32_keys, dt) : NULL;
    if (!vg) return NULL;
    accel_tensor *out[2];
    for (int half = 0; half < 2; half++) {
        int64_t g = half == 0 ? rank : 2 * cp - 1 - rank, keys = (g + 1) * c;
        accel_tensor *qh = accel_slice(q, 2, half * c, (half + 1) * c, 1);
        accel_tensor *kh = accel_slice(kg, 2, 0, keys, 1), *vh = accel_slice(vg, 2, 0, keys, 1);
        out[half] = !qh || !kh || !vh ? NULL
                    : f32_keys           ? attend_f32_keys(qh, kh, vh, g * c, m, dt)
                                         : attend(qh, kh, vh, g * c, m);
        if (!out[half]) return NULL;
    }
    return accel_concat(2, out, 2);
}

static accel_tensor *alltoall_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                        const cp_mask *m, int cp, int64_t c) {
    int64_t B = q->shape[0], H = q->shape[1], Hkv = k->shape[1], D = q->shape[3], Dv = v->shape[3];
    if (Hkv % cp != 0) { /* too few kv heads to split: each query head gets its own copy */
        int64_t rep = H / Hkv;
        accel_tensor *kx = accel_expand(accel_unsqueeze(k, 2), 5, (int64_t[]){B, Hkv, rep, 2 * c, D});
        accel_tensor *vx = accel_expand(accel_unsqueeze(v, 2), 5, (int64_t[]){B, Hkv, rep, 2 * c, Dv});
        k = kx ? accel_reshape(kx, 4, (int64_t[]){B, H, 2 * c, D}) : NULL;
        v = vx ? accel_reshape(vx, 4, (int64_t[]){B, H, 2 * c, Dv}) : NULL;
        if (!k || !v) return NULL;
    }
    /* my head group over the whole sequence: [B, H/cp, T, D] */
    accel_tensor *qs = seq_exchange(pg, q, cp, c, true, true), *ks = qs ? seq_exchange(pg, k, cp, c, true, true) : NULL;
    accel_tensor *vs = ks ? seq_exchange(pg, v, cp, c, true, true) : NULL;
    /* o [B, H/cp, T, Dv] */
    accel_tensor *o = vs ? band_sdpa(qs, ks, vs, m) : NULL;
    return seq_exchange(pg, o, cp, c, true, false); /* [B, H, 2c, Dv] */
}

accel_tensor *accel_cp_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                 accel_cp_strategy strategy, double scale) {
    return accel__cp_attention(pg, q, k, v, strategy, scale, 0, 0.0, true);
}

accel_tensor *accel__cp_attention(accel_pg *pg, accel_tensor *q, accel_tensor *k, accel_tensor *v,
                                  accel_cp_strategy strategy, double scale, int64_t W, double cap, bool upcast) {
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
    int64_t H = q->shape[1], Hkv = k->shape[1];
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || v->shape[1] != Hkv ||
        k->shape[3] != q->shape[3]) {
        accel__shape_error2(OP, q, k, "do not fit (q [B, H, 2c, D], k [B, Hkv, 2c, D] and v [B, Hkv, 2c, Dv] "
                                      "expected)");
        return NULL;
    }
    if (Hkv == 0 || H % Hkv != 0) {
        accel__shape_error2(OP, q, k, "do not fit (query heads must be a multiple of kv heads)");
        return NULL;
    }
    if (W < 0 || !(cap >= 0)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: window %lld and soft-cap %g must be >= 0", OP, (long long)W, cap);
        return NULL;
    }
    const cp_mask m = {scale, W, cap, upcast};
    if (strategy == ACCEL_CP_ALLGATHER) return allgather_attention(pg, q, k, v, &m, cp, rank, T2 / 2);
    if (strategy != ACCEL_CP_ALLTOALL) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: unknown strategy %d", OP, (int)strategy);
        return NULL;
    }
    if (H % cp != 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: the all-to-all strategy splits the %lld query heads over cp = %d "
                        "ranks: %lld %% %d != 0 (use the all-gather strategy, or a cp size dividing the heads)",
                        OP, (long long)H, cp, (long long)H, cp);
        return NULL;
    }
    return alltoall_attention(pg, q, k, v, &m, cp, T2 / 2);
}
