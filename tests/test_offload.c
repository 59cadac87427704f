/* Offload hooks on a generic module tree (accelerate/hooks.py, accelerate/utils/offload.py):
 * Sequential(Linear(4, 8), ReLU, Linear(8, 3)) saved, then loaded into a meta
 * skeleton with cpu / disk / cpu-offload maps. Outputs equal the original;
 * offloaded weights are on meta outside forwards and come in one module at a
 * time; a bf16 file under f32 params is converted into scratch per forward. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/autograd.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "check.h"

static accel_module *toy(void) {
    accel_module *layers[3] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                               accel_linear_new(8, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, layers);
}

static accel_module *skeleton(void) {
    accel_init_empty_weights_begin();
    accel_module *m = toy();
    accel_init_empty_weights_end();
    return m;
}

static const float X[2 * 4] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f, 0.0f, -2.0f};

static void forward(accel_module *m, float out[6]) {
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(2, 4), X);
    accel_tensor *y = accel_module_call(m, x);
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    if (y) accel_to_floats(y, out);
    accel_step_reset();
}

static char g_dir[64];

static void run(const char *spec, bool offload_cpu, const float want[6], double tol, accel_dispatch_stats *s) {
    accel_module *m = skeleton();
    accel_device_map *map = accel_device_map_parse(spec);
    accel_load_opts lo = {.offload_cpu = offload_cpu};
    accel_dispatched *d = accel_load_checkpoint_and_dispatch(m, g_dir, map, NULL, NULL, &lo);
    CHECK_MSG(d != NULL, "%s: %s", spec, accel_last_error());
    float got[6] = {0};
    if (d) forward(m, got);
    for (int i = 0; i < 6; i++) CHECK_CLOSE(got[i], want[i], 0, tol);
    accel_dispatched_stats(d, s);
    /* offloaded weights are back on meta after the forward */
    accel_tensor *w2 = accel_module_get_tensor(m, "2.weight");
    if (strstr(spec, "2:disk") || strstr(spec, ":disk") == spec || offload_cpu)
        CHECK(w2 && w2->device.type == ACCEL_DEV_META && w2->data == NULL);
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_device_map_free(map);
}

static void test_offload_maps(void) {
    accel_manual_seed(3);
    accel_module *orig = toy();
    float want[6];
    forward(orig, want);
    CHECK(accel_save_module(g_dir, orig, 1 << 30) == ACCEL_OK);
    accel_module_free(orig);
    accel_dispatch_stats s;
    run("0:cpu,2:cpu", false, want, 0, &s);
    CHECK(s.n_loaded == 4 && s.n_offloaded_disk == 0 && s.n_offloaded_cpu == 0);
    run("0:cpu,2:disk", false, want, 0, &s);
    CHECK(s.n_loaded == 2 && s.n_offloaded_disk == 2 && s.bytes_disk == (8 * 3 + 3) * 4);
    run(":disk", false, want, 0, &s);
    /* one Linear at a time: the bigger one, 0 (4*8 + 8 floats) */
    CHECK(s.n_offloaded_disk == 4 && s.peak_onload_bytes == (4 * 8 + 8) * 4 && s.scratch_bytes == 0);
    run("0:cpu,2:cpu", true, want, 0, &s); /* cpu offload: host copies brought in per forward */
    CHECK(s.n_offloaded_cpu == 4 && s.bytes_host_copies == (4 * 8 + 8 + 8 * 3 + 3) * 4 &&
          s.peak_onload_bytes == (4 * 8 + 8) * 4);
    /* a preload class brings its whole block in at once */
    accel_module *m = skeleton();
    accel_device_map *map = accel_device_map_parse(":disk");
    const char *const pre[] = {"Sequential"};
    accel_load_opts lo = {.preload_classes = pre, .n_preload = 1};
    accel_dispatched *d = accel_load_checkpoint_and_dispatch(m, g_dir, map, NULL, NULL, &lo);
    float got[6];
    forward(m, got);
    accel_dispatched_stats(d, &s);
    CHECK(s.peak_onload_bytes == (4 * 8 + 8 + 8 * 3 + 3) * 4);
    for (int i = 0; i < 6; i++) CHECK_CLOSE(got[i], want[i], 0, 0);
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_device_map_free(map);
}

/* bf16 file, f32 params: converted into scratch on every forward */
static void test_disk_dtype_conversion(void) {
    accel_manual_seed(4);
    accel_module *orig = toy();
    accel_state_dict *sd = accel_module_state_dict(orig);
    const char *names[4];
    accel_tensor *bf[4];
    for (int i = 0; i < 4; i++) {
        names[i] = sd->entries[i].name;
        bf[i] = accel_tensor_new(ACCEL_BF16, sd->entries[i].t->ndim, sd->entries[i].t->shape, ACCEL_CPU_DEVICE);
        accel_copy_(bf[i], sd->entries[i].t);
        accel_copy_(sd->entries[i].t, bf[i]); /* the reference uses the bf16-rounded weights */
    }
    float want[6];
    forward(orig, want);
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    CHECK(accel_safetensors_save(path, 4, names, bf, 0, NULL) == ACCEL_OK);
    for (int i = 0; i < 4; i++) accel_tensor_free(bf[i]);
    accel_state_dict_free(sd);
    accel_module_free(orig);
    accel_dispatch_stats s;
    run(":disk", false, want, 1e-6, &s);
    CHECK(s.scratch_bytes > 0 && s.bytes_disk == (4 * 8 + 8 + 8 * 3 + 3) * 2);
    run("0:cpu,2:cpu", false, want, 1e-6, &s); /* converted at load */
    CHECK(s.bytes_resident == (4 * 8 + 8 + 8 * 3 + 3) * 4);
}

/* Whether a node of the graph that made t still holds a tensor on meta (an
 * offloaded weight the tape should have forgotten). */
static bool graph_holds_meta(const accel_tensor *t, int depth) {
    const accel_node *n = t ? t->grad_fn : NULL;
    if (!n || depth > 16) return false;
    for (int k = 0; k < 4; k++)
        if (n->saved[k] && n->saved[k]->device.type == ACCEL_DEV_META) return true;
    for (int k = 0; k < n->n_inputs; k++)
        if (n->inputs[k] && (n->inputs[k]->device.type == ACCEL_DEV_META || graph_holds_meta(n->inputs[k], depth + 1)))
            return true;
    return false;
}

/* Backward through offloaded weights is refused naming one (they went back
 * to meta after their forward), the tape holding none of them: per module (":disk", each Linear's hook
 * drops its two), per preload block (the Sequential's hook drops all four
 * at once, in one pass over the tape), and beside a resident layer. */
static void test_backward_refused(void) {
    accel_manual_seed(5);
    accel_module *orig = toy();
    CHECK(accel_save_module(g_dir, orig, 1 << 30) == ACCEL_OK);
    accel_module_free(orig);
    const char *const pre[] = {"Sequential"};
    struct { const char *spec; int n_preload; } cases[] = {{":disk", 0}, {":disk", 1}, {"0:cpu,2:disk", 0}};
    bool prev = accel_set_grad_enabled(true);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        accel_module *m = skeleton();
        accel_device_map *map = accel_device_map_parse(cases[k].spec);
        accel_load_opts lo = {.preload_classes = pre, .n_preload = cases[k].n_preload};
        accel_dispatched *d = accel_load_checkpoint_and_dispatch(m, g_dir, map, NULL, NULL, &lo);
        CHECK_MSG(d != NULL, "%s: %s", cases[k].spec, accel_last_error());
        accel_tensor *y = d ? accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 4), X)) : NULL;
        CHECK_MSG(y != NULL, "%s: %s", cases[k].spec, accel_last_error());
        CHECK_MSG(!graph_holds_meta(y, 0), "%s (preload %d): the tape reads an offloaded weight", cases[k].spec,
                  cases[k].n_preload);
        CHECK(y && accel_backward(accel_sum(y, 0, NULL, false)) == ACCEL_ERR_STATE);
        CHECK_STR_CONTAINS(accel_last_error(), "'linear' of this graph reads \"weight\", whose data went to meta "
                                               "after its forward");
        accel_clear_error();
        accel_tensor *w0 = accel_module_get_tensor(m, "0.weight");
        CHECK(w0 && (w0->device.type == ACCEL_DEV_META) == (cases[k].spec[0] == ':'));
        accel_step_reset();
        accel_dispatched_free(d);
        accel_module_free(m);
        accel_device_map_free(map);
    }
    accel_set_grad_enabled(prev);
}

int main(void) {
    accel_set_grad_enabled(false); /* inference only */
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_offload_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN(test_offload_maps);
    RUN(test_disk_dtype_conversion);
    RUN(test_backward_refused);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    accel_thread_cleanup();
    return check_summary();
}
