/* tests/check.h — tiny test harness shared by the unit tests.
 *
 * A test file defines test functions and runs them from main():
 *     static void test_add(void) { CHECK(1 + 1 == 2); }
 *     int main(void) { RUN(test_add); return check_summary(); }
 * Failures print file:line and the expression; the process exits non-zero.
 */
#ifndef ACCEL_TESTS_CHECK_H
#define ACCEL_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures_ = 0;
static int check_count_ = 0;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        check_count_++;                                                             \
        if (!(cond)) {                                                              \
            check_failures_++;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                           \
    } while (0)

#define CHECK_MSG(cond, ...)                                                        \
    do {                                                                            \
        check_count_++;                                                             \
        if (!(cond)) {                                                              \
            check_failures_++;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                           \
            fprintf(stderr, "\n");                                                  \
        }                                                                           \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, rtol, atol)                                                    \
    do {                                                                                 \
        double ca_ = (double)(a), cb_ = (double)(b);                                     \
        check_count_++;                                                                  \
        if (!(fabs(ca_ - cb_) <= (atol) + (rtol)*fabs(cb_)) || isnan(ca_) != isnan(cb_)) { \
            check_failures_++;                                                           \
            fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.9g vs %s = %.9g\n",       \
                    __FILE__, __LINE__, #a, ca_, #b, cb_);                               \
        }                                                                                \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                   \
    do {                                                                                  \
        const char *h_ = (hay), *n_ = (needle);                                           \
        check_count_++;                                                                   \
        if (!h_ || !strstr(h_, n_)) {                                                     \
            check_failures_++;                                                            \
            fprintf(stderr, "%s:%d: expected \"%s\" in \"%s\"\n", __FILE__, __LINE__, n_, \
                    h_ ? h_ : "(null)");                                                  \
        }                                                                                 \
    } while (0)

#define RUN(fn)                                               \
    do {                                                      \
        int before_ = check_failures_;                        \
        fn();                                                 \
        fprintf(stderr, "%s %s\n", check_failures_ == before_ ? "ok  " : "FAIL", #fn); \
    } while (0)

/* ||a - b|| / ||b|| (2-norms) over n values: how far a is from b as a
 * whole, where a few ulps' flips here and there weigh little and a rounding
 * that moves every value weighs its size. */
static inline double check_rel_dist(const float *a, const float *b, long long n) {
    double d = 0, r = 0;
    for (long long i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d / (r > 0 ? r : 1));
}

static inline int check_summary(void) {
    fprintf(stderr, "%d checks, %d failed\n", check_count_, check_failures_);
    return check_failures_ ? 1 : 0;
}

#endif
