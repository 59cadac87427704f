/* src/io/zip_read.h — the records of a zip archive found through its central
 * directory (ZIP64 end record and per-entry ZIP64 fields included), for
 * reading torch.save's files in place (torch_load.c). Every offset, size and
 * count comes from the file and is checked against it before use: a record
 * handed out lies inside the file. Internal: prefix accel__, not installed. */
#ifndef ACCEL_ZIP_READ_H
#define ACCEL_ZIP_READ_H

#include <stddef.h>
#include <stdint.h>

#include "accel/core.h"

typedef struct accel__zip_rec {
    const char *name;   /* NUL-terminated copy (the archive's bytes may hold none) */
    uint16_t method;    /* 0: stored; anything else is compressed */
    uint64_t size;      /* the stored bytes (compressed size) */
    uint64_t data_at;   /* file offset of the record's bytes: data_at + size <= file size */
} accel__zip_rec;

typedef struct accel__zip_dir {
    int n;
    accel__zip_rec *recs; /* sorted by name (bsearch) */
    char *names;          /* one block holding every name */
} accel__zip_dir;

/* Reads the central directory of the `size` bytes at p, named `path` in
 * messages. ACCEL_ERR_FORMAT naming the file for anything out of bounds or
 * inconsistent (no end record, a record past the end, a local header that
 * disagrees with its central entry, a name given twice); multi-disk and
 * encrypted archives are ACCEL_ERR_UNSUPPORTED. */
accel_status accel__zip_read_dir(const char *path, const unsigned char *p, size_t size, accel__zip_dir *out);
void accel__zip_dir_free(accel__zip_dir *d);
/* The record named `name`, NULL when absent. */
const accel__zip_rec *accel__zip_find(const accel__zip_dir *d, const char *name);

#endif
