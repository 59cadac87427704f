/* The kernel-table entries of the pointwise ops (binary, unary, unary_grad,
 * dropout's mask_scale): they pick the fast f32 loop or the reference one of
 * pointwise_kernels.c. Kept apart from that file because it is compiled once
 * per ISA variant (cpu_variants.h) and these entries return a status. */
#include "core/backend.h"
#include "backends/cpu/cpu_kernels.h"

static bool dense_f32(const accel_tensor *t) { return t->dtype == ACCEL_F32 && accel_is_contiguous(t); }

accel_status accel__cpuk_binary(accel_k_binary *k) {
    accel_tensor *out = k->out, *a = k->a, *b = k->b;
    if (accel_numel(out) == 0) return ACCEL_OK;
    int lo = accel_reference_kernels() ? -1 : accel__binary_lowp_operand(out, a, b);
    if (lo >= 0) {
        bool lo_first = lo == 0;
        accel__cpu_binary_f32_lowp(k->op, lo_first ? b->data : a->data, lo_first ? a->data : b->data,
                                   lo_first ? a->dtype : b->dtype, lo_first, out->data, accel_numel(out));
        return ACCEL_OK;
    }
    if (accel_reference_kernels() || a->dtype != ACCEL_F32 || b->dtype != ACCEL_F32 || out->dtype != ACCEL_F32) {
        accel__cpu_binary_ref(k->op, out, a, b);
        return ACCEL_OK;
    }
    int64_t sa[ACCEL_MAX_DIMS], sb[ACCEL_MAX_DIMS];
    accel__broadcast_strides(a, out->ndim, out->shape, sa);
    accel__broadcast_strides(b, out->ndim, out->shape, sb);
    const int64_t *st[2] = {sa, sb};
    accel__layout l;
    accel__layout_init(&l, out->ndim, out->shape, 2, st);
    accel__cpu_binary_f32(k->op, &l, a->data, b->data, out->data);
    return ACCEL_OK;
}

accel_status accel__cpuk_unary(accel_k_unary *k) {
    if (accel_reference_kernels() || !dense_f32(k->x) || k->out->dtype != ACCEL_F32)
        accel__cpu_unary_ref(k->op, k->p, k->out, k->x);
    else accel__cpu_unary_f32(k->op, k->p, k->x->data, k->out->data, accel_numel(k->x));
    return ACCEL_OK;
}

accel_status accel__cpuk_unary_grad(accel_k_unary_grad *k) {
    if (accel_reference_kernels() || !dense_f32(k->g) || !dense_f32(k->x) || !dense_f32(k->y))
        accel__cpu_unary_grad_ref(k->op, k->p, k->dx, k->g, k->x, k->y);
    else accel__cpu_unary_grad_f32(k->op, k->p, k->g->data, k->x->data, k->y->data, k->dx->data, accel_numel(k->x));
    return ACCEL_OK;
}

accel_status accel__cpuk_mask_scale(accel_k_mask_scale *k) {
    const float *px = k->x->data, scale = k->scale;
    const uint8_t *m = k->mask->data;
    float *po = k->out->data;
    int64_t n = accel_numel(k->x);
#pragma omp parallel for if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t i = 0; i < n; i++) po[i] = m[i] ? px[i] * scale : 0.0f;
    return ACCEL_OK;
}

/* ---- SwiGLU (the fast path is in fused_kernels.c) */

static bool swiglu_dtype(const accel_tensor *t) {
    return !t || t->dtype == ACCEL_F32 || t->dtype == ACCEL_BF16 || t->dtype == ACCEL_F16;
}

/* v as a tensor of dtype dt holds it. */
static float rounded(float v, accel_dtype dt) {
    if (dt == ACCEL_BF16) return accel_bf16_to_f32(accel_f32_to_bf16(v));
    if (dt == ACCEL_F16) return accel_f16_to_f32(accel_f32_to_f16(v));
    return v;
}

static float elem(const accel_tensor *t, int64_t i) { return (float)accel__load_elem(t->data, t->dtype, (size_t)i); }

/* d[i] (+)= v, in d's dtype. */
static void put(accel_tensor *d, int64_t i, float v, float beta) {
    accel__store_elem(d->data, d->dtype, (size_t)i, beta != 0.0f ? elem(d, i) + v : v);
}

/* The references: element by element, libm's expf. */
static void swiglu_ref(const accel_k_swiglu *k) {
    int64_t n = accel_numel(k->out);
    for (int64_t i = 0; i < n; i++) {
        float x = elem(k->gate, i);
        accel__store_elem(k->out->data, k->out->dtype, (size_t)i,
                          rounded(x * accel__sigmoidf(x), k->gate->dtype) * elem(k->up, i));
    }
}

static void swiglu_backward_ref(const accel_k_swiglu_backward *k) {
    int64_t n = accel_numel(k->gate);
    accel_dtype gdt = k->gate->dtype;
    for (int64_t i = 0; i < n; i++) {
        float x = elem(k->gate, i), g = elem(k->g, i), s = accel__sigmoidf(x);
        if (k->dgate) put(k->dgate, i, rounded(g * elem(k->up, i), gdt) * (s * (1.0f + x * (1.0f - s))), k->dgate_beta);
        if (k->dup) put(k->dup, i, g * rounded(x * s, gdt), k->dup_beta);
    }
}

accel_status accel__cpuk_swiglu(accel_k_swiglu *k) {
    if (accel_numel(k->out) == 0) return ACCEL_OK;
    if (accel_reference_kernels() || !swiglu_dtype(k->out) || !swiglu_dtype(k->gate) || !swiglu_dtype(k->up))
        swiglu_ref(k);
    else accel__cpu_swiglu(k);
    return ACCEL_OK;
}

accel_status accel__cpuk_swiglu_backward(accel_k_swiglu_backward *k) {
    if (accel_numel(k->gate) == 0) return ACCEL_OK;
    if (accel_reference_kernels() || !swiglu_dtype(k->dgate) || !swiglu_dtype(k->dup) || !swiglu_dtype(k->g) ||
        !swiglu_dtype(k->gate) || !swiglu_dtype(k->up))
        swiglu_backward_ref(k);
    else accel__cpu_swiglu_backward(k);
    return ACCEL_OK;
}
