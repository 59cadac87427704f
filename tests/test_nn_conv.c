/* The image modules (Conv1d, Conv2d, BatchNorm1d/2d, the pools, Flatten):
 * torch's init, state_dict names, BatchNorm's buffers over training and
 * eval steps against torch's (tests/data/ops_bn.bin), and a save / load
 * round trip that carries them. */
#include <stdlib.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "test_files.h"
#include "ops_fixture.h"

static void test_conv_init_and_names(void) {
    accel_module *c = accel_conv2d_new(6, 8, (int64_t[]){3, 2}, (int64_t[]){2, 2}, NULL, NULL, 2, true, ACCEL_CPU_DEVICE,
                                       ACCEL_F32);
    CHECK(c && !strcmp(c->ops->type_name, "Conv2d"));
    accel_tensor *w = accel_module_get_tensor(c, "weight"), *b = accel_module_get_tensor(c, "bias");
    CHECK(w && w->ndim == 4 && w->shape[0] == 8 && w->shape[1] == 3 && w->shape[2] == 3 && w->shape[3] == 2);
    /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 3 * 3 * 2: spread over the range */
    float v[144], bound = 1.0f / sqrtf(18.0f), lo = 1, hi = -1;
    accel_to_floats(w, v);
    for (int i = 0; i < 144; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    CHECK(lo >= -bound && hi <= bound && lo < -0.8f * bound && hi > 0.8f * bound);
    accel_to_floats(b, v);
    for (int i = 0; i < 8; i++) CHECK(fabsf(v[i]) <= bound);
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 6, 7, 7));
    accel_tensor *y = accel_module_call(c, x);
    CHECK(y && y->shape[1] == 8 && y->shape[2] == 3 && y->shape[3] == 3);
    accel_module_free(c);

    accel_module *c1 = accel_conv1d_new(4, 6, 3, 1, 1, 1, 2, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(c1 && !accel_module_get_tensor(c1, "bias") && accel_module_get_tensor(c1, "weight")->ndim == 3);
    y = accel_module_call(c1, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 4, 9)));
    CHECK(y && y->ndim == 3 && y->shape[1] == 6 && y->shape[2] == 9);
    accel_module_free(c1);

    /* padding="same": the output keeps the input's size; torch refuses it with a stride when the layer is made */
    const int64_t same[2] = {ACCEL_PADDING_SAME, ACCEL_PADDING_SAME};
    c = accel_conv2d_new(6, 8, (int64_t[]){4, 3}, NULL, same, (int64_t[]){1, 2}, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    y = c ? accel_module_call(c, x) : NULL;
    CHECK_MSG(y && y->shape[1] == 8 && y->shape[2] == 7 && y->shape[3] == 7, "%s", accel_last_error());
    accel_module_free(c);
    CHECK(!accel_conv2d_new(6, 8, (int64_t[]){3, 3}, (int64_t[]){1, 2}, same, NULL, 2, true, ACCEL_CPU_DEVICE,
                            ACCEL_F32));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_conv2d_new: padding=\"same\" (ACCEL_PADDING_SAME) is not supported "
                                           "for strided convolutions (stride 2)");
    CHECK(!accel_conv2d_new(6, 8, (int64_t[]){3, 3}, NULL, (int64_t[]){ACCEL_PADDING_SAME, 0}, NULL, 2, true,
                            ACCEL_CPU_DEVICE, ACCEL_F32));
    CHECK_STR_CONTAINS(accel_last_error(), "ACCEL_PADDING_SAME in padding[0] alone");
    c1 = accel_conv1d_new(4, 6, 4, 1, ACCEL_PADDING_SAME, 2, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    y = c1 ? accel_module_call(c1, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 4, 9))) : NULL;
    CHECK_MSG(y && y->shape[2] == 9, "%s", accel_last_error());
    accel_module_free(c1);
    CHECK(!accel_conv1d_new(4, 6, 3, 2, ACCEL_PADDING_SAME, 1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_conv1d_new: padding=\"same\"");
    accel_clear_error();

    CHECK(!accel_conv2d_new(6, 8, (int64_t[]){3, 3}, NULL, NULL, NULL, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32) &&
          strstr(accel_last_error(), "multiples of groups (4)"));
    CHECK(!accel_conv1d_new(4, 6, 0, 1, 0, 1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32) &&
          strstr(accel_last_error(), "kernel size 0"));
    /* a failed constructor chained into its call: the cause is the message (it was "module is NULL") */
    accel_clear_error();
    CHECK(!accel_module_call(accel_conv2d_new(6, 8, (int64_t[]){0, 3}, NULL, NULL, NULL, 1, true, ACCEL_CPU_DEVICE,
                                              ACCEL_F32),
                             x));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_conv2d_new: kernel size 0 must be >= 1");
    accel_clear_error();
    CHECK(!accel_module_call(NULL, x)); /* nothing pending: named */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_module_call: module is NULL");
    /* the same inside a Sequential and add_child (nn.h's own pattern), add_param: they read "child is NULL" and
     * "is not a live persistent tensor" */
    accel_clear_error();
    accel_module *kids[2] = {accel_relu_module_new(), accel_conv2d_new(3, 4, (int64_t[]){3, 0}, NULL, NULL, NULL, 1,
                                                                       true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    CHECK(!accel_sequential_new(2, kids)); /* frees the relu */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_conv2d_new: kernel size 0 must be >= 1");
    accel_clear_error();
    accel_module *parent = accel_sequential_new(0, NULL);
    CHECK(!accel_module_add_param(parent, "w", accel_tensor_new(ACCEL_F32, 1, (int64_t[]){-1}, ACCEL_CPU_DEVICE)));
    CHECK(strstr(accel_last_error(), "accel_tensor_new") && !strstr(accel_last_error(), "persistent"));
    accel_clear_error();
    CHECK(!accel_module_add_child(parent, "c", NULL)); /* nothing pending: named */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_module_add_child: child is NULL");
    accel_clear_error();
    accel_module_free(parent);
    accel_step_reset();
}

/* Conv2d / Conv1d with torch's padding_mode (reflect, replicate, circular; explicit and "same" padding, strides,
 * dilations, groups) against torch's modules (tests/data/nn_conv_modes.bin): the output and the gradients of x,
 * weight and bias; the mode's rules as accel_pad's, and bad setter calls. */
static void test_padding_modes_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/nn_conv_modes.bin")) {
        CHECK(0);
        return;
    }
    int cases = 0;
    for (int i = 0; i < f.n; i++) cases += strlen(f.names[i]) > 2 && !strcmp(f.names[i] + strlen(f.names[i]) - 2, ".p");
    CHECK(cases == 5);
    for (int i = 0; i < cases; i++) {
        char key[32];
        snprintf(key, sizeof key, "m%d.p", i);
        accel_tensor *pt = fx_get(&f, key);
        if (!pt) break;
        float p[16];
        CHECK(accel_numel(pt) <= 16 && accel_to_floats(pt, p) == ACCEL_OK);
        int nk = (int)p[0];
        int64_t a[4][2]; /* kernel, stride, padding, dilation: Conv1d's in [0] */
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < nk; j++) a[k][j] = p[1 + k * nk + j] < 0 ? ACCEL_PADDING_SAME : (int64_t)p[1 + k * nk + j];
        int64_t groups = (int64_t)p[1 + 4 * nk];
        accel_pad_mode mode = (accel_pad_mode)p[2 + 4 * nk];
        snprintf(key, sizeof key, "m%d.x", i);
        accel_tensor *x = fx_get(&f, key);
        snprintf(key, sizeof key, "m%d.w", i);
        accel_tensor *w = fx_get(&f, key);
        int64_t in = x->shape[1], out = w->shape[0];
        accel_module *c = nk == 2 ? accel_conv2d_new(in, out, a[0], a[1], a[2], a[3], groups, true, ACCEL_CPU_DEVICE,
                                                     ACCEL_F32)
                                  : accel_conv1d_new(in, out, a[0][0], a[1][0], a[2][0], a[3][0], groups, true,
                                                     ACCEL_CPU_DEVICE, ACCEL_F32);
        CHECK_MSG(c, "case %d: %s", i, accel_last_error());
        if (!c) continue;
        snprintf(key, sizeof key, "m%d.b", i);
        accel_tensor *cw = accel_module_get_tensor(c, "weight"), *cb = accel_module_get_tensor(c, "bias");
        CHECK(accel_copy_(cw, w) == ACCEL_OK && accel_copy_(cb, fx_get(&f, key)) == ACCEL_OK);
        CHECK(accel_conv_set_padding_mode(c, mode) == ACCEL_OK);
        accel_requires_grad_(x, true);
        if (x->grad) accel_zero_(x->grad);
        accel_tensor *y = accel_module_call(c, x);
        CHECK_MSG(y, "case %d: %s", i, accel_last_error());
        snprintf(key, sizeof key, "m%d.y", i);
        CHECK_FX(key, y, fx_get(&f, key), 1e-4, 1e-5);
        snprintf(key, sizeof key, "m%d.gy", i);
        CHECK(y && accel_backward_with(y, fx_get(&f, key)) == ACCEL_OK);
        static const char *const what[3] = {"dx", "dw", "db"};
        accel_tensor *got[3] = {x->grad, cw->grad, cb->grad};
        for (int k = 0; k < 3; k++) {
            snprintf(key, sizeof key, "m%d.%s", i, what[k]);
            CHECK_FX(key, got[k], fx_get(&f, key), 1e-4, 1e-4);
        }
        accel_module_free(c);
        accel_step_reset();
    }
    fx_free(&f);
    /* reflect's padding must stay below the input's size, as accel_pad's (at the forward); bad setter calls */
    accel_module *c = accel_conv2d_new(2, 2, (int64_t[]){3, 3}, NULL, (int64_t[]){3, 3}, NULL, 1, true,
                                       ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(c && accel_conv_set_padding_mode(c, ACCEL_PAD_REFLECT) == ACCEL_OK);
    CHECK(!accel_module_call(c, accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 2, 3, 8))));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_pad: reflect padding (3, 3) of dim 2 of size 3 is not below");
    CHECK(accel_conv_set_padding_mode(c, (accel_pad_mode)9) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "mode 9 is none of accel_pad_mode's");
    accel_module *relu = accel_relu_module_new();
    CHECK(accel_conv_set_padding_mode(relu, ACCEL_PAD_REFLECT) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "is not a Conv1d or Conv2d");
    CHECK(accel_conv_set_padding_mode(NULL, ACCEL_PAD_REFLECT) == ACCEL_ERR_INVALID_ARG);
    /* back to zeros: the default's output again, after the errors */
    CHECK(accel_conv_set_padding_mode(c, ACCEL_PAD_CONSTANT) == ACCEL_OK);
    accel_tensor *y = accel_module_call(c, accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 2, 3, 8)));
    CHECK_MSG(y && y->shape[2] == 7 && y->shape[3] == 12, "%s", accel_last_error());
    accel_module_free(relu);
    accel_module_free(c);
    accel_step_reset();
}

static void test_pools_flatten(void) {
    accel_module *seq = accel_sequential_new(
        3, (accel_module *[]){accel_max_pool2d_new((int64_t[]){2, 2}, NULL, NULL, NULL, false),
                              accel_adaptive_avg_pool2d_new((int64_t[]){1, 1}), accel_flatten_new(1, -1)});
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 1, 2, 4), (float[]){1, 5, 2, 0, 3, 4, 8, 1});
    accel_tensor *y = accel_module_call(seq, x);
    /* max of each 2x2: 5, 8; their mean 6.5; flattened [1, 1] */
    CHECK(y && y->ndim == 2 && y->shape[1] == 1 && accel_item(y) == 6.5);
    accel_module *avg = accel_avg_pool2d_new((int64_t[]){2, 2}, (int64_t[]){2, 2}, (int64_t[]){1, 1}, false, false);
    y = accel_module_call(avg, x);
    CHECK(y && y->shape[2] == 2 && y->shape[3] == 3 && accel_get(y, (int64_t[]){0, 0, 0, 0}) == 1.0);
    accel_module_free(seq);
    accel_module_free(avg);
    accel_step_reset();
}

/* BatchNorm2d(2, momentum=None, affine=False) as torch ran it (case b3 of
 * ops_bn.bin): three training steps, the buffers, then an eval step. */
static void test_batch_norm_module(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_bn.bin")) {
        CHECK(0);
        return;
    }
    accel_module *bn = accel_batch_norm2d_new(2, 1e-5, -1.0, false, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(bn && !accel_module_get_tensor(bn, "weight"));
    accel_state_dict *sd = accel_module_state_dict(bn);
    CHECK(sd && sd->n == 3 && !strcmp(sd->entries[0].name, "running_mean") &&
          !strcmp(sd->entries[1].name, "running_var") && !strcmp(sd->entries[2].name, "num_batches_tracked") &&
          sd->entries[2].t->dtype == ACCEL_I64 && sd->entries[2].t->ndim == 0);
    accel_state_dict_free(sd);
    /* torch's initial buffers: mean 0, var 1, no batch yet */
    CHECK(accel_item(accel_sum_all(accel_module_get_tensor(bn, "running_var"))) == 2.0);
    CHECK(accel_item(accel_sum_all(accel_module_get_tensor(bn, "running_mean"))) == 0.0);
    CHECK(accel_item(accel_module_get_tensor(bn, "num_batches_tracked")) == 0);
    accel_module_train(bn, true);
    static const char *const xs[3] = {"b3.x0", "b3.x1", "b3.x2"}, *const ys[3] = {"b3.y0", "b3.y1", "b3.y2"};
    for (int s = 0; s < 3; s++) {
        accel_tensor *y = accel_module_call(bn, fx_get(&f, xs[s]));
        CHECK_FX(ys[s], y, fx_get(&f, ys[s]), 1e-4, 1e-5);
        accel_step_reset();
    }
    accel_tensor *rm = accel_module_get_tensor(bn, "running_mean"), *rv = accel_module_get_tensor(bn, "running_var");
    CHECK_FX("running_mean", rm, fx_get(&f, "b3.rm"), 1e-5, 1e-6);
    CHECK_FX("running_var", rv, fx_get(&f, "b3.rv"), 1e-5, 1e-6);
    CHECK(accel_item(accel_module_get_tensor(bn, "num_batches_tracked")) == 3);
    /* eval: the running stats, untouched */
    accel_tensor *rm_before = accel_tensor_clone_persistent(rm, ACCEL_CPU_DEVICE);
    accel_module_train(bn, false);
    accel_tensor *y = accel_module_call(bn, fx_get(&f, "b3.xe"));
    CHECK_FX("eval y", y, fx_get(&f, "b3.ye"), 1e-4, 1e-5);
    CHECK_FX("running_mean after eval", rm, rm_before, 0, 0);
    accel_tensor_free(rm_before);
    CHECK(accel_item(accel_module_get_tensor(bn, "num_batches_tracked")) == 3);
    /* the rank BatchNorm2d asks for */
    CHECK(!accel_module_call(bn, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 2, 4))) &&
          strstr(accel_last_error(), "BatchNorm2d: expected 4D input (got 3D input)"));
    accel_module *bn1 = accel_batch_norm1d_new(3, 1e-5, 0.1, true, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(bn1 && !accel_module_get_tensor(bn1, "running_mean"));
    accel_module_train(bn1, false); /* no running stats: the batch's, in eval too */
    CHECK(accel_module_call(bn1, accel_ones(ACCEL_F32, ACCEL_SHAPE(4, 3))) != NULL);
    CHECK(!accel_module_call(bn1, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3, 4, 4))) &&
          strstr(accel_last_error(), "expected 2D or 3D input (got 4D input)"));
    accel_module_free(bn1);
    accel_module_free(bn);
    fx_free(&f);
    accel_step_reset();
}

/* A Conv2d + BatchNorm2d model saved and loaded into a fresh one: the
 * weights and the three buffers come back. */
static void test_save_load_buffers(void) {
    accel_module *m[2];
    for (int k = 0; k < 2; k++) {
        m[k] = accel_sequential_new(
            2, (accel_module *[]){accel_conv2d_new(3, 4, (int64_t[]){3, 3}, NULL, (int64_t[]){1, 1}, NULL, 1, false,
                                                   ACCEL_CPU_DEVICE, ACCEL_F32),
                                  accel_batch_norm2d_new(4, 1e-5, 0.1, true, true, ACCEL_CPU_DEVICE, ACCEL_F32)});
        CHECK(m[k]);
    }
    accel_module_train(m[0], true);
    accel_rng r;
    accel_rng_init(&r, 5);
    for (int s = 0; s < 2; s++) {
        accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(2, 3, 5, 5));
        accel_rng_normal_(&r, x, 1.0, 2.0);
        CHECK(accel_module_call(m[0], x));
        accel_step_reset();
    }
    char dir[] = "/tmp/accel_nn_conv_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK(accel_save_module(dir, m[0], 0) == ACCEL_OK);
    accel_checkpoint *ck = accel_checkpoint_open(dir);
    CHECK(ck != NULL);
    accel_state_dict *a = accel_module_state_dict(m[0]), *b = accel_module_state_dict(m[1]);
    CHECK(a && b && a->n == 6 && b->n == 6 && !strcmp(a->entries[5].name, "1.num_batches_tracked"));
    for (int i = 0; ck && a && b && i < a->n; i++) {
        CHECK(!strcmp(a->entries[i].name, b->entries[i].name));
        CHECK_MSG(accel_checkpoint_load_into(ck, b->entries[i].name, b->entries[i].t) == ACCEL_OK, "%s: %s",
                  b->entries[i].name, accel_last_error());
        CHECK_FX(a->entries[i].name, b->entries[i].t, a->entries[i].t, 0, 0);
    }
    CHECK(accel_item(accel_module_get_tensor(m[1], "1.num_batches_tracked")) == 2);
    accel_state_dict_free(a);
    accel_state_dict_free(b);
    accel_checkpoint_close(ck);
    rm_rf(dir);
    accel_module_free(m[0]);
    accel_module_free(m[1]);
    accel_step_reset();
}

int main(void) {
    RUN(test_conv_init_and_names);
    RUN(test_padding_modes_vs_torch);
    RUN(test_pools_flatten);
    RUN(test_batch_norm_module);
    RUN(test_save_load_buffers);
    accel_thread_cleanup();
    return check_summary();
}
