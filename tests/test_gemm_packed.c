/* A layer's weight in oneDNN's layout (src/backends/cpu/gemm.h:
 * accel__gemm_weight; docs/cpu.md, "Prepared weights"). Under the oneDNN
 * provider (forced here: ACCEL_GEMM=dnnl; on this AVX2 machine oneDNN's
 * f32 matmul is gemm:jit) the linear's forward and dX GEMMs read their
 * weight reordered into the layout oneDNN's matmul wants, made once per
 * version of the weight (a prepared form), not per call:
 *   - results equal the plain weight's bit for bit (the same matmul
 *     kernels on the same values: only where the weight's panels come from
 *     differs), also for odd shapes, alpha and beta;
 *   - each optimizer step (a version bump) gets a fresh reorder, whose
 *     result matches the plain weight (a stale form would not);
 *   - the micro-batches of gradient accumulation share one reorder;
 *   - forms die with their owners in any order, mid-step included, and a
 *     form of a form (the bf16 copy's own layout on an AMX machine) too;
 *   - with the cache off (accel__prepared_set_enabled, and ACCEL_WEIGHT_CACHE=0
 *     in the environment: tests/gemm.cmake runs this file once more so)
 *     nothing is reordered and the results are the same.
 * Which GEMMs get a form depends on the CPU kind (gemm:jit on AVX2 reads a
 * plain [K, N], so NT weights get one and NN none; brgemm on AVX-512 wants
 * blocks and gets none where they would pad the weight): every count here
 * comes from accel__gemm_weight_has_form, the library's own decision, so the
 * file holds on every kind (tests/gemm.cmake also runs it under
 * ACCEL_CPU_ISA=baseline and avx2).
 * Without oneDNN in the build every GEMM is plain: the same checks, no forms. */
#include "accel/accel.h"
#include "backends/cpu/gemm.h"
#include "check.h"
#include "core/prepared.h"

/* Whether this run reorders weights: oneDNN built in and the cache on. */
static bool g_packs;
/* Whether accel__gemm_test_padded_layouts is on (no form anywhere). */
static bool g_padded;

/* Forms an f32 weight GEMM of this shape builds in this run: 1 where the
 * library reads the weight from a form in oneDNN's layout, else 0. */
static uint64_t forms_of(bool trans_b, int64_t M, int64_t N, int64_t K) {
    return g_packs && accel__gemm_weight_has_form(ACCEL_F32, false, trans_b, M, N, K);
}

static bool cache_on(void) {
    bool on = accel__prepared_set_enabled(true);
    accel__prepared_set_enabled(on);
    return on;
}

static uint64_t builds(void) { return accel__prepared_stats_get().builds; }

static float value(uint64_t i, uint64_t seed) { return (float)((int64_t)((i * 2654435761u + seed) % 61) - 30) / 32.0f; }

static void fill(float *p, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) p[i] = value((uint64_t)i, seed);
}

/* ------------------------------------------------------------ accel__gemm_weight vs accel__gemm */

/* C = alpha A op(W) + beta C through accel__gemm_weight (the weight's form)
 * and through accel__gemm on W's plain memory: the same bits. */
static void check_gemm_case(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    int64_t rows = trans_b ? N : K, cols = trans_b ? K : N;
    accel_tensor *w = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){rows, cols}, ACCEL_CPU_DEVICE);
    float *a = malloc(sizeof(float) * (size_t)(M * K)), *c_plain = malloc(sizeof(float) * (size_t)(M * N));
    float *c_packed = malloc(sizeof(float) * (size_t)(M * N));
    CHECK(w && a && c_plain && c_packed);
    fill(w->data, rows * cols, 7);
    fill(a, M * K, 3);
    fill(c_plain, M * N, 5);
    memcpy(c_packed, c_plain, sizeof(float) * (size_t)(M * N));
    for (int call = 0; call < 2; call++) { /* the second call reads the form the first built */
        accel_status sp = accel__gemm(false, trans_b, M, N, K, alpha, a, ACCEL_F32, K, w->data, ACCEL_F32, cols, beta,
                                      c_plain, N);
        accel_status sw = accel__gemm_weight(false, trans_b, M, N, K, alpha, a, ACCEL_F32, K, w, 0, cols, beta,
                                             c_packed, N);
        CHECK_MSG(sp == ACCEL_OK && sw == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(memcmp(c_plain, c_packed, sizeof(float) * (size_t)(M * N)) == 0,
                  "%s %lld x %lld x %lld alpha %g beta %g: the weight's form gave other bits", trans_b ? "NT" : "NN",
                  (long long)M, (long long)N, (long long)K, alpha, beta);
        accel_step_reset();
    }
    accel_tensor_free(w);
    free(a);
    free(c_plain);
    free(c_packed);
}

static void test_gemm_weight_matches_plain(void) {
    static const int64_t SHAPES[][3] = {{1, 8, 8}, {5, 29, 37}, {24, 96, 64}, {64, 48, 160}, {130, 64, 64}};
    static const float AB[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, 0.25f}};
    uint64_t b0 = builds(), want = 0;
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++)
        for (int t = 0; t < 2; t++)
            for (size_t k = 0; k < sizeof AB / sizeof AB[0]; k++) {
                check_gemm_case(t == 1, SHAPES[s][0], SHAPES[s][1], SHAPES[s][2], AB[k][0], AB[k][1]);
                want += forms_of(t == 1, SHAPES[s][0], SHAPES[s][1], SHAPES[s][2]); /* one per weight */
            }
    CHECK_MSG(builds() == b0 + want, "%llu weights reordered, the library's choice says %llu",
              (unsigned long long)(builds() - b0), (unsigned long long)want);
    /* W^T stored [N, K] is never the layout oneDNN's matmul wants for op(B)
     * [K, N] (gemm:jit: row-major [K, N]; brgemm: blocked): an NT case
     * without padding gets a form on every kind */
    if (g_packs && !g_padded) CHECK_MSG(want > 0, "no case reads a form: the packed path did not run");
}

/* A part of a weight (rows [N, 2N) of it): accel__gemm_weight is
 * accel__gemm on that memory, no form. */
static void test_gemm_weight_not_whole(void) {
    enum { M = 6, N = 16, K = 24 };
    accel_tensor *w = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){2 * N, K}, ACCEL_CPU_DEVICE);
    float a[M * K], c_plain[M * N], c_weight[M * N];
    fill(w->data, 2 * N * K, 11);
    fill(a, M * K, 13);
    uint64_t b0 = builds();
    /* rows [N, 2N) of w as op(B)^T */
    CHECK(accel__gemm(false, true, M, N, K, 1.0f, a, ACCEL_F32, K, (float *)w->data + N * K, ACCEL_F32, K, 0.0f,
                      c_plain, N) == ACCEL_OK);
    CHECK(accel__gemm_weight(false, true, M, N, K, 1.0f, a, ACCEL_F32, K, w, N * K, K, 0.0f, c_weight, N) == ACCEL_OK);
    CHECK(memcmp(c_plain, c_weight, sizeof c_plain) == 0);
    CHECK(builds() == b0);
    accel_step_reset();
    accel_tensor_free(w);
}

/* ------------------------------------------------------------ training, packed vs plain */

enum { IN = 64, HID = 96, OUT = 32, ROWS = 24, STEPS = 3, MAX_ACCUM = 4 };

typedef struct trace {
    float loss[STEPS * MAX_ACCUM];
    float gx[STEPS * MAX_ACCUM][ROWS * IN];
    float w1[STEPS][HID * IN], w2[STEPS][OUT * HID];
    uint64_t builds_after[STEPS * MAX_ACCUM]; /* since the start, after each micro-batch */
    int64_t bytes_after_first;                /* forms held after the first micro-batch */
} trace;

/* STEPS SGD steps of `accum` micro-batches of a two-layer MLP,
 * loss = sum((W2 relu(W1 x + b1)) * r), from fixed weights; the step arena is
 * reset after each micro-batch and after each optimizer step, as a training
 * loop does. */
static void train(bool cache, int accum, trace *tr) {
    bool was = accel__prepared_set_enabled(cache);
    accel_module *l1 = accel_linear_new(IN, HID, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_module *l2 = accel_linear_new(HID, OUT, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor *w1 = accel_module_get_tensor(l1, "weight"), *b1 = accel_module_get_tensor(l1, "bias");
    accel_tensor *w2 = accel_module_get_tensor(l2, "weight");
    float *v = malloc(sizeof(float) * HID * IN);
    fill(v, HID * IN, 1);
    CHECK(accel_tensor_from_host(w1, v) == ACCEL_OK);
    fill(v, OUT * HID, 2);
    CHECK(accel_tensor_from_host(w2, v) == ACCEL_OK);
    CHECK(accel_fill_(b1, 0.125) == ACCEL_OK);
    accel_tensor *params[3] = {w1, b1, w2};
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.01);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, 3, params, &h);
    CHECK(opt != NULL);
    int64_t bytes0 = accel__prepared_stats_get().bytes;
    uint64_t b0 = builds();
    for (int s = 0; s < STEPS; s++) {
        for (int k = 0; k < accum; k++) {
            int mb = s * accum + k;
            fill(v, ROWS * IN, 100 + (uint64_t)mb);
            accel_tensor *x = accel_from_floats(ACCEL_SHAPE(ROWS, IN), v);
            fill(v, ROWS * OUT, 200 + (uint64_t)mb);
            accel_tensor *r = accel_from_floats(ACCEL_SHAPE(ROWS, OUT), v);
            accel_requires_grad_(x, true);
            accel_tensor *y = accel_linear(accel_relu(accel_linear(x, w1, b1)), w2, NULL);
            accel_tensor *loss = accel_sum(accel_mul(y, r), 0, NULL, false);
            CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
            CHECK(accel_to_floats(loss, &tr->loss[mb]) == ACCEL_OK);
            CHECK(accel_to_floats(x->grad, tr->gx[mb]) == ACCEL_OK);
            tr->builds_after[mb] = builds() - b0;
            if (mb == 0) tr->bytes_after_first = accel__prepared_stats_get().bytes - bytes0;
            accel_step_reset();
        }
        CHECK(accel_optimizer_step(opt) == ACCEL_OK && accel_optimizer_zero_grad(opt) == ACCEL_OK);
        CHECK(accel_to_floats(w1, tr->w1[s]) == ACCEL_OK && accel_to_floats(w2, tr->w2[s]) == ACCEL_OK);
        accel_step_reset();
    }
    accel_optimizer_free(opt);
    accel_module_free(l2);
    accel_module_free(l1);
    CHECK_MSG(accel__prepared_stats_get().bytes == bytes0, "the forms outlived their weights");
    free(v);
    accel__prepared_set_enabled(was);
}

/* Forms per optimizer step: each weight's forward (NT) and dX (NN) GEMM
 * where the library reads that weight from a form (accel__gemm_weight_has_form:
 * on AVX2 the forwards, on AVX-512 the GEMMs whose blocks fit the weight),
 * the same every step. */
static void check_builds(const trace *tr, int accum) {
    uint64_t per_step = tr->builds_after[0];
    uint64_t w1_forms = forms_of(true, ROWS, HID, IN) + forms_of(false, ROWS, IN, HID); /* Y = X W1^T, dX = dH W1 */
    uint64_t w2_forms = forms_of(true, ROWS, OUT, HID) + forms_of(false, ROWS, HID, OUT);
    CHECK_MSG(per_step == w1_forms + w2_forms, "%llu forms a step, the library's choice says %llu",
              (unsigned long long)per_step, (unsigned long long)(w1_forms + w2_forms));
    CHECK_MSG(tr->bytes_after_first == (int64_t)(sizeof(float) * (w1_forms * HID * IN + w2_forms * OUT * HID)),
              "forms hold %lld bytes", (long long)tr->bytes_after_first);
    for (int s = 0; s < STEPS; s++)
        for (int k = 0; k < accum; k++) /* built by each step's first micro-batch, shared by the others */
            CHECK_MSG(tr->builds_after[s * accum + k] == per_step * (uint64_t)(s + 1),
                      "step %d micro-batch %d: %llu builds, want %llu", s, k,
                      (unsigned long long)tr->builds_after[s * accum + k], (unsigned long long)(per_step * (s + 1)));
}

static void check_training(int accum) {
    static trace packed, plain;
    memset(&packed, 0, sizeof packed);
    memset(&plain, 0, sizeof plain);
    train(cache_on(), accum, &packed);
    train(false, accum, &plain);
    check_builds(&packed, accum);
    CHECK(plain.builds_after[STEPS * accum - 1] == 0);
    int n = STEPS * accum;
    CHECK_MSG(memcmp(packed.loss, plain.loss, sizeof(float) * (size_t)n) == 0, "accum %d: losses differ", accum);
    CHECK_MSG(memcmp(packed.gx, plain.gx, sizeof packed.gx[0] * (size_t)n) == 0, "accum %d: dX differs", accum);
    CHECK_MSG(memcmp(packed.w1, plain.w1, sizeof packed.w1) == 0 && memcmp(packed.w2, plain.w2, sizeof packed.w2) == 0,
              "accum %d: the weights after the steps differ", accum);
    /* the steps moved the weights (so a stale form would be seen) */
    CHECK(memcmp(plain.w1[0], plain.w1[1], sizeof plain.w1[0]) != 0);
    CHECK(plain.loss[0] != plain.loss[accum]);
}

static void test_training_matches_plain(void) { check_training(1); }

static void test_accumulation_shares_one_reorder(void) { check_training(MAX_ACCUM); }

/* A write between steps (here accel_copy_ of new values) gets a fresh
 * reorder: the forward after it equals the plain forward on the new values. */
static void test_write_rebuilds(void) {
    accel_tensor *w = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){HID, IN}, ACCEL_CPU_DEVICE);
    float xv[ROWS * IN], wv[HID * IN], y_old[ROWS * HID], y_new[ROWS * HID], y_plain[ROWS * HID];
    fill(xv, ROWS * IN, 21);
    fill(wv, HID * IN, 22);
    CHECK(accel_tensor_from_host(w, wv) == ACCEL_OK);
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(ROWS, IN), xv);
    CHECK(accel_to_floats(accel_linear(x, w, NULL), y_old) == ACCEL_OK);
    accel_step_reset();
    fill(wv, HID * IN, 23);
    accel_tensor *src = accel_from_floats(ACCEL_SHAPE(HID, IN), wv);
    CHECK(accel_copy_(w, src) == ACCEL_OK);
    accel_step_reset();
    uint64_t b0 = builds();
    x = accel_from_floats(ACCEL_SHAPE(ROWS, IN), xv);
    CHECK(accel_to_floats(accel_linear(x, w, NULL), y_new) == ACCEL_OK);
    CHECK(builds() == b0 + forms_of(true, ROWS, HID, IN));
    bool was = accel__prepared_set_enabled(false);
    CHECK(accel_to_floats(accel_linear(x, w, NULL), y_plain) == ACCEL_OK);
    accel__prepared_set_enabled(was);
    CHECK_MSG(memcmp(y_new, y_plain, sizeof y_new) == 0, "the forward read the weight's old form");
    CHECK(memcmp(y_new, y_old, sizeof y_new) != 0);
    accel_step_reset();
    accel_tensor_free(w);
}

/* ------------------------------------------------------------ lifetimes */

/* One forward of each weight; then the weights are freed, first or second
 * one first, mid-step (their forms wait for the step's end) or after it. */
static void free_order(bool first_first, bool mid_step) {
    int64_t bytes0 = accel__prepared_stats_get().bytes;
    accel_tensor *w[2];
    float xv[ROWS * IN], wv[HID * IN];
    fill(xv, ROWS * IN, 31);
    for (int i = 0; i < 2; i++) {
        w[i] = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){HID, IN}, ACCEL_CPU_DEVICE);
        fill(wv, HID * IN, 32 + (uint64_t)i);
        CHECK(w[i] && accel_tensor_from_host(w[i], wv) == ACCEL_OK);
        accel_tensor *x = accel_from_floats(ACCEL_SHAPE(ROWS, IN), xv);
        accel_requires_grad_(x, true);
        accel_tensor *loss = accel_sum(accel_linear(x, w[i], NULL), 0, NULL, false);
        CHECK(loss && accel_backward(loss) == ACCEL_OK);
    }
    if (forms_of(true, ROWS, HID, IN) || forms_of(false, ROWS, IN, HID))
        CHECK(accel__prepared_stats_get().bytes > bytes0);
    if (!mid_step) accel_step_reset();
    accel_tensor_free(w[first_first ? 0 : 1]);
    accel_tensor_free(w[first_first ? 1 : 0]);
    accel_step_reset();
    CHECK_MSG(accel__prepared_stats_get().bytes == bytes0, "%s first, %s: forms left", first_first ? "w0" : "w1",
              mid_step ? "mid-step" : "after the step");
}

static void test_free_any_order(void) {
    free_order(true, false);
    free_order(false, false);
    free_order(true, true);
    free_order(false, true);
}

static accel_status copy_fill(accel_tensor *dst, accel_tensor *src, const accel__form_key *key) {
    (void)key;
    return accel_copy_(dst, src);
}

/* Under bf16 autocast on a CPU that multiplies bf16 (AMX) the weight GEMM
 * reads the weight's bf16 copy, itself a form, so the oneDNN layout is a
 * form of that form. Here the same shape with an f32 copy: the owner
 * freed mid-step frees the copy at the step's end, and with it (one step
 * later: the copy's own forms were handed out in that step too) the copy's
 * forms. */
static void test_form_of_a_form(void) {
    int64_t bytes0 = accel__prepared_stats_get().bytes;
    accel_tensor *owner = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){HID, IN}, ACCEL_CPU_DEVICE);
    float xv[ROWS * IN], y_form[ROWS * HID], y_plain[ROWS * HID];
    fill(owner->data, HID * IN, 41);
    fill(xv, ROWS * IN, 42);
    accel_tensor *copy = NULL;
    const accel__form_key cast = {.kind = ACCEL__FORM_CAST, .dt = ACCEL_F32};
    bool built = true;
    CHECK(accel__prepared_get(owner, &cast, ACCEL_F32, copy_fill, &copy, &built) == ACCEL_OK);
    if (!cache_on()) {
        CHECK(copy == NULL && !built);
        accel_tensor_free(owner);
        return;
    }
    CHECK(copy != NULL && built);
    accel_tensor *again = NULL; /* current: handed out again, not rebuilt */
    CHECK(accel__prepared_get(owner, &cast, ACCEL_F32, copy_fill, &again, &built) == ACCEL_OK);
    CHECK(again == copy && !built);
    uint64_t b0 = builds();
    CHECK(accel__gemm_weight(false, true, ROWS, HID, IN, 1.0f, xv, ACCEL_F32, IN, copy, 0, IN, 0.0f, y_form, HID) ==
          ACCEL_OK);
    CHECK(builds() == b0 + forms_of(true, ROWS, HID, IN));
    CHECK(accel__gemm(false, true, ROWS, HID, IN, 1.0f, xv, ACCEL_F32, IN, owner->data, ACCEL_F32, IN, 0.0f, y_plain,
                      HID) == ACCEL_OK);
    CHECK(memcmp(y_form, y_plain, sizeof y_form) == 0);
    accel_tensor_free(owner); /* mid-step: the copy waits for the step's end */
    accel_step_reset();
    accel_step_reset();
    CHECK_MSG(accel__prepared_stats_get().bytes == bytes0, "the copy's forms outlived it");
}

/* ------------------------------------------------------------ memory estimate */

static void test_estimate_counts_forms(void) {
    int forms = accel__gemm_weight_forms(ACCEL_F32);
    CHECK(forms == (accel__gemm_have_dnnl() ? 2 : 0)); /* ACCEL_GEMM=dnnl: forward's and dX's */
    accel_rank_memory m;
    const int64_t P = 1 << 20;
    CHECK(accel_rank_memory_estimate(ACCEL_SHARD_DDP, P, P / 4, 1, ACCEL_F32, 0, &m) == ACCEL_OK);
    CHECK(m.prepared == forms * P);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_OPENBLAS) == ACCEL_OK);
    CHECK(accel__gemm_weight_forms(ACCEL_F32) == 0 && accel__gemm_weight_forms(ACCEL_BF16) == 0);
    CHECK(accel_rank_memory_estimate(ACCEL_SHARD_DDP, P, P / 4, 1, ACCEL_F32, 0, &m) == ACCEL_OK && m.prepared == 0);
    if (accel__gemm_have_dnnl()) CHECK(accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK);
}

/* ------------------------------------------------------------ f32 in auto mode: the form where it measured faster */

/* Fake timings: the measured provider choice (gemm_choice.c) sends the
 * class to oneDNN; the form takes form_s, the plain weight 1 s. */
static double g_form_s;
static int g_form_calls;

static double provider_time(void *ctx, accel__gemm_provider p, const accel__gemm_class *c) {
    (void)ctx, (void)c;
    return p == ACCEL__GEMM_PROVIDER_DNNL ? 0.5 : 1.0;
}

static double form_time(void *ctx, bool form, int64_t M, int64_t N, int64_t K) {
    (void)ctx, (void)M, (void)N, (void)K;
    g_form_calls++;
    return form ? g_form_s : 1.0;
}

/* A forward GEMM of 2^26 multiply-adds (measured) on a weight of dims that
 * no blocking pads, in auto mode with oneDNN chosen for its class: the
 * weight reads its form when the form measured faster, the plain weight when
 * slower (no reorder), the verdict is kept (timed once), and the bits are
 * the plain weight's either way. Where the forced oneDNN mode gives this
 * GEMM no form (no oneDNN, a layout equal to the weight's own), auto gives
 * none either; with the cache off nothing is reordered. */
static void test_f32_form_where_faster(void) {
    enum { M = 512, N = 512, K = 256 };
    bool could = accel__gemm_weight_has_form(ACCEL_F32, false, true, M, N, K); /* the forced mode's */
    setenv("ACCEL_GEMM_CACHE", "off", 1);
    unsetenv("ACCEL_GEMM_MEASURE");
    accel__gemm_choice_reset();
    accel__gemm_choice_set_timer(provider_time, NULL);
    CHECK(accel__gemm_set_mode(ACCEL__GEMM_AUTO) == ACCEL_OK);
    bool dnnl = accel__gemm_provider_for(ACCEL_F32, false, true, M, N, K) == ACCEL__GEMM_PROVIDER_DNNL;
    CHECK_MSG(dnnl == accel__gemm_have_dnnl(), "the measured choice did not take oneDNN");
    for (int faster = 0; faster < 2; faster++) {
        g_form_s = faster ? 0.5 : 2.0;
        g_form_calls = 0;
        accel__gemm_form_set_timer(form_time, NULL);
        bool has = accel__gemm_weight_has_form(ACCEL_F32, false, true, M, N, K);
        CHECK_MSG(has == (could && faster), "form %s: has_form %d (forced mode's %d)", faster ? "faster" : "slower",
                  has, could);
        CHECK(g_form_calls == (could ? 2 : 0)); /* plain and form, once */
        uint64_t b0 = builds();
        check_gemm_case(true, M, N, K, 1.0f, 0.0f); /* two calls each way: the same bits */
        CHECK_MSG(builds() == b0 + (g_packs && has ? 1 : 0), "%llu reorders, expected %d",
                  (unsigned long long)(builds() - b0), g_packs && has ? 1 : 0);
        CHECK(g_form_calls == (could ? 2 : 0)); /* the verdict was kept */
    }
    accel__gemm_form_set_timer(NULL, NULL);
    accel__gemm_choice_set_timer(NULL, NULL);
    accel__gemm_choice_reset();
    if (accel__gemm_have_dnnl()) CHECK(accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK);
}

/* The scratch form a weight class's timing reads (gemm_choice.c): made
 * where the library reads a weight of that signature from a form (its own
 * decision, in the forced oneDNN mode), of the weight's size, and oneDNN on
 * it gives the plain weight's bits; none where no layout fits one. */
static void test_scratch_form(void) {
    enum { M = 96, N = 128, K = 64 };
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *c_plain = calloc(M * N, sizeof(float)), *c_form = calloc(M * N, sizeof(float));
    CHECK(a && b && c_plain && c_form);
    fill(a, M * K, 3);
    fill(b, K * N, 7);
    for (int tb = 0; tb < 2; tb++) {
        void *form;
        size_t bytes;
        CHECK(accel__gemm_scratch_form(ACCEL_F32, tb, N, K, b, &form, &bytes) == ACCEL_OK);
        bool want = accel__gemm_have_dnnl() && accel__gemm_weight_has_form(ACCEL_F32, false, tb, M, N, K);
        CHECK_MSG((form != NULL) == want, "%s: a scratch form %s, the library reads %s", tb ? "NT" : "NN",
                  form ? "made" : "not made", want ? "one" : "none");
        CHECK(bytes == (form ? sizeof(float) * N * K : 0));
        int p = accel__gemm_have_dnnl() ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS;
        int64_t ldb = tb ? K : N;
        CHECK(accel__gemm_on(p, false, tb, M, N, K, 1.0f, a, ACCEL_F32, K, b, ACCEL_F32, ldb, 0.0f, c_plain, N) ==
              ACCEL_OK);
        CHECK(accel__gemm_on_form(p, false, tb, M, N, K, 1.0f, a, ACCEL_F32, K, b, form, ldb, 0.0f, c_form, N) ==
              ACCEL_OK);
        CHECK(memcmp(c_plain, c_form, sizeof(float) * M * N) == 0);
        accel_free(form);
        accel_step_reset();
    }
    free(a), free(b), free(c_plain), free(c_form);
}

int main(void) {
    const char *env = getenv("ACCEL_WEIGHT_CACHE");
    if (env && !strcmp(env, "0")) CHECK_MSG(!cache_on(), "ACCEL_WEIGHT_CACHE=0 left the cache on");
    if (accel__gemm_have_dnnl()) CHECK(accel__gemm_set_mode(ACCEL__GEMM_DNNL) == ACCEL_OK);
    g_packs = accel__gemm_have_dnnl() && cache_on();
    RUN(test_gemm_weight_matches_plain);
    RUN(test_gemm_weight_not_whole);
    RUN(test_training_matches_plain);
    RUN(test_accumulation_shares_one_reorder);
    RUN(test_write_rebuilds);
    RUN(test_free_any_order);
    RUN(test_form_of_a_form);
    RUN(test_estimate_counts_forms);
    RUN(test_f32_form_where_faster);
    RUN(test_scratch_form);
    /* The decision of an AVX-512 CPU on shapes its brgemm blocks would pad
     * (the MLP's 96 and 32 here): no form at all, the same results, and
     * every count above still follows the library's choice. */
    accel__gemm_test_padded_layouts(true);
    g_padded = true;
    RUN(test_gemm_weight_matches_plain);
    RUN(test_training_matches_plain);
    RUN(test_write_rebuilds);
    RUN(test_form_of_a_form);
    RUN(test_scratch_form);
    accel__gemm_test_padded_layouts(false);
    accel_thread_cleanup();
    return check_summary();
}
