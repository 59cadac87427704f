/* Element conversions of every dtype (internal): the one definition that the
 * host (src/core/dtype.c, the CPU kernels) and the CUDA kernels both compile,
 * so a value converts to the same bits on every device. Header-only, with
 * ACCEL__HD (host + device under nvcc), as core/philox.h does for Philox.
 *
 * Conventions: bf16/f16 round to nearest even (a NaN stays a quiet NaN);
 * loads go through double; integer stores truncate toward zero like a C cast
 * (torch's .to(int) does the same). Element indices count elements, not bytes. */
#ifndef ACCEL_CORE_DTYPE_ELEM_H
#define ACCEL_CORE_DTYPE_ELEM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "accel/core.h"

#ifdef __CUDACC__
#define ACCEL__HD __host__ __device__
#else
#define ACCEL__HD
#endif

ACCEL__HD static inline uint32_t accel__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

ACCEL__HD static inline float accel__bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

ACCEL__HD static inline uint16_t accel__f32_to_bf16(float f) {
    uint32_t u = accel__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

ACCEL__HD static inline float accel__bf16_to_f32(uint16_t h) { return accel__bits_f32((uint32_t)h << 16); }

ACCEL__HD static inline uint16_t accel__f32_to_f16(float f) {
    uint32_t x = accel__f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {
        /* Below 2^-14 the result is subnormal: round |f| * 2^24 to an integer
         * (exact in float, rounded to nearest even by the default mode). 1024
         * carries into the smallest normal, which is the right encoding. */
        return (uint16_t)(sign | (uint16_t)nearbyintf(accel__bits_f32(ax) * 16777216.0f));
    }
    uint32_t r = (ax >> 13) - (112u << 10); /* rebias the exponent 127 -> 15 */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

ACCEL__HD static inline float accel__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return accel__bits_f32(sign);
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return accel__bits_f32(sign | 0x7f800000u | (mant << 13));
    return accel__bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Element i of a buffer of dtype dt as a double. */
ACCEL__HD static inline double accel__elem_get(const void *p, accel_dtype dt, int64_t i) {
    switch (dt) {
    case ACCEL_F32: return ((const float *)p)[i];
    case ACCEL_BF16: return accel__bf16_to_f32(((const uint16_t *)p)[i]);
    case ACCEL_F16: return accel__f16_to_f32(((const uint16_t *)p)[i]);
    case ACCEL_F64: return ((const double *)p)[i];
    case ACCEL_I64: return (double)((const int64_t *)p)[i];
    case ACCEL_I32: return ((const int32_t *)p)[i];
    case ACCEL_U8: return ((const uint8_t *)p)[i];
    case ACCEL_BOOL: return ((const uint8_t *)p)[i] != 0;
    case ACCEL_I8: return ((const int8_t *)p)[i];
    case ACCEL_I16: return ((const int16_t *)p)[i];
    default: return 0;
    }
}

/* Element i of a buffer of dtype dt = v (converted). */
ACCEL__HD static inline void accel__elem_set(void *p, accel_dtype dt, int64_t i, double v) {
    switch (dt) {
    case ACCEL_F32: ((float *)p)[i] = (float)v; break;
    case ACCEL_BF16: ((uint16_t *)p)[i] = accel__f32_to_bf16((float)v); break;
    case ACCEL_F16: ((uint16_t *)p)[i] = accel__f32_to_f16((float)v); break;
    case ACCEL_F64: ((double *)p)[i] = v; break;
    case ACCEL_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ACCEL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ACCEL_U8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
    case ACCEL_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case ACCEL_I8: ((int8_t *)p)[i] = (int8_t)(int64_t)v; break;
    case ACCEL_I16: ((int16_t *)p)[i] = (int16_t)(int64_t)v; break;
    default: break;
    }
}

/* Integer element access that keeps 64-bit integers exact (a double has 53
 * bits); float dtypes go through accel__elem_get/set. */
ACCEL__HD static inline int64_t accel__load_i64(const void *p, accel_dtype dt, int64_t i) {
    switch (dt) {
    case ACCEL_I64: return ((const int64_t *)p)[i];
    case ACCEL_I32: return ((const int32_t *)p)[i];
    case ACCEL_I16: return ((const int16_t *)p)[i];
    case ACCEL_I8: return ((const int8_t *)p)[i];
    case ACCEL_U8: return ((const uint8_t *)p)[i];
    case ACCEL_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return (int64_t)accel__elem_get(p, dt, i);
    }
}

ACCEL__HD static inline void accel__store_i64(void *p, accel_dtype dt, int64_t i, int64_t v) {
    switch (dt) {
    case ACCEL_I64: ((int64_t *)p)[i] = v; break;
    case ACCEL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ACCEL_I16: ((int16_t *)p)[i] = (int16_t)v; break;
    case ACCEL_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ACCEL_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ACCEL_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: accel__elem_set(p, dt, i, (double)v); break;
    }
}

/* v rounded to the float dtype dt, as PyTorch rounds an operand when it
 * promotes it (an i64 compared with an f32 is compared as an f32); other
 * dtypes leave v as it is. */
ACCEL__HD static inline double accel__round_to(double v, accel_dtype dt) {
    switch (dt) {
    case ACCEL_F32: return (float)v;
    case ACCEL_BF16: return accel__bf16_to_f32(accel__f32_to_bf16((float)v));
    case ACCEL_F16: return accel__f16_to_f32(accel__f32_to_f16((float)v));
    default: return v;
    }
}

#endif
