/* The mpi plug-in's entry (backends/plugin.h): libaccel-mpi.so holds the MPI
 * process-group backend (mpi.c), so that OpenMPI's libraries are mapped only
 * by a job that runs on MPI (ACCEL_DIST_BACKEND=mpi, or started by mpirun
 * without MASTER_ADDR), never by the CLI or a CPU job on shm/tcp. */
#include "backends/plugin.h"
#include "dist/backend.h"

ACCEL__PLUGIN_EXPORT const accel__plugin_abi accel_backend_mpi_abi = {
    ACCEL__PLUGIN_ABI_VERSION, ACCEL__PLUGIN_LAYOUT, ACCEL_VERSION_STRING};

ACCEL__PLUGIN_EXPORT accel_status accel_backend_mpi_init(const accel__plugin_host *host, accel__plugin_info *info) {
    ACCEL__PLUGIN_SHIMS_INIT(host);
    *info = (accel__plugin_info){0};
    return accel__pg_backend_register(&accel__backend_mpi);
}
