/* The registry of storage versions (src/core/prepared.c): a reported write
 * bumps the version of exactly the tracked storages whose bytes it overlaps.
 *   - ranges laid out side by side, nested and apart, in one buffer (as
 *     parameters rebound into a flat buffer): writes at each range's edges
 *     and the registry's envelope bump what they touch and nothing else;
 *   - many random writes, with storages tracked and untracked between them,
 *     against a brute-force count;
 *   - writes from two threads at once while a third tracks and untracks
 *     others: no bump lost, none doubled;
 *   - storage in a step arena (this thread's or another's) is not tracked,
 *     since writes into the writer's own step arena are not looked up;
 *   - a device storage (of a device the host cannot address) inside a step
 *     arena, i.e. a backend whose addresses alias host ones, which that
 *     early return would miss writes of, stops at an assertion. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "backends/registry.h" /* accel__hostless_register */
#include "core/core_internal.h"

enum { FLOATS = 1024, MARGIN = 256 /* bytes either side of the buffer */ };

/* Float ranges [lo, hi) of the buffer, each a tracked tensor. */
typedef struct range {
    int64_t lo, hi;
} range;

static const range RANGES[] = {
    {0, 64},    /* A */
    {64, 128},  /* B: starts where A ends */
    {128, 192}, /* C */
    {32, 160},  /* N: over the end of A, all of B, the start of C */
    {256, 320}, /* E: after a gap */
    {70, 80},   /* inside B and N */
    {320, 321}, /* F: one float, the envelope's end */
};
enum { NR = sizeof RANGES / sizeof RANGES[0] };

typedef struct layout {
    char *base;   /* MARGIN bytes, then the FLOATS floats, then MARGIN bytes */
    float *buf;
    accel_tensor *t[NR];
} layout;

/* A persistent [hi - lo] f32 tensor viewing buf[lo, hi), tracked. */
static accel_tensor *tracked_at(float *buf, range r) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){r.hi - r.lo}, ACCEL_CPU_DEVICE);
    CHECK(t != NULL);
    accel_tensor_rebind(t, buf + r.lo, false);
    t->flags |= ACCEL_TF_PARAM; /* a parameter rebound into a flat buffer */
    (void)accel__tensor_version(t);
    return t;
}

/* Frees a tensor marked a parameter above: no module owns it, and
 * accel_tensor_free refuses a parameter (its module frees it). */
static void free_marked(accel_tensor *t) {
    t->flags &= ~(uint32_t)ACCEL_TF_PARAM;
    accel_tensor_free(t);
}

static void layout_new(layout *l) {
    l->base = accel_calloc(1, FLOATS * sizeof(float) + 2 * MARGIN);
    CHECK(l->base != NULL);
    l->buf = (float *)(l->base + MARGIN);
    for (int i = 0; i < NR; i++) l->t[i] = tracked_at(l->buf, RANGES[i]);
}

static void layout_free(layout *l) {
    for (int i = 0; i < NR; i++) free_marked(l->t[i]);
    accel_free(l->base);
}

static void versions(const layout *l, uint64_t *v) {
    for (int i = 0; i < NR; i++) v[i] = accel__tensor_version(l->t[i]);
}

static bool overlaps(range r, int64_t lo_byte, int64_t n) {
    return lo_byte < r.hi * 4 && lo_byte + n > r.lo * 4;
}

/* Writes n bytes at byte offset off of buf (negative: into the margin) and
 * checks that exactly the ranges it overlaps moved, by one. */
static void check_write(const layout *l, const char *what, int64_t off, int64_t n) {
    uint64_t before[NR], after[NR];
    versions(l, before);
    accel__storage_written((char *)l->buf + off, (size_t)n);
    versions(l, after);
    for (int i = 0; i < NR; i++) {
        uint64_t want = before[i] + (overlaps(RANGES[i], off, n) ? 1 : 0);
        CHECK_MSG(after[i] == want, "%s (bytes [%lld, %lld)): range %d [%lld, %lld) floats: version %llu, want %llu",
                  what, (long long)off, (long long)(off + n), i, (long long)RANGES[i].lo, (long long)RANGES[i].hi,
                  (unsigned long long)(after[i] - before[i]), (unsigned long long)(want - before[i]));
    }
}

static void test_edges(void) {
    layout l;
    layout_new(&l);
    check_write(&l, "all of B", 64 * 4, 64 * 4);
    check_write(&l, "A's last byte", 64 * 4 - 1, 1);
    check_write(&l, "C's first byte", 128 * 4, 1);
    check_write(&l, "across A, B, C, N and the inner range", 60 * 4, 140 * 4);
    check_write(&l, "the gap", 192 * 4, 64 * 4);
    check_write(&l, "the byte before the envelope", -1, 1);
    check_write(&l, "the envelope's first byte", 0, 1);
    check_write(&l, "the envelope's last byte", 321 * 4 - 1, 1);
    check_write(&l, "the byte after the envelope", 321 * 4, 1);
    check_write(&l, "over the envelope and past both ends", -MARGIN, FLOATS * 4 + 2 * MARGIN);
    check_write(&l, "past the end, far", 400 * 4, 8);
    layout_free(&l);
}

static uint64_t g_rand = 88172645463325252ull;

static uint64_t next_rand(void) {
    g_rand ^= g_rand << 13, g_rand ^= g_rand >> 7, g_rand ^= g_rand << 17;
    return g_rand;
}

/* Random writes, and every 50 one range untracked and tracked again (it
 * leaves and re-enters the sorted array, the envelope may shrink and grow). */
static void test_random_against_brute_force(void) {
    layout l;
    layout_new(&l);
    for (int w = 0; w < 3000; w++) {
        if (w % 50 == 49) {
            int i = (int)(next_rand() % NR);
            free_marked(l.t[i]);
            l.t[i] = tracked_at(l.buf, RANGES[i]);
        }
        int64_t off = (int64_t)(next_rand() % (400 * 4 + MARGIN)) - MARGIN;
        int64_t n = 1 + (int64_t)(next_rand() % (w % 3 ? 16 : 600));
        check_write(&l, "random", off, n);
    }
    layout_free(&l);
}

/* ---- two writers and a tracker at once */

enum { WRITES = 300000 };

typedef struct writer_arg {
    const layout *l;
    int64_t off, n; /* bytes of buf */
    pthread_barrier_t *start;
} writer_arg;

static void *writer(void *p) {
    writer_arg *a = p;
    pthread_barrier_wait(a->start);
    for (int i = 0; i < WRITES; i++) accel__storage_written((char *)a->l->buf + a->off, (size_t)a->n);
    accel_thread_cleanup();
    return NULL;
}

static atomic_bool g_stop;

/* Tracks and frees tensors over the buffer's far part while the writers run. */
static void *tracker(void *p) {
    const layout *l = p;
    while (!atomic_load(&g_stop)) {
        accel_tensor *t = tracked_at(l->buf, (range){512 + (int64_t)(next_rand() % 256), 800});
        free_marked(t);
    }
    accel_thread_cleanup();
    return NULL;
}

static void test_two_threads(void) {
    layout l;
    layout_new(&l);
    uint64_t before[NR], after[NR];
    versions(&l, before);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    /* one writes A's second half and N's first floats; the other B to C */
    writer_arg a = {&l, 40 * 4, 24 * 4, &start}, b = {&l, 100 * 4, 40 * 4, &start};
    pthread_t ta, tb, tt;
    atomic_store(&g_stop, false);
    CHECK(pthread_create(&tt, NULL, tracker, &l) == 0);
    CHECK(pthread_create(&ta, NULL, writer, &a) == 0);
    CHECK(pthread_create(&tb, NULL, writer, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    atomic_store(&g_stop, true);
    pthread_join(tt, NULL);
    pthread_barrier_destroy(&start);
    versions(&l, after);
    for (int i = 0; i < NR; i++) {
        uint64_t want = (overlaps(RANGES[i], a.off, a.n) ? WRITES : 0) + (overlaps(RANGES[i], b.off, b.n) ? WRITES : 0);
        CHECK_MSG(after[i] - before[i] == want, "range %d: %llu bumps, want %llu", i,
                  (unsigned long long)(after[i] - before[i]), (unsigned long long)want);
    }
    layout_free(&l);
}

/* ---- step memory is not tracked */

/* A persistent tensor whose storage lies in step memory is not tracked: its
 * version stays 0 (untracked) after a fill of it, which reports its write
 * (a tracked storage's first version is 0 too: only the fill tells). */
static void check_untracked_in_step_memory(const char *whose, float *step) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){16}, ACCEL_CPU_DEVICE);
    CHECK(t != NULL);
    accel_tensor_rebind(t, step, false);
    t->flags |= ACCEL_TF_PARAM;
    (void)accel__tensor_version(t); /* would start tracking it */
    CHECK(accel_fill_(t, 2.0) == ACCEL_OK);
    CHECK_MSG(accel__tensor_version(t) == 0, "%s step arena: a tensor there was tracked", whose);
    free_marked(t);
}

typedef struct arena_arg {
    float *step;
    pthread_barrier_t *ready, *done;
} arena_arg;

static void *arena_owner(void *p) {
    arena_arg *a = p;
    a->step = accel_arena_alloc(accel_step_arena(), 64 * sizeof(float), 64);
    pthread_barrier_wait(a->ready);
    pthread_barrier_wait(a->done); /* the main thread looked at it */
    accel_thread_cleanup();
    return NULL;
}

static void test_step_memory_untracked(void) {
    /* a tracked heap tensor beside it keeps the registry non-empty */
    layout l;
    layout_new(&l);
    check_untracked_in_step_memory("this thread's", accel_arena_alloc(accel_step_arena(), 64 * sizeof(float), 64));
    pthread_barrier_t ready, done;
    pthread_barrier_init(&ready, NULL, 2);
    pthread_barrier_init(&done, NULL, 2);
    arena_arg a = {NULL, &ready, &done};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, arena_owner, &a) == 0);
    pthread_barrier_wait(&ready);
    CHECK(a.step != NULL);
    check_untracked_in_step_memory("another thread's", a.step);
    pthread_barrier_wait(&done);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&done);
    /* the heap tensors are still tracked, their writes still counted */
    check_write(&l, "after step-memory writes", 0, 4);
    accel_step_reset();
    layout_free(&l);
}

/* A hostless:0 tensor whose address is that of this thread's step arena
 * (as a backend whose device addresses alias host ones would hand out):
 * tracking it aborts, in a child, with the assertion's message. */
static void test_aliasing_device_address_asserts(void) {
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, 2); /* the abort's message */
        if (accel_device_count(ACCEL_DEV_HOSTLESS) < 1 && accel__hostless_register(1) != ACCEL_OK) _exit(3);
        accel_tensor *t = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){16}, (accel_device){ACCEL_DEV_HOSTLESS, 0});
        if (!t) _exit(4);
        accel_tensor_rebind(t, accel_arena_alloc(accel_step_arena(), 64, 64), false);
        t->flags |= ACCEL_TF_PARAM;
        (void)accel__tensor_version(t);
        _exit(0); /* tracked or skipped in silence */
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "the child %s %d",
              WIFSIGNALED(status) ? "died of signal" : "exited with", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

int main(void) {
    RUN(test_edges);
    RUN(test_random_against_brute_force);
    RUN(test_two_threads);
    RUN(test_step_memory_untracked);
    RUN(test_aliasing_device_address_asserts);
    accel_thread_cleanup();
    return check_summary();
}
