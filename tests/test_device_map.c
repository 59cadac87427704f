/* Golden tests for sizes and device maps: every concrete value of
 * accelerate/utils/modeling.py (sizes, infer_auto_device_map, get_balanced_memory,
 * check_device_map, tied parameters), cross-checked against
 * accelerate itself (tests/test_modeling_utils.py cases). Models are built on
 * the meta device: no weight memory. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/bigmodel.h"
#include "accel/io.h"
#include "check.h"

/* ---- ModelForTest = Linear(3,4), BatchNorm1d(4), Linear(4,5) */

static const accel_module_ops BN_OPS = {"BatchNorm1d", NULL, NULL};
static const accel_module_ops MFT_OPS = {"ModelForTest", NULL, NULL};
static const accel_module_ops SEQ_OPS = {"Sequential", NULL, NULL};

static accel_tensor *meta(accel_dtype dt, int ndim, const int64_t *shape) {
    return accel_tensor_new(dt, ndim, shape, ACCEL_META_DEVICE);
}

static accel_module *batchnorm(int64_t n) {
    accel_module *m = accel_module_new(&BN_OPS, NULL);
    accel_module_add_param(m, "weight", meta(ACCEL_F32, ACCEL_SHAPE(n)));
    accel_module_add_param(m, "bias", meta(ACCEL_F32, ACCEL_SHAPE(n)));
    accel_module_add_buffer(m, "running_mean", meta(ACCEL_F32, ACCEL_SHAPE(n)));
    accel_module_add_buffer(m, "running_var", meta(ACCEL_F32, ACCEL_SHAPE(n)));
    accel_module_add_buffer(m, "num_batches_tracked", meta(ACCEL_I64, 0, NULL));
    return m;
}

static accel_module *linear(int64_t in, int64_t out) {
    return accel_linear_new(in, out, true, ACCEL_META_DEVICE, ACCEL_F32);
}

static accel_module *model_for_test(void) {
    accel_module *m = accel_module_new(&MFT_OPS, NULL);
    accel_module_add_child(m, "linear1", linear(3, 4));
    accel_module_add_child(m, "batchnorm", batchnorm(4));
    accel_module_add_child(m, "linear2", linear(4, 5));
    return m;
}

static accel_module *seq3(const char *n0, const char *n1, const char *n2) {
    accel_module *m = accel_module_new(&SEQ_OPS, NULL);
    accel_module_add_child(m, n0, model_for_test());
    accel_module_add_child(m, n1, model_for_test());
    accel_module_add_child(m, n2, model_for_test());
    return m;
}

static void mm_set(accel_max_memory *mm, const char *spec) {
    /* "0=200,1=200,cpu=1GB" */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        *eq = 0;
        CHECK(accel_max_memory_set(mm, t, eq + 1) == ACCEL_OK);
    }
}

/* The map as a string, compared exactly (order included). */
static void check_map(accel_module *model, const char *mem, const accel_device_map_opts *o,
                      const char *expect) {
    accel_max_memory mm = {0};
    mm_set(&mm, mem);
    accel_device_map *map = accel_infer_auto_device_map(model, &mm, o);
    char buf[1024];
    CHECK_MSG(map != NULL, "%s", accel_last_error());
    const char *got = accel_device_map_str(map, buf, sizeof buf);
    CHECK_MSG(strcmp(got, expect) == 0, "max_memory %s: got %s, expected %s", mem, got, expect);
    if (map) CHECK(accel_check_device_map(model, map, o) == ACCEL_OK);
    accel_device_map_free(map);
}

static void test_module_sizes(void) {
    accel_module *m = model_for_test();
    accel_module_sizes *s = accel_compute_module_sizes(m, NULL, false);
    static const struct { const char *n; int64_t v; } E[] = {
        {"", 236},
        {"linear1", 64},
        {"linear1.weight", 48},
        {"linear1.bias", 16},
        {"batchnorm", 72},
        {"batchnorm.weight", 16},
        {"batchnorm.bias", 16},
        {"batchnorm.running_mean", 16},
        {"batchnorm.running_var", 16},
        {"batchnorm.num_batches_tracked", 8},
        {"linear2", 100},
        {"linear2.weight", 80},
        {"linear2.bias", 20}};
    CHECK(s && s->n == 13);
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++)
        CHECK_MSG(accel_module_sizes_get(s, E[i].n) == E[i].v, "%s", E[i].n);
    CHECK(accel_module_sizes_get(s, "nope") == 0);
    /* insertion order: parameters, then buffers (Accelerate's named_module_tensors) */
    CHECK(strcmp(s->names[0], "") == 0 && strcmp(s->names[1], "linear1") == 0);
    CHECK(strcmp(s->names[s->n - 1], "batchnorm.num_batches_tracked") == 0);
    accel_module_sizes_free(s);
    /* .half(): every float halves, num_batches_tracked keeps 8 */
    accel_device_map_opts o = {.has_dtype = true, .dtype = ACCEL_F16};
    s = accel_compute_module_sizes(m, &o, false);
    CHECK(accel_module_sizes_get(s, "") == 122);
    CHECK(accel_module_sizes_get(s, "batchnorm") == 40);
    CHECK(accel_module_sizes_get(s, "linear2") == 50);
    CHECK(accel_module_sizes_get(s, "batchnorm.num_batches_tracked") == 8);
    accel_module_sizes_free(s);
    /* min(target, own): asking for f64 does not grow f32 tensors */
    o.dtype = ACCEL_F64;
    s = accel_compute_module_sizes(m, &o, false);
    CHECK(accel_module_sizes_get(s, "") == 236);
    accel_module_sizes_free(s);
    /* special dtypes override per name */
    accel_name_dtype sp[] = {{"linear2.weight", ACCEL_F64}};
    accel_device_map_opts o2 = {.has_dtype = true, .dtype = ACCEL_F16, .special_dtypes = sp, .n_special = 1};
    s = accel_compute_module_sizes(m, &o2, false);
    CHECK(accel_module_sizes_get(s, "linear2.weight") == 160);
    CHECK(accel_module_sizes_get(s, "") == 122 - 40 + 160);
    accel_module_sizes_free(s);
    /* buffers only */
    CHECK(accel_module_total_buffer_size(m, NULL) == 40);
    CHECK(accel_module_total_buffer_size(m, &o2) == 24);
    int64_t total, largest;
    CHECK(accel_calculate_maximum_sizes(m, NULL, 0, &total, &largest) == ACCEL_OK);
    CHECK(total == 236 && largest == 100);
    accel_module_free(m);
}

/* Two meta tensors of 2^62 bytes: the sum is an error, not a negative size. */
static void test_module_sizes_overflow(void) {
    static const accel_module_ops OPS = {"Huge", NULL, NULL};
    accel_module *m = accel_module_new(&OPS, NULL);
    int64_t shape[2] = {(int64_t)1 << 29, (int64_t)1 << 30};
    CHECK(accel_module_add_param(m, "a", accel_tensor_new(ACCEL_F64, 2, shape, ACCEL_META_DEVICE)));
    CHECK(accel_module_add_param(m, "b", accel_tensor_new(ACCEL_F64, 2, shape, ACCEL_META_DEVICE)));
    accel_clear_error();
    CHECK(accel_compute_module_sizes(m, NULL, false) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "the model's tensors take more than 2^63 bytes");
    accel_clear_error();
    int64_t total, largest;
    CHECK(accel_calculate_maximum_sizes(m, NULL, 0, &total, &largest) == ACCEL_ERR_SHAPE);
    accel_clear_error();
    accel_module_free(m);
}

static void test_max_layer_size(void) {
    accel_module *m = seq3("0", "1", "2");
    accel_module_sizes *s = accel_compute_module_sizes(m, NULL, false);
    char **names = NULL;
    int n = 0;
    CHECK(accel_get_max_layer_size(m, s, NULL, 0, &names, &n) == 100);
    CHECK(n == 3 && strcmp(names[0], "0.linear2") == 0 && strcmp(names[2], "2.linear2") == 0);
    accel_free_names(names, n);
    const char *ns[] = {"ModelForTest"};
    CHECK(accel_get_max_layer_size(m, s, ns, 1, &names, &n) == 236);
    CHECK(n == 3 && strcmp(names[1], "1") == 0);
    accel_free_names(names, n);
    accel_module_sizes_free(s);
    accel_module_free(m);
}

static accel_module *linears(int n) {
    accel_module *m = accel_module_new(&SEQ_OPS, NULL);
    for (int i = 1; i <= n; i++) {
        char name[32];
        snprintf(name, sizeof name, "linear%d", i);
        accel_module_add_child(m, name, linear(4, 4));
    }
    return m;
}

static void test_tied_parameters(void) {
    accel_module *m = linears(2);
    accel_tied_params *tp = accel_find_tied_parameters(m);
    CHECK(tp && tp->n_groups == 0);
    accel_tied_params_free(tp);
    CHECK(accel_module_tie(m, "linear2.weight", "linear1.weight") == ACCEL_OK);
    tp = accel_find_tied_parameters(m);
    CHECK(tp && tp->n_groups == 1 && tp->group_size[0] == 2);
    CHECK(strcmp(tp->groups[0][0], "linear1.weight") == 0 && strcmp(tp->groups[0][1], "linear2.weight") == 0);
    accel_tied_params_free(tp);
    accel_module_free(m);

    m = linears(4);
    accel_module_tie(m, "linear2.weight", "linear1.weight");
    accel_module_tie(m, "linear4.weight", "linear1.weight");
    tp = accel_find_tied_parameters(m);
    CHECK(tp && tp->n_groups == 1 && tp->group_size[0] == 3);
    CHECK(strcmp(tp->groups[0][2], "linear4.weight") == 0);
    accel_tied_params_free(tp);
    accel_module_free(m);

    /* Sequential(layer, layer): every parameter tied */
    m = accel_module_new(&SEQ_OPS, NULL);
    accel_module_add_child(m, "0", linear(4, 4));
    accel_module_add_child(m, "1", linear(4, 4));
    accel_module_tie(m, "1.weight", "0.weight");
    accel_module_tie(m, "1.bias", "0.bias");
    tp = accel_find_tied_parameters(m);
    CHECK(tp && tp->n_groups == 2);
    CHECK(strcmp(tp->groups[0][0], "0.bias") == 0 && strcmp(tp->groups[0][1], "1.bias") == 0);
    CHECK(strcmp(tp->groups[1][0], "0.weight") == 0 && strcmp(tp->groups[1][1], "1.weight") == 0);
    accel_tied_params_free(tp);
    accel_module_free(m);
}

static void test_clean_device_map(void) {
    static const char *cases[][2] = {
        {"a:0,b:0,c:0", "{\"\": 0}"},
        {"a.x:0,a.y:0,b.x:1,b.y:1,c:1", "{\"c\": 1, \"a\": 0, \"b\": 1}"},
        {"a.x:0,a.y:0,b.x.0:1,b.x.1:1,b.y.0:2,b.y.1:2,c:2", "{\"c\": 2, \"a\": 0, \"b.x\": 1, \"b.y\": 2}"},
        {"a:cpu,b:disk", "{\"a\": \"cpu\", \"b\": \"disk\"}"},
        /* a name with an empty first part (set by a program; a file's is refused):
         * its child under the root was "" again, and the recursion never ended */
        {".x:0,b:1", "{\".x\": 0, \"b\": 1}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        accel_device_map *m = accel_device_map_parse(cases[i][0]);
        accel_clean_device_map(m);
        char buf[256];
        accel_device_map_str(m, buf, sizeof buf);
        CHECK_MSG(strcmp(buf, cases[i][1]) == 0, "%s -> %s", cases[i][0], buf);
        accel_device_map_free(m);
    }
}

static void test_device_map_basics(void) {
    accel_device_map *m = accel_device_map_parse("model:0,model.layers.1:cpu,lm_head:disk,model.norm:cuda:1");
    CHECK(m && m->n == 4);
    CHECK(strcmp(accel_device_map_lookup(m, "model.layers.1.mlp.weight"), "cpu") == 0);
    CHECK(strcmp(accel_device_map_lookup(m, "model.layers.10.mlp.weight"), "0") == 0); /* h.1 != h.10 */
    CHECK(strcmp(accel_device_map_lookup(m, "lm_head.weight"), "disk") == 0);
    CHECK(strcmp(accel_device_map_get(m, "model.norm"), "cuda:1") == 0);
    CHECK(accel_device_map_lookup(m, "other.weight") == NULL);
    accel_device_map_set(m, "", "cpu");
    CHECK(strcmp(accel_device_map_lookup(m, "other.weight"), "cpu") == 0);
    accel_device_map_free(m);
    /* any "type:N" value keeps its colon; the key never has one */
    m = accel_device_map_parse("a:hostless:0,b:npu:12,:7");
    const char *a = m ? accel_device_map_get(m, "a") : NULL, *b = m ? accel_device_map_get(m, "b") : NULL;
    const char *all = m ? accel_device_map_get(m, "") : NULL;
    CHECK(a && strcmp(a, "hostless:0") == 0);
    CHECK(b && strcmp(b, "npu:12") == 0);
    CHECK(all && strcmp(all, "7") == 0);
    accel_device_map_remove(m, NULL); /* names no entry (it segfaulted); NULL map: a no-op */
    accel_device_map_remove(NULL, "a");
    CHECK(m && m->n == 3);
    accel_device d;
    CHECK(accel_device_map_device("1", &d) == ACCEL_OK && d.type == ACCEL_DEV_CUDA && d.index == 1);
    CHECK(accel_device_map_device("cpu", &d) == ACCEL_OK && d.type == ACCEL_DEV_CPU);
    CHECK(accel_device_map_device("disk", &d) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    accel_device_map_free(m);

    accel_max_memory in = {0}, out;
    mm_set(&in, "cpu=1GB,disk=1,10=5,2=2GiB");
    CHECK(accel_get_max_memory(&in, &out) == ACCEL_OK);
    CHECK(out.n == 4 && strcmp(out.e[0].device, "2") == 0 && strcmp(out.e[1].device, "10") == 0);
    CHECK(strcmp(out.e[2].device, "cpu") == 0 && out.e[2].bytes == 1000000000 && out.e[0].bytes == 2147483648);
    accel_max_memory bad = {.n = 1, .e = {{"npu", 5}}}; /* filled by hand: accel_max_memory_set refuses it */
    CHECK(accel_get_max_memory(&bad, &out) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "Device npu is not recognized");
    accel_clear_error();
    CHECK(accel_get_max_memory(NULL, &out) == ACCEL_OK && out.n == 1 && out.e[0].bytes > 0);
}

/* A value is checked from its spelling when it is set (it was kept, and the
 * load that read the map refused it long after); whether a backend serves a
 * known type, and the machine has that device, is checked at load. */
static void test_device_map_set_checks_values(void) {
    static const char *const bad[] = {"gpu:9",   "garbage", "cuda:",   "cuda:x", "cuda:-1", "cuda:+1",
                                      "cuda: 1", "cuda:1024", "99999", "cpu:0",  "mps",     "disk:0"};
    accel_device_map *m = accel_device_map_new();
    CHECK(accel_device_map_set(m, "a", "cpu") == ACCEL_OK);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        accel_clear_error();
        CHECK_MSG(accel_device_map_set(m, "a", bad[i]) == ACCEL_ERR_INVALID_ARG, "'%s' was accepted", bad[i]);
        CHECK_STR_CONTAINS(accel_last_error(), "is not a device map value");
        CHECK_STR_CONTAINS(accel_last_error(), bad[i]);
        CHECK_MSG(accel_device_map_set(m, "b", bad[i]) != ACCEL_OK, "'%s' was appended", bad[i]);
    }
    /* a refused value changes nothing: "a" keeps its device, "b" was not added */
    CHECK(m->n == 1 && strcmp(accel_device_map_get(m, "a"), "cpu") == 0);
    accel_clear_error();
    static const char *const good[] = {"0", "1023", "cpu", "disk", "meta", "cuda", "cuda:99", "npu:12", "hostless:0"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CHECK_MSG(accel_device_map_set(m, "a", good[i]) == ACCEL_OK, "'%s': %s", good[i], accel_last_error());
    accel_device_map_free(m);
    /* parse sets each entry: a bad one fails the whole map, naming it */
    CHECK(accel_device_map_parse("a:cpu,b:gpu:9") == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "'b' -> 'gpu:9'");
    accel_clear_error();
}

/* "00" is cuda:0 again: a second budget for the same GPU would let the
 * inferred map put twice its memory there. */
static void test_max_memory_gpu_key_leading_zero(void) {
    accel_max_memory mm = {0};
    CHECK(accel_max_memory_set(&mm, "0", "1GB") == ACCEL_OK);
    CHECK(accel_max_memory_set(&mm, "00", "1GB") == ACCEL_ERR_INVALID_ARG);
    CHECK(strstr(accel_last_error(), "'00'") != NULL);
    CHECK(accel_max_memory_set_bytes(&mm, "01", 5) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(mm.n == 1 && accel_max_memory_get(&mm, "0") == 1000000000);
    CHECK(accel_max_memory_set(&mm, "10", "1GB") == ACCEL_OK); /* a zero elsewhere is fine */
}

/* A key no budget can be for is refused when it is set, naming it and the
 * keys there are (it was kept, and accel_get_max_memory refused the whole
 * budget later); the budget is left as it was. */
static void test_max_memory_set_unknown_key(void) {
    static const char *const bad[] = {"npu", "mps", "cuda:0", "CPU", "gpu", "-1", "0x1", "123456"};
    accel_max_memory mm = {0};
    CHECK(accel_max_memory_set(&mm, "cpu", "1GB") == ACCEL_OK);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char named[64];
        snprintf(named, sizeof named, "device '%s' is not recognized", bad[i]);
        CHECK_MSG(accel_max_memory_set(&mm, bad[i], "1GB") == ACCEL_ERR_INVALID_ARG, "'%s' was accepted", bad[i]);
        CHECK_STR_CONTAINS(accel_last_error(), named);
        CHECK_STR_CONTAINS(accel_last_error(), "GPU indices ('0', '1', ...), 'cpu' and 'disk'");
        CHECK_MSG(accel_max_memory_set_bytes(&mm, bad[i], 5) == ACCEL_ERR_INVALID_ARG, "'%s' was accepted", bad[i]);
        accel_clear_error();
    }
    CHECK(mm.n == 1 && accel_max_memory_get(&mm, "cpu") == 1000000000);
    CHECK(accel_max_memory_set(&mm, "disk", "1GB") == ACCEL_OK && accel_max_memory_set(&mm, "7", "1GB") == ACCEL_OK);
}

static void test_infer_basic(void) {
    accel_module *m = model_for_test();
    check_map(m, "0=200,1=200", NULL, "{\"linear1\": 0, \"batchnorm\": 1, \"linear2\": 1}");
    check_map(m, "0=200,1=172,2=200", NULL, "{\"linear1\": 0, \"batchnorm\": 1, \"linear2\": 1}");
    accel_device_map_opts f16 = {.has_dtype = true, .dtype = ACCEL_F16};
    check_map(m, "0=200,1=200", &f16, "{\"\": 0}");
    accel_module_free(m);

    m = seq3("0", "1", "2");
    check_map(m, "0=500,1=500", NULL,
              "{\"0\": 0, \"1.linear1\": 0, \"1.batchnorm\": 0, \"1.linear2\": 1, \"2\": 1}");
    const char *ns[] = {"ModelForTest"};
    accel_device_map_opts o = {.no_split = ns, .n_no_split = 1};
    check_map(m, "0=500,1=500", &o, "{\"0\": 0, \"1\": 1, \"2\": 1}");
    check_map(m, "0=300,cpu=400", NULL,
              "{\"0.linear1\": 0, \"0.batchnorm\": 0, \"0.linear2\": \"cpu\", \"1.linear1\": \"cpu\", "
              "\"1.batchnorm\": \"cpu\", \"1.linear2\": \"disk\", \"2\": \"disk\"}");
    accel_device_map_opts raw = {.keep_raw = true};
    check_map(m, "0=500,1=500", &raw,
              "{\"0\": 0, \"1.linear1\": 0, \"1.batchnorm\": 0, \"1.linear2\": 1, \"2\": 1}");
    accel_module_free(m);
}

static void test_infer_tied(void) {
    /* Linear(4,4), BatchNorm1d(4), Linear(4,4) with linear2.weight = linear1.weight
     * (accel ties only same-shaped tensors; values from accelerate) */
    accel_module *m = accel_module_new(&MFT_OPS, NULL);
    accel_module_add_child(m, "linear1", linear(4, 4));
    accel_module_add_child(m, "batchnorm", batchnorm(4));
    accel_module_add_child(m, "linear2", linear(4, 4));
    CHECK(accel_module_tie(m, "linear2.weight", "linear1.weight") == ACCEL_OK);
    accel_module_sizes *s = accel_compute_module_sizes(m, NULL, false);
    CHECK(accel_module_sizes_get(s, "") == 168 && accel_module_sizes_get(s, "linear1") == 80);
    CHECK(accel_module_sizes_get(s, "linear2") == 16); /* its weight is counted under linear1 */
    CHECK(accel_module_sizes_get(s, "linear2.weight") == 0);
    accel_module_sizes_free(s);
    check_map(m, "0=200,1=200", NULL, "{\"\": 0}");
    check_map(m, "0=100,1=200", NULL, "{\"\": 1}");
    check_map(m, "0=150,1=150,cpu=200", NULL, "{\"linear1\": 1, \"linear2\": 1, \"batchnorm\": \"cpu\"}");
    accel_module_free(m);

    m = seq3("layer1", "layer2", "layer3");
    accel_module_tie(m, "layer3.linear2.weight", "layer1.linear2.weight");
    check_map(m, "0=400,1=500", NULL,
              "{\"layer1\": 0, \"layer3.linear2\": 0, \"layer3.linear1\": 1, \"layer3.batchnorm\": 1, "
              "\"layer2\": 1}");
    const char *ns[] = {"ModelForTest"};
    accel_device_map_opts o = {.no_split = ns, .n_no_split = 1};
    check_map(m, "0=400,1=500", &o, "{\"layer1\": 1, \"layer3\": 1, \"layer2\": \"disk\"}");
    check_map(m, "0=250,1=250,cpu=300", NULL,
              "{\"layer1.linear1\": 0, \"layer1.batchnorm\": 0, \"layer1.linear2\": 1, \"layer3.linear2\": 1, "
              "\"layer2.linear1\": 1, \"layer2.batchnorm\": \"cpu\", \"layer2.linear2\": \"cpu\", "
              "\"layer3.linear1\": \"disk\", \"layer3.batchnorm\": \"disk\"}");
    accel_module_free(m);
}

static void test_infer_buffers_and_fallback(void) {
    accel_module *m = model_for_test();
    accel_module_add_buffer(accel_module_find(m, "linear1"), "test_buffer1", meta(ACCEL_F32, ACCEL_SHAPE(10, 2)));
    accel_module_add_buffer(accel_module_find(m, "batchnorm"), "test_buffer2", meta(ACCEL_F32, ACCEL_SHAPE(10, 3)));
    accel_module_add_buffer(accel_module_find(m, "linear2"), "test_buffer3", meta(ACCEL_F32, ACCEL_SHAPE(10, 3)));
    FILE *log = tmpfile();
    accel_device_map_opts o = {.log = log};
    check_map(m, "0=400,cpu=1GB", &o, "{\"linear1\": 0, \"batchnorm\": \"cpu\", \"linear2\": \"cpu\"}");
    char text[2048] = {0};
    rewind(log);
    CHECK(fread(text, 1, sizeof text - 1, log) > 0);
    CHECK_STR_CONTAINS(text, "Current model requires 280 bytes of buffer for offloaded layers");
    fclose(log);
    log = tmpfile();
    accel_device_map_opts ob = {.log = log, .offload_buffers = true};
    check_map(m, "0=400,cpu=1GB", &ob, "{\"linear1\": 0, \"batchnorm\": \"cpu\", \"linear2\": \"cpu\"}");
    CHECK(ftell(log) == 0);
    fclose(log);
    accel_module_free(m);

    /* module.{linear1(10->4), linear2(4->4), linear3(4->8)} with {0: 256} */
    m = accel_module_new(&SEQ_OPS, NULL);
    accel_module *inner = accel_module_add_child(m, "module", accel_module_new(&SEQ_OPS, NULL));
    accel_module_add_child(inner, "linear1", linear(10, 4));
    accel_module_add_child(inner, "linear2", linear(4, 4));
    accel_module_add_child(inner, "linear3", linear(4, 8));
    log = tmpfile();
    accel_device_map_opts nf = {.log = log};
    check_map(m, "0=256", &nf, "{\"\": \"disk\"}");
    memset(text, 0, sizeof text);
    rewind(log);
    CHECK(fread(text, 1, sizeof text - 1, log) > 0);
    CHECK_STR_CONTAINS(text, "no modules could be assigned to device 0 due to insufficient memory");
    fclose(log);
    accel_device_map_opts fb = {.fallback_allocation = true, .log = NULL};
    check_map(m, "0=256", &fb,
              "{\"module.linear2\": 0, \"module.linear1\": \"disk\", \"module.linear3\": \"disk\"}");
    accel_module_free(m);
}

static void test_balanced_memory(void) {
    accel_module *m = model_for_test();
    static const char *cases[][2] = {
        {"0=200,1=200", "0=200,1=200"},     {"0=200,2=200", "0=200,2=200"},
        {"0=300,1=300", "0=215,1=300"},     {"0=300,1=500", "0=215,1=500"},
        {"0=300,cpu=1000", "0=300,cpu=1000"}, {"0=0,1=300,2=300", "0=0,1=215,2=300"},
        {"0=0,cpu=100", "0=0,cpu=100"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        accel_max_memory in = {0}, want = {0}, out;
        mm_set(&in, cases[i][0]);
        mm_set(&want, cases[i][1]);
        CHECK(accel_get_balanced_memory(m, &in, NULL, false, &out) == ACCEL_OK);
        CHECK(out.n == want.n);
        for (int k = 0; k < want.n; k++)
            CHECK_MSG(accel_max_memory_get(&out, want.e[k].device) == want.e[k].bytes, "%s: %s", cases[i][0],
                      want.e[k].device);
    }
    accel_module_free(m);
    /* no_split buffer and low_zero (values from accelerate) */
    m = seq3("0", "1", "2");
    const char *ns[] = {"ModelForTest"};
    accel_device_map_opts o = {.no_split = ns, .n_no_split = 1};
    accel_max_memory in = {0}, out;
    mm_set(&in, "0=500,1=500,2=500");
    CHECK(accel_get_balanced_memory(m, &in, &o, false, &out) == ACCEL_OK);
    CHECK(out.e[0].bytes == 500 && out.e[1].bytes == 500 && out.e[2].bytes == 500);
    CHECK(accel_get_balanced_memory(m, &in, NULL, true, &out) == ACCEL_OK);
    CHECK(out.e[0].bytes == 0 && out.e[1].bytes == 451 && out.e[2].bytes == 500);
    /* strings */
    accel_device_map *map = accel_device_map_from_string(m, "balanced_low_0", &in, NULL);
    CHECK(map && strcmp(accel_device_map_lookup(map, "0.linear1.weight"), "1") == 0);
    accel_device_map_free(map);
    map = accel_device_map_from_string(m, "sequential", &in, NULL);
    char buf[256];
    CHECK(map && strcmp(accel_device_map_str(map, buf, sizeof buf),
                        "{\"0\": 0, \"1.linear1\": 0, \"1.batchnorm\": 0, \"1.linear2\": 1, \"2\": 1}") == 0);
    accel_device_map_free(map);
    map = accel_device_map_from_string(m, "auto", &in, NULL); /* balanced: {0: 333, 1: 333, 2: 500} */
    CHECK(map && strcmp(accel_device_map_str(map, buf, sizeof buf),
                        "{\"0.linear1\": 0, \"0.batchnorm\": 0, \"0.linear2\": 1, \"1.linear1\": 1, "
                        "\"1.batchnorm\": 1, \"1.linear2\": 2, \"2\": 2}") == 0);
    accel_device_map_free(map);
    CHECK(accel_device_map_from_string(m, "fastest", &in, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "'auto', 'balanced', 'balanced_low_0' or 'sequential'");
    accel_clear_error();
    accel_module_free(m);
}

static void test_check_device_map(void) {
    accel_module *m = model_for_test();
    accel_device_map *map = accel_device_map_parse("linear1:0,linear2:1");
    CHECK(accel_check_device_map(m, map, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(),
                       "does not give any device for the following parameters: batchnorm.weight, batchnorm.bias, "
                       "batchnorm.running_mean, batchnorm.running_var, batchnorm.num_batches_tracked");
    accel_clear_error();
    accel_device_map_set(map, "batchnorm", "cpu");
    CHECK(accel_check_device_map(m, map, NULL) == ACCEL_OK);
    accel_device_map_free(map);
    map = accel_device_map_parse(":0,typo:1");
    FILE *log = tmpfile();
    accel_device_map_opts o = {.log = log};
    CHECK(accel_check_device_map(m, map, &o) == ACCEL_OK);
    char text[512] = {0};
    rewind(log);
    CHECK(fread(text, 1, sizeof text - 1, log) > 0);
    CHECK_STR_CONTAINS(text, "The following device_map keys do not match any submodules in the model: ['typo']");
    fclose(log);
    accel_device_map_free(map);
    accel_module_free(m);
}

/* text into a file of its own; its path in out. */
static void map_file(const char *text, char *out, size_t n) {
    snprintf(out, n, "/tmp/accel_device_map_%d_XXXXXX", (int)getpid());
    int fd = mkstemp(out);
    CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    if (fd >= 0) close(fd);
}

static void load_refused(const char *text, const char *needle) {
    char path[128];
    map_file(text, path, sizeof path);
    CHECK_MSG(accel_device_map_load(path) == NULL, "loaded: %s", text);
    CHECK_STR_CONTAINS(accel_last_error(), path);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    accel_clear_error();
    unlink(path);
}

/* A device map saved as JSON (json.dump(model.hf_device_map)): the file's
 * order, GPU indices as integers, every entry of a large file; refused by
 * name: no file, not an object, a key twice, a value of another type or a
 * device accel_device_map_set refuses, or a key no module has (a part
 * empty, more than 256 parts). */
static void test_device_map_load(void) {
    char path[128], buf[256];
    map_file("{\"model.embed_tokens\": 0, \"model.layers\": \"cpu\", \"lm_head\": \"disk\"}", path, sizeof path);
    accel_device_map *m = accel_device_map_load(path);
    CHECK_MSG(m && m->n == 3, "%s", accel_last_error());
    if (m) CHECK(!strcmp(accel_device_map_str(m, buf, sizeof buf),
                         "{\"model.embed_tokens\": 0, \"model.layers\": \"cpu\", \"lm_head\": \"disk\"}"));
    accel_device_map_free(m);
    unlink(path);
    /* 4000 entries (~150 KB): the last one too (a 64 KiB reader dropped it, its modules left on a parent's device) */
    size_t cap = 1 << 20, used = 0;
    char *big = malloc(cap);
    used += (size_t)snprintf(big + used, cap - used, "{\"model\": \"cpu\"");
    for (int i = 0; i < 4000; i++)
        used += (size_t)snprintf(big + used, cap - used, ", \"model.layers.%d.self_attn.q_proj\": \"cpu\"", i);
    snprintf(big + used, cap - used, ", \"model.layers.3999.mlp\": \"disk\"}");
    map_file(big, path, sizeof path);
    free(big);
    m = accel_device_map_load(path);
    CHECK_MSG(m && m->n == 4002, "%s", accel_last_error());
    const char *d = m ? accel_device_map_lookup(m, "model.layers.3999.mlp.up_proj.weight") : NULL;
    CHECK(d && !strcmp(d, "disk"));
    accel_device_map_free(m);
    unlink(path);
    CHECK(accel_device_map_load("/nonexistent/accel_map.json") == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "/nonexistent/accel_map.json");
    accel_clear_error();
    load_refused("[\"cpu\"]", "a device map is a JSON object of prefix -> device, not a list");
    /* a key no module has: an empty part (fuzz_config: ".Nmodel.layers" made
     * accel_clean_device_map recurse until the stack overflowed), or more parts
     * than the clean's recursion should go (200,000 overflowed it too) */
    load_refused("{\"model.embed_tokens\": \"cpu\", \".Nmodel.layers\": \"disk\"}",
                 "key '.Nmodel.layers': a part of the name is empty");
    load_refused("{\"model.\": \"cpu\"}", "key 'model.': a part of the name is empty");
    load_refused("{\"model..layers\": \"cpu\"}", "key 'model..layers': a part of the name is empty");
    char deep[1024] = "{\"a";
    for (int i = 0; i < 256; i++) strcat(deep, ".a");
    strcat(deep, "\": \"cpu\"}");
    load_refused(deep, "the name has more than 256 dotted parts");
    load_refused("{\"a\": \"cpu\", \"a\": 0}", "duplicate");
    load_refused("{\"a\": true}", "key 'a': the value is neither a device name nor a GPU index");
    load_refused("{\"a\": -1}", "key 'a': the value is neither");
    load_refused("{\"a\": 1.5}", "key 'a': the value is neither");
    load_refused("{\"a\": \"gpu:9\"}", "key 'a': ");
    load_refused("{\"a\": ", "invalid JSON");
}


/* ---- the real mixtures of experts: Mixtral-8x7B, Qwen3-30B-A3B and
 * Qwen1.5-MoE-A2.7B; and stablelm-2-12b's sizes (StableLmConfig, its per-head
 * q/k norms). Their config.json and every expected figure come from
 * tools/gen_moe_memory_fixture.py (transformers 5.25's MixtralConfig /
 * Qwen3MoeConfig / Qwen2MoeConfig with the Hub's values;
 * the models built on meta under accelerate 1.16's init_empty_weights):
 * the causal LM's parameters, the body's (AutoModel's, which Accelerate
 * measures), its largest no-split layer in f32 bytes (calculate_maximum_sizes;
 * its total there is the body's f32 bytes plus the 512 bytes of rotary buffers
 * transformers keeps and accel computes), and infer_auto_device_map of the
 * causal LM in bf16 over 30 GB + 30 GB + 200 GB of cpu (accelerate's map
 * also names model.rotary_emb, a module of buffers only that accel has not:
 * "cpu", beside model.norm; a model that fits on device 0 whole is {"": 0}). */

typedef struct moe_case {
    const char *dir;
    int64_t lm_params, body_params, largest_layer;
    int on_0, on_1; /* layers on device 0, then on 1; the rest on cpu */
} moe_case;

static int64_t param_count(accel_module *m) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int64_t count = 0;
    for (int i = 0; i < n; i++) count += accel_numel(ps[i]);
    accel_free(ps);
    return count;
}

/* accelerate's map of the case, rotary_emb left out. */
static void moe_expected_map(const moe_case *c, int layers, char *buf, size_t n) {
    if (c->on_0 == layers) {
        snprintf(buf, n, "{\"\": 0}");
        return;
    }
    size_t at = (size_t)snprintf(buf, n, "{\"model.embed_tokens\": 0");
    for (int i = 0; i < layers && at < n; i++) {
        char dev[8];
        snprintf(dev, sizeof dev, i < c->on_0 ? "0" : i < c->on_0 + c->on_1 ? "1" : "\"cpu\"");
        at += (size_t)snprintf(buf + at, n - at, ", \"model.layers.%d\": %s", i, dev);
    }
    if (at < n) snprintf(buf + at, n - at, ", \"model.norm\": \"cpu\", \"lm_head\": \"cpu\"}");
}

static void check_moe_case(const moe_case *c) {
    accel_llama_config cfg;
    CHECK_MSG(accel_llama_config_load(c->dir, &cfg) == ACCEL_OK, "%s: %s", c->dir, accel_last_error());
    cfg.torch_dtype = ACCEL_F32; /* Accelerate's sizes are float32's (its estimate builds the model so) */
    accel_init_empty_weights_begin();
    accel_module *m = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    CHECK_MSG(m != NULL, "%s: %s", c->dir, accel_last_error());
    if (!m) return;
    CHECK_MSG(param_count(m) == c->lm_params, "%s: %lld parameters, transformers %lld", c->dir,
              (long long)param_count(m), (long long)c->lm_params);
    accel_module *body = m->children[0];
    const char *no_split[] = {accel_module_decoder_layer_class(m)};
    int64_t total = 0, largest = 0;
    CHECK(accel_calculate_maximum_sizes(body, no_split, 1, &total, &largest) == ACCEL_OK);
    CHECK_MSG(param_count(body) == c->body_params && total == 4 * c->body_params && largest == c->largest_layer,
              "%s: body %lld parameters, %lld bytes, largest layer %lld (%s)", c->dir, (long long)param_count(body),
              (long long)total, (long long)largest, no_split[0]);
    accel_max_memory mm = {0};
    mm_set(&mm, "0=30GB,1=30GB,cpu=200GB");
    accel_device_map_opts o = {.no_split = no_split, .n_no_split = 1, .has_dtype = true, .dtype = ACCEL_BF16};
    accel_device_map *map = accel_infer_auto_device_map(m, &mm, &o);
    CHECK_MSG(map != NULL, "%s: %s", c->dir, accel_last_error());
    char got[4096], want[4096];
    moe_expected_map(c, (int)cfg.num_hidden_layers, want, sizeof want);
    if (map) CHECK_MSG(strcmp(accel_device_map_str(map, got, sizeof got), want) == 0, "%s: map %s, accelerate's %s",
                       c->dir, got, want);
    accel_device_map_free(map);
    accel_module_free(m);
}

static void test_moe_real_configs(void) {
    static const moe_case CASES[] = {
        {"data/mixtral_8x7b_config", 46702792704, 46571720704, 5805080576, 9, 10},
        {"data/qwen3_30b_a3b_config", 30532122624, 30220957696, 2492482560, 22, 24},
        {"data/qwen15_moe_a27b_config", 14315784192, 14004619264, 2282242048, 24, 0},
        /* a dense one: stablelm-2-12b's sizes with qk_layernorm (its 40 layers' 256000 per-head norm weights counted) */
        {"data/stablelm2_12b_config", 12143185920, 11629383680, 2055208960, 40, 0},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) check_moe_case(&CASES[i]);
}

int main(void) {
    RUN(test_module_sizes);
    RUN(test_module_sizes_overflow);
    RUN(test_max_layer_size);
    RUN(test_tied_parameters);
    RUN(test_clean_device_map);
    RUN(test_device_map_basics);
    RUN(test_device_map_set_checks_values);
    RUN(test_max_memory_gpu_key_leading_zero);
    RUN(test_max_memory_set_unknown_key);
    RUN(test_infer_basic);
    RUN(test_infer_tied);
    RUN(test_infer_buffers_and_fallback);
    RUN(test_balanced_memory);
    RUN(test_check_device_map);
    RUN(test_device_map_load);
    RUN(test_moe_real_configs);
    accel_thread_cleanup();
    return check_summary();
}
