/* The device mesh's sizes from the options' ParallelismConfig fields
 * (accel_parallelism_opts): checked here, before any group is made, so a bad
 * size fails accel_accelerator_new on every rank alike, naming the field. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "accelerator_internal.h"

#define FN "accel_accelerator_new"

static accel_status check_size(int v, const char *field) {
    if (v < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.%s must be >= 1, or 0 for "
                               "not set (got %d)", field, v);
    return ACCEL_OK;
}

/* A size as the mesh takes it: 0 (not set) is 1. */
static int or1(int v) { return v > 0 ? v : 1; }

/* In double: sizes up to INT_MAX cannot overflow it, and a product that
 * fits an int (the only one that can equal a world) is exact. */
double accel__parallelism_model_size(const accel_parallelism_opts *p) {
    return (double)or1(p->tp_size) * or1(p->pp_size) * or1(p->cp_size) * or1(p->sp_size);
}

accel_status accel__parallelism_config(const accel_accelerator_opts *o, int world, accel__parallelism *out) {
    const accel_parallelism_opts *p = &o->parallelism;
    memset(out, 0, sizeof *out);
    const struct { int v; const char *field; } sizes[] = {
        {p->dp_replicate_size, "dp_replicate_size"}, {p->dp_shard_size, "dp_shard_size"}, {p->tp_size, "tp_size"},
        {p->cp_size, "cp_size"}, {p->sp_size, "sp_size"}, {p->pp_size, "pp_size"},
        {p->num_micro_batches, "num_micro_batches"}, {p->pp_virtual_stages, "pp_virtual_stages"},
    };
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        if (check_size(sizes[k].v, sizes[k].field)) return ACCEL_ERR_INVALID_ARG;
    /* every size's product, first: a mesh larger than any job is refused as
     * such, whatever else is wrong with it */
    double all = accel__parallelism_model_size(p) * or1(p->dp_replicate_size) * or1(p->dp_shard_size);
    if (all > INT_MAX)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism: the sizes multiply to %.3g, more than "
                               "the %d processes of the job", all, world);
    if (p->cp_comm_strategy && strcmp(p->cp_comm_strategy, "allgather") && strcmp(p->cp_comm_strategy, "alltoall"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               FN ": opts.parallelism.cp_comm_strategy \"%s\" is not \"allgather\" or \"alltoall\"",
                               p->cp_comm_strategy);
    if (p->pp_schedule && strcmp(p->pp_schedule, "1f1b") && strcmp(p->pp_schedule, "gpipe") &&
        strcmp(p->pp_schedule, "interleaved"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.pp_schedule \"%s\" is not \"1f1b\", "
                               "\"gpipe\" or \"interleaved\"", p->pp_schedule);
    /* Interleaved 1F1B (Megatron's virtual pipeline, torch's ScheduleInterleaved1F1B): virtual stages imply it, as
     * Megatron's virtual_pipeline_model_parallel_size does */
    int pp = or1(p->pp_size), v = or1(p->pp_virtual_stages), m = or1(p->num_micro_batches);
    bool interleaved = p->pp_schedule ? !strcmp(p->pp_schedule, "interleaved") : v > 1;
    if (!interleaved && v > 1)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.pp_virtual_stages = %d with pp_schedule "
                               "\"%s\": virtual stages are the interleaved schedule's (pp_schedule \"interleaved\")",
                               v, p->pp_schedule);
    if (interleaved && (v < 2 || pp < 2))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.pp_schedule \"interleaved\" needs "
                               "pp_size >= 2 and pp_virtual_stages >= 2 (the model chunks of each stage), got %d and "
                               "%d", pp, v);
    if (interleaved && m % pp)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.num_micro_batches = %d is not a multiple "
                               "of pp_size = %d: interleaved 1F1B runs the micro-batches in groups of pp_size "
                               "(Megatron's rule)", m, pp);
    if (p->sequence_parallelism != 0 && p->sequence_parallelism != ACCEL_TRUE && p->sequence_parallelism != ACCEL_FALSE)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.sequence_parallelism must be ACCEL_TRUE, "
                               "ACCEL_FALSE or 0 (got %d)", p->sequence_parallelism);
    int cp = or1(p->cp_size), sp = or1(p->sp_size);
    if (cp > 1 && sp > 1)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.cp_size = %d and sp_size = %d: context "
                               "and sequence parallelism are mutually exclusive (set one of them to 1)", cp, sp);
    /* sp is cp with the all-to-all exchange: the same mesh dimension, the same rules */
    int seq = cp > 1 ? cp : sp;
    const char *seq_field = cp > 1 ? "cp_size" : "sp_size";
    if (seq > 1 && or1(p->dp_replicate_size) > 1 && or1(p->dp_shard_size) == 1)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.%s = %d with dp_replicate_size = %d "
                               "and dp_shard_size = 1: context parallelism composes with dp_shard (FSDP + CP) or "
                               "dp_shard x dp_replicate (HSDP + CP), not with pure replication", seq_field, seq,
                               p->dp_replicate_size);
    /* cp (and sp) compose with pp: a cp rank of stage s sends its chunks'
     * hidden states to the same cp rank of stage s + 1 (pipeline.c), as a tp
     * rank does to the same tp rank (its positions' under sequence
     * parallelism); cp x tp splits the heads over tp and the sequence over
     * cp, the tp ranks splitting a cp rank's chunks further under sequence
     * parallelism. */
    out->set = p->dp_replicate_size || p->dp_shard_size || p->tp_size || p->cp_size || p->sp_size || p->pp_size;
    out->size[ACCEL__MESH_PP] = or1(p->pp_size);
    out->size[ACCEL__MESH_DP_REPLICATE] = or1(p->dp_replicate_size);
    out->size[ACCEL__MESH_DP_SHARD] = out->set ? or1(p->dp_shard_size) : world;
    /* Ulysses' sequence parallelism splits the sequence as context
     * parallelism does, exchanging heads all-to-all: one mesh dimension. */
    out->size[ACCEL__MESH_CP] = cp > 1 ? cp : sp;
    out->size[ACCEL__MESH_TP] = or1(p->tp_size);
    out->cp_alltoall = sp > 1 || (p->cp_comm_strategy && !strcmp(p->cp_comm_strategy, "alltoall"));
    out->micro_batches = or1(p->num_micro_batches);
    out->pp_gpipe = p->pp_schedule && !strcmp(p->pp_schedule, "gpipe");
    out->pp_virtual = interleaved ? v : 1;
    out->sequence_parallel = p->sequence_parallelism == ACCEL_TRUE;
    /* set: `all` is the mesh's product (cp and sp, one of them 1, are one dimension) */
    if (out->set && all != world)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               FN ": opts.parallelism: pp_size %d x dp_replicate_size %d x dp_shard_size %d x "
                               "%s %d x tp_size %d = %.0f, not the %d processes of the job",
                               out->size[ACCEL__MESH_PP], out->size[ACCEL__MESH_DP_REPLICATE],
                               out->size[ACCEL__MESH_DP_SHARD], sp > 1 ? "sp_size" : "cp_size",
                               out->size[ACCEL__MESH_CP], out->size[ACCEL__MESH_TP], all, world);
    if (out->sequence_parallel && out->size[ACCEL__MESH_TP] == 1)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.parallelism.sequence_parallelism needs tp_size > 1 "
                               "(Megatron's sequence parallelism splits the tp group's activations)");
    return ACCEL_OK;
}
