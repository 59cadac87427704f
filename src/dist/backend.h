/* src/dist/backend.h — the collective backend vtable and the process group
 * object (internal to dist/).
 *
 * dist.c validates arguments, runs debug-mode checks, serialises calls and
 * handles the async queue; a backend only moves and reduces bytes. Adding a
 * backend (mpi) = one more accel__backend and one line in dist.c's
 * selection; one of a device plug-in (nccl, hccl) is registered by the
 * plug-in's init (accel__pg_backend_register). Nothing above dist/ changes.
 *
 * Contract of every slot: called by every rank in the same order, from one
 * thread at a time; returns ACCEL_OK or sets an error (naming pg->op_desc for
 * context) and returns its status. Timeouts use pg->timeout_s. */
#ifndef ACCEL_DIST_BACKEND_H
#define ACCEL_DIST_BACKEND_H

#include <pthread.h>

#include "accel/dist.h"
#include "core/env.h"
#include "dist/store.h"

/* Stream-ordered asynchronous collectives, for a backend whose collectives
 * run on a device stream (nccl), as torch's ProcessGroupNCCL: an async call
 * on buffers the backend takes is enqueued at once from the calling thread,
 * its stream ordered after the caller's current stream, and a ticket marks
 * where it ends; dist.c keeps validation, ordering, debug checks, call sites,
 * the timeout and the error messages. Called on the thread that issues the
 * group's collectives, never while the communication thread runs host-buffer
 * work in the backend: dist.c calls a backend from one thread at a time, so
 * its state needs no lock. A ticket is the backend's (e.g. an event). */
/* Whether an async call on buf (in place) goes on pg's backend stream:
 * DDP checks that a device bucket it reduces in place does. */
bool accel__pg_on_stream(accel_pg *pg, const void *buf);
/* Who a group is, as those that outlive it remember it (a tensor-parallel
 * module): its id, unique in the process (a group made later never has it,
 * whatever address it gets: compare ids, not addresses), and this rank's
 * place in it. */
typedef struct accel__pg_ident {
    uint64_t id;
    int rank, size, local_rank, local_size;
} accel__pg_ident;
accel__pg_ident accel__pg_identity(const accel_pg *pg);
/* Whether the group of that id is made and not yet freed (a tombstone is
 * no group: its id is the one of the group it stands for). Thread-safe. */
bool accel__pg_live(uint64_t id);
/* A stand-in for group `of` once it is freed while others still hold it (a
 * tensor-parallel model's modules, after the accelerator that sliced it
 * went): of's id, rank and size, and every call on it fails (ACCEL_ERR_STATE)
 * with "accel dist: <why>". Freed with accel__pg_tombstone_free (NULL and
 * groups that are no tombstones: a no-op). */
accel_pg *accel__pg_tombstone(const accel__pg_ident *of, const char *why);
void accel__pg_tombstone_free(accel_pg *tombstone);
/* The stand-in for a freed group whose tombstone found no memory: one for
 * the process, of no group (id 0, rank 0 of 1), its calls refused
 * (ACCEL_ERR_STATE, "... freed (out of memory recording which)"); never
 * freed (accel__pg_tombstone_free leaves it). */
accel_pg *accel__pg_tombstone_unnamed(void);
/* ACCEL_OK for a group; a tombstone's refusal, as its calls fail, for a
 * tombstone: what a 1-rank group's user that calls no collective asks. */
accel_status accel__pg_not_gone(const accel_pg *pg);
/* Whether the default group has one holder left at most (accel_dist_init's
 * references): its accel_dist_finalize tears the group down. */
bool accel__dist_last_reference(void);
/* The pending error keeps this process from its job's rendezvous (a refused
 * option or variable, before accel_dist_init): unless a group is up, the
 * other ranks are told why when the process exits (dist/failed_early.h). The
 * pending error stays as it is. */
void accel__dist_failed_early(void);

typedef struct accel__stream_ops {
    /* Whether an async call on these buffers (send may be NULL; recv is the
     * in/out or receive buffer) goes on the stream; false: the group's
     * communication thread runs it as today. */
    bool (*takes)(accel_pg *pg, const void *send, const void *recv);
    /* Bracket one collective slot call: after begin, the slot orders the
     * stream after the caller's current stream, enqueues, and returns without
     * waiting; end (called whatever the slot returned) records where the
     * enqueued work ends into the ticket begin returned (NULL + error). */
    void *(*begin)(accel_pg *pg);
    accel_status (*end)(accel_pg *pg, void *ticket);
    /* Never blocks: *done once the ticket's work has finished. An error (a
     * failed peer: the backend has aborted its communicator) sets only the
     * cause; dist.c names the call and the rank. */
    accel_status (*query)(accel_pg *pg, void *ticket, bool *done);
    /* The caller's current stream waits for the ticket's work (the host does not). */
    accel_status (*join)(accel_pg *pg, void *ticket);
    /* Gives up on the enqueued work (the timeout): a stuck peer cannot hang
     * the caller; later calls fail. */
    void (*abort)(accel_pg *pg);
    void (*release)(accel_pg *pg, void *ticket);
} accel__stream_ops;

struct accel__p2p_msg;

typedef struct accel__backend {
    const char *name;
    /* Collective over the store: set up pg->impl. */
    accel_status (*init)(accel_pg *pg, accel__store *store);
    /* Release pg->impl (after a final barrier done by dist.c). */
    void (*finalize)(accel_pg *pg);
    accel_status (*barrier)(accel_pg *pg);
    /* In place; count elements of dt (a reducible dtype). */
    accel_status (*all_reduce)(accel_pg *pg, void *buf, size_t count, accel_dtype dt,
                               accel_reduce_op op);
    /* Optional (NULL => accel__dtype_reducible, what accel__reduce adds):
     * the dtypes all_reduce and reduce_scatter take; dist.c refuses any
     * other on every rank before the call, naming the backend. */
    bool (*reducible)(accel_dtype dt);
    accel_status (*broadcast)(accel_pg *pg, void *buf, size_t bytes, int root);
    /* Rank k contributes bytes[k] (send has bytes[rank]); recv gets them in
     * rank order. root < 0: every rank receives; else only root (recv may be
     * NULL elsewhere). */
    accel_status (*all_gatherv)(accel_pg *pg, const void *send, void *recv, const size_t *bytes,
                                int root);
    /* Optional (NULL => dist.c does all_reduce on a private copy of send and
     * keeps block `rank`). send[world*count] -> recv[count]. */
    accel_status (*reduce_scatter)(accel_pg *pg, const void *send, void *recv, size_t count,
                                   accel_dtype dt, accel_reduce_op op);
    /* Optional (NULL => dist.c runs world rooted all_gatherv calls, the k-th
     * gathering block k of every rank onto rank k). send[world*block] ->
     * recv[world*block], block k of send to rank k, block k of recv from
     * rank k; bytes, so any dtype; send and recv never overlap. */
    accel_status (*all_to_all)(accel_pg *pg, const void *send, void *recv, size_t block);
    /* Optional (NULL => accel_malloc + zero fill; no zero-copy). */
    void *(*alloc_shared)(accel_pg *pg, size_t bytes);
    void (*free_shared)(accel_pg *pg, void *ptr);
    /* Optional (NULL => every async call runs on the communication thread). */
    const accel__stream_ops *stream;
    /* Optional: a backend with its own communicators (mpi) splits itself.
     * sub (calloc'd by accel_pg_split) becomes the group of parent's ranks
     * that pass color, ranked by key then parent rank (collective over
     * parent): sets sub->be, impl, rank and size, with no store. NULL: dist.c
     * makes the subgroup over a store with a backend of its own choice. */
    accel_status (*split)(accel_pg *parent, int color, int key, accel_pg *sub);
    /* Optional (NULL => point to point is refused naming the backend): see
     * "point to point" below. */
    accel_status (*p2p)(accel_pg *pg, const struct accel__p2p_msg *tx, const struct accel__p2p_msg *rx);
} accel__backend;

extern const accel__backend accel__backend_self;
extern const accel__backend accel__backend_shm;
extern const accel__backend accel__backend_tcp;
#ifdef ACCEL_HAVE_MPI
/* init is called with store == NULL: MPI does its own rendezvous and sets
 * pg->rank / pg->size. */
extern const accel__backend accel__backend_mpi;
#endif

#ifdef ACCEL_HAVE_NCCL
/* GPU collectives (ACCEL_DIST_BACKEND=nccl); see nccl.c. In the cuda
 * plug-in, which registers it (backends/plugin.h). */
extern const accel__backend accel__backend_nccl;
#endif

/* Hierarchical collectives (hier.c): a tcp group pg (the default one, just
 * initialised) whose machines hold L > 1 consecutive ranks each, the same L
 * on every machine, gets shm inside each machine and tcp between them, unless
 * ACCEL_DIST_HIERARCHICAL=0 (collective over pg: every rank decides alike;
 * otherwise pg is left as it is). */
extern const accel__backend accel__backend_hier;
accel_status accel__hier_wrap(accel_pg *pg);
/* The backend a hierarchical group uses inside a machine ("shm") and how many
 * collectives went that way (calls may be NULL); NULL for any other group. */
const char *accel__pg_within_machine(const accel_pg *pg, uint64_t *calls);

/* Adds a backend a plug-in brings (ACCEL_DIST_BACKEND=<its name> finds it);
 * registering one name twice is an error. Thread-safe. */
accel_status accel__pg_backend_register(const accel__backend *b);

/* The address other machines reach this one at (tcp.c): ACCEL_DIST_HOST_ADDR,
 * else the local address of the route to MASTER_ADDR (127.0.0.1 on loopback). */
accel_status accel__tcp_local_ip(char *out, size_t n);

typedef struct accel__work_queue accel__work_queue;

/* Where a rank is: the collective it runs (or ran last), what it called and
 * from where (the file:line the collective macros of accel/dist.h and
 * accel/accelerator.h record). dist.c fills pg->site for every call; the
 * backends publish it where their peers can read it when something goes
 * wrong (shm: the rank's control line; tcp: each collective's header), so a
 * mismatch or timeout report says what every rank called, and where. A
 * plain 64-byte record: it crosses processes and machines as it is. */
typedef struct accel__site {
    uint32_t seq;          /* collectives this rank has begun, this one included (0: none yet) */
    uint8_t kind, dtype;   /* dist.c's call kind; dtype 0xff when the call has none */
    uint16_t site_hash;    /* accel__site_hash(file, line); 0: not compared across ranks */
    uint64_t count;        /* elements (0 for barrier and the *_bytes calls) */
    int32_t line;          /* 0: no call site recorded */
    char file[44];         /* the end of the caller's file name, NUL-terminated */
} accel__site;

/* "#3 all_reduce(f32, 1024) at train.c:42" (dist.c; never more than n - 1
 * chars; tolerates a torn record read from another process). */
void accel__site_describe(const accel__site *s, char *out, size_t n);
/* The call site the calling thread recorded last (accel_dist_set_call_site). */
void accel__site_of_caller(const char **file, int *line);
/* Whether the thread's current call may come from other lines on other
 * ranks (accel_dist_allow_other_call_sites before it, or inside it). */
bool accel__other_sites_allowed(void);
/* A 16-bit digest of file:line, never 0. */
uint16_t accel__site_hash(const char *file, int line);
/* Two ranks' records of one collective name the same call (kind, dtype,
 * count) from different call sites, and both are compared (site_hash != 0):
 * the same call from two lines, which is what
 * a collective skipped on some ranks looks like when the next one has the
 * same kind and arguments. */
bool accel__sites_differ(const accel__site *a, const accel__site *b);
/* The end of a call-site mismatch message. */
#define ACCEL__SITES_DIFFER_HINT                                                                                \
    "the same collective from different call sites: was a collective skipped on some ranks (one inside "     \
    "`if is_main_process`, a save on one rank only, loops of different lengths)? A call that differs on "     \
    "purpose: accel_dist_allow_other_call_sites() before it, or ACCEL_DIST_CHECK_CALL_SITES=0"


struct accel_pg {
    uint64_t id; /* accel__pg_identity's: numbered as made, from 1 */
    struct accel_pg *live_next; /* the groups made and not yet freed (dist.c, accel__pg_live) */
    int rank, size, local_rank, local_size;
    const accel__backend *be;
    void *impl;
    double timeout_s;
    bool debug;
    /* "all_reduce(f32, 1024) [label]": context for timeout/dead-peer messages. */
    char op_desc[192];
    accel__site site; /* this rank's current (or last) collective */
    bool check_sites; /* ACCEL_DIST_CHECK_CALL_SITES (default 1): compare call sites across ranks */
    struct { /* the last call site seen and its hash: a loop copies and hashes it once */
        const char *file;
        int line;
        uint16_t hash;
    } hashed;
    /* After a failure the group is unusable: later calls fail with this. */
    accel_status broken;
    char broken_msg[1024];
    accel__work_queue *q; /* async machinery, created on the first async call */
    accel_work *streamed; /* stream-ordered async work not yet finished, in issue order */
    /* Rank 0: the rendezvous store, still serving after init so that a late
     * duplicate rank or a launcher with another world size gets the refusal
     * naming the machines (claim.c) instead of a timeout; closed at finalize.
     * NULL elsewhere. */
    accel__store *store;
};

/* A collective's identity as the shm and tcp backends compare it across
 * ranks, always (not only in debug mode), so a rank in another collective - a
 * barrier against an all_reduce, or other arguments - fails instead of
 * completing it: the slot in the top 3 bits, a hash of the rank-independent
 * arguments in the low 13. */
typedef enum accel__slot {
    ACCEL__SLOT_BARRIER = 1, ACCEL__SLOT_ALL_REDUCE, ACCEL__SLOT_BROADCAST, ACCEL__SLOT_ALL_GATHERV,
    ACCEL__SLOT_REDUCE_SCATTER,
    ACCEL__SLOT_ALL_TO_ALL = 6,
    ACCEL__SLOT_P2P = 7, /* the last of the 3 bits: point-to-point messages (ACCEL__P2P_TAG) */
} accel__slot;
uint16_t accel__op_tag(accel__slot slot, uint64_t a, uint64_t b);
/* The tag of all_gatherv(bytes[world], root). */
uint16_t accel__gatherv_tag(const size_t *bytes, int world, int root);
/* A 16-bit digest of a record's call (kind, dtype, count), not of its site. */
uint16_t accel__call_digest(const accel__site *site);

/* ---------------------------------------------------------------- point to point (p2p.c)
 *
 * One side of a point-to-point transfer. Its record (site) is the call:
 * kind ACCEL__SITE_SEND or _RECV, dtype, count, call site, and - in seq,
 * which a collective uses for its number - the peer's rank. The sender's
 * record travels before its first byte; the receiver checks it with
 * accel__p2p_matches before it takes any data, and on a difference fails
 * with accel__p2p_mismatch (and tells the sender as the backend can).
 *
 * The slot sends tx->bytes to tx->peer while it receives rx->bytes from
 * rx->peer (a peer of -1: that side is absent), progressing both together,
 * so that two ranks sending to each other never deadlock. Only the two ranks
 * call; a collective's sequence (pg->site.seq, the backends' epochs) does not
 * move. Waits: no progress for pg->timeout_s is ACCEL_ERR_TIMEOUT naming the
 * peer, a dead peer ACCEL_ERR_DIST naming it. pg->op_desc describes the call. */
enum { ACCEL__SITE_SEND = 0x40, ACCEL__SITE_RECV = 0x41 };
/* A backend that tags what travels (tcp's op_hdr) tags a point-to-point
 * message with the last of accel__op_tag's 8 slots, which no collective uses. */
#define ACCEL__P2P_TAG ((uint16_t)((unsigned)ACCEL__SLOT_P2P << 13))
typedef struct accel__p2p_msg {
    int peer;
    char *buf;
    size_t bytes;
    accel__site site;
} accel__p2p_msg;
/* The sender's record `sent` is the message the receiver's `expected` waits for. */
bool accel__p2p_matches(const accel__site *sent, const accel__site *expected);
/* The receiver's error for a message (or a collective's record) `sent` from
 * peer that is not its `expected`: names both calls. */
accel_status accel__p2p_mismatch(const accel_pg *pg, const accel__site *sent, const accel__site *expected);
/* "send(f32, 8) to rank 1 at t.c:5" (accel__site_describe's, for these kinds). */
void accel__p2p_describe(const accel__site *s, char *out, size_t n);
/* dist.c's bracket of a point-to-point call: enter refuses a broken group and
 * waits for the group's asynchronous work (a backend serves one thread at a
 * time); leave marks the group broken after a failure (st) and returns st. */
accel_status accel__pg_p2p_enter(accel_pg *pg);
accel_status accel__pg_p2p_leave(accel_pg *pg, accel_status st);

/* The largest ACCEL_DIST_TIMEOUT (11.6 days): every deadline in ms then fits
 * an int (poll) and a time_t. */
#define ACCEL__MAX_TIMEOUT_S 1e6

/* Between two polls of work not done yet, `spins` polls and `elapsed_s`
 * seconds into the wait: busy at first, then yielding, then sleeping (20 us,
 * 200 us past 0.1 s), so a short collective is seen at once and a long wait
 * costs no CPU. */
void accel__poll_pause(unsigned spins, double elapsed_s);


/* The kernels' threads of one of local_world ranks on this machine: the
 * online cores / local_world, at most the cores it may run on, at least 1. */
int accel__node_thread_share(int local_world);
/* Caps the kernels' threads at that share (accel__cap_num_threads) when
 * several ranks share the machine and the user chose no thread count; rank 0
 * says so once on stderr. */
void accel__fit_threads_to_node(int rank, int local_world);

/* Reduction kernel: dst_j[i] = op over k of srcs[k][i] for every dst j, i < n.
 * dsts may alias srcs (each block is reduced into a temporary first). AVG
 * divides by `world`. */
void accel__reduce(accel_dtype dt, accel_reduce_op op, int world, int nsrc,
                   const void *const *srcs, int ndst, void *const *dsts, size_t n);
/* "f32", "bf16", ... for messages. */
const char *accel__dtype_short(accel_dtype dt);
bool accel__dtype_reducible(accel_dtype dt);

#endif
