/* Stream-ordered asynchronous collectives (dist.c's path for a backend with
 * accel__stream_ops, nccl's on a GPU) on a test backend that needs no GPU:
 * its "device" is a static array, its stream a FIFO of enqueued collectives
 * that run only when a ticket is polled (the third poll of a ticket runs
 * every collective up to it) or by a synchronous call (stream order), and it
 * logs each call with its thread. Checked:
 *   - an async call on device buffers is enqueued at once, from the calling
 *     thread, after the host-buffer work issued before it (which the
 *     communication thread runs), in issue order; wait joins the caller's
 *     stream and returns only once the work has run; a synchronous call does
 *     not wait for it on the host;
 *   - all_gather, reduce_scatter and broadcast take the path too, with the
 *     right results; debug mode's comparison runs before the enqueue, not
 *     deferred;
 *   - a failure reported by the backend, and the group timeout (the backend
 *     told to abort), give wait's error naming the call, its site and the
 *     rank; later calls fail fast; a second work in flight fails too, no hang;
 *   - accel_work_done polls and finishes; free without wait and
 *     accel_pg_free_shared wait for the work, every ticket is released;
 *   - no two threads are ever inside the backend at once (each of its entry
 *     points checks): polling, waiting for or failing streamed work while
 *     the communication thread runs host-buffer work leaves the backend to
 *     it until it is done;
 *   - a dtype the backend's table says it cannot reduce is refused before
 *     the call, naming the backend. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "accel/core.h"
#include "accel/dist.h"
#include "check.h"
#include "dist/backend.h"

enum { N = 8, MAX_OPS = 64, POLLS_TO_RUN = 3 };

/* ---- the test backend */

static float g_dev[8][N]; /* the "device": pointers into it go on the stream */

static bool on_dev(const void *p) {
    return p && (const char *)p >= (const char *)g_dev && (const char *)p < (const char *)g_dev + sizeof g_dev;
}

typedef enum { OP_ALL_REDUCE, OP_BROADCAST, OP_GATHERV, OP_REDUCE_SCATTER, OP_BARRIER } op_kind;

typedef struct fake_op {
    op_kind kind;
    const void *send;
    void *recv;
    size_t count, bytes[2];
    bool ran;
} fake_op;

typedef struct log_entry {
    op_kind kind;
    pthread_t thread;
    bool deferred;
} log_entry;

typedef struct fake_ticket {
    int op;    /* index in fake.ops of the collective it ends (-1: none) */
    int polls;
} fake_ticket;

typedef struct fake {
    bool deferred;
    fake_op ops[MAX_OPS];
    int n_ops;
    log_entry log[MAX_OPS];
    int n_log;
    int live_tickets, joins, aborts, queries;
    bool fail_next; /* the next ticket opened fails when polled */
    bool stuck;     /* tickets never complete */
    fake_ticket *failing;
    bool aborted;
    atomic_int inside;    /* threads inside the backend now: never more than one */
    atomic_bool in_host;  /* the communication thread is inside a host-buffer all_reduce */
} fake;

static fake *fake_of(accel_pg *pg) { return pg->impl; }

/* Every entry point of the backend brackets its body with these: a second
 * thread inside it at once is the defect checked (its state has no lock). */
static fake *enter(accel_pg *pg) {
    fake *f = fake_of(pg);
    int before = atomic_fetch_add(&f->inside, 1);
    CHECK_MSG(before == 0, "two threads inside the backend at once");
    return f;
}
static void leave(fake *f) { atomic_fetch_sub(&f->inside, 1); }

/* Rank 1 of 2 whose peer contributes what it does: a sum doubles. */
static void run_op(accel_pg *pg, fake_op *o) {
    float *r = o->recv;
    const float *s = o->send;
    switch (o->kind) {
    case OP_ALL_REDUCE:
        for (size_t i = 0; i < o->count; i++) r[i] *= 2;
        break;
    case OP_REDUCE_SCATTER:
        for (size_t i = 0; i < o->count; i++) r[i] = 2 * s[(size_t)pg->rank * o->count + i];
        break;
    case OP_GATHERV:
        memcpy(o->recv, o->send, o->bytes[pg->rank]);
        memcpy((char *)o->recv + o->bytes[0], o->send, o->bytes[pg->rank]);
        break;
    case OP_BROADCAST:
        for (size_t i = 0; i < o->count / sizeof(float); i++) r[i] = 7; /* root 0's value */
        break;
    case OP_BARRIER: break;
    }
    o->ran = true;
}

/* The stream runs in order: every collective up to `last`. */
static void run_through(accel_pg *pg, int last) {
    fake *f = fake_of(pg);
    for (int i = 0; i <= last; i++)
        if (!f->ops[i].ran) run_op(pg, &f->ops[i]);
}

static accel_status issue(accel_pg *pg, fake_op o) {
    fake *f = enter(pg);
    if (o.kind == OP_ALL_REDUCE && !on_dev(o.recv)) {
        /* host work runs on the communication thread: slowly, so an overtaking enqueue shows */
        atomic_store(&f->in_host, true);
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
        atomic_store(&f->in_host, false);
    }
    accel_status st = ACCEL_OK;
    if (f->aborted) {
        st = accel_set_error(ACCEL_ERR_DIST, "fake: aborted");
    } else {
        CHECK(f->n_ops < MAX_OPS);
        f->log[f->n_log++] = (log_entry){o.kind, pthread_self(), f->deferred};
        f->ops[f->n_ops] = o;
        int k = f->n_ops++;
        if (!f->deferred) run_through(pg, k); /* a synchronous call: after what the stream holds */
    }
    leave(f);
    return st;
}

static accel_status fake_init(accel_pg *pg, accel__store *st) { (void)pg, (void)st; return ACCEL_OK; }
static void fake_finalize(accel_pg *pg) { (void)pg; }
static accel_status fake_barrier(accel_pg *pg) { return issue(pg, (fake_op){.kind = OP_BARRIER}); }

static accel_status fake_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt, accel_reduce_op op) {
    (void)dt, (void)op;
    return issue(pg, (fake_op){.kind = OP_ALL_REDUCE, .recv = buf, .count = count});
}

static accel_status fake_broadcast(accel_pg *pg, void *buf, size_t bytes, int root) {
    (void)root;
    return issue(pg, (fake_op){.kind = OP_BROADCAST, .recv = buf, .count = bytes});
}

static accel_status fake_all_gatherv(accel_pg *pg, const void *send, void *recv, const size_t *bytes, int root) {
    (void)root;
    return issue(pg, (fake_op){.kind = OP_GATHERV, .send = send, .recv = recv, .bytes = {bytes[0], bytes[1]}});
}

static accel_status fake_reduce_scatter(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt,
                                        accel_reduce_op op) {
    (void)dt, (void)op;
    return issue(pg, (fake_op){.kind = OP_REDUCE_SCATTER, .send = send, .recv = recv, .count = count});
}

/* What the fake adds (run_op's floats): float32 alone. */
static bool fake_reducible(accel_dtype dt) { return dt == ACCEL_F32; }

static bool fake_takes(accel_pg *pg, const void *send, const void *recv) {
    (void)pg;
    return on_dev(recv) && (!send || on_dev(send));
}

static void *fake_begin(accel_pg *pg) {
    fake *f = enter(pg);
    fake_ticket *t = calloc(1, sizeof *t);
    if (t) {
        t->op = -1;
        if (f->fail_next) f->failing = t;
        f->fail_next = false;
        f->live_tickets++;
        f->deferred = true;
    } else {
        accel_set_error(ACCEL_ERR_OOM, "fake: out of memory");
    }
    leave(f);
    return t;
}

static accel_status fake_end(accel_pg *pg, void *ticket) {
    fake *f = enter(pg);
    f->deferred = false;
    ((fake_ticket *)ticket)->op = f->n_ops - 1;
    leave(f);
    return ACCEL_OK;
}

/* One look at ticket t (fake_query's body). */
static accel_status query_ticket(accel_pg *pg, fake *f, fake_ticket *t, bool *done) {
    f->queries++;
    CHECK(!f->deferred);
    if (f->aborted) return accel_set_error(ACCEL_ERR_DIST, "fake: aborted by an earlier failure");
    if (t == f->failing) {
        f->aborted = true;
        return accel_set_error(ACCEL_ERR_DIST, "peer 0 closed the connection (fake)");
    }
    *done = !f->stuck && ++t->polls >= POLLS_TO_RUN;
    if (*done) run_through(pg, t->op);
    return ACCEL_OK;
}

static accel_status fake_query(accel_pg *pg, void *ticket, bool *done) {
    fake *f = enter(pg);
    accel_status st = query_ticket(pg, f, ticket, done);
    leave(f);
    return st;
}

static accel_status fake_join(accel_pg *pg, void *ticket) {
    (void)ticket;
    fake *f = enter(pg);
    f->joins++;
    leave(f);
    return ACCEL_OK;
}

static void fake_abort(accel_pg *pg) {
    fake *f = enter(pg);
    f->aborts++;
    f->aborted = true;
    leave(f);
}

static void fake_release(accel_pg *pg, void *ticket) {
    fake *f = enter(pg);
    f->live_tickets--;
    free(ticket);
    leave(f);
}

static const accel__stream_ops FAKE_STREAM = {fake_takes, fake_begin, fake_end, fake_query,
                                              fake_join,  fake_abort, fake_release};

static const accel__backend FAKE = {
    .name = "fake",
    .init = fake_init,
    .finalize = fake_finalize,
    .barrier = fake_barrier,
    .all_reduce = fake_all_reduce,
    .reducible = fake_reducible,
    .broadcast = fake_broadcast,
    .all_gatherv = fake_all_gatherv,
    .reduce_scatter = fake_reduce_scatter,
    .stream = &FAKE_STREAM,
};

/* Rank 1 of a group of 2 on the test backend. */
static accel_pg *fake_group(fake *f, double timeout_s, bool debug) {
    memset(f, 0, sizeof *f);
    accel_pg *pg = calloc(1, sizeof *pg);
    CHECK(pg != NULL);
    pg->rank = pg->local_rank = 1;
    pg->size = pg->local_size = 2;
    pg->be = &FAKE;
    pg->impl = f;
    pg->timeout_s = timeout_s;
    pg->debug = debug;
    pg->check_sites = true;
    pg->hashed.line = -1;
    snprintf(pg->op_desc, sizeof pg->op_desc, "init");
    return pg;
}

static void fill(float *x, float v) {
    for (int i = 0; i < N; i++) x[i] = v;
}

static bool all_equal(const float *x, float v) {
    for (int i = 0; i < N; i++)
        if (x[i] != v) return false;
    return true;
}

/* ---- the cases */

static void test_issue_order_and_wait(void) {
    fake f;
    accel_pg *pg = fake_group(&f, 30, false);
    float host[N];
    fill(host, 1);
    fill(g_dev[0], 2);
    fill(g_dev[1], 3);
    accel_work *a = accel_pg_all_reduce_async(pg, host, N, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_work *b = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_work *c = accel_pg_all_reduce_async(pg, g_dev[1], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK(a && b && c);
    /* the host work ran first, on another thread; b and c are enqueued from this one, deferred, in order */
    CHECK(f.n_log == 3);
    CHECK(f.log[0].kind == OP_ALL_REDUCE && !f.log[0].deferred && !pthread_equal(f.log[0].thread, pthread_self()));
    CHECK(f.ops[1].recv == g_dev[0] && f.ops[2].recv == g_dev[1]);
    for (int k = 1; k < 3; k++) CHECK(f.log[k].deferred && pthread_equal(f.log[k].thread, pthread_self()));
    CHECK(all_equal(g_dev[0], 2) && all_equal(g_dev[1], 3)); /* enqueued, not run */
    CHECK(!accel_work_done(b)); /* one poll: not yet */
    /* wait: the caller's stream joined, and back only once the work has run */
    CHECK_MSG(accel_work_wait(c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(f.joins == 1);
    CHECK(all_equal(g_dev[1], 6) && all_equal(g_dev[0], 4)); /* the stream ran b before c */
    CHECK(accel_work_wait(b) == ACCEL_OK && accel_work_wait(b) == ACCEL_OK); /* more than once */
    CHECK(accel_work_wait(a) == ACCEL_OK && all_equal(host, 2));
    accel_work_free(a);
    accel_work_free(b);
    accel_work_free(c);
    CHECK(f.live_tickets == 0);
    /* a synchronous call does not wait for stream work on the host (the stream orders it) */
    accel_work *d = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    int queries = f.queries;
    CHECK_MSG(accel_pg_barrier(pg) == ACCEL_OK, "%s", accel_last_error());
    CHECK(f.queries == queries && f.n_log == 5 && f.log[4].kind == OP_BARRIER && !f.log[4].deferred);
    CHECK(accel_work_wait(d) == ACCEL_OK && all_equal(g_dev[0], 8));
    accel_work_free(d);
    accel_pg_free(pg);
}

static void test_other_kinds_and_debug(void) {
    fake f;
    accel_pg *pg = fake_group(&f, 30, true);
    float *send = g_dev[2], *gathered = g_dev[3], *scattered = g_dev[5], *bcast = g_dev[6];
    for (int i = 0; i < N; i++) send[i] = (float)i;
    accel_work *g = accel_pg_all_gather_async(pg, send, gathered, N / 2, ACCEL_F32);
    /* debug mode: the signatures compared (a synchronous gather of host memory), then the enqueue */
    CHECK(f.n_log == 2 && !f.log[0].deferred && f.log[0].kind == OP_GATHERV && f.log[1].deferred);
    accel_work *r = accel_pg_reduce_scatter_async(pg, send, scattered, N / 2, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_work *b = accel_pg_broadcast_async(pg, bcast, N, ACCEL_F32, 0);
    CHECK(g && r && b);
    CHECK(f.n_log == 6 && f.log[3].deferred && f.log[3].kind == OP_REDUCE_SCATTER && f.log[5].kind == OP_BROADCAST);
    CHECK(accel_work_wait(b) == ACCEL_OK && accel_work_wait(g) == ACCEL_OK && accel_work_wait(r) == ACCEL_OK);
    for (int i = 0; i < N / 2; i++) {
        CHECK(gathered[i] == (float)i && gathered[N / 2 + i] == (float)i);
        CHECK(scattered[i] == 2.0f * (float)(N / 2 + i));
    }
    CHECK(all_equal(bcast, 7));
    accel_work_free(g);
    accel_work_free(r);
    accel_work_free(b);
    CHECK(f.live_tickets == 0);
    accel_pg_free(pg);
}

static void test_failure_named(void) {
    fake f;
    accel_pg *pg = fake_group(&f, 30, false);
    f.fail_next = true;
    accel_work *w1 = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_work *w2 = accel_pg_broadcast_async(pg, g_dev[1], N, ACCEL_F32, 0);
    CHECK(w1 && w2);
    CHECK(accel_work_wait(w1) == ACCEL_ERR_DIST);
    const char *e = accel_last_error();
    CHECK_STR_CONTAINS(e, "accel dist (fake): all_reduce(f32, 8) at test_dist_stream.c:");
    CHECK_STR_CONTAINS(e, "failed on rank 1: peer 0 closed the connection (fake)");
    /* the work in flight behind it fails too, naming its own call */
    CHECK(accel_work_wait(w2) == ACCEL_ERR_DIST);
    CHECK_STR_CONTAINS(accel_last_error(), "broadcast(f32, 8)");
    /* and the group is broken: the next call fails at once with the first message */
    CHECK(accel_pg_all_reduce(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM) == ACCEL_ERR_DIST);
    CHECK_STR_CONTAINS(accel_last_error(), "unusable after an earlier failure");
    CHECK_STR_CONTAINS(accel_last_error(), "peer 0 closed the connection");
    accel_work *w3 = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK(w3 && accel_work_done(w3) && accel_work_wait(w3) == ACCEL_ERR_DIST);
    accel_work_free(w1);
    accel_work_free(w2);
    accel_work_free(w3);
    CHECK(f.live_tickets == 0);
    accel_clear_error();
    accel_pg_free(pg);
}

static void test_timeout(void) {
    fake f;
    accel_pg *pg = fake_group(&f, 0.2, false);
    f.stuck = true;
    accel_work *w = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    double t0 = accel_now_seconds();
    CHECK(w && accel_work_wait(w) == ACCEL_ERR_TIMEOUT);
    double took = accel_now_seconds() - t0;
    CHECK_MSG(took >= 0.15 && took < 10, "waited %.2f s for a 0.2 s timeout", took);
    const char *e = accel_last_error();
    CHECK_STR_CONTAINS(e, "all_reduce(f32, 8) at test_dist_stream.c:");
    CHECK_STR_CONTAINS(e, "timed out after 0.2 s on rank 1");
    CHECK(f.aborts == 1);
    accel_work_free(w);
    CHECK(f.live_tickets == 0);
    accel_clear_error();
    accel_pg_free(pg);

    /* accel_work_done alone sees the timeout too */
    pg = fake_group(&f, 0.05, false);
    f.stuck = true;
    w = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK(w && !accel_work_done(w));
    t0 = accel_now_seconds();
    while (!accel_work_done(w) && accel_now_seconds() - t0 < 10) nanosleep(&(struct timespec){0, 1000000}, NULL);
    CHECK(accel_work_done(w) && accel_work_wait(w) == ACCEL_ERR_TIMEOUT && f.aborts == 1);
    accel_work_free(w);
    accel_clear_error();
    accel_pg_free(pg);
}

static void test_free_before_wait(void) {
    fake f;
    accel_pg *pg = fake_group(&f, 30, false);
    fill(g_dev[0], 1);
    fill(g_dev[1], 1);
    accel_work *w = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK(w);
    accel_work_free(w); /* waits for it */
    CHECK(all_equal(g_dev[0], 2) && f.live_tickets == 0);
    /* freeing shared memory waits for the work that may use it */
    void *sh = accel_pg_alloc_shared(pg, 64);
    w = accel_pg_all_reduce_async(pg, g_dev[1], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_pg_free_shared(pg, sh);
    CHECK(all_equal(g_dev[1], 2) && f.live_tickets == 0);
    int queries = f.queries;
    CHECK(accel_work_done(w) && f.queries == queries); /* finished: no more polls */
    accel_work_free(w);
    /* two in flight, freed out of issue order */
    w = accel_pg_all_reduce_async(pg, g_dev[1], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_work *x = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_work_free(x);
    accel_work_free(w);
    CHECK(all_equal(g_dev[1], 4) && all_equal(g_dev[0], 4) && f.live_tickets == 0);
    accel_pg_free(pg);
}

/* Blocks until the communication thread is inside the backend with host work. */
static void until_host_work_runs(fake *f) {
    while (!atomic_load(&f->in_host)) sched_yield();
}

static void test_one_thread_in_backend(void) {
    fake f;
    accel_pg *pg = fake_group(&f, 30, false);
    float host[N];
    fill(host, 1);
    fill(g_dev[0], 1);
    /* polled while the communication thread runs host work: not done until that is */
    accel_work *d = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_work *a = accel_pg_all_reduce_async(pg, host, N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK(d && a);
    until_host_work_runs(&f);
    int queries = f.queries;
    CHECK(!accel_work_done(d) && f.queries == queries);
    while (!accel_work_done(d)) sched_yield();
    CHECK(accel_work_done(a) && all_equal(g_dev[0], 2) && all_equal(host, 2));
    CHECK(accel_work_wait(d) == ACCEL_OK && accel_work_wait(a) == ACCEL_OK);
    accel_work_free(d);
    accel_work_free(a);
    /* waited for and failed (the backend aborted) while host work runs: after it */
    f.fail_next = true;
    d = accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM);
    a = accel_pg_all_reduce_async(pg, host, N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK(d && a);
    until_host_work_runs(&f);
    CHECK(accel_work_wait(d) == ACCEL_ERR_DIST);
    CHECK_STR_CONTAINS(accel_last_error(), "peer 0 closed the connection (fake)");
    CHECK(accel_work_wait(a) == ACCEL_OK && all_equal(host, 4));
    accel_work_free(d);
    accel_work_free(a);
    a = accel_pg_all_reduce_async(pg, host, N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK(a && accel_work_wait(a) == ACCEL_ERR_DIST); /* the group is broken for host work too */
    accel_work_free(a);
    CHECK(f.live_tickets == 0);
    accel_clear_error();
    accel_pg_free(pg);
}

/* A backend that reduces fewer dtypes than accel__reduce (nccl: no int16,
 * as torch's ProcessGroupNCCL) says so in its table: another dtype is
 * refused before the backend sees the call, synchronous or not, naming the
 * backend and what it reduces; the group goes on. */
static void test_reducible_per_backend(void) {
    fake f;
    accel_pg *pg = fake_group(&f, 30, false);
    int16_t host[N] = {0};
    CHECK(accel_pg_all_reduce(pg, host, N, ACCEL_I16, ACCEL_REDUCE_SUM) == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_pg_all_reduce: cannot reduce int16 on the fake backend (it reduces "
                                           "float32)");
    CHECK(accel_pg_reduce_scatter(pg, g_dev[0], g_dev[1], N / 2, ACCEL_I16, ACCEL_REDUCE_SUM) == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "cannot reduce int16 on the fake backend");
    CHECK(accel_pg_all_reduce_async(pg, g_dev[0], N, ACCEL_F64, ACCEL_REDUCE_MAX) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "cannot reduce float64 on the fake backend");
    CHECK(f.n_log == 0);
    accel_clear_error();
    fill(g_dev[0], 1);
    CHECK(accel_pg_all_reduce(pg, g_dev[0], N, ACCEL_F32, ACCEL_REDUCE_SUM) == ACCEL_OK && all_equal(g_dev[0], 2));
    accel_pg_free(pg);
}

int main(void) {
    alarm(120); /* a wait that never returns fails here, not at ctest's timeout */
    RUN(test_issue_order_and_wait);
    RUN(test_other_kinds_and_debug);
    RUN(test_failure_named);
    RUN(test_timeout);
    RUN(test_free_before_wait);
    RUN(test_one_thread_in_backend);
    RUN(test_reducible_per_backend);
    return check_summary();
}
