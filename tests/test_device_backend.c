/* The device backend interface: the registry and device names, tensor
 * storage from the device's backend, host access through copies, copies
 * between devices, the hostless test backend (whose pointers fault on the
 * host) and the error of a kernel a backend lacks. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "backends/registry.h"
#include "check.h"

static const accel_device H0 = {ACCEL_DEV_HOSTLESS, 0}, H1 = {ACCEL_DEV_HOSTLESS, 1};

static void test_registry_and_names(void) {
    accel_device d;
    CHECK(accel_device_parse("hostless:1", &d) == ACCEL_OK && accel_device_eq(d, H1));
    CHECK(accel_device_available(H1));
    CHECK(!accel_device_available((accel_device){ACCEL_DEV_HOSTLESS, 2}));
    CHECK(accel_device_count(ACCEL_DEV_HOSTLESS) == 2 && accel_device_count(ACCEL_DEV_CPU) == 1);
    char b[32];
    CHECK(strcmp(accel_device_str(H1, b, sizeof b), "hostless:1") == 0);
    CHECK(!accel_device_eq(H0, H1));
    CHECK(accel__hostless_register(3) == ACCEL_ERR_STATE); /* two were registered */
    accel_clear_error();
    size_t fr = 0, tot = 0;
    CHECK(accel_device_mem_info(ACCEL_CPU_DEVICE, &fr, &tot) == ACCEL_OK && tot > 0 && fr <= tot);
    CHECK(accel_device_mem_info(ACCEL_META_DEVICE, &fr, &tot) == ACCEL_ERR_DEVICE);
    accel_clear_error();
    CHECK(accel_device_synchronize(H0) == ACCEL_OK);
}

/* A hostless pointer is not a host address: reading it kills the reader. */
static void test_pointers_fault_on_the_host(void) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), H0);
    CHECK(t && ((uintptr_t)t->data >> 48) == 0xA0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* no sanitizer report: die of the fault itself */
        signal(SIGBUS, SIG_DFL);
        volatile float v = *(volatile float *)t->data;
        (void)v;
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS));
    accel_tensor_free(t);
}

static void test_host_access(void) {
    accel_tensor *t = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(2, 3), H0);
    CHECK(accel_get(t, (int64_t[]){1, 2}) == 0.0); /* zero-filled */
    accel_set(t, (int64_t[]){1, 2}, 2.5);
    CHECK(accel_get(t, (int64_t[]){1, 2}) == 2.5);
    CHECK(accel_fill_(t, 1.5) == ACCEL_OK);
    float f[6];
    CHECK(accel_to_floats(t, f) == ACCEL_OK && f[0] == 1.5f && f[5] == 1.5f);
    CHECK(accel_zero_(t) == ACCEL_OK && accel_to_floats(t, f) == ACCEL_OK && f[3] == 0.0f);
    /* a transposed view: element reads and bulk reads follow its strides */
    accel_tensor *src = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2, 3), H0);
    CHECK(accel_tensor_from_host(src, (float[]){0, 1, 2, 3, 4, 5}) == ACCEL_OK);
    accel_tensor *v = accel_view_raw(src, 2, (int64_t[]){3, 2}, (int64_t[]){1, 3}, 0);
    CHECK(accel_get(v, (int64_t[]){2, 1}) == 5.0);
    int64_t ids[6];
    CHECK(accel_to_int64s(v, ids) == ACCEL_OK && ids[1] == 3 && ids[2] == 1 && ids[5] == 5);
    accel_tensor *one = accel_view_raw(src, 0, NULL, NULL, 4);
    CHECK(accel_item(one) == 4.0);
    const char *s = accel_tensor_str(src);
    CHECK_STR_CONTAINS(s, "device='hostless:0'");
    CHECK_STR_CONTAINS(s, "5.0000");
    accel_tensor_free(t);
    accel_tensor_free(src);
    accel_step_reset();
}

static void test_copies_between_devices(void) {
    float x[6] = {1, -2, 3, -4, 5, -6}, y[6];
    accel_tensor *c = accel_from_floats(ACCEL_SHAPE(2, 3), x);
    accel_tensor *a = accel_to_device(c, H0);
    CHECK(a && accel_device_eq(a->device, H0));
    accel_tensor *b = accel_to_device(a, H1); /* device to device */
    accel_tensor *bt = accel_view_raw(b, 2, (int64_t[]){3, 2}, (int64_t[]){1, 3}, 0);
    accel_tensor *h = accel_empty_on(ACCEL_F16, 2, (int64_t[]){3, 2}, H0);
    CHECK(accel_copy_(h, bt) == ACCEL_OK); /* strided, converted, across devices */
    CHECK(accel_to_floats(h, y) == ACCEL_OK && y[0] == 1 && y[1] == -4 && y[4] == 3 && y[5] == -6);
    accel_tensor *back = accel_to_device(b, ACCEL_CPU_DEVICE);
    CHECK(back && accel_to_floats(back, y) == ACCEL_OK && memcmp(x, y, sizeof x) == 0);
    /* persistent clones and meta */
    accel_tensor *p = accel_tensor_clone_persistent(b, H0);
    CHECK(p && accel_get(p, (int64_t[]){1, 0}) == -4.0);
    CHECK(accel_to_device(accel_to_device(a, ACCEL_META_DEVICE), H0) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "meta");
    accel_clear_error();
    accel_tensor_free(p);
    accel_step_reset();
}

/* Gradients flow back through to_device to the source device. */
static void test_to_device_backward(void) {
    accel_tensor *w = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(3), ACCEL_CPU_DEVICE);
    accel_fill_(w, 2.0);
    w->requires_grad = true;
    accel_tensor *on = accel_to_device(w, H1);
    accel_tensor *back = accel_to_device(on, ACCEL_CPU_DEVICE);
    CHECK(accel_backward(accel_sum(back, 0, NULL, false)) == ACCEL_OK);
    CHECK(w->grad && accel_device_eq(w->grad->device, ACCEL_CPU_DEVICE));
    CHECK(accel_get(w->grad, (int64_t[]){2}) == 1.0);
    accel_tensor_free(w);
    accel_step_reset();
}

static void test_rng_same_on_every_device(void) {
    accel_rng r1, r2;
    accel_rng_init(&r1, 7);
    accel_rng_init(&r2, 7);
    accel_tensor *c = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(100), ACCEL_CPU_DEVICE);
    accel_tensor *d = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(100), H0);
    CHECK(accel_rng_normal_(&r1, c, 0, 1) == ACCEL_OK && accel_rng_normal_(&r2, d, 0, 1) == ACCEL_OK);
    CHECK(r1.offset == r2.offset && r1.offset == 100);
    float a[100], b[100];
    CHECK(accel_to_floats(c, a) == ACCEL_OK && accel_to_floats(d, b) == ACCEL_OK);
    CHECK(memcmp(a, b, sizeof a) == 0);
    accel_tensor_free(c);
    accel_tensor_free(d);
}

static void test_default_device(void) {
    accel_device prev = accel_set_default_device(H1);
    CHECK(accel_device_eq(prev, ACCEL_CPU_DEVICE));
    accel_tensor *z = accel_arange(ACCEL_I64, 3, 7);
    CHECK(z && accel_device_eq(z->device, H1) && accel_get(z, (int64_t[]){3}) == 6.0);
    accel_tensor *o = accel_ones(ACCEL_F32, ACCEL_SHAPE(2));
    float f[2];
    CHECK(o && accel_device_eq(o->device, H1) && accel_to_floats(o, f) == ACCEL_OK && f[1] == 1.0f);
    accel_set_default_device((accel_device){ACCEL_DEV_HOSTLESS, 5});
    CHECK(accel_last_status() == ACCEL_ERR_DEVICE && accel_device_eq(accel_default_device(), H1));
    accel_clear_error();
    accel_set_default_device(ACCEL_CPU_DEVICE);
    accel_step_reset();
}

/* Tensors of two devices in one op: an error naming both. */
static void test_mixed_devices_error(void) {
    accel_tensor *a = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2));
    accel_tensor *b = accel_to_device(a, H0);
    CHECK(accel_add(a, b) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "cpu");
    CHECK_STR_CONTAINS(accel_last_error(), "hostless:0");
    accel_clear_error();
    accel_step_reset();
}

/* A backend without a kernel: the op fails naming the kernel and the device. */
static int one(void) { return 1; }
static void test_missing_kernel(void) {
    accel_backend npu = accel__cpu_backend; /* cpu memory, no kernels */
    npu.name = "npu";
    npu.type = ACCEL_DEV_NPU;
    npu.device_count = one;
    memset(&npu.kernels, 0, sizeof npu.kernels);
    static accel_backend registered;
    registered = npu;
    CHECK(accel__backend_register(&registered) == ACCEL_OK);
    accel_device d;
    CHECK(accel_device_parse("npu:0", &d) == ACCEL_OK && accel_device_available(d));
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(3), d);
    CHECK(t && accel_fill_(t, 1.0) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_fill_: kernel fill is not implemented on npu:0");
    accel_clear_error();
    accel_tensor_free(t);
}

/* AdamW steps, gradient clipping and state save/restore on a device give
 * what they give on the cpu. */
static accel_tensor *param_with_grad(accel_device d, const float *v, const float *g) {
    accel_tensor *p = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), d);
    p->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), d);
    accel_tensor_from_host(p, v);
    accel_tensor_from_host(p->grad, g);
    accel_requires_grad_(p, true);
    return p;
}

static void test_optimizer_on_device(void) {
    const float v[4] = {1, -2, 3, 0.5f}, g[4] = {0.3f, -0.1f, 2.0f, 0.0f};
    accel_tensor *pc = param_with_grad(ACCEL_CPU_DEVICE, v, g), *ph = param_with_grad(H1, v, g);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.1);
    accel_optimizer *oc = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &pc, &h);
    accel_optimizer *oh = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &ph, &h);
    CHECK(oc && oh);
    for (int s = 0; s < 3; s++) {
        CHECK(accel_optimizer_clip_grad_norm(oc, 1.0, 2.0) == accel_optimizer_clip_grad_norm(oh, 1.0, 2.0));
        CHECK(accel_optimizer_step(oc) == ACCEL_OK && accel_optimizer_step(oh) == ACCEL_OK);
    }
    float a[4], b[4];
    CHECK(accel_to_floats(pc, a) == ACCEL_OK && accel_to_floats(ph, b) == ACCEL_OK && memcmp(a, b, sizeof a) == 0);
    CHECK(accel_clip_grad_norm(1, &ph, 1e9, INFINITY) == accel_clip_grad_norm(1, &pc, 1e9, INFINITY));
    /* The cpu optimizer's state restores the device one (state lives on the device). */
    accel_named_state *st;
    int n = accel_optimizer_state(oc, &st);
    accel_optimizer *o2 = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &ph, &h);
    CHECK(n > 0 && accel_optimizer_load_state(o2, n, st) == ACCEL_OK);
    accel_named_state_free(st, n);
    n = accel_optimizer_state(o2, &st);
    CHECK(n > 2 && st[2].t && accel_device_eq(st[2].t->device, H1));
    accel_named_state_free(st, n);
    accel_optimizer_zero_grad(oh);
    CHECK(accel_to_floats(ph->grad, b) == ACCEL_OK && b[2] == 0.0f);
    accel_optimizer_free(oc);
    accel_optimizer_free(oh);
    accel_optimizer_free(o2);
    accel_tensor_free(pc);
    accel_tensor_free(ph);
    accel_step_reset();
}

int main(void) {
    CHECK(accel__hostless_register(2) == ACCEL_OK);
    RUN(test_registry_and_names);
    RUN(test_pointers_fault_on_the_host);
    RUN(test_host_access);
    RUN(test_copies_between_devices);
    RUN(test_to_device_backward);
    RUN(test_rng_same_on_every_device);
    RUN(test_default_device);
    RUN(test_mixed_devices_error);
    RUN(test_optimizer_on_device);
    RUN(test_missing_kernel);
    return check_summary();
}
