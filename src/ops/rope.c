/* accel_rope: rotary position embedding, transformers' Llama rotate_half
 * layout: out = x * cos + rotate_half(x) * sin with rotate_half(x) =
 * cat(-x2, x1), cos/sin of angle pos * inv_freq[i] duplicated over both halves.
 * The rope kernel reads x in its dtype and layout (the q/k projection's
 * [B, T, H, D] seen as [B, H, T, D]) and writes the contiguous output in x's
 * dtype: no f32 or contiguous copies around it, forward or backward (on
 * the CPU the backward writes x's gradient in x's own layout). */
#include <math.h>

#include "attention.h"
#include "nn_internal.h"

/* t itself when the rope kernel reads it in place (its last dim contiguous), else a contiguous copy. */
static accel_tensor *rope_input(accel_tensor *t) {
    return t && t->stride[3] != 1 && t->shape[3] > 1 ? accel__contig(t) : t;
}

/* Row b of t [B, H, T, D] as [1, H, T, D] (a view), or t itself when the
 * tables are shared by every row (nb 1). */
static accel_tensor *row_of(accel_tensor *t, int64_t nb, int64_t b) {
    if (nb == 1) return t;
    int64_t shape[4] = {1, t->shape[1], t->shape[2], t->shape[3]};
    return accel_view_raw(t, 4, shape, t->stride, b * t->stride[0]);
}

/* The rope kernel over x into y (beta 0 overwrites, 1 adds) with cos/sin
 * tables [nb, T, half]: nb 1 shared by every batch row, nb B one set a row
 * (positions that differ between rows: accel__rope_positions). */
static accel_status rotate(const char *op, accel_tensor *y, accel_tensor *x, accel_tensor *cst, accel_tensor *snt,
                           int64_t nb, float sign, float beta) {
    int64_t H = x->shape[1], T = x->shape[2], half = x->shape[3] / 2;
    for (int64_t b = 0; b < nb; b++) {
        accel_tensor *yb = row_of(y, nb, b), *xb = row_of(x, nb, b);
        accel_tensor *c = nb == 1 ? cst : accel_view_raw(cst, 2, (int64_t[]){T, half}, (int64_t[]){half, 1}, b * T * half);
        accel_tensor *sn = nb == 1 ? snt : accel_view_raw(snt, 2, (int64_t[]){T, half}, (int64_t[]){half, 1}, b * T * half);
        if (!yb || !xb || !c || !sn) return accel_last_status();
        accel_k_rope k = {.y = yb, .x = xb, .cos = c, .sin = sn, .BH = xb->shape[0] * H, .T = T, .half = half,
                          .sign = sign, .beta = beta};
        accel_status st = ACCEL_KERNEL(op, x->device, rope, &k);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

static accel_status rope_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *gt = rope_input(grad_out);
    if (!gt) return accel_last_status();
    /* On the CPU a first gradient of x is written in x's own layout: for
     * the q/k projection's [B, T, H, D] output seen as [B, H, T, D], a
     * contiguous [B, T, H, D] block that the transpose's backward passes to
     * the projection without a copy. */
    accel__gbuf gx;
    bool cpu = gt->device.type == ACCEL_DEV_CPU;
    if (!(cpu ? accel__gbuf_begin_native_layout(&gx, node->inputs[0]) : accel__gbuf_begin_native(&gx, node->inputs[0])))
        return accel_last_status();
    if (!gx.dst) return ACCEL_OK;
    /* The inverse rotation. */
    accel_status st = rotate("rope backward", gx.dst, gt, node->saved[0], node->saved[1], node->iarg[0], -1.0f, gx.beta);
    return st == ACCEL_OK ? accel__gbuf_end(&gx) : st;
}

/* x [B, H, T, D] checked for rope (D even, T in n equal runs) and its
 * output; on meta the output alone. */
static bool rope_begin(accel_tensor *x, int n, accel_device *dev, accel_tensor **out) {
    static const char *OP = "accel_rope";
    accel_tensor *in[1] = {x};
    *out = NULL;
    if (!accel__op_begin(OP, 1, in, dev) || !accel__op_check_float(OP, x, "x")) return false;
    if (x->ndim != 4 || x->shape[3] % 2 != 0 || n < 1 || x->shape[2] % n != 0) {
        char b[96];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_rope: x must be [B, H, T, D] with D even (and T in %d equal runs), "
                        "got %s", n, accel_shape_str(x, b, sizeof b));
        return false;
    }
    *out = accel__op_out(x->dtype, 4, x->shape, *dev);
    return *out != NULL;
}

/* out = x rotated by the tables cos/sin [nb, T, half] (rotate), recorded. */
static accel_tensor *rope_apply(accel_tensor *x, accel_tensor *out, accel_tensor *cst, accel_tensor *snt, int64_t nb) {
    accel_tensor *xs = rope_input(x);
    if (!xs || rotate("accel_rope", out, xs, cst, snt, nb, 1.0f, 0.0f) != ACCEL_OK) return NULL;
    accel_node *nd = accel_tape_record("rope", rope_backward, out, 1, &x);
    if (nd) {
        nd->saved[0] = cst;
        nd->saved[1] = snt;
        nd->iarg[0] = nb;
    }
    return out;
}

/* Whether inv_freq is given and attention_scaling finite and > 0 (else the error). */
static bool freqs_ok(const float *inv_freq, double attention_scaling) {
    if (inv_freq && attention_scaling > 0.0 && isfinite(attention_scaling)) return true;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rope: inv_freq must be given, attention_scaling finite and > 0 "
                    "(got %s, %g)", inv_freq ? "inv_freq" : "NULL", attention_scaling);
    return false;
}

/* inv_freq [half] on dev. */
static accel_tensor *freqs_on(const float *inv_freq, int64_t half, accel_device dev) {
    accel_tensor *freq = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(half), dev);
    return freq && accel_tensor_from_host(freq, inv_freq) == ACCEL_OK ? freq : NULL;
}

/* The tables' rows [t0, t0 + run) at positions p0.. (the rope_tables kernel). */
static accel_status tables_run(accel_tensor *cst, accel_tensor *snt, accel_tensor *freq, int64_t t0, int64_t run,
                               int64_t p0, double scale) {
    int64_t half = cst->shape[cst->ndim - 1], sh[2] = {run, half}, st[2] = {half, 1};
    accel_tensor *c = accel_view_raw(cst, 2, sh, st, t0 * half), *sn = accel_view_raw(snt, 2, sh, st, t0 * half);
    accel_k_rope_tables kt = {.cos = c, .sin = sn, .inv_freq = freq, .T = run, .half = half, .pos0 = p0,
                              .scale = (float)scale};
    return c && sn ? ACCEL_KERNEL("accel_rope", cst->device, rope_tables, &kt) : accel_last_status();
}

accel_tensor *accel__rope_runs(accel_tensor *x, int n, const int64_t *pos0, const float *inv_freq,
                               double attention_scaling) {
    accel_device dev;
    accel_tensor *out;
    if (!rope_begin(x, n, &dev, &out) || !freqs_ok(inv_freq, attention_scaling)) return NULL;
    /* one past a run's last position, pos_offset + T / n, must be an int64
     * (ops.h: pos_offset + T < 2^63): past it the positions wrap negative
     * (signed overflow) */
    for (int i = 0; i < n; i++)
        if (pos0[i] < 0 || pos0[i] > INT64_MAX - x->shape[2] / n) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rope: pos_offset must be >= 0 with pos_offset + T < 2^63 "
                            "(got %lld)", (long long)pos0[i]);
            return NULL;
        }
    if (dev.type == ACCEL_DEV_META) return out;
    int64_t T = x->shape[2], half = x->shape[3] / 2, run = T / n;
    accel_tensor *freq = freqs_on(inv_freq, half, dev);
    accel_tensor *cst = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(T, half), dev);
    accel_tensor *snt = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(T, half), dev);
    if (!freq || !cst || !snt) return NULL;
    for (int i = 0; i < n; i++)
        if (tables_run(cst, snt, freq, i * run, run, pos0[i], attention_scaling) != ACCEL_OK) return NULL;
    return rope_apply(x, out, cst, snt, 1);
}

accel_status accel__rope_tables(const int64_t *pos, int64_t B, int64_t T, int64_t half, const float *inv_freq,
                                double attention_scaling, accel_device dev, accel_tensor **cos, accel_tensor **sin) {
    *cos = *sin = NULL;
    if (!freqs_ok(inv_freq, attention_scaling)) return accel_last_status();
    for (int64_t i = 0; i < B * T; i++)
        if (pos[i] < 0)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rope: position %lld (row %lld, index %lld) is "
                                   "negative", (long long)pos[i], (long long)(i / T), (long long)(i % T));
    if (dev.type == ACCEL_DEV_META) return ACCEL_OK;
    accel_tensor *freq = freqs_on(inv_freq, half, dev);
    accel_tensor *cst = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(B, T, half), dev);
    accel_tensor *snt = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(B, T, half), dev);
    if (!freq || !cst || !snt) return accel_last_status();
    /* the tables [B T, half] a run of consecutive positions at a time (a
     * left-padded row: its pads one by one, then its tokens in one run; a
     * run may go on into the next row, whose table rows follow) */
    for (int64_t i = 0, j; i < B * T; i = j) {
        for (j = i + 1; j < B * T && pos[j] - 1 == pos[j - 1];) j++; /* pos[j] >= 0: no wrap at INT64_MAX */
        accel_status st = tables_run(cst, snt, freq, i, j - i, pos[i], attention_scaling);
        if (st != ACCEL_OK) return st;
    }
    *cos = cst, *sin = snt;
    return ACCEL_OK;
}

accel_tensor *accel__rope_with_tables(accel_tensor *x, accel_tensor *cos, accel_tensor *sin) {
    accel_device dev;
    accel_tensor *out;
    if (!rope_begin(x, 1, &dev, &out) || dev.type == ACCEL_DEV_META) return out;
    int64_t B = x->shape[0], T = x->shape[2], half = x->shape[3] / 2;
    const accel_tensor *tab[2] = {cos, sin};
    for (int i = 0; i < 2; i++)
        if (!tab[i] || tab[i]->dtype != ACCEL_F32 || tab[i]->ndim != 3 || tab[i]->shape[0] != B ||
            tab[i]->shape[1] != T || tab[i]->shape[2] != half || !accel_device_eq(tab[i]->device, dev)) {
            char b[64];
            accel_set_error(ACCEL_ERR_SHAPE, "accel_rope: f32 %s tables [%lld, %lld, %lld] on the device of x %s "
                            "expected", i ? "sin" : "cos", (long long)B, (long long)T, (long long)half,
                            accel_shape_str(x, b, sizeof b));
            return NULL;
        }
    return rope_apply(x, out, cos, sin, B);
}

accel_tensor *accel__rope_positions(accel_tensor *x, const int64_t *pos, const float *inv_freq,
                                    double attention_scaling) {
    accel_device dev;
    accel_tensor *out, *cst, *snt;
    if (!rope_begin(x, 1, &dev, &out)) return NULL;
    if (accel__rope_tables(pos, x->shape[0], x->shape[2], x->shape[3] / 2, inv_freq, attention_scaling, dev, &cst,
                           &snt) != ACCEL_OK)
        return NULL;
    return dev.type == ACCEL_DEV_META ? out : rope_apply(x, out, cst, snt, x->shape[0]);
}

accel_tensor *accel_rope_freqs(accel_tensor *x, int64_t pos_offset, const float *inv_freq,
                               double attention_scaling) {
    return accel__rope_runs(x, 1, &pos_offset, inv_freq, attention_scaling);
}

accel_tensor *accel_rope(accel_tensor *x, int64_t pos_offset, double theta) {
    if (!(theta > 0.0)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rope: theta must be > 0 (got %g)", theta);
        return NULL;
    }
    if (!accel_tensor_check(x, "accel_rope", "argument 1")) return NULL; /* before x's shape is read */
    int64_t half = x->ndim == 4 ? x->shape[3] / 2 : 0;
    float *inv = accel_arena_alloc(accel_step_arena(), (size_t)(half ? half : 1) * sizeof *inv, 64);
    if (!inv) return NULL;
    for (int64_t i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(theta, (double)(2 * i) / (double)(2 * half)));
    return accel_rope_freqs(x, pos_offset, inv, 1.0);
}
