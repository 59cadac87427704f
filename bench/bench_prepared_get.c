/* bench_prepared_get: what a hit of the prepared-weight cache costs
 * (src/core/prepared.c's accel__prepared_get on a weight whose form is
 * current: the registry's read lock, the entry's reference and build lock,
 * the slot lookup), the path every autocast GEMM of a weight takes.
 *
 *     bench_prepared_get [--calls N] [--rounds R]
 *
 * one_thread: one thread's gets of one weight; two_threads: two threads'
 * gets of the same weight at once (its entry shared: the lock and the
 * reference bounce between the cores). Each line: name=...
 * ns_per_call=<median over R rounds of N calls> (wall) cpu_ns_per_call=...
 * (process CPU time over the calls of every thread), then the 1-minute load
 * average: the machine may be shared, so these are rough figures. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/accel.h"
#include "core/core_internal.h"

static int g_calls = 2000000, g_rounds = 7;

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static accel_status fill_copy(accel_tensor *dst, accel_tensor *src, const accel__form_key *key) {
    (void)key;
    return accel_copy_(dst, src);
}

static const accel__form_key KEY = {.kind = ACCEL__FORM_ROUNDED_F32, .dt = ACCEL_BF16};

static void *gets(void *p) {
    accel_tensor *w = p;
    for (int i = 0; i < g_calls; i++) {
        accel_tensor *form;
        if (accel__prepared_get(w, &KEY, ACCEL_F32, fill_copy, &form, NULL) != ACCEL_OK || !form) {
            fprintf(stderr, "bench_prepared_get: get failed: %s\n", accel_last_error());
            exit(1);
        }
    }
    accel_step_reset();
    return NULL;
}

/* One round of `threads` threads (1 or 2) of g_calls gets: wall and CPU ns per call. */
static void round_of(accel_tensor *w, int threads, double *wall, double *cpu) {
    pthread_t t;
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    if (threads == 2 && pthread_create(&t, NULL, gets, w) != 0) exit(1);
    gets(w);
    if (threads == 2) pthread_join(t, NULL);
    *wall = (now(CLOCK_MONOTONIC) - w0) / g_calls;
    *cpu = (now(CLOCK_PROCESS_CPUTIME_ID) - c0) / ((double)g_calls * threads);
}

static double load1(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &l) != 1) l = -1;
    if (f) fclose(f);
    return l;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--calls")) g_calls = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) g_rounds = atoi(argv[i + 1]);
    }
    if (g_calls < 1 || g_rounds < 1 || g_rounds > 64) return 2;
    accel_tensor *w = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){64, 64}, ACCEL_CPU_DEVICE);
    if (!w || accel_fill_(w, 0.5) != ACCEL_OK) return 1;
    double l0 = load1();
    double wall[2][64], cpu[2][64];
    for (int r = 0; r < g_rounds; r++) /* the two forms take turns: the load drifts over both */
        for (int k = 0; k < 2; k++) round_of(w, k + 1, &wall[k][r], &cpu[k][r]);
    static const char *const NAMES[2] = {"one_thread", "two_threads"};
    for (int k = 0; k < 2; k++) {
        qsort(wall[k], (size_t)g_rounds, sizeof(double), cmp_double);
        qsort(cpu[k], (size_t)g_rounds, sizeof(double), cmp_double);
        printf("name=%s ns_per_call=%.1f min=%.1f cpu_ns_per_call=%.1f\n", NAMES[k], wall[k][g_rounds / 2],
               wall[k][0], cpu[k][g_rounds / 2]);
    }
    printf("load_1min before=%.2f after=%.2f\n", l0, load1());
    accel_tensor_free(w);
    accel_thread_cleanup();
    return 0;
}
