/* `accel env`'s CUDA lines (plain C: no CUDA headers, for the CLI). */
#ifndef ACCEL_BACKENDS_CUDA_ENV_H
#define ACCEL_BACKENDS_CUDA_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Prints "- CUDA available: True|False (...)", the driver, runtime, cuBLASLt
 * and NCCL versions and one line per GPU (name, memory, compute capability);
 * with the reason when no GPU can be used. */
void accel__cuda_env_print(FILE *out);

/* Compute capability and name of cuda:index; false when it cannot be
 * queried (no such device). */
bool accel__cuda_capability(int index, int *major, int *minor, char *name, size_t name_len);

#endif
