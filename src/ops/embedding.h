/* accel_embedding with nn.Embedding's padding_idx (src/ops/embedding.c), for
 * the embedding modules built with one (src/nn/padded_embedding.c, the
 * vocab-parallel embedding). */
#ifndef ACCEL_OPS_EMBEDDING_H
#define ACCEL_OPS_EMBEDDING_H

#include "accel/ops.h"

/* accel_embedding(ids, weight) whose backward adds nothing to weight's row
 * padding_idx (-1: none, accel_embedding itself; else in [0, V) of weight
 * [V, D], refused naming it otherwise). The forward looks that row up as any
 * other, as torch does. */
accel_tensor *accel__embedding_padded(accel_tensor *ids, accel_tensor *weight, int64_t padding_idx);

#endif
