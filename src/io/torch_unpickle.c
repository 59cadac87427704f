/* src/io/torch_unpickle.c — a restricted unpickler for torch.save's data.pkl.
 *
 * Python's pickle is a program: GLOBAL names any callable and REDUCE calls
 * it. This one calls nothing. It knows a few opcodes (those CPython's pickler
 * emits for a state dict, protocols 2-4) and a few globals (those
 * torch.load(weights_only=True) allows a state dict), and builds a value
 * graph of its own: None, bools, ints, floats, strings, tuples, dicts,
 * storages and tensors. Anything else is refused by name before any of it is
 * used. Every length comes from the pickle and is checked against its end;
 * values live in pools that grow with the opcodes read, so what it holds is
 * bounded by the pickle's size (and the stack and MARK nesting by the limits
 * in torch_unpickle.h). Nothing is walked recursively: a graph with cycles
 * (a dict holding itself, which BINGET can build) costs nothing. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/core_internal.h"
#include "io/torch_pickle.h"
#include "io/torch_unpickle.h"

enum { V_UNSET, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_TUPLE, V_DICT, V_GLOBAL, V_STORAGE, V_TENSOR };
static const char *const KIND[] = {"nothing", "None", "bool", "int", "float", "str", "tuple", "dict",
                                   "global", "storage", "tensor"};

/* The globals allowed: what each REDUCE or persistent id may name. */
enum { G_ORDERED_DICT, G_REBUILD_TENSOR, G_REBUILD_PARAMETER, G_STORAGE /* + dtype */ };

/* A value: its kind and, per kind, the int, the bool, a float's bits, a
 * global's id, or the index of the string / tuple / dict / storage / tensor
 * in its pool. Copying one shares what it points to, as Python references do. */
typedef struct val {
    int kind;
    int64_t i;
} val;

typedef struct span {
    int64_t at, n; /* a string: bytes of the pickle; a tuple: items of the items pool */
} span;

typedef struct dict {
    val *kv; /* key, value, key, value, ... (insertion order) */
    int64_t n, cap; /* values in kv (2 per item), allocated */
} dict;

typedef struct storage {
    accel_dtype dt;
    span key;
    int64_t numel;
} storage;

typedef struct up {
    const char *path;
    const unsigned char *p;
    size_t len, pos, op_at;
    val *stack;
    int64_t sp, stack_cap;
    int64_t *marks;
    int64_t n_marks, marks_cap;
    val *memo;                  /* by index (memo_put) */
    int64_t memo_cap, memo_len; /* allocated, indices stored */
    span *strs;
    int64_t n_strs, strs_cap;
    val *items;
    int64_t n_items, items_cap;
    span *tuples;
    int64_t n_tuples, tuples_cap;
    dict *dicts;
    int64_t n_dicts, dicts_cap;
    storage *storages;
    int64_t n_storages, storages_cap;
    accel__torch_tensor *tensors;
    int64_t n_tensors, tensors_cap;
} up;

/* ---------------------------------------------------------------- pools and errors */

/* arr with room for `need` > *cap elements (doubling), or NULL + error; arr is kept on failure. */
static void *grow(void *arr, int64_t *cap, int64_t need, size_t elt) {
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *g = accel_malloc((size_t)c * elt);
    if (!g) return NULL;
    if (*cap) memcpy(g, arr, (size_t)*cap * elt);
    accel_free(arr);
    *cap = c;
    return g;
}
#define ENSURE(arr, cap, need)                                        \
    do {                                                              \
        if ((need) > (cap)) {                                         \
            void *g_ = grow((arr), &(cap), (need), sizeof *(arr));    \
            if (!g_) return accel_last_status();                      \
            (arr) = g_;                                               \
        }                                                             \
    } while (0)

static accel_status fail(up *u, accel_status st, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return accel_set_error(st, "%s: data.pkl (byte %zu, opcode 0x%02x): %s", u->path, u->op_at,
                           u->op_at < u->len ? u->p[u->op_at] : 0, msg);
}

static const char *kind_name(val v) { return v.kind >= 0 && v.kind <= V_TENSOR ? KIND[v.kind] : "?"; }

/* n more bytes of operand, or a named error (a truncated pickle). */
static const unsigned char *take(up *u, size_t n) {
    if (n > u->len - u->pos) {
        fail(u, ACCEL_ERR_FORMAT, "needs %zu bytes of operand but the pickle ends (truncated?)", n);
        return NULL;
    }
    const unsigned char *q = u->p + u->pos;
    u->pos += n;
    return q;
}

/* ---------------------------------------------------------------- the stack */

static int64_t fence(const up *u) { return u->n_marks ? u->marks[u->n_marks - 1] : 0; }

static accel_status push(up *u, int kind, int64_t i) {
    if (u->sp >= ACCEL__PICKLE_MAX_STACK)
        return fail(u, ACCEL_ERR_FORMAT, "the stack passes %d values", ACCEL__PICKLE_MAX_STACK);
    ENSURE(u->stack, u->stack_cap, u->sp + 1);
    u->stack[u->sp++] = (val){kind, i};
    return ACCEL_OK;
}

/* *out is V_UNSET on failure: the compiler cannot see that fail() never
 * returns ACCEL_OK, so a caller's value is set on every path. */
static accel_status pop(up *u, val *out) {
    *out = (val){V_UNSET, 0};
    if (u->sp <= fence(u)) return fail(u, ACCEL_ERR_FORMAT, "pops from an empty stack (or past a MARK)");
    *out = u->stack[--u->sp];
    return ACCEL_OK;
}

/* The values pushed since the last MARK: their position; the MARK is gone. */
static accel_status pop_mark(up *u, int64_t *at) {
    if (!u->n_marks) return fail(u, ACCEL_ERR_FORMAT, "needs a MARK and there is none");
    *at = u->marks[--u->n_marks];
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- values */

/* A str: Python decodes its bytes as UTF-8, and torch.load fails on any that
 * are not (accel_torch_save refuses such names too; the surrogates Python's
 * decoder lets through are refused with them). */
static accel_status new_str(up *u, size_t n) {
    const unsigned char *s = take(u, n);
    if (!s) return accel_last_status();
    if (!accel__is_utf8_n((const char *)s, n))
        return fail(u, ACCEL_ERR_FORMAT, "a str of %zu bytes that is not valid UTF-8 (torch.load would fail to "
                    "decode it)", n);
    ENSURE(u->strs, u->strs_cap, u->n_strs + 1);
    u->strs[u->n_strs] = (span){s - u->p, (int64_t)n};
    return push(u, V_STR, u->n_strs++);
}

/* A tuple of the n values at stack[at ...]; they leave the stack. */
static accel_status new_tuple(up *u, int64_t at, int64_t n) {
    ENSURE(u->items, u->items_cap, u->n_items + n);
    ENSURE(u->tuples, u->tuples_cap, u->n_tuples + 1);
    if (n) memcpy(u->items + u->n_items, u->stack + at, sizeof(val) * (size_t)n);
    u->tuples[u->n_tuples] = (span){u->n_items, n};
    u->n_items += n;
    u->sp = at;
    return push(u, V_TUPLE, u->n_tuples++);
}

static accel_status new_dict(up *u) {
    ENSURE(u->dicts, u->dicts_cap, u->n_dicts + 1);
    u->dicts[u->n_dicts] = (dict){0};
    return push(u, V_DICT, u->n_dicts++);
}

/* NULL for a tuple made while the pool was empty (an empty one): no
 * arithmetic on a NULL pool (UB); callers check the length first. */
static const val *tuple_items(const up *u, val t) { return u->items ? u->items + u->tuples[t.i].at : NULL; }
static int64_t tuple_len(const up *u, val t) { return u->tuples[t.i].n; }

static bool str_is(const up *u, val v, const char *s) {
    if (v.kind != V_STR) return false;
    const span *sp = &u->strs[v.i];
    return (size_t)sp->n == strlen(s) && !memcmp(u->p + sp->at, s, (size_t)sp->n);
}

/* ---------------------------------------------------------------- globals */

/* module.name -> an allowed global, or a refusal naming it. */
static accel_status global(up *u, const char *module, size_t ml, const char *name, size_t nl) {
#define IS(s, l, lit) ((l) == sizeof(lit) - 1 && !memcmp((s), (lit), (l)))
    if (IS(module, ml, "collections") && IS(name, nl, "OrderedDict")) return push(u, V_GLOBAL, G_ORDERED_DICT);
    if (IS(module, ml, "torch._utils") && IS(name, nl, "_rebuild_tensor_v2"))
        return push(u, V_GLOBAL, G_REBUILD_TENSOR);
    if (IS(module, ml, "torch._utils") && IS(name, nl, "_rebuild_parameter"))
        return push(u, V_GLOBAL, G_REBUILD_PARAMETER);
    if (IS(module, ml, "torch")) {
        for (int dt = 0; dt < ACCEL_DTYPE_COUNT; dt++) {
            const char *cls = accel__torch_storage_class((accel_dtype)dt);
            if (cls && nl == strlen(cls) && !memcmp(name, cls, nl)) return push(u, V_GLOBAL, G_STORAGE + dt);
        }
        if (nl > 7 && !memcmp(name + nl - 7, "Storage", 7))
            return fail(u, ACCEL_ERR_UNSUPPORTED, "storage type torch.%.*s holds a dtype accel does not have "
                        "(supported: float32, float16, bfloat16, float64, int64, int32, int16, int8, uint8, bool)",
                        (int)nl, name);
    }
#undef IS
    return fail(u, ACCEL_ERR_UNSUPPORTED, "global '%.*s.%.*s' is not allowed: accel's unpickler executes nothing "
                "and reads state dicts of tensors only (collections.OrderedDict, torch._utils._rebuild_tensor_v2, "
                "torch._utils._rebuild_parameter, torch.<Type>Storage)", (int)(ml > 200 ? 200 : ml), module,
                (int)(nl > 200 ? 200 : nl), name);
}

/* GLOBAL's operand: "module\nname\n". */
static accel_status op_global(up *u) {
    const char *s[2];
    size_t l[2];
    for (int k = 0; k < 2; k++) {
        const unsigned char *at = u->p + u->pos, *nl = memchr(at, '\n', u->len - u->pos);
        if (!nl) return fail(u, ACCEL_ERR_FORMAT, "GLOBAL's names are not ended by a newline (truncated?)");
        s[k] = (const char *)at;
        l[k] = (size_t)(nl - at);
        u->pos += l[k] + 1;
    }
    return global(u, s[0], l[0], s[1], l[1]);
}

static accel_status op_stack_global(up *u) {
    val name, module;
    if (pop(u, &name) || pop(u, &module)) return accel_last_status();
    if (name.kind != V_STR || module.kind != V_STR)
        return fail(u, ACCEL_ERR_FORMAT, "STACK_GLOBAL takes two str, not %s and %s", kind_name(module),
                    kind_name(name));
    const span *m = &u->strs[module.i], *n = &u->strs[name.i];
    return global(u, (const char *)u->p + m->at, (size_t)m->n, (const char *)u->p + n->at, (size_t)n->n);
}

/* ---------------------------------------------------------------- storages and tensors */

/* BINPERSID: ('storage', torch.<Type>Storage, key, location, numel) -> a storage. */
static accel_status op_persid(up *u) {
    val pid;
    if (pop(u, &pid)) return accel_last_status();
    const val *it = pid.kind == V_TUPLE ? tuple_items(u, pid) : NULL;
    if (!it || tuple_len(u, pid) != 5 || !str_is(u, it[0], "storage"))
        return fail(u, ACCEL_ERR_FORMAT, "a persistent id must be ('storage', type, key, location, numel), "
                    "not a %s", kind_name(pid));
    if (it[1].kind != V_GLOBAL || it[1].i < G_STORAGE)
        return fail(u, ACCEL_ERR_FORMAT, "a storage's type must be a torch.<Type>Storage class, not a %s",
                    kind_name(it[1]));
    if (it[2].kind != V_STR || it[3].kind != V_STR || it[4].kind != V_INT || it[4].i < 0)
        return fail(u, ACCEL_ERR_FORMAT, "a storage's key and location must be str and its size an int >= 0 "
                    "(found %s, %s, %s)", kind_name(it[2]), kind_name(it[3]), kind_name(it[4]));
    ENSURE(u->storages, u->storages_cap, u->n_storages + 1);
    u->storages[u->n_storages] = (storage){(accel_dtype)(it[1].i - G_STORAGE), u->strs[it[2].i], it[4].i};
    return push(u, V_STORAGE, u->n_storages++);
}

/* A tuple of ints >= 0, at most ACCEL_MAX_DIMS of them, into out. */
static accel_status dims(up *u, val t, const char *what, int64_t *out, int *n) {
    if (t.kind != V_TUPLE) return fail(u, ACCEL_ERR_FORMAT, "a tensor's %s must be a tuple, not a %s", what, kind_name(t));
    if (tuple_len(u, t) > ACCEL_MAX_DIMS)
        return fail(u, ACCEL_ERR_UNSUPPORTED, "a tensor of %lld dimensions (accel has at most %d)",
                    (long long)tuple_len(u, t), ACCEL_MAX_DIMS);
    const val *it = tuple_items(u, t);
    *n = (int)tuple_len(u, t);
    for (int d = 0; d < *n; d++) {
        if (it[d].kind != V_INT || it[d].i < 0)
            return fail(u, ACCEL_ERR_FORMAT, "a tensor's %s must hold ints >= 0", what);
        out[d] = it[d].i;
    }
    return ACCEL_OK;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata]). */
static accel_status rebuild_tensor(up *u, val args) {
    int64_t n = tuple_len(u, args);
    const val *a = tuple_items(u, args);
    if (n != 6 && n != 7)
        return fail(u, ACCEL_ERR_FORMAT, "_rebuild_tensor_v2 takes 6 or 7 arguments, not %lld", (long long)n);
    if (a[0].kind != V_STORAGE || a[1].kind != V_INT || a[1].i < 0 || a[4].kind != V_BOOL || a[5].kind != V_DICT ||
        (n == 7 && a[6].kind != V_DICT && a[6].kind != V_NONE))
        return fail(u, ACCEL_ERR_FORMAT, "_rebuild_tensor_v2's arguments must be (storage, int >= 0, tuple, "
                    "tuple, bool, dict[, dict]), not (%s, %s, ..., %s, %s)", kind_name(a[0]), kind_name(a[1]),
                    kind_name(a[4]), kind_name(a[5]));
    accel__torch_tensor t = {0};
    int ns = 0;
    if (dims(u, a[2], "size", t.shape, &t.ndim) || dims(u, a[3], "stride", t.stride, &ns)) return accel_last_status();
    if (ns != t.ndim)
        return fail(u, ACCEL_ERR_FORMAT, "a tensor with %d sizes and %d strides", t.ndim, ns);
    const storage *s = &u->storages[a[0].i];
    t.key = (const char *)u->p + s->key.at;
    t.key_len = (size_t)s->key.n;
    t.dtype = s->dt;
    t.storage_numel = s->numel;
    t.offset = a[1].i;
    ENSURE(u->tensors, u->tensors_cap, u->n_tensors + 1);
    u->tensors[u->n_tensors] = t;
    return push(u, V_TENSOR, u->n_tensors++);
}

static accel_status op_reduce(up *u) {
    val args, fn;
    if (pop(u, &args) || pop(u, &fn)) return accel_last_status();
    if (fn.kind != V_GLOBAL || args.kind != V_TUPLE)
        return fail(u, ACCEL_ERR_FORMAT, "REDUCE calls a %s with a %s", kind_name(fn), kind_name(args));
    if (fn.i == G_ORDERED_DICT) {
        if (tuple_len(u, args) != 0)
            return fail(u, ACCEL_ERR_UNSUPPORTED, "OrderedDict built from arguments (only OrderedDict() is read)");
        return new_dict(u);
    }
    if (fn.i == G_REBUILD_TENSOR) return rebuild_tensor(u, args);
    if (fn.i == G_REBUILD_PARAMETER) {
        const val *a = tuple_items(u, args);
        if (tuple_len(u, args) != 3 || a[0].kind != V_TENSOR || a[1].kind != V_BOOL || a[2].kind != V_DICT)
            return fail(u, ACCEL_ERR_FORMAT, "_rebuild_parameter's arguments must be (tensor, bool, dict)");
        return push(u, V_TENSOR, a[0].i); /* the parameter's data */
    }
    return fail(u, ACCEL_ERR_UNSUPPORTED, "REDUCE calls a storage class (only persistent ids may name one)");
}

/* ---------------------------------------------------------------- dicts */

static accel_status dict_set(up *u, val d, const val *kv, int64_t n_values) {
    dict *x = &u->dicts[d.i];
    if (!n_values) return ACCEL_OK; /* an empty SETITEMS */
    ENSURE(x->kv, x->cap, x->n + n_values);
    memcpy(x->kv + x->n, kv, sizeof(val) * (size_t)n_values);
    x->n += n_values;
    return ACCEL_OK;
}

/* SETITEM (k, v on top of the dict) and SETITEMS (MARK k v k v ... above it). */
static accel_status op_setitems(up *u, bool many) {
    int64_t at = 0;
    if (many) {
        if (pop_mark(u, &at)) return accel_last_status();
    } else {
        at = u->sp - 2;
        if (at < fence(u)) return fail(u, ACCEL_ERR_FORMAT, "SETITEM needs a key and a value");
    }
    if ((u->sp - at) % 2) return fail(u, ACCEL_ERR_FORMAT, "SETITEMS with a key and no value");
    if (at - 1 < fence(u) || u->stack[at - 1].kind != V_DICT)
        return fail(u, ACCEL_ERR_FORMAT, "SETITEM(S) on a %s, not a dict",
                    at - 1 < fence(u) ? "missing object" : kind_name(u->stack[at - 1]));
    accel_status st = dict_set(u, u->stack[at - 1], u->stack + at, u->sp - at);
    u->sp = at;
    return st;
}

/* BUILD on an OrderedDict: its __dict__ (torch keeps the modules' versions
 * in `_metadata` there). Read and dropped: no loader needs it. */
static accel_status op_build(up *u) {
    val state;
    if (pop(u, &state)) return accel_last_status();
    if (u->sp <= fence(u) || u->stack[u->sp - 1].kind != V_DICT || (state.kind != V_DICT && state.kind != V_NONE))
        return fail(u, ACCEL_ERR_UNSUPPORTED, "BUILD of a %s with a %s state (only an OrderedDict's attributes "
                    "are read)", u->sp <= fence(u) ? "missing object" : kind_name(u->stack[u->sp - 1]),
                    kind_name(state));
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- the memo */

/* The memo: an array by index. Python keeps it in a dict (any index), but
 * a pickler numbers it in order, so an index far past the count stored is
 * refused: sized by it, the array made a file of a few bytes hold 16 bytes
 * per index (LONG_BINPUT 2^26: 1 GB), and hashed, indices chosen to collide
 * made each PUT a scan (minutes for a megabyte). The array's size follows
 * the PUTs read, as Python's dict does. */
static accel_status memo_put(up *u, uint64_t idx) {
    if (u->sp <= fence(u)) return fail(u, ACCEL_ERR_FORMAT, "memoizes from an empty stack");
    if (idx > 2 * (uint64_t)u->memo_len + 1024)
        return fail(u, ACCEL_ERR_UNSUPPORTED, "memo index %llu is far past the %lld stored (a pickler numbers its "
                    "memo in order)", (unsigned long long)idx, (long long)u->memo_len);
    if ((int64_t)idx >= u->memo_cap) {
        int64_t old = u->memo_cap;
        ENSURE(u->memo, u->memo_cap, (int64_t)idx + 1);
        memset(u->memo + old, 0, sizeof(val) * (size_t)(u->memo_cap - old));
    }
    if (u->memo[idx].kind == V_UNSET) u->memo_len++;
    u->memo[idx] = u->stack[u->sp - 1];
    return ACCEL_OK;
}

static accel_status memo_get(up *u, uint64_t idx) {
    if ((int64_t)idx >= u->memo_cap || u->memo[idx].kind == V_UNSET)
        return fail(u, ACCEL_ERR_FORMAT, "memo index %llu was never stored", (unsigned long long)idx);
    return push(u, u->memo[idx].kind, u->memo[idx].i);
}

/* ---------------------------------------------------------------- ints */

/* LONG1: n bytes, little-endian two's complement; more than 8 is no int64. */
static accel_status op_long1(up *u) {
    const unsigned char *q = take(u, 1);
    if (!q) return accel_last_status();
    size_t n = *q;
    if (n > 8) return fail(u, ACCEL_ERR_FORMAT, "an integer of %zu bytes (more than int64)", n);
    if (!(q = take(u, n))) return accel_last_status();
    uint64_t v = accel__read_le(q, (int)n);
    if (n && n < 8 && (q[n - 1] & 0x80)) v |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    return push(u, V_INT, (int64_t)v);
}

/* ---------------------------------------------------------------- the loop */

static accel_status step(up *u, int op, bool *stop) {
    const unsigned char *q;
    int64_t at = 0;
    switch (op) {
    case OP_PROTO:
        if (!(q = take(u, 1))) return accel_last_status();
        return *q >= 2 && *q <= 5 ? ACCEL_OK : fail(u, ACCEL_ERR_UNSUPPORTED, "pickle protocol %d", *q);
    case OP_FRAME: return take(u, 8) ? ACCEL_OK : accel_last_status(); /* framing only groups the bytes */
    case OP_STOP: *stop = true; return ACCEL_OK;
    case OP_MARK:
        if (u->n_marks >= ACCEL__PICKLE_MAX_MARKS)
            return fail(u, ACCEL_ERR_FORMAT, "more than %d nested MARKs", ACCEL__PICKLE_MAX_MARKS);
        ENSURE(u->marks, u->marks_cap, u->n_marks + 1);
        u->marks[u->n_marks++] = u->sp;
        return ACCEL_OK;
    case OP_EMPTY_DICT: return new_dict(u);
    case OP_EMPTY_TUPLE: return new_tuple(u, u->sp, 0);
    case OP_TUPLE: return pop_mark(u, &at) ? accel_last_status() : new_tuple(u, at, u->sp - at);
    case OP_TUPLE1: case OP_TUPLE2: case OP_TUPLE3:
        if (u->sp - fence(u) < op - OP_TUPLE1 + 1) return fail(u, ACCEL_ERR_FORMAT, "TUPLE%d on a shorter stack",
                                                               op - OP_TUPLE1 + 1);
        return new_tuple(u, u->sp - (op - OP_TUPLE1 + 1), op - OP_TUPLE1 + 1);
    case OP_BINUNICODE: return (q = take(u, 4)) ? new_str(u, (size_t)accel__read_le(q, 4)) : accel_last_status();
    case OP_SHORT_BINUNICODE: return (q = take(u, 1)) ? new_str(u, *q) : accel_last_status();
    case OP_BINUNICODE8: {
        if (!(q = take(u, 8))) return accel_last_status();
        uint64_t n = accel__read_le(q, 8);
        return n > u->len ? fail(u, ACCEL_ERR_FORMAT, "a string of %llu bytes (truncated?)", (unsigned long long)n)
                          : new_str(u, (size_t)n);
    }
    case OP_GLOBAL: return op_global(u);
    case OP_STACK_GLOBAL: return op_stack_global(u);
    case OP_BINPERSID: return op_persid(u);
    case OP_BININT: return (q = take(u, 4)) ? push(u, V_INT, (int32_t)(uint32_t)accel__read_le(q, 4)) : accel_last_status();
    case OP_BININT1: return (q = take(u, 1)) ? push(u, V_INT, *q) : accel_last_status();
    case OP_BININT2: return (q = take(u, 2)) ? push(u, V_INT, (int64_t)accel__read_le(q, 2)) : accel_last_status();
    case OP_LONG1: return op_long1(u);
    case OP_BINFLOAT: { /* big-endian; kept as bits, only metadata holds floats */
        if (!(q = take(u, 8))) return accel_last_status();
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++) bits = bits << 8 | q[i];
        return push(u, V_FLOAT, (int64_t)bits);
    }
    case OP_NONE: return push(u, V_NONE, 0);
    case OP_NEWTRUE: return push(u, V_BOOL, 1);
    case OP_NEWFALSE: return push(u, V_BOOL, 0);
    case OP_REDUCE: return op_reduce(u);
    case OP_BUILD: return op_build(u);
    case OP_SETITEM: return op_setitems(u, false);
    case OP_SETITEMS: return op_setitems(u, true);
    case OP_BINPUT: return (q = take(u, 1)) ? memo_put(u, *q) : accel_last_status();
    case OP_LONG_BINPUT: return (q = take(u, 4)) ? memo_put(u, accel__read_le(q, 4)) : accel_last_status();
    case OP_MEMOIZE: return memo_put(u, (uint64_t)u->memo_len);
    case OP_BINGET: return (q = take(u, 1)) ? memo_get(u, *q) : accel_last_status();
    case OP_LONG_BINGET: return (q = take(u, 4)) ? memo_get(u, accel__read_le(q, 4)) : accel_last_status();
    default:
        return fail(u, ACCEL_ERR_UNSUPPORTED, "opcode 0x%02x%s%c%s is not one a state dict pickles with "
                    "(accel's unpickler reads those only)", op, op >= 0x20 && op < 0x7f ? " ('" : "",
                    op >= 0x20 && op < 0x7f ? op : ' ', op >= 0x20 && op < 0x7f ? "')" : "");
    }
}

/* The finished pickle: a dict of str -> tensor, into out. */
static accel_status collect(up *u, accel__torch_tensor **out, int *n) {
    val top;
    if (pop(u, &top)) return accel_last_status();
    if (top.kind != V_DICT)
        return fail(u, ACCEL_ERR_FORMAT, "the pickle holds a %s, not a state dict (a dict of tensors)", kind_name(top));
    const dict *d = &u->dicts[top.i];
    if (d->n / 2 > 0x7fffffff) return fail(u, ACCEL_ERR_FORMAT, "more than 2^31 entries");
    accel__torch_tensor *t = accel_calloc((size_t)d->n / 2 + 1, sizeof *t);
    if (!t) return accel_last_status();
    for (int64_t k = 0; k < d->n; k += 2) {
        val key = d->kv[k], value = d->kv[k + 1];
        if (key.kind != V_STR) {
            accel_free(t);
            return fail(u, ACCEL_ERR_FORMAT, "the state dict has a key that is a %s, not a str", kind_name(key));
        }
        const span *s = &u->strs[key.i];
        if (value.kind != V_TENSOR || memchr(u->p + s->at, 0, (size_t)s->n)) {
            accel_free(t);
            return fail(u, value.kind != V_TENSOR ? ACCEL_ERR_UNSUPPORTED : ACCEL_ERR_FORMAT,
                        value.kind != V_TENSOR ? "entry '%.*s' is a %s, not a tensor: accel reads state dicts of "
                                                 "tensors only" : "entry '%.*s' has a NUL byte in its name%s",
                        (int)(s->n > 200 ? 200 : s->n), (const char *)u->p + s->at,
                        value.kind != V_TENSOR ? kind_name(value) : "");
        }
        t[k / 2] = u->tensors[value.i];
        t[k / 2].name = (const char *)u->p + s->at;
        t[k / 2].name_len = (size_t)s->n;
    }
    *out = t;
    *n = (int)(d->n / 2);
    return ACCEL_OK;
}

static void up_free(up *u) {
    for (int64_t i = 0; i < u->n_dicts; i++) accel_free(u->dicts[i].kv);
    accel_free(u->stack);
    accel_free(u->marks);
    accel_free(u->memo);
    accel_free(u->strs);
    accel_free(u->items);
    accel_free(u->tuples);
    accel_free(u->dicts);
    accel_free(u->storages);
    accel_free(u->tensors);
}

accel_status accel__torch_unpickle(const char *path, const unsigned char *pkl, size_t len,
                                   accel__torch_tensor **out, int *n) {
    *out = NULL;
    *n = 0;
    up u = {.path = path, .p = pkl, .len = len};
    accel_status st = ACCEL_OK;
    bool stop = false;
    while (!st && !stop) {
        u.op_at = u.pos;
        if (u.pos >= u.len) {
            st = fail(&u, ACCEL_ERR_FORMAT, "the pickle ends without STOP (truncated?)");
            break;
        }
        st = step(&u, u.p[u.pos++], &stop);
    }
    if (!st) st = collect(&u, out, n);
    up_free(&u);
    return st;
}
