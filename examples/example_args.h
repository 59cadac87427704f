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

/* argv[i] as a whole decimal integer into *out (dflt where i >= argc);
 * false for anything else, or past long long. */
static inline bool arg_int(int argc, char **argv, int i, long long dflt, long long *out) {
    char *end;
    errno = 0;
    *out = i < argc ? strtoll(argv[i], &end, 10) : dflt;
    return i >= argc || (end != argv[i] && !*end && !errno);
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
