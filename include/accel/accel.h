/*
 * accel/accel.h — the whole public API of accel, one include.
 *
 * Layers, lowest first (a lower header never includes a higher one):
 *   core.h         status, dtypes, devices, tensors, arenas, RNG
 *   cpu.h          the CPU: model, instruction sets, kernel variant in use
 *   tracking.h     logging, progress bars, experiment trackers (needs core.h only)
 *   autograd.h     tape, backward
 *   ops.h          differentiable ops (CPU kernels, meta shapes)
 *   nn.h           modules, layers, Llama
 *   optim.h        optimizers, gradient clipping, LR schedulers
 *   data.h         datasets, data loaders, Accelerate's batch sharding
 *   io.h           safetensors, sharded checkpoints, HF config.json
 *   dist.h         process groups and collectives
 *   parallel.h     tensor parallelism: parallel layers and collectives as ops
 *   bigmodel.h     module sizes, device maps, dispatch, offload, generation
 *   bert.h         BERT: encoder, sequence classification, config.json, save/load
 *   accelerator.h  the Accelerator
 */
#ifndef ACCEL_ACCEL_H
#define ACCEL_ACCEL_H

#include "core.h"
#include "cpu.h"
#include "tracking.h"
#include "autograd.h"
#include "ops.h"
#include "nn.h"
#include "optim.h"
#include "data.h"
#include "io.h"
#include "dist.h"
#include "cp.h"
#include "parallel.h"
#include "bigmodel.h"
#include "bert.h"
#include "accelerator.h"
#include "tokenizer.h"

#endif
