/* Conversions of step tensors, made once per step (core/step_casts.h).
 *
 * A table of the calling thread's last few conversions, looked up by the
 * source's elements (data, dtype, shape, strides) and the conversion asked
 * for. All of its entries share one watch of the step arena, restarted at
 * each new entry once the entries that a rewind freed are dropped: an entry
 * is kept while no rewind since the watch went below its conversion's end. */
#include <string.h>

#include "core/core_internal.h"
#include "core/step_casts.h"

enum { CASTS = 4 }; /* a layer's normed inputs are read while they are fresh */

typedef struct cast_entry {
    const void *data;              /* the source's first element; NULL: slot free */
    accel_dtype src_dt;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS], stride[ACCEL_MAX_DIMS];
    int kind;
    accel_dtype dt;
    accel_tensor *cast;
    uintptr_t lo, hi, cast_lo, cast_hi; /* the source's and the conversion's bytes */
    size_t pos;                    /* the arena's position after the conversion */
    bool exclusive;                /* offered and handed out to no one yet: it may be taken */
} cast_entry;

static _Thread_local cast_entry tl_casts[CASTS];
static _Thread_local int tl_held, tl_next;
static _Thread_local uint64_t tl_watch, tl_takes;

bool accel__step_casts_held(void) { return tl_held > 0; }

static void drop(cast_entry *e) {
    if (!e->data) return;
    e->data = NULL;
    tl_held--;
}

/* Drops the entries a rewind or reset may have freed. */
static void sweep(const accel_arena *a) {
    for (int i = 0; i < CASTS && tl_held; i++)
        if (tl_casts[i].data && !accel__arena_kept(a, ACCEL__WATCH_STEP_CASTS, tl_watch, tl_casts[i].pos))
            drop(&tl_casts[i]);
}

static bool same_elements(const cast_entry *e, const accel_tensor *t, int kind, accel_dtype dt) {
    return e->data == t->data && e->src_dt == t->dtype && e->ndim == t->ndim && e->kind == kind && e->dt == dt &&
           !memcmp(e->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) &&
           !memcmp(e->stride, t->stride, sizeof(int64_t) * (size_t)t->ndim);
}

static bool overlaps(uintptr_t lo, uintptr_t hi, uintptr_t p, uintptr_t q) { return p < hi && q > lo; }

void accel__step_casts_written(const void *p, size_t n) {
    if (!tl_held) return;
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    for (int i = 0; i < CASTS; i++) {
        cast_entry *e = &tl_casts[i];
        if (e->data && (overlaps(e->lo, e->hi, lo, hi) || overlaps(e->cast_lo, e->cast_hi, lo, hi))) drop(e);
    }
}

/* The span of src's elements when src's conversions are remembered: a step
 * tensor of the calling thread's step arena, with the cache on. */
static bool rememberable(const accel_tensor *src, uintptr_t *lo, uintptr_t *hi) {
    return accel__prepared_enabled() && (src->flags & ACCEL_TF_ARENA) && accel__tensor_span(src, lo, hi) &&
           accel__in_own_step_arena((const void *)*lo, *hi - *lo);
}

/* Remembers c, src's conversion (src's elements at [lo, hi)), made since
 * the watch started; exclusive: no one holds it yet (an offer's). */
static void remember(const accel_tensor *src, uintptr_t lo, uintptr_t hi, int kind, accel_dtype dt, accel_tensor *c,
                     bool exclusive) {
    uintptr_t clo, chi;
    if (!accel__tensor_span(c, &clo, &chi)) return;
    cast_entry *e = &tl_casts[tl_next];
    tl_next = (tl_next + 1) % CASTS;
    drop(e);
    *e = (cast_entry){.data = src->data, .src_dt = src->dtype, .ndim = src->ndim, .kind = kind, .dt = dt,
                      .cast = c, .lo = lo, .hi = hi, .cast_lo = clo, .cast_hi = chi,
                      .pos = accel_arena_used(accel_step_arena()), .exclusive = exclusive};
    memcpy(e->shape, src->shape, sizeof(int64_t) * (size_t)src->ndim);
    memcpy(e->stride, src->stride, sizeof(int64_t) * (size_t)src->ndim);
    tl_held++;
}

accel_tensor *accel__step_cast(accel_tensor *src, int kind, accel_dtype dt, accel__step_cast_make make) {
    uintptr_t lo, hi;
    if (!rememberable(src, &lo, &hi)) return make(src, kind, dt);
    accel_arena *a = accel_step_arena();
    sweep(a);
    for (int i = 0; i < CASTS; i++)
        if (tl_casts[i].data && same_elements(&tl_casts[i], src, kind, dt)) {
            tl_casts[i].exclusive = false; /* read by a GEMM (saved for its backward): never taken */
            return tl_casts[i].cast;
        }
    /* The entries kept so far hold now: a new watch from here on covers
     * them and the new one (a rewind before this point that went below the
     * new one's place freed nothing it holds). */
    tl_watch = accel__arena_watch(a, ACCEL__WATCH_STEP_CASTS);
    accel_tensor *c = make(src, kind, dt);
    if (c) remember(src, lo, hi, kind, dt, c, false);
    return c;
}

void accel__step_cast_offer(accel_tensor *src, int kind, accel_dtype dt, accel_tensor *cast) {
    uintptr_t lo, hi;
    if (!rememberable(src, &lo, &hi) || !(cast->flags & ACCEL_TF_ARENA)) return;
    accel_arena *a = accel_step_arena();
    sweep(a);
    for (int i = 0; i < CASTS; i++)
        if (tl_casts[i].data && same_elements(&tl_casts[i], src, kind, dt)) drop(&tl_casts[i]);
    /* src and cast are both older than the watch: the entry's place (the
     * arena's position now) lies above both, so a later rewind that frees
     * either goes below it */
    tl_watch = accel__arena_watch(a, ACCEL__WATCH_STEP_CASTS);
    remember(src, lo, hi, kind, dt, cast, true);
}

accel_tensor *accel__step_cast_take(const accel_tensor *src, int kind, accel_dtype dt) {
    uintptr_t lo, hi;
    if (!tl_held || !rememberable(src, &lo, &hi)) return NULL;
    sweep(accel_step_arena());
    for (int i = 0; i < CASTS; i++)
        if (tl_casts[i].data && tl_casts[i].exclusive && same_elements(&tl_casts[i], src, kind, dt)) {
            accel_tensor *c = tl_casts[i].cast;
            drop(&tl_casts[i]);
            tl_takes++;
            return c;
        }
    return NULL;
}

uint64_t accel__step_cast_takes(void) { return tl_takes; }
