/* src/io/io_util.c — JSON files (written through core/afile.h), tensor streaming, paths. */
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_internal.h"
#include "core/host_stage.h"
#include "io/io_internal.h"

/* A device tensor's bytes reach the sink through the pinned staging chunks
 * (core/host_stage.h): no host copy of the tensor, no allocation per save. */
static accel_status stream_dense(const accel_tensor *t, accel__byte_sink sink, void *ctx, const char *op) {
    size_t n = accel_nbytes(t);
    if (t->device.type == ACCEL_DEV_CPU) {
        const void *host = accel__host_ptr(t, op);
        return host ? sink(ctx, host, n) : accel_last_status();
    }
    return accel__stage_from_device(t->device, accel__device_ptr(t), n, sink, ctx, op);
}

accel_status accel__tensor_stream(const accel_tensor *t, accel__byte_sink sink, void *ctx, const char *op) {
    if (accel_numel(t) == 0) return ACCEL_OK;
    if (accel_is_contiguous(t)) return stream_dense(t, sink, ctx, op);
    accel_tensor *c = accel_tensor_clone_persistent(t, t->device); /* dense on its own device */
    if (!c) return accel_last_status();
    accel_status st = stream_dense(c, sink, ctx, op);
    accel_tensor_free(c);
    return st;
}

/* fd's bytes to EOF in accel_malloc'd memory (*len of them): `expect` bytes
 * (st_size) in one read when the file does not change meanwhile; one that grows
 * is still read to its end. NULL + errno on failure. */
static char *read_whole(int fd, size_t expect, size_t *len) {
    size_t cap = expect + 1, n = 0; /* +1: the read that sees EOF needs room to say so */
    char *buf = accel_malloc(cap);
    while (buf) {
        if (n == cap) {
            char *grown = cap > SIZE_MAX / 2 ? NULL : accel_malloc(2 * cap);
            if (grown) memcpy(grown, buf, n);
            accel_free(buf);
            buf = grown;
            cap *= 2;
            if (!buf) break;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r == 0) {
            *len = n;
            return buf;
        }
        if (r > 0) n += (size_t)r;
        else if (errno != EINTR) {
            int e = errno;
            accel_free(buf);
            errno = e;
            return NULL;
        }
    }
    errno = ENOMEM;
    return NULL;
}

int accel__open_regular(const char *path, const char *what, struct stat *sb) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT) accel_set_error(ACCEL_ERR_IO, "%s: no such file", path);
        else accel_set_error(ACCEL_ERR_IO, "%s: cannot be read: %s", path, strerror(errno));
        return -1;
    }
    const char *why = fstat(fd, sb) != 0 ? strerror(errno) : NULL;
    if (why || !S_ISREG(sb->st_mode)) {
        if (why) accel_set_error(ACCEL_ERR_IO, "%s: cannot be read: %s", path, why);
        else accel_set_error(ACCEL_ERR_IO, "%s: is %s, not %s", path, accel__file_kind(sb->st_mode), what);
        close(fd);
        return -1;
    }
    return fd;
}

char *accel__read_regular_file(const char *path, const char *what, size_t *len) {
    struct stat sb;
    int fd = accel__open_regular(path, what, &sb);
    if (fd < 0) return NULL;
    char *text = read_whole(fd, (size_t)sb.st_size, len);
    int read_errno = errno;
    close(fd);
    if (!text)
        accel_set_error(read_errno == ENOMEM ? ACCEL_ERR_OOM : ACCEL_ERR_IO, "%s: cannot be read: %s", path,
                        strerror(read_errno));
    return text;
}

json_t *accel__json_load_file(const char *path) {
    /* The whole file in a few read()s, parsed from memory: json_loadfd reads one
     * byte per syscall (a 50 MB DeepSpeed config took tens of seconds). */
    size_t len = 0;
    char *text = accel__read_regular_file(path, "a JSON file", &len);
    if (!text) return NULL;
    json_t *j = accel__json_parse(path, text, len);
    accel_free(text);
    return j;
}

static json_t *json_parse_flags(const char *name, const char *text, size_t len, size_t flags) {
    json_error_t err;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES | flags, &err);
    if (!j)
        accel_set_error(ACCEL_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", name, err.line, err.column,
                        err.text);
    return j;
}

json_t *accel__json_parse(const char *name, const char *text, size_t len) {
    return json_parse_flags(name, text, len, 0);
}

json_t *accel__json_parse_nul(const char *name, const char *text, size_t len) {
    return json_parse_flags(name, text, len, JSON_ALLOW_NUL);
}

accel_status accel__json_save_file(const char *path, const json_t *j) {
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
    if (!s) return accel_set_error(ACCEL_ERR_OOM, "write %s: cannot serialise JSON", path);
    accel__afile f;
    accel_status st = accel__afile_open(&f, path);
    if (st == ACCEL_OK) {
        st = accel__afile_write(&f, s, strlen(s));
        if (st == ACCEL_OK) st = accel__afile_write(&f, "\n", 1);
        if (st == ACCEL_OK) st = accel__afile_commit(&f);
        else accel__afile_abort(&f);
    }
    free(s);
    return st;
}

char *accel__path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] != '/';
    char *p = accel_malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (slash) p[a++] = '/';
    memcpy(p + a, name, b + 1);
    return p;
}

bool accel__is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

bool accel__is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool accel__same_file(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

accel_status accel__mkdir(const char *path) {
    if (mkdir(path, 0755) == 0 || (errno == EEXIST && accel__is_dir(path))) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_IO, "cannot create directory %s: %s", path, strerror(errno));
}
