/* The CPU kernels compiled once per instruction-set variant (not public API).
 *
 * The kernel files named in ACCEL_CPU_VARIANT_SOURCES (CMakeLists.txt) are
 * compiled once per variant of core/cpuinfo.h (baseline x86-64; AVX2 + FMA + F16C;
 * AVX-512) with that variant's -m flags and with cpu_variant_rename.h
 * force-included, which gives every function listed here the symbol
 * NAME_<variant> (baseline, avx2, avx512). cpu_dispatch.c defines NAME
 * itself: it calls NAME_<variant> of the variant core/cpuinfo.c chose at the
 * first call (the best one the CPU and OS allow). Callers see one function.
 *
 * Rules for those files: every function of theirs with external linkage is
 * listed here (a missing one is a duplicate symbol at link time), listed
 * functions return void, and the files define no writable variables with
 * static storage (each variant would get its own copy). Their static functions, and
 * the inline helpers they include (vec_math.h), are compiled into each
 * variant as they are: nothing in the kernels' code knows about variants.
 *
 * To vectorise another kernel file per ISA: add it to
 * ACCEL_CPU_VARIANT_SOURCES and its functions to this list.
 *
 * X(name, parameter list, argument list): the parameter list must match the
 * declaration in cpu_kernels.h (the compiler checks it in cpu_dispatch.c). */
#ifndef ACCEL_BACKENDS_CPU_VARIANTS_H
#define ACCEL_BACKENDS_CPU_VARIANTS_H

#include "backends/cpu/cpu_kernels.h"

#define ACCEL__CPU_VARIANT_KERNELS(X)                                                          \
    /* pointwise_kernels.c */                                                                  \
    X(accel__cpu_binary_f32,                                                                   \
      (accel__binop op, const accel__layout *l, const float *a, const float *b, float *out),   \
      (op, l, a, b, out))                                                                      \
    X(accel__cpu_binary_f32_lowp,                                                              \
      (accel__binop op, const float *f, const void *lo, accel_dtype lo_dt, bool lo_first, float *out, \
       int64_t n),                                                                             \
      (op, f, lo, lo_dt, lo_first, out, n))                                                    \
    X(accel__cpu_binary_ref,                                                                   \
      (accel__binop op, accel_tensor *out, const accel_tensor *a, const accel_tensor *b),      \
      (op, out, a, b))                                                                         \
    X(accel__cpu_unary_f32, (accel__unop op, double p, const float *x, float *y, int64_t n),   \
      (op, p, x, y, n))                                                                        \
    X(accel__cpu_unary_grad_f32,                                                               \
      (accel__unop op, double p, const float *g, const float *x, const float *y, float *dx,    \
       int64_t n),                                                                             \
      (op, p, g, x, y, dx, n))                                                                 \
    X(accel__cpu_unary_ref, (accel__unop op, double p, accel_tensor *y, const accel_tensor *x), \
      (op, p, y, x))                                                                           \
    X(accel__cpu_unary_grad_ref,                                                               \
      (accel__unop op, double p, accel_tensor *dx, const accel_tensor *g,                      \
       const accel_tensor *x, const accel_tensor *y),                                          \
      (op, p, dx, g, x, y))                                                                   \
    /* fused_kernels.c */                                                                      \
    X(accel__cpu_to_f32, (float *dst, const void *src, accel_dtype dt, int64_t n), (dst, src, dt, n)) \
    X(accel__cpu_from_f32, (void *dst, accel_dtype dt, const float *src, int64_t n), (dst, dt, src, n)) \
    X(accel__cpu_to_f32_rows,                                                                  \
      (float *dst, const void *src, accel_dtype dt, int64_t rows, int64_t n, int64_t stride),  \
      (dst, src, dt, rows, n, stride))                                                         \
    X(accel__cpu_from_f32_rows,                                                                \
      (void *dst, accel_dtype dt, const float *src, int64_t rows, int64_t n, int64_t stride),  \
      (dst, dt, src, rows, n, stride))                                                         \
    X(accel__cpu_copy_rows,                                                                    \
      (void *dst, const void *src, accel_dtype dt, int64_t rows, int64_t n, int64_t stride),   \
      (dst, src, dt, rows, n, stride))                                                         \
    X(accel__cpu_from_f32_scaled, (void *dst, accel_dtype dt, const float *src, float s, int64_t n), \
      (dst, dt, src, s, n))                                                                    \
    X(accel__cpu_convert,                                                                      \
      (void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt, int64_t n),         \
      (dst, dst_dt, src, src_dt, n))                                                           \
    X(accel__cpu_gemm_bf16w_nt,                                                                \
      (int64_t M, int64_t n, int64_t K, float alpha, const float *A, int64_t lda,             \
       const uint16_t *W, int64_t ldw, float beta, float *C, int64_t ldc),                     \
      (M, n, K, alpha, A, lda, W, ldw, beta, C, ldc))                                          \
    X(accel__cpu_swiglu, (const accel_k_swiglu *k), (k))                                       \
    X(accel__cpu_swiglu_backward, (const accel_k_swiglu_backward *k), (k))                     \
    X(accel__cpu_rope, (const accel_k_rope *k), (k))                                           \
    X(accel__cpu_cross_entropy_fused,                                                          \
      (const accel_k_cross_entropy_fused *k, int64_t count, int nt, float *scratch, double *total), \
      (k, count, nt, scratch, total))                                                          \
    /* attention_rows.c */                                                                     \
    X(accel__cpu_softmax_rows,                                                                 \
      (const accel__score_block *b, float *p, int64_t ldp, float *s, int64_t lds, float *lse), \
      (b, p, ldp, s, lds, lse))                                                                \
    X(accel__cpu_probs_rows,                                                                   \
      (const accel__score_block *b, float *p, int64_t ldp, float *s, int64_t lds,              \
       const float *lse),                                                                      \
      (b, p, ldp, s, lds, lse))                                                                \
    X(accel__cpu_softmax_grad_rows,                                                            \
      (const accel__score_block *b, const float *p, int64_t ldp, float *g, int64_t ldg,        \
       const float *delta),                                                                    \
      (b, p, ldp, g, ldg, delta))                                                              \
    X(accel__cpu_dot_rows,                                                                     \
      (float *out, const void *a, accel_dtype adt, int64_t lda, const void *b, accel_dtype bdt, \
       int64_t ldb, int64_t rows, int64_t n),                                                  \
      (out, a, adt, lda, b, bdt, ldb, rows, n))                                                \
    /* norm_rows.c */                                                                          \
    X(accel__cpu_rms_norm_row,                                                                 \
      (const float *x, const float *w, float *y, float *rstd, int64_t D, float eps, accel_dtype xdt), \
      (x, w, y, rstd, D, eps, xdt))                                                            \
    X(accel__cpu_rms_norm_dx_row,                                                              \
      (const float *x, const float *g, const float *w, float s, float *dx, float beta, int64_t D), \
      (x, g, w, s, dx, beta, D))                                                               \
    X(accel__cpu_rms_norm_dw_row,                                                              \
      (const float *x, const float *g, float s, float *dw, int64_t n, accel_dtype xdt),        \
      (x, g, s, dw, n, xdt))                                                                   \
    /* optim_update.c */                                                                       \
    X(accel__cpu_adam_update,                                                                  \
      (const accel__adam_coef *c, float *p, float *m, float *v, const float *g, int64_t n,     \
       void *cast, accel_dtype cast_store, accel_dtype cast_dt),                               \
      (c, p, m, v, g, n, cast, cast_store, cast_dt))

#endif
