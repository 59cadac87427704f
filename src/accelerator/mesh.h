/* A device mesh: the world's ranks laid out over named dimensions, each with
 * the process subgroup of the ranks that differ from this one along it only
 * (PyTorch's DeviceMesh, Accelerate's ParallelismConfig).
 *
 * Ranks are numbered row-major over (pp, dp_replicate, dp_shard, cp, tp):
 * tp varies fastest, so a tensor-parallel group is consecutive ranks, and
 * with cp = tp = 1 a dp_shard group is dp_shard consecutive ranks (one
 * machine's, for HSDP) and a dp_replicate group takes one rank of each.
 *
 * The accelerator builds one mesh (zero_config.c accel__zero_groups):
 * dp_shard (flattened with cp: the cp ranks hold the same parameters) is the
 * group ZeRO shards over, dp_replicate the one the shards are averaged
 * across (HYBRID_SHARD: DDP over dp_replicate composed with the sharding over
 * dp_shard); tp is the tensor-parallel group (tp.c), cp the sequence split of
 * context parallelism (cp.c), pp the pipeline's stages (pipeline.c). A
 * dimension's group is made when a strategy first asks for it. */
#ifndef ACCEL_ACCELERATOR_MESH_H
#define ACCEL_ACCELERATOR_MESH_H

#include "accel/dist.h"

typedef enum {
    ACCEL__MESH_PP,
    ACCEL__MESH_DP_REPLICATE,
    ACCEL__MESH_DP_SHARD,
    ACCEL__MESH_CP,
    ACCEL__MESH_TP,
    ACCEL__MESH_DIMS
} accel__mesh_dim;

typedef struct accel__mesh {
    accel_pg *world_pg;                /* borrowed: the group the mesh splits */
    int world, rank;
    int size[ACCEL__MESH_DIMS];        /* their product is world */
    int coord[ACCEL__MESH_DIMS];       /* this rank's place along each */
    accel_pg *group[ACCEL__MESH_DIMS]; /* made by accel__mesh_group, else NULL */
    accel_pg *span[1 << ACCEL__MESH_DIMS]; /* made by accel__mesh_group_over for several dimensions */
} accel__mesh;

/* Bit d of a set of dimensions is dimension d. */
#define ACCEL__MESH_BIT(d) (1u << (d))

/* "pp", "dp_replicate", "dp_shard", "cp", "tp". */
const char *accel__mesh_dim_name(accel__mesh_dim d);

/* Lays pg's ranks out over size[] (each >= 1, or one of them -1: what the
 * others leave of the world). Sizes whose product is not pg's size are
 * refused, naming them. Local: no group is made yet. */
accel_status accel__mesh_init(accel__mesh *m, accel_pg *pg, const int size[ACCEL__MESH_DIMS]);
/* The group of the ranks that share this rank's coordinates but along d
 * (its rank there is coord[d]): pg when size[d] is the world, else a subgroup
 * (accel_pg_split; of this rank alone when size[d] is 1) made on the first
 * call and owned by the mesh. Collective over pg on that first call: every
 * rank asks for the same dimensions in the same order. NULL + error on
 * failure (a rank whose sizes differ from the others' included). */
accel_pg *accel__mesh_group(accel__mesh *m, accel__mesh_dim d);
/* The group of the ranks that share this rank's coordinates outside the
 * dimensions in dims (ACCEL__MESH_BIT(d) | ...): their flattened product, as
 * DeviceMesh's flattened dimensions ("dp" = dp_replicate x dp_shard). Its
 * rank is this rank's row-major index over those dimensions. One dimension:
 * accel__mesh_group's. Made on the first call, owned by the mesh; collective
 * over pg then, as accel__mesh_group. */
accel_pg *accel__mesh_group_over(accel__mesh *m, unsigned dims);
/* The subgroups the mesh made. */
void accel__mesh_free(accel__mesh *m);
/* The world rank at coordinates coord[ACCEL__MESH_DIMS]. */
int accel__mesh_rank_at(const accel__mesh *m, const int coord[ACCEL__MESH_DIMS]);

#endif
