/* Reductions: sum/mean over dims, max and argmax over a dim, and sum-to-shape for
 * broadcast gradients. */
#include <string.h>

#include "ops_util.h"

/* Output shape of a reduction: kept dims (reduced ones as 1 when keepdim). */
static int reduced_shape(const accel_tensor *a, unsigned mask, bool keepdim, int64_t *shape) {
    int nd = 0;
    for (int d = 0; d < a->ndim; d++) {
        if (!((mask >> d) & 1u)) shape[nd++] = a->shape[d];
        else if (keepdim) shape[nd++] = 1;
    }
    return nd;
}

/* d(scale * sum x)/dx: the gradient broadcast back over the reduced dims. */
static accel_status sum_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    unsigned mask = (unsigned)n->iarg[0];
    double scale = n->farg[0];
    int64_t kshape[ACCEL_MAX_DIMS];
    int nd = reduced_shape(x, mask, true, kshape);
    accel_tensor *e = accel_expand(accel_reshape(g, nd, kshape), x->ndim, x->shape);
    accel_tensor *gx = scale != 1.0 ? accel_mul_scalar(e, scale) : (e ? accel__dense(e) : NULL);
    return gx ? accel_grad_accumulate(x, gx) : accel_last_status();
}

static accel_tensor *reduce_sum(const char *op, const char *name, bool mean, accel_tensor *a,
                                int n_dims, const int *dims, bool keepdim) {
    accel_device dev;
    if (!accel__op_begin(op, 1, &a, &dev)) return NULL;
    if (mean && !accel__op_check_float(op, a, "input")) return NULL;
    if (n_dims < 0 || (n_dims > 0 && !dims)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: invalid dims list (n_dims %d)", op, n_dims);
        return NULL;
    }
    unsigned mask = 0;
    if (n_dims == 0) {
        mask = (1u << a->ndim) - 1u;
    } else {
        for (int i = 0; i < n_dims; i++) {
            int d;
            if (!accel__norm_dim(op, dims[i], a->ndim, &d)) return NULL;
            if (a->ndim == 0) continue; /* dim 0 / -1 of a scalar: nothing to reduce */
            if ((mask >> d) & 1u) {
                accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: dim %d appears twice", op, d);
                return NULL;
            }
            mask |= 1u << d;
        }
    }
    int64_t shape[ACCEL_MAX_DIMS], count = 1;
    int nd = reduced_shape(a, mask, keepdim, shape);
    for (int d = 0; d < a->ndim; d++)
        if ((mask >> d) & 1u) count *= a->shape[d];
    double scale = mean ? 1.0 / (double)count : 1.0;
    bool is_float = accel_dtype_is_float(a->dtype);
    accel_dtype dt = is_float ? a->dtype : ACCEL_I64; /* integer sums are int64, as in PyTorch */
    accel_tensor *out = accel__op_out(dt, nd, shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_k_sum k = {.out = out, .x = a, .mask = mask, .scale = scale};
    if (!accel_reference_kernels() && is_float) {
        k.x = a->dtype == ACCEL_F32 ? a : accel__dense_f32(a);
        k.out = dt == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, nd, shape, dev);
        if (!k.x || !k.out) return NULL;
    }
    if (ACCEL_KERNEL(op, dev, sum, &k) != ACCEL_OK) return NULL;
    if (k.out != out && accel_copy_(out, k.out) != ACCEL_OK) return NULL;
    if (is_float) {
        accel_node *n = accel_tape_record(name, sum_backward, out, 1, &a);
        if (n) {
            n->iarg[0] = mask;
            n->farg[0] = scale;
        }
    }
    return out;
}

accel_tensor *accel_sum(accel_tensor *a, int n_dims, const int *dims, bool keepdim) {
    return reduce_sum("accel_sum", "sum", false, a, n_dims, dims, keepdim);
}
accel_tensor *accel_mean(accel_tensor *a, int n_dims, const int *dims, bool keepdim) {
    return reduce_sum("accel_mean", "mean", true, a, n_dims, dims, keepdim);
}
accel_tensor *accel_sum_all(accel_tensor *a) {
    return reduce_sum("accel_sum_all", "sum", false, a, 0, NULL, false);
}
accel_tensor *accel_mean_all(accel_tensor *a) {
    return reduce_sum("accel_mean_all", "mean", true, a, 0, NULL, false);
}

/* ---------------------------------------------------------------- max */

/* The gradient goes to the argmax of each reduced row. */
static accel_status max_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    accel_tensor *gx = accel_empty_on(ACCEL_F32, x->ndim, x->shape, x->device);
    accel_tensor *fg = accel__dense_f32(g);
    if (!gx || !fg) return accel_last_status();
    accel_k_max_backward k = {.gx = gx, .g = fg, .indices = n->saved[0], .dim = (int)n->iarg[0]};
    accel_status st = ACCEL_KERNEL("max backward", x->device, max_backward, &k);
    return st == ACCEL_OK ? accel_grad_accumulate(x, gx) : st;
}

/* The max of a over dim and its indices (*indices, i64): the body of max
 * (which records its gradient) and argmax (which does not). */
static accel_tensor *max_over_dim(const char *op, accel_tensor *a, int dim, bool keepdim, accel_tensor **indices,
                                  bool differentiable) {
    if (indices) *indices = NULL;
    accel_device dev;
    if (!accel__op_begin(op, 1, &a, &dev)) return NULL;
    int d;
    if (!accel__norm_dim(op, dim, a->ndim, &d)) return NULL;
    if (a->ndim == 0) { /* a scalar is its own max, at index 0 */
        a = accel_reshape(a, 1, (const int64_t[]){1});
        if (!a) return NULL;
        keepdim = false;
    }
    if (a->shape[d] == 0) {
        char b[96];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: cannot reduce dim %d of size 0 (shape %s)", op, d,
                        accel_shape_str(a, b, sizeof b));
        return NULL;
    }
    int64_t shape[ACCEL_MAX_DIMS];
    int nd = reduced_shape(a, 1u << d, keepdim, shape);
    accel_tensor *out = accel__op_out(a->dtype, nd, shape, dev);
    accel_tensor *idx = accel__op_out(ACCEL_I64, nd, shape, dev);
    if (!out || !idx) return NULL;
    if (indices) *indices = idx;
    if (dev.type == ACCEL_DEV_META) return out;
    accel_k_max k = {.values = out, .indices = idx, .x = a, .dim = d};
    if (ACCEL_KERNEL(op, dev, max, &k) != ACCEL_OK) return NULL;
    if (differentiable && accel_dtype_is_float(a->dtype)) {
        accel_node *n = accel_tape_record("max", max_backward, out, 1, &a);
        if (n) {
            n->saved[0] = idx;
            n->iarg[0] = d;
        }
    }
    return out;
}

accel_tensor *accel_max(accel_tensor *a, int dim, bool keepdim, accel_tensor **indices) {
    return max_over_dim("accel_max", a, dim, keepdim, indices, true);
}

accel_tensor *accel_argmax(accel_tensor *a, int dim, bool keepdim) {
    accel_tensor *indices;
    return max_over_dim("accel_argmax", a, dim, keepdim, &indices, false) ? indices : NULL;
}

/* ---------------------------------------------------------------- sum to shape */

accel_tensor *accel_sum_to_shape(accel_tensor *g, int ndim, const int64_t *shape) {
    if (!accel_tensor_check(g, "accel_sum_to_shape", "grad")) return NULL;
    if (ndim < 0 || ndim > ACCEL_MAX_DIMS || (ndim && !shape)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_sum_to_shape: invalid target shape (%d dims)", ndim);
        return NULL;
    }
    if (g->ndim == ndim && memcmp(g->shape, shape, (size_t)ndim * sizeof *shape) == 0) return g;
    int lead = g->ndim - ndim, dims[ACCEL_MAX_DIMS], nd = 0;
    bool ok = lead >= 0;
    for (int i = 0; i < lead; i++) dims[nd++] = i;
    for (int i = 0; ok && i < ndim; i++) {
        if (shape[i] == g->shape[lead + i]) continue;
        if (shape[i] == 1) dims[nd++] = lead + i;
        else ok = false;
    }
    if (!ok) {
        char x[96], y[96];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_sum_to_shape: shape %s cannot be reduced to %s",
                        accel_shape_str(g, x, sizeof x), accel_shape_str_n(ndim, shape, y, sizeof y));
        return NULL;
    }
    return accel_reshape(accel_sum(g, nd, dims, true), ndim, shape);
}
