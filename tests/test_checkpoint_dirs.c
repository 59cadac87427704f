/* save_state / load_state and the directories around a checkpoint: what is
 * not the checkpoint's is the user's and survives a save (notes, logs, a
 * save_model's files beside it, a read-only folder, a FIFO, a ".tmp_<name>"
 * of theirs next to it); the
 * marker lists only the checkpoint's files, so editing a note does not make
 * the checkpoint "corrupted"; an older save's own files do not survive (a
 * later load of more objects would read them), nor a killed write's scratch
 * file of one (it made every later save fail); "x/y/.." saves into x; a name
 * too long for the staged sibling, and an automatic counter at its end, are
 * refused before anything is written; a checkpoint of a larger model is
 * refused naming the tensor the model lacks. Under `accel launch` (2
 * processes) also: ranks given different directories are told so, at a save
 * and at a load. */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "check.h"

static char ROOT[256];
static int R, N;

static void rm_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK_MSG(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

/* path's content is text. */
static bool holds(const char *path, const char *text) {
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    return f && n == strlen(text) && !memcmp(buf, text, n);
}

static bool exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

typedef struct run {
    accel_accelerator *acc;
    accel_module *model;
    accel_optimizer *opt;
} run;

/* An accelerator (automatic naming when `automatic`) with a linear model
 * (layers linears of 3 -> 4 -> ... ; 2 or 3 of them) and AdamW over it. */
static void run_make(run *r, bool automatic, int layers, uint64_t seed) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.project_dir = ROOT;
    o.automatic_checkpoint_naming = automatic;
    r->acc = accel_accelerator_new(&o);
    CHECK_MSG(r->acc, "%s", accel_last_error());
    accel_manual_seed(seed);
    accel_module *l[3] = {accel_linear_new(3, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                          accel_linear_new(4, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                          accel_linear_new(4, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    if (layers == 2) accel_module_free(l[2]);
    r->model = accel_sequential_new(layers, l);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    r->opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, r->model, &h);
    CHECK_MSG(accel_accelerator_prepare(r->acc, r->model, r->opt) == ACCEL_OK, "%s", accel_last_error());
}

static void run_free(run *r) {
    CHECK_MSG(accel_accelerator_clear(r->acc) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(r->opt);
    accel_module_free(r->model);
    accel_accelerator_free(r->acc);
}

/* Whether dir's completion marker lists name. */
static bool marker_lists(const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/accel_checkpoint.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    bool listed = json_object_get(json_object_get(root, "files"), name) != NULL;
    json_decref(root);
    return listed;
}

/* A directory holding a user's files (a note, a log folder), an older save's
 * own files (a second model's, a fifth custom object's), and beside it a
 * ".tmp_<name>" of the user's: two saves (into the directory as it is, then
 * over their own checkpoint) keep the user's files and drop the old save's;
 * the marker lists none of the user's, and a note edited after the save
 * leaves the checkpoint loadable. */
static void test_user_files_survive(void) {
    char dir[300], p[400];
    snprintf(dir, sizeof dir, "%s/run", ROOT);
    if (R == 0) {
        CHECK(mkdir(dir, 0755) == 0);
        snprintf(p, sizeof p, "%s/logs", dir);
        CHECK(mkdir(p, 0755) == 0);
        snprintf(p, sizeof p, "%s/notes.txt", dir);
        put(p, "keep me\n");
        snprintf(p, sizeof p, "%s/logs/events.txt", dir);
        put(p, "event 1\n");
        snprintf(p, sizeof p, "%s/model_1.safetensors", dir);
        put(p, "an older save's second model\n");
        snprintf(p, sizeof p, "%s/custom_checkpoint_4.bin", dir);
        put(p, "an older save's fifth object\n");
        snprintf(p, sizeof p, "%s/optimizer.safetensors.tmp", dir); /* a killed write's scratch file */
        put(p, "half an optimizer\n");
        snprintf(p, sizeof p, "%s/snapshot", dir); /* read-only: its copy was made so before it was filled */
        CHECK(mkdir(p, 0755) == 0);
        snprintf(p, sizeof p, "%s/snapshot/a.txt", dir);
        put(p, "frozen\n");
        snprintf(p, sizeof p, "%s/snapshot", dir);
        CHECK(chmod(p, 0555) == 0);
        snprintf(p, sizeof p, "%s/ctl.fifo", dir);
        CHECK(mkfifo(p, 0640) == 0);
        snprintf(p, sizeof p, "%s/.tmp_run", ROOT);
        CHECK(mkdir(p, 0755) == 0);
        snprintf(p, sizeof p, "%s/.tmp_run/precious.txt", ROOT);
        put(p, "mine\n");
    }
    run r;
    run_make(&r, false, 2, 1);
    for (int save = 0; save < 2; save++) {
        CHECK_MSG(accel_accelerator_save_state(r.acc, dir, NULL, 0) == ACCEL_OK, "save %d: %s", save,
                  accel_last_error());
        snprintf(p, sizeof p, "%s/notes.txt", dir);
        CHECK_MSG(holds(p, "keep me\n"), "save %d: the user's note is gone", save);
        snprintf(p, sizeof p, "%s/logs/events.txt", dir);
        CHECK_MSG(holds(p, "event 1\n"), "save %d: the user's log folder is gone", save);
        snprintf(p, sizeof p, "%s/.tmp_run/precious.txt", ROOT);
        CHECK_MSG(holds(p, "mine\n"), "save %d: the user's .tmp_run beside the checkpoint is gone", save);
        snprintf(p, sizeof p, "%s/model_1.safetensors", dir);
        CHECK_MSG(!exists(p), "save %d: an older save's model_1 survived", save);
        snprintf(p, sizeof p, "%s/custom_checkpoint_4.bin", dir);
        CHECK_MSG(!exists(p), "save %d: an older save's custom_checkpoint_4 survived", save);
        snprintf(p, sizeof p, "%s/optimizer.safetensors.tmp", dir);
        CHECK_MSG(!exists(p), "save %d: a killed write's optimizer.safetensors.tmp survived", save);
        snprintf(p, sizeof p, "%s/snapshot/a.txt", dir);
        CHECK_MSG(holds(p, "frozen\n"), "save %d: the read-only folder's file is gone", save);
        struct stat sb;
        snprintf(p, sizeof p, "%s/snapshot", dir);
        CHECK_MSG(stat(p, &sb) == 0 && (sb.st_mode & 07777) == 0555, "save %d: the folder's mode changed", save);
        snprintf(p, sizeof p, "%s/ctl.fifo", dir);
        CHECK_MSG(stat(p, &sb) == 0 && S_ISFIFO(sb.st_mode) && (sb.st_mode & 07777) == 0640,
                  "save %d: the FIFO is gone", save);
        CHECK(marker_lists(dir, "model.safetensors"));
        CHECK_MSG(!marker_lists(dir, "notes.txt") && !marker_lists(dir, "logs/events.txt"),
                  "save %d: the marker lists the user's files", save);
    }
    accel_accelerator_wait_for_everyone(r.acc);
    if (R == 0) {
        snprintf(p, sizeof p, "%s/notes.txt", dir);
        put(p, "edited after the save\n");
    }
    accel_accelerator_wait_for_everyone(r.acc);
    CHECK_MSG(accel_accelerator_load_state(r.acc, dir, NULL) == ACCEL_OK, "%s", accel_last_error());
    accel_accelerator_wait_for_everyone(r.acc);
    if (R == 0) {
        snprintf(p, sizeof p, "%s/snapshot", dir);
        CHECK(chmod(p, 0755) == 0); /* removable by a user that is not root */
    }
    run_free(&r);
}

/* "x/y/..": the save goes into x by its own name (it staged the whole save,
 * then failed to replace "..", busy). A name longer than the staged sibling
 * allows: refused first, nothing written; the longest that fits saves. */
static void test_names(void) {
    char x[300], dots[400], p[700], name[NAME_MAX + 1];
    snprintf(x, sizeof x, "%s/x", ROOT);
    snprintf(dots, sizeof dots, "%s/y/..", x);
    if (R == 0) {
        snprintf(p, sizeof p, "%s/y", x);
        CHECK(mkdir(x, 0755) == 0 && mkdir(p, 0755) == 0);
    }
    run r;
    run_make(&r, false, 2, 2);
    accel_accelerator_wait_for_everyone(r.acc);
    CHECK_MSG(accel_accelerator_save_state(r.acc, dots, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    snprintf(p, sizeof p, "%s/model.safetensors", x);
    CHECK_MSG(exists(p), "x/y/.. did not save into x");
    snprintf(p, sizeof p, "%s/y", x);
    CHECK_MSG(exists(p), "x/y is gone");
    CHECK_MSG(accel_accelerator_load_state(r.acc, dots, NULL) == ACCEL_OK, "%s", accel_last_error());
    /* the staged sibling is ".<name>.accel-staging": 15 bytes around the name */
    memset(name, 'n', sizeof name);
    name[NAME_MAX - 14] = 0;
    snprintf(p, sizeof p, "%s/%s", ROOT, name);
    accel_status s = accel_accelerator_save_state(r.acc, p, NULL, 0); /* rank 0 stages; the others hear of it */
    CHECK(R == 0 ? s == ACCEL_ERR_INVALID_ARG : s != ACCEL_OK);
    if (R == 0)
        CHECK_STR_CONTAINS(accel_last_error(), "is 241 bytes: the save is written beside it into "
                                               ".<name>.accel-staging, which must fit in 255 bytes (a name of at "
                                               "most 240)");
    accel_clear_error();
    CHECK_MSG(!exists(p), "the refused save made its directory");
    name[NAME_MAX - 15] = 0;
    snprintf(p, sizeof p, "%s/%s", ROOT, name);
    CHECK_MSG(accel_accelerator_save_state(r.acc, p, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    run_free(&r);
}

/* An entry checkpoint_999999999999999999 (18 digits, the most the counter
 * reads): the next automatic save has no name the listing would see (it
 * wrote checkpoint_1000000000000000000 again at every save) and is refused
 * naming the entry; nothing is written. */
static void test_counter_at_its_end(void) {
    char root[300], p[400];
    snprintf(root, sizeof root, "%s/checkpoints", ROOT);
    if (R == 0) {
        CHECK(mkdir(root, 0755) == 0);
        snprintf(p, sizeof p, "%s/checkpoint_999999999999999999", root);
        CHECK(mkdir(p, 0755) == 0);
    }
    run r;
    run_make(&r, true, 2, 3);
    accel_accelerator_wait_for_everyone(r.acc);
    CHECK(accel_accelerator_save_state(r.acc, NULL, NULL, 0) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "holds checkpoint_999999999999999999, the highest number automatic naming "
                                           "counts to");
    accel_clear_error();
    snprintf(p, sizeof p, "%s/checkpoint_1000000000000000000", root);
    CHECK_MSG(!exists(p), "the refused save wrote %s", p);
    accel_accelerator_wait_for_everyone(r.acc);
    if (R == 0) rm_tree(root);
    run_free(&r);
}

/* A checkpoint of a model with a third layer loaded into one with two (its
 * optimizer too): refused naming the tensor the model lacks, as torch's
 * strict load_state_dict refuses unexpected keys; nothing loaded. */
static void test_larger_model_refused(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/larger", ROOT);
    run big, small;
    run_make(&big, false, 3, 4);
    CHECK_MSG(accel_accelerator_save_state(big.acc, dir, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    run_free(&big);
    run_make(&small, false, 2, 5);
    accel_tensor **ps;
    accel_module_parameters(small.model, &ps);
    float w0 = ((float *)ps[0]->data)[0];
    accel_status s = accel_accelerator_load_state(small.acc, dir, NULL);
    CHECK_MSG(s == ACCEL_ERR_FORMAT, "load_state -> %d: %s", (int)s, accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), "model.safetensors holds 2.");
    CHECK_STR_CONTAINS(accel_last_error(), "which the model does not have");
    accel_clear_error();
    CHECK_MSG(((float *)ps[0]->data)[0] == w0, "the first layer was loaded");
    accel_free(ps);
    run_free(&small);
}

/* The same under ZeRO-3, whose own load reads the units from its formats
 * (FULL: model.safetensors, SHARDED: pytorch_model_fsdp_0/ and its index),
 * with the model alone (no optimizer whose check would refuse it first): it
 * loaded the common layers, silently. */
static void test_larger_model_refused_zero3(void) {
    static const char *const SDT[] = {"FULL_STATE_DICT", "SHARDED_STATE_DICT"};
    for (int k = 0; k < 2; k++) {
        accel_module *m[2] = {NULL, NULL};
        accel_accelerator *acc[2];
        char dir[300];
        snprintf(dir, sizeof dir, "%s/larger_zero3_%d", ROOT, k);
        for (int big = 1; big >= 0; big--) {
            accel_accelerator_opts o = accel_accelerator_opts_default();
            o.mixed_precision = "no";
            o.project_dir = ROOT;
            o.zero_stage = 3;
            o.fsdp_state_dict_type = SDT[k];
            acc[big] = accel_accelerator_new(&o);
            CHECK_MSG(acc[big], "%s", accel_last_error());
            accel_manual_seed(8);
            accel_module *l[3] = {accel_linear_new(3, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                                  accel_linear_new(4, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                                  accel_linear_new(4, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
            if (!big) accel_module_free(l[2]);
            m[big] = accel_sequential_new(big ? 3 : 2, l);
            CHECK_MSG(accel_accelerator_prepare(acc[big], m[big]) == ACCEL_OK, "%s", accel_last_error());
            if (big) CHECK_MSG(accel_accelerator_save_state(acc[big], dir, NULL, 0) == ACCEL_OK, "%s",
                               accel_last_error());
        }
        accel_status s = accel_accelerator_load_state(acc[0], dir, NULL);
        CHECK_MSG(s == ACCEL_ERR_FORMAT, "%s: load_state -> %d: %s", SDT[k], (int)s, accel_last_error());
        CHECK_STR_CONTAINS(accel_last_error(), "2.weight, which the model does not have");
        CHECK_STR_CONTAINS(accel_last_error(), k ? "sharded_index.json lists 2." : "model.safetensors holds 2.");
        accel_clear_error();
        for (int big = 0; big < 2; big++) {
            CHECK(accel_accelerator_clear(acc[big]) == ACCEL_OK);
            accel_module_free(m[big]);
            accel_accelerator_free(acc[big]);
        }
    }
}

/* 2 processes: each rank given its own directory. The save is refused on the
 * rank that does not see rank 0's staged directory, naming what must hold
 * (it failed writing its file, naming a hidden path); the load of two
 * different checkpoints is refused on the rank whose checkpoint is not rank
 * 0's (it loaded its own, silently). */
static void test_ranks_given_different_directories(void) {
    char mine[300], p[800];
    snprintf(mine, sizeof mine, "%s/rank%d", ROOT, R);
    run r;
    run_make(&r, false, 2, 6);
    accel_status s = accel_accelerator_save_state(r.acc, mine, NULL, 0);
    CHECK(s != ACCEL_OK);
    if (R == 1) {
        CHECK_STR_CONTAINS(accel_last_error(), "rank 1 does not see");
        CHECK_STR_CONTAINS(accel_last_error(), "output_dir must name the same directory on every rank");
    }
    accel_clear_error();
    CHECK_MSG(!exists(mine), "the refused save left %s", mine);
    /* the same checkpoint saved twice (different weights), one per rank's directory */
    char dirs[2][300];
    for (int k = 0; k < 2; k++) {
        snprintf(dirs[k], sizeof dirs[k], "%s/shared%d", ROOT, k);
        CHECK_MSG(accel_accelerator_save_state(r.acc, dirs[k], NULL, 0) == ACCEL_OK, "%s", accel_last_error());
        accel_tensor **ps;
        accel_module_parameters(r.model, &ps);
        ((float *)ps[0]->data)[0] += 1.0f; /* the second save differs */
        accel_free(ps);
    }
    s = accel_accelerator_load_state(r.acc, dirs[R], NULL);
    CHECK(s != ACCEL_OK);
    if (R == 1) {
        snprintf(p, sizeof p, "rank 1's checkpoint %s is not rank 0's %s", dirs[1], dirs[0]);
        CHECK_STR_CONTAINS(accel_last_error(), p);
    }
    accel_clear_error();
    CHECK_MSG(accel_accelerator_load_state(r.acc, dirs[0], NULL) == ACCEL_OK, "%s", accel_last_error());
    run_free(&r);
}

int main(void) {
    snprintf(ROOT, sizeof ROOT, "/tmp/accel_ckpt_dirs_%d", (int)(accel_dist_world_size() > 1 ? getppid() : getpid()));
    R = accel_dist_rank();
    N = accel_dist_world_size();
    if (R == 0) {
        rm_tree(ROOT);
        CHECK(mkdir(ROOT, 0755) == 0);
    }
    RUN(test_user_files_survive);
    RUN(test_names);
    RUN(test_counter_at_its_end);
    RUN(test_larger_model_refused);
    RUN(test_larger_model_refused_zero3);
    if (N == 2) RUN(test_ranks_given_different_directories);
    if (R == 0) rm_tree(ROOT); /* the last test ended in a collective: every rank is done with it */
    accel_thread_cleanup();
    return check_summary();
}
