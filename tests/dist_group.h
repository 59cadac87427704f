/* tests/dist_group.h — forks a group of ranks on loopback for the dist tests.
 *
 * Each child gets the launcher's environment contract (RANK, WORLD_SIZE,
 * LOCAL_*, MASTER_ADDR=127.0.0.1, a free MASTER_PORT, ACCEL_JOB_SECRET) and
 * runs body(rank, world); its return value is its exit code. A group still
 * running after `kill_after_s` is SIGKILLed, so a hang is a failed check,
 * not a stuck ctest. dist_group_runs_ok runs a group whose ranks must all
 * exit 0 and names each that did not; dist_group_run gives the statuses to a
 * test that expects a rank to fail. */
#ifndef ACCEL_TESTS_DIST_GROUP_H
#define ACCEL_TESTS_DIST_GROUP_H

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "accel/core.h"

#define DIST_GROUP_MAX 8

typedef int (*dist_body_fn)(int rank, int world);

typedef struct dist_group {
    int world;
    bool one_machine;           /* LOCAL_WORLD_SIZE = world (shm) rather than 1 (tcp) */
    const char *timeout;        /* ACCEL_DIST_TIMEOUT */
    const char *secret;         /* ACCEL_JOB_SECRET; NULL: "s3cret" */
    const char *secret_of_last; /* the last rank's, when not the group's */
    const char *env_name;       /* one more variable for every rank, or NULL */
    const char *env_value;
    bool env_last_only;         /* ... for the last rank only */
    double kill_after_s;        /* 0: 60 */
    /* filled by dist_group_start */
    int port;
    pid_t pid[DIST_GROUP_MAX];
} dist_group;

static inline int dist_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof sa;
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    getsockname(fd, (struct sockaddr *)&sa, &l);
    close(fd);
    return ntohs(sa.sin_port);
}

static inline void dist_setenv_int(const char *k, int v) {
    char b[16];
    snprintf(b, sizeof b, "%d", v);
    setenv(k, b, 1);
}

/* Forks rank r of g (port already chosen). */
static inline pid_t dist_group_fork(dist_group *g, int r, dist_body_fn body) {
    fflush(NULL); /* children exit(): buffered output must not be written twice */
    pid_t pid = fork();
    if (pid != 0) return pid;
    dist_setenv_int("RANK", r);
    dist_setenv_int("LOCAL_RANK", g->one_machine ? r : 0);
    dist_setenv_int("WORLD_SIZE", g->world);
    dist_setenv_int("LOCAL_WORLD_SIZE", g->one_machine ? g->world : 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    dist_setenv_int("MASTER_PORT", g->port);
    setenv("ACCEL_DIST_TIMEOUT", g->timeout, 1);
    const char *secret = g->secret ? g->secret : "s3cret";
    setenv("ACCEL_JOB_SECRET", g->secret_of_last && r == g->world - 1 ? g->secret_of_last : secret, 1);
    unsetenv("ACCEL_INSECURE_NO_SECRET");
    unsetenv("ACCEL_DIST_BACKEND");
    unsetenv("ACCEL_DEBUG_MODE");
    if (g->env_name && (!g->env_last_only || r == g->world - 1)) setenv(g->env_name, g->env_value, 1);
    exit(body(r, g->world)); /* exit, not _exit: LeakSanitizer checks each rank */
}

/* A status no rank exits with (exit code 255, as waitpid gives it): the
 * rank was never started, or could not be waited for. */
enum { DIST_NOT_RUN = 255 << 8 };

/* Waits for every rank (SIGKILL after the deadline); status[r] as waitpid's,
 * DIST_NOT_RUN for a rank that fork could not start or waitpid not reap. */
static inline void dist_group_wait(dist_group *g, int *status) {
    double deadline = accel_now_seconds() + (g->kill_after_s > 0 ? g->kill_after_s : 60);
    for (int r = 0; r < g->world; r++) {
        status[r] = DIST_NOT_RUN;
        if (g->pid[r] <= 0) { /* fork failed: waitpid(-1) would reap another rank */
            fprintf(stderr, "rank %d was not started (fork failed)\n", r);
            continue;
        }
        while (waitpid(g->pid[r], &status[r], WNOHANG) == 0) {
            if (accel_now_seconds() > deadline) {
                fprintf(stderr, "rank %d still running after the deadline: killed\n", r);
                kill(g->pid[r], SIGKILL);
                waitpid(g->pid[r], &status[r], 0);
                break;
            }
            nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
    }
}

static inline void dist_group_run(dist_group *g, dist_body_fn body, int *status) {
    if (g->world < 1 || g->world > DIST_GROUP_MAX) { /* a test's mistake: no rank to run, or pid[] overrun */
        fprintf(stderr, "dist_group_run: world %d is not in 1..%d\n", g->world, DIST_GROUP_MAX);
        abort();
    }
    g->port = dist_free_port();
    for (int r = 0; r < g->world; r++) g->pid[r] = dist_group_fork(g, r, body);
    dist_group_wait(g, status);
}

static inline bool dist_exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

/* Runs body on every rank of g: true when each exited 0. Each rank that did
 * not is named on stderr after the case (case_fmt's printf), "<case>: rank 1
 * exited with 2" or "<case>: rank 1 killed by signal 9", so that a file's
 * CHECK(dist_group_runs_ok(...)) says which case and rank failed. */
static inline bool dist_group_runs_ok(dist_group *g, dist_body_fn body, const char *case_fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline bool dist_group_runs_ok(dist_group *g, dist_body_fn body, const char *case_fmt, ...) {
    int status[DIST_GROUP_MAX];
    dist_group_run(g, body, status);
    bool ok = true;
    for (int r = 0; r < g->world; r++) {
        if (dist_exited_ok(status[r])) continue;
        ok = false;
        va_list ap;
        va_start(ap, case_fmt);
        vfprintf(stderr, case_fmt, ap);
        va_end(ap);
        if (WIFEXITED(status[r])) fprintf(stderr, ": rank %d exited with %d\n", r, WEXITSTATUS(status[r]));
        else fprintf(stderr, ": rank %d killed by signal %d\n", r, WTERMSIG(status[r]));
    }
    return ok;
}

/* The TCP ports process pid listens on (its sockets' inodes in /proc/net/tcp), at most max. */
static inline int dist_listening_ports(pid_t pid, int *ports, int max) {
    char path[64], link[64];
    unsigned long inodes[256];
    int ni = 0, np = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d)) && ni < 256;) {
        char fdpath[320];
        snprintf(fdpath, sizeof fdpath, "%s/%s", path, e->d_name);
        ssize_t n = readlink(fdpath, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = 0;
        if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1) ni++;
    }
    if (d) closedir(d);
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f) && np < max) {
        unsigned port, st;
        unsigned long inode;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*d %*d %lu", &port, &st, &inode) != 3) continue;
        for (int i = 0; i < ni; i++)
            if (st == 0x0A && inode == inodes[i]) ports[np++] = (int)port;
    }
    if (f) fclose(f);
    return np;
}

#endif
