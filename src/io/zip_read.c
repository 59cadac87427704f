/* src/io/zip_read.c — a zip archive's records through its central directory
 * (zip_read.h), in place: the file's bytes are only read, never trusted.
 * The central directory is the archive's own list; scanning local headers
 * from the front would also accept bytes that merely look like records. */
#include <stdlib.h>
#include <string.h>

#include "core/core_internal.h"
#include "io/zip_format.h"
#include "io/zip_read.h"

#define END_BYTES 22
#define LOCATOR_BYTES 20
#define END64_BYTES 56
#define CENTRAL_BYTES 46
#define ZIP64_EXTRA 0x0001u
#define FLAG_ENCRYPTED 0x0001u

static accel_status bad(const char *path, const char *what) {
    return accel_set_error(ACCEL_ERR_FORMAT, "%s: not a valid zip archive (torch.save's format): %s", path, what);
}

/* The classic end record: the last "PK\5\6" whose comment runs exactly to
 * the end of the file (a comment may itself hold the signature's bytes). */
static int64_t find_end(const unsigned char *p, size_t size) {
    if (size < END_BYTES) return -1;
    size_t lowest = size - END_BYTES > 0xFFFF ? size - END_BYTES - 0xFFFF : 0;
    for (size_t at = size - END_BYTES + 1; at-- > lowest;)
        if (accel__read_le(p + at, 4) == ACCEL__ZIP_SIG_END && at + END_BYTES + accel__read_le(p + at + 20, 2) == size) return (int64_t)at;
    return -1;
}

typedef struct cd_loc {
    uint64_t n, size, offset; /* entries, bytes, file offset of the central directory */
    uint64_t limit;           /* where the end records begin: the directory ends before */
} cd_loc;

static accel_status locate_cd(const char *path, const unsigned char *p, size_t size, cd_loc *cd) {
    int64_t end = find_end(p, size);
    if (end < 0) return bad(path, "no end of central directory record (truncated?)");
    const unsigned char *e = p + end;
    if (accel__read_le(e + 4, 2) != 0 || accel__read_le(e + 6, 2) != 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a multi-disk zip archive is not supported", path);
    cd->n = accel__read_le(e + 10, 2);
    cd->size = accel__read_le(e + 12, 4);
    cd->offset = accel__read_le(e + 16, 4);
    cd->limit = (uint64_t)end;
    /* torch writes a ZIP64 end record (and its locator just before the classic one) even
     * for small files; where present its values are the real ones */
    if (end >= LOCATOR_BYTES && accel__read_le(e - LOCATOR_BYTES, 4) == ACCEL__ZIP_SIG_LOCATOR64) {
        const unsigned char *loc = e - LOCATOR_BYTES;
        uint64_t at = accel__read_le(loc + 8, 8);
        if (accel__read_le(loc + 4, 4) != 0 || accel__read_le(loc + 16, 4) > 1)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a multi-disk zip archive is not supported", path);
        if (at > (uint64_t)end - LOCATOR_BYTES || (uint64_t)end - LOCATOR_BYTES - at < END64_BYTES ||
            accel__read_le(p + at, 4) != ACCEL__ZIP_SIG_END64)
            return bad(path, "the ZIP64 locator points to no ZIP64 end record");
        const unsigned char *z = p + at;
        if (accel__read_le(z + 16, 4) != 0 || accel__read_le(z + 20, 4) != 0)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a multi-disk zip archive is not supported", path);
        cd->n = accel__read_le(z + 32, 8);
        cd->size = accel__read_le(z + 40, 8);
        cd->offset = accel__read_le(z + 48, 8);
        cd->limit = at;
    } else if (cd->n == 0xFFFF || cd->size == 0xFFFFFFFFu || cd->offset == 0xFFFFFFFFu) {
        return bad(path, "the end record defers to a ZIP64 end record that is not there");
    }
    if (cd->offset > cd->limit || cd->size > cd->limit - cd->offset)
        return bad(path, "the central directory lies outside the file");
    /* every entry takes at least CENTRAL_BYTES: bounds the allocation by the file */
    if (cd->n > cd->size / CENTRAL_BYTES) return bad(path, "more entries than the central directory can hold");
    return ACCEL_OK;
}

/* The ZIP64 extended information of a central entry: the 64-bit values of
 * the fields saturated at 0xFFFFFFFF, in the order the format fixes. */
static accel_status zip64_fields(const char *path, const unsigned char *x, size_t len, uint64_t *usize,
                                 uint64_t *csize, uint64_t *offset) {
    uint64_t *want[3] = {usize, csize, offset};
    for (size_t at = 0; at + 4 <= len;) {
        uint64_t id = accel__read_le(x + at, 2), n = accel__read_le(x + at + 2, 2);
        if (n > len - at - 4) return bad(path, "a central directory extra field runs past its entry");
        if (id == ZIP64_EXTRA) {
            size_t k = 0;
            for (int i = 0; i < 3; i++) {
                if (*want[i] != 0xFFFFFFFFu) continue;
                if (k + 8 > n) return bad(path, "a ZIP64 extra field lacks a size or offset it defers to");
                *want[i] = accel__read_le(x + at + 4 + k, 8);
                k += 8;
            }
            return ACCEL_OK;
        }
        at += 4 + n;
    }
    if (*usize == 0xFFFFFFFFu || *csize == 0xFFFFFFFFu || *offset == 0xFFFFFFFFu)
        return bad(path, "an entry defers its size or offset to a ZIP64 field that is not there");
    return ACCEL_OK;
}

static int cmp_rec(const void *a, const void *b) {
    return strcmp(((const accel__zip_rec *)a)->name, ((const accel__zip_rec *)b)->name);
}

/* Entry i at c (CENTRAL_BYTES fit; name and extra checked by the caller):
 * its local header and where its bytes are. */
static accel_status read_entry(const char *path, const unsigned char *p, const cd_loc *cd, const unsigned char *c,
                               char *name, accel__zip_rec *r) {
    size_t name_len = accel__read_le(c + 28, 2), extra_len = accel__read_le(c + 30, 2);
    uint64_t csize = accel__read_le(c + 20, 4), usize = accel__read_le(c + 24, 4), off = accel__read_le(c + 42, 4);
    if (zip64_fields(path, c + CENTRAL_BYTES + name_len, extra_len, &usize, &csize, &off)) return accel_last_status();
    if (memchr(c + CENTRAL_BYTES, 0, name_len)) return bad(path, "a record name holds a NUL byte");
    memcpy(name, c + CENTRAL_BYTES, name_len);
    name[name_len] = 0;
    if (accel__read_le(c + 8, 2) & FLAG_ENCRYPTED)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: record '%s' is encrypted", path, name);
    r->name = name;
    r->method = (uint16_t)accel__read_le(c + 10, 2);
    r->size = csize;
    if (r->method == 0 && usize != csize)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: record '%s' is stored but its sizes differ (%llu, %llu)", path,
                               name, (unsigned long long)csize, (unsigned long long)usize);
    /* the local header: where the bytes start (its own name and extra lengths) */
    if (off > cd->offset || cd->offset - off < ACCEL__ZIP_LOCAL_BYTES || accel__read_le(p + off, 4) != ACCEL__ZIP_SIG_LOCAL)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: record '%s': no local header at offset %llu", path, name,
                               (unsigned long long)off);
    const unsigned char *l = p + off;
    uint64_t lname = accel__read_le(l + 26, 2), lextra = accel__read_le(l + 28, 2);
    uint64_t data_at = off + ACCEL__ZIP_LOCAL_BYTES + lname + lextra;
    if (lname != name_len || data_at > cd->offset || memcmp(l + ACCEL__ZIP_LOCAL_BYTES, name, name_len) != 0)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: record '%s': its local header disagrees with the central "
                               "directory", path, name);
    if (csize > cd->offset - data_at)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: record '%s' (%llu bytes at offset %llu) runs past the "
                               "records into the central directory or the end of the file (truncated?)",
                               path, name, (unsigned long long)csize, (unsigned long long)data_at);
    r->data_at = data_at;
    return ACCEL_OK;
}

accel_status accel__zip_read_dir(const char *path, const unsigned char *p, size_t size, accel__zip_dir *out) {
    memset(out, 0, sizeof *out);
    cd_loc cd = {0};
    if (locate_cd(path, p, size, &cd)) return accel_last_status();
    /* names total at most the directory's size: one block, NUL each */
    out->recs = accel_calloc((size_t)cd.n + 1, sizeof *out->recs);
    out->names = accel_malloc((size_t)(cd.size + cd.n + 1));
    if (!out->recs || !out->names) {
        accel__zip_dir_free(out);
        return accel_last_status();
    }
    uint64_t at = cd.offset, end = cd.offset + cd.size;
    char *name = out->names;
    accel_status st = ACCEL_OK;
    for (uint64_t i = 0; i < cd.n && !st; i++) {
        const unsigned char *c = p + at;
        if (end - at < CENTRAL_BYTES || accel__read_le(c, 4) != ACCEL__ZIP_SIG_CENTRAL) {
            st = bad(path, "a central directory entry is missing or cut short");
            break;
        }
        uint64_t len = CENTRAL_BYTES + accel__read_le(c + 28, 2) + accel__read_le(c + 30, 2) + accel__read_le(c + 32, 2);
        if (len > end - at) {
            st = bad(path, "a central directory entry runs past the directory");
            break;
        }
        st = read_entry(path, p, &cd, c, name, &out->recs[i]);
        name += accel__read_le(c + 28, 2) + 1;
        at += len;
        if (!st) out->n++;
    }
    if (!st) {
        qsort(out->recs, (size_t)out->n, sizeof *out->recs, cmp_rec);
        for (int i = 1; i < out->n && !st; i++)
            if (!strcmp(out->recs[i].name, out->recs[i - 1].name))
                st = accel_set_error(ACCEL_ERR_FORMAT, "%s: record '%s' appears twice in the zip archive", path,
                                     out->recs[i].name);
    }
    if (st) accel__zip_dir_free(out);
    return st;
}

void accel__zip_dir_free(accel__zip_dir *d) {
    accel_free(d->recs);
    accel_free(d->names);
    memset(d, 0, sizeof *d);
}

const accel__zip_rec *accel__zip_find(const accel__zip_dir *d, const char *name) {
    accel__zip_rec key = {.name = name};
    return d->n ? bsearch(&key, d->recs, (size_t)d->n, sizeof key, cmp_rec) : NULL;
}
