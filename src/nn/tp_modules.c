/* Tensor-parallel modules (accel/parallel.h): a Linear, Conv1D or Embedding
 * whose weights are cut to this rank's slice (of each part, for a fused
 * projection), with Megatron-LM's forwards; the replicated ones (key/value
 * rows, q/k norms) that keep whole weights and use their rows; and
 * accel_module_parallelize, which applies a plan of path patterns to a tree
 * (PyTorch's parallelize_module). */
#include <stdio.h>
#include <string.h>

#include "core/core_internal.h"
#include "core/link.h"
#include "dist/backend.h"
#include "nn_internal.h"
#include "ops/embedding.h"
#include "tp_internal.h"

typedef struct tp_impl {
    accel_tp_style style;
    accel_pg *pg;
    accel_tp_slice w; /* the weight's slice of the whole (the rows used, for replicated ones) */
    bool conv1d;      /* a Conv1D: weight [in, out], so its split dims are the Linear's swapped */
    bool sp;          /* sequence parallelism: activations outside split along dim 1 */
    bool inner;       /* inside a region its caller entered and leaves (a sparse block's router
                       * and experts: accel__tp_enter, accel__tp_leave): no entry or exit of its own */
    int64_t pad;      /* a vocab embedding's padding_idx in the whole vocabulary (-1: none) */
    /* a replicated norm's */
    double eps;
    int64_t width;    /* over the whole width (0: per head, the whole weight) */
    int rep;          /* ranks holding each of its rows */
    bool plus_one;    /* Gemma's kind: x / rms * (1 + weight), in f32 (per head only) */
    bool layer_norm;  /* a LayerNorm with bias (Phi's q/k_layernorm; per head only) */
    int64_t first;    /* a norm of its own per head (StableLM's): this rank's first head */
    /* The group it was parallelized over, as made (its id: pg's address may
     * be a later group's once pg is freed). Once its owner let pg go
     * (accel__tp_orphan), or pg was found freed (group_of): pg is `gone`, a
     * tombstone of it owned here; accel__tp_adopt gives the group of that id
     * back to it (a model prepared again by the same accelerator). */
    accel__pg_ident of;
    accel_pg *gone;
} tp_impl;

/* t->pg, which t may read: a live group, or a tombstone. A group freed
 * under t by an owner that could not tell it (the accelerator whose tp group
 * a model was parallelized over, never prepared; the last
 * accel_dist_finalize of a default group that tp spans) gets its tombstone
 * here, before anything reads the freed memory; when that finds no memory,
 * the unnamed stand-in (tried again at the next use): t stays tensor-
 * parallel, its uses refused, rather than read as a plain module. */
static accel_pg *group_of(tp_impl *t) {
    if (t->gone || accel__pg_live(t->of.id)) return t->pg;
    char why[320];
    snprintf(why, sizeof why, "the model is tensor-parallel over process group #%llu (%d ranks), which was freed "
             "(its accelerator freed, accel_pg_free, or the last accel_dist_finalize): its slices compute only while "
             "that group lives", (unsigned long long)t->of.id, t->of.size);
    t->gone = accel__pg_tombstone(&t->of, why);
    return t->pg = t->gone ? t->gone : accel__pg_tombstone_unnamed();
}

/* Whether t's forward may run: its group lives. Over a tombstone it fails
 * as the group's collectives do, whatever the group's size (a 1-rank
 * group's forward calls none: it computed on over a freed group). */
static bool group_runs(tp_impl *t) { return accel__pg_not_gone(group_of(t)) == ACCEL_OK; }

/* Set while this thread generates with a KV cache (accel__tp_sequence_split):
 * the modules run as if planned without sequence parallelism. */
static _Thread_local bool tl_no_seq_split;

bool accel__tp_sequence_split(bool on) {
    bool prev = !tl_no_seq_split;
    tl_no_seq_split = !on;
    return prev;
}

bool accel__tp_sequence_splits(void) { return !tl_no_seq_split; }

static bool splits_seq(const tp_impl *t) { return t->sp && !tl_no_seq_split; }

/* The last region entry of this thread, for the next module that enters
 * from the same tensor: q/k/v_proj and gate/up_proj read one input, and as
 * Megatron's fused projections they share one entry, so one sequence gather
 * (one reduce-scatter of the summed gradient) or one gradient all-reduce
 * instead of one per module, and one whole input and gradient kept. Valid
 * for a step tensor x while the step arena keeps the memory below `pos`
 * (no rewind or reset since went below it: x and its entry are the same
 * tensors), under the same group, split and grad mode. */
typedef struct region_entry {
    const accel_tensor *x;
    accel_tensor *in;
    const accel_pg *pg;
    uint64_t watch;
    size_t pos;
    bool seq, grad;
} region_entry;

static _Thread_local region_entry tl_entry;

/* Into a column-parallel region: the replicated input, or the whole
 * sequence gathered from its slices (shared, see tl_entry). */
static accel_tensor *enter(const tp_impl *t, accel_tensor *x) {
    accel_arena *a = accel_step_arena();
    bool seq = splits_seq(t), grad = accel_is_grad_enabled();
    if (x && (x->flags & ACCEL_TF_ARENA) && tl_entry.x == x && tl_entry.pg == t->pg && tl_entry.seq == seq &&
        tl_entry.grad == grad && accel__arena_kept(a, ACCEL__WATCH_TP_REGION, tl_entry.watch, tl_entry.pos))
        return tl_entry.in;
    accel_tensor *in = seq ? accel_tp_gather_seq(x, t->pg) : accel_tp_copy_to_region(x, t->pg);
    if (in) tl_entry = (region_entry){x, in, t->pg, accel__arena_watch(a, ACCEL__WATCH_TP_REGION), accel_arena_used(a), seq, grad};
    return in;
}

/* Out of a row-parallel region: the sum, or this rank's sequence slice of it. */
static accel_tensor *leave(const tp_impl *t, accel_tensor *y) {
    return splits_seq(t) ? accel_tp_scatter_seq(y, t->pg) : accel_tp_reduce_from_region(y, t->pg);
}

/* ---- slices */

accel_tensor *accel_tp_slice_of(accel_tensor *whole, const accel_tp_slice *s) {
    static const char *FN = "accel_tp_slice_of";
    if (!accel_tensor_check(whole, FN, "whole")) return NULL;
    int64_t sum = 0;
    bool ok = s && s->n_parts >= 1 && s->n_parts <= ACCEL_TP_MAX_PARTS && s->dim >= 0 && s->dim < whole->ndim;
    for (int p = 0; ok && p < s->n_parts; p++) {
        ok = s->start[p] >= 0 && s->local[p] >= 0 && s->start[p] + s->local[p] <= s->full[p];
        sum += ok ? s->full[p] : 0;
    }
    if (!ok || sum != whole->shape[s->dim]) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: whole %s does not fit the slice (%s)", FN,
                        accel_shape_str(whole, b, sizeof b), !s ? "NULL" : !ok ? "its dim or parts are out of range"
                                                                     : "the parts' sizes add up to another size");
        return NULL;
    }
    accel_tensor *part[ACCEL_TP_MAX_PARTS];
    int64_t off = 0;
    for (int p = 0; p < s->n_parts; off += s->full[p++])
        if (!(part[p] = accel_slice(whole, s->dim, off + s->start[p], off + s->start[p] + s->local[p], 1)))
            return NULL;
    return s->n_parts == 1 ? part[0] : accel_concat(s->n_parts, part, s->dim);
}

/* The slice `parts` asks for along dim. */
static accel_tp_slice slice_from(int dim, const accel__tp_parts *parts) {
    accel_tp_slice s = {.dim = dim, .n_parts = parts->n};
    for (int p = 0; p < parts->n; p++) {
        s.full[p] = parts->size[p];
        s.local[p] = parts->size[p] / parts->count[p];
        s.start[p] = s.local[p] * parts->index[p];
    }
    return s;
}

accel_tensor *accel__tp_cut(accel_tensor *w, const accel_tp_slice *s) {
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *v = accel_tp_slice_of(w, s);
    accel_tensor *c = v ? accel_tensor_new(w->dtype, v->ndim, v->shape, w->device) : NULL;
    accel_status st = c ? accel_copy_(c, v) : accel_last_status();
    accel_set_grad_enabled(prev);
    if (st != ACCEL_OK) {
        accel_tensor_free(c);
        return NULL;
    }
    (void)accel_requires_grad_(c, w->requires_grad); /* c is a live tensor: cannot fail */
    return c;
}

/* ---- forwards */

/* x W^T + b (Linear: in fp8 when converted, as a plain Linear) or x W + b
 * (Conv1D); b may be NULL. */
static accel_tensor *project(accel_module *m, accel_tensor *x, accel_tensor *w, accel_tensor *b) {
    const tp_impl *t = m->impl;
    if (!t->conv1d) return accel__linear_apply(m, x, w, b);
    accel_tensor *y = accel_matmul(x, w);
    return b && y ? accel_add(y, b) : y;
}

/* This rank's rows of a whole replicated tensor (its gradient summed over
 * the group by the copy), along dim. */
static accel_tensor *replica_rows(accel_tensor *w, const tp_impl *t, int dim) {
    accel_tp_slice s = t->w;
    s.dim = dim;
    return w ? accel_tp_slice_of(accel_tp_copy_to_region(w, t->pg), &s) : NULL;
}

/* x [.., in] replicated -> [.., out / tp]: this rank's output features (of
 * each part, for a fused projection), from its slice of the weight or, with
 * replicated rows, from its rows of the whole weight. */
static accel_tensor *colwise_forward(accel_module *m, accel_tensor *x) {
    if (!group_runs(m->impl)) return NULL;
    const tp_impl *t = m->impl;
    accel_tensor *w = accel__module_tensor(m, "weight"), *b = accel__module_tensor(m, "bias");
    if (t->style == ACCEL__TP_REPLICA_ROWS) {
        w = replica_rows(w, t, t->w.dim);
        b = b ? replica_rows(b, t, 0) : NULL;
    }
    return project(m, t->inner ? x : enter(t, x), w, b);
}

/* x [.., in / tp] (or [.., in], sliced here) -> [.., out], summed over the
 * ranks; the bias, whole on every rank, added once after the sum. */
static accel_tensor *rowwise_forward(accel_module *m, accel_tensor *x) {
    if (!group_runs(m->impl)) return NULL;
    const tp_impl *t = m->impl;
    int64_t start = t->w.start[0], local = t->w.local[0];
    if (!t->inner && x && x->ndim && x->shape[x->ndim - 1] == t->w.full[0] && local != t->w.full[0])
        x = accel_slice(enter(t, x), x->ndim - 1, start, start + local, 1);
    accel_tensor *y = project(m, x, accel__module_tensor(m, "weight"), NULL);
    if (!t->inner) y = leave(t, y);
    accel_tensor *b = accel__module_tensor(m, "bias");
    return b && y ? accel_add(y, b) : y;
}

/* A 0-d tensor of ids' dtype and device holding v. */
static accel_tensor *id_scalar(const accel_tensor *ids, int64_t v) {
    accel_tensor *s = accel_empty_on(ids->dtype, 0, NULL, ids->device);
    return s && accel_fill_(s, (double)v) == ACCEL_OK ? s : NULL;
}

/* ids [...] of the full vocabulary -> [..., D]: rows this rank holds looked
 * up, zeros for the others, summed over the ranks. */
static accel_tensor *vocab_forward(accel_module *m, accel_tensor *ids) {
    if (!group_runs(m->impl)) return NULL;
    const tp_impl *t = m->impl;
    accel_tensor *w = accel__module_tensor(m, "weight");
    int64_t start = t->w.start[0], end = start + t->w.local[0];
    if (!accel_tensor_check(ids, "VocabParallelEmbedding", "ids")) return NULL;
    if (ids->dtype != ACCEL_I64 && ids->dtype != ACCEL_I32) {
        accel_set_error(ACCEL_ERR_DTYPE, "VocabParallelEmbedding: ids must be int64 or int32, got %s",
                        accel_dtype_name(ids->dtype));
        return NULL;
    }
    /* mine: start <= id < end; the others look up row 0, masked to zeros */
    accel_tensor *lo = accel_ge_scalar(ids, (double)start), *hi = accel_lt_scalar(ids, (double)end);
    accel_tensor *mine = lo && hi ? accel_where(lo, hi, lo) : NULL;
    accel_tensor *off = id_scalar(ids, start), *zero = id_scalar(ids, 0);
    accel_tensor *local = mine && off && zero ? accel_where(mine, accel_sub(ids, off), zero) : NULL;
    /* the padding row, where this rank holds it (the others look up row 0 for nothing: their
     * rows are masked, so row 0 gets zeros from them whether or not it is the pad) */
    int64_t pad = t->pad >= start && t->pad < end ? t->pad - start : -1;
    accel_tensor *e = local ? accel__embedding_padded(local, w, pad) : NULL;
    accel_tensor *mask = mine ? accel_to_dtype(accel_unsqueeze(mine, ids->ndim), w->dtype) : NULL;
    return e && mask ? leave(t, accel_mul(e, mask)) : NULL;
}

/* Per head (the whole weight) or this rank's part of a norm over the whole
 * width: x / rms(every rank's x) * its rows of the weight, the mean square
 * from the group's sum of squares (each row counted by `rep` ranks). */
static accel_tensor *replica_norm_forward(accel_module *m, accel_tensor *x) {
    if (!group_runs(m->impl)) return NULL;
    const tp_impl *t = m->impl;
    accel_tensor *w = accel__module_tensor(m, "weight");
    if (t->layer_norm) /* its weight and bias through the region's copy: their gradients summed */
        return accel_layer_norm(x, accel_tp_copy_to_region(w, t->pg),
                                accel_tp_copy_to_region(accel__module_tensor(m, "bias"), t->pg), t->eps);
    if (!t->width && !t->plus_one) return accel_rms_norm(x, accel_tp_copy_to_region(w, t->pg), t->eps);
    if (!t->width) { /* as accel__rms_norm_plus_one_forward: in f32, rounded once to x's dtype */
        accel_tensor *w1 = accel_add_scalar(accel_to_dtype(accel_tp_copy_to_region(w, t->pg), ACCEL_F32), 1.0);
        accel_tensor *y = x && w1 ? accel_rms_norm(accel_to_dtype(x, ACCEL_F32), w1, t->eps) : NULL;
        return y && accel_autocast_dtype() == ACCEL_F32 ? accel_to_dtype(y, x->dtype) : y;
    }
    int last = -1;
    accel_tensor *xf = x ? accel_to_dtype(x, ACCEL_F32) : NULL;
    accel_tensor *ss = xf ? accel_sum(accel_mul(xf, xf), 1, &last, true) : NULL; /* [.., 1] */
    /* summed forward, and its gradient summed backward: every rank's y used it */
    ss = ss ? accel_tp_copy_to_region(accel_tp_reduce_from_region(ss, t->pg), t->pg) : NULL;
    accel_tensor *inv = ss ? accel_rsqrt(accel_add_scalar(accel_mul_scalar(ss, 1.0 / ((double)t->rep * (double)t->width)),
                                                          t->eps))
                           : NULL;
    accel_tensor *y = inv ? accel_mul(accel_mul(xf, inv), replica_rows(w, t, 0)) : NULL;
    return y && accel_autocast_dtype() == ACCEL_F32 ? accel_to_dtype(y, x->dtype) : y;
}

/* StableLM's q/k_layernorm under tp: x [B, T, n, D], this rank's heads
 * first .. first + n - 1 of the norms' (norms.h, LayerNorms without bias).
 * Every head's weight goes through one copy into the region, [heads D]: each
 * rank's gradient holds its own heads' rows (zero elsewhere, and a
 * replicated key/value head's part from each rank holding it), and the
 * copy's sum in the backward gives every rank the whole, one collective
 * whichever heads a rank has. */
typedef struct head_norms {
    const tp_impl *t;
    accel_tensor *w; /* every head's weight [heads D], through the region's copy */
    int64_t D;
} head_norms;

/* This rank's head h of x through its norm: row first + h of the weights. */
static accel_tensor *rank_head_norm(void *ctx, int64_t h, accel_tensor *xh) {
    const head_norms *hn = ctx;
    int64_t at = (hn->t->first + h) * hn->D;
    return accel_layer_norm(xh, accel_slice(hn->w, 0, at, at + hn->D, 1), NULL, hn->t->eps);
}

static accel_tensor *norm_per_head_forward(accel_module *m, accel_tensor *x) {
    if (!group_runs(m->impl)) return NULL;
    const tp_impl *t = m->impl;
    accel_module *norms = m->children[0];
    int all = norms->n_children;
    if (x->ndim != 4 || x->shape[2] < 1 || t->first + x->shape[2] > all) {
        accel_set_error(ACCEL_ERR_SHAPE, "TensorParallelLayerNormPerHead: x must be [B, T, n, D] with this rank's n "
                        "heads from head %lld of its %d norms", (long long)t->first, all);
        return NULL;
    }
    accel_tensor **ws = accel_arena_alloc(accel_step_arena(), (size_t)all * sizeof *ws, 64);
    if (!ws) return NULL;
    /* Each norm's weight is read inside its own module's hooks, as the plain
     * path calls each norm (a ZeRO-3 unit on norms.h gathers the weight on
     * enter, lets it go on exit and follows the module's output into the
     * backward): per norm, entered, its weight copied (the copy holds the
     * values once the hook lets the weight go; the gradient flows back
     * through it unchanged), exited with the copy as its output, and what
     * the hook hands back taken. A hook that would change the norm's input
     * has nothing to act on here: refused. */
    for (int h = 0; h < all; h++) {
        accel_module *n = norms->children[h];
        accel_tensor *in = x;
        if (accel_module_enter(n, &in) != ACCEL_OK) return NULL;
        accel_tensor *wh = accel__module_tensor(n, "weight");
        ws[h] = in != x ? NULL : wh ? accel_mul_scalar(wh, 1.0) : NULL;
        if (!ws[h] && (in != x || !wh))
            accel_set_error(in != x ? ACCEL_ERR_UNSUPPORTED : ACCEL_ERR_STATE, "TensorParallelLayerNormPerHead: norms.%d %s",
                            h, in != x ? "has a hook that replaces its input: not run under tensor parallelism"
                                       : "has no weight");
        char why[512] = "";
        accel_status st = ws[h] ? ACCEL_OK : accel_last_status();
        if (st) snprintf(why, sizeof why, "%s", accel_last_error());
        accel_status e = accel_module_exit(n, &ws[h]); /* runs the post hook, with no output after a failure */
        if (st) {
            accel_set_error(st, "%s", why);
            return NULL;
        }
        if (e) return NULL;
    }
    accel_tensor *w = accel_concat(all, ws, 0);
    if (!w) return NULL;
    head_norms hn = {t, accel_tp_copy_to_region(w, t->pg), x->shape[3]};
    return hn.w ? accel__each_head(x, rank_head_norm, &hn) : NULL;
}

static void tp_free(accel_module *m) {
    tp_impl *t = m->impl;
    if (t) accel__pg_tombstone_free(t->gone);
    accel_free(t);
}

static const accel_module_ops COLWISE_OPS = {"ColwiseParallelLinear", colwise_forward, tp_free};
static const accel_module_ops ROWWISE_OPS = {"RowwiseParallelLinear", rowwise_forward, tp_free};
static const accel_module_ops VOCAB_OPS = {"VocabParallelEmbedding", vocab_forward, tp_free};
static const accel_module_ops REPLICA_OPS = {"ReplicatedRowsLinear", colwise_forward, tp_free};
static const accel_module_ops REPLICA_NORM_OPS = {"TensorParallelRMSNorm", replica_norm_forward, tp_free};
static const accel_module_ops NORM_PER_HEAD_OPS = {"TensorParallelLayerNormPerHead", norm_per_head_forward, tp_free};

/* A per-head norm of a tensor-parallel StableLmLayerNormPerHead (its
 * norms.h): a plain LayerNorm whose weight the parent sums. */
static bool head_norm_of_tp(const accel_module *m) {
    return m->parent && m->parent->parent && m->parent->parent->ops == &NORM_PER_HEAD_OPS;
}

/* Modules whose whole parameters get their gradients summed in the graph. */
bool accel__tp_is_replica(const accel_module *m) {
    return m->ops == &REPLICA_OPS || m->ops == &REPLICA_NORM_OPS || m->ops == &NORM_PER_HEAD_OPS || head_norm_of_tp(m);
}

/* The modules with a tp_impl (a tp norm's heads have their own impl). */
static bool is_tp(const accel_module *m) {
    return m->ops == &COLWISE_OPS || m->ops == &ROWWISE_OPS || m->ops == &VOCAB_OPS || m->ops == &REPLICA_OPS ||
           m->ops == &REPLICA_NORM_OPS || m->ops == &NORM_PER_HEAD_OPS;
}

bool accel_module_tp_slice(const accel_module *m, const accel_tensor *t, accel_tp_slice *s) {
    if (!m || !t || !is_tp(m) || accel__tp_is_replica(m)) return false;
    const tp_impl *ti = m->impl;
    accel_module *mm = (accel_module *)m; /* accel__module_tensor only reads */
    bool weight = t == accel__module_tensor(mm, "weight");
    /* a column-parallel bias is cut as the weight's output features; a row-parallel one is whole */
    if (!weight && (ti->style != ACCEL_TP_COLWISE || t != accel__module_tensor(mm, "bias"))) return false;
    if (s) {
        *s = ti->w;
        if (!weight) s->dim = 0;
    }
    return true;
}

bool accel__tp_linear_gemm_shape(const accel_module *m, int64_t shape[2]) {
    if (!m || (m->ops != &COLWISE_OPS && m->ops != &ROWWISE_OPS && m->ops != &REPLICA_OPS)) return false;
    const tp_impl *t = m->impl;
    const accel_tensor *w = accel__module_tensor((accel_module *)m, "weight"); /* only reads */
    if (t->conv1d || !w || w->ndim != 2) return false;
    shape[0] = w->shape[0], shape[1] = w->shape[1];
    if (m->ops == &REPLICA_OPS) { /* the rows it uses of the whole weight */
        shape[t->w.dim] = 0;
        for (int p = 0; p < t->w.n_parts; p++) shape[t->w.dim] += t->w.local[p];
    }
    return true;
}

/* Replicated rows hold whole tensors, and one range describes neither a
 * Conv1D's columns nor a fused projection's parts: no slice to report. */
bool accel_module_tp_info(const accel_module *m, accel_tp_style *style, accel_pg **pg, int64_t *start,
                          int64_t *full) {
    if (!m || !is_tp(m) || accel__tp_is_replica(m)) return false;
    group_of(m->impl);
    const tp_impl *t = m->impl;
    if (t->conv1d || t->w.n_parts != 1) return false;
    if (style) *style = t->style;
    if (pg) *pg = t->pg;
    if (start) *start = t->w.start[0];
    if (full) *full = t->w.full[0];
    return true;
}

/* ---- cutting the weights */

static const char *style_name(accel_tp_style s) {
    return s == ACCEL_TP_COLWISE ? "ACCEL_TP_COLWISE"
           : s == ACCEL_TP_ROWWISE ? "ACCEL_TP_ROWWISE"
           : s == ACCEL_TP_VOCAB_EMBEDDING ? "ACCEL_TP_VOCAB_EMBEDDING"
           : s == ACCEL__TP_REPLICA_ROWS ? "replicated rows"
                                         : NULL;
}

static bool is_conv1d(const accel_module *m) { return !strcmp(m->ops->type_name, "Conv1D"); }

/* The dimension of the weight a style splits: a Linear's rows are its
 * output features, a Conv1D's columns. */
static int split_dim(accel_tp_style s, bool conv1d) { return (s == ACCEL_TP_ROWWISE) != conv1d; }

static void replace_in(accel_module *m, const accel_tensor *old, accel_tensor *neu) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].t == old) m->tensors[i].t = neu;
    for (int i = 0; i < m->n_children; i++) replace_in(m->children[i], old, neu);
}

/* Replaces every reference to `old` in the tree holding m by `neu` (tied
 * names keep sharing), then frees old. neu takes old's role (a parameter or
 * buffer): without it the slice is no tracked weight, so each GEMM would
 * convert it in the step arena at every call instead of reading its
 * prepared form (core/prepared.h), which the memory model counts outside. */
static void replace_tensor(accel_module *m, accel_tensor *old, accel_tensor *neu) {
    neu->flags |= old->flags & (ACCEL_TF_PARAM | ACCEL_TF_BUFFER);
    accel_module *top = m;
    while (top->parent) top = top->parent;
    replace_in(top, old, neu);
    accel__tensor_free_member(old, true);
}

/* The whole split dimension as one part, slice `part` of `parts`. */
static accel__tp_parts one_part(int64_t size, int part, int parts) {
    return (accel__tp_parts){.n = 1, .size = {size}, .index = {part}, .count = {parts}};
}

/* Why m cannot take style cut as `parts` says (NULL: the whole dimension,
 * over n ranks), as an error naming path; ACCEL_OK when it can. */
static accel_status check_one(accel_module *m, accel_tp_style style, const accel__tp_parts *parts, int n,
                              const char *path) {
    accel_tensor *w = accel__module_tensor(m, "weight"), *b = accel__module_tensor(m, "bias");
    bool embedding = style == ACCEL_TP_VOCAB_EMBEDDING;
    const char *want = embedding ? "Embedding" : "Linear or Conv1D", *sn = style_name(style);
    if (!sn) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s: unknown style %d", path,
                                    (int)style);
    if (is_tp(m))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s is already parallelized (%s)", path,
                               m->ops->type_name);
    bool type_ok = embedding ? !strcmp(m->ops->type_name, "Embedding")
                             : !strcmp(m->ops->type_name, "Linear") || is_conv1d(m);
    /* impl: a module's own state, which the tp one would drop (an Embedding's padding_idx it keeps) */
    bool own = m->impl && !(embedding && accel__embedding_padding_idx(m) >= 0);
    if (!type_ok || own || !w || w->ndim != 2)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s is a %s: %s takes a %s", path,
                               m->ops->type_name, sn, want);
    if (w->device.type == ACCEL_DEV_META || (b && b->device.type == ACCEL_DEV_META))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s has its weights on meta: "
                               "materialize or load them first (each rank cuts its slice from the whole)", path);
    int d = split_dim(style, is_conv1d(m));
    const char *what = d != is_conv1d(m) ? "in_features" : embedding ? "num_embeddings" : "out_features";
    accel__tp_parts whole = one_part(w->shape[d], 0, n);
    if (!parts) parts = &whole;
    int64_t sum = 0;
    for (int p = 0; p < parts->n; p++) {
        sum += parts->size[p];
        if (parts->size[p] % parts->count[p])
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s: %s splits %s %lld%s, which %d "
                                   "ranks cannot share equally", path, sn, what, (long long)parts->size[p],
                                   parts->n > 1 ? " (a part of them)" : "", parts->count[p]);
    }
    if (sum != w->shape[d])
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s: its parts' sizes add up to %lld, "
                               "not its %s %lld", path, (long long)sum, what, (long long)w->shape[d]);
    return ACCEL_OK;
}

/* Makes m (checked) the style's module; cut_w: its weight is replaced by
 * this rank's slice, else it already is that slice (a tied tensor cut by
 * another module); cut_b: likewise a COLWISE bias, which may be whole where
 * its weight is not (Phi's lm_head, tied to embed_tokens, has a bias of its
 * own); replicated rows stay whole. */
static accel_status apply_one(accel_module *m, accel_tp_style style, accel_pg *pg, const accel__tp_parts *parts,
                              bool cut_w, bool cut_bias, bool sp, bool inner) {
    accel_tensor *w = accel__module_tensor(m, "weight"), *b = accel__module_tensor(m, "bias");
    bool conv1d = is_conv1d(m);
    tp_impl *t = accel_malloc(sizeof *t);
    if (!t) return accel_last_status();
    *t = (tp_impl){.style = style, .pg = pg, .of = accel__pg_identity(pg), .w = slice_from(split_dim(style, conv1d), parts), .conv1d = conv1d,
                   .sp = sp, .inner = inner, .pad = style == ACCEL_TP_VOCAB_EMBEDDING ? accel__embedding_padding_idx(m) : -1};
    if (style != ACCEL__TP_REPLICA_ROWS) {
        bool cut_b = b && style == ACCEL_TP_COLWISE && cut_bias;
        accel_tp_slice bs = t->w;
        bs.dim = 0;
        accel_tensor *nw = cut_w ? accel__tp_cut(w, &t->w) : NULL;
        accel_tensor *nb = (nw || !cut_w) && cut_b ? accel__tp_cut(b, &bs) : NULL;
        if ((cut_w && !nw) || (cut_b && !nb)) {
            accel_tensor_free(nw);
            accel_free(t);
            return accel_last_status();
        }
        if (nw) replace_tensor(m, w, nw);
        if (nb) replace_tensor(m, b, nb);
    }
    m->ops = style == ACCEL_TP_COLWISE                ? &COLWISE_OPS
             : style == ACCEL_TP_ROWWISE              ? &ROWWISE_OPS
             : style == ACCEL_TP_VOCAB_EMBEDDING      ? &VOCAB_OPS
                                                      : &REPLICA_OPS;
    accel_free(m->impl); /* a padded Embedding's padding_idx, now t->pad */
    m->impl = t;
    return ACCEL_OK;
}

accel_status accel__tp_parallelize_one(accel_module *m, accel_tp_style style, accel_pg *pg,
                                       const accel__tp_parts *parts, bool sp, bool inner, const char *path) {
    if (check_one(m, style, parts, accel_pg_size(pg), path)) return accel_last_status();
    /* inside a region a row-parallel output is summed by the region's caller: a bias would be added once
     * per rank (the experts have none) */
    if (inner && style == ACCEL_TP_ROWWISE && accel__module_tensor(m, "bias"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a row-parallel Linear with a bias inside a "
                               "tensor-parallel region is not implemented", path);
    return apply_one(m, style, pg, parts, true, true, sp, inner);
}

accel_tensor *accel__tp_enter(const accel_module *m, accel_tensor *x) {
    return group_runs(m->impl) ? enter(m->impl, x) : NULL;
}

accel_tensor *accel__tp_leave(const accel_module *m, accel_tensor *y) {
    return group_runs(m->impl) ? leave(m->impl, y) : NULL;
}

accel_pg *accel__tp_group(const accel_module *m) {
    return m && is_tp(m) ? group_of(m->impl) : NULL;
}

/* Whether pg is the group t was parallelized over, with this rank where t's
 * slices were cut for (by id: a group made at a freed one's address is another). */
static bool same_group(const tp_impl *t, const accel_pg *pg) {
    accel__pg_ident g = accel__pg_identity(pg);
    return g.id == t->of.id && g.size == t->of.size && g.rank == t->of.rank;
}

void accel__tp_orphan(accel_module *m, const accel_pg *pg, const char *why) {
    tp_impl *t = is_tp(m) ? m->impl : NULL;
    if (t && !t->gone && same_group(t, pg) && (t->gone = accel__pg_tombstone(&t->of, why))) t->pg = t->gone;
    for (int i = 0; i < m->n_children; i++) accel__tp_orphan(m->children[i], pg, why);
}

void accel__tp_adopt(accel_module *m, accel_pg *pg) {
    tp_impl *t = is_tp(m) ? m->impl : NULL;
    if (t && t->gone && same_group(t, pg)) {
        accel__pg_tombstone_free(t->gone);
        t->gone = NULL;
        t->pg = pg;
    }
    for (int i = 0; i < m->n_children; i++) accel__tp_adopt(m->children[i], pg);
}

accel_status accel__tp_replica_norm(accel_module *m, accel_pg *pg, double eps, const accel__tp_parts *rows, int rep,
                                    bool plus_one) {
    ACCEL_ASSERT(!(rows && plus_one)); /* no row has such norms: accel__arch_unsupported */
    /* a LayerNorm (its bias): Phi's per-head q/k_layernorm */
    bool layer_norm = accel__module_tensor(m, "bias") != NULL;
    ACCEL_ASSERT(!(layer_norm && (rows || plus_one)));
    tp_impl *t = accel_malloc(sizeof *t);
    if (!t) return accel_last_status();
    *t = (tp_impl){.pg = pg, .of = accel__pg_identity(pg), .eps = eps, .rep = rep, .plus_one = plus_one, .layer_norm = layer_norm};
    if (rows) {
        t->w = slice_from(0, rows);
        t->width = rows->size[0];
    }
    accel_free(m->impl); /* the norm's own (its eps): the norms' ops free theirs so */
    m->ops = &REPLICA_NORM_OPS;
    m->impl = t;
    return ACCEL_OK;
}

accel_status accel__tp_norm_per_head(accel_module *m, accel_pg *pg, double eps, int64_t first) {
    tp_impl *t = accel_malloc(sizeof *t);
    if (!t) return accel_last_status();
    *t = (tp_impl){.pg = pg, .of = accel__pg_identity(pg), .eps = eps, .first = first};
    accel_free(m->impl);
    m->ops = &NORM_PER_HEAD_OPS;
    m->impl = t;
    return ACCEL_OK;
}

/* ---- plans */

/* '*' matches a run of characters without '.'; everything else itself. */
static bool glob_match(const char *p, const char *s) {
    if (!*p) return !*s;
    if (*p == '*') {
        for (;; s++) {
            if (glob_match(p + 1, s)) return true;
            if (!*s || *s == '.') return false;
        }
    }
    return *p == *s && glob_match(p + 1, s + 1);
}

typedef struct plan_walk {
    const accel_tp_plan_entry *plan;
    int n;
    int *hits;           /* per entry */
    accel_module **mods; /* matched modules, in tree order */
    int *entry;          /* their entries */
    int n_mods;          /* the arrays have room for every module of the tree */
} plan_walk;

static int count_modules(const accel_module *m) {
    int n = 1;
    for (int i = 0; i < m->n_children; i++) n += count_modules(m->children[i]);
    return n;
}

static accel_status walk(accel_module *m, char *path, size_t len, size_t cap, plan_walk *w) {
    for (int e = 0; e < w->n && len; e++) {
        if (!glob_match(w->plan[e].pattern, path)) continue;
        w->mods[w->n_mods] = m;
        w->entry[w->n_mods++] = e;
        w->hits[e]++;
        break;
    }
    for (int i = 0; i < m->n_children; i++) {
        int k = snprintf(path + len, cap - len, "%s%s", len ? "." : "", m->children[i]->name);
        if (k < 0 || (size_t)k >= cap - len)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: a module path is longer than "
                                   "%zu characters", cap - 1);
        if (walk(m->children[i], path, len + (size_t)k, cap, w)) return accel_last_status();
        path[len] = 0;
    }
    return ACCEL_OK;
}

/* The tensors a module will cut (weight, and a COLWISE bias), which no
 * module outside the plan, or one cutting another way, may share. */
static accel_status check_ties(accel_module *root, plan_walk *w) {
    accel_state_dict *sd = accel_module_state_dict(root);
    if (!sd) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < sd->n && st == ACCEL_OK; i++) {
        int k = 0;
        while (k < w->n_mods && w->mods[k] != sd->entries[i].owner) k++;
        for (int j = 0; j < sd->n && st == ACCEL_OK; j++) {
            if (j == i || sd->entries[j].t != sd->entries[i].t) continue;
            int l = 0;
            while (l < w->n_mods && w->mods[l] != sd->entries[j].owner) l++;
            bool in_i = k < w->n_mods, in_j = l < w->n_mods;
            if (!in_i && !in_j) continue;
            if (in_i && in_j &&
                split_dim(w->plan[w->entry[k]].style, is_conv1d(w->mods[k])) ==
                    split_dim(w->plan[w->entry[l]].style, is_conv1d(w->mods[l])))
                continue;
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s and %s are tied, but the plan "
                                 "%s: a tied tensor must be cut the same way by both", sd->entries[i].name,
                                 sd->entries[j].name, in_i && in_j ? "splits them along different dims"
                                                                    : "parallelizes only one of them");
        }
    }
    accel_state_dict_free(sd);
    return st;
}

accel_status accel_module_parallelize(accel_module *root, const accel_tp_plan_entry *plan, int n_entries,
                                      accel_pg *pg) {
    static const char *FN = "accel_module_parallelize";
    if (!root || !pg || (n_entries > 0 && !plan) || n_entries < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s", FN, !root ? "module is NULL" : !pg ? "process group is NULL"
                               : "plan is NULL or n_entries negative");
    if (accel__link_binds(root->links))
        return accel_set_error(ACCEL_ERR_STATE, "%s: the model is tied to an Accelerator that prepared it or to the "
                               "accel_dispatched handle its load or dispatch returned: a model is cut for tensor "
                               "parallelism before accel_accelerator_prepare (which cuts it itself under a tp mesh), "
                               "and only once that handle is freed (accel_dispatched_free: with every weight "
                               "materialised, as accel_llama_from_pretrained without a device map leaves them, the "
                               "model needs nothing of it)", FN);
    for (int e = 0; e < n_entries; e++)
        if (!plan[e].pattern || !*plan[e].pattern)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: plan entry %d has no pattern", FN, e);
    size_t n_tree = (size_t)count_modules(root);
    plan_walk w = {.plan = plan, .n = n_entries, .hits = accel_calloc((size_t)n_entries + 1, sizeof(int)),
                   .mods = accel_calloc(n_tree, sizeof(accel_module *)), .entry = accel_calloc(n_tree, sizeof(int))};
    char path[1024] = "";
    accel_status st = w.hits && w.mods && w.entry ? walk(root, path, 0, sizeof path, &w) : accel_last_status();
    for (int e = 0; e < n_entries && st == ACCEL_OK; e++)
        if (!w.hits[e])
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: plan entry %d (\"%s\") matches no module", FN, e,
                                 plan[e].pattern);
    if (st == ACCEL_OK) st = check_ties(root, &w);
    int rank = accel_pg_rank(pg), parts = accel_pg_size(pg);
    /* everything checked before the first cut, so a refused plan leaves the model whole */
    for (int k = 0; k < w.n_mods && st == ACCEL_OK; k++) {
        accel_module_path(w.mods[k], path, sizeof path);
        st = check_one(w.mods[k], plan[w.entry[k]].style, NULL, parts, path);
    }
    /* a tied tensor is cut once: its second module finds it already this
     * rank's slice (done: each module's weight and bias after its cut) */
    accel_tensor **done = st == ACCEL_OK ? accel_calloc(2 * (size_t)w.n_mods + 1, sizeof *done) : NULL;
    if (st == ACCEL_OK && !done) st = accel_last_status();
    for (int k = 0; k < w.n_mods && st == ACCEL_OK; k++) {
        accel_tensor *wt = accel__module_tensor(w.mods[k], "weight"), *bt = accel__module_tensor(w.mods[k], "bias");
        bool cut_before = false, bias_cut_before = false;
        for (int j = 0; j < 2 * k; j++) {
            cut_before = cut_before || done[j] == wt;
            bias_cut_before = bias_cut_before || (bt && done[j] == bt);
        }
        accel_tp_style style = plan[w.entry[k]].style;
        int64_t size = wt->shape[split_dim(style, is_conv1d(w.mods[k]))] * (cut_before ? parts : 1);
        accel__tp_parts one = one_part(size, rank, parts);
        st = apply_one(w.mods[k], style, pg, &one, !cut_before, !bias_cut_before, plan[w.entry[k]].sequence_parallel,
                       false);
        done[2 * k] = accel__module_tensor(w.mods[k], "weight");
        done[2 * k + 1] = style == ACCEL_TP_COLWISE ? accel__module_tensor(w.mods[k], "bias") : NULL;
    }
    accel_free(done);
    accel_free(w.hits);
    accel_free(w.mods);
    accel_free(w.entry);
    return st;
}

/* accel_module_tp_reduce_grads over m and its descendants. Walks the tree
 * itself, not a state dict: it runs every synced step, and a steady step
 * allocates nothing. A tied parameter is summed once: its owned entry. */
static accel_status reduce_grads_of(accel_module *m, accel_pg *pg) {
    for (int i = 0; i < m->n_tensors; i++) {
        const accel_named_tensor *nt = &m->tensors[i];
        accel_tensor *g = nt->t->grad;
        if (nt->is_buffer || !nt->owned || !g) continue;
        /* slices are this rank's own; replicated rows were summed by their copy */
        if (accel_module_tp_slice(m, nt->t, NULL) || accel__tp_is_replica(m)) continue;
        if (!accel_is_contiguous(g) || g->device.type != ACCEL_DEV_CPU)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_module_tp_reduce_grads: the gradient of %s (a %s's) "
                                   "is not a contiguous cpu tensor", nt->name, m->ops->type_name);
        accel_status st = accel_pg_all_reduce(pg, accel__device_ptr(g), (size_t)accel_numel(g), g->dtype,
                                              ACCEL_REDUCE_SUM);
        if (st) return st;
    }
    for (int i = 0; i < m->n_children; i++) {
        accel_status st = reduce_grads_of(m->children[i], pg);
        if (st) return st;
    }
    return ACCEL_OK;
}

accel_status accel_module_tp_reduce_grads(accel_module *root, accel_pg *pg) {
    if (!root || !pg)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_tp_reduce_grads: %s is NULL",
                               root ? "process group" : "module");
    return reduce_grads_of(root, pg);
}
