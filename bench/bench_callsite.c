/* bench_callsite: what the always-on call-site records cost (every
 * collective's record - number, kind, dtype, count, file:line - described
 * for error context, published to the peers and compared across ranks).
 *
 *     bench_callsite [--calls N] [--rounds R]
 *
 * 1. One process (the self backend moves nothing), so a call costs only
 *    what dist.c does for every collective: argument checks, the record and
 *    the description for error context. A 1-float all_reduce:
 *      self_one_site   through its macro from one line (a training loop): the
 *                      site is recorded, its file copied and hashed once
 *      self_two_sites  through the macro from two lines in turn: copied and hashed every call
 *      self_no_site    the function by its name with the site cleared: no site at all
 *    (records' cost = one_site - no_site), and two pieces alone:
 *    site_describe (accel__site_describe: reports only), site_hash.
 * 2. Two processes on one machine, forked here, over shm and over tcp
 *    (loopback): a 1-float all_reduce with the sites compared (the
 *    default), recorded but not compared (ACCEL_DIST_CHECK_CALL_SITES=0),
 *    and none recorded.
 * The forms and configurations take turns round after round, so that the
 * shared machine's load drifts over all of them alike.
 *
 * Each line: name=... ns_per_call=<median over R rounds of N calls> min=...
 * (two processes: rank 0's rounds). Then the 1-minute load average before
 * and after: the machine is shared, so these are rough figures. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "dist/backend.h"

static int g_calls = 200000, g_rounds = 7;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, double *ns, int n) {
    qsort(ns, (size_t)n, sizeof *ns, cmp_double);
    double median = n % 2 ? ns[n / 2] : 0.5 * (ns[n / 2 - 1] + ns[n / 2]);
    printf("name=%s ns_per_call=%.1f min=%.1f calls=%d rounds=%d\n", name, median, ns[0], g_calls, n);
    fflush(stdout);
}

static double load_average(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &l) != 1) l = -1;
    if (f) fclose(f);
    return l;
}

/* ---------------------------------------------------------------- one process */

/* How a loop calls its collective: through the macro from one line (the
 * site recorded and hashed once, then compared), from two lines in turn
 * (copied and hashed every call), or with no site at all (cleared, and the
 * function called by its name: what the records add is the difference). */
typedef enum { ONE_SITE, TWO_SITES, NO_SITE, N_FORMS } call_form;
static const char *const FORM_NAME[] = {"one_site", "two_sites", "no_site"};

static accel_status one_call(accel_pg *pg, float *x, call_form form, int i) {
    if (form == NO_SITE) return (accel_pg_all_reduce)(pg, x, 1, ACCEL_F32, ACCEL_REDUCE_MAX);
    if (form == TWO_SITES && i % 2) return accel_pg_all_reduce(pg, x, 1, ACCEL_F32, ACCEL_REDUCE_MAX);
    return accel_pg_all_reduce(pg, x, 1, ACCEL_F32, ACCEL_REDUCE_MAX);
}

/* ns per call of one round of g_calls calls. */
static double time_round(accel_pg *pg, call_form form) {
    float x = 1;
    if (form == NO_SITE) accel_dist_set_call_site(NULL, 0);
    double t0 = accel_now_seconds();
    for (int i = 0; i < g_calls; i++)
        if (one_call(pg, &x, form, i) != ACCEL_OK) {
            fprintf(stderr, "bench_callsite: %s\n", accel_last_error());
            exit(1);
        }
    return (accel_now_seconds() - t0) * 1e9 / g_calls;
}

/* The forms in turn, round after round, so that the machine's load drifts
 * over all of them alike. */
static void time_self(void) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "bench_callsite: %s\n", accel_last_error());
        exit(1);
    }
    accel_pg *pg = accel_dist_default_group();
    double ns[N_FORMS][64];
    for (int r = 0; r < g_rounds; r++)
        for (int f = 0; f < N_FORMS; f++) ns[f][r] = time_round(pg, (call_form)f);
    char name[64];
    for (int f = 0; f < N_FORMS; f++) {
        snprintf(name, sizeof name, "self_%s", FORM_NAME[f]);
        report(name, ns[f], g_rounds);
    }
    (accel_dist_finalize)();
}

static void time_pieces(void) {
    accel__site site = {.seq = 7, .kind = 0, .dtype = ACCEL_F32, .count = 1024, .line = 42};
    snprintf(site.file, sizeof site.file, "train_something.c");
    char out[128];
    double ns[64];
    volatile unsigned sink = 0;
    for (int r = 0; r < g_rounds; r++) {
        double t0 = accel_now_seconds();
        for (int i = 0; i < g_calls; i++) {
            accel__site_describe(&site, out, sizeof out);
            sink += (unsigned)out[3];
        }
        ns[r] = (accel_now_seconds() - t0) * 1e9 / g_calls;
    }
    report("site_describe", ns, g_rounds);
    for (int r = 0; r < g_rounds; r++) {
        double t0 = accel_now_seconds();
        for (int i = 0; i < g_calls; i++) sink += accel__site_hash(site.file, i);
        ns[r] = (accel_now_seconds() - t0) * 1e9 / g_calls;
    }
    report("site_hash", ns, g_rounds);
    (void)sink;
}

/* ---------------------------------------------------------------- two processes */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof sa;
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    getsockname(fd, (struct sockaddr *)&sa, &l);
    close(fd);
    return ntohs(sa.sin_port);
}

/* Two-process configurations: sites compared (the default), recorded but
 * not compared (ACCEL_DIST_CHECK_CALL_SITES=0), none recorded. */
typedef enum { COMPARED, NOT_COMPARED, NONE, N_CONFIGS } two_config;
static const char *const CONFIG_NAME[] = {"sites_compared", "sites_not_compared", "no_sites"};

/* One round on rank `rank`: rank 0 writes its ns per call to `out`. */
static int rank_round(int rank, two_config cfg, int out) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    if (accel_pg_barrier(pg) != ACCEL_OK) return 2;
    double ns = time_round(pg, cfg == NONE ? NO_SITE : ONE_SITE);
    if (rank == 0 && write(out, &ns, sizeof ns) != (ssize_t)sizeof ns) return 3;
    accel_dist_finalize();
    return 0;
}

/* ns per call of one round of two processes (shm or tcp) in cfg; -1 on failure. */
static double two_round(bool tcp, two_config cfg) {
    int port = free_port(), res[2];
    if (pipe(res) != 0) return -1;
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        fflush(NULL);
        pid[r] = fork();
        if (pid[r] != 0) continue;
        char v[16];
        snprintf(v, sizeof v, "%d", r);
        setenv("RANK", v, 1);
        setenv("LOCAL_RANK", tcp ? "0" : v, 1);
        setenv("WORLD_SIZE", "2", 1);
        setenv("LOCAL_WORLD_SIZE", tcp ? "1" : "2", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof v, "%d", port);
        setenv("MASTER_PORT", v, 1);
        setenv("ACCEL_JOB_SECRET", "bench", 1);
        setenv("ACCEL_DIST_CHECK_CALL_SITES", cfg == NOT_COMPARED ? "0" : "1", 1);
        exit(rank_round(r, cfg, res[1]));
    }
    double ns = -1;
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pid[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) fprintf(stderr, "bench_callsite: rank %d: status %#x\n", r, st);
    }
    if (read(res[0], &ns, sizeof ns) != (ssize_t)sizeof ns) ns = -1;
    close(res[0]);
    close(res[1]);
    return ns;
}

static void time_two(bool tcp) {
    double ns[N_CONFIGS][64];
    for (int r = 0; r < g_rounds; r++)
        for (int c = 0; c < N_CONFIGS; c++) ns[c][r] = two_round(tcp, (two_config)c);
    char name[64];
    for (int c = 0; c < N_CONFIGS; c++) {
        snprintf(name, sizeof name, "%s_2proc_%s", tcp ? "tcp" : "shm", CONFIG_NAME[c]);
        report(name, ns[c], g_rounds);
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--calls")) g_calls = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) g_rounds = atoi(argv[i + 1]);
    }
    if (g_calls < 1 || g_rounds < 1 || g_rounds > 64) {
        fprintf(stderr, "usage: bench_callsite [--calls N >= 1] [--rounds 1..64]\n");
        return 2;
    }
    double load0 = load_average();
    const char *launch[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                            "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof launch / sizeof *launch; i++) unsetenv(launch[i]);
    time_self();
    time_pieces();
    int calls = g_calls;
    g_calls = calls / 10 > 0 ? calls / 10 : 1; /* a real all_reduce is ~10-100x a self call */
    time_two(false);
    time_two(true);
    printf("load_average_1min before=%.2f after=%.2f cpus=%ld\n", load0, load_average(), sysconf(_SC_NPROCESSORS_ONLN));
    return 0;
}
