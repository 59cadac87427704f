/* Virtual memory with pooled physical memory (vm_pool.h has the rules).
 *
 * Per device: the reserved ranges, and the blocks, one per physical handle,
 * each free (pooled, unmapped), mapped (at `at`), or retiring (still mapped
 * at `at`, its fence marking the work that may still use it). The arrays
 * grow when a reservation or a handle is new and are freed with the last
 * reservation, so steps alike allocate nothing. A handful of blocks (the
 * ranges mapped at once) makes linear scans the right search. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vm_pool.h"
#include "core/env.h"

typedef enum block_state { BLOCK_FREE, BLOCK_MAPPED, BLOCK_RETIRING } block_state;

typedef struct vm_block {
    uint64_t handle;
    size_t bytes;
    void *fence;      /* recorded at its unmap */
    char *at;         /* where it is mapped (mapped, retiring) */
    block_state state;
    uint64_t retired; /* the pool's clock at its unmap: the oldest retiring is waited for first */
    uint64_t epoch;   /* the step it was last mapped in */
} vm_block;

typedef struct vm_span {
    char *p;
    size_t bytes;
} vm_span;

typedef struct vm_pool {
    pthread_mutex_t lock;
    const accel__vm_ops *ops; /* set by the first reservation */
    accel_device dev;
    vm_block *blocks;
    int n_blocks, cap_blocks;
    vm_span *spans;
    int n_spans, cap_spans;
    uint64_t epoch, clock;
    accel__vm_stats st;
} vm_pool;

static vm_pool g_pools[ACCEL_DEV_TYPE_COUNT][ACCEL__VM_MAX_DEVICES];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_sync_unmap; /* ACCEL_VM_SYNC_UNMAP */

static void pools_init(void) {
    for (int t = 0; t < ACCEL_DEV_TYPE_COUNT; t++)
        for (int i = 0; i < ACCEL__VM_MAX_DEVICES; i++) {
            pthread_mutex_init(&g_pools[t][i].lock, NULL);
            g_pools[t][i].dev = (accel_device){(accel_device_type)t, i};
        }
    bool on = false;
    if (accel__env_bool("ACCEL_VM_SYNC_UNMAP", false, &on) != ACCEL_OK) { /* read once, by no call that can fail */
        fprintf(stderr, "accel: warning: %s; unmaps stay deferred\n", accel_last_error());
        accel_clear_error();
    }
    g_sync_unmap = on;
}

/* Device (type, index)'s pool, locked; NULL (error set) for an index past the pool's table. */
static vm_pool *pool_lock(accel_device_type type, int index) {
    pthread_once(&g_once, pools_init);
    if (index < 0 || index >= ACCEL__VM_MAX_DEVICES) {
        accel_set_error(ACCEL_ERR_DEVICE, "virtual memory: device index %d (at most %d devices)", index,
                        ACCEL__VM_MAX_DEVICES);
        return NULL;
    }
    vm_pool *pl = &g_pools[type][index];
    pthread_mutex_lock(&pl->lock);
    return pl;
}

static void pool_unlock(vm_pool *pl) { pthread_mutex_unlock(&pl->lock); }

static const char *dev_name(const vm_pool *pl, char *buf, size_t n) { return accel_device_str(pl->dev, buf, n); }

/* Grows *arr (of *cap elements of `size` bytes) to hold `need`. */
static bool grow(void **arr, int *cap, int need, size_t size) {
    if (need <= *cap) return true;
    int cap2 = *cap ? *cap * 2 : 8;
    void *a = accel_malloc((size_t)cap2 * size);
    if (!a) return false;
    if (*arr) memcpy(a, *arr, (size_t)*cap * size);
    accel_free(*arr);
    *arr = a;
    *cap = cap2;
    return true;
}

static bool overlaps(const char *a, size_t an, const char *b, size_t bn) { return a < b + bn && b < a + an; }

/* ---- blocks */

/* The first failure of a sequence that goes on after it: its status and
 * message (a later failure would replace the thread's message). */
typedef struct first_failure {
    accel_status st;
    char msg[1024];
} first_failure;

static void keep_first(first_failure *f, accel_status st) {
    if (!st || f->st) return;
    f->st = st;
    snprintf(f->msg, sizeof f->msg, "%s", accel_last_error());
}

/* Sets the kept failure on the thread again; returns its status (ACCEL_OK: none). */
static accel_status report_first(const first_failure *f) {
    return f->st ? accel_set_error(f->st, "%s", f->msg) : ACCEL_OK;
}

/* Releases free block k to the device (the last block takes its place). */
static void destroy(vm_pool *pl, int k) {
    vm_block *b = &pl->blocks[k];
    pl->ops->destroy(pl->dev.index, b->handle);
    pl->ops->fence_free(pl->dev.index, b->fence);
    pl->st.pooled -= b->bytes;
    pl->st.held -= b->bytes;
    pl->st.destroys++;
    pl->blocks[k] = pl->blocks[--pl->n_blocks];
}

/* Retiring block b's work is done (waited for unless `done`): its range is
 * unmapped, its handle pooled. When the unmap fails the handle may still be
 * mapped there, and pooled a later map would put it behind a second range
 * too: it is released instead (legal while mapped: its memory goes with the
 * mapping) and the block dropped (the last block takes its place). The
 * wait's failure, else the unmap's. */
static accel_status finish(vm_pool *pl, vm_block *b, bool done) {
    int index = pl->dev.index;
    first_failure f = {0};
    if (!done) {
        keep_first(&f, pl->ops->fence_wait(index, b->fence));
        pl->st.waits++;
    }
    /* unmapped even when the wait reported an earlier asynchronous error (the
     * device's work has stopped then): a range left mapped would fail its next map */
    accel_status unmapped = pl->ops->unmap(index, b->at, b->bytes);
    keep_first(&f, unmapped);
    b->state = BLOCK_FREE;
    b->at = NULL;
    if (unmapped) destroy(pl, (int)(b - pl->blocks));
    return report_first(&f);
}

/* Finishes every retiring block whose fence is done (last first: a dropped
 * block's place takes one already seen). The first failure. */
static accel_status reap(vm_pool *pl) {
    first_failure f = {0};
    for (int k = pl->n_blocks - 1; k >= 0; k--) {
        vm_block *b = &pl->blocks[k];
        if (b->state == BLOCK_RETIRING && pl->ops->fence_done(pl->dev.index, b->fence))
            keep_first(&f, finish(pl, b, true));
    }
    return report_first(&f);
}

/* Releases the free blocks that no map took in the current epoch, or all of them. */
static void destroy_free(vm_pool *pl, bool all) {
    for (int k = pl->n_blocks - 1; k >= 0; k--)
        if (pl->blocks[k].state == BLOCK_FREE && (all || pl->blocks[k].epoch != pl->epoch)) destroy(pl, k);
}

/* Waits for every retiring block (last first, as reap) and releases every
 * free one. The first failure of a wait or an unmap. */
static accel_status trim(vm_pool *pl) {
    first_failure f = {0};
    for (int k = pl->n_blocks - 1; k >= 0; k--)
        if (pl->blocks[k].state == BLOCK_RETIRING) keep_first(&f, finish(pl, &pl->blocks[k], false));
    destroy_free(pl, true);
    pl->st.trims++;
    return report_first(&f);
}

/* A new free block of `bytes`; on ACCEL_ERR_OOM the pool is trimmed, the
 * backend's other idle memory released, and creation tried once more. */
static vm_block *create(vm_pool *pl, size_t bytes) {
    int index = pl->dev.index;
    if (!grow((void **)&pl->blocks, &pl->cap_blocks, pl->n_blocks + 1, sizeof *pl->blocks)) return NULL;
    void *fence = pl->ops->fence_new(index);
    if (!fence) return NULL;
    uint64_t h;
    accel_status st = pl->ops->create(index, bytes, &h);
    if (st == ACCEL_ERR_OOM && (pl->n_blocks || pl->ops->release_idle)) {
        accel_clear_error();
        st = pl->n_blocks ? trim(pl) : ACCEL_OK; /* a failure: the device failed, reported */
        if (!st && pl->ops->release_idle) pl->ops->release_idle(index);
        if (!st) st = pl->ops->create(index, bytes, &h);
    }
    if (st) {
        pl->ops->fence_free(index, fence);
        return NULL;
    }
    vm_block *b = &pl->blocks[pl->n_blocks++];
    *b = (vm_block){.handle = h, .bytes = bytes, .fence = fence, .state = BLOCK_FREE};
    pl->st.creates++;
    pl->st.created_bytes += bytes;
    pl->st.pooled += bytes;
    pl->st.held += bytes;
    return b;
}

/* A free block of exactly `bytes`: a pooled one, else the oldest retiring one
 * once its work is done, else a new one. NULL with the error set. */
static vm_block *take(vm_pool *pl, size_t bytes) {
    vm_block *oldest = NULL;
    for (int k = 0; k < pl->n_blocks; k++) {
        vm_block *b = &pl->blocks[k];
        if (b->bytes != bytes) continue;
        if (b->state == BLOCK_FREE) {
            pl->st.reused++;
            return b;
        }
        if (b->state == BLOCK_RETIRING && (!oldest || b->retired < oldest->retired)) oldest = b;
    }
    if (oldest) {
        if (finish(pl, oldest, false)) return NULL;
        pl->st.reused++;
        return oldest;
    }
    return create(pl, bytes);
}

static void count_mapped(vm_pool *pl, vm_block *b, char *p) {
    b->state = BLOCK_MAPPED;
    b->at = p;
    b->epoch = pl->epoch;
    pl->st.mapped += b->bytes;
    pl->st.pooled -= b->bytes;
    if (pl->st.mapped > pl->st.mapped_peak) pl->st.mapped_peak = pl->st.mapped;
    pl->st.maps++;
    if (pl->ops->mapped) pl->ops->mapped(pl->dev.index, b->bytes, true);
}

/* Mapped block b retires (vm_unmap): its fence marks the work that may still
 * use it. When no fence could be recorded the host waits for the calling
 * thread's stream (ops->drain) and the range is unmapped at once: its handle
 * is never pooled before that work is done. The first failure. */
static accel_status retire(vm_pool *pl, vm_block *b) {
    int index = pl->dev.index;
    pl->st.mapped -= b->bytes;
    pl->st.pooled += b->bytes;
    b->state = BLOCK_RETIRING;
    b->retired = ++pl->clock;
    if (pl->ops->mapped) pl->ops->mapped(index, b->bytes, false);
    first_failure f = {0};
    keep_first(&f, pl->ops->fence_record(index, b->fence));
    if (!f.st) return ACCEL_OK;
    keep_first(&f, pl->ops->drain(index));
    pl->st.waits++;
    keep_first(&f, finish(pl, b, true));
    return report_first(&f);
}

/* ---- the checks: every refusal names the range */

/* ACCEL_ERR_INVALID_ARG for a range the entry cannot take (alignment, outside
 * the reservations); ACCEL_ERR_STATE for one in the wrong state (mapped twice,
 * unmapped without a map). */
static accel_status refuse(vm_pool *pl, accel_status code, const char *op, const char *p, size_t bytes,
                           const char *why) {
    char d[32];
    return accel_set_error(code, "%s: %s of [%p, %p) (%zu bytes): %s", dev_name(pl, d, sizeof d), op,
                           (const void *)p, (const void *)(p + bytes), bytes, why);
}

static accel_status refuse_range(vm_pool *pl, const char *op, const char *p, size_t bytes, const char *why,
                                 const char *q, size_t qbytes) {
    char what[160];
    snprintf(what, sizeof what, "%s [%p, %p)", why, (const void *)q, (const void *)(q + qbytes));
    return refuse(pl, ACCEL_ERR_STATE, op, p, bytes, what);
}

static bool granular(const vm_pool *pl, const char *p, size_t bytes) {
    size_t g = pl->ops->granularity(pl->dev.index);
    return bytes && bytes % g == 0 && (uintptr_t)p % g == 0;
}

static accel_status refuse_granule(vm_pool *pl, const char *op, const char *p, size_t bytes) {
    char why[96];
    snprintf(why, sizeof why, "address and size must be multiples of the %zu-byte granule",
             pl->ops->granularity(pl->dev.index));
    return refuse(pl, ACCEL_ERR_INVALID_ARG, op, p, bytes, why);
}

static bool inside_a_reservation(const vm_pool *pl, const char *p, size_t bytes) {
    for (int k = 0; k < pl->n_spans; k++)
        if (p >= pl->spans[k].p && p + bytes <= pl->spans[k].p + pl->spans[k].bytes) return true;
    return false;
}

/* The mapped or retiring block that overlaps [p, p + bytes) first, or NULL. */
static vm_block *overlapping(vm_pool *pl, const char *p, size_t bytes, block_state state) {
    for (int k = 0; k < pl->n_blocks; k++) {
        vm_block *b = &pl->blocks[k];
        if (b->state == state && overlaps(p, bytes, b->at, b->bytes)) return b;
    }
    return NULL;
}

/* ---- the entries */

void *accel__vm_reserve(const accel__vm_ops *ops, accel_device_type type, int index, size_t bytes) {
    vm_pool *pl = pool_lock(type, index);
    if (!pl) return NULL;
    pl->ops = ops;
    char *p = NULL, d[32];
    if (!granular(pl, NULL, bytes))
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: vm_reserve of %zu bytes: not a multiple of the %zu-byte granule",
                        dev_name(pl, d, sizeof d), bytes, ops->granularity(index));
    else if (grow((void **)&pl->spans, &pl->cap_spans, pl->n_spans + 1, sizeof *pl->spans) &&
             (p = ops->reserve(index, bytes)))
        pl->spans[pl->n_spans++] = (vm_span){p, bytes};
    pool_unlock(pl);
    return p;
}

/* Unmaps what is left in span k (an error for what is still mapped), and releases it. */
static void release_span(vm_pool *pl, int k) {
    vm_span s = pl->spans[k];
    vm_block *b;
    first_failure f = {0};
    while ((b = overlapping(pl, s.p, s.bytes, BLOCK_MAPPED))) {
        if (!f.st)
            keep_first(&f, refuse_range(pl, "vm_release", s.p, s.bytes, "still has the mapped range", b->at, b->bytes));
        keep_first(&f, retire(pl, b));
    }
    while ((b = overlapping(pl, s.p, s.bytes, BLOCK_RETIRING))) keep_first(&f, finish(pl, b, false));
    pl->ops->release(pl->dev.index, s.p, s.bytes);
    pl->spans[k] = pl->spans[--pl->n_spans];
    report_first(&f);
}

void accel__vm_release(const accel__vm_ops *ops, accel_device_type type, int index, void *p, size_t bytes) {
    if (!p) return;
    vm_pool *pl = pool_lock(type, index);
    if (!pl) return;
    int k = 0;
    while (k < pl->n_spans && (pl->spans[k].p != p || pl->spans[k].bytes != bytes)) k++;
    if (k == pl->n_spans || pl->ops != ops) {
        refuse(pl, ACCEL_ERR_INVALID_ARG, "vm_release", p, bytes, "not a range vm_reserve gave");
        pool_unlock(pl);
        return;
    }
    release_span(pl, k);
    if (!pl->n_spans) { /* the device's last reservation: the pool goes with it */
        destroy_free(pl, true);
        accel_free(pl->spans);
        pl->spans = NULL;
        pl->cap_spans = 0;
        if (!pl->n_blocks) {
            accel_free(pl->blocks);
            pl->blocks = NULL;
            pl->cap_blocks = 0;
        }
    }
    pool_unlock(pl);
}

/* Range [p, p + bytes) still retiring gets its mapping back: later work on
 * the calling thread's stream waits for the retiring work. */
static accel_status revive(vm_pool *pl, vm_block *b) {
    accel_status st = pl->ops->fence_order(pl->dev.index, b->fence);
    if (st) return st;
    count_mapped(pl, b, b->at);
    pl->st.revived++;
    return ACCEL_OK;
}

static accel_status map_locked(vm_pool *pl, char *p, size_t bytes) {
    accel_status st = reap(pl);
    if (st) return st;
    if (!granular(pl, p, bytes)) return refuse_granule(pl, "vm_map", p, bytes);
    if (!inside_a_reservation(pl, p, bytes))
        return refuse(pl, ACCEL_ERR_INVALID_ARG, "vm_map", p, bytes, "not inside a range vm_reserve gave");
    vm_block *b = overlapping(pl, p, bytes, BLOCK_MAPPED);
    if (b) return refuse_range(pl, "vm_map", p, bytes, "overlaps the mapped range", b->at, b->bytes);
    while ((b = overlapping(pl, p, bytes, BLOCK_RETIRING))) {
        if (b->at == p && b->bytes == bytes) return revive(pl, b);
        if ((st = finish(pl, b, false))) return st;
    }
    if (!(b = take(pl, bytes))) return accel_last_status();
    if ((st = pl->ops->map(pl->dev.index, p, bytes, b->handle))) return st;
    count_mapped(pl, b, p);
    return ACCEL_OK;
}

accel_status accel__vm_map(const accel__vm_ops *ops, accel_device_type type, int index, void *p, size_t bytes) {
    vm_pool *pl = pool_lock(type, index);
    if (!pl) return accel_last_status();
    accel_status st = pl->ops == ops ? map_locked(pl, p, bytes)
                                     : refuse(pl, ACCEL_ERR_INVALID_ARG, "vm_map", p, bytes,
                                              "not inside a range vm_reserve gave");
    pool_unlock(pl);
    return st;
}

/* Another retiring range's failure (reap's) does not stop this unmap: the
 * caller counts [p, p + bytes) unmapped once this returns, error or not (the
 * first failure is reported after). */
static accel_status unmap_locked(vm_pool *pl, char *p, size_t bytes) {
    first_failure f = {0};
    keep_first(&f, reap(pl));
    vm_block *b = overlapping(pl, p, bytes, BLOCK_MAPPED);
    if (!b) keep_first(&f, refuse(pl, ACCEL_ERR_STATE, "vm_unmap", p, bytes, "nothing is mapped there"));
    else if (b->at != p || b->bytes != bytes)
        keep_first(&f, refuse_range(pl, "vm_unmap", p, bytes, "not exactly a mapped range: it overlaps", b->at,
                                    b->bytes));
    else {
        pl->st.unmaps++;
        accel_status st = retire(pl, b);
        keep_first(&f, st);
        if (!st && (g_sync_unmap || pl->ops->fence_done(pl->dev.index, b->fence)))
            keep_first(&f, finish(pl, b, !g_sync_unmap));
    }
    return report_first(&f);
}

accel_status accel__vm_unmap(const accel__vm_ops *ops, accel_device_type type, int index, void *p, size_t bytes) {
    vm_pool *pl = pool_lock(type, index);
    if (!pl) return accel_last_status();
    accel_status st = pl->ops == ops ? unmap_locked(pl, p, bytes)
                                     : refuse(pl, ACCEL_ERR_STATE, "vm_unmap", p, bytes, "nothing is mapped there");
    pool_unlock(pl);
    return st;
}

void accel__vm_step(accel_device_type type, int index) {
    vm_pool *pl = pool_lock(type, index);
    if (!pl) {
        accel_clear_error();
        return;
    }
    if (pl->n_blocks) {
        if (reap(pl)) accel_clear_error(); /* the next vm call of the device reports it */
        destroy_free(pl, false);
    }
    pl->epoch++;
    pool_unlock(pl);
}

void accel__vm_trim(accel_device_type type, int index) {
    vm_pool *pl = pool_lock(type, index);
    if (!pl) {
        accel_clear_error();
        return;
    }
    /* best effort, for an allocator about to retry its own allocation (that
     * retry reports what is still wrong): a failure here is not its error */
    if (pl->n_blocks && trim(pl)) accel_clear_error();
    pool_unlock(pl);
}

accel__vm_stats accel__vm_stats_of(accel_device d) {
    accel__vm_stats s = {0};
    vm_pool *pl = pool_lock(d.type, d.index);
    if (!pl) {
        accel_clear_error();
        return s;
    }
    s = pl->st;
    pool_unlock(pl);
    return s;
}

void accel__vm_reset_peak(accel_device d) {
    vm_pool *pl = pool_lock(d.type, d.index);
    if (!pl) {
        accel_clear_error();
        return;
    }
    pl->st.mapped_peak = pl->st.mapped;
    pool_unlock(pl);
}
