/* An allocator (accel_set_allocator) that refuses anything over 1 GiB: a
 * test can ask for an absurd size, or make a library make one, and see the
 * out-of-memory error without asking the system for it (ASan would abort on
 * the size). Used as (accel_allocator){refuse_huge, free_huge, NULL}. */
#ifndef ACCEL_TESTS_REFUSE_HUGE_H
#define ACCEL_TESTS_REFUSE_HUGE_H

#include <stdlib.h>

static inline void *refuse_huge(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    void *p = NULL;
    if (bytes > ((size_t)1 << 30) ||
        posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1))
        return NULL;
    return p;
}

static inline void free_huge(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

#endif
