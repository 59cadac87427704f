/* prepare(model): flat parameters, shared gradient buffers, rank 0's weights,
 * the autocast forward hook, and DDP's bucketed all-reduce overlapping backward. */
#include <stdlib.h>
#include <string.h>

#include "accelerator_internal.h"
#include "dist/backend.h"
#include "fp8_scaling.h"
#include "nn/fp8_modules.h"
#include "ops/fp8_linear.h"

/* ---------------------------------------------------------------- autocast hook */

typedef struct autocast_ctx {
    accel_dtype dt, prev;
    const accel__fp8_recipe *fp8, *fp8_prev; /* mixed_precision='fp8': TE's fp8_autocast too */
    accel_pg *pg;                            /* fp8: the amaxes are reduced over it */
    accel__fp8_state *fp8_state;             /* fp8: the model's metas, and the log of those the forward ran */
    accel__fp8_log *log_prev;
    accel__fp8_cache *cache_prev;
} autocast_ctx;

static accel_status autocast_pre(accel_module *m, accel_tensor **x, void *ctx) {
    autocast_ctx *c = ctx;
    c->prev = accel_autocast_begin(c->dt);
    /* use_autocast_during_eval=False: an eval forward runs bf16 */
    const bool fp8 = c->fp8 && (m->training || c->fp8->during_eval);
    c->fp8_prev = accel__fp8_autocast_begin(fp8 ? c->fp8 : NULL);
    if (fp8) {
        c->log_prev = accel__fp8_log_begin(&c->fp8_state->forward);
        c->cache_prev = accel__fp8_cache_begin(&c->fp8_state->cache);
    }
    return ACCEL_OK;
}

/* convert_outputs_to_fp32 */
static accel_status autocast_post(accel_module *m, accel_tensor **y, void *ctx) {
    autocast_ctx *c = ctx;
    const accel__fp8_recipe *fp8 = accel__fp8_autocast();
    accel_autocast_end(c->prev);
    accel__fp8_autocast_end(c->fp8_prev);
    if (fp8) {
        accel__fp8_log_end(c->log_prev);
        accel__fp8_cache_end(c->cache_prev);
    }
    /* fp8_autocast's exit: the forward's amaxes reduced over the group, the
     * scales of the Linears it ran updated */
    if (*y && fp8 && accel__fp8_reduce_and_update(c->pg, c->fp8_state, ACCEL__FP8_X, 2, *fp8, &c->fp8_state->forward))
        return accel_last_status();
    if (*y && (*y)->dtype != ACCEL_F32 && accel_dtype_is_float((*y)->dtype)) {
        *y = accel_to_dtype(*y, ACCEL_F32);
        if (!*y) return accel_last_status();
    }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- buckets */

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
    pm->buckets = accel_calloc((size_t)(n_params ? n_params : 1), sizeof *pm->buckets);
    pm->leaves = accel_calloc((size_t)(n_params ? n_params : 1), sizeof *pm->leaves);
    if (!pm->buckets || !pm->leaves) return accel_last_status();
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        accel_flat_buffer *b = &fp->buffers[d];
        if (!b->n) continue;
        size_t es = accel_dtype_size(b->dtype);
        int i = b->n - 1;
        while (i >= 0) {
            accel__bucket *bk = &pm->buckets[pm->n_buckets];
            bk->buffer = d;
            int i_max = i;
            int64_t bytes = 0;
            do {
                bytes += accel_numel(b->tensors[i]) * (int64_t)es;
                pm->leaves[pm->n_leaves].t = b->tensors[i];
                pm->leaves[pm->n_leaves++].bucket = pm->n_buckets;
                bk->n_params++;
                i--;
            } while (i >= 0 && bytes < acc->o.bucket_cap_bytes);
            int i_min = i + 1;
            bk->lo = i_min == 0 ? 0 : b->offsets[i_min];
            bk->hi = i_max == b->n - 1 ? b->numel : b->offsets[i_max + 1];
            pm->n_buckets++;
        }
    }
    qsort(pm->leaves, (size_t)pm->n_leaves, sizeof *pm->leaves, leaf_cmp);
    return ACCEL_OK;
}

/* Moves every flat gradient buffer into memory the local ranks share. A
 * buffer on a device the host cannot address stays there: the shared memory
 * becomes its host staging buffer (see launch and wait_all), unless the
 * group takes the device's memory (nccl on cuda) and the buckets reduce it
 * in place (ZeRO-2's reduce-scatter, zero.c, still reads the host copy). */
static accel_status share_grads(accel_accelerator *acc, accel__model *pm) {
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        if (!b->n) continue;
        if (accel__needs_staging(b->device) && accel__pg_takes_device(acc->pg, b->device) && pm->zero_stage < 2)
            continue;
        size_t es = accel_dtype_size(b->dtype), bytes = (size_t)b->numel * es;
        void *sh = accel_pg_alloc_shared(acc->pg, bytes ? bytes : 1);
        if (!sh) return accel_last_status();
        if (accel__needs_staging(b->device)) {
            pm->grad_stage[d] = sh;
            continue;
        }
        accel_status st = accel__copy_bytes(ACCEL_CPU_DEVICE, sh, b->device, b->grads, bytes);
        if (st) {
            accel_pg_free_shared(acc->pg, sh);
            return st;
        }
        for (int i = 0; i < b->n; i++)
            accel_tensor_rebind(b->tensors[i]->grad, (char *)sh + b->offsets[i] * (int64_t)es, false);
        pm->orig_grads[d] = b->grads;
        b->grads = sh;
    }
    return ACCEL_OK;
}

static void unshare_grads(accel_accelerator *acc, accel__model *pm) {
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        if (pm->grad_stage[d]) accel_pg_free_shared(acc->pg, pm->grad_stage[d]);
        pm->grad_stage[d] = NULL;
        if (!pm->orig_grads[d]) continue;
        size_t es = accel_dtype_size(b->dtype);
        accel__copy_bytes(b->device, pm->orig_grads[d], ACCEL_CPU_DEVICE, b->grads, (size_t)b->numel * es);
        for (int i = 0; i < b->n; i++)
            accel_tensor_rebind(b->tensors[i]->grad, (char *)pm->orig_grads[d] + b->offsets[i] * (int64_t)es,
                                false);
        accel_pg_free_shared(acc->pg, b->grads);
        b->grads = pm->orig_grads[d];
        pm->orig_grads[d] = NULL;
    }
}

accel_tensor *accel__flat_view(accel_tensor *h, const accel_flat_buffer *b, void *base, int64_t off, int64_t n) {
    accel__tensor_header(h, (char *)base + (size_t)off * accel_dtype_size(b->dtype), b->dtype, 1, &n, b->device);
    return h;
}

/* Every rank starts from rank 0's parameters and buffers. */
static accel_status broadcast_weights(accel_accelerator *acc, accel__model *pm) {
    accel_status st = ACCEL_OK;
    for (int d = 0; d < ACCEL_DTYPE_COUNT && !st; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        accel_tensor h;
        if (b->n) st = accel__staged_broadcast(acc->pg, accel__flat_view(&h, b, b->params, 0, b->numel), 0);
    }
    if (st) return st;
    accel_state_dict *sd = accel_module_state_dict(pm->m);
    if (!sd) return accel_last_status();
    for (int i = 0; i < sd->n && !st; i++) {
        accel_tensor *t = sd->entries[i].t;
        if (!sd->entries[i].is_buffer || sd->entries[i].is_tied_alias || t->device.type == ACCEL_DEV_META) continue;
        if (!accel_is_contiguous(t)) {
            st = accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_prepare: buffer %s is not contiguous",
                                 sd->entries[i].name);
            break;
        }
        st = accel__staged_broadcast(acc->pg, t, 0);
    }
    accel_state_dict_free(sd);
    return st;
}

accel_status accel__ddp_prepare(accel_accelerator *acc, accel__model *pm) {
    /* fp8: TE's convert_model, so the scaling buffers are broadcast and saved like the others */
    static const char FP8_OP[] = "accel_accelerator_prepare (a Linear's weight)";
    if (acc->mp == ACCEL_MP_FP8 && (accel__fp8_check_devices(pm->m, FP8_OP) || accel__fp8_prepare(acc, pm)))
        return accel_last_status();
    /* ZeRO: pad to 16 x world elements so every shard starts 64-byte aligned. */
    pm->fp = accel_module_flatten(pm->m, 16, acc->zero_stage ? 16 * (int64_t)acc->world : 1);
    if (!pm->fp) {
        accel__ddp_release(acc, pm);
        return accel_last_status();
    }
    pm->ddp = acc->world > 1;
    accel_status st = acc->zero_stage ? accel__zero_model_prepare(acc, pm) : ACCEL_OK;
    if (st) {
        accel__ddp_release(acc, pm);
        return st;
    }
    if (pm->ddp && acc->zero_stage == 3) { /* no shared or bucketed full gradients: zero3.c reduces per unit */
        st = broadcast_weights(acc, pm);
    } else if (pm->ddp) {
        if (!(st = share_grads(acc, pm)) && !(st = broadcast_weights(acc, pm))) st = build_buckets(acc, pm);
    }
    if (!st && acc->mp != ACCEL_MP_NO) {
        autocast_ctx *c = accel_malloc(sizeof *c);
        if (!c) {
            st = accel_last_status();
        } else {
            *c = (autocast_ctx){.dt = accel__acc_autocast_dtype(acc), .prev = ACCEL_F32,
                                .fp8 = acc->mp == ACCEL_MP_FP8 ? &acc->fp8 : NULL, .pg = acc->pg,
                                .fp8_state = pm->fp8};
            accel_module_hook h = {autocast_pre, autocast_post, accel_free, c};
            accel_module_set_hook(pm->m, &h);
        }
    }
    if (!st && acc->zero_stage == 3) st = accel__zero3_start(acc, pm);
    if (st) accel__ddp_release(acc, pm);
    return st;
}

/* A bucket's gradients as the group reads them: in place on the cpu, else
 * their range of the host staging buffer. */
static void *bucket_host(const accel__model *pm, const accel__bucket *bk) {
    const accel_flat_buffer *b = &pm->fp->buffers[bk->buffer];
    char *stage = pm->grad_stage[bk->buffer];
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
    return accel__needs_staging(pm->fp->buffers[bk->buffer].device) && !pm->grad_stage[bk->buffer];
}

/* Waits for every bucket's all-reduce; *first gets the first failure (a
 * bucket whose all-reduce was never issued included), whose message is the
 * thread's error on return. */
static void wait_all(accel__model *pm, accel_status *first) {
    char first_msg[1024] = "";
    for (int i = 0; i < pm->n_buckets; i++) {
        accel__bucket *bk = &pm->buckets[i];
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
        if (st && !*first) {
            *first = st;
            snprintf(first_msg, sizeof first_msg, "%s", accel_last_error());
        }
    }
    if (first_msg[0]) accel_set_error(*first, "%s", first_msg);
}

void accel__ddp_release(accel_accelerator *acc, accel__model *pm) {
    accel__fp8_state_free(pm->fp8);
    pm->fp8 = NULL;
    if (!pm->fp) return;
    accel_status ignored = ACCEL_OK;
    wait_all(pm, &ignored);
    accel__zero_model_release(acc, pm); /* before the autocast hook goes: stage 3 chains to it */
    if (acc->mp != ACCEL_MP_NO) accel_module_set_hook(pm->m, NULL);
    unshare_grads(acc, pm);
    accel_free(pm->buckets);
    accel_free(pm->leaves);
    pm->buckets = NULL;
    pm->leaves = NULL;
    pm->n_buckets = pm->n_leaves = 0;
    accel_flat_params_free(pm->fp);
    pm->fp = NULL;
}

/* ---------------------------------------------------------------- backward */

bool accel__model_syncs(const accel_accelerator *acc, const accel__model *pm) {
    return pm->ddp && !pm->no_sync && (acc->sync_gradients || acc->o.sync_each_batch);
}

/* Bucketed all-reduce during backward (DDP, ZeRO-1); ZeRO-2 reduce-scatters after it. */
static bool bucketed(const accel_accelerator *acc, const accel__model *pm) {
    return accel__model_syncs(acc, pm) && pm->zero_stage < 2;
}

/* The buffer bucket bk's all-reduce reads: its device memory, which must
 * then go on the group's stream (a comm-thread call would not be ordered
 * after the backward that wrote it), or its host staging copy. */
static void *bucket_buffer(accel_accelerator *acc, accel__model *pm, accel__bucket *bk, accel_tensor *h) {
    if (!reduced_on_device(pm, bk)) return accel__stage_to_host(h, bucket_host(pm, bk), true);
    void *dev = accel__device_ptr(h);
    if (dev && !accel__pg_on_stream(acc->pg, dev)) {
        accel_set_error(ACCEL_ERR_STATE, "the %s backend does not take this %s buffer on its stream",
                        accel_pg_backend(acc->pg), accel_device_type_name(h->device.type));
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
    bk->work = buf ? accel_pg_all_reduce_async(acc->pg, buf, (size_t)(bk->hi - bk->lo), h.dtype, ACCEL_REDUCE_AVG)
                   : NULL;
    if (bk->work) return;
    bk->launch_st = accel_last_status() ? accel_last_status() : ACCEL_ERR_DIST;
    snprintf(bk->launch_msg, sizeof bk->launch_msg,
             "accel ddp: the gradient all-reduce of bucket %d (%s, elements [%lld, %lld)) was not issued on rank %d: "
             "%s",
             (int)(bk - pm->buckets), accel_dtype_name(h.dtype), (long long)bk->lo, (long long)bk->hi,
             accel_pg_rank(acc->pg), accel_last_error());
}

/* Launches the ready buckets in index order (the same order on every rank). */
static void launch_ready(accel_accelerator *acc, accel__model *pm, bool all) {
    while (pm->next_launch < pm->n_buckets &&
           (all || pm->buckets[pm->next_launch].pending == 0)) {
        launch(acc, pm, &pm->buckets[pm->next_launch]);
        pm->next_launch++;
    }
}

static void grad_ready(accel_tensor *leaf, void *ctx) {
    accel_accelerator *acc = ctx;
    accel__leaf key = {leaf, 0};
    for (int i = 0; i < acc->n_models; i++) {
        accel__model *pm = &acc->models[i];
        if (pm->zero_stage == 3 && accel__zero3_grad_ready(acc, pm, leaf)) return;
        if (!bucketed(acc, pm)) continue;
        accel__leaf *l = bsearch(&key, pm->leaves, (size_t)pm->n_leaves, sizeof key, leaf_cmp);
        if (!l) continue;
        accel__bucket *bk = &pm->buckets[l->bucket];
        if (bk->pending > 0) bk->pending--;
        launch_ready(acc, pm, false);
        return;
    }
}

void accel__ddp_begin_backward(accel_accelerator *acc) {
    bool any = false;
    for (int i = 0; i < acc->n_models; i++) {
        accel__model *pm = &acc->models[i];
        if (pm->zero_stage == 3) {
            accel__zero3_begin_backward(acc, pm);
            any = true;
            continue;
        }
        if (!bucketed(acc, pm)) continue;
        any = true;
        pm->next_launch = 0;
        for (int k = 0; k < pm->n_buckets; k++) {
            pm->buckets[k].pending = pm->buckets[k].n_params;
            pm->buckets[k].launched = false;
        }
    }
    if (any) accel_set_grad_ready_hook(grad_ready, acc);
}

accel_status accel__ddp_end_backward(accel_accelerator *acc) {
    accel_set_grad_ready_hook(NULL, NULL);
    accel_status first = ACCEL_OK;
    for (int i = 0; i < acc->n_models; i++) {
        accel__model *pm = &acc->models[i];
        if (pm->zero_stage == 3) { /* every backward: stage 3 keeps no full gradients between micro-batches */
            accel_status st = accel__zero3_end_backward(acc, pm);
            if (st && !first) first = st;
            continue;
        }
        if (!accel__model_syncs(acc, pm)) continue;
        if (!bucketed(acc, pm)) {
            accel_status st = accel__zero_reduce(acc, pm);
            if (st && !first) first = st;
            continue;
        }
        /* Buckets whose parameters got no gradient this pass go last, in order. */
        launch_ready(acc, pm, true);
        wait_all(pm, &first);
    }
    return first;
}
