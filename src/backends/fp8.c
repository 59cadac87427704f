/* Which devices can run mixed_precision='fp8', and the fp8 Linear's
 * primitives (backends/fp8.h): the CPU reference here, a device's own
 * kernels (its backend's accel__fp8_ops: cuda's on a GPU) elsewhere. */
#include "backends/fp8.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/backend.h"
#include "backends/plugin.h"

/* The fp8 kernels of device d's backend; NULL for the cpu (the reference
 * here) and devices without them. */
static const accel__fp8_ops *ops_of(accel_device d) {
    if (d.type == ACCEL_DEV_CPU || d.type == ACCEL_DEV_META) return NULL;
    const accel_backend *b = accel__backend_of(d);
    return b ? b->fp8 : NULL;
}

static atomic_bool g_cpu_reference;

bool accel__fp8_cpu_reference_set(bool on) { return atomic_exchange(&g_cpu_reference, on); }

accel_status accel__fp8_device_check(accel_device d, const char *op) {
    if (d.type == ACCEL_DEV_CPU && atomic_load(&g_cpu_reference)) return ACCEL_OK;
    char dev[32];
    accel_device_str(d, dev, sizeof dev);
    const accel__fp8_ops *k = ops_of(d);
    if (k && accel_device_available(d)) return k->check(d.index, op);
    const char *why = accel_device_count(ACCEL_DEV_CUDA) ? "" : accel__plugin_unavailable_reason(ACCEL_DEV_CUDA);
    return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                           "%s: fp8 mixed precision is not supported on %s%s%s%s: it needs a CUDA GPU of compute "
                           "capability >= 8.9 (Ada Lovelace, Hopper); use bf16 or fp16",
                           op, dev, *why ? " (" : "", why, *why ? ")" : "");
}

/* ---- primitives */

static int meta_len(const accel_tensor *meta) { return (int)meta->shape[0] - 2; }

static bool is_cpu(const accel_tensor *t) { return t->device.type == ACCEL_DEV_CPU; }

/* t is a contiguous [rows, cols] tensor of dtype dt (cols < 0: any 1-D). */
static bool fits(const accel_tensor *t, accel_dtype dt, int64_t rows, int64_t cols) {
    if (!t || t->dtype != dt || !accel_is_contiguous(t)) return false;
    if (cols < 0) return t->ndim == 1 && t->shape[0] >= rows;
    return t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

static accel_status bad(const char *fn, const char *what) {
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s", fn, what);
}

/* host (a new cpu tensor, taken) on dev: host itself on the cpu, elsewhere
 * a copy there (host freed); NULL + error on failure. */
static accel_tensor *moved_to(accel_tensor *host, accel_device dev) {
    if (dev.type == ACCEL_DEV_CPU) return host;
    accel_tensor *t = accel_tensor_new(host->dtype, host->ndim, host->shape, dev);
    if (t && accel_copy_(t, host) != ACCEL_OK) {
        accel_tensor_free(t);
        t = NULL;
    }
    accel_tensor_free(host);
    return t;
}

accel_tensor *accel__fp8_meta_new(int len, accel_device dev) {
    if (len < 1) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "fp8: amax_history_len must be >= 1 (got %d)", len);
        return NULL;
    }
    const int64_t shape[2] = {ACCEL__FP8_META_ROWS(len), ACCEL__FP8_SLOTS};
    accel_tensor *host = accel_tensor_new(ACCEL_F32, 2, shape, ACCEL_CPU_DEVICE);
    if (!host) return NULL;
    float *m = host->data;
    memset(m, 0, sizeof(float) * (size_t)(shape[0] * shape[1]));
    for (int s = 0; s < 2 * ACCEL__FP8_SLOTS; s++) m[s] = 1.0f; /* scale and scale_inv */
    return moved_to(host, dev);
}

static void quantize_cpu(uint8_t *q, uint8_t *q_t, const float *x, int64_t rows, int64_t cols, float *meta,
                         int slot, accel__fp8_format f) {
    const float s = meta[slot];
    float m = *accel__fp8_meta_amax(meta, slot);
    for (int64_t i = 0; i < rows * cols; i++) {
        m = fmaxf(m, fabsf(x[i])); /* fmaxf drops a NaN, as the GPU's */
        uint8_t b = accel__fp8_encode(x[i] * s, f);
        if (q) q[i] = b;
        if (q_t) q_t[(i % cols) * rows + i / cols] = b;
    }
    *accel__fp8_meta_amax(meta, slot) = m;
}

/* The arguments of accel__fp8_quantize fit (else the error, naming fn). */
static accel_status quantize_args(const char *fn, const accel_tensor *q, const accel_tensor *q_t, const accel_tensor *inv,
                                  int inv_at, const accel_tensor *x, const accel_tensor *meta, int slot) {
    if (!x || x->ndim != 2 || slot < 0 || slot >= ACCEL__FP8_SLOTS) return bad(fn, "x must be 2-D, slot 0..2");
    int64_t rows = x->shape[0], cols = x->shape[1];
    if (!fits(x, ACCEL_F32, rows, cols) || (!q && !q_t) || (q && !fits(q, ACCEL_U8, rows, cols)) ||
        (q_t && !fits(q_t, ACCEL_U8, cols, rows)) || !fits(inv, ACCEL_F32, inv_at + 1, -1) || !meta ||
        meta->ndim != 2 || meta->shape[0] < 3 || !fits(meta, ACCEL_F32, meta->shape[0], ACCEL__FP8_SLOTS))
        return bad(fn, "x f32 [rows, cols], q u8 [rows, cols] and/or q_t u8 [cols, rows], inv f32 and meta f32 "
                       "[2 + len, 3], all contiguous");
    if (!is_cpu(x) && !ops_of(x->device)) return bad(fn, "fp8 runs on cuda devices (and the cpu reference)");
    return ACCEL_OK;
}

accel_status accel__fp8_quantize(accel_tensor *q, accel_tensor *q_t, accel_tensor *inv, int inv_at,
                                 accel_tensor *x, accel_tensor *meta, int slot, accel__fp8_format f) {
    accel_status st = quantize_args("accel__fp8_quantize", q, q_t, inv, inv_at, x, meta, slot);
    if (st != ACCEL_OK) return st;
    int64_t rows = x->shape[0], cols = x->shape[1];
    float *m = meta->data;
    const accel__fp8_ops *k = ops_of(x->device);
    if (k)
        return k->quantize(x->device.index, q ? q->data : NULL, q_t ? q_t->data : NULL, x->data, rows,
                                        cols, f, m + slot, m + ACCEL__FP8_SLOTS + slot, accel__fp8_meta_amax(m, slot),
                                        (float *)inv->data + inv_at);
    quantize_cpu(q ? q->data : NULL, q_t ? q_t->data : NULL, x->data, rows, cols, m, slot, f);
    ((float *)inv->data)[inv_at] = m[ACCEL__FP8_SLOTS + slot];
    return ACCEL_OK;
}

enum { CACHE_SCALE, CACHE_AMAX, CACHE_SCRATCH };
_Static_assert(CACHE_SCRATCH + 1 == ACCEL__FP8_CACHE_WORDS, "a cache row is its scale, amax and scratch");

accel_tensor *accel__fp8_cache_state_new(int n, accel_device dev) {
    const int64_t shape[2] = {n, ACCEL__FP8_CACHE_WORDS};
    accel_tensor *host = accel_tensor_new(ACCEL_F32, 2, shape, ACCEL_CPU_DEVICE);
    if (!host) return NULL;
    float *c = host->data;
    for (int i = 0; i < n; i++) /* a NaN scale equals none: the first use casts */
        c[i * ACCEL__FP8_CACHE_WORDS + CACHE_SCALE] = NAN,
        c[i * ACCEL__FP8_CACHE_WORDS + CACHE_AMAX] = c[i * ACCEL__FP8_CACHE_WORDS + CACHE_SCRATCH] = 0;
    return moved_to(host, dev);
}

static atomic_ullong g_cache_casts, g_cache_hits;

accel__fp8_cache_stats accel__fp8_cache_stats_get(void) {
    return (accel__fp8_cache_stats){atomic_load(&g_cache_casts), atomic_load(&g_cache_hits)};
}

/* The cpu reference of accel__fp8_quantize_cached: c the cache, m the meta. */
static void quantize_cached_cpu(uint8_t *q, uint8_t *q_t, const float *x, int64_t rows, int64_t cols, float *m,
                                int slot, accel__fp8_format f, float *c, bool fresh, float *inv_out) {
    float *amax = accel__fp8_meta_amax(m, slot);
    if (fresh || m[slot] != c[CACHE_SCALE]) { /* the cast alone measures x's amax: into the cache */
        float keep = *amax;
        *amax = 0.0f;
        quantize_cpu(q, q_t, x, rows, cols, m, slot, f);
        c[CACHE_AMAX] = *amax, c[CACHE_SCALE] = m[slot];
        *amax = keep;
        atomic_fetch_add(&g_cache_casts, 1);
    } else {
        atomic_fetch_add(&g_cache_hits, 1);
    }
    *amax = fmaxf(*amax, c[CACHE_AMAX]);
    *inv_out = m[ACCEL__FP8_SLOTS + slot];
}

accel_status accel__fp8_quantize_cached(accel_tensor *q, accel_tensor *q_t, accel_tensor *inv, int inv_at,
                                        accel_tensor *x, accel_tensor *meta, int slot, accel__fp8_format f,
                                        accel_tensor *cache, bool fresh) {
    static const char *FN = "accel__fp8_quantize_cached";
    accel_status st = quantize_args(FN, q, q_t, inv, inv_at, x, meta, slot);
    if (st != ACCEL_OK) return st;
    if (!q || !q_t || !fits(cache, ACCEL_F32, ACCEL__FP8_CACHE_WORDS, -1) || !accel_device_eq(cache->device, x->device))
        return bad(FN, "q, q_t and a cache f32 [3] on x's device");
    int64_t rows = x->shape[0], cols = x->shape[1];
    float *m = meta->data, *inv_out = (float *)inv->data + inv_at;
    const accel__fp8_ops *k = ops_of(x->device);
    if (k)
        return k->quantize_cached(x->device.index, q->data, q_t->data, x->data, rows, cols, f, m + slot,
                                               m + ACCEL__FP8_SLOTS + slot, accel__fp8_meta_amax(m, slot), inv_out,
                                               cache->data, fresh);
    quantize_cached_cpu(q->data, q_t->data, x->data, rows, cols, m, slot, f, cache->data, fresh, inv_out);
    return ACCEL_OK;
}

static void gemm_cpu(float *c, float beta, const uint8_t *a, accel__fp8_format fa, float a_inv, const uint8_t *b,
                     accel__fp8_format fb, float b_inv, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)accel__fp8_decode(a[i * K + k], fa) * accel__fp8_decode(b[j * K + k], fb);
            float v = (float)(acc * a_inv * b_inv);
            c[i * N + j] = beta == 0.0f ? v : v + beta * c[i * N + j];
        }
}

accel_status accel__fp8_gemm(accel_tensor *c, float beta, accel__fp8_operand a, accel__fp8_operand b) {
    static const char *FN = "accel__fp8_gemm";
    if (!a.q || !b.q || !c || a.q->ndim != 2 || b.q->ndim != 2) return bad(FN, "A and B must be 2-D");
    int64_t M = a.q->shape[0], K = a.q->shape[1], N = b.q->shape[0];
    if (!fits(a.q, ACCEL_U8, M, K) || !fits(b.q, ACCEL_U8, N, K) || !fits(c, ACCEL_F32, M, N) ||
        !fits(a.inv, ACCEL_F32, a.inv_at + 1, -1) || !fits(b.inv, ACCEL_F32, b.inv_at + 1, -1))
        return bad(FN, "A u8 [M, K], B u8 [N, K], C f32 [M, N] and the scale_invs f32, all contiguous");
    if (a.fmt == ACCEL_FP8_E5M2 && b.fmt == ACCEL_FP8_E5M2)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: E5M2 x E5M2 has no fp8 GEMM (cuBLASLt has none)", FN);
    const float *ai = (const float *)a.inv->data + a.inv_at, *bi = (const float *)b.inv->data + b.inv_at;
    const accel__fp8_ops *k = ops_of(c->device);
    if (k) {
        accel__fp8_gemm_args g = {.c = c->data, .c_dtype = ACCEL_F32, .a = a.q->data, .b = b.q->data, .a_fmt = a.fmt,
                             .b_fmt = b.fmt, .a_inv = ai, .b_inv = bi, .M = M, .N = N, .K = K, .lda = K, .ldb = K,
                             .ldc = N, .alpha = 1.0f, .beta = beta};
        return k->gemm(c->device.index, &g);
    }
    if (c->device.type != ACCEL_DEV_CPU) return bad(FN, "fp8 runs on cuda devices (and the cpu reference)");
    gemm_cpu(c->data, beta, a.q->data, a.fmt, *ai, b.q->data, b.fmt, *bi, M, N, K);
    return ACCEL_OK;
}

accel_status accel__fp8_meta_update(accel_tensor *meta, int first, int n, accel__fp8_recipe r) {
    if (!meta || meta->ndim != 2 || meta->shape[0] < 3 || !fits(meta, ACCEL_F32, meta->shape[0], ACCEL__FP8_SLOTS) ||
        first < 0 || n < 0 || first + n > ACCEL__FP8_SLOTS)
        return bad("accel__fp8_meta_update", "meta must be f32 [2 + len, 3] and the slots within 0..2");
    r.history_len = meta_len(meta); /* the meta's rows (a loaded checkpoint's) decide */
    const accel__fp8_ops *k = ops_of(meta->device);
    if (k) return k->update(meta->device.index, meta->data, first, n, r);
    if (meta->device.type != ACCEL_DEV_CPU) return bad("accel__fp8_meta_update", "fp8 runs on cuda devices");
    for (int s = first; s < first + n; s++) accel__fp8_update(meta->data, s, r);
    return ACCEL_OK;
}
