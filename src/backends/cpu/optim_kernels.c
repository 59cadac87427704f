/* Optimizer updates (SGD, Adam/AdamW with PyTorch's rules: Adam's loop is
 * optim_update.c's, per ISA variant) and the partial gradient norm of
 * gradient clipping. */
#include <math.h>

#include "cpu_kernels.h"

/* a * b + c as torch's CPU kernels compute their adds with alpha (a fused
 * multiply-add): the f32 product is exact in double, so one rounding to
 * double then to f32 (equal to fmaf but for a double-rounding tie), without
 * fmaf's library call on a CPU the baseline build does not know has FMA.
 * Unfused, a product beyond FLT_MAX whose sum is not (a weight decay times
 * a parameter near FLT_MAX, plus an infinite gradient) gave NaN where torch
 * gives the infinity. */
static inline float fused(float a, float b, float c) { return (float)((double)a * b + c); }

accel_status accel__cpuk_sgd(accel_k_sgd *k) {
    const float lr = k->lr, wd = k->weight_decay, mom = k->momentum, damp = k->undamped;
    float *p = k->p->data, *buf = k->buf ? k->buf->data : NULL;
    const float *g = k->g->data;
    const bool first = k->first, nesterov = k->nesterov;
    const int64_t n = accel_numel(k->p);
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (wd != 0.0f) d = fused(wd, p[i], d);             /* grad.add(param, alpha=wd) */
        if (buf) {
            float b = first ? d : fused(damp, d, buf[i] * mom); /* buf.mul_(mom).add_(d, alpha=1-damp) */
            buf[i] = b;
            d = nesterov ? fused(mom, b, d) : b;                /* d.add(buf, alpha=mom) */
        }
        p[i] = fused(-lr, d, p[i]);                             /* param.add_(d, alpha=-lr) */
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_adam(accel_k_adam *k) {
    if (k->cast && k->cast_dt != ACCEL_BF16 && k->cast_dt != ACCEL_F16)
        return accel_set_error(ACCEL_ERR_DTYPE, "adam: the weight's copy is rounded to bfloat16 or float16, not %s",
                               accel_dtype_name(k->cast_dt));
    const double t = (double)k->step;
    const double bc1 = 1.0 - pow(k->beta1, t), bc2 = 1.0 - pow(k->beta2, t);
    const accel__adam_coef c = {
        .step_size = (float)(k->lr / bc1),
        .bc2_sqrt = (float)sqrt(bc2),
        .w1 = (float)(1.0 - k->beta1),
        .b2 = (float)k->beta2,
        .w2 = (float)(1.0 - k->beta2),
        .eps = (float)k->eps,
        .decay = k->decoupled ? (float)(1.0 - k->lr * k->weight_decay) : 1.0f,
        .l2 = k->decoupled ? 0.0f : (float)k->weight_decay,
    };
    accel__cpu_adam_update(&c, k->p->data, k->m->data, k->v->data, k->g->data, accel_numel(k->p),
                           k->cast ? k->cast->data : NULL, k->cast ? k->cast->dtype : ACCEL_F32, k->cast_dt);
    return ACCEL_OK;
}

accel_status accel__cpuk_norm_partial(accel_k_norm_partial *k) {
    const float *g = k->g->data;
    const int64_t n = accel_numel(k->g);
    const double norm_type = k->norm_type;
    double acc = 0.0;
    if (isinf(norm_type)) { /* a NaN is kept (fmax dropped it): the norm of a NaN gradient is NaN, as torch's */
        for (int64_t i = 0; i < n && !isnan(acc); i++) {
            double a = fabs((double)g[i]);
            if (!(a <= acc)) acc = a;
        }
    } else if (norm_type == 2.0) { /* each term rounded to f32 as torch's: kernels.h's accel_k_norm_partial */
#pragma omp parallel for if (n > 65536) reduction(+ : acc) schedule(static)
        for (int64_t i = 0; i < n; i++) acc += g[i] * g[i];
    } else if (norm_type == 1.0) {
        for (int64_t i = 0; i < n; i++) acc += fabs((double)g[i]);
    } else {
        for (int64_t i = 0; i < n; i++) acc += (float)pow(fabs((double)g[i]), norm_type);
    }
    *(double *)k->out->data = acc;
    return ACCEL_OK;
}

accel_status accel__cpuk_unscale(accel_k_unscale *k) {
    float *g = k->g->data;
    const int64_t n = accel_numel(k->g);
    const float inv = k->inv;
    int bad = 0;
#pragma omp parallel for if (n > 65536) reduction(| : bad) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        g[i] *= inv;
        bad |= !isfinite(g[i]);
    }
    if (bad) *(float *)k->found->data = 1.0f; /* set, never cleared: one flag checks many gradients */
    return ACCEL_OK;
}
