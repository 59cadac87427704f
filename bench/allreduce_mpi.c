/* OpenMPI peer of bench_allreduce.c (compiled by bench/dist_bench.sh with mpicc).
 * `allreduce_mpi`       : MPI_Allreduce(MPI_IN_PLACE, f32, SUM) busbw, same protocol.
 * `allreduce_mpi nb`    : the same through MPI_Iallreduce + an MPI_Test loop (what
 *                         accel's mpi backend did before: libnbc's schedules).
 * `allreduce_mpi hello` : MPI_Init + Barrier + Finalize (launch-cost peer). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc > 1 && !strcmp(argv[1], "hello")) {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    int nb = argc > 1 && !strcmp(argv[1], "nb");
    const int mib[] = {1, 4, 16, 64, 256};
    static double t[4096];
    if (rank == 0) printf("# OpenMPI %s f32 sum, %d processes, busbw GB/s (median)\n# MiB busbw\n",
                          nb ? "MPI_Iallreduce+MPI_Test" : "MPI_Allreduce", world);
    for (size_t i = 0; i < sizeof mib / sizeof *mib; i++) {
        size_t bytes = (size_t)mib[i] << 20, n = bytes / 4;
        float *buf;
        if (posix_memalign((void **)&buf, 4096, bytes)) return 1;
        for (size_t j = 0; j < n; j++) buf[j] = 1.0f;
        for (int w = 0; w < 3; w++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        int k = 0;
        double start = MPI_Wtime();
        for (;;) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (nb) {
                MPI_Request req;
                int done = 0;
                MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
                while (!done) MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            } else {
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            }
            double dt = MPI_Wtime() - t0, el = MPI_Wtime() - start;
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &el, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            t[k++] = dt;
            if ((k >= 10 && el >= 0.5) || k == 4096) break;
        }
        qsort(t, (size_t)k, sizeof *t, cmp);
        if (rank == 0) printf("%d %.2f\n", mib[i], bytes / t[k / 2] * 2.0 * (world - 1) / world / 1e9);
        fflush(stdout);
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
