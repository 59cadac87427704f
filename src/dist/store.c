/* src/dist/store.c — TCP key/value store for rendezvous.
 *
 * Wire format (little-endian host order; both ends are this code on one
 * architecture). The handshake proves the job secret without sending it
 * (dist/auth.h): K = ACCEL_JOB_SECRET, ns/nc = 16 random bytes of the server/client.
 *   server, on accept:  "ACS2" ns
 *   client:             "ACS2" i32 rank, nc, HMAC(K, "accel store client\0" ns nc rank)
 *   server:             u8 HELLO_OK, HMAC(K, "accel store server\0" nc ns rank)
 *                       or u8 HELLO_BAD_SECRET, then it closes
 *   request:  u8 op, u32 klen, key, u64 vlen, value
 *   replies:  SET -> u8 0; CHECK/GET -> u8 found [, u64 vlen, value]; ADD -> i64 new value
 * Waiting is done by the client (poll CHECK with a growing sleep), so the
 * server never holds a request open and a client timeout never leaves a
 * half-read reply on the connection.
 *
 * The server is one thread multiplexing every connection with poll(): each
 * has input/output buffers and is served as its bytes arrive, so no client,
 * however slow or silent, delays another. Connections that have not proved
 * the secret are bounded in time (HELLO_DEADLINE_S) and in number
 * (MAX_UNAUTHED: a new one evicts the oldest), so idle strangers can neither
 * exhaust the descriptors nor keep the listening socket readable; their bytes
 * go to a fixed buffer in the connection (no allocation before the proof).
 *
 * A refused hello (a wrong secret) is recorded under "refused/<rank>" (the
 * peer's address) and "r<rank>" appended to "lost" (the list of refused and
 * gone ranks a waiter reads in one request at each poll), so that every rank
 * waiting for any refused rank fails within REFUSED_GRACE_S naming it rather
 * than wait out the timeout.
 *
 * Likewise a rank whose authenticated connection closes (it exited or was
 * killed) before it wrote "done/<rank>" (accel__store_done: its rendezvous
 * is over) is listed as gone ("g<rank>" in "lost"), so that a wait still missing that rank
 * fails at once naming it rather than wait out ACCEL_DIST_TIMEOUT with no
 * launcher to notice the death. Only when no other connection claiming that
 * rank is open (a duplicate claimer's exit is not the genuine rank's death),
 * and a new connection claiming it takes it off the list again.
 *
 * A rank that failed before the rendezvous (its own environment refused)
 * posts why under "abort/<rank>" (accel__store_abort), its own number only,
 * and is listed as aborted ("a<rank>" in "lost"), so that every wait on the
 * store fails at once with that message rather than wait out the timeout for
 * a rank that is not coming. A new connection claiming the rank unlists it,
 * as it does a gone one. */
#include "dist/store.h"

#include "core/core_internal.h"
#include "core/env.h"
#include "dist/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3 };
enum { HELLO_OK = 1, HELLO_BAD_SECRET = 2, HELLO_UNPROVEN = 3 };
#define MAGIC "ACS2"
#define HELLO_LEN (4 + 4 + ACCEL__NONCE_LEN + ACCEL__MAC_LEN)     /* magic, rank, nc, mac */
#define LABEL_CLIENT "accel store client"
#define LABEL_SERVER "accel store server"
#define STORE_MAX_KEY 256
#define STORE_MAX_VAL (16u << 20)
#define MAX_UNAUTHED 64
#define MAX_REFUSED 64 /* refused ranks the store records at most */
#define HELLO_DEADLINE_S 2.0
/* How long rank 0's store outlives a rendezvous that failed on a dead rank,
 * at most, so that the ranks still waiting read the name of the dead one
 * rather than lose the connection: they poll every 20 ms and close at once. */
#define GONE_LINGER_S 5.0
/* What the store holds at most. Rank 0 serves it for the job's lifetime (late
 * claims, claim.c), so retrying duplicates must not grow it without bound; a
 * job uses a few small keys per rank. Past a limit the request's connection
 * is dropped. */
#define MAX_ITEMS 65536
#define MAX_BYTES (64u << 20)

typedef struct kv {
    char *key;
    void *val;
    size_t len;
} kv;

/* Server side of one connection. */
typedef struct conn {
    int fd;
    bool authed;
    int32_t rank;    /* authenticated: the rank its hello claimed */
    double deadline; /* unauthenticated: dropped after this */
    struct sockaddr_in peer;         /* where it connected from (a refusal names it) */
    uint8_t nonce[ACCEL__NONCE_LEN]; /* the challenge sent to it */
    uint8_t hello[HELLO_LEN];        /* its answer, as it arrives */
    size_t hello_len;
    char *in;
    size_t in_len, in_cap;
    bool waiting; /* not read: its message would pass IN_BUDGET (in_room) */
    char *out;
    size_t out_len, out_cap;
} conn;

struct accel__store {
    int fd;                 /* client connection */
    double timeout_s;
    int port;               /* where the server listens (the kernel's pick when opened with port 0) */
    /* server side (rank 0 only) */
    bool serving;
    int listen_fd;
    int wake[2];            /* close/write to stop the server thread */
    pthread_t thread;
    char *secret;
    int rank;               /* the rank this process claims (in its hello) */
    kv *items;
    size_t n_items, cap_items, bytes; /* bytes: of the values held */
    /* The items' index by key: open addressing, linear probing, a power of
     * two of slots, at most half full; a slot holds an item's position + 1
     * (0: empty). A lookup scanning every key made a store of a large job's
     * keys quadratic (65,536 keys: 17 s to set, each rank's poll a scan). */
    size_t *slots;
    size_t n_slots;
    size_t in_held; /* input buffers' bytes past IN_FREE each (in_room) */
    size_t n_refused;       /* refused ranks in the "lost" list */
    /* Written by the server thread, read by accel__store_close: authenticated
     * connections open, and whether "lost" ever listed a gone rank. */
    atomic_int n_authed;
    atomic_bool any_gone;
    conn *conns;
    size_t n_conns, cap_conns;
};

/* ---------------------------------------------------------------- io helpers */

static bool write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

static bool read_all(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t r = recv(fd, c, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        c += r;
        n -= (size_t)r;
    }
    return true;
}

/* ---------------------------------------------------------------- server */

static size_t key_hash(const char *key) { /* FNV-1a */
    uint64_t h = 14695981039346656037ull;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return (size_t)h;
}

/* key's slot in the index: the one holding it, else the empty one where it
 * would go. The index has slots (n_slots > 0). */
static size_t *slot_of(const accel__store *s, const char *key) {
    size_t mask = s->n_slots - 1, i = key_hash(key) & mask;
    while (s->slots[i] && strcmp(s->items[s->slots[i] - 1].key, key) != 0) i = (i + 1) & mask;
    return &s->slots[i];
}

static kv *find_kv(accel__store *s, const char *key) {
    size_t *slot = s->n_slots ? slot_of(s, key) : NULL;
    return slot && *slot ? &s->items[*slot - 1] : NULL;
}

/* Room in the index for one more item (at most half full). */
static bool reserve_slots(accel__store *s) {
    if (2 * (s->n_items + 1) <= s->n_slots) return true;
    size_t n = s->n_slots ? 2 * s->n_slots : 128;
    size_t *slots = accel_calloc(n, sizeof *slots);
    if (!slots) return false;
    accel_free(s->slots);
    s->slots = slots;
    s->n_slots = n;
    for (size_t i = 0; i < s->n_items; i++) *slot_of(s, s->items[i].key) = i + 1;
    return true;
}

static bool put_kv(accel__store *s, const char *key, void *val, size_t len) {
    kv *e = find_kv(s, key);
    size_t held = s->bytes - (e ? e->len : 0);
    if (len > MAX_BYTES - held || (!e && s->n_items >= MAX_ITEMS)) return false;
    if (e) {
        accel_free(e->val);
        e->val = val;
        e->len = len;
        s->bytes = held + len;
        return true;
    }
    if (s->n_items == s->cap_items) {
        size_t cap = s->cap_items ? s->cap_items * 2 : 64;
        kv *n = accel__realloc(s->items, s->cap_items * sizeof *n, cap * sizeof *n);
        if (!n) return false;
        s->items = n;
        s->cap_items = cap;
    }
    char *k = reserve_slots(s) ? accel_strdup(key) : NULL;
    if (!k) return false;
    s->items[s->n_items] = (kv){k, val, len};
    *slot_of(s, k) = ++s->n_items;
    s->bytes = held + len;
    return true;
}

/* ---------------------------------------------------------------- connections */

static bool reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *n = accel__realloc(*buf, *cap, c);
    if (!n) return false;
    *buf = n;
    *cap = c;
    return true;
}

/* Queues a reply and sends what the socket takes now; the rest goes out when
 * poll says it is writable. */
static bool reply(conn *c, const void *p, size_t n) {
    if (!reserve(&c->out, &c->out_cap, c->out_len + n)) return false;
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return true;
}

static bool flush_out(conn *c) {
    if (!c->out_len) return true;
    size_t sent = 0;
    while (sent < c->out_len) {
        ssize_t w = send(c->fd, c->out + sent, c->out_len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            sent += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        return false;
    }
    memmove(c->out, c->out + sent, c->out_len - sent);
    c->out_len -= sent;
    return true;
}

/* What the connections' incomplete messages may hold, in all: each reads
 * IN_FREE bytes of input freely (a rendezvous message is far smaller), and
 * what grows past that, toward a message of up to STORE_MAX_VAL, counts
 * against IN_BUDGET. Authenticated connections are not bounded in number (a
 * job's ranks), and each held up to one whole message: 16 of them, each a
 * 16 MiB SET one byte short, grew rank 0 by 304 MiB, without bound as more
 * connected. A connection whose message does not fit waits, unread (its
 * bytes stay in the kernel's buffers and its sends block), until a message
 * completes or a connection closes. One message alone always fits. */
#define IN_FREE (128u << 10)
#define IN_BUDGET (64u << 20)

static size_t in_counted(size_t cap) { return cap > IN_FREE ? cap - IN_FREE : 0; }

/* Whether c's input buffer may grow to hold need bytes (as reserve grows it). */
static bool in_room(const accel__store *s, const conn *c, size_t need) {
    size_t cap = c->in_cap ? c->in_cap : 256;
    while (cap < need) cap *= 2;
    return s->in_held + in_counted(cap) - in_counted(c->in_cap) <= IN_BUDGET;
}

/* c's input back to IN_FREE once its large message is served; the waiting
 * connections may then read again. */
static void in_release(accel__store *s, conn *c) {
    if (c->in_cap <= IN_FREE || c->in_len > IN_FREE / 2) return;
    char *n = accel__realloc(c->in, c->in_len, IN_FREE);
    if (!n) return;
    s->in_held -= in_counted(c->in_cap);
    c->in = n;
    c->in_cap = IN_FREE;
    for (size_t i = 0; i < s->n_conns; i++) s->conns[i].waiting = false;
}

static void drop_conn(accel__store *s, size_t i) {
    s->in_held -= in_counted(s->conns[i].in_cap);
    for (size_t k = 0; k < s->n_conns; k++) s->conns[k].waiting = false;
    if (s->conns[i].authed) atomic_fetch_sub(&s->n_authed, 1);
    close(s->conns[i].fd);
    accel_free(s->conns[i].in);
    accel_free(s->conns[i].out);
    s->conns[i] = s->conns[--s->n_conns];
}

/* ---------------------------------------------------------------- requests */

/* Bytes of the complete message at the head of c->in, 0 while incomplete,
 * -1 for a malformed one (the connection is dropped). */
static long message_size(const conn *c) {
    const char *p = c->in;
    size_t n = c->in_len;
    uint32_t klen;
    uint64_t vlen;
    if (n < 5) return 0;
    memcpy(&klen, p + 1, 4);
    if (klen > STORE_MAX_KEY) return -1;
    if (n < 13 + (size_t)klen) return 0;
    memcpy(&vlen, p + 5 + klen, 8);
    if (vlen > STORE_MAX_VAL) return -1;
    size_t total = 13 + (size_t)klen + (size_t)vlen;
    return n >= total ? (long)total : 0;
}

/* "refused/<rank>" = "<ip>:<port>" of a peer that claimed rank with a wrong
 * secret, and "r<rank>" appended to "lost" (space-separated tagged ranks,
 * each once: "r3 g1 "). Bounded: ranks below 2^20, at most MAX_REFUSED
 * refused ranks. The address is the one accept() saw: the peer may be gone
 * by now (its launcher killed it once it read our refusal), when
 * getpeername() no longer knows it. */
#define REFUSED 'r'
#define GONE 'g'
#define ABORTED 'a'

/* The next rank tagged tag in the list at *p, stepping *p past it; -1 at
 * the list's end. */
static long next_listed(const char **p, char tag) {
    while (*p && **p) {
        char t = **p, *end;
        long r = strtol(*p + 1, &end, 10);
        if (end == *p + 1) return -1;
        *p = end + strspn(end, " ");
        if (t == tag) return r;
    }
    return -1;
}

/* Whether rank is listed with tag in "lost". */
static bool rank_listed(accel__store *s, char tag, int32_t rank) {
    kv *list = find_kv(s, "lost");
    const char *p = list ? list->val : NULL;
    for (long r; (r = next_listed(&p, tag)) >= 0;)
        if (r == rank) return true;
    return false;
}

/* Appends rank with tag to "lost" unless listed; false when it cannot (out
 * of memory or of room). Entries are at most 9 bytes ("g1048575 "). */
static bool list_rank(accel__store *s, char tag, int32_t rank) {
    if (rank_listed(s, tag, rank)) return true;
    kv *list = find_kv(s, "lost");
    size_t had = list ? list->len - 1 : 0;
    char *l = accel_malloc(had + 10);
    if (!l) return false;
    if (had) memcpy(l, list->val, had);
    int m = snprintf(l + had, 10, "%c%d ", tag, (int)rank);
    if (!put_kv(s, "lost", l, had + (size_t)m + 1)) {
        accel_free(l);
        return false;
    }
    return true;
}

/* Whether key is one of the records above, which the store alone writes:
 * the list it parses must be its own ("r3 g1 ", NUL-terminated). */
static bool store_record(const char *key) { return !strcmp(key, "lost") || !strncmp(key, "refused/", 8); }

/* The record above; the list first, whenever the rank is absent from it: a
 * rank whose address could not be stored is still listed (once, however
 * often it is refused). */
static void note_refused(accel__store *s, const conn *c, int32_t rank) {
    char key[32], ip[INET_ADDRSTRLEN] = "?", val[INET_ADDRSTRLEN + 8];
    if (rank < 0 || rank >= (1 << 20)) return;
    if (!rank_listed(s, REFUSED, rank)) {
        if (s->n_refused >= MAX_REFUSED || !list_rank(s, REFUSED, rank)) return;
        s->n_refused++;
    }
    snprintf(key, sizeof key, "refused/%d", (int)rank);
    inet_ntop(AF_INET, &c->peer.sin_addr, ip, sizeof ip);
    int n = snprintf(val, sizeof val, "%s:%d", ip, ntohs(c->peer.sin_port));
    char *v = accel_malloc((size_t)n + 1);
    if (!v) return;
    memcpy(v, val, (size_t)n + 1);
    if (!put_kv(s, key, v, (size_t)n + 1)) accel_free(v);
}

/* Takes rank's entry tagged tag off "lost". A connection claiming rank is
 * back (a new process for that rank, or the same one opening a store again):
 * the rank is no longer gone, nor aborted. */
static void unlist_rank(accel__store *s, char tag, int32_t rank) {
    if (!rank_listed(s, tag, rank)) return;
    kv *list = find_kv(s, "lost");
    char *l = accel_malloc(list->len), *w = l; /* never longer than the list it rewrites */
    if (!l) return;
    for (char *p = list->val, *end; *p; p = end + strspn(end, " ")) {
        long r = strtol(p + 1, &end, 10);
        if (end == p + 1) break;
        if (*p != tag || r != rank) w += sprintf(w, "%c%ld ", *p, r);
    }
    *w = 0;
    if (!put_kv(s, "lost", l, (size_t)(w - l) + 1)) accel_free(l);
}

/* The authenticated connection c closed: its rank is gone unless it said it
 * was done or another connection claiming it is still open. */
static void note_gone(accel__store *s, const conn *c) {
    char key[32];
    snprintf(key, sizeof key, "done/%d", (int)c->rank);
    if (c->rank < 0 || c->rank >= (1 << 20) || find_kv(s, key)) return;
    for (size_t i = 0; i < s->n_conns; i++)
        if (&s->conns[i] != c && s->conns[i].authed && s->conns[i].rank == c->rank) return;
    if (list_rank(s, GONE, c->rank)) atomic_store(&s->any_gone, true);
}

/* The client's answer to our challenge: a valid proof -> authenticated, and
 * we prove the secret back; a wrong one (an accel client with another
 * secret) -> told so (the client can then name the real problem), recorded,
 * dropped; anything else -> dropped. */
static bool serve_hello(accel__store *s, conn *c) {
    const uint8_t *h = c->hello, *nc = h + 8, *mac = h + 8 + ACCEL__NONCE_LEN;
    int32_t rank;
    uint8_t want[ACCEL__MAC_LEN], code[1 + ACCEL__MAC_LEN];
    if (memcmp(h, MAGIC, 4) != 0) return false;
    memcpy(&rank, h + 4, 4);
    accel__auth_mac(s->secret, LABEL_CLIENT, c->nonce, nc, &rank, 4, want);
    if (!accel__auth_mac_equal(mac, want)) {
        code[0] = HELLO_BAD_SECRET;
        send(c->fd, code, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        note_refused(s, c, rank);
        return false;
    }
    c->authed = true;
    c->rank = rank;
    atomic_fetch_add(&s->n_authed, 1);
    unlist_rank(s, GONE, rank);
    unlist_rank(s, ABORTED, rank);
    code[0] = HELLO_OK;
    accel__auth_mac(s->secret, LABEL_SERVER, nc, c->nonce, &rank, 4, code + 1);
    return reply(c, code, sizeof code);
}

/* Whether key is c's own "abort/<rank>", of a rank the list can hold: a
 * connection aborts only the rank its hello claimed. */
static bool own_abort_record(const conn *c, const char *key) {
    char own[32];
    snprintf(own, sizeof own, "abort/%d", (int)c->rank);
    return c->rank >= 0 && c->rank < (1 << 20) && !strcmp(key, own);
}

static bool serve_request(accel__store *s, conn *c) {
    uint8_t op = (uint8_t)c->in[0];
    uint32_t klen;
    uint64_t vlen;
    memcpy(&klen, c->in + 1, 4);
    char key[STORE_MAX_KEY + 1];
    memcpy(key, c->in + 5, klen);
    key[klen] = 0;
    memcpy(&vlen, c->in + 5 + klen, 8);
    const char *val = c->in + 13 + klen;
    if (op != OP_GET && store_record(key)) return false; /* a client that skipped the library's check */
    if (op == OP_SET) {
        bool abort_record = !strncmp(key, "abort/", 6);
        if (abort_record && !own_abort_record(c, key)) return false;
        void *v = accel_malloc(vlen ? vlen : 1);
        if (!v) return false;
        memcpy(v, val, vlen);
        if (!put_kv(s, key, v, vlen)) {
            accel_free(v);
            return false;
        }
        if (abort_record && !list_rank(s, ABORTED, c->rank)) return false;
        uint8_t z = 0;
        return reply(c, &z, 1);
    }
    if (op == OP_GET) {
        kv *e = find_kv(s, key);
        uint8_t found = e != NULL;
        if (!reply(c, &found, 1)) return false;
        if (!e) return true;
        uint64_t n = e->len;
        return reply(c, &n, 8) && reply(c, e->val, e->len);
    }
    if (op == OP_ADD && vlen == 8) {
        int64_t delta, cur = 0;
        memcpy(&delta, val, 8);
        kv *e = find_kv(s, key);
        if (e && e->len == 8) memcpy(&cur, e->val, 8);
        /* two's complement wrap: a signed overflow would be UB (UBSan's abort
         * took rank 0's store down with it) */
        cur = (int64_t)((uint64_t)cur + (uint64_t)delta);
        int64_t *nv = accel_malloc(8);
        if (!nv) return false;
        *nv = cur;
        if (!put_kv(s, key, nv, 8)) {
            accel_free(nv);
            return false;
        }
        return reply(c, &cur, 8);
    }
    return false;
}

/* Replies queued for a connection past which its requests wait: a client
 * that sends GETs of a large value and never reads the replies grew rank 0's
 * memory by the value's size per 16-byte request (40 GETs of 16 MiB: 636
 * MiB) and stalled the other clients on the copies. Past it the connection's
 * input is neither served nor read until the socket takes the replies: its
 * requests back up in the kernel's buffers, on the client's side. */
#define OUT_PAUSE (1u << 20)

static bool serve_messages(accel__store *s, conn *c) {
    while (c->out_len < OUT_PAUSE) {
        long m = message_size(c);
        if (m <= 0) return m == 0;
        if (!serve_request(s, c)) return false;
        memmove(c->in, c->in + m, c->in_len - (size_t)m);
        c->in_len -= (size_t)m;
    }
    return true;
}

/* Reads the hello into its fixed buffer (never more than it: a request may
 * follow only once the client has our answer); true while it is incomplete
 * or was accepted. */
static bool read_hello(accel__store *s, conn *c) {
    while (!c->authed) {
        ssize_t r = recv(c->fd, c->hello + c->hello_len, HELLO_LEN - c->hello_len, MSG_DONTWAIT);
        if (r > 0) {
            c->hello_len += (size_t)r;
            if (c->hello_len == HELLO_LEN && !serve_hello(s, c)) return false;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    return true;
}

/* Reads what arrived and serves every complete message; false drops c. The
 * input never grows past one message (nor, all connections' together, past
 * IN_BUDGET beyond IN_FREE each), nor the queued replies far past OUT_PAUSE:
 * a client cannot make us buffer more. */
static bool serve_input(accel__store *s, conn *c) {
    if (!read_hello(s, c)) return false;
    while (c->authed && c->out_len < OUT_PAUSE) {
        size_t limit = 13 + STORE_MAX_KEY + STORE_MAX_VAL;
        if (c->in_len >= limit) return false; /* a valid message would have completed */
        size_t want = limit - c->in_len < 65536 ? limit - c->in_len : 65536;
        size_t cap = c->in_cap;
        if (c->in_len + want > cap && !in_room(s, c, c->in_len + want)) {
            c->waiting = true;
            break;
        }
        if (!reserve(&c->in, &c->in_cap, c->in_len + want)) return false;
        s->in_held += in_counted(c->in_cap) - in_counted(cap);
        ssize_t r = recv(c->fd, c->in + c->in_len, want, MSG_DONTWAIT);
        if (r > 0) {
            c->in_len += (size_t)r;
            if (!serve_messages(s, c)) return false;
            in_release(s, c);
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        return false; /* end of stream or error */
    }
    return flush_out(c);
}

/* ---------------------------------------------------------------- server loop */

/* The unauthenticated connection closest to its deadline (the oldest), or -1. */
static long oldest_unauthed(const accel__store *s, size_t *count) {
    long best = -1;
    *count = 0;
    for (size_t i = 0; i < s->n_conns; i++) {
        if (s->conns[i].authed) continue;
        ++*count;
        if (best < 0 || s->conns[i].deadline < s->conns[best].deadline) best = (long)i;
    }
    return best;
}

/* Accepts the pending connections (a bounded batch, so the others are served
 * meanwhile); a newcomer beyond MAX_UNAUTHED strangers evicts the oldest.
 * Returns false when out of descriptors with nobody to evict: the caller
 * stops listening for a moment rather than spin on a listening socket that
 * stays readable. */
static bool accept_new(accel__store *s) {
    for (int batch = 0; batch < 256; batch++) {
        size_t unauthed;
        long old;
        struct sockaddr_in peer = {0};
        socklen_t pl = sizeof peer;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM) return true;
            if ((old = oldest_unauthed(s, &unauthed)) < 0) return false;
            drop_conn(s, (size_t)old); /* a stranger's descriptor for this newcomer */
            continue;
        }
        if ((old = oldest_unauthed(s, &unauthed)) >= 0 && unauthed >= MAX_UNAUTHED) drop_conn(s, (size_t)old);
        if (s->n_conns == s->cap_conns) {
            size_t cap = s->cap_conns ? 2 * s->cap_conns : 64;
            conn *n = accel__realloc(s->conns, s->cap_conns * sizeof *n, cap * sizeof *n);
            if (!n) {
                close(fd);
                return true;
            }
            s->conns = n;
            s->cap_conns = cap;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn c = {.fd = fd, .peer = peer, .deadline = accel_now_seconds() + HELLO_DEADLINE_S};
        if (!accel__auth_challenge(fd, MAGIC, c.nonce)) {
            close(fd);
            continue;
        }
        s->conns[s->n_conns++] = c;
    }
    return true;
}

static int poll_timeout_ms(const accel__store *s, double listen_paused_until) {
    double now = accel_now_seconds(), next = listen_paused_until > now ? listen_paused_until : 0;
    for (size_t i = 0; i < s->n_conns; i++)
        if (!s->conns[i].authed && (next == 0 || s->conns[i].deadline < next)) next = s->conns[i].deadline;
    if (next == 0) return -1;
    return next <= now ? 0 : (int)((next - now) * 1000) + 1;
}

static void *server_main(void *arg) {
    accel__store *s = arg;
    struct pollfd *pf = NULL;
    size_t cap_pf = 0;
    double listen_paused_until = 0;
    for (;;) {
        size_t n = s->n_conns + 2;
        if (n > cap_pf) {
            struct pollfd *np = accel__realloc(pf, cap_pf * sizeof *np, n * sizeof *np);
            if (!np) break;
            pf = np;
            cap_pf = n;
        }
        bool listening = accel_now_seconds() >= listen_paused_until;
        pf[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pf[1] = (struct pollfd){.fd = listening ? s->listen_fd : -1, .events = POLLIN};
        for (size_t i = 0; i < s->n_conns; i++) {
            size_t out = s->conns[i].out_len;
            bool read = out < OUT_PAUSE && !s->conns[i].waiting;
            pf[i + 2] = (struct pollfd){.fd = s->conns[i].fd, .events = (short)((read ? POLLIN : 0) | (out ? POLLOUT : 0))};
        }
        int ready = poll(pf, n, poll_timeout_ms(s, listen_paused_until));
        if (ready < 0 && errno != EINTR) break;
        if (pf[0].revents) break;
        /* Serve from the back so that drop_conn's swap-with-last never skips one. */
        for (size_t i = n - 2; ready > 0 && i-- > 0;) {
            conn *c = &s->conns[i];
            short ev = pf[i + 2].revents;
            if (!ev) continue;
            /* Replies sent: the requests that waited for it are served. */
            bool ok = !(ev & POLLNVAL) && ((ev & (POLLIN | POLLHUP | POLLERR)) ? serve_input(s, c)
                                                                                : flush_out(c) && serve_messages(s, c) && flush_out(c));
            if (!ok) {
                if (c->authed) note_gone(s, c);
                drop_conn(s, i);
            }
        }
        double now = accel_now_seconds();
        for (size_t i = s->n_conns; i-- > 0;)
            if (!s->conns[i].authed && s->conns[i].deadline <= now) drop_conn(s, i);
        if (ready > 0 && (pf[1].revents & POLLIN) && !accept_new(s)) listen_paused_until = now + 0.1;
    }
    while (s->n_conns) drop_conn(s, s->n_conns - 1);
    accel_free(pf);
    return NULL;
}

static bool resolve(const char *addr, int port, struct sockaddr_in *out) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(addr, NULL, &hints, &res) != 0 || !res) return false;
    *out = *(struct sockaddr_in *)res->ai_addr;
    out->sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return true;
}

static accel_status start_server(accel__store *s, const char *addr, int port) {
    struct sockaddr_in sa;
    if (!resolve(addr, port, &sa))
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: cannot resolve MASTER_ADDR '%s'", addr);
    /* Loopback masters serve only loopback; otherwise every interface, since
     * MASTER_ADDR may be a name the other machines use for us. */
    if ((ntohl(sa.sin_addr.s_addr) >> 24) != 127) sa.sin_addr.s_addr = htonl(INADDR_ANY);
    s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t sl = sizeof sa;
    if (s->listen_fd < 0 || bind(s->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(s->listen_fd, SOMAXCONN) != 0 || getsockname(s->listen_fd, (struct sockaddr *)&sa, &sl) != 0)
        return accel_set_error(ACCEL_ERR_DIST,
                               "accel_dist_init: rank 0 cannot listen on %s:%d (%s); is another job using "
                               "MASTER_PORT=%d? (set MASTER_PORT to a free port; `accel launch "
                               "--main_process_port 0` picks one)",
                               addr, port, strerror(errno), port);
    s->port = ntohs(sa.sin_port);
    if (pipe2(s->wake, O_CLOEXEC) != 0)
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: pipe: %s", strerror(errno));
    if (pthread_create(&s->thread, NULL, server_main, s) != 0)
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: cannot start the store thread");
    s->serving = true;
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- client */

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void set_rcvtimeo(int fd, double seconds) {
    struct timeval tv = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* One connection + handshake: HELLO_OK (each side proved the secret),
 * HELLO_BAD_SECRET (the store refused our proof), HELLO_UNPROVEN (it accepted
 * but could not prove the secret back), 0 when it took the connection but
 * never answered as a store, -1 when it cannot connect. */
static int try_hello(int fd, const struct sockaddr_in *sa, const char *secret, int32_t rank) {
    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) != 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_rcvtimeo(fd, HELLO_DEADLINE_S);
    uint8_t challenge[ACCEL__CHALLENGE_LEN], hello[HELLO_LEN], answer[1 + ACCEL__MAC_LEN], want[ACCEL__MAC_LEN];
    const uint8_t *ns = challenge + 4;
    uint8_t *nc = hello + 8;
    if (!read_all(fd, challenge, sizeof challenge) || memcmp(challenge, MAGIC, 4) != 0 || !accel__auth_nonce(nc))
        return 0;
    memcpy(hello, MAGIC, 4);
    memcpy(hello + 4, &rank, 4);
    accel__auth_mac(secret, LABEL_CLIENT, ns, nc, &rank, 4, hello + 8 + ACCEL__NONCE_LEN);
    if (!write_all(fd, hello, sizeof hello) || !read_all(fd, answer, 1)) return 0;
    if (answer[0] == HELLO_BAD_SECRET) return HELLO_BAD_SECRET;
    if (answer[0] != HELLO_OK || !read_all(fd, answer + 1, ACCEL__MAC_LEN)) return 0;
    accel__auth_mac(secret, LABEL_SERVER, nc, ns, &rank, 4, want);
    return accel__auth_mac_equal(answer + 1, want) ? HELLO_OK : HELLO_UNPROVEN;
}

/* Connects and authenticates, retrying until the timeout: rank 0 may not
 * listen yet, or may have dropped us among a flood of other connections.
 * Only an explicit refusal is reported as a wrong secret. */
static accel_status connect_client(accel__store *s, const char *addr, int port, const char *secret) {
    int32_t rank = s->rank;
    struct sockaddr_in sa;
    if (!resolve(addr, port, &sa))
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: cannot resolve MASTER_ADDR '%s'", addr);
    double deadline = accel_now_seconds() + s->timeout_s, nap = 0.001;
    int dropped = 0;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int r = fd >= 0 ? try_hello(fd, &sa, secret, rank) : -1;
        if (r == HELLO_OK) {
            set_rcvtimeo(fd, s->timeout_s + 1); /* replies come at once; this only bounds a dead rank 0 */
            s->fd = fd;
            return ACCEL_OK;
        }
        if (fd >= 0) close(fd);
        if (r == HELLO_BAD_SECRET)
            return accel_set_error(ACCEL_ERR_DIST,
                                   "accel_dist_init: the store at %s:%d refused this process: "
                                   "ACCEL_JOB_SECRET does not match (another job on that port?)",
                                   addr, port);
        if (r == HELLO_UNPROVEN)
            return accel_set_error(ACCEL_ERR_DIST,
                                   "accel_dist_init: the store at %s:%d accepted this process but did not "
                                   "prove it knows ACCEL_JOB_SECRET (another job's or a forged store?)",
                                   addr, port);
        if (r == 0) dropped++;
        if (accel_now_seconds() > deadline) {
            if (dropped)
                return accel_set_error(ACCEL_ERR_TIMEOUT,
                                       "accel_dist_init: rendezvous timed out after %g s: %s:%d accepted %d "
                                       "connection%s but never answered the store handshake (another service on "
                                       "MASTER_PORT, or rank 0 flooded by other connections?)",
                                       s->timeout_s, addr, port, dropped, dropped > 1 ? "s" : "");
            return accel_set_error(ACCEL_ERR_TIMEOUT,
                                   "accel_dist_init: rendezvous timed out after %g s: cannot connect "
                                   "to rank 0 at %s:%d (MASTER_ADDR/MASTER_PORT)",
                                   s->timeout_s, addr, port);
        }
        sleep_s(nap);
        if (nap < 0.05) nap *= 2;
    }
}

accel__store *accel__store_open(const char *addr, int port, bool serve, const char *secret, int rank,
                                double timeout_s) {
    accel__store *s = accel_calloc(1, sizeof *s);
    if (!s) { accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory"); return NULL; }
    s->fd = s->listen_fd = s->wake[0] = s->wake[1] = -1;
    s->timeout_s = timeout_s;
    s->rank = rank;
    s->secret = accel_strdup(secret ? secret : "");
    s->port = port;
    if (!s->secret || (serve && start_server(s, addr, port) != ACCEL_OK) ||
        connect_client(s, addr, s->port, s->secret) != ACCEL_OK) {
        accel__store_close(s);
        return NULL;
    }
    return s;
}

int accel__store_port(const accel__store *s) { return s->port; }

void accel__store_close(accel__store *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    /* A rank died during the rendezvous: serve on until the other ranks, which
     * fail at their next poll naming it, have closed (bounded: one may hang). */
    for (double until = accel_now_seconds() + GONE_LINGER_S;
         s->serving && atomic_load(&s->any_gone) && atomic_load(&s->n_authed) > 0 && accel_now_seconds() < until;)
        sleep_s(0.005);
    if (s->serving) {
        if (write(s->wake[1], "x", 1) != 1) { /* the thread also stops when the pipe closes */ }
        pthread_join(s->thread, NULL);
    }
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    if (s->listen_fd >= 0) close(s->listen_fd);
    for (size_t i = 0; i < s->n_items; i++) {
        accel_free(s->items[i].key);
        accel_free(s->items[i].val);
    }
    accel_free(s->items);
    accel_free(s->slots);
    accel_free(s->conns);
    accel_free(s->secret);
    accel_free(s);
}

accel_status accel__store_done(accel__store *s) {
    char key[32];
    snprintf(key, sizeof key, "done/%d", s->rank);
    return accel__store_set(s, key, "", 0);
}

static accel_status request(accel__store *s, uint8_t op, const char *key, const void *val, size_t len) {
    uint32_t klen = (uint32_t)strlen(key);
    uint64_t vlen = len;
    if (klen > STORE_MAX_KEY || len > STORE_MAX_VAL)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel store: key or value too large ('%s')", key);
    if (op != OP_GET && store_record(key))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel store: '%s' is the store's own record (of refused "
                               "and gone ranks): no client writes it", key);
    if (!write_all(s->fd, &op, 1) || !write_all(s->fd, &klen, 4) || !write_all(s->fd, key, klen) ||
        !write_all(s->fd, &vlen, 8) || (len && !write_all(s->fd, val, len)))
        return accel_set_error(ACCEL_ERR_DIST, "accel store: lost the connection to rank 0 (%s)", strerror(errno));
    return ACCEL_OK;
}

static accel_status lost(void) {
    return accel_set_error(ACCEL_ERR_DIST, "accel store: lost the connection to rank 0 (did rank 0 exit?)");
}

accel_status accel__store_set(accel__store *s, const char *key, const void *val, size_t len) {
    uint8_t z;
    if (request(s, OP_SET, key, val, len) != ACCEL_OK) return accel_last_status();
    return read_all(s->fd, &z, 1) ? ACCEL_OK : lost();
}

accel_status accel__store_add(accel__store *s, const char *key, int64_t delta, int64_t *out) {
    int64_t v;
    if (request(s, OP_ADD, key, &delta, 8) != ACCEL_OK) return accel_last_status();
    if (!read_all(s->fd, &v, 8)) return lost();
    if (out) *out = v;
    return ACCEL_OK;
}

/* One GET: *found false when the key is absent. */
static accel_status try_get(accel__store *s, const char *key, bool *found, void **val, size_t *len) {
    uint8_t f;
    if (request(s, OP_GET, key, NULL, 0) != ACCEL_OK) return accel_last_status();
    if (!read_all(s->fd, &f, 1)) return lost();
    *found = f;
    if (!f) return ACCEL_OK;
    uint64_t n;
    if (!read_all(s->fd, &n, 8) || n > STORE_MAX_VAL) return lost();
    char *v = accel_malloc(n + 1);
    if (!v) return accel_set_error(ACCEL_ERR_OOM, "accel store: out of memory");
    if (!read_all(s->fd, v, n)) { accel_free(v); return lost(); }
    v[n] = 0;
    if (val) *val = v; else accel_free(v);
    if (len) *len = n;
    return ACCEL_OK;
}

/* Fails the wait called what (ACCEL_ERR_DIST) when lost (the store's "lost"
 * list, NULL when absent) lists a rank that posted an abort record: the
 * rendezvous cannot complete without that rank, so no wait need run on. The
 * store lists a rank only once its record is stored (serve_request) and
 * removes no record, so the record is there to name why. */
static accel_status check_aborted(accel__store *s, const char *lost, const char *what) {
    long rank = next_listed(&lost, ABORTED);
    if (rank < 0) return ACCEL_OK;
    char key[32];
    void *why = NULL;
    bool found;
    snprintf(key, sizeof key, "abort/%ld", rank);
    if (try_get(s, key, &found, &why, NULL) != ACCEL_OK) return accel_last_status();
    if (!found) return ACCEL_OK; /* only a store that broke the rule above: the wait runs on to its timeout */
    accel_set_error(ACCEL_ERR_DIST, "%s failed: rank %ld failed before the rendezvous: %s", what, rank, (char *)why);
    accel_free(why);
    return ACCEL_ERR_DIST;
}

/* check_aborted on the list as the store holds it now. */
static accel_status fetch_aborted(accel__store *s, const char *what) {
    void *lost = NULL;
    bool listed;
    if (try_get(s, "lost", &listed, &lost, NULL) != ACCEL_OK) return accel_last_status();
    accel_status st = check_aborted(s, lost, what);
    accel_free(lost);
    return st;
}

accel_status accel__store_abort(accel__store *s, const char *why) {
    char key[32];
    snprintf(key, sizeof key, "abort/%d", s->rank);
    return accel__store_set(s, key, why, strlen(why) + 1);
}

accel_status accel__store_wait_heard(accel__store *s, int world, double timeout_s) {
    double deadline = accel_now_seconds() + timeout_s, nap = 0.0002;
    for (int k = 0; k < world;) {
        char key[32];
        bool found = k == s->rank;
        snprintf(key, sizeof key, "claims/%d", k);
        if (!found && try_get(s, key, &found, NULL, NULL) != ACCEL_OK) return accel_last_status();
        snprintf(key, sizeof key, "abort/%d", k);
        if (!found && try_get(s, key, &found, NULL, NULL) != ACCEL_OK) return accel_last_status();
        if (found) {
            k++;
            continue;
        }
        if (accel_now_seconds() > deadline)
            return accel_set_error(ACCEL_ERR_TIMEOUT, "accel store: rank %d of %d did not connect within %g s", k,
                                   world, timeout_s);
        sleep_s(nap);
        if (nap < 0.02) nap *= 1.5;
    }
    /* They fail at their next poll and close; the one left is this process's own. */
    for (double until = accel_now_seconds() + GONE_LINGER_S;
         atomic_load(&s->n_authed) > 1 && accel_now_seconds() < until;)
        sleep_s(0.005);
    return ACCEL_OK;
}

accel_status accel__store_get(accel__store *s, const char *key, void **val, size_t *len) {
    double deadline = accel_now_seconds() + s->timeout_s, nap = 0.0002;
    for (;;) {
        bool found;
        if (try_get(s, key, &found, val, len) != ACCEL_OK) return accel_last_status();
        if (found) return ACCEL_OK;
        if (fetch_aborted(s, "rendezvous") != ACCEL_OK) return accel_last_status();
        if (accel_now_seconds() > deadline)
            return accel_set_error(ACCEL_ERR_TIMEOUT, "accel store: timed out after %g s waiting for key '%s'",
                                   s->timeout_s, key);
        sleep_s(nap);
        if (nap < 0.02) nap *= 1.5;
    }
}

/* A missing rank the store refused a hello for (note_refused) fails the wait
 * once it is still missing REFUSED_GRACE_S after the refusal was first seen
 * here, naming the address it came from: not at once, so that a process of
 * another job that happens onto our port (and is refused) cannot fail a job
 * whose genuine rank is a moment late. Once the genuine rank has claimed its
 * number (claims/<rank>, accel__claim_rank: only a client that proved the
 * secret can write it), the refusal was of someone else and is ignored: the
 * rank is merely slow. ACCEL_DIST_REFUSED_FAIL_FAST=0 never fails early: the
 * refusal is only named when the wait times out (a job whose ranks start far
 * apart on a port strangers can reach).
 * Every missing rank counts, not only the lowest: of a wrong-secret machine's
 * ranks often only one reaches the store before its launcher, seeing that one
 * refused, kills the others, and the one refused need not be the lowest. */
#define REFUSED_GRACE_S 2.0
typedef struct refusal {
    int rank;     /* -1: none seen */
    double seen;  /* when first seen */
    char from[64]; /* the refused process's address */
    /* Refused ranks found claimed or arrived: they stay so (keys are never
     * deleted), so they are not asked about again at every poll. */
    int settled[MAX_REFUSED];
    int n_settled;
} refusal;

static bool settled(const refusal *r, int rank) {
    for (int i = 0; i < r->n_settled; i++)
        if (r->settled[i] == rank) return true;
    return false;
}

static accel_status refused_error(const refusal *r, int world, const char *what, accel_status code, const char *how) {
    return accel_set_error(code, "%s failed%s: rank %d of %d did not arrive: the store refused a process at %s "
                           "claiming rank %d: wrong job secret (ACCEL_JOB_SECRET differs between machines?)", what,
                           how, r->rank, world, r->from, r->rank);
}

/* *yes: rank is one the wait still misses (at or above next, below world, no
 * "<prefix>/<rank>") and that no genuine process has claimed. A rank found
 * arrived or claimed is remembered as settled in r. */
static accel_status unclaimed_missing(accel__store *s, refusal *r, const char *prefix, int rank, int next, int world,
                                      bool *yes) {
    char key[STORE_MAX_KEY];
    bool found = false;
    *yes = false;
    if (rank < next || rank >= world || settled(r, rank)) return ACCEL_OK;
    snprintf(key, sizeof key, "%s/%d", prefix, rank);
    if (try_get(s, key, &found, NULL, NULL) != ACCEL_OK) return accel_last_status();
    if (!found) {
        snprintf(key, sizeof key, "claims/%d", rank);
        if (try_get(s, key, &found, NULL, NULL) != ACCEL_OK) return accel_last_status();
    }
    if (found && r->n_settled < MAX_REFUSED) r->settled[r->n_settled++] = rank;
    *yes = !found;
    return ACCEL_OK;
}

/* Follows the refusals of missing ranks: keeps the one it follows while that
 * rank stays missing and unclaimed (its grace runs on), else takes the first
 * such rank refused in lost (the store's "lost" list, NULL when absent).
 * Fails after the grace (fail_fast) or at once when the wait has timed out
 * (now). */
static accel_status check_refused(accel__store *s, refusal *r, const char *lost, const char *prefix, int next,
                                  int world, const char *what, bool fail_fast, bool now) {
    bool yes = false;
    if (r->rank >= 0 && unclaimed_missing(s, r, prefix, r->rank, next, world, &yes) != ACCEL_OK)
        return accel_last_status();
    if (!yes) {
        bool found;
        r->rank = -1;
        for (long k; !yes && (k = next_listed(&lost, REFUSED)) >= 0;) {
            if (unclaimed_missing(s, r, prefix, (int)k, next, world, &yes) != ACCEL_OK) return accel_last_status();
            if (yes) {
                r->rank = (int)k;
                r->seen = accel_now_seconds();
                snprintf(r->from, sizeof r->from, "?");
            }
        }
        if (!yes) return ACCEL_OK;
        char key[32];
        void *from = NULL;
        snprintf(key, sizeof key, "refused/%d", r->rank);
        if (try_get(s, key, &found, &from, NULL) != ACCEL_OK) return accel_last_status();
        if (found) snprintf(r->from, sizeof r->from, "%s", (char *)from);
        accel_free(from);
    }
    if (now) return refused_error(r, world, what, ACCEL_ERR_TIMEOUT, " (timed out)");
    if (fail_fast && accel_now_seconds() - r->seen >= REFUSED_GRACE_S)
        return refused_error(r, world, what, ACCEL_ERR_DIST, "");
    return ACCEL_OK;
}

/* The store failed us while a refusal was pending (rank 0 gave up on it a
 * moment before this rank did, and exited): the refusal is the cause. */
static accel_status lost_after(const refusal *r, int world, const char *what) {
    if (r->rank < 0 || accel_last_status() != ACCEL_ERR_DIST || !strstr(accel_last_error(), "lost the connection"))
        return accel_last_status();
    return refused_error(r, world, what, ACCEL_ERR_DIST, " (and the store's rank 0 gave up on it)");
}

/* Fails the wait when a rank it still misses (at or above next, below world,
 * no "<prefix>/<rank>") is listed gone in lost (the store's "lost" list,
 * NULL when absent: note_gone). */
static accel_status check_gone(accel__store *s, const char *lost, const char *prefix, int next, int world,
                               const char *what) {
    int dead = -1;
    for (long k; dead < 0 && (k = next_listed(&lost, GONE)) >= 0;) {
        if (k < next || k >= world) continue;
        char key[STORE_MAX_KEY];
        bool arrived;
        snprintf(key, sizeof key, "%s/%ld", prefix, k);
        if (try_get(s, key, &arrived, NULL, NULL) != ACCEL_OK) return accel_last_status();
        if (!arrived) dead = (int)k;
    }
    if (dead < 0) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_DIST, "%s failed: rank %d of %d closed its store connection during rendezvous "
                           "(exited or was killed)", what, dead, world);
}

accel_status accel__store_wait_ranks(accel__store *s, const char *prefix, int world, const char *what) {
    double deadline = accel_now_seconds() + s->timeout_s, nap = 0.0002;
    int next = 0; /* ranks below `next` have arrived (keys are never deleted) */
    char key[STORE_MAX_KEY];
    refusal refused = {.rank = -1};
    bool fail_fast;
    if (accel__env_bool("ACCEL_DIST_REFUSED_FAIL_FAST", true, &fail_fast) != ACCEL_OK) return accel_last_status();
    for (;;) {
        while (next < world) {
            bool found;
            snprintf(key, sizeof key, "%s/%d", prefix, next);
            if (try_get(s, key, &found, NULL, NULL) != ACCEL_OK) return lost_after(&refused, world, what);
            if (!found) break;
            next++;
        }
        if (next == world) return ACCEL_OK;
        /* the refused, gone and aborted ranks: one request a poll */
        void *lost = NULL;
        bool listed;
        if (try_get(s, "lost", &listed, &lost, NULL) != ACCEL_OK) return accel_last_status();
        if (check_aborted(s, lost, what) != ACCEL_OK || check_gone(s, lost, prefix, next, world, what) != ACCEL_OK) {
            accel_free(lost);
            return accel_last_status();
        }
        bool late = accel_now_seconds() > deadline;
        accel_status st = check_refused(s, &refused, lost, prefix, next, world, what, fail_fast, late);
        accel_free(lost);
        if (st != ACCEL_OK) return lost_after(&refused, world, what);
        if (late) {
            char list[512];
            size_t o = 0;
            int missing = 0;
            for (int k = next; k < world; k++) {
                bool found;
                snprintf(key, sizeof key, "%s/%d", prefix, k);
                if (try_get(s, key, &found, NULL, NULL) != ACCEL_OK) return accel_last_status();
                if (found) continue;
                if (o < sizeof list - 16)
                    o += (size_t)snprintf(list + o, sizeof list - o, "%s%d", missing ? ", " : "", k);
                missing++;
            }
            return accel_set_error(ACCEL_ERR_TIMEOUT, "%s timed out after %g s: rank%s %s of %d did not arrive",
                                   what, s->timeout_s, missing > 1 ? "s" : "", list, world);
        }
        sleep_s(nap);
        if (nap < 0.02) nap *= 1.5;
    }
}
