/* fp8 (internal): the two formats of mixed_precision='fp8', their
 * conversions, and per-tensor delayed scaling as Accelerate's
 * TransformerEngine recipe does it (DelayedScaling: HYBRID format, margin 0,
 * amax_history_len 1024, amax_compute_algo "most_recent" by default).
 *
 * Formats (OCP FP8): E4M3 (bias 7, no infinities, max 448) for the forward's
 * activations and weights; E5M2 (bias 15, max 57344) for the gradients.
 * Casts scale first (q = fp8(x * scale)) and saturate to the format's max
 * (cuda's __NV_SATFINITE), rounding to nearest even; a NaN stays a NaN.
 *
 * Header-only with ACCEL__HD: the CPU reference and the CUDA kernels use the
 * same delayed-scaling rule; the conversions here are the software reference
 * the GPU's hardware conversions are tested against. */
#ifndef ACCEL_BACKENDS_FP8_H
#define ACCEL_BACKENDS_FP8_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "accel/core.h"
#include "core/dtype_elem.h" /* ACCEL__HD */

typedef enum accel__fp8_format { ACCEL_FP8_E4M3, ACCEL_FP8_E5M2 } accel__fp8_format;

#define ACCEL__FP8_E4M3_MAX 448.0f
#define ACCEL__FP8_E5M2_MAX 57344.0f

ACCEL__HD static inline float accel__fp8_max(accel__fp8_format f) {
    return f == ACCEL_FP8_E4M3 ? ACCEL__FP8_E4M3_MAX : ACCEL__FP8_E5M2_MAX;
}

/* x as fp8 bits: round to nearest even, saturating (inf -> max), NaN -> 0x7F. */
ACCEL__HD static inline uint8_t accel__fp8_encode(float x, accel__fp8_format f) {
    const int mbits = f == ACCEL_FP8_E4M3 ? 3 : 2, bias = f == ACCEL_FP8_E4M3 ? 7 : 15;
    const uint32_t max_code = f == ACCEL_FP8_E4M3 ? 0x7Eu : 0x7Bu;
    if (isnan(x)) return 0x7F;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= accel__fp8_max(f)) return (uint8_t)(sign | max_code);
    if (a == 0.0f) return sign;
    int e;
    frexpf(a, &e);
    int E = e - 1 < 1 - bias ? 1 - bias : e - 1; /* subnormals share the smallest exponent */
    uint32_t r = (uint32_t)nearbyintf(ldexpf(a, mbits - E)); /* units of the ulp at E */
    if (r >= (2u << mbits)) { /* rounded up into the next binade */
        r >>= 1;
        E++;
    }
    uint32_t code = r < (1u << mbits) ? r : ((uint32_t)(E + bias) << mbits) | (r - (1u << mbits));
    return (uint8_t)(sign | (code > max_code ? max_code : code));
}

ACCEL__HD static inline float accel__fp8_decode(uint8_t v, accel__fp8_format f) {
    const int mbits = f == ACCEL_FP8_E4M3 ? 3 : 2, bias = f == ACCEL_FP8_E4M3 ? 7 : 15;
    const uint32_t e = (uint32_t)(v & 0x7F) >> mbits, m = v & ((1u << mbits) - 1);
    const float s = v & 0x80 ? -1.0f : 1.0f;
    if (f == ACCEL_FP8_E4M3 && (v & 0x7F) == 0x7F) return NAN;
    if (f == ACCEL_FP8_E5M2 && e == 31) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexpf((float)m, 1 - bias - mbits);
    return s * ldexpf((float)((1u << mbits) + m), (int)e - bias - mbits);
}

/* Accelerate's TERecipeKwargs / FP8RecipeKwargs (TransformerEngine's
 * DelayedScaling). `interval` is not here: TransformerEngine deprecated it
 * and updates every step. */
/* The fp8 Linear's three GEMMs, in the order of override_linear_precision. */
enum { ACCEL__FP8_FPROP, ACCEL__FP8_DGRAD, ACCEL__FP8_WGRAD, ACCEL__FP8_GEMMS };

typedef struct accel__fp8_recipe {
    bool hybrid;     /* fp8_format HYBRID: E5M2 gradients (else "E4M3": E4M3 everywhere) */
    int margin;      /* scale = fp8_max / amax / 2^margin */
    int history_len; /* amax_history_len (>= 1) */
    bool use_max;    /* amax_compute_algo "max" (else "most_recent") */
    bool during_eval; /* use_autocast_during_eval: fp8 also when the module is not training */
    /* The scales are updated by the recipe's owner, once per forward (slots X
     * and W) and once per backward (DY), after the amaxes are reduced over its
     * process group (accelerator/fp8_scaling.h: TransformerEngine's
     * reduce_amax); false: each cast's slot is updated right after its GEMM. */
    bool deferred_update;
    /* override_linear_precision (fprop, dgrad, wgrad): true runs that GEMM
     * in the autocast dtype (bf16) on the unquantised operands instead of in
     * fp8, as TransformerEngine; a tensor no fp8 GEMM reads is not cast
     * (its amax stays 0, which keeps its scale). */
    bool high_precision[ACCEL__FP8_GEMMS];
} accel__fp8_recipe;

/* HYBRID, margin 0, amax_history_len 1024, "most_recent": Accelerate's defaults. */
static inline accel__fp8_recipe accel__fp8_recipe_default(void) {
    accel__fp8_recipe r = {true, 0, 1024, false, false, false, {false, false, false}};
    return r;
}

/* The tensors an fp8 Linear casts, each with its own delayed scaling: the
 * input and the weight (forward, E4M3) and the output gradient (backward). */
enum { ACCEL__FP8_X, ACCEL__FP8_W, ACCEL__FP8_DY, ACCEL__FP8_SLOTS };

ACCEL__HD static inline accel__fp8_format accel__fp8_slot_format(accel__fp8_recipe r, int slot) {
    return slot == ACCEL__FP8_DY && r.hybrid ? ACCEL_FP8_E5M2 : ACCEL_FP8_E4M3;
}

/* An fp8 Linear's scaling state ("fp8 meta"), f32 [2 + history_len, SLOTS]
 * row-major, as TransformerEngine keeps it (scale, scale_inv, amax_history):
 *   row 0: scale per slot (q = fp8(x * scale); starts at 1);
 *   row 1: scale_inv = 1 / scale (the GEMMs' dequantisation factor);
 *   rows 2..: the amax history, row 2 the amax of the current step (the casts
 *   raise it), the older rows after it. */
#define ACCEL__FP8_META_ROWS(len) (2 + (len))
ACCEL__HD static inline float *accel__fp8_meta_amax(float *meta, int slot) { return meta + 2 * ACCEL__FP8_SLOTS + slot; }

/* After a step's casts of `slot`: the next scale from the amax history
 * (TransformerEngine's default scaling function: the history's max or its
 * newest entry; an amax of 0, inf or NaN keeps the scale), then the history
 * rotated by -1 with a zeroed row for the next step
 * (nvte_delayed_scaling_recipe_amax_and_scale_update). */
ACCEL__HD static inline void accel__fp8_update(float *meta, int slot, accel__fp8_recipe r) {
    float *h = accel__fp8_meta_amax(meta, slot);
    const int S = ACCEL__FP8_SLOTS, len = r.history_len;
    float a = h[0];
    for (int i = 1; r.use_max && i < len && !isnan(a); i++) /* a NaN anywhere wins, as torch.max */
        if (isnan(h[i * S]) || h[i * S] > a) a = h[i * S];
    float first = h[0];
    for (int i = 0; i + 1 < len; i++) h[i * S] = h[(i + 1) * S];
    h[(len - 1) * S] = first;
    h[0] = 0.0f;
    if (!(a > 0.0f) || isinf(a)) return;
    float sf = accel__fp8_max(accel__fp8_slot_format(r, slot)) / a / ldexpf(1.0f, r.margin);
    meta[slot] = sf;
    meta[S + slot] = 1.0f / sf;
}

#ifdef __cplusplus
extern "C" {
#endif

/* ACCEL_OK when device d can run fp8 GEMMs (a CUDA GPU of compute
 * capability >= 8.9: Ada Lovelace, Hopper and newer); otherwise an
 * ACCEL_ERR_UNSUPPORTED error "<op>: fp8 mixed precision is not supported on
 * <device> (...)" naming why (fp8.c). */
accel_status accel__fp8_device_check(accel_device d, const char *op);

/* Tests only: while on, accel__fp8_device_check accepts the cpu, so the
 * Accelerator's fp8 path (prepare, its hooks, the amax reductions) runs the
 * CPU reference end to end, as a GPU runs its kernels. Process-wide; off by
 * default; no option or variable reaches it (the cpu stays refused to
 * users). Returns the previous setting. */
bool accel__fp8_cpu_reference_set(bool on);

/* ---- The fp8 Linear's primitives (fp8.c): on the cpu the software reference
 * (the conversions above, a GEMM in double on the decoded values), on a CUDA
 * device the backend's kernels (the GPU's conversions, cuBLASLt's fp8 GEMM).
 * Every tensor contiguous and on one device; enqueued on a GPU's stream. */

/* A new fp8 meta (scales 1, history zero) for amax_history_len `len`, on
 * dev: a persistent f32 [2 + len, SLOTS] tensor the caller owns. */
accel_tensor *accel__fp8_meta_new(int len, accel_device dev);

/* q [rows, cols] (u8: fp8 bits of format f) = fp8(x * scale[slot]),
 * saturating, unless NULL; q_t [cols, rows] its transpose unless NULL (the
 * K-contiguous operand of the gradient GEMMs; one of q and q_t at least); inv[inv_at] = scale_inv[slot], the
 * dequantisation factor of q, kept after the scale moves on; the slot's
 * current amax raised to max |x| (a NaN in x is not counted). x: f32 [rows,
 * cols]; meta: an fp8 meta. */
accel_status accel__fp8_quantize(accel_tensor *q, accel_tensor *q_t, accel_tensor *inv, int inv_at,
                                 accel_tensor *x, accel_tensor *meta, int slot, accel__fp8_format f);

/* Floats in one weight's cache row: the scale cast with, the amax, a scratch. */
#define ACCEL__FP8_CACHE_WORDS 3

/* accel__fp8_quantize of a weight into a cache that outlives the call:
 * q and q_t as there (both given), cache f32 [ACCEL__FP8_CACHE_WORDS] on x's device (the scale
 * the bytes were cast with, the amax that cast measured, a scratch; made by
 * accel__fp8_cache_state_new). The cast is redone only when `fresh` (q and
 * q_t do not hold x's values: new memory, or x was written) or when slot's
 * scale is not the one of the cache (delayed scaling moved it); otherwise
 * the bytes stay. Either way slot's amax is raised by the cache's amax (x's
 * max |x|, what a cast would record: it does not depend on the scale) and
 * inv[inv_at] = scale_inv[slot], so the result is the uncached cast's. On a
 * GPU the scale is compared on the device (no synchronisation). */
accel_status accel__fp8_quantize_cached(accel_tensor *q, accel_tensor *q_t, accel_tensor *inv, int inv_at,
                                        accel_tensor *x, accel_tensor *meta, int slot, accel__fp8_format f,
                                        accel_tensor *cache, bool fresh);

/* n caches for accel__fp8_quantize_cached, f32 [n, ACCEL__FP8_CACHE_WORDS] on dev (no cast yet). */
accel_tensor *accel__fp8_cache_state_new(int n, accel_device dev);

/* Process-wide counts of accel__fp8_quantize_cached on the cpu reference
 * (a GPU decides on the device: not counted): casts made, casts reused. */
typedef struct accel__fp8_cache_stats {
    uint64_t casts, hits;
} accel__fp8_cache_stats;
accel__fp8_cache_stats accel__fp8_cache_stats_get(void);

/* One fp8 operand: bytes [rows, K] of format fmt, dequantised by inv[inv_at]. */
typedef struct accel__fp8_operand {
    accel_tensor *q;
    accel__fp8_format fmt;
    accel_tensor *inv;
    int inv_at;
} accel__fp8_operand;

/* c [M, N] (f32) = (a.inv A) (b.inv B)^T + beta c, A [M, K] and B [N, K]
 * (not both E5M2; K a multiple of 16 on a GPU), f32 accumulation; beta 0
 * never reads c. */
accel_status accel__fp8_gemm(accel_tensor *c, float beta, accel__fp8_operand a, accel__fp8_operand b);

/* accel__fp8_update of slots [first, first + n) of meta, on its device. */
accel_status accel__fp8_meta_update(accel_tensor *meta, int first, int n, accel__fp8_recipe r);

/* ---- a device's fp8 kernels: accel_backend.fp8 (backend.h), NULL on a
 * device without them. Device pointers throughout; enqueued on the thread's
 * stream. The cuda backend's are accel__cuda_fp8_* (cuda_internal.h). */

/* C [M, N] (row-major, leading dim ldc; f32 or bf16) = alpha * (a_inv A)
 * (b_inv B)^T + beta C with A [M, K] and B [N, K] fp8 (row-major, K
 * contiguous: cuBLASLt's fp8 "TN" layout; K, lda, ldb multiples of 16; not
 * both E5M2), a_inv and b_inv the device scale_inv of each, f32 accumulation.
 * y = x W^T is (A = x, B = W); dX = dY W is (A = dY, B = W^T) and dW = dY^T X
 * is (A = dY^T, B = X^T) from the transposed casts. */
typedef struct accel__fp8_gemm_args {
    void *c;
    accel_dtype c_dtype;
    const uint8_t *a, *b;
    accel__fp8_format a_fmt, b_fmt;
    const float *a_inv, *b_inv;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
} accel__fp8_gemm_args;

typedef struct accel__fp8_ops {
    /* ACCEL_OK when device `index` runs fp8; else the error, naming `op`,
     * the device and what it lacks. */
    accel_status (*check)(int index, const char *op);
    /* q [rows, cols] (fp8 bits of format f, row-major) = fp8(x * *scale),
     * saturating, unless NULL, from x [rows, cols] (f32 contiguous); q_t
     * [cols, rows] its transpose when non-NULL (the K-contiguous operand of
     * the gradient GEMMs); *amax = max(*amax, max |x|); *inv_out = *scale_inv
     * unless NULL. */
    accel_status (*quantize)(int index, uint8_t *q, uint8_t *q_t, const float *x, int64_t rows, int64_t cols,
                             accel__fp8_format f, const float *scale, const float *scale_inv, float *amax,
                             float *inv_out);
    /* accel__fp8_quantize_cached: q and q_t recast only when fresh or
     * *scale != cache[0]; cache f32 [3]: the scale cast with, the amax that
     * cast measured, a scratch (0 between calls). */
    accel_status (*quantize_cached)(int index, uint8_t *q, uint8_t *q_t, const float *x, int64_t rows, int64_t cols,
                                    accel__fp8_format f, const float *scale, const float *scale_inv, float *amax,
                                    float *inv_out, float *cache, bool fresh);
    /* accel__fp8_update of slots [first, first + n) of the fp8 meta `meta`
     * (f32 [2 + r.history_len, ACCEL__FP8_SLOTS]). */
    accel_status (*update)(int index, float *meta, int first, int n, accel__fp8_recipe r);
    accel_status (*gemm)(int index, const accel__fp8_gemm_args *g);
} accel__fp8_ops;

#ifdef __cplusplus
}
#endif

#endif
