/* The CUDA backend's handling of failed CUDA calls, on any machine (a GPU is
 * not needed: the calls are fakes put into the backend's call table,
 * src/backends/cuda/cuda_calls.h, returning the error under test):
 * - the caching allocator names a failed cudaMalloc for what it is: out of
 *   memory only when it is, after releasing its cache and retrying; any other
 *   error by its name, a sticky one saying the context is lost; and it gives
 *   its cache back when the virtual memory runs out (accel__cuda_release_cached);
 * - polling an event clears "not ready" from the runtime's pending error
 *   (else the next kernel's launch check reports it), and only that;
 * - cuBLASLt's heuristic answering "no algorithm" with a status
 *   (NOT_SUPPORTED, or INVALID_VALUE for a bias epilogue at M = 1) is a plan
 *   without algorithm, cached: the biased GEMM adds its bias first, and the
 *   heuristic is not asked again for that signature (an fp8 one's too);
 * - the NCCL backend stages a host buffer through pinned memory: no copy it
 *   enqueues has a pageable side (that copy would wait for the collective
 *   inside cudaMemcpyAsync, forever when a peer is dead, and the host would
 *   never poll for the timeout), and the output reaches the host buffer only
 *   after the wait (dist/nccl_stage.h).
 * Skipped (77) in a build without the CUDA backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"

#ifndef ACCEL_HAVE_CUDA
int main(void) {
    printf("SKIP: this build has no CUDA backend\n");
    return 77;
}
#else
#include "backends/cuda/cuda_calls.h"
#include "backends/cuda/cuda_internal.h"

static accel__cuda_calls saved;

/* ---- fakes: device memory is host memory; each call counted */

static int n_malloc, n_free, fail_mallocs; /* the next fail_mallocs cudaMallocs fail with malloc_error */
static cudaError_t malloc_error, pending;  /* pending: the fake runtime's pending error */

static cudaError_t fake_malloc(void **p, size_t bytes) {
    n_malloc++;
    if (fail_mallocs > 0) {
        fail_mallocs--;
        pending = malloc_error;
        return malloc_error;
    }
    *p = malloc(bytes);
    return cudaSuccess;
}

static cudaError_t fake_free(void *p) {
    n_free++;
    free(p);
    return cudaSuccess;
}

/* A sticky error stays pending when taken; any other is cleared. */
static bool sticky;
static cudaError_t fake_peek(void) { return pending; }
static cudaError_t fake_take(void) {
    cudaError_t e = pending;
    if (!sticky) pending = cudaSuccess;
    return e;
}

static cudaError_t event_answer;
static cudaError_t fake_event_query(cudaEvent_t e) {
    (void)e;
    if (event_answer != cudaSuccess) pending = event_answer;
    return event_answer;
}

static void use_fakes(void) {
    saved = accel__cuda_call;
    accel__cuda_call.malloc = fake_malloc;
    accel__cuda_call.free = fake_free;
    accel__cuda_call.peek_error = fake_peek;
    accel__cuda_call.take_error = fake_take;
    accel__cuda_call.event_query = fake_event_query;
    pending = cudaSuccess;
    sticky = false;
    fail_mallocs = 0;
}

static void use_real(void) { accel__cuda_call = saved; }

static bool says(const char *needle) { return strstr(accel_last_error(), needle) != NULL; }

/* ---- the allocator (device index 15: no other test of this binary uses it) */

enum { DEV = 15 };

static void test_fault_is_not_out_of_memory(void) {
    use_fakes();
    fail_mallocs = 1, malloc_error = cudaErrorIllegalAddress, sticky = true;
    int before = n_malloc;
    CHECK(accel__cuda_alloc(DEV, 4096, 256) == NULL);
    CHECK_MSG(accel_last_status() == ACCEL_ERR_DEVICE && says("cudaErrorIllegalAddress") && says("sticky") &&
                  !says("out of memory"), "%s", accel_last_error());
    CHECK(n_malloc - before == 1); /* no retry: releasing memory cannot help */
    sticky = false, pending = cudaSuccess;
    fail_mallocs = 1, malloc_error = cudaErrorInvalidValue;
    CHECK(accel__cuda_alloc(DEV, 4096, 256) == NULL);
    CHECK_MSG(accel_last_status() == ACCEL_ERR_DEVICE && says("cudaErrorInvalidValue") && !says("sticky"), "%s",
              accel_last_error());
    CHECK(pending == cudaSuccess); /* taken: not reported again by the next call */
    use_real();
}

static void test_out_of_memory_releases_the_cache_and_retries(void) {
    use_fakes();
    void *a = accel__cuda_alloc(DEV, 4096, 256), *b = accel__cuda_alloc(DEV, 1024, 256);
    CHECK(a && b);
    size_t held = accel__cuda_reserved_bytes(DEV);
    accel__cuda_free(DEV, a);
    accel__cuda_free(DEV, b); /* both cached */
    int frees = n_free, mallocs = n_malloc;
    fail_mallocs = 1, malloc_error = cudaErrorMemoryAllocation;
    void *c = accel__cuda_alloc(DEV, 8192, 256);
    CHECK_MSG(c != NULL, "%s", accel_last_error());
    CHECK(n_malloc - mallocs == 2 && n_free - frees == 2 && pending == cudaSuccess);
    CHECK(accel__cuda_reserved_bytes(DEV) == held - 4096 - 1024 + 8192);
    fail_mallocs = 2;
    CHECK(accel__cuda_alloc(DEV, 16384, 256) == NULL);
    CHECK_MSG(accel_last_status() == ACCEL_ERR_OOM && says("out of memory allocating 16384 bytes"), "%s",
              accel_last_error());
    accel__cuda_free(DEV, c);
    accel__cuda_release_cached(DEV);
    CHECK(accel__cuda_reserved_bytes(DEV) == held - 4096 - 1024);
    use_real();
}

/* What the virtual memory calls when cuMemCreate runs out (vm_pool.h's
 * release_idle): every cached block goes back, blocks in use stay. */
static void test_release_cached(void) {
    use_fakes();
    size_t held = accel__cuda_reserved_bytes(DEV);
    void *a = accel__cuda_alloc(DEV, 3 << 20, 256), *b = accel__cuda_alloc(DEV, 512, 256),
         *keep = accel__cuda_alloc(DEV, 2048, 256);
    CHECK(a && b && keep);
    accel__cuda_free(DEV, a);
    accel__cuda_free(DEV, b);
    int frees = n_free;
    accel__cuda_release_cached(DEV);
    CHECK(n_free - frees == 2 && accel__cuda_reserved_bytes(DEV) == held + 2048);
    accel__cuda_free(DEV, keep);
    accel__cuda_release_cached(DEV);
    CHECK(accel__cuda_reserved_bytes(DEV) == held);
    use_real();
}

/* ---- events */

static void test_event_poll_clears_only_not_ready(void) {
    use_fakes();
    event_answer = cudaErrorNotReady;
    CHECK(accel__cuda_event_poll(NULL) == cudaErrorNotReady && pending == cudaSuccess);
    event_answer = cudaSuccess, pending = cudaErrorLaunchFailure; /* an earlier call's error */
    CHECK(accel__cuda_event_poll(NULL) == cudaSuccess && pending == cudaErrorLaunchFailure);
    event_answer = cudaErrorIllegalAddress, pending = cudaSuccess;
    CHECK(accel__cuda_event_poll(NULL) == cudaErrorIllegalAddress && pending == cudaErrorIllegalAddress);
    use_real();
}

/* ---- the NCCL backend's staging: which memory each copy touches */

#ifdef ACCEL_HAVE_NCCL
#include "dist/nccl_stage.h"

/* The fakes' memory kinds: "device" is what fake_device_malloc handed out,
 * pinned what fake_host_alloc did (both host memory here), the rest pageable. */
enum { MAX_REGIONS = 8 };
static struct region {
    char *p;
    size_t n;
    enum cudaMemoryType type;
} regions[MAX_REGIONS];
static int n_regions, n_copies, n_pageable_copies;

static cudaError_t region_new(void **p, size_t bytes, enum cudaMemoryType type) {
    if (n_regions == MAX_REGIONS || !(*p = malloc(bytes))) return cudaErrorMemoryAllocation;
    regions[n_regions++] = (struct region){*p, bytes, type};
    return cudaSuccess;
}

static cudaError_t region_free(void *p) {
    for (int i = 0; i < n_regions; i++)
        if (regions[i].p == p) {
            free(p);
            regions[i] = regions[--n_regions];
            return cudaSuccess;
        }
    return cudaErrorInvalidValue;
}

static enum cudaMemoryType kind_of(const void *p) {
    for (int i = 0; i < n_regions; i++)
        if ((const char *)p >= regions[i].p && (const char *)p < regions[i].p + regions[i].n) return regions[i].type;
    return cudaMemoryTypeUnregistered;
}

static cudaError_t fake_device_malloc(void **p, size_t bytes) { return region_new(p, bytes, cudaMemoryTypeDevice); }
static cudaError_t fake_host_alloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    return region_new(p, bytes, cudaMemoryTypeHost);
}

static cudaError_t fake_attributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    a->type = kind_of(p);
    return cudaSuccess;
}

/* The copy done at once (the fake stream runs as soon as it is given work),
 * counted, and counted apart when a side is pageable. */
static cudaError_t fake_memcpy_async(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)kind, (void)s;
    n_copies++;
    if (kind_of(dst) == cudaMemoryTypeUnregistered || kind_of(src) == cudaMemoryTypeUnregistered) n_pageable_copies++;
    memcpy(dst, src, n);
    return cudaSuccess;
}

static void test_nccl_staging_is_pinned(void) {
    use_fakes();
    accel__cuda_call.malloc = fake_device_malloc;
    accel__cuda_call.free = region_free;
    accel__cuda_call.host_alloc = fake_host_alloc;
    accel__cuda_call.free_host = region_free;
    accel__cuda_call.pointer_attributes = fake_attributes;
    accel__cuda_call.memcpy_async = fake_memcpy_async;
    enum { N = 16 };
    float in[N], out[N] = {0}; /* the caller's host buffers: pageable */
    for (int i = 0; i < N; i++) in[i] = (float)i + 0.5f;
    accel__nccl_stage st = {0};
    CHECK(accel__nccl_stage_reserve(&st, 2 * sizeof in) == cudaSuccess && st.bytes == 2 * sizeof in);
    CHECK(accel__nccl_on_device(st.dev) && !accel__nccl_on_device(st.host) && !accel__nccl_on_device(in));
    /* a collective with its input at 0 and its output after it (reduce_scatter's layout) */
    CHECK(accel__nccl_put(&st, NULL, 0, in, sizeof in) == cudaSuccess);
    memcpy(st.dev + sizeof in, st.dev, sizeof in); /* the collective: its output is its input */
    CHECK(accel__nccl_get(&st, NULL, out, sizeof in, sizeof out) == cudaSuccess);
    CHECK_MSG(n_copies == 2 && n_pageable_copies == 0, "%d copies, %d of them with a pageable side", n_copies,
              n_pageable_copies);
    CHECK(out[N - 1] == 0.0f); /* not before the wait for the collective */
    accel__nccl_take(&st, out, sizeof in, sizeof out);
    CHECK(memcmp(out, in, sizeof in) == 0);
    /* device buffers: copied directly, one copy each way */
    void *d = NULL;
    CHECK(fake_device_malloc(&d, sizeof in) == cudaSuccess);
    CHECK(accel__nccl_put(&st, NULL, 0, d, sizeof in) == cudaSuccess);
    CHECK(accel__nccl_get(&st, NULL, d, 0, sizeof in) == cudaSuccess);
    CHECK(n_copies == 4 && n_pageable_copies == 0);
    /* a smaller need keeps the buffers, a larger one replaces both */
    char *dev = st.dev;
    CHECK(accel__nccl_stage_reserve(&st, 8) == cudaSuccess && st.dev == dev);
    CHECK(accel__nccl_stage_reserve(&st, 4 * sizeof in) == cudaSuccess && st.bytes == 4 * sizeof in && n_regions == 3);
    accel__nccl_stage_free(&st);
    region_free(d);
    CHECK(n_regions == 0 && !st.dev && !st.host);
    use_real();
}
#endif

/* ---- the GEMM's heuristic */

static int n_heuristic;
static cublasStatus_t heuristic_answer;

static cublasStatus_t fake_lt_create(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t)(uintptr_t)0x1000;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t fake_heuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                     cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                     cublasLtMatmulPreference_t pref, int requested,
                                     cublasLtMatmulHeuristicResult_t results[], int *found) {
    n_heuristic++;
    *found = 0;
    return heuristic_answer;
}

static _Alignas(256) float g_a[64], g_b[64], g_c[64], g_bias[16];

static accel_tensor tensor(float *data, accel_dtype dt, int64_t rows, int64_t cols) {
    accel_tensor t;
    memset(&t, 0, sizeof t);
    t.magic = ACCEL_TENSOR_MAGIC;
    t.dtype = dt;
    t.device = (accel_device){ACCEL_DEV_CUDA, DEV};
    t.ndim = rows ? 2 : 1;
    t.shape[0] = rows ? rows : cols;
    t.stride[0] = rows ? cols : 1;
    t.shape[1] = cols;
    t.stride[1] = 1;
    t.data = data;
    return t;
}

/* y [M, N] = x [M, K] W[N, K]^T (+ bias, f32), x, W and y of dtype dt,
 * with K chosen per case so that each case is a signature of its own. */
static accel_status linear_of(accel_dtype dt, int64_t M, int64_t N, int64_t K, bool with_bias) {
    accel_tensor a = tensor(g_a, dt, M, K), b = tensor(g_b, dt, N, K), c = tensor(g_c, dt, M, N);
    accel_tensor bias = tensor(g_bias, ACCEL_F32, 0, N);
    accel_k_gemm g;
    memset(&g, 0, sizeof g);
    g.c = &c, g.a = &a, g.b = &b, g.bias = with_bias ? &bias : NULL;
    g.trans_b = true;
    g.M = M, g.N = N, g.K = K, g.lda = K, g.ldb = K, g.ldc = N;
    g.alpha = 1.0f;
    return accel__cudak_gemm(&g);
}

static accel_status linear(int64_t M, int64_t N, int64_t K, bool with_bias) {
    return linear_of(ACCEL_F32, M, N, K, with_bias);
}

static void test_no_heuristic_is_a_cached_plan(void) {
    use_fakes();
    accel__cuda_call.lt_create = fake_lt_create;
    accel__cuda_call.lt_heuristic = fake_heuristic;
    /* a bias epilogue at M = 1: INVALID_VALUE; the bias goes in first (on a
     * machine without a GPU that kernel's launch then fails: not the
     * heuristic's error), and the second call does not ask again */
    int plans = accel__cuda_gemm_plans(), asked = n_heuristic;
    heuristic_answer = CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 2; i++) {
        accel_status st = linear(1, 4, 8, true);
        CHECK_MSG(st == ACCEL_OK || !says("heuristic"), "%s", accel_last_error());
    }
    CHECK(n_heuristic - asked == 1 && accel__cuda_gemm_plans() - plans == 1);
    /* NOT_SUPPORTED without a bias: nothing to fall back to, named as such */
    heuristic_answer = CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < 2; i++) {
        CHECK(linear(2, 4, 16, false) == ACCEL_ERR_UNSUPPORTED);
        CHECK_MSG(says("no cuBLASLt algorithm for M=2 N=4 K=16") && says("not supported"), "%s", accel_last_error());
    }
    CHECK(n_heuristic - asked == 2 && accel__cuda_gemm_plans() - plans == 2);
    /* a real failure stays an error and is not cached */
    heuristic_answer = CUBLAS_STATUS_INTERNAL_ERROR;
    CHECK(linear(2, 4, 24, false) == ACCEL_ERR_DEVICE && says("heuristic"));
    CHECK(linear(2, 4, 24, false) == ACCEL_ERR_DEVICE && n_heuristic - asked == 4);
    CHECK(accel__cuda_gemm_plans() - plans == 2);
    /* an fp8 signature is planned once too (its descriptor per call) */
    heuristic_answer = CUBLAS_STATUS_NOT_SUPPORTED;
    static _Alignas(256) uint8_t qa[64], qb[64];
    accel__cuda_fp8_args f = {.c = g_c, .c_dtype = ACCEL_F32, .a = qa, .b = qb, .a_fmt = ACCEL_FP8_E4M3,
                              .b_fmt = ACCEL_FP8_E4M3, .a_inv = g_bias, .b_inv = g_bias + 4, .M = 2, .N = 4, .K = 16,
                              .lda = 16, .ldb = 16, .ldc = 4, .alpha = 1.0f};
    for (int i = 0; i < 2; i++) {
        /* another layer's scale: the same signature (16-byte aligned: others are copied to aligned
         * slots on the GPU's stream first, which needs a GPU) */
        f.b_inv = g_bias + 4 + 4 * i;
        CHECK(accel__cuda_fp8_gemm(DEV, &f) == ACCEL_ERR_UNSUPPORTED && says("no cuBLASLt fp8 algorithm"));
    }
    CHECK(n_heuristic - asked == 5 && accel__cuda_gemm_plans() - plans == 3);
    /* a bf16 C: signatures of their own beside the f32 C's of the same
     * shapes; its biased one (the bias rounded into step memory for the
     * epilogue, the fakes' host memory) falls back as the f32 one does */
    heuristic_answer = CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 2; i++) {
        accel_status st = linear_of(ACCEL_BF16, 1, 4, 8, true);
        CHECK_MSG(st == ACCEL_OK || !says("heuristic"), "%s", accel_last_error());
    }
    CHECK(n_heuristic - asked == 6 && accel__cuda_gemm_plans() - plans == 4);
    heuristic_answer = CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < 2; i++) {
        CHECK(linear_of(ACCEL_BF16, 2, 4, 16, false) == ACCEL_ERR_UNSUPPORTED);
        CHECK_MSG(says("no cuBLASLt algorithm for M=2 N=4 K=16 bfloat16 -> bfloat16"), "%s", accel_last_error());
    }
    CHECK(n_heuristic - asked == 7 && accel__cuda_gemm_plans() - plans == 5);
    /* cuBLASLt has no f32 x f32 -> bf16: refused before any plan */
    accel_tensor a = tensor(g_a, ACCEL_F32, 2, 8), b = tensor(g_b, ACCEL_F32, 4, 8), c = tensor(g_c, ACCEL_BF16, 2, 4);
    accel_k_gemm g = {.c = &c, .a = &a, .b = &b, .trans_b = true, .M = 2, .N = 4, .K = 8, .lda = 8, .ldb = 8,
                      .ldc = 4, .alpha = 1.0f};
    CHECK(accel__cudak_gemm(&g) == ACCEL_ERR_DTYPE && says("float32 x float32 -> bfloat16"));
    CHECK(n_heuristic - asked == 7 && accel__cuda_gemm_plans() - plans == 5);
    use_real();
}

int main(void) {
    RUN(test_fault_is_not_out_of_memory);
    RUN(test_out_of_memory_releases_the_cache_and_retries);
    RUN(test_release_cached);
    RUN(test_event_poll_clears_only_not_ready);
#ifdef ACCEL_HAVE_NCCL
    RUN(test_nccl_staging_is_pinned);
#endif
    /* its bias-first kernel would run on host pointers on a GPU */
    if (accel_device_count(ACCEL_DEV_CUDA) == 0) RUN(test_no_heuristic_is_a_cached_plan);
    else printf("skipped test_no_heuristic_is_a_cached_plan: a GPU is present (cuda_kernels runs the real GEMMs)\n");
    accel_thread_cleanup();
    return check_summary();
}
#endif
