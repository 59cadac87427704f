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

/* The delayed-scaling state of one tensor: the amax of its last `len` casts
 * (a ring, newest at `pos`) and the scale the next cast uses. */
typedef struct accel__fp8_scaling {
    float scale;     /* q = fp8(x * scale); starts at 1 */
    float scale_inv; /* 1 / scale: the GEMM's dequantisation factor */
    int len, pos;    /* history length (>= 1) and the newest entry */
    bool use_max;    /* amax_compute_algo "max" (else "most_recent") */
    int margin;      /* scale = fp8_max / amax / 2^margin */
} accel__fp8_scaling;

/* After a cast that saw `amax`: records it in `history` (len floats) and sets
 * the next scale from the history (TransformerEngine's default scaling
 * function). An amax of 0, inf or NaN keeps the scale as it is. */
ACCEL__HD static inline void accel__fp8_update(accel__fp8_scaling *s, float *history, float amax,
                                               accel__fp8_format f) {
    s->pos = (s->pos + 1) % s->len;
    history[s->pos] = amax;
    float a = history[s->pos];
    for (int i = 0; s->use_max && i < s->len; i++) /* a NaN anywhere wins, as torch.max */
        if (isnan(history[i]) || history[i] > a) a = history[i];
    if (!(a > 0.0f) || isinf(a)) return;
    float sf = accel__fp8_max(f) / a / ldexpf(1.0f, s->margin);
    s->scale = sf;
    s->scale_inv = 1.0f / sf;
}

/* The state of a new tensor (history zeroed by the caller). */
ACCEL__HD static inline accel__fp8_scaling accel__fp8_scaling_init(int len, bool use_max, int margin) {
    accel__fp8_scaling s;
    s.scale = 1.0f;
    s.scale_inv = 1.0f;
    s.len = len > 0 ? len : 1;
    s.pos = 0;
    s.use_max = use_max;
    s.margin = margin;
    return s;
}

#ifdef __cplusplus
extern "C" {
#endif

/* ACCEL_OK when device d can run fp8 GEMMs (a CUDA GPU of compute
 * capability >= 8.9: Ada Lovelace, Hopper and newer); otherwise an
 * ACCEL_ERR_UNSUPPORTED error "<op>: fp8 mixed precision is not supported on
 * <device> (...)" naming why (fp8.c). */
accel_status accel__fp8_device_check(accel_device d, const char *op);

#ifdef __cplusplus
}
#endif

#endif
