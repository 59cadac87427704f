/* src/dist/failed_early.h — a rank that fails before the rendezvous tells
 * the others why, at exit (internal to dist/).
 *
 * A rank whose accel_accelerator_new or accel_dist_init refuses its own
 * environment before the rendezvous (a bad ACCEL_MIXED_PRECISION on that
 * rank only) returns its error and exits, while the other ranks used to wait
 * in the rendezvous until ACCEL_DIST_TIMEOUT (300 s) for it and fail with
 * "rank 1 of 2 did not arrive". The error is the caller's to handle (it may
 * call again with other options and join after all), so nothing is told when
 * it happens: dist.c notes it here with where the job meets. If the process
 * exits normally (exit() or a return from main) with it still noted, it
 * meets the job's store as that rank and posts the message as its abort
 * record (store.h), over a connection that proved the job secret like any
 * other; every rank waiting in the rendezvous then fails at once with
 * "rendezvous failed: rank 1 failed before the rendezvous: <message>".
 * Rank 0 serves the store for it, until every other rank has connected and
 * read why or posted its own abort (at most ACCEL_DIST_TIMEOUT). A wait past
 * a second says so on stderr. */
#ifndef ACCEL_DIST_FAILED_EARLY_H
#define ACCEL_DIST_FAILED_EARLY_H

/* Notes that this process failed before the rendezvous of the job where rank
 * (of world) meets at addr:port with secret (NULL: none) and timeout_s, with
 * why: the last such failure is told at exit. */
void accel__failed_early_note(int rank, int world, const char *addr, int port, const char *secret,
                              double timeout_s, const char *why);
/* This process tries the rendezvous again: the failure noted is over (a
 * failure of this try before the rendezvous is noted anew; one in it is the
 * store's to tell). */
void accel__failed_early_forget(void);

#endif
