/* src/dist/claim.h — rank claims at rendezvous (internal to dist/). */
#ifndef ACCEL_DIST_CLAIM_H
#define ACCEL_DIST_CLAIM_H

#include "dist/store.h"

/* Claims `rank` in the store and checks `world` against rank 0's. A rank
 * claimed before (by another process: a duplicate machine_rank) or another
 * world size than rank 0's is an ACCEL_ERR_INVALID_ARG naming both
 * processes' hosts and machine_rank (GROUP_RANK). */
accel_status accel__claim_rank(accel__store *st, int rank, int world);

#endif
