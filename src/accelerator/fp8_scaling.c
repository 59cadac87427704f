/* The fp8 scales of a data-parallel model kept equal on every rank
 * (fp8_scaling.h): TransformerEngine gathers the amaxes of all its fp8
 * tensors into one buffer, all-reduces it with MAX and scatters it back
 * before the scale update; so does this, on the metas' device. */
#include "fp8_scaling.h"

#include "accelerator_internal.h"
#include "nn/fp8_modules.h"

/* n floats of t from element off, as a 1-d step view. */
static accel_tensor *span(accel_tensor *t, int64_t off, int n) {
    return accel_view_raw(t, 1, (int64_t[]){n}, (int64_t[]){1}, off);
}

/* The current amax row's slots [first, first + n) of a meta (row 2). */
static accel_tensor *amax_span(accel_tensor *meta, int first, int n) {
    return span(meta, 2 * ACCEL__FP8_SLOTS + first, n);
}

/* One all_reduce(MAX) over the current amaxes of every meta: buf [count, n]
 * gathers them, is reduced, and is copied back. */
static accel_status reduce_amaxes(accel_pg *pg, accel_tensor **metas, int count, int first, int n) {
    accel_tensor *buf = accel_empty_on(ACCEL_F32, 1, (int64_t[]){(int64_t)count * n}, metas[0]->device);
    if (!buf) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < count && !st; i++) st = accel_copy_(span(buf, (int64_t)i * n, n), amax_span(metas[i], first, n));
    if (!st) st = accel__staged_all_reduce(pg, buf, ACCEL_REDUCE_MAX);
    for (int i = 0; i < count && !st; i++) st = accel_copy_(amax_span(metas[i], first, n), span(buf, (int64_t)i * n, n));
    return st;
}

accel_status accel__fp8_reduce_and_update(accel_pg *pg, accel_module *root, int first, int n, accel__fp8_recipe r) {
    if (!root || first < 0 || n < 1 || first + n > ACCEL__FP8_SLOTS)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__fp8_reduce_and_update: a module and slots within 0..2");
    accel_tensor **metas;
    int count;
    accel_status st = accel__fp8_model_metas(root, &metas, &count);
    if (!st && count && pg && accel_pg_size(pg) > 1) st = reduce_amaxes(pg, metas, count, first, n);
    for (int i = 0; i < count && !st; i++) st = accel__fp8_meta_update(metas[i], first, n, r);
    accel_free(metas);
    return st;
}
