/* src/io/checkpoint_marker.h — the completion marker of a save_state
 * directory: written last, it lists every file of the checkpoint with its
 * size and CRC-32C, so a loader can tell a whole, intact checkpoint from a
 * half-written or corrupted one.
 *
 * accel_checkpoint.json:
 *   {"files": {"model.safetensors": 1234, "pytorch_model_fsdp_0/shard_0.safetensors": 99, ...},
 *    "crc32c": {"model.safetensors": "1a2b3c4d", ...},
 *    "num_processes": 2,
 *    "marker_crc32c": "89abcdef"}
 * and, once `accel merge-weights --remove_checkpoint_dir` took a model out,
 *    "removed": {"pytorch_model_fsdp_0": "merged into out/model.safetensors by ..."}
 * (accel__marker_drop): the checkpoint is no longer a whole state, and a
 * check that reaches that entry says why instead of naming a missing file.
 * marker_crc32c covers the marker itself: the CRC-32C of the other members
 * dumped compact with sorted keys, so a flipped bit in a size, a checksum or a
 * name is caught too. A marker with neither "crc32c" nor "marker_crc32c"
 * (written before checksums) is checked by sizes only.
 * Internal: prefix accel__, not installed. */
#ifndef ACCEL_IO_CHECKPOINT_MARKER_H
#define ACCEL_IO_CHECKPOINT_MARKER_H

#include <stdbool.h>

#include "accel/core.h"

#define ACCEL__MARKER "accel_checkpoint.json"

/* Lists every regular file of dir whose top-level entry `ours` accepts
 * (NULL: all; files and, one level down, subdirectories' files: a sharded
 * model's pytorch_model_fsdp_<i>/), reads each back for its CRC-32C, fsyncs
 * the subdirectories and writes dir/accel_checkpoint.json atomically. The
 * entries `ours` refuses (a user's files beside the checkpoint) are left out:
 * editing them later does not make the checkpoint "corrupted". `op` names
 * the caller in errors. */
accel_status accel__marker_write(const char *dir, int world, bool (*ours)(const char *name), const char *op);

/* OK when dir holds a marker and every file it lists is there with its size
 * and, when `checksums`, its CRC-32C. With `only` (a file or subdirectory
 * name) only that file or the files under it are checked (merge-weights reads
 * just the model).
 * Errors (ACCEL_ERR_FORMAT / ACCEL_ERR_IO) name the checkpoint and the file:
 * "<op>: <dir> is not a complete checkpoint: ..." or
 * "<op>: <dir> is corrupted: <file> has CRC-32C ..., its marker says ...". */
accel_status accel__marker_check(const char *dir, bool checksums, const char *only, const char *op);

/* dir's marker rewritten (atomically) without entry's files ("FILE", or a
 * folder "FOLDER": the files under it), recording entry under "removed" with
 * why: called before those files are removed, so that no marker ever lists
 * them as the checkpoint's once they may be gone. From then on a check that
 * reaches entry (every check but one `only` another entry) fails with
 * "<op>: <dir> is no longer a complete checkpoint: <entry> was removed
 * (<why>)": load_state refuses the checkpoint, the automatic resume skips it
 * and total_limit neither counts nor deletes it. A marker that does not
 * match its own checksum is refused as the check refuses it. */
accel_status accel__marker_drop(const char *dir, const char *entry, const char *why, const char *op);

/* The marker's own checksum (its "marker_crc32c", 8 hex digits) into out:
 * it differs between two saves of different content, so ranks that each
 * opened "the" checkpoint can tell whether they opened the same one. "" when
 * dir has no readable marker or the marker predates checksums. */
void accel__marker_id(const char *dir, char out[9]);

#endif
