/* Attention's tile GEMMs forced onto one provider, so that a test runs each
 * path this machine has whatever it would measure (test_ops_attention_blocked,
 * test_ops_attention_lowp): the measured choice (gemm.h,
 * accel__gemm_tiles_provider) made again with timings that say p is the
 * fastest candidate, in memory only (the cache file is left alone), timed
 * whatever ACCEL_GEMM_MEASURE says (=0, from the user's environment, timed
 * nothing: the forced runs failed on the rule's provider). In
 * ACCEL_GEMM=openblas|dnnl the mode decides instead, as it does for every
 * GEMM. */
#ifndef ACCEL_TESTS_SDPA_TILES_H
#define ACCEL_TESTS_SDPA_TILES_H

#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"

static int g_sdpa_forced;
static char g_sdpa_cache[1024], g_sdpa_measure[64];
static bool g_sdpa_had_cache, g_sdpa_had_measure;

static double sdpa_tiles_time(void *ctx, accel__gemm_provider p, const accel__gemm_class *c) {
    (void)c;
    return (int)p == *(const int *)ctx ? 0.1 : 1.0;
}

/* Whether the tiles are chosen by measurement in this run (auto mode). */
static inline bool sdpa_tiles_measured(void) {
    const char *m = getenv("ACCEL_GEMM");
    return !m || !strcmp(m, "auto");
}

static inline void sdpa_tiles_force(int p) {
    const char *c = getenv("ACCEL_GEMM_CACHE");
    g_sdpa_had_cache = c != NULL;
    snprintf(g_sdpa_cache, sizeof g_sdpa_cache, "%s", c ? c : "");
    setenv("ACCEL_GEMM_CACHE", "off", 1);
    const char *m = getenv("ACCEL_GEMM_MEASURE");
    g_sdpa_had_measure = m != NULL;
    snprintf(g_sdpa_measure, sizeof g_sdpa_measure, "%s", m ? m : "");
    unsetenv("ACCEL_GEMM_MEASURE");
    g_sdpa_forced = p;
    accel__gemm_choice_set_timer(sdpa_tiles_time, &g_sdpa_forced);
    accel__gemm_choice_reset();
}

/* Back to the choices measured for real, the cache and ACCEL_GEMM_MEASURE as they were. */
static inline void sdpa_tiles_unforce(void) {
    if (g_sdpa_had_cache) setenv("ACCEL_GEMM_CACHE", g_sdpa_cache, 1);
    else unsetenv("ACCEL_GEMM_CACHE");
    if (g_sdpa_had_measure) setenv("ACCEL_GEMM_MEASURE", g_sdpa_measure, 1);
    accel__gemm_choice_set_timer(NULL, NULL);
    accel__gemm_choice_reset();
}

#endif
