/* The explicit-score attention (src/ops/attention_masked.c) on bf16 inputs
 * computes as torch's SDPA (transformers' default attention) does: in f32 on
 * the bf16 values, the output rounded once. Each case (a sliding window that
 * bites, a padding mask with holes and a left pad's row that sees no key,
 * grouped kv heads, attention dropout from a seeded generator, BERT's
 * [B, 1, 1, S] mask on transposed views) against the same path in f32 on the
 * bf16-rounded inputs with its output rounded to bf16: within 1 bf16 ulp
 * (what rounding one f32 result can differ by), and the gradients of q, k, v
 * within 1 bf16 ulp of the f32 path's (the f32 gradient rounded once to the
 * bf16 leaf; the output gradient reaching the f32 body is the same bf16
 * one); the same under a bf16 autocast on f32 inputs (rounded to bf16
 * first, as torch's autocast hands them to its SDPA). The eager numerics
 * (upcast false: Gemma2's soft-capped attention, transformers' eager) round
 * the scores to bf16 before the softmax: many ulps away, pinned so. f32
 * inputs: upcast changes nothing, bit for bit. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"
#include "ops/attention_masked.h"

/* Scores of a few units (inputs of scale 3, head_dim 16): bf16 rounds them
 * by a few hundredths, which the softmax turns into ulps of the output. */
#define SCALE 3.0

typedef struct scase {
    const char *what;
    int64_t B, H, Hkv, T, S, D, W; /* S keys, the last T of them queried (pos S - T) */
    bool holes;                    /* keep: row 0 a hole at key 2, row 1 left-padded by 3 with a hole at 5 */
    double drop;
} scase;

static const scase CASES[] = {
    {"window", 2, 4, 4, 12, 12, 16, 5, false, 0.0},
    {"mask with holes, grouped kv heads", 2, 4, 2, 12, 12, 16, 0, true, 0.0},
    {"window and holes, a cache before the queries", 2, 4, 2, 6, 12, 16, 4, true, 0.0},
    {"dropout, grouped kv heads", 2, 4, 1, 10, 10, 16, 0, false, 0.2},
};

/* A persistent leaf of dt holding N(0, SCALE) values from seed, requiring grad. */
static accel_tensor *leaf(uint64_t seed, int64_t a, int64_t b, int64_t c, int64_t d, accel_dtype dt) {
    int64_t shape[4] = {a, b, c, d};
    accel_tensor *f = accel_tensor_new(ACCEL_F32, 4, shape, ACCEL_CPU_DEVICE);
    accel_tensor *t = accel_tensor_new(dt, 4, shape, ACCEL_CPU_DEVICE);
    accel_rng r;
    accel_rng_init(&r, seed);
    CHECK(f && t && accel_rng_normal_(&r, f, 0.0, SCALE) == ACCEL_OK && accel_copy_(t, f) == ACCEL_OK);
    accel_tensor_free(f);
    accel_requires_grad_(t, true);
    return t;
}

/* A persistent f32 leaf with t's values (bf16 ones exactly), requiring grad. */
static accel_tensor *f32_of(const accel_tensor *t) {
    accel_tensor *f = accel_tensor_new(ACCEL_F32, t->ndim, t->shape, ACCEL_CPU_DEVICE);
    CHECK(f && accel_copy_(f, t) == ACCEL_OK);
    accel_requires_grad_(f, true);
    return f;
}

static uint8_t *keep_of(const scase *c) {
    uint8_t *keep = malloc((size_t)(c->B * c->S));
    memset(keep, 1, (size_t)(c->B * c->S));
    if (c->holes) {
        keep[2] = 0;
        memset(keep + c->S, 0, 3);
        keep[c->S + 5] = 0;
    }
    return keep;
}

/* One bf16 ulp at |x|: 2^(exponent - 7); the smallest normal's below it. */
static double bf16_ulp(double x) {
    int e;
    frexp(fmax(fabs(x), 0x1p-126), &e);
    return ldexp(1.0, e - 1 - 7);
}

/* The largest |got - want| in bf16 ulps of want (both read as floats). */
static double ulps_apart(const accel_tensor *got, const accel_tensor *want) {
    int64_t n = accel_numel(want);
    if (!got || accel_numel(got) != n) return INFINITY;
    float *g = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)n);
    accel_to_floats(got, g);
    accel_to_floats(want, w);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, isfinite(g[i]) ? fabs(g[i] - w[i]) / bf16_ulp(w[i]) : INFINITY);
    free(g), free(w);
    return worst;
}

/* The explicit attention of c on q, k, v (dropout drawn from a generator of
 * seed 7), summed with gradcheck's fixed weights, backward run; *out: its
 * output, rounded to bf16 when `round`. */
static accel_status attend(const scase *c, accel_tensor *q, accel_tensor *k, accel_tensor *v, const uint8_t *keep,
                           bool upcast, bool round, accel_tensor **out) {
    accel_rng r;
    accel_rng_init(&r, 7);
    accel_tensor *o = accel__masked_attention(q, k, v, c->S - c->T, c->W, c->holes ? keep : NULL, true, 0.0, 0.0,
                                              c->drop, c->drop > 0 ? &r : NULL, upcast);
    if (o && round) o = accel_to_dtype(o, ACCEL_BF16);
    *out = o;
    return o ? accel_backward(gc_weighted_sum(o)) : accel_last_status();
}

/* The gradients of a and b, each within 1 bf16 ulp of the other's. */
static void check_grads(const char *what, accel_tensor *const *got, accel_tensor *const *want) {
    static const char *const NAME[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) {
        double u = ulps_apart(got[i]->grad, want[i]->grad);
        CHECK_MSG(u <= 1.0, "%s: %s's gradient %.3g bf16 ulps from the f32 path's", what, NAME[i], u);
    }
}

static void free_all(accel_tensor **t, int n) {
    for (int i = 0; i < n; i++) accel_tensor_free(t[i]);
}

/* bf16 q, k, v through the explicit attention with upcast (SDPA's numerics)
 * against the f32 path on the same values rounded once at its end; without
 * upcast (eager's) many ulps away. */
static void test_bf16_as_sdpa(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const scase *c = &CASES[i];
        uint8_t *keep = keep_of(c);
        accel_tensor *in[3] = {leaf(100 + i, c->B, c->H, c->T, c->D, ACCEL_BF16),
                               leaf(200 + i, c->B, c->Hkv, c->S, c->D, ACCEL_BF16),
                               leaf(300 + i, c->B, c->Hkv, c->S, c->D, ACCEL_BF16)};
        accel_tensor *ref[3] = {f32_of(in[0]), f32_of(in[1]), f32_of(in[2])};
        accel_tensor *got, *want, *eager;
        CHECK_MSG(attend(c, ref[0], ref[1], ref[2], keep, true, true, &want) == ACCEL_OK, "%s: %s", c->what,
                  accel_last_error());
        CHECK_MSG(attend(c, in[0], in[1], in[2], keep, true, false, &got) == ACCEL_OK, "%s: %s", c->what,
                  accel_last_error());
        CHECK(got && got->dtype == ACCEL_BF16);
        double u = ulps_apart(got, want);
        CHECK_MSG(u <= 1.0, "%s: the bf16 output %.3g ulps from the f32 path's", c->what, u);
        check_grads(c->what, in, ref);
        CHECK(attend(c, in[0], in[1], in[2], keep, false, false, &eager) == ACCEL_OK);
        double e = ulps_apart(eager, want);
        CHECK_MSG(e >= 8.0, "%s: eager's bf16 scores only %.3g ulps from the f32 path", c->what, e);
        printf("%s: upcast %.3g ulps, eager %.3g ulps from the f32 path\n", c->what, u, e);
        accel_step_reset();
        free_all(in, 3), free_all(ref, 3);
        free(keep);
    }
}

/* f32 q, k, v under a bf16 autocast: rounded to bf16 first, then as above. */
static void test_autocast_rounds_inputs(void) {
    const scase *c = &CASES[2];
    uint8_t *keep = keep_of(c);
    accel_tensor *in[3] = {leaf(11, c->B, c->H, c->T, c->D, ACCEL_F32), leaf(12, c->B, c->Hkv, c->S, c->D, ACCEL_F32),
                           leaf(13, c->B, c->Hkv, c->S, c->D, ACCEL_F32)};
    accel_tensor *b[3], *ref[3], *got, *want;
    for (int i = 0; i < 3; i++) {
        b[i] = accel_tensor_new(ACCEL_BF16, 4, in[i]->shape, ACCEL_CPU_DEVICE);
        CHECK(b[i] && accel_copy_(b[i], in[i]) == ACCEL_OK);
        ref[i] = f32_of(b[i]);
    }
    CHECK(attend(c, ref[0], ref[1], ref[2], keep, true, true, &want) == ACCEL_OK);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    CHECK_MSG(attend(c, in[0], in[1], in[2], keep, true, false, &got) == ACCEL_OK, "%s", accel_last_error());
    accel_autocast_end(prev);
    CHECK(accel_autocast_dtype() == prev);
    CHECK(got && got->dtype == ACCEL_BF16);
    double u = ulps_apart(got, want);
    CHECK_MSG(u <= 1.0, "autocast: the output %.3g ulps from the f32 path's", u);
    check_grads("autocast", in, ref);
    accel_step_reset();
    free_all(in, 3), free_all(b, 3), free_all(ref, 3);
    free(keep);
}

/* Gemma2's soft-capped scores without upcast stay eager: rounded to bf16
 * (the output many ulps from the f32 path's), while upcast computes them in
 * f32. */
static void test_softcap_eager_pinned(void) {
    const scase *c = &CASES[0];
    accel_tensor *in[3] = {leaf(21, c->B, c->H, c->T, c->D, ACCEL_BF16), leaf(22, c->B, c->Hkv, c->S, c->D, ACCEL_BF16),
                           leaf(23, c->B, c->Hkv, c->S, c->D, ACCEL_BF16)};
    accel_tensor *ref[3] = {f32_of(in[0]), f32_of(in[1]), f32_of(in[2])};
    accel_tensor *want = accel_to_dtype(accel__masked_attention(ref[0], ref[1], ref[2], 0, c->W, NULL, false, 0.0, 20.0,
                                                                0.0, NULL, false), ACCEL_BF16);
    accel_tensor *eager = accel__masked_attention(in[0], in[1], in[2], 0, c->W, NULL, false, 0.0, 20.0, 0.0, NULL, false);
    accel_tensor *up = accel__masked_attention(in[0], in[1], in[2], 0, c->W, NULL, false, 0.0, 20.0, 0.0, NULL, true);
    double e = ulps_apart(eager, want), u = ulps_apart(up, want);
    CHECK_MSG(eager && eager->dtype == ACCEL_BF16 && e >= 8.0, "soft-capped eager: %.3g ulps from the f32 path", e);
    CHECK_MSG(u <= 1.0, "soft-capped upcast: %.3g ulps from the f32 path", u);
    printf("soft-capped: eager %.3g ulps, upcast %.3g ulps from the f32 path\n", e, u);
    accel_step_reset();
    free_all(in, 3), free_all(ref, 3);
}

/* f32 inputs: upcast or not, the same output and gradients bit for bit. */
static void test_f32_unchanged(void) {
    const scase *c = &CASES[2];
    uint8_t *keep = keep_of(c);
    accel_tensor *a[3] = {leaf(31, c->B, c->H, c->T, c->D, ACCEL_F32), leaf(32, c->B, c->Hkv, c->S, c->D, ACCEL_F32),
                          leaf(33, c->B, c->Hkv, c->S, c->D, ACCEL_F32)};
    accel_tensor *b[3] = {f32_of(a[0]), f32_of(a[1]), f32_of(a[2])}, *x, *y;
    CHECK(attend(c, a[0], a[1], a[2], keep, true, false, &x) == ACCEL_OK);
    CHECK(attend(c, b[0], b[1], b[2], keep, false, false, &y) == ACCEL_OK);
    CHECK(x && y && x->dtype == ACCEL_F32 && ulps_apart(x, y) == 0.0);
    for (int i = 0; i < 3; i++) CHECK(ulps_apart(a[i]->grad, b[i]->grad) == 0.0);
    accel_step_reset();
    free_all(a, 3), free_all(b, 3);
    free(keep);
}

/* BERT's attention (accel__scores_attention with a [B, 1, 1, S] mask on
 * transposed views of [B, T, H, D], upcast): bf16 as the f32 path rounded
 * once. */
static void test_bert_shape(void) {
    int64_t B = 2, T = 9, H = 3, D = 16;
    accel_tensor *in[3] = {leaf(41, B, T, H, D, ACCEL_BF16), leaf(42, B, T, H, D, ACCEL_BF16),
                           leaf(43, B, T, H, D, ACCEL_BF16)};
    accel_tensor *ref[3] = {f32_of(in[0]), f32_of(in[1]), f32_of(in[2])};
    float m[2 * 9] = {0};
    m[9 + 7] = m[9 + 8] = -FLT_MAX; /* row 1: its last two keys are pads */
    accel_tensor *mask = accel_from_data(ACCEL_F32, 4, (int64_t[]){B, 1, 1, T}, m);
    accel__scores_opts o = {.upcast = true};
    accel_tensor *o_ref = accel__scores_attention(accel_transpose(ref[0], 1, 2), accel_transpose(ref[1], 1, 2),
                                                  accel_transpose(ref[2], 1, 2), mask, &o);
    accel_tensor *want = accel_to_dtype(o_ref, ACCEL_BF16);
    CHECK(want && accel_backward(gc_weighted_sum(want)) == ACCEL_OK);
    accel_tensor *got = accel__scores_attention(accel_transpose(in[0], 1, 2), accel_transpose(in[1], 1, 2),
                                                accel_transpose(in[2], 1, 2), mask, &o);
    CHECK_MSG(got && got->dtype == ACCEL_BF16 && accel_backward(gc_weighted_sum(got)) == ACCEL_OK, "%s",
              accel_last_error());
    double u = ulps_apart(got, want);
    CHECK_MSG(u <= 1.0, "BERT's shape: %.3g ulps from the f32 path", u);
    check_grads("BERT's shape", in, ref);
    o.upcast = false;
    double e = ulps_apart(accel__scores_attention(accel_transpose(in[0], 1, 2), accel_transpose(in[1], 1, 2),
                                                  accel_transpose(in[2], 1, 2), mask, &o), want);
    CHECK_MSG(e >= 8.0, "BERT's shape, eager: only %.3g ulps from the f32 path", e);
    accel_step_reset();
    free_all(in, 3), free_all(ref, 3);
}

/* A forward's shared padding mask (accel__pad_mask_make) for bf16 layers
 * that upcast is made f32 (accel__scores_dtype_of) and fits them, giving
 * the per-call mask's output bit for bit; one made in bf16 fits the eager
 * calls only. */
static void test_shared_mask_dtype(void) {
    const scase *c = &CASES[2];
    uint8_t *keep = keep_of(c);
    accel_tensor *in[3] = {leaf(51, c->B, c->H, c->T, c->D, ACCEL_BF16), leaf(52, c->B, c->Hkv, c->S, c->D, ACCEL_BF16),
                           leaf(53, c->B, c->Hkv, c->S, c->D, ACCEL_BF16)};
    int64_t pos = c->S - c->T;
    accel__pad_mask up, eager;
    CHECK(accel__scores_dtype_of(ACCEL_BF16, true) == ACCEL_F32);
    CHECK(accel__scores_dtype_of(ACCEL_BF16, false) == ACCEL_BF16);
    CHECK(accel__scores_dtype_of(ACCEL_F32, true) == ACCEL_F32);
    CHECK(accel__pad_mask_make(&up, keep, NULL, c->B, c->T, c->S, pos, c->W, accel__scores_dtype_of(ACCEL_BF16, true),
                               ACCEL_CPU_DEVICE) == ACCEL_OK);
    CHECK(accel__pad_mask_make(&eager, keep, NULL, c->B, c->T, c->S, pos, c->W, ACCEL_BF16, ACCEL_CPU_DEVICE) ==
          ACCEL_OK);
    CHECK(accel__pad_mask_fits(&up, in[0], in[1], pos, c->W, true) &&
          !accel__pad_mask_fits(&up, in[0], in[1], pos, c->W, false));
    CHECK(accel__pad_mask_fits(&eager, in[0], in[1], pos, c->W, false) &&
          !accel__pad_mask_fits(&eager, in[0], in[1], pos, c->W, true));
    accel_tensor *a = accel__masked_attention_pad(in[0], in[1], in[2], pos, c->W, &up, true, 0.0, 0.0, 0.0, NULL, true);
    accel_tensor *b = accel__masked_attention(in[0], in[1], in[2], pos, c->W, keep, true, 0.0, 0.0, 0.0, NULL, true);
    CHECK(a && b && ulps_apart(a, b) == 0.0);
    CHECK(!accel__masked_attention_pad(in[0], in[1], in[2], pos, c->W, &eager, true, 0.0, 0.0, 0.0, NULL, true));
    CHECK_STR_CONTAINS(accel_last_error(), "made for another window, shape, dtype or device");
    accel_clear_error();
    accel_step_reset();
    free_all(in, 3);
    free(keep);
}

int main(void) {
    RUN(test_bf16_as_sdpa);
    RUN(test_autocast_rounds_inputs);
    RUN(test_softcap_eager_pinned);
    RUN(test_f32_unchanged);
    RUN(test_bert_shape);
    RUN(test_shared_mask_dtype);
    return check_summary();
}
