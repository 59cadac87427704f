/* Context parallelism's differentiable collectives and sequence layout
 * (accel/cp.h): all_gather (backward: reduce-scatter) and all_to_all
 * (backward: all_to_all), on contiguous cpu tensors (the group is handed
 * their memory, accel__device_ptr; nothing here reads it), the sharded
 * loss, and the load-balanced chunk layout (rank i: chunks i and 2*cp-1-i). */
#include <string.h>

#include "accel/cp.h"
#include "accel/parallel.h"
#include "cp_loss.h"
#include "nn_internal.h"

/* x on the cpu (the collectives move host bytes). */
static bool cpu_only(const char *op, const accel_tensor *x) {
    if (x->device.type == ACCEL_DEV_CPU) return true;
    accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: context-parallel collectives run on cpu tensors (this one is on %s)",
                    op, accel_device_type_name(x->device.type));
    return false;
}

static bool check_pg(const char *op, accel_pg *pg) {
    if (pg) return true;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: process group is NULL", op);
    return false;
}

/* ---------------------------------------------------------------- all_gather */

static accel_status gather_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0], *gc = accel__contig(g);
    accel_tensor *gx = gc ? accel_empty_on(gc->dtype, x->ndim, x->shape, x->device) : NULL;
    if (!gx) return accel_last_status();
    accel_status st = accel_pg_reduce_scatter(n->ctx, accel__device_ptr(gc), accel__device_ptr(gx),
                                              (size_t)accel_numel(x), gc->dtype, ACCEL_REDUCE_SUM);
    return st == ACCEL_OK ? accel_grad_accumulate(x, gx) : st;
}

accel_tensor *accel_cp_all_gather(accel_pg *pg, accel_tensor *x) {
    static const char *OP = "accel_cp_all_gather";
    accel_device dev;
    if (!check_pg(OP, pg) || !accel__op_begin(OP, 1, &x, &dev) || !cpu_only(OP, x)) return NULL;
    if (x->ndim >= ACCEL_MAX_DIMS) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x has %d dims; the result would have more than %d", OP, x->ndim,
                        ACCEL_MAX_DIMS);
        return NULL;
    }
    int64_t shape[ACCEL_MAX_DIMS] = {accel_pg_size(pg)};
    memcpy(shape + 1, x->shape, (size_t)x->ndim * sizeof *shape);
    accel_tensor *xc = accel__contig(x), *out = xc ? accel__op_out(x->dtype, x->ndim + 1, shape, dev) : NULL;
    if (!out) return NULL;
    if (accel_pg_all_gather(pg, accel__device_ptr(xc), accel__device_ptr(out), (size_t)accel_numel(x), x->dtype) !=
        ACCEL_OK)
        return NULL;
    accel_node *n = accel_tape_record("cp_all_gather", gather_backward, out, 1, &x);
    if (n) n->ctx = pg;
    return out;
}

/* ---------------------------------------------------------------- all_to_all */

static accel_tensor *all_to_all(accel_pg *pg, accel_tensor *x) {
    accel_tensor *xc = accel__contig(x), *out = xc ? accel__op_out(x->dtype, x->ndim, x->shape, x->device) : NULL;
    if (!out) return NULL;
    size_t block = (size_t)(accel_numel(x) / accel_pg_size(pg));
    return accel_pg_all_to_all(pg, accel__device_ptr(xc), accel__device_ptr(out), block, x->dtype) == ACCEL_OK ? out
                                                                                                           : NULL;
}

/* all_to_all is its own adjoint: block k of the output came from rank k's
 * block `rank`, so its gradient goes back there the same way. */
static accel_status a2a_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *gx = all_to_all(n->ctx, g);
    return gx ? accel_grad_accumulate(n->inputs[0], gx) : accel_last_status();
}

accel_tensor *accel_cp_all_to_all(accel_pg *pg, accel_tensor *x) {
    static const char *OP = "accel_cp_all_to_all";
    accel_device dev;
    if (!check_pg(OP, pg) || !accel__op_begin(OP, 1, &x, &dev) || !cpu_only(OP, x)) return NULL;
    if (x->ndim == 0 || x->shape[0] != accel_pg_size(pg)) {
        char s[96];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x of shape %s must have the group size (%d) as its first dim", OP,
                        accel_shape_str(x, s, sizeof s), accel_pg_size(pg));
        return NULL;
    }
    accel_tensor *out = all_to_all(pg, x);
    if (!out) return NULL;
    accel_node *n = accel_tape_record("cp_all_to_all", a2a_backward, out, 1, &x);
    if (n) n->ctx = pg;
    return out;
}

/* ---------------------------------------------------------------- loss */

/* The share's gradient is the loss's: each rank back-propagates its own share. */
static accel_status share_backward(accel_node *n, accel_tensor *g) { return accel_grad_accumulate(n->inputs[0], g); }

/* This rank's mean loss over its targets and their count; NULL (error set)
 * on a failure here, which the caller still reports to the group. Under tp
 * the logits are this rank's vocabulary columns from vocab_start: the
 * vocab-parallel loss, the same on every rank of tp. */
static accel_tensor *local_loss(accel_tensor *logits, accel_tensor *targets, int64_t ignore_index, accel_pg *tp,
                                int64_t vocab_start, int64_t *count) {
    static const char *OP = "accel_cp_cross_entropy";
    if (!accel_tensor_check(targets, OP, "targets") || !accel_tensor_check(logits, OP, "logits") ||
        !cpu_only(OP, logits))
        return NULL;
    int64_t nt = accel_numel(targets);
    int64_t *ids = accel_arena_alloc(accel_step_arena(), (size_t)(nt ? nt : 1) * sizeof *ids, 64);
    if (!ids || accel_to_int64s(targets, ids) != ACCEL_OK) return NULL;
    for (int64_t i = 0; i < nt; i++) *count += ids[i] != ignore_index;
    /* mean over my targets */
    return tp ? accel_tp_cross_entropy(logits, targets, vocab_start, ignore_index, tp)
              : accel_cross_entropy(logits, targets, ignore_index);
}

/* Joins an all-reduce (SUM) of vals[0..n-2] and of this rank's failure flag
 * in vals[n-1]: every rank learns at once when one failed, rather than its
 * partners waiting in the next collective until the group's timeout. False
 * (error set: this rank's own, or how many others failed) when any did. */
static bool all_reduce_or_fail(accel_pg *pg, double *vals, int n, bool failed, const char *what) {
    static const char *OP = "accel_cp_cross_entropy";
    vals[n - 1] = failed;
    int rank = accel_pg_rank(pg);
    if (accel_pg_all_reduce(pg, vals, (size_t)n, ACCEL_F64, ACCEL_REDUCE_SUM) != ACCEL_OK) return false;
    if (failed) return false; /* this rank's own error stands */
    if (vals[n - 1] > 0)
        accel_set_error(ACCEL_ERR_STATE, "%s: %.0f other rank(s) of the cp group (this is rank %d of %d) failed %s; "
                        "their errors say why", OP, vals[n - 1], rank, accel_pg_size(pg), what);
    return vals[n - 1] == 0;
}

accel_tensor *accel_cp_cross_entropy(accel_pg *pg, accel_tensor *logits, accel_tensor *targets, int64_t ignore_index) {
    return accel__cp_cross_entropy(pg, logits, targets, ignore_index, NULL, 0);
}

accel_tensor *accel__cp_cross_entropy(accel_pg *pg, accel_tensor *logits, accel_tensor *targets,
                                      int64_t ignore_index, accel_pg *tp, int64_t vocab_start) {
    if (!check_pg("accel_cp_cross_entropy", pg)) return NULL;
    int64_t local = 0;
    accel_tensor *ce = local_loss(logits, targets, ignore_index, tp, vocab_start, &local);
    double counts[2] = {(double)local};
    if (!all_reduce_or_fail(pg, counts, 2, !ce, "computing their token losses")) return NULL;
    /* no target here: a share of 0 that still reaches the logits (the mean of none is NaN) */
    accel_tensor *share = local ? accel_mul_scalar(ce, (double)local / counts[0])
                                : accel_mul_scalar(accel_sum_all(logits), 0.0);
    if (share && share->dtype != ACCEL_F32) share = accel_to_dtype(share, ACCEL_F32);
    accel_tensor *out = share ? accel__op_out(ACCEL_F32, 0, NULL, share->device) : NULL;
    double total[2] = {out ? accel_item(share) : 0.0};
    if (!all_reduce_or_fail(pg, total, 2, !out, "scaling their shares") || accel_fill_(out, total[0]) != ACCEL_OK)
        return NULL;
    accel_tape_record("cp_loss_share", share_backward, out, 1, &share);
    return out;
}

/* ---------------------------------------------------------------- layout */

accel_tensor *accel_cp_rope_freqs(accel_tensor *x, int cp, int rank, const float *inv_freq,
                                  double attention_scaling) {
    static const char *OP = "accel_cp_rope_freqs";
    if (!accel_tensor_check(x, OP, "x")) return NULL;
    if (cp < 1 || rank < 0 || rank >= cp || x->ndim != 4 || x->shape[2] % 2 != 0) {
        char s[96];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x of shape %s, rank %d of cp %d: [B, H, 2c, D] expected", OP,
                        accel_shape_str(x, s, sizeof s), rank, cp);
        return NULL;
    }
    int64_t c = x->shape[2] / 2, pos[2] = {accel_cp_position(0, c, cp, rank), accel_cp_position(c, c, cp, rank)};
    return accel__rope_runs(x, 2, pos, inv_freq, attention_scaling);
}

int64_t accel_cp_position(int64_t t, int64_t c, int cp, int rank) {
    if (c < 1 || cp < 1 || rank < 0 || rank >= cp || t < 0 || t >= 2 * c) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_cp_position: position %lld of rank %d among %d with chunks of "
                        "%lld (needs chunks >= 1, 0 <= rank < cp, 0 <= position < 2 x chunk)", (long long)t, rank, cp,
                        (long long)c);
        return -1;
    }
    int64_t chunk = t < c ? rank : 2 * (int64_t)cp - 1 - rank;
    return chunk * c + t % c;
}

accel_tensor *accel_cp_shard(const accel_tensor *batch, int cp, int rank) {
    static const char *OP = "accel_cp_shard";
    if (!accel_tensor_check(batch, OP, "batch")) return NULL;
    if (cp < 1 || rank < 0 || rank >= cp) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: rank %d of cp %d", OP, rank, cp);
        return NULL;
    }
    if (batch->ndim != 2 || batch->shape[1] % (2 * cp) != 0) {
        char s[96];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: batch of shape %s: [B, T] with T divisible by 2*cp = %d expected", OP,
                        accel_shape_str(batch, s, sizeof s), 2 * cp);
        return NULL;
    }
    int64_t c = batch->shape[1] / (2 * cp);
    accel_tensor *b = (accel_tensor *)batch;
    accel_tensor *parts[2] = {accel_slice(b, 1, rank * c, (rank + 1) * c, 1),
                              accel_slice(b, 1, (2 * cp - 1 - rank) * c, (2 * cp - rank) * c, 1)};
    if (!parts[0] || !parts[1]) return NULL;
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *out = accel_concat(2, parts, 1);
    accel_set_grad_enabled(prev);
    return out;
}
