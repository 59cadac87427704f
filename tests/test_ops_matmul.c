/* accel_matmul, accel_linear and the CPU GEMM: fast vs reference, finite
 * differences, PyTorch fixtures, autocast, meta, errors. */
#include "accel/accel.h"
#include "backends/registry.h"
#include "backends/cpu/gemm.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

static accel_tensor *randn(uint64_t seed, int ndim, const int64_t *shape) {
    accel_tensor *t = accel_empty(ACCEL_F32, ndim, shape);
    accel_rng r;
    accel_rng_init(&r, seed);
    accel_rng_normal_(&r, t, 0.0, 1.0);
    return t;
}

static double max_diff(const accel_tensor *a, const accel_tensor *b) {
    if (!a || !b || !accel_same_shape(a, b)) return INFINITY;
    int64_t n = accel_numel(a);
    float *x = malloc(sizeof(float) * (size_t)(2 * n + 1)), *y = x + n;
    accel_to_floats(a, x);
    accel_to_floats(b, y);
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - y[i]);
        m = d > m || isnan(d) ? d : m;
    }
    free(x);
    return m;
}

static void test_gemm_fast_vs_reference(void) {
    /* The CPU GEMM itself, on host memory whatever the default device. */
    accel_device prev = accel_set_default_device(ACCEL_CPU_DEVICE);
    int64_t M = 37, N = 29, K = 53;
    accel_tensor *A = randn(1, ACCEL_SHAPE(K * M)), *B = randn(2, ACCEL_SHAPE(K * N));
    accel_tensor *C1 = randn(3, ACCEL_SHAPE(M * N)), *C2 = accel_empty(ACCEL_F32, ACCEL_SHAPE(M * N));
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t lda = ta ? M : K, ldb = tb ? K : N;
            accel_copy_(C2, C1);
            accel__sgemm(ta, tb, M, N, K, 0.5f, A->data, lda, B->data, ldb, 0.25f, C1->data, N);
            accel__sgemm_ref(ta, tb, M, N, K, 0.5f, A->data, lda, B->data, ldb, 0.25f, C2->data, N);
            CHECK(max_diff(C1, C2) < 1e-4);
            accel_copy_(C1, C2);
        }
    /* bf16 operands: converted panels, f32 accumulation == f32 GEMM of the rounded values. */
    accel_tensor *Ab = accel_empty(ACCEL_BF16, ACCEL_SHAPE(M * K)), *Ar = accel_empty(ACCEL_F32, ACCEL_SHAPE(M * K));
    accel_copy_(Ab, A);
    accel_copy_(Ar, Ab);
    CHECK(accel__gemm(false, true, M, N, K, 1.0f, Ab->data, ACCEL_BF16, K, B->data, ACCEL_F32, K, 0.0f, C1->data, N) ==
          ACCEL_OK);
    accel__sgemm_ref(false, true, M, N, K, 1.0f, Ar->data, K, B->data, K, 0.0f, C2->data, N);
    CHECK(max_diff(C1, C2) < 1e-4);
    CHECK(accel__gemm(false, false, 2, 2, 2, 1.0f, A->data, ACCEL_I64, 2, B->data, ACCEL_F32, 2, 0.0f, C1->data, 2) ==
          ACCEL_ERR_DTYPE);
    accel_clear_error();
    accel_step_reset();
    accel_set_default_device(prev);
}

/* out computed by the fast path vs the reference path, and vs a naive loop. */
/* accel__sgemm against the reference on one shape, every transpose, padded
 * leading dims, beta 0 over NaNs (one in every row of C) and beta != 0;
 * the padding columns of C (ldc > N) are not written, and compared too.
 * Operands from seeds sa, sb; the error bound is tol (1 + sqrt(K)). */
static void check_sgemm_vs_reference(int64_t M, int64_t N, int64_t K, float alpha, float beta_nz, uint64_t sa,
                                     uint64_t sb, double tol) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bz = 0; bz < 2; bz++) {
                int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
                accel_tensor *A = randn(sa, ACCEL_SHAPE((ta ? K : M) * lda));
                accel_tensor *B = randn(sb, ACCEL_SHAPE((tb ? N : K) * ldb));
                accel_tensor *C1 = randn(30, ACCEL_SHAPE(M * ldc));
                accel_tensor *C2 = accel_empty(ACCEL_F32, ACCEL_SHAPE(M * ldc));
                float beta = bz ? 0.0f : beta_nz;
                if (bz) /* beta == 0: whatever C holds is ignored, NaN included */
                    for (int64_t i = 0; i < M; i++) ((float *)C1->data)[i * ldc + i % N] = NAN;
                accel_copy_(C2, C1);
                accel__sgemm(ta, tb, M, N, K, alpha, A->data, lda, B->data, ldb, beta, C1->data, ldc);
                accel__sgemm_ref(ta, tb, M, N, K, alpha, A->data, lda, B->data, ldb, beta, C2->data, ldc);
                CHECK_MSG(max_diff(C1, C2) < tol * (1 + sqrt((double)K)), "M=%lld N=%lld K=%lld ta=%d tb=%d beta=%g",
                          (long long)M, (long long)N, (long long)K, ta, tb, (double)beta);
                accel_step_reset();
            }
}

/* Small M (1..4: one matrix-vector product per row of op(A)) against the
 * reference on odd sizes, and a product large enough to be split across
 * the threads (N * K >= 4M multiply-adds). */
static void test_gemm_small_m_vs_reference(void) {
    /* The CPU GEMM itself, on host memory whatever the default device. */
    accel_device prev = accel_set_default_device(ACCEL_CPU_DEVICE);
    const int64_t sizes[][2] = {{1, 1}, {37, 29}, {5, 131}, {4099, 1001}};
    for (int s = 0; s < 4; s++) {
        int64_t N = sizes[s][0], K = sizes[s][1];
        bool big = N * K > 1000000;
        for (int64_t M = 1; M <= 4; M++) {
            if (big && M > 1) continue; /* keep the reference loop short */
            check_sgemm_vs_reference(M, N, K, 1.5f, -0.75f, 10 + (uint64_t)M, 20 + (uint64_t)s, 1e-3);
        }
    }
    accel_set_default_device(prev);
}

/* A few rows against a bf16 weight (Y = X W^T, the decode shape): the skinny
 * kernel that reads the weight as bf16, against the reference GEMM of the
 * bf16-rounded values, for f32 and bf16 rows of A, padded leading dims, K
 * over one block of the kernel, beta 0 over NaNs and beta != 0, and an
 * lm_head-sized product split across the threads. */
static void test_gemm_bf16_weight_small_m(void) {
    accel_device prev = accel_set_default_device(ACCEL_CPU_DEVICE);
    const int64_t sizes[][2] = {{1, 1}, {37, 29}, {5, 1031}, {4099, 1001}};
    for (int s = 0; s < 4; s++)
        for (int64_t M = 1; M <= 4; M++)
            for (int a_bf16 = 0; a_bf16 < 2; a_bf16++)
                for (int bz = 0; bz < 2; bz++) {
                    int64_t N = sizes[s][0], K = sizes[s][1], lda = K + 3, ldb = K + 2, ldc = N + 1;
                    accel_dtype adt = a_bf16 ? ACCEL_BF16 : ACCEL_F32;
                    accel_tensor *A = accel_to_dtype(randn(60 + (uint64_t)M, ACCEL_SHAPE(M * lda)), adt);
                    accel_tensor *W = accel_to_dtype(randn(70 + (uint64_t)s, ACCEL_SHAPE(N * ldb)), ACCEL_BF16);
                    accel_tensor *Ar = accel_to_dtype(A, ACCEL_F32), *Wr = accel_to_dtype(W, ACCEL_F32);
                    accel_tensor *C1 = randn(80, ACCEL_SHAPE(M * ldc)), *C2 = accel_empty(ACCEL_F32, ACCEL_SHAPE(M * ldc));
                    float beta = bz ? 0.0f : -0.75f;
                    if (bz)
                        for (int64_t i = 0; i < M; i++) ((float *)C1->data)[i * ldc + i % N] = NAN;
                    accel_copy_(C2, C1);
                    CHECK(accel__gemm(false, true, M, N, K, 1.5f, A->data, adt, lda, W->data, ACCEL_BF16, ldb, beta,
                                      C1->data, ldc) == ACCEL_OK);
                    accel__sgemm_ref(false, true, M, N, K, 1.5f, Ar->data, lda, Wr->data, ldb, beta, C2->data, ldc);
                    CHECK_MSG(max_diff(C1, C2) < 1e-3 * (1 + sqrt((double)K)), "M=%lld N=%lld K=%lld a=%s beta=%g",
                              (long long)M, (long long)N, (long long)K, accel_dtype_name(adt), (double)beta);
                    accel_step_reset();
                }
    accel_set_default_device(prev);
}

/* GEMMs large enough to be split across the threads (accel__sgemm: row
 * blocks when M >= N, column blocks otherwise; one block per thread, or up
 * to four per thread from 1024 rows each, the last one shorter) against the
 * reference. */
static void test_gemm_split_vs_reference(void) {
    accel_device prev = accel_set_default_device(ACCEL_CPU_DEVICE);
    int threads = accel_num_threads();
    /* M, N, K, threads: 2 row blocks of 1056 and 1044; 2 column blocks; 4 row
     * blocks of 1056, the last 1032; 3 row blocks on 3 threads */
    const int64_t shapes[][4] = {{2100, 70, 40, 2}, {70, 2100, 40, 2}, {4200, 20, 30, 2}, {700, 30, 50, 3}};
    for (int s = 0; s < 4; s++) {
        accel_set_num_threads((int)shapes[s][3]);
        check_sgemm_vs_reference(shapes[s][0], shapes[s][1], shapes[s][2], 1.25f, 0.5f, 40 + (uint64_t)s,
                                 50 + (uint64_t)s, 1e-4);
    }
    accel_set_num_threads(threads);
    accel_set_default_device(prev);
}

/* The CPU table's gemm with its bias epilogue, on one case: C [M, ldc]
 * (from element c_off) from seed 90 with a NaN per row where beta is 0,
 * against the same GEMM without the bias followed by the bias added to
 * each row (what accel_linear ran as two kernels before the epilogue); the
 * columns of C past N are compared too (they must keep their values). A and
 * B of dtype dt (bf16 or f32), B a dense weight read as such when
 * b_weight (the prepared-layout path under ACCEL_GEMM=dnnl), else padded
 * views at offsets. */
typedef struct bias_case {
    int64_t M, N, K;
    bool ta, tb, b_weight;
    float alpha, beta;
    accel_dtype dt;
} bias_case;

static void check_gemm_bias(const bias_case *t) {
    int64_t M = t->M, N = t->N, K = t->K, ldc = N + 3, c_off = 2;
    int64_t lda = (t->ta ? M : K) + 1, a_off = 1;
    int64_t ldb = (t->tb ? K : N) + (t->b_weight ? 0 : 2), b_off = t->b_weight ? 0 : 3;
    accel_tensor *A = accel_to_dtype(randn(91, ACCEL_SHAPE((t->ta ? K : M) * lda + a_off)), t->dt);
    accel_tensor *B = t->b_weight ? accel_to_dtype(randn(92, ACCEL_SHAPE(t->tb ? N : K, t->tb ? K : N)), t->dt)
                                  : accel_to_dtype(randn(92, ACCEL_SHAPE((t->tb ? N : K) * ldb + b_off)), t->dt);
    accel_tensor *bias = randn(93, ACCEL_SHAPE(N));
    accel_tensor *C1 = randn(90, ACCEL_SHAPE(M * ldc + c_off)), *C2 = accel_empty(ACCEL_F32, ACCEL_SHAPE(M * ldc + c_off));
    float *c1 = C1->data;
    if (t->beta == 0.0f)
        for (int64_t i = 0; i < M; i++) c1[c_off + i * ldc + i % N] = NAN;
    accel_copy_(C2, C1);
    accel_k_gemm k = {.c = C1, .a = A, .b = B, .bias = bias, .trans_a = t->ta, .trans_b = t->tb, .M = M, .N = N,
                      .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .a_off = a_off, .b_off = b_off, .c_off = c_off,
                      .alpha = t->alpha, .beta = t->beta, .b_weight = t->b_weight};
    CHECK_MSG(accel__cpu_backend.kernels.gemm(&k) == ACCEL_OK, "%s", accel_last_error());
    k.c = C2;
    k.bias = NULL;
    CHECK_MSG(accel__cpu_backend.kernels.gemm(&k) == ACCEL_OK, "%s", accel_last_error());
    float *c2 = C2->data;
    const float *bv = bias->data;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) c2[c_off + i * ldc + j] += bv[j];
    CHECK_MSG(max_diff(C1, C2) < 1e-5 * (1 + sqrt((double)K)) * (1 + fabs(t->alpha)),
              "M=%lld N=%lld K=%lld ta=%d tb=%d weight=%d alpha=%g beta=%g %s: %g", (long long)M, (long long)N,
              (long long)K, t->ta, t->tb, t->b_weight, (double)t->alpha, (double)t->beta, accel_dtype_name(t->dt),
              max_diff(C1, C2));
    accel_step_reset();
}

/* The bias epilogue of the table's gemm (accel_k_gemm.bias) on odd shapes:
 * a few rows (one matrix-vector product per row), GEMMs split across the
 * threads by rows and by columns, K = 0 (C = beta C + bias), every
 * transpose, beta 0 (NaNs in C ignored), 1 and 0.5, alpha 1 and -1.5, f32
 * and bf16 operands, plain and weight B; and the errors of a bad bias. */
static void test_gemm_bias_epilogue(void) {
    accel_device prev = accel_set_default_device(ACCEL_CPU_DEVICE);
    const int64_t shapes[][3] = {{1, 7, 5}, {3, 1, 9}, {37, 29, 53}, {2100, 33, 17}, {40, 1500, 16}, {5, 7, 0}};
    const float betas[] = {0.0f, 1.0f, 0.5f}, alphas[] = {1.0f, -1.5f};
    for (int s = 0; s < 6; s++)
        for (int tr = 0; tr < 4; tr++)
            for (int b = 0; b < 3; b++)
                for (int al = 0; al < 2; al++)
                    for (int v = 0; v < 4; v++) {
                        bias_case t = {shapes[s][0], shapes[s][1], shapes[s][2], tr & 1, tr & 2, v & 1, alphas[al],
                                       betas[b], v & 2 ? ACCEL_BF16 : ACCEL_F32};
                        check_gemm_bias(&t);
                    }
    accel_tensor *A = randn(1, ACCEL_SHAPE(4, 3)), *B = randn(2, ACCEL_SHAPE(3, 5)), *C = accel_empty(ACCEL_F32, ACCEL_SHAPE(4, 5));
    accel_k_gemm k = {.c = C, .a = A, .b = B, .bias = accel_zeros(ACCEL_BF16, ACCEL_SHAPE(5)), .M = 4, .N = 5, .K = 3,
                      .lda = 3, .ldb = 5, .ldc = 5, .alpha = 1.0f};
    CHECK(accel__cpu_backend.kernels.gemm(&k) == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "bias must be f32");
    k.bias = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4));
    CHECK(accel__cpu_backend.kernels.gemm(&k) == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "bias must be 5 contiguous elements (N; got 4)");
    accel_clear_error();
    accel_step_reset();
    accel_set_default_device(prev);
}

static void check_matmul_case(int and, const int64_t *as, int bnd, const int64_t *bs, int ond, const int64_t *os) {
    accel_tensor *a = randn(10 + and, and, as), *b = randn(20 + bnd, bnd, bs);
    accel_tensor *fast = accel_matmul(a, b);
    bool prev = accel_set_reference_kernels(true);
    accel_tensor *ref = accel_matmul(a, b);
    accel_set_reference_kernels(prev);
    CHECK_MSG(fast && ref, "%s", accel_last_error());
    if (!fast || !ref) return;
    CHECK(fast->ndim == ond);
    for (int i = 0; i < ond && i < fast->ndim; i++) CHECK(fast->shape[i] == os[i]);
    CHECK(max_diff(fast, ref) < 1e-4);
}

static void test_matmul_shapes(void) {
    check_matmul_case(ACCEL_SHAPE(2, 3), ACCEL_SHAPE(3, 4), ACCEL_SHAPE(2, 4));
    check_matmul_case(ACCEL_SHAPE(2, 1, 3, 4), ACCEL_SHAPE(3, 4, 5), ACCEL_SHAPE(2, 3, 3, 5));
    check_matmul_case(ACCEL_SHAPE(3, 4), ACCEL_SHAPE(2, 4, 5), ACCEL_SHAPE(2, 3, 5));
    check_matmul_case(ACCEL_SHAPE(4), ACCEL_SHAPE(4, 5), ACCEL_SHAPE(5));
    check_matmul_case(ACCEL_SHAPE(2, 3, 4), ACCEL_SHAPE(4), ACCEL_SHAPE(2, 3));
    check_matmul_case(ACCEL_SHAPE(4), ACCEL_SHAPE(2, 4, 5), ACCEL_SHAPE(2, 5));
    /* dot product: 0-dim */
    accel_tensor *a = accel_from_floats(ACCEL_SHAPE(3), (float[]){1, 2, 3});
    accel_tensor *b = accel_from_floats(ACCEL_SHAPE(3), (float[]){4, 5, 6});
    accel_tensor *c = accel_matmul(a, b);
    CHECK(c && c->ndim == 0 && accel_item(c) == 32.0);
    /* exact small case */
    a = accel_from_floats(ACCEL_SHAPE(2, 2), (float[]){1, 2, 3, 4});
    b = accel_from_floats(ACCEL_SHAPE(2, 2), (float[]){5, 6, 7, 8});
    c = accel_matmul(a, b);
    CHECK(c && accel_get(c, (int64_t[]){0, 0}) == 19 && accel_get(c, (int64_t[]){1, 1}) == 50);
    /* non-contiguous operand (a transposed view) */
    accel_tensor *at = accel_view_raw(a, 2, (int64_t[]){2, 2}, (int64_t[]){1, 2}, 0);
    c = accel_matmul(at, b);
    CHECK(c && accel_get(c, (int64_t[]){0, 0}) == 1 * 5 + 3 * 7 && accel_get(c, (int64_t[]){0, 1}) == 1 * 6 + 3 * 8);
    accel_step_reset();
}

static accel_tensor *mm_loss(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_matmul(in[0], in[1]));
}

static accel_tensor *linear_loss(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_linear(in[0], in[1], n > 2 ? in[2] : NULL));
}

static void test_matmul_gradcheck(void) {
    struct { int an; int64_t as[4]; int bn; int64_t bs[4]; } cases[] = {
        {2, {3, 4}, 2, {4, 2}},
        {4, {2, 1, 3, 4}, 3, {3, 4, 2}}, /* both broadcast */
        {3, {2, 3, 4}, 2, {4, 2}},       /* folded batch */
        {2, {3, 4}, 3, {2, 4, 2}},       /* a broadcast over b's batch */
        {1, {4}, 2, {4, 3}},
        {3, {2, 3, 4}, 1, {4}},
        {1, {4}, 1, {4}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        accel_tensor *a = gc_randn(100 + i, cases[i].an, cases[i].as), *b = gc_randn(200 + i, cases[i].bn, cases[i].bs);
        CHECK_MSG(gradcheck("matmul", mm_loss, NULL, 2, (accel_tensor *[]){a, b}, NULL) == 0, "case %zu", i);
        accel_tensor_free(a);
        accel_tensor_free(b);
    }
    /* the same tensor on both sides */
    accel_tensor *s = gc_randn(7, ACCEL_SHAPE(3, 3));
    CHECK(gradcheck("matmul_self", mm_loss, NULL, 2, (accel_tensor *[]){s, s}, NULL) == 0);
    accel_tensor_free(s);
}

static void test_linear_gradcheck(void) {
    accel_tensor *x = gc_randn(1, ACCEL_SHAPE(2, 3, 5)), *w = gc_randn(2, ACCEL_SHAPE(4, 5)), *b = gc_randn(3, ACCEL_SHAPE(4));
    CHECK(gradcheck("linear", linear_loss, NULL, 3, (accel_tensor *[]){x, w, b}, NULL) == 0);
    CHECK(gradcheck("linear_nobias", linear_loss, NULL, 2, (accel_tensor *[]){x, w}, NULL) == 0);
    /* x fixed: only the weight gradients are computed */
    accel_requires_grad_(x, false);
    CHECK(gradcheck("linear_fixed_x", linear_loss, NULL, 3, (accel_tensor *[]){x, w, b}, NULL) == 0);
    accel_tensor_free(x);
    accel_tensor_free(w);
    accel_tensor_free(b);
}

static void test_linear_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_matmul.bin")) {
        CHECK(0);
        return;
    }
    accel_tensor *x = fx_get(&f, "linear.x"), *w = fx_get(&f, "linear.w"), *b = fx_get(&f, "linear.b");
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        accel_requires_grad_(x, true);
        accel_requires_grad_(w, true);
        accel_requires_grad_(b, true);
        accel_tensor *y = accel_linear(x, w, b);
        CHECK_FX("linear.y", y, fx_get(&f, "linear.y"), 1e-5, 1e-6);
        CHECK(accel_backward_with(y, fx_get(&f, "linear.gy")) == ACCEL_OK);
        CHECK_FX("linear.dx", x->grad, fx_get(&f, "linear.dx"), 1e-5, 1e-6);
        CHECK_FX("linear.dw", w->grad, fx_get(&f, "linear.dw"), 1e-5, 1e-6);
        CHECK_FX("linear.db", b->grad, fx_get(&f, "linear.db"), 1e-5, 1e-6);
        /* a second backward accumulates into the existing (persistent) grads */
        y = accel_linear(x, w, b);
        CHECK(accel_backward_with(y, fx_get(&f, "linear.gy")) == ACCEL_OK);
        accel_tensor *dw2 = accel_mul_scalar(fx_get(&f, "linear.dw"), 2.0);
        CHECK_FX("linear.dw twice", w->grad, dw2, 1e-5, 1e-6);
        accel_zero_(x->grad);
        accel_zero_(w->grad);
        accel_zero_(b->grad);
        accel_set_reference_kernels(prev);
        accel_step_reset();
    }
    fx_free(&f);
}

static void test_autocast_and_low_precision(void) {
    accel_tensor *x = randn(1, ACCEL_SHAPE(4, 8)), *w = randn(2, ACCEL_SHAPE(3, 8));
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *y = accel_linear(x, w, NULL);
    accel_tensor *m = accel_matmul(x, accel_transpose(w, 0, 1));
    accel_autocast_end(prev);
    CHECK(y && y->dtype == ACCEL_BF16 && m && m->dtype == ACCEL_BF16);
    /* == f32 product of the bf16-rounded inputs, rounded to bf16 */
    accel_tensor *xb = accel_to_dtype(accel_to_dtype(x, ACCEL_BF16), ACCEL_F32);
    accel_tensor *wb = accel_to_dtype(accel_to_dtype(w, ACCEL_BF16), ACCEL_F32);
    accel_tensor *want = accel_to_dtype(accel_linear(xb, wb, NULL), ACCEL_BF16);
    CHECK(max_diff(y, want) == 0.0);
    CHECK(max_diff(m, want) == 0.0);
    /* bf16 inputs without autocast: bf16 out; bf16 x f32 promotes to f32 */
    accel_tensor *xh = accel_to_dtype(x, ACCEL_BF16);
    accel_tensor *o = accel_matmul(xh, accel_transpose(accel_to_dtype(w, ACCEL_BF16), 0, 1));
    CHECK(o && o->dtype == ACCEL_BF16 && max_diff(o, want) == 0.0);
    o = accel_linear(xh, w, NULL);
    CHECK(o && o->dtype == ACCEL_F32);
    accel_tensor *f64 = accel_empty(ACCEL_F64, ACCEL_SHAPE(2, 2));
    CHECK(accel_matmul(f64, f64) == NULL && accel_last_status() == ACCEL_ERR_DTYPE);
    accel_clear_error();
    accel_step_reset();

    /* gradients come back in the input dtype (f32 params under bf16 autocast) */
    accel_tensor *pw = gc_randn(5, ACCEL_SHAPE(3, 8)), *pb = gc_randn(6, ACCEL_SHAPE(3));
    prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *out = accel_linear(randn(7, ACCEL_SHAPE(4, 8)), pw, pb);
    accel_autocast_end(prev);
    CHECK(out && out->dtype == ACCEL_BF16);
    CHECK(accel_backward(accel_sum_all(out)) == ACCEL_OK);
    CHECK(pw->grad && pw->grad->dtype == ACCEL_F32 && pb->grad && pb->grad->dtype == ACCEL_F32);
    CHECK_CLOSE(accel_get(pb->grad, (int64_t[]){1}), 4.0, 0, 1e-6);
    accel_tensor_free(pw);
    accel_tensor_free(pb);
    accel_step_reset();
}

/* Bits of a bf16 tensor equal to the f32 values f rounded (accel_convert). */
static bool bf16_equals_rounded(const accel_tensor *t, const float *f, int64_t n) {
    uint16_t *r = malloc(sizeof(uint16_t) * (size_t)n);
    accel_convert(r, ACCEL_BF16, f, ACCEL_F32, (size_t)n);
    bool same = t->dtype == ACCEL_BF16 && memcmp(r, t->data, sizeof(uint16_t) * (size_t)n) == 0;
    free(r);
    return same;
}

/* A bf16 C from the CPU's gemm kernel (oneDNN writing it where it
 * multiplies bf16, else an f32 C of the call rounded), and through
 * accel_linear under autocast: the output and a bf16 input's first
 * gradient are the f32 results of the same GEMMs rounded, bit for bit, on
 * whatever provider and ISA this run takes. */
static void test_linear_lowp_out(void) {
    if (accel_default_device().type != ACCEL_DEV_CPU) return; /* other backends take an f32 C */
    const int64_t M = 256, N = 384, K = 512;
    accel_tensor *x0 = gc_randn(31, ACCEL_SHAPE(M, K)), *w = gc_randn(32, ACCEL_SHAPE(N, K));
    accel_tensor *r = accel_to_dtype(randn(33, ACCEL_SHAPE(M, N)), ACCEL_BF16);
    accel_tensor *x = accel_to_dtype(x0, ACCEL_BF16); /* a non-leaf bf16 input */
    size_t used = accel_arena_used(accel_step_arena());
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *y = accel_linear(x, w, NULL);
    accel_autocast_end(prev);
    CHECK_MSG(y && y->dtype == ACCEL_BF16, "%s", accel_last_error());
    /* the step keeps y (and, where OpenBLAS multiplies, x's f32 operand:
     * accel__mm_operand), no f32 result (4 bytes an element of y) */
    size_t operand = accel__gemm_native(ACCEL_BF16) ? 0 : (size_t)(M * K) * sizeof(float);
    CHECK(accel_arena_used(accel_step_arena()) - used < (size_t)(M * N) * 3 + operand);
    CHECK(accel_backward(accel_sum_all(accel_mul(y, r))) == ACCEL_OK && x0->grad);
    /* the GEMMs on f32 results: Y = X Wb^T, dX = R Wb */
    accel_tensor *wb = accel_to_dtype(w, ACCEL_BF16);
    float *fy = malloc(sizeof(float) * (size_t)(M * N)), *fdx = malloc(sizeof(float) * (size_t)(M * K));
    CHECK(accel__gemm(false, true, M, N, K, 1.0f, x->data, ACCEL_BF16, K, wb->data, ACCEL_BF16, K, 0.0f, fy, N) ==
          ACCEL_OK);
    CHECK(accel__gemm(false, false, M, K, N, 1.0f, r->data, ACCEL_BF16, N, wb->data, ACCEL_BF16, K, 0.0f, fdx, K) ==
          ACCEL_OK);
    CHECK(bf16_equals_rounded(y, fy, M * N));
    accel_tensor *dx = accel_to_dtype(x0->grad, ACCEL_BF16); /* x0's f32 gradient holds x's bf16 one */
    CHECK(dx && bf16_equals_rounded(dx, fdx, M * K));

    /* the kernel: beta and a bias take the f32 C of the call, rounded once */
    accel_tensor *c = accel_to_dtype(randn(34, ACCEL_SHAPE(M, N)), ACCEL_BF16), *bias = randn(35, ACCEL_SHAPE(N));
    accel_tensor *c32 = accel_to_dtype(c, ACCEL_F32);
    for (int v = 0; v < 3; v++) {
        accel_k_gemm k = {.c = c, .a = x, .b = wb, .bias = v == 2 ? bias : NULL, .trans_b = true, .M = M, .N = N,
                          .K = K, .lda = K, .ldb = K, .ldc = N, .alpha = 1.0f, .beta = v == 0 ? 0.0f : 0.5f,
                          .b_weight = v == 0};
        accel_k_gemm k32 = k;
        k32.c = c32;
        k32.b_weight = false;
        CHECK_MSG(accel__cpu_backend.kernels.gemm(&k32) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(accel__cpu_backend.kernels.gemm(&k) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(bf16_equals_rounded(c, c32->data, M * N), "variant %d", v);
        accel_convert(c32->data, ACCEL_F32, c->data, ACCEL_BF16, (size_t)(M * N)); /* the next variant's C */
    }
    free(fy);
    free(fdx);
    accel_tensor_free(x0);
    accel_tensor_free(w);
    accel_step_reset();
}

/* Step-arena bytes a linear + matmul backward (x [64, 512], W [512, 512], f32
 * leaves) allocates when the forward ran under autocast dtype ac. */
static size_t backward_arena_bytes(accel_dtype ac) {
    accel_tensor *w = gc_randn(11, ACCEL_SHAPE(512, 512)), *x = gc_randn(12, ACCEL_SHAPE(64, 512));
    accel_dtype prev = accel_autocast_begin(ac);
    accel_tensor *y = accel_linear(x, w, NULL);
    accel_tensor *m = accel_matmul(x, accel_transpose(w, 0, 1));
    accel_autocast_end(prev);
    CHECK(y && m && y->dtype == ac && m->dtype == ac);
    accel_tensor *loss = accel_sum_all(accel_add(y, m));
    size_t used = accel_arena_used(accel_step_arena());
    CHECK(accel_backward(loss) == ACCEL_OK && w->grad && x->grad);
    size_t bytes = accel_arena_used(accel_step_arena()) - used;
    accel_tensor_free(w);
    accel_tensor_free(x);
    accel_step_reset();
    return bytes;
}

/* Where the CPU GEMM multiplies bf16 in f32 (OpenBLAS), under bf16 autocast
 * the operands are made once, in forward, as f32 of the rounded values: the
 * backward GEMMs convert no panel (1 MiB for W) and allocate what an f32
 * backward does, but for the output gradients: both runs hand the add's
 * gradient on to y and m (accel__grad_move, accel__grad_share), a bf16 one
 * then widens that bf16 gradient for the sgemm (one [64, 512] f32, 128 KB,
 * more than the f32 run; measured 128.5 KB), far from a panel's 1 MiB. */
static void test_autocast_cpu_backward_converts_nothing(void) {
    if (accel_default_device().type != ACCEL_DEV_CPU) return; /* other devices keep bf16 operands */
    if (accel__gemm_native(ACCEL_BF16)) return; /* oneDNN gets bf16 operands (test_gemm_providers.c) */
    accel_step_reset();
    size_t f32 = backward_arena_bytes(ACCEL_F32), bf16 = backward_arena_bytes(ACCEL_BF16);
    CHECK(bf16 < f32 + 192 * 1024);
}

static void test_errors_and_meta(void) {
    accel_clear_error();
    accel_tensor *a = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3)), *b = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 5));
    CHECK(accel_matmul(a, b) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_SHAPE);
    CHECK(strcmp(accel_last_error(), "accel_matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)") == 0);
    /* NULL in: NULL out, first error kept */
    CHECK(accel_linear(NULL, b, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_matmul");
    accel_clear_error();
    CHECK(accel_linear(a, b, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_linear: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 5)");
    accel_clear_error();
    CHECK(accel_linear(a, accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 3)), accel_zeros(ACCEL_F32, ACCEL_SHAPE(5))) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "bias");
    accel_clear_error();
    CHECK(accel_matmul(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3, 4)), accel_zeros(ACCEL_F32, ACCEL_SHAPE(3, 4, 5))) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "batch");
    accel_clear_error();

    /* meta: shapes only, nothing allocated, even for huge sizes */
    accel_tensor *w = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(100000, 50000), ACCEL_META_DEVICE);
    accel_tensor *x = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(8, 4096, 50000), ACCEL_META_DEVICE);
    size_t used = accel_arena_used(accel_step_arena());
    accel_tensor *y = accel_linear(x, w, NULL);
    CHECK(y && y->device.type == ACCEL_DEV_META && y->data == NULL && y->ndim == 3 && y->shape[2] == 100000);
    CHECK(accel_arena_used(accel_step_arena()) - used < 4096);
    accel_tensor *z = accel_matmul(x, accel_transpose(w, 0, 1));
    CHECK(z && z->data == NULL && z->shape[2] == 100000 && z->dtype == ACCEL_BF16);
    accel_tensor_free(w);
    accel_tensor_free(x);
    accel_step_reset();
}

int main(void) {
    RUN(test_gemm_fast_vs_reference);
    RUN(test_gemm_small_m_vs_reference);
    RUN(test_gemm_split_vs_reference);
    RUN(test_gemm_bf16_weight_small_m);
    RUN(test_gemm_bias_epilogue);
    RUN(test_matmul_shapes);
    RUN(test_matmul_gradcheck);
    RUN(test_linear_gradcheck);
    RUN(test_linear_vs_torch);
    RUN(test_autocast_and_low_precision);
    RUN(test_linear_lowp_out);
    RUN(test_autocast_cpu_backward_converts_nothing);
    RUN(test_errors_and_meta);
    accel_thread_cleanup();
    return check_summary();
}
