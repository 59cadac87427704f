/* src/dist/store.h — the rendezvous key/value store (internal to dist/).
 *
 * Rank 0 serves it over TCP in a thread; every rank (rank 0 included) is a
 * client. Each connection must first prove it knows the job secret
 * (ACCEL_JOB_SECRET, empty when unset) by a challenge-response that never
 * sends it (dist/auth.h), so a stray or replayed connection cannot join or
 * read keys; the store proves it back. The server multiplexes every
 * connection and bounds the unauthenticated ones in number and time, so
 * strangers cannot delay or lock out the ranks.
 * Used during init; rank 0 keeps serving it until finalize (pg->store), so
 * that a process claiming a rank late is refused by name. Collectives never
 * go through it. */
#ifndef ACCEL_DIST_STORE_H
#define ACCEL_DIST_STORE_H

#include "accel/core.h"

typedef struct accel__store accel__store;

/* Rank 0 (serve=true) binds addr:port and serves; every rank connects,
 * retrying until timeout_s. NULL + error on failure. A server opened with
 * port 0 listens where the kernel picks (accel__store_port says where).
 * rank: the rank this process claims, sent in its hello so that a refusal
 * (wrong secret) can name it to the ranks waiting for it. */
accel__store *accel__store_open(const char *addr, int port, bool serve, const char *secret, int rank,
                                double timeout_s);
int accel__store_port(const accel__store *s);
void accel__store_close(accel__store *s);
accel_status accel__store_set(accel__store *s, const char *key, const void *val, size_t len);
/* Waits (up to the store timeout) until key exists; *val is malloc'd (free()).
 * A rank's abort record (below) fails the wait at once (ACCEL_ERR_DIST). */
accel_status accel__store_get(accel__store *s, const char *key, void **val, size_t *len);
/* This rank failed before the rendezvous: why (its error message) becomes
 * its abort record ("abort/<rank>"), and every wait on the store, on every
 * rank, fails at once (ACCEL_ERR_DIST):
 * "rendezvous failed: rank 1 failed before the rendezvous: <why>".
 * A connection claiming that rank again (a new process) withdraws it. */
accel_status accel__store_abort(accel__store *s, const char *why);
/* The store s serves (rank 0's), after its own abort: waits until every
 * other rank below world has connected and claimed its number or posted its
 * own abort (ACCEL_ERR_TIMEOUT naming the first missing one after
 * timeout_s), then until their connections have closed, at most 5 s: they
 * have then read why. */
accel_status accel__store_wait_heard(accel__store *s, int world, double timeout_s);
/* This rank's part of the rendezvous is over: its connection may close from
 * now on without failing anyone ("done/<rank>"). A rank's authenticated
 * connection that closes before this (exit, kill, a failed init) makes every
 * wait still missing that rank fail at once:
 * "<what> failed: rank 1 of 3 closed its store connection during rendezvous (exited or was killed)". */
accel_status accel__store_done(accel__store *s);
/* key's int64 (0 when absent or not 8 bytes) plus delta, wrapping past the
 * int64 range; the new value in *out (NULL: not wanted). */
accel_status accel__store_add(accel__store *s, const char *key, int64_t delta, int64_t *out);
/* Waits until "<prefix>/<k>" exists for every k < world. On timeout the error
 * names the missing ranks: "<what> timed out after 30 s: ranks 2, 3 of 4 did not arrive".
 * Any missing rank that the store refused for a wrong secret (not only the
 * lowest missing one) fails it within 2 s (ACCEL_ERR_DIST naming the refused
 * address and "wrong job secret"); an abort record fails it at once, as
 * accel__store_get. */
accel_status accel__store_wait_ranks(accel__store *s, const char *prefix, int world,
                                     const char *what);

#endif
