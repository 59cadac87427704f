/* CPU GEMM used by every op that multiplies matrices (not public API).
 *
 * All matrices are row-major. C [M, N] = alpha * op(A) op(B) + beta * C where
 * op(A) is [M, K] (A stored [K, M] when trans_a) and op(B) is [K, N] (B stored
 * [N, K] when trans_b). With beta == 0, C is overwritten (NaNs in it ignored).
 *
 * The f32 path calls OpenBLAS cblas_sgemm on the buffers as they are (a
 * transposed operand is never copied); with M <= 4 rows (decoding one token)
 * it calls one cblas_sgemv per row instead, which packs nothing. BLAS runs
 * single-threaded; a large
 * GEMM is split into row or column blocks computed by the OpenMP threads
 * (one thread pool: OpenBLAS's pthread pool and the OpenMP pool of the other
 * ops otherwise spin against each other on the cores). Called inside an
 * OpenMP parallel region, it computes on the calling thread alone. Under accel_reference_kernels() a plain
 * triple loop (double accumulation) runs instead; tests compare the two.
 */
#ifndef ACCEL_BACKENDS_CPU_GEMM_H
#define ACCEL_BACKENDS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "accel/core.h"

/* f32 GEMM; dispatches to OpenBLAS or to the reference loop. Sizes must fit
 * in an int (checked by accel__gemm; internal callers guarantee it). */
void accel__sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc);

/* Makes OpenBLAS run on the calling thread (openblas_set_num_threads(1)),
 * once, outside parallel regions. accel__sgemm does it itself; an op that
 * calls accel__sgemm from inside its own OpenMP region calls it before the
 * region. (A program that also calls BLAS directly and wants it threaded
 * must set the BLAS thread count again before its own calls.) */
void accel__blas_single_thread(void);

/* The plain reference loop (always; no dispatch). */
void accel__sgemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      float *C, int64_t ldc);

/* GEMM with operands of dtype f32, bf16 or f16 and an f32 result (f32
 * accumulation). Low-precision operands are converted to f32 panels in the
 * step arena, then accel__sgemm runs. Returns ACCEL_OK or an error (OOM, a
 * size that does not fit the BLAS int, a non-float dtype). */
accel_status accel__gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void *A, accel_dtype a_dt, int64_t lda, const void *B,
                         accel_dtype b_dt, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
