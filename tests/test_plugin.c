/* Backend plug-ins (backends/plugin.h), the loading path every device but the
 * CPU takes:
 *   test_plugin [FILES...]      the hostless plug-in loads on demand; CPU work
 *                               maps no GPU library; with FILES, the checks of
 *                               a plug-in file (garbage, wrong version symbol,
 *                               missing init) and a second plug-in (cuda)
 *                               loaded beside hostless.
 *   test_plugin broken WHY      ACCEL_BACKEND_PATH leads to a broken
 *                               libaccel-hostless.so: the failing call and the
 *                               reason say WHY; CPU work still runs.
 *   test_plugin race            threads asking for the hostless plug-in at
 *                               once, none first: each gets it loaded.
 * argv after the mode: the bad plug-in files tests/plugin.cmake builds. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "backends/registry.h"
#include "check.h"
#include "backends/plugin.h"

static const accel_device H0 = {ACCEL_DEV_HOSTLESS, 0};

/* Whether /proc/self/maps names a file containing `what`. */
static bool mapped(const char *what) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    bool found = false;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, what)) found = true;
    if (f) fclose(f);
    return found;
}

/* A little CPU training-like work: y = x w, its value checked. */
static void cpu_work(void) {
    accel_tensor *x = accel_from_floats(2, (int64_t[]){1, 2}, (float[]){1, 2});
    accel_tensor *w = accel_from_floats(2, (int64_t[]){2, 1}, (float[]){3, 4});
    accel_tensor *y = accel_matmul(x, w);
    CHECK_MSG(y && accel_item(y) == 11.0, "%s", accel_last_error());
    accel_tensor_free(y);
    accel_tensor_free(x);
    accel_tensor_free(w);
}

static const char *const GPU_LIBS[] = {"libcuda.so", "libcudart", "libcublas", "libnccl", "libaccel-cuda"};

static void test_cpu_maps_no_gpu_library(void) {
    cpu_work();
    CHECK(accel_device_count(ACCEL_DEV_CPU) == 1);
    for (size_t i = 0; i < sizeof GPU_LIBS / sizeof *GPU_LIBS; i++)
        CHECK_MSG(!mapped(GPU_LIBS[i]), "a CPU-only run maps %s", GPU_LIBS[i]);
    CHECK(!mapped("libaccel-hostless")); /* nothing asked for a hostless device yet */
}

static void test_hostless_loads_on_demand(void) {
    CHECK(accel_device_count(ACCEL_DEV_HOSTLESS) == 0); /* loaded, no device registered */
    CHECK(mapped("libaccel-hostless.so"));
    CHECK(strstr(accel__plugin_unavailable_reason(ACCEL_DEV_HOSTLESS), "ACCEL_TEST_DEVICES") != NULL);
    CHECK_MSG(accel__hostless_register(1) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_device_count(ACCEL_DEV_HOSTLESS) == 1);
    CHECK(strcmp(accel__plugin_unavailable_reason(ACCEL_DEV_HOSTLESS), "") == 0);
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){4}, H0);
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    accel_tensor_free(t);
    CHECK(!mapped("libcublas") && !mapped("libnccl"));
}

/* The file checks, on the files tests/plugin.cmake made. */
static void test_bad_files(const char *garbage, const char *bad_abi, const char *no_init) {
    char why[1024];
    CHECK(accel__plugin_open(garbage, ACCEL_DEV_HOSTLESS, why, sizeof why) != ACCEL_OK);
    CHECK_MSG(strstr(why, "cannot be loaded"), "%s", why);
    CHECK(accel__plugin_open(bad_abi, ACCEL_DEV_HOSTLESS, why, sizeof why) != ACCEL_OK);
    CHECK_MSG(strstr(why, "was built for another accel (plug-in ABI 999"), "%s", why);
    CHECK(accel__plugin_open(no_init, ACCEL_DEV_HOSTLESS, why, sizeof why) != ACCEL_OK);
    CHECK_MSG(strstr(why, "has no symbol accel_backend_hostless_init"), "%s", why);
    /* a plug-in file for another device type has no symbols of this one */
    CHECK(accel__plugin_open(no_init, ACCEL_DEV_CUDA, why, sizeof why) != ACCEL_OK);
    CHECK_MSG(strstr(why, "has no symbol accel_backend_cuda_abi"), "%s", why);
    cpu_work();
}

/* Two plug-ins in one process: the cuda one (its real file, opened by path:
 * without a driver the search stops before it) beside hostless. */
static void test_two_plugins(const char *cuda) {
    if (!*cuda) {
        printf("note: no cuda plug-in in this build: two plug-ins = hostless twice\n");
        return;
    }
    char why[1024] = "";
    CHECK_MSG(accel__plugin_open(cuda, ACCEL_DEV_CUDA, why, sizeof why) == ACCEL_OK, "%s", why);
    CHECK(mapped("libaccel-cuda.so") && mapped("libaccel-hostless.so"));
    CHECK(accel_device_count(ACCEL_DEV_HOSTLESS) == 1);
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){4}, H0);
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    accel_tensor_free(t);
    cpu_work();
}

static int broken(const char *want) {
    CHECK(accel_device_count(ACCEL_DEV_HOSTLESS) == 0);
    const char *why = accel__plugin_unavailable_reason(ACCEL_DEV_HOSTLESS);
    CHECK_MSG(strstr(why, want), "reason '%s' lacks '%s'", why, want);
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){4}, H0);
    CHECK(t == NULL);
    CHECK_MSG(strstr(accel_last_error(), "device hostless:0 is not available: ") && strstr(accel_last_error(), want),
              "%s", accel_last_error());
    CHECK(accel__hostless_register(1) == ACCEL_ERR_DEVICE && strstr(accel_last_error(), want));
    accel_clear_error();
    cpu_work();
    return check_summary();
}

/* The first load raced: while one thread is inside the load (finding,
 * mapping and initialising the file), the others must wait for it, not fail
 * with an empty reason. */
enum { RACERS = 8 };
static pthread_barrier_t g_start;

static void *race_load(void *out) {
    pthread_barrier_wait(&g_start);
    *(accel_status *)out = accel__plugin_load_type(ACCEL_DEV_HOSTLESS);
    return NULL;
}

static int race(void) {
    pthread_t th[RACERS];
    accel_status st[RACERS];
    pthread_barrier_init(&g_start, NULL, RACERS);
    for (int i = 0; i < RACERS; i++) CHECK(pthread_create(&th[i], NULL, race_load, &st[i]) == 0);
    for (int i = 0; i < RACERS; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&g_start);
    for (int i = 0; i < RACERS; i++)
        CHECK_MSG(st[i] == ACCEL_OK, "thread %d: %s (%s)", i, accel_status_name(st[i]),
                  accel__plugin_unavailable_reason(ACCEL_DEV_HOSTLESS));
    CHECK(strstr(accel__plugin_unavailable_reason(ACCEL_DEV_HOSTLESS), "ACCEL_TEST_DEVICES") != NULL);
    return check_summary();
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "race")) return race();
    if (argc == 3 && !strcmp(argv[1], "broken")) return broken(argv[2]);
    RUN(test_cpu_maps_no_gpu_library);
    RUN(test_hostless_loads_on_demand);
    if (argc == 5) {
        test_bad_files(argv[1], argv[2], argv[3]);
        test_two_plugins(argv[4]);
    } else if (argc != 1) {
        return fprintf(stderr, "usage: test_plugin [GARBAGE BAD_ABI NO_INIT CUDA_PLUGIN|'']\n"), 2;
    }
    return check_summary();
}
