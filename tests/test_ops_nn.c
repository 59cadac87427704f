/* accel_embedding, accel_rms_norm, accel_layer_norm, accel_softmax,
 * accel_log_softmax, accel_rope: PyTorch fixtures (fast and reference paths),
 * finite differences, dtypes, meta, errors. */
#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

/* Runs op on the fixture inputs in[] (named prefix + names[i]), compares the
 * output and the input gradients for the fixture's upstream gradient. */
typedef accel_tensor *(*fx_op)(accel_tensor *const *in);

static void check_vs_torch(fx_file *f, const char *prefix, int n, const char *const *names, fx_op op) {
    char key[96], dkey[96];
    accel_tensor *in[4];
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        for (int i = 0; i < n; i++) {
            snprintf(key, sizeof key, "%s%s", prefix, names[i]);
            in[i] = fx_get(f, key);
            accel_requires_grad_(in[i], true);
            if (in[i]->grad) accel_zero_(in[i]->grad);
        }
        accel_tensor *y = op(in);
        snprintf(key, sizeof key, "%sy", prefix);
        CHECK_FX(key, y, fx_get(f, key), 1e-5, 1e-6);
        snprintf(key, sizeof key, "%sgy", prefix);
        CHECK(y && accel_backward_with(y, fx_get(f, key)) == ACCEL_OK);
        for (int i = 0; i < n; i++) {
            snprintf(dkey, sizeof dkey, "%sd%s", prefix, names[i]);
            CHECK_FX(dkey, in[i]->grad, fx_get(f, dkey), 1e-5, 1e-5);
        }
        accel_set_reference_kernels(prev);
        accel_step_reset();
    }
}

static accel_tensor *op_rms(accel_tensor *const *in) { return accel_rms_norm(in[0], in[1], 1e-6); }
static accel_tensor *op_ln(accel_tensor *const *in) { return accel_layer_norm(in[0], in[1], in[2], 1e-5); }
static accel_tensor *op_softmax(accel_tensor *const *in) { return accel_softmax(in[0], 1); }
static accel_tensor *op_log_softmax(accel_tensor *const *in) { return accel_log_softmax(in[0], -1); }
static accel_tensor *op_rope(accel_tensor *const *in) { return accel_rope(in[0], 3, 10000.0); }

static void test_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_nn.bin")) {
        CHECK(0);
        return;
    }
    check_vs_torch(&f, "rms_norm.", 2, (const char *[]){"x", "w"}, op_rms);
    check_vs_torch(&f, "layer_norm.", 3, (const char *[]){"x", "w", "b"}, op_ln);
    check_vs_torch(&f, "softmax.", 1, (const char *[]){"x"}, op_softmax);
    check_vs_torch(&f, "log_softmax.", 1, (const char *[]){"x"}, op_log_softmax);
    check_vs_torch(&f, "rope.", 1, (const char *[]){"x"}, op_rope);
    fx_free(&f);
}

static accel_tensor *loss_rms(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_rms_norm(in[0], n > 1 ? in[1] : NULL, 1e-5));
}
static accel_tensor *loss_ln(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_layer_norm(in[0], n > 1 ? in[1] : NULL, n > 2 ? in[2] : NULL, 1e-5));
}
static accel_tensor *loss_softmax(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_softmax(in[0], *(int *)ctx));
}
static accel_tensor *loss_log_softmax(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_log_softmax(in[0], *(int *)ctx));
}
static accel_tensor *loss_rope(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_rope(in[0], 5, 100.0));
}
/* scaled RoPE: made-up frequencies and an attention scaling of 1.5 */
static accel_tensor *loss_rope_freqs(accel_tensor *const *in, int n, void *ctx) {
    static const float inv[3] = {0.7f, 0.05f, 1.3f}; /* D/2 of the gradcheck input [2, 3, 4, 6] */
    return gc_weighted_sum(accel_rope_freqs(in[0], 5, inv, 1.5));
}
static accel_tensor *loss_embedding(accel_tensor *const *in, int n, void *ctx) {
    accel_tensor *ids = accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, 3), (int64_t[]){1, 4, 1, 0, 4, 2});
    return gc_weighted_sum(accel_embedding(ids, in[0]));
}

static void test_gradcheck(void) {
    accel_tensor *x = gc_randn(1, ACCEL_SHAPE(3, 2, 5)), *w = gc_randn(2, ACCEL_SHAPE(5)), *b = gc_randn(3, ACCEL_SHAPE(5));
    CHECK(gradcheck("rms_norm", loss_rms, NULL, 2, (accel_tensor *[]){x, w}, NULL) == 0);
    CHECK(gradcheck("rms_norm_noweight", loss_rms, NULL, 1, (accel_tensor *[]){x}, NULL) == 0);
    CHECK(gradcheck("layer_norm", loss_ln, NULL, 3, (accel_tensor *[]){x, w, b}, NULL) == 0);
    CHECK(gradcheck("layer_norm_noaffine", loss_ln, NULL, 1, (accel_tensor *[]){x}, NULL) == 0);
    for (int dim = -3; dim < 3; dim++) {
        CHECK_MSG(gradcheck("softmax", loss_softmax, &dim, 1, (accel_tensor *[]){x}, NULL) == 0, "dim %d", dim);
        CHECK_MSG(gradcheck("log_softmax", loss_log_softmax, &dim, 1, (accel_tensor *[]){x}, NULL) == 0, "dim %d", dim);
    }
    accel_tensor *r = gc_randn(4, ACCEL_SHAPE(2, 3, 4, 6));
    CHECK(gradcheck("rope", loss_rope, NULL, 1, (accel_tensor *[]){r}, NULL) == 0);
    CHECK(gradcheck("rope_freqs", loss_rope_freqs, NULL, 1, (accel_tensor *[]){r}, NULL) == 0);
    accel_tensor *e = gc_randn(5, ACCEL_SHAPE(5, 3));
    CHECK(gradcheck("embedding", loss_embedding, NULL, 1, (accel_tensor *[]){e}, NULL) == 0);
    accel_tensor_free(x);
    accel_tensor_free(w);
    accel_tensor_free(b);
    accel_tensor_free(r);
    accel_tensor_free(e);
}

static void test_fast_vs_reference_large(void) {
    /* Sizes that take the OpenMP paths. */
    accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(64, 4, 96)), *w = accel_empty(ACCEL_F32, ACCEL_SHAPE(96));
    accel_rng r;
    accel_rng_init(&r, 9);
    accel_rng_normal_(&r, x, 0.0, 2.0);
    accel_rng_normal_(&r, w, 1.0, 0.5);
    accel_tensor *fast[5], *ref[5];
    for (int k = 0; k < 2; k++) {
        bool prev = accel_set_reference_kernels(k);
        accel_tensor **o = k ? ref : fast;
        o[0] = accel_rms_norm(x, w, 1e-6);
        o[1] = accel_layer_norm(x, w, w, 1e-5);
        o[2] = accel_softmax(x, 1);
        o[3] = accel_log_softmax(x, -1);
        o[4] = accel_rope(accel_reshape(x, ACCEL_SHAPE(2, 32, 4, 96)), 17, 10000.0);
        accel_set_reference_kernels(prev);
    }
    for (int i = 0; i < 5; i++) CHECK_MSG(fx_compare("fast vs ref", fast[i], ref[i], 1e-5, 1e-5) == 0, "op %d", i);
    accel_step_reset();
}

static void test_rope_values(void) {
    /* D = 2: a plain rotation of (x1, x2) by pos * 1 (inv_freq[0] = 1). */
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 1, 2, 2), (float[]){1, 0, 1, 0});
    accel_tensor *y = accel_rope(x, 1, 10000.0);
    CHECK_CLOSE(accel_get(y, (int64_t[]){0, 0, 0, 0}), cos(1.0), 1e-6, 1e-7);
    CHECK_CLOSE(accel_get(y, (int64_t[]){0, 0, 0, 1}), sin(1.0), 1e-6, 1e-7);
    CHECK_CLOSE(accel_get(y, (int64_t[]){0, 0, 1, 1}), sin(2.0), 1e-6, 1e-7);
    CHECK(accel_rope(accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 2, 3)), 0, 10000.0) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "D even");
    accel_clear_error();
    /* given frequencies and a scaling: (x1, x2) = (1, 0) at position 2 with inv_freq 0.25, scaled by 3 */
    float inv = 0.25f;
    accel_tensor *z = accel_rope_freqs(x, 1, &inv, 3.0);
    CHECK_CLOSE(accel_get(z, (int64_t[]){0, 0, 1, 0}), 3 * cos(0.5), 1e-6, 1e-7);
    CHECK_CLOSE(accel_get(z, (int64_t[]){0, 0, 1, 1}), 3 * sin(0.5), 1e-6, 1e-7);
    CHECK(accel_rope_freqs(x, 0, NULL, 1.0) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "inv_freq must be given");
    CHECK(accel_rope_freqs(x, 0, &inv, 0.0) == NULL && accel_rope_freqs(x, 0, &inv, NAN) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "attention_scaling finite and > 0");
    accel_clear_error();
    /* a position past int64 (pos_offset + t wrapped negative; UBSan: signed overflow) */
    CHECK(accel_rope(x, INT64_MAX, 10000.0) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "pos_offset + T < 2^63");
    accel_clear_error();
    CHECK(accel_rope_freqs(x, INT64_MAX - 1, &inv, 1.0) == NULL);
    accel_clear_error();
    CHECK(accel_rope(x, INT64_MAX - 2, 10000.0) != NULL); /* T = 2: positions up to INT64_MAX - 1 */
    accel_step_reset();
}

static void test_embedding(void) {
    accel_tensor *w = accel_from_floats(ACCEL_SHAPE(3, 2), (float[]){0, 1, 10, 11, 20, 21});
    accel_tensor *ids = accel_from_data(ACCEL_I32, ACCEL_SHAPE(2, 2), (int32_t[]){2, 0, 1, 2});
    accel_tensor *y = accel_embedding(ids, w);
    CHECK(y && y->ndim == 3 && y->shape[2] == 2);
    CHECK(accel_get(y, (int64_t[]){0, 0, 1}) == 21 && accel_get(y, (int64_t[]){1, 0, 0}) == 10);
    bool prev = accel_set_reference_kernels(true);
    accel_tensor *yr = accel_embedding(ids, accel_to_dtype(w, ACCEL_BF16));
    accel_set_reference_kernels(prev);
    CHECK(yr && yr->dtype == ACCEL_BF16 && accel_get(yr, (int64_t[]){1, 1, 1}) == 21);
    /* backward: repeated ids add up */
    accel_tensor *p = gc_from_floats(ACCEL_SHAPE(3, 2), (float[]){0, 1, 10, 11, 20, 21});
    CHECK(accel_backward(accel_sum_all(accel_embedding(ids, p))) == ACCEL_OK);
    CHECK(p->grad && accel_get(p->grad, (int64_t[]){2, 0}) == 2 && accel_get(p->grad, (int64_t[]){0, 1}) == 1);
    accel_tensor_free(p);
    accel_clear_error();
    CHECK(refused_now_or_at_sync(accel_embedding(accel_from_data(ACCEL_I64, ACCEL_SHAPE(2), (int64_t[]){1, 3}), w)));
    CHECK_STR_CONTAINS(accel_last_error(), "id 3");
    CHECK_STR_CONTAINS(accel_last_error(), "3 embeddings");
    accel_clear_error();
    CHECK(accel_embedding(w, w) == NULL && accel_last_status() == ACCEL_ERR_DTYPE);
    accel_clear_error();
    accel_step_reset();
}

static void test_dtypes_meta_errors(void) {
    accel_tensor *x = accel_ones(ACCEL_BF16, ACCEL_SHAPE(2, 4)), *w = accel_ones(ACCEL_F32, ACCEL_SHAPE(4));
    accel_tensor *y = accel_rms_norm(x, w, 1e-6);
    CHECK(y && y->dtype == ACCEL_F32);
    y = accel_rms_norm(x, accel_to_dtype(w, ACCEL_BF16), 1e-6);
    CHECK(y && y->dtype == ACCEL_BF16);
    CHECK(accel_softmax(x, 0)->dtype == ACCEL_BF16);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    CHECK(accel_softmax(x, 0)->dtype == ACCEL_F32);
    CHECK(accel_layer_norm(x, NULL, NULL, 1e-5)->dtype == ACCEL_F32);
    accel_autocast_end(prev);
    /* meta */
    accel_tensor *m = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(8, 32, 4096, 128), ACCEL_META_DEVICE);
    accel_tensor *ids = accel_tensor_new(ACCEL_I64, ACCEL_SHAPE(8, 4096), ACCEL_META_DEVICE);
    accel_tensor *emb = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(128000, 8192), ACCEL_META_DEVICE);
    accel_tensor *r = accel_rope(m, 0, 500000.0);
    CHECK(r && r->data == NULL && r->shape[3] == 128);
    CHECK(accel_softmax(m, -1)->data == NULL);
    accel_tensor *e = accel_embedding(ids, emb);
    CHECK(e && e->data == NULL && e->ndim == 3 && e->shape[2] == 8192);
    CHECK(accel_rms_norm(e, NULL, 1e-6)->data == NULL);
    accel_tensor_free(m);
    accel_tensor_free(ids);
    accel_tensor_free(emb);
    /* errors */
    accel_clear_error();
    CHECK(accel_rms_norm(x, accel_ones(ACCEL_F32, ACCEL_SHAPE(5)), 1e-6) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_rms_norm: shapes [2, 4] and [5]");
    accel_clear_error();
    CHECK(accel_softmax(x, 2) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_softmax: dim 2 out of range");
    accel_clear_error();
    CHECK(accel_layer_norm(NULL, NULL, NULL, 1e-5) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    accel_step_reset();
}

int main(void) {
    RUN(test_vs_torch);
    RUN(test_gradcheck);
    RUN(test_fast_vs_reference_large);
    RUN(test_rope_values);
    RUN(test_embedding);
    RUN(test_dtypes_meta_errors);
    accel_thread_cleanup();
    return check_summary();
}
