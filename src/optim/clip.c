/* Gradient norm clipping (torch.nn.utils.clip_grad_norm_). */
#include <math.h>

#include "optim_internal.h"

double accel_grad_norm_partial(const float *g, int64_t n, double norm_type) {
    double acc = 0.0;
    if (isinf(norm_type)) {
        for (int64_t i = 0; i < n; i++) acc = fmax(acc, fabs((double)g[i]));
        return acc;
    }
    if (norm_type == 2.0) {
#pragma omp parallel for if (n > 65536) reduction(+ : acc) schedule(static)
        for (int64_t i = 0; i < n; i++) acc += (double)g[i] * g[i];
        return acc;
    }
    if (norm_type == 1.0) {
        for (int64_t i = 0; i < n; i++) acc += fabs((double)g[i]);
        return acc;
    }
    for (int64_t i = 0; i < n; i++) acc += pow(fabs((double)g[i]), norm_type);
    return acc;
}

double accel_grad_norm_finish(double combined, double norm_type) {
    if (isinf(norm_type) || norm_type == 1.0) return combined;
    if (norm_type == 2.0) return sqrt(combined);
    return pow(combined, 1.0 / norm_type);
}

double accel_clip_coef(double total_norm, double max_norm) {
    double c = max_norm / (total_norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

static bool check_norm_type(const char *fn, double norm_type) {
    if (!(norm_type > 0)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: norm_type must be > 0 or INFINITY (got %g)", fn,
                        norm_type);
        return false;
    }
    return true;
}

static double combine(double acc, double part, double norm_type) {
    return isinf(norm_type) ? fmax(acc, part) : acc + part;
}

static void scale(float *g, int64_t n, float c) {
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) g[i] *= c;
}

double accel_clip_grad_norm(int n, accel_tensor *const *params, double max_norm, double norm_type) {
    const char *fn = "accel_clip_grad_norm";
    if (!check_norm_type(fn, norm_type)) return NAN;
    if (n > 0 && !params) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: params is NULL", fn);
        return NAN;
    }
    for (int i = 0; i < n; i++) {
        if (!accel_tensor_check(params[i], fn, "parameter")) return NAN;
        const accel_tensor *g = params[i]->grad;
        if (g && (g->dtype != ACCEL_F32 || !accel_is_contiguous(g) || g->device.type != ACCEL_DEV_CPU)) {
            accel_set_error(ACCEL_ERR_DTYPE, "%s: the grad of parameter %d is not a contiguous f32 cpu tensor",
                            fn, i);
            return NAN;
        }
    }
    double acc = 0.0;
    for (int i = 0; i < n; i++)
        if (params[i]->grad)
            acc = combine(acc, accel_grad_norm_partial(params[i]->grad->data,
                                                       accel_numel(params[i]->grad), norm_type),
                          norm_type);
    double total = accel_grad_norm_finish(acc, norm_type);
    float c = (float)accel_clip_coef(total, max_norm);
    for (int i = 0; i < n; i++)
        if (params[i]->grad) scale(params[i]->grad->data, accel_numel(params[i]->grad), c);
    return total;
}

double accel_optimizer_clip_grad_norm(accel_optimizer *opt, double max_norm, double norm_type) {
    if (!opt) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_clip_grad_norm: optimizer is NULL");
        return NAN;
    }
    if (!check_norm_type("accel_optimizer_clip_grad_norm", norm_type)) return NAN;
    double acc = 0.0;
    for (int i = 0; i < opt->n_segs; i++) {
        const float *g = accel__seg_grad(&opt->segs[i]);
        if (g) acc = combine(acc, accel_grad_norm_partial(g, opt->segs[i].numel, norm_type), norm_type);
    }
    double total = accel_grad_norm_finish(acc, norm_type);
    float c = (float)accel_clip_coef(total, max_norm);
    for (int i = 0; i < opt->n_segs; i++) {
        float *g = accel__seg_grad(&opt->segs[i]);
        if (g) scale(g, opt->segs[i].numel, c);
    }
    return total;
}
