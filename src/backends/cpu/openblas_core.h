/* Which of OpenBLAS's cores runs here, and whether it is below the CPU
 * (not public API; docs/cpu.md "OpenBLAS's core").
 *
 * A DYNAMIC_ARCH OpenBLAS (Debian's) picks at load, from cpuid's family and
 * model, the kernels of one "core" it was built for (Haswell, SkylakeX...),
 * or the one OPENBLAS_CORETYPE names. A model its tables do not know can land
 * on an old core: 0.3.21 runs its Prescott (SSE3) kernels on an Emerald
 * Rapids Xeon, 4-6x slower than its AVX-512 ones there. accel names the core
 * (`accel env`), and where it is below what the CPU offers, the GEMM rule
 * stops sending work to it (gemm.c). */
#ifndef ACCEL_BACKENDS_CPU_OPENBLAS_CORE_H
#define ACCEL_BACKENDS_CPU_OPENBLAS_CORE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/cpuinfo.h"

/* The vector level of core `name`'s kernels (OpenBLAS's x86-64 core names,
 * driver/others/dynamic.c, any case), or -1 for a name the table lacks
 * (another architecture's, a newer OpenBLAS's, NULL). */
int accel__openblas_core_level(const char *name);

/* The core whose kernels suit a CPU of vector level l: "SkylakeX" (AVX-512),
 * "Haswell" (AVX2 + FMA), "Sandybridge" (AVX), "Prescott" (SSE: x86-64's
 * floor). Names OPENBLAS_CORETYPE accepts (0.3.21 refuses "Cooperlake",
 * whose kernels are SkylakeX's). */
const char *accel__openblas_core_for(accel__cpu_vector_level l);

/* Whether OpenBLAS runs a known core whose level is below this CPU's
 * (accel__cpu_vector_level_get, within the ISA cap); false where the core
 * is unknown or OpenBLAS cannot be loaded. Loads OpenBLAS. */
bool accel__openblas_core_below(void);

/* "BLAS core: <name>[ (why, and the remedy)]" into buf (truncated to
 * size), e.g. "Prescott (below this CPU: OpenBLAS does not know it; its
 * AVX-512 kernels run with OPENBLAS_CORETYPE=SkylakeX)". Returns buf. */
const char *accel__openblas_core_describe(char *buf, size_t size);

/* Tests: OpenBLAS's core taken to be `name` (NULL: the real one again), so
 * that any CPU kind runs the rule and the words of a fallback core. */
void accel__openblas_test_core(const char *name);

#endif
