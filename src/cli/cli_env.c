/* src/cli/cli_env.c — `accel env`: environment information for bug reports,
 * in the format of `accelerate env`. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "accel/dist.h"
#include "cli/cli.h"
#ifdef ACCEL_HAVE_CUDA
#include "backends/cuda/cuda_env.h"
#endif

static const cli_opt OPTS[] = {
    {"config_file", 0, true, "CONFIG_FILE", "The config file to report (default: the accelerate cache)."},
};

static bool loadable(const char *const *names, char *which, size_t n) {
    for (; *names; names++) {
        void *h = dlopen(*names, RTLD_LAZY | RTLD_LOCAL);
        if (h) {
            snprintf(which, n, "%s", *names);
            dlclose(h);
            return true;
        }
    }
    return false;
}

/* First line of `cmd` output, or "" */
static void first_line(const char *cmd, char *out, size_t n) {
    out[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (fgets(out, (int)n, p)) out[strcspn(out, "\n")] = 0;
    char sink[256];
    while (fgets(sink, sizeof sink, p)) {}
    pclose(p);
}

static void cpu_model(char *out, size_t n) {
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            char *v = strchr(line, ':') + 2;
            v[strcspn(v, "\n")] = 0;
            snprintf(out, n, "%s", v);
            break;
        }
    fclose(f);
}

int accel_cli_env(int argc, char **argv) {
    const char *v[1];
    int first;
    int r = cli_parse("accel env [--config_file CONFIG_FILE]", "Print information about this build and machine.", OPTS,
                      1, argc, argv, v, &first, false);
    if (r == CLI_HELP) return 0;
    if (r == CLI_ERROR) return 2;
    struct utsname u;
    uname(&u);
    char self[PATH_MAX] = "unknown";
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl > 0) self[sl] = 0;
    char mpi[256], model[256], cuda[128], nccl[128];
    first_line("mpirun --version 2>/dev/null", mpi, sizeof mpi);
    cpu_model(model, sizeof model);
    static const char *const CUDA[] = {"libcudart.so", "libcudart.so.12", "libcudart.so.11.0", NULL};
    static const char *const NCCL[] = {"libnccl.so", "libnccl.so.2", NULL};
    bool has_cuda = loadable(CUDA, cuda, sizeof cuda), has_nccl = loadable(NCCL, nccl, sizeof nccl);
    struct sysinfo si;
    sysinfo(&si);
    double ram_gb = (double)si.totalram * si.mem_unit / (1024.0 * 1024.0 * 1024.0);
    printf("\nCopy-and-paste the text below in your GitHub issue\n\n");
    printf("- `Accel` version: %s\n", accel_build_info(ACCEL_INFO_VERSION));
    printf("- Platform: %s-%s-%s\n", u.sysname, u.release, u.machine);
    printf("- `accel` bash location: %s\n", self);
    printf("- Compiler: %s\n", accel_build_info(ACCEL_INFO_COMPILER));
    printf("- Build flags: %s\n", accel_build_info(ACCEL_INFO_FLAGS));
    printf("- BLAS: %s\n", accel_build_info(ACCEL_INFO_BLAS));
    printf("- BLAS threads: %s\n", accel_build_info(ACCEL_INFO_BLAS_THREADS));
    printf("- Distributed backends: %s\n", accel_build_info(ACCEL_INFO_DIST_BACKENDS));
    printf("- MPI available: %s%s%s\n", mpi[0] ? "True (" : "False", mpi, mpi[0] ? ")" : "");
#ifdef ACCEL_HAVE_CUDA
    accel__cuda_env_print(stdout); /* what the backend finds, not which libraries load */
    (void)has_cuda, (void)has_nccl;
#else
    printf("- CUDA available: %s%s%s\n", has_cuda ? "True (" : "False", has_cuda ? cuda : "", has_cuda ? ")" : "");
    printf("- NCCL available: %s%s%s\n", has_nccl ? "True (" : "False", has_nccl ? nccl : "", has_nccl ? ")" : "");
#endif
    printf("- Accel accelerator: CPU\n");
    printf("- CPU: %s (%ld cores)\n", model, sysconf(_SC_NPROCESSORS_ONLN));
    printf("- System RAM: %.2f GB\n", ram_gb);
    char path[4096], err[2048];
    if (v[0]) snprintf(path, sizeof path, "%s", v[0]);
    else cfg_default_path(path, sizeof path);
    printf("- `Accel` %s:\n", v[0] ? "config passed" : "default config");
    cv *c = access(path, F_OK) == 0 ? cfg_read(path, err, sizeof err) : NULL;
    if (c && cfg_normalize(c, path, err, sizeof err)) {
        char val[2048];
        for (size_t i = 0; i < c->n; i++) {
            const cv *x = c->items[i];
            if (x->t == CV_NULL || (x->t == CV_MAP && x->n == 0)) continue;
            cv_repr(x, true, val, sizeof val);
            printf("\t- %s: %s\n", c->keys[i], val);
        }
    } else if (c || access(path, F_OK) == 0) {
        printf("\tInvalid: %s\n", err);
    } else {
        printf("\tNot found\n");
    }
    cv_free(c);
    return 0;
}
