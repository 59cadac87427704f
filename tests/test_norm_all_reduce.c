/* accel__norm_all_reduce: the partial gradient norms of clipping reduced
 * over a group, a NaN kept. Plainly a group of one; tests/dist.cmake runs
 * it on 2 processes under accel launch and, where MPI is found, under
 * mpirun with ACCEL_DIST_BACKEND=mpi: MPI's MAX (as NCCL's fmax) drops a
 * NaN on one side, so without the flag beside each value a NaN gradient on
 * one rank gave the others' finite inf-norm (ZeRO's shards, tp slices,
 * pipeline stages). */
#include <math.h>
#include <stdio.h>

#include "accel/dist.h"
#include "accelerator/accelerator_internal.h"
#include "check.h"

int main(void) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "accel_dist_init: %s\n", accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    int r = accel_pg_rank(pg), n = accel_pg_size(pg);
    /* each rank r holds {r + 1, 10 (r + 1)}; one rank's first or second is NaN (the first rank's or the
     * last's: which side of a MAX drops it depends on the backend's order) */
    for (int k = 0; k < 4; k++) {
        int nan_at = k % 2, nan_rank = k < 2 ? 0 : n - 1;
        double v[2] = {r + 1.0, 10.0 * (r + 1)};
        if (r == nan_rank) v[nan_at] = NAN;
        CHECK_MSG(accel__norm_all_reduce(pg, v, 2, INFINITY) == ACCEL_OK, "%s", accel_last_error());
        double want[2] = {n, 10.0 * n};
        want[nan_at] = NAN;
        for (int i = 0; i < 2; i++)
            CHECK_MSG(isnan(want[i]) ? isnan(v[i]) : v[i] == want[i], "max: rank %d value %d: %g, want %g", r, i, v[i],
                      want[i]);
        double s[2] = {r + 1.0, 1.0};
        if (r == nan_rank) s[nan_at] = NAN;
        CHECK(accel__norm_all_reduce(pg, s, 2, 2.0) == ACCEL_OK);
        CHECK(isnan(s[nan_at]) && (nan_at ? s[0] == n * (n + 1) / 2.0 : s[1] == n));
    }
    /* an inf stays inf, and a -inf (no gradient) stays below every value */
    double w[1] = {r == 0 ? INFINITY : 2.0};
    CHECK(accel__norm_all_reduce(pg, w, 1, INFINITY) == ACCEL_OK && isinf(w[0]) && w[0] > 0);
    accel_dist_finalize();
    accel_thread_cleanup();
    return check_summary();
}
