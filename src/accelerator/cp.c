/* Context parallelism in the Accelerator (opts.parallelism.cp_size /
 * cp_comm_strategy, sp_size): the mesh's cp group becomes the thread's
 * (accel/cp.h), so the decoder models run their sequence sharded over it,
 * and the backward compensates the data-parallel average for it.
 *
 * Gradients: each cp rank back-propagates its share of the loss (its tokens'
 * losses over the global token count, accel_cp_cross_entropy), so the
 * gradient of one sequence is the SUM of the cp ranks' gradients. DDP and
 * ZeRO average over dp_pg / dp_shard x cp (torch's dp_shard_cp), which
 * divides by cp once too many: the loss is multiplied by cp before backward.
 *
 * Data: the ranks of a cp group are given the same batches (a prepared data
 * loader shards over the other dimensions); accel_llama_loss keeps each
 * rank's chunks of the sequence. */
#include "accel/cp.h"
#include "accelerator_internal.h"

accel_status accel__cp_setup(accel_accelerator *acc) {
    acc->cp_pg = NULL;
    if (acc->par.size[ACCEL__MESH_CP] <= 1) return ACCEL_OK;
    acc->cp_pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_CP);
    if (!acc->cp_pg) return accel_propagate_error(accel_last_status(), "accel_accelerator_new: the cp group");
    accel_cp_set_group(acc->cp_pg, acc->par.cp_alltoall ? ACCEL_CP_ALLTOALL : ACCEL_CP_ALLGATHER);
    return ACCEL_OK;
}

void accel__cp_teardown(accel_accelerator *acc) {
    if (acc->cp_pg && accel_cp_group(NULL) == acc->cp_pg) accel_cp_set_group(NULL, ACCEL_CP_ALLGATHER);
    acc->cp_pg = NULL;
}

double accel__cp_grad_factor(const accel_accelerator *acc) {
    return acc->cp_pg ? (double)accel_pg_size(acc->cp_pg) : 1.0;
}
