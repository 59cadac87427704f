/* accel_set_seed(NULL, seed, device_specific): Accelerate's set_seed(seed)
 * called before any Accelerator exists (ported code does so), which seeds
 * the process all the same, + PartialState's process index (the launcher's
 * rank) when device_specific. It was a no-op: the seeding was lost
 * silently and the first draws came from seed 0. Under tensor parallelism
 * (the environment's tp size) the rank / tp_size, as with an accelerator
 * (the raw rank gave the ranks of a tp group different dropout masks). One
 * process, the rank variables set by hand. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"

static const char *const RANK_VARS[] = {"RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
                                        "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEPID"};

static void clear_rank_vars(void) {
    for (size_t i = 0; i < sizeof RANK_VARS / sizeof *RANK_VARS; i++) unsetenv(RANK_VARS[i]);
}

/* The next three draws of the default generator. */
static void draws(uint64_t out[3]) {
    for (int i = 0; i < 3; i++) out[i] = accel_rng_next_u64(accel_default_rng());
}

/* accel_set_seed(NULL, seed, device_specific) draws what accel_manual_seed(want) does. */
static void seeds_as(uint64_t seed, bool device_specific, uint64_t want, const char *what) {
    uint64_t got[3], ref[3];
    accel_manual_seed(want);
    draws(ref);
    accel_manual_seed(want + 1000); /* elsewhere, so that a no-op shows */
    accel_status st = accel_set_seed(NULL, seed, device_specific);
    draws(got);
    CHECK_MSG(st == ACCEL_OK && !memcmp(got, ref, sizeof got), "%s: status %d, %s", what, (int)st,
              accel_last_error());
}

static void test_no_accelerator(void) {
    clear_rank_vars();
    seeds_as(42, false, 42, "set_seed(NULL, 42, false)");
    seeds_as(42, true, 42, "one process, device_specific");
    setenv("RANK", "3", 1);
    seeds_as(42, true, 45, "RANK=3, device_specific");
    seeds_as(42, false, 42, "RANK=3, not device_specific");
    unsetenv("RANK");
    setenv("PMI_RANK", "2", 1); /* mpirun's, as accel_dist_init reads it */
    seeds_as(42, true, 44, "PMI_RANK=2");
    setenv("RANK", "1", 1); /* RANK first */
    seeds_as(42, true, 43, "RANK=1 beside PMI_RANK=2");
    clear_rank_vars();
    setenv("SLURM_PROCID", "5", 1); /* a batch script's: one process, not srun's task 5 */
    seeds_as(42, true, 42, "SLURM_PROCID=5 outside a step");
    setenv("SLURM_STEP_ID", "0", 1);
    seeds_as(42, true, 47, "SLURM_PROCID=5 in an srun step");
    clear_rank_vars();
}

/* accel_set_seed(NULL, 42, true) under the environment set up: refused, its message naming `names` (the
 * value given: `value`), and the generator as it was. */
static void refused_untouched(const char *names, const char *value) {
    accel_manual_seed(9);
    uint64_t ref[3], got[3];
    draws(ref);
    accel_manual_seed(9);
    accel_status st = accel_set_seed(NULL, 42, true);
    draws(got);
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG && strstr(accel_last_error(), names) && !memcmp(got, ref, sizeof got),
              "'%s': status %d, %s", value, (int)st, accel_last_error());
    accel_clear_error();
}

/* A rank variable that is no rank: refused naming it, the generator as it was. */
static void test_bad_rank(void) {
    static const char *const BAD[] = {"x", "", "-1", " 1", "1e3"};
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        clear_rank_vars();
        setenv("RANK", BAD[i], 1);
        refused_untouched("RANK='", BAD[i]);
        CHECK(accel_set_seed(NULL, 42, false) == ACCEL_OK); /* not device_specific: the rank is not read */
    }
    clear_rank_vars();
}

/* Under tensor parallelism the rank's tp group, rank / tp_size, as accel_set_seed(acc, ...) adds: the ranks of
 * one tp group share the default generator (docs/parallelism.md). The size from the variables that
 * accel_accelerator_new reads; one it refuses is refused here, naming it. */
static void test_tp_size_from_env(void) {
    clear_rank_vars();
    setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true", 1);
    setenv("PARALLELISM_CONFIG_TP_SIZE", "2", 1);
    setenv("RANK", "3", 1);
    seeds_as(42, true, 43, "RANK=3, PARALLELISM_CONFIG_TP_SIZE=2");
    seeds_as(42, false, 42, "RANK=3, PARALLELISM_CONFIG_TP_SIZE=2, not device_specific");
    setenv("PARALLELISM_CONFIG_TP_SIZE", "x", 1);
    refused_untouched("PARALLELISM_CONFIG_TP_SIZE='x'", "x");
    unsetenv("ACCELERATE_USE_PARALLELISM_CONFIG");
    unsetenv("PARALLELISM_CONFIG_TP_SIZE");
    setenv("ACCELERATE_USE_MEGATRON_LM", "true", 1);
    setenv("MEGATRON_LM_TP_DEGREE", "4", 1);
    setenv("RANK", "5", 1);
    seeds_as(42, true, 43, "RANK=5, MEGATRON_LM_TP_DEGREE=4");
    unsetenv("ACCELERATE_USE_MEGATRON_LM");
    unsetenv("MEGATRON_LM_TP_DEGREE");
    seeds_as(42, true, 47, "RANK=5, no tp");
    clear_rank_vars();
}

int main(void) {
    RUN(test_no_accelerator);
    RUN(test_bad_rank);
    RUN(test_tp_size_from_env);
    return check_summary();
}
