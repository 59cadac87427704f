/* accel_pad: torch.nn.functional.pad in its constant mode (torch's
 * constant_pad_nd). Copies, on any device with copy and fill kernels. */
#include <string.h>

#include "ops_util.h"

/* What lands where along one dim: x's [src, src + len) at out's [dst,
 * dst + len); lo, hi the dim's pads (negative: cropped). */
typedef struct pad_span {
    int64_t src, dst, len;
} pad_span;

static pad_span span_of(int64_t size, int64_t lo, int64_t hi) {
    pad_span s = {lo < 0 ? -lo : 0, lo > 0 ? lo : 0, size + (lo < 0 ? lo : 0) + (hi < 0 ? hi : 0)};
    if (s.len < 0) s.len = 0;
    return s;
}

/* The view of t (x's shape when of_x, else out's) that the copy reads or
 * writes: the spans of the npad / 2 last dims. */
static accel_tensor *region(accel_tensor *t, int npad, const int64_t *pad, const accel_tensor *x, bool of_x) {
    for (int i = 0; i < npad / 2 && t; i++) {
        int d = x->ndim - 1 - i;
        pad_span s = span_of(x->shape[d], pad[2 * i], pad[2 * i + 1]);
        int64_t at = of_x ? s.src : s.dst;
        t = accel_slice(t, d, at, at + s.len, 1);
    }
    return t;
}

/* The gradient of a pad is the pad by the opposite amounts: the padded
 * border dropped, zeros where x was cropped. */
static accel_status pad_backward(accel_node *n, accel_tensor *g) {
    int npad = (int)n->iarg[0];
    int64_t neg[2 * ACCEL_MAX_DIMS];
    const int64_t *pads = n->ctx;
    for (int i = 0; i < npad; i++) neg[i] = -pads[i];
    accel_tensor *gx = accel_pad(g, npad, neg, 0.0);
    return gx ? accel_grad_accumulate(n->inputs[0], gx) : accel_last_status();
}

accel_tensor *accel_pad(accel_tensor *x, int npad, const int64_t *pad, double value) {
    static const char *OP = "accel_pad";
    accel_device dev;
    if (!accel__op_begin(OP, 1, &x, &dev)) return NULL;
    if (npad < 0 || npad % 2 || (npad && !pad)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: padding length must be divisible by 2 (got %d%s)", OP, npad,
                        npad > 0 && !pad ? " and a NULL pad" : "");
        return NULL;
    }
    if (npad / 2 > x->ndim) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s: padding length should be at most two times the input dimension, got padding length %d "
                        "and an input of dimension %d",
                        OP, npad, x->ndim);
        return NULL;
    }
    int64_t shape[ACCEL_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    for (int i = 0; i < npad / 2; i++) {
        int d = x->ndim - 1 - i;
        int64_t lo = pad[2 * i], hi = pad[2 * i + 1], size;
        if (__builtin_add_overflow(x->shape[d], lo, &size) || __builtin_add_overflow(size, hi, &size) || size < 0) {
            accel_set_error(ACCEL_ERR_SHAPE,
                            "%s: dim %d of size %lld padded by %lld and %lld would have %s size (pad[%d], pad[%d])",
                            OP, d, (long long)x->shape[d], (long long)lo, (long long)hi,
                            size < 0 ? "a negative" : "a past-int64", 2 * i, 2 * i + 1);
            return NULL;
        }
        shape[d] = size;
    }
    accel_tensor *out = accel__op_out(x->dtype, x->ndim, shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    if (accel_numel(out) > 0) {
        bool prev = accel_set_grad_enabled(false);
        accel_tensor *dst = accel_fill_(out, value) == ACCEL_OK ? region(out, npad, pad, x, false) : NULL;
        accel_tensor *src = dst ? region(x, npad, pad, x, true) : NULL;
        bool ok = src && (accel_numel(src) == 0 || accel_copy_(dst, src) == ACCEL_OK);
        accel_set_grad_enabled(prev);
        if (!ok) return NULL;
    }
    if (!accel_dtype_is_float(x->dtype)) return out;
    accel_node *n = accel_tape_record("pad", pad_backward, out, 1, &x);
    if (n) {
        int64_t *pads = accel_arena_alloc(accel_step_arena(), (size_t)(npad ? npad : 1) * sizeof *pads, 8);
        if (!pads) return NULL;
        if (npad) memcpy(pads, pad, (size_t)npad * sizeof *pads);
        n->iarg[0] = npad;
        n->ctx = pads;
    }
    return out;
}
