/* bench_gpt2_peers: accel's GPT-2 124M beside llm.c's train_gpt2 (CPU) and
 * ggml's gpt-2 example on the same weights, written here in their formats
 * (bench/sidebyside.sh runs the peers from binaries the user built).
 *
 *     bench_gpt2_peers export DIR [--seed S] [--batch B] [--seq T] [--prompt P]
 *     bench_gpt2_peers train DIR [--steps N] [--threads P] [--mixed_precision no|bf16]
 *
 * export: GPT-2 124M (vocab 50257, n_positions 1024, n_embd 768, 12 layers,
 * 12 heads, gelu_new, LayerNorm epsilon 1e-5, tied head, no dropout) with
 * transformers' random init from accel_manual_seed(S) (default 0), written as
 *   DIR/hf/                 config.json + model.safetensors (save_pretrained)
 *   DIR/gpt2_124M.bin       llm.c's checkpoint (train_gpt2.c gpt2_build_from_checkpoint:
 *                           256 int32 header {20240326, 3, maxT, V, L, NH, C, Vp},
 *                           then the f32 parameters in its order, wte padded to
 *                           Vp = 50304 rows of zeros, weights [out, in])
 *   DIR/dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin
 *                           llm.c's token file (llmc/dataloader.h: 256 int32 header
 *                           {20240520, 1, ntok}, uint16 tokens) of exactly B*T+1
 *                           tokens (B 4, T 64: train_gpt2.c's), so its shuffling
 *                           loader serves the same one batch every step
 *   DIR/ggml-model-f32.bin, DIR/ggml-model-f16.bin
 *                           ggml's gpt-2 format (examples/gpt-2 gpt2_model_load:
 *                           magic "ggml", hparams, vocab, then tensors named
 *                           model/...; f16: wte and the four projections in f16,
 *                           the rest f32, as its converters write)
 *   DIR/prompt_ids          P (default 128) prompt ids, comma-separated
 *   DIR/prompt.txt          the same ids as ggml's tokenizer reads them back
 * The vocabulary is the bench's own: token i is " Q" and i in base 26 over
 * a..z, 4 letters, so ggml's word splitter and longest-match tokenizer turn
 * prompt.txt into exactly prompt_ids and its printed text maps back to ids.
 *
 * train: the llm.c step on DIR's weights and batch: inputs = tokens[0, B T),
 * targets = tokens[1, B T + 1) as [B, T] (llm.c's rows overlap by one token
 * at each row end: a row's last target is the next row's first input, so the
 * loss is the forward's logits against explicit targets, not ids shifted in
 * each row), mean cross-entropy, AdamW with train_gpt2.c's hyperparameters
 * (lr 1e-4, betas 0.9 / 0.999, eps 1e-8, weight decay 0), through an
 * Accelerator (mixed_precision no or bf16) as bench_llama_step. Prints
 * train_gpt2.c's line per step, "step N: train loss L (took X ms)". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "accel/accel.h"
#include "bench_util.h"

enum { V = 50257, VP = 50304, NPOS = 1024, C = 768, L = 12, NH = 12 };

static void fail(const char *what) {
    fprintf(stderr, "bench_gpt2_peers: %s: %s\n", what, accel_last_error());
    exit(1);
}

/* The llm.c / ggml name of token id (" Q" + 4 letters). */
static void token_word(int id, char w[7]) {
    w[0] = ' ', w[1] = 'Q';
    for (int k = 5; k >= 2; k--, id /= 26) w[k] = (char)('a' + id % 26);
    w[6] = 0;
}

/* n ids uniform over the vocabulary from an LCG seeded by seed (independent of
 * the library RNG, as bench_llama_ids). */
static void lcg_ids(uint64_t seed, int64_t n, int *out) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = (int)((seed >> 33) % V);
    }
}

/* The f32 values of the model's tensor name, on the host (malloc'd). */
static float *host_f32(accel_module *m, const char *name, int64_t *n) {
    accel_tensor *t = accel_module_get_tensor(m, name);
    if (!t) fail(name);
    *n = accel_numel(t);
    float *h = malloc((size_t)*n * sizeof *h);
    if (!h || accel_tensor_to_host(t, h) != ACCEL_OK) fail(name);
    return h;
}

/* A Conv1D weight [in, out] as [out, in] (llm.c's and ggml's layout), malloc'd. */
static float *conv1d_transposed(accel_module *m, const char *name, int64_t in, int64_t out) {
    int64_t n;
    float *w = host_f32(m, name, &n), *t = malloc((size_t)n * sizeof *t);
    if (!t || n != in * out) fail(name);
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++) t[o * in + i] = w[i * out + o];
    free(w);
    return t;
}

static void put(FILE *f, const void *p, size_t size, size_t n, const char *path) {
    if (fwrite(p, size, n, f) != n) {
        fprintf(stderr, "bench_gpt2_peers: cannot write %s\n", path);
        exit(1);
    }
}

/* The four Conv1D weights of layer i, transposed: c_attn, attn.c_proj, c_fc, mlp.c_proj. */
enum { W_QKV, W_ATTPROJ, W_FC, W_FCPROJ, N_W };
static const char *W_NAME[N_W] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
static const int64_t W_IN[N_W] = {C, C, C, 4 * C}, W_OUT[N_W] = {3 * C, C, 4 * C, C};

static float *layer_tensor(accel_module *m, int i, const char *suffix, int64_t *n) {
    char name[96];
    snprintf(name, sizeof name, "transformer.h.%d.%s", i, suffix);
    return host_f32(m, name, n);
}

static float *layer_weight(accel_module *m, int i, int w) {
    char name[96];
    snprintf(name, sizeof name, "transformer.h.%d.%s.weight", i, W_NAME[w]);
    return conv1d_transposed(m, name, W_IN[w], W_OUT[w]);
}

/* Writes the whole tensor name (or one layer's, i >= 0, named by suffix) to f. */
static void put_tensor(FILE *f, accel_module *m, int i, const char *name, const char *path) {
    int64_t n;
    float *h = i < 0 ? host_f32(m, name, &n) : layer_tensor(m, i, name, &n);
    put(f, h, sizeof *h, (size_t)n, path);
    free(h);
}

/* llm.c's gpt2_124M.bin: fill_in_parameter_sizes' 16 tensors, each over all layers. */
static void write_llmc(accel_module *m, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) fail(path);
    int header[256] = {20240326, 3, NPOS, V, L, NH, C, VP};
    put(f, header, sizeof(int), 256, path);
    int64_t n;
    float *wte = host_f32(m, "transformer.wte.weight", &n);
    put(f, wte, sizeof *wte, (size_t)n, path);
    free(wte);
    float *pad = calloc((size_t)(VP - V) * C, sizeof *pad);
    if (!pad) fail("calloc");
    put(f, pad, sizeof *pad, (size_t)(VP - V) * C, path);
    free(pad);
    put_tensor(f, m, -1, "transformer.wpe.weight", path);
    /* ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb fcprojw fcprojb */
    static const struct { const char *suffix; int w; } ORDER[] = {
        {"ln_1.weight", -1},       {"ln_1.bias", -1},      {NULL, W_QKV},    {"attn.c_attn.bias", -1},
        {NULL, W_ATTPROJ},         {"attn.c_proj.bias", -1}, {"ln_2.weight", -1}, {"ln_2.bias", -1},
        {NULL, W_FC},              {"mlp.c_fc.bias", -1},  {NULL, W_FCPROJ}, {"mlp.c_proj.bias", -1}};
    for (size_t k = 0; k < sizeof ORDER / sizeof ORDER[0]; k++)
        for (int i = 0; i < L; i++) {
            if (ORDER[k].suffix) {
                put_tensor(f, m, i, ORDER[k].suffix, path);
                continue;
            }
            float *w = layer_weight(m, i, ORDER[k].w);
            put(f, w, sizeof *w, (size_t)(W_IN[ORDER[k].w] * W_OUT[ORDER[k].w]), path);
            free(w);
        }
    put_tensor(f, m, -1, "transformer.ln_f.weight", path);
    put_tensor(f, m, -1, "transformer.ln_f.bias", path);
    if (fclose(f)) fail(path);
}

/* One ggml tensor record: n_dims, name length, type (0 f32, 1 f16), ne[]
 * (fastest dimension first), name, data. rows x cols row-major; rows 0: 1-D. */
static void ggml_tensor(FILE *f, const char *name, const float *x, int32_t rows, int32_t cols, bool f16,
                        const char *path) {
    int32_t hdr[5] = {rows ? 2 : 1, (int32_t)strlen(name), f16, cols, rows};
    put(f, hdr, sizeof(int32_t), rows ? 5 : 4, path);
    put(f, name, 1, strlen(name), path);
    int64_t n = (int64_t)(rows ? rows : 1) * cols;
    if (!f16) {
        put(f, x, sizeof *x, (size_t)n, path);
        return;
    }
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!h) fail("malloc");
    for (int64_t i = 0; i < n; i++) h[i] = accel_f32_to_f16(x[i]);
    put(f, h, sizeof *h, (size_t)n, path);
    free(h);
}

static void ggml_model_tensor(FILE *f, accel_module *m, const char *src, const char *name, int32_t rows,
                              bool f16, const char *path) {
    int64_t n;
    float *x = host_f32(m, src, &n);
    ggml_tensor(f, name, x, rows, (int32_t)(rows ? n / rows : n), f16, path);
    free(x);
}

/* ggml's gpt-2 model file, ftype 0 (f32) or 1 (f16). */
static void write_ggml(accel_module *m, const char *path, bool f16) {
    FILE *f = fopen(path, "wb");
    if (!f) fail(path);
    int32_t hdr[8] = {0x67676d6c, V, NPOS, C, NH, L, f16, V};
    put(f, hdr, sizeof(int32_t), 8, path);
    for (int id = 0; id < V; id++) {
        char w[7];
        token_word(id, w);
        uint32_t len = 6;
        put(f, &len, sizeof len, 1, path);
        put(f, w, 1, len, path);
    }
    ggml_model_tensor(f, m, "transformer.ln_f.weight", "model/ln_f/g", 0, false, path);
    ggml_model_tensor(f, m, "transformer.ln_f.bias", "model/ln_f/b", 0, false, path);
    ggml_model_tensor(f, m, "transformer.wte.weight", "model/wte", V, f16, path);
    ggml_model_tensor(f, m, "transformer.wpe.weight", "model/wpe", NPOS, false, path);
    static const char *GGML_W[N_W] = {"attn/c_attn", "attn/c_proj", "mlp/c_fc", "mlp/c_proj"};
    for (int i = 0; i < L; i++) {
        char src[96], name[96];
        for (int k = 0; k < 2; k++) { /* ln_1, ln_2: g, b */
            for (int b = 0; b < 2; b++) {
                snprintf(src, sizeof src, "transformer.h.%d.ln_%d.%s", i, k + 1, b ? "bias" : "weight");
                snprintf(name, sizeof name, "model/h%d/ln_%d/%s", i, k + 1, b ? "b" : "g");
                ggml_model_tensor(f, m, src, name, 0, false, path);
            }
        }
        for (int w = 0; w < N_W; w++) {
            float *x = layer_weight(m, i, w);
            snprintf(name, sizeof name, "model/h%d/%s/w", i, GGML_W[w]);
            ggml_tensor(f, name, x, (int32_t)W_OUT[w], (int32_t)W_IN[w], f16, path);
            free(x);
            snprintf(src, sizeof src, "transformer.h.%d.%s.bias", i, W_NAME[w]);
            snprintf(name, sizeof name, "model/h%d/%s/b", i, GGML_W[w]);
            ggml_model_tensor(f, m, src, name, 0, false, path);
        }
    }
    if (fclose(f)) fail(path);
}

static void write_tokens(const char *path, const int *tok, int64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) fail(path);
    int header[256] = {20240520, 1, (int)n};
    put(f, header, sizeof(int), 256, path);
    for (int64_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)tok[i];
        put(f, &t, sizeof t, 1, path);
    }
    if (fclose(f)) fail(path);
}

static void mkdirs(const char *dir, const char *sub) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    for (char *s = p + 1;; s++) { /* every component, DIR included */
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        mkdir(p, 0777);
        if (!(*s = c)) break;
    }
}

static int export_all(const char *dir, uint64_t seed, int64_t B, int64_t T, int64_t P) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = V, c.hidden_size = C, c.intermediate_size = 4 * C, c.num_hidden_layers = L;
    c.num_attention_heads = NH, c.num_key_value_heads = NH, c.max_position_embeddings = NPOS;
    c.rms_norm_eps = 1e-5, c.tie_word_embeddings = true, c.torch_dtype = ACCEL_F32;
    c.bos_token_id = c.eos_token_ids[0] = V - 1; /* <|endoftext|>, GPT2Config's; the default is Llama's 1 / 2 */
    snprintf(c.model_type, sizeof c.model_type, "gpt2");
    accel_manual_seed(seed);
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    if (!m) fail("accel_llama_new");
    char p[4096];
    mkdirs(dir, "dev/data/tinyshakespeare");
    snprintf(p, sizeof p, "%s/hf", dir);
    if (accel_save_pretrained(m, p, 0) != ACCEL_OK) fail(p);
    snprintf(p, sizeof p, "%s/gpt2_124M.bin", dir);
    write_llmc(m, p);
    for (int f16 = 0; f16 < 2; f16++) {
        snprintf(p, sizeof p, "%s/ggml-model-%s.bin", dir, f16 ? "f16" : "f32");
        write_ggml(m, p, f16);
    }
    accel_module_free(m);
    int64_t n = B * T + 1;
    int *tok = malloc((size_t)(n > P ? n : P) * sizeof *tok);
    if (!tok) fail("malloc");
    lcg_ids(12345, n, tok);
    snprintf(p, sizeof p, "%s/dev/data/tinyshakespeare/tiny_shakespeare_train.bin", dir);
    write_tokens(p, tok, n);
    snprintf(p, sizeof p, "%s/dev/data/tinyshakespeare/tiny_shakespeare_val.bin", dir);
    write_tokens(p, tok, n);
    lcg_ids(777, P, tok);
    snprintf(p, sizeof p, "%s/prompt_ids", dir);
    FILE *ids = fopen(p, "w");
    snprintf(p, sizeof p, "%s/prompt.txt", dir);
    FILE *txt = fopen(p, "w");
    if (!ids || !txt) fail(p);
    for (int64_t i = 0; i < P; i++) {
        char w[7];
        token_word(tok[i], w);
        fprintf(ids, "%s%d", i ? "," : "", tok[i]);
        fputs(w, txt);
    }
    free(tok);
    if (fclose(ids) | fclose(txt)) fail(p);
    printf("%s\n", dir);
    return 0;
}

/* The batch of llm.c's token file: inputs and targets [B, T] (i64). */
static void read_batch(const char *dir, int64_t B, int64_t T, accel_tensor **in, accel_tensor **tg) {
    char p[4096];
    snprintf(p, sizeof p, "%s/dev/data/tinyshakespeare/tiny_shakespeare_train.bin", dir);
    FILE *f = fopen(p, "rb");
    int header[256];
    int64_t n = B * T + 1;
    uint16_t *tok = malloc((size_t)n * sizeof *tok);
    int64_t *x = malloc((size_t)(2 * (n - 1)) * sizeof *x);
    if (!f || !tok || !x || fread(header, sizeof(int), 256, f) != 256 || header[0] != 20240520 ||
        header[2] != n || fread(tok, sizeof *tok, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "bench_gpt2_peers: %s is not a token file of B*T+1 = %lld tokens\n", p, (long long)n);
        exit(1);
    }
    fclose(f);
    for (int64_t i = 0; i < n - 1; i++) x[i] = tok[i], x[n - 1 + i] = tok[i + 1];
    *in = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){B, T}, ACCEL_CPU_DEVICE);
    *tg = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){B, T}, ACCEL_CPU_DEVICE);
    if (!*in || !*tg || accel_tensor_from_host(*in, x) != ACCEL_OK || accel_tensor_from_host(*tg, x + n - 1) != ACCEL_OK)
        fail("batch");
    free(tok);
    free(x);
}

static int train(const char *dir, const bench_llama_args *a) {
    accel_set_num_threads(a->threads);
    accel_accelerator_opts ao = {.mixed_precision = a->mixed_precision};
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) fail("accel_accelerator_new");
    char p[4096];
    snprintf(p, sizeof p, "%s/hf", dir);
    accel_dispatched *loaded = NULL;
    accel_module *model = accel_llama_from_pretrained(p, NULL, NULL, NULL, NULL, &loaded);
    if (!model) fail(p);
    accel_module_train(model, true);
    accel_optim_hparams hp = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-4);
    hp.beta1 = 0.9, hp.beta2 = 0.999, hp.eps = 1e-8, hp.weight_decay = 0.0;
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &hp);
    if (!opt) fail("accel_optimizer_new_module");
    if (accel_accelerator_prepare_model(acc, model) != ACCEL_OK) fail("accel_accelerator_prepare_model");
    if (accel_accelerator_prepare_optimizer(acc, opt) != ACCEL_OK) fail("accel_accelerator_prepare_optimizer");
    accel_tensor *in, *tg;
    read_batch(dir, a->B, a->T, &in, &tg);
    double *ms = malloc((size_t)a->steps * sizeof *ms);
    if (!ms) fail("malloc");
    for (int s = 0; s < a->steps; s++) {
        bench_step_time t;
        const char *failed = bench_llama_step(acc, model, opt, in, tg, &t);
        if (failed) fail(failed);
        ms[s] = t.total * 1e3;
        printf("step %d: train loss %f (took %f ms) fwd %.1f bwd %.1f opt %.1f\n", s, t.loss, ms[s], t.fwd * 1e3,
               t.bwd * 1e3, t.opt * 1e3);
        fflush(stdout);
    }
    /* step 0 allocates what the later steps reuse (llm.c's too): left out */
    if (a->steps > 1) printf("step_ms_median=%.1f (steps 1..%d)\n", bench_median(ms + 1, a->steps - 1), a->steps - 1);
    free(ms);
    accel_tensor_free(in);
    accel_tensor_free(tg);
    accel_optimizer_free(opt);
    accel_accelerator_free(acc);
    accel_module_free(model);
    accel_dispatched_free(loaded);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "export") && strcmp(argv[1], "train"))) {
        fprintf(stderr, "usage: bench_gpt2_peers export DIR [--seed S] [--batch B] [--seq T] [--prompt P]\n"
                        "       bench_gpt2_peers train DIR [--steps N] [--threads P] [--mixed_precision no|bf16]\n");
        return 2;
    }
    const char *cmd = argv[1], *dir = argv[2];
    uint64_t seed = 0;
    int64_t prompt = 128;
    /* --seed and --prompt are export's own; the rest are bench_llama_parse's */
    /* train_gpt2.c's B 4, T 64 and 10 steps unless given */
    char *rest[40] = {argv[0], "--batch", "4", "--seq", "64", "--steps", "10"};
    int n = 7;
    for (int i = 3; i < argc && n < 40; i++) {
        if (!strcmp(cmd, "export") && i + 1 < argc && !strcmp(argv[i], "--seed")) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(cmd, "export") && i + 1 < argc && !strcmp(argv[i], "--prompt")) prompt = atoll(argv[++i]);
        else rest[n++] = argv[i];
    }
    bench_llama_args a;
    if (bench_llama_parse("bench_gpt2_peers", !strcmp(cmd, "train") ? "threads mixed_precision" : "", n, rest, &a))
        return 2;
    if (!strcmp(cmd, "export")) {
        if (prompt < 1 || prompt >= NPOS || a.T > NPOS) {
            fprintf(stderr, "bench_gpt2_peers: --prompt and --seq must be in [1, %d)\n", NPOS);
            return 2;
        }
        return export_all(dir, seed, a.B, a.T, prompt);
    }
    return train(dir, &a);
}
