/* bench_matmul: accel_linear forward / dX / dW vs raw cblas_sgemm on the
 * GEMM shapes of a Llama training step (hidden 512, ffn 1536, vocab 8192,
 * B*T = 2048 tokens). Prints and writes a markdown table of medians.
 *
 *     build/bin/bench_matmul [out.md] [repeats]   (default bench/results/matmul.md, 7)
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"

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

int main(int argc, char **argv) {
    const char *out_path = argc > 1 ? argv[1] : "bench/results/matmul.md";
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (reps < 1 || reps > 100) reps = 7;
    const int64_t R = 2048;
    struct { const char *name; int64_t in, out; } shapes[] = {
        {"attn q/o proj", 512, 512}, {"mlp up/gate", 512, 1536}, {"mlp down", 1536, 512}, {"lm_head", 512, 8192}};
    FILE *md = fopen(out_path, "w");
    if (!md) {
        fprintf(stderr, "bench_matmul: cannot write %s\n", out_path);
        return 1;
    }
    fprintf(md, "# accel_linear vs raw cblas_sgemm (f32)\n\n"
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
    fclose(md);
    printf("worst ratio %.2f; table written to %s\n", worst, out_path);
    accel_thread_cleanup();
    return 0;
}
