/* attention_rows.c's kernels in every CPU variant this machine runs:
 *   - accel__cpu_dot_rows gives the bits of its fixed order (16 partial
 *     sums, element e into sum e % 16, then added pairwise) whatever the
 *     variant, for f32, bf16 and f16 rows apart, lengths around the lanes
 *     and past a widening piece (256);
 *   - the score rows (softmax, its recomputation from lse, its gradient) of
 *     causal blocks (rows that see no key, one key, a partial vector, the
 *     whole block) and of unmasked ones: their values against a double
 *     loop, zeros past each row's keys (also where the scores held
 *     garbage), lse; and with lp, the chunk-major rounding (bf16, f16; keys
 *     past one chunk) equal to the bits of rounding the same call's f32
 *     rows without lp (the forward folds its normalisation into it). */
#include <math.h>
#include <string.h>

#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "check.h"
#include "each_cpu_variant.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---- dot rows */

static float elem(const void *p, accel_dtype dt, int64_t i) { return (float)accel__load_elem(p, dt, (size_t)i); }

/* The fixed order the kernel documents, in scalar code. */
static float dot_model(const void *a, accel_dtype adt, const void *b, accel_dtype bdt, int64_t n) {
    float acc[16] = {0};
    for (int64_t e = 0; e < n; e++) acc[e % 16] += elem(a, adt, e) * elem(b, bdt, e);
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

static void dot_rows_same_bits(const char *variant) {
    static const accel_dtype DT[3] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    static const int64_t N[] = {1, 15, 16, 17, 64, 300, 530};
    enum { ROWS = 3 };
    for (size_t ni = 0; ni < sizeof N / sizeof N[0]; ni++)
        for (int ai = 0; ai < 3; ai++)
            for (int bi = 0; bi < 3; bi++) {
                int64_t n = N[ni], lda = n + 5, ldb = 2 * n + 1;
                char a[ROWS * 1200 * 4], b[ROWS * 1200 * 4];
                for (int64_t i = 0; i < ROWS * lda; i++) accel__store_elem(a, DT[ai], (size_t)i, uniform() * 4.0);
                for (int64_t i = 0; i < ROWS * ldb; i++) accel__store_elem(b, DT[bi], (size_t)i, uniform() * 4.0);
                float got[ROWS];
                accel__cpu_dot_rows(got, a, DT[ai], lda, b, DT[bi], ldb, ROWS, n);
                for (int r = 0; r < ROWS; r++) {
                    size_t as = accel_dtype_size(DT[ai]), bs = accel_dtype_size(DT[bi]);
                    float want = dot_model(a + (size_t)(r * lda) * as, DT[ai], b + (size_t)(r * ldb) * bs, DT[bi], n);
                    CHECK_MSG(memcmp(&got[r], &want, sizeof want) == 0, "%s: dot rows n %lld %s x %s row %d: %.9g vs %.9g",
                              variant, (long long)n, accel_dtype_name(DT[ai]), accel_dtype_name(DT[bi]), r,
                              (double)got[r], (double)want);
                }
            }
}

/* ---- score rows */

enum { ROWS = 20, MAXK = 300, LD = 304, CHUNK = 256 };

/* Keys row r of b sees (the kernels' rule, kernels.h). */
static int64_t keys_of(const accel__score_block *b, int64_t r) {
    if (!b->causal) return b->kend;
    int64_t n = b->n0 + r;
    return n < 0 ? 0 : n < b->kend ? n : b->kend;
}

/* Element (r, j) of the chunk-major lp of b. */
static size_t chunk_at(const accel__score_block *b, int64_t r, int64_t j) {
    int64_t j0 = j / b->chunk * b->chunk, c = b->kend - j0 < b->chunk ? b->kend - j0 : b->chunk;
    return (size_t)(b->rows * j0 + r * c + (j - j0));
}

/* lp of b equals the rounding of f32 rows p (row stride LD), bit for bit. */
static void check_rounding(const char *what, const accel__score_block *b, const void *lp, const float *p) {
    int bad = 0;
    for (int64_t r = 0; r < b->rows; r++)
        for (int64_t j = 0; j < b->kend; j++) {
            uint16_t want;
            accel__cpu_from_f32(&want, b->dt, &p[r * LD + j], 1);
            uint16_t got = ((const uint16_t *)lp)[chunk_at(b, r, j)];
            if (got != want && ++bad <= 3)
                fprintf(stderr, "%s [%lld, %lld]: %04x vs %04x\n", what, (long long)r, (long long)j, got, want);
        }
    CHECK_MSG(bad == 0, "%s: %d roundings differ", what, bad);
}

/* Rows past their keys are zeros; the rest within 1e-5 of want (double): f32
 * sums of up to 300 terms, in whatever order the variant (or -O0) adds them. */
static void check_rows(const char *what, const accel__score_block *b, const float *got, const double *want) {
    int bad = 0;
    for (int64_t r = 0; r < b->rows; r++)
        for (int64_t j = 0; j < b->kend; j++) {
            double w = j < keys_of(b, r) ? want[r * LD + j] : 0.0, g = got[r * LD + j];
            if (fabs(g - w) > 1e-5 * fabs(w) + 1e-30 && ++bad <= 3)
                fprintf(stderr, "%s [%lld, %lld]: %.9g vs %.9g\n", what, (long long)r, (long long)j, g, w);
        }
    CHECK_MSG(bad == 0, "%s: %d values off", what, bad);
}

static void score_case(const char *variant, int64_t kend, int64_t n0, bool causal, accel_dtype dt) {
    accel__score_block b = {.rows = ROWS, .kend = kend, .n0 = n0, .causal = causal, .scale = 0.3f, .chunk = CHUNK};
    static float s[ROWS * LD], s2[ROWS * LD], p[ROWS * LD], p2[ROWS * LD], g[ROWS * LD], g2[ROWS * LD];
    static double want[ROWS * LD];
    static uint16_t lp[ROWS * LD];
    float lse[ROWS], lse2[ROWS], delta[ROWS];
    for (int i = 0; i < ROWS * LD; i++) s[i] = uniform() * 20.0f, g[i] = uniform();
    for (int r = 0; r < ROWS; r++) delta[r] = uniform();
    /* the masked scores hold garbage: the kernels must not read them */
    for (int64_t r = 0; r < ROWS; r++)
        for (int64_t j = keys_of(&b, r); j < kend; j++) s[r * LD + j] = j % 2 ? NAN : INFINITY;
    memcpy(s2, s, sizeof s);
    char what[160];
    snprintf(what, sizeof what, "%s: kend %lld n0 %lld %s %s", variant, (long long)kend, (long long)n0,
             causal ? "causal" : "unmasked", accel_dtype_name(dt));

    /* softmax, f32 rows; its values and lse against doubles */
    accel__cpu_softmax_rows(&b, p, LD, s, LD, lse);
    for (int64_t r = 0; r < ROWS; r++) {
        int64_t n = keys_of(&b, r);
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < n; j++) m = fmax(m, 0.3 * (double)s2[r * LD + j]);
        for (int64_t j = 0; j < n; j++) sum += exp(0.3 * (double)s2[r * LD + j] - m);
        for (int64_t j = 0; j < n; j++) want[r * LD + j] = exp(0.3 * (double)s2[r * LD + j] - m) / sum;
        double l = n ? m + log(sum) : -INFINITY;
        CHECK_MSG(n ? fabs(lse[r] - l) <= 2e-6 * fabs(l) + 1e-6 : isinf(lse[r]) && lse[r] < 0, "%s: lse row %lld %.9g vs %.9g",
                  what, (long long)r, (double)lse[r], l);
    }
    check_rows(what, &b, p, want);
    /* softmax with lp: the same lse, lp = the rounded f32 rows */
    memcpy(s, s2, sizeof s);
    b.lp = lp, b.dt = dt;
    accel__cpu_softmax_rows(&b, p2, LD, s, LD, lse2);
    CHECK_MSG(memcmp(lse, lse2, sizeof lse) == 0, "%s: lse with lp differs", what);
    check_rounding(what, &b, lp, p);
    /* the probabilities again from lse, in place over the scores */
    memcpy(s, s2, sizeof s);
    b.lp = NULL;
    accel__cpu_probs_rows(&b, s, LD, s, LD, lse);
    check_rows(what, &b, s, want);
    memcpy(s, s2, sizeof s);
    b.lp = lp;
    accel__cpu_probs_rows(&b, p2, LD, s, LD, lse);
    check_rounding(what, &b, lp, p2);
    /* the gradient: the element-wise formula's bits, zeros past the keys */
    memcpy(g2, g, sizeof g);
    b.lp = NULL;
    accel__cpu_softmax_grad_rows(&b, p, LD, g, LD, delta);
    int bad = 0;
    for (int64_t r = 0; r < ROWS; r++)
        for (int64_t j = 0; j < kend; j++) {
            /* past the keys a zero of either sign (P is 0 there) */
            float w = p[r * LD + j] * (g2[r * LD + j] - delta[r]) * 0.3f, got = g[r * LD + j];
            bad += j < keys_of(&b, r) ? memcmp(&w, &got, sizeof w) != 0 : got != 0.0f;
        }
    CHECK_MSG(bad == 0, "%s: %d gradients differ", what, bad);
    memcpy(g, g2, sizeof g);
    b.lp = lp;
    accel__cpu_softmax_grad_rows(&b, p, LD, g2, LD, delta);
    check_rounding(what, &b, lp, g2);
}

static void score_rows(const char *variant) {
    for (int di = 0; di < 2; di++) {
        accel_dtype dt = di ? ACCEL_F16 : ACCEL_BF16;
        /* rows seeing no key to one key to 20; partial vectors; the whole
         * block; keys past one chunk; unmasked */
        score_case(variant, 64, -3, true, dt);
        score_case(variant, 64, 1, true, dt);
        score_case(variant, 33, 14, true, dt);
        score_case(variant, 300, 281, true, dt);
        score_case(variant, 300, 0, false, dt);
        score_case(variant, 17, 0, false, dt);
    }
}

static void all(const char *variant) {
    dot_rows_same_bits(variant);
    score_rows(variant);
}

int main(void) {
    each_cpu_variant(all);
    return check_summary();
}
