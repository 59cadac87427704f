/* Models with very many layers build, measure, save and load in linear time.
 *
 * config.json's num_hidden_layers comes from a file: building the module tree,
 * its state dict, its sizes, saving and loading a checkpoint must not be
 * quadratic in the number of members (10^6 layers used to hang generate and
 * estimate-memory). `test_many_members [N]` (default 2000, enough to use the
 * member index; every build runs it) and, as many_members_large_nosan,
 * N = 200000: the quadratic versions took many minutes there, these take
 * seconds, so tests/bigmodel.cmake gives it a 120 s limit. */
#include <stdlib.h>
#include <unistd.h>

#include "accel/bigmodel.h"
#include "accel/io.h"
#include "check.h"

static int N = 2000;

static const accel_module_ops CELL_OPS = {"Cell", NULL, NULL};
static const accel_module_ops LIST_OPS = {"ModuleList", NULL, NULL};

/* list.0 ... list.{N-1}, each a Cell with one [1] parameter "w" on dev */
static accel_module *many_cells(accel_device dev) {
    accel_module *root = accel_module_new(&LIST_OPS, NULL);
    accel_module *list = accel_module_add_child(root, "list", accel_module_new(&LIST_OPS, NULL));
    bool ok = list != NULL;
    for (int i = 0; ok && i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        accel_module *cell = accel_module_add_child(list, name, accel_module_new(&CELL_OPS, NULL));
        ok = cell && accel_module_add_param(cell, "w", accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(1), dev));
    }
    CHECK_MSG(ok, "%s", accel_last_error());
    return root;
}

static void test_build_and_find(void) {
    accel_module *root = many_cells(ACCEL_META_DEVICE);
    accel_module *list = accel_module_find(root, "list");
    CHECK(list && list->n_children == N);
    char name[32];
    snprintf(name, sizeof name, "list.%d", N - 1);
    CHECK(accel_module_find(root, name) == list->children[N - 1]);
    snprintf(name, sizeof name, "list.%d.w", N / 2);
    CHECK(accel_module_get_tensor(root, name) == list->children[N / 2]->tensors[0].t);
    CHECK(accel_module_find(root, "list.w") == NULL && accel_module_find(root, "list.-1") == NULL);
    /* the duplicate check still sees every member */
    accel_clear_error();
    CHECK(accel_module_add_child(list, "1234", accel_module_new(&CELL_OPS, NULL)) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "already has a member \"1234\"");
    accel_clear_error();
    /* state dict (tied aliases marked), sizes and the largest layer */
    CHECK(accel_module_tie(root, "list.7.w", "list.3.w") == ACCEL_OK);
    accel_state_dict *sd = accel_module_state_dict(root);
    int aliases = 0;
    for (int i = 0; sd && i < sd->n; i++) aliases += sd->entries[i].is_tied_alias;
    CHECK(sd && sd->n == N && aliases == 1 && sd->entries[7].is_tied_alias);
    accel_state_dict_free(sd);
    int64_t total = 0, largest = 0;
    static const char *const no_split[] = {"Cell"};
    CHECK(accel_calculate_maximum_sizes(root, no_split, 1, &total, &largest) == ACCEL_OK);
    CHECK(total == 4 * (int64_t)(N - 1) && largest == 4);
    accel_module_free(root);
}

static void test_load_checkpoint(void) {
    accel_module *src = many_cells(ACCEL_CPU_DEVICE);
    accel_state_dict *sd = accel_module_state_dict(src);
    const char **names = malloc(sizeof *names * N);
    accel_tensor **ts = malloc(sizeof *ts * N);
    for (int i = 0; i < N; i++) {
        names[i] = sd->entries[i].name;
        ts[i] = sd->entries[i].t;
        ((float *)ts[i]->data)[0] = (float)i;
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/accel_many_%d.safetensors", (int)getpid());
    CHECK_MSG(accel_safetensors_save(path, N, names, ts, 0, NULL) == ACCEL_OK, "%s", accel_last_error());
    accel_state_dict_free(sd);
    free(names);
    free(ts);
    accel_module_free(src);

    accel_module *dst = many_cells(ACCEL_CPU_DEVICE);
    accel_dispatched *d = accel_load_checkpoint_in_model(dst, path, NULL, NULL);
    CHECK_MSG(d != NULL, "%s", accel_last_error());
    accel_dispatch_stats st = {0};
    accel_dispatched_stats(d, &st);
    CHECK(st.n_loaded == N);
    char name[32];
    snprintf(name, sizeof name, "list.%d", N - 1);
    accel_module *last = accel_module_find(dst, name);
    CHECK(last && ((float *)last->tensors[0].t->data)[0] == (float)(N - 1));
    accel_dispatched_free(d);
    accel_module_free(dst);
    unlink(path);
}

int main(int argc, char **argv) {
    if (argc > 1) N = atoi(argv[1]);
    if (N < 2000) return 2;
    RUN(test_build_and_find);
    RUN(test_load_checkpoint);
    accel_thread_cleanup();
    return check_summary();
}
