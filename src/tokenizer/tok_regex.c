/* A tokenizer.json regular expression compiled for PCRE2 with the meaning it
 * has in the reference, whose engine is Oniguruma (Rust onig). The syntax the
 * tokenizers families write is the same in both; the shorthand classes are
 * not, so they are spelled out here before PCRE2 sees the pattern:
 *
 *   \s   Oniguruma: the White_Space property. PCRE2 (UCP) adds U+180E, which
 *        it keeps in \h from Unicode 4: \p{White_Space}.
 *   \w   Oniguruma: Alphabetic, marks (M), decimal digits (Nd), connector
 *        punctuation (Pc); outside a bracket class also U+00B2 U+00B3 U+00B9
 *        U+00BC-U+00BE (its Latin-1 table calls them word characters, its
 *        class code does not). PCRE2 10.42: letters, every number (No too),
 *        underscore, no marks.
 *   \b   a boundary between that \w and not, as lookarounds.
 *   \h   Oniguruma: a hexadecimal digit (PCRE2: horizontal space).
 *   \v   Oniguruma: U+000B only (PCRE2: vertical space).
 *   \uHHHH  a code point in Oniguruma, an error in PCRE2: \x{HHHH}.
 * and their negations. What has no exact spelling is refused, naming it: \W
 * or \H inside a bracket class (a union with a complement), \V, POSIX
 * bracket classes ([:alpha:] differs the same way), nested classes and
 * class intersection (&&), which PCRE2 reads as literal characters; \Q \E
 * (letters to Oniguruma), \c, comment groups and the extended mode (a "["
 * there opens no class), a range from \w \s \h inside a class. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_internal.h"
#include "tok_internal.h"

#define WORD_IN_CLASS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
#define WORD_LATIN1 "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
#define WORD "[" WORD_IN_CLASS WORD_LATIN1 "]"
#define NOT_WORD "[^" WORD_IN_CLASS WORD_LATIN1 "]"

/* The PCRE2 spelling of escape `e` (outside a class when !in_class); NULL:
 * not one this file rewrites. *refused: it has no exact spelling there. */
static const char *class_escape(char e, bool in_class, bool *refused) {
    *refused = false;
    switch (e) {
    case 's': return "\\p{White_Space}";
    case 'S': return "\\P{White_Space}";
    case 'w': return in_class ? WORD_IN_CLASS : WORD;
    case 'h': return in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]";
    case 'v': return "\\x{0B}";
    case 'W': *refused = in_class; return NOT_WORD;
    case 'H': *refused = in_class; return "[^0-9A-Fa-f]";
    case 'b': return in_class ? NULL : "(?:(?<=" WORD ")(?!" WORD ")|(?<!" WORD ")(?=" WORD "))";
    case 'B': return in_class ? NULL : "(?:(?<=" WORD ")(?=" WORD ")|(?<!" WORD ")(?!" WORD "))";
    case 'V': *refused = true; return NULL;
    /* Oniguruma's default syntax reads \Q and \E as the letters, PCRE2 as quoting;
     * \c takes the next character (\c[ is ESC), which the class tracking below would
     * misread: refused rather than rewritten */
    case 'Q': case 'E': case 'c': *refused = true; return NULL;
    default: return NULL;
    }
}

static bool is_hex4(const char *p) {
    for (int i = 0; i < 4; i++)
        if (!isxdigit((unsigned char)p[i])) return false;
    return true;
}

/* pattern rewritten as above (malloc'd), or NULL with what[0..n) naming the
 * construct refused, or left empty for out of memory. */
static char *onig_to_pcre2(const char *pattern, char *what, size_t n) {
    tok_buf out = {0};
    bool ok = true;
    int in_class = 0; /* 1: just after "[" or "[^" (a "]" there is literal); 2: further in */
    *what = 0;
    for (const char *p = pattern; ok && *p; p++) {
        if (p[0] == '\\' && p[1] == 'u' && is_hex4(p + 2)) { /* Oniguruma's \uHHHH: PCRE2's \x{HHHH} */
            ok = tok_buf_put(&out, "\\x{", 3) && tok_buf_put(&out, p + 2, 4) && tok_buf_put(&out, "}", 1);
            p += 5;
            if (in_class) in_class = 2;
            continue;
        }
        if (*p == '\\' && p[1]) {
            bool refused;
            const char *rep = class_escape(p[1], in_class, &refused);
            if (refused) {
                snprintf(what, n, "\\%c%s", p[1], in_class ? " inside a bracket class" : "");
                ok = false;
            } else if (in_class && strchr("swh", p[1]) && p[2] == '-' && p[3] && p[3] != ']') {
                /* PCRE2 would take the last character of the spelled-out class as a range's start */
                snprintf(what, n, "a range from \\%c in a bracket class", p[1]);
                ok = false;
            } else {
                ok = rep ? tok_buf_put(&out, rep, strlen(rep)) : tok_buf_put(&out, p, 2);
            }
            p++;
            if (in_class) in_class = 2;
            continue;
        }
        if (in_class) {
            if (*p == '[') {
                snprintf(what, n, "%s", p[1] == ':' || (p[1] == '^' && p[2] == ':') ? "a POSIX bracket class ([:name:])"
                                                                                    : "a nested bracket class");
                ok = false;
                break;
            }
            if (*p == '&' && p[1] == '&') {
                snprintf(what, n, "a class intersection (&&)");
                ok = false;
                break;
            }
            if (*p == ']' && in_class == 2) in_class = 0;
            else if (!(*p == '^' && p[-1] == '[')) in_class = 2;
        } else if (*p == '[') {
            in_class = 1;
        } else if (*p == '(' && p[1] == '?') {
            /* a comment group, or the extended mode's comments: a "[" in them is no class */
            size_t f = 2;
            while (p[f] && strchr("imxsDWSPLauy-", p[f]) && p[f] != 'x') f++;
            if (p[2] == '#' || p[f] == 'x') {
                snprintf(what, n, "%s", p[2] == '#' ? "a comment group (?#...)" : "the extended mode (?x)");
                ok = false;
                break;
            }
        }
        ok = tok_buf_put(&out, p, 1);
    }
    if (ok) ok = tok_buf_put(&out, "", 1);
    if (!ok) {
        free(out.p);
        return NULL;
    }
    return out.p;
}

pcre2_code *tok_regex_compile(const char *pattern, tok_regex_syntax syntax, const char *path, const char *field) {
    char what[64];
    bool onig = syntax == TOK_RE_ONIGURUMA, literal = syntax == TOK_RE_STRING;
    char *translated = onig ? onig_to_pcre2(pattern, what, sizeof what) : NULL;
    if (onig && !translated) {
        if (*what)
            accel_set_error(ACCEL_ERR_UNSUPPORTED,
                            "%s: %s: the regular expression uses %s, which accel cannot give Oniguruma's meaning",
                            path, field, what);
        else accel_set_error(ACCEL_ERR_OOM, "%s: %s: out of memory", path, field);
        return NULL;
    }
    int err;
    PCRE2_SIZE at;
    uint32_t flags = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(onig ? translated : pattern), PCRE2_ZERO_TERMINATED, flags, &err,
                                   &at, NULL);
    free(translated);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        accel_set_error(ACCEL_ERR_FORMAT, "%s: %s: the regular expression does not compile: %s", path, field,
                        (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* best effort: the interpreter is the fallback */
    return re;
}
