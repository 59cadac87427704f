/* The f32 GEMM provider chosen by measurement (src/backends/cpu/gemm_choice.c)
 * with fake timings (accel__gemm_choice_set_timer), so nothing here depends
 * on how fast anything runs: the winner is kept, a small shape is never
 * timed, a challenger needs a clear margin (hysteresis), the choices survive
 * in the cache file and are read back without timing, a corrupt file, one
 * of another key and an unwritable directory fall back to measuring, and
 * ACCEL_GEMM_MEASURE=0/1 and ACCEL_GEMM force what they say. */
#include <omp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "backends/cpu/gemm.h"
#include "check.h"

/* The fake timer: seconds per provider, and how often it was asked. */
typedef struct fake {
    double seconds[ACCEL__GEMM_N_PROVIDERS];
    int calls;
} fake;

static double fake_time(void *ctx, accel__gemm_provider p, const accel__gemm_class *c) {
    (void)c;
    fake *f = ctx;
    f->calls++;
    return f->seconds[p];
}

static fake g_fake;
static char g_dir[256];

enum { BIG_M = 2048, BIG_N = 1536, BIG_K = 512 }; /* 2^30.6 multiply-adds: measured */

static int choose_big(void) {
    return accel__gemm_provider_for(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K);
}

/* Starts over with the environment as given (NULL: unset). */
static void restart(const char *cache, const char *measure) {
    if (cache) setenv("ACCEL_GEMM_CACHE", cache, 1);
    else unsetenv("ACCEL_GEMM_CACHE");
    if (measure) setenv("ACCEL_GEMM_MEASURE", measure, 1);
    else unsetenv("ACCEL_GEMM_MEASURE");
    accel__gemm_choice_reset();
    g_fake.calls = 0;
}

static void set_times(double openblas, double dnnl) {
    g_fake.seconds[ACCEL__GEMM_PROVIDER_OPENBLAS] = openblas;
    g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL] = dnnl;
}

/* The cache file of this process's thread count (the only one in g_dir). */
static bool cache_file(char *out, size_t n) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s/gemm-*.json 2>/dev/null | head -1", g_dir);
    FILE *p = popen(cmd, "r");
    out[0] = 0;
    if (p && fgets(out, (int)n, p)) out[strcspn(out, "\n")] = 0;
    if (p) pclose(p);
    return out[0] != 0;
}

static void clear_dir(void) {
    char f[512];
    while (cache_file(f, sizeof f)) CHECK(unlink(f) == 0);
}

static void test_winner_kept(void) {
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.5); /* oneDNN twice as fast */
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK(g_fake.calls == 2); /* each candidate timed once */
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK(g_fake.calls == 2); /* the class's choice, not timed again */
    /* the same class (log2 of each dim) at another size */
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, BIG_M + 100, BIG_N, BIG_K) == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK(g_fake.calls == 2);
    /* another class (transposes) is timed on its own */
    set_times(0.5, 1.0);
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, false, BIG_M, BIG_N, BIG_K) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    CHECK(g_fake.calls == 4);
    /* a small GEMM keeps the rule, untimed */
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 64, 64, 64) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    CHECK(g_fake.calls == 4);
    char buf[2048];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), "GEMM choices: 2 measured, cached in ");
    CHECK_STR_CONTAINS(buf, "float32 NT M~2^11 N~2^10 K~2^9");
    CHECK_STR_CONTAINS(buf, ": dnnl (openblas 1000.000 ms, dnnl 500.000 ms)");
}

/* Noise cannot flip a choice: a challenger within the margin loses. */
static void test_hysteresis(void) {
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.95); /* 5% faster: not enough against the rule's OpenBLAS */
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_OPENBLAS);
    /* measured again (ACCEL_GEMM_MEASURE=1): now oneDNN is 30% faster */
    restart(g_dir, "1");
    set_times(1.0, 0.7);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2);
    /* and again: OpenBLAS 5% faster, oneDNN, the incumbent, stays */
    restart(g_dir, "1");
    set_times(0.95, 1.0);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2);
    /* a clear win switches back */
    restart(g_dir, "1");
    set_times(0.5, 1.0);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_OPENBLAS);
}

/* The file: read back without timing; corrupt, of another key: measured again
 * and rewritten; ACCEL_GEMM_MEASURE=0 never times. */
static void test_cache_file(void) {
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.5);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL);
    char path[512];
    CHECK(cache_file(path, sizeof path));
    restart(g_dir, NULL); /* a new process, as far as the table knows */
    set_times(1.0, 2.0);  /* would pick OpenBLAS if it timed */
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK_MSG(g_fake.calls == 0, "the cached choice was timed again (%d)", g_fake.calls);
    /* corrupt */
    FILE *f = fopen(path, "w");
    CHECK(f && fputs("{\"key\": \"x\", \"choices\": [", f) >= 0 && fclose(f) == 0);
    restart(g_dir, NULL);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_OPENBLAS && g_fake.calls == 2);
    /* rewritten whole: read back */
    restart(g_dir, NULL);
    set_times(2.0, 1.0);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_OPENBLAS && g_fake.calls == 0);
    /* another key (a file copied from another machine or thread count) */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "sed -i 's/\"key\": \"cpu=/\"key\": \"cpu=other /' %s", path);
    CHECK(system(cmd) == 0);
    restart(g_dir, NULL);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2);
    /* a malformed entry */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"provider\": \"dnnl\"/\"provider\": \"cuBLAS\"/' %s", path);
    CHECK(system(cmd) == 0);
    restart(g_dir, NULL);
    set_times(1.0, 0.5);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2);
    /* ACCEL_GEMM_MEASURE=0: the rule for a class not cached, untimed */
    clear_dir();
    restart(g_dir, "0");
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_OPENBLAS && g_fake.calls == 0);
}

/* No cache, or one that cannot be written: measured, kept in memory. */
static void test_cache_off_or_unwritable(void) {
    restart("off", NULL);
    set_times(1.0, 0.5);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2);
    char buf[512];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), "not cached");
    char file[300], below[320];
    snprintf(file, sizeof file, "%s/a-file", g_dir);
    FILE *f = fopen(file, "w");
    CHECK(f && fclose(f) == 0);
    snprintf(below, sizeof below, "%s/sub", file); /* a directory under a regular file */
    restart(below, NULL);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2);
    CHECK(accel_last_status() == ACCEL_OK); /* a warning, no error left behind */
    unlink(file);
}

/* ACCEL_GEMM (here accel__gemm_set_mode) forces a provider: nothing timed. */
static void test_forced_mode(void) {
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.5);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_OPENBLAS) == ACCEL_OK);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_OPENBLAS && g_fake.calls == 0);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
}

/* The real timer picks one of the candidates and the GEMM stays right. */
static void test_real_timer(void) {
    restart("off", NULL);
    accel__gemm_choice_set_timer(NULL, NULL);
    uint32_t both = 1u << ACCEL__GEMM_PROVIDER_OPENBLAS | 1u << ACCEL__GEMM_PROVIDER_DNNL;
    int p = accel__gemm_choose(ACCEL_F32, false, true, 96, 80, 64, ACCEL__GEMM_PROVIDER_OPENBLAS, both, true);
    CHECK(p == ACCEL__GEMM_PROVIDER_OPENBLAS || p == ACCEL__GEMM_PROVIDER_DNNL);
    char buf[1024];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), "float32 NT M~2^6 N~2^6 K~2^6");
    CHECK_STR_CONTAINS(buf, "(openblas ");
    CHECK_STR_CONTAINS(buf, ", dnnl ");
    accel__gemm_choice_set_timer(fake_time, &g_fake);
}

/* A rank of a job (WORLD_SIZE > 1) times nothing: the rule, or the cache. */
static void test_ranks_do_not_time(void) {
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.5);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2); /* the single process */
    setenv("WORLD_SIZE", "2", 1);
    restart(g_dir, NULL);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 0); /* its cache */
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, false, BIG_M, BIG_N, BIG_K) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    CHECK(g_fake.calls == 0); /* not cached: the rule */
    restart(g_dir, "1");
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 0);
    unsetenv("WORLD_SIZE");
}

/* Saved with a checkpoint, restored on load: the resumed run multiplies on
 * the saved choices (never timed again), whatever its cache says. */
static void test_checkpoint_round_trip(void) {
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.5);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL);
    char saved[320], bad[320];
    snprintf(saved, sizeof saved, "%s/ckpt_choices.json", g_dir);
    CHECK(accel__gemm_choices_save(saved) == ACCEL_OK);
    clear_dir(); /* the resumed run's cache knows nothing; it would time OpenBLAS faster */
    restart(g_dir, "1");
    set_times(0.5, 1.0);
    CHECK(accel__gemm_choices_load(saved) == ACCEL_OK);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK_MSG(g_fake.calls == 0, "a restored choice was timed (%d)", g_fake.calls);
    /* no file (a checkpoint from before): nothing changes */
    snprintf(bad, sizeof bad, "%s/none.json", g_dir);
    CHECK(accel__gemm_choices_load(bad) == ACCEL_OK);
    /* a corrupt one is an error naming it */
    FILE *f = fopen(bad, "w");
    CHECK(f && fputs("{\"key\": \"k\", \"choices\": [{\"dtype\": \"float32\"}]}", f) >= 0 && fclose(f) == 0);
    CHECK(accel__gemm_choices_load(bad) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "none.json: not a GEMM choice table (a malformed entry)");
    accel_clear_error();
    unlink(saved);
    unlink(bad);
}

int main(void) {
    if (!accel__gemm_have_dnnl()) {
        fprintf(stderr, "oneDNN not built in: OpenBLAS is the only candidate, nothing to choose\n");
        return 0;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_gemm_choice_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    accel__gemm_choice_set_timer(fake_time, &g_fake);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    RUN(test_winner_kept);
    RUN(test_hysteresis);
    RUN(test_cache_file);
    RUN(test_cache_off_or_unwritable);
    RUN(test_forced_mode);
    RUN(test_real_timer);
    RUN(test_ranks_do_not_time);
    RUN(test_checkpoint_round_trip);
    clear_dir();
    rmdir(g_dir);
    accel__gemm_choice_set_timer(NULL, NULL);
    return check_summary();
}
