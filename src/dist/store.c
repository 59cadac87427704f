/* src/dist/store.c — TCP key/value store for rendezvous.
 *
 * Wire format (little-endian host order; both ends are this code on one
 * architecture):
 *   hello:    "ACS1" u32 secret_len, secret          -> u8 1 (or the server closes)
 *   request:  u8 op, u32 klen, key, u64 vlen, value
 *   replies:  SET -> u8 0; CHECK/GET -> u8 found [, u64 vlen, value]; ADD -> i64 new value
 * Waiting is done by the client (poll CHECK with a growing sleep), so the
 * server never holds a request open and a client timeout never leaves a
 * half-read reply on the connection. Accepted sockets have a 2 s receive
 * timeout: a stray peer that stalls mid-message is dropped, not waited for. */
#include "dist/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3 };
#define STORE_MAX_KEY 256
#define STORE_MAX_VAL (16u << 20)
#define STORE_MAX_CLIENTS 1024

typedef struct kv {
    char *key;
    void *val;
    size_t len;
} kv;

struct accel__store {
    int fd;                 /* client connection */
    double timeout_s;
    /* server side (rank 0 only) */
    bool serving;
    int listen_fd;
    int wake[2];            /* close/write to stop the server thread */
    pthread_t thread;
    char *secret;
    kv *items;
    size_t n_items, cap_items;
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

static kv *find_kv(accel__store *s, const char *key) {
    for (size_t i = 0; i < s->n_items; i++)
        if (strcmp(s->items[i].key, key) == 0) return &s->items[i];
    return NULL;
}

static bool put_kv(accel__store *s, const char *key, void *val, size_t len) {
    kv *e = find_kv(s, key);
    if (e) {
        free(e->val);
        e->val = val;
        e->len = len;
        return true;
    }
    if (s->n_items == s->cap_items) {
        size_t cap = s->cap_items ? s->cap_items * 2 : 64;
        kv *n = realloc(s->items, cap * sizeof *n);
        if (!n) return false;
        s->items = n;
        s->cap_items = cap;
    }
    char *k = strdup(key);
    if (!k) return false;
    s->items[s->n_items++] = (kv){k, val, len};
    return true;
}

static bool serve_hello(accel__store *s, int fd) {
    char magic[4];
    uint32_t slen;
    if (!read_all(fd, magic, 4) || memcmp(magic, "ACS1", 4) != 0) return false;
    if (!read_all(fd, &slen, 4) || slen > 1024) return false;
    char buf[1025];
    if (!read_all(fd, buf, slen)) return false;
    buf[slen] = 0;
    if (slen != strlen(s->secret) || memcmp(buf, s->secret, slen) != 0) return false;
    uint8_t ok = 1;
    return write_all(fd, &ok, 1);
}

/* One request from fd; false drops the connection. */
static bool serve_request(accel__store *s, int fd) {
    uint8_t op;
    uint32_t klen;
    uint64_t vlen;
    char key[STORE_MAX_KEY + 1];
    if (!read_all(fd, &op, 1) || !read_all(fd, &klen, 4) || klen > STORE_MAX_KEY) return false;
    if (!read_all(fd, key, klen)) return false;
    key[klen] = 0;
    if (!read_all(fd, &vlen, 8) || vlen > STORE_MAX_VAL) return false;
    void *val = malloc(vlen ? vlen : 1);
    if (!val) return false;
    if (!read_all(fd, val, vlen)) { free(val); return false; }
    if (op == OP_SET) {
        uint8_t z = 0;
        if (!put_kv(s, key, val, vlen)) { free(val); return false; }
        return write_all(fd, &z, 1);
    }
    if (op == OP_GET) {
        free(val);
        kv *e = find_kv(s, key);
        uint8_t found = e != NULL;
        if (!write_all(fd, &found, 1)) return false;
        if (!e) return true;
        uint64_t n = e->len;
        return write_all(fd, &n, 8) && write_all(fd, e->val, e->len);
    }
    if (op == OP_ADD && vlen == 8) {
        int64_t delta, cur = 0;
        memcpy(&delta, val, 8);
        free(val);
        kv *e = find_kv(s, key);
        if (e && e->len == 8) memcpy(&cur, e->val, 8);
        cur += delta;
        int64_t *nv = malloc(8);
        if (!nv) return false;
        *nv = cur;
        if (!put_kv(s, key, nv, 8)) { free(nv); return false; }
        return write_all(fd, &cur, 8);
    }
    free(val);
    return false;
}

static void *server_main(void *arg) {
    accel__store *s = arg;
    struct pollfd *pf = calloc(STORE_MAX_CLIENTS + 2, sizeof *pf);
    bool *authed = calloc(STORE_MAX_CLIENTS + 2, sizeof *authed);
    if (!pf || !authed) { free(pf); free(authed); return NULL; }
    size_t n = 2;
    pf[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    pf[1] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
    for (;;) {
        if (poll(pf, n, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break;
        if ((pf[1].revents & POLLIN) && n < STORE_MAX_CLIENTS + 2) {
            int c = accept(s->listen_fd, NULL, NULL);
            if (c >= 0) {
                struct timeval tv = {2, 0};
                setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                int one = 1;
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                pf[n] = (struct pollfd){.fd = c, .events = POLLIN};
                authed[n] = false;
                n++;
            }
        }
        for (size_t i = 2; i < n; i++) {
            if (!pf[i].revents) continue;
            bool ok = (pf[i].revents & POLLIN) &&
                      (authed[i] ? serve_request(s, pf[i].fd) : serve_hello(s, pf[i].fd));
            if (ok) {
                authed[i] = true;
                continue;
            }
            close(pf[i].fd);
            pf[i] = pf[n - 1];
            authed[i] = authed[n - 1];
            n--;
            i--;
        }
    }
    for (size_t i = 2; i < n; i++) close(pf[i].fd);
    free(pf);
    free(authed);
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
    s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s->listen_fd < 0 || bind(s->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(s->listen_fd, 128) != 0)
        return accel_set_error(ACCEL_ERR_DIST,
                               "accel_dist_init: rank 0 cannot listen on %s:%d (%s); is another "
                               "job using MASTER_PORT=%d? (accel launch --main_process_port 0 picks a free port)",
                               addr, port, strerror(errno), port);
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

static accel_status connect_client(accel__store *s, const char *addr, int port, const char *secret) {
    struct sockaddr_in sa;
    if (!resolve(addr, port, &sa))
        return accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: cannot resolve MASTER_ADDR '%s'", addr);
    double deadline = accel_now_seconds() + s->timeout_s, nap = 0.001;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            struct timeval tv = {(time_t)s->timeout_s + 1, 0};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            uint32_t slen = (uint32_t)strlen(secret);
            uint8_t ok = 0;
            if (write_all(fd, "ACS1", 4) && write_all(fd, &slen, 4) && write_all(fd, secret, slen) &&
                read_all(fd, &ok, 1) && ok == 1) {
                s->fd = fd;
                return ACCEL_OK;
            }
            close(fd);
            return accel_set_error(ACCEL_ERR_DIST,
                                   "accel_dist_init: the store at %s:%d refused this process: "
                                   "ACCEL_JOB_SECRET does not match (another job on that port?)",
                                   addr, port);
        }
        if (fd >= 0) close(fd);
        if (accel_now_seconds() > deadline)
            return accel_set_error(ACCEL_ERR_TIMEOUT,
                                   "accel_dist_init: rendezvous timed out after %g s: cannot connect "
                                   "to rank 0 at %s:%d (MASTER_ADDR/MASTER_PORT)",
                                   s->timeout_s, addr, port);
        sleep_s(nap);
        if (nap < 0.05) nap *= 2;
    }
}

accel__store *accel__store_open(const char *addr, int port, bool serve, const char *secret,
                                double timeout_s) {
    accel__store *s = calloc(1, sizeof *s);
    if (!s) { accel_set_error(ACCEL_ERR_OOM, "accel_dist_init: out of memory"); return NULL; }
    s->fd = s->listen_fd = s->wake[0] = s->wake[1] = -1;
    s->timeout_s = timeout_s;
    s->secret = strdup(secret ? secret : "");
    if (!s->secret || (serve && start_server(s, addr, port) != ACCEL_OK) ||
        connect_client(s, addr, port, s->secret) != ACCEL_OK) {
        accel__store_close(s);
        return NULL;
    }
    return s;
}

void accel__store_close(accel__store *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    if (s->serving) {
        if (write(s->wake[1], "x", 1) != 1) { /* the thread also stops when the pipe closes */ }
        pthread_join(s->thread, NULL);
    }
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    if (s->listen_fd >= 0) close(s->listen_fd);
    for (size_t i = 0; i < s->n_items; i++) {
        free(s->items[i].key);
        free(s->items[i].val);
    }
    free(s->items);
    free(s->secret);
    free(s);
}

static accel_status request(accel__store *s, uint8_t op, const char *key, const void *val, size_t len) {
    uint32_t klen = (uint32_t)strlen(key);
    uint64_t vlen = len;
    if (klen > STORE_MAX_KEY || len > STORE_MAX_VAL)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel store: key or value too large ('%s')", key);
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
    char *v = malloc(n + 1);
    if (!v) return accel_set_error(ACCEL_ERR_OOM, "accel store: out of memory");
    if (!read_all(s->fd, v, n)) { free(v); return lost(); }
    v[n] = 0;
    if (val) *val = v; else free(v);
    if (len) *len = n;
    return ACCEL_OK;
}

accel_status accel__store_get(accel__store *s, const char *key, void **val, size_t *len) {
    double deadline = accel_now_seconds() + s->timeout_s, nap = 0.0002;
    for (;;) {
        bool found;
        if (try_get(s, key, &found, val, len) != ACCEL_OK) return accel_last_status();
        if (found) return ACCEL_OK;
        if (accel_now_seconds() > deadline)
            return accel_set_error(ACCEL_ERR_TIMEOUT, "accel store: timed out after %g s waiting for key '%s'",
                                   s->timeout_s, key);
        sleep_s(nap);
        if (nap < 0.02) nap *= 1.5;
    }
}

accel_status accel__store_wait_ranks(accel__store *s, const char *prefix, int world, const char *what) {
    double deadline = accel_now_seconds() + s->timeout_s, nap = 0.0002;
    int next = 0; /* ranks below `next` have arrived (keys are never deleted) */
    char key[STORE_MAX_KEY];
    for (;;) {
        while (next < world) {
            bool found;
            snprintf(key, sizeof key, "%s/%d", prefix, next);
            if (try_get(s, key, &found, NULL, NULL) != ACCEL_OK) return accel_last_status();
            if (!found) break;
            next++;
        }
        if (next == world) return ACCEL_OK;
        if (accel_now_seconds() > deadline) {
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
