/* The fp8 Linear (ops/fp8_linear.h) on the fp8 primitives of
 * backends/fp8.h, and the thread's fp8 autocast. */
#include "ops/fp8_linear.h"

#include <string.h>

#include "core/prepared.h"
#include "nn_internal.h"

static _Thread_local const accel__fp8_recipe *tl_fp8;

const accel__fp8_recipe *accel__fp8_autocast(void) { return tl_fp8; }

const accel__fp8_recipe *accel__fp8_autocast_begin(const accel__fp8_recipe *r) {
    const accel__fp8_recipe *prev = tl_fp8;
    tl_fp8 = r;
    return prev;
}

void accel__fp8_autocast_end(const accel__fp8_recipe *previous) { tl_fp8 = previous; }

static _Thread_local accel__fp8_log *tl_log;

accel__fp8_log *accel__fp8_log_begin(accel__fp8_log *log) {
    accel__fp8_log *prev = tl_log;
    if (log) log->n = 0, log->overflow = false;
    tl_log = log;
    return prev;
}

void accel__fp8_log_end(accel__fp8_log *previous) { tl_log = previous; }

bool accel__fp8_log_has(const accel__fp8_log *log, const accel_tensor *meta) {
    if (log->overflow) return true;
    for (int i = 0; i < log->n; i++)
        if (log->metas[i] == meta) return true;
    return false;
}

static _Thread_local accel__fp8_cache *tl_cache;

accel__fp8_cache *accel__fp8_cache_begin(accel__fp8_cache *cache) {
    accel__fp8_cache *prev = tl_cache;
    tl_cache = cache;
    return prev;
}

void accel__fp8_cache_end(accel__fp8_cache *previous) { tl_cache = previous; }

/* meta ran: into the thread's log, once. */
static void log_note(accel_tensor *meta) {
    accel__fp8_log *log = tl_log;
    if (!log || accel__fp8_log_has(log, meta)) return;
    if (log->n < log->cap) log->metas[log->n++] = meta;
    else log->overflow = true;
}

/* A 2-D header [rows, cols] over contiguous t (no copy): the primitives'
 * matrix view of an activation of any rank. */
static accel_tensor *as_matrix(accel_tensor *h, const accel_tensor *t, int64_t rows, int64_t cols) {
    *h = *t;
    h->ndim = 2;
    h->shape[0] = rows, h->shape[1] = cols;
    h->stride[0] = cols, h->stride[1] = 1;
    return h;
}

static accel_tensor *bytes(int64_t rows, int64_t cols, accel_device dev) {
    return accel_empty_on(ACCEL_U8, 2, (int64_t[]){rows, cols}, dev);
}

/* x [..., I], w [O, I], b [O]: R, I, O, and the fp8 GEMMs' multiples of 16. */
static bool fp8_shapes(const char *op, const accel_tensor *x, const accel_tensor *w, const accel_tensor *b,
                       const accel_tensor *meta, int64_t *R, int64_t *I, int64_t *O) {
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1]) {
        accel__shape_error2(op, x, w, "do not fit (x must be [..., in] and weight [out, in])");
        return false;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        accel__shape_error2(op, w, b, "do not fit (bias must be [out])");
        return false;
    }
    *R = accel__prod(x->shape, 0, x->ndim - 1), *I = w->shape[1], *O = w->shape[0];
    if (*R <= 0 || *R % 16 || *I % 16 || *O % 16) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s: fp8 GEMMs need the rows (product of x's dims but the last), in and out features "
                        "to be positive multiples of 16 (got %lld, %lld, %lld)",
                        op, (long long)*R, (long long)*I, (long long)*O);
        return false;
    }
    if (!meta || meta->dtype != ACCEL_F32 || meta->ndim != 2 || meta->shape[1] != ACCEL__FP8_SLOTS ||
        meta->shape[0] < 3 || !accel_device_eq(meta->device, x->device)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the fp8 meta must be f32 [2 + amax_history_len, %d] on x's device",
                        op, ACCEL__FP8_SLOTS);
        return false;
    }
    return true;
}

/* The recipe in the node: iarg[3] its flags, iarg[4] margin, iarg[5] history_len. */
enum { F_HYBRID = 1, F_MAX = 2, F_DEFERRED = 4, F_HIGH = 8 /* << gemm */ };

static void recipe_save(accel_node *n, accel__fp8_recipe r) {
    int64_t f = (r.hybrid ? F_HYBRID : 0) | (r.use_max ? F_MAX : 0) | (r.deferred_update ? F_DEFERRED : 0);
    for (int g = 0; g < ACCEL__FP8_GEMMS; g++) f |= r.high_precision[g] ? (int64_t)F_HIGH << g : 0;
    n->iarg[3] = f, n->iarg[4] = r.margin, n->iarg[5] = r.history_len;
}

static accel__fp8_recipe recipe_load(const accel_node *n) {
    const int64_t f = n->iarg[3];
    accel__fp8_recipe r = {.hybrid = f & F_HYBRID, .margin = (int)n->iarg[4], .history_len = (int)n->iarg[5],
                           .use_max = f & F_MAX, .deferred_update = f & F_DEFERRED};
    for (int g = 0; g < ACCEL__FP8_GEMMS; g++) r.high_precision[g] = f & ((int64_t)F_HIGH << g);
    return r;
}

/* c [M, N] (f32) = op(a) op(b) + beta c on the device's GEMM, a and b
 * contiguous (a [M, K] or, ta, [K, M]; b [N, K] or, !tb, [K, N]): an
 * overridden GEMM, as accel_linear runs it. */
static accel_status gemm_high(accel_tensor *c, float beta, accel_tensor *a, bool ta, accel_tensor *b, bool tb,
                              int64_t M, int64_t N, int64_t K) {
    accel_k_gemm k = {.c = c, .a = a, .b = b, .trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K,
                      .lda = ta ? M : K, .ldb = tb ? K : N, .ldc = N, .alpha = 1.0f, .beta = beta};
    return ACCEL_KERNEL("accel_linear (fp8, overridden precision)", c->device, gemm, &k);
}

/* dX [R, I] = dY [R, O] W [O, I]: fp8 (qdy, W^T's cast) or overridden (w: the saved operand). */
static accel_status dgrad(accel__gbuf *gx, accel_tensor *grad_out, accel__fp8_operand qdy, accel_tensor *w,
                          accel_tensor *inv, bool high, int64_t R, int64_t I, int64_t O) {
    accel_tensor dm, *d = as_matrix(&dm, gx->dst, R, I);
    if (!high) return accel__fp8_gemm(d, gx->beta, qdy, (accel__fp8_operand){w, ACCEL_FP8_E4M3, inv, 1});
    accel_tensor *g = accel__mm_grad(grad_out, w, w);
    return g ? gemm_high(d, gx->beta, g, false, w, false, R, I, O) : accel_last_status();
}

/* dW [O, I] = dY^T [O, R] X [R, I]: fp8 (dY^T's cast, X^T's) or overridden (x: the saved operand). */
static accel_status wgrad(accel__gbuf *gw, accel_tensor *grad_out, accel__fp8_operand qdyt, accel_tensor *x,
                          accel_tensor *inv, bool high, int64_t R, int64_t I, int64_t O) {
    if (!high) return accel__fp8_gemm(gw->dst, gw->beta, qdyt, (accel__fp8_operand){x, ACCEL_FP8_E4M3, inv, 0});
    accel_tensor *g = accel__mm_grad(grad_out, x, x);
    return g ? gemm_high(gw->dst, gw->beta, g, true, x, false, O, I, R) : accel_last_status();
}

/* saved: [0] X^T's cast [I, R] (or under an overridden wgrad X's operand),
 * [1] W^T's cast [I, O] (or under an overridden dgrad W's operand), [2] the
 * scale_invs of X and W at their casts, [3] the meta. */
static accel_status fp8_linear_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *xs = node->saved[0], *ws = node->saved[1], *inv = node->saved[2], *meta = node->saved[3];
    int64_t R = node->iarg[0], I = node->iarg[1], O = node->iarg[2];
    accel__fp8_recipe r = recipe_load(node);
    const bool hd = r.high_precision[ACCEL__FP8_DGRAD], hw = r.high_precision[ACCEL__FP8_WGRAD];
    accel__fp8_format fdy = accel__fp8_slot_format(r, ACCEL__FP8_DY);
    accel_device dev = meta->device;
    log_note(meta);
    accel_tensor *g = accel__f32_contig(grad_out);
    accel__gbuf gx, gw, gbias;
    if (!g || !accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin(&gw, node->inputs[1]) ||
        !accel__gbuf_begin(&gbias, node->inputs[2]))
        return accel_last_status();
    accel_status st = ACCEL_OK;
    const bool cast_dy = (gx.dst && !hd) || (gw.dst && !hw); /* an fp8 GEMM reads dY */
    accel_tensor *qdy = NULL, *qdyt = NULL, *dinv = NULL;
    if (cast_dy) {
        accel_tensor gm;
        qdy = gx.dst && !hd ? bytes(R, O, dev) : NULL, qdyt = gw.dst && !hw ? bytes(O, R, dev) : NULL;
        dinv = accel_empty_on(ACCEL_F32, 1, (int64_t[]){1}, dev);
        if ((gx.dst && !hd && !qdy) || (gw.dst && !hw && !qdyt) || !dinv) return accel_last_status();
        st = accel__fp8_quantize(qdy, qdyt, dinv, 0, as_matrix(&gm, g, R, O), meta, ACCEL__FP8_DY, fdy);
    }
    if (st == ACCEL_OK && gx.dst) st = dgrad(&gx, grad_out, (accel__fp8_operand){qdy, fdy, dinv, 0}, ws, inv, hd, R, I, O);
    if (st == ACCEL_OK && gw.dst)
        st = wgrad(&gw, grad_out, (accel__fp8_operand){qdyt, fdy, dinv, 0}, xs, inv, hw, R, I, O);
    if (st == ACCEL_OK && cast_dy && !r.deferred_update) st = accel__fp8_meta_update(meta, ACCEL__FP8_DY, 1, r);
    if (st == ACCEL_OK && gbias.dst) {
        accel_k_col_sum k = {.out = gbias.dst, .g = g, .R = R, .O = O, .beta = gbias.beta};
        st = ACCEL_KERNEL("accel_linear (fp8) backward", dev, col_sum, &k);
    }
    if (st == ACCEL_OK) st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gbias);
    return st;
}

/* c [R, O] (f32) = bias rows, or nothing to add (returns the GEMM's beta). */
static int bias_into(const char *op, accel_tensor *c, accel_tensor *b, int64_t R, int64_t O, accel_dtype dt) {
    if (!b) return 0;
    accel_tensor *ub = accel__mm_operand(b, dt); /* rounded to the autocast dtype, as accel_linear */
    accel_tensor *bf = ub ? accel__f32_contig(ub) : NULL;
    if (!bf) return -1;
    accel_k_bias_rows k = {.out = c, .bias = bf, .R = R, .O = O};
    return ACCEL_KERNEL(op, c->device, bias_rows, &k) == ACCEL_OK ? 1 : -1;
}

/* The registry's fill of an fp8 form: nothing (the cached cast writes its
 * bytes; accel__prepared_get's `built` tells it they are new). */
static accel_status fp8_form_fill(accel_tensor *dst, accel_tensor *src, const accel__form_key *key) {
    (void)dst, (void)src, (void)key;
    return ACCEL_OK;
}

int accel__fp8_cache_slot(const accel__fp8_cache *c, const accel_tensor *meta) {
    uint64_t h = ((uint64_t)(uintptr_t)meta >> 4) * 0x9e3779b97f4a7c15ull;
    int s = (int)(h >> 40) & c->mask;
    while (c->rows[s] >= 0 && c->metas[c->rows[s]] != meta) s = (s + 1) & c->mask;
    return s;
}

/* W's casts q [O, I] and q_t [I, O] through the thread's weight cache (its
 * amax into meta, its scale_inv at inv[1]); *done false when the cache does
 * not take it (none begun, meta not in it, W on another device than the
 * cache, already read this step, the registry has no room or is off): the caller casts into the step arena. */
static accel_status cached_weight(accel_tensor *w, accel_tensor *wf, accel_tensor *meta, accel_tensor *inv,
                                  accel_tensor **q, accel_tensor **q_t, bool *done) {
    accel__fp8_cache *c = tl_cache;
    *done = false;
    int i = c && c->n ? c->rows[accel__fp8_cache_slot(c, meta)] : -1; /* a cache of no metas has no table */
    if (i < 0 || !accel_device_eq(c->state->device, w->device)) return ACCEL_OK;
    accel__fp8_cache_use *u = &c->use[i];
    const accel_arena *a = accel_step_arena();
    if (u->arena == a && u->gen == accel_arena_generation(a)) return ACCEL_OK;
    const accel__form_key kq = {.kind = ACCEL__FORM_FP8, .dt = ACCEL_U8, .tag = u},
                          kt = {.kind = ACCEL__FORM_FP8_T, .dt = ACCEL_U8, .tag = u};
    accel_tensor *fq, *ft;
    bool new_q = false, new_t = false;
    accel_status st = accel__prepared_get(w, &kq, ACCEL_U8, fp8_form_fill, &fq, &new_q);
    if (st == ACCEL_OK && fq) st = accel__prepared_get(w, &kt, ACCEL_U8, fp8_form_fill, &ft, &new_t);
    if (st != ACCEL_OK || !fq || !ft) return st;
    const int64_t O = w->shape[0], I = w->shape[1];
    accel_tensor *t = accel_view_raw(ft, 2, (int64_t[]){I, O}, (int64_t[]){O, 1}, 0); /* its bytes as [I, O] */
    accel_tensor *row = accel_view_raw(c->state, 1, (int64_t[]){ACCEL__FP8_CACHE_WORDS}, (int64_t[]){1},
                                       (int64_t)i * ACCEL__FP8_CACHE_WORDS);
    if (!t || !row) return accel_last_status();
    st = accel__fp8_quantize_cached(fq, t, inv, 1, wf, meta, ACCEL__FP8_W, ACCEL_FP8_E4M3, row, new_q || new_t);
    if (st != ACCEL_OK) return st;
    u->arena = a, u->gen = accel_arena_generation(a);
    *q = fq, *q_t = t, *done = true;
    return ACCEL_OK;
}

/* One forward operand (x [R, I] or W [O, I]) as its GEMMs read it: q its
 * fp8 cast (fprop in fp8), q_t its transposed cast (the backward GEMM of it
 * in fp8), u the autocast dtype's operand (a GEMM of it overridden). */
typedef struct fwd_operand {
    accel_tensor *q, *q_t, *u;
} fwd_operand;

/* t [rows, cols] (f32 contiguous tf from t) for the GEMMs that read it:
 * fp8_fwd (fprop in fp8), fp8_bwd / high_bwd (its backward GEMM, when
 * grads, in fp8 / overridden); the cast (if any) raises slot's amax and
 * keeps its scale_inv at inv[slot]. False + error on failure. */
static bool operand_for(fwd_operand *o, accel_tensor *t, accel_tensor *tf, accel_tensor *inv, accel_tensor *meta,
                        int slot, bool fp8_fwd, bool fp8_bwd, bool high_bwd, accel_dtype dt) {
    const int64_t rows = accel__prod(tf->shape, 0, tf->ndim - 1), cols = tf->shape[tf->ndim - 1];
    *o = (fwd_operand){NULL, NULL, NULL};
    bool cached = false;
    if (slot == ACCEL__FP8_W && (fp8_fwd || fp8_bwd) && cached_weight(t, tf, meta, inv, &o->q, &o->q_t, &cached))
        return false;
    if (cached) return (fp8_fwd && !high_bwd) || (o->u = accel__mm_operand(t, dt));
    if ((fp8_fwd && !(o->q = bytes(rows, cols, tf->device))) || (fp8_bwd && !(o->q_t = bytes(cols, rows, tf->device))) ||
        ((!fp8_fwd || high_bwd) && !(o->u = accel__mm_operand(t, dt))))
        return false;
    accel_tensor m;
    return !(o->q || o->q_t) ||
           accel__fp8_quantize(o->q, o->q_t, inv, slot, as_matrix(&m, tf, rows, cols), meta, slot, ACCEL_FP8_E4M3) ==
               ACCEL_OK;
}

accel_tensor *accel__fp8_linear(accel_tensor *x, accel_tensor *w, accel_tensor *b, accel_tensor *meta,
                                accel__fp8_recipe r) {
    static const char *OP = "accel_linear (fp8)";
    accel_tensor *in[3] = {x, w, b};
    accel_device dev;
    int64_t R, I, O;
    if (!accel__op_begin_opt(OP, 3, in, 4u, &dev)) return NULL;
    int dt = accel__mm_dtype(OP, 3, in);
    if (dt < 0 || !fp8_shapes(OP, x, w, b, meta, &R, &I, &O)) return NULL;
    int64_t oshape[ACCEL_MAX_DIMS];
    memcpy(oshape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    oshape[x->ndim - 1] = O;
    accel_tensor *out = accel__op_out((accel_dtype)dt, x->ndim, oshape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    log_note(meta);
    const bool grads = accel_is_grad_enabled() && (x->requires_grad || w->requires_grad || (b && b->requires_grad));
    const bool f = !r.high_precision[ACCEL__FP8_FPROP], d = !r.high_precision[ACCEL__FP8_DGRAD];
    const bool wg = !r.high_precision[ACCEL__FP8_WGRAD];
    accel_tensor *xf = accel__f32_contig(x), *wf = accel__f32_contig(w);
    accel_tensor *inv = accel_empty_on(ACCEL_F32, 1, (int64_t[]){2}, dev);
    accel_tensor *c = out->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, oshape, dev);
    fwd_operand ox, ow; /* x^T feeds wgrad, W^T dgrad */
    if (!xf || !wf || !inv || !c ||
        !operand_for(&ox, x, xf, inv, meta, ACCEL__FP8_X, f, grads && wg, grads && !wg, (accel_dtype)dt) ||
        !operand_for(&ow, w, wf, inv, meta, ACCEL__FP8_W, f, grads && d, grads && !d, (accel_dtype)dt))
        return NULL;
    accel_tensor cm;
    int beta = bias_into(OP, as_matrix(&cm, c, R, O), b, R, O, (accel_dtype)dt);
    if (beta < 0) return NULL;
    /* Y [R, O] = X [R, I] W^T */
    accel_status st = f ? accel__fp8_gemm(&cm, (float)beta, (accel__fp8_operand){ox.q, ACCEL_FP8_E4M3, inv, 0},
                                          (accel__fp8_operand){ow.q, ACCEL_FP8_E4M3, inv, 1})
                        : gemm_high(&cm, (float)beta, ox.u, false, ow.u, true, R, O, I);
    if (st == ACCEL_OK && !r.deferred_update && (ox.q || ox.q_t)) st = accel__fp8_meta_update(meta, ACCEL__FP8_X, 1, r);
    if (st == ACCEL_OK && !r.deferred_update && (ow.q || ow.q_t)) st = accel__fp8_meta_update(meta, ACCEL__FP8_W, 1, r);
    if (st != ACCEL_OK || (c != out && accel_copy_(out, c) != ACCEL_OK)) return NULL;
    accel_node *n = grads ? accel_tape_record("fp8_linear", fp8_linear_backward, out, 3, in) : NULL;
    if (n) {
        n->saved[0] = wg ? ox.q_t : ox.u, n->saved[1] = d ? ow.q_t : ow.u, n->saved[2] = inv, n->saved[3] = meta;
        n->iarg[0] = R, n->iarg[1] = I, n->iarg[2] = O;
        recipe_save(n, r);
    }
    return out;
}
