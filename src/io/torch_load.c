/* src/io/torch_load.c — reading torch.save's zip files (torch >= 1.6) as
 * accel_safetensors handles: the records through the zip's central directory
 * (zip_read.c), data.pkl through the restricted unpickler
 * (torch_unpickle.c), and each tensor's bytes in place in the mapped file,
 * after checking that its storage record is stored (not compressed), holds
 * the storage the pickle declares, and holds the tensor. A tensor that is not
 * contiguous (a transpose, an expand) is gathered into an owned copy, at most
 * the size of its storage record, all of them at most the file's size; every
 * other tensor is zero-copy. */
#include <string.h>

#include "core/core_internal.h"
#include "io/safetensors_internal.h"
#include "io/torch_unpickle.h"
#include "io/zip_read.h"

#define ARCH_MAX 4096 /* an archive's folder name, and a storage key, in bytes */

/* The archive's folder: the one "<arch>/data.pkl" record (torch names the
 * folder after the file; any name is accepted, as torch.load does). */
static const accel__zip_rec *find_pickle(const char *path, const accel__zip_dir *z) {
    const accel__zip_rec *found = NULL;
    for (int i = 0; i < z->n; i++) {
        const char *name = z->recs[i].name, *slash = strchr(name, '/');
        if (!slash || slash == name || strcmp(slash, "/data.pkl")) continue;
        if (found) {
            accel_set_error(ACCEL_ERR_FORMAT, "%s: two archives in one file ('%s' and '%s')", path, found->name, name);
            return NULL;
        }
        found = &z->recs[i];
    }
    if (!found)
        accel_set_error(ACCEL_ERR_FORMAT, "%s: a zip archive without a <archive>/data.pkl record: not a file "
                        "torch.save wrote", path);
    return found;
}

/* A record's bytes, which must be stored: accel reads them in place. */
static const accel__zip_rec *stored(const char *path, const accel__zip_dir *z, const char *name, const char *tensor) {
    const accel__zip_rec *r = accel__zip_find(z, name);
    if (!r) {
        if (tensor) accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': its storage record '%s' is missing", path,
                                    tensor, name);
        return NULL;
    }
    if (r->method != 0) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: record '%s'%s%s%s is compressed (zip method %u): torch.save "
                        "stores records uncompressed and accel reads them in place; re-save the file with torch.save",
                        path, name, tensor ? " (tensor '" : "", tensor ? tensor : "", tensor ? "')" : "", r->method);
        return NULL;
    }
    return r;
}

/* <arch>/byteorder, where present (torch >= 1.13 writes it): "little". */
static accel_status check_byteorder(const char *path, const unsigned char *map, const accel__zip_dir *z,
                                    const char *arch) {
    char name[ARCH_MAX + 16];
    snprintf(name, sizeof name, "%s/byteorder", arch);
    if (!accel__zip_find(z, name)) return ACCEL_OK; /* older files: little-endian */
    const accel__zip_rec *r = stored(path, z, name, NULL);
    if (!r) return accel_last_status();
    if (r->size == 6 && !memcmp(map + r->data_at, "little", 6)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: the tensors are stored %s-endian: accel reads little-endian "
                           "files only", path, r->size == 3 && !memcmp(map + r->data_at, "big", 3) ? "big" : "other than little");
}

static bool contiguous(const accel__torch_tensor *t) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] == 0) return true; /* no element: any strides */
        if (t->shape[d] != 1 && t->stride[d] != want) return false;
        want *= t->shape[d]; /* no overflow: numel was checked first */
    }
    return true;
}

/* Gathers the strided elements of t from base into dst (t's numel elements of esz bytes). */
static void gather(unsigned char *dst, const unsigned char *base, const accel__torch_tensor *t, size_t esz,
                   uint64_t numel) {
    int64_t idx[ACCEL_MAX_DIMS] = {0};
    for (uint64_t k = 0; k < numel; k++) {
        int64_t at = t->offset;
        for (int d = 0; d < t->ndim; d++) at += idx[d] * t->stride[d];
        memcpy(dst + k * esz, base + (uint64_t)at * esz, esz);
        for (int d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
    }
}

typedef struct built {
    accel_st_info *info;
    int n;
    void **copies; /* owned gathers of the strided tensors */
    int n_copies;
    uint64_t copied;   /* their bytes, at most the file's size */
    size_t file_size;
} built;

/* t's accel_st_info: its storage record checked against the pickle's claims. */
static accel_status tensor_info(const char *path, const unsigned char *map, const accel__zip_dir *z, const char *arch,
                                const accel__torch_tensor *t, built *b, accel_st_info *out) {
    char *name = accel_malloc(t->name_len + 1);
    if (!name) return accel_last_status();
    memcpy(name, t->name, t->name_len);
    name[t->name_len] = 0;
    out->name = name; /* owned from here: freed with the handle */
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof t->shape);
    char rec[2 * ARCH_MAX + 16], sh[160];
    if (t->key_len >= ARCH_MAX)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': its storage key is longer than %d bytes", path, name,
                               ARCH_MAX - 1);
    snprintf(rec, sizeof rec, "%s/data/%.*s", arch, (int)t->key_len, t->key);
    const accel__zip_rec *r = stored(path, z, rec, name);
    if (!r) return accel_last_status();
    size_t esz = accel_dtype_size(t->dtype);
    uint64_t numel = 1, need, last = (uint64_t)t->offset;
    bool over = false;
    for (int d = 0; d < t->ndim; d++) {
        over |= __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel);
        uint64_t span;
        if (t->shape[d] > 0) {
            over |= __builtin_mul_overflow((uint64_t)t->shape[d] - 1, (uint64_t)t->stride[d], &span);
            over |= __builtin_add_overflow(last, span, &last);
        }
    }
    accel_shape_str_n(t->ndim, t->shape, sh, sizeof sh);
    if (over || __builtin_mul_overflow((uint64_t)t->storage_numel, esz, &need) || numel > SIZE_MAX / esz)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': shape %s (or its storage) is too large", path, name, sh);
    if (need > r->size)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': its storage '%s' should hold %lld %s elements "
                               "(%llu bytes) but the record has %llu bytes (truncated?)", path, name, rec,
                               (long long)t->storage_numel, accel_dtype_name(t->dtype), (unsigned long long)need,
                               (unsigned long long)r->size);
    if (numel > 0 && last >= (uint64_t)t->storage_numel)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': shape %s at offset %lld reaches element %llu of "
                               "a storage of %lld", path, name, sh, (long long)t->offset, (unsigned long long)last,
                               (long long)t->storage_numel);
    const unsigned char *base = map + r->data_at;
    out->nbytes = (size_t)(numel * esz);
    out->begin = r->data_at + (numel ? (uint64_t)t->offset * esz : 0);
    out->end = out->begin + out->nbytes;
    if (numel == 0 || contiguous(t)) {
        out->bytes = numel ? base + (uint64_t)t->offset * esz : base;
        return ACCEL_OK;
    }
    /* strided: a copy, which a storage record bounds (an expand of one element to
     * a huge shape would otherwise be a huge allocation) */
    if (out->nbytes > r->size)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: tensor '%s': shape %s is strided over a smaller "
                               "storage (%llu bytes; an expand?): accel copies strided tensors only up to their "
                               "storage's size; save tensor.contiguous()", path, name, sh, (unsigned long long)r->size);
    /* and all of them up to the file's size: a pickle may name one strided tensor
     * under many names, a few bytes each, and each name would be a copy */
    if (out->nbytes > b->file_size - b->copied)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: tensor '%s': its strided copy brings the copies of strided "
                               "tensors to %llu bytes, more than the file's %zu: accel copies strided tensors only up "
                               "to the file's size in all; save tensor.contiguous()", path, name,
                               (unsigned long long)(b->copied + out->nbytes), b->file_size);
    b->copied += out->nbytes;
    unsigned char *copy = accel_malloc(out->nbytes);
    if (!copy) return accel_last_status();
    b->copies[b->n_copies++] = copy;
    gather(copy, base, t, esz, numel);
    out->bytes = copy;
    /* the bytes in the file it was gathered from: its storage record (from
     * its offset, its last element, reached past the end of the file) */
    out->begin = r->data_at;
    out->end = r->data_at + r->size;
    return ACCEL_OK;
}

static accel_status build(const char *path, const unsigned char *map, const accel__zip_dir *z, built *b) {
    const accel__zip_rec *pkl_rec = find_pickle(path, z);
    if (!pkl_rec) return accel_last_status();
    char arch[ARCH_MAX];
    size_t arch_len = (size_t)(strchr(pkl_rec->name, '/') - pkl_rec->name);
    if (arch_len >= ARCH_MAX)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: the archive's name is longer than %d bytes", path, ARCH_MAX - 1);
    snprintf(arch, sizeof arch, "%.*s", (int)arch_len, pkl_rec->name);
    if (!stored(path, z, pkl_rec->name, NULL) || check_byteorder(path, map, z, arch)) return accel_last_status();
    accel__torch_tensor *t = NULL;
    int n = 0;
    accel_status st = accel__torch_unpickle(path, map + pkl_rec->data_at, (size_t)pkl_rec->size, &t, &n);
    if (st) return st;
    b->info = accel_calloc((size_t)n + 1, sizeof *b->info);
    b->copies = accel_calloc((size_t)n + 1, sizeof *b->copies);
    st = b->info && b->copies ? ACCEL_OK : accel_last_status();
    for (int i = 0; i < n && !st; i++) {
        st = tensor_info(path, map, z, arch, &t[i], b, &b->info[i]);
        if (b->info[i].name) b->n = i + 1; /* named ones are freed by the caller */
    }
    accel_free(t);
    return st;
}

accel_status accel__torch_read(const char *path, const unsigned char *map, size_t size, accel_st_info **info, int *n,
                               void ***copies, int *n_copies) {
    accel__zip_dir z;
    built b = {.file_size = size};
    accel_status st = accel__zip_read_dir(path, map, size, &z);
    if (!st) {
        st = build(path, map, &z, &b);
        accel__zip_dir_free(&z);
    }
    /* handed over even on failure: the caller frees names and copies */
    *info = b.info;
    *n = b.n;
    *copies = b.copies;
    *n_copies = b.n_copies;
    return st;
}
