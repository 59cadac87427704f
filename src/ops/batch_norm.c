/* accel_batch_norm (torch.nn.functional.batch_norm) over x [N, C, ...]:
 * the batch_norm kernel sees it as [N, C, S], S the product of the dims
 * after C (1 for [N, C]). Computed in f32 as the other norms. */
#include "nn_internal.h"

typedef struct bn_saved {
    int64_t N, C, S;
    bool training;
} bn_saved;

static accel_status bn_backward(accel_node *node, accel_tensor *grad_out) {
    const bn_saved *s = node->ctx;
    accel_tensor *g = accel__f32_contig(grad_out);
    if (!g) return accel_last_status();
    accel__gbuf gx, gw, gb;
    if (!accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin_zeroed(&gw, node->inputs[1]) ||
        !accel__gbuf_begin_zeroed(&gb, node->inputs[2]))
        return accel_last_status();
    accel_k_batch_norm_backward k = {.dx = gx.dst, .dw = gw.dst, .db = gb.dst, .g = g, .x = node->saved[0],
                                     .w = node->saved[1], .mean = node->saved[2], .invstd = node->saved[3],
                                     .N = s->N, .C = s->C, .S = s->S, .dx_beta = gx.beta, .training = s->training};
    accel_status st = ACCEL_KERNEL("batch_norm backward", g->device, batch_norm_backward, &k);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    return st == ACCEL_OK ? accel__gbuf_end(&gb) : st;
}

/* A per-channel tensor: [C] of a float dtype (f32 contiguous when the
 * kernel writes it: the running stats). */
static bool channel_ok(const char *op, accel_tensor *x, accel_tensor *p, const char *what, bool written) {
    if (!p) return true;
    int64_t C = x->shape[1];
    if (!accel__op_check_float(op, p, what)) return false;
    if (p->ndim != 1 || p->shape[0] != C) {
        char why[96];
        snprintf(why, sizeof why, "do not fit (%s must be [%lld], one per channel)", what, (long long)C);
        accel__shape_error2(op, x, p, why);
        return false;
    }
    if (written && (p->dtype != ACCEL_F32 || !accel_is_contiguous(p))) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: %s must be a contiguous f32 tensor (it is updated in place), got %s",
                        op, what, accel_dtype_name(p->dtype));
        return false;
    }
    return true;
}

accel_tensor *accel_batch_norm(accel_tensor *x, accel_tensor *running_mean, accel_tensor *running_var,
                               accel_tensor *weight, accel_tensor *bias, bool training, double momentum,
                               double eps) {
    static const char *OP = "accel_batch_norm";
    accel_tensor *all[5] = {x, weight, bias, running_mean, running_var};
    accel_device dev;
    if (!accel__op_begin_opt(OP, 5, all, 30u, &dev) || !accel__op_check_float(OP, x, "x")) return NULL;
    if (x->ndim < 2) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x must be [N, C, ...] (2 dims or more), got %d dims", OP, x->ndim);
        return NULL;
    }
    if (!running_mean != !running_var) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: running_mean and running_var are given together or not at all", OP);
        return NULL;
    }
    if (!training && !running_mean) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: eval mode (training false) needs running_mean and running_var", OP);
        return NULL;
    }
    if (!channel_ok(OP, x, weight, "weight", false) || !channel_ok(OP, x, bias, "bias", false) ||
        !channel_ok(OP, x, running_mean, "running_mean", true) || !channel_ok(OP, x, running_var, "running_var", true))
        return NULL;
    if (!(eps >= 0) || !(momentum >= 0 && momentum <= 1)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: eps = %g must be >= 0 and momentum = %g in [0, 1]", OP, eps,
                        momentum);
        return NULL;
    }
    bn_saved s = {.N = x->shape[0], .C = x->shape[1], .S = accel__prod(x->shape, 2, x->ndim), .training = training};
    /* torch's rule: exactly one value is refused; an empty batch gives an
     * empty result and leaves the running statistics as they are */
    if (training && s.N * s.S == 1) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: expected more than 1 value per channel when training, got x [%lld, %lld, ...]",
                        OP, (long long)s.N, (long long)s.C);
        return NULL;
    }
    accel_dtype dt = x->dtype;
    if (weight) dt = accel__promote(dt, weight->dtype);
    if (bias) dt = accel__promote(dt, bias->dtype);
    accel_tensor *out = accel__op_out(accel_autocast_dtype() != ACCEL_F32 ? ACCEL_F32 : dt, x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *xf = accel__f32_contig(x), *wf = weight ? accel__f32_contig(weight) : NULL;
    accel_tensor *bf = bias ? accel__f32_contig(bias) : NULL;
    accel_tensor *y = out->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, x->shape, dev);
    accel_tensor *mean = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(s.C), dev), *invstd = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(s.C), dev);
    if (!xf || (weight && !wf) || (bias && !bf) || !y || !mean || !invstd) return NULL;
    accel_k_batch_norm k = {.y = y, .mean = mean, .invstd = invstd, .x = xf, .w = wf, .b = bf,
                            .running_mean = training && s.N * s.S == 0 ? NULL : running_mean,
                            .running_var = training && s.N * s.S == 0 ? NULL : running_var, .N = s.N, .C = s.C,
                            .S = s.S, .eps = (float)eps, .momentum = (float)momentum, .training = training};
    if (ACCEL_KERNEL(OP, dev, batch_norm, &k) != ACCEL_OK) return NULL;
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    accel_tensor *in[3] = {x, weight, bias};
    accel_node *n = accel_tape_record("batch_norm", bn_backward, out, 3, in);
    if (n) {
        bn_saved *sc = accel_arena_alloc(accel_step_arena(), sizeof *sc, 64);
        if (!sc) return NULL;
        *sc = s;
        n->ctx = sc;
        n->saved[0] = xf;
        n->saved[1] = wf;
        n->saved[2] = mean;
        n->saved[3] = invstd;
    }
    return out;
}
