/* The 2-D poolings of torch.nn.functional (max_pool2d, avg_pool2d,
 * adaptive_avg_pool2d) over x [N, C, H, W] or [C, H, W], and flatten. The
 * pooling runs in f32 over the N C planes (the pool2d kernel); the result
 * has x's dtype. */
#include <string.h>

#include "nn_internal.h"

typedef struct pool_saved {
    accel_k_window2d win;
    accel_k_pool_kind kind;
    bool include_pad;
    int64_t P;
} pool_saved;

static accel_status pool_backward(accel_node *node, accel_tensor *grad_out) {
    const pool_saved *s = node->ctx;
    accel_tensor *g = accel__f32_contig(grad_out);
    accel__gbuf gx;
    if (!g || !accel__gbuf_begin_zeroed(&gx, node->inputs[0])) return accel_last_status();
    accel_k_pool2d_backward k = {.dx = gx.dst, .g = g, .idx = node->saved[0], .P = s->P, .win = s->win,
                                 .kind = s->kind, .count_include_pad = s->include_pad};
    accel_status st = gx.dst ? ACCEL_KERNEL("pool2d backward", g->device, pool2d_backward, &k) : ACCEL_OK;
    return st == ACCEL_OK ? accel__gbuf_end(&gx) : st;
}

/* x [.., H, W] must be [N, C, H, W] or [C, H, W] of a float dtype; empty
 * channels allowed where any_channels (the adaptive pool's: torch's rule). */
static bool planes_ok(const char *op, accel_tensor *x, bool any_channels, accel_device *dev) {
    if (!accel__op_begin(op, 1, &x, dev) || !accel__op_check_float(op, x, "x")) return false;
    if (x->ndim != 3 && x->ndim != 4) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x must be [N, C, H, W] or [C, H, W], got %d dims", op, x->ndim);
        return false;
    }
    /* torch's rule: only the batch may be empty (an empty plane's padded windows held no value: -inf, 0 / 0),
     * and the channels for the adaptive pool */
    for (int d = x->ndim - (any_channels ? 2 : 3); d < x->ndim; d++)
        if (x->shape[d] == 0) {
            char b[64];
            accel_set_error(ACCEL_ERR_SHAPE, "%s: x %s has an empty dim %d: only the batch (N)%s may be empty", op,
                            accel_shape_str(x, b, sizeof b), d, any_channels ? " and the channels (C)" : "");
            return false;
        }
    return true;
}

/* Pools x (planes_ok) over win into x's shape with the last two dims Ho, Wo. */
static accel_tensor *pool(const char *op, accel_tensor *x, accel_device dev, const accel_k_window2d *win,
                          accel_k_pool_kind kind, bool include_pad) {
    int64_t shape[4];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 2] = win->Ho;
    shape[x->ndim - 1] = win->Wo;
    accel_tensor *out = accel__op_out(x->dtype, x->ndim, shape, dev);
    if (!out || dev.type == ACCEL_DEV_META || accel_numel(out) == 0) return out;
    pool_saved s = {.win = *win, .kind = kind, .include_pad = include_pad, .P = accel__prod(x->shape, 0, x->ndim - 2)};
    accel_tensor *xf = accel__f32_contig(x);
    accel_tensor *y = out->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, shape, dev);
    accel_tensor *idx = kind == ACCEL_K_POOL_MAX ? accel_empty_on(ACCEL_I64, x->ndim, shape, dev) : NULL;
    if (!xf || !y || (kind == ACCEL_K_POOL_MAX && !idx)) return NULL;
    accel_k_pool2d k = {.y = y, .idx = idx, .x = xf, .P = s.P, .win = s.win, .kind = kind,
                        .count_include_pad = include_pad};
    if (ACCEL_KERNEL(op, dev, pool2d, &k) != ACCEL_OK) return NULL;
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record(op + 6 /* "accel_" */, pool_backward, out, 1, &x);
    if (n) {
        pool_saved *sc = accel_arena_alloc(accel_step_arena(), sizeof *sc, 64);
        if (!sc) return NULL;
        *sc = s;
        n->ctx = sc;
        n->saved[0] = idx;
    }
    return out;
}

/* The window of a max or average pooling: accel__window_check's (the
 * output size rounded up under ceil_mode), padding at most half the kernel
 * as torch asks. */
static bool pool_window(const char *op, accel_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                        const int64_t padding[2], const int64_t dilation[2], bool ceil_mode, accel_k_window2d *win) {
    int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
    if (!accel__window_check(op, H, W, kernel, stride ? stride : kernel, padding, dilation, ceil_mode, win))
        return false;
    const int64_t pad[2] = {win->ph, win->pw}, ker[2] = {win->kh, win->kw};
    for (int d = 0; d < 2; d++)
        if (pad[d] > ker[d] / 2) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: padding[%d] = %lld must be at most half the kernel size (%lld)",
                            op, d, (long long)pad[d], (long long)ker[d]);
            return false;
        }
    return true;
}

accel_tensor *accel_max_pool2d(accel_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                               const int64_t padding[2], const int64_t dilation[2], bool ceil_mode) {
    static const char *OP = "accel_max_pool2d";
    accel_device dev;
    accel_k_window2d win;
    if (!planes_ok(OP, x, false, &dev) || !pool_window(OP, x, kernel, stride, padding, dilation, ceil_mode, &win))
        return NULL;
    return pool(OP, x, dev, &win, ACCEL_K_POOL_MAX, false);
}

accel_tensor *accel_avg_pool2d(accel_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                               const int64_t padding[2], bool ceil_mode, bool count_include_pad) {
    static const char *OP = "accel_avg_pool2d";
    accel_device dev;
    accel_k_window2d win;
    if (!planes_ok(OP, x, false, &dev) ||
        !pool_window(OP, x, kernel, stride, padding, (const int64_t[]){1, 1}, ceil_mode, &win))
        return NULL;
    return pool(OP, x, dev, &win, ACCEL_K_POOL_AVG, count_include_pad);
}

accel_tensor *accel_adaptive_avg_pool2d(accel_tensor *x, const int64_t output_size[2]) {
    static const char *OP = "accel_adaptive_avg_pool2d";
    accel_device dev;
    if (!planes_ok(OP, x, true, &dev)) return NULL;
    int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
    if (!output_size) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: output_size is NULL", OP);
        return NULL;
    }
    if (output_size[0] < 1 || output_size[1] < 1) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: output_size (%lld, %lld) must be >= 1", OP,
                        (long long)output_size[0], (long long)output_size[1]);
        return NULL;
    }
    accel_k_window2d win = {.H = H, .W = W, .Ho = output_size[0], .Wo = output_size[1]};
    return pool(OP, x, dev, &win, ACCEL_K_POOL_ADAPTIVE_AVG, false);
}

accel_tensor *accel_flatten(accel_tensor *x, int start_dim, int end_dim) {
    static const char *OP = "accel_flatten";
    accel_device dev;
    if (!accel__op_begin(OP, 1, &x, &dev)) return NULL;
    int nd = x->ndim ? x->ndim : 1, s, e;
    if (!accel__norm_dim(OP, start_dim, nd, &s) || !accel__norm_dim(OP, end_dim, nd, &e)) return NULL;
    if (s > e) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: start_dim %d comes after end_dim %d", OP, start_dim, end_dim);
        return NULL;
    }
    if (x->ndim == 0) return accel_reshape(x, 1, (int64_t[]){1});
    int64_t shape[ACCEL_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < s; d++) shape[n++] = x->shape[d];
    shape[n++] = accel__prod(x->shape, s, e + 1);
    for (int d = e + 1; d < x->ndim; d++) shape[n++] = x->shape[d];
    return accel_reshape(x, n, shape);
}
