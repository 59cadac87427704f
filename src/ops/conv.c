/* accel_conv2d and accel_conv1d (torch.nn.functional's), NCHW. The forward
 * and the backward (the input's gradient, the weight's and bias's) run
 * first on the device's direct convolution (its conv2d kernel: the CPU's
 * is oneDNN's, one call for the batch; docs/cpu.md "Convolutions"); where
 * that has none for the case, per image, im2col then one GEMM per group on
 * the device's gemm kernel:
 *
 *   col [C kh kw, Ho Wo]   = im2col(x[n])          (x[n] itself for a 1x1
 *                                                     stride-1 unpadded one)
 *   y[n, g] [Og, Ho Wo]    = W_g [Og, Cg kh kw] col_g [Cg kh kw, Ho Wo]
 *
 * with the bias put in first by a rank-1 GEMM (b [O, 1] ones [1, Ho Wo]),
 * so the group GEMMs add to it in f32. The backward recomputes col per
 * image (nothing of the size of x kh kw is kept across the step):
 *
 *   dW_g += dY_g [Og, Ho Wo] col_g^T        dcol_g = W_g^T dY_g
 *   dx[n] += col2im(dcol)                   db += dY[n] [O, Ho Wo] ones
 */
#include <string.h>

#include "nn_internal.h"

/* What the backward needs besides the saved x and w. */
typedef struct conv_saved {
    accel_k_window2d win;
    int64_t N, C, O, G;
    bool x_is_col; /* 1x1, stride 1, no padding: col is x[n] itself */
} conv_saved;

static int64_t kdim(const conv_saved *s) { return s->C / s->G * s->win.kh * s->win.kw; }

/* col [C kh kw, Ho Wo] of image n of x (contiguous). */
static accel_status im2col(const conv_saved *s, accel_tensor *x, int64_t n, accel_tensor *col) {
    accel_k_im2col k = {.col = col, .x = x, .C = s->C, .x_off = n * s->C * s->win.H * s->win.W, .win = s->win};
    return ACCEL_KERNEL("accel_conv2d", x->device, im2col, &k);
}

/* The B operand of image n's group GEMMs: col, or x at image n. */
static accel_tensor *operand_of(const conv_saved *s, accel_tensor *x, int64_t n, accel_tensor *col, int64_t *off) {
    *off = s->x_is_col ? n * s->C * s->win.H * s->win.W : 0;
    return s->x_is_col ? x : col;
}

/* ones [Ho Wo] in dtype dt: the bias's rank-1 GEMMs' other factor. */
static accel_tensor *ones(const conv_saved *s, accel_dtype dt, accel_device dev) {
    accel_tensor *t = accel_empty_on(dt, ACCEL_SHAPE(s->win.Ho * s->win.Wo), dev);
    return t && accel_fill_(t, 1.0) == ACCEL_OK ? t : NULL;
}

/* Runs pass k on dev's direct convolution; k->ran false where dev has
 * none (no conv2d kernel) or none for the case. */
static accel_status direct(const char *op, accel_device dev, accel_k_conv2d *k) {
    const accel_kernel_table *kt = accel__kernel_table_of(dev, op);
    k->ran = false;
    if (!kt) return accel_last_status();
    return kt->conv2d ? kt->conv2d(k) : ACCEL_OK;
}

static accel_status conv_backward(accel_node *node, accel_tensor *grad_out) {
    const conv_saved *s = node->ctx;
    accel_tensor *x = node->saved[0], *w = node->saved[1];
    accel_tensor *g = accel__mm_grad(grad_out, x, w);
    if (!g) return accel_last_status();
    accel__gbuf gx, gw, gb;
    if (!accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin(&gw, node->inputs[1]) ||
        !accel__gbuf_begin(&gb, node->inputs[2]))
        return accel_last_status();
    /* the direct convolution (dX, and dW with db, in one call) where dY is
     * of the saved operands' dtype (f32, or bf16 where the GEMMs multiply
     * bf16: accel__mm_grad); what it did not run (NULL below: db where the
     * weight needs no gradient) is left to im2col */
    accel_tensor *dx = gx.dst, *dw = gw.dst, *db = gb.dst;
    accel_status st = ACCEL_OK;
    if (g->dtype == x->dtype && w->dtype == x->dtype && (dx || dw)) {
        accel_k_conv2d k = {.dx = dx, .dw = dw, .db = dw ? db : NULL, .x = x, .w = w, .dy = g,
                            .pass = ACCEL_K_CONV_BACKWARD, .G = s->G, .win = s->win, .dx_beta = gx.beta,
                            .dw_beta = gw.beta, .db_beta = gb.beta};
        st = direct("accel_conv2d backward", x->device, &k);
        if (k.ran) {
            if (k.db) db = NULL;
            dx = dw = NULL;
        }
    }
    /* im2col's col2im and the x_is_col case's GEMMs add into dx */
    if (st == ACCEL_OK && dx && gx.beta == 0.0f) {
        st = accel_zero_(dx);
        gx.beta = 1.0f;
    }
    if (st != ACCEL_OK) return st;
    int64_t L = s->win.Ho * s->win.Wo, K = kdim(s), Og = s->O / s->G, Cg = s->C / s->G;
    int64_t HW = s->win.H * s->win.W;
    accel_tensor *col = !s->x_is_col && dw ? accel_empty_on(x->dtype, ACCEL_SHAPE(s->C * s->win.kh * s->win.kw, L), x->device) : NULL;
    accel_tensor *dcol = !s->x_is_col && dx ? accel_empty_on(ACCEL_F32, ACCEL_SHAPE(s->C * s->win.kh * s->win.kw, L), x->device) : NULL;
    accel_tensor *one = db ? ones(s, g->dtype, g->device) : NULL;
    if ((!s->x_is_col && dw && !col) || (!s->x_is_col && dx && !dcol) || (db && !one))
        return accel_last_status();
    for (int64_t n = 0; n < s->N && st == ACCEL_OK && (dx || dw || db); n++) {
        int64_t goff = n * s->O * L;
        if (db) /* db [O] (+)= dY[n] [O, L] ones [L] */
            st = accel__gemm_at(false, false, s->O, 1, L, 1.0f, g, goff, L, one, 0, 1, n ? 1.0f : gb.beta, db,
                                0, 1);
        if (st == ACCEL_OK && dw && !s->x_is_col) st = im2col(s, x, n, col);
        int64_t boff;
        accel_tensor *bm = operand_of(s, x, n, col, &boff);
        for (int64_t gi = 0; gi < s->G && st == ACCEL_OK; gi++) {
            int64_t go = goff + gi * Og * L, bo = boff + gi * K * L;
            if (dw) /* dW_g [Og, K] (+)= dY_g [Og, L] col_g^T [L, K] */
                st = accel__gemm_at(false, true, Og, K, L, 1.0f, g, go, L, bm, bo, L,
                                    n ? 1.0f : gw.beta, dw, gi * Og * K, K);
            if (st == ACCEL_OK && dx) { /* dcol_g [K, L] = W_g^T [K, Og] dY_g [Og, L] */
                if (s->x_is_col) /* dx[n]'s group planes are dcol itself */
                    st = accel__gemm_at(true, false, K, L, Og, 1.0f, w, gi * Og * K, K, g, go, L, 1.0f, dx,
                                        n * s->C * HW + gi * Cg * HW, L);
                else
                    st = accel__gemm_at(true, false, K, L, Og, 1.0f, w, gi * Og * K, K, g, go, L, 0.0f, dcol,
                                        gi * K * L, L);
            }
        }
        if (st == ACCEL_OK && dx && !s->x_is_col) {
            accel_k_col2im k = {.dx = dx, .col = dcol, .C = s->C, .x_off = n * s->C * HW, .win = s->win};
            st = ACCEL_KERNEL("accel_conv2d backward", x->device, col2im, &k);
        }
    }
    if (st == ACCEL_OK) st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gb);
    return st;
}

/* One per-dim argument checked: >= lo, naming it ("stride[1] = 0 must be >= 1"). */
static bool arg_ok(const char *op, const char *what, const int64_t v[2], int64_t lo) {
    for (int d = 0; d < 2; d++)
        if (v[d] < lo) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s[%d] = %lld must be >= %lld", op, what, d, (long long)v[d],
                            (long long)lo);
            return false;
        }
    return true;
}

bool accel__window_check(const char *op, int64_t H, int64_t W, const int64_t k[2], const int64_t s[2],
                         const int64_t p[2], const int64_t d[2], bool ceil_mode, accel_k_window2d *win) {
    static const int64_t ZERO[2] = {0, 0}, ONE[2] = {1, 1};
    if (!k) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: kernel size is NULL", op);
        return false;
    }
    /* NULL: torch's default (a pool's stride NULL, the kernel, is its caller's) */
    s = s ? s : ONE;
    p = p ? p : ZERO;
    d = d ? d : ONE;
    if (!arg_ok(op, "kernel size", k, 1) || !arg_ok(op, "stride", s, 1) || !arg_ok(op, "padding", p, 0) ||
        !arg_ok(op, "dilation", d, 1))
        return false;
    const int64_t in[2] = {H, W};
    int64_t out[2];
    for (int i = 0; i < 2; i++) {
        /* span d (k - 1) + 1 and in + 2 p checked: past int64 they wrap
         * (undefined behaviour) and a huge argument looked small */
        int64_t span, padded;
        if (__builtin_mul_overflow(d[i], k[i] - 1, &span) || __builtin_add_overflow(span, 1, &span) ||
            __builtin_mul_overflow(p[i], 2, &padded) || __builtin_add_overflow(padded, in[i], &padded)) {
            accel_set_error(ACCEL_ERR_INVALID_ARG,
                            "%s: dim %d's window (kernel size %lld, dilation %lld, padding %lld over %lld) is past "
                            "int64",
                            op, i, (long long)k[i], (long long)d[i], (long long)p[i], (long long)in[i]);
            return false;
        }
        /* ceil_mode: torch's ceil((padded - span) / s) + 1 windows, so one window that overhangs the padded
         * input by less than the stride (the pooling kernels cut it there) */
        bool overhang = span > padded && ceil_mode && span - padded < s[i];
        if (span > padded && !overhang) {
            accel_set_error(ACCEL_ERR_SHAPE,
                            "%s: kernel size %lld (dilated: %lld) is larger than the padded input's dim %d "
                            "(%lld + 2 * %lld)%s",
                            op, (long long)k[i], (long long)span, i, (long long)in[i], (long long)p[i],
                            ceil_mode ? " by the stride or more" : "");
            return false;
        }
        int64_t o = overhang ? 1 : (padded - span) / s[i] + 1, last;
        /* ceil_mode: one more window where a part of the input is left,
         * unless it would start in the right padding */
        if (ceil_mode && !overhang && (padded - span) % s[i] &&
            !(__builtin_mul_overflow(o, s[i], &last) || last >= in[i] + p[i]))
            o++;
        out[i] = o;
    }
    int64_t L;
    if (__builtin_mul_overflow(out[0], out[1], &L)) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: the output planes [%lld, %lld] have more elements than int64 holds", op,
                        (long long)out[0], (long long)out[1]);
        return false;
    }
    *win = (accel_k_window2d){.H = H, .W = W, .Ho = out[0], .Wo = out[1], .kh = k[0], .kw = k[1], .sh = s[0],
                              .sw = s[1], .ph = p[0], .pw = p[1], .dh = d[0], .dw = d[1]};
    return true;
}

/* y = out [N, O, Ho, Wo] of ux by uw (+ ub) by im2col and the GEMMs;
 * false with the error set. */
static bool conv2d_im2col(const conv_saved *s, accel_tensor *ux, accel_tensor *uw, accel_tensor *ub, accel_tensor *out) {
    accel_device dev = out->device;
    int64_t N = s->N, O = s->O, groups = s->G, C = s->C;
    int64_t L = s->win.Ho * s->win.Wo, K = kdim(s), Og = O / groups;
    /* a bf16/f16 result written by the gemm where it can (as accel_linear) */
    accel_tensor *c = accel__gemm_writes_c(dev, out->dtype, ux->dtype, uw->dtype)
                          ? out
                          : accel_empty_on(ACCEL_F32, 4, out->shape, dev);
    accel_tensor *col = s->x_is_col ? NULL : accel_empty_on(ux->dtype, ACCEL_SHAPE(C * s->win.kh * s->win.kw, L), dev);
    accel_tensor *one = ub ? ones(s, ub->dtype, dev) : NULL;
    if (!c || (!s->x_is_col && !col) || (ub && !one)) return false;
    accel_status st = ACCEL_OK;
    for (int64_t n = 0; n < N && st == ACCEL_OK; n++) {
        int64_t coff = n * O * L, boff;
        if (ub) /* y[n] [O, L] = b [O, 1] ones [1, L] */
            st = accel__gemm_at(false, false, O, L, 1, 1.0f, ub, 0, 1, one, 0, L, 0.0f, c, coff, L);
        if (st == ACCEL_OK && !s->x_is_col) st = im2col(s, ux, n, col);
        accel_tensor *bm = operand_of(s, ux, n, col, &boff);
        for (int64_t gi = 0; gi < groups && st == ACCEL_OK; gi++) /* y[n, g] (+)= W_g col_g */
            st = accel__gemm_at(false, false, Og, L, K, 1.0f, uw, gi * Og * K, K, bm, boff + gi * K * L, L,
                                ub ? 1.0f : 0.0f, c, coff + gi * Og * L, L);
    }
    if (st != ACCEL_OK || (c != out && accel_copy_(out, c) != ACCEL_OK)) return false;
    return true;
}

bool accel__same_padding_ok(const char *op, const int64_t padding[2], const int64_t stride[2]) {
    bool same[2] = {padding && padding[0] == ACCEL_PADDING_SAME, padding && padding[1] == ACCEL_PADDING_SAME};
    if (!same[0] && !same[1]) return true;
    if (same[0] != same[1]) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s: ACCEL_PADDING_SAME in padding[%d] alone: it (torch's padding=\"same\") pads every dim",
                        op, same[0] ? 0 : 1);
        return false;
    }
    for (int i = 0; i < 2; i++)
        if (stride && stride[i] != 1) {
            accel_set_error(ACCEL_ERR_INVALID_ARG,
                            "%s: padding=\"same\" (ACCEL_PADDING_SAME) is not supported for strided convolutions "
                            "(stride %lld)",
                            op, (long long)stride[i]);
            return false;
        }
    return true;
}

/* The padding p {H, W} conv2d_4d takes for the caller's padding (NULL:
 * zeros): torch's padding="same" as half of dilation (kh - 1) (rounded down)
 * on each side, the odd element of a dim's total added after the end of *x
 * [N, C, H, W] by accel_pad first, as torch pads it; the caller's padding
 * itself otherwise. A weight that is not 4-D or a dilation below 1 leaves
 * their errors to conv2d_4d. false with the error set. */
static bool resolve_padding(const char *OP, accel_tensor **x, const accel_tensor *w, const int64_t stride[2],
                            const int64_t padding[2], const int64_t dilation[2], int64_t p[2]) {
    if (!accel__same_padding_ok(OP, padding, stride)) return false;
    bool same = padding && padding[0] == ACCEL_PADDING_SAME;
    int64_t extra[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        p[i] = padding && !same ? padding[i] : 0;
        int64_t d = dilation ? dilation[i] : 1, total;
        if (!same || w->ndim != 4 || d < 1) continue;
        if (__builtin_mul_overflow(d, w->shape[2 + i] - 1, &total)) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: padding=\"same\" of dim %d (dilation %lld, kernel size %lld) is "
                            "past int64", OP, i, (long long)d, (long long)w->shape[2 + i]);
            return false;
        }
        p[i] = total / 2;
        extra[i] = total - 2 * p[i];
    }
    if (extra[0] || extra[1]) *x = accel_pad(*x, 4, (int64_t[]){0, extra[1], 0, extra[0]}, ACCEL_PAD_CONSTANT, 0.0);
    return *x != NULL;
}

/* conv2d of x [N, C, H, W] (checked 4-D) by w [O, C / G, kh, kw]; shape errors show the caller's x and w, as
 * given (shown: not the 4-D views conv1d and an unbatched x make). */
static accel_tensor *conv2d_4d(const char *OP, accel_tensor *const shown[2], accel_tensor *x, accel_tensor *w,
                               accel_tensor *b, const int64_t stride[2], const int64_t padding[2],
                               const int64_t dilation[2], int64_t groups) {
    accel_tensor *in[3] = {x, w, b};
    accel_device dev;
    if (!accel__op_begin_opt(OP, 3, in, 4u, &dev)) return NULL;
    int dt = accel__mm_dtype(OP, 3, in);
    if (dt < 0) return NULL;
    if (w->ndim != 4) {
        accel__shape_error2(OP, shown[0], shown[1], "do not fit (weight must be [out, in / groups, kh, kw])");
        return NULL;
    }
    int64_t N = x->shape[0], C = x->shape[1], O = w->shape[0];
    if (groups < 1 || C % groups || O % groups) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s: groups = %lld must be >= 1 and divide the input channels (%lld) and the output "
                        "channels (%lld)",
                        OP, (long long)groups, (long long)C, (long long)O);
        return NULL;
    }
    if (w->shape[1] * groups != C) {
        char why[128];
        snprintf(why, sizeof why, "do not fit (x has %lld channels, weight expects %lld = %lld x %lld groups)",
                 (long long)C, (long long)(w->shape[1] * groups), (long long)w->shape[1], (long long)groups);
        accel__shape_error2(OP, shown[0], shown[1], why);
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != O)) {
        accel__shape_error2(OP, shown[1], b, "do not fit (bias must be [out])");
        return NULL;
    }
    conv_saved s = {.N = N, .C = C, .O = O, .G = groups};
    if (!accel__window_check(OP, x->shape[2], x->shape[3], w->shape + 2, stride, padding, dilation, false,
                             &s.win))
        return NULL;
    s.x_is_col = s.win.kh == 1 && s.win.kw == 1 && s.win.sh == 1 && s.win.sw == 1 && s.win.ph == 0 && s.win.pw == 0;
    accel_tensor *out = accel__op_out((accel_dtype)dt, 4, (int64_t[]){N, O, s.win.Ho, s.win.Wo}, dev);
    if (!out || dev.type == ACCEL_DEV_META || accel_numel(out) == 0) return out;
    accel_tensor *ux = accel__mm_operand(x, (accel_dtype)dt), *uw = accel__mm_operand(w, (accel_dtype)dt);
    accel_tensor *ub = b ? accel__mm_operand(b, (accel_dtype)dt) : NULL;
    if (!ux || !uw || (b && !ub)) return NULL;
    accel_k_conv2d k = {.y = out, .x = ux, .w = uw, .b = ub, .pass = ACCEL_K_CONV_FORWARD, .G = groups, .win = s.win};
    if (direct(OP, dev, &k) != ACCEL_OK || (!k.ran && !conv2d_im2col(&s, ux, uw, ub, out))) return NULL;
    accel_node *n = accel_tape_record("conv2d", conv_backward, out, 3, in);
    if (n) {
        conv_saved *sc = accel_arena_alloc(accel_step_arena(), sizeof *sc, 64);
        if (!sc) return NULL;
        *sc = s;
        n->ctx = sc;
        n->saved[0] = ux;
        n->saved[1] = uw;
    }
    return out;
}

accel_tensor *accel_conv2d(accel_tensor *x, accel_tensor *w, accel_tensor *b, const int64_t stride[2],
                           const int64_t padding[2], const int64_t dilation[2], int64_t groups) {
    static const char *OP = "accel_conv2d";
    accel_tensor *xw[2] = {x, w};
    accel_device dev;
    if (!accel__op_begin(OP, 2, xw, &dev)) return NULL;
    if (x->ndim != 3 && x->ndim != 4) {
        accel__shape_error2(OP, x, w, "do not fit (x must be [N, C, H, W] or [C, H, W])");
        return NULL;
    }
    accel_tensor *x4 = x->ndim == 4 ? x : accel_unsqueeze(x, 0);
    int64_t p[2];
    if (!x4 || !resolve_padding(OP, &x4, w, stride, padding, dilation, p)) return NULL;
    accel_tensor *y = conv2d_4d(OP, xw, x4, w, b, stride, p, dilation, groups);
    return x->ndim == 4 ? y : accel_squeeze(y, 0);
}

accel_tensor *accel_conv1d(accel_tensor *x, accel_tensor *w, accel_tensor *b, int64_t stride, int64_t padding,
                           int64_t dilation, int64_t groups) {
    static const char *OP = "accel_conv1d";
    accel_tensor *xw[2] = {x, w};
    accel_device dev;
    if (!accel__op_begin(OP, 2, xw, &dev)) return NULL;
    if ((x->ndim != 2 && x->ndim != 3) || w->ndim != 3) {
        accel__shape_error2(OP, x, w, "do not fit (x must be [N, C, L] or [C, L], weight [out, in / groups, k])");
        return NULL;
    }
    /* [N, C, L] as [N, C, 1, L]: a 1-row image, a 1-row kernel */
    bool batched = x->ndim == 3;
    accel_tensor *x4 = accel_unsqueeze(batched ? x : accel_unsqueeze(x, 0), 2), *w4 = accel_unsqueeze(w, 2);
    const int64_t stride2[2] = {1, stride}, dilation2[2] = {1, dilation};
    int64_t p[2];
    if (!x4 || !w4 ||
        !resolve_padding(OP, &x4, w4, stride2,
                         (int64_t[]){padding == ACCEL_PADDING_SAME ? ACCEL_PADDING_SAME : 0, padding}, dilation2, p))
        return NULL;
    accel_tensor *y = conv2d_4d(OP, xw, x4, w4, b, stride2, p, dilation2, groups);
    y = accel_squeeze(y, 2);
    return batched ? y : accel_squeeze(y, 0);
}
