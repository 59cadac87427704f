/* src/io/safetensors_read.c — mapping and validating safetensors files.
 *
 * Nothing in the file is trusted: the header length, the JSON, every dtype,
 * shape and offset are checked before any pointer into the mapping is formed. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/io.h"
#include "core/core_internal.h"
#include "core/host_stage.h"
#include "io/io_internal.h"
#include "io/safetensors_internal.h"


struct accel_safetensors {
    char *path;
    unsigned char *map;       /* whole file */
    size_t map_size;
    bool mapped;              /* map came from mmap (else a caller's buffer) */
    const unsigned char *section; /* the data section */
    uint64_t data_size;
    int n;
    accel_st_info *info;      /* sorted by begin (file order) */
    int *by_name;             /* indices into info sorted by name */
    int n_meta;
    char **meta_keys, **meta_values;
    void **copies;            /* a torch file's strided tensors, gathered (torch_load.c) */
    int n_copies;
};

/* Known safetensors dtypes accel cannot hold: a clear "unsupported" instead of "unknown". */
static const char *const ST_UNSUPPORTED[] = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2",
                                             "F4", "U16", "U32", "U64", "C64", "C128"};

int accel__st_dtype_parse(const char *s) {
    static const struct { const char *n; accel_dtype dt; } T[] = {
        {"F64", ACCEL_F64}, {"F32", ACCEL_F32}, {"F16", ACCEL_F16}, {"BF16", ACCEL_BF16},
        {"I64", ACCEL_I64}, {"I32", ACCEL_I32}, {"I16", ACCEL_I16}, {"I8", ACCEL_I8},
        {"U8", ACCEL_U8},   {"BOOL", ACCEL_BOOL}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (strcmp(s, T[i].n) == 0) return (int)T[i].dt;
    return -1;
}

/* torch.save's legacy format (torch < 1.6): the pickled magic number
 * (protocol 2, LONG1 of 10 bytes, 0x1950a86a20f9469cfc6c) opens the file. */
static bool is_legacy_torch_file(const unsigned char *p, size_t n) {
    static const unsigned char legacy[14] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                             0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    return n >= sizeof legacy && !memcmp(p, legacy, sizeof legacy);
}

/* torch >= 1.6's files are zip archives: a local header "PK\3\4" first. */
static bool is_zip(const unsigned char *p, size_t n) { return n >= 4 && !memcmp(p, "PK\3\4", 4); }

static accel_safetensors *st_fail(accel_safetensors *st, json_t *root) {
    if (root) json_decref(root);
    accel_safetensors_close(st);
    return NULL;
}

static int cmp_begin(const void *a, const void *b) {
    const accel_st_info *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* qsort_r's comparison of two indices into the accel_st_info array ctx, by name. */
static int cmp_name_idx(const void *a, const void *b, void *ctx) {
    const accel_st_info *info = ctx;
    return strcmp(info[*(const int *)a].name, info[*(const int *)b].name);
}

static accel_status parse_metadata(accel_safetensors *st, json_t *meta) {
    if (!json_is_object(meta))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: __metadata__ must be an object of strings",
                               st->path);
    size_t n = json_object_size(meta);
    st->meta_keys = accel_calloc(n ? n : 1, sizeof(char *));
    st->meta_values = accel_calloc(n ? n : 1, sizeof(char *));
    if (!st->meta_keys || !st->meta_values) return accel_last_status();
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return accel_set_error(ACCEL_ERR_FORMAT,
                                   "%s: __metadata__ value of '%s' must be a string", st->path, k);
        st->meta_keys[st->n_meta] = accel_strdup(k);
        st->meta_values[st->n_meta] = accel_strdup(json_string_value(v));
        if (!st->meta_keys[st->n_meta] || !st->meta_values[st->n_meta]) return accel_last_status();
        st->n_meta++;
    }
    const char *fmt = accel_safetensors_metadata(st, "format");
    if (fmt && strcmp(fmt, "pt") && strcmp(fmt, "tf") && strcmp(fmt, "flax") && strcmp(fmt, "mlx"))
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: __metadata__ format '%s' is not one of pt, tf, flax, mlx",
                               st->path, fmt);
    return ACCEL_OK;
}

static accel_status parse_u64(const accel_safetensors *st, const char *name, const char *what,
                              json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': %s must be non-negative integers",
                               st->path, name, what);
    *out = (uint64_t)json_integer_value(v);
    return ACCEL_OK;
}

static accel_status parse_tensor(accel_safetensors *st, const char *name, json_t *v,
                                 accel_st_info *out) {
    const char *p = st->path;
    if (!json_is_object(v))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': entry must be an object", p, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': missing string 'dtype'", p, name);
    const char *ds = json_string_value(jd);
    int dt = accel__st_dtype_parse(ds);
    if (dt < 0) {
        for (size_t i = 0; i < sizeof ST_UNSUPPORTED / sizeof ST_UNSUPPORTED[0]; i++)
            if (strcmp(ds, ST_UNSUPPORTED[i]) == 0)
                return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                                       "%s: tensor '%s': dtype %s is not supported by accel "
                                       "(supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)",
                                       p, name, ds);
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", p, name, ds);
    }
    if (!json_is_array(js))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': missing array 'shape'", p, name);
    size_t nd = json_array_size(js);
    if (nd > ACCEL_MAX_DIMS)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': %zu dimensions, at most %d supported",
                               p, name, nd, ACCEL_MAX_DIMS);
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d = 0;
        if (parse_u64(st, name, "shape", json_array_get(js, i), &d)) return accel_last_status();
        out->shape[i] = (int64_t)d;
        overflow |= __builtin_mul_overflow(numel, d, &numel);
    }
    out->ndim = (int)nd;
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be [begin, end]",
                               p, name);
    if (parse_u64(st, name, "data_offsets", json_array_get(jo, 0), &out->begin) ||
        parse_u64(st, name, "data_offsets", json_array_get(jo, 1), &out->end))
        return accel_last_status();
    out->dtype = (accel_dtype)dt;
    char sh[160];
    accel_shape_str_n(out->ndim, out->shape, sh, sizeof sh);
    if (out->begin > out->end)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                               p, name, (unsigned long long)out->begin, (unsigned long long)out->end);
    if (out->end > st->data_size)
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the "
                               "data section (%llu bytes)",
                               p, name, (unsigned long long)out->begin, (unsigned long long)out->end,
                               (unsigned long long)st->data_size);
    uint64_t need;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)accel_dtype_size(out->dtype), &need);
    uint64_t have = out->end - out->begin;
    if (overflow || need != have) {
        if (overflow)
            return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s': shape %s of %s is too large",
                                   p, name, sh, ds);
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but shape %s "
                               "of %s needs %llu",
                               p, name, (unsigned long long)out->begin, (unsigned long long)out->end,
                               (unsigned long long)have, sh, ds, (unsigned long long)need);
    }
    out->nbytes = (size_t)have;
    out->bytes = st->section + out->begin;
    out->name = accel_strdup(name);
    return out->name ? ACCEL_OK : accel_last_status();
}

/* The safetensors crate's rule (Metadata::validate, then read_metadata): in
 * offset order every tensor begins where the previous one ended (the first at
 * 0), and the last end is the end of the file. A gap, an overlap or a stray
 * byte means the header and the data disagree, e.g. a header length one byte
 * off (still valid JSON thanks to the padding) that shifts every weight. */
static accel_status check_coverage(const accel_safetensors *st) {
    uint64_t at = 0;
    const accel_st_info *prev = NULL;
    for (int i = 0; i < st->n; i++) {
        const accel_st_info *c = &st->info[i];
        if (c->begin < at)
            return accel_set_error(ACCEL_ERR_FORMAT,
                                   "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' "
                                   "[%llu, %llu]",
                                   st->path, c->name, (unsigned long long)c->begin,
                                   (unsigned long long)c->end, prev->name,
                                   (unsigned long long)prev->begin, (unsigned long long)prev->end);
        if (c->begin > at)
            return accel_set_error(ACCEL_ERR_FORMAT,
                                   "%s: tensor '%s': data_offsets [%llu, %llu] leave bytes [%llu, %llu) "
                                   "of the data section in no tensor (offsets must be contiguous from 0)",
                                   st->path, c->name, (unsigned long long)c->begin,
                                   (unsigned long long)c->end, (unsigned long long)at,
                                   (unsigned long long)c->begin);
        at = c->end;
        prev = c;
    }
    if (at != st->data_size)
        return accel_set_error(ACCEL_ERR_FORMAT,
                               "%s: the data section has %llu bytes but the tensors cover %llu: the file is "
                               "not fully covered (a wrong header length, or bytes appended)",
                               st->path, (unsigned long long)st->data_size, (unsigned long long)at);
    return ACCEL_OK;
}

static accel_status index_names(accel_safetensors *st);

static accel_status parse_header(accel_safetensors *st, json_t *root) {
    if (!json_is_object(root))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: header must be a JSON object", st->path);
    size_t n = json_object_size(root);
    st->info = accel_calloc(n ? n : 1, sizeof(accel_st_info));
    if (!st->info) return accel_last_status();
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__") == 0) {
            if (!json_is_null(v) && parse_metadata(st, v)) return accel_last_status();
            continue;
        }
        if (parse_tensor(st, k, v, &st->info[st->n])) return accel_last_status();
        st->n++;
    }
    qsort(st->info, (size_t)st->n, sizeof(accel_st_info), cmp_begin);
    if (check_coverage(st)) return accel_last_status();
    return index_names(st);
}

/* st->by_name, the binary search's order; a name given twice is an error. */
static accel_status index_names(accel_safetensors *st) {
    st->by_name = accel_malloc(sizeof(int) * (size_t)(st->n ? st->n : 1));
    if (!st->by_name) return accel_last_status();
    for (int i = 0; i < st->n; i++) st->by_name[i] = i;
    qsort_r(st->by_name, (size_t)st->n, sizeof(int), cmp_name_idx, st->info);
    for (int i = 1; i < st->n; i++)
        if (strcmp(st->info[st->by_name[i]].name, st->info[st->by_name[i - 1]].name) == 0)
            return accel_set_error(ACCEL_ERR_FORMAT, "%s: tensor '%s' appears twice", st->path,
                                   st->info[st->by_name[i]].name);
    return ACCEL_OK;
}

accel_safetensors *accel__safetensors_parse(const char *path, void *map, size_t size) {
    accel_safetensors *st = accel_calloc(1, sizeof *st);
    if (!st) return NULL;
    st->path = accel_strdup(path);
    st->map = map;
    st->map_size = size;
    if (!st->path) return st_fail(st, NULL);
    if (size < 8) {
        accel_set_error(ACCEL_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length",
                        path, size);
        return st_fail(st, NULL);
    }
    if (is_zip(st->map, size)) {
        /* the same handle over a torch.save file: tensors in place in the mapping */
        st->section = st->map;
        st->data_size = size;
        if (accel__torch_read(path, st->map, size, &st->info, &st->n, &st->copies, &st->n_copies))
            return st_fail(st, NULL);
        qsort(st->info, (size_t)st->n, sizeof(accel_st_info), cmp_begin);
        return index_names(st) ? st_fail(st, NULL) : st;
    }
    if (is_legacy_torch_file(st->map, size)) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED,
                        "%s: is a PyTorch file in torch's legacy pickle format (torch < 1.6), not safetensors: accel "
                        "reads safetensors and torch >= 1.6's zip files; re-save it with a newer torch.save, or "
                        "convert it with safetensors.torch.save_file(torch.load(path), ...)",
                        path);
        return st_fail(st, NULL);
    }
    uint64_t hlen = accel__read_le(st->map, 8);
    if (hlen > size - 8) {
        accel_set_error(ACCEL_ERR_FORMAT,
                        "%s: header length %llu runs past the end of the file (%zu bytes): truncated "
                        "or not a safetensors file",
                        path, (unsigned long long)hlen, size);
        return st_fail(st, NULL);
    }
    if (hlen > ACCEL__ST_MAX_HEADER) {
        accel_set_error(ACCEL_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit", path,
                        (unsigned long long)hlen);
        return st_fail(st, NULL);
    }
    st->section = st->map + 8 + hlen;
    st->data_size = size - 8 - hlen;
    json_error_t err;
    json_t *root = json_loadb((const char *)st->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        accel_set_error(ACCEL_ERR_FORMAT, "%s: header is not valid JSON (byte %d): %s", path,
                        err.position, err.text);
        return st_fail(st, NULL);
    }
    if (parse_header(st, root)) return st_fail(st, root);
    json_decref(root);
    return st;
}

accel_safetensors *accel_safetensors_open(const char *path) {
    if (!path) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_safetensors_open: path is NULL");
        return NULL;
    }
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        accel_set_error(ACCEL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    const char *why = fstat(fd, &sb) != 0 ? strerror(errno) : NULL;
    if (why || !S_ISREG(sb.st_mode)) {
        close(fd);
        if (why) accel_set_error(ACCEL_ERR_IO, "%s: cannot be read: %s", path, why);
        else accel_set_error(ACCEL_ERR_IO, "%s: is %s, not a safetensors file", path, accel__file_kind(sb.st_mode));
        return NULL;
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        /* Private + writable: tensors used in place may be written (copy on
         * write) without ever changing the file. NORESERVE: no swap charge. */
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            accel_set_error(ACCEL_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
            return NULL;
        }
    }
    close(fd);
    accel_safetensors *st = accel__safetensors_parse(path, map, size);
    if (!st && map) munmap(map, size);
    if (st) st->mapped = size > 0;
    return st;
}

void accel_safetensors_close(accel_safetensors *st) {
    if (!st) return;
    if (st->mapped) munmap(st->map, st->map_size);
    for (int i = 0; i < st->n; i++) accel_free((char *)st->info[i].name);
    for (int i = 0; i < st->n_meta; i++) {
        accel_free(st->meta_keys[i]);
        accel_free(st->meta_values[i]);
    }
    accel_free(st->meta_keys);
    accel_free(st->meta_values);
    for (int i = 0; i < st->n_copies; i++) accel_free(st->copies[i]);
    accel_free(st->copies);
    accel_free(st->info);
    accel_free(st->by_name);
    accel_free(st->path);
    accel_free(st);
}

const char *accel_safetensors_path(const accel_safetensors *st) { return st ? st->path : NULL; }

bool accel__safetensors_in_file_map(const accel_safetensors *f, const void *p, size_t n) {
    uintptr_t at = (uintptr_t)p, lo = f ? (uintptr_t)f->map : 0;
    return f && f->mapped && at >= lo && n <= f->map_size && at - lo <= f->map_size - n;
}
int accel_safetensors_count(const accel_safetensors *st) { return st ? st->n : 0; }

const accel_st_info *accel_safetensors_at(const accel_safetensors *st, int i) {
    if (!st || i < 0 || i >= st->n) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_safetensors_at: index %d out of range", i);
        return NULL;
    }
    return &st->info[i];
}

const accel_st_info *accel_safetensors_find(const accel_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const accel_st_info *c = &st->info[st->by_name[mid]];
        int r = strcmp(name, c->name);
        if (r == 0) return c;
        if (r < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *accel_safetensors_metadata(const accel_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}

static const accel_st_info *st_lookup(const accel_safetensors *st, const char *name, const char *op) {
    if (!st || !name) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: NULL argument", op);
        return NULL;
    }
    const accel_st_info *in = accel_safetensors_find(st, name);
    if (!in) accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s has no tensor '%s'", op, st->path, name);
    return in;
}

static size_t st_numel(const accel_st_info *in) {
    size_t esz = accel_dtype_size(in->dtype);
    return in->nbytes / (esz ? esz : 1);
}

/* in's elements, converted to ddt, into host memory dst. Tolerates a source
 * not aligned to its element size (files written by other tools may not pad
 * their header). */
static void convert_all(void *dst, accel_dtype ddt, const accel_st_info *in) {
    accel__convert_unaligned(dst, ddt, in->bytes, in->dtype, st_numel(in));
}

/* in's elements converted to dst's dtype into dst (contiguous, not on the
 * cpu): from the mapping through the pinned staging chunks straight into the
 * device's memory, converting chunk by chunk; no host copy of the tensor. */
static accel_status load_to_device(accel_tensor *dst, const accel_st_info *in, const char *op) {
    return accel__stage_to_device(dst->device, accel__device_ptr(dst), in->bytes, in->dtype, dst->dtype,
                                  st_numel(in), op);
}

accel_tensor *accel__st_tensor(const accel_st_info *in, int want, const char *op) {
    if (want >= ACCEL_DTYPE_COUNT || want < -1) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: bad dtype %d", op, want);
        return NULL;
    }
    accel_dtype dt = want < 0 ? in->dtype : (accel_dtype)want;
    if (dt == in->dtype && ((uintptr_t)in->bytes % accel_dtype_size(dt)) == 0) {
        accel_tensor *t = accel_tensor_wrap((void *)in->bytes, dt, in->ndim, in->shape, ACCEL_CPU_DEVICE);
        if (t) t->flags |= ACCEL_TF_MMAP;
        return t;
    }
    accel_tensor *t = accel_tensor_new(dt, in->ndim, in->shape, ACCEL_CPU_DEVICE);
    if (t) convert_all(accel__host_ptr(t, op), dt, in);
    return t;
}

accel_status accel__st_load_into(const accel_st_info *in, const char *file, accel_tensor *dst,
                                 const char *op) {
    if (!accel_tensor_check(dst, op, "dst")) return accel_last_status();
    if (dst->device.type == ACCEL_DEV_META || !accel_is_contiguous(dst))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: destination for '%s' must be a contiguous tensor with memory (not meta)",
                               op, in->name);
    if (!accel__st_shape_is(in, dst)) {
        char a[160], b[160];
        return accel_set_error(ACCEL_ERR_SHAPE,
                               "%s: tensor '%s' in %s has shape %s but the destination has shape %s",
                               op, in->name, file, accel_shape_str_n(in->ndim, in->shape, a, sizeof a),
                               accel_shape_str(dst, b, sizeof b));
    }
    if (dst->device.type != ACCEL_DEV_CPU) return load_to_device(dst, in, op);
    void *host = accel__host_ptr(dst, op);
    if (!host && in->nbytes > 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: destination for '%s' has no memory", op, in->name);
    convert_all(host, dst->dtype, in);
    accel__tensor_written(dst);
    return ACCEL_OK;
}

accel_tensor *accel_safetensors_tensor(accel_safetensors *st, const char *name, int want) {
    const accel_st_info *in = st_lookup(st, name, "accel_safetensors_tensor");
    return in ? accel__st_tensor(in, want, "accel_safetensors_tensor") : NULL;
}

accel_status accel_safetensors_load_into(accel_safetensors *st, const char *name, accel_tensor *dst) {
    const accel_st_info *in = st_lookup(st, name, "accel_safetensors_load_into");
    if (!in) return accel_last_status();
    return accel__st_load_into(in, st->path, dst, "accel_safetensors_load_into");
}
