/* The ZeRO-3 strategy's own functions (zero3.c, zero3_checkpoint.c), for
 * zero3_strategy.c's table and each other; the rest of the accelerator
 * reaches them through the table (strategy.h). */
#ifndef ACCEL_ACCELERATOR_ZERO3_H
#define ACCEL_ACCELERATOR_ZERO3_H

#include "accelerator_internal.h"
#include "zero_state.h"

/* zero3.c: ZeRO-3 / FSDP FULL_SHARD */
/* Lays the flat f32 buffer out unit by unit (each aligned to the device's
 * mapping granule, padded to 16 x world) in the backend's reserved address
 * space (its vm_* entries), whose ranges are mapped and unmapped per unit. */
accel_status accel__zero3_layout(accel_accelerator *acc, accel__model *pm);
/* After rank 0's weights reached every rank: keeps this rank's pieces, drops
 * the full parameters, hooks the unit modules (after any autocast hook). */
accel_status accel__zero3_start(accel_accelerator *acc, accel__model *pm);
/* Gathers every unit back (collective), unhooks, returns a plain flat
 * buffer; the first unit it could not gather is its error (the buffer is
 * plain all the same, that unit's parameters zeros). */
accel_status accel__zero3_release(accel_accelerator *acc, accel__model *pm);
void accel__zero3_begin_backward(accel_accelerator *acc, accel__model *pm);
/* True when leaf belongs to pm (its unit's gradient may then start reducing). */
bool accel__zero3_grad_ready(accel_accelerator *acc, accel__model *pm, const accel_tensor *leaf);
/* Reduce-scatters what is left, adds every unit's piece into zgrad, drops the full buffers. */
accel_status accel__zero3_end_backward(accel_accelerator *acc, accel__model *pm);
/* The walk that fires grad_ready begins: each unit waits for the leaves it reaches. */
void accel__zero3_pass_begin(accel_accelerator *acc, accel__model *pm);
/* After the shard step: every unit released, so the next forward gathers the new weights. */
accel_status accel__zero3_after_step(accel_accelerator *acc, accel__model *pm);
/* Unit u's full parameters into the module's tensors (collective), and
 * their pages given back (the persistent unit keeps them). For checkpoints. */
accel_status accel__zero3_gather_unit(accel_accelerator *acc, accel__model *pm, int u);
accel_status accel__zero3_release_unit(accel_accelerator *acc, accel__model *pm, int u);

/* zero3_checkpoint.c (collective like the rest of it: every rank calls
 * them, in the same order, even after a local failure). */
/* save_state's model i: SHARDED_STATE_DICT (every rank its shard, rank 0 the
 * index) into dir/pytorch_model_fsdp_<i>/, else FULL_STATE_DICT
 * dir/model[_<i>].safetensors gathered unit by unit. Under tensor
 * parallelism always the latter, of whole tensors: every unit gathered on
 * every rank, then the slices over the tp group. */
accel_status accel__zero3_save_model_state(accel_accelerator *acc, int i, const char *dir, bool failed);
/* load_state's model i: whichever format dir holds, onto this world size
 * (resharding when it differs; under tp each rank reads its slices of the
 * whole tensors). Local reads, no collective. */
accel_status accel__zero3_load_model_state(accel_accelerator *acc, int i, const char *dir);
/* save_model of a stage-3 model: Hugging Face safetensors (max_shard_bytes
 * shards + index) written by rank 0, gathered one unit at a time (under
 * tensor parallelism every unit at once, then the slices over the tp group;
 * the 16-bit save is refused there). */
/* The dtype ZeRO-3's save_model writes the f32 weights in (bf16/fp16 with
 * stage3_gather_16bit_weights_on_model_save under that mixed precision). */
accel_dtype accel__zero3_saved_dtype(const accel_accelerator *acc);
accel_status accel__zero3_save_model(accel_accelerator *acc, accel__model *pm, const char *dir,
                                     int64_t max_shard_bytes, bool failed);
/* save_state's optimizer i under SHARDED_STATE_DICT: dir/optimizer_<i>/
 * (every rank its shard, rank 0 the index). Under FULL_STATE_DICT and under
 * tensor parallelism the consolidated optimizer[_<i>].safetensors is
 * written as under stage 2. */
accel_status accel__zero3_save_optimizer_state(accel_accelerator *acc, int i, const char *dir, bool failed);
/* load_state's optimizer i: whichever format dir holds, onto this world
 * size (resharding when it differs). Local reads, no collective. *found is
 * false (and nothing done) when dir holds no optimizer_<i>/: the
 * consolidated file is then loaded as under stage 2. */
accel_status accel__zero3_load_optimizer_state(accel_accelerator *acc, int i, const char *dir, bool *found);
/* Whether dir holds optimizer i sharded (dir/optimizer_<i>/). */
bool accel__zero3_has_optimizer_shards(const char *dir, int i);
/* check_own_optimizer: everything accel__zero3_load_optimizer_state checks
 * of dir/optimizer_<i>/ (which must exist), nothing read into the
 * optimizer. Local. */
accel_status accel__zero3_check_optimizer_shards(accel_accelerator *acc, int i, const char *dir);
/* refuse_foreign: an error naming what to do when dir holds model i
 * sharded (a model that is not stage 3 is loading it). */
accel_status accel__zero3_refuse_sharded(const char *dir, int i);

#endif
