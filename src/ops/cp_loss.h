/* Context parallelism's sharded loss composed with tensor parallelism (not
 * public API): the decoders' loss under cp x tp (src/nn/decoder_cp.c). */
#ifndef ACCEL_OPS_CP_LOSS_H
#define ACCEL_OPS_CP_LOSS_H

#include "accel/cp.h"

/* accel_cp_cross_entropy over pg whose logits [..., V / tp] are, when tp is
 * not NULL, this rank's vocabulary columns [vocab_start, vocab_start + V /
 * tp) (a vocab-parallel lm_head): this rank's mean is then
 * accel_tp_cross_entropy's (collective over tp too), the same on every rank
 * of tp, and the share's gradient reaches this rank's columns only. tp NULL:
 * accel_cp_cross_entropy itself. */
accel_tensor *accel__cp_cross_entropy(accel_pg *pg, accel_tensor *logits, accel_tensor *targets,
                                      int64_t ignore_index, accel_pg *tp, int64_t vocab_start);

#endif
