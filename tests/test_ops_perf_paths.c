/* The multi-threaded, vectorised paths of the training step's kernels on
 * sizes that take them, against plain double-precision loops written here:
 * RMSNorm backward (one pass over row blocks with per-block weight-grad
 * partials; with few rows, column slices) and its same bits under every ISA
 * variant and thread count, cross-entropy with the vectorised exp, SiLU, and the strided copy of
 * transposed views (row runs of memcpy). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "core/cpuinfo.h"
#include "gradcheck.h"
#include "ops_fixture.h"

/* A malloc'd host copy of t's values (t may be on any device). */
static float *host_copy(const accel_tensor *t) {
    float *p = malloc(sizeof(float) * (size_t)accel_numel(t));
    if (p && accel_to_floats(t, p) != ACCEL_OK) {
        free(p);
        return NULL;
    }
    return p;
}

/* One pass over the rows for dx and the weight gradient (per-block
 * partials), or with few rows (R <= 64) dx by rows and the weight gradient by
 * column slices: with both gradients, only the weight's, only x's. */
static void rms_norm_backward_case(int R, int D, bool x_grad, bool w_grad) {
    accel_tensor *x = gc_randn(1, ACCEL_SHAPE(R, D)), *w = gc_randn(2, ACCEL_SHAPE(D));
    accel_tensor *u = gc_randn(3, ACCEL_SHAPE(R, D));
    accel_requires_grad_(u, false);
    accel_requires_grad_(x, x_grad);
    accel_requires_grad_(w, w_grad);
    const double eps = 1e-6;
    accel_tensor *y = accel_rms_norm(x, w, eps);
    CHECK(y && accel_backward(accel_sum_all(accel_mul(y, u))) == ACCEL_OK);
    float *xp = host_copy(x), *wp = host_copy(w), *up = host_copy(u);
    double *dw = calloc(D, sizeof *dw);
    double max_dx = 0.0, max_y = 0.0;
    for (int r = 0; r < R; r++) {
        double ss = 0.0, dot = 0.0;
        for (int j = 0; j < D; j++) ss += (double)xp[r * D + j] * xp[r * D + j];
        double s = 1.0 / sqrt(ss / D + eps);
        for (int j = 0; j < D; j++) dot += (double)up[r * D + j] * wp[j] * xp[r * D + j];
        for (int j = 0; j < D; j++) {
            double yv = wp[j] * xp[r * D + j] * s;
            double dx = s * up[r * D + j] * wp[j] - xp[r * D + j] * s * s * s * dot / D;
            dw[j] += up[r * D + j] * xp[r * D + j] * s;
            max_y = fmax(max_y, fabs(accel_get(y, (int64_t[]){r, j}) - yv) / (1e-5 + fabs(yv)));
            if (x_grad)
                max_dx = fmax(max_dx, fabs(accel_get(x->grad, (int64_t[]){r, j}) - dx) / (1e-4 + fabs(dx)));
        }
    }
    double max_dw = 0.0;
    for (int j = 0; j < D && w_grad; j++)
        max_dw = fmax(max_dw, fabs(accel_get(w->grad, (int64_t[]){j}) - dw[j]) / (1e-4 + fabs(dw[j])));
    CHECK(x_grad == (x->grad != NULL) && w_grad == (w->grad != NULL));
    CHECK_MSG(max_y < 1e-4, "y rel err %g", max_y);
    CHECK_MSG(max_dx < 1e-3, "R %d: dx rel err %g (x grad %d, w grad %d)", R, max_dx, x_grad, w_grad);
    CHECK_MSG(max_dw < 1e-3, "R %d: dw rel err %g (x grad %d, w grad %d)", R, max_dw, x_grad, w_grad);
    free(dw);
    free(xp);
    free(wp);
    free(up);
    accel_tensor_free(x);
    accel_tensor_free(w);
    accel_tensor_free(u);
    accel_step_reset();
}

static void test_rms_norm_backward(void) {
    /* R*D > the OpenMP threshold; D not a multiple of the vector widths or of the column slices */
    static const int RD[2][2] = {{96, 320}, {24, 1003}};
    for (int c = 0; c < 2; c++) {
        rms_norm_backward_case(RD[c][0], RD[c][1], true, true);
        rms_norm_backward_case(RD[c][0], RD[c][1], false, true);
        rms_norm_backward_case(RD[c][0], RD[c][1], true, false);
    }
}

/* RMSNorm's row loops (norm_rows.c) sum a row in a fixed order: y, dx and
 * dw have the same bits under every ISA variant the CPU runs and every
 * thread count, with many rows (row blocks) and with few (column slices),
 * with the weight and without, f32 and bf16-rounded (the kernel's x_dt). */
static void rms_bits_run(int R, int D, bool weight, accel_dtype dt, float *out) {
    accel_tensor *x = gc_randn(21, ACCEL_SHAPE(R, D)), *w = gc_randn(22, ACCEL_SHAPE(D));
    accel_tensor *u = gc_randn(23, ACCEL_SHAPE(R, D));
    accel_requires_grad_(u, false);
    accel_tensor *xin = dt == ACCEL_F32 ? x : accel_to_dtype(x, dt);
    accel_tensor *y = accel_rms_norm(xin, weight ? w : NULL, 1e-6);
    CHECK(y && accel_backward(accel_sum_all(accel_mul(accel_to_dtype(y, ACCEL_F32), u))) == ACCEL_OK);
    CHECK(accel_to_floats(accel_to_dtype(y, ACCEL_F32), out) == ACCEL_OK);
    CHECK(x->grad && accel_to_floats(accel_to_dtype(x->grad, ACCEL_F32), out + (size_t)R * D) == ACCEL_OK);
    if (weight) CHECK(w->grad && accel_to_floats(w->grad, out + 2 * (size_t)R * D) == ACCEL_OK);
    accel_tensor_free(x);
    accel_tensor_free(w);
    accel_tensor_free(u);
    accel_step_reset();
}

static void test_rms_norm_same_bits(void) {
    static const int RD[2][2] = {{200, 100}, {24, 1003}};
    int was = accel_num_threads();
    accel__cpu_variant start = accel__cpu_variant_current();
    int compared = 0;
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 4; k++) {
            int R = RD[c][0], D = RD[c][1];
            bool weight = k % 2 == 0;
            accel_dtype dt = k < 2 ? ACCEL_F32 : ACCEL_BF16;
            size_t n = 2 * (size_t)R * D + (size_t)D;
            float *one = calloc(n, sizeof *one), *other = calloc(n, sizeof *other);
            CHECK(one && other);
            CHECK(accel__cpu_variant_use(ACCEL__CPU_BASELINE) == ACCEL_OK && accel_set_num_threads(1) == ACCEL_OK);
            rms_bits_run(R, D, weight, dt, one);
            for (int v = ACCEL__CPU_BASELINE; v < ACCEL__CPU_N_VARIANTS; v++)
                for (int threads = 1; threads <= 3; threads++) {
                    if (!accel__cpu_variant_runnable((accel__cpu_variant)v)) continue;
                    CHECK(accel__cpu_variant_use((accel__cpu_variant)v) == ACCEL_OK);
                    CHECK(accel_set_num_threads(threads) == ACCEL_OK);
                    memset(other, 0, n * sizeof *other);
                    rms_bits_run(R, D, weight, dt, other);
                    size_t diff = 0;
                    for (size_t i = 0; i < n; i++) diff += memcmp(&one[i], &other[i], 4) != 0;
                    CHECK_MSG(diff == 0, "R %d D %d weight %d %s, %s, %d threads: %zu of %zu values differ",
                              R, D, weight, accel_dtype_name(dt), accel__cpu_variant_name((accel__cpu_variant)v),
                              threads, diff, n);
                    compared++;
                }
            free(one);
            free(other);
        }
    printf("rms_norm: %d runs compared with the baseline's at 1 thread\n", compared);
    CHECK(accel__cpu_variant_use(start) == ACCEL_OK);
    accel_set_num_threads(was);
}

static void test_cross_entropy_large(void) {
    enum { N = 40, C = 1000 };
    accel_tensor *x = gc_randn(4, ACCEL_SHAPE(N, C));
    int64_t t[N];
    for (int i = 0; i < N; i++) t[i] = i % 7 == 3 ? -100 : (i * 37) % C;
    accel_tensor *tt = accel_from_data(ACCEL_I64, ACCEL_SHAPE(N), t);
    accel_tensor *loss = accel_cross_entropy(x, tt, -100);
    CHECK(loss && accel_backward(loss) == ACCEL_OK);
    float *xp = host_copy(x);
    double total = 0.0, max_g = 0.0;
    int count = 0;
    for (int i = 0; i < N; i++) count += t[i] != -100;
    for (int i = 0; i < N; i++) {
        double m = -INFINITY, s = 0.0;
        for (int j = 0; j < C; j++) m = fmax(m, xp[i * C + j]);
        for (int j = 0; j < C; j++) s += exp(xp[i * C + j] - m);
        double lse = m + log(s);
        if (t[i] != -100) total += lse - xp[i * C + t[i]];
        for (int j = 0; j < C; j++) {
            double g = t[i] == -100 ? 0.0 : (exp(xp[i * C + j] - lse) - (j == t[i])) / count;
            max_g = fmax(max_g, fabs(accel_get(x->grad, (int64_t[]){i, j}) - g));
        }
    }
    CHECK_CLOSE(accel_item(loss), total / count, 1e-5, 1e-6);
    CHECK_MSG(max_g < 1e-7, "grad abs err %g", max_g);
    free(xp);
    accel_tensor_free(x);
    accel_tensor_free(tt);
    accel_step_reset();
}

static void test_silu_large(void) {
    enum { N = 50000 };
    accel_tensor *x = gc_randn(5, ACCEL_SHAPE(N));
    accel_set(x, (int64_t[]){0}, -100.0); /* saturated ends */
    accel_set(x, (int64_t[]){1}, 100.0);
    accel_set(x, (int64_t[]){2}, -90.0);
    float *xp = host_copy(x);
    accel_tensor *y = accel_silu(x);
    CHECK(y && accel_backward(accel_sum_all(y)) == ACCEL_OK);
    double max_y = 0.0, max_g = 0.0;
    for (int i = 0; i < N; i++) {
        double v = xp[i], s = 1.0 / (1.0 + exp(-v));
        double yv = v * s, gv = s * (1.0 + v * (1.0 - s));
        max_y = fmax(max_y, fabs(accel_get(y, (int64_t[]){i}) - yv) / (1e-30 + fabs(yv)));
        /* silu' crosses 0 near x = -1.28: an absolute floor of a few float ulps */
        max_g = fmax(max_g, fabs(accel_get(x->grad, (int64_t[]){i}) - gv) / (2e-6 / 1e-5 + fabs(gv)));
    }
    CHECK_MSG(max_y < 1e-5, "silu rel err %g", max_y);
    CHECK_MSG(max_g < 1e-5, "silu grad err %g (rtol 1e-5, atol 2e-6)", max_g);
    free(xp);
    accel_tensor_free(x);
    accel_step_reset();
}

static void test_strided_copy(void) {
    /* [B, T, H, D] -> transpose(1, 2) -> contiguous: rows of D are memcpy runs;
     * transposing the last two dims makes element strides on both sides. */
    accel_tensor *a = gc_randn(6, ACCEL_SHAPE(3, 40, 5, 16));
    accel_requires_grad_(a, false);
    accel_tensor *views[2] = {accel_transpose(a, 1, 2), accel_transpose(a, 2, 3)};
    for (int k = 0; k < 2; k++) {
        accel_tensor *v = views[k];
        accel_tensor *c = accel_empty(ACCEL_F32, v->ndim, v->shape);
        accel_tensor *h = accel_empty(ACCEL_BF16, v->ndim, v->shape);
        CHECK(c && h && accel_copy_(c, v) == ACCEL_OK && accel_copy_(h, v) == ACCEL_OK);
        int bad = 0, bad_h = 0;
        int64_t i[4];
        for (i[0] = 0; i[0] < v->shape[0]; i[0]++)
            for (i[1] = 0; i[1] < v->shape[1]; i[1]++)
                for (i[2] = 0; i[2] < v->shape[2]; i[2]++)
                    for (i[3] = 0; i[3] < v->shape[3]; i[3]++) {
                        double want = accel_get(v, i);
                        bad += accel_get(c, i) != want;
                        bad_h += fabs(accel_get(h, i) - want) > 1e-2 * (1.0 + fabs(want));
                    }
        CHECK_MSG(bad == 0 && bad_h == 0, "view %d: %d f32 / %d bf16 mismatches", k, bad, bad_h);
    }
    accel_tensor_free(a);
    accel_step_reset();
}

/* The step's kernels that reduce over rows give the same bits whatever the
 * thread count (their partial sums follow the rows, not the threads): RMSNorm
 * and LayerNorm (their weight gradients), the fused cross-entropy (its loss),
 * the whole-tensor sum, the embedding's gradient; each run under 1, 2 and 3
 * threads, on sizes above their OpenMP thresholds, every value compared as
 * bits. The logits are a leaf: the GEMM providers' splits are not these
 * kernels'. */
enum { TB_R = 400, TB_D = 96, TB_V = 64, TB_OUT = 9 };

/* Runs the ops at one thread count; out receives every result, in order
 * (len[i] values of result i). */
static void thread_bits_run(int threads, float *out, int *len) {
    CHECK(accel_set_num_threads(threads) == ACCEL_OK);
    accel_tensor *x = gc_randn(11, ACCEL_SHAPE(TB_R, TB_D)), *w = gc_randn(12, ACCEL_SHAPE(TB_D));
    accel_tensor *b = gc_randn(13, ACCEL_SHAPE(TB_D)), *u = gc_randn(14, ACCEL_SHAPE(TB_R, TB_D));
    accel_tensor *e = gc_randn(15, ACCEL_SHAPE(TB_V, TB_D)), *logits = gc_randn(16, ACCEL_SHAPE(TB_R, TB_V));
    accel_requires_grad_(u, false);
    int64_t ids[TB_R];
    for (int i = 0; i < TB_R; i++) ids[i] = (i * 7) % TB_V;
    accel_tensor *idt = accel_from_data(ACCEL_I64, ACCEL_SHAPE(TB_R), ids);
    accel_tensor *ce = accel_cross_entropy(logits, idt, -100);
    accel_tensor *rms = accel_sum_all(accel_mul(accel_rms_norm(x, w, 1e-6), u));
    accel_tensor *ln = accel_sum_all(accel_mul(accel_layer_norm(x, w, b, 1e-5), u));
    accel_tensor *emb = accel_sum_all(accel_mul(accel_embedding(idt, e), u));
    accel_tensor *loss = accel_add(accel_add(ce, rms), accel_add(ln, emb));
    CHECK(loss && accel_backward(loss) == ACCEL_OK);
    accel_tensor *res[TB_OUT] = {ce, rms, ln, emb, x->grad, w->grad, b->grad, e->grad, logits->grad};
    for (int i = 0; i < TB_OUT; i++) {
        len[i] = res[i] ? (int)accel_numel(res[i]) : 0;
        CHECK(res[i] && accel_to_floats(res[i], out) == ACCEL_OK);
        out += len[i];
    }
    accel_tensor *own[] = {x, w, b, u, e, idt, logits};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) accel_tensor_free(own[i]);
    accel_step_reset();
}

static void test_same_bits_any_threads(void) {
    static const char *name[TB_OUT] = {"cross-entropy loss", "RMSNorm sum", "LayerNorm sum", "embedding sum",
                                       "x grad", "w grad", "b grad", "embedding grad", "logits grad"};
    int was = accel_num_threads(), len1[TB_OUT], len[TB_OUT];
    size_t cap = 4 + (size_t)TB_R * TB_D + 2 * TB_D + (size_t)TB_V * TB_D + (size_t)TB_R * TB_V;
    float *one = malloc(cap * sizeof *one), *other = malloc(cap * sizeof *other);
    CHECK(one && other);
    thread_bits_run(1, one, len1);
    for (int threads = 2; threads <= 3; threads++) {
        thread_bits_run(threads, other, len);
        for (int k = 0, o = 0; k < TB_OUT; o += len1[k], k++) {
            int diff = 0;
            for (int i = o; i < o + len1[k] && len[k] == len1[k]; i++) diff += memcmp(&one[i], &other[i], 4) != 0;
            CHECK_MSG(len[k] == len1[k] && diff == 0, "%d threads: %s: %d of %d values differ from 1 thread's bits",
                      threads, name[k], diff, len1[k]);
        }
    }
    accel_set_num_threads(was);
    free(one);
    free(other);
}

int main(void) {
    RUN(test_rms_norm_backward);
    RUN(test_rms_norm_same_bits);
    RUN(test_cross_entropy_large);
    RUN(test_silu_large);
    RUN(test_strided_copy);
    RUN(test_same_bits_any_threads);
    accel_thread_cleanup();
    return check_summary();
}
