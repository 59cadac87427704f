/* The GEMM choice file (src/backends/cpu/gemm_choice.c) as an unlucky user
 * or an adversary leaves it: hand-edited (a class given twice, an "op" that
 * is no string, "rows" on an attention tile class, a bundle holding one
 * thread count twice, or 65536 tables), so full that `accel env` lists 256 classes, its
 * directory's name too long to keep, or
 * naming a tile class far beyond any machine's memory that `accel env
 * --measure-gemm` would time. Each is refused naming the problem, or runs
 * without a crash. Fake timings (accel__gemm_choice_set_timer) except
 * where the timing itself is under test. */
#include <glob.h>
#include <jansson.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "check.h"
#include "cli_run.h"
#include "sibling_exe.h"

enum { OB = ACCEL__GEMM_PROVIDER_OPENBLAS, DN = ACCEL__GEMM_PROVIDER_DNNL };

static int g_calls;
static char g_dir[256];

/* OpenBLAS twice as fast as oneDNN: every class keeps the rule's OpenBLAS,
 * so the file names no provider a build without oneDNN lacks. */
static double fake_time(void *ctx, accel__gemm_provider p, const accel__gemm_class *c) {
    (void)ctx, (void)c;
    g_calls++;
    return p == ACCEL__GEMM_PROVIDER_OPENBLAS ? 1.0 : 2.0;
}

static void restart(void) {
    setenv("ACCEL_GEMM_CACHE", g_dir, 1);
    unsetenv("ACCEL_GEMM_MEASURE");
    accel__gemm_choice_reset();
    g_calls = 0;
}

/* The class of 2^a x 2^b x 2^c (NT f32): measured again when `force`
 * (whatever its size), else the table's choice (measured when it has none). */
static int choose_as(int a, int b, int c, bool force) {
    return accel__gemm_choose(ACCEL_F32, false, true, 1ll << a, 1ll << b, 1ll << c, OB, 1u << OB | 1u << DN, force,
                              false);
}
static int choose(int a, int b, int c) { return choose_as(a, b, c, true); }

/* The file of this process's thread count (the only one in g_dir). */
static bool cache_file(char *out, size_t n) {
    char pattern[300];
    glob_t g;
    snprintf(pattern, sizeof pattern, "%s/gemm-*.json", g_dir);
    out[0] = 0;
    if (glob(pattern, 0, NULL, &g) == 0) snprintf(out, n, "%s", g.gl_pathv[0]);
    globfree(&g);
    return out[0] != 0;
}

/* One class in the file and, added by edit, an entry made from it; read
 * back as a new process would: true when the file was refused (the class
 * measured over). */
static bool refused_after(void (*edit)(json_t *choices, json_t *added)) {
    char path[512];
    restart();
    CHECK(choose(11, 10, 9) == OB);
    CHECK(cache_file(path, sizeof path));
    json_t *j = json_load_file(path, 0, NULL), *choices = json_object_get(j, "choices");
    CHECK(j != NULL);
    json_t *added = json_deep_copy(json_array_get(choices, 0));
    edit(choices, added);
    CHECK(json_dump_file(j, path, 0) == 0);
    json_decref(j);
    restart();
    CHECK(choose_as(11, 10, 9, false) == OB);
    unlink(path);
    return g_calls > 0;
}

static void unchanged(json_t *choices, json_t *added) { (void)choices, json_decref(added); }
/* the same class again, naming oneDNN: which entry is meant? */
static void twice(json_t *choices, json_t *added) {
    json_object_set_new(added, "provider", json_string("dnnl"));
    json_array_append_new(choices, added);
}
/* another class whose "op" is a number, no name */
static void op_number(json_t *choices, json_t *added) {
    json_object_set_new(added, "log2_m", json_integer(5));
    json_object_set_new(added, "op", json_integer(1));
    json_array_append_new(choices, added);
}
/* a tile class with a skinny GEMM's "rows" */
static void rows_on_tiles(json_t *choices, json_t *added) {
    json_object_set_new(added, "op", json_string("sdpa_tiles"));
    json_object_set_new(added, "log2_m", json_integer(1));
    json_object_set_new(added, "rows", json_integer(2));
    json_array_append_new(choices, added);
}

static void test_malformed_entries(void) {
    CHECK_MSG(!refused_after(unchanged), "a file as written was measured over");
    CHECK_MSG(refused_after(twice), "a class given twice was read (its first entry taken)");
    CHECK_MSG(refused_after(op_number), "\"op\": 1 was read as a GEMM");
    CHECK_MSG(refused_after(rows_on_tiles), "\"rows\" on an attention tile class was read");
}

/* A bundle (a checkpoint's, rank 0's) holding one thread count's table
 * twice is refused: its two tables could disagree. */
static void test_bundle_thread_count_twice(void) {
    restart();
    CHECK(choose(11, 10, 9) == OB);
    json_t *b = accel__gemm_choices_bundle(false);
    json_t *tables = json_object_get(b, "tables");
    CHECK(json_array_size(tables) == 1);
    json_array_append_new(tables, json_deep_copy(json_array_get(tables, 0)));
    const char *why = accel__gemm_choices_install(b);
    CHECK_MSG(why != NULL, "a bundle with two tables of %d threads was installed", omp_get_max_threads());
    if (why) CHECK_STR_CONTAINS(why, "twice");
    json_decref(b);
    char path[512];
    while (cache_file(path, sizeof path)) CHECK(unlink(path) == 0);
}

/* A bundle of more tables than bundle_json writes (one per thread count of
 * its at most 256 classes, and the sender's own: 257) is refused for their
 * number: a hostile checkpoint's 65536 empty tables (3 MB) took minutes in
 * the pairwise check of their thread counts. 258 are refused, 257 install. */
static void test_bundle_too_many_tables(void) {
    restart();
    json_t *b = json_pack("{s:[]}", "tables"), *tables = json_object_get(b, "tables");
    for (int t = 1; t <= 258; t++)
        json_array_append_new(tables, json_pack("{s:s, s:i, s:[]}", "key", "hostile", "threads", t, "choices"));
    const char *why = accel__gemm_choices_install(b);
    CHECK_MSG(why != NULL, "a bundle of 258 tables was installed");
    if (why) CHECK_STR_CONTAINS(why, "more tables than a bundle holds (257)");
    CHECK(json_array_remove(tables, 257) == 0);
    why = accel__gemm_choices_install(b);
    CHECK_MSG(why == NULL, "a bundle of 257 tables was refused: %s", why);
    json_decref(b);
    accel__gemm_choice_reset();
}

/* `accel env` with every slot of the table filled (256 classes, as a
 * long-lived cache reaches): each class on a line of its own, no crash (its
 * text overran a 16 KiB buffer and the listing walked off its end). */
static void test_env_full_table(void) {
    restart();
    int n = 0;
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 8; b++)
            for (int c = 0; c < 4; c++, n++) CHECK(choose(a, b, c) == OB);
    CHECK(n == 256);
    char exe[4200], scratch[256], env_cache[300], env_threads[64];
    CHECK(sibling_exe("accel", exe, sizeof exe));
    CHECK(cli_scratch("gemm_env_full", scratch, sizeof scratch));
    snprintf(env_cache, sizeof env_cache, "ACCEL_GEMM_CACHE=%s", g_dir);
    snprintf(env_threads, sizeof env_threads, "OMP_NUM_THREADS=%d", omp_get_max_threads());
    static char out[1 << 17], err[4096];
    cli_io io = {scratch, out, err, sizeof out, sizeof err};
    const char *args[] = {"env", NULL}, *env[] = {env_cache, env_threads, "ACCEL_GEMM_MEASURE=0", NULL};
    int rc = cli_run(&io, exe, args, env, NULL);
    CHECK_MSG(rc == 0, "accel env exited %d: %s", rc, err);
    CHECK_STR_CONTAINS(out, "- GEMM choices: 256 measured, cached in ");
    CHECK_STR_CONTAINS(out, "\tfloat32 NT M~2^0 N~2^0 K~2^0 ");
    CHECK_STR_CONTAINS(out, "\tfloat32 NT M~2^7 N~2^7 K~2^3 ");
    CHECK_STR_CONTAINS(out, "- System RAM: ");
    cli_scratch_remove(scratch);
    char path[512];
    while (cache_file(path, sizeof path)) CHECK(unlink(path) == 0);
}

/* ACCEL_GEMM_CACHE longer than the table keeps (1023 bytes): not cut to
 * another directory's name (it was, and the file written there), but
 * named in a warning and the choices kept in memory. */
static void test_cache_dir_too_long(void) {
    char dir[1400];
    int n = snprintf(dir, sizeof dir, "%s", g_dir);
    while (n < 1200) n += snprintf(dir + n, sizeof dir - (size_t)n, "/%0200d", 0);
    setenv("ACCEL_GEMM_CACHE", dir, 1);
    accel__gemm_choice_reset();
    g_calls = 0;
    CHECK(choose(11, 10, 9) == OB && g_calls == 2);
    char buf[512], cmd[400];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), "measured, not cached (");
    snprintf(cmd, sizeof cmd, "test -z \"$(find %s -name 'gemm-*.json')\"", g_dir);
    CHECK_MSG(system(cmd) == 0, "a choice file was written under a cut name");
}

/* A tile class whose batch no memory holds (head dims of 2^40, from a
 * hand-edited file that `accel env --measure-gemm` times again): timed on
 * the real timer, it is refused naming the sizes, not multiplied out of
 * range. Keys alone never make it so: a class is timed on a window of at
 * most 2048 keys, so 2^62 keys of one dim are measured like 2048. */
static void test_tiles_beyond_memory(void) {
    setenv("ACCEL_GEMM_CACHE", "off", 1);
    accel__gemm_choice_reset();
    accel__gemm_choice_set_timer(NULL, NULL);
    accel_clear_error();
    CHECK(accel__cpu_sdpa_measure(ACCEL_F32, 1ll << 40, 1ll << 40) == -1);
    CHECK_STR_CONTAINS(accel_last_error(), "attention tiles");
    accel_clear_error();
    CHECK(accel__cpu_sdpa_measure(ACCEL_F32, 1ll << 62, 1) >= 0);
    accel_clear_error();
    accel__gemm_choice_set_timer(fake_time, NULL);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_gemm_hostile_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    accel__gemm_choice_set_timer(fake_time, NULL);
    RUN(test_malformed_entries);
    RUN(test_bundle_thread_count_twice);
    RUN(test_bundle_too_many_tables);
    RUN(test_env_full_table);
    RUN(test_cache_dir_too_long);
    RUN(test_tiles_beyond_memory);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    accel__gemm_choice_set_timer(NULL, NULL);
    return check_summary();
}
