/* src/io/torch_save.c — what torch.save(state_dict) writes (torch >= 1.6's
 * zip format), for save_model(safe_serialization=False):
 *
 *   <archive>/data.pkl            pickle protocol 2 of {name: tensor}
 *   <archive>/.format_version     "1"
 *   <archive>/.storage_alignment  "64"
 *   <archive>/byteorder           "little"
 *   <archive>/data/<k>            storage k's bytes, 64-byte aligned
 *   <archive>/version             "3\n"
 *
 * <archive> is the file's basename without its extension, as torch names it.
 * Each tensor pickles as torch._utils._rebuild_tensor_v2(storage, offset,
 * size, stride, requires_grad=False, OrderedDict()) with the storage a
 * persistent id ('storage', torch.<Type>Storage, '<k>', 'cpu', numel). The
 * opcodes and memo (BINPUT/BINGET) are those CPython's pickler emits for the
 * dict Accelerate hands torch.save, so data.pkl is byte-identical to torch's
 * (tests/test_torch_save.c compares with files torch wrote). torch's
 * .data/serialization_id record (a hash over the records, used by nothing
 * that loads) is not written. */
#include <string.h>

#include "accel/io.h"
#include "accel/tracking.h"
#include "io/io_internal.h"
#include "io/torch_pickle.h"
#include "io/zip_internal.h"

#define SETITEMS_BATCH 1000 /* CPython's _BATCHSIZE */
#define NOT_YET -1

/* A growing byte buffer plus the pickler's memo counter. `oom` sticks. */
typedef struct pickler {
    unsigned char *buf;
    size_t len, cap;
    int64_t memo;  /* next memo index */
    bool oom;
} pickler;

static void pk_bytes(pickler *pk, const void *p, size_t n) {
    if (pk->oom) return;
    if (pk->len + n > pk->cap) {
        size_t cap = pk->cap ? pk->cap : 256;
        while (cap < pk->len + n) cap *= 2;
        unsigned char *grown = accel_malloc(cap);
        if (!grown) {
            pk->oom = true;
            return;
        }
        if (pk->len) memcpy(grown, pk->buf, pk->len);
        accel_free(pk->buf);
        pk->buf = grown;
        pk->cap = cap;
    }
    memcpy(pk->buf + pk->len, p, n);
    pk->len += n;
}
static void pk_op(pickler *pk, int op) {
    unsigned char c = (unsigned char)op;
    pk_bytes(pk, &c, 1);
}
static void pk_u32(pickler *pk, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    pk_bytes(pk, b, 4);
}

/* Index-sized operand: the 1-byte opcode form below 256, else the 4-byte one. */
static void pk_memo_op(pickler *pk, int short_op, int long_op, int64_t idx) {
    if (idx < 256) {
        pk_op(pk, short_op);
        pk_op(pk, (int)idx);
    } else {
        pk_op(pk, long_op);
        pk_u32(pk, (uint32_t)idx);
    }
}
/* Memoizes the object just written; returns its memo index. */
static int64_t pk_put(pickler *pk) {
    pk_memo_op(pk, OP_BINPUT, OP_LONG_BINPUT, pk->memo);
    return pk->memo++;
}
static void pk_get(pickler *pk, int64_t idx) { pk_memo_op(pk, OP_BINGET, OP_LONG_BINGET, idx); }

static int64_t pk_str(pickler *pk, const char *s) {
    size_t n = strlen(s);
    pk_op(pk, OP_BINUNICODE);
    pk_u32(pk, (uint32_t)n);
    pk_bytes(pk, s, n);
    return pk_put(pk);
}
/* An object pickled once and fetched from the memo afterwards (the same
 * Python object each time: an interned string, a class). */
static void pk_str_once(pickler *pk, int64_t *memo, const char *s) {
    if (*memo == NOT_YET) *memo = pk_str(pk, s);
    else pk_get(pk, *memo);
}
static void pk_global_once(pickler *pk, int64_t *memo, const char *module, const char *name) {
    if (*memo != NOT_YET) {
        pk_get(pk, *memo);
        return;
    }
    pk_op(pk, OP_GLOBAL);
    pk_bytes(pk, module, strlen(module));
    pk_op(pk, '\n');
    pk_bytes(pk, name, strlen(name));
    pk_op(pk, '\n');
    *memo = pk_put(pk);
}

/* CPython's save_long for protocol 2 of a v >= 0 (sizes, strides, counts):
 * BININT1, BININT2, BININT, else LONG1 (little-endian, a zero byte added
 * when the top bit would read as a sign). */
static void pk_int(pickler *pk, int64_t v) {
    if (v <= 0xff) {
        pk_op(pk, OP_BININT1);
        pk_op(pk, (int)v);
    } else if (v <= 0xffff) {
        unsigned char b[3] = {OP_BININT2, (unsigned char)v, (unsigned char)(v >> 8)};
        pk_bytes(pk, b, 3);
    } else if (v <= INT32_MAX) {
        pk_op(pk, OP_BININT);
        pk_u32(pk, (uint32_t)v);
    } else {
        unsigned char b[9];
        int n = 0;
        for (uint64_t u = (uint64_t)v; u; u >>= 8) b[n++] = (unsigned char)u;
        if (b[n - 1] & 0x80) b[n++] = 0;
        pk_op(pk, OP_LONG1);
        pk_op(pk, n);
        pk_bytes(pk, b, (size_t)n);
    }
}

/* A fresh tuple of ints (tensor.size(), tensor.stride()): CPython writes ()
 * without memoizing it, 1-3 items as TUPLE1-3, more after a MARK. */
static void pk_int_tuple(pickler *pk, int n, const int64_t *v) {
    if (n == 0) {
        pk_op(pk, OP_EMPTY_TUPLE);
        return;
    }
    if (n > 3) pk_op(pk, OP_MARK);
    for (int i = 0; i < n; i++) pk_int(pk, v[i]);
    pk_op(pk, n == 1 ? OP_TUPLE1 : n == 2 ? OP_TUPLE2 : n == 3 ? OP_TUPLE3 : OP_TUPLE);
    pk_put(pk);
}

/* ---------------------------------------------------------------- the state dict */

/* Memo indices of the objects every tensor shares. */
typedef struct shared_memo {
    int64_t rebuild, storage, cpu, ordered_dict, cls[ACCEL_DTYPE_COUNT];
    int64_t *key;  /* per storage: its key string '<k>' */
} shared_memo;

/* The persistent id of storage k, then BINPERSID. */
static void pk_storage(pickler *pk, shared_memo *m, const accel_tensor *t, int k) {
    pk_op(pk, OP_MARK);
    pk_str_once(pk, &m->storage, "storage");
    pk_global_once(pk, &m->cls[t->dtype], "torch", accel__torch_storage_class(t->dtype));
    char key[24];
    snprintf(key, sizeof key, "%d", k);
    pk_str_once(pk, &m->key[k], key);
    pk_str_once(pk, &m->cpu, "cpu");
    pk_int(pk, accel_numel(t));
    pk_op(pk, OP_TUPLE);
    pk_put(pk);
    pk_op(pk, OP_BINPERSID);
}

/* _rebuild_tensor_v2(storage, 0, size, contiguous stride, False, OrderedDict()). */
static void pk_tensor(pickler *pk, shared_memo *m, const accel_tensor *t, int k) {
    int64_t stride[ACCEL_MAX_DIMS], s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= t->shape[d];
    }
    pk_global_once(pk, &m->rebuild, "torch._utils", "_rebuild_tensor_v2");
    pk_op(pk, OP_MARK);
    pk_storage(pk, m, t, k);
    pk_int(pk, 0);
    pk_int_tuple(pk, t->ndim, t->shape);
    pk_int_tuple(pk, t->ndim, stride);
    pk_op(pk, OP_NEWFALSE);
    pk_global_once(pk, &m->ordered_dict, "collections", "OrderedDict");
    pk_op(pk, OP_EMPTY_TUPLE);
    pk_op(pk, OP_REDUCE);
    pk_put(pk);
    pk_op(pk, OP_TUPLE);
    pk_put(pk);
    pk_op(pk, OP_REDUCE);
    pk_put(pk);
}

/* data.pkl of {names[i]: tensors[i]}; storage_of[i] is tensor i's storage key. */
static accel_status build_pickle(pickler *pk, int n, const char *const *names, accel_tensor *const *tensors,
                                 const int *storage_of, int n_storages) {
    shared_memo m = {NOT_YET, NOT_YET, NOT_YET, NOT_YET, {0}, NULL};
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) m.cls[d] = NOT_YET;
    m.key = accel_malloc(sizeof(int64_t) * ((size_t)n_storages + 1));
    if (!m.key) return accel_last_status();
    for (int k = 0; k < n_storages; k++) m.key[k] = NOT_YET;
    pk_op(pk, OP_PROTO);
    pk_op(pk, 2);
    pk_op(pk, OP_EMPTY_DICT);
    pk_put(pk);
    /* CPython's batch_dict_exact: one item is SETITEM; more go in MARK ...
     * SETITEMS batches of 1000, a batch after each full one (an empty one
     * when n is a multiple of 1000). */
    if (n == 1) {
        pk_str(pk, names[0]);
        pk_tensor(pk, &m, tensors[0], storage_of[0]);
        pk_op(pk, OP_SETITEM);
    }
    for (int b = 0, full = n > 1; full; b += SETITEMS_BATCH) {
        int end = n - b > SETITEMS_BATCH ? b + SETITEMS_BATCH : n;
        pk_op(pk, OP_MARK);
        for (int i = b; i < end; i++) {
            pk_str(pk, names[i]);
            pk_tensor(pk, &m, tensors[i], storage_of[i]);
        }
        pk_op(pk, OP_SETITEMS);
        full = end - b == SETITEMS_BATCH;
    }
    pk_op(pk, OP_STOP);
    accel_free(m.key);
    return pk->oom ? accel_set_error(ACCEL_ERR_OOM, "accel_torch_save: out of memory building data.pkl")
                   : ACCEL_OK;
}

/* ---------------------------------------------------------------- the archive */

static accel_status check_inputs(const char *path, int n, const char *const *names, accel_tensor *const *tensors) {
    if (!path || n < 0 || (n > 0 && (!names || !tensors)))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_torch_save: bad arguments");
    json_t *seen = json_object(); /* names given so far: a hash, not a quadratic scan */
    if (!seen) return accel_set_error(ACCEL_ERR_OOM, "accel_torch_save %s: out of memory", path);
    accel_status st = ACCEL_OK;
    for (int i = 0; i < n && !st; i++) {
        if (!names[i] || !names[i][0])
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_torch_save %s: tensor %d has no name", path, i);
        else if (json_object_get(seen, names[i]))
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_torch_save %s: tensor name '%s' given twice", path,
                                 names[i]);
        else if (!accel_tensor_check(tensors[i], "accel_torch_save", names[i]))
            st = accel_last_status();
        else if (tensors[i]->device.type == ACCEL_DEV_META && accel_numel(tensors[i]) > 0)
            st = accel_set_error(ACCEL_ERR_DEVICE, "accel_torch_save %s: tensor '%s' is on meta (it has no data to save)",
                                 path, names[i]);
        else if (json_object_set_new(seen, names[i], json_true())) /* refuses what is not UTF-8 */
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_torch_save %s: tensor name '%s' is not valid UTF-8 "
                                 "(torch.load would fail to decode it)", path, names[i]);
    }
    json_decref(seen);
    return st;
}

/* storage_of[i]: the key of tensor i's storage, numbered in first-seen order
 * (the same accel_tensor under several names is one storage, written once,
 * as torch does for tied weights); first[k]: the tensor that holds storage k.
 * Returns the number of storages. */
static int assign_storages(int n, accel_tensor *const *tensors, int *storage_of, int *first) {
    int n_storages = 0;
    for (int i = 0; i < n; i++) {
        storage_of[i] = -1;
        for (int k = 0; k < n_storages && storage_of[i] < 0; k++)
            if (tensors[first[k]] == tensors[i]) storage_of[i] = k;
        if (storage_of[i] < 0) {
            first[n_storages] = i;
            storage_of[i] = n_storages++;
        }
    }
    return n_storages;
}

/* "dir/pytorch_model-00001-of-00002.bin" -> "pytorch_model-00001-of-00002"
 * (torch's PyTorchStreamWriter: the basename up to its last dot). */
static char *archive_name(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t n = dot ? (size_t)(dot - base) : strlen(base);
    char *name = accel_malloc(n + 1);
    if (!name) return NULL;
    memcpy(name, base, n);
    name[n] = 0;
    return name;
}

static accel_status zip_sink(void *z, const void *p, size_t n) { return accel__zip_write(z, p, n); }

/* A small record "<archive>/<rec>". */
static accel_status record(accel__zip *z, const char *arch, const char *rec, const void *bytes, size_t len) {
    char name[4200];
    snprintf(name, sizeof name, "%s/%s", arch, rec);
    return accel__zip_record(z, name, bytes, len);
}

/* Storage k's record "<archive>/data/<k>", streamed from its tensor. */
static accel_status storage_record(accel__zip *z, const char *arch, int k, const accel_tensor *t) {
    char name[4200];
    snprintf(name, sizeof name, "%s/data/%d", arch, k);
    accel_status st = accel__zip_begin(z, name, accel_nbytes(t));
    if (!st) st = accel__tensor_stream(t, zip_sink, z, "accel_torch_save");
    return st ? st : accel__zip_end(z);
}

/* The records in torch's order. */
static accel_status write_records(accel__zip *z, const char *arch, const pickler *pk, int n_storages,
                                  accel_tensor *const *tensors, const int *first, const char *path) {
    accel_status st = record(z, arch, "data.pkl", pk->buf, pk->len);
    if (!st) st = record(z, arch, ".format_version", "1", 1);
    if (!st) st = record(z, arch, ".storage_alignment", "64", 2);
    if (!st) st = record(z, arch, "byteorder", "little", 6);
    const char *base = strrchr(path, '/');
    char desc[96];
    snprintf(desc, sizeof desc, "Writing %s", base ? base + 1 : path);
    accel_progress *bar = accel_progress_new(n_storages, &(accel_progress_opts){.desc = desc, .unit = "tensor", .delay = 1});
    for (int k = 0; k < n_storages && !st; k++, accel_progress_update(bar, 1))
        st = storage_record(z, arch, k, tensors[first[k]]);
    accel_progress_close(bar);
    return st ? st : record(z, arch, "version", "3\n", 2);
}

accel_status accel_torch_save(const char *path, int n, const char *const *names, accel_tensor *const *tensors) {
    if (check_inputs(path, n, names, tensors)) return accel_last_status();
    int *storage_of = accel_malloc(sizeof(int) * (2 * (size_t)n + 1)), *first = storage_of + n;
    char *arch = archive_name(path);
    pickler pk = {0};
    accel_status st = storage_of && arch ? ACCEL_OK : accel_last_status();
    int n_storages = st ? 0 : assign_storages(n, tensors, storage_of, first);
    if (!st) st = build_pickle(&pk, n, names, tensors, storage_of, n_storages);
    accel__zip z;
    if (!st) st = accel__zip_open(&z, path);
    if (!st) {
        st = write_records(&z, arch, &pk, n_storages, tensors, first, path);
        if (!st) st = accel__zip_commit(&z);
        else accel__zip_abort(&z);
    }
    accel_free(pk.buf);
    accel_free(arch);
    accel_free(storage_of);
    return st;
}
