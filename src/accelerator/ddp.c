/* The DDP strategy (strategy.h): gradient buffers the local ranks share, and
 * a bucketed all-reduce overlapping backward. ZeRO-1 takes its backward as
 * is, ZeRO-2 its shared gradient memory (zero.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accelerator_internal.h"
#include "dist/backend.h"
#include "strategy.h"

/* A bucket: a contiguous range [lo, hi) of one flat gradient buffer, filled by
 * n_params parameters. */
typedef struct accel__bucket {
    int buffer;            /* dtype index into fp->buffers */
    int64_t lo, hi;
    int n_params, pending;
    bool launched;
    accel_work *work;
    accel_status launch_st; /* its all-reduce was not issued (work NULL): why, until wait_all */
    char launch_msg[512];
} accel__bucket;

/* Leaf lookup: parameter tensor -> bucket, sorted by pointer. */
typedef struct accel__leaf {
    const accel_tensor *t;
    int bucket;
} accel__leaf;

/* A model's DDP state (accel__model.ddps), on > 1 process: the gradient
 * memory the local ranks share (made at layout, also under ZeRO-1/2) and the
 * buckets (made at start). */
struct accel__ddp {
    void *orig_grads[ACCEL_DTYPE_COUNT]; /* flatten's own grad buffers, while shared ones are used */
    void *grad_stage[ACCEL_DTYPE_COUNT]; /* device gradients: their host staging buffer (group-shared memory) */
    int n_buckets;
    accel__bucket *buckets;
    int n_leaves;
    accel__leaf *leaves;
    int next_launch;       /* buckets launch in index order on every rank */
};

/* ---------------------------------------------------------------- buckets */

/* pm's DDP state, made by the first of layout and start that asks; NULL
 * when out of memory. */
static struct accel__ddp *state_of(accel__model *pm) {
    if (!pm->ddps) pm->ddps = accel_calloc(1, sizeof *pm->ddps);
    return pm->ddps;
}

static int leaf_cmp(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const accel__leaf *)a)->t, y = (uintptr_t)((const accel__leaf *)b)->t;
    return x < y ? -1 : x > y;
}

/* Buckets of about cap bytes over each flat buffer, parameters in reverse
 * order (the order backward finishes them). Together they cover every buffer. */
static accel_status build_buckets(accel_accelerator *acc, accel__model *pm) {
    accel_flat_params *fp = pm->fp;
    int n_params = 0;
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) n_params += fp->buffers[d].n;
    struct accel__ddp *z = state_of(pm);
    if (!z) return accel_last_status();
    z->buckets = accel_calloc((size_t)(n_params ? n_params : 1), sizeof *z->buckets);
    z->leaves = accel_calloc((size_t)(n_params ? n_params : 1), sizeof *z->leaves);
    if (!z->buckets || !z->leaves) return accel_last_status();
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        accel_flat_buffer *b = &fp->buffers[d];
        if (!b->n) continue;
        size_t es = accel_dtype_size(b->dtype);
        int i = b->n - 1;
        while (i >= 0) {
            accel__bucket *bk = &z->buckets[z->n_buckets];
            bk->buffer = d;
            int i_max = i;
            int64_t bytes = 0;
            do {
                bytes += accel_numel(b->tensors[i]) * (int64_t)es;
                z->leaves[z->n_leaves].t = b->tensors[i];
                z->leaves[z->n_leaves++].bucket = z->n_buckets;
                bk->n_params++;
                i--;
            } while (i >= 0 && bytes < acc->o.bucket_cap_bytes);
            int i_min = i + 1;
            bk->lo = i_min == 0 ? 0 : b->offsets[i_min];
            bk->hi = i_max == b->n - 1 ? b->numel : b->offsets[i_max + 1];
            z->n_buckets++;
        }
    }
    qsort(z->leaves, (size_t)z->n_leaves, sizeof *z->leaves, leaf_cmp);
    return ACCEL_OK;
}

/* Moves every flat gradient buffer into memory the local ranks share. A
 * buffer on a device the host cannot address stays there: the shared memory
 * becomes its host staging buffer (see launch and wait_all), unless the
 * group takes the device's memory (nccl on cuda) and the buckets reduce it
 * in place (host_copy: ZeRO-2's reduce-scatter, zero.c, reads the host copy). */
accel_status accel__ddp_share_grads(accel_accelerator *acc, accel__model *pm, bool host_copy) {
    if (!pm->ddp) return ACCEL_OK;
    struct accel__ddp *z = state_of(pm);
    if (!z) return accel_last_status();
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        if (!b->n) continue;
        if (accel__needs_staging(b->device) && accel__pg_takes_device(acc->dp_pg, b->device) && !host_copy)
            continue;
        size_t es = accel_dtype_size(b->dtype), bytes = (size_t)b->numel * es;
        void *sh = accel_pg_alloc_shared(acc->dp_pg, bytes ? bytes : 1);
        if (!sh) return accel_last_status();
        if (accel__needs_staging(b->device)) {
            z->grad_stage[d] = sh;
            continue;
        }
        accel_status st = accel__copy_bytes(ACCEL_CPU_DEVICE, sh, b->device, b->grads, bytes);
        if (st) {
            accel_pg_free_shared(acc->dp_pg, sh);
            return st;
        }
        /* recorded first: on a failed rebind, release's unshare_grads re-points them all */
        z->orig_grads[d] = b->grads;
        b->grads = sh;
        for (int i = 0; i < b->n; i++)
            if ((st = accel_tensor_rebind(b->tensors[i]->grad, (char *)sh + b->offsets[i] * (int64_t)es, false)))
                return st;
    }
    return ACCEL_OK;
}

/* The gradients back from the shared segments into their own buffers. A
 * copy that fails (a device's error) leaves those buffers' gradients stale:
 * the release goes on (the segments must go) and returns the first such
 * failure, saying so. */
static accel_status unshare_grads(accel_accelerator *acc, accel__model *pm) {
    struct accel__ddp *z = pm->ddps;
    accel__first_error first = {0};
    for (int d = 0; z && d < ACCEL_DTYPE_COUNT; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        if (z->grad_stage[d]) accel_pg_free_shared(acc->dp_pg, z->grad_stage[d]);
        z->grad_stage[d] = NULL;
        if (!z->orig_grads[d]) continue;
        size_t es = accel_dtype_size(b->dtype);
        if (accel__copy_bytes(b->device, z->orig_grads[d], ACCEL_CPU_DEVICE, b->grads, (size_t)b->numel * es)) {
            char dev[32];
            accel_set_error(accel_last_status(),
                            "DDP release: rank %d: the %s gradients could not be copied back to %s (%s): they "
                            "hold what they held before they were shared",
                            acc->rank, accel_dtype_name(b->dtype), accel_device_str(b->device, dev, sizeof dev),
                            accel_last_error());
            accel__first_error_note(&first, accel_last_status());
        }
        /* views of a contiguous persistent buffer, as share_grads made them: cannot fail */
        for (int i = 0; i < b->n; i++)
            (void)accel_tensor_rebind(b->tensors[i]->grad, (char *)z->orig_grads[d] + b->offsets[i] * (int64_t)es,
                                      false);
        accel_pg_free_shared(acc->dp_pg, b->grads);
        b->grads = z->orig_grads[d];
        z->orig_grads[d] = NULL;
    }
    return accel__first_error_return(&first);
}

/* A bucket's gradients as the group reads them: in place on the cpu, else
 * their range of the host staging buffer. */
static void *bucket_host(const accel__model *pm, const accel__bucket *bk) {
    const accel_flat_buffer *b = &pm->fp->buffers[bk->buffer];
    char *stage = pm->ddps->grad_stage[bk->buffer];
    return stage ? stage + (size_t)bk->lo * accel_dtype_size(b->dtype) : NULL;
}

/* The bucket's range of its flat gradient buffer, as a header in *h. */
static accel_tensor *bucket_grads(accel_tensor *h, const accel__model *pm, const accel__bucket *bk) {
    const accel_flat_buffer *b = &pm->fp->buffers[bk->buffer];
    return accel__flat_view(h, b, b->grads, bk->lo, bk->hi - bk->lo);
}

/* Whether a bucket is reduced where it is, on a device the host cannot
 * address (share_grads gave it no staging buffer): its all-reduce is then
 * ordered on the group's stream, overlapping the rest of backward. */
static bool reduced_on_device(const accel__model *pm, const accel__bucket *bk) {
    return accel__needs_staging(pm->fp->buffers[bk->buffer].device) && !pm->ddps->grad_stage[bk->buffer];
}

void *accel__ddp_grad_stage(const accel__model *pm, int d) { return pm->ddps ? pm->ddps->grad_stage[d] : NULL; }

/* Waits for every bucket's all-reduce; returns the first failure (a bucket
 * whose all-reduce was never issued included), with its message. */
static accel_status wait_all(accel__model *pm) {
    struct accel__ddp *z = pm->ddps;
    accel__first_error first = {0};
    for (int i = 0; z && i < z->n_buckets; i++) {
        accel__bucket *bk = &z->buckets[i];
        accel_status st = bk->launch_st;
        if (st) {
            accel_set_error(st, "%s", bk->launch_msg);
            bk->launch_st = ACCEL_OK;
        } else if (bk->work) {
            accel_tensor h;
            st = accel_work_wait(bk->work);
            /* staged: the averaged gradients back onto the device */
            if (!reduced_on_device(pm, bk))
                st = accel__stage_end(bucket_grads(&h, pm, bk), bucket_host(pm, bk), st, true, false);
            accel_work_free(bk->work);
            bk->work = NULL;
        }
        accel__first_error_note(&first, st);
    }
    return accel__first_error_return(&first);
}

/* On > 1 process: the buckets. */
accel_status accel__ddp_start(accel_accelerator *acc, accel__model *pm) {
    return pm->ddp ? build_buckets(acc, pm) : ACCEL_OK;
}

/* Buckets still in flight are waited for so their memory can go (there are
 * none after a backward's end, which waits for them and reports their
 * failures); what the release reports is what the model loses here. */
accel_status accel__ddp_release(accel_accelerator *acc, accel__model *pm) {
    (void)wait_all(pm);
    accel_status st = unshare_grads(acc, pm);
    if (pm->ddps) {
        accel_free(pm->ddps->buckets);
        accel_free(pm->ddps->leaves);
        accel_free(pm->ddps);
        pm->ddps = NULL;
    }
    return st;
}

/* ---------------------------------------------------------------- backward */

/* The bucketed all-reduce runs in this backward (on > 1 process, gradients not accumulating). */
static bool bucketed(const accel_accelerator *acc, const accel__model *pm) {
    return accel__model_syncs(acc, pm) && pm->ddps && pm->ddps->buckets;
}

/* The buffer bucket bk's all-reduce reads: its device memory, which must
 * then go on the group's stream (a comm-thread call would not be ordered
 * after the backward that wrote it), or its host staging copy. */
static void *bucket_buffer(accel_accelerator *acc, accel__model *pm, accel__bucket *bk, accel_tensor *h) {
    if (!reduced_on_device(pm, bk)) return accel__stage_to_host(h, bucket_host(pm, bk), true);
    void *dev = accel__device_ptr(h);
    if (dev && !accel__pg_on_stream(acc->dp_pg, dev)) {
        accel_set_error(ACCEL_ERR_STATE, "the %s backend does not take this %s buffer on its stream",
                        accel_pg_backend(acc->dp_pg), accel_device_type_name(h->device.type));
        return NULL;
    }
    return dev;
}

/* Issues bucket bk's all-reduce. One not issued (its buffer or the call
 * failed) is the bucket's status for wait_all: this rank then reports it
 * from backward, its peers time out waiting for it with their own error. */
static void launch(accel_accelerator *acc, accel__model *pm, accel__bucket *bk) {
    accel_tensor h;
    bk->launched = true;
    bucket_grads(&h, pm, bk);
    void *buf = bucket_buffer(acc, pm, bk, &h);
    bk->work = buf ? accel_pg_all_reduce_async(acc->dp_pg, buf, (size_t)(bk->hi - bk->lo), h.dtype, ACCEL_REDUCE_AVG)
                   : NULL;
    if (bk->work) return;
    bk->launch_st = accel_last_status() ? accel_last_status() : ACCEL_ERR_DIST;
    snprintf(bk->launch_msg, sizeof bk->launch_msg,
             "accel ddp: the gradient all-reduce of bucket %d (%s, elements [%lld, %lld)) was not issued on rank %d: "
             "%s",
             (int)(bk - pm->ddps->buckets), accel_dtype_name(h.dtype), (long long)bk->lo, (long long)bk->hi,
             accel_pg_rank(acc->dp_pg), accel_last_error());
}

/* Launches the ready buckets in index order (the same order on every rank). */
static void launch_ready(accel_accelerator *acc, accel__model *pm, bool all) {
    struct accel__ddp *z = pm->ddps;
    while (z->next_launch < z->n_buckets && (all || z->buckets[z->next_launch].pending == 0)) {
        launch(acc, pm, &z->buckets[z->next_launch]);
        z->next_launch++;
    }
}

bool accel__ddp_grad_ready(accel_accelerator *acc, accel__model *pm, const accel_tensor *leaf) {
    if (!bucketed(acc, pm)) return false;
    struct accel__ddp *z = pm->ddps;
    accel__leaf key = {leaf, 0};
    accel__leaf *l = bsearch(&key, z->leaves, (size_t)z->n_leaves, sizeof key, leaf_cmp);
    if (!l) return false;
    accel__bucket *bk = &z->buckets[l->bucket];
    if (bk->pending > 0) bk->pending--;
    launch_ready(acc, pm, false);
    return true;
}

bool accel__ddp_begin_backward(accel_accelerator *acc, accel__model *pm) {
    if (!bucketed(acc, pm)) return false;
    struct accel__ddp *z = pm->ddps;
    z->next_launch = 0;
    for (int k = 0; k < z->n_buckets; k++) {
        z->buckets[k].pending = z->buckets[k].n_params;
        z->buckets[k].launched = false;
    }
    return true;
}

accel_status accel__ddp_end_backward(accel_accelerator *acc, accel__model *pm) {
    if (!bucketed(acc, pm)) return ACCEL_OK;
    /* Buckets whose parameters got no gradient this pass go last, in order. */
    launch_ready(acc, pm, true);
    return wait_all(pm);
}

/* ---------------------------------------------------------------- clipping */

/* Every rank holds the full (averaged) gradients: the norm over the model's
 * flat buffers, no collective. */
accel_status accel__ddp_clip(accel_accelerator *acc, accel__model *pm, double max_norm, double norm_type,
                             double *norm) {
    *norm = NAN;
    /* Under tensor parallelism a rank holds slices of some parameters: the
     * norm sums them over the tp group and counts replicated ones once;
     * under pipeline parallelism a stage trains its layers only. */
    bool tp = acc->mesh.size[ACCEL__MESH_TP] > 1;
    double combined = 0;
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        if (!b->n) continue;
        if (b->dtype != ACCEL_F32) {
            return accel_set_error(ACCEL_ERR_DTYPE,
                                   "accel_accelerator_clip_grad_norm: %s parameters (needs f32 master weights)",
                                   accel_dtype_name(b->dtype));
        }
        accel_tensor h;
        double part = tp ? 0 : accel_grad_norm_partial(accel__flat_view(&h, b, b->grads, 0, b->numel), norm_type);
        combined = accel_grad_norm_combine(combined, part, norm_type);
    }
    if (tp && accel__tp_grad_norm_partial(acc, pm->m, norm_type, &combined)) return accel_last_status();
    /* under pipeline parallelism, summed over the stages (pipeline.c) */
    if (accel__pipeline_norm_partial(acc, pm->m, &combined, norm_type)) return accel_last_status();
    *norm = accel_grad_norm_finish(combined, norm_type);
    double coef = accel_clip_coef(*norm, max_norm);
    float c = (float)coef; /* as accel_clip_grad_norm */
    if (coef < 1.0)
        for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
            accel_flat_buffer *b = &pm->fp->buffers[d];
            accel_tensor h;
            if (b->n && accel__grad_scale(accel__flat_view(&h, b, b->grads, 0, b->numel), c))
                return accel_last_status();
        }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- the strategy */

static accel_status ddp_layout(accel_accelerator *acc, accel__model *pm) {
    return accel__ddp_share_grads(acc, pm, false);
}

static accel_status ddp_shard_range(accel_accelerator *acc, accel__model *pm, int64_t *lo, int64_t *hi) {
    (void)acc;
    *lo = 0;
    *hi = pm->fp->buffers[ACCEL_F32].numel;
    return ACCEL_OK;
}

const accel__strategy accel__strategy_ddp = {
    .name = "ddp",
    .stage = 0,
    .fp8 = true,
    .pipeline = true,
    .layout = ddp_layout,
    .start = accel__ddp_start,
    .release = accel__ddp_release,
    .begin_backward = accel__ddp_begin_backward,
    .grad_ready = accel__ddp_grad_ready,
    .end_backward = accel__ddp_end_backward,
    .shard_range = ddp_shard_range,
    .sp_reduce = accel__tp_sp_reduce,
    .clip = accel__ddp_clip,
};
