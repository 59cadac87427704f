/* The CPU GEMM providers (src/backends/cpu/gemm.h): each one against the
 * reference loop on odd shapes, every transpose, padded leading dims, alpha
 * and beta (beta 0 over NaNs), f32/bf16/f16 operands and mixed ones; the
 * choice per mode, dtype and CPU; the primitive cache used by many threads
 * at once; the description in `accel env` / accel_accelerator_describe.
 *
 * Run as `test_gemm_providers` (the modes in turn, through
 * accel__gemm_set_mode) and by ctest with ACCEL_GEMM set
 * (`--env openblas|dnnl|bogus`: the variable is read, or refused). */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>

#include "accel/accel.h"
#include "accel/cpu.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/openblas_core.h"
#include "check.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* rows x ld random values of dtype dt, and the same values as f32 in *wide. */
static void *operand(accel_dtype dt, int64_t rows, int64_t ld, uint64_t seed, float **wide) {
    size_t n = (size_t)(rows * ld);
    float *f = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) f[i] = frand(&seed);
    void *p = malloc(n * accel_dtype_size(dt) + 1);
    accel_convert(p, dt, f, ACCEL_F32, n);
    accel_convert(f, ACCEL_F32, p, dt, n); /* the values dt holds */
    *wide = f;
    return p;
}

typedef struct gemm_case {
    bool ta, tb;
    int64_t M, N, K, pad;
    float alpha, beta;
} gemm_case;

/* accel__gemm of operands of dtypes adt/bdt (accel__gemm_on(provider)
 * where provider >= 0) against the reference loop on the values they hold;
 * the columns of C past N (padding) must stay. */
static void check_case_on(int provider, const gemm_case *c, accel_dtype adt, accel_dtype bdt, uint64_t seed) {
    int64_t M = c->M, N = c->N, K = c->K;
    int64_t ar = c->ta ? K : M, ac = c->ta ? M : K, br = c->tb ? N : K, bc = c->tb ? K : N;
    int64_t lda = ac + c->pad, ldb = bc + c->pad, ldc = N + c->pad;
    float *aw, *bw;
    void *A = operand(adt, ar, lda, seed, &aw), *B = operand(bdt, br, ldb, seed + 1, &bw);
    float *C = malloc(sizeof(float) * (size_t)(M * ldc)), *R = malloc(sizeof(float) * (size_t)(M * ldc));
    uint64_t s = seed + 2;
    for (int64_t i = 0; i < M * ldc; i++) C[i] = c->beta == 0.0f && i % ldc < N ? NAN : frand(&s);
    memcpy(R, C, sizeof(float) * (size_t)(M * ldc));
    accel__sgemm_ref(c->ta, c->tb, M, N, K, c->alpha, aw, lda, bw, ldb, c->beta, R, ldc);
    accel_status st = provider < 0 ? accel__gemm(c->ta, c->tb, M, N, K, c->alpha, A, adt, lda, B, bdt, ldb, c->beta, C, ldc)
                                   : accel__gemm_on(provider, c->ta, c->tb, M, N, K, c->alpha, A, adt, lda, B, bdt, ldb,
                                                    c->beta, C, ldc);
    CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error());
    int64_t bad_i = -1, bad_j = -1;
    for (int64_t i = 0; i < M && bad_i < 0; i++)
        for (int64_t j = 0; j < ldc && bad_i < 0; j++) {
            double mag = 0.0; /* sum |a||b|: the scale of the rounding error */
            for (int64_t k = 0; k < K && j < N; k++)
                mag += fabs((double)(c->ta ? aw[k * lda + i] : aw[i * lda + k]) *
                            (double)(c->tb ? bw[j * ldb + k] : bw[k * ldb + j]));
            double tol = 2e-6 * (fabs(c->alpha) * mag + 1.0) * (1.0 + sqrt((double)K));
            if (!(fabs((double)C[i * ldc + j] - R[i * ldc + j]) <= tol)) bad_i = i, bad_j = j;
        }
    CHECK_MSG(bad_i < 0, "%s x %s %c%c M=%lld N=%lld K=%lld pad=%lld alpha=%g beta=%g: C[%lld,%lld] = %.9g, "
              "reference %.9g (%s)", accel_dtype_name(adt), accel_dtype_name(bdt), c->ta ? 'T' : 'N',
              c->tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K, (long long)c->pad, c->alpha, c->beta,
              (long long)bad_i, (long long)bad_j, bad_i < 0 ? 0.0 : C[bad_i * ldc + bad_j],
              bad_i < 0 ? 0.0 : R[bad_i * ldc + bad_j], bad_j < N ? "product" : "padding");
    free(A), free(B), free(aw), free(bw), free(C), free(R);
    accel_step_reset();
}

static const int64_t SHAPES[][3] = {{1, 1, 1},   {2, 70, 50},   {3, 5, 7},   {17, 33, 9},  {37, 29, 53},
                                    {64, 31, 129}, {130, 150, 70}, {5, 200, 3}, {1, 300, 257}, {4, 5, 0}};
static const float ALPHA_BETA[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {1.5f, 0.25f}};

/* Every shape, transpose, alpha and beta on provider p (accel__gemm's own
 * choice where p < 0). */
static void check_all_cases_on(int p, accel_dtype adt, accel_dtype bdt) {
    uint64_t seed = 1;
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++)
        for (int t = 0; t < 4; t++)
            for (size_t ab = 0; ab < sizeof ALPHA_BETA / sizeof ALPHA_BETA[0]; ab++) {
                int64_t pad = (t + ab) % 2 ? 3 : 0; /* dense and padded leading dims, in turn */
                gemm_case c = {t & 1, t >> 1, SHAPES[s][0], SHAPES[s][1], SHAPES[s][2], pad,
                               ALPHA_BETA[ab][0], ALPHA_BETA[ab][1]};
                check_case_on(p, &c, adt, bdt, seed++);
            }
}

static void check_all_cases(accel_dtype adt, accel_dtype bdt) { check_all_cases_on(-1, adt, bdt); }

static const accel_dtype DTYPES[] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};

static int provider(accel_dtype dt) { return accel__gemm_provider_for(dt, false, true, 64, 64, 64); }

static void check_every_dtype(void) {
    for (size_t d = 0; d < 3; d++) {
        accel_dtype dt = DTYPES[d];
        fprintf(stderr, "  %s: %s\n", accel_dtype_name(dt), accel__gemm_provider_name(provider(dt)));
        check_all_cases(dt, dt);
    }
    /* bf16 beside f32 is widened: exactly the f32 GEMM of the values held. */
    check_all_cases(ACCEL_BF16, ACCEL_F32);
    check_all_cases(ACCEL_F32, ACCEL_F16);
}

static void test_openblas_against_reference(void) {
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_OPENBLAS) == ACCEL_OK);
    for (size_t d = 0; d < 3; d++) CHECK(provider(DTYPES[d]) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    check_every_dtype();
}

static void test_dnnl_against_reference(void) {
    if (!accel__gemm_have_dnnl()) {
        accel_clear_error();
        CHECK(accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(accel_last_error(), "no oneDNN");
        accel_clear_error();
        fprintf(stderr, "  (this build has no oneDNN)\n");
        return;
    }
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK);
    /* oneDNN has an f32 and a bf16 matmul on every x86-64 CPU. */
    CHECK(provider(ACCEL_F32) == ACCEL__GEMM_PROVIDER_DNNL);
    CHECK(provider(ACCEL_BF16) == ACCEL__GEMM_PROVIDER_DNNL);
    check_every_dtype();
}

static void test_reference_kernels_win(void) {
    CHECK(accel__gemm_set_mode(accel__gemm_have_dnnl() ? ACCEL__GEMM_DNNL : ACCEL__GEMM_OPENBLAS) == ACCEL_OK);
    accel_set_reference_kernels(true);
    for (size_t d = 0; d < 3; d++) CHECK(provider(DTYPES[d]) == ACCEL__GEMM_PROVIDER_REFERENCE);
    char buf[512];
    CHECK_STR_CONTAINS(accel__gemm_describe(buf, sizeof buf), "GEMM: reference");
    accel_set_reference_kernels(false);
}

/* Auto: f32 on OpenBLAS off the table; bf16/f16 on oneDNN exactly when the
 * CPU has units for them and oneDNN is built in. */
static void test_auto_choice(void) {
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    uint32_t f = accel_cpu_info_get()->features;
    CHECK(accel__gemm_provider_for(ACCEL_F32, false, true, 37, 29, 53) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    bool bf16_units = (f & (ACCEL_CPU_AMX_BF16 | ACCEL_CPU_AVX512_BF16)) != 0;
    int want = bf16_units && accel__gemm_have_dnnl() ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS;
    CHECK_MSG(provider(ACCEL_BF16) == want, "bf16 on %s", accel__gemm_provider_name(provider(ACCEL_BF16)));
    CHECK(accel__gemm_native(ACCEL_BF16) == (want == ACCEL__GEMM_PROVIDER_DNNL));
    CHECK(accel__gemm_native(ACCEL_F32));
    if (!(f & (ACCEL_CPU_AMX_FP16 | ACCEL_CPU_AVX512_FP16)))
        CHECK(provider(ACCEL_F16) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    check_all_cases(ACCEL_F32, ACCEL_F32);
    check_all_cases(ACCEL_BF16, ACCEL_BF16);
}

/* oneDNN on row blocks (ACCEL__GEMM_PROVIDER_DNNL_ROWS, a candidate of the
 * measured choice for a transposed A): every transpose, alpha and beta,
 * f32 and bf16, on 2 and 3 threads and on row counts that split into
 * blocks of unequal sizes (130: 80 + 50; 2100: one block per thread; 8200:
 * 4 per thread), and inside a parallel region (not split). */
static void test_dnnl_rows_against_reference(void) {
    if (!accel__gemm_have_dnnl()) {
        fprintf(stderr, "  (this build has no oneDNN)\n");
        return;
    }
    static const int64_t ROWS[][3] = {{130, 150, 70}, {2100, 20, 17}, {8200, 3, 5}, {64, 31, 129}};
    int threads = accel_num_threads();
    uint64_t seed = 7;
    for (int nt = 2; nt <= 3; nt++) {
        accel_set_num_threads(nt);
        for (size_t s = 0; s < sizeof ROWS / sizeof ROWS[0]; s++)
            for (int t = 0; t < 4; t++)
                for (size_t ab = 0; ab < sizeof ALPHA_BETA / sizeof ALPHA_BETA[0]; ab++) {
                    gemm_case c = {t & 1, t >> 1, ROWS[s][0], ROWS[s][1], ROWS[s][2], (t + ab) % 2 ? 3 : 0,
                                   ALPHA_BETA[ab][0], ALPHA_BETA[ab][1]};
                    check_case_on(ACCEL__GEMM_PROVIDER_DNNL_ROWS, &c, ACCEL_F32, ACCEL_F32, seed++);
                    check_case_on(ACCEL__GEMM_PROVIDER_DNNL_ROWS, &c, ACCEL_BF16, ACCEL_BF16, seed++);
                }
    }
    accel_set_num_threads(threads);
#pragma omp parallel num_threads(2)
#pragma omp master
    check_case_on(ACCEL__GEMM_PROVIDER_DNNL_ROWS, &(gemm_case){true, false, 130, 40, 33, 0, 1.0f, 1.0f}, ACCEL_F32,
                  ACCEL_F32, seed);
}

/* oneDNN's f32 matmul on bf16/f16 operands widened per call
 * (ACCEL__GEMM_PROVIDER_DNNL_F32, a candidate of the measured choice), run
 * here whatever this CPU's choice: every shape, transpose, alpha and beta
 * against the reference loop (exact products, f32 sums), mixed operands,
 * inside a parallel region (its panels given back: test_call_leaves_the_arena). */
static void test_dnnl_f32_against_reference(void) {
    if (!accel__gemm_have_dnnl()) {
        fprintf(stderr, "  (this build has no oneDNN)\n");
        return;
    }
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    check_all_cases_on(ACCEL__GEMM_PROVIDER_DNNL_F32, ACCEL_BF16, ACCEL_BF16);
    check_all_cases_on(ACCEL__GEMM_PROVIDER_DNNL_F32, ACCEL_F16, ACCEL_F16);
    check_all_cases_on(ACCEL__GEMM_PROVIDER_DNNL_F32, ACCEL_BF16, ACCEL_F32);
#pragma omp parallel num_threads(2)
#pragma omp master
    check_case_on(ACCEL__GEMM_PROVIDER_DNNL_F32, &(gemm_case){true, true, 130, 40, 33, 3, 1.0f, 1.0f}, ACCEL_BF16,
                  ACCEL_BF16, 99);
}

/* Many threads create and run the same few primitives at once (each GEMM
 * inside the parallel region runs on its thread alone). */
static void test_threads_share_the_cache(void) {
    CHECK(accel__gemm_set_mode(accel__gemm_have_dnnl() ? ACCEL__GEMM_DNNL : ACCEL__GEMM_OPENBLAS) == ACCEL_OK);
    int failures = 0;
#pragma omp parallel for num_threads(4) schedule(dynamic) reduction(+ : failures)
    for (int i = 0; i < 32; i++) {
        int64_t M = 20 + i % 3, N = 24, K = 40;
        accel_dtype dt = i % 2 ? ACCEL_BF16 : ACCEL_F32;
        float *aw, *bw;
        void *A = operand(dt, M, K, (uint64_t)i, &aw), *B = operand(dt, N, K, (uint64_t)i + 100, &bw);
        float C[22 * 24], R[22 * 24];
        accel__sgemm_ref(false, true, M, N, K, 1.0f, aw, K, bw, K, 0.0f, R, N);
        if (accel__gemm(false, true, M, N, K, 1.0f, A, dt, K, B, dt, K, 0.0f, C, N) != ACCEL_OK) failures++;
        for (int64_t j = 0; j < M * N; j++)
            if (!(fabsf(C[j] - R[j]) <= 1e-4f * (1.0f + fabsf(R[j])))) failures++;
        free(A), free(B), free(aw), free(bw);
        accel_thread_cleanup(); /* the scratchpads came from this thread's step arena */
    }
    CHECK_MSG(failures == 0, "%d failures", failures);
}

/* A thread keeps its oneDNN stream and each primitive's memory objects
 * between calls (gemm_dnnl.c), their data handles set per call: the same
 * signature on other operands, in threads that end and are replaced (their
 * state freed with them), must read the new operands each time. */
static void *same_signature_twice(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    for (int i = 0; i < 2; i++) {
        check_case_on(ACCEL__GEMM_PROVIDER_DNNL, &(gemm_case){false, true, 37, 29, 53, 0, 1.0f, 0.0f}, ACCEL_BF16,
                      ACCEL_BF16, seed + 10 * (uint64_t)i);
        check_case_on(ACCEL__GEMM_PROVIDER_DNNL, &(gemm_case){true, false, 17, 33, 9, 3, 0.5f, 1.0f}, ACCEL_F32,
                      ACCEL_F32, seed + 10 * (uint64_t)i + 1);
    }
    accel_thread_cleanup();
    return NULL;
}

static void test_threads_keep_their_objects(void) {
    if (!accel__gemm_have_dnnl()) return;
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK);
    same_signature_twice((void *)(uintptr_t)500);
    for (int t = 0; t < 3; t++) { /* one at a time: check.h's counters are plain ints */
        pthread_t th;
        CHECK(pthread_create(&th, NULL, same_signature_twice, (void *)(uintptr_t)(600 + 100 * t)) == 0);
        CHECK(pthread_join(th, NULL) == 0);
    }
    same_signature_twice((void *)(uintptr_t)900);
}

static void test_describe(void) {
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    char buf[1024];
    const char *d = accel__gemm_describe(buf, sizeof buf);
    CHECK(d == buf);
    CHECK_STR_CONTAINS(d, "GEMM f32: openblas");
    CHECK_STR_CONTAINS(d, "\nGEMM bf16: ");
    CHECK_STR_CONTAINS(d, "\nGEMM f16: ");
    if (!accel__gemm_have_dnnl()) CHECK_STR_CONTAINS(d, "oneDNN not built in");
    else if (!accel__gemm_native(ACCEL_BF16)) CHECK_STR_CONTAINS(d, "GEMM bf16: openblas on f32 operands");
    else CHECK_STR_CONTAINS(d, "GEMM bf16: dnnl (");
    /* decode's few rows against a bf16 weight go to accel's own kernel in auto mode */
    if (!accel__gemm_native(ACCEL_BF16)) CHECK_STR_CONTAINS(d, "against a bf16 weight: accel's bf16-weight kernel");
    /* accel_accelerator_describe carries the same lines. */
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(acc != NULL);
    char adesc[4096];
    CHECK_STR_CONTAINS(accel_accelerator_describe(acc, adesc, sizeof adesc), d);
    accel_accelerator_free(acc);
    if (accel__gemm_have_dnnl()) {
        CHECK(accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK);
        CHECK_STR_CONTAINS(accel__gemm_describe(buf, sizeof buf), "GEMM f32: dnnl (");
        CHECK_STR_CONTAINS(buf, "ACCEL_GEMM=dnnl");
    }
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_OPENBLAS) == ACCEL_OK);
    CHECK_STR_CONTAINS(accel__gemm_describe(buf, sizeof buf), "GEMM f32: openblas (ACCEL_GEMM=openblas)");
    CHECK(accel__gemm_set_mode((accel__gemm_mode)7) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
}

/* Under autocast bf16 the linear layer's forward and backward match the
 * f32 computation on the bf16-rounded values within bf16 tolerance, on
 * every provider (oneDNN gets bf16 operands, OpenBLAS f32 ones). */
static void test_linear_autocast_per_provider(void) {
    accel__gemm_mode modes[2] = {ACCEL__GEMM_OPENBLAS, ACCEL__GEMM_DNNL};
    float out[2][6 * 5], gx[2][6 * 7], gw[2][5 * 7];
    int n = accel__gemm_have_dnnl() ? 2 : 1;
    for (int m = 0; m < n; m++) {
        CHECK(accel__gemm_set_mode(modes[m]) == ACCEL_OK);
                accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(6, 7));
        accel_tensor *w = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(5, 7), ACCEL_CPU_DEVICE);
        accel_rng r;
        accel_rng_init(&r, 4);
        accel_rng_normal_(&r, x, 0.0, 1.0);
        accel_rng_normal_(&r, w, 0.0, 1.0);
        accel_requires_grad_(x, true);
        accel_requires_grad_(w, true);
        accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
        accel_tensor *y = accel_linear(x, w, NULL);
        accel_autocast_end(prev);
        CHECK(y && y->dtype == ACCEL_BF16);
        accel_tensor *yf = accel_to_dtype(y, ACCEL_F32);
        accel_tensor *loss = accel_sum_all(accel_mul(yf, yf));
        CHECK(accel_backward(loss) == ACCEL_OK);
        accel_to_floats(y, out[m]);
        accel_to_floats(x->grad, gx[m]);
        accel_to_floats(w->grad, gw[m]);
        x->grad = NULL;
        accel_tensor_free(w);
        accel_step_reset();
    }
    for (int m = 1; m < n; m++) {
        for (int i = 0; i < 30; i++) CHECK_CLOSE(out[m][i], out[0][i], 2e-2, 2e-2);
        for (int i = 0; i < 42; i++) CHECK_CLOSE(gx[m][i], gx[0][i], 3e-2, 5e-2);
        for (int i = 0; i < 35; i++) CHECK_CLOSE(gw[m][i], gw[0][i], 3e-2, 5e-2);
    }
}

/* What a GEMM call takes of the step arena for itself (operands widened for
 * the call, oneDNN's scratchpad: tens of KB a call for brgemm on AVX-512)
 * is freed at its end, on every provider, dtype pair and the weight path: a
 * step's peak never holds more than one call's worth, so the memory model
 * (src/bigmodel/training_memory.c) holds on every CPU kind. */
static void test_call_leaves_the_arena(void) {
    accel__gemm_mode modes[2] = {ACCEL__GEMM_OPENBLAS, ACCEL__GEMM_DNNL};
    static const accel_dtype PAIRS[][2] = {{ACCEL_F32, ACCEL_F32}, {ACCEL_BF16, ACCEL_BF16}, {ACCEL_BF16, ACCEL_F32},
                                           {ACCEL_F16, ACCEL_F16}};
    enum { M = 96, N = 64, K = 80 };
    accel_arena *arena = accel_step_arena();
    /* every oneDNN call takes an AVX-512 brgemm's scratchpad, whatever this CPU's is */
    accel__gemm_test_scratchpad(64 << 10);
    for (int m = 0; m < (accel__gemm_have_dnnl() ? 2 : 1); m++) {
        CHECK(accel__gemm_set_mode(modes[m]) == ACCEL_OK);
        for (size_t p = 0; p < sizeof PAIRS / sizeof PAIRS[0]; p++)
            for (int tb = 0; tb < 2; tb++) {
                accel_dtype adt = PAIRS[p][0], bdt = PAIRS[p][1];
                float *aw, *bw, C[M * N];
                void *A = operand(adt, M, K, 5, &aw), *B = operand(bdt, tb ? N : K, tb ? K : N, 6, &bw);
                accel_tensor *w = accel_tensor_new(bdt, 2, (int64_t[]){tb ? N : K, tb ? K : N}, ACCEL_CPU_DEVICE);
                memcpy(w->data, B, accel_nbytes(w));
                size_t used = accel_arena_used(arena);
                CHECK(accel__gemm(false, tb, M, N, K, 1.0f, A, adt, K, B, bdt, tb ? K : N, 0.0f, C, N) == ACCEL_OK);
                CHECK_MSG(accel_arena_used(arena) == used, "%s: %s x %s %s: %zu bytes left in the step arena",
                          accel__gemm_provider_name(provider(adt)), accel_dtype_name(adt), accel_dtype_name(bdt),
                          tb ? "NT" : "NN", accel_arena_used(arena) - used);
                CHECK(accel__gemm_weight(false, tb, M, N, K, 1.0f, A, adt, K, w, 0, tb ? K : N, 0.0f, C, N) ==
                      ACCEL_OK);
                CHECK_MSG(accel_arena_used(arena) == used, "the weight path left %zu bytes",
                          accel_arena_used(arena) - used);
                /* oneDNN's f32 matmul on the operands widened for the call */
                CHECK(m == 0 || accel__gemm_on(ACCEL__GEMM_PROVIDER_DNNL_F32, false, tb, M, N, K, 1.0f, A, adt, K, B,
                                               bdt, tb ? K : N, 0.0f, C, N) == ACCEL_OK);
                CHECK_MSG(accel_arena_used(arena) == used, "dnnl_f32 left %zu bytes", accel_arena_used(arena) - used);
                accel_tensor_free(w);
                free(A), free(B), free(aw), free(bw);
                accel_step_reset();
            }
    }
    accel__gemm_test_scratchpad(0);
}

/* ctest's runs with ACCEL_GEMM in the environment. */
static int env_run(const char *want) {
    if (!strcmp(want, "bogus")) {
        float a = 1.0f, b = 2.0f, c = 0.0f;
        CHECK(accel__gemm(false, false, 1, 1, 1, 1.0f, &a, ACCEL_F32, 1, &b, ACCEL_F32, 1, 0.0f, &c, 1) ==
              ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "ACCEL_GEMM=bogus: expected auto, openblas or dnnl");
        accel_tensor *x = accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 3)), *w = accel_ones(ACCEL_F32, ACCEL_SHAPE(4, 3));
        CHECK(accel_linear(x, w, NULL) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "ACCEL_GEMM=bogus");
        char buf[512];
        CHECK_STR_CONTAINS(accel__gemm_describe(buf, sizeof buf), "GEMM: none (ACCEL_GEMM=bogus");
        accel_step_reset();
    } else {
        int p = !strcmp(want, "dnnl") ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS;
        CHECK(provider(ACCEL_F32) == p);
        char buf[512], tag[64];
        snprintf(tag, sizeof tag, "ACCEL_GEMM=%s", want);
        CHECK_STR_CONTAINS(accel__gemm_describe(buf, sizeof buf), tag);
        check_all_cases(ACCEL_F32, ACCEL_F32);
        check_all_cases(ACCEL_BF16, ACCEL_BF16);
    }
    accel_thread_cleanup();
    return check_summary();
}

int main(int argc, char **argv) {
    /* OpenBLAS taken to run this CPU's own core: the rule these tests
     * expect (test_openblas_core.c runs a fallback core's) */
    accel__openblas_test_core(accel__openblas_core_for(accel__cpu_vector_level_get()));
    if (argc == 3 && !strcmp(argv[1], "--env")) return env_run(argv[2]);
    RUN(test_openblas_against_reference);
    RUN(test_dnnl_against_reference);
    RUN(test_reference_kernels_win);
    RUN(test_auto_choice);
    RUN(test_dnnl_rows_against_reference);
    RUN(test_dnnl_f32_against_reference);
    RUN(test_threads_share_the_cache);
    RUN(test_threads_keep_their_objects);
    RUN(test_describe);
    RUN(test_linear_autocast_per_provider);
    RUN(test_call_leaves_the_arena);
    accel_thread_cleanup();
    return check_summary();
}
