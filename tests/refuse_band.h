/* An allocator (accel_set_allocator) that refuses one allocation: the
 * (skip + 1)-th of at least min and fewer than max bytes. A test installs it
 * on one rank around a call to make that rank alone run out of memory at a
 * chosen step (the step's allocation picked by its size), and reads
 * `refused` to know the step was reached. */
#ifndef ACCEL_TESTS_REFUSE_BAND_H
#define ACCEL_TESTS_REFUSE_BAND_H

#include <stdbool.h>
#include <stdlib.h>

#include "accel/accel.h"

typedef struct refuse_band {
    size_t min, max;
    int skip;
    bool refused;
} refuse_band;

static inline void *refuse_band_alloc(void *ctx, size_t bytes, size_t align) {
    refuse_band *r = ctx;
    if (!r->refused && bytes >= r->min && bytes < r->max && r->skip-- == 0) {
        r->refused = true;
        return NULL;
    }
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) ? NULL : p;
}

static inline void refuse_band_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

/* Installs the allocator over r (NULL: the default one again). */
static inline void refuse_band_install(refuse_band *r) {
    accel_set_allocator(r ? &(accel_allocator){refuse_band_alloc, refuse_band_free, r} : NULL);
}

#endif
