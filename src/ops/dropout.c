/* Inverted dropout with a keep-mask from a counter-based generator. */
#include "ops_util.h"

/* dx = g * mask * scale (the mask is saved as u8). */
static accel_status dropout_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    accel_tensor *fg = accel__dense_f32(g), *gx = accel_empty_on(ACCEL_F32, x->ndim, x->shape, x->device);
    if (!fg || !gx) return accel_last_status();
    accel_k_mask_scale k = {.out = gx, .x = fg, .mask = n->saved[0], .scale = (float)n->farg[0]};
    accel_status st = ACCEL_KERNEL("dropout backward", x->device, mask_scale, &k);
    return st == ACCEL_OK ? accel_grad_accumulate(x, gx) : st;
}

accel_tensor *accel_dropout(accel_tensor *x, double p, bool training, accel_rng *rng) {
    const char *op = "accel_dropout";
    accel_device dev;
    if (!accel__op_begin(op, 1, &x, &dev) || !accel__op_check_float(op, x, "input")) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: probability has to be between 0 and 1, got %g", op, p);
        return NULL;
    }
    if (!training || p == 0.0) return accel__alias_op("dropout", x);
    accel_tensor *out = accel__op_out(x->dtype, x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *mask = accel_empty_on(ACCEL_U8, x->ndim, x->shape, dev);
    if (!mask) return NULL;
    if (accel_rng_bernoulli_(rng ? rng : accel_default_rng(), mask, 1.0 - p) != ACCEL_OK) return NULL;
    /* p == 1 drops everything (scale 0 instead of inf, as PyTorch). */
    float scale = p < 1.0 ? (float)(1.0 / (1.0 - p)) : 0.0f;
    accel_tensor *fx = accel__dense_f32(x);
    accel_tensor *fo = x->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, x->shape, dev);
    if (!fx || !fo) return NULL;
    accel_k_mask_scale k = {.out = fo, .x = fx, .mask = mask, .scale = scale};
    if (ACCEL_KERNEL(op, dev, mask_scale, &k) != ACCEL_OK) return NULL;
    if (fo != out && accel_copy_(out, fo) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("dropout", dropout_backward, out, 1, &x);
    if (n) {
        n->saved[0] = mask;
        n->farg[0] = scale;
    }
    return out;
}
