/* accel_pad: torch.nn.functional.pad. The constant mode (torch's
 * constant_pad_nd) is a fill and a copy; reflect, replicate and circular
 * gather each padded dim by indices made on the host (accel_embedding on x
 * with that dim first: its backward adds up the elements used twice). Any
 * device with copy, fill and embedding kernels. */
#include <string.h>

#include "nn_internal.h"
#include "ops_util.h"

/* What lands where along one dim: x's [src, src + len) at out's [dst,
 * dst + len); lo, hi the dim's pads (negative: cropped, by no more than the
 * dim holds: accel_pad checked it, so len >= 0). */
typedef struct pad_span {
    int64_t src, dst, len;
} pad_span;

static pad_span span_of(int64_t size, int64_t lo, int64_t hi) {
    return (pad_span){lo < 0 ? -lo : 0, lo > 0 ? lo : 0, size + (lo < 0 ? lo : 0) + (hi < 0 ? hi : 0)};
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
    accel_tensor *gx = accel_pad(g, npad, neg, ACCEL_PAD_CONSTANT, 0.0);
    return gx ? accel_grad_accumulate(n->inputs[0], gx) : accel_last_status();
}

static const char *const MODES[] = {"constant", "reflect", "replicate", "circular"};

/* Where output element o of a dim of `size` padded by lo before reads x
 * from in a non-constant mode (pads >= 0, checked against size). */
static int64_t source_of(accel_pad_mode mode, int64_t o, int64_t lo, int64_t size) {
    int64_t j = o - lo;
    if (j >= 0 && j < size) return j;
    switch (mode) {
    case ACCEL_PAD_REFLECT: return j < 0 ? -j : 2 * (size - 1) - j;
    case ACCEL_PAD_REPLICATE: return j < 0 ? 0 : size - 1;
    default: return (j % size + size) % size; /* circular */
    }
}

/* x gathered along dim d by the host indices idx[n] (torch's index_select). */
static accel_tensor *gather_dim(accel_tensor *x, int d, const int64_t *idx, int64_t n) {
    int perm[ACCEL_MAX_DIMS], back[ACCEL_MAX_DIMS], k = 1;
    perm[0] = d;
    for (int i = 0; i < x->ndim; i++)
        if (i != d) perm[k++] = i;
    for (int i = 0; i < x->ndim; i++) back[perm[i]] = i;
    accel_tensor *first = accel_permute(x, perm);
    int64_t shape[ACCEL_MAX_DIMS];
    if (!first) return NULL;
    memcpy(shape, first->shape, sizeof shape);
    accel_tensor *rows = accel_reshape(first, 2, (int64_t[]){shape[0], accel_numel(x) / shape[0]});
    accel_tensor *ids = accel_empty_on(ACCEL_I64, 1, &n, x->device);
    if (!rows || !ids || accel_tensor_from_host(ids, idx) != ACCEL_OK) return NULL;
    shape[0] = n;
    return accel_permute(accel_reshape(accel_embedding(ids, rows), x->ndim, shape), back);
}

/* torch's checks of a non-constant mode: 2, 4 or 6 pads of a 2-3, 3-4 or 4-5-D x; below the dim's size for
 * reflect, at most it for circular; reflect and replicate read a non-empty plane (dims but the batch's). A
 * negative pad is refused: torch takes some (a crop, then the pad) and errs or reads past the crop on others,
 * so no one rule is its; crop in constant mode first. */
static bool mode_ok(const char *OP, const accel_tensor *x, int npad, const int64_t *pad, accel_pad_mode mode) {
    const char *m = MODES[mode];
    if (npad < 2 || npad > 6 || x->ndim < npad / 2 + 1 || x->ndim > npad / 2 + 2) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED,
                        "%s: %s padding of %d values is not built for a %d-D input (as torch: 2 values pad a 2-D or "
                        "3-D input, 4 a 3-D or 4-D one, 6 a 4-D or 5-D one)",
                        OP, m, npad, x->ndim);
        return false;
    }
    for (int i = 0; i < npad / 2; i++) {
        int d = x->ndim - 1 - i;
        int64_t lo = pad[2 * i], hi = pad[2 * i + 1], size = x->shape[d];
        const char *why = lo < 0 || hi < 0                                           ? "negative (it crops in constant mode only)"
                          : mode == ACCEL_PAD_REFLECT && (lo >= size || hi >= size)  ? "not below the dim's size"
                          : mode == ACCEL_PAD_CIRCULAR && (lo > size || hi > size)   ? "past the dim's size (it would wrap around more than once)"
                                                                                     : NULL;
        if (why) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s padding (%lld, %lld) of dim %d of size %lld is %s", OP, m,
                            (long long)lo, (long long)hi, d, (long long)size, why);
            return false;
        }
    }
    if (mode != ACCEL_PAD_CIRCULAR)
        for (int d = x->ndim - npad / 2 - 1; d < x->ndim; d++)
            if (x->shape[d] == 0 && !(d == 0 && x->ndim == npad / 2 + 2)) {
                char b[96];
                accel_set_error(ACCEL_ERR_SHAPE, "%s: %s padding reads a plane with other dims than the batch's "
                                "non-empty, got %s", OP, m, accel_shape_str(x, b, sizeof b));
                return false;
            }
    return true;
}

/* A non-constant mode (checked), dim by dim from the last. */
static accel_tensor *pad_by_index(accel_tensor *x, int npad, const int64_t *pad, accel_pad_mode mode) {
    accel_tensor *y = x;
    for (int i = 0; i < npad / 2 && y; i++) {
        int d = x->ndim - 1 - i;
        int64_t lo = pad[2 * i], size = x->shape[d], n = size + lo + pad[2 * i + 1];
        if (size == 0 || lo + pad[2 * i + 1] == 0) continue; /* nothing to pad from, or nothing to pad */
        /* step memory, as the ids tensor it is copied into: no malloc per forward */
        int64_t *idx = accel_arena_alloc(accel_step_arena(), (size_t)n * sizeof *idx, 64);
        if (!idx) return NULL;
        for (int64_t o = 0; o < n; o++) idx[o] = source_of(mode, o, lo, size);
        y = gather_dim(y, d, idx, n);
    }
    return y == x ? accel_contiguous(accel_mul_scalar(x, 1.0)) : accel_contiguous(y);
}

accel_tensor *accel_pad(accel_tensor *x, int npad, const int64_t *pad, accel_pad_mode mode, double value) {
    static const char *OP = "accel_pad";
    accel_device dev;
    if (!accel__op_begin(OP, 1, &x, &dev)) return NULL;
    if ((unsigned)mode > ACCEL_PAD_CIRCULAR) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: mode %d is none of accel_pad_mode's", OP, (int)mode);
        return NULL;
    }
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
        bool past = __builtin_add_overflow(x->shape[d], lo, &size) || __builtin_add_overflow(size, hi, &size);
        /* torch narrows x to what the crops leave first: more cropped than the dim holds is refused even where
         * the other side's padding would make the size up */
        int64_t left;
        bool over_cropped = __builtin_add_overflow(x->shape[d], lo < 0 ? lo : 0, &left) ||
                            __builtin_add_overflow(left, hi < 0 ? hi : 0, &left) || left < 0;
        /* (a negative size is a crop by more than the dim holds) */
        if (past || over_cropped) {
            accel_set_error(ACCEL_ERR_SHAPE, "%s: dim %d of size %lld padded by %lld and %lld %s (pad[%d], pad[%d])",
                            OP, d, (long long)x->shape[d], (long long)lo, (long long)hi,
                            past ? "would have a size past int64" : "is cropped by more than its size", 2 * i,
                            2 * i + 1);
            return NULL;
        }
        shape[d] = size;
    }
    if (!accel__check_shape(OP, x->ndim, shape)) return NULL;
    if (mode != ACCEL_PAD_CONSTANT) {
        if (!mode_ok(OP, x, npad, pad, mode)) return NULL;
        if (!accel_dtype_is_float(x->dtype)) {
            accel_set_error(ACCEL_ERR_DTYPE, "%s: %s padding of a %s tensor is not built (floating dtypes only)", OP,
                            MODES[mode], accel_dtype_name(x->dtype));
            return NULL;
        }
        if (dev.type != ACCEL_DEV_META && accel__prod(shape, 0, x->ndim) > 0) return pad_by_index(x, npad, pad, mode);
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
