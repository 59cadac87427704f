/* src/core/env.c — strict environment parsing (env.h). */
#include "core/env.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
