/* The cross-entropy reading bf16 logits directly (the fused kernel widens
 * each row exactly; accel_llama_loss's path under bf16 autocast) against
 * the logits made f32 first (transformers' logits.float(), Accelerate's
 * convert_outputs_to_fp32): the same loss and the same bf16 logits
 * gradient, bit for bit, whatever the incoming gradient (accel_backward's
 * seed; 1, 1/3 as gradient accumulation's, a power of two, a loss scale,
 * a negative one, given through accel_backward_with), with targets
 * ignored (-100, or an ignore_index inside [0, C)), all of them ignored
 * (nan), vocabularies that are no multiple of 16, rows whose
 * probabilities reach f32's subnormals. Then a tiny Llama's step through
 * an Accelerator (bf16, gradient accumulation 3, vocabulary 40):
 * accel_llama_loss against accel_llama_forward's f32 logits and
 * accel_cross_entropy, the loss and every gradient bit for bit.
 * accel_cross_entropy has no label smoothing or reduction option (the mean
 * over the counted targets). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "tiny_llama.h"

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* logits [B, T, C] as bf16 bits: uniform in [-8, 8), and on row 1 in
 * [-60, 60) (exponentials down to f32's subnormals, and to 0) */
static void make_logits(uint16_t *bits, int64_t N, int64_t C, uint64_t seed) {
    for (int64_t i = 0; i < N * C; i++) {
        float v = (float)lcg(&seed) / (float)(1u << 31) * 16.0f - 8.0f;
        if (i / C == 1) v = v * 7.5f;
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        bits[i] = (uint16_t)(u >> 16);
    }
}

/* targets [N]: every fifth ignore, every seventh the class 3 (ignored too
 * where ignore is 3) */
static void make_targets(int64_t *t, int64_t N, int64_t C, int64_t ignore, uint64_t seed) {
    for (int64_t i = 0; i < N; i++) t[i] = i % 5 == 4 ? ignore : i % 7 == 2 ? 3 : (int64_t)(lcg(&seed) % (uint64_t)C);
}

/* One loss and backward of the logits bits [B, T, C]: through an f32 copy
 * (upcast) or read as they are; g NULL: accel_backward's seed, else
 * accel_backward_with *g. The loss's bits into *loss, the bf16 logits
 * gradient into grad [B T C]. */
static bool ce_step(const uint16_t *bits, const int64_t *t, int64_t B, int64_t T, int64_t C, int64_t ignore,
                    bool upcast, const float *g, uint32_t *loss, uint16_t *grad) {
    accel_tensor *x = accel_from_data(ACCEL_BF16, ACCEL_SHAPE(B, T, C), bits);
    accel_tensor *tt = accel_from_data(ACCEL_I64, ACCEL_SHAPE(B, T), t);
    CHECK(x && tt && accel_requires_grad_(x, true) == ACCEL_OK);
    accel_tensor *l = accel_cross_entropy(upcast ? accel_to_dtype(x, ACCEL_F32) : x, tt, ignore);
    accel_status st = !l ? accel_last_status()
                      : g ? accel_backward_with(l, accel_from_data(ACCEL_F32, 0, NULL, g))
                          : accel_backward(l);
    bool ok = st == ACCEL_OK && x->grad && x->grad->dtype == ACCEL_BF16;
    CHECK_MSG(ok, "%s", accel_last_error());
    if (ok) {
        memcpy(loss, l->data, sizeof *loss);
        memcpy(grad, x->grad->data, (size_t)(B * T * C) * sizeof *grad);
    }
    accel_step_reset();
    return ok;
}

static void check_both_ways(int64_t B, int64_t T, int64_t C, int64_t ignore, bool all_ignored) {
    int64_t N = B * T;
    uint16_t *bits = malloc((size_t)(N * C) * sizeof *bits), *ga = malloc((size_t)(N * C) * sizeof *ga),
             *gb = malloc((size_t)(N * C) * sizeof *gb);
    int64_t *t = malloc((size_t)N * sizeof *t);
    make_logits(bits, N, C, (uint64_t)(C * 31 + B));
    make_targets(t, N, C, ignore, (uint64_t)C);
    for (int64_t i = 0; all_ignored && i < N; i++) t[i] = ignore;
    const float gs[] = {1.0f, 1.0f / 3.0f, 0.25f, 1024.0f, -0.7f};
    for (int k = -1; k < (int)(sizeof gs / sizeof gs[0]); k++) {
        const float *g = k < 0 ? NULL : &gs[k];
        uint32_t la, lb;
        if (!ce_step(bits, t, B, T, C, ignore, false, g, &la, ga) ||
            !ce_step(bits, t, B, T, C, ignore, true, g, &lb, gb))
            break;
        CHECK_MSG(la == lb, "[%lld, %lld, %lld] ignore %lld g %g: loss bits %08x direct, %08x upcast", (long long)B,
                  (long long)T, (long long)C, (long long)ignore, g ? *g : 1.0, la, lb);
        int64_t bad = -1;
        for (int64_t i = 0; i < N * C && bad < 0; i++)
            if (ga[i] != gb[i]) bad = i;
        CHECK_MSG(bad < 0, "[%lld, %lld, %lld] ignore %lld g %g: gradient element %lld %04x direct, %04x upcast",
                  (long long)B, (long long)T, (long long)C, (long long)ignore, g ? *g : 1.0, (long long)bad,
                  bad < 0 ? 0 : ga[bad], bad < 0 ? 0 : gb[bad]);
        float lf;
        memcpy(&lf, &la, sizeof lf);
        CHECK(all_ignored ? isnan(lf) : isfinite(lf));
    }
    free(bits);
    free(ga);
    free(gb);
    free(t);
}

static void test_ops_bit_identical(void) {
    check_both_ways(2, 3, 37, -100, false);  /* one thread's rows */
    check_both_ways(2, 24, 1000, -100, false); /* rows over the threads */
    check_both_ways(2, 24, 1000, 3, false);    /* ignore_index a class */
    check_both_ways(1, 4, 40, -100, true);     /* nothing counted */
    check_both_ways(2, 4, 64, -100, false);    /* a multiple of 16 */
}

/* loss bits and every parameter's gradient of the tiny Llama's bf16 step
 * (gradient accumulation 3) on ids [2, 16]: accel_llama_loss, or
 * accel_llama_forward (its f32 logits) and accel_cross_entropy on the
 * shifted labels. grads: the parameters' gradients, concatenated. */
static size_t llama_step(bool upcast, uint32_t *loss, float *grads, size_t cap) {
    enum { B = 2, T = 16 };
    int64_t ids[B * T], labels[B * T];
    uint64_t s = 7;
    for (int i = 0; i < B * T; i++) ids[i] = (int64_t)(lcg(&s) % 40);
    for (int i = 0; i < B * T; i++) labels[i] = i % T == T - 1 ? -100 : ids[i + 1];
    accel_module *m = tiny_llama(3);
    accel_accelerator_opts o = {.mixed_precision = "bf16", .gradient_accumulation_steps = 3};
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(m && acc && accel_accelerator_prepare(acc, m) == ACCEL_OK, "%s", accel_last_error());
    accel_tensor *it = accel_from_data(ACCEL_I64, ACCEL_SHAPE(B, T), ids);
    accel_dtype prev = accel_accelerator_autocast_begin(acc);
    accel_tensor *l = upcast ? accel_cross_entropy(accel_llama_forward(m, it, NULL),
                                                   accel_from_data(ACCEL_I64, ACCEL_SHAPE(B, T), labels), -100)
                             : accel_llama_loss(m, it);
    accel_accelerator_autocast_end(acc, prev);
    CHECK_MSG(l && accel_accelerator_backward(acc, l) == ACCEL_OK, "%s", accel_last_error());
    size_t n = 0;
    if (l) memcpy(loss, l->data, sizeof *loss);
    accel_tensor **ps = NULL;
    int np = accel_module_parameters(m, &ps);
    for (int i = 0; i < np; i++) {
        accel_tensor *gr = ps[i]->grad;
        CHECK(gr && gr->dtype == ACCEL_F32 && accel_is_contiguous(gr) && n + (size_t)accel_numel(gr) <= cap);
        if (!gr || n + (size_t)accel_numel(gr) > cap) break;
        memcpy(grads + n, gr->data, accel_nbytes(gr));
        n += (size_t)accel_numel(gr);
    }
    free(ps);
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_module_free(m);
    return n;
}

static void test_llama_step_bit_identical(void) {
    enum { CAP = 1 << 16 };
    float *ga = malloc(CAP * sizeof *ga), *gb = malloc(CAP * sizeof *gb);
    uint32_t la = 0, lb = 1;
    size_t na = llama_step(false, &la, ga, CAP), nb = llama_step(true, &lb, gb, CAP);
    CHECK_MSG(la == lb, "loss bits %08x accel_llama_loss, %08x upcast", la, lb);
    CHECK(na == nb && na > 0);
    CHECK_MSG(na == nb && !memcmp(ga, gb, na * sizeof *ga), "the parameters' gradients differ");
    free(ga);
    free(gb);
}

int main(void) {
    RUN(test_ops_bit_identical);
    RUN(test_llama_step_bit_identical);
    accel_thread_cleanup();
    return check_summary();
}
