/* File helpers the tests share: removing a folder tree, a whole file's
 * bytes or text. Static: each test program its own copy. */
#ifndef ACCEL_TESTS_TEST_FILES_H
#define ACCEL_TESTS_TEST_FILES_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static inline int rm_rf_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

/* p and everything below it, links not followed. */
static inline void rm_rf(const char *p) { nftw(p, rm_rf_one, 16, FTW_DEPTH | FTW_PHYS); }

typedef struct blob {
    unsigned char *p; /* malloc'd (at least one byte), NULL when the file cannot be opened or sized */
    size_t n;         /* 0 when it could not be read whole */
} blob;

static inline blob read_all(const char *path) {
    blob b = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return b;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b.n = n > 0 ? (size_t)n : 0;
    b.p = n >= 0 ? malloc(b.n ? b.n : 1) : NULL;
    if (!b.p || fread(b.p, 1, b.n, f) != b.n) b.n = 0;
    fclose(f);
    return b;
}

/* dir/name in one of 4 rotating buffers (4 may be in use at once). */
static inline const char *path_in(const char *dir, const char *name) {
    static char buf[4][256];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* path's text, NUL-terminated (malloc'd), or NULL. */
static inline char *slurp(const char *path) {
    blob b = read_all(path);
    char *s = b.p ? realloc(b.p, b.n + 1) : NULL;
    if (s) s[b.n] = '\0';
    else free(b.p);
    return s;
}

#endif
