/* Tensor collectives of the Accelerator (accelerate's utils/operations.py):
 * gather, gather_for_metrics, reduce, pad_across_processes, broadcast, objects. */
#include <math.h>
#include <string.h>

#include "accelerator_internal.h"

/* A contiguous copy of t on t's device in the step arena, 0-d made 1-d. The
 * collectives on it stage through host memory when the device needs it. */
static accel_tensor *flat_copy(accel_tensor *t, const char *fn) {
    if (!accel_tensor_check(t, fn, "t")) return NULL;
    if (t->device.type == ACCEL_DEV_META) {
        accel_set_error(ACCEL_ERR_DEVICE, "%s: tensor is on meta (it has no data to communicate)", fn);
        return NULL;
    }
    int64_t one = 1;
    accel_tensor *c = accel_empty_on(t->dtype, t->ndim ? t->ndim : 1, t->ndim ? t->shape : &one, t->device);
    if (!c) return NULL;
    if (t->ndim) return accel_copy_(c, t) == ACCEL_OK ? c : NULL;
    /* The element's bytes: through a double an int64 past 2^53 lost its low
     * bits, or (from 2^63 - 512 up) failed on its rank alone, leaving the
     * others in the collective that followed. */
    unsigned char v[8];
    size_t es = accel_dtype_size(t->dtype);
    if (accel__tensor_read_bytes(t, 0, v, es) || accel__tensor_write_bytes(c, 0, v, es)) return NULL;
    return c;
}

/* Debug mode: every rank's shape must match (DistributedOperationException),
 * over the group pg of the collective to come. */
static accel_status check_shapes_over(accel_pg *pg, const accel_tensor *t, const char *fn) {
    const int world = accel_pg_size(pg);
    if (world == 1 || !accel_dist_debug_mode()) return ACCEL_OK;
    int64_t mine[ACCEL_MAX_DIMS + 1] = {t->ndim};
    memcpy(mine + 1, t->shape, (size_t)t->ndim * sizeof(int64_t));
    int64_t *all = accel_arena_alloc(accel_step_arena(),
                                     (size_t)world * (ACCEL_MAX_DIMS + 1) * sizeof(int64_t), 8);
    if (!all) return accel_last_status();
    accel_status st = accel_pg_all_gather(pg, mine, all, ACCEL_MAX_DIMS + 1, ACCEL_I64);
    if (st) return st;
    bool same = true;
    for (int r = 1; r < world; r++)
        same &= memcmp(all, all + r * (ACCEL_MAX_DIMS + 1), sizeof mine) == 0;
    if (same) return ACCEL_OK;
    char msg[1024], sh[96];
    size_t k = (size_t)snprintf(msg, sizeof msg,
                                "Cannot apply desired operation due to shape mismatches. All shapes across "
                                "devices must be valid.\n\nOperation: `%s`\nInput shapes:",
                                fn);
    for (int r = 0; r < world && k < sizeof msg; r++) {
        const int64_t *s = all + r * (ACCEL_MAX_DIMS + 1);
        k += (size_t)snprintf(msg + k, sizeof msg - k, "\n  - Process %d: %s", r,
                              accel_shape_str_n((int)s[0], s + 1, sh, sizeof sh));
    }
    return accel_set_error(ACCEL_ERR_DIST, "%s", msg);
}

static accel_status check_shapes(accel_accelerator *acc, const accel_tensor *t, const char *fn) {
    return check_shapes_over(acc->pg, t, fn);
}

/* c (a flat_copy) gathered along dim 0 over pg in its rank order. */
static accel_tensor *gather_over(accel_pg *pg, accel_tensor *c, const char *fn) {
    if (!c || check_shapes_over(pg, c, fn)) return NULL;
    if (accel_pg_size(pg) == 1) return c;
    int64_t shape[ACCEL_MAX_DIMS];
    memcpy(shape, c->shape, sizeof shape);
    shape[0] *= accel_pg_size(pg);
    accel_tensor *out = accel_empty_on(c->dtype, c->ndim, shape, c->device);
    if (!out) return NULL;
    accel_dist_set_op_label("gather");
    accel_status st = accel__staged_all_gather(pg, c, out);
    accel_dist_set_op_label(NULL);
    return st ? NULL : out;
}

accel_tensor *accel_accelerator_gather(accel_accelerator *acc, accel_tensor *t) {
    if (accel__acc_null(acc, "accel_accelerator_gather")) return NULL;
    return gather_over(acc->pg, flat_copy(t, "accel_accelerator_gather"), "accel_accelerator_gather");
}

/* The rows gather_for_metrics keeps of every gathered tensor: the active
 * loader's remainder at its last batch, 0 (all of them) otherwise. */
static int64_t metrics_remainder(accel_accelerator *acc) {
    accel_dataloader *dl = accel__active_dataloader(acc);
    if (!dl || !accel_dataloader_end_of_dataloader(dl)) return 0;
    int64_t rem = accel_dataloader_remainder(dl);
    if (rem < 0) {
        if (acc->rank == 0)
            fprintf(stderr, "The used dataset had no length, returning gathered tensors. You should drop the "
                            "remainder yourself.\n");
        return 0;
    }
    return rem;
}

/* g's first `rows` rows (all of g when rows is 0 or not smaller). */
static accel_tensor *first_rows(accel_tensor *g, int64_t rows) {
    if (rows == 0 || rows >= g->shape[0]) return g;
    return accel_slice(g, 0, 0, rows, 1);
}

/* The group gather_for_metrics gathers over: the ranks whose batches differ,
 * the data-parallel ones, in the order of their loader shards. The ranks of
 * a tp group hold the same batch (and, for metrics, the same predictions):
 * over the world each sample would come once per tp rank. Those of a pp or
 * cp group hold one batch between them (the last stage's outputs, the
 * sequence's parts): refused, NULL and the error. */
static accel_pg *metrics_group(accel_accelerator *acc, const char *fn) {
    static const struct { accel__mesh_dim d; const char *field, *what; } DIMS[] = {
        {ACCEL__MESH_PP, "pp_size", "pipeline"}, {ACCEL__MESH_CP, "cp_size", "context"},
    };
    for (size_t k = 0; k < sizeof DIMS / sizeof *DIMS; k++)
        if (acc->mesh.size[DIMS[k].d] > 1) {
            accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: opts.parallelism.%s is %d: gather_for_metrics is not built "
                            "yet under %s parallelism (the ranks of a %s group hold one batch between them)", fn,
                            DIMS[k].field, acc->mesh.size[DIMS[k].d], DIMS[k].what, accel__mesh_dim_name(DIMS[k].d));
            return NULL;
        }
    return acc->dp_pg; /* the world's group without tp */
}

accel_tensor *accel_accelerator_gather_for_metrics(accel_accelerator *acc, accel_tensor *t) {
    static const char fn[] = "accel_accelerator_gather_for_metrics";
    accel_pg *pg = accel__acc_null(acc, fn) ? NULL : metrics_group(acc, fn);
    accel_tensor *g = pg ? gather_over(pg, flat_copy(t, fn), fn) : NULL;
    return g ? first_rows(g, metrics_remainder(acc)) : NULL;
}

/* Gathers the contiguous tensors c[0..n) with one all-gather over pg of their
 * bytes packed back to back, then unpacks rank r's part of tensor i into
 * rows r * d0 .. (r + 1) * d0 of outs[i]. */
static accel_status gather_packed(accel_pg *pg, int n, accel_tensor *const *c, accel_tensor **outs) {
    const int world = accel_pg_size(pg);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += accel_nbytes(c[i]);
    accel_arena *arena = accel_step_arena();
    uint8_t *send = accel_arena_alloc(arena, total ? total : 1, 64);
    uint8_t *recv = accel_arena_alloc(arena, (size_t)world * total + 1, 64);
    if (!send || !recv) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (size_t i = 0, off = 0; i < (size_t)n && !st; off += accel_nbytes(c[i]), i++)
        st = accel__tensor_read_bytes(c[i], 0, send + off, accel_nbytes(c[i]));
    if (st) return st;
    accel_dist_set_op_label("gather_for_metrics");
    st = accel_pg_all_gather(pg, send, recv, total, ACCEL_U8);
    accel_dist_set_op_label(NULL);
    if (st) return st;
    for (size_t i = 0, off = 0; i < (size_t)n; off += accel_nbytes(c[i]), i++) {
        int64_t shape[ACCEL_MAX_DIMS];
        memcpy(shape, c[i]->shape, sizeof shape);
        shape[0] *= world;
        outs[i] = accel_empty_on(c[i]->dtype, c[i]->ndim, shape, ACCEL_CPU_DEVICE);
        if (!outs[i]) return accel_last_status();
        size_t nb = accel_nbytes(c[i]);
        for (int r = 0; r < world && !st; r++)
            st = accel__tensor_write_bytes(outs[i], (size_t)r * nb, recv + (size_t)r * total + off, nb);
        if (st) return st;
    }
    return ACCEL_OK;
}

accel_status accel_accelerator_gather_for_metrics_n(accel_accelerator *acc, int n, accel_tensor *const *ts,
                                                    accel_tensor **outs) {
    static const char fn[] = "accel_accelerator_gather_for_metrics_n";
    if (accel__acc_null(acc, fn)) return accel_last_status();
    if (n < 1 || !ts || !outs)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: needs n >= 1 tensors and an outs array (n %d, ts %s, outs %s)",
                               fn, n, ts ? "set" : "NULL", outs ? "set" : "NULL");
    for (int i = 0; i < n; i++) outs[i] = NULL;
    accel_pg *pg = metrics_group(acc, fn);
    if (!pg) return accel_last_status();
    accel_tensor **c = accel_arena_alloc(accel_step_arena(), (size_t)n * sizeof *c, 8);
    if (!c) return accel_last_status();
    for (int i = 0; i < n; i++) {
        c[i] = flat_copy(ts[i], fn);
        if (!c[i]) return accel_last_status();
    }
    /* Debug mode's shape check is one collective per tensor: it is debug mode's price. */
    for (int i = 0; i < n; i++)
        if (check_shapes_over(pg, c[i], fn)) return accel_last_status();
    accel_status st = ACCEL_OK;
    if (accel_pg_size(pg) == 1) memcpy(outs, c, (size_t)n * sizeof *c);
    else st = gather_packed(pg, n, c, outs);
    int64_t rem = metrics_remainder(acc);
    for (int i = 0; st == ACCEL_OK && i < n; i++)
        if (!(outs[i] = first_rows(outs[i], rem))) st = accel_last_status();
    if (st != ACCEL_OK)
        for (int i = 0; i < n; i++) outs[i] = NULL;
    return st;
}

/* "sum", "mean" or "max"; else false + error naming fn. Checked on one
 * process too: anything else was summed, silently, and a typo ("avg") only
 * showed as wrong numbers. */
static bool check_reduction(const char *fn, const char *reduction) {
    if (reduction && (!strcmp(reduction, "sum") || !strcmp(reduction, "mean") || !strcmp(reduction, "max")))
        return true;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: reduction must be \"sum\", \"mean\" or \"max\", got %s%s%s", fn,
                    reduction ? "\"" : "", reduction ? reduction : "NULL", reduction ? "\"" : "");
    return false;
}

/* float64's c *= scale, then c /= n, in double, as torch's ops on float64
 * compute: the pointwise kernels compute in f32 (core/kernels.h), so the
 * elements go to the host and back, once each way. */
static accel_status rescale_f64(accel_tensor *c, double scale, int n) {
    size_t count = (size_t)accel_numel(c), bytes = count * sizeof(double);
    double *x = accel_malloc(bytes ? bytes : 1);
    if (!x) return accel_last_status();
    accel_status st = accel__tensor_read_bytes(c, 0, x, bytes);
    for (size_t i = 0; st == ACCEL_OK && i < count; i++) x[i] = x[i] * scale / n;
    if (st == ACCEL_OK) st = accel__tensor_write_bytes(c, 0, x, bytes);
    accel_free(x);
    return st;
}

/* c *= scale, then c /= n, each result rounded to c's dtype as torch's
 * `x *= scale` and `x /= N` round it: one kernel pass each on c's device,
 * in float for the 16- and 32-bit floats (torch's opmath, the scalar made
 * float), as torch stores between the two; in double for float64. A factor
 * of 1 is skipped. */
static accel_status rescale(accel_tensor *c, double scale, int n, const char *fn) {
    if (scale == 1.0 && n == 1) return ACCEL_OK;
    if (c->dtype == ACCEL_F64) return rescale_f64(c, scale, n);
    if (scale != 1.0) {
        accel_k_unary mul = {.out = c, .x = c, .op = ACCEL_U_MUL_SCALAR, .p = scale};
        if (ACCEL_KERNEL(fn, c->device, unary, &mul) != ACCEL_OK) return accel_last_status();
    }
    if (n == 1) return ACCEL_OK;
    accel_tensor *divisor = accel_empty_on(ACCEL_F32, 0, NULL, c->device);
    if (!divisor || accel_fill_(divisor, n) != ACCEL_OK) return accel_last_status();
    accel_k_binary div = {.out = c, .a = c, .b = divisor, .op = ACCEL_B_DIV};
    return ACCEL_KERNEL(fn, c->device, binary, &div);
}

accel_tensor *accel_accelerator_reduce(accel_accelerator *acc, accel_tensor *t, const char *reduction,
                                       double scale) {
    static const char fn[] = "accel_accelerator_reduce";
    if (accel__acc_null(acc, fn) || !check_reduction(fn, reduction) || !accel_tensor_check(t, fn, "t")) return NULL;
    const bool is_max = !strcmp(reduction, "max"), is_mean = !strcmp(reduction, "mean");
    /* torch's `x /= N` and `x *= scale` on an integer tensor fail ("result
     * type Float can't be cast to the desired output type Long"): refused
     * here on every rank before the collective, not truncated. */
    if (!accel_dtype_is_float(t->dtype) && (is_mean || scale != 1.0)) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: reduction \"%s\" with scale %g of a tensor of %s: the result would be "
                        "fractional (torch refuses it too); an integer or bool tensor takes \"sum\" or \"max\" "
                        "with scale 1, or convert it to a float dtype first", fn, reduction, scale,
                        accel_dtype_name(t->dtype));
        return NULL;
    }
    accel_tensor *c = flat_copy(t, fn);
    if (!c || check_shapes(acc, c, fn)) return NULL;
    if (acc->world > 1) {
        /* bool: summed as uint8 a true could wrap to false; torch's sum leaves
         * the count in the bool's byte. Any true is true: max, bytes 0/1. */
        const bool as_bool = c->dtype == ACCEL_BOOL;
        if (as_bool) c->dtype = ACCEL_U8;
        accel_dist_set_op_label("reduce");
        accel_status st = accel__staged_all_reduce(acc->pg, c, is_max || as_bool ? ACCEL_REDUCE_MAX : ACCEL_REDUCE_SUM);
        accel_dist_set_op_label(NULL);
        if (as_bool) c->dtype = ACCEL_BOOL;
        if (st) return NULL;
    }
    /* Upstream applies scale on XLA only (all_reduce(op, [t], scale)); accel
     * applies it on every device, as XLA does: times scale, then / N. */
    if (rescale(c, scale, is_mean ? acc->world : 1, fn) != ACCEL_OK) return NULL;
    if (!t->ndim) return accel_reshape(c, 0, NULL);
    return c;
}

double accel_accelerator_reduce_scalar(accel_accelerator *acc, double v, const char *reduction) {
    static const char fn[] = "accel_accelerator_reduce_scalar";
    if (accel__acc_null(acc, fn) || !check_reduction(fn, reduction)) return NAN;
    accel_tensor *t = accel_empty_on(ACCEL_F64, 0, NULL, ACCEL_CPU_DEVICE);
    if (!t || accel_fill_(t, v) != ACCEL_OK) return NAN;
    accel_tensor *r = accel_accelerator_reduce(acc, t, reduction, 1.0);
    return r ? accel_item(r) : NAN;
}

/* Whether v is a value of the integer or bool dtype dt, exactly (bool: 0 or 1). */
static bool int_value_of(accel_dtype dt, double v) {
    double lo = 0, hi = 2; /* bool */
    if (dt != ACCEL_BOOL) accel__int_dtype_range(dt, &lo, &hi);
    return v == trunc(v) && v >= lo && v < hi;
}

accel_tensor *accel_accelerator_pad_across_processes(accel_accelerator *acc, accel_tensor *t, int dim,
                                                     double pad_index, bool pad_first) {
    static const char fn[] = "accel_accelerator_pad_across_processes";
    if (accel__acc_null(acc, fn) || !accel_tensor_check(t, fn, "t")) return NULL;
    /* Upstream returns the tensor unpadded for a dim out of range: refused. */
    if (dim < -t->ndim || dim >= t->ndim) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: dim %d is out of range for a tensor of %d dims (valid: %d to %d)",
                        fn, dim, t->ndim, -t->ndim, t->ndim - 1);
        return NULL;
    }
    if (dim < 0) dim += t->ndim;
    /* An integer or bool tensor takes a pad_index it holds exactly. Upstream's
     * `zeros + pad_index` wraps 300 to 44 in uint8, or makes the padded ranks'
     * result float (0.5) or int64 (a bool's): the ranks then disagree. Checked
     * on every rank, before the collective. */
    if (!accel_dtype_is_float(t->dtype) && !int_value_of(t->dtype, pad_index)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: pad_index %g does not fit a tensor of %s (an integer dtype takes "
                        "an integer in its range, bool 0 or 1)", fn, pad_index, accel_dtype_name(t->dtype));
        return NULL;
    }
    if (acc->world == 1) return accel_alias(t);
    int64_t size = t->shape[dim];
    int64_t *sizes = accel_arena_alloc(accel_step_arena(), (size_t)acc->world * sizeof(int64_t), 8);
    if (!sizes || accel_pg_all_gather(acc->pg, &size, sizes, 1, ACCEL_I64)) return NULL;
    int64_t max = 0;
    for (int r = 0; r < acc->world; r++) max = sizes[r] > max ? sizes[r] : max;
    if (max == size) return accel_alias(t);
    int64_t shape[ACCEL_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[dim] = max;
    accel_tensor *out = accel_full(t->dtype, t->ndim, shape, pad_index);
    if (!out) return NULL;
    int64_t lo = pad_first ? max - size : 0;
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *view = accel_slice(out, dim, lo, lo + size, 1);
    accel_set_grad_enabled(prev);
    if (!view || accel_copy_(view, t)) return NULL;
    return out;
}

accel_tensor *accel_accelerator_broadcast(accel_accelerator *acc, accel_tensor *t, int from_process) {
    if (accel__acc_null(acc, "accel_accelerator_broadcast")) return NULL;
    if (from_process < 0 || from_process >= acc->world) { /* on one process too, as the group refuses it on several */
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_broadcast: from_process %d is not a process of %d",
                        from_process, acc->world);
        return NULL;
    }
    accel_tensor *c = flat_copy(t, "accel_accelerator_broadcast");
    if (!c || check_shapes(acc, c, "accel_accelerator_broadcast")) return NULL;
    if (acc->world > 1 &&
        accel__staged_broadcast(acc->pg, c, from_process))
        return NULL;
    if (!t->ndim) return accel_reshape(c, 0, NULL);
    return c;
}

accel_status accel_accelerator_gather_object(accel_accelerator *acc, const void *data, size_t len, void **out,
                                             size_t *lens) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    return accel_pg_all_gather_bytes(acc->pg, data, len, out, lens);
}

accel_status accel_accelerator_broadcast_object(accel_accelerator *acc, void **data, size_t *len,
                                                int from_process) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    return accel_pg_broadcast_bytes(acc->pg, data, len, from_process);
}
