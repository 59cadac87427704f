/* The GEMM provider chosen by measurement (src/backends/cpu/gemm_choice.c)
 * with fake timings (accel__gemm_choice_set_timer), so nothing here depends
 * on how fast anything runs: the winner is kept, a small shape is never
 * timed, a challenger needs a clear margin (5% against the rule's choice,
 * 10% against a measured one: hysteresis), the choices survive
 * in the cache file and are read back without timing, a corrupt file, one
 * of another key and an unwritable directory fall back to measuring, and
 * ACCEL_GEMM_MEASURE=0/1 and ACCEL_GEMM force what they say; bf16 and f16
 * are chosen alike where they have two candidates; a checkpoint's choices
 * win over an altered cache and the resumed losses are bit for bit those of
 * the uninterrupted run. `test_gemm_choice ranks` under `accel launch`
 * (tests/gemm.cmake): ranks whose caches disagree multiply on rank 0's
 * choices. */
#include <jansson.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/openblas_core.h"
#include "core/prepared.h"
#include "accelerator/gemm_choices.h"
#include "check.h"
#include "refuse_band.h"

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

/* The big class's first choice (an empty cache: the rule's OpenBLAS the
 * incumbent) with these fake timings. */
static int first_choice(double openblas, double dnnl) {
    clear_dir();
    restart(g_dir, NULL);
    set_times(openblas, dnnl);
    return choose_big();
}

/* Noise cannot flip a choice: a challenger within the margin loses. */
static void test_hysteresis(void) {
    /* 3% faster: not enough against the rule's OpenBLAS */
    CHECK(first_choice(1.0, 0.97) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    /* 7% faster than the rule's (a prior, not a measurement): enough ... */
    CHECK(first_choice(1.0, 0.93) == ACCEL__GEMM_PROVIDER_DNNL);
    /* ... but not against a measured choice: OpenBLAS 7% faster, oneDNN stays */
    restart(g_dir, "1");
    set_times(0.93, 1.0);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 2);
    CHECK(first_choice(1.0, 0.97) == ACCEL__GEMM_PROVIDER_OPENBLAS);
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

/* A transposed A (dW = dY^T X) also has oneDNN's row blocks as a
 * candidate, no other form does; the cache file's key names the providers. */
static void test_rows_candidate(void) {
    if (!accel__gemm_have_dnnl()) {
        fprintf(stderr, "  (this build has no oneDNN)\n");
        return;
    }
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.8);
    g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_ROWS] = 0.5;
    CHECK(accel__gemm_provider_for(ACCEL_F32, true, false, BIG_K, BIG_K, BIG_M) == ACCEL__GEMM_PROVIDER_DNNL_ROWS);
    CHECK(g_fake.calls == 3);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls == 5); /* NT: two candidates */
    char buf[2048];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), ": dnnl_rows (openblas 1000.000 ms, "
                                                                     "dnnl 800.000 ms, dnnl_rows 500.000 ms)");
    /* the cache file's key names the providers: a build without dnnl_rows
     * keeps a file of its own (it could not read this one) */
    char f[512];
    CHECK(cache_file(f, sizeof f));
    json_t *j = json_load_file(f, 0, NULL);
    CHECK_STR_CONTAINS(json_string_value(json_object_get(j, "key")), ";providers=openblas,dnnl,dnnl_rows");
    json_decref(j);
    g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_ROWS] = 0.0;
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

/* The real timer picks one of the candidates and the GEMM stays right;
 * where the timing evicts, every run but the class's first (which makes the
 * operands) finds A [96, 64], B [64, 80] and C [96, 80] put out of the
 * caches: their lines, each operand starting anywhere in its first one. */
static void test_real_timer(void) {
    restart("off", NULL);
    accel__gemm_choice_set_timer(NULL, NULL);
    uint32_t both = 1u << ACCEL__GEMM_PROVIDER_OPENBLAS | 1u << ACCEL__GEMM_PROVIDER_DNNL;
    size_t evicted = accel__gemm_choice_evicted_bytes();
    int p = accel__gemm_choose(ACCEL_F32, false, true, 96, 80, 64, ACCEL__GEMM_PROVIDER_OPENBLAS, both, true, false);
    CHECK(p == ACCEL__GEMM_PROVIDER_OPENBLAS || p == ACCEL__GEMM_PROVIDER_DNNL);
#ifdef ACCEL__GEMM_CHOICE_EVICTS
    size_t runs = 2 * (1 + 3), bytes = (96 * 64 + 64 * 80 + 96 * 80) * 4; /* a warm-up and REPS (3) per candidate */
    size_t flushed = accel__gemm_choice_evicted_bytes() - evicted;
    CHECK(flushed >= (runs - 1) * bytes && flushed <= (runs - 1) * (bytes + 3 * 64));
#else
    CHECK(accel__gemm_choice_evicted_bytes() == evicted);
#endif
    char buf[1024];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), "float32 NT M~2^6 N~2^6 K~2^6");
    CHECK_STR_CONTAINS(buf, "(openblas ");
    CHECK_STR_CONTAINS(buf, ", dnnl ");
    accel__gemm_choice_set_timer(fake_time, &g_fake);
}

/* The fake timer of the weight classes: oneDNN twice as fast as OpenBLAS on
 * a class of op weight, half as fast on any other; bf16 weight classes
 * counted (there must be none). */
static int g_bf16_weight_classes;

static double weight_time(void *ctx, accel__gemm_provider p, const accel__gemm_class *c) {
    (void)ctx;
    g_fake.calls++;
    g_bf16_weight_classes += c->op == ACCEL__GEMM_OP_WEIGHT && c->dt != 0;
    if (p == ACCEL__GEMM_PROVIDER_OPENBLAS) return 1.0;
    return c->op == ACCEL__GEMM_OP_WEIGHT ? 0.5 : 2.0;
}

/* A layer's f32 weight GEMM (accel__gemm_weight_provider_for: the forward's
 * X W^T, dX's dY W) is a class of its own (op weight), apart from a plain
 * GEMM of the same shape: each keeps its own winner, shown as such, written
 * to the file with its op, read back untimed and timed again on demand
 * (accel__gemm_measure). bf16's weight GEMMs share the plain class. */
static void test_weight_class(void) {
    enum { OB = ACCEL__GEMM_PROVIDER_OPENBLAS, DN = ACCEL__GEMM_PROVIDER_DNNL };
    if (!accel__gemm_have_dnnl()) {
        fprintf(stderr, "  (this build has no oneDNN)\n");
        return;
    }
    clear_dir();
    restart(g_dir, NULL);
    accel__gemm_choice_set_timer(weight_time, NULL);
    g_bf16_weight_classes = 0;
    CHECK(accel__gemm_weight_provider_for(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K) == DN && g_fake.calls == 2);
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K) == OB && g_fake.calls == 4);
    CHECK(accel__gemm_weight_provider_for(ACCEL_F32, false, false, BIG_M, BIG_K, BIG_N) == DN); /* dX = dY W */
    CHECK(accel__gemm_weight_provider_for(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K) == DN && g_fake.calls == 6);
    int bf16 = accel__gemm_provider_for(ACCEL_BF16, false, true, BIG_M, BIG_N, BIG_K);
    CHECK(accel__gemm_weight_provider_for(ACCEL_BF16, false, true, BIG_M, BIG_N, BIG_K) == bf16);
    CHECK(g_bf16_weight_classes == 0);
    char buf[4096], want[128];
    snprintf(want, sizeof want, "float32 NT weight M~2^11 N~2^10 K~2^9 %d thread%s: dnnl (openblas 1000.000 ms, dnnl "
             "500.000 ms)", omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s");
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), want);
    CHECK_STR_CONTAINS(buf, "float32 NT M~2^11 N~2^10 K~2^9");
    CHECK_STR_CONTAINS(buf, ": openblas (openblas 1000.000 ms, dnnl 2000.000 ms)");
    char path[512];
    CHECK(cache_file(path, sizeof path));
    json_t *j = json_load_file(path, 0, NULL);
    size_t i, weights = 0;
    json_t *e;
    json_array_foreach(json_object_get(j, "choices"), i, e) {
        const char *op = json_string_value(json_object_get(e, "op"));
        weights += op && !strcmp(op, "weight");
    }
    CHECK_MSG(j && weights == 2, "%zu weight classes in the file", weights);
    json_decref(j);
    restart(g_dir, NULL); /* read back, untimed */
    CHECK(accel__gemm_weight_provider_for(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K) == DN);
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K) == OB && g_fake.calls == 0);
    CHECK(accel__gemm_measure(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K, true) == DN && g_fake.calls == 2);
    accel__gemm_choice_set_timer(fake_time, &g_fake);
    /* a table without weight classes (written before them): the plain
     * class's choice stands for the weight class, its incumbent when timed
     * (oneDNN 3% faster: no win against it, nor against the rule) ... */
    CHECK(first_choice(1.0, 0.5) == DN);
    restart(g_dir, NULL);
    set_times(1.0, 0.97);
    CHECK(accel__gemm_weight_provider_for(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K) == DN && g_fake.calls == 2);
    /* ... and untimed where the table was installed whole (a checkpoint's,
     * rank 0's), so such a run multiplies as it did */
    char saved[320];
    snprintf(saved, sizeof saved, "%s/ckpt_plain.json", g_dir);
    CHECK(first_choice(1.0, 0.5) == DN && accel__gemm_choices_save(saved) == ACCEL_OK);
    clear_dir();
    restart(g_dir, NULL);
    CHECK(accel__gemm_choices_load(saved) == ACCEL_OK);
    set_times(0.5, 1.0); /* a timing would take OpenBLAS */
    CHECK(accel__gemm_weight_provider_for(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K) == DN && g_fake.calls == 0);
    unlink(saved);
    /* the weight class's timing reads the scratch weight's form where
     * oneDNN's layout holds one: a warm-up and 3 runs on it; a plain class's none */
    restart("off", NULL);
    accel__gemm_choice_set_timer(NULL, NULL);
    enum { M = 96, N = 128, K = 64 };
    float *b = calloc(N * K, sizeof(float));
    void *form = NULL;
    size_t bytes, runs = accel__gemm_form_runs();
    CHECK(b && accel__gemm_scratch_form(ACCEL_F32, true, N, K, b, &form, &bytes) == ACCEL_OK);
    accel__gemm_measure(ACCEL_F32, false, true, M, N, K, false);
    CHECK(accel__gemm_form_runs() == runs);
    accel__gemm_measure(ACCEL_F32, false, true, M, N, K, true);
    CHECK_MSG(accel__gemm_form_runs() == runs + (form ? 4 : 0), "%zu runs on the form, a form %s",
              accel__gemm_form_runs() - runs, form ? "made" : "not made");
    /* the form's memory refused: the class's timing fails as a whole (a
     * warning on stderr), the GEMM takes the untimed choice, nothing is kept */
    if (form) {
        int untimed = accel__gemm_weight_provider_for(ACCEL_F32, false, true, M, N, K); /* small: the rule's */
        restart("off", NULL);
        refuse_band band = {.min = bytes, .max = bytes + 1};
        refuse_band_install(&band);
        int p = accel__gemm_measure(ACCEL_F32, false, true, M, N, K, true);
        refuse_band_install(NULL);
        accel__gemm_class cls[8];
        CHECK_MSG(band.refused && p == untimed && accel__gemm_choice_classes(omp_get_max_threads(), cls, 8) == 0,
                  "refused %d, provider %d (untimed %d)", band.refused, p, untimed);
        CHECK(accel_last_status() == ACCEL_OK); /* the failure was said and cleared */
    }
    accel_free(form), free(b);
    /* a weight no form can be kept of (ACCEL_WEIGHT_CACHE=0) multiplies on
     * the plain class: oneDNN would read its plain weight, not the form the
     * weight class timed */
    accel__gemm_choice_set_timer(weight_time, NULL);
    accel_tensor *w = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){BIG_N, BIG_K}, ACCEL_CPU_DEVICE);
    float *a = calloc((size_t)BIG_M * BIG_K, sizeof(float)), *c = calloc((size_t)BIG_M * BIG_N, sizeof(float));
    CHECK(w && a && c);
    memset(w->data, 0, sizeof(float) * BIG_N * BIG_K);
    for (int cached = 0; cached < 2; cached++) {
        restart("off", NULL);
        bool was = accel__prepared_set_enabled(cached);
        CHECK(accel__gemm_weight(false, true, BIG_M, BIG_N, BIG_K, 1.0f, a, ACCEL_F32, BIG_K, w, 0, BIG_K, 0.0f, c,
                                 BIG_N) == ACCEL_OK);
        accel__prepared_set_enabled(was);
        accel__gemm_class cls[8];
        int n = accel__gemm_choice_classes(omp_get_max_threads(), cls, 8), weights = 0;
        for (int k = 0; k < n; k++) weights += cls[k].op == ACCEL__GEMM_OP_WEIGHT;
        CHECK_MSG(weights == cached, "weight cache %s: %d weight classes", cached ? "on" : "off", weights);
        accel_step_reset();
    }
    accel_tensor_free(w);
    free(a), free(c);
    accel__gemm_choice_set_timer(fake_time, &g_fake);
}

/* Attention's tile classes (op sdpa_tiles, accel__gemm_tiles_provider):
 * chosen on the same table with the same margin, apart from a GEMM of the
 * same log2 dims, written to the file with their op and read back untimed
 * (a file naming an op this build does not know is malformed), three
 * candidates for bf16 where oneDNN has them, carried by a checkpoint's
 * choices, forced untimed by ACCEL_GEMM, timed again on demand. */
static int tiles(accel_dtype dt) { return accel__gemm_tiles_provider(dt, 64, 256, 64, false, NULL, NULL); }

static void test_attention_tiles(void) {
    enum { OB = ACCEL__GEMM_PROVIDER_OPENBLAS, DN = ACCEL__GEMM_PROVIDER_DNNL, DF = ACCEL__GEMM_PROVIDER_DNNL_F32 };
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.5);
    CHECK(tiles(ACCEL_F32) == DN && g_fake.calls == 2);
    CHECK(tiles(ACCEL_F32) == DN && g_fake.calls == 2);
    set_times(0.5, 1.0); /* a GEMM of the same log2 dims: a class of its own */
    CHECK(accel__gemm_choose(ACCEL_F32, false, false, 64, 256, 64, OB, 1u << OB | 1u << DN, true, false) == OB);
    CHECK(g_fake.calls == 4 && tiles(ACCEL_F32) == DN && g_fake.calls == 4);
    char buf[2048], path[512];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf),
                       "float32 attention tiles queries~2^6 keys~2^8 D~2^6 2 threads: dnnl (openblas 1000.000 ms, "
                       "dnnl 500.000 ms)");
    CHECK_STR_CONTAINS(buf, "float32 NN M~2^6 N~2^8 K~2^6 2 threads: openblas");
    CHECK(cache_file(path, sizeof path));
    json_t *j = json_load_file(path, 0, NULL);
    CHECK(j && json_array_size(json_object_get(j, "choices")) == 2);
    json_decref(j);
    restart(g_dir, NULL); /* read back, untimed */
    CHECK(tiles(ACCEL_F32) == DN && g_fake.calls == 0);
    restart(g_dir, "1"); /* timed again: OpenBLAS 5% faster than the cached oneDNN is not enough */
    set_times(0.95, 1.0);
    CHECK(tiles(ACCEL_F32) == DN && g_fake.calls == 2);
    /* bf16: oneDNN's f32 tiles a candidate beside OpenBLAS and the native path */
    uint32_t c16 = accel__gemm_tiles_candidates(ACCEL_BF16);
    CHECK((c16 & 1u << OB) && (c16 & 1u << DF));
    set_times(1.0, 0.5);
    g_fake.seconds[DF] = 0.2;
    CHECK(tiles(ACCEL_BF16) == DF && g_fake.calls == 2 + __builtin_popcount(c16));
    g_fake.seconds[DF] = 0.0;
    /* a checkpoint's choices, over an empty cache */
    char saved[320];
    snprintf(saved, sizeof saved, "%s/ckpt_tiles.json", g_dir);
    CHECK(accel__gemm_choices_save(saved) == ACCEL_OK);
    clear_dir();
    restart(g_dir, NULL);
    CHECK(accel__gemm_choices_load(saved) == ACCEL_OK);
    set_times(0.1, 1.0);
    CHECK(tiles(ACCEL_F32) == DN && tiles(ACCEL_BF16) == DF && g_fake.calls == 0);
    unlink(saved);
    /* an op this build does not know: the file is malformed, measured over */
    restart(g_dir, NULL);
    set_times(1.0, 0.5);
    CHECK(tiles(ACCEL_F32) == DN && cache_file(path, sizeof path));
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "sed -i 's/\"sdpa_tiles\"/\"conv\"/' %s", path);
    CHECK(system(cmd) == 0);
    restart(g_dir, NULL);
    set_times(0.5, 1.0);
    CHECK(tiles(ACCEL_F32) == OB && g_fake.calls == 2);
    /* forced: nothing timed */
    restart(g_dir, NULL);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_OPENBLAS) == ACCEL_OK);
    CHECK(tiles(ACCEL_F32) == OB && tiles(ACCEL_BF16) == OB);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK);
    int b16 = tiles(ACCEL_BF16);
    CHECK(tiles(ACCEL_F32) == DN && (b16 == DN || b16 == DF) && g_fake.calls == 0);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    /* `accel env --measure-gemm`: a class timed again, the margin against what it held */
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.5);
    CHECK(tiles(ACCEL_F32) == DN && g_fake.calls == 2);
    set_times(0.5, 1.0);
    CHECK(accel__cpu_sdpa_measure(ACCEL_F32, 256, 64) == OB && g_fake.calls == 4);
    CHECK(tiles(ACCEL_F32) == OB && g_fake.calls == 4);
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

/* A checkpoint saved on T0 threads holding choices of T0 and T1 (T1's
 * other), loaded by a process of T1 threads: it multiplies on the saver's
 * own T0 choices, untimed; what its table held before for a class the
 * checkpoint lacks is gone (the rule's, ACCEL_GEMM_MEASURE=0). */
static void test_load_other_thread_count(void) {
    int t0 = omp_get_max_threads(), t1 = t0 + 1;
    uint32_t both = 1u << ACCEL__GEMM_PROVIDER_OPENBLAS | 1u << ACCEL__GEMM_PROVIDER_DNNL;
    clear_dir();
    restart("off", NULL);
    omp_set_num_threads(t1);
    set_times(0.5, 1.0);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_OPENBLAS); /* T1's table: the other provider */
    omp_set_num_threads(t0);
    set_times(1.0, 0.5);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL);
    char saved[320];
    snprintf(saved, sizeof saved, "%s/ckpt_threads.json", g_dir);
    CHECK(accel__gemm_choices_save(saved) == ACCEL_OK);
    /* the resumed process: T1 threads, an NN choice against the rule made before the load */
    restart("off", "0");
    omp_set_num_threads(t1);
    int nn_rule = accel__gemm_provider_for(ACCEL_F32, false, false, BIG_M, BIG_N, BIG_K);
    int nn_other = nn_rule == ACCEL__GEMM_PROVIDER_DNNL ? ACCEL__GEMM_PROVIDER_OPENBLAS : ACCEL__GEMM_PROVIDER_DNNL;
    set_times(nn_other == ACCEL__GEMM_PROVIDER_OPENBLAS ? 0.5 : 1.0, nn_other == ACCEL__GEMM_PROVIDER_DNNL ? 0.5 : 1.0);
    CHECK(accel__gemm_choose(ACCEL_F32, false, false, BIG_M, BIG_N, BIG_K, nn_rule, both, true, false) == nn_other);
    set_times(0.5, 1.0); /* a timer would pick OpenBLAS for NT */
    g_fake.calls = 0;
    CHECK(accel__gemm_choices_load(saved) == ACCEL_OK);
    CHECK_MSG(choose_big() == ACCEL__GEMM_PROVIDER_DNNL, "T1 does not multiply on the saver's own T0 choice");
    CHECK_MSG(accel__gemm_provider_for(ACCEL_F32, false, false, BIG_M, BIG_N, BIG_K) == nn_rule,
              "a class the checkpoint lacks kept what the table held before the load");
    CHECK_MSG(g_fake.calls == 0, "a restored choice was timed (%d)", g_fake.calls);
    omp_set_num_threads(t0);
    unlink(saved);
}

/* A choice naming a provider that is no candidate here (e.g. dnnl where
 * this oneDNN only loops over the dtype) gives way to the rule. */
static void test_choice_not_a_candidate(void) {
    clear_dir();
    restart("off", NULL);
    set_times(1.0, 0.5);
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_DNNL);
    uint32_t no_dnnl = 1u << ACCEL__GEMM_PROVIDER_REFERENCE | 1u << ACCEL__GEMM_PROVIDER_OPENBLAS;
    CHECK(accel__gemm_choose(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K, ACCEL__GEMM_PROVIDER_OPENBLAS, no_dnnl,
                             false, false) == ACCEL__GEMM_PROVIDER_OPENBLAS);
}

/* Whether oneDNN's f32 matmul is a candidate here (built in, its plug-in
 * loaded): an f32 class is timed on two providers. */
static bool dnnl_f32_here(void) {
    clear_dir();
    restart("off", NULL);
    set_times(1.0, 0.5);
    g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_F32] = 0.1; /* never one of f32's */
    bool here = choose_big() == ACCEL__GEMM_PROVIDER_DNNL;
    CHECK(g_fake.calls == (here ? 2 : 0));
    g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_F32] = 0.0;
    return here;
}

/* bf16 and f16 are chosen by measurement where they have two candidates
 * (oneDNN has a matmul of the dtype: both timed, a clear winner kept, a
 * narrow one not), else keep the rule, OpenBLAS on f32 panels. (oneDNN's
 * f32 matmul on widened panels, timed wherever oneDNN is, loses here:
 * test_dnnl_f32_candidate.) How the ops hand over operands
 * (accel__gemm_native) stays the rule's. */
static void test_low_precision_measured(void) {
    const accel_dtype dts[] = {ACCEL_BF16, ACCEL_F16};
    int f32_timed = dnnl_f32_here(); /* dnnl_f32's timing, where it is a candidate */
    for (int d = 0; d < 2; d++) {
        accel_dtype dt = dts[d];
        const char *name = accel_dtype_name(dt);
        clear_dir();
        restart(g_dir, NULL);
        bool native = accel__gemm_native(dt); /* the rule: oneDNN multiplies dt */
        set_times(1.0, 0.5);
        g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_F32] = 10.0;
        int p = accel__gemm_provider_for(dt, false, true, BIG_M, BIG_N, BIG_K);
        char buf[2048], cls[64];
        snprintf(cls, sizeof cls, "%s NT M~2^11 N~2^10 K~2^9", name);
        if (g_fake.calls == 2 * f32_timed) { /* no oneDNN matmul of dt: OpenBLAS, which the rule names */
            CHECK_MSG(!native && p == ACCEL__GEMM_PROVIDER_OPENBLAS, "%s: rule %s, got %d", name,
                      native ? "dnnl" : "openblas", p);
            CHECK((strstr(accel__gemm_choices_describe(buf, sizeof buf), cls) != NULL) == f32_timed);
            continue;
        }
        CHECK_MSG(g_fake.calls == 2 + f32_timed && p == ACCEL__GEMM_PROVIDER_DNNL, "%s: %d timings, provider %d",
                  name, g_fake.calls, p);
        CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), cls);
        /* read back from the cache untimed; a narrow challenger loses, a clear one wins */
        restart(g_dir, NULL);
        set_times(0.5, 1.0);
        CHECK(accel__gemm_provider_for(dt, false, true, BIG_M, BIG_N, BIG_K) == ACCEL__GEMM_PROVIDER_DNNL &&
              g_fake.calls == 0);
        restart(g_dir, "1");
        set_times(0.95, 1.0);
        CHECK(accel__gemm_provider_for(dt, false, true, BIG_M, BIG_N, BIG_K) == ACCEL__GEMM_PROVIDER_DNNL);
        restart(g_dir, "1");
        set_times(0.5, 1.0);
        CHECK(accel__gemm_provider_for(dt, false, true, BIG_M, BIG_N, BIG_K) == ACCEL__GEMM_PROVIDER_OPENBLAS);
        CHECK(accel__gemm_native(dt) == native);
        /* the measured provider multiplies right: the same C as the reference loop */
        enum { M = 3, N = 5, K = 7 };
        uint16_t a[M * K], b[N * K];
        float af[M * K], bf[N * K], c[M * N], want[M * N];
        for (int i = 0; i < M * K; i++) af[i] = (float)(i % 5) - 2.0f;
        for (int i = 0; i < N * K; i++) bf[i] = (float)(i % 3) - 1.0f;
        accel__cpu_convert(a, dt, af, ACCEL_F32, M * K);
        accel__cpu_convert(b, dt, bf, ACCEL_F32, N * K);
        accel__sgemm_ref(false, true, M, N, K, 1.0f, af, K, bf, K, 0.0f, want, N);
        for (int q = ACCEL__GEMM_PROVIDER_OPENBLAS; q < ACCEL__GEMM_N_PROVIDERS; q++) {
            if (q == ACCEL__GEMM_PROVIDER_DNNL_F32 && !f32_timed) continue;
            CHECK(accel__gemm_on(q, false, true, M, N, K, 1.0f, a, dt, K, b, dt, K, 0.0f, c, N) == ACCEL_OK);
            for (int i = 0; i < M * N; i++) CHECK_MSG(c[i] == want[i], "%s on %d: %g vs %g", name, q, c[i], want[i]);
        }
    }
}
/* oneDNN's f32 matmul on widened panels (dnnl_f32) is a candidate of
 * bf16/f16 classes wherever oneDNN's f32 matmul is, never of f32's: kept
 * when it wins clearly, not when it is slower or within the margin; read
 * back from the cache untimed (the file's key names it); a bf16 C on it
 * (the f32 C in the step arena, rounded after) is the reference's. */
static void test_dnnl_f32_candidate(void) {
    if (!dnnl_f32_here()) {
        fprintf(stderr, "  (no oneDNN f32 matmul here)\n");
        return;
    }
    const accel_dtype dts[] = {ACCEL_BF16, ACCEL_F16};
    for (int d = 0; d < 2; d++) {
        accel_dtype dt = dts[d];
        int rule = accel__gemm_native(dt) ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS;
        /* within the margin of the incumbent (the rule's): kept off */
        clear_dir();
        restart(g_dir, NULL);
        set_times(rule == ACCEL__GEMM_PROVIDER_OPENBLAS ? 1.0 : 2.0, rule == ACCEL__GEMM_PROVIDER_DNNL ? 1.0 : 2.0);
        g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_F32] = 0.95;
        CHECK(accel__gemm_provider_for(dt, false, true, BIG_M, BIG_N, BIG_K) == rule);
        /* a clear winner */
        clear_dir();
        restart(g_dir, NULL);
        set_times(1.0, 0.8);
        g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_F32] = 0.5;
        CHECK(accel__gemm_provider_for(dt, false, true, BIG_M, BIG_N, BIG_K) == ACCEL__GEMM_PROVIDER_DNNL_F32);
        CHECK(g_fake.calls >= 2);
        char buf[2048], f[512];
        CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), ": dnnl_f32 (openblas 1000.000 ms, ");
        CHECK_STR_CONTAINS(buf, "dnnl_f32 500.000 ms)");
        CHECK(cache_file(f, sizeof f));
        json_t *j = json_load_file(f, 0, NULL);
        CHECK_STR_CONTAINS(json_string_value(json_object_get(j, "key")), ";providers=openblas,dnnl,dnnl_rows,dnnl_f32");
        json_decref(j);
        /* read back untimed, though a timer would now pick another */
        restart(g_dir, NULL);
        set_times(0.1, 0.1);
        CHECK(accel__gemm_provider_for(dt, false, true, BIG_M, BIG_N, BIG_K) == ACCEL__GEMM_PROVIDER_DNNL_F32);
        CHECK(g_fake.calls == 0);
        /* measured again, slower: replaced */
        restart(g_dir, "1");
        CHECK(accel__gemm_provider_for(dt, false, true, BIG_M, BIG_N, BIG_K) != ACCEL__GEMM_PROVIDER_DNNL_F32);
    }
    /* f32 never has it (its own oneDNN matmul is dnnl) */
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 2.0);
    g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_F32] = 0.1;
    CHECK(choose_big() == ACCEL__GEMM_PROVIDER_OPENBLAS && g_fake.calls == 2);

    /* a bf16 C (c_dt bf16, beta 0 and 1) on a class measured onto dnnl_f32:
     * Y = X W^T, 2^26 multiply-adds */
    enum { M = 256, N = 512, K = 512 };
    clear_dir();
    restart("off", NULL);
    set_times(1.0, 1.0);
    g_fake.seconds[ACCEL__GEMM_PROVIDER_DNNL_F32] = 0.1;
    CHECK(accel__gemm_provider_for(ACCEL_BF16, false, true, M, N, K) == ACCEL__GEMM_PROVIDER_DNNL_F32);
    accel_tensor *a = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(M, K), ACCEL_CPU_DEVICE);
    accel_tensor *w = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(N, K), ACCEL_CPU_DEVICE);
    accel_tensor *c = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(M, N), ACCEL_CPU_DEVICE);
    static float af[M * K], wf[N * K], want[M * N], got[M * N], c0[M * N];
    static uint16_t rounded[M * N];
    for (int i = 0; i < M * K; i++) af[i] = (float)((i * 7 + 3) % 17 - 8) / 8.0f;
    for (int i = 0; i < N * K; i++) wf[i] = (float)((i * 5 + 1) % 13 - 6) / 16.0f;
    for (int i = 0; i < M * N; i++) c0[i] = (float)(i % 9 - 4);
    accel__cpu_convert(a->data, ACCEL_BF16, af, ACCEL_F32, M * K);
    accel__cpu_convert(w->data, ACCEL_BF16, wf, ACCEL_F32, N * K);
    for (int beta = 0; beta <= 1; beta++) {
        accel__cpu_convert(c->data, ACCEL_BF16, c0, ACCEL_F32, M * N); /* exact: small integers */
        memcpy(want, c0, sizeof want);
        /* the values are multiples of 1/128 under 2^7: every sum is exact in f32 */
        accel__sgemm_ref(false, true, M, N, K, 1.0f, af, K, wf, K, (float)beta, want, N);
        accel_k_gemm k = {.c = c, .a = a, .b = w, .trans_b = true, .M = M, .N = N, .K = K, .lda = K, .ldb = K,
                          .ldc = N, .alpha = 1.0f, .beta = (float)beta, .b_weight = true};
        size_t used = accel_arena_used(accel_step_arena());
        CHECK_MSG(accel__cpuk_gemm(&k) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_arena_used(accel_step_arena()) == used);
        accel__cpu_convert(got, ACCEL_F32, c->data, ACCEL_BF16, M * N);
        accel__cpu_convert(rounded, ACCEL_BF16, want, ACCEL_F32, M * N); /* rounded once, as the kernel does */
        accel__cpu_convert(want, ACCEL_F32, rounded, ACCEL_BF16, M * N);
        int bad = -1;
        for (int i = 0; i < M * N && bad < 0; i++)
            if (got[i] != want[i]) bad = i;
        CHECK_MSG(bad < 0, "beta %d: C[%d] = %g, reference %g", beta, bad, bad < 0 ? 0.0 : got[bad],
                  bad < 0 ? 0.0 : want[bad]);
    }
    accel_tensor_free(a), accel_tensor_free(w), accel_tensor_free(c);
    accel_step_reset();
}

/* A checkpoint or rank 0's table naming a provider this build lacks (one
 * of a newer build; oneDNN's without oneDNN) is refused with its reason; dnnl_f32
 * is taken where oneDNN is built in. */
static void test_install_names_lacking_provider(void) {
    const char *bundle = "{\"tables\": [{\"key\": \"k\", \"threads\": 2, \"choices\": [{\"dtype\": "
                         "\"bfloat16\", \"trans\": \"NT\", \"log2_m\": 11, \"log2_n\": 10, \"log2_k\": 9, "
                         "\"provider\": \"%s\", \"seconds\": {}}]}]}";
    char text[512];
    snprintf(text, sizeof text, bundle, "dnnl_f64");
    json_t *j = json_loads(text, 0, NULL);
    const char *why = accel__gemm_choices_install(j);
    CHECK(why != NULL);
    CHECK_STR_CONTAINS(why ? why : "", "an entry names a provider this build does not know");
    json_decref(j);
    snprintf(text, sizeof text, bundle, "dnnl_f32");
    j = json_loads(text, 0, NULL);
    why = accel__gemm_choices_install(j);
    if (accel__gemm_have_dnnl()) CHECK_MSG(why == NULL, "%s", why);
    else CHECK_STR_CONTAINS(why ? why : "", "an entry names a oneDNN provider (dnnl, dnnl_rows or dnnl_f32) and "
                                            "this build has no oneDNN");
    json_decref(j);
    accel__gemm_choice_reset();
}

/* A run whose GEMMs are of measured classes: Y = X W^T of a 512 x 512
 * weight on 256 rows and its dW = dY^T X, 2^26 multiply-adds each. */
typedef struct lrun {
    accel_module *m;
    accel_optimizer *opt;
    accel_tensor *x, *y;
} lrun;

enum { ROWS = 256, FEAT = 512, FIRST = 2, THEN = 3 };

static void lrun_make(lrun *r, uint64_t seed) {
    static float x[ROWS * FEAT], y[ROWS * FEAT];
    for (int i = 0; i < ROWS * FEAT; i++) {
        x[i] = (float)((i * 7 + 3) % 29) / 29.0f - 0.5f;
        y[i] = (float)((i * 5 + 1) % 31) / 31.0f - 0.5f;
    }
    r->x = accel_tensor_wrap(x, ACCEL_F32, ACCEL_SHAPE(ROWS, FEAT), ACCEL_CPU_DEVICE);
    r->y = accel_tensor_wrap(y, ACCEL_F32, ACCEL_SHAPE(ROWS, FEAT), ACCEL_CPU_DEVICE);
    accel_manual_seed(seed);
    r->m = accel_linear_new(FEAT, FEAT, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor **ps;
    int n = accel_module_parameters(r->m, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    r->opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, n, ps, &h);
    accel_free(ps);
}

static void lrun_free(accel_accelerator *acc, lrun *r) {
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(r->opt);
    accel_module_free(r->m);
    accel_tensor_free(r->x);
    accel_tensor_free(r->y);
}

static void lrun_train(accel_accelerator *acc, lrun *r, int steps, double *losses) {
    for (int s = 0; s < steps; s++) {
        accel_tensor *loss = accel_mse_loss(accel_module_call(r->m, r->x), r->y);
        CHECK_MSG(accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_accelerator_optimizer_step(acc, r->opt) == ACCEL_OK);
        CHECK(accel_accelerator_zero_grad(acc, r->opt) == ACCEL_OK);
        losses[s] = accel_item(loss);
        accel_step_reset();
    }
}

/* The weight's bytes after a run into out (FEAT * FEAT floats). */
static void lrun_weight(lrun *r, float *out) {
    accel_tensor **ps;
    int n = accel_module_parameters(r->m, &ps);
    CHECK(n == 1 && accel_numel(ps[0]) == FEAT * FEAT);
    if (n == 1) memcpy(out, ps[0]->data, sizeof(float) * FEAT * FEAT);
    accel_free(ps);
}

static int fwd_provider(void) { return accel__gemm_provider_for(ACCEL_F32, false, true, ROWS, FEAT, FEAT); }

/* save_state writes the choices beside the model (covered by the marker);
 * a resumed run whose cache now names the other provider (and whose timer
 * would pick it too) multiplies on the saved ones, untimed, and its losses
 * and weights are the uninterrupted run's bit for bit (the losses, means of
 * 2^17 squares, may not tell the providers apart; the weights do). */
static void test_resume_on_saved_choices(void) {
    clear_dir();
    restart(g_dir, NULL);
    set_times(1.0, 0.4);
    char project[320], ckpt[400], cache[512], cmd[1400];
    snprintf(project, sizeof project, "%s/project", g_dir);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.project_dir = project;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK(acc != NULL);
    lrun a, b;
    double first[FIRST], want[THEN], got[THEN];
    static float want_w[FEAT * FEAT], got_w[FEAT * FEAT];
    lrun_make(&a, 1);
    CHECK(accel_accelerator_prepare(acc, a.m, a.opt) == ACCEL_OK);
    lrun_train(acc, &a, FIRST, first);
    int saved = fwd_provider(); /* what the library chose (the fake timer's winner) */
    CHECK(saved == ACCEL__GEMM_PROVIDER_DNNL && g_fake.calls >= 2);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", g_dir);
    CHECK(accel_accelerator_save_state(acc, ckpt, NULL, 0) == ACCEL_OK);
    lrun_train(acc, &a, THEN, want); /* uninterrupted */
    lrun_weight(&a, want_w);
    lrun_free(acc, &a);

    /* the cache now names OpenBLAS for every class; a new process would take it */
    CHECK(cache_file(cache, sizeof cache));
    snprintf(cmd, sizeof cmd, "sed -i 's/\"provider\": \"dnnl\"/\"provider\": \"openblas\"/' %s", cache);
    CHECK(system(cmd) == 0);
    restart(g_dir, NULL);
    set_times(0.4, 1.0);
    CHECK_MSG(fwd_provider() != saved, "the altered cache still names the saved provider");
    restart(g_dir, NULL);
    lrun_make(&b, 2); /* other weights: all restored */
    CHECK(accel_accelerator_prepare(acc, b.m, b.opt) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(acc, ckpt, NULL) == ACCEL_OK);
    CHECK(fwd_provider() == saved);
    lrun_train(acc, &b, THEN, got);
    CHECK_MSG(g_fake.calls == 0, "a restored choice was timed (%d)", g_fake.calls);
    for (int s = 0; s < THEN; s++) CHECK_MSG(want[s] == got[s], "step %d: %.9g vs %.9g", s, want[s], got[s]);
    lrun_weight(&b, got_w);
    CHECK_MSG(!memcmp(want_w, got_w, sizeof want_w), "the resumed weights differ from the uninterrupted run's");
    lrun_free(acc, &b);

    /* the file is covered by the checkpoint's marker: altered, the load fails naming it */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"provider\": \"dnnl\"/\"provider\": \"openblas\"/' %s/gemm_choices.json",
             ckpt);
    CHECK(system(cmd) == 0);
    lrun_make(&b, 2);
    CHECK(accel_accelerator_prepare(acc, b.m, b.opt) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(acc, ckpt, NULL) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "gemm_choices.json");
    accel_clear_error();
    lrun_free(acc, &b);
    accel_accelerator_free(acc);
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", project, ckpt);
    CHECK(system(cmd) == 0);
}

/* `accel launch -n 2 test_gemm_choice ranks`: each rank's own cache
 * directory names a different provider for one class, and rank 1's caches a
 * class rank 0's does not; once the accelerator exists both multiply on rank
 * 0's table (and the rule for the class it lacks), timing nothing. Rank 1
 * runs on another thread count (its classes are keyed by it): rank 0's
 * choices still hold there. */
static void *no_memory(size_t n) {
    (void)n;
    return NULL;
}

static int ranks_main(void) {
    int rank = accel_dist_rank();
    if (rank == 1) omp_set_num_threads(1);
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_gemm_choice_%d_rank%d", (int)getppid(), rank);
    CHECK(mkdir(g_dir, 0700) == 0);
    accel__gemm_choice_set_timer(fake_time, &g_fake);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    uint32_t both = 1u << ACCEL__GEMM_PROVIDER_OPENBLAS | 1u << ACCEL__GEMM_PROVIDER_DNNL;
    /* NN's rule (no cache, nothing timed) */
    restart("off", "0");
    int nn_rule = accel__gemm_provider_for(ACCEL_F32, false, false, BIG_M, BIG_N, BIG_K);
    int nn_other = nn_rule == ACCEL__GEMM_PROVIDER_DNNL ? ACCEL__GEMM_PROVIDER_OPENBLAS : ACCEL__GEMM_PROVIDER_DNNL;
    /* the caches, as earlier single-process runs on each machine left them */
    restart(g_dir, NULL);
    set_times(rank == 0 ? 1.0 : 0.5, rank == 0 ? 0.5 : 1.0);
    int mine =
        accel__gemm_choose(ACCEL_F32, false, true, BIG_M, BIG_N, BIG_K, ACCEL__GEMM_PROVIDER_OPENBLAS, both, true, false);
    CHECK(mine == (rank == 0 ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS));
    if (rank == 1) {
        set_times(nn_other == ACCEL__GEMM_PROVIDER_OPENBLAS ? 0.5 : 1.0, nn_other == ACCEL__GEMM_PROVIDER_DNNL ? 0.5 : 1.0);
        CHECK(accel__gemm_choose(ACCEL_F32, false, false, BIG_M, BIG_N, BIG_K, nn_rule, both, true, false) == nn_other);
    }
    /* a new process: its own cache read (the ranks disagree here) */
    restart(g_dir, NULL);
    CHECK(choose_big() == mine && g_fake.calls == 0);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK(acc != NULL);
    if (!acc) return check_summary();
    int got[2] = {choose_big(), accel__gemm_provider_for(ACCEL_F32, false, false, BIG_M, BIG_N, BIG_K)};
    CHECK_MSG(got[0] == ACCEL__GEMM_PROVIDER_DNNL, "rank %d: NT on %d, not rank 0's dnnl", rank, got[0]);
    CHECK_MSG(got[1] == nn_rule, "rank %d: NN on %d, not the rule's %d (rank 0 had no choice)", rank, got[1], nn_rule);
    CHECK_MSG(g_fake.calls == 0, "rank %d timed %d times", rank, g_fake.calls);
    char buf[2048];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), "rank 0's");
    /* and they agree with each other */
    int32_t all[4], me[2] = {got[0], got[1]};
    CHECK(accel_pg_all_gather(accel_dist_default_group(), me, all, 2, ACCEL_I32) == ACCEL_OK);
    CHECK(all[0] == all[2] && all[1] == all[3]);
    /* rank 0 cannot write its table out (no memory for JSON): every rank
     * fails, none waits for the group's timeout on the others */
    if (rank == 0) json_set_alloc_funcs(no_memory, free);
    accel_status st = accel__gemm_choices_share(accel_dist_default_group());
    if (rank == 0) json_set_alloc_funcs(malloc, free);
    CHECK_MSG(st == ACCEL_ERR_FORMAT, "rank %d: status %d", rank, (int)st);
    CHECK_STR_CONTAINS(accel_last_error(), rank == 0 ? "out of memory on rank 0" : "GEMM choices from rank 0: not JSON");
    accel_clear_error();
    accel_accelerator_free(acc);
    clear_dir();
    rmdir(g_dir);
    accel__gemm_choice_set_timer(NULL, NULL);
    accel_thread_cleanup();
    return check_summary();
}

int main(int argc, char **argv) {
    if (!accel__gemm_have_dnnl()) {
        fprintf(stderr, "oneDNN not built in: OpenBLAS is the only candidate, nothing to choose\n");
        return 0;
    }
    /* OpenBLAS taken to run this CPU's own core: the rule these tests
     * expect (test_openblas_core.c runs a fallback core's) */
    accel__openblas_test_core(accel__openblas_core_for(accel__cpu_vector_level_get()));
    if (argc > 1 && !strcmp(argv[1], "ranks")) return ranks_main();
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_gemm_choice_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    accel__gemm_choice_set_timer(fake_time, &g_fake);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    RUN(test_winner_kept);
    RUN(test_hysteresis);
    RUN(test_rows_candidate);
    RUN(test_cache_file);
    RUN(test_cache_off_or_unwritable);
    RUN(test_forced_mode);
    RUN(test_real_timer);
    RUN(test_attention_tiles);
    RUN(test_weight_class);
    RUN(test_ranks_do_not_time);
    RUN(test_checkpoint_round_trip);
    RUN(test_load_other_thread_count);
    RUN(test_choice_not_a_candidate);
    RUN(test_low_precision_measured);
    RUN(test_dnnl_f32_candidate);
    RUN(test_install_names_lacking_provider);
    RUN(test_resume_on_saved_choices);
    clear_dir();
    rmdir(g_dir);
    accel__gemm_choice_set_timer(NULL, NULL);
    return check_summary();
}
