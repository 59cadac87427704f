/* src/dist/shm.c — the shared-memory backend (all ranks on one machine).
 *
 * One shared-memory segment: an anonymous memfd of rank 0, which the others
 * open as /proc/<pid>/fd/<fd> (published through the store). It never has a
 * name, so nothing can leak into /dev/shm, whichever rank dies whenever (a
 * named segment leaked when rank 0 was killed while waiting in rendezvous for
 * a rank that had died), and /dev/shm's size limit does not apply. Layout:
 *
 *   [ctrl: header + one 128-byte line per rank (arrival epoch, zero-copy
 *    offset, pid, the collective it is in: accel__site)]
 *   [staging: 2 sets x world slots of `chunk` bytes, + 2 result slots]
 *   [point to point: world x world channels (sender, receiver), each a
 *    control line and one slot of `chunk` bytes, sparse until used]
 *   [heap: world regions of heap_per_rank bytes, sparse until allocated]
 *
 * Synchronisation is a barrier on per-rank epoch counters (C11 atomics, no
 * shared counter to contend on). Each arrival word carries the epoch (high
 * 48 bits) and the tag of the collective it belongs to (low 16,
 * accel__op_tag): a rank that finds another at its epoch with another tag
 * fails with "mismatched collectives", so a barrier never completes a step of
 * an all_reduce. A rank past the epoch had matched it already. Beside the
 * word, each rank keeps the record of its current collective (what it
 * called, from where: written once per collective, before the arrival that
 * publishes it), so a mismatch or a timeout lists every rank's call and
 * call site, and the last one of a rank that did not arrive. At a
 * collective's first step each rank also compares its call site with every
 * peer's (a 64-bit word beside the arrival: seq and a hash of file:line), so
 * a collective reached from another line (one skipped elsewhere, the next
 * one alike) fails at once on every rank. Waiters spin briefly, then yield, then
 * sleep, so 4 ranks on 2 cores still make progress; every 100 ms they check
 * that the ranks they wait for are alive, and give up after the timeout.
 *
 * Data movement is chunked through the staging slots with double buffering:
 * chunk i uses set i%2 and every chunk has a barrier, so a slot of set s is
 * rewritten only after every rank passed a barrier that follows its last read
 * (the parity carries over from one collective to the next).
 *
 * all_reduce: each rank reduces a 1/world slice. If every rank's buffer lies
 * in the shared heap (accel_pg_alloc_shared) the slice is reduced in place
 * across all buffers — no copies, 2 barriers. Otherwise per chunk: copy the
 * slices other ranks own into my slot, barrier, reduce my slice (my buffer +
 * their slots) into my buffer and the result slot, barrier, copy the other
 * slices back from the result slots. Chunks fit in L2, so only the user
 * buffers touch DRAM. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/backend.h"
#include "core/core_internal.h"

#define SHM_MAGIC 0x61636365u
#define SLICE_ALIGN 16 /* elements: slices start on 64-byte boundaries for f32 */

typedef struct shm_rank {
    _Alignas(128) _Atomic uint64_t arrive;
    /* Collective q's site_key() in slot q & 1, written before the
     * arrival that begins q: a peer reading it at q's first step finds q
     * there, since no rank can begin q + 2 before every rank left q. */
    _Atomic uint64_t site_key[2];
    _Atomic int64_t zc_off; /* offset of this rank's all_reduce buffer in the heap, or -1 */
    _Atomic int32_t pid;
    accel__site site; /* read by the others only to report */
} shm_rank;

typedef struct shm_ctrl {
    uint32_t magic;
    int32_t world;
    shm_rank r[];
} shm_ctrl;

/* The channel from one rank to another (point to point): a one-slot queue
 * of chunks. The sender fills the slot when it is empty (taken == sent) and
 * publishes it (sent++); the receiver takes it (taken++). A message's first
 * chunk carries the sender's record (head), which the receiver checks first;
 * on a difference it writes its own (refuser) and sets refused, which the
 * sender's next wait on the channel reports. */
typedef struct shm_chan {
    _Alignas(128) _Atomic uint64_t sent;
    _Atomic uint64_t taken;
    _Atomic uint32_t refused;
    uint32_t first; /* the chunk in the slot begins a message */
    accel__site head;
    accel__site refuser;
} shm_chan;

typedef struct shm_block {
    size_t off, len; /* within this rank's heap region */
} shm_block;

typedef struct shm_state {
    int fd;
    char *base;
    size_t map_bytes;
    shm_ctrl *ctrl;
    size_t chunk;          /* bytes per staging slot */
    char *stage;
    shm_chan *chan;        /* world x world, [from * world + to] */
    char *chan_slot;       /* their slots, chunk bytes each, in the same order */
    size_t heap_off;       /* offset of heap region 0 in the segment */
    size_t heap_per_rank;
    uint64_t epoch;
    uint16_t tag;          /* the current collective's */
    uint32_t site_seq;     /* the pg->site.seq last copied into ctrl */
    uint64_t first_epoch;  /* the current collective's first step: where call sites are compared */
    int set;
    shm_block *blk;
    size_t nblk, capblk;
} shm_state;

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static char *slot(shm_state *s, int set, int world, int k) {
    return s->stage + ((size_t)set * (size_t)world + (size_t)k) * s->chunk;
}
static char *res(shm_state *s, int set, int world) {
    return s->stage + ((size_t)2 * (size_t)world + (size_t)set) * s->chunk;
}

/* ---------------------------------------------------------------- barrier */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static bool pid_alive(pid_t pid) {
    if (pid <= 0) return true; /* not registered yet: cannot tell */
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    /* A zombie (exited, not yet reaped by its parent) still answers kill(). */
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

static void nap_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

#define EPOCH_OF(word) ((word) >> 16)

/* "rank 0 is in #3 all_reduce(f32, 1024) at train.c:40; rank 1 has not
 * arrived (last seen in #2 barrier() at train.c:38)" for every rank, as seen
 * while waiting at epoch e. */
static void report_ranks(accel_pg *pg, shm_state *s, uint64_t e, char *out, size_t n) {
    size_t o = 0;
    out[0] = 0;
    for (int k = 0; k < pg->size && o < n; k++) {
        uint64_t a = atomic_load_explicit(&s->ctrl->r[k].arrive, memory_order_acquire);
        accel__site site;
        memcpy(&site, &s->ctrl->r[k].site, sizeof site);
        char d[128];
        accel__site_describe(&site, d, sizeof d);
        int w = EPOCH_OF(a) >= e ? snprintf(out + o, n - o, "%srank %d is in %s", k ? "; " : "", k, d)
                                 : snprintf(out + o, n - o, "%srank %d has not arrived (last seen in %s)",
                                            k ? "; " : "", k, d);
        if (w < 0) break;
        o += (size_t)w;
    }
}

static accel_status mismatch_error(accel_pg *pg, shm_state *s, uint64_t e, const char *why) {
    char ranks[800];
    report_ranks(pg, s, e, ranks, sizeof ranks);
    return accel_set_error(ACCEL_ERR_DIST,
                           "accel dist: mismatched collectives (seen by rank %d): %s%s (every rank must call the same "
                           "collectives in the same order with the same arguments; ACCEL_DEBUG_MODE=1 also "
                           "compares roots and reduce ops)", pg->rank, ranks, why);
}

/* seq << 32 | a digest of the call (kind, dtype, count) << 16 | site_hash. */
static uint64_t site_key(const accel__site *site) {
    return (uint64_t)site->seq << 32 | (uint32_t)accel__call_digest(site) << 16 | site->site_hash;
}

/* Rank k (arrived at the first step of this rank's collective q) makes the
 * same call in q from another call site (as accel__sites_differ, with the
 * site's hash). */
static bool other_site(const accel_pg *pg, const shm_state *s, int k) {
    uint64_t mine = site_key(&pg->site);
    uint64_t theirs = atomic_load_explicit(&s->ctrl->r[k].site_key[pg->site.seq & 1], memory_order_relaxed);
    bool same_call = (theirs >> 16) == (mine >> 16); /* seq and call digest */
    return same_call && (theirs & 0xffff) && (mine & 0xffff) && theirs != mine;
}

/* Ranks below *k have arrived at epoch e (arrivals only grow, so the caller
 * resumes from *k); false (error set) when one of them is at e in another
 * collective, or in this one from another call site. */
static bool count_arrived(accel_pg *pg, shm_state *s, uint64_t e, int *k) {
    for (; *k < pg->size; ++*k) {
        uint64_t a = atomic_load_explicit(&s->ctrl->r[*k].arrive, memory_order_acquire);
        if (EPOCH_OF(a) < e) return true;
        if (EPOCH_OF(a) == e && (uint16_t)a != s->tag) {
            mismatch_error(pg, s, e, "");
            return false;
        }
        if (e == s->first_epoch && other_site(pg, s, *k)) {
            mismatch_error(pg, s, e, " (" ACCEL__SITES_DIFFER_HINT ")");
            return false;
        }
    }
    return true;
}

static accel_status wait_epoch(accel_pg *pg, shm_state *s, uint64_t e) {
    int world = pg->size, k = 0;
    double start = 0, next_check = 0;
    for (unsigned spins = 0;; spins++) {
        if (!count_arrived(pg, s, e, &k)) return accel_last_status();
        if (k == world) return ACCEL_OK;
        if (spins < 4096) {
            cpu_relax();
            continue;
        }
        double now = accel_now_seconds();
        if (start == 0) {
            start = now;
            next_check = now + 0.1;
        }
        if (now - start < 0.002) sched_yield();
        else nap_us(now - start < 0.1 ? 20 : 200);
        if (now < next_check) continue;
        next_check = now + 0.1;
        for (int j = k; j < world; j++) {
            if (EPOCH_OF(atomic_load_explicit(&s->ctrl->r[j].arrive, memory_order_acquire)) >= e) continue;
            pid_t pid = atomic_load(&s->ctrl->r[j].pid);
            if (!pid_alive(pid))
                return accel_set_error(ACCEL_ERR_DIST,
                                       "accel dist: rank %d (pid %d) died while rank %d waited in %s",
                                       j, (int)pid, pg->rank, pg->op_desc);
        }
        if (now - start > pg->timeout_s) {
            char list[256], ranks[700];
            size_t o = 0;
            int missing = 0;
            for (int j = 0; j < world; j++) {
                if (EPOCH_OF(atomic_load_explicit(&s->ctrl->r[j].arrive, memory_order_acquire)) >= e) continue;
                if (o < sizeof list - 16)
                    o += (size_t)snprintf(list + o, sizeof list - o, "%s%d", missing ? ", " : "", j);
                missing++;
            }
            report_ranks(pg, s, e, ranks, sizeof ranks);
            return accel_set_error(ACCEL_ERR_TIMEOUT,
                                   "accel dist: %s timed out after %g s on rank %d: rank%s %s of %d did not "
                                   "arrive: %s (ACCEL_DIST_TIMEOUT sets the limit)",
                                   pg->op_desc, pg->timeout_s, pg->rank, missing > 1 ? "s" : "", list, world, ranks);
        }
    }
}

/* One synchronisation step of the current collective (s->tag). */
static accel_status sync_ranks(accel_pg *pg) {
    shm_state *s = pg->impl;
    uint64_t e = ++s->epoch;
    if (s->site_seq != pg->site.seq) { /* once per collective, before the arrival that publishes it */
        shm_rank *me = &s->ctrl->r[pg->rank];
        memcpy(&me->site, &pg->site, sizeof pg->site);
        atomic_store_explicit(&me->site_key[pg->site.seq & 1], site_key(&pg->site), memory_order_relaxed);
        s->site_seq = pg->site.seq;
        s->first_epoch = e;
    }
    atomic_store_explicit(&s->ctrl->r[pg->rank].arrive, e << 16 | s->tag, memory_order_release);
    return wait_epoch(pg, s, e);
}

static accel_status shm_barrier(accel_pg *pg) {
    ((shm_state *)pg->impl)->tag = accel__op_tag(ACCEL__SLOT_BARRIER, 0, 0);
    return sync_ranks(pg);
}

/* ---------------------------------------------------------------- init */

static void shm_finalize(accel_pg *pg) {
    shm_state *s = pg->impl;
    if (!s) return;
    if (s->base) munmap(s->base, s->map_bytes);
    if (s->fd >= 0) close(s->fd);
    accel_free(s->blk);
    accel_free(s);
    pg->impl = NULL;
}

static accel_status shm_init(accel_pg *pg, accel__store *store) {
    int world = pg->size, me = pg->rank;
    if (world > 64)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_dist_init: the shm backend supports at most 64 "
                               "ranks on one machine (WORLD_SIZE=%d)", world);
    /* Every rank checks the tunables (the launcher gives all the same), so a
     * bad value fails the whole group at once; rank 0's values are used. */
    long chunk_kb, heap_mb;
    if (accel__env_long("ACCEL_SHM_CHUNK_KB", 256, 4, 1L << 20, &chunk_kb) != ACCEL_OK ||
        accel__env_long("ACCEL_SHM_HEAP_MB", 2048, 1, 1L << 20, &heap_mb) != ACCEL_OK)
        return accel_last_status();
    shm_state *s = accel_calloc(1, sizeof *s);
    if (!s) return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
    s->fd = -1;
    pg->impl = s;
    char info[160];
    size_t ctrl_bytes = round_up(sizeof(shm_ctrl) + (size_t)world * sizeof(shm_rank), 4096);
    int owner_pid = (int)getpid(), owner_fd = -1;
    if (me == 0) {
        s->chunk = round_up((size_t)chunk_kb << 10, 4096);
        s->heap_per_rank = round_up((size_t)heap_mb << 20, 1u << 21);
    } else {
        void *v;
        if (accel__store_get(store, "shm/info", &v, NULL) != ACCEL_OK) return accel_last_status();
        int ok = sscanf(v, "%d %d %zu %zu", &owner_pid, &owner_fd, &s->chunk, &s->heap_per_rank);
        accel_free(v);
        if (ok != 4) return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: bad shm/info from rank 0");
    }
    size_t stage_bytes = (size_t)(2 * world + 2) * s->chunk;
    size_t nchan = (size_t)world * (size_t)world;
    size_t chan_bytes = round_up(nchan * sizeof(shm_chan), 4096) + nchan * s->chunk;
    s->heap_off = round_up(ctrl_bytes + stage_bytes + chan_bytes, 1u << 21);
    s->map_bytes = s->heap_off + (size_t)world * s->heap_per_rank;
    if (me == 0) {
        s->fd = memfd_create("accel-shm", MFD_CLOEXEC);
        if (s->fd < 0 || ftruncate(s->fd, (off_t)s->map_bytes) != 0)
            return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: cannot create shared memory (%zu bytes): %s",
                                   s->map_bytes, strerror(errno));
        snprintf(info, sizeof info, "%d %d %zu %zu", owner_pid, s->fd, s->chunk, s->heap_per_rank);
    } else {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/%d", owner_pid, owner_fd);
        s->fd = open(path, O_RDWR | O_CLOEXEC);
        if (s->fd < 0)
            return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: cannot open rank 0's shared memory %s: %s "
                                   "(all ranks of a machine must share one PID namespace and user; "
                                   "ACCEL_DIST_BACKEND=tcp works without)", path, strerror(errno));
    }
    s->base = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: mmap of %zu bytes failed: %s", s->map_bytes,
                               strerror(errno));
    }
    s->ctrl = (shm_ctrl *)s->base;
    s->stage = s->base + ctrl_bytes;
    s->chan = (shm_chan *)(s->stage + stage_bytes); /* zero-filled by ftruncate: every channel empty */
    s->chan_slot = (char *)s->chan + round_up(nchan * sizeof(shm_chan), 4096);
    if (me == 0) {
        s->ctrl->magic = SHM_MAGIC;
        s->ctrl->world = world;
        for (int k = 0; k < world; k++) {
            atomic_store(&s->ctrl->r[k].arrive, 0);
            atomic_store(&s->ctrl->r[k].zc_off, -1);
        }
    }
    /* Rank 0 initialised ctrl before publishing where it is, so it is valid here. */
    if (me == 0 && accel__store_set(store, "shm/info", info, strlen(info)) != ACCEL_OK) return accel_last_status();
    atomic_store(&s->ctrl->r[me].pid, (int32_t)getpid());
    /* Fault the staging pages into this process now, not in the first collective. */
    for (size_t o = 0; o < stage_bytes; o += 4096) ((volatile char *)s->stage)[o] = 0;
    return ACCEL_OK; /* dist.c's barrier after init waits until every rank has mapped it */
}

/* ---------------------------------------------------------------- helpers */

/* Slice k of n elements split over world ranks, starts aligned to SLICE_ALIGN. */
static void slice_of(size_t n, int world, int k, size_t *lo, size_t *len) {
    size_t per = round_up((n + (size_t)world - 1) / (size_t)world, SLICE_ALIGN);
    size_t a = (size_t)k * per < n ? (size_t)k * per : n;
    size_t b = a + per < n ? a + per : n;
    *lo = a;
    *len = b - a;
}

static int64_t heap_offset_of(shm_state *s, int me, const void *p, size_t bytes) {
    const char *lo = s->base + s->heap_off + (size_t)me * s->heap_per_rank;
    const char *c = p;
    if (c < lo || c + bytes > lo + s->heap_per_rank) return -1;
    return (int64_t)(c - s->base);
}

/* ---------------------------------------------------------------- collectives */

static accel_status shm_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt,
                                   accel_reduce_op op) {
    shm_state *s = pg->impl;
    int world = pg->size, me = pg->rank;
    size_t es = accel_dtype_size(dt);
    s->tag = accel__op_tag(ACCEL__SLOT_ALL_REDUCE, count, (uint64_t)dt | (uint64_t)op << 8);
    atomic_store_explicit(&s->ctrl->r[me].zc_off, heap_offset_of(s, me, buf, count * es),
                          memory_order_relaxed);
    if (sync_ranks(pg) != ACCEL_OK) return accel_last_status();
    void *ptrs[64];
    bool zero_copy = world <= 64;
    for (int k = 0; k < world && zero_copy; k++) {
        int64_t off = atomic_load_explicit(&s->ctrl->r[k].zc_off, memory_order_relaxed);
        zero_copy = off >= 0;
        if (zero_copy) ptrs[k] = s->base + off;
    }
    if (zero_copy) {
        size_t lo, len;
        slice_of(count, world, me, &lo, &len);
        if (len) {
            for (int k = 0; k < world; k++) ptrs[k] = (char *)ptrs[k] + lo * es;
            accel__reduce(dt, op, world, world, (const void *const *)ptrs, world, ptrs, len);
        }
        return sync_ranks(pg);
    }
    size_t chunk_elems = s->chunk / es;
    char *b = buf;
    for (size_t c0 = 0; c0 < count; c0 += chunk_elems) {
        size_t cn = count - c0 < chunk_elems ? count - c0 : chunk_elems, lo, len;
        for (int k = 0; k < world; k++) {
            if (k == me) continue;
            slice_of(cn, world, k, &lo, &len);
            memcpy(slot(s, s->set, world, me) + lo * es, b + (c0 + lo) * es, len * es);
        }
        if (sync_ranks(pg) != ACCEL_OK) return accel_last_status();
        slice_of(cn, world, me, &lo, &len);
        if (len) {
            const void *srcs[64];
            void *dsts[2] = {b + (c0 + lo) * es, res(s, s->set, world) + lo * es};
            srcs[0] = dsts[0];
            for (int k = 0, j = 1; k < world; k++)
                if (k != me) srcs[j++] = slot(s, s->set, world, k) + lo * es;
            accel__reduce(dt, op, world, world, srcs, 2, dsts, len);
        }
        if (sync_ranks(pg) != ACCEL_OK) return accel_last_status();
        for (int k = 0; k < world; k++) {
            if (k == me) continue;
            slice_of(cn, world, k, &lo, &len);
            memcpy(b + (c0 + lo) * es, res(s, s->set, world) + lo * es, len * es);
        }
        s->set ^= 1;
    }
    return ACCEL_OK;
}

static accel_status shm_broadcast(accel_pg *pg, void *buf, size_t bytes, int root) {
    shm_state *s = pg->impl;
    int world = pg->size;
    s->tag = accel__op_tag(ACCEL__SLOT_BROADCAST, bytes, (uint64_t)root);
    for (size_t o = 0; o < bytes; o += s->chunk) {
        size_t n = bytes - o < s->chunk ? bytes - o : s->chunk;
        if (pg->rank == root) memcpy(slot(s, s->set, world, root), (char *)buf + o, n);
        if (sync_ranks(pg) != ACCEL_OK) return accel_last_status();
        if (pg->rank != root) memcpy((char *)buf + o, slot(s, s->set, world, root), n);
        s->set ^= 1;
    }
    return ACCEL_OK;
}

static accel_status shm_all_gatherv(accel_pg *pg, const void *send, void *recv, const size_t *bytes,
                                    int root) {
    shm_state *s = pg->impl;
    int world = pg->size, me = pg->rank;
    bool receive = root < 0 || root == me;
    size_t most = 0, my_off = 0;
    s->tag = accel__gatherv_tag(bytes, world, root);
    for (int k = 0; k < world; k++) {
        if (bytes[k] > most) most = bytes[k];
        if (k < me) my_off += bytes[k];
    }
    if (receive && bytes[me]) memmove((char *)recv + my_off, send, bytes[me]);
    for (size_t o = 0; o < most; o += s->chunk) {
        if (o < bytes[me]) {
            size_t n = bytes[me] - o < s->chunk ? bytes[me] - o : s->chunk;
            memcpy(slot(s, s->set, world, me), (const char *)send + o, n);
        }
        if (sync_ranks(pg) != ACCEL_OK) return accel_last_status();
        if (receive) {
            size_t off = 0;
            for (int k = 0; k < world; k++) {
                if (k != me && o < bytes[k]) {
                    size_t n = bytes[k] - o < s->chunk ? bytes[k] - o : s->chunk;
                    memcpy((char *)recv + off + o, slot(s, s->set, world, k), n);
                }
                off += bytes[k];
            }
        }
        s->set ^= 1;
    }
    return ACCEL_OK;
}

static accel_status shm_reduce_scatter(accel_pg *pg, const void *send, void *recv, size_t count,
                                       accel_dtype dt, accel_reduce_op op) {
    shm_state *s = pg->impl;
    int world = pg->size, me = pg->rank;
    size_t es = accel_dtype_size(dt);
    size_t sub = s->chunk / (size_t)world / es / SLICE_ALIGN * SLICE_ALIGN;
    s->tag = accel__op_tag(ACCEL__SLOT_REDUCE_SCATTER, count, (uint64_t)dt | (uint64_t)op << 8);
    const char *sb = send;
    for (size_t j0 = 0; j0 < count; j0 += sub) {
        size_t cn = count - j0 < sub ? count - j0 : sub;
        for (int k = 0; k < world; k++)
            if (k != me)
                memcpy(slot(s, s->set, world, me) + (size_t)k * sub * es, sb + ((size_t)k * count + j0) * es,
                       cn * es);
        if (sync_ranks(pg) != ACCEL_OK) return accel_last_status();
        const void *srcs[64];
        void *dst = (char *)recv + j0 * es;
        srcs[0] = sb + ((size_t)me * count + j0) * es;
        for (int k = 0, j = 1; k < world; k++)
            if (k != me) srcs[j++] = slot(s, s->set, world, k) + (size_t)me * sub * es;
        accel__reduce(dt, op, world, world, srcs, 1, &dst, cn);
        s->set ^= 1;
    }
    return ACCEL_OK;
}

/* Per chunk: my blocks for the others into my slot (sub-slot k for rank k),
 * barrier, then block `me` of every peer's slot into my recv. The next chunk
 * uses the other set, so no rank overwrites a slot a peer still reads. */
static accel_status shm_all_to_all(accel_pg *pg, const void *send, void *recv, size_t block) {
    shm_state *s = pg->impl;
    int world = pg->size, me = pg->rank;
    size_t sub = s->chunk / (size_t)world / 64 * 64;
    s->tag = accel__op_tag(ACCEL__SLOT_ALL_TO_ALL, block, (uint64_t)world);
    const char *sb = send;
    char *rb = recv;
    if (block) memcpy(rb + (size_t)me * block, sb + (size_t)me * block, block);
    for (size_t j0 = 0; j0 < block; j0 += sub) {
        size_t cn = block - j0 < sub ? block - j0 : sub;
        for (int k = 0; k < world; k++)
            if (k != me) memcpy(slot(s, s->set, world, me) + (size_t)k * sub, sb + (size_t)k * block + j0, cn);
        if (sync_ranks(pg) != ACCEL_OK) return accel_last_status();
        for (int k = 0; k < world; k++)
            if (k != me) memcpy(rb + (size_t)k * block + j0, slot(s, s->set, world, k) + (size_t)me * sub, cn);
        s->set ^= 1;
    }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- shared heap */

static void *shm_alloc_shared(accel_pg *pg, size_t bytes) {
    shm_state *s = pg->impl;
    size_t len = round_up(bytes ? bytes : 1, 4096), off = 0, at = 0;
    /* First fit in the sorted block list. */
    for (; at < s->nblk; at++) {
        if (s->blk[at].off - off >= len) break;
        off = s->blk[at].off + s->blk[at].len;
    }
    if (off + len > s->heap_per_rank) {
        accel_set_error(ACCEL_ERR_OOM,
                        "accel_pg_alloc_shared: %zu bytes do not fit in this rank's shared heap (%zu MiB; "
                        "set ACCEL_SHM_HEAP_MB)", bytes, s->heap_per_rank >> 20);
        return NULL;
    }
    size_t file_off = s->heap_off + (size_t)pg->rank * s->heap_per_rank + off;
    /* Reserve the pages now: out of memory (or a memory cgroup limit) gives an error here, not SIGBUS later. */
    int e = posix_fallocate(s->fd, (off_t)file_off, (off_t)len);
    if (e != 0) {
        accel_set_error(ACCEL_ERR_OOM, "accel_pg_alloc_shared: cannot reserve %zu bytes of shared memory: %s",
                        len, strerror(e));
        return NULL;
    }
    if (s->nblk == s->capblk) {
        size_t cap = s->capblk ? 2 * s->capblk : 16;
        shm_block *nb = accel__realloc(s->blk, s->capblk * sizeof *nb, cap * sizeof *nb);
        if (!nb) {
            accel_set_error(ACCEL_ERR_OOM, "accel_pg_alloc_shared: out of memory");
            return NULL;
        }
        s->blk = nb;
        s->capblk = cap;
    }
    memmove(s->blk + at + 1, s->blk + at, (s->nblk - at) * sizeof *s->blk);
    s->blk[at] = (shm_block){off, len};
    s->nblk++;
    char *p = s->base + file_off;
    memset(p, 0, len); /* zero-filled and every page faulted in */
    return p;
}

static void shm_free_shared(accel_pg *pg, void *ptr) {
    shm_state *s = pg->impl;
    char *region = s->base + s->heap_off + (size_t)pg->rank * s->heap_per_rank;
    for (size_t i = 0; i < s->nblk; i++) {
        if (region + s->blk[i].off != (char *)ptr) continue;
        fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  (off_t)(s->heap_off + (size_t)pg->rank * s->heap_per_rank + s->blk[i].off),
                  (off_t)s->blk[i].len);
        memmove(s->blk + i, s->blk + i + 1, (s->nblk - i - 1) * sizeof *s->blk);
        s->nblk--;
        return;
    }
    accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_pg_free_shared: %p was not returned by accel_pg_alloc_shared", ptr);
}

/* ---------------------------------------------------------------- point to point */

/* One direction of a transfer in progress: chunks moved so far of the message. */
typedef struct p2p_side {
    const accel__p2p_msg *m;
    shm_chan *c;
    char *slot;
    size_t off;
    bool begun, done;
} p2p_side;

static p2p_side p2p_open(shm_state *s, int world, int from, int to, const accel__p2p_msg *m) {
    size_t i = (size_t)from * (size_t)world + (size_t)to;
    return (p2p_side){.m = m, .c = &s->chan[i], .slot = s->chan_slot + i * s->chunk, .done = m->peer < 0};
}

/* The receiver refused this channel's message: the sender's error naming both. */
static accel_status p2p_refused(accel_pg *pg, const p2p_side *x) {
    accel__site theirs;
    memcpy(&theirs, &x->c->refuser, sizeof theirs);
    char mine[128], d[128];
    accel__p2p_describe(&x->m->site, mine, sizeof mine);
    accel__p2p_describe(&theirs, d, sizeof d);
    return accel_set_error(ACCEL_ERR_DIST, "accel dist: mismatched point-to-point (seen by rank %d): rank %d "
                           "refused an earlier message of this rank's (it waits in %s), so rank %d's %s cannot go "
                           "(a receive's count and dtype must be the send's)", pg->rank, x->m->peer, d, pg->rank,
                           mine);
}

/* Moves what can move now without waiting; true when something did. */
static bool p2p_send_step(shm_state *s, p2p_side *x) {
    uint64_t sent = atomic_load_explicit(&x->c->sent, memory_order_relaxed);
    if (x->done || atomic_load_explicit(&x->c->taken, memory_order_acquire) != sent) return false;
    size_t n = x->m->bytes - x->off < s->chunk ? x->m->bytes - x->off : s->chunk;
    if (n) memcpy(x->slot, x->m->buf + x->off, n);
    x->c->first = !x->begun;
    if (!x->begun) memcpy(&x->c->head, &x->m->site, sizeof x->m->site);
    atomic_store_explicit(&x->c->sent, sent + 1, memory_order_release);
    x->begun = true;
    x->off += n;
    x->done = x->off == x->m->bytes;
    return true;
}

/* As p2p_send_step; a message that is not the expected one fails (error set, *bad). */
static bool p2p_recv_step(accel_pg *pg, shm_state *s, p2p_side *x, bool *bad) {
    uint64_t taken = atomic_load_explicit(&x->c->taken, memory_order_relaxed);
    if (x->done || atomic_load_explicit(&x->c->sent, memory_order_acquire) == taken) return false;
    if (!x->begun) {
        accel__site head;
        memcpy(&head, &x->c->head, sizeof head);
        if (!x->c->first || !accel__p2p_matches(&head, &x->m->site)) {
            memcpy(&x->c->refuser, &x->m->site, sizeof x->m->site);
            atomic_store_explicit(&x->c->refused, 1, memory_order_release);
            accel__p2p_mismatch(pg, &head, &x->m->site);
            *bad = true;
            return false;
        }
    }
    size_t n = x->m->bytes - x->off < s->chunk ? x->m->bytes - x->off : s->chunk;
    if (n) memcpy(x->m->buf + x->off, x->slot, n);
    atomic_store_explicit(&x->c->taken, taken + 1, memory_order_release);
    x->begun = true;
    x->off += n;
    x->done = x->off == x->m->bytes;
    return true;
}

/* Why rank `peer` holds this one up: dead (ACCEL_ERR_DIST) or, past the
 * timeout with no progress, not there (ACCEL_ERR_TIMEOUT); ACCEL_OK to go on. */
static accel_status p2p_peer_check(accel_pg *pg, shm_state *s, int peer, bool timed_out) {
    pid_t pid = atomic_load(&s->ctrl->r[peer].pid);
    accel__site last;
    memcpy(&last, &s->ctrl->r[peer].site, sizeof last);
    char d[128];
    accel__site_describe(&last, d, sizeof d);
    if (!pid_alive(pid))
        return accel_set_error(ACCEL_ERR_DIST, "accel dist: rank %d (pid %d) died while rank %d waited in %s (rank "
                               "%d was last seen in %s)", peer, (int)pid, pg->rank, pg->op_desc, peer, d);
    if (timed_out)
        return accel_set_error(ACCEL_ERR_TIMEOUT, "accel dist: %s timed out after %g s on rank %d: rank %d did not "
                               "take part (it is in, or was last seen in, %s) (ACCEL_DIST_TIMEOUT sets the limit)",
                               pg->op_desc, pg->timeout_s, pg->rank, peer, d);
    return ACCEL_OK;
}

static accel_status shm_p2p(accel_pg *pg, const accel__p2p_msg *tx, const accel__p2p_msg *rx) {
    shm_state *s = pg->impl;
    int world = pg->size, me = pg->rank;
    shm_rank *mine = &s->ctrl->r[me];
    /* Where this rank is, for a peer's report: the receive when there is one. */
    memcpy(&mine->site, rx->peer >= 0 ? &rx->site : &tx->site, sizeof mine->site);
    s->site_seq = 0; /* the next collective publishes its record again */
    p2p_side out = p2p_open(s, world, me, tx->peer, tx), in = p2p_open(s, world, rx->peer, me, rx);
    double last = 0, next_check = 0;
    for (unsigned spins = 0; !out.done || !in.done; spins++) {
        if (!out.done && atomic_load_explicit(&out.c->refused, memory_order_acquire)) return p2p_refused(pg, &out);
        bool bad = false, moved = p2p_send_step(s, &out);
        moved = p2p_recv_step(pg, s, &in, &bad) || moved;
        if (bad) return accel_last_status();
        if (moved) {
            spins = 0;
            last = 0;
            continue;
        }
        if (spins < 4096) {
            cpu_relax();
            continue;
        }
        double now = accel_now_seconds();
        if (last == 0) last = next_check = now;
        if (now - last < 0.002) sched_yield();
        else nap_us(now - last < 0.1 ? 20 : 200);
        if (now < next_check) continue;
        next_check = now + 0.1;
        bool timed_out = now - last > pg->timeout_s;
        if ((!in.done && p2p_peer_check(pg, s, in.m->peer, timed_out) != ACCEL_OK) ||
            (!out.done && p2p_peer_check(pg, s, out.m->peer, timed_out) != ACCEL_OK))
            return accel_last_status();
    }
    return ACCEL_OK;
}

const accel__backend accel__backend_shm = {
    .name = "shm",
    .init = shm_init,
    .finalize = shm_finalize,
    .barrier = shm_barrier,
    .all_reduce = shm_all_reduce,
    .broadcast = shm_broadcast,
    .all_gatherv = shm_all_gatherv,
    .reduce_scatter = shm_reduce_scatter,
    .all_to_all = shm_all_to_all,
    .alloc_shared = shm_alloc_shared,
    .free_shared = shm_free_shared,
    .p2p = shm_p2p,
};
