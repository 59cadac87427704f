/* accel_rope: rotary position embedding, transformers' Llama rotate_half
 * layout: out = x * cos + rotate_half(x) * sin with rotate_half(x) =
 * cat(-x2, x1), cos/sin of angle pos * inv_freq[i] duplicated over both halves.
 * The rope kernel reads x in its dtype and layout (the q/k projection's
 * [B, T, H, D] seen as [B, H, T, D]) and writes the contiguous output in x's
 * dtype: no f32 or contiguous copies around it, forward or backward (on
 * the CPU the backward writes x's gradient in x's own layout). */
#include <math.h>

#include "nn_internal.h"

/* t itself when the rope kernel reads it in place (its last dim contiguous), else a contiguous copy. */
static accel_tensor *rope_input(accel_tensor *t) {
    return t && t->stride[3] != 1 && t->shape[3] > 1 ? accel__contig(t) : t;
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
    accel_k_rope k = {.y = gx.dst, .x = gt, .cos = node->saved[0], .sin = node->saved[1], .BH = node->iarg[0],
                      .T = node->iarg[1], .half = node->iarg[2], .sign = -1.0f, .beta = gx.beta};
    accel_status st = ACCEL_KERNEL("rope backward", gt->device, rope, &k);
    return st == ACCEL_OK ? accel__gbuf_end(&gx) : st;
}

accel_tensor *accel__rope_runs(accel_tensor *x, int n, const int64_t *pos0, const float *inv_freq,
                               double attention_scaling) {
    static const char *OP = "accel_rope";
    accel_tensor *in[1] = {x};
    accel_device dev;
    if (!accel__op_begin(OP, 1, in, &dev) || !accel__op_check_float(OP, x, "x")) return NULL;
    if (x->ndim != 4 || x->shape[3] % 2 != 0 || n < 1 || x->shape[2] % n != 0) {
        char b[96];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_rope: x must be [B, H, T, D] with D even (and T in %d equal runs), "
                        "got %s", n, accel_shape_str(x, b, sizeof b));
        return NULL;
    }
    /* one past a run's last position, pos_offset + T / n, must be an int64
     * (ops.h: pos_offset + T < 2^63): past it the positions wrap negative
     * (signed overflow) */
    bool pos_ok = true;
    int64_t bad_pos = pos0[0];
    for (int i = 0; i < n; i++)
        if (pos0[i] < 0 || pos0[i] > INT64_MAX - x->shape[2] / n) {
            pos_ok = false;
            bad_pos = pos0[i];
        }
    if (!inv_freq || !(attention_scaling > 0.0) || !isfinite(attention_scaling) || !pos_ok) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_rope: inv_freq must be given, attention_scaling finite and > 0, pos_offset >= 0 "
                        "with pos_offset + T < 2^63 (got %s, %g, %lld)", inv_freq ? "inv_freq" : "NULL",
                        attention_scaling, (long long)bad_pos);
        return NULL;
    }
    accel_tensor *out = accel__op_out(x->dtype, 4, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t BH = x->shape[0] * x->shape[1], T = x->shape[2], half = x->shape[3] / 2, run = T / n;
    accel_tensor *freq = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(half), dev);
    accel_tensor *cst = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(T, half), dev);
    accel_tensor *snt = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(T, half), dev);
    accel_tensor *xs = rope_input(x);
    if (!xs || !cst || !snt || !freq || accel_tensor_from_host(freq, inv_freq) != ACCEL_OK) return NULL;
    for (int i = 0; i < n; i++) { /* the tables' rows of run i (contiguous views) */
        accel_tensor *c = n == 1 ? cst : accel_slice(cst, 0, i * run, (i + 1) * run, 1);
        accel_tensor *sn = n == 1 ? snt : accel_slice(snt, 0, i * run, (i + 1) * run, 1);
        accel_k_rope_tables kt = {.cos = c, .sin = sn, .inv_freq = freq, .T = run, .half = half, .pos0 = pos0[i],
                                  .scale = (float)attention_scaling};
        if (!c || !sn || ACCEL_KERNEL(OP, dev, rope_tables, &kt) != ACCEL_OK) return NULL;
    }
    accel_k_rope k = {.y = out, .x = xs, .cos = cst, .sin = snt, .BH = BH, .T = T, .half = half, .sign = 1.0f};
    if (ACCEL_KERNEL(OP, dev, rope, &k) != ACCEL_OK) return NULL;
    accel_node *nd = accel_tape_record("rope", rope_backward, out, 1, in);
    if (nd) {
        nd->saved[0] = cst;
        nd->saved[1] = snt;
        nd->iarg[0] = BH;
        nd->iarg[1] = T;
        nd->iarg[2] = half;
    }
    return out;
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
