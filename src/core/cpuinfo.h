/* The CPU kernel variants and the choice between them (not public API).
 *
 * A variant is one compile of the hot kernel files (src/backends/cpu, see
 * cpu_variants.h there) for an instruction-set level. The build says which
 * were compiled (ACCEL_CPU_VARIANT_AVX2, ACCEL_CPU_VARIANT_AVX512; baseline
 * always); the first kernel call picks the best compiled one whose features
 * the CPU and OS give this process (accel_cpu_info_get). */
#ifndef ACCEL_CORE_CPUINFO_H
#define ACCEL_CORE_CPUINFO_H

#include <stdbool.h>

#include "accel/core.h"
#include "accel/cpu.h"

typedef enum accel__cpu_variant {
    ACCEL__CPU_BASELINE, /* x86-64 (SSE2), or -march=native in an ACCEL_NATIVE build */
    ACCEL__CPU_AVX2,     /* -mavx2 -mfma -mf16c */
    ACCEL__CPU_AVX512,   /* -mavx512f -mavx512bw -mavx512vl (and AVX2, FMA, F16C) */
    ACCEL__CPU_N_VARIANTS,
} accel__cpu_variant;

/* The variant in use: chosen at the first call, then a relaxed atomic load. */
accel__cpu_variant accel__cpu_variant_current(void);
/* Whether v is compiled into this build and this process may run it. */
bool accel__cpu_variant_runnable(accel__cpu_variant v);
/* Makes v the variant in use (tests compare the variants). ACCEL_ERR_UNSUPPORTED
 * (naming v and what it needs) when v is not runnable. Kernels already running
 * finish in the variant they started in. */
accel_status accel__cpu_variant_use(accel__cpu_variant v);
/* "baseline", "avx2", "avx512"; "native" for the baseline of an ACCEL_NATIVE build. */
const char *accel__cpu_variant_name(accel__cpu_variant v);

/* The CPU's name as reports print it: the brand string and, where cpuid has
 * one, its signature ("AMD EPYC (family 25 model 17 stepping 1)"), into buf.
 * Returns buf. */
const char *accel__cpu_name(char *buf, size_t size);

/* The ISA cap: ACCEL_CPU_ISA=baseline|avx2|avx512, read once at detection,
 * makes this process see only the features of that level (avx512: AVX-512
 * F/BW/VL and, where the CPU has them, AVX512-BF16/FP16; no AMX), so the
 * kernel variant, the GEMM providers' choices and oneDNN (capped likewise)
 * follow the paths a CPU of that level takes. A level the CPU lacks, or
 * another value, is refused: the features stay uncapped and
 * accel__cpu_isa_check says why (every GEMM then fails with it). */
typedef enum accel__cpu_isa_level {
    ACCEL__CPU_ISA_NONE = -1, /* no cap */
    ACCEL__CPU_ISA_BASELINE,
    ACCEL__CPU_ISA_AVX2,
    ACCEL__CPU_ISA_AVX512,
} accel__cpu_isa_level;

/* The cap in force (ACCEL__CPU_ISA_NONE without one, or when refused). */
accel__cpu_isa_level accel__cpu_isa_cap(void);
/* "baseline", "avx2", "avx512"; "none" for ACCEL__CPU_ISA_NONE. */
const char *accel__cpu_isa_cap_name(accel__cpu_isa_level level);
/* ACCEL_OK, or ACCEL_ERR_INVALID_ARG naming ACCEL_CPU_ISA, its value and why it was refused. */
accel_status accel__cpu_isa_check(void);

/* The widest x86 vector level this process may use, within the ISA cap, in
 * the steps other libraries' kernels are built for (OpenBLAS's cores:
 * backends/cpu/openblas_core.c): SSE (x86-64's SSE2), AVX (256-bit, no
 * FMA), AVX2 (+ FMA), AVX-512 (F, CD, BW, DQ and VL: Skylake-SP's set). */
typedef enum accel__cpu_vector_level {
    ACCEL__VEC_SSE,
    ACCEL__VEC_AVX,
    ACCEL__VEC_AVX2,
    ACCEL__VEC_AVX512,
} accel__cpu_vector_level;
accel__cpu_vector_level accel__cpu_vector_level_get(void);

#endif
