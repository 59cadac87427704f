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

/* The blanks float() strips, in ASCII: ' ' and \t \n \v \f \r (not
 * \x1c-\x1f, which str.isspace() takes and float() refuses). */
static bool py_blank(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static bool py_digit(char c) { return c >= '0' && c <= '9'; }

/* Past the digits from p, a single '_' only between two of them (Python's
 * literals); *n: how many digits. */
static const char *py_digits(const char *p, size_t *n) {
    *n = 0;
    while (py_digit(*p)) {
        p++, (*n)++;
        if (*p == '_' && py_digit(p[1])) p++;
    }
    return p;
}

bool accel__python_float(const char *text, double *out) {
    const char *num = text;
    while (py_blank(*num)) num++;
    const char *end = num + strlen(num);
    while (end > num && py_blank(end[-1])) end--;
    const char *p = num + (*num == '-' || *num == '+');
    size_t len = (size_t)(end - p), n, more;
    if ((len == 3 || len == 8) && !strncasecmp(p, "infinity", len)) /* "inf" is its first 3 */
        return *out = *num == '-' ? -INFINITY : INFINITY, true;
    if (len == 3 && !strncasecmp(p, "nan", 3)) return *out = NAN, true;
    const char *q = py_digits(p, &n);
    if (*q == '.') q = py_digits(q + 1, &more), n += more;
    if (!n) return false;
    if (*q == 'e' || *q == 'E') {
        q = py_digits(q + 1 + (q[1] == '-' || q[1] == '+'), &more);
        if (!more) return false;
    }
    if (q != end) return false;
    /* [num, end) is decimal text that strtod reads the same way, but for the '_': a copy without them */
    if (!memchr(num, '_', (size_t)(end - num))) {
        *out = strtod(num, NULL); /* stops at end: a blank or the text's end */
        return true;
    }
    char *plain = malloc((size_t)(end - num) + 1), *d = plain;
    if (!plain) return false;
    for (const char *c = num; c < end; c++)
        if (*c != '_') *d++ = *c;
    *d = 0;
    *out = strtod(plain, NULL);
    free(plain);
    return true;
}

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
