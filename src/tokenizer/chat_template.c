/* Chat templates (include/accel/tokenizer.h): a model folder's template and special
 * tokens found as transformers 5 finds them, the template variables built as
 * apply_chat_template builds them, the text rendered by jinja_eval.c and encoded
 * by the model's tokenizer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "../io/io_internal.h"
#include "jinja_internal.h"
#include "tok_internal.h"

/* transformers' SPECIAL_TOKENS_ATTRIBUTES: what its special_tokens_map holds */
static const char *const SPECIAL[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};
#define N_SPECIAL (sizeof SPECIAL / sizeof *SPECIAL)

struct accel_chat_template {
    jtemplate *tmpl;     /* the default template */
    jtemplate *tool_use; /* a template list's "tool_use", chosen when tools are given; NULL when none */
    char *special[N_SPECIAL]; /* NULL: not set */
};

void accel_chat_template_free(accel_chat_template *ct) {
    if (!ct) return;
    jinja_free(ct->tmpl);
    jinja_free(ct->tool_use);
    for (size_t i = 0; i < N_SPECIAL; i++) free(ct->special[i]);
    free(ct);
}

accel_chat_template *accel_chat_template_new(const char *source, size_t n) {
    if (!source) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_chat_template_new: source is NULL");
        return NULL;
    }
    accel_chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) {
        accel_set_error(ACCEL_ERR_OOM, "accel_chat_template_new: out of memory");
        return NULL;
    }
    if (!(ct->tmpl = jinja_parse(source, n))) {
        free(ct);
        return NULL;
    }
    return ct;
}

/* A template from a string, the error prefixed with where it came from. */
static jtemplate *parse_from(const char *where, const char *src, size_t n) {
    jtemplate *t = jinja_parse(src, n);
    if (!t) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", accel_last_error());
        accel_set_error(accel_last_status(), "%s: %s", where, msg);
    }
    return t;
}

/* tokenizer_config.json's chat_template: a string, or [{name, template}, ...]. */
static accel_status config_template(accel_chat_template *ct, const char *path, json_t *v) {
    char where[4200];
    snprintf(where, sizeof where, "%s: chat_template", path);
    if (json_is_string(v)) {
        ct->tmpl = parse_from(where, json_string_value(v), json_string_length(v));
        return ct->tmpl ? ACCEL_OK : accel_last_status();
    }
    if (!json_is_array(v))
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: must be a string or a list of {name, template}, not a JSON %s", where,
                               json_is_object(v) ? "object" : json_is_null(v) ? "null" : "scalar");
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
        if (!json_is_string(nm) || !json_is_string(tp))
            return accel_set_error(ACCEL_ERR_FORMAT, "%s[%zu]: must be an object with string \"name\" and \"template\"", where, i);
        jtemplate **slot = !strcmp(json_string_value(nm), "default") ? &ct->tmpl :
                           !strcmp(json_string_value(nm), "tool_use") ? &ct->tool_use : NULL;
        if (!slot) continue; /* other named templates are only chosen by name, which accel does not offer */
        char w[4300];
        snprintf(w, sizeof w, "%s[%zu] (\"%s\")", where, i, json_string_value(nm));
        jinja_free(*slot);
        if (!(*slot = parse_from(w, json_string_value(tp), json_string_length(tp)))) return accel_last_status();
    }
    /* transformers takes "tool_use" when tools are given, else "default": a list with
     * only "tool_use" renders conversations with tools (render() refuses the others) */
    if (!ct->tmpl && !ct->tool_use)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s: a list of templates with none named \"default\" or \"tool_use\" "
                                                 "(transformers then asks for a name; accel renders only those)", where);
    return ACCEL_OK;
}

static accel_status config_special(accel_chat_template *ct, const char *path, json_t *cfg) {
    for (size_t i = 0; i < N_SPECIAL; i++) {
        json_t *v = json_object_get(cfg, SPECIAL[i]);
        if (!v || json_is_null(v)) continue;
        if (json_is_object(v)) v = json_object_get(v, "content"); /* an AddedToken */
        if (!json_is_string(v))
            return accel_set_error(ACCEL_ERR_FORMAT, "%s: %s: must be a string or an AddedToken with a string \"content\"",
                                   path, SPECIAL[i]);
        if (!(ct->special[i] = strdup(json_string_value(v))))
            return accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", path);
    }
    return ACCEL_OK;
}

/* dir is a folder: one that is not there (a typo) or a file is named as such,
 * not as a folder without a chat template. */
static bool is_model_dir(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb)) {
        accel_set_error(ACCEL_ERR_IO, "accel_chat_template_load: %s: %s", dir,
                        errno == ENOENT ? "no such directory" : strerror(errno));
        return false;
    }
    if (!S_ISDIR(sb.st_mode)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_chat_template_load: %s: not a directory (a model folder)", dir);
        return false;
    }
    return true;
}

accel_chat_template *accel_chat_template_load(const char *dir) {
    if (!dir) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_chat_template_load: dir is NULL");
        return NULL;
    }
    if (!is_model_dir(dir)) return NULL;
    accel_chat_template *ct = calloc(1, sizeof *ct);
    size_t dn = strlen(dir);
    char *cfg_path = malloc(dn + 32), *jinja_path = malloc(dn + 32);
    if (!ct || !cfg_path || !jinja_path) {
        free(ct), free(cfg_path), free(jinja_path);
        accel_set_error(ACCEL_ERR_OOM, "accel_chat_template_load: out of memory");
        return NULL;
    }
    snprintf(cfg_path, dn + 32, "%s/tokenizer_config.json", dir);
    snprintf(jinja_path, dn + 32, "%s/chat_template.jinja", dir);
    accel_status st = ACCEL_OK;
    json_t *cfg = NULL;
    if (access(cfg_path, F_OK) == 0) {
        cfg = accel__json_load_file(cfg_path);
        if (!cfg) st = accel_last_status();
        else if (!json_is_object(cfg))
            st = accel_set_error(ACCEL_ERR_FORMAT, "%s: must be a JSON object", cfg_path);
        else
            st = config_special(ct, cfg_path, cfg);
    }
    if (!st && access(jinja_path, F_OK) == 0) {
        /* transformers 5: a chat_template.jinja beside the config takes priority */
        size_t n;
        char *src = accel__read_regular_file(jinja_path, "a template file", &n);
        if (!src) st = accel_last_status();
        else {
            ct->tmpl = parse_from(jinja_path, src, n);
            accel_free(src);
            if (!ct->tmpl) st = accel_last_status();
        }
    } else if (!st) {
        json_t *v = cfg ? json_object_get(cfg, "chat_template") : NULL;
        if (!v || json_is_null(v))
            st = accel_set_error(ACCEL_ERR_INVALID_ARG,
                                 "accel_chat_template_load: %s has no chat template (no chat_template.jinja, and %s)", dir,
                                 cfg ? "tokenizer_config.json has no \"chat_template\"" : "no tokenizer_config.json");
        else
            st = config_template(ct, cfg_path, v);
    }
    json_decref(cfg);
    free(cfg_path), free(jinja_path);
    if (st) {
        accel_chat_template_free(ct);
        return NULL;
    }
    return ct;
}

/* ------------------------------------------------------------ the variables */

static bool from_json(jctx *c, json_t *j, jv *out) {
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_none(); return true;
    case JSON_TRUE: *out = jv_bool(true); return true;
    case JSON_FALSE: *out = jv_bool(false); return true;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return true;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return true;
    case JSON_STRING: return jv_strdup(c, json_string_value(j), json_string_length(j), out);
    case JSON_ARRAY: {
        jlist *l = jv_list_new(c, json_array_size(j));
        if (!l) return false;
        for (size_t i = 0; i < l->n; i++)
            if (!from_json(c, json_array_get(j, i), &l->v[i])) return false;
        *out = (jv){.k = JV_LIST, .l = l};
        return true;
    }
    case JSON_OBJECT: {
        jdict *d = jv_dict_new(c);
        const char *k;
        json_t *v;
        if (!d) return false;
        /* the parser refused duplicate keys: appending keeps a large object linear */
        json_object_foreach(j, k, v) {
            jv key, val;
            if (!jv_strdup(c, k, strlen(k), &key) || !from_json(c, v, &val) || !jv_dict_append(c, d, key, val)) return false;
        }
        *out = (jv){.k = JV_DICT, .d = d};
        return true;
    }
    }
    return false;
}

/* Adds a JSON object's key to d, whose first npre entries were set before it (defaults,
 * derived keys): only those can already hold the key, the object's own keys being
 * unique, so the search stays within them and a hostile object with a million keys
 * loads in linear time (jv_dict_set searches the whole dict). */
static bool set_json_key(jctx *c, jdict *d, size_t npre, jv key, jv val) {
    for (size_t i = 0; i < npre; i++)
        if (jv_equal(d->key[i], key) == 1) {
            d->val[i] = val;
            return true;
        }
    return jv_dict_append(c, d, key, val);
}

/* A message as transformers hands it to the template: null-valued keys dropped,
 * and reasoning (reasoning_content, thinking or reasoning, the first not null) also
 * under "thinking" (first) and "reasoning_content" (last, or where it was). */
static bool message(jctx *c, json_t *m, jv *out) {
    jdict *d = jv_dict_new(c);
    if (!d) return false;
    json_t *reasoning = NULL;
    static const char *const names[] = {"reasoning_content", "thinking", "reasoning"};
    for (size_t i = 0; i < 3 && !reasoning; i++) {
        json_t *r = json_object_get(m, names[i]);
        if (r && !json_is_null(r)) reasoning = r;
    }
    jv rv;
    if (reasoning && (!from_json(c, reasoning, &rv) || !jv_dict_set(c, d, jv_str("thinking", 8), rv))) return false;
    size_t npre = d->n;
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (json_is_null(v)) continue;
        jv key, val;
        if (!jv_strdup(c, k, strlen(k), &key) || !from_json(c, v, &val) || !set_json_key(c, d, npre, key, val)) return false;
    }
    if (reasoning && !jv_dict_set(c, d, jv_str("reasoning_content", 17), rv)) return false;
    *out = (jv){.k = JV_DICT, .d = d};
    return true;
}

/* transformers' continue_final_message: the last message's text gets a tag appended
 * before the render and the rendering is cut where the tag lands, so the prompt ends
 * inside that message for the model to continue. */
#define CONTINUE_TAG "CONTINUE_FINAL_MESSAGE_TAG "

/* Python's truth of a JSON value. */
static bool json_truthy(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_TRUE: return true;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_OBJECT: return json_object_size(v) > 0;
    default: return false;
    }
}

/* Tags the final message of ctx (owned, changed in place); *final: the text that was
 * continued (a reference the caller drops), NULL when "continue_final_message" is
 * absent or false. */
static accel_status continue_prepare(const jtemplate *t, json_t *ctx, json_t **final) {
    json_t *opt = json_object_get(ctx, "continue_final_message");
    *final = NULL;
    if (!opt || json_is_false(opt) || json_is_null(opt)) return ACCEL_OK;
    if (!json_is_true(opt) && !json_is_string(opt))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: continue_final_message must be a boolean or a key");
    const char *field = json_is_string(opt) ? json_string_value(opt) : "content";
    if (!strcmp(field, "reasoning_content") || !strcmp(field, "thinking") || !strcmp(field, "reasoning"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "chat template: continue_final_message=\"%s\" (a reasoning field) is not "
                               "implemented", field);
    json_t *agp = json_object_get(ctx, "add_generation_prompt");
    if (agp && json_truthy(agp))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: continue_final_message and add_generation_prompt are not "
                               "compatible");
    json_t *msgs = json_object_get(ctx, "messages"), *last = json_array_get(msgs, json_array_size(msgs) - 1);
    /* a key holding U+0000 is none of the message's: jansson refuses one in an object key */
    if (json_is_string(opt) && strlen(field) != json_string_length(opt))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: continue_final_message=\"%s...\" holds U+0000, which "
                               "no message key holds", field);
    json_t *v = json_object_get(last, field);
    if (!v || json_is_null(v))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "chat template: continue_final_message is set but the final message has no \"%s\" to continue", field);
    if (!memmem(t->src, t->n, field, strlen(field)))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: continue_final_message is set to \"%s\" but this is not an "
                               "accepted field in the chat template", field);
    json_t *holder = last;
    const char *key = field;
    if (json_is_array(v)) { /* the last content block with a text */
        holder = NULL;
        for (size_t i = json_array_size(v); i-- > 0 && !holder;)
            if (json_object_get(json_array_get(v, i), "text")) holder = json_array_get(v, i);
        if (!holder)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: continue_final_message is set but no content block of the "
                                   "final message has a text to continue");
        key = "text";
        v = json_object_get(holder, "text");
    }
    if (!json_is_string(v))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: continue_final_message: the final message's \"%s\" is not a "
                               "string", key);
    size_t n = json_string_length(v);
    char *tagged = malloc(n + sizeof CONTINUE_TAG);
    if (!tagged) return accel_set_error(ACCEL_ERR_OOM, "chat template: out of memory");
    memcpy(tagged, json_string_value(v), n);
    memcpy(tagged + n, CONTINUE_TAG, sizeof CONTINUE_TAG);
    json_incref(v); /* the untagged text stays alive for continue_finish */
    int bad = json_object_set_new(holder, key, json_stringn(tagged, n + sizeof CONTINUE_TAG - 1));
    free(tagged);
    if (bad) {
        json_decref(v);
        return accel_set_error(ACCEL_ERR_OOM, "chat template: out of memory");
    }
    json_object_del(ctx, "continue_final_message"); /* an option of the call, not a template variable */
    *final = v;
    return ACCEL_OK;
}

/* Cuts text (n bytes) where the tag landed; the continued text must be in it. */
static accel_status continue_finish(const char *final, size_t final_n, char *text, size_t *n) {
    size_t a = 0, b = final_n;
    uint32_t cp;
    for (size_t l; a < b && (l = tok_utf8_next(final + a, b - a, &cp)) && jv_py_isspace(cp);) a += l;
    while (b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)final[j] & 0xC0) == 0x80) j--;
        if (!tok_utf8_next(final + j, b - j, &cp) || !jv_py_isspace(cp)) break;
        b = j;
    }
    static const char tag[] = "CONTINUE_FINAL_MESSAGE_TAG";
    const char *at = NULL;
    for (const char *p = text; (p = memmem(p, *n - (size_t)(p - text), tag, sizeof tag - 1)); p++) at = p;
    if (!at || (b > a && !memmem(text, *n, final + a, b - a)))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: continue_final_message is set but the final message does not "
                               "appear in the chat after applying the chat template");
    size_t cut = (size_t)(at - text);
    if (!(cut + sizeof CONTINUE_TAG - 1 <= *n && !memcmp(at, CONTINUE_TAG, sizeof CONTINUE_TAG - 1))) {
        /* the template trimmed the message's trailing space: trim what is before the tag too */
        while (cut > 0) {
            size_t j = cut - 1;
            while (j > 0 && ((unsigned char)text[j] & 0xC0) == 0x80) j--;
            if (!tok_utf8_next(text + j, cut - j, &cp) || !jv_py_isspace(cp)) break;
            cut = j;
        }
    }
    text[cut] = 0;
    *n = cut;
    return ACCEL_OK;
}

/* render_jinja_template's checks of "tools" and "documents" in ctx (changed): each is
 * iterated and every item must be a dict (a JSON schema; a document). A string or an
 * object iterates as its characters or keys, so only an empty one passes, and tools
 * then becomes the empty list transformers builds from it (documents stay as given). */
static accel_status check_list_of_dicts(json_t *ctx, const char *key) {
    json_t *v = json_object_get(ctx, key);
    if (!v || json_is_null(v)) return ACCEL_OK;
    bool tools = !strcmp(key, "tools");
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!json_is_object(json_array_get(v, i)))
                return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: %s[%zu] is not a dict (%s)", key, i,
                                       tools ? "a tool is a JSON schema" : "a document is a dict with 'title' and 'text' keys");
        return ACCEL_OK;
    }
    bool empty = json_is_string(v) ? !json_string_length(v) : json_is_object(v) ? !json_object_size(v) : false;
    if (!json_is_string(v) && !json_is_object(v))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: %s must be a list of dicts, not a JSON %s", key,
                               json_is_boolean(v) ? "boolean" : "number");
    if (!empty)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: %s must be a list of dicts, not a JSON %s (its %s are "
                               "not dicts)", key, json_is_string(v) ? "string" : "object", json_is_string(v) ? "characters" : "keys");
    if (tools && json_object_set_new(ctx, key, json_array()))
        return accel_set_error(ACCEL_ERR_OOM, "chat template: out of memory");
    return ACCEL_OK;
}

/* Renders over the JSON object ctx (owned by the caller, changed). */
static accel_status render(const accel_chat_template *ct, json_t *ctx, char **text, size_t *len) {
    if (!json_is_object(ctx)) return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: the variables must be a JSON object");
    json_t *msgs = json_object_get(ctx, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "chat template: \"messages\" must be a non-empty list (cannot apply a chat template to an empty "
                               "conversation)");
    for (size_t i = 0; i < json_array_size(msgs); i++)
        if (!json_is_object(json_array_get(msgs, i)))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: messages[%zu] must be an object (a dict)", i);
    accel_status lst = check_list_of_dicts(ctx, "tools");
    if (lst || (lst = check_list_of_dicts(ctx, "documents"))) return lst;
    json_t *tools = json_object_get(ctx, "tools");
    const jtemplate *t = ct->tool_use && tools && !json_is_null(tools) ? ct->tool_use : ct->tmpl;
    if (!t)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "chat template: the model's template list has only \"tool_use\", "
                                                      "and no tools were given (transformers: multiple chat templates with "
                                                      "no default specified)");
    json_t *final;
    accel_status cst = continue_prepare(t, ctx, &final);
    if (cst) return cst;
    jctx c = {.arena = accel_arena_create(1 << 16), .mem_limit = JINJA_MAX_MEMORY};
    if (!c.arena) {
        json_decref(final);
        return accel_propagate_error(ACCEL_ERR_OOM, "chat template: out of memory");
    }
    jdict *vars = jv_dict_new(&c);
    bool ok = vars != NULL;
    for (size_t i = 0; ok && i < N_SPECIAL; i++)
        if (ct->special[i]) ok = jv_dict_set(&c, vars, jv_str(SPECIAL[i], strlen(SPECIAL[i])), jv_str(ct->special[i], strlen(ct->special[i])));
    ok = ok && jv_dict_set(&c, vars, jv_str("tools", 5), jv_none()) && jv_dict_set(&c, vars, jv_str("documents", 9), jv_none()) &&
         jv_dict_set(&c, vars, jv_str("add_generation_prompt", 21), jv_bool(false));
    size_t npre = ok ? vars->n : 0;
    const char *k;
    json_t *v;
    json_object_foreach(ctx, k, v) {
        if (!ok) break;
        jv key, val;
        if (!jv_strdup(&c, k, strlen(k), &key)) ok = false;
        else if (!strcmp(k, "messages")) {
            jlist *l = jv_list_new(&c, json_array_size(v));
            ok = l != NULL;
            for (size_t i = 0; ok && i < l->n; i++) ok = message(&c, json_array_get(v, i), &l->v[i]);
            val = (jv){.k = JV_LIST, .l = l};
        } else
            ok = from_json(&c, v, &val);
        ok = ok && set_json_key(&c, vars, npre, key, val);
    }
    size_t n = 0;
    accel_status st = ok ? jinja_render(t, &c, vars, text, &n) : accel_last_status();
    accel_arena_destroy(c.arena);
    if (!st && final && (st = continue_finish(json_string_value(final), json_string_length(final), *text, &n))) {
        free(*text);
        *text = NULL;
    }
    json_decref(final);
    if (!st && len) *len = n;
    return st;
}

accel_status accel_chat_template_render_json(const accel_chat_template *ct, const char *json, size_t n, char **text,
                                             size_t *len) {
    if (!ct || !json || !text)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_chat_template_render_json: %s is NULL",
                               !ct ? "the template" : !json ? "json" : "text");
    *text = NULL;
    /* Python's strings hold U+0000 and so do the interpreter's (counted, not
     * NUL-terminated): a message with one renders as transformers renders it */
    json_t *ctx = accel__json_parse_nul("chat template variables", json, n);
    if (!ctx) {
        /* valid JSON that jansson cannot hold (Python reads it): named as what accel does
         * not implement, not as invalid JSON. jansson holds integers in 64 bits, and
         * strings with U+0000 but not object keys with one. */
        static const char *const jansson_gaps[][2] = {
            {": too big integer", "an integer past 64 bits"},
            {": NUL byte in object key not supported", "an object key with U+0000"},
        };
        const char *m = accel_last_error(), *gap = NULL, *what = NULL, *rest = NULL;
        for (size_t i = 0; i < sizeof jansson_gaps / sizeof *jansson_gaps && !gap; i++)
            if ((gap = strstr(m, jansson_gaps[i][0]))) what = jansson_gaps[i][1], rest = gap + strlen(jansson_gaps[i][0]);
        if (!gap) return accel_last_status();
        const char *inv = strstr(m, "invalid JSON at ");
        char msg[512];
        if (inv && inv < gap) /* "<name>: line L, column C: <what> (not implemented) near ..." */
            snprintf(msg, sizeof msg, "%.*s%.*s: %s (not implemented)%s", (int)(inv - m), m, (int)(gap - inv - 16), inv + 16,
                     what, rest);
        else
            snprintf(msg, sizeof msg, "%.*s: %s (not implemented)%s", (int)(gap - m), m, what, rest);
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s", msg);
    }
    accel_status st = render(ct, ctx, text, len);
    json_decref(ctx);
    return st;
}

accel_status accel_chat_template_render(const accel_chat_template *ct, const accel_chat_message *msgs, size_t n_msgs,
                                        bool add_generation_prompt, char **text, size_t *len) {
    if (!ct || !msgs || !text)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_chat_template_render: %s is NULL",
                               !ct ? "the template" : !msgs ? "msgs" : "text");
    *text = NULL;
    json_t *ctx = json_object(), *arr = json_array();
    accel_status st = ctx && arr ? ACCEL_OK : accel_set_error(ACCEL_ERR_OOM, "accel_chat_template_render: out of memory");
    for (size_t i = 0; !st && i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_chat_template_render: msgs[%zu].%s is NULL", i,
                                 msgs[i].role ? "content" : "role");
            break;
        }
        /* json_string refuses text that is not UTF-8 */
        json_t *role = json_string(msgs[i].role), *content = json_string(msgs[i].content), *m = json_object();
        if (!role || !content)
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_chat_template_render: msgs[%zu].%s is not UTF-8", i,
                                 role ? "content" : "role");
        else if (!m || json_object_set(m, "role", role) || json_object_set(m, "content", content) || json_array_append(arr, m))
            st = accel_set_error(ACCEL_ERR_OOM, "accel_chat_template_render: out of memory");
        json_decref(role), json_decref(content), json_decref(m);
    }
    if (!st && (json_object_set(ctx, "messages", arr) ||
                json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt))))
        st = accel_set_error(ACCEL_ERR_OOM, "accel_chat_template_render: out of memory");
    if (!st) st = render(ct, ctx, text, len);
    json_decref(arr), json_decref(ctx);
    return st;
}

accel_status accel_chat_template_encode(const accel_chat_template *ct, const accel_tokenizer *t,
                                        const accel_chat_message *msgs, size_t n_msgs, bool add_generation_prompt,
                                        int64_t **ids, int64_t *n_ids) {
    if (!t || !ids || !n_ids)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_chat_template_encode: %s is NULL",
                               !t ? "the tokenizer" : !ids ? "ids" : "n_ids");
    char *text;
    size_t len;
    accel_status st = accel_chat_template_render(ct, msgs, n_msgs, add_generation_prompt, &text, &len);
    if (st) return st;
    /* apply_chat_template(tokenize=True) encodes with add_special_tokens=False */
    st = accel_tokenizer_encode(t, text, len, false, ids, n_ids);
    free(text);
    return st;
}
