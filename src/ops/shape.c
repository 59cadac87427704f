/* Shape ops: reshape, permute/transpose, slice, expand, (un)squeeze, contiguous,
 * concat, split. All but concat (and reshape/contiguous of a non-contiguous
 * tensor) return views sharing the input's data. */
#include <string.h>

#include "ops_util.h"

/* ---------------------------------------------------------------- reshape */

accel_tensor *accel_reshape(accel_tensor *a, int ndim, const int64_t *shape) {
    const char *op = "accel_reshape";
    accel_device dev;
    if (!accel__op_begin(op, 1, &a, &dev)) return NULL;
    if (ndim < 0 || ndim > ACCEL_MAX_DIMS || (ndim && !shape)) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: invalid target shape (%d dims, at most %d)", op, ndim,
                        ACCEL_MAX_DIMS);
        return NULL;
    }
    int64_t s[ACCEL_MAX_DIMS], known = 1;
    int infer = -1;
    bool bad = false;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (shape[i] == -1 && infer < 0) infer = i;
        else if (shape[i] < 0) bad = true;
        /* a product past int64 matches no tensor (it overflowed: undefined behaviour) */
        else if (__builtin_mul_overflow(known, shape[i], &known)) bad = true;
    }
    int64_t numel = accel_numel(a);
    if (!bad && infer >= 0) {
        if (known == 0 || numel % known != 0) bad = true;
        else s[infer] = numel / known;
    }
    if (bad || (infer < 0 && known != numel)) {
        char x[96], y[96];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: cannot reshape a tensor of shape %s into shape %s", op,
                        accel_shape_str(a, x, sizeof x), accel_shape_str_n(ndim, shape, y, sizeof y));
        return NULL;
    }
    accel_tensor *src = dev.type == ACCEL_DEV_META ? a : accel__dense(a);
    if (!src) return NULL;
    int64_t st[ACCEL_MAX_DIMS];
    accel__contiguous_strides(ndim, s, st);
    accel_tensor *out = accel_view_raw(src, ndim, s, st, 0);
    if (!out) return NULL;
    out->device = dev;
    accel_tape_record("reshape", accel__reshape_backward, out, 1, &a);
    return out;
}

/* ---------------------------------------------------------------- permute */

static accel_status permute_backward(accel_node *n, accel_tensor *g) {
    int inv[ACCEL_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++) inv[n->iarg[i]] = i;
    accel_tensor *gx = accel__dense(accel_permute(g, inv)); /* leaves accumulate fastest from dense */
    if (!gx) return accel_last_status();
    /* The transposed copy is the input's alone, and so is g where its
     * transpose is already dense (a gradient made in the output's layout,
     * nn_internal.h): the input's first gradient takes it, the output's is
     * dropped. */
    return accel__grad_move_out(n, n->inputs[0], gx);
}

static accel_tensor *permute_impl(const char *op, accel_tensor *a, const int *perm) {
    int nd = a->ndim;
    int64_t shape[ACCEL_MAX_DIMS], stride[ACCEL_MAX_DIMS];
    unsigned seen = 0;
    for (int i = 0; i < nd; i++) {
        int p = perm[i] < 0 ? perm[i] + nd : perm[i];
        if (p < 0 || p >= nd || ((seen >> p) & 1u)) {
            char b[96];
            accel_set_error(ACCEL_ERR_INVALID_ARG,
                            "%s: entry %d (%d) of the permutation is out of range or repeated for "
                            "shape %s", op, i, perm[i], accel_shape_str(a, b, sizeof b));
            return NULL;
        }
        seen |= 1u << p;
        shape[i] = a->shape[p];
        stride[i] = a->stride[p];
    }
    accel_tensor *out = accel_view_raw(a, nd, shape, stride, 0);
    if (!out) return NULL;
    accel_node *n = accel_tape_record("permute", permute_backward, out, 1, &a);
    if (n)
        for (int i = 0; i < nd; i++) n->iarg[i] = perm[i] < 0 ? perm[i] + nd : perm[i];
    return out;
}

accel_tensor *accel_permute(accel_tensor *a, const int *perm) {
    accel_device dev;
    if (!accel__op_begin("accel_permute", 1, &a, &dev)) return NULL;
    if (!perm && a->ndim) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_permute: perm is NULL");
        return NULL;
    }
    return permute_impl("accel_permute", a, perm);
}

accel_tensor *accel_transpose(accel_tensor *a, int d0, int d1) {
    const char *op = "accel_transpose";
    accel_device dev;
    int x, y;
    if (!accel__op_begin(op, 1, &a, &dev) || !accel__norm_dim(op, d0, a->ndim, &x) ||
        !accel__norm_dim(op, d1, a->ndim, &y))
        return NULL;
    int perm[ACCEL_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) perm[i] = i;
    if (a->ndim) {
        perm[x] = y;
        perm[y] = x;
    }
    return permute_impl(op, a, perm);
}

/* ---------------------------------------------------------------- slice */

/* The slice of node n's input t (its gradient, or a buffer of its shape):
 * the view the forward made of the input, taken of t. */
static accel_tensor *slice_of(const accel_node *n, accel_tensor *t) {
    return accel_slice(t, (int)n->iarg[0], n->iarg[1], n->iarg[2], n->iarg[3]);
}

/* Whether x's gradient is x's alone, in place on the CPU, whose accumulate
 * kernel adds into any strides (the other devices' write dense outputs); x
 * still requires one (a leaf turned off between forward and backward keeps
 * its gradient as it was, as accel_grad_accumulate leaves it). */
static bool adds_in_place(const accel_tensor *x) {
    return x->requires_grad && x->grad && !accel__grad_is_shared(x) && x->device.type == ACCEL_DEV_CPU &&
           accel_device_eq(x->grad->device, x->device);
}

/* The gradient goes into the slice's place of the input's. A step tensor's
 * first one is zeros of its shape and dtype with g copied into that place;
 * on the CPU a later one is added into that place alone. Before, each slice
 * made zeros of the input's whole shape and added them whole into the
 * input's gradient: a tensor cut in k parts (a fused projection's q, k and
 * v, gate and up) cost k whole buffers and k whole additions. The same
 * values: zeros converted are zeros, and the place's elements get the
 * conversion, or the sum, the whole-buffer route gave them. */
static accel_status slice_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    if (x->device.type != ACCEL_DEV_META && accel__grad_first_is_step(x)) {
        accel_tensor *gx = accel_empty_on(x->dtype, x->ndim, x->shape, x->device), *v = gx ? slice_of(n, gx) : NULL;
        if (!v || accel_zero_(gx) != ACCEL_OK || accel_copy_(v, g) != ACCEL_OK) return accel_last_status();
        x->grad = gx;
        return ACCEL_OK;
    }
    if (adds_in_place(x)) {
        accel_tensor *v = slice_of(n, x->grad);
        if (!v) return accel_last_status();
        accel_k_accumulate k = {.out = v, .in = g};
        accel_status st = ACCEL_KERNEL("accel_slice backward", x->device, accumulate, &k);
        accel__tensor_written(x->grad);
        return st;
    }
    accel_tensor *gx = accel_empty_on(g->dtype, x->ndim, x->shape, x->device), *v = gx ? slice_of(n, gx) : NULL;
    if (!v || accel_zero_(gx) != ACCEL_OK || accel_copy_(v, g) != ACCEL_OK) return accel_last_status();
    return accel_grad_accumulate(x, gx);
}

static accel_tensor *slice_impl(const char *op, accel_tensor *a, int dim, int64_t start, int64_t end,
                                int64_t step) {
    int d;
    if (!accel__norm_dim(op, dim, a->ndim, &d)) return NULL;
    if (a->ndim == 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: cannot slice a 0-dim tensor", op);
        return NULL;
    }
    if (step <= 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: step must be positive, got %lld", op,
                        (long long)step);
        return NULL;
    }
    int64_t size = a->shape[d];
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = start < 0 ? 0 : start > size ? size : start;
    end = end < start ? start : end > size ? size : end;
    int64_t shape[ACCEL_MAX_DIMS], stride[ACCEL_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    memcpy(stride, a->stride, sizeof stride);
    /* ceil((end - start) / step) without end - start + step - 1, which passed
     * int64 for a step near INT64_MAX (signed overflow: a[0:6:INT64_MAX] came
     * out empty instead of [a[0]]); one element needs no step in its stride */
    shape[d] = end == start ? 0 : (end - start - 1) / step + 1;
    stride[d] = shape[d] > 1 ? a->stride[d] * step : a->stride[d];
    accel_tensor *out = accel_view_raw(a, a->ndim, shape, stride, shape[d] ? start * a->stride[d] : 0);
    if (!out) return NULL;
    accel_node *n = accel_tape_record("slice", slice_backward, out, 1, &a);
    if (n) {
        n->iarg[0] = d;
        n->iarg[1] = start;
        n->iarg[2] = end;
        n->iarg[3] = step;
    }
    return out;
}

accel_tensor *accel_slice(accel_tensor *a, int dim, int64_t start, int64_t end, int64_t step) {
    accel_device dev;
    if (!accel__op_begin("accel_slice", 1, &a, &dev)) return NULL;
    return slice_impl("accel_slice", a, dim, start, end, step);
}

accel_status accel_split(accel_tensor *a, int dim, int n, const int64_t *sizes, accel_tensor **outs) {
    const char *op = "accel_split";
    accel_device dev;
    if (outs)
        for (int i = 0; i < n; i++) outs[i] = NULL;
    if (!accel__op_begin(op, 1, &a, &dev)) return accel_last_status();
    if (n <= 0 || !sizes || !outs)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: need n > 0 parts, sizes and outs (n %d)", op, n);
    int d;
    if (!accel__norm_dim(op, dim, a->ndim, &d)) return accel_last_status();
    if (a->ndim == 0) return accel_set_error(ACCEL_ERR_SHAPE, "%s: cannot split a 0-dim tensor", op);
    int64_t total = 0;
    bool bad = false;
    /* a sum past int64 wrapped (undefined behaviour): {INT64_MAX, INT64_MAX, 5}
     * "added up" to 3 and its views started past the tensor */
    for (int i = 0; i < n; i++) bad |= sizes[i] < 0 || __builtin_add_overflow(total, sizes[i], &total);
    if (bad || total != a->shape[d]) {
        char b[96], s[96];
        accel_shape_str_n(n < ACCEL_MAX_DIMS ? n : ACCEL_MAX_DIMS, sizes, s, sizeof s);
        return accel_set_error(ACCEL_ERR_SHAPE,
                               "%s: sizes %s%s do not add up to dim %d of shape %s", op, s,
                               n > ACCEL_MAX_DIMS ? "..." : "", d, accel_shape_str(a, b, sizeof b));
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        outs[i] = slice_impl(op, a, d, off, off + sizes[i], 1);
        if (!outs[i]) return accel_last_status();
        off += sizes[i];
    }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- expand */

static accel_status expand_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    accel_tensor *gx = accel_sum_to_shape(g, x->ndim, x->shape);
    return gx ? accel_grad_accumulate(x, gx) : accel_last_status();
}

accel_tensor *accel_expand(accel_tensor *a, int ndim, const int64_t *shape) {
    const char *op = "accel_expand";
    accel_device dev;
    if (!accel__op_begin(op, 1, &a, &dev)) return NULL;
    if (ndim < a->ndim || ndim > ACCEL_MAX_DIMS || (ndim && !shape)) {
        char x[96];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: cannot expand shape %s to %d dims", op,
                        accel_shape_str(a, x, sizeof x), ndim);
        return NULL;
    }
    int64_t s[ACCEL_MAX_DIMS], st[ACCEL_MAX_DIMS];
    int lead = ndim - a->ndim;
    for (int i = 0; i < ndim; i++) {
        int ai = i - lead;
        int64_t want = shape[i];
        bool ok;
        if (ai < 0) {
            ok = want >= 0;
            s[i] = want;
            st[i] = 0;
        } else {
            int64_t have = a->shape[ai];
            if (want == -1) want = have;
            ok = want == have || (have == 1 && want >= 0);
            s[i] = want;
            st[i] = want == have ? a->stride[ai] : 0;
        }
        if (!ok) {
            char x[96], y[96];
            accel_set_error(ACCEL_ERR_SHAPE, "%s: cannot expand shape %s to %s", op,
                            accel_shape_str(a, x, sizeof x), accel_shape_str_n(ndim, shape, y, sizeof y));
            return NULL;
        }
    }
    accel_tensor *out = accel_view_raw(a, ndim, s, st, 0);
    if (!out) return NULL;
    accel_tape_record("expand", expand_backward, out, 1, &a);
    return out;
}

/* ---------------------------------------------------------------- contiguous, (un)squeeze */

accel_tensor *accel_contiguous(accel_tensor *a) {
    accel_device dev;
    if (!accel__op_begin("accel_contiguous", 1, &a, &dev)) return NULL;
    if (accel_is_contiguous(a)) return accel__alias_op("contiguous", a);
    accel_tensor *out = accel__op_out(a->dtype, a->ndim, a->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    if (accel_copy_(out, a) != ACCEL_OK) return NULL;
    accel_tape_record("contiguous", accel__reshape_backward, out, 1, &a);
    return out;
}

accel_tensor *accel_unsqueeze(accel_tensor *a, int dim) {
    const char *op = "accel_unsqueeze";
    accel_device dev;
    int d;
    if (!accel__op_begin(op, 1, &a, &dev) || !accel__norm_dim(op, dim, a->ndim + 1, &d))
        return NULL;
    if (a->ndim == ACCEL_MAX_DIMS) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: tensor already has %d dims", op, ACCEL_MAX_DIMS);
        return NULL;
    }
    int64_t shape[ACCEL_MAX_DIMS], stride[ACCEL_MAX_DIMS];
    for (int i = 0, j = 0; i <= a->ndim; i++) {
        if (i == d) {
            shape[i] = 1;
            stride[i] = d < a->ndim ? a->shape[d] * a->stride[d] : 1;
        } else {
            shape[i] = a->shape[j];
            stride[i] = a->stride[j++];
        }
    }
    accel_tensor *out = accel_view_raw(a, a->ndim + 1, shape, stride, 0);
    if (!out) return NULL;
    accel_tape_record("unsqueeze", accel__reshape_backward, out, 1, &a);
    return out;
}

accel_tensor *accel_squeeze(accel_tensor *a, int dim) {
    const char *op = "accel_squeeze";
    accel_device dev;
    int d;
    if (!accel__op_begin(op, 1, &a, &dev) || !accel__norm_dim(op, dim, a->ndim, &d)) return NULL;
    if (a->ndim == 0 || a->shape[d] != 1) return accel__alias_op("squeeze", a); /* as PyTorch: no-op */
    int64_t shape[ACCEL_MAX_DIMS], stride[ACCEL_MAX_DIMS];
    for (int i = 0, j = 0; i < a->ndim; i++) {
        if (i == d) continue;
        shape[j] = a->shape[i];
        stride[j++] = a->stride[i];
    }
    accel_tensor *out = accel_view_raw(a, a->ndim - 1, shape, stride, 0);
    if (!out) return NULL;
    accel_tape_record("squeeze", accel__reshape_backward, out, 1, &a);
    return out;
}

/* ---------------------------------------------------------------- concat */

/* One node per group of up to ACCEL_NODE_MAX_INPUTS inputs, all with the same
 * output: iarg[0] = dim, iarg[1 + j] = offset of input j along dim. */
static accel_status concat_backward(accel_node *n, accel_tensor *g) {
    int d = (int)n->iarg[0];
    for (int j = 0; j < n->n_inputs; j++) {
        accel_tensor *x = n->inputs[j];
        if (!x->requires_grad) continue;
        accel_tensor *gx = accel__dense(accel_slice(g, d, n->iarg[1 + j], n->iarg[1 + j] + x->shape[d], 1));
        if (!gx) return accel_last_status();
        accel_status st = accel_grad_accumulate(x, gx);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

accel_tensor *accel_concat(int n, accel_tensor *const *ts, int dim) {
    const char *op = "accel_concat";
    if (n <= 0 || !ts) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: need at least one tensor (n %d)", op, n);
        return NULL;
    }
    accel_device dev;
    if (!accel__op_begin(op, n, ts, &dev)) return NULL;
    accel_tensor *a = ts[0];
    int d;
    if (!accel__norm_dim(op, dim, a->ndim, &d)) return NULL;
    if (a->ndim == 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: cannot concatenate 0-dim tensors", op);
        return NULL;
    }
    int64_t shape[ACCEL_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    accel_dtype dt = a->dtype;
    for (int i = 1; i < n; i++) {
        accel_tensor *t = ts[i];
        bool ok = t->ndim == a->ndim;
        for (int k = 0; ok && k < a->ndim; k++) ok = k == d || t->shape[k] == a->shape[k];
        if (!ok) {
            accel__shape_error2(op, a, t, "do not match outside the concatenation dim");
            return NULL;
        }
        shape[d] += t->shape[d];
        dt = accel__promote(dt, t->dtype);
    }
    accel_tensor *out = accel__op_out(dt, a->ndim, shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    bool prev = accel_set_grad_enabled(false);
    int64_t off = 0;
    for (int i = 0; i < n && out; i++) {
        accel_tensor *v = accel_slice(out, d, off, off + ts[i]->shape[d], 1);
        if (!v) out = NULL;
        else if (accel_copy_(v, ts[i]) != ACCEL_OK) out = NULL;
        off += ts[i]->shape[d];
    }
    accel_set_grad_enabled(prev);
    if (!out) return NULL;
    if (!accel_dtype_is_float(dt)) return out;
    off = 0;
    for (int g = 0; g < n; g += ACCEL_NODE_MAX_INPUTS) {
        int m = n - g < ACCEL_NODE_MAX_INPUTS ? n - g : ACCEL_NODE_MAX_INPUTS;
        int64_t group_off = off;
        for (int j = 0; j < m; j++) off += ts[g + j]->shape[d];
        accel_node *node = accel_tape_record("concat", concat_backward, out, m, ts + g);
        if (!node) continue;
        node->iarg[0] = d;
        for (int j = 0; j < m; j++) {
            node->iarg[1 + j] = group_off;
            group_off += ts[g + j]->shape[d];
        }
    }
    return out;
}
