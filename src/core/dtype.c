/* dtypes: sizes, names, and conversions (round-to-nearest-even for bf16/f16;
 * the element conversions themselves are core/dtype_elem.h, shared with the
 * CUDA kernels). */
#include <string.h>

#include "accel/core.h"
#include "core/core_internal.h"
#include "core/dtype_elem.h"

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

bool accel__int_dtype_range(accel_dtype dt, double *lo, double *hi) {
    switch (dt) {
    case ACCEL_I64: *lo = -0x1p63, *hi = 0x1p63; return true;
    case ACCEL_I32: *lo = -0x1p31, *hi = 0x1p31; return true;
    case ACCEL_I16: *lo = -0x1p15, *hi = 0x1p15; return true;
    case ACCEL_I8: *lo = -0x1p7, *hi = 0x1p7; return true;
    case ACCEL_U8: *lo = 0, *hi = 0x1p8; return true;
    default: return false;
    }
}

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

uint16_t accel_f32_to_bf16(float f) { return accel__f32_to_bf16(f); }
float accel_bf16_to_f32(uint16_t h) { return accel__bf16_to_f32(h); }
uint16_t accel_f32_to_f16(float f) { return accel__f32_to_f16(f); }
float accel_f16_to_f32(uint16_t h) { return accel__f16_to_f32(h); }

double accel__load_elem(const void *p, accel_dtype dt, size_t i) { return accel__elem_get(p, dt, (int64_t)i); }
void accel__store_elem(void *p, accel_dtype dt, size_t i, double v) { accel__elem_set(p, dt, (int64_t)i, v); }

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
        for (size_t i = 0; i < n; i++) d[i] = accel__f32_to_bf16(s[i]);
        return;
    }
    if (src_dt == ACCEL_BF16 && dst_dt == ACCEL_F32) {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = accel__bf16_to_f32(s[i]);
        return;
    }
    if (src_dt == ACCEL_F32 && dst_dt == ACCEL_F16) {
        const float *s = src;
        uint16_t *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = accel__f32_to_f16(s[i]);
        return;
    }
    if (src_dt == ACCEL_F16 && dst_dt == ACCEL_F32) {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = accel__f16_to_f32(s[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) accel__elem_set(dst, dst_dt, (int64_t)i, accel__elem_get(src, src_dt, (int64_t)i));
}
