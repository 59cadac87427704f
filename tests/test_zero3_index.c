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

/* Two parameters of a unit sharing elements (a.bias placed at 4, inside
 * a.weight's [0, 6)): merged as copies of each other's elements, loaded the
 * same way, without a word. */
static void test_overlapping_parameters(void) {
    expect_refused(ZERO3_INDEX("[{\"name\": \"a.weight\", \"unit\": 0, \"offset\": 0, \"shape\": [2, 3]}, "
                               "{\"name\": \"a.bias\", \"unit\": 0, \"offset\": 4, \"shape\": [2]}]",
                               ZERO3_FILES_OK),
                   ACCEL_ERR_FORMAT, "sharded_index.json: parameters a.weight [0, 6) and a.bias [4, 6) of unit 0 "
                                     "overlap");
}

/* A range's tensor name longer than the reader's buffer: cut, it named
 * another tensor of the file (here the cut name's, which the merge read). */
static void test_long_tensor_name(void) {
    char name[300], cut[300], text[sizeof ZERO3_INDEX_OK + 600];
    memset(name, 'u', sizeof name - 1);
    name[sizeof name - 1] = 0;
    memcpy(cut, name, 255); /* what a 256-byte buffer held */
    cut[255] = 0;
    const char *names[] = {cut, "unit_1"};
    static const int64_t SIZES[] = {4, 3};
    static const float FIRST[] = {0, 10};
    CHECK(zero3_fixture_file(g_dir, "long.safetensors", 2, names, SIZES, FIRST));
    snprintf(text, sizeof text, ZERO3_INDEX(ZERO3_STATE_DICT_OK, "[{\"file\": \"long.safetensors\", \"ranges\": ["
             "{\"unit\": 0, \"tensor\": \"%s\", \"lo\": 0, \"hi\": 4}, {\"unit\": 1, \"tensor\": \"unit_1\", "
             "\"lo\": 0, \"hi\": 3}]}, {\"file\": \"shard_1.safetensors\", \"ranges\": [{\"unit\": 0, \"tensor\": "
             "\"unit_0\", \"lo\": 4, \"hi\": 8}, {\"unit\": 1, \"tensor\": \"unit_1\", \"lo\": 3, \"hi\": 6}]}]"),
             name);
    expect_refused(text, ACCEL_ERR_FORMAT, "long.safetensors: the index says it holds unit 0's range [0, 4) as tensor "
                                           "uuuu");
}

/* A state-dict name given twice (a parameter, or a replicated entry under a
 * parameter's name): load_state read the first, merge-weights failed only
 * in the writer, naming the output file. */
static void test_name_twice(void) {
    expect_refused(ZERO3_INDEX("[{\"name\": \"a.weight\", \"unit\": 0, \"offset\": 0, \"shape\": [2, 3]}, "
                               "{\"name\": \"a.weight\", \"unit\": 1, \"offset\": 0, \"shape\": [5]}]",
                               ZERO3_FILES_OK),
                   ACCEL_ERR_FORMAT, "sharded_index.json: \"state_dict\" names a.weight twice");
    expect_refused(ZERO3_INDEX("[{\"name\": \"a.weight\", \"unit\": 0, \"offset\": 0, \"shape\": [2, 3]}, "
                               "{\"name\": \"a.weight\", \"replicated\": true}]", ZERO3_FILES_OK),
                   ACCEL_ERR_FORMAT, "sharded_index.json: \"state_dict\" names a.weight twice");
}

/* An index of no tensors: nothing to merge is a broken index, not a
 * success (merge-weights wrote an empty model.safetensors, and
 * --remove_checkpoint_dir then deleted the shards). */
static void test_no_tensors(void) {
    expect_refused(ZERO3_INDEX("[]", ZERO3_FILES_OK), ACCEL_ERR_FORMAT,
                   "sharded_index.json: its \"state_dict\" holds no tensors: nothing to merge");
}

/* A fresh fixture folder (its index ZERO3_INDEX_OK) in dir [64]. */
static bool fresh_folder(char *dir) {
    snprintf(dir, 64, "/tmp/accel_zero3_index_XXXXXX");
    return mkdtemp(dir) && zero3_index_folder(dir) && zero3_index_write(dir, ZERO3_INDEX_OK, strlen(ZERO3_INDEX_OK));
}

static bool exists_in(const char *dir, const char *name) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void remove_folder(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* A rank file named "", ".", ".." or as the index itself: no rank file of
 * the folder ("." listed last, --remove_checkpoint_dir removed the shards
 * before it, then stopped on "Is a directory", the index pointing at
 * shards that were gone). Refused as the index opens, before anything. */
static void test_file_not_a_rank_file(void) {
    static const char *const TEXTS[] = {
        ZERO3_INDEX(ZERO3_STATE_DICT_OK, "[{\"file\": \"shard_0.safetensors\", \"ranges\": []}, "
                                         "{\"file\": \".\", \"ranges\": []}]"),
        ZERO3_INDEX(ZERO3_STATE_DICT_OK, "[{\"file\": \"\", \"ranges\": []}]"),
        ZERO3_INDEX(ZERO3_STATE_DICT_OK, "[{\"file\": \"sharded_index.json\", \"ranges\": []}]"),
    };
    for (int i = 0; i < 3; i++) {
        expect_refused(TEXTS[i], ACCEL_ERR_FORMAT, "a plain file name, not the index's");
        CHECK(accel__zero3_remove_sharded(g_dir) == ACCEL_ERR_FORMAT);
        CHECK(exists_in(g_dir, "shard_0.safetensors") && exists_in(g_dir, "shard_1.safetensors"));
    }
    accel_clear_error();
}

/* --remove_checkpoint_dir deletes the files the index names (its ranks'
 * files, replicated.safetensors, the index) and nothing else: a
 * shard_7.safetensors it does not list (another save's, a user's copy) was
 * deleted as well, though nothing of it had been merged. */
static void test_remove_only_listed(void) {
    char dir[64];
    CHECK(fresh_folder(dir));
    static const char *const NAMES[] = {"unit_0"};
    static const int64_t SIZES[] = {4};
    static const float FIRST[] = {0};
    CHECK(zero3_fixture_file(dir, "shard_7.safetensors", 1, NAMES, SIZES, FIRST));
    CHECK_MSG(accel__zero3_remove_sharded(dir) == ACCEL_OK, "%s", accel_last_error());
    CHECK(exists_in(dir, "shard_7.safetensors"));
    CHECK(!exists_in(dir, "shard_0.safetensors") && !exists_in(dir, "shard_1.safetensors"));
    CHECK(!exists_in(dir, "replicated.safetensors") && !exists_in(dir, "sharded_index.json"));
    remove_folder(dir);
}

/* A file the merge reads that is its output (merged into the checkpoint's
 * own folder, the index naming a rank file model.safetensors) or the
 * output's scratch file: refused before anything is written, the file left
 * as it was (the merge replaced that rank's file by the merged model). */
static void test_output_is_a_read_file(void) {
    static const char *const AS[] = {"model.safetensors", "model.safetensors.tmp", "pytorch_model.bin"};
    for (int k = 0; k < 3; k++) {
        char dir[64], from[160], to[160];
        CHECK(fresh_folder(dir));
        snprintf(from, sizeof from, "%s/shard_1.safetensors", dir);
        snprintf(to, sizeof to, "%s/%s", dir, AS[k]);
        CHECK(rename(from, to) == 0);
        char text[sizeof ZERO3_INDEX_OK + 32], *at;
        snprintf(text, sizeof text, "%s", ZERO3_INDEX_OK);
        CHECK((at = strstr(text, "shard_1.safetensors")) != NULL);
        if (!at) return;
        memmove(at + strlen(AS[k]), at + strlen("shard_1.safetensors"), strlen(at + strlen("shard_1.safetensors")) + 1);
        memcpy(at, AS[k], strlen(AS[k]));
        CHECK(zero3_index_write(dir, text, strlen(text)));
        struct stat before, after;
        CHECK(stat(to, &before) == 0);
        int n = 0;
        accel_status st = accel__zero3_merge(dir, dir, k == 2, &n);
        CHECK_MSG(st == ACCEL_ERR_INVALID_ARG, "%s: %d %s", AS[k], st, accel_last_error());
        CHECK_STR_CONTAINS(accel_last_error(), "merge into another folder");
        CHECK(stat(to, &after) == 0 && after.st_ino == before.st_ino && after.st_size == before.st_size);
        remove_folder(dir);
    }
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_zero3_index_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    snprintf(g_out, sizeof g_out, "%s/merged", g_dir);
    CHECK(mkdir(g_out, 0755) == 0 && zero3_index_folder(g_dir));
    RUN(test_merge);
    RUN(test_overlapping_ranges);
    RUN(test_shape_past_the_files);
    RUN(test_no_tensors);
    RUN(test_name_twice);
    RUN(test_overlapping_parameters);
    RUN(test_long_tensor_name);
    RUN(test_file_not_a_rank_file);
    RUN(test_remove_only_listed);
    RUN(test_output_is_a_read_file);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
