/* The allocator every library allocation goes through (tests swap it to count). */
#include <stdlib.h>
#include <string.h>

#include "accel/core.h"

static void *default_alloc(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1))
        return NULL;
    return p;
}

static void default_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

static accel_allocator current = {default_alloc, default_free, NULL};

void accel_set_allocator(const accel_allocator *a) {
    if (a) current = *a;
    else current = (accel_allocator){default_alloc, default_free, NULL};
}

void *accel_malloc_aligned(size_t bytes, size_t align) {
    void *p = current.alloc(current.ctx, bytes, align);
    if (!p) accel_set_error(ACCEL_ERR_OOM, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *accel_malloc(size_t bytes) { return accel_malloc_aligned(bytes, 64); }

void *accel_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) {
        accel_set_error(ACCEL_ERR_OOM, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    void *p = accel_malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void accel_free(void *p) {
    if (p) current.free(current.ctx, p);
}

void *accel__realloc(void *p, size_t old_bytes, size_t bytes) {
    void *n = accel_malloc(bytes);
    if (!n) return NULL;
    if (p) memcpy(n, p, old_bytes < bytes ? old_bytes : bytes);
    accel_free(p);
    return n;
}

char *accel_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = accel_malloc_aligned(n, 16);
    if (d) memcpy(d, s, n);
    return d;
}
