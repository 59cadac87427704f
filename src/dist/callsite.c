/* src/dist/callsite.c — the call site of the calling thread's collectives.
 *
 * The collective macros of accel/dist.h and accel/accelerator.h call
 * accel_dist_set_call_site(__FILE__, __LINE__) before the function itself, so
 * the site is that of the user's call, also for collectives the library
 * issues inside an Accelerator function. The library is compiled without
 * the macros (ACCEL__INSIDE_LIBRARY): its own calls keep the user's site.
 *
 * The backends compare the sites of one collective across ranks (always):
 * the same call reached from two lines is what a collective skipped on some
 * ranks looks like when the next one has the same kind and arguments (a
 * metric reduced inside `if is_main_process` before the loss), and it would
 * otherwise complete with the wrong partner and hang or fail much later. */
#include <string.h>

#include "dist/backend.h"

static _Thread_local const char *tl_file;
static _Thread_local int tl_line;
/* accel_dist_allow_other_call_sites() asked for the next call (pending),
 * or the current site is exempt from the comparison (unchecked). */
static _Thread_local bool tl_allow_pending, tl_site_unchecked;

void accel_dist_set_call_site(const char *file, int line) {
    tl_file = file;
    tl_line = line;
    tl_site_unchecked = tl_allow_pending; /* the call this site belongs to was announced */
    tl_allow_pending = false;
}

void accel__site_of_caller(const char **file, int *line) {
    *file = tl_file;
    *line = tl_file ? tl_line : 0;
}

void accel_dist_allow_other_call_sites(void) { tl_allow_pending = true; }

/* Asked for inside a call (after its macro recorded the site, as
 * main_process_first does): the rest of that call is exempt. */
bool accel__other_sites_allowed(void) {
    if (tl_allow_pending) {
        tl_site_unchecked = true;
        tl_allow_pending = false;
    }
    return tl_site_unchecked;
}

uint16_t accel__site_hash(const char *file, int line) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *c = file; *c; c++) h = (h ^ (unsigned char)*c) * 16777619u;
    for (int i = 0; i < 4; i++) h = (h ^ (((unsigned)line >> (8 * i)) & 0xff)) * 16777619u;
    uint16_t folded = (uint16_t)(h ^ (h >> 16));
    return folded ? folded : 1;
}

bool accel__sites_differ(const accel__site *a, const accel__site *b) {
    if (!a->site_hash || !b->site_hash || a->kind != b->kind || a->dtype != b->dtype || a->count != b->count)
        return false; /* another call: the tag or debug mode's check names it */
    return a->line != b->line || strncmp(a->file, b->file, sizeof a->file) != 0;
}
