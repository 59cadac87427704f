/* bench_matmul: the GEMM shapes of a Llama training step (hidden 512, ffn
 * 1536, vocab 8192, B*T = 2048 tokens), tables of medians:
 *   1. per provider (OpenBLAS, oneDNN), the raw library call (cblas_sgemm on
 *      OpenBLAS's threads; a oneDNN matmul primitive made once) beside
 *      accel__gemm and accel_linear forward / dX / dW with that provider
 *      forced, interleaved: the overhead of accel around its GEMM;
 *   2. the GEMM providers per shape (src/backends/cpu/gemm.h): OpenBLAS
 *      f32, oneDNN f32 and oneDNN bf16 (bf16 operands, f32 result) through
 *      accel__gemm with the provider forced, and what auto picks here;
 *   3. oneDNN on the forward and dX pieces with the weight plain at every
 *      call vs kept in oneDNN's layout (accel__gemm_weight), f32 (and bf16
 *      where oneDNN has a bf16 matmul).
 * The CPU model and ISA, and the load average before and after, are printed.
 *
 *     build/bin/bench_matmul [out.md] [repeats] [packed|linear]
 *         (default bench/results/matmul.md, 7; "packed": table 3 alone,
 *         "linear": table 1 alone)
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "accel/cpu.h"
#include "backends/cpu/gemm.h"
#include "core/prepared.h"

#ifdef ACCEL_HAVE_DNNL
#include <dnnl.h>
#endif

/* The load average (1, 5, 15 min) into out. */
static const char *loadavg(char *out, size_t n) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l[3] = {0};
    if (!f || fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3) snprintf(out, n, "unknown");
    else snprintf(out, n, "%.2f %.2f %.2f", l[0], l[1], l[2]);
    if (f) fclose(f);
    return out;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef enum { FWD, DX, DW } piece;
static const char *PIECE[] = {"forward Y = X W^T (NT)", "dX = dY W (NN)", "dW += dY^T X (TN)"};

/* ---- the GEMM providers per shape */

/* The operands of a piece over x [R, NIN], w [NOUT, NIN], y [R, NOUT]
 * (f32 or bf16 copies), C being a separate f32 buffer. */
typedef struct piece_gemm {
    bool ta, tb;
    int64_t M, N, K, lda, ldb;
    const void *a, *b;
    float beta;
} piece_gemm;

static piece_gemm piece_operands(piece p, int64_t R, int64_t NIN, int64_t NOUT, const void *x, const void *w,
                                 const void *y) {
    if (p == FWD) /* Y [R, NOUT] = X W^T */
        return (piece_gemm){false, true, R, NOUT, NIN, NIN, NIN, x, w, 0.0f};
    if (p == DX) /* dX [R, NIN] = dY W */
        return (piece_gemm){false, false, R, NIN, NOUT, NOUT, NIN, y, w, 0.0f};
    return (piece_gemm){true, false, NOUT, NIN, R, NOUT, NIN, y, x, 1.0f}; /* dW += dY^T X */
}

/* A call's wall time and the CPU time of the process over it (the machine
 * is shared: the CPU time is what a call costs when others wait for it). */
typedef struct call_time {
    double wall, cpu;
} call_time;

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double piece_gflop(const piece_gemm *g) { return 2.0 * (double)g->M * (double)g->N * (double)g->K * 1e-9; }

/* One GEMM of the piece on dtype dt in the current mode, timed into *t:
 * accel__gemm on g->b, or with w (whose memory g->b is) accel__gemm_weight,
 * which reads w's form in oneDNN's layout where the provider is oneDNN;
 * bump: w's version moves first, so the call reorders w again. */
static accel_status gemm_once(accel_dtype dt, const piece_gemm *g, accel_tensor *w, bool bump, float *c,
                              call_time *t) {
    if (bump) accel_tensor_increment_version(w);
    double w0 = accel_now_seconds(), c0 = cpu_seconds();
    accel_status st = w ? accel__gemm_weight(g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->a, dt, g->lda, w, 0, g->ldb,
                                             g->beta, c, g->N)
                        : accel__gemm(g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->a, dt, g->lda, g->b, dt, g->ldb,
                                      g->beta, c, g->N);
    t->wall = accel_now_seconds() - w0;
    t->cpu = cpu_seconds() - c0;
    accel_step_reset();
    if (st != ACCEL_OK) fprintf(stderr, "bench_matmul: %s\n", accel_last_error());
    return st;
}

/* Median GFLOP/s of accel__gemm in the mode on dtype dt, or 0 when it fails. */
static double provider_gflops(accel__gemm_mode mode, accel_dtype dt, const piece_gemm *g, float *c, int reps) {
    if (accel__gemm_set_mode(mode) != ACCEL_OK) return 0.0;
    double t[100];
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up (creates oneDNN's primitive) */
        call_time ct;
        if (gemm_once(dt, g, NULL, false, c, &ct) != ACCEL_OK) return 0.0;
        if (r >= 0) t[r] = ct.wall;
    }
    return piece_gflop(g) / median(t, reps);
}

/* "218.4 (brg:avx2)"; "-" when oneDNN is not built in; a dtype oneDNN has
 * no matmul for on this CPU ran as f32 (ACCEL_GEMM=dnnl widens it). */
static void dnnl_cell(double gflops, accel_dtype dt, const piece_gemm *g, char *out, size_t n) {
    const char *impl = gflops > 0 ? accel__dnnl_impl(dt, g->ta, g->tb, g->M, g->N, g->K) : NULL;
    if (gflops > 0 && impl) snprintf(out, n, "%.1f (%s)", gflops, impl);
    else if (gflops > 0) snprintf(out, n, "%.1f (as f32: no %s matmul here)", gflops, accel_dtype_name(dt));
    else snprintf(out, n, "-");
    accel_clear_error();
}

static void provider_table(FILE *md, int reps, int64_t R, const char *const *names, const int64_t (*dims)[2],
                           int nshapes) {
    fprintf(md, "\n## GEMM providers per shape\n\n"
                "accel__gemm with the provider forced (ACCEL_GEMM=openblas / dnnl), %d threads, median of %d "
                "calls after one warm-up, GFLOP/s; oneDNN's implementation in parentheses. bf16: bf16 "
                "operands, f32 accumulation and result. \"auto\" is the provider ACCEL_GEMM=auto picks "
                "here for f32 / bf16. The machine is shared: expect +-15%% jitter.\n\n"
                "| layer | piece | M x N x K | OpenBLAS f32 | oneDNN f32 | oneDNN bf16 | auto f32 / bf16 |\n"
                "|---|---|---|---|---|---|---|\n",
            accel_num_threads(), reps);
    for (int s = 0; s < nshapes; s++) {
        int64_t NIN = dims[s][0], NOUT = dims[s][1];
        size_t big = (size_t)(R * (NIN > NOUT ? NIN : NOUT));
        float *x = malloc(sizeof(float) * big * 3 + sizeof(float) * (size_t)(NIN * NOUT)), *y = x + big,
              *c = y + big, *w = c + big;
        uint16_t *xb = malloc(sizeof(uint16_t) * (2 * big + (size_t)(NIN * NOUT))), *yb = xb + big, *wb = yb + big;
        for (size_t i = 0; i < big; i++) x[i] = (float)((int)(i % 13) - 6) * 0.1f, y[i] = (float)((int)(i % 7) - 3) * 0.1f;
        for (int64_t i = 0; i < NIN * NOUT; i++) w[i] = (float)((int)(i % 11) - 5) * 0.02f;
        accel_convert(xb, ACCEL_BF16, x, ACCEL_F32, big);
        accel_convert(yb, ACCEL_BF16, y, ACCEL_F32, big);
        accel_convert(wb, ACCEL_BF16, w, ACCEL_F32, (size_t)(NIN * NOUT));
        for (int p = FWD; p <= DW; p++) {
            piece_gemm gf = piece_operands(p, R, NIN, NOUT, x, w, y), gb = piece_operands(p, R, NIN, NOUT, xb, wb, yb);
            double ob = provider_gflops(ACCEL__GEMM_OPENBLAS, ACCEL_F32, &gf, c, reps);
            double df = provider_gflops(ACCEL__GEMM_DNNL, ACCEL_F32, &gf, c, reps);
            double db = provider_gflops(ACCEL__GEMM_DNNL, ACCEL_BF16, &gb, c, reps);
            accel__gemm_set_mode(ACCEL__GEMM_AUTO);
            const char *af = accel__gemm_provider_name(accel__gemm_provider_for(ACCEL_F32, gf.ta, gf.tb, gf.M, gf.N, gf.K));
            const char *ab = accel__gemm_provider_name(accel__gemm_provider_for(ACCEL_BF16, gb.ta, gb.tb, gb.M, gb.N, gb.K));
            char dfs[96], dbs[96];
            dnnl_cell(df, ACCEL_F32, &gf, dfs, sizeof dfs);
            dnnl_cell(db, ACCEL_BF16, &gb, dbs, sizeof dbs);
            fprintf(md, "| %s | %s | %lld x %lld x %lld | %.1f | %s | %s | %s / %s |\n", names[s], PIECE[p],
                    (long long)gf.M, (long long)gf.N, (long long)gf.K, ob, dfs, dbs, af, ab);
            printf("%-14s %-24s openblas f32 %7.1f  dnnl f32 %-26s dnnl bf16 %-30s auto %s/%s\n", names[s], PIECE[p],
                   ob, dfs, dbs, af, ab);
        }
        free(x);
        free(xb);
    }
}

/* ---- oneDNN with the weight plain at every call vs its form in oneDNN's layout */

/* The three ways of packed_row: the weight plain (oneDNN packs its panels
 * inside every call), its form, its form reordered again before the call. */
enum { PLAIN, PACKED, REORDERED, WAYS };

/* One row of the packed table: the forward or dX piece in dtype dt, the
 * ways interleaved call by call so that each sees the same load. */
static void packed_row(FILE *md, int reps, const char *name, piece p, accel_dtype dt, int64_t R, int64_t NIN,
                       int64_t NOUT) {
    size_t es = accel_dtype_size(dt), big = (size_t)(R * (NIN > NOUT ? NIN : NOUT));
    float *wide = malloc(sizeof(float) * big), *c = malloc(sizeof(float) * big);
    void *act = malloc(es * big);
    accel_tensor *w = accel_tensor_new(dt, ACCEL_SHAPE(NOUT, NIN), ACCEL_CPU_DEVICE);
    for (size_t i = 0; i < big; i++) wide[i] = (float)((int)(i % 13) - 6) * 0.1f;
    accel_convert(act, dt, wide, ACCEL_F32, big);
    for (int64_t i = 0; i < NIN * NOUT; i++) wide[i] = (float)((int)(i % 11) - 5) * 0.02f;
    accel_convert(w->data, dt, wide, ACCEL_F32, (size_t)(NIN * NOUT));
    piece_gemm g = piece_operands(p, R, NIN, NOUT, act, w->data, act);
    double wall[WAYS][100], cpu[WAYS][100], gf[WAYS] = {0}, cpu_gf[WAYS] = {0};
    uint64_t b0 = accel__prepared_stats_get().builds;
    bool ok = accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK, formed = false;
    for (int r = -1; r < reps && ok; r++) /* r = -1: warm-up (oneDNN's primitives, w's form) */
        for (int v = PLAIN; v < WAYS && ok; v++) {
            if (v == REORDERED && !(formed = accel__prepared_stats_get().builds > b0)) continue;
            call_time ct;
            ok = gemm_once(dt, &g, v == PLAIN ? NULL : w, v == REORDERED, c, &ct) == ACCEL_OK;
            if (r >= 0) wall[v][r] = ct.wall, cpu[v][r] = ct.cpu;
        }
    for (int v = PLAIN; v < WAYS && ok; v++)
        if (v != REORDERED || formed) {
            gf[v] = piece_gflop(&g) / median(wall[v], reps);
            cpu_gf[v] = piece_gflop(&g) / median(cpu[v], reps);
        }
    char reord[32] = "-";
    if (gf[REORDERED] > 0) snprintf(reord, sizeof reord, "%.1f", gf[REORDERED]);
    const char *layout = formed ? "reordered" : "none: oneDNN reads W as stored";
    double r_wall = gf[PLAIN] > 0 ? gf[PACKED] / gf[PLAIN] : 0, r_cpu = cpu_gf[PLAIN] > 0 ? cpu_gf[PACKED] / cpu_gf[PLAIN] : 0;
    fprintf(md, "| %s | %s | %lld x %lld x %lld | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %s | %s |\n", name,
            PIECE[p], (long long)g.M, (long long)g.N, (long long)g.K, accel_dtype_name(dt), gf[PLAIN], gf[PACKED],
            r_wall, cpu_gf[PLAIN], cpu_gf[PACKED], r_cpu, reord, layout);
    printf("%-14s %-24s %-8s wall: plain %6.1f packed %6.1f (x%.2f)  cpu: plain %6.1f packed %6.1f (x%.2f)  "
           "reorder each call %s  (%s)\n",
           name, PIECE[p], accel_dtype_name(dt), gf[PLAIN], gf[PACKED], r_wall, cpu_gf[PLAIN], cpu_gf[PACKED], r_cpu,
           reord, layout);
    accel_tensor_free(w);
    free(wide);
    free(c);
    free(act);
}

static void packed_table(FILE *md, int reps, int64_t R, const char *const *names, const int64_t (*dims)[2],
                         int nshapes) {
    /* oneDNN multiplies bf16 itself here (else ACCEL_GEMM=dnnl widens it per call: no form) */
    bool bf16 = accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK && !accel__gemm_widens_per_call(ACCEL_BF16);
    fprintf(md, "\n## oneDNN: the weight plain at every call vs kept in oneDNN's layout\n\n"
                "ACCEL_GEMM=dnnl, %d threads, median of %d calls after one warm-up, the three ways interleaved "
                "call by call; GFLOP/s of wall time, and GFLOP per second of the process's CPU time (what a call "
                "costs on a shared machine). plain: accel__gemm on the row-major weight (oneDNN packs its panels "
                "inside every call); packed: accel__gemm_weight, the weight's prepared form in the layout "
                "oneDNN's matmul picks (reordered once per version of the weight); reorder each call: packed "
                "with the weight's version moved before every call (one reorder per optimizer step, charged to "
                "one call; wall GFLOP/s). Where oneDNN reads the weight as stored there is no form and plain vs "
                "packed runs the same code: that row's ratio is the jitter. bf16 rows only where oneDNN has a "
                "bf16 matmul%s.\n\n"
                "| layer | piece | M x N x K | dtype | plain | packed | ratio | plain (CPU) | packed (CPU) | "
                "ratio (CPU) | reorder each call | weight form |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            accel_num_threads(), reps, bf16 ? "" : " (none here)");
    for (int s = 0; s < nshapes; s++)
        for (int p = FWD; p <= DX; p++) {
            packed_row(md, reps, names[s], (piece)p, ACCEL_F32, R, dims[s][0], dims[s][1]);
            if (bf16) packed_row(md, reps, names[s], (piece)p, ACCEL_BF16, R, dims[s][0], dims[s][1]);
        }
    accel__gemm_set_mode(ACCEL__GEMM_AUTO);
}

/* ---- accel_linear and accel__gemm against the raw library call, per provider */

/* Sleeps until both thread pools idle: after a call OpenBLAS's workers
 * spin (sched_yield) for 2^28 cycles (~70 ms) and the OpenMP workers for
 * GOMP_SPINCOUNT pauses (a few ms), and a pool spinning through the next
 * call takes a core from it: the raw OpenBLAS call's workers from accel's
 * call after it, accel's OpenMP workers from the raw call (in a profile
 * under load, libgomp's spin was 11% of the samples). So every timed call
 * starts with the other pool asleep, as in a training step, where OpenBLAS
 * never runs its own threads. */
static void settle(void) {
    struct timespec ts = {0, 120 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* The time of the piece through accel_linear (forward) or the linear node's
 * backward alone (what accel_backward runs for it), in the current mode. */
static call_time linear_once(piece p, accel_tensor *x, accel_tensor *w, accel_tensor *gy) {
    accel_requires_grad_(x, p == DX);
    accel_requires_grad_(w, p == DW);
    accel_tensor *y = p == FWD ? NULL : accel_linear(x, w, NULL);
    if (y) settle(); /* the forward's pool asleep again */
    bool prev = accel_set_grad_enabled(false);
    double w0 = accel_now_seconds(), c0 = cpu_seconds();
    if (p == FWD) accel_linear(x, w, NULL);
    else if (y->grad_fn->backward(y->grad_fn, gy) != ACCEL_OK) fprintf(stderr, "%s\n", accel_last_error());
    call_time t = {accel_now_seconds() - w0, cpu_seconds() - c0};
    accel_set_grad_enabled(prev);
    x->grad = NULL; /* x is a step tensor: its grad dies with the step */
    accel_step_reset();
    return t;
}

/* The library's own call for a piece, set up once outside the timing:
 * cblas_sgemm on OpenBLAS's own threads, or a oneDNN matmul primitive on the
 * same plain operands (its memory objects and stream made once). */
typedef struct raw_call {
    accel__gemm_provider p;
    piece_gemm g;
    float *c;
#ifdef ACCEL_HAVE_DNNL
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3];
    dnnl_stream_t stream;
#endif
} raw_call;

#ifdef ACCEL_HAVE_DNNL
static dnnl_engine_t raw_engine;

/* op(A) [M, K], op(B) [K, N] by strides, C [M, N]; beta as a sum post-op. */
static bool raw_dnnl_init(raw_call *r) {
    const piece_gemm *g = &r->g;
    if (!raw_engine && dnnl_engine_create(&raw_engine, dnnl_cpu, 0) != dnnl_success) return false;
    dnnl_memory_desc_t md[3];
    dnnl_dims_t ad = {g->M, g->K}, bd = {g->K, g->N}, cd = {g->M, g->N};
    dnnl_dims_t as = {g->ta ? 1 : g->lda, g->ta ? g->lda : 1}, bs = {g->tb ? 1 : g->ldb, g->tb ? g->ldb : 1},
                cs = {g->N, 1};
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    dnnl_matmul_desc_t mm;
    dnnl_primitive_desc_t pd;
    bool ok = dnnl_memory_desc_init_by_strides(&md[0], 2, ad, dnnl_f32, as) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&md[1], 2, bd, dnnl_f32, bs) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&md[2], 2, cd, dnnl_f32, cs) == dnnl_success &&
              dnnl_matmul_desc_init(&mm, &md[0], &md[1], NULL, &md[2]) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (!ok) return false;
    if (g->beta != 0.0f && dnnl_post_ops_create(&po) == dnnl_success) {
        dnnl_post_ops_append_sum(po, g->beta);
        dnnl_primitive_attr_set_post_ops(attr, po);
        dnnl_post_ops_destroy(po);
    }
    ok = dnnl_primitive_desc_create(&pd, &mm, attr, raw_engine, NULL) == dnnl_success;
    dnnl_primitive_attr_destroy(attr);
    if (!ok) return false;
    ok = dnnl_primitive_create(&r->prim, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    const void *p[3] = {g->a, g->b, r->c};
    for (int i = 0; i < 3 && ok; i++) ok = dnnl_memory_create(&r->mem[i], &md[i], raw_engine, (void *)p[i]) == dnnl_success;
    return ok && dnnl_stream_create(&r->stream, raw_engine, dnnl_stream_default_flags) == dnnl_success;
}

static void raw_dnnl_free(raw_call *r) {
    for (int i = 0; i < 3; i++)
        if (r->mem[i]) dnnl_memory_destroy(r->mem[i]);
    if (r->stream) dnnl_stream_destroy(r->stream);
    if (r->prim) dnnl_primitive_destroy(r->prim);
}
#endif

/* The time of one raw call. */
static call_time raw_once(raw_call *r) {
    const piece_gemm *g = &r->g;
    double w0, c0;
    if (r->p == ACCEL__GEMM_PROVIDER_OPENBLAS) {
        /* accel leaves OpenBLAS single-threaded (it runs GEMM blocks on its
         * own OpenMP threads); the raw call gets OpenBLAS's threads back */
        openblas_set_num_threads(accel_num_threads());
        w0 = accel_now_seconds(), c0 = cpu_seconds();
        cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)g->M,
                    (int)g->N, (int)g->K, 1.0f, g->a, (int)g->lda, g->b, (int)g->ldb, g->beta, r->c, (int)g->N);
    } else {
        w0 = accel_now_seconds(), c0 = cpu_seconds();
#ifdef ACCEL_HAVE_DNNL
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, r->mem[0]}, {DNNL_ARG_WEIGHTS, r->mem[1]}, {DNNL_ARG_DST, r->mem[2]}};
        if (dnnl_primitive_execute(r->prim, r->stream, 3, args) != dnnl_success ||
            dnnl_stream_wait(r->stream) != dnnl_success)
            fprintf(stderr, "bench_matmul: raw oneDNN matmul failed\n");
#endif
    }
    return (call_time){accel_now_seconds() - w0, cpu_seconds() - c0};
}

/* One row per (shape, piece, provider): the raw call, accel__gemm and
 * accel_linear with the provider forced, interleaved call by call so that
 * each sees the same load; medians. Returns the worst accel_linear / raw. */
static double linear_table(FILE *md, int reps, int64_t R, const char *const *names, const int64_t (*dims)[2],
                           int nshapes) {
    fprintf(md, "\n## accel_linear and accel__gemm vs the raw library call (f32)\n\n"
                "Per provider: raw = the library called directly (OpenBLAS: cblas_sgemm on OpenBLAS's own %d "
                "threads; oneDNN: a matmul primitive on the same plain operands, created once); accel__gemm "
                "and accel_linear (forward, or the linear node's backward computing only that gradient) with "
                "ACCEL_GEMM forced to the provider (oneDNN: accel_linear reads the weight's form in oneDNN's "
                "layout where it has one). %d threads, median of %d rounds after one warm-up, the three calls "
                "interleaved in each round, each call started 120 ms after the one before (both thread pools "
                "asleep: neither spins through the other's call); GFLOP/s of wall time. ratio = raw time / accel time (1.00: no "
                "overhead); the CPU columns are the same ratios of the process's CPU time over each call (on a "
                "shared machine the steadier figure).\n\n"
                "| layer | piece | M x N x K | provider | raw | accel__gemm | accel_linear | gemm / raw | "
                "linear / raw | gemm / raw (CPU) | linear / raw (CPU) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
            accel_num_threads(), accel_num_threads(), reps);
    double worst = 1e9;
    int nprov = accel__gemm_have_dnnl() ? 2 : 1;
    for (int s = 0; s < nshapes; s++) {
        int64_t NIN = dims[s][0], NOUT = dims[s][1];
        accel_tensor *w = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(NOUT, NIN), ACCEL_CPU_DEVICE);
        accel_rng rng;
        accel_rng_init(&rng, 1);
        accel_rng_normal_(&rng, w, 0.0, 0.02);
        size_t big = (size_t)(R * (NIN > NOUT ? NIN : NOUT));
        float *rx = malloc(sizeof(float) * (size_t)(R * NIN)), *ry = malloc(sizeof(float) * (size_t)(R * NOUT));
        float *rw = malloc(sizeof(float) * (size_t)(NOUT * NIN)), *c = calloc(big, sizeof(float)),
              *c2 = calloc(big, sizeof(float));
        memcpy(rw, w->data, sizeof(float) * (size_t)(NOUT * NIN));
        for (int64_t i = 0; i < R * NIN; i++) rx[i] = (float)((i % 13) - 6) * 0.1f;
        for (int64_t i = 0; i < R * NOUT; i++) ry[i] = (float)((i % 7) - 3) * 0.1f;
        for (int p = FWD; p <= DW; p++)
            for (int v = 0; v < nprov; v++) {
                accel__gemm_provider prov = v ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS;
                raw_call raw = {.p = prov, .g = piece_operands(p, R, NIN, NOUT, rx, rw, ry), .c = c};
#ifdef ACCEL_HAVE_DNNL
                if (prov == ACCEL__GEMM_PROVIDER_DNNL && !raw_dnnl_init(&raw)) {
                    fprintf(stderr, "bench_matmul: cannot make the raw oneDNN matmul\n");
                    raw_dnnl_free(&raw);
                    continue;
                }
#endif
                accel__gemm_set_mode(v ? ACCEL__GEMM_DNNL : ACCEL__GEMM_OPENBLAS);
                double t[3][100], cpu[3][100]; /* raw, accel__gemm, accel_linear */
                for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
                    call_time ct[3];
                    settle();
                    ct[0] = raw_once(&raw);
                    settle();
                    gemm_once(ACCEL_F32, &raw.g, NULL, false, c2, &ct[1]);
                    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(R, NIN), rx);
                    accel_tensor *gy = accel_from_floats(ACCEL_SHAPE(R, NOUT), ry);
                    settle();
                    ct[2] = linear_once((piece)p, x, w, gy);
                    for (int k = 0; k < 3 && r >= 0; k++) t[k][r] = ct[k].wall, cpu[k][r] = ct[k].cpu;
                }
#ifdef ACCEL_HAVE_DNNL
                raw_dnnl_free(&raw);
#endif
                double gf = piece_gflop(&raw.g), mr = median(t[0], reps), mg = median(t[1], reps),
                       ml = median(t[2], reps), cr = median(cpu[0], reps), cg = median(cpu[1], reps),
                       cl = median(cpu[2], reps);
                worst = mr / ml < worst ? mr / ml : worst;
                const char *pn = accel__gemm_provider_name(prov);
                fprintf(md, "| %s | %s | %lld x %lld x %lld | %s | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f |\n",
                        names[s], PIECE[p], (long long)raw.g.M, (long long)raw.g.N, (long long)raw.g.K, pn, gf / mr,
                        gf / mg, gf / ml, mr / mg, mr / ml, cr / cg, cr / cl);
                printf("%-14s %-24s %-8s raw %7.1f  gemm %7.1f  linear %7.1f GFLOP/s  gemm/raw %.2f  linear/raw %.2f"
                       "  (CPU time: %.2f %.2f)\n",
                       names[s], PIECE[p], pn, gf / mr, gf / mg, gf / ml, mr / mg, mr / ml, cr / cg, cr / cl);
                fflush(stdout);
            }
        free(rx);
        free(ry);
        free(rw);
        free(c);
        free(c2);
        accel_tensor_free(w);
    }
    accel__gemm_set_mode(ACCEL__GEMM_AUTO);
    fprintf(md, "\nWorst accel_linear / raw: %.2f\n", worst);
    return worst;
}

/* The load average after the run, into the table and on stdout; closes md. */
static void finish(FILE *md) {
    char load[64];
    loadavg(load, sizeof load);
    fprintf(md, "\nLoad average after: %s\n", load);
    printf("load average after: %s\n", load);
    fclose(md);
}

int main(int argc, char **argv) {
    const char *out_path = argc > 1 ? argv[1] : "bench/results/matmul.md";
    if (out_path[0] == '-') { /* "--help" was once taken for the output file */
        fprintf(stderr, "usage: bench_matmul [OUT.md (default bench/results/matmul.md)] [REPS (default 7)] [packed]\n");
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (reps < 1 || reps > 100) reps = 7;
    bool packed_only = argc > 3 && !strcmp(argv[3], "packed"), linear_only = argc > 3 && !strcmp(argv[3], "linear");
    const int64_t R = 2048;
    struct { const char *name; int64_t in, out; } shapes[] = {
        {"attn q/o proj", 512, 512}, {"mlp up/gate", 512, 1536}, {"mlp down", 1536, 512}, {"lm_head", 512, 8192}};
    const char *names[4];
    int64_t dims[4][2];
    for (int s = 0; s < 4; s++) names[s] = shapes[s].name, dims[s][0] = shapes[s].in, dims[s][1] = shapes[s].out;
    FILE *md = fopen(out_path, "w");
    if (!md) {
        fprintf(stderr, "bench_matmul: cannot write %s\n", out_path);
        return 1;
    }
    char cpu[512], gemm[512];
    accel_cpu_describe(cpu, sizeof cpu);
    accel__gemm_describe(gemm, sizeof gemm);
    char load[64];
    loadavg(load, sizeof load);
    printf("%s%sload average before: %s\n\n", cpu, gemm, load);
    fprintf(md, "# Llama step GEMMs\n\n```\n%s%sload average before: %s\n```\n", cpu, gemm, load);
    if (packed_only) {
        if (accel__gemm_have_dnnl()) packed_table(md, reps, R, names, (const int64_t(*)[2])dims, 4);
        finish(md);
        accel_thread_cleanup();
        return 0;
    }
    double worst = linear_table(md, reps, R, names, (const int64_t(*)[2])dims, 4);
    if (linear_only) {
        finish(md);
        printf("worst accel_linear / raw %.2f; table written to %s\n", worst, out_path);
        accel_thread_cleanup();
        return 0;
    }
    provider_table(md, reps, R, names, (const int64_t(*)[2])dims, 4);
    if (accel__gemm_have_dnnl()) packed_table(md, reps, R, names, (const int64_t(*)[2])dims, 4);
    finish(md);
    printf("worst accel_linear / raw %.2f; table written to %s\n", worst, out_path);
    accel_thread_cleanup();
    return 0;
}
