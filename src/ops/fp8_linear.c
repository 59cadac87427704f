/* The fp8 Linear (ops/fp8_linear.h) on the fp8 primitives of
 * backends/fp8.h, and the thread's fp8 autocast. */
#include "ops/fp8_linear.h"

#include <string.h>

#include "nn_internal.h"

static _Thread_local const accel__fp8_recipe *tl_fp8;

const accel__fp8_recipe *accel__fp8_autocast(void) { return tl_fp8; }

const accel__fp8_recipe *accel__fp8_autocast_begin(const accel__fp8_recipe *r) {
    const accel__fp8_recipe *prev = tl_fp8;
    tl_fp8 = r;
    return prev;
}

void accel__fp8_autocast_end(const accel__fp8_recipe *previous) { tl_fp8 = previous; }

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

static void recipe_save(accel_node *n, accel__fp8_recipe r) {
    n->iarg[3] = r.hybrid, n->iarg[4] = r.margin, n->iarg[5] = r.history_len, n->iarg[6] = r.use_max;
    n->iarg[7] = r.deferred_update;
}

static accel__fp8_recipe recipe_load(const accel_node *n) {
    accel__fp8_recipe r = {.hybrid = n->iarg[3] != 0, .margin = (int)n->iarg[4], .history_len = (int)n->iarg[5],
                           .use_max = n->iarg[6] != 0, .deferred_update = n->iarg[7] != 0};
    return r;
}

static accel_status fp8_linear_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *qxt = node->saved[0], *qwt = node->saved[1], *inv = node->saved[2], *meta = node->saved[3];
    int64_t R = node->iarg[0], I = node->iarg[1], O = node->iarg[2];
    accel__fp8_recipe r = recipe_load(node);
    accel__fp8_format fdy = accel__fp8_slot_format(r, ACCEL__FP8_DY);
    accel_device dev = meta->device;
    accel_tensor *g = accel__f32_contig(grad_out);
    accel__gbuf gx, gw, gbias;
    if (!g || !accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin(&gw, node->inputs[1]) ||
        !accel__gbuf_begin(&gbias, node->inputs[2]))
        return accel_last_status();
    accel_status st = ACCEL_OK;
    if (gx.dst || gw.dst) {
        accel_tensor gm, dm, *qdy = bytes(R, O, dev), *qdyt = gw.dst ? bytes(O, R, dev) : NULL;
        accel_tensor *dinv = accel_empty_on(ACCEL_F32, 1, (int64_t[]){1}, dev);
        if (!qdy || (gw.dst && !qdyt) || !dinv) return accel_last_status();
        st = accel__fp8_quantize(qdy, qdyt, dinv, 0, as_matrix(&gm, g, R, O), meta, ACCEL__FP8_DY, fdy);
        if (st == ACCEL_OK && gx.dst) /* dX [R, I] = dY [R, O] (W^T [I, O])^T */
            st = accel__fp8_gemm(as_matrix(&dm, gx.dst, R, I), gx.beta, (accel__fp8_operand){qdy, fdy, dinv, 0},
                                 (accel__fp8_operand){qwt, ACCEL_FP8_E4M3, inv, 1});
        if (st == ACCEL_OK && gw.dst) /* dW [O, I] = dY^T [O, R] (X^T [I, R])^T */
            st = accel__fp8_gemm(gw.dst, gw.beta, (accel__fp8_operand){qdyt, fdy, dinv, 0},
                                 (accel__fp8_operand){qxt, ACCEL_FP8_E4M3, inv, 0});
        if (st == ACCEL_OK && !r.deferred_update) st = accel__fp8_meta_update(meta, ACCEL__FP8_DY, 1, r);
    }
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
    bool grads = accel_is_grad_enabled() && (x->requires_grad || w->requires_grad || (b && b->requires_grad));
    accel_tensor *xf = accel__f32_contig(x), *wf = accel__f32_contig(w);
    accel_tensor *qx = bytes(R, I, dev), *qw = bytes(O, I, dev);
    accel_tensor *qxt = grads ? bytes(I, R, dev) : NULL, *qwt = grads ? bytes(I, O, dev) : NULL;
    accel_tensor *inv = accel_empty_on(ACCEL_F32, 1, (int64_t[]){2}, dev);
    accel_tensor *c = out->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, oshape, dev);
    if (!xf || !wf || !qx || !qw || (grads && (!qxt || !qwt)) || !inv || !c) return NULL;
    accel_tensor xm, cm;
    if (accel__fp8_quantize(qx, qxt, inv, 0, as_matrix(&xm, xf, R, I), meta, ACCEL__FP8_X, ACCEL_FP8_E4M3) ||
        accel__fp8_quantize(qw, qwt, inv, 1, wf, meta, ACCEL__FP8_W, ACCEL_FP8_E4M3))
        return NULL;
    int beta = bias_into(OP, as_matrix(&cm, c, R, O), b, R, O, (accel_dtype)dt);
    if (beta < 0) return NULL;
    /* Y [R, O] = X [R, I] W^T */
    if (accel__fp8_gemm(&cm, (float)beta, (accel__fp8_operand){qx, ACCEL_FP8_E4M3, inv, 0},
                        (accel__fp8_operand){qw, ACCEL_FP8_E4M3, inv, 1}) ||
        (!r.deferred_update && accel__fp8_meta_update(meta, ACCEL__FP8_X, 2, r)))
        return NULL;
    if (c != out && accel_copy_(out, c) != ACCEL_OK) return NULL;
    accel_node *n = grads ? accel_tape_record("fp8_linear", fp8_linear_backward, out, 3, in) : NULL;
    if (n) {
        n->saved[0] = qxt, n->saved[1] = qwt, n->saved[2] = inv, n->saved[3] = meta;
        n->iarg[0] = R, n->iarg[1] = I, n->iarg[2] = O;
        recipe_save(n, r);
    }
    return out;
}
