/* src/core/env.c — strict environment parsing (env.h). */
#include "core/env.h"

#include <errno.h>
#include <pwd.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

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

/* Significant digits past this many only round the value: a nonzero one
 * among them is written as one more digit '1' (a double's halfway points have
 * at most 767 significant digits, so the rounding comes out the same), and the
 * text strtod reads fits a buffer on the stack however long the number is. */
enum { SIGNIFICANT = 800 };

/* The value of validated decimal text: the digits from p to mant_end (a '.'
 * and '_' among them), the exponent's from exp (its sign first; NULL: none)
 * to end. Rewritten as digits and a power of ten for strtod, without the
 * '_', leading zeros or the digits past SIGNIFICANT: no allocation, so no
 * number fails for want of memory. */
static double decimal_value(bool negative, const char *p, const char *mant_end, const char *exp, const char *end) {
    char text[SIGNIFICANT + 32], *d = text; /* a sign, one digit more, "e" and a long long */
    if (negative) *d++ = '-';
    char *first = d;
    long long scale = 0; /* the power of ten of the last digit written */
    bool fraction = false, sticky = false;
    for (const char *c = p; c < mant_end; c++) {
        if (*c == '.' || *c == '_') {
            fraction |= *c == '.';
            continue;
        }
        scale -= fraction;
        if (d == first && *c == '0') continue;
        if (d - first < SIGNIFICANT) {
            *d++ = *c;
        } else {
            scale++;
            sticky |= *c != '0';
        }
    }
    if (sticky) *d++ = '1', scale--;
    if (d == first) *d++ = '0';
    /* saturated past 10^17: the digits' scale would need a text that long to
     * bring such a power back into range, and the sum cannot overflow */
    long long e = 0;
    for (const char *c = exp ? exp + (*exp == '-' || *exp == '+') : end; c < end; c++)
        if (*c != '_' && e < 100000000000000000LL) e = e * 10 + (*c - '0');
    scale += exp && *exp == '-' ? -e : e;
    snprintf(d, sizeof text - (size_t)(d - text), "e%lld", scale);
    return strtod(text, NULL);
}

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
    const char *mant_end = q, *exp = NULL;
    if (q < end && (*q == 'e' || *q == 'E')) {
        exp = ++q;
        if (q < end && (*q == '-' || *q == '+')) q++;
        q = py_digits(q, end, &more);
        if (!more) return false;
    }
    if (q != end) return false;
    *out = decimal_value(*num == '-', p, mant_end, exp, end);
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

const char *accel__home_dir(void) {
    const char *home = getenv("HOME");
    if (home) return home;
    struct passwd *pw = getpwuid(getuid()); /* (its buffer is libc's own: read before the next getpw* call) */
    return pw && pw->pw_dir && *pw->pw_dir ? pw->pw_dir : NULL;
}
