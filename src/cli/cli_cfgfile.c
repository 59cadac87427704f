/* src/cli/cli_cfgfile.c — default_config.yaml: read (libyaml / jansson),
 * normalise and validate like Accelerate's load_config_from_file, write like
 * to_dict() + yaml.safe_dump (sorted keys, empty dicts and None dropped). */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "cli/cli.h"
#include "core/core_internal.h"
#include "core/env.h"
#include "io/io_internal.h"

/* ---------------------------------------------------------------- tree */

static void cv_oom(void) {
    fprintf(stderr, "accel: out of memory\n");
    exit(1);
}

static char *cv_strdup(const char *s) {
    char *d = strdup(s);
    if (!d) cv_oom();
    return d;
}

cv *cv_new(cv_type t) {
    cv *v = calloc(1, sizeof *v);
    if (!v) cv_oom();
    v->t = t;
    return v;
}
cv *cv_str(const char *s) {
    cv *v = cv_new(CV_STR);
    v->s = cv_strdup(s);
    return v;
}
cv *cv_bool(bool b) {
    cv *v = cv_new(CV_BOOL);
    v->b = b;
    return v;
}
cv *cv_int(long long i) {
    cv *v = cv_new(CV_INT);
    v->i = i;
    return v;
}

void cv_free(cv *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        cv_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
    free(v);
}

cv *cv_get(const cv *map, const char *key) {
    if (!map || map->t != CV_MAP) return NULL;
    for (size_t i = 0; i < map->n; i++)
        if (!strcmp(map->keys[i], key)) return map->items[i];
    return NULL;
}

/* Appends val (under key for a map; key is ignored for a sequence). The
 * arrays double when full: growing by one copied them each time (quadratic
 * where realloc cannot grow in place). */
static void cv_push(cv *c, const char *key, cv *val) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        cv **items = realloc(c->items, cap * sizeof *c->items);
        if (!items) cv_oom();
        c->items = items;
        if (c->t == CV_MAP) {
            char **keys = realloc(c->keys, cap * sizeof *c->keys);
            if (!keys) cv_oom();
            c->keys = keys;
        }
        c->cap = cap;
    }
    if (c->t == CV_MAP) {
        if (!key) abort(); /* internal invariant: every map entry has a key */
        c->keys[c->n] = cv_strdup(key);
    }
    c->items[c->n++] = val;
}

void cv_append(cv *seq, cv *val) { cv_push(seq, NULL, val); }

void cv_add(cv *map, const char *key, cv *val) { cv_push(map, key, val); }

void cv_set(cv *map, const char *key, cv *val) {
    for (size_t i = 0; i < map->n; i++)
        if (!strcmp(map->keys[i], key)) {
            cv_free(map->items[i]);
            map->items[i] = val;
            return;
        }
    cv_push(map, key, val);
}

void cv_del(cv *map, const char *key) {
    for (size_t i = 0; i < map->n; i++)
        if (!strcmp(map->keys[i], key)) {
            cv_free(map->items[i]);
            free(map->keys[i]);
            memmove(map->items + i, map->items + i + 1, (map->n - i - 1) * sizeof *map->items);
            memmove(map->keys + i, map->keys + i + 1, (map->n - i - 1) * sizeof *map->keys);
            map->n--;
            return;
        }
}

static int key_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

typedef struct key_at {
    const char *key;
    size_t at;
} key_at;

static int key_at_cmp(const void *a, const void *b) {
    const key_at *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* A map's entries in key order (ties: file order), without a lookup per key;
 * the caller frees the array. */
static key_at *sorted_entries(const cv *m) {
    key_at *k = malloc((m->n + 1) * sizeof *k);
    if (!k) cv_oom();
    for (size_t i = 0; i < m->n; i++) k[i] = (key_at){m->keys[i], i};
    qsort(k, m->n, sizeof *k, key_at_cmp);
    return k;
}

static void app(char *out, size_t n, const char *fmt, ...) {
    size_t o = strlen(out);
    if (o >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + o, n - o, fmt, ap);
    va_end(ap);
}

void cv_repr(const cv *v, bool top, char *out, size_t n) {
    if (top) out[0] = 0;
    if (!v) return;
    switch (v->t) {
    case CV_NULL: app(out, n, "None"); break;
    case CV_BOOL: app(out, n, v->b ? "True" : "False"); break;
    case CV_INT: app(out, n, "%lld", v->i); break;
    case CV_FLOAT: {
        char f[40];
        accel__float_repr(f, sizeof f, v->f);
        app(out, n, "%s", f);
        break;
    }
    case CV_STR: app(out, n, top ? "%s" : "'%s'", v->s); break;
    case CV_SEQ:
        app(out, n, "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i) app(out, n, ", ");
            cv_repr(v->items[i], false, out, n);
        }
        app(out, n, "]");
        break;
    case CV_MAP: {
        key_at *k = sorted_entries(v);
        app(out, n, "{");
        for (size_t i = 0; i < v->n; i++) {
            app(out, n, "%s'%s': ", i ? ", " : "", k[i].key);
            cv_repr(v->items[k[i].at], false, out, n);
        }
        app(out, n, "}");
        free(k);
        break;
    }
    }
}

/* ---------------------------------------------------------------- YAML read */

/* v = v * base + d, false on overflow. */
static bool push_digit(unsigned long long *v, int base, int d) {
    return !__builtin_mul_overflow(*v, base, v) && !__builtin_add_overflow(*v, d, v);
}

/* A YAML 1.1 int as PyYAML resolves and builds it (yaml.safe_load is what
 * Accelerate reads a config with): an optional sign, then 0b binary, 0x hex,
 * a 0-led octal ("010" is 8), decimal, or base 60 ("1:30" is 90), '_'
 * ignored. 1: an int, in *out; 0: no int ("08", "0o17" and "1e3" are
 * strings to PyYAML too); -1: an int to PyYAML beyond a long long (Python's
 * ints have no bound: taken as a string, it was a silent wrong answer). Read
 * as decimal, "num_processes: 010" launched 10 processes where Accelerate
 * launches 8, and "0x10", "1_000" were refused. */
static int yaml11_int(const char *s, long long *out) {
    const char *p = s + (*s == '-' || *s == '+');
    int base = p[0] != '0' || !p[1] ? 10 : p[1] == 'b' ? 2 : p[1] == 'x' ? 16 : 8;
    const char *d = p + (base == 2 || base == 16 ? 2 : base == 8);
    unsigned long long v = 0; /* the magnitude: -2^63 fits */
    bool big = false;
    int digits = base == 8; /* the octal's leading 0 */
    if (base == 10 && !(*p >= '1' && *p <= '9') && strcmp(p, "0")) return 0;
    bool sexagesimal = base == 10 && strchr(p, ':');
    for (; *d && *d != ':'; d++) {
        if (*d == '_') continue;
        int k = *d >= '0' && *d <= '9' ? *d - '0' : *d >= 'a' && *d <= 'f' ? *d - 'a' + 10
                : *d >= 'A' && *d <= 'F' ? *d - 'A' + 10 : 99;
        if (k >= base) return 0;
        big |= !push_digit(&v, base, k);
        digits++;
    }
    while (sexagesimal && *d == ':') { /* (:[0-5]?[0-9])+ */
        int n = 0, g = 0;
        for (d++; n < 2 && *d >= '0' && *d <= '9'; d++, n++) g = g * 10 + (*d - '0');
        if (!n || g > 59) return 0;
        big |= !push_digit(&v, 60, g);
    }
    if (*d || !digits) return 0;
    if (big || v > (unsigned long long)LLONG_MAX + (*s == '-')) return -1;
    *out = *s == '-' ? (long long)(0 - v) : (long long)v; /* 0 - v: two's complement, -2^63 included */
    return 1;
}

/* p past [0-9_]* (the digits and '_' from p). */
static const char *skip_digits(const char *p) {
    while ((*p >= '0' && *p <= '9') || *p == '_') p++;
    return p;
}

/* s ("1:30:05.5", no '_'; cut in place at each ':') as PyYAML's
 * construct_yaml_float reads base 60: each part Python's float(), summed from the
 * last, the k-th from the end times 60^k. Another order rounds otherwise:
 * 26.96:62.29:49.443 was 100842.84300000001, PyYAML's 100842.843. */
static bool base60_float(char *s, double *out) {
    size_t n = 1;
    for (const char *c = s; *c; c++) n += *c == ':';
    double *parts = malloc(n * sizeof *parts);
    if (!parts) cv_oom();
    bool ok = true;
    char *part = s;
    for (size_t i = 0; i < n && ok; i++) {
        char *colon = strchr(part, ':');
        if (colon) *colon = 0;
        ok = accel__python_float(part, &parts[i]);
        if (colon) part = colon + 1;
    }
    double v = 0.0, base = 1.0;
    for (size_t i = n; ok && i-- > 0; base *= 60) v += parts[i] * base;
    free(parts);
    if (ok) *out = v;
    return ok;
}

/* A YAML 1.1 float as PyYAML resolves and builds it: only
 *   [-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?   "1.", "1_000.5", "1.0e+3"
 *   \.[0-9][0-9_]*([eE][-+][0-9]+)?              ".5" (no sign)
 *   [-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*    base 60: "1:30.5" is 90.5
 *   [-+]?\.(inf|Inf|INF), \.(nan|NaN|NAN)
 * so "1e3", "1.0e3" (no exponent sign) and "-.5" are strings, where strtod
 * made them floats. '_' is dropped before the value is read. */
static bool yaml11_float(const char *s, double *out) {
    const char *p = s + (*s == '-' || *s == '+');
    double sign = *s == '-' ? -1 : 1;
    if (!strcmp(s, ".nan") || !strcmp(s, ".NaN") || !strcmp(s, ".NAN")) return *out = NAN, true;
    if (!strcmp(p, ".inf") || !strcmp(p, ".Inf") || !strcmp(p, ".INF")) return *out = sign * INFINITY, true;
    const char *q = p;
    bool sexagesimal = false;
    if (*q >= '0' && *q <= '9') {
        q = skip_digits(q);
        while (*q == ':') { /* :[0-5]?[0-9] */
            int n = 0;
            for (q++; n < 2 && *q >= '0' && *q <= '9'; q++, n++) {}
            if (!n || (n == 2 && q[-2] > '5')) return false;
            sexagesimal = true;
        }
    } else if (p != s || *q != '.' || !(q[1] >= '0' && q[1] <= '9')) {
        return false;
    }
    if (*q++ != '.') return false;
    q = skip_digits(q);
    if (!sexagesimal && (*q == 'e' || *q == 'E')) {
        if (q[1] != '-' && q[1] != '+') return false;
        if (!(q[2] >= '0' && q[2] <= '9')) return false;
        for (q += 2; *q >= '0' && *q <= '9'; q++) {}
    }
    if (*q) return false;
    char *plain = malloc(strlen(p) + 1), *w = plain; /* p without '_' */
    if (!plain) cv_oom();
    for (const char *r = p; *r; r++)
        if (*r != '_') *w++ = *r;
    *w = 0;
    double v = 0;
    bool ok = base60_float(plain, &v); /* "._": PyYAML's float('.') fails; a string here */
    free(plain);
    if (ok) *out = sign * v;
    return ok;
}

/* PyYAML's YAML 1.1 resolution of a plain scalar; NULL (why in err, when
 * err is not NULL) for an int beyond a long long. */
static cv *resolve_plain(const char *s, char *err, size_t errn) {
    static const char *const T[] = {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", NULL};
    static const char *const F[] = {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", NULL};
    for (int i = 0; T[i]; i++)
        if (!strcmp(s, T[i])) return cv_bool(true);
    for (int i = 0; F[i]; i++)
        if (!strcmp(s, F[i])) return cv_bool(false);
    if (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL"))
        return cv_new(CV_NULL);
    long long i;
    double f;
    if (yaml11_float(s, &f)) {
        cv *v = cv_new(CV_FLOAT);
        v->f = f;
        return v;
    }
    switch (yaml11_int(s, &i)) {
    case 1: return cv_int(i);
    case -1:
        if (err) snprintf(err, errn, "%s is an integer out of range (beyond 64 bits)", s);
        return NULL;
    default: return cv_str(s);
    }
}

/* Limits on a config file: a real one is a few hundred bytes and three levels
 * deep. Without them a 100 KB file nested 50,000 deep overflowed the stack. */
enum { CFG_MAX_DEPTH = 64, CFG_MAX_BYTES = 1 << 20 };

/* Duplicate keys of a mapping: the first position keeps the last value, as a
 * Python dict built by PyYAML does. By sorting, so that n keys cost n log n
 * (replacing on insertion was quadratic: 200k keys took over 20 s). */
static void merge_duplicate_keys(cv *m) {
    if (m->n < 2) return;
    key_at *k = sorted_entries(m);
    bool *drop = calloc(m->n, sizeof *drop);
    if (!drop) cv_oom();
    for (size_t g = 0, e; g < m->n; g = e) {
        for (e = g + 1; e < m->n && !strcmp(k[e].key, k[g].key); e++) drop[k[e].at] = true;
        if (e - g == 1) continue;
        size_t first = k[g].at, last = k[e - 1].at;
        cv_free(m->items[first]);
        m->items[first] = m->items[last];
        m->items[last] = NULL;
    }
    size_t out = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (drop[i]) {
            cv_free(m->items[i]);
            free(m->keys[i]);
            continue;
        }
        m->keys[out] = m->keys[i];
        m->items[out++] = m->items[i];
    }
    m->n = out;
    free(drop);
    free(k);
}

static cv *yaml_node(yaml_parser_t *p, yaml_event_t *ev, const char *key, int depth, char *err, size_t errn);

#define YAML_TAG_PREFIX "tag:yaml.org,2002:"

/* "line N: `key`: " (no key part at the top level or for a key itself). */
static void where_in_yaml(const yaml_event_t *ev, const char *key, char *out, size_t n) {
    snprintf(out, n, "line %zu: %s%s%s", ev->start_mark.line + 1, key ? "`" : "", key ? key : "", key ? "`: " : "");
}

/* The tag of a node as written ("!!str", "!foo"), for the errors. */
static void tag_text(const char *tag, char *out, size_t n) {
    size_t pl = strlen(YAML_TAG_PREFIX);
    if (!strncmp(tag, YAML_TAG_PREFIX, pl)) snprintf(out, n, "!!%s", tag + pl);
    else snprintf(out, n, "%s", tag);
}

/* Whether a scalar's text holds a NUL ("\0" in a quoted scalar): copied as a
 * C string it was cut there, so `mixed_precision: "bf16\0x"` read as bf16
 * where PyYAML keeps the whole string (and Accelerate refuses it). */
static bool scalar_has_nul(const yaml_event_t *ev) {
    return strlen((const char *)ev->data.scalar.value) != ev->data.scalar.length;
}

/* The text without '_' and in lower case (PyYAML's constructors drop the
 * underscores; construct_yaml_float also folds the case): malloc'd. */
static char *constructor_text(const char *text, bool lower) {
    char *t = malloc(strlen(text) + 1), *w = t;
    if (!t) cv_oom();
    for (const char *p = text; *p; p++)
        if (*p != '_') *w++ = (char)(lower ? tolower((unsigned char)*p) : *p);
    *w = 0;
    return t;
}

/* !!float's text as PyYAML's construct_yaml_float reads it: underscores
 * dropped, any case, a sign, then .inf / .nan, base 60 (each part a float:
 * "1:30" is 90.0, "1:30.5" 90.5), else what Python's float() takes (an
 * exponent without a dot, "1e-3", included: the usual way to write one, as
 * the untagged resolver wants a dot). False when it is none. */
static bool yaml_float_text(const char *text, double *out) {
    char *t = constructor_text(text, true);
    const char *u = t + (t[0] == '-' || t[0] == '+');
    double sign = t[0] == '-' ? -1.0 : 1.0, v = 0.0;
    bool ok = true;
    if (!strcmp(u, ".inf")) v = INFINITY;
    else if (!strcmp(u, ".nan")) v = NAN, sign = 1.0; /* PyYAML drops its sign */
    else ok = base60_float((char *)u, &v); /* one part: float(u), as PyYAML's */
    free(t);
    if (ok) *out = sign * v;
    return ok;
}

/* Past the digits of `base` from d, their value in *v (*big set when it
 * passes 64 bits). */
static const char *read_digits(const char *d, int base, unsigned long long *v, bool *big) {
    for (;; d++) {
        int k = *d >= '0' && *d <= '9' ? *d - '0' : *d >= 'a' && *d <= 'f' ? *d - 'a' + 10
                : *d >= 'A' && *d <= 'F' ? *d - 'A' + 10 : 99;
        if (k >= base) return d;
        *big |= !push_digit(v, base, k);
    }
}

/* !!int's text as PyYAML's construct_yaml_int reads it: underscores dropped,
 * a sign, then 0 / 0b binary / 0x hex / 0-led octal by Python's int(s, 8)
 * ("017" and "0o17" alike) / base 60 with parts of any size ("1:75" is 135) /
 * decimal. 1: an int, in *out; 0: none (what Python's int() takes beyond
 * these, a second sign or blanks, is refused too); -1: beyond 64 bits. */
static int yaml_int_text(const char *text, long long *out) {
    char *t = constructor_text(text, false);
    const char *p = t + (t[0] == '-' || t[0] == '+'), *d = p, *e;
    int base = 10, r = 1;
    if (p[0] == '0' && (p[1] == 'b' || p[1] == 'x')) base = p[1] == 'b' ? 2 : 16, d = p + 2;
    else if (p[0] == '0' && p[1]) base = 8, d = p + 1 + (p[1] == 'o' || p[1] == 'O');
    else if (strchr(p, ':')) base = 60;
    unsigned long long v = 0; /* the magnitude: -2^63 fits */
    bool big = false;
    if (base != 60) {
        e = read_digits(d, base, &v, &big);
        r = e != d && !*e;
    } else {
        for (const char *part = d; r; part = e + 1) { /* each part's digits added to v * 60 */
            unsigned long long g = 0;
            e = read_digits(part, 10, &g, &big);
            big |= !push_digit(&v, 60, 0) || __builtin_add_overflow(v, g, &v);
            if (e == part || (*e && *e != ':')) r = 0;
            if (!*e) break;
        }
    }
    if (r && (big || v > (unsigned long long)LLONG_MAX + (t[0] == '-'))) r = -1;
    if (r == 1) *out = t[0] == '-' ? (long long)(0 - v) : (long long)v;
    free(t);
    return r;
}

/* !!bool's text as construct_yaml_bool reads it: yes/no/true/false/on/off,
 * any case; -1 when it is none. */
static int yaml_bool_text(const char *text) {
    static const char *const T[] = {"yes", "true", "on"}, *const F[] = {"no", "false", "off"};
    for (int i = 0; i < 3; i++) {
        if (!strcasecmp(text, T[i])) return 1;
        if (!strcasecmp(text, F[i])) return 0;
    }
    return -1;
}

/* A scalar resolved as a plain one is (resolve_plain), its error located. */
static cv *plain_value(const yaml_event_t *ev, const char *key, char *err, size_t errn) {
    char why[256];
    cv *v = resolve_plain((const char *)ev->data.scalar.value, why, sizeof why);
    if (!v) {
        where_in_yaml(ev, key, err, errn);
        app(err, errn, "%s", why);
    }
    return v;
}

/* A scalar with a tag, as yaml.safe_load builds it: !!str keeps the text
 * ("!!str 2" is the string '2', not the int), !!int / !!float / !!bool must
 * hold what they say (by PyYAML's constructors: `!!float 1e-3`, `!!bool ON`),
 * !!null is None ("!" is no tag here: yaml_node resolves it as plain); any other tag (!!binary,
 * !!timestamp, !!python/..., !custom) is refused, as safe_load refuses (or
 * builds what no config key takes). Ignored, a tag changed the value's type
 * without a word. NULL + why in err. */
static cv *tagged_scalar(const yaml_event_t *ev, const char *tag, const char *key, char *err, size_t errn) {
    const char *text = (const char *)ev->data.scalar.value;
    char shown[128];
    tag_text(tag, shown, sizeof shown);
    if (!strcmp(tag, YAML_TAG_PREFIX "str")) return cv_str(text);
    if (!strcmp(tag, YAML_TAG_PREFIX "null")) return cv_new(CV_NULL);
    if (!strcmp(tag, YAML_TAG_PREFIX "float") || !strcmp(tag, YAML_TAG_PREFIX "bool")) {
        bool fl = tag[strlen(YAML_TAG_PREFIX)] == 'f';
        double f = 0.0;
        int b = fl ? (yaml_float_text(text, &f) ? 1 : -1) : yaml_bool_text(text);
        if (b >= 0) {
            cv *v = cv_new(fl ? CV_FLOAT : CV_BOOL);
            if (v && fl) v->f = f;
            else if (v) v->b = b == 1;
            return v;
        }
        where_in_yaml(ev, key, err, errn);
        app(err, errn, "'%s' is not %s (tagged %s)", text, fl ? "a number" : "a boolean", shown);
        return NULL;
    }
    if (strcmp(tag, YAML_TAG_PREFIX "int")) {
        where_in_yaml(ev, key, err, errn);
        app(err, errn, "the tag %s is not supported (a config holds plain strings, numbers, booleans, lists and "
            "mappings)", shown);
        return NULL;
    }
    long long i;
    int r = yaml_int_text(text, &i);
    if (r == 1) return cv_int(i);
    where_in_yaml(ev, key, err, errn);
    if (r) app(err, errn, "%s is an integer out of range (beyond 64 bits)", text);
    else app(err, errn, "'%s' is not an integer (tagged %s)", text, shown);
    return NULL;
}

/* A collection's tag: none, "!", or its own kind's (!!map, !!seq). */
static bool collection_tag_ok(const yaml_event_t *ev, const char *key, char *err, size_t errn) {
    bool is_map = ev->type == YAML_MAPPING_START_EVENT;
    const char *tag = (const char *)(is_map ? ev->data.mapping_start.tag : ev->data.sequence_start.tag);
    if (!tag || !strcmp(tag, "!") || !strcmp(tag, is_map ? YAML_TAG_PREFIX "map" : YAML_TAG_PREFIX "seq"))
        return true;
    char shown[128];
    tag_text(tag, shown, sizeof shown);
    where_in_yaml(ev, key, err, errn);
    app(err, errn, "the tag %s on a %s is not supported", shown, is_map ? "mapping" : "list");
    return false;
}

static cv *yaml_collection(yaml_parser_t *p, bool is_map, int depth, char *err, size_t errn) {
    if (depth > CFG_MAX_DEPTH) {
        snprintf(err, errn, "line %zu: nested deeper than %d levels", p->mark.line + 1, CFG_MAX_DEPTH);
        return NULL;
    }
    cv *c = cv_new(is_map ? CV_MAP : CV_SEQ);
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(p, &ev)) {
            snprintf(err, errn, "line %zu: %s", p->problem_mark.line + 1, p->problem ? p->problem : "parse error");
            cv_free(c);
            return NULL;
        }
        if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            if (is_map) merge_duplicate_keys(c);
            return c;
        }
        char *key = NULL;
        if (is_map) {
            if (ev.type != YAML_SCALAR_EVENT) {
                snprintf(err, errn, "line %zu: only scalar keys are supported", ev.start_mark.line + 1);
                yaml_event_delete(&ev);
                cv_free(c);
                return NULL;
            }
            /* a key is a name: a NUL in it cut it short ("num_processes\0x" set num_processes) */
            const char *ktag = (const char *)ev.data.scalar.tag;
            bool std_tag = !ktag || !strcmp(ktag, "!") || !strcmp(ktag, YAML_TAG_PREFIX "str"); /* a name: text */
            if (scalar_has_nul(&ev) || !std_tag) {
                char shown[128] = "";
                if (!std_tag) tag_text(ktag, shown, sizeof shown);
                where_in_yaml(&ev, NULL, err, errn);
                app(err, errn, "a key %s%s", std_tag ? "holds a NUL character (\\0)" : "has the tag ", shown);
                if (!std_tag) app(err, errn, ", which is not supported");
                yaml_event_delete(&ev);
                cv_free(c);
                return NULL;
            }
            key = cv_strdup((char *)ev.data.scalar.value);
            yaml_event_delete(&ev);
            if (!yaml_parser_parse(p, &ev)) {
                snprintf(err, errn, "line %zu: %s", p->problem_mark.line + 1, p->problem ? p->problem : "parse error");
                free(key);
                cv_free(c);
                return NULL;
            }
        }
        cv *v = yaml_node(p, &ev, key, depth, err, errn);
        yaml_event_delete(&ev);
        if (!v) {
            free(key);
            cv_free(c);
            return NULL;
        }
        cv_push(c, key, v);
        free(key);
    }
}

/* depth: how many collections enclose this node */
static cv *yaml_node(yaml_parser_t *p, yaml_event_t *ev, const char *key, int depth, char *err, size_t errn) {
    switch (ev->type) {
    case YAML_SCALAR_EVENT: {
        if (scalar_has_nul(ev)) {
            where_in_yaml(ev, key, err, errn);
            app(err, errn, "the value holds a NUL character (\\0)");
            return NULL;
        }
        /* the non-specific "!" resolves as a plain scalar, quoted or not (PyYAML's parser: `! 2` is the int) */
        const char *tag = (const char *)ev->data.scalar.tag;
        bool plain = tag ? !strcmp(tag, "!") : ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        if (tag && !plain) return tagged_scalar(ev, tag, key, err, errn);
        return plain ? plain_value(ev, key, err, errn) : cv_str((char *)ev->data.scalar.value);
    }
    case YAML_MAPPING_START_EVENT:
        return collection_tag_ok(ev, key, err, errn) ? yaml_collection(p, true, depth + 1, err, errn) : NULL;
    case YAML_SEQUENCE_START_EVENT:
        return collection_tag_ok(ev, key, err, errn) ? yaml_collection(p, false, depth + 1, err, errn) : NULL;
    default: snprintf(err, errn, "line %zu: unsupported YAML (anchors/aliases?)", ev->start_mark.line + 1); return NULL;
    }
}

static cv *read_yaml(FILE *f, char *err, size_t errn) {
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    cv *root = NULL;
    int documents = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            snprintf(err, errn, "line %zu: %s", p.problem_mark.line + 1, p.problem ? p.problem : "parse error");
            cv_free(root);
            root = NULL;
            break;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        /* yaml.safe_load refuses a stream of several documents (ComposerError):
         * the keys of a second one must not be dropped without a word. */
        if (t == YAML_DOCUMENT_START_EVENT && ++documents > 1) {
            snprintf(err, errn,
                     "line %zu: expected a single document in the stream, but found another document "
                     "(a line `---`); merge the documents into one",
                     ev.start_mark.line + 1);
            yaml_event_delete(&ev);
            cv_free(root);
            root = NULL;
            break;
        }
        if (!root && (t == YAML_MAPPING_START_EVENT || t == YAML_SEQUENCE_START_EVENT || t == YAML_SCALAR_EVENT)) {
            root = yaml_node(&p, &ev, NULL, 0, err, errn);
            yaml_event_delete(&ev);
            if (!root) break;
            continue;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    if (root && root->t == CV_NULL) {
        cv_free(root);
        root = cv_new(CV_MAP);
    }
    if (!root && !err[0]) root = cv_new(CV_MAP); /* empty file */
    if (root && root->t != CV_MAP) {
        snprintf(err, errn, "the top level is not a mapping of keys to values");
        cv_free(root);
        root = NULL;
    }
    return root;
}

/* ---------------------------------------------------------------- JSON read */

/* NULL when nested deeper than CFG_MAX_DEPTH (jansson's keys are already unique). */
static cv *from_json(json_t *j, int depth) {
    switch (json_typeof(j)) {
    case JSON_OBJECT:
    case JSON_ARRAY: {
        if (depth >= CFG_MAX_DEPTH) return NULL;
        cv *c = cv_new(json_is_object(j) ? CV_MAP : CV_SEQ);
        const char *k;
        size_t i;
        json_t *v;
        bool ok = true;
        if (json_is_object(j)) {
            json_object_foreach(j, k, v) {
                cv *x = ok ? from_json(v, depth + 1) : NULL;
                if (x) cv_push(c, k, x);
                ok = x != NULL;
            }
        } else {
            json_array_foreach(j, i, v) {
                cv *x = ok ? from_json(v, depth + 1) : NULL;
                if (x) cv_push(c, NULL, x);
                ok = x != NULL;
            }
        }
        if (!ok) {
            cv_free(c);
            return NULL;
        }
        return c;
    }
    case JSON_STRING: return cv_str(json_string_value(j));
    case JSON_INTEGER: return cv_int(json_integer_value(j));
    case JSON_REAL: {
        cv *v = cv_new(CV_FLOAT);
        v->f = json_real_value(j);
        return v;
    }
    case JSON_TRUE: return cv_bool(true);
    case JSON_FALSE: return cv_bool(false);
    default: return cv_new(CV_NULL);
    }
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

cv *cfg_read(const char *path, char *err, size_t errn) {
    err[0] = 0;
    /* only a missing file "does not exist"; a FIFO is refused before fopen would wait on it */
    struct stat sb;
    bool stat_ok = stat(path, &sb) == 0;
    if (!stat_ok && errno == ENOENT) {
        snprintf(err, errn, "The passed configuration file `%s` does not exist. Please pass an existing file to "
                 "`accel launch`, or use the default one created through `accel config`.", path);
        return NULL;
    }
    FILE *f = NULL;
    if (stat_ok && !S_ISREG(sb.st_mode))
        snprintf(err, errn, "The passed configuration file `%s` is %s, not a config file.", path,
                 accel__file_kind(sb.st_mode));
    else if (!(f = fopen(path, "rb")))
        snprintf(err, errn, "The passed configuration file `%s` cannot be read: %s", path, strerror(errno));
    if (!f) return NULL;
    cv *root = NULL;
    char inner[512] = "";
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size > CFG_MAX_BYTES) {
        snprintf(inner, sizeof inner, "it is %lld bytes, over the limit of %d (a config is a few hundred)",
                 (long long)st.st_size, CFG_MAX_BYTES);
    } else if (ends_with(path, ".json")) {
        json_error_t je;
        json_t *j = json_loadf(f, 0, &je);
        if (!j) snprintf(inner, sizeof inner, "line %d: %s", je.line, je.text);
        else if (!json_is_object(j)) snprintf(inner, sizeof inner, "the top level is not an object");
        else if (!(root = from_json(j, 0))) snprintf(inner, sizeof inner, "nested deeper than %d levels", CFG_MAX_DEPTH);
        json_decref(j);
    } else {
        root = read_yaml(f, inner, sizeof inner);
    }
    fclose(f);
    if (!root) snprintf(err, errn, "The config file at %s could not be parsed: %s", path, inner);
    return root;
}

/* ---------------------------------------------------------------- validation */

typedef enum kt { KT_STR, KT_BOOL, KT_INT, KT_MAP, KT_SEQ, KT_STR_OR_INT, KT_BOOL_OR_STR } kt;
typedef struct key_spec {
    const char *name;
    kt type;
    const char *const *choices; /* for KT_STR, NULL = any */
} key_spec;

static const char *const COMPUTE_ENVS[] = {"LOCAL_MACHINE", "AMAZON_SAGEMAKER", NULL};
static const char *const DIST_TYPES[] = {"NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                                         "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON", "DEEPSPEED",
                                         "FSDP", "XLA", "MEGATRON_LM", NULL};
static const char *const PRECISIONS[] = {"no", "fp16", "bf16", "fp8", NULL};

/* ClusterConfig (accelerate/commands/config/config_args.py), plus ipex_config of older versions. */
static const key_spec KEYS[] = {
    {"command_file", KT_STR, NULL},          {"commands", KT_SEQ, NULL},
    {"compute_environment", KT_STR, COMPUTE_ENVS}, {"debug", KT_BOOL, NULL},
    {"deepspeed_config", KT_MAP, NULL},      {"distributed_type", KT_STR, DIST_TYPES},
    {"downcast_bf16", KT_BOOL_OR_STR, NULL}, {"dynamo_config", KT_MAP, NULL},
    {"enable_cpu_affinity", KT_BOOL, NULL},  {"fp8_config", KT_MAP, NULL},
    {"fsdp_config", KT_MAP, NULL},           {"gpu_ids", KT_STR_OR_INT, NULL},
    {"ipex_config", KT_MAP, NULL},           {"machine_rank", KT_INT, NULL},
    {"log_with", KT_STR, NULL},              {"project_dir", KT_STR, NULL},
    {"main_process_ip", KT_STR, NULL},       {"main_process_port", KT_INT, NULL},
    {"main_training_function", KT_STR, NULL}, {"megatron_lm_config", KT_MAP, NULL},
    {"mixed_precision", KT_STR, PRECISIONS}, {"mpirun_config", KT_MAP, NULL},
    {"num_machines", KT_INT, NULL},          {"num_processes", KT_INT, NULL},
    {"parallelism_config", KT_MAP, NULL},    {"rdzv_backend", KT_STR, NULL},
    {"same_network", KT_BOOL, NULL},         {"tpu_env", KT_SEQ, NULL},
    {"tpu_name", KT_STR, NULL},              {"tpu_use_cluster", KT_BOOL, NULL},
    {"tpu_use_sudo", KT_BOOL, NULL},         {"tpu_vm", KT_SEQ, NULL},
    {"tpu_zone", KT_STR, NULL},              {"use_cpu", KT_BOOL, NULL},
};
#define NKEYS (sizeof KEYS / sizeof *KEYS)

static const key_spec *spec_of(const char *k) {
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(KEYS[i].name, k)) return &KEYS[i];
    return NULL;
}

static bool type_ok(const key_spec *ks, const cv *v) {
    if (v->t == CV_NULL) return true; /* None: old files write main_process_ip: null */
    switch (ks->type) {
    case KT_STR:
        if (v->t != CV_STR) return false;
        if (!ks->choices) return true;
        /* Accelerate lowercases mixed_precision (BF16 is bf16); the enums are exact */
        for (int i = 0; ks->choices[i]; i++)
            if (!(ks->choices == PRECISIONS ? strcasecmp : strcmp)(ks->choices[i], v->s)) return true;
        return false;
    case KT_BOOL: return v->t == CV_BOOL;
    case KT_INT: return v->t == CV_INT;
    case KT_MAP: return v->t == CV_MAP;
    case KT_SEQ: return v->t == CV_SEQ;
    case KT_STR_OR_INT: return v->t == CV_STR || v->t == CV_INT;
    case KT_BOOL_OR_STR: return v->t == CV_BOOL || v->t == CV_STR;
    }
    return false;
}

bool cfg_normalize(cv *root, const char *path, char *err, size_t errn) {
    bool empty = root->n == 0; /* before the defaults below fill it */
    /* Legacy keys first (they are not in the key set). */
    cv *fp16 = cv_get(root, "fp16");
    if (fp16) {
        bool on = fp16->t == CV_BOOL && fp16->b;
        if (on && !cv_get(root, "mixed_precision")) cv_set(root, "mixed_precision", cv_str("fp16"));
        cv_del(root, "fp16");
    }
    cv *dyn = cv_get(root, "dynamo_backend");
    if (dyn) {
        cv *dc = cv_new(CV_MAP);
        if (dyn->t == CV_STR && strcasecmp(dyn->s, "NO") != 0) cv_set(dc, "dynamo_backend", cv_str(dyn->s));
        cv_set(root, "dynamo_config", dc);
        cv_del(root, "dynamo_backend");
    }
    cv *ce = cv_get(root, "compute_environment");
    if (!ce) cv_set(root, "compute_environment", cv_str("LOCAL_MACHINE"));
    /* Unknown keys: Accelerate's message, sorted Python list. */
    char **unknown = malloc((root->n + 1) * sizeof *unknown);
    size_t nu = 0;
    for (size_t i = 0; i < root->n; i++)
        if (!spec_of(root->keys[i])) unknown[nu++] = root->keys[i];
    if (nu) {
        qsort(unknown, nu, sizeof *unknown, key_cmp);
        char list[1024] = "";
        for (size_t i = 0; i < nu; i++) app(list, sizeof list, "%s'%s'", i ? ", " : "", unknown[i]);
        snprintf(err, errn, "The config file at %s had unknown keys ([%s]), please try upgrading your `accelerate` "
                 "version or fix (and potentially remove) these keys from your config file.", path, list);
        free(unknown);
        return false;
    }
    free(unknown);
    for (size_t i = 0; i < root->n; i++) {
        const key_spec *ks = spec_of(root->keys[i]);
        if (!type_ok(ks, root->items[i])) {
            char val[256] = "";
            cv_repr(root->items[i], false, val, sizeof val);
            const char *want = ks->type == KT_BOOL ? "true or false" : ks->type == KT_INT ? "an integer"
                             : ks->type == KT_MAP ? "a mapping" : ks->type == KT_SEQ ? "a list" : "a string";
            char choices[512] = "";
            if (ks->choices)
                for (int c = 0; ks->choices[c]; c++) app(choices, sizeof choices, "%s%s", c ? ", " : "", ks->choices[c]);
            snprintf(err, errn, "The config file at %s has a bad value for `%s`: %s (expected %s%s%s)", path,
                     ks->name, val, ks->choices ? "one of " : want, choices, "");
            return false;
        }
    }
    /* fp8_config only where it is read (Accelerate's launcher leaves it unread
     * otherwise: an older config's MS-AMP keys beside mixed_precision no run);
     * `accel launch --mixed_precision fp8` over another config checks it then */
    const cv *mp = cv_get(root, "mixed_precision");
    bool fp8 = mp && mp->t == CV_STR && !strcasecmp(mp->s, "fp8");
    if ((fp8 && !cfg_check_fp8_config(cv_get(root, "fp8_config"), path, err, errn)) ||
        !cfg_check_deepspeed_config(cv_get(root, "deepspeed_config"), path, err, errn) ||
        !cfg_check_parallel_config(root, path, err, errn))
        return false;
    ce = cv_get(root, "compute_environment");
    if (ce->t == CV_STR && !strcmp(ce->s, "AMAZON_SAGEMAKER")) {
        snprintf(err, errn, "The config file at %s is for Amazon SageMaker (compute_environment: AMAZON_SAGEMAKER), "
                 "which accel does not support", path);
        return false;
    }
    cv *dt = cv_get(root, "distributed_type");
    if (!dt || dt->t != CV_STR) {
        if (empty) /* Accelerate fails on it with a traceback ('NoneType' object has no attribute 'get') */
            snprintf(err, errn, "The config file at %s is empty: a `distributed_type` must be specified in it.", path);
        else
            snprintf(err, errn, "A `distributed_type` must be specified in the config file (%s).", path);
        return false;
    }
    if (!cv_get(root, "num_processes") || cv_get(root, "num_processes")->t == CV_NULL)
        cv_set(root, "num_processes", cv_int(!strcmp(dt->s, "NO") ? 1 : -1));
    const char *bools[] = {"use_cpu", "debug", "enable_cpu_affinity"};
    for (int i = 0; i < 3; i++)
        if (!cv_get(root, bools[i])) cv_set(root, bools[i], cv_bool(false));
    return true;
}

/* ---------------------------------------------------------------- write */

bool cfg_default_path(char *out, size_t n, char *err, size_t errn) {
    const char *hf = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME"), *home = accel__home_dir();
    if (hf && *hf) snprintf(out, n, "%s/accelerate/default_config.yaml", hf);
    else if (xdg && *xdg) snprintf(out, n, "%s/huggingface/accelerate/default_config.yaml", xdg);
    else if (home) snprintf(out, n, "%s/.cache/huggingface/accelerate/default_config.yaml", home);
    else {
        *out = 0;
        snprintf(err, errn, "no home directory (HOME is unset and user %ld has no passwd entry with one) and neither "
                 "HF_HOME nor XDG_CACHE_HOME is set: the default config file has no place; set one of them or "
                 "pass --config_file", (long)getuid());
        return false;
    }
    return true;
}

/* What to_dict() keeps: no None, no empty dict (all: everything, as yaml.dump
 * of a plain dict). */
static bool kept(const cv *v, bool all) { return v && (all || (v->t != CV_NULL && !(v->t == CV_MAP && v->n == 0))); }

static bool emit(yaml_emitter_t *e, yaml_event_t *ev) { return yaml_emitter_emit(e, ev) != 0; }

static bool emit_scalar(yaml_emitter_t *e, const char *s, yaml_scalar_style_t style) {
    yaml_event_t ev;
    yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1, style);
    return emit(e, &ev);
}

static bool emit_value(yaml_emitter_t *e, const cv *v, bool all) {
    yaml_event_t ev;
    char buf[64];
    switch (v->t) {
    case CV_NULL: return emit_scalar(e, "null", YAML_PLAIN_SCALAR_STYLE);
    case CV_BOOL: return emit_scalar(e, v->b ? "true" : "false", YAML_PLAIN_SCALAR_STYLE);
    case CV_INT: snprintf(buf, sizeof buf, "%lld", v->i); return emit_scalar(e, buf, YAML_PLAIN_SCALAR_STYLE);
    case CV_FLOAT: /* as PyYAML: repr's digits (1.0 stays a float), 1.0e+16, .inf, .nan */
        if (isnan(v->f) || isinf(v->f))
            snprintf(buf, sizeof buf, "%s", isnan(v->f) ? ".nan" : v->f < 0 ? "-.inf" : ".inf");
        else accel__float_repr(buf, sizeof buf, v->f);
        if (strchr(buf, 'e') && !strchr(buf, '.')) { /* 1e+16: 1.0e+16, which YAML 1.1 reads as a float */
            char *x = strchr(buf, 'e'), tail[32];
            snprintf(tail, sizeof tail, "%s", x);
            snprintf(x, sizeof buf - (size_t)(x - buf), ".0%s", tail);
        }
        return emit_scalar(e, buf, YAML_PLAIN_SCALAR_STYLE);
    case CV_STR: {
        /* A string that would read back as something else is quoted, like PyYAML ('no'). */
        cv *r = resolve_plain(v->s, NULL, 0); /* NULL: an int beyond 64 bits, quoted too */
        bool plain = r && r->t == CV_STR;
        cv_free(r);
        return emit_scalar(e, v->s, plain ? YAML_ANY_SCALAR_STYLE : YAML_SINGLE_QUOTED_SCALAR_STYLE);
    }
    case CV_SEQ:
        yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, v->n ? YAML_BLOCK_SEQUENCE_STYLE : YAML_FLOW_SEQUENCE_STYLE);
        if (!emit(e, &ev)) return false;
        for (size_t i = 0; i < v->n; i++)
            if (!emit_value(e, v->items[i], all)) return false;
        yaml_sequence_end_event_initialize(&ev);
        return emit(e, &ev);
    case CV_MAP: {
        /* an empty one (kept with all) as PyYAML writes it: {} */
        yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
                                            v->n ? YAML_BLOCK_MAPPING_STYLE : YAML_FLOW_MAPPING_STYLE);
        if (!emit(e, &ev)) return false;
        key_at *k = sorted_entries(v);
        bool ok = true;
        for (size_t i = 0; ok && i < v->n; i++) {
            const cv *x = v->items[k[i].at];
            if (!kept(x, all)) continue;
            ok = emit_scalar(e, k[i].key, YAML_ANY_SCALAR_STYLE) && emit_value(e, x, all);
        }
        free(k);
        if (!ok) return false;
        yaml_mapping_end_event_initialize(&ev);
        return emit(e, &ev);
    }
    }
    return false;
}

static json_t *to_json(const cv *v, bool all) {
    switch (v->t) {
    case CV_NULL: return json_null();
    case CV_BOOL: return json_boolean(v->b);
    case CV_INT: return json_integer(v->i);
    case CV_FLOAT: return json_real(v->f);
    case CV_STR: return json_string(v->s);
    case CV_SEQ: {
        json_t *a = json_array();
        for (size_t i = 0; i < v->n; i++) json_array_append_new(a, to_json(v->items[i], all));
        return a;
    }
    case CV_MAP: {
        json_t *o = json_object();
        for (size_t i = 0; i < v->n; i++)
            if (kept(v->items[i], all)) json_object_set_new(o, v->keys[i], to_json(v->items[i], all));
        return o;
    }
    }
    return json_null();
}

bool cli_mkdirs(const char *dir) {
    char d[4096];
    if (snprintf(d, sizeof d, "%s", dir) >= (int)sizeof d) {
        errno = ENAMETOOLONG;
        return false;
    }
    for (char *p = d + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(d, 0755) != 0 && errno != EEXIST) return false;
            *p = '/';
        }
    struct stat sb;
    if (mkdir(d, 0755) != 0 && errno != EEXIST) return false;
    if (stat(d, &sb) != 0) return false;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

/* The directories above a file, made where missing (as Python's open()
 * would not: its error comes when the file is opened). */
static void mkdir_p(const char *path) {
    char d[4096];
    snprintf(d, sizeof d, "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash || slash == d) return;
    *slash = 0;
    cli_mkdirs(d); /* a failure shows when the file is opened */
}

bool cli_is_utf8(const char *s) { return accel__is_utf8(s); }

/* Whether a key or string under v (named name) is not UTF-8, which YAML and
 * JSON cannot hold (libyaml's emitter failed with errno 0, jansson dropped
 * the entry): then what it is into where. */
static bool find_non_utf8(const cv *v, const char *name, char *where, size_t n) {
    if (v->t == CV_STR && !cli_is_utf8(v->s)) {
        snprintf(where, n, "the value of %s", name);
        return true;
    }
    for (size_t i = 0; (v->t == CV_SEQ || v->t == CV_MAP) && i < v->n; i++) {
        const char *k = v->t == CV_MAP ? v->keys[i] : "[]";
        if (!cli_is_utf8(k)) {
            snprintf(where, n, "a key under %s", *name ? name : "the top level");
            return true;
        }
        char sub[512];
        snprintf(sub, sizeof sub, "%s%s%s", name, *name && v->t == CV_MAP ? "." : "", k);
        if (find_non_utf8(v->items[i], sub, where, n)) return true;
    }
    return false;
}

/* The file a write of path lands on (core/afile.h: path, or where its
 * symbolic links lead, so that a linked default_config.yaml kept in a
 * dotfiles repository stays a link). False + err on a loop of links or a
 * name too long. */
static bool write_target(const char *path, char *out, size_t n, char *err, size_t errn) {
    if (accel__afile_target(path, out, n) == ACCEL_OK) return true;
    snprintf(err, errn, "%s", accel_last_error());
    return false;
}

/* The file a write would replace (through links) is a regular file or none:
 * renaming over a directory fails only after the work, and over a FIFO or a
 * device (/dev/null) it would replace the node itself. */
static bool target_is_file_or_none(const char *path, const char *target, char *err, size_t errn) {
    struct stat st;
    if (stat(target, &st) != 0 || S_ISREG(st.st_mode)) return true;
    snprintf(err, errn, "The passed configuration file `%s` is %s, not a config file.", path,
             accel__file_kind(st.st_mode));
    return false;
}

bool cfg_check_write_target(const char *path, char *err, size_t errn) {
    char target[4096];
    return write_target(path, target, sizeof target, err, errn) && target_is_file_or_none(path, target, err, errn);
}

static bool write_config(const char *path, const cv *root, bool all, char *err, size_t errn) {
    char bad[512], target[4096];
    if (find_non_utf8(root, "", bad, sizeof bad)) {
        snprintf(err, errn, "cannot write %s: %s is not UTF-8 text (config files hold UTF-8 only)", path, bad);
        return false;
    }
    if (!write_target(path, target, sizeof target, err, errn) || !target_is_file_or_none(path, target, err, errn))
        return false;
    mkdir_p(target);
    /* through the atomic writer (core/afile.h): "<target>.tmp", never a user's file of that name */
    accel__afile af;
    if (accel__afile_open(&af, target) != ACCEL_OK) {
        snprintf(err, errn, "%s", accel_last_error());
        return false;
    }
    /* (the writer keeps a replaced file's permissions: a 0600 config stays private) */
    int fd = dup(af.fd); /* the stream's own descriptor: af's stays for the commit */
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        snprintf(err, errn, "cannot write %s: %s", af.tmp, strerror(errno));
        if (fd >= 0) close(fd);
        accel__afile_abort(&af);
        return false;
    }
    bool ok;
    const char *problem = NULL; /* the encoder's reason, where errno has none */
    if (ends_with(path, ".json")) {
        json_t *j = to_json(root, all);
        ok = json_dumpf(j, f, JSON_INDENT(2) | JSON_SORT_KEYS) == 0 && fputc('\n', f) != EOF;
        json_decref(j);
    } else {
        yaml_emitter_t e;
        yaml_event_t ev;
        yaml_emitter_initialize(&e);
        yaml_emitter_set_output_file(&e, f);
        yaml_emitter_set_unicode(&e, 0); /* non-ASCII escaped ("\xE9"), as PyYAML writes without allow_unicode */
        yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
        ok = emit(&e, &ev);
        yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
        ok = ok && emit(&e, &ev) && emit_value(&e, root, all);
        yaml_document_end_event_initialize(&ev, 1);
        ok = ok && emit(&e, &ev);
        yaml_stream_end_event_initialize(&ev);
        ok = ok && emit(&e, &ev);
        if (!ok && e.error != YAML_WRITER_ERROR) problem = e.problem;
        yaml_emitter_delete(&e);
    }
    ok = (fclose(f) == 0) && ok; /* its own descriptor; af.fd stays */
    if (!ok) {
        snprintf(err, errn, "cannot write %s: %s", path, problem ? problem : strerror(errno));
        accel__afile_abort(&af);
        return false;
    }
    if (accel__afile_commit(&af) != ACCEL_OK) {
        snprintf(err, errn, "cannot write %s: %s", path, accel_last_error());
        return false;
    }
    return true;
}

bool cfg_write(const char *path, const cv *root, char *err, size_t errn) {
    return write_config(path, root, false, err, errn);
}

bool cfg_write_as_is(const char *path, const cv *root, char *err, size_t errn) {
    return write_config(path, root, true, err, errn);
}
