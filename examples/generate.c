/* examples/generate.c DIR [options] — generation from a prompt's text or ids.
 *
 *   --prompt TEXT            the prompt as text: DIR's tokenizer.json (or else its
 *                            SentencePiece tokenizer.model) encodes it (with the
 *                            tokenizer's special tokens, e.g. BOS) and decodes the result,
 *                            printed as text="..." (special tokens skipped)
 *   --chat TEXT              one user message through DIR's chat template (chat_template.jinja
 *                            or tokenizer_config.json's) with the generation prompt, encoded as
 *                            transformers' apply_chat_template(tokenize=True) encodes it (the
 *                            template writes BOS and the turn markers), then as --prompt
 *   --system TEXT            with --chat: a system message before the user's
 *   --ids 1,2,3              prompt ids (default 1,2,3; ignored with --prompt or --chat)
 *   several --prompt (or several --chat, or several --ids), up to 8: one left-padded batch
 *                            (--batch: one prompt through that path too)
 *                            (accel_generate_batch, transformers' generate on
 *                            tokenizer(prompts, padding=True, padding_side="left"); the
 *                            device map, memory and dtype options apply, --dump-logits
 *                            and --first-reps take one prompt):
 *                            prints generated_ids[b]=[...] (pads left out) and
 *                            text[b]="..." a row, then the timings with tokens/s
 *                            over every row's new tokens; the pad is pad_token_id
 *                            (generation_config.json's, else config.json's), else
 *                            --eos, else config's first eos_token_id (transformers'
 *                            rule), else 0
 *   --device-map M           auto | balanced | balanced_low_0 | sequential (with --max-memory),
 *                            a JSON file {"model.layers.0": "cpu", "lm_head": "disk", ...},
 *                            or inline "prefix:device,..." (default: everything on cpu)
 *   --max-memory cpu=200MB,disk=10GB   budgets for the strategies (refused without one)
 *   --new-tokens N           (default 8)
 *   --sample --temperature T --top-k K --top-p P --seed S   (default greedy; when sampling
 *                            T > 0 (default 1), K >= 0 (0: off), P in (0, 1] (1: off), as
 *                            transformers; a bad value is an error naming it)
 *   --eos ID                 stop after ID
 *   --dtype bfloat16         load floating weights in this dtype
 *   --dump-logits FILE.npy   the prompt's last-position logits, float32 .npy
 *   --warm-up                one untimed generation of up to 2 new tokens first, so the
 *                            timings below are of warm calls (as bench/families_peer.py
 *                            times transformers': after a warm-up generate)
 *   --first-reps N           the prompt's forward N times (default 1), timed each
 *                            (bench/peer_decode.py times transformers' first token alike)
 * Prints generated_ids=[...], then timings: prompt_ms (the prompt's forward to
 * its first logits, the median of the --first-reps; load excluded),
 * prompt_cpu_ms (the process's CPU time of that forward, all threads, median:
 * what another process's load cannot add to) and decode tokens/s ("n/a" where not measured). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/bigmodel.h"
#include "accel/io.h"
#include "accel/tokenizer.h"

static int usage(void) {
    fprintf(stderr, "usage: generate DIR [--prompt TEXT | --chat TEXT [--system TEXT] | --ids 1,2,3] [--device-map auto|balanced|balanced_low_0|sequential|FILE.json|"
                    "prefix:dev,...] [--max-memory dev=SIZE,...] [--new-tokens N] [--sample] [--temperature T] "
                    "[--top-k K] [--top-p P] [--seed S] [--eos ID] [--dtype D] [--dump-logits FILE.npy] [--warm-up] "
                    "[--first-reps N] [--batch]\n");
    return 2;
}

/* The whole of v as a number, or usage: "5x", "" and out-of-range values are
 * errors, not atof's silent 5, 0 or wrap. The range checks are the library's
 * (accel_generate names the parameter). */
static bool parse_i64(const char *v, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno) return false;
    *out = x;
    return true;
}

static bool parse_f64(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno) return false;
    *out = x;
    return true;
}

static bool parse_u64(const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || errno || v[0] == '-') return false;
    *out = x;
    return true;
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* " name=rate" (tokens per second), or " name=n/a" where none was measured
 * (it printed 0.0): no token after the first, or a generation timed no longer
 * than its prompt alone (a cold first prompt call; a decode too short to time). */
static void print_rate(const char *name, double tokens, double seconds) {
    if (tokens > 0 && seconds > 0) printf(" %s=%.1f", name, tokens / seconds);
    else printf(" %s=n/a", name);
    if (tokens > 0 && !(seconds > 0))
        fprintf(stderr, "generate: %s not measured: the generation took no longer than its prompt alone (a cold "
                        "first call, or too few new tokens to time: --warm-up and more --new-tokens help)\n", name);
}

/* The median of x[n] (n >= 1; sorts x). */
static double median(double *x, int64_t n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

static int write_npy(const char *path, const float *x, int64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    char hdr[128];
    int len = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld,), }",
                       (long long)n);
    int total = 10 + len + 1, pad = (64 - total % 64) % 64;
    unsigned short hl = (unsigned short)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f);
    fputc(hl >> 8, f);
    fwrite(hdr, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t w = fwrite(x, sizeof(float), (size_t)n, f);
    return fclose(f) == 0 && w == (size_t)n ? 0 : -1;
}

/* "1,2,3" into ids[max]: the count, -1 when it is not such a list, -2 when
 * it holds more than max. */
static int64_t parse_ids(const char *s, int64_t *ids, int64_t max) {
    int64_t n = 0;
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        if (n == max) return -2;
        ids[n++] = strtoll(p, &end, 10);
        if (end == p || errno || (*end && *end != ',')) return -1;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* What batch_main's prompts are: texts (--prompt), user messages (--chat) or id lists (--ids). */
typedef enum { PROMPTS_TEXT, PROMPTS_CHAT, PROMPTS_IDS } prompts_kind;

/* accel_llama_from_pretrained's arguments after the directory (--device-map, --max-memory, --dtype). */
typedef struct batch_load {
    const accel_device_map *map;
    const char *strategy;
    const accel_max_memory *max_memory;
    const accel_load_opts *opts;
} batch_load;

/* Several prompts in one left-padded batch: accel_generate_batch, each row
 * printed. Texts through DIR's tokenizer, messages (after `system` when
 * given) through its chat template, as the single prompt's. */
static int batch_main(const char *dir, const accel_generate_opts *o, const batch_load *lo, const char **prompts,
                      int B, prompts_kind kind, const char *system, bool warm_up) {
    enum { MAX_IDS = 256 };
    bool texts = kind != PROMPTS_IDS;
    accel_tokenizer *tok = texts ? accel_tokenizer_load(dir) : NULL;
    accel_chat_template *ct = kind == PROMPTS_CHAT && tok ? accel_chat_template_load(dir) : NULL;
    int64_t *rows[8] = {0}, lens[8] = {0}, T = 0;
    int rc = texts && (!tok || (kind == PROMPTS_CHAT && !ct)) ? 1 : 0;
    if (rc) fprintf(stderr, "generate: %s\n", accel_last_error());
    for (int b = 0; b < B && !rc; b++) {
        if (kind == PROMPTS_CHAT) {
            accel_chat_message msgs[2] = {{"system", system}, {"user", prompts[b]}};
            rc = accel_chat_template_encode(ct, tok, system ? msgs : msgs + 1, system ? 2 : 1, true, &rows[b],
                                            &lens[b]) != ACCEL_OK;
            if (rc) fprintf(stderr, "generate: --chat: %s\n", accel_last_error());
        } else if (texts) {
            rc = accel_tokenizer_encode(tok, prompts[b], strlen(prompts[b]), true, &rows[b], &lens[b]) != ACCEL_OK;
            if (rc) fprintf(stderr, "generate: --prompt: %s\n", accel_last_error());
        } else {
            rows[b] = malloc(sizeof(int64_t) * MAX_IDS);
            lens[b] = rows[b] ? parse_ids(prompts[b], rows[b], MAX_IDS) : -1;
            if (lens[b] <= 0) {
                fprintf(stderr, "generate: --ids '%s': not a list of 1 to %d ids\n", prompts[b], MAX_IDS);
                rc = 2;
            }
        }
        if (!rc && lens[b] > T) T = lens[b];
    }
    accel_module *m = NULL;
    accel_dispatched *d = NULL;
    double t0 = accel_now_seconds();
    if (!rc) m = accel_llama_from_pretrained(dir, lo->map, lo->strategy, lo->max_memory, lo->opts, &d);
    double t_load = accel_now_seconds();
    if (!rc && !m) {
        fprintf(stderr, "generate: %s\n", accel_last_error());
        rc = 1;
    }
    /* transformers pads with pad_token_id (generation_config.json's, else
     * config.json's), eos where it has none */
    accel_llama_config c = m ? *accel_llama_config_of(m) : (accel_llama_config){.pad_token_id = -1};
    if (m && accel_generation_config_load(dir, &c) != ACCEL_OK) {
        fprintf(stderr, "generate: %s\n", accel_last_error());
        rc = 1;
    }
    int64_t pad = c.pad_token_id >= 0 ? c.pad_token_id
                  : o->has_eos        ? o->eos_token_id
                  : c.n_eos_token_ids ? c.eos_token_ids[0]
                                      : 0;
    /* the pad is embedded (prompts' pads, finished rows' tokens): name where it came from */
    if (!rc && (pad < 0 || pad >= c.vocab_size)) {
        const char *from = c.pad_token_id >= 0 ? "pad_token_id"
                           : o->has_eos        ? "--eos: the config has no pad_token_id"
                                               : "eos_token_id";
        fprintf(stderr, "generate: the pad id %lld (%s) is outside the vocabulary [0, %lld)\n", (long long)pad, from,
                (long long)c.vocab_size);
        rc = 2;
    }
    int64_t cells = (int64_t)B * (T + o->max_new_tokens), cols = 0;
    int64_t *ids = rc ? NULL : malloc(sizeof(int64_t) * (size_t)(B * T)),
            *mask = rc ? NULL : malloc(sizeof(int64_t) * (size_t)(B * T)),
            *out = rc ? NULL : malloc(sizeof(int64_t) * (size_t)cells);
    if (!rc && (!ids || !mask || !out)) rc = 1;
    for (int b = 0; !rc && b < B; b++) /* left padding */
        for (int64_t t = 0; t < T; t++) {
            int64_t k = t - (T - lens[b]);
            ids[b * T + t] = k >= 0 ? rows[b][k] : pad;
            mask[b * T + t] = k >= 0;
        }
    accel_generate_opts g = *o, first = *o;
    g.has_pad = true, g.pad_token_id = pad;
    first.has_pad = true, first.pad_token_id = pad, first.max_new_tokens = o->max_new_tokens < 1 ? 0 : 1;
    if (!rc && warm_up) { /* as the single prompt's --warm-up: 2 tokens untimed */
        accel_generate_opts w = g;
        w.max_new_tokens = o->max_new_tokens < 2 ? o->max_new_tokens : 2;
        rc = accel_generate_batch(m, ids, mask, B, T, &w, out, &cols) != ACCEL_OK;
    }
    /* the prompt's forward and first token, then the whole generation */
    double t1 = accel_now_seconds(), c1 = cpu_seconds();
    if (!rc) rc = accel_generate_batch(m, ids, mask, B, T, &first, out, &cols) != ACCEL_OK;
    double t2 = accel_now_seconds(), c2 = cpu_seconds();
    if (!rc) rc = accel_generate_batch(m, ids, mask, B, T, &g, out, &cols) != ACCEL_OK;
    double t3 = accel_now_seconds(), c3 = cpu_seconds();
    if (rc && ids && mask && out) fprintf(stderr, "generate: %s\n", accel_last_error());
    for (int b = 0; !rc && b < B; b++) {
        /* the row without its left pads, nor the pads after its eos */
        int64_t *row = out + b * cols + (T - lens[b]), n = cols - (T - lens[b]);
        bool ended = false;
        for (int64_t i = lens[b]; i < n; i++)
            if (ended) n = i;
            else ended = o->has_eos && row[i] == o->eos_token_id;
        printf("generated_ids[%d]=[", b);
        for (int64_t i = 0; i < n; i++) printf("%s%lld", i ? ", " : "", (long long)row[i]);
        printf("]\n");
        char *decoded = NULL;
        if (tok && accel_tokenizer_decode(tok, row, n, true, &decoded, NULL) != ACCEL_OK) {
            fprintf(stderr, "generate: %s\n", accel_last_error());
            rc = 1;
        }
        if (decoded) printf("text[%d]=\"%s\"\n", b, decoded);
        free(decoded);
    }
    if (!rc) {
        int64_t n_new = cols - T;
        /* per CPU second too: the process's time, all threads, which another process's load cannot add to */
        double decode_s = (t3 - t2) - (t2 - t1), decode_cpu_s = (c3 - c2) - (c2 - c1);
        double toks = (double)(B * (n_new - 1));
        printf("load_ms=%.1f prompt_ms=%.2f batch=%d new_tokens=%lld", (t_load - t0) * 1e3, (t2 - t1) * 1e3, B,
               (long long)n_new);
        print_rate("decode_tokens_per_s", n_new > 1 ? toks : 0, decode_s);
        print_rate("decode_tokens_per_cpu_s", n_new > 1 ? toks : 0, decode_cpu_s);
        printf("\n");
    }
    for (int b = 0; b < B; b++) free(rows[b]);
    free(ids);
    free(mask);
    free(out);
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_chat_template_free(ct);
    accel_tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv) {
    enum { MAX_BATCH = 8 };
    const char *dir = NULL, *ids_s = "1,2,3", *map_s = NULL, *mm_s = NULL, *dump = NULL, *text = NULL, *chat = NULL,
               *system = NULL, *texts[MAX_BATCH], *id_lists[MAX_BATCH], *chats[MAX_BATCH];
    int n_texts = 0, n_id_lists = 0, n_chats = 0;
    accel_generate_opts o = {.max_new_tokens = 8};
    accel_load_opts lo = {0};
    bool warm_up = false, force_batch = false;
    int64_t first_reps = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--sample") == 0) { o.do_sample = true; continue; }
        if (strcmp(a, "--warm-up") == 0) { warm_up = true; continue; }
        if (strcmp(a, "--batch") == 0) { force_batch = true; continue; }
        if (a[0] != '-') {
            if (dir) return usage();
            dir = a;
            continue;
        }
        if (!v) return usage();
        i++;
        bool ok = true;
        /* a repeated --ids or --prompt: one more row of a batch */
        if (strcmp(a, "--ids") == 0) ok = n_id_lists < MAX_BATCH && (id_lists[n_id_lists++] = ids_s = v);
        else if (strcmp(a, "--prompt") == 0) ok = n_texts < MAX_BATCH && (texts[n_texts++] = text = v);
        else if (strcmp(a, "--chat") == 0) ok = n_chats < MAX_BATCH && (chats[n_chats++] = chat = v);
        else if (strcmp(a, "--system") == 0) system = v;
        else if (strcmp(a, "--device-map") == 0) map_s = v;
        else if (strcmp(a, "--max-memory") == 0) mm_s = v;
        else if (strcmp(a, "--new-tokens") == 0) ok = parse_i64(v, &o.max_new_tokens);
        else if (strcmp(a, "--first-reps") == 0) ok = parse_i64(v, &first_reps) && first_reps >= 1 && first_reps <= 1000;
        else if (strcmp(a, "--temperature") == 0) ok = parse_f64(v, &o.temperature);
        else if (strcmp(a, "--top-k") == 0) ok = parse_i64(v, &o.top_k);
        else if (strcmp(a, "--top-p") == 0) ok = parse_f64(v, &o.top_p);
        else if (strcmp(a, "--seed") == 0) ok = parse_u64(v, &o.seed);
        else if (strcmp(a, "--eos") == 0) { o.has_eos = true; ok = parse_i64(v, &o.eos_token_id); }
        else if (strcmp(a, "--dump-logits") == 0) dump = v;
        else if (strcmp(a, "--dtype") == 0) {
            int d = accel_dtype_parse(v);
            if (d < 0) return usage();
            lo.has_dtype = true;
            lo.dtype = (accel_dtype)d;
        } else return usage();
        if (!ok && (strcmp(a, "--ids") == 0 || strcmp(a, "--prompt") == 0 || strcmp(a, "--chat") == 0)) {
            fprintf(stderr, "generate: %s: at most %d prompts in a batch\n", a, MAX_BATCH);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "generate: %s: '%s' is not a number%s\n", a, v,
                    strcmp(a, "--first-reps") == 0 ? " in [1, 1000]" : "");
            return 2;
        }
        /* On the command line 0 is a value, not "the default" (as in the
         * library's zero-initialised options): transformers refuses it. */
        if ((strcmp(a, "--temperature") == 0 && o.temperature == 0) ||
            (strcmp(a, "--top-p") == 0 && o.top_p == 0)) {
            fprintf(stderr, "generate: %s 0: has to be > 0%s\n", a,
                    a[2] == 't' && a[3] == 'e' ? " (for greedy decoding leave out --sample)" : "");
            return 2;
        }
    }
    if (!dir || (text && chat) || (system && !chat)) return usage(); /* --prompt or --chat; --system only with --chat */
    bool batch = force_batch || n_texts > 1 || n_chats > 1 || (!text && !chat && n_id_lists > 1);
    if (batch && (dump || first_reps > 1)) {
        fprintf(stderr, "generate: --dump-logits and --first-reps take one prompt\n");
        return 2;
    }
    enum { MAX_PROMPT = 256 };
    int64_t prompt_ids[MAX_PROMPT], *prompt = prompt_ids, n_prompt = parse_ids(ids_s, prompt_ids, MAX_PROMPT);
    if (n_prompt == -2) {
        fprintf(stderr, "generate: --ids: more than %d ids\n", MAX_PROMPT);
        return 2;
    }
    if (n_prompt <= 0) { /* as a batch's: an empty list is no prompt (it read "accel_generate: needs a model...") */
        fprintf(stderr, "generate: --ids '%s': not a list of 1 to %d ids\n", ids_s, MAX_PROMPT);
        return 2;
    }
    if (accel_generate_opts_check(&o, n_prompt) != ACCEL_OK) { /* before the (slow) load */
        fprintf(stderr, "generate: %s\n", accel_last_error());
        return 2;
    }
    accel_max_memory mm = {0}, *mmp = NULL;
    if (mm_s) {
        char *copy = strdup(mm_s), *save = NULL;
        int bad = copy ? 0 : 1;
        for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && !bad; tok = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(tok, '=');
            if (!eq) {
                bad = usage();
                break;
            }
            *eq = 0;
            if (accel_max_memory_set(&mm, tok, eq + 1) != ACCEL_OK) {
                fprintf(stderr, "generate: %s\n", accel_last_error());
                bad = 1;
            }
        }
        free(copy);
        if (bad) return bad;
        mmp = &mm;
    }
    accel_device_map *map = NULL;
    const char *strategy = NULL;
    if (map_s) {
        if (strcmp(map_s, "auto") == 0 || strcmp(map_s, "balanced") == 0 || strcmp(map_s, "balanced_low_0") == 0 ||
            strcmp(map_s, "sequential") == 0)
            strategy = map_s;
        else if (strstr(map_s, ".json"))
            map = accel_device_map_load(map_s);
        else
            map = accel_device_map_parse(map_s);
        if (!strategy && !map) {
            fprintf(stderr, "generate: bad --device-map '%s': %s\n", map_s, accel_last_error());
            return 1;
        }
    }
    if (mmp && !strategy) { /* the budgets would be dropped without a word: no strategy reads them */
        fprintf(stderr, "generate: --max-memory sets the budgets of a --device-map strategy (auto, balanced, "
                        "balanced_low_0, sequential); %s\n",
                map ? "an explicit map places every weight itself" : "without one every weight loads on the cpu");
        accel_device_map_free(map);
        return 2;
    }
    if (batch) {
        /* (--ids alone: the default list when none is given) */
        const char *default_ids[1] = {ids_s};
        int rc = batch_main(dir, &o, &(batch_load){map, strategy, mmp, &lo},
                            text ? texts : chat ? chats : n_id_lists ? id_lists : default_ids,
                            text ? n_texts : chat ? n_chats : n_id_lists ? n_id_lists : 1,
                            text ? PROMPTS_TEXT : chat ? PROMPTS_CHAT : PROMPTS_IDS, system, warm_up);
        accel_device_map_free(map);
        return rc;
    }
    /* --prompt: the text through DIR's tokenizer (BOS and the like added); --chat: the
     * messages through DIR's chat template, encoded without adding special tokens */
    accel_tokenizer *tok = text || chat ? accel_tokenizer_load(dir) : NULL;
    accel_chat_template *ct = chat && tok ? accel_chat_template_load(dir) : NULL;
    bool prompt_ok = !(text || chat) || (tok && (!chat || ct));
    if (prompt_ok && chat) {
        accel_chat_message msgs[2] = {{"system", system}, {"user", chat}};
        prompt_ok = accel_chat_template_encode(ct, tok, system ? msgs : msgs + 1, system ? 2 : 1, true, &prompt,
                                               &n_prompt) == ACCEL_OK;
    } else if (prompt_ok && text)
        prompt_ok = accel_tokenizer_encode(tok, text, strlen(text), true, &prompt, &n_prompt) == ACCEL_OK;
    accel_chat_template_free(ct);
    if (!prompt_ok || ((text || chat) && accel_generate_opts_check(&o, n_prompt) != ACCEL_OK)) {
        fprintf(stderr, "generate: %s: %s\n", chat ? "--chat" : "--prompt", accel_last_error());
        if (prompt != prompt_ids) free(prompt);
        accel_tokenizer_free(tok);
        accel_device_map_free(map);
        return 1;
    }
    double t0 = accel_now_seconds();
    accel_dispatched *d = NULL;
    accel_module *m = accel_llama_from_pretrained(dir, map, strategy, mmp, &lo, &d);
    accel_device_map_free(map);
    if (!m) {
        fprintf(stderr, "generate: %s\n", accel_last_error());
        if (prompt != prompt_ids) free(prompt);
        accel_tokenizer_free(tok);
        return 1;
    }
    double t_load = accel_now_seconds();
    int64_t vocab = accel_llama_config_of(m)->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    accel_tensor *first_logits = accel_tensor_new(ACCEL_F32, 1, &vocab, ACCEL_CPU_DEVICE);
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(n_prompt + o.max_new_tokens));
    int64_t n_out = 0;
    if (!logits || !out) {
        fprintf(stderr, "generate: out of memory for %lld new tokens\n", (long long)o.max_new_tokens);
        free(logits);
        free(out);
        accel_dispatched_free(d);
        accel_module_free(m);
        if (prompt != prompt_ids) free(prompt);
        accel_tokenizer_free(tok);
        return 1;
    }
    accel_status st = first_logits ? ACCEL_OK : accel_last_status();
    if (st == ACCEL_OK && warm_up) { /* first-call costs (buffers, GEMM choices, page faults) out of the timings */
        accel_generate_opts w = o;
        w.max_new_tokens = o.max_new_tokens < 2 ? o.max_new_tokens : 2;
        st = accel_generate(m, prompt, n_prompt, &w, out, &n_out);
    }
    /* prompt alone first (first logits), then the whole generation */
    accel_generate_opts first = o;
    first.max_new_tokens = 0;
    first.prompt_logits = first_logits;
    double walls[1000], cpus[1000];
    for (int64_t r = 0; st == ACCEL_OK && r < first_reps; r++) {
        double w0 = accel_now_seconds(), c0 = cpu_seconds();
        st = accel_generate(m, prompt, n_prompt, &first, out, &n_out);
        if (st == ACCEL_OK) st = accel_to_floats(first_logits, logits);
        walls[r] = accel_now_seconds() - w0, cpus[r] = cpu_seconds() - c0;
    }
    double t_first = accel_now_seconds();
    if (st == ACCEL_OK) st = accel_generate(m, prompt, n_prompt, &o, out, &n_out);
    double t_end = accel_now_seconds();
    int rc = 0;
    if (st != ACCEL_OK) {
        fprintf(stderr, "generate: %s\n", accel_last_error());
        rc = 1;
    } else {
        printf("generated_ids=[");
        for (int64_t i = 0; i < n_out; i++) printf("%s%lld", i ? ", " : "", (long long)out[i]);
        printf("]\n");
        char *decoded = NULL;
        if (tok && accel_tokenizer_decode(tok, out, n_out, true, &decoded, NULL) != ACCEL_OK) {
            fprintf(stderr, "generate: %s\n", accel_last_error());
            rc = 1;
        }
        if (decoded) printf("text=\"%s\"\n", decoded);
        free(decoded);
        double prompt_s = median(walls, first_reps), decode_s = (t_end - t_first) - prompt_s;
        int64_t n_new = n_out - n_prompt;
        printf("load_ms=%.1f prompt_ms=%.2f prompt_cpu_ms=%.2f new_tokens=%lld", (t_load - t0) * 1e3, prompt_s * 1e3,
               median(cpus, first_reps) * 1e3, (long long)n_new);
        print_rate("decode_tokens_per_s", n_new > 1 ? (double)(n_new - 1) : 0, decode_s);
        printf("\n");
        if (dump && write_npy(dump, logits, vocab) != 0) {
            fprintf(stderr, "generate: cannot write %s\n", dump);
            rc = 1;
        }
    }
    accel_tensor_free(first_logits);
    free(logits);
    free(out);
    accel_dispatched_free(d);
    accel_module_free(m);
    if (prompt != prompt_ids) free(prompt);
    accel_tokenizer_free(tok);
    return rc;
}
