/* OpenBLAS's core against the CPU's vector level (openblas_core.h). */
#include "backends/cpu/openblas_core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "backends/cpu/openblas_lazy.h"

/* OpenBLAS's x86-64 cores (the names gotoblas_corename gives, 0.3.21 and
 * later) by the widest vector instructions their GEMM kernels use. The
 * Bulldozer family's kernels are AVX with FMA4/FMA3 on 128-bit units, no
 * AVX2; Cooperlake and SapphireRapids run SkylakeX's kernels. */
typedef struct core_level {
    const char *name;
    accel__cpu_vector_level level;
} core_level;

static const core_level CORES[] = {
    {"Katmai", ACCEL__VEC_SSE},        {"Coppermine", ACCEL__VEC_SSE},     {"Northwood", ACCEL__VEC_SSE},
    {"Prescott", ACCEL__VEC_SSE},      {"Banias", ACCEL__VEC_SSE},         {"Atom", ACCEL__VEC_SSE},
    {"Core2", ACCEL__VEC_SSE},         {"Penryn", ACCEL__VEC_SSE},         {"Dunnington", ACCEL__VEC_SSE},
    {"Nehalem", ACCEL__VEC_SSE},       {"Athlon", ACCEL__VEC_SSE},         {"Opteron", ACCEL__VEC_SSE},
    {"Opteron_SSE3", ACCEL__VEC_SSE},  {"Barcelona", ACCEL__VEC_SSE},      {"Nano", ACCEL__VEC_SSE},
    {"Bobcat", ACCEL__VEC_SSE},        {"Sandybridge", ACCEL__VEC_AVX},    {"Bulldozer", ACCEL__VEC_AVX},
    {"Piledriver", ACCEL__VEC_AVX},    {"Steamroller", ACCEL__VEC_AVX},    {"Excavator", ACCEL__VEC_AVX},
    {"Haswell", ACCEL__VEC_AVX2},      {"Zen", ACCEL__VEC_AVX2},           {"SkylakeX", ACCEL__VEC_AVX512},
    {"Cooperlake", ACCEL__VEC_AVX512}, {"SapphireRapids", ACCEL__VEC_AVX512},
};

static const char *const LEVEL_NAMES[] = {"SSE", "AVX", "AVX2", "AVX-512"};

int accel__openblas_core_level(const char *name) {
    for (size_t i = 0; name && i < sizeof CORES / sizeof CORES[0]; i++)
        if (!strcasecmp(name, CORES[i].name)) return (int)CORES[i].level;
    return -1;
}

const char *accel__openblas_core_for(accel__cpu_vector_level l) {
    return l == ACCEL__VEC_AVX512 ? "SkylakeX"
           : l == ACCEL__VEC_AVX2 ? "Haswell"
           : l == ACCEL__VEC_AVX  ? "Sandybridge"
                                  : "Prescott";
}

static _Atomic(const char *) g_test_core;

void accel__openblas_test_core(const char *name) { g_test_core = name; }

/* The core in use: the test's, else OpenBLAS's (NULL when unknown). */
static const char *core_name(void) {
    const char *t = g_test_core;
    return t ? t : accel__openblas_corename();
}

bool accel__openblas_core_below(void) {
    int level = accel__openblas_core_level(core_name());
    return level >= 0 && level < (int)accel__cpu_vector_level_get();
}

const char *accel__openblas_core_describe(char *buf, size_t size) {
    if (!buf || !size) return buf;
    const char *name = core_name(), *forced = getenv("OPENBLAS_CORETYPE");
    if (!name) {
        snprintf(buf, size, "BLAS core: unknown (%s)",
                 accel__openblas_unavailable() ? "OpenBLAS cannot be loaded" : "this OpenBLAS does not name it");
        return buf;
    }
    int level = accel__openblas_core_level(name);
    accel__cpu_vector_level cpu = accel__cpu_vector_level_get();
    const char *best = accel__openblas_core_for(cpu);
    /* OPENBLAS_CORETYPE as OpenBLAS read it: any value set counts, empty
     * included; one that is not the core running (case aside: OpenBLAS's
     * own compare) was not taken, e.g. "SkylakeX " or a core the build lacks */
    char how[200] = "";
    if (forced && strcasecmp(forced, name))
        snprintf(how, sizeof how, "OPENBLAS_CORETYPE=\"%.40s\" is set but not taken (no core of this OpenBLAS by that "
                                  "name)", forced);
    else if (forced)
        snprintf(how, sizeof how, "OPENBLAS_CORETYPE=%s is set", forced);
    if (level < 0)
        snprintf(buf, size, "BLAS core: %s (a core accel does not classify%s%s)", name, *how ? "; " : "", how);
    else if (level >= (int)cpu)
        snprintf(buf, size, "BLAS core: %s (%s kernels, as this CPU%s%s)", name, LEVEL_NAMES[level], *how ? "; " : "",
                 how);
    else
        snprintf(buf, size, "BLAS core: %s (%s kernels, below this CPU's %s: %s; its %s kernels run with "
                            "OPENBLAS_CORETYPE=%s)",
                 name, LEVEL_NAMES[level], LEVEL_NAMES[cpu], *how ? how : "OpenBLAS does not know this CPU",
                 LEVEL_NAMES[cpu], best);
    return buf;
}
