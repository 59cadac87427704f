/* src/io/checkpoint_marker.c — write and check a checkpoint's completion
 * marker (see checkpoint_marker.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint_marker.h"
#include "core/checksum.h"
#include "core/core_internal.h"
#include "core/staged_dir.h"
#include "io/io_internal.h"

#define PATHN 4096

/* Every regular file of dir (and, one level down, of its subdirectories) into
 * sizes as "prefix/name": bytes and into sums as "prefix/name": "crc"; at the
 * top (prefix "") only the entries ours accepts (NULL: all). */
static accel_status list_files(json_t *sizes, json_t *sums, const char *dir, const char *prefix,
                               bool (*ours)(const char *), const char *op) {
    DIR *d = opendir(dir);
    if (!d) return accel_set_error(ACCEL_ERR_IO, "%s: cannot list %s: %s", op, dir, strerror(errno));
    accel_status s = ACCEL_OK;
    for (struct dirent *e; !s && (e = readdir(d));) {
        struct stat sb;
        char name[2 * PATHN], path[3 * PATHN];
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || fstatat(dirfd(d), e->d_name, &sb, 0)) continue;
        if (!*prefix && !strcmp(e->d_name, ACCEL__MARKER)) continue; /* an old marker being replaced */
        if (!*prefix && ours && !ours(e->d_name)) continue;
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "/" : "", e->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (S_ISDIR(sb.st_mode) && !*prefix) {
            s = list_files(sizes, sums, path, e->d_name, NULL, op);
            accel__fsync_dir(path);
        } else if (S_ISREG(sb.st_mode)) {
            uint32_t crc;
            int64_t bytes;
            char hex[9];
            if ((s = accel__file_crc32c(path, &crc, &bytes))) break;
            snprintf(hex, sizeof hex, "%08x", crc);
            if (json_object_set_new(sizes, name, json_integer((json_int_t)bytes)) ||
                json_object_set_new(sums, name, json_string(hex)))
                s = accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", op);
        }
    }
    closedir(d);
    return s;
}

/* The CRC-32C of root without its "marker_crc32c", dumped compact with sorted
 * keys, as 8 hex digits in out[9]; false when out of memory. */
static bool marker_sum(const json_t *root, char out[9]) {
    json_t *copy = json_copy((json_t *)root);
    if (copy) json_object_del(copy, "marker_crc32c");
    char *text = copy ? json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(copy);
    if (!text) return false;
    snprintf(out, 9, "%08x", accel__crc32c(text, strlen(text)));
    free(text);
    return true;
}

accel_status accel__marker_write(const char *dir, int world, bool (*ours)(const char *name), const char *op) {
    json_t *sizes = json_object(), *sums = json_object(), *root = json_object();
    accel_status s = sizes && sums && root ? ACCEL_OK : accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", op);
    if (!s) s = list_files(sizes, sums, dir, "", ours, op);
    char self[9];
    if (!s && (json_object_set(root, "files", sizes) || json_object_set(root, "crc32c", sums) ||
               json_object_set_new(root, "num_processes", json_integer(world)) || !marker_sum(root, self) ||
               json_object_set_new(root, "marker_crc32c", json_string(self))))
        s = accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", op);
    if (!s) {
        char path[PATHN + 64];
        snprintf(path, sizeof path, "%s/%s", dir, ACCEL__MARKER);
        s = accel__json_save_file(path, root);
    }
    json_decref(sizes);
    json_decref(sums);
    json_decref(root);
    return s;
}

/* name is `only` or under it (or only is NULL). */
static bool wanted(const char *name, const char *only) {
    size_t n = only ? strlen(only) : 0;
    return !only || (!strncmp(name, only, n) && (name[n] == '/' || !name[n]));
}

/* The marker's own checksum: required once the marker has any checksum. */
static accel_status check_self(const json_t *root, const char *dir, const char *op) {
    json_t *self = json_object_get(root, "marker_crc32c");
    if (!self && !json_object_get(root, "crc32c")) return ACCEL_OK; /* a marker from before checksums */
    char want[9];
    if (!marker_sum(root, want)) return accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", op);
    if (!json_is_string(self) || strcmp(json_string_value(self), want))
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: %s is corrupted: its completion marker %s does not match its own checksum "
                               "(marker_crc32c %s, computed %s)",
                               op, dir, ACCEL__MARKER, json_is_string(self) ? json_string_value(self) : "missing",
                               want);
    return ACCEL_OK;
}

/* Whether the n bytes at p are a name of a file or folder: not empty, "." or "..". */
static bool part_ok(const char *p, size_t n) {
    return n > 0 && !(n == 1 && p[0] == '.') && !(n == 2 && p[0] == '.' && p[1] == '.');
}

/* Whether name is one accel__marker_write lists, "FILE" or "FOLDER/FILE":
 * any other ("../x", "/etc/x", "a/b/c") would have the check read a file
 * outside the checkpoint, or one no save writes. */
static bool name_in_checkpoint(const char *name) {
    size_t first = strcspn(name, "/");
    const char *second = name[first] ? name + first + 1 : NULL;
    return part_ok(name, first) && (!second || (!strchr(second, '/') && part_ok(second, strlen(second))));
}

static accel_status check_file(const char *dir, const char *name, const json_t *size, const json_t *sum,
                               bool checksums, const char *op) {
    char path[3 * PATHN];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!json_is_integer(size))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s/%s: the size of %s is not an integer", op, dir,
                               ACCEL__MARKER, name);
    if (stat(path, &sb))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s is not a complete checkpoint: %s is missing", op, dir, name);
    if ((json_int_t)sb.st_size != json_integer_value(size))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s is not a complete checkpoint: %s has %lld bytes, its marker "
                                                 "says %lld",
                               op, dir, name, (long long)sb.st_size, (long long)json_integer_value(size));
    if (!checksums || !sum) return ACCEL_OK;
    if (!json_is_string(sum))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s/%s: the CRC-32C of %s is not a string", op, dir,
                               ACCEL__MARKER, name);
    uint32_t crc;
    accel_status s = accel__file_crc32c(path, &crc, NULL);
    if (s) return s;
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", crc);
    if (strcmp(hex, json_string_value(sum)))
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: %s is corrupted: %s has CRC-32C %s, its marker says %s (the file changed after "
                               "it was saved)",
                               op, dir, name, hex, json_string_value(sum));
    return ACCEL_OK;
}

/* An entry accel__marker_drop took out that this check reaches (under
 * `only`, or holding it; every entry without `only`): refused saying why. */
static accel_status check_removed(json_t *root, const char *dir, const char *only, const char *op) {
    json_t *removed = json_object_get(root, "removed"), *why;
    if (!removed) return ACCEL_OK;
    if (!json_is_object(removed))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s/%s: \"removed\" is not an object", op, dir, ACCEL__MARKER);
    const char *name;
    json_object_foreach(removed, name, why) {
        if (wanted(name, only) || (only && wanted(only, name)))
            return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s is no longer a complete checkpoint: %s was removed (%s)",
                                   op, dir, name, json_is_string(why) ? json_string_value(why) : "no reason given");
    }
    return ACCEL_OK;
}

accel_status accel__marker_check(const char *dir, bool checksums, const char *only, const char *op) {
    char path[PATHN + 64];
    if (!accel__is_dir(dir)) return accel_set_error(ACCEL_ERR_IO, "%s: Tried to find %s but folder does not exist", op, dir);
    snprintf(path, sizeof path, "%s/%s", dir, ACCEL__MARKER);
    if (!accel__is_file(path))
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: %s is not a complete checkpoint: it has no completion marker %s (its save "
                               "did not finish, or save_state did not write it)",
                               op, dir, ACCEL__MARKER);
    json_t *root = accel__json_load_file(path);
    if (!root) return accel_last_status(); /* names the file */
    json_t *files = json_object_get(root, "files"), *sums = json_object_get(root, "crc32c");
    accel_status s = json_is_object(files) ? ACCEL_OK
                                           : accel_set_error(ACCEL_ERR_FORMAT, "%s: %s has no \"files\" object", op, path);
    if (!s && sums && !json_is_object(sums))
        s = accel_set_error(ACCEL_ERR_FORMAT, "%s: %s: \"crc32c\" is not an object", op, path);
    if (!s) s = check_self(root, dir, op);
    if (!s) s = check_removed(root, dir, only, op);
    const char *name;
    json_t *size;
    json_object_foreach(files, name, size) {
        if (s) break;
        json_t *sum = sums ? json_object_get(sums, name) : NULL;
        if (!name_in_checkpoint(name))
            s = accel_set_error(ACCEL_ERR_FORMAT,
                                "%s: %s/%s lists \"%s\", which is no file of the checkpoint (a name is FILE or "
                                "FOLDER/FILE inside it, without \".\", \"..\" or a leading \"/\")",
                                op, dir, ACCEL__MARKER, name);
        else if (sums && !sum)
            s = accel_set_error(ACCEL_ERR_FORMAT, "%s: %s/%s lists %s without its CRC-32C", op, dir, ACCEL__MARKER,
                                name);
        else if (wanted(name, only))
            s = check_file(dir, name, size, sum, checksums, op);
    }
    json_decref(root);
    return s;
}

accel_status accel__marker_drop(const char *dir, const char *entry, const char *why, const char *op) {
    char path[PATHN + 64], self[9];
    snprintf(path, sizeof path, "%s/%s", dir, ACCEL__MARKER);
    json_t *root = accel__json_load_file(path);
    if (!root) return accel_last_status(); /* names the file */
    json_t *files = json_object_get(root, "files"), *sums = json_object_get(root, "crc32c"),
           *removed = json_object_get(root, "removed");
    accel_status s = check_self(root, dir, op);
    if (!s && (!json_is_object(files) || (sums && !json_is_object(sums)) || (removed && !json_is_object(removed))))
        s = accel_set_error(ACCEL_ERR_FORMAT, "%s: %s: \"files\", \"crc32c\" or \"removed\" is not an object", op,
                            path);
    if (!s && !removed && json_object_set_new(root, "removed", removed = json_object()))
        s = accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", op);
    const char *name;
    json_t *size;
    void *next;
    json_object_foreach_safe(files, next, name, size) {
        if (s || !wanted(name, entry)) continue;
        if (sums) json_object_del(sums, name);
        json_object_del(files, name); /* name is files' own key: deleted last */
    }
    json_object_del(root, "marker_crc32c");
    if (!s && !accel__is_utf8(why)) /* JSON holds UTF-8 alone (jansson's json_string made NULL: "out of memory") */
        s = accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: cannot note in %s where %s went: its words are not UTF-8 (a "
                            "path in another encoding); nothing changed", op, path, entry);
    if (!s && (json_object_set_new(removed, entry, json_string(why)) || !marker_sum(root, self) ||
               json_object_set_new(root, "marker_crc32c", json_string(self))))
        s = accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", op);
    if (!s) s = accel__json_save_file(path, root);
    json_decref(root);
    return s;
}

void accel__marker_id(const char *dir, char out[9]) {
    char path[PATHN + 64];
    snprintf(path, sizeof path, "%s/%s", dir, ACCEL__MARKER);
    json_t *root = accel__is_file(path) ? accel__json_load_file(path) : NULL;
    const char *id = json_string_value(json_object_get(root, "marker_crc32c"));
    snprintf(out, 9, "%s", id ? id : "");
    json_decref(root);
    accel_clear_error(); /* no marker is no id, not an error: the checks say what is wrong */
}
