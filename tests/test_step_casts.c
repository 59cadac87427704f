/* Step tensors' conversions made once (src/core/step_casts.h): under
 * autocast, the GEMM ops that read one activation share its conversion.
 *   - three Linears of one input (a layer's q, k, v) save one operand, not
 *     three, two of a later input (gate, up) one too, and their outputs and gradients are the bits of three separate
 *     conversions (the cache off: accel__prepared_set_enabled(false));
 *   - a write to the source (accel_copy_, accel_fill_, a view's write,
 *     accel_tensor_increment_version) makes the next op convert again;
 *   - an arena rewind (activation checkpointing's) or a step reset that frees
 *     a conversion is never handed out again, even when new tensors take the
 *     same addresses.
 *   - a decoder's norms (accel__rms_norm_with_roles, ops/norm.h) hand the
 *     Linear after them their output rounded in the norm's own pass, where
 *     the GEMMs multiply the autocast dtype itself, and the residual sum's
 *     branch its gradient rounded in the backward's pass; the same bits as
 *     accel_rms_norm then a conversion, and nothing stale handed out after
 *     a write or a rewind.
 * tests/gemm.cmake runs it under each GEMM provider: OpenBLAS reads the
 * operands rounded and widened to f32 (ROUNDED_F32), oneDNN on bf16 units the
 * bf16 copies (CAST). */
#include "accel/accel.h"
#include "check.h"
#include "backends/cpu/gemm.h"
#include "core/prepared.h"
#include "core/step_casts.h"
#include "ops/norm.h"
#include "tiny_llama.h"

enum { R = 24, IN = 16, OUT = 8 };

static accel_tensor *weight(uint64_t seed) {
    accel_tensor *w = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(OUT, IN), ACCEL_CPU_DEVICE);
    accel_rng r;
    CHECK(w && accel_rng_init(&r, seed) == ACCEL_OK && accel_rng_normal_(&r, w, 0.0, 0.5) == ACCEL_OK);
    CHECK(accel_requires_grad_(w, true) == ACCEL_OK);
    return w;
}

/* x [R, IN], values from seed (f32, not representable in bf16). */
static accel_tensor *input(uint64_t seed) {
    float v[R * IN];
    for (int i = 0; i < R * IN; i++) v[i] = (float)((i * 37 + (int)seed * 11) % 97) / 13.0f - 3.3f + 1e-4f * (float)i;
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(R, IN), v);
    CHECK(x && accel_requires_grad_(x, true) == ACCEL_OK);
    return x;
}

static accel_tensor *saved_operand(const accel_tensor *y) { return y && y->grad_fn ? y->grad_fn->saved[0] : NULL; }

static bool same_bits(const accel_tensor *a, const accel_tensor *b) {
    float fa[R * IN], fb[R * IN];
    return a && b && accel_numel(a) == accel_numel(b) && accel_numel(a) <= R * IN &&
           accel_to_floats(a, fa) == ACCEL_OK && accel_to_floats(b, fb) == ACCEL_OK &&
           !memcmp(fa, fb, sizeof(float) * (size_t)accel_numel(a));
}

typedef struct run {
    float y[3][R * OUT];
    float gx[R * IN], gw[3][OUT * IN];
    bool shared, shared2;
} run;

/* q, k, v = three Linears of one x under bf16 autocast; after a rewind of
 * scratch memory (a GEMM's own), gate and up of a second input x2; then the
 * backward of their sum. */
static void three_linears(accel_tensor *const w[3], run *out) {
    accel_tensor *x = input(1), *y[3];
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    for (int i = 0; i < 3; i++) y[i] = accel_linear(x, w[i], NULL);
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    CHECK(accel_empty(ACCEL_F32, ACCEL_SHAPE(R, IN)) && accel_arena_rewind(a, m) == ACCEL_OK);
    accel_tensor *x2 = input(2), *g = accel_linear(x2, w[0], NULL), *u = accel_linear(x2, w[1], NULL);
    accel_autocast_end(prev);
    out->shared = saved_operand(y[0]) && saved_operand(y[0]) == saved_operand(y[1]) &&
                  saved_operand(y[1]) == saved_operand(y[2]);
    out->shared2 = saved_operand(g) && saved_operand(g) == saved_operand(u) && saved_operand(g) != saved_operand(y[0]);
    accel_tensor *loss = accel_add(accel_sum_all(accel_add(accel_add(y[0], y[1]), y[2])), accel_sum_all(accel_mul(g, u)));
    CHECK(loss && accel_backward(loss) == ACCEL_OK && x->grad);
    for (int i = 0; i < 3; i++) {
        CHECK(accel_to_floats(y[i], out->y[i]) == ACCEL_OK && w[i]->grad);
        CHECK(accel_to_floats(w[i]->grad, out->gw[i]) == ACCEL_OK && accel_zero_(w[i]->grad) == ACCEL_OK);
    }
    CHECK(accel_to_floats(x->grad, out->gx) == ACCEL_OK);
    accel_step_reset();
}

static void test_shared_and_identical(void) {
    accel_tensor *w[3] = {weight(1), weight(2), weight(3)};
    run *on = calloc(1, sizeof *on), *off = calloc(1, sizeof *off);
    three_linears(w, on);
    bool was = accel__prepared_set_enabled(false);
    three_linears(w, off);
    accel__prepared_set_enabled(was);
    CHECK_MSG(on->shared, "k and v should read q's conversion of x");
    CHECK_MSG(on->shared2, "up should read gate's conversion of x2 (a rewind before x2 freed nothing of it)");
    CHECK_MSG(!off->shared && !off->shared2, "with the cache off every Linear converts x itself");
    CHECK(!memcmp(on->y, off->y, sizeof on->y));
    CHECK(!memcmp(on->gx, off->gx, sizeof on->gx));
    CHECK(!memcmp(on->gw, off->gw, sizeof on->gw));
    free(on);
    free(off);
    for (int i = 0; i < 3; i++) accel_tensor_free(w[i]);
}

/* A Linear of x after `write` changed x: it converts again, and reads the new values. */
typedef accel_status (*writer)(accel_tensor *x);
static accel_status write_copy(accel_tensor *x) { return accel_copy_(x, input(2)); }
static accel_status write_fill(accel_tensor *x) { return accel_fill_(x, 0.375); }
static accel_status write_view(accel_tensor *x) {
    accel_tensor *row = accel_view_raw(x, ACCEL_SHAPE(IN), (const int64_t[]){1}, 5 * IN);
    return row ? accel_fill_(row, -2.0) : accel_last_status();
}
static accel_status write_host(accel_tensor *x) {
    ((float *)x->data)[7] = 123.0f;
    return accel_tensor_increment_version(x);
}

static void check_write_forgets(writer write) {
    accel_tensor *w = weight(4);
    accel_set_grad_enabled(false);
    accel_tensor *x = input(1);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *before = accel_linear(x, w, NULL);
    CHECK(write(x) == ACCEL_OK);
    accel_tensor *after = accel_linear(x, w, NULL);
    /* the reference: the new values in a tensor of their own */
    accel_tensor *fresh = accel_empty(ACCEL_F32, ACCEL_SHAPE(R, IN));
    CHECK(fresh && accel_copy_(fresh, x) == ACCEL_OK);
    accel_tensor *want = accel_linear(fresh, w, NULL);
    accel_autocast_end(prev);
    accel_set_grad_enabled(true);
    CHECK(before && after && want);
    CHECK_MSG(same_bits(after, want), "a Linear after the write read the conversion of the old values");
    CHECK(!same_bits(before, after));
    accel_step_reset();
    accel_tensor_free(w);
}

static void test_write_forgets(void) {
    check_write_forgets(write_copy);
    check_write_forgets(write_fill);
    check_write_forgets(write_view);
    check_write_forgets(write_host);
}

/* The conversion made after a mark, freed by the rewind to it: a new tensor
 * at the old one's address (same shape, other values) converts anew. The
 * same across a step reset. */
static void test_rewind_and_reset_forget(void) {
    accel_tensor *w = weight(5);
    accel_set_grad_enabled(false);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    for (int reset = 0; reset < 2; reset++) {
        accel_arena *a = accel_step_arena();
        accel_arena_mark m = accel_arena_mark_now(a);
        accel_tensor *x1 = input(1);
        CHECK(accel_linear(x1, w, NULL) != NULL);
        void *at = x1->data;
        if (reset) accel_step_reset();
        else CHECK(accel_arena_rewind(a, m) == ACCEL_OK);
        accel_tensor *x2 = input(3);
        CHECK_MSG(x2->data == at, "the arena should give the new input the old one's address");
        accel_tensor *got = accel_linear(x2, w, NULL);
        accel_tensor *fresh = accel_empty(ACCEL_F32, ACCEL_SHAPE(R, IN));
        CHECK(fresh && accel_copy_(fresh, x2) == ACCEL_OK);
        CHECK_MSG(same_bits(got, accel_linear(fresh, w, NULL)), "a freed conversion was handed out (%s)",
                  reset ? "reset" : "rewind");
        accel_step_reset();
    }
    accel_autocast_end(prev);
    accel_set_grad_enabled(true);
    accel_tensor_free(w);
}

/* ---- the RMSNorm's rounded copy (ops/norm.h) */

static int g_made;
static accel_tensor *count_made(accel_tensor *src, int kind, accel_dtype dt) {
    (void)src, (void)kind, (void)dt;
    g_made++;
    return NULL;
}

/* What one norm-then-Linear step gave. */
typedef struct norm_run {
    float h[R * IN], y[R * OUT], gx[R * IN], gw[OUT * IN], gnw[IN];
    bool offered;     /* the norm's output had a conversion before any GEMM */
    bool copy_bits;   /* ... holding its output rounded as a copy rounds */
    bool saved_it;    /* ... and the Linear saved that conversion as its operand */
} norm_run;

/* h = RMSNorm(x) (gemm_input: ACCEL__NORM_OUT_TO_GEMMS, ops/norm.h), y = Linear(h)
 * under autocast dt, then the backward of sum(y). */
static void norm_then_linear(bool gemm_input, accel_dtype dt, accel_tensor *w, accel_tensor *nw, norm_run *out) {
    accel_tensor *x = input(6);
    accel_dtype prev = accel_autocast_begin(dt);
    accel_tensor *h = gemm_input ? accel__rms_norm_with_roles(x, nw, 1e-6, ACCEL__NORM_OUT_TO_GEMMS) : accel_rms_norm(x, nw, 1e-6);
    CHECK(h && h->dtype == ACCEL_F32);
    g_made = 0;
    accel_tensor *c = accel__step_cast(h, ACCEL__FORM_CAST, dt, count_made);
    out->offered = c && !g_made;
    if (!c) accel_clear_error();
    accel_tensor *want = accel_empty(dt, ACCEL_SHAPE(R, IN));
    CHECK(want && accel_copy_(want, h) == ACCEL_OK);
    out->copy_bits = c && !memcmp(c->data, want->data, accel_nbytes(want));
    accel_tensor *y = accel_linear(h, w, NULL);
    accel_autocast_end(prev);
    out->saved_it = c && saved_operand(y) == c;
    CHECK(y && accel_backward(accel_sum_all(y)) == ACCEL_OK && x->grad && nw->grad);
    CHECK(accel_to_floats(h, out->h) == ACCEL_OK && accel_to_floats(y, out->y) == ACCEL_OK);
    CHECK(accel_to_floats(x->grad, out->gx) == ACCEL_OK && accel_to_floats(w->grad, out->gw) == ACCEL_OK);
    CHECK(accel_to_floats(nw->grad, out->gnw) == ACCEL_OK);
    CHECK(accel_zero_(w->grad) == ACCEL_OK && accel_zero_(nw->grad) == ACCEL_OK);
    accel_step_reset();
    accel_tensor_free(x);
}

/* Under autocast, where the CPU's GEMMs multiply the autocast dtype itself
 * (accel__gemm_native: oneDNN on bf16 units, not OpenBLAS, which reads
 * operands widened), the norm's kernel rounds its output for the GEMMs and
 * offers it as the output's conversion: no conversion is made, its bits
 * are a copy's, the Linear saves it; elsewhere, with the cache off, or under
 * the reference kernels, the same rule. Output, Linear and gradients are
 * accel_rms_norm's bits either way. */
static void test_norm_offers_its_rounding(void) {
    accel_tensor *w = weight(7), *nw = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(IN), ACCEL_CPU_DEVICE);
    float v[IN];
    for (int i = 0; i < IN; i++) v[i] = 0.5f + 0.0625f * (float)i;
    CHECK(nw && accel_tensor_from_host(nw, v) == ACCEL_OK && accel_requires_grad_(nw, true) == ACCEL_OK);
    const accel_dtype dts[] = {ACCEL_BF16, ACCEL_F16};
    for (int d = 0; d < 2; d++)
        for (int mode = 0; mode < 3; mode++) { /* 0: as is, 1: the cache off, 2: the reference kernels */
            bool was_cache = accel__prepared_set_enabled(mode != 1), was_ref = accel_set_reference_kernels(mode == 2);
            bool expect = mode != 1 && accel__gemm_native(dts[d]);
            norm_run *fused = calloc(1, sizeof *fused), *plain = calloc(1, sizeof *plain);
            norm_then_linear(true, dts[d], w, nw, fused);
            norm_then_linear(false, dts[d], w, nw, plain);
            const char *dn = accel_dtype_name(dts[d]);
            CHECK_MSG(fused->offered == expect, "%s, mode %d: the norm's copy offered %d, expected %d", dn, mode,
                      fused->offered, expect);
            CHECK_MSG(!plain->offered, "%s, mode %d: accel_rms_norm offered a conversion", dn, mode);
            if (expect) {
                CHECK_MSG(fused->copy_bits, "%s, mode %d: the norm's copy is not its output's rounding", dn, mode);
                CHECK_MSG(fused->saved_it, "%s, mode %d: the Linear did not read the norm's copy", dn, mode);
            }
            CHECK_MSG(!memcmp(fused->h, plain->h, sizeof fused->h) && !memcmp(fused->y, plain->y, sizeof fused->y),
                      "%s, mode %d: the values differ from accel_rms_norm's", dn, mode);
            CHECK_MSG(!memcmp(fused->gx, plain->gx, sizeof fused->gx) && !memcmp(fused->gw, plain->gw, sizeof fused->gw) &&
                          !memcmp(fused->gnw, plain->gnw, sizeof fused->gnw),
                      "%s, mode %d: the gradients differ from accel_rms_norm's", dn, mode);
            free(fused);
            free(plain);
            accel_set_reference_kernels(was_ref);
            accel__prepared_set_enabled(was_cache);
        }
    accel_tensor_free(w);
    accel_tensor_free(nw);
}

/* A write into the norm's output after it offered its copy: the next Linear
 * converts the new values. */
static void test_norm_copy_forgotten_after_write(void) {
    accel_tensor *w = weight(8);
    accel_set_grad_enabled(false);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *h = accel__rms_norm_with_roles(input(1), NULL, 1e-6, ACCEL__NORM_OUT_TO_GEMMS);
    CHECK(h && accel_fill_(h, 0.375) == ACCEL_OK);
    accel_tensor *got = accel_linear(h, w, NULL), *fresh = accel_empty(ACCEL_F32, ACCEL_SHAPE(R, IN));
    CHECK(fresh && accel_fill_(fresh, 0.375) == ACCEL_OK);
    CHECK_MSG(same_bits(got, accel_linear(fresh, w, NULL)), "a Linear read the norm's copy of its old output");
    accel_autocast_end(prev);
    accel_set_grad_enabled(true);
    accel_step_reset();
    accel_tensor_free(w);
}

/* Rewinds around the norm's offer (where it makes one: accel__gemm_native):
 *   - a conversion freed by a rewind before an offer is not kept by the
 *     offer's new watch: a Linear of a new tensor at the old one's address
 *     converts it anew;
 *   - an offer freed by a rewind is not handed out to a new tensor at the
 *     norm's output's address. */
static void test_norm_copy_and_rewinds(void) {
    accel_tensor *w = weight(9);
    accel_set_grad_enabled(false);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_arena *a = accel_step_arena();
    for (int freed_offer = 0; freed_offer < 2; freed_offer++) {
        accel_arena_mark m = accel_arena_mark_now(a);
        accel_tensor *x1 = input(1), *h1 = NULL;
        if (freed_offer) CHECK((h1 = accel__rms_norm_with_roles(x1, NULL, 1e-6, ACCEL__NORM_OUT_TO_GEMMS)) != NULL);
        else CHECK(accel_linear(x1, w, NULL) != NULL); /* x1's conversion remembered */
        void *x_at = x1->data, *h_at = h1 ? h1->data : NULL;
        CHECK(accel_arena_rewind(a, m) == ACCEL_OK);
        accel_tensor *x2 = input(3);
        CHECK_MSG(x2->data == x_at, "the arena should give the new input the old one's address");
        /* the offer after the rewind (case 1), or a plain norm at the freed offer's place (case 2) */
        accel_tensor *h2 = freed_offer ? accel_rms_norm(x2, NULL, 1e-6) : accel__rms_norm_with_roles(x2, NULL, 1e-6, ACCEL__NORM_OUT_TO_GEMMS);
        CHECK(h2 && (!freed_offer || h2->data == h_at));
        accel_tensor *src = freed_offer ? h2 : x2, *got = accel_linear(src, w, NULL);
        accel_tensor *fresh = accel_empty(ACCEL_F32, ACCEL_SHAPE(R, IN));
        CHECK(fresh && accel_copy_(fresh, src) == ACCEL_OK);
        CHECK_MSG(same_bits(got, accel_linear(fresh, w, NULL)), "a freed conversion was handed out (%s)",
                  freed_offer ? "the norm's offer, rewound" : "made before the rewind, then an offer");
        accel_step_reset();
    }
    accel_autocast_end(prev);
    accel_set_grad_enabled(true);
    accel_tensor_free(w);
}

/* What a residual-sum-then-norm step gave. */
typedef struct residual_run {
    float gb[R * OUT], gx[R * OUT], gw[OUT * IN], gw2[OUT * OUT], gnw[OUT], y[R * OUT];
    uint64_t takes;
} residual_run;

/* b = Linear(x0) (the autocast dtype), h = x + b (f32), y = Linear(RMSNorm(h))
 * with the norm's roles, then the backward of sum(y) + sum(h * h) (h's
 * gradient from the norm and from another reader, as a residual stream has). */
static void residual_then_norm(unsigned roles, accel_dtype dt, bool square_first, accel_tensor *w, accel_tensor *w2,
                               accel_tensor *nw, residual_run *out) {
    accel_tensor *x0 = input(4), *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(R, OUT));
    float v[R * OUT];
    for (int i = 0; i < R * OUT; i++) v[i] = (float)((i * 29) % 83) / 17.0f - 2.1f;
    CHECK(x && accel_tensor_from_host(x, v) == ACCEL_OK && accel_requires_grad_(x, true) == ACCEL_OK);
    accel_dtype prev = accel_autocast_begin(dt);
    accel_tensor *b = accel_linear(x0, w, NULL), *h = accel_add(x, b);
    accel_tensor *sq = square_first ? accel_sum_all(accel_mul(h, h)) : NULL;
    accel_tensor *y = accel_linear(accel__rms_norm_with_roles(h, nw, 1e-6, roles), w2, NULL);
    accel_autocast_end(prev);
    CHECK(b && b->dtype == dt && h && h->dtype == ACCEL_F32 && y);
    if (!square_first) sq = accel_sum_all(accel_mul(h, h));
    accel_tensor *loss = accel_add(accel_sum_all(y), sq);
    uint64_t t0 = accel__step_cast_takes();
    CHECK(loss && accel_backward(loss) == ACCEL_OK && b->grad && x->grad);
    out->takes = accel__step_cast_takes() - t0;
    CHECK(accel_to_floats(b->grad, out->gb) == ACCEL_OK && accel_to_floats(x->grad, out->gx) == ACCEL_OK);
    CHECK(accel_to_floats(y, out->y) == ACCEL_OK && accel_to_floats(w->grad, out->gw) == ACCEL_OK);
    CHECK(accel_to_floats(w2->grad, out->gw2) == ACCEL_OK && accel_to_floats(nw->grad, out->gnw) == ACCEL_OK);
    CHECK(accel_zero_(w->grad) == ACCEL_OK && accel_zero_(w2->grad) == ACCEL_OK && accel_zero_(nw->grad) == ACCEL_OK);
    accel_step_reset();
    accel_tensor_free(x0);
    accel_tensor_free(x);
}

/* A norm of a residual stream (ACCEL__NORM_IN_RESIDUAL): under autocast on
 * the CPU its backward rounds h's gradient for the sum's branch, which the
 * sum's backward takes (one conversion taken a step), with the cache on and
 * not under the reference kernels,
 * where the norm's backward adds the last of h's gradient; where another
 * reader's backward adds into it after (recorded before the norm), that
 * write forgets the rounding and the sum converts. Every gradient the bits
 * of the plain norm's (which offers none). */
static void test_norm_backward_rounds_the_branch_gradient(void) {
    accel_tensor *w = weight(10), *w2 = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(OUT, OUT), ACCEL_CPU_DEVICE);
    accel_tensor *nw = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(OUT), ACCEL_CPU_DEVICE);
    accel_rng rng;
    CHECK(w2 && nw && accel_rng_init(&rng, 11) == ACCEL_OK && accel_rng_normal_(&rng, w2, 0.0, 0.5) == ACCEL_OK &&
          accel_rng_normal_(&rng, nw, 1.0, 0.1) == ACCEL_OK);
    CHECK(accel_requires_grad_(w2, true) == ACCEL_OK && accel_requires_grad_(nw, true) == ACCEL_OK);
    const accel_dtype dts[] = {ACCEL_BF16, ACCEL_F16};
    const unsigned roles[] = {ACCEL__NORM_IN_RESIDUAL, ACCEL__NORM_IN_RESIDUAL | ACCEL__NORM_OUT_TO_GEMMS};
    for (int d = 0; d < 2; d++)
        for (int r = 0; r < 2; r++)
            for (int cache = 0; cache < 3; cache++) /* 2: the cache on, the reference kernels */
                for (int first = 0; first < 2; first++) {
                    bool was = accel__prepared_set_enabled(cache != 0), was_ref = accel_set_reference_kernels(cache == 2);
                    residual_run *fused = calloc(1, sizeof *fused), *plain = calloc(1, sizeof *plain);
                    residual_then_norm(roles[r], dts[d], first, w, w2, nw, fused);
                    residual_then_norm(0, dts[d], first, w, w2, nw, plain);
                    const char *dn = accel_dtype_name(dts[d]);
                    CHECK_MSG(fused->takes == (uint64_t)(cache == 1 && !first), "%s, roles %u, cache %d, square first %d: %llu "
                              "conversions taken", dn, roles[r], cache, first, (unsigned long long)fused->takes);
                    CHECK_MSG(plain->takes == 0, "%s: the plain norm's backward offered a conversion", dn);
                    CHECK_MSG(!memcmp(fused->gb, plain->gb, sizeof fused->gb), "%s, roles %u, cache %d: the branch's "
                              "gradient differs from the plain norm's", dn, roles[r], cache);
                    CHECK_MSG(!memcmp(fused->gx, plain->gx, sizeof fused->gx) && !memcmp(fused->y, plain->y, sizeof fused->y) &&
                                  !memcmp(fused->gw, plain->gw, sizeof fused->gw) &&
                                  !memcmp(fused->gw2, plain->gw2, sizeof fused->gw2) &&
                                  !memcmp(fused->gnw, plain->gnw, sizeof fused->gnw),
                              "%s, roles %u, cache %d: values or gradients differ from the plain norm's", dn, roles[r], cache);
                    free(fused);
                    free(plain);
                    accel_set_reference_kernels(was_ref);
                    accel__prepared_set_enabled(was);
                }
    accel_tensor_free(w);
    accel_tensor_free(w2);
    accel_tensor_free(nw);
}

/* b32's gradient through h = x + bf16(b32), y = RMSNorm(h) of `roles` and
 * rows x cols (2 threads), loss sum(y * coef); *takes: conversions taken. */
static void few_rows_run(unsigned roles, int64_t rows, int64_t cols, float *gb, uint64_t *takes) {
    int64_t n = rows * cols;
    float *v = calloc((size_t)n, sizeof *v);
    CHECK(v != NULL);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((i * 31) % 101) / 23.0f - 2.2f;
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(rows, cols), v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((i * 17) % 89) / 29.0f - 1.4f;
    accel_tensor *b32 = accel_from_floats(ACCEL_SHAPE(rows, cols), v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((i * 7) % 13) / 5.0f - 1.1f;
    accel_tensor *coef = accel_from_floats(ACCEL_SHAPE(rows, cols), v);
    CHECK(x && b32 && coef && accel_requires_grad_(x, true) == ACCEL_OK && accel_requires_grad_(b32, true) == ACCEL_OK);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *h = accel_add(x, accel_to_dtype(b32, ACCEL_BF16));
    accel_tensor *y = accel__rms_norm_with_roles(h, NULL, 1e-6, roles);
    accel_autocast_end(prev);
    uint64_t t0 = accel__step_cast_takes();
    CHECK(h && h->dtype == ACCEL_F32 && y && accel_backward(accel_sum_all(accel_mul(y, coef))) == ACCEL_OK && b32->grad);
    *takes = accel__step_cast_takes() - t0;
    CHECK(accel_to_floats(b32->grad, gb) == ACCEL_OK);
    accel_step_reset();
    free(v);
}

/* The norm's backward over one block of rows (R <= 64) with more than one
 * thread (R x D > 16384: rms_backward_few_rows, its rows' dx then the weight
 * gradient by columns) rounds the input's gradient too: taken, the same
 * bits as the plain norm's. */
static void test_norm_backward_few_rows(void) {
    int threads = accel_num_threads();
    CHECK(accel_set_num_threads(2) == ACCEL_OK);
    enum { FR = 24, FD = 1024 };
    float *fused = malloc(sizeof(float) * FR * FD), *plain = malloc(sizeof(float) * FR * FD);
    uint64_t tf, tp;
    few_rows_run(ACCEL__NORM_IN_RESIDUAL, FR, FD, fused, &tf);
    few_rows_run(0, FR, FD, plain, &tp);
    CHECK_MSG(tf == 1 && tp == 0, "conversions taken: %llu with the role, %llu without", (unsigned long long)tf,
              (unsigned long long)tp);
    CHECK_MSG(!memcmp(fused, plain, sizeof(float) * FR * FD), "the branch's gradient differs from the plain norm's");
    free(fused);
    free(plain);
    CHECK(accel_set_num_threads(threads) == ACCEL_OK);
}

/* A reader of h recorded between the sum and the norm whose backward adds
 * into h's gradient through its kernel (a Linear's dX, beta 1) after the
 * norm offered its rounding: that write forgets the offer (accel__gbuf_end
 * reports it), the branch's gradient is the plain norm's. */
static void test_norm_offer_forgotten_by_a_kernel_write(void) {
    accel_tensor *w = weight(12), *w2 = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(OUT, OUT), ACCEL_CPU_DEVICE);
    accel_rng rng;
    CHECK(w2 && accel_rng_init(&rng, 13) == ACCEL_OK && accel_rng_normal_(&rng, w2, 0.0, 0.5) == ACCEL_OK);
    CHECK(accel_requires_grad_(w2, true) == ACCEL_OK);
    float gb[2][R * OUT];
    uint64_t takes[2];
    for (int v = 0; v < 2; v++) {
        accel_tensor *x0 = input(4), *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(R, OUT));
        CHECK(x && accel_fill_(x, 0.25) == ACCEL_OK && accel_requires_grad_(x, true) == ACCEL_OK);
        accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
        accel_tensor *b = accel_linear(x0, w, NULL), *h = accel_add(x, b);
        accel_tensor *side = accel_sum_all(accel_linear(h, w2, NULL)); /* its dX adds into h's gradient last */
        accel_tensor *y = accel__rms_norm_with_roles(h, NULL, 1e-6, v ? 0 : ACCEL__NORM_IN_RESIDUAL);
        accel_autocast_end(prev);
        uint64_t t0 = accel__step_cast_takes();
        CHECK(y && side && accel_backward(accel_add(accel_sum_all(accel_mul(y, y)), side)) == ACCEL_OK && b->grad);
        takes[v] = accel__step_cast_takes() - t0;
        CHECK(accel_to_floats(b->grad, gb[v]) == ACCEL_OK);
        CHECK(accel_zero_(w->grad) == ACCEL_OK && accel_zero_(w2->grad) == ACCEL_OK);
        accel_step_reset();
        accel_tensor_free(x0);
        accel_tensor_free(x);
    }
    CHECK_MSG(takes[0] == 0, "a conversion older than the Linear's write into h's gradient was taken");
    CHECK_MSG(!memcmp(gb[0], gb[1], sizeof gb[0]), "the branch's gradient differs from the plain norm's");
    accel_tensor_free(w);
    accel_tensor_free(w2);
}

/* Only an offered conversion no one was handed can be taken: not one a
 * GEMM made (saved for its backward), nor an offer a GEMM then read. */
static void test_take_only_unshared(void) {
    accel_tensor *w = weight(14);
    accel_set_grad_enabled(false);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *x = input(1);
    CHECK(accel_linear(x, w, NULL) != NULL); /* x's conversion made, and shared */
    CHECK_MSG(accel__step_cast_take(x, ACCEL__FORM_CAST, ACCEL_BF16) == NULL, "a GEMM's conversion was taken");
    accel_tensor *h = accel__rms_norm_with_roles(input(2), NULL, 1e-6, ACCEL__NORM_OUT_TO_GEMMS);
    CHECK(h && accel_linear(h, w, NULL) != NULL); /* the norm's offer (where made), read by the Linear */
    CHECK_MSG(accel__step_cast_take(h, ACCEL__FORM_CAST, ACCEL_BF16) == NULL, "an offer a GEMM read was taken");
    accel_tensor *h2 = accel__rms_norm_with_roles(input(3), NULL, 1e-6, ACCEL__NORM_OUT_TO_GEMMS);
    CHECK(h2 != NULL);
    if (accel__gemm_native(ACCEL_BF16)) /* an offer no one read: taken once */
        CHECK(accel__step_cast_take(h2, ACCEL__FORM_CAST, ACCEL_BF16) != NULL &&
              accel__step_cast_take(h2, ACCEL__FORM_CAST, ACCEL_BF16) == NULL);
    accel_autocast_end(prev);
    accel_set_grad_enabled(true);
    accel_step_reset();
    accel_tensor_free(w);
}

/* The decoders' wiring of the roles (llama.c): one bf16 training step of
 * the tiny 2-layer models takes 2 L conversions (layer 1's input norm,
 * both layers' MLP norms, the final norm) where the residual sums take the
 * projections' outputs (Llama, Granite, Gemma's 1 + weight norms), none
 * where a norm's input is not such a sum (Gemma 2's, Gemma 3's and OLMo 2's normalised
 * branches); the loss the plain path's bits. */
static void test_decoder_roles_wired(void) {
    const struct { const char *type; uint64_t takes; } fams[] = {
        {"llama", 4}, {"granite", 4}, {"gemma", 4}, {"gemma2", 0}, {"gemma3_text", 0}, {"olmo2", 0}};
    int64_t ids[2 * 8];
    for (int i = 0; i < 16; i++) ids[i] = (i * 7 + 3) % 40;
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        double loss[2];
        uint64_t takes[2];
        for (int cache = 0; cache < 2; cache++) {
            bool was = accel__prepared_set_enabled(cache);
            accel_module *m = tiny_family(3, fams[f].type);
            CHECK_MSG(m != NULL, "%s: %s", fams[f].type, accel_last_error());
            if (!m) {
                accel__prepared_set_enabled(was);
                continue;
            }
            accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
            accel_tensor *l = accel_llama_loss(m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, 8), ids));
            accel_autocast_end(prev);
            uint64_t t0 = accel__step_cast_takes();
            CHECK(l && accel_backward(l) == ACCEL_OK);
            takes[cache] = accel__step_cast_takes() - t0;
            loss[cache] = l ? accel_item(l) : 0;
            accel_step_reset();
            accel_module_free(m);
            accel__prepared_set_enabled(was);
        }
        CHECK_MSG(takes[1] == fams[f].takes && takes[0] == 0, "%s: %llu conversions taken (cache on), %llu (off); "
                  "expected %llu", fams[f].type, (unsigned long long)takes[1], (unsigned long long)takes[0],
                  (unsigned long long)fams[f].takes);
        CHECK_MSG(loss[0] == loss[1], "%s: loss %.9g with the roles' copies, %.9g without", fams[f].type, loss[1],
                  loss[0]);
    }
}

int main(void) {
    RUN(test_shared_and_identical);
    RUN(test_norm_offers_its_rounding);
    RUN(test_norm_copy_forgotten_after_write);
    RUN(test_norm_copy_and_rewinds);
    RUN(test_norm_backward_rounds_the_branch_gradient);
    RUN(test_norm_backward_few_rows);
    RUN(test_norm_offer_forgotten_by_a_kernel_write);
    RUN(test_take_only_unshared);
    RUN(test_decoder_roles_wired);
    RUN(test_write_forgets);
    RUN(test_rewind_and_reset_forget);
    accel_thread_cleanup();
    return check_summary();
}
