/* The CUDA caching allocator and the per-thread step pools.
 *
 * cudaMalloc and cudaFree synchronise the device and cost tens of
 * microseconds, so freed blocks are kept, by size class, for the next
 * allocation of their class (PyTorch's CUDACachingAllocator does the same).
 * Size classes: multiples of 512 bytes up to 1 MiB, multiples of 2 MiB
 * above. A live block is found again on free through a hash table of its
 * address (device memory cannot hold a host header).
 *
 * Reuse is ordered by streams: a block freed while a kernel on the freeing
 * thread's stream still reads it is only handed to work enqueued after that
 * kernel on the same stream. Memory shared between streams must be freed
 * after the streams are joined (an event or synchronize).
 *
 * When cudaMalloc runs out of memory the cache of that device is released
 * (cudaFree), with the virtual memory's pooled handles (vm.c), and the
 * allocation tried once more before reporting out of memory. Any other
 * failure is reported as what it is (a sticky error from an earlier kernel
 * fault says so): it is no out-of-memory, and releasing memory cannot help.
 * The virtual memory's cuMemCreate running out releases this cache too
 * (accel__cuda_release_cached). */
#include <pthread.h>
#include <stdint.h>

#include "backends/vm_pool.h"
#include "cuda_calls.h"
#include "cuda_internal.h"

typedef struct block {
    void *p;
    size_t size;
    struct block *next; /* in its hash bucket (live) or in the free list (cached) */
} block;

enum { NBUCKETS = 4096, SMALL_LIMIT = 1u << 20, SMALL_ROUND = 512, LARGE_ROUND = 2u << 20 };

typedef struct device_heap {
    pthread_mutex_t lock;
    block *live[NBUCKETS];
    block *cached; /* freed blocks, any size */
    size_t reserved;
} device_heap;

static device_heap g_heap[ACCEL_CUDA_MAX_DEVICES];
static pthread_once_t g_heap_once = PTHREAD_ONCE_INIT;

static void heap_init(void) {
    for (int i = 0; i < ACCEL_CUDA_MAX_DEVICES; i++) pthread_mutex_init(&g_heap[i].lock, NULL);
}

static size_t size_class(size_t bytes) {
    size_t r = bytes <= SMALL_LIMIT ? SMALL_ROUND : LARGE_ROUND;
    return (bytes + r - 1) / r * r;
}

static unsigned bucket_of(const void *p) { return (unsigned)(((uintptr_t)p >> 9) % NBUCKETS); }

/* Takes a cached block of exactly `size` off the free list, or NULL. */
static block *take_cached(device_heap *h, size_t size) {
    for (block **pp = &h->cached; *pp; pp = &(*pp)->next)
        if ((*pp)->size == size) {
            block *b = *pp;
            *pp = b->next;
            return b;
        }
    return NULL;
}

/* cudaFree waits for the device: a cached block still read by a kernel
 * enqueued before its free is released after that kernel. */
static void release_cache(int index, device_heap *h) {
    cudaSetDevice(index);
    while (h->cached) {
        block *b = h->cached;
        h->cached = b->next;
        if (accel__cuda_call.free(b->p) != cudaSuccess) accel__cuda_call.take_error(); /* the next call reports a fault */
        h->reserved -= b->size;
        accel_free(b);
    }
}

void accel__cuda_release_cached(int index) {
    pthread_once(&g_heap_once, heap_init);
    device_heap *h = &g_heap[index];
    pthread_mutex_lock(&h->lock);
    release_cache(index, h);
    pthread_mutex_unlock(&h->lock);
}

/* The error of a cudaMalloc of `size` bytes that failed with e, after the
 * retry when e is an out-of-memory. A sticky error stays pending after it is
 * taken: the device's context is lost and every later call fails. */
static void alloc_failed(int index, const device_heap *h, size_t size, cudaError_t e) {
    accel__cuda_call.take_error();
    if (e == cudaErrorMemoryAllocation) {
        accel_set_error(ACCEL_ERR_OOM, "cuda:%d: out of memory allocating %zu bytes (%zu held by the allocator, its "
                        "cache released and the allocation retried)", index, size, h->reserved);
        return;
    }
    bool sticky = accel__cuda_call.peek_error() == e;
    accel_set_error(ACCEL_ERR_DEVICE, "cuda:%d: allocating %zu bytes failed: %s (%s)%s", index, size,
                    cudaGetErrorName(e), cudaGetErrorString(e),
                    sticky ? "; a sticky error: an earlier kernel faulted and the device's context is lost, every "
                             "later CUDA call fails (restart the process; CUDA_LAUNCH_BLOCKING=1 names the kernel)"
                           : "");
}

/* Called with h's lock held; drops it around the virtual memory's trim, whose
 * lock is taken before this one when cuMemCreate runs out
 * (accel__cuda_release_cached): one order for the two locks. */
static block *new_block(int index, device_heap *h, size_t size) {
    block *b = accel_malloc(sizeof *b);
    if (!b) return NULL;
    cudaSetDevice(index);
    cudaError_t e = accel__cuda_call.malloc(&b->p, size);
    if (e == cudaErrorMemoryAllocation) {
        accel__cuda_call.take_error();
        release_cache(index, h);
        pthread_mutex_unlock(&h->lock);
        accel__vm_trim(ACCEL_DEV_CUDA, index); /* the virtual memory's pooled handles too */
        pthread_mutex_lock(&h->lock);
        e = accel__cuda_call.malloc(&b->p, size);
    }
    if (e != cudaSuccess) {
        alloc_failed(index, h, size, e);
        accel_free(b);
        return NULL;
    }
    b->size = size;
    h->reserved += size;
    return b;
}

/* cudaMalloc returns 256-byte aligned memory and every class is a multiple of
 * 512 bytes; larger alignments (up to the 2 MiB of the contract) come from
 * the 2 MiB classes, which cudaMalloc aligns to 2 MiB. */
void *accel__cuda_alloc(int index, size_t bytes, size_t align) {
    pthread_once(&g_heap_once, heap_init);
    size_t size = size_class(align > 256 && bytes <= SMALL_LIMIT ? SMALL_LIMIT + 1 : bytes);
    device_heap *h = &g_heap[index];
    pthread_mutex_lock(&h->lock);
    block *b = take_cached(h, size);
    if (!b) b = new_block(index, h, size);
    if (b) {
        unsigned k = bucket_of(b->p);
        b->next = h->live[k];
        h->live[k] = b;
    }
    pthread_mutex_unlock(&h->lock);
    return b ? b->p : NULL;
}

void accel__cuda_free(int index, void *p) {
    if (!p) return;
    device_heap *h = &g_heap[index];
    pthread_mutex_lock(&h->lock);
    for (block **pp = &h->live[bucket_of(p)]; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            block *b = *pp;
            *pp = b->next;
            b->next = h->cached;
            h->cached = b;
            break;
        }
    pthread_mutex_unlock(&h->lock);
}

size_t accel__cuda_reserved_bytes(int index) {
    pthread_once(&g_heap_once, heap_init);
    device_heap *h = &g_heap[index];
    pthread_mutex_lock(&h->lock);
    size_t r = h->reserved;
    pthread_mutex_unlock(&h->lock);
    return r;
}

/* ---- step pools */

enum { STEP_CHUNK_MIN = 4u << 20, STEP_MAX_CHUNKS = 64 };

typedef struct step_pool {
    void *chunk[STEP_MAX_CHUNKS];
    size_t size[STEP_MAX_CHUNKS];
    int n;        /* chunks held; allocation bumps in the last one */
    size_t used;  /* bytes used of the last chunk */
    size_t total; /* bytes of every chunk (the high water) */
} step_pool;

static _Thread_local step_pool tl_pool[ACCEL_CUDA_MAX_DEVICES];

static bool add_chunk(int index, step_pool *sp, size_t at_least) {
    if (sp->n == STEP_MAX_CHUNKS) {
        accel_set_error(ACCEL_ERR_OOM, "cuda:%d: step pool: more than %d chunks in one step", index,
                        STEP_MAX_CHUNKS);
        return false;
    }
    size_t size = at_least > STEP_CHUNK_MIN ? at_least : STEP_CHUNK_MIN;
    if (sp->n && size < sp->size[sp->n - 1] * 2) size = sp->size[sp->n - 1] * 2;
    void *p = accel__cuda_alloc(index, size, 256);
    if (!p) return false;
    sp->chunk[sp->n] = p;
    sp->size[sp->n++] = size;
    sp->used = 0;
    sp->total += size;
    return true;
}

static uintptr_t align_up(uintptr_t x, size_t a) { return (x + a - 1) / a * a; }

void *accel__cuda_step_alloc(int index, size_t bytes, size_t align) {
    step_pool *sp = &tl_pool[index];
    size_t a = align < 256 ? 256 : align;
    uintptr_t base = sp->n ? (uintptr_t)sp->chunk[sp->n - 1] : 0, p = align_up(base + sp->used, a);
    if (!sp->n || p + bytes > base + sp->size[sp->n - 1]) {
        if (!add_chunk(index, sp, bytes + a)) return NULL;
        base = (uintptr_t)sp->chunk[sp->n - 1];
        p = align_up(base, a);
    }
    sp->used = (size_t)(p - base) + bytes;
    return (void *)p;
}

/* A step that needed several chunks gets one chunk of their total for the
 * next step, so that steps alike do not allocate again. The chunks go back to
 * the cache after the thread's stream has finished with them. */
void accel__cuda_step_reset(int index) {
    step_pool *sp = &tl_pool[index];
    if (sp->n > 1) {
        cudaStreamSynchronize(accel__cuda_enter(index));
        size_t total = sp->total;
        for (int i = 0; i < sp->n; i++) accel__cuda_free(index, sp->chunk[i]);
        sp->n = 0;
        sp->total = 0;
        if (!add_chunk(index, sp, total)) accel_clear_error(); /* the next step_alloc reports it */
    }
    sp->used = 0;
    accel__vm_step(ACCEL_DEV_CUDA, index); /* the step boundary of the virtual memory's pool */
}
