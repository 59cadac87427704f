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

/* ---------------------------------------------------------------- agreement */

/* What the ranks compare: every knob of the mesh. */
enum { AGREE_SIZE, AGREE_ALLTOALL = AGREE_SIZE + ACCEL__MESH_DIMS, AGREE_MICRO, AGREE_GPIPE, AGREE_VIRTUAL,
       AGREE_SEQ_PAR, AGREE_ZERO, AGREE_HYBRID, AGREE_N };
/* named as the options' fields; a yes/no knob by what it turns on */
static const char *const AGREE_NAME[AGREE_N] = {
    "pp_size", "dp_replicate_size", "dp_shard_size", "cp_size (or sp_size)", "tp_size",
    "cp_comm_strategy \"alltoall\" (or sp_size)", "num_micro_batches", "pp_schedule \"gpipe\"",
    "pp_virtual_stages", "sequence_parallelism", "the ZeRO stage (zero_stage, FSDP's sharding, DeepSpeed's)",
    "FSDP's HYBRID_SHARD sharding (fsdp_sharding_strategy)"};
static bool agree_yes_no(int k) {
    return k == AGREE_ALLTOALL || k == AGREE_GPIPE || k == AGREE_SEQ_PAR || k == AGREE_HYBRID;
}

static void agree_row(const accel__parallelism *par, int zero_stage, bool hybrid, int32_t *row) {
    for (int d = 0; d < ACCEL__MESH_DIMS; d++) row[AGREE_SIZE + d] = par->size[d];
    row[AGREE_ALLTOALL] = par->cp_alltoall;
    row[AGREE_MICRO] = par->micro_batches;
    row[AGREE_GPIPE] = par->pp_gpipe;
    row[AGREE_VIRTUAL] = par->pp_virtual;
    row[AGREE_SEQ_PAR] = par->sequence_parallel;
    row[AGREE_ZERO] = zero_stage;
    row[AGREE_HYBRID] = hybrid;
}

/* The knobs whose max (v[k]) and min (-v[AGREE_N + k]) differ, as "tp_size from 1 to 2, ...". */
static const char *describe_spread(const int32_t *v, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int k = 0; k < AGREE_N && at < n; k++)
        if (v[k] != -v[AGREE_N + k] && agree_yes_no(k))
            at += (size_t)snprintf(buf + at, n - at, "%s%s on some, not on others", at ? ", " : "", AGREE_NAME[k]);
        else if (v[k] != -v[AGREE_N + k])
            at += (size_t)snprintf(buf + at, n - at, "%s%s from %d to %d", at ? ", " : "", AGREE_NAME[k],
                                   -v[AGREE_N + k], v[k]);
    return buf;
}

accel_status accel__parallelism_agree(accel_pg *pg, accel_status mine, const accel__parallelism *par,
                                      int zero_stage, bool hybrid) {
    if (accel_pg_size(pg) == 1) return mine;
    char why[1024];
    snprintf(why, sizeof why, "%s", mine ? accel_last_error() : "");
    /* one all-reduce (max): each knob and its negation (the min), then the
     * failing rank (+ 1: 0 is none) with the highest number */
    int32_t v[2 * AGREE_N + 1] = {0};
    if (!mine) {
        agree_row(par, zero_stage, hybrid, v);
        for (int k = 0; k < AGREE_N; k++) v[AGREE_N + k] = -v[k];
    } else {
        for (int k = 0; k < 2 * AGREE_N; k++) v[k] = INT32_MIN; /* no knobs of its own */
        v[2 * AGREE_N] = accel_pg_rank(pg) + 1;
    }
    accel_status st = accel_pg_all_reduce(pg, v, 2 * AGREE_N + 1, ACCEL_I32, ACCEL_REDUCE_MAX);
    if (mine) return accel_set_error(mine, "%s", why);
    if (st) return st;
    if (v[2 * AGREE_N])
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": rank %d could not lay out the device mesh (its error is "
                               "reported there), so it fails on every rank", v[2 * AGREE_N] - 1);
    char spread[512];
    if (!*describe_spread(v, spread, sizeof spread)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": the ranks disagree on the device mesh: pp %d x dp_replicate "
                           "%d x dp_shard %d x cp %d x tp %d on rank %d, and over the ranks %s (every rank must be "
                           "given the same opts.parallelism, zero_stage / fsdp_sharding_strategy / DeepSpeed config, "
                           "and the same PARALLELISM_CONFIG_* / MEGATRON_LM_* / ACCEL_ZERO_STAGE / ACCEL_FSDP_* "
                           "variables)", par->size[0], par->size[1], par->size[2], par->size[3], par->size[4],
                           accel_pg_rank(pg), spread);
}
