/* all_reduce bus bandwidth of accel's default group (shm on one machine), f32 SUM, 1..256 MiB.
 * Run under `accel launch --num_processes 2`. Two variants per size:
 * zero-copy (buffer from accel_pg_alloc_shared) and private (malloc'd buffer,
 * copied in and out). As the project's first all-reduce measurements: 3 warm-ups, then at least 10 calls
 * covering at least 0.5 s; each call between barriers, its time the max over
 * ranks; the median is reported. busbw = bytes/t * 2(n-1)/n. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/dist.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_time(accel_pg *pg, float *buf, size_t n) {
    static double t[4096];
    int k = 0;
    double start = accel_now_seconds();
    for (int i = 0; i < 3; i++) accel_pg_all_reduce(pg, buf, n, ACCEL_F32, ACCEL_REDUCE_SUM);
    for (;;) {
        accel_pg_barrier(pg);
        double t0 = accel_now_seconds();
        if (accel_pg_all_reduce(pg, buf, n, ACCEL_F32, ACCEL_REDUCE_SUM) != ACCEL_OK) {
            fprintf(stderr, "%s\n", accel_last_error());
            exit(1);
        }
        double dt = accel_now_seconds() - t0;
        accel_pg_all_reduce(pg, &dt, 1, ACCEL_F64, ACCEL_REDUCE_MAX);
        t[k++] = dt;
        /* every rank decides from the same (reduced) times: same number of calls */
        double el = accel_now_seconds() - start;
        accel_pg_all_reduce(pg, &el, 1, ACCEL_F64, ACCEL_REDUCE_MAX);
        if ((k >= 10 && el >= 0.5) || k == 4096) break;
    }
    qsort(t, (size_t)k, sizeof *t, cmp);
    return t[k / 2];
}

int main(int argc, char **argv) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    int world = accel_pg_size(pg), rank = accel_pg_rank(pg);
    const int mib[] = {1, 4, 16, 64, 256};
    if (rank == 0)
        printf("# accel %s all_reduce f32 sum, %d processes, busbw GB/s (median)\n# MiB zero_copy private\n",
               accel_pg_backend(pg), world);
    for (size_t i = 0; i < sizeof mib / sizeof *mib; i++) {
        size_t bytes = (size_t)mib[i] << 20, n = bytes / 4;
        float *shared = accel_pg_alloc_shared(pg, bytes);
        float *priv = accel_malloc(bytes);
        if (!shared || !priv) {
            fprintf(stderr, "%s\n", accel_last_error());
            return 1;
        }
        for (size_t j = 0; j < n; j++) shared[j] = priv[j] = 1.0f;
        double tz = median_time(pg, shared, n), tp = median_time(pg, priv, n);
        double f = 2.0 * (world - 1) / world;
        if (rank == 0) printf("%d %.2f %.2f\n", mib[i], bytes / tz * f / 1e9, bytes / tp * f / 1e9);
        fflush(stdout);
        accel_pg_free_shared(pg, shared);
        accel_free(priv);
    }
    accel_dist_finalize();
    (void)argc;
    (void)argv;
    return 0;
}
