/* Chat templates: the syntax tree run into text (jinja_internal.h), with jinja2's
 * semantics under transformers' environment: scopes (a for loop's body gets a
 * fresh scope each turn, so `set` inside it is gone after it; namespace() is how
 * templates carry values out), Undefined (prints as nothing, is false and empty,
 * but its attributes and arithmetic on it are errors), the sandbox's immutability
 * (no list.append, dict.update, ...) and its range() limit, and the filters,
 * tests and str/dict/list methods chat templates call. Every render is bounded:
 * JINJA_MAX_STEPS expressions and loop turns, JINJA_MAX_DEPTH nested macro calls,
 * JINJA_MAX_NEST_EVAL nested evaluation frames (a 2 MiB thread stack's worth),
 * JINJA_MAX_OUTPUT bytes of text and JINJA_MAX_MEMORY bytes of values. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/env.h"
#include "jinja_internal.h"
#include "tok_internal.h"

typedef struct jscope {
    struct jscope *parent;
    jdict vars;
} jscope;

enum { FN_RANGE, FN_NAMESPACE, FN_DICT, FN_RAISE, FN_STRFTIME };
static const char *const FN_NAMES[] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};

typedef struct rstate {
    const jtemplate *t;
    jctx *c;
    const jdict *vars;
    jscope *root;
    jbuf *out;
    uint64_t steps;
    int depth; /* macro calls */
    int nest;  /* eval and exec_stmt frames on the stack (nest_in) */
    int control; /* 1: break, 2: continue, pending */
} rstate;

#define MAX_RANGE 100000 /* the sandbox's limit on range() */

static bool err(rstate *r, const jnode *at, accel_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool err(rstate *r, const jnode *at, accel_status st, const char *fmt, ...) {
    char where[64], msg[512];
    jinja_where(r->t, at ? at->pos : 0, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    accel_set_error(st, "chat template: %s: %s", where, msg);
    return false;
}

static bool step(rstate *r, const jnode *at) {
    if (++r->steps > JINJA_MAX_STEPS)
        return err(r, at, ACCEL_ERR_INVALID_ARG, "the render ran past %d steps (a runaway loop?)", JINJA_MAX_STEPS);
    return true;
}

/* A string operation about to scan (not copy: copies are bounded by the memory
 * budget) bytes: one step per JINJA_BYTES_PER_STEP of them, so a loop over a huge
 * string's count() or find() runs out of steps rather than for minutes. */
static bool charge(rstate *r, const jnode *at, size_t bytes) {
    r->steps += bytes / JINJA_BYTES_PER_STEP;
    return step(r, at);
}

static bool undefined_error(rstate *r, const jnode *at, jv u) {
    if (u.s.n) return err(r, at, ACCEL_ERR_INVALID_ARG, "'%.*s' is undefined", (int)u.s.n, u.s.p);
    return err(r, at, ACCEL_ERR_INVALID_ARG, "a value is undefined");
}

static bool name_is(const char *p, size_t n, const char *s) { return strlen(s) == n && !memcmp(p, s, n); }

/* ------------------------------------------------------------ scopes */

static const jv *scope_get(const jscope *s, const char *p, size_t n) {
    for (; s; s = s->parent) {
        const jv *v = jv_dict_get(&s->vars, jv_str(p, n));
        if (v) return v;
    }
    return NULL;
}

static jscope *scope_new(rstate *r, jscope *parent) {
    jscope *s = jv_alloc(r->c, sizeof *s);
    if (s) *s = (jscope){.parent = parent};
    return s;
}

static bool lookup(rstate *r, jscope *s, const jnode *at, const char *p, size_t n, jv *out) {
    const jv *v = scope_get(s, p, n);
    if (!v) v = jv_dict_get(r->vars, jv_str(p, n));
    if (v) {
        *out = *v;
        return true;
    }
    for (int i = 0; i < (int)(sizeof FN_NAMES / sizeof *FN_NAMES); i++)
        if (name_is(p, n, FN_NAMES[i])) {
            *out = (jv){.k = JV_FUNC, .fn = i};
            return true;
        }
    /* the rest of jinja2's globals: there (so defined, and printed as an object) in
     * jinja2, not undefined */
    static const char *const JINJA_GLOBALS[] = {"cycler", "joiner", "lipsum", "self"};
    for (size_t i = 0; i < sizeof JINJA_GLOBALS / sizeof *JINJA_GLOBALS; i++)
        if (name_is(p, n, JINJA_GLOBALS[i]))
            return err(r, at, ACCEL_ERR_UNSUPPORTED, "jinja2's global '%s' is not implemented", JINJA_GLOBALS[i]);
    *out = jv_undef(p, n);
    return true;
}

/* Python's == of a and b into *res; values nested past JV_MAX_NEST are refused
 * (jinja2's RecursionError) rather than compared on an overflowing stack. */
static bool equal(rstate *r, const jnode *at, jv a, jv b, bool *res) {
    if (a.k == JV_STR && b.k == JV_STR && a.s.n == b.s.n && !charge(r, at, a.s.n)) return false;
    int e = jv_equal(a, b);
    if (e < 0) return err(r, at, ACCEL_ERR_INVALID_ARG, "RecursionError: comparing values nested deeper than %d levels", JV_MAX_NEST);
    *res = e;
    return true;
}

/* Python's < (jv_compare) or the TypeError naming op, or the RecursionError. */
static bool compare(rstate *r, const jnode *at, const char *op, jv a, jv b, int *c) {
    bool ok;
    *c = jv_compare(a, b, &ok);
    if (ok) return true;
    if (*c == JV_TOO_DEEP)
        return err(r, at, ACCEL_ERR_INVALID_ARG, "RecursionError: comparing values nested deeper than %d levels", JV_MAX_NEST);
    return err(r, at, ACCEL_ERR_INVALID_ARG, "'%s' not supported between instances of '%s' and '%s'", op, jv_type_name(a),
               jv_type_name(b));
}

/* ------------------------------------------------------------ strings */

/* A failure of jinja_value.c (printing, tojson), which knows no position, given the
 * line and column of at (an out-of-memory keeps its own message). */
static bool placed(rstate *r, const jnode *at) {
    accel_status st = accel_last_status();
    if (st == ACCEL_ERR_OOM) return false;
    const char *m = accel_last_error(), *pre = "chat template: ";
    if (!strncmp(m, pre, strlen(pre))) m += strlen(pre);
    char msg[400];
    snprintf(msg, sizeof msg, "%s", m);
    return err(r, at, st ? st : ACCEL_ERR_INVALID_ARG, "%s", msg);
}

/* v as a string into *out (None when it fails: the compiler cannot see that
 * placed() never returns true, so *out is set on every path). */
static bool str_of(rstate *r, const jnode *at, jv v, jv *out) {
    *out = jv_none();
    if (v.k == JV_STR) {
        *out = v;
        return true;
    }
    jbuf b = {.c = r->c};
    if (!jv_to_str(&b, v)) return placed(r, at);
    *out = jbuf_str(&b);
    return true;
}

static bool in_chars(uint32_t cp, jv chars) {
    for (size_t i = 0; i < chars.s.n;) {
        uint32_t c;
        size_t l = tok_utf8_next(chars.s.p + i, chars.s.n - i, &c);
        if (!l) break;
        if (c == cp) return true;
        i += l;
    }
    return false;
}

/* str.strip/lstrip/rstrip: chars is NONE (whitespace) or a STR. */
static jv strip(jv s, jv chars, bool left, bool right) {
    size_t a = 0, b = s.s.n;
    while (left && a < b) {
        uint32_t cp;
        size_t l = tok_utf8_next(s.s.p + a, b - a, &cp);
        if (!l || !(chars.k == JV_STR ? in_chars(cp, chars) : jv_py_isspace(cp))) break;
        a += l;
    }
    while (right && b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s.s.p[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        if (!tok_utf8_next(s.s.p + j, b - j, &cp) || !(chars.k == JV_STR ? in_chars(cp, chars) : jv_py_isspace(cp))) break;
        b = j;
    }
    return jv_str(s.s.p + a, b - a);
}

/* upper/lower/capitalize as Python's (jinja_case.c). */
static bool recase(rstate *r, jv s, int mode, jv *out) {
    jbuf b = {.c = r->c};
    if (!jv_recase(&b, s.s.p, s.s.n, mode)) return false;
    *out = jbuf_str(&b);
    return true;
}

static bool has_prefix(jv s, jv x, bool end) {
    if (x.s.n > s.s.n) return false;
    return !x.s.n || !memcmp(s.s.p + (end ? s.s.n - x.s.n : 0), x.s.p, x.s.n);
}

/* glibc's memmem (CMakeLists.txt defines _GNU_SOURCE): linear time, where a naive
 * search is O(hn * nn) on a hostile needle. */
static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (!nn) return h;
    return memmem(h, hn, n, nn);
}

static bool list_from(rstate *r, jv *items, size_t n, jv_kind k, jv *out) {
    jlist *l = jv_list_new(r->c, n);
    if (!l) return false;
    if (n) memcpy(l->v, items, n * sizeof(jv));
    *out = (jv){.k = k, .l = l};
    return true;
}

/* A growable list of values in the arena. */
typedef struct jvec {
    jv *v;
    size_t n, cap;
} jvec;

static bool vec_push(rstate *r, jvec *a, jv x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 8;
        jv *v = jv_alloc(r->c, cap * sizeof(jv));
        if (!v) return false;
        if (a->n) memcpy(v, a->v, a->n * sizeof(jv));
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

/* str.split / str.rsplit (sep NONE: runs of whitespace). */
static bool split(rstate *r, const jnode *at, jv s, jv sep, int64_t maxsplit, bool from_right, jv *out) {
    jvec v = {0};
    if (sep.k == JV_STR && !sep.s.n) return err(r, at, ACCEL_ERR_INVALID_ARG, "split: empty separator");
    if (!charge(r, at, s.s.n)) return false;
    if (sep.k == JV_STR) {
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                const char *f = maxsplit != 0 ? memfind(s.s.p + i, s.s.n - i, sep.s.p, sep.s.n) : NULL;
                if (!f) break;
                if (!vec_push(r, &v, jv_str(s.s.p + i, (size_t)(f - s.s.p) - i))) return false;
                i = (size_t)(f - s.s.p) + sep.s.n;
                if (maxsplit > 0) maxsplit--;
            }
            if (!vec_push(r, &v, jv_str(s.s.p + i, s.s.n - i))) return false;
        } else {
            /* The rightmost matches, searched for in linear time: the
             * leftmost ones of the reversed separator in the reversed string
             * (a match at j there is the one at n - j - m here). */
            size_t n = s.s.n, m = sep.s.n, e = n, j = 0;
            char *rs = maxsplit != 0 ? jv_alloc(r->c, n + m) : NULL;
            if (maxsplit != 0 && !rs) return false;
            for (size_t k = 0; rs && k < n; k++) rs[k] = s.s.p[n - 1 - k];
            for (size_t k = 0; rs && k < m; k++) rs[n + k] = sep.s.p[m - 1 - k];
            while (maxsplit != 0) {
                const char *f = memfind(rs + j, n - j, rs + n, m);
                if (!f) break;
                size_t i = n - (size_t)(f - rs) - m;
                if (!vec_push(r, &v, jv_str(s.s.p + i + m, e - i - m))) return false;
                e = i, j = (size_t)(f - rs) + m;
                if (maxsplit > 0) maxsplit--;
            }
            if (!vec_push(r, &v, jv_str(s.s.p, e))) return false;
            for (size_t i = 0; i < v.n / 2; i++) {
                jv t = v.v[i];
                v.v[i] = v.v[v.n - 1 - i], v.v[v.n - 1 - i] = t;
            }
        }
        return list_from(r, v.v, v.n, JV_LIST, out);
    }
    if (from_right && maxsplit >= 0)
        return err(r, at, ACCEL_ERR_UNSUPPORTED, "rsplit() on whitespace with maxsplit is not implemented");
    size_t i = 0;
    for (;;) {
        while (i < s.s.n) {
            uint32_t cp;
            size_t l = tok_utf8_next(s.s.p + i, s.s.n - i, &cp);
            if (!l || !jv_py_isspace(cp)) break;
            i += l;
        }
        if (i >= s.s.n) break;
        if (maxsplit == 0) {
            jv rest = strip(jv_str(s.s.p + i, s.s.n - i), jv_none(), false, true);
            if (!vec_push(r, &v, rest)) return false;
            break;
        }
        size_t st = i;
        while (i < s.s.n) {
            uint32_t cp;
            size_t l = tok_utf8_next(s.s.p + i, s.s.n - i, &cp);
            if (l && jv_py_isspace(cp)) break;
            i += l ? l : 1;
        }
        if (!vec_push(r, &v, jv_str(s.s.p + st, i - st))) return false;
        if (maxsplit > 0) maxsplit--;
    }
    return list_from(r, v.v, v.n, JV_LIST, out);
}

static bool replace(rstate *r, jv s, jv old, jv new_, int64_t count, jv *out) {
    jbuf b = {.c = r->c};
    size_t i = 0;
    if (!old.s.n) {
        /* Python inserts new_ between every character and at both ends */
        size_t k = 0;
        while (count < 0 || (int64_t)k < count) {
            if (!jbuf_put(&b, new_.s.p, new_.s.n)) return false;
            k++;
            if (i >= s.s.n) break;
            size_t l = jv_utf8_offset(s.s.p + i, s.s.n - i, 1);
            if (!jbuf_put(&b, s.s.p + i, l)) return false;
            i += l;
        }
        if (!jbuf_put(&b, s.s.p + i, s.s.n - i)) return false;
    } else {
        for (int64_t k = 0; count < 0 || k < count; k++) {
            const char *f = memfind(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
            if (!f) break;
            if (!jbuf_put(&b, s.s.p + i, (size_t)(f - s.s.p) - i) || !jbuf_put(&b, new_.s.p, new_.s.n)) return false;
            i = (size_t)(f - s.s.p) + old.s.n;
        }
        if (!jbuf_put(&b, s.s.p + i, s.s.n - i)) return false;
    }
    *out = jbuf_str(&b);
    return true;
}

/* ------------------------------------------------------------ iteration, items, attributes */

/* What `for x in v` walks: a list's items, a dict's keys, a string's characters;
 * nothing for Undefined. */
static bool iterate(rstate *r, const jnode *at, jv v, jlist **out) {
    switch (v.k) {
    case JV_LIST:
    case JV_TUPLE:
    case JV_GEN:
    case JV_VIEW: *out = v.l; return true;
    case JV_DICT: {
        jlist *l = jv_list_new(r->c, v.d->n);
        if (!l) return false;
        if (v.d->n) memcpy(l->v, v.d->key, v.d->n * sizeof(jv));
        *out = l;
        return true;
    }
    case JV_STR: {
        jlist *l = jv_list_new(r->c, jv_utf8_len(v.s.p, v.s.n));
        if (!l) return false;
        for (size_t i = 0, k = 0; i < v.s.n; k++) {
            size_t n = jv_utf8_offset(v.s.p + i, v.s.n - i, 1);
            l->v[k] = jv_str(v.s.p + i, n);
            i += n;
        }
        *out = l;
        return true;
    }
    case JV_UNDEF: *out = jv_list_new(r->c, 0); return *out != NULL;
    default: return err(r, at, ACCEL_ERR_INVALID_ARG, "'%s' object is not iterable", jv_type_name(v));
    }
}

static bool method(rstate *r, jv self, const char *name, jv *out) {
    jmethod *m = jv_alloc(r->c, sizeof *m);
    if (!m) return false;
    m->self = self, m->name = name;
    *out = (jv){.k = JV_METHOD, .meth = m};
    return true;
}

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit",
                                          "upper", "lower", "capitalize", "replace", "find", "count", "join", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};
static const char *const LIST_METHODS[] = {"index", "count", NULL};
/* Attributes of Python's str, dict and list that exist but that this interpreter
 * does not run (mutators the sandbox forbids, and the rest): refused, not undefined. */
static const char *const REFUSED_ATTRS[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                                            "update", "setdefault", "popitem", "copy", "format", "format_map",
                                            "splitlines", "partition", "rpartition", "title", "swapcase", "center",
                                            "ljust", "rjust", "zfill", "isdigit", "isalpha", "isalnum", "isspace",
                                            "islower", "isupper", "rfind", "index", "rindex", "encode", "expandtabs",
                                            "casefold", "removeprefix", "removesuffix", "fromkeys", NULL};

static const char *find_name(const char *const *list, const char *p, size_t n) {
    for (size_t i = 0; list[i]; i++)
        if (name_is(p, n, list[i])) return list[i];
    return NULL;
}

static bool loop_attr(rstate *r, const jnode *at, const jloop *lp, const char *p, size_t n, jv *out) {
    int64_t i = (int64_t)lp->i, len = (int64_t)lp->items->n;
    if (name_is(p, n, "index")) *out = jv_int(i + 1);
    else if (name_is(p, n, "index0")) *out = jv_int(i);
    else if (name_is(p, n, "revindex")) *out = jv_int(len - i);
    else if (name_is(p, n, "revindex0")) *out = jv_int(len - i - 1);
    else if (name_is(p, n, "first")) *out = jv_bool(i == 0);
    else if (name_is(p, n, "last")) *out = jv_bool(i == len - 1);
    else if (name_is(p, n, "length")) *out = jv_int(len);
    else if (name_is(p, n, "depth")) *out = jv_int(1);
    else if (name_is(p, n, "depth0")) *out = jv_int(0);
    else if (name_is(p, n, "previtem")) *out = i > 0 ? lp->items->v[i - 1] : jv_undef("previtem", 8);
    else if (name_is(p, n, "nextitem")) *out = i + 1 < len ? lp->items->v[i + 1] : jv_undef("nextitem", 8);
    else if (name_is(p, n, "cycle")) return method(r, (jv){.k = JV_LOOP, .loop = (jloop *)lp}, "cycle", out);
    else return err(r, at, ACCEL_ERR_UNSUPPORTED, "loop.%.*s is not implemented", (int)n, p);
    return true;
}

/* obj.name as jinja's sandbox resolves it: the Python attribute (a method), else the item. */
static bool get_attr(rstate *r, const jnode *at, jv obj, const char *p, size_t n, jv *out) {
    const char *m = NULL;
    switch (obj.k) {
    case JV_UNDEF: return undefined_error(r, at, obj);
    case JV_LOOP: return loop_attr(r, at, obj.loop, p, n, out);
    case JV_NS: {
        const jv *v = jv_dict_get(obj.d, jv_str(p, n));
        *out = v ? *v : jv_undef(p, n);
        return true;
    }
    case JV_DICT: {
        if ((m = find_name(DICT_METHODS, p, n))) return method(r, obj, m, out);
        if (find_name(REFUSED_ATTRS, p, n))
            return err(r, at, ACCEL_ERR_UNSUPPORTED, "dict.%.*s is not implemented (the sandbox makes dicts immutable)", (int)n, p);
        const jv *v = jv_dict_get(obj.d, jv_str(p, n));
        *out = v ? *v : jv_undef(p, n);
        return true;
    }
    case JV_STR: m = find_name(STR_METHODS, p, n); break;
    case JV_LIST:
    case JV_TUPLE: m = find_name(LIST_METHODS, p, n); break;
    default: break;
    }
    if (m) return method(r, obj, m, out);
    if ((obj.k == JV_STR || obj.k == JV_LIST || obj.k == JV_TUPLE) && find_name(REFUSED_ATTRS, p, n))
        return err(r, at, ACCEL_ERR_UNSUPPORTED, "%s.%.*s is not implemented", jv_type_name(obj), (int)n, p);
    *out = jv_undef(p, n);
    return true;
}

static bool get_item(rstate *r, const jnode *at, jv obj, jv key, jv *out) {
    if (obj.k == JV_UNDEF) return undefined_error(r, at, obj);
    if (obj.k == JV_DICT) {
        const jv *v = jv_dict_get(obj.d, key);
        if (v) {
            *out = *v;
            return true;
        }
    }
    if ((obj.k == JV_LIST || obj.k == JV_TUPLE || obj.k == JV_STR) && (key.k == JV_INT || key.k == JV_BOOL)) {
        if (obj.k == JV_STR && !charge(r, at, obj.s.n)) return false;
        int64_t i = key.k == JV_INT ? key.i : key.b;
        int64_t len = obj.k == JV_STR ? (int64_t)jv_utf8_len(obj.s.p, obj.s.n) : (int64_t)obj.l->n;
        if (i < 0) i += len;
        if (i < 0 || i >= len) {
            *out = jv_undef("", 0);
            return true;
        }
        if (obj.k == JV_STR) {
            size_t a = jv_utf8_offset(obj.s.p, obj.s.n, (size_t)i);
            *out = jv_str(obj.s.p + a, jv_utf8_offset(obj.s.p + a, obj.s.n - a, 1));
        } else
            *out = obj.l->v[i];
        return true;
    }
    if (key.k == JV_STR && obj.k != JV_DICT) return get_attr(r, at, obj, key.s.p, key.s.n, out);
    *out = key.k == JV_STR ? jv_undef(key.s.p, key.s.n) : jv_undef("", 0);
    return true;
}

static bool slice_index(rstate *r, const jnode *at, jv v, int64_t *out, bool *given) {
    *given = v.k != JV_NONE;
    if (!*given) return true;
    if (v.k == JV_INT || v.k == JV_BOOL) {
        *out = v.k == JV_INT ? v.i : v.b;
        return true;
    }
    return err(r, at, ACCEL_ERR_INVALID_ARG, "slice indices must be integers or None, not %s", jv_type_name(v));
}

/* obj[a:b:c] with Python's clamping, for lists, tuples and strings (by code point). */
static bool get_slice(rstate *r, const jnode *at, jv obj, jv a, jv b, jv c, jv *out) {
    int64_t start = 0, stop = 0, st = 1;
    bool hs, he, hc;
    if (!slice_index(r, at, a, &start, &hs) || !slice_index(r, at, b, &stop, &he) || !slice_index(r, at, c, &st, &hc))
        return false;
    if (hc && st == 0) return err(r, at, ACCEL_ERR_INVALID_ARG, "slice step cannot be zero");
    if (obj.k == JV_UNDEF) return undefined_error(r, at, obj);
    if (obj.k != JV_LIST && obj.k != JV_TUPLE && obj.k != JV_STR) { /* jinja: an undefined value, not an error */
        *out = jv_undef("", 0);
        return true;
    }
    /* A string is sliced by code point offsets in place: a list of one value per
     * character (32 bytes each) made `text[:-1]` of a few MiB pass the memory budget. */
    bool str = obj.k == JV_STR;
    if (str && !charge(r, at, obj.s.n)) return false;
    int64_t len = str ? (int64_t)jv_utf8_len(obj.s.p, obj.s.n) : (int64_t)obj.l->n;
    if (!hs) start = st < 0 ? len - 1 : 0;
    else {
        if (start < 0) start += len;
        if (start < 0) start = st < 0 ? -1 : 0;
        if (start >= len) start = st < 0 ? len - 1 : len;
    }
    if (!he) stop = st < 0 ? -1 : len;
    else {
        if (stop < 0) stop += len;
        if (stop < 0) stop = st < 0 ? -1 : 0;
        if (stop >= len) stop = st < 0 ? len - 1 : len;
    }
    /* How many items, counted without adding st to an index (a step of 2^63 - 1
     * overflowed): start and stop lie in [-1, len], so their distance fits. */
    uint64_t ast = st > 0 ? (uint64_t)st : 0 - (uint64_t)st, span = 0;
    if (st > 0 && start < stop) span = (uint64_t)(stop - start);
    if (st < 0 && start > stop) span = (uint64_t)(start - stop);
    size_t count = span ? (size_t)((span - 1) / ast + 1) : 0;
    if (str) {
        const char *p = obj.s.p;
        size_t n = obj.s.n, i = count ? jv_utf8_offset(p, n, (size_t)start) : 0;
        if (ast == 1 && st > 0) { /* the common s[a:b]: the bytes between, not copied */
            *out = jv_str(p + i, jv_utf8_offset(p + i, n - i, count));
            return true;
        }
        jbuf sb = {.c = r->c};
        for (size_t k = 0; k < count; k++) {
            if (!jbuf_put(&sb, p + i, jv_utf8_offset(p + i, n - i, 1))) return false;
            if (k + 1 == count) break;
            if (st > 0) i += jv_utf8_offset(p + i, n - i, (size_t)ast);
            else /* back ast code points (count says they are there) */
                for (uint64_t m = 0; m < ast; m++)
                    do i--;
                    while (i && ((unsigned char)p[i] & 0xC0) == 0x80);
        }
        *out = jbuf_str(&sb);
        return true;
    }
    jlist *l = jv_list_new(r->c, count);
    if (!l) return false;
    for (size_t k = 0, i = (size_t)start; k < count; k++, i = st > 0 ? i + (size_t)ast : i - (size_t)ast) {
        l->v[k] = obj.l->v[i];
        if (k + 1 == count) break;
    }
    *out = (jv){.k = obj.k, .l = l};
    return true;
}

/* ------------------------------------------------------------ calls */

typedef struct args {
    jv *pos;
    size_t npos;
    jv *kwv;
    const char **kw;
    size_t *kw_n;
    size_t nkw;
} args;

static bool eval(rstate *r, jscope *s, const jnode *x, jv *out);
static bool exec_body(rstate *r, jscope *s, const jnode *body);

static bool eval_args(rstate *r, jscope *s, const jnode *x, args *a) {
    size_t npos = x->nkid - x->nkw;
    jv *v = jv_alloc(r->c, (x->nkid + 1) * sizeof(jv));
    if (!v) return false;
    for (size_t i = 0; i < x->nkid; i++)
        if (!eval(r, s, x->kid[i], &v[i])) return false;
    *a = (args){.pos = v, .npos = npos, .kwv = v + npos, .kw = x->kw, .kw_n = x->kw_n, .nkw = x->nkw};
    return true;
}

/* Binds a call's arguments to the named parameters of a builtin (Python's rules:
 * positionally, then by keyword, none twice, none unknown); unbound ones keep
 * their defaults in out[]. */
static bool bind(rstate *r, const jnode *at, const char *fname, const args *a, size_t skip, const char *const *params,
                 size_t np, jv *out) {
    if (a->npos > skip + np)
        return err(r, at, ACCEL_ERR_INVALID_ARG, "%s() takes at most %zu arguments (%zu given)", fname, np, a->npos - skip);
    bool *set = jv_alloc(r->c, np + 1);
    if (!set) return false;
    memset(set, 0, np + 1);
    for (size_t i = skip; i < a->npos; i++) out[i - skip] = a->pos[i], set[i - skip] = true;
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < np && !name_is(a->kw[k], a->kw_n[k], params[i])) i++;
        if (i == np)
            return err(r, at, ACCEL_ERR_INVALID_ARG, "%s() got an unexpected keyword argument '%.*s'", fname, (int)a->kw_n[k],
                       a->kw[k]);
        if (set[i]) return err(r, at, ACCEL_ERR_INVALID_ARG, "%s() got multiple values for argument '%s'", fname, params[i]);
        out[i] = a->kwv[k], set[i] = true;
    }
    return true;
}

static bool want_str(rstate *r, const jnode *at, const char *fname, jv v) {
    if (v.k == JV_STR) return true;
    return err(r, at, ACCEL_ERR_INVALID_ARG, "%s: expected a string, got %s", fname, jv_type_name(v));
}

static bool want_int(rstate *r, const jnode *at, const char *fname, jv v, int64_t *out) {
    if (v.k == JV_INT || v.k == JV_BOOL) {
        *out = v.k == JV_INT ? v.i : v.b;
        return true;
    }
    return err(r, at, ACCEL_ERR_INVALID_ARG, "%s: expected an integer, got %s", fname, jv_type_name(v));
}

static bool call_macro(rstate *r, const jnode *at, const jmacro *m, const args *a, jv *out) {
    const jnode *d = m->def;
    if (r->depth >= JINJA_MAX_DEPTH)
        return err(r, at, ACCEL_ERR_INVALID_ARG, "macro calls nested deeper than %d (runaway recursion?)", JINJA_MAX_DEPTH);
    if (a->npos > d->nkid)
        return err(r, at, ACCEL_ERR_INVALID_ARG, "macro '%.*s' takes not more than %zu argument(s)", (int)d->name_n, d->name,
                   d->nkid);
    jscope *s = scope_new(r, m->env);
    if (!s) return false;
    jv *vals = jv_alloc(r->c, (d->nkid + 1) * sizeof(jv));
    bool *set = jv_alloc(r->c, d->nkid + 1);
    if (!vals || !set) return false;
    memset(set, 0, d->nkid + 1);
    for (size_t i = 0; i < a->npos; i++) vals[i] = a->pos[i], set[i] = true;
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < d->nkid && !(d->kid[i]->name_n == a->kw_n[k] && !memcmp(d->kid[i]->name, a->kw[k], a->kw_n[k]))) i++;
        if (i == d->nkid)
            return err(r, at, ACCEL_ERR_INVALID_ARG, "macro '%.*s' takes no keyword argument '%.*s'", (int)d->name_n, d->name,
                       (int)a->kw_n[k], a->kw[k]);
        vals[i] = a->kwv[k], set[i] = true;
    }
    for (size_t i = 0; i < d->nkid; i++) {
        const jnode *prm = d->kid[i];
        if (!set[i]) {
            if (prm->a) {
                if (!eval(r, s, prm->a, &vals[i])) return false;
            } else
                vals[i] = jv_undef(prm->name, prm->name_n);
        }
        if (!jv_dict_set(r->c, &s->vars, jv_str(prm->name, prm->name_n), vals[i])) return false;
    }
    jbuf *saved = r->out, b = {.c = r->c};
    r->out = &b;
    r->depth++;
    bool ok = exec_body(r, s, d->d);
    r->depth--;
    r->out = saved;
    if (!ok) return false;
    *out = jbuf_str(&b);
    return true;
}

static bool call_func(rstate *r, const jnode *at, int fn, const args *a, jv *out) {
    switch (fn) {
    case FN_RANGE: {
        if (a->nkw || !a->npos || a->npos > 3)
            return err(r, at, ACCEL_ERR_INVALID_ARG, "range() takes 1 to 3 positional arguments");
        int64_t v[3] = {0, 0, 1};
        for (size_t i = 0; i < a->npos; i++)
            if (!want_int(r, at, "range", a->pos[i], &v[a->npos == 1 ? 1 : i])) return false;
        if (!v[2]) return err(r, at, ACCEL_ERR_INVALID_ARG, "range() arg 3 must not be zero");
        double cnt = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
        if (cnt > MAX_RANGE)
            return err(r, at, ACCEL_ERR_INVALID_ARG, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                       MAX_RANGE);
        size_t k = cnt > 0 ? (size_t)cnt : 0;
        jlist *l = jv_list_new(r->c, k);
        if (!l) return false;
        for (size_t i = 0; i < k; i++) l->v[i] = jv_int(v[0] + (int64_t)i * v[2]);
        *out = (jv){.k = JV_LIST, .l = l};
        return true;
    }
    case FN_NAMESPACE:
    case FN_DICT: {
        jdict *d = jv_dict_new(r->c);
        if (!d) return false;
        if (a->npos > 1 || (a->npos == 1 && a->pos[0].k != JV_DICT))
            return err(r, at, ACCEL_ERR_UNSUPPORTED, "%s() with positional arguments other than one dict is not implemented",
                       FN_NAMES[fn]);
        if (a->npos)
            for (size_t i = 0; i < a->pos[0].d->n; i++)
                if (!jv_dict_set(r->c, d, a->pos[0].d->key[i], a->pos[0].d->val[i])) return false;
        for (size_t k = 0; k < a->nkw; k++) {
            if (fn == FN_NAMESPACE && a->kw_n[k] && a->kw[k][0] == '_')
                return err(r, at, ACCEL_ERR_INVALID_ARG,
                           "chat templates cannot store underscore-prefixed attributes on a namespace ('%.*s')", (int)a->kw_n[k],
                           a->kw[k]);
            if (!jv_dict_set(r->c, d, jv_str(a->kw[k], a->kw_n[k]), a->kwv[k])) return false;
        }
        *out = (jv){.k = fn == FN_NAMESPACE ? JV_NS : JV_DICT, .d = d};
        return true;
    }
    case FN_RAISE: {
        jv m = a->npos ? a->pos[0] : jv_str("", 0), sm;
        if (!str_of(r, at, m, &sm)) return false;
        return err(r, at, ACCEL_ERR_INVALID_ARG, "raise_exception: %.*s", (int)(sm.s.n > 400 ? 400 : sm.s.n), sm.s.p);
    }
    case FN_STRFTIME: {
        if (a->npos != 1 || a->nkw || a->pos[0].k != JV_STR)
            return err(r, at, ACCEL_ERR_INVALID_ARG, "strftime_now() takes one string argument");
        char fmt[256], buf[512];
        if (a->pos[0].s.n >= sizeof fmt) return err(r, at, ACCEL_ERR_UNSUPPORTED, "strftime_now(): a format over 255 bytes");
        memcpy(fmt, a->pos[0].s.p, a->pos[0].s.n);
        fmt[a->pos[0].s.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(buf, sizeof buf, fmt, &tm);
        return jv_strdup(r->c, buf, k, out);
    }
    }
    return err(r, at, ACCEL_ERR_UNSUPPORTED, "unknown function");
}

static bool call_method(rstate *r, const jnode *at, const jmethod *m, const args *a, jv *out) {
    jv self = m->self, p[3] = {jv_none(), jv_none(), jv_none()};
    const char *nm = m->name;
    if (self.k == JV_LOOP) { /* loop.cycle(a, b, ...) */
        if (!a->npos) return err(r, at, ACCEL_ERR_INVALID_ARG, "loop.cycle() needs at least one argument");
        *out = a->pos[self.loop->i % a->npos];
        return true;
    }
    if (self.k == JV_DICT) {
        if (!strcmp(nm, "get")) {
            static const char *const ps[] = {"key", "default"};
            if (!bind(r, at, "dict.get", a, 0, ps, 2, p)) return false;
            const jv *v = jv_dict_get(self.d, p[0]);
            *out = v ? *v : p[1];
            return true;
        }
        if (a->npos || a->nkw) return err(r, at, ACCEL_ERR_INVALID_ARG, "dict.%s() takes no arguments", nm);
        jlist *l = jv_list_new(r->c, self.d->n);
        if (!l) return false;
        for (size_t i = 0; i < self.d->n; i++) {
            if (!strcmp(nm, "keys")) l->v[i] = self.d->key[i];
            else if (!strcmp(nm, "values")) l->v[i] = self.d->val[i];
            else {
                jv kv[2] = {self.d->key[i], self.d->val[i]};
                if (!list_from(r, kv, 2, JV_TUPLE, &l->v[i])) return false;
            }
        }
        l->view = !strcmp(nm, "keys") ? "dict_keys" : !strcmp(nm, "values") ? "dict_values" : "dict_items";
        *out = (jv){.k = JV_VIEW, .l = l};
        return true;
    }
    if (self.k == JV_LIST || self.k == JV_TUPLE) {
        static const char *const ps[] = {"value"};
        if (!bind(r, at, nm, a, 0, ps, 1, p)) return false;
        int64_t k = 0;
        for (size_t i = 0; i < self.l->n; i++) {
            bool eq = false;
            if (!equal(r, at, self.l->v[i], p[0], &eq)) return false;
            if (eq) {
                if (!strcmp(nm, "index")) {
                    *out = jv_int((int64_t)i);
                    return true;
                }
                k++;
            }
        }
        if (!strcmp(nm, "index")) return err(r, at, ACCEL_ERR_INVALID_ARG, "list.index(x): x not in list");
        *out = jv_int(k);
        return true;
    }
    /* str methods */
    if (!strcmp(nm, "strip") || !strcmp(nm, "lstrip") || !strcmp(nm, "rstrip")) {
        static const char *const ps[] = {"chars"};
        if (!bind(r, at, nm, a, 0, ps, 1, p)) return false;
        if (p[0].k != JV_NONE && !want_str(r, at, nm, p[0])) return false;
        *out = strip(self, p[0], nm[0] != 'r', nm[0] != 'l');
        return true;
    }
    if (!strcmp(nm, "startswith") || !strcmp(nm, "endswith")) {
        static const char *const ps[] = {"prefix"};
        if (!bind(r, at, nm, a, 0, ps, 1, p)) return false;
        bool end = nm[0] == 'e';
        if (p[0].k == JV_STR) {
            if (!charge(r, at, p[0].s.n)) return false; /* a prefix as long as the string compares it all */
            *out = jv_bool(has_prefix(self, p[0], end));
            return true;
        }
        if (p[0].k == JV_TUPLE) {
            *out = jv_bool(false);
            for (size_t i = 0; i < p[0].l->n; i++) {
                if (!want_str(r, at, nm, p[0].l->v[i]) || !charge(r, at, p[0].l->v[i].s.n)) return false;
                if (has_prefix(self, p[0].l->v[i], end)) *out = jv_bool(true);
            }
            return true;
        }
        return err(r, at, ACCEL_ERR_INVALID_ARG, "%s first arg must be str or a tuple of str, not %s", nm, jv_type_name(p[0]));
    }
    if (!strcmp(nm, "split") || !strcmp(nm, "rsplit")) {
        static const char *const ps[] = {"sep", "maxsplit"};
        p[1] = jv_int(-1);
        int64_t ms = -1;
        if (!bind(r, at, nm, a, 0, ps, 2, p) || !want_int(r, at, nm, p[1], &ms)) return false;
        if (p[0].k != JV_NONE && !want_str(r, at, nm, p[0])) return false;
        return split(r, at, self, p[0], ms, nm[0] == 'r', out);
    }
    if (!strcmp(nm, "upper") || !strcmp(nm, "lower") || !strcmp(nm, "capitalize")) {
        if (a->npos || a->nkw) return err(r, at, ACCEL_ERR_INVALID_ARG, "str.%s() takes no arguments", nm);
        return recase(r, self, nm[0] == 'u' ? 'U' : nm[0] == 'l' ? 'L' : 'C', out);
    }
    if (!strcmp(nm, "replace")) {
        static const char *const ps[] = {"old", "new", "count"};
        p[2] = jv_int(-1);
        int64_t cnt = -1;
        if (!bind(r, at, nm, a, 0, ps, 3, p) || !want_str(r, at, nm, p[0]) || !want_str(r, at, nm, p[1]) ||
            !want_int(r, at, nm, p[2], &cnt))
            return false;
        return charge(r, at, self.s.n) && replace(r, self, p[0], p[1], cnt, out);
    }
    if (!strcmp(nm, "find") || !strcmp(nm, "count")) {
        static const char *const ps[] = {"sub"};
        if (!bind(r, at, nm, a, 0, ps, 1, p) || !want_str(r, at, nm, p[0]) || !charge(r, at, self.s.n)) return false;
        if (nm[0] == 'f') {
            const char *f = memfind(self.s.p, self.s.n, p[0].s.p, p[0].s.n);
            *out = jv_int(f ? (int64_t)jv_utf8_len(self.s.p, (size_t)(f - self.s.p)) : -1);
            return true;
        }
        int64_t k = 0;
        if (!p[0].s.n) k = (int64_t)jv_utf8_len(self.s.p, self.s.n) + 1;
        else
            for (size_t i = 0; i + p[0].s.n <= self.s.n;) {
                const char *f = memfind(self.s.p + i, self.s.n - i, p[0].s.p, p[0].s.n);
                if (!f) break;
                k++;
                i = (size_t)(f - self.s.p) + p[0].s.n;
            }
        *out = jv_int(k);
        return true;
    }
    if (!strcmp(nm, "join")) {
        static const char *const ps[] = {"iterable"};
        jlist *items;
        if (!bind(r, at, nm, a, 0, ps, 1, p) || !iterate(r, at, p[0], &items)) return false;
        jbuf b = {.c = r->c};
        for (size_t i = 0; i < items->n; i++) {
            if (!want_str(r, at, "str.join", items->v[i])) return false;
            if ((i && !jbuf_put(&b, self.s.p, self.s.n)) || !jbuf_put(&b, items->v[i].s.p, items->v[i].s.n)) return false;
        }
        *out = jbuf_str(&b);
        return true;
    }
    return err(r, at, ACCEL_ERR_UNSUPPORTED, "%s.%s() is not implemented", jv_type_name(self), nm);
}

static bool call(rstate *r, const jnode *at, jv f, const args *a, jv *out) {
    switch (f.k) {
    case JV_MACRO: return call_macro(r, at, f.mac, a, out);
    case JV_FUNC: return call_func(r, at, f.fn, a, out);
    case JV_METHOD: return call_method(r, at, f.meth, a, out);
    case JV_UNDEF: return undefined_error(r, at, f);
    default: return err(r, at, ACCEL_ERR_INVALID_ARG, "'%s' object is not callable", jv_type_name(f));
    }
}

/* ------------------------------------------------------------ tests */

static bool arith(rstate *r, const jnode *x, int op, jv a, jv b, jv *out);

static const char *const TESTS[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float",
                                    "number", "string", "mapping", "iterable", "sequence", "callable", "sameas",
                                    "in", "divisibleby", "even", "odd", "lower", "upper", "eq", "equalto", "==",
                                    "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge",
                                    ">=", NULL};

static bool run_test(rstate *r, const jnode *at, const char *nm, size_t nn, jv v, const jv *argv, size_t argc, bool *res) {
    jv x = argc ? argv[0] : jv_undef("", 0);
#define IS(s) name_is(nm, nn, s)
    if (IS("defined")) *res = v.k != JV_UNDEF;
    else if (IS("undefined")) *res = v.k == JV_UNDEF;
    else if (IS("none")) *res = v.k == JV_NONE;
    else if (IS("boolean")) *res = v.k == JV_BOOL;
    else if (IS("false")) *res = v.k == JV_BOOL && !v.b;
    else if (IS("true")) *res = v.k == JV_BOOL && v.b;
    else if (IS("integer")) *res = v.k == JV_INT;
    else if (IS("float")) *res = v.k == JV_FLOAT;
    else if (IS("number")) *res = jv_is_number(v);
    else if (IS("string")) *res = v.k == JV_STR;
    else if (IS("mapping")) *res = v.k == JV_DICT;
    else if (IS("iterable"))
        *res = v.k == JV_STR || v.k == JV_LIST || v.k == JV_TUPLE || v.k == JV_DICT || v.k == JV_UNDEF || v.k == JV_GEN ||
               v.k == JV_VIEW;
    else if (IS("sequence")) *res = v.k == JV_STR || v.k == JV_LIST || v.k == JV_TUPLE || v.k == JV_DICT || v.k == JV_UNDEF;
    else if (IS("callable")) *res = v.k == JV_MACRO || v.k == JV_FUNC || v.k == JV_METHOD;
    else if (IS("lower") || IS("upper")) {
        jv s;
        if (!str_of(r, at, v, &s)) return false;
        *res = jv_py_iscase(s.s.p, s.s.n, nm[0] == 'u');
    } else if (IS("even") || IS("odd")) {
        jv m;
        if (!arith(r, at, '%', v, jv_int(2), &m)) return false;
        *res = jv_truthy(m) == IS("odd");
    } else if (!argc)
        return err(r, at, ACCEL_ERR_INVALID_ARG, "test '%.*s' needs an argument", (int)nn, nm);
    else if (IS("sameas")) *res = v.k == x.k && (v.k == JV_NONE || v.k == JV_UNDEF || jv_equal(v, x) == 1);
    else if (IS("eq") || IS("equalto") || IS("==")) return equal(r, at, v, x, res);
    else if (IS("ne") || IS("!=")) {
        if (!equal(r, at, v, x, res)) return false;
        *res = !*res;
    }
    else if (IS("in")) {
        jlist *items;
        if (x.k == JV_STR) {
            if (!want_str(r, at, "in", v) || !charge(r, at, x.s.n)) return false;
            *res = memfind(x.s.p, x.s.n, v.s.p, v.s.n) != NULL;
            return true;
        }
        if (x.k == JV_DICT) {
            *res = jv_dict_get(x.d, v) != NULL;
            return true;
        }
        if (!iterate(r, at, x, &items)) return false;
        *res = false;
        for (size_t i = 0; i < items->n && !*res; i++)
            if (!equal(r, at, items->v[i], v, res)) return false;
    } else if (IS("divisibleby")) {
        jv m;
        if (!arith(r, at, '%', v, x, &m)) return false;
        *res = !jv_truthy(m);
    } else {
        char op[32];
        snprintf(op, sizeof op, "%.*s", (int)(nn < 31 ? nn : 31), nm);
        int c;
        if (!compare(r, at, op, v, x, &c)) return false;
        if (IS("lt") || IS("lessthan") || IS("<")) *res = c < 0;
        else if (IS("le") || IS("<=")) *res = c <= 0;
        else if (IS("gt") || IS("greaterthan") || IS(">")) *res = c > 0;
        else *res = c >= 0;
    }
#undef IS
    return true;
}

/* ------------------------------------------------------------ filters */

static const char *const FILTERS[] = {"trim", "tojson", "length", "count", "upper", "lower", "default", "d", "join",
                                      "replace", "items", "first", "last", "string", "list", "reverse", "safe", "int",
                                      "float", "abs", "capitalize", "map", "select", "reject", "selectattr",
                                      "rejectattr", NULL};

bool jinja_known(const char *name, size_t n, bool test) { return find_name(test ? TESTS : FILTERS, name, n) != NULL; }

/* An attribute path "a.b.0" looked up as jinja's attrgetter does (items, then attributes). */
static bool attr_path(rstate *r, const jnode *at, jv v, jv path, jv *out) {
    if (path.k == JV_INT) return get_item(r, at, v, path, out);
    if (!want_str(r, at, "attribute", path)) return false;
    size_t i = 0;
    do {
        const char *dot = memchr(path.s.p + i, '.', path.s.n - i);
        size_t e = dot ? (size_t)(dot - path.s.p) : path.s.n;
        jv key = jv_str(path.s.p + i, e - i);
        char *endp;
        char num[24];
        if (e - i && e - i < sizeof num) {
            memcpy(num, key.s.p, key.s.n);
            num[key.s.n] = 0;
            long long k = strtoll(num, &endp, 10);
            if (!*endp) key = jv_int(k);
        }
        if (v.k == JV_UNDEF) {
            *out = v;
            return true;
        }
        if (!get_item(r, at, v, key, &v)) return false;
        i = e + 1;
    } while (i <= path.s.n);
    *out = v;
    return true;
}

/* select/reject/selectattr/rejectattr/map over a sequence. */
static bool filter_seq(rstate *r, const jnode *at, const char *nm, jv v, const args *a, jv *out) {
    /* jinja's select_or_reject and map start with `if value:`: a false value (0, 0.0,
     * none, undefined, empty) gives an empty generator, whatever it is and the arguments */
    if (!jv_truthy(v)) return list_from(r, NULL, 0, JV_GEN, out);
    jlist *items;
    if (!iterate(r, at, v, &items)) return false;
    bool attr = strstr(nm, "attr") != NULL, is_map = !strcmp(nm, "map"), keep = nm[0] == 's';
    jvec o = {0};
    size_t first = attr ? 1 : 0; /* positional args before the test name */
    jv path = jv_none(), dflt = jv_undef("", 0);
    bool have_default = false;
    for (size_t k = 0; k < a->nkw; k++) {
        if (is_map && name_is(a->kw[k], a->kw_n[k], "attribute")) path = a->kwv[k];
        else if (is_map && name_is(a->kw[k], a->kw_n[k], "default")) dflt = a->kwv[k], have_default = true;
        else
            return err(r, at, ACCEL_ERR_UNSUPPORTED, "%s() with keyword argument '%.*s' is not implemented", nm, (int)a->kw_n[k],
                       a->kw[k]);
    }
    if (attr) {
        if (!a->npos) return err(r, at, ACCEL_ERR_INVALID_ARG, "%s() needs an attribute", nm);
        path = a->pos[0];
    }
    if (is_map && path.k == JV_NONE && !a->npos) return err(r, at, ACCEL_ERR_INVALID_ARG, "map() needs a filter name or attribute=");
    if (is_map && path.k == JV_NONE)
        return err(r, at, ACCEL_ERR_UNSUPPORTED, "map() with a filter name is not implemented (map(attribute=...) is)");
    for (size_t i = 0; i < items->n; i++) {
        jv it = items->v[i], subj = it;
        if (path.k != JV_NONE && !attr_path(r, at, it, path, &subj)) return false;
        if (is_map) {
            if (subj.k == JV_UNDEF && have_default) subj = dflt;
            if (!vec_push(r, &o, subj)) return false;
            continue;
        }
        bool res;
        if (a->npos > first) {
            jv tn = a->pos[first];
            if (!want_str(r, at, nm, tn)) return false;
            if (!find_name(TESTS, tn.s.p, tn.s.n))
                return err(r, at, ACCEL_ERR_UNSUPPORTED, "%s(): no test named '%.*s'", nm, (int)tn.s.n, tn.s.p);
            if (!run_test(r, at, tn.s.p, tn.s.n, subj, a->pos + first + 1, a->npos - first - 1, &res)) return false;
        } else
            res = jv_truthy(subj);
        if (res == keep && !vec_push(r, &o, it)) return false;
    }
    return list_from(r, o.v, o.n, JV_GEN, out);
}

/* Python's int(str, base) for bases 2-36 (with the base's 0x/0o/0b prefix allowed)
 * and 0 (the base from the prefix, else 10 without leading zeros: "010" is an
 * error, "00" is 0): 1 and *out, 0 where Python raises ValueError, -1 past 64 bits. */
static int py_int(const char *p, size_t n, int64_t base, int64_t *out) {
    if (base != 0 && (base < 2 || base > 36)) return 0;
    while (n && accel__python_blank(p[0])) p++, n--; /* int()'s blanks: not str.isspace()'s \x1c-\x1f */
    while (n && accel__python_blank(p[n - 1])) n--;
    bool neg = n && p[0] == '-';
    if (n && (p[0] == '-' || p[0] == '+')) p++, n--;
    if (n > 2 && p[0] == '0') {
        char c = (char)tolower((unsigned char)p[1]);
        int64_t named = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0;
        if (named && (base == named || base == 0)) {
            base = named;
            p += 2, n -= 2;
            if (p[0] == '_') p++, n--; /* 0x_1f */
        }
    }
    if (!n) return 0;
    if (base == 0) {
        base = 10;
        if (p[0] == '0')
            for (size_t i = 1; i < n; i++)
                if (p[i] != '0' && p[i] != '_') return 0;
    }
    uint64_t acc = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    bool past = false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '_' && i && i + 1 < n && p[i - 1] != '_') continue;
        int c = tolower((unsigned char)p[i]);
        int d = isdigit(c) ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
        if (d >= base) return 0;
        if (acc > (lim - (uint64_t)d) / (uint64_t)base) past = true;
        else acc = acc * (uint64_t)base + (uint64_t)d;
    }
    if (past) return -1;
    *out = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    return 1;
}

static bool filter(rstate *r, jscope *s, const jnode *x, jv v, jv *out) {
    const char *nm = x->name;
    size_t nn = x->name_n;
    args a;
    if (!eval_args(r, s, x, &a)) return false;
    jv p[4] = {jv_none(), jv_none(), jv_none(), jv_none()};
#define IS(t) name_is(nm, nn, t)
    if (IS("default") || IS("d")) {
        static const char *const ps[] = {"default_value", "boolean"};
        p[0] = jv_str("", 0), p[1] = jv_bool(false);
        if (!bind(r, x, "default", &a, 0, ps, 2, p)) return false;
        *out = v.k == JV_UNDEF || (jv_truthy(p[1]) && !jv_truthy(v)) ? p[0] : v;
        return true;
    }
    if (IS("length") || IS("count")) {
        if (v.k == JV_STR) {
            if (!charge(r, x, v.s.n)) return false;
            *out = jv_int((int64_t)jv_utf8_len(v.s.p, v.s.n));
        }
        else if (v.k == JV_LIST || v.k == JV_TUPLE || v.k == JV_VIEW) *out = jv_int((int64_t)v.l->n);
        else if (v.k == JV_DICT || v.k == JV_NS) *out = jv_int((int64_t)v.d->n);
        else if (v.k == JV_UNDEF) *out = jv_int(0);
        else return err(r, x, ACCEL_ERR_INVALID_ARG, "object of type '%s' has no len()", jv_type_name(v));
        return true;
    }
    if (IS("tojson")) {
        static const char *const ps[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
        p[0] = jv_bool(false), p[3] = jv_bool(false);
        if (!bind(r, x, "tojson", &a, 0, ps, 4, p)) return false;
        jjson_opts o = {.ensure_ascii = jv_truthy(p[0]), .sort_keys = jv_truthy(p[3])};
        if (p[1].k == JV_INT) {
            int64_t k = p[1].i < 0 ? 0 : p[1].i > 64 ? -1 : p[1].i;
            if (k < 0) return err(r, x, ACCEL_ERR_UNSUPPORTED, "tojson: an indent over 64 is not implemented");
            o.indent = "                                                                ", o.indent_n = (size_t)k;
        } else if (p[1].k == JV_STR)
            o.indent = p[1].s.p, o.indent_n = p[1].s.n;
        else if (p[1].k != JV_NONE)
            return err(r, x, ACCEL_ERR_INVALID_ARG, "tojson: indent must be an integer, a string or None");
        if (p[2].k != JV_NONE) {
            if ((p[2].k != JV_LIST && p[2].k != JV_TUPLE) || p[2].l->n != 2 || p[2].l->v[0].k != JV_STR || p[2].l->v[1].k != JV_STR)
                return err(r, x, ACCEL_ERR_INVALID_ARG, "tojson: separators must be a pair of strings");
            o.item_sep = p[2].l->v[0].s.p, o.item_sep_n = p[2].l->v[0].s.n;
            o.key_sep = p[2].l->v[1].s.p, o.key_sep_n = p[2].l->v[1].s.n;
        }
        jbuf b = {.c = r->c};
        if (!jv_to_json(&b, v, &o, 0)) return placed(r, x);
        *out = jbuf_str(&b);
        return true;
    }
    if (IS("items")) {
        if (v.k == JV_UNDEF) return list_from(r, NULL, 0, JV_GEN, out);
        if (v.k != JV_DICT) return err(r, x, ACCEL_ERR_INVALID_ARG, "Can only get item pairs from a mapping.");
        jmethod m = {.self = v, .name = "items"};
        args none = {0};
        if (!call_method(r, x, &m, &none, out)) return false;
        out->k = JV_GEN;
        return true;
    }
    if (IS("first") || IS("last") || IS("list") || IS("reverse")) {
        jlist *items;
        if (!iterate(r, x, v, &items)) return false;
        if (IS("last") && v.k == JV_GEN) return err(r, x, ACCEL_ERR_INVALID_ARG, "'generator' object is not reversible");
        if (IS("first") || IS("last")) {
            *out = items->n ? items->v[IS("first") ? 0 : items->n - 1] : jv_undef("", 0);
            return true;
        }
        if (IS("list")) return list_from(r, items->v, items->n, JV_LIST, out);
        jvec o = {0};
        for (size_t i = items->n; i-- > 0;)
            if (!vec_push(r, &o, items->v[i])) return false;
        /* reversed(): an iterator, but a list when what was reversed was a generator */
        if (v.k != JV_STR) return list_from(r, o.v, o.n, v.k == JV_GEN ? JV_LIST : JV_GEN, out);
        jbuf b = {.c = r->c};
        for (size_t i = 0; i < o.n; i++)
            if (!jbuf_put(&b, o.v[i].s.p, o.v[i].s.n)) return false;
        *out = jbuf_str(&b);
        return true;
    }
    if (IS("join")) {
        static const char *const ps[] = {"d", "attribute"};
        p[0] = jv_str("", 0);
        jlist *items;
        if (!bind(r, x, "join", &a, 0, ps, 2, p) || !want_str(r, x, "join", p[0]) || !iterate(r, x, v, &items)) return false;
        jbuf b = {.c = r->c};
        for (size_t i = 0; i < items->n; i++) {
            jv it = items->v[i], st;
            if (p[1].k != JV_NONE && !attr_path(r, x, it, p[1], &it)) return false;
            if (!str_of(r, x, it, &st)) return false;
            if ((i && !jbuf_put(&b, p[0].s.p, p[0].s.n)) || !jbuf_put(&b, st.s.p, st.s.n)) return false;
        }
        *out = jbuf_str(&b);
        return true;
    }
    if (IS("map") || IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) {
        char f[16];
        snprintf(f, sizeof f, "%.*s", (int)nn, nm);
        return filter_seq(r, x, f, v, &a, out);
    }
    if (IS("int") || IS("float")) {
        static const char *const ps[] = {"default", "base"};
        p[0] = IS("int") ? jv_int(0) : jv_float(0), p[1] = jv_int(10);
        if (!bind(r, x, nm, &a, 0, ps, IS("int") ? 2 : 1, p)) return false;
        if (IS("float")) { /* float(value), its default on a ValueError or TypeError */
            double d;
            if (jv_is_number(v)) *out = jv_float(jv_as_double(v));
            else *out = v.k == JV_STR && accel__python_float_n(v.s.p, v.s.n, &d) ? jv_float(d) : p[0];
            return true;
        }
        /* int(value) (int(value, base) of a str), else int(float(value)) ("42.5" -> 42),
         * else the default: jinja's do_int */
        if (v.k == JV_INT || v.k == JV_BOOL) {
            *out = jv_int(v.k == JV_INT ? v.i : v.b);
            return true;
        }
        int64_t base = 10;
        if (!want_int(r, x, "int", p[1], &base)) return false;
        if (v.k == JV_STR) {
            int64_t k;
            int got = py_int(v.s.p, v.s.n, base, &k);
            if (got > 0) *out = jv_int(k);
            if (got < 0) return err(r, x, ACCEL_ERR_UNSUPPORTED, "integers past 64 bits are not implemented");
            if (got) return true;
        }
        double d;
        if (v.k == JV_FLOAT) d = v.f;
        else if (!(v.k == JV_STR && accel__python_float_n(v.s.p, v.s.n, &d))) {
            *out = p[0];
            return true;
        }
        if (isnan(d) || isinf(d)) *out = p[0]; /* int(nan): ValueError, int(inf): OverflowError, both caught */
        else if (!(fabs(d) < 9223372036854775808.0))
            return err(r, x, ACCEL_ERR_UNSUPPORTED, "integers past 64 bits are not implemented");
        else *out = jv_int((int64_t)d);
        return true;
    }
    if (IS("abs")) {
        if (v.k == JV_INT && v.i == INT64_MIN) return err(r, x, ACCEL_ERR_UNSUPPORTED, "integers past 64 bits are not implemented");
        if (v.k == JV_INT) *out = jv_int(v.i < 0 ? -v.i : v.i);
        else if (v.k == JV_FLOAT) *out = jv_float(fabs(v.f));
        else if (v.k == JV_BOOL) *out = jv_int(v.b);
        else return err(r, x, ACCEL_ERR_INVALID_ARG, "bad operand type for abs(): '%s'", jv_type_name(v));
        return true;
    }
    /* the string filters: their value as str() first (safe makes a Markup string) */
    jv sv;
    if (!str_of(r, x, v, &sv)) return false;
    if (IS("string") || IS("safe")) {
        *out = sv;
        return true;
    }
    if (IS("trim")) {
        static const char *const ps[] = {"chars"};
        if (!bind(r, x, "trim", &a, 0, ps, 1, p)) return false;
        if (p[0].k != JV_NONE && !want_str(r, x, "trim", p[0])) return false;
        *out = strip(sv, p[0], true, true);
        return true;
    }
    if (IS("upper") || IS("lower") || IS("capitalize")) return recase(r, sv, nm[0] == 'u' ? 'U' : nm[0] == 'l' ? 'L' : 'C', out);
    if (IS("replace")) {
        static const char *const ps[] = {"old", "new", "count"};
        int64_t cnt = -1;
        if (!bind(r, x, "replace", &a, 0, ps, 3, p) || !want_str(r, x, "replace", p[0]) || !want_str(r, x, "replace", p[1]))
            return false;
        if (p[2].k != JV_NONE && !want_int(r, x, "replace", p[2], &cnt)) return false;
        return charge(r, x, sv.s.n) && replace(r, sv, p[0], p[1], cnt, out);
    }
#undef IS
    return err(r, x, ACCEL_ERR_UNSUPPORTED, "filter '%.*s' is not implemented", (int)nn, nm);
}

/* ------------------------------------------------------------ expressions */

static bool arith(rstate *r, const jnode *x, int op, jv a, jv b, jv *out) {
    if (a.k == JV_UNDEF) return undefined_error(r, x, a);
    if (b.k == JV_UNDEF) return undefined_error(r, x, b);
    if (jv_is_number(a) && jv_is_number(b)) {
        bool ints = a.k != JV_FLOAT && b.k != JV_FLOAT;
        int64_t i = a.k == JV_INT ? a.i : a.k == JV_BOOL ? a.b : 0, j = b.k == JV_INT ? b.i : b.k == JV_BOOL ? b.b : 0, k;
        double f = jv_as_double(a), g = jv_as_double(b);
        switch (op) {
        case '+':
        case '-':
        case '*':
            if (ints) {
                bool ovf = op == '+' ? __builtin_add_overflow(i, j, &k) : op == '-' ? __builtin_sub_overflow(i, j, &k) :
                                                                                       __builtin_mul_overflow(i, j, &k);
                if (ovf) return err(r, x, ACCEL_ERR_UNSUPPORTED, "integers past 64 bits are not implemented");
                *out = jv_int(k);
            } else
                *out = jv_float(op == '+' ? f + g : op == '-' ? f - g : f * g);
            return true;
        case '/':
            if (g == 0) return err(r, x, ACCEL_ERR_INVALID_ARG, "division by zero");
            *out = jv_float(f / g);
            return true;
        case 'F':
        case '%':
            if (g == 0) return err(r, x, ACCEL_ERR_INVALID_ARG, "integer division or modulo by zero");
            if (ints) {
                if (i == INT64_MIN && j == -1) return err(r, x, ACCEL_ERR_UNSUPPORTED, "integers past 64 bits are not implemented");
                int64_t q = i / j, m = i % j;
                if (m && ((m < 0) != (j < 0))) q--, m += j; /* Python floors */
                *out = jv_int(op == 'F' ? q : m);
            } else { /* Python's float_divmod: the floor of the exact quotient, a zero
                      * remainder signed as the divisor (7.0 // 0.1 is 69.0, -4.0 % 2 is 0.0) */
                double m = fmod(f, g), d = (f - m) / g;
                if (m) {
                    if ((g < 0) != (m < 0)) m += g, d -= 1.0;
                } else
                    m = copysign(0.0, g);
                double q = copysign(0.0, f / g);
                if (d) {
                    q = floor(d);
                    if (d - q > 0.5) q += 1.0;
                }
                *out = jv_float(op == 'F' ? q : m);
            }
            return true;
        case 'P':
            if (ints && j >= 0) {
                /* 0, 1 and -1 to any power directly (the loop stopping at a product
                 * of 1 made (-1) ** 3 1); any other base overflows within 64 turns */
                int64_t acc = 1;
                if (i == 0) acc = j == 0;
                else if (i == -1) acc = j % 2 ? -1 : 1;
                else if (i != 1)
                    for (int64_t e = 0; e < j; e++)
                        if (__builtin_mul_overflow(acc, i, &acc))
                            return err(r, x, ACCEL_ERR_UNSUPPORTED, "integers past 64 bits are not implemented");
                *out = jv_int(acc);
            } else
                *out = jv_float(pow(f, g));
            return true;
        }
    }
    if (op == '+' && a.k == JV_STR && b.k == JV_STR) {
        jbuf o = {.c = r->c};
        if (!jbuf_put(&o, a.s.p, a.s.n) || !jbuf_put(&o, b.s.p, b.s.n)) return false;
        *out = jbuf_str(&o);
        return true;
    }
    if (op == '+' && (a.k == JV_LIST || a.k == JV_TUPLE) && a.k == b.k) {
        jlist *l = jv_list_new(r->c, a.l->n + b.l->n);
        if (!l) return false;
        if (a.l->n) memcpy(l->v, a.l->v, a.l->n * sizeof(jv));
        if (b.l->n) memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
        *out = (jv){.k = a.k, .l = l};
        return true;
    }
    if (op == '*' && (b.k == JV_STR || b.k == JV_LIST || b.k == JV_TUPLE) && (a.k == JV_INT || a.k == JV_BOOL)) {
        jv t = a;
        a = b, b = t;
    }
    if (op == '*' && (a.k == JV_STR || a.k == JV_LIST || a.k == JV_TUPLE) && (b.k == JV_INT || b.k == JV_BOOL)) {
        int64_t n = b.k == JV_INT ? b.i : b.b;
        if (n < 0) n = 0;
        size_t unit = a.k == JV_STR ? a.s.n : a.l->n * sizeof(jv);
        if (!unit) n = 0; /* nothing repeated any number of times: no loop of n empty turns */
        if (unit && (uint64_t)n > (JINJA_MAX_OUTPUT / unit))
            return err(r, x, ACCEL_ERR_INVALID_ARG, "repeating a %s %lld times makes more than %zu MiB", jv_type_name(a),
                       (long long)n, JINJA_MAX_OUTPUT >> 20);
        if (a.k == JV_STR) {
            jbuf o = {.c = r->c};
            for (int64_t i = 0; i < n; i++)
                if (!jbuf_put(&o, a.s.p, a.s.n)) return false;
            *out = jbuf_str(&o);
            return true;
        }
        jlist *l = jv_list_new(r->c, a.l->n * (size_t)n);
        if (!l) return false;
        for (int64_t i = 0; i < n; i++)
            if (a.l->n) memcpy(l->v + (size_t)i * a.l->n, a.l->v, a.l->n * sizeof(jv));
        *out = (jv){.k = a.k, .l = l};
        return true;
    }
    if (op == '%' && a.k == JV_STR) return err(r, x, ACCEL_ERR_UNSUPPORTED, "string formatting with %% is not implemented");
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char *on = names[op == '+' ? 0 : op == '-' ? 1 : op == '*' ? 2 : op == '/' ? 3 : op == 'F' ? 4 : op == '%' ? 5 : 6];
    return err(r, x, ACCEL_ERR_INVALID_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", on, jv_type_name(a),
               jv_type_name(b));
}

static bool contains(rstate *r, const jnode *at, jv item, jv container, bool *res) {
    return run_test(r, at, "in", 2, item, &container, 1, res);
}

/* Evaluation recurses (eval into eval, statements into statements, macro calls
 * into their bodies); one counter over all of it keeps a render inside the stack
 * of whatever thread runs it (JINJA_MAX_NEST_EVAL). */
static bool nest_in(rstate *r, const jnode *at) {
    if (++r->nest > JINJA_MAX_NEST_EVAL) {
        r->nest--;
        return err(r, at, ACCEL_ERR_INVALID_ARG, "evaluation nested deeper than %d levels (runaway recursion?)",
                   JINJA_MAX_NEST_EVAL);
    }
    return true;
}

static bool eval_node(rstate *r, jscope *s, const jnode *x, jv *out);

static bool eval(rstate *r, jscope *s, const jnode *x, jv *out) {
    if (!nest_in(r, x)) return false;
    bool ok = eval_node(r, s, x, out);
    r->nest--;
    return ok;
}

static bool eval_node(rstate *r, jscope *s, const jnode *x, jv *out) {
    if (!step(r, x)) return false;
    switch (x->k) {
    case JN_CONST: *out = x->val; return true;
    case JN_NAME: return lookup(r, s, x, x->name, x->name_n, out);
    case JN_ATTR: {
        jv o;
        return eval(r, s, x->a, &o) && get_attr(r, x, o, x->name, x->name_n, out);
    }
    case JN_ITEM: {
        jv o, k;
        return eval(r, s, x->a, &o) && eval(r, s, x->b, &k) && get_item(r, x, o, k, out);
    }
    case JN_SLICE: {
        jv o, p[3] = {jv_none(), jv_none(), jv_none()};
        const jnode *q[3] = {x->b, x->c, x->d};
        if (!eval(r, s, x->a, &o)) return false;
        for (int i = 0; i < 3; i++)
            if (q[i] && !eval(r, s, q[i], &p[i])) return false;
        return get_slice(r, x, o, p[0], p[1], p[2], out);
    }
    case JN_CALL: {
        jv f;
        args a;
        return eval(r, s, x->a, &f) && eval_args(r, s, x, &a) && call(r, x, f, &a, out);
    }
    case JN_FILTER: {
        jv v;
        return eval(r, s, x->a, &v) && filter(r, s, x, v, out);
    }
    case JN_TEST: {
        jv v;
        args a;
        bool res;
        if (!eval(r, s, x->a, &v) || !eval_args(r, s, x, &a)) return false;
        if (a.nkw) return err(r, x, ACCEL_ERR_UNSUPPORTED, "keyword arguments to tests are not implemented");
        if (!run_test(r, x, x->name, x->name_n, v, a.pos, a.npos, &res)) return false;
        *out = jv_bool(res != x->neg);
        return true;
    }
    case JN_UNARY: {
        jv v;
        if (!eval(r, s, x->a, &v)) return false;
        if (x->op == 'n') {
            *out = jv_bool(!jv_truthy(v));
            return true;
        }
        if (v.k == JV_UNDEF) return undefined_error(r, x, v);
        if (!jv_is_number(v)) return err(r, x, ACCEL_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'", x->op, jv_type_name(v));
        if (x->op == '+') *out = v.k == JV_BOOL ? jv_int(v.b) : v;
        else if (v.k == JV_FLOAT) *out = jv_float(-v.f);
        else if (v.k == JV_INT && v.i == INT64_MIN) return err(r, x, ACCEL_ERR_UNSUPPORTED, "integers past 64 bits are not implemented");
        else *out = jv_int(v.k == JV_INT ? -v.i : -(int64_t)v.b);
        return true;
    }
    case JN_BIN: {
        jv a, b;
        if (!eval(r, s, x->a, &a) || !eval(r, s, x->b, &b)) return false;
        if (x->op != '~') return arith(r, x, x->op, a, b, out);
        jv sa, sb;
        if (!str_of(r, x, a, &sa) || !str_of(r, x, b, &sb)) return false;
        jbuf o = {.c = r->c};
        if (!jbuf_put(&o, sa.s.p, sa.s.n) || !jbuf_put(&o, sb.s.p, sb.s.n)) return false;
        *out = jbuf_str(&o);
        return true;
    }
    case JN_CMP: {
        jv a, b;
        if (!eval(r, s, x->a, &a)) return false;
        for (size_t i = 0; i < x->nkid; i++) {
            if (!eval(r, s, x->kid[i], &b)) return false;
            bool res = false;
            int op = x->cmp[i];
            if (op == JCMP_EQ || op == JCMP_NE) {
                if (!equal(r, x, a, b, &res)) return false;
                res = res == (op == JCMP_EQ);
            }
            else if (op == JCMP_IN || op == JCMP_NOTIN) {
                if (!contains(r, x, a, b, &res)) return false;
                res = res == (op == JCMP_IN);
            } else {
                static const char *const on[] = {"", "", "<", "<=", ">", ">="};
                int c;
                if (!compare(r, x, on[op], a, b, &c)) return false;
                res = op == JCMP_LT ? c < 0 : op == JCMP_LE ? c <= 0 : op == JCMP_GT ? c > 0 : c >= 0;
            }
            if (!res) {
                *out = jv_bool(false);
                return true;
            }
            a = b;
        }
        *out = jv_bool(true);
        return true;
    }
    case JN_AND:
    case JN_OR: {
        if (!eval(r, s, x->a, out)) return false;
        if (jv_truthy(*out) == (x->k == JN_OR)) return true;
        return eval(r, s, x->b, out);
    }
    case JN_COND: {
        jv c;
        if (!eval(r, s, x->a, &c)) return false;
        if (jv_truthy(c)) return eval(r, s, x->b, out);
        if (x->c) return eval(r, s, x->c, out);
        *out = jv_undef("", 0);
        return true;
    }
    case JN_LIST:
    case JN_TUPLE: {
        jlist *l = jv_list_new(r->c, x->nkid);
        if (!l) return false;
        for (size_t i = 0; i < x->nkid; i++)
            if (!eval(r, s, x->kid[i], &l->v[i])) return false;
        *out = (jv){.k = x->k == JN_LIST ? JV_LIST : JV_TUPLE, .l = l};
        return true;
    }
    case JN_DICT: {
        jdict *d = jv_dict_new(r->c);
        if (!d) return false;
        for (size_t i = 0; i + 1 < x->nkid; i += 2) {
            jv k, v;
            if (!eval(r, s, x->kid[i], &k) || !eval(r, s, x->kid[i + 1], &v)) return false;
            if (k.k != JV_STR && k.k != JV_INT && k.k != JV_BOOL && k.k != JV_NONE && k.k != JV_FLOAT && k.k != JV_TUPLE)
                return err(r, x->kid[i], ACCEL_ERR_INVALID_ARG, "unhashable type: '%s'", jv_type_name(k));
            if (!jv_dict_set(r->c, d, k, v)) return false;
        }
        *out = (jv){.k = JV_DICT, .d = d};
        return true;
    }
    default: return err(r, x, ACCEL_ERR_UNSUPPORTED, "a statement where an expression was expected");
    }
}

/* ------------------------------------------------------------ statements */

static bool emit(rstate *r, const jnode *at, const char *p, size_t n) {
    if (r->out->n + n > JINJA_MAX_OUTPUT)
        return err(r, at, ACCEL_ERR_INVALID_ARG, "the rendered text would pass %zu MiB", JINJA_MAX_OUTPUT >> 20);
    return jbuf_put(r->out, p, n);
}

/* Binds target (a NAME or a TUPLE of NAMEs) to v in s. */
static bool assign(rstate *r, jscope *s, const jnode *target, jv v) {
    if (target->k == JN_NAME) return jv_dict_set(r->c, &s->vars, jv_str(target->name, target->name_n), v);
    jlist *items;
    if (v.k == JV_DICT || v.k == JV_UNDEF || v.k == JV_STR || v.k == JV_LIST || v.k == JV_TUPLE || v.k == JV_GEN ||
        v.k == JV_VIEW) {
        if (!iterate(r, target, v, &items)) return false;
    } else
        return err(r, target, ACCEL_ERR_INVALID_ARG, "cannot unpack non-iterable %s object", jv_type_name(v));
    if (items->n != target->nkid)
        return err(r, target, ACCEL_ERR_INVALID_ARG, "%s values to unpack (expected %zu, got %zu)",
                   items->n < target->nkid ? "not enough" : "too many", target->nkid, items->n);
    for (size_t i = 0; i < target->nkid; i++)
        if (!assign(r, s, target->kid[i], items->v[i])) return false;
    return true;
}

static bool exec_for(rstate *r, jscope *s, const jnode *x) {
    jv seq;
    jlist *items;
    if (!eval(r, s, x->b, &seq) || !iterate(r, x->b, seq, &items)) return false;
    if (x->c) {
        /* `for a in b if c`: c sees the loop variables; the loop walks what passes */
        jvec kept = {0};
        jscope *t = scope_new(r, s);
        if (!t) return false;
        for (size_t i = 0; i < items->n; i++) {
            jv ok;
            t->vars.n = 0;
            if (!step(r, x) || !assign(r, t, x->a, items->v[i]) || !eval(r, t, x->c, &ok)) return false;
            if (jv_truthy(ok) && !vec_push(r, &kept, items->v[i])) return false;
        }
        if (!(items = jv_list_new(r->c, kept.n))) return false;
        if (kept.n) memcpy(items->v, kept.v, kept.n * sizeof(jv));
    }
    jloop *lp = jv_alloc(r->c, sizeof *lp);
    /* One scope for all turns, emptied at each: a turn's `set` is gone at the next
     * (as in jinja), and a long loop allocates nothing per turn. */
    jscope *t = scope_new(r, s);
    if (!lp || !t) return false;
    lp->items = items;
    for (size_t i = 0; i < items->n; i++) {
        lp->i = i;
        t->vars.n = 0;
        if (!step(r, x) || !jv_dict_set(r->c, &t->vars, jv_str("loop", 4), (jv){.k = JV_LOOP, .loop = lp}) ||
            !assign(r, t, x->a, items->v[i]) || !exec_body(r, t, x->d))
            return false;
        int c = r->control;
        r->control = 0;
        if (c == 1) break;
    }
    if (!items->n && x->e) return exec_body(r, s, x->e);
    return true;
}

static bool exec_node(rstate *r, jscope *s, const jnode *x);

static bool exec_stmt(rstate *r, jscope *s, const jnode *x) {
    if (!nest_in(r, x)) return false;
    bool ok = exec_node(r, s, x);
    r->nest--;
    return ok;
}

static bool exec_node(rstate *r, jscope *s, const jnode *x) {
    switch (x->k) {
    case JN_TEXT: return emit(r, x, x->val.s.p, x->val.s.n);
    case JN_OUT: {
        jv v;
        if (!eval(r, s, x->a, &v)) return false;
        if (v.k == JV_STR) return emit(r, x, v.s.p, v.s.n);
        jv sv;
        return str_of(r, x, v, &sv) && emit(r, x, sv.s.p, sv.s.n);
    }
    case JN_IF:
        for (size_t i = 0; i + 1 < x->nkid; i += 2) {
            jv c;
            if (!eval(r, s, x->kid[i], &c)) return false;
            if (jv_truthy(c)) return exec_body(r, s, x->kid[i + 1]);
        }
        return x->a ? exec_body(r, s, x->a) : true;
    case JN_FOR: return exec_for(r, s, x);
    case JN_SET:
    case JN_SETBLOCK: {
        jv v;
        if (x->k == JN_SET) {
            if (!eval(r, s, x->b, &v)) return false;
        } else {
            jbuf *saved = r->out, b = {.c = r->c};
            r->out = &b;
            bool ok = exec_body(r, s, x->d);
            r->out = saved;
            if (!ok) return false;
            v = jbuf_str(&b);
        }
        if (x->a->k != JN_ATTR) return assign(r, s, x->a, v);
        jv ns;
        if (!eval(r, s, x->a->a, &ns)) return false;
        if (ns.k != JV_NS) return err(r, x->a, ACCEL_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object");
        if (x->a->name_n && x->a->name[0] == '_')
            return err(r, x->a, ACCEL_ERR_INVALID_ARG,
                       "chat templates cannot store underscore-prefixed attributes on a namespace ('%.*s')", (int)x->a->name_n,
                       x->a->name);
        return jv_dict_set(r->c, ns.d, jv_str(x->a->name, x->a->name_n), v);
    }
    case JN_MACRO: {
        jmacro *m = jv_alloc(r->c, sizeof *m);
        if (!m) return false;
        m->def = x, m->env = s;
        return jv_dict_set(r->c, &s->vars, jv_str(x->name, x->name_n), (jv){.k = JV_MACRO, .mac = m});
    }
    case JN_BREAK:
    case JN_CONTINUE: r->control = x->k == JN_BREAK ? 1 : 2; return true;
    case JN_GENERATION: return exec_body(r, s, x->d);
    default: return err(r, x, ACCEL_ERR_UNSUPPORTED, "an expression where a statement was expected");
    }
}

static bool exec_body(rstate *r, jscope *s, const jnode *body) {
    for (size_t i = 0; i < body->nkid && !r->control; i++)
        if (!exec_stmt(r, s, body->kid[i])) return false;
    return true;
}

accel_status jinja_render(const jtemplate *t, jctx *c, const jdict *vars, char **out, size_t *len) {
    jbuf b = {.c = c};
    rstate r = {.t = t, .c = c, .vars = vars, .out = &b};
    if (!(r.root = scope_new(&r, NULL)) || !exec_body(&r, r.root, t->root))
        return accel_propagate_error(ACCEL_ERR_INVALID_ARG, "chat template: the render failed");
    char *s = malloc(b.n + 1);
    if (!s) return accel_set_error(ACCEL_ERR_OOM, "chat template: out of memory for %zu bytes of text", b.n);
    if (b.n) memcpy(s, b.p, b.n);
    s[b.n] = 0;
    *out = s;
    if (len) *len = b.n;
    return ACCEL_OK;
}
