/* Kernels that read and write bf16 (and f16) directly, compiled per ISA
 * (cpu_variants.h): dtype conversion of contiguous runs and of rows apart, a few rows against a
 * bf16 weight, SwiGLU forward and backward, RoPE, and the cross-entropy rows
 * with their gradient. They work on blocks of BLOCK elements: a bf16 operand is widened into a stack buffer
 * (f32 ones are read in place), the math runs in f32 in `omp simd` loops, and
 * the result is rounded once into its dtype (the all-f32 SwiGLU forward is
 * written in place, in one pass). RoPE, whose rows are short (64 elements at
 * head dim 64), converts f32 and bf16 in registers instead, one loop per
 * combination of dtypes. */

/* No multiply-add fused, as GCC fuses none in ISO C mode: every variant
 * then gives the baseline's bits and the reference kernels' formulas'
 * (tests/test_fused_same_bits.c), with clang too, whose default fuses.
 * Before the includes: clang applies it where a function is defined, and
 * vec_math.h's expf is. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#include <omp.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "cpu_kernels.h"
#include "vec_math.h"

enum { BLOCK = 512 };

/* ---- conversions */

ACCEL__VEC_MATH static void bf16_to_f32_run(float *d, const uint16_t *s, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = accel__bf16_float(s[i]);
}

ACCEL__VEC_MATH static void f32_to_bf16_run(uint16_t *d, const float *s, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = accel__bf16_bits(s[i]);
}

/* f16 runs: with F16C (the avx2 and avx512 variants) 8 lanes at a time, to
 * the same bits as the scalar conversion of core/dtype_elem.h, which the tail
 * and the baseline use. The hardware differs only on NaNs, fixed up here:
 * vcvtph2ps quiets a signalling NaN (the scalar path keeps its bits) and
 * vcvtps2ph keeps a NaN's top payload bits (the scalar path gives the quiet
 * NaN 0x7e00 with the sign kept). */
static void f16_to_f32_run(float *d, const uint16_t *s, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    const __m256i abs = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
    const __m256i sign = _mm256_set1_epi32(0x8000), mant = _mm256_set1_epi32(0x3ff);
    const __m256i exp = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
        __m256i w = _mm256_cvtepu16_epi32(h);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, abs), inf);
        /* sign << 16 | 0x7f800000 | mant << 13: the payload as it is */
        __m256i kept = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, sign), 16), exp),
                                       _mm256_slli_epi32(_mm256_and_si256(w, mant), 13));
        __m256 f = _mm256_blendv_ps(_mm256_cvtph_ps(h), _mm256_castsi256_ps(kept), _mm256_castsi256_ps(nan));
        _mm256_storeu_ps(d + i, f);
    }
#endif
    for (; i < n; i++) d[i] = accel__f16_to_f32(s[i]);
}

static void f32_to_f16_run(uint16_t *d, const float *s, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 quiet = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)); /* converts to 0x7e00 */
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_loadu_ps(s + i);
        __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
        f = _mm256_blendv_ps(f, _mm256_or_ps(_mm256_and_ps(f, sign), quiet), nan);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; i++) d[i] = accel__f32_to_f16(s[i]);
}

void accel__cpu_to_f32(float *dst, const void *src, accel_dtype dt, int64_t n) {
    if (dt == ACCEL_F32) memcpy(dst, src, (size_t)n * sizeof *dst);
    else if (dt == ACCEL_BF16) bf16_to_f32_run(dst, src, n);
    else if (dt == ACCEL_F16) f16_to_f32_run(dst, src, n);
    else accel_convert(dst, ACCEL_F32, src, dt, (size_t)n);
}

void accel__cpu_from_f32(void *dst, accel_dtype dt, const float *src, int64_t n) {
    if (dt == ACCEL_F32) memcpy(dst, src, (size_t)n * sizeof *src);
    else if (dt == ACCEL_BF16) f32_to_bf16_run(dst, src, n);
    else if (dt == ACCEL_F16) f32_to_f16_run(dst, src, n);
    else accel_convert(dst, dt, src, ACCEL_F32, (size_t)n);
}

ACCEL__VEC_MATH static void f32_to_bf16_scaled_run(uint16_t *d, const float *s, float k, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = accel__bf16_bits(s[i] * k);
}

void accel__cpu_from_f32_scaled(void *dst, accel_dtype dt, const float *src, float s, int64_t n) {
    if (dt == ACCEL_BF16) {
        f32_to_bf16_scaled_run(dst, src, s, n);
        return;
    }
    float t[BLOCK];
    size_t es = accel_dtype_size(dt);
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t len = n - i < BLOCK ? n - i : BLOCK;
#pragma omp simd
        for (int64_t j = 0; j < len; j++) t[j] = src[i + j] * s;
        accel__cpu_from_f32((char *)dst + (size_t)i * es, dt, t, len);
    }
}

/* Rows ahead that a strided widening asks the cache for (64-byte lines).
 * Rows apart (a head's in the projections' [B, T, H, D]: D elements every
 * H D, which sdpa's kernels widen a tile at a time) defeat the hardware
 * prefetchers and each row waited on memory: in bench_sdpa's bf16 step
 * (one thread, Emerald Rapids-class) the widening took 3x the time of the
 * same tensors dense, 1.6x with the rows prefetched this far ahead (16
 * measured alike, 4 gained less; prefetching the rows a rounding writes
 * gained nothing). */
enum { PREFETCH_ROWS = 8 };

/* Row r + PREFETCH_ROWS (of `bytes` bytes) of `rows` rows `step` bytes apart from s asked for. */
static inline void prefetch_ahead(const char *s, int64_t r, int64_t rows, int64_t step, int64_t bytes) {
    if (r + PREFETCH_ROWS >= rows) return;
    const char *ahead = s + (r + PREFETCH_ROWS) * step;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(ahead + b);
}

void accel__cpu_to_f32_rows(float *dst, const void *src, accel_dtype dt, int64_t rows, int64_t n, int64_t stride) {
    if (stride == n) {
        accel__cpu_to_f32(dst, src, dt, rows * n);
        return;
    }
    int64_t es = (int64_t)accel_dtype_size(dt), bytes = n * es;
    const char *s = src;
    for (int64_t r = 0; r < rows; r++) {
        prefetch_ahead(s, r, rows, stride * es, bytes);
        accel__cpu_to_f32(dst + r * n, s + r * stride * es, dt, n);
    }
}

void accel__cpu_copy_rows(void *dst, const void *src, accel_dtype dt, int64_t rows, int64_t n, int64_t stride) {
    int64_t es = (int64_t)accel_dtype_size(dt), bytes = n * es;
    if (stride == n) {
        memcpy(dst, src, (size_t)(rows * bytes));
        return;
    }
    const char *s = src;
    for (int64_t r = 0; r < rows; r++) {
        prefetch_ahead(s, r, rows, stride * es, bytes);
        memcpy((char *)dst + r * bytes, s + r * stride * es, (size_t)bytes);
    }
}

void accel__cpu_from_f32_rows(void *dst, accel_dtype dt, const float *src, int64_t rows, int64_t n, int64_t stride) {
    if (stride == n) {
        accel__cpu_from_f32(dst, dt, src, rows * n);
        return;
    }
    int64_t es = (int64_t)accel_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++) accel__cpu_from_f32((char *)dst + r * stride * es, dt, src + r * n, n);
}

/* Elements [off, off + n) of a contiguous float array of dtype dt as f32:
 * in place for f32, else widened into buf. */
static const float *f32_view(const void *base, accel_dtype dt, int64_t off, int64_t n, float *buf) {
    if (dt == ACCEL_F32) return (const float *)base + off;
    accel__cpu_to_f32(buf, (const char *)base + off * (int64_t)accel_dtype_size(dt), dt, n);
    return buf;
}

/* dst[off, off + n) (+)= v, rounded into dst's dtype; buf scratch for beta 1. */
ACCEL__VEC_MATH static void store_block(void *base, accel_dtype dt, int64_t off, int64_t n, float *v, float beta,
                                        float *buf) {
    if (beta != 0.0f) {
        const float *old = f32_view(base, dt, off, n, buf);
#pragma omp simd
        for (int64_t i = 0; i < n; i++) v[i] += old[i];
    }
    accel__cpu_from_f32((char *)base + off * (int64_t)accel_dtype_size(dt), dt, v, n);
}

/* v as a tensor of dtype dt (f32, bf16 or f16) would hold it. Inlined with
 * a constant dt into a loop, the rounding stays in its registers. */
ACCEL__VEC_MATH static inline __attribute__((always_inline)) float rounded(float v, accel_dtype dt) {
    return dt == ACCEL_BF16 ? accel__bf16_round(v) : dt == ACCEL_F16 ? accel__f16_round(v) : v;
}

/* n elements between f32 and bf16/f16, on this thread. */
static void convert_run(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt, int64_t n) {
    if (dst_dt == ACCEL_F32) accel__cpu_to_f32(dst, src, src_dt, n);
    else accel__cpu_from_f32(dst, dst_dt, src, n);
}

void accel__cpu_convert(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt, int64_t n) {
    bool half_src = src_dt == ACCEL_BF16 || src_dt == ACCEL_F16, half_dst = dst_dt == ACCEL_BF16 || dst_dt == ACCEL_F16;
    bool fast = (dst_dt == ACCEL_F32 && half_src) || (half_dst && src_dt == ACCEL_F32);
    if (!fast) {
        accel_convert(dst, dst_dt, src, src_dt, (size_t)n);
        return;
    }
    /* A run too short to split converts here, outside any parallel region:
     * inside a caller's parallel loop (strided.c converts row by row) even
     * an if (false) region is a nested one, for which libgomp allocates and
     * frees a team each time (~0.6 us, ten times a 64-element row's
     * conversion). */
    if (n <= 4 * ACCEL_CPU_PAR_THRESHOLD) {
        convert_run(dst, dst_dt, src, src_dt, n);
        return;
    }
    int64_t chunk = 16384, nchunks = (n + chunk - 1) / chunk;
    size_t des = accel_dtype_size(dst_dt), ses = accel_dtype_size(src_dt);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t s = c * chunk, m = s + chunk < n ? chunk : n - s;
        convert_run((char *)dst + s * (int64_t)des, dst_dt, (const char *)src + s * (int64_t)ses, src_dt, m);
    }
}

/* ---- a few rows against a bf16 weight */

/* Rows of A the kernel keeps accumulators for at once. */
enum { GEMV_ROWS = 4 };

void accel__cpu_gemm_bf16w_nt(int64_t M, int64_t n, int64_t K, float alpha, const float *A, int64_t lda,
                              const uint16_t *W, int64_t ldw, float beta, float *C, int64_t ldc) {
    for (int64_t m0 = 0; m0 < M; m0 += GEMV_ROWS) {
        int64_t rows = M - m0 < GEMV_ROWS ? M - m0 : GEMV_ROWS;
        for (int64_t j = 0; j < n; j++) {
            /* Row j of W widened a block at a time (in cache), each block
             * used by every row of A. */
            float acc[GEMV_ROWS] = {0}, w[BLOCK];
            for (int64_t k0 = 0; k0 < K; k0 += BLOCK) {
                int64_t len = K - k0 < BLOCK ? K - k0 : BLOCK;
                bf16_to_f32_run(w, W + j * ldw + k0, len);
                for (int64_t r = 0; r < rows; r++) {
                    const float *a = A + (m0 + r) * lda + k0;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int64_t k = 0; k < len; k++) s += a[k] * w[k];
                    acc[r] += s;
                }
            }
            for (int64_t r = 0; r < rows; r++) {
                float *c = C + (m0 + r) * ldc + j;
                *c = beta == 0.0f ? alpha * acc[r] : alpha * acc[r] + beta * *c;
            }
        }
    }
}

/* ---- SwiGLU */

ACCEL__VEC_MATH static void silu_block(const float *x, float *s, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) s[i] = x[i] * (1.0f / (1.0f + accel__expf(-x[i])));
}

/* out = silu(x) * u in one pass, all f32 (the same operations as
 * silu_block then the product). */
ACCEL__VEC_MATH static void swiglu_f32_block(const float *x, const float *u, float *out, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * (1.0f / (1.0f + accel__expf(-x[i]))) * u[i];
}

/* One block of the forward (not all f32): y = round(silu(x)) * u with the
 * rounding to gate's dtype rt, a constant of each inlined copy. The silu
 * loop stays a loop of its own: with the rounding and the product in it,
 * GCC's code ran slower. */
ACCEL__VEC_MATH static inline __attribute__((always_inline)) void swiglu_block(const accel_k_swiglu *k, int64_t off,
                                                                               int64_t m, accel_dtype rt) {
    float bx[BLOCK], bu[BLOCK], y[BLOCK];
    const float *x = f32_view(k->gate->data, k->gate->dtype, off, m, bx);
    const float *u = f32_view(k->up->data, k->up->dtype, off, m, bu);
    silu_block(x, y, m);
#pragma omp simd
    for (int64_t i = 0; i < m; i++) y[i] = rounded(y[i], rt) * u[i];
    store_block(k->out->data, k->out->dtype, off, m, y, 0.0f, NULL);
}

/* ACCEL__VEC_MATH here and below as the blocks: GCC inlines only into functions of the same optimize attribute. */
ACCEL__VEC_MATH void accel__cpu_swiglu(const accel_k_swiglu *k) {
    const accel_tensor *gate = k->gate, *up = k->up, *out = k->out;
    int64_t n = accel_numel(out), nb = (n + BLOCK - 1) / BLOCK;
    bool f32 = gate->dtype == ACCEL_F32 && up->dtype == ACCEL_F32 && out->dtype == ACCEL_F32;
#pragma omp parallel for if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t off = b * BLOCK, m = off + BLOCK < n ? BLOCK : n - off;
        if (f32) swiglu_f32_block((const float *)gate->data + off, (const float *)up->data + off,
                                  (float *)out->data + off, m);
        else if (gate->dtype == ACCEL_BF16) swiglu_block(k, off, m, ACCEL_BF16);
        else if (gate->dtype == ACCEL_F16) swiglu_block(k, off, m, ACCEL_F16);
        else swiglu_block(k, off, m, ACCEL_F32);
    }
}

ACCEL__VEC_MATH static void sigmoid_block(const float *x, float *s, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) s[i] = 1.0f / (1.0f + accel__expf(-x[i]));
}

/* One block of the backward: the sigmoid once for both gradients (the
 * same values silu_block would give), dgate = round(g * up) * silu'(gate)
 * and dup = g * round(silu(gate)), each into d before its store, with the
 * rounding to gate's dtype rt (a constant of each inlined copy) in the
 * product's loop: ~10% less CPU than a rounding pass between two loops. */
ACCEL__VEC_MATH static inline __attribute__((always_inline)) void
swiglu_backward_block(const accel_k_swiglu_backward *k, int64_t off, int64_t m, accel_dtype rt) {
    const accel_tensor *gate = k->gate, *up = k->up, *g = k->g;
    float bx[BLOCK], bu[BLOCK], bg[BLOCK], s[BLOCK], d[BLOCK], old[BLOCK];
    const float *x = f32_view(gate->data, gate->dtype, off, m, bx);
    const float *gg = f32_view(g->data, g->dtype, off, m, bg);
    sigmoid_block(x, s, m);
    if (k->dgate) {
        const float *u = f32_view(up->data, up->dtype, off, m, bu);
#pragma omp simd
        for (int64_t i = 0; i < m; i++) d[i] = rounded(gg[i] * u[i], rt) * (s[i] * (1.0f + x[i] * (1.0f - s[i])));
        store_block(k->dgate->data, k->dgate->dtype, off, m, d, k->dgate_beta, old);
    }
    if (k->dup) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) d[i] = gg[i] * rounded(x[i] * s[i], rt);
        store_block(k->dup->data, k->dup->dtype, off, m, d, k->dup_beta, old);
    }
}

ACCEL__VEC_MATH void accel__cpu_swiglu_backward(const accel_k_swiglu_backward *k) {
    int64_t n = accel_numel(k->gate), nb = (n + BLOCK - 1) / BLOCK;
    accel_dtype rt = k->gate->dtype;
#pragma omp parallel for if (n > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t off = b * BLOCK, m = off + BLOCK < n ? BLOCK : n - off;
        if (rt == ACCEL_BF16) swiglu_backward_block(k, off, m, ACCEL_BF16);
        else if (rt == ACCEL_F16) swiglu_backward_block(k, off, m, ACCEL_F16);
        else swiglu_backward_block(k, off, m, ACCEL_F32);
    }
}

/* ---- RoPE */

/* Element i of a run of f32 (bf16 false) or bf16 values as f32, and v
 * stored into one (rounded). Inlined with a constant `bf16` into the loops
 * below, so that each case vectorises with the conversion in registers. */
ACCEL__VEC_MATH static inline __attribute__((always_inline)) float load_run(const void *p, bool bf16, int64_t i) {
    return bf16 ? accel__bf16_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

ACCEL__VEC_MATH static inline __attribute__((always_inline)) void store_run(void *p, bool bf16, int64_t i, float v) {
    if (bf16) ((uint16_t *)p)[i] = accel__bf16_bits(v);
    else ((float *)p)[i] = v;
}

/* n columns of a row's halves: y1 (+)= x1 c - x2 s, y2 (+)= x2 c + x1 s with
 * s = sign * sin (acc: added to y's values, the sum rounded once, as the
 * reference adds them), x and y f32 or bf16 runs (xb, yb). */
ACCEL__VEC_MATH static inline __attribute__((always_inline)) void
rotate(const void *x1, const void *x2, bool xb, const float *c, const float *sn, float sign, void *y1, void *y2,
       bool yb, bool acc, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float a = load_run(x1, xb, i), b = load_run(x2, xb, i), si = sign * sn[i];
        float o1 = a * c[i] - b * si, o2 = b * c[i] + a * si;
        if (acc) {
            o1 = o1 + load_run(y1, yb, i);
            o2 = o2 + load_run(y2, yb, i);
        }
        store_run(y1, yb, i, o1);
        store_run(y2, yb, i, o2);
    }
}

/* Rows [r0, r1) of the [BH, T] rows, with x's and y's kinds (xb, yb: bf16,
 * else f32 or f16) and beta != 0 (acc) constants of each inlined copy. A
 * row's (b, h) comes from one division per run of rows, not per row (at
 * head dim 64 the divisions and a call per conversion and per half cost
 * several times the row's own work). f16 is widened into, or rounded
 * from, f32 scratch by the run conversions above (F16C in the vector
 * variants). */
ACCEL__VEC_MATH static inline __attribute__((always_inline)) void rope_rows(const accel_k_rope *k, int64_t r0,
                                                                            int64_t r1, bool xb, bool yb, bool acc) {
    enum { HB = BLOCK / 2 };
    const accel_tensor *x = k->x, *y = k->y;
    int64_t H = x->shape[1], T = k->T, half = k->half, t = r0 % T, bh = r0 / T;
    int64_t xes = (int64_t)accel_dtype_size(x->dtype), yes = (int64_t)accel_dtype_size(y->dtype);
    bool xh = x->dtype == ACCEL_F16, yh = y->dtype == ACCEL_F16;
    const char *xr = NULL;
    char *yr = NULL;
    for (int64_t r = r0; r < r1; r++, t++) {
        if (t == T || r == r0) { /* the first row of a (b, h), or of this run */
            if (t == T) {
                t = 0;
                bh++;
            }
            xr = (const char *)x->data +
                 ((bh / H) * x->stride[0] + (bh % H) * x->stride[1] + t * x->stride[2]) * xes;
            yr = (char *)y->data + ((bh / H) * y->stride[0] + (bh % H) * y->stride[1] + t * y->stride[2]) * yes;
        } else {
            xr += x->stride[2] * xes;
            yr += y->stride[2] * yes;
        }
        const float *c = (const float *)k->cos->data + t * half, *sn = (const float *)k->sin->data + t * half;
        for (int64_t i0 = 0; i0 < half; i0 += HB) {
            float b1[HB], b2[HB], o1[HB], o2[HB];
            int64_t m = half - i0 < HB ? half - i0 : HB;
            const void *x1 = xr + i0 * xes, *x2 = xr + (half + i0) * xes;
            void *y1 = yr + i0 * yes, *y2 = yr + (half + i0) * yes;
            if (xh) {
                f16_to_f32_run(b1, x1, m);
                f16_to_f32_run(b2, x2, m);
                x1 = b1;
                x2 = b2;
            }
            if (yh && acc) {
                f16_to_f32_run(o1, y1, m);
                f16_to_f32_run(o2, y2, m);
            }
            rotate(x1, x2, xb, c + i0, sn + i0, k->sign, yh ? o1 : y1, yh ? o2 : y2, yb, acc, m);
            if (yh) {
                f32_to_f16_run(y1, o1, m);
                f32_to_f16_run(y2, o2, m);
            }
        }
    }
}

/* Elements a task of the rotation takes (rows of a whole multiple). */
enum { ROPE_TASK = 16384 };

/* ACCEL__VEC_MATH as rope_rows: GCC inlines its conversions only into functions of the same optimize attribute. */
ACCEL__VEC_MATH void accel__cpu_rope(const accel_k_rope *k) {
    int64_t rows = k->BH * k->T, D = 2 * k->half, per = ROPE_TASK / D > 0 ? ROPE_TASK / D : 1;
    int64_t ntasks = (rows + per - 1) / per;
    int kind = (k->x->dtype == ACCEL_BF16) * 4 + (k->y->dtype == ACCEL_BF16) * 2 + (k->beta != 0.0f);
#pragma omp parallel for if (rows * D > ROPE_TASK) schedule(static)
    for (int64_t j = 0; j < ntasks; j++) {
        int64_t r0 = j * per, r1 = r0 + per < rows ? r0 + per : rows;
        switch (kind) { /* each case its own loop, its conversions and beta known */
#define ROPE_CASE(c)                                                                                                   \
    case c: rope_rows(k, r0, r1, (c) & 4, (c) & 2, (c) & 1); break;
            ROPE_CASE(0) ROPE_CASE(1) ROPE_CASE(2) ROPE_CASE(3) ROPE_CASE(4) ROPE_CASE(5) ROPE_CASE(6) ROPE_CASE(7)
#undef ROPE_CASE
        }
    }
}

/* ---- cross-entropy with its gradient */

/* One counted row: writes dx = (softmax(x) - onehot(t)) * inv_count, times
 * *g when g is given (one more f32 product: that f32 gradient scaled), into
 * drow (dtype ddt) and returns logsumexp(x) - x[t]. row: C floats of
 * scratch. */
ACCEL__VEC_MATH static double ce_row_fused(const void *xrow, accel_dtype xdt, void *drow, accel_dtype ddt, int64_t C,
                                           int64_t t, float inv_count, const float *g, float *row) {
    const float *x = xdt == ACCEL_F32 ? xrow : row;
    if (xdt != ACCEL_F32) accel__cpu_to_f32(row, xrow, xdt, C);
    float xt = x[t];
    /* e may be x itself (the scratch row): exp is taken element by element. */
    float *e = ddt == ACCEL_F32 ? drow : row;
    float mx = accel__row_max(x, C), s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < C; j++) {
        float v = accel__expf(x[j] - mx);
        e[j] = v;
        s += v;
    }
    float scale = inv_count / s;
#pragma omp simd
    for (int64_t j = 0; j < C; j++) e[j] *= scale;
    e[t] -= inv_count;
    if (g) {
        float gv = *g;
#pragma omp simd
        for (int64_t j = 0; j < C; j++) e[j] *= gv;
    }
    if (ddt != ACCEL_F32) accel__cpu_from_f32(drow, ddt, e, C);
    return (double)(mx + logf(s)) - xt;
}

/* An ignored row's dx: 0, or 0 * *g (-0 for a negative g, nan for a nan
 * one, as that f32 zero scaled and rounded). row: C floats of scratch. */
static void ce_row_ignored(void *drow, accel_dtype ddt, int64_t C, const float *g, float *row) {
    float z = g ? 0.0f * *g : 0.0f;
    if (z == 0.0f && !signbit(z)) {
        memset(drow, 0, (size_t)C * accel_dtype_size(ddt));
        return;
    }
    float *e = ddt == ACCEL_F32 ? drow : row;
    for (int64_t j = 0; j < C; j++) e[j] = z;
    if (ddt != ACCEL_F32) accel__cpu_from_f32(drow, ddt, e, C);
}

void accel__cpu_cross_entropy_fused(const accel_k_cross_entropy_fused *k, int64_t count, int nt, float *scratch,
                                    double *total) {
    int64_t N = k->N, C = k->C, ignore = k->ignore;
    const int64_t *t = k->targets->data;
    const float *g = k->g ? k->g->data : NULL;
    accel_dtype xdt = k->x->dtype, ddt = k->dx->dtype;
    size_t xes = accel_dtype_size(xdt), des = accel_dtype_size(ddt);
    float inv_count = count ? (float)(1.0 / (double)count) : 0.0f;
    double sum = 0.0;
#pragma omp parallel num_threads(nt) if (N * C > 16384) reduction(+ : sum)
    {
        float *row = scratch + (size_t)omp_get_thread_num() * (size_t)C;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N; i++) {
            char *d = (char *)k->dx->data + (size_t)(i * C) * des;
            if (t[i] == ignore)
                ce_row_ignored(d, ddt, C, g, row);
            else
                sum += ce_row_fused((const char *)k->x->data + (size_t)(i * C) * xes, xdt, d, ddt, C, t[i],
                                    inv_count, g, row);
        }
    }
    *total = sum;
}
