/* src/dist/dist.c — the default group: environment, rendezvous, argument
 * checks, debug-mode call matching, and the asynchronous queue.
 *
 * Every collective is described by a `call` (kind + arguments + label).
 * Synchronous entry points validate it, wait for earlier asynchronous work,
 * and run it on the calling thread; asynchronous ones validate it and queue
 * it for the group's communication thread, or, on buffers a backend with a
 * device stream takes (backend.h, accel__stream_ops), enqueue it on that
 * stream from the calling thread and finish it when it is polled or waited
 * for. Every path opens and closes the call the same way (open_call,
 * close_call), so debug checks, error context and the broken-group rule are
 * the same. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/plugin.h"
#include "core/prepared.h"
#include "core/str_to_bool.h"
#include "dist/backend.h"
#include "dist/claim.h"
#include "dist/env_rank.h"
#include "dist/failed_early.h"
#include "dist/slurm.h"

/* ---------------------------------------------------------------- environment */

typedef struct dist_env {
    int rank, world, local_rank, local_world;
    const char *addr;
    int port;
    double timeout_s;
    bool check_sites;
    bool insecure; /* several machines, no secret, ACCEL_INSECURE_NO_SECRET=1: warned about */
} dist_env;

/* The first of names that is set (empty counts: `RANK=` is an error, not
 * rank 0). SLURM's variables count only in a task of an srun step: a program
 * run by an sbatch script itself sees the job's SLURM_NTASKS and
 * SLURM_PROCID=0 but is one process (slurm.h). */
static const char *first_env(const char *const *names, const char **which) {
    bool slurm_step = accel__slurm_in_step();
    for (; *names; names++) {
        if (!slurm_step && !strncmp(*names, "SLURM_", 6)) continue;
        const char *v = getenv(*names);
        if (v) {
            if (which) *which = *names;
            return v;
        }
    }
    return NULL;
}

/* -1 when none set; -2 (+ error naming the variable) when not an integer in [lo, 10^6]. */
static long env_int(const char *const *names, long lo) {
    const char *which = NULL, *v = first_env(names, &which);
    long x;
    if (!v) return -1;
    return accel__parse_long(which, v, lo, 1000000, &x) == ACCEL_OK ? x : -2;
}

static const char *const RANK_VARS[] = {"RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
                                        "SLURM_PROCID", NULL};
static const char *const WORLD_VARS[] = {"WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE",
                                         "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", NULL};
static const char *const LRANK_VARS[] = {"LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                         "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", NULL};
static const char *const LWORLD_VARS[] = {"LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                          "MV2_COMM_WORLD_LOCAL_SIZE", NULL};
/* The debug-mode variables, read as Accelerate's str_to_bool (read_env
 * refuses a value that is no boolean). */
static const char *const DEBUG_MODE_VARS[] = {"ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE"};

/* The mpi backend: asked for, or started by mpirun (its rank variables set)
 * with no MASTER_ADDR for our own rendezvous. Without MPI in the build,
 * ACCEL_DIST_BACKEND=mpi fails later in choose_backend. */
static bool want_mpi(void) {
#ifdef ACCEL_HAVE_MPI
    const char *forced = getenv("ACCEL_DIST_BACKEND");
    if (forced && *forced) return !strcmp(forced, "mpi");
    const char *addr = getenv("MASTER_ADDR");
    return (!addr || !*addr) && (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE"));
#else
    return false;
#endif
}

/* A job on several machines listens on every interface: without a shared
 * secret anyone who reaches the ports could join it or read its keys. So it
 * needs ACCEL_JOB_SECRET, or an explicit ACCEL_INSECURE_NO_SECRET=1 (then
 * e->insecure, loudly warned about by warn_no_secret). One machine: `accel
 * launch` makes one up. */
static accel_status check_job_secret(dist_env *e) {
    const char *secret = getenv("ACCEL_JOB_SECRET");
    bool insecure;
    if (accel__env_bool("ACCEL_INSECURE_NO_SECRET", false, &insecure) != ACCEL_OK) return accel_last_status();
    if (e->local_world == e->world || (secret && *secret) || want_mpi()) return ACCEL_OK;
    if (insecure) {
        e->insecure = true;
        return ACCEL_OK;
    }
    return accel_set_error(ACCEL_ERR_INVALID_ARG,
                           "accel_dist_init: this job spans several machines (LOCAL_WORLD_SIZE=%d < WORLD_SIZE=%d) but "
                           "ACCEL_JOB_SECRET is %s, so anyone who can reach its ports could join it: export the "
                           "same non-empty secret on every machine, e.g. ACCEL_JOB_SECRET=$(od -An -N16 -tx1 "
                           "/dev/urandom | tr -d ' \\n'), or set ACCEL_INSECURE_NO_SECRET=1 to run without one",
                           e->local_world, e->world, secret ? "set but empty (an empty secret is none)" : "not set");
}

/* Once per machine (its local rank 0): the job runs without a secret. */
static void warn_no_secret(const dist_env *e) {
    if (e->insecure && e->local_rank == 0)
        fprintf(stderr, "accel: WARNING: ACCEL_INSECURE_NO_SECRET=1: this job on several machines has no "
                        "ACCEL_JOB_SECRET; any process that can reach %s:%d or the workers' ports can join it\n",
                e->addr, e->port);
}

/* Says why a program in a SLURM job of several tasks runs alone: no
 * launcher gave it a world and it is not a task of an srun step, so the
 * batch script started it (what Accelerate users get there too: one
 * process). */
static void note_batch_script(const dist_env *e) {
    const char *ntasks = getenv("SLURM_NTASKS");
    if (e->world != 1 || accel__slurm_in_step() || first_env(WORLD_VARS, NULL) || !ntasks || !*ntasks ||
        !strcmp(ntasks, "1"))
        return;
    fprintf(stderr, "accel: SLURM_NTASKS=%s but this process is not a task of an srun step (no SLURM_STEP_ID: "
                    "started by the batch script itself?), so it runs as 1 process; start it with srun (or "
                    "`srun accel launch`) to run the job's %s tasks\n", ntasks, ntasks);
}

/* The backend built into the library called name (shm, tcp, self), or NULL
 * (a plug-in's process group, or no backend). */
static const accel__backend *builtin_backend(const char *name) {
    if (!strcmp(name, "shm")) return &accel__backend_shm;
    if (!strcmp(name, "tcp")) return &accel__backend_tcp;
    if (!strcmp(name, "self")) return &accel__backend_self;
    return NULL;
}

accel_status accel__dist_env_rank(int *rank) {
    long r = env_int(RANK_VARS, 0);
    if (r == -2) return accel_last_status();
    *rank = r < 0 ? 0 : (int)r;
    return ACCEL_OK;
}

/* Where this process meets its job: rank, world, local ranks, the store's
 * address and port, the timeout, and a secret when the job needs one. What it
 * has read of these lets a rank that fails later, before the rendezvous, tell
 * the others why (accel__dist_failed_early). */
static accel_status read_meeting(dist_env *e) {
    accel_status rank_st = accel__dist_env_rank(&e->rank);
    long w = env_int(WORLD_VARS, 1), lr = env_int(LRANK_VARS, 0), lw = env_int(LWORLD_VARS, 1);
    if (rank_st != ACCEL_OK || w == -2 || lr == -2 || lw == -2) return accel_last_status();
    bool slurm = accel__slurm_started(); /* srun: SLURM says how many tasks share this machine */
    int slurm_local;
    if (slurm && lw < 0) {
        if (accel__slurm_local_world(&slurm_local) != ACCEL_OK) return accel_last_status();
        lw = slurm_local;
    }
    e->world = w < 0 ? 1 : (int)w;
    if (e->rank >= e->world)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: rank %d is not below the world size %d",
                               e->rank, e->world);
    e->local_rank = lr < 0 ? e->rank : (int)lr;
    e->local_world = lw < 0 ? e->world : (int)lw;
    /* Taken as given, a local rank past its machine picked a wrong GPU, and a
     * local world above the world read as "several machines". (A local rank
     * that no variable gives is the rank, whatever the local world.) */
    if (e->local_world > e->world)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: LOCAL_WORLD_SIZE=%d is larger than "
                               "WORLD_SIZE=%d", e->local_world, e->world);
    if (lr >= 0 && e->local_rank >= e->local_world)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: LOCAL_RANK=%d is not below "
                               "LOCAL_WORLD_SIZE=%d", e->local_rank, e->local_world);
    const char *addr = getenv("MASTER_ADDR");
    if (addr && !*addr) /* read strictly, as every variable: set but empty is not "unset" */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: MASTER_ADDR is set but empty (unset it to "
                               "use 127.0.0.1 on one machine, or name the main machine)");
    if ((!addr || !*addr) && slurm && e->local_world < e->world) {
        /* Exported, so that the tcp backend finds its route to it as for a launcher's MASTER_ADDR. */
        char host[256];
        if (accel__slurm_main_host(host, sizeof host) != ACCEL_OK) return accel_last_status();
        if (setenv("MASTER_ADDR", host, 1) != 0)
            return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: cannot set MASTER_ADDR=%s", host);
        addr = getenv("MASTER_ADDR");
    }
    if ((!addr || !*addr) && e->local_world < e->world && !want_mpi())
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_dist_init: MASTER_ADDR must be set when ranks span several machines");
    e->addr = addr && *addr ? addr : "127.0.0.1";
    long port;
    if (accel__env_long("MASTER_PORT", -1, 1, 65535, &port) != ACCEL_OK) return accel_last_status();
    if (port < 0 && slurm && accel__slurm_job_port(&port) != ACCEL_OK) return accel_last_status();
    e->port = port < 0 ? 29500 : (int)port;
    /* bounded: deadlines become ints of ms and time_t */
    if (accel__env_double("ACCEL_DIST_TIMEOUT", 300, 0, ACCEL__MAX_TIMEOUT_S, &e->timeout_s) != ACCEL_OK)
        return accel_last_status();
    return check_job_secret(e);
}

/* The group's options: debug mode, call-site checks, a forced backend. */
static accel_status read_options(dist_env *e) {
    for (int i = 0; i < 2; i++) {
        bool on;
        if (accel__env_bool(DEBUG_MODE_VARS[i], false, &on)) return accel_last_status();
    }
    /* a name no backend has is refused here, whatever the world size (one process runs "self" without
     * reading it); whether a known one can serve this job is checked when the backend is chosen */
    const char *forced = getenv("ACCEL_DIST_BACKEND");
    if (forced && !*forced)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: ACCEL_DIST_BACKEND is set but empty (unset "
                               "it, or name a backend)");
    if (forced && !builtin_backend(forced) && !accel__plugin_knows_pg(forced))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: ACCEL_DIST_BACKEND='%s' names no backend "
                               "(shm, tcp, self, or a plug-in's process group such as nccl)", forced);
    long check_sites;
    if (accel__env_long("ACCEL_DIST_CHECK_CALL_SITES", 1, 0, 1, &check_sites) != ACCEL_OK) return accel_last_status();
    e->check_sites = check_sites == 1;
    return ACCEL_OK;
}

bool accel_dist_debug_mode(void) {
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(DEBUG_MODE_VARS[i]);
        if (v && accel__str_to_bool(v, strlen(v)) == 1) return true;
    }
    return false;
}

/* ---------------------------------------------------------------- calls */

typedef enum call_kind {
    K_ALL_REDUCE, K_BROADCAST, K_ALL_GATHER, K_ALL_GATHERV, K_REDUCE_SCATTER, K_GATHER,
    K_ALL_TO_ALL, /* typed kinds above, before K_BARRIER */
    K_BARRIER, K_BROADCAST_BYTES, K_ALL_GATHER_BYTES,
} call_kind;

static const char *const KIND_NAME[] = {"all_reduce", "broadcast", "all_gather", "all_gatherv",
                                        "reduce_scatter", "gather", "all_to_all", "barrier",
                                        "broadcast_bytes", "all_gather_bytes"};

typedef struct call {
    call_kind kind;
    const void *send;
    void *buf;            /* in/out or recv */
    size_t count;
    accel_dtype dt;
    accel_reduce_op op;
    int root;
    const size_t *counts; /* all_gatherv */
    void **data_out;      /* bytes ops */
    size_t *len_io;
    size_t *lens_out;
    char label[48];
    const char *file; /* the caller's call site (accel_dist_set_call_site), NULL when none */
    int line;
    bool other_sites_allowed; /* the site is reported but not compared across ranks */
} call;

struct accel_work {
    accel_pg *pg;
    /* Host-buffer work: its queue, which outlives the group until the caller
     * has freed every work it was handed (queue_destroy). */
    accel__work_queue *q;
    call c;
    atomic_bool done;
    accel_status st;
    char msg[1024];
    accel_work *next; /* the queue or its free list; streamed: pg->streamed */
    /* Stream-ordered work (pg->be->stream): the backend's ticket until it
     * finishes, when it was issued (its timeout runs from there), and the
     * call as note_call described it (later calls overwrite pg->op_desc). */
    bool streamed;
    void *ticket;
    double issued_s;
    char op_desc[sizeof ((accel_pg *)0)->op_desc];
};

struct accel__work_queue {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* new work or stop */
    pthread_cond_t done_cv; /* some work finished */
    accel_work *head, *tail, *free_list;
    int pending;
    int held;    /* works handed to the caller and not yet freed */
    bool closed; /* its group is gone: the last held work's accel_work_free frees it */
    bool stop;
};

static _Thread_local char tl_label[48];

void accel_dist_set_op_label(const char *label) {
    snprintf(tl_label, sizeof tl_label, "%s", label ? label : "");
}

static void describe(const call *c, char *out, size_t n) {
    int o;
    if (c->kind == K_BARRIER) o = snprintf(out, n, "barrier()");
    else if (c->kind >= K_BROADCAST_BYTES) o = snprintf(out, n, "%s(bytes)", KIND_NAME[c->kind]);
    else o = snprintf(out, n, "%s(%s, %zu)", KIND_NAME[c->kind], accel__dtype_short(c->dt), c->count);
    if (c->label[0] && o > 0 && (size_t)o < n) snprintf(out + o, n - (size_t)o, " [%s]", c->label);
}

/* pg->site and pg->op_desc for the call c this rank begins now. */
static void note_call(accel_pg *pg, const call *c) {
    accel__site *s = &pg->site;
    s->seq++;
    s->kind = (uint8_t)c->kind;
    s->dtype = c->kind == K_BARRIER || c->kind >= K_BROADCAST_BYTES ? 0xff : (uint8_t)c->dt;
    s->count = c->kind == K_BARRIER || c->kind >= K_BROADCAST_BYTES ? 0 : c->count; /* blob sizes differ by rank */
    s->line = c->file ? c->line : 0;
    if (c->file != pg->hashed.file || c->line != pg->hashed.line) { /* a new site: once, not per call of a loop */
        const char *f = c->file ? c->file : "", *slash = strrchr(f, '/');
        f = slash ? slash + 1 : f;
        size_t len = strlen(f), keep = len < sizeof s->file - 1 ? len : sizeof s->file - 1;
        memcpy(s->file, f + len - keep, keep);
        memset(s->file + keep, 0, sizeof s->file - keep); /* the whole record crosses to the peers */
        pg->hashed.file = c->file;
        pg->hashed.line = c->line;
        pg->hashed.hash = accel__site_hash(s->file, s->line);
    }
    s->site_hash = c->file && !c->other_sites_allowed && pg->check_sites ? pg->hashed.hash : 0;
    describe(c, pg->op_desc, sizeof pg->op_desc);
    size_t o = strlen(pg->op_desc);
    if (s->line && o < sizeof pg->op_desc)
        snprintf(pg->op_desc + o, sizeof pg->op_desc - o, " at %s:%d", s->file, (int)s->line);
}

void accel__site_describe(const accel__site *s, char *out, size_t n) {
    if (s->kind == ACCEL__SITE_SEND || s->kind == ACCEL__SITE_RECV) {
        accel__p2p_describe(s, out, n);
        return;
    }
    if (s->seq == 0) {
        snprintf(out, n, "no collective yet");
        return;
    }
    int o;
    const char *kind = s->kind <= K_ALL_GATHER_BYTES ? KIND_NAME[s->kind] : "?";
    if (s->kind == K_BARRIER) o = snprintf(out, n, "#%u barrier()", s->seq);
    else if (s->kind >= K_BROADCAST_BYTES) o = snprintf(out, n, "#%u %s(bytes)", s->seq, kind);
    else
        o = snprintf(out, n, "#%u %s(%s, %llu)", s->seq, kind,
                     s->dtype < ACCEL_DTYPE_COUNT ? accel__dtype_short((accel_dtype)s->dtype) : "?",
                     (unsigned long long)s->count);
    if (s->line > 0 && o > 0 && (size_t)o < n)
        snprintf(out + o, n - (size_t)o, " at %.*s:%d", (int)strnlen(s->file, sizeof s->file - 1), s->file,
                 (int)s->line);
}

/* Per-rank arrays of a collective live on the stack up to this many ranks
 * (past it, in the allocator's memory), so that a steady training step
 * allocates nothing (tests/count_alloc.h counts the library's allocations). */
#define SMALL_WORLD 64

/* What debug mode compares: everything that must agree across ranks. */
typedef struct call_sig {
    int32_t kind, dtype, op, root;
    uint64_t count; /* 0 for the uneven (v/bytes) ops */
    char label[48];
} call_sig;

static accel_status debug_check(accel_pg *pg, const call *c) {
    call_sig me;
    memset(&me, 0, sizeof me);
    me.kind = (int32_t)c->kind;
    me.dtype = c->kind == K_BARRIER || c->kind >= K_BROADCAST_BYTES ? -1 : (int32_t)c->dt;
    me.op = c->kind == K_ALL_REDUCE || c->kind == K_REDUCE_SCATTER ? (int32_t)c->op : -1;
    me.root = c->kind == K_BROADCAST || c->kind == K_GATHER || c->kind == K_BROADCAST_BYTES ? c->root : -1;
    me.count = c->kind == K_ALL_GATHERV || c->kind >= K_BROADCAST_BYTES ? 0 : c->count;
    memcpy(me.label, c->label, sizeof me.label);
    int world = pg->size;
    call_sig *all = accel_malloc((size_t)world * sizeof *all);
    size_t *bytes = accel_malloc((size_t)world * sizeof *bytes);
    if (!all || !bytes) {
        accel_free(all);
        accel_free(bytes);
        return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
    }
    for (int k = 0; k < world; k++) bytes[k] = sizeof me;
    accel_status st = pg->be->all_gatherv(pg, &me, all, bytes, -1);
    bool same = true;
    for (int k = 1; st == ACCEL_OK && k < world; k++) same = same && memcmp(&all[k], &all[0], sizeof me) == 0;
    if (st == ACCEL_OK && !same) {
        char msg[2048], one[256];
        bool ops_differ = false, roots_differ = false; /* shown only when they are what differs */
        bool kinds_same = true;
        for (int k = 1; k < world; k++) kinds_same = kinds_same && all[k].kind == all[0].kind;
        for (int k = 1; k < world && kinds_same; k++) {
            ops_differ = ops_differ || all[k].op != all[0].op;
            roots_differ = roots_differ || all[k].root != all[0].root;
        }
        size_t o = (size_t)snprintf(msg, sizeof msg, "mismatched collectives: ");
        for (int k = 0; k < world && o < sizeof msg; k++) {
            call ck = {.kind = (call_kind)all[k].kind, .dt = (accel_dtype)all[k].dtype,
                       .count = (size_t)all[k].count};
            memcpy(ck.label, all[k].label, sizeof ck.label);
            ck.label[sizeof ck.label - 1] = 0;
            if ((unsigned)ck.kind > K_ALL_GATHER_BYTES) snprintf(one, sizeof one, "?");
            else describe(&ck, one, sizeof one);
            o += (size_t)snprintf(msg + o, sizeof msg - o, "%srank %d called %s", k ? ", " : "", k, one);
            if (roots_differ && all[k].root >= 0 && o < sizeof msg)
                o += (size_t)snprintf(msg + o, sizeof msg - o, " root=%d", all[k].root);
            if (ops_differ && all[k].op >= 0 && o < sizeof msg)
                o += (size_t)snprintf(msg + o, sizeof msg - o, " op=%s",
                                      (const char *[]){"sum", "avg", "max", "min"}[all[k].op & 3]);
        }
        st = accel_set_error(ACCEL_ERR_DIST, "%s", msg);
    }
    accel_free(all);
    accel_free(bytes);
    return st;
}

/* ---------------------------------------------------------------- all_to_all
 * The backend's own exchange when it has one (shm); else the generic
 * fallback: world rooted all_gatherv calls, the k-th gathering every rank's
 * block k onto rank k, straight into its recv (no temporary, world rounds of
 * latency instead of one). */
static accel_status run_all_to_all(accel_pg *pg, const void *send, void *recv, size_t block) {
    const accel__backend *be = pg->be;
    if (be->all_to_all) return be->all_to_all(pg, send, recv, block);
    int world = pg->size;
    size_t *bytes = accel_malloc((size_t)world * sizeof *bytes);
    if (!bytes) return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
    for (int k = 0; k < world; k++) bytes[k] = block;
    accel_status st = ACCEL_OK;
    for (int k = 0; k < world && st == ACCEL_OK; k++)
        st = be->all_gatherv(pg, (const char *)send + (size_t)k * block, recv, bytes, k);
    accel_free(bytes);
    return st;
}

static accel_status run_call(accel_pg *pg, const call *c) {
    const accel__backend *be = pg->be;
    int world = pg->size;
    size_t es = c->kind >= K_BARRIER ? 1 : accel_dtype_size(c->dt);
    switch (c->kind) {
    case K_ALL_REDUCE: return c->count ? be->all_reduce(pg, c->buf, c->count, c->dt, c->op) : ACCEL_OK;
    case K_BROADCAST: return be->broadcast(pg, c->buf, c->count * es, c->root);
    case K_BARRIER: return be->barrier(pg);
    case K_ALL_GATHER:
    case K_GATHER:
    case K_ALL_GATHERV: {
        /* on the stack up to SMALL_WORLD ranks: a steady step allocates nothing */
        size_t small[SMALL_WORLD], *bytes = world <= SMALL_WORLD ? small : accel_malloc((size_t)world * sizeof *bytes);
        if (!bytes) return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
        for (int k = 0; k < world; k++) bytes[k] = (c->kind == K_ALL_GATHERV ? c->counts[k] : c->count) * es;
        accel_status st = be->all_gatherv(pg, c->send, c->buf, bytes, c->kind == K_GATHER ? c->root : -1);
        if (bytes != small) accel_free(bytes);
        return st;
    }
    case K_REDUCE_SCATTER: {
        if (be->reduce_scatter) return be->reduce_scatter(pg, c->send, c->buf, c->count, c->dt, c->op);
        size_t n = c->count * (size_t)world;
        char *tmp = accel_malloc(n * es + 1);
        if (!tmp) return accel_last_status();
        if (n) memcpy(tmp, c->send, n * es);
        accel_status st = n ? be->all_reduce(pg, tmp, n, c->dt, c->op) : ACCEL_OK;
        if (st == ACCEL_OK && c->count) memcpy(c->buf, tmp + (size_t)pg->rank * c->count * es, c->count * es);
        accel_free(tmp);
        return st;
    }
    case K_ALL_TO_ALL: return run_all_to_all(pg, c->send, c->buf, c->count * es);
    case K_BROADCAST_BYTES: {
        uint64_t len = pg->rank == c->root ? *c->len_io : 0;
        if (be->broadcast(pg, &len, sizeof len, c->root) != ACCEL_OK) return accel_last_status();
        void *data = pg->rank == c->root ? *c->data_out : accel_malloc(len + 1);
        if (!data) return accel_set_error(ACCEL_ERR_OOM, "accel_pg_broadcast_bytes: out of memory (%llu bytes)",
                                          (unsigned long long)len);
        if (be->broadcast(pg, data, len, c->root) != ACCEL_OK) {
            if (pg->rank != c->root) accel_free(data);
            return accel_last_status();
        }
        if (pg->rank != c->root) {
            ((char *)data)[len] = 0;
            *c->data_out = data;
            *c->len_io = len;
        }
        return ACCEL_OK;
    }
    case K_ALL_GATHER_BYTES: {
        size_t *lens = c->lens_out, one = sizeof(size_t), total = 0;
        size_t *eight = accel_malloc((size_t)world * sizeof *eight);
        if (!eight) return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
        for (int k = 0; k < world; k++) eight[k] = one;
        accel_status st = be->all_gatherv(pg, &c->count, lens, eight, -1);
        accel_free(eight);
        if (st != ACCEL_OK) return st;
        for (int k = 0; k < world; k++) total += lens[k];
        char *out = accel_malloc(total + 1);
        if (!out) return accel_set_error(ACCEL_ERR_OOM, "accel_pg_all_gather_bytes: out of memory (%zu bytes)", total);
        st = be->all_gatherv(pg, c->send, out, lens, -1);
        if (st != ACCEL_OK) {
            accel_free(out);
            return st;
        }
        out[total] = 0;
        *c->data_out = out;
        return ACCEL_OK;
    }
    }
    return accel_set_error(ACCEL_ERR_STATE, "accel dist: unknown collective");
}

/* The bytes a call writes at c->buf (0 for the bytes ops, which allocate). */
static size_t written_bytes(const accel_pg *pg, const call *c) {
    size_t es = c->kind < K_BARRIER ? accel_dtype_size(c->dt) : 0, n = c->count;
    switch (c->kind) {
    case K_ALL_GATHER:
    case K_GATHER:
    case K_ALL_TO_ALL:
        return n * (size_t)pg->size * es;
    case K_ALL_GATHERV:
        n = 0;
        for (int r = 0; r < pg->size; r++) n += c->counts[r];
        return n * es;
    case K_ALL_REDUCE:
    case K_BROADCAST:
    case K_REDUCE_SCATTER:
        return n * es;
    default:
        return 0;
    }
}

/* A tombstone's backend: no operation, so nothing can reach a transport. */
static const accel__backend TOMBSTONE = {.name = "gone"};

/* The refusal of a call on a group broken by an earlier failure (a
 * tombstone's: its own message, the group it stands for being gone). */
static accel_status refuse_broken(const accel_pg *pg) {
    if (pg->be == &TOMBSTONE) return accel_set_error(pg->broken, "accel dist: %s", pg->broken_msg);
    return accel_set_error(pg->broken, "accel dist: the process group is unusable after an earlier failure: %s",
                           pg->broken_msg);
}

/* The groups made and not yet freed (linked by live_next), and the last id
 * given: a module that keeps a group's address asks accel__pg_live before it
 * reads the group, since the group may be gone and its address another's. */
static pthread_mutex_t g_live_lock = PTHREAD_MUTEX_INITIALIZER;
static accel_pg *g_live;
static uint64_t g_last_id;

/* pg, just made (its setup done), gets its id and joins the live groups. */
static void live_add(accel_pg *pg) {
    pthread_mutex_lock(&g_live_lock);
    pg->id = ++g_last_id;
    pg->live_next = g_live;
    g_live = pg;
    pthread_mutex_unlock(&g_live_lock);
}

static void live_remove(const accel_pg *pg) {
    pthread_mutex_lock(&g_live_lock);
    for (accel_pg **p = &g_live; *p; p = &(*p)->live_next)
        if (*p == pg) {
            *p = pg->live_next;
            break;
        }
    pthread_mutex_unlock(&g_live_lock);
}

bool accel__pg_live(uint64_t id) {
    pthread_mutex_lock(&g_live_lock);
    const accel_pg *p = g_live;
    while (p && p->id != id) p = p->live_next;
    pthread_mutex_unlock(&g_live_lock);
    return p != NULL;
}

accel__pg_ident accel__pg_identity(const accel_pg *pg) {
    return (accel__pg_ident){pg->id, pg->rank, pg->size, pg->local_rank, pg->local_size};
}

accel_pg *accel__pg_tombstone(const accel__pg_ident *of, const char *why) {
    accel_pg *t = accel_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->id = of->id;
    t->rank = of->rank, t->size = of->size, t->local_rank = of->local_rank, t->local_size = of->local_size;
    t->be = &TOMBSTONE;
    t->broken = ACCEL_ERR_STATE;
    snprintf(t->broken_msg, sizeof t->broken_msg, "%s", why);
    return t;
}

/* accel__pg_tombstone_unnamed's: nothing writes it, every call on a tombstone being refused before. */
static accel_pg g_unnamed = {.size = 1, .local_size = 1, .be = &TOMBSTONE, .broken = ACCEL_ERR_STATE,
                             .broken_msg = "the model is tensor-parallel over a process group that was freed "
                                           "(out of memory recording which)"};

accel_pg *accel__pg_tombstone_unnamed(void) { return &g_unnamed; }

void accel__pg_tombstone_free(accel_pg *t) {
    if (t && t != &g_unnamed && t->be == &TOMBSTONE) accel_free(t);
}

accel_status accel__pg_not_gone(const accel_pg *pg) { return pg->be == &TOMBSTONE ? refuse_broken(pg) : ACCEL_OK; }

/* Begins call c on this rank: its record (pg->site, pg->op_desc) and, in
 * debug mode, the comparison with every rank's call. */
static accel_status open_call(accel_pg *pg, const call *c) {
    note_call(pg, c);
    return pg->debug && pg->size > 1 ? debug_check(pg, c) : ACCEL_OK;
}

/* After a communication failure (st, the thread's error) the group is
 * marked broken so that every later call fails fast with the first message. */
static accel_status note_failure(accel_pg *pg, accel_status st) {
    if (st != ACCEL_OK && st != ACCEL_ERR_OOM && pg->broken == ACCEL_OK) {
        pg->broken = st;
        snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", accel_last_error());
    }
    return st;
}

/* Ends call c, which returned st. */
static accel_status close_call(accel_pg *pg, const call *c, accel_status st) {
    /* the receive buffer may be a parameter's (broadcast at prepare, ZeRO's
     * all-gather after the step): its storage version moves (core/prepared.h) */
    accel__storage_written(c->buf, written_bytes(pg, c));
    return note_failure(pg, st);
}

/* Runs one call on this thread. */
static accel_status exec_call(accel_pg *pg, const call *c) {
    if (pg->broken != ACCEL_OK) return refuse_broken(pg);
    accel_status st = open_call(pg, c);
    if (st == ACCEL_OK) st = run_call(pg, c);
    return close_call(pg, c, st);
}

/* ---------------------------------------------------------------- validation */

static bool reducible_on(const accel__backend *be, accel_dtype dt) {
    return be->reducible ? be->reducible(dt) : accel__dtype_reducible(dt);
}

/* dt is not one be reduces: the error names both and what be reduces. */
static accel_status refuse_unreducible(const accel__backend *be, accel_dtype dt, const char *fn) {
    char takes[128] = "";
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++)
        if (reducible_on(be, (accel_dtype)d))
            snprintf(takes + strlen(takes), sizeof takes - strlen(takes), "%s%s", *takes ? ", " : "",
                     accel_dtype_name((accel_dtype)d));
    return accel_set_error(ACCEL_ERR_DTYPE, "%s: cannot reduce %s on the %s backend (it reduces %s)", fn,
                           accel_dtype_name(dt), be->name, takes);
}

static accel_status check_call(accel_pg *pg, call *c, const char *fn) {
    if (!pg) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: process group is NULL", fn);
    memcpy(c->label, tl_label, sizeof c->label);
    accel__site_of_caller(&c->file, &c->line);
    c->other_sites_allowed = accel__other_sites_allowed();
    if (c->kind < K_BARRIER) {
        if ((unsigned)c->dt >= ACCEL_DTYPE_COUNT)
            return accel_set_error(ACCEL_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)c->dt);
        if ((c->kind == K_ALL_REDUCE || c->kind == K_REDUCE_SCATTER) && !reducible_on(pg->be, c->dt))
            return refuse_unreducible(pg->be, c->dt, fn);
        if ((c->kind == K_ALL_REDUCE || c->kind == K_REDUCE_SCATTER) && (unsigned)c->op > ACCEL_REDUCE_MIN)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: invalid reduce op %d", fn, (int)c->op);
        if (c->count > ((size_t)1 << 40))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: count %zu is too large", fn, c->count);
    }
    if ((c->kind == K_BROADCAST || c->kind == K_GATHER || c->kind == K_BROADCAST_BYTES) &&
        (c->root < 0 || c->root >= pg->size))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: root %d is not a rank of a group of %d", fn, c->root,
                               pg->size);
    switch (c->kind) {
    case K_ALL_REDUCE:
    case K_BROADCAST:
        if (c->count && !c->buf) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: buffer is NULL", fn);
        break;
    case K_ALL_GATHER:
    case K_REDUCE_SCATTER:
    case K_GATHER:
        if (c->count && (!c->send || (!c->buf && (c->kind != K_GATHER || pg->rank == c->root))))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: send or recv buffer is NULL", fn);
        break;
    case K_ALL_GATHERV:
        if (!c->counts) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: counts is NULL", fn);
        if (c->counts[pg->rank] != c->count)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: send_count %zu differs from counts[%d] = %zu", fn,
                                   c->count, pg->rank, c->counts[pg->rank]);
        if ((c->count && !c->send) || !c->buf)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: send or recv buffer is NULL", fn);
        break;
    case K_ALL_TO_ALL: {
        size_t span = c->count * (size_t)pg->size * accel_dtype_size(c->dt);
        if (c->count && (!c->send || !c->buf))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: send or recv buffer is NULL", fn);
        if (c->count && (const char *)c->send < (const char *)c->buf + span &&
            (const char *)c->buf < (const char *)c->send + span)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: send and recv overlap (%zu bytes each); "
                                   "all_to_all does not run in place", fn, span);
        break;
    }
    case K_BROADCAST_BYTES:
        if (!c->data_out || !c->len_io || (pg->rank == c->root && *c->len_io && !*c->data_out))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: data or len is NULL", fn);
        break;
    case K_ALL_GATHER_BYTES:
        if (!c->data_out || !c->lens_out || (c->count && !c->send))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: data, out or lens is NULL", fn);
        break;
    case K_BARRIER: break;
    }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- async queue */

static void *comm_main(void *arg) {
    accel__work_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        if (!q->head) break;
        accel_work *w = q->head;
        q->head = w->next;
        if (!q->head) q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        w->st = exec_call(w->pg, &w->c);
        snprintf(w->msg, sizeof w->msg, "%s", w->st == ACCEL_OK ? "" : accel_last_error());
        accel_clear_error();
        pthread_mutex_lock(&q->mu);
        atomic_store(&w->done, true);
        q->pending--;
        pthread_cond_broadcast(&q->done_cv);
    }
    pthread_mutex_unlock(&q->mu);
    accel_thread_cleanup();
    return NULL;
}

static accel__work_queue *queue_of(accel_pg *pg) {
    if (pg->q) return pg->q;
    accel__work_queue *q = accel_calloc(1, sizeof *q);
    if (!q) {
        accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
        return NULL;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    pthread_cond_init(&q->done_cv, NULL);
    if (pthread_create(&q->thread, NULL, comm_main, q) != 0) {
        accel_free(q);
        accel_set_error(ACCEL_ERR_STATE, "accel dist: cannot start the communication thread");
        return NULL;
    }
    pg->q = q;
    return q;
}

/* Waits for the work queued for the communication thread. */
static void drain_queue(accel_pg *pg) {
    accel__work_queue *q = pg->q;
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    while (q->pending > 0) pthread_cond_wait(&q->done_cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

/* Whether the communication thread still has work: it is then inside the
 * backend, which no other thread may enter (backend.h). Only this group's
 * caller queues work, so a false answer stays true until it queues more. */
static bool queue_busy(accel_pg *pg) {
    accel__work_queue *q = pg->q;
    if (!q) return false;
    pthread_mutex_lock(&q->mu);
    bool busy = q->pending > 0;
    pthread_mutex_unlock(&q->mu);
    return busy;
}

static void queue_free(accel__work_queue *q) {
    while (q->free_list) {
        accel_work *w = q->free_list;
        q->free_list = w->next;
        accel_free(w);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    pthread_cond_destroy(&q->done_cv);
    accel_free(q);
}

/* Stops the communication thread (every queued call has run when it exits).
 * Works the caller still holds are done but not freed: the queue they go
 * back to stays until the last of them is freed, so a group may be freed
 * before its works (any free order). */
static void queue_destroy(accel_pg *pg) {
    accel__work_queue *q = pg->q;
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pg->q = NULL;
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    bool held = q->held > 0;
    pthread_mutex_unlock(&q->mu);
    if (!held) queue_free(q);
}

void accel__poll_pause(unsigned spins, double elapsed_s) {
    if (spins < 2000) return;
    if (elapsed_s < 0.002) sched_yield();
    else nanosleep(&(struct timespec){0, elapsed_s < 0.1 ? 20000 : 200000}, NULL);
}

/* ---------------------------------------------------------------- stream-ordered work */

/* Whether call c goes on the backend's stream: an async kind on buffers it takes. */
static bool on_stream(accel_pg *pg, const call *c) {
    return pg && pg->be->stream && pg->be->stream->takes(pg, c->send, c->buf);
}

bool accel__pg_on_stream(accel_pg *pg, const void *buf) {
    return on_stream(pg, &(call){.kind = K_ALL_REDUCE, .buf = (void *)buf});
}

/* Enqueues call c on the backend's stream from this thread: *ticket marks its end. */
static accel_status stream_issue(accel_pg *pg, const call *c, void **ticket) {
    if (pg->broken != ACCEL_OK) return refuse_broken(pg);
    const accel__stream_ops *so = pg->be->stream;
    accel_status st = open_call(pg, c); /* debug mode's comparison is a call of its own: before begin */
    void *t = st ? NULL : so->begin(pg);
    if (!st && !t) st = accel_last_status();
    if (t) {
        st = run_call(pg, c);
        accel_status end = so->end(pg, t);
        if (!st) st = end;
        if (st) so->release(pg, t);
        else *ticket = t;
    }
    return note_failure(pg, st); /* nothing written yet: close_call comes when it finishes */
}

/* Streamed work w is over with status st (the thread's error when failed):
 * its ticket goes back and it leaves the group's list. */
static void stream_finish(accel_work *w, accel_status st) {
    accel_pg *pg = w->pg;
    w->st = close_call(pg, &w->c, st);
    snprintf(w->msg, sizeof w->msg, "%s", st ? accel_last_error() : "");
    pg->be->stream->release(pg, w->ticket);
    w->ticket = NULL;
    accel_work **link = &pg->streamed;
    while (*link != w) link = &(*link)->next;
    *link = w->next;
    w->next = NULL;
    atomic_store(&w->done, true);
}

/* The backend's cause (the thread's error) as the failure of w's call on this rank. */
static accel_status stream_failed(accel_work *w, accel_status st) {
    char cause[768];
    snprintf(cause, sizeof cause, "%s", accel_last_error());
    return accel_set_error(st, "accel dist (%s): %s failed on rank %d: %s", w->pg->be->name, w->op_desc,
                           w->pg->rank, cause);
}

/* One look at streamed work w, never blocking: finishes it when its work is
 * done, has failed, or has run past the group's timeout (then the backend
 * aborts it, so that no later call waits for a stuck peer). */
static bool stream_poll(accel_work *w) {
    if (atomic_load(&w->done)) return true;
    accel_pg *pg = w->pg;
    if (queue_busy(pg)) return false; /* the backend is the communication thread's until then */
    bool done = false;
    accel_status st = pg->be->stream->query(pg, w->ticket, &done);
    if (st) {
        st = stream_failed(w, st);
    } else if (!done && accel_now_seconds() - w->issued_s > pg->timeout_s) {
        pg->be->stream->abort(pg);
        st = accel_set_error(ACCEL_ERR_TIMEOUT,
                             "accel dist (%s): %s timed out after %g s on rank %d (its work was aborted; "
                             "ACCEL_DEBUG_MODE=1 names each rank's call; ACCEL_DIST_TIMEOUT sets the limit)",
                             pg->be->name, w->op_desc, pg->timeout_s, pg->rank);
    }
    if (st || done) stream_finish(w, st);
    return st || done;
}

/* Blocks until streamed work w is over (done, failed or timed out). */
static void stream_settle(accel_work *w) {
    drain_queue(w->pg); /* bounded: the communication thread's waits time out */
    double start = accel_now_seconds();
    for (unsigned spins = 0; !stream_poll(w); spins++) accel__poll_pause(spins, accel_now_seconds() - start);
}

/* An async call on stream buffers: issued now, in order after the work
 * queued before it. A failure to issue is the work's status, as on the
 * communication thread. */
static accel_work *submit_streamed(accel_pg *pg, const call *c, const char *fn) {
    drain_queue(pg); /* host-buffer work issued earlier goes first: every rank issues in one order */
    accel_work *w = accel_calloc(1, sizeof *w);
    if (!w) {
        accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", fn);
        return NULL;
    }
    w->pg = pg;
    w->c = *c;
    w->streamed = true;
    w->st = stream_issue(pg, c, &w->ticket);
    w->issued_s = accel_now_seconds();
    snprintf(w->op_desc, sizeof w->op_desc, "%s", pg->op_desc);
    if (w->st) {
        snprintf(w->msg, sizeof w->msg, "%s", accel_last_error());
        atomic_store(&w->done, true);
        return w;
    }
    accel_work **link = &pg->streamed;
    while (*link) link = &(*link)->next;
    *link = w;
    return w;
}

/* Waits for every asynchronous call of the group. */
static void drain(accel_pg *pg) {
    drain_queue(pg);
    while (pg->streamed) stream_settle(pg->streamed);
}

static accel_work *submit(accel_pg *pg, call *c, const char *fn) {
    if (check_call(pg, c, fn) != ACCEL_OK) return NULL;
    if (pg->be == &TOMBSTONE) { /* no queue (a thread) for a group that is gone */
        refuse_broken(pg);
        return NULL;
    }
    if (on_stream(pg, c)) return submit_streamed(pg, c, fn);
    accel__work_queue *q = queue_of(pg);
    if (!q) return NULL;
    pthread_mutex_lock(&q->mu);
    accel_work *w = q->free_list;
    if (w) q->free_list = w->next;
    pthread_mutex_unlock(&q->mu);
    if (!w && !(w = accel_malloc(sizeof *w))) {
        accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", fn);
        return NULL;
    }
    w->pg = pg;
    w->q = q;
    w->c = *c;
    w->streamed = false;
    atomic_store(&w->done, false);
    w->st = ACCEL_OK;
    w->msg[0] = 0;
    w->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = w;
    else q->head = w;
    q->tail = w;
    q->pending++;
    q->held++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return w;
}

/* Streamed work needs no wait here: the backend runs its calls in one
 * stream's order, so this one follows it on the device (and a failure of
 * it is this call's failure too). */
static accel_status run_sync(accel_pg *pg, call *c, const char *fn) {
    if (check_call(pg, c, fn) != ACCEL_OK) return accel_last_status();
    drain_queue(pg);
    return exec_call(pg, c);
}

/* The caller's stream first waits for the work on the device (torch's
 * Work.wait); the host then waits too, so a host reader of the buffers and
 * the error report are as on the other backends. */
static void stream_wait(accel_work *w) {
    if (atomic_load(&w->done)) return;
    drain_queue(w->pg); /* no backend call while the communication thread is in it */
    accel_status st = w->pg->be->stream->join(w->pg, w->ticket);
    if (!st) {
        stream_settle(w);
        return;
    }
    st = stream_failed(w, st);
    w->pg->be->stream->abort(w->pg); /* nothing of a failed group stays running */
    stream_finish(w, st);
}

accel_status accel_work_wait(accel_work *w) {
    if (!w) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_work_wait: work is NULL");
    if (w->streamed) {
        stream_wait(w);
    } else if (!atomic_load(&w->done)) {
        accel__work_queue *q = w->q;
        pthread_mutex_lock(&q->mu);
        while (!atomic_load(&w->done)) pthread_cond_wait(&q->done_cv, &q->mu);
        pthread_mutex_unlock(&q->mu);
    }
    if (w->st != ACCEL_OK) return accel_set_error(w->st, "%s", w->msg);
    return ACCEL_OK;
}

bool accel_work_done(accel_work *w) { return w && (w->streamed ? stream_poll(w) : atomic_load(&w->done)); }

void accel_work_free(accel_work *w) {
    if (!w) return;
    if (w->streamed) {
        if (!atomic_load(&w->done)) stream_settle(w);
        accel_free(w);
        return;
    }
    accel__work_queue *q = w->q; /* not w->pg->q: the group may be gone (queue_destroy) */
    pthread_mutex_lock(&q->mu);
    while (!atomic_load(&w->done)) pthread_cond_wait(&q->done_cv, &q->mu);
    q->held--;
    if (q->closed) { /* its group was freed first: the last work frees the queue */
        bool last = q->held == 0;
        pthread_mutex_unlock(&q->mu);
        accel_free(w);
        if (last) queue_free(q);
        return;
    }
    w->next = q->free_list;
    q->free_list = w;
    pthread_mutex_unlock(&q->mu);
}

/* ---------------------------------------------------------------- entry points */

accel_status accel_pg_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt, accel_reduce_op op) {
    call c = {.kind = K_ALL_REDUCE, .buf = buf, .count = count, .dt = dt, .op = op};
    return run_sync(pg, &c, "accel_pg_all_reduce");
}
accel_work *accel_pg_all_reduce_async(accel_pg *pg, void *buf, size_t count, accel_dtype dt, accel_reduce_op op) {
    call c = {.kind = K_ALL_REDUCE, .buf = buf, .count = count, .dt = dt, .op = op};
    return submit(pg, &c, "accel_pg_all_reduce_async");
}
accel_status accel_pg_broadcast(accel_pg *pg, void *buf, size_t count, accel_dtype dt, int root) {
    call c = {.kind = K_BROADCAST, .buf = buf, .count = count, .dt = dt, .root = root};
    return run_sync(pg, &c, "accel_pg_broadcast");
}
accel_work *accel_pg_broadcast_async(accel_pg *pg, void *buf, size_t count, accel_dtype dt, int root) {
    call c = {.kind = K_BROADCAST, .buf = buf, .count = count, .dt = dt, .root = root};
    return submit(pg, &c, "accel_pg_broadcast_async");
}
accel_status accel_pg_all_gather(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt) {
    call c = {.kind = K_ALL_GATHER, .send = send, .buf = recv, .count = count, .dt = dt};
    return run_sync(pg, &c, "accel_pg_all_gather");
}
accel_work *accel_pg_all_gather_async(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt) {
    call c = {.kind = K_ALL_GATHER, .send = send, .buf = recv, .count = count, .dt = dt};
    return submit(pg, &c, "accel_pg_all_gather_async");
}
accel_status accel_pg_all_gatherv(accel_pg *pg, const void *send, size_t send_count, void *recv,
                                  const size_t *counts, accel_dtype dt) {
    call c = {.kind = K_ALL_GATHERV, .send = send, .buf = recv, .count = send_count, .counts = counts, .dt = dt};
    return run_sync(pg, &c, "accel_pg_all_gatherv");
}
accel_status accel_pg_reduce_scatter(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt,
                                     accel_reduce_op op) {
    call c = {.kind = K_REDUCE_SCATTER, .send = send, .buf = recv, .count = count, .dt = dt, .op = op};
    return run_sync(pg, &c, "accel_pg_reduce_scatter");
}
accel_work *accel_pg_reduce_scatter_async(accel_pg *pg, const void *send, void *recv, size_t count,
                                          accel_dtype dt, accel_reduce_op op) {
    call c = {.kind = K_REDUCE_SCATTER, .send = send, .buf = recv, .count = count, .dt = dt, .op = op};
    return submit(pg, &c, "accel_pg_reduce_scatter_async");
}
accel_status accel_pg_gather(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt, int root) {
    call c = {.kind = K_GATHER, .send = send, .buf = recv, .count = count, .dt = dt, .root = root};
    return run_sync(pg, &c, "accel_pg_gather");
}
accel_status accel_pg_all_to_all(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt) {
    call c = {.kind = K_ALL_TO_ALL, .send = send, .buf = recv, .count = count, .dt = dt};
    return run_sync(pg, &c, "accel_pg_all_to_all");
}
accel_status accel_pg_barrier(accel_pg *pg) {
    call c = {.kind = K_BARRIER};
    return run_sync(pg, &c, "accel_pg_barrier");
}
accel_status accel_pg_broadcast_bytes(accel_pg *pg, void **data, size_t *len, int root) {
    call c = {.kind = K_BROADCAST_BYTES, .data_out = data, .len_io = len, .root = root};
    return run_sync(pg, &c, "accel_pg_broadcast_bytes");
}
accel_status accel_pg_all_gather_bytes(accel_pg *pg, const void *data, size_t len, void **out, size_t *lens) {
    call c = {.kind = K_ALL_GATHER_BYTES, .send = data, .count = len, .data_out = out, .lens_out = lens};
    return run_sync(pg, &c, "accel_pg_all_gather_bytes");
}

/* Point to point (p2p.c) runs on the calling thread as a synchronous
 * collective does, outside the call records: only two ranks take part. */
accel_status accel__pg_p2p_enter(accel_pg *pg) {
    if (pg->broken != ACCEL_OK) return refuse_broken(pg);
    drain(pg);
    return ACCEL_OK;
}
accel_status accel__pg_p2p_leave(accel_pg *pg, accel_status st) { return note_failure(pg, st); }

int accel_pg_rank(const accel_pg *pg) { return pg ? pg->rank : 0; }
int accel_pg_size(const accel_pg *pg) { return pg ? pg->size : 1; }
const char *accel_pg_backend(const accel_pg *pg) { return pg ? pg->be->name : "none"; }

void *accel_pg_alloc_shared(accel_pg *pg, size_t bytes) {
    if (!pg) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_pg_alloc_shared: process group is NULL");
        return NULL;
    }
    if (pg->be->alloc_shared) return pg->be->alloc_shared(pg, bytes);
    void *p = accel_malloc(bytes ? bytes : 1);
    if (p) memset(p, 0, bytes);
    return p;
}

void accel_pg_free_shared(accel_pg *pg, void *ptr) {
    if (!pg || !ptr) return;
    drain(pg); /* an async all_reduce may still be using it */
    if (pg->be->free_shared) pg->be->free_shared(pg, ptr);
    else accel_free(ptr);
}

/* ---------------------------------------------------------------- default group */

/* The process's place in the job, shared by everything that took a reference
 * with accel_dist_init (each accelerator holds one): the last
 * accel_dist_finalize tears it down, so owners may go in any order. */
static accel_pg *g_default;
static int g_refs;
static pthread_mutex_t g_default_lock = PTHREAD_MUTEX_INITIALIZER;

/* Process-group backends that plug-ins brought (nccl with the cuda plug-in,
 * backends/plugin.h): set once each, read without a lock. */
enum { MAX_PLUGIN_PGS = 4 };
static const accel__backend *g_plugin_pg[MAX_PLUGIN_PGS];

accel_status accel__pg_backend_register(const accel__backend *b) {
    if (!b || !b->name) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__pg_backend_register: bad backend");
    for (int i = 0; i < MAX_PLUGIN_PGS; i++) {
        const accel__backend *had = NULL;
        if (__atomic_compare_exchange_n(&g_plugin_pg[i], &had, b, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) ||
            had == b)
            return ACCEL_OK;
        if (!strcmp(had->name, b->name))
            return accel_set_error(ACCEL_ERR_STATE, "accel__pg_backend_register: %s is registered", b->name);
    }
    return accel_set_error(ACCEL_ERR_STATE, "accel__pg_backend_register: more than %d plug-in backends",
                           MAX_PLUGIN_PGS);
}

static const accel__backend *plugin_pg(const char *name) {
    for (int i = 0; i < MAX_PLUGIN_PGS; i++) {
        const accel__backend *b = __atomic_load_n(&g_plugin_pg[i], __ATOMIC_ACQUIRE);
        if (b && !strcmp(b->name, name)) return b;
    }
    return NULL;
}

static const accel__backend *backend_by_name(const char *name) {
    const accel__backend *be = builtin_backend(name);
    if (be) return be;
    accel__plugin_load_pg(name); /* nccl: the cuda plug-in; mpi: its own */
    return plugin_pg(name);
}

#ifdef ACCEL_HAVE_MPI
#define BACKEND_LIST_MPI ", mpi"
#else
#define BACKEND_LIST_MPI ""
#endif
#define BACKEND_LIST "shm, tcp" BACKEND_LIST_MPI

/* Every rank publishes its hostname. shm when every rank is on this host and
 * the launcher did not say otherwise (LOCAL_WORLD_SIZE < WORLD_SIZE means
 * several machines, even on one host: e.g. a loopback test of a 2-machine
 * job); tcp otherwise; ACCEL_DIST_BACKEND overrides. */
static accel_status choose_backend(accel__store *st, const dist_env *e, const accel__backend **out) {
    char host[256] = "", key[64];
    if (accel__claim_rank(st, e->rank, e->world) != ACCEL_OK) return accel_last_status();
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "host/%d", e->rank);
    if (accel__store_set(st, key, host, strlen(host)) != ACCEL_OK) return accel_last_status();
    if (accel__store_wait_ranks(st, "host", e->world, "rendezvous") != ACCEL_OK) return accel_last_status();
    const char *forced = getenv("ACCEL_DIST_BACKEND");
    if (forced && *forced) {
        *out = backend_by_name(forced);
        if (!*out || *out == &accel__backend_self) {
            const char *why = accel__plugin_pg_reason(forced);
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_dist_init: ACCEL_DIST_BACKEND='%s' is not available "
                                   "for %d processes (this build has: " BACKEND_LIST "%s%s)", forced, e->world,
                                   *why ? "; its plug-in did not load: " : "", why);
        }
        return ACCEL_OK;
    }
    bool one_host = e->local_world == e->world;
    for (int k = 0; k < e->world && one_host; k++) {
        void *v;
        snprintf(key, sizeof key, "host/%d", k);
        if (accel__store_get(st, key, &v, NULL) != ACCEL_OK) return accel_last_status();
        one_host = strcmp(v, host) == 0;
        accel_free(v);
    }
    *out = one_host ? &accel__backend_shm : &accel__backend_tcp;
    return ACCEL_OK;
}

/* The pending error keeps this process from the rendezvous: noted with the
 * job's meeting place, to tell the others at exit (failed_early.h), when the
 * environment says where the job meets and it meets on the store. The
 * pending error stays the caller's. */
static void note_failed_early(void) {
    accel_status st = accel_last_status();
    char why[1024];
    snprintf(why, sizeof why, "%s", accel_last_error());
    dist_env e = {0};
    if (read_meeting(&e) == ACCEL_OK && e.world > 1 && !want_mpi())
        accel__failed_early_note(e.rank, e.world, e.addr, e.port, getenv("ACCEL_JOB_SECRET"), e.timeout_s, why);
    accel_set_error(st, "%s", why);
}

void accel__dist_failed_early(void) {
    pthread_mutex_lock(&g_default_lock);
    if (!g_default) note_failed_early(); /* a group is up: its rendezvous is over */
    pthread_mutex_unlock(&g_default_lock);
}

static accel_status create_default_group(void) {
    /* An earlier failure noted is over: this call's own is noted below, and
     * one in the rendezvous is the store's to tell (its claim, its connection
     * closed). Kept, the old message was posted at exit after a failed
     * rendezvous, and the exit could wait ACCEL_DIST_TIMEOUT for a store
     * rank 0 had closed. */
    accel__failed_early_forget();
    dist_env e = {0};
    if (read_meeting(&e) != ACCEL_OK) return accel_last_status();
    /* Said here, once per init: read_meeting runs again for a rank that fails before the rendezvous. */
    warn_no_secret(&e);
    note_batch_script(&e);
    if (read_options(&e) != ACCEL_OK) {
        note_failed_early();
        return accel_last_status();
    }
    accel__fit_threads_to_node(e.rank, e.local_world);
    accel_pg *pg = accel_calloc(1, sizeof *pg);
    if (!pg) return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
    pg->rank = e.rank;
    pg->size = e.world;
    pg->local_rank = e.local_rank;
    pg->local_size = e.local_world;
    pg->timeout_s = e.timeout_s;
    pg->debug = accel_dist_debug_mode();
    pg->hashed.line = -1;
    pg->check_sites = e.check_sites;
    snprintf(pg->op_desc, sizeof pg->op_desc, "init");
    accel_status st = ACCEL_OK;
    /* One process is the local "self" group, unless it asks for nccl: a
     * one-rank NCCL communicator (torch's init_process_group("nccl",
     * world_size=1)), which puts the collectives on the GPU all the same. */
    const char *forced = getenv("ACCEL_DIST_BACKEND");
    if (e.world == 1 && !(forced && !strcmp(forced, "nccl"))) {
        pg->be = &accel__backend_self;
    } else if (want_mpi()) {
        if (!(pg->be = backend_by_name("mpi"))) {
            st = accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_dist_init: the mpi process group did not load: %s",
                                 accel__plugin_pg_reason("mpi"));
        } else {
            st = pg->be->init(pg, NULL);
            if (st == ACCEL_OK) st = pg->be->barrier(pg);
            if (st != ACCEL_OK) pg->be->finalize(pg);
        }
    } else {
        accel__store *store = accel__store_open(e.addr, e.port, e.rank == 0, getenv("ACCEL_JOB_SECRET"),
                                                e.rank, e.timeout_s);
        if (!store) st = accel_last_status();
        if (st == ACCEL_OK) st = choose_backend(store, &e, &pg->be);
        if (st == ACCEL_OK) {
            st = pg->be->init(pg, store);
            /* This rank's waits on the store are over: its connection may close
             * without the store taking it for dead. Before the barrier, so that
             * no rank is still telling the store when another closes it. */
            if (st == ACCEL_OK) st = accel__store_done(store);
            /* Every rank is done with the store once all have passed this barrier. */
            if (st == ACCEL_OK) st = pg->be->barrier(pg);
            /* Several ranks per machine: shm inside each (ACCEL_DIST_BACKEND=tcp keeps the flat ring). */
            if (st == ACCEL_OK && pg->be == &accel__backend_tcp && !(forced && *forced)) st = accel__hier_wrap(pg);
            if (st != ACCEL_OK) pg->be->finalize(pg);
        }
        if (st == ACCEL_OK && e.rank == 0) pg->store = store; /* serves late claims until finalize */
        else accel__store_close(store);
    }
    if (st != ACCEL_OK) {
        accel_free(pg);
        return st;
    }
    live_add(pg);
    g_default = pg;
    return ACCEL_OK;
}

accel_status accel_dist_init(void) {
    pthread_mutex_lock(&g_default_lock);
    accel_status st = g_default ? ACCEL_OK : create_default_group();
    if (st == ACCEL_OK) g_refs++;
    pthread_mutex_unlock(&g_default_lock);
    return st;
}

/* Waits for its asynchronous work, a final barrier (collective), frees it. */
static void destroy_group(accel_pg *pg) {
    live_remove(pg);
    drain(pg);
    queue_destroy(pg);
    /* Before the barrier: a rank past it may init a new group at once, and
     * must find no store or the new one, not this group's (which would
     * refuse its claim as a duplicate). */
    accel__store_close(pg->store);
    pg->store = NULL;
    if (pg->broken == ACCEL_OK && pg->size > 1) {
        /* Ranks may leave from different lines (an early return on one): the site is not compared. */
        call c = {.kind = K_BARRIER, .other_sites_allowed = true};
        accel__site_of_caller(&c.file, &c.line);
        note_call(pg, &c);
        /* A failure here is reported but cannot stop the teardown. */
        if (pg->be->barrier(pg) != ACCEL_OK) { /* error stays pending for the caller */ }
    }
    pg->be->finalize(pg);
    accel_free(pg);
}

static void destroy_default_group(void) {
    destroy_group(g_default);
    g_default = NULL;
}

void accel_dist_finalize(void) {
    pthread_mutex_lock(&g_default_lock);
    if (g_refs > 0 && --g_refs == 0) destroy_default_group();
    pthread_mutex_unlock(&g_default_lock);
}

bool accel_dist_is_initialized(void) { return g_default != NULL; }

bool accel__dist_last_reference(void) {
    pthread_mutex_lock(&g_default_lock);
    bool last = g_refs <= 1;
    pthread_mutex_unlock(&g_default_lock);
    return last;
}

accel_pg *accel_dist_default_group(void) {
    if (!g_default) accel_set_error(ACCEL_ERR_STATE, "accel_dist_default_group: call accel_dist_init() first");
    return g_default;
}

static int env_or(const char *const *names, int dflt) {
    const char *v = first_env(names, NULL);
    char *end;
    long x = v ? strtol(v, &end, 10) : -1;
    return (v && !*end && x >= 0) ? (int)x : dflt;
}

int accel_dist_rank(void) { return g_default ? g_default->rank : env_or(RANK_VARS, 0); }
int accel_dist_world_size(void) { return g_default ? g_default->size : env_or(WORLD_VARS, 1); }
int accel_dist_local_rank(void) { return g_default ? g_default->local_rank : env_or(LRANK_VARS, accel_dist_rank()); }
int accel_dist_local_world_size(void) {
    return g_default ? g_default->local_size : env_or(LWORLD_VARS, accel_dist_world_size());
}

/* ---------------------------------------------------------------- subgroups */

/* What each rank of the parent tells the others when it splits. */
typedef struct split_rec {
    int32_t color, key, rank, machine; /* machine: the parent rank of its machine's first rank */
    char host[64];
} split_rec;

/* Where a subgroup's leader serves the rendezvous store for its members. */
typedef struct split_addr {
    char ip[64];
    int32_t port;
} split_addr;

/* a before b in the subgroup: by key, then by parent rank. */
static bool split_before(const split_rec *a, const split_rec *b) {
    return a->key != b->key ? a->key < b->key : a->rank < b->rank;
}

/* The members of `me`'s colour: the subgroup's rank and size, its leader's
 * parent rank, whether they share one machine, and this rank's place on its
 * machine among them. */
static void split_place(const split_rec *all, int world, const split_rec *me, accel_pg *sub, int *leader,
                        bool *one_machine) {
    *leader = -1;
    *one_machine = true;
    for (int k = 0; k < world; k++) {
        const split_rec *r = &all[k];
        if (r->color != me->color) continue;
        if (*leader < 0 || split_before(r, &all[*leader])) *leader = k;
        *one_machine &= r->machine == me->machine && !strcmp(r->host, me->host);
        sub->size++;
        sub->rank += split_before(r, me);
        bool mine = r->machine == me->machine && !strcmp(r->host, me->host);
        sub->local_size += mine;
        sub->local_rank += mine && split_before(r, me);
    }
}

/* The leader opens the subgroup's store (on loopback when its members share
 * a machine); every parent rank learns every leader's address (collective:
 * every rank takes part, even after a local failure, so the parent stays
 * matched). A subgroup of one needs none: *out stays NULL. */
static accel_status split_store(accel_pg *parent, const accel_pg *sub, int leader, bool one_machine,
                                accel__store **out) {
    split_addr mine = {{0}, 0}, *addrs = accel_calloc((size_t)parent->size, sizeof *addrs);
    accel__store *store = NULL;
    accel_status st = addrs ? ACCEL_OK : accel_set_error(ACCEL_ERR_OOM, "accel_pg_split: out of memory");
    if (!st && sub->rank == 0 && sub->size > 1) {
        if (one_machine) snprintf(mine.ip, sizeof mine.ip, "127.0.0.1");
        else st = accel__tcp_local_ip(mine.ip, sizeof mine.ip);
        store = st ? NULL : accel__store_open(mine.ip, 0, true, getenv("ACCEL_JOB_SECRET"), sub->rank,
                                                 parent->timeout_s);
        if (!st && !store) st = accel_last_status();
        if (store) mine.port = accel__store_port(store);
    }
    if (!addrs) return st;
    accel_status gst = accel_pg_all_gather(parent, &mine, addrs, sizeof mine, ACCEL_U8);
    if (!st) st = gst;
    if (!st && sub->size > 1 && !addrs[leader].port)
        st = accel_set_error(ACCEL_ERR_DIST, "accel_pg_split: rank %d (its subgroup's first) could not serve the "
                             "subgroup's rendezvous", leader);
    if (!st && sub->rank != 0) {
        store = accel__store_open(addrs[leader].ip, addrs[leader].port, false, getenv("ACCEL_JOB_SECRET"),
                                  sub->rank, parent->timeout_s);
        if (!store) st = accel_last_status();
    }
    accel_free(addrs);
    if (st) accel__store_close(store);
    else *out = store;
    return st;
}

/* Shared memory when the members share a machine (ACCEL_DIST_BACKEND=tcp
 * forces tcp), tcp otherwise; one member: self. */
static const accel__backend *split_backend(const accel_pg *sub, bool one_machine) {
    const char *forced = getenv("ACCEL_DIST_BACKEND");
    if (sub->size == 1) return &accel__backend_self;
    if (forced && !strcmp(forced, "tcp")) return &accel__backend_tcp;
    return one_machine ? &accel__backend_shm : &accel__backend_tcp;
}

accel_pg *accel_pg_split(accel_pg *parent, int color, int key) {
    if (!parent) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_pg_split: process group is NULL");
        return NULL;
    }
    bool own = parent->be->split != NULL; /* a backend that splits itself (mpi) */
    if (parent->be != &accel__backend_shm && parent->be != &accel__backend_tcp && parent->be != &accel__backend_self &&
        parent->be != &accel__backend_hier && !own) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_pg_split: subgroups of a %s group are not implemented (shm, "
                        "tcp, mpi and self groups split)", parent->be->name);
        return NULL;
    }
    split_rec me = {color, key, parent->rank, parent->rank - parent->local_rank, {0}};
    gethostname(me.host, sizeof me.host - 1);
    split_rec *all = accel_calloc((size_t)parent->size, sizeof *all);
    accel_pg *sub = accel_calloc(1, sizeof *sub);
    if (!all || !sub) {
        accel_free(all);
        accel_free(sub);
        accel_set_error(ACCEL_ERR_OOM, "accel_pg_split: out of memory");
        return NULL;
    }
    accel_status st = accel_pg_all_gather(parent, &me, all, sizeof me, ACCEL_U8);
    int leader = -1;
    bool one_machine = true;
    accel__store *store = NULL;
    if (!st) {
        split_place(all, parent->size, &me, sub, &leader, &one_machine);
        sub->timeout_s = parent->timeout_s;
        sub->debug = parent->debug;
        sub->check_sites = parent->check_sites; /* a subgroup compares call sites as its parent does */
        sub->hashed.line = -1;                  /* no site hashed yet (create_default_group) */
        sub->be = split_backend(sub, one_machine);
        snprintf(sub->op_desc, sizeof sub->op_desc, "accel_pg_split");
        if (!own) st = split_store(parent, sub, leader, one_machine, &store);
    }
    accel_free(all);
    if (own && !st) { /* the backend's own split (MPI_Comm_split): no store; every member stays in that backend */
        int rank = sub->rank, size = sub->size;
        st = parent->be->split(parent, color, key, sub);
        if (!st && (sub->rank != rank || sub->size != size))
            st = accel_set_error(ACCEL_ERR_DIST, "accel_pg_split: the %s backend's split made rank %d of %d, accel "
                                 "expected rank %d of %d", parent->be->name, sub->rank, sub->size, rank, size);
        if (!st) st = sub->be->barrier(sub);
        if (st && sub->impl) sub->be->finalize(sub);
        if (!st) {
            live_add(sub);
            return sub;
        }
        accel_free(sub);
        return NULL;
    }
    if (!st) {
        st = sub->be->init(sub, store);
        if (!st && store) st = accel__store_done(store); /* before the barrier; one member: no store */
        if (!st) st = sub->be->barrier(sub); /* every member is done with the store after it */
        if (st) sub->be->finalize(sub);
    }
    accel__store_close(store);
    if (st) {
        accel_free(sub);
        return NULL;
    }
    live_add(sub);
    return sub;
}

void accel_pg_free(accel_pg *pg) {
    /* the default group is accel_dist_finalize's, a tombstone its holder's (accel__pg_tombstone_free) */
    if (pg && pg != g_default && pg->be != &TOMBSTONE) destroy_group(pg);
}
