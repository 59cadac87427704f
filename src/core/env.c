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

/* Python's whitespace that float() strips, in ASCII. */
static bool py_blank(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Copies the digits at *s (single '_' between two digits, as Python's
 * literals) to *d; the count of digits. */
static size_t py_digits(const char **s, char **d, const char *dend) {
    const char *p = *s;
    size_t n = 0;
    while (*p >= '0' && *p <= '9' && *d < dend) {
        *(*d)++ = *p++, n++;
        if (*p == '_' && p[1] >= '0' && p[1] <= '9') p++;
    }
    *s = p;
    return n;
}

bool accel__python_float(const char *text, double *out) {
    const char *p = text;
    while (py_blank(*p)) p++;
    const char *end = p + strlen(p);
    while (end > p && py_blank(end[-1])) end--;
    char buf[256], *d = buf, *dend = buf + sizeof buf - 1;
    if ((size_t)(end - p) >= sizeof buf) return false;
    if (*p == '-' || *p == '+') *d++ = *p++;
    static const char *const WORDS[] = {"inf", "infinity", "nan"};
    for (size_t i = 0; i < sizeof WORDS / sizeof *WORDS; i++)
        if ((size_t)(end - p) == strlen(WORDS[i]) && !strncasecmp(p, WORDS[i], strlen(WORDS[i]))) {
            *out = i == 2 ? NAN : buf[0] == '-' ? -INFINITY : INFINITY;
            return true;
        }
    size_t digits = py_digits(&p, &d, dend);
    if (*p == '.') {
        *d++ = *p++;
        digits += py_digits(&p, &d, dend);
    }
    if (!digits) return false;
    if (*p == 'e' || *p == 'E') {
        *d++ = *p++;
        if (*p == '-' || *p == '+') *d++ = *p++;
        if (!py_digits(&p, &d, dend)) return false;
    }
    if (p != end) return false;
    *d = 0;
    *out = strtod(buf, NULL); /* buf: decimal digits only, '_' dropped */
    return true;
}

accel_status accel__env_double(const char *name, double dflt, double lo, double hi, double *out) {
    const char *v = getenv(name);
    if (!v) {
        *out = dflt;
        return ACCEL_OK;
    }
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || *v == ' ' || !isfinite(x) || !(x > lo && x <= hi))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s='%s' is not a number in (%g, %g]", name, v, lo, hi);
    *out = x;
    return ACCEL_OK;
}
