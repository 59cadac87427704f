/* The chat-template interpreter (include/accel/tokenizer.h, accel_chat_template_*):
 * the subset of Jinja2 that Hugging Face chat templates use, run as transformers
 * runs them (jinja2's ImmutableSandboxedEnvironment with trim_blocks and
 * lstrip_blocks, the loopcontrols extension, raise_exception, strftime_now and its
 * tojson). Three stages:
 *     jinja_parse.c  source -> tokens (whitespace control applied) -> syntax tree
 *     jinja_value.c  the values: Python's str()/repr() of them, json.dumps, ==, <
 *     jinja_eval.c   the tree run over a context of values into text
 * Every value of a render lives in one arena freed with it; the tree lives in the
 * template's own arena. Anything outside the subset is refused naming the construct
 * and its line and column, never approximated. */
#ifndef ACCEL_JINJA_INTERNAL_H
#define ACCEL_JINJA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "accel/core.h"

/* ------------------------------------------------------------ values (jinja_value.c) */

typedef enum {
    JV_UNDEF, /* a name or key that is not there: "" when printed, false, empty */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_TUPLE,
    JV_GEN,  /* a generator (what select, reject, selectattr, rejectattr, map, items make):
              * iterable, always true, no len(), not printable */
    JV_VIEW, /* dict.keys(), values(), items(): a sized iterable printed as dict_keys([...]) */
    JV_DICT,
    JV_NS,     /* namespace(): a dict whose attributes `set ns.x = ...` changes */
    JV_LOOP,   /* a for loop's `loop` */
    JV_MACRO,
    JV_FUNC,   /* a global function (range, namespace, dict, raise_exception, strftime_now) */
    JV_METHOD, /* a method bound to its value (s.strip, d.items, loop.cycle) */
} jv_kind;

typedef struct jv {
    jv_kind k;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p; /* UTF-8, not NUL-terminated; UNDEF: the name looked up, for messages */
            size_t n;
        } s;
        struct jlist *l;    /* LIST, TUPLE, GEN, VIEW */
        struct jdict *d;    /* DICT, NS */
        struct jloop *loop; /* LOOP */
        struct jmacro *mac; /* MACRO */
        int fn;             /* FUNC */
        struct jmethod *meth;
    };
} jv;

typedef struct jlist {
    size_t n;
    jv *v;
    const char *view; /* VIEW: "dict_keys", "dict_values" or "dict_items" */
} jlist;

/* Insertion-ordered (Python's dict); looked up by ==, linearly: template dicts are small. */
typedef struct jdict {
    size_t n, cap;
    jv *key, *val;
} jdict;

typedef struct jloop {
    const jlist *items; /* what is iterated, after the loop's `if` */
    size_t i;           /* index0 */
} jloop;

/* A macro: its definition and the scope it was defined in (jinja_eval.c's). */
typedef struct jmacro {
    const struct jnode *def;
    struct jscope *env;
} jmacro;

typedef struct jmethod {
    jv self;
    const char *name;
} jmethod;

/* The allocator and limits of one render (or of the parse, for constants). */
typedef struct jctx {
    accel_arena *arena;
    size_t mem_limit; /* bytes the arena may hold before the render is refused */
} jctx;

void *jv_alloc(jctx *c, size_t bytes); /* NULL + ACCEL_ERR_OOM (naming the limit when over it) */
jv jv_str(const char *p, size_t n);     /* not copied */
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_bool(bool b);
jv jv_none(void);
jv jv_undef(const char *name, size_t n);
bool jv_strdup(jctx *c, const char *p, size_t n, jv *out);
jlist *jv_list_new(jctx *c, size_t n);
jdict *jv_dict_new(jctx *c);
bool jv_dict_set(jctx *c, jdict *d, jv key, jv val); /* replaces */
/* Adds key, known not to be in d (a parsed JSON object's keys are unique): no search. */
bool jv_dict_append(jctx *c, jdict *d, jv key, jv val);
const jv *jv_dict_get(const jdict *d, jv key);      /* NULL: absent */
const jv *jv_dict_get_str(const jdict *d, const char *key);

const char *jv_type_name(jv v); /* Python's: "str", "dict", "NoneType", ... */
bool jv_truthy(jv v);
/* Values nest (a list in a list ...) as deep as a template makes them; what recurses
 * over them (printing, ==, <, tojson) stops past this many levels. */
#define JV_MAX_NEST 200
/* Python ==: 1 == 1.0 == True, lists and dicts by value. 1 equal, 0 not, -1 nested
 * past JV_MAX_NEST (jinja2's RecursionError; no error set: the caller names it). */
int jv_equal(jv a, jv b);
/* Python's <: numbers, strings (by code point), lists and tuples lexicographically;
 * *ok false for other types (TypeError), or JV_TOO_DEEP returned with *ok false when
 * nested past JV_MAX_NEST. */
#define JV_TOO_DEEP 2
int jv_compare(jv a, jv b, bool *ok);
bool jv_is_number(jv v); /* bool, int or float, as Python's numbers */
double jv_as_double(jv v);

/* A growable string in the render's arena. */
typedef struct jbuf {
    jctx *c;
    char *p;
    size_t n, cap;
} jbuf;
bool jbuf_put(jbuf *b, const char *s, size_t n);
bool jbuf_puts(jbuf *b, const char *s);
jv jbuf_str(const jbuf *b); /* the text so far as a string value (not copied) */

/* Python's str(v) (a list's items by repr) and repr(v). UNDEF prints as nothing. */
bool jv_to_str(jbuf *b, jv v);
bool jv_repr(jbuf *b, jv v);
/* json.dumps(v, ensure_ascii, indent (NULL: None; else its text per level),
 * separators (NULL: the default for indent), sort_keys); false + error for a
 * value JSON cannot hold (undefined, a namespace, a macro, ...). */
typedef struct jjson_opts {
    bool ensure_ascii, sort_keys;
    const char *indent; /* NULL: single line */
    size_t indent_n;
    const char *item_sep, *key_sep; /* NULL: ", " / ": " (or "," with an indent) */
    size_t item_sep_n, key_sep_n;
} jjson_opts;
bool jv_to_json(jbuf *b, jv v, const jjson_opts *o, int depth);

/* UTF-8 helpers over Python's code-point strings. */
size_t jv_utf8_len(const char *p, size_t n);                     /* code points */
size_t jv_utf8_offset(const char *p, size_t n, size_t cps);      /* byte offset of code point cps (n when past) */
bool jv_py_isspace(uint32_t cp);                                  /* str.isspace() */
/* Appends Python's p.upper() (mode 'U'), p.lower() ('L') or p.capitalize() ('C'): full
 * case mappings ('ß' -> 'SS'), lower()'s final sigma (jinja_case.c). Bytes that are not
 * UTF-8 are taken as the code point of their value. */
bool jv_recase(jbuf *b, const char *p, size_t n, int mode);
/* Python's p.isupper() (upper) or p.islower(): a cased code point and none of the other
 * case or titlecase. */
bool jv_py_iscase(const char *p, size_t n, bool upper);

/* ------------------------------------------------------------ syntax tree (jinja_parse.c) */

typedef enum {
    /* expressions */
    JN_CONST,
    JN_NAME,
    JN_ATTR,   /* a.name */
    JN_ITEM,   /* a[b] */
    JN_SLICE,  /* a[b:c:d], each of b c d may be NULL */
    JN_CALL,   /* a(kid...), the last nkw kids keyword arguments named kw[] */
    JN_FILTER, /* a | name(kid...) */
    JN_TEST,   /* a is [not] name(kid...) */
    JN_UNARY,  /* op '-' '+' or 'n' (not) applied to a */
    JN_BIN,    /* a op b: + - * / F(//) % P(**) ~ */
    JN_CMP,    /* a then kid[i] each with cmp[i] */
    JN_AND,
    JN_OR,
    JN_COND,   /* b if a else c (c NULL: undefined) */
    JN_LIST,
    JN_TUPLE,
    JN_DICT,   /* kid: key, value, key, value ... */
    /* statements */
    JN_BODY,   /* kid: the statements in order */
    JN_TEXT,   /* val: the text */
    JN_OUT,    /* {{ a }} */
    JN_IF,     /* kid: cond, body, cond, body ...; a: the else body or NULL */
    JN_FOR,    /* for a in b [if c]: d [else e]  (a: NAME or TUPLE of NAMEs) */
    JN_SET,    /* set a = b (a: NAME, TUPLE of NAMEs or ATTR of a NAME) */
    JN_SETBLOCK, /* set a: body d */
    JN_MACRO,  /* name(kid: NAME params, each default in its a): body d */
    JN_BREAK,
    JN_CONTINUE,
    JN_GENERATION, /* transformers' {% generation %}: body d, rendered as is */
} jn_kind;

enum { JCMP_EQ, JCMP_NE, JCMP_LT, JCMP_LE, JCMP_GT, JCMP_GE, JCMP_IN, JCMP_NOTIN };

typedef struct jnode {
    jn_kind k;
    int op;
    bool neg; /* TEST: is not */
    size_t pos; /* byte offset in the (newline-normalized) source */
    int height; /* expressions: 1 + the tallest child's (evaluation recurses that deep) */
    jv val;
    const char *name;
    size_t name_n;
    struct jnode *a, *b, *c, *d, *e;
    struct jnode **kid;
    size_t nkid;
    int *cmp;
    const char **kw;
    size_t *kw_n;
    size_t nkw;
} jnode;

typedef struct jtemplate {
    accel_arena *arena; /* the tree and the normalized source */
    const char *src;
    size_t n;
    jnode *root; /* JN_BODY */
} jtemplate;

/* NULL + ACCEL_ERR_FORMAT naming the line, column and what is wrong (or
 * ACCEL_ERR_UNSUPPORTED naming a construct outside the subset). */
jtemplate *jinja_parse(const char *src, size_t n);
void jinja_free(jtemplate *t);
/* "line L, column C" of byte offset pos into buf. */
void jinja_where(const jtemplate *t, size_t pos, char *buf, size_t cap);

/* ------------------------------------------------------------ rendering (jinja_eval.c) */

#define JINJA_MAX_OUTPUT ((size_t)64 << 20)   /* bytes of rendered text */
#define JINJA_MAX_MEMORY ((size_t)512 << 20)  /* bytes of values one render may make */
#define JINJA_MAX_STEPS 10000000              /* expressions and loop turns one render may run */
/* String operations that scan (in, find, count, replace, split, ==, length,
 * indexing, slicing) cost a step per this many bytes scanned besides: 640 MB
 * scanned in all at most. */
#define JINJA_BYTES_PER_STEP 64
#define JINJA_MAX_DEPTH 100                   /* nested macro calls (Python's own limit is ~1000) */
/* Nested evaluation frames (an expression's eval, a statement's, through macro
 * calls too): eval's frame is 1.3 KiB in a RelWithDebInfo x86-64 build (gcc
 * -fstack-usage), about 2.4 KiB a level with the calls between, so 500 levels take
 * ~1.2 MiB and fit a 2 MiB thread stack. A template alone nests at most 200
 * statements around an expression 200 deep (the parser's limits). */
#define JINJA_MAX_NEST_EVAL 500

/* Whether name is a filter (test false) or a test (test true) the interpreter runs. */
bool jinja_known(const char *name, size_t n, bool test);

/* Renders t over the variables vars (name -> value, made in c's arena) into
 * *out (malloc'd, NUL-terminated) and *len. */
accel_status jinja_render(const jtemplate *t, jctx *c, const jdict *vars, char **out, size_t *len);

#endif /* ACCEL_JINJA_INTERNAL_H */
