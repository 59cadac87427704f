/* accel__sdpa_padded: the fused attention with a key range per batch row (a
 * padded batch's valid keys), forward and backward, against the explicit
 * scores with the same keys masked (accel__masked_attention), a
 * double-precision reference computed here, the reference kernels and finite
 * differences: left and right padding, decode-like Tq < Tk, query blocks
 * past the kernels' 64 rows (a block whose every query sees no key), rows
 * with no key at all (0 out, no gradient: the rule of the explicit path's
 * unseen_zero), bf16 on the native tiles. Then the explicit path's causal
 * + window + padding mask against the reference and finite differences, the
 * eager rule (the mean of the values) for a row that sees no key, a mask
 * made once for every layer (accel__pad_mask) the same as one made a call,
 * and bad key ranges refused by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"
#include "ops/attention.h"
#include "ops/attention_masked.h"
#include "ops_fixture.h"
#include "sdpa_reference.h"

typedef struct pcase {
    int64_t B, H, Hkv, Tq, Tk, D;
    int64_t range[6]; /* [B, 2] */
} pcase;

/* keep [B, Tk] of c's ranges (host). */
static uint8_t *keep_of(const pcase *c) {
    uint8_t *keep = malloc((size_t)(c->B * c->Tk));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < c->Tk; j++) keep[b * c->Tk + j] = j >= c->range[2 * b] && j < c->range[2 * b + 1];
    return keep;
}

typedef struct padded_mask {
    const uint8_t *keep; /* [B, Tk] */
    int64_t Tk, W;
} padded_mask;

/* Query at qpos of batch row b sees key j where keep, j <= qpos and (W) j >
 * qpos - W. */
static bool padded_sees(const void *ctx, int64_t b, int64_t i, int64_t qpos, int64_t j) {
    const padded_mask *pm = ctx;
    (void)i;
    return pm->keep[b * pm->Tk + j] && j <= qpos && (!pm->W || j > qpos - pm->W);
}

/* The attention in double with c's kept keys, causal and (W) a window
 * (sdpa_reference): a row that sees no key 0 (unseen_zero) or the mean of
 * all Tk values. */
static void reference(const pcase *c, const float *q, const float *k, const float *v, const uint8_t *keep, int64_t W,
                      bool unseen_zero, float *o) {
    padded_mask pm = {keep, c->Tk, W};
    sdpa_reference((sdpa_dims){c->B, c->H, c->Hkv, c->Tq, c->Tk, c->D}, q, k, v, padded_sees, &pm, unseen_zero, o);
}

/* The fused op's output as [B, H, Tq, D] (it gives [B, Tq, H, D]). */
static accel_tensor *fused(accel_tensor *q, accel_tensor *k, accel_tensor *v, const pcase *c) {
    return accel_transpose(accel__sdpa_padded(q, k, v, c->range, 0.0), 1, 2);
}

/* Row i of batch row b sees no key under c's range and the causal mask. */
static bool unseen(const pcase *c, int64_t b, int64_t i) {
    int64_t lo = c->range[2 * b], hi = c->range[2 * b + 1], last = c->Tk - c->Tq + i;
    return lo >= hi || last < lo;
}

static void check_case(const pcase *c, const char *what) {
    accel_tensor *q = gc_randn(11, ACCEL_SHAPE(c->B, c->H, c->Tq, c->D)),
                 *k = gc_randn(12, ACCEL_SHAPE(c->B, c->Hkv, c->Tk, c->D)),
                 *v = gc_randn(13, ACCEL_SHAPE(c->B, c->Hkv, c->Tk, c->D)), *in[3] = {q, k, v};
    uint8_t *keep = keep_of(c);
    /* the double reference of the forward */
    float *fq = floats_of(q), *fk = floats_of(k), *fv = floats_of(v);
    int64_t no = c->B * c->H * c->Tq * c->D;
    float *want = malloc(sizeof(float) * (size_t)no);
    reference(c, fq, fk, fv, keep, 0, true, want);
    accel_tensor *wt = accel_from_data(ACCEL_F32, 4, q->shape, want);

    accel_tensor *o = fused(q, k, v, c), *g[3], *ge[3], *gr[3];
    CHECK_MSG(fx_compare(what, o, wt, 1e-5, 1e-6) == 0, "%s: fused vs reference", what);
    /* a query that sees no key: exactly 0 */
    float *fo = o ? floats_of(accel_contiguous(o)) : NULL;
    for (int64_t b = 0; fo && b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->Tq; i++)
                for (int64_t e = 0; unseen(c, b, i) && e < c->D; e++)
                    CHECK_MSG(fo[((b * c->H + h) * c->Tq + i) * c->D + e] == 0.0f, "%s: unseen row %lld", what,
                              (long long)i);
    free(fo);
    grads_of(o, in, g);
    /* the explicit scores with the same keys masked, the SDPA rule */
    accel_tensor *oe = accel__masked_attention(q, k, v, c->Tk - c->Tq, 0, keep, true, 0.0, 0.0, 0.0, NULL, false);
    CHECK_MSG(fx_compare(what, oe, wt, 1e-5, 1e-6) == 0, "%s: explicit vs reference", what);
    grads_of(oe, in, ge);
    for (int i = 0; i < 3; i++) CHECK_MSG(fx_compare(what, g[i], ge[i], 1e-4, 1e-5) == 0, "%s: grad %d", what, i);
    /* no gradient reaches a query that sees no key */
    float *dq = floats_of(g[0]);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->Tq; i++)
                for (int64_t e = 0; unseen(c, b, i) && e < c->D; e++)
                    CHECK_MSG(dq[((b * c->H + h) * c->Tq + i) * c->D + e] == 0.0f, "%s: dq of unseen row", what);
    free(dq);
    /* the reference kernels */
    bool prev = accel_set_reference_kernels(true);
    sdpa_check_against(what, "reference kernels", fused(q, k, v, c), wt, in, gr, ge);
    accel_set_reference_kernels(prev);
    /* bf16 on the native tiles (or the f32 tiles' widening) against f32 */
    accel_tensor *ob = fused(accel_to_dtype(q, ACCEL_BF16), accel_to_dtype(k, ACCEL_BF16),
                             accel_to_dtype(v, ACCEL_BF16), c);
    CHECK_MSG(fx_compare(what, ob, wt, 3e-2, 3e-2) == 0, "%s: bf16", what);
    accel_tensor *gb[3];
    grads_of(ob, in, gb);
    for (int i = 0; i < 3; i++) CHECK_MSG(fx_compare(what, gb[i], ge[i], 5e-2, 5e-2) == 0, "%s: bf16 grad %d", what, i);
    accel_step_reset();
    free3(g), free3(ge), free3(gr), free3(gb);
    free(fq), free(fk), free(fv), free(want), free(keep);
    free3(in);
}

static void test_vs_explicit_and_reference(void) {
    static const pcase cases[] = {
        /* left padding (a row of no key at all: [0, 0)), GQA */
        {3, 4, 2, 9, 9, 8, {0, 9, 3, 9, 0, 0}},
        /* decode-like: Tq < Tk over a cache, left and right padding, MQA */
        {3, 2, 1, 3, 10, 8, {2, 10, 0, 7, 9, 10}},
        /* past one 64-row query block: rows of block 0 that see no key, a
         * whole block 0 that sees none ([66, 70)) */
        {2, 2, 2, 70, 70, 16, {40, 70, 66, 70}},
        /* no padding through the key range: the unpadded attention */
        {1, 2, 1, 5, 5, 4, {0, 5}},
    };
    char what[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(what, sizeof what, "case %zu", i);
        check_case(&cases[i], what);
    }
}

/* A full range is the unpadded attention, bit for bit. */
static void test_full_range_is_unpadded(void) {
    pcase c = {2, 4, 2, 7, 7, 8, {0, 7, 0, 7}};
    accel_tensor *q = gc_randn(21, ACCEL_SHAPE(c.B, c.H, c.Tq, c.D)),
                 *k = gc_randn(22, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D)),
                 *v = gc_randn(23, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D));
    accel_tensor *a = accel__sdpa_padded(q, k, v, c.range, 0.0), *b = accel__sdpa_heads_last(q, k, v, true, 0.0);
    CHECK(a && b && fx_compare("full range", a, b, 0.0, 0.0) == 0);
    accel_step_reset();
    accel_tensor_free(q), accel_tensor_free(k), accel_tensor_free(v);
}

static accel_tensor *loss_padded(accel_tensor *const *in, int n, void *ctx) {
    (void)n;
    return gc_weighted_sum(fused(in[0], in[1], in[2], ctx));
}

typedef struct window_case {
    pcase c;
    int64_t W;
    const uint8_t *keep;
} window_case;

static accel_tensor *loss_window(accel_tensor *const *in, int n, void *ctx) {
    (void)n;
    const window_case *w = ctx;
    return gc_weighted_sum(
        accel__masked_attention(in[0], in[1], in[2], w->c.Tk - w->c.Tq, w->W, w->keep, true, 0.0, 0.0, 0.0, NULL, false));
}

static void test_gradcheck(void) {
    pcase c = {2, 2, 1, 4, 6, 4, {2, 6, 0, 5}};
    accel_tensor *in[3] = {gc_randn(31, ACCEL_SHAPE(c.B, c.H, c.Tq, c.D)),
                           gc_randn(32, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D)),
                           gc_randn(33, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D))};
    CHECK(gradcheck("sdpa padded", loss_padded, &c, 3, in, NULL) == 0);
    /* the explicit path's causal + window + padding mask */
    window_case w = {{2, 2, 1, 4, 6, 4, {1, 6, 0, 4}}, 3, NULL};
    uint8_t *keep = keep_of(&w.c);
    w.keep = keep;
    CHECK(gradcheck("masked attention window padded", loss_window, &w, 3, in, NULL) == 0);
    free(keep);
    free3(in);
}

/* The explicit path's causal + window + padding mask against the reference,
 * and its two rules for a row that sees no key. */
static void test_window_padding(void) {
    pcase c = {2, 2, 2, 8, 8, 4, {3, 8, 0, 8}};
    accel_tensor *q = gc_randn(41, ACCEL_SHAPE(c.B, c.H, c.Tq, c.D)),
                 *k = gc_randn(42, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D)),
                 *v = gc_randn(43, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D));
    uint8_t *keep = keep_of(&c);
    float *fq = floats_of(q), *fk = floats_of(k), *fv = floats_of(v);
    float *want = malloc(sizeof(float) * (size_t)accel_numel(q));
    for (int zero = 0; zero < 2; zero++) {
        reference(&c, fq, fk, fv, keep, 3, zero, want);
        accel_tensor *o = accel__masked_attention(q, k, v, 0, 3, keep, zero, 0.0, 0.0, 0.0, NULL, false);
        CHECK_MSG(fx_compare("window + padding", o, accel_from_data(ACCEL_F32, 4, q->shape, want), 1e-5, 1e-6) == 0,
                  "unseen_zero %d", zero);
    }
    accel_step_reset();
    free(fq), free(fk), free(fv), free(want), free(keep);
    accel_tensor_free(q), accel_tensor_free(k), accel_tensor_free(v);
}

/* A padding mask made once (accel__pad_mask_make) is the one each call
 * makes from keep, bit for bit, for any grouping of query heads (one mask
 * of the T positions, repeated over the G heads of a kv head); one made
 * for another window or position refused. */
static void test_shared_mask(void) {
    pcase c = {2, 4, 2, 5, 8, 4, {3, 8, 0, 6}};
    accel_tensor *q = gc_randn(61, ACCEL_SHAPE(c.B, c.H, c.Tq, c.D)),
                 *k = gc_randn(62, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D)),
                 *v = gc_randn(63, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D));
    uint8_t *keep = keep_of(&c);
    accel__pad_mask pm;
    CHECK(accel__pad_mask_make(&pm, keep, NULL, c.B, c.Tq, c.Tk, 3, 4, ACCEL_F32, q->device) == ACCEL_OK);
    accel_tensor *a = accel__masked_attention_pad(q, k, v, 3, 4, &pm, true, 0.0, 0.0, 0.0, NULL, false),
                 *b = accel__masked_attention(q, k, v, 3, 4, keep, true, 0.0, 0.0, 0.0, NULL, false);
    CHECK(a && b && fx_compare("shared mask", a, b, 0.0, 0.0) == 0);
    CHECK(!accel__masked_attention_pad(q, k, v, 3, 0, &pm, true, 0.0, 0.0, 0.0, NULL, false));
    CHECK_STR_CONTAINS(accel_last_error(), "made for another window");
    CHECK(!accel__masked_attention_pad(q, k, v, 2, 4, &pm, true, 0.0, 0.0, 0.0, NULL, false));
    accel_tensor *k1 = accel_slice(k, 1, 0, 1, 1), *v1 = accel_slice(v, 1, 0, 1, 1); /* G 4, not 2 */
    accel_tensor *a1 = accel__masked_attention_pad(q, k1, v1, 3, 4, &pm, true, 0.0, 0.0, 0.0, NULL, false),
                 *b1 = accel__masked_attention(q, k1, v1, 3, 4, keep, true, 0.0, 0.0, 0.0, NULL, false);
    CHECK(a1 && b1 && fx_compare("shared mask, G 4", a1, b1, 0.0, 0.0) == 0);
    accel_clear_error();
    accel_step_reset();
    free(keep);
    accel_tensor_free(q), accel_tensor_free(k), accel_tensor_free(v);
}

static void test_refusals(void) {
    accel_tensor *q = gc_randn(51, ACCEL_SHAPE(2, 2, 3, 4)), *k = gc_randn(52, ACCEL_SHAPE(2, 2, 5, 4)),
                 *v = gc_randn(53, ACCEL_SHAPE(2, 2, 5, 4));
    const int64_t bad[][4] = {{0, 5, 3, 2}, {0, 6, 0, 5}, {-1, 5, 0, 5}};
    for (int i = 0; i < 3; i++) {
        CHECK(!accel__sdpa_padded(q, k, v, bad[i], 0.0));
        CHECK_STR_CONTAINS(accel_last_error(), "key_range of batch row");
    }
    accel_step_reset();
    accel_tensor_free(q), accel_tensor_free(k), accel_tensor_free(v);
}

/* On meta the op gives shapes only: a decode step's range reaches past the
 * keys a meta cache (which never grows) holds, and is not checked there. */
static void test_meta_shapes(void) {
    accel_tensor *q = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(2, 2, 1, 4), ACCEL_META_DEVICE);
    accel_tensor *k = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(2, 2, 1, 4), ACCEL_META_DEVICE);
    accel_clear_error();
    accel_tensor *y = accel__sdpa_padded(q, k, k, (const int64_t[]){2, 5, 0, 5}, 0.0);
    /* [B, Tq, H, Dv] */
    CHECK_MSG(y && y->device.type == ACCEL_DEV_META && y->shape[1] == 1 && y->shape[3] == 4, "%s", accel_last_error());
    accel_step_reset();
}

int main(void) {
    RUN(test_vs_explicit_and_reference);
    RUN(test_full_range_is_unpadded);
    RUN(test_gradcheck);
    RUN(test_window_padding);
    RUN(test_shared_mask);
    RUN(test_refusals);
    RUN(test_meta_shapes);
    return check_summary();
}
