/* An allocator (accel_set_allocator) that keeps the blocks freed under it
 * and gives them back, the last freed first, to the next allocation they
 * fit (within a few bytes): malloc's reuse of a freed address, made
 * certain. A test installs it around a free and a make, to have the made
 * object at the freed one's address, then uninstalls it, which frees the
 * blocks it still keeps. Every block is malloc's (free() may take it). */
#ifndef ACCEL_TESTS_RECYCLE_ALLOC_H
#define ACCEL_TESTS_RECYCLE_ALLOC_H

#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "accel/accel.h"

enum { RECYCLE_KEPT_MAX = 4096, RECYCLE_SLACK = 64 };

static struct {
    pthread_mutex_t lock;
    int n;
    void *kept[RECYCLE_KEPT_MAX];
} recycled = {PTHREAD_MUTEX_INITIALIZER, 0, {0}};

static inline void *recycle_alloc(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    pthread_mutex_lock(&recycled.lock);
    for (int i = recycled.n - 1; i >= 0; i--) {
        void *p = recycled.kept[i];
        size_t usable = malloc_usable_size(p);
        if (usable >= bytes && usable < bytes + RECYCLE_SLACK && (uintptr_t)p % align == 0) {
            recycled.kept[i] = recycled.kept[--recycled.n];
            pthread_mutex_unlock(&recycled.lock);
            return p;
        }
    }
    pthread_mutex_unlock(&recycled.lock);
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) ? NULL : p;
}

static inline void recycle_free(void *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    pthread_mutex_lock(&recycled.lock);
    if (recycled.n < RECYCLE_KEPT_MAX) {
        recycled.kept[recycled.n++] = p;
        p = NULL;
    }
    pthread_mutex_unlock(&recycled.lock);
    free(p);
}

static inline void recycle_install(void) { accel_set_allocator(&(accel_allocator){recycle_alloc, recycle_free, NULL}); }

static inline void recycle_uninstall(void) {
    accel_set_allocator(NULL);
    pthread_mutex_lock(&recycled.lock);
    while (recycled.n > 0) free(recycled.kept[--recycled.n]);
    pthread_mutex_unlock(&recycled.lock);
}

#endif
