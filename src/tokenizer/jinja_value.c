/* The chat-template interpreter's values (jinja_internal.h): construction in the
 * render's arena, and what Python does with them: truth, ==, <, str(), repr() and
 * transformers' tojson (json.dumps with ensure_ascii=False by default), byte for
 * byte, since templates print all of them into prompts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "core/core_internal.h"
#include "jinja_internal.h"
#include "tok_internal.h"

void *jv_alloc(jctx *c, size_t bytes) {
    if (accel_arena_used(c->arena) + bytes > c->mem_limit) {
        accel_set_error(ACCEL_ERR_OOM, "chat template: the render needs more than %zu MiB of values (a runaway template?)",
                        c->mem_limit >> 20);
        return NULL;
    }
    return accel_arena_alloc(c->arena, bytes ? bytes : 1, 16);
}

jv jv_str(const char *p, size_t n) { return (jv){.k = JV_STR, .s = {p, n}}; }
jv jv_int(int64_t i) { return (jv){.k = JV_INT, .i = i}; }
jv jv_float(double f) { return (jv){.k = JV_FLOAT, .f = f}; }
jv jv_bool(bool b) { return (jv){.k = JV_BOOL, .b = b}; }
jv jv_none(void) { return (jv){.k = JV_NONE}; }
jv jv_undef(const char *name, size_t n) { return (jv){.k = JV_UNDEF, .s = {name, n}}; }

bool jv_strdup(jctx *c, const char *p, size_t n, jv *out) {
    char *q = jv_alloc(c, n);
    if (!q) return false;
    if (n) memcpy(q, p, n);
    *out = jv_str(q, n);
    return true;
}

jlist *jv_list_new(jctx *c, size_t n) {
    jlist *l = jv_alloc(c, sizeof *l);
    if (!l) return NULL;
    l->n = n;
    l->view = NULL;
    l->v = jv_alloc(c, n * sizeof(jv));
    return l->v ? l : NULL;
}

jdict *jv_dict_new(jctx *c) {
    jdict *d = jv_alloc(c, sizeof *d);
    if (d) *d = (jdict){0};
    return d;
}

const jv *jv_dict_get(const jdict *d, jv key) {
    /* A key nested past JV_MAX_NEST (-1) matches nothing: Python's keys are hashable,
     * never lists or dicts, so no template relies on finding one. */
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->key[i], key) == 1) return &d->val[i];
    return NULL;
}

const jv *jv_dict_get_str(const jdict *d, const char *key) { return jv_dict_get(d, jv_str(key, strlen(key))); }

bool jv_dict_set(jctx *c, jdict *d, jv key, jv val) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->key[i], key) == 1) {
            d->val[i] = val;
            return true;
        }
    return jv_dict_append(c, d, key, val);
}

bool jv_dict_append(jctx *c, jdict *d, jv key, jv val) {
    if (d->n == d->cap) {
        /* The arena frees nothing: the old arrays stay until the render ends. */
        size_t cap = d->cap ? 2 * d->cap : 8;
        jv *k = jv_alloc(c, cap * sizeof(jv)), *v = jv_alloc(c, cap * sizeof(jv));
        if (!k || !v) return false;
        if (d->n) memcpy(k, d->key, d->n * sizeof(jv)), memcpy(v, d->val, d->n * sizeof(jv));
        d->key = k, d->val = v, d->cap = cap;
    }
    d->key[d->n] = key;
    d->val[d->n++] = val;
    return true;
}

const char *jv_type_name(jv v) {
    switch (v.k) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_TUPLE: return "tuple";
    case JV_GEN: return "generator";
    case JV_VIEW: return v.l->view;
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "method";
    }
    return "?";
}

bool jv_is_number(jv v) { return v.k == JV_BOOL || v.k == JV_INT || v.k == JV_FLOAT; }

double jv_as_double(jv v) { return v.k == JV_FLOAT ? v.f : v.k == JV_INT ? (double)v.i : (double)v.b; }

static int64_t as_int(jv v) { return v.k == JV_INT ? v.i : (int64_t)v.b; }

bool jv_truthy(jv v) {
    switch (v.k) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0;
    case JV_STR: return v.s.n > 0;
    case JV_LIST:
    case JV_TUPLE:
    case JV_VIEW: return v.l->n > 0;
    case JV_DICT: return v.d->n > 0;
    default: return true;
    }
}

/* Equality and order recurse once per level of nesting: past JV_MAX_NEST levels
 * they stop (as jinja2 stops with a RecursionError) rather than overflow the stack. */
static int eq_rec(jv a, jv b, int depth) {
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) return as_int(a) == as_int(b);
        return jv_as_double(a) == jv_as_double(b);
    }
    if (a.k != b.k) return 0;
    switch (a.k) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.s.n == b.s.n && (!a.s.n || !memcmp(a.s.p, b.s.p, a.s.n));
    case JV_LIST:
    case JV_TUPLE:
        if (a.l->n != b.l->n) return 0;
        if (a.l->n && depth >= JV_MAX_NEST) return -1;
        for (size_t i = 0; i < a.l->n; i++) {
            int e = eq_rec(a.l->v[i], b.l->v[i], depth + 1);
            if (e != 1) return e;
        }
        return 1;
    case JV_DICT:
        if (a.d->n != b.d->n) return 0;
        if (a.d->n && depth >= JV_MAX_NEST) return -1;
        for (size_t i = 0; i < a.d->n; i++) {
            const jv *o = jv_dict_get(b.d, a.d->key[i]);
            if (!o) return 0;
            int e = eq_rec(a.d->val[i], *o, depth + 1);
            if (e != 1) return e;
        }
        return 1;
    case JV_GEN:
    case JV_VIEW: return a.l == b.l;
    case JV_NS: return a.d == b.d;
    case JV_MACRO: return a.mac == b.mac;
    case JV_FUNC: return a.fn == b.fn;
    default: return 0;
    }
}

int jv_equal(jv a, jv b) { return eq_rec(a, b, 0); }

static int compare_rec(jv a, jv b, bool *ok, int depth) {
    *ok = true;
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) return (as_int(a) > as_int(b)) - (as_int(a) < as_int(b));
        double x = jv_as_double(a), y = jv_as_double(b);
        return (x > y) - (x < y);
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        /* UTF-8 byte order is code point order. */
        size_t m = a.s.n < b.s.n ? a.s.n : b.s.n;
        int r = m ? memcmp(a.s.p, b.s.p, m) : 0;
        if (r) return r < 0 ? -1 : 1;
        return (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    if ((a.k == JV_LIST || a.k == JV_TUPLE) && a.k == b.k) {
        if (depth >= JV_MAX_NEST && a.l->n && b.l->n) {
            *ok = false;
            return JV_TOO_DEEP;
        }
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            int e = eq_rec(a.l->v[i], b.l->v[i], depth + 1);
            if (e == 1) continue;
            if (e < 0) {
                *ok = false;
                return JV_TOO_DEEP;
            }
            return compare_rec(a.l->v[i], b.l->v[i], ok, depth + 1);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    *ok = false;
    return 0;
}

int jv_compare(jv a, jv b, bool *ok) { return compare_rec(a, b, ok, 0); }

/* ------------------------------------------------------------ text */

bool jbuf_put(jbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = jv_alloc(b->c, cap);
        if (!p) return false;
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool jbuf_puts(jbuf *b, const char *s) { return jbuf_put(b, s, strlen(s)); }

jv jbuf_str(const jbuf *b) { return jv_str(b->p ? b->p : "", b->n); }

size_t jv_utf8_len(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

size_t jv_utf8_offset(const char *p, size_t n, size_t cps) {
    size_t i = 0;
    while (i < n && cps) {
        i++;
        while (i < n && ((unsigned char)p[i] & 0xC0) == 0x80) i++;
        cps--;
    }
    return i;
}

bool jv_py_isspace(uint32_t cp) {
    /* str.isspace(): bidirectional class WS, B or S, or category Zs. */
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    const utf8proc_property_t *pr = utf8proc_get_property((utf8proc_int32_t)cp);
    return pr->category == UTF8PROC_CATEGORY_ZS || pr->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           pr->bidi_class == UTF8PROC_BIDI_CLASS_B || pr->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

/* repr(float) (JSON's names for the values that have no digits). */
static bool put_float(jbuf *b, double f, bool json) {
    char t[40];
    if (isnan(f)) return jbuf_puts(b, json ? "NaN" : "nan");
    if (isinf(f)) return jbuf_puts(b, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
    return jbuf_puts(b, accel__float_repr(t, sizeof t, f));
}

static bool put_int(jbuf *b, int64_t i) {
    char t[24];
    snprintf(t, sizeof t, "%lld", (long long)i);
    return jbuf_puts(b, t);
}

/* Python's repr of a str: quotes chosen as Python chooses them, non-printable
 * characters escaped. */
static bool repr_str(jbuf *b, const char *p, size_t n) {
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char quote = sq && !dq ? '"' : '\'';
    if (!jbuf_put(b, &quote, 1)) return false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_utf8_next(p + i, n - i, &cp);
        if (!l) l = 1, cp = (unsigned char)p[i];
        char t[12];
        const char *s = NULL;
        if (cp == '\\') s = "\\\\";
        else if (cp == (uint32_t)quote) s = quote == '\'' ? "\\'" : "\\\"";
        else if (cp == '\n') s = "\\n";
        else if (cp == '\r') s = "\\r";
        else if (cp == '\t') s = "\\t";
        else if (cp < 0x20 || cp == 0x7F) snprintf(t, sizeof t, "\\x%02x", cp), s = t;
        else if (cp >= 0x80) {
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            bool printable = !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                               cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                               cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                               cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
            if (!printable) {
                if (cp <= 0xFF) snprintf(t, sizeof t, "\\x%02x", cp);
                else if (cp <= 0xFFFF) snprintf(t, sizeof t, "\\u%04x", cp);
                else snprintf(t, sizeof t, "\\U%08x", cp);
                s = t;
            }
        }
        if (!(s ? jbuf_puts(b, s) : jbuf_put(b, p + i, l))) return false;
        i += l;
    }
    return jbuf_put(b, &quote, 1);
}

/* The containers being printed, outermost first: one met again inside itself is
 * printed as Python prints it ([...], {...}), and nesting past JV_MAX_NEST is
 * refused (jinja2's RecursionError) rather than overflowing the stack. */
typedef struct jprint {
    const void *open[JV_MAX_NEST];
    int n;
} jprint;

static bool str_or_repr(jbuf *b, jv v, bool repr, jprint *st);

static bool put_items(jbuf *b, jv v, jprint *st) {
    const void *self = v.k == JV_DICT || v.k == JV_NS ? (const void *)v.d : (const void *)v.l;
    for (int i = 0; i < st->n; i++)
        if (st->open[i] == self)
            return jbuf_puts(b, v.k == JV_LIST ? "[...]" : v.k == JV_TUPLE ? "(...)" : v.k == JV_NS ? "<Namespace {...}>" : "{...}");
    if (st->n == JV_MAX_NEST) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: RecursionError: printing a value nested deeper than %d levels",
                        JV_MAX_NEST);
        return false;
    }
    st->open[st->n++] = self;
    bool ok;
    if (v.k == JV_LIST || v.k == JV_TUPLE) {
        ok = jbuf_puts(b, v.k == JV_LIST ? "[" : "(");
        for (size_t i = 0; ok && i < v.l->n; i++) ok = (!i || jbuf_puts(b, ", ")) && str_or_repr(b, v.l->v[i], true, st);
        ok = ok && (v.k != JV_TUPLE || v.l->n != 1 || jbuf_puts(b, ",")) && jbuf_puts(b, v.k == JV_LIST ? "]" : ")");
    } else {
        ok = jbuf_puts(b, v.k == JV_NS ? "<Namespace {" : "{");
        for (size_t i = 0; ok && i < v.d->n; i++)
            ok = (!i || jbuf_puts(b, ", ")) && str_or_repr(b, v.d->key[i], true, st) && jbuf_puts(b, ": ") &&
                 str_or_repr(b, v.d->val[i], true, st);
        ok = ok && jbuf_puts(b, v.k == JV_NS ? "}>" : "}");
    }
    st->n--;
    return ok;
}

static bool str_or_repr(jbuf *b, jv v, bool repr, jprint *st) {
    switch (v.k) {
    case JV_UNDEF: return repr ? jbuf_puts(b, "Undefined") : true;
    case JV_NONE: return jbuf_puts(b, "None");
    case JV_BOOL: return jbuf_puts(b, v.b ? "True" : "False");
    case JV_INT: return put_int(b, v.i);
    case JV_FLOAT: return put_float(b, v.f, false);
    case JV_STR: return repr ? repr_str(b, v.s.p, v.s.n) : jbuf_put(b, v.s.p, v.s.n);
    case JV_VIEW: /* dict_items([('a', 1)]) */
        return jbuf_puts(b, v.l->view) && jbuf_puts(b, "(") && put_items(b, (jv){.k = JV_LIST, .l = v.l}, st) &&
               jbuf_puts(b, ")");
    case JV_LIST:
    case JV_TUPLE:
    case JV_DICT:
    case JV_NS: return put_items(b, v, st);
    default:
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "chat template: printing a %s is not implemented", jv_type_name(v));
        return false;
    }
}

bool jv_to_str(jbuf *b, jv v) {
    jprint st;
    st.n = 0;
    return str_or_repr(b, v, false, &st);
}

bool jv_repr(jbuf *b, jv v) {
    jprint st;
    st.n = 0;
    return str_or_repr(b, v, true, &st);
}

/* ------------------------------------------------------------ json.dumps */

static bool json_str(jbuf *b, const char *p, size_t n, bool ascii) {
    if (!jbuf_puts(b, "\"")) return false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_utf8_next(p + i, n - i, &cp);
        if (!l) l = 1, cp = (unsigned char)p[i];
        char t[16];
        const char *s = NULL;
        switch (cp) {
        case '"': s = "\\\""; break;
        case '\\': s = "\\\\"; break;
        case '\n': s = "\\n"; break;
        case '\r': s = "\\r"; break;
        case '\t': s = "\\t"; break;
        case '\b': s = "\\b"; break;
        case '\f': s = "\\f"; break;
        default:
            if (cp < 0x20 || (ascii && cp > 0x7E)) {
                if (cp > 0xFFFF)
                    snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                             0xDC00 + ((cp - 0x10000) & 0x3FF));
                else
                    snprintf(t, sizeof t, "\\u%04x", cp);
                s = t;
            }
        }
        if (!(s ? jbuf_puts(b, s) : jbuf_put(b, p + i, l))) return false;
        i += l;
    }
    return jbuf_puts(b, "\"");
}

static bool json_newline(jbuf *b, const jjson_opts *o, int depth) {
    if (!jbuf_puts(b, "\n")) return false;
    for (int i = 0; i < depth; i++)
        if (!jbuf_put(b, o->indent, o->indent_n)) return false;
    return true;
}

static bool json_item_sep(jbuf *b, const jjson_opts *o) {
    if (o->item_sep) return jbuf_put(b, o->item_sep, o->item_sep_n);
    return jbuf_puts(b, o->indent ? "," : ", ");
}

/* sort_keys: the dict's string keys with their indices, sorted by qsort (a dict
 * from the JSON variables may be large; an insertion sort was quadratic). */
typedef struct keyix {
    jv key;
    size_t i;
} keyix;

static int keyix_cmp(const void *x, const void *y) {
    bool ok;
    return jv_compare(((const keyix *)x)->key, ((const keyix *)y)->key, &ok);
}

static bool sort_keys(jbuf *b, const jdict *d, size_t *ix) {
    keyix *k = jv_alloc(b->c, d->n * sizeof *k);
    if (!k) return false;
    for (size_t i = 0; i < d->n; i++) k[i] = (keyix){d->key[i], i};
    qsort(k, d->n, sizeof *k, keyix_cmp);
    for (size_t i = 0; i < d->n; i++) ix[i] = k[i].i;
    return true;
}

bool jv_to_json(jbuf *b, jv v, const jjson_opts *o, int depth) {
    if (depth > JV_MAX_NEST) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: tojson: value nested deeper than %d levels", JV_MAX_NEST);
        return false;
    }
    switch (v.k) {
    case JV_NONE: return jbuf_puts(b, "null");
    case JV_BOOL: return jbuf_puts(b, v.b ? "true" : "false");
    case JV_INT: return put_int(b, v.i);
    case JV_FLOAT: return put_float(b, v.f, true);
    case JV_STR: return json_str(b, v.s.p, v.s.n, o->ensure_ascii);
    case JV_LIST:
    case JV_TUPLE:
        if (!v.l->n) return jbuf_puts(b, "[]");
        if (!jbuf_puts(b, "[")) return false;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && !json_item_sep(b, o)) return false;
            if (o->indent && !json_newline(b, o, depth + 1)) return false;
            if (!jv_to_json(b, v.l->v[i], o, depth + 1)) return false;
        }
        if (o->indent && !json_newline(b, o, depth)) return false;
        return jbuf_puts(b, "]");
    case JV_DICT: {
        if (!v.d->n) return jbuf_puts(b, "{}");
        size_t *ix = jv_alloc(b->c, v.d->n * sizeof *ix);
        if (!ix) return false;
        for (size_t i = 0; i < v.d->n; i++) ix[i] = i;
        if (o->sort_keys) {
            for (size_t i = 0; i < v.d->n; i++)
                if (v.d->key[i].k != JV_STR) {
                    accel_set_error(ACCEL_ERR_UNSUPPORTED,
                                    "chat template: tojson(sort_keys=true) of a dict with a %s key is not implemented",
                                    jv_type_name(v.d->key[i]));
                    return false;
                }
            if (!sort_keys(b, v.d, ix)) return false;
        }
        if (!jbuf_puts(b, "{")) return false;
        for (size_t j = 0; j < v.d->n; j++) {
            size_t i = ix[j];
            if (j && !json_item_sep(b, o)) return false;
            if (o->indent && !json_newline(b, o, depth + 1)) return false;
            jv k = v.d->key[i];
            bool okk;
            if (k.k == JV_STR) okk = json_str(b, k.s.p, k.s.n, o->ensure_ascii);
            else if (k.k == JV_NONE || k.k == JV_BOOL || k.k == JV_INT || k.k == JV_FLOAT) {
                /* json.dumps writes these keys as the JSON text of the key, quoted */
                okk = jbuf_puts(b, "\"") && jv_to_json(b, k, o, depth + 1) && jbuf_puts(b, "\"");
            } else {
                accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: tojson: keys must be str, int, float, bool or None, not %s",
                                jv_type_name(k));
                return false;
            }
            if (!okk) return false;
            if (!(o->key_sep ? jbuf_put(b, o->key_sep, o->key_sep_n) : jbuf_puts(b, ": "))) return false;
            if (!jv_to_json(b, v.d->val[i], o, depth + 1)) return false;
        }
        if (o->indent && !json_newline(b, o, depth)) return false;
        return jbuf_puts(b, "}");
    }
    default:
        accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: tojson: Object of type %s is not JSON serializable",
                        jv_type_name(v));
        return false;
    }
}
