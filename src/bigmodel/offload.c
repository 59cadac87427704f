/* src/bigmodel/offload.c — the weights map of a dispatched model: offloaded
 * parameters are brought in just before their module runs and dropped after
 * (Accelerate's AlignDevicesHook with offload=True, §7.10–7.11). Instead of
 * Accelerate's offload folder of .dat files, "disk" weights are read in place
 * from the mapped safetensors checkpoint: no copy is written anywhere. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bigmodel/offload_internal.h"
#include "core/core_internal.h"
#include "core/host_stage.h"

void accel__release_pages(const void *p, size_t n) {
    if (!p || !n) return;
    /* Outward rounding is safe: the mapping is private and never written, so
     * a dropped page is simply read again from the file on its next use. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(page - 1);
    uintptr_t b = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

int accel__off_add(accel_dispatched *d, accel_tensor *t, const char *name, accel__off_kind kind,
                   const void *src, accel_dtype src_dtype, size_t src_bytes) {
    if (d->n_off == d->cap_off) {
        int cap = d->cap_off ? d->cap_off * 2 : 64;
        accel__off_entry *e = accel_malloc(sizeof *e * (size_t)cap);
        accel_tensor **dropping = accel_malloc(sizeof *dropping * (size_t)cap);
        if (!e || !dropping) {
            accel_free(e);
            accel_free(dropping);
            return -1;
        }
        if (d->n_off) memcpy(e, d->off, sizeof *e * (size_t)d->n_off);
        accel_free(d->off);
        accel_free(d->dropping);
        d->off = e;
        d->dropping = dropping;
        d->cap_off = cap;
    }
    char *nm = accel_strdup(name);
    if (!nm) return -1;
    d->off[d->n_off] = (accel__off_entry){.t = t, .name = nm, .kind = kind, .src = src,
                                          .src_dtype = src_dtype, .src_bytes = src_bytes};
    if (kind == ACCEL__OFF_HOST) {
        d->stats.n_offloaded_cpu++;
        d->stats.bytes_host_copies += (int64_t)src_bytes;
    } else {
        d->stats.n_offloaded_disk++;
        d->stats.bytes_disk += (int64_t)src_bytes;
    }
    return d->n_off++;
}

int accel__off_find(const accel_dispatched *d, const accel_tensor *t) {
    for (int i = 0; i < d->n_off; i++)
        if (d->off[i].t == t) return i;
    return -1;
}

/* Entry e's bytes in the tensor's dtype, in host memory: the source itself
 * when it already is that (aligned), else a converted copy in e->scratch. */
static const void *host_bytes(accel_dispatched *d, accel__off_entry *e) {
    accel_tensor *t = e->t;
    size_t esz = accel_dtype_size(t->dtype), nbytes = (size_t)accel_numel(t) * esz;
    if (e->src_dtype == t->dtype && ((uintptr_t)e->src % esz) == 0) return e->src;
    e->scratch = accel_malloc(nbytes ? nbytes : 1);
    if (!e->scratch) return NULL;
    accel_convert(e->scratch, t->dtype, e->src, e->src_dtype, (size_t)accel_numel(t));
    d->stats.scratch_bytes += (int64_t)nbytes;
    return e->scratch;
}

/* On the cpu the tensor views the host bytes in place: the mapping or the
 * host copy, no copy at all (a converted copy in scratch when the dtype or
 * the alignment differs). */
static accel_status view_on_host(accel_dispatched *d, accel__off_entry *e) {
    const void *p = host_bytes(d, e);
    if (!p) return accel_last_status();
    /* t is a persistent, contiguous meta tensor (load_one made it so) */
    accel_tensor *t = e->t;
    t->device = ACCEL_CPU_DEVICE;
    accel_status st = accel_tensor_rebind(t, (void *)p, false);
    if (st) return st;
    if (!e->scratch && e->kind == ACCEL__OFF_DISK) t->flags |= ACCEL_TF_MMAP;
    return ACCEL_OK;
}

/* On another device the tensor gets memory of its own there, and the source
 * bytes go in through the staging chunks, converted chunk by chunk: no host
 * copy of the tensor is made. */
static accel_status copy_onto(accel__off_entry *e, accel_device dev) {
    accel_tensor *t = e->t;
    if (accel__tensor_alloc_uninit(t, dev, t->dtype) != ACCEL_OK) return accel_last_status();
    accel_status st = accel__stage_to_device(dev, accel__device_ptr(t), e->src, e->src_dtype, t->dtype,
                                             (size_t)accel_numel(t), "accel_module_call (an offloaded weight onload)");
    if (st != ACCEL_OK) accel_tensor_to_meta(t);
    return st;
}

accel_status accel__off_bring_in(accel_dispatched *d, int i, accel_device dev) {
    accel__off_entry *e = &d->off[i];
    if (e->refs++ > 0) return ACCEL_OK;
    accel_status st = dev.type == ACCEL_DEV_CPU ? view_on_host(d, e) : copy_onto(e, dev);
    if (st != ACCEL_OK) {
        accel_free(e->scratch);
        e->scratch = NULL;
        e->refs--;
        return st;
    }
    size_t nbytes = accel_nbytes(e->t);
    d->onload_now += (int64_t)nbytes;
    if (d->onload_now > d->stats.peak_onload_bytes) d->stats.peak_onload_bytes = d->onload_now;
    return ACCEL_OK;
}

void accel__off_drop(accel_dispatched *d, const int *idx, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        accel__off_entry *e = &d->off[idx[i]];
        if (e->refs > 0 && --e->refs == 0) {
            e->dropping = true;
            d->dropping[k++] = e->t;
        }
    }
    /* the graph that read them forgets them first, while their headers
     * still say where they were (a node's stand-in output copies them) */
    accel__tape_forget_data(d->dropping, k);
    for (int i = 0; i < n; i++) {
        accel__off_entry *e = &d->off[idx[i]];
        if (!e->dropping) continue;
        e->dropping = false;
        d->onload_now -= (int64_t)((size_t)accel_numel(e->t) * accel_dtype_size(e->t->dtype));
        accel__tensor_drop_data(e->t);
        accel_free(e->scratch);
        e->scratch = NULL;
        if (e->kind == ACCEL__OFF_DISK && e->src_file_pages) accel__release_pages(e->src, e->src_bytes);
    }
}

void accel__off_free_all(accel_dispatched *d) {
    for (int i = 0; i < d->n_off; i++) {
        accel__off_entry *e = &d->off[i];
        if (e->refs > 0) accel_tensor_to_meta(e->t); /* brought in: the bytes go with d */
        accel_free(e->scratch);
        if (e->kind == ACCEL__OFF_HOST) accel_free((void *)e->src);
        accel_free(e->name);
    }
    accel_free(d->off);
    accel_free(d->dropping);
    d->off = NULL;
    d->dropping = NULL;
    d->n_off = d->cap_off = 0;
    d->onload_now = 0;
}
