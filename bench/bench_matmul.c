/* bench_matmul: the GEMM shapes of a Llama training step
 * (bench/llama_gemms.h), tables of medians:
 *   1. the GEMM providers per shape (src/backends/cpu/gemm.h): OpenBLAS
 *      f32, oneDNN f32, oneDNN bf16 (bf16 operands, f32 result) and
 *      oneDNN f32 on bf16 operands widened per call (dnnl_f32) through
 *      accel__gemm / accel__gemm_on with the provider forced, and what auto
 *      picks here;
 *   2. oneDNN on the forward and dX pieces with the weight plain at every
 *      call vs kept in oneDNN's layout (accel__gemm_weight), f32 (and bf16
 *      where oneDNN has a bf16 matmul).
 * (accel_linear against the raw library call is bench_linear.)
 * The CPU model and ISA, and the load average before and after, are printed.
 *
 *     build/bin/bench_matmul [out.md] [repeats] [packed]
 *         (default bench/results/matmul.md, 7; "packed": table 2 alone)
 */
#include <string.h>

#include "accel/accel.h"
#include "accel/cpu.h"
#include "backends/cpu/gemm.h"
#include "core/prepared.h"
#include "llama_gemms.h"

/* ---- the GEMM providers per shape */

/* A call's wall time and the CPU time of the process over it (the machine
 * is shared: the CPU time is what a call costs when others wait for it). */
typedef struct call_time {
    double wall, cpu;
} call_time;

/* One GEMM of the piece on dtype dt, timed into *t: on provider p
 * (accel__gemm_on) where p >= 0; else in the current mode accel__gemm on
 * g->b, or with w (whose memory g->b is) accel__gemm_weight, which reads w's
 * form in oneDNN's layout where the provider is oneDNN; bump: w's version
 * moves first, so the call reorders w again. */
static accel_status gemm_once(int p, accel_dtype dt, const piece_gemm *g, accel_tensor *w, bool bump, float *c,
                              call_time *t) {
    if (bump) accel_tensor_increment_version(w);
    double w0 = accel_now_seconds(), c0 = llama_cpu_seconds();
    accel_status st = p >= 0 ? accel__gemm_on(p, g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->a, dt, g->lda, g->b, dt,
                                              g->ldb, g->beta, c, g->N)
                      : w ? accel__gemm_weight(g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->a, dt, g->lda, w, 0, g->ldb,
                                               g->beta, c, g->N)
                          : accel__gemm(g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->a, dt, g->lda, g->b, dt, g->ldb,
                                        g->beta, c, g->N);
    t->wall = accel_now_seconds() - w0;
    t->cpu = llama_cpu_seconds() - c0;
    accel_step_reset();
    if (st != ACCEL_OK) fprintf(stderr, "bench_matmul: %s\n", accel_last_error());
    return st;
}

/* Median GFLOP/s of accel__gemm in the mode on dtype dt (on provider p
 * where p >= 0), or 0 when it fails. */
static double provider_gflops(accel__gemm_mode mode, int p, accel_dtype dt, const piece_gemm *g, float *c, int reps) {
    if (accel__gemm_set_mode(mode) != ACCEL_OK) return 0.0;
    double t[100];
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up (creates oneDNN's primitive) */
        call_time ct;
        if (gemm_once(p, dt, g, NULL, false, c, &ct) != ACCEL_OK) return 0.0;
        if (r >= 0) t[r] = ct.wall;
    }
    return piece_gflop(g) / llama_median(t, reps);
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
                "operands, f32 accumulation and result; bf16 on oneDNN f32 (dnnl_f32): bf16 operands widened "
                "to f32 panels in each call, then oneDNN's f32 matmul. \"auto\" is the provider ACCEL_GEMM=auto "
                "picks here for f32 / bf16 (f32's forward and dX: accel_linear's, the weight class, whose "
                "oneDNN reads the weight's form; the oneDNN f32 column is the plain weight's). The machine is "
                "shared: expect +-15%% jitter.\n\n"
                "| layer | piece | M x N x K | OpenBLAS f32 | oneDNN f32 | oneDNN bf16 | bf16 on oneDNN f32 | "
                "auto f32 / bf16 |\n"
                "|---|---|---|---|---|---|---|---|\n",
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
            double ob = provider_gflops(ACCEL__GEMM_OPENBLAS, -1, ACCEL_F32, &gf, c, reps);
            double df = provider_gflops(ACCEL__GEMM_DNNL, -1, ACCEL_F32, &gf, c, reps);
            double db = provider_gflops(ACCEL__GEMM_DNNL, -1, ACCEL_BF16, &gb, c, reps);
            double dw = accel__gemm_have_dnnl()
                            ? provider_gflops(ACCEL__GEMM_AUTO, ACCEL__GEMM_PROVIDER_DNNL_F32, ACCEL_BF16, &gb, c, reps)
                            : 0.0;
            accel__gemm_set_mode(ACCEL__GEMM_AUTO);
            /* the forward's and dX's B is the layer's weight: accel_linear asks the weight class */
            int pf = p == DW ? accel__gemm_provider_for(ACCEL_F32, gf.ta, gf.tb, gf.M, gf.N, gf.K)
                             : accel__gemm_weight_provider_for(ACCEL_F32, gf.ta, gf.tb, gf.M, gf.N, gf.K);
            const char *af = accel__gemm_provider_name(pf);
            const char *ab = accel__gemm_provider_name(accel__gemm_provider_for(ACCEL_BF16, gb.ta, gb.tb, gb.M, gb.N, gb.K));
            char dfs[96], dbs[96], dws[96];
            dnnl_cell(df, ACCEL_F32, &gf, dfs, sizeof dfs);
            dnnl_cell(db, ACCEL_BF16, &gb, dbs, sizeof dbs);
            dnnl_cell(dw, ACCEL_F32, &gf, dws, sizeof dws); /* the f32 matmul runs it */
            fprintf(md, "| %s | %s | %lld x %lld x %lld | %.1f | %s | %s | %s | %s / %s |\n", names[s], PIECE[p],
                    (long long)gf.M, (long long)gf.N, (long long)gf.K, ob, dfs, dbs, dws, af, ab);
            printf("%-14s %-24s openblas f32 %7.1f  dnnl f32 %-26s dnnl bf16 %-30s dnnl_f32 %-26s auto %s/%s\n",
                   names[s], PIECE[p], ob, dfs, dbs, dws, af, ab);
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
            ok = gemm_once(-1, dt, &g, v == PLAIN ? NULL : w, v == REORDERED, c, &ct) == ACCEL_OK;
            if (r >= 0) wall[v][r] = ct.wall, cpu[v][r] = ct.cpu;
        }
    for (int v = PLAIN; v < WAYS && ok; v++)
        if (v != REORDERED || formed) {
            gf[v] = piece_gflop(&g) / llama_median(wall[v], reps);
            cpu_gf[v] = piece_gflop(&g) / llama_median(cpu[v], reps);
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

/* The load average after the run, into the table and on stdout; closes md. */
static void finish(FILE *md) {
    char load[64];
    llama_loadavg(load, sizeof load);
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
    bool packed_only = argc > 3 && !strcmp(argv[3], "packed");
    const int64_t R = LLAMA_TOKENS;
    const char *names[LLAMA_LAYERS];
    int64_t dims[LLAMA_LAYERS][2];
    for (int s = 0; s < LLAMA_LAYERS; s++)
        names[s] = LLAMA_LAYER[s].name, dims[s][0] = LLAMA_LAYER[s].in, dims[s][1] = LLAMA_LAYER[s].out;
    FILE *md = fopen(out_path, "w");
    if (!md) {
        fprintf(stderr, "bench_matmul: cannot write %s\n", out_path);
        return 1;
    }
    char cpu[512], gemm[2048];
    accel_cpu_describe(cpu, sizeof cpu);
    accel__gemm_describe(gemm, sizeof gemm);
    char load[64];
    llama_loadavg(load, sizeof load);
    printf("%s%sload average before: %s\n\n", cpu, gemm, load);
    fprintf(md, "# Llama step GEMMs\n\n```\n%s%sload average before: %s\n```\n", cpu, gemm, load);
    if (!packed_only) provider_table(md, reps, R, names, (const int64_t(*)[2])dims, LLAMA_LAYERS);
    if (accel__gemm_have_dnnl()) packed_table(md, reps, R, names, (const int64_t(*)[2])dims, LLAMA_LAYERS);
    finish(md);
    printf("table written to %s\n", out_path);
    accel_thread_cleanup();
    return 0;
}
