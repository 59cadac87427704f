/* src/cli/cli_test.c — `accel test [--config_file F]`: launches a self-check
 * on the processes the config asks for (as `accelerate test` runs its
 * test_script.py) and reports success or the failing command.
 *
 * The payload is this same binary (`accel test --payload`), run by
 * `accel launch`: it checks the process state, collectives (gather, reduce,
 * broadcast, pad, split) with Accelerate's test_ops values, main_process_first,
 * and that data-parallel training equals single-process training. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "cli/cli.h"

static int failures;

#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "[rank %d] check failed: ", accel_dist_rank());     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "%s%s\n", accel_last_error()[0] ? ": " : "", accel_last_error()); \
            accel_clear_error();                                                \
        }                                                                       \
    } while (0)

static bool values_are(accel_tensor *t, int64_t n, const double *want) {
    if (!t || accel_numel(t) != n) return false;
    for (int64_t i = 0; i < n; i++)
        if (fabs(accel_get(t, &i) - want[i]) > 1e-6) return false;
    return true;
}

/* test_ops.py: t_r = arange(N) + 1 + N*r on rank r. */
static void check_collectives(accel_accelerator *acc) {
    int N = accel_accelerator_num_processes(acc), r = accel_accelerator_process_index(acc);
    accel_tensor *t = accel_arange(ACCEL_F32, 1 + (int64_t)N * r, 1 + (int64_t)N * r + N);
    double want[64];
    for (int i = 0; i < N * N && i < 64; i++) want[i] = i + 1;
    EXPECT(values_are(accel_accelerator_gather(acc, t), (int64_t)N * N, want), "gather != [1..N^2]");
    EXPECT(values_are(accel_accelerator_broadcast(acc, t, 0), N, want), "broadcast != rank 0's [1..N]");
    double sum[16], mean[16], max[16];
    for (int i = 0; i < N && i < 16; i++) {
        sum[i] = 0;
        for (int k = 0; k < N; k++) sum[i] += 1 + N * k + i;
        mean[i] = sum[i] / N;
        max[i] = 1 + N * (N - 1) + i;
    }
    EXPECT(values_are(accel_accelerator_reduce(acc, t, "sum", 1.0), N, sum), "reduce sum");
    EXPECT(values_are(accel_accelerator_reduce(acc, t, "mean", 1.0), N, mean), "reduce mean");
    EXPECT(values_are(accel_accelerator_reduce(acc, t, "max", 1.0), N, max), "reduce max");
    accel_tensor *p = accel_arange(ACCEL_F32, 0, r == 0 ? N + 1 : N);
    accel_tensor *padded = accel_accelerator_pad_across_processes(acc, p, 0, 0, false);
    EXPECT(padded && padded->shape[0] == N + 1, "pad_across_processes shape != [N+1]");
    /* split_between_processes of 2N+1 items covers them exactly once, in order. */
    accel_process_split s = accel_accelerator_split_between_processes(acc, 2 * (int64_t)N + 1);
    accel_tensor *mine = accel_full(ACCEL_I64, ACCEL_SHAPE(1), (double)(s.end - s.start));
    accel_tensor *counts = accel_accelerator_gather(acc, mine);
    int64_t total = 0;
    for (int64_t i = 0; counts && i < N; i++) total += (int64_t)accel_get(counts, &i);
    EXPECT(total == 2 * (int64_t)N + 1, "split_between_processes covers %lld of %d items",
           (long long)total, 2 * N + 1);
    accel_step_reset();
}

/* main_process_first: rank 0 writes its line before anyone else, into a
 * file of a directory the main process makes for this run alone (mkdtemp
 * under $TMPDIR, else /tmp) and broadcasts: a fixed name in /tmp was shared
 * by two runs at once (each removing the other's file) and, opened for
 * append, followed whatever link another user put there. */
static void check_main_process_first(accel_accelerator *acc) {
    bool main = accel_accelerator_is_main_process(acc);
    const char *tmp = getenv("TMPDIR");
    char dir[4096] = "", path[4200];
    if (main) { /* (a $TMPDIR so long that the name is cut leaves no XXXXXX: EINVAL) */
        snprintf(dir, sizeof dir, "%s/accel_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            EXPECT(false, "main_process_first: cannot make a scratch directory %s: %s", dir, strerror(errno));
            dir[0] = 0;
        }
    }
    void *name = dir;
    size_t len = strlen(dir) + 1;
    if (accel_accelerator_broadcast_object(acc, &name, &len, 0) != ACCEL_OK || !len || ((char *)name)[len - 1]) {
        EXPECT(false, "main_process_first: the scratch directory's name did not reach every process");
        if (name != dir) accel_free(name);
        return;
    }
    bool made = *(char *)name != 0; /* else the main process could not make it: said there */
    snprintf(path, sizeof path, "%s/order", (char *)name);
    if (name != dir) accel_free(name);
    if (!made) return;
    accel_accelerator_main_process_first_begin(acc);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    const char *line = main ? "Currently in the main process\n" : "Now on another process\n";
    EXPECT(fd >= 0 && write(fd, line, strlen(line)) == (ssize_t)strlen(line), "main_process_first: cannot write %s: %s",
           path, strerror(errno));
    if (fd >= 0) close(fd);
    accel_accelerator_main_process_first_end(acc);
    accel_accelerator_wait_for_everyone(acc);
    if (main) {
        char first[64] = "";
        FILE *f = fopen(path, "r");
        if (f && !fgets(first, sizeof first, f)) first[0] = '\0';
        if (f) fclose(f);
        EXPECT(strcmp(first, "Currently in the main process\n") == 0, "main_process_first: main did not go first");
        unlink(path);
        rmdir(dir);
    }
}

/* y = 2x + 3 on 32N points, per-process batch 8 (DDP) vs one process with
 * batch 8N on the same data in the same order: the weights must agree. */
static void check_training(accel_accelerator *acc) {
    int N = accel_accelerator_num_processes(acc);
    int64_t n = 32 * (int64_t)N;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)i / (float)n - 0.5f;
        y[i] = 2.0f * x[i] + 3.0f;
    }
    accel_tensor *f[2] = {accel_from_floats(ACCEL_SHAPE(n, 1), x), accel_from_floats(ACCEL_SHAPE(n, 1), y)};
    accel_dataset *ds = accel_tensor_dataset_new(2, f);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 8;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    o.batch_size = 8 * N;
    accel_dataloader *ref_dl = accel_dataloader_new(ds, &o);
    accel_manual_seed(7);
    accel_module *model = accel_linear_new(1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_manual_seed(7);
    accel_module *ref = accel_linear_new(1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor **ps, **rps;
    int np = accel_module_parameters(model, &ps), nr = accel_module_parameters(ref, &rps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, np, ps, &h);
    accel_optimizer *ref_opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, nr, rps, &h);
    accel_step_reset();
    EXPECT(accel_accelerator_prepare(acc, model, opt, dl, NULL) == ACCEL_OK, "prepare");
    accel_batch b;
    while (accel_dataloader_next(dl, &b)) {
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, b.fields[0]), b.fields[1]);
        EXPECT(accel_accelerator_backward(acc, loss) == ACCEL_OK, "backward");
        EXPECT(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "optimizer step");
        accel_accelerator_zero_grad(acc, opt);
        accel_step_reset();
    }
    while (accel_dataloader_next(ref_dl, &b)) {
        accel_tensor *loss = accel_mse_loss(accel_module_call(ref, b.fields[0]), b.fields[1]);
        EXPECT(accel_backward(loss) == ACCEL_OK, "reference backward");
        accel_optimizer_step(ref_opt);
        accel_optimizer_zero_grad(ref_opt);
        accel_step_reset();
    }
    for (int i = 0; i < np && i < nr; i++) {
        float a = ((float *)ps[i]->data)[0], e = ((float *)rps[i]->data)[0];
        EXPECT(fabsf(a - e) <= 1e-5f * (1 + fabsf(e)), "training: %s is %.7f on %d processes, %.7f on one",
               i ? "bias" : "weight", a, N, e);
    }
    EXPECT(accel_accelerator_clear(acc) == ACCEL_OK, "clear");
    accel_free(ps);
    accel_free(rps);
    accel_optimizer_free(opt);
    accel_optimizer_free(ref_opt);
    accel_module_free(model);
    accel_module_free(ref);
    accel_dataloader_free(dl);
    accel_dataloader_free(ref_dl);
    accel_dataset_free(ds);
    free(x);
    free(y);
}

static int run_payload(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, "accel test: %s\n", accel_last_error());
        return 1;
    }
    char desc[4096]; /* the GEMM and CPU lines run to ~1.5 KB */
    accel_accelerator_print(acc, "%s", accel_accelerator_describe(acc, desc, sizeof desc));
    check_collectives(acc);
    check_main_process_first(acc);
    check_training(acc);
    /* Every rank learns whether any rank failed, so all exit alike. */
    accel_tensor *bad = accel_full(ACCEL_F32, ACCEL_SHAPE(1), failures);
    accel_tensor *any = accel_accelerator_reduce(acc, bad, "sum", 1.0);
    int total = any ? (int)accel_item(any) : 1;
    if (total == 0) accel_accelerator_print(acc, "All checks passed on %d process(es).\n",
                                            accel_accelerator_num_processes(acc));
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_thread_cleanup();
    return total ? 1 : 0;
}

int accel_cli_test(int argc, char **argv) {
    static const cli_opt OPTS[] = {
        {"config_file", 0, true, "CONFIG_FILE",
         "The config file to use for the default values in the launching script."},
        {"payload", 0, false, NULL, "(internal) run the checks in this process"},
    };
    enum { NOPTS = sizeof OPTS / sizeof *OPTS };
    const char *vals[NOPTS] = {0};
    int first = 0;
    int rc = cli_parse("accel test [-h] [--config_file CONFIG_FILE]",
                       "Runs a short distributed self-check with the given (or default) config.", OPTS,
                       NOPTS, argc, argv, vals, &first, false);
    if (rc == CLI_HELP) return 0;
    if (rc != CLI_OK) return 2;
    if (vals[cli_idx(OPTS, NOPTS, "payload")]) return run_payload();

    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "accel test: cannot find the accel binary (/proc/self/exe)\n");
        return 1;
    }
    self[len] = '\0';
    const char *cfg = vals[cli_idx(OPTS, NOPTS, "config_file")];
    char *args[8];
    int k = 0;
    args[k++] = self;
    args[k++] = "launch";
    if (cfg) {
        args[k++] = "--config_file";
        args[k++] = (char *)cfg;
    }
    args[k++] = self;
    args[k++] = "test";
    args[k++] = "--payload";
    args[k] = NULL;
    char cmd[8192] = "";
    for (int i = 0; i < k; i++) {
        strncat(cmd, args[i], sizeof cmd - strlen(cmd) - 2);
        if (i + 1 < k) strcat(cmd, " ");
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("accel test: fork");
        return 1;
    }
    if (pid == 0) {
        execv(self, args);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            perror("accel test: waitpid");
            return 1;
        }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0) {
        printf("Test is a success! You are ready for your distributed training!\n");
        return 0;
    }
    fprintf(stderr, "accel test: '%s' failed with returncode %d\n", cmd, code);
    return 1;
}
