/* Shared helpers of the linear-algebra, nn and loss ops: gradient buffers
 * that accumulate in place, and GEMM operand preparation under autocast. */
#include <math.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "core/prepared.h"
#include "core/step_casts.h"
#include "nn_internal.h"

int64_t accel__prod(const int64_t *shape, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= shape[i];
    return p;
}

/* An empty step tensor of dtype dt in t's layout: t's strides where t is
 * dense (its elements fill one block, each once: a permutation of a
 * contiguous tensor's dims, such as a [B, T, H, D] tensor seen as [B, H, T,
 * D]), else contiguous. As PyTorch's empty_like. */
static accel_tensor *empty_in_layout(accel_dtype dt, const accel_tensor *t) {
    int order[ACCEL_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++) { /* the dims of more than one element, by stride, largest first */
        if (t->shape[i] == 1) continue;
        int j = n++;
        for (; j > 0 && t->stride[order[j - 1]] < t->stride[i]; j--) order[j] = order[j - 1];
        order[j] = i;
    }
    int64_t numel = accel_numel(t), s = 1, stride[ACCEL_MAX_DIMS];
    bool dense = numel > 0 && !accel_is_contiguous(t);
    for (int j = n - 1; j >= 0 && dense; j--) {
        dense = t->stride[order[j]] == s;
        s *= t->shape[order[j]];
    }
    if (!dense) return accel_empty_on(dt, t->ndim, t->shape, t->device);
    for (int i = 0; i < t->ndim; i++) stride[i] = t->shape[i] == 1 ? 1 : t->stride[i];
    accel_tensor *block = accel_empty_on(dt, 1, &numel, t->device);
    return block ? accel_view_raw(block, t->ndim, t->shape, stride, 0) : NULL;
}

/* accel__gbuf_begin; a first gradient of a step tensor in t's layout when like. */
static bool begin_f32(accel__gbuf *g, accel_tensor *t, bool like) {
    memset(g, 0, sizeof *g);
    g->t = t;
    if (!t || !t->requires_grad || t->device.type == ACCEL_DEV_META) return true;
    accel_tensor *gr = t->grad;
    if (t->dtype == ACCEL_F32 && gr && !accel__grad_is_shared(t) && gr->dtype == ACCEL_F32 && accel_is_contiguous(gr) &&
        accel_same_shape(gr, t) && accel_device_eq(gr->device, t->device)) {
        g->dst = gr;
        g->beta = 1.0f;
        return true;
    }
    /* A non-leaf (or arena leaf) without a gradient yet gets an arena one, as
     * accel_grad_accumulate would allocate, written directly. */
    if (t->dtype == ACCEL_F32 && accel__grad_first_is_step(t)) {
        t->grad = like ? empty_in_layout(ACCEL_F32, t) : accel_empty_on(ACCEL_F32, t->ndim, t->shape, t->device);
        if (!t->grad) return false;
        g->dst = t->grad;
        return true;
    }
    /* A persistent leaf (a parameter) without a gradient yet (its first
     * backward): the zeroed persistent gradient accel_grad_accumulate would
     * make, added into in place, as every later step does. Through a scratch
     * it cost a weight-sized f32 arena buffer per parameter on the first
     * step (the whole model's size at the arena's peak), for the same bits:
     * the scratch was added into those zeros. */
    if (!gr && t->dtype == ACCEL_F32) {
        t->grad = accel_tensor_new(ACCEL_F32, t->ndim, t->shape, t->device);
        if (!t->grad) return false;
        t->grad->flags |= ACCEL_TF_GRAD;
        g->dst = t->grad;
        g->beta = 1.0f;
        return true;
    }
    g->tmp = accel_empty_on(ACCEL_F32, t->ndim, t->shape, t->device);
    if (!g->tmp) return false;
    g->dst = g->tmp;
    return true;
}

bool accel__gbuf_begin(accel__gbuf *g, accel_tensor *t) { return begin_f32(g, t, false); }

/* Fresh memory (beta 0) zeroed, to be added into (beta 1). */
static bool zero_fresh(accel__gbuf *g) {
    if (g->dst && g->beta == 0.0f) {
        if (accel_zero_(g->dst) != ACCEL_OK) return false;
        g->beta = 1.0f;
    }
    return true;
}

bool accel__gbuf_begin_zeroed(accel__gbuf *g, accel_tensor *t) { return accel__gbuf_begin(g, t) && zero_fresh(g); }

/* accel__gbuf_begin_native; a first gradient of a step tensor in t's layout when like. */
static bool begin_native(accel__gbuf *g, accel_tensor *t, bool like) {
    if (!t || (t->dtype != ACCEL_BF16 && t->dtype != ACCEL_F16)) return begin_f32(g, t, like);
    memset(g, 0, sizeof *g);
    g->t = t;
    if (!t->requires_grad || t->device.type == ACCEL_DEV_META) return true;
    accel_tensor *gr = t->grad;
    if (gr && !accel__grad_is_shared(t) && gr->dtype == t->dtype && accel_is_contiguous(gr) && accel_same_shape(gr, t) &&
        accel_device_eq(gr->device, t->device)) {
        g->dst = gr;
        g->beta = 1.0f;
        return true;
    }
    if (accel__grad_first_is_step(t)) {
        t->grad = like ? empty_in_layout(t->dtype, t) : accel_empty_on(t->dtype, t->ndim, t->shape, t->device);
        g->dst = t->grad;
        return t->grad != NULL;
    }
    return begin_f32(g, t, false);
}

bool accel__gbuf_begin_native(accel__gbuf *g, accel_tensor *t) { return begin_native(g, t, false); }

bool accel__gbuf_begin_native_layout(accel__gbuf *g, accel_tensor *t) { return begin_native(g, t, true); }

bool accel__gbuf_begin_native_zeroed(accel__gbuf *g, accel_tensor *t) {
    return accel__gbuf_begin_native(g, t) && zero_fresh(g);
}

accel_status accel__gbuf_end(accel__gbuf *g) {
    /* A kernel wrote t's gradient itself: reported as the library's other
     * writes are, so nothing remembered of its old values (a conversion a
     * norm's backward offered, core/step_casts.h) is handed out again. */
    if (!g->tmp) {
        if (g->dst) accel__tensor_written(g->dst);
        return ACCEL_OK;
    }
    return accel_grad_accumulate(g->t, g->tmp);
}

bool accel__gemm_writes_c(accel_device dev, accel_dtype c, accel_dtype a, accel_dtype b) {
    if (c == ACCEL_F32) return true;
    const accel_backend *be = accel__backend_of(dev);
    accel_gemm_c16 w = be ? be->gemm_c16 : ACCEL_GEMM_C16_NONE;
    return (c == ACCEL_BF16 || c == ACCEL_F16) &&
           (w == ACCEL_GEMM_C16_ANY || (w == ACCEL_GEMM_C16_SAME && a == c && b == c));
}

int accel__mm_dtype(const char *op, int n, accel_tensor *const *in) {
    accel_dtype dt = ACCEL_F32;
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        if (!accel__op_check_float(op, in[i], i == 0 ? "argument 1" : i == 1 ? "argument 2" : "argument 3"))
            return -1;
        if (in[i]->dtype == ACCEL_F64) {
            accel_set_error(ACCEL_ERR_DTYPE, "%s: float64 is not supported (use float32)", op);
            return -1;
        }
        dt = first ? in[i]->dtype : accel__promote(dt, in[i]->dtype);
        first = false;
    }
    accel_dtype ac = accel_autocast_dtype();
    return ac != ACCEL_F32 ? (int)ac : (int)dt;
}

/* t converted to dtype dt (step arena). */
static accel_tensor *converted(accel_tensor *t, accel_dtype dt) {
    accel_tensor *c = accel_empty_on(dt, t->ndim, t->shape, t->device);
    if (c && accel_copy_(c, t) != ACCEL_OK) return NULL;
    return c;
}

/* The form of a prepared weight: its rounded copy in key->dt, or (the CPU
 * without bf16 units) those rounded values widened back to f32, through a
 * step copy given back at once (the form is persistent, the step keeps
 * nothing of it). */
static accel_status fill_mm_form(accel_tensor *dst, accel_tensor *src, const accel__form_key *key) {
    if (key->kind == ACCEL__FORM_CAST) return accel_copy_(dst, src);
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    accel_tensor *r = converted(src, key->dt);
    accel_status st = r ? accel_copy_(dst, r) : accel_last_status();
    accel_arena_rewind(a, m);
    return st;
}

/* t's operand from its prepared forms (core/prepared.h) into *form: made
 * once per version of a weight, not per call. *form NULL when t holds none
 * (a step tensor, or this step still reads an older form). */
static accel_status prepared_operand(accel_tensor *t, accel_dtype dt, bool widen, accel_tensor **form) {
    accel__form_key key = {.kind = widen ? ACCEL__FORM_ROUNDED_F32 : ACCEL__FORM_CAST, .dt = dt};
    *form = NULL;
    if (t->dtype != ACCEL_F32 || dt == ACCEL_F32 || (t->flags & ACCEL_TF_ARENA)) return ACCEL_OK;
    return accel__prepared_get(t, &key, widen ? ACCEL_F32 : dt, fill_mm_form, form, NULL);
}

/* t's operand made in the step arena (accel__step_cast_make): rounded to dt,
 * then widened to f32 for the ROUNDED_F32 kind. */
static accel_tensor *step_operand(accel_tensor *t, int kind, accel_dtype dt) {
    if (kind == ACCEL__FORM_CAST) return converted(t, dt);
    accel_tensor *r = t->dtype == dt ? t : converted(t, dt);
    return r ? converted(r, ACCEL_F32) : NULL;
}

accel_tensor *accel__mm_operand(accel_tensor *t, accel_dtype dt) {
    /* Without autocast, mixed operands (bf16 x f32) promote: on a device the
     * one of the other dtype is converted (exactly, widening), since a
     * device's GEMM takes both operands in one dtype (cuBLASLt does); the
     * CPU's GEMM reads mixed operands as they are (no copy). */
    if (accel_autocast_dtype() == ACCEL_F32)
        return t->dtype == dt || t->device.type == ACCEL_DEV_CPU ? accel__contig(t)
                                                                  : accel__step_cast(t, ACCEL__FORM_CAST, dt, step_operand);
    /* Where the CPU GEMM provider of dt multiplies in f32 (OpenBLAS: no
     * bf16 units, or no oneDNN), it would convert a low-precision operand
     * to an f32 panel at every call: once in forward, again in each backward
     * GEMM that reads the saved operand. So on the CPU the operand is then
     * made once, as f32 holding the values rounded to dt (what
     * torch.autocast multiplies), and forward and backward run sgemm on it
     * without conversions. A provider that multiplies dt itself (oneDNN on
     * AMX / AVX512-BF16) gets dt. */
    bool widen = t->device.type == ACCEL_DEV_CPU && !accel__gemm_native(dt);
    accel_tensor *form;
    if (prepared_operand(t, dt, widen, &form) != ACCEL_OK) return NULL;
    if (form) return form;
    if (!widen && t->dtype == dt) return accel__contig(t);
    /* A step tensor read by several GEMMs (a layer's normed input by q, k
     * and v) is converted by the first: the others, and every backward,
     * read that conversion (core/step_casts.h). */
    return accel__step_cast(t, widen ? ACCEL__FORM_ROUNDED_F32 : ACCEL__FORM_CAST, dt, step_operand);
}

accel_tensor *accel__mm_grad(accel_tensor *grad_out, const accel_tensor *a, const accel_tensor *b) {
    accel_dtype dt = a->dtype;
    /* Operands in a 16-bit dtype that the GEMM multiplies itself (every
     * accelerator; the CPU with bf16 units): the gradient is rounded to it,
     * as autocast's backward GEMMs run in that dtype (a device's GEMM takes
     * both operands in one dtype). */
    if (dt != ACCEL_F32 && b->dtype == dt && (a->device.type != ACCEL_DEV_CPU || accel__gemm_native(dt)))
        return grad_out->dtype == dt ? accel__contig(grad_out) : converted(grad_out, dt);
    return accel__f32_contig(grad_out);
}
