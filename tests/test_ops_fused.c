/* The fused ops of the Llama step: accel_swiglu and the cross-entropy whose
 * forward also writes its gradient. Each against the unfused ops it
 * replaces (values and input gradients, f32 and bf16), the fast kernels
 * against the reference ones in every CPU variant this machine runs, finite
 * differences, errors and meta; RoPE read from the q/k projection's layout in
 * its dtype (fast vs reference, strided vs contiguous), its backward writing
 * the strided input's gradient in that layout; the vectorised
 * bf16 conversions of the copy kernel against accel_f32_to_bf16, bit for bit;
 * and f32 op bf16/f16 reading the bf16/f16 operand as stored. */
#include "accel/accel.h"
#include "check.h"
#include "each_cpu_variant.h"
#include "gradcheck.h"

/* Elements of a and b (any float dtypes, same numel) that differ by more
 * than atol + rtol |b|; the first few are printed. */
static int mismatches(accel_tensor *a, accel_tensor *b, double rtol, double atol, const char *what) {
    if (!a || !b || accel_numel(a) != accel_numel(b)) {
        fprintf(stderr, "%s: missing tensor or numel differs (%s)\n", what, accel_last_error());
        return 1;
    }
    int64_t n = accel_numel(a);
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    int bad = !x || !y || accel_to_floats(a, x) != ACCEL_OK || accel_to_floats(b, y) != ACCEL_OK;
    for (int64_t i = 0; i < n && x && y; i++) {
        bool same = x[i] == y[i] || (isnan(x[i]) && isnan(y[i]));
        if (same || fabs((double)x[i] - y[i]) <= atol + rtol * fabs((double)y[i])) continue;
        if (++bad <= 3) fprintf(stderr, "%s [%lld]: %.9g vs %.9g\n", what, (long long)i, x[i], y[i]);
    }
    free(x);
    free(y);
    return bad;
}

/* A persistent copy of t (f32), e.g. a gradient kept across a step reset. */
static accel_tensor *keep(accel_tensor *t) {
    accel_tensor *c = t ? accel_tensor_new(ACCEL_F32, t->ndim, t->shape, t->device) : NULL;
    if (c && accel_copy_(c, t) != ACCEL_OK) {
        accel_tensor_free(c);
        c = NULL;
    }
    return c;
}

/* Tolerances of one rounding to dt (1 ulp), or of f32 math. */
static double ulp(accel_dtype dt) { return dt == ACCEL_BF16 ? 1.0 / 128 : dt == ACCEL_F16 ? 1.0 / 1024 : 2e-6; }

/* ---- SwiGLU */

/* y = f(a', b') with a' = a and b' = b in dtype dt (non-leaves), the loss a
 * weighted sum of y; returns y (f32, persistent) and leaves a, b's grads. */
static accel_tensor *swiglu_run(accel_tensor *a, accel_tensor *b, accel_dtype dt, bool fused) {
    if (a->grad) accel_zero_(a->grad);
    if (b->grad) accel_zero_(b->grad);
    accel_tensor *ga = accel_to_dtype(accel_mul_scalar(a, 3.0), dt), *gb = accel_to_dtype(b, dt);
    accel_tensor *y = fused ? accel_swiglu(ga, gb) : accel_mul(accel_silu(ga), gb);
    CHECK(y && y->dtype == dt);
    accel_tensor *loss = gc_weighted_sum(y);
    CHECK(loss && accel_backward(loss) == ACCEL_OK);
    accel_tensor *kept = keep(y);
    accel_step_reset();
    return kept;
}

static void test_swiglu_matches_unfused(void) {
    /* 6300 elements (blocks of 512 and a tail) and 44000 (OpenMP threads) */
    const int64_t shapes[2][2] = {{3, 2100}, {40, 1100}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < 2; d++) {
            accel_dtype dt = d ? ACCEL_BF16 : ACCEL_F32;
            accel_tensor *a = gc_randn(10 + s, 2, shapes[s]), *b = gc_randn(20 + s, 2, shapes[s]);
            accel_tensor *yf = swiglu_run(a, b, dt, true);
            accel_tensor *daf = keep(a->grad), *dbf = keep(b->grad);
            accel_tensor *yu = swiglu_run(a, b, dt, false);
            double tol = d ? ulp(dt) : 1e-6;
            CHECK_MSG(mismatches(yf, yu, tol, 1e-7, "swiglu y") == 0, "dtype %s shape %d", accel_dtype_name(dt), s);
            /* the gradients pass two roundings to dt (as the unfused ops round) */
            CHECK_MSG(mismatches(daf, a->grad, 2 * tol, 1e-6, "swiglu da") == 0, "dtype %s", accel_dtype_name(dt));
            CHECK_MSG(mismatches(dbf, b->grad, 2 * tol, 1e-6, "swiglu db") == 0, "dtype %s", accel_dtype_name(dt));
            accel_tensor_free(yf);
            accel_tensor_free(yu);
            accel_tensor_free(daf);
            accel_tensor_free(dbf);
            accel_tensor_free(a);
            accel_tensor_free(b);
        }
}

/* The fast swiglu kernels against the reference ones: gate and up of dtype
 * dt (f32 leaves converted), forward and both gradients. */
static void swiglu_fast_vs_ref(accel_dtype dt, const char *variant) {
    accel_tensor *a = gc_randn(31, ACCEL_SHAPE(7, 900)), *b = gc_randn(32, ACCEL_SHAPE(7, 900));
    accel_tensor *y[2], *da[2], *db[2];
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        y[ref] = swiglu_run(a, b, dt, true);
        da[ref] = keep(a->grad);
        db[ref] = keep(b->grad);
        accel_set_reference_kernels(prev);
    }
    double tol = ulp(dt);
    CHECK_MSG(mismatches(y[0], y[1], tol, 1e-7, "swiglu fast vs ref") == 0, "%s %s", variant, accel_dtype_name(dt));
    CHECK_MSG(mismatches(da[0], da[1], 2 * tol, 1e-6, "dgate fast vs ref") == 0, "%s %s", variant,
              accel_dtype_name(dt));
    CHECK_MSG(mismatches(db[0], db[1], 2 * tol, 1e-6, "dup fast vs ref") == 0, "%s %s", variant,
              accel_dtype_name(dt));
    for (int i = 0; i < 2; i++) {
        accel_tensor_free(y[i]);
        accel_tensor_free(da[i]);
        accel_tensor_free(db[i]);
    }
    accel_tensor_free(a);
    accel_tensor_free(b);
}

static accel_tensor *loss_swiglu(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_swiglu(in[0], in[1]));
}

static accel_tensor *loss_swiglu_same(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_swiglu(in[0], in[0]));
}

/* gate a transposed view (made contiguous by the op), up a non-leaf. */
static accel_tensor *loss_swiglu_views(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_swiglu(accel_transpose(in[0], 0, 1), accel_mul_scalar(in[1], 2.0)));
}

static void test_swiglu_gradcheck(void) {
    accel_tensor *a = gc_randn(41, ACCEL_SHAPE(3, 5)), *b = gc_randn(42, ACCEL_SHAPE(3, 5));
    accel_tensor *at = gc_randn(43, ACCEL_SHAPE(5, 3));
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        CHECK(gradcheck("swiglu", loss_swiglu, NULL, 2, (accel_tensor *[]){a, b}, NULL) == 0);
        CHECK(gradcheck("swiglu_same", loss_swiglu_same, NULL, 1, (accel_tensor *[]){a}, NULL) == 0);
        CHECK(gradcheck("swiglu_views", loss_swiglu_views, NULL, 2, (accel_tensor *[]){at, b}, NULL) == 0);
        accel_set_reference_kernels(prev);
    }
    accel_tensor_free(a);
    accel_tensor_free(b);
    accel_tensor_free(at);
}

static void test_swiglu_errors_and_meta(void) {
    accel_tensor *a = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3)), *b = accel_zeros(ACCEL_F32, ACCEL_SHAPE(3, 2));
    CHECK(accel_swiglu(a, b) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_swiglu: shapes [2, 3] and [3, 2] differ");
    accel_tensor *i = accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 3));
    CHECK(accel_swiglu(a, i) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_swiglu: up must be a floating tensor");
    CHECK(accel_swiglu(NULL, a) == NULL);
    accel_tensor *m = accel_empty_on(ACCEL_BF16, ACCEL_SHAPE(4, 8), ACCEL_META_DEVICE);
    accel_tensor *y = accel_swiglu(m, accel_empty_on(ACCEL_F32, ACCEL_SHAPE(4, 8), ACCEL_META_DEVICE));
    CHECK(y && y->device.type == ACCEL_DEV_META && y->dtype == ACCEL_F32 && y->shape[1] == 8);
    accel_clear_error();
    accel_step_reset();
}

/* ---- cross-entropy */

/* loss = ce(f(x)) with x's rows as logits in dtype dt (a non-leaf, so the
 * fused gradient is handed over as it is), targets with ignored entries;
 * scale != 1 makes the incoming gradient scale (a loss scale, 1 / steps). */
static float ce_run(accel_tensor *x, accel_dtype dt, double scale, bool fast) {
    if (x->grad) accel_zero_(x->grad);
    int64_t N = x->shape[0];
    int64_t *t = malloc(sizeof(int64_t) * (size_t)N);
    for (int64_t i = 0; i < N; i++) t[i] = i % 5 == 3 ? -100 : (i * 37) % x->shape[1];
    accel_tensor *targets = accel_from_data(ACCEL_I64, ACCEL_SHAPE(N), t);
    free(t);
    bool prev = accel_set_reference_kernels(!fast);
    accel_tensor *loss = accel_cross_entropy(accel_to_dtype(accel_mul_scalar(x, 2.0), dt), targets, -100);
    accel_set_reference_kernels(prev);
    float v = loss ? (float)accel_item(loss) : NAN;
    CHECK(loss && accel_backward(accel_mul_scalar(loss, scale)) == ACCEL_OK);
    accel_step_reset();
    return v;
}

static void ce_fast_vs_ref(accel_dtype dt, const char *variant) {
    /* 9 x 3000 logits (rows past 2048 vectors, a tail), 300 x 130 (threads) */
    const int64_t shapes[2][2] = {{9, 3000}, {300, 130}};
    for (int s = 0; s < 2; s++)
        for (int sc = 0; sc < 2; sc++) {
            accel_tensor *x = gc_randn(50 + s, 2, shapes[s]);
            double scale = sc ? 0.3 : 1.0;
            float lf = ce_run(x, dt, scale, true);
            accel_tensor *gf = keep(x->grad);
            float lr = ce_run(x, dt, scale, false);
            CHECK_CLOSE(lf, lr, 1e-6, 1e-6);
            /* the fast gradient is rounded to dt before the scale, the reference after */
            CHECK_MSG(mismatches(gf, x->grad, 2 * ulp(dt), 1e-8, "ce grad fast vs ref") == 0, "%s %s shape %d scale %g",
                      variant, accel_dtype_name(dt), s, scale);
            accel_tensor_free(gf);
            accel_tensor_free(x);
        }
}

static accel_tensor *ce_targets(void) {
    return accel_from_data(ACCEL_I64, ACCEL_SHAPE(6), (int64_t[]){3, -100, 0, 2, -100, 1});
}

/* the gradient handed over (g = 1, non-leaf logits) */
static accel_tensor *loss_ce_nonleaf(accel_tensor *const *in, int n, void *ctx) {
    return accel_cross_entropy(accel_mul_scalar(in[0], 1.5), ce_targets(), -100);
}

/* leaf logits (accumulated into the leaf's gradient), scaled loss (g != 1) */
static accel_tensor *loss_ce_leaf_scaled(accel_tensor *const *in, int n, void *ctx) {
    return accel_mul_scalar(accel_cross_entropy(in[0], ce_targets(), -100), 3.0);
}

/* logits [2, 3, 4] with targets [2, 3], that also get a gradient from
 * another use first (the fused gradient is added to it) */
static accel_tensor *loss_ce_twice(accel_tensor *const *in, int n, void *ctx) {
    accel_tensor *y = accel_mul_scalar(in[0], 1.0);
    accel_tensor *t = accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, 3), (int64_t[]){3, -100, 0, 2, -100, 1});
    accel_tensor *ce = accel_cross_entropy(y, t, -100);
    return accel_add(ce, accel_mul_scalar(gc_weighted_sum(y), 0.1));
}

static void test_ce_gradcheck(void) {
    accel_tensor *x = gc_randn(61, ACCEL_SHAPE(6, 4)), *x3 = gc_randn(62, ACCEL_SHAPE(2, 3, 4));
    CHECK(gradcheck("ce_nonleaf", loss_ce_nonleaf, NULL, 1, (accel_tensor *[]){x}, NULL) == 0);
    CHECK(gradcheck("ce_leaf_scaled", loss_ce_leaf_scaled, NULL, 1, (accel_tensor *[]){x}, NULL) == 0);
    CHECK(gradcheck("ce_twice", loss_ce_twice, NULL, 1, (accel_tensor *[]){x3}, NULL) == 0);
    accel_tensor_free(x);
    accel_tensor_free(x3);
}

static void test_ce_fused_errors(void) {
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3));
    accel_requires_grad_(x, true);
    accel_tensor *loss = accel_cross_entropy(accel_mul_scalar(x, 1.0),
                                             accel_from_data(ACCEL_I64, ACCEL_SHAPE(2), (int64_t[]){1, 3}), -100);
    CHECK(loss == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "target 3 at position 1 is out of range for 3 classes");
    /* all targets ignored: nan, as PyTorch, and a zero gradient */
    loss = accel_cross_entropy(accel_mul_scalar(x, 1.0),
                               accel_from_data(ACCEL_I64, ACCEL_SHAPE(2), (int64_t[]){-100, -100}), -100);
    CHECK(loss && isnan(accel_item(loss)));
    accel_clear_error();
    accel_step_reset();
}

/* ---- conversions */

static void conversions(const char *variant) {
    enum { n = 300001 };
    static float v[n];
    static uint16_t got[n];
    const uint32_t special[] = {0x7fc00001u, 0xff800001u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x3f808000u,
                                0x3f818000u, 0x00000001u, 0x80000000u, 0x3f80ffffu};
    for (int i = 0; i < n; i++) v[i] = (float)sin(0.37 * i) * powf(2.0f, (float)(i % 61 - 30));
    for (int i = 0; i < (int)(sizeof special / sizeof *special); i++) memcpy(&v[i * 977], &special[i], 4);
    accel_tensor *f = accel_from_floats(ACCEL_SHAPE(n), v);
    accel_tensor *h = accel_empty(ACCEL_BF16, ACCEL_SHAPE(n));
    CHECK(f && h && accel_copy_(h, f) == ACCEL_OK && accel_tensor_to_host(h, got) == ACCEL_OK);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += got[i] != accel_f32_to_bf16(v[i]);
    CHECK_MSG(bad == 0, "%s: %d of %d f32 -> bf16 roundings differ", variant, bad, n);
    /* back: exact; strided rows too (a transposed view) */
    accel_tensor *back = accel_empty(ACCEL_F32, ACCEL_SHAPE(n));
    CHECK(accel_copy_(back, h) == ACCEL_OK);
    float *w = malloc(sizeof(float) * n);
    CHECK(w && accel_to_floats(back, w) == ACCEL_OK);
    bad = 0;
    for (int i = 0; i < n && w; i++) bad += memcmp(&w[i], &(float){accel_bf16_to_f32(got[i])}, 4) != 0;
    CHECK_MSG(bad == 0, "%s: %d bf16 -> f32 conversions differ", variant, bad);
    free(w);
    accel_tensor *m = accel_reshape(accel_slice(f, 0, 0, 300000, 1), ACCEL_SHAPE(600, 500));
    accel_tensor *mt = accel_empty(ACCEL_BF16, ACCEL_SHAPE(500, 600)), *mr = accel_empty(ACCEL_BF16, ACCEL_SHAPE(500, 600));
    CHECK(accel_copy_(mt, accel_transpose(m, 0, 1)) == ACCEL_OK);
    CHECK(accel_copy_(mr, accel_to_dtype(accel_contiguous(accel_transpose(m, 0, 1)), ACCEL_BF16)) == ACCEL_OK);
    CHECK(mismatches(mt, mr, 0.0, 0.0, "strided f32 -> bf16") == 0);
    accel_step_reset();
}

/* ---- f32 op bf16/f16 without the f32 copy (the residual adds) */

/* An f32 tensor and a bf16/f16 one of its shape: add, sub, mul and div in
 * both orders give the bits the ops give on the bf16/f16 operand widened
 * first (and the reference kernels), and no f32 copy of that operand is made
 * (the step arena grows by the output alone). 300001 elements: the OpenMP
 * threads and a tail no block fills. */
static void binary_lowp(accel_dtype dt, const char *variant) {
    enum { n = 300001 };
    accel_tensor *f = gc_randn(70, ACCEL_SHAPE(n)), *src = gc_randn(71, ACCEL_SHAPE(n));
    accel_tensor *lo = accel_to_dtype(src, dt), *wide = accel_to_dtype(lo, ACCEL_F32);
    accel_tensor *(*ops[4])(accel_tensor *, accel_tensor *) = {accel_add, accel_sub, accel_mul, accel_div};
    CHECK(f && lo && wide);
    for (int op = 0; op < 4 && wide; op++)
        for (int lo_first = 0; lo_first < 2; lo_first++) {
            accel_tensor *x = lo_first ? lo : f, *y = lo_first ? f : lo;
            size_t used = accel_arena_used(accel_step_arena());
            accel_tensor *got = ops[op](x, y);
            size_t grew = accel_arena_used(accel_step_arena()) - used;
            accel_tensor *want = ops[op](lo_first ? wide : f, lo_first ? f : wide);
            bool prev = accel_set_reference_kernels(true);
            accel_tensor *ref = ops[op](x, y);
            accel_set_reference_kernels(prev);
            CHECK_MSG(got && got->dtype == ACCEL_F32 && mismatches(got, want, 0.0, 0.0, "vs widened") == 0 &&
                          mismatches(got, ref, 0.0, 0.0, "vs reference") == 0,
                      "%s %s op %d lo_first %d", variant, accel_dtype_name(dt), op, lo_first);
            CHECK_MSG(grew < (size_t)n * 4 + 4096, "%s %s op %d: the arena grew by %zu bytes (an f32 copy?)", variant,
                      accel_dtype_name(dt), op, grew);
        }
    accel_step_reset();
    accel_tensor_free(f);
    accel_tensor_free(src);
}

/* ---- RoPE on the projection's layout */

/* y = rope(q) with q the [B, T, H * D] projection p (rounded to dt) seen as
 * [B, H, T, D] (strided), or a contiguous copy of that view; the loss a
 * weighted sum of y. Returns y (f32, persistent); p->grad holds dp. */
static accel_tensor *rope_run(accel_tensor *p, int64_t H, accel_dtype dt, bool contiguous) {
    if (p->grad) accel_zero_(p->grad);
    int64_t B = p->shape[0], T = p->shape[1], D = p->shape[2] / H;
    accel_tensor *q = accel_transpose(accel_reshape(accel_to_dtype(accel_mul_scalar(p, 1.0), dt), ACCEL_SHAPE(B, T, H, D)), 1, 2);
    accel_tensor *y = accel_rope(contiguous ? accel_contiguous(q) : q, 7, 10000.0);
    CHECK(y && y->dtype == dt && accel_is_contiguous(y));
    accel_tensor *loss = gc_weighted_sum(y);
    CHECK(loss && accel_backward(loss) == ACCEL_OK);
    accel_tensor *kept = keep(y);
    accel_step_reset();
    return kept;
}

/* The fast rope kernel against the reference, forward and backward, at
 * half 4 and half 300 (blocks of 256 and a tail, OpenMP threads); and the
 * strided read against a contiguous input. */
static void rope_fast_vs_ref(accel_dtype dt, const char *variant) {
    const int64_t shapes[2][4] = {{1, 5, 4, 8}, {2, 37, 3, 600}}; /* B, T, H, D */
    for (int s = 0; s < 2; s++) {
        const int64_t *sh = shapes[s];
        accel_tensor *p = gc_randn(40 + s, ACCEL_SHAPE(sh[0], sh[1], sh[2] * sh[3]));
        accel_tensor *y[3], *dp[3];
        for (int run = 0; run < 3; run++) {
            bool prev = accel_set_reference_kernels(run == 1);
            y[run] = rope_run(p, sh[2], dt, run == 2);
            dp[run] = keep(p->grad);
            accel_set_reference_kernels(prev);
        }
        double tol = ulp(dt);
        for (int other = 1; other < 3; other++) {
            const char *what = other == 1 ? "vs reference" : "vs contiguous input";
            CHECK_MSG(mismatches(y[0], y[other], tol, 1e-6, "rope y") == 0, "%s %s %s, shape %d", variant,
                      accel_dtype_name(dt), what, s);
            CHECK_MSG(mismatches(dp[0], dp[other], 2 * tol, 1e-6, "rope dx") == 0, "%s %s %s, shape %d", variant,
                      accel_dtype_name(dt), what, s);
        }
        for (int i = 0; i < 3; i++) {
            accel_tensor_free(y[i]);
            accel_tensor_free(dp[i]);
        }
        accel_tensor_free(p);
    }
}

/* The backward writes the strided q's first gradient in q's own layout
 * ([B, T, H, D] in memory) and the transpose passes it on without a copy:
 * q keeps no gradient of its own after the backward. With a second reader
 * of q recorded before the rope (its gradient added into q's strided one
 * afterwards), the projection's gradient is that of the same graph on a
 * contiguous copy of q, through the fast and the reference kernels. */
static void rope_grad_in_layout(accel_dtype dt) {
    const int64_t B = 2, T = 37, H = 3, D = 600;
    accel_tensor *p = gc_randn(45, ACCEL_SHAPE(B, T, H * D)), *dp[3];
    for (int run = 0; run < 3; run++) {
        bool prev = accel_set_reference_kernels(run == 1);
        if (p->grad) accel_zero_(p->grad);
        accel_tensor *q = accel_transpose(accel_reshape(accel_to_dtype(accel_mul_scalar(p, 1.0), dt),
                                                        ACCEL_SHAPE(B, T, H, D)), 1, 2);
        accel_tensor *other = accel_mul_scalar(q, 2.0); /* recorded before the rope: its backward runs after */
        accel_tensor *y = accel_rope(run == 2 ? accel_contiguous(q) : q, 7, 10000.0);
        accel_tensor *loss = accel_add(gc_weighted_sum(y), gc_weighted_sum(other));
        CHECK(loss && accel_backward(loss) == ACCEL_OK);
        if (run < 2 && q && q->device.type == ACCEL_DEV_CPU) /* other devices' kernels write contiguous */
            CHECK_MSG(q && !q->grad, "%s run %d: the transposed q kept a gradient (copied, not passed on)",
                      accel_dtype_name(dt), run);
        dp[run] = keep(p->grad);
        accel_step_reset();
        accel_set_reference_kernels(prev);
    }
    for (int run = 0; run < 2; run++)
        CHECK_MSG(mismatches(dp[run], dp[2], 2 * ulp(dt), 1e-6, "rope dx in layout") == 0, "%s run %d",
                  accel_dtype_name(dt), run);
    for (int run = 0; run < 3; run++) accel_tensor_free(dp[run]);
    accel_tensor_free(p);
}

/* The rope backward adding into a gradient that already holds values (its
 * kernel's beta 1; the fast path writes an f32 gradient in place): a second
 * backward of the same loss into a leaf's gradient doubles it, bit for bit
 * (g + g is exact), and the first matches the reference kernel's. */
static void rope_grad_accumulates(const char *variant) {
    accel_tensor *x = gc_randn(44, ACCEL_SHAPE(2, 3, 37, 600)), *once = NULL;
    for (int run = 0; run < 2; run++) {
        bool prev = accel_set_reference_kernels(run == 1);
        for (int pass = 0; pass < 2; pass++) {
            accel_tensor *loss = gc_weighted_sum(accel_rope(x, 7, 10000.0));
            CHECK(loss && accel_backward(loss) == ACCEL_OK);
            accel_step_reset();
            if (pass == 0 && run == 0) once = keep(x->grad);
            if (pass == 0 && run == 1)
                CHECK_MSG(mismatches(x->grad, once, 2e-6, 1e-6, "rope dx vs reference") == 0, "%s", variant);
        }
        accel_tensor *twice = keep(accel_mul_scalar(once, 2.0));
        CHECK_MSG(mismatches(x->grad, twice, 0.0, 0.0, "rope dx accumulated") == 0, "%s reference %d", variant, run);
        accel_tensor_free(twice);
        accel_zero_(x->grad);
        accel_set_reference_kernels(prev);
    }
    accel_tensor_free(once);
    accel_tensor_free(x);
    accel_step_reset();
}

/* The fast paths against the reference kernels in one CPU variant. */
static void fast_vs_ref(const char *name) {
    swiglu_fast_vs_ref(ACCEL_F32, name);
    swiglu_fast_vs_ref(ACCEL_BF16, name);
    swiglu_fast_vs_ref(ACCEL_F16, name);
    rope_fast_vs_ref(ACCEL_F32, name);
    rope_fast_vs_ref(ACCEL_BF16, name);
    rope_fast_vs_ref(ACCEL_F16, name);
    rope_grad_accumulates(name);
    ce_fast_vs_ref(ACCEL_F32, name);
    ce_fast_vs_ref(ACCEL_BF16, name);
    conversions(name);
    binary_lowp(ACCEL_BF16, name);
    binary_lowp(ACCEL_F16, name);
}

int main(void) {
    RUN(test_swiglu_matches_unfused);
    RUN(test_swiglu_gradcheck);
    RUN(test_swiglu_errors_and_meta);
    RUN(test_ce_gradcheck);
    RUN(test_ce_fused_errors);
    rope_grad_in_layout(ACCEL_F32);
    rope_grad_in_layout(ACCEL_BF16);
    /* the fast paths in every CPU variant this machine runs */
    each_cpu_variant(fast_vs_ref);
    return check_summary();
}
