/* src/dist/failed_early.c — the noted failure before the rendezvous, told to
 * the job's store at exit (see failed_early.h). */
#include "dist/failed_early.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/store.h"

/* How long a wait at exit stays quiet: past it, stderr says why the process
 * has not exited yet. */
#define QUIET_S 1.0

/* The failure to tell; pid 0: none. pid is the process that noted it: a
 * child forked after the note has nothing to tell. */
typedef struct noted {
    pid_t pid;
    int rank, world, port;
    double timeout_s;
    char *addr, *secret, *why;
} noted;

static noted g_noted;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void clear(noted *n) {
    if (n->secret) memset(n->secret, 0, strlen(n->secret));
    accel_free(n->addr);
    accel_free(n->secret);
    accel_free(n->why);
    *n = (noted){0};
}

static void say_waiting(const noted *n, double more_s) {
    fprintf(stderr, "accel: rank %d of %d failed before the rendezvous; %s the store at %s:%d so that the other "
                    "ranks fail at once naming why, for up to %g s more (ACCEL_DIST_TIMEOUT) before exiting\n",
            n->rank, n->world, n->rank == 0 ? "serving" : "waiting for", n->addr, n->port, more_s);
}

/* Rank 0 serves the store until the others have read the record; any other
 * rank posts it in rank 0's store and leaves (rank 0, waiting in the
 * rendezvous, reads it at its next poll and tells the ranks connected). */
static void tell(const noted *n) {
    double quiet = n->timeout_s < QUIET_S ? n->timeout_s : QUIET_S, rest = n->timeout_s - quiet;
    bool serve = n->rank == 0;
    accel__store *s = accel__store_open(n->addr, n->port, serve, n->secret, n->rank, serve ? n->timeout_s : quiet);
    if (!s && !serve && accel_last_status() == ACCEL_ERR_TIMEOUT && rest > 0) { /* rank 0 is not listening yet */
        say_waiting(n, rest);
        s = accel__store_open(n->addr, n->port, false, n->secret, n->rank, rest);
    }
    bool told = s && accel__store_abort(s, n->why) == ACCEL_OK;
    if (told && serve && accel__store_wait_heard(s, n->world, quiet) == ACCEL_ERR_TIMEOUT && rest > 0) {
        say_waiting(n, rest);
        if (accel__store_wait_heard(s, n->world, rest) != ACCEL_OK) { /* a rank never came: it times out alone */ }
    }
    accel__store_close(s);
}

static void tell_at_exit(void) {
    pthread_mutex_lock(&g_lock);
    noted n = g_noted;
    g_noted = (noted){0};
    pthread_mutex_unlock(&g_lock);
    if (n.pid == getpid()) tell(&n);
    clear(&n);
}

void accel__failed_early_note(int rank, int world, const char *addr, int port, const char *secret,
                              double timeout_s, const char *why) {
    static bool at_exit;
    pthread_mutex_lock(&g_lock);
    clear(&g_noted);
    if (!at_exit) at_exit = atexit(tell_at_exit) == 0;
    g_noted = (noted){getpid(), rank, world, port, timeout_s, accel_strdup(addr), accel_strdup(secret ? secret : ""),
                      accel_strdup(why)};
    if (!at_exit || !g_noted.addr || !g_noted.secret || !g_noted.why) clear(&g_noted);
    pthread_mutex_unlock(&g_lock);
}

void accel__failed_early_forget(void) {
    pthread_mutex_lock(&g_lock);
    clear(&g_noted);
    pthread_mutex_unlock(&g_lock);
}
