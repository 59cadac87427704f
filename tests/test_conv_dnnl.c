/* accel_conv2d / accel_conv1d on oneDNN's convolution (ACCEL_CONV=dnnl,
 * backends/cpu/conv_dnnl.c) against the im2col path of the same process
 * (accel__cpu_conv_set_mode): the forward and the three gradients over
 * groups (depthwise too), dilation, strides 2, padding, 1x1, odd sizes,
 * batch 1 and conv1d; the gradients added to existing ones (a second
 * step); the cached primitives after shape changes (each case runs
 * after another shape) and on 1 and 2 threads (the key holds the count);
 * bf16 against the f32 result of the same rounded inputs; the calls that
 * ran on oneDNN counted. Where the
 * oneDNN plug-in does not load, dnnl has nothing to run (the im2col
 * results are then compared with themselves and the test says so). */
#include <omp.h>

#include "accel/accel.h"
#include "accel/cpu.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

typedef struct conv_case {
    const char *name;
    int64_t N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw, G;
    bool bias, conv1d; /* conv1d: H and kh 1, x [N, C, W] */
} conv_case;

static const conv_case CASES[] = {
    {"3x3 pad 1, odd planes", 2, 4, 7, 9, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false},
    {"3x3 stride 2, 2 groups, batch 1", 1, 4, 8, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1, 2, true, false},
    {"3x2 dilated (2, 1), stride (1, 2), 3 groups", 2, 6, 9, 7, 6, 3, 2, 1, 2, 2, 0, 2, 1, 3, false, false},
    {"1x1", 3, 8, 6, 6, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1, true, false},
    {"1x1 stride 2 over odd planes", 2, 8, 7, 7, 4, 1, 1, 2, 2, 0, 0, 1, 1, 1, false, false},
    {"3x3 depthwise", 2, 16, 10, 10, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16, true, false},
    {"3x3 pad 0 (case 0's shape but the padding)", 2, 4, 7, 9, 6, 3, 3, 1, 1, 0, 0, 1, 1, 1, true, false},
    {"7x7 stride 2 pad 3 (a stem)", 2, 3, 17, 15, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, false, false},
    {"conv1d k 3 stride 2 pad 1 dilation 2, 2 groups", 2, 4, 1, 11, 6, 1, 3, 1, 2, 0, 1, 1, 2, 2, true, true},
};
enum { NCASES = sizeof CASES / sizeof CASES[0] };

/* A case's inputs (persistent f32, seeds by case) and results. */
typedef struct conv_run {
    accel_tensor *x, *w, *b; /* the inputs, requiring grad */
    accel_tensor *y, *dx, *dw, *db; /* persistent f32 copies */
    accel_dtype y_dtype;
} conv_run;

static accel_tensor *keep(accel_tensor *t) {
    if (!t) return NULL;
    accel_tensor *k = accel_tensor_new(ACCEL_F32, t->ndim, t->shape, t->device);
    CHECK(k && accel_copy_(k, t) == ACCEL_OK);
    return k;
}

static void run_free(conv_run *r) {
    accel_tensor *all[] = {r->x, r->w, r->b, r->y, r->dx, r->dw, r->db};
    for (int i = 0; i < 7; i++) accel_tensor_free(all[i]);
}

/* The inputs of case c in dtype dt (bf16: f32 values rounded to it). */
static void inputs(const conv_case *c, int seed, accel_dtype dt, conv_run *r) {
    int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C / c->G, c->kh, c->kw};
    accel_tensor *x = c->conv1d ? gc_randn(seed, ACCEL_SHAPE(c->N, c->C, c->W)) : gc_randn(seed, 4, xs);
    accel_tensor *w = c->conv1d ? gc_randn(seed + 1, ACCEL_SHAPE(c->O, c->C / c->G, c->kw)) : gc_randn(seed + 1, 4, ws);
    accel_tensor *b = c->bias ? gc_randn(seed + 2, ACCEL_SHAPE(c->O)) : NULL;
    accel_tensor *in[3] = {x, w, b}, **out[3] = {&r->x, &r->w, &r->b};
    for (int i = 0; i < 3; i++) {
        *out[i] = NULL;
        if (!in[i]) continue;
        if (dt == ACCEL_F32) *out[i] = in[i];
        else {
            *out[i] = accel_tensor_new(dt, in[i]->ndim, in[i]->shape, in[i]->device);
            CHECK(*out[i] && accel_copy_(*out[i], in[i]) == ACCEL_OK);
            accel_requires_grad_(*out[i], true);
            accel_tensor_free(in[i]);
        }
    }
}

/* r's inputs as f32 (bf16 widened exactly), for the reference. */
static void widened(const conv_run *r, conv_run *f) {
    accel_tensor *in[3] = {r->x, r->w, r->b}, **out[3] = {&f->x, &f->w, &f->b};
    for (int i = 0; i < 3; i++) {
        *out[i] = keep(in[i]);
        if (*out[i]) accel_requires_grad_(*out[i], true);
    }
}

/* The forward and backward of case c on r's inputs (the gradient of
 * sum(y * gy) for a fixed gy), times times: the gradients added up. */
static void run(const conv_case *c, conv_run *r, int times) {
    for (int t = 0; t < times; t++) {
        accel_tensor *y =
            c->conv1d ? accel_conv1d(r->x, r->w, r->b, c->sw, c->pw, c->dw, c->G)
                      : accel_conv2d(r->x, r->w, r->b, (int64_t[]){c->sh, c->sw}, (int64_t[]){c->ph, c->pw},
                                     (int64_t[]){c->dh, c->dw}, c->G);
        CHECK_MSG(y, "%s: %s", c->name, accel_last_error());
        if (!y) return;
        accel_tensor *gy = gc_randn(99, y->ndim, y->shape);
        CHECK(accel_backward_with(y, accel_to_dtype(gy, y->dtype)) == ACCEL_OK);
        accel_tensor_free(gy);
        if (t == times - 1) {
            r->y = keep(y);
            r->y_dtype = y->dtype;
            r->dx = keep(r->x->grad);
            r->dw = keep(r->w->grad);
            r->db = r->b ? keep(r->b->grad) : NULL;
        }
        accel_step_reset();
    }
}

static bool dnnl_here(void) { return accel__gemm_have_dnnl() && !accel__dnnl_unavailable(); }

/* The mode that runs oneDNN: dnnl, or auto (im2col then) where it cannot
 * load (dnnl would fail every convolution). */
static accel__conv_mode on(void) { return dnnl_here() ? ACCEL__CONV_DNNL : ACCEL__CONV_AUTO; }

static double max_abs(const accel_tensor *t) {
    int64_t n = accel_numel(t);
    float *v = malloc(sizeof(float) * (size_t)n);
    double m = 0;
    if (v && accel_to_floats(t, v) == ACCEL_OK)
        for (int64_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
    free(v);
    return m;
}

/* got against want (the reference's results, times scale for the
 * gradients), each within rtol and atol times the largest magnitude of
 * want's tensor. */
static void compare(const char *what, const conv_case *c, const conv_run *got, const conv_run *want, double scale,
                    double rtol, double atol) {
    const accel_tensor *g[4] = {got->y, got->dx, got->dw, got->db}, *w[4] = {want->y, want->dx, want->dw, want->db};
    static const char *const NAMES[4] = {"y", "dx", "dw", "db"};
    for (int i = 0; i < 4; i++) {
        if (!w[i]) continue;
        accel_tensor *ws = accel_mul_scalar((accel_tensor *)w[i], i ? scale : 1.0);
        char name[256];
        snprintf(name, sizeof name, "%s: %s: %s", c->name, what, NAMES[i]);
        CHECK_FX(name, g[i], ws, rtol, atol * max_abs(ws));
        accel_step_reset();
    }
}

/* Each case on oneDNN (twice: the second backward adds to the gradients)
 * against im2col's once, on 2 threads, then on 1. */
static void test_f32(void) {
    for (int threads = 2; threads >= 1; threads--) {
        omp_set_num_threads(threads);
        for (int i = 0; i < NCASES; i++) {
            const conv_case *c = &CASES[i];
            conv_run ref, got;
            inputs(c, 10 * i, ACCEL_F32, &ref);
            inputs(c, 10 * i, ACCEL_F32, &got);
            CHECK(accel__cpu_conv_set_mode(ACCEL__CONV_IM2COL) == ACCEL_OK);
            run(c, &ref, 1);
            CHECK(accel__cpu_conv_set_mode(on()) == ACCEL_OK);
            int64_t before = accel__cpu_conv_direct_calls();
            run(c, &got, 2);
            /* the forward and the backward (dX, dW with db), twice */
            int64_t calls = accel__cpu_conv_direct_calls() - before;
            CHECK_MSG(calls == (dnnl_here() ? 4 : 0), "%s: %lld calls on oneDNN", c->name, (long long)calls);
            compare(threads == 2 ? "f32, 2 threads" : "f32, 1 thread", c, &got, &ref, 2.0, 1e-4, 1e-5);
            run_free(&ref);
            run_free(&got);
        }
    }
    omp_set_num_threads(2);
    CHECK(accel__cpu_conv_set_mode(ACCEL__CONV_AUTO) == ACCEL_OK);
    if (!dnnl_here()) printf("note: oneDNN plug-in not loaded (%s): compared im2col with itself\n",
                             accel__gemm_have_dnnl() ? accel__dnnl_unavailable() : "not built in");
}

/* bf16 inputs on oneDNN against the f32 im2col result of the same values:
 * bf16's rounding of y (and of dY, where the GEMMs multiply bf16 and the
 * gradient comes in it) the only difference. */
static void test_bf16(void) {
    for (int i = 0; i < NCASES; i++) {
        const conv_case *c = &CASES[i];
        conv_run got, ref;
        inputs(c, 10 * i, ACCEL_BF16, &got);
        widened(&got, &ref);
        CHECK(accel__cpu_conv_set_mode(ACCEL__CONV_IM2COL) == ACCEL_OK);
        run(c, &ref, 1);
        CHECK(accel__cpu_conv_set_mode(on()) == ACCEL_OK);
        int64_t before = accel__cpu_conv_direct_calls(), declined = accel__cpu_conv_direct_declined();
        run(c, &got, 1);
        int64_t calls = accel__cpu_conv_direct_calls() - before;
        declined = accel__cpu_conv_direct_declined() - declined;
        /* the backward where dY is bf16 (accel__mm_grad); each pass on oneDNN or declined by it (it has
         * only its reference loop for bf16 there: im2col ran) */
        int64_t most = dnnl_here() ? (accel__gemm_native(ACCEL_BF16) ? 2 : 1) : 0;
        CHECK_MSG(calls + declined == most, "%s: %lld bf16 calls, %lld declined, %lld passes", c->name,
                  (long long)calls, (long long)declined, (long long)most);
        CHECK(got.y && got.y_dtype == ACCEL_BF16);
        compare("bf16", c, &got, &ref, 1.0, 2e-2, 2e-2);
        run_free(&ref);
        run_free(&got);
    }
    CHECK(accel__cpu_conv_set_mode(ACCEL__CONV_AUTO) == ACCEL_OK);
}

/* ACCEL_CONV=bogus (ctest conv_dnnl_env_bogus): a convolution fails naming it. */
static void test_env_bogus(void) {
    accel_tensor *x = gc_randn(1, ACCEL_SHAPE(1, 2, 4, 4)), *w = gc_randn(2, ACCEL_SHAPE(2, 2, 3, 3));
    const int64_t one[2] = {1, 1};
    accel_tensor *y = accel_conv2d(x, w, NULL, one, one, one, 1);
    CHECK_MSG(!y && strstr(accel_last_error(), "ACCEL_CONV=bogus"), "got %s", y ? "a result" : accel_last_error());
    char d[256];
    CHECK(strstr(accel__cpu_conv_describe(d, sizeof d), "ACCEL_CONV=bogus"));
    accel_clear_error();
    accel_tensor_free(x);
    accel_tensor_free(w);
    accel_step_reset();
}

int main(void) {
    const char *env = getenv("ACCEL_CONV");
    if (env && !strcmp(env, "bogus")) {
        RUN(test_env_bogus);
        return check_summary();
    }
    /* a build with oneDNN whose plug-in does not load (stale, missing) would compare im2col with itself */
    CHECK_MSG(!accel__gemm_have_dnnl() || !accel__dnnl_unavailable(), "the oneDNN plug-in did not load: %s",
              accel__gemm_have_dnnl() ? accel__dnnl_unavailable() : "");
    RUN(test_f32);
    RUN(test_bf16);
    return check_summary();
}
