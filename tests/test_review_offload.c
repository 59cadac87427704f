/* The outside review of ZeRO-Offload to nvme (src/optim/offload.c, the
 * shard file of src/accelerator/zero3.c), one test each (every one failed
 * before its fix):
 *   a rank killed while training (SIGKILL: the OOM killer, a preempted node,
 *     a peer's failure under --max_restarts) left its optimizer state file
 *     and its parameter shard file under nvme_path, as large as the state,
 *     and every restart left more: the files are now unlinked as soon as
 *     they are created, so the kernel frees their space with the process;
 *   files already under nvme_path with the names the swap files would take
 *     (rank, pid and a per-process serial: anyone sharing the directory can
 *     guess them) made prepare fail ("File exists"); the names now end in
 *     random characters (mkostemps), which also keeps two threads' files
 *     apart (the serial was a plain static counter).
 * What held is tested too: two accelerators offloading into one directory at
 * once, freed in either order, each training as it would alone. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"
#include "params_host.h"

static char DIR_[256];
static char SELF[4096];

/* Entries of dir other than . and .. */
static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    return n;
}

static accel_accelerator *nvme_accelerator(int stage, const char *dir) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.zero_stage = stage;
    o.offload_optimizer_device = "nvme";
    o.offload_optimizer_nvme_path = dir;
    if (stage == 3) {
        o.offload_param_device = "nvme";
        o.offload_param_nvme_path = dir;
    }
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    return acc;
}

static accel_module *mlp(uint64_t seed) {
    accel_manual_seed(seed);
    accel_module *l[3] = {accel_linear_new(8, 32, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(32, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

static accel_optimizer *adamw(accel_module *m) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    return accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
}

/* One step of m on batch s through acc (NULL: no accelerator); its loss. */
static double step(accel_accelerator *acc, accel_module *m, accel_optimizer *o, int s) {
    float x[4 * 8], y[4];
    for (int i = 0; i < 4 * 8; i++) x[i] = (float)(((s * 7 + i * 3) % 11) / 11.0 - 0.5);
    for (int i = 0; i < 4; i++) y[i] = (float)((s + i) % 5) * 0.2f - 0.4f;
    accel_tensor *loss = accel_mse_loss(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(4, 8), x)),
                                        accel_from_floats(ACCEL_SHAPE(4, 1), y));
    CHECK(loss != NULL);
    double l = loss ? accel_item(loss) : NAN;
    CHECK_MSG((acc ? accel_accelerator_backward(acc, loss) : accel_backward(loss)) == ACCEL_OK, "%s",
              accel_last_error());
    CHECK_MSG((acc ? accel_accelerator_optimizer_step(acc, o) : accel_optimizer_step(o)) == ACCEL_OK, "%s",
              accel_last_error());
    CHECK((acc ? accel_accelerator_zero_grad(acc, o) : accel_optimizer_zero_grad(o)) == ACCEL_OK);
    accel_step_reset();
    return l;
}

/* "child STAGE DIR": prepares under nvme offload into DIR, steps once, says
 * so on stdout and waits to be killed. */
static int child(int stage, const char *dir) {
    accel_accelerator *acc = nvme_accelerator(stage, dir);
    accel_module *m = mlp(3);
    accel_optimizer *o = adamw(m);
    if (!acc || accel_accelerator_prepare(acc, m, o, NULL, NULL) != ACCEL_OK) return 1;
    step(acc, m, o, 0);
    printf("stepped %d\n", entries(dir) >= 0);
    fflush(stdout);
    pause();
    return 0;
}

/* A rank killed mid-training (stage 2: the optimizer state file; stage 3:
 * and the parameter shard file) leaves nothing under nvme_path. */
static void killed_leaves_nothing(int stage) {
    char dir[300], st[8];
    snprintf(dir, sizeof dir, "%s/killed%d", DIR_, stage);
    snprintf(st, sizeof st, "%d", stage);
    CHECK(mkdir(dir, 0700) == 0);
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        execl(SELF, SELF, "child", st, dir, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char line[64] = "";
    ssize_t n = read(p[0], line, sizeof line - 1);
    close(p[0]);
    CHECK_MSG(n > 0 && !strncmp(line, "stepped", 7), "stage %d: the child did not step (%s)", stage, line);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CHECK_MSG(entries(dir) == 0, "stage %d: a rank killed mid-training left %d file(s) under nvme_path %s", stage,
              entries(dir), dir);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void test_killed_rank_leaves_no_files(void) {
    killed_leaves_nothing(2);
    killed_leaves_nothing(3);
}

/* Two accelerators at once, both offloading into DIR_ (stage 3 and stage 2):
 * each trains as a plain run does, loss for loss and (read after clear:
 * stage 3's parameters read zeros between steps) weight for weight, bit for
 * bit; they are freed in either order. */
static void test_two_accelerators_one_dir(void) {
    enum { STEPS = 4 };
    float want[2][512], got[512];
    double want_loss[2][STEPS];
    int64_t nw = 0;
    for (int k = 0; k < 2; k++) { /* the plain runs: seeds 3 and 4 */
        accel_module *m = mlp(3 + (uint64_t)k);
        accel_optimizer *o = adamw(m);
        for (int s = 0; s < STEPS; s++) want_loss[k][s] = step(NULL, m, o, s + k);
        nw = params_to_host(m, want[k], 512);
        accel_optimizer_free(o);
        accel_module_free(m);
    }
    for (int order = 0; order < 2; order++) {
        accel_accelerator *acc[2] = {nvme_accelerator(3, DIR_), nvme_accelerator(2, DIR_)};
        accel_module *m[2];
        accel_optimizer *o[2];
        for (int k = 0; k < 2; k++) {
            m[k] = mlp(3 + (uint64_t)k);
            o[k] = adamw(m[k]);
            CHECK_MSG(acc[k] && accel_accelerator_prepare(acc[k], m[k], o[k], NULL, NULL) == ACCEL_OK, "%s",
                      accel_last_error());
        }
        CHECK(entries(DIR_) == 0); /* unlinked as created */
        for (int s = 0; s < STEPS; s++) /* interleaved */
            for (int k = 0; k < 2; k++) {
                double l = step(acc[k], m[k], o[k], s + k);
                CHECK_MSG(l == want_loss[k][s], "order %d, accelerator %d, step %d: loss %.9g, plain %.9g", order, k,
                          s, l, want_loss[k][s]);
            }
        if (order == 0) { /* un-prepared, then the weights; the accelerators first */
            for (int k = 0; k < 2; k++) {
                CHECK_MSG(accel_accelerator_clear(acc[k]) == ACCEL_OK, "%s", accel_last_error());
                CHECK(params_to_host(m[k], got, 512) == nw);
                CHECK_MSG(!memcmp(got, want[k], (size_t)nw * sizeof(float)), "accelerator %d's weights differ", k);
                accel_accelerator_free(acc[k]);
            }
        }
        for (int k = 0; k < 2; k++) { /* order 1: the optimizers and modules while prepared, in reverse */
            int j = order ? 1 - k : k;
            accel_optimizer_free(o[j]);
            accel_module_free(m[j]);
        }
        for (int k = 0; k < 2 && order; k++) accel_accelerator_free(acc[k]);
    }
}

/* Files under nvme_path that have the names the swap files would take
 * (<prefix>_rank0_<pid>_<n>.swp: anyone sharing the directory can make
 * them): prepare still works, and those files keep their bytes. */
static void test_names_taken_in_advance(void) {
    char path[400];
    const char *prefix[2] = {"accel_optimizer_state", "accel_param_shard"};
    for (int k = 0; k < 2; k++)
        for (int n = 0; n < 200; n++) {
            snprintf(path, sizeof path, "%s/%s_rank0_%d_%d.swp", DIR_, prefix[k], (int)getpid(), n);
            FILE *f = fopen(path, "w");
            CHECK(f != NULL);
            if (f) fputs("user data", f), fclose(f);
        }
    accel_accelerator *acc = nvme_accelerator(3, DIR_);
    accel_module *m = mlp(3);
    accel_optimizer *o = adamw(m);
    CHECK_MSG(acc && accel_accelerator_prepare(acc, m, o, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    step(acc, m, o, 0);
    accel_accelerator_free(acc);
    accel_optimizer_free(o);
    accel_module_free(m);
    CHECK(entries(DIR_) == 400);
    for (int k = 0; k < 2; k++)
        for (int n = 0; n < 200; n++) {
            snprintf(path, sizeof path, "%s/%s_rank0_%d_%d.swp", DIR_, prefix[k], (int)getpid(), n);
            char buf[32] = "";
            FILE *f = fopen(path, "r");
            if (f) buf[fread(buf, 1, sizeof buf - 1, f)] = 0, fclose(f);
            CHECK_MSG(!strcmp(buf, "user data"), "%s now holds \"%s\"", path, buf);
            unlink(path);
        }
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "child")) return child(atoi(argv[2]), argv[3]);
    ssize_t n = readlink("/proc/self/exe", SELF, sizeof SELF - 1);
    SELF[n > 0 ? n : 0] = 0;
    snprintf(DIR_, sizeof DIR_, "/tmp/accel_review_offload_XXXXXX");
    CHECK(mkdtemp(DIR_) != NULL);
    RUN(test_killed_rank_leaves_no_files);
    RUN(test_two_accelerators_one_dir);
    RUN(test_names_taken_in_advance);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
    CHECK(system(cmd) == 0);
    accel_thread_cleanup();
    return check_summary();
}
