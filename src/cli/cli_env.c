/* src/cli/cli_env.c — `accel env`: environment information for bug reports,
 * in the format of `accelerate env`. */
#include <dirent.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "accel/cpu.h"
#include "accel/dist.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/openblas_core.h"
#include "core/cpuinfo.h"
#include "cli/cli.h"
#include "backends/plugin.h"
#include "accelerator/device_pick.h"

static const cli_opt OPTS[] = {
    {"config_file", 0, true, "CONFIG_FILE", "The config file to report (default: the accelerate cache)."},
    {"measure_gemm", 0, false, NULL,
     "Time the GEMM providers again on the classes cached so far and a Llama step's shapes (f32 and bf16), and "
     "cache the choices."},
};

/* `accel env --measure-gemm`: every class of the cache again, and the
 * GEMMs of a Llama step (hidden 512, ffn 1536, vocab 8192, 2048 tokens:
 * bench/bench_matmul.c's shapes) in f32 and bf16: forward NT and dX NN of
 * each weight (weight GEMMs), dW TN, and its attention's tiles (256 keys,
 * head dim 64) (a dtype with one candidate is not timed). */
static void measure_gemm(void) {
    static const accel_dtype DT[] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    accel__gemm_class cls[256];
    int n = accel__gemm_choice_classes(omp_get_max_threads(), cls, 256);
    for (int i = 0; i < n; i++) {
        if (cls[i].op != ACCEL__GEMM_OP_SDPA_TILES) {
            accel__gemm_measure(DT[cls[i].dt], cls[i].ta, cls[i].tb, cls[i].rows ? cls[i].rows : 1ll << cls[i].m,
                                1ll << cls[i].n, 1ll << cls[i].k, cls[i].op == ACCEL__GEMM_OP_WEIGHT);
        } else if (accel__cpu_sdpa_measure(DT[cls[i].dt], 1ll << cls[i].n, 1ll << cls[i].k) < 0) {
            /* a class of a hand-edited file, too large for any memory */
            fprintf(stderr, "accel env: a cached class not timed again: %s\n", accel_last_error());
            accel_clear_error();
        }
    }
    static const int64_t W[][2] = {{512, 512}, {1536, 512}, {512, 1536}, {8192, 512}}; /* [out, in] */
    const int64_t T = 2048;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof W / sizeof W[0]; i++) {
            int64_t out = W[i][0], in = W[i][1];
            accel__gemm_measure(DT[d], false, true, T, out, in, true);  /* Y = X W^T */
            accel__gemm_measure(DT[d], false, false, T, in, out, true); /* dX = dY W */
            accel__gemm_measure(DT[d], true, false, out, in, T, false); /* dW = dY^T X */
        }
    for (int d = 0; d < 2; d++) accel__cpu_sdpa_measure(DT[d], 256, 64);
}

/* Entries of directory `dir` named prefix + digits (any name when prefix is NULL). */
static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (!prefix) {
            n++;
            continue;
        }
        size_t pl = strlen(prefix);
        const char *rest = e->d_name + pl;
        if (!strncmp(e->d_name, prefix, pl) && *rest && strspn(rest, "0123456789") == strlen(rest)) n++;
    }
    closedir(d);
    return n;
}

bool cli_machine_gpus(char *what, size_t n) {
    int nvidia = count_entries("/proc/driver/nvidia/gpus", NULL);
    if (!nvidia) nvidia = count_entries("/dev", "nvidia");
    if (nvidia) {
        snprintf(what, n, "%d NVIDIA", nvidia);
        return true;
    }
    if (access("/dev/kfd", F_OK) == 0) {
        snprintf(what, n, "AMD (/dev/kfd)");
        return true;
    }
    snprintf(what, n, "none found (looked for /proc/driver/nvidia/gpus, /dev/nvidia*, /dev/kfd)");
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

/* A describe function's text (size: its buffer's) as this report's lines:
 * "- line", an indented one ("  line") as "\tline". A last line without its
 * newline was cut at the buffer's end: printed, and said to be cut. */
static void print_lines(const char *text, size_t size) {
    for (const char *line = text, *end; *line; line = *end ? end + 1 : end) {
        end = line + strcspn(line, "\n");
        int sub = line[0] == ' ' && line[1] == ' ' ? 2 : 0;
        printf("%s%.*s\n", sub ? "\t" : "- ", (int)(end - line - sub), line + sub);
        if (!*end) printf("\t(cut at %zu bytes)\n", size - 1);
    }
}

int accel_cli_env(int argc, char **argv) {
    const char *v[2] = {NULL, NULL};
    int first;
    int r = cli_parse("accel env [--config_file CONFIG_FILE] [--measure-gemm]",
                      "Print information about this build and machine.", OPTS, 2, argc, argv, v, &first, false);
    if (r == CLI_HELP) return 0;
    if (r == CLI_ERROR) return 2;
    /* A config named on the command line must be a file there, as Accelerate's
     * env requires (os.path.isfile: a directory is not one): "Not found"
     * reported a mistyped name as no config at all. */
    struct stat cs;
    if (v[0] && (stat(v[0], &cs) != 0 || !S_ISREG(cs.st_mode))) {
        char err[2048];
        cfg_read(v[0], err, sizeof err);
        fprintf(stderr, "accel env: error: %s\n", err);
        return 1;
    }
    struct utsname u;
    uname(&u);
    char self[PATH_MAX] = "unknown";
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl > 0) self[sl] = 0;
    char mpi[256], model[256], gpus[128];
    first_line("mpirun --version 2>/dev/null", mpi, sizeof mpi);
    cpu_model(model, sizeof model);
    cli_machine_gpus(gpus, sizeof gpus);
    bool mpi_backend = strstr(accel_build_info(ACCEL_INFO_DIST_BACKENDS), "mpi") != NULL;
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
    char core[512];
    printf("- %s\n", accel__openblas_core_describe(core, sizeof core));
    printf("- Distributed backends: %s\n", accel_build_info(ACCEL_INFO_DIST_BACKENDS));
    /* What accel can use, not what happens to be installed: a loadable
     * libcudart is no CUDA support when the build has no CUDA backend. */
    if (mpi_backend && mpi[0]) printf("- MPI available: True (%s)\n", mpi);
    else if (mpi_backend) printf("- MPI available: False (built with MPI, but no mpirun on PATH)\n");
    else printf("- MPI available: False (this build has no MPI backend)\n");
    accel__plugins_describe(stdout); /* what each device plug-in finds, or why it did not load */
    /* what an accelerator made here would run on (local rank 0, default options) */
    accel_device dev;
    char dev_name[32];
    if (accel__accelerator_device(0, &dev) == ACCEL_OK) {
        const char *name = dev.type == ACCEL_DEV_CPU ? "CPU" : accel_device_str(dev, dev_name, sizeof dev_name);
        printf("- Accel accelerator: %s\n", name);
    } else {
        printf("- Accel accelerator: none (%s)\n", accel_last_error());
        accel_clear_error();
    }
    printf("- GPUs on this machine: %s\n", gpus);
    const accel_cpu_info *ci = accel_cpu_info_get();
    if (ci->family) printf("- CPU: %s (%ld cores; family %u model %u stepping %u)\n", model,
                           sysconf(_SC_NPROCESSORS_ONLN), ci->family, ci->model_number, ci->stepping);
    else printf("- CPU: %s (%ld cores)\n", model, sysconf(_SC_NPROCESSORS_ONLN));
    char isa[256];
    printf("- ISA: %s\n", accel_cpu_isa_string(isa, sizeof isa));
    if (accel__cpu_isa_check() != ACCEL_OK) printf("- ISA cap: refused (%s)\n", accel_last_error());
    else if (accel__cpu_isa_cap() != ACCEL__CPU_ISA_NONE)
        printf("- ISA cap: %s (ACCEL_CPU_ISA; the features above are what it leaves)\n",
               accel__cpu_isa_cap_name(accel__cpu_isa_cap()));
    printf("- CPU kernels: %s\n", accel_cpu_kernels());
    char gemm[2048];
    print_lines(accel__gemm_describe(gemm, sizeof gemm), sizeof gemm); /* "GEMM f32: ...\n" per dtype */
    char conv[512];
    print_lines(accel__cpu_conv_describe(conv, sizeof conv), sizeof conv); /* "Conv: ...\n" */
    if (v[1]) measure_gemm();
    /* "GEMM choices: ...\n  <class>: ...\n": room for a full table (256
     * classes of ~100 characters) */
    static char choices[1 << 16];
    print_lines(accel__gemm_choices_describe(choices, sizeof choices), sizeof choices);
    printf("- System RAM: %.2f GB\n", ram_gb);
    char path[4096], err[2048];
    if (v[0]) snprintf(path, sizeof path, "%s", v[0]);
    else (void)cfg_default_path(path, sizeof path, err, sizeof err); /* none: no default config to show */
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
        char mesh[1024];
        if (cfg_describe_mesh(c, mesh, sizeof mesh)) printf("\t- mesh: %s\n", mesh);
    } else if (c || access(path, F_OK) == 0) {
        printf("\tInvalid: %s\n", err);
    } else {
        printf("\tNot found\n");
    }
    cv_free(c);
    return 0;
}
