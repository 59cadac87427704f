/* src/accelerator/parallelism_env.h — ParallelismConfig's and Megatron-LM's
 * environment variables into the Accelerator's options (internal;
 * docs/parallelism.md "Configuring it").
 *
 * As Accelerate reads them: PARALLELISM_CONFIG_* when
 * ACCELERATE_USE_PARALLELISM_CONFIG is true (what `accel launch
 * --use_parallelism_config` exports) or when the code set a size of
 * opts.parallelism (Accelerate's ParallelismConfig() reads the variables of
 * the fields it was not given); MEGATRON_LM_* when ACCELERATE_USE_MEGATRON_LM
 * is true. Each is also read as ACCEL_<name> (ACCEL_USE_PARALLELISM_CONFIG,
 * ACCEL_PARALLELISM_CONFIG_TP_SIZE, ACCEL_MEGATRON_LM_TP_DEGREE, ...), which
 * wins, as ACCEL_MIXED_PRECISION does over ACCELERATE_MIXED_PRECISION. A
 * field set in the options wins over its variable. */
#ifndef ACCEL_ACCELERATOR_PARALLELISM_ENV_H
#define ACCEL_ACCELERATOR_PARALLELISM_ENV_H

#include <stdbool.h>

#include "accelerator_internal.h"

typedef struct accel__parallelism_env {
    bool megatron;              /* ACCELERATE_USE_MEGATRON_LM was true */
    bool recompute_activations; /* MEGATRON_LM_RECOMPUTE_ACTIVATIONS: every decoder layer checkpointed at prepare */
    char from[512];             /* "NAME=value, ..." of the variables that set opts.parallelism fields ("" if none) */
} accel__parallelism_env;

/* Fills o's unset fields from the variables: the opts.parallelism sizes,
 * cp_comm_strategy, pp_size, num_micro_batches and sequence_parallelism;
 * Megatron's distributed optimizer as o->zero_stage 1 (ZeRO-1 over the data-
 * parallel ranks) and its gradient clipping (default 1.0, as MegatronLMPlugin)
 * as o->gradient_clipping. A size of 1 is every size's default and sets
 * nothing (so the launcher's all-1 export leaves the mesh at its default,
 * as Accelerate's total_size 1 does). Refused (ACCEL_ERR_INVALID_ARG, naming
 * the variable and its value): a value that is not a positive integer, a
 * boolean, a finite norm >= 0, or one of the strategy's names; a tensor-
 * parallel size that PARALLELISM_CONFIG_TP_SIZE and MEGATRON_LM_TP_DEGREE
 * give differently; the distributed optimizer beside another choice of ZeRO
 * stage, and MEGATRON_LM_GRADIENT_CLIPPING beside another ACCEL_GRADIENT_CLIPPING
 * or a DeepSpeed config (Megatron's default 1.0 gives way to both). */
accel_status accel__parallelism_env_read(accel_accelerator_opts *o, accel__parallelism_env *pe);

/* accel__parallelism_config of o on world processes, after Megatron's rule
 * for the data-parallel size (under ACCELERATE_USE_MEGATRON_LM, with neither
 * dp size given: dp_shard = world / (tp x pp x cp x sp), as Megatron derives
 * it) and with pe->from added to its error, so a refusal names the variables
 * that asked for it. */
accel_status accel__parallelism_env_resolve(accel_accelerator_opts *o, const accel__parallelism_env *pe, int world,
                                            accel__parallelism *out);

#endif
