/* src/core/env.c — strict environment parsing (env.h). */
#include "core/env.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/str_to_bool.h"

/* Digits (one optional leading '-'), nothing else: strtol alone would take
 * leading blanks and a '+'. */
static bool decimal_text(const char *s) {
    if (*s == '-') s++;
    if (!*s) return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

accel_status accel__parse_long(const char *name, const char *text, long lo, long hi, long *out) {
    errno = 0;
    long x = decimal_text(text) ? strtol(text, NULL, 10) : 0;
    if (!decimal_text(text) || errno == ERANGE || x < lo || x > hi)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s='%s' is not an integer between %ld and %ld", name, text, lo,
                               hi);
    *out = x;
    return ACCEL_OK;
}

accel_status accel__env_long(const char *name, long dflt, long lo, long hi, long *out) {
    const char *v = getenv(name);
    if (!v) {
        *out = dflt;
        return ACCEL_OK;
    }
    return accel__parse_long(name, v, lo, hi, out);
}

accel_status accel__env_bool(const char *name, bool dflt, bool *out) {
    const char *v = getenv(name);
    *out = dflt;
    /* accel__parse_bool leaves *out alone for NULL only: "" is refused like any non-boolean */
    return v ? accel__parse_bool("the environment", name, v, out) : ACCEL_OK;
}

bool accel__python_blank(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static bool py_digit(char c) { return c >= '0' && c <= '9'; }

/* Past the digits from p (up to end), a single '_' only between two of
 * them (Python's literals); *n: how many digits. */
static const char *py_digits(const char *p, const char *end, size_t *n) {
    *n = 0;
    while (p < end && py_digit(*p)) {
        p++, (*n)++;
        if (p + 1 < end && *p == '_' && py_digit(p[1])) p++;
    }
    return p;
}

/* Digits of a number this long or shorter are copied on the stack for
 * strtod; longer ones (no float setting needs them) on the heap. */
enum { PLAIN_ON_STACK = 128 };

bool accel__python_float_n(const char *text, size_t len, double *out) {
    const char *num = text, *end = text + len;
    while (num < end && accel__python_blank(*num)) num++;
    while (end > num && accel__python_blank(end[-1])) end--;
    const char *p = num + (num < end && (*num == '-' || *num == '+'));
    size_t word = (size_t)(end - p), n, more;
    if ((word == 3 || word == 8) && !strncasecmp(p, "infinity", word)) /* "inf" is its first 3 */
        return *out = *num == '-' ? -INFINITY : INFINITY, true;
    if (word == 3 && !strncasecmp(p, "nan", 3)) return *out = NAN, true;
    const char *q = py_digits(p, end, &n);
    if (q < end && *q == '.') q = py_digits(q + 1, end, &more), n += more;
    if (!n) return false;
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '-' || *q == '+')) q++;
        q = py_digits(q, end, &more);
        if (!more) return false;
    }
    if (q != end) return false;
    /* [num, end) is decimal text that strtod reads the same way, but for the '_': a NUL-terminated copy
     * without them (the text may go on past len) */
    char stack[PLAIN_ON_STACK], *plain = (size_t)(end - num) < sizeof stack ? stack : accel_malloc((size_t)(end - num) + 1);
    if (!plain) return false; /* ACCEL_ERR_OOM set */
    char *d = plain;
    for (const char *c = num; c < end; c++)
        if (*c != '_') *d++ = *c;
    *d = 0;
    *out = strtod(plain, NULL);
    if (plain != stack) accel_free(plain);
    return true;
}

bool accel__python_float(const char *text, double *out) { return accel__python_float_n(text, strlen(text), out); }

accel_status accel__env_double(const char *name, double dflt, double lo, double hi, double *out) {
    const char *v = getenv(name);
    double x;
    if (!v) {
        *out = dflt;
        return ACCEL_OK;
    }
    if (!accel__python_float(v, &x) || !isfinite(x) || !(x > lo && x <= hi))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s='%s' is not a number in (%g, %g]", name, v, lo, hi);
    *out = x;
    return ACCEL_OK;
}

accel_status accel__env_nonneg(const char *name, double dflt, double *out) {
    const char *v = getenv(name);
    double x;
    if (!v) {
        *out = dflt;
        return ACCEL_OK;
    }
    if (!accel__python_float(v, &x) || !(x >= 0)) /* NaN too */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s='%s' is not a number >= 0", name, v);
    *out = x;
    return ACCEL_OK;
}
