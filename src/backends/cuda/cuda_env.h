/* `accel env`'s CUDA lines (plain C: no CUDA headers, for the CLI). */
#ifndef ACCEL_BACKENDS_CUDA_ENV_H
#define ACCEL_BACKENDS_CUDA_ENV_H

#include <stdio.h>

/* Prints "- CUDA available: True|False (...)", the driver, runtime, cuBLASLt
 * and NCCL versions and one line per GPU (name, memory, compute capability);
 * with the reason when no GPU can be used. */
void accel__cuda_env_print(FILE *out);

#endif
