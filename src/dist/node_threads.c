/* src/dist/node_threads.c — ranks that share a machine share its cores.
 *
 * `accel launch` gives each worker OMP_NUM_THREADS = cores / local workers.
 * Started by anything else (plain srun, mpirun, torchrun), every rank would
 * run an OpenMP pool as wide as the machine: with 2 ranks on 2 cores each
 * pool's threads spin while the other's work, measured 8x slower steps
 * (bench/RESULTS.md, "Ranks sharing a machine"). So the group sizes the
 * kernels' threads to the rank's share, as the launcher does, unless the
 * user chose (OMP_NUM_THREADS, accel_set_num_threads), and says so once. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/core_internal.h"
#include "dist/backend.h"

int accel__node_thread_share(int local_world) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    /* A rank its launcher bound to fewer cores (srun --cpu-bind, mpirun
     * --bind-to core) has those only: OpenMP already sizes its pool to them. */
    long mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
    long share = local_world > 0 ? online / local_world : online;
    if (share > mine) share = mine;
    return share < 1 ? 1 : (int)share;
}

void accel__fit_threads_to_node(int rank, int local_world) {
    static bool said;
    if (local_world < 2 || accel__num_threads_chosen()) return;
    int share = accel__node_thread_share(local_world), had = accel_num_threads();
    if (share >= had) return;
    accel__cap_num_threads(share);
    if (rank != 0 || said) return;
    said = true;
    fprintf(stderr, "accel: %d processes share this machine's %ld cores: %d OpenMP thread%s each, not %d "
                    "(OMP_NUM_THREADS is %s; set it to choose)\n",
            local_world, sysconf(_SC_NPROCESSORS_ONLN), share, share == 1 ? "" : "s", had,
            getenv("OMP_NUM_THREADS") ? "empty, which OpenMP ignores" : "not set");
}
