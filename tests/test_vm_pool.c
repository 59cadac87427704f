/* The virtual memory's pool and rules (src/backends/vm_pool.h), through the
 * hostless device's vm_* entries: the same pool serves CUDA, which cannot run
 * here. Physical memory is reused across maps and steps, retired ranges wait
 * for their work (hostless fences that stay pending until waited for stand
 * for a GPU still running it), a failed creation trims the pool and retries,
 * and every misuse (a double map, an unmap of a range that is not exactly
 * mapped, misaligned or unreserved ranges) is an error naming the range. Run
 * with the 64 KiB granule and with CUDA's 2 MiB (ACCEL_TEST_VM_GRANULE), and
 * with ACCEL_VM_SYNC_UNMAP=1 (unmaps wait for their work). Injected device
 * failures (an unmap, a fence record, hostless.h) are reported, and leave no
 * range mapped that the pool counts unmapped, nor a handle pooled that may
 * still be mapped or in use. The cpu's entries (ZeRO-3's host memory) take
 * the same pool over mmap'd pages: memory only while mapped, zeros after. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "backends/registry.h"
#include "backends/hostless/hostless.h"
#include "backends/vm_pool.h"
#include "check.h"

static const accel_backend_mem *mem;
static const accel_device DEV = {ACCEL_DEV_HOSTLESS, 0};
static size_t G; /* the granule */
static bool sync_unmap;

static accel__vm_stats stats(void) { return accel__vm_stats_of(DEV); }

/* The i-th granule of range r. */
static char *at(void *r, int i) { return (char *)r + (size_t)i * G; }

static accel_status map(void *r, int i, int granules) { return mem->vm_map(0, at(r, i), (size_t)granules * G); }
static accel_status unmap(void *r, int i, int granules) { return mem->vm_unmap(0, at(r, i), (size_t)granules * G); }

/* Reading granule i of r from a child process: true when it faulted. */
static bool read_faults(void *r, int i) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char b;
        _exit(mem->copy_to_host(0, &b, at(r, i), 1) == ACCEL_OK ? 0 : 2);
    }
    int ws = 0;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid);
    return !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

/* Maps and unmaps across steps create one handle per range mapped at once. */
static void test_handles_are_reused(void) {
    accel__vm_stats s0 = stats();
    void *r = mem->vm_reserve(0, 4 * G);
    CHECK_MSG(r != NULL, "%s", accel_last_error());
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < 4; i++) {
            CHECK(map(r, i, 1) == ACCEL_OK);
            CHECK(unmap(r, i, 1) == ACCEL_OK);
        }
        CHECK(map(r, 0, 2) == ACCEL_OK && map(r, 2, 2) == ACCEL_OK);
        CHECK(unmap(r, 0, 2) == ACCEL_OK && unmap(r, 2, 2) == ACCEL_OK);
        accel_step_reset();
    }
    accel__vm_stats s = stats();
    CHECK_MSG(s.creates - s0.creates == 3, "%lld handles created (one of 1 granule, two of 2)",
              (long long)(s.creates - s0.creates));
    CHECK(s.maps - s0.maps == 18 && s.reused - s0.reused == 15);
    CHECK(s.mapped == 0 && s.held == 5 * G && s.pooled == 5 * G);
    mem->vm_release(0, r, 4 * G);
    s = stats();
    CHECK(s.held == 0 && s.pooled == 0 && s.destroys - s0.destroys == 3);
}

/* A mapped range reads 0xFF bytes: contents are undefined (a pooled handle holds what it held). */
static void test_mapped_memory_is_not_zeroed(void) {
    void *r = mem->vm_reserve(0, G);
    CHECK(map(r, 0, 1) == ACCEL_OK);
    unsigned char b[64];
    CHECK(mem->copy_to_host(0, b, at(r, 0) + G - sizeof b, sizeof b) == ACCEL_OK);
    CHECK(b[0] == 0xFF && b[sizeof b - 1] == 0xFF);
    CHECK(unmap(r, 0, 1) == ACCEL_OK);
    CHECK(read_faults(r, 0));
    mem->vm_release(0, r, G);
}

static void check_refused(accel_status st, accel_status code, const char *range, const char *why) {
    CHECK_MSG(st == code, "status %d, want %d: %s", (int)st, (int)code, accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), range);
    CHECK_STR_CONTAINS(accel_last_error(), why);
}

/* "[p, q)" of granules [i, i + n) of r, as the errors print ranges. */
static const char *range_str(void *r, int i, int n, char *buf, size_t len) {
    snprintf(buf, len, "[%p, %p)", (void *)at(r, i), (void *)at(r, i + n));
    return buf;
}

static void test_misuse_is_refused(void) {
    char a[64], b[64];
    void *r = mem->vm_reserve(0, 4 * G);
    CHECK(map(r, 0, 2) == ACCEL_OK);
    check_refused(map(r, 0, 2), ACCEL_ERR_STATE, range_str(r, 0, 2, a, sizeof a), "overlaps the mapped range");
    check_refused(map(r, 1, 2), ACCEL_ERR_STATE, range_str(r, 1, 2, a, sizeof a), range_str(r, 0, 2, b, sizeof b));
    check_refused(unmap(r, 0, 1), ACCEL_ERR_STATE, "not exactly a mapped range", range_str(r, 0, 2, b, sizeof b));
    check_refused(unmap(r, 2, 1), ACCEL_ERR_STATE, range_str(r, 2, 1, a, sizeof a), "nothing is mapped there");
    check_refused(mem->vm_map(0, at(r, 2) + 4096, G), ACCEL_ERR_INVALID_ARG, "hostless:0: vm_map of [", "granule");
    check_refused(map(r, 3, 2), ACCEL_ERR_INVALID_ARG, range_str(r, 3, 2, a, sizeof a),
                  "not inside a range vm_reserve gave");
    CHECK(mem->vm_reserve(0, G + 4096) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "granule");
    CHECK(stats().mapped == 2 * G); /* the refusals changed nothing */
    accel_clear_error();
    mem->vm_release(0, at(r, 1), 3 * G);
    CHECK_STR_CONTAINS(accel_last_error(), "not a range vm_reserve gave");
    accel_clear_error();
    mem->vm_release(0, r, 4 * G); /* with [0, 2) still mapped: named, and unmapped all the same */
    CHECK_STR_CONTAINS(accel_last_error(), "still has the mapped range");
    CHECK(stats().mapped == 0 && stats().held == 0);
}

/* Unmapped ranges retire until their work is done: a map of another range
 * waits for the oldest retiring handle of its size rather than creating one;
 * a map of the retiring range itself keeps its mapping. */
static void test_retiring_ranges(void) {
    accel__hostless_vm_lag_fences(true);
    void *r = mem->vm_reserve(0, 4 * G);
    accel__vm_stats s0 = stats();
    CHECK(map(r, 0, 1) == ACCEL_OK && unmap(r, 0, 1) == ACCEL_OK);
    accel__vm_stats s = stats();
    CHECK(s.mapped == 0 && s.pooled == G);
    CHECK_MSG(read_faults(r, 0) == sync_unmap, "a retiring range stays mapped until its work is done");
    CHECK(map(r, 1, 1) == ACCEL_OK);
    s = stats();
    CHECK_MSG(s.creates - s0.creates == 1 && s.waits - s0.waits == 1, "%lld created, %lld waits",
              (long long)(s.creates - s0.creates), (long long)(s.waits - s0.waits));
    CHECK(read_faults(r, 0)); /* waited for and unmapped: its handle now backs granule 1 */
    CHECK(unmap(r, 1, 1) == ACCEL_OK && map(r, 1, 1) == ACCEL_OK);
    s = stats();
    CHECK(s.revived - s0.revived == (sync_unmap ? 0 : 1) && s.creates - s0.creates == 1);
    /* a map overlapping a retiring range that is not it waits for that range */
    CHECK(unmap(r, 1, 1) == ACCEL_OK && map(r, 0, 2) == ACCEL_OK);
    CHECK(unmap(r, 0, 2) == ACCEL_OK);
    mem->vm_release(0, r, 4 * G);
    CHECK(stats().held == 0);
    accel__hostless_vm_lag_fences(false);
}

/* A handle no map took during a step is given back at the step's end. */
static void test_step_trims_idle_handles(void) {
    void *r = mem->vm_reserve(0, 8 * G), *keep = mem->vm_reserve(0, G);
    CHECK(map(keep, 0, 1) == ACCEL_OK); /* mapped all along: never trimmed */
    for (int i = 0; i < 8; i++) CHECK(map(r, i, 1) == ACCEL_OK); /* a burst (prepare maps the whole model) */
    for (int i = 0; i < 8; i++) CHECK(unmap(r, i, 1) == ACCEL_OK);
    accel_step_reset();
    CHECK(stats().held == 9 * G); /* used in the step that ended */
    accel__vm_stats s0 = stats();
    for (int step = 0; step < 3; step++) { /* steps that map two at once */
        CHECK(map(r, 0, 1) == ACCEL_OK && map(r, 5, 1) == ACCEL_OK);
        CHECK(unmap(r, 0, 1) == ACCEL_OK && unmap(r, 5, 1) == ACCEL_OK);
        accel_step_reset();
        CHECK_MSG(stats().held == 3 * G, "step %d: %zu bytes held", step, stats().held);
    }
    CHECK(stats().creates == s0.creates);
    CHECK(unmap(keep, 0, 1) == ACCEL_OK);
    mem->vm_release(0, keep, G);
    CHECK(stats().held == 3 * G); /* r is still reserved: the pool stays */
    mem->vm_release(0, r, 8 * G);
    CHECK(stats().held == 0);
}

/* A creation the device cannot hold trims the pool and retries; one that
 * still does not fit is ACCEL_ERR_OOM, named. */
static void test_full_device_trims_the_pool(void) {
    void *r = mem->vm_reserve(0, 4 * G);
    accel__vm_stats s0 = stats();
    accel__hostless_vm_set_limit(2 * G);
    CHECK(map(r, 0, 1) == ACCEL_OK && unmap(r, 0, 1) == ACCEL_OK); /* a pooled 1-granule handle */
    CHECK_MSG(map(r, 2, 2) == ACCEL_OK, "%s", accel_last_error());
    accel__vm_stats s = stats();
    CHECK(s.trims - s0.trims == 1 && s.held == 2 * G && s.destroys - s0.destroys == 1);
    check_refused(map(r, 0, 1), ACCEL_ERR_OOM, "hostless:0: out of device memory", "limit");
    CHECK(stats().mapped == 2 * G);
    accel__hostless_vm_set_limit(0);
    CHECK(map(r, 0, 1) == ACCEL_OK);
    CHECK(unmap(r, 0, 1) == ACCEL_OK && unmap(r, 2, 2) == ACCEL_OK);
    mem->vm_release(0, r, 4 * G);
    CHECK(stats().held == 0);
}

/* A creation that finds the device full of another allocator's idle cache
 * (CUDA's caching allocator beside its virtual memory) has the backend give
 * that cache back and retries, even with nothing pooled to trim; a device
 * still full after it is ACCEL_ERR_OOM. */
static void test_full_device_releases_the_idle_cache(void) {
    void *r = mem->vm_reserve(0, 4 * G);
    int64_t releases = accel__hostless_vm_idle_releases();
    accel__hostless_vm_set_limit(2 * G);
    accel__hostless_vm_set_idle_cache(2 * G);
    CHECK_MSG(map(r, 0, 1) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel__hostless_vm_idle_releases() - releases == 1);
    accel__hostless_vm_set_idle_cache(G);
    check_refused(map(r, 1, 2), ACCEL_ERR_OOM, "hostless:0: out of device memory", "limit");
    CHECK(accel__hostless_vm_idle_releases() - releases == 2 && stats().mapped == G);
    accel__hostless_vm_set_limit(0);
    CHECK(unmap(r, 0, 1) == ACCEL_OK);
    mem->vm_release(0, r, 4 * G);
    CHECK(stats().held == 0);
}

/* An unmap that fails leaves its handle possibly mapped: it is released,
 * never pooled (a later map would put it behind a second range), and the
 * error is reported. */
static void test_failed_unmap_drops_the_handle(void) {
    void *r = mem->vm_reserve(0, 2 * G);
    accel__vm_stats s0 = stats();
    CHECK(map(r, 0, 1) == ACCEL_OK);
    accel__hostless_vm_fail_unmap_next(1);
    check_refused(unmap(r, 0, 1), ACCEL_ERR_DEVICE, "hostless:0: cannot unmap", "injected");
    accel__vm_stats s = stats();
    CHECK_MSG(s.held == s0.held && s.destroys - s0.destroys == 1, "%zu bytes held, %lld destroyed", s.held,
              (long long)(s.destroys - s0.destroys));
    CHECK(map(r, 1, 1) == ACCEL_OK); /* a new handle, not the one still behind granule 0 */
    CHECK(stats().creates - s0.creates == 2 && stats().reused == s0.reused);
    CHECK(unmap(r, 1, 1) == ACCEL_OK);
    mem->vm_release(0, r, 2 * G);
    CHECK(stats().held == 0);
}

/* Another retiring range's failed unmap, found by this unmap, is reported
 * and this range is unmapped all the same (its caller counts it unmapped). */
static void test_unmap_goes_on_after_another_failure(void) {
    char failed[64];
    void *r = mem->vm_reserve(0, 2 * G);
    CHECK(map(r, 0, 1) == ACCEL_OK && map(r, 1, 1) == ACCEL_OK);
    accel__hostless_vm_lag_fences(true);
    CHECK(unmap(r, 0, 1) == ACCEL_OK); /* retiring (unmapped already under sync unmaps) */
    accel__hostless_vm_lag_fences(false); /* its work done: the next vm call unmaps it */
    accel__hostless_vm_fail_unmap_next(1);
    snprintf(failed, sizeof failed, "at %p (injected)", (void *)at(r, sync_unmap ? 1 : 0));
    check_refused(unmap(r, 1, 1), ACCEL_ERR_DEVICE, "cannot unmap", failed);
    CHECK(stats().mapped == 0);
    CHECK_MSG(map(r, 1, 1) == ACCEL_OK, "%s", accel_last_error());
    CHECK(unmap(r, 1, 1) == ACCEL_OK);
    mem->vm_release(0, r, 2 * G);
    CHECK(stats().held == 0);
}

/* A fence that cannot be recorded: the host waits for the stream, then the
 * range is unmapped and its handle pooled (no stale fence waited for). */
static void test_unrecorded_fence_waits_for_the_stream(void) {
    void *r = mem->vm_reserve(0, G);
    accel__hostless_vm_lag_fences(true);
    CHECK(map(r, 0, 1) == ACCEL_OK);
    accel__vm_stats s0 = stats();
    accel__hostless_vm_fail_record_next(1);
    check_refused(unmap(r, 0, 1), ACCEL_ERR_DEVICE, "hostless:0: cannot record a fence", "injected");
    accel__vm_stats s = stats();
    CHECK_MSG(s.waits - s0.waits == 1, "%lld host waits", (long long)(s.waits - s0.waits));
    CHECK(s.mapped == 0 && s.pooled == s0.pooled + G && read_faults(r, 0));
    /* at vm_release of a range still mapped, the refusal stays the reported error */
    CHECK(map(r, 0, 1) == ACCEL_OK);
    accel__hostless_vm_fail_record_next(1);
    accel_clear_error();
    mem->vm_release(0, r, G);
    CHECK_STR_CONTAINS(accel_last_error(), "still has the mapped range");
    CHECK(stats().held == 0);
    accel__hostless_vm_lag_fences(false);
    accel_clear_error();
}

/* A failed wait or unmap while trimming for a creation is that map's error. */
static void test_failed_trim_is_reported(void) {
    if (sync_unmap) return; /* no range retires: the trim has nothing to wait for or unmap */
    void *r = mem->vm_reserve(0, 4 * G);
    accel__hostless_vm_set_limit(2 * G);
    accel__hostless_vm_lag_fences(true);
    CHECK(map(r, 0, 1) == ACCEL_OK && unmap(r, 0, 1) == ACCEL_OK); /* retiring */
    accel__hostless_vm_fail_unmap_next(1);
    check_refused(map(r, 2, 2), ACCEL_ERR_DEVICE, "hostless:0: cannot unmap", "injected");
    accel__hostless_vm_lag_fences(false);
    accel__hostless_vm_set_limit(0);
    CHECK(stats().mapped == 0 && stats().held == 0);
    CHECK(map(r, 2, 2) == ACCEL_OK && unmap(r, 2, 2) == ACCEL_OK);
    mem->vm_release(0, r, 4 * G);
    CHECK(stats().held == 0);
}

/* Whether the page at p is resident (mincore). */
static bool resident_page(void *p) {
    unsigned char v = 0;
    CHECK(mincore(p, 1, &v) == 0);
    return v & 1;
}

/* The cpu's entries: a page granule; a reserved range faults until mapped;
 * a mapped range takes memory when written and gives it back at its unmap
 * (reading zeros afterwards, without a fault); misuse is refused by the
 * pool's rules, naming the cpu. */
static void test_cpu_entries(void) {
    const accel_device cpu = ACCEL_CPU_DEVICE;
    const accel_backend_mem *m = &accel__backend_of(cpu)->mem;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    CHECK(m->vm_granularity(0) == pg);
    accel__vm_stats s0 = accel__vm_stats_of(cpu);
    char *r = m->vm_reserve(0, 4 * pg);
    CHECK_MSG(r != NULL, "%s", accel_last_error());
    if (!r) return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        (void)((volatile char *)r)[0]; /* never mapped: PROT_NONE */
        _exit(0);
    }
    int ws = 0;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid);
    CHECK(!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)); /* it faulted (a signal; under ASan its exit status) */
    CHECK(m->vm_map(0, r, 2 * pg) == ACCEL_OK);
    CHECK(accel__vm_stats_of(cpu).mapped - s0.mapped == 2 * pg);
    memset(r, 0x5A, 2 * pg);
    CHECK(resident_page(r) && resident_page(r + pg));
    check_refused(m->vm_map(0, r + pg, 2 * pg), ACCEL_ERR_STATE, "cpu:", "overlaps the mapped range");
    CHECK(m->vm_unmap(0, r, 2 * pg) == ACCEL_OK);
    CHECK(!resident_page(r) && !resident_page(r + pg));
    CHECK(r[0] == 0 && r[2 * pg - 1] == 0);
    CHECK(accel__vm_stats_of(cpu).mapped == s0.mapped);
    check_refused(m->vm_unmap(0, r, pg), ACCEL_ERR_STATE, "cpu:", "nothing is mapped there");
    accel_clear_error();
    m->vm_release(0, r, 4 * pg);
    CHECK(accel_last_status() == ACCEL_OK);
}

int main(void) {
    CHECK(accel__hostless_register(1) == ACCEL_OK);
    mem = &accel__backend_of(DEV)->mem;
    G = mem->vm_granularity(0);
    const char *g = getenv("ACCEL_TEST_VM_GRANULE"), *s = getenv("ACCEL_VM_SYNC_UNMAP");
    CHECK(G == (g ? (size_t)strtoull(g, NULL, 10) : (size_t)64 << 10));
    sync_unmap = s && strcmp(s, "1") == 0;
    RUN(test_handles_are_reused);
    RUN(test_mapped_memory_is_not_zeroed);
    RUN(test_misuse_is_refused);
    RUN(test_retiring_ranges);
    RUN(test_step_trims_idle_handles);
    RUN(test_full_device_trims_the_pool);
    RUN(test_full_device_releases_the_idle_cache);
    RUN(test_failed_unmap_drops_the_handle);
    RUN(test_unmap_goes_on_after_another_failure);
    RUN(test_unrecorded_fence_waits_for_the_stream);
    RUN(test_failed_trim_is_reported);
    RUN(test_cpu_entries);
    accel_thread_cleanup();
    return check_summary();
}
