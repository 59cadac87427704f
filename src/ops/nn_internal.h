/* Helpers shared by the linear-algebra, nn and loss ops (not public API).
 * Implemented in nn_common.c. */
#ifndef ACCEL_OPS_NN_INTERNAL_H
#define ACCEL_OPS_NN_INTERNAL_H

#include "backends/cpu/vec_math.h"
#include "op_internal.h"

/* Where a backward writes the f32 gradient of an input t:
 *   - p == NULL: t does not need a gradient (skip the work);
 *   - beta == 1: p is t->grad itself (f32, contiguous): add into it;
 *   - beta == 0: p is fresh memory to overwrite (t->grad of a non-leaf that
 *     had none yet, or a scratch buffer that accel__gbuf_end accumulates). */
typedef struct accel__gbuf {
    accel_tensor *t;
    accel_tensor *tmp; /* scratch to accumulate at the end, or NULL */
    float *p;
    float beta;
} accel__gbuf;

/* Returns false (error set) on OOM. */
bool accel__gbuf_begin(accel__gbuf *g, accel_tensor *t);
/* Same, but always gives zero-filled memory with beta = 1 semantics (for
 * scatter-adds and loops that accumulate). */
bool accel__gbuf_begin_zeroed(accel__gbuf *g, accel_tensor *t);
accel_status accel__gbuf_end(accel__gbuf *g);

/* The dtype matmul/linear/sdpa compute in: the autocast dtype when autocast is
 * on, else the promotion of the inputs. Errors (naming op) on non-float or
 * float64 inputs; returns -1 then. */
int accel__mm_dtype(const char *op, int n, accel_tensor *const *in);
/* A contiguous version of t in dtype dt for a GEMM to read (t itself when it
 * already is). Under autocast this is the rounding of the input. */
accel_tensor *accel__mm_operand(accel_tensor *t, accel_dtype dt);

/* Product of shape[from..to). */
int64_t accel__prod(const int64_t *shape, int from, int to);

/* ---- vectorised row math (softmax, attention, cross-entropy) */

/* max of x[0..n) (-inf when n == 0; NaNs are not propagated). */
float accel__row_max(const float *x, int64_t n);
/* y[j] = exp(x[j] - m) for j < n (y may be x); returns the sum. */
float accel__row_exp(float *y, const float *x, int64_t n, float m);
/* sum of exp(x[j] - m), j < n. */
float accel__row_sum_exp(const float *x, int64_t n, float m);

#endif
