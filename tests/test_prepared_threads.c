/* A prepared-weight entry (src/core/prepared.c) stays alive while a thread
 * that found it still uses it, whatever another thread does to its owner:
 *   - one thread builds a form (its fill held open), a second has found the
 *     entry and waits for its build lock, and a third sees the owner's
 *     storage moved, which detaches the entry: the builder and the waiter
 *     finish on live memory (under ASan a use after free fails otherwise);
 *   - the same with the owner's storage replaced (accel_tensor_rebind) while
 *     the form is being built;
 *   - gets from two threads at once while a third keeps moving the storage:
 *     every get succeeds, no entry is used after it was freed;
 *   - versions and gets asked in a tight loop while another thread's gets
 *     keep detaching (and freeing) the entry: whether the tensor asked about
 *     owns its entry is read under the registry's lock, never from an entry
 *     already freed (a race window of a few instructions: ASan catches it
 *     before the fix only on some runs). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "core/core_internal.h"

enum { N = 256, ROUNDS = 4 };

static const accel__form_key KEY = {.kind = ACCEL__FORM_ROUNDED_F32, .dt = ACCEL_BF16};

static pthread_barrier_t g_in_fill;  /* the builder is inside its fill */
static pthread_barrier_t g_go;       /* the mover is done: the fill may finish */
static atomic_bool g_hold;           /* the fill waits on the two barriers */

/* dst = src (both f32 on the cpu), held open between the barriers when asked. */
static accel_status fill_copy(accel_tensor *dst, accel_tensor *src, const accel__form_key *key) {
    (void)key;
    if (atomic_exchange(&g_hold, false)) {
        pthread_barrier_wait(&g_in_fill);
        pthread_barrier_wait(&g_go);
    }
    memcpy(accel__host_ptr(dst, "fill_copy"), accel__host_ptr(src, "fill_copy"), accel_nbytes(dst));
    return ACCEL_OK;
}

typedef struct getter {
    accel_tensor *w;
    float first; /* the form's first value */
    accel_status st;
    atomic_int tid; /* the thread's id once it runs; 0 before */
} getter;

static void *get_form(void *p) {
    getter *g = p;
    atomic_store(&g->tid, (int)syscall(SYS_gettid));
    accel_tensor *form = NULL;
    g->st = accel__prepared_get(g->w, &KEY, ACCEL_F32, fill_copy, &form, NULL);
    g->first = form ? ((const float *)accel__host_ptr(form, "get_form"))[0] : -1.0f;
    accel_step_reset(); /* a form of a detached entry is freed here */
    accel_thread_cleanup();
    return NULL;
}

/* A persistent [N] f32 weight filled with v. */
static accel_tensor *weight_of(float v) {
    accel_tensor *w = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){N}, ACCEL_CPU_DEVICE);
    CHECK(w && accel_fill_(w, v) == ACCEL_OK);
    return w;
}

/* Storage moved under the entry: the owner's bytes are another buffer's
 * (a header whose data was reassigned); the next get detaches the entry. */
static void move_by_reassigning(accel_tensor *w, accel_tensor *other) {
    void *mine = w->data;
    w->data = other->data;
    accel_tensor *form = NULL;
    CHECK(accel__prepared_get(w, &KEY, ACCEL_F32, fill_copy, &form, NULL) == ACCEL_OK);
    CHECK(form && ((const float *)accel__host_ptr(form, "move"))[0] == 2.0f);
    accel__prepared_release(w); /* the entry of other's bytes */
    w->data = mine;
    accel_step_reset();
}

/* Storage replaced: w rebound to other's bytes (w's own are freed). */
static void move_by_rebinding(accel_tensor *w, accel_tensor *other) {
    accel_tensor_rebind(w, other->data, false);
}

/* Whether thread tid of this process is asleep ('S' in its stat: blocked). */
static bool thread_sleeping(int tid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')'); /* "tid (comm) S ...": comm may hold spaces */
    return close && close[1] == ' ' && close[2] == 'S';
}

/* Returns once g's thread has started and fallen asleep: the waiter's only
 * blocking call is the entry's build lock, which the held builder owns (a
 * fixed sleep was not enough on a loaded machine: the waiter then arrived
 * after the move, found a tensor that no longer owns its bytes, and was
 * rightly given no form). */
static void wait_until_blocked(getter *g) {
    for (int i = 0; i < 20000; i++) { /* 20 s at most */
        int tid = atomic_load(&g->tid);
        if (tid && thread_sleeping(tid)) return;
        usleep(1000);
    }
    CHECK_MSG(false, "the waiter never blocked on the build lock");
}

/* Round: a builder held inside its fill, a waiter on the entry's build lock,
 * the storage moved meanwhile. Both gets succeed with one storage's values. */
static void held_build_round(void (*move)(accel_tensor *, accel_tensor *)) {
    accel_tensor *w = weight_of(1.0f), *other = weight_of(2.0f);
    getter builder = {.w = w, .st = ACCEL_OK}, waiter = {.w = w, .st = ACCEL_OK};
    pthread_t tb, tw;
    atomic_store(&g_hold, true);
    CHECK(pthread_create(&tb, NULL, get_form, &builder) == 0);
    pthread_barrier_wait(&g_in_fill);
    CHECK(pthread_create(&tw, NULL, get_form, &waiter) == 0);
    wait_until_blocked(&waiter); /* it found the entry and waits for its build lock */
    move(w, other);
    pthread_barrier_wait(&g_go);
    pthread_join(tb, NULL);
    pthread_join(tw, NULL);
    CHECK(builder.st == ACCEL_OK && waiter.st == ACCEL_OK);
    CHECK_MSG(builder.first == 1.0f || builder.first == 2.0f, "builder's form starts %g", builder.first);
    CHECK_MSG(waiter.first == 1.0f || waiter.first == 2.0f, "waiter's form starts %g", waiter.first);
    accel_tensor_free(w); /* rebound, it no longer owns its bytes: other frees them */
    accel_tensor_free(other);
    accel_step_reset();
}

static void test_moved_while_building(void) {
    for (int r = 0; r < ROUNDS; r++) held_build_round(move_by_reassigning);
}

static void test_rebound_while_building(void) {
    for (int r = 0; r < ROUNDS; r++) held_build_round(move_by_rebinding);
}

/* ---- free-running: two getters and a mover */

enum { GETS = 20000 };

static atomic_bool g_stop;

typedef struct hammer_arg {
    accel_tensor *w;
    int bad; /* failed gets */
} hammer_arg;

static void *hammer(void *p) {
    hammer_arg *a = p;
    for (int i = 0; i < GETS; i++) {
        accel_tensor *form = NULL;
        if (accel__prepared_get(a->w, &KEY, ACCEL_F32, fill_copy, &form, NULL) != ACCEL_OK) a->bad++;
        if (i % 64 == 63) accel_step_reset();
    }
    accel_step_reset();
    accel_thread_cleanup();
    return NULL;
}

/* Swaps w's storage between its own bytes and other's, each swap seen by a get. */
static void *mover(void *p) {
    accel_tensor **wo = p;
    void *bytes[2] = {wo[0]->data, wo[1]->data};
    for (int k = 1; !atomic_load(&g_stop); k++) {
        __atomic_store_n(&wo[0]->data, bytes[k & 1], __ATOMIC_RELAXED);
        accel_tensor *form = NULL;
        (void)accel__prepared_get(wo[0], &KEY, ACCEL_F32, fill_copy, &form, NULL);
        accel_step_reset();
    }
    accel_thread_cleanup();
    return NULL;
}

static void test_gets_while_moving(void) {
    accel_tensor *w = weight_of(1.0f), *other = weight_of(2.0f);
    void *mine = w->data;
    accel_tensor *wo[2] = {w, other};
    hammer_arg a = {w, 0}, b = {w, 0};
    pthread_t ta, tb, tm;
    atomic_store(&g_stop, false);
    CHECK(pthread_create(&tm, NULL, mover, wo) == 0);
    CHECK(pthread_create(&ta, NULL, hammer, &a) == 0);
    CHECK(pthread_create(&tb, NULL, hammer, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    atomic_store(&g_stop, true);
    pthread_join(tm, NULL);
    CHECK_MSG(a.bad == 0 && b.bad == 0, "%d and %d bad gets", a.bad, b.bad);
    accel__prepared_release(w);
    w->data = mine;
    accel_tensor_free(w);
    accel_tensor_free(other);
}

/* ---- versions and gets racing a detach that frees the entry */

enum { DETACHES = 20000 };

/* Asks w's version and form until g_stop; counts the gets that failed. */
static void *ask(void *p) {
    hammer_arg *a = p;
    for (int i = 0; !atomic_load_explicit(&g_stop, memory_order_relaxed); i++) {
        (void)accel__tensor_version(a->w);
        accel_tensor *form = NULL;
        if (i % 8 == 0 && accel__prepared_get(a->w, &KEY, ACCEL_F32, fill_copy, &form, NULL) != ACCEL_OK) a->bad++;
        if (i % 64 == 63) accel_step_reset();
    }
    accel_step_reset();
    accel_thread_cleanup();
    return NULL;
}

static void test_versions_while_detaching(void) {
    accel_tensor *w = weight_of(1.0f), *other = weight_of(2.0f);
    void *bytes[2] = {w->data, other->data};
    hammer_arg a = {w, 0}, b = {w, 0};
    pthread_t ta, tb;
    atomic_store(&g_stop, false);
    CHECK(pthread_create(&ta, NULL, ask, &a) == 0);
    CHECK(pthread_create(&tb, NULL, ask, &b) == 0);
    int bad = 0;
    for (int k = 1; k <= DETACHES; k++) { /* each move seen by a get: the entry is detached, then freed */
        __atomic_store_n(&w->data, bytes[k & 1], __ATOMIC_RELAXED);
        accel_tensor *form = NULL;
        if (accel__prepared_get(w, &KEY, ACCEL_F32, fill_copy, &form, NULL) != ACCEL_OK) bad++;
        accel_step_reset();
    }
    atomic_store(&g_stop, true);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK_MSG(a.bad == 0 && b.bad == 0 && bad == 0, "%d, %d and %d bad gets", a.bad, b.bad, bad);
    accel__prepared_release(w);
    w->data = bytes[0];
    accel_tensor_free(w);
    accel_tensor_free(other);
}

int main(void) {
    pthread_barrier_init(&g_in_fill, NULL, 2);
    pthread_barrier_init(&g_go, NULL, 2);
    RUN(test_moved_while_building);
    RUN(test_rebound_while_building);
    RUN(test_gets_while_moving);
    RUN(test_versions_while_detaching);
    pthread_barrier_destroy(&g_in_fill);
    pthread_barrier_destroy(&g_go);
    accel_thread_cleanup();
    return check_summary();
}
