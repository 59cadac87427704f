/* Per-thread and shared state (docs/contract.md "Threads"): the default
 * generator hands disjoint values to threads drawing at once, and an error
 * stays on the thread that made it. */
#include <pthread.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "check.h"

enum { THREADS = 4, DRAWS = 1 << 19 };

static uint64_t g_values[THREADS][DRAWS];
static pthread_barrier_t g_start;

static void *draw(void *arg) {
    uint64_t *out = arg;
    pthread_barrier_wait(&g_start); /* all at once */
    for (int i = 0; i < DRAWS; i++) out[i] = accel_rng_next_u64(NULL);
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Together the threads drew exactly the first THREADS * DRAWS values of the
 * stream, each once (no offset lost or reused). */
static void test_default_rng_from_threads(void) {
    accel_manual_seed(11);
    pthread_t t[THREADS];
    pthread_barrier_init(&g_start, NULL, THREADS);
    for (int k = 0; k < THREADS; k++) pthread_create(&t[k], NULL, draw, g_values[k]);
    for (int k = 0; k < THREADS; k++) pthread_join(t[k], NULL);
    pthread_barrier_destroy(&g_start);
    CHECK(accel_default_rng()->offset == (uint64_t)THREADS * DRAWS);
    uint64_t *got = malloc(sizeof g_values), *want = malloc(sizeof g_values);
    memcpy(got, g_values, sizeof g_values);
    accel_rng r;
    accel_rng_init(&r, 11);
    for (size_t i = 0; i < (size_t)THREADS * DRAWS; i++) want[i] = accel_rng_next_u64(&r);
    qsort(got, (size_t)THREADS * DRAWS, sizeof *got, cmp_u64);
    qsort(want, (size_t)THREADS * DRAWS, sizeof *want, cmp_u64);
    CHECK(memcmp(got, want, sizeof g_values) == 0);
    free(got);
    free(want);
}

static void *fail_here(void *arg) {
    (void)arg;
    accel_tensor *a = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3));
    bool failed = accel_matmul(a, a) == NULL && accel_last_status() == ACCEL_ERR_SHAPE;
    accel_thread_cleanup();
    return failed ? arg : NULL;
}

static void test_errors_stay_on_their_thread(void) {
    accel_clear_error();
    pthread_t t;
    int token;
    void *ret = NULL;
    pthread_create(&t, NULL, fail_here, &token);
    pthread_join(t, &ret);
    CHECK(ret == &token);
    CHECK(accel_last_status() == ACCEL_OK && accel_last_error()[0] == '\0');
}

int main(void) {
    RUN(test_default_rng_from_threads);
    RUN(test_errors_stay_on_their_thread);
    accel_thread_cleanup();
    return check_summary();
}
