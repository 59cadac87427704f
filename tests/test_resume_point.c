/* What accel_accelerator_load_state says about where training resumes, with
 * gradient accumulation: `step` is Accelerate's accelerator.step (accumulate's
 * micro-steps, 0 again on an epoch's last batch), `optimizer_steps` the updates
 * applied, the number a training loop calls its global step (issue #22: a
 * resume at accumulation 2 reported step 0, and nothing counted updates), and
 * the line the jsonl log gets where a resumed run starts appending. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"

static char DIR_[64];

typedef struct run {
    accel_accelerator *acc;
    accel_dataset *ds;
    accel_dataloader *dl;
    accel_module *model;
    accel_optimizer *opt;
} run;

static void run_make(run *r) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.gradient_accumulation_steps = 2;
    o.project_dir = DIR_;
    o.automatic_checkpoint_naming = true;
    o.log_with = "jsonl";
    r->acc = accel_accelerator_new(&o);
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = (float)i / 16.0f;
    accel_tensor *f[2] = {accel_from_floats(ACCEL_SHAPE(16, 1), x), accel_from_floats(ACCEL_SHAPE(16, 1), x)};
    r->ds = accel_tensor_dataset_new(2, f);
    r->dl = accel_dataloader_new(r->ds, &(accel_dataloader_opts){.batch_size = 2}); /* 8 batches */
    r->model = accel_linear_new(1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    r->opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, r->model, NULL);
    CHECK_MSG(r->acc && accel_accelerator_prepare(r->acc, r->model, r->opt, r->dl, NULL) == ACCEL_OK, "%s",
              accel_last_error());
    accel_step_reset();
}

static void run_free(run *r) {
    accel_accelerator_free(r->acc);
    accel_optimizer_free(r->opt);
    accel_module_free(r->model);
    accel_dataloader_free(r->dl);
    accel_dataset_free(r->ds);
}

/* n batches of the accumulate loop Accelerate's examples run, each logged
 * with the optimizer's update count as its step. */
static void train(run *r, int n) {
    accel_batch b;
    for (int i = 0; i < n && accel_dataloader_next(r->dl, &b); i++) {
        accel_value v = ACCEL_VALUE_I("batch", b.index);
        CHECK(accel_accelerator_log(r->acc, 1, &v, accel_optimizer_step_count(r->opt)) == ACCEL_OK);
        CHECK(accel_accelerator_accumulate(r->acc) == ACCEL_OK);
        accel_tensor *loss = accel_mse_loss(accel_module_call(r->model, b.fields[0]), b.fields[1]);
        CHECK(accel_accelerator_backward(r->acc, loss) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step(r->acc, r->opt) == ACCEL_OK);
        accel_accelerator_zero_grad(r->acc, r->opt);
        accel_step_reset();
    }
}

static void test_resume_counts(void) {
    run a;
    run_make(&a);
    CHECK(accel_accelerator_init_trackers(a.acc, "proj", 0, NULL) == ACCEL_OK);
    train(&a, 5); /* micro-steps 1..5, updates after 2 and 4 */
    CHECK(accel_accelerator_step(a.acc) == 5 && accel_optimizer_step_count(a.opt) == 2);
    CHECK(accel_accelerator_save_state(a.acc, NULL, NULL, 0) == ACCEL_OK); /* checkpoint_0 */
    train(&a, 3);                                                          /* to the epoch's end */
    CHECK(accel_accelerator_step(a.acc) == 0 && accel_optimizer_step_count(a.opt) == 4);
    CHECK(accel_accelerator_save_state(a.acc, NULL, NULL, 0) == ACCEL_OK); /* checkpoint_1 */
    run_free(&a);

    run b;
    run_make(&b);
    CHECK(accel_accelerator_init_trackers(b.acc, "proj", 0, NULL) == ACCEL_OK);
    char dir[128];
    accel_resume_point at = {-1, -1, -1, -1};
    snprintf(dir, sizeof dir, "%s/checkpoints/checkpoint_0", DIR_);
    CHECK_MSG(accel_accelerator_load_state(b.acc, dir, &at) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(at.epoch == 0 && at.batch == 5 && at.step == 5 && at.optimizer_steps == 2,
              "epoch %lld batch %lld step %lld optimizer_steps %lld", (long long)at.epoch, (long long)at.batch,
              (long long)at.step, (long long)at.optimizer_steps);
    at = (accel_resume_point){-1, -1, -1, -1};
    CHECK(accel_accelerator_load_state(b.acc, NULL, &at) == ACCEL_OK); /* the newest: checkpoint_1 */
    CHECK_MSG(at.step == 0 && at.optimizer_steps == 4, "step %lld optimizer_steps %lld", (long long)at.step,
              (long long)at.optimizer_steps);
    run_free(&b);

    /* load_state before init_trackers: the line comes when the log opens */
    run c;
    run_make(&c);
    CHECK(accel_accelerator_load_state(c.acc, dir, NULL) == ACCEL_OK);
    CHECK(accel_accelerator_init_trackers(c.acc, "proj", 0, NULL) == ACCEL_OK);
    train(&c, 1);
    run_free(&c);

    /* the jsonl log: run a's 8 lines (3 of them past checkpoint_0), then where each resume starts */
    char path[160], text[4096] = "";
    snprintf(path, sizeof path, "%s/proj/log.jsonl", DIR_);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        text[fread(text, 1, sizeof text - 1, f)] = 0;
        fclose(f);
    }
    char want[1024];
    snprintf(want, sizeof want,
             "{\"step\":3,\"batch\":7}\n"
             "{\"resumed_from\":\"%s/checkpoints/checkpoint_0\",\"epoch\":0,\"batch\":5,\"optimizer_steps\":2}\n"
             "{\"resumed_from\":\"%s/checkpoints/checkpoint_1\",\"epoch\":0,\"batch\":8,\"optimizer_steps\":4}\n"
             "{\"resumed_from\":\"%s/checkpoints/checkpoint_0\",\"epoch\":0,\"batch\":5,\"optimizer_steps\":2}\n"
             "{\"step\":2,\"batch\":5}\n",
             DIR_, DIR_, DIR_);
    CHECK_MSG(strstr(text, want) != NULL, "log.jsonl:\n%s", text);
}

/* project_dir "" is the working directory (os.path.join("", "checkpoints") in
 * Accelerate): automatic naming saves to ./checkpoints, never /checkpoints. The
 * load that finds nothing comes first, so a wrong root fails before any write. */
static void test_empty_project_dir_is_cwd(void) {
    char cwd[4096], here[160];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    snprintf(here, sizeof here, "%s/cwd", DIR_);
    CHECK(mkdir(here, 0755) == 0 && chdir(here) == 0);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.project_dir = "";
    o.automatic_checkpoint_naming = true;
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_module *model = accel_linear_new(1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, model, NULL);
    CHECK_MSG(acc && accel_accelerator_prepare(acc, model, opt, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_accelerator_load_state(acc, NULL, NULL) == ACCEL_ERR_IO);
    bool relative = strstr(accel_last_error(), "no complete checkpoint_* in ./checkpoints") != NULL;
    CHECK_MSG(relative, "%s", accel_last_error());
    char saved[256] = "";
    if (relative) {
        CHECK_MSG(accel_accelerator_save_state(acc, NULL, saved, sizeof saved) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(!strcmp(saved, "./checkpoints/checkpoint_0"), "saved to %s", saved);
        CHECK(access("checkpoints/checkpoint_0", F_OK) == 0);
        CHECK_MSG(accel_accelerator_load_state(acc, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    }
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    CHECK(chdir(cwd) == 0);
}

int main(void) {
    snprintf(DIR_, sizeof DIR_, "/tmp/accel_resume_point_XXXXXX");
    if (!mkdtemp(DIR_)) return 2;
    RUN(test_resume_counts);
    RUN(test_empty_project_dir_is_cwd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
    if (system(cmd) != 0) return 2;
    accel_thread_cleanup();
    return check_summary();
}
