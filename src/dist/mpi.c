/* src/dist/mpi.c — the MPI backend (jobs started by mpirun/srun with an MPI).
 *
 * Each collective is two MPI calls on the group's communicator (a duplicate
 * of MPI_COMM_WORLD, or MPI_Comm_split's for a subgroup):
 *   1. a check: a non-blocking all-reduce (MAX) of 28 bytes carrying the
 *      collective's tag (kind + arguments, accel__op_tag) and its call and
 *      call site's hashes, completed by a test loop bounded by ACCEL_DIST_TIMEOUT: MPI
 *      itself never times out, and a hang must become an error (MPI cannot
 *      say which ranks did not arrive; the message says so). When it
 *      completes every rank has arrived, in the same collective with the same
 *      arguments (else: "mismatched collectives", as on shm and tcp);
 *   2. MPI's blocking collective (Allreduce, Bcast, Allgatherv, Gatherv,
 *      Reduce_scatter_block), which then cannot wait for a missing rank.
 * Why not MPI's non-blocking collectives themselves, as before: OpenMPI runs
 * them through libnbc, whose schedules progress only inside MPI_Test and are
 * not its tuned algorithms; a 1 MiB all-reduce took 4x (the run) to
 * 30x (2 cores oversubscribed) as long as MPI_Allreduce (bench/RESULTS.md).
 * bf16/f16 use user MPI_Ops over 2-byte types that reduce through
 * accel__reduce (in f32, rounded per pairwise step); AVG is SUM followed by a
 * local division. Counts above INT_MAX are split into pieces (all_reduce,
 * broadcast) or refused.
 *
 * MPI is initialised here (MPI_THREAD_MULTIPLE when the MPI has it: each
 * group's communication thread calls MPI, so subgroups need it; else
 * MPI_THREAD_SERIALIZED, enough for one group) unless the program already
 * did, and finalised in accel_dist_finalize only if initialised here. After a
 * timeout MPI_Finalize is not called (it would block on the abandoned
 * operation); mpirun then reports the job as failed.
 *
 * Compiled only when CMake finds MPI (ACCEL_HAVE_MPI). */
#ifdef ACCEL_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/backend.h"

#define PIECE ((size_t)1 << 30) /* elements (or bytes) per MPI call: fits an int */

/* What every group shares: MPI's setup, made by the default group and freed
 * with the last group that uses it (a subgroup may outlive the default one). */
typedef struct mpi_world {
    int refs;              /* groups using it */
    bool we_initialized;
    bool abandoned;        /* a timed-out request is still outstanding */
    int thread_level;      /* what MPI provides */
    MPI_Datatype half[2];  /* [0] bf16, [1] f16 */
    MPI_Op half_op[3];     /* sum, max, min */
} mpi_world;

typedef struct mpi_state {
    MPI_Comm comm;         /* this group's own (a duplicate or a split) */
    mpi_world *world;      /* shared, counted in refs */
} mpi_state;

static MPI_Datatype g_half[2] = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL};

static accel_dtype half_dtype(MPI_Datatype *t) { return *t == g_half[0] ? ACCEL_BF16 : ACCEL_F16; }

static void half_reduce(accel_reduce_op op, void *in, void *inout, int *len, MPI_Datatype *t) {
    const void *srcs[2] = {inout, in};
    void *dst = inout;
    accel__reduce(half_dtype(t), op, 1, 2, srcs, 1, &dst, (size_t)*len);
}
static void half_sum(void *in, void *inout, int *len, MPI_Datatype *t) { half_reduce(ACCEL_REDUCE_SUM, in, inout, len, t); }
static void half_max(void *in, void *inout, int *len, MPI_Datatype *t) { half_reduce(ACCEL_REDUCE_MAX, in, inout, len, t); }
static void half_min(void *in, void *inout, int *len, MPI_Datatype *t) { half_reduce(ACCEL_REDUCE_MIN, in, inout, len, t); }

static accel_status mpi_fail(accel_pg *pg, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, msg, &n);
    return accel_set_error(ACCEL_ERR_DIST, "accel dist (mpi): %s failed on rank %d: %.*s", pg->op_desc, pg->rank, n,
                           msg);
}

static MPI_Comm comm_of(accel_pg *pg) { return ((mpi_state *)pg->impl)->comm; }

/* Completes req within the group timeout: spin on MPI_Test, then yield, then nap. */
static accel_status finish(accel_pg *pg, int rc, MPI_Request *req) {
    if (rc != MPI_SUCCESS) return mpi_fail(pg, rc);
    double start = accel_now_seconds();
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(pg, rc);
        if (done) return ACCEL_OK;
        double el = spins < 2000 ? 0 : accel_now_seconds() - start;
        if (el > pg->timeout_s) {
            ((mpi_state *)pg->impl)->world->abandoned = true;
            return accel_set_error(ACCEL_ERR_TIMEOUT, "accel dist (mpi): %s timed out after %g s on rank %d "
                                   "(MPI does not tell which ranks did not arrive; ACCEL_DEBUG_MODE=1 names each "
                                   "rank's call; ACCEL_DIST_TIMEOUT sets the limit)", pg->op_desc, pg->timeout_s,
                                   pg->rank);
        }
        accel__poll_pause(spins, el);
    }
}

/* Step 1 of every collective (top of file): every rank has arrived in a
 * collective with this tag and, where the ranks' records name the same call
 * (accel__call_digest) and each has a site hash, the same call site. */
static accel_status arrive(accel_pg *pg, uint16_t tag) {
    int32_t call = accel__call_digest(&pg->site), site = pg->site.site_hash;
    /* MAX of x and of -x: all equal iff max(x) == -max(-x). */
    int32_t v[7] = {tag, -(int32_t)tag, call, -call, site, -site, site == 0};
    MPI_Request req;
    if (finish(pg, MPI_Iallreduce(MPI_IN_PLACE, v, 7, MPI_INT32_T, MPI_MAX, comm_of(pg), &req), &req) != ACCEL_OK)
        return accel_last_status();
    bool same_call = v[0] == -v[1], same_site = v[2] != -v[3] || v[6] || v[4] == -v[5];
    if (same_call && same_site) return ACCEL_OK;
    char mine[128];
    accel__site_describe(&pg->site, mine, sizeof mine);
    return accel_set_error(ACCEL_ERR_DIST, "accel dist (mpi): mismatched collectives (seen by rank %d): rank %d is in "
                           "%s; another rank is in %s (MPI does not tell which; ACCEL_DEBUG_MODE=1 names each "
                           "rank's call)%s", pg->rank, pg->rank, mine, same_call ? "the same call from another call "
                           "site" : "another collective or the same one with other arguments",
                           same_call ? " (" ACCEL__SITES_DIFFER_HINT ")" : "");
}

/* A blocking MPI call of step 2. */
static accel_status blocking(accel_pg *pg, int rc) { return rc == MPI_SUCCESS ? ACCEL_OK : mpi_fail(pg, rc); }

static accel_status mpi_type(accel_pg *pg, accel_dtype dt, accel_reduce_op op, MPI_Datatype *t, MPI_Op *o) {
    mpi_world *s = ((mpi_state *)pg->impl)->world;
    int k = op == ACCEL_REDUCE_MAX ? 1 : op == ACCEL_REDUCE_MIN ? 2 : 0;
    switch (dt) {
    case ACCEL_F32: *t = MPI_FLOAT; break;
    case ACCEL_F64: *t = MPI_DOUBLE; break;
    case ACCEL_I32: *t = MPI_INT32_T; break;
    case ACCEL_I64: *t = MPI_INT64_T; break;
    case ACCEL_U8: *t = MPI_UINT8_T; break;
    case ACCEL_I8: *t = MPI_INT8_T; break;
    case ACCEL_I16: *t = MPI_INT16_T; break;
    case ACCEL_BF16: *t = s->half[0]; *o = s->half_op[k]; return ACCEL_OK;
    case ACCEL_F16: *t = s->half[1]; *o = s->half_op[k]; return ACCEL_OK;
    default: return accel_set_error(ACCEL_ERR_DTYPE, "accel dist (mpi): cannot reduce %s", accel_dtype_name(dt));
    }
    *o = k == 1 ? MPI_MAX : k == 2 ? MPI_MIN : MPI_SUM;
    return ACCEL_OK;
}

static void divide(accel_pg *pg, void *buf, size_t count, accel_dtype dt) {
    void *p = buf;
    const void *src = buf;
    accel__reduce(dt, ACCEL_REDUCE_AVG, pg->size, 1, &src, 1, &p, count);
}

/* ---------------------------------------------------------------- collectives */

/* The check of step 1 is a barrier. */
static accel_status mpi_barrier(accel_pg *pg) { return arrive(pg, accel__op_tag(ACCEL__SLOT_BARRIER, 0, 0)); }

static accel_status mpi_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt, accel_reduce_op op) {
    MPI_Datatype t = MPI_DATATYPE_NULL; /* set by mpi_type on success (initialised for -O3's flow analysis) */
    MPI_Op o = MPI_OP_NULL;
    if (mpi_type(pg, dt, op, &t, &o) != ACCEL_OK ||
        arrive(pg, accel__op_tag(ACCEL__SLOT_ALL_REDUCE, count, (uint64_t)dt | (uint64_t)op << 8)) != ACCEL_OK)
        return accel_last_status();
    size_t es = accel_dtype_size(dt);
    for (size_t i = 0; i < count; i += PIECE) {
        size_t n = count - i < PIECE ? count - i : PIECE;
        if (blocking(pg, MPI_Allreduce(MPI_IN_PLACE, (char *)buf + i * es, (int)n, t, o, comm_of(pg))) != ACCEL_OK)
            return accel_last_status();
    }
    if (op == ACCEL_REDUCE_AVG) divide(pg, buf, count, dt);
    return ACCEL_OK;
}

static accel_status mpi_broadcast(accel_pg *pg, void *buf, size_t bytes, int root) {
    if (arrive(pg, accel__op_tag(ACCEL__SLOT_BROADCAST, bytes, (uint64_t)root)) != ACCEL_OK) return accel_last_status();
    for (size_t i = 0; i < bytes; i += PIECE) {
        size_t n = bytes - i < PIECE ? bytes - i : PIECE;
        if (blocking(pg, MPI_Bcast((char *)buf + i, (int)n, MPI_BYTE, root, comm_of(pg))) != ACCEL_OK)
            return accel_last_status();
    }
    return ACCEL_OK;
}

static accel_status mpi_all_gatherv(accel_pg *pg, const void *send, void *recv, const size_t *bytes, int root) {
    int w = pg->size, r = pg->rank;
    int *cnt = accel_malloc(2 * (size_t)w * sizeof *cnt);
    if (!cnt) return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
    int *disp = cnt + w;
    size_t off = 0;
    for (int k = 0; k < w; k++) {
        if (bytes[k] > INT_MAX || off > INT_MAX) {
            accel_free(cnt);
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel dist (mpi): %s: %zu bytes exceed what one MPI "
                                   "gather can address (2 GiB)", pg->op_desc, off + bytes[k]);
        }
        cnt[k] = (int)bytes[k];
        disp[k] = (int)off;
        off += bytes[k];
    }
    const void *sb = send == (char *)recv + disp[r] && recv ? MPI_IN_PLACE : send;
    accel_status st = arrive(pg, accel__gatherv_tag(bytes, w, root));
    if (!st)
        st = blocking(pg, root < 0 ? MPI_Allgatherv(sb, cnt[r], MPI_BYTE, recv, cnt, disp, MPI_BYTE, comm_of(pg))
                               : MPI_Gatherv(r == root ? sb : send, cnt[r], MPI_BYTE, recv, cnt, disp, MPI_BYTE,
                                             root, comm_of(pg)));
    accel_free(cnt);
    return st;
}

static accel_status mpi_reduce_scatter(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt,
                                       accel_reduce_op op) {
    MPI_Datatype t = MPI_DATATYPE_NULL; /* set by mpi_type on success (initialised for -O3's flow analysis) */
    MPI_Op o = MPI_OP_NULL;
    if (mpi_type(pg, dt, op, &t, &o) != ACCEL_OK) return accel_last_status();
    if (count > INT_MAX)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel dist (mpi): %s: %zu elements per rank exceed INT_MAX",
                               pg->op_desc, count);
    if (arrive(pg, accel__op_tag(ACCEL__SLOT_REDUCE_SCATTER, count, (uint64_t)dt | (uint64_t)op << 8)) != ACCEL_OK ||
        blocking(pg, MPI_Reduce_scatter_block(send, recv, (int)count, t, o, comm_of(pg))) != ACCEL_OK)
        return accel_last_status();
    if (op == ACCEL_REDUCE_AVG) divide(pg, recv, count, dt);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- init */

/* Drops a group's reference to the shared setup; the last one frees it (and
 * finalises MPI if accel initialised it and nothing was abandoned). */
static void world_release(mpi_world *w) {
    if (!w || --w->refs > 0) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        for (int i = 0; i < 2; i++)
            if (w->half[i] != MPI_DATATYPE_NULL) MPI_Type_free(&w->half[i]);
        for (int i = 0; i < 3; i++)
            if (w->half_op[i] != MPI_OP_NULL) MPI_Op_free(&w->half_op[i]);
        g_half[0] = g_half[1] = MPI_DATATYPE_NULL;
        if (w->we_initialized && !w->abandoned) MPI_Finalize();
    }
    accel_free(w);
}

static void mpi_finalize(accel_pg *pg) {
    mpi_state *s = pg->impl;
    if (!s) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && s->comm != MPI_COMM_NULL && !(s->world && s->world->abandoned)) MPI_Comm_free(&s->comm);
    world_release(s->world);
    accel_free(s);
    pg->impl = NULL;
}

static accel_status mpi_init(accel_pg *pg, accel__store *store) {
    (void)store;
    mpi_state *s = accel_calloc(1, sizeof *s);
    mpi_world *w = accel_calloc(1, sizeof *w);
    if (!s || !w) {
        accel_free(s);
        accel_free(w);
        return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
    }
    pg->impl = s;
    s->comm = MPI_COMM_NULL;
    s->world = w;
    w->refs = 1;
    w->half[0] = w->half[1] = MPI_DATATYPE_NULL;
    for (int i = 0; i < 3; i++) w->half_op[i] = MPI_OP_NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &w->thread_level) != MPI_SUCCESS)
            return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: MPI_Init_thread failed");
        w->we_initialized = true;
    } else {
        MPI_Query_thread(&w->thread_level);
    }
    if (w->thread_level < MPI_THREAD_SERIALIZED)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_dist_init: this MPI provides thread level %d, the mpi "
                               "backend needs MPI_THREAD_SERIALIZED", w->thread_level);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if ((pg->size != 1 && size != pg->size) || (pg->rank != rank && pg->size != 1))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: MPI says rank %d of %d but the environment "
                               "says rank %d of %d", rank, size, pg->rank, pg->size);
    pg->rank = rank;
    pg->size = size;
    /* A communicator of its own: the program's MPI traffic on MPI_COMM_WORLD never meets accel's. */
    if (MPI_Comm_dup(MPI_COMM_WORLD, &s->comm) != MPI_SUCCESS)
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: MPI_Comm_dup failed");
    MPI_User_function *fns[3] = {half_sum, half_max, half_min};
    for (int i = 0; i < 2; i++) {
        MPI_Type_contiguous(2, MPI_BYTE, &w->half[i]);
        MPI_Type_commit(&w->half[i]);
        g_half[i] = w->half[i];
    }
    for (int i = 0; i < 3; i++) MPI_Op_create(fns[i], 1, &w->half_op[i]);
    return ACCEL_OK;
}

static accel_status mpi_split(accel_pg *parent, int color, int key, accel_pg *sub) {
    mpi_state *ps = parent->impl;
    if (ps->world->thread_level < MPI_THREAD_MULTIPLE)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_pg_split: this MPI provides thread level %d, but "
                               "subgroups of an mpi group need MPI_THREAD_MULTIPLE (%d): each group's communication "
                               "thread calls MPI (was MPI initialised by the program with a lower level?)",
                               ps->world->thread_level, MPI_THREAD_MULTIPLE);
    mpi_state *s = accel_calloc(1, sizeof *s);
    if (!s) return accel_set_error(ACCEL_ERR_OOM, "accel_pg_split: out of memory");
    s->comm = MPI_COMM_NULL;
    int rc = MPI_Comm_split(ps->comm, color, key, &s->comm);
    if (rc != MPI_SUCCESS) {
        accel_free(s);
        return mpi_fail(parent, rc);
    }
    s->world = ps->world;
    s->world->refs++;
    sub->impl = s;
    sub->be = &accel__backend_mpi;
    MPI_Comm_rank(s->comm, &sub->rank);
    MPI_Comm_size(s->comm, &sub->size);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- point to point */

enum { TAG_P2P_HEAD = 0x7a0, TAG_P2P_DATA = 0x7a1 };

/* Posts the bytes of m in pieces that fit an int: req[] gets one request each. */
static int post_pieces(accel_pg *pg, const accel__p2p_msg *m, bool out, MPI_Request *req) {
    int n = 0;
    for (size_t o = 0; o < m->bytes; o += PIECE, n++) {
        int len = (int)(m->bytes - o < PIECE ? m->bytes - o : PIECE);
        int rc = out ? MPI_Isend(m->buf + o, len, MPI_BYTE, m->peer, TAG_P2P_DATA, comm_of(pg), &req[n])
                     : MPI_Irecv(m->buf + o, len, MPI_BYTE, m->peer, TAG_P2P_DATA, comm_of(pg), &req[n]);
        if (rc != MPI_SUCCESS) {
            mpi_fail(pg, rc);
            return -1;
        }
    }
    return n;
}

/* The sender's record (a fixed-size message) and then the data, both
 * directions posted before any wait, so an exchange cannot deadlock. The
 * receiver checks the record before it waits for the data; a mismatch
 * leaves the data requests abandoned (the group is broken). */
static accel_status mpi_p2p(accel_pg *pg, const accel__p2p_msg *tx, const accel__p2p_msg *rx) {
    size_t pieces = (tx->bytes + PIECE - 1) / PIECE + (rx->bytes + PIECE - 1) / PIECE;
    MPI_Request *req = accel_malloc((pieces + 2) * sizeof *req);
    if (!req) return accel_set_error(ACCEL_ERR_OOM, "accel dist (mpi): out of memory");
    accel__site theirs;
    int n = 0, head_in = -1;
    accel_status st = ACCEL_OK;
    if (rx->peer >= 0) {
        int rc = MPI_Irecv(&theirs, (int)sizeof theirs, MPI_BYTE, rx->peer, TAG_P2P_HEAD, comm_of(pg), &req[n]);
        if (rc != MPI_SUCCESS) st = mpi_fail(pg, rc);
        head_in = n++;
    }
    if (!st && tx->peer >= 0) {
        int rc = MPI_Isend(&tx->site, (int)sizeof tx->site, MPI_BYTE, tx->peer, TAG_P2P_HEAD, comm_of(pg), &req[n]);
        if (rc != MPI_SUCCESS) st = mpi_fail(pg, rc);
        n++;
        int k = st ? -1 : post_pieces(pg, tx, true, req + n);
        if (k < 0) st = accel_last_status();
        else n += k;
    }
    if (!st && head_in >= 0) {
        st = finish(pg, MPI_SUCCESS, &req[head_in]);
        if (!st && !accel__p2p_matches(&theirs, &rx->site)) st = accel__p2p_mismatch(pg, &theirs, &rx->site);
        int k = st ? -1 : post_pieces(pg, rx, false, req + n);
        if (!st && k < 0) st = accel_last_status();
        else if (!st) n += k;
    }
    for (int i = 0; !st && i < n; i++)
        if (i != head_in) st = finish(pg, MPI_SUCCESS, &req[i]);
    if (st) ((mpi_state *)pg->impl)->world->abandoned = true;
    accel_free(req);
    return st;
}

const accel__backend accel__backend_mpi = {
    .name = "mpi",
    .init = mpi_init,
    .finalize = mpi_finalize,
    .barrier = mpi_barrier,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .all_gatherv = mpi_all_gatherv,
    .reduce_scatter = mpi_reduce_scatter,
    .split = mpi_split,
    .p2p = mpi_p2p,
};

#else
/* Without MPI this file defines nothing; ISO C wants a declaration. */
typedef int accel__mpi_backend_not_built;
#endif
