/* Step arenas: bump allocation, reset per step, coalesced to the high-water
 * mark so steady-state steps allocate nothing.
 *
 * Only the owning thread allocates from an arena, so it reads its own chunk
 * list without a lock; every change to a chunk list (a chunk pushed, popped
 * or replaced) also takes live_lock, so that another thread may walk every
 * step arena's chunks under that lock (accel__step_arena_overlaps: the
 * registry of storage versions keeps step memory out of it). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "accel/core.h"
#include "core/backend.h"
#include "core/core_internal.h"

typedef struct chunk {
    struct chunk *next;
    size_t cap, used;
    char *data;
} chunk;

struct accel_arena {
    chunk *head;       /* chunk being filled; older chunks follow via next */
    chunk *retired;    /* chunks a reset replaced: pages released, addresses kept (chunks_retire) */
    size_t initial;
    size_t below;      /* bytes used in the chunks after head */
    size_t peak;       /* high-water of accel_arena_used since the last reset */
    uint32_t gen;
    uint64_t watch[ACCEL__ARENA_WATCHES];    /* each slot's current watch id (accel__arena_watch) */
    size_t watch_low[ACCEL__ARENA_WATCHES];  /* the lowest position a rewind or reset went to since */
    bool step;         /* a thread's step arena (accel_step_arena) */
    struct accel_arena *next_live; /* registry of all arenas (freed at exit) */
    struct accel_arena *prev_live;
};

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static accel_arena *live_head;

/* Chunks from 4 MiB up are 2 MiB aligned and asked to be backed by
 * transparent huge pages: a training step's arena is hundreds of MiB, and on
 * this kind of VM the first touch of 4 KiB pages runs at ~1.5 GB/s against
 * ~5.7 GB/s with huge pages; fewer TLB misses in the GEMMs' strided packing
 * too. (THP "madvise" mode; elsewhere the advice is a harmless no-op.) */
enum { HUGE_ALIGN = 2u << 20, HUGE_MIN = 4u << 20 };

static chunk *chunk_new(size_t cap) {
    chunk *c = accel_malloc(sizeof *c);
    if (!c) return NULL;
    bool huge = cap >= HUGE_MIN;
    if (huge) cap = (cap + HUGE_ALIGN - 1) & ~(size_t)(HUGE_ALIGN - 1);
    c->data = accel_malloc_aligned(cap, huge ? HUGE_ALIGN : 64);
    if (!c->data) {
        accel_free(c);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (huge) (void)madvise(c->data, cap, MADV_HUGEPAGE);
#endif
    c->cap = cap;
    c->used = 0;
    c->next = NULL;
    return c;
}

static void chunks_free(chunk *c) {
    while (c) {
        chunk *n = c->next;
        accel_free(c->data);
        accel_free(c);
        c = n;
    }
}

/* The chunks a reset replaces hold the headers of the step that ended:
 * core.h promises that using one of those tensors afterwards is reported,
 * not a crash, so their memory stays mapped with its pages given back
 * (reading them gives zeros: a header whose magic is gone) until the arena
 * goes. Only growth retires chunks, and the oldest are freed past RETIRED_MAX
 * times the new chunk's size of addresses (none of it memory): a stale
 * tensor of a step long past, in an arena that grew many times since, may
 * still crash. Where pages cannot be given back the chunks are freed. */
enum { RETIRED_MAX = 4 };

static void chunks_retire(accel_arena *a, chunk *c) {
#ifdef MADV_DONTNEED
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    while (c) {
        chunk *n = c->next;
        uintptr_t lo = ((uintptr_t)c->data + page - 1) & ~(page - 1);
        uintptr_t hi = ((uintptr_t)c->data + c->cap) & ~(page - 1);
        if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
        c->next = a->retired;
        a->retired = c;
        c = n;
    }
    size_t kept = 0, max = RETIRED_MAX * a->head->cap;
    for (chunk **p = &a->retired; *p; p = &(*p)->next)
        if ((kept += (*p)->cap) > max) {
            chunks_free(*p);
            *p = NULL;
            break;
        }
#else
    (void)a;
    chunks_free(c);
#endif
}

accel_arena *accel_arena_create(size_t initial_bytes) {
    accel_arena *a = accel_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->initial = initial_bytes ? initial_bytes : (1u << 20);
    a->head = chunk_new(a->initial);
    if (!a->head) {
        accel_free(a);
        return NULL;
    }
    a->gen = 1;
    pthread_mutex_lock(&live_lock);
    a->next_live = live_head;
    if (live_head) live_head->prev_live = a;
    live_head = a;
    pthread_mutex_unlock(&live_lock);
    return a;
}

void accel_arena_destroy(accel_arena *a) {
    if (!a) return;
    pthread_mutex_lock(&live_lock);
    if (a->prev_live) a->prev_live->next_live = a->next_live;
    else live_head = a->next_live;
    if (a->next_live) a->next_live->prev_live = a->prev_live;
    pthread_mutex_unlock(&live_lock);
    chunks_free(a->head);
    chunks_free(a->retired);
    accel_free(a);
}

void *accel_arena_alloc(accel_arena *a, size_t bytes, size_t align) {
    if (!a) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_arena_alloc: arena is NULL");
        return NULL;
    }
    if (align & (align - 1)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_arena_alloc: alignment %zu is not a power of two", align);
        return NULL;
    }
    if (align < 16) align = 16;
    /* Past this, off + bytes and bytes + align wrap: a huge request (a
     * negative count times a size) got a few bytes and wrote past them. */
    if (bytes > SIZE_MAX / 2 || align > SIZE_MAX / 4) {
        accel_set_error(ACCEL_ERR_OOM, "accel_arena_alloc: %zu bytes aligned to %zu is more than an arena can hold",
                        bytes, align);
        return NULL;
    }
    chunk *c = a->head;
    size_t off = (c->used + align - 1) & ~(align - 1);
    if (off + bytes > c->cap) {
        size_t cap = c->cap * 2;
        if (cap < bytes + align) cap = bytes + align;
        chunk *n = chunk_new(cap);
        if (!n) return NULL;
        n->next = c;
        a->below += c->used;
        pthread_mutex_lock(&live_lock);
        a->head = n;
        pthread_mutex_unlock(&live_lock);
        c = n;
        off = 0;
    }
    c->used = off + bytes;
    if (a->below + c->used > a->peak) a->peak = a->below + c->used;
    return c->data + off;
}

size_t accel_arena_used(const accel_arena *a) { return a ? a->below + a->head->used : 0; }

size_t accel_arena_peak(const accel_arena *a) { return a ? a->peak : 0; }

accel_arena_mark accel_arena_mark_now(const accel_arena *a) {
    return a ? (accel_arena_mark){a->head, a->head->used, a->below, a->gen} : (accel_arena_mark){0};
}

accel_status accel_arena_rewind(accel_arena *a, accel_arena_mark m) {
    if (!a || !m.chunk) return ACCEL_OK;
    /* checked before anything is freed: a bad mark leaves the arena as it was */
    const chunk *at = a->head;
    while (at && at != m.chunk) at = at->next;
    if (m.gen != a->gen || !at || m.used > at->used)
        return accel_set_error(ACCEL_ERR_STATE, "accel_arena_rewind: %s",
                               m.gen != a->gen ? "the mark is of an earlier step (the arena was reset since)"
                                               : "the mark is not of this arena, or was already rewound past");
    /* Chunks pushed since the mark go; the reset after the step sizes its one
     * chunk from the peak, so the next step does not push them again. */
    while (a->head != m.chunk) {
        chunk *c = a->head;
        pthread_mutex_lock(&live_lock);
        a->head = c->next;
        pthread_mutex_unlock(&live_lock);
        accel_free(c->data);
        accel_free(c);
    }
    a->head->used = m.used;
    a->below = m.below;
    for (int i = 0; i < ACCEL__ARENA_WATCHES; i++)
        if (m.below + m.used < a->watch_low[i]) a->watch_low[i] = m.below + m.used;
    return ACCEL_OK;
}

uint64_t accel__arena_watch(accel_arena *a, int slot) {
    a->watch_low[slot] = SIZE_MAX;
    return ++a->watch[slot];
}

bool accel__arena_kept(const accel_arena *a, int slot, uint64_t watch, size_t pos) {
    return watch == a->watch[slot] && a->watch_low[slot] >= pos;
}

size_t accel_arena_capacity(const accel_arena *a) {
    if (!a) return 0;
    size_t u = 0;
    for (chunk *c = a->head; c; c = c->next) u += c->cap;
    return u;
}

uint32_t accel_arena_generation(const accel_arena *a) { return a ? a->gen : 0; }

void accel_arena_reset(accel_arena *a) {
    if (!a) return;
    a->gen++;
    for (int i = 0; i < ACCEL__ARENA_WATCHES; i++) a->watch_low[i] = 0;
    size_t want = a->peak;
    a->below = a->peak = 0;
    if (a->head->next || want > a->head->cap) {
        /* Grew this step (a rewind may have freed the chunks already): replace
         * the chunks by one of the high-water size plus slack for alignment, so
         * the next alike step fits without allocating. */
        want += want / 8 + 4096;
        chunk *n = chunk_new(want);
        chunk *old = n ? a->head : a->head->next; /* out of memory: keep the head, reusable */
        pthread_mutex_lock(&live_lock);
        if (n) a->head = n;
        else a->head->next = NULL;
        pthread_mutex_unlock(&live_lock);
        chunks_retire(a, old);
        if (n) return;
    }
    a->head->used = 0;
}

static _Thread_local accel_arena *tl_step_arena;

accel_arena *accel_step_arena(void) {
    accel__threads_follow(); /* every op's outputs come from here: the thread's count follows the process's */
    if (!tl_step_arena) {
        accel_arena *a = accel_arena_create(4u << 20);
        ACCEL_ASSERT(a != NULL);
        pthread_mutex_lock(&live_lock);
        a->step = true;
        pthread_mutex_unlock(&live_lock);
        tl_step_arena = a;
    }
    return tl_step_arena;
}

const accel_arena *accel__step_arena_if_made(void) { return tl_step_arena; }

static bool chunk_holds(const chunk *c, uintptr_t lo, uintptr_t hi) {
    return lo >= (uintptr_t)c->data && hi <= (uintptr_t)c->data + c->cap;
}

static bool chunk_overlaps(const chunk *c, uintptr_t lo, uintptr_t hi) {
    return hi > (uintptr_t)c->data && lo < (uintptr_t)c->data + c->cap;
}

bool accel__in_own_step_arena(const void *p, size_t n) {
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    for (const chunk *c = tl_step_arena ? tl_step_arena->head : NULL; c; c = c->next)
        if (chunk_holds(c, lo, hi)) return true;
    return false;
}

bool accel__step_arena_overlaps(const void *p, size_t n) {
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    bool hit = false;
    pthread_mutex_lock(&live_lock);
    for (const accel_arena *a = live_head; a && !hit; a = a->next_live)
        for (const chunk *c = a->step ? a->head : NULL; c && !hit; c = c->next) hit = chunk_overlaps(c, lo, hi);
    pthread_mutex_unlock(&live_lock);
    return hit;
}

void accel_step_reset(void) {
    /* Device step pools first (cpu's is this arena), then the arena with
     * every step header; the tape lives in the arena too, it notices the new
     * generation and is empty. */
    const accel_backend *b[ACCEL_DEV_TYPE_COUNT];
    int n = accel__backends(b, ACCEL_DEV_TYPE_COUNT);
    for (int i = 0; i < n; i++)
        for (int d = 0; d < b[i]->device_count(); d++) b[i]->mem.step_reset(d);
    if (tl_step_arena) {
        accel__prepared_sweep(); /* prepared forms released while this step's tape could read them */
        accel_arena_reset(tl_step_arena);
    }
}

void accel_thread_cleanup(void) {
    accel__bounce_free();
    if (tl_step_arena) accel__prepared_sweep();
    accel_arena_destroy(tl_step_arena);
    tl_step_arena = NULL;
    accel__tape_drop();
}

__attribute__((destructor)) static void free_live_arenas(void) {
    /* Arenas of threads that exited without cleanup, and the main thread's. */
    pthread_mutex_lock(&live_lock);
    accel_arena *a = live_head;
    live_head = NULL;
    pthread_mutex_unlock(&live_lock);
    while (a) {
        accel_arena *n = a->next_live;
        chunks_free(a->head);
        chunks_free(a->retired);
        accel_free(a);
        a = n;
    }
    tl_step_arena = NULL;
}
