/* Chat templates: source -> tokens -> syntax tree (jinja_internal.h).
 *
 * The lexer is jinja2's with transformers' settings: newlines (\r\n, \r) read as
 * \n and one trailing newline dropped (keep_trailing_newline off); `{%-`/`{{-`/`{#-`
 * strip all whitespace before the tag and `-%}`/`-}}`/`-#}` all after it;
 * trim_blocks drops the one newline after `%}` and `#}`; lstrip_blocks drops the
 * spaces and tabs between a line's start and `{%`/`{#` (not `{{`, and not with
 * `{%+`); inside a tag, an end marker counts only outside brackets. The parser is
 * jinja2's precedence: `x if c else y`, or, and, not, comparisons and `in`,
 * + -, ~, * / // %, **, unary - +, then postfix . [] () and the filters and tests
 * (`a|f`, `a is t`), which bind tighter than every operator but those postfixes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"
#include "tok_internal.h"

typedef enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF } ttype;

typedef struct tok {
    ttype t;
    size_t pos;
    const char *p; /* TEXT, NAME, OP: into the source; STRING: the decoded text */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    jtemplate *t;
    jctx c; /* the template's arena, for nodes and decoded strings */
    tok *tk;
    size_t ntk, cap, at;
    int depth;
    int loops; /* for bodies around the statement being parsed (a macro body starts again at 0) */
    bool failed;
} parser;

#define MAX_NEST 200 /* nested expressions and blocks: the parser recurses per level */

void jinja_where(const jtemplate *t, size_t pos, char *buf, size_t cap) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < t->n; i++) {
        if (t->src[i] == '\n') line++, col = 1;
        else if (((unsigned char)t->src[i] & 0xC0) != 0x80) col++;
    }
    snprintf(buf, cap, "line %zu, column %zu", line, col);
}

static void *fail_at(parser *p, accel_status st, size_t pos, const char *fmt, const char *what, size_t what_n) {
    if (p->failed) return NULL;
    char where[64], msg[320];
    jinja_where(p->t, pos, where, sizeof where);
    snprintf(msg, sizeof msg, fmt, (int)(what_n > 200 ? 200 : what_n), what ? what : "");
    accel_set_error(st, "chat template: %s: %s", where, msg);
    p->failed = true;
    return NULL;
}

static bool push(parser *p, tok t) {
    if (p->ntk == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 256;
        tok *n = realloc(p->tk, cap * sizeof *n);
        if (!n) {
            accel_set_error(ACCEL_ERR_OOM, "chat template: out of memory lexing");
            p->failed = true;
            return false;
        }
        p->tk = n, p->cap = cap;
    }
    p->tk[p->ntk++] = t;
    return true;
}

/* ------------------------------------------------------------ lexer */

static bool is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* The first byte at or after i of s[0..n) that does not start whitespace (str.isspace). */
static size_t skip_space(const char *s, size_t n, size_t i) {
    while (i < n) {
        uint32_t cp;
        size_t l = tok_utf8_next(s + i, n - i, &cp);
        if (!l || !jv_py_isspace(cp)) break;
        i += l;
    }
    return i;
}

/* The code point before byte i of s (whose start is 0). */
static size_t prev_cp(const char *s, size_t i, uint32_t *cp) {
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
    if (!tok_utf8_next(s + j, i - j, cp)) *cp = (unsigned char)s[j];
    return j;
}

/* A string literal's body as Python's unicode-escape reads it. */
static bool lex_string(parser *p, size_t start, size_t *at) {
    const char *s = p->t->src;
    size_t n = p->t->n, i = start + 1;
    char q = s[start];
    tok_buf b = {0};
    while (i < n && s[i] != q) {
        if (s[i] != '\\') {
            if (!tok_buf_put(&b, s + i, 1)) goto oom;
            i++;
            continue;
        }
        if (i + 1 >= n) break;
        char e = s[i + 1];
        uint32_t cp = 0;
        int hex = 0;
        const char *simple = NULL;
        switch (e) {
        case 'n': simple = "\n"; break;
        case 't': simple = "\t"; break;
        case 'r': simple = "\r"; break;
        case '\\': simple = "\\"; break;
        case '\'': simple = "'"; break;
        case '"': simple = "\""; break;
        case 'a': simple = "\a"; break;
        case 'b': simple = "\b"; break;
        case 'f': simple = "\f"; break;
        case 'v': simple = "\v"; break;
        case '\n': simple = ""; break;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        case 'N':
            free(b.p);
            return fail_at(p, ACCEL_ERR_UNSUPPORTED, i, "the \\N{...} escape is not implemented%.*s", "", 0), false;
        default: break;
        }
        if (simple) {
            if (!tok_buf_put(&b, simple, strlen(simple))) goto oom;
            i += 2;
        } else if (hex) {
            size_t j = i + 2;
            for (int k = 0; k < hex; k++, j++) {
                char h = j < n ? s[j] : 0;
                int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (d < 0) {
                    free(b.p);
                    return fail_at(p, ACCEL_ERR_FORMAT, i, "a truncated \\x, \\u or \\U escape in a string%.*s", "", 0), false;
                }
                cp = cp * 16 + (uint32_t)d;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                free(b.p);
                return fail_at(p, ACCEL_ERR_FORMAT, i, "an escape naming no Unicode character (a surrogate or past U+10FFFF)%.*s", "", 0), false;
            }
            if (!tok_buf_putc(&b, cp)) goto oom;
            i = j;
        } else if (e >= '0' && e <= '7') {
            size_t j = i + 1;
            for (int k = 0; k < 3 && j < n && s[j] >= '0' && s[j] <= '7'; k++, j++) cp = cp * 8 + (uint32_t)(s[j] - '0');
            if (!tok_buf_putc(&b, cp)) goto oom;
            i = j;
        } else {
            /* Python keeps an unknown escape as written */
            if (!tok_buf_put(&b, s + i, 2)) goto oom;
            i += 2;
        }
    }
    if (i >= n) {
        free(b.p);
        return fail_at(p, ACCEL_ERR_FORMAT, start, "a string that is never closed%.*s", "", 0), false;
    }
    jv v;
    if (!jv_strdup(&p->c, b.p ? b.p : "", b.n, &v)) {
        free(b.p);
        p->failed = true;
        return false;
    }
    free(b.p);
    *at = i + 1;
    return push(p, (tok){.t = T_STRING, .pos = start, .p = v.s.p, .n = v.s.n});
oom:
    free(b.p);
    accel_set_error(ACCEL_ERR_OOM, "chat template: out of memory lexing");
    p->failed = true;
    return false;
}

/* A number at s[i]: jinja's integer (with _ separators, 0b 0o 0x) or float. */
static bool lex_number(parser *p, size_t *at) {
    const char *s = p->t->src;
    size_t n = p->t->n, i = *at, st = i;
    char buf[80];
    size_t k = 0;
    bool isf = false;
    int base = 10;
    if (s[i] == '0' && i + 1 < n && strchr("bBoOxX", s[i + 1])) {
        base = s[i + 1] == 'b' || s[i + 1] == 'B' ? 2 : s[i + 1] == 'o' || s[i + 1] == 'O' ? 8 : 16;
        i += 2;
    }
    for (; i < n && k < sizeof buf - 2; i++) {
        char ch = s[i];
        if (ch == '_') continue;
        if (is_digit(ch) || (base == 16 && strchr("abcdefABCDEF", ch))) buf[k++] = ch;
        else if (base == 10 && ch == '.' && !isf && i + 1 < n && is_digit(s[i + 1])) buf[k++] = ch, isf = true;
        else if (base == 10 && (ch == 'e' || ch == 'E') && i + 1 < n &&
                 (is_digit(s[i + 1]) || ((s[i + 1] == '+' || s[i + 1] == '-') && i + 2 < n && is_digit(s[i + 2])))) {
            buf[k++] = ch, isf = true;
            if (s[i + 1] == '+' || s[i + 1] == '-') buf[k++] = s[++i];
        } else
            break;
    }
    buf[k] = 0;
    *at = i;
    if (isf) return push(p, (tok){.t = T_FLOAT, .pos = st, .f = strtod(buf, NULL)});
    errno = 0;
    long long v = strtoll(buf, NULL, base);
    if (errno || !k) return fail_at(p, ACCEL_ERR_UNSUPPORTED, st, "an integer literal outside 64 bits (or empty) is not implemented%.*s", "", 0), false;
    return push(p, (tok){.t = T_INT, .pos = st, .i = v});
}

static const char *const OPS2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

/* Tokens of one tag from *at up to its end marker (`}}` or `%}`, outside brackets). */
static bool lex_tag(parser *p, size_t *at, bool block, bool *line_starting) {
    const char *s = p->t->src;
    size_t n = p->t->n, i = *at;
    int bal = 0;
    size_t open_pos = i;
    for (;;) {
        i = skip_space(s, n, i);
        if (i >= n) return fail_at(p, ACCEL_ERR_FORMAT, open_pos, "a tag that is never closed (expected '%.*s')", block ? "%}" : "}}", 2), false;
        char end = block ? '%' : '}';
        if (!bal) {
            bool minus = s[i] == '-' && i + 2 < n && s[i + 1] == end && s[i + 2] == '}';
            bool plus = block && s[i] == '+' && i + 2 < n && s[i + 1] == end && s[i + 2] == '}';
            if (minus || plus || (s[i] == end && i + 1 < n && s[i + 1] == '}')) {
                size_t pos = i;
                i += minus || plus ? 3 : 2;
                if (minus) i = skip_space(s, n, i);
                else if (block && !plus && i < n && s[i] == '\n')
                    i++; /* trim_blocks */
                *line_starting = i > 0 && s[i - 1] == '\n';
                *at = i;
                return push(p, (tok){.t = block ? T_BLOCK_END : T_VAR_END, .pos = pos});
            }
        }
        char ch = s[i];
        if (is_digit(ch)) {
            if (!lex_number(p, &i)) return false;
        } else if (is_name_start(ch)) {
            size_t st = i;
            while (i < n && (is_name_start(s[i]) || is_digit(s[i]))) i++;
            if (!push(p, (tok){.t = T_NAME, .pos = st, .p = s + st, .n = i - st})) return false;
        } else if (ch == '\'' || ch == '"') {
            if (!lex_string(p, i, &i)) return false;
        } else {
            size_t l = 0;
            for (size_t k = 0; k < sizeof OPS2 / sizeof *OPS2; k++)
                if (i + 1 < n && s[i] == OPS2[k][0] && s[i + 1] == OPS2[k][1]) l = 2;
            if (!l && strchr(OPS1, ch) && ch) l = 1;
            if (!l) {
                size_t cl = tok_utf8_next(s + i, n - i, &(uint32_t){0});
                return fail_at(p, ACCEL_ERR_FORMAT, i, "unexpected character '%.*s'", s + i, cl ? cl : 1), false;
            }
            if (ch == '(' || ch == '[' || ch == '{') bal++;
            if ((ch == ')' || ch == ']' || ch == '}') && bal > 0) bal--;
            if (!push(p, (tok){.t = T_OP, .pos = i, .p = s + i, .n = l})) return false;
            i += l;
        }
    }
}

static bool lex(parser *p) {
    const char *s = p->t->src;
    size_t n = p->t->n, at = 0;
    bool line_starting = true;
    while (at <= n) {
        /* the next tag opener */
        size_t i = at;
        const char *hit = NULL;
        while (i + 1 < n) {
            if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
                hit = s + i;
                break;
            }
            i++;
        }
        size_t text_end = hit ? i : n;
        char kind = hit ? s[i + 1] : 0;
        char sign = hit && i + 2 < n && (s[i + 2] == '-' || s[i + 2] == '+') ? s[i + 2] : 0;
        size_t keep = text_end;
        if (hit && sign == '-') {
            while (keep > at) {
                uint32_t cp;
                size_t j = prev_cp(s, keep, &cp);
                if (j < at || !jv_py_isspace(cp)) break;
                keep = j;
            }
        } else if (hit && sign != '+' && kind != '{') {
            /* lstrip_blocks: only whitespace between the line's start and the tag */
            size_t l_pos = at;
            for (size_t j = text_end; j > at; j--)
                if (s[j - 1] == '\n') {
                    l_pos = j;
                    break;
                }
            if ((l_pos > at || (l_pos == at && line_starting)) && l_pos < text_end) {
                bool all = true;
                for (size_t j = l_pos; j < text_end && all;) {
                    uint32_t cp;
                    size_t l = tok_utf8_next(s + j, text_end - j, &cp);
                    all = l && jv_py_isspace(cp);
                    j += l ? l : 1;
                }
                if (all) keep = l_pos;
            }
        }
        if (keep > at && !push(p, (tok){.t = T_TEXT, .pos = at, .p = s + at, .n = keep - at})) return false;
        if (!hit) break;
        size_t tag_pos = i;
        at = i + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t j = at; j + 1 < n; j++)
                if (s[j] == '#' && s[j + 1] == '}') {
                    e = s + j;
                    break;
                }
            if (!e) return fail_at(p, ACCEL_ERR_FORMAT, tag_pos, "a comment that is never closed (expected '#}')%.*s", "", 0), false;
            size_t j = (size_t)(e - s);
            char esign = j > at && (s[j - 1] == '-' || s[j - 1] == '+') ? s[j - 1] : 0;
            at = j + 2;
            if (esign == '-') at = skip_space(s, n, at);
            else if (esign != '+' && at < n && s[at] == '\n')
                at++;
            line_starting = at > 0 && s[at - 1] == '\n';
            continue;
        }
        if (!push(p, (tok){.t = kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, .pos = tag_pos})) return false;
        if (!lex_tag(p, &at, kind == '%', &line_starting)) return false;
    }
    return push(p, (tok){.t = T_EOF, .pos = n});
}

/* ------------------------------------------------------------ parser */

static tok *cur(parser *p) { return &p->tk[p->at]; }
static tok *peek(parser *p, size_t k) { return &p->tk[p->at + k < p->ntk ? p->at + k : p->ntk - 1]; }
static bool is_op(const tok *t, const char *op) { return t->t == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n); }
static bool is_name(const tok *t, const char *nm) { return t->t == T_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n); }

static jnode *node(parser *p, jn_kind k, size_t pos) {
    jnode *x = jv_alloc(&p->c, sizeof *x);
    if (!x) {
        p->failed = true;
        return NULL;
    }
    *x = (jnode){.k = k, .pos = pos};
    return x;
}

/* x complete: its height (its tallest child's + 1) set, and x refused past
 * MAX_NEST. enter() counts only the parser's own recursion; chains it builds in a
 * loop (a + b + c, x|f|g, a[0][0], a and b and c) grow left-deep trees that
 * evaluation recurses into once per link, so every expression node is measured. */
static jnode *done(parser *p, jnode *x) {
    if (!x) return NULL;
    int h = 0;
    const jnode *ch[] = {x->a, x->b, x->c, x->d, x->e};
    for (size_t i = 0; i < sizeof ch / sizeof *ch; i++)
        if (ch[i] && ch[i]->height > h) h = ch[i]->height;
    for (size_t i = 0; i < x->nkid; i++)
        if (x->kid[i] && x->kid[i]->height > h) h = x->kid[i]->height;
    x->height = h + 1;
    if (x->height > MAX_NEST) return fail_at(p, ACCEL_ERR_UNSUPPORTED, x->pos, "nested more than 200 levels deep%.*s", "", 0);
    return x;
}

/* Appends to a node's kid array (a realloc'd array kept in the arena by copying). */
typedef struct kids {
    jnode **v;
    size_t n, cap;
} kids;

static bool kids_add(parser *p, kids *k, jnode *x) {
    if (!x) return false;
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 8;
        jnode **v = jv_alloc(&p->c, cap * sizeof *v);
        if (!v) {
            p->failed = true;
            return false;
        }
        if (k->n) memcpy(v, k->v, k->n * sizeof *v);
        k->v = v, k->cap = cap;
    }
    k->v[k->n++] = x;
    return true;
}

static void *expect_fail(parser *p, const char *what) {
    tok *t = cur(p);
    const char *got = t->t == T_EOF ? "the end of the template" : t->t == T_BLOCK_END ? "the end of the tag" :
                      t->t == T_VAR_END ? "'}}'" : t->t == T_STRING ? "a string" : t->t == T_INT || t->t == T_FLOAT ? "a number" : NULL;
    char m[200];
    /* the message is made here and passed as text: `what` may hold '%' ("'%}'") */
    if (got) snprintf(m, sizeof m, "expected %s, got %s", what, got);
    else snprintf(m, sizeof m, "expected %s, got '%.*s'", what, (int)(t->n > 40 ? 40 : t->n), t->p);
    return fail_at(p, ACCEL_ERR_FORMAT, t->pos, "%.*s", m, strlen(m));
}

static bool expect_op(parser *p, const char *op) {
    if (is_op(cur(p), op)) {
        p->at++;
        return true;
    }
    char w[16];
    snprintf(w, sizeof w, "'%s'", op);
    expect_fail(p, w);
    return false;
}

static jnode *parse_expr(parser *p);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p);
static jnode *parse_postfix(parser *p, jnode *x);
static jnode *parse_or(parser *p);

static bool enter(parser *p, size_t pos) {
    if (++p->depth > MAX_NEST) {
        fail_at(p, ACCEL_ERR_UNSUPPORTED, pos, "nested more than 200 levels deep%.*s", "", 0);
        return false;
    }
    return true;
}

/* expr {, expr}: a tuple when a comma follows (an explicit one inside parentheses). */
static jnode *parse_tuple(parser *p, bool simple, bool explicit_paren) {
    size_t pos = cur(p)->pos;
    kids k = {0};
    bool comma = false;
    for (;;) {
        if (k.n) {
            if (!is_op(cur(p), ",")) break;
            p->at++;
            comma = true;
        }
        tok *t = cur(p);
        if (t->t == T_VAR_END || t->t == T_BLOCK_END || t->t == T_EOF || is_op(t, ")") || is_name(t, "in") ||
            is_op(t, "="))
            break;
        jnode *x = simple ? parse_primary(p) : parse_expr(p);
        if (!kids_add(p, &k, x)) return NULL;
    }
    if (!comma && k.n == 1) return k.v[0];
    if (!k.n && !explicit_paren) return expect_fail(p, "an expression");
    jnode *x = node(p, JN_TUPLE, pos);
    if (x) x->kid = k.v, x->nkid = k.n;
    return done(p, x);
}

static bool parse_call_args(parser *p, jnode *call) {
    kids k = {0};
    const char **kw = NULL;
    size_t *kwn = NULL, nkw = 0, kwcap = 0;
    if (!expect_op(p, "(")) return false;
    while (!is_op(cur(p), ")")) {
        if (k.n && !expect_op(p, ",")) return false;
        if (is_op(cur(p), ")")) break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            return fail_at(p, ACCEL_ERR_UNSUPPORTED, cur(p)->pos, "*args and **kwargs in calls are not implemented%.*s", "", 0), false;
        if (cur(p)->t == T_NAME && is_op(peek(p, 1), "=")) {
            if (nkw == kwcap) {
                size_t cap = kwcap ? 2 * kwcap : 4;
                const char **a = jv_alloc(&p->c, cap * sizeof *a);
                size_t *b = jv_alloc(&p->c, cap * sizeof *b);
                if (!a || !b) return p->failed = true, false;
                if (nkw) memcpy(a, kw, nkw * sizeof *a), memcpy(b, kwn, nkw * sizeof *b);
                kw = a, kwn = b, kwcap = cap;
            }
            kw[nkw] = cur(p)->p, kwn[nkw++] = cur(p)->n;
            p->at += 2;
        } else if (nkw)
            return fail_at(p, ACCEL_ERR_FORMAT, cur(p)->pos, "a positional argument after a keyword argument%.*s", "", 0), false;
        if (!kids_add(p, &k, parse_expr(p))) return false;
    }
    p->at++;
    call->kid = k.v, call->nkid = k.n, call->kw = kw, call->kw_n = kwn, call->nkw = nkw;
    return true;
}

static jnode *parse_primary(parser *p) {
    tok *t = cur(p);
    jnode *x;
    if (!enter(p, t->pos)) return NULL;
    if (t->t == T_NAME) {
        p->at++;
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            if ((x = node(p, JN_CONST, t->pos))) x->val = jv_bool(t->p[0] == 't' || t->p[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            if ((x = node(p, JN_CONST, t->pos))) x->val = jv_none();
        } else if ((x = node(p, JN_NAME, t->pos)))
            x->name = t->p, x->name_n = t->n;
    } else if (t->t == T_STRING) {
        /* adjacent literals concatenate, as in Python */
        tok_buf b = {0};
        size_t pos = t->pos;
        while (cur(p)->t == T_STRING) {
            if (!tok_buf_put(&b, cur(p)->p, cur(p)->n)) {
                free(b.p);
                accel_set_error(ACCEL_ERR_OOM, "chat template: out of memory parsing");
                p->failed = true;
                return NULL;
            }
            p->at++;
        }
        jv v = jv_str("", 0);
        if (b.n && !jv_strdup(&p->c, b.p, b.n, &v)) p->failed = true;
        free(b.p);
        if ((x = node(p, JN_CONST, pos))) x->val = v;
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        p->at++;
        if ((x = node(p, JN_CONST, t->pos))) x->val = t->t == T_INT ? jv_int(t->i) : jv_float(t->f);
    } else if (is_op(t, "(")) {
        p->at++;
        x = parse_tuple(p, false, true);
        if (x && !expect_op(p, ")")) x = NULL;
    } else if (is_op(t, "[") || is_op(t, "{")) {
        bool dict = is_op(t, "{");
        p->at++;
        x = node(p, dict ? JN_DICT : JN_LIST, t->pos);
        kids k = {0};
        while (x && !is_op(cur(p), dict ? "}" : "]")) {
            if (k.n && !expect_op(p, ",")) return NULL;
            if (is_op(cur(p), dict ? "}" : "]")) break;
            if (!kids_add(p, &k, parse_expr(p))) return NULL;
            if (dict && (!expect_op(p, ":") || !kids_add(p, &k, parse_expr(p)))) return NULL;
        }
        if (!x) return NULL;
        p->at++;
        x->kid = k.v, x->nkid = k.n;
        x = done(p, x);
    } else
        return expect_fail(p, "an expression");
    p->depth--;
    return x;
}

static jnode *parse_subscript(parser *p, jnode *x) {
    tok *t = cur(p);
    p->at++;
    if (is_op(t, ".")) {
        tok *a = cur(p);
        if (a->t == T_NAME) {
            jnode *y = node(p, JN_ATTR, t->pos);
            if (!y) return NULL;
            y->a = x, y->name = a->p, y->name_n = a->n;
            p->at++;
            return done(p, y);
        }
        if (a->t == T_INT) {
            jnode *y = node(p, JN_ITEM, t->pos), *c = node(p, JN_CONST, a->pos);
            if (!y || !c) return NULL;
            c->val = jv_int(a->i), y->a = x, y->b = c;
            p->at++;
            return done(p, y);
        }
        return expect_fail(p, "an attribute name");
    }
    /* [ index ] or [ start : stop : step ] */
    jnode *part[3] = {0};
    int colons = 0;
    for (;;) {
        if (is_op(cur(p), "]")) break;
        if (is_op(cur(p), ":")) {
            if (++colons > 2) return expect_fail(p, "']'");
            p->at++;
            continue;
        }
        if (part[colons]) return expect_fail(p, colons ? "':' or ']'" : "':' or ']'");
        if (!(part[colons] = parse_expr(p))) return NULL;
    }
    p->at++;
    if (!colons && !part[0]) return fail_at(p, ACCEL_ERR_FORMAT, t->pos, "an empty subscript '[]'%.*s", "", 0);
    jnode *y = node(p, colons ? JN_SLICE : JN_ITEM, t->pos);
    if (!y) return NULL;
    y->a = x, y->b = part[0], y->c = part[1], y->d = part[2];
    return done(p, y);
}

/* x(args...) at pos: the call node over callee x. */
static jnode *parse_call(parser *p, jnode *x, size_t pos) {
    jnode *c = node(p, JN_CALL, pos);
    if (!c || !parse_call_args(p, c)) return NULL;
    c->a = x;
    return done(p, c);
}

static jnode *parse_postfix(parser *p, jnode *x) {
    while (x) {
        tok *t = cur(p);
        if (is_op(t, ".") || is_op(t, "[")) x = parse_subscript(p, x);
        else if (is_op(t, "(")) x = parse_call(p, x, x->pos); /* errors of the call name the callee */
        else break;
    }
    return x;
}

static jnode *parse_filter_expr(parser *p, jnode *x) {
    while (x) {
        tok *t = cur(p);
        if (is_op(t, "|") || is_name(t, "is")) {
            bool test = is_name(t, "is");
            p->at++;
            jnode *f = node(p, test ? JN_TEST : JN_FILTER, t->pos);
            if (!f) return NULL;
            if (test && is_name(cur(p), "not")) f->neg = true, p->at++;
            if (cur(p)->t != T_NAME) return expect_fail(p, test ? "a test name" : "a filter name");
            f->name = cur(p)->p, f->name_n = cur(p)->n;
            /* jinja checks the names when it compiles: an unknown one fails the whole template */
            if (!jinja_known(f->name, f->name_n, test))
                return fail_at(p, ACCEL_ERR_UNSUPPORTED, cur(p)->pos,
                               test ? "no test named '%.*s' (unknown, or not implemented here)"
                                    : "no filter named '%.*s' (unknown, or not implemented here)",
                               f->name, f->name_n);
            p->at++;
            if (is_op(cur(p), ".")) return fail_at(p, ACCEL_ERR_UNSUPPORTED, cur(p)->pos, "dotted filter and test names are not implemented%.*s", "", 0);
            f->a = x;
            if (is_op(cur(p), "(")) {
                if (!parse_call_args(p, f)) return NULL;
            } else if (test) {
                tok *a = cur(p);
                bool starts = a->t == T_NAME || a->t == T_STRING || a->t == T_INT || a->t == T_FLOAT || is_op(a, "[") || is_op(a, "{");
                if (starts && !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and")) {
                    if (is_name(a, "is")) return fail_at(p, ACCEL_ERR_FORMAT, a->pos, "you cannot chain multiple tests with is%.*s", "", 0);
                    jnode *arg = parse_postfix(p, parse_primary(p));
                    if (!arg) return NULL;
                    kids k = {0};
                    if (!kids_add(p, &k, arg)) return NULL;
                    f->kid = k.v, f->nkid = 1;
                }
            }
            x = done(p, f);
        } else if (is_op(t, "(")) {
            x = parse_call(p, x, t->pos);
        } else
            break;
    }
    return x;
}

static jnode *parse_unary(parser *p, bool with_filter) {
    tok *t = cur(p);
    jnode *x;
    if (!enter(p, t->pos)) return NULL;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->at++;
        x = node(p, JN_UNARY, t->pos);
        if (!x || !(x->a = parse_unary(p, false))) return NULL;
        x->op = t->p[0];
        x = done(p, x);
    } else
        x = parse_primary(p);
    x = parse_postfix(p, x);
    if (with_filter) x = parse_filter_expr(p, x);
    p->depth--;
    return x;
}

static jnode *bin(parser *p, jn_kind k, int op, size_t pos, jnode *a, jnode *b) {
    if (!a || !b) return NULL;
    jnode *x = node(p, k, pos);
    if (x) x->op = op, x->a = a, x->b = b;
    return done(p, x);
}

static jnode *parse_pow(parser *p) {
    jnode *x = parse_unary(p, true);
    while (x && is_op(cur(p), "**")) {
        size_t pos = cur(p)->pos;
        p->at++;
        x = bin(p, JN_BIN, 'P', pos, x, parse_unary(p, true));
    }
    return x;
}

static jnode *parse_math2(parser *p) {
    jnode *x = parse_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'F' : is_op(t, "%") ? '%' : 0;
        if (!op || !x) return x;
        p->at++;
        x = bin(p, JN_BIN, op, t->pos, x, parse_pow(p));
    }
}

static jnode *parse_concat(parser *p) {
    jnode *x = parse_math2(p);
    while (x && is_op(cur(p), "~")) {
        size_t pos = cur(p)->pos;
        p->at++;
        x = bin(p, JN_BIN, '~', pos, x, parse_math2(p));
    }
    return x;
}

static jnode *parse_math1(parser *p) {
    jnode *x = parse_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op || !x) return x;
        p->at++;
        x = bin(p, JN_BIN, op, t->pos, x, parse_concat(p));
    }
}

static jnode *parse_compare(parser *p) {
    size_t pos = cur(p)->pos;
    jnode *x = parse_math1(p);
    kids k = {0};
    int ops[64];
    while (x) {
        tok *t = cur(p);
        int op = is_op(t, "==") ? JCMP_EQ : is_op(t, "!=") ? JCMP_NE : is_op(t, "<") ? JCMP_LT : is_op(t, "<=") ? JCMP_LE :
                 is_op(t, ">") ? JCMP_GT : is_op(t, ">=") ? JCMP_GE : is_name(t, "in") ? JCMP_IN :
                 (is_name(t, "not") && is_name(peek(p, 1), "in")) ? JCMP_NOTIN : -1;
        if (op < 0) break;
        if (k.n == 64) return fail_at(p, ACCEL_ERR_UNSUPPORTED, t->pos, "more than 64 chained comparisons%.*s", "", 0);
        p->at += op == JCMP_NOTIN ? 2 : 1;
        ops[k.n] = op;
        if (!kids_add(p, &k, parse_math1(p))) return NULL;
    }
    if (!x || !k.n) return x;
    jnode *c = node(p, JN_CMP, pos);
    if (!c || !(c->cmp = jv_alloc(&p->c, k.n * sizeof(int)))) return p->failed = true, NULL;
    memcpy(c->cmp, ops, k.n * sizeof(int));
    c->a = x, c->kid = k.v, c->nkid = k.n;
    return done(p, c);
}

static jnode *parse_not(parser *p) {
    tok *t = cur(p);
    if (is_name(t, "not")) {
        p->at++;
        if (!enter(p, t->pos)) return NULL;
        jnode *x = node(p, JN_UNARY, t->pos);
        if (!x || !(x->a = parse_not(p))) return NULL;
        x->op = 'n';
        p->depth--;
        return done(p, x);
    }
    return parse_compare(p);
}

/* A left-leaning chain of next's operands joined by the keyword kw (and, or). */
static jnode *parse_chain(parser *p, const char *kw, jn_kind kind, jnode *(*next)(parser *)) {
    jnode *x = next(p);
    while (x && is_name(cur(p), kw)) {
        size_t pos = cur(p)->pos;
        p->at++;
        x = bin(p, kind, 0, pos, x, next(p));
    }
    return x;
}

static jnode *parse_and(parser *p) { return parse_chain(p, "and", JN_AND, parse_not); }
static jnode *parse_or(parser *p) { return parse_chain(p, "or", JN_OR, parse_and); }

static jnode *parse_expr(parser *p) {
    size_t pos = cur(p)->pos;
    if (!enter(p, pos)) return NULL;
    jnode *x = parse_or(p);
    while (x && is_name(cur(p), "if")) {
        p->at++;
        jnode *c = node(p, JN_COND, pos);
        if (!c || !(c->a = parse_or(p))) return NULL;
        c->b = x;
        if (is_name(cur(p), "else")) {
            p->at++;
            if (!(c->c = parse_expr(p))) return NULL;
        }
        x = done(p, c);
    }
    p->depth--;
    return x;
}

/* ------------------------------------------------------------ statements */

static jnode *parse_body(parser *p, const char *const *stops, size_t nstops, size_t open_pos, const char *open_name);

static bool expect_block_end(parser *p) {
    if (cur(p)->t == T_BLOCK_END) {
        p->at++;
        return true;
    }
    expect_fail(p, "the end of the tag '%}'");
    return false;
}

/* An assignment target: a name, names separated by commas, or (set) ns.attr. */
static jnode *parse_target(parser *p, bool allow_attr) {
    tok *t = cur(p);
    if (t->t != T_NAME) return expect_fail(p, "a name to assign");
    if (allow_attr && is_op(peek(p, 1), ".")) {
        jnode *n = node(p, JN_NAME, t->pos), *a = node(p, JN_ATTR, t->pos);
        if (!n || !a) return NULL;
        n->name = t->p, n->name_n = t->n;
        p->at += 2;
        if (cur(p)->t != T_NAME) return expect_fail(p, "an attribute name");
        a->a = n, a->name = cur(p)->p, a->name_n = cur(p)->n;
        p->at++;
        return a;
    }
    jnode *x = parse_tuple(p, true, false);
    if (!x) return NULL;
    jnode **v = x->k == JN_TUPLE ? x->kid : &x;
    size_t n = x->k == JN_TUPLE ? x->nkid : 1;
    for (size_t i = 0; i < n; i++)
        if (v[i]->k != JN_NAME)
            return fail_at(p, ACCEL_ERR_UNSUPPORTED, v[i]->pos, "only names (and namespace attributes) can be assigned to%.*s", "", 0);
    return x;
}

static jnode *parse_statement(parser *p) {
    tok *t = cur(p); /* the statement's name, after {% */
    size_t pos = t->pos;
    if (t->t != T_NAME) return expect_fail(p, "a statement name");
    p->at++;
    if (is_name(t, "if")) {
        jnode *x = node(p, JN_IF, pos);
        kids k = {0};
        for (;;) {
            jnode *cond = parse_tuple(p, false, false);
            if (!cond || !expect_block_end(p)) return NULL;
            static const char *const stops[] = {"elif", "else", "endif"};
            jnode *body = parse_body(p, stops, 3, pos, "if");
            if (!x || !kids_add(p, &k, cond) || !kids_add(p, &k, body)) return NULL;
            tok *e = cur(p);
            p->at++;
            if (is_name(e, "elif")) continue;
            if (is_name(e, "else")) {
                if (!expect_block_end(p)) return NULL;
                static const char *const endif[] = {"endif"};
                if (!(x->a = parse_body(p, endif, 1, pos, "if"))) return NULL;
                p->at++;
            }
            break;
        }
        x->kid = k.v, x->nkid = k.n;
        return expect_block_end(p) ? x : NULL;
    }
    if (is_name(t, "for")) {
        jnode *x = node(p, JN_FOR, pos);
        if (!x || !(x->a = parse_target(p, false))) return NULL;
        if (!is_name(cur(p), "in")) return expect_fail(p, "'in'");
        p->at++;
        /* the iterable is a tuple without inline ifs (jinja: with_condexpr=False) */
        if (!(x->b = parse_or(p))) return NULL;
        if (is_name(cur(p), "if")) {
            p->at++;
            if (!(x->c = parse_expr(p))) return NULL;
        }
        if (is_name(cur(p), "recursive"))
            return fail_at(p, ACCEL_ERR_UNSUPPORTED, cur(p)->pos, "recursive for loops are not implemented%.*s", "", 0);
        if (!expect_block_end(p)) return NULL;
        static const char *const stops[] = {"else", "endfor"};
        p->loops++;
        x->d = parse_body(p, stops, 2, pos, "for");
        p->loops--;
        if (!x->d) return NULL;
        if (is_name(cur(p), "else")) {
            p->at++;
            if (!expect_block_end(p)) return NULL;
            static const char *const endfor[] = {"endfor"};
            if (!(x->e = parse_body(p, endfor, 1, pos, "for"))) return NULL;
        }
        p->at++;
        return expect_block_end(p) ? x : NULL;
    }
    if (is_name(t, "set")) {
        jnode *target = parse_target(p, true);
        if (!target) return NULL;
        if (is_op(cur(p), "=")) {
            p->at++;
            jnode *x = node(p, JN_SET, pos);
            if (!x || !(x->b = parse_tuple(p, false, false))) return NULL;
            x->a = target;
            return expect_block_end(p) ? x : NULL;
        }
        if (is_op(cur(p), "|"))
            return fail_at(p, ACCEL_ERR_UNSUPPORTED, cur(p)->pos, "filtered block assignments are not implemented%.*s", "", 0);
        if (!expect_block_end(p)) return NULL;
        jnode *x = node(p, JN_SETBLOCK, pos);
        static const char *const stops[] = {"endset"};
        if (!x || !(x->d = parse_body(p, stops, 1, pos, "set"))) return NULL;
        x->a = target;
        p->at++;
        return expect_block_end(p) ? x : NULL;
    }
    if (is_name(t, "macro")) {
        jnode *x = node(p, JN_MACRO, pos);
        if (!x) return NULL;
        if (cur(p)->t != T_NAME) return expect_fail(p, "a macro name");
        x->name = cur(p)->p, x->name_n = cur(p)->n;
        p->at++;
        if (!expect_op(p, "(")) return NULL;
        kids k = {0};
        while (!is_op(cur(p), ")")) {
            if (k.n && !expect_op(p, ",")) return NULL;
            if (cur(p)->t != T_NAME) return expect_fail(p, "a parameter name");
            jnode *prm = node(p, JN_NAME, cur(p)->pos);
            if (!prm) return NULL;
            prm->name = cur(p)->p, prm->name_n = cur(p)->n;
            p->at++;
            if (is_op(cur(p), "=")) {
                p->at++;
                if (!(prm->a = parse_expr(p))) return NULL;
            } else if (k.n && k.v[k.n - 1]->a)
                return fail_at(p, ACCEL_ERR_FORMAT, prm->pos, "a parameter without a default after one with a default%.*s", "", 0);
            if (!kids_add(p, &k, prm)) return NULL;
        }
        p->at++;
        if (!expect_block_end(p)) return NULL;
        static const char *const stops[] = {"endmacro"};
        int loops = p->loops;
        p->loops = 0;
        x->d = parse_body(p, stops, 1, pos, "macro");
        p->loops = loops;
        if (!x->d) return NULL;
        x->kid = k.v, x->nkid = k.n;
        p->at++;
        if (cur(p)->t == T_NAME) p->at++; /* {% endmacro name %} */
        return expect_block_end(p) ? x : NULL;
    }
    if (is_name(t, "generation")) {
        jnode *x = node(p, JN_GENERATION, pos);
        if (!x || !expect_block_end(p)) return NULL;
        static const char *const stops[] = {"endgeneration"};
        if (!(x->d = parse_body(p, stops, 1, pos, "generation"))) return NULL;
        p->at++;
        return expect_block_end(p) ? x : NULL;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!p->loops) return fail_at(p, ACCEL_ERR_FORMAT, pos, "'%.*s' outside a for loop", t->p, t->n);
        jnode *x = node(p, is_name(t, "break") ? JN_BREAK : JN_CONTINUE, pos);
        return x && expect_block_end(p) ? x : NULL;
    }
    static const char *const known[] = {"raw", "include", "extends", "block", "import", "from", "call", "filter",
                                        "with", "autoescape", "do", "trans", "print"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (is_name(t, known[i]))
            return fail_at(p, ACCEL_ERR_UNSUPPORTED, pos, "the '%.*s' statement is not implemented", t->p, t->n);
    return fail_at(p, ACCEL_ERR_FORMAT, pos, "unknown statement '%.*s'", t->p, t->n);
}

/* Statements up to a {% stop %} (left as the current token) or the end. */
static jnode *parse_body(parser *p, const char *const *stops, size_t nstops, size_t open_pos, const char *open_name) {
    jnode *body = node(p, JN_BODY, cur(p)->pos);
    kids k = {0};
    if (!body || !enter(p, cur(p)->pos)) return NULL;
    for (;;) {
        tok *t = cur(p);
        if (t->t == T_EOF) {
            if (!nstops) break;
            char m[128];
            snprintf(m, sizeof m, "'%s' is never closed (expected '{%% %s %%}')", open_name, stops[nstops - 1]);
            return fail_at(p, ACCEL_ERR_FORMAT, open_pos, "%.*s", m, strlen(m));
        }
        if (t->t == T_TEXT) {
            jnode *x = node(p, JN_TEXT, t->pos);
            if (!x) return NULL;
            x->val = jv_str(t->p, t->n);
            p->at++;
            if (!kids_add(p, &k, x)) return NULL;
        } else if (t->t == T_VAR_BEGIN) {
            p->at++;
            jnode *x = node(p, JN_OUT, t->pos);
            if (!x || !(x->a = parse_tuple(p, false, false))) return NULL;
            if (cur(p)->t != T_VAR_END) return expect_fail(p, "'}}'");
            p->at++;
            if (!kids_add(p, &k, x)) return NULL;
        } else if (t->t == T_BLOCK_BEGIN) {
            tok *nm = peek(p, 1);
            for (size_t i = 0; i < nstops; i++)
                if (is_name(nm, stops[i])) {
                    p->at++;
                    body->kid = k.v, body->nkid = k.n;
                    p->depth--;
                    return body;
                }
            static const char *const ends[] = {"endif", "endfor", "endset", "endmacro", "endgeneration", "elif", "else"};
            for (size_t i = 0; i < sizeof ends / sizeof *ends; i++)
                if (is_name(nm, ends[i]))
                    return fail_at(p, ACCEL_ERR_FORMAT, nm->pos, "unexpected '%.*s'", nm->p, nm->n);
            p->at++;
            if (!kids_add(p, &k, parse_statement(p))) return NULL;
        } else
            return expect_fail(p, "text or a tag");
    }
    body->kid = k.v, body->nkid = k.n;
    p->depth--;
    return body;
}

jtemplate *jinja_parse(const char *src, size_t n) {
    size_t bad = tok_utf8_invalid_at(src, n);
    if (bad < n) {
        accel_set_error(ACCEL_ERR_FORMAT, "chat template: not UTF-8 at byte %zu (0x%02X)", bad, (unsigned char)src[bad]);
        return NULL;
    }
    jtemplate *t = calloc(1, sizeof *t);
    accel_arena *a = accel_arena_create(n * 8 + 4096);
    char *s = a ? accel_arena_alloc(a, n + 1, 16) : NULL;
    if (!t || !s) {
        free(t);
        accel_arena_destroy(a);
        accel_set_error(ACCEL_ERR_OOM, "chat template: out of memory for a %zu-byte template", n);
        return NULL;
    }
    /* newlines as jinja reads them: \r\n and \r are \n; one trailing newline dropped */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else
            s[k++] = src[i];
    }
    if (k && s[k - 1] == '\n') k--;
    s[k] = 0;
    t->arena = a, t->src = s, t->n = k;
    parser p = {.t = t, .c = {.arena = a, .mem_limit = SIZE_MAX / 4}};
    if (lex(&p)) t->root = parse_body(&p, NULL, 0, 0, "");
    free(p.tk);
    if (!t->root || p.failed) {
        jinja_free(t);
        return NULL;
    }
    return t;
}

void jinja_free(jtemplate *t) {
    if (!t) return;
    accel_arena_destroy(t->arena);
    free(t);
}
