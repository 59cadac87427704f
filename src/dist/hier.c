/* src/dist/hier.c — hierarchical collectives for a tcp group whose machines
 * hold several ranks each: shared memory inside a machine, the network only
 * between machines (as NCCL's and gloo's topology-aware paths).
 *
 * The default tcp group of a job of M machines x L ranks (L > 1, the same on
 * every machine, each machine's ranks consecutive: rank = m * L + local rank,
 * as every launcher numbers them) gets two subgroups (accel_pg_split):
 *   node   this machine's L ranks: shm;
 *   cross  the M ranks with this local rank, one per machine: tcp.
 * and its slots become (W = M * L; the subgroups' backends are called
 * directly, under the parent's call record, so a failure names the user's
 * call and site):
 *   all_reduce      node all_reduce (zero-copy when the buffer comes from
 *                   accel_pg_alloc_shared, which allocates in the node's
 *                   heap); cross all_reduce of slice `local rank` of L (the L
 *                   cross rings run side by side, each on 1/L of the data);
 *                   node all_gather of the slices. AVG: SUM, then / W.
 *   reduce_scatter  pack the W blocks by local rank ([k][m] = block m*L+k),
 *                   node reduce_scatter (local rank k: its M blocks summed
 *                   over the machine), cross reduce_scatter (block m*L+k
 *                   summed over the machines).
 *   broadcast       cross broadcast among the root's local rank, then node
 *                   broadcast from it.
 *   all_gather(v)   node all_gatherv into the machine's block, cross
 *                   all_gatherv of the blocks among local rank 0s, node
 *                   broadcast of the whole buffer from local rank 0.
 *   gather, barrier the flat tcp group (pg keeps it: flat_impl).
 * Reduction order: each element is reduced first over its machine's ranks,
 * then over the machines (ring order of the cross ring; for 2 machines
 * simply (machine 0's sum) op (machine 1's sum)). The flat ring reduces over
 * all W ranks in ring order, so floating-point sums of W > 2 ranks can differ
 * in the last bits between the two (integers, MAX/MIN and exactly
 * representable sums agree; bf16/f16 round each step's partial sums, and
 * AVG divides the rounded sum); each is deterministic for a given topology.
 * ACCEL_DIST_HIERARCHICAL=0 keeps the flat ring (docs/dist.md). */
#include <stdlib.h>
#include <string.h>

#include "dist/backend.h"

#define SLICE_ALIGN 16 /* elements: as shm's and tcp's slices */

typedef struct hier_state {
    const accel__backend *flat; /* tcp, with its state: */
    void *flat_impl;
    accel_pg *node, *cross;
    int machine, machines;      /* this rank's machine, M */
    uint64_t calls;             /* collectives that went through node and cross */
} hier_state;

/* Runs fn on the flat group: the parent with its own tcp state. */
#define FLAT(pg, h, call)                  \
    do {                                   \
        (pg)->impl = (h)->flat_impl;       \
        accel_status st_ = (h)->flat->call; \
        (pg)->impl = (h);                  \
        return st_;                        \
    } while (0)

/* The parent's call record goes to sub before each of its slot calls: its
 * peers see (and a mismatch or timeout report names) the user's call. */
static accel_pg *enter(accel_pg *pg, accel_pg *sub) {
    sub->site = pg->site;
    memcpy(sub->op_desc, pg->op_desc, sizeof sub->op_desc);
    return sub;
}

/* A subgroup's failure, said in the parent's terms: its ranks are numbered
 * within it. */
static accel_status sub_failed(accel_pg *pg, const hier_state *h, const accel_pg *sub) {
    char cause[900];
    snprintf(cause, sizeof cause, "%s", accel_last_error());
    int L = h->node->size, k = h->node->rank;
    return sub == h->node
               ? accel_set_error(accel_last_status(), "%s [inside machine %d: its rank i is global rank %d + i]",
                                 cause, h->machine, h->machine * L)
               : accel_set_error(accel_last_status(), "%s [across machines: its rank i is global rank i * %d + %d]",
                                 cause, L, k);
}

#define SUB(pg, h, sub, call)                                                         \
    do {                                                                             \
        accel_pg *s_ = enter(pg, sub);                                               \
        if (s_->be->call != ACCEL_OK) return sub_failed(pg, h, s_);                  \
    } while (0)

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Slice k of n elements over L ranks (starts aligned), as the cross ring gets it. */
static void slice_of(size_t n, int L, int k, size_t *lo, size_t *len) {
    size_t per = round_up((n + (size_t)L - 1) / (size_t)L, SLICE_ALIGN);
    size_t a = (size_t)k * per < n ? (size_t)k * per : n, b = a + per < n ? a + per : n;
    *lo = a;
    *len = b - a;
}

/* AVG is reduced as SUM and divided by the whole world once, at the end. */
static void divide(accel_pg *pg, void *buf, size_t count, accel_dtype dt) {
    void *p = buf;
    const void *src = buf;
    accel__reduce(dt, ACCEL_REDUCE_AVG, pg->size, 1, &src, 1, &p, count);
}

static accel_status hier_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt, accel_reduce_op op) {
    hier_state *h = pg->impl;
    accel_pg *node = h->node, *cross = h->cross;
    int L = node->size;
    size_t es = accel_dtype_size(dt), lo, len;
    accel_reduce_op sum = op == ACCEL_REDUCE_AVG ? ACCEL_REDUCE_SUM : op;
    h->calls++;
    SUB(pg, h, node, all_reduce(node, buf, count, dt, sum));
    slice_of(count, L, node->rank, &lo, &len);
    if (len) SUB(pg, h, cross, all_reduce(cross, (char *)buf + lo * es, len, dt, sum));
    size_t *bytes = accel_malloc((size_t)L * sizeof *bytes);
    if (!bytes) return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
    for (int k = 0; k < L; k++) {
        size_t l, n;
        slice_of(count, L, k, &l, &n);
        bytes[k] = n * es;
    }
    accel_pg *s = enter(pg, node);
    accel_status st = s->be->all_gatherv(s, (char *)buf + lo * es, buf, bytes, -1);
    accel_free(bytes);
    if (st) return sub_failed(pg, h, s);
    if (op == ACCEL_REDUCE_AVG) divide(pg, buf, count, dt);
    return ACCEL_OK;
}

static accel_status hier_reduce_scatter(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt,
                                        accel_reduce_op op) {
    hier_state *h = pg->impl;
    accel_pg *node = h->node, *cross = h->cross;
    int L = node->size, M = h->machines;
    size_t es = accel_dtype_size(dt), blk = count * es;
    accel_reduce_op sum = op == ACCEL_REDUCE_AVG ? ACCEL_REDUCE_SUM : op;
    /* packed[k][m] = block m*L+k; mine: my M blocks summed over the machine */
    char *packed = accel_malloc((size_t)pg->size * blk + 1), *mine = accel_malloc((size_t)M * blk + 1);
    if (!packed || !mine) {
        accel_free(packed);
        accel_free(mine);
        return accel_last_status();
    }
    h->calls++;
    for (int k = 0; k < L; k++)
        for (int m = 0; m < M; m++)
            memcpy(packed + ((size_t)k * M + m) * blk, (const char *)send + ((size_t)m * L + k) * blk, blk);
    accel_pg *s = enter(pg, node);
    accel_status st = s->be->reduce_scatter(s, packed, mine, (size_t)M * count, dt, sum);
    if (!st) {
        s = enter(pg, cross);
        st = s->be->reduce_scatter(s, mine, recv, count, dt, sum);
    }
    accel_free(packed);
    accel_free(mine);
    if (st) return sub_failed(pg, h, s);
    if (op == ACCEL_REDUCE_AVG) divide(pg, recv, count, dt);
    return ACCEL_OK;
}

static accel_status hier_broadcast(accel_pg *pg, void *buf, size_t bytes, int root) {
    hier_state *h = pg->impl;
    int L = h->node->size;
    h->calls++;
    if (h->node->rank == root % L) SUB(pg, h, h->cross, broadcast(h->cross, buf, bytes, root / L));
    SUB(pg, h, h->node, broadcast(h->node, buf, bytes, root % L));
    return ACCEL_OK;
}

static accel_status hier_all_gatherv(accel_pg *pg, const void *send, void *recv, const size_t *bytes, int root) {
    hier_state *h = pg->impl;
    if (root >= 0) FLAT(pg, h, all_gatherv(pg, send, recv, bytes, root));
    accel_pg *node = h->node, *cross = h->cross;
    int L = node->size, M = h->machines;
    size_t *block = accel_calloc((size_t)M, sizeof *block), off = 0, total = 0;
    if (!block) return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
    for (int r = 0; r < pg->size; r++) {
        block[r / L] += bytes[r];
        if (r / L < h->machine) off += bytes[r];
        total += bytes[r];
    }
    h->calls++;
    char *mine = (char *)recv + off;
    accel_pg *s = enter(pg, node);
    accel_status st = s->be->all_gatherv(s, send, mine, bytes + h->machine * L, -1);
    if (!st && node->rank == 0) {
        s = enter(pg, cross);
        st = s->be->all_gatherv(s, mine, recv, block, -1);
    }
    if (!st) {
        s = enter(pg, node);
        st = s->be->broadcast(s, recv, total, 0);
    }
    accel_free(block);
    return st ? sub_failed(pg, h, s) : ACCEL_OK;
}

static accel_status hier_barrier(accel_pg *pg) {
    hier_state *h = pg->impl;
    FLAT(pg, h, barrier(pg));
}

/* Point to point on the flat ring's connections (one per pair, across
 * machines or not): the two ranks alone take part. */
static accel_status hier_p2p(accel_pg *pg, const accel__p2p_msg *tx, const accel__p2p_msg *rx) {
    hier_state *h = pg->impl;
    FLAT(pg, h, p2p(pg, tx, rx));
}

static void *hier_alloc_shared(accel_pg *pg, size_t bytes) {
    accel_pg *node = ((hier_state *)pg->impl)->node;
    return node->be->alloc_shared(node, bytes);
}

static void hier_free_shared(accel_pg *pg, void *ptr) {
    accel_pg *node = ((hier_state *)pg->impl)->node;
    node->be->free_shared(node, ptr);
}

/* After a failure the subgroups are not waited for (their final barrier
 * could only time out). */
static void hier_finalize(accel_pg *pg) {
    hier_state *h = pg->impl;
    if (!h) return;
    for (int i = 0; i < 2; i++) {
        accel_pg *sub = i ? h->cross : h->node;
        if (pg->broken != ACCEL_OK) sub->broken = pg->broken;
        accel_pg_free(sub);
    }
    pg->impl = h->flat_impl;
    pg->be = h->flat;
    accel_free(h);
    pg->be->finalize(pg);
}

const accel__backend accel__backend_hier = {
    .name = "tcp", /* a tcp group, as users and accel_pg_backend know it */
    .finalize = hier_finalize,
    .barrier = hier_barrier,
    .all_reduce = hier_all_reduce,
    .broadcast = hier_broadcast,
    .all_gatherv = hier_all_gatherv,
    .reduce_scatter = hier_reduce_scatter,
    .alloc_shared = hier_alloc_shared,
    .free_shared = hier_free_shared,
    .p2p = hier_p2p,
};

/* Whether pg's ranks form M > 1 machines of L > 1 consecutive ranks each
 * (collective: every rank learns every rank's place, so all decide alike). */
static accel_status layout_fits(accel_pg *pg, bool *fits) {
    int32_t me[2] = {pg->local_rank, pg->local_size}, *all = accel_malloc((size_t)pg->size * sizeof me);
    if (!all) return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
    accel_status st = accel_pg_all_gather(pg, me, all, 2, ACCEL_I32);
    int L = all[1];
    *fits = !st && L > 1 && L < pg->size && pg->size % L == 0;
    for (int r = 0; *fits && r < pg->size; r++) *fits = all[2 * r] == r % L && all[2 * r + 1] == L;
    accel_free(all);
    return st;
}

static accel_status wrap(accel_pg *pg) {
    long on;
    bool fits = false;
    if (accel__env_long("ACCEL_DIST_HIERARCHICAL", 1, 0, 1, &on) != ACCEL_OK) return accel_last_status();
    if (!on) return ACCEL_OK;
    if (layout_fits(pg, &fits) != ACCEL_OK) return accel_last_status();
    if (!fits) return ACCEL_OK;
    int L = pg->local_size;
    accel_pg *node = accel_pg_split(pg, pg->rank / L, pg->rank);
    accel_pg *cross = node ? accel_pg_split(pg, pg->rank % L, pg->rank) : NULL;
    if (!cross) {
        accel_pg_free(node);
        return accel_last_status();
    }
    /* A machine whose ranks do not share one host (their hostnames differ)
     * got tcp inside: nothing to win there. Every rank must take the same
     * path, so one such machine keeps the flat ring for all. */
    int32_t all_shm = !strcmp(node->be->name, "shm");
    accel_status st = accel_pg_all_reduce(pg, &all_shm, 1, ACCEL_I32, ACCEL_REDUCE_MIN);
    hier_state *h = st || !all_shm ? NULL : accel_calloc(1, sizeof *h);
    if (!h) {
        if (!st && all_shm) st = accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
        accel_pg_free(cross);
        accel_pg_free(node);
        return st;
    }
    *h = (hier_state){pg->be, pg->impl, node, cross, pg->rank / L, pg->size / L, 0};
    pg->be = &accel__backend_hier;
    pg->impl = h;
    return ACCEL_OK;
}

/* The collectives of the setup are init's: the user's first collective is
 * still #1 in reports. */
accel_status accel__hier_wrap(accel_pg *pg) {
    uint32_t seq = pg->site.seq;
    accel_status st = wrap(pg);
    pg->site.seq = seq;
    return st;
}

const char *accel__pg_within_machine(const accel_pg *pg, uint64_t *calls) {
    if (!pg || pg->be != &accel__backend_hier) return NULL;
    const hier_state *h = pg->impl;
    if (calls) *calls = h->calls;
    return h->node->be->name;
}
