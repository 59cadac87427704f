/* OpenBLAS's core against the CPU (src/backends/cpu/openblas_core.h): the
 * names classified, the words `accel env` prints, and the GEMM rule giving
 * a core below the CPU's work to oneDNN, on any CPU kind (the core faked by
 * accel__openblas_test_core; expectations derived from this CPU's level
 * and what oneDNN has here). Timings are injected; none is measured. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/openblas_core.h"
#include "check.h"

/* Core names of OpenBLAS's driver/others/dynamic.c (0.3.21, and
 * SapphireRapids of later ones), some of each level of kernels (the
 * library's own table holds them all), OPENBLAS_CORETYPE's lower case, and
 * names that are no x86-64 core. */
static const struct {
    const char *name;
    int level;
} NAMES[] = {
    {"Katmai", ACCEL__VEC_SSE},      {"Prescott", ACCEL__VEC_SSE},      {"Nehalem", ACCEL__VEC_SSE},
    {"Bobcat", ACCEL__VEC_SSE},      {"Sandybridge", ACCEL__VEC_AVX},   {"Excavator", ACCEL__VEC_AVX},
    {"Haswell", ACCEL__VEC_AVX2},    {"Zen", ACCEL__VEC_AVX2},          {"SkylakeX", ACCEL__VEC_AVX512},
    {"Cooperlake", ACCEL__VEC_AVX512}, {"SapphireRapids", ACCEL__VEC_AVX512},
    {"prescott", ACCEL__VEC_SSE}, /* OPENBLAS_CORETYPE's case */
    {"Unknown", -1},                 {"ARMV8", -1},                     {"NEOVERSEN1", -1},
    {NULL, -1},
};
enum { N_NAMES = sizeof NAMES / sizeof NAMES[0] };

/* oneDNN's f32 matmul is here (built in, its plug-in loaded). */
static bool dnnl_f32(void) {
    char impl[256];
    return accel__gemm_have_dnnl() && accel__dnnl_supports(ACCEL_F32, impl, sizeof impl);
}

/* The classification: every name x every CPU level, as a fallback core is
 * decided (below: a known core whose level is under the CPU's). */
static void test_classification(void) {
    for (int i = 0; i < N_NAMES; i++)
        CHECK_MSG(accel__openblas_core_level(NAMES[i].name) == NAMES[i].level, "%s: %d, expected %d",
                  NAMES[i].name ? NAMES[i].name : "NULL", accel__openblas_core_level(NAMES[i].name), NAMES[i].level);
    /* the suggested core of each level is of that level, and one
     * OPENBLAS_CORETYPE of 0.3.21 accepts (its force_coretype stops at SkylakeX) */
    for (int l = ACCEL__VEC_SSE; l <= ACCEL__VEC_AVX512; l++) {
        const char *c = accel__openblas_core_for((accel__cpu_vector_level)l);
        CHECK(c && accel__openblas_core_level(c) == l);
        CHECK(strcmp(c, "Cooperlake") && strcmp(c, "SapphireRapids"));
    }
    CHECK(!strcmp(accel__openblas_core_for(ACCEL__VEC_AVX512), "SkylakeX"));
    CHECK(!strcmp(accel__openblas_core_for(ACCEL__VEC_AVX2), "Haswell"));
    CHECK(!strcmp(accel__openblas_core_for(ACCEL__VEC_AVX), "Sandybridge"));
    int cpu = (int)accel__cpu_vector_level_get();
    for (int i = 0; i < N_NAMES; i++) {
        accel__openblas_test_core(NAMES[i].name);
        if (!NAMES[i].name) continue; /* NULL is the real core again */
        bool want = NAMES[i].level >= 0 && NAMES[i].level < cpu;
        CHECK_MSG(accel__openblas_core_below() == want, "%s on a CPU of level %d", NAMES[i].name, cpu);
    }
    accel__openblas_test_core(NULL);
}

/* `accel env`'s line for a fallback core, this CPU's own, one accel does
 * not know, a core the user forced, and an OPENBLAS_CORETYPE OpenBLAS did
 * not take (empty, a trailing space, no core's name: OpenBLAS warns "Core
 * not found" and picks one itself; the line said "OPENBLAS_CORETYPE set"). */
static void test_describe(void) {
    char buf[512];
    accel__cpu_vector_level cpu = accel__cpu_vector_level_get();
    const char *own = accel__openblas_core_for(cpu);
    unsetenv("OPENBLAS_CORETYPE"); /* read by the words only: OpenBLAS is loaded already or not at all */
    accel__openblas_test_core(own);
    CHECK_STR_CONTAINS(accel__openblas_core_describe(buf, sizeof buf), "as this CPU");
    accel__openblas_test_core("NEOVERSEN1");
    CHECK_STR_CONTAINS(accel__openblas_core_describe(buf, sizeof buf),
                       "BLAS core: NEOVERSEN1 (a core accel does not classify)");
    if (cpu > ACCEL__VEC_SSE) {
        accel__openblas_test_core("Prescott");
        char want[160];
        snprintf(want, sizeof want, "kernels run with OPENBLAS_CORETYPE=%s)", own);
        accel__openblas_core_describe(buf, sizeof buf);
        CHECK_STR_CONTAINS(buf, "BLAS core: Prescott (SSE kernels, below this CPU's");
        CHECK_STR_CONTAINS(buf, "OpenBLAS does not know this CPU");
        CHECK_STR_CONTAINS(buf, want);
        setenv("OPENBLAS_CORETYPE", "prescott", 1);
        accel__openblas_core_describe(buf, sizeof buf);
        CHECK_STR_CONTAINS(buf, "OPENBLAS_CORETYPE=prescott is set;");
        CHECK_STR_CONTAINS(buf, want);
        /* a name OpenBLAS did not take (its core is another): not said to be in force */
        const char *ignored[] = {"SkylakeX ", "", "Bogus"};
        for (int i = 0; i < 3; i++) {
            setenv("OPENBLAS_CORETYPE", ignored[i], 1);
            char said[120];
            snprintf(said, sizeof said, "OPENBLAS_CORETYPE=\"%s\" is set but not taken", ignored[i]);
            CHECK_STR_CONTAINS(accel__openblas_core_describe(buf, sizeof buf), said);
            CHECK_STR_CONTAINS(buf, want);
        }
        unsetenv("OPENBLAS_CORETYPE");
        char gemm[2048];
        accel__gemm_describe(gemm, sizeof gemm);
        if (dnnl_f32())
            CHECK_STR_CONTAINS(gemm, "OpenBLAS runs a core below this CPU");
    }
    accel__openblas_test_core(own); /* this CPU's own core, another forced (e.g. OpenBLAS's fallback for it) */
    setenv("OPENBLAS_CORETYPE", "Katmai!", 1);
    CHECK_STR_CONTAINS(accel__openblas_core_describe(buf, sizeof buf), "as this CPU; OPENBLAS_CORETYPE=\"Katmai!\" is set "
                                                                       "but not taken");
    unsetenv("OPENBLAS_CORETYPE");
    CHECK(accel__openblas_core_describe(NULL, 4) == NULL);
    accel__openblas_test_core(NULL);
}

/* The fake timer of the measured choice: seconds per provider. */
static double g_seconds[ACCEL__GEMM_N_PROVIDERS];
static int g_calls;

static double fake_time(void *ctx, accel__gemm_provider p, const accel__gemm_class *c) {
    (void)ctx, (void)c;
    g_calls++;
    return g_seconds[p];
}

/* The rule with a fallback core: f32 to oneDNN (a class too small to be
 * timed included), decode's rows to whichever the timer says is faster, in
 * a class of their own rows; with this CPU's own core, OpenBLAS as before. */
static void test_rule_switches(void) {
    bool below_possible = accel__cpu_vector_level_get() > ACCEL__VEC_SSE && dnnl_f32();
    accel__openblas_test_core(accel__openblas_core_for(accel__cpu_vector_level_get()));
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 37, 29, 53) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 1, 512, 512) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    if (!below_possible) {
        fprintf(stderr, "no oneDNN f32 matmul (or an SSE-only level): the rule has nowhere to go\n");
        accel__openblas_test_core(NULL);
        return;
    }
    accel__openblas_test_core("Prescott");
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 37, 29, 53) == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK(accel__gemm_provider_for(ACCEL_F32, true, false, 64, 96, 80) == ACCEL__GEMM_PROVIDER_DNNL);
    /* a small f32 GEMM oneDNN runs by the rule reads the plain weight */
    CHECK(!accel__gemm_weight_has_form(ACCEL_F32, false, true, 64, 512, 512));
    /* decode's rows: timed (the class is below the 2^26 floor), each M its own class */
    accel__gemm_choice_set_timer(fake_time, NULL);
    g_seconds[ACCEL__GEMM_PROVIDER_OPENBLAS] = 1.0, g_seconds[ACCEL__GEMM_PROVIDER_DNNL] = 0.5;
    g_calls = 0;
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 1, 512, 512) == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK(g_calls == 2);
    g_seconds[ACCEL__GEMM_PROVIDER_OPENBLAS] = 0.5, g_seconds[ACCEL__GEMM_PROVIDER_DNNL] = 1.0;
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 3, 512, 512) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 1, 512, 512) == ACCEL__GEMM_PROVIDER_DNNL); /* kept */
    CHECK(g_calls == 4);
    /* M = 2 shares floor(log2) with M = 3 but not its class */
    g_seconds[ACCEL__GEMM_PROVIDER_OPENBLAS] = 1.0, g_seconds[ACCEL__GEMM_PROVIDER_DNNL] = 0.5;
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 2, 512, 512) == ACCEL__GEMM_PROVIDER_DNNL);
    /* 5 rows is no skinny class: the rule, untimed */
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 5, 512, 512) == ACCEL__GEMM_PROVIDER_DNNL && g_calls == 6);
    accel__gemm_class cls[64];
    int n = accel__gemm_choice_classes(omp_get_max_threads(), cls, 64), rows = 0;
    for (int i = 0; i < n; i++) rows |= cls[i].rows ? 1 << cls[i].rows : 0;
    CHECK(rows == (1 << 1 | 1 << 2 | 1 << 3));
    static char text[8192];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(text, sizeof text), "float32 NT M=3 N~2^9 K~2^9");
    /* attention's tiles: oneDNN (f32) and oneDNN on f32 tiles (bf16) are the
     * incumbents (bf16: oneDNN in bf16 or on f32 tiles, never OpenBLAS),
     * kept where nothing wins by the margin */
    for (int p = 0; p < ACCEL__GEMM_N_PROVIDERS; p++) g_seconds[p] = 1.0;
    CHECK(accel__gemm_tiles_provider(ACCEL_F32, 64, 256, 64, false, NULL, NULL) == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK(accel__gemm_tiles_provider(ACCEL_BF16, 64, 256, 64, false, NULL, NULL) != ACCEL__GEMM_PROVIDER_OPENBLAS);
    /* f16 where oneDNN has no f16 matmul: oneDNN on f32 panels widened per
     * call (ACCEL_GEMM=dnnl's path there), every M */
    char impl[256];
    if (!accel__dnnl_supports(ACCEL_F16, impl, sizeof impl)) {
        CHECK(accel__gemm_provider_for(ACCEL_F16, false, true, 37, 29, 53) == ACCEL__GEMM_PROVIDER_DNNL);
        CHECK(accel__gemm_provider_for(ACCEL_F16, false, true, 1, 29, 53) == ACCEL__GEMM_PROVIDER_DNNL);
        CHECK(accel__gemm_native(ACCEL_F16) && accel__gemm_widens_per_call(ACCEL_F16));
        char gemm[2048];
        CHECK_STR_CONTAINS(accel__gemm_describe(gemm, sizeof gemm), "GEMM f16: dnnl on f32 operands widened per call");
    }
    accel__gemm_choice_set_timer(NULL, NULL);
    accel__openblas_test_core(NULL);
}

/* The paths the fallback core's rule takes against the reference loop:
 * f32 of 1-4 rows (both measured winners) and more, f16 operands. */
static void test_results(void) {
    accel__openblas_test_core("Prescott");
    accel__gemm_choice_set_timer(fake_time, NULL);
    enum { N = 29, K = 53, MMAX = 37 };
    static float A[MMAX * K], B[N * K], C[MMAX * N], R[MMAX * N];
    static uint16_t Ah[MMAX * K], Bh[N * K];
    for (int i = 0; i < MMAX * K; i++) A[i] = (float)((i * 7) % 13 - 6) / 8.0f;
    for (int i = 0; i < N * K; i++) B[i] = (float)((i * 5) % 11 - 5) / 4.0f;
    accel__cpu_convert(Ah, ACCEL_F16, A, ACCEL_F32, MMAX * K); /* exact: eighths */
    accel__cpu_convert(Bh, ACCEL_F16, B, ACCEL_F32, N * K);
    static const int MS[] = {1, 2, 3, 4, MMAX};
    for (int w = 0; w < 2; w++) {
        g_seconds[ACCEL__GEMM_PROVIDER_OPENBLAS] = w ? 0.5 : 1.0, g_seconds[ACCEL__GEMM_PROVIDER_DNNL] = w ? 1.0 : 0.5;
        accel__gemm_choice_reset();
        for (size_t t = 0; t < sizeof MS / sizeof MS[0]; t++) {
            int M = MS[t];
            accel__sgemm_ref(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, R, N);
            CHECK(accel__gemm(false, true, M, N, K, 1.0f, A, ACCEL_F32, K, B, ACCEL_F32, K, 0.0f, C, N) == ACCEL_OK);
            for (int i = 0; i < M * N; i++) CHECK_MSG(fabsf(C[i] - R[i]) <= 1e-4f, "f32 M=%d [%d]", M, i);
            CHECK(accel__gemm(false, true, M, N, K, 1.0f, Ah, ACCEL_F16, K, Bh, ACCEL_F16, K, 0.0f, C, N) == ACCEL_OK);
            for (int i = 0; i < M * N; i++) CHECK_MSG(fabsf(C[i] - R[i]) <= 1e-4f, "f16 M=%d [%d]", M, i);
        }
    }
    accel__gemm_choice_set_timer(NULL, NULL);
    accel__openblas_test_core(NULL);
}

int main(void) {
    setenv("ACCEL_GEMM_CACHE", "off", 1); /* the injected timings stay in this process */
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    RUN(test_classification);
    RUN(test_describe);
    RUN(test_rule_switches);
    RUN(test_results);
    accel_thread_cleanup();
    return check_summary();
}
