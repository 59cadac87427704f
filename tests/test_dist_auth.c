/* The job secret's challenge-response (src/dist/auth.c, the store's handshake):
 *   - HMAC-SHA256 against RFC 4231's test vectors (split into parts, as the
 *     handshakes feed it);
 *   - a genuine client's session with the store, captured by a relay in
 *     between: the secret is nowhere in it, and replaying the captured bytes
 *     on a new connection is refused without revealing or changing a key
 *     (the hello carried the secret in clear: a replay could GET/SET any key);
 *   - the old hello that carried the secret in clear is refused too;
 *   - strangers sending nothing, garbage or huge lengths are dropped and the
 *     store keeps serving genuine clients;
 *   - a client with another secret is refused, and the store records the rank
 *     it claimed: a wait for that rank (or one stuck on a lower rank that
 *     never connected) fails naming it, unless the genuine rank arrives
 *     within the grace (a process of another job on our port must not fail
 *     this one) or has claimed its number (however late it then is);
 *     ACCEL_DIST_REFUSED_FAIL_FAST=0 names it only at the timeout;
 *   - "lost" and "refused/<rank>" are written by the store alone;
 *   - a "store" that cannot prove the secret back is refused by the client.
 * Loopback only. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "dist/auth.h"
#include "dist/store.h"

#define SECRET "the-job-secret-42"

/* ---------------------------------------------------------------- HMAC-SHA256 */

static void hex(const uint8_t *p, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

/* RFC 4231 test cases 1, 2, 6 and 7 (6 and 7: a key longer than the block). */
static void test_hmac_rfc4231(void) {
    uint8_t key20[20], key131[131], mac[ACCEL__MAC_LEN];
    char got[2 * ACCEL__MAC_LEN + 1];
    memset(key20, 0x0b, sizeof key20);
    memset(key131, 0xaa, sizeof key131);
    const char *m1 = "Hi There", *m2 = "what do ya want for nothing?",
               *m6 = "Test Using Larger Than Block-Size Key - Hash Key First",
               *m7 = "This is a test using a larger than block-size key and a larger than block-size data. The key "
                     "needs to be hashed before being used by the HMAC algorithm.";
    struct {
        const void *key;
        size_t klen;
        const char *msg, *want;
    } v[] = {
        {key20, 20, m1, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", 4, m2, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {key131, 131, m6, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {key131, 131, m7, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        size_t n = strlen(v[i].msg), cut = n / 3;
        const void *parts[] = {v[i].msg, v[i].msg + cut, ""};
        const size_t lens[] = {cut, n - cut, 0};
        accel__hmac_sha256(v[i].key, v[i].klen, parts, lens, 3, mac);
        hex(mac, sizeof mac, got);
        CHECK_MSG(!strcmp(got, v[i].want), "RFC 4231 vector %zu: %s", i, got);
    }
    /* the protocol's MAC: the label's zero separates it; each input matters */
    uint8_t a[ACCEL__NONCE_LEN] = {1}, b[ACCEL__NONCE_LEN] = {2}, m[ACCEL__MAC_LEN], m2x[ACCEL__MAC_LEN];
    accel__auth_mac(SECRET, "label", a, b, "x", 1, m);
    accel__auth_mac(SECRET, "label", b, a, "x", 1, m2x);
    CHECK(!accel__auth_mac_equal(m, m2x));
    accel__auth_mac("other", "label", a, b, "x", 1, m2x);
    CHECK(!accel__auth_mac_equal(m, m2x));
    accel__auth_mac(SECRET, "labe", a, b, "x", 1, m2x);
    CHECK(!accel__auth_mac_equal(m, m2x));
    accel__auth_mac(SECRET, "label", a, b, "x", 1, m2x);
    CHECK(accel__auth_mac_equal(m, m2x));
    uint8_t n1[ACCEL__NONCE_LEN], n2[ACCEL__NONCE_LEN];
    CHECK(accel__auth_nonce(n1) && accel__auth_nonce(n2) && memcmp(n1, n2, sizeof n1) != 0);
}

/* ---------------------------------------------------------------- sockets */

static int listen_loopback(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 8) || getsockname(fd, (struct sockaddr *)&sa, &l)) {
        close(fd);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

static int connect_loopback(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {5, 0}; /* every read of this test is bounded */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Everything the peer sends until it closes (or 5 s of silence); *closed
 * tells whether it closed. */
static size_t read_until_closed(int fd, char *buf, size_t cap, bool *closed) {
    size_t n = 0;
    *closed = false;
    for (;;) {
        ssize_t r = recv(fd, buf + n, cap - n, 0);
        if (r > 0 && (n += (size_t)r) < cap) continue;
        *closed = r == 0 || (r < 0 && errno == ECONNRESET); /* closed with our bytes unread: a reset */
        return n;
    }
}

static bool contains(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(hay + i, needle, k)) return true;
    return false;
}

/* ---------------------------------------------------------------- a relay that records */

typedef struct relay {
    int listen_fd, upstream_port;
    char up[8192], down[8192]; /* client -> store, store -> client */
    size_t n_up, n_down;
} relay;

/* Relays one connection until either side closes, recording both directions. */
static void *relay_main(void *arg) {
    relay *r = arg;
    int c = accept(r->listen_fd, NULL, NULL), s = connect_loopback(r->upstream_port);
    struct pollfd pf[2] = {{.fd = c, .events = POLLIN}, {.fd = s, .events = POLLIN}};
    while (c >= 0 && s >= 0 && poll(pf, 2, 10000) > 0) {
        char buf[4096];
        int from = pf[0].revents ? 0 : 1;
        ssize_t n = recv(pf[from].fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        char *log = from == 0 ? r->up : r->down;
        size_t *len = from == 0 ? &r->n_up : &r->n_down;
        size_t keep = (size_t)n < sizeof r->up - *len ? (size_t)n : sizeof r->up - *len;
        memcpy(log + *len, buf, keep);
        *len += keep;
        if (send(pf[1 - from].fd, buf, (size_t)n, MSG_NOSIGNAL) != n) break;
    }
    if (c >= 0) close(c);
    if (s >= 0) close(s);
    return NULL;
}

/* A GET in the store's request format (what a replay appends to ask for a key). */
static size_t get_request(const char *key, char *out) {
    uint8_t op = 2;
    uint32_t klen = (uint32_t)strlen(key);
    uint64_t vlen = 0;
    memcpy(out, &op, 1);
    memcpy(out + 1, &klen, 4);
    memcpy(out + 5, key, klen);
    memcpy(out + 5 + klen, &vlen, 8);
    return 13 + klen;
}

static void test_captured_session_is_useless(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 10);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    static relay r;
    memset(&r, 0, sizeof r);
    r.upstream_port = accel__store_port(server);
    int relay_port = 0;
    r.listen_fd = listen_loopback(&relay_port);
    pthread_t t;
    pthread_create(&t, NULL, relay_main, &r);
    accel__store *client = accel__store_open("127.0.0.1", relay_port, false, SECRET, 1, 10);
    CHECK_MSG(client, "client through the relay: %s", accel_last_error());
    const char *value = "value-only-the-job-may-read";
    CHECK(client && accel__store_set(client, "private", value, strlen(value) + 1) == ACCEL_OK);
    accel__store_close(client);
    pthread_join(t, NULL);
    close(r.listen_fd);
    CHECK_MSG(r.n_up > 0 && r.n_down > 0, "the relay saw %zu and %zu bytes", r.n_up, r.n_down);
    CHECK_MSG(!contains(r.up, r.n_up, SECRET) && !contains(r.down, r.n_down, SECRET),
              "the job secret crossed the network in clear");

    /* The replay: the captured client bytes on a new connection, then a GET. */
    char replay[8192 + 512];
    memcpy(replay, r.up, r.n_up);
    size_t n = r.n_up + get_request("private", replay + r.n_up);
    int fd = connect_loopback(accel__store_port(server));
    CHECK(fd >= 0 && send(fd, replay, n, MSG_NOSIGNAL) == (ssize_t)n);
    char got[8192];
    bool closed;
    size_t m = read_until_closed(fd, got, sizeof got, &closed);
    close(fd);
    CHECK_MSG(!contains(got, m, value), "the replayed session read the key");
    CHECK_MSG(closed, "the store kept the replayed connection open");

    /* Nothing the replay sent was taken: the value is the genuine one. */
    accel__store *again = accel__store_open("127.0.0.1", accel__store_port(server), false, SECRET, 1, 10);
    void *v = NULL;
    CHECK(again && accel__store_get(again, "private", &v, NULL) == ACCEL_OK && v && !strcmp(v, value));
    free(v);
    accel__store_close(again);
    accel__store_close(server);
}

/* ---------------------------------------------------------------- strangers and old clients */

static void stranger_sends(int port, const void *p, size_t n, bool *closed) {
    int fd = connect_loopback(port);
    char got[4096];
    CHECK(fd >= 0);
    if (fd < 0) return;
    if (n) send(fd, p, n, MSG_NOSIGNAL);
    size_t m = read_until_closed(fd, got, sizeof got, closed);
    CHECK_MSG(m <= 20, "a stranger got %zu bytes (the challenge is 20)", m);
    close(fd);
}

static void test_strangers_are_refused(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 10);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    int port = accel__store_port(server);
    bool closed;

    /* The old hello: magic, length, the secret itself (what a sniffer had). */
    char old[64] = "ACS1";
    uint32_t len = (uint32_t)strlen(SECRET);
    memcpy(old + 4, &len, 4);
    memcpy(old + 8, SECRET, len);
    size_t n = 8 + len + get_request("world", old + 8 + len);
    stranger_sends(port, old, n, &closed);
    CHECK_MSG(closed, "the old clear-secret hello was not dropped");

    /* Garbage, a huge length in each layout, and silence (dropped after 2 s). */
    char garbage[4096];
    for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (char)(i * 131 + 7);
    stranger_sends(port, garbage, sizeof garbage, &closed);
    CHECK(closed);
    char huge[64] = "ACS1\xff\xff\xff\xff";
    stranger_sends(port, huge, 8, &closed);
    CHECK(closed);
    memcpy(huge, "ACS2\xff\xff\xff\x7f", 8); /* a hello claiming rank 2^31-1, cut short */
    stranger_sends(port, huge, 8, &closed);
    CHECK(closed);
    stranger_sends(port, NULL, 0, &closed);
    CHECK_MSG(closed, "a silent stranger was never dropped");

    /* Another job's secret: refused by name, and the claimed rank recorded. */
    accel__store *wrong = accel__store_open("127.0.0.1", port, false, "another-secret", 3, 5);
    CHECK(!wrong && strstr(accel_last_error(), "ACCEL_JOB_SECRET does not match"));
    accel_clear_error();

    /* The store still serves the job, and names the refused rank to its waiters. */
    accel__store *client = accel__store_open("127.0.0.1", port, false, SECRET, 1, 5);
    CHECK_MSG(client, "a genuine client after the strangers: %s", accel_last_error());
    void *v = NULL;
    CHECK(client && accel__store_get(client, "refused/3", &v, NULL) == ACCEL_OK && v && strstr(v, "127.0.0.1:"));
    free(v);
    for (int k = 0; client && k < 3; k++) {
        char key[16];
        snprintf(key, sizeof key, "k/%d", k);
        CHECK(accel__store_set(client, key, "x", 1) == ACCEL_OK);
    }
    CHECK(client && accel__store_wait_ranks(client, "k", 4, "rendezvous") == ACCEL_ERR_DIST);
    CHECK_MSG(strstr(accel_last_error(), "rank 3 of 4 did not arrive") &&
              strstr(accel_last_error(), "wrong job secret"), "%s", accel_last_error());
    accel_clear_error();
    accel__store_close(client);
    accel__store_close(server);
}

/* A store with room for the refused rank's entry in the "lost" list ("r3 ")
 * but not for the address key: the rank is listed all the same (the list
 * comes first). */
static void test_refused_listed_when_store_full(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 10);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    int port = accel__store_port(server);
    accel__store *client = accel__store_open("127.0.0.1", port, false, SECRET, 1, 5);
    static char big[16u << 20];
    memset(big, 'x', sizeof big);
    CHECK(client && accel__store_set(client, "slack", "abc", 4) == ACCEL_OK);
    /* fill to the last byte: a set that does not fit drops the connection */
    int k = 0;
    for (size_t sz = sizeof big; client && sz;) {
        char key[32];
        snprintf(key, sizeof key, "fill/%d", k++);
        if (accel__store_set(client, key, big, sz) == ACCEL_OK) continue;
        accel_clear_error();
        accel__store_close(client);
        client = accel__store_open("127.0.0.1", port, false, SECRET, 1, 5);
        sz /= 2;
    }
    CHECK(client && accel__store_set(client, "slack", "", 0) == ACCEL_OK); /* 4 bytes free */
    accel__store *wrong = accel__store_open("127.0.0.1", port, false, "another-secret", 3, 5);
    CHECK(!wrong && strstr(accel_last_error(), "ACCEL_JOB_SECRET does not match"));
    accel_clear_error();
    void *v = NULL;
    size_t len = 0;
    CHECK_MSG(client && accel__store_get(client, "lost", &v, &len) == ACCEL_OK && v && len == 4 &&
                  !memcmp(v, "r3 ", 4), "rank 3 not listed refused");
    free(v);
    accel__store_close(client);
    accel__store_close(server);
}

/* A client of this test's own making (the secret proven by hand, as rank
 * `rank`) SETs key to val: true when the store drops it for that, without
 * the reply a SET gets. */
static bool raw_set_dropped(int port, int32_t rank, const char *key, const char *val) {
    int fd = connect_loopback(port);
    uint8_t challenge[ACCEL__CHALLENGE_LEN], nc[ACCEL__NONCE_LEN] = {7}, hello[4 + 4 + ACCEL__NONCE_LEN + ACCEL__MAC_LEN];
    uint8_t answer[1 + ACCEL__MAC_LEN], reply;
    bool ok = fd >= 0 && recv(fd, challenge, sizeof challenge, MSG_WAITALL) == (ssize_t)sizeof challenge;
    memcpy(hello, "ACS2", 4);
    memcpy(hello + 4, &rank, 4);
    memcpy(hello + 8, nc, sizeof nc);
    accel__auth_mac(SECRET, "accel store client", challenge + 4, nc, &rank, 4, hello + 8 + ACCEL__NONCE_LEN);
    ok = ok && send(fd, hello, sizeof hello, MSG_NOSIGNAL) == (ssize_t)sizeof hello &&
         recv(fd, answer, sizeof answer, MSG_WAITALL) == (ssize_t)sizeof answer && answer[0] == 1;
    char req[512];
    uint8_t op = 1;
    uint32_t klen = (uint32_t)strlen(key);
    uint64_t vlen = strlen(val);
    memcpy(req, &op, 1);
    memcpy(req + 1, &klen, 4);
    memcpy(req + 5, key, klen);
    memcpy(req + 5 + klen, &vlen, 8);
    memcpy(req + 13 + klen, val, vlen);
    ok = ok && send(fd, req, 13 + klen + vlen, MSG_NOSIGNAL) == (ssize_t)(13 + klen + vlen);
    bool dropped = ok && recv(fd, &reply, 1, 0) <= 0;
    if (fd >= 0) close(fd);
    return dropped;
}

/* "lost" and "refused/<rank>" are the store's own records: a client's SET
 * or ADD of them is refused (by the client library naming the key; by the
 * store, from any other client, by dropping the connection), so the list the
 * store parses is always its own. A client-written "lost" (empty, or ranks
 * run together with no terminator) made the store's next refusal copy
 * SIZE_MAX bytes, and a gone rank's return rewrite it past its end. */
static void test_lost_list_is_the_stores(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 10);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    int port = accel__store_port(server);
    accel__store *client = accel__store_open("127.0.0.1", port, false, SECRET, 1, 5);
    CHECK(client != NULL);
    const char *forged[] = {"", "g5r1r1r1r1r1r1r1r1r1"};
    for (int i = 0; client && i < 2; i++) {
        CHECK(accel__store_set(client, "lost", forged[i], strlen(forged[i])) == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "'lost' is the store's own");
        accel_clear_error();
    }
    CHECK(client && accel__store_add(client, "refused/7", 1, NULL) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    /* a counter past INT64_MAX wraps (a signed overflow in the store: UBSan
     * aborted rank 0 in the sanitizer build), and the store serves on */
    int64_t sum = 0;
    CHECK(client && accel__store_add(client, "counter", INT64_MAX, &sum) == ACCEL_OK && sum == INT64_MAX);
    CHECK(client && accel__store_add(client, "counter", 2, &sum) == ACCEL_OK && sum == INT64_MIN + 1);
    /* the store refuses them from a client that does not check */
    for (int i = 0; i < 2; i++) CHECK_MSG(raw_set_dropped(port, 2, "lost", forged[i]), "forged list %d kept", i);
    /* what the store then parses: its list of the dropped rank 2 ("g2 "),
     * a refusal added, rank 2 back (taken off) */
    CHECK(accel__store_open("127.0.0.1", port, false, "another-secret", 3, 5) == NULL);
    accel_clear_error();
    accel__store *two = accel__store_open("127.0.0.1", port, false, SECRET, 2, 5);
    CHECK(two != NULL);
    void *v = NULL;
    size_t len = 0;
    CHECK_MSG(client && accel__store_get(client, "lost", &v, &len) == ACCEL_OK && v && len == 4 &&
                  !memcmp(v, "r3 ", 4), "lost: '%.*s'", (int)len, v ? (char *)v : "");
    free(v);
    accel__store_close(two);
    accel__store_close(client);
    accel__store_close(server);
}

/* A wrong-secret machine's ranks 2 and 3: only rank 3 reached the store (and
 * was refused) before its launcher killed rank 2, which never connects. The
 * wait, stuck on rank 2, must still fail on rank 3's refusal, not wait out
 * the timeout (it used to look only at the lowest missing rank). */
static void test_refused_rank_above_a_missing_one(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 60);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    int port = accel__store_port(server);
    CHECK(accel__store_open("127.0.0.1", port, false, "another-machine", 3, 5) == NULL);
    accel_clear_error();
    for (int k = 0; k < 2; k++) {
        char key[24]; /* "above/" and any int: gcc -O1 -fsanitize=address sees the whole range */
        snprintf(key, sizeof key, "above/%d", k);
        CHECK(accel__store_set(server, key, "x", 1) == ACCEL_OK);
    }
    CHECK(accel__store_wait_ranks(server, "above", 4, "rendezvous") == ACCEL_ERR_DIST);
    CHECK_MSG(strstr(accel_last_error(), "rank 3 of 4 did not arrive") &&
              strstr(accel_last_error(), "claiming rank 3: wrong job secret"), "%s", accel_last_error());
    accel_clear_error();
    accel__store_close(server);
}

/* The genuine rank 3 arrives a moment after another job's process claiming it was refused. */
static void *late_rank_main(void *arg) {
    int port = *(int *)arg;
    nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
    accel__store *c = accel__store_open("127.0.0.1", port, false, SECRET, 3, 5);
    if (c) accel__store_set(c, "late/3", "x", 1);
    accel__store_close(c);
    return NULL;
}

/* After another job's process claiming rank 3 was refused, ranks 0-2 publish
 * `prefix`/k and the genuine rank 3 runs `rank3` (a thread given the port):
 * the store's wait for all four must succeed. */
static void check_refused_then_genuine(const char *prefix, void *(*rank3)(void *)) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 10);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    int port = accel__store_port(server);
    CHECK(accel__store_open("127.0.0.1", port, false, "another-job", 3, 5) == NULL);
    accel_clear_error();
    for (int k = 0; k < 3; k++) {
        char key[16];
        snprintf(key, sizeof key, "%s/%d", prefix, k);
        CHECK(accel__store_set(server, key, "x", 1) == ACCEL_OK);
    }
    pthread_t t;
    pthread_create(&t, NULL, rank3, &port);
    CHECK_MSG(accel__store_wait_ranks(server, prefix, 4, "rendezvous") == ACCEL_OK, "%s", accel_last_error());
    pthread_join(t, NULL);
    accel__store_close(server);
}

static void test_refused_rank_that_arrives(void) { check_refused_then_genuine("late", late_rank_main); }

/* The genuine rank 3 claims its number at once but publishes its key more
 * than the grace after another job's process claiming rank 3 was refused: the
 * claim shows the refusal was of someone else, and the wait succeeds. */
static void *slow_rank_main(void *arg) {
    int port = *(int *)arg;
    accel__store *c = accel__store_open("127.0.0.1", port, false, SECRET, 3, 10);
    int64_t nth = 0;
    if (c) accel__store_add(c, "claims/3", 1, &nth);
    nanosleep(&(struct timespec){3, 0}, NULL);
    if (c) accel__store_set(c, "slow/3", "x", 1);
    accel__store_close(c);
    return NULL;
}

static void test_refused_rank_that_claims_then_is_slow(void) { check_refused_then_genuine("slow", slow_rank_main); }

/* ACCEL_DIST_REFUSED_FAIL_FAST=0: a refused stranger does not fail the wait
 * after the grace; the refusal is named when the wait times out. A bad value
 * is refused by name. */
static void test_refused_fail_fast_opt_out(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 3.5);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    int port = accel__store_port(server);
    CHECK(accel__store_open("127.0.0.1", port, false, "another-job", 1, 5) == NULL);
    accel_clear_error();
    setenv("ACCEL_DIST_REFUSED_FAIL_FAST", "maybe", 1);
    CHECK(accel__store_wait_ranks(server, "opt", 2, "rendezvous") == ACCEL_ERR_INVALID_ARG);
    CHECK_MSG(strstr(accel_last_error(), "ACCEL_DIST_REFUSED_FAIL_FAST"), "%s", accel_last_error());
    accel_clear_error();
    setenv("ACCEL_DIST_REFUSED_FAIL_FAST", "0", 1);
    CHECK(accel__store_set(server, "opt/0", "x", 1) == ACCEL_OK);
    CHECK(accel__store_wait_ranks(server, "opt", 2, "rendezvous") == ACCEL_ERR_TIMEOUT);
    CHECK_MSG(strstr(accel_last_error(), "timed out") && strstr(accel_last_error(), "rank 1 of 2 did not arrive") &&
              strstr(accel_last_error(), "wrong job secret"), "%s", accel_last_error());
    accel_clear_error();
    unsetenv("ACCEL_DIST_REFUSED_FAIL_FAST");
    accel__store_close(server);
}

/* ---------------------------------------------------------------- a store that cannot prove */

/* Answers the client's hello with "accepted" but a made-up proof. */
static void *fake_store_main(void *arg) {
    int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
    char challenge[20] = "ACS2", hello[56], answer[33] = {1};
    if (fd < 0) return NULL;
    send(fd, challenge, sizeof challenge, MSG_NOSIGNAL);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (recv(fd, hello, sizeof hello, MSG_WAITALL) == (ssize_t)sizeof hello) send(fd, answer, sizeof answer, MSG_NOSIGNAL);
    close(fd);
    return NULL;
}

static void test_client_refuses_unproven_store(void) {
    int port = 0, lfd = listen_loopback(&port);
    pthread_t t;
    pthread_create(&t, NULL, fake_store_main, &lfd);
    accel__store *c = accel__store_open("127.0.0.1", port, false, SECRET, 1, 5);
    pthread_join(t, NULL);
    close(lfd);
    CHECK(c == NULL);
    CHECK_MSG(strstr(accel_last_error(), "did not prove it knows ACCEL_JOB_SECRET"), "%s", accel_last_error());
    accel_clear_error();
    accel__store_close(c);
}

int main(void) {
    RUN(test_hmac_rfc4231);
    RUN(test_captured_session_is_useless);
    RUN(test_strangers_are_refused);
    RUN(test_refused_listed_when_store_full);
    RUN(test_lost_list_is_the_stores);
    RUN(test_refused_rank_above_a_missing_one);
    RUN(test_refused_rank_that_arrives);
    RUN(test_refused_rank_that_claims_then_is_slow);
    RUN(test_refused_fail_fast_opt_out);
    RUN(test_client_refuses_unproven_store);
    return check_summary();
}
