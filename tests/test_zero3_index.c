/* The ZeRO-3 sharded index reader (src/accelerator/zero3_checkpoint.c) on
 * one process: tests/zero3_index_fixture.h's folder merged as merge-weights
 * merges it (accel__zero3_merge), then hostile sharded_index.json files (the
 * fuzz target's 'Z' prefix, tests/fuzz_config.c) refused with an error that
 * names the problem. The multi-process saves and loads are
 * test_accelerator_zero3_checkpoint's. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accelerator/accelerator_internal.h"
#include "check.h"
#include "zero3_index_fixture.h"

static char g_dir[64], g_out[96];

/* The merged file's tensor `name`: n f32 values counting up from first. */
static void check_values(accel_safetensors *f, const char *name, int64_t n, float first) {
    const accel_st_info *in = accel_safetensors_find(f, name);
    CHECK_MSG(in && in->dtype == ACCEL_F32 && in->nbytes == (size_t)n * sizeof(float), "%s", name);
    if (!in || in->nbytes != (size_t)n * sizeof(float)) return;
    const float *v = in->bytes;
    for (int64_t i = 0; i < n; i++) CHECK_MSG(v[i] == first + (float)i, "%s[%lld] = %g", name, (long long)i, v[i]);
}

/* The folder's own index: every entry whole, from both ranks' files. */
static void test_merge(void) {
    CHECK(zero3_index_write(g_dir, ZERO3_INDEX_OK, strlen(ZERO3_INDEX_OK)));
    int n = 0;
    CHECK_MSG(accel__zero3_merge(g_dir, g_out, false, &n) == ACCEL_OK, "%s", accel_last_error());
    CHECK(n == 5);
    char path[160];
    snprintf(path, sizeof path, "%s/model.safetensors", g_out);
    accel_safetensors *f = accel_safetensors_open(path);
    CHECK_MSG(f != NULL, "%s", accel_last_error());
    if (!f) return;
    CHECK(accel_safetensors_count(f) == 5);
    check_values(f, "a.weight", 6, 0); /* unit 0's [0, 6): rank 0's 4, rank 1's first 2 */
    check_values(f, "a.bias", 2, 6);
    check_values(f, "b.weight", 5, 10);
    check_values(f, "buf", 2, 100);
    check_values(f, "tied", 6, 0);
    accel_safetensors_close(f);
}

/* text as the folder's index: both merges fail with code, naming the problem
 * (and not accel_accelerator_load_state, whose reader it shares: accel
 * merge-weights names itself). */
static void expect_refused(const char *text, accel_status code, const char *needle) {
    CHECK(zero3_index_write(g_dir, text, strlen(text)));
    for (int torch_format = 0; torch_format < 2; torch_format++) {
        int n = 0;
        accel_clear_error();
        accel_status st = accel__zero3_merge(g_dir, g_out, torch_format, &n);
        CHECK_MSG(st == code, "%s: %d, %s", needle, st, accel_last_error());
        CHECK_STR_CONTAINS(accel_last_error(), needle);
        CHECK_MSG(!strstr(accel_last_error(), "load_state"), "%s", accel_last_error());
    }
}

/* Ranges of a unit that overlap, making up for a hole in a.weight's [0, 6)
 * (rank 0's [0, 4), the 2 elements of "buf" claimed as [2, 4)): the count of
 * elements read matched, and [4, 6) went out uninitialised. */
static void test_overlapping_ranges(void) {
    expect_refused(ZERO3_INDEX("[{\"name\": \"a.weight\", \"unit\": 0, \"offset\": 0, \"shape\": [2, 3]}]",
                               "[{\"file\": \"shard_0.safetensors\", \"ranges\": [{\"unit\": 0, \"tensor\": "
                               "\"unit_0\", \"lo\": 0, \"hi\": 4}]}, {\"file\": \"replicated.safetensors\", "
                               "\"ranges\": [{\"unit\": 0, \"tensor\": \"buf\", \"lo\": 2, \"hi\": 4}]}]"),
                   ACCEL_ERR_FORMAT, "sharded_index.json: unit 0's ranges [0, 4) (shard_0.safetensors) and [2, 4) "
                                     "(replicated.safetensors) overlap");
}

/* A shape of 2^59 elements the files do not hold (fuzz_config): refused as
 * not covered before the merge asked for 2^61 bytes (ASan: allocation size
 * too big; libFuzzer: out of memory at [10^9]). */
static void test_shape_past_the_files(void) {
    expect_refused(ZERO3_INDEX("[{\"name\": \"a.weight\", \"unit\": 0, \"offset\": 0, \"shape\": [1099511627776, "
                               "524288]}]", ZERO3_FILES_OK),
                   ACCEL_ERR_FORMAT, "unit 0's elements [0, 576460752303423488) (parameter a.weight) are in none of "
                                     "its files");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_zero3_index_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    snprintf(g_out, sizeof g_out, "%s/merged", g_dir);
    CHECK(mkdir(g_out, 0755) == 0 && zero3_index_folder(g_dir));
    RUN(test_merge);
    RUN(test_overlapping_ranges);
    RUN(test_shape_past_the_files);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
