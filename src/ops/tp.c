/* Tensor-parallel collectives as differentiable ops (accel/parallel.h):
 * Megatron's copy-to / reduce-from / gather-from tp region ops, the
 * sequence-parallel gather and scatter, and the vocabulary-parallel
 * cross-entropy. The group is the caller's (an accel_pg): this layer knows
 * nothing of meshes or accelerators. The reductions run on host memory. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "accel/parallel.h"
#include "nn_internal.h"
#include "ops_util.h"
#include "tp_stats.h"

/* Bytes this process gave the tp collectives (tp_stats.h): one counter for
 * every thread (a group's collectives come from one thread, groups may not). */
static _Atomic uint64_t tp_bytes;

uint64_t accel__tp_bytes(void) { return atomic_load_explicit(&tp_bytes, memory_order_relaxed); }

static void count(size_t bytes) { atomic_fetch_add_explicit(&tp_bytes, bytes, memory_order_relaxed); }

static bool tp_args(const char *op, accel_tensor *x, accel_pg *pg) {
    if (!accel__op_begin(op, 1, &x, &(accel_device){0})) return false;
    if (!pg) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: process group is NULL", op);
        return false;
    }
    if (x->device.type != ACCEL_DEV_CPU) {
        char d[32];
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: tensor on %s: tensor-parallel collectives run on cpu tensors",
                        op, accel_device_str(x->device, d, sizeof d));
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ collectives into a result */

/* A collective over pg from `in` into `out`, a contiguous tensor made by the
 * caller (its shape the collective's result's): the sum (dim unused), or
 * along dim a gather or a reduce-scatter. */
typedef accel_status (*collective_fn)(accel_tensor *in, accel_pg *pg, int dim, accel_tensor *out);

static accel_status sum_into(accel_tensor *in, accel_pg *pg, int dim, accel_tensor *out) {
    (void)dim;
    if (accel_copy_(out, in) != ACCEL_OK) return accel_last_status();
    if (accel_pg_size(pg) == 1) return ACCEL_OK;
    accel_status st = accel_pg_all_reduce(pg, accel__device_ptr(out), (size_t)accel_numel(out), out->dtype,
                                          ACCEL_REDUCE_SUM);
    if (st == ACCEL_OK) count(accel_nbytes(out));
    return st;
}

/* fn with its staging (contiguous copies, send and receive buffers) between
 * a mark and a rewind of the step arena: freed as soon as the result is in
 * out (made before the mark), so a step keeps the collectives' results,
 * which the tape saves, and not their buffers. */
static accel_status staged(collective_fn fn, accel_tensor *in, accel_pg *pg, int dim, accel_tensor *out) {
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    bool prev = accel_set_grad_enabled(false); /* nothing recorded on the tape in memory the rewind frees */
    accel_status st = fn(in, pg, dim, out);
    accel_set_grad_enabled(prev);
    accel_arena_rewind(a, m);
    return st;
}

/* A new step tensor: x's dtype and shape, dim scaled by mul / div, the
 * result of fn over x (staged). */
static accel_tensor *collective(collective_fn fn, accel_tensor *x, accel_pg *pg, int dim, int64_t mul, int64_t div) {
    int64_t shape[ACCEL_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    if (x->ndim) shape[dim] = shape[dim] * mul / div;
    accel_tensor *out = accel_empty_on(x->dtype, x->ndim, shape, x->device);
    return out && staged(fn, x, pg, dim, out) == ACCEL_OK ? out : NULL;
}

/* Backward of a collective op: x gets fn over the gradient g (x's shape),
 * written straight into its first gradient when x is an intermediate that
 * has none (the gradient an accumulate would have copied g into), else
 * staged and added (or converted) into it. */
static accel_status collective_grad(accel_node *n, accel_tensor *g, collective_fn fn, int dim) {
    accel_tensor *x = n->inputs[0];
    if (!x->requires_grad) return ACCEL_OK;
    bool first = accel__grad_first_is_step(x);
    if (first && !(x->grad = accel_empty_on(x->dtype, x->ndim, x->shape, x->device))) return accel_last_status();
    bool direct = first && x->dtype == g->dtype;
    accel_arena *a = accel_step_arena();
    accel_arena_mark m = accel_arena_mark_now(a);
    accel_tensor *out = direct ? x->grad : accel_empty_on(g->dtype, x->ndim, x->shape, x->device);
    accel_status st = out ? staged(fn, g, n->ctx, dim, out) : accel_last_status();
    if (st == ACCEL_OK && !direct) st = first ? accel_copy_(x->grad, out) : accel_grad_accumulate(x, out);
    accel_arena_rewind(a, m);
    return st;
}

/* ------------------------------------------------------------------ copy to region */

static accel_status copy_to_backward(accel_node *n, accel_tensor *g) { return collective_grad(n, g, sum_into, 0); }

accel_tensor *accel_tp_copy_to_region(accel_tensor *x, accel_pg *pg) {
    if (!tp_args("accel_tp_copy_to_region", x, pg)) return NULL;
    accel_tensor *out = accel_view_raw(x, x->ndim, x->shape, x->stride, 0);
    if (!out) return NULL;
    accel_node *n = accel_tape_record("tp_copy_to_region", copy_to_backward, out, 1, &x);
    if (n) n->ctx = pg;
    return out;
}

/* ------------------------------------------------------------------ reduce from region */

static accel_status pass_backward(accel_node *n, accel_tensor *g) { return accel_grad_accumulate(n->inputs[0], g); }

accel_tensor *accel_tp_reduce_from_region(accel_tensor *x, accel_pg *pg) {
    if (!tp_args("accel_tp_reduce_from_region", x, pg)) return NULL;
    accel_tensor *out = collective(sum_into, x, pg, 0, 1, 1);
    if (!out) return NULL;
    accel_tape_record("tp_reduce_from_region", pass_backward, out, 1, &x);
    return out;
}

/* ------------------------------------------------------------------ vocab-parallel cross-entropy */

/* Targets as an [N] i64 tensor, checked to be [N] or the logits' shape less the last dim. */
static accel_tensor *vce_targets(const char *op, accel_tensor *logits, accel_tensor *targets, int64_t N) {
    bool fits = targets->ndim == 1 && targets->shape[0] == N;
    if (!fits && targets->ndim == logits->ndim - 1) {
        fits = true;
        for (int i = 0; i < targets->ndim; i++) fits = fits && targets->shape[i] == logits->shape[i];
    }
    if (targets->dtype != ACCEL_I64 && targets->dtype != ACCEL_I32) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: targets must be int64 or int32, got %s", op,
                        accel_dtype_name(targets->dtype));
        return NULL;
    }
    if (!fits) {
        accel__shape_error2(op, logits, targets, "do not fit (logits [..., V/tp]; targets [...] or [N])");
        return NULL;
    }
    accel_tensor *tt = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(N), ACCEL_CPU_DEVICE);
    return tt && accel_copy_(tt, accel_reshape(targets, 1, &N)) == ACCEL_OK ? tt : NULL;
}

/* A target that not exactly one rank's columns hold: outside every slice,
 * or in `owners` of them, whose ranges it names (every rank comes here for
 * the same row, the owner counts being summed: the gather is collective). */
static accel_status owner_error(const char *op, accel_pg *pg, int64_t target, int64_t row, float owners,
                                int64_t vocab_start, int64_t Vl) {
    if (owners < 1.0f)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: target %lld (row %lld) is in no rank's vocabulary slice "
                               "(outside [0, V))", op, (long long)target, (long long)row);
    int n = accel_pg_size(pg);
    int64_t mine[2] = {vocab_start, vocab_start + Vl};
    int64_t *all = accel_arena_alloc(accel_step_arena(), (size_t)n * sizeof mine, 64);
    if (!all || accel_pg_all_gather(pg, mine, all, 2, ACCEL_I64) != ACCEL_OK) return accel_last_status();
    char ranges[512] = "";
    size_t len = 0;
    for (int r = 0; r < n && len < sizeof ranges; r++)
        if (target >= all[2 * r] && target < all[2 * r + 1])
            len += (size_t)snprintf(ranges + len, sizeof ranges - len, "%srank %d holds [%lld, %lld)", len ? ", " : "",
                                    r, (long long)all[2 * r], (long long)all[2 * r + 1]);
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: target %lld (row %lld) is in %d ranks' vocabulary slices: "
                           "the slices overlap (%s); each vocabulary column must be on exactly one rank", op,
                           (long long)target, (long long)row, (int)owners, ranges);
}

/* A new cpu step tensor of n elements of dt from host memory. */
static accel_tensor *host_tensor(accel_dtype dt, int64_t n, const void *data) {
    accel_tensor *t = accel_empty_on(dt, 1, &n, ACCEL_CPU_DEVICE);
    return t && accel_tensor_from_host(t, data) == ACCEL_OK ? t : NULL;
}

/* saved: x [N, Vl] f32 (the logits themselves when they are contiguous f32),
 * lse [N] over every rank's columns, targets [N] as this rank's columns
 * (another rank's: outside [0, Vl), no one-hot; ignored rows: INT64_MIN),
 * count (i64, 0-d) the counted rows. One pass writes the logits' gradient. */
static accel_status vce_backward(accel_node *node, accel_tensor *grad_out) {
    accel__gbuf gx;
    if (!accel__gbuf_begin(&gx, node->inputs[0])) return accel_last_status();
    if (!gx.dst) return ACCEL_OK;
    accel_tensor *g = accel__f32_contig(grad_out);
    if (!g) return accel_last_status();
    accel_k_cross_entropy_backward k = {.dx = gx.dst, .g = g, .x = node->saved[0], .lse = node->saved[1],
                                        .targets = node->saved[2], .count = node->saved[3], .N = node->iarg[0],
                                        .C = node->iarg[1], .ignore = INT64_MIN, .beta = gx.beta};
    accel_status st = ACCEL_KERNEL("accel_tp_cross_entropy backward", g->device, cross_entropy_backward, &k);
    return st == ACCEL_OK ? accel__gbuf_end(&gx) : st;
}

/* Whether row target th is one of this rank's columns [v0, v0 + Vl). */
static bool holds(int64_t th, int64_t v0, int64_t Vl) { return th >= v0 && th < v0 + Vl; }

/* Per row of x [N, Vl] (f32 contiguous, this rank's columns from v0): lse,
 * the logsumexp over these columns (the cross_entropy kernel, every row
 * given a column of its own: its target here, else 0), and xt, the target's
 * logit where this rank holds it, else 0. col: N i64 of host scratch. */
static accel_status vce_local(accel_tensor *x, const int64_t *th, int64_t N, int64_t Vl, int64_t v0, int64_t *col,
                              float *lse, float *xt) {
    for (int64_t i = 0; i < N; i++) col[i] = holds(th[i], v0, Vl) ? th[i] - v0 : 0;
    accel_tensor *cols = host_tensor(ACCEL_I64, N, col), *lse_t = accel_empty_on(ACCEL_F32, 1, &N, ACCEL_CPU_DEVICE);
    accel_tensor *loss = accel_empty_on(ACCEL_F32, 0, NULL, ACCEL_CPU_DEVICE); /* unused: lse is asked for */
    accel_tensor *counted = accel_empty_on(ACCEL_I64, 0, NULL, ACCEL_CPU_DEVICE);
    if (!cols || !lse_t || !loss || !counted) return accel_last_status();
    accel_k_cross_entropy k = {.out = loss, .lse = lse_t, .count = counted, .x = x, .targets = cols, .N = N, .C = Vl,
                               .ignore = -1};
    if (ACCEL_KERNEL("accel_tp_cross_entropy", x->device, cross_entropy, &k) != ACCEL_OK) return accel_last_status();
    /* x[i, col[i]]: x as an [N Vl, 1] table looked up at i Vl + col[i] */
    for (int64_t i = 0; i < N; i++) col[i] += i * Vl;
    accel_tensor *at = host_tensor(ACCEL_I64, N, col);
    accel_tensor *hit = at ? accel_embedding(at, accel_reshape(x, 2, (int64_t[]){N * Vl, 1})) : NULL;
    if (!hit || accel_to_floats(lse_t, lse) != ACCEL_OK || accel_to_floats(hit, xt) != ACCEL_OK)
        return accel_last_status();
    for (int64_t i = 0; i < N; i++) xt[i] = holds(th[i], v0, Vl) ? xt[i] : 0.0f;
    return ACCEL_OK;
}

/* Fused, as Megatron's _VocabParallelCrossEntropy: each row's logsumexp and
 * target logit here (vce_local, one pass over the logits); the logsumexps'
 * max over the ranks, then the sums of exp(lse - max), target logits and
 * owner counts ([N] then [3 N] floats all-reduced); the loss from those on
 * the host. What the backward keeps is the logits themselves (when f32 and
 * contiguous) and [N] rows of numbers: the gradient is the one logits-sized
 * tensor it makes. */
accel_tensor *accel_tp_cross_entropy(accel_tensor *logits, accel_tensor *targets, int64_t vocab_start,
                                     int64_t ignore_index, accel_pg *pg) {
    static const char *OP = "accel_tp_cross_entropy";
    if (!tp_args(OP, logits, pg) || !accel__op_check_float(OP, logits, "logits") ||
        !accel_tensor_check(targets, OP, "targets"))
        return NULL;
    int64_t Vl = logits->ndim ? logits->shape[logits->ndim - 1] : 0;
    if (logits->ndim < 1 || Vl == 0 || vocab_start < 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: logits need a non-empty last (vocabulary) dim and vocab_start >= 0 "
                        "(got %d dims, vocab_start %lld)", OP, logits->ndim, (long long)vocab_start);
        return NULL;
    }
    int64_t N = accel_numel(logits) / Vl;
    size_t n = (size_t)(N ? N : 1);
    accel_arena *a = accel_step_arena();
    int64_t *th = accel_arena_alloc(a, n * sizeof *th, 64), *col = accel_arena_alloc(a, n * sizeof *col, 64);
    /* part: [N] sums of exp(lse - max), [N] target logits, [N] owners; mx [N] */
    float *part = accel_arena_alloc(a, 3 * n * sizeof *part, 64), *mx = accel_arena_alloc(a, n * sizeof *mx, 64);
    accel_tensor *t = vce_targets(OP, logits, targets, N);
    if (!t || !th || !col || !part || !mx || accel_to_int64s(t, th) != ACCEL_OK) return NULL;
    bool prev = accel_set_grad_enabled(false); /* the op records one node of its own */
    accel_tensor *x = accel_reshape(accel__f32_contig(logits), 2, (int64_t[]){N, Vl});
    accel_status st = x ? ACCEL_OK : accel_last_status();
    if (st == ACCEL_OK && N) st = vce_local(x, th, N, Vl, vocab_start, col, mx, part + N);
    accel_set_grad_enabled(prev);
    if (st != ACCEL_OK) return NULL;
    float *lse = part; /* this rank's logsumexps, then the whole rows' */
    memcpy(lse, mx, (size_t)N * sizeof *lse);
    if (accel_pg_all_reduce(pg, mx, (size_t)N, ACCEL_F32, ACCEL_REDUCE_MAX) != ACCEL_OK) return NULL;
    for (int64_t i = 0; i < N; i++) {
        part[i] = expf(lse[i] - mx[i]);
        part[2 * N + i] = holds(th[i], vocab_start, Vl) ? 1.0f : 0.0f;
    }
    if (accel_pg_all_reduce(pg, part, 3 * (size_t)N, ACCEL_F32, ACCEL_REDUCE_SUM) != ACCEL_OK) return NULL;
    count(4 * (size_t)N * sizeof(float));
    double total = 0;
    int64_t n_targets = 0;
    for (int64_t i = 0; i < N; i++) {
        lse[i] = mx[i] + logf(part[i]);
        bool counted = th[i] != ignore_index;
        if (counted && part[2 * N + i] != 1.0f)
            return owner_error(OP, pg, th[i], i, part[2 * N + i], vocab_start, Vl), NULL;
        total += counted ? (double)lse[i] - part[N + i] : 0.0;
        n_targets += counted;
        /* the backward's targets: this rank's column (off its columns: another rank's target) */
        col[i] = counted ? th[i] - vocab_start : INT64_MIN;
    }
    accel_tensor *out = accel_empty_on(ACCEL_F32, 0, NULL, ACCEL_CPU_DEVICE);
    accel_tensor *n_t = accel_empty_on(ACCEL_I64, 0, NULL, ACCEL_CPU_DEVICE);
    accel_tensor *lse_t = host_tensor(ACCEL_F32, N, lse), *tb = host_tensor(ACCEL_I64, N, col);
    /* all targets ignored: 0 / 0 = nan, as accel_cross_entropy */
    if (!out || !n_t || !lse_t || !tb || accel_fill_(out, n_targets ? total / (double)n_targets : NAN) != ACCEL_OK ||
        accel_fill_(n_t, (double)n_targets) != ACCEL_OK)
        return NULL;
    accel_node *node = accel_tape_record("tp_cross_entropy", vce_backward, out, 1, &logits);
    if (node) {
        node->saved[0] = x;
        node->saved[1] = lse_t;
        node->saved[2] = tb;
        node->saved[3] = n_t;
        node->iarg[0] = N;
        node->iarg[1] = Vl;
    }
    return out;
}

/* ------------------------------------------------------------------ gathers and scatters along a dim */

/* A whole tensor along `dim` over n ranks is blocks [outer, n, row]: outer
 * the dims before dim, row one rank's elements from dim on. The collectives
 * move them rank-major, [n, outer, row]. */

/* whole [.., d, ..] = the ranks' x [.., d / n, ..] along dim, in rank order. */
static accel_status gather_into(accel_tensor *x, accel_pg *pg, int dim, accel_tensor *whole) {
    int n = accel_pg_size(pg);
    int64_t outer = accel__prod(whole->shape, 0, dim), row = outer ? accel_numel(whole) / outer / n : 0;
    accel_tensor *c = accel__contig(x), *recv = accel_empty_on(x->dtype, 3, (int64_t[]){n, outer, row}, x->device);
    if (!c || !recv || accel_pg_all_gather(pg, accel__device_ptr(c), accel__device_ptr(recv), (size_t)accel_numel(c),
                                           x->dtype) != ACCEL_OK)
        return accel_last_status();
    count(accel_nbytes(c));
    accel_tensor *dst = accel_reshape(whole, 3, (int64_t[]){outer, n, row});
    return dst ? accel_copy_(dst, accel_permute(recv, (const int[]){1, 0, 2})) : accel_last_status();
}

/* local [.., d / n, ..] = this rank's part along dim of the sum over pg of x [.., d, ..]. */
static accel_status scatter_into(accel_tensor *x, accel_pg *pg, int dim, accel_tensor *local) {
    int n = accel_pg_size(pg);
    int64_t outer = accel__prod(x->shape, 0, dim), row = outer ? accel_numel(x) / outer / n : 0;
    accel_tensor *c = accel__contig(x), *send = accel_empty_on(x->dtype, 3, (int64_t[]){n, outer, row}, x->device);
    accel_tensor *blocks = c ? accel_reshape(c, 3, (int64_t[]){outer, n, row}) : NULL;
    if (!blocks || !send || accel_copy_(send, accel_permute(blocks, (const int[]){1, 0, 2})) != ACCEL_OK ||
        accel_pg_reduce_scatter(pg, accel__device_ptr(send), accel__device_ptr(local), (size_t)accel_numel(local),
                                x->dtype, ACCEL_REDUCE_SUM) != ACCEL_OK)
        return accel_last_status();
    count(accel_nbytes(c));
    return ACCEL_OK;
}

/* ------------------------------------------------------------------ gather from region */

static accel_status gather_from_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    int64_t w = x->shape[x->ndim - 1], r = accel_pg_rank(n->ctx);
    return accel_grad_accumulate(x, accel_contiguous(accel_slice(g, g->ndim - 1, r * w, (r + 1) * w, 1)));
}

accel_tensor *accel_tp_gather_from_region(accel_tensor *x, accel_pg *pg) {
    static const char *OP = "accel_tp_gather_from_region";
    if (!tp_args(OP, x, pg)) return NULL;
    if (x->ndim < 1) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x is 0-d: it needs a last dim to gather along", OP);
        return NULL;
    }
    accel_tensor *out = collective(gather_into, x, pg, x->ndim - 1, accel_pg_size(pg), 1);
    accel_node *n = out ? accel_tape_record("tp_gather_from_region", gather_from_backward, out, 1, &x) : NULL;
    if (n) n->ctx = pg;
    return out;
}

/* ------------------------------------------------------------------ sequence parallelism */

static bool seq_args(const char *op, accel_tensor *x, accel_pg *pg, bool scatter) {
    if (!tp_args(op, x, pg)) return false;
    if (x->ndim < 2 || (scatter && x->shape[1] % accel_pg_size(pg))) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x %s: needs [B, T, ...]%s", op, accel_shape_str(x, b, sizeof b),
                        scatter ? " with T a multiple of the group's size (sequence parallelism splits T)" : "");
        return false;
    }
    return true;
}

static accel_status gather_seq_backward(accel_node *n, accel_tensor *g) { return collective_grad(n, g, scatter_into, 1); }

static accel_status scatter_seq_backward(accel_node *n, accel_tensor *g) { return collective_grad(n, g, gather_into, 1); }

accel_tensor *accel_tp_gather_seq(accel_tensor *x, accel_pg *pg) {
    if (!seq_args("accel_tp_gather_seq", x, pg, false)) return NULL;
    accel_tensor *out = collective(gather_into, x, pg, 1, accel_pg_size(pg), 1);
    accel_node *n = out ? accel_tape_record("tp_gather_seq", gather_seq_backward, out, 1, &x) : NULL;
    if (n) n->ctx = pg;
    return out;
}

accel_tensor *accel_tp_scatter_seq(accel_tensor *x, accel_pg *pg) {
    if (!seq_args("accel_tp_scatter_seq", x, pg, true)) return NULL;
    accel_tensor *out = collective(scatter_into, x, pg, 1, 1, accel_pg_size(pg));
    accel_node *n = out ? accel_tape_record("tp_scatter_seq", scatter_seq_backward, out, 1, &x) : NULL;
    if (n) n->ctx = pg;
    return out;
}
