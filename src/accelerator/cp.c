/* Context parallelism in the Accelerator (opts.parallelism.cp_size /
 * cp_comm_strategy, sp_size): the mesh's cp group is recorded on each
 * prepared decoder model (accel_llama_context_parallelize), so it runs its
 * sequence sharded over it, and undone when the accelerator lets the model
 * go; the backward compensates the data-parallel average for it.
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
#include "nn/decoder_cp.h"

accel_status accel__cp_setup(accel_accelerator *acc) {
    acc->cp_pg = NULL;
    if (acc->par.size[ACCEL__MESH_CP] <= 1) return ACCEL_OK;
    acc->cp_pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_CP);
    if (!acc->cp_pg) return accel_propagate_error(accel_last_status(), "accel_accelerator_new: the cp group");
    return ACCEL_OK;
}

accel_status accel__cp_prepare(accel_accelerator *acc, accel_module *m) {
    if (!acc->cp_pg) return ACCEL_OK;
    int own = accel__cp_own_plan(m, acc->cp_pg, acc->par.cp_alltoall ? ACCEL_CP_ALLTOALL : ACCEL_CP_ALLGATHER);
    if (own) return own > 0 ? ACCEL_OK : accel_last_status();
    /* the batch is the same on every cp rank: another model would train on it cp times over */
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_accelerator_prepare: opts.parallelism.cp_size %d: the "
                           "model (%s) has no context-parallel forward of its own (the decoder causal LMs have)",
                           accel_pg_size(acc->cp_pg), m->ops->type_name);
}

void accel__cp_release(accel_accelerator *acc, accel_module *m) {
    if (acc->cp_pg && accel__cp_model_group(m) == acc->cp_pg) accel__cp_own_plan(m, NULL, ACCEL_CP_ALLGATHER);
}

double accel__cp_grad_factor(const accel_accelerator *acc) {
    return acc->cp_pg ? (double)accel_pg_size(acc->cp_pg) : 1.0;
}
