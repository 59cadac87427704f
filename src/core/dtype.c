/* dtypes: sizes, names, and conversions (round-to-nearest-even for bf16/f16). */
#include <math.h>
#include <string.h>

#include "accel/core.h"

typedef struct dtype_info {
    const char *name;    /* torch name */
    const char *st_name; /* safetensors name */
    size_t size;
    bool is_float;
} dtype_info;

static const dtype_info DTYPES[ACCEL_DTYPE_COUNT] = {
    [ACCEL_F32] = {"float32", "F32", 4, true},  [ACCEL_BF16] = {"bfloat16", "BF16", 2, true},
    [ACCEL_F16] = {"float16", "F16", 2, true},  [ACCEL_F64] = {"float64", "F64", 8, true},
    [ACCEL_I64] = {"int64", "I64", 8, false},   [ACCEL_I32] = {"int32", "I32", 4, false},
    [ACCEL_U8] = {"uint8", "U8", 1, false},     [ACCEL_BOOL] = {"bool", "BOOL", 1, false},
    [ACCEL_I8] = {"int8", "I8", 1, false},      [ACCEL_I16] = {"int16", "I16", 2, false},
};

static bool valid(accel_dtype dt) { return (unsigned)dt < ACCEL_DTYPE_COUNT; }

size_t accel_dtype_size(accel_dtype dt) { return valid(dt) ? DTYPES[dt].size : 0; }
const char *accel_dtype_name(accel_dtype dt) { return valid(dt) ? DTYPES[dt].name : "invalid"; }
const char *accel_dtype_st_name(accel_dtype dt) { return valid(dt) ? DTYPES[dt].st_name : "?"; }
bool accel_dtype_is_float(accel_dtype dt) { return valid(dt) && DTYPES[dt].is_float; }

int accel_dtype_parse(const char *s) {
    if (!s) return -1;
    if (strncmp(s, "torch.", 6) == 0) s += 6;
    static const struct { const char *alias; accel_dtype dt; } ALIASES[] = {
        {"fp32", ACCEL_F32}, {"float", ACCEL_F32},  {"f32", ACCEL_F32},   {"bf16", ACCEL_BF16},
        {"fp16", ACCEL_F16}, {"half", ACCEL_F16},   {"f16", ACCEL_F16},   {"fp64", ACCEL_F64},
        {"double", ACCEL_F64}, {"long", ACCEL_I64}, {"int", ACCEL_I32},
    };
    for (int i = 0; i < ACCEL_DTYPE_COUNT; i++)
        if (strcmp(s, DTYPES[i].name) == 0 || strcmp(s, DTYPES[i].st_name) == 0) return i;
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (strcmp(s, ALIASES[i].alias) == 0) return (int)ALIASES[i].dt;
    return -1;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t accel_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float accel_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t accel_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {
        /* Below 2^-14 the result is subnormal: round |f| * 2^24 to an integer
         * (exact in float, rounded to nearest even by the default mode). 1024
         * carries into the smallest normal, which is the right encoding. */
        return (uint16_t)(sign | (uint16_t)nearbyintf(bits_f32(ax) * 16777216.0f));
    }
    uint32_t r = (ax >> 13) - (112u << 10); /* rebias the exponent 127 -> 15 */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

float accel_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Loads element i of a buffer as double / stores a double. Integer stores
 * truncate toward zero like a C cast (torch's .to(int) does the same). */
static double load_elem(const void *p, accel_dtype dt, size_t i) {
    switch (dt) {
    case ACCEL_F32: return ((const float *)p)[i];
    case ACCEL_BF16: return accel_bf16_to_f32(((const uint16_t *)p)[i]);
    case ACCEL_F16: return accel_f16_to_f32(((const uint16_t *)p)[i]);
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

static void store_elem(void *p, accel_dtype dt, size_t i, double v) {
    switch (dt) {
    case ACCEL_F32: ((float *)p)[i] = (float)v; break;
    case ACCEL_BF16: ((uint16_t *)p)[i] = accel_f32_to_bf16((float)v); break;
    case ACCEL_F16: ((uint16_t *)p)[i] = accel_f32_to_f16((float)v); break;
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

double accel__load_elem(const void *p, accel_dtype dt, size_t i) { return load_elem(p, dt, i); }
void accel__store_elem(void *p, accel_dtype dt, size_t i, double v) { store_elem(p, dt, i, v); }

void accel_convert(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt, size_t n) {
    if (dst_dt == src_dt) {
        memmove(dst, src, n * accel_dtype_size(dst_dt));
        return;
    }
    /* The hot pairs get tight loops; the rest go through double. */
    if (src_dt == ACCEL_F32 && dst_dt == ACCEL_BF16) {
        const float *s = src;
        uint16_t *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = accel_f32_to_bf16(s[i]);
        return;
    }
    if (src_dt == ACCEL_BF16 && dst_dt == ACCEL_F32) {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = accel_bf16_to_f32(s[i]);
        return;
    }
    if (src_dt == ACCEL_F32 && dst_dt == ACCEL_F16) {
        const float *s = src;
        uint16_t *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = accel_f32_to_f16(s[i]);
        return;
    }
    if (src_dt == ACCEL_F16 && dst_dt == ACCEL_F32) {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = accel_f16_to_f32(s[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) store_elem(dst, dst_dt, i, load_elem(src, src_dt, i));
}
