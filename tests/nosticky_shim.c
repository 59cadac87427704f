/* LD_PRELOAD shim for test_atomic_write_nosticky: open() and open64() drop
 * the sticky bit from the mode of a file they create, as FAT or SMB without
 * unix extensions keep none. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/types.h>

typedef int (*open_fn)(const char *, int, ...);

static int forward(const char *name, const char *path, int flags, va_list ap) {
    open_fn real = (open_fn)dlsym(RTLD_NEXT, name);
    if (!(flags & O_CREAT)) return real(path, flags);
    mode_t mode = (mode_t)va_arg(ap, unsigned);
    return real(path, flags, mode & ~(mode_t)S_ISVTX);
}

int open(const char *path, int flags, ...);
int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int fd = forward("open", path, flags, ap);
    va_end(ap);
    return fd;
}

int open64(const char *path, int flags, ...);
int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int fd = forward("open64", path, flags, ap);
    va_end(ap);
    return fd;
}
