/* examples/example_args.h - the examples' positional arguments, each read
 * whole: atoi / atof read "12x" as 12 and "abc" as 0, a run that silently
 * did something else than asked. Header-only (static functions): each
 * program is one file. */
#ifndef ACCEL_EXAMPLES_EXAMPLE_ARGS_H
#define ACCEL_EXAMPLES_EXAMPLE_ARGS_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

/* argv[i] as a whole decimal integer into *out (dflt where i >= argc):
 * digits after an optional '-', as accel's CLI reads an integer; false for
 * anything else (strtoll alone took " 4", "\t4" and "+4"), or past long long. */
static inline bool arg_int(int argc, char **argv, int i, long long dflt, long long *out) {
    *out = dflt;
    if (i >= argc) return true;
    const char *digits = argv[i] + (argv[i][0] == '-');
    if (*digits < '0' || *digits > '9') return false; /* no blank, sign '+' or empty text before the digits */
    char *end;
    errno = 0;
    *out = strtoll(argv[i], &end, 10);
    return !*end && !errno;
}

/* argv[i] as a whole finite number into *out (dflt where i >= argc). An
 * underflow is read as Python's float() reads it (1e-320 subnormal, 1e-400
 * 0): strtod's ERANGE there is no error; an overflow is infinite, refused. */
static inline bool arg_real(int argc, char **argv, int i, double dflt, double *out) {
    char *end = NULL;
    *out = i < argc ? strtod(argv[i], &end) : dflt;
    return i >= argc || (end != argv[i] && !*end && isfinite(*out));
}

#endif
