/* bench_json_load: what loading a big JSON file costs (a DeepSpeed config, a
 * safetensors index): accel__json_load_file (the file read in one go, parsed
 * from memory) beside jansson's json_loadfd on the same file, the path the
 * library took before (one read() system call per byte).
 *
 *     bench_json_load FILE [--rounds R] [--before-rounds R]
 *
 * Prints one line per path: name=... ms=<median over the rounds> (wall)
 * cpu_ms=<median process CPU time> rounds=R, then the 1-minute load average:
 * the machine may be shared, so these are rough figures. --before-rounds 0
 * skips the slow path. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "accel/accel.h"
#include "io/io_internal.h"

static double now_ms(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The library's loader since the fix. */
static json_t *load_after(const char *path) { return accel__json_load_file(path); }

/* What accel__json_load_file did before: json_loadfd on the open file. */
static json_t *load_before(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    json_error_t err;
    json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &err);
    close(fd);
    return j;
}

static int run(const char *name, json_t *(*load)(const char *), const char *path, int rounds) {
    double wall[64], cpu[64];
    for (int r = 0; r < rounds; r++) {
        double w0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_PROCESS_CPUTIME_ID);
        json_t *j = load(path);
        wall[r] = now_ms(CLOCK_MONOTONIC) - w0;
        cpu[r] = now_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (!j) {
            fprintf(stderr, "bench_json_load: %s: %s\n", name, accel_last_error());
            return 1;
        }
        json_decref(j);
    }
    qsort(wall, (size_t)rounds, sizeof *wall, cmp_double);
    qsort(cpu, (size_t)rounds, sizeof *cpu, cmp_double);
    printf("name=%s ms=%.1f cpu_ms=%.1f min_ms=%.1f rounds=%d\n", name, wall[rounds / 2], cpu[rounds / 2], wall[0],
           rounds);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int rounds = 5, before_rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--before-rounds") == 0 && i + 1 < argc) before_rounds = atoi(argv[++i]);
        else if (!path) path = argv[i];
        else path = NULL, i = argc;
    }
    if (!path || rounds < 1 || rounds > 64 || before_rounds < 0 || before_rounds > 64) {
        fprintf(stderr, "usage: bench_json_load FILE [--rounds 1..64] [--before-rounds 0..64]\n");
        return 2;
    }
    if (run("accel__json_load_file", load_after, path, rounds)) return 1;
    if (before_rounds && run("json_loadfd_before", load_before, path, before_rounds)) return 1;
    double load[3];
    if (getloadavg(load, 3) == 3) printf("load=%.2f %.2f %.2f\n", load[0], load[1], load[2]);
    return 0;
}
