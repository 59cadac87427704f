/* bench/bench_checkpoint_io.c — what checksumming a checkpoint costs.
 *  1. Throughput of the checksums a completion marker could record, over a
 *     1 MiB buffer (in cache, as accel__file_crc32c reads) and a 256 MiB one:
 *     CRC-32C with SSE4.2 (accel__crc32c, three interleaved streams), CRC-32C
 *     by the slice-by-8 table (the portable fallback), zlib's crc32 (already a
 *     dependency; another polynomial), xxHash64 (a reference implementation of
 *     its spec, here only).
 *  2. save_state and load_state of an MLP with AdamW state (default 8 linears
 *     of 2048 x 2048: a ~400 MB checkpoint) on one process, and the parts the
 *     checksums add: reading every file back for its CRC-32C when the marker
 *     is written, and verifying them on load (against a sizes-only check, what
 *     the marker did before). The files stay in the page cache between save
 *     and load, as when a run saves and resumes on one machine soon after.
 * Usage: bench_checkpoint_io [--dir D] [--layers L] [--width W] [--rounds N].
 * Prints medians. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "io/checkpoint_marker.h"
#include "core/checksum.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0, n) (sorts v). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* xxHash64 (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md). */
static const uint64_t P1 = 11400714785074694791ull, P2 = 14029467366897019727ull, P3 = 1609587929392839161ull,
                      P4 = 9650029242287828579ull, P5 = 2870177450012600261ull;
static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static uint64_t round64(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
static uint64_t merge64(uint64_t acc, uint64_t v) { return (acc ^ round64(0, v)) * P1 + P4; }
static uint64_t xxh64(const void *data, size_t n, uint64_t seed) {
    const unsigned char *p = data, *end = p + n;
    uint64_t h;
    if (n >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        for (; p + 32 <= end; p += 32) {
            v1 = round64(v1, rd64(p));
            v2 = round64(v2, rd64(p + 8));
            v3 = round64(v3, rd64(p + 16));
            v4 = round64(v4, rd64(p + 24));
        }
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = merge64(merge64(merge64(merge64(h, v1), v2), v3), v4);
    } else {
        h = seed + P5;
    }
    h += n;
    for (; p + 8 <= end; p += 8) h = rotl(h ^ round64(0, rd64(p)), 27) * P1 + P4;
    if (p + 4 <= end) {
        uint32_t w;
        memcpy(&w, p, 4);
        h = rotl(h ^ (uint64_t)w * P1, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) h = rotl(h ^ *p * P5, 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    return h ^ (h >> 32);
}

typedef enum { CRC32C_FAST, CRC32C_TABLE, ZLIB_CRC32, XXH64 } kind;
static const char *NAMES[] = {"crc32c (run-time choice)", "crc32c table", "zlib crc32", "xxhash64"};

static uint64_t run(kind k, const unsigned char *buf, size_t n) {
    switch (k) {
    case CRC32C_FAST: return accel__crc32c(buf, n);
    case CRC32C_TABLE: return accel__crc32c(buf, n);
    case ZLIB_CRC32: {
        uLong c = crc32(0L, Z_NULL, 0);
        for (size_t o = 0; o < n; o += 1u << 30) c = crc32(c, buf + o, (uInt)(n - o < (1u << 30) ? n - o : 1u << 30));
        return c;
    }
    case XXH64: return xxh64(buf, n, 0);
    }
    return 0;
}

/* Throughput of each checksum over a 1 MiB buffer (in cache, as
 * accel__file_crc32c reads) and a 256 MiB one (out of cache). */
static int throughput(int rounds) {
    size_t big = (size_t)256 << 20;
    unsigned char *buf = malloc(big);
    if (!buf) return 1;
    for (size_t i = 0; i < big; i++) buf[i] = (unsigned char)(i * 2654435761u >> 13);
    printf("crc32c implementation here: %s\n", accel__crc32c_impl());
    static const size_t sizes[] = {(size_t)1 << 20, (size_t)256 << 20};
    for (int s = 0; s < 2; s++) {
        size_t n = sizes[s];
        int reps = s == 0 ? 256 : 1; /* ~256 MiB per round either way */
        for (int k = 0; k < 4; k++) {
            accel__crc32c_force_table(k == CRC32C_TABLE);
            double gbs[100];
            uint64_t sink = 0;
            run((kind)k, buf, n); /* warm */
            for (int r = 0; r < rounds; r++) {
                double t0 = now();
                for (int i = 0; i < reps; i++) sink = run((kind)k, buf, n);
                gbs[r] = (double)n * reps / (now() - t0) / 1e9;
            }
            accel__crc32c_force_table(false);
            printf("%-26s %4zu MiB buffer: median %6.2f GB/s over %d rounds (checksum %llx)\n", NAMES[k], n >> 20,
                   median(gbs, rounds), rounds, (unsigned long long)sink);
        }
    }
    free(buf);
    return 0;
}

/* Reads every file of dir (one level of subdirectories too) for its CRC-32C: the marker's extra work. */
static int64_t crc_all(const char *dir, int depth) {
    DIR *d = opendir(dir);
    int64_t total = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char p[8192];
        struct stat sb;
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &sb)) continue;
        if (S_ISDIR(sb.st_mode) && depth == 0) total += crc_all(p, 1);
        else if (S_ISREG(sb.st_mode)) {
            uint32_t c;
            int64_t n = 0;
            if (accel__file_crc32c(p, &c, &n) == ACCEL_OK) total += n;
        }
    }
    if (d) closedir(d);
    return total;
}

int main(int argc, char **argv) {
    const char *dir = "/tmp/accel_bench_ckpt";
    int layers = 8, width = 2048, rounds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--width")) width = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    }
    if (layers < 1 || layers > 64 || width < 8 || width > 16384 || rounds < 1 || rounds > 50) {
        fprintf(stderr, "bench_checkpoint_io: bad flags\n");
        return 2;
    }
    if (throughput(rounds)) return 1;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_module *l[64];
    accel_manual_seed(1);
    for (int i = 0; i < layers; i++) l[i] = accel_linear_new(width, width, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_module *m = accel_sequential_new(layers, l);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-3);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    if (!acc || !m || !opt || accel_accelerator_prepare(acc, m, opt, NULL, NULL)) {
        fprintf(stderr, "bench_checkpoint_io: %s\n", accel_last_error());
        return 1;
    }
    accel_tensor *x = accel_ones(ACCEL_F32, ACCEL_SHAPE(2, width));
    accel_tensor *loss = accel_mean_all(accel_module_call(m, x));
    if (accel_accelerator_backward(acc, loss) || accel_accelerator_optimizer_step(acc, opt)) return 1;
    accel_step_reset();
    double save[50], load[50], crc[50], verify[50], sizes[50];
    int64_t bytes = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        if (accel_accelerator_save_state(acc, dir, NULL, 0)) return fprintf(stderr, "%s\n", accel_last_error()), 1;
        double t1 = now();
        if (accel_accelerator_load_state(acc, dir, NULL)) return fprintf(stderr, "%s\n", accel_last_error()), 1;
        double t2 = now();
        bytes = crc_all(dir, 0);
        double t3 = now();
        accel__marker_check(dir, true, NULL, "bench");
        double t4 = now();
        accel__marker_check(dir, false, NULL, "bench");
        double t5 = now();
        save[r] = (t1 - t0) * 1e3;
        load[r] = (t2 - t1) * 1e3;
        crc[r] = (t3 - t2) * 1e3;
        verify[r] = (t4 - t3) * 1e3;
        sizes[r] = (t5 - t4) * 1e3;
    }
    double ms = median(save, rounds), ml = median(load, rounds), mc = median(crc, rounds),
           mv = median(verify, rounds), mz = median(sizes, rounds);
    printf("checkpoint: %d x Linear(%d, %d) + AdamW, %.1f MB in its files; crc32c: %s; %d rounds, medians\n", layers,
           width, width, (double)bytes / 1e6, accel__crc32c_impl(), rounds);
    printf("save_state %.1f ms (of which the marker's CRC-32C read-back %.1f ms, %.2f GB/s): without checksums %.1f ms\n",
           ms, mc, (double)bytes / (mc * 1e-3) / 1e9, ms - mc);
    printf("load_state %.1f ms (verification with checksums %.1f ms, sizes only %.2f ms): without checksums %.1f ms\n",
           ml, mv, mz, ml - mv + mz);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) return 1;
    if (accel_accelerator_clear(acc)) return fprintf(stderr, "%s\n", accel_last_error()), 1;
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_accelerator_free(acc);
    return 0;
}
