/*
 * accel/cpu.h — the CPU this process runs on: model, instruction sets, and
 * which variant of the CPU kernels accel chose for it.
 *
 * The library is built portably (x86-64 baseline); its hot CPU kernels are
 * compiled once more per instruction-set level (AVX2+FMA, AVX-512) and the
 * best level this CPU *and* its operating system allow is chosen at the first
 * kernel call. A feature counts only when it is usable by this process: the
 * CPU reports it (cpuid), the OS saves its registers (XCR0, read by xgetbv:
 * YMM state for AVX2, opmask/ZMM state for AVX-512, tile state for AMX), and,
 * for AMX, Linux granted the process the tile data permission
 * (arch_prctl(ARCH_REQ_XCOMP_PERM), requested once at detection).
 *
 * ACCEL_CPU_ISA=baseline|avx2|avx512 in the environment caps what this
 * process sees (docs/cpu.md): the features reported here, the kernel variant
 * and accel's GEMM providers then follow that level; a level the CPU lacks
 * is refused (every GEMM fails naming the variable, the features stay the
 * CPU's).
 *
 * Detection runs once, at the first call of any function here; all are
 * thread-safe.
 */
#ifndef ACCEL_CPU_H
#define ACCEL_CPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bits of accel_cpu_info.features, named as in /proc/cpuinfo. */
typedef enum accel_cpu_feature {
    ACCEL_CPU_AVX2 = 1u << 0,
    ACCEL_CPU_FMA = 1u << 1,
    ACCEL_CPU_AVX512F = 1u << 2,
    ACCEL_CPU_AVX512BW = 1u << 3,
    ACCEL_CPU_AVX512VL = 1u << 4,
    ACCEL_CPU_AVX512_BF16 = 1u << 5,
    ACCEL_CPU_AVX512_FP16 = 1u << 6,
    ACCEL_CPU_AMX_TILE = 1u << 7,
    ACCEL_CPU_AMX_BF16 = 1u << 8,
    ACCEL_CPU_AMX_FP16 = 1u << 9,
    ACCEL_CPU_F16C = 1u << 10, /* f16 <-> f32 conversions (vcvtph2ps, vcvtps2ph) */
} accel_cpu_feature;

typedef struct accel_cpu_info {
    char model[64];    /* cpuid brand string, e.g. "AMD EPYC 7B13"; "unknown" without one */
    uint32_t features; /* accel_cpu_feature bits usable by this process */
    /* cpuid leaf 1's signature, as /proc/cpuinfo's "cpu family", "model" and
     * "stepping" (0 where there is none). Virtual machines often show a brand
     * string without the part number ("AMD EPYC" on Zen 3, 4 and 5 alike):
     * the family and model tell such CPUs apart. */
    unsigned family, model_number, stepping;
} accel_cpu_info;

/* The CPU, detected at the first call. Never NULL; owned by the library. */
const accel_cpu_info *accel_cpu_info_get(void);

/* The names of the usable features, space-separated in the enum's order
 * ("avx2 fma"), or "none", into buf (truncated to size). Returns buf, or
 * NULL (error set) when buf is NULL or size is 0. */
const char *accel_cpu_isa_string(char *buf, size_t size);

/* The CPU kernel variant in use: "baseline" (x86-64 SSE2), "avx2" (AVX2 +
 * FMA), "avx512" (AVX-512 F/BW/VL), or "native" in a library built with
 * -DACCEL_NATIVE=ON (everything compiled for the build machine, no
 * dispatch). Static string. */
const char *accel_cpu_kernels(void);

/* Three lines, "CPU: <model> (family F model M stepping S)\nISA: <features>\nCPU kernels: <variant>\n"
 * (the parenthesis only where cpuid has a signature),
 * into buf (truncated to size). Returns buf, or NULL (error set) when buf is
 * NULL or size is 0. */
const char *accel_cpu_describe(char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_CPU_H */
