/* Layers: Linear against PyTorch (fixture), Embedding, norms, Sequential, activations. */
#include "nn_fixture.h"

/* y = x W^T + b and its gradients, against torch (tests/data/llama_linear.safetensors). */
static void test_linear_vs_torch(void) {
    accel_safetensors *st = accel_safetensors_open("data/llama_linear.safetensors");
    CHECK(st != NULL);
    if (!st) return;
    accel_module *lin = accel_linear_new(5, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel_safetensors_load_into(st, "weight", accel_module_get_tensor(lin, "weight")) == ACCEL_OK);
    CHECK(accel_safetensors_load_into(st, "bias", accel_module_get_tensor(lin, "bias")) == ACCEL_OK);
    accel_tensor *x = accel_safetensors_tensor(st, "x", ACCEL_F32);
    accel_tensor *gy = accel_safetensors_tensor(st, "gy", ACCEL_F32);
    accel_requires_grad_(x, true);
    accel_tensor *y = accel_module_call(lin, x);
    check_tensor_close(st, "y", y, 1e-5, 1e-6);
    CHECK(accel_backward_with(y, gy) == ACCEL_OK);
    check_tensor_close(st, "gx", x->grad, 1e-5, 1e-6);
    check_tensor_close(st, "gweight", accel_module_get_tensor(lin, "weight")->grad, 1e-5, 1e-6);
    check_tensor_close(st, "gbias", accel_module_get_tensor(lin, "bias")->grad, 1e-5, 1e-6);
    accel_step_reset();
    accel_tensor_free(x);
    accel_tensor_free(gy);
    accel_module_free(lin);
    accel_safetensors_close(st);
}

static void test_linear_init_bounds(void) {
    accel_manual_seed(3);
    accel_module *lin = accel_linear_new(100, 50, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor *w = accel_module_get_tensor(lin, "weight"), *b = accel_module_get_tensor(lin, "bias");
    double bound = 0.1, mx = 0, s2 = 0;
    for (int64_t i = 0; i < 5000; i++) {
        double v = ((float *)w->data)[i];
        mx = fmax(mx, fabs(v));
        s2 += v * v;
    }
    CHECK(mx <= bound && mx > 0.95 * bound);
    CHECK_CLOSE(sqrt(s2 / 5000), bound / sqrt(3.0), 0.05, 0); /* std of U(-a, a) = a / sqrt(3) */
    for (int i = 0; i < 50; i++) CHECK(fabs(((float *)b->data)[i]) <= bound);
    accel_module_free(lin);
}

static void test_embedding_and_norms(void) {
    accel_module *emb = accel_embedding_new(6, 4, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(strcmp(emb->ops->type_name, "Embedding") == 0);
    accel_tensor *ids = accel_from_data(ACCEL_I64, ACCEL_SHAPE(2), (int64_t[]){5, 2});
    accel_tensor *e = accel_module_call(emb, ids);
    accel_tensor *w = accel_module_get_tensor(emb, "weight");
    CHECK(e && e->ndim == 2 && e->shape[1] == 4);
    for (int j = 0; e && j < 4; j++)
        CHECK(accel_get(e, (int64_t[]){0, j}) == accel_get(w, (int64_t[]){5, j}));

    accel_module *rms = accel_rms_norm_new(4, 1e-6, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_set(accel_module_get_tensor(rms, "weight"), (int64_t[]){2}, 3.0);
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 4), (float[]){1, 2, 3, 4});
    accel_tensor *y = accel_module_call(rms, x);
    double r = 1.0 / sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
    CHECK(y != NULL);
    if (y) {
        CHECK_CLOSE(accel_get(y, (int64_t[]){0, 0}), 1 * r, 1e-6, 0);
        CHECK_CLOSE(accel_get(y, (int64_t[]){0, 2}), 3 * r * 3, 1e-6, 0);
    }

    accel_module *ln = accel_layer_norm_new(4, 1e-5, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(ln->n_tensors == 2 && strcmp(ln->tensors[1].name, "bias") == 0);
    y = accel_module_call(ln, x);
    double sd = sqrt(1.25 + 1e-5);
    if (y) CHECK_CLOSE(accel_get(y, (int64_t[]){0, 3}), 1.5 / sd, 1e-5, 0);
    accel_module *ln_plain = accel_layer_norm_new(4, 1e-5, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(ln_plain->n_tensors == 0);
    y = accel_module_call(ln_plain, x);
    if (y) CHECK_CLOSE(accel_get(y, (int64_t[]){0, 0}), -1.5 / sd, 1e-5, 0);
    accel_step_reset();
    accel_module_free(emb);
    accel_module_free(rms);
    accel_module_free(ln);
    accel_module_free(ln_plain);
}

static void test_sequential_activations(void) {
    accel_module *kids[3] = {accel_silu_module_new(), accel_gelu_module_new(true),
                             accel_gelu_module_new(false)};
    accel_module *seq = accel_sequential_new(3, kids);
    CHECK(seq && seq->n_children == 3 && strcmp(accel_module_find(seq, "1")->ops->type_name, "GELU") == 0);
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1), (float[]){0.7f});
    accel_tensor *y = accel_module_call(seq, x);
    double s = 0.7 / (1 + exp(-0.7));
    double gt = 0.5 * s * (1 + tanh(sqrt(2 / M_PI) * (s + 0.044715 * s * s * s)));
    double ge = 0.5 * gt * (1 + erf(gt / sqrt(2.0)));
    CHECK(y && fabs(accel_item(y) - ge) < 1e-6);
    accel_module *relu = accel_relu_module_new();
    CHECK(accel_item(accel_module_call(relu, accel_neg(x))) == 0.0);
    /* A NULL input: NULL with an error, as every op (it came back with none). */
    accel_clear_error();
    CHECK(accel_module_call(seq, NULL) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "Sequential");
    accel_clear_error();
    accel_module *empty = accel_sequential_new(0, NULL);
    CHECK(accel_module_call(empty, x) == x); /* nn.Sequential(): the identity */
    accel_step_reset();
    CHECK(accel_module_call(empty, x) == NULL && accel_last_status() == ACCEL_ERR_STATE); /* x's step ended */
    accel_clear_error();
    accel_module_free(empty);
    accel_module_free(seq);
    accel_module_free(relu);
    /* NULL children list: error, nothing leaks. */
    CHECK(accel_sequential_new(2, NULL) == NULL);
    accel_clear_error();
}

int main(void) {
    RUN(test_linear_vs_torch);
    RUN(test_linear_init_bounds);
    RUN(test_embedding_and_norms);
    RUN(test_sequential_activations);
    accel_thread_cleanup();
    return check_summary();
}
