/* An executable built next to the running test (build/bin/NAME): for the
 * tests that run the `accel` binary or a worker. */
#ifndef ACCEL_TESTS_SIBLING_EXE_H
#define ACCEL_TESTS_SIBLING_EXE_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* <this test's directory>/name into out (n bytes); false, after saying so
 * on stderr, when it is not there or not executable. */
static inline bool sibling_exe(const char *name, char *out, size_t n) {
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(out, n, "%s/%s", self, name);
    if (len > 0 && access(out, X_OK) == 0) return true;
    fprintf(stderr, "missing %s\n", out);
    return false;
}

#endif
