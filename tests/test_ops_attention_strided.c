/* accel_sdpa on q, k, v as the projections leave them: [B, T, heads, D]
 * memory seen as [B, heads, T, D] (q a slice of a wider one: an offset and
 * a head stride that is not H D), o made in [B, T, H, Dv] memory where the
 * device's kernels honour strides (its transpose then contiguous), o's
 * gradient arriving in that layout. Values and gradients bit-identical to
 * the same inputs made dense, f32/bf16/f16, GQA, causal or not, Tq != Tk,
 * D != Dv, ragged and whole query blocks, wherever the tile GEMMs do not
 * depend on the operands' leading dims: OpenBLAS's (it packs panels), or
 * bf16/f16 operands widened into dense f32 tiles. oneDNN reading operands
 * in place (its f32 tiles on f32 tensors, the native path) makes a
 * primitive per leading dim, whose order of additions may differ: there
 * the two agree to the rounding of the dtype (f32: 1e-5 relative plus
 * 1e-6; measured up to 6e-7 apart on values up to 7.7, 9e-5 relative on
 * elements near zero). Finite differences through
 * the views; accel__sdpa_heads_last (the decoders') is the transposed
 * accel_sdpa, values and gradients; a kernel handed strides that do not fit
 * refuses them. */
#include "accel/accel.h"
#include "check.h"
#include "core/backend.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "gradcheck.h"
#include "ops/attention.h"
#include "ops_fixture.h"

typedef struct shape_case {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    bool causal;
} shape_case;

static const shape_case CASES[] = {
    {2, 4, 2, 70, 70, 16, 16, true},   /* GQA, a ragged second query block */
    {1, 4, 1, 64, 128, 8, 12, true},   /* MQA, Tq < Tk, D != Dv */
    {2, 2, 2, 5, 9, 4, 6, false},      /* no mask, tiny */
    {1, 4, 2, 128, 128, 32, 32, true}, /* whole blocks: the native path where it is chosen */
};

/* The leaves' views: q = heads [1, H + 1) of xq [B, Tq, H + 1, D], k and v
 * all of xk [B, Tk, Hkv, D] and xv [B, Tk, Hkv, Dv], each in dtype dt and
 * seen as [B, heads, T, n]; made dense when `dense`. */
static void views(accel_tensor *const *x, const shape_case *c, accel_dtype dt, bool dense, accel_tensor **out) {
    accel_tensor *q = accel_slice(accel_to_dtype(x[0], dt), 2, 1, c->H + 1, 1);
    accel_tensor *t[3] = {q, accel_to_dtype(x[1], dt), accel_to_dtype(x[2], dt)};
    for (int i = 0; i < 3; i++) {
        out[i] = accel_transpose(t[i], 1, 2);
        if (dense) out[i] = accel_contiguous(out[i]);
    }
}

static accel_tensor **leaves(const shape_case *c, accel_tensor **x) {
    x[0] = gc_randn(1, ACCEL_SHAPE(c->B, c->Tq, c->H + 1, c->D));
    x[1] = gc_randn(2, ACCEL_SHAPE(c->B, c->Tk, c->Hkv, c->D));
    x[2] = gc_randn(3, ACCEL_SHAPE(c->B, c->Tk, c->Hkv, c->Dv));
    return x;
}

/* The output (persistent copy) and the leaves' gradients of one run: strided
 * (o's gradient the transposed view of gy [B, Tq, H Dv]) or dense (o's
 * gradient gy made dense [B, H, Tq, Dv]). */
static accel_tensor *run(accel_tensor *const *x, const shape_case *c, accel_dtype dt, bool dense, accel_tensor *gy,
                         accel_tensor **grads) {
    accel_tensor *in[3];
    views(x, c, dt, dense, in);
    accel_tensor *o = accel_sdpa(in[0], in[1], in[2], c->causal, 0.0);
    CHECK_MSG(o && o->dtype == dt, "%s", accel_last_error());
    if (!o) return NULL;
    int64_t bthd[4] = {c->B, c->Tq, c->H, c->Dv};
    accel_tensor *g = accel_reshape(accel_to_dtype(gy, dt), 4, bthd);
    accel_status st;
    if (dense) {
        st = accel_backward_with(o, accel_contiguous(accel_transpose(g, 1, 2)));
    } else {
        const accel_backend *be = accel__backend_of(o->device);
        accel_tensor *ot = accel_transpose(o, 1, 2);
        /* where the kernels honour strides o is [B, Tq, H, Dv] memory */
        CHECK(!be || !be->sdpa_strided || accel_is_contiguous(ot));
        st = accel_backward_with(accel_reshape(ot, 3, (int64_t[]){c->B, c->Tq, c->H * c->Dv}),
                                 accel_reshape(g, 3, (int64_t[]){c->B, c->Tq, c->H * c->Dv}));
    }
    CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error());
    accel_tensor *keep = accel_tensor_clone_persistent(o, accel_default_device());
    for (int i = 0; i < 3; i++) {
        grads[i] = x[i]->grad ? accel_tensor_clone_persistent(x[i]->grad, accel_default_device()) : NULL;
        if (x[i]->grad) accel_zero_(x[i]->grad);
    }
    accel_step_reset();
    return keep;
}

static void check_same_bits(const shape_case *c, accel_dtype dt) {
    accel_tensor *x[3];
    leaves(c, x);
    accel_tensor *gy = gc_randn(4, ACCEL_SHAPE(c->B, c->Tq, c->H * c->Dv));
    accel_tensor *gs[3], *gd[3];
    accel_tensor *os = run(x, c, dt, false, gy, gs), *od = run(x, c, dt, true, gy, gd);
    const char *names[3] = {"q", "k", "v"};
    /* the path the library chose for these tiles (module comment) */
    accel_k_sdpa_dims d = {.B = c->B, .H = c->H, .Hkv = c->Hkv, .Tq = c->Tq, .Tk = c->Tk, .D = c->D, .Dv = c->Dv};
    int p = accel__cpu_sdpa_provider(dt, &d);
    bool in_place = p == ACCEL__GEMM_PROVIDER_DNNL || (p == ACCEL__GEMM_PROVIDER_DNNL_F32 && dt == ACCEL_F32);
    double tol = !in_place ? 0.0 : dt == ACCEL_F32 ? 1e-5 : dt == ACCEL_BF16 ? 1.0 / 128 : 1.0 / 1024;
    CHECK_MSG(fx_compare("strided sdpa output", os, od, tol, tol * 0.1) == 0, "dtype %s, Tq %lld Tk %lld",
              accel_dtype_name(dt), (long long)c->Tq, (long long)c->Tk);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(fx_compare("strided sdpa grad", gs[i], gd[i], tol, tol * 0.1) == 0, "%s, dtype %s, Tq %lld Tk %lld", names[i],
                  accel_dtype_name(dt), (long long)c->Tq, (long long)c->Tk);
    accel_tensor_free(os);
    accel_tensor_free(od);
    for (int i = 0; i < 3; i++) {
        accel_tensor_free(gs[i]);
        accel_tensor_free(gd[i]);
        accel_tensor_free(x[i]);
    }
    accel_tensor_free(gy);
}

static void test_same_bits_as_dense(void) {
    const accel_dtype dts[3] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        for (int d = 0; d < 3; d++) check_same_bits(&CASES[i], dts[d]);
}

static accel_tensor *loss_views(accel_tensor *const *in, int n, void *ctx) {
    (void)n;
    const shape_case *c = ctx;
    accel_tensor *v[3];
    views(in, c, ACCEL_F32, false, v);
    accel_tensor *o = accel_sdpa(v[0], v[1], v[2], c->causal, 0.0);
    return gc_weighted_sum(accel_reshape(accel_transpose(o, 1, 2), 3, (int64_t[]){c->B, c->Tq, c->H * c->Dv}));
}

static void test_gradcheck_views(void) {
    const shape_case cases[] = {
        {2, 4, 2, 3, 5, 4, 4, true},  /* GQA, causal, Tq < Tk */
        {1, 2, 2, 4, 4, 3, 5, false}, /* Dv != D */
        {1, 3, 1, 5, 3, 4, 4, true},  /* MQA, Tq > Tk: first rows see no key */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        accel_tensor *x[3];
        leaves(&cases[i], x);
        CHECK_MSG(gradcheck("sdpa views", loss_views, (void *)&cases[i], 3, x, NULL) == 0, "case %zu", i);
        for (int j = 0; j < 3; j++) accel_tensor_free(x[j]);
    }
}

/* accel__sdpa_heads_last: [B, Tq, H, Dv] contiguous, the same bits as
 * accel_sdpa's output transposed, and the same gradients for the same
 * output gradient (there a transposed view, here as it is). */
static void test_heads_last(void) {
    const shape_case *c = &CASES[0];
    accel_tensor *x[3], *g[2][3], *y[2];
    leaves(c, x);
    accel_tensor *gy = gc_randn(5, ACCEL_SHAPE(c->B, c->Tq, c->H, c->Dv));
    for (int last = 0; last < 2; last++) {
        accel_tensor *in[3];
        views(x, c, ACCEL_F32, false, in);
        accel_tensor *o = last ? accel__sdpa_heads_last(in[0], in[1], in[2], c->causal, 0.0)
                               : accel_transpose(accel_sdpa(in[0], in[1], in[2], c->causal, 0.0), 1, 2);
        CHECK(o && o->shape[1] == c->Tq && o->shape[2] == c->H && (!last || accel_is_contiguous(o)));
        CHECK(o && accel_backward_with(o, gy) == ACCEL_OK);
        y[last] = accel_tensor_clone_persistent(o, accel_default_device());
        for (int i = 0; i < 3; i++) {
            g[last][i] = accel_tensor_clone_persistent(x[i]->grad, accel_default_device());
            accel_zero_(x[i]->grad);
        }
        accel_step_reset();
    }
    CHECK(fx_compare("heads_last output", y[1], y[0], 0, 0) == 0);
    for (int i = 0; i < 3; i++) CHECK_MSG(fx_compare("heads_last grad", g[1][i], g[0][i], 0, 0) == 0, "input %d", i);
    for (int l = 0; l < 2; l++) {
        accel_tensor_free(y[l]);
        for (int i = 0; i < 3; i++) accel_tensor_free(g[l][i]);
    }
    for (int i = 0; i < 3; i++) accel_tensor_free(x[i]);
    accel_tensor_free(gy);
}

/* The kernel refuses strides that do not fit its rows (rows closer than a
 * row, a negative stride), naming the tensor, where it honours strides. */
static void test_kernel_refuses_bad_strides(void) {
    accel_device dev = accel_default_device();
    const accel_backend *be = accel__backend_of(dev);
    if (!be || !be->sdpa_strided) return;
    accel_k_sdpa_dims d = {.B = 1, .H = 1, .Hkv = 1, .Tq = 4, .Tk = 4, .D = 8, .Dv = 8, .scale = 1.0f};
    accel_k_sdpa_dense(&d);
    accel_tensor *q = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 4, 8));
    accel_tensor *lse = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 4));
    accel_tensor *o = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 4, 8));
    accel_k_sdpa a = {.o = o, .lse = lse, .q = q, .k = q, .v = q, .dims = d};
    a.dims.os[2] = 4; /* rows of 8 elements 4 apart */
    accel_clear_error();
    CHECK(be->kernels.sdpa(&a) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "o's strides");
    accel_k_sdpa_backward b = {.dq = o, .g = q, .q = q, .k = q, .v = q, .lse = lse, .dims = d};
    accel_k_sdpa_backward_dense(&b);
    accel_clear_error();
    CHECK(be->kernels.sdpa_backward(&b) == ACCEL_ERR_INVALID_ARG); /* no o: the backward's delta needs it */
    CHECK_STR_CONTAINS(accel_last_error(), "the forward's o and lse are required");
    b.o = o;
    b.dqs[1] = -8;
    accel_clear_error();
    CHECK(be->kernels.sdpa_backward(&b) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "dq's strides");
    accel_clear_error();
    accel_step_reset();
}

int main(void) {
    RUN(test_same_bits_as_dense);
    RUN(test_gradcheck_views);
    RUN(test_heads_last);
    RUN(test_kernel_refuses_bad_strides);
    accel_thread_cleanup();
    return check_summary();
}
