/* bench_linear: accel_linear against the raw library call (issue 23: within
 * 5% on every shape, for each provider), on the 12 GEMMs of a Llama step
 * (bench/llama_gemms.h), per thread count, dtype and provider:
 *
 *   raw     the library called directly on the same operands: OpenBLAS's
 *           cblas_sgemm on its own threads (bf16: on f32 copies of the
 *           bf16-rounded values, what accel multiplies where OpenBLAS runs
 *           bf16), or a oneDNN matmul primitive made once (bf16: bf16
 *           operands; a bf16 result where accel_linear's is bf16: the
 *           forward and dX);
 *   accel   accel_linear's forward, or the linear node's backward computing
 *           only that gradient (what accel_backward runs for it), with
 *           ACCEL_GEMM forced to the provider; bf16: under autocast, on a
 *           bf16 input and an f32 weight (its prepared bf16 copy, and on
 *           oneDNN the copy's forms in oneDNN's layout, made in the warm-up
 *           round and then reused, as in a step after the first micro-batch).
 *
 * The two calls of a row alternate in each round (raw first in even rounds,
 * accel first in odd ones) and every pair gives a ratio raw / accel of wall
 * time and of the process's CPU time over each call; a row reports the
 * medians of those per-pair ratios (1.00: no overhead) and the median
 * GFLOP/s of each. On a shared machine the CPU-time ratio is the figure: it
 * does not count the time other processes take the cores. With more than
 * one thread every call starts 120 ms after the one before, so that
 * neither thread pool (OpenBLAS's workers yield-spin for ~70 ms after a
 * call, libgomp's for a few ms) spins through the other's call.
 *
 *     build/bin/bench_linear [--rounds N] [--threads 1,2] [--dtypes f32,bf16]
 *                            [--layer NAME] [--out FILE.md]
 *     (defaults: 15 rounds after one warm-up, threads 1 and 2, both dtypes,
 *     every layer (--layer: those whose name contains NAME, e.g. attn),
 *     no file: the table on stdout only)
 */
#include <cblas.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/cpu.h"
#include "backends/cpu/gemm.h"
#include "llama_gemms.h"

#ifdef ACCEL_HAVE_DNNL
#include <dnnl.h>
#endif

enum { MAX_ROUNDS = 200 };

/* A call's wall time and the process's CPU time over it. */
typedef struct call_time {
    double wall, cpu;
} call_time;

static void settle(void) {
    if (accel_num_threads() < 2) return;
    struct timespec ts = {0, 120 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* ---- the raw library call */

/* A piece's library call, set up once outside the timing. dt: the
 * operands' dtype (f32, or bf16 on oneDNN), c_dt: C's. */
typedef struct raw_call {
    accel__gemm_provider p;
    piece_gemm g;
    accel_dtype dt, c_dt;
    void *c;
#ifdef ACCEL_HAVE_DNNL
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3];
    dnnl_stream_t stream;
#endif
} raw_call;

#ifdef ACCEL_HAVE_DNNL
static dnnl_engine_t raw_engine;

static dnnl_data_type_t raw_dnnl_dtype(accel_dtype dt) { return dt == ACCEL_BF16 ? dnnl_bf16 : dnnl_f32; }

/* op(A) [M, K], op(B) [K, N] by strides, C [M, N]; beta as a sum post-op. */
static bool raw_dnnl_init(raw_call *r) {
    const piece_gemm *g = &r->g;
    if (!raw_engine && dnnl_engine_create(&raw_engine, dnnl_cpu, 0) != dnnl_success) return false;
    dnnl_memory_desc_t md[3];
    dnnl_dims_t ad = {g->M, g->K}, bd = {g->K, g->N}, cd = {g->M, g->N};
    dnnl_dims_t as = {g->ta ? 1 : g->lda, g->ta ? g->lda : 1}, bs = {g->tb ? 1 : g->ldb, g->tb ? g->ldb : 1},
                cs = {g->N, 1};
    dnnl_data_type_t t = raw_dnnl_dtype(r->dt);
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    dnnl_matmul_desc_t mm;
    dnnl_primitive_desc_t pd;
    bool ok = dnnl_memory_desc_init_by_strides(&md[0], 2, ad, t, as) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&md[1], 2, bd, t, bs) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&md[2], 2, cd, raw_dnnl_dtype(r->c_dt), cs) == dnnl_success &&
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

static call_time raw_once(raw_call *r) {
    const piece_gemm *g = &r->g;
    double w0, c0;
    if (r->p == ACCEL__GEMM_PROVIDER_OPENBLAS) {
        /* accel leaves OpenBLAS single-threaded (it runs GEMM blocks on its
         * own OpenMP threads); the raw call gets OpenBLAS's threads back */
        openblas_set_num_threads(accel_num_threads());
        w0 = accel_now_seconds(), c0 = llama_cpu_seconds();
        cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)g->M,
                    (int)g->N, (int)g->K, 1.0f, g->a, (int)g->lda, g->b, (int)g->ldb, g->beta, r->c, (int)g->N);
    } else {
        w0 = accel_now_seconds(), c0 = llama_cpu_seconds();
#ifdef ACCEL_HAVE_DNNL
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, r->mem[0]}, {DNNL_ARG_WEIGHTS, r->mem[1]}, {DNNL_ARG_DST, r->mem[2]}};
        if (dnnl_primitive_execute(r->prim, r->stream, 3, args) != dnnl_success ||
            dnnl_stream_wait(r->stream) != dnnl_success)
            fprintf(stderr, "bench_linear: raw oneDNN matmul failed\n");
#endif
    }
    return (call_time){accel_now_seconds() - w0, llama_cpu_seconds() - c0};
}

/* ---- accel_linear */

/* The operands of one layer: f32 values, their bf16 copies and those
 * widened back (the rounded values), and accel's weight. */
typedef struct layer_data {
    int64_t R, NIN, NOUT;
    float *x, *y, *w, *xr, *yr, *wr, *c;
    uint16_t *xb, *yb, *wb;
    accel_tensor *W; /* [NOUT, NIN] f32: the layer's parameter */
} layer_data;

/* x (or y) of the round as a step tensor of dt. */
static accel_tensor *step_tensor(accel_dtype dt, int64_t rows, int64_t cols, const float *f32, const uint16_t *b16) {
    accel_tensor *t = accel_empty_on(dt, ACCEL_SHAPE(rows, cols), ACCEL_CPU_DEVICE);
    if (t) memcpy(t->data, dt == ACCEL_F32 ? (const void *)f32 : (const void *)b16,
                  (size_t)(rows * cols) * accel_dtype_size(dt));
    return t;
}

/* The time of the piece through accel_linear (forward, under autocast for
 * bf16) or the linear node's backward alone, in the current mode. */
static call_time linear_once(piece p, accel_dtype dt, layer_data *d) {
    accel_tensor *x = step_tensor(dt, d->R, d->NIN, d->x, d->xb), *gy = step_tensor(dt, d->R, d->NOUT, d->y, d->yb);
    call_time t = {0, 0};
    accel_dtype prev_ac = accel_autocast_begin(dt);
    accel_tensor *y = NULL;
    bool ok = x && gy;
    if (ok) {
        accel_requires_grad_(x, p == DX);
        accel_requires_grad_(d->W, p == DW);
        ok = p == FWD || (y = accel_linear(x, d->W, NULL)) != NULL;
    }
    if (ok) {
        if (y) settle(); /* the forward's pool asleep again */
        bool prev = accel_set_grad_enabled(false);
        double w0 = accel_now_seconds(), c0 = llama_cpu_seconds();
        ok = p == FWD ? accel_linear(x, d->W, NULL) != NULL : y->grad_fn->backward(y->grad_fn, gy) == ACCEL_OK;
        t = (call_time){accel_now_seconds() - w0, llama_cpu_seconds() - c0};
        accel_set_grad_enabled(prev);
    }
    accel_autocast_end(prev_ac);
    if (!ok) fprintf(stderr, "bench_linear: %s\n", accel_last_error());
    accel_step_reset(); /* x and its grad, gy, y: step tensors */
    return t;
}

static bool layer_init(layer_data *d, int64_t R, int64_t NIN, int64_t NOUT) {
    size_t nx = (size_t)(R * NIN), ny = (size_t)(R * NOUT), nw = (size_t)(NIN * NOUT);
    size_t big = nx > ny ? nx : ny;
    *d = (layer_data){.R = R, .NIN = NIN, .NOUT = NOUT};
    d->x = malloc(sizeof(float) * (2 * (nx + ny + nw) + big));
    d->xb = malloc(sizeof(uint16_t) * (nx + ny + nw));
    d->W = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(NOUT, NIN), ACCEL_CPU_DEVICE);
    if (!d->x || !d->xb || !d->W) return false;
    d->y = d->x + nx, d->w = d->y + ny, d->xr = d->w + nw, d->yr = d->xr + nx, d->wr = d->yr + ny, d->c = d->wr + nw;
    d->yb = d->xb + nx, d->wb = d->yb + ny;
    accel_rng rng;
    accel_rng_init(&rng, 1);
    accel_rng_normal_(&rng, d->W, 0.0, 0.02);
    memcpy(d->w, d->W->data, sizeof(float) * nw);
    for (size_t i = 0; i < nx; i++) d->x[i] = (float)((int)(i % 13) - 6) * 0.1f;
    for (size_t i = 0; i < ny; i++) d->y[i] = (float)((int)(i % 7) - 3) * 0.1f;
    memset(d->c, 0, sizeof(float) * big);
    const float *f[3] = {d->x, d->y, d->w};
    float *r[3] = {d->xr, d->yr, d->wr};
    uint16_t *b[3] = {d->xb, d->yb, d->wb};
    size_t n[3] = {nx, ny, nw};
    for (int i = 0; i < 3; i++) {
        accel_convert(b[i], ACCEL_BF16, f[i], ACCEL_F32, n[i]);
        accel_convert(r[i], ACCEL_F32, b[i], ACCEL_BF16, n[i]);
    }
    return true;
}

static void layer_free(layer_data *d) {
    free(d->x);
    free(d->xb);
    accel_tensor_free(d->W);
}

/* ---- the table */

typedef struct bench_opts {
    int rounds;
    int threads[4], nthreads;
    accel_dtype dtypes[2];
    int ndtypes;
    const char *layer; /* only the layers whose name contains it, or NULL */
} bench_opts;

/* The worst (lowest) median CPU-time ratio per provider of a section. */
typedef struct worst {
    double cpu[ACCEL__GEMM_N_PROVIDERS], wall[ACCEL__GEMM_N_PROVIDERS];
} worst;

/* One row: the piece on provider prov in dtype dt, raw and accel in turn. */
static void row(FILE *md, const bench_opts *o, const char *layer, piece p, accel__gemm_provider prov, accel_dtype dt,
                layer_data *d, worst *wst) {
    bool b16 = dt == ACCEL_BF16, dnnl = prov == ACCEL__GEMM_PROVIDER_DNNL;
    /* oneDNN multiplies bf16 itself; OpenBLAS the rounded values in f32 */
    raw_call raw = {.p = prov, .dt = b16 && dnnl ? ACCEL_BF16 : ACCEL_F32, .c = d->c};
    raw.c_dt = raw.dt == ACCEL_BF16 && p != DW ? ACCEL_BF16 : ACCEL_F32;
    raw.g = raw.dt == ACCEL_BF16 ? piece_operands(p, d->R, d->NIN, d->NOUT, d->xb, d->wb, d->yb)
            : b16               ? piece_operands(p, d->R, d->NIN, d->NOUT, d->xr, d->wr, d->yr)
                                : piece_operands(p, d->R, d->NIN, d->NOUT, d->x, d->w, d->y);
#ifdef ACCEL_HAVE_DNNL
    if (dnnl && !raw_dnnl_init(&raw)) {
        fprintf(stderr, "bench_linear: cannot make the raw oneDNN matmul (%s)\n", accel_dtype_name(dt));
        raw_dnnl_free(&raw);
        return;
    }
#endif
    accel__gemm_set_mode(dnnl ? ACCEL__GEMM_DNNL : ACCEL__GEMM_OPENBLAS);
    double wall[2][MAX_ROUNDS], cpu[2][MAX_ROUNDS], rw[MAX_ROUNDS], rc[MAX_ROUNDS];
    for (int r = -1; r < o->rounds; r++) { /* r = -1: warm-up (primitives, the weight's forms) */
        call_time t[2] = {{0, 0}, {0, 0}};
        for (int k = 0; k < 2; k++) {
            int which = (r & 1) ? 1 - k : k; /* 0 raw, 1 accel */
            settle();
            t[which] = which ? linear_once(p, dt, d) : raw_once(&raw);
        }
        if (r < 0) continue;
        for (int k = 0; k < 2; k++) wall[k][r] = t[k].wall, cpu[k][r] = t[k].cpu;
        rw[r] = t[0].wall / t[1].wall;
        rc[r] = t[0].cpu / t[1].cpu;
    }
#ifdef ACCEL_HAVE_DNNL
    if (dnnl) raw_dnnl_free(&raw);
#endif
    int n = o->rounds;
    double gf = piece_gflop(&raw.g), graw = gf / llama_median(wall[0], n), glin = gf / llama_median(wall[1], n);
    double craw = gf / llama_median(cpu[0], n), clin = gf / llama_median(cpu[1], n);
    double mrc = llama_median(rc, n), mrw = llama_median(rw, n);
    if (mrc < wst->cpu[prov]) wst->cpu[prov] = mrc;
    if (mrw < wst->wall[prov]) wst->wall[prov] = mrw;
    const char *pn = accel__gemm_provider_name(prov);
    if (md)
        fprintf(md, "| %s | %s | %lld x %lld x %lld | %s | %.1f | %.1f | %.1f | %.1f | **%.2f** | %.2f |\n", layer,
                PIECE[p], (long long)raw.g.M, (long long)raw.g.N, (long long)raw.g.K, pn, craw, clin, graw, glin, mrc,
                mrw);
    printf("%-14s %-24s %-8s CPU GFLOP/s raw %6.1f accel %6.1f  wall %6.1f %6.1f  accel/raw: CPU %.2f wall %.2f\n",
           layer, PIECE[p], pn, craw, clin, graw, glin, mrc, mrw);
    fflush(stdout);
}

static void section(FILE *md, const bench_opts *o, int threads, accel_dtype dt) {
    accel_set_num_threads(threads);
    char load[64];
    llama_loadavg(load, sizeof load);
    const char *dn = accel_dtype_name(dt);
    printf("\n%d thread%s, %s (load average %s)\n", threads, threads > 1 ? "s" : "", dn, load);
    if (md)
        fprintf(md, "\n## %s, %d thread%s\n\nLoad average at the start: %s.\n\n"
                    "| layer | piece | M x N x K | provider | raw GFLOP/s (CPU) | accel (CPU) | raw GFLOP/s (wall) | "
                    "accel (wall) | raw / accel, CPU time | raw / accel, wall |\n|---|---|---|---|---|---|---|---|---|---|\n",
                dn, threads, threads > 1 ? "s" : "", load);
    worst w;
    for (int p = 0; p < ACCEL__GEMM_N_PROVIDERS; p++) w.cpu[p] = w.wall[p] = 1e9;
    int nprov = accel__gemm_have_dnnl() ? 2 : 1;
    for (int s = 0; s < LLAMA_LAYERS; s++) {
        if (o->layer && !strstr(LLAMA_LAYER[s].name, o->layer)) continue;
        layer_data d;
        if (!layer_init(&d, LLAMA_TOKENS, LLAMA_LAYER[s].in, LLAMA_LAYER[s].out)) {
            fprintf(stderr, "bench_linear: out of memory\n");
            layer_free(&d);
            continue;
        }
        for (int p = FWD; p < PIECES; p++)
            for (int v = 0; v < nprov; v++)
                row(md, o, LLAMA_LAYER[s].name, (piece)p, v ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS,
                    dt, &d, &w);
        layer_free(&d);
    }
    accel__gemm_set_mode(ACCEL__GEMM_AUTO);
    for (int v = 0; v < nprov; v++) {
        accel__gemm_provider prov = v ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS;
        const char *pn = accel__gemm_provider_name(prov);
        printf("worst raw / accel, %s %s %d threads: CPU %.2f wall %.2f\n", pn, dn, threads, w.cpu[prov], w.wall[prov]);
        if (md) fprintf(md, "%sWorst %s: %.2f in CPU time, %.2f wall.", v ? " " : "\n", pn, w.cpu[prov], w.wall[prov]);
    }
    if (md) fprintf(md, "\n");
}

static int usage(void) {
    fprintf(stderr, "usage: bench_linear [--rounds N (15, up to %d)] [--threads 1,2] [--dtypes f32,bf16] "
                    "[--layer NAME] [--out FILE.md]\n", MAX_ROUNDS);
    return 2;
}

int main(int argc, char **argv) {
    bench_opts o = {.rounds = 15, .threads = {1, 2}, .nthreads = 2, .dtypes = {ACCEL_F32, ACCEL_BF16}, .ndtypes = 2};
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) return usage();
        const char *f = argv[i], *v = argv[++i];
        if (!strcmp(f, "--rounds")) {
            o.rounds = atoi(v);
            if (o.rounds < 1 || o.rounds > MAX_ROUNDS) return usage();
        } else if (!strcmp(f, "--threads")) {
            o.nthreads = 0;
            for (const char *c = v; *c && o.nthreads < 4; c = strchr(c, ',') ? strchr(c, ',') + 1 : "")
                if ((o.threads[o.nthreads++] = atoi(c)) < 1) return usage();
        } else if (!strcmp(f, "--dtypes")) {
            o.ndtypes = 0;
            if (strstr(v, "f32")) o.dtypes[o.ndtypes++] = ACCEL_F32;
            if (strstr(v, "bf16")) o.dtypes[o.ndtypes++] = ACCEL_BF16;
            if (!o.ndtypes) return usage();
        } else if (!strcmp(f, "--layer")) o.layer = v;
        else if (!strcmp(f, "--out")) out = v;
        else return usage();
    }
    FILE *md = out ? fopen(out, "w") : NULL;
    if (out && !md) {
        fprintf(stderr, "bench_linear: cannot write %s\n", out);
        return 1;
    }
    char cpu[512], gemm[2048], load[64], omp[160];
    accel_cpu_describe(cpu, sizeof cpu);
    accel__gemm_describe(gemm, sizeof gemm);
    llama_loadavg(load, sizeof load);
    /* libgomp's threads spin at a barrier unless told otherwise: under load
     * a spinning thread's CPU time counts against the call (docs/cpu.md) */
    const char *wait = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    snprintf(omp, sizeof omp, "OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s\n", wait ? wait : "(unset)", spin ? spin : "(unset)");
    printf("%s%s%sload average before: %s\n", cpu, gemm, omp, load);
    if (md)
        fprintf(md, "# accel_linear against the raw library call\n\n```\n%s%s%sload average before: %s\n```\n\n"
                    "`bench_linear --rounds %d` (bench/bench_linear.c says what each column is): per row %d "
                    "rounds after one warm-up, raw and accel in turn; ratios raw / accel are medians of the "
                    "per-round ratios (1.00: no overhead), GFLOP/s medians of each call.\n",
                cpu, gemm, omp, load, o.rounds, o.rounds);
    for (int t = 0; t < o.nthreads; t++)
        for (int k = 0; k < o.ndtypes; k++) section(md, &o, o.threads[t], o.dtypes[k]);
    llama_loadavg(load, sizeof load);
    printf("load average after: %s\n", load);
    if (md) {
        fprintf(md, "\nLoad average after: %s\n", load);
        fclose(md);
    }
    accel_thread_cleanup();
    return 0;
}
