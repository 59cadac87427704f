/* bench_rendezvous: how long accel_dist_init takes (the store's handshakes,
 * the rank claims, the backend's own connections) and the final barrier of
 * accel_dist_finalize. Run under a launcher:
 *
 *     accel launch --num_processes 2 build/bin/bench_rendezvous
 *     ACCEL_DIST_BACKEND=tcp accel launch --num_processes 2 build/bin/bench_rendezvous
 *
 * Rank 0 prints one line: init_ms=<accel_dist_init> finalize_ms=<accel_dist_finalize>
 * backend=<name>. bench/rendezvous.sh runs it many times beside /bin/true
 * (the launcher alone) and reports medians.
 *
 *     bench_rendezvous --handshakes N
 *
 * alone: one process serves a store on loopback and opens N client
 * connections to it in turn (connect, the secret's handshake, close); prints
 * the median and minimum microseconds per connection over 9 rounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "dist/store.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int handshakes(int n) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, "bench-secret", 0, 10);
    if (!server) {
        fprintf(stderr, "bench_rendezvous: %s\n", accel_last_error());
        return 1;
    }
    double us[9];
    for (int r = 0; r < 9; r++) {
        double t0 = accel_now_seconds();
        for (int i = 0; i < n; i++) {
            accel__store *c = accel__store_open("127.0.0.1", accel__store_port(server), false, "bench-secret", 1, 10);
            if (!c) {
                fprintf(stderr, "bench_rendezvous: %s\n", accel_last_error());
                return 1;
            }
            accel__store_close(c);
        }
        us[r] = (accel_now_seconds() - t0) * 1e6 / n;
    }
    accel__store_close(server);
    qsort(us, 9, sizeof us[0], cmp_double);
    printf("handshake_us=%.1f min=%.1f (median of 9 rounds of %d connections)\n", us[4], us[0], n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--handshakes")) return handshakes(atoi(argv[2]));
    double t0 = accel_now_seconds();
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "bench_rendezvous: %s\n", accel_last_error());
        return 1;
    }
    double t1 = accel_now_seconds();
    accel_pg *pg = accel_dist_default_group();
    int rank = accel_pg_rank(pg);
    char backend[16];
    snprintf(backend, sizeof backend, "%s", accel_pg_backend(pg));
    accel_dist_finalize();
    double t2 = accel_now_seconds();
    if (rank == 0) printf("init_ms=%.3f finalize_ms=%.3f backend=%s\n", (t1 - t0) * 1e3, (t2 - t1) * 1e3, backend);
    accel_thread_cleanup();
    return 0;
}
