/* CPU GEMM: OpenBLAS sgemm, a reference loop, and low-precision operands
 * converted to f32 panels. */
#include "backends/cpu/gemm.h"
#include "backends/cpu/cpu_kernels.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <string.h>

#include "accel/ops.h"

void accel__sgemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) {
                float a = trans_a ? A[k * lda + i] : A[i * lda + k];
                float b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
                s += (double)a * (double)b;
            }
            float *c = &C[i * ldc + j];
            *c = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
    }
}

/* OpenBLAS (Debian's pthread build) keeps its own thread pool, which fights
 * the OpenMP pool of the other ops for the cores: each spins (sched_yield,
 * GOMP spin-wait) while the other works. So BLAS runs single-threaded on the
 * calling thread, and large GEMMs are split into independent row (or
 * column) blocks that the OpenMP threads compute, one sgemm each: one thread
 * pool in the process, and each block runs at the 1-thread sgemm speed. */
void accel__blas_single_thread(void) {
    if (!omp_in_parallel() && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

static void blas_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                       int64_t ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* Columns [lo, lo+n) of C rows [0, M) for small M, one sgemv per row of
 * op(A): sgemm would pack all of B for a handful of rows, which costs more
 * than the product itself (decode: one token, M = 1, against the weights). */
static void small_m_block(bool trans_a, bool trans_b, int64_t M, int64_t lo, int64_t n, int64_t K,
                          float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                          float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        const float *x = trans_a ? A + i : A + i * lda; /* row i of op(A) */
        int incx = trans_a ? (int)lda : 1;
        float *y = C + i * ldc + lo;
        if (beta == 0.0f) memset(y, 0, (size_t)n * sizeof(float)); /* NaNs in C are ignored */
        if (trans_b) /* B [N, K]: y = alpha B[lo:lo+n] x + beta y */
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)K, alpha, B + lo * ldb, (int)ldb, x, incx,
                        beta, y, 1);
        else /* B [K, N]: y = alpha B[:, lo:lo+n]^T x + beta y */
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)K, (int)n, alpha, B + lo, (int)ldb, x, incx, beta, y,
                        1);
    }
}

/* Rows of op(A) up to which accel__sgemm computes one matrix-vector product
 * per row. */
enum { SMALL_M = 4 };

void accel__sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || accel_reference_kernels()) {
        accel__sgemm_ref(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (M <= SMALL_M) {
        if (omp_in_parallel()) {
            small_m_block(trans_a, trans_b, M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        }
        accel__blas_single_thread();
        int nt = accel_num_threads();
        /* Column blocks of B (rows of the weight for a linear), at least 64
         * wide, ~2 per thread. A matrix-vector product is memory bound: on
         * the 2-core box one thread streams a 512x1024 weight as fast as two
         * (~11 GB/s, either way) and skips the wake-up of the other, so
         * only products of 4M+ multiply-adds (an lm_head) are split. */
        int64_t nb = N / 64 < 2 * nt ? N / 64 : 2 * nt;
        if (nt <= 1 || nb < 2 || (double)M * (double)N * (double)K < 4e6) {
            small_m_block(trans_a, trans_b, M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        }
        int64_t blk = ((N + nb - 1) / nb + 15) / 16 * 16;
        nb = (N + blk - 1) / blk;
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t b = 0; b < nb; b++) {
            int64_t lo = b * blk, n = N - lo < blk ? N - lo : blk;
            small_m_block(trans_a, trans_b, M, lo, n, K, alpha, A, lda, B, ldb, beta, C, ldc);
        }
        return;
    }
    if (omp_in_parallel()) { /* a caller's thread: BLAS is already single-threaded */
        blas_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    accel__blas_single_thread();
    int nt = accel_num_threads();
    /* Blocks of at least 64 rows/columns and ~4 per thread (dynamic, so a
     * core slowed by another process does not hold the others up); below
     * ~1 MFLOP a parallel region costs more than it saves. */
    bool by_rows = M >= N;
    int64_t len = by_rows ? M : N;
    int64_t nb = len / 64 < 4 * nt ? len / 64 : 4 * nt;
    if (nt <= 1 || nb < 2 || (double)M * (double)N * (double)K < 5e5) {
        blas_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int64_t blk = ((len + nb - 1) / nb + 15) / 16 * 16;
    nb = (len + blk - 1) / blk;
#pragma omp parallel for num_threads(nt) schedule(dynamic)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * blk, n = len - lo < blk ? len - lo : blk;
        if (by_rows) /* rows [lo, lo+n) of op(A) and C */
            blas_sgemm(trans_a, trans_b, n, N, K, alpha, trans_a ? A + lo : A + lo * lda, lda, B, ldb, beta,
                       C + lo * ldc, ldc);
        else /* columns [lo, lo+n) of op(B) and C */
            blas_sgemm(trans_a, trans_b, M, n, K, alpha, A, lda, trans_b ? B + lo * ldb : B + lo, ldb, beta,
                       C + lo, ldc);
    }
}

/* A [rows, cols] panel with leading dim ld of dtype dt as contiguous f32 (ld = cols). */
static const float *as_f32(const void *p, accel_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
    if (dt == ACCEL_F32) return p;
    float *f = accel_arena_alloc(accel_step_arena(), (size_t)(rows * cols) * sizeof(float), 64);
    if (!f) return NULL;
    size_t es = accel_dtype_size(dt);
    const char *src = p;
    for (int64_t r = 0; r < rows; r++)
        accel_convert(f + r * cols, ACCEL_F32, src + (size_t)(r * ld) * es, dt, (size_t)cols);
    return f;
}

static bool gemm_dtype_ok(accel_dtype dt) {
    return dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16;
}

accel_status accel__gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void *A, accel_dtype a_dt, int64_t lda, const void *B,
                         accel_dtype b_dt, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (!gemm_dtype_ok(a_dt) || !gemm_dtype_ok(b_dt))
        return accel_set_error(ACCEL_ERR_DTYPE, "accel_gemm: unsupported operand dtypes %s and %s",
                               accel_dtype_name(a_dt), accel_dtype_name(b_dt));
    int64_t big = M > N ? M : N;
    big = big > K ? big : K;
    int64_t ld = lda > ldb ? lda : ldb;
    ld = ld > ldc ? ld : ldc;
    if (big > INT_MAX || ld > INT_MAX)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "accel_gemm: matrix sizes M=%lld N=%lld K=%lld exceed the BLAS int range",
                               (long long)M, (long long)N, (long long)K);
    if (M <= 0 || N <= 0) return ACCEL_OK;
    /* Stored shapes of the operands. */
    int64_t ar = trans_a ? K : M, ac = trans_a ? M : K;
    int64_t br = trans_b ? N : K, bc = trans_b ? K : N;
    const float *a = as_f32(A, a_dt, ar, ac, lda);
    const float *b = as_f32(B, b_dt, br, bc, ldb);
    if (!a || !b) return accel_last_status();
    accel__sgemm(trans_a, trans_b, M, N, K, alpha, a, a_dt == ACCEL_F32 ? lda : (ac ? ac : 1), b,
                 b_dt == ACCEL_F32 ? ldb : (bc ? bc : 1), beta, C, ldc);
    return ACCEL_OK;
}

/* ---- the table's matrix kernels */

accel_status accel__cpuk_gemm(accel_k_gemm *k) {
    size_t as = accel_dtype_size(k->a->dtype), bs = accel_dtype_size(k->b->dtype);
    return accel__gemm(k->trans_a, k->trans_b, k->M, k->N, k->K, k->alpha,
                       (const char *)k->a->data + (size_t)k->a_off * as, k->a->dtype, k->lda,
                       (const char *)k->b->data + (size_t)k->b_off * bs, k->b->dtype, k->ldb, k->beta,
                       (float *)k->c->data + k->c_off, k->ldc);
}

accel_status accel__cpuk_bias_rows(accel_k_bias_rows *k) {
    float *dst = k->out->data;
    const float *bias = k->bias->data;
    int64_t R = k->R, O = k->O;
#pragma omp parallel for if (R * O > 65536) schedule(static)
    for (int64_t r = 0; r < R; r++) memcpy(dst + r * O, bias, (size_t)O * sizeof(float));
    return ACCEL_OK;
}

accel_status accel__cpuk_col_sum(accel_k_col_sum *k) {
    const float *g = k->g->data;
    float *db = k->out->data, beta = k->beta;
    int64_t R = k->R, O = k->O;
    int nt = accel_num_threads();
    int64_t chunk = (O + nt - 1) / nt;
    chunk = chunk < 64 ? 64 : (chunk + 15) / 16 * 16;
#pragma omp parallel for if (R * O > 65536) schedule(static)
    for (int64_t c0 = 0; c0 < O; c0 += chunk) {
        int64_t c1 = c0 + chunk < O ? c0 + chunk : O;
        for (int64_t j = c0; j < c1; j++) db[j] = beta == 0.0f ? 0.0f : db[j];
        for (int64_t r = 0; r < R; r++) {
            const float *gr = g + r * O;
            for (int64_t j = c0; j < c1; j++) db[j] += gr[j];
        }
    }
    return ACCEL_OK;
}
