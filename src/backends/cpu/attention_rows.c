/* The row loops of attention's softmax and of its gradient, compiled once per
 * ISA variant (cpu_variants.h): the exponentials of vec_math.h's accel__expf
 * run 16 wide on AVX-512 and 8 on AVX2 with FMA, where the library's
 * baseline compile runs them 4 wide without FMA. A call takes a block of
 * score rows (a query block's, 64 rows of 64 to a few thousand keys): a
 * call and its set-up per row (the polynomial's constants broadcast, the
 * dispatch) showed beside rows of ~160 keys. */

/* No multiply-add fused (GCC fuses none in ISO C mode; clang's default
 * does): dot_rows' fixed order gives the same bits in every variant only
 * then. Before the includes: clang applies it where a function is
 * defined, and vec_math.h's are. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#include <string.h>

#include "cpu_kernels.h"
#include "vec_math.h"

/* The first key row r of b sees: k0, or the row's start past it. */
static inline int64_t row_first(const accel__score_block *b, int64_t r) {
    return b->starts && b->starts[r] > b->k0 ? b->starts[r] : b->k0;
}

/* The end of the keys row r of b sees: its first n0 + r under the causal
 * mask (within 0 and kend), all kend otherwise; 0 when none lies at or past
 * its first (the row sees no key). */
static inline int64_t row_keys(const accel__score_block *b, int64_t r) {
    int64_t n = b->causal ? b->n0 + r : b->kend;
    n = n < 0 ? 0 : n < b->kend ? n : b->kend;
    return n > row_first(b, r) ? n : 0;
}

/* The keys before its first of row r, which sees some (n > 0), masked:
 * -inf scores. */
static inline void mask_below(const accel__score_block *b, int64_t r, float *sr, int64_t n) {
    for (int64_t j = 0, first = row_first(b, r); n && j < first; j++) sr[j] = -INFINITY;
}

/* Columns the vector loops of a row of n visible keys run over: n rounded
 * up to 16 (an AVX-512 register of floats: whole vectors, no scalar tail),
 * at most kend; the masked scores among them are set to -inf (their
 * exponentials are 0) and the columns past them zeroed: a causal row of the
 * block on the diagonal sees half its kend on average. */
static inline int64_t row_span(const accel__score_block *b, int64_t n) {
    int64_t w = (n + 15) / 16 * 16;
    return w < b->kend ? w : b->kend;
}

/* Row r's kend values of row, each times mul, rounded to b->dt into the
 * chunk-major b->lp (chunk j: keys [j, j + c), c = min(chunk, kend - j), a
 * dense [rows, c] matrix at element rows j): one pass while the row is in
 * L1. mul = 1 leaves every value as it is (a NaN quieted, as the rounding
 * quiets it anyway). */
static void row_round(const accel__score_block *b, int64_t r, const float *row, float mul) {
    size_t es = accel_dtype_size(b->dt);
    for (int64_t j = 0; j < b->kend; j += b->chunk) {
        int64_t c = b->kend - j < b->chunk ? b->kend - j : b->chunk;
        accel__cpu_from_f32_scaled((char *)b->lp + (size_t)(b->rows * j + r * c) * es, b->dt, row + j, mul, c);
    }
}

static void zero_from(float *row, int64_t w, int64_t kend) {
    if (w < kend) memset(row + w, 0, (size_t)(kend - w) * sizeof *row);
}

ACCEL__VEC_MATH void accel__cpu_softmax_rows(const accel__score_block *b, float *p, int64_t ldp, float *s, int64_t lds,
                                             float *lse) {
    /* in two passes over the block's rows, the maxima, then the
     * exponentials with their sums and the rounding: a row's steps depend
     * on each other, rows do not, and short rows each run start to end
     * left the vector units waiting on each row's chain (~10% slower) */
    for (int64_t r = 0; r < b->rows; r++) {
        float *sr = s + r * lds;
        int64_t n = row_keys(b, r), w = n ? row_span(b, n) : 0;
        for (int64_t j = n; j < w; j++) sr[j] = -INFINITY;
        mask_below(b, r, sr, n);
        lse[r] = n ? b->scale * accel__vec_row_max(sr, w) : -INFINITY; /* the row's max for now */
    }
    for (int64_t r = 0; r < b->rows; r++) {
        float *row = p + r * ldp, *sr = s + r * lds, m = lse[r], sum = 0.0f, inv = 1.0f;
        int64_t n = row_keys(b, r), w = n ? row_span(b, n) : 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < w; j++) {
            float e = accel__expf(b->scale * sr[j] - m);
            row[j] = e;
            sum += e;
        }
        zero_from(row, w, b->kend);
        if (n) {
            inv = 1.0f / sum;
            lse[r] = m + logf(sum);
        }
        /* the normalisation: into the rounding where there is one (the
         * same bits as rounding the normalised row) */
        if (b->lp) {
            row_round(b, r, row, inv);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) row[j] *= inv;
        }
    }
}

ACCEL__VEC_MATH void accel__cpu_probs_rows(const accel__score_block *b, float *p, int64_t ldp, float *s, int64_t lds,
                                           const float *lse) {
    for (int64_t r = 0; r < b->rows; r++) {
        float *row = p + r * ldp, *sr = s + r * lds, l = lse[r];
        int64_t n = row_keys(b, r), w = n ? row_span(b, n) : 0;
        for (int64_t j = n; j < w; j++) sr[j] = -INFINITY;
        mask_below(b, r, sr, n);
#pragma omp simd
        for (int64_t j = 0; j < w; j++) row[j] = accel__expf(b->scale * sr[j] - l);
        zero_from(row, w, b->kend);
        if (b->lp) row_round(b, r, row, 1.0f);
    }
}

void accel__cpu_softmax_grad_rows(const accel__score_block *b, const float *p, int64_t ldp, float *g, int64_t ldg,
                                  const float *delta) {
    for (int64_t r = 0; r < b->rows; r++) {
        const float *pr = p + r * ldp;
        float *gr = g + r * ldg, dr = delta[r];
        int64_t n = row_keys(b, r), w = n ? row_span(b, n) : 0;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) gr[j] = pr[j] * (gr[j] - dr) * b->scale;
        zero_from(gr, w, b->kend);
        if (b->lp) row_round(b, r, gr, 1.0f);
    }
}

/* Lanes of dot_rows' partial sums: a 512-bit register of floats, two of
 * 256 bits, four of 128; the same additions in the same order on each. */
enum { LANES = 16, PIECE = 256 };

/* The products go to LANES partial sums (element e to lane e % LANES),
 * which are then added pairwise: one order of additions whatever the
 * variant. Rows of bf16 or f16 are widened PIECE elements at a time. */
ACCEL__VEC_MATH void accel__cpu_dot_rows(float *out, const void *a, accel_dtype adt, int64_t lda, const void *b,
                                         accel_dtype bdt, int64_t ldb, int64_t rows, int64_t n) {
    size_t as = accel_dtype_size(adt), bs = accel_dtype_size(bdt);
    float wa[PIECE], wb[PIECE];
    for (int64_t r = 0; r < rows; r++) {
        float acc[LANES] = {0};
        for (int64_t e0 = 0; e0 < n; e0 += PIECE) {
            int64_t len = n - e0 < PIECE ? n - e0 : PIECE;
            const char *pa = (const char *)a + (size_t)(r * lda + e0) * as;
            const char *pb = (const char *)b + (size_t)(r * ldb + e0) * bs;
            const float *x = adt == ACCEL_F32 ? (const float *)pa : wa, *y = bdt == ACCEL_F32 ? (const float *)pb : wb;
            if (x == wa) accel__cpu_to_f32(wa, pa, adt, len);
            if (y == wb) accel__cpu_to_f32(wb, pb, bdt, len);
            int64_t e = 0;
            for (; e + LANES <= len; e += LANES) {
#pragma omp simd
                for (int l = 0; l < LANES; l++) acc[l] += x[e + l] * y[e + l];
            }
            for (int l = 0; e + l < len; l++) acc[l] += x[e + l] * y[e + l];
        }
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int l = 0; l < w; l++) acc[l] += acc[l + w];
        out[r] = acc[0];
    }
}
