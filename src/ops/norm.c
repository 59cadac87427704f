/* accel_rms_norm (transformers' LlamaRMSNorm) and accel_layer_norm (torch),
 * over the last dim, computed in f32. */
#include "backends/cpu/gemm.h"
#include "core/prepared.h"
#include "core/step_casts.h"
#include "nn_internal.h"
#include "norm.h"

/* Out dtype: f32 under autocast, else the promotion of the inputs. */
static accel_dtype norm_dtype(accel_tensor *x, accel_tensor *w, accel_tensor *b) {
    if (accel_autocast_dtype() != ACCEL_F32) return ACCEL_F32;
    accel_dtype dt = x->dtype;
    if (w) dt = accel__promote(dt, w->dtype);
    if (b) dt = accel__promote(dt, b->dtype);
    return dt;
}

static bool norm_check(const char *op, accel_tensor *x, accel_tensor *p, const char *what) {
    if (!p) return true;
    if (!accel__op_check_float(op, p, what)) return false;
    if (p->ndim != 1 || p->shape[0] != x->shape[x->ndim - 1]) {
        char why[64];
        snprintf(why, sizeof why, "do not fit (%s must be [%lld])", what,
                 (long long)x->shape[x->ndim - 1]);
        accel__shape_error2(op, x, p, why);
        return false;
    }
    return true;
}

/* What the backward of a norm needs besides its saved tensors. */
typedef struct norm_saved {
    int64_t R, D;
    float eps;
    accel_dtype x_dt;
    accel_dtype dt16; /* RMSNorm: dx's rounded copy's dtype (copy_dtype, IN_RESIDUAL), f32 for none */
} norm_saved;

/* ------------------------------------------------------------------ rms_norm */

static accel_status rms_backward(accel_node *node, accel_tensor *grad_out) {
    const norm_saved *sv = node->ctx;
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    accel__gbuf gx, gw;
    if (!accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin_zeroed(&gw, node->inputs[1]))
        return accel_last_status();
    /* x a residual stream (norm.h: IN_RESIDUAL): x's gradient is what the
     * sum's backward rounds for its branch; rounded here in the kernel's
     * pass where dx is x's gradient itself (not a scratch added in later)
     * and offered as its conversion (accel_grad_accumulate takes it). */
    accel_tensor *dx16 = sv->dt16 != ACCEL_F32 && gx.dst && !gx.tmp && gx.dst->dtype == ACCEL_F32 &&
                                 accel__prepared_enabled()
                             ? accel_empty_on(sv->dt16, gx.dst->ndim, gx.dst->shape, gx.dst->device)
                             : NULL;
    accel_k_rms_norm_backward k = {.dx = gx.dst, .dw = gw.dst, .g = gt, .x = node->saved[0], .w = node->saved[1],
                                   .rstd = node->saved[2], .dx16 = dx16, .R = sv->R, .D = sv->D, .x_dt = sv->x_dt,
                                   .dx_beta = gx.beta};
    accel_status st = ACCEL_KERNEL("rms_norm backward", gt->device, rms_norm_backward, &k);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    if (st == ACCEL_OK && dx16) accel__step_cast_offer(gx.dst, ACCEL__FORM_CAST, sv->dt16, dx16);
    return st;
}

/* The dtype of the rounded copies an RMSNorm of these roles (norm.h)
 * makes, its output y (f32 under autocast ac) on dev: ac where the step's
 * conversions are remembered on the CPU, else f32 (none made: no other
 * backend makes them, and the reference kernels convert as before); for the
 * output's copy also only where the GEMMs multiply ac natively (a widened
 * operand is another form). */
static accel_dtype copy_dtype(accel_device dev, accel_dtype y_dt, unsigned roles, unsigned role) {
    accel_dtype ac = accel_autocast_dtype();
    bool ok = (roles & role) && ac != ACCEL_F32 && y_dt == ACCEL_F32 && dev.type == ACCEL_DEV_CPU &&
              accel__prepared_enabled() && !accel_reference_kernels() &&
              (role != ACCEL__NORM_OUT_TO_GEMMS || accel__gemm_native(ac));
    return ok ? ac : ACCEL_F32;
}

static accel_tensor *rms_norm(const char *OP, accel_tensor *x, accel_tensor *w, double eps, unsigned roles) {
    accel_tensor *in[2] = {x, w};
    accel_device dev;
    if (!accel__op_begin_opt(OP, 2, in, 2u, &dev)) return NULL;
    if (!accel__op_check_float(OP, x, "x")) return NULL;
    if (x->ndim == 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x must have at least 1 dim", OP);
        return NULL;
    }
    if (!norm_check(OP, x, w, "weight")) return NULL;
    accel_tensor *out = accel__op_out(norm_dtype(x, w, NULL), x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t D = x->shape[x->ndim - 1], R = D ? accel_numel(x) / D : 0;
    accel_tensor *xf = accel__f32_contig(x), *wf = w ? accel__f32_contig(w) : NULL;
    accel_tensor *y = out->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, x->shape, dev);
    accel_tensor *rstd = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(R), dev);
    accel_dtype dt16 = copy_dtype(dev, out->dtype, roles, ACCEL__NORM_OUT_TO_GEMMS);
    accel_tensor *y16 = dt16 != ACCEL_F32 ? accel_empty_on(dt16, x->ndim, x->shape, dev) : NULL;
    norm_saved *sv = accel_arena_alloc(accel_step_arena(), sizeof *sv, 64);
    if (!xf || (w && !wf) || !y || !rstd || (dt16 != ACCEL_F32 && !y16) || !sv) return NULL;
    *sv = (norm_saved){R, D, (float)eps, x->dtype, copy_dtype(dev, out->dtype, roles, ACCEL__NORM_IN_RESIDUAL)};
    accel_k_rms_norm k = {.y = y, .rstd = rstd, .x = xf, .w = wf, .y16 = y16, .R = R, .D = D, .eps = (float)eps,
                          .x_dt = x->dtype};
    if (ACCEL_KERNEL(OP, dev, rms_norm, &k) != ACCEL_OK) return NULL;
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    if (y16) accel__step_cast_offer(out, ACCEL__FORM_CAST, dt16, y16);
    accel_node *n = accel_tape_record("rms_norm", rms_backward, out, 2, in);
    if (n) {
        n->saved[0] = xf;
        n->saved[1] = wf;
        n->saved[2] = rstd;
        n->ctx = sv;
    }
    return out;
}

accel_tensor *accel_rms_norm(accel_tensor *x, accel_tensor *w, double eps) {
    return rms_norm("accel_rms_norm", x, w, eps, 0);
}

accel_tensor *accel__rms_norm_with_roles(accel_tensor *x, accel_tensor *w, double eps, unsigned roles) {
    return rms_norm("accel_rms_norm", x, w, eps, roles);
}

/* ------------------------------------------------------------------ layer_norm */

static accel_status ln_backward(accel_node *node, accel_tensor *grad_out) {
    const norm_saved *sv = node->ctx;
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    accel__gbuf gx, gw, gb;
    if (!accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin_zeroed(&gw, node->inputs[1]) ||
        !accel__gbuf_begin_zeroed(&gb, node->inputs[2]))
        return accel_last_status();
    accel_k_layer_norm_backward k = {.dx = gx.dst, .dw = gw.dst, .db = gb.dst, .g = gt, .x = node->saved[0],
                                     .w = node->saved[1], .mean = node->saved[2], .rstd = node->saved[3],
                                     .R = sv->R, .D = sv->D, .dx_beta = gx.beta};
    accel_status st = ACCEL_KERNEL("layer_norm backward", gt->device, layer_norm_backward, &k);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    return st == ACCEL_OK ? accel__gbuf_end(&gb) : st;
}

accel_tensor *accel_layer_norm(accel_tensor *x, accel_tensor *w, accel_tensor *b, double eps) {
    static const char *OP = "accel_layer_norm";
    accel_tensor *in[3] = {x, w, b};
    accel_device dev;
    if (!accel__op_begin_opt(OP, 3, in, 6u, &dev)) return NULL;
    if (!accel__op_check_float(OP, x, "x")) return NULL;
    if (x->ndim == 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x must have at least 1 dim", OP);
        return NULL;
    }
    if (!norm_check(OP, x, w, "weight") || !norm_check(OP, x, b, "bias")) return NULL;
    accel_tensor *out = accel__op_out(norm_dtype(x, w, b), x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t D = x->shape[x->ndim - 1], R = D ? accel_numel(x) / D : 0;
    accel_tensor *xf = accel__f32_contig(x);
    accel_tensor *wf = w ? accel__f32_contig(w) : NULL, *bf = b ? accel__f32_contig(b) : NULL;
    accel_tensor *y = out->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, x->shape, dev);
    accel_tensor *mean = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(R), dev), *rstd = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(R), dev);
    norm_saved *sv = accel_arena_alloc(accel_step_arena(), sizeof *sv, 64);
    if (!xf || (w && !wf) || (b && !bf) || !y || !mean || !rstd || !sv) return NULL;
    *sv = (norm_saved){R, D, (float)eps, x->dtype, ACCEL_F32};
    accel_k_layer_norm k = {.y = y, .mean = mean, .rstd = rstd, .x = xf, .w = wf, .b = bf, .R = R, .D = D,
                            .eps = (float)eps};
    if (ACCEL_KERNEL(OP, dev, layer_norm, &k) != ACCEL_OK) return NULL;
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("layer_norm", ln_backward, out, 3, in);
    if (n) {
        n->saved[0] = xf;
        n->saved[1] = wf;
        n->saved[2] = mean;
        n->saved[3] = rstd;
        n->ctx = sv;
    }
    return out;
}
