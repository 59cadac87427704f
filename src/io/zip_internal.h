/* src/io/zip_internal.h — the zip archive torch.save writes (PyTorch's
 * PyTorchStreamWriter over miniz): stored (uncompressed) entries, each local
 * header padded with an "FB" extra field so the data starts on a 64-byte
 * boundary, zero time/date, flags 0x0808 (UTF-8 names, CRC-32 and sizes in a
 * data descriptor after the data; an empty entry: 0x0800, no descriptor, as
 * miniz writes it), then the central directory and a ZIP64 end
 * record as torch writes it even for small files. Entries and the archive are
 * limited to 4 GiB (no ZIP64 per-entry fields): larger is refused by name.
 * Written atomically (io_internal.h's afile). Internal: not installed. */
#ifndef ACCEL_ZIP_INTERNAL_H
#define ACCEL_ZIP_INTERNAL_H

#include <stdint.h>

#include "io/io_internal.h"

#define ACCEL__ZIP_ALIGN 64
#define ACCEL__ZIP_MAX 0xFFFFFFFFull /* 4 GiB - 1: sizes and offsets of plain zip fields */

typedef struct accel__zip_entry {
    char *name;
    uint32_t crc;
    uint64_t size;   /* written so far */
    uint64_t declared;
    uint64_t offset; /* of the local header */
} accel__zip_entry;

typedef struct accel__zip {
    accel__afile f;
    uint64_t pos;              /* bytes written so far */
    accel__zip_entry *entries; /* accel_malloc'd, n of cap */
    int n, cap;
    bool in_entry;             /* between begin and end */
} accel__zip;

accel_status accel__zip_open(accel__zip *z, const char *path);
/* Starts entry `name` of `size` bytes: its local header, padded so the data
 * is 64-aligned. */
accel_status accel__zip_begin(accel__zip *z, const char *name, uint64_t size);
/* Appends to the open entry (CRC-32 and size are accumulated). */
accel_status accel__zip_write(accel__zip *z, const void *p, size_t n);
/* Closes the open entry (its data descriptor); a size other than the
 * declared one is an error. */
accel_status accel__zip_end(accel__zip *z);
/* begin + write + end of one small entry. */
accel_status accel__zip_record(accel__zip *z, const char *name, const void *p, size_t n);
/* Central directory + end records, fsync, rename into place; frees z. */
accel_status accel__zip_commit(accel__zip *z);
/* Removes the temporary file; frees z. Safe after a failed open. */
void accel__zip_abort(accel__zip *z);

#endif
