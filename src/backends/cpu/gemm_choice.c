/* The GEMM provider chosen by measurement, per dtype (f32, bf16, f16) and
 * shape class (gemm.h, "chosen by measurement"; docs/cpu.md "Measured
 * choice").
 *
 * A table of shape classes (dtype, transposes, log2 of M, N and K, threads)
 * and the provider each one runs on, filled the first time a class is seen
 * (or at accel__gemm_measure): every candidate times the class's GEMM on
 * scratch operands of its first shape, put out of the caches (where SSE2
 * has clflush) before each run but the first (one warm-up, then the median
 * of REPS; a class of other work,
 * attention's tiles, times what its caller's run does:
 * accel__gemm_choose_run), and the winner replaces the incumbent
 * only when it is faster by more than a margin: MARGIN against the entry
 * cached (or received) before, so noise cannot flip a measured choice back
 * and forth; RULE_MARGIN against the rule's choice, a prior no measurement
 * made, which a clear but small win (a weight's form on Zen 4: 7-12%)
 * should beat. A
 * timing in which a candidate's run failed (no memory for its operands)
 * chooses nothing: the class keeps the incumbent untimed for the process
 * and nothing is cached (timing_failed). The table is kept in memory and
 * in a JSON file per key (CPU model with its cpuid signature, so CPUs
 * whose brand strings a hypervisor shortens alike stay apart, usable features, OpenBLAS and
 * oneDNN versions, accel's version, threads):
 * ~/.cache/accel/gemm-<hash>.json
 * ($XDG_CACHE_HOME/accel; ACCEL_GEMM_CACHE=DIR relocates it, =off keeps it
 * in memory only). A file that cannot be read, parsed, or that holds another
 * key, is named in a warning and measured over; one that cannot be written
 * likewise (the choices then live for the process).
 *
 * The ranks of a job (accel_process_count() > 1) time nothing (each would
 * time under the others' load). At accelerator creation rank 0 reads its
 * cache and sends its table to the others, which replace theirs with it and
 * read no cache file after: every rank multiplies alike whatever its own
 * cache holds, and a class rank 0 had not cached takes the rule everywhere.
 * A checkpoint carries the table, so a resumed run multiplies as the saved
 * one did. Both carry every thread count's choices as a bundle:
 * {"tables": [<a cache file's JSON with its "threads">, ...]}, made and
 * installed here (accel__gemm_choices_bundle / _install); the accelerator
 * sends and saves it (src/accelerator/gemm_choices.c), so the backend knows
 * no process group. */
#include "backends/cpu/gemm.h"

#include <jansson.h>
#include <math.h>
#include <omp.h>
#ifdef ACCEL__GEMM_CHOICE_EVICTS
#include <emmintrin.h>
#endif
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/cpu.h"
#include "accel/tracking.h"
#include "core/cpuinfo.h"
#include "core/env.h"
#include "io/io_internal.h"
#include "tracking/tracking_internal.h"

/* A GEMM this small (multiply-adds) runs on the rule's provider unmeasured:
 * under ~0.5 ms on 2 threads, where timing costs more than a choice can
 * gain (and decode's few rows, which the skinny kernels take), unless the
 * caller asks for its rows to be timed (`skinny`: a class of their own). */
#define MEASURE_MIN_MACS (1ll << 26)
/* A challenger replaces a measured incumbent (cached, received) only when
 * it is this much faster, the rule's choice when it is RULE_MARGIN faster. */
#define MARGIN 0.10
#define RULE_MARGIN 0.05
enum { REPS = 3, MAX_CHOICES = 256 };

typedef struct choice {
    accel__gemm_class c;
    int provider;                             /* accel__gemm_provider */
    double seconds[ACCEL__GEMM_N_PROVIDERS]; /* the last measurement; 0: not timed */
    bool measured_here;                       /* in this process (not only read from the file) */
} choice;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static choice g_table[MAX_CHOICES];
static int g_n;
static int g_loaded_threads[64]; /* thread counts whose file was read */
static int g_n_loaded;
static bool g_env_read;
static bool g_fixed;       /* the table was sent or installed whole (accel__gemm_choices_*): no file is read */
static int g_measure_env;  /* ACCEL_GEMM_MEASURE: -1 unset, 0 never, 1 re-measure */
static char g_dir[1024];   /* the cache directory; "" when the cache is off */
static accel__gemm_timer g_timer;
static void *g_timer_ctx;

static const char *DT_NAMES[] = {"float32", "bfloat16", "float16"};

static int dt_index(accel_dtype dt) { return dt == ACCEL_BF16 ? 1 : dt == ACCEL_F16 ? 2 : 0; }
static accel_dtype dt_of(int i) { return i == 1 ? ACCEL_BF16 : i == 2 ? ACCEL_F16 : ACCEL_F32; }

static int log2_floor(int64_t v) {
    int l = 0;
    while (v > 1) v >>= 1, l++;
    return l;
}

/* ---- the environment */

static void env_read(void) {
    if (g_env_read) return;
    g_env_read = true;
    const char *m = getenv("ACCEL_GEMM_MEASURE");
    g_measure_env = !m ? -1 : !strcmp(m, "0") ? 0 : !strcmp(m, "1") ? 1 : -2; /* "" said too, as every variable */
    if (g_measure_env == -2) {
        fprintf(stderr, "accel: warning: ACCEL_GEMM_MEASURE=%s is neither 0 nor 1; measuring as by default\n", m);
        g_measure_env = -1;
    }
    /* The ranks of a job must multiply alike: none of them times (each
     * would time under the others' load and could choose otherwise); they
     * read the cache a single process wrote (`accel env --measure-gemm`),
     * else take the rule. */
    if (accel_process_count() > 1) g_measure_env = 0;
    const char *d = getenv("ACCEL_GEMM_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = accel__home_dir();
    int n = 0;
    if (d && !*d) /* set but empty: no directory, said (it was taken as off without a word) */
        fprintf(stderr, "accel: warning: ACCEL_GEMM_CACHE is set but empty; the GEMM choices live in memory only "
                        "(ACCEL_GEMM_CACHE=off says so without this warning)\n");
    if (d && (!strcmp(d, "off") || !strcmp(d, "0") || !*d)) g_dir[0] = 0;
    else if (d) n = snprintf(g_dir, sizeof g_dir, "%s", d);
    else if (xdg && *xdg) n = snprintf(g_dir, sizeof g_dir, "%s/accel", xdg);
    else if (home && *home) n = snprintf(g_dir, sizeof g_dir, "%s/.cache/accel", home);
    else g_dir[0] = 0;
    if (n >= (int)sizeof g_dir) { /* cut, it would name another directory */
        fprintf(stderr, "accel: warning: the GEMM choice cache directory %.60s... is longer than %d bytes; the "
                        "choices live in memory only\n", g_dir, (int)sizeof g_dir - 1);
        g_dir[0] = 0;
    }
}

bool accel__gemm_measure_off(void) {
    pthread_mutex_lock(&g_lock);
    env_read();
    bool off = g_measure_env == 0;
    pthread_mutex_unlock(&g_lock);
    return off;
}

/* ---- the cache file */

/* The candidates' kernels, counted up when what a candidate runs, or how
 * it is timed, changed so much that a timing of the old one would mislead
 * (a cached choice stands until `accel env --measure-gemm`): 2, attention's
 * native tiles handed to oneDNN dense and unscaled (brgemm where they had
 * run on gemm:jit, 5-20x slower a tile); 3, a GEMM class timed on operands
 * out of the caches (plain_cold), where it had been timed on warm ones. */
enum { KERNELS = 3 };

/* A class's "op" in the file: absent for one GEMM (files written before
 * attention's tiles had classes), "sdpa_tiles" for those, "weight" for a
 * GEMM whose op(B) is a layer's weight. */
static const char *OP_NAMES[] = {"gemm", "sdpa_tiles", "weight"};

/* What the choices of `threads` threads depend on, into out. The providers
 * this build knows are part of it: a build with a new candidate (dnnl_rows)
 * measures into a file of its own, and one without it never reads a file
 * that names it (it would take it for malformed and measure over it); so
 * are the ops its classes may stand for and the candidates' kernels
 * (KERNELS). */
static void cache_key(int threads, char *out, size_t n) {
    char versions[256], providers[128] = "", ops[64] = "";
    accel__gemm_library_versions(versions, sizeof versions);
    for (int p = ACCEL__GEMM_PROVIDER_OPENBLAS, used = 0; p < ACCEL__GEMM_N_PROVIDERS; p++)
        used += snprintf(providers + used, sizeof providers - (size_t)used, "%s%s", used ? "," : "",
                         accel__gemm_provider_name((accel__gemm_provider)p));
    for (int i = 0, used = 0; i < (int)(sizeof OP_NAMES / sizeof OP_NAMES[0]); i++)
        used += snprintf(ops + used, sizeof ops - (size_t)used, "%s%s", used ? "," : "", OP_NAMES[i]);
    char cpu[160];
    snprintf(out, n, "cpu=%s;features=%#x;%s;providers=%s;ops=%s;kernels=%d;accel=%s;threads=%d",
             accel__cpu_name(cpu, sizeof cpu), accel_cpu_info_get()->features, versions, providers, ops, KERNELS,
             ACCEL_VERSION_STRING, threads);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The file of `threads` threads' choices into out; false when the cache is off. */
static bool cache_path(int threads, char *out, size_t n) {
    if (!g_dir[0]) return false;
    char key[1024];
    cache_key(threads, key, sizeof key);
    snprintf(out, n, "%s/gemm-%016llx.json", g_dir, (unsigned long long)fnv1a(key));
    return true;
}

static int provider_of_name(const char *s) {
    for (int p = 0; p < ACCEL__GEMM_N_PROVIDERS; p++)
        if (s && !strcmp(s, accel__gemm_provider_name((accel__gemm_provider)p))) return p;
    return -1;
}

/* The op named s (NULL: a GEMM), or -1. */
static int op_of_name(const char *s) {
    if (!s) return ACCEL__GEMM_OP_GEMM;
    for (int i = 0; i < (int)(sizeof OP_NAMES / sizeof OP_NAMES[0]); i++)
        if (!strcmp(s, OP_NAMES[i])) return i;
    return -1;
}

/* The slot of c, or -1. Under the lock. */
static int find(const accel__gemm_class *c) {
    for (int i = 0; i < g_n; i++)
        if (!memcmp(&g_table[i].c, c, sizeof *c)) return i;
    return -1;
}

/* One entry of the file into *ch; NULL, or why it is malformed or names a
 * provider this build lacks (oneDNN's, without oneDNN). */
static const char *entry_parse(json_t *e, int threads, choice *ch) {
    memset(ch, 0, sizeof *ch);
    const char *dt = json_string_value(json_object_get(e, "dtype")), *tr = json_string_value(json_object_get(e, "trans"));
    json_t *m = json_object_get(e, "log2_m"), *n = json_object_get(e, "log2_n"), *k = json_object_get(e, "log2_k");
    json_t *rows = json_object_get(e, "rows"); /* a skinny class's M; absent for the others */
    const char *pname = json_string_value(json_object_get(e, "provider"));
    int p = provider_of_name(pname);
    int d = -1;
    for (int i = 0; i < 3; i++)
        if (dt && !strcmp(dt, DT_NAMES[i])) d = i;
    if (d < 0 || !tr || strlen(tr) != 2 || !strchr("NT", tr[0]) || !strchr("NT", tr[1]) || !json_is_integer(m) ||
        !json_is_integer(n) || !json_is_integer(k) || !pname || p == ACCEL__GEMM_PROVIDER_REFERENCE)
        return "a malformed entry";
    json_int_t lm = json_integer_value(m), ln = json_integer_value(n), lk = json_integer_value(k);
    if (lm < 0 || lm > 62 || ln < 0 || ln > 62 || lk < 0 || lk > 62) return "a malformed entry";
    json_int_t r = json_is_integer(rows) ? json_integer_value(rows) : 0;
    if ((rows && !json_is_integer(rows)) || r < 0 || r > 4 || (r && log2_floor(r) != lm)) return "a malformed entry";
    if (p < 0) return "an entry names a provider this build does not know (a newer build's?)";
    if (accel__gemm_is_dnnl(p) && !accel__gemm_have_dnnl())
        return "an entry names a oneDNN provider (dnnl, dnnl_rows or dnnl_f32) and this build has no oneDNN";
    json_t *opj = json_object_get(e, "op");
    int op = opj && !json_is_string(opj) ? -1 : op_of_name(json_string_value(opj));
    if (op < 0 || (r && op != ACCEL__GEMM_OP_GEMM)) return "a malformed entry"; /* rows: a GEMM's only */
    ch->c = (accel__gemm_class){dt_index(dt_of(d)), tr[0] == 'T', tr[1] == 'T', (int)lm, (int)ln, (int)lk, threads,
                                (int)r, op};
    ch->provider = p;
    json_t *secs = json_object_get(e, "seconds");
    for (int q = 0; q < ACCEL__GEMM_N_PROVIDERS; q++) {
        json_t *s = json_object_get(secs, accel__gemm_provider_name((accel__gemm_provider)q));
        if (json_is_number(s) && json_number_value(s) > 0) ch->seconds[q] = json_number_value(s);
    }
    return NULL;
}

/* Whether two of the n choices are of one class (a hand-edited file: which
 * is meant?). */
static bool class_twice(const choice *c, int n) {
    for (int i = 1; i < n; i++)
        for (int j = 0; j < i; j++)
            if (!memcmp(&c[i].c, &c[j].c, sizeof c[i].c)) return true;
    return false;
}

/* The choices of the file's JSON j into out[*n] (at most max) as choices of
 * `threads` threads; NULL, or why j is not such a file (of key, when key is
 * not NULL). */
static const char *table_parse(json_t *j, const char *key, int threads, choice *out, int max, int *n) {
    json_t *list = json_object_get(j, "choices");
    *n = 0;
    if (!json_is_string(json_object_get(j, "key"))) return "no \"key\"";
    if (key && strcmp(json_string_value(json_object_get(j, "key")), key))
        return "it holds the choices of another CPU, library version or thread count";
    if (!json_is_array(list)) return "no \"choices\" list";
    for (size_t i = 0; i < json_array_size(list); i++) {
        if (*n == max) return "more entries than a table holds";
        const char *why = entry_parse(json_array_get(list, i), threads, &out[*n]);
        if (why) return why;
        ++*n;
    }
    return class_twice(out, *n) ? "a class given twice" : NULL;
}

/* The table's choices of `threads` threads with their key, as the file
 * holds them; NULL when out of memory. Under the lock. */
static json_t *table_json(int threads) {
    char key[1024];
    cache_key(threads, key, sizeof key);
    json_t *list = json_array();
    for (int i = 0; list && i < g_n; i++) {
        const choice *ch = &g_table[i];
        if (ch->c.threads != threads) continue;
        char tr[3] = {ch->c.ta ? 'T' : 'N', ch->c.tb ? 'T' : 'N', 0};
        json_t *secs = json_object();
        for (int q = 0; q < ACCEL__GEMM_N_PROVIDERS; q++)
            if (ch->seconds[q] > 0)
                json_object_set_new(secs, accel__gemm_provider_name((accel__gemm_provider)q), json_real(ch->seconds[q]));
        json_t *e = json_pack("{s:s, s:s, s:i, s:i, s:i, s:s, s:o}", "dtype", DT_NAMES[ch->c.dt], "trans", tr,
                              "log2_m", ch->c.m, "log2_n", ch->c.n, "log2_k", ch->c.k, "provider",
                              accel__gemm_provider_name((accel__gemm_provider)ch->provider), "seconds", secs);
        if (e && ch->c.rows) json_object_set_new(e, "rows", json_integer(ch->c.rows));
        if (e && ch->c.op != ACCEL__GEMM_OP_GEMM) json_object_set_new(e, "op", json_string(OP_NAMES[ch->c.op]));
        json_array_append_new(list, e);
    }
    return list ? json_pack("{s:s, s:i, s:o}", "key", key, "threads", threads, "choices", list) : NULL;
}

/* Puts n parsed choices into the table: over the entries of their class
 * (`replace`), or only where the class has none. Under the lock. */
static void table_merge(const choice *in, int n, bool replace) {
    for (int i = 0; i < n; i++) {
        int at = find(&in[i].c);
        if (at >= 0 && replace) g_table[at] = in[i];
        else if (at < 0 && g_n < MAX_CHOICES) g_table[g_n++] = in[i];
    }
}

/* Reads the file of `threads` threads' choices into the table once. Under the lock. */
static void cache_load(int threads) {
    if (g_fixed) return;
    for (int i = 0; i < g_n_loaded; i++)
        if (g_loaded_threads[i] == threads) return;
    if (g_n_loaded < (int)(sizeof g_loaded_threads / sizeof g_loaded_threads[0]))
        g_loaded_threads[g_n_loaded++] = threads;
    char path[1200], key[1024];
    if (!cache_path(threads, path, sizeof path) || !accel__is_file(path)) return;
    cache_key(threads, key, sizeof key);
    json_t *j = accel__json_load_file(path);
    static choice parsed[MAX_CHOICES]; /* under the lock */
    int n = 0;
    const char *why = j ? table_parse(j, key, threads, parsed, MAX_CHOICES, &n) : accel_last_error();
    if (why) {
        fprintf(stderr, "accel: warning: GEMM choice cache %s ignored (%s); measuring again\n", path, why);
        accel_clear_error();
    } else {
        table_merge(parsed, n, false);
    }
    json_decref(j);
}

/* Writes the table's choices of `threads` threads to their file. Under the lock. */
static void cache_save(int threads) {
    char path[1200];
    if (!cache_path(threads, path, sizeof path)) return;
    json_t *j = table_json(threads);
    accel_status st = j ? accel__mkdirs(g_dir) : accel_set_error(ACCEL_ERR_OOM, "out of memory");
    if (st == ACCEL_OK) st = accel__json_save_file(path, j);
    if (st != ACCEL_OK) {
        static bool warned; /* once: the choices still hold for this process */
        if (!warned)
            fprintf(stderr, "accel: warning: GEMM choice cache %s cannot be written (%s); the choices live in memory "
                            "only\n", path, accel_last_error());
        warned = true;
        accel_clear_error();
    }
    json_decref(j);
}

/* ---- the whole table: with a checkpoint, from rank 0 (carried by src/accelerator/gemm_choices.c) */

/* Every thread count's choices, {"tables": [table_json, ...]} (this
 * process's thread count always, its file read first); NULL when out of
 * memory. Under the lock. */
static json_t *bundle_json(void) {
    int own = omp_get_max_threads(), counts[MAX_CHOICES + 1], nc = 0;
    cache_load(own);
    counts[nc++] = own;
    for (int i = 0; i < g_n; i++) {
        int t = g_table[i].c.threads, seen = 0;
        for (int j = 0; j < nc; j++) seen |= counts[j] == t;
        if (!seen) counts[nc++] = t;
    }
    json_t *tables = json_array();
    for (int j = 0; tables && j < nc; j++)
        if (json_array_append_new(tables, table_json(counts[j]))) tables = (json_decref(tables), NULL);
    return tables ? json_pack("{s:o}", "tables", tables) : NULL;
}

/* A bundle's choices into out[*n] (MAX_CHOICES); also a single table as
 * the cache file holds it (a checkpoint saved before bundles: this process's
 * thread count). NULL, or why j is no bundle. */
static const char *bundle_parse(json_t *j, choice *out, int *n) {
    json_t *tables = json_object_get(j, "tables");
    *n = 0;
    if (!tables) return table_parse(j, NULL, omp_get_max_threads(), out, MAX_CHOICES, n);
    if (!json_is_array(tables)) return "\"tables\" is no list";
    /* bundle_json writes one table per thread count of the choices and the
     * sender's own: at most MAX_CHOICES + 1. More (a hostile checkpoint's
     * 65536 empty tables) took minutes in the pairwise check below. */
    if (json_array_size(tables) > MAX_CHOICES + 1) return "more tables than a bundle holds (257)";
    for (size_t i = 0; i < json_array_size(tables); i++) {
        json_t *t = json_array_get(tables, i), *th = json_object_get(t, "threads");
        if (!json_is_integer(th) || json_integer_value(th) < 1 || json_integer_value(th) > 1 << 16)
            return "a table without its \"threads\"";
        for (size_t k = 0; k < i; k++)
            if (json_equal(json_object_get(json_array_get(tables, k), "threads"), th))
                return "a thread count's table given twice";
        int got;
        const char *why = table_parse(t, NULL, (int)json_integer_value(th), out + *n, MAX_CHOICES - *n, &got);
        if (why) return why;
        *n += got;
    }
    return NULL;
}

/* The parsed choices as the table's, pinned (never timed again unless
 * forced): over the classes they name (`replace_all` false) or instead of
 * the whole table. Under the lock. */
static void install(choice *in, int n, bool replace_all) {
    for (int i = 0; i < n; i++) in[i].measured_here = true;
    if (replace_all) g_n = 0;
    table_merge(in, n, true);
}

/* bundle_parse's scratch, parsed before g_lock is taken */
static pthread_mutex_t g_parse_lock = PTHREAD_MUTEX_INITIALIZER;
static choice g_parsed[MAX_CHOICES];

json_t *accel__gemm_choices_bundle(bool pin) {
    pthread_mutex_lock(&g_lock);
    env_read();
    json_t *j = bundle_json();
    if (pin) g_fixed = true;
    pthread_mutex_unlock(&g_lock);
    return j;
}

/* A bundle's n parsed choices as this process's: the first table (the
 * sender's own thread count, bundle_json) becomes this process's count,
 * should the counts differ, and wins over a table the bundle also holds for
 * this count (dropped, else the class would be there twice). Under
 * g_parse_lock. */
static int relabel(json_t *j, choice *in, int n) {
    json_t *first = json_object_get(json_array_get(json_object_get(j, "tables"), 0), "threads");
    int theirs = json_is_integer(first) ? (int)json_integer_value(first) : 0, own = omp_get_max_threads(), kept = 0;
    if (!theirs || theirs == own) return n;
    for (int i = 0; i < n; i++) {
        if (in[i].c.threads == own) continue;
        if (in[i].c.threads == theirs) in[i].c.threads = own;
        in[kept++] = in[i];
    }
    return kept;
}

/* The relabelled choices as the whole table, pinned: no cache file read
 * later adds to them, ACCEL_GEMM_MEASURE=1 does not re-time them. Under
 * both locks. */
static void install_all(json_t *j, int n) {
    n = relabel(j, g_parsed, n);
    env_read();
    install(g_parsed, n, true);
    g_fixed = true;
}

const char *accel__gemm_choices_install(json_t *j) {
    pthread_mutex_lock(&g_parse_lock);
    int n = 0;
    const char *why = bundle_parse(j, g_parsed, &n);
    if (!why) {
        pthread_mutex_lock(&g_lock);
        install_all(j, n);
        pthread_mutex_unlock(&g_lock);
    }
    pthread_mutex_unlock(&g_parse_lock);
    return why;
}

/* ---- timing */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A class's GEMM (shape M x N x K) on scratch operands (plain_cold makes
 * them); for a weight class also op(B)'s form in oneDNN's layout, which
 * oneDNN reads as a layer's weight GEMM does (NULL where it reads none). */
typedef struct plain_gemm {
    accel_dtype dt;
    bool ta, tb;
    int64_t M, N, K;
    void *A, *B;
    float *C;
    bool weight;
    void *form;
    size_t form_bytes;
} plain_gemm;

static size_t g_evicted; /* accel__gemm_choice_evicted_bytes; under g_lock */

/* Evicts the 64-byte lines of [p, p + bytes) from every cache level
 * (without SSE2's clflush a no-op: the timings stay warm). */
static void evict(const void *p, size_t bytes) {
#ifdef ACCEL__GEMM_CHOICE_EVICTS
    uintptr_t end = (uintptr_t)p + bytes;
    for (uintptr_t line = (uintptr_t)p & ~(uintptr_t)63; line < end; line += 64) {
        _mm_clflush((const void *)line);
        g_evicted += 64;
    }
    _mm_mfence();
#else
    (void)p, (void)bytes;
#endif
}

/* n x es bytes into *bytes; false when that overflows size_t (plain_cold
 * then reports the operands as out of memory). */
static bool operand_bytes(int64_t n, size_t es, size_t *bytes) {
    if (n < 0 || (uint64_t)n > SIZE_MAX / es) return false;
    *bytes = (size_t)n * es;
    return true;
}

/* Makes g's operands at the first call; after that, puts them out of the
 * caches, as a training step's large GEMMs find theirs: the activations
 * the forward saved and the gradients a backward reads come from memory,
 * and a candidate that copies (packs, reorders) its operands pays for
 * memory's latency there, not for the cache's: on the AMX Xeon the step's
 * weight gradients (dW = dY^T X, bf16) ran at ~0.65 of their warm timing,
 * the rate they have alone flushed (docs/cpu.md, "Measured choice"). Not
 * timed. */
static bool plain_cold(void *ctx, int p) {
    (void)p;
    plain_gemm *g = ctx;
    size_t es = accel_dtype_size(g->dt), a = 0, b = 0, c = 0;
    bool fits = operand_bytes(g->M * g->K, es, &a) && operand_bytes(g->K * g->N, es, &b) &&
                operand_bytes(g->M * g->N, sizeof(float), &c);
    if (fits && g->C) {
        evict(g->A, a), evict(g->B, b), evict(g->C, c), evict(g->form, g->form_bytes);
        return true;
    }
    if (fits) g->A = malloc(a), g->B = malloc(b), g->C = calloc(c, 1);
    if (g->A && g->B && g->C) {
        /* written, so that each page is memory of its own (calloc's could
         * all map the one zero page, which no eviction makes cold): bytes
         * 0x3c, small finite values in each dtype (bf16 and f32 0.0115,
         * f16 1.06) */
        memset(g->A, 0x3c, a), memset(g->B, 0x3c, b);
        /* a weight's form is made once per version of the weight, so here
         * once, untimed (then put out of the caches with the rest) */
        return !g->weight ||
               accel__gemm_scratch_form(g->dt, g->tb, g->N, g->K, g->B, &g->form, &g->form_bytes) == ACCEL_OK;
    }
    accel_set_error(ACCEL_ERR_OOM, "out of memory for a %lld x %lld x %lld GEMM's operands", (long long)g->M,
                    (long long)g->N, (long long)g->K);
    return false;
}

static bool plain_run(void *ctx, int p) {
    plain_gemm *g = ctx;
    return accel__gemm_on_form(p, g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->A, g->dt, g->ta ? g->M : g->K, g->B,
                               g->form, g->tb ? g->K : g->N, 0.0f, g->C, g->N) == ACCEL_OK;
}

/* The median of REPS runs of run on provider p, after one warm-up, each
 * after an untimed prepare where there is one; -1 with the run's error set
 * when one failed. */
static double time_provider(int p, accel__gemm_run prepare, accel__gemm_run run, void *ctx) {
    double t[REPS] = {0};
    bool ok = true;
    for (int r = -1; ok && r < REPS; r++) {
        if (prepare && !prepare(ctx, p)) return -1;
        double t0 = now();
        ok = run(ctx, p);
        if (r >= 0) t[r] = now() - t0;
    }
    if (!ok) return -1;
    for (int i = 1; i < REPS; i++) /* insertion sort: the median */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    return t[REPS / 2];
}

/* Times every candidate of c into ch->seconds and keeps the incumbent
 * unless another is faster by more than margin; false, the error set, when
 * a candidate's run failed (no memory for its operands, a provider's
 * error): a timing without every candidate chooses nothing. */
static bool measure(choice *ch, int incumbent, double margin, uint32_t candidates, accel__gemm_run prepare,
                    accel__gemm_run run, void *ctx) {
    const accel__gemm_class *c = &ch->c;
    for (int p = 0; p < ACCEL__GEMM_N_PROVIDERS; p++) {
        if (!(candidates & (1u << p))) continue;
        ch->seconds[p] =
            g_timer ? g_timer(g_timer_ctx, (accel__gemm_provider)p, c) : time_provider(p, prepare, run, ctx);
        if (ch->seconds[p] < 0) return false;
    }
    int best = incumbent;
    double inc = ch->seconds[incumbent] > 0 ? ch->seconds[incumbent] : INFINITY;
    for (int p = 0; p < ACCEL__GEMM_N_PROVIDERS; p++)
        if ((candidates & (1u << p)) && ch->seconds[p] > 0 && ch->seconds[p] < (1.0 - margin) * inc &&
            (best == incumbent || ch->seconds[p] < ch->seconds[best]))
            best = p;
    ch->provider = best;
    ch->measured_here = true;
    return true;
}

/* The classes whose timing failed in this process: they run on their
 * incumbent untimed (unless timed on demand) until the table is reset, and
 * nothing of theirs is kept, in memory or in the file, so that the next
 * process times them again. Under the lock. */
static accel__gemm_class g_failed[MAX_CHOICES];
static int g_n_failed;

static bool failed_before(const accel__gemm_class *c) {
    for (int i = 0; i < g_n_failed; i++)
        if (!memcmp(&g_failed[i], c, sizeof *c)) return true;
    return false;
}

/* Notes that c's timing failed (the error the run set, cleared here: the
 * op goes on on `provider`) and says why on stderr. Under the lock. */
static void timing_failed(const accel__gemm_class *c, int provider) {
    fprintf(stderr,
            "accel: warning: timing the providers of the %s %s class 2^%d x 2^%d x 2^%d (%d thread%s) failed (%s); it "
            "runs on %s, untimed and not cached\n",
            DT_NAMES[c->dt], OP_NAMES[c->op], c->m, c->n, c->k, c->threads, c->threads == 1 ? "" : "s",
            accel_last_error(), accel__gemm_provider_name((accel__gemm_provider)provider));
    accel_clear_error();
    if (!failed_before(c) && g_n_failed < MAX_CHOICES) g_failed[g_n_failed++] = *c;
}

accel__gemm_class accel__gemm_class_of(accel_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int op) {
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    return (accel__gemm_class){dt_index(dt), ta, tb, log2_floor(M), log2_floor(N), log2_floor(K), threads, 0, op};
}

/* accel__gemm_choose_run with an untimed prepare before each timed run
 * (NULL: none). */
static int choose(const accel__gemm_class *cls, int rule, uint32_t candidates, bool force, accel__gemm_run prepare,
                  accel__gemm_run run, void *ctx) {
    candidates |= 1u << rule;
    if (candidates == 1u << rule) return rule; /* nothing to choose between */
    accel__gemm_class c = *cls;
    int threads = c.threads;
    pthread_mutex_lock(&g_lock);
    env_read();
    cache_load(threads);
    int i = find(&c), provider = rule;
    /* a choice from elsewhere (a checkpoint, rank 0) may name a provider
     * that is no candidate here (e.g. dnnl for a dtype this oneDNN only
     * loops over): the rule's then */
    if (i >= 0 && (candidates & (1u << g_table[i].provider))) provider = g_table[i].provider;
    /* a weight class the table lacks takes the choice of the plain class
     * of its shape, which such GEMMs ran on before weight classes existed:
     * as its incumbent when timed, and untimed where the table was
     * installed whole (a checkpoint's, rank 0's: multiplied as they were) */
    bool inherited = false;
    if (i < 0 && c.op == ACCEL__GEMM_OP_WEIGHT) {
        accel__gemm_class plain = c;
        plain.op = ACCEL__GEMM_OP_GEMM;
        int j = find(&plain);
        if (j >= 0 && (candidates & (1u << g_table[j].provider))) provider = g_table[j].provider, inherited = g_fixed;
    }
    /* measure: a class not seen (unless ACCEL_GEMM_MEASURE=0), a cached one
     * under ACCEL_GEMM_MEASURE=1 or an explicit re-measure; never inside a
     * parallel region (the timings would be of one thread among others) */
    bool stale = i >= 0 && !g_table[i].measured_here && g_measure_env == 1;
    bool want = force || ((stale || (i < 0 && !inherited && g_measure_env != 0)) && !failed_before(&c));
    if (want && !omp_in_parallel() && (i >= 0 || g_n < MAX_CHOICES)) {
        choice m = {.c = c};
        if (i >= 0) m = g_table[i];
        /* the lock is held while timing: two threads must not time at once */
        double margin = i >= 0 ? MARGIN : RULE_MARGIN; /* a class in the table holds a measured choice */
        if (measure(&m, provider, margin, candidates | 1u << provider, prepare, run, ctx)) {
            if (i < 0) i = g_n++;
            g_table[i] = m;
            provider = m.provider;
            cache_save(threads);
        } else {
            timing_failed(&c, provider);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return provider;
}

int accel__gemm_choose_run(const accel__gemm_class *cls, int rule, uint32_t candidates, bool force,
                           accel__gemm_run run, void *ctx) {
    return choose(cls, rule, candidates, force, NULL, run, ctx);
}

/* accel__gemm_choose and _choose_weight: op ACCEL__GEMM_OP_GEMM or _WEIGHT. */
static int choose_gemm(accel_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int rule,
                       uint32_t candidates, bool force, bool skinny, int op) {
    skinny = skinny && M <= 4;
    if (!force && !skinny && (double)M * (double)N * (double)K < (double)MEASURE_MIN_MACS) return rule;
    accel__gemm_class c = accel__gemm_class_of(dt, ta, tb, M, N, K, op);
    if (skinny) c.rows = (int32_t)M;
    plain_gemm g = {dt, ta, tb, M, N, K, NULL, NULL, NULL, op == ACCEL__GEMM_OP_WEIGHT, NULL, 0};
    int provider = choose(&c, rule, candidates, force, plain_cold, plain_run, &g);
    free(g.A), free(g.B), free(g.C), accel_free(g.form);
    return provider;
}

int accel__gemm_choose(accel_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int rule,
                       uint32_t candidates, bool force, bool skinny) {
    return choose_gemm(dt, ta, tb, M, N, K, rule, candidates, force, skinny, ACCEL__GEMM_OP_GEMM);
}

int accel__gemm_choose_weight(accel_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int rule,
                              uint32_t candidates, bool force) {
    return choose_gemm(dt, ta, tb, M, N, K, rule, candidates, force, false, ACCEL__GEMM_OP_WEIGHT);
}

int accel__gemm_choice_classes(int threads, accel__gemm_class *out, int max) {
    pthread_mutex_lock(&g_lock);
    env_read();
    cache_load(threads);
    int n = 0;
    for (int i = 0; i < g_n && n < max; i++)
        if (g_table[i].c.threads == threads) out[n++] = g_table[i].c;
    pthread_mutex_unlock(&g_lock);
    return n;
}

void accel__gemm_choice_set_timer(accel__gemm_timer fn, void *ctx) {
    pthread_mutex_lock(&g_lock);
    g_timer = fn;
    g_timer_ctx = ctx;
    pthread_mutex_unlock(&g_lock);
}

size_t accel__gemm_choice_evicted_bytes(void) {
    pthread_mutex_lock(&g_lock);
    size_t n = g_evicted;
    pthread_mutex_unlock(&g_lock);
    return n;
}

void accel__gemm_choice_reset(void) {
    pthread_mutex_lock(&g_lock);
    g_n = 0;
    g_n_loaded = 0;
    g_n_failed = 0;
    g_env_read = false;
    g_fixed = false;
    pthread_mutex_unlock(&g_lock);
}

const char *accel__gemm_choices_describe(char *buf, size_t size) {
    if (!buf || !size) return buf;
    int threads = omp_get_max_threads();
    pthread_mutex_lock(&g_lock);
    env_read();
    cache_load(threads);
    char path[1200];
    size_t used = 0;
    int w = g_fixed ? snprintf(buf, size, "GEMM choices: %d, rank 0's (received at accelerator creation) or a "
                                          "checkpoint's\n", g_n)
            : cache_path(threads, path, sizeof path)
                ? snprintf(buf, size, "GEMM choices: %d measured, cached in %s\n", g_n, path)
                : snprintf(buf, size, "GEMM choices: %d measured, not cached (ACCEL_GEMM_CACHE=off, no HOME, or a "
                                           "directory name too long)\n", g_n);
    used = w > 0 && (size_t)w < size ? (size_t)w : size - 1;
    for (int i = 0; i < g_n && used + 1 < size; i++) {
        const choice *ch = &g_table[i];
        const char *pn = accel__gemm_provider_name((accel__gemm_provider)ch->provider);
        const char *ts = ch->c.threads == 1 ? "" : "s";
        char m[16];
        snprintf(m, sizeof m, ch->c.rows ? "=%d" : "~2^%d", ch->c.rows ? ch->c.rows : ch->c.m);
        if (ch->c.op == ACCEL__GEMM_OP_SDPA_TILES)
            w = snprintf(buf + used, size - used,
                         "  %s attention tiles queries~2^%d keys~2^%d D~2^%d %d thread%s: %s (", DT_NAMES[ch->c.dt],
                         ch->c.m, ch->c.n, ch->c.k, ch->c.threads, ts, pn);
        else
            w = snprintf(buf + used, size - used, "  %s %c%c%s M%s N~2^%d K~2^%d %d thread%s: %s (",
                         DT_NAMES[ch->c.dt], ch->c.ta ? 'T' : 'N', ch->c.tb ? 'T' : 'N',
                         ch->c.op == ACCEL__GEMM_OP_WEIGHT ? " weight" : "", m, ch->c.n, ch->c.k, ch->c.threads, ts,
                         pn);
        used += w > 0 ? (size_t)w : 0;
        for (int q = 0, first = 1; q < ACCEL__GEMM_N_PROVIDERS && used + 1 < size; q++)
            if (ch->seconds[q] > 0) {
                w = snprintf(buf + used, size - used, "%s%s %.3f ms", first ? "" : ", ",
                             accel__gemm_provider_name((accel__gemm_provider)q), 1e3 * ch->seconds[q]);
                used += w > 0 ? (size_t)w : 0;
                first = 0;
            }
        if (used + 1 < size) {
            w = snprintf(buf + used, size - used, ")\n");
            used += w > 0 ? (size_t)w : 0;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return buf;
}
