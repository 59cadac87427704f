/* A counting allocator for tests that a steady step allocates nothing:
 * install it with count_alloc_install() before anything allocates, read
 * n_allocs around the steps. */
#ifndef ACCEL_TESTS_COUNT_ALLOC_H
#define ACCEL_TESTS_COUNT_ALLOC_H

#include <stdlib.h>

#include "accel/accel.h"

static long n_allocs;

static void *count_alloc(void *ctx, size_t bytes, size_t align) {
    n_allocs++;
    size_t rounded = (bytes + align - 1) / align * align;
    return aligned_alloc(align, rounded ? rounded : align);
}

static void count_free(void *ctx, void *p) { free(p); }

static inline void count_alloc_install(void) {
    accel_allocator a = {count_alloc, count_free, NULL};
    accel_set_allocator(&a);
}

#endif
