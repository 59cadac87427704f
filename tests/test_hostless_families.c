/* Every Hugging Face family of tests/data on a device the host cannot
 * address (hostless: a host dereference of its memory faults, an op mixing
 * devices is refused), against the same run on the cpu: one loop over the
 * fixtures present, the first decoder fixture (hf_arch_*) of each
 * model_type and every encoder fixture with weights (hf_bert_*, hf_roberta_*,
 * hf_xlm_roberta_*: BERT, RoBERTa and XLM-RoBERTa with each head), loaded by
 * from_pretrained with the maps of PLACES: the whole model on hostless:0
 * (no hooks: the ids on the device, as the user moves them; the masks,
 * positions, token types and labels there or on the cpu), the embeddings on
 * hostless:0 and the rest offloaded to host copies (by the default blocks,
 * and by BERT's encoder, pooler and head blocks), a split over the cpu (the
 * embeddings), hostless:0 (the layers) and hostless:1 (the final norm or
 * pooler, the head), one whose main device's blocks take the embeddings'
 * output from hostless:1, and BERT's masked-LM transform apart; the
 * inputs on the cpu or a device, each kind its own.
 * A head tied to the word embeddings goes with them (split, main last): the
 * map that puts them apart is refused at load, naming both.
 * Each run: the forward with and without attention_mask / position_ids /
 * token_type_ids, the loss and its backward (every gradient; under offload
 * refused, the weights gone after their forward), the encoder's hidden
 * states, and for decoders greedy generation with the KV cache. f32 results
 * must be equal bit for bit: hostless runs the cpu kernels (as
 * test_device_bigmodel compares). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/autograd.h"
#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "backends/registry.h"
#include "check.h"

#define CPU_DEV {ACCEL_DEV_CPU, 0}
#define H0_DEV {ACCEL_DEV_HOSTLESS, 0}
static const accel_device CPU = CPU_DEV;

enum { B = 2, T = 6, NEW = 4, MAX_OUT = 256 };

/* What a run produced: persistent cpu copies of every result, in order, and
 * the generated tokens. */
typedef struct outputs {
    int n;
    accel_tensor *t[MAX_OUT];
    char what[MAX_OUT][48];
    int64_t tokens[T + NEW];
    int64_t n_tokens;
} outputs;

static void outputs_free(outputs *o) {
    for (int i = 0; i < o->n; i++) accel_tensor_free(o->t[i]);
    o->n = 0;
    o->n_tokens = 0;
}

static void keep(outputs *o, const char *what, const accel_tensor *t, const char *ctx) {
    CHECK_MSG(t != NULL, "%s: %s: %s", ctx, what, accel_last_error());
    if (!t || o->n == MAX_OUT) return;
    snprintf(o->what[o->n], sizeof o->what[0], "%s", what);
    o->t[o->n++] = accel_tensor_clone_persistent(t, CPU);
}

/* Every parameter's gradient, by name (sweep compares the counts: one
 * missing on a device shows). */
static void keep_grads(outputs *o, accel_module *m, const char *ctx) {
    accel_state_dict *sd = accel_module_state_dict(m);
    CHECK_MSG(sd != NULL, "%s: %s", ctx, accel_last_error());
    for (int i = 0; sd && i < sd->n; i++) {
        accel_tensor *g = sd->entries[i].t->grad;
        if (sd->entries[i].is_tied_alias || !g) continue;
        char what[48];
        snprintf(what, sizeof what, "grad %.40s", sd->entries[i].name);
        keep(o, what, g, ctx);
    }
    accel_state_dict_free(sd);
}

/* A [rows, cols] int64 tensor of v on dev. */
static accel_tensor *ints(int64_t rows, int64_t cols, const int64_t *v, accel_device dev) {
    accel_tensor *t = accel_from_data(ACCEL_I64, ACCEL_SHAPE(rows, cols), v);
    return t ? accel_to_device(t, dev) : NULL;
}

/* The loss's backward: every gradient kept, or where the weights are
 * offloaded (dropped after their forward) refused, naming that. */
static void backward(outputs *o, accel_module *m, accel_tensor *loss, bool offloaded, const char *ctx) {
    accel_status st = accel_backward(loss);
    if (!offloaded) {
        CHECK_MSG(st == ACCEL_OK, "%s: backward: %s", ctx, accel_last_error());
        keep_grads(o, m, ctx);
        return;
    }
    CHECK_MSG(st == ACCEL_ERR_STATE, "%s: backward through offloaded weights gave %d", ctx, (int)st);
    CHECK_STR_CONTAINS(accel_last_error(), "backward through offloaded weights is not implemented");
    accel_clear_error();
}

/* [B] int64 labels of v on dev. */
static accel_tensor *labels(const int64_t *v, accel_device dev) {
    accel_tensor *t = accel_from_data(ACCEL_I64, ACCEL_SHAPE(B), v);
    return t ? accel_to_device(t, dev) : NULL;
}

/* Where a run's inputs are: the ids; the attention mask, positions and
 * token types; an encoder's labels (moved to the logits' device by the
 * loss, as transformers' heads move them). Whether the weights are
 * offloaded. */
typedef struct run_at {
    accel_device ids, others, labels;
    bool offloaded;
} run_at;

/* ---- decoders */

static void decoder_runs(accel_module *m, const run_at *at, outputs *o, const char *ctx) {
    const accel_llama_config *c = accel_llama_config_of(m);
    int64_t ids[B * T], mask[B * T], pos[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (7 * i + 3) % c->vocab_size;
        mask[i] = !(i / T == 1 && i % T < 2); /* row 1: two left pads */
        pos[i] = i / T == 1 ? (i % T < 2 ? 0 : i % T - 2) : i % T;
    }
    accel_tensor *x = ints(B, T, ids, at->ids);
    keep(o, "logits", accel_llama_forward(m, x, NULL), ctx);
    accel_llama_inputs in = {.ids = x, .attention_mask = ints(B, T, mask, at->others),
                             .position_ids = ints(B, T, pos, at->others)};
    keep(o, "logits masked", accel_llama_forward_ex(m, &in), ctx);
    accel_tensor *loss = accel_llama_loss_ex(m, &in);
    keep(o, "loss masked", loss, ctx);
    if (loss) backward(o, m, loss, at->offloaded, ctx);
    accel_step_reset();
    accel_tensor *first = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(c->vocab_size), CPU);
    accel_generate_opts g = {.max_new_tokens = NEW, .prompt_logits = first};
    CHECK_MSG(accel_generate(m, ids, T, &g, o->tokens, &o->n_tokens) == ACCEL_OK, "%s: generate: %s", ctx,
              accel_last_error());
    keep(o, "prompt logits", first, ctx);
    accel_tensor_free(first);
}

/* ---- encoders */

/* The head's loss on ids [B, T] (multiple choice: [B, 2, T]) with token
 * types and a padding mask, or neither, its labels on dev; its logits kept. */
static accel_tensor *bert_loss(accel_module *m, accel_tensor *ids, accel_tensor *tt, accel_tensor *am,
                               accel_device dev, outputs *o, const char *ctx) {
    const accel_bert_config *c = accel_bert_config_of(m);
    bool vocab = c->head == ACCEL_BERT_MASKED_LM || c->head == ACCEL_BERT_PRETRAINING; /* per-token classes */
    int64_t L = c->num_labels, classes = vocab ? c->vocab_size : L, tok[B * T], cls[B] = {1 % L, 0}, mc[B] = {1, 0};
    for (int i = 0; i < B * T; i++) tok[i] = i % 3 == 0 ? -100 : (i * 5) % classes;
    accel_tensor *a = NULL, *b = NULL, *loss = NULL;
    switch (c->head) {
    case ACCEL_BERT_SEQUENCE_CLASSIFICATION: loss = accel_bert_loss(m, ids, tt, am, labels(cls, dev), &a); break;
    case ACCEL_BERT_TOKEN_CLASSIFICATION:
        loss = accel_bert_token_loss(m, ids, tt, am, ints(B, T, tok, dev), &a);
        break;
    case ACCEL_BERT_QUESTION_ANSWERING: {
        int64_t sp[B] = {1, 3}, ep[B] = {2, 5};
        loss = accel_bert_qa_loss(m, ids, tt, am, labels(sp, dev), labels(ep, dev), &a, &b);
        break;
    }
    case ACCEL_BERT_MASKED_LM: loss = accel_bert_mlm_loss(m, ids, tt, am, ints(B, T, tok, dev), &a); break;
    case ACCEL_BERT_PRETRAINING:
        loss = accel_bert_pretraining_loss(m, ids, tt, am, ints(B, T, tok, dev), labels(mc, dev), &a, &b);
        break;
    case ACCEL_BERT_NEXT_SENTENCE_PREDICTION: loss = accel_bert_nsp_loss(m, ids, tt, am, labels(mc, dev), &a); break;
    case ACCEL_BERT_MULTIPLE_CHOICE:
        loss = accel_bert_multiple_choice_loss(m, ids, tt, am, labels(mc, dev), &a);
        break;
    default: break;
    }
    keep(o, tt ? "logits" : "logits plain", a, ctx);
    if (b) keep(o, tt ? "second logits" : "second logits plain", b, ctx);
    keep(o, tt ? "loss" : "loss plain", loss, ctx);
    return loss;
}

static void encoder_runs(accel_module *m, const run_at *at, outputs *o, const char *ctx) {
    const accel_bert_config *c = accel_bert_config_of(m);
    bool mc = c->head == ACCEL_BERT_MULTIPLE_CHOICE;
    int64_t rows = mc ? B * 2 : B, ids[B * 2 * T], tt[B * 2 * T], am[B * 2 * T];
    /* RoBERTa counts positions from the ids: none is the pad token, 1 */
    for (int64_t i = 0; i < rows * T; i++) {
        ids[i] = 3 + (11 * i) % (c->vocab_size - 3);
        tt[i] = c->type_vocab_size > 1 && i % T >= T / 2;
        am[i] = !(i / T == 1 && i % T >= T - 2); /* row 1: two pads at its end */
    }
    accel_tensor *x = ints(rows, T, ids, at->ids), *types = ints(rows, T, tt, at->others),
                 *mask = ints(rows, T, am, at->others);
    if (mc) {
        x = accel_reshape(x, 3, (int64_t[]){B, 2, T});
        types = accel_reshape(types, 3, (int64_t[]){B, 2, T});
        mask = accel_reshape(mask, 3, (int64_t[]){B, 2, T});
    }
    bert_loss(m, x, NULL, NULL, at->labels, o, ctx);
    accel_tensor *loss = bert_loss(m, x, types, mask, at->labels, o, ctx);
    if (!mc) {
        accel_tensor *h = accel_bert_encode(m, x, types, mask, NULL);
        keep(o, "hidden", h, ctx);
    }
    if (loss) backward(o, m, loss, at->offloaded, ctx);
    accel_step_reset();
}

/* ---- the sweep */

/* A map: the devices of the embeddings, the layers, what follows them in
 * the body (final norm, pooler) and the head (`whole`: one entry "" for
 * the model; none: everything on the cpu), or `spec` as it is, for the
 * models holding its `needs` module; its main device; the preload classes
 * (NULL: the default); whether the head runs on another device than the
 * embeddings; where the inputs are. */
typedef struct placement {
    const char *name;
    const char *dev[4];
    bool whole;
    const char *spec, *needs;
    const char *main;
    const char *const *preload;
    bool head_apart;
    run_at at;
} placement;

/* Blocks whose hooks bring in every offloaded weight below them: BERT's
 * modules that call their children one by one (none a decoder's: its
 * layers then come in weight by weight). */
static const char *const BLOCKS[] = {"BertEncoder",      "BertPooler",        "BertPredictionHeadTransform",
                                     "RobertaEncoder",   "RobertaPooler",     "XLMRobertaEncoder",
                                     "XLMRobertaPooler", "BertPreTrainingHeads", NULL};

enum { N_PLACES = 8 }; /* the first, the cpu's, is the reference */

static const placement PLACES[N_PLACES] = {
    {"cpu", {NULL}, false, NULL, NULL, NULL, NULL, false, {CPU_DEV, CPU_DEV, CPU_DEV, false}},
    /* no hooks (Accelerate's model.to(device)): the ids on the device, as the user moves them */
    {"device", {"hostless:0"}, true, NULL, NULL, NULL, NULL, false, {H0_DEV, H0_DEV, H0_DEV, false}},
    {"device, host masks", {"hostless:0"}, true, NULL, NULL, NULL, NULL, false, {H0_DEV, CPU_DEV, CPU_DEV, false}},
    /* "cpu" under a main device: host copies brought to hostless:0 when they run */
    {"offload", {"hostless:0", "cpu", "cpu", "cpu"}, false, NULL, NULL, NULL, NULL, false,
     {CPU_DEV, H0_DEV, H0_DEV, true}},
    {"offload by blocks", {"hostless:0", "cpu", "cpu", "cpu"}, false, NULL, NULL, NULL, BLOCKS, false,
     {CPU_DEV, CPU_DEV, CPU_DEV, true}},
    /* main device cpu: the embeddings run on the cpu, the final norm or pooler and the head on a
     * device of their own */
    {"split", {"cpu", "hostless:0", "hostless:1", "hostless:1"}, false, NULL, NULL, "cpu", NULL, true,
     {CPU_DEV, CPU_DEV, H0_DEV, false}},
    /* the main device's blocks get the embeddings' output moved in */
    {"main last", {"hostless:1", "hostless:0", "hostless:0", "hostless:0"}, false, NULL, NULL, "hostless:0", NULL, true,
     {CPU_DEV, H0_DEV, CPU_DEV, false}},
    /* BERT's masked-LM head split: its transform apart, the decoder after it with the embeddings */
    {"cls split", {NULL}, false, ":hostless:0,cls.predictions.transform:hostless:1", "cls.predictions.transform", NULL,
     NULL, false, {CPU_DEV, CPU_DEV, CPU_DEV, false}},
};

/* Whether m is, or holds within depth levels, a ModuleList (the layers). */
static bool holds_layers(const accel_module *m, int depth) {
    if (!strcmp(m->ops->type_name, "ModuleList")) return true;
    for (int i = 0; depth > 0 && i < m->n_children; i++)
        if (holds_layers(m->children[i], depth - 1)) return true;
    return false;
}

/* p's map for the model m (built on the cpu): the body's children before
 * its layers are the embeddings, then the layers, then what follows them
 * (final norm, pooler); the root's other children the head, or with the
 * embeddings (a head tied to them). */
static accel_device_map *map_of(accel_module *m, const placement *p, bool head_with_embeddings) {
    if (p->spec) return accel_device_map_parse(p->spec);
    if (!p->dev[0]) return NULL;
    accel_device_map *map = accel_device_map_new();
    if (p->whole) {
        accel_device_map_set(map, "", p->dev[0]);
        return map;
    }
    char key[128];
    for (int i = 0; i < m->n_children; i++) {
        accel_module *c = m->children[i];
        if (!holds_layers(c, 2)) {
            accel_device_map_set(map, c->name, p->dev[head_with_embeddings ? 0 : 3]);
            continue;
        }
        int part = 0; /* 0 embeddings, 1 layers, 2 after them */
        for (int j = 0; j < c->n_children; j++) {
            part = holds_layers(c->children[j], 1) ? 1 : part == 1 ? 2 : part;
            snprintf(key, sizeof key, "%s.%s", c->name, c->children[j]->name);
            accel_device_map_set(map, key, p->dev[part]);
        }
    }
    return map;
}

typedef struct fixture {
    char dir[128];
    bool encoder;
    accel_bert_head head; /* an encoder's: its config's architectures (the masked LM and pre-training too) */
} fixture;

/* f loaded by from_pretrained with p's map (the head on the embeddings'
 * device when head_with_embeddings); NULL + error. */
static accel_module *load(const fixture *f, accel_module *cpu_model, const placement *p, bool head_with_embeddings,
                          accel_dispatched **d) {
    accel_device_map *map = map_of(cpu_model, p, head_with_embeddings);
    int n_preload = 0;
    while (p->preload && p->preload[n_preload]) n_preload++;
    accel_load_opts lo = {.main_device = p->main, .preload_classes = p->preload, .n_preload = n_preload};
    accel_manual_seed(1); /* a head the checkpoint lacks: the same new weights */
    accel_module *m = f->encoder
                          ? accel_bert_from_pretrained_head_dispatched(f->dir, f->head, 0, map, NULL, NULL, &lo, d)
                          : accel_llama_from_pretrained(f->dir, map, NULL, NULL, &lo, d);
    accel_device_map_free(map);
    return m;
}

/* One run of f under p (the head on the embeddings' device, when `tied`):
 * outputs in o. */
static void run(const fixture *f, accel_module *cpu_model, const placement *p, bool tied, outputs *o) {
    char ctx[200];
    snprintf(ctx, sizeof ctx, "%.128s on %s", f->dir, p->name);
    accel_dispatched *d = NULL;
    accel_module *m = load(f, cpu_model, p, tied, &d);
    CHECK_MSG(m != NULL, "%s: load: %s", ctx, accel_last_error());
    if (m) (f->encoder ? encoder_runs : decoder_runs)(m, &p->at, o, ctx);
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_step_reset();
}

/* A tied head and its embeddings mapped to two devices: refused at load,
 * naming the tied weight's two names. */
static void refused_apart(const fixture *f, accel_module *cpu_model, const placement *p) {
    accel_dispatched *d = NULL;
    accel_module *m = load(f, cpu_model, p, false, &d);
    CHECK_MSG(!m && !d, "%s on %s: a tied head apart from its embeddings was loaded", f->dir, p->name);
    CHECK_STR_CONTAINS(accel_last_error(), "are one tied weight, but the device map runs them on");
    accel_clear_error();
    accel_dispatched_free(d);
    accel_module_free(m);
}

/* got == want, result by result (the offload run has no gradients: only
 * the results before them, and those after them, the generation's). */
static void compare(const outputs *got, const outputs *want, const char *ctx) {
    int w = 0;
    for (int g = 0; g < got->n; g++, w++) {
        while (w < want->n && strcmp(got->what[g], want->what[w])) w++;
        CHECK_MSG(w < want->n, "%s: %s not in the cpu run", ctx, got->what[g]);
        if (w == want->n) return;
        accel_tensor *a = got->t[g], *b = want->t[w];
        int64_t n = accel_numel(b);
        bool same = a && b && accel_numel(a) == n && a->dtype == b->dtype;
        float *x = same ? malloc(sizeof *x * (size_t)n) : NULL, *y = same ? malloc(sizeof *y * (size_t)n) : NULL;
        same = x && y && accel_to_floats(a, x) == ACCEL_OK && accel_to_floats(b, y) == ACCEL_OK &&
               !memcmp(x, y, sizeof *x * (size_t)n);
        CHECK_MSG(same, "%s: %s differs from the cpu's", ctx, got->what[g]);
        free(x);
        free(y);
    }
    CHECK_MSG(got->n_tokens == want->n_tokens &&
                  !memcmp(got->tokens, want->tokens, sizeof got->tokens[0] * (size_t)want->n_tokens),
              "%s: generated tokens differ", ctx);
}

static void sweep(const fixture *f) {
    accel_module *cpu_model = f->encoder ? accel_bert_from_pretrained_head(f->dir, f->head, 0, CPU) : NULL;
    if (!f->encoder) {
        accel_dispatched *d = NULL;
        cpu_model = accel_llama_from_pretrained(f->dir, NULL, NULL, NULL, NULL, &d);
        accel_dispatched_free(d);
    }
    CHECK_MSG(cpu_model != NULL, "%s: %s", f->dir, accel_last_error());
    if (!cpu_model) return;
    static outputs want, got;
    bool tied = false;
    accel_state_dict *sd = accel_module_state_dict(cpu_model);
    for (int i = 0; sd && i < sd->n; i++) tied |= sd->entries[i].is_tied_alias;
    accel_state_dict_free(sd);
    run(f, cpu_model, &PLACES[0], false, &want);
    CHECK_MSG(want.n > 3, "%s: the cpu run gave %d results", f->dir, want.n);
    for (int i = 1; i < N_PLACES; i++) {
        const placement *p = &PLACES[i];
        if (p->needs && !accel_module_find(cpu_model, p->needs)) {
            accel_clear_error();
            continue;
        }
        if (tied && p->head_apart) refused_apart(f, cpu_model, p);
        run(f, cpu_model, p, tied && p->head_apart, &got);
        char ctx[200];
        snprintf(ctx, sizeof ctx, "%.128s on %s", f->dir, p->name);
        CHECK_MSG(got.n >= (p->at.offloaded ? 3 : want.n), "%s: %d results of the cpu's %d", ctx, got.n, want.n);
        compare(&got, &want, ctx);
        outputs_free(&got);
    }
    outputs_free(&want);
    accel_module_free(cpu_model);
}

static int by_name(const void *a, const void *b) { return strcmp(((const fixture *)a)->dir, ((const fixture *)b)->dir); }

/* The head of an encoder fixture: accel_bert_config_load's, or the masked
 * LM and pre-training heads its architectures name (which config_load
 * leaves to the caller). */
static accel_bert_head head_of(const char *dir) {
    accel_bert_config c;
    CHECK_MSG(accel_bert_config_load(dir, &c) == ACCEL_OK, "%s: %s", dir, accel_last_error());
    char path[256], text[4096] = {0};
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    return strstr(text, "ForMaskedLM") ? ACCEL_BERT_MASKED_LM : strstr(text, "ForPreTraining") ? ACCEL_BERT_PRETRAINING
                                                                                                 : c.head;
}

static bool has_file(const char *dir, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* The fixtures of data/ (ctest runs in tests/) with weights, sorted: the
 * first decoder fixture of each model_type, every encoder fixture. */
static int fixtures(fixture *out, int cap) {
    DIR *dir = opendir("data");
    CHECK_MSG(dir != NULL, "no tests/data here");
    int n = 0;
    for (struct dirent *e; dir && (e = readdir(dir)) != NULL && n < cap;) {
        bool dec = !strncmp(e->d_name, "hf_arch_", 8);
        bool enc = !strncmp(e->d_name, "hf_bert_", 8) || !strncmp(e->d_name, "hf_roberta_", 11) ||
                   !strncmp(e->d_name, "hf_xlm_roberta_", 15);
        if (!dec && !enc) continue;
        if (strlen(e->d_name) + 6 > sizeof out[n].dir) continue;
        snprintf(out[n].dir, sizeof out[n].dir, "data/%.120s", e->d_name);
        out[n].encoder = enc;
        if (!has_file(out[n].dir, "model.safetensors")) continue;
        out[n].head = enc ? head_of(out[n].dir) : ACCEL_BERT_SEQUENCE_CLASSIFICATION;
        n++;
    }
    if (dir) closedir(dir);
    qsort(out, (size_t)n, sizeof *out, by_name);
    /* one decoder fixture per model_type: the families, not their RoPE variants */
    int kept = 0;
    char seen[64][16];
    int n_seen = 0;
    for (int i = 0; i < n; i++) {
        accel_llama_config c;
        bool dup = false;
        if (!out[i].encoder) {
            CHECK_MSG(accel_llama_config_load(out[i].dir, &c) == ACCEL_OK, "%s: %s", out[i].dir, accel_last_error());
            for (int j = 0; j < n_seen && !dup; j++) dup = !strcmp(seen[j], c.model_type);
            if (!dup && n_seen < 64) snprintf(seen[n_seen++], sizeof seen[0], "%s", c.model_type);
        }
        if (!dup) out[kept++] = out[i];
    }
    return kept;
}

static void test_families_on_hostless(void) {
    static fixture f[160];
    int n = fixtures(f, 160), n_dec = 0;
    for (int i = 0; i < n; i++) n_dec += !f[i].encoder;
    /* the decoder families and BERT, RoBERTa, XLM-RoBERTa with their heads */
    CHECK_MSG(n_dec >= 15 && n - n_dec >= 15, "%d decoder and %d encoder fixtures", n_dec, n - n_dec);
    for (int i = 0; i < n; i++) {
        int before = check_failures_;
        sweep(&f[i]);
        fprintf(stderr, "  %s %s\n", check_failures_ == before ? "ok  " : "FAIL", f[i].dir);
    }
}

int main(void) {
    if (accel_device_count(ACCEL_DEV_HOSTLESS) < 2) CHECK(accel__hostless_register(2) == ACCEL_OK);
    RUN(test_families_on_hostless);
    accel_thread_cleanup();
    return check_summary();
}
