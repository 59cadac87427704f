/* src/cli/cli_estimate_memory.c — `accel estimate-memory MODEL` (accelerate.md §1.7).
 *
 * MODEL is a local directory holding config.json or a config.json path (no Hub
 * access here). The model is built on the meta device (no weight memory) and
 * measured with calculate_maximum_sizes (no_split: LlamaDecoderLayer); the
 * table is Accelerate's create_ascii_table, sizes formatted by convert_bytes.
 * accel's addition: --num_processes N adds the per-rank training memory of
 * each sharding strategy (docs/accelerator.md "Memory per rank"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/bigmodel.h"
#include "accel/io.h"
#include "cli/cli.h"

static const char *const DTYPES[] = {"float32", "float16", "int8", "int4"};

static void usage(FILE *f) {
    fprintf(f, "usage: accel estimate-memory [-h] [--library_name {timm,transformers}]\n"
               "                             [--dtypes {float32,float16,int8,int4} [{float32,float16,int8,int4} ...]]\n"
               "                             [--trust_remote_code] [--num_processes N]\n"
               "                             model_name\n\n"
               "Model size estimator for fitting a model onto device memory. model_name is a local\n"
               "directory with a config.json (or the config.json itself). --num_processes N adds\n"
               "the per-rank memory of training with Adam under NO_SHARD, SHARD_GRAD_OP and FULL_SHARD.\n");
}

/* convert_bytes: powers of 1024, f"{round(size, 2)} {unit}" (Python prints a
 * rounded float with at least one decimal, an int without). */
static void convert_bytes(double size, bool is_int, char *out, size_t n) {
    static const char *units[] = {"bytes", "KB", "MB", "GB", "TB"};
    for (int u = 0; u < 5; u++) {
        if (size < 1024.0) {
            if (is_int && u == 0) {
                snprintf(out, n, "%lld %s", (long long)size, units[u]);
                return;
            }
            char num[64];
            snprintf(num, sizeof num, "%.2f", size);
            size_t l = strlen(num);
            if (num[l - 1] == '0') num[--l] = 0;
            if (num[l - 1] == '0' && num[l - 2] != '.') num[--l] = 0;
            snprintf(out, n, "%s %s", num, units[u]);
            return;
        }
        size /= 1024.0;
        is_int = false;
    }
    snprintf(out, n, "%.2f PB", size);
}

/* str.center(width): CPython puts the odd space left when width is odd. */
static void put_centered(const char *s, int width) {
    int len = (int)strlen(s), marg = width - len;
    if (marg <= 0) {
        fputs(s, stdout);
        return;
    }
    int left = marg / 2 + (marg & width & 1);
    printf("%*s%s%*s", left, "", s, marg - left, "");
}

static void rule(int n) {
    for (int i = 0; i < n; i++) fputs("─", stdout);
}

static void make_row(const char *l, const char *mid, const char *r, const int *w, int nc, int diff) {
    fputs(l, stdout);
    for (int i = 0; i < nc; i++) {
        if (i) fputs(mid, stdout);
        rule(w[i]);
    }
    rule(diff);
    fputs(r, stdout);
    fputs("\n", stdout);
}

static void print_table(const char *title, const char *headers[4], char rows[][4][32], int nr) {
    int w[4], nc = 4, sum = 0;
    for (int c = 0; c < nc; c++) {
        w[c] = (int)strlen(headers[c]);
        for (int r = 0; r < nr; r++)
            if ((int)strlen(rows[r][c]) > w[c]) w[c] = (int)strlen(rows[r][c]);
        sum += w[c];
    }
    int diff = 0, sep_len = sum + nc + 1, tl = (int)strlen(title);
    if (tl > sum) {
        diff = abs(tl - sep_len);
        w[nc - 1] += diff;
    }
    int sep2 = sum + (tl > sum ? diff : 0) + diff + nc + 1;
    make_row("┌", "─", "┐", w, nc, diff);
    fputs("│", stdout);
    put_centered(title, sep2 - 2);
    fputs("│\n", stdout);
    make_row("├", "┬", "┤", w, nc, diff);
    int sepw[4];
    memcpy(sepw, w, sizeof w);
    w[nc - 1] += diff;
    fputs("│", stdout);
    for (int c = 0; c < nc; c++) {
        put_centered(headers[c], w[c]);
        fputs("│", stdout);
    }
    fputs("\n", stdout);
    make_row("├", "┼", "┤", sepw, nc, diff);
    for (int r = 0; r < nr; r++) {
        fputs("│", stdout);
        for (int c = 0; c < nc; c++) {
            put_centered(rows[r][c], w[c]);
            fputs("│", stdout);
        }
        fputs("\n", stdout);
    }
    make_row("└", "┴", "┘", w, nc, 0);
}

/* Per-rank bytes of Adam training with f32 master weights, P parameters,
 * the largest unit L, N ranks, as accel's sharding lays memory out:
 * parameters + gradients, and the optimizer state (exp_avg + exp_avg_sq). */
static void strategy_bytes(int strategy, double P, double L, int N, double *pg, double *opt) {
    switch (strategy) {
    case 0: /* NO_SHARD (DDP): everything replicated */
        *pg = 8 * P;
        *opt = 8 * P;
        break;
    case 1: /* SHARD_GRAD_OP (ZeRO-2): full parameters and gradient buffer, plus the gradient shard */
        *pg = 8 * P + 4 * P / N;
        *opt = 8 * P / N;
        break;
    default: /* FULL_SHARD (ZeRO-3): shards, plus two units' full parameters and gradients (prefetch, reduction in flight) */
        *pg = 8 * P / N + 16 * L;
        *opt = 8 * P / N;
        break;
    }
}

static void print_sharding_table(int64_t total, int64_t largest, int N) {
    static const char *const NAMES[] = {"NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"};
    char rows[3][4][32];
    double P = (double)total / 4, L = (double)largest / 4; /* the sizes are float32 bytes */
    for (int r = 0; r < 3; r++) {
        double pg, opt;
        strategy_bytes(r, P, L, N, &pg, &opt);
        snprintf(rows[r][0], 32, "%s", NAMES[r]);
        convert_bytes(pg, false, rows[r][1], 32);
        convert_bytes(opt, false, rows[r][2], 32);
        convert_bytes(pg + opt, false, rows[r][3], 32);
    }
    char title[128];
    snprintf(title, sizeof title, "Training using Adam on %d processes, per rank", N);
    const char *headers[4] = {"strategy", "Params + grads", "Optimizer", "Total"};
    print_table(title, headers, rows, 3);
}

static int dtype_index(const char *s) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, DTYPES[i]) == 0) return i;
    return -1;
}

int accel_cli_estimate_memory(int argc, char **argv) {
    const char *model = NULL;
    int dts[16], ndt = 0, nproc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--dtypes")) {
            while (i + 1 < argc && argv[i + 1][0] != '-' && dtype_index(argv[i + 1]) >= 0 && ndt < 16)
                dts[ndt++] = dtype_index(argv[++i]);
            if (ndt == 0 || (i + 1 < argc && argv[i + 1][0] != '-' && model)) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --dtypes: expected one or more of float32, "
                                "float16, int8, int4\n");
                return 2;
            }
        } else if (!strcmp(a, "--library_name") || !strcmp(a, "--library-name")) {
            if (i + 1 >= argc || (strcmp(argv[i + 1], "transformers") && strcmp(argv[i + 1], "timm"))) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --library_name: invalid choice (choose from "
                                "'timm', 'transformers')\n");
                return 2;
            }
            if (!strcmp(argv[++i], "timm")) {
                fprintf(stderr, "accel estimate-memory: error: timm models are not available in accel (only "
                                "transformers Llama configs)\n");
                return 1;
            }
        } else if (!strcmp(a, "--num_processes") || !strcmp(a, "--num-processes")) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || end == argv[i + 1] || *end || v < 1 || v > 1 << 20) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --num_processes: expected a count >= 1\n");
                return 2;
            }
            nproc = (int)v;
            i++;
        } else if (!strcmp(a, "--trust_remote_code") || !strcmp(a, "--trust-remote-code")) {
            /* nothing runs remote code here */
        } else if (a[0] == '-' || model) {
            usage(stderr);
            fprintf(stderr, "accel estimate-memory: error: unrecognized arguments: %s\n", a);
            return 2;
        } else {
            model = a;
        }
    }
    if (!model) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: the following arguments are required: model_name\n");
        return 2;
    }
    if (ndt == 0)
        for (ndt = 0; ndt < 4; ndt++) dts[ndt] = ndt;
    accel_llama_config cfg;
    if (accel_llama_config_load(model, &cfg) != ACCEL_OK) {
        fprintf(stderr, "accel estimate-memory: %s\n", accel_last_error());
        return 1;
    }
    accel_init_empty_weights_begin();
    accel_module *m = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    static const char *const no_split[] = {"LlamaDecoderLayer"};
    int64_t total = 0, largest = 0;
    if (!m || accel_calculate_maximum_sizes(m, no_split, 1, &total, &largest) != ACCEL_OK) {
        fprintf(stderr, "accel estimate-memory: %s\n", accel_last_error());
        accel_module_free(m);
        return 1;
    }
    accel_module_free(m);
    static const double div[] = {1, 2, 4, 8};
    char rows[16][4][32];
    for (int r = 0; r < ndt; r++) {
        int k = dts[r];
        snprintf(rows[r][0], 32, "%s", DTYPES[k]);
        convert_bytes((double)largest / div[k], k == 0, rows[r][1], 32);
        convert_bytes((double)total / div[k], k == 0, rows[r][2], 32);
        /* Training using Adam: max(model, optimizer, gradients, step) */
        if (k == 0) convert_bytes(4.0 * (double)total, true, rows[r][3], 32);
        else if (k == 1) convert_bytes(2.0 * (double)total, true, rows[r][3], 32);
        else snprintf(rows[r][3], 32, "N/A");
    }
    char title[600];
    snprintf(title, sizeof title, "Memory Usage for loading `%s`", model);
    const char *headers[4] = {"dtype", "Largest Layer", "Total Size", "Training using Adam"};
    print_table(title, headers, rows, ndt);
    if (nproc) print_sharding_table(total, largest, nproc);
    return 0;
}
