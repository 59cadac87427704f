/* What the tensor-parallel ops (tp.c) communicated, for bench/bench_tp_step.c
 * (not public API). */
#ifndef ACCEL_OPS_TP_STATS_H
#define ACCEL_OPS_TP_STATS_H

#include <stdint.h>

/* Bytes the process has handed to the tp collectives so far: each
 * all-reduce's buffer, each all-gather's and reduce-scatter's input
 * (this rank's payload, not what the algorithm moves on the wire). */
uint64_t accel__tp_bytes(void);

#endif
