/* Accelerate's str_to_bool (accelerate/utils/environment.py), the one reading
 * of a boolean's text in accel: the library's variables (ACCEL_FSDP_*,
 * ACCELERATE_FP8_*, ...) and the CLI's flags and config values (internal). */
#ifndef ACCEL_CORE_STR_TO_BOOL_H
#define ACCEL_CORE_STR_TO_BOOL_H

#include <stddef.h>

#include "accel/core.h"

/* The first len bytes of s: 1 for y, yes, t, true, on, 1; 0 for n, no, f,
 * false, off, 0 (any case); -1 for anything else (Accelerate raises
 * ValueError there: never read as a default). */
int accel__str_to_bool(const char *s, size_t len);

/* value, the text of the setting `name`, into *out; NULL (not set) leaves
 * *out as it is. Anything accel__str_to_bool refuses fails with
 * ACCEL_ERR_INVALID_ARG "fn: name=value is not a boolean (...)". */
accel_status accel__parse_bool(const char *fn, const char *name, const char *value, bool *out);

#endif
