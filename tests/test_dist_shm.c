/* The shm segment cannot leak when a rank dies during rendezvous: rank 1
 * fails in the middle of it (a bad tunable of its own), and rank 0, left
 * waiting with the segment created, is SIGKILLed as `accel launch` does when
 * a worker fails. Nothing of rank 0 may remain in /dev/shm (the named segment
 * did: it was unlinked only once every rank had mapped it). */
#include <dirent.h>
#include <string.h>
#include <sys/mman.h>

#include "accel/dist.h"
#include "check.h"
#include "dist_group.h"

static int rendezvous_body(int rank, int world) {
    accel_status st = accel_dist_init(); /* rank 0 stays in it until killed */
    fprintf(stderr, "rank %d: %s\n", rank, st == ACCEL_OK ? "joined" : accel_last_error());
    if (st == ACCEL_OK) accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return rank == 1 && st == ACCEL_ERR_INVALID_ARG ? 0 : 10;
}

/* Names in /dev/shm that rank 0 (pid) created; removed after counting. */
static int segments_of(pid_t pid) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "accel-%d-", (int)pid);
    int n = 0;
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        shm_unlink(name);
        n++;
    }
    if (d) closedir(d);
    return n;
}

static void test_no_segment_left_when_a_rank_dies_in_rendezvous(void) {
    dist_group g = {.world = 2, .one_machine = true, .timeout = "20", .env_name = "ACCEL_SHM_CHUNK_KB",
                    .env_value = "0", .env_last_only = true, .kill_after_s = 30};
    g.port = dist_free_port();
    for (int r = 0; r < 2; r++) g.pid[r] = dist_group_fork(&g, r, rendezvous_body);
    int st1;
    waitpid(g.pid[1], &st1, 0);
    CHECK_MSG(dist_exited_ok(st1), "rank 1: status %#x", st1);
    nanosleep(&(struct timespec){0, 300000000}, NULL); /* rank 0 is past creating the segment */
    kill(g.pid[0], SIGKILL);
    int st0;
    waitpid(g.pid[0], &st0, 0);
    CHECK(WIFSIGNALED(st0));
    int left = segments_of(g.pid[0]);
    CHECK_MSG(left == 0, "%d shared memory segment%s of rank 0 left in /dev/shm", left, left == 1 ? "" : "s");
}

int main(void) {
    RUN(test_no_segment_left_when_a_rank_dies_in_rendezvous);
    return check_summary();
}
