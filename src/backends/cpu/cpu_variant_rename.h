/* Force-included (-include) first into each per-variant compile of the kernel
 * files of cpu_variants.h, with ACCEL__CPU_VARIANT defined to the variant's
 * name (baseline, avx2, avx512). Redeclares every listed kernel with the
 * assembler name NAME_<variant>: the file's definitions, and its calls from
 * one listed kernel to another, then use this variant's symbols. */
#ifndef ACCEL_BACKENDS_CPU_VARIANT_RENAME_H
#define ACCEL_BACKENDS_CPU_VARIANT_RENAME_H

#include "backends/cpu/cpu_variants.h"

#define ACCEL__VARIANT_STR_(x) #x
#define ACCEL__VARIANT_STR(x) ACCEL__VARIANT_STR_(x)
#define ACCEL__VARIANT_RENAME(name, params, args)                                       \
    __typeof__(name) name __asm__(ACCEL__VARIANT_STR(__USER_LABEL_PREFIX__) #name "_" \
                                  ACCEL__VARIANT_STR(ACCEL__CPU_VARIANT));
ACCEL__CPU_VARIANT_KERNELS(ACCEL__VARIANT_RENAME)

#endif
