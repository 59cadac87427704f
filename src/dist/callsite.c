/* src/dist/callsite.c — the call site of the calling thread's collectives.
 *
 * The collective macros of accel/dist.h and accel/accelerator.h call
 * accel_dist_set_call_site(__FILE__, __LINE__) before the function itself, so
 * the site is that of the user's call, also for collectives the library
 * issues inside an Accelerator function. The library is compiled without
 * the macros (ACCEL__INSIDE_LIBRARY): its own calls keep the user's site. */
#include "dist/backend.h"

static _Thread_local const char *tl_file;
static _Thread_local int tl_line;

void accel_dist_set_call_site(const char *file, int line) {
    tl_file = file;
    tl_line = line;
}

void accel__site_of_caller(const char **file, int *line) {
    *file = tl_file;
    *line = tl_file ? tl_line : 0;
}
