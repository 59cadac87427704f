/* src/cli/cli_merge_weights.c — `accel merge-weights CHECKPOINT_DIRECTORY OUTPUT_PATH`.
 *
 * Accelerate's merge-weights turns a sharded checkpoint into one
 * `model.safetensors`. accel's sharded checkpoints are safetensors shards with
 * the Hub's `model.safetensors.index.json` (written by save_model and
 * save_pretrained, or by transformers), or PyTorch's pytorch_model-*.bin
 * shards with pytorch_model.bin.index.json: this merges them into
 * OUTPUT_PATH/model.safetensors, tensors in the index's order, straight from
 * the mapped shards (no copy of a shard is made in memory). A ZeRO-3 / FSDP
 * SHARDED_STATE_DICT checkpoint (a save_state directory holding
 * pytorch_model_fsdp_0/, or that directory itself: per-rank flat shards and
 * sharded_index.json) is merged the way Accelerate's merge-weights does for
 * FSDP: the full model, Hugging Face names, one parameter at a time. A
 * save_state directory's files are first checked against its completion
 * marker (sizes and CRC-32C): a corrupted checkpoint is refused, naming the
 * file, rather than merged into a different model. `--unsafe_serialization`
 * writes pytorch_model.bin (torch.save's format) instead. The write is
 * atomic; `--remove_checkpoint_dir` deletes the shards and the index only
 * after it succeeded. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/io.h"
#include "accelerator/accelerator_internal.h"
#include "cli/cli.h"
#include "io/checkpoint_marker.h"
#include "io/io_internal.h"

/* Whether the merge's scratch file (the atomic writer's, core/afile.h: written, then renamed over
 * path), is one of the shards it reads: the writer never takes a file of that name it did not
 * create (its own carry a mark until renamed), but it would refuse the shard only once the merge had read
 * every tensor; before that mark it emptied the shard under the merge and renamed it away. Refused here
 * first, naming the shard and what to do. Error set naming it (or path, when its links loop). */
static bool scratch_is_a_shard(accel_checkpoint *ck, const char *dir, const char *path) {
    char target[4096], scratch[4096 + 8], shard[8192];
    if (accel__afile_target(path, target, sizeof target) || accel__afile_scratch(target, scratch, sizeof scratch))
        return true;
    for (int i = 0; i < accel_checkpoint_num_shards(ck); i++) {
        snprintf(shard, sizeof shard, "%s/%s", dir, accel_checkpoint_shard_path(ck, i));
        if (accel__same_file(shard, scratch)) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "the shard %s is the merge's scratch file %s (written, then "
                            "renamed to %s): rename the shard (and its index entries) or merge into another folder",
                            shard, scratch, path);
            return true;
        }
    }
    return false;
}

/* The shards are named relative to dir (the index's folder), not to the
 * current directory. The merged file itself is never removed: merging a
 * folder's model.safetensors into that folder leaves it in place. index: the
 * index merged, NULL for a single model.safetensors (no index of it to
 * remove). */
static int remove_shards(accel_checkpoint *ck, const char *dir, const char *index, const char *merged) {
    int n = accel_checkpoint_num_shards(ck);
    for (int i = 0; i < n; i++) {
        char shard[8192];
        snprintf(shard, sizeof shard, "%s/%s", dir, accel_checkpoint_shard_path(ck, i));
        if (accel__same_file(shard, merged)) continue;
        if (unlink(shard) != 0 && errno != ENOENT) {
            fprintf(stderr, "accel merge-weights: cannot remove %s: %s\n", shard, strerror(errno));
            return 1;
        }
    }
    if (index) unlink(index);
    if (rmdir(dir) != 0 && errno != ENOTEMPTY && errno != EEXIST)
        fprintf(stderr, "accel merge-weights: note: %s not removed: %s\n", dir, strerror(errno));
    return 0;
}

/* Whether dir holds an index (model.safetensors.index.json, or the one
 * `.index.json` of another name, diffusers' diffusion_pytorch_model... say,
 * as loading finds it; its path into index): the sharded checkpoint to
 * merge. Loading prefers a model.safetensors beside it
 * (accel_checkpoint_open, as transformers), but merging that one instead
 * wrote another model than the shards', and --remove_checkpoint_dir then
 * deleted it and the index, the shards left without one. Two or more
 * indexes (none model.safetensors.index.json): loading's error, said here,
 * -1 (a model.safetensors beside them was opened and merged instead, and
 * --remove_checkpoint_dir deleted it). */
static int has_index(const char *dir, char *index, size_t n) {
    snprintf(index, n, "%s/model.safetensors.index.json", dir);
    if (accel__is_file(index)) return 1;
    int count;
    char *found = accel__checkpoint_find_index(dir, &count);
    accel_clear_error(); /* a folder that cannot be listed: loading says so */
    bool one = count == 1 && (size_t)snprintf(index, n, "%s", found) < n && accel__is_file(index);
    accel_free(found);
    if (count > 1)
        fprintf(stderr, "accel merge-weights: error: %s containing more than one `.index.json` file, delete the "
                        "irrelevant ones.\n", dir);
    return count > 1 ? -1 : one;
}

/* The merged file's name: Accelerate's, safetensors unless --unsafe_serialization. */
static const char *merged_name(bool unsafe) { return unsafe ? "pytorch_model.bin" : "model.safetensors"; }

/* A single-file model (model.safetensors, or pytorch_model.bin where that is
 * the output) beside the index that is none of its shards is left alone,
 * said in a note; where it is the output (merged into the same folder) the
 * note says it is replaced. */
static void note_single(accel_checkpoint *ck, const char *dir, const char *index, const char *out_dir, bool unsafe) {
    const char *names[] = {"model.safetensors", merged_name(unsafe)};
    char out[4096];
    snprintf(out, sizeof out, "%s/%s", out_dir, merged_name(unsafe));
    for (int k = 0; k < (unsafe ? 2 : 1); k++) {
        char single[4096];
        snprintf(single, sizeof single, "%s/%s", dir, names[k]);
        bool shard = false;
        for (int i = 0; i < accel_checkpoint_num_shards(ck) && !shard; i++)
            shard = !strcmp(accel_checkpoint_shard_path(ck, i), names[k]);
        if (shard || !accel__is_file(single)) continue;
        if (accel__same_file(single, out))
            fprintf(stderr, "accel merge-weights: note: %s is not one of the index's shards: the merge of the shards "
                            "of %s replaces it\n", single, index);
        else
            fprintf(stderr, "accel merge-weights: note: %s is not one of the index's shards: merging the shards of "
                            "%s, leaving it as it is\n", single, index);
    }
}

/* Every tensor of every shard is one the index places there. A tensor the
 * index does not list was dropped from the merge (transformers loads every
 * tensor of a shard: another model) and, with --remove_checkpoint_dir,
 * deleted with its shard; one the index places in another shard is a second
 * copy that may differ. 1 after naming it. */
static int check_shards(accel_checkpoint *ck, const char *dir) {
    for (int s = 0; s < accel_checkpoint_num_shards(ck); s++) {
        accel_safetensors *st = accel_checkpoint_shard(ck, s);
        if (!st) {
            fprintf(stderr, "accel merge-weights: error: %s\n", accel_last_error());
            return 1;
        }
        for (int i = 0; i < accel_safetensors_count(st); i++) {
            const char *name = accel_safetensors_at(st, i)->name;
            int at = accel_checkpoint_shard_of(ck, name);
            if (at == s) continue;
            if (at < 0)
                fprintf(stderr, "accel merge-weights: error: %s/%s holds tensor '%s', which the index does not "
                                "list: merging would drop it; add it to the index's weight_map\n", dir,
                        accel_checkpoint_shard_path(ck, s), name);
            else {
                accel_safetensors *other = accel_checkpoint_shard(ck, at);
                fprintf(stderr, "accel merge-weights: error: %s/%s holds tensor '%s', which the index places in "
                                "%s%s\n", dir, accel_checkpoint_shard_path(ck, s), name,
                        accel_checkpoint_shard_path(ck, at),
                        !other ? "" : accel_safetensors_find(other, name) ? ": two copies; keep one"
                                                                          : ", which does not hold it: fix the index");
            }
            return 1;
        }
    }
    return 0;
}

/* The save_state checkpoint whose marker lists the sharded model's files
 * (those under sub): dir, or, for a pytorch_model_fsdp_<i>/ given itself, its
 * parent, into at, and the model's folder there into only ("": dir itself
 * holds both the marker and the rank files, and the marker's every file is
 * checked); both 4096 bytes. false when neither has a marker. */
static bool checkpoint_of(const char *dir, const char *sub, char *at, char *only) {
    char marker[8192];
    snprintf(at, 4096, "%s", dir);
    size_t n = strlen(at);
    while (n > 1 && at[n - 1] == '/') at[--n] = 0;
    snprintf(marker, sizeof marker, "%s/%s", at, ACCEL__MARKER);
    if (accel__is_file(marker)) {
        snprintf(only, 4096, "%s", strcmp(sub, dir) ? sub + strlen(dir) + 1 : ""); /* "pytorch_model_fsdp_0" */
        return true;
    }
    char *slash = strrchr(at, '/');
    snprintf(only, 4096, "%s", slash ? slash + 1 : at);
    if (!slash) snprintf(at, 4096, ".");
    else if (slash == at) at[1] = 0;
    else *slash = 0;
    snprintf(marker, sizeof marker, "%s/%s", at, ACCEL__MARKER);
    return accel__is_file(marker);
}

/* The files merged, those under sub, checked against the marker of the
 * save_state checkpoint holding them (checkpoint_of). 0 when intact or when
 * there is no marker. */
static int verify_marker(const char *dir, const char *sub) {
    char at[4096], only[4096];
    if (!checkpoint_of(dir, sub, at, only)) return 0;
    if (accel__marker_check(at, true, *only ? only : NULL, "accel merge-weights") == ACCEL_OK) return 0;
    fprintf(stderr, "accel merge-weights: error: %s\n", accel_last_error());
    return 1;
}

/* A save_state directory merged through its model.safetensors (or an index
 * and shards): those files are checked against its marker. */
static int verify_files(const char *dir, accel_checkpoint *ck) {
    char marker[8192];
    snprintf(marker, sizeof marker, "%s/%s", dir, ACCEL__MARKER);
    if (!accel__is_file(marker)) return 0;
    accel_status st = accel__marker_check(dir, true, "model.safetensors.index.json", "accel merge-weights");
    for (int i = 0; !st && i < accel_checkpoint_num_shards(ck); i++)
        st = accel__marker_check(dir, true, accel_checkpoint_shard_path(ck, i), "accel merge-weights");
    if (!st) return 0;
    fprintf(stderr, "accel merge-weights: error: %s\n", accel_last_error());
    return 1;
}

/* OUTPUT_PATH, made when missing (its parent must exist: Accelerate's
 * mkdir(exist_ok=True)); *created says this merge made it. 1 after naming
 * the error. */
static int make_out_dir(const char *out_dir, bool *created) {
    *created = mkdir(out_dir, 0755) == 0;
    if (*created || errno == EEXIST) return 0;
    fprintf(stderr, "accel merge-weights: error: cannot create '%s': %s\n", out_dir, strerror(errno));
    return 1;
}

/* A failed merge leaves no trace of itself: the OUTPUT_PATH it made is
 * removed (empty by then: the merged file is written to a scratch file in
 * it, renamed over its name only on success and removed by the writer on a
 * failure), one that existed is left as it was. */
static void drop_out_dir(const char *out_dir, bool created) {
    if (created) rmdir(out_dir);
}

/* A save_state checkpoint of several models (dir holds pytorch_model_fsdp_0/,
 * which is merged, and pytorch_model_fsdp_1/, ...): each other one is named
 * in a note, with how to merge it, instead of being left out without a word. */
static void note_other_models(const char *dir, const char *sub) {
    if (!strcmp(sub, dir)) return; /* a model's folder given itself */
    for (int i = 1;; i++) {
        char other[8192];
        snprintf(other, sizeof other, "%s/pytorch_model_fsdp_%d", dir, i);
        if (!accel__is_dir(other)) return;
        fprintf(stderr, "accel merge-weights: note: %s (model %d of the checkpoint) is not merged: this merges "
                        "pytorch_model_fsdp_0; give that folder itself to merge it\n", other, i);
    }
}

/* A folder holding both a ZeRO-3 sharded checkpoint (sub: dir itself, or
 * its pytorch_model_fsdp_0/) and a Hugging Face index: neither is the
 * other's output (a merge writes one model.safetensors, never an index), so
 * which one the user means cannot be told: the rank shards were merged
 * without a word, and --remove_checkpoint_dir then removed them, the index
 * and its shards left. 1 after naming both and how to choose (several
 * indexes: has_index's error). */
static int sharded_beside_index(const char *dir, const char *sub) {
    char index[4096];
    int indexed = has_index(dir, index, sizeof index);
    if (indexed <= 0) return indexed < 0;
    fprintf(stderr, "accel merge-weights: error: %s holds two sharded checkpoints: ZeRO-3 rank shards (%s/"
                    "sharded_index.json) and a Hugging Face index (%s); ", dir, sub, index);
    if (strcmp(sub, dir))
        fprintf(stderr, "give %s to merge the rank shards, or move the index and its shards to a folder of their own "
                        "to merge those\n", sub);
    else
        fprintf(stderr, "move one of them, with its files, to a folder of its own and merge that folder\n");
    return 1;
}

/* Before --remove_checkpoint_dir removes a save_state checkpoint's model
 * folder sub: the checkpoint's marker no longer lists its files and says
 * where the model went (accel__marker_drop), so that a load names why the
 * checkpoint is no longer a whole state (its optimizer and random states
 * stay) rather than a missing rank file, and the automatic resume and
 * total_limit pass it over. Accelerate, which has no marker, removes the
 * folder alone too. A folder holding its marker itself is no save_state's
 * model: its marker goes with it. Error set. */
static accel_status drop_from_marker(const char *dir, const char *sub, const char *out_dir, bool unsafe) {
    char at[4096], only[4096], marker[8192], out[PATH_MAX], why[PATH_MAX + 128];
    if (!checkpoint_of(dir, sub, at, only)) return ACCEL_OK;
    if (!*only) {
        snprintf(marker, sizeof marker, "%s/%s", at, ACCEL__MARKER);
        if (unlink(marker) == 0 || errno == ENOENT) return ACCEL_OK;
        return accel_set_error(ACCEL_ERR_IO, "cannot remove %s: %s", marker, strerror(errno));
    }
    /* the output's absolute path: the load that reads the note runs from anywhere */
    snprintf(why, sizeof why, "`accel merge-weights --remove_checkpoint_dir` merged it into %s/%s",
             realpath(out_dir, out) ? out : out_dir, merged_name(unsafe));
    return accel__marker_drop(at, only, why, "accel merge-weights");
}

/* A SHARDED_STATE_DICT model directory `sub` into out_dir/model.safetensors
 * (unsafe: pytorch_model.bin). */
static int merge_sharded(const char *dir, const char *sub, const char *out_dir, bool unsafe, bool remove) {
    int n = 0;
    bool created;
    if (make_out_dir(out_dir, &created)) return 1;
    if (accel__zero3_merge(sub, out_dir, unsafe, &n)) {
        fprintf(stderr, "accel merge-weights: error: %s\n", accel_last_error());
        drop_out_dir(out_dir, created);
        return 1;
    }
    if (remove && (drop_from_marker(dir, sub, out_dir, unsafe) || accel__zero3_remove_sharded(sub))) {
        fprintf(stderr, "accel merge-weights: error: %s\n", accel_last_error());
        return 1;
    }
    printf("Weights merged into %s/%s (%d tensors)\n", out_dir, merged_name(unsafe), n);
    return 0;
}

int accel_cli_merge_weights(int argc, char **argv) {
    static const cli_opt OPTS[] = {
        {"unsafe_serialization", 0, false, NULL,
         "Save as pytorch_model.bin (torch.save's zip of a pickle) instead of model.safetensors."},
        {"remove_checkpoint_dir", 0, false, NULL, "Remove the sharded checkpoint after merging."},
    };
    enum { NOPTS = sizeof OPTS / sizeof *OPTS };
    const char *usage = "accel merge-weights [-h] [--unsafe_serialization] [--remove_checkpoint_dir] "
                        "checkpoint_directory output_path";
    const char *desc = "Merges a sharded checkpoint (model.safetensors.index.json or pytorch_model.bin.index.json "
                       "+ shards, or a ZeRO-3 / FSDP SHARDED_STATE_DICT: a save_state directory holding "
                       "pytorch_model_fsdp_0/, or that directory, with sharded_index.json) into one "
                       "OUTPUT_PATH/model.safetensors (pytorch_model.bin with --unsafe_serialization): the "
                       "weights alone, no config.json.";
    const char *vals[NOPTS] = {0};
    int first = 0;
    /* Positionals may come before or after the flags: parse flags wherever they are (all of them: a fixed
     * array of 64 dropped every argument after it, an unknown flag or --remove_checkpoint_dir unseen) */
    const char *pos[2] = {0};
    int npos = 0;
    char **rest = malloc(((size_t)argc + 1) * sizeof *rest);
    if (!rest) {
        fprintf(stderr, "accel merge-weights: error: out of memory\n");
        return 1;
    }
    int nrest = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && argv[i][0] != '-') {
            if (npos < 2) pos[npos] = argv[i];
            npos++;
        } else {
            rest[nrest++] = argv[i];
        }
    }
    rest[nrest] = NULL;
    int rc = cli_parse(usage, desc, OPTS, NOPTS, nrest, rest, vals, &first, false);
    free(rest);
    if (rc == CLI_HELP) return 0;
    if (rc != CLI_OK) return 2;
    if (npos != 2) {
        fprintf(stderr, "usage: %s\naccel merge-weights: error: expected CHECKPOINT_DIRECTORY and OUTPUT_PATH\n",
                usage);
        return 2;
    }
    bool unsafe = vals[cli_idx(OPTS, NOPTS, "unsafe_serialization")] != NULL;
    const char *dir = pos[0], *out_dir = pos[1];
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "accel merge-weights: error: Tried to load from %s but couldn't find a valid metadata file "
                        "(expected a directory with model.safetensors.index.json and its shards).\n", dir);
        return 1;
    }
    char sub[8192];
    bool sharded = accel__zero3_find_sharded(dir, sub, sizeof sub);
    if (sharded && (sharded_beside_index(dir, sub) || verify_marker(dir, sub))) return 1;
    if (sharded) {
        note_other_models(dir, sub);
        return merge_sharded(dir, sub, out_dir, unsafe, vals[cli_idx(OPTS, NOPTS, "remove_checkpoint_dir")] != NULL);
    }
    char index[4096];
    int indexed = has_index(dir, index, sizeof index);
    if (indexed < 0) return 1;
    accel_checkpoint *ck = accel_checkpoint_open(indexed ? index : dir);
    if (!ck) {
        fprintf(stderr, "accel merge-weights: error: %s\n", accel_last_error());
        return 1;
    }
    if (indexed) note_single(ck, dir, index, out_dir, unsafe);
    if (verify_files(dir, ck) || (indexed && check_shards(ck, dir))) {
        accel_checkpoint_close(ck);
        return 1;
    }
    int n = accel_checkpoint_count(ck);
    if (n == 0) { /* nothing to merge is a broken index, not a success (and never a reason to delete it) */
        fprintf(stderr, "accel merge-weights: error: the checkpoint in %s holds no tensors (an empty weight_map?): "
                        "nothing to merge\n", dir);
        accel_checkpoint_close(ck);
        return 1;
    }
    bool created;
    if (make_out_dir(out_dir, &created)) {
        accel_checkpoint_close(ck);
        return 1;
    }
    const char **names = calloc((size_t)n + 1, sizeof *names);
    accel_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    int ok = names && ts;
    for (int i = 0; ok && i < n; i++) {
        names[i] = accel_checkpoint_name(ck, i);
        ts[i] = accel_checkpoint_tensor(ck, names[i], -1); /* zero-copy view of the mapping */
        ok = ts[i] != NULL;
    }
    char path[4096];
    /* cut, the name would be another file's (".../model.saf") */
    if (ok && (size_t)snprintf(path, sizeof path, "%s/%s", out_dir, merged_name(unsafe)) >= sizeof path) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "the output path %.40s.../%s is longer than %zu bytes", out_dir,
                        merged_name(unsafe), sizeof path - 1);
        ok = 0;
    }
    if (ok && scratch_is_a_shard(ck, dir, path)) ok = 0;
    if (ok)
        ok = (unsafe ? accel_torch_save(path, n, names, ts) : accel_safetensors_save(path, n, names, ts, 0, NULL)) ==
             ACCEL_OK;
    for (int i = 0; ts && i < n; i++) accel_tensor_free(ts[i]);
    free(ts);
    free(names);
    if (!ok) {
        fprintf(stderr, "accel merge-weights: error: %s\n", accel_last_error());
        accel_checkpoint_close(ck);
        drop_out_dir(out_dir, created);
        return 1;
    }
    printf("Weights merged into %s (%d tensors)\n", path, n);
    rc = 0;
    if (vals[cli_idx(OPTS, NOPTS, "remove_checkpoint_dir")]) rc = remove_shards(ck, dir, indexed ? index : NULL, path);
    accel_checkpoint_close(ck);
    return rc;
}
