/* accel_sdpa: scaled dot-product attention with grouped-query heads and a
 * bottom-right aligned causal mask, computed in f32 by the device's sdpa
 * kernel, which keeps the softmax probabilities (f32) for the backward.
 * Under autocast (or on bf16/f16 inputs) q, k, v, the output and the
 * gradients stay in that dtype, as torch.autocast's SDPA gives them: the
 * kernels read and write bf16/f16 themselves, a tile at a time, so the op
 * makes no f32 copy of q, k, v or the output. */
#include <math.h>

#include "nn_internal.h"

typedef accel_k_sdpa_dims sdpa_dims;

static accel_status sdpa_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *gt = accel__contig(grad_out);
    if (!gt) return accel_last_status();
    accel__gbuf gq, gk, gv;
    if (!accel__gbuf_begin_native(&gq, node->inputs[0]) || !accel__gbuf_begin_native_zeroed(&gk, node->inputs[1]) ||
        !accel__gbuf_begin_native_zeroed(&gv, node->inputs[2]))
        return accel_last_status();
    accel_k_sdpa_backward k = {.dq = gq.dst, .dk = gk.dst, .dv = gv.dst, .g = gt, .q = node->saved[0],
                               .k = node->saved[1], .v = node->saved[2], .p = node->saved[3],
                               .dims = *(const sdpa_dims *)node->ctx, .dq_beta = gq.beta};
    accel_status st = ACCEL_KERNEL("sdpa backward", gt->device, sdpa_backward, &k);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gq);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gk);
    return st == ACCEL_OK ? accel__gbuf_end(&gv) : st;
}

static bool sdpa_shapes(accel_tensor *q, accel_tensor *k, accel_tensor *v, sdpa_dims *d) {
    static const char *OP = "accel_sdpa";
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) {
        accel__shape_error2(OP, q, k, "do not fit (q [B, H, Tq, D], k and v [B, Hkv, Tk, D] expected)");
        return false;
    }
    *d = (sdpa_dims){q->shape[0], q->shape[1], k->shape[1], q->shape[2], k->shape[2], q->shape[3], v->shape[3],
                     0, false, {0, 0, 0}, {0, 0, 0}};
    if (k->shape[0] != d->B || k->shape[3] != d->D) {
        accel__shape_error2(OP, q, k, "do not fit (batch and head dim of q and k must match)");
        return false;
    }
    if (v->shape[0] != d->B || v->shape[1] != d->Hkv || v->shape[2] != d->Tk) {
        accel__shape_error2(OP, k, v, "do not fit (k and v must agree on B, Hkv and Tk)");
        return false;
    }
    if (d->Hkv == 0 || d->H % d->Hkv != 0) {
        accel__shape_error2(OP, q, k, "do not fit (query heads must be a multiple of kv heads)");
        return false;
    }
    return true;
}

/* A k or v [B, Hkv, Tk, n] of dtype dt that the kernels can read in place:
 * rows of n contiguous elements, a row stride of at least n. */
static bool strided_ok(const accel_tensor *t, accel_dtype dt, int64_t n) {
    if (t->dtype != dt) return false;
    if (n > 1 && t->stride[3] != 1) return false;
    return t->stride[2] >= (n > 1 ? n : 1) && t->stride[1] >= 0 && t->stride[0] >= 0;
}

accel_tensor *accel_sdpa(accel_tensor *q, accel_tensor *k, accel_tensor *v, bool causal, double scale) {
    static const char *OP = "accel_sdpa";
    accel_tensor *in[3] = {q, k, v};
    accel_device dev;
    if (!accel__op_begin(OP, 3, in, &dev)) return NULL;
    int idt = accel__mm_dtype(OP, 3, in);
    if (idt < 0) return NULL;
    accel_dtype dt = (accel_dtype)idt;
    sdpa_dims dims;
    if (!sdpa_shapes(q, k, v, &dims)) return NULL;
    dims.causal = causal;
    dims.scale = (float)(scale > 0.0 ? scale : 1.0 / sqrt((double)(dims.D ? dims.D : 1)));
    int64_t oshape[4] = {dims.B, dims.H, dims.Tq, dims.Dv};
    accel_tensor *out = accel__op_out(dt, 4, oshape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    /* Decode reads the KV cache in place (no copy of the whole cache per
     * token) when nothing is recorded for the backward. */
    bool in_place = !accel_reference_kernels() && !accel_needs_grad(3, in) && strided_ok(k, dt, dims.D) &&
                    strided_ok(v, dt, dims.Dv);
    /* Dense in dt: under autocast the rounding of the inputs. */
    accel_tensor *qc = accel__contig_as(q, dt), *kc = in_place ? k : accel__contig_as(k, dt),
                 *vc = in_place ? v : accel__contig_as(v, dt);
    if (!qc || !kc || !vc) return NULL;
    /* Dense strides unless in place (a contiguous tensor's strides of size-1
     * dims may be anything; the dense ones are what the backward uses). */
    const int64_t kd[3] = {dims.Hkv * dims.Tk * dims.D, dims.Tk * dims.D, dims.D},
                  vd[3] = {dims.Hkv * dims.Tk * dims.Dv, dims.Tk * dims.Dv, dims.Dv};
    for (int i = 0; i < 3; i++) {
        dims.ks[i] = in_place ? kc->stride[i] : kd[i];
        dims.vs[i] = in_place ? vc->stride[i] : vd[i];
    }
    accel_tensor *p = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(dims.B, dims.H, dims.Tq, dims.Tk), dev);
    sdpa_dims *dc = accel_arena_alloc(accel_step_arena(), sizeof *dc, 64);
    if (!p || !dc) return NULL;
    *dc = dims;
    accel_k_sdpa ks = {.o = out, .p = p, .q = qc, .k = kc, .v = vc, .dims = dims};
    if (ACCEL_KERNEL(OP, dev, sdpa, &ks) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("sdpa", sdpa_backward, out, 3, in);
    if (n) {
        n->saved[0] = qc;
        n->saved[1] = kc;
        n->saved[2] = vc;
        n->saved[3] = p;
        n->ctx = dc;
    }
    return out;
}
