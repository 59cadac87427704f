/* Pointwise ops: broadcasting arithmetic, scalar ops, activations, dtype casts. */
#include "ops_util.h"

/* ---------------------------------------------------------------- binary */

static accel_status add_backward(accel_node *n, accel_tensor *g) {
    for (int i = 0; i < 2; i++) {
        accel_tensor *x = n->inputs[i];
        if (!x->requires_grad) continue;
        accel_tensor *gx = accel_sum_to_shape(g, x->ndim, x->shape);
        if (i == 1 && n->iarg[0] == ACCEL_B_SUB) gx = accel_neg(gx);
        if (!gx) return accel_last_status();
        accel_status st = accel_grad_accumulate(x, gx);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

static accel_status mul_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *a = n->inputs[0], *b = n->inputs[1];
    if (a->requires_grad) {
        accel_tensor *ga = accel_sum_to_shape(accel_mul(g, b), a->ndim, a->shape);
        if (!ga || accel_grad_accumulate(a, ga) != ACCEL_OK) return accel_last_status();
    }
    if (b->requires_grad) {
        accel_tensor *gb = accel_sum_to_shape(accel_mul(g, a), b->ndim, b->shape);
        if (!gb || accel_grad_accumulate(b, gb) != ACCEL_OK) return accel_last_status();
    }
    return ACCEL_OK;
}

/* out = a / b: da = g / b, db = -g * out / b. */
static accel_status div_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *a = n->inputs[0], *b = n->inputs[1];
    accel_tensor *gb_full = NULL;
    if (b->requires_grad) gb_full = accel_neg(accel_div(accel_mul(g, n->out), b));
    if (a->requires_grad) {
        accel_tensor *ga = accel_sum_to_shape(accel_div(g, b), a->ndim, a->shape);
        if (!ga || accel_grad_accumulate(a, ga) != ACCEL_OK) return accel_last_status();
    }
    if (b->requires_grad) {
        accel_tensor *gb = accel_sum_to_shape(gb_full, b->ndim, b->shape);
        if (!gb || accel_grad_accumulate(b, gb) != ACCEL_OK) return accel_last_status();
    }
    return ACCEL_OK;
}

static accel_tensor *binary(const char *op, const char *name, accel__binop bop, accel_backward_fn bw,
                            accel_tensor *a, accel_tensor *b) {
    accel_tensor *in[2] = {a, b};
    accel_device dev;
    if (!accel__op_begin(op, 2, in, &dev)) return NULL;
    accel_dtype dt = accel__promote(a->dtype, b->dtype);
    if (!accel_dtype_is_float(dt) && bop == ACCEL_B_DIV) dt = ACCEL_F32; /* true division */
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    if (!accel__broadcast_shape(op, a, b, &ndim, shape)) return NULL;
    accel_tensor *out = accel__op_out(dt, ndim, shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t numel = accel_numel(out);
    if (numel > 0) {
        if (accel_reference_kernels() || !accel_dtype_is_float(dt)) {
            accel__cpu_binary_ref(bop, out, a, b);
        } else {
            /* f32 operands are read in place (any strides); others converted once. */
            accel_tensor *fa = a->dtype == ACCEL_F32 ? a : accel__dense_f32(a);
            accel_tensor *fb = b->dtype == ACCEL_F32 ? b : accel__dense_f32(b);
            accel_tensor *fo = dt == ACCEL_F32 ? out : accel_empty(ACCEL_F32, ndim, shape);
            if (!fa || !fb || !fo) return NULL;
            int64_t sa[ACCEL_MAX_DIMS], sb[ACCEL_MAX_DIMS];
            accel__broadcast_strides(fa, ndim, shape, sa);
            accel__broadcast_strides(fb, ndim, shape, sb);
            const int64_t *st[2] = {sa, sb};
            accel__layout l;
            accel__layout_init(&l, ndim, shape, 2, st);
            accel__cpu_binary_f32(bop, &l, fa->data, fb->data, fo->data);
            if (fo != out) accel_convert(out->data, dt, fo->data, ACCEL_F32, (size_t)numel);
        }
    }
    if (accel_dtype_is_float(dt)) {
        accel_node *n = accel_tape_record(name, bw, out, 2, in);
        if (n) n->iarg[0] = bop;
    }
    return out;
}

accel_tensor *accel_add(accel_tensor *a, accel_tensor *b) {
    return binary("accel_add", "add", ACCEL_B_ADD, add_backward, a, b);
}
accel_tensor *accel_sub(accel_tensor *a, accel_tensor *b) {
    return binary("accel_sub", "sub", ACCEL_B_SUB, add_backward, a, b);
}
accel_tensor *accel_mul(accel_tensor *a, accel_tensor *b) {
    return binary("accel_mul", "mul", ACCEL_B_MUL, mul_backward, a, b);
}
accel_tensor *accel_div(accel_tensor *a, accel_tensor *b) {
    return binary("accel_div", "div", ACCEL_B_DIV, div_backward, a, b);
}

/* ---------------------------------------------------------------- unary */

static accel_status unary_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0], *y = n->out;
    accel__unop op = (accel__unop)n->iarg[0];
    double p = n->farg[0];
    accel_tensor *dx = accel_empty(ACCEL_F32, x->ndim, x->shape);
    if (!dx) return accel_last_status();
    if (accel_reference_kernels()) {
        accel__cpu_unary_grad_ref(op, p, dx, g, x, y);
    } else {
        accel_tensor *fg = accel__dense_f32(g), *fx = accel__dense_f32(x), *fy = accel__dense_f32(y);
        if (!fg || !fx || !fy) return accel_last_status();
        accel__cpu_unary_grad_f32(op, p, fg->data, fx->data, fy->data, dx->data, accel_numel(x));
    }
    return accel_grad_accumulate(x, dx);
}

static accel_tensor *unary(const char *op, const char *name, accel__unop uop, double p,
                           accel_tensor *a) {
    accel_device dev;
    if (!accel__op_begin(op, 1, &a, &dev) || !accel__op_check_float(op, a, "input")) return NULL;
    accel_tensor *out = accel__op_out(a->dtype, a->ndim, a->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t numel = accel_numel(out);
    if (accel_reference_kernels()) {
        accel__cpu_unary_ref(uop, p, out, a);
    } else if (numel > 0) {
        accel_tensor *x = accel__dense_f32(a);
        accel_tensor *y = a->dtype == ACCEL_F32 ? out : accel_empty(ACCEL_F32, a->ndim, a->shape);
        if (!x || !y) return NULL;
        accel__cpu_unary_f32(uop, p, x->data, y->data, numel);
        if (y != out) accel_convert(out->data, out->dtype, y->data, ACCEL_F32, (size_t)numel);
    }
    accel_node *n = accel_tape_record(name, unary_backward, out, 1, &a);
    if (n) {
        n->iarg[0] = uop;
        n->farg[0] = p;
    }
    return out;
}

accel_tensor *accel_add_scalar(accel_tensor *a, double s) {
    return unary("accel_add_scalar", "add_scalar", ACCEL_U_ADD_SCALAR, s, a);
}
accel_tensor *accel_mul_scalar(accel_tensor *a, double s) {
    return unary("accel_mul_scalar", "mul_scalar", ACCEL_U_MUL_SCALAR, s, a);
}
accel_tensor *accel_pow_scalar(accel_tensor *a, double p) {
    return unary("accel_pow_scalar", "pow_scalar", ACCEL_U_POW, p, a);
}
accel_tensor *accel_neg(accel_tensor *a) { return unary("accel_neg", "neg", ACCEL_U_NEG, 0, a); }
accel_tensor *accel_exp(accel_tensor *a) { return unary("accel_exp", "exp", ACCEL_U_EXP, 0, a); }
accel_tensor *accel_log(accel_tensor *a) { return unary("accel_log", "log", ACCEL_U_LOG, 0, a); }
accel_tensor *accel_sqrt(accel_tensor *a) { return unary("accel_sqrt", "sqrt", ACCEL_U_SQRT, 0, a); }
accel_tensor *accel_rsqrt(accel_tensor *a) {
    return unary("accel_rsqrt", "rsqrt", ACCEL_U_RSQRT, 0, a);
}
accel_tensor *accel_tanh(accel_tensor *a) { return unary("accel_tanh", "tanh", ACCEL_U_TANH, 0, a); }
accel_tensor *accel_sigmoid(accel_tensor *a) {
    return unary("accel_sigmoid", "sigmoid", ACCEL_U_SIGMOID, 0, a);
}
accel_tensor *accel_relu(accel_tensor *a) { return unary("accel_relu", "relu", ACCEL_U_RELU, 0, a); }
accel_tensor *accel_silu(accel_tensor *a) { return unary("accel_silu", "silu", ACCEL_U_SILU, 0, a); }
accel_tensor *accel_gelu(accel_tensor *a, bool tanh_approx) {
    return tanh_approx ? unary("accel_gelu", "gelu_tanh", ACCEL_U_GELU_TANH, 0, a)
                       : unary("accel_gelu", "gelu", ACCEL_U_GELU, 0, a);
}

/* ---------------------------------------------------------------- dtype */

/* The gradient is converted back to the input's dtype by accel_grad_accumulate. */
static accel_status to_dtype_backward(accel_node *n, accel_tensor *g) {
    return accel_grad_accumulate(n->inputs[0], g);
}

accel_tensor *accel_to_dtype(accel_tensor *a, accel_dtype dt) {
    accel_device dev;
    if (!accel__op_begin("accel_to_dtype", 1, &a, &dev)) return NULL;
    if ((unsigned)dt >= ACCEL_DTYPE_COUNT) {
        accel_set_error(ACCEL_ERR_DTYPE, "accel_to_dtype: invalid dtype %d", (int)dt);
        return NULL;
    }
    if (a->dtype == dt) return accel__alias_op("to_dtype", a);
    accel_tensor *out = accel__op_out(dt, a->ndim, a->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    if (accel_reference_kernels()) {
        int64_t n = accel_numel(a);
        for (int64_t i = 0; i < n; i++)
            accel__store_elem(out->data, dt, (size_t)i,
                              accel__load_elem(accel__elem_ptr(a, i), a->dtype, 0));
    } else {
        accel_tensor *d = accel__dense(a);
        if (!d) return NULL;
        accel_convert(out->data, dt, d->data, a->dtype, (size_t)accel_numel(a));
    }
    if (accel_dtype_is_float(dt) && accel_dtype_is_float(a->dtype))
        accel_tape_record("to_dtype", to_dtype_backward, out, 1, &a);
    return out;
}
