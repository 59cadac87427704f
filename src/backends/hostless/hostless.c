/* The hostless test backend: devices "hostless:0".."hostless:N-1" whose
 * memory the host cannot read, as a GPU's.
 *
 * Memory is host memory, but every device pointer it hands out is the host
 * address XOR a tag in bits 48..55 (0xA0 + device index): a non-canonical
 * address on x86-64 (and not a top-byte-ignored one on AArch64), so any
 * dereference above the backends faults exactly as a dereference of a CUDA
 * pointer would. Pointer arithmetic on tagged pointers (views) is fine: the
 * tag sits far above any offset.
 *
 * Memory counters (accel__hostless_memory_stats) count persistent
 * allocations and mapped virtual memory, as a GPU's allocator would see them.
 *
 * Pinned host memory (host_alloc/host_free) is plain host memory whose
 * allocations are counted (hostless.h), and can be made to fail, as
 * cudaMallocHost does when pinned memory runs out.
 *
 * Kernels are the CPU kernels. One wrapper per table entry, generated from
 * ACCEL_KERNELS, translates the kernel's tensors (the t[] array every
 * argument struct starts with) to host addresses on a private copy of their
 * headers, checks that each pointer belongs to this device, calls the CPU
 * kernel, and restores the caller's tensors.
 *
 * A plug-in, libaccel-hostless.so (backends/plugin.h), so that every run of
 * the tests goes through the loading path the accelerator backends take.
 * Its devices are registered by accel__hostless_register(n), or at start-up
 * with ACCEL_TEST_DEVICES=n in the environment (tests run whole binaries on
 * it with ACCEL_DEFAULT_DEVICE=hostless:0). Never for production use. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backends/registry.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/hostless/hostless.h"
#include "backends/vm_pool.h"
#include "core/env.h"
#include "backends/plugin.h"

enum { HOSTLESS_MAX = 8 };

static int g_count; /* devices registered; 0 until accel__hostless_register */

static uint64_t tag_of(int index) { return (uint64_t)(0xA0 + index) << 48; }

static void *to_device_ptr(int index, void *host) {
    return host ? (void *)((uintptr_t)host ^ tag_of(index)) : NULL;
}

/* The host address of device pointer p of device `index`; NULL when p is not
 * one of that device's (a pointer of another device, or a host address). */
static void *to_host_ptr(int index, const void *p) {
    uintptr_t u = (uintptr_t)p;
    if ((u & ((uint64_t)0xFF << 48)) != tag_of(index)) return NULL;
    return (void *)(u ^ tag_of(index));
}

static accel_status bad_pointer(int index, const char *what, const void *p) {
    return accel_set_error(ACCEL_ERR_DEVICE, "hostless:%d: %s %p is not a pointer of this device", index,
                           what, p);
}

static int hostless_count(void) { return g_count; }

/* ---- memory counters: persistent allocations and mapped virtual memory */

static _Atomic size_t g_in_use[HOSTLESS_MAX], g_peak[HOSTLESS_MAX];

static void count_up(int index, size_t n) {
    size_t now = atomic_fetch_add(&g_in_use[index], n) + n;
    size_t peak = atomic_load(&g_peak[index]);
    while (now > peak && !atomic_compare_exchange_weak(&g_peak[index], &peak, now)) {}
}

static void count_down(int index, size_t n) { atomic_fetch_sub(&g_in_use[index], n); }

static accel__hostless_memory hook_memory_stats(int index) {
    return (accel__hostless_memory){atomic_load(&g_in_use[index]), atomic_load(&g_peak[index])};
}

static void hook_reset_peak(int index) { atomic_store(&g_peak[index], atomic_load(&g_in_use[index])); }

/* ---- call counters (hostless.h: accel__hostless_calls) */

static _Atomic int64_t g_kernels[HOSTLESS_MAX], g_allocs[HOSTLESS_MAX], g_host_reads[HOSTLESS_MAX];

static void hook_call_counts(int index, accel__hostless_calls *out) {
    if (index < 0 || index >= HOSTLESS_MAX) {
        *out = (accel__hostless_calls){0};
        return;
    }
    *out = (accel__hostless_calls){atomic_load(&g_kernels[index]), atomic_load(&g_allocs[index]),
                                   atomic_load(&g_host_reads[index])};
}

/* A block's size, for the counters, in a header just below it: the block
 * starts `head` bytes (>= 16, a multiple of align) into its allocation. */
typedef struct block_head {
    size_t bytes, head;
} block_head;

static int g_alloc_fail_at; /* allocations until the one that fails (atomic; 0: none) */

static void hook_alloc_fail_at(int k) { __atomic_store_n(&g_alloc_fail_at, k, __ATOMIC_RELAXED); }

static void *hostless_alloc(int index, size_t bytes, size_t align) {
    if (__atomic_load_n(&g_alloc_fail_at, __ATOMIC_RELAXED) > 0 &&
        __atomic_sub_fetch(&g_alloc_fail_at, 1, __ATOMIC_RELAXED) == 0) {
        accel_set_error(ACCEL_ERR_OOM, "hostless:%d: allocation of %zu bytes: out of device memory (injected)", index,
                        bytes);
        return NULL;
    }
    size_t head = align < 16 ? 16 : align;
    char *base = accel_malloc_aligned(bytes + head, head);
    if (!base) return NULL;
    block_head *h = (block_head *)(base + head) - 1;
    *h = (block_head){bytes, head};
    count_up(index, bytes);
    atomic_fetch_add(&g_allocs[index], 1);
    return to_device_ptr(index, base + head);
}

static void hostless_free(int index, void *p) {
    if (!p) return;
    char *user = to_host_ptr(index, p);
    block_head *h = (block_head *)user - 1;
    count_down(index, h->bytes);
    accel_free(user - h->head);
}

/* ---- virtual memory (the rules and the pool: backends/vm_pool.h), as
 * strict as a GPU's. Ranges are reserved address space without access
 * (PROT_NONE). A handle is a count of bytes (the pages are the mapped
 * range's own): mapping makes the range readable and writable and fills it
 * with 0xFF bytes (NaN floats), since on a GPU a pooled handle holds what
 * it last held (code that counted on fresh zeros fails here); unmapping gives
 * the pages back and takes the access away, so a stray use faults as on a
 * GPU. Test hooks (hostless.h): the granule (ACCEL_TEST_VM_GRANULE, e.g.
 * CUDA's 2 MiB), a limit on the handles' bytes (a full device), an idle
 * cache that counts against it (a caching allocator's free blocks), fences
 * that stay pending until waited for (work in flight, as on a GPU), and
 * failing unmaps and fence records (a device's failures). */

enum { HOSTLESS_VM_GRANULE = 64 << 10 };

static int g_map_fail;    /* vm_maps still to refuse (atomic) */
static int g_unmap_fail;  /* unmaps of pages still to refuse (atomic) */
static int g_record_fail; /* fence records still to refuse (atomic) */
static int g_copy_fail;   /* copies between host and device still to refuse (atomic) */

/* Whether to refuse this call: takes one from *left (atomic) while it is above 0. */
static bool injected_failure(int *left_p) {
    int left = __atomic_load_n(left_p, __ATOMIC_RELAXED);
    while (left > 0 && !__atomic_compare_exchange_n(left_p, &left, left - 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return left > 0;
}

static size_t g_vm_granule = HOSTLESS_VM_GRANULE;
static pthread_once_t g_vm_granule_once = PTHREAD_ONCE_INIT;
static _Atomic size_t g_vm_limit, g_vm_handle_bytes; /* the limit (0: none), the handles' bytes */
static _Atomic size_t g_vm_idle;                      /* an allocator's idle cache, counted against the limit */
static _Atomic int64_t g_vm_idle_releases;
static atomic_bool g_vm_lag;

/* ACCEL_TEST_VM_GRANULE: a power of two from the page size to 1 GiB, in bytes. */
static void vm_granule_read(void) {
    long g;
    if (accel__env_long("ACCEL_TEST_VM_GRANULE", HOSTLESS_VM_GRANULE, sysconf(_SC_PAGESIZE), 1L << 30, &g) != ACCEL_OK ||
        (g & (g - 1))) {
        fprintf(stderr, "accel: ACCEL_TEST_VM_GRANULE=%s is not a power of two of bytes from the page size to 1 GiB; "
                        "the granule stays %d\n", getenv("ACCEL_TEST_VM_GRANULE"), HOSTLESS_VM_GRANULE);
        accel_clear_error();
        return;
    }
    g_vm_granule = (size_t)g;
}

static size_t hostless_vm_granularity(int index) {
    pthread_once(&g_vm_granule_once, vm_granule_read);
    return g_vm_granule;
}

/* mmap aligns to pages only: reserve a granule more and trim both ends. */
static void *vm_reserve_space(int index, size_t bytes) {
    size_t g = hostless_vm_granularity(index), span = bytes + g;
    char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        accel_set_error(ACCEL_ERR_OOM, "hostless:%d: cannot reserve %zu bytes of address space", index, bytes);
        return NULL;
    }
    char *lo = (char *)(((uintptr_t)p + g - 1) / g * g);
    if (lo > p) munmap(p, (size_t)(lo - p));
    if (lo + bytes < p + span) munmap(lo + bytes, (size_t)(p + span - (lo + bytes)));
    return to_device_ptr(index, lo);
}

static void vm_release_space(int index, void *p, size_t bytes) { munmap(to_host_ptr(index, p), bytes); }

static accel_status vm_create(int index, size_t bytes, uint64_t *handle) {
    size_t limit = atomic_load(&g_vm_limit), held = atomic_fetch_add(&g_vm_handle_bytes, bytes) + bytes;
    if (limit && held + atomic_load(&g_vm_idle) > limit) {
        atomic_fetch_sub(&g_vm_handle_bytes, bytes);
        return accel_set_error(ACCEL_ERR_OOM, "hostless:%d: out of device memory creating %zu bytes (%zu held, "
                               "limit %zu)", index, bytes, held - bytes, limit);
    }
    *handle = bytes;
    return ACCEL_OK;
}

static void vm_destroy(int index, uint64_t handle) { atomic_fetch_sub(&g_vm_handle_bytes, (size_t)handle); }

static accel_status vm_map_pages(int index, void *p, size_t bytes, uint64_t handle) {
    void *h = to_host_ptr(index, p);
    if (mprotect(h, bytes, PROT_READ | PROT_WRITE))
        return accel_set_error(ACCEL_ERR_OOM, "hostless:%d: cannot map %zu bytes at %p: %s", index, bytes, p,
                               strerror(errno));
    memset(h, 0xFF, bytes);
    return ACCEL_OK;
}

static accel_status vm_unmap_pages(int index, void *p, size_t bytes) {
    if (injected_failure(&g_unmap_fail))
        return accel_set_error(ACCEL_ERR_DEVICE, "hostless:%d: cannot unmap %zu bytes at %p (injected)", index, bytes,
                               p);
    void *h = to_host_ptr(index, p);
    madvise(h, bytes, MADV_DONTNEED);
    if (mprotect(h, bytes, PROT_NONE))
        return accel_set_error(ACCEL_ERR_DEVICE, "hostless:%d: cannot unmap %zu bytes at %p: %s", index, bytes, p,
                               strerror(errno));
    return ACCEL_OK;
}

/* A fence: the device ran the work when it was enqueued, so a fence is done
 * when recorded, unless the lag hook keeps it pending until waited for. */
typedef struct vm_fence {
    bool pending;
} vm_fence;

static void *vm_fence_new(int index) { return accel_calloc(1, sizeof(vm_fence)); }

static accel_status vm_fence_record(int index, void *f) {
    if (injected_failure(&g_record_fail))
        return accel_set_error(ACCEL_ERR_DEVICE, "hostless:%d: cannot record a fence (injected)", index);
    ((vm_fence *)f)->pending = atomic_load(&g_vm_lag);
    return ACCEL_OK;
}

/* Lag turned off: the device has caught up with every fence. */
static bool vm_fence_done(int index, void *f) { return !((vm_fence *)f)->pending || !atomic_load(&g_vm_lag); }

static accel_status vm_fence_wait(int index, void *f) {
    ((vm_fence *)f)->pending = false;
    return ACCEL_OK;
}

/* Later work runs when it is enqueued, after everything before it. */
static accel_status vm_fence_order(int index, void *f) { return ACCEL_OK; }

static void vm_fence_free(int index, void *f) { accel_free(f); }

/* The work ran when it was enqueued. */
static accel_status vm_drain(int index) { return ACCEL_OK; }

/* The idle cache of hostless_vm_set_idle_cache goes back to the device. */
static void vm_release_idle(int index) {
    atomic_store(&g_vm_idle, 0);
    atomic_fetch_add(&g_vm_idle_releases, 1);
}

/* Mapped memory is device memory in use (the memory counters). */
static void vm_mapped(int index, size_t bytes, bool more) {
    if (more) count_up(index, bytes);
    else count_down(index, bytes);
}

static const accel__vm_ops hostless_vm_ops = {
    .granularity = hostless_vm_granularity,
    .reserve = vm_reserve_space,
    .release = vm_release_space,
    .create = vm_create,
    .destroy = vm_destroy,
    .map = vm_map_pages,
    .unmap = vm_unmap_pages,
    .fence_new = vm_fence_new,
    .fence_record = vm_fence_record,
    .fence_done = vm_fence_done,
    .fence_wait = vm_fence_wait,
    .fence_order = vm_fence_order,
    .fence_free = vm_fence_free,
    .drain = vm_drain,
    .mapped = vm_mapped,
    .release_idle = vm_release_idle,
};

static void hook_vm_set_limit(size_t bytes) { atomic_store(&g_vm_limit, bytes); }

static void hook_vm_set_idle_cache(size_t bytes) { atomic_store(&g_vm_idle, bytes); }

static int64_t hook_vm_idle_releases(void) { return atomic_load(&g_vm_idle_releases); }

static void hook_vm_lag_fences(bool on) { atomic_store(&g_vm_lag, on); }

static void *hostless_vm_reserve(int index, size_t bytes) {
    return accel__vm_reserve(&hostless_vm_ops, ACCEL_DEV_HOSTLESS, index, bytes);
}

static void hostless_vm_release(int index, void *p, size_t bytes) {
    accel__vm_release(&hostless_vm_ops, ACCEL_DEV_HOSTLESS, index, p, bytes);
}

static accel_status hostless_vm_map(int index, void *p, size_t bytes) {
    if (injected_failure(&g_map_fail))
        return accel_set_error(ACCEL_ERR_OOM, "hostless:%d: cannot map %zu bytes at %p: out of device memory "
                               "(injected)", index, bytes, p);
    return accel__vm_map(&hostless_vm_ops, ACCEL_DEV_HOSTLESS, index, p, bytes);
}

static accel_status hostless_vm_unmap(int index, void *p, size_t bytes) {
    return accel__vm_unmap(&hostless_vm_ops, ACCEL_DEV_HOSTLESS, index, p, bytes);
}

/* Each thread's step pool of each device: an arena of its own, so that the
 * step memory of a device is not the cpu's. */
static _Thread_local accel_arena *tl_pool[HOSTLESS_MAX];

static void *hostless_step_alloc(int index, size_t bytes, size_t align) {
    if (!tl_pool[index] && !(tl_pool[index] = accel_arena_create(1u << 20))) return NULL;
    return to_device_ptr(index, accel_arena_alloc(tl_pool[index], bytes, align));
}

static void hostless_step_reset(int index) {
    if (tl_pool[index]) accel_arena_reset(tl_pool[index]);
    accel__vm_step(ACCEL_DEV_HOSTLESS, index);
}

static accel_status hostless_memset(int index, void *p, int byte, size_t n) {
    void *h = to_host_ptr(index, p);
    if (!h) return bad_pointer(index, "memset of", p);
    if (n) memset(h, byte, n);
    return ACCEL_OK;
}

static accel_status hostless_copy_to_device(int index, void *dst, const void *src, size_t n) {
    void *h = to_host_ptr(index, dst);
    if (!h) return bad_pointer(index, "copy to", dst);
    if (injected_failure(&g_copy_fail))
        return accel_set_error(ACCEL_ERR_DEVICE, "hostless:%d: a copy from the host failed (injected)", index);
    if (n) memcpy(h, src, n);
    return ACCEL_OK;
}

static accel_status hostless_copy_to_host(int index, void *dst, const void *src, size_t n) {
    const void *h = to_host_ptr(index, src);
    if (!h) return bad_pointer(index, "copy from", src);
    if (injected_failure(&g_copy_fail))
        return accel_set_error(ACCEL_ERR_DEVICE, "hostless:%d: a copy to the host failed (injected)", index);
    atomic_fetch_add(&g_host_reads[index], 1);
    if (n) memcpy(dst, h, n);
    return ACCEL_OK;
}

static accel_status hostless_copy_device(int dst_index, void *dst, int src_index, const void *src, size_t n) {
    void *d = to_host_ptr(dst_index, dst);
    const void *s = to_host_ptr(src_index, src);
    if (!d) return bad_pointer(dst_index, "copy to", dst);
    if (!s) return bad_pointer(src_index, "copy from", src);
    if (n && d != s) memmove(d, s, n);
    return ACCEL_OK;
}

static accel_status hostless_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    return accel__cpu_mem_info(free_bytes, total_bytes);
}

/* ---- pinned host memory: plain host memory, counted, so tests can see how
 * much staging a copy path uses and that it is reused (hostless.h) */

static int64_t g_host_allocs, g_host_frees, g_host_live, g_host_peak; /* atomics */
static int g_host_fail; /* host_allocs still to refuse (atomic) */

typedef struct host_block {
    size_t bytes;
    _Alignas(64) unsigned char data[];
} host_block;

static void note_host_peak(int64_t live) {
    int64_t peak = __atomic_load_n(&g_host_peak, __ATOMIC_RELAXED);
    while (live > peak && !__atomic_compare_exchange_n(&g_host_peak, &peak, live, true, __ATOMIC_RELAXED,
                                                       __ATOMIC_RELAXED)) {
    }
}

static void *hostless_host_alloc(size_t bytes) {
    if (injected_failure(&g_host_fail)) {
        accel_set_error(ACCEL_ERR_OOM, "hostless: host_alloc of %zu bytes: out of pinned memory (injected)", bytes);
        return NULL;
    }
    host_block *b = accel_malloc(sizeof *b + bytes);
    if (!b) return NULL;
    b->bytes = bytes;
    __atomic_add_fetch(&g_host_allocs, 1, __ATOMIC_RELAXED);
    note_host_peak(__atomic_add_fetch(&g_host_live, (int64_t)bytes, __ATOMIC_RELAXED));
    return b->data;
}

static void hostless_host_free(void *p) {
    if (!p) return;
    host_block *b = (host_block *)((unsigned char *)p - offsetof(host_block, data));
    __atomic_add_fetch(&g_host_frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&g_host_live, (int64_t)b->bytes, __ATOMIC_RELAXED);
    accel_free(b);
}

static void hook_host_stats(accel__hostless_host_counts *out) {
    out->allocs = __atomic_load_n(&g_host_allocs, __ATOMIC_RELAXED);
    out->frees = __atomic_load_n(&g_host_frees, __ATOMIC_RELAXED);
    out->live_bytes = __atomic_load_n(&g_host_live, __ATOMIC_RELAXED);
    out->peak_bytes = __atomic_load_n(&g_host_peak, __ATOMIC_RELAXED);
}

static void hook_host_peak_reset(void) {
    __atomic_store_n(&g_host_peak, __atomic_load_n(&g_host_live, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

static void hook_host_fail_next(int n) { __atomic_store_n(&g_host_fail, n, __ATOMIC_RELAXED); }

static void hook_vm_fail_next(int n) { __atomic_store_n(&g_map_fail, n, __ATOMIC_RELAXED); }

static void hook_vm_fail_unmap_next(int n) { __atomic_store_n(&g_unmap_fail, n, __ATOMIC_RELAXED); }

static void hook_vm_fail_record_next(int n) { __atomic_store_n(&g_record_fail, n, __ATOMIC_RELAXED); }

static void hook_copy_fail_next(int n) { __atomic_store_n(&g_copy_fail, n, __ATOMIC_RELAXED); }

/* ---- kernels: the CPU kernels on translated tensors */

typedef struct frame {
    accel_tensor host[ACCEL_KERNEL_MAX_TENSORS];
    accel_tensor *saved[ACCEL_KERNEL_MAX_TENSORS];
} frame;

/* Points t[i] at host copies of the headers with host data pointers; counts
 * the launch on the device of the first tensor. */
static accel_status enter(frame *f, accel_tensor **t, int n) {
    for (int i = 0; i < n; i++)
        if (t[i] && t[i]->device.type == ACCEL_DEV_HOSTLESS && t[i]->device.index < g_count) {
            atomic_fetch_add(&g_kernels[t[i]->device.index], 1);
            break;
        }
    for (int i = 0; i < n; i++) {
        f->saved[i] = t[i];
        if (!t[i]) continue;
        if (t[i]->device.type != ACCEL_DEV_HOSTLESS || t[i]->device.index >= g_count) {
            char d[32];
            for (int j = 0; j < i; j++) t[j] = f->saved[j];
            return accel_set_error(ACCEL_ERR_DEVICE, "hostless kernel given a tensor on %s",
                                   accel_device_str(t[i]->device, d, sizeof d));
        }
        int index = t[i]->device.index;
        f->host[i] = *t[i];
        f->host[i].device = ACCEL_CPU_DEVICE;
        f->host[i].data = to_host_ptr(index, t[i]->data);
        if (!f->host[i].data && t[i]->data) {
            for (int j = 0; j < i; j++) t[j] = f->saved[j];
            return bad_pointer(index, "kernel tensor", t[i]->data);
        }
        t[i] = &f->host[i];
    }
    return ACCEL_OK;
}

static void leave(frame *f, accel_tensor **t, int n) {
    for (int i = 0; i < n; i++) t[i] = f->saved[i];
}

#define HOSTLESS_KERNEL(name, T)                                           \
    static accel_status hostless_##name(T *a) {                           \
        frame f;                                                           \
        accel_status st = enter(&f, a->t, ACCEL_KERNEL_NTENSORS(T));       \
        if (st != ACCEL_OK) return st;                                     \
        st = accel__kernel_table_of(ACCEL_CPU_DEVICE, #name)->name(a);     \
        leave(&f, a->t, ACCEL_KERNEL_NTENSORS(T));                         \
        return st;                                                         \
    }
ACCEL_KERNELS(HOSTLESS_KERNEL)
#undef HOSTLESS_KERNEL

static const accel_backend hostless_backend = {
    .name = "hostless",
    .type = ACCEL_DEV_HOSTLESS,
    .device_count = hostless_count,
    .host_addressable = false,
    .sdpa_strided = true, /* the CPU kernels */
    .sdpa_key_range = true, /* the CPU kernels */
    .sdpa_key_start = true, /* the CPU kernels */
    /* The CPU kernels write any; a GPU's stand-in takes the ops' GPU path
     * (cuBLASLt's: cuda_backend.c), so that its figures are a GPU's. */
    .gemm_c16 = ACCEL_GEMM_C16_SAME,
    .mem = {
        .alloc = hostless_alloc,
        .free = hostless_free,
        .step_alloc = hostless_step_alloc,
        .step_reset = hostless_step_reset,
        .memset = hostless_memset,
        .copy_to_device = hostless_copy_to_device,
        .copy_to_host = hostless_copy_to_host,
        .copy_device = hostless_copy_device,
        .mem_info = hostless_mem_info,
        .host_alloc = hostless_host_alloc,
        .host_free = hostless_host_free,
        .vm_granularity = hostless_vm_granularity,
        .vm_reserve = hostless_vm_reserve,
        .vm_release = hostless_vm_release,
        .vm_map = hostless_vm_map,
        .vm_unmap = hostless_vm_unmap,
    },
    .kernels = {
#define HOSTLESS_SLOT(name, T) .name = hostless_##name,
        ACCEL_KERNELS(HOSTLESS_SLOT)
#undef HOSTLESS_SLOT
    },
};

static accel_status hook_register(int n) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    if (n < 1 || n > HOSTLESS_MAX)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__hostless_register: %d devices (1..%d)", n,
                               HOSTLESS_MAX);
    pthread_mutex_lock(&lock);
    bool clash = g_count && g_count != n;
    if (!g_count) g_count = n;
    pthread_mutex_unlock(&lock);
    if (clash)
        return accel_set_error(ACCEL_ERR_STATE, "accel__hostless_register: %d devices already registered",
                               g_count);
    return accel__backend_register(&hostless_backend);
}

/* ---- the plug-in's entry (backends/plugin.h) */

static const accel__hostless_hooks hooks = {
    .register_devices = hook_register,
    .memory_stats = hook_memory_stats,
    .reset_peak = hook_reset_peak,
    .host_stats = hook_host_stats,
    .host_peak_reset = hook_host_peak_reset,
    .host_fail_next = hook_host_fail_next,
    .vm_fail_next = hook_vm_fail_next,
    .vm_fail_unmap_next = hook_vm_fail_unmap_next,
    .vm_fail_record_next = hook_vm_fail_record_next,
    .vm_set_limit = hook_vm_set_limit,
    .vm_lag_fences = hook_vm_lag_fences,
    .vm_set_idle_cache = hook_vm_set_idle_cache,
    .vm_idle_releases = hook_vm_idle_releases,
    .call_counts = hook_call_counts,
    .alloc_fail_at = hook_alloc_fail_at,
    .copy_fail_next = hook_copy_fail_next,
};

static const char *unavailable(void) {
    return g_count ? "" : "no hostless test devices: they come with ACCEL_TEST_DEVICES=N";
}

ACCEL__PLUGIN_EXPORT const accel__plugin_abi accel_backend_hostless_abi = {
    ACCEL__PLUGIN_ABI_VERSION, ACCEL__PLUGIN_LAYOUT, ACCEL_VERSION_STRING};

ACCEL__PLUGIN_EXPORT accel_status accel_backend_hostless_init(const accel__plugin_host *host,
                                                               accel__plugin_info *info) {
    ACCEL__PLUGIN_SHIMS_INIT(host);
    *info = (accel__plugin_info){.unavailable = unavailable, .hooks = &hooks};
    return ACCEL_OK;
}
