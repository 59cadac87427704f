/* fp8 without a GPU: the E4M3/E5M2 conversions (the software reference the
 * GPU's casts are tested against in test_cuda_kernels), the delayed-scaling
 * rule of TransformerEngine's recipe, the fp8 Linear's CPU reference path
 * (against a reference written here from the formats alone), the model
 * conversion and dispatch, and mixed_precision='fp8' refused with the
 * device's reason (accepted on an fp8 GPU). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "accel/nn.h"
#include "accelerator/accelerator_internal.h"
#include "accelerator/fp8_scaling.h"
#include "backends/fp8.h"
#include "check.h"
#include "core/prepared.h"
#include "fp8_fixture.h"
#include "nn/fp8_modules.h"
#include "nn/nn_internal.h"
#include "ops/fp8_linear.h"

static void test_known_codes(void) {
    const accel__fp8_format E4 = ACCEL_FP8_E4M3, E5 = ACCEL_FP8_E5M2;
    CHECK(accel__fp8_encode(1.0f, E4) == 0x38 && accel__fp8_encode(1.0f, E5) == 0x3C);
    CHECK(accel__fp8_encode(448.0f, E4) == 0x7E && accel__fp8_encode(-448.0f, E4) == 0xFE);
    CHECK(accel__fp8_encode(57344.0f, E5) == 0x7B);
    /* saturation: past the max, and infinities (no inf in E4M3; E5M2's are not produced) */
    CHECK(accel__fp8_encode(500.0f, E4) == 0x7E && accel__fp8_encode(INFINITY, E4) == 0x7E);
    CHECK(accel__fp8_encode(-INFINITY, E5) == 0xFB && accel__fp8_encode(1e9f, E5) == 0x7B);
    /* E4M3's subnormals: 2^-9 is the smallest; ties round to even */
    CHECK(accel__fp8_encode(0.001953125f, E4) == 0x01);
    CHECK(accel__fp8_encode(0.0009765625f, E4) == 0x00);      /* half of the smallest: to 0 (even) */
    CHECK(accel__fp8_encode(1.5f * 0.001953125f, E4) == 0x02); /* between 1 and 2 ulps: to 2 */
    CHECK(accel__fp8_encode(1.0625f, E4) == 0x38);             /* between 1.0 and 1.125: to 1.0 */
    CHECK(accel__fp8_encode(1.1875f, E4) == 0x3A);             /* between 1.125 and 1.25: to 1.25 */
    CHECK(accel__fp8_encode(0.0f, E4) == 0x00 && accel__fp8_encode(-0.0f, E4) == 0x80);
    CHECK(accel__fp8_encode(NAN, E4) == 0x7F && isnan(accel__fp8_decode(0x7F, E4)));
    CHECK(isinf(accel__fp8_decode(0x7C, E5)) && isnan(accel__fp8_decode(0x7D, E5)));
    CHECK(accel__fp8_decode(0x7E, E4) == 448.0f && accel__fp8_decode(0x01, E4) == 0.001953125f);
}

/* Every finite code decodes to a value that encodes back to the code, and
 * each value between two neighbours rounds to the nearer one. */
static void test_round_trips(void) {
    for (int f = 0; f < 2; f++) {
        accel__fp8_format fmt = (accel__fp8_format)f;
        for (int c = 0; c < 256; c++) {
            float v = accel__fp8_decode((uint8_t)c, fmt);
            if (!isfinite(v)) continue;
            CHECK_MSG(accel__fp8_encode(v, fmt) == c || (v == 0.0f && (c & 0x7F) == 0), "format %d code 0x%02x", f, c);
            float next = accel__fp8_decode((uint8_t)(c + 1), fmt);
            if ((c & 0x7F) == 0x7F || !isfinite(next) || (c & 0x80) != ((c + 1) & 0x80)) continue;
            float below = v + 0.4f * (next - v), above = v + 0.6f * (next - v);
            CHECK_MSG(accel__fp8_encode(below, fmt) == c && accel__fp8_encode(above, fmt) == c + 1,
                      "format %d between codes 0x%02x and 0x%02x", f, c, c + 1);
        }
    }
}

/* The delayed-scaling rule on an fp8 meta (TransformerEngine's layout and
 * rotation): the next scale from the history, then the history rotated. */
static void test_delayed_scaling(void) {
    enum { LEN = 3, S = ACCEL__FP8_SLOTS };
    float m[ACCEL__FP8_META_ROWS(LEN) * S] = {0};
    for (int i = 0; i < 2 * S; i++) m[i] = 1.0f;
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = LEN;
    float *amax = accel__fp8_meta_amax(m, ACCEL__FP8_X);
    *amax = 2.0f; /* most_recent: 448 / 2 */
    accel__fp8_update(m, ACCEL__FP8_X, r);
    CHECK(m[ACCEL__FP8_X] == 224.0f && m[S + ACCEL__FP8_X] == 1.0f / 224.0f);
    CHECK(amax[0] == 0.0f && amax[(LEN - 1) * S] == 2.0f); /* rotated by -1, the current row zeroed */
    *amax = 8.0f;
    accel__fp8_update(m, ACCEL__FP8_X, r);
    CHECK(m[ACCEL__FP8_X] == 56.0f && amax[(LEN - 2) * S] == 2.0f && amax[(LEN - 1) * S] == 8.0f);
    accel__fp8_update(m, ACCEL__FP8_X, r); /* nothing seen: the scale stays */
    CHECK(m[ACCEL__FP8_X] == 56.0f);
    *amax = NAN;
    accel__fp8_update(m, ACCEL__FP8_X, r);
    *amax = INFINITY;
    accel__fp8_update(m, ACCEL__FP8_X, r);
    CHECK(m[ACCEL__FP8_X] == 56.0f && m[S + ACCEL__FP8_X] == 1.0f / 56.0f);
    CHECK(m[ACCEL__FP8_W] == 1.0f && m[ACCEL__FP8_DY] == 1.0f); /* other slots untouched */

    /* "max" over a history of 3, margin 1, the gradient slot in E5M2: the
     * largest amax decides until it leaves the window of 3 steps */
    float h[ACCEL__FP8_META_ROWS(LEN) * S] = {0};
    for (int i = 0; i < 2 * S; i++) h[i] = 1.0f;
    r.use_max = true, r.margin = 1;
    float *dy = accel__fp8_meta_amax(h, ACCEL__FP8_DY);
    const float seen[4] = {8.0f, 1.0f, 2.0f, 1.0f};
    const float want[4] = {57344.0f / 8 / 2, 57344.0f / 8 / 2, 57344.0f / 8 / 2, 57344.0f / 2 / 2};
    for (int i = 0; i < 4; i++) {
        *dy = seen[i];
        accel__fp8_update(h, ACCEL__FP8_DY, r);
        CHECK_MSG(h[ACCEL__FP8_DY] == want[i], "step %d: scale %g, want %g", i, h[ACCEL__FP8_DY], want[i]);
    }
    r.hybrid = false; /* fp8_format E4M3: gradients in E4M3 too */
    *dy = 7.0f;
    accel__fp8_update(h, ACCEL__FP8_DY, r);
    CHECK(h[ACCEL__FP8_DY] == 448.0f / 7.0f / 2.0f);
}

/* ---- the fp8 Linear against a reference written here from the formats alone */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float rnd(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) / (double)(1u << 24)) * 2.0f - 1.0f;
}

static float fp8_round(float v, float scale, accel__fp8_format f) {
    return accel__fp8_decode(accel__fp8_encode(v * scale, f), f);
}

/* C [M, N] = sum_k fp8(A[m, k]) fp8(B[n, k]) inv_a inv_b, with element
 * (m, k) of A at a[m * ars + k * acs] (likewise B): the three GEMMs of the
 * Linear read their operands through these strides. */
typedef struct ref_operand {
    const float *p;
    int rs, cs;
    float scale;
    accel__fp8_format f;
    bool exact; /* not rounded to fp8 (an overridden GEMM's operand), scale ignored */
} ref_operand;

static double ref_value(ref_operand o, int i, int k) {
    float v = o.p[i * o.rs + k * o.cs];
    return o.exact ? v : fp8_round(v, o.scale, o.f) * (double)(1.0f / o.scale);
}

static void ref_gemm(double *c, ref_operand a, ref_operand b, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) acc += ref_value(a, m, k) * ref_value(b, n, k);
            c[m * N + n] = acc;
        }
}

static double worst_error(const float *got, const double *want, int n) {
    double mean = 0.0, worst = 0.0;
    for (int i = 0; i < n; i++) mean += fabs(want[i]) / n;
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]) / (fabs(want[i]) + mean));
    return worst;
}

static float max_abs(const float *v, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(v[i]));
    return m;
}

enum { R = 32, I = 48, O = 32, LEN = 4 };

/* One forward and backward of the fp8 Linear on the cpu reference, checked
 * against ref_gemm with the scales the meta held before the step; returns
 * the meta's scales after it in next[SLOTS]. */
static void linear_step(accel_tensor *x, accel_tensor *w, accel_tensor *b, const float *dy, accel_tensor *meta,
                        accel__fp8_recipe r, float *next) {
    const float *xv = x->data, *wv = w->data, *mv = meta->data;
    const float sx = mv[ACCEL__FP8_X], sw = mv[ACCEL__FP8_W], sdy = mv[ACCEL__FP8_DY];
    const accel__fp8_format E4 = ACCEL_FP8_E4M3, fdy = r.hybrid ? ACCEL_FP8_E5M2 : ACCEL_FP8_E4M3;
    accel_tensor *y = accel__fp8_linear(x, w, b, meta, r);
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    if (!y) return;
    CHECK(y->dtype == ACCEL_F32 && y->ndim == 3 && y->shape[2] == O);
    static double want[R * I > O * I ? R * I : O * I];
    ref_gemm(want, (ref_operand){xv, I, 1, sx, E4, false}, (ref_operand){wv, I, 1, sw, E4, false}, R, O, I);
    for (int i = 0; i < R * O; i++) want[i] += ((const float *)b->data)[i % O];
    CHECK_MSG(worst_error(y->data, want, R * O) < 1e-6, "forward: %g", worst_error(y->data, want, R * O));
    /* the forward's scales moved on, the gradient's not yet */
    CHECK(mv[ACCEL__FP8_X] == 448.0f / max_abs(xv, R * I) && mv[ACCEL__FP8_W] == 448.0f / max_abs(wv, O * I));
    CHECK(mv[ACCEL__FP8_DY] == sdy);

    accel_tensor *g = accel_from_floats(3, y->shape, dy);
    CHECK(g && accel_backward_with(y, g) == ACCEL_OK);
    ref_gemm(want, (ref_operand){dy, O, 1, sdy, fdy, false}, (ref_operand){wv, 1, I, sw, E4, false}, R, I, O); /* dX = dY W */
    CHECK_MSG(worst_error(x->grad->data, want, R * I) < 1e-6, "dX: %g", worst_error(x->grad->data, want, R * I));
    ref_gemm(want, (ref_operand){dy, 1, O, sdy, fdy, false}, (ref_operand){xv, 1, I, sx, E4, false}, O, I, R); /* dW = dY^T X */
    CHECK_MSG(worst_error(w->grad->data, want, O * I) < 1e-6, "dW: %g", worst_error(w->grad->data, want, O * I));
    for (int o = 0; o < O; o++) { /* the bias gradient from the unquantised dY */
        double s = 0.0;
        for (int i = 0; i < R; i++) s += dy[i * O + o];
        CHECK_CLOSE(((const float *)b->grad->data)[o], s, 1e-5, 1e-7);
    }
    CHECK(mv[ACCEL__FP8_DY] == accel__fp8_max(fdy) / max_abs(dy, R * O));
    for (int s = 0; s < ACCEL__FP8_SLOTS; s++) next[s] = mv[s];
    accel_step_reset();
    accel_zero_(x->grad), accel_zero_(w->grad), accel_zero_(b->grad);
}

static accel_tensor *param(int ndim, const int64_t *shape, float amp) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ndim, shape, ACCEL_CPU_DEVICE);
    float *v = t->data;
    for (int64_t i = 0; i < accel_numel(t); i++) v[i] = amp * rnd();
    t->requires_grad = true;
    return t;
}

/* Two steps, HYBRID and E4M3: the first with the initial scales of 1 (as
 * TransformerEngine starts), the second with the scales from the first
 * step's amaxes; with those the fp8 Linear is near the f32 one. */
static void test_fp8_linear_reference(void) {
    for (int hybrid = 1; hybrid >= 0; hybrid--) {
        accel__fp8_recipe r = accel__fp8_recipe_default();
        r.history_len = LEN, r.hybrid = hybrid;
        accel_tensor *x = param(3, (int64_t[]){2, R / 2, I}, 3.0f), *w = param(2, (int64_t[]){O, I}, 0.05f);
        accel_tensor *b = param(1, (int64_t[]){O}, 0.5f), *meta = accel__fp8_meta_new(LEN, ACCEL_CPU_DEVICE);
        static float dy[R * O];
        for (int i = 0; i < R * O; i++) dy[i] = 1e-3f * rnd();
        float scales[ACCEL__FP8_SLOTS];
        linear_step(x, w, b, dy, meta, r, scales);
        /* the step's amaxes are the history's newest row, the current row is clear */
        const float seen[ACCEL__FP8_SLOTS] = {max_abs(x->data, R * I), max_abs(w->data, O * I), max_abs(dy, R * O)};
        for (int s = 0; s < ACCEL__FP8_SLOTS; s++) {
            const float *h = accel__fp8_meta_amax(meta->data, s);
            CHECK(h[(LEN - 1) * ACCEL__FP8_SLOTS] == seen[s] && h[0] == 0.0f);
            CHECK(scales[s] == accel__fp8_max(accel__fp8_slot_format(r, s)) / seen[s]);
        }
        linear_step(x, w, b, dy, meta, r, scales);

        /* scaled, the fp8 forward is within E4M3's precision of the f32 one:
         * each operand rounds by at most 2^-4, so a product by about 2^-3 */
        accel_tensor *y8 = accel__fp8_linear(x, w, b, meta, r), *y = accel_linear(x, w, b);
        static double exact[R * O];
        for (int i = 0; i < R * O; i++) exact[i] = ((const float *)y->data)[i];
        double e = worst_error(y8->data, exact, R * O);
        CHECK_MSG(e < 0.125, "fp8 vs f32 linear: worst relative error %g", e);
        accel_step_reset();
        accel_tensor *ts[] = {x, w, b, meta};
        for (int i = 0; i < 4; i++) accel_tensor_free(ts[i]);
    }
}

static void test_fp8_linear_errors(void) {
    accel__fp8_recipe r = accel__fp8_recipe_default();
    accel_tensor *meta = accel__fp8_meta_new(2, ACCEL_CPU_DEVICE);
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(17, 32)), *w = accel_zeros(ACCEL_F32, ACCEL_SHAPE(16, 32));
    CHECK(accel__fp8_linear(x, w, NULL, meta, r) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "multiples of 16 (got 17, 32, 16)");
    accel_clear_error();
    accel_tensor *x16 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(16, 32)), *bad = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 2));
    CHECK(accel__fp8_linear(x16, w, NULL, bad, r) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "the fp8 meta must be f32 [2 + amax_history_len, 3]");
    accel_clear_error();
    CHECK(accel__fp8_linear(x16, w, NULL, meta, r) != NULL); /* all zeros: fine, and the scales stay */
    CHECK(((const float *)meta->data)[ACCEL__FP8_X] == 1.0f);
    CHECK(accel__fp8_meta_new(0, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "amax_history_len must be >= 1");
    accel_clear_error();
    accel_step_reset();
    accel_tensor_free(meta);
}

/* The ranks' prepares compare their models without the metas: a prepare whose fp8 conversion failed on
 * one rank left them on the others only, and the retry was refused as "the ranks' models differ". */
static void test_architecture_without_metas(void) {
    accel_module *kids[2] = {accel_linear_new(32, 48, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                             accel_linear_new(48, 16, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *seq = accel_sequential_new(2, kids);
    int64_t before[3], after[3], other[3];
    CHECK(accel__model_architecture(seq, before) == ACCEL_OK);
    CHECK(accel__fp8_convert_model(seq, accel__fp8_recipe_default()) == ACCEL_OK);
    CHECK(accel__model_architecture(seq, after) == ACCEL_OK);
    CHECK_MSG(!memcmp(before, after, sizeof after), "crc %lld -> %lld, %lld -> %lld tensors", (long long)before[0],
              (long long)after[0], (long long)before[1], (long long)after[1]);
    /* a buffer of the model's own, of a name like it, counts */
    CHECK(accel_module_add_buffer(kids[1], "x_fp8_meta", accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE)) !=
          NULL);
    CHECK(accel__model_architecture(seq, other) == ACCEL_OK);
    CHECK(other[0] != after[0] && other[1] == after[1] + 1);
    accel_module_free(seq);
}

/* convert_model gives the Linears with dims multiple of 16 their fp8 meta
 * (in the state_dict); they run fp8 only under an fp8 autocast. */
static void test_convert_model(void) {
    accel_module *kids[2] = {accel_linear_new(32, 48, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                             accel_linear_new(48, 17, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *seq = accel_sequential_new(2, kids);
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = 8;
    CHECK(accel__fp8_convert_model(seq, r) == ACCEL_OK);
    CHECK(accel__fp8_convert_model(seq, r) == ACCEL_OK); /* twice: the meta is kept, not added again */
    accel_state_dict *sd = accel_module_state_dict(seq);
    int metas = 0;
    for (int i = 0; i < sd->n; i++) {
        if (!strstr(sd->entries[i].name, "fp8_meta")) continue;
        metas++;
        CHECK(!strcmp(sd->entries[i].name, "0.fp8_meta") && sd->entries[i].is_buffer);
        CHECK(sd->entries[i].t->shape[0] == ACCEL__FP8_META_ROWS(8) && sd->entries[i].t->shape[1] == 3);
    }
    CHECK(metas == 1);
    accel_state_dict_free(sd);
    accel_tensor *meta = accel__module_tensor(seq->children[0], "fp8_meta");
    accel_tensor *x = accel_ones(ACCEL_F32, ACCEL_SHAPE(16, 32));
    CHECK(accel_module_call(seq, x) != NULL); /* no fp8 autocast: plain, the scales stay */
    CHECK(((const float *)meta->data)[ACCEL__FP8_X] == 1.0f);
    const accel__fp8_recipe *prev = accel__fp8_autocast_begin(&r);
    CHECK(accel_module_call(seq, x) != NULL);
    accel__fp8_autocast_end(prev);
    CHECK(accel__fp8_autocast() == NULL);
    CHECK(((const float *)meta->data)[ACCEL__FP8_X] == 448.0f); /* fp8: amax 1 */
    accel_step_reset();
    accel_module_free(seq);
}

/* fp8 is refused, naming the device and why: here the cpu (no GPU, or no
 * CUDA backend); on a GPU below compute capability 8.9 its capability. On
 * an fp8 GPU it is accepted, with its recipe. A bad recipe is refused first,
 * on every machine. */
static void test_refused(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "fp8";
    o.cpu = true;
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "fp8 mixed precision is not supported on cpu");
    CHECK_STR_CONTAINS(accel_last_error(), "compute capability >= 8.9");
    accel_clear_error();

    setenv("ACCEL_MIXED_PRECISION", "fp8", 1);
    accel_device cuda0 = {ACCEL_DEV_CUDA, 0};
    if (accel__fp8_device_check(cuda0, "test") == ACCEL_OK) {
        accel_accelerator *acc = accel_accelerator_new(NULL);
        CHECK_MSG(acc && accel_accelerator_mixed_precision(acc) == ACCEL_MP_FP8, "%s", accel_last_error());
        CHECK(acc && !strcmp(accel_mixed_precision_name(accel_accelerator_mixed_precision(acc)), "fp8"));
        accel_accelerator_free(acc);
    } else {
        accel_clear_error();
        CHECK(accel_accelerator_new(NULL) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "fp8 mixed precision is not supported on");
        if (accel_device_count(ACCEL_DEV_CUDA) == 0) CHECK_STR_CONTAINS(accel_last_error(), "on cpu");
        else CHECK_STR_CONTAINS(accel_last_error(), "on cuda:0");
    }
    accel_clear_error();
    static const char *const BAD[][3] = {
        {"ACCELERATE_FP8_FORMAT", "E5M2", "ACCELERATE_FP8_FORMAT=E5M2: pure E5M2 training is not supported"},
        {"ACCELERATE_FP8_FORMAT", "E3M4", "ACCELERATE_FP8_FORMAT=E3M4: choose HYBRID or E4M3"},
        {"ACCEL_FP8_AMAX_COMPUTE_ALGO", "mean", "ACCEL_FP8_AMAX_COMPUTE_ALGO=mean: choose 'max' or 'most_recent'"},
        {"ACCELERATE_FP8_AMAX_HISTORY_LEN", "0",
         "ACCELERATE_FP8_AMAX_HISTORY_LEN=0 must be an integer in [1, 1048576]"},
        {"ACCELERATE_FP8_MARGIN", "x", "ACCELERATE_FP8_MARGIN=x must be an integer in [0, 1048576]"},
        {"ACCELERATE_FP8_INTERVAL", "0", "ACCELERATE_FP8_INTERVAL=0 must be an integer in [1, 1048576]"},
        {"ACCELERATE_FP8_BACKEND", "MSAMP", "ACCELERATE_FP8_BACKEND=MSAMP is not supported"},
        {"ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", "maybe", "USE_AUTOCAST_DURING_EVAL=maybe is not a boolean"},
        {"ACCELERATE_FP8_OVERRIDE_WGRAD", "sure", "ACCELERATE_FP8_OVERRIDE_WGRAD=sure is not a boolean"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        setenv(BAD[i][0], BAD[i][1], 1);
        CHECK(accel_accelerator_new(NULL) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), BAD[i][2]);
        unsetenv(BAD[i][0]);
        accel_clear_error();
    }
    unsetenv("ACCEL_MIXED_PRECISION");

    CHECK(accel__fp8_device_check(ACCEL_CPU_DEVICE, "op") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "op: fp8 mixed precision is not supported on cpu");
    accel_clear_error();
}

/* The recipe from the options (TERecipeKwargs): a field wins over its
 * variable, an unset one reads it, Accelerate's defaults otherwise; a bad
 * field is refused naming it and its value. */
static void test_recipe_options(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    accel__fp8_recipe r;
    CHECK(accel__fp8_recipe_resolve(&o, true, &r) == ACCEL_OK);
    CHECK(r.hybrid && r.margin == 0 && r.history_len == 1024 && !r.use_max && !r.during_eval && !r.deferred_update);

    setenv("ACCELERATE_FP8_FORMAT", "E4M3", 1);
    setenv("ACCELERATE_FP8_MARGIN", "3", 1);
    setenv("ACCELERATE_FP8_AMAX_HISTORY_LEN", "16", 1);
    setenv("ACCELERATE_FP8_AMAX_COMPUTE_ALGO", "MAX", 1); /* Accelerate lowercases it */
    setenv("ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", "on", 1);
    setenv("ACCELERATE_FP8_INTERVAL", "bad", 1);
    o.fp8_interval = 2; /* the field wins: the bad variable is not read */
    CHECK_MSG(accel__fp8_recipe_resolve(&o, true, &r) == ACCEL_OK, "%s", accel_last_error());
    CHECK(!r.hybrid && r.margin == 3 && r.history_len == 16 && r.use_max && r.during_eval);

    o.fp8_format = "hybrid", o.fp8_margin = -1, o.fp8_amax_history_len = 8, o.fp8_amax_compute_algo = "most_recent";
    o.fp8_use_autocast_during_eval = ACCEL_FALSE, o.fp8_backend = "te";
    CHECK(accel__fp8_recipe_resolve(&o, true, &r) == ACCEL_OK);
    CHECK(r.hybrid && r.margin == 0 && r.history_len == 8 && !r.use_max && !r.during_eval);
    o.fp8_margin = 2;
    CHECK(accel__fp8_recipe_resolve(&o, true, &r) == ACCEL_OK && r.margin == 2);
    const char *const VARS[] = {"FORMAT", "MARGIN", "AMAX_HISTORY_LEN", "AMAX_COMPUTE_ALGO", "USE_AUTOCAST_DURING_EVAL",
                                "INTERVAL"};
    for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "ACCELERATE_FP8_%s", VARS[i]);
        unsetenv(name);
    }

    struct {
        accel_accelerator_opts o;
        accel_status st;
        const char *msg;
    } BAD[] = {
        {{.fp8_format = "E3M4"}, ACCEL_ERR_INVALID_ARG, "fp8_format=E3M4: choose HYBRID or E4M3"},
        {{.fp8_format = "e5m2"}, ACCEL_ERR_UNSUPPORTED, "fp8_format=e5m2: pure E5M2 training is not supported"},
        {{.fp8_amax_compute_algo = "mean"}, ACCEL_ERR_INVALID_ARG, "fp8_amax_compute_algo=mean: choose"},
        {{.fp8_amax_history_len = -4}, ACCEL_ERR_INVALID_ARG, "fp8_amax_history_len=-4 must be an integer in [1, "},
        {{.fp8_amax_history_len = 1 << 21}, ACCEL_ERR_INVALID_ARG, "fp8_amax_history_len=2097152 must be"},
        {{.fp8_margin = -2}, ACCEL_ERR_INVALID_ARG, "fp8_margin=-2 must be an integer in [0, "},
        {{.fp8_interval = -1}, ACCEL_ERR_INVALID_ARG, "fp8_interval=-1 must be an integer in [1, "},
        {{.fp8_backend = "MSAMP"}, ACCEL_ERR_UNSUPPORTED, "fp8_backend=MSAMP is not supported"},
        {{.fp8_use_autocast_during_eval = 2}, ACCEL_ERR_INVALID_ARG,
         "fp8_use_autocast_during_eval=2 is not ACCEL_TRUE (1), ACCEL_FALSE (-1) or 0"},
        {{.fp8_override_linear_precision = {3, 0, 0}}, ACCEL_ERR_INVALID_ARG,
         "fp8_override_linear_precision[0]=3 is not ACCEL_TRUE (1), ACCEL_FALSE (-1) or 0"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        CHECK_MSG(accel__fp8_recipe_resolve(&BAD[i].o, true, &r) == BAD[i].st, "case %zu", i);
        CHECK_STR_CONTAINS(accel_last_error(), BAD[i].msg);
        accel_clear_error();
    }
    /* override_linear_precision: the variable, and an explicit false over it */
    setenv("ACCELERATE_FP8_OVERRIDE_DGRAD", "1", 1);
    o = accel_accelerator_opts_default();
    CHECK(accel__fp8_recipe_resolve(&o, true, &r) == ACCEL_OK);
    CHECK(!r.high_precision[ACCEL__FP8_FPROP] && r.high_precision[ACCEL__FP8_DGRAD] &&
          !r.high_precision[ACCEL__FP8_WGRAD]);
    o.fp8_override_linear_precision[1] = ACCEL_FALSE, o.fp8_override_linear_precision[2] = ACCEL_TRUE;
    CHECK(accel__fp8_recipe_resolve(&o, true, &r) == ACCEL_OK);
    CHECK(!r.high_precision[ACCEL__FP8_DGRAD] && r.high_precision[ACCEL__FP8_WGRAD]);
    unsetenv("ACCELERATE_FP8_OVERRIDE_DGRAD");

    /* accel_accelerator_new refuses a bad field, and ZeRO, before the device */
    static const accel_accelerator_opts ZERO[] = {{.mixed_precision = "fp8", .zero_stage = 1},
                                                  {.mixed_precision = "fp8", .zero_stage = 2},
                                                  {.mixed_precision = "fp8", .fsdp_sharding_strategy = "FULL_SHARD"}};
    for (int i = 0; i < 3; i++) {
        char want[32];
        snprintf(want, sizeof want, "with ZeRO stage %d", i + 1);
        CHECK(accel_accelerator_new(&ZERO[i]) == NULL && accel_last_status() == ACCEL_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(accel_last_error(), want);
        accel_clear_error();
    }
    setenv("ACCEL_ZERO_STAGE", "2", 1); /* as the launcher sets it */
    accel_accelerator_opts fp8 = {.mixed_precision = "fp8"};
    CHECK(accel_accelerator_new(&fp8) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "fp8 mixed precision with ZeRO stage 2 (DeepSpeed / FSDP) is not supported");
    accel_clear_error();
    unsetenv("ACCEL_ZERO_STAGE");
    accel_accelerator_opts bad = {.mixed_precision = "fp8", .fp8_amax_history_len = -1};
    CHECK(accel_accelerator_new(&bad) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_new: fp8_amax_history_len=-1 must be");
    accel_clear_error();

    /* a bad field is refused whatever the precision (as TERecipeKwargs when
     * made); the variables are read for fp8 alone: a stray one does not fail
     * another precision */
    static const char *const OTHER[] = {NULL, "no", "bf16", "fp16"};
    for (int i = 0; i < 4; i++) {
        accel_accelerator_opts m = {.mixed_precision = OTHER[i], .fp8_margin = -7};
        CHECK_MSG(accel_accelerator_new(&m) == NULL && accel_last_status() == ACCEL_ERR_INVALID_ARG, "%s",
                  OTHER[i] ? OTHER[i] : "NULL");
        CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_new: fp8_margin=-7 must be an integer in [0, ");
        accel_clear_error();
    }
    setenv("ACCELERATE_FP8_MARGIN", "-7", 1);
    accel_accelerator_opts bf16 = {.mixed_precision = "bf16"};
    accel_accelerator *acc = accel_accelerator_new(&bf16);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    accel_accelerator_free(acc);
    CHECK(accel_accelerator_new(&fp8) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "ACCELERATE_FP8_MARGIN=-7 must be an integer");
    accel_clear_error();
    unsetenv("ACCELERATE_FP8_MARGIN");
}

/* A model with fp8-eligible Linears on the cpu is refused at prepare (no
 * silent CPU reference), naming the device; one with none to convert passes. */
static void test_check_devices(void) {
    accel_module *m = accel_linear_new(32, 48, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel__fp8_check_devices(m, "accel_accelerator_prepare") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_prepare: fp8 mixed precision is not supported on cpu");
    accel_clear_error();
    accel_module *odd = accel_linear_new(30, 17, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel__fp8_check_devices(odd, "accel_accelerator_prepare") == ACCEL_OK);
    accel_module_free(m);
    accel_module_free(odd);
}

/* meta k of m (the Sequential's child k) on the host, [ROWS(hist), 3]. */
static void meta_values(accel_module *m, int k, float *out) {
    CHECK(accel_tensor_to_host(accel__module_tensor(m->children[k], "fp8_meta"), out) == ACCEL_OK);
}

static accel_module *two_fp8_linears(int history_len) {
    accel_module *kids[2] = {accel_linear_new(32, 48, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                             accel_linear_new(48, 32, false, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *m = accel_sequential_new(2, kids);
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = history_len;
    CHECK(accel__fp8_convert_model(m, r) == ACCEL_OK);
    return m;
}

/* The fp8 metas through save_state / load_state as the Accelerator writes
 * them (model.safetensors, like TE's _extra_state): scales, scale_invs and
 * the amax history come back exactly; a checkpoint of another
 * amax_history_len is refused naming the buffer. The fp8 forward itself
 * needs a GPU, so the metas here get their values from the CPU reference. */
static void test_checkpoint_round_trip(void) {
    enum { H = 8, N = ACCEL__FP8_META_ROWS(H) * ACCEL__FP8_SLOTS };
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/accel_fp8_ckpt_%d", (int)getpid());
    accel_module *m = two_fp8_linears(H);
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = H;
    const accel__fp8_recipe *prev = accel__fp8_autocast_begin(&r);
    for (int step = 0; step < 3; step++) { /* three steps of the CPU reference: scales and history move */
        accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(16, 32), 0.5 + step);
        accel_tensor *y = accel_module_call(m, x);
        CHECK(y && accel_backward_with(y, accel_full(ACCEL_F32, ACCEL_SHAPE(16, 32), 1e-3 * (step + 1))) == ACCEL_OK);
        accel_step_reset();
    }
    accel__fp8_autocast_end(prev);
    float saved[2][N], now[N];
    for (int k = 0; k < 2; k++) meta_values(m, k, saved[k]);
    CHECK(saved[0][ACCEL__FP8_X] == 448.0f / 2.5f && saved[0][ACCEL__FP8_DY] != 1.0f);

    accel_accelerator_opts o = {.cpu = true, .project_dir = dir};
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc && accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(accel_accelerator_save_state(acc, dir, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    for (int k = 0; k < 2; k++) CHECK(accel_zero_(accel__module_tensor(m->children[k], "fp8_meta")) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_load_state(acc, dir, NULL) == ACCEL_OK, "%s", accel_last_error());
    for (int k = 0; k < 2; k++) {
        meta_values(m, k, now);
        CHECK_MSG(!memcmp(now, saved[k], sizeof now), "meta %d changed through the checkpoint", k);
    }
    accel_accelerator_free(acc);
    accel_module_free(m);

    accel_module *other = two_fp8_linears(4); /* amax_history_len 4 */
    acc = accel_accelerator_new(&o);
    CHECK(acc && accel_accelerator_prepare_model(acc, other) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(acc, dir, NULL) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "fp8_meta");
    accel_clear_error();
    accel_accelerator_free(acc);
    accel_module_free(other);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* override_linear_precision: each flag runs its GEMM on the unrounded
 * operands (f32 here: no autocast) and leaves the other two in fp8; a
 * tensor no fp8 GEMM reads is not cast (its amax stays 0). With the
 * initial scales of 1 the fp8 GEMMs are ~5% off the exact ones, so an
 * ignored flag fails the 1e-5 bound. */
static void test_override_precision(void) {
    static const char *const NAME[3] = {"fprop", "dgrad", "wgrad"};
    for (int g = 0; g < ACCEL__FP8_GEMMS; g++) {
        accel__fp8_recipe r = accel__fp8_recipe_default();
        r.history_len = LEN, r.high_precision[g] = true;
        accel_tensor *x = param(2, (int64_t[]){R, I}, 3.0f), *w = param(2, (int64_t[]){O, I}, 0.7f);
        accel_tensor *b = param(1, (int64_t[]){O}, 0.5f), *meta = accel__fp8_meta_new(LEN, ACCEL_CPU_DEVICE);
        static float dy[R * O];
        for (int i = 0; i < R * O; i++) dy[i] = 2.0f * rnd();
        const float *xv = x->data, *wv = w->data;
        const accel__fp8_format E4 = ACCEL_FP8_E4M3, E5 = ACCEL_FP8_E5M2;
        const bool hf = g == ACCEL__FP8_FPROP, hd = g == ACCEL__FP8_DGRAD, hw = g == ACCEL__FP8_WGRAD;
        static double want[R * I > O * I ? R * I : O * I];
        accel_tensor *y = accel__fp8_linear(x, w, b, meta, r);
        CHECK_MSG(y != NULL, "%s", accel_last_error());
        if (!y) continue;
        ref_gemm(want, (ref_operand){xv, I, 1, 1.0f, E4, hf}, (ref_operand){wv, I, 1, 1.0f, E4, hf}, R, O, I);
        for (int i = 0; i < R * O; i++) want[i] += ((const float *)b->data)[i % O];
        CHECK_MSG(worst_error(y->data, want, R * O) < 1e-5, "%s overridden: forward %g", NAME[g],
                  worst_error(y->data, want, R * O));
        CHECK(accel_backward_with(y, accel_from_floats(2, y->shape, dy)) == ACCEL_OK);
        ref_gemm(want, (ref_operand){dy, O, 1, 1.0f, E5, hd}, (ref_operand){wv, 1, I, 1.0f, E4, hd}, R, I, O);
        CHECK_MSG(worst_error(x->grad->data, want, R * I) < 1e-5, "%s overridden: dX %g", NAME[g],
                  worst_error(x->grad->data, want, R * I));
        ref_gemm(want, (ref_operand){dy, 1, O, 1.0f, E5, hw}, (ref_operand){xv, 1, I, 1.0f, E4, hw}, O, I, R);
        CHECK_MSG(worst_error(w->grad->data, want, O * I) < 1e-5, "%s overridden: dW %g", NAME[g],
                  worst_error(w->grad->data, want, O * I));
        accel_step_reset();
        accel_tensor *ts[] = {x, w, b, meta};
        for (int i = 0; i < 4; i++) accel_tensor_free(ts[i]);
    }
    /* fprop and wgrad overridden: x feeds no fp8 GEMM, so it is not cast */
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = LEN, r.high_precision[ACCEL__FP8_FPROP] = r.high_precision[ACCEL__FP8_WGRAD] = true;
    accel_tensor *x = param(2, (int64_t[]){R, I}, 3.0f), *w = param(2, (int64_t[]){O, I}, 0.7f);
    accel_tensor *meta = accel__fp8_meta_new(LEN, ACCEL_CPU_DEVICE);
    accel_tensor *y = accel__fp8_linear(x, w, NULL, meta, r);
    CHECK(y && accel_backward_with(y, accel_ones(ACCEL_F32, ACCEL_SHAPE(R, O))) == ACCEL_OK);
    const float *mv = meta->data;
    for (int k = 0; k < LEN; k++) CHECK(accel__fp8_meta_amax((float *)mv, ACCEL__FP8_X)[k * ACCEL__FP8_SLOTS] == 0.0f);
    CHECK(mv[ACCEL__FP8_X] == 1.0f && mv[ACCEL__FP8_W] == 448.0f / max_abs(w->data, O * I) && mv[ACCEL__FP8_DY] != 1.0f);
    accel_step_reset();
    accel_tensor_free(x), accel_tensor_free(w), accel_tensor_free(meta);
}

/* The metas of model k of acc, on the host, [2][ROWS(H) * SLOTS]. */
enum { H2 = 4, NM = ACCEL__FP8_META_ROWS(H2) * ACCEL__FP8_SLOTS };
static void model_metas(accel_module *m, float out[2][NM]) {
    for (int k = 0; k < 2; k++) meta_values(m, k, out[k]);
}

/* Two prepared fp8 models, a backward through one of them only: the other's
 * dY scale and history stay as they were (TE updates the modules that ran),
 * the first one's move. The cpu refuses mixed_precision='fp8', so the
 * accelerator is made plain and switched to fp8 the way prepare does it on a
 * GPU (its fp8 part without the device check); the forwards run under the
 * fp8 autocast by hand, the backward is accel_accelerator_backward's. The
 * forward's log does the same for X and W (a forward of one model only). */
static void test_update_only_models_that_ran(void) {
    accel_accelerator_opts o = {.cpu = true};
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_module *m[2] = {two_fp8_linears(H2), two_fp8_linears(H2)};
    CHECK(acc && accel_accelerator_prepare_model(acc, m[0]) == ACCEL_OK &&
          accel_accelerator_prepare_model(acc, m[1]) == ACCEL_OK);
    acc->mp = ACCEL_MP_FP8;
    acc->fp8 = accel__fp8_recipe_default();
    acc->fp8.history_len = H2, acc->fp8.deferred_update = true;
    for (int k = 0; k < 2; k++) CHECK(accel__fp8_prepare(acc, &acc->models[k]) == ACCEL_OK);
    float before[2][NM], after[2][NM];
    for (int step = 0; step < 2; step++) {
        accel_tensor *y[2];
        const accel__fp8_recipe *prev = accel__fp8_autocast_begin(&acc->fp8);
        for (int k = 0; k < 2; k++) y[k] = accel_module_call(m[k], accel_full(ACCEL_F32, ACCEL_SHAPE(16, 32), 1.0 + k));
        accel__fp8_autocast_end(prev);
        for (int k = 0; k < 2; k++)
            CHECK(accel__fp8_reduce_and_update(NULL, acc->models[k].fp8, ACCEL__FP8_X, 2, acc->fp8, NULL) == ACCEL_OK);
        model_metas(m[1], before);
        /* step 0 through both (m[1] gets a dY history), step 1 through m[0] only */
        accel_tensor *loss = accel_sum_all(y[0]);
        if (step == 0) loss = accel_add(loss, accel_sum_all(y[1]));
        CHECK(accel_accelerator_backward(acc, loss) == ACCEL_OK);
        model_metas(m[1], after);
        if (step == 0) CHECK(after[0][ACCEL__FP8_DY] != before[0][ACCEL__FP8_DY]);
        else CHECK_MSG(!memcmp(before, after, sizeof before), "the model outside the loss had its dY scaling updated");
        accel_step_reset();
    }
    float m0[2][NM];
    model_metas(m[0], m0);
    CHECK(m0[0][2 * ACCEL__FP8_SLOTS + (H2 - 1) * ACCEL__FP8_SLOTS + ACCEL__FP8_DY] > 0.0f); /* m[0] updated */

    /* a forward of m[0] alone: m[1]'s X and W stay */
    accel__fp8_state *s1 = acc->models[1].fp8;
    model_metas(m[1], before);
    const accel__fp8_recipe *prev = accel__fp8_autocast_begin(&acc->fp8);
    accel__fp8_log *lprev = accel__fp8_log_begin(&s1->forward);
    CHECK(accel_module_call(m[0], accel_ones(ACCEL_F32, ACCEL_SHAPE(16, 32))) != NULL);
    accel__fp8_log_end(lprev);
    accel__fp8_autocast_end(prev);
    for (int k = 0; k < s1->n; k++) CHECK(!accel__fp8_log_has(&s1->forward, s1->metas[k]));
    CHECK(accel__fp8_reduce_and_update(NULL, s1, ACCEL__FP8_X, 2, acc->fp8, &s1->forward) == ACCEL_OK);
    model_metas(m[1], after);
    CHECK(!memcmp(before, after, sizeof before));
    accel_step_reset();
    accel_accelerator_free(acc);
    for (int k = 0; k < 2; k++) accel_module_free(m[k]);
}

/* ---- the weight cache: a cast per weight version and scale */

enum { CSTEPS = 3, ACCUM = 4, CROWS = ACCEL__FP8_META_ROWS(H2) * ACCEL__FP8_SLOTS };

typedef struct cache_trace {
    float y[CSTEPS * ACCUM];                       /* sum of each micro-batch's output */
    float metas[CSTEPS][2][CROWS], w[CSTEPS][48 * 32];
    uint64_t casts[CSTEPS], hits[CSTEPS];          /* accel__fp8_cache_stats over each step */
} cache_trace;

/* Writes every weight of m with the values it holds (a new version). */
static void rewrite_weights(accel_module *m) {
    float v[48 * 32];
    for (int k = 0; k < 2; k++) {
        accel_tensor *w = accel__module_tensor(m->children[k], "weight");
        CHECK(accel_to_floats(w, v) == ACCEL_OK && accel_tensor_from_host(w, v) == ACCEL_OK);
    }
}

/* CSTEPS SGD steps (lr; 0: the weights only rewritten unchanged) of ACCUM
 * micro-batches on two fp8 Linears, as a prepared fp8 model runs them (the
 * hook's forward log and weight cache, deferred updates after each forward
 * and backward), the step arena reset after each micro-batch. */
static void cache_train(double lr, cache_trace *t) {
    accel_manual_seed(7);
    accel_module *m = two_fp8_linears(H2);
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = H2, r.deferred_update = true;
    accel__fp8_state *fs;
    accel__fp8_log bwd = {0};
    CHECK(accel__fp8_state_new(m, &fs) == ACCEL_OK && accel__fp8_log_reserve(&bwd, fs->n) == ACCEL_OK);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, lr > 0 ? lr : 1.0);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
    for (int s = 0; s < CSTEPS; s++) {
        accel__fp8_cache_stats st0 = accel__fp8_cache_stats_get();
        for (int k = 0; k < ACCUM; k++) {
            accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(16, 32));
            float v[16 * 32];
            for (int i = 0; i < 16 * 32; i++) v[i] = rnd() * (1.0f + (float)k);
            CHECK(accel_tensor_from_host(x, v) == ACCEL_OK);
            accel_tensor *y = fp8_hooked_forward(m, x, &r, fs);
            CHECK_MSG(y != NULL, "%s", accel_last_error());
            if (!y) break;
            accel_tensor *loss = accel_sum_all(accel_mul(y, y));
            t->y[s * ACCUM + k] = (float)accel_item(loss);
            accel__fp8_log *lp = accel__fp8_log_begin(&bwd);
            CHECK(accel_backward(loss) == ACCEL_OK);
            accel__fp8_log_end(lp);
            CHECK(accel__fp8_reduce_and_update(NULL, fs, ACCEL__FP8_DY, 1, r, &bwd) == ACCEL_OK);
            accel_step_reset();
        }
        if (lr > 0) CHECK(accel_optimizer_step(opt) == ACCEL_OK);
        else rewrite_weights(m);
        accel_optimizer_zero_grad(opt);
        accel_step_reset();
        accel__fp8_cache_stats st1 = accel__fp8_cache_stats_get();
        t->casts[s] = st1.casts - st0.casts, t->hits[s] = st1.hits - st0.hits;
        model_metas(m, t->metas[s]);
        CHECK(accel_to_floats(accel__module_tensor(m->children[1], "weight"), t->w[s]) == ACCEL_OK);
    }
    accel_optimizer_free(opt);
    accel__fp8_log_free(&bwd);
    accel__fp8_state_free(fs);
    accel_module_free(m);
}

/* Gradient accumulation 4: with the cache the outputs, the weights and the
 * scaling state are bit-identical to a cast per call (the registry off), and
 * each weight is cast when it was written (the first micro-batch of a step)
 * and when its scale moved (delayed scaling moves it once after the first
 * cast of new values: the second micro-batch), else reused: at most 2 casts
 * and at least 2 reuses per weight per step, instead of 4 casts. With the
 * weights written but unchanged the scale stays: one cast per weight
 * per step. */
static void test_weight_cache(void) {
    static cache_trace on, off, same;
    g_rng = 99;
    cache_train(0.05, &on);
    bool was = accel__prepared_set_enabled(false);
    g_rng = 99;
    cache_train(0.05, &off);
    accel__prepared_set_enabled(was);
    CHECK_MSG(!memcmp(on.y, off.y, sizeof on.y), "outputs differ with the weight cache");
    CHECK(on.y[0] > 0.0f && on.w[1][0] != on.w[0][0]); /* it ran, and SGD moved the weights */
    CHECK_MSG(!memcmp(on.metas, off.metas, sizeof on.metas), "scaling state differs with the weight cache");
    CHECK_MSG(!memcmp(on.w, off.w, sizeof on.w), "weights differ with the weight cache");
    CHECK(off.casts[0] == 0 && off.hits[0] == 0); /* off: every call casts into the step arena */
    CHECK_MSG(on.casts[0] == 2 * 2 && on.hits[0] == 2 * 2, "step 1: %llu casts, %llu reuses for 2 weights",
              (unsigned long long)on.casts[0], (unsigned long long)on.hits[0]);
    for (int s = 1; s < CSTEPS; s++)
        CHECK_MSG(on.casts[s] <= 2 * 2 && on.casts[s] >= 2 && on.casts[s] + on.hits[s] == 2 * ACCUM,
                  "step %d: %llu casts, %llu reuses", s + 1, (unsigned long long)on.casts[s],
                  (unsigned long long)on.hits[s]);
    g_rng = 99;
    cache_train(0.0, &same);
    for (int s = 1; s < CSTEPS; s++)
        CHECK_MSG(same.casts[s] == 2 && same.hits[s] == 2 * (ACCUM - 1), "rewritten weights, step %d: %llu casts, %llu reuses",
                  s + 1, (unsigned long long)same.casts[s], (unsigned long long)same.hits[s]);
}

/* Five fp8 Linears (each a row of the cache's state): two steps with the
 * weights written between them give, cached, what a cast per call gives.
 * The rows were indexed 4 floats apart in a state of 3 per row: the last
 * Linears' caches lay past the end of the state (ASan reports it). */
static accel_module *five_fp8_linears(void) {
    accel_module *kids[5];
    for (int k = 0; k < 5; k++) kids[k] = accel_linear_new(32, 32, k % 2 == 0, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_module *m = accel_sequential_new(5, kids);
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = H2;
    CHECK(accel__fp8_convert_model(m, r) == ACCEL_OK);
    return m;
}

static void five_linear_outputs(float out[2][16 * 32]) {
    accel_manual_seed(3);
    accel_module *m = five_fp8_linears();
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = H2, r.deferred_update = true;
    accel__fp8_state *fs;
    CHECK(accel__fp8_state_new(m, &fs) == ACCEL_OK && fs->n == 5);
    for (int s = 0; s < 2; s++) {
        accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(16, 32), 0.5 - s);
        accel_tensor *y = fp8_hooked_forward(m, x, &r, fs);
        CHECK_MSG(y && accel_to_floats(y, out[s]) == ACCEL_OK, "%s", accel_last_error());
        accel_step_reset();
        rewrite_weights(m);
    }
    accel__fp8_state_free(fs);
    accel_module_free(m);
}

static void test_weight_cache_rows(void) {
    static float on[2][16 * 32], off[2][16 * 32];
    accel__fp8_cache_stats st0 = accel__fp8_cache_stats_get();
    five_linear_outputs(on);
    accel__fp8_cache_stats st1 = accel__fp8_cache_stats_get();
    bool was = accel__prepared_set_enabled(false);
    five_linear_outputs(off);
    accel__prepared_set_enabled(was);
    CHECK_MSG(st1.casts - st0.casts >= 5, "%llu casts for 5 weights over 2 steps",
              (unsigned long long)(st1.casts - st0.casts));
    CHECK_MSG(!memcmp(on, off, sizeof on), "5 cached fp8 Linears differ from a cast per call");
}

/* A Linear called twice in one step casts into the step arena the second
 * time (the first call's backward may read its cast); a weight written
 * between two steps is cast again; both give what a cast per call gives. */
static void test_weight_cache_same_step(void) {
    accel_module *m = two_fp8_linears(H2);
    accel_module *lin = m->children[0];
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = H2, r.deferred_update = true; /* the scales stay between the calls */
    accel__fp8_state *fs;
    CHECK(accel__fp8_state_new(m, &fs) == ACCEL_OK);
    float y1[16 * 48], y2[16 * 48], want[16 * 48];
    const accel__fp8_recipe *prev = accel__fp8_autocast_begin(&r);
    accel__fp8_cache *cp = accel__fp8_cache_begin(&fs->cache);
    accel__fp8_cache_stats st0 = accel__fp8_cache_stats_get();
    accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(16, 32), 0.25);
    CHECK(accel_to_floats(accel_module_call(lin, x), y1) == ACCEL_OK);
    CHECK(accel_to_floats(accel_module_call(lin, x), y2) == ACCEL_OK);
    accel__fp8_cache_stats st1 = accel__fp8_cache_stats_get();
    CHECK(st1.casts - st0.casts == 1 && st1.hits == st0.hits && !memcmp(y1, y2, sizeof y1));
    accel_step_reset();
    accel_tensor *w = accel__module_tensor(lin, "weight");
    float wv[48 * 32];
    CHECK(accel_to_floats(w, wv) == ACCEL_OK);
    for (int i = 0; i < 48 * 32; i++) wv[i] *= -2.0f;
    CHECK(accel_tensor_from_host(w, wv) == ACCEL_OK); /* a write: the next call casts again */
    x = accel_full(ACCEL_F32, ACCEL_SHAPE(16, 32), 0.25);
    CHECK(accel_to_floats(accel_module_call(lin, x), y1) == ACCEL_OK);
    accel__fp8_cache_stats st2 = accel__fp8_cache_stats_get();
    CHECK(st2.casts - st1.casts == 1);
    bool was = accel__prepared_set_enabled(false);
    CHECK(accel_to_floats(accel_module_call(lin, x), want) == ACCEL_OK);
    accel__prepared_set_enabled(was);
    CHECK(!memcmp(y1, want, sizeof y1));
    accel__fp8_cache_end(cp);
    accel__fp8_autocast_end(prev);
    accel_step_reset();
    accel__fp8_state_free(fs);
    accel_module_free(m);
}

/* Two prepared models' fp8 states over one weight (Linears 0 and 1 of m,
 * 1's weight tied to 0's; model A is Linear 0, model B Linear 1, each with
 * its own meta and cache): A casts and its scale moves, A recasts, B casts
 * with its first scale into the weight's forms, then A again. A's cache
 * matched its scale, but the bytes were B's cast: the forms are keyed by
 * the cache row that made them, so A's last call gives what a cast per call
 * gives. */
static void shared_weight_outputs(float out[4][16 * 32]) {
    accel_manual_seed(5);
    accel_module *kids[2] = {accel_linear_new(32, 32, false, ACCEL_CPU_DEVICE, ACCEL_F32),
                             accel_linear_new(32, 32, false, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *m = accel_sequential_new(2, kids);
    CHECK(accel_module_tie(m, "1.weight", "0.weight") == ACCEL_OK);
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = H2;
    CHECK(accel__fp8_convert_model(m, r) == ACCEL_OK);
    r.deferred_update = true; /* as a prepared model: the hook updates the scales after each forward */
    accel__fp8_state *a = NULL, *b = NULL;
    CHECK(accel__fp8_state_new(m->children[0], &a) == ACCEL_OK && accel__fp8_state_new(m->children[1], &b) == ACCEL_OK);
    accel_module *who[4] = {m->children[0], m->children[0], m->children[1], m->children[0]};
    accel__fp8_state *state[4] = {a, a, b, a};
    for (int k = 0; k < 4; k++) {
        accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(16, 32), 0.75);
        accel_tensor *y = fp8_hooked_forward(who[k], x, &r, state[k]);
        CHECK_MSG(y && accel_to_floats(y, out[k]) == ACCEL_OK, "%s", accel_last_error());
        accel_step_reset();
    }
    accel__fp8_state_free(a);
    accel__fp8_state_free(b);
    accel_module_free(m);
}

static void test_weight_cache_two_states(void) {
    static float on[4][16 * 32], off[4][16 * 32];
    shared_weight_outputs(on);
    bool was = accel__prepared_set_enabled(false);
    shared_weight_outputs(off);
    accel__prepared_set_enabled(was);
    for (int k = 0; k < 4; k++)
        CHECK_MSG(!memcmp(on[k], off[k], sizeof on[k]), "call %d (model %c) differs from a cast per call", k + 1,
                  k == 2 ? 'B' : 'A');
}

int main(void) {
    RUN(test_known_codes);
    RUN(test_round_trips);
    RUN(test_delayed_scaling);
    RUN(test_fp8_linear_reference);
    RUN(test_fp8_linear_errors);
    RUN(test_architecture_without_metas);
    RUN(test_convert_model);
    RUN(test_refused);
    RUN(test_recipe_options);
    RUN(test_check_devices);
    RUN(test_checkpoint_round_trip);
    RUN(test_override_precision);
    RUN(test_update_only_models_that_ran);
    RUN(test_weight_cache);
    RUN(test_weight_cache_same_step);
    RUN(test_weight_cache_rows);
    RUN(test_weight_cache_two_states);
    return check_summary();
}
