/* Chat templates (accel_chat_template_*) against transformers' apply_chat_template:
 * the real templates of thirteen chat model families and six adversarial ones
 * (data/chat_templates/adversarial/) over 24 conversations with
 * add_generation_prompt on (and off for seven) (data/chat_templates/cases.json), one-construct
 * snippets (snippets.json), model folders loaded and tokenized (dirs.json), all
 * made by tools/gen_chat_template_fixtures.py with transformers 5.25 and compared
 * byte for byte (ids for ids); then refusals: malformed templates with their
 * position, constructs outside the subset, raise_exception's message, runaway
 * loops, recursion and output, bad arguments; and what an adversarial review found
 * (stack overflows, hangs, quadratic loads, numbers unlike jinja2's: test_review). */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "sibling_exe.h"
#include "tok_cases.h"

static json_t *load(const char *path) {
    json_error_t e;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &e); /* texts with U+0000, as the renders take them */
    if (!j) fprintf(stderr, "%s: %s (line %d)\n", path, e.text, e.line);
    return j;
}

static char *read_text(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    *n = fread(s, 1, (size_t)len, f);
    s[*n] = 0;
    fclose(f);
    return s;
}

/* Renders vars (a JSON object) with ct; checks expected text or the error. */
static void check_case(const accel_chat_template *ct, json_t *vars, json_t *c, const char *label) {
    char *js = json_dumps(vars, JSON_COMPACT);
    char *text = NULL;
    size_t len = 0;
    accel_status st = accel_chat_template_render_json(ct, js, strlen(js), &text, &len);
    json_t *exp = json_object_get(c, "expected");
    if (exp) {
        CHECK_MSG(st == ACCEL_OK, "%s: %s", label, accel_last_error());
        if (!st) {
            bool same = len == json_string_length(exp) && !memcmp(text, json_string_value(exp), len);
            CHECK_MSG(same, "%s:\n--- accel (%zu bytes)\n%s\n--- transformers (%zu bytes)\n%s\n---", label, len, text,
                      json_string_length(exp), json_string_value(exp));
        }
    } else {
        CHECK_MSG(st != ACCEL_OK, "%s: rendered where transformers fails (%s)", label,
                  json_string_value(json_object_get(c, "error")));
        if (st && json_is_true(json_object_get(c, "raised")))
            CHECK_STR_CONTAINS(accel_last_error(), json_string_value(json_object_get(c, "error")));
    }
    free(text);
    free(js);
}

static void test_families(void) {
    json_t *root = load("data/chat_templates/cases.json");
    CHECK(root != NULL);
    if (!root) return;
    json_t *cases = json_object_get(root, "cases"), *convs = json_object_get(root, "conversations"),
           *special = json_object_get(root, "special");
    size_t i, ok = 0;
    json_t *c;
    const char *last = "";
    accel_chat_template *ct = NULL;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "template"));
        if (strcmp(name, last)) {
            char path[256];
            snprintf(path, sizeof path, "data/chat_templates/%s.jinja", name);
            size_t n;
            char *src = read_text(path, &n);
            accel_chat_template_free(ct);
            ct = src ? accel_chat_template_new(src, n) : NULL;
            CHECK_MSG(ct != NULL, "%s: %s", path, accel_last_error());
            free(src);
            last = name;
        }
        if (!ct) continue;
        json_t *conv = json_object_get(convs, json_string_value(json_object_get(c, "conversation")));
        json_t *vars = json_deep_copy(json_object_get(special, name));
        json_object_update(vars, json_object_get(conv, "vars"));
        json_object_set(vars, "messages", json_object_get(conv, "messages"));
        json_object_set(vars, "add_generation_prompt", json_object_get(c, "add_generation_prompt"));
        char label[160];
        snprintf(label, sizeof label, "%s / %s / add_generation_prompt=%d", name,
                 json_string_value(json_object_get(c, "conversation")), json_is_true(json_object_get(c, "add_generation_prompt")));
        int before = check_failures_;
        check_case(ct, vars, c, label);
        ok += check_failures_ == before;
        json_decref(vars);
    }
    fprintf(stderr, "  %zu of %zu family cases as transformers\n", ok, json_array_size(cases));
    accel_chat_template_free(ct);
    json_decref(root);
}

static void test_snippets(void) {
    json_t *root = load("data/chat_templates/snippets.json");
    CHECK(root != NULL);
    if (!root) return;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *src = json_string_value(json_object_get(c, "template"));
        accel_chat_template *ct = accel_chat_template_new(src, strlen(src));
        if (!ct) {
            CHECK_MSG(!json_object_get(c, "expected"), "snippet %zu (%s): %s", i, src, accel_last_error());
            continue;
        }
        /* the snippets read their own variables; messages is required by the API */
        json_t *vars = json_deep_copy(json_object_get(root, "vars"));
        json_object_set_new(vars, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", "x"));
        char label[600];
        snprintf(label, sizeof label, "snippet %zu: %s", i, src);
        check_case(ct, vars, c, label);
        json_decref(vars);
        accel_chat_template_free(ct);
    }
    json_decref(root);
}

static void test_dirs(void) {
    json_t *root = load("data/chat_templates/dirs.json");
    accel_tokenizer *tok = accel_tokenizer_load("data/tokenizers/llama3/tokenizer.json");
    CHECK(root && tok);
    if (!root || !tok) return;
    json_t *msgs = json_object_get(root, "messages");
    size_t n = json_array_size(msgs);
    accel_chat_message m[8];
    for (size_t i = 0; i < n && i < 8; i++)
        m[i] = (accel_chat_message){json_string_value(json_object_get(json_array_get(msgs, i), "role")),
                                    json_string_value(json_object_get(json_array_get(msgs, i), "content"))};
    static const char *const dirs[] = {"config_string", "config_list", "jinja_file"};
    for (int d = 0; d < 3; d++) {
        char path[128];
        snprintf(path, sizeof path, "data/chat_templates/dirs/%s", dirs[d]);
        accel_chat_template *ct = accel_chat_template_load(path);
        CHECK_MSG(ct != NULL, "%s: %s", path, accel_last_error());
        if (!ct) continue;
        json_t *e = json_object_get(root, dirs[d]);
        for (int agp = 0; agp < 2; agp++) {
            char key[24];
            snprintf(key, sizeof key, "text_%d", agp);
            char *text = NULL;
            CHECK(accel_chat_template_render(ct, m, n, agp, &text, NULL) == ACCEL_OK);
            CHECK_MSG(text && !strcmp(text, json_string_value(json_object_get(e, key))), "%s %s:\n%s\nvs\n%s", path, key,
                      text ? text : accel_last_error(), json_string_value(json_object_get(e, key)));
            free(text);
            snprintf(key, sizeof key, "ids_%d", agp);
            json_t *want = json_object_get(e, key);
            int64_t *ids = NULL, nid = 0;
            CHECK(accel_chat_template_encode(ct, tok, m, n, agp, &ids, &nid) == ACCEL_OK);
            bool same = (size_t)nid == json_array_size(want);
            for (int64_t k = 0; same && k < nid; k++) same = ids[k] == json_integer_value(json_array_get(want, (size_t)k));
            CHECK_MSG(same, "%s %s: %lld ids, transformers %zu", path, key, (long long)nid, json_array_size(want));
            free(ids);
        }
        /* with tools: a template list's "tool_use" (config_list), else the default */
        json_t *vars = json_pack("{s:O, s:O, s:b}", "messages", msgs, "tools", json_object_get(root, "tools"),
                                 "add_generation_prompt", 1);
        json_t *c = json_pack("{s:O}", "expected", json_object_get(e, "text_tools"));
        check_case(ct, vars, c, path);
        json_decref(vars);
        json_decref(c);
        accel_chat_template_free(ct);
    }
    accel_tokenizer_free(tok);
    json_decref(root);
}

/* src fails to load (ACCEL_ERR_FORMAT or UNSUPPORTED) with all of the needles in the message. */
static void refused_at_load(const char *src, const char *n1, const char *n2) {
    accel_chat_template *ct = accel_chat_template_new(src, strlen(src));
    CHECK_MSG(ct == NULL, "loaded: %s", src);
    accel_chat_template_free(ct);
    if (ct) return;
    CHECK_MSG(accel_last_status() == ACCEL_ERR_FORMAT || accel_last_status() == ACCEL_ERR_UNSUPPORTED, "%s: %s", src,
              accel_status_name(accel_last_status()));
    CHECK_STR_CONTAINS(accel_last_error(), n1);
    if (n2) CHECK_STR_CONTAINS(accel_last_error(), n2);
}

/* src loads, and its render with one user message fails naming n1 (and n2). */
static void refused_at_render(const char *src, const char *n1, const char *n2) {
    accel_chat_template *ct = accel_chat_template_new(src, strlen(src));
    CHECK_MSG(ct != NULL, "%s: %s", src, accel_last_error());
    if (!ct) return;
    accel_chat_message m = {"user", "hi"};
    char *text = NULL;
    CHECK_MSG(accel_chat_template_render(ct, &m, 1, true, &text, NULL) != ACCEL_OK, "rendered: %s", src);
    CHECK(text == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), n1);
    if (n2) CHECK_STR_CONTAINS(accel_last_error(), n2);
    free(text);
    accel_chat_template_free(ct);
}

/* src loads and renders with one user message to exactly want. */
static void renders_as(const char *src, const char *want) {
    accel_chat_template *ct = accel_chat_template_new(src, strlen(src));
    CHECK_MSG(ct != NULL, "%s: %s", src, accel_last_error());
    if (!ct) return;
    accel_chat_message m = {"user", "hi"};
    char *text = NULL;
    accel_status st = accel_chat_template_render(ct, &m, 1, true, &text, NULL);
    CHECK_MSG(st == ACCEL_OK, "%s: %s", src, accel_last_error());
    if (!st) CHECK_MSG(!strcmp(text, want), "%s:\n got  %s\n want %s", src, text, want);
    free(text);
    accel_chat_template_free(ct);
}

/* A template of prefix, then unit n times, then suffix (malloc'd). */
static char *repeat(const char *prefix, const char *unit, int n, const char *suffix) {
    size_t pl = strlen(prefix), ul = strlen(unit), sl = strlen(suffix);
    char *s = malloc(pl + ul * (size_t)n + sl + 1), *q = s;
    memcpy(q, prefix, pl), q += pl;
    for (int i = 0; i < n; i++) memcpy(q, unit, ul), q += ul;
    memcpy(q, suffix, sl + 1);
    return s;
}

/* A recursive macro whose body is an expression nested 40 deep, called to depth
 * levels: each call nests some 45 evaluation frames (11 levels: just under 500). */
static char *deep_macro(int levels) {
    char head[160];
    snprintf(head, sizeof head, "{%% macro f(n) %%}{%% if n < %d %%}{{ ", levels);
    char *open = repeat(head, "'' ~ (", 40, "f(n + 1)");
    char *src = repeat(open, ")", 40, " }}{% endif %}{% endmacro %}{{ f(0) }}");
    free(open);
    return src;
}

typedef struct render_job {
    const char *src, *want; /* want NULL: refused naming fail */
    const char *fail;
} render_job;

static void *render_job_run(void *arg) {
    const render_job *j = arg;
    if (j->want) renders_as(j->src, j->want);
    else refused_at_render(j->src, j->fail, NULL);
    return NULL;
}

/* Runs the job on a thread with a 2 MiB stack (renders may run on any thread;
 * sanitizers' frames are several times larger, so they get 8 MiB). */
static void on_small_stack(const render_job *j) {
#if defined(__SANITIZE_ADDRESS__)
    size_t stack = (size_t)8 << 20;
#else
    size_t stack = (size_t)2 << 20;
#endif
    pthread_attr_t at;
    pthread_t th;
    CHECK(pthread_attr_init(&at) == 0);
    CHECK(pthread_attr_setstacksize(&at, stack) == 0);
    CHECK(pthread_create(&th, &at, render_job_run, (void *)j) == 0);
    pthread_join(th, NULL);
    pthread_attr_destroy(&at);
}

/* What an adversarial review found: crashes (stack overflow), hangs, quadratic
 * loads and numbers unlike jinja2's. */
static void test_review(void) {
    /* values that contain themselves print as Python prints them */
    renders_as("{% set ns = namespace(a=1) %}{% set ns.x = ns %}{{ ns }}", "<Namespace {'a': 1, 'x': <Namespace {...}>}>");
    renders_as("{% set ns = namespace(l=[]) %}{% set ns.l = [ns] %}{{ ns.l }}", "[<Namespace {'l': [...]}>]");
    /* values nested past the bound: refused by name, not a stack overflow */
    const char *deep = "{% set ns = namespace(x=[]) %}{% for i in range(50000) %}{% set ns.x = [ns.x] %}{% endfor %}";
    const char *uses[] = {"{{ ns.x == ns.x }}", "{{ ns.x < ns.x }}", "{{ ns.x }}", "{{ ns.x | tojson }}", "{{ ns.x in [ns.x] }}"};
    for (size_t i = 0; i < sizeof uses / sizeof *uses; i++) {
        char src[300];
        snprintf(src, sizeof src, "%s%s", deep, uses[i]);
        refused_at_render(src, "nested deeper than 200", NULL);
    }
    /* long left-deep chains the parser builds in a loop: refused where they start */
    const char *links[] = {" + 1", "|trim", "[0]", " and 1", " ~ 1", ".x", "()"};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
        char *src = repeat("\n  {{ 1", links[i], 7000, " }}");
        refused_at_load(src, "nested more than 200 levels", "line 2, column");
        free(src);
    }
    char *ok = repeat("{{ 1", " + 1", 150, " }}");
    renders_as(ok, "151");
    free(ok);
    /* macro calls times expression depth: one bound over both, within a 2 MiB stack */
    char *deep_ok = deep_macro(11), *deep_bad = deep_macro(99);
    on_small_stack(&(render_job){deep_ok, "", NULL});
    on_small_stack(&(render_job){deep_bad, NULL, "evaluation nested deeper than 500"});
    free(deep_ok);
    free(deep_bad);
    /* an empty string or list repeated any number of times: at once */
    renders_as("{{ '' * 9223372036854775807 }}{{ [] * 9223372036854775807 }}{{ 9223372036854775807 * () }}", "[]()");
    /* substring search in linear time. No clock here: the sizes make a naive
     * search ((N - K) K = 1.1e14 byte comparisons: hours) run far past the
     * test's timeout, while memmem's linear one takes milliseconds. */
    renders_as("{% set h = 'a' * 32000000 %}{% set n = 'a' * 4000000 ~ 'b' %}{{ h.find(n) }} {{ h.count(n) }} "
               "{{ n in h }} {{ h.replace(n, '') | length }} {{ h.split(n) | length }} {{ h.rsplit(n) | length }}",
               "-1 0 False 32000000 1 1");
    /* bytes scanned count against the step budget */
    refused_at_render("{% set s = 'a' * 60000000 %}{% for i in range(1000) %}{{ s.count('b') }}{% endfor %}", "10000000 steps", NULL);
    refused_at_render("{% set s = 'a' * 60000000 %}{% for i in range(1000) %}{{ s[5] }}{{ s | length }}{% endfor %}",
                      "10000000 steps", NULL);
    refused_at_render("{% set s = 'a' * 60000000 %}{% for i in range(1000) %}{{ s.startswith(s) }}{{ s == s ~ '' }}{% endfor %}",
                      "10000000 steps", NULL);
    /* hostile JSON variables: a million keys at the top and in a message load in
     * linear time, and tojson sorts them by qsort. No clock: both were quadratic
     * (n^2 / 2 = 5e11 key comparisons: far past the test's timeout). */
    json_t *vars = json_object(), *msg = json_object(), *msgs = json_array();
    char key[32];
    enum { KEYS = 1000000 };
    for (int i = 0; i < KEYS; i++) {
        snprintf(key, sizeof key, "k%d", KEYS - 1 - i);
        json_object_set_new(vars, key, json_integer(i));
        json_object_set_new(msg, key, json_integer(i));
    }
    json_object_set_new(msg, "role", json_string("user"));
    json_object_set_new(msg, "reasoning_content", json_string("r"));
    json_object_set_new(msg, "add_generation_prompt", json_true()); /* a default's name, replaced */
    json_array_append_new(msgs, msg);
    json_object_set_new(vars, "messages", msgs);
    json_object_set_new(vars, "add_generation_prompt", json_true());
    const char *src = "{{ messages[0] | length }} {{ k0 }} {{ messages[0].thinking }} {{ add_generation_prompt }} "
                      "{{ (messages[0] | tojson(sort_keys=true))[:30] }}";
    accel_chat_template *ct = accel_chat_template_new(src, strlen(src));
    char *js = json_dumps(vars, JSON_COMPACT), *text = NULL;
    size_t len = 0;
    CHECK_MSG(ct && accel_chat_template_render_json(ct, js, strlen(js), &text, &len) == ACCEL_OK, "%s", accel_last_error());
    const char *want = "1000004 999999 r True {\"add_generation_prompt\": true";
    if (text) CHECK_MSG(!strcmp(text, want), "got %s", text);
    free(text);
    free(js);
    json_decref(vars);
    accel_chat_template_free(ct);
    /* slices by code point offsets (a value per character made a few MiB fail the
     * memory budget), steps counted without overflow; expectations from jinja2 3.1.6 */
    renders_as("{% set s = 'a\u00e9\u20ac\U0001d11ebc' %}{{ s[1:4] }}|{{ s[::2] }}|{{ s[::-1] }}|{{ s[::-2] }}|{{ s[4:0:-3] }}|"
               "{{ s[1::9223372036854775807] }}|{{ s[-1::-9223372036854775807] }}|{{ [1,2,3,4,5][::-2] }}|"
               "{{ [1,2,3][1::9223372036854775807] }}|{{ s[5:1] }}|{{ s[10:] }}|{{ s[:-1] }}|{{ (1,2,3)[::-9223372036854775807] }}",
               "\u00e9\u20ac\U0001d11e|a\u20acb|cb\U0001d11e\u20ac\u00e9a|c\U0001d11e\u00e9|b\u00e9|\u00e9|c|[5, 3, 1]|[2]|||"
               "a\u00e9\u20ac\U0001d11eb|(3,)");
    renders_as("{% set s = 'x' * 30000000 %}{{ s[:-1] | length }} {{ s[::2] | length }} {{ s[::-1] | length }}",
               "29999999 15000000 30000000");
    /* numbers as jinja2 3.1.6 has them */
    renders_as("{{ (-1) ** 3 }} {{ (-1) ** 4 }} {{ 0 ** 0 }} {{ 0 ** 5 }} {{ 1 ** 99 }} {{ (-2) ** 63 }}|{{ ' 7 ' | int }} "
               "{{ '1_000' | int }} {{ '42.5' | int }} {{ '-42.9' | int }} {{ '1e3' | int }} {{ 'nan' | int }} {{ 'x' | int(5) }} "
               "{{ '0x1f' | int(base=16) }} {{ '1__0' | int }} {{ none | int }} {{ 3.9 | int }} {{ ' 0b101 ' | int(base=2) }}|"
               "{{ ' 2.5 ' | float }} {{ '0x10' | float }} {{ '1_000.5' | float }} {{ 'inf' | float }} {{ '-Infinity' | float }} "
               "{{ '1e' | float }} {{ '.5' | float }} {{ '5.' | float }} {{ none | float }} {{ 3 | float }}|{{ (-4.0) % 2 }} "
               "{{ 7.0 // 0.1 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }} {{ -0.0 // 1 }} {{ 1 // -3.0 }} {{ 5 % -0.5 }} {{ 'inf' | int }}",
               "-1 1 1 0 1 -9223372036854775808|7 1000 42 -42 1000 0 5 31 0 0 3 5|2.5 0.0 1000.5 inf -inf 0.0 0.5 5.0 0.0 3.0|"
               "0.0 69.0 -4.0 -0.5 -0.0 -1.0 -0.0 0");
    /* float()'s and int()'s blanks are ' ' and \t to \r, not str.isspace()'s \x1c-\x1f (refused: the default) */
    renders_as("{{ '\x1c" "5' | float }} {{ '\x1c" "5' | int }} {{ '5\x1f' | float }} {{ '5\x1f' | int }} "
               "{{ '\v5\f' | float }} {{ '\v5\f' | int }} {{ '\t1_0.5 ' | float }} {{ '\t1_0.5 ' | int }}",
               "0.0 0 0.0 0 5.0 5 10.5 10");
    /* int(base=0): the base from the prefix, no leading zeros in base 10 (then float()'s
     * reading, as jinja's int filter falls back to); rsplit's matches are the
     * rightmost ones (overlaps differ from split's) */
    renders_as("{{ '0x1f' | int(base=0) }} {{ '010' | int(base=0) }} {{ '00' | int(base=0) }} {{ '0_0' | int(base=0) }} "
               "{{ '-0b101' | int(base=0) }} {{ ' 12 ' | int(base=0) }} {{ '0o17' | int(base=0) }} {{ '0x' | int(base=0) }} "
               "{{ '12' | int(base=99) }} {{ 'z' | int(base=36) }}|{{ 'aaaa'.rsplit('aa') }} {{ 'aaa'.rsplit('aa') }} "
               "{{ 'a,b,,c,'.rsplit(',') }} {{ 'abcabcab'.rsplit('ab', 2) }} {{ 'x'.rsplit('xy') }} {{ ''.rsplit(',') }} "
               "{{ ',a'.rsplit(',', 0) }}",
               "31 10 0 0 -5 12 15 0 12 35|['', '', ''] ['a', ''] ['a', 'b', '', 'c', ''] ['abc', 'c', ''] ['x'] [''] [',a']");
    /* past 64 bits: refused by name (jinja2 has big integers), not undefined behaviour */
    refused_at_render("{{ 1e300 | int }}", "past 64 bits", NULL);
    refused_at_render("{{ '1e300' | int }}", "past 64 bits", NULL);
    refused_at_render("{{ '99999999999999999999' | int }}", "past 64 bits", NULL);
    refused_at_render("{{ (-9223372036854775807 - 1) | abs }}", "past 64 bits", NULL);
    /* errors of printing and tojson name their line and column */
    refused_at_render("\n {{ x | tojson }}", "line 2, column 7: tojson: Object of type Undefined", NULL);
    refused_at_render("\n{{ 1 }} {{ range(3) | select }}", "line 2, column", "printing a generator");
    /* an integer past 64 bits in the variables: named, not "invalid JSON" */
    const char *big = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"x\": 99999999999999999999}";
    ct = accel_chat_template_new("{{ x }}", 7);
    text = NULL;
    CHECK(ct && accel_chat_template_render_json(ct, big, strlen(big), &text, &len) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "line 1, column 74: an integer past 64 bits");
    CHECK(!strstr(accel_last_error(), "invalid JSON"));
    /* U+0000 in an object key, which jansson does not hold (in a string it renders: cases.json's nul_char) */
    const char *nulkey = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"x\": {\"k\\u0000\": 1}}";
    CHECK(ct && accel_chat_template_render_json(ct, nulkey, strlen(nulkey), &text, &len) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "line 1, column 64: an object key with U+0000 (not implemented) near");
    accel_chat_template_free(ct);
    /* a template list with only "tool_use": taken when tools are given, as transformers does */
    char dir[] = "/tmp/accel_chat_tooluse_XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T{{ tools | length }}\"}]}", f);
        fclose(f);
    }
    ct = accel_chat_template_load(dir);
    CHECK_MSG(ct != NULL, "%s", accel_last_error());
    const char *with = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{}, {}]}";
    const char *without = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}";
    text = NULL;
    CHECK(ct && accel_chat_template_render_json(ct, with, strlen(with), &text, &len) == ACCEL_OK);
    if (text) CHECK_MSG(!strcmp(text, "T2"), "got %s", text);
    free(text);
    text = NULL;
    CHECK(ct && accel_chat_template_render_json(ct, without, strlen(without), &text, &len) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "no tools were given");
    accel_chat_template_free(ct);
    remove(path);
    rmdir(dir);
}

static void test_malformed(void) {
    refused_at_load("{% if x %}a", "'if' is never closed", "line 1, column 4");
    refused_at_load("ok\n{% for m in messages %}\n{% endif %}", "unexpected 'endif'", "line 3, column 4");
    refused_at_load("{{ 1 + }}", "expected an expression", "line 1, column 8");
    refused_at_load("{{ 'abc }}", "never closed", "column 4");
    refused_at_load("{{ a", "never closed", NULL);
    refused_at_load("{# a", "comment that is never closed", NULL);
    refused_at_load("{{ a $ b }}", "unexpected character '$'", NULL);
    refused_at_load("{{ x | nosuchfilter }}", "no filter named 'nosuchfilter'", "column 8");
    refused_at_load("{{ x is nosuchtest }}", "no test named 'nosuchtest'", NULL);
    refused_at_load("{% frobnicate %}", "unknown statement 'frobnicate'", NULL);
    refused_at_load("{% include 'x.jinja' %}", "'include' statement is not implemented", NULL);
    refused_at_load("{% raw %}{{ x }}{% endraw %}", "'raw' statement is not implemented", NULL);
    refused_at_load("{% for x in y recursive %}{% endfor %}", "recursive", NULL);
    refused_at_load("{% break %}", "'break' outside a for loop", NULL);
    refused_at_load("{{ f(*args) }}", "*args", NULL);
    refused_at_load("{{ x | sum }}", "no filter named 'sum'", NULL);
    refused_at_load("{{ '\\N{DASH}' }}", "\\N{...}", NULL);
    refused_at_load("{{ 99999999999999999999 }}", "outside 64 bits", NULL);
    refused_at_load("{{ x is defined is none }}", "chain", NULL);
    refused_at_load("{% macro m(a=1, b) %}{% endmacro %}", "without a default", NULL);
    /* nesting past the parser's limit */
    char deep[1000];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 300; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 300; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    refused_at_load(deep, "nested more than 200 levels", NULL);
    /* not UTF-8 */
    refused_at_load("a\xff", "not UTF-8 at byte 1", NULL);
}

static void test_runtime_errors(void) {
    refused_at_render("{{ raise_exception('Only user and assistant roles are supported!') }}",
                      "raise_exception: Only user and assistant roles are supported!", "line 1, column 4");
    refused_at_render("{{ messages[0].nope.deeper }}", "'nope' is undefined", NULL);
    refused_at_render("{{ undefined_fn() }}", "'undefined_fn' is undefined", NULL);
    refused_at_render("{{ messages | tojson }}{{ x | tojson }}", "tojson", "Undefined");
    refused_at_render("{% set ns = namespace(a=1) %}{% set ns._x = 2 %}", "underscore-prefixed", NULL);
    refused_at_render("{% set d = {} %}{% set d.x = 1 %}", "non-namespace", NULL);
    refused_at_render("{{ messages.update({}) }}", "not implemented", NULL);
    refused_at_render("{{ '%s' % 'x' }}", "string formatting", NULL);
    refused_at_render("{{ loop.index }}", "'loop' is undefined", NULL);
    refused_at_render("{% for a, b in [1] %}{% endfor %}", "cannot unpack", NULL);
    refused_at_render("{{ 9223372036854775807 + 1 }}", "past 64 bits", NULL);
    /* jinja2's other globals exist there (defined, printed as objects): named, not undefined */
    refused_at_render("{% set sep = joiner(', ') %}", "line 1, column 14: jinja2's global 'joiner' is not implemented", NULL);
    refused_at_render("{{ cycler is defined }}", "jinja2's global 'cycler'", NULL);
    refused_at_render("{{ lipsum }}", "jinja2's global 'lipsum'", NULL);
    refused_at_render("{{ self }}", "jinja2's global 'self'", NULL);
    renders_as("{% set cycler = 'mine' %}{{ cycler }}", "mine"); /* a template's own name first */
    /* runaway work: loop turns, recursion, text, values */
    refused_at_render("{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}", "10000000 steps",
                      "runaway");
    refused_at_render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper than 100", NULL);
    refused_at_render("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "would pass 64 MiB", NULL);
    refused_at_render("{{ 'x' * 100000000 }}", "more than 64 MiB", NULL);
    refused_at_render("{% set ns = namespace(s='x') %}{% for a in range(100000) %}{% set ns.s = ns.s ~ ns.s[:5000] %}{% endfor %}",
                      "MiB of values", NULL);
}

static void test_api(void) {
    accel_chat_message m = {"user", "hi"};
    char *text = (char *)1;
    const char *src = "{{ messages[0].content }}";
    accel_chat_template *ct = accel_chat_template_new(src, strlen(src));
    CHECK(ct != NULL);
    CHECK(accel_chat_template_render(NULL, &m, 1, true, &text, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_chat_template_render(ct, &m, 0, true, &text, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "empty conversation");
    CHECK(text == NULL);
    accel_chat_message bad = {"user", "\xc3("};
    CHECK(accel_chat_template_render(ct, &bad, 1, true, &text, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "msgs[0].content is not UTF-8");
    accel_chat_message null_role = {NULL, "x"};
    CHECK(accel_chat_template_render(ct, &null_role, 1, true, &text, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_chat_template_render_json(ct, "[1]", 3, &text, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_chat_template_render_json(ct, "{\"messages\": [1]}", 17, &text, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "messages[0]");
    CHECK(accel_chat_template_render_json(ct, "{", 1, &text, NULL) == ACCEL_ERR_FORMAT);
    /* continue_final_message's refusals (its renders are in cases.json) */
    static const struct {
        const char *vars, *msg;
    } cont[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"continue_final_message\": true, "
         "\"add_generation_prompt\": true}", "not compatible"},
        {"{\"messages\": [{\"role\": \"user\"}], \"continue_final_message\": true}", "has no \"content\" to continue"},
        {"{\"messages\": [{\"role\": \"user\", \"name\": \"x\"}], \"continue_final_message\": \"name\"}",
         "not an accepted field"},
        {"{\"messages\": [{\"role\": \"user\", \"thinking\": \"x\"}], \"continue_final_message\": \"thinking\"}",
         "not implemented"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}], \"continue_final_message\": true}",
         "no content block"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}], \"continue_final_message\": true}", "is not a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"continue_final_message\": 3}", "boolean or a key"},
        /* a key with U+0000 is not "content" (the message's keys cannot hold one), said as such */
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"continue_final_message\": \"content\\u0000x\"}",
         "continue_final_message=\"content...\" holds U+0000"},
    };
    for (size_t i = 0; i < sizeof cont / sizeof *cont; i++) {
        CHECK(accel_chat_template_render_json(ct, cont[i].vars, strlen(cont[i].vars), &text, NULL) != ACCEL_OK && !text);
        CHECK_STR_CONTAINS(accel_last_error(), cont[i].msg);
    }
    /* tools and documents as render_jinja_template checks them: lists of dicts; an empty
     * string or object iterates as nothing (tools then is []) */
    const char *td = "{{ tools | tojson }} {{ documents | tojson }}";
    accel_chat_template *ctd = accel_chat_template_new(td, strlen(td));
    static const struct {
        const char *extra, *want; /* want: the text, or a piece of the error */
        bool ok;
    } tdc[] = {
        {"\"tools\": \"\"", "[] null", true},
        {"\"tools\": {}", "[] null", true},
        {"\"documents\": \"\", \"tools\": [{}]", "[{}] \"\"", true},
        {"\"documents\": {}", "null {}", true},
        {"\"tools\": {\"type\": \"function\"}", "tools must be a list of dicts, not a JSON object (its keys", false},
        {"\"tools\": [{}, \"f\"]", "tools[1] is not a dict", false},
        {"\"tools\": \"get_weather\"", "not a JSON string (its characters", false},
        {"\"tools\": 3", "tools must be a list of dicts, not a JSON number", false},
        {"\"documents\": [\"x\"]", "documents[0] is not a dict", false},
        {"\"documents\": true", "documents must be a list of dicts, not a JSON boolean", false},
    };
    for (size_t i = 0; ctd && i < sizeof tdc / sizeof *tdc; i++) {
        char vars[256];
        snprintf(vars, sizeof vars, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s}", tdc[i].extra);
        accel_status s = accel_chat_template_render_json(ctd, vars, strlen(vars), &text, NULL);
        if (tdc[i].ok) CHECK_MSG(!s && !strcmp(text, tdc[i].want), "%s: %s", vars, s ? accel_last_error() : text);
        else {
            CHECK_MSG(s == ACCEL_ERR_INVALID_ARG, "%s: rendered", vars);
            CHECK_STR_CONTAINS(accel_last_error(), tdc[i].want);
        }
        free(text);
        text = NULL;
    }
    CHECK(ctd != NULL);
    accel_chat_template_free(ctd);
    /* a template that drops the message: the continued text is not in the rendering */
    const char *drop = "{{ messages[0].role }} content";
    accel_chat_template *ct3 = accel_chat_template_new(drop, strlen(drop));
    const char *dv = "{\"messages\": [{\"role\": \"user\", \"content\": \"gone\"}], \"continue_final_message\": true}";
    CHECK(ct3 && accel_chat_template_render_json(ct3, dv, strlen(dv), &text, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "does not appear in the chat");
    accel_chat_template_free(ct3);
    /* the whole continued text is looked for, past a U+0000 in it (transformers: "ab\0c" is not in "ab\0") */
    const char *dropc = "{{ messages[0].content | replace('c', '') }}";
    ct3 = accel_chat_template_new(dropc, strlen(dropc));
    const char *nv = "{\"messages\": [{\"role\": \"user\", \"content\": \"ab\\u0000c\"}], \"continue_final_message\": true}";
    CHECK(ct3 && accel_chat_template_render_json(ct3, nv, strlen(nv), &text, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "does not appear in the chat");
    accel_chat_template_free(ct3);
    size_t len = 0;
    CHECK(accel_chat_template_render(ct, &m, 1, true, &text, &len) == ACCEL_OK);
    CHECK(text && !strcmp(text, "hi") && len == 2);
    free(text);
    /* strftime_now: today's date, as datetime.now().strftime */
    const char *st = "{{ strftime_now('%Y') | length }}";
    accel_chat_template *ct2 = accel_chat_template_new(st, strlen(st));
    CHECK(ct2 && accel_chat_template_render(ct2, &m, 1, false, &text, NULL) == ACCEL_OK && !strcmp(text, "4"));
    free(text);
    accel_chat_template_free(ct2);
    accel_chat_template_free(ct);
    accel_chat_template_free(NULL);
    CHECK(accel_chat_template_new(NULL, 0) == NULL);
    CHECK(accel_chat_template_load(NULL) == NULL);
    CHECK(accel_chat_template_load("data/chat_templates") == NULL); /* no config, no template */
    CHECK_STR_CONTAINS(accel_last_error(), "has no chat template");
    CHECK(accel_chat_template_load("data/tokenizers/llama3") == NULL);
    /* a folder that is not there (a typo) or a file is named as such, not as a
     * folder without a template */
    accel_clear_error();
    CHECK(accel_chat_template_load("data/no_such_model") == NULL && accel_last_status() == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "data/no_such_model: no such directory");
    CHECK(accel_chat_template_load("data/chat_templates/chatml.jinja") == NULL &&
          accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "chatml.jinja: not a directory (a model folder)");
    accel_clear_error();
}

/* Every truncation and 400 random byte flips, insertions and deletions of each family
 * template: a named error at load or render, or text; never a crash, hang or leak (ASan,
 * valgrind). */
static void test_mutations(void) {
    static const char *const names[] = {"llama3_1", "qwen3", "gemma3", "zephyr", "mistral_instruct"};
    const char *vars = "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": "
                       "\"u\"}, {\"role\": \"assistant\", \"content\": \"<think>r</think>a\"}], \"tools\": [{\"type\": "
                       "\"function\", \"function\": {\"name\": \"f\"}}], \"add_generation_prompt\": true}";
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    size_t loaded = 0, rendered = 0, tries = 0;
    for (size_t t = 0; t < sizeof names / sizeof *names; t++) {
        char path[128];
        snprintf(path, sizeof path, "data/chat_templates/%s.jinja", names[t]);
        size_t n;
        char *src = read_text(path, &n);
        CHECK(src != NULL);
        if (!src) continue;
        char *buf = malloc(n + 16);
        for (size_t k = 0; k < n + 400; k++) {
            size_t m;
            if (k < n) { /* every truncation */
                memcpy(buf, src, k);
                m = k;
            } else {
                memcpy(buf, src, n);
                m = n;
                for (int e = 0; e < 3; e++) {
                    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                    size_t at = (size_t)(rng >> 8) % m;
                    static const char bytes[] = "{}%#-+()[]|.,'\"\\ \nxa0=~*:";
                    char b = (rng & 3) ? bytes[(rng >> 40) % (sizeof bytes - 1)] : (char)(rng >> 48);
                    if ((rng >> 4) % 3 == 0) buf[at] = b;
                    else if ((rng >> 4) % 3 == 1 && m > 1) memmove(buf + at, buf + at + 1, m - at - 1), m--;
                    else memmove(buf + at + 1, buf + at, m - at), buf[at] = b, m++;
                }
            }
            tries++;
            accel_chat_template *ct = accel_chat_template_new(buf, m);
            if (!ct) {
                CHECK(strstr(accel_last_error(), "chat template: ") != NULL);
                continue;
            }
            loaded++;
            char *text = NULL;
            if (accel_chat_template_render_json(ct, vars, strlen(vars), &text, NULL) == ACCEL_OK) rendered++;
            else CHECK(strstr(accel_last_error(), "chat template") != NULL);
            free(text);
            accel_chat_template_free(ct);
        }
        free(buf);
        free(src);
    }
    fprintf(stderr, "  %zu mutated templates: %zu loaded, %zu rendered\n", tries, loaded, rendered);
}

/* generate --chat: the prompt is the chat template's encoding of the messages. */
static void test_generate_chat(void) {
    char gen[8192], dir[] = "/tmp/accel_chat_model_XXXXXX", cmd[16384], out[8192];
    if (!sibling_exe("generate", gen, sizeof gen)) {
        CHECK(!"generate is built next to the tests");
        return;
    }
    CHECK_MSG(tok_tiny_model(dir, 902), "%s: %s", dir, accel_last_error());
    snprintf(cmd, sizeof cmd, "cp data/tokenizers/llama3/tokenizer.json data/chat_templates/dirs/jinja_file/* %s/ && "
             "%s %s --system 'Be brief.' --chat 'Hi there' --new-tokens 2 2>&1", dir, gen, dir);
    CHECK(tok_shell(cmd, out, sizeof out) == 0);
    accel_tokenizer *tok = accel_tokenizer_load(dir);
    accel_chat_template *ct = accel_chat_template_load(dir);
    accel_chat_message m[2] = {{"system", "Be brief."}, {"user", "Hi there"}};
    int64_t *ids = NULL, n = 0;
    CHECK(tok && ct && accel_chat_template_encode(ct, tok, m, 2, true, &ids, &n) == ACCEL_OK && n > 10);
    char want[4096] = "generated_ids=[";
    for (int64_t i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%lld, ", (long long)ids[i]);
    CHECK_STR_CONTAINS(out, want);
    /* BOS (special) is skipped in the text; the fixture tokenizer has no header tokens, so they are text */
    CHECK_STR_CONTAINS(out, "text=\"<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|start_header_id|>user");
    free(ids);
    accel_chat_template_free(ct);
    accel_tokenizer_free(tok);
    snprintf(cmd, sizeof cmd, "rm %s/chat_template.jinja %s/tokenizer_config.json && %s %s --chat hi 2>&1", dir, dir, gen, dir);
    CHECK(tok_shell(cmd, out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "generate: --chat: accel_chat_template_load:");
    CHECK_STR_CONTAINS(out, "has no chat template");
    snprintf(cmd, sizeof cmd, "%s %s --system x --prompt hi 2>&1; rc=$?; rm -rf %s; exit $rc", gen, dir, dir);
    CHECK(tok_shell(cmd, out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "usage: generate DIR [--prompt TEXT | --chat TEXT [--system TEXT]");
}

/* examples/chat_template: the text of dirs.json's jinja_file folder, its ids with
 * --ids, a template file, and a malformed one refused with its position. */
static void test_example(void) {
    char exe[8192], cmd[16384], out[8192];
    if (!sibling_exe("chat_template", exe, sizeof exe)) {
        CHECK(!"chat_template is built next to the tests");
        return;
    }
    json_t *root = load("data/chat_templates/dirs.json");
    if (!root) return;
    json_t *vars = json_pack("{s:O, s:b}", "messages", json_object_get(root, "messages"), "add_generation_prompt", 1);
    CHECK(json_dump_file(vars, "/tmp/accel_chat_vars.json", 0) == 0);
    json_t *e = json_object_get(root, "jinja_file");
    snprintf(cmd, sizeof cmd, "%s data/chat_templates/dirs/jinja_file < /tmp/accel_chat_vars.json", exe);
    CHECK(tok_shell(cmd, out, sizeof out) == 0);
    CHECK_MSG(!strcmp(out, json_string_value(json_object_get(e, "text_1"))), "%s", out);
    /* --ids: the folder needs a tokenizer; the jinja_file fixture's ids are llama3's */
    char dir[] = "/tmp/accel_chat_ids_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "cp data/tokenizers/llama3/tokenizer.json data/chat_templates/dirs/jinja_file/* %s/ && "
             "%s %s --ids < /tmp/accel_chat_vars.json", dir, exe, dir);
    CHECK(tok_shell(cmd, out, sizeof out) == 0);
    char want[4096] = "";
    size_t i;
    json_t *id;
    json_array_foreach(json_object_get(e, "ids_1"), i, id)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? " " : "", (long long)json_integer_value(id));
    strcat(want, "\n");
    CHECK_MSG(!strcmp(out, want), "%s vs %s", out, want);
    snprintf(cmd, sizeof cmd, "rm -rf %s; %s --template data/chat_templates/chatml.jinja < /tmp/accel_chat_vars.json", dir, exe);
    CHECK(tok_shell(cmd, out, sizeof out) == 0);
    CHECK_STR_CONTAINS(out, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there");
    FILE *f = fopen("/tmp/accel_chat_bad.jinja", "w");
    if (f) fputs("line one\n{% for m in messages %}\n{{ m.role }\n", f), fclose(f);
    snprintf(cmd, sizeof cmd, "%s --template /tmp/accel_chat_bad.jinja < /tmp/accel_chat_vars.json 2>&1; rc=$?; "
             "rm -f /tmp/accel_chat_bad.jinja /tmp/accel_chat_vars.json; exit $rc", exe);
    CHECK(tok_shell(cmd, out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "chat_template: chat template: line 3, column 3: a tag that is never closed (expected '}}')");
    json_decref(vars);
    json_decref(root);
}

int main(void) {
    RUN(test_families);
    RUN(test_snippets);
    RUN(test_dirs);
    RUN(test_malformed);
    RUN(test_runtime_errors);
    RUN(test_review);
    RUN(test_api);
    RUN(test_mutations);
    RUN(test_generate_chat);
    RUN(test_example);
    return check_summary();
}
