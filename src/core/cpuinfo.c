/* The CPU: model and usable instruction sets (cpuid, xgetbv, the Linux AMX
 * permission), and the choice of the CPU kernel variant. */
#include "core/cpuinfo.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ACCEL__X86 1
#endif

static const char *const FEATURE_NAMES[] = {
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_fp16", "f16c",
};
#define N_FEATURES (int)(sizeof FEATURE_NAMES / sizeof FEATURE_NAMES[0])

#ifdef ACCEL__X86

/* XCR0 bits: the register state the OS saves on a context switch. Without it
 * the CPU's feature bits are not usable (the instructions fault). */
#define XCR0_YMM 0x6ull                     /* SSE + AVX upper halves */
#define XCR0_ZMM 0xe6ull                    /* + opmask, ZMM0-15 upper, ZMM16-31 */
#define XCR0_TILE ((1ull << 17) | (1ull << 18)) /* XTILECFG + XTILEDATA */

/* Linux >= 5.16: AMX tile data is off until the process asks for it. */
#define ARCH_REQ_XCOMP_PERM_ 0x1023
#define XFEATURE_XTILEDATA_ 18

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static bool bit(unsigned reg, int b) { return (reg >> b) & 1u; }

static bool amx_permission_granted(void) {
#ifdef SYS_arch_prctl
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) == 0;
#else
    return false;
#endif
}

/* r = eax, ebx, ecx, edx of cpuid(leaf, subleaf). */
static void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) { __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]); }

/* Usable AVX, and AVX-512 CD + DQ, which accel's kernels do not use (so no
 * accel_cpu_feature names them) but accel__cpu_vector_level_get needs. */
static bool g_avx, g_avx512_cd_dq;

static uint32_t detect_features(void) {
    enum { A, B, C, D };
    unsigned max = (unsigned)__get_cpuid_max(0, NULL), l1[4], l7[4] = {0}, l71[4] = {0};
    if (max < 1) return 0;
    cpuid(1, 0, l1);
    if (max >= 7) cpuid(7, 0, l7);
    if (max >= 7 && l7[A] >= 1) cpuid(7, 1, l71);
    bool osxsave = bit(l1[C], 27), avx = bit(l1[C], 28);
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    bool ymm = avx && (xcr0 & XCR0_YMM) == XCR0_YMM, zmm = ymm && (xcr0 & XCR0_ZMM) == XCR0_ZMM;
    bool tile = (xcr0 & XCR0_TILE) == XCR0_TILE;
    uint32_t f = 0;
    g_avx = ymm;
    g_avx512_cd_dq = zmm && bit(l7[B], 28) && bit(l7[B], 17);
    if (ymm && bit(l1[C], 12)) f |= ACCEL_CPU_FMA;
    if (ymm && bit(l1[C], 29)) f |= ACCEL_CPU_F16C;
    if (ymm && bit(l7[B], 5)) f |= ACCEL_CPU_AVX2;
    if (zmm && bit(l7[B], 16)) f |= ACCEL_CPU_AVX512F;
    if (zmm && bit(l7[B], 30)) f |= ACCEL_CPU_AVX512BW;
    if (zmm && bit(l7[B], 31)) f |= ACCEL_CPU_AVX512VL;
    if (zmm && bit(l71[A], 5)) f |= ACCEL_CPU_AVX512_BF16;
    if (zmm && bit(l7[D], 23)) f |= ACCEL_CPU_AVX512_FP16;
    if (tile && bit(l7[D], 24) && amx_permission_granted()) {
        f |= ACCEL_CPU_AMX_TILE;
        if (bit(l7[D], 22)) f |= ACCEL_CPU_AMX_BF16;
        if (bit(l71[A], 21)) f |= ACCEL_CPU_AMX_FP16;
    }
    return f;
}

/* The 48-byte brand string of leaves 0x80000002..4, without its padding. */
static void detect_model(char *out, size_t n) {
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) < 0x80000004u) return;
    unsigned r[12];
    for (unsigned i = 0; i < 3; i++) cpuid(0x80000002u + i, 0, r + 4 * i);
    char brand[49];
    memcpy(brand, r, 48);
    brand[48] = 0;
    const char *s = brand + strspn(brand, " ");
    size_t len = strlen(s);
    while (len > 0 && s[len - 1] == ' ') len--;
    if (len > 0) snprintf(out, n, "%.*s", (int)len, s);
}

/* Leaf 1's family, model and stepping, decoded as the kernel does for
 * /proc/cpuinfo: the extended family adds to family 15, the extended model
 * is the model's high nibble from family 6 on. */
static void detect_signature(accel_cpu_info *ci) {
    if ((unsigned)__get_cpuid_max(0, NULL) < 1) return;
    unsigned r[4];
    cpuid(1, 0, r);
    unsigned family = (r[0] >> 8) & 0xf, model = (r[0] >> 4) & 0xf;
    if (family == 0xf) family += (r[0] >> 20) & 0xff;
    if (family >= 6) model |= ((r[0] >> 16) & 0xf) << 4;
    ci->family = family, ci->model_number = model, ci->stepping = r[0] & 0xf;
}

#else

static bool g_avx, g_avx512_cd_dq;
static uint32_t detect_features(void) { return 0; }
static void detect_model(char *out, size_t n) { (void)out, (void)n; }
static void detect_signature(accel_cpu_info *ci) { (void)ci; }

#endif

static accel_cpu_info g_info;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The names of the features in f, space-separated, or "none", into buf. */
static const char *feature_names(uint32_t f, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < N_FEATURES; i++) {
        if (!(f & (1u << i)) || used >= size) continue;
        int w = snprintf(buf + used, size - used, "%s%s", used ? " " : "", FEATURE_NAMES[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    if (!f) snprintf(buf, size, "none");
    return buf;
}

/* ---- the ISA cap (ACCEL_CPU_ISA) */

/* What a level keeps of the CPU's features, and what it needs of them. */
typedef struct isa_level {
    const char *name;
    accel__cpu_isa_level level;
    uint32_t keeps, needs;
} isa_level;

#define AVX2_SET (ACCEL_CPU_AVX2 | ACCEL_CPU_FMA | ACCEL_CPU_F16C)
#define AVX512_SET (AVX2_SET | ACCEL_CPU_AVX512F | ACCEL_CPU_AVX512BW | ACCEL_CPU_AVX512VL)

static const isa_level ISA_LEVELS[] = {
    {"baseline", ACCEL__CPU_ISA_BASELINE, 0, 0},
    {"avx2", ACCEL__CPU_ISA_AVX2, AVX2_SET, AVX2_SET},
    /* AVX-512 with its bf16 / fp16 extensions where the CPU has them; no AMX */
    {"avx512", ACCEL__CPU_ISA_AVX512, AVX512_SET | ACCEL_CPU_AVX512_BF16 | ACCEL_CPU_AVX512_FP16, AVX512_SET},
};
enum { N_ISA_LEVELS = sizeof ISA_LEVELS / sizeof ISA_LEVELS[0] };

static int g_cap = ACCEL__CPU_ISA_NONE; /* the level in force */
static char g_cap_error[400];           /* why ACCEL_CPU_ISA was refused; "" when it was not */

/* Applies ACCEL_CPU_ISA to the detected features f (uncapped when it is
 * unset, or refused: then g_cap_error says why). Set but empty is refused,
 * as every variable of core/env.h (it was read as unset, where ACCEL_GEMM=
 * and ACCEL_CONV= are refused). */
static uint32_t apply_cap(uint32_t f) {
    const char *v = getenv("ACCEL_CPU_ISA");
    if (!v) return f;
    for (int i = 0; i < N_ISA_LEVELS; i++) {
        const isa_level *l = &ISA_LEVELS[i];
        if (strcmp(v, l->name)) continue;
        if ((f & l->needs) != l->needs) {
            char isa[256];
            feature_names(f, isa, sizeof isa);
            snprintf(g_cap_error, sizeof g_cap_error,
                     "ACCEL_CPU_ISA=%.40s: this CPU does not have %s (it offers: %s); the cap can only lower the level",
                     v, l->name, isa);
            return f;
        }
        g_cap = l->level;
        return f & l->keeps;
    }
    snprintf(g_cap_error, sizeof g_cap_error, "ACCEL_CPU_ISA=%.40s: expected baseline, avx2 or avx512", v);
    return f;
}

static void detect(void) {
    snprintf(g_info.model, sizeof g_info.model, "unknown");
    detect_model(g_info.model, sizeof g_info.model);
    detect_signature(&g_info);
    g_info.features = apply_cap(detect_features());
}

accel__cpu_isa_level accel__cpu_isa_cap(void) {
    pthread_once(&g_once, detect);
    return (accel__cpu_isa_level)g_cap;
}

const char *accel__cpu_isa_cap_name(accel__cpu_isa_level level) {
    for (int i = 0; i < N_ISA_LEVELS; i++)
        if (ISA_LEVELS[i].level == level) return ISA_LEVELS[i].name;
    return "none";
}

accel_status accel__cpu_isa_check(void) {
    pthread_once(&g_once, detect);
    if (!g_cap_error[0]) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s", g_cap_error);
}

const accel_cpu_info *accel_cpu_info_get(void) {
    pthread_once(&g_once, detect);
    return &g_info;
}

accel__cpu_vector_level accel__cpu_vector_level_get(void) {
    uint32_t f = accel_cpu_info_get()->features; /* capped */
    uint32_t avx512 = ACCEL_CPU_AVX512F | ACCEL_CPU_AVX512BW | ACCEL_CPU_AVX512VL, avx2 = ACCEL_CPU_AVX2 | ACCEL_CPU_FMA;
    if ((f & avx512) == avx512 && g_avx512_cd_dq) return ACCEL__VEC_AVX512;
    if ((f & avx2) == avx2) return ACCEL__VEC_AVX2;
    /* plain AVX is no level of the cap: any cap leaves SSE */
    if (g_avx && g_cap == ACCEL__CPU_ISA_NONE) return ACCEL__VEC_AVX;
    return ACCEL__VEC_SSE;
}

static bool buf_ok(const char *fn, char *buf, size_t size) {
    if (buf && size) return true;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: buf is NULL or size is 0", fn);
    return false;
}

const char *accel_cpu_isa_string(char *buf, size_t size) {
    if (!buf_ok(__func__, buf, size)) return NULL;
    return feature_names(accel_cpu_info_get()->features, buf, size);
}

/* ---- kernel variants */

/* Features a variant's compile flags let the compiler use. */
static const uint32_t VARIANT_NEEDS[ACCEL__CPU_N_VARIANTS] = {
    [ACCEL__CPU_BASELINE] = 0,
    [ACCEL__CPU_AVX2] = ACCEL_CPU_AVX2 | ACCEL_CPU_FMA | ACCEL_CPU_F16C,
    [ACCEL__CPU_AVX512] = ACCEL_CPU_AVX2 | ACCEL_CPU_FMA | ACCEL_CPU_F16C | ACCEL_CPU_AVX512F | ACCEL_CPU_AVX512BW |
                          ACCEL_CPU_AVX512VL,
};

static bool variant_compiled(accel__cpu_variant v) {
    switch ((int)v) {
    case ACCEL__CPU_BASELINE: return true;
#ifdef ACCEL_CPU_VARIANT_AVX2
    case ACCEL__CPU_AVX2: return true;
#endif
#ifdef ACCEL_CPU_VARIANT_AVX512
    case ACCEL__CPU_AVX512: return true;
#endif
    default: return false;
    }
}

const char *accel__cpu_variant_name(accel__cpu_variant v) {
    switch ((int)v) {
#ifdef ACCEL_CPU_NATIVE
    case ACCEL__CPU_BASELINE: return "native";
#else
    case ACCEL__CPU_BASELINE: return "baseline";
#endif
    case ACCEL__CPU_AVX2: return "avx2";
    case ACCEL__CPU_AVX512: return "avx512";
    default: return "invalid";
    }
}

bool accel__cpu_variant_runnable(accel__cpu_variant v) {
    if (!variant_compiled(v)) return false;
    return (accel_cpu_info_get()->features & VARIANT_NEEDS[v]) == VARIANT_NEEDS[v];
}

static _Atomic int g_variant = -1; /* -1: not chosen yet */

accel__cpu_variant accel__cpu_variant_current(void) {
    int v = atomic_load_explicit(&g_variant, memory_order_relaxed);
    if (v >= 0) return (accel__cpu_variant)v;
    int best = ACCEL__CPU_BASELINE;
    for (int i = ACCEL__CPU_N_VARIANTS - 1; i > ACCEL__CPU_BASELINE; i--)
        if (accel__cpu_variant_runnable((accel__cpu_variant)i)) {
            best = i;
            break;
        }
    /* Racing first calls all compute the same choice; a variant set by
     * accel__cpu_variant_use in between wins. */
    int expected = -1;
    if (!atomic_compare_exchange_strong(&g_variant, &expected, best)) best = expected;
    return (accel__cpu_variant)best;
}

accel_status accel__cpu_variant_use(accel__cpu_variant v) {
    if (!accel__cpu_variant_runnable(v)) {
        char isa[256];
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "CPU kernel variant %s (%d) is not %s (this CPU offers: %s)",
                               accel__cpu_variant_name(v), (int)v,
                               variant_compiled(v) ? "runnable here"
                                   : "compiled into this build",
                               accel_cpu_isa_string(isa, sizeof isa));
    }
    atomic_store(&g_variant, (int)v);
    return ACCEL_OK;
}

const char *accel_cpu_kernels(void) { return accel__cpu_variant_name(accel__cpu_variant_current()); }

const char *accel__cpu_name(char *buf, size_t size) {
    const accel_cpu_info *ci = accel_cpu_info_get();
    if (ci->family) snprintf(buf, size, "%s (family %u model %u stepping %u)", ci->model, ci->family,
                             ci->model_number, ci->stepping);
    else snprintf(buf, size, "%s", ci->model);
    return buf;
}

const char *accel_cpu_describe(char *buf, size_t size) {
    if (!buf_ok(__func__, buf, size)) return NULL;
    char isa[256], cpu[160];
    snprintf(buf, size, "CPU: %s\nISA: %s\nCPU kernels: %s\n", accel__cpu_name(cpu, sizeof cpu),
             accel_cpu_isa_string(isa, sizeof isa), accel_cpu_kernels());
    return buf;
}
