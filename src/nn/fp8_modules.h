/* mixed_precision='fp8' on modules: which Linears run the fp8 Linear
 * (ops/fp8_linear.h) and where their scaling state lives. Not public API. */
#ifndef ACCEL_NN_FP8_MODULES_H
#define ACCEL_NN_FP8_MODULES_H

#include "accel/nn.h"
#include "backends/fp8.h"

/* Accelerate's convert_model for TransformerEngine: every Linear of the
 * tree whose weight dims are both multiples of 16 (a tensor-parallel
 * Linear's: the slice its GEMM reads, nn/tp_internal.h) gets its fp8 meta, the
 * buffer "fp8_meta" (backends/fp8.h: scales, scale_invs, amax history of
 * r.history_len steps) on its weight's device, so the scaling state is in
 * the state_dict and the checkpoints as TE's _extra_state is. Linears that
 * have one keep it; others (odd dims, weights on meta) stay bf16. */
accel_status accel__fp8_convert_model(accel_module *root, accel__fp8_recipe r);

/* Whether a state_dict entry's name is a buffer accel__fp8_convert_model
 * adds ("fp8_meta" or "<path>.fp8_meta"): accel's own, not the model's. */
bool accel__fp8_meta_name(const char *name);

/* The fp8 metas of root's tree, depth first (so the same order on
 * every rank of a data-parallel model), and their Linears' weights:
 * *metas and *weights new arrays of *n entries the caller frees with
 * accel_free (the tensors stay the modules'), NULL when there are none;
 * weights may be NULL (not asked for). */
accel_status accel__fp8_model_metas(accel_module *root, accel_tensor ***metas, accel_tensor ***weights, int *n);

/* ACCEL_OK when every Linear accel__fp8_convert_model would convert has its
 * weight on a device with fp8 GEMMs (accel__fp8_device_check's error, naming
 * op and the device, otherwise): a model placed across devices (a device map
 * with Linears on the cpu) is refused rather than run through the CPU
 * reference. */
accel_status accel__fp8_check_devices(accel_module *root, const char *op);

/* The fp8 meta Linear m runs with: its "fp8_meta" when the thread is under
 * an fp8 autocast (accel__fp8_autocast_begin), else NULL (plain Linear). */
accel_tensor *accel__fp8_linear_meta(accel_module *m);

#endif
