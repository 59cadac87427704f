/* src/dist/reduce.c — the elementwise reduction kernel of every backend.
 *
 * Works in blocks of RBLK elements: the block is reduced into a temporary on
 * the stack (L1-resident), then stored to every destination. That makes
 * in-place use (dsts aliasing srcs, as in the zero-copy all_reduce) safe and
 * keeps each source read exactly once. bf16/f16 are widened to f32 first.
 * Integer sums wrap as torch's do (gloo's, NCCL's): they add in the unsigned
 * type U (a signed overflow would be undefined). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3") /* the loops below must vectorize; -O2 of gcc 12 often won't */
#endif
#include <string.h>

#include "dist/backend.h"

#define RBLK 1024

const char *accel__dtype_short(accel_dtype dt) {
    static const char *names[ACCEL_DTYPE_COUNT] = {"f32", "bf16", "f16", "f64", "i64",
                                                   "i32", "u8",   "bool", "i8", "i16"};
    return (unsigned)dt < ACCEL_DTYPE_COUNT ? names[dt] : "?";
}

bool accel__dtype_reducible(accel_dtype dt) {
    return dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16 || dt == ACCEL_F64 ||
           dt == ACCEL_I32 || dt == ACCEL_I64 || dt == ACCEL_U8 || dt == ACCEL_I8 || dt == ACCEL_I16;
}

/* One block: tmp[m] = op over the nsrc sources (already offset). NaN wins MAX/MIN like torch. */
#define DEFINE_BLOCK(NAME, T, U)                                                           \
    static void NAME(accel_reduce_op op, int world, int nsrc, const T *const *src, T *tmp, \
                     size_t m) {                                                           \
        if (tmp != src[0]) memcpy(tmp, src[0], m * sizeof(T));                             \
        for (int k = 1; k < nsrc; k++) {                                                   \
            const T *restrict s = src[k];                                                  \
            T *restrict t = tmp;                                                           \
            if (op == ACCEL_REDUCE_SUM || op == ACCEL_REDUCE_AVG)                          \
                for (size_t i = 0; i < m; i++) t[i] = (T)((U)t[i] + (U)s[i]);              \
            else if (op == ACCEL_REDUCE_MAX)                                               \
                for (size_t i = 0; i < m; i++) t[i] = (s[i] != s[i] || s[i] > t[i]) ? s[i] : t[i]; \
            else                                                                           \
                for (size_t i = 0; i < m; i++) t[i] = (s[i] != s[i] || s[i] < t[i]) ? s[i] : t[i]; \
        }                                                                                  \
        if (op == ACCEL_REDUCE_AVG) {                                                      \
            T w = (T)world;                                                                \
            for (size_t i = 0; i < m; i++) tmp[i] /= w;                                    \
        }                                                                                  \
    }

DEFINE_BLOCK(block_f32, float, float)
DEFINE_BLOCK(block_f64, double, double)
DEFINE_BLOCK(block_i32, int32_t, uint32_t)
DEFINE_BLOCK(block_i64, int64_t, uint64_t)
DEFINE_BLOCK(block_u8, uint8_t, unsigned)
DEFINE_BLOCK(block_i8, int8_t, unsigned)
DEFINE_BLOCK(block_i16, int16_t, unsigned)

#define MAX_SRC 64

void accel__reduce(accel_dtype dt, accel_reduce_op op, int world, int nsrc,
                   const void *const *srcs, int ndst, void *const *dsts, size_t n) {
    ACCEL_ASSERT(nsrc >= 1 && nsrc <= MAX_SRC);
    size_t es = accel_dtype_size(dt);
    _Alignas(64) unsigned char tmp[RBLK * 8];
    const void *s[MAX_SRC];
    for (size_t b = 0; b < n; b += RBLK) {
        size_t m = n - b < RBLK ? n - b : RBLK;
        for (int k = 0; k < nsrc; k++) s[k] = (const char *)srcs[k] + b * es;
        switch (dt) {
        case ACCEL_F32: block_f32(op, world, nsrc, (const float *const *)s, (float *)tmp, m); break;
        case ACCEL_F64: block_f64(op, world, nsrc, (const double *const *)s, (double *)tmp, m); break;
        case ACCEL_I32: block_i32(op, world, nsrc, (const int32_t *const *)s, (int32_t *)tmp, m); break;
        case ACCEL_I64: block_i64(op, world, nsrc, (const int64_t *const *)s, (int64_t *)tmp, m); break;
        case ACCEL_U8: block_u8(op, world, nsrc, (const uint8_t *const *)s, (uint8_t *)tmp, m); break;
        case ACCEL_I8: block_i8(op, world, nsrc, (const int8_t *const *)s, (int8_t *)tmp, m); break;
        case ACCEL_I16: block_i16(op, world, nsrc, (const int16_t *const *)s, (int16_t *)tmp, m); break;
        case ACCEL_BF16:
        case ACCEL_F16: {
            /* Widen each source block to f32, reduce in f32, narrow once. */
            _Alignas(64) float acc[RBLK], cur[RBLK];
            const float *one[2] = {acc, cur};
            accel_convert(acc, ACCEL_F32, s[0], dt, m);
            for (int k = 1; k < nsrc; k++) {
                accel_convert(cur, ACCEL_F32, s[k], dt, m);
                block_f32(op == ACCEL_REDUCE_AVG ? ACCEL_REDUCE_SUM : op, world, 2, one, acc, m);
            }
            if (op == ACCEL_REDUCE_AVG)
                for (size_t i = 0; i < m; i++) acc[i] /= (float)world;
            accel_convert(tmp, dt, acc, ACCEL_F32, m);
            break;
        }
        default: ACCEL_ASSERT(!"accel__reduce: dtype not reducible");
        }
        for (int j = 0; j < ndst; j++) memcpy((char *)dsts[j] + b * es, tmp, m * es);
    }
}
