/* A SHARDED_STATE_DICT folder of two ranks for the ZeRO-3 index reader
 * (src/accelerator/zero3_checkpoint.c: index_open, read through
 * accel__zero3_merge, which merge-weights runs): shard_0.safetensors and
 * shard_1.safetensors each hold "unit_0" (4 f32: rank r's [4r, 4r + 4) of
 * unit 0) and "unit_1" (3 f32), replicated.safetensors holds "buf" [2].
 * ZERO3_INDEX_OK is the sharded_index.json that describes them as
 * model_index_json writes one: a.weight [2, 3] at offset 0 and a.bias [2] at
 * 6 of unit 0, b.weight [5] of unit 1 (its sixth element padding), buf
 * replicated, tied an alias of a.weight. Used by fuzz_config.c (prefix 'Z')
 * and test_zero3_index.c. */
#ifndef ACCEL_TESTS_ZERO3_INDEX_FIXTURE_H
#define ACCEL_TESTS_ZERO3_INDEX_FIXTURE_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>

#include "accel/accel.h"

/* The index of a state dict and files (JSON lists) over the fixture's two units. */
#define ZERO3_INDEX(state_dict, files)                                                                              \
    "{\"format\": \"accel.sharded_state_dict\", \"version\": 1, \"num_processes\": 2, \"shard_world_size\": 2, " \
    "\"replicated\": \"replicated.safetensors\", \"state_dict\": " state_dict ", "                               \
    "\"units\": [{\"shard\": 4, \"numel\": 8}, {\"shard\": 3, \"numel\": 6}], \"files\": " files "}"
#define ZERO3_STATE_DICT_OK                                                                                         \
    "[{\"name\": \"a.weight\", \"unit\": 0, \"offset\": 0, \"shape\": [2, 3]}, "                                \
    "{\"name\": \"a.bias\", \"unit\": 0, \"offset\": 6, \"shape\": [2]}, "                                      \
    "{\"name\": \"b.weight\", \"unit\": 1, \"offset\": 0, \"shape\": [5]}, "                                    \
    "{\"name\": \"buf\", \"replicated\": true}, {\"name\": \"tied\", \"alias_of\": \"a.weight\"}]"
#define ZERO3_FILES_OK                                                                                              \
    "[{\"file\": \"shard_0.safetensors\", \"rank\": 0, \"ranges\": ["                                             \
    "{\"unit\": 0, \"tensor\": \"unit_0\", \"lo\": 0, \"hi\": 4, \"params\": [\"a.weight\"]}, "                  \
    "{\"unit\": 1, \"tensor\": \"unit_1\", \"lo\": 0, \"hi\": 3, \"params\": [\"b.weight\"]}]}, "                \
    "{\"file\": \"shard_1.safetensors\", \"rank\": 1, \"ranges\": ["                                              \
    "{\"unit\": 0, \"tensor\": \"unit_0\", \"lo\": 4, \"hi\": 8, \"params\": [\"a.weight\", \"a.bias\"]}, "      \
    "{\"unit\": 1, \"tensor\": \"unit_1\", \"lo\": 3, \"hi\": 6, \"params\": [\"b.weight\"]}]}]"
#define ZERO3_INDEX_OK ZERO3_INDEX(ZERO3_STATE_DICT_OK, ZERO3_FILES_OK)

/* n f32 values first, first + 1, ... in buf, wrapped as a tensor [n]. */
static inline accel_tensor *zero3_fixture_tensor(float *buf, int64_t n, float first) {
    for (int64_t i = 0; i < n; i++) buf[i] = first + (float)i;
    return accel_tensor_wrap(buf, ACCEL_F32, 1, &n, ACCEL_CPU_DEVICE);
}

/* dir/file holding the tensors names[0..n) of sizes[0..n), counting up from firsts[i]. */
static inline bool zero3_fixture_file(const char *dir, const char *file, int n, const char *const *names,
                                      const int64_t *sizes, const float *firsts) {
    float buf[2][8];
    accel_tensor *ts[2] = {NULL, NULL};
    for (int i = 0; i < n; i++) ts[i] = zero3_fixture_tensor(buf[i], sizes[i], firsts[i]);
    char path[2 * PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    bool ok = ts[0] && (n < 2 || ts[1]) && accel_safetensors_save(path, n, names, ts, 0, NULL) == ACCEL_OK;
    for (int i = 0; i < n; i++) accel_tensor_free(ts[i]);
    return ok;
}

/* The shard and replicated files of the folder dir (which exists); no index. */
static inline bool zero3_index_folder(const char *dir) {
    static const char *const UNITS[] = {"unit_0", "unit_1"}, *const BUF[] = {"buf"};
    static const int64_t SIZES[] = {4, 3}, BUF_SIZE[] = {2};
    static const float RANK0[] = {0, 10}, RANK1[] = {4, 13}, BUF_FIRST[] = {100};
    return zero3_fixture_file(dir, "shard_0.safetensors", 2, UNITS, SIZES, RANK0) &&
           zero3_fixture_file(dir, "shard_1.safetensors", 2, UNITS, SIZES, RANK1) &&
           zero3_fixture_file(dir, "replicated.safetensors", 1, BUF, BUF_SIZE, BUF_FIRST);
}

/* text (n bytes) as dir/sharded_index.json. */
static inline bool zero3_index_write(const char *dir, const void *text, size_t n) {
    char path[2 * PATH_MAX];
    snprintf(path, sizeof path, "%s/sharded_index.json", dir);
    FILE *f = fopen(path, "wb");
    bool ok = f && (!n || fwrite(text, 1, n, f) == n);
    return (f ? fclose(f) == 0 : false) && ok;
}

#endif
