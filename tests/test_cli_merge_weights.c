/* `accel merge-weights`: the 8-shard transformers checkpoint in tests/data
 * merges into one model.safetensors holding the same tensors, byte for byte;
 * bad input gives a clear error. Runs build/bin/accel next to itself. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/io.h"
#include "check.h"
#include "sibling_exe.h"
#include "zero3_index_fixture.h"

static char ACCEL[PATH_MAX + 32], TMP[PATH_MAX];

/* `accel args` after the shell commands before (limits, traps), its output in TMP/out and TMP/err. */
static int run_after(const char *before, const char *args) {
    char cmd[4 * PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "%s %s %s > %s/out 2> %s/err", before, ACCEL, args, TMP, TMP);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int run(const char *args) { return run_after("", args); }

static void slurp(const char *name, char *buf, size_t n) {
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/%s", TMP, name);
    buf[0] = 0;
    FILE *f = fopen(p, "r");
    if (!f) return;
    buf[fread(buf, 1, n - 1, f)] = 0;
    fclose(f);
}

/* src (a sharded checkpoint) merged into TMP/out: the same tensors, byte for
 * byte (unsafe: --unsafe_serialization, into pytorch_model.bin). */
static void check_merge_as(const char *src_dir, const char *out, bool unsafe) {
    char args[PATH_MAX + 64], buf[4096];
    snprintf(args, sizeof args, "merge-weights %s %s/%s%s", src_dir, TMP, out, unsafe ? " --unsafe_serialization" : "");
    CHECK(run(args) == 0);
    slurp("out", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "Weights merged into");
    CHECK_STR_CONTAINS(buf, unsafe ? "pytorch_model.bin" : "model.safetensors");
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s/%s", TMP, out, unsafe ? "pytorch_model.bin" : "model.safetensors");
    accel_checkpoint *src = accel_checkpoint_open(src_dir);
    accel_safetensors *dst = accel_safetensors_open(path);
    CHECK(src && dst);
    if (!src || !dst) return;
    CHECK(accel_safetensors_count(dst) == accel_checkpoint_count(src));
    if (!unsafe) CHECK(strcmp(accel_safetensors_metadata(dst, "format"), "pt") == 0);
    for (int i = 0; i < accel_checkpoint_count(src); i++) {
        const char *name = accel_checkpoint_name(src, i);
        const accel_st_info *a = accel_checkpoint_find(src, name, NULL);
        const accel_st_info *b = accel_safetensors_find(dst, name);
        CHECK_MSG(b && a->nbytes == b->nbytes && a->dtype == b->dtype && memcmp(a->bytes, b->bytes, a->nbytes) == 0,
                  "tensor %s differs", name);
    }
    accel_safetensors_close(dst);
    accel_checkpoint_close(src);
}

static void check_merge(const char *src_dir, const char *out) {
    check_merge_as(src_dir, out, false);
    char bin_out[256];
    snprintf(bin_out, sizeof bin_out, "%s_unsafe", out);
    check_merge_as(src_dir, bin_out, true);
}

static void test_merge(void) { check_merge("data/hf_llama_sharded", "merged"); }

/* transformers' PyTorch shards (pytorch_model-0000i-of-00003.bin + pytorch_model.bin.index.json,
 * lm_head.weight tied to the embedding: one storage, two names) into model.safetensors */
static void test_merge_pytorch_bin(void) { check_merge("data/torch_load/llama_bin", "merged_bin"); }

static void test_errors(void) {
    char buf[4096];
    CHECK(run("merge-weights /nonexistent-dir /tmp/x") == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "couldn't find a valid metadata file");
    CHECK(run("merge-weights data/hf_llama_sharded") == 2);
}

static void spit(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* Issue #19: an index with an empty weight_map merged "successfully" into an
 * empty file and, with --remove_checkpoint_dir, lost the index. */
static void test_empty_weight_map(void) {
    char dir[PATH_MAX + 16], index[PATH_MAX + 64], args[3 * PATH_MAX], buf[4096];
    snprintf(dir, sizeof dir, "%s/empty", TMP);
    mkdir(dir, 0755);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    spit(index, "{\"metadata\": {}, \"weight_map\": {}}");
    snprintf(args, sizeof args, "merge-weights %s %s/out --remove_checkpoint_dir", dir, TMP);
    CHECK(run(args) == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "holds no tensors (an empty weight_map?): nothing to merge");
    CHECK(access(index, F_OK) == 0);
    snprintf(index, sizeof index, "%s/out/model.safetensors", TMP);
    CHECK(access(index, F_OK) != 0);
}

/* --remove_checkpoint_dir unlinked the shards by their bare file names, i.e.
 * relative to the current directory, not to CHECKPOINT_DIRECTORY: run from a
 * folder holding files of the same names (another checkpoint), it deleted
 * those and left the checkpoint's own shards in place. */
static void test_remove_checkpoint_dir_from_elsewhere(void) {
    char ck[PATH_MAX + 16], decoy[PATH_MAX + 16], cmd[8 * PATH_MAX], path[2 * PATH_MAX];
    snprintf(ck, sizeof ck, "%s/ck", TMP);
    snprintf(decoy, sizeof decoy, "%s/decoy", TMP);
    snprintf(cmd, sizeof cmd, "cp -r data/hf_llama_sharded %s && mkdir -p %s", ck, decoy);
    CHECK(system(cmd) == 0);
    accel_checkpoint *src = accel_checkpoint_open(ck);
    CHECK(src != NULL);
    if (!src) return;
    int shards = accel_checkpoint_num_shards(src);
    CHECK(shards == 8);
    for (int i = 0; i < shards; i++) {
        snprintf(path, sizeof path, "%s/%s", decoy, accel_checkpoint_shard_path(src, i));
        spit(path, "another checkpoint's shard");
    }
    snprintf(cmd, sizeof cmd, "cd %s && %s merge-weights %s %s/removed --remove_checkpoint_dir > %s/out 2> %s/err",
             decoy, ACCEL, ck, TMP, TMP, TMP);
    CHECK(system(cmd) == 0);
    for (int i = 0; i < shards; i++) {
        snprintf(path, sizeof path, "%s/%s", decoy, accel_checkpoint_shard_path(src, i));
        CHECK_MSG(access(path, F_OK) == 0, "%s (in the current directory) was deleted", path);
        snprintf(path, sizeof path, "%s/%s", ck, accel_checkpoint_shard_path(src, i));
        CHECK_MSG(access(path, F_OK) != 0, "%s (the checkpoint's shard) was not deleted", path);
    }
    accel_checkpoint_close(src);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", ck);
    CHECK(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/removed/model.safetensors", TMP);
    accel_safetensors *out = accel_safetensors_open(path);
    CHECK(out && accel_safetensors_count(out) > 0);
    accel_safetensors_close(out);
}

/* A folder's single model.safetensors merged into that same folder with
 * --remove_checkpoint_dir: the "shard" is the merged file, which must stay. */
static void test_remove_keeps_the_merged_file(void) {
    char ck[PATH_MAX + 16], cmd[3 * PATH_MAX + 64], path[PATH_MAX + 64];
    snprintf(ck, sizeof ck, "%s/single", TMP);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp data/st_small.safetensors %s/model.safetensors", ck, ck);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s --remove_checkpoint_dir", ck, ck);
    CHECK(run(cmd) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st && accel_safetensors_count(st) > 0, "%s was removed after merging into it", path);
    accel_safetensors_close(st);
}

/* A folder holding the index and its shards and also a model.safetensors
 * (another model, or an older merge): merge-weights merged that
 * model.safetensors instead of the sharded checkpoint, and with
 * --remove_checkpoint_dir deleted it and the index, leaving the shards
 * without their index. The index's shards are what is merged. */
static void test_index_beside_a_single_file(void) {
    char ck[PATH_MAX + 16], cmd[4 * PATH_MAX], path[PATH_MAX + 64];
    snprintf(ck, sizeof ck, "%s/both", TMP);
    snprintf(cmd, sizeof cmd, "cp -r data/hf_llama_sharded %s && cp data/st_small.safetensors %s/model.safetensors",
             ck, ck);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", ck);
    accel_checkpoint *src = accel_checkpoint_open(path);
    CHECK(src != NULL);
    if (!src) return;
    int want = accel_checkpoint_count(src);
    accel_checkpoint_close(src);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s/both_out --remove_checkpoint_dir", ck, TMP);
    CHECK(run(cmd) == 0);
    snprintf(path, sizeof path, "%s/both_out/model.safetensors", TMP);
    accel_safetensors *out = accel_safetensors_open(path);
    CHECK_MSG(out && accel_safetensors_count(out) == want, "merged %d tensors, the index lists %d",
              out ? accel_safetensors_count(out) : -1, want);
    accel_safetensors_close(out);
    /* the other model.safetensors is not the sharded checkpoint's: left in place, said so */
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    CHECK_MSG(access(path, F_OK) == 0, "%s (not a shard) was deleted", path);
    char buf[4096];
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "model.safetensors is not one of the index's shards: merging the shards of ");
    CHECK_STR_CONTAINS(buf, ", leaving it as it is");
    /* merged into that folder (a fresh copy: the shards above are removed), it is the output: the note
     * says it is replaced, and it is */
    snprintf(ck, sizeof ck, "%s/both_again", TMP);
    snprintf(cmd, sizeof cmd, "cp -r data/hf_llama_sharded %s && cp data/st_small.safetensors %s/model.safetensors",
             ck, ck);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s", ck, ck);
    CHECK(run(cmd) == 0);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "model.safetensors is not one of the index's shards: the merge of the shards of ");
    accel_safetensors *merged = accel_safetensors_open(path);
    CHECK(merged && accel_safetensors_count(merged) == want);
    accel_safetensors_close(merged);
    /* --unsafe_serialization into that folder beside an older pytorch_model.bin: the note says the
     * merge replaces it, and that the model.safetensors (not the output) is left as it is */
    snprintf(ck, sizeof ck, "%s/both_bin", TMP);
    snprintf(cmd, sizeof cmd, "cp -r data/hf_llama_sharded %s && cp data/st_small.safetensors %s/model.safetensors && "
             "echo old > %s/pytorch_model.bin", ck, ck, ck);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s --unsafe_serialization", ck, ck);
    CHECK(run(cmd) == 0);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "pytorch_model.bin is not one of the index's shards: the merge of the shards of ");
    CHECK_STR_CONTAINS(buf, "model.safetensors is not one of the index's shards: merging the shards of ");
}

/* Two indexes of other names beside a model.safetensors: loading's "more
 * than one .index.json" error, nothing written or removed (the
 * model.safetensors was opened and merged instead, and
 * --remove_checkpoint_dir deleted it). */
static void test_two_indexes_beside_a_single_file(void) {
    char ck[PATH_MAX + 16], cmd[8 * PATH_MAX], path[PATH_MAX + 64], buf[4096];
    snprintf(ck, sizeof ck, "%s/two_ix", TMP);
    snprintf(cmd, sizeof cmd, "cp -r data/hf_llama_sharded %s && cp data/st_small.safetensors %s/model.safetensors && "
             "mv %s/model.safetensors.index.json %s/a.index.json && cp %s/a.index.json %s/b.index.json",
             ck, ck, ck, ck, ck, ck);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s/two_ix_out --remove_checkpoint_dir", ck, TMP);
    CHECK(run(cmd) == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "containing more than one `.index.json` file, delete the irrelevant ones.");
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    CHECK_MSG(access(path, F_OK) == 0, "%s was deleted", path);
    snprintf(path, sizeof path, "%s/two_ix_out", TMP);
    CHECK_MSG(access(path, F_OK) != 0, "%s was written", path);
}

/* A copy of the sharded fixture in TMP/name whose index, named `index`,
 * does not list model.layers.0.mlp.down_proj.weight (its shard 3 still
 * listed for the other tensors it holds), merged with
 * --remove_checkpoint_dir: refused naming the tensor, nothing written or
 * removed. The checkpoint's folder into ck. */
static void unlisted_tensor_refused(const char *name, const char *index, char *ck, size_t n) {
    char cmd[8 * PATH_MAX], path[PATH_MAX + 64], buf[4096];
    snprintf(ck, n, "%s/%s", TMP, name);
    snprintf(cmd, sizeof cmd, "cp -r data/hf_llama_sharded %s && mv %s/model.safetensors.index.json %s/%s.tmp && "
             "mv %s/%s.tmp %s/%s && sed -i '/model.layers.0.mlp.down_proj.weight/d' %s/%s", ck, ck, ck, index, ck,
             index, ck, index, ck, index);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s/%s_out --remove_checkpoint_dir", ck, TMP, name);
    CHECK(run(cmd) == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "model-00003-of-00008.safetensors holds tensor 'model.layers.0.mlp.down_proj.weight', "
                            "which the index does not list");
    snprintf(path, sizeof path, "%s/%s_out/model.safetensors", TMP, name);
    CHECK_MSG(access(path, F_OK) != 0, "%s was written", path);
    snprintf(path, sizeof path, "%s/model-00003-of-00008.safetensors", ck);
    CHECK_MSG(access(path, F_OK) == 0, "%s was removed", path);
}

/* A shard holding a tensor its index does not list (a hand-edited or stale
 * index): the merge dropped it without a word (transformers loads every
 * tensor of a shard), and --remove_checkpoint_dir then deleted the only
 * copy. */
static void test_tensor_missing_from_index(void) {
    char ck[PATH_MAX + 16];
    unlisted_tensor_refused("unlisted", "model.safetensors.index.json", ck, sizeof ck);
}

/* The same for an index of another name (diffusers' diffusion_pytorch_model.safetensors.index.json);
 * with the tensor listed again, the merge removes that index with its shards (it was left pointing at
 * deleted shards). */
static void test_index_of_another_name(void) {
    char ck[PATH_MAX + 16], cmd[8 * PATH_MAX], path[PATH_MAX + 64];
    const char *index = "diffusion_pytorch_model.safetensors.index.json";
    unlisted_tensor_refused("diffusers", index, ck, sizeof ck);
    snprintf(cmd, sizeof cmd, "cp data/hf_llama_sharded/model.safetensors.index.json %s/%s", ck, index);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s/diffusers_out --remove_checkpoint_dir", ck, TMP);
    CHECK_MSG(run(cmd) == 0, "merge of the intact checkpoint failed");
    snprintf(path, sizeof path, "%s/%s", ck, index);
    CHECK_MSG(access(path, F_OK) != 0, "%s was left behind, its shards removed", path);
}

/* A tensor the index places in another shard: a second copy there (which
 * one would the merge keep?), or none (a stale index). Both refused by name,
 * nothing written or removed. */
static void expect_refused(const char *ck, const char *want) {
    char cmd[4 * PATH_MAX], path[PATH_MAX + 64], buf[4096];
    snprintf(cmd, sizeof cmd, "merge-weights %s %s/other_shard_out --remove_checkpoint_dir", ck, TMP);
    CHECK(run(cmd) == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, want);
    snprintf(path, sizeof path, "%s/other_shard_out/model.safetensors", TMP);
    CHECK_MSG(access(path, F_OK) != 0, "%s was written", path);
    snprintf(path, sizeof path, "%s/model-00003-of-00008.safetensors", ck);
    CHECK_MSG(access(path, F_OK) == 0, "%s was removed", path);
}

static void test_tensor_in_another_shard(void) {
    static const char *const DOWN = "model.layers.0.mlp.down_proj.weight";
    char ck[PATH_MAX + 16], cmd[8 * PATH_MAX], path[PATH_MAX + 64];
    snprintf(ck, sizeof ck, "%s/other_shard", TMP);
    snprintf(cmd, sizeof cmd, "cp -r data/hf_llama_sharded %s", ck);
    CHECK(system(cmd) == 0);
    /* shard 2 rewritten with its own tensors and a copy of shard 3's down_proj */
    accel_safetensors *two = accel_safetensors_open("data/hf_llama_sharded/model-00002-of-00008.safetensors");
    accel_safetensors *three = accel_safetensors_open("data/hf_llama_sharded/model-00003-of-00008.safetensors");
    int n = two ? accel_safetensors_count(two) : 0;
    CHECK(two && three && n > 0 && n < 16);
    if (!two || !three || n <= 0 || n >= 16) return;
    const char *names[16];
    accel_tensor *ts[16];
    for (int i = 0; i < n; i++) {
        names[i] = accel_safetensors_at(two, i)->name;
        ts[i] = accel_safetensors_tensor(two, names[i], -1);
    }
    names[n] = DOWN;
    ts[n] = accel_safetensors_tensor(three, DOWN, -1);
    snprintf(path, sizeof path, "%s/model-00002-of-00008.safetensors", ck);
    CHECK(accel_safetensors_save(path, n + 1, names, ts, 0, NULL) == ACCEL_OK);
    for (int i = 0; i <= n; i++) accel_tensor_free(ts[i]);
    accel_safetensors_close(two);
    accel_safetensors_close(three);
    expect_refused(ck, "model-00002-of-00008.safetensors holds tensor 'model.layers.0.mlp.down_proj.weight', which "
                       "the index places in model-00003-of-00008.safetensors: two copies; keep one");
    /* shard 2 as it was, and the index moved to it: shard 3's copy is the only one */
    snprintf(cmd, sizeof cmd, "cp data/hf_llama_sharded/model-00002-of-00008.safetensors %s/ && "
             "sed -i '/%s/s/00003-of/00002-of/' %s/model.safetensors.index.json", ck, DOWN, ck);
    CHECK(system(cmd) == 0);
    expect_refused(ck, "model-00003-of-00008.safetensors holds tensor 'model.layers.0.mlp.down_proj.weight', which "
                       "the index places in model-00002-of-00008.safetensors, which does not hold it: fix the index");
}

/* An output folder whose name leaves no room for "/model.safetensors" within PATH_MAX: refused by
 * name, where the cut name (".../model.saf") was written as another file. */
static void test_output_path_too_long(void) {
    char out[4200], cmd[8 * PATH_MAX], buf[4096];
    int n = snprintf(out, sizeof out, "%s", TMP);
    while (n + 201 <= 4085 - 2) n += snprintf(out + n, sizeof out - (size_t)n, "/%0200d", 0);
    out[n++] = '/'; /* a last folder of 1 to 201 characters, to 4085 in all */
    while (n < 4085) out[n++] = 'e';
    out[n] = 0;
    for (char *p = out + strlen(TMP) + 1;; p++) { /* mkdir -p */
        if (*p && *p != '/') continue;
        char c = *p;
        *p = 0;
        CHECK(mkdir(out, 0755) == 0 || errno == EEXIST);
        *p = c;
        if (!c) break;
    }
    CHECK(strlen(out) == 4085);
    snprintf(cmd, sizeof cmd, "merge-weights data/hf_llama_sharded %s", out);
    CHECK(run(cmd) == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "/model.safetensors is longer than 4095 bytes");
    DIR *d = opendir(out);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));) entries += e->d_name[0] != '.';
    if (d) closedir(d);
    CHECK_MSG(entries == 0, "the output folder holds %d files", entries);
}

/* Every argument is parsed, however many: the parser kept the first 63 and dropped the rest unseen, so a
 * misspelt flag after them merged as if absent (exit 0), and --remove_checkpoint_dir after them was ignored. */
static void test_many_arguments(void) {
    char args[4096], buf[4096];
    int n = snprintf(args, sizeof args, "merge-weights data/hf_llama_sharded %s/many", TMP);
    for (int i = 0; i < 70; i++) n += snprintf(args + n, sizeof args - (size_t)n, " --unsafe_serialization");
    snprintf(args + n, sizeof args - (size_t)n, " --remove_checkpint_dir");
    CHECK(run(args) == 2);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "unrecognized arguments: --remove_checkpint_dir");
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/many", TMP);
    CHECK_MSG(access(out, F_OK) != 0, "%s was written", out);
}

/* A merge whose write fails (a full disk; here a file size limit of 512 bytes, the signal ignored so that
 * write says EFBIG) leaves nothing behind: the OUTPUT_PATH it made is removed, and one that existed (empty,
 * or with the model.safetensors already in it) is left as it was. */
static void test_failed_write_leaves_no_trace(void) {
    const char *limit = "trap '' XFSZ; ulimit -f 1;";
    char args[3 * PATH_MAX], out[PATH_MAX + 16], file[PATH_MAX + 64], buf[4096];
    snprintf(out, sizeof out, "%s/no_trace", TMP);
    snprintf(args, sizeof args, "merge-weights data/hf_llama_sharded %s", out);
    CHECK(run_after(limit, args) == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "model.safetensors.tmp: File too large");
    CHECK_MSG(access(out, F_OK) != 0, "the failed merge left %s", out);
    snprintf(out, sizeof out, "%s/kept_empty", TMP); /* the user's, empty: kept */
    CHECK(mkdir(out, 0755) == 0);
    snprintf(args, sizeof args, "merge-weights data/hf_llama_sharded %s", out);
    CHECK(run_after(limit, args) == 1);
    CHECK_MSG(access(out, F_OK) == 0, "the failed merge removed %s", out);
    snprintf(out, sizeof out, "%s/kept", TMP);
    CHECK(mkdir(out, 0755) == 0);
    snprintf(file, sizeof file, "%s/model.safetensors", out);
    spit(file, "the model merged yesterday");
    snprintf(args, sizeof args, "merge-weights data/hf_llama_sharded %s --unsafe_serialization", out);
    CHECK(run_after(limit, args) == 1);
    snprintf(args, sizeof args, "merge-weights data/hf_llama_sharded %s", out);
    CHECK(run_after(limit, args) == 1);
    FILE *f = fopen(file, "r");
    buf[0] = 0;
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
        fclose(f);
    }
    CHECK_MSG(strcmp(buf, "the model merged yesterday") == 0, "%s now holds %.40s", file, buf);
    snprintf(file, sizeof file, "%s/pytorch_model.bin", out);
    CHECK_MSG(access(file, F_OK) != 0, "the failed merge left %s", file);
}

/* data/hf_llama_sharded copied to TMP/name (its path into ck), then edited there by the shell commands. */
static void copy_edited(const char *name, const char *edit, char *ck, size_t n) {
    char cmd[4 * PATH_MAX];
    snprintf(ck, n, "%s/%s", TMP, name);
    snprintf(cmd, sizeof cmd, "cp -r data/hf_llama_sharded %s && cd %s && %s", ck, ck, edit);
    CHECK_MSG(system(cmd) == 0, "%s", cmd);
}

/* A shard that is a symbolic link to itself is not "missing": the error says why it cannot be read. */
static void test_shard_link_loop(void) {
    char ck[PATH_MAX + 16], cmd[4 * PATH_MAX], buf[4096];
    copy_edited("link_loop", "rm model-00004-of-00008.safetensors && "
                "ln -s model-00004-of-00008.safetensors model-00004-of-00008.safetensors", ck, sizeof ck);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s/link_loop_out", ck, TMP);
    CHECK(run(cmd) == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "shard 'model-00004-of-00008.safetensors' cannot be read: ");
    CHECK(strstr(buf, "is missing") == NULL);
}

/* A shard named as the merge's scratch file (model.safetensors.tmp, merged into its own folder): refused,
 * the shard untouched. The writer truncated it as a stale scratch file of its own: four tensors merged
 * as zeros, exit 0, and the shard renamed into the merged file, the checkpoint left without it. */
static void test_shard_named_as_the_scratch_file(void) {
    char ck[PATH_MAX + 16], cmd[4 * PATH_MAX], buf[4096];
    copy_edited("scratch", "mv model-00004-of-00008.safetensors model.safetensors.tmp && "
                "sed -i s/model-00004-of-00008.safetensors/model.safetensors.tmp/ model.safetensors.index.json",
                ck, sizeof ck);
    snprintf(cmd, sizeof cmd, "merge-weights %s %s", ck, ck);
    CHECK(run(cmd) == 1);
    slurp("err", buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "/model.safetensors.tmp is the merge's scratch file ");
    snprintf(cmd, sizeof cmd, "cmp -s data/hf_llama_sharded/model-00004-of-00008.safetensors %s/model.safetensors.tmp && "
             "test ! -e %s/model.safetensors", ck, ck);
    CHECK_MSG(system(cmd) == 0, "the shard %s/model.safetensors.tmp was changed, or a merged file written", ck);
}

/* TMP/name/pytorch_model_fsdp_<i> for i < n: the ZeRO-3 fixture folder
 * (tests/zero3_index_fixture.h) with its index, as a save_state of n models. */
static bool zero3_checkpoint(const char *name, int n, const char *index) {
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/%s", TMP, name);
    bool ok = mkdir(dir, 0755) == 0;
    for (int i = 0; i < n && ok; i++) {
        char sub[PATH_MAX + 96];
        snprintf(sub, sizeof sub, "%s/pytorch_model_fsdp_%d", dir, i);
        ok = mkdir(sub, 0755) == 0 && zero3_index_folder(sub) && zero3_index_write(sub, index, strlen(index));
    }
    return ok;
}

/* A save_state of two models: merge-weights merges model 0 (as it finds the
 * folder) and names the other, which it merged nothing of without a word. */
static void test_zero3_second_model_named(void) {
    CHECK(zero3_checkpoint("two_models", 2, ZERO3_INDEX_OK));
    char args[3 * PATH_MAX], err[4096];
    snprintf(args, sizeof args, "merge-weights %s/two_models %s/two_models_out", TMP, TMP);
    CHECK(run(args) == 0);
    slurp("err", err, sizeof err);
    CHECK_STR_CONTAINS(err, "accel merge-weights: note: ");
    CHECK_STR_CONTAINS(err, "two_models/pytorch_model_fsdp_1 (model 1 of the checkpoint) is not merged");
    CHECK(run(args) == 0); /* one model: no word */
    CHECK(zero3_checkpoint("one_model", 1, ZERO3_INDEX_OK));
    snprintf(args, sizeof args, "merge-weights %s/one_model %s/one_model_out", TMP, TMP);
    CHECK(run(args) == 0);
    slurp("err", err, sizeof err);
    CHECK_MSG(!strstr(err, "note"), "%s", err);
}

/* An index of no tensors with --remove_checkpoint_dir: exit 1, its files left. */
static void test_zero3_nothing_to_merge(void) {
    const char *empty = ZERO3_INDEX("[]", ZERO3_FILES_OK);
    CHECK(zero3_checkpoint("no_tensors", 1, empty));
    char args[3 * PATH_MAX], err[4096], shard[PATH_MAX + 96];
    snprintf(args, sizeof args, "merge-weights %s/no_tensors %s/no_tensors_out --remove_checkpoint_dir", TMP, TMP);
    CHECK(run(args) == 1);
    slurp("err", err, sizeof err);
    CHECK_STR_CONTAINS(err, "holds no tensors: nothing to merge");
    snprintf(shard, sizeof shard, "%s/no_tensors/pytorch_model_fsdp_0/shard_0.safetensors", TMP);
    CHECK(access(shard, F_OK) == 0);
    snprintf(shard, sizeof shard, "%s/no_tensors_out", TMP);
    CHECK(access(shard, F_OK) != 0);
}

/* A folder holding the rank files and a completion marker of its own (no
 * save_state lays a checkpoint out so, but a marker there lists those
 * files): --remove_checkpoint_dir removes the marker with them, before them,
 * and then the folder, as Accelerate's rmtree removes it; the marker was
 * left listing the removed files, and the folder with it. */
static void test_zero3_own_marker_removed(void) {
    char dir[PATH_MAX + 64], marker[PATH_MAX + 96], args[3 * PATH_MAX];
    snprintf(dir, sizeof dir, "%s/own_marker", TMP);
    CHECK(mkdir(dir, 0755) == 0 && zero3_index_folder(dir) &&
          zero3_index_write(dir, ZERO3_INDEX_OK, strlen(ZERO3_INDEX_OK)));
    snprintf(marker, sizeof marker, "%s/accel_checkpoint.json", dir);
    spit(marker, "{\"files\": {}}"); /* sizes only (a marker from before checksums), listing nothing */
    snprintf(args, sizeof args, "merge-weights %s %s/own_marker_out --remove_checkpoint_dir", dir, TMP);
    CHECK(run(args) == 0);
    CHECK_MSG(access(dir, F_OK) != 0, "%s is still there", dir);
}

/* The sharded fixture's index and shards copied into TMP/sub. */
static bool add_hf_shards(const char *sub) {
    char cmd[2 * PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "cp data/hf_llama_sharded/* %s/%s/", TMP, sub);
    return system(cmd) == 0;
}

/* A save_state folder holding a ZeRO-3 model (pytorch_model_fsdp_0/) and
 * also a Hugging Face index with its shards (save_model into the same
 * folder): the rank shards were merged without a word, and
 * --remove_checkpoint_dir removed them. Refused naming both and how to
 * choose, nothing written or removed; the model's folder given itself is
 * merged. The model's folder holding an index too is refused the same way. */
static void test_zero3_beside_hf_index(void) {
    CHECK(zero3_checkpoint("z3_and_hf", 1, ZERO3_INDEX_OK));
    char cmd[4 * PATH_MAX], err[4096], path[PATH_MAX + 96];
    CHECK(add_hf_shards("z3_and_hf"));
    snprintf(cmd, sizeof cmd, "merge-weights %s/z3_and_hf %s/z3_and_hf_out --remove_checkpoint_dir", TMP, TMP);
    CHECK(run(cmd) == 1);
    slurp("err", err, sizeof err);
    CHECK_STR_CONTAINS(err, "z3_and_hf holds two sharded checkpoints: ZeRO-3 rank shards (");
    CHECK_STR_CONTAINS(err, "z3_and_hf/pytorch_model_fsdp_0/sharded_index.json) and a Hugging Face index (");
    CHECK_STR_CONTAINS(err, "z3_and_hf/model.safetensors.index.json); give ");
    CHECK_STR_CONTAINS(err, "z3_and_hf/pytorch_model_fsdp_0 to merge the rank shards, or move the index and its "
                            "shards to a folder of their own to merge those");
    snprintf(path, sizeof path, "%s/z3_and_hf/pytorch_model_fsdp_0/sharded_index.json", TMP);
    CHECK_MSG(access(path, F_OK) == 0, "%s was removed", path);
    snprintf(path, sizeof path, "%s/z3_and_hf_out", TMP);
    CHECK_MSG(access(path, F_OK) != 0, "%s was written", path);
    snprintf(cmd, sizeof cmd, "merge-weights %s/z3_and_hf/pytorch_model_fsdp_0 %s/z3_and_hf_out", TMP, TMP);
    CHECK(run(cmd) == 0);
    /* both in the model's own folder: move one */
    CHECK(add_hf_shards("z3_and_hf/pytorch_model_fsdp_0"));
    snprintf(cmd, sizeof cmd, "merge-weights %s/z3_and_hf/pytorch_model_fsdp_0 %s/z3_and_hf_out2", TMP, TMP);
    CHECK(run(cmd) == 1);
    slurp("err", err, sizeof err);
    CHECK_STR_CONTAINS(err, "pytorch_model_fsdp_0/model.safetensors.index.json); move one of them, with its files, "
                            "to a folder of its own and merge that folder");
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL)) return 1;
    snprintf(TMP, sizeof TMP, "/tmp/accel_merge_XXXXXX");
    if (!mkdtemp(TMP)) return 1;
    RUN(test_merge);
    RUN(test_merge_pytorch_bin);
    RUN(test_errors);
    RUN(test_empty_weight_map);
    RUN(test_remove_checkpoint_dir_from_elsewhere);
    RUN(test_remove_keeps_the_merged_file);
    RUN(test_index_beside_a_single_file);
    RUN(test_two_indexes_beside_a_single_file);
    RUN(test_tensor_missing_from_index);
    RUN(test_index_of_another_name);
    RUN(test_tensor_in_another_shard);
    RUN(test_output_path_too_long);
    RUN(test_many_arguments);
    RUN(test_failed_write_leaves_no_trace);
    RUN(test_shard_link_loop);
    RUN(test_shard_named_as_the_scratch_file);
    RUN(test_zero3_second_model_named);
    RUN(test_zero3_nothing_to_merge);
    RUN(test_zero3_beside_hf_index);
    RUN(test_zero3_own_marker_removed);
    char rm[PATH_MAX + 16];
    snprintf(rm, sizeof rm, "rm -rf %s", TMP);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", TMP);
    return check_summary();
}
