/* accel_cross_entropy (mean over targets != ignore_index) and accel_mse_loss.
 * Both compute in f32 and return a 0-dim f32 tensor. */
#include <math.h>
#include <string.h>

#include "nn_internal.h"

/* ------------------------------------------------------------------ cross_entropy */

/* The loss of one row: logsumexp(x) - x[t]; lse written for the backward. */
static double ce_row(const float *x, int64_t C, int64_t t, float *lse, bool ref) {
    if (ref) {
        double m = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < C; j++) m = fmax(m, x[j]);
        for (int64_t j = 0; j < C; j++) s += exp((double)x[j] - m);
        *lse = (float)(m + log(s));
        return m + log(s) - x[t];
    }
    float m = accel__row_max(x, C);
    *lse = m + logf(accel__row_sum_exp(x, C, m));
    return (double)*lse - x[t];
}

/* d (+)= (softmax(x) - onehot(t)) * scale for one row; lse its logsumexp. */
ACCEL__VEC_MATH static void ce_row_grad(const float *x, float *d, int64_t C, int64_t t, float lse,
                                        float scale, float beta) {
    if (beta == 0.0f) {
#pragma omp simd
        for (int64_t j = 0; j < C; j++) d[j] = accel__expf(x[j] - lse) * scale;
    } else {
#pragma omp simd
        for (int64_t j = 0; j < C; j++) d[j] += accel__expf(x[j] - lse) * scale;
    }
    d[t] -= scale;
}

static accel_status ce_backward(accel_node *node, accel_tensor *grad_out) {
    int64_t N = node->iarg[0], C = node->iarg[1], ignore = node->iarg[2], count = node->iarg[3];
    const float *x = node->saved[0]->data, *lse = node->saved[1]->data;
    const int64_t *t = node->saved[2]->data;
    accel__gbuf gx;
    if (!accel__gbuf_begin(&gx, node->inputs[0])) return accel_last_status();
    if (!gx.p) return ACCEL_OK;
    float scale = (float)(accel_item(grad_out) / (double)count);
    float *dx = gx.p, beta = gx.beta;
#pragma omp parallel for if (N * C > 16384) schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float *d = dx + i * C;
        if (t[i] != ignore) ce_row_grad(x + i * C, d, C, t[i], lse[i], scale, beta);
        else if (beta == 0.0f) memset(d, 0, (size_t)C * sizeof *d);
    }
    return accel__gbuf_end(&gx);
}

/* Targets of the logits' shape less the class dim (PyTorch's rule), or the
 * same N targets flat: [4, 1] for logits [4, 3] has the right count but is
 * neither, and is refused as PyTorch refuses it. */
static bool targets_fit(const accel_tensor *logits, const accel_tensor *targets, int64_t N) {
    if (targets->ndim == 1 && targets->shape[0] == N) return true;
    if (targets->ndim != logits->ndim - 1) return false;
    for (int i = 0; i < targets->ndim; i++)
        if (targets->shape[i] != logits->shape[i]) return false;
    return true;
}

accel_tensor *accel_cross_entropy(accel_tensor *logits, accel_tensor *targets, int64_t ignore_index) {
    static const char *OP = "accel_cross_entropy";
    accel_tensor *in[2] = {logits, targets};
    accel_device dev;
    if (!accel__op_begin(OP, 2, in, &dev) || !accel__op_check_float(OP, logits, "logits")) return NULL;
    if (targets->dtype != ACCEL_I64 && targets->dtype != ACCEL_I32) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: targets must be int64 or int32, got %s", OP,
                        accel_dtype_name(targets->dtype));
        return NULL;
    }
    int64_t C = logits->ndim ? logits->shape[logits->ndim - 1] : 0;
    int64_t N = C ? accel_numel(logits) / C : 0;
    if (logits->ndim < 1 || C == 0 || !targets_fit(logits, targets, N)) {
        accel__shape_error2(OP, logits, targets,
                            "do not fit (logits [..., C]; targets of the logits' shape without C, or [N] flat)");
        return NULL;
    }
    accel_tensor *out = accel__op_out(ACCEL_F32, 0, NULL, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *xf = accel__f32_contig(logits);
    accel_tensor *tt = accel_empty(ACCEL_I64, ACCEL_SHAPE(N));
    accel_tensor *lse = accel_empty(ACCEL_F32, ACCEL_SHAPE(N));
    if (!xf || !tt || !lse || accel_to_int64s(targets, tt->data) != ACCEL_OK) return NULL;
    const int64_t *t = tt->data;
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) {
        if (t[i] == ignore_index) continue;
        if (t[i] < 0 || t[i] >= C) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: target %lld at position %lld is out of range for %lld classes",
                            OP, (long long)t[i], (long long)i, (long long)C);
            return NULL;
        }
        count++;
    }
    const float *x = xf->data;
    float *lp = lse->data;
    bool ref = accel_reference_kernels();
    double total = 0.0;
#pragma omp parallel for if (!ref && N * C > 16384) reduction(+ : total) schedule(static)
    for (int64_t i = 0; i < N; i++)
        if (t[i] != ignore_index) total += ce_row(x + i * C, C, t[i], &lp[i], ref);
    /* All targets ignored: 0/0 = nan, as PyTorch. */
    *(float *)out->data = count ? (float)(total / (double)count) : NAN;
    accel_node *n = accel_tape_record("cross_entropy", ce_backward, out, 2, in);
    if (n) {
        n->saved[0] = xf;
        n->saved[1] = lse;
        n->saved[2] = tt;
        n->iarg[0] = N;
        n->iarg[1] = C;
        n->iarg[2] = ignore_index;
        n->iarg[3] = count;
    }
    return out;
}

/* ------------------------------------------------------------------ mse_loss */

static accel_status mse_backward(accel_node *node, accel_tensor *grad_out) {
    const float *p = node->saved[0]->data, *t = node->saved[1]->data;
    int64_t n = accel_numel(node->saved[0]);
    float scale = (float)(2.0 * accel_item(grad_out) / (double)n);
    for (int k = 0; k < 2; k++) {
        accel__gbuf g;
        if (!accel__gbuf_begin(&g, node->inputs[k])) return accel_last_status();
        if (!g.p) continue;
        float s = k == 0 ? scale : -scale, beta = g.beta;
        float *d = g.p;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float v = s * (p[i] - t[i]);
            d[i] = beta == 0.0f ? v : d[i] + v;
        }
        accel_status st = accel__gbuf_end(&g);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

accel_tensor *accel_mse_loss(accel_tensor *pred, accel_tensor *target) {
    static const char *OP = "accel_mse_loss";
    accel_tensor *in[2] = {pred, target};
    accel_device dev;
    if (!accel__op_begin(OP, 2, in, &dev) || !accel__op_check_float(OP, pred, "pred") ||
        !accel__op_check_float(OP, target, "target"))
        return NULL;
    if (!accel_same_shape(pred, target)) {
        accel__shape_error2(OP, pred, target, "differ (mse_loss needs equal shapes)");
        return NULL;
    }
    accel_tensor *out = accel__op_out(ACCEL_F32, 0, NULL, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *pf = accel__f32_contig(pred), *tf = accel__f32_contig(target);
    if (!pf || !tf) return NULL;
    int64_t n = accel_numel(pred);
    const float *p = pf->data, *t = tf->data;
    double total = 0.0;
    if (accel_reference_kernels()) {
        for (int64_t i = 0; i < n; i++) total += ((double)p[i] - t[i]) * ((double)p[i] - t[i]);
    } else {
#pragma omp parallel for if (n > 65536) reduction(+ : total) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float d = p[i] - t[i];
            total += d * d;
        }
    }
    *(float *)out->data = n ? (float)(total / (double)n) : NAN;
    accel_node *nd = accel_tape_record("mse_loss", mse_backward, out, 2, in);
    if (nd) {
        nd->saved[0] = pf;
        nd->saved[1] = tf;
    }
    return out;
}
