/* src/io/zip_write.c — the zip archive layout torch.save writes (zip_internal.h). */
#include <string.h>
#include <zlib.h>

#include "accel/core.h"
#include "io/zip_format.h"
#include "io/zip_internal.h"

#define SIG_DESCRIPTOR 0x08074b50u
#define FLAG_UTF8 0x0800u       /* bit 11: UTF-8 names */
#define FLAG_DESCRIPTOR 0x0008u /* bit 3: CRC-32 and sizes in a descriptor after the data */
#define PAD_HEADER_BYTES 4 /* "FB" + u16 length */

/* Little-endian field writer over a caller's buffer. */
typedef struct { unsigned char *p; } le_buf;
static void put16(le_buf *b, uint32_t v) {
    for (int i = 0; i < 2; i++) *b->p++ = (unsigned char)(v >> (8 * i));
}
static void put32(le_buf *b, uint32_t v) {
    for (int i = 0; i < 4; i++) *b->p++ = (unsigned char)(v >> (8 * i));
}
static void put64(le_buf *b, uint64_t v) {
    for (int i = 0; i < 8; i++) *b->p++ = (unsigned char)(v >> (8 * i));
}

static accel_status emit(accel__zip *z, const void *p, size_t n) {
    if (z->pos + n > ACCEL__ZIP_MAX)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "%s: the archive would pass 4 GiB, which needs ZIP64 fields accel does not "
                               "write: save in smaller shards (max_shard_size <= \"4GB\") or as safetensors",
                               z->f.path);
    accel_status st = accel__afile_write(&z->f, p, n);
    if (!st) z->pos += n;
    return st;
}

accel_status accel__zip_open(accel__zip *z, const char *path) {
    memset(z, 0, sizeof *z);
    return accel__afile_open(&z->f, path);
}

/* miniz writes a descriptor only after data. */
static uint32_t flags_of(const accel__zip_entry *e) { return FLAG_UTF8 | (e->declared ? FLAG_DESCRIPTOR : 0); }

static accel_status add_entry(accel__zip *z, const char *name, uint64_t size) {
    if (z->n == z->cap) {
        int cap = z->cap ? 2 * z->cap : 16;
        accel__zip_entry *grown = accel_malloc(sizeof *grown * (size_t)cap);
        if (!grown) return accel_last_status();
        if (z->n) memcpy(grown, z->entries, sizeof *grown * (size_t)z->n);
        accel_free(z->entries);
        z->entries = grown;
        z->cap = cap;
    }
    char *copy = accel_strdup(name);
    if (!copy) return accel_last_status();
    z->entries[z->n++] = (accel__zip_entry){
        .name = copy, .crc = (uint32_t)crc32(0L, Z_NULL, 0), .declared = size, .offset = z->pos};
    return ACCEL_OK;
}

accel_status accel__zip_begin(accel__zip *z, const char *name, uint64_t size) {
    size_t name_len = strlen(name);
    if (z->in_entry || name_len == 0 || name_len > 0xFFFF)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: bad zip entry '%s'", z->f.path, name);
    accel_status st = add_entry(z, name, size);
    if (st) return st;
    /* The data starts after header, name and the pad field: align it to 64. */
    uint64_t data_at = z->pos + ACCEL__ZIP_LOCAL_BYTES + name_len + PAD_HEADER_BYTES;
    size_t pad = (size_t)((ACCEL__ZIP_ALIGN - data_at % ACCEL__ZIP_ALIGN) % ACCEL__ZIP_ALIGN);
    unsigned char head[ACCEL__ZIP_LOCAL_BYTES], padding[PAD_HEADER_BYTES + ACCEL__ZIP_ALIGN];
    le_buf b = {head};
    put32(&b, ACCEL__ZIP_SIG_LOCAL);
    put16(&b, 0);     /* version needed (torch writes 0) */
    put16(&b, flags_of(&z->entries[z->n - 1]));
    put16(&b, 0);     /* method: stored */
    put32(&b, 0);     /* time, date */
    put32(&b, 0);     /* CRC-32, in the descriptor */
    put32(&b, 0);     /* compressed size */
    put32(&b, 0);     /* uncompressed size */
    put16(&b, (uint32_t)name_len);
    put16(&b, (uint32_t)(PAD_HEADER_BYTES + pad));
    b.p = padding;
    put16(&b, 'F' | 'B' << 8);
    put16(&b, (uint32_t)pad);
    memset(b.p, 'Z', pad);
    st = emit(z, head, sizeof head);
    if (!st) st = emit(z, name, name_len);
    if (!st) st = emit(z, padding, PAD_HEADER_BYTES + pad);
    z->in_entry = !st;
    return st;
}

accel_status accel__zip_write(accel__zip *z, const void *p, size_t n) {
    accel__zip_entry *e = &z->entries[z->n - 1];
    accel_status st = emit(z, p, n);
    for (size_t done = 0; !st && done < n;) { /* zlib's crc32 takes a uInt length */
        size_t m = n - done < (1u << 30) ? n - done : (1u << 30);
        e->crc = (uint32_t)crc32(e->crc, (const Bytef *)p + done, (uInt)m);
        done += m;
    }
    if (!st) e->size += n;
    return st;
}

accel_status accel__zip_end(accel__zip *z) {
    accel__zip_entry *e = &z->entries[z->n - 1];
    z->in_entry = false;
    if (e->size != e->declared)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: zip entry %s: %llu bytes written, %llu declared",
                               z->f.path, e->name, (unsigned long long)e->size, (unsigned long long)e->declared);
    if (!e->size) return ACCEL_OK;
    unsigned char desc[16];
    le_buf b = {desc};
    put32(&b, SIG_DESCRIPTOR);
    put32(&b, e->crc);
    put32(&b, (uint32_t)e->size);
    put32(&b, (uint32_t)e->size);
    return emit(z, desc, sizeof desc);
}

accel_status accel__zip_record(accel__zip *z, const char *name, const void *p, size_t n) {
    accel_status st = accel__zip_begin(z, name, n);
    if (!st) st = accel__zip_write(z, p, n);
    if (!st) st = accel__zip_end(z);
    return st;
}

static accel_status write_central_entry(accel__zip *z, const accel__zip_entry *e) {
    unsigned char h[46];
    le_buf b = {h};
    put32(&b, ACCEL__ZIP_SIG_CENTRAL);
    put16(&b, 0);     /* version made by */
    put16(&b, 0);     /* version needed */
    put16(&b, flags_of(e));
    put16(&b, 0);     /* stored */
    put32(&b, 0);     /* time, date */
    put32(&b, e->crc);
    put32(&b, (uint32_t)e->size);
    put32(&b, (uint32_t)e->size);
    put16(&b, (uint32_t)strlen(e->name));
    put16(&b, 0);     /* extra */
    put16(&b, 0);     /* comment */
    put16(&b, 0);     /* disk */
    put16(&b, 0);     /* internal attributes */
    put32(&b, 0);     /* external attributes */
    put32(&b, (uint32_t)e->offset);
    accel_status st = emit(z, h, sizeof h);
    return st ? st : emit(z, e->name, strlen(e->name));
}

/* ZIP64 end record + locator + classic end record, as torch writes them. */
static accel_status write_end(accel__zip *z, uint64_t cd_offset, uint64_t cd_size) {
    unsigned char t[56 + 20 + 22];
    le_buf b = {t};
    uint64_t end64_at = z->pos;
    put32(&b, ACCEL__ZIP_SIG_END64);
    put64(&b, 44);          /* size of the rest of this record */
    put16(&b, 0x031e);      /* version made by: unix, 3.0 */
    put16(&b, 0x002d);      /* version needed: 4.5 (ZIP64) */
    put32(&b, 0);           /* this disk */
    put32(&b, 0);           /* central directory's disk */
    put64(&b, (uint64_t)z->n);
    put64(&b, (uint64_t)z->n);
    put64(&b, cd_size);
    put64(&b, cd_offset);
    put32(&b, ACCEL__ZIP_SIG_LOCATOR64);
    put32(&b, 0);
    put64(&b, end64_at);
    put32(&b, 1);           /* disks */
    put32(&b, ACCEL__ZIP_SIG_END);
    put16(&b, 0);
    put16(&b, 0);
    put16(&b, (uint32_t)z->n);
    put16(&b, (uint32_t)z->n);
    put32(&b, (uint32_t)cd_size);
    put32(&b, (uint32_t)cd_offset);
    put16(&b, 0);           /* comment */
    return emit(z, t, sizeof t);
}

static void free_entries(accel__zip *z) {
    for (int i = 0; i < z->n; i++) accel_free(z->entries[i].name);
    accel_free(z->entries);
    z->entries = NULL;
    z->n = z->cap = 0;
}

accel_status accel__zip_commit(accel__zip *z) {
    accel_status st = z->in_entry || z->n > 0xFFFF
                          ? accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %d zip entries (or one left open)",
                                            z->f.path, z->n)
                          : ACCEL_OK;
    uint64_t cd_offset = z->pos;
    for (int i = 0; i < z->n && !st; i++) st = write_central_entry(z, &z->entries[i]);
    if (!st) st = write_end(z, cd_offset, z->pos - cd_offset);
    if (!st) st = accel__afile_commit(&z->f);
    else accel__afile_abort(&z->f);
    free_entries(z);
    return st;
}

void accel__zip_abort(accel__zip *z) {
    accel__afile_abort(&z->f);
    free_entries(z);
}
