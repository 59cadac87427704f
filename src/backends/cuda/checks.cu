/* Input checks without a host synchronisation (cuda_internal.h: the ids of
 * an embedding, the targets of a cross-entropy).
 *
 * Reading a kernel's verdict back at once would stall the host on the
 * stream every step. Instead the op's kernels skip the bad values (no
 * access outside a tensor), a one-thread kernel copies the first bad one
 * into the device's problem record (the first op to fail keeps it), and an
 * asynchronous copy mirrors the record into pinned host memory. The
 * device's next synchronisation through the backend (synchronize, event
 * synchronize, a synchronous copy: loss.item() is one) reads the mirror and
 * fails with the error naming the op, the position and the value; the
 * record is then cleared. */
#include <pthread.h>

#include "cuda_common.cuh"

typedef struct problem {
    unsigned long long op; /* 0: none; else an accel__cuda_check_op */
    long long position, value, limit;
} problem;

typedef struct problem_slot {
    problem *device;        /* the record */
    volatile problem *host; /* its mirror (pinned) */
} problem_slot;

static problem_slot g_slots[ACCEL_CUDA_MAX_DEVICES];
static pthread_mutex_t g_slots_lock = PTHREAD_MUTEX_INITIALIZER;

/* Device index's slot, made at its first use (NULL with the error set). */
static problem_slot *slot_of(int index, cudaStream_t s) {
    pthread_mutex_lock(&g_slots_lock);
    problem_slot *sl = &g_slots[index];
    if (!sl->device) {
        void *h = NULL;
        problem *d = (problem *)accel__cuda_alloc(index, sizeof(problem), 256);
        cudaError_t e = d ? cudaHostAlloc(&h, sizeof(problem), cudaHostAllocPortable) : cudaSuccess;
        if (d && accel__cuda_check(e, index, "input checks: pinned memory") == ACCEL_OK) {
            memset(h, 0, sizeof(problem));
            e = cudaMemsetAsync(d, 0, sizeof(problem), s);
            if (accel__cuda_check(e, index, "input checks") == ACCEL_OK) {
                sl->device = d;
                sl->host = (volatile problem *)h;
            }
        }
        if (!sl->device) {
            if (d) accel__cuda_free(index, d);
            if (h) cudaFreeHost(h);
        }
    }
    pthread_mutex_unlock(&g_slots_lock);
    return sl->device ? sl : NULL;
}

/* *bad: the first bad position the op's kernels found (INT64_MAX: none). */
__global__ void report_k(problem *rec, unsigned long long op, const long long *bad, const int64_t *values,
                         long long limit) {
    long long pos = *bad;
    if (pos == INT64_MAX || atomicCAS(&rec->op, 0ull, op) != 0ull) return;
    rec->position = pos;
    rec->value = (long long)values[pos];
    rec->limit = limit;
}

extern "C" accel_status accel__cuda_check_report(int index, cudaStream_t s, accel__cuda_check_op op,
                                                 const long long *bad, const int64_t *values, int64_t limit) {
    problem_slot *sl = slot_of(index, s);
    if (!sl) return accel_last_status();
    report_k<<<1, 1, 0, s>>>(sl->device, (unsigned long long)op, bad, values, (long long)limit);
    if (launched(index, accel__cuda_check_op_name(op)) != ACCEL_OK) return accel_last_status();
    return accel__cuda_check(cudaMemcpyAsync((void *)sl->host, sl->device, sizeof(problem), cudaMemcpyDeviceToHost, s),
                             index, accel__cuda_check_op_name(op));
}

extern "C" const char *accel__cuda_check_op_name(accel__cuda_check_op op) {
    switch (op) {
    case ACCEL_CUDA_CHECK_EMBEDDING: return "embedding";
    case ACCEL_CUDA_CHECK_CROSS_ENTROPY: return "cross_entropy";
    default: return "cross_entropy_fused";
    }
}

extern "C" accel_status accel__cuda_check_pending(int index) {
    pthread_mutex_lock(&g_slots_lock);
    problem_slot *sl = &g_slots[index];
    problem p = {0, 0, 0, 0};
    if (sl->host && sl->host->op) {
        p.op = sl->host->op, p.position = sl->host->position, p.value = sl->host->value, p.limit = sl->host->limit;
        sl->host->op = 0;
        cudaSetDevice(index);
        if (cudaMemset(sl->device, 0, sizeof(problem)) != cudaSuccess) cudaGetLastError(); /* a fault: the next call reports it */
    }
    pthread_mutex_unlock(&g_slots_lock);
    if (!p.op) return ACCEL_OK;
    if (p.op == ACCEL_CUDA_CHECK_EMBEDDING)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_embedding: id %lld at position %lld is out of range for %lld embeddings "
                               "(found on cuda:%d by an embedding enqueued before this synchronisation; its output "
                               "rows for bad ids are zeros)",
                               p.value, p.position, p.limit, index);
    return accel_set_error(ACCEL_ERR_INVALID_ARG,
                           "accel_cross_entropy: target %lld at position %lld is out of range for %lld classes (found "
                           "on cuda:%d by a %s enqueued before this synchronisation; its loss skipped that row)",
                           p.value, p.position, p.limit, index, accel__cuda_check_op_name((accel__cuda_check_op)p.op));
}
