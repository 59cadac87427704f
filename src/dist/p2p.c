/* src/dist/p2p.c — point-to-point send and receive (accel/dist.h).
 *
 * The entry points check the peers and buffers, describe the call (its
 * records travel with the data: a receiver compares the sender's record with
 * its own before it takes a byte), and hand both directions to the backend's
 * p2p slot at once (backend.h), which shm, tcp, hier and mpi implement. The
 * call stays out of the group's collective records (pg->site.seq, the
 * backends' epochs and sequence numbers): only two ranks take part, and the
 * other ranks' next collective must still line up with theirs. */
#include <string.h>

#include "core/prepared.h"
#include "dist/backend.h"

bool accel__p2p_matches(const accel__site *sent, const accel__site *expected) {
    return sent->kind == ACCEL__SITE_SEND && sent->dtype == expected->dtype && sent->count == expected->count;
}

void accel__p2p_describe(const accel__site *s, char *out, size_t n) {
    bool send = s->kind == ACCEL__SITE_SEND;
    const char *dt = s->dtype < ACCEL_DTYPE_COUNT ? accel__dtype_short((accel_dtype)s->dtype) : "?";
    int o = snprintf(out, n, "%s(%s, %llu) %s rank %u", send ? "send" : "recv", dt, (unsigned long long)s->count,
                     send ? "to" : "from", s->seq);
    if (s->line > 0 && o > 0 && (size_t)o < n)
        snprintf(out + o, n - (size_t)o, " at %.*s:%d", (int)strnlen(s->file, sizeof s->file - 1), s->file,
                 (int)s->line);
}

accel_status accel__p2p_mismatch(const accel_pg *pg, const accel__site *sent, const accel__site *expected) {
    char mine[128], theirs[128];
    accel__p2p_describe(expected, mine, sizeof mine);
    accel__site_describe(sent, theirs, sizeof theirs);
    bool p2p = sent->kind == ACCEL__SITE_SEND;
    return accel_set_error(ACCEL_ERR_DIST, "accel dist: mismatched point-to-point (seen by rank %d): rank %d's %s got "
                           "rank %u's %s%s (a receive's count and dtype must be the send's, and both ranks must "
                           "make their sends and receives in the same order)", pg->rank, pg->rank, mine,
                           expected->seq, p2p ? "" : "collective ", theirs);
}

/* The record of one side of the call: the caller's site, the peer in seq. */
static accel__site record(int kind, accel_dtype dt, size_t count, int peer) {
    accel__site s;
    memset(&s, 0, sizeof s);
    s.kind = (uint8_t)kind;
    s.dtype = (uint8_t)dt;
    s.count = count;
    s.seq = (uint32_t)peer;
    const char *file;
    int line;
    accel__site_of_caller(&file, &line);
    if (file) {
        const char *slash = strrchr(file, '/'), *f = slash ? slash + 1 : file;
        size_t len = strlen(f), keep = len < sizeof s.file - 1 ? len : sizeof s.file - 1;
        memcpy(s.file, f + len - keep, keep);
        s.line = line;
    }
    return s;
}

/* A peer of -1 is "none" where optional (send_recv), and absent where the call has no such side. */
static accel_status check_peer(const accel_pg *pg, int peer, bool optional, const char *what, const char *fn) {
    if (peer == -1 && optional) return ACCEL_OK;
    if (peer < 0 || peer >= pg->size)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s %d is not a rank of this group of %d%s", fn, what, peer,
                               pg->size, optional ? " (-1: none)" : "");
    if (peer == pg->rank)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s %d is this rank itself (a rank sends only to another "
                               "rank of the group)", fn, what, peer);
    return ACCEL_OK;
}

static accel_status p2p(accel_pg *pg, const void *send, size_t send_count, int dst, void *recv, size_t recv_count,
                        int src, accel_dtype dt, int absent, const char *fn) {
    if (!pg) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: process group is NULL", fn);
    if ((unsigned)dt >= ACCEL_DTYPE_COUNT)
        return accel_set_error(ACCEL_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dt);
    if (send_count > ((size_t)1 << 40) || recv_count > ((size_t)1 << 40))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: count %zu is too large", fn,
                               send_count > recv_count ? send_count : recv_count);
    /* absent: 'r' (send: no source), 's' (recv: no destination), 0 (send_recv: either may be -1) */
    if ((absent != 's' && check_peer(pg, dst, absent == 0, "destination", fn) != ACCEL_OK) ||
        (absent != 'r' && check_peer(pg, src, absent == 0, "source", fn) != ACCEL_OK))
        return accel_last_status();
    if ((dst >= 0 && send_count && !send) || (src >= 0 && recv_count && !recv))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: buffer is NULL", fn);
    if (!pg->be->p2p)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: the %s backend has no point-to-point (shm, tcp and mpi "
                               "have: ACCEL_DIST_BACKEND selects one)", fn, pg->be->name);
    if (accel__pg_p2p_enter(pg) != ACCEL_OK) return accel_last_status();
    size_t es = accel_dtype_size(dt);
    accel__p2p_msg tx = {.peer = dst, .buf = (char *)send, .bytes = send_count * es,
                         .site = record(ACCEL__SITE_SEND, dt, send_count, dst)};
    accel__p2p_msg rx = {.peer = src, .buf = recv, .bytes = recv_count * es,
                         .site = record(ACCEL__SITE_RECV, dt, recv_count, src)};
    char a[sizeof pg->op_desc / 2 - 2] = "", b[sizeof pg->op_desc / 2 - 2] = "";
    if (dst >= 0) accel__p2p_describe(&tx.site, a, sizeof a);
    if (src >= 0) accel__p2p_describe(&rx.site, b, sizeof b);
    snprintf(pg->op_desc, sizeof pg->op_desc, "%s%s%s", a, *a && *b ? " + " : "", b);
    accel_status st = dst < 0 && src < 0 ? ACCEL_OK : pg->be->p2p(pg, &tx, &rx);
    if (st == ACCEL_OK && src >= 0) accel__storage_written(recv, rx.bytes); /* it may be a parameter's */
    return accel__pg_p2p_leave(pg, st);
}

accel_status accel_pg_send(accel_pg *pg, const void *buf, size_t count, accel_dtype dt, int dst) {
    return p2p(pg, buf, count, dst, NULL, 0, -1, dt, 'r', "accel_pg_send");
}

accel_status accel_pg_recv(accel_pg *pg, void *buf, size_t count, accel_dtype dt, int src) {
    return p2p(pg, NULL, 0, -1, buf, count, src, dt, 's', "accel_pg_recv");
}

accel_status accel_pg_send_recv(accel_pg *pg, const void *send, size_t send_count, int dst, void *recv,
                                size_t recv_count, int src, accel_dtype dt) {
    return p2p(pg, send, send_count, dst, recv, recv_count, src, dt, 0, "accel_pg_send_recv");
}
