/* accel_sdpa's blocked fast path (query blocks of 64 that skip the keys the
 * causal mask hides; heads in parallel or one after another) against the
 * reference kernels, on sequences of several blocks: partial last blocks,
 * Tq < Tk, Tq > Tk (whole blocks that see no key), GQA, and no mask; whole
 * blocks once more on each provider of the f32 tiles this machine has. */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"
#include "sdpa_tiles.h"

static void check_blocked(int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, bool causal) {
    accel_tensor *q = gc_randn(1, ACCEL_SHAPE(B, H, Tq, D)), *k = gc_randn(2, ACCEL_SHAPE(B, Hkv, Tk, D)),
                 *v = gc_randn(3, ACCEL_SHAPE(B, Hkv, Tk, D));
    accel_tensor *in[3] = {q, k, v};
    accel_tensor *y[2], *g[2][3];
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        accel_tensor *o = accel_sdpa(q, k, v, causal, 0.0);
        /* Weights that differ per element so that every gradient entry matters. */
        accel_tensor *w = gc_randn(4, ACCEL_SHAPE(B, H, Tq, D));
        CHECK(o && w && accel_backward(accel_sum_all(accel_mul(o, w))) == ACCEL_OK);
        accel_tensor_free(w);
        y[ref] = accel_tensor_clone_persistent(o, ACCEL_CPU_DEVICE);
        for (int i = 0; i < 3; i++) {
            g[ref][i] = accel_tensor_clone_persistent(in[i]->grad, ACCEL_CPU_DEVICE);
            accel_zero_(in[i]->grad);
        }
        accel_set_reference_kernels(prev);
        accel_step_reset();
    }
    CHECK_MSG(fx_compare("sdpa blocked vs ref", y[0], y[1], 1e-4, 1e-5) == 0, "Tq %lld Tk %lld causal %d",
              (long long)Tq, (long long)Tk, causal);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(fx_compare("sdpa blocked grad vs ref", g[0][i], g[1][i], 1e-4, 1e-4) == 0,
                  "input %d, Tq %lld Tk %lld causal %d", i, (long long)Tq, (long long)Tk, causal);
    for (int r = 0; r < 2; r++) {
        accel_tensor_free(y[r]);
        for (int i = 0; i < 3; i++) accel_tensor_free(g[r][i]);
    }
    for (int i = 0; i < 3; i++) accel_tensor_free(in[i]);
}

static void test_blocks(void) {
    check_blocked(1, 8, 2, 150, 150, 16, true);  /* 3 blocks, partial last, heads in parallel */
    check_blocked(1, 2, 1, 100, 230, 8, true);   /* Tq < Tk: blocks see a prefix plus the diagonal */
    check_blocked(1, 1, 1, 200, 70, 8, true);    /* Tq > Tk: first blocks see no key; serial heads */
    check_blocked(2, 4, 4, 130, 130, 8, false);  /* no mask: every block sees all keys */
}

/* The output and input gradients of one fast run (dO random), as floats
 * into out (o, dq, dk, dv). */
static void fast_run(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D, float *out) {
    accel_tensor *in[3] = {gc_randn(1, ACCEL_SHAPE(B, H, T, D)), gc_randn(2, ACCEL_SHAPE(B, Hkv, T, D)),
                           gc_randn(3, ACCEL_SHAPE(B, Hkv, T, D))};
    accel_tensor *o = accel_sdpa(in[0], in[1], in[2], true, 0.0), *w = gc_randn(4, ACCEL_SHAPE(B, H, T, D));
    CHECK(o && w && accel_backward(accel_sum_all(accel_mul(o, w))) == ACCEL_OK);
    accel_to_floats(o, out);
    int64_t nq = B * H * T * D, nk = B * Hkv * T * D;
    accel_to_floats(in[0]->grad, out + nq);
    accel_to_floats(in[1]->grad, out + 2 * nq);
    accel_to_floats(in[2]->grad, out + 2 * nq + nk);
    accel_tensor_free(w);
    for (int i = 0; i < 3; i++) accel_tensor_free(in[i]);
    accel_step_reset();
}

/* The same bits from run to run on one provider and thread count, heads in
 * parallel (2 threads) and one after another (each GEMM threaded). */
static void check_same_bits(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D) {
    size_t n = (size_t)(2 * B * H * T * D + 2 * B * Hkv * T * D);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    CHECK(a && b);
    fast_run(B, H, Hkv, T, D, a);
    fast_run(B, H, Hkv, T, D, b);
    CHECK_MSG(memcmp(a, b, n * sizeof *a) == 0, "B %lld H %lld T %lld: two runs differ", (long long)B, (long long)H,
              (long long)T);
    free(a);
    free(b);
}

/* Whole query blocks on each provider of the f32 tiles this machine has
 * (OpenBLAS, oneDNN's f32 matmul, keys in 256-key chunks), against the
 * reference: the same tolerances; and the same bits twice. */
static void test_each_provider(void) {
    static const int P[] = {ACCEL__GEMM_PROVIDER_OPENBLAS, ACCEL__GEMM_PROVIDER_DNNL};
    for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
        if (!(accel__gemm_tiles_candidates(ACCEL_F32) & 1u << P[i])) continue;
        sdpa_tiles_force(P[i]);
        accel_k_sdpa_dims d = {.B = 1, .H = 8, .Hkv = 2, .Tq = 128, .Tk = 320, .D = 16, .Dv = 16};
        if (sdpa_tiles_measured())
            CHECK_MSG(accel__cpu_sdpa_provider(ACCEL_F32, &d) == P[i], "forced %s: got %d",
                      accel__gemm_provider_name((accel__gemm_provider)P[i]), accel__cpu_sdpa_provider(ACCEL_F32, &d));
        check_blocked(1, 8, 2, 128, 320, 16, true);  /* Tq < Tk, past a 256-key chunk, heads in parallel */
        check_blocked(1, 2, 1, 192, 192, 24, true);  /* three blocks, heads one after another */
        check_blocked(2, 4, 4, 64, 256, 8, false);   /* no mask: one whole chunk */
        check_same_bits(2, 4, 2, 320, 16);           /* kv heads in parallel */
        check_same_bits(1, 1, 1, 320, 16);           /* one head: GEMMs threaded */
        sdpa_tiles_unforce();
    }
}

int main(void) {
    RUN(test_blocks);
    RUN(test_each_provider);
    accel_thread_cleanup();
    return check_summary();
}
