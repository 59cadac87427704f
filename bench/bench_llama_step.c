/* bench_llama_step: one Llama training step (forward accel_llama_loss,
 * accel_backward, AdamW step, zero_grad, accel_step_reset) timed over N steps
 * after warm-up, with its model GFLOP/s over the GEMM limit of its dtype
 * measured in the same process (below).
 *
 *     bench_llama_step [--steps N] [--warmup W] [--batch B] [--seq T]
 *                      [--hidden C] [--layers L] [--heads H] [--ffn F] [--vocab V]
 *                      [--threads P] [--profile] [--paired] [--mixed_precision no|bf16|fp16]
 *
 * The step runs through an accel_accelerator (opts.mixed_precision; the
 * loss under its autocast, accel_accelerator_backward / optimizer_step /
 * zero_grad), as a training script would. The first lines name the CPU, its
 * usable ISA and the CPU kernel variant (accel_cpu_describe).
 *
 * The GEMM limit: before the model is made, each of the step's 12 GEMM
 * shapes (forward / dX / dW of attention q/k/v/o, mlp up/gate, mlp down and
 * lm_head on B*T rows) runs on every GEMM provider built in (OpenBLAS,
 * oneDNN: accel__gemm_on, the step's own path and threads; oneDNN on the
 * forward and dX also with the weight's form in its layout, as the step's
 * linear layers read it, the better kept; dW, whose A is transposed, also
 * on dnnl_rows, oneDNN on row blocks, its measured candidate; bf16 / f16
 * also on dnnl_f32, oneDNN's f32 matmul on the operands widened) in the
 * step's dtype (f32; bf16 / f16 operands with f32 accumulation under that
 * mixed precision), best of 3 calls after a warm-up; one "gemm_shape" line
 * each.
 * limit = the best GFLOP/s any provider reaches on any shape (named);
 * weighted = the step's GEMM FLOPs over the time they take with each shape
 * on its fastest provider. Then one line per timed step and the summaries
 *     gemm_limit dtype=... limit_gflops=... limit_provider=... limit_shape=...
 *         weighted_gflops=... gemm_gflop_per_step=...
 *     impl=accel threads=P tokens_per_s=... step_ms_median=... achieved_gflops=...
 *         gemm_limit_gflops=... gemm_weighted_gflops=... step_over_limit=...
 *         step_over_weighted=...
 * that bench/llama_step.sh parses. --profile adds the median split of a step
 * into forward / backward / optimizer / reset. --paired times the weighted
 * limit again after each timed step (each shape on the provider found
 * fastest) and prints the step's ratio to it, one "paired" line a step, and
 *     paired_median weighted_gflops=... step_over_weighted=... steps=N
 * (medians over the steps).
 *
 * FLOPs per step: "model FLOPs" as PaLM counts them (bench_llama_flops in
 * bench_util.h). The ids, the model and the timed step are bench_util.h's,
 * shared with bench_gpu_step. */
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "backends/cpu/gemm.h"
#include "bench_util.h"

/* ---- the GEMM limit: the step's GEMMs on every provider
 *
 * The step's matmuls are its linear layers' (attention's per-head products
 * aside): per layer q, k, v, o [C -> C], mlp up and gate [C -> F], down
 * [F -> C], and lm_head [C -> V], on R = B*T rows, each as three GEMMs:
 * forward Y = X W^T (NT), dX = dY W (NN), dW += dY^T X (TN). */
enum { FWD, DX, DW };
static const char *PIECE[] = {"fwd", "dx", "dw"};

typedef struct step_gemm {
    const char *layer;
    int piece;
    bool ta, tb;
    int64_t M, N, K, lda, ldb;
    double count; /* how many of it one step runs */
    double gflops[ACCEL__GEMM_N_PROVIDERS]; /* best call per provider; 0: not run */
    int fastest;                            /* the provider of the best figure */
    bool fastest_packed;                    /* ... reached with the weight's form (oneDNN) */
} step_gemm;

/* The piece p of a layer x [R, NIN] -> y [R, NOUT] of weight [NOUT, NIN]. */
static step_gemm piece_gemm(const char *layer, int p, int64_t R, int64_t NIN, int64_t NOUT, double count) {
    step_gemm g = {.layer = layer, .piece = p, .count = count};
    if (p == FWD) g.tb = true, g.M = R, g.N = NOUT, g.K = NIN, g.lda = NIN, g.ldb = NIN;
    else if (p == DX) g.M = R, g.N = NIN, g.K = NOUT, g.lda = NOUT, g.ldb = NIN;
    else g.ta = true, g.M = NOUT, g.N = NIN, g.K = R, g.lda = NOUT, g.ldb = NIN;
    return g;
}

static double gemm_gflop(const step_gemm *g) { return 2.0 * (double)g->M * (double)g->N * (double)g->K * 1e-9; }

/* The step's 12 GEMM shapes into g; returns 12. */
static int step_gemms(const bench_llama_args *a, step_gemm *g) {
    struct { const char *name; int64_t in, out, count; } layers[] = {
        {"attn_qkvo", a->C, a->C, 4 * a->L}, {"mlp_up_gate", a->C, a->F, 2 * a->L},
        {"mlp_down", a->F, a->C, a->L}, {"lm_head", a->C, a->V, 1}};
    int n = 0;
    for (int l = 0; l < 4; l++)
        for (int p = FWD; p <= DW; p++)
            g[n++] = piece_gemm(layers[l].name, p, a->B * a->T, layers[l].in, layers[l].out, (double)layers[l].count);
    return n;
}

/* GFLOP/s of the best of REPS calls (after one warm-up, which also makes
 * oneDNN's primitive and w's form) of accel__gemm_on(provider) on g in
 * dtype dt: the step's own GEMM path (accel's threads; a bf16 GEMM on
 * OpenBLAS widens its operands to f32 panels, as the step's would); or, with
 * w (whose data b is), accel__gemm_weight in the current mode, which reads
 * w's form in oneDNN's layout where oneDNN has one, as the step's forward
 * and dX do. The best call, not the median: on a shared machine other
 * processes only pull calls down. 0 when a call fails (the error printed). */
static double provider_best(int provider, accel_dtype dt, const step_gemm *g, const void *a, const void *b,
                            accel_tensor *w, float *c) {
    enum { REPS = 3 };
    double best = 0.0;
    for (int r = -1; r < REPS; r++) {
        double t0 = accel_now_seconds();
        float beta = g->piece == DW ? 1.0f : 0.0f;
        accel_status st =
            w ? accel__gemm_weight(g->ta, g->tb, g->M, g->N, g->K, 1.0f, a, dt, g->lda, w, 0, g->ldb, beta, c, g->N)
              : accel__gemm_on(provider, g->ta, g->tb, g->M, g->N, g->K, 1.0f, a, dt, g->lda, b, dt, g->ldb, beta, c,
                               g->N);
        double t = accel_now_seconds() - t0;
        accel_step_reset();
        if (st != ACCEL_OK) {
            fprintf(stderr, "bench_llama_step: %s GEMM on %s: %s\n", accel_dtype_name(dt),
                    accel__gemm_provider_name((accel__gemm_provider)provider), accel_last_error());
            return 0.0;
        }
        if (r >= 0 && gemm_gflop(g) / t > best) best = gemm_gflop(g) / t;
    }
    return best;
}

/* The GEMM mode ACCEL_GEMM names (auto when unset or not a mode: the step
 * then fails on it itself), set again after the forced-oneDNN timing. */
static void mode_from_env(void) {
    const char *v = getenv("ACCEL_GEMM");
    accel__gemm_set_mode(v && !strcmp(v, "openblas") ? ACCEL__GEMM_OPENBLAS
                         : v && !strcmp(v, "dnnl") && accel__gemm_have_dnnl() ? ACCEL__GEMM_DNNL
                                                                             : ACCEL__GEMM_AUTO);
}

/* oneDNN's best on g with the weight's data b kept as a form in its layout
 * (forward and dX: the weight is op(B)), as the step's linear layers run:
 * w [out, in] = op(B) [K, N] stored [N, K] (forward) or [K, N] (dX), made
 * for the call, the mode forced to oneDNN meanwhile. 0 where oneDNN has no
 * form for it (it reads the weight as stored: the plain figure holds). */
static double dnnl_packed_best(accel_dtype dt, const step_gemm *g, const void *a, const void *b, float *c) {
    int64_t rows = g->tb ? g->N : g->K, cols = g->tb ? g->K : g->N;
    if (g->piece == DW || accel__gemm_set_mode(ACCEL__GEMM_DNNL) != ACCEL_OK) return 0.0;
    double best = 0.0;
    accel_tensor *w = NULL;
    if (accel__gemm_weight_has_form(dt, g->ta, g->tb, g->M, g->N, g->K) &&
        (w = accel_tensor_new(dt, ACCEL_SHAPE(rows, cols), ACCEL_CPU_DEVICE))) {
        memcpy(w->data, b, (size_t)(rows * cols) * accel_dtype_size(dt));
        best = provider_best(ACCEL__GEMM_PROVIDER_DNNL, dt, g, a, w->data, w, c);
    }
    accel_tensor_free(w);
    mode_from_env();
    return best;
}

/* Times every step GEMM g[0..n) on every provider built in, in o's dtype
 * (oneDNN also with the weight's form, keeping the better), printing a
 * "gemm_shape" line each; fills g[].gflops and g[].fastest. */
/* The operands every timing of the step's GEMMs reads: a [big], b [big] in
 * the step's dtype, c [big] f32, big the largest operand of the 12 shapes;
 * kept for the run (the limit is timed again between the timed steps). */
typedef struct gemm_operands {
    accel_dtype dt;
    void *a, *b;
    float *c;
} gemm_operands;

static bool operands_new(gemm_operands *o, accel_dtype dt, const step_gemm *g, int n) {
    size_t big = 0, es = accel_dtype_size(dt);
    for (int i = 0; i < n; i++) {
        size_t ab = (size_t)(g[i].M * g[i].K), bb = (size_t)(g[i].K * g[i].N), cb = (size_t)(g[i].M * g[i].N);
        big = ab > big ? ab : big, big = bb > big ? bb : big, big = cb > big ? cb : big;
    }
    float *wide = malloc(big * sizeof(float));
    *o = (gemm_operands){.dt = dt, .a = malloc(big * es), .b = malloc(big * es), .c = calloc(big, sizeof(float))};
    bool ok = wide && o->a && o->b && o->c;
    if (ok) {
        for (size_t i = 0; i < big; i++) wide[i] = (float)((int)(i % 13) - 6) * 0.01f;
        accel_convert(o->a, dt, wide, ACCEL_F32, big);
        for (size_t i = 0; i < big; i++) wide[i] = (float)((int)(i % 7) - 3) * 0.01f;
        accel_convert(o->b, dt, wide, ACCEL_F32, big);
    }
    free(wide);
    return ok;
}

static void operands_free(gemm_operands *o) {
    free(o->a);
    free(o->b);
    free(o->c);
}

static void measure_gemms(const gemm_operands *o, step_gemm *g, int n) {
    accel_dtype dt = o->dt;
    const void *a = o->a, *b = o->b;
    float *c = o->c;
    for (int i = 0; i < n; i++) {
        printf("gemm_shape layer=%s piece=%s dtype=%s MxNxK=%lldx%lldx%lld per_step=%.0f", g[i].layer,
               PIECE[g[i].piece], accel_dtype_name(dt), (long long)g[i].M, (long long)g[i].N, (long long)g[i].K,
               g[i].count);
        for (int p = ACCEL__GEMM_PROVIDER_OPENBLAS; p < ACCEL__GEMM_N_PROVIDERS; p++) {
            if (accel__gemm_is_dnnl(p) && !accel__gemm_have_dnnl()) continue;
            /* oneDNN's row blocks are a candidate of the transposed A alone (dW) */
            if (p == ACCEL__GEMM_PROVIDER_DNNL_ROWS && !g[i].ta) continue;
            /* oneDNN's f32 matmul on widened panels: a bf16/f16 candidate (f32's is dnnl) */
            if (p == ACCEL__GEMM_PROVIDER_DNNL_F32 && dt == ACCEL_F32) continue;
            g[i].gflops[p] = provider_best(p, dt, &g[i], a, b, NULL, c);
            double packed = p == ACCEL__GEMM_PROVIDER_DNNL ? dnnl_packed_best(dt, &g[i], a, b, c) : 0.0;
            if (packed > g[i].gflops[p]) g[i].gflops[p] = packed;
            if (g[i].gflops[p] > g[i].gflops[g[i].fastest])
                g[i].fastest = p, g[i].fastest_packed = packed > 0.0 && packed >= g[i].gflops[p];
            printf(" %s=%.1f%s", accel__gemm_provider_name((accel__gemm_provider)p), g[i].gflops[p],
                   packed > 0.0 && packed >= g[i].gflops[p] ? "(packed)" : "");
            /* oneDNN without a matmul of dt here multiplies f32 panels */
            if (p == ACCEL__GEMM_PROVIDER_DNNL && dt != ACCEL_F32 &&
                !accel__dnnl_impl(dt, g[i].ta, g[i].tb, g[i].M, g[i].N, g[i].K)) {
                printf("(as_f32)");
                accel_clear_error();
            }
        }
        printf("\n");
        fflush(stdout);
    }
}

/* The weighted limit timed again: each of g[0..n) on the provider (and
 * form) measure_gemms found fastest, best of 3 calls as there. Between
 * the timed steps (--paired), the step's GFLOP/s is divided by the limit
 * measured seconds from it: this VM's speed moves by up to 45% over a run,
 * so a limit timed once before the model is made can be from another phase
 * than the step it divides. 0 when a call fails. */
static double weighted_again(const gemm_operands *o, const step_gemm *g, int n) {
    double flop = 0.0, time = 0.0;
    for (int i = 0; i < n; i++) {
        double gf = g[i].fastest_packed ? dnnl_packed_best(o->dt, &g[i], o->a, o->b, o->c)
                                        : provider_best(g[i].fastest, o->dt, &g[i], o->a, o->b, NULL, o->c);
        if (gf <= 0.0) return 0.0;
        flop += g[i].count * gemm_gflop(&g[i]);
        time += g[i].count * gemm_gflop(&g[i]) / gf;
    }
    return flop / time;
}

static void fail(const char *what) {
    fprintf(stderr, "bench_llama_step: %s: %s\n", what, accel_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    bench_llama_args a;
    if (bench_llama_parse("bench_llama_step", "threads profile paired mixed_precision", argc, argv, &a)) return 2;
    int steps = a.steps, warmup = a.warmup, threads = a.threads;
    bool profile = a.profile;
    int64_t B = a.B, T = a.T;
    accel_set_num_threads(threads);
    char cpu[512];
    printf("%s", accel_cpu_describe(cpu, sizeof cpu));
    accel_accelerator_opts ao = {.mixed_precision = a.mixed_precision};
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) fail("accel_accelerator_new");
    /* The GEMM limit in the step's dtype (its GEMMs run in bf16 / f16 with
     * f32 accumulation under that mixed precision, f32 otherwise). */
    accel_dtype gdt = !strcmp(a.mixed_precision, "bf16") ? ACCEL_BF16
                      : !strcmp(a.mixed_precision, "fp16") ? ACCEL_F16 : ACCEL_F32;
    step_gemm gemms[12];
    int n_gemm = step_gemms(&a, gemms);
    gemm_operands ops;
    if (!operands_new(&ops, gdt, gemms, n_gemm)) fail("GEMM operands");
    measure_gemms(&ops, gemms, n_gemm);
    double limit = 0.0, gemm_flop = 0.0, gemm_time = 0.0;
    const step_gemm *lim_g = &gemms[0];
    int lim_p = ACCEL__GEMM_PROVIDER_OPENBLAS;
    for (int i = 0; i < n_gemm; i++) {
        double best_i = 0.0;
        for (int p = 0; p < ACCEL__GEMM_N_PROVIDERS; p++) {
            best_i = gemms[i].gflops[p] > best_i ? gemms[i].gflops[p] : best_i;
            if (gemms[i].gflops[p] > limit) limit = gemms[i].gflops[p], lim_g = &gemms[i], lim_p = p;
        }
        if (best_i <= 0.0) fail("a step GEMM ran on no provider");
        gemm_flop += gemms[i].count * gemm_gflop(&gemms[i]);
        gemm_time += gemms[i].count * gemm_gflop(&gemms[i]) / best_i;
    }
    double weighted = gemm_flop / gemm_time; /* GFLOP/s of the step's GEMMs, each on its fastest provider */

    accel_manual_seed(0);
    accel_module *model;
    accel_optimizer *opt;
    int64_t n_params;
    const char *failed = bench_llama_training(acc, &a, ACCEL_CPU_DEVICE, &model, &opt, &n_params);
    if (failed) fail(failed);

    accel_tensor *ids = bench_llama_ids(&a, 12345, ACCEL_CPU_DEVICE);
    if (!ids) fail("ids");
    int64_t n_mm;
    double flops = bench_llama_flops(&a, &n_mm), tokens = (double)(B * T);

    int total = warmup + steps;
    double *t_step = calloc((size_t)total, sizeof(double));
    double *t_fwd = calloc((size_t)total, sizeof(double)), *t_bwd = calloc((size_t)total, sizeof(double));
    double *t_opt = calloc((size_t)total, sizeof(double)), *t_rst = calloc((size_t)total, sizeof(double));
    double *t_cpu = calloc((size_t)total, sizeof(double));
    double *paired = calloc((size_t)total, sizeof(double)), *paired_lim = calloc((size_t)total, sizeof(double));
    if (!t_step || !t_fwd || !t_bwd || !t_opt || !t_rst || !t_cpu || !paired || !paired_lim) fail("calloc");
    int n_paired = 0;
    float loss_v = 0.0f;
    for (int it = 0; it < total; it++) {
        bench_step_time st;
        if ((failed = bench_llama_step(acc, model, opt, ids, NULL, &st))) fail(failed);
        t_step[it] = st.total, t_fwd[it] = st.fwd, t_bwd[it] = st.bwd, t_opt[it] = st.opt, t_rst[it] = st.reset;
        t_cpu[it] = st.cpu;
        loss_v = st.loss;
        printf("step %d%s: %.1f ms (fwd %.1f bwd %.1f opt %.1f reset %.1f) cpu %.1f ms, %ld page faults, "
               "loss %.4f\n", it, it < warmup ? " (warm-up)" : "", t_step[it] * 1e3, t_fwd[it] * 1e3,
               t_bwd[it] * 1e3, t_opt[it] * 1e3, t_rst[it] * 1e3, t_cpu[it] * 1e3, st.faults, loss_v);
        double w_now = it >= warmup && a.paired ? weighted_again(&ops, gemms, n_gemm) : 0.0;
        if (w_now > 0.0) {
            paired_lim[n_paired] = w_now;
            paired[n_paired++] = flops / t_step[it] / 1e9 / w_now;
            printf("paired step=%d weighted_gflops=%.1f step_over_weighted=%.3f\n", it, w_now,
                   paired[n_paired - 1]);
        }
        fflush(stdout);
    }
    double med = bench_median(t_step + warmup, steps), tmin = t_step[warmup];
    for (int i = warmup; i < total; i++) tmin = t_step[i] < tmin ? t_step[i] : tmin;
    double gflops = flops / med / 1e9;
    if (profile)
        printf("split_ms_median fwd=%.1f bwd=%.1f opt=%.1f reset=%.1f\n", bench_median(t_fwd + warmup, steps) * 1e3,
               bench_median(t_bwd + warmup, steps) * 1e3, bench_median(t_opt + warmup, steps) * 1e3,
               bench_median(t_rst + warmup, steps) * 1e3);
    printf("model params=%lld matmul_params=%lld gflop_per_step=%.1f\n", (long long)n_params,
           (long long)n_mm, flops / 1e9);
    printf("gemm_limit dtype=%s limit_gflops=%.1f limit_provider=%s limit_shape=%s/%s/%lldx%lldx%lld "
           "weighted_gflops=%.1f gemm_gflop_per_step=%.1f\n",
           accel_dtype_name(gdt), limit, accel__gemm_provider_name((accel__gemm_provider)lim_p), lim_g->layer,
           PIECE[lim_g->piece], (long long)lim_g->M, (long long)lim_g->N, (long long)lim_g->K, weighted, gemm_flop);
    printf("impl=accel mixed_precision=%s threads=%d tokens_per_s=%.1f step_ms_median=%.1f step_ms_min=%.1f "
           "cpu_ms_median=%.1f achieved_gflops=%.1f gemm_limit_gflops=%.1f gemm_weighted_gflops=%.1f "
           "step_over_limit=%.3f step_over_weighted=%.3f loss=%.4f\n",
           a.mixed_precision, threads, tokens / med, med * 1e3, tmin * 1e3, bench_median(t_cpu + warmup, steps) * 1e3,
           gflops, limit, weighted, gflops / limit, gflops / weighted, loss_v);
    if (n_paired)
        printf("paired_median weighted_gflops=%.1f step_over_weighted=%.3f steps=%d\n",
               bench_median(paired_lim, n_paired), bench_median(paired, n_paired), n_paired);
    operands_free(&ops);
    free(paired);
    free(paired_lim);
    free(t_step);
    free(t_fwd);
    free(t_bwd);
    free(t_opt);
    free(t_rst);
    free(t_cpu);
    accel_optimizer_free(opt);
    accel_tensor_free(ids);
    accel_accelerator_free(acc);
    accel_module_free(model);
    return 0;
}
