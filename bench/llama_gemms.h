/* bench/llama_gemms.h — the 12 GEMMs of a Llama training step (hidden 512,
 * ffn 1536, vocab 8192, B*T = 2048 tokens) as bench_matmul and bench_linear
 * time them: the layers' shapes, the three pieces of each (forward, dX, dW)
 * as GEMM operands, medians, the process's CPU time and the load average.
 * Header-only: each bench is one program. */
#ifndef ACCEL_BENCH_LLAMA_GEMMS_H
#define ACCEL_BENCH_LLAMA_GEMMS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { LLAMA_TOKENS = 2048, LLAMA_LAYERS = 4 };

/* A linear layer's weight [out, in]. */
static const struct llama_layer {
    const char *name;
    int64_t in, out;
} LLAMA_LAYER[LLAMA_LAYERS] = {
    {"attn q/o proj", 512, 512}, {"mlp up/gate", 512, 1536}, {"mlp down", 1536, 512}, {"lm_head", 512, 8192}};

typedef enum { FWD, DX, DW, PIECES } piece;
static const char *const PIECE[PIECES] = {"forward Y = X W^T (NT)", "dX = dY W (NN)", "dW += dY^T X (TN)"};

/* The operands of a piece over x [R, NIN], w [NOUT, NIN], y [R, NOUT] (any
 * one dtype), the result C [M, N] being a separate buffer. */
typedef struct piece_gemm {
    bool ta, tb;
    int64_t M, N, K, lda, ldb;
    const void *a, *b;
    float beta;
} piece_gemm;

static inline piece_gemm piece_operands(piece p, int64_t R, int64_t NIN, int64_t NOUT, const void *x, const void *w,
                                        const void *y) {
    if (p == FWD) /* Y [R, NOUT] = X W^T */
        return (piece_gemm){false, true, R, NOUT, NIN, NIN, NIN, x, w, 0.0f};
    if (p == DX) /* dX [R, NIN] = dY W */
        return (piece_gemm){false, false, R, NIN, NOUT, NOUT, NIN, y, w, 0.0f};
    return (piece_gemm){true, false, NOUT, NIN, R, NOUT, NIN, y, x, 1.0f}; /* dW += dY^T X */
}

static inline double piece_gflop(const piece_gemm *g) {
    return 2.0 * (double)g->M * (double)g->N * (double)g->K * 1e-9;
}

static inline int llama_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v). */
static inline double llama_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, llama_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The CPU time of the process (all its threads), seconds: on a shared
 * machine what a call costs when others wait for it. */
static inline double llama_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The load average (1, 5, 15 min) into out. */
static inline const char *llama_loadavg(char *out, size_t n) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l[3] = {0};
    if (!f || fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3) snprintf(out, n, "unknown");
    else snprintf(out, n, "%.2f %.2f %.2f", l[0], l[1], l[2]);
    if (f) fclose(f);
    return out;
}

#endif
