/* Collectives on device memory. The process-group backends (tcp, shm, mpi)
 * read and write host memory only, so a buffer on a device whose memory is not
 * host-addressable is staged: copied to a host buffer, reduced there, copied
 * back. On the cpu the buffer itself is handed to the group, with no copy. A
 * backend that takes device pointers (NCCL, HCCL) is what removes the staging. */
#include "accelerator_internal.h"
#include "backends/backend.h"

bool accel__needs_staging(accel_device dev) {
    const accel_backend *b = accel__backend_of(dev);
    return b && !b->host_addressable;
}

void *accel__stage_to_host(accel_device dev, const void *p, size_t bytes, void *scratch) {
    if (!accel__needs_staging(dev)) return (void *)p;
    const accel_backend *b = accel__backend_of(dev);
    void *host = scratch ? scratch : accel_malloc(bytes ? bytes : 1);
    if (!host) return NULL;
    if (bytes && b->mem.copy_to_host(dev.index, host, p, bytes)) {
        if (!scratch) accel_free(host);
        return NULL;
    }
    return host;
}

accel_status accel__stage_to_device(accel_device dev, void *p, void *host, size_t bytes, bool write_back,
                                    bool owned) {
    if (host == p) return ACCEL_OK;
    const accel_backend *b = accel__backend_of(dev);
    accel_status st = write_back && bytes ? b->mem.copy_to_device(dev.index, p, host, bytes) : ACCEL_OK;
    if (owned) accel_free(host);
    return st;
}

accel_status accel__staged_broadcast(accel_pg *pg, accel_device dev, void *p, size_t count, accel_dtype dt,
                                     int root) {
    size_t bytes = count * accel_dtype_size(dt);
    void *host = accel__stage_to_host(dev, p, bytes, NULL);
    if (!host) return accel_last_status();
    accel_status st = accel_pg_broadcast(pg, host, count, dt, root);
    accel_status st2 = accel__stage_to_device(dev, p, host, bytes, !st, true);
    return st ? st : st2;
}

accel_status accel__staged_all_reduce(accel_pg *pg, accel_device dev, void *p, size_t count, accel_dtype dt,
                                      accel_reduce_op op) {
    size_t bytes = count * accel_dtype_size(dt);
    void *host = accel__stage_to_host(dev, p, bytes, NULL);
    if (!host) return accel_last_status();
    accel_status st = accel_pg_all_reduce(pg, host, count, dt, op);
    accel_status st2 = accel__stage_to_device(dev, p, host, bytes, !st, true);
    return st ? st : st2;
}

accel_status accel__staged_all_gather(accel_pg *pg, accel_device dev, const void *send, void *recv, size_t count,
                                      accel_dtype dt, int world) {
    size_t bytes = count * accel_dtype_size(dt), all = bytes * (size_t)world;
    void *hsend = accel__stage_to_host(dev, send, bytes, NULL);
    if (!hsend) return accel_last_status();
    void *hrecv = accel__needs_staging(dev) ? accel_malloc(all ? all : 1) : recv;
    accel_status st = hrecv ? accel_pg_all_gather(pg, hsend, hrecv, count, dt) : accel_last_status();
    accel__stage_to_device(dev, (void *)send, hsend, bytes, false, true);
    accel_status st2 = hrecv ? accel__stage_to_device(dev, recv, hrecv, all, !st, true) : ACCEL_OK;
    return st ? st : st2;
}
