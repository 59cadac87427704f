/* Metrics ops: elementwise comparisons (bool results) and where. */
#include <math.h>

#include "ops_util.h"

/* ---------------------------------------------------------------- comparisons */

static accel_tensor *compare(const char *op, accel__cmpop cop, accel_tensor *a, accel_tensor *b) {
    accel_tensor *in[2] = {a, b};
    accel_device dev;
    if (!accel__op_begin(op, 2, in, &dev)) return NULL;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    if (!accel__broadcast_shape(op, a, b, &ndim, shape)) return NULL;
    accel_tensor *out = accel__op_out(ACCEL_BOOL, ndim, shape, dev);
    if (!out || dev.type == ACCEL_DEV_META || accel_numel(out) == 0) return out;
    accel_k_compare k = {.out = out, .a = a, .b = b, .op = cop, .dt = accel__promote(a->dtype, b->dtype)};
    return ACCEL_KERNEL(op, dev, compare, &k) == ACCEL_OK ? out : NULL;
}

/* The dtype a tensor of dtype dt and the number s are compared in: PyTorch's
 * rule for a Python scalar (a float tensor keeps its dtype; an integer or
 * bool tensor compares with an integral s as integers, else in f32). */
static accel_dtype scalar_compare_dtype(accel_dtype dt, double s) {
    if (accel_dtype_is_float(dt)) return dt;
    bool integral = s == nearbyint(s) && fabs(s) < 0x1p63;
    return integral ? ACCEL_I64 : ACCEL_F32;
}

static accel_tensor *compare_scalar(const char *op, accel__cmpop cop, accel_tensor *a, double s) {
    accel_device dev;
    if (!accel__op_begin(op, 1, &a, &dev)) return NULL;
    accel_tensor *out = accel__op_out(ACCEL_BOOL, a->ndim, a->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META || accel_numel(out) == 0) return out;
    accel_k_compare k = {.out = out, .a = a, .op = cop, .dt = scalar_compare_dtype(a->dtype, s), .scalar = s};
    return ACCEL_KERNEL(op, dev, compare, &k) == ACCEL_OK ? out : NULL;
}

accel_tensor *accel_eq(accel_tensor *a, accel_tensor *b) { return compare("accel_eq", ACCEL_C_EQ, a, b); }
accel_tensor *accel_ne(accel_tensor *a, accel_tensor *b) { return compare("accel_ne", ACCEL_C_NE, a, b); }
accel_tensor *accel_lt(accel_tensor *a, accel_tensor *b) { return compare("accel_lt", ACCEL_C_LT, a, b); }
accel_tensor *accel_le(accel_tensor *a, accel_tensor *b) { return compare("accel_le", ACCEL_C_LE, a, b); }
accel_tensor *accel_gt(accel_tensor *a, accel_tensor *b) { return compare("accel_gt", ACCEL_C_GT, a, b); }
accel_tensor *accel_ge(accel_tensor *a, accel_tensor *b) { return compare("accel_ge", ACCEL_C_GE, a, b); }

accel_tensor *accel_eq_scalar(accel_tensor *a, double s) {
    return compare_scalar("accel_eq_scalar", ACCEL_C_EQ, a, s);
}
accel_tensor *accel_ne_scalar(accel_tensor *a, double s) {
    return compare_scalar("accel_ne_scalar", ACCEL_C_NE, a, s);
}
accel_tensor *accel_lt_scalar(accel_tensor *a, double s) {
    return compare_scalar("accel_lt_scalar", ACCEL_C_LT, a, s);
}
accel_tensor *accel_le_scalar(accel_tensor *a, double s) {
    return compare_scalar("accel_le_scalar", ACCEL_C_LE, a, s);
}
accel_tensor *accel_gt_scalar(accel_tensor *a, double s) {
    return compare_scalar("accel_gt_scalar", ACCEL_C_GT, a, s);
}
accel_tensor *accel_ge_scalar(accel_tensor *a, double s) {
    return compare_scalar("accel_ge_scalar", ACCEL_C_GE, a, s);
}

/* ---------------------------------------------------------------- where */

/* out = cond ? a : b into a new tensor of dtype dt and the given shape. */
static accel_tensor *where_into(const char *op, accel_dtype dt, int ndim, const int64_t *shape, accel_device dev,
                                accel_tensor *cond, accel_tensor *a, accel_tensor *b) {
    accel_tensor *out = accel__op_out(dt, ndim, shape, dev);
    if (!out || dev.type == ACCEL_DEV_META || accel_numel(out) == 0) return out;
    accel_k_where k = {.out = out, .cond = cond, .a = a, .b = b};
    return ACCEL_KERNEL(op, dev, where, &k) == ACCEL_OK ? out : NULL;
}

/* d/da = g where cond, 0 elsewhere (d/db the other way round), each summed
 * back to its operand's broadcast shape. */
static accel_status where_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *cond = n->saved[0];
    accel_tensor *zero = accel_empty_on(g->dtype, 0, NULL, g->device);
    if (!zero || accel_fill_(zero, 0.0) != ACCEL_OK) return accel_last_status();
    for (int i = 0; i < 2; i++) {
        accel_tensor *x = n->inputs[i];
        if (!x->requires_grad) continue;
        accel_tensor *masked = where_into("where backward", g->dtype, g->ndim, g->shape, g->device, cond,
                                          i == 0 ? g : zero, i == 0 ? zero : g);
        accel_tensor *gx = masked ? accel_sum_to_shape(masked, x->ndim, x->shape) : NULL;
        if (!gx || accel_grad_accumulate(x, gx) != ACCEL_OK) return accel_last_status();
    }
    return ACCEL_OK;
}

/* The broadcast shape of cond, a and b (error names the op and all three). */
static bool broadcast3(const char *op, const accel_tensor *c, const accel_tensor *a, const accel_tensor *b, int *ndim,
                       int64_t *shape) {
    const accel_tensor *t[3] = {c, a, b};
    int nd = 0;
    for (int k = 0; k < 3; k++) nd = t[k]->ndim > nd ? t[k]->ndim : nd;
    for (int i = 0; i < nd; i++) {
        int64_t s = 1;
        for (int k = 0; k < 3; k++) {
            int ti = t[k]->ndim - nd + i;
            int64_t sk = ti >= 0 ? t[k]->shape[ti] : 1;
            if (sk == 1 || sk == s) continue;
            if (s != 1) {
                char x[96], y[96], z[96];
                accel_set_error(ACCEL_ERR_SHAPE, "%s: shapes %s (cond), %s and %s cannot be broadcast together", op,
                                accel_shape_str(c, x, sizeof x), accel_shape_str(a, y, sizeof y),
                                accel_shape_str(b, z, sizeof z));
                return false;
            }
            s = sk;
        }
        shape[i] = s;
    }
    *ndim = nd;
    return true;
}

accel_tensor *accel_where(accel_tensor *cond, accel_tensor *a, accel_tensor *b) {
    accel_tensor *in[3] = {cond, a, b};
    accel_device dev;
    if (!accel__op_begin("accel_where", 3, in, &dev)) return NULL;
    if (cond->dtype != ACCEL_BOOL) {
        accel_set_error(ACCEL_ERR_DTYPE, "accel_where: cond must be bool, got %s", accel_dtype_name(cond->dtype));
        return NULL;
    }
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    if (!broadcast3("accel_where", cond, a, b, &ndim, shape)) return NULL;
    accel_dtype dt = accel__promote(a->dtype, b->dtype);
    accel_tensor *out = where_into("accel_where", dt, ndim, shape, dev, cond, a, b);
    if (out && dev.type != ACCEL_DEV_META && accel_dtype_is_float(dt)) {
        accel_node *n = accel_tape_record("where", where_backward, out, 2, in + 1);
        if (n) n->saved[0] = cond;
    }
    return out;
}
