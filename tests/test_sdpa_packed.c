/* accel__sdpa_packed: the fused attention with a key start per query
 * (packed sequences: each query sees the keys of its own sequence only,
 * causally), forward and backward, against a double-precision reference
 * computed here, the explicit scores under the same mask
 * (accel__pad_mask_make's start), the reference kernels and finite
 * differences: random sequence boundaries (sequences of one token, ones
 * that cross the kernels' 64-row query blocks), grouped-query heads,
 * decode-like Tq < Tk, a query whose start lies past it (it sees no key:
 * 0 out, no gradient), f32 and bf16 (on the native tiles where they are
 * measured fastest). Starts of 0 are the unpacked attention bit for bit;
 * bad starts are refused by name. tests/gemm.cmake runs this file under
 * every ISA level below the machine's too (the row kernels' variants). */
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

typedef struct kcase {
    int64_t B, H, Hkv, Tq, Tk, D;
    unsigned seed; /* of the sequence boundaries */
    int64_t *start; /* [B, Tq] */
} kcase;

/* c's starts: rows cut into sequences of 1 to 2 * mean tokens at random,
 * each query's start the first key of its sequence (keys at the positions
 * Tk - Tq + i of the queries and before them: the keys before the first
 * query are a sequence of their own). */
static void starts_of(kcase *c, int64_t mean) {
    c->start = malloc(sizeof(int64_t) * (size_t)(c->B * c->Tq));
    unsigned s = c->seed;
    for (int64_t b = 0; b < c->B; b++) {
        int64_t first = 0, left = 0;
        for (int64_t i = 0; i < c->Tq; i++) {
            int64_t pos = c->Tk - c->Tq + i;
            if (left-- <= 0) {
                s = s * 1103515245u + 12345u;
                left = (int64_t)((s >> 16) % (unsigned)(2 * mean)); /* this one and `left` more */
                first = pos;
            }
            c->start[b * c->Tq + i] = first;
        }
    }
}

/* Query i at position qpos of batch row b sees key j where its start <= j
 * <= qpos (c: the kcase). */
static bool packed_sees(const void *ctx, int64_t b, int64_t i, int64_t qpos, int64_t j) {
    const kcase *c = ctx;
    return j >= c->start[b * c->Tq + i] && j <= qpos;
}

/* The attention in double with c's starts (sdpa_reference): a row that sees no key 0. */
static void reference(const kcase *c, const float *q, const float *k, const float *v, float *o) {
    sdpa_reference((sdpa_dims){c->B, c->H, c->Hkv, c->Tq, c->Tk, c->D}, q, k, v, packed_sees, c, true, o);
}

/* The fused op's output as [B, H, Tq, D] (it gives [B, Tq, H, D]). */
static accel_tensor *fused(accel_tensor *q, accel_tensor *k, accel_tensor *v, const kcase *c) {
    return accel_transpose(accel__sdpa_packed(q, k, v, c->start, 0.0), 1, 2);
}

/* The explicit scores under the same mask (the SDPA rule for a row that
 * sees no key). */
static accel_tensor *explicit_of(accel_tensor *q, accel_tensor *k, accel_tensor *v, const kcase *c) {
    accel__pad_mask pm;
    if (accel__pad_mask_make(&pm, NULL, c->start, c->B, c->Tq, c->Tk, c->Tk - c->Tq, 0,
                             accel__scores_dtype(q, true), q->device) != ACCEL_OK)
        return NULL;
    return accel__masked_attention_pad(q, k, v, c->Tk - c->Tq, 0, &pm, true, 0.0, 0.0, 0.0, NULL, true);
}

/* Row i of batch row b sees no key: its start lies past its position. */
static bool unseen(const kcase *c, int64_t b, int64_t i) { return c->start[b * c->Tq + i] > c->Tk - c->Tq + i; }

/* Every element of rows that see no key is 0 in t [B, H, Tq, D]. */
static void check_unseen_zero(const kcase *c, accel_tensor *t, const char *what, const char *of) {
    float *f = t ? floats_of(accel_contiguous(t)) : NULL;
    CHECK_MSG(f, "%s: %s", what, of);
    for (int64_t b = 0; f && b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->Tq; i++)
                for (int64_t e = 0; unseen(c, b, i) && e < c->D; e++)
                    CHECK_MSG(f[((b * c->H + h) * c->Tq + i) * c->D + e] == 0.0f, "%s: %s of unseen row %lld", what,
                              of, (long long)i);
    free(f);
}

static void check_case(const kcase *c, const char *what) {
    accel_tensor *q = gc_randn(11, ACCEL_SHAPE(c->B, c->H, c->Tq, c->D)),
                 *k = gc_randn(12, ACCEL_SHAPE(c->B, c->Hkv, c->Tk, c->D)),
                 *v = gc_randn(13, ACCEL_SHAPE(c->B, c->Hkv, c->Tk, c->D)), *in[3] = {q, k, v};
    float *fq = floats_of(q), *fk = floats_of(k), *fv = floats_of(v);
    float *want = malloc(sizeof(float) * (size_t)accel_numel(q));
    reference(c, fq, fk, fv, want);
    accel_tensor *wt = accel_from_data(ACCEL_F32, 4, q->shape, want);

    accel_tensor *o = fused(q, k, v, c), *g[3], *ge[3], *gr[3], *gb[3];
    CHECK_MSG(fx_compare(what, o, wt, 1e-5, 1e-6) == 0, "%s: fused vs reference", what);
    check_unseen_zero(c, o, what, "o");
    grads_of(o, in, g);
    accel_tensor *oe = explicit_of(q, k, v, c);
    CHECK_MSG(fx_compare(what, oe, wt, 1e-5, 1e-6) == 0, "%s: explicit vs reference", what);
    grads_of(oe, in, ge);
    for (int i = 0; i < 3; i++) CHECK_MSG(fx_compare(what, g[i], ge[i], 1e-4, 1e-5) == 0, "%s: grad %d", what, i);
    check_unseen_zero(c, g[0], what, "dq");
    /* the reference kernels (the forward's; the backward has one path) */
    bool prev = accel_set_reference_kernels(true);
    sdpa_check_against(what, "reference kernels", fused(q, k, v, c), wt, in, gr, ge);
    accel_set_reference_kernels(prev);
    /* bf16 (the native tiles or the f32 tiles' widening) against f32 */
    accel_tensor *ob =
        fused(accel_to_dtype(q, ACCEL_BF16), accel_to_dtype(k, ACCEL_BF16), accel_to_dtype(v, ACCEL_BF16), c);
    CHECK_MSG(ob && ob->dtype == ACCEL_BF16 && fx_compare(what, ob, wt, 3e-2, 3e-2) == 0, "%s: bf16", what);
    check_unseen_zero(c, ob, what, "bf16 o");
    grads_of(ob, in, gb);
    for (int i = 0; i < 3; i++) CHECK_MSG(fx_compare(what, gb[i], ge[i], 5e-2, 5e-2) == 0, "%s: bf16 grad %d", what, i);
    accel_step_reset();
    free3(g), free3(ge), free3(gr), free3(gb);
    free(fq), free(fk), free(fv), free(want);
    free3(in);
}

static void test_vs_explicit_and_reference(void) {
    kcase cases[] = {
        /* short sequences (of one token too), GQA */
        {2, 4, 2, 23, 23, 8, 1, NULL},
        /* past the 64-row query blocks, sequences across their boundaries, MQA */
        {2, 2, 1, 150, 150, 16, 2, NULL},
        /* whole blocks (the native tiles' shapes), GQA */
        {1, 4, 2, 128, 128, 32, 3, NULL},
        /* decode-like: Tq < Tk over earlier keys */
        {2, 2, 2, 5, 12, 8, 4, NULL},
    };
    const int64_t mean[] = {3, 40, 30, 2};
    char what[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        starts_of(&cases[i], mean[i]);
        snprintf(what, sizeof what, "case %zu", i);
        check_case(&cases[i], what);
        free(cases[i].start);
    }
    /* queries whose start lies past them (they see no key), in the block of
     * 64 and past it */
    kcase c = {1, 2, 1, 70, 70, 8, 5, NULL};
    starts_of(&c, 20);
    c.start[3] = 4, c.start[66] = 70, c.start[69] = 70;
    check_case(&c, "unseen rows");
    free(c.start);
}

/* Starts of 0 are the unpacked attention, bit for bit, forward and backward. */
static void test_zero_starts_are_unpacked(void) {
    kcase c = {2, 4, 2, 70, 70, 8, 0, NULL};
    c.start = calloc((size_t)(c.B * c.Tq), sizeof(int64_t));
    accel_tensor *q = gc_randn(21, ACCEL_SHAPE(c.B, c.H, c.Tq, c.D)),
                 *k = gc_randn(22, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D)),
                 *v = gc_randn(23, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D)), *in[3] = {q, k, v}, *ga[3], *gb[3];
    accel_tensor *a = accel__sdpa_packed(q, k, v, c.start, 0.0);
    CHECK(a && fx_compare("zero starts", a, accel__sdpa_heads_last(q, k, v, true, 0.0), 0.0, 0.0) == 0);
    grads_of(a, in, ga);
    grads_of(accel__sdpa_heads_last(q, k, v, true, 0.0), in, gb);
    for (int i = 0; i < 3; i++) CHECK_MSG(fx_compare("zero starts", ga[i], gb[i], 0.0, 0.0) == 0, "grad %d", i);
    accel_step_reset();
    free3(ga), free3(gb), free3(in);
    free(c.start);
}

static accel_tensor *loss_packed(accel_tensor *const *in, int n, void *ctx) {
    (void)n;
    return gc_weighted_sum(fused(in[0], in[1], in[2], ctx));
}

static void test_gradcheck(void) {
    /* three sequences in row 0 (one of a single token), two in row 1; Tq < Tk */
    kcase c = {2, 2, 1, 6, 7, 4, 0, (int64_t[]){1, 2, 2, 2, 5, 5, 0, 0, 0, 4, 4, 4}};
    accel_tensor *in[3] = {gc_randn(31, ACCEL_SHAPE(c.B, c.H, c.Tq, c.D)),
                           gc_randn(32, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D)),
                           gc_randn(33, ACCEL_SHAPE(c.B, c.Hkv, c.Tk, c.D))};
    CHECK(gradcheck("sdpa packed", loss_packed, &c, 3, in, NULL) == 0);
    free3(in);
}

static void test_refusals(void) {
    accel_tensor *q = gc_randn(51, ACCEL_SHAPE(1, 2, 3, 4)), *k = gc_randn(52, ACCEL_SHAPE(1, 2, 5, 4)),
                 *v = gc_randn(53, ACCEL_SHAPE(1, 2, 5, 4));
    const int64_t bad[][3] = {{0, -1, 0}, {0, 0, 6}};
    for (int i = 0; i < 2; i++) {
        CHECK(!accel__sdpa_packed(q, k, v, bad[i], 0.0));
        CHECK_STR_CONTAINS(accel_last_error(), "key_start of batch row 0, query");
    }
    accel_clear_error();
    accel_step_reset();
    accel_tensor_free(q), accel_tensor_free(k), accel_tensor_free(v);
}

/* On meta the op gives shapes only, the starts unread. */
static void test_meta_shapes(void) {
    accel_tensor *q = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(1, 2, 3, 4), ACCEL_META_DEVICE);
    accel_clear_error();
    accel_tensor *y = accel__sdpa_packed(q, q, q, (const int64_t[]){0, 9, -1}, 0.0);
    CHECK_MSG(y && y->device.type == ACCEL_DEV_META && y->shape[1] == 3 && y->shape[2] == 2, "%s", accel_last_error());
    accel_step_reset();
}

int main(void) {
    RUN(test_vs_explicit_and_reference);
    RUN(test_zero_starts_are_unpacked);
    RUN(test_gradcheck);
    RUN(test_refusals);
    RUN(test_meta_shapes);
    return check_summary();
}
