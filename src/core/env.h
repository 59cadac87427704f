/* src/core/env.h — the one reading of the library's environment variables
 * (internal).
 *
 * Every integer, boolean and number accel reads from the environment goes
 * through these, so that every variable is read the same strict way: the
 * whole text must be the value (no "4x"; no " 4" for an integer, while a
 * number, as Python's float() reads it, may have blanks around it), a
 * variable that is set but empty is an error (RANK= is not "rank 0"), and
 * the error names the variable and its value, as Python's int() /
 * str_to_bool / float() do for the peers.
 * Unset: *out gets the default. Errors: ACCEL_ERR_INVALID_ARG, "NAME='value'
 * is not ..." (the caller's entry point is not known here: the variable's
 * name says where to look). */
#ifndef ACCEL_CORE_ENV_H
#define ACCEL_CORE_ENV_H

#include <stdbool.h>

#include "accel/core.h"

/* Decimal integer in [lo, hi]. */
accel_status accel__env_long(const char *name, long dflt, long lo, long hi, long *out);
/* Same, of text already read (`name` only names it in the error): the
 * launcher's flags and SLURM's variables share the rule. */
accel_status accel__parse_long(const char *name, const char *text, long lo, long hi, long *out);
/* Boolean as Accelerate's str_to_bool reads it (y/yes/t/true/on/1, n/no/f/false/off/0). */
accel_status accel__env_bool(const char *name, bool dflt, bool *out);
/* text as Python's float() reads it (Accelerate's number variables and
 * argparse's type=float flags are read so; every number accel reads from the
 * environment or a launcher flag goes through it, and the chat templates'
 * |float): blanks (ASCII ' ', \t to \r: accel__python_blank) around it, a
 * sign, digits with single '_' between two of them, an optional fraction and
 * exponent, or inf / infinity / nan in any case. ASCII only: float()'s other
 * scripts' digits and Unicode blanks are refused. What strtod also takes
 * (hex, "nan(...)") is none. False, *out untouched, when it is none. It
 * allocates nothing, however long the text: no number fails for want of
 * memory (a long one's copy on the heap did, and its callers said "not a
 * number"). */
bool accel__python_float(const char *text, double *out);
/* The same of the len bytes at text (no NUL needed after them). */
bool accel__python_float_n(const char *text, size_t len, double *out);
/* Whether c is a blank float() and int() strip: ' ' and \t to \r (not
 * \x1c-\x1f, which str.isspace() takes and they refuse). */
bool accel__python_blank(char c);
/* As Python's float(), a finite number in (lo, hi]. */
accel_status accel__env_double(const char *name, double dflt, double lo, double hi, double *out);
/* As Python's float(), a number >= 0, infinity included (a norm that clips
 * nothing). */
accel_status accel__env_nonneg(const char *name, double dflt, double *out);
/* The home directory as Python's os.path.expanduser finds it: $HOME where
 * it is set (even empty), else the user's passwd entry's (getpwuid(getuid())
 * ->pw_dir, a service run without HOME: systemd, cron, some containers);
 * NULL when neither gives one. Every path accel derives from the home
 * directory takes it from here, so that accel and Accelerate look in the
 * same place. */
const char *accel__home_dir(void);

#endif
