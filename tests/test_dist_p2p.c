/* Point to point (accel_pg_send / recv / send_recv) on 2-4 forked ranks, on
 * shm (one machine) and tcp (each rank its own "machine"):
 *   - a ring exchange of a message several chunks long, small and empty
 *     messages in order, and pairs that exchange while the other ranks do
 *     not: the collectives after them still line up;
 *   - a receive whose count or dtype differs from the send fails naming
 *     both calls, and the sender's next call to that peer fails too;
 *   - a peer that is the caller, not a rank, or -1 where one is needed is
 *     refused without breaking the group; a group of one has no peer;
 *   - a SIGKILLed peer fails the ranks waiting for it (ACCEL_ERR_DIST naming
 *     it, not a timeout), and a silent one times out naming the call.
 * Under mpirun it runs the exchanges on the mpi backend. */
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "accel/dist.h"
#include "check.h"
#include "dist_group.h"

#define BIG 300000 /* f32 elements: 1.2 MB, several shm chunks (256 KiB) and socket buffers */

static bool g_shm; /* the backend the group runs on: shm, else tcp */
static bool g_mpi; /* started by mpirun: the mpi backend */

static int done(void) {
    accel_dist_finalize();
    accel_thread_cleanup();
    return check_failures_ ? 1 : 0;
}

static accel_pg *join(void) {
    check_failures_ = 0;
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "init: %s\n", accel_last_error());
        exit(10);
    }
    accel_pg *pg = accel_dist_default_group();
    if (strcmp(accel_pg_backend(pg), g_mpi ? "mpi" : g_shm ? "shm" : "tcp")) exit(11);
    return pg;
}

/* world ranks on the backend under test (g_shm). */
static dist_group group(int world, const char *timeout) {
    return (dist_group){.world = world, .one_machine = g_shm, .timeout = timeout, .kill_after_s = 90};
}

static void expect_all_ok(int world, dist_body_fn body, const char *what) {
    dist_group g = group(world, "30");
    CHECK(dist_group_runs_ok(&g, body, "%s on %s, %d ranks", what, g_shm ? "shm" : "tcp", world));
}

/* ---------------------------------------------------------------- exchanges */

static int exchange_body(int rank, int world) {
    accel_pg *pg = join();
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    /* a ring: everyone sends a long message right and receives one from the left at once */
    float *out = malloc(BIG * sizeof *out), *in = malloc(BIG * sizeof *in);
    for (int i = 0; i < BIG; i++) out[i] = (float)(rank * 1000003 + i);
    CHECK(accel_pg_send_recv(pg, out, BIG, next, in, BIG, prev, ACCEL_F32) == ACCEL_OK);
    bool same = true;
    for (int i = 0; i < BIG; i++) same = same && in[i] == (float)(prev * 1000003 + i);
    CHECK_MSG(same, "rank %d: the ring's message from rank %d", rank, prev);
    /* a chain 0 -> 1 -> ... of small, empty and odd-sized messages, in order */
    int64_t v[3] = {0};
    if (rank > 0) {
        CHECK(accel_pg_recv(pg, v, 3, ACCEL_I64, rank - 1) == ACCEL_OK);
        CHECK(accel_pg_recv(pg, NULL, 0, ACCEL_U8, rank - 1) == ACCEL_OK);
        CHECK(accel_pg_recv(pg, in, 7, ACCEL_BF16, rank - 1) == ACCEL_OK);
        CHECK(v[0] == rank - 1 && v[1] == 42 && v[2] == -(rank - 1));
        CHECK(memcmp(in, "0123456789abcd", 14) == 0);
    }
    if (rank < world - 1) {
        int64_t w[3] = {rank, 42, -rank};
        CHECK(accel_pg_send(pg, w, 3, ACCEL_I64, rank + 1) == ACCEL_OK);
        CHECK(accel_pg_send(pg, NULL, 0, ACCEL_U8, rank + 1) == ACCEL_OK);
        CHECK(accel_pg_send(pg, "0123456789abcd", 7, ACCEL_BF16, rank + 1) == ACCEL_OK);
    }
    /* the first and last stages of a pipeline make the same call with -1 */
    float a = (float)rank, b = -1;
    CHECK(accel_pg_send_recv(pg, &a, 1, rank < world - 1 ? rank + 1 : -1, &b, 1, rank > 0 ? rank - 1 : -1,
                             ACCEL_F32) == ACCEL_OK);
    CHECK(b == (rank > 0 ? (float)(rank - 1) : -1.f));
    /* only ranks 0 and 1 talk (both ways with one peer, twice); then every rank's collectives still line up */
    if (rank < 2)
        for (int k = 0; k < 2; k++) {
            int peer = 1 - rank;
            CHECK(accel_pg_send_recv(pg, out, BIG, peer, in, BIG, peer, ACCEL_F32) == ACCEL_OK);
            CHECK(in[5] == (float)(peer * 1000003 + 5));
        }
    float sum = 1;
    CHECK(accel_pg_all_reduce(pg, &sum, 1, ACCEL_F32, ACCEL_REDUCE_SUM) == ACCEL_OK && sum == (float)world);
    CHECK(accel_pg_barrier(pg) == ACCEL_OK);
    free(out);
    free(in);
    return done();
}

static void test_exchanges(void) {
    for (int shm = 1; shm >= 0; shm--) {
        g_shm = shm;
        for (int world = 2; world <= 4; world++) expect_all_ok(world, exchange_body, "exchanges");
    }
}

/* ---------------------------------------------------------------- mismatches */

/* rank 0 sends 8 f32; rank 1 receives 4 f32 (count) or 8 f16 (dtype). */
static bool g_dtype_mismatch;

static int mismatch_body(int rank, int world) {
    accel_pg *pg = join();
    float x[8] = {0};
    if (rank == 1) {
        accel_status st = g_dtype_mismatch ? accel_pg_recv(pg, x, 8, ACCEL_F16, 0) : accel_pg_recv(pg, x, 4, ACCEL_F32, 0);
        CHECK(st == ACCEL_ERR_DIST);
        const char *e = accel_last_error();
        CHECK_STR_CONTAINS(e, "mismatched point-to-point");
        CHECK_STR_CONTAINS(e, "send(f32, 8) to rank 1 at test_dist_p2p.c:");
        CHECK_STR_CONTAINS(e, g_dtype_mismatch ? "recv(f16, 8) from rank 0 at test_dist_p2p.c:"
                                               : "recv(f32, 4) from rank 0 at test_dist_p2p.c:");
        /* broken: the next call fails at once with that message */
        CHECK(accel_pg_barrier(pg) == ACCEL_ERR_DIST);
        CHECK_STR_CONTAINS(accel_last_error(), "mismatched point-to-point");
        nanosleep(&(struct timespec){1, 0}, NULL); /* alive while rank 0 learns of it */
    } else {
        CHECK(accel_pg_send(pg, x, 8, ACCEL_F32, 1) == ACCEL_OK); /* buffered: returns before the receive */
        /* the next call with rank 1 learns of the refusal (shm: its channel says so; tcp: rank 1's notice) */
        CHECK(accel_pg_send_recv(pg, x, 8, 1, x, 1, 1, ACCEL_F32) == ACCEL_ERR_DIST);
        CHECK_STR_CONTAINS(accel_last_error(), "mismatched point-to-point");
    }
    accel_clear_error();
    accel_thread_cleanup();
    return check_failures_ ? 1 : 0; /* no finalize: the group is broken */
}

static void test_mismatches(void) {
    for (int shm = 1; shm >= 0; shm--)
        for (int dt = 0; dt < 2; dt++) {
            g_shm = shm;
            g_dtype_mismatch = dt;
            expect_all_ok(2, mismatch_body, dt ? "dtype mismatch" : "count mismatch");
        }
}

/* ---------------------------------------------------------------- bad peers */

static int bad_peer_body(int rank, int world) {
    accel_pg *pg = join();
    float x[2] = {(float)rank, 0};
    CHECK(accel_pg_send(pg, x, 1, ACCEL_F32, rank) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "is this rank itself");
    CHECK(accel_pg_recv(pg, x, 1, ACCEL_F32, world) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "source 2 is not a rank of this group of 2");
    CHECK(accel_pg_send(pg, x, 1, ACCEL_F32, -1) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_pg_send_recv(pg, x, 1, -2, x, 1, -1, ACCEL_F32) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_pg_recv(pg, NULL, 1, ACCEL_F32, 1 - rank) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_pg_send(pg, x, 1, (accel_dtype)99, 1 - rank) == ACCEL_ERR_DTYPE);
    CHECK(accel_pg_send_recv(pg, x, 1, -1, x, 1, -1, ACCEL_F32) == ACCEL_OK); /* no peer at all: nothing to do */
    /* none of that broke the group */
    CHECK(accel_pg_send_recv(pg, x, 1, 1 - rank, x + 1, 1, 1 - rank, ACCEL_F32) == ACCEL_OK);
    CHECK(x[1] == (float)(1 - rank));
    return done();
}

static int alone_body(int rank, int world) {
    check_failures_ = 0;
    CHECK(accel_dist_init() == ACCEL_OK);
    accel_pg *pg = accel_dist_default_group();
    float x = 0;
    CHECK(accel_pg_send(pg, &x, 1, ACCEL_F32, 0) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "is this rank itself");
    CHECK(accel_pg_recv(pg, &x, 1, ACCEL_F32, 1) == ACCEL_ERR_INVALID_ARG);
    return done();
}

static void test_bad_peers(void) {
    for (int shm = 1; shm >= 0; shm--) {
        g_shm = shm;
        expect_all_ok(2, bad_peer_body, "bad peers");
    }
    expect_all_ok(1, alone_body, "a group of one");
}

/* ---------------------------------------------------------------- dead and silent peers */

/* 3 ranks: rank 1 dies; rank 0 was exchanging a long message with it, rank 2 waits for one from it. */
static int killed_body(int rank, int world) {
    accel_pg *pg = join();
    float *x = calloc(BIG, sizeof *x);
    CHECK(accel_pg_barrier(pg) == ACCEL_OK);
    if (rank == 1) {
        nanosleep(&(struct timespec){0, 200000000}, NULL); /* the others are waiting */
        raise(SIGKILL);
    }
    /* rank 0's send alone may fit the sockets' buffers (tcp): it also waits for an answer */
    accel_status st = rank == 0 ? accel_pg_send_recv(pg, x, BIG, 1, x, 4, 1, ACCEL_F32)
                                : accel_pg_recv(pg, x, 4, ACCEL_F32, 1);
    fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
    CHECK_MSG(st == ACCEL_ERR_DIST, "rank %d: status %d, not a dead peer's error", rank, (int)st);
    CHECK_STR_CONTAINS(accel_last_error(), "rank 1");
    CHECK_STR_CONTAINS(accel_last_error(), rank == 0 ? "send(f32, 300000) to rank 1" : "recv(f32, 4) from rank 1");
    free(x);
    accel_clear_error();
    accel_thread_cleanup();
    return check_failures_ ? 1 : 0;
}

/* 2 ranks: rank 1 is alive but never sends; rank 0's receive times out naming the call. */
static int silent_body(int rank, int world) {
    accel_pg *pg = join();
    float x[4];
    if (rank == 0) {
        CHECK(accel_pg_recv(pg, x, 4, ACCEL_F32, 1) == ACCEL_ERR_TIMEOUT);
        CHECK_STR_CONTAINS(accel_last_error(), "recv(f32, 4) from rank 1 at test_dist_p2p.c:");
        CHECK_STR_CONTAINS(accel_last_error(), "timed out after 1 s");
    } else {
        nanosleep(&(struct timespec){4, 0}, NULL);
    }
    accel_clear_error();
    accel_thread_cleanup();
    return check_failures_ ? 1 : 0;
}

static void test_dead_and_silent_peers(void) {
    for (int shm = 1; shm >= 0; shm--) {
        g_shm = shm;
        int st[3];
        dist_group killed = group(3, "20"), silent = group(2, "1");
        dist_group_run(&killed, killed_body, st);
        CHECK(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
        CHECK_MSG(dist_exited_ok(st[0]) && dist_exited_ok(st[2]), "killed peer on %s: ranks 0, 2: %#x %#x",
                  shm ? "shm" : "tcp", st[0], st[2]);
        dist_group_run(&silent, silent_body, st);
        CHECK_MSG(dist_exited_ok(st[0]) && dist_exited_ok(st[1]), "silent peer on %s: %#x %#x", shm ? "shm" : "tcp",
                  st[0], st[1]);
    }
}

/* Under mpirun (tests/dist_multi.cmake): this process is one rank of the mpi backend. */
static void test_mpi_rank(void) {
    int world = accel_dist_world_size(), rank = accel_dist_rank();
    g_mpi = true;
    CHECK(exchange_body(rank, world) == 0);
}

int main(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")) {
        RUN(test_mpi_rank);
        return check_summary();
    }
    RUN(test_exchanges);
    RUN(test_mismatches);
    RUN(test_bad_peers);
    RUN(test_dead_and_silent_peers);
    return check_summary();
}
