/* src/dist/tcp.c — the TCP backend (ranks on several machines).
 *
 * Init: every rank listens on an ephemeral port and publishes "ip port"
 * through the store; rank i connects to every rank j < i and accepts from
 * every j > i (a full mesh, one socket per pair). Each connection first
 * proves the job secret without sending it, as for the store (dist/auth.h;
 * K = ACCEL_JOB_SECRET, ns/nc = 16 random bytes of the acceptor/connector):
 *   acceptor's gatekeeper, on accept:  "ACT2" ns
 *   connector, a peer's hello:         "ACTH" nc, i32 rank, HMAC(K, "accel tcp hello\0" ns nc rank)
 *   acceptor, once it takes the peer:  u8 1, HMAC(K, "accel tcp accept\0" nc ns rank)
 *   connector, a failure notice:       "ACTN" nc, notice, msg, HMAC(K, "accel tcp notice\0" ns nc notice msg)
 * A wrong MAC is dropped without an answer. Sockets are non-blocking with
 * TCP_NODELAY.
 *
 * Every collective begins (begin()) with a sequence number and a tag (kind
 * + arguments, accel__op_tag): an op_hdr precedes its first bytes on each
 * connection it uses, and a peer's header that differs - or names another
 * call site for the same call - fails the rank with "mismatched
 * collectives" naming both ranks' calls and call sites, and tells the others (a barrier used to complete with one step of another
 * rank's all_reduce). The header also carries the sender's accel__site (72
 * bytes in all, in the same sendmsg as the data); the last one received
 * from each peer is kept, so a timeout report says where a rank that did
 * not arrive was last seen.
 *
 * All I/O goes through run_ops(): a set of sends and receives on peers,
 * progressed together with poll(). A wait with no progress for the group
 * timeout gives ACCEL_ERR_TIMEOUT naming the peers it waits for; EOF or a
 * reset gives ACCEL_ERR_DIST naming the peer that died.
 *
 * The gatekeeper: a thread owns the listening socket. It accepts every
 * connection and reads its handshake without blocking, at most MAX_STRANGERS
 * at once (a newcomer evicts the oldest) and each for HANDSHAKE_DEADLINE_S,
 * and passes only authenticated ones to the collective thread through a pipe
 * (gate_msg). So a silent, slow, replayed or wrong-secret connection costs
 * the data path nothing: the pipe becomes readable only for a genuine peer.
 * A stranger's bytes go to a fixed buffer of its slot (no allocation, reads
 * bounded by the handshake's size).
 *
 * Failure notices: a rank that finds a peer dead connects to the listening
 * port of every other rank and sends the culprit and its message, before it
 * closes anything. Every wait also polls the gate pipe, so the whole
 * group fails promptly with an error naming the culprit — not the neighbour
 * that merely closed its sockets after its own failure. On a timeout the
 * waiting ranks tell each other they are waiting (timeout_round), so every
 * rank names the same ranks that did not arrive, and where each waiting
 * rank waits (its notice carries its call and call site).
 *
 * Algorithms (W ranks, flat ring r-1 -> r -> r+1):
 *   all_reduce      ring reduce-scatter + ring all-gather over W slices,
 *                   each step in chunks (ACCEL_TCP_CHUNK_KB, default 256):
 *                   chunk c is reduced while the kernel already receives
 *                   chunk c+1. Every rank moves 2(W-1)/W of the buffer.
 *                   Partial sums travel in the buffer's dtype (bf16/f16 are
 *                   widened to f32 for each addition, rounded per hop, as
 *                   NCCL does); AVG sums and divides at the last hop.
 *   reduce_scatter  the same ring, block r ending on rank r.
 *   all_gather(v)   ring; gather: every rank sends straight to the root.
 *   broadcast       chunked pipeline along the ring starting at the root.
 *   barrier         star through rank 0 (which can name every missing rank). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dist/auth.h"
#include "dist/backend.h"

#define CHALLENGE_MAGIC "ACT2"
#define HELLO_MAGIC "ACTH"
#define NOTICE_MAGIC "ACTN"
#define HEAD_LEN (4 + ACCEL__NONCE_LEN) /* magic, nc: what precedes a hello's or notice's body */
#define LABEL_HELLO "accel tcp hello"
#define LABEL_ACCEPT "accel tcp accept"
#define LABEL_NOTICE "accel tcp notice"
#define SLICE_ALIGN 16 /* elements */
#define MAX_NOTICE_MSG 900 /* a gate_msg stays below PIPE_BUF */
#define MAX_STRANGERS 128
#define HANDSHAKE_DEADLINE_S 2.0

enum { NOTICE_DEAD = 1, NOTICE_WAITING = 2 };

typedef struct notice {
    int32_t kind, culprit, reporter;
    uint32_t len; /* message bytes that follow (NOTICE_DEAD) */
} notice;

/* What the gatekeeper hands over: 'H' a peer's authenticated connection (fd,
 * rank, the proof its acceptance carries; during init), 'N' a notice. One
 * pipe write of < PIPE_BUF: atomic. */
typedef struct gate_msg {
    char kind;
    int32_t fd, rank;
    uint8_t proof[ACCEL__MAC_LEN];
    notice n;
    char msg[MAX_NOTICE_MSG];
} gate_msg;

/* A connection whose handshake is being read. */
typedef struct stranger {
    int fd;
    double deadline;
    uint8_t nonce[ACCEL__NONCE_LEN]; /* the challenge sent to it */
    size_t len;
    bool waiting; /* proved, but the pipe was full: kept (never evicted) until it takes it */
    char buf[HEAD_LEN + sizeof(notice) + MAX_NOTICE_MSG + ACCEL__MAC_LEN];
} stranger;

typedef struct gate {
    pthread_t thread;
    bool running;
    int listen_fd;
    int pipe[2]; /* [0]: the collectives poll it; [1]: the gatekeeper writes gate_msgs */
    int stop[2]; /* a byte (or EOF) stops the gatekeeper */
    const char *secret;
    stranger *st; /* [MAX_STRANGERS] */
    int n;
} gate;

typedef struct tcp_state {
    int *fd;          /* [world]; -1 for this rank */
    struct sockaddr_in *addr; /* [world]: where each rank listens (for failure notices) */
    char *secret;
    char *scratch;    /* one chunk */
    size_t chunk;
    uint32_t seq;     /* collectives begun, this one included */
    uint16_t tag;     /* the current collective's (accel__op_tag) */
    uint32_t *sent_seq, *recv_seq; /* [world]: the last collective whose header went out to / came from k */
    accel__site *peer_site;        /* [world]: the site in the last header from k */
    const accel__site *site;       /* this rank's: &pg->site */
    gate g;
} tcp_state;

/* ---------------------------------------------------------------- helpers */

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void slice_of(size_t n, int world, int k, size_t *lo, size_t *len) {
    size_t per = round_up((n + (size_t)world - 1) / (size_t)world, SLICE_ALIGN);
    size_t a = (size_t)k * per < n ? (size_t)k * per : n;
    size_t b = a + per < n ? a + per : n;
    *lo = a;
    *len = b - a;
}

static int mod(int a, int w) { return ((a % w) + w) % w; }

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Blocking-style helpers for init and notices on a non-blocking fd: each
 * waits at most until `deadline`. */
static bool io_until(int fd, bool out, void *p, size_t n, double deadline) {
    char *c = p;
    while (n) {
        ssize_t r = out ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
        if (r > 0) {
            c += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
        double left = deadline - accel_now_seconds();
        if (left <= 0) return false;
        struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        poll(&pf, 1, (int)(left * 1000) + 1);
    }
    return true;
}

/* The connector's side of a handshake: reads the acceptor's challenge and
 * sends magic, nc, body and its MAC (label) in one write; ns and nc get the
 * two nonces (the acceptance that answers a hello proves them back). */
static bool send_proved(int fd, const char *magic, const char *label, const char *secret, const void *body,
                        size_t len, uint8_t ns[ACCEL__NONCE_LEN], uint8_t nc[ACCEL__NONCE_LEN], double deadline) {
    char challenge[ACCEL__CHALLENGE_LEN], out[HEAD_LEN + sizeof(notice) + MAX_NOTICE_MSG + ACCEL__MAC_LEN];
    if (len > sizeof out - HEAD_LEN - ACCEL__MAC_LEN || !io_until(fd, false, challenge, sizeof challenge, deadline) ||
        memcmp(challenge, CHALLENGE_MAGIC, 4) != 0 || !accel__auth_nonce(nc))
        return false;
    memcpy(ns, challenge + 4, ACCEL__NONCE_LEN);
    memcpy(out, magic, 4);
    memcpy(out + 4, nc, ACCEL__NONCE_LEN);
    memcpy(out + HEAD_LEN, body, len);
    accel__auth_mac(secret, label, ns, nc, body, len, (uint8_t *)out + HEAD_LEN + len);
    return io_until(fd, true, out, HEAD_LEN + len + ACCEL__MAC_LEN, deadline);
}

/* ---------------------------------------------------------------- the gatekeeper */

static void drop_stranger(gate *g, int i) {
    close(g->st[i].fd);
    g->st[i] = g->st[--g->n];
}

/* Bytes the handshake in x->buf needs in all, its MAC included (grows as its
 * header is read), or 0 when it is malformed. */
static size_t handshake_size(const stranger *x) {
    if (x->len < HEAD_LEN) return HEAD_LEN;
    if (!memcmp(x->buf, HELLO_MAGIC, 4)) return HEAD_LEN + 4 + ACCEL__MAC_LEN;
    if (memcmp(x->buf, NOTICE_MAGIC, 4)) return 0;
    if (x->len < HEAD_LEN + sizeof(notice)) return HEAD_LEN + sizeof(notice);
    notice n;
    memcpy(&n, x->buf + HEAD_LEN, sizeof n);
    return n.len < MAX_NOTICE_MSG ? HEAD_LEN + sizeof n + n.len + ACCEL__MAC_LEN : 0;
}

/* Whether the complete handshake in x->buf (len bytes) carries a valid MAC. */
static bool proved(const gate *g, const stranger *x) {
    bool hello = !memcmp(x->buf, HELLO_MAGIC, 4);
    const uint8_t *nc = (const uint8_t *)x->buf + 4;
    size_t body = x->len - HEAD_LEN - ACCEL__MAC_LEN;
    uint8_t want[ACCEL__MAC_LEN];
    accel__auth_mac(g->secret, hello ? LABEL_HELLO : LABEL_NOTICE, x->nonce, nc, x->buf + HEAD_LEN, body, want);
    return accel__auth_mac_equal((const uint8_t *)x->buf + HEAD_LEN + body, want);
}

/* Hands a complete, proved handshake to the collectives; false when the pipe
 * is full (the collectives are busy): x then waits in its slot for POLLOUT,
 * rather than a genuine peer be dropped and blame the secret. */
static bool pass_on(gate *g, stranger *x) {
    gate_msg m;
    memset(&m, 0, sizeof m);
    const char *body = x->buf + HEAD_LEN;
    m.fd = -1;
    if (!memcmp(x->buf, HELLO_MAGIC, 4)) {
        m.kind = 'H';
        m.fd = x->fd;
        memcpy(&m.rank, body, 4);
        accel__auth_mac(g->secret, LABEL_ACCEPT, (const uint8_t *)x->buf + 4, x->nonce, &m.rank, 4, m.proof);
    } else {
        m.kind = 'N';
        memcpy(&m.n, body, sizeof m.n);
        memcpy(m.msg, body + sizeof m.n, m.n.len);
        m.msg[m.n.len] = 0;
    }
    ssize_t r;
    do r = write(g->pipe[1], &m, sizeof m);
    while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return x->waiting = true, false;
    if (r == (ssize_t)sizeof m && m.fd >= 0) x->fd = -1; /* now the collectives' */
    return true;
}

/* Reads what x sent; false when it is done with (handed over or dropped),
 * true while it has more to send or waits for room in the pipe. */
static bool progress_stranger(gate *g, stranger *x) {
    for (;;) {
        size_t need = handshake_size(x);
        if (need == 0) return false;
        if (x->len == need) return proved(g, x) && !pass_on(g, x);
        ssize_t r = recv(x->fd, x->buf + x->len, need - x->len, MSG_DONTWAIT);
        if (r > 0) {
            x->len += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
}

static void admit(gate *g, int fd) {
    if (g->n == MAX_STRANGERS) { /* evict the oldest unproved: a stranger cannot hold the gate */
        int old = -1;
        for (int i = 0; i < g->n; i++)
            if (!g->st[i].waiting && (old < 0 || g->st[i].deadline < g->st[old].deadline)) old = i;
        if (old < 0) { /* every slot holds a proved peer waiting for the pipe */
            close(fd);
            return;
        }
        drop_stranger(g, old);
    }
    stranger *x = &g->st[g->n];
    if (!accel__auth_challenge(fd, CHALLENGE_MAGIC, x->nonce)) {
        close(fd);
        return;
    }
    x->fd = fd;
    x->len = 0;
    x->waiting = false;
    x->deadline = accel_now_seconds() + HANDSHAKE_DEADLINE_S;
    g->n++;
}

static void *gate_main(void *arg) {
    gate *g = arg;
    struct pollfd pf[MAX_STRANGERS + 3]; /* stop, listener, strangers, the pipe's room */
    double paused_until = 0; /* out of descriptors: stop accepting for a moment rather than spin */
    for (;;) {
        double now = accel_now_seconds(), next = paused_until > now ? paused_until : 0;
        pf[0] = (struct pollfd){.fd = g->stop[0], .events = POLLIN};
        pf[1] = (struct pollfd){.fd = now >= paused_until ? g->listen_fd : -1, .events = POLLIN};
        bool waiting = false;
        for (int i = 0; i < g->n; i++) {
            stranger *x = &g->st[i];
            pf[i + 2] = (struct pollfd){.fd = x->waiting ? -1 : x->fd, .events = POLLIN};
            waiting |= x->waiting;
            if (!x->waiting && (next == 0 || x->deadline < next)) next = x->deadline;
        }
        int n = g->n, ms = next == 0 ? -1 : next <= now ? 0 : (int)((next - now) * 1000) + 1;
        pf[n + 2] = (struct pollfd){.fd = waiting ? g->pipe[1] : -1, .events = POLLOUT};
        if (poll(pf, (nfds_t)n + 3, ms) < 0 && errno != EINTR) break;
        if (pf[0].revents) break;
        bool room = pf[n + 2].revents != 0;
        for (int i = n; i-- > 0;) { /* from the back: the last one moves into a freed i */
            stranger *x = &g->st[i];
            bool keep = x->waiting ? !room || !pass_on(g, x) : !pf[i + 2].revents || progress_stranger(g, x);
            if (!keep) {
                if (x->fd >= 0) close(x->fd);
                *x = g->st[--g->n];
            }
        }
        now = accel_now_seconds();
        for (int i = g->n; i-- > 0;)
            if (!g->st[i].waiting && g->st[i].deadline <= now) drop_stranger(g, i);
        for (int batch = 0; (pf[1].revents & POLLIN) && batch < 64; batch++) {
            int fd = accept4(g->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                admit(g, fd);
                continue;
            }
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (g->n) drop_stranger(g, 0);
                else paused_until = now + 0.1;
            }
            break;
        }
    }
    while (g->n) drop_stranger(g, g->n - 1);
    return NULL;
}

static accel_status gate_start(gate *g, int listen_fd, const char *secret) {
    g->listen_fd = listen_fd;
    g->secret = secret;
    g->st = accel_malloc(MAX_STRANGERS * sizeof *g->st);
    if (!g->st) return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
    if (pipe2(g->pipe, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(g->stop, O_CLOEXEC) != 0)
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: pipe: %s", strerror(errno));
    /* Room for ~1000 handovers rather than ~68 (a busy rank reads it between
     * collectives); where refused, a full pipe only delays a handover. */
    (void)fcntl(g->pipe[1], F_SETPIPE_SZ, 1 << 20);
    if (pthread_create(&g->thread, NULL, gate_main, g) != 0)
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: cannot start the tcp gatekeeper thread");
    g->running = true;
    return ACCEL_OK;
}

static void gate_stop(gate *g) {
    if (g->running) {
        if (write(g->stop[1], "x", 1) != 1) { /* the thread also stops when the pipe closes */ }
        pthread_join(g->thread, NULL);
    }
    gate_msg m;
    while (g->pipe[0] >= 0 && read(g->pipe[0], &m, sizeof m) == (ssize_t)sizeof m)
        if (m.fd >= 0) close(m.fd);
    for (int i = 0; i < 2; i++) {
        if (g->pipe[i] >= 0) close(g->pipe[i]);
        if (g->stop[i] >= 0) close(g->stop[i]);
    }
    if (g->listen_fd >= 0) close(g->listen_fd);
    accel_free(g->st);
}

/* ---------------------------------------------------------------- failure notices */

/* Sends one notice to every other rank except `skip` (best effort: a rank
 * that already left has nobody listening). */
static void send_notices(accel_pg *pg, tcp_state *s, int kind, int skip, const void *msg, size_t len) {
    notice n = {kind, skip, pg->rank, (uint32_t)len};
    for (int k = 0; k < pg->size; k++) {
        if (k == pg->rank || k == skip) continue;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        double deadline = accel_now_seconds() + 1.0;
        int r = connect(fd, (struct sockaddr *)&s->addr[k], sizeof s->addr[k]);
        if (r != 0 && errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t el = sizeof err;
            if (poll(&pf, 1, 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) r = 0;
        }
        char body[sizeof n + MAX_NOTICE_MSG];
        uint8_t ns[ACCEL__NONCE_LEN], nc[ACCEL__NONCE_LEN];
        memcpy(body, &n, sizeof n);
        memcpy(body + sizeof n, msg, len);
        if (r == 0) send_proved(fd, NOTICE_MAGIC, LABEL_NOTICE, s->secret, body, sizeof n + len, ns, nc, deadline);
        close(fd);
    }
}

/* The next message from the gatekeeper, false when none is waiting. */
static bool next_gate_msg(tcp_state *s, gate_msg *m) {
    for (;;) {
        ssize_t r = read(s->g.pipe[0], m, sizeof *m);
        if (r == (ssize_t)sizeof *m) return true;
        if (r < 0 && errno == EINTR) continue;
        return false;
    }
}

/* The next notice; a hello after init (a duplicate or late peer) is closed. */
static bool read_notice(tcp_state *s, notice *n, char *msg) {
    gate_msg m;
    while (next_gate_msg(s, &m)) {
        if (m.kind != 'N') {
            close(m.fd);
            continue;
        }
        *n = m.n;
        memcpy(msg, m.msg, sizeof m.msg);
        return true;
    }
    return false;
}

static accel_status adopt_dead(accel_pg *pg, const notice *n, const char *msg) {
    if (strstr(msg, "mismatched collectives"))
        return accel_set_error(ACCEL_ERR_DIST, "%s (reported by rank %d; rank %d was in %s)", msg, n->reporter,
                               pg->rank, pg->op_desc);
    return accel_set_error(ACCEL_ERR_DIST, "accel dist: rank %d failed (reported by rank %d: %s) while rank %d "
                           "waited in %s", n->culprit, n->reporter, msg, pg->rank, pg->op_desc);
}

/* A wait timed out here, or another rank said its wait did: every waiting
 * rank tells all others it is waiting, then listens for a short while. The
 * ranks not heard from are the ones that did not arrive (hung, dead, busy or
 * in another collective) - the same list on every rank, not merely the
 * neighbour each one was waiting for. */
/* What a waiting rank tells the others in a timeout round: where it waits,
 * and the last collective it saw its left neighbour in (on a ring, the rank
 * that did not arrive is some waiting rank's left neighbour). */
typedef struct waiting_msg {
    accel__site mine;
    int32_t left;
    accel__site left_seen;
} waiting_msg;

/* Keeps the later of what is known of a rank and a new sighting. */
static void saw(accel__site *known, const accel__site *seen) {
    if (seen->seq > known->seq) *known = *seen;
}

static void note_waiting(accel_pg *pg, bool *waits, accel__site *site, int reporter, const char *msg, uint32_t len) {
    waiting_msg m;
    if (reporter < 0 || reporter >= pg->size || waits[reporter] || len != sizeof m) return;
    memcpy(&m, msg, sizeof m);
    waits[reporter] = true;
    site[reporter] = m.mine;
    if (m.left >= 0 && m.left < pg->size && !waits[m.left]) saw(&site[m.left], &m.left_seen);
}

/* "rank 0 is in #2 barrier() at t.c:9; rank 1 has not arrived (last seen in
 * #1 all_reduce(f32, 4) at t.c:7); ..." */
static void report_ranks(accel_pg *pg, const bool *waits, const accel__site *site, char *out, size_t n) {
    size_t o = 0;
    out[0] = 0;
    for (int k = 0; k < pg->size && o < n; k++) {
        char d[128];
        accel__site_describe(&site[k], d, sizeof d);
        int w = waits[k] ? snprintf(out + o, n - o, "%srank %d is in %s", k ? "; " : "", k, d)
                         : snprintf(out + o, n - o, "%srank %d has not arrived (last seen in %s)", k ? "; " : "", k, d);
        if (w < 0) break;
        o += (size_t)w;
    }
}

static accel_status timeout_round(accel_pg *pg, tcp_state *s, int heard_from, const char *heard_msg,
                                  uint32_t heard_len) {
    int w = pg->size;
    bool *waits = accel_calloc((size_t)w, sizeof *waits);
    accel__site *site = accel_malloc((size_t)w * sizeof *site);
    if (!waits || !site) {
        accel_free(waits);
        accel_free(site);
        return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
    }
    memcpy(site, s->peer_site, (size_t)w * sizeof *site);
    int left = (pg->rank + w - 1) % w;
    waiting_msg me = {.mine = *s->site, .left = left, .left_seen = s->peer_site[left]};
    waits[pg->rank] = true;
    site[pg->rank] = *s->site;
    note_waiting(pg, waits, site, heard_from, heard_msg, heard_len);
    send_notices(pg, s, NOTICE_WAITING, -1, &me, sizeof me);
    double deadline = accel_now_seconds() + (pg->timeout_s < 1 ? pg->timeout_s : 1.0);
    int heard = heard_from >= 0 ? 2 : 1;
    notice n;
    char msg[MAX_NOTICE_MSG];
    while (heard < w) {
        double tleft = deadline - accel_now_seconds();
        struct pollfd pf = {.fd = s->g.pipe[0], .events = POLLIN};
        if (tleft <= 0 || poll(&pf, 1, (int)(tleft * 1000) + 1) <= 0) break;
        while (read_notice(s, &n, msg)) {
            if (n.kind == NOTICE_DEAD) {
                accel_free(waits);
                accel_free(site);
                return adopt_dead(pg, &n, msg);
            }
            if (n.kind == NOTICE_WAITING && n.reporter >= 0 && n.reporter < w && !waits[n.reporter]) {
                note_waiting(pg, waits, site, n.reporter, msg, n.len);
                heard++;
            }
        }
    }
    char list[128], ranks[700];
    size_t o = 0;
    int missing = 0;
    for (int k = 0; k < w; k++) {
        if (waits[k]) continue;
        if (o < sizeof list - 16) o += (size_t)snprintf(list + o, sizeof list - o, "%s%d", missing ? ", " : "", k);
        missing++;
    }
    report_ranks(pg, waits, site, ranks, sizeof ranks);
    accel_free(waits);
    accel_free(site);
    if (!missing)
        return accel_set_error(ACCEL_ERR_TIMEOUT, "accel dist: %s timed out after %g s on rank %d: every rank is "
                               "waiting (mismatched collectives?): %s (ACCEL_DIST_TIMEOUT sets the limit)",
                               pg->op_desc, pg->timeout_s, pg->rank, ranks);
    return accel_set_error(ACCEL_ERR_TIMEOUT,
                           "accel dist: %s timed out after %g s on rank %d: rank%s %s of %d did not arrive: %s "
                           "(ACCEL_DIST_TIMEOUT sets the limit)",
                           pg->op_desc, pg->timeout_s, pg->rank, missing > 1 ? "s" : "", list, w, ranks);
}

/* Reads the notices waiting on the listening socket during a collective. */
static accel_status check_notices(accel_pg *pg, tcp_state *s) {
    notice n;
    char msg[MAX_NOTICE_MSG];
    while (read_notice(s, &n, msg)) {
        if (n.kind == NOTICE_DEAD) return adopt_dead(pg, &n, msg);
        if (n.kind == NOTICE_WAITING && n.reporter >= 0 && n.reporter < pg->size)
            return timeout_round(pg, s, n.reporter, msg, n.len);
    }
    return ACCEL_OK;
}

/* A peer hung up or reset: unless a notice already names the real culprit
 * (the peer may only have closed after its own failure), blame the peer and
 * tell the others. A peer that failed sent its notice before closing, but
 * the gatekeeper thread must still be scheduled to pass it on: on a loaded
 * machine that took more than 50 ms (a mismatch then read as a death), so
 * it gets PEER_NOTICE_GRACE_MS. */
#define PEER_NOTICE_GRACE_MS 500
static accel_status peer_dead(accel_pg *pg, tcp_state *s, int peer, int err) {
    struct pollfd pf = {.fd = s->g.pipe[0], .events = POLLIN};
    if (poll(&pf, 1, PEER_NOTICE_GRACE_MS) == 1 && check_notices(pg, s) != ACCEL_OK) return accel_last_status();
    char last[128];
    accel__site_describe(&s->peer_site[peer], last, sizeof last);
    accel_set_error(ACCEL_ERR_DIST, "accel dist: rank %d closed its connection (%s: the process died or exited; "
                    "last seen here in %s) while rank %d waited in %s", peer, err ? strerror(err) : "end of stream",
                    last, pg->rank, pg->op_desc);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", accel_last_error());
    send_notices(pg, s, NOTICE_DEAD, peer, msg, strlen(msg));
    return accel_set_error(ACCEL_ERR_DIST, "%s", msg);
}

/* ---------------------------------------------------------------- the I/O engine */

/* Travels before a collective's first bytes on each connection it uses. */
typedef struct op_hdr {
    uint32_t seq;
    uint16_t tag, zero;
    accel__site site;
} op_hdr;

typedef struct io_op {
    int peer;
    bool out;
    char *p;
    size_t len, done;
    op_hdr hdr; /* sent or received first when hdr_len > 0 */
    size_t hdr_len, hdr_done;
    /* Point to point: the header goes with every message (the caller sets a
     * send's); a receive checks the sender's against *expect. */
    bool p2p;
    const accel__site *expect;
} io_op;

#define MAX_OPS 1024

/* Starts a collective: its header goes before its first bytes on every
 * connection (marks in sent_seq / recv_seq). */
static void begin(tcp_state *s, uint16_t tag) {
    s->seq++;
    s->tag = tag;
}

static void attach_header(tcp_state *s, io_op *o) {
    uint32_t *mark = o->out ? &s->sent_seq[o->peer] : &s->recv_seq[o->peer];
    o->hdr_done = 0;
    o->hdr_len = o->p2p ? sizeof o->hdr : 0;
    if (o->p2p) return; /* outside the collectives' sequence: the marks stay */
    if (*mark == s->seq) return;
    *mark = s->seq;
    o->hdr_len = sizeof o->hdr;
    o->hdr = (op_hdr){s->seq, s->tag, 0, *s->site};
}

static bool op_done(const io_op *o) { return o->done == o->len && o->hdr_done == o->hdr_len; }

/* One sendmsg / recvmsg of o: its header (if still due) and its data in one
 * call, so the header costs no extra system call. The caller checks a
 * received header as soon as it is complete, before the data is used. */
static ssize_t io_once(int fd, io_op *o) {
    struct iovec iov[2];
    int n = 0;
    size_t hleft = o->hdr_len - o->hdr_done;
    if (hleft) iov[n++] = (struct iovec){(char *)&o->hdr + o->hdr_done, hleft};
    iov[n++] = (struct iovec){o->p + o->done, o->len - o->done};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t r = o->out ? sendmsg(fd, &m, MSG_NOSIGNAL) : recvmsg(fd, &m, 0);
    if (r > 0) {
        size_t h = (size_t)r < hleft ? (size_t)r : hleft;
        o->hdr_done += h;
        o->done += (size_t)r - h;
    }
    return r;
}

/* A peer's header names another collective: fail, and tell every rank (the
 * peer may wait for data this rank will never send). */
static accel_status op_mismatch(accel_pg *pg, tcp_state *s, int peer, const op_hdr *h) {
    char mine[128], theirs[128];
    accel__site_describe(s->site, mine, sizeof mine);
    accel__site_describe(&h->site, theirs, sizeof theirs);
    bool same_call = h->seq == s->seq && h->tag == s->tag; /* then only the call sites differ */
    const char *why = same_call ? " (" ACCEL__SITES_DIFFER_HINT ")"
                      : h->seq == s->seq && h->site.kind == s->site->kind ? " with other arguments"
                                                                          : "";
    accel_set_error(ACCEL_ERR_DIST, "accel dist: mismatched collectives (seen by rank %d): rank %d is in %s; rank %d "
                    "is in %s%s (every rank must call the same collectives in the same order with the same "
                    "arguments; ACCEL_DEBUG_MODE=1 also compares roots and reduce ops)", pg->rank, pg->rank, mine,
                    peer, theirs, why);
    char msg[MAX_NOTICE_MSG];
    snprintf(msg, sizeof msg, "%s", accel_last_error());
    send_notices(pg, s, NOTICE_DEAD, pg->rank, msg, strlen(msg));
    return accel_set_error(ACCEL_ERR_DIST, "%s", msg);
}

/* A point-to-point receive got another message than it expects (or a
 * collective's header): fail, and tell every rank as op_mismatch does, so
 * the sender learns at once. */
static accel_status p2p_mismatch(accel_pg *pg, tcp_state *s, const io_op *o) {
    accel__p2p_mismatch(pg, &o->hdr.site, o->expect);
    char msg[MAX_NOTICE_MSG];
    snprintf(msg, sizeof msg, "%s", accel_last_error());
    send_notices(pg, s, NOTICE_DEAD, pg->rank, msg, strlen(msg));
    return accel_set_error(ACCEL_ERR_DIST, "%s", msg);
}

/* Progresses every op until all are done. Timeout: no progress for
 * pg->timeout_s. */
static accel_status run_ops(accel_pg *pg, tcp_state *s, io_op *ops, int nops) {
    struct pollfd pfs[MAX_OPS + 1];
    ACCEL_ASSERT(nops <= MAX_OPS);
    double last = accel_now_seconds();
    for (int i = 0; i < nops; i++) attach_header(s, &ops[i]);
    for (;;) {
        bool progress = false, all = true;
        for (int i = 0; i < nops; i++) {
            io_op *o = &ops[i];
            while (!op_done(o)) {
                bool checking = !o->out && o->hdr_done < o->hdr_len;
                ssize_t r = io_once(s->fd[o->peer], o);
                if (r > 0) {
                    progress = true;
                    if (checking && o->hdr_done == o->hdr_len && o->p2p) {
                        s->peer_site[o->peer] = o->hdr.site;
                        if (o->hdr.tag != ACCEL__P2P_TAG || !accel__p2p_matches(&o->hdr.site, o->expect))
                            return p2p_mismatch(pg, s, o);
                    } else if (checking && o->hdr_done == o->hdr_len) {
                        s->peer_site[o->peer] = o->hdr.site;
                        if (o->hdr.seq != s->seq || o->hdr.tag != s->tag || accel__sites_differ(&o->hdr.site, s->site))
                            return op_mismatch(pg, s, o->peer, &o->hdr);
                    }
                    continue;
                }
                if (r < 0 && errno == EINTR) continue;
                if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                return peer_dead(pg, s, o->peer, r == 0 ? 0 : errno);
            }
            all = all && op_done(o);
        }
        if (all) return ACCEL_OK;
        double now = accel_now_seconds();
        if (progress) last = now;
        int np = 0;
        for (int i = 0; i < nops; i++) {
            if (op_done(&ops[i])) continue;
            pfs[np++] = (struct pollfd){.fd = s->fd[ops[i].peer], .events = ops[i].out ? POLLOUT : POLLIN};
        }
        pfs[np] = (struct pollfd){.fd = s->g.pipe[0], .events = POLLIN};
        double left = last + pg->timeout_s - now;
        int ready = left > 0 ? poll(pfs, (nfds_t)np + 1, left > 1 ? 1000 : (int)(left * 1000) + 1) : 0;
        /* Data before notices: a peer that completed this collective and failed
         * in its next one may send its notice along with this one's last bytes,
         * which must complete it (a rank still in init's barrier would else
         * report its init as failed). The notice is read at the next wait. */
        bool data_ready = false;
        for (int i = 0; i < np && ready > 0; i++) data_ready = data_ready || pfs[i].revents;
        if (ready > 0 && !data_ready && pfs[np].revents && check_notices(pg, s) != ACCEL_OK)
            return accel_last_status();
        if (accel_now_seconds() - last < pg->timeout_s) continue;
        return timeout_round(pg, s, -1, NULL, 0);
    }
}

/* Send sn bytes to `to` while receiving rn bytes from `from` (either may be -1). */
static accel_status xfer(accel_pg *pg, tcp_state *s, int to, const void *sb, size_t sn, int from, void *rb,
                         size_t rn) {
    io_op ops[2];
    int n = 0;
    if (to >= 0 && sn) ops[n++] = (io_op){.peer = to, .out = true, .p = (char *)sb, .len = sn};
    if (from >= 0 && rn) ops[n++] = (io_op){.peer = from, .p = rb, .len = rn};
    return n ? run_ops(pg, s, ops, n) : ACCEL_OK;
}

/* ---------------------------------------------------------------- ring steps */

/* What to do with received bytes: plain (dst == NULL: they land in place) or
 * reduce chunk-wise: dst = op(mine, received). */
typedef struct reduce_to {
    accel_dtype dt;
    accel_reduce_op op;
    const char *mine;
    char *dst;
} reduce_to;

/* One ring step: send sb[sn] to the right neighbour while receiving rn bytes
 * from the left one (into rb, or reduced into red->dst through the scratch
 * chunk). In chunks, so the reduction of one overlaps the arrival of the next. */
static accel_status ring_step(accel_pg *pg, tcp_state *s, const char *sb, size_t sn, char *rb, size_t rn,
                              const reduce_to *red) {
    int right = mod(pg->rank + 1, pg->size), left = mod(pg->rank - 1, pg->size);
    if (!red) return xfer(pg, s, right, sb, sn, left, rb, rn);
    size_t es = accel_dtype_size(red->dt), chunk = s->chunk / es * es;
    for (size_t o = 0; o < sn || o < rn; o += chunk) {
        size_t a = o < sn ? (sn - o < chunk ? sn - o : chunk) : 0;
        size_t b = o < rn ? (rn - o < chunk ? rn - o : chunk) : 0;
        if (xfer(pg, s, right, sb + o, a, left, s->scratch, b) != ACCEL_OK) return accel_last_status();
        if (b) {
            const void *srcs[2] = {red->mine + o, s->scratch};
            void *dst = red->dst + o;
            accel__reduce(red->dt, red->op, pg->size, 2, srcs, 1, &dst, b / es);
        }
    }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- collectives */

static accel_status tcp_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt, accel_reduce_op op) {
    tcp_state *s = pg->impl;
    begin(s, accel__op_tag(ACCEL__SLOT_ALL_REDUCE, count, (uint64_t)dt | (uint64_t)op << 8));
    int w = pg->size, r = pg->rank;
    size_t es = accel_dtype_size(dt), lo, len, lo2, len2;
    char *b = buf;
    /* Reduce-scatter: after step t, slice (r - t - 1) holds the reduction over
     * ranks r - t - 1 .. r; after W-1 steps rank r owns slice r + 1. */
    for (int t = 0; t < w - 1; t++) {
        slice_of(count, w, mod(r - t, w), &lo, &len);
        slice_of(count, w, mod(r - t - 1, w), &lo2, &len2);
        accel_reduce_op step_op = t < w - 2 && op == ACCEL_REDUCE_AVG ? ACCEL_REDUCE_SUM : op;
        reduce_to red = {dt, step_op, b + lo2 * es, b + lo2 * es};
        if (ring_step(pg, s, b + lo * es, len * es, NULL, len2 * es, &red) != ACCEL_OK) return accel_last_status();
    }
    /* All-gather: pass the finished slices around. */
    for (int t = 0; t < w - 1; t++) {
        slice_of(count, w, mod(r + 1 - t, w), &lo, &len);
        slice_of(count, w, mod(r - t, w), &lo2, &len2);
        if (ring_step(pg, s, b + lo * es, len * es, b + lo2 * es, len2 * es, NULL) != ACCEL_OK)
            return accel_last_status();
    }
    return ACCEL_OK;
}

static accel_status tcp_reduce_scatter(accel_pg *pg, const void *send, void *recv, size_t count, accel_dtype dt,
                                       accel_reduce_op op) {
    tcp_state *s = pg->impl;
    begin(s, accel__op_tag(ACCEL__SLOT_REDUCE_SCATTER, count, (uint64_t)dt | (uint64_t)op << 8));
    int w = pg->size, r = pg->rank;
    size_t bytes = count * accel_dtype_size(dt);
    const char *sb = send;
    /* Step t: send the partial of block r - t - 1 (my own block at t = 0),
     * receive the partial of block r - t - 2 and add my block of it; the
     * running partial lives in recv, which ends as block r. */
    for (int t = 0; t < w - 1; t++) {
        const char *out = t == 0 ? sb + (size_t)mod(r - 1, w) * bytes : recv;
        int in_blk = mod(r - t - 2, w);
        accel_reduce_op step_op = t < w - 2 && op == ACCEL_REDUCE_AVG ? ACCEL_REDUCE_SUM : op;
        reduce_to red = {dt, step_op, sb + (size_t)in_blk * bytes, recv};
        if (ring_step(pg, s, out, bytes, NULL, bytes, &red) != ACCEL_OK) return accel_last_status();
    }
    return ACCEL_OK;
}

static accel_status tcp_broadcast(accel_pg *pg, void *buf, size_t bytes, int root) {
    tcp_state *s = pg->impl;
    begin(s, accel__op_tag(ACCEL__SLOT_BROADCAST, bytes, (uint64_t)root));
    int w = pg->size, pos = mod(pg->rank - root, w); /* position in the chain from the root */
    int to = pos < w - 1 ? mod(pg->rank + 1, w) : -1, from = pos > 0 ? mod(pg->rank - 1, w) : -1;
    char *b = buf;
    size_t n = (bytes + s->chunk - 1) / s->chunk;
    /* Step c: forward chunk c-1 while receiving chunk c. */
    for (size_t c = 0; c <= n; c++) {
        size_t so = (c - 1) * s->chunk, ro = c * s->chunk;
        size_t sn = c > 0 ? (bytes - so < s->chunk ? bytes - so : s->chunk) : 0;
        size_t rn = c < n ? (bytes - ro < s->chunk ? bytes - ro : s->chunk) : 0;
        if (pos == 0) {
            if (c < n && xfer(pg, s, to, b + ro, rn, -1, NULL, 0) != ACCEL_OK) return accel_last_status();
            continue;
        }
        if (xfer(pg, s, to, b + (c > 0 ? so : 0), sn, from, b + (c < n ? ro : 0), rn) != ACCEL_OK)
            return accel_last_status();
    }
    return ACCEL_OK;
}

static accel_status tcp_all_gatherv(accel_pg *pg, const void *send, void *recv, const size_t *bytes, int root) {
    tcp_state *s = pg->impl;
    begin(s, accel__gatherv_tag(bytes, pg->size, root));
    int w = pg->size, r = pg->rank;
    size_t *off = accel_malloc((size_t)(w + 1) * sizeof *off);
    if (!off) return accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
    off[0] = 0;
    for (int k = 0; k < w; k++) off[k + 1] = off[k] + bytes[k];
    char *rb = recv;
    accel_status st = ACCEL_OK;
    if (root >= 0) {
        if (r != root) {
            st = xfer(pg, s, root, send, bytes[r], -1, NULL, 0);
        } else {
            if (bytes[r]) memmove(rb + off[r], send, bytes[r]);
            io_op *ops = accel_malloc((size_t)w * sizeof *ops);
            int n = 0;
            if (!ops) st = accel_set_error(ACCEL_ERR_OOM, "accel dist: out of memory");
            for (int k = 0; ops && k < w; k++)
                if (k != r && bytes[k]) ops[n++] = (io_op){.peer = k, .p = rb + off[k], .len = bytes[k]};
            /* all senders at once, so a timeout names every rank that did not send */
            for (int i = 0; st == ACCEL_OK && i < n; i += MAX_OPS)
                st = run_ops(pg, s, ops + i, n - i < MAX_OPS ? n - i : MAX_OPS);
            accel_free(ops);
        }
    } else {
        if (bytes[r]) memmove(rb + off[r], send, bytes[r]);
        for (int t = 0; st == ACCEL_OK && t < w - 1; t++) {
            int sk = mod(r - t, w), rk = mod(r - t - 1, w);
            st = ring_step(pg, s, rb + off[sk], bytes[sk], rb + off[rk], bytes[rk], NULL);
        }
    }
    accel_free(off);
    return st;
}

static accel_status tcp_barrier(accel_pg *pg) {
    tcp_state *s = pg->impl;
    begin(s, accel__op_tag(ACCEL__SLOT_BARRIER, 0, 0));
    int w = pg->size;
    char token[MAX_OPS];
    io_op ops[MAX_OPS];
    if (pg->rank != 0) {
        char t = 1;
        return xfer(pg, s, 0, &t, 1, 0, &t, 1) != ACCEL_OK ? accel_last_status() : ACCEL_OK;
    }
    /* Rank 0: collect every token (in batches of MAX_OPS), then release all. */
    for (int dir = 0; dir < 2; dir++)
        for (int k0 = 1; k0 < w; k0 += MAX_OPS) {
            int n = 0;
            for (int k = k0; k < w && n < MAX_OPS; k++, n++)
                ops[n] = (io_op){.peer = k, .out = dir == 1, .p = &token[n], .len = 1};
            if (run_ops(pg, s, ops, n) != ACCEL_OK) return accel_last_status();
        }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- point to point */

/* On the pair's connection, as any collective's bytes: every message with
 * its header (the sender's record), both directions progressed together. */
static accel_status tcp_p2p(accel_pg *pg, const accel__p2p_msg *tx, const accel__p2p_msg *rx) {
    tcp_state *s = pg->impl;
    io_op ops[2];
    int n = 0;
    if (tx->peer >= 0)
        ops[n++] = (io_op){.peer = tx->peer, .out = true, .p = tx->buf, .len = tx->bytes, .p2p = true,
                           .hdr = {0, ACCEL__P2P_TAG, 0, tx->site}};
    if (rx->peer >= 0) ops[n++] = (io_op){.peer = rx->peer, .p = rx->buf, .len = rx->bytes, .p2p = true,
                                          .expect = &rx->site};
    return run_ops(pg, s, ops, n);
}

/* ---------------------------------------------------------------- init */

static void tcp_finalize(accel_pg *pg) {
    tcp_state *s = pg->impl;
    if (!s) return;
    for (int k = 0; s->fd && k < pg->size; k++)
        if (s->fd[k] >= 0) close(s->fd[k]);
    gate_stop(&s->g);
    accel_free(s->fd);
    accel_free(s->sent_seq);
    accel_free(s->recv_seq);
    accel_free(s->peer_site);
    accel_free(s->addr);
    accel_free(s->secret);
    accel_free(s->scratch);
    accel_free(s);
    pg->impl = NULL;
}

/* The address other machines reach this one at: ACCEL_DIST_HOST_ADDR, else
 * the local address of the route to MASTER_ADDR (a UDP connect sends nothing). */
accel_status accel__tcp_local_ip(char *out, size_t n) {
    const char *forced = getenv("ACCEL_DIST_HOST_ADDR");
    if (forced && !*forced)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: ACCEL_DIST_HOST_ADDR is set but empty (unset "
                               "it to publish the address of the route to MASTER_ADDR, or give this machine's "
                               "address)");
    if (forced) {
        snprintf(out, n, "%s", forced);
        return ACCEL_OK;
    }
    const char *master = getenv("MASTER_ADDR");
    if (!master || !*master) master = "127.0.0.1";
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (getaddrinfo(master, "9", &hints, &res) != 0 || !res)
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: cannot resolve MASTER_ADDR '%s'", master);
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in me;
    socklen_t ml = sizeof me;
    bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
              getsockname(fd, (struct sockaddr *)&me, &ml) == 0;
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    if (!ok || !inet_ntop(AF_INET, &me.sin_addr, out, (socklen_t)n))
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: no route to MASTER_ADDR '%s' (set "
                               "ACCEL_DIST_HOST_ADDR to this machine's address)", master);
    return ACCEL_OK;
}

/* Connects to rank k and sends our hello; want gets the proof rank k's
 * acceptance must carry. A connection dropped during the handshake is made
 * again until the deadline (rank k's gatekeeper closes a newcomer at once
 * when every slot holds a proved peer). A refused connect is retried until
 * the deadline too, except `again` (rank k dropped a connection of ours
 * before): a refusal then means rank k is gone, and fails at once. */
static accel_status connect_to(accel_pg *pg, tcp_state *s, int k, double deadline, bool again,
                               uint8_t want[ACCEL__MAC_LEN]) {
    char ip[64];
    inet_ntop(AF_INET, &s->addr[k].sin_addr, ip, sizeof ip);
    bool dropped = false;
    for (double nap = 0.001;; nap = nap < 0.1 ? nap * 2 : nap) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: socket: %s", strerror(errno));
        int r = connect(fd, (struct sockaddr *)&s->addr[k], sizeof s->addr[k]);
        if (r != 0 && errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            double left = deadline - accel_now_seconds();
            int err = ETIMEDOUT;
            socklen_t el = sizeof err;
            if (left > 0 && poll(&pf, 1, (int)(left * 1000) + 1) == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            r = err == 0 ? 0 : -1;
            errno = err;
        }
        int e = errno;
        if (r == 0) {
            int32_t me = pg->rank;
            uint8_t ns[ACCEL__NONCE_LEN], nc[ACCEL__NONCE_LEN];
            if (send_proved(fd, HELLO_MAGIC, LABEL_HELLO, s->secret, &me, 4, ns, nc, deadline)) {
                accel__auth_mac(s->secret, LABEL_ACCEPT, nc, ns, &me, 4, want);
                s->fd[k] = fd;
                return ACCEL_OK;
            }
            dropped = again = true; /* from now on a refusal means rank k is gone */
        }
        close(fd);
        if (r != 0 && e == ECONNREFUSED && again)
            return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: rank %d is gone: %s:%d refused rank %d's connection "
                                   "after it dropped the one before", k, ip, ntohs(s->addr[k].sin_port), pg->rank);
        if (accel_now_seconds() + nap > deadline) {
            if (dropped)
                return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: rank %d lost the connection to rank %d "
                                       "at %s:%d during the handshake", pg->rank, k, ip, ntohs(s->addr[k].sin_port));
            return accel_set_error(ACCEL_ERR_TIMEOUT, "accel_dist_init: rank %d cannot connect to rank %d at %s:%d "
                                   "(%s) within %g s (firewall? ACCEL_DIST_HOST_ADDR on that machine?)",
                                   pg->rank, k, ip, ntohs(s->addr[k].sin_port), strerror(e), pg->timeout_s);
        }
        struct timespec ts = {0, (long)(nap * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* Reads rank k's acceptance of our hello. A connection that its gatekeeper
 * closed unanswered (evicted among a flood of newer connections, or held past
 * its handshake deadline on a loaded machine) is made again until the
 * deadline, rather than fail this rank while rank k waits for it until the
 * timeout: every rank here proved the job secret to the store, so a dropped
 * hello is not a wrong secret. */
static accel_status take_acceptance(accel_pg *pg, tcp_state *s, int k, double deadline, uint8_t want[ACCEL__MAC_LEN]) {
    int me = pg->rank;
    for (;;) {
        uint8_t ack[1 + ACCEL__MAC_LEN] = {0};
        bool answered = io_until(s->fd[k], false, ack, 1, deadline);
        if (!answered && accel_now_seconds() < deadline) { /* end of stream or reset: dropped */
            close(s->fd[k]);
            s->fd[k] = -1;
            if (connect_to(pg, s, k, deadline, true, want) != ACCEL_OK) return accel_last_status();
            continue;
        }
        if (answered && io_until(s->fd[k], false, ack + 1, ACCEL__MAC_LEN, deadline) && ack[0] == 1 &&
            accel__auth_mac_equal(ack + 1, want))
            return ACCEL_OK;
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: rank %d closed the connection of rank %d without "
                               "a valid acceptance: it refused our proof or could not prove ACCEL_JOB_SECRET (the "
                               "secrets differ between machines?), or its gatekeeper evicted the connection (a "
                               "flood of connections to its port?)", k, me);
    }
}

/* The mesh: connect to every lower rank, take every higher one, then check
 * each lower rank's acceptance. */
static accel_status form_mesh(accel_pg *pg, tcp_state *s, double deadline, uint8_t (*want)[ACCEL__MAC_LEN]) {
    int w = pg->size, me = pg->rank;
    /* Connects complete in the listener's backlog (and its gatekeeper sends
     * the challenge), so connect-all-then-accept cannot deadlock. */
    for (int k = 0; k < me; k++)
        if (connect_to(pg, s, k, deadline, false, want[k]) != ACCEL_OK) return accel_last_status();
    for (int got = 0; got < w - 1 - me;) {
        struct pollfd pf = {.fd = s->g.pipe[0], .events = POLLIN};
        double left = deadline - accel_now_seconds();
        if (left <= 0 || poll(&pf, 1, (int)(left * 1000) + 1) <= 0) {
            char list[256];
            size_t o = 0;
            for (int k = me + 1; k < w; k++)
                if (s->fd[k] < 0 && o < sizeof list - 16)
                    o += (size_t)snprintf(list + o, sizeof list - o, "%s%d", o ? ", " : "", k);
            return accel_set_error(ACCEL_ERR_TIMEOUT, "accel_dist_init: rank %d timed out after %g s waiting for "
                                   "ranks %s to connect", me, pg->timeout_s, list);
        }
        gate_msg m;
        while (next_gate_msg(s, &m)) {
            int32_t k = m.rank;
            uint8_t ack[1 + ACCEL__MAC_LEN] = {1};
            memcpy(ack + 1, m.proof, ACCEL__MAC_LEN);
            if (m.kind == 'H' && k > me && k < w && s->fd[k] < 0 &&
                io_until(m.fd, true, ack, sizeof ack, accel_now_seconds() + HANDSHAKE_DEADLINE_S)) {
                s->fd[k] = m.fd;
                got++;
            } else if (m.fd >= 0) {
                close(m.fd); /* a duplicate or impossible rank */
            }
        }
    }
    for (int k = 0; k < me; k++)
        if (take_acceptance(pg, s, k, deadline, want[k]) != ACCEL_OK) return accel_last_status();
    for (int k = 0; k < w; k++)
        if (s->fd[k] >= 0) {
            set_nonblock(s->fd[k]);
            set_nodelay(s->fd[k]);
        }
    return ACCEL_OK;
}

static accel_status tcp_init(accel_pg *pg, accel__store *store) {
    int w = pg->size, me = pg->rank;
    if (w > MAX_OPS)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_dist_init: the tcp backend supports at most %d ranks "
                               "(WORLD_SIZE=%d)", MAX_OPS, w);
    tcp_state *s = accel_calloc(1, sizeof *s);
    if (!s) return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
    pg->impl = s;
    s->g.listen_fd = s->g.pipe[0] = s->g.pipe[1] = s->g.stop[0] = s->g.stop[1] = -1;
    s->fd = accel_malloc((size_t)w * sizeof *s->fd);
    for (int k = 0; s->fd && k < w; k++) s->fd[k] = -1;
    s->addr = accel_calloc((size_t)w, sizeof *s->addr);
    s->sent_seq = accel_calloc((size_t)w, sizeof *s->sent_seq);
    s->recv_seq = accel_calloc((size_t)w, sizeof *s->recv_seq);
    s->peer_site = accel_calloc((size_t)w, sizeof *s->peer_site);
    s->site = &pg->site;
    const char *sec = getenv("ACCEL_JOB_SECRET");
    s->secret = accel_strdup(sec ? sec : "");
    long kb;
    if (accel__env_long("ACCEL_TCP_CHUNK_KB", 256, 4, 1L << 20, &kb) != ACCEL_OK) return accel_last_status();
    s->chunk = (size_t)kb << 10;
    s->scratch = accel_malloc(s->chunk);
    if (!s->fd || !s->addr || !s->sent_seq || !s->recv_seq || !s->peer_site || !s->secret || !s->scratch)
        return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");

    char ip[64], info[128], key[64];
    if (accel__tcp_local_ip(ip, sizeof ip) != ACCEL_OK) return accel_last_status();
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t sl = sizeof sa;
    if (!strncmp(ip, "127.", 4)) inet_pton(AF_INET, ip, &sa.sin_addr); /* a loopback job stays on loopback */
    int lfd = s->g.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, SOMAXCONN) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: rank %d cannot listen: %s", me, strerror(errno));
    if (gate_start(&s->g, lfd, s->secret) != ACCEL_OK) return accel_last_status();
    snprintf(info, sizeof info, "%s %d", ip, ntohs(sa.sin_port));
    snprintf(key, sizeof key, "tcp/addr/%d", me);
    if (accel__store_set(store, key, info, strlen(info)) != ACCEL_OK ||
        accel__store_wait_ranks(store, "tcp/addr", w, "rendezvous (tcp addresses)") != ACCEL_OK)
        return accel_last_status();
    for (int k = 0; k < w; k++) {
        void *v;
        char kip[64];
        int port;
        snprintf(key, sizeof key, "tcp/addr/%d", k);
        if (accel__store_get(store, key, &v, NULL) != ACCEL_OK) return accel_last_status();
        int ok = sscanf(v, "%63s %d", kip, &port);
        accel_free(v);
        s->addr[k].sin_family = AF_INET;
        s->addr[k].sin_port = htons((uint16_t)port);
        if (ok != 2 || inet_pton(AF_INET, kip, &s->addr[k].sin_addr) != 1)
            return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: rank %d published a bad address", k);
    }
    double deadline = accel_now_seconds() + pg->timeout_s;
    uint8_t (*want)[ACCEL__MAC_LEN] = accel_malloc((size_t)(me + 1) * sizeof *want); /* [me]: what each acceptance proves */
    if (!want) return accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory");
    accel_status st = form_mesh(pg, s, deadline, want);
    accel_free(want);
    return st;
}

const accel__backend accel__backend_tcp = {
    .name = "tcp",
    .init = tcp_init,
    .finalize = tcp_finalize,
    .barrier = tcp_barrier,
    .all_reduce = tcp_all_reduce,
    .broadcast = tcp_broadcast,
    .all_gatherv = tcp_all_gatherv,
    .reduce_scatter = tcp_reduce_scatter,
    .p2p = tcp_p2p,
};
