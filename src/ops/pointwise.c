/* Pointwise ops: broadcasting arithmetic, scalar ops, activations, dtype casts. */
#include "ops_util.h"

/* ---------------------------------------------------------------- binary */

/* The first input that can take g itself as its first gradient does (a
 * residual stream's, beside its branch): the output's gradient, read by no
 * later node, is then dropped; the other input holds g too where it may
 * (accel__grad_share: read-only until one of them is read), else adds it. */
static accel_status add_backward(accel_node *n, accel_tensor *g) {
    for (int i = 0; i < 2; i++) {
        accel_tensor *x = n->inputs[i];
        if (!x->requires_grad) continue;
        accel_tensor *gx = accel_sum_to_shape(g, x->ndim, x->shape);
        if (i == 1 && n->iarg[0] == ACCEL_B_SUB) gx = accel_neg(gx);
        if (!gx) return accel_last_status();
        /* g itself while the output still holds it (no input took it yet) */
        bool whole = gx == n->out->grad, taken = i == 1 && gx == n->inputs[0]->grad;
        accel_status st = whole ? accel__grad_move_out(n, x, gx) : taken ? accel__grad_share(x, gx) : accel_grad_accumulate(x, gx);
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
    if (accel_numel(out) > 0) {
        accel_k_binary k = {.out = out, .a = a, .b = b, .op = bop};
        /* The CPU reads one bf16/f16 operand beside an f32 one itself (an
         * autocast step's residual adds: no f32 copy of the branch). */
        int lo = dev.type == ACCEL_DEV_CPU ? accel__binary_lowp_operand(out, a, b) : -1;
        if (!accel_reference_kernels() && accel_dtype_is_float(dt)) {
            /* f32 operands are read in place (any strides); others converted once. */
            k.a = a->dtype == ACCEL_F32 || lo == 0 ? a : accel__dense_f32(a);
            k.b = b->dtype == ACCEL_F32 || lo == 1 ? b : accel__dense_f32(b);
            k.out = dt == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, ndim, shape, dev);
            if (!k.a || !k.b || !k.out) return NULL;
        }
        if (ACCEL_KERNEL(op, dev, binary, &k) != ACCEL_OK) return NULL;
        if (k.out != out && accel_copy_(out, k.out) != ACCEL_OK) return NULL;
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
    accel_tensor *dx = accel_empty_on(ACCEL_F32, x->ndim, x->shape, x->device);
    if (!dx) return accel_last_status();
    accel_k_unary_grad k = {.dx = dx, .g = g, .x = x, .y = y, .op = op, .p = p};
    if (!accel_reference_kernels()) {
        k.g = accel__dense_f32(g);
        k.x = accel__dense_f32(x);
        k.y = accel__dense_f32(y);
        if (!k.g || !k.x || !k.y) return accel_last_status();
    }
    accel_status st = ACCEL_KERNEL(n->op, x->device, unary_grad, &k);
    return st == ACCEL_OK ? accel__grad_move(x, dx) : st;
}

static accel_tensor *unary(const char *op, const char *name, accel__unop uop, double p,
                           accel_tensor *a) {
    accel_device dev;
    if (!accel__op_begin(op, 1, &a, &dev) || !accel__op_check_float(op, a, "input")) return NULL;
    accel_tensor *out = accel__op_out(a->dtype, a->ndim, a->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_k_unary k = {.out = out, .x = a, .op = uop, .p = p};
    if (!accel_reference_kernels() && accel_numel(out) > 0) {
        k.x = accel__dense_f32(a);
        k.out = a->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, a->ndim, a->shape, dev);
        if (!k.x || !k.out) return NULL;
    }
    if (accel_numel(out) > 0 && ACCEL_KERNEL(op, dev, unary, &k) != ACCEL_OK) return NULL;
    if (k.out != out && accel_copy_(out, k.out) != ACCEL_OK) return NULL;
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
    if (accel_copy_(out, a) != ACCEL_OK) return NULL;
    if (accel_dtype_is_float(dt) && accel_dtype_is_float(a->dtype))
        accel_tape_record("to_dtype", to_dtype_backward, out, 1, &a);
    return out;
}
