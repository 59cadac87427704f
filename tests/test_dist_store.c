/* The rendezvous store (src/dist/store.c) under a large job and a hostile
 * client, on loopback:
 *   - 65,536 keys (the store's limit) set and read back, each its own
 *     value, an overwrite at the limit kept, one key more refused (the
 *     connection dropped) and the store serving on (the keys were found by
 *     a scan of every key: quadratic, 17 s for these);
 *   - a client that sends GETs of a large value and never reads the replies:
 *     the store stops reading its requests (its sends block) instead of
 *     queueing every reply (rank 0's memory grew by the value per request),
 *     and serves another client meanwhile. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "dist/auth.h"
#include "dist/store.h"

#define SECRET "store-secret"

static void test_many_keys(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 30);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    int port = accel__store_port(server);
    accel__store *c = accel__store_open("127.0.0.1", port, false, SECRET, 1, 30);
    CHECK(c != NULL);
    char key[64], val[64];
    int n = 0;
    for (; c && n < 65536; n++) {
        snprintf(key, sizeof key, "rank/%d/addr", n);
        snprintf(val, sizeof val, "10.0.%d.%d:%d", n >> 8, n & 255, 29500 + n);
        if (accel__store_set(c, key, val, strlen(val) + 1) != ACCEL_OK) break;
    }
    CHECK_MSG(n == 65536, "set stopped at key %d: %s", n, accel_last_error());
    CHECK(accel__store_set(c, "rank/7/addr", "moved", 6) == ACCEL_OK); /* an overwrite at the limit */
    int bad = 0;
    for (int i = 0; c && i < 65536; i++) {
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "rank/%d/addr", i);
        snprintf(val, sizeof val, i == 7 ? "moved" : "10.0.%d.%d:%d", i >> 8, i & 255, 29500 + i);
        if (accel__store_get(c, key, &v, &len) != ACCEL_OK || len != strlen(val) + 1 || memcmp(v, val, len)) bad++;
        free(v);
    }
    CHECK_MSG(bad == 0, "%d keys read back wrong", bad);
    CHECK(c && accel__store_set(c, "one/too/many", "x", 2) != ACCEL_OK);
    accel_clear_error();
    accel__store_close(c);
    c = accel__store_open("127.0.0.1", port, false, SECRET, 1, 30);
    void *v = NULL;
    size_t len = 0;
    CHECK(c && accel__store_get(c, "rank/65535/addr", &v, &len) == ACCEL_OK && v && !strcmp(v, "10.0.255.255:95035"));
    free(v);
    accel__store_close(c);
    accel__store_close(server);
}

/* A connection of this test's own making, authenticated as rank 1. */
static int raw_client(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t challenge[ACCEL__CHALLENGE_LEN], nc[ACCEL__NONCE_LEN] = {9}, answer[1 + ACCEL__MAC_LEN];
    uint8_t hello[4 + 4 + ACCEL__NONCE_LEN + ACCEL__MAC_LEN];
    int32_t rank = 1;
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
              recv(fd, challenge, sizeof challenge, MSG_WAITALL) == (ssize_t)sizeof challenge;
    memcpy(hello, "ACS2", 4);
    memcpy(hello + 4, &rank, 4);
    memcpy(hello + 8, nc, sizeof nc);
    accel__auth_mac(SECRET, "accel store client", challenge + 4, nc, &rank, 4, hello + 8 + ACCEL__NONCE_LEN);
    ok = ok && send(fd, hello, sizeof hello, MSG_NOSIGNAL) == (ssize_t)sizeof hello &&
         recv(fd, answer, sizeof answer, MSG_WAITALL) == (ssize_t)sizeof answer && answer[0] == 1;
    if (!ok && fd >= 0) close(fd);
    return ok ? fd : -1;
}

static void test_flood_unread(void) {
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 30);
    CHECK_MSG(server, "store: %s", accel_last_error());
    if (!server) return;
    int port = accel__store_port(server);
    accel__store *c = accel__store_open("127.0.0.1", port, false, SECRET, 2, 30);
    static char big[1024];
    memset(big, 'v', sizeof big);
    char key[257];
    memset(key, 'k', 256);
    key[256] = 0;
    CHECK(c && accel__store_set(c, key, big, sizeof big) == ACCEL_OK);
    int fd = raw_client(port);
    CHECK(fd >= 0);
    char req[13 + 256];
    uint8_t op = 2; /* GET */
    uint32_t klen = 256;
    uint64_t vlen = 0;
    memcpy(req, &op, 1);
    memcpy(req + 1, &klen, 4);
    memcpy(req + 5, key, 256);
    memcpy(req + 261, &vlen, 8);
    /* Each send waits up to 1 s for room: the store stopped reading once one does not fit. */
    struct timeval tv = {1, 0};
    CHECK(fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0);
    long sent = 0, cap = 200000; /* 200 MB of replies, were they all queued */
    while (fd >= 0 && sent < cap && send(fd, req, sizeof req, MSG_NOSIGNAL) == (ssize_t)sizeof req) sent++;
    CHECK_MSG(sent < cap, "the store read %ld GETs of a client that reads no reply", sent);
    void *v = NULL;
    size_t len = 0;
    CHECK(c && accel__store_set(c, "other", "ok", 3) == ACCEL_OK && accel__store_get(c, "other", &v, &len) == ACCEL_OK &&
          len == 3);
    free(v);
    if (fd >= 0) close(fd);
    accel__store_close(c);
    accel__store_close(server);
}

int main(void) {
    RUN(test_many_keys);
    RUN(test_flood_unread);
    return check_summary();
}
