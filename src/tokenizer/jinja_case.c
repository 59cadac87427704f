/* Python's str.upper(), lower() and capitalize() for the chat-template interpreter:
 * utf8proc's one-to-one case mappings, the mappings longer than one code point
 * ('ß'.upper() is 'SS', 'ﬁ'.capitalize() is 'Fi') and lower()'s Final_Sigma rule
 * ('ΟΔΟΣ'.lower() is 'οδος'), from jinja_case_table.h (tools/gen_jinja_case_table.py). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "jinja_internal.h"
#include "tok_internal.h"
#include "jinja_case_table.h"

static int cmp_full(const void *key, const void *e) {
    uint32_t cp = *(const uint32_t *)key, at = ((const jcase_full *)e)->cp;
    return cp < at ? -1 : cp > at;
}

static int cmp_range(const void *key, const void *e) {
    uint32_t cp = *(const uint32_t *)key;
    const uint32_t *r = e;
    return cp < r[0] ? -1 : cp > r[1];
}

static bool in_ranges(uint32_t cp, const uint32_t (*r)[2], size_t n) {
    return bsearch(&cp, r, n, sizeof *r, cmp_range) != NULL;
}
#define IN(table, cp) in_ranges(cp, table, sizeof table / sizeof *table)

/* The code point before byte offset i of p (0 at the start), *at set to its offset. */
static uint32_t prev_cp(const char *p, size_t i, size_t *at) {
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)p[j] & 0xC0) == 0x80) j--;
    uint32_t cp;
    if (!tok_utf8_next(p + j, i - j, &cp)) cp = (unsigned char)p[i - 1], j = i - 1;
    *at = j;
    return cp;
}

/* CPython's handle_capital_sigma: the capital sigma at [i, e) of p (n bytes) lowers to
 * the final form when a cased letter comes before it and none after it, skipping
 * case-ignorable code points (marks, apostrophes) on both sides. */
static bool final_sigma(const char *p, size_t n, size_t i, size_t e) {
    uint32_t cp = 0;
    bool found = false;
    for (size_t j = i; j > 0 && !found;) found = !IN(JCASE_CASE_IGNORABLE, cp = prev_cp(p, j, &j));
    if (!found || !IN(JCASE_CASED, cp)) return false;
    for (size_t j = e, l; j < n; j += l) {
        if (!(l = tok_utf8_next(p + j, n - j, &cp))) l = 1, cp = (unsigned char)p[j];
        if (!IN(JCASE_CASE_IGNORABLE, cp)) return !IN(JCASE_CASED, cp);
    }
    return true;
}

bool jv_py_iscase(const char *p, size_t n, bool upper) {
    bool cased = false;
    for (size_t i = 0, l; i < n; i += l) {
        uint32_t cp;
        if (!(l = tok_utf8_next(p + i, n - i, &cp))) l = 1, cp = (unsigned char)p[i];
        if (IN(JCASE_TITLECASE, cp) || (upper ? IN(JCASE_LOWERCASE, cp) : IN(JCASE_UPPERCASE, cp))) return false;
        cased = cased || (upper ? IN(JCASE_UPPERCASE, cp) : IN(JCASE_LOWERCASE, cp));
    }
    return cased;
}

bool jv_recase(jbuf *b, const char *p, size_t n, int mode) {
    for (size_t i = 0, l; i < n; i += l) {
        uint32_t cp, to[3] = {0};
        if (!(l = tok_utf8_next(p + i, n - i, &cp))) l = 1, cp = (unsigned char)p[i];
        int m = mode == 'C' ? (i ? 'L' : 'T') : mode;
        const jcase_full *full = m == 'U' ? bsearch(&cp, JCASE_UPPER, sizeof JCASE_UPPER / sizeof *JCASE_UPPER, sizeof *JCASE_UPPER, cmp_full)
                               : m == 'T' ? bsearch(&cp, JCASE_TITLE, sizeof JCASE_TITLE / sizeof *JCASE_TITLE, sizeof *JCASE_TITLE, cmp_full)
                                          : bsearch(&cp, JCASE_LOWER, sizeof JCASE_LOWER / sizeof *JCASE_LOWER, sizeof *JCASE_LOWER, cmp_full);
        if (full) memcpy(to, full->to, sizeof to);
        else if (m == 'L' && cp == 0x3A3) to[0] = final_sigma(p, n, i, i + l) ? 0x3C2 : 0x3C3;
        else
            to[0] = (uint32_t)(m == 'U' ? utf8proc_toupper((utf8proc_int32_t)cp)
                               : m == 'T' ? utf8proc_totitle((utf8proc_int32_t)cp)
                                          : utf8proc_tolower((utf8proc_int32_t)cp));
        for (int k = 0; k < 3 && (!k || to[k]); k++) { /* to[0] may be U+0000 itself */
            utf8proc_uint8_t u[4];
            utf8proc_ssize_t len = utf8proc_encode_char((utf8proc_int32_t)to[k], u);
            if (!jbuf_put(b, (const char *)u, (size_t)len)) return false;
        }
    }
    return true;
}
