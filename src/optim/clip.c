/* Gradient norm clipping (torch.nn.utils.clip_grad_norm_). */
#include <float.h>
#include <math.h>

#include "optim_internal.h"

/* *part = sum |g|^p (or max |g|) of contiguous f32 g on its device's
 * norm_partial kernel: into a host double on the cpu, else into a step
 * tensor of g's device read back. False + error when the kernel fails (a
 * NaN gradient is no failure: *part is NaN). */
static bool norm_partial(accel_tensor *g, double norm_type, double *part) {
    accel_tensor out;
    accel_tensor *o = &out;
    if (g->device.type == ACCEL_DEV_CPU) accel__tensor_header(&out, part, ACCEL_F64, 0, NULL, ACCEL_CPU_DEVICE);
    else o = accel_empty_on(ACCEL_F64, 0, NULL, g->device);
    if (!o) return false;
    accel_k_norm_partial k = {.out = o, .g = g, .norm_type = norm_type};
    if (ACCEL_KERNEL("grad norm", g->device, norm_partial, &k) != ACCEL_OK) return false;
    if (o != &out) *part = accel_item(o);
    return true;
}

double accel_grad_norm_partial(const accel_tensor *g, double norm_type) {
    const char *fn = "accel_grad_norm_partial";
    if (!accel_tensor_check(g, fn, "g")) return NAN;
    if (g->dtype != ACCEL_F32 || !accel_is_contiguous(g) || g->device.type == ACCEL_DEV_META) {
        char d[32];
        accel_set_error(ACCEL_ERR_DTYPE, "%s: g is %s%s on %s; it must be a contiguous float32 tensor with data", fn,
                        accel_dtype_name(g->dtype), accel_is_contiguous(g) ? "" : " non-contiguous",
                        accel_device_str(g->device, d, sizeof d));
        return NAN;
    }
    int64_t n = accel_numel(g);
    accel_tensor flat; /* a 1-d view of g's memory: the kernel's operand */
    accel__tensor_header(&flat, accel__device_ptr(g), ACCEL_F32, 1, &n, g->device);
    double part;
    return norm_partial(&flat, norm_type, &part) ? part : NAN;
}

double accel_grad_norm_combine(double combined, double part, double norm_type) {
    if (!isinf(norm_type)) return combined + part;
    return isnan(combined) || isnan(part) ? NAN : fmax(combined, part);
}

double accel_grad_norm_finish(double combined, double norm_type) {
    /* torch sums the terms in f32: beyond FLT_MAX its total norm is inf
     * (clipping then zeroes every gradient); the f64 sum gave a finite one */
    if (!isinf(norm_type) && combined > FLT_MAX) return INFINITY;
    if (isinf(norm_type) || norm_type == 1.0) return combined;
    if (norm_type == 2.0) return sqrt(combined);
    return pow(combined, 1.0 / norm_type);
}

double accel_clip_coef(double total_norm, double max_norm) {
    double c = max_norm / (total_norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

bool accel__check_clip_args(const char *fn, double max_norm, double norm_type) {
    if (!(norm_type > 0)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: norm_type must be > 0 or INFINITY (got %g)", fn,
                        norm_type);
        return false;
    }
    /* A negative max_norm makes the clip coefficient negative (every gradient
     * flipped), a NaN one skips clipping: neither is a norm. */
    if (!(max_norm >= 0)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: max_norm must be >= 0 (got %g)", fn, max_norm);
        return false;
    }
    return true;
}

/* The total norm as torch.nn.utils.clip_grad_norm_ computes it on a CPU:
 * the f32 norm of the f32 norms of the gradients, one at a time. Where
 * |g|^p leaves f32's range that differs from the f64 norm of every element
 * (torch: inf past FLT_MAX, 0 below its smallest subnormal, and no power of a
 * single element): one f64 sum gave finite totals where torch's is inf, and
 * a clip torch does not do. norms_add adds gradient g, norms_total gives the
 * total; a NaN stays NaN (fmax dropped it, and a NaN gradient gave a finite
 * inf-norm that clipped the others). */
typedef struct norms {
    double acc;   /* sum of the norms' f32 p-th powers, or their max for INFINITY */
    double first; /* the first gradient's norm */
    int n;        /* gradients added */
} norms;

/* false when the kernel failed (its error set) */
static bool norms_add(norms *s, accel_tensor *g, double p) {
    bool one = accel_numel(g) == 1; /* torch's norm of one element is its |g| */
    double part, norm, term;
    if (!norm_partial(g, one ? INFINITY : p, &part)) return false;
    norm = one ? part : (float)accel_grad_norm_finish(part, p);
    if (isinf(p) || p == 1.0) term = norm;
    else if (p == 2.0) term = (float)(norm * norm);
    else term = (float)pow(norm, p);
    s->acc = accel_grad_norm_combine(s->acc, term, p);
    if (s->n++ == 0) s->first = norm;
    return true;
}

static double norms_total(const norms *s, double p) { return s->n == 1 ? s->first : accel_grad_norm_finish(s->acc, p); }

/* The total norm of acc, or NAN + error when it is NaN: a gradient holds a
 * NaN, and no coefficient clips that (torch's error_if_nonfinite refuses it;
 * without, torch multiplies every gradient by NaN). */
double accel__nan_norm_error(const char *fn) {
    accel_set_error(ACCEL_ERR_INVALID_ARG,
                    "%s: the total gradient norm is nan (a gradient holds a NaN); the gradients are left as they were",
                    fn);
    return NAN;
}

static double checked_total(const char *fn, double total) { return isnan(total) ? accel__nan_norm_error(fn) : total; }

accel_status accel__grad_scale(accel_tensor *g, float c) {
    accel_k_unary k = {.out = g, .x = g, .op = ACCEL_U_MUL_SCALAR, .p = c};
    return ACCEL_KERNEL("clip_grad_norm", g->device, unary, &k);
}

double accel_clip_grad_norm(int n, accel_tensor *const *params, double max_norm, double norm_type) {
    const char *fn = "accel_clip_grad_norm";
    if (!accel__check_clip_args(fn, max_norm, norm_type)) return NAN;
    /* a negative n (a failed accel_module_parameters' -1) returned a norm of 0, clipping nothing */
    if (n < 0 || (n > 0 && !params)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: params is NULL or n < 0 (got %d)", fn, n);
        return NAN;
    }
    for (int i = 0; i < n; i++) {
        if (!accel_tensor_check(params[i], fn, "parameter")) return NAN;
        const accel_tensor *g = params[i]->grad;
        if (g && (g->dtype != ACCEL_F32 || !accel_is_contiguous(g) || g->device.type == ACCEL_DEV_META)) {
            accel_set_error(ACCEL_ERR_DTYPE, "%s: the grad of parameter %d is not a contiguous f32 tensor with data",
                            fn, i);
            return NAN;
        }
    }
    norms s = {0};
    for (int i = 0; i < n; i++)
        if (params[i]->grad && !norms_add(&s, params[i]->grad, norm_type)) return NAN;
    double total = checked_total(fn, norms_total(&s, norm_type));
    if (isnan(total)) return NAN;
    float c = (float)accel_clip_coef(total, max_norm);
    for (int i = 0; i < n; i++)
        if (params[i]->grad && accel__grad_scale(params[i]->grad, c) != ACCEL_OK) return NAN;
    return total;
}

double accel_optimizer_clip_grad_norm(accel_optimizer *opt, double max_norm, double norm_type) {
    const char *fn = "accel_optimizer_clip_grad_norm";
    if (!opt) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
        return NAN;
    }
    if (!accel__check_clip_args(fn, max_norm, norm_type) || !accel__optimizer_usable(opt, fn)) return NAN;
    norms s = {0};
    for (int i = 0; i < opt->n_segs; i++) {
        accel_tensor *p, *g;
        accel__seg_tensors(&opt->segs[i], &p, &g);
        if (g && !norms_add(&s, g, norm_type)) return NAN;
    }
    double total = checked_total(fn, norms_total(&s, norm_type));
    if (isnan(total)) return NAN;
    float c = (float)accel_clip_coef(total, max_norm);
    for (int i = 0; i < opt->n_segs; i++) {
        accel_tensor *p, *g;
        accel__seg_tensors(&opt->segs[i], &p, &g);
        if (g && accel__grad_scale(g, c) != ACCEL_OK) return NAN;
    }
    return total;
}
