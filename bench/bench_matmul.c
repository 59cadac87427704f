/* bench_matmul: the GEMM shapes of a Llama training step (hidden 512, ffn
 * 1536, vocab 8192, B*T = 2048 tokens), two tables of medians:
 *   1. accel_linear forward / dX / dW vs raw cblas_sgemm (f32): the
 *      overhead of the op around its GEMM;
 *   2. the GEMM providers per shape (src/backends/cpu/gemm.h): OpenBLAS
 *      f32, oneDNN f32 and oneDNN bf16 (bf16 operands, f32 result) through
 *      accel__gemm with the provider forced, and what auto picks here;
 *   3. oneDNN on the forward and dX pieces with the weight plain at every
 *      call vs kept in oneDNN's layout (accel__gemm_weight), f32 (and bf16
 *      where oneDNN has a bf16 matmul).
 * The CPU model and ISA are printed on top.
 *
 *     build/bin/bench_matmul [out.md] [repeats] [packed]
 *         (default bench/results/matmul.md, 7; "packed": table 3 alone)
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "accel/cpu.h"
#include "backends/cpu/gemm.h"
#include "core/prepared.h"

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

/* Seconds of one raw sgemm of the piece. */
static double raw_once(piece p, int64_t R, int64_t NIN, int64_t NOUT, float *x, float *w, float *y) {
    /* accel leaves OpenBLAS single-threaded (it runs GEMM blocks on its own
     * OpenMP threads); the raw baseline gets OpenBLAS's own threads back. */
    openblas_set_num_threads(accel_num_threads());
    double t0 = accel_now_seconds();
    if (p == FWD)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)R, (int)NOUT, (int)NIN, 1.0f, x, (int)NIN, w, (int)NIN, 0.0f, y, (int)NOUT);
    else if (p == DX) /* x <- y w */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)R, (int)NIN, (int)NOUT, 1.0f, y, (int)NOUT, w, (int)NIN, 0.0f, x, (int)NIN);
    else /* w += y^T x */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)NOUT, (int)NIN, (int)R, 1.0f, y, (int)NOUT, x, (int)NIN, 1.0f, w, (int)NIN);
    return accel_now_seconds() - t0;
}

/* Seconds of the same piece through accel_linear (forward) or its backward. */
static double accel_once(piece p, accel_tensor *x, accel_tensor *w, accel_tensor *gy) {
    accel_requires_grad_(x, p == DX);
    accel_requires_grad_(w, p == DW);
    double t;
    if (p == FWD) {
        bool prev = accel_set_grad_enabled(false);
        double t0 = accel_now_seconds();
        accel_linear(x, w, NULL);
        t = accel_now_seconds() - t0;
        accel_set_grad_enabled(prev);
    } else {
        /* The linear node's backward alone (what accel_backward runs for it),
         * without the engine's seeding of the output gradient. */
        accel_tensor *y = accel_linear(x, w, NULL);
        accel_node *node = y->grad_fn;
        bool prev = accel_set_grad_enabled(false);
        double t0 = accel_now_seconds();
        if (node->backward(node, gy) != ACCEL_OK) fprintf(stderr, "%s\n", accel_last_error());
        t = accel_now_seconds() - t0;
        accel_set_grad_enabled(prev);
    }
    x->grad = NULL; /* x is a step tensor: its grad dies with the step */
    accel_step_reset();
    return t;
}

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

int main(int argc, char **argv) {
    const char *out_path = argc > 1 ? argv[1] : "bench/results/matmul.md";
    if (out_path[0] == '-') { /* "--help" was once taken for the output file */
        fprintf(stderr, "usage: bench_matmul [OUT.md (default bench/results/matmul.md)] [REPS (default 7)] [packed]\n");
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (reps < 1 || reps > 100) reps = 7;
    bool packed_only = argc > 3 && !strcmp(argv[3], "packed");
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
    printf("%s%s\n", cpu, gemm);
    fprintf(md, "# Llama step GEMMs\n\n```\n%s%s```\n", cpu, gemm);
    if (packed_only) {
        if (accel__gemm_have_dnnl()) packed_table(md, reps, R, names, (const int64_t(*)[2])dims, 4);
        fclose(md);
        accel_thread_cleanup();
        return 0;
    }
    fprintf(md, "\n## accel_linear vs raw cblas_sgemm (f32)\n\n"
                "Llama training-step GEMMs, B*T = %lld tokens, %d threads, median of %d runs "
                "(after one warm-up). Ratio = raw time / accel time (1.00 = no overhead). "
                "The machine is shared: expect +-15%% jitter between runs.\n\n"
                "| layer | piece | M x N x K | raw GFLOP/s | accel GFLOP/s | ratio |\n"
                "|---|---|---|---|---|---|\n",
            (long long)R, accel_num_threads(), reps);
    double worst = 1e9;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t NIN = shapes[s].in, NOUT = shapes[s].out;
        accel_tensor *w = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(NOUT, NIN), ACCEL_CPU_DEVICE);
        accel_rng rng;
        accel_rng_init(&rng, 1);
        accel_rng_normal_(&rng, w, 0.0, 0.02);
        float *rx = malloc(sizeof(float) * (size_t)(R * NIN)), *ry = malloc(sizeof(float) * (size_t)(R * NOUT));
        float *rw = malloc(sizeof(float) * (size_t)(NOUT * NIN));
        memcpy(rw, w->data, sizeof(float) * (size_t)(NOUT * NIN));
        for (int64_t i = 0; i < R * NIN; i++) rx[i] = (float)((i % 13) - 6) * 0.1f;
        for (int64_t i = 0; i < R * NOUT; i++) ry[i] = (float)((i % 7) - 3) * 0.1f;
        for (int p = FWD; p <= DW; p++) {
            double traw[100], tacc[100];
            for (int r = -1; r < reps; r++) {
                double a = raw_once(p, R, NIN, NOUT, rx, rw, ry);
                accel_tensor *x = accel_from_floats(ACCEL_SHAPE(R, NIN), rx);
                accel_tensor *gy = accel_from_floats(ACCEL_SHAPE(R, NOUT), ry);
                double b = accel_once(p, x, w, gy);
                if (r >= 0) {
                    traw[r] = a;
                    tacc[r] = b;
                }
            }
            double flops = 2.0 * (double)R * (double)NIN * (double)NOUT;
            double mr = median(traw, reps), ma = median(tacc, reps), ratio = mr / ma;
            worst = ratio < worst ? ratio : worst;
            char dims[64];
            snprintf(dims, sizeof dims, "%lld x %lld x %lld", (long long)(p == DW ? NOUT : R),
                     (long long)(p == FWD ? NOUT : NIN), (long long)(p == FWD ? NIN : p == DX ? NOUT : R));
            fprintf(md, "| %s | %s | %s | %.1f | %.1f | %.2f |\n", shapes[s].name, PIECE[p], dims, flops / mr * 1e-9,
                    flops / ma * 1e-9, ratio);
            printf("%-14s %-24s raw %7.1f GFLOP/s  accel %7.1f GFLOP/s  ratio %.2f\n", shapes[s].name, PIECE[p],
                   flops / mr * 1e-9, flops / ma * 1e-9, ratio);
        }
        free(rx);
        free(ry);
        free(rw);
        accel_tensor_free(w);
    }
    fprintf(md, "\nWorst ratio: %.2f\n", worst);
    provider_table(md, reps, R, names, (const int64_t(*)[2])dims, 4);
    if (accel__gemm_have_dnnl()) packed_table(md, reps, R, names, (const int64_t(*)[2])dims, 4);
    fclose(md);
    printf("worst ratio %.2f; table written to %s\n", worst, out_path);
    accel_thread_cleanup();
    return 0;
}
