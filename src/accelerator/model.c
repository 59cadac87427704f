/* A prepared model: its flat parameters, rank 0's weights on every rank, the
 * mixed-precision autocast hook (and fp8's scaling), and the strategy
 * (strategy.h) that lays out and synchronises its parameters, gradients and
 * optimizer state. The backward of the accelerator goes through here once:
 * the strategies' begin / grad_ready / end for every prepared model. */
#include <stdlib.h>
#include <string.h>

#include "accelerator_internal.h"
#include "core/checksum.h"
#include "core/core_internal.h"
#include "fp8_scaling.h"
#include "nn/family.h"
#include "nn/fp8_modules.h"
#include "nn/nn_internal.h"
#include "ops/fp8_linear.h"
#include "strategy.h"

/* ---------------------------------------------------------------- autocast hook */

typedef struct autocast_ctx {
    bool autocast;                           /* mixed precision on (else the hook syncs buffers only) */
    accel_dtype dt, prev;
    const accel__fp8_recipe *fp8, *fp8_prev; /* mixed_precision='fp8': TE's fp8_autocast too */
    accel_pg *pg;                            /* fp8: the amaxes are reduced over it (every rank: dp and tp) */
    accel__fp8_state *fp8_state;             /* fp8: the model's metas, and the log of those the forward ran */
    accel__fp8_log *log_prev;
    accel__fp8_cache *cache_prev;
    /* DDP's broadcast_buffers=True: before a forward that follows one with
     * gradients and their sync (torch's require_forward_param_sync; true
     * at first), every buffer of the model (BatchNorm's running stats) is
     * rank 0's of the data-parallel group. A forward under no_grad or
     * no_sync leaves the next one unsynced: an eval loop after a training
     * step syncs once, then runs on those buffers. */
    accel_accelerator *acc;
    struct buffer_pack *buffers;             /* NULL: nothing to sync (one process, no buffers, a ZeRO strategy) */
    bool sync_next;
} autocast_ctx;

static accel_status broadcast_buffers(accel_accelerator *acc, struct buffer_pack *p, const char *who);

static accel_status autocast_pre(accel_module *m, accel_tensor **x, void *ctx) {
    autocast_ctx *c = ctx;
    if (c->sync_next && c->buffers && broadcast_buffers(c->acc, c->buffers, "the model's forward (DDP's buffer broadcast)"))
        return accel_last_status();
    if (!c->autocast) return ACCEL_OK;
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
    if (c->buffers) {
        bool no_sync = false;
        for (int i = 0; i < c->acc->n_models; i++)
            if (c->acc->models[i].m == m) no_sync = c->acc->models[i].no_sync;
        c->sync_next = accel_is_grad_enabled() && !no_sync;
    }
    if (!c->autocast) return ACCEL_OK;
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
    if (*y && (*y)->dtype != ACCEL_F32 && accel_dtype_is_float((*y)->dtype) && !accel__module_outputs_kept(m)) {
        *y = accel_to_dtype(*y, ACCEL_F32);
        if (!*y) return accel_last_status();
    }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- prepare */

/* st with its message (the last error) and the rank it names kept as the
 * failure this agreement gave. */
static accel_status agreed(accel_accelerator *acc, accel_status st, int rank) {
    acc->agreed_st = st;
    acc->agreed_rank = rank;
    snprintf(acc->agreed_msg, sizeof acc->agreed_msg, "%s", st ? accel_last_error() : "");
    return st;
}

/* An agreement over the ranks of pg (acc->pg, or a group whose ranks all
 * reach the same agreements: the others learn of its failure at their next
 * agreement over every rank) on a step of `who` (the call the messages name). */
static accel_status agree_on(accel_accelerator *acc, accel_pg *pg, accel_status mine, const char *who,
                             const char *what) {
    if (accel_pg_size(pg) == 1) return mine;
    char why[512];
    snprintf(why, sizeof why, "%s", mine ? accel_last_error() : "");
    bool passed_on = mine && mine == acc->agreed_st && !strcmp(accel_last_error(), acc->agreed_msg);
    /* (rank + 1) << 8 | status: a failing rank, the highest, names itself to
     * the others (a failure passed on names the rank it came from) */
    int named = passed_on ? acc->agreed_rank : acc->rank;
    int32_t v = mine ? (int32_t)((named + 1) << 8 | (int)mine) : 0;
    accel_status st = accel_pg_all_reduce(pg, &v, 1, ACCEL_I32, ACCEL_REDUCE_MAX);
    if (st) return agreed(acc, st, acc->rank);
    if (passed_on) return mine;
    /* its own failure, whatever the collective left, and the step it stopped */
    if (mine)
        return agreed(acc, accel_set_error(mine, "%s: rank %d could not %s, so it fails on every rank: %s", who,
                                           acc->rank, what, why), acc->rank);
    return agreed(acc, v ? accel_set_error((accel_status)(v & 0xff), "%s: another rank (%d) could not %s (its error "
                                           "is reported there)", who, (v >> 8) - 1, what)
                         : ACCEL_OK, (v >> 8) - 1);
}

static const char PREPARE[] = "accel_accelerator_prepare";

accel_status accel__prepare_agree(accel_accelerator *acc, accel_status mine, const char *what) {
    return acc->world == 1 ? mine : agree_on(acc, acc->pg, mine, PREPARE, what);
}

/* accel__staged_broadcast of t from its data-parallel rank 0, its local
 * steps agreed on every rank of the broadcast where t is staged (a device's
 * memory the group cannot read): its host copy before the broadcast (a rank
 * that could not make it left the others in the broadcast) and the copy
 * back after it (a rank that could not write it back was left with other
 * weights). Agreed over the data-parallel group, whose ranks hold the same
 * tensors: a pipeline's stages hold different ones (buffers, dtypes), so
 * over every rank the agreements of one stage met another's collectives. */
static accel_status broadcast_agreed(accel_accelerator *acc, accel_tensor *t) {
    if (!accel__needs_staging(t->device)) return accel__staged_broadcast(acc->dp_pg, t, 0);
    void *host = accel__stage_to_host(t, NULL, true);
    accel_status st = agree_on(acc, acc->dp_pg, host ? ACCEL_OK : accel_last_status(), PREPARE,
                               "copy the weights to host memory for their broadcast");
    if (st) return host ? accel__stage_end(t, host, st, false, true) : st;
    st = accel__stage_end(t, host, accel_pg_broadcast(acc->dp_pg, host, (size_t)accel_numel(t), t->dtype, 0), true,
                          true);
    return agree_on(acc, acc->dp_pg, st, PREPARE, "copy the broadcast weights back to the device");
}

/* ---------------------------------------------------------------- buffers */

/* The model's buffers (BatchNorm's running stats and counts) that every
 * data-parallel rank holds alike, broadcast from the group's rank 0 as one
 * message of their bytes side by side, whatever their dtypes: DDP does it
 * before every training forward, and a ResNet's 3 buffers per BatchNorm
 * were as many collectives (and, staged, agreements) each time. */
typedef struct buffer_pack {
    int n;
    accel_tensor **t;    /* [n] the model's own, contiguous */
    size_t bytes;        /* theirs in all */
    unsigned char *host; /* [bytes], the message */
    bool staged;         /* some live where the group cannot read: their copies can fail on one rank */
} buffer_pack;

static void buffer_pack_free(buffer_pack *p) {
    if (!p) return;
    accel_free(p->t);
    accel_free(p->host);
    accel_free(p);
}

/* The buffers of m (not on meta, not a second name of one listed), or NULL
 * and the error. */
static buffer_pack *buffer_pack_new(accel_module *m) {
    accel_state_dict *sd = accel_module_state_dict(m);
    buffer_pack *p = sd ? accel_calloc(1, sizeof *p) : NULL;
    if (p) p->t = accel_malloc(sizeof *p->t * (size_t)(sd->n ? sd->n : 1));
    accel_status st = p && p->t ? ACCEL_OK : accel_last_status();
    for (int i = 0; sd && i < sd->n && !st; i++) {
        const accel_state_entry *e = &sd->entries[i];
        if (!e->is_buffer || e->is_tied_alias || e->t->device.type == ACCEL_DEV_META) continue;
        if (!accel_is_contiguous(e->t))
            st = accel_set_error(ACCEL_ERR_STATE, "%s: buffer %s is not contiguous", PREPARE, e->name);
        p->t[p->n++] = e->t;
        p->bytes += accel_nbytes(e->t);
        p->staged |= accel__needs_staging(e->t->device);
    }
    accel_state_dict_free(sd);
    if (!st && p->bytes && !(p->host = accel_malloc(p->bytes))) st = accel_last_status();
    if (!st) return p;
    buffer_pack_free(p);
    return NULL;
}

/* p's buffers become the data-parallel rank 0's: its copies into the
 * message, the broadcast, the others' copies out (the copies agreed on
 * where staged, as broadcast_agreed's). */
static accel_status broadcast_buffers(accel_accelerator *acc, buffer_pack *p, const char *who) {
    if (!p->bytes || accel_pg_size(acc->dp_pg) == 1) return ACCEL_OK;
    /* the list is the prepare's: a buffer since resized or moved would not fit the message (the same
     * on every rank, which run the same program: each refuses before the collectives) */
    size_t bytes = 0;
    bool staged = false;
    for (int i = 0; i < p->n; i++) {
        bytes += accel_nbytes(p->t[i]);
        staged |= accel__needs_staging(p->t[i]->device);
    }
    if (staged != p->staged)
        return accel_set_error(ACCEL_ERR_STATE, "%s: the model's buffers moved to another kind of device since "
                               "prepare (prepare the model again after moving it)", who);
    if (bytes != p->bytes)
        return accel_set_error(ACCEL_ERR_STATE, "%s: the model's buffers hold %zu bytes, %zu at prepare (a buffer "
                               "was resized: prepare the model again)", who, bytes, p->bytes);
    const bool root = accel_pg_rank(acc->dp_pg) == 0;
    accel_status st = ACCEL_OK;
    size_t off = 0;
    for (int i = 0; root && i < p->n && !st; off += accel_nbytes(p->t[i++]))
        st = accel__tensor_read_bytes(p->t[i], 0, p->host + off, accel_nbytes(p->t[i]));
    /* host memory's copies cannot fail: only a staged one can leave rank 0 out of the broadcast */
    if (p->staged) st = agree_on(acc, acc->dp_pg, st, who, "copy the buffers to host memory for their broadcast");
    if (st) return st;
    st = accel_pg_broadcast(acc->dp_pg, p->host, p->bytes, ACCEL_U8, 0);
    off = 0;
    for (int i = 0; !root && i < p->n && !st; off += accel_nbytes(p->t[i++]))
        st = accel__tensor_write_bytes(p->t[i], 0, p->host + off, accel_nbytes(p->t[i]));
    return p->staged ? agree_on(acc, acc->dp_pg, st, who, "copy the broadcast buffers back to the device") : st;
}

/* Every rank starts from its data-parallel rank 0's parameters and buffers
 * (the same slices: the ranks of a tp group hold different ones). */
static accel_status broadcast_weights(accel_accelerator *acc, accel__model *pm) {
    buffer_pack *p = buffer_pack_new(pm->m);
    accel_status st = accel__prepare_agree(acc, p ? ACCEL_OK : accel_last_status(), "list the model's buffers");
    for (int d = 0; d < ACCEL_DTYPE_COUNT && !st; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        accel_tensor h;
        if (b->n) st = broadcast_agreed(acc, accel__flat_view(&h, b, b->params, 0, b->numel));
    }
    if (!st) st = broadcast_buffers(acc, p, PREPARE);
    buffer_pack_free(p);
    return st;
}

static void hook_ctx_free(void *ctx) {
    autocast_ctx *c = ctx;
    buffer_pack_free(c->buffers);
    accel_free(c);
}

/* The model's hook: autocast (mixed precision) and DDP's buffer broadcast
 * (autocast_ctx), where either applies; none otherwise (*hooked false). */
static accel_status set_model_hook(accel_accelerator *acc, accel__model *pm, bool *hooked) {
    *hooked = false;
    buffer_pack *bufs = NULL;
    if (pm->ddp && pm->strat == &accel__strategy_ddp && !(bufs = buffer_pack_new(pm->m))) return accel_last_status();
    if (bufs && bufs->n == 0) {
        buffer_pack_free(bufs);
        bufs = NULL;
    }
    if (acc->mp == ACCEL_MP_NO && !bufs) return ACCEL_OK;
    autocast_ctx *c = accel_malloc(sizeof *c);
    if (!c) {
        buffer_pack_free(bufs);
        return accel_last_status();
    }
    *c = (autocast_ctx){.autocast = acc->mp != ACCEL_MP_NO, .dt = accel__acc_autocast_dtype(acc), .prev = ACCEL_F32,
                        .fp8 = acc->mp == ACCEL_MP_FP8 ? &acc->fp8 : NULL, .pg = acc->pg, .fp8_state = pm->fp8,
                        .acc = acc, .buffers = bufs, .sync_next = true};
    accel_module_hook h = {autocast_pre, autocast_post, hook_ctx_free, c};
    accel_status st = accel_module_set_hook(pm->m, &h);
    if (st) hook_ctx_free(c);
    *hooked = !st;
    return st;
}

/* A failed prepare undone: the prepare's failure stays the error reported,
 * whatever the release adds. */
static accel_status undo_prepare(accel_accelerator *acc, accel__model *pm, accel_status st) {
    accel__first_error first = {0};
    accel__first_error_note(&first, st);
    accel__first_error_note(&first, accel__model_release(acc, pm));
    return accel__first_error_return(&first);
}

/* Device placement (Accelerate's prepare moves the model to its device): a
 * model wholly in host memory goes to the accelerator's device, in place,
 * so the optimizer made over it sees the move (its state follows when it is
 * prepared). A model on meta, spread by a device map or already on a device
 * stays where it is, as a user placed it. */
static accel_status place_model(accel_accelerator *acc, accel_module *m) {
    if (acc->o.no_device_placement || acc->device.type == ACCEL_DEV_CPU) return ACCEL_OK;
    accel_tensor **ts;
    int n = accel__module_unique_tensors(m, false, &ts);
    if (n < 0) return accel_last_status();
    bool host = true;
    for (int i = 0; i < n && host; i++) host = ts[i]->device.type == ACCEL_DEV_CPU;
    accel_free(ts);
    if (!host || n == 0 || accel_module_to(m, acc->device) == ACCEL_OK) return ACCEL_OK;
    /* a move that failed half-way (the device full) is undone, so that the
     * model is whole in host memory again and a retry places it */
    accel__first_error first = {0};
    accel__first_error_note(&first, accel_last_status());
    accel__first_error_note(&first, accel_module_to(m, ACCEL_CPU_DEVICE));
    return accel__first_error_return(&first);
}

/* Placement, before any of the prepare's collectives: the ranks that placed
 * keep their model on the device (a retry leaves it). */
static accel_status agree_placement(accel_accelerator *acc, accel_status mine) {
    if (acc->o.no_device_placement || acc->device.type == ACCEL_DEV_CPU) return mine;
    return accel__prepare_agree(acc, mine, "place the model on its device");
}

/* ---------------------------------------------------------------- the ranks' models */

/* What the ranks compare of a model: a CRC-32C of its state dict's names,
 * dtypes and whole shapes in order (a tp slice's whole tensor's: a model
 * cut already, by the user's plan or a prepare that failed on another rank
 * and is retried, is the model another rank's plan is about to cut), and
 * its counts of tensors and elements; not fp8's metas (accelerator_internal.h). */
enum { ARCH_CRC, ARCH_TENSORS, ARCH_NUMEL, ARCH_N };
_Static_assert(ARCH_N == 3, "accel__model_architecture's v[3]");

/* The whole shape of entry i of sd: a tp slice's whole tensor's, also
 * through a name tied to it that is no slice itself (a Llama's lm_head tied
 * to its cut embed_tokens, when the plan failed before the head). */
static void whole_shape(const accel_state_dict *sd, int i, int64_t *shape) {
    if (accel__tp_file_shape(&sd->entries[i], shape)) return;
    for (int j = 0; j < sd->n; j++)
        if (j != i && sd->entries[j].t == sd->entries[i].t && accel__tp_file_shape(&sd->entries[j], shape)) return;
}

accel_status accel__model_architecture(accel_module *m, int64_t v[3]) {
    accel_state_dict *sd = accel_module_state_dict(m);
    if (!sd) return accel_last_status();
    uint32_t crc = 0;
    v[ARCH_TENSORS] = 0;
    v[ARCH_NUMEL] = 0;
    for (int i = 0; i < sd->n; i++) {
        /* not fp8's metas, which a failed prepare's conversion left on some ranks only */
        if (sd->entries[i].is_buffer && accel__fp8_meta_name(sd->entries[i].name)) continue;
        v[ARCH_TENSORS]++;
        const accel_tensor *t = sd->entries[i].t;
        int32_t head[2] = {(int32_t)t->dtype, t->ndim};
        int64_t whole[ACCEL_MAX_DIMS], numel = 1;
        whole_shape(sd, i, whole);
        for (int d = 0; d < t->ndim; d++) numel *= whole[d];
        crc = accel__crc32c_update(crc, sd->entries[i].name, strlen(sd->entries[i].name) + 1);
        crc = accel__crc32c_update(crc, head, sizeof head);
        crc = accel__crc32c_update(crc, whole, (size_t)t->ndim * sizeof *whole);
        if (!sd->entries[i].is_tied_alias) v[ARCH_NUMEL] += numel;
    }
    v[ARCH_CRC] = crc;
    accel_state_dict_free(sd);
    return ACCEL_OK;
}

/* Every rank's model compared as it comes to prepare, before the tp plan
 * cuts it and a pipeline stage releases the others' layers, so that a
 * refused model stays whole and usable (its tp slices compared as the
 * whole tensors they are cut from): under DDP the weights' broadcast
 * meets a different model in mismatched collectives, but a tp group or a
 * pipeline's stages broadcast nothing between them, and ranks built with
 * different configs (another intermediate_size, say) trained apart, each
 * its own model, without an error. */
static accel_status agree_architecture(accel_accelerator *acc, accel_module *m) {
    if (acc->world == 1) return ACCEL_OK;
    int64_t mine[ARCH_N] = {0}, v[2 * ARCH_N];
    accel_status st = accel__prepare_agree(acc, accel__model_architecture(m, mine), "list the model's tensors");
    if (st) return st;
    for (int k = 0; k < ARCH_N; k++) v[k] = mine[k], v[ARCH_N + k] = -mine[k];
    if ((st = accel_pg_all_reduce(acc->pg, v, 2 * ARCH_N, ACCEL_I64, ACCEL_REDUCE_MAX))) return st;
    if (v[ARCH_CRC] == -v[ARCH_N + ARCH_CRC]) return ACCEL_OK;
    char counts[256] = "";
    if (v[ARCH_TENSORS] != -v[ARCH_N + ARCH_TENSORS] || v[ARCH_NUMEL] != -v[ARCH_N + ARCH_NUMEL])
        snprintf(counts, sizeof counts, "; over the ranks from %lld to %lld tensors of %lld to %lld elements",
                 (long long)-v[ARCH_N + ARCH_TENSORS], (long long)v[ARCH_TENSORS],
                 (long long)-v[ARCH_N + ARCH_NUMEL], (long long)v[ARCH_NUMEL]);
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the ranks' models differ in their tensors' names, shapes or "
                           "dtypes (rank %d's has %lld tensors of %lld elements%s): every rank must build the same "
                           "model (the same config and dtype)", PREPARE, acc->rank, (long long)mine[ARCH_TENSORS],
                           (long long)mine[ARCH_NUMEL], counts);
}

accel_status accel__model_prepare(accel_accelerator *acc, accel__model *pm) {
    /* fp8: TE's convert_model, so the scaling buffers are broadcast and saved like the others */
    static const char FP8_OP[] = "accel_accelerator_prepare (a Linear's weight)";
    accel_status placed = agree_placement(acc, place_model(acc, pm->m));
    if (placed) return placed;
    /* before anything that cuts the model (the tp plan, the pipeline's release): one refused stays whole */
    if (agree_architecture(acc, pm->m)) return accel_last_status();
    /* the split agreed on the whole model, then the tp plan slices it, then each stage keeps its part:
     * local steps, each agreed on where it runs (undone: the pipeline's split, the cp group) */
    if (accel__pipeline_split_model(acc, pm)) return accel_last_status();
    accel_status st = ACCEL_OK;
    if (acc->par.size[ACCEL__MESH_TP] > 1)
        st = accel__prepare_agree(acc, accel__tp_prepare(acc, pm->m), "slice the model for tensor parallelism");
    if (!st && acc->cp_pg)
        st = accel__prepare_agree(acc, accel__cp_prepare(acc, pm->m), "give the model its context-parallel group");
    if (!st) accel__sync_batchnorm_bind(pm->m, acc->dp_pg);
    if (!st && pm->pp_split)
        st = accel__prepare_agree(acc, accel__pipeline_keep_stage(acc, pm),
                                  "release the other pipeline stages' parameters");
    if (!st && acc->mp == ACCEL_MP_FP8) {
        st = accel__fp8_check_devices(pm->m, FP8_OP) || accel__fp8_prepare(acc, pm) ? accel_last_status() : ACCEL_OK;
        st = accel__prepare_agree(acc, st, "convert the model for fp8");
    }
    if (st) return undo_prepare(acc, pm, st);
    pm->strat = acc->strat;
    int64_t pad = pm->strat->shards ? 16 * (int64_t)acc->world : 1;
    /* pp: the stage's own parameters (the others are on meta) */
    pm->fp = acc->par.size[ACCEL__MESH_PP] > 1 ? accel__module_flatten_present(pm->m, 16, pad)
                                               : accel_module_flatten(pm->m, 16, pad);
    /* the flat buffers are the prepare's largest allocation */
    st = accel__prepare_agree(acc, pm->fp ? ACCEL_OK : accel_last_status(), "make the model's flat parameter buffers");
    if (st) return undo_prepare(acc, pm, st);
    pm->ddp = accel_pg_size(acc->dp_pg) > 1;
    /* the strategy's buffers (ZeRO's shards, the shared gradients) and the autocast hook, agreed on before
     * the broadcast; then the start, agreed on before the undo, whose release is collective under stage 3 */
    st = pm->strat->layout(acc, pm);
    if (!st) st = set_model_hook(acc, pm, &pm->hooked);
    st = accel__prepare_agree(acc, st, "lay out the model's parameters, gradients and shards");
    /* the broadcast agrees over each data-parallel group: here every rank learns how the others' went */
    if (!st && pm->ddp) st = accel__prepare_agree(acc, broadcast_weights(acc, pm), "broadcast the weights");
    if (!st) st = accel__prepare_agree(acc, pm->strat->start(acc, pm), "start the model's strategy (its buckets, "
                                       "shards or hooks)"); /* after the autocast hook: stage 3 chains to it */
    return st ? undo_prepare(acc, pm, st) : ACCEL_OK;
}

accel_status accel__model_release(accel_accelerator *acc, accel__model *pm) {
    accel_free(pm->pp_split);
    pm->pp_split = NULL;
    accel__fp8_state_free(pm->fp8);
    pm->fp8 = NULL;
    accel__cp_release(acc, pm->m);
    accel__tp_release(acc, pm->m);
    accel__sync_batchnorm_bind(pm->m, NULL);
    if (!pm->fp) return ACCEL_OK;
    accel_status st = pm->strat->release(acc, pm); /* before the autocast hook goes: stage 3 chains to it */
    if (pm->hooked) (void)accel_module_set_hook(pm->m, NULL); /* a removal, of a module: cannot fail */
    pm->hooked = false;
    accel_flat_params_free(pm->fp);
    pm->fp = NULL;
    return st;
}

/* ---------------------------------------------------------------- backward */

/* The user's hook first: it sees the leaf's whole local gradient, and what it
 * changes there is what the strategy then reduces (after, an all-reduce of
 * the bucket may be averaging that memory in place on another thread). */
static void grad_ready(accel_tensor *leaf, void *ctx) {
    accel_accelerator *acc = ctx;
    if (acc->user_ready) acc->user_ready(leaf, acc->user_ready_ctx);
    for (int i = 0; i < acc->n_models; i++) {
        accel__model *pm = &acc->models[i];
        if (pm->strat->grad_ready(acc, pm, leaf)) break;
    }
}

static void pass_begin(void *ctx) {
    accel_accelerator *acc = ctx;
    for (int i = 0; i < acc->n_models; i++) {
        accel__model *pm = &acc->models[i];
        if (pm->strat->pass_begin) pm->strat->pass_begin(acc, pm);
    }
}

/* A grad-ready hook the user set stays theirs: kept while the strategies'
 * runs (each leaf reaches both, the user's first) and set back at the end, as torch's
 * post-accumulate-grad hooks live beside DDP's reducer. */
void accel__backward_begin(accel_accelerator *acc) {
    acc->backward_scale = acc->scale; /* fp16: what the gradients of this backward are scaled by */
    bool any = false;
    for (int i = 0; i < acc->n_models; i++) {
        accel__model *pm = &acc->models[i];
        any |= pm->strat->begin_backward(acc, pm);
    }
    accel__grad_ready_hook(&acc->user_ready, &acc->user_ready_ctx);
    if (any) {
        accel_set_grad_ready_hook(grad_ready, acc);
        accel__set_pass_begin_hook(pass_begin, acc);
    }
}

accel_status accel__backward_end(accel_accelerator *acc) {
    accel_set_grad_ready_hook(acc->user_ready, acc->user_ready_ctx);
    acc->user_ready = NULL, acc->user_ready_ctx = NULL;
    accel__set_pass_begin_hook(NULL, NULL);
    accel_status first = ACCEL_OK;
    for (int i = 0; i < acc->n_models; i++) {
        accel__model *pm = &acc->models[i];
        accel_status st = pm->strat->end_backward(acc, pm);
        if (st && !first) first = st;
    }
    return first;
}
