/* src/dist/backend.h — the collective backend vtable and the process group
 * object (internal to dist/).
 *
 * dist.c validates arguments, runs debug-mode checks, serialises calls and
 * handles the async queue; a backend only moves and reduces bytes. Adding a
 * backend (mpi, nccl) = one more accel__backend and one line in dist.c's
 * selection; nothing above dist/ changes.
 *
 * Contract of every slot: called by every rank in the same order, from one
 * thread at a time; returns ACCEL_OK or sets an error (naming pg->op_desc for
 * context) and returns its status. Timeouts use pg->timeout_s. */
#ifndef ACCEL_DIST_BACKEND_H
#define ACCEL_DIST_BACKEND_H

#include <pthread.h>

#include "accel/dist.h"
#include "dist/store.h"

typedef struct accel__backend {
    const char *name;
    /* Collective over the store: set up pg->impl. */
    accel_status (*init)(accel_pg *pg, accel__store *store);
    /* Release pg->impl (after a final barrier done by dist.c). */
    void (*finalize)(accel_pg *pg);
    accel_status (*barrier)(accel_pg *pg);
    /* In place; count elements of dt (a reducible dtype). */
    accel_status (*all_reduce)(accel_pg *pg, void *buf, size_t count, accel_dtype dt,
                               accel_reduce_op op);
    accel_status (*broadcast)(accel_pg *pg, void *buf, size_t bytes, int root);
    /* Rank k contributes bytes[k] (send has bytes[rank]); recv gets them in
     * rank order. root < 0: every rank receives; else only root (recv may be
     * NULL elsewhere). */
    accel_status (*all_gatherv)(accel_pg *pg, const void *send, void *recv, const size_t *bytes,
                                int root);
    /* Optional (NULL => dist.c does all_reduce on a private copy of send and
     * keeps block `rank`). send[world*count] -> recv[count]. */
    accel_status (*reduce_scatter)(accel_pg *pg, const void *send, void *recv, size_t count,
                                   accel_dtype dt, accel_reduce_op op);
    /* Optional (NULL => accel_malloc + zero fill; no zero-copy). */
    void *(*alloc_shared)(accel_pg *pg, size_t bytes);
    void (*free_shared)(accel_pg *pg, void *ptr);
} accel__backend;

extern const accel__backend accel__backend_self;
extern const accel__backend accel__backend_shm;
extern const accel__backend accel__backend_tcp;
#ifdef ACCEL_HAVE_MPI
/* init is called with store == NULL: MPI does its own rendezvous and sets
 * pg->rank / pg->size. */
extern const accel__backend accel__backend_mpi;
#endif

#ifdef ACCEL_HAVE_NCCL
/* GPU collectives (ACCEL_DIST_BACKEND=nccl); see nccl.c. */
extern const accel__backend accel__backend_nccl;
#endif

typedef struct accel__work_queue accel__work_queue;

struct accel_pg {
    int rank, size, local_rank, local_size;
    const accel__backend *be;
    void *impl;
    double timeout_s;
    bool debug;
    /* "all_reduce(f32, 1024) [label]": context for timeout/dead-peer messages. */
    char op_desc[192];
    /* After a failure the group is unusable: later calls fail with this. */
    accel_status broken;
    char broken_msg[512];
    accel__work_queue *q; /* async machinery, created on the first async call */
};

/* Reduction kernel: dst_j[i] = op over k of srcs[k][i] for every dst j, i < n.
 * dsts may alias srcs (each block is reduced into a temporary first). AVG
 * divides by `world`. */
void accel__reduce(accel_dtype dt, accel_reduce_op op, int world, int nsrc,
                   const void *const *srcs, int ndst, void *const *dsts, size_t n);
/* "f32", "bf16", ... for messages. */
const char *accel__dtype_short(accel_dtype dt);
bool accel__dtype_reducible(accel_dtype dt);

#endif
