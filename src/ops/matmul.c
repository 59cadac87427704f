/* accel_matmul (batched, broadcasting, 1-D operands as torch.matmul) and
 * accel_linear (y = x W^T + b, the bias added by the GEMM's epilogue:
 * accel_k_gemm.bias). Both run on the device's GEMM (on the CPU
 * accel__gemm: operands are read as they are, W transposed, never copied;
 * the provider per dtype and shape is chosen there). The linear's weight
 * GEMMs (forward, dX) say that B is a weight, which the CPU's oneDNN
 * provider keeps in its own layout once per version of the weight
 * (accel__gemm_weight); dW, and accel_matmul's operands, are plain. */
#include <string.h>

#include "nn_internal.h"

static accel_status gemm_kernel(accel_k_gemm *k) { return ACCEL_KERNEL("gemm", k->c->device, gemm, k); }

accel_status accel__gemm_at(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, accel_tensor *a,
                         int64_t a_off, int64_t lda, accel_tensor *b, int64_t b_off, int64_t ldb, float beta,
                         accel_tensor *c, int64_t c_off, int64_t ldc) {
    accel_k_gemm k = {.c = c, .a = a, .b = b, .trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K,
                      .lda = lda, .ldb = ldb, .ldc = ldc, .a_off = a_off, .b_off = b_off, .c_off = c_off,
                      .alpha = alpha, .beta = beta};
    return gemm_kernel(&k);
}

/* C [M, N] = A [M, K] op(W) + beta C (+ bias [N], f32, in every row, or
 * NULL) with W a layer's weight [O, I], all of it (W^T for forward's
 * Y = X W^T + b, W for dX = dY W): the device may read it in a layout of its
 * own kept between calls (accel_k_gemm.b_weight). */
static accel_status weight_gemm(bool tw, int64_t M, int64_t N, int64_t K, accel_tensor *a, accel_tensor *w,
                                accel_tensor *bias, float beta, accel_tensor *c) {
    accel_k_gemm k = {.c = c, .a = a, .b = w, .bias = bias, .trans_b = tw, .M = M, .N = N, .K = K, .lda = K,
                      .ldb = w->shape[1], .ldc = N, .alpha = 1.0f, .beta = beta, .b_weight = true};
    return gemm_kernel(&k);
}

/* ------------------------------------------------------------------ matmul */

/* a [abatch..., M, K] x b [bbatch..., K, N] -> [batch..., M, N]. Offsets are
 * in matrices: a_str[d] is 0 on a broadcast dim. */
typedef struct mm_plan {
    int nbd;
    int64_t batch[ACCEL_MAX_DIMS];
    int64_t a_str[ACCEL_MAX_DIMS], b_str[ACCEL_MAX_DIMS];
    int64_t nbatch, a_nmat, b_nmat, M, K, N;
} mm_plan;

static void mm_offsets(const mm_plan *p, int64_t i, int64_t *ai, int64_t *bi) {
    int64_t ao = 0, bo = 0;
    for (int d = p->nbd - 1; d >= 0; d--) {
        int64_t c = i % p->batch[d];
        i /= p->batch[d];
        ao += c * p->a_str[d];
        bo += c * p->b_str[d];
    }
    *ai = ao;
    *bi = bo;
}

/* Matrix strides of the batch dims of a tensor (batch dims = all but the last
 * `mat` dims), right-aligned to nbd output batch dims. */
static void batch_strides(const accel_tensor *t, int mat, int nbd, int64_t *str) {
    int tb = t->ndim - mat;
    int64_t s = 1;
    for (int d = nbd - 1; d >= 0; d--) {
        int td = tb - (nbd - d);
        if (td < 0 || t->shape[td] == 1) {
            str[d] = 0;
        } else {
            str[d] = s;
        }
        if (td >= 0) s *= t->shape[td];
    }
}

static bool mm_plan_make(accel_tensor *a, accel_tensor *b, mm_plan *p, int *ondim, int64_t *oshape) {
    static const char *OP = "accel_matmul";
    if (a->ndim == 0 || b->ndim == 0) {
        accel__shape_error2(OP, a, b, "cannot be multiplied (both arguments need at least 1 dim)");
        return false;
    }
    int am = a->ndim >= 2 ? 2 : 1, bm = b->ndim >= 2 ? 2 : 1;
    p->M = am == 2 ? a->shape[a->ndim - 2] : 1;
    p->K = a->shape[a->ndim - 1];
    int64_t kb = bm == 2 ? b->shape[b->ndim - 2] : b->shape[0];
    p->N = bm == 2 ? b->shape[b->ndim - 1] : 1;
    if (kb != p->K) {
        char why[96];
        snprintf(why, sizeof why, "cannot be multiplied (%lld != %lld)", (long long)p->K, (long long)kb);
        accel__shape_error2(OP, a, b, why);
        return false;
    }
    int anb = a->ndim - am, bnb = b->ndim - bm;
    p->nbd = anb > bnb ? anb : bnb;
    for (int d = 0; d < p->nbd; d++) {
        int ia = anb - p->nbd + d, ib = bnb - p->nbd + d;
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            accel__shape_error2(OP, a, b, "cannot be multiplied (batch dims cannot be broadcast)");
            return false;
        }
        p->batch[d] = sa == 1 ? sb : sa;
    }
    batch_strides(a, am, p->nbd, p->a_str);
    batch_strides(b, bm, p->nbd, p->b_str);
    p->nbatch = accel__prod(p->batch, 0, p->nbd);
    p->a_nmat = accel__prod(a->shape, 0, anb);
    p->b_nmat = accel__prod(b->shape, 0, bnb);
    int n = 0;
    for (int d = 0; d < p->nbd; d++) oshape[n++] = p->batch[d];
    if (am == 2) oshape[n++] = p->M;
    if (bm == 2) oshape[n++] = p->N;
    *ondim = n;
    return true;
}

/* C[nbatch, M, N] (f32) = A B over the plan. */
static accel_status mm_forward(const mm_plan *p, accel_tensor *a, accel_tensor *b, accel_tensor *c) {
    int64_t M = p->M, K = p->K, N = p->N;
    if (p->b_nmat == 1) /* one B for all: fold the batch into M */
        return accel__gemm_at(false, false, p->nbatch * M, N, K, 1.0f, a, 0, K, b, 0, N, 0.0f, c, 0, N);
    for (int64_t i = 0; i < p->nbatch; i++) {
        int64_t ai, bi;
        mm_offsets(p, i, &ai, &bi);
        accel_status st = accel__gemm_at(false, false, M, N, K, 1.0f, a, ai * M * K, K, b, bi * K * N, N, 0.0f, c, i * M * N, N);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

static accel_status matmul_backward(accel_node *node, accel_tensor *grad_out) {
    const mm_plan *p = node->ctx;
    accel_tensor *a = node->saved[0], *b = node->saved[1];
    accel_tensor *g = accel__mm_grad(grad_out, a, b);
    if (!g) return accel_last_status();
    int64_t M = p->M, K = p->K, N = p->N;
    accel__gbuf ga, gb;
    if (!accel__gbuf_begin(&ga, node->inputs[0]) || !accel__gbuf_begin(&gb, node->inputs[1]))
        return accel_last_status();
    accel_status st = ACCEL_OK;
    if (p->b_nmat == 1) {
        int64_t R = p->nbatch * M;
        if (ga.dst) /* dA [R, K] = dC [R, N] B^T */
            st = accel__gemm_at(false, true, R, K, N, 1.0f, g, 0, N, b, 0, N, ga.beta, ga.dst, 0, K);
        if (st == ACCEL_OK && gb.dst) /* dB [K, N] = A^T [K, R] dC [R, N] */
            st = accel__gemm_at(true, false, K, N, R, 1.0f, a, 0, K, g, 0, N, gb.beta, gb.dst, 0, N);
    } else {
        /* Broadcast operands receive sums over batches: start from zero and add. */
        if (ga.dst && ga.beta == 0.0f && p->a_nmat < p->nbatch) {
            if (accel_zero_(ga.dst) != ACCEL_OK) return accel_last_status();
            ga.beta = 1.0f;
        }
        if (gb.dst && gb.beta == 0.0f && p->b_nmat < p->nbatch) {
            if (accel_zero_(gb.dst) != ACCEL_OK) return accel_last_status();
            gb.beta = 1.0f;
        }
        for (int64_t i = 0; i < p->nbatch && st == ACCEL_OK; i++) {
            int64_t ai, bi;
            mm_offsets(p, i, &ai, &bi);
            if (ga.dst)
                st = accel__gemm_at(false, true, M, K, N, 1.0f, g, i * M * N, N, b, bi * K * N, N, ga.beta, ga.dst, ai * M * K, K);
            if (st == ACCEL_OK && gb.dst)
                st = accel__gemm_at(true, false, K, N, M, 1.0f, a, ai * M * K, K, g, i * M * N, N, gb.beta, gb.dst, bi * K * N, N);
        }
    }
    if (st == ACCEL_OK) st = accel__gbuf_end(&ga);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gb);
    return st;
}

accel_tensor *accel_matmul(accel_tensor *a, accel_tensor *b) {
    accel_tensor *in[2] = {a, b};
    accel_device dev;
    if (!accel__op_begin("accel_matmul", 2, in, &dev)) return NULL;
    int dt = accel__mm_dtype("accel_matmul", 2, in);
    if (dt < 0) return NULL;
    mm_plan plan;
    int ondim;
    int64_t oshape[ACCEL_MAX_DIMS + 2];
    if (!mm_plan_make(a, b, &plan, &ondim, oshape)) return NULL;
    if (ondim > ACCEL_MAX_DIMS) {
        accel__shape_error2("accel_matmul", a, b, "give a result of too many dims");
        return NULL;
    }
    accel_tensor *out = accel__op_out((accel_dtype)dt, ondim, oshape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *ua = accel__mm_operand(a, (accel_dtype)dt), *ub = accel__mm_operand(b, (accel_dtype)dt);
    if (!ua || !ub) return NULL;
    /* A bf16/f16 result is written by the device's gemm where it can
     * (accel__gemm_writes_c); elsewhere the f32 result is converted. */
    accel_tensor *c = accel__gemm_writes_c(dev, out->dtype, ua->dtype, ub->dtype)
                          ? out
                          : accel_empty_on(ACCEL_F32, ondim, oshape, dev);
    if (!c || mm_forward(&plan, ua, ub, c) != ACCEL_OK) return NULL;
    if (c != out && accel_copy_(out, c) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("matmul", matmul_backward, out, 2, in);
    if (n) {
        mm_plan *pc = accel_arena_alloc(accel_step_arena(), sizeof *pc, 64);
        if (!pc) return NULL;
        *pc = plan;
        n->ctx = pc;
        n->saved[0] = ua;
        n->saved[1] = ub;
    }
    return out;
}

/* ------------------------------------------------------------------ linear */

static accel_status linear_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *x = node->saved[0], *w = node->saved[1];
    int64_t R = node->iarg[0], I = node->iarg[1], O = node->iarg[2];
    accel_tensor *g = accel__mm_grad(grad_out, x, w);
    if (!g) return accel_last_status();
    accel__gbuf gx, gw, gbias;
    /* A bf16/f16 input's first gradient (the attention output's, SwiGLU's
     * under autocast) is written in its dtype by a gemm that writes it
     * (accel__gemm_writes_c: the CPU's, and on a GPU from dY and W of that
     * dtype), the values the f32 result converted by accel_grad_accumulate
     * held. */
    accel_tensor *in0 = node->inputs[0];
    bool native_dx = in0 && !in0->grad && accel__gemm_writes_c(in0->device, in0->dtype, g->dtype, w->dtype);
    if (!(native_dx ? accel__gbuf_begin_native(&gx, in0) : accel__gbuf_begin(&gx, in0)) ||
        !accel__gbuf_begin(&gw, node->inputs[1]) ||
        !accel__gbuf_begin(&gbias, node->inputs[2]))
        return accel_last_status();
    accel_status st = ACCEL_OK;
    if (gx.dst) /* dX [R, I] = dY [R, O] W [O, I] */
        st = weight_gemm(false, R, I, O, g, w, NULL, gx.beta, gx.dst);
    if (st == ACCEL_OK && gw.dst) /* dW [O, I] = dY^T [O, R] X [R, I] */
        st = accel__gemm_at(true, false, O, I, R, 1.0f, g, 0, O, x, 0, I, gw.beta, gw.dst, 0, I);
    if (st == ACCEL_OK && gbias.dst) { /* the column sums read f32 */
        accel_tensor *gf = g->dtype == ACCEL_F32 ? g : accel__f32_contig(grad_out);
        if (!gf) return accel_last_status();
        accel_k_col_sum k = {.out = gbias.dst, .g = gf, .R = R, .O = O, .beta = gbias.beta};
        st = ACCEL_KERNEL("linear backward", gf->device, col_sum, &k);
    }
    if (st == ACCEL_OK) st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gbias);
    return st;
}

accel_tensor *accel_linear(accel_tensor *x, accel_tensor *w, accel_tensor *b) {
    static const char *OP = "accel_linear";
    accel_tensor *in[3] = {x, w, b};
    accel_device dev;
    if (!accel__op_begin_opt(OP, 3, in, 4u, &dev)) return NULL;
    int dt = accel__mm_dtype(OP, 3, in);
    if (dt < 0) return NULL;
    if (w->ndim != 2 || x->ndim < 1) {
        accel__shape_error2(OP, x, w, "do not fit (x must be [..., in] and weight [out, in])");
        return NULL;
    }
    int64_t I = w->shape[1], O = w->shape[0];
    if (x->shape[x->ndim - 1] != I) {
        char why[96];
        snprintf(why, sizeof why, "cannot be multiplied (%lld != %lld)",
                 (long long)x->shape[x->ndim - 1], (long long)I);
        accel__shape_error2(OP, x, w, why);
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != O)) {
        accel__shape_error2(OP, w, b, "do not fit (bias must be [out])");
        return NULL;
    }
    int64_t oshape[ACCEL_MAX_DIMS];
    memcpy(oshape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    oshape[x->ndim - 1] = O;
    accel_tensor *out = accel__op_out((accel_dtype)dt, x->ndim, oshape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t R = accel__prod(x->shape, 0, x->ndim - 1);
    accel_tensor *ux = accel__mm_operand(x, (accel_dtype)dt), *uw = accel__mm_operand(w, (accel_dtype)dt);
    if (!ux || !uw) return NULL;
    /* A bf16/f16 result is written by the device's gemm where it can
     * (accel__gemm_writes_c: the CPU's, a GPU's from operands of that dtype);
     * elsewhere the f32 result is converted. */
    accel_tensor *c = accel__gemm_writes_c(dev, out->dtype, ux->dtype, uw->dtype)
                          ? out
                          : accel_empty_on(ACCEL_F32, x->ndim, oshape, dev);
    if (!c) return NULL;
    /* The bias in the compute dtype (rounded as autocast rounds it), added in
     * f32 by the GEMM's epilogue. */
    accel_tensor *bf = NULL;
    if (b) {
        accel_tensor *ub = accel__mm_operand(b, (accel_dtype)dt);
        if (!ub || !(bf = accel__f32_contig(ub))) return NULL;
    }
    /* Y [R, O] = X [R, I] W^T + b */
    if (weight_gemm(true, R, O, I, ux, uw, bf, 0.0f, c) != ACCEL_OK) return NULL;
    if (c != out && accel_copy_(out, c) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("linear", linear_backward, out, 3, in);
    if (n) {
        n->saved[0] = ux;
        n->saved[1] = uw;
        n->iarg[0] = R;
        n->iarg[1] = I;
        n->iarg[2] = O;
    }
    return out;
}
