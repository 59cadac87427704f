/*
 * accel/dist.h — process groups and collectives (the torch.distributed of accel).
 *
 * A process-wide default group is initialised from the environment that
 * `accel launch`, torchrun, mpirun or SLURM set (see docs/dist.md for the
 * contract). With nothing set, the process is a group of one and every
 * collective is a local copy, so code written for N processes runs unchanged.
 *
 *     if (accel_dist_init() != ACCEL_OK) { fprintf(stderr, "%s\n", accel_last_error()); exit(1); }
 *     accel_pg *pg = accel_dist_default_group();
 *     float *g = accel_pg_alloc_shared(pg, n * sizeof(float));   // zero-copy buffer
 *     accel_work *w = accel_pg_all_reduce_async(pg, g, n, ACCEL_F32, ACCEL_REDUCE_AVG);
 *     ... overlap ...
 *     accel_status st = accel_work_wait(w); accel_work_free(w);
 *     accel_pg_free_shared(pg, g);
 *     accel_dist_finalize();
 *
 * Rules shared by every collective:
 *   - every rank of the group calls the same collectives in the same order
 *     with matching dtype/count/root (debug mode checks this and names each
 *     rank's call when they differ);
 *   - one thread issues the collectives of a group; asynchronous calls
 *     complete in issue order, and a synchronous call first waits for the
 *     asynchronous calls issued before it (stream-ordered ones, below: it
 *     runs after them on the device);
 *   - every wait is bounded by ACCEL_DIST_TIMEOUT seconds (default 300); a
 *     timeout gives ACCEL_ERR_TIMEOUT naming the ranks that did not arrive, a
 *     dead peer gives ACCEL_ERR_DIST naming it. After such a failure the group
 *     is broken: every later collective fails at once with the first message.
 *   - buffers are the caller's; nothing is retained after the call (or after
 *     accel_work_wait for asynchronous calls).
 */
#ifndef ACCEL_DIST_H
#define ACCEL_DIST_H

#include "accel/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct accel_pg accel_pg;
typedef struct accel_work accel_work;

typedef enum accel_reduce_op {
    ACCEL_REDUCE_SUM = 0,
    ACCEL_REDUCE_AVG, /* sum / world_size; integers divide truncating toward zero */
    ACCEL_REDUCE_MAX,
    ACCEL_REDUCE_MIN,
} accel_reduce_op;

/* ------------------------------------------------------------ default group */

/* Takes a reference to the default group, creating it on the first call:
 * reads the environment, rendezvous with the other ranks (TCP store at
 * MASTER_ADDR:MASTER_PORT served by rank 0) and picks a backend. A single
 * process when no rank variables are set. Every successful call is paired
 * with one accel_dist_finalize; each accelerator holds its own reference, so
 * accelerators and direct users of the group may be freed in any order. */
accel_status accel_dist_init(void);
/* Drops one reference; the last one runs a barrier and tears the default
 * group down (no-op when no reference is held). */
void accel_dist_finalize(void);
bool accel_dist_is_initialized(void);
/* Before init these read the environment; never fail (0/1 when nothing set). */
int accel_dist_rank(void);
int accel_dist_world_size(void);
int accel_dist_local_rank(void);
int accel_dist_local_world_size(void);
/* ACCEL_DEBUG_MODE / ACCELERATE_DEBUG_MODE is 1/true/yes (case-insensitive). */
bool accel_dist_debug_mode(void);
/* The default group (NULL + ACCEL_ERR_STATE before accel_dist_init). */
accel_pg *accel_dist_default_group(void);

/* Names the next collectives issued by this thread in debug-mode reports and
 * timeout messages (e.g. "gather_for_metrics"); NULL clears. Copied (47 chars). */
void accel_dist_set_op_label(const char *label);

/* ------------------------------------------------------------ subgroups */

/* Splits `parent` as MPI_Comm_split does (collective over parent: every rank
 * calls it, in the same order as its other collectives): the ranks passing
 * the same `color` form a new group, ranked by `key` then by parent rank.
 * Its members on one machine talk through shared memory, across machines
 * through tcp; a subgroup of one is a local group. The caller owns the result
 * (accel_pg_free); NULL + error on failure (every member then fails, none
 * hangs past ACCEL_DIST_TIMEOUT). The parent's backend must be shm, tcp or self. */
accel_pg *accel_pg_split(accel_pg *parent, int color, int key);
/* Waits for its asynchronous work, a final barrier (collective over pg), frees
 * it. NULL and the default group (accel_dist_finalize's) are no-ops. */
void accel_pg_free(accel_pg *pg);

/* ------------------------------------------------------------ group queries */

int accel_pg_rank(const accel_pg *pg);
int accel_pg_size(const accel_pg *pg);
const char *accel_pg_backend(const accel_pg *pg); /* "self", "shm", ... */

/* Memory that every rank of the group maps (64-byte aligned, zero-filled,
 * pages already touched). An all_reduce whose buffer comes from here on every
 * rank is reduced in place with no copy in or out. Works on every backend
 * (plain accel_malloc memory where nothing is shared). NULL + error on OOM.
 * Free with accel_pg_free_shared before the group is finalized. */
void *accel_pg_alloc_shared(accel_pg *pg, size_t bytes);
void accel_pg_free_shared(accel_pg *pg, void *ptr);

/* ------------------------------------------------------------ collectives
 * count = elements. Reductions: f32, bf16, f16 (reduced in f32), f64, i32,
 * i64, i16, i8, u8 (integer sums wrap, as torch's; NCCL has no i16). Data movement (broadcast/gather):
 * any dtype. */

/* In place on every rank. */
accel_status accel_pg_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt,
                                 accel_reduce_op op);
/* buf[count] from root to every rank. */
accel_status accel_pg_broadcast(accel_pg *pg, void *buf, size_t count, accel_dtype dt, int root);
/* recv[world * count] = every rank's send[count], in rank order. */
accel_status accel_pg_all_gather(accel_pg *pg, const void *send, void *recv, size_t count,
                                 accel_dtype dt);
/* Uneven: rank r contributes counts[r] elements (send_count must equal
 * counts[rank]); recv holds sum(counts), in rank order. */
accel_status accel_pg_all_gatherv(accel_pg *pg, const void *send, size_t send_count, void *recv,
                                  const size_t *counts, accel_dtype dt);
/* send[world * count]; rank r receives recv[count] = reduce over ranks of
 * block r of send. */
accel_status accel_pg_reduce_scatter(accel_pg *pg, const void *send, void *recv, size_t count,
                                     accel_dtype dt, accel_reduce_op op);
/* recv[world * count] on root (recv may be NULL elsewhere). */
accel_status accel_pg_gather(accel_pg *pg, const void *send, void *recv, size_t count,
                             accel_dtype dt, int root);
accel_status accel_pg_barrier(accel_pg *pg);

/* All-to-all (torch's all_to_all_single with even splits): send[world * count]
 * holds one block of count elements per rank; block k goes to rank k, and
 * recv[world * count] receives, as its block k, rank k's block `rank`. Any
 * dtype; send and recv must not overlap. Native on shm (one exchange through
 * the shared segment); elsewhere world rooted all_gatherv rounds (the k-th
 * gathers every rank's block k onto rank k), with the same errors, timeout
 * and dead-peer reports as every collective. */
accel_status accel_pg_all_to_all(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt);

/* Objects as byte blobs. broadcast_bytes: on root (*data, *len) are the input
 * (unchanged); elsewhere *data receives an accel_malloc'd (accel_free()) copy and *len its
 * length. all_gather_bytes: *out receives an accel_malloc'd (accel_free()) concatenation
 * of every rank's blob in rank order, lens[world] each blob's length. */
accel_status accel_pg_broadcast_bytes(accel_pg *pg, void **data, size_t *len, int root);
accel_status accel_pg_all_gather_bytes(accel_pg *pg, const void *data, size_t len, void **out,
                                       size_t *lens);

/* ------------------------------------------------------------ asynchronous
 * Run on the group's communication thread, in issue order. NULL + error when
 * the arguments are invalid (nothing was issued). The buffers must stay valid
 * and untouched until accel_work_wait returns.
 * On device buffers of a group that takes them (nccl on cuda) the call is
 * instead enqueued at once from the calling thread on the group's
 * communication stream, ordered after the work already on the caller's
 * current stream, as torch's ProcessGroupNCCL does (docs/dist.md
 * "Asynchronous work"); such work is waited for, polled and freed on the
 * thread that issues the group's collectives. */
accel_work *accel_pg_all_reduce_async(accel_pg *pg, void *buf, size_t count, accel_dtype dt,
                                      accel_reduce_op op);
accel_work *accel_pg_broadcast_async(accel_pg *pg, void *buf, size_t count, accel_dtype dt,
                                     int root);
accel_work *accel_pg_all_gather_async(accel_pg *pg, const void *send, void *recv, size_t count,
                                      accel_dtype dt);
accel_work *accel_pg_reduce_scatter_async(accel_pg *pg, const void *send, void *recv,
                                          size_t count, accel_dtype dt, accel_reduce_op op);
/* Blocks until done; returns its status and raises its error on this thread.
 * May be called more than once. Stream-ordered work: the caller's current
 * stream first waits for it, then the host does. */
accel_status accel_work_wait(accel_work *w);
/* true when finished (never blocks). Polls stream-ordered work, which it may
 * finish (a failure or the timeout is then wait's status). */
bool accel_work_done(accel_work *w);
/* Waits if still running, then frees. NULL is a no-op. A work may outlive
 * its group (accel_pg_free waits for it): wait on it and free it after. */
void accel_work_free(accel_work *w);

/* ------------------------------------------------------------ point to point
 * Between two ranks of a group (the pipeline's activations and gradients):
 * not collective, only the two ranks call. Messages from one rank to another
 * arrive in the order they were sent; any dtype; count elements on both
 * sides. The receiver's count and dtype must be the sender's: a difference
 * fails the receive naming both calls ("rank 1's recv(f32, 4) from rank 0 at
 * t.c:9 got rank 0's send(f32, 8) at t.c:5"), and the sender at its next
 * call to that peer (tcp: at once). A peer that is the caller itself or not
 * a rank of the group is refused (ACCEL_ERR_INVALID_ARG).
 *
 * accel_pg_send may return before the receiver takes the data (a message up
 * to the backend's chunk - ACCEL_SHM_CHUNK_KB, the socket buffer on tcp -
 * is buffered) or wait until it does, as MPI_Send: two ranks that send to
 * each other use accel_pg_send_recv, which progresses both directions at
 * once (MPI_Sendrecv), so an exchange never deadlocks. Every wait is bounded
 * by ACCEL_DIST_TIMEOUT; a dead peer fails naming it; a failure breaks the
 * group as for the collectives. A synchronous call: it first waits for the
 * group's asynchronous collectives. Backends: shm, tcp, mpi (a hierarchical
 * group over its flat tcp ring); self has no peer; nccl refuses. */
accel_status accel_pg_send(accel_pg *pg, const void *buf, size_t count, accel_dtype dt, int dst);
accel_status accel_pg_recv(accel_pg *pg, void *buf, size_t count, accel_dtype dt, int src);
/* Sends send[send_count] to dst while receiving recv[recv_count] from src
 * (both dt). dst or src may be -1: no send, no receive (MPI_PROC_NULL), so a
 * pipeline's first and last stages make the same call as the others. dst and
 * src may be the same peer. */
accel_status accel_pg_send_recv(accel_pg *pg, const void *send, size_t send_count, int dst, void *recv,
                                size_t recv_count, int src, accel_dtype dt);

/* ------------------------------------------------------------ call sites
 * Mismatch and timeout reports name each rank's call and where it was made
 * ("#3 all_reduce(f32, 1024) at train.c:42"), always, not only in debug
 * mode. The collectives above (and the Accelerator's, accel/accelerator.h)
 * are macros that record __FILE__/__LINE__ first; the functions themselves
 * keep their names and work through a function pointer, or in parentheses:
 * (accel_pg_barrier)(pg). Define ACCEL_NO_CALL_SITES before including to
 * get the plain functions. A site stays the thread's until the next one is
 * recorded; `file` must be a string that outlives the call (a literal).
 *
 * The ranks of a collective also compare their call sites, always: one
 * reached from another line on some rank (same kind and arguments) fails
 * every rank at once as a mismatch naming each rank's site - a collective
 * skipped on some ranks otherwise completes with the wrong partner and hangs
 * later. A program that makes one call from different lines on purpose
 * (an if/else with the same broadcast or load_state on both sides) calls
 * accel_dist_allow_other_call_sites() just before it, on any rank: it
 * applies to the thread's next call and every collective that call issues
 * (main_process_first uses it inside). ACCEL_DIST_CHECK_CALL_SITES=0 turns
 * the comparison off for the job. */
void accel_dist_set_call_site(const char *file, int line);
void accel_dist_allow_other_call_sites(void);

#if !defined(ACCEL_NO_CALL_SITES) && !defined(ACCEL__INSIDE_LIBRARY)
#define ACCEL_AT_CALL_SITE(...) (accel_dist_set_call_site(__FILE__, __LINE__), __VA_ARGS__)
#define accel_pg_all_reduce(...) ACCEL_AT_CALL_SITE(accel_pg_all_reduce(__VA_ARGS__))
#define accel_pg_broadcast(...) ACCEL_AT_CALL_SITE(accel_pg_broadcast(__VA_ARGS__))
#define accel_pg_all_gather(...) ACCEL_AT_CALL_SITE(accel_pg_all_gather(__VA_ARGS__))
#define accel_pg_all_gatherv(...) ACCEL_AT_CALL_SITE(accel_pg_all_gatherv(__VA_ARGS__))
#define accel_pg_reduce_scatter(...) ACCEL_AT_CALL_SITE(accel_pg_reduce_scatter(__VA_ARGS__))
#define accel_pg_gather(...) ACCEL_AT_CALL_SITE(accel_pg_gather(__VA_ARGS__))
#define accel_pg_barrier(...) ACCEL_AT_CALL_SITE(accel_pg_barrier(__VA_ARGS__))
#define accel_pg_all_to_all(...) ACCEL_AT_CALL_SITE(accel_pg_all_to_all(__VA_ARGS__))
#define accel_pg_broadcast_bytes(...) ACCEL_AT_CALL_SITE(accel_pg_broadcast_bytes(__VA_ARGS__))
#define accel_pg_all_gather_bytes(...) ACCEL_AT_CALL_SITE(accel_pg_all_gather_bytes(__VA_ARGS__))
#define accel_pg_all_reduce_async(...) ACCEL_AT_CALL_SITE(accel_pg_all_reduce_async(__VA_ARGS__))
#define accel_pg_broadcast_async(...) ACCEL_AT_CALL_SITE(accel_pg_broadcast_async(__VA_ARGS__))
#define accel_pg_all_gather_async(...) ACCEL_AT_CALL_SITE(accel_pg_all_gather_async(__VA_ARGS__))
#define accel_pg_reduce_scatter_async(...) ACCEL_AT_CALL_SITE(accel_pg_reduce_scatter_async(__VA_ARGS__))
#define accel_dist_finalize() ACCEL_AT_CALL_SITE(accel_dist_finalize())
/* point to point: the site names the call in mismatch and timeout reports */
#define accel_pg_send(...) ACCEL_AT_CALL_SITE(accel_pg_send(__VA_ARGS__))
#define accel_pg_recv(...) ACCEL_AT_CALL_SITE(accel_pg_recv(__VA_ARGS__))
#define accel_pg_send_recv(...) ACCEL_AT_CALL_SITE(accel_pg_send_recv(__VA_ARGS__))
#endif

/* ------------------------------------------------------------ build info
 * For `accel env`: static strings describing this build. */
typedef enum accel_build_info_kind {
    ACCEL_INFO_VERSION = 0,
    ACCEL_INFO_COMPILER,    /* "GNU 12.2.0" */
    ACCEL_INFO_FLAGS,        /* C flags of the library build */
    ACCEL_INFO_BLAS,        /* openblas_get_config() */
    ACCEL_INFO_BLAS_THREADS,/* "2" */
    ACCEL_INFO_DIST_BACKENDS, /* "self, shm" (+ "mpi" when compiled in) */
} accel_build_info_kind;
const char *accel_build_info(accel_build_info_kind which);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_DIST_H */
