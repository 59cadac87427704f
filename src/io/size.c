/* src/io/size.c — accelerate's convert_file_size_to_int. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "accel/io.h"
#include "core/env.h"

/* The number before the unit as Python's float() reads it (Accelerate parses
 * it so: " 5GB", "1_000MB", "1e3KB"), finite (int() of inf or nan fails). */
static bool parse_number(const char *s, size_t len, double *out) {
    return accel__python_float_n(s, len, out) && isfinite(*out);
}

/* A bare integer: a byte count, exact (a double rounds past 2^53). *v gets
 * it, or -1 past int64. False when s is not all digits. */
static bool parse_byte_count(const char *s, size_t len, double *approx, int64_t *v) {
    if (len == 0 || strspn(s, "0123456789") != len) return false;
    errno = 0;
    unsigned long long n = strtoull(s, NULL, 10);
    *v = errno == ERANGE || n > (unsigned long long)INT64_MAX ? -1 : (int64_t)n;
    *approx = strtod(s, NULL);
    return true;
}

static accel_status bad_size(const char *s) {
    return accel_set_error(ACCEL_ERR_INVALID_ARG,
                           "size '%s' is not in a valid format. Use an integer for bytes, or a "
                           "string with an unit (like '5.0GB').",
                           s);
}

accel_status accel_parse_size(const char *s, int64_t *out) {
    static const struct { const char *unit; double mult; bool bits_ok; } U[] = {
        {"GIB", 1073741824.0, false}, {"MIB", 1048576.0, false}, {"KIB", 1024.0, false},
        {"GB", 1e9, true},            {"MB", 1e6, true},         {"KB", 1e3, true}};
    if (!s || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_parse_size: NULL argument");
    size_t len = strlen(s);
    double v = -1;
    int64_t exact = -1;
    bool ok = false;
    for (size_t u = 0; u < sizeof U / sizeof U[0] && !ok; u++) {
        size_t ul = strlen(U[u].unit);
        if (len < ul || strncasecmp(s + len - ul, U[u].unit, ul) != 0) continue;
        double num;
        if (!parse_number(s, len - ul, &num)) break;
        v = trunc(num * U[u].mult);
        /* Lowercase trailing 'b' means bits (Python: size.endswith("b")). */
        if (U[u].bits_ok && s[len - 1] == 'b') v = floor(v / 8);
        ok = true;
        if (v >= 0 && v < 9223372036854775808.0) exact = (int64_t)v; /* below 2^63: fits */
    }
    /* A bare integer is a byte count (accelerate takes it as an int). */
    if (!ok) ok = parse_byte_count(s, len, &v, &exact);
    if (!ok || v < 0) return bad_size(s);
    if (exact < 0) /* Python takes any size; accel's sizes are int64 */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "size '%s' is too large: %.4g bytes, past the %lld an int64 holds",
                               s, v, (long long)INT64_MAX);
    *out = exact;
    return ACCEL_OK;
}
