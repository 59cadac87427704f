/* Render a chat model's prompt, as transformers' apply_chat_template:
 *     chat_template MODEL_DIR [--ids] < variables.json
 *     chat_template --template FILE.jinja < variables.json
 * Standard input is one JSON object of the template's variables: "messages" (required),
 * "add_generation_prompt", "tools", "enable_thinking", ..., and the option
 * "continue_final_message" (docs/tokenizer.md). MODEL_DIR's chat template
 * (chat_template.jinja, else tokenizer_config.json's) and special tokens are used;
 * --template renders a template file with no special tokens but the ones the JSON
 * gives. Prints the text (tokenize=False), or with --ids the ids MODEL_DIR's
 * tokenizer gives it (tokenize=True), space-separated. Errors name the line and
 * column of the template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/core.h"
#include "accel/tokenizer.h"

static char *read_all(FILE *f, size_t *n) {
    size_t cap = 1 << 16;
    char *s = malloc(cap);
    *n = 0;
    for (size_t k; s && (k = fread(s + *n, 1, cap - *n, f)) > 0;) {
        *n += k;
        if (*n == cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) free(s);
            s = t;
        }
    }
    return s;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *file = NULL;
    bool ids = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ids")) ids = true;
        else if (!strcmp(argv[i], "--template") && i + 1 < argc) file = argv[++i];
        else if (!dir && argv[i][0] != '-') dir = argv[i];
        else dir = file = NULL, i = argc;
    }
    if (!dir == !file || (ids && !dir)) {
        fprintf(stderr, "usage: chat_template MODEL_DIR [--ids] < variables.json\n"
                        "       chat_template --template FILE.jinja < variables.json\n");
        return 2;
    }
    accel_chat_template *ct = NULL;
    if (dir) ct = accel_chat_template_load(dir);
    else {
        FILE *f = fopen(file, "rb");
        size_t n;
        char *src = f ? read_all(f, &n) : NULL;
        if (f) fclose(f);
        if (!src) {
            fprintf(stderr, "chat_template: %s: cannot be read\n", file);
            return 1;
        }
        ct = accel_chat_template_new(src, n);
        free(src);
    }
    size_t n;
    char *vars = read_all(stdin, &n);
    accel_tokenizer *tok = ids ? accel_tokenizer_load(dir) : NULL;
    char *text = NULL;
    size_t len = 0;
    int64_t *out = NULL, n_out = 0;
    int rc = 0;
    if (!ct || !vars || (ids && !tok) || accel_chat_template_render_json(ct, vars, n, &text, &len) != ACCEL_OK ||
        (ids && accel_tokenizer_encode(tok, text, len, false, &out, &n_out) != ACCEL_OK)) {
        fprintf(stderr, "chat_template: %s\n", vars ? accel_last_error() : "out of memory");
        rc = 1;
    } else if (ids) {
        for (int64_t i = 0; i < n_out; i++) printf("%s%lld", i ? " " : "", (long long)out[i]);
        printf("\n");
    } else
        fwrite(text, 1, len, stdout);
    free(out);
    free(text);
    free(vars);
    accel_tokenizer_free(tok);
    accel_chat_template_free(ct);
    return rc;
}
