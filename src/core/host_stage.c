/* Host staging buffers (host_stage.h): a pool of reusable, pinned where the
 * backend can, host buffers per device type, and the chunked copies that
 * move bytes through them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/core_internal.h"
#include "core/env.h"
#include "core/host_stage.h"

enum { DEFAULT_CHUNK = 4 << 20, MIN_CHUNK = 64 };

static size_t g_chunk = DEFAULT_CHUNK; /* atomic */

size_t accel__stage_chunk_bytes(void) { return __atomic_load_n(&g_chunk, __ATOMIC_RELAXED); }

void accel__stage_set_chunk_bytes(size_t bytes) {
    size_t c = bytes ? bytes / MIN_CHUNK * MIN_CHUNK : DEFAULT_CHUNK;
    __atomic_store_n(&g_chunk, c < MIN_CHUNK ? MIN_CHUNK : c, __ATOMIC_RELAXED);
}

enum { DEFAULT_CACHE_MB = 256 };

static size_t g_cache_cap = SIZE_MAX; /* atomic; SIZE_MAX: not read from the environment yet */

/* ACCEL_STAGE_CACHE_MB in bytes, else the default (a tuning switch: a bad
 * value is said, not refused, as it changes no result). */
static size_t cache_cap_from_env(void) {
    long mb;
    if (accel__env_long("ACCEL_STAGE_CACHE_MB", DEFAULT_CACHE_MB, 0, (long)(SIZE_MAX >> 21), &mb) != ACCEL_OK) {
        fprintf(stderr, "accel: warning: %s; the host staging pool keeps %d MiB\n", accel_last_error(),
                DEFAULT_CACHE_MB);
        accel_clear_error();
        return (size_t)DEFAULT_CACHE_MB << 20;
    }
    return (size_t)mb << 20;
}

size_t accel__stage_cache_bytes(void) {
    size_t c = __atomic_load_n(&g_cache_cap, __ATOMIC_RELAXED);
    if (c == SIZE_MAX) {
        c = cache_cap_from_env();
        __atomic_store_n(&g_cache_cap, c, __ATOMIC_RELAXED);
    }
    return c;
}

void accel__stage_set_cache_bytes(size_t bytes) {
    __atomic_store_n(&g_cache_cap, bytes ? bytes : cache_cap_from_env(), __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- host memory */

static bool g_warned[ACCEL_DEV_TYPE_COUNT]; /* under g_lock */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* Says once per device type that staging is not pinned, with the backend's reason. */
static void warn_unpinned(const accel_backend *b, size_t bytes) {
    pthread_mutex_lock(&g_lock);
    bool first = !g_warned[b->type];
    g_warned[b->type] = true;
    pthread_mutex_unlock(&g_lock);
    if (first)
        fprintf(stderr, "accel: warning: %s: %zu bytes of pinned host memory could not be allocated (%s); "
                        "staging copies use pageable memory instead (slower, same results)\n",
                b->name, bytes, accel_last_error());
    accel_clear_error();
}

/* bytes of host memory for b's copies: pinned when b can, else plain. */
static void *host_mem_new(const accel_backend *b, size_t bytes, bool *pinned) {
    *pinned = false;
    if (b->mem.host_alloc) {
        void *p = b->mem.host_alloc(bytes);
        if (p) {
            *pinned = true;
            return p;
        }
        warn_unpinned(b, bytes);
    }
    return accel_malloc(bytes);
}

static void host_mem_free(const accel_backend *b, void *p, bool pinned) {
    if (pinned) b->mem.host_free(p);
    else accel_free(p);
}

/* ---------------------------------------------------------------- the pool */

typedef struct stage_slot {
    void *p;
    size_t cap;
    const accel_backend *owner; /* whose host_alloc made p (frees it) */
    bool pinned;                /* from the backend's host_alloc */
    bool busy;                  /* leased */
} stage_slot;

static stage_slot g_slots[ACCEL_DEV_TYPE_COUNT][ACCEL__STAGE_SLOTS]; /* under g_lock */

/* A slot more than this many times a lease's size is wasted on it when a
 * slot of the lease's own size can be made instead (see pick_slot). */
enum { OVERSIZE = 2 };

/* The free slot to lease for `bytes`. The smallest big enough, unless it is
 * over OVERSIZE times bytes and an empty slot, or a too-small one to grow,
 * can take the lease instead: a chunk lease then does not take the big slot
 * that a loop's large lease (an all-gather's receive buffer) comes back for
 * in the same step, which would allocate that one afresh every step. With
 * no slot big enough: an empty one, else the biggest (to grow). -1 when
 * every slot is leased. */
static int pick_slot(const stage_slot *s, size_t bytes) {
    int fit = -1, empty = -1, small = -1;
    for (int i = 0; i < ACCEL__STAGE_SLOTS; i++) {
        if (s[i].busy) continue;
        if (s[i].cap >= bytes && (fit < 0 || s[i].cap < s[fit].cap)) fit = i;
        if (!s[i].p && empty < 0) empty = i;
        if (s[i].p && s[i].cap < bytes && (small < 0 || s[i].cap > s[small].cap)) small = i;
    }
    bool snug = fit >= 0 && s[fit].cap / OVERSIZE <= bytes;
    if (snug || (fit >= 0 && empty < 0 && small < 0)) return fit;
    return empty >= 0 ? empty : small;
}

/* NULL with an error naming op: no host memory for a staging buffer. */
static void *no_stage_memory(size_t bytes, const char *op) {
    accel_set_error(ACCEL_ERR_OOM, "%s: out of host memory for a %zu-byte staging buffer", op, bytes);
    return NULL;
}

void *accel__stage_acquire(accel_device dev, size_t bytes, const char *op) {
    const accel_backend *b = accel__backend_for(dev, op);
    if (!b) return NULL;
    if (!bytes) bytes = 1;
    pthread_mutex_lock(&g_lock);
    stage_slot *slots = g_slots[dev.type];
    int i = pick_slot(slots, bytes);
    if (i >= 0) slots[i].busy = true;
    pthread_mutex_unlock(&g_lock);
    if (i < 0) { /* every slot leased: a lease of its own */
        void *own = accel_malloc(bytes);
        return own ? own : no_stage_memory(bytes, op);
    }
    stage_slot *s = &slots[i]; /* ours alone while busy; release reads p under g_lock */
    if (s->cap < bytes) {
        if (s->p) host_mem_free(s->owner, s->p, s->pinned);
        bool pinned;
        void *p = host_mem_new(b, bytes, &pinned);
        pthread_mutex_lock(&g_lock);
        *s = (stage_slot){.p = p, .cap = p ? bytes : 0, .owner = b, .pinned = pinned, .busy = p != NULL};
        pthread_mutex_unlock(&g_lock);
        if (!p) return no_stage_memory(bytes, op);
    }
    return s->p;
}

/* Bytes the slots hold that no lease holds (under g_lock). */
static size_t idle_bytes(const stage_slot *s) {
    size_t n = 0;
    for (int i = 0; i < ACCEL__STAGE_SLOTS; i++)
        if (!s[i].busy) n += s[i].cap;
    return n;
}

/* The biggest idle slot other than slot `keep`, -1 if none (under g_lock). */
static int biggest_idle_but(const stage_slot *s, int keep) {
    int big = -1;
    for (int i = 0; i < ACCEL__STAGE_SLOTS; i++)
        if (i != keep && !s[i].busy && s[i].p && (big < 0 || s[i].cap > s[big].cap)) big = i;
    return big;
}

/* Moves idle slots into drop[] until the idle ones hold at most the cap: the
 * slot `returned` (just given back: the next step asks for it again) stays
 * unless it alone is over the cap, the biggest others go first. Leased slots
 * do not count: a big lease held across steps (a staged all-gather's buffer)
 * does not make every chunk lease given back meanwhile go. Returns how many
 * were moved (under g_lock). */
static int evict_over_cap(stage_slot *s, int returned, stage_slot drop[ACCEL__STAGE_SLOTS]) {
    size_t cap = accel__stage_cache_bytes(), idle = idle_bytes(s);
    int n = 0;
    if (s[returned].cap > cap) {
        idle -= s[returned].cap;
        drop[n++] = s[returned];
        s[returned] = (stage_slot){0};
    }
    for (int i; idle > cap && (i = biggest_idle_but(s, returned)) >= 0;) {
        idle -= s[i].cap;
        drop[n++] = s[i];
        s[i] = (stage_slot){0};
    }
    return n;
}

void accel__stage_release(accel_device dev, void *p) {
    if (!p || (unsigned)dev.type >= ACCEL_DEV_TYPE_COUNT) return;
    stage_slot drop[ACCEL__STAGE_SLOTS];
    int n = 0;
    pthread_mutex_lock(&g_lock);
    stage_slot *slots = g_slots[dev.type];
    int i = 0;
    while (i < ACCEL__STAGE_SLOTS && !(slots[i].busy && slots[i].p == p)) i++;
    if (i < ACCEL__STAGE_SLOTS) {
        slots[i].busy = false;
        n = evict_over_cap(slots, i, drop);
    }
    pthread_mutex_unlock(&g_lock);
    if (i == ACCEL__STAGE_SLOTS) accel_free(p); /* the overflow lease of acquire */
    for (int k = 0; k < n; k++) host_mem_free(drop[k].owner, drop[k].p, drop[k].pinned);
}

/* Frees the slots nobody holds; at exit only the plain ones: a device
 * runtime may have shut down before this destructor runs (CUDA's cudaFreeHost
 * then fails), and the process's pinned pages go with it anyway. */
static void trim(bool at_exit) {
    pthread_mutex_lock(&g_lock);
    for (int t = 0; t < ACCEL_DEV_TYPE_COUNT; t++)
        for (int i = 0; i < ACCEL__STAGE_SLOTS; i++) {
            stage_slot *s = &g_slots[t][i];
            if (s->busy || !s->p || (at_exit && s->pinned)) continue;
            host_mem_free(s->owner, s->p, s->pinned);
            *s = (stage_slot){0};
        }
    pthread_mutex_unlock(&g_lock);
}

void accel__stage_trim(void) { trim(false); }

__attribute__((destructor)) static void free_stage_at_exit(void) { trim(true); }

/* A long-lived buffer: a header before the bytes records how to free it. */
typedef struct stage_block {
    bool pinned;
    _Alignas(64) unsigned char bytes[];
} stage_block;

void *accel__stage_alloc(accel_device dev, size_t bytes, const char *op) {
    const accel_backend *b = accel__backend_for(dev, op);
    if (!b) return NULL;
    bool pinned;
    stage_block *k = host_mem_new(b, sizeof *k + bytes, &pinned);
    if (!k) return NULL;
    k->pinned = pinned;
    return k->bytes;
}

void accel__stage_free(accel_device dev, void *p) {
    if (!p) return;
    stage_block *k = (stage_block *)((unsigned char *)p - offsetof(stage_block, bytes));
    host_mem_free(accel__backend_of(dev), k, k->pinned);
}

/* ---------------------------------------------------------------- copies */

void accel__convert_unaligned(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt, size_t n) {
    size_t esz = accel_dtype_size(src_dt), dsz = accel_dtype_size(dst_dt);
    if (dst_dt == src_dt) {
        memcpy(dst, src, n * esz);
        return;
    }
    if (((uintptr_t)src % esz) == 0) {
        accel_convert(dst, dst_dt, src, src_dt, n);
        return;
    }
    enum { BOUNCE = 4096 * 8 };
    _Alignas(64) unsigned char bounce[BOUNCE];
    size_t per = sizeof bounce / esz;
    for (size_t i = 0; i < n; i += per) {
        size_t m = n - i < per ? n - i : per;
        memcpy(bounce, (const unsigned char *)src + i * esz, m * esz);
        accel_convert((unsigned char *)dst + i * dsz, dst_dt, bounce, src_dt, m);
    }
}

/* The chunks of a staged copy in flight: with asynchronous copies, buffer k
 * may be refilled only once the event of its last copy has passed. */
typedef struct chunk_ring {
    const accel_backend *b;
    int index;
    int n;                /* buffers: 2 with asynchronous copies, else 1 */
    size_t chunk;         /* bytes per buffer */
    unsigned char *buf;   /* n x chunk bytes, a lease */
    accel_event *done[2]; /* the last copy out of each buffer, or NULL */
} chunk_ring;

static accel_status ring_open(chunk_ring *r, accel_device dev, size_t total, const char *op) {
    r->b = accel__backend_for(dev, op);
    if (!r->b) return accel_last_status();
    r->index = dev.index;
    r->n = r->b->async.copy_to_device_async ? 2 : 1;
    r->chunk = accel__stage_chunk_bytes();
    if (total < r->chunk) r->n = 1; /* one chunk: nothing to overlap */
    r->done[0] = r->done[1] = NULL;
    r->buf = accel__stage_acquire(dev, (size_t)r->n * r->chunk, op);
    return r->buf ? ACCEL_OK : accel_last_status();
}

/* Buffer k, free to be written (its last copy has finished). */
static unsigned char *ring_take(chunk_ring *r, int k, accel_status *st) {
    if (r->done[k]) {
        accel_status w = r->b->async.event_synchronize(r->index, r->done[k]);
        if (!*st) *st = w;
        r->b->async.event_free(r->index, r->done[k]);
        r->done[k] = NULL;
    }
    return r->buf + (size_t)k * r->chunk;
}

/* Waits for every copy out of the buffers, then gives the lease back. */
static accel_status ring_close(chunk_ring *r, accel_device dev, accel_status st) {
    for (int k = 0; k < r->n; k++) ring_take(r, k, &st);
    accel__stage_release(dev, r->buf);
    return st;
}

/* Bytes of buffer k to dst: enqueued with an event when the device copies
 * asynchronously (the host fills the other buffer meanwhile), else at once. */
static accel_status ring_send(chunk_ring *r, int k, void *dst, size_t m) {
    if (r->n == 1) return r->b->mem.copy_to_device(r->index, dst, r->buf + (size_t)k * r->chunk, m);
    accel_status st = r->b->async.copy_to_device_async(r->index, dst, r->buf + (size_t)k * r->chunk, m, NULL);
    if (st) return st;
    r->done[k] = r->b->async.event_record(r->index, NULL);
    if (r->done[k]) return ACCEL_OK;
    /* no event to wait for: the buffer is reused or released only after the copy */
    st = accel_last_status();
    r->b->async.synchronize(r->index);
    return st;
}

accel_status accel__stage_to_device(accel_device dev, void *dst, const void *src, accel_dtype src_dt,
                                    accel_dtype dst_dt, size_t n, const char *op) {
    size_t ssz = accel_dtype_size(src_dt), dsz = accel_dtype_size(dst_dt), total = n * dsz;
    if (!n) return ACCEL_OK;
    chunk_ring r = {0};
    accel_status st = ring_open(&r, dev, total, op);
    if (st) return st;
    size_t per = r.chunk / dsz; /* elements per chunk */
    for (size_t i = 0, c = 0; i < n && !st; i += per, c++) {
        size_t m = n - i < per ? n - i : per;
        int k = (int)(c % (size_t)r.n);
        unsigned char *host = ring_take(&r, k, &st);
        if (st) break;
        accel__convert_unaligned(host, dst_dt, (const unsigned char *)src + i * ssz, src_dt, m);
        st = ring_send(&r, k, (unsigned char *)dst + i * dsz, m * dsz);
    }
    st = ring_close(&r, dev, st);
    accel__storage_written(dst, total); /* a failed copy may have written part */
    return st;
}

accel_status accel__stage_from_device(accel_device dev, const void *src, size_t n, accel__stage_sink sink,
                                      void *ctx, const char *op) {
    if (!n) return ACCEL_OK;
    const accel_backend *b = accel__backend_for(dev, op);
    if (!b) return accel_last_status();
    size_t chunk = accel__stage_chunk_bytes(); /* a whole chunk even for less: the lease every copy shares */
    unsigned char *host = accel__stage_acquire(dev, chunk, op);
    if (!host) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (size_t off = 0; off < n && !st; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        st = b->mem.copy_to_host(dev.index, host, (const unsigned char *)src + off, m);
        if (!st) st = sink(ctx, host, m);
    }
    accel__stage_release(dev, host);
    return st;
}
