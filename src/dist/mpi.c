/* src/dist/mpi.c — the MPI backend (jobs started by mpirun/srun with an MPI).
 *
 * A thin mapping onto MPI's non-blocking collectives on MPI_COMM_WORLD
 * (Iallreduce, Ibcast, Iallgatherv, Igatherv, Ireduce_scatter_block,
 * Ibarrier), each completed by a test loop bounded by ACCEL_DIST_TIMEOUT:
 * MPI itself never times out, and a hang must become an error. MPI cannot say
 * which ranks did not arrive; the message says so. bf16/f16 use user
 * MPI_Ops over 2-byte types that reduce through accel__reduce (in f32, rounded
 * per pairwise step); AVG is SUM followed by a local division. Counts above
 * INT_MAX are split into pieces (all_reduce, broadcast) or refused.
 *
 * MPI is initialised here (MPI_THREAD_SERIALIZED: the async queue issues from
 * its own thread, one call at a time) unless the program already did, and
 * finalised in accel_dist_finalize only if initialised here. After a timeout
 * MPI_Finalize is not called (it would block on the abandoned operation);
 * mpirun then reports the job as failed.
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

typedef struct mpi_state {
    bool we_initialized;
    bool abandoned;        /* a timed-out request is still outstanding */
    MPI_Datatype half[2];  /* [0] bf16, [1] f16 */
    MPI_Op half_op[3];     /* sum, max, min */
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

/* Completes req within the group timeout: spin on MPI_Test, then nap. */
static accel_status finish(accel_pg *pg, int rc, MPI_Request *req) {
    if (rc != MPI_SUCCESS) return mpi_fail(pg, rc);
    double start = accel_now_seconds();
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(pg, rc);
        if (done) return ACCEL_OK;
        if (spins < 2000) continue;
        double el = accel_now_seconds() - start;
        if (el > pg->timeout_s) {
            ((mpi_state *)pg->impl)->abandoned = true;
            return accel_set_error(ACCEL_ERR_TIMEOUT, "accel dist (mpi): %s timed out after %g s on rank %d "
                                   "(MPI does not tell which ranks did not arrive; ACCEL_DEBUG_MODE=1 names each "
                                   "rank's call; ACCEL_DIST_TIMEOUT sets the limit)", pg->op_desc, pg->timeout_s,
                                   pg->rank);
        }
        if (el < 0.002) sched_yield();
        else nanosleep(&(struct timespec){0, el < 0.1 ? 20000 : 200000}, NULL);
    }
}

static accel_status mpi_type(accel_pg *pg, accel_dtype dt, accel_reduce_op op, MPI_Datatype *t, MPI_Op *o) {
    mpi_state *s = pg->impl;
    int k = op == ACCEL_REDUCE_MAX ? 1 : op == ACCEL_REDUCE_MIN ? 2 : 0;
    switch (dt) {
    case ACCEL_F32: *t = MPI_FLOAT; break;
    case ACCEL_F64: *t = MPI_DOUBLE; break;
    case ACCEL_I32: *t = MPI_INT32_T; break;
    case ACCEL_I64: *t = MPI_INT64_T; break;
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

static accel_status mpi_barrier(accel_pg *pg) {
    MPI_Request req;
    return finish(pg, MPI_Ibarrier(MPI_COMM_WORLD, &req), &req);
}

static accel_status mpi_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt, accel_reduce_op op) {
    MPI_Datatype t = MPI_DATATYPE_NULL; /* set by mpi_type on success (initialised for -O3's flow analysis) */
    MPI_Op o = MPI_OP_NULL;
    if (mpi_type(pg, dt, op, &t, &o) != ACCEL_OK) return accel_last_status();
    size_t es = accel_dtype_size(dt);
    for (size_t i = 0; i < count; i += PIECE) {
        size_t n = count - i < PIECE ? count - i : PIECE;
        MPI_Request req;
        if (finish(pg, MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + i * es, (int)n, t, o, MPI_COMM_WORLD, &req),
                   &req) != ACCEL_OK)
            return accel_last_status();
    }
    if (op == ACCEL_REDUCE_AVG) divide(pg, buf, count, dt);
    return ACCEL_OK;
}

static accel_status mpi_broadcast(accel_pg *pg, void *buf, size_t bytes, int root) {
    for (size_t i = 0; i < bytes; i += PIECE) {
        size_t n = bytes - i < PIECE ? bytes - i : PIECE;
        MPI_Request req;
        if (finish(pg, MPI_Ibcast((char *)buf + i, (int)n, MPI_BYTE, root, MPI_COMM_WORLD, &req), &req) != ACCEL_OK)
            return accel_last_status();
    }
    return ACCEL_OK;
}

static accel_status mpi_all_gatherv(accel_pg *pg, const void *send, void *recv, const size_t *bytes, int root) {
    int w = pg->size, r = pg->rank;
    int *cnt = malloc(2 * (size_t)w * sizeof *cnt);
    if (!cnt) return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
    int *disp = cnt + w;
    size_t off = 0;
    for (int k = 0; k < w; k++) {
        if (bytes[k] > INT_MAX || off > INT_MAX) {
            free(cnt);
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel dist (mpi): %s: %zu bytes exceed what one MPI "
                                   "gather can address (2 GiB)", pg->op_desc, off + bytes[k]);
        }
        cnt[k] = (int)bytes[k];
        disp[k] = (int)off;
        off += bytes[k];
    }
    const void *sb = send == (char *)recv + disp[r] && recv ? MPI_IN_PLACE : send;
    MPI_Request req;
    int rc = root < 0 ? MPI_Iallgatherv(sb, cnt[r], MPI_BYTE, recv, cnt, disp, MPI_BYTE, MPI_COMM_WORLD, &req)
                      : MPI_Igatherv(r == root ? sb : send, cnt[r], MPI_BYTE, recv, cnt, disp, MPI_BYTE, root,
                                     MPI_COMM_WORLD, &req);
    accel_status st = finish(pg, rc, &req);
    free(cnt);
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
    MPI_Request req;
    if (finish(pg, MPI_Ireduce_scatter_block(send, recv, (int)count, t, o, MPI_COMM_WORLD, &req), &req) != ACCEL_OK)
        return accel_last_status();
    if (op == ACCEL_REDUCE_AVG) divide(pg, recv, count, dt);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- init */

static void mpi_finalize(accel_pg *pg) {
    mpi_state *s = pg->impl;
    if (!s) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        for (int i = 0; i < 2; i++)
            if (s->half[i] != MPI_DATATYPE_NULL) MPI_Type_free(&s->half[i]);
        for (int i = 0; i < 3; i++)
            if (s->half_op[i] != MPI_OP_NULL) MPI_Op_free(&s->half_op[i]);
        g_half[0] = g_half[1] = MPI_DATATYPE_NULL;
        if (s->we_initialized && !s->abandoned) MPI_Finalize();
    }
    free(s);
    pg->impl = NULL;
}

static accel_status mpi_init(accel_pg *pg, accel__store *store) {
    (void)store;
    mpi_state *s = calloc(1, sizeof *s);
    if (!s) return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
    pg->impl = s;
    s->half[0] = s->half[1] = MPI_DATATYPE_NULL;
    for (int i = 0; i < 3; i++) s->half_op[i] = MPI_OP_NULL;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: MPI_Init_thread failed");
        s->we_initialized = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_dist_init: this MPI provides thread level %d, the mpi "
                               "backend needs MPI_THREAD_SERIALIZED", provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if ((pg->size != 1 && size != pg->size) || (pg->rank != rank && pg->size != 1))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: MPI says rank %d of %d but the environment "
                               "says rank %d of %d", rank, size, pg->rank, pg->size);
    pg->rank = rank;
    pg->size = size;
    MPI_User_function *fns[3] = {half_sum, half_max, half_min};
    for (int i = 0; i < 2; i++) {
        MPI_Type_contiguous(2, MPI_BYTE, &s->half[i]);
        MPI_Type_commit(&s->half[i]);
        g_half[i] = s->half[i];
    }
    for (int i = 0; i < 3; i++) MPI_Op_create(fns[i], 1, &s->half_op[i]);
    return ACCEL_OK;
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
};

#else
/* Without MPI this file defines nothing; ISO C wants a declaration. */
typedef int accel__mpi_backend_not_built;
#endif
