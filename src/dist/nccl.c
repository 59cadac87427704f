/* src/dist/nccl.c — the NCCL backend (ACCEL_DIST_BACKEND=nccl): collectives
 * between GPUs, one per rank (cuda:<local_rank mod GPUs of the host>).
 *
 * Rendezvous: rank 0 creates the NCCL unique id and publishes it in the
 * store ("nccl/id"); every rank reads it and joins the communicator.
 *
 * Buffers are device pointers of the rank's GPU; a host pointer (the flat
 * host buffers the layers above use today) is staged through a device
 * buffer of this backend and a pinned host buffer of the same layout
 * (nccl_stage.h: copies between pinned and device memory are asynchronous,
 * so the host returns from enqueueing them and polls the collective, seeing
 * the timeout and a peer's death). Collectives run on a communication stream
 * of their own, ordered after the work already enqueued on the calling thread's
 * compute stream (an event the communication stream waits for), and the
 * compute stream waits for the collective in turn. The call returns when the
 * collective has finished (dist.c's contract), polling its event.
 *
 * Asynchronous calls on device buffers are stream-ordered (accel__stream_ops,
 * as torch's ProcessGroupNCCL): dist.c enqueues them from the calling thread,
 * after an event on that thread's current stream, and the end of each is an
 * event of its own (a ticket, from a pool); wait makes the caller's current
 * stream wait for it. Host buffers keep the communication thread.
 *
 * Errors: the communicator is non-blocking, so a dead or stuck peer never
 * hangs the caller: the poll checks ncclCommGetAsyncError and the group
 * timeout (ACCEL_DIST_TIMEOUT); on either the communicator is aborted
 * (ncclCommAbort) and the error names the collective, the rank and the cause.
 *
 * Compiled when CMake finds CUDA and NCCL (ACCEL_HAVE_NCCL). */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_calls.h"
#include "backends/cuda/cuda_internal.h"
#include "dist/backend.h"
#include "dist/nccl_stage.h"

typedef struct nccl_state {
    ncclComm_t comm;
    int device;
    cudaStream_t stream;
    cudaEvent_t before, after;
    accel__nccl_stage st; /* the staging of host pointers */
    bool aborted;  /* comm is then NULL: ncclCommAbort freed it */
    bool deferred; /* between stream begin and end: a collective enqueues only */
    cudaEvent_t *spare; /* the tickets released, for the next stream-ordered calls */
    int n_spare, cap_spare;
} nccl_state;

static nccl_state *state_of(accel_pg *pg) { return pg->impl; }

static accel_status nccl_fail(accel_pg *pg, const char *what, const char *why) {
    return accel_set_error(ACCEL_ERR_DIST, "accel dist (nccl): %s failed on rank %d: %s: %s", pg->op_desc, pg->rank,
                           what, why);
}

static accel_status cuda_fail(accel_pg *pg, const char *what, cudaError_t e) {
    cudaGetLastError();
    return nccl_fail(pg, what, cudaGetErrorString(e));
}

/* ncclCommAbort frees the communicator: it is aborted once, never used after. */
static void abort_comm(nccl_state *s) {
    if (s->comm && !s->aborted) ncclCommAbort(s->comm);
    s->comm = NULL;
    s->aborted = true;
}

/* One look at the communicator and at `ev` (NULL: the communicator only):
 * *done once the communicator has left ncclInProgress (init and enqueues of
 * a non-blocking communicator) and ev has completed. false on a failure
 * (the communicator is then aborted), *what and *why naming it. */
static bool poll_once(nccl_state *s, cudaEvent_t ev, bool *done, const char **what, const char **why) {
    *done = false;
    *what = "communicator";
    *why = "aborted by an earlier failure";
    if (s->aborted) return false;
    ncclResult_t async = ncclSuccess, r = ncclCommGetAsyncError(s->comm, &async);
    cudaError_t e = cudaSuccess;
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        *what = "communicator error (a peer died or failed; communicator aborted)";
        *why = ncclGetErrorString(r != ncclSuccess ? r : async);
    } else if (async == ncclInProgress || (ev && (e = accel__cuda_event_poll(ev)) == cudaErrorNotReady)) {
        return true;
    } else if (e != cudaSuccess) {
        cudaGetLastError();
        *what = "waiting for the collective (communicator aborted)";
        *why = cudaGetErrorString(e);
    } else {
        *done = true;
        return true;
    }
    abort_comm(s);
    return false;
}

/* Waits for the communicator to leave ncclInProgress or for `ev` to
 * complete, within the timeout. */
static accel_status wait_done(accel_pg *pg, cudaEvent_t ev) {
    nccl_state *s = state_of(pg);
    double start = accel_now_seconds();
    for (unsigned spins = 0;; spins++) {
        bool done;
        const char *what, *why;
        if (!poll_once(s, ev, &done, &what, &why)) return nccl_fail(pg, what, why);
        if (done) return ACCEL_OK;
        double el = accel_now_seconds() - start;
        if (el > pg->timeout_s) {
            abort_comm(s);
            return accel_set_error(ACCEL_ERR_TIMEOUT,
                                   "accel dist (nccl): %s timed out after %g s on rank %d (communicator aborted; "
                                   "ACCEL_DEBUG_MODE=1 names each rank's call; ACCEL_DIST_TIMEOUT sets the limit)",
                                   pg->op_desc, pg->timeout_s, pg->rank);
        }
        accel__poll_pause(spins, el);
    }
}

/* A non-blocking communicator may answer ncclInProgress: the call completes
 * (or fails) asynchronously, and the next call waits for it. */
static accel_status check_nccl(accel_pg *pg, ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return ACCEL_OK;
    if (r == ncclInProgress) return wait_done(pg, NULL);
    abort_comm(state_of(pg));
    return nccl_fail(pg, what, ncclGetErrorString(r));
}

static accel_status nccl_init(accel_pg *pg, accel__store *store) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel dist (nccl): rank %d has no CUDA device (%s)", pg->rank,
                               accel__cuda_unavailable_reason());
    }
    nccl_state *s = accel_calloc(1, sizeof *s);
    if (!s) return accel_set_error(ACCEL_ERR_OOM, "accel dist (nccl): out of memory");
    pg->impl = s;
    s->device = pg->local_rank % ndev;
    cudaSetDevice(s->device);
    ncclUniqueId id;
    if (pg->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return nccl_fail(pg, "ncclGetUniqueId", ncclGetErrorString(r));
        if (accel__store_set(store, "nccl/id", &id, sizeof id) != ACCEL_OK) return accel_last_status();
    } else {
        void *v;
        size_t len = 0;
        if (accel__store_get(store, "nccl/id", &v, &len) != ACCEL_OK) return accel_last_status();
        if (len != sizeof id) {
            accel_free(v);
            return nccl_fail(pg, "rendezvous", "the NCCL id in the store has the wrong size");
        }
        memcpy(&id, v, sizeof id);
        accel_free(v);
    }
    cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->before, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->after, cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_fail(pg, "creating the communication stream", e);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* asynchronous errors and timeouts instead of hangs */
    if (check_nccl(pg, ncclCommInitRankConfig(&s->comm, pg->size, id, pg->rank, &cfg), "ncclCommInitRank") != ACCEL_OK)
        return accel_last_status();
    return wait_done(pg, NULL);
}

static void nccl_finalize(accel_pg *pg) {
    nccl_state *s = state_of(pg);
    if (!s) return;
    cudaSetDevice(s->device);
    if (s->comm) {
        if (pg->broken) ncclCommAbort(s->comm);
        else ncclCommDestroy(s->comm);
    }
    for (int i = 0; i < s->n_spare; i++) cudaEventDestroy(s->spare[i]);
    accel_free(s->spare);
    accel__nccl_stage_free(&s->st);
    if (s->after) cudaEventDestroy(s->after);
    if (s->before) cudaEventDestroy(s->before);
    if (s->stream) cudaStreamDestroy(s->stream);
    accel_free(s);
    pg->impl = NULL;
}

/* ---- buffers */

/* The staging buffers (device and pinned host), on the rank's GPU whichever
 * device the calling thread (the group's communication thread for
 * asynchronous work) last used. Returns the device one. */
static char *stage(accel_pg *pg, size_t bytes) {
    nccl_state *s = state_of(pg);
    cudaSetDevice(s->device);
    cudaError_t e = accel__nccl_stage_reserve(&s->st, bytes);
    if (e == cudaSuccess) return s->st.dev;
    cuda_fail(pg, "allocating the staging buffers", e);
    return NULL;
}

/* The communication stream waits for the caller's compute stream. */
static accel_status begin(accel_pg *pg) {
    nccl_state *s = state_of(pg);
    if (s->aborted) return nccl_fail(pg, "communicator", "aborted by an earlier failure");
    cudaStream_t compute = accel__cuda_enter(s->device);
    cudaError_t e = cudaEventRecord(s->before, compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s->stream, s->before, 0);
    return e == cudaSuccess ? ACCEL_OK : cuda_fail(pg, "ordering after the compute stream", e);
}

/* The compute stream waits for the collective; the host waits for it too.
 * Stream-ordered (deferred): nothing, stream_end records the ticket. */
static accel_status end(accel_pg *pg) {
    nccl_state *s = state_of(pg);
    if (s->deferred) return ACCEL_OK;
    cudaError_t e = cudaEventRecord(s->after, s->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(accel__cuda_enter(s->device), s->after, 0);
    if (e != cudaSuccess) return cuda_fail(pg, "ordering the compute stream after the collective", e);
    return wait_done(pg, s->after);
}

/* The staging copies on the communication stream (nccl_stage.h), failures named. */
static accel_status staged(accel_pg *pg, cudaError_t e) {
    return e == cudaSuccess ? ACCEL_OK : cuda_fail(pg, "staging copy", e);
}

static accel_status put(accel_pg *pg, size_t off, const void *src, size_t n) {
    nccl_state *s = state_of(pg);
    return staged(pg, accel__nccl_put(&s->st, s->stream, off, src, n));
}

static accel_status get(accel_pg *pg, void *dst, size_t off, size_t n) {
    nccl_state *s = state_of(pg);
    return staged(pg, accel__nccl_get(&s->st, s->stream, dst, off, n));
}

/* The output into a host dst once the collective has ended (`ended`). */
static accel_status take(accel_pg *pg, accel_status ended, void *dst, size_t off, size_t n) {
    if (ended == ACCEL_OK) accel__nccl_take(&state_of(pg)->st, dst, off, n);
    return ended;
}

static bool nccl_type(accel_dtype dt, ncclDataType_t *t) {
    switch (dt) {
    case ACCEL_F32: *t = ncclFloat32; return true;
    case ACCEL_F64: *t = ncclFloat64; return true;
    case ACCEL_F16: *t = ncclFloat16; return true;
    case ACCEL_BF16: *t = ncclBfloat16; return true;
    case ACCEL_I32: *t = ncclInt32; return true;
    case ACCEL_I64: *t = ncclInt64; return true;
    case ACCEL_U8: *t = ncclUint8; return true;
    case ACCEL_I8: *t = ncclInt8; return true;
    default: return false;
    }
}

/* NCCL has no 16-bit integer: int16 is refused before the call, as torch's
 * ProcessGroupNCCL refuses it (its ncclDataType map has no Short). */
static bool nccl_reducible(accel_dtype dt) {
    ncclDataType_t t;
    return nccl_type(dt, &t);
}

static ncclRedOp_t nccl_op(accel_reduce_op op) {
    switch (op) {
    case ACCEL_REDUCE_AVG: return ncclAvg;
    case ACCEL_REDUCE_MAX: return ncclMax;
    case ACCEL_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* ---- collectives */

static accel_status nccl_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt, accel_reduce_op op) {
    nccl_state *s = state_of(pg);
    ncclDataType_t t;
    if (!nccl_type(dt, &t)) return nccl_fail(pg, "all_reduce", "dtype not reducible by NCCL");
    size_t bytes = count * accel_dtype_size(dt);
    bool dev = accel__nccl_on_device(buf);
    void *d = dev ? buf : (void *)stage(pg, bytes);
    if (!d || begin(pg) != ACCEL_OK) return accel_last_status();
    if (!dev && put(pg, 0, buf, bytes) != ACCEL_OK) return accel_last_status();
    if (check_nccl(pg, ncclAllReduce(d, d, count, t, nccl_op(op), s->comm, s->stream), "ncclAllReduce") != ACCEL_OK)
        return accel_last_status();
    if (dev) return end(pg);
    if (get(pg, buf, 0, bytes) != ACCEL_OK) return accel_last_status();
    return take(pg, end(pg), buf, 0, bytes);
}

static accel_status nccl_broadcast(accel_pg *pg, void *buf, size_t bytes, int root) {
    nccl_state *s = state_of(pg);
    bool dev = accel__nccl_on_device(buf);
    void *d = dev ? buf : (void *)stage(pg, bytes);
    if (!d || begin(pg) != ACCEL_OK) return accel_last_status();
    if (!dev && pg->rank == root && put(pg, 0, buf, bytes) != ACCEL_OK)
        return accel_last_status();
    if (check_nccl(pg, ncclBroadcast(d, d, bytes, ncclUint8, root, s->comm, s->stream), "ncclBroadcast") != ACCEL_OK)
        return accel_last_status();
    if (dev) return end(pg);
    if (get(pg, buf, 0, bytes) != ACCEL_OK) return accel_last_status();
    return take(pg, end(pg), buf, 0, bytes);
}

static accel_status nccl_barrier(accel_pg *pg) {
    nccl_state *s = state_of(pg);
    char *d = stage(pg, sizeof(float));
    if (!d || begin(pg) != ACCEL_OK) return accel_last_status();
    if (check_nccl(pg, ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, s->comm, s->stream), "barrier") != ACCEL_OK)
        return accel_last_status();
    return end(pg);
}

/* Variable sizes: NCCL has no all-gatherv, so one grouped broadcast per rank
 * (every rank receives) or grouped send/recv to the root. */
static accel_status nccl_all_gatherv(accel_pg *pg, const void *send, void *recv, const size_t *bytes, int root) {
    nccl_state *s = state_of(pg);
    size_t total = 0;
    for (int k = 0; k < pg->size; k++) total += bytes[k];
    bool receives = root < 0 || pg->rank == root;
    bool dev = accel__nccl_on_device(send) && (!receives || accel__nccl_on_device(recv));
    char *d = dev ? NULL : stage(pg, total + bytes[pg->rank]);
    if ((!dev && !d) || begin(pg) != ACCEL_OK) return accel_last_status();
    const char *dsend = dev ? send : d + total;
    char *drecv = dev ? recv : d;
    if (!dev && put(pg, total, send, bytes[pg->rank]) != ACCEL_OK)
        return accel_last_status();
    accel_status st = check_nccl(pg, ncclGroupStart(), "ncclGroupStart");
    size_t off = 0;
    for (int k = 0; k < pg->size && st == ACCEL_OK; off += bytes[k], k++) {
        if (root < 0) {
            const void *src = k == pg->rank ? dsend : drecv + off;
            st = check_nccl(pg, ncclBroadcast(src, drecv + off, bytes[k], ncclUint8, k, s->comm, s->stream),
                            "ncclBroadcast");
        } else if (pg->rank == root && k != root) {
            st = check_nccl(pg, ncclRecv(drecv + off, bytes[k], ncclUint8, k, s->comm, s->stream), "ncclRecv");
        } else if (pg->rank == root) {
            st = staged(pg, accel__nccl_copy(s->stream, drecv + off, dsend, bytes[k]));
        } else if (k == pg->rank) {
            st = check_nccl(pg, ncclSend(dsend, bytes[k], ncclUint8, root, s->comm, s->stream), "ncclSend");
        }
    }
    if (check_nccl(pg, ncclGroupEnd(), "ncclGroupEnd") != ACCEL_OK || st != ACCEL_OK) return accel_last_status();
    if (dev || !receives) return end(pg);
    if (get(pg, recv, 0, total) != ACCEL_OK) return accel_last_status();
    return take(pg, end(pg), recv, 0, total);
}

static accel_status nccl_reduce_scatter(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt,
                                        accel_reduce_op op) {
    nccl_state *s = state_of(pg);
    ncclDataType_t t;
    if (!nccl_type(dt, &t)) return nccl_fail(pg, "reduce_scatter", "dtype not reducible by NCCL");
    size_t bytes = count * accel_dtype_size(dt), all = bytes * (size_t)pg->size;
    bool dev = accel__nccl_on_device(send) && accel__nccl_on_device(recv);
    char *d = dev ? NULL : stage(pg, all + bytes);
    if ((!dev && !d) || begin(pg) != ACCEL_OK) return accel_last_status();
    const void *dsend = dev ? send : d;
    void *drecv = dev ? recv : d + all;
    if (!dev && put(pg, 0, send, all) != ACCEL_OK) return accel_last_status();
    if (check_nccl(pg, ncclReduceScatter(dsend, drecv, count, t, nccl_op(op), s->comm, s->stream),
                   "ncclReduceScatter") != ACCEL_OK)
        return accel_last_status();
    if (dev) return end(pg);
    if (get(pg, recv, all, bytes) != ACCEL_OK) return accel_last_status();
    return take(pg, end(pg), recv, all, bytes);
}

/* ---- stream-ordered asynchronous collectives (backend.h, accel__stream_ops) */

/* Device memory on both sides (send NULL: in place). */
static bool stream_takes(accel_pg *pg, const void *send, const void *recv) {
    (void)pg;
    return recv && accel__nccl_on_device(recv) && (!send || accel__nccl_on_device(send));
}

/* A ticket is an event (a spare one when there is). */
static void *stream_begin(accel_pg *pg) {
    nccl_state *s = state_of(pg);
    cudaSetDevice(s->device);
    cudaEvent_t ev = NULL;
    if (s->n_spare > 0) {
        ev = s->spare[--s->n_spare];
    } else {
        cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            cuda_fail(pg, "creating the collective's event", e);
            return NULL;
        }
    }
    s->deferred = true;
    return ev;
}

static accel_status stream_end(accel_pg *pg, void *ticket) {
    nccl_state *s = state_of(pg);
    s->deferred = false;
    cudaError_t e = cudaEventRecord((cudaEvent_t)ticket, s->stream);
    return e == cudaSuccess ? ACCEL_OK : cuda_fail(pg, "recording the end of the collective", e);
}

static accel_status stream_query(accel_pg *pg, void *ticket, bool *done) {
    const char *what, *why;
    if (poll_once(state_of(pg), (cudaEvent_t)ticket, done, &what, &why)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_DIST, "%s: %s", what, why);
}

static accel_status stream_join(accel_pg *pg, void *ticket) {
    nccl_state *s = state_of(pg);
    cudaError_t e = cudaStreamWaitEvent(accel__cuda_enter(s->device), (cudaEvent_t)ticket, 0);
    if (e == cudaSuccess) return ACCEL_OK;
    cudaGetLastError();
    return accel_set_error(ACCEL_ERR_DIST, "ordering the caller's stream after the collective: %s",
                           cudaGetErrorString(e));
}

static void stream_abort(accel_pg *pg) { abort_comm(state_of(pg)); }

static void stream_release(accel_pg *pg, void *ticket) {
    nccl_state *s = state_of(pg);
    if (s->n_spare == s->cap_spare) {
        int cap = s->cap_spare ? 2 * s->cap_spare : 16;
        cudaEvent_t *grown = accel_malloc((size_t)cap * sizeof *grown);
        if (!grown) {
            cudaEventDestroy((cudaEvent_t)ticket);
            return;
        }
        if (s->n_spare) memcpy(grown, s->spare, (size_t)s->n_spare * sizeof *grown);
        accel_free(s->spare);
        s->spare = grown;
        s->cap_spare = cap;
    }
    s->spare[s->n_spare++] = (cudaEvent_t)ticket;
}

static const accel__stream_ops nccl_stream = {
    .takes = stream_takes,
    .begin = stream_begin,
    .end = stream_end,
    .query = stream_query,
    .join = stream_join,
    .abort = stream_abort,
    .release = stream_release,
};

const accel__backend accel__backend_nccl = {
    .name = "nccl",
    .init = nccl_init,
    .finalize = nccl_finalize,
    .barrier = nccl_barrier,
    .all_reduce = nccl_all_reduce,
    .reducible = nccl_reducible,
    .broadcast = nccl_broadcast,
    .all_gatherv = nccl_all_gatherv,
    .reduce_scatter = nccl_reduce_scatter,
    .stream = &nccl_stream,
};
