/* A rank that fails before the rendezvous (its own environment or options
 * refused) tells the others why when it exits, so they fail at once naming
 * it instead of waiting out ACCEL_DIST_TIMEOUT (src/dist/failed_early.h):
 *   - rank 1 of 2, or rank 0 of 3 (which serves the store for it), refuses
 *     ACCEL_MIXED_PRECISION=fp32 in accel_accelerator_new; rank 1 of 2
 *     refuses ACCEL_DEBUG_MODE=maybe in accel_dist_init: every other rank
 *     fails with "rank N failed before the rendezvous: <its message>";
 *   - a rank that fails, then calls again with good options, joins: nothing
 *     is told, at the failure or at exit;
 *   - a child forked after the failure tells nothing at its exit;
 *   - a rank that fails, then calls again and joins a rendezvous that
 *     fails, tells nothing at exit (the store saw it come);
 *   - on a store: an abort record is a rank's own (a connection of another
 *     rank cannot post it), and the rank connecting again withdraws it;
 *   - a rank claimed twice by one process says so, and two processes with
 *     the same host name and pid are told apart (src/dist/claim.c).
 * The ranks run with ACCEL_DIST_TIMEOUT=600: a regression shows as this
 * test's ctest TIMEOUT. Loopback only. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "dist/claim.h"
#include "dist/store.h"
#include "dist_group.h"

#define SECRET "s3cret" /* dist_group's */

static int g_bad_rank;        /* the rank given the bad value */
static const char *g_bad_var; /* and the variable */
static const char *g_bad_value;
static bool g_through_dist_init; /* accel_dist_init rather than accel_accelerator_new */

/* The bad rank returns 0 when refused naming its variable (its exit tells
 * the others); the others when they fail naming it and its message. */
static int body_one_refuses(int rank, int world) {
    (void)world;
    if (rank == g_bad_rank) setenv(g_bad_var, g_bad_value, 1);
    accel_accelerator *acc = NULL;
    accel_status st = g_through_dist_init ? accel_dist_init()
                      : (acc = accel_accelerator_new(NULL)) ? ACCEL_OK : accel_last_status();
    const char *msg = accel_last_error();
    char want[128];
    snprintf(want, sizeof want, "rank %d failed before the rendezvous: ", g_bad_rank);
    bool ok = rank == g_bad_rank ? st == ACCEL_ERR_INVALID_ARG && strstr(msg, g_bad_var)
                                 : st == ACCEL_ERR_DIST && strstr(msg, want) && strstr(msg, g_bad_var) &&
                                       strstr(msg, g_bad_value);
    if (!ok) fprintf(stderr, "rank %d: status %d: %s\n", rank, (int)st, msg);
    if (st == ACCEL_OK && g_through_dist_init) accel_dist_finalize();
    accel_accelerator_free(acc);
    return ok ? 0 : 1;
}

static void run_one_refuses(int world, int bad_rank, const char *var, const char *value, bool through_dist_init) {
    g_bad_rank = bad_rank;
    g_bad_var = var;
    g_bad_value = value;
    g_through_dist_init = through_dist_init;
    dist_group g = {.world = world, .timeout = "600", .kill_after_s = 600};
    CHECK(dist_group_runs_ok(&g, body_one_refuses, "%s=%s on rank %d of %d", var, value, bad_rank, world));
}

static void test_others_fail_naming_it(void) {
    run_one_refuses(2, 1, "ACCEL_MIXED_PRECISION", "fp32", false);
    run_one_refuses(3, 0, "ACCEL_MIXED_PRECISION", "fp32", false); /* rank 0 serves the store for it */
    run_one_refuses(2, 1, "ACCEL_DEBUG_MODE", "maybe", true);
}

/* Rank 1 is refused a negative total_limit, then joins with good options. */
static int body_recovers(int rank, int world) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.total_limit = -1;
    if (rank == 1 && (accel_accelerator_new(&o) || !strstr(accel_last_error(), "total_limit"))) return 1;
    accel_accelerator *acc = accel_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 2;
    }
    float x = 1;
    accel_status st = accel_pg_all_reduce(accel_dist_default_group(), &x, 1, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_accelerator_free(acc);
    return st == ACCEL_OK && x == (float)world ? 0 : 3;
}

/* Told at exit had it been kept: rank 1 would wait at exit for a store that
 * rank 0 closed (600 s: the ctest TIMEOUT). */
static void test_recovered_rank_tells_nothing(void) {
    dist_group g = {.world = 2, .timeout = "600", .kill_after_s = 600};
    CHECK(dist_group_runs_ok(&g, body_recovers, "recovered rank"));
}

/* Rank 1 of a job whose store this process serves, refused in
 * accel_dist_init, forks a child that exits: the child tells nothing (a get
 * on the store misses, as before); rank 1 tells at its own exit (a get then
 * fails at once naming it). */
/* Rank 1 of 2 meeting at port on loopback, with a variable accel_dist_init
 * refuses (ACCEL_DEBUG_MODE=maybe). */
static void refused_rank1_env(int port) {
    dist_setenv_int("RANK", 1);
    dist_setenv_int("WORLD_SIZE", 2);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    dist_setenv_int("MASTER_PORT", port);
    setenv("ACCEL_DIST_TIMEOUT", "600", 1);
    setenv("ACCEL_JOB_SECRET", SECRET, 1);
    setenv("ACCEL_DEBUG_MODE", "maybe", 1);
}

static void test_forked_child_tells_nothing(void) {
    int port = dist_free_port(), child_gone[2], go_on[2];
    CHECK(pipe(child_gone) == 0 && pipe(go_on) == 0);
    fflush(NULL);
    pid_t rank1 = fork(); /* before the store's thread: a child inherits no store to leak */
    if (rank1 == 0) {
        char c = 'x';
        if (read(go_on[0], &c, 1) != 1) exit(2); /* go_on: the store listens; then: exit */
        refused_rank1_env(port);
        if (accel_dist_init() == ACCEL_OK) exit(1);
        fflush(NULL);
        pid_t child = fork();
        if (child == 0) exit(0);
        int st;
        waitpid(child, &st, 0);
        if (write(child_gone[1], &c, 1) != 1 || read(go_on[0], &c, 1) != 1) exit(2);
        exit(0);
    }
    accel__store *server = accel__store_open("127.0.0.1", port, true, SECRET, 0, 1);
    CHECK(server != NULL);
    char c = 'x';
    CHECK(write(go_on[1], &c, 1) == 1);
    CHECK(read(child_gone[0], &c, 1) == 1);
    CHECK_MSG(accel__store_get(server, "x", NULL, NULL) == ACCEL_ERR_TIMEOUT, "the child told: %s", accel_last_error());
    CHECK(write(go_on[1], &c, 1) == 1);
    int st;
    waitpid(rank1, &st, 0);
    CHECK_MSG(dist_exited_ok(st), "rank 1: status %#x", st);
    CHECK(accel__store_get(server, "x", NULL, NULL) == ACCEL_ERR_DIST);
    CHECK_STR_CONTAINS(accel_last_error(),
                       "rendezvous failed: rank 1 failed before the rendezvous: the environment: ACCEL_DEBUG_MODE=maybe");
    for (int i = 0; i < 2; i++) close(child_gone[i]), close(go_on[i]);
    accel__store_close(server);
}

/* Rank 1 of a job whose store this process serves (rank 0, which posted
 * its own abort record) is refused in accel_dist_init, calls again with good
 * options and joins the rendezvous, which fails on rank 0's record; then it
 * exits. Its refusal is over, and the rendezvous's failure is the store's to
 * tell (rank 1 claimed, then closed): it posts nothing at exit. (It posted
 * the refusal's message, and with rank 0's store closed its exit waited
 * ACCEL_DIST_TIMEOUT.) */
static void test_failed_rendezvous_after_refusal_tells_nothing(void) {
    int port = dist_free_port(), go_on[2];
    CHECK(pipe(go_on) == 0);
    fflush(NULL);
    pid_t rank1 = fork(); /* before the store's thread */
    if (rank1 == 0) {
        char c = 'x';
        if (read(go_on[0], &c, 1) != 1) exit(2);
        refused_rank1_env(port);
        if (accel_dist_init() != ACCEL_ERR_INVALID_ARG) exit(3);
        unsetenv("ACCEL_DEBUG_MODE");
        if (accel_dist_init() != ACCEL_ERR_DIST ||
            !strstr(accel_last_error(), "rendezvous failed: rank 0 failed before the rendezvous: rank 0's reason"))
            exit(4);
        exit(0);
    }
    accel__store *server = accel__store_open("127.0.0.1", port, true, SECRET, 0, 1);
    CHECK(server && accel__store_abort(server, "rank 0's reason") == ACCEL_OK);
    char c = 'x';
    CHECK(write(go_on[1], &c, 1) == 1);
    int st;
    waitpid(rank1, &st, 0);
    CHECK_MSG(dist_exited_ok(st), "rank 1: status %#x", st);
    void *posted = NULL;
    CHECK_MSG(accel__store_get(server, "abort/1", &posted, NULL) == ACCEL_ERR_DIST, "rank 1 posted at exit: %s",
              posted ? (char *)posted : "");
    CHECK_STR_CONTAINS(accel_last_error(), "rank 0 failed before the rendezvous: rank 0's reason");
    accel_free(posted);
    for (int i = 0; i < 2; i++) close(go_on[i]);
    accel__store_close(server);
}

/* A wait on "x" for ranks 0 and 1, both missing: times out (nothing aborted
 * it; rank 2, whose connection closed, is not waited for). */
static void check_no_abort(accel__store *s, const char *why) {
    CHECK_MSG(accel__store_wait_ranks(s, "x", 2, "wait") == ACCEL_ERR_TIMEOUT, "%s: %s", why, accel_last_error());
}

static void test_abort_record_is_the_ranks_own(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 1);
    CHECK(server != NULL);
    int port = accel__store_port(server);
    /* rank 2's connection cannot abort rank 1: dropped */
    accel__store *two = accel__store_open("127.0.0.1", port, false, SECRET, 2, 1);
    CHECK(two && accel__store_set(two, "abort/1", "forged", 7) == ACCEL_ERR_DIST);
    accel__store_close(two);
    check_no_abort(server, "another rank's abort record");
    /* rank 1's own: every wait fails at once, a get's too */
    accel__store *one = accel__store_open("127.0.0.1", port, false, SECRET, 1, 1);
    CHECK(one && accel__store_abort(one, "its reason") == ACCEL_OK);
    accel__store_close(one);
    CHECK(accel__store_wait_ranks(server, "x", 2, "wait") == ACCEL_ERR_DIST);
    CHECK_STR_CONTAINS(accel_last_error(), "wait failed: rank 1 failed before the rendezvous: its reason");
    CHECK(accel__store_get(server, "x", NULL, NULL) == ACCEL_ERR_DIST);
    CHECK_STR_CONTAINS(accel_last_error(), "rendezvous failed: rank 1 failed before the rendezvous: its reason");
    /* a new process for rank 1 withdraws it */
    one = accel__store_open("127.0.0.1", port, false, SECRET, 1, 1);
    CHECK(one != NULL);
    check_no_abort(server, "rank 1 back");
    accel__store_close(one);
    accel__store_close(server);
}

/* whoami's words for this process (claim.c): "host (machine_rank ?, pid N)". */
static void my_words(char *out, size_t n) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    const char *machine = getenv("GROUP_RANK");
    snprintf(out, n, "%s (machine_rank %s, pid %d)", host, machine && *machine ? machine : "?", (int)getpid());
}

static void test_rank_claimed_twice(void) {
    char me[320], forged[400];
    my_words(me, sizeof me);
    int port = dist_free_port();
    fflush(NULL);
    pid_t child = fork(); /* claims rank 3 first; forked before the store's thread (nothing inherited to leak) */
    if (child == 0) {
        accel__store *s = accel__store_open("127.0.0.1", port, false, SECRET, 3, 600);
        accel_status st = s ? accel__claim_rank(s, 3, 2) : accel_last_status();
        accel__store_close(s);
        exit(st == ACCEL_OK ? 0 : 1);
    }
    accel__store *server = accel__store_open("127.0.0.1", port, true, SECRET, 0, 1);
    CHECK(server && accel__claim_rank(server, 0, 2) == ACCEL_OK);
    /* this process, twice (an accel_dist_init called again while rank 0 serves the first one's store) */
    accel__store *first = accel__store_open("127.0.0.1", port, false, SECRET, 1, 1);
    CHECK(first && accel__claim_rank(first, 1, 2) == ACCEL_OK);
    accel__store_close(first);
    accel__store *again = accel__store_open("127.0.0.1", port, false, SECRET, 1, 1);
    CHECK(again && accel__claim_rank(again, 1, 2) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "rank 1 was claimed before in this store by this same process, ");
    CHECK_STR_CONTAINS(accel_last_error(), me);
    accel__store_close(again);
    /* another process with this host name and pid (its own token) claimed rank 2 first */
    accel__store *other = accel__store_open("127.0.0.1", port, false, SECRET, 2, 1);
    snprintf(forged, sizeof forged, "%032d %s", 7, me);
    CHECK(other && accel__store_add(other, "claims/2", 1, NULL) == ACCEL_OK &&
          accel__store_set(other, "claim/2/1", forged, strlen(forged) + 1) == ACCEL_OK);
    CHECK(accel__claim_rank(other, 2, 2) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "rank 2 is claimed by 2 processes: first by ");
    CHECK_STR_CONTAINS(accel_last_error(), "now by another process with the same host name and pid");
    accel__store_close(other);
    /* and a plain duplicate: the child claimed rank 3 first; both pids named */
    int st;
    waitpid(child, &st, 0);
    CHECK(dist_exited_ok(st));
    accel__store *dup = accel__store_open("127.0.0.1", port, false, SECRET, 3, 1);
    CHECK(dup && accel__claim_rank(dup, 3, 2) == ACCEL_ERR_INVALID_ARG);
    char child_pid[32];
    snprintf(child_pid, sizeof child_pid, "pid %d), now by ", (int)child);
    CHECK_STR_CONTAINS(accel_last_error(), child_pid);
    CHECK_STR_CONTAINS(accel_last_error(), me);
    accel__store_close(dup);
    accel__store_close(server);
}

int main(void) {
    RUN(test_abort_record_is_the_ranks_own);
    RUN(test_rank_claimed_twice);
    RUN(test_forked_child_tells_nothing);
    RUN(test_failed_rendezvous_after_refusal_tells_nothing);
    RUN(test_others_fail_naming_it);
    RUN(test_recovered_rank_tells_nothing);
    return check_summary();
}
