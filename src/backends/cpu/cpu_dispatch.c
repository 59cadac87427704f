/* The kernels of cpu_variants.h as callers see them: each one calls the same
 * kernel of the variant in use (core/cpuinfo.c chooses it at the first call:
 * one atomic load and one indirect call per kernel call, which works on a
 * whole row or tensor). */
#include "backends/cpu/cpu_variants.h"
#include "core/cpuinfo.h"

/* One variant's kernels. */
typedef struct kernel_table {
#define FIELD(name, params, args) __typeof__(name) *name;
    ACCEL__CPU_VARIANT_KERNELS(FIELD)
#undef FIELD
} kernel_table;

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
/* The symbols of variant SUFFIX, and its table. */
#define DECLARE(name, params, args) extern __typeof__(name) CAT(name, SUFFIX);
#define ENTRY(name, params, args) .name = CAT(name, SUFFIX),

#define SUFFIX _baseline
ACCEL__CPU_VARIANT_KERNELS(DECLARE)
static const kernel_table BASELINE = {ACCEL__CPU_VARIANT_KERNELS(ENTRY)};
#undef SUFFIX

#ifdef ACCEL_CPU_VARIANT_AVX2
#define SUFFIX _avx2
ACCEL__CPU_VARIANT_KERNELS(DECLARE)
static const kernel_table AVX2 = {ACCEL__CPU_VARIANT_KERNELS(ENTRY)};
#undef SUFFIX
#endif

#ifdef ACCEL_CPU_VARIANT_AVX512
#define SUFFIX _avx512
ACCEL__CPU_VARIANT_KERNELS(DECLARE)
static const kernel_table AVX512 = {ACCEL__CPU_VARIANT_KERNELS(ENTRY)};
#undef SUFFIX
#endif

/* NULL: not compiled (never chosen: accel__cpu_variant_runnable is false). */
static const kernel_table *const TABLES[ACCEL__CPU_N_VARIANTS] = {
    [ACCEL__CPU_BASELINE] = &BASELINE,
#ifdef ACCEL_CPU_VARIANT_AVX2
    [ACCEL__CPU_AVX2] = &AVX2,
#endif
#ifdef ACCEL_CPU_VARIANT_AVX512
    [ACCEL__CPU_AVX512] = &AVX512,
#endif
};

#define DISPATCH(name, params, args) \
    void name params { TABLES[accel__cpu_variant_current()]->name args; }
ACCEL__CPU_VARIANT_KERNELS(DISPATCH)
