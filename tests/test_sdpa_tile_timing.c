/* Attention's tile timing at long contexts (attention_kernels.c, "the
 * provider, measured per tile class"; gemm_choice.c), watched through the
 * library's allocator (accel_set_allocator), so nothing here depends on how
 * fast anything runs:
 *   - a class is timed on a window of its keys: the timing's peak
 *     allocation is the same at Tk = 4096 and Tk = 128k (head dim 128) and
 *     a few MB a thread, where a whole row of 128k keys took ~340 MB;
 *   - every allocation refused while the op times its class: the op still
 *     gives the right result, on the rule's provider, with a warning naming
 *     the failure, and nothing is cached (nor timed again in the process);
 *   - a long context's class goes to the cache file and is read back
 *     untimed. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

/* ---- the allocator: live bytes, their peak, and refusals on demand */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t g_live, g_peak;
static bool g_refuse;

/* A block's size and alignment sit in the 16 bytes below what the caller gets. */
static void *t_alloc(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    if (align < 16) align = 16;
    pthread_mutex_lock(&g_mu);
    char *base = g_refuse ? NULL : aligned_alloc(align, (bytes + 2 * align - 1) / align * align);
    if (base) {
        g_live += bytes;
        if (g_live > g_peak) g_peak = g_live;
    }
    pthread_mutex_unlock(&g_mu);
    if (!base) return NULL;
    size_t *h = (size_t *)(base + align);
    h[-1] = bytes, h[-2] = align;
    return h;
}

static void t_free(void *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    size_t *h = p;
    pthread_mutex_lock(&g_mu);
    g_live -= h[-1];
    pthread_mutex_unlock(&g_mu);
    free((char *)p - h[-2]);
}

/* ---- the choice table's environment */

static char g_dir[256];

/* Starts over (the table forgotten) with the cache in dir, measuring unless
 * measure is "0". */
static void restart(const char *dir, const char *measure) {
    setenv("ACCEL_GEMM_CACHE", dir, 1);
    if (measure) setenv("ACCEL_GEMM_MEASURE", measure, 1);
    else unsetenv("ACCEL_GEMM_MEASURE");
    accel__gemm_choice_reset();
}

/* The cache file's tile classes of 2^log2_keys keys: how many, and the
 * provider named by the last one into name (n bytes). */
static int file_tiles(int log2_keys, char *name, size_t n) {
    char cmd[512], path[512] = "";
    snprintf(cmd, sizeof cmd, "ls %s/gemm-*.json 2>/dev/null | head -1", g_dir);
    FILE *p = popen(cmd, "r");
    if (p && fgets(path, sizeof path, p)) path[strcspn(path, "\n")] = 0;
    if (p) pclose(p);
    json_t *j = path[0] ? json_load_file(path, 0, NULL) : NULL;
    json_t *list = json_object_get(j, "choices");
    int found = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *e = json_array_get(list, i);
        const char *op = json_string_value(json_object_get(e, "op"));
        if (!op || strcmp(op, "sdpa_tiles") || json_integer_value(json_object_get(e, "log2_n")) != log2_keys) continue;
        found++;
        snprintf(name, n, "%s", json_string_value(json_object_get(e, "provider")));
    }
    json_decref(j);
    return found;
}

static void clear_dir(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -f %s/gemm-*.json", g_dir);
    CHECK(system(cmd) == 0);
}

/* Tile classes in the table (this process's thread count). */
static int table_tiles(void) {
    accel__gemm_class c[256];
    int n = accel__gemm_choice_classes(accel_num_threads(), c, 256), tiles = 0;
    for (int i = 0; i < n; i++) tiles += c[i].op == ACCEL__GEMM_OP_SDPA_TILES;
    return tiles;
}

enum { HEAD = 128, LONG = 1 << 17 };

/* The peak of live bytes, above those live before, while the class of dt,
 * Tk keys and head dim HEAD is timed; its provider into *p. */
static size_t timing_peak(accel_dtype dt, int64_t Tk, int *p) {
    pthread_mutex_lock(&g_mu);
    size_t before = g_live;
    g_peak = before;
    pthread_mutex_unlock(&g_mu);
    *p = accel__cpu_sdpa_measure(dt, Tk, HEAD);
    pthread_mutex_lock(&g_mu);
    size_t peak = g_peak - before;
    pthread_mutex_unlock(&g_mu);
    return peak;
}

/* The timing's memory does not grow with Tk: a window of 2048 keys (its
 * batch 2 x (Q, K, V, dO, P) = 1.3M floats a thread at head dim 128). */
static void test_timing_memory_bounded(void) {
    restart("off", NULL);
    static const accel_dtype DT[] = {ACCEL_F32, ACCEL_BF16};
    for (int i = 0; i < 2; i++) {
        int p_short, p_long;
        timing_peak(DT[i], 256, &p_short); /* what a first use loads once (oneDNN's plug-in) */
        size_t at_short = timing_peak(DT[i], 4096, &p_short), at_long = timing_peak(DT[i], LONG, &p_long);
        CHECK(p_short >= 0 && p_long >= 0);
        CHECK_MSG(at_long > 0, "%s: the timing allocated nothing through the library's allocator",
                  accel_dtype_name(DT[i]));
        CHECK_MSG(at_long == at_short, "%s: %zu bytes at Tk = 128k, %zu at Tk = 4096", accel_dtype_name(DT[i]),
                  at_long, at_short);
        CHECK_MSG(at_long <= (size_t)accel_num_threads() * (8u << 20), "%s: %zu bytes for %d threads",
                  accel_dtype_name(DT[i]), at_long, accel_num_threads());
    }
}

/* accel_sdpa(q, k, v) with every allocation refused, its stderr into buf
 * (n bytes, NUL-terminated). */
static accel_tensor *sdpa_refused(accel_tensor *q, accel_tensor *k, accel_tensor *v, char *buf, size_t n) {
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    CHECK(saved >= 0 && tmp);
    dup2(fileno(tmp), 2);
    g_refuse = true;
    accel_tensor *o = accel_sdpa(q, k, v, true, 0.0);
    g_refuse = false;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t got = fread(buf, 1, n - 1, tmp);
    buf[got] = 0;
    fclose(tmp);
    return o;
}

/* Every allocation refused while the op times its tile class: the op runs
 * on the rule's provider and is right; the warning names the failure;
 * nothing is cached, and the class is not timed again in this process. */
static void test_refused_timing(void) {
    enum { B = 1, H = 2, T = 256, D = 64 };
    accel_tensor *q = gc_randn(1, ACCEL_SHAPE(B, H, T, D)), *k = gc_randn(2, ACCEL_SHAPE(B, H, T, D)),
                 *v = gc_randn(3, ACCEL_SHAPE(B, H, T, D));
    accel_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) accel_requires_grad_(in[i], false); /* no tape: the op alone allocates */
    accel_k_sdpa_dims d = {.B = B, .H = H, .Hkv = H, .Tq = T, .Tk = T, .D = D, .Dv = D};
    clear_dir();
    restart(g_dir, "0");
    bool prev = accel_set_reference_kernels(true);
    accel_tensor *want = accel_tensor_clone_persistent(accel_sdpa(q, k, v, true, 0.0), ACCEL_CPU_DEVICE);
    accel_set_reference_kernels(prev);
    int rule = accel__cpu_sdpa_provider(ACCEL_F32, &d);
    CHECK(want && rule >= 0 && accel_sdpa(q, k, v, true, 0.0)); /* the step arena grown to the op's needs */
    accel_step_reset();
    restart(g_dir, NULL);
    char log[2048];
    accel_tensor *o = sdpa_refused(q, k, v, log, sizeof log);
    CHECK_MSG(o != NULL, "%s", accel_last_error());
    CHECK(fx_compare("sdpa after a refused timing", o, want, 1e-4, 1e-5) == 0);
    CHECK_STR_CONTAINS(log, "float32 sdpa_tiles class 2^6 x 2^8 x 2^6");
    CHECK_STR_CONTAINS(log, "out of memory");
    CHECK_STR_CONTAINS(log, "untimed and not cached");
    char name[64];
    CHECK(table_tiles() == 0 && file_tiles(8, name, sizeof name) == 0);
    /* not timed again in this process: the rule, untimed */
    CHECK(accel__cpu_sdpa_provider(ACCEL_F32, &d) == rule && table_tiles() == 0);
    /* a new process times it */
    restart(g_dir, NULL);
    CHECK(accel__cpu_sdpa_provider(ACCEL_F32, &d) >= 0 && table_tiles() == 1 && file_tiles(8, name, sizeof name) == 1);
    accel_step_reset();
    accel_tensor_free(want);
    for (int i = 0; i < 3; i++) accel_tensor_free(in[i]);
}

static int g_timed;

static double count_time(void *ctx, accel__gemm_provider p, const accel__gemm_class *c) {
    (void)ctx, (void)p, (void)c;
    g_timed++;
    return 1.0;
}

/* A 128k-key class measured for real, written to the file with its op and
 * keys and read back by the next process untimed. */
static void test_long_class_round_trip(void) {
    clear_dir();
    restart(g_dir, NULL);
    int p = accel__cpu_sdpa_measure(ACCEL_F32, LONG, HEAD);
    CHECK(p >= 0);
    char name[64] = "";
    CHECK(file_tiles(17, name, sizeof name) == 1);
    CHECK_MSG(p >= 0 && !strcmp(name, accel__gemm_provider_name((accel__gemm_provider)p)), "file %s, measured %d",
              name, p);
    restart(g_dir, NULL);
    accel__gemm_choice_set_timer(count_time, NULL);
    accel_k_sdpa_dims d = {.B = 1, .H = 1, .Hkv = 1, .Tq = 64, .Tk = LONG, .D = HEAD, .Dv = HEAD};
    CHECK(accel__cpu_sdpa_provider(ACCEL_F32, &d) == p && g_timed == 0);
    char buf[4096];
    CHECK_STR_CONTAINS(accel__gemm_choices_describe(buf, sizeof buf), "float32 attention tiles queries~2^6 keys~2^17 D~2^7");
    accel__gemm_choice_set_timer(NULL, NULL);
}

int main(void) {
    accel_allocator a = {t_alloc, t_free, NULL};
    accel_set_allocator(&a); /* before anything allocates */
    if (!(accel__gemm_tiles_candidates(ACCEL_F32) & ~(1u << ACCEL__GEMM_PROVIDER_OPENBLAS))) {
        fprintf(stderr, "oneDNN not built in: the tiles have one candidate, nothing is timed\n");
        return 0;
    }
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_sdpa_tile_timing_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    RUN(test_timing_memory_bounded);
    RUN(test_refused_timing);
    RUN(test_long_class_round_trip);
    clear_dir();
    rmdir(g_dir);
    accel_thread_cleanup();
    return check_summary();
}
