/* The host staging buffers (src/core/host_stage.h) on the hostless test
 * device, whose host_alloc/host_free are counted (src/backends/hostless):
 *   - loading a model much bigger than one chunk onto hostless:0 (same dtype
 *     and cast to bf16) stages at most one chunk of host memory, allocated
 *     once, and gives the cpu load's values bit for bit;
 *   - disk-offloaded weights cast to bf16, brought onto hostless:0 for each
 *     forward, go in through the chunk (no converted host copy of a tensor),
 *     with no host allocation after the first forward, logits equal to the cpu;
 *   - staged collectives (broadcast, all_reduce, all_gather) and saves from
 *     the device reuse the pool: nothing tensor-sized is allocated after the
 *     first step;
 *   - an offloaded optimizer of device parameters keeps its host blocks in
 *     pinned memory allocated once;
 *   - pinned memory failing (as cudaMallocHost can) falls back to plain
 *     memory with the same results;
 *   - the pool under more leases than slots and from several threads;
 *   - the double-buffered path of a backend with asynchronous copies (a test
 *     backend whose copies run only when their event is waited for);
 *   - copies between two backends' devices go through the pool a chunk
 *     at a time (no tensor-sized host buffer per call);
 *   - the pool keeps at most its cap (ACCEL_STAGE_CACHE_MB) cached: a lease
 *     over it is freed when given back, alike leases under it stay;
 *   - staging that cannot get memory fails naming the user's call. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/dist.h"
#include "accelerator/accelerator_internal.h" /* the staged collectives */
#include "backends/registry.h"
#include "backends/hostless/hostless.h"
#include "core/host_stage.h"
#include "optim/optim_internal.h" /* accel__optimizer_set_offload */
#include "check.h"
#include "dispatch_fixture.h"

static const accel_device H0 = {ACCEL_DEV_HOSTLESS, 0};
static char g_dir[64];
static char g_model[96];
enum { CHUNK = 4096 };

static accel__hostless_host_counts counts(void) {
    accel__hostless_host_counts c;
    accel__hostless_host_stats(&c);
    return c;
}

/* Host staging bytes at the peak since the last reset, beyond what was live then. */
static int64_t g_live_at_reset;
static void peak_reset(void) {
    accel__hostless_host_peak_reset();
    g_live_at_reset = counts().live_bytes;
}
static int64_t peak_staged(void) { return counts().peak_bytes - g_live_at_reset; }

/* ---- a Llama checkpoint of ~0.5 MB: every matrix many chunks long */

static void save_model(void) {
    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = 256;
    cfg.hidden_size = 64;
    cfg.intermediate_size = 128;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = 32;
    snprintf(g_model, sizeof g_model, "%s/llama", g_dir);
    save_llama(&cfg, 3, g_model);
}

/* The model loaded with map entries (prefix, device) pairs; none: all on the cpu. */
static loaded load(const char *const *map_kv, int n_kv, const accel_load_opts *extra) {
    accel_device_map *map = n_kv ? accel_device_map_new() : NULL;
    for (int i = 0; i < n_kv; i++) accel_device_map_set(map, map_kv[2 * i], map_kv[2 * i + 1]);
    return load_llama(g_model, map, extra);
}

/* Every tensor of a equals the same tensor of b. */
static bool same_weights(accel_module *a, accel_module *b) {
    accel_state_dict *sa = accel_module_state_dict(a);
    bool ok = sa != NULL;
    for (int i = 0; ok && i < sa->n; i++) {
        accel_tensor *t = accel_module_get_tensor(b, sa->entries[i].name);
        ok = t && t->dtype == sa->entries[i].t->dtype && max_diff(sa->entries[i].t, t) == 0;
        if (!ok) fprintf(stderr, "  %s differs\n", sa->entries[i].name);
    }
    accel_state_dict_free(sa);
    accel_step_reset();
    return ok;
}

static const int64_t IDS[6] = {5, 17, 255, 3, 0, 40};

static accel_tensor *logits_of(loaded *l) { return llama_logits(l, IDS, 6); }

static const char *const ALL_ON_H0[] = {"", "hostless:0"};

/* Each load of the whole model onto hostless:0 stages one chunk of host
 * memory at most, allocated once (a fresh pool) and reused for every tensor. */
static void check_load(const accel_load_opts *o) {
    loaded cpu = load(NULL, 0, o);
    accel__stage_trim();
    accel__hostless_host_counts before = counts();
    peak_reset();
    loaded dev = load(ALL_ON_H0, 1, o);
    accel__hostless_host_counts after = counts();
    CHECK_MSG(after.allocs - before.allocs == 1, "%lld host_allocs during the load",
              (long long)(after.allocs - before.allocs));
    CHECK_MSG(peak_staged() > 0 && peak_staged() <= CHUNK, "peak host staging %lld bytes, chunk %d",
              (long long)peak_staged(), CHUNK);
    accel_tensor *w = dev.m ? accel_module_get_tensor(dev.m, "model.embed_tokens.weight") : NULL;
    CHECK(w && accel_device_eq(w->device, H0) && (int64_t)accel_nbytes(w) >= 8 * CHUNK);
    CHECK(cpu.m && dev.m && same_weights(cpu.m, dev.m));
    /* a second load: the same lease, nothing allocated */
    loaded again = load(ALL_ON_H0, 1, o);
    CHECK(counts().allocs == after.allocs);
    unload(&again);
    unload(&dev);
    unload(&cpu);
}

static void test_load_stages_one_chunk(void) { check_load(NULL); }

static void test_load_cast_stages_one_chunk(void) {
    check_load(&(accel_load_opts){.has_dtype = true, .dtype = ACCEL_BF16});
}

/* Layer 1 and the head on disk, cast to bf16, executing on hostless:0: each
 * forward brings them in through the chunk, no converted host copy. */
static void test_offload_brings_in_through_chunk(void) {
    accel_load_opts bf = {.has_dtype = true, .dtype = ACCEL_BF16};
    loaded cpu = load(NULL, 0, &bf);
    accel_tensor *want = logits_of(&cpu);
    unload(&cpu);
    bf.main_device = "hostless:0";
    const char *const map[] = {"model.embed_tokens", "hostless:0", "model.layers.0", "hostless:0",
                               "model.layers.1", "disk", "model.norm", "hostless:0", "lm_head", "disk"};
    loaded l = load(map, 5, &bf);
    int64_t allocs = 0;
    for (int step = 0; step < 3 && l.d; step++) {
        peak_reset();
        accel_tensor *y = logits_of(&l);
        CHECK(y && want && max_diff(y, want) == 0);
        accel_tensor_free(y);
        CHECK_MSG(peak_staged() <= CHUNK, "step %d: peak host staging %lld bytes", step, (long long)peak_staged());
        if (step == 0) allocs = counts().allocs;
        else CHECK_MSG(counts().allocs == allocs, "step %d allocated pinned memory", step);
    }
    accel_dispatch_stats s;
    if (l.d) {
        accel_dispatched_stats(l.d, &s);
        CHECK(s.n_offloaded_disk > 0 && s.peak_onload_bytes >= 8 * CHUNK);
        CHECK_MSG(s.scratch_bytes == 0, "%lld bytes of converted host copies", (long long)s.scratch_bytes);
    }
    accel_tensor_free(want);
    unload(&l);
}

/* ---- the pool in steady state: a counting allocator sees every host allocation */

static int64_t g_big_allocs; /* allocations of at least g_big bytes */
static size_t g_big = SIZE_MAX;

static void *counting_alloc(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    if (bytes >= g_big) __atomic_add_fetch(&g_big_allocs, 1, __ATOMIC_RELAXED);
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) ? NULL : p;
}

static void counting_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

static const accel_allocator COUNTING = {counting_alloc, counting_free, NULL};

static void test_collectives_reuse_the_pool(void) {
    CHECK_MSG(accel_dist_init() == ACCEL_OK, "%s", accel_last_error());
    accel_pg *pg = accel_dist_default_group();
    const int64_t n = 16 * CHUNK / 4;
    accel_tensor *t = accel_tensor_clone_persistent(accel_arange(ACCEL_F32, 0, n), H0);
    accel_tensor *all = accel_tensor_new(ACCEL_F32, 1, &n, H0);
    accel_tensor *want = accel_tensor_clone_persistent(accel_arange(ACCEL_F32, 0, n), ACCEL_CPU_DEVICE);
    accel_step_reset();
    g_big = accel_nbytes(t);
    accel_set_allocator(&COUNTING);
    int64_t allocs = 0, big = 0;
    for (int step = 0; step < 3 && pg; step++) {
        CHECK(accel__staged_broadcast(pg, t, 0) == ACCEL_OK);
        CHECK(accel__staged_all_reduce(pg, t, ACCEL_REDUCE_SUM) == ACCEL_OK);
        CHECK(accel__staged_all_gather(pg, t, all) == ACCEL_OK);
        if (step == 0) {
            allocs = counts().allocs;
            big = g_big_allocs;
        }
    }
    accel_set_allocator(NULL);
    CHECK_MSG(g_big_allocs == big, "%lld tensor-sized host allocations after the first step",
              (long long)(g_big_allocs - big));
    CHECK(counts().allocs == allocs);
    CHECK(max_diff(t, want) == 0 && max_diff(all, want) == 0);
    accel_tensor_free(t);
    accel_tensor_free(all);
    accel_tensor_free(want);
    accel_dist_finalize();
}

/* A save of a device tensor of many chunks: through the pool, the file right. */
static void test_save_from_device_reuses_the_pool(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/w.safetensors", g_dir);
    const int64_t n = 10 * CHUNK / 4 + 3;
    accel_tensor *h = accel_tensor_clone_persistent(accel_arange(ACCEL_F32, 0, n), H0);
    const char *name = "w";
    CHECK(accel_safetensors_save(path, 1, &name, &h, 0, NULL) == ACCEL_OK);
    int64_t allocs = counts().allocs, big = g_big_allocs;
    peak_reset();
    g_big = accel_nbytes(h) / 2; /* a staging copy of the tensor, or half of it */
    accel_set_allocator(&COUNTING);
    CHECK(accel_safetensors_save(path, 1, &name, &h, 0, NULL) == ACCEL_OK);
    accel_set_allocator(NULL);
    CHECK_MSG(g_big_allocs == big, "%lld host allocations of half the tensor or more", (long long)(g_big_allocs - big));
    CHECK(counts().allocs == allocs && peak_staged() <= CHUNK);
    accel_safetensors *st = accel_safetensors_open(path);
    accel_tensor *back = st ? accel_safetensors_tensor(st, "w", -1) : NULL;
    CHECK(back && max_diff(back, h) == 0);
    accel_tensor_free(back);
    accel_safetensors_close(st);
    accel_tensor_free(h);
    accel_step_reset();
}

/* ZeRO-Offload's host blocks for parameters on hostless:0: pinned, allocated
 * once, and the step equals the same step on the cpu. */
static void test_optimizer_offload_blocks_pinned(void) {
    const int64_t n = 3000;
    accel_tensor *p[2], *g[2];
    accel_device devs[2] = {ACCEL_CPU_DEVICE, H0};
    accel_optimizer *opt[2];
    int64_t live = counts().live_bytes, allocs = 0;
    for (int k = 0; k < 2; k++) {
        p[k] = accel_tensor_clone_persistent(accel_mul_scalar(accel_arange(ACCEL_F32, 0, n), 0.25), devs[k]);
        g[k] = accel_tensor_clone_persistent(accel_mul_scalar(accel_arange(ACCEL_F32, 0, n), 1e-3), devs[k]);
        accel_step_reset();
        p[k]->requires_grad = true;
        p[k]->grad = g[k]; /* freed with p */
        accel_optim_hparams hp = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-2);
        opt[k] = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &p[k], &hp);
        accel__offload_opts oo = {.home = ACCEL__HOME_HOST, .block_bytes = 1024, .n_blocks = 4};
        CHECK_MSG(opt[k] && accel__optimizer_set_offload(opt[k], &oo) == ACCEL_OK, "%s", accel_last_error());
        if (k == 1) {
            CHECK_MSG(counts().live_bytes - live >= 4 * 1024, "%lld pinned bytes for the blocks",
                      (long long)(counts().live_bytes - live));
            allocs = counts().allocs;
        }
    }
    for (int step = 0; step < 3; step++)
        for (int k = 0; k < 2; k++) CHECK(opt[k] && accel_optimizer_step(opt[k]) == ACCEL_OK);
    CHECK(counts().allocs == allocs);
    CHECK(max_diff(p[0], p[1]) == 0);
    for (int k = 0; k < 2; k++) {
        accel_optimizer_free(opt[k]);
        accel_tensor_free(p[k]);
    }
    CHECK(counts().live_bytes == live);
}

/* host_alloc failing (pinned memory exhausted): staging falls back to plain
 * memory, the load succeeds with the same values, no error is left. */
static void test_pinned_failure_falls_back(void) {
    loaded cpu = load(NULL, 0, NULL);
    accel__stage_trim();
    int64_t allocs = counts().allocs;
    accel__hostless_host_fail_next(1000);
    loaded dev = load(ALL_ON_H0, 1, NULL);
    accel__hostless_host_fail_next(0);
    CHECK(counts().allocs == allocs); /* nothing pinned */
    CHECK(dev.m && cpu.m && same_weights(cpu.m, dev.m));
    CHECK(accel_last_status() == ACCEL_OK);
    unload(&dev);
    unload(&cpu);
    accel__stage_trim();
}

/* More leases at once than the pool has slots: each distinct, each usable,
 * all given back; then as many leases as slots allocate nothing new. */
static void test_pool_overflow(void) {
    enum { N = ACCEL__STAGE_SLOTS + 3 };
    accel__stage_trim();
    unsigned char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = accel__stage_acquire(H0, 100, "test");
        CHECK(p[i] != NULL);
        if (p[i]) memset(p[i], i, 100);
        for (int j = 0; j < i; j++) CHECK(p[j] != p[i]);
    }
    for (int i = 0; i < N; i++) CHECK(p[i] && p[i][99] == (unsigned char)i);
    for (int i = 0; i < N; i++) accel__stage_release(H0, p[i]);
    int64_t allocs = counts().allocs;
    for (int i = 0; i < ACCEL__STAGE_SLOTS; i++) p[i] = accel__stage_acquire(H0, 100, "test");
    CHECK(counts().allocs == allocs);
    for (int i = 0; i < ACCEL__STAGE_SLOTS; i++) accel__stage_release(H0, p[i]);
    /* a device without a backend is an error naming it */
    CHECK(accel__stage_acquire(ACCEL_META_DEVICE, 8, "test_op") == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "test_op");
    accel_clear_error();
}

/* Threads loading into their own device tensors at once through one pool. */
static void *thread_load(void *arg) {
    accel_tensor *t = arg;
    const int64_t n = accel_numel(t);
    accel_tensor *src = accel_mul_scalar(accel_arange(ACCEL_F32, 0, n), 0.5);
    for (int r = 0; r < 20; r++)
        if (!src || accel__stage_to_device(H0, accel__device_ptr(t), accel__host_ptr(src, "t"), ACCEL_F32,
                                           ACCEL_BF16, (size_t)n, "test") != ACCEL_OK)
            return (void *)1;
    accel_thread_cleanup();
    return NULL;
}

static void test_threads_share_the_pool(void) {
    enum { T = 4 };
    const int64_t n = 5 * CHUNK / 2 + 1;
    accel_tensor *t[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) t[i] = accel_tensor_new(ACCEL_BF16, 1, &n, H0);
    for (int i = 0; i < T; i++) CHECK(pthread_create(&th[i], NULL, thread_load, t[i]) == 0);
    for (int i = 0; i < T; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
    accel_tensor *want = accel_to_dtype(accel_mul_scalar(accel_arange(ACCEL_F32, 0, n), 0.5), ACCEL_BF16);
    for (int i = 0; i < T; i++) CHECK(max_diff(t[i], want) == 0);
    for (int i = 0; i < T; i++) accel_tensor_free(t[i]);
    accel_step_reset();
}

/* ---- the double-buffered path of a device with asynchronous copies: a test
 * backend on the npu type whose asynchronous copies happen only when an
 * event after them is waited for, so a staging buffer refilled before its
 * copy's event was waited for would send the refilled bytes. */

typedef struct pending_copy {
    void *dst;
    const void *src;
    size_t n;
} pending_copy;

static pending_copy g_queue[256];
static int g_queued, g_done, g_most_in_flight;
static int64_t g_npu_live, g_npu_peak;

static void run_until(int upto) {
    for (; g_done < upto; g_done++) memcpy(g_queue[g_done].dst, g_queue[g_done].src, g_queue[g_done].n);
}

static int npu_count(void) { return 1; }
static void *npu_alloc(int index, size_t bytes, size_t align) {
    (void)index;
    return accel_malloc_aligned(bytes, align);
}
static void npu_free(int index, void *p) {
    (void)index;
    accel_free(p);
}
static void npu_step_reset(int index) { (void)index; }
static accel_status npu_memset(int index, void *p, int byte, size_t n) {
    (void)index;
    run_until(g_queued);
    memset(p, byte, n);
    return ACCEL_OK;
}
static accel_status npu_copy(int index, void *dst, const void *src, size_t n) {
    (void)index;
    run_until(g_queued); /* a synchronous copy waits for the stream */
    memcpy(dst, src, n);
    return ACCEL_OK;
}
static accel_status npu_copy_device(int di, void *dst, int si, const void *src, size_t n) {
    (void)si;
    return npu_copy(di, dst, src, n);
}
static accel_status npu_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    (void)index;
    *free_bytes = *total_bytes = (size_t)1 << 30;
    return ACCEL_OK;
}
static void *npu_host_alloc(size_t bytes) {
    size_t *p = malloc(sizeof(max_align_t) + bytes);
    if (!p) return NULL;
    *p = bytes;
    g_npu_live += (int64_t)bytes;
    if (g_npu_live > g_npu_peak) g_npu_peak = g_npu_live;
    return (char *)p + sizeof(max_align_t);
}
static void npu_host_free(void *q) {
    if (!q) return;
    size_t *p = (size_t *)((char *)q - sizeof(max_align_t));
    g_npu_live -= (int64_t)*p;
    free(p);
}
static accel_stream *npu_stream_new(int index) {
    (void)index;
    return (accel_stream *)&g_queue; /* the one stream */
}
static void npu_stream_free(int index, accel_stream *s) { (void)index, (void)s; }
static void npu_set_stream(int index, accel_stream *s) { (void)index, (void)s; }
static accel_status npu_copy_async(int index, void *dst, const void *src, size_t n, accel_stream *s) {
    (void)index, (void)s;
    if (g_queued == (int)(sizeof g_queue / sizeof g_queue[0]))
        return accel_set_error(ACCEL_ERR_OOM, "npu test backend: copy queue full");
    g_queue[g_queued++] = (pending_copy){dst, src, n};
    if (g_queued - g_done > g_most_in_flight) g_most_in_flight = g_queued - g_done;
    return ACCEL_OK;
}
/* An event is the queue position it was recorded at (plus one: never NULL). */
static accel_event *npu_event_record(int index, accel_stream *s) {
    (void)index, (void)s;
    return (accel_event *)(uintptr_t)(g_queued + 1);
}
static accel_status npu_event_wait(int index, accel_stream *s, accel_event *e) {
    (void)index, (void)s, (void)e;
    return ACCEL_OK;
}
static accel_status npu_event_synchronize(int index, accel_event *e) {
    (void)index;
    run_until((int)((uintptr_t)e - 1));
    return ACCEL_OK;
}
static void npu_event_free(int index, accel_event *e) { (void)index, (void)e; }
static accel_status npu_synchronize(int index) {
    (void)index;
    run_until(g_queued);
    return ACCEL_OK;
}

static const accel_backend NPU_TEST = {
    .name = "npu",
    .type = ACCEL_DEV_NPU,
    .device_count = npu_count,
    .host_addressable = false,
    .mem = {.alloc = npu_alloc, .free = npu_free, .step_alloc = npu_alloc, .step_reset = npu_step_reset,
            .memset = npu_memset, .copy_to_device = npu_copy, .copy_to_host = npu_copy,
            .copy_device = npu_copy_device, .mem_info = npu_mem_info, .host_alloc = npu_host_alloc,
            .host_free = npu_host_free},
    .async = {.stream_new = npu_stream_new, .stream_free = npu_stream_free, .set_stream = npu_set_stream,
              .copy_to_device_async = npu_copy_async, .copy_to_host_async = npu_copy_async,
              .event_record = npu_event_record, .event_wait = npu_event_wait,
              .event_synchronize = npu_event_synchronize, .event_free = npu_event_free,
              .synchronize = npu_synchronize},
};

/* f32 from an unaligned host source into a bf16 device buffer of 5.5
 * chunks: two pinned chunks in flight at once, every copy done on return,
 * the bytes those of the conversion on the host. */
static void test_double_buffered_async_copy(void) {
    CHECK(accel__backend_register(&NPU_TEST) == ACCEL_OK);
    const accel_device npu = {ACCEL_DEV_NPU, 0};
    const size_t n = 11 * CHUNK / 4 + 5; /* bf16 elements: 5.5 chunks and a bit */
    unsigned char *raw = malloc(n * 4 + 1);
    float *src = malloc(n * 4);
    uint16_t *want = malloc(n * 2), *dst = npu_alloc(0, n * 2, 64);
    for (size_t i = 0; i < n; i++) src[i] = (float)i * 0.37f - 100.0f;
    memcpy(raw + 1, src, n * 4);
    accel_convert(want, ACCEL_BF16, src, ACCEL_F32, n);
    CHECK(accel__stage_to_device(npu, dst, raw + 1, ACCEL_F32, ACCEL_BF16, n, "test") == ACCEL_OK);
    CHECK(g_done == g_queued && g_queued >= 6);
    CHECK_MSG(g_most_in_flight == 2, "%d copies in flight at most", g_most_in_flight);
    CHECK_MSG(g_npu_peak == 2 * CHUNK, "%lld pinned bytes", (long long)g_npu_peak);
    CHECK(memcmp(dst, want, n * 2) == 0);
    npu_free(0, dst);
    free(raw);
    free(src);
    free(want);
}

/* A copy between two backends' devices (hostless:0 and the npu test
 * backend, registered above) goes through the pool a chunk at a time: no
 * tensor-sized host allocation, nothing allocated after the first step,
 * the bytes right both ways. */
static void test_cross_backend_copy_through_pool(void) {
    const accel_device npu = {ACCEL_DEV_NPU, 0};
    const int64_t n = 8 * CHUNK / 4 + 7;
    accel_tensor *want = accel_tensor_clone_persistent(accel_arange(ACCEL_F32, 0, n), ACCEL_CPU_DEVICE);
    accel_tensor *h = accel_tensor_clone_persistent(want, H0), *d = accel_tensor_new(ACCEL_F32, 1, &n, npu);
    accel_tensor *back = accel_tensor_new(ACCEL_F32, 1, &n, H0);
    accel_step_reset();
    CHECK(h && d && back);
    g_big = 2 * CHUNK;
    int64_t big = g_big_allocs, allocs = 0;
    accel_set_allocator(&COUNTING);
    for (int step = 0; step < 3 && h && d && back; step++) {
        CHECK_MSG(accel_copy_(d, h) == ACCEL_OK && accel_copy_(back, d) == ACCEL_OK, "%s", accel_last_error());
        if (step == 0) allocs = counts().allocs;
    }
    accel_set_allocator(NULL);
    CHECK_MSG(g_big_allocs == big, "%lld host allocations of 2 chunks or more", (long long)(g_big_allocs - big));
    CHECK_MSG(counts().allocs == allocs, "%lld pinned allocations after the first step",
              (long long)(counts().allocs - allocs));
    CHECK(back && max_diff(back, want) == 0);
    accel_tensor_free(h);
    accel_tensor_free(d);
    accel_tensor_free(back);
    accel_tensor_free(want);
    accel_step_reset();
}

/* ---- the pool's bound, and errors that name the caller's op */

/* A lease much bigger than the pool may keep (the cap at 4 chunks, as
 * ACCEL_STAGE_CACHE_MB sets it) is freed when given back: an all-gather of a
 * GB does not pin a GB until exit. Leases under the cap stay cached: a loop
 * of them allocates once. */
static void test_pool_bounded(void) {
    accel__stage_trim();
    accel__stage_set_cache_bytes(4 * CHUNK);
    int64_t live = counts().live_bytes;
    void *big = accel__stage_acquire(H0, 64 * CHUNK, "test");
    CHECK(big != NULL && counts().live_bytes - live >= 64 * CHUNK);
    accel__stage_release(H0, big);
    CHECK_MSG(counts().live_bytes == live, "%lld bytes pinned after a lease over the cap was given back",
              (long long)(counts().live_bytes - live));
    int64_t allocs = counts().allocs;
    for (int i = 0; i < 10; i++) {
        void *p = accel__stage_acquire(H0, CHUNK, "test"), *q = accel__stage_acquire(H0, 2 * CHUNK, "test");
        CHECK(p && q);
        accel__stage_release(H0, q);
        accel__stage_release(H0, p);
    }
    CHECK_MSG(counts().allocs - allocs == 2, "%lld host allocations for 10 alike steps of 2 leases",
              (long long)(counts().allocs - allocs));
    CHECK(counts().live_bytes - live == 3 * CHUNK);
    /* the cap counts the idle slots: a third lease beyond it is not kept */
    void *p = accel__stage_acquire(H0, CHUNK, "test"), *q = accel__stage_acquire(H0, 2 * CHUNK, "test"),
         *r = accel__stage_acquire(H0, 2 * CHUNK, "test");
    CHECK(p && q && r);
    accel__stage_release(H0, r);
    accel__stage_release(H0, q);
    accel__stage_release(H0, p);
    CHECK(counts().live_bytes - live <= 4 * CHUNK);
    /* the variable, in MiB: 0 MiB keeps nothing */
    setenv("ACCEL_STAGE_CACHE_MB", "0", 1);
    accel__stage_set_cache_bytes(0); /* back to the environment's */
    p = accel__stage_acquire(H0, CHUNK, "test");
    accel__stage_release(H0, p);
    CHECK(counts().live_bytes - live <= 4 * CHUNK);
    accel__stage_trim();
    p = accel__stage_acquire(H0, CHUNK, "test");
    accel__stage_release(H0, p);
    CHECK_MSG(counts().live_bytes == live, "ACCEL_STAGE_CACHE_MB=0 kept %lld bytes",
              (long long)(counts().live_bytes - live));
    unsetenv("ACCEL_STAGE_CACHE_MB");
    accel__stage_set_cache_bytes(0);
    accel__stage_trim();
}

/* Host allocations over `steps` steps of step(), after a first one. */
static int64_t allocs_after_first_step(void (*step)(void), int steps) {
    step();
    int64_t allocs = counts().allocs;
    for (int i = 0; i < steps; i++) step();
    return counts().allocs - allocs;
}

static void *g_held; /* a big lease held across steps */

/* Two chunk leases taken and given back while g_held stays leased. */
static void chunk_step(void) {
    void *p = accel__stage_acquire(H0, CHUNK, "test"), *q = accel__stage_acquire(H0, 2 * CHUNK, "test");
    CHECK(p && q && p != g_held && q != g_held);
    accel__stage_release(H0, q);
    accel__stage_release(H0, p);
}

/* A big lease (a staged all-gather's receive buffer) held with the pool over
 * its cap: the chunk leases that come and go meanwhile stay cached (the cap
 * counts idle bytes, not leased ones), so alike steps allocate nothing. */
static void test_big_lease_held_keeps_chunks_cached(void) {
    accel__stage_trim();
    accel__stage_set_cache_bytes(4 * CHUNK);
    g_held = accel__stage_acquire(H0, 64 * CHUNK, "test");
    CHECK(g_held != NULL);
    int64_t allocs = allocs_after_first_step(chunk_step, 8);
    CHECK_MSG(allocs == 0, "%lld host allocations in 8 alike steps with a big lease held", (long long)allocs);
    accel__stage_release(H0, g_held);
    accel__stage_set_cache_bytes(0);
    accel__stage_trim();
}

/* A big lease given back, then a chunk lease held while the big one is
 * leased again (a send buffer and a receive buffer of one step). */
static void big_then_chunk_step(void) {
    void *big = accel__stage_acquire(H0, 64 * CHUNK, "test");
    accel__stage_release(H0, big);
    void *c = accel__stage_acquire(H0, CHUNK, "test");
    big = accel__stage_acquire(H0, 64 * CHUNK, "test");
    CHECK(c && big);
    accel__stage_release(H0, c);
    accel__stage_release(H0, big);
}

/* The chunk lease does not take the idle big slot (best fit would, when no
 * chunk-sized slot is cached yet): it gets a slot of its own size, and the
 * big lease its cached one, so the pool (cap 100 chunks: room for one big
 * slot, not two) allocates nothing after the first step. */
static void test_small_lease_leaves_big_slot(void) {
    accel__stage_trim();
    accel__stage_set_cache_bytes(100 * CHUNK);
    int64_t live = counts().live_bytes;
    int64_t allocs = allocs_after_first_step(big_then_chunk_step, 8);
    CHECK_MSG(allocs == 0, "%lld host allocations in 8 alike steps of a big and a chunk lease", (long long)allocs);
    CHECK(counts().live_bytes - live == 65 * CHUNK);
    accel__stage_set_cache_bytes(0);
    accel__stage_trim();
}

/* Every host allocation of at least CHUNK bytes fails (with pinned memory
 * failing too): the staging lease cannot be had. */
static void *failing_alloc(void *ctx, size_t bytes, size_t align) {
    return bytes >= CHUNK ? NULL : counting_alloc(ctx, bytes, align);
}
static const accel_allocator FAILING = {failing_alloc, counting_free, NULL};

/* A staged save and load that cannot get their staging memory fail naming
 * the call the user made, not the library's internal staging functions. */
static void test_errors_name_the_op(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/e.safetensors", g_dir);
    const int64_t n = 4 * CHUNK / 4;
    accel_tensor *h = accel_tensor_clone_persistent(accel_arange(ACCEL_F32, 0, n), H0);
    accel_step_reset();
    const char *name = "w";
    CHECK(accel_safetensors_save(path, 1, &name, &h, 0, NULL) == ACCEL_OK);
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK(st != NULL);
    accel__stage_trim();
    accel__hostless_host_fail_next(1000);
    accel_set_allocator(&FAILING);
    accel_status saved = accel_safetensors_save(path, 1, &name, &h, 0, NULL);
    char save_err[512];
    snprintf(save_err, sizeof save_err, "%s", accel_last_error());
    accel_clear_error();
    accel_status loaded = st ? accel_safetensors_load_into(st, "w", h) : ACCEL_OK;
    char load_err[512];
    snprintf(load_err, sizeof load_err, "%s", accel_last_error());
    accel_set_allocator(NULL);
    accel__hostless_host_fail_next(0);
    accel_clear_error();
    CHECK(saved != ACCEL_OK && loaded != ACCEL_OK);
    CHECK_STR_CONTAINS(save_err, "accel_safetensors_save");
    CHECK_STR_CONTAINS(load_err, "accel_safetensors_load_into");
    CHECK_MSG(!strstr(save_err, "accel__") && !strstr(load_err, "accel__"), "internal names: \"%s\", \"%s\"",
              save_err, load_err);
    accel_safetensors_close(st);
    accel_tensor_free(h);
}

int main(void) {
    if (accel_device_count(ACCEL_DEV_HOSTLESS) < 1) CHECK(accel__hostless_register(2) == ACCEL_OK);
    accel__stage_set_chunk_bytes(CHUNK);
    CHECK(accel__stage_chunk_bytes() == CHUNK);
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_pinned_XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    save_model();
    RUN(test_load_stages_one_chunk);
    RUN(test_load_cast_stages_one_chunk);
    RUN(test_offload_brings_in_through_chunk);
    RUN(test_collectives_reuse_the_pool);
    RUN(test_save_from_device_reuses_the_pool);
    RUN(test_optimizer_offload_blocks_pinned);
    RUN(test_pinned_failure_falls_back);
    RUN(test_pool_overflow);
    RUN(test_threads_share_the_pool);
    RUN(test_double_buffered_async_copy);
    RUN(test_cross_backend_copy_through_pool);
    RUN(test_pool_bounded);
    RUN(test_big_lease_held_keeps_chunks_cached);
    RUN(test_small_lease_leaves_big_slot);
    RUN(test_errors_name_the_op);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    accel_thread_cleanup();
    return check_summary();
}
