/* Collectives on device memory. The process-group backends (tcp, shm, mpi)
 * read and write host memory only, so a tensor on a device whose memory is not
 * host-addressable is staged: copied to a host buffer, communicated there,
 * copied back. On the cpu the tensor's own memory is handed to the group, with
 * no copy. A backend that takes device pointers (NCCL, HCCL) is what removes
 * the staging: ZeRO-3 hands such a group its device buffers
 * (accel__pg_takes_device). Every collective here is stage_to_host, the group's call,
 * stage_end: the one place that decides about copies and frees.
 *
 * The host copy is a lease of the staging pool (core/host_stage.h): pinned
 * memory where the backend has it (cudaMallocHost), so the copies run at full
 * speed, and the same buffers from step to step (a pool slot is allocated
 * once and grown to the largest tensor staged through it), so a training loop
 * allocates no host memory for its collectives after the first step. The
 * whole tensor is staged at once: the group needs every byte in host memory. */
#include <string.h>

#include "accelerator_internal.h"
#include "core/backend.h"
#include "core/host_stage.h"

bool accel__needs_staging(accel_device dev) {
    const accel_backend *b = accel__backend_of(dev);
    return b && !b->host_addressable;
}

bool accel__pg_takes_device(const accel_pg *pg, accel_device dev) {
    return !accel__needs_staging(dev) || (dev.type == ACCEL_DEV_CUDA && !strcmp(accel_pg_backend(pg), "nccl"));
}

void *accel__stage_to_host(const accel_tensor *t, void *scratch, bool fill) {
    if (!accel__needs_staging(t->device)) return accel__host_ptr(t, "accel__stage_to_host");
    size_t bytes = accel_nbytes(t);
    void *host = scratch ? scratch : accel__stage_acquire(t->device, bytes, "accel__stage_to_host");
    if (host && fill && accel__tensor_read_bytes(t, 0, host, bytes) != ACCEL_OK) {
        if (!scratch) accel__stage_release(t->device, host);
        return NULL;
    }
    return host;
}

accel_status accel__stage_end(accel_tensor *t, void *host, accel_status st, bool write_back, bool owned) {
    if (!accel__needs_staging(t->device)) return st;
    accel_status copy = !st && write_back ? accel__tensor_write_bytes(t, 0, host, accel_nbytes(t)) : ACCEL_OK;
    if (owned) accel__stage_release(t->device, host);
    return st ? st : copy;
}

accel_status accel__staged_broadcast(accel_pg *pg, accel_tensor *t, int root) {
    void *host = accel__stage_to_host(t, NULL, true);
    if (!host) return accel_last_status();
    return accel__stage_end(t, host, accel_pg_broadcast(pg, host, (size_t)accel_numel(t), t->dtype, root), true, true);
}

accel_status accel__staged_all_reduce(accel_pg *pg, accel_tensor *t, accel_reduce_op op) {
    void *host = accel__stage_to_host(t, NULL, true);
    if (!host) return accel_last_status();
    return accel__stage_end(t, host, accel_pg_all_reduce(pg, host, (size_t)accel_numel(t), t->dtype, op), true, true);
}

accel_status accel__staged_all_gather(accel_pg *pg, const accel_tensor *send, accel_tensor *recv) {
    void *hsend = accel__stage_to_host(send, NULL, true);
    if (!hsend) return accel_last_status();
    void *hrecv = accel__stage_to_host(recv, NULL, false); /* an output: nothing to copy in */
    accel_status st = hrecv ? accel_pg_all_gather(pg, hsend, hrecv, (size_t)accel_numel(send), send->dtype)
                            : accel_last_status();
    if (hrecv) st = accel__stage_end(recv, hrecv, st, true, true);
    if (accel__needs_staging(send->device)) accel__stage_release(send->device, hsend);
    return st;
}
accel_tensor *accel__flat_view(accel_tensor *h, const accel_flat_buffer *b, void *base, int64_t off, int64_t n) {
    accel__tensor_header(h, (char *)base + (size_t)off * accel_dtype_size(b->dtype), b->dtype, 1, &n, b->device);
    return h;
}

