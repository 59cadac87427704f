/* src/dist/env_rank.h — this process's rank as its launcher gave it
 * (internal), for who needs it before or without a process group. */
#ifndef ACCEL_DIST_ENV_RANK_H
#define ACCEL_DIST_ENV_RANK_H

#include "accel/core.h"

/* The rank accel_dist_init takes from the environment: the first set of
 * RANK, PMI_RANK, OMPI_COMM_WORLD_RANK, MV2_COMM_WORLD_RANK and, in a task
 * of an srun step, SLURM_PROCID; 0 when none is (one process). A value that
 * is no integer from 0 to 10^6 (an empty one included) is an error naming
 * the variable and the value (ACCEL_ERR_INVALID_ARG), *rank untouched.
 * accel_set_seed(NULL, seed, true) offsets the seed by it, as Accelerate's
 * set_seed adds PartialState's process index. */
accel_status accel__dist_env_rank(int *rank);

#endif
