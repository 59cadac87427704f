/* BERT (accel/bert.h): transformers' BertModel and its heads
 * (BertForSequenceClassification, BertForTokenClassification,
 * BertForQuestionAnswering, BertForMaskedLM, BertForPreTraining,
 * BertForNextSentencePrediction, BertForMultipleChoice), with their module trees, names,
 * init and forward; RoBERTa and XLM-RoBERTa (the same encoder with positions
 * counted from the ids, no pooler, their own sequence and masked-LM heads)
 * from the same code, told apart by the config's model_type. A bidirectional
 * encoder: attention over explicit scores with an additive padding mask (no
 * causal mask), post-LN blocks. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "accel/bert.h"
#include "family.h"
#include "ops/attention_masked.h"
#include "nn_internal.h"

accel_bert_config accel_bert_config_default(void) {
    accel_bert_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 30522;
    c.hidden_size = 768;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.intermediate_size = 3072;
    c.max_position_embeddings = 512;
    c.type_vocab_size = 2;
    c.num_labels = 2;
    c.pad_token_id = 0;
    c.layer_norm_eps = 1e-12;
    c.initializer_range = 0.02;
    c.hidden_dropout_prob = 0.1;
    c.attention_probs_dropout_prob = 0.1;
    c.classifier_dropout = -1;
    c.torch_dtype = ACCEL_F32;
    return c;
}

accel_bert_config accel_bert_config_default_for(accel_bert_model_type t) {
    accel_bert_config c = accel_bert_config_default();
    c.model_type = t; /* one outside accel_bert_model_type: accel_bert_config_check names it */
    if (t == ACCEL_BERT_MODEL_ROBERTA || t == ACCEL_BERT_MODEL_XLM_ROBERTA) c.pad_token_id = 1;
    if (t == ACCEL_BERT_MODEL_ROBERTA) c.vocab_size = 50265;
    return c;
}

static const char *const MODEL_TYPE_NAMES[ACCEL_BERT_MODEL_TYPES] = {"bert", "roberta", "xlm-roberta"};

const char *accel_bert_model_type_name(accel_bert_model_type t) {
    return (unsigned)t < ACCEL_BERT_MODEL_TYPES ? MODEL_TYPE_NAMES[t] : NULL;
}

const char *accel_bert_base_model_prefix(accel_bert_model_type t) {
    return (unsigned)t >= ACCEL_BERT_MODEL_TYPES ? NULL : t == ACCEL_BERT_MODEL_BERT ? "bert" : "roberta";
}

/* RoBERTa and XLM-RoBERTa: positions from the ids, no pooler, their own heads. */
static bool is_roberta(const accel_bert_config *c) { return c->model_type != ACCEL_BERT_MODEL_BERT; }

/* Whether c's BertModel has a pooler: the heads that read it (transformers'
 * add_pooling_layer=True): BERT's sequence classifier, pre-training and next
 * sentence heads; multiple choice in every model type. */
static bool has_pooler(const accel_bert_config *c) {
    accel_bert_head h = c->head;
    return h == ACCEL_BERT_MULTIPLE_CHOICE ||
           (!is_roberta(c) && (h == ACCEL_BERT_SEQUENCE_CLASSIFICATION || h == ACCEL_BERT_PRETRAINING ||
                               h == ACCEL_BERT_NEXT_SENTENCE_PREDICTION));
}

/* The heads whose decoder is the word embeddings (tied). */
static bool has_mlm(const accel_bert_config *c) {
    return c->head == ACCEL_BERT_MASKED_LM || c->head == ACCEL_BERT_PRETRAINING;
}

/* The root's children in transformers' order: the base model ("bert",
 * "roberta") then the head, but XLM-RoBERTa's classes register the head
 * first. The index of the base model; the head is the other. */
static int base_index(const accel_bert_config *c) { return c->model_type == ACCEL_BERT_MODEL_XLM_ROBERTA; }

/* Elements of all the weights (the pooler counted for every head, the masked
 * LM's transform as a classifier of C labels and its bias as one more word
 * row, seq_relationship as two more rows: a bound), or -1 when that overflows int64 (the sizes come from a file). */
static int64_t weight_elems(const accel_bert_config *c) {
    int64_t C = c->hidden_size, I = c->intermediate_size, rows, emb, layer, t, head, total;
    int64_t labels = c->num_labels > C ? c->num_labels : C;
    bool of = __builtin_add_overflow(c->vocab_size, c->max_position_embeddings, &rows) ||
              __builtin_add_overflow(rows, c->vocab_size, &rows) ||
              __builtin_add_overflow(rows, c->type_vocab_size, &rows) || __builtin_add_overflow(rows, 4, &rows) ||
              __builtin_mul_overflow(rows, C, &emb) ||
              /* q, k, v, o with biases; two LayerNorms; the MLP's two linears */
              __builtin_add_overflow(C, 1, &t) || __builtin_mul_overflow(t, C, &t) ||
              __builtin_mul_overflow(t, 4, &layer) || __builtin_add_overflow(layer, 4 * C, &layer) ||
              __builtin_mul_overflow(C, I, &t) || __builtin_mul_overflow(t, 2, &t) ||
              __builtin_add_overflow(layer, t, &layer) || __builtin_add_overflow(layer, I + C, &layer) ||
              __builtin_mul_overflow(layer, c->num_hidden_layers, &total) ||
              __builtin_add_overflow(total, emb, &total) ||
              __builtin_add_overflow(C, 1, &t) || __builtin_add_overflow(C, labels, &head) ||
              __builtin_mul_overflow(t, head, &head) || __builtin_add_overflow(total, head, &total) ||
              __builtin_mul_overflow(total, (int64_t)accel_dtype_size(c->torch_dtype), &t);
    return of ? -1 : total;
}

static bool is_prob(double p) { return p >= 0 && p < 1; }

accel_status accel_bert_config_check(const accel_bert_config *c, const char *who) {
    if (!who) who = "accel_bert_config_check";
    if (!c) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: config is NULL", who);
    const char *bad = NULL;
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->num_hidden_layers < 0 || c->num_attention_heads <= 0 ||
        c->intermediate_size <= 0 || c->max_position_embeddings <= 0 || c->type_vocab_size <= 0)
        bad = "sizes must be positive";
    else if (c->hidden_size % c->num_attention_heads)
        bad = "hidden_size must be a multiple of num_attention_heads";
    else if ((unsigned)c->head >= ACCEL_BERT_HEADS)
        bad = "head must be one of accel_bert_head's";
    else if ((unsigned)c->model_type >= ACCEL_BERT_MODEL_TYPES)
        bad = "model_type must be one of accel_bert_model_type's";
    else if (!accel_bert_class_name(c->model_type, c->head))
        bad = "the pre-training and next sentence prediction heads are BERT's (transformers has no RoBERTa class "
              "of them)";
    else if (c->head == ACCEL_BERT_SEQUENCE_CLASSIFICATION && c->num_labels < 2)
        bad = "num_labels must be at least 2 (single-label classification)";
    else if (c->head == ACCEL_BERT_TOKEN_CLASSIFICATION && c->num_labels < 1)
        bad = "num_labels must be at least 1 (token classification)";
    /* transformers splits qa_outputs' outputs into exactly a start and an end */
    else if (c->head == ACCEL_BERT_QUESTION_ANSWERING && c->num_labels != 2)
        bad = "num_labels must be 2 (question answering: a start and an end logit per position)";
    else if (has_mlm(c) && c->untied_word_embeddings)
        bad = "tie_word_embeddings is false: a masked-LM decoder of its own (not the word embeddings) is not "
              "implemented";
    else if (c->pad_token_id < -1 || c->pad_token_id >= c->vocab_size)
        bad = "pad_token_id must be -1 (none) or below vocab_size";
    /* position ids count from pad_token_id + 1; its own row is the pads' */
    else if (is_roberta(c) && (c->pad_token_id < 0 || c->pad_token_id >= c->max_position_embeddings - 1))
        bad = "pad_token_id must be in [0, max_position_embeddings - 1) (RoBERTa's position ids count from "
              "pad_token_id + 1)";
    else if (!(c->layer_norm_eps > 0) || !isfinite(c->layer_norm_eps) || !(c->initializer_range >= 0) ||
             !isfinite(c->initializer_range))
        bad = "layer_norm_eps must be > 0 and initializer_range >= 0 (finite)";
    else if (!is_prob(c->hidden_dropout_prob))
        bad = "hidden_dropout_prob must be in [0, 1)";
    else if (!is_prob(c->attention_probs_dropout_prob))
        bad = "attention_probs_dropout_prob must be in [0, 1)";
    else if (!(c->classifier_dropout < 1) || isnan(c->classifier_dropout))
        bad = "classifier_dropout must be in [0, 1) (< 0: hidden_dropout_prob)";
    else if (!accel_dtype_is_float(c->torch_dtype))
        bad = "torch_dtype must be a float dtype";
    else if (c->num_hidden_layers > ACCEL_LLAMA_MAX_LAYERS)
        bad = "num_hidden_layers is over accel's limit of 65536";
    else if (weight_elems(c) < 0)
        bad = "the weights would take more than 2^63 bytes";
    const char *cls = accel_bert_class_name(c->model_type, c->head);
    if (!cls) cls = accel_bert_head_name(c->head);
    if (bad)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: %s (%s: vocab %lld, hidden %lld, heads %lld, layers %lld, intermediate %lld, "
                               "labels %lld, max_position_embeddings %lld, type_vocab_size %lld)", who, bad,
                               cls ? cls : "head ?", (long long)c->vocab_size, (long long)c->hidden_size,
                               (long long)c->num_attention_heads, (long long)c->num_hidden_layers,
                               (long long)c->intermediate_size, (long long)c->num_labels,
                               (long long)c->max_position_embeddings, (long long)c->type_vocab_size);
    return ACCEL_OK;
}

/* ---- the module tree */

static accel_tensor *root_forward(accel_module *m, accel_tensor *ids);
static accel_tensor *model_forward(accel_module *m, accel_tensor *ids);
/* BertModel's impl is the root's config (borrowed). */
static void borrowed_impl(accel_module *m) { (void)m; }

/* The roots, one per model type and accel_bert_head: their type names are
 * transformers' classes; RoBERTa has no pre-training or next sentence class
 * (NULL names, refused by accel_bert_config_check). */
#define ROOTS(P, PT, NSP)                                                                                            \
    {{P "ForSequenceClassification", root_forward, NULL},                                                          \
     {P "ForTokenClassification", root_forward, NULL},                                                             \
     {P "ForQuestionAnswering", root_forward, NULL},                                                               \
     {P "ForMaskedLM", root_forward, NULL},                                                                        \
     {PT, root_forward, NULL},                                                                                     \
     {NSP, root_forward, NULL},                                                                                    \
     {P "ForMultipleChoice", root_forward, NULL}}
static const accel_module_ops ROOT_OPS[ACCEL_BERT_MODEL_TYPES][ACCEL_BERT_HEADS] = {
    ROOTS("Bert", "BertForPreTraining", "BertForNextSentencePrediction"), ROOTS("Roberta", NULL, NULL),
    ROOTS("XLMRoberta", NULL, NULL)};

const char *accel_bert_class_name(accel_bert_model_type t, accel_bert_head head) {
    return (unsigned)t < ACCEL_BERT_MODEL_TYPES && (unsigned)head < ACCEL_BERT_HEADS ? ROOT_OPS[t][head].type_name
                                                                                      : NULL;
}

const char *accel_bert_head_name(accel_bert_head head) { return accel_bert_class_name(ACCEL_BERT_MODEL_BERT, head); }

/* The other classes of the tree, per model type (K_MODEL's, K_MLM's and
 * K_CLS_HEAD's impl: the root's config, borrowed). The masked-LM head: BERT's
 * cls > predictions > transform, decoder; RoBERTa's lm_head (dense,
 * layer_norm, decoder). RobertaClassificationHead is RoBERTa's sequence
 * classifier (BERT's is a Linear). */
enum { K_MODEL, K_EMB, K_ENCODER, K_LAYER, K_ATTN, K_SELF, K_SELF_OUT, K_INTER, K_OUT, K_POOLER, K_MLM, K_PRED,
       K_TRANSFORM, K_CLS_HEAD, K_PT_HEADS, K_NSP, K_KINDS };
static accel_tensor *mlm_forward(accel_module *head, accel_tensor *h);
static accel_tensor *nsp_forward(accel_module *head, accel_tensor *pooled);
/* h[:, 0] of h [B, T, C]: the [CLS] / <s> position the pooler and the
 * classification head read; T 0 (no first token) refused naming who (a
 * slice of nothing squeezed would keep its [B, 0, C] shape). */
static accel_tensor *first_token(accel_tensor *h, const char *who) {
    if (h && h->shape[1] == 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: ids [%lld, 0]: the classification reads the first position, and a "
                        "sequence of 0 tokens has none", who, (long long)h->shape[0]);
        return NULL;
    }
    return h ? accel_squeeze(accel_slice(h, 1, 0, 1, 1), 1) : NULL;
}

static accel_tensor *cls_head_forward(accel_module *head, accel_tensor *h);
#define BODY(P)                                                                                                      \
    [K_MODEL] = {P "Model", model_forward, borrowed_impl}, [K_EMB] = {P "Embeddings", NULL, NULL},                 \
    [K_ENCODER] = {P "Encoder", NULL, NULL}, [K_LAYER] = {P "Layer", NULL, NULL},                                  \
    [K_ATTN] = {P "Attention", NULL, NULL}, [K_SELF] = {P "SelfAttention", NULL, NULL},                            \
    [K_SELF_OUT] = {P "SelfOutput", NULL, NULL}, [K_INTER] = {P "Intermediate", NULL, NULL},                       \
    [K_OUT] = {P "Output", NULL, NULL}, [K_POOLER] = {P "Pooler", NULL, NULL}
#define ROBERTA_HEADS(P)                                                                                             \
    [K_MLM] = {P "LMHead", mlm_forward, borrowed_impl},                                                            \
    [K_CLS_HEAD] = {P "ClassificationHead", cls_head_forward, borrowed_impl}
static const accel_module_ops OPS[ACCEL_BERT_MODEL_TYPES][K_KINDS] = {
    {BODY("Bert"), [K_MLM] = {"BertOnlyMLMHead", mlm_forward, borrowed_impl},
     [K_PRED] = {"BertLMPredictionHead", NULL, NULL}, [K_TRANSFORM] = {"BertPredictionHeadTransform", NULL, NULL},
     /* BertPreTrainingHeads' forward is the predictions' (seq_relationship is called on its own) */
     [K_PT_HEADS] = {"BertPreTrainingHeads", mlm_forward, borrowed_impl},
     [K_NSP] = {"BertOnlyNSPHead", nsp_forward, NULL}},
    {BODY("Roberta"), ROBERTA_HEADS("Roberta")},
    {BODY("XLMRoberta"), ROBERTA_HEADS("XLMRoberta")}};

/* The model type of m when it is a module of class kind k (-1: a root of
 * any head), else -1. */
static int type_of(const accel_module *m, int k) {
    for (int t = 0; m && t < ACCEL_BERT_MODEL_TYPES; t++)
        for (int h = 0; h < (k < 0 ? ACCEL_BERT_HEADS : 1); h++)
            if (m->ops == (k < 0 ? &ROOT_OPS[t][h] : &OPS[t][k])) return t;
    return -1;
}

static bool is_root(const accel_module *m) { return type_of(m, -1) >= 0; }
static bool is_model(const accel_module *m) { return type_of(m, K_MODEL) >= 0; }

/* Child indices, fixed by construction order (transformers' order). */
enum { PRED_TRANSFORM = 0, PRED_DECODER = 1 };
enum { LM_DENSE = 0, LM_NORM = 1, LM_DECODER = 2 };    /* RobertaLMHead */
enum { CLS_DENSE = 0, CLS_OUT_PROJ = 1 };              /* RobertaClassificationHead */
enum { MODEL_EMB = 0, MODEL_ENCODER = 1, MODEL_POOLER = 2 };
enum { EMB_WORD = 0, EMB_POS = 1, EMB_TYPE = 2, EMB_NORM = 3 };
/* The embeddings' children in transformers' order, [is_roberta][EMB_*]:
 * BERT's word, position, token type, LayerNorm; RoBERTa's word, token type,
 * LayerNorm, position. */
static const int EMB_AT[2][4] = {{0, 1, 2, 3}, {0, 3, 1, 2}};
enum { LAYER_ATTN = 0, LAYER_INTER = 1, LAYER_OUT = 2 };
enum { ATTN_SELF = 0, ATTN_OUT = 1 };
enum { SELF_Q = 0, SELF_K = 1, SELF_V = 2 };
enum { OUT_DENSE = 0, OUT_NORM = 1 }; /* BertSelfOutput and BertOutput */

/* m's dotted path below the top of the tree being built ("" at the top);
 * returns its length (>= n: cut). */
static int path_below_top(const accel_module *m, char *out, size_t n) {
    if (!m->parent) {
        out[0] = '\0';
        return 0;
    }
    int k = path_below_top(m->parent, out, n);
    return (size_t)k >= n ? k : k + snprintf(out + k, n - (size_t)k, "%s%s", k ? "." : "", m->name);
}

/* parent.name = child. A NULL child failed to build (out of memory for one of
 * its tensors, say): its error is kept, behind the path of the module that
 * failed, which each enclosing add() lengthens ("building
 * bert.embeddings.word_embeddings: out of memory allocating N bytes"). A NULL
 * parent already failed (its error stands): child is freed. */
static accel_module *add(accel_module *parent, const char *name, accel_module *child) {
    if (parent && !child) {
        char why[480], at[256];
        const char *prev = accel_last_error();
        bool ours = !strncmp(prev, "building ", 9); /* a deeper add()'s: "building PATH: cause" */
        snprintf(why, sizeof why, "%s", ours ? prev + 9 : prev);
        int k = path_below_top(parent, at, sizeof at);
        accel_set_error(accel_last_status(), "building %s%s%s%s%s", at, k ? "." : "", name, ours ? "." : ": ", why);
    }
    if (!parent || !child) {
        accel_module_free(child);
        return NULL;
    }
    return accel_module_add_child(parent, name, child);
}

static accel_module *linear(const accel_bert_config *c, int64_t in, int64_t out, accel_device dev) {
    return accel__linear_create(in, out, true, dev, c->torch_dtype, c->initializer_range);
}

/* LayerNorm: weight 1, bias 0 (accel_layer_norm_new's). */
static accel_module *layer_norm(const accel_bert_config *c, accel_device dev) {
    return accel_layer_norm_new(c->hidden_size, c->layer_norm_eps, true, dev, c->torch_dtype);
}

/* BertSelfOutput / BertOutput: dense(in -> C) and LayerNorm. */
static accel_module *dense_norm(int kind, const accel_bert_config *c, int64_t in, accel_device dev) {
    accel_module *m = accel_module_new(&OPS[c->model_type][kind], NULL);
    if (!add(m, "dense", linear(c, in, c->hidden_size, dev)) || !add(m, "LayerNorm", layer_norm(c, dev))) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

static accel_module *new_layer(const accel_bert_config *c, accel_device dev) {
    int64_t C = c->hidden_size;
    const accel_module_ops *ops = OPS[c->model_type];
    accel_module *layer = accel_module_new(&ops[K_LAYER], NULL);
    accel_module *attn = add(layer, "attention", accel_module_new(&ops[K_ATTN], NULL));
    accel_module *self = add(attn, "self", accel_module_new(&ops[K_SELF], NULL));
    accel_module *inter = self && add(self, "query", linear(c, C, C, dev)) && add(self, "key", linear(c, C, C, dev)) &&
                                  add(self, "value", linear(c, C, C, dev)) &&
                                  add(attn, "output", dense_norm(K_SELF_OUT, c, C, dev))
                              ? add(layer, "intermediate", accel_module_new(&ops[K_INTER], NULL))
                              : NULL;
    if (!inter || !add(inter, "dense", linear(c, C, c->intermediate_size, dev)) ||
        !add(layer, "output", dense_norm(K_OUT, c, c->intermediate_size, dev))) {
        accel_module_free(layer);
        return NULL;
    }
    return layer;
}

/* n rows; the word embeddings' padding_idx is pad_token_id (-1 for the others) */
static accel_module *embedding(const accel_bert_config *c, int64_t n, int64_t padding_idx, accel_device dev) {
    return accel__padded_embedding_create(n, c->hidden_size, dev, c->torch_dtype, c->initializer_range, padding_idx);
}

/* BertModel over the root's config c; the pooler where has_pooler says (the
 * other heads' add_pooling_layer=False). RoBERTa's position embeddings have padding_idx
 * pad_token_id (the pads' position). */
static accel_module *new_model(accel_bert_config *c, accel_device dev) {
    const accel_module_ops *ops = OPS[c->model_type];
    accel_module *model = accel_module_new(&ops[K_MODEL], c);
    accel_module *emb = add(model, "embeddings", accel_module_new(&ops[K_EMB], NULL));
    bool rob = is_roberta(c); /* the children in EMB_AT's order */
    bool ok = add(emb, "word_embeddings", embedding(c, c->vocab_size, c->pad_token_id, dev)) &&
              (rob || add(emb, "position_embeddings", embedding(c, c->max_position_embeddings, -1, dev))) &&
              add(emb, "token_type_embeddings", embedding(c, c->type_vocab_size, -1, dev)) &&
              add(emb, "LayerNorm", layer_norm(c, dev)) &&
              (!rob || add(emb, "position_embeddings",
                           embedding(c, c->max_position_embeddings, c->pad_token_id, dev)));
    accel_module *encoder = ok ? add(model, "encoder", accel_module_new(&ops[K_ENCODER], NULL)) : NULL;
    accel_module *layers = add(encoder, "layer", accel_module_new(&accel__module_list_ops, NULL));
    ok = layers != NULL;
    for (int64_t i = 0; ok && i < c->num_hidden_layers; i++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)i);
        ok = add(layers, name, new_layer(c, dev)) != NULL;
    }
    if (ok && !has_pooler(c)) return model;
    accel_module *pooler = ok ? add(model, "pooler", accel_module_new(&ops[K_POOLER], NULL)) : NULL;
    if (!pooler || !add(pooler, "dense", linear(c, c->hidden_size, c->hidden_size, dev))) {
        accel_module_free(model);
        return NULL;
    }
    return model;
}

/* BertOnlyMLMHead (masked LM) or BertPreTrainingHeads (pre-training):
 * predictions.transform (dense C -> C, then the activation, then LayerNorm),
 * predictions.bias [V] (zeros) and predictions.decoder (C -> V), built on
 * meta: accel_bert_new ties its weight to the word embeddings and its bias
 * to predictions.bias, as transformers does; pre-training's
 * seq_relationship (C -> 2) after predictions. */
static accel_module *mlm_head(accel_bert_config *c, accel_device dev) {
    bool pt = c->head == ACCEL_BERT_PRETRAINING;
    accel_module *cls = accel_module_new(&OPS[c->model_type][pt ? K_PT_HEADS : K_MLM], c);
    accel_module *pred = add(cls, "predictions", accel_module_new(&OPS[c->model_type][K_PRED], NULL));
    if (!add(pred, "transform", dense_norm(K_TRANSFORM, c, c->hidden_size, dev)) ||
        !accel__new_param(pred, "bias", c->torch_dtype, 1, &c->vocab_size, dev) ||
        !add(pred, "decoder", linear(c, c->hidden_size, c->vocab_size, ACCEL_META_DEVICE)) ||
        (pt && !add(cls, "seq_relationship", linear(c, c->hidden_size, 2, dev)))) {
        accel_module_free(cls);
        return NULL;
    }
    return cls;
}

/* RobertaLMHead: bias [V] (zeros), dense (C -> C), layer_norm, decoder
 * (C -> V, on meta: tied as mlm_head's). */
static accel_module *lm_head(accel_bert_config *c, accel_device dev) {
    accel_module *m = accel_module_new(&OPS[c->model_type][K_MLM], c);
    if (!accel__new_param(m, "bias", c->torch_dtype, 1, &c->vocab_size, dev) ||
        !add(m, "dense", linear(c, c->hidden_size, c->hidden_size, dev)) || !add(m, "layer_norm", layer_norm(c, dev)) ||
        !add(m, "decoder", linear(c, c->hidden_size, c->vocab_size, ACCEL_META_DEVICE))) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

/* RobertaClassificationHead: dense (C -> C), out_proj (C -> num_labels). */
static accel_module *cls_head(accel_bert_config *c, accel_device dev) {
    accel_module *m = accel_module_new(&OPS[c->model_type][K_CLS_HEAD], c);
    if (!add(m, "dense", linear(c, c->hidden_size, c->hidden_size, dev)) ||
        !add(m, "out_proj", linear(c, c->hidden_size, c->num_labels, dev))) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

/* BertOnlyNSPHead: seq_relationship (C -> 2). */
static accel_module *nsp_head(accel_bert_config *c, accel_device dev) {
    accel_module *m = accel_module_new(&OPS[c->model_type][K_NSP], NULL);
    if (!add(m, "seq_relationship", linear(c, c->hidden_size, 2, dev))) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

/* The root's head module (named by head_child_name) of c's head. */
static accel_module *new_head(accel_bert_config *c, accel_device dev) {
    bool rob = is_roberta(c);
    switch (c->head) {
    case ACCEL_BERT_MASKED_LM: return rob ? lm_head(c, dev) : mlm_head(c, dev);
    case ACCEL_BERT_PRETRAINING: return mlm_head(c, dev);
    case ACCEL_BERT_NEXT_SENTENCE_PREDICTION: return nsp_head(c, dev);
    case ACCEL_BERT_MULTIPLE_CHOICE: return linear(c, c->hidden_size, 1, dev); /* one score per choice */
    case ACCEL_BERT_SEQUENCE_CLASSIFICATION:
        if (rob) return cls_head(c, dev);
        break;
    default: break;
    }
    return linear(c, c->hidden_size, c->num_labels, dev);
}

static const char *head_child_name(const accel_bert_config *c) {
    switch (c->head) {
    case ACCEL_BERT_MASKED_LM: return is_roberta(c) ? "lm_head" : "cls";
    case ACCEL_BERT_PRETRAINING:
    case ACCEL_BERT_NEXT_SENTENCE_PREDICTION: return "cls";
    case ACCEL_BERT_QUESTION_ANSWERING: return "qa_outputs";
    default: return "classifier";
    }
}

accel_module *accel_bert_new(const accel_bert_config *cfg, accel_device dev) {
    if (accel_bert_config_check(cfg, "accel_bert_new")) return NULL;
    accel_bert_config *c = accel_malloc(sizeof *c);
    if (!c) return NULL;
    *c = *cfg;
    accel_module *root = accel_module_new(&ROOT_OPS[c->model_type][c->head], c);
    if (!root) {
        accel_free(c);
        return NULL;
    }
    bool mlm = has_mlm(c), rob = is_roberta(c);
    /* the masked LM's decoder: the word embeddings' weight and the head's bias, as transformers ties them */
    const char *dw = rob ? "lm_head.decoder.weight" : "cls.predictions.decoder.weight",
               *db = rob ? "lm_head.decoder.bias" : "cls.predictions.decoder.bias",
               *word = rob ? "roberta.embeddings.word_embeddings.weight" : "bert.embeddings.word_embeddings.weight",
               *bias = rob ? "lm_head.bias" : "cls.predictions.bias";
    bool ok = true; /* the base model and the head in base_index's order */
    for (int i = 0; ok && i < 2; i++)
        ok = i == base_index(c) ? add(root, accel_bert_base_model_prefix(c->model_type), new_model(c, dev)) != NULL
                                : add(root, head_child_name(c), new_head(c, dev)) != NULL;
    if (!ok || (mlm && (accel_module_tie(root, dw, word) || accel_module_tie(root, db, bias)))) {
        accel_module_free(root);
        return NULL;
    }
    return root;
}

/* The model type of m when it is a root, a base model or a layer, else -1:
 * the modules the family row answers for. */
static int family_type(const accel_module *m) {
    int t = type_of(m, -1);
    if (t < 0) t = type_of(m, K_MODEL);
    return t >= 0 ? t : type_of(m, K_LAYER);
}

static const char *layer_class(const accel_module *m) {
    int t = family_type(m);
    return t >= 0 ? OPS[t][K_LAYER].type_name : NULL;
}

/* The root (BertFor<head>) has the config.json. */
static bool config_dtype(const accel_module *m, accel_dtype *dt) {
    if (!is_root(m)) return false;
    *dt = ((const accel_bert_config *)m->impl)->torch_dtype;
    return true;
}

const accel_bert_config *accel_bert_config_of(const accel_module *m) {
    if (is_root(m) || is_model(m)) return m->impl;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert_config_of: not a BertFor<head> or its BertModel (or "
                    "RoBERTa's) built by accel_bert_new (%s)", m ? m->ops->type_name : "NULL");
    return NULL;
}

/* ---- forward */

/* What every block of one forward needs. */
typedef struct fwd {
    const accel_bert_config *c;
    accel_tensor *mask; /* [B, 1, 1, T] f32, 0 or the lowest float; NULL: no padding */
} fwd;

static bool check_ids(const char *fn, const char *arg, accel_tensor *t, const accel_tensor *like) {
    if (!accel_tensor_check(t, fn, arg)) return false;
    char b[64];
    if (t->ndim != 2 || (t->dtype != ACCEL_I64 && t->dtype != ACCEL_I32) ||
        (like && (t->shape[0] != like->shape[0] || t->shape[1] != like->shape[1]))) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: %s must be [B, T] int64/int32%s, got %s %s", fn, arg,
                        like ? " like ids" : "", accel_dtype_name(t->dtype), accel_shape_str(t, b, sizeof b));
        return false;
    }
    return true;
}

/* attention_mask [B, T] of 0/1 -> the additive [B, 1, 1, T] mask of
 * transformers' eager attention (the dtype's lowest value where 0); NULL
 * with no error when every position is a token. */
static accel_status padding_mask(accel_tensor *am, accel_device dev, accel_tensor **out) {
    *out = NULL;
    if (!am) return ACCEL_OK;
    int64_t B = am->shape[0], T = am->shape[1];
    int64_t *v = accel_arena_alloc(accel_step_arena(), (size_t)(B * T) * sizeof *v, 64);
    float *m = accel_arena_alloc(accel_step_arena(), (size_t)(B * T) * sizeof *m, 64);
    if (!v || !m || accel_to_int64s(am, v) != ACCEL_OK) return accel_last_status();
    bool any = false;
    for (int64_t i = 0; i < B * T; i++) {
        if (v[i] != 0 && v[i] != 1)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert: attention_mask[%lld][%lld] is %lld: it must "
                                   "be 1 (token) or 0 (padding)", (long long)(i / T), (long long)(i % T),
                                   (long long)v[i]);
        m[i] = v[i] ? 0.0f : -FLT_MAX;
        any |= !v[i];
    }
    if (!any) return ACCEL_OK;
    accel_tensor *t = accel_from_data(ACCEL_F32, 4, (int64_t[]){B, 1, 1, T}, m);
    *out = t ? accel_to_device(t, dev) : NULL;
    return *out ? ACCEL_OK : accel_last_status();
}

/* RoBERTa's position ids of ids [B, T], on the host (step arena):
 * pad_token_id + the number of tokens up to t that are not pad_token_id, and
 * pad_token_id itself at a pad (whatever attention_mask says: a pad in the
 * middle, left padding); each row's largest must be a row of the position
 * embeddings. */
static const int64_t *roberta_positions(accel_tensor *ids, const accel_bert_config *c, const char *fn) {
    int64_t B = ids->shape[0], T = ids->shape[1], pad = c->pad_token_id;
    int64_t *v = accel_arena_alloc(accel_step_arena(), (size_t)(B * T) * sizeof *v, 64);
    if (!v || accel_to_int64s(ids, v) != ACCEL_OK) return NULL;
    for (int64_t b = 0; b < B; b++) {
        int64_t n = 0, *row = v + b * T;
        for (int64_t t = 0; t < T; t++) row[t] = row[t] == pad ? pad : pad + ++n;
        if (pad + n >= c->max_position_embeddings) {
            accel_set_error(ACCEL_ERR_SHAPE, "%s: row %lld of ids has %lld tokens that are not pad_token_id (%lld): "
                            "its position ids reach %lld, past max_position_embeddings (%lld)", fn, (long long)b,
                            (long long)n, (long long)pad, (long long)(pad + n), (long long)c->max_position_embeddings);
            return NULL;
        }
    }
    return v;
}

/* word + token type + position embeddings, LayerNorm, dropout: [B, T, C].
 * positions: RoBERTa's [B, T] (host), NULL for BERT's 0 .. T - 1. */
static accel_tensor *embeddings_body(accel_module *emb, accel_tensor *ids, accel_tensor *tt,
                                     const int64_t *positions, const accel_bert_config *c) {
    accel_module **p = emb->children;
    const int *at = EMB_AT[is_roberta(c)];
    int64_t B = ids->shape[0], T = ids->shape[1];
    /* the token types (the caller's, wherever they are, or zeros) and the
     * positions go where the word embedding ran (its weight may be
     * offloaded: on meta until its hook brings it in), as the ids did */
    accel_tensor *w = accel_module_call(p[at[EMB_WORD]], ids);
    if (!w) return NULL;
    accel_device dev = w->device;
    if (!tt) {
        tt = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(B, T), dev);
        if (!tt || accel_zero_(tt) != ACCEL_OK) return NULL;
    } else if (!accel_device_eq(tt->device, dev) && !(tt = accel_to_device(tt, dev))) {
        return NULL;
    }
    accel_tensor *pos = accel_to_device(positions ? accel_from_data(ACCEL_I64, 2, (int64_t[]){B, T}, positions)
                                                  : accel_arange(ACCEL_I64, 0, T), dev); /* [B, T] or [T] */
    accel_tensor *h = accel_add(w, accel_module_call(p[at[EMB_TYPE]], tt));
    h = accel_add(h, pos ? accel_module_call(p[at[EMB_POS]], pos) : NULL); /* [B, T, C] + [B, T, C] or [T, C] */
    h = accel_module_call(p[at[EMB_NORM]], h);
    return accel_dropout(h, c->hidden_dropout_prob, emb->training, NULL);
}

/* The embeddings inside their own hooks: a device map keeps BertEmbeddings
 * whole (transformers' _no_split_modules), and then its hook brings its
 * weights in, as one block. */
static accel_tensor *embeddings_forward(accel_module *emb, accel_tensor *ids, accel_tensor *tt,
                                        const int64_t *positions, const accel_bert_config *c) {
    if (accel_module_enter(emb, &ids) != ACCEL_OK) return NULL;
    accel_tensor *h = ids ? embeddings_body(emb, ids, tt, positions, c) : NULL;
    return accel_module_exit(emb, &h) == ACCEL_OK ? h : NULL;
}

/* x [B, T, C] -> [B, H, T, D]. */
static accel_tensor *heads(accel_tensor *x, int64_t H) {
    if (!x) return NULL;
    int64_t shape[4] = {x->shape[0], x->shape[1], H, x->shape[2] / H};
    return accel_transpose(accel_reshape(x, 4, shape), 1, 2);
}

/* BertSelfOutput / BertOutput: LayerNorm(dropout(dense(h)) + residual). */
static accel_tensor *dense_norm_forward(accel_module *m, accel_tensor *h, accel_tensor *residual,
                                        const accel_bert_config *c) {
    accel_tensor *y = accel_dropout(accel_module_call(m->children[OUT_DENSE], h), c->hidden_dropout_prob,
                                    m->training, NULL);
    return accel_module_call(m->children[OUT_NORM], accel_add(y, residual));
}

static accel_tensor *attention_forward(accel_module *attn, accel_tensor *x, const fwd *f) {
    const accel_bert_config *c = f->c;
    accel_module *self = attn->children[ATTN_SELF];
    accel_module **p = self->children;
    int64_t H = c->num_attention_heads, D = c->hidden_size / H;
    accel_tensor *q = heads(accel_module_call(p[SELF_Q], x), H), *k = heads(accel_module_call(p[SELF_K], x), H),
                 *v = heads(accel_module_call(p[SELF_V], x), H);
    if (!q || !k || !v) return NULL;
    /* scores [B, H, T, T]: every query sees every key but the padding (the
     * mask made on the ids' device, moved where a dispatched layer runs);
     * bf16/f16 computed in f32 as torch's SDPA, transformers' default
     * attention for BERT and RoBERTa */
    accel__scores_opts so = {.scale = 1.0 / sqrt((double)D),
                             .drop = self->training ? c->attention_probs_dropout_prob : 0.0, .upcast = true};
    accel_tensor *o = accel__scores_attention(q, k, v, f->mask, &so); /* [B, H, T, D] */
    if (!o) return NULL;
    o = accel_reshape(accel_transpose(o, 1, 2), 3, (int64_t[]){x->shape[0], x->shape[1], c->hidden_size});
    return dense_norm_forward(attn->children[ATTN_OUT], o, x, c);
}

static accel_tensor *layer_body(accel_module *layer, accel_tensor *x, const fwd *f) {
    accel_module **p = layer->children;
    accel_tensor *a = attention_forward(p[LAYER_ATTN], x, f);
    accel_tensor *i = accel_module_call(p[LAYER_INTER]->children[0], a); /* intermediate.dense */
    i = accel_gelu(i, f->c->gelu_tanh);
    return dense_norm_forward(p[LAYER_OUT], i, a, f->c);
}

/* A layer's run for accel__module_run; in the step arena, as the recompute
 * of a checkpointed layer reads it during backward. */
typedef struct layer_run {
    accel_module *layer;
    const fwd *f;
} layer_run;

static accel_tensor *run_layer(void *ctx, accel_tensor *x) {
    const layer_run *r = ctx;
    return layer_body(r->layer, x, r->f);
}

/* A layer inside its hooks (ZeRO-3's gather, a dispatch's weights), under
 * activation checkpointing when it is set. */
static accel_tensor *layer_forward(accel_module *layer, accel_tensor *x, const fwd *f) {
    layer_run *r = accel_arena_alloc(accel_step_arena(), sizeof *r, 8);
    if (!r || accel_module_enter(layer, &x) != ACCEL_OK) return NULL;
    *r = (layer_run){layer, f};
    accel_tensor *y = x ? accel__module_run(layer, run_layer, r, x) : NULL;
    return accel_module_exit(layer, &y) == ACCEL_OK ? y : NULL;
}

/* BertEncoder: the layers inside its hooks (a device map's "bert.encoder"
 * entry moves the embeddings' output to its device; a preload block's
 * brings every layer's offloaded weights in). */
static accel_tensor *encoder_forward(accel_module *encoder, accel_tensor *h, const fwd *f) {
    if (accel_module_enter(encoder, &h) != ACCEL_OK) return NULL;
    accel_module *layers = encoder->children[0];
    for (int i = 0; i < layers->n_children && h; i++) h = layer_forward(layers->children[i], h, f);
    return accel_module_exit(encoder, &h) == ACCEL_OK ? h : NULL;
}

/* BertPooler inside its hooks (a device map may put "bert.pooler" on a
 * device of its own): tanh(dense(first)), first the [CLS] position. */
static accel_tensor *pooler_forward(accel_module *pooler, accel_tensor *first) {
    if (accel_module_enter(pooler, &first) != ACCEL_OK) return NULL;
    accel_tensor *y = first ? accel_tanh(accel_module_call(pooler->children[0], first)) : NULL;
    return accel_module_exit(pooler, &y) == ACCEL_OK ? y : NULL;
}

/* BertModel's _no_split_modules holds its embeddings too (BertEmbeddings,
 * RobertaEmbeddings, XLMRobertaEmbeddings): from_pretrained keeps them on one
 * device. */
static const char *embeddings_class(const accel_module *m) {
    int t = family_type(m);
    return t >= 0 ? OPS[t][K_EMB].type_name : NULL;
}

static bool checkpoint_layers(accel_module *m, bool enable) {
    if (!is_root(m) && !is_model(m)) return false;
    if (is_root(m)) m = m->children[base_index(m->impl)];
    accel_module *layers = m->children[MODEL_ENCODER]->children[0];
    for (int i = 0; i < layers->n_children; i++) layers->children[i]->gradient_checkpointing = enable;
    return true;
}

const accel__family accel__bert_family = {"bert", layer_class, embeddings_class, checkpoint_layers, config_dtype,
                                          NULL};

static accel_module *bert_model_of(accel_module *m, const char *fn) {
    if (is_root(m)) return m->children[base_index(m->impl)];
    if (is_model(m)) return m;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: not a model built by accel_bert_new (%s)", fn,
                    m ? m->ops->type_name : "NULL");
    return NULL;
}

/* BertModel inside its hooks: the hidden states [B, T, C], the pooler's output. */
static accel_tensor *encode(accel_module *model, accel_tensor *ids, accel_tensor *tt, accel_tensor *am,
                            accel_tensor **pooled, const char *fn) {
    const accel_bert_config *c = model->impl;
    if (!check_ids(fn, "ids", ids, NULL) || (tt && !check_ids(fn, "token_type_ids", tt, ids)) ||
        (am && !check_ids(fn, "attention_mask", am, ids)))
        return NULL;
    /* BERT's positions are 0 .. T - 1, RoBERTa's counted from the ids */
    const int64_t *positions = is_roberta(c) ? roberta_positions(ids, c, fn) : NULL;
    if (is_roberta(c) && !positions) return NULL;
    if (!is_roberta(c) && ids->shape[1] > c->max_position_embeddings) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: %lld positions, more than max_position_embeddings (%lld)", fn,
                        (long long)ids->shape[1], (long long)c->max_position_embeddings);
        return NULL;
    }
    accel_module **p = model->children;
    fwd *f = accel_arena_alloc(accel_step_arena(), sizeof *f, 8); /* read by checkpointed layers' recompute */
    if (!f) return NULL;
    *f = (fwd){.c = c};
    if (padding_mask(am, ids->device, &f->mask))
        return NULL;
    accel_tensor *h = ids;
    if (accel_module_enter(model, &h) != ACCEL_OK) return NULL;
    h = h ? embeddings_forward(p[MODEL_EMB], h, tt, positions, c) : NULL;
    h = h ? encoder_forward(p[MODEL_ENCODER], h, f) : NULL;
    if (h && pooled && model->n_children <= MODEL_POOLER) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the model has no pooler (a %s is built without one): pass NULL "
                        "for pooled", fn, accel_bert_class_name(c->model_type, c->head));
        h = NULL;
    } else if (h && pooled) {
        accel_tensor *first = first_token(h, fn);
        *pooled = first ? pooler_forward(p[MODEL_POOLER], first) : NULL;
        if (!*pooled) h = NULL;
    }
    return accel_module_exit(model, &h) == ACCEL_OK ? h : NULL;
}

accel_tensor *accel_bert_encode(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                accel_tensor *attention_mask, accel_tensor **pooled) {
    if (pooled) *pooled = NULL;
    accel_module *model = bert_model_of(m, "accel_bert_encode");
    return model ? encode(model, ids, token_type_ids, attention_mask, pooled, "accel_bert_encode") : NULL;
}

double accel__bert_classifier_p(const accel_bert_config *c) {
    return c->classifier_dropout >= 0 ? c->classifier_dropout : c->hidden_dropout_prob;
}

/* The dropout before the head module, -1 for none: accel__bert_classifier_p for
 * BERT's sequence classifier, the token classifiers and BERT's multiple
 * choice; hidden_dropout_prob for RoBERTa's multiple choice (as
 * transformers'); none for pre-training, next sentence, QA, the masked LM
 * and RoBERTa's sequence classifier (its head drops out itself). */
static double head_dropout(const accel_bert_config *c) {
    switch (c->head) {
    case ACCEL_BERT_TOKEN_CLASSIFICATION: return accel__bert_classifier_p(c);
    case ACCEL_BERT_SEQUENCE_CLASSIFICATION: return is_roberta(c) ? -1 : accel__bert_classifier_p(c);
    case ACCEL_BERT_MULTIPLE_CHOICE: return is_roberta(c) ? c->hidden_dropout_prob : accel__bert_classifier_p(c);
    default: return -1;
    }
}

/* The head on the encoder's outputs h [B, T, C] and pooled [B, C] (the
 * pooled heads'): the classifiers' dropout, then the head module: sequence
 * classification's logits [B, L] (BERT's from the pooler, RoBERTa's
 * classifier takes h), token classification's [B, T, L], question
 * answering's qa_outputs [B, T, 2] (split by the caller), the masked LM's
 * [B, T, V], next sentence's [B, 2], multiple choice's [B N, 1];
 * pre-training: the masked LM's, *second its seq_relationship's [B, 2]. */
static accel_tensor *head_on(accel_module *m, accel_tensor *h, accel_tensor *pooled, accel_tensor **second) {
    const accel_bert_config *c = m->impl;
    accel_module *head = m->children[1 - base_index(c)];
    if (c->head == ACCEL_BERT_PRETRAINING) {
        /* BertPreTrainingHeads takes both outputs, both inside its hooks (a
         * preload block's brings in seq_relationship's weights too); its
         * forward (the masked LM's) checkpointed when set on it, as a
         * module call's is */
        accel_tensor *x = h;
        if (accel_module_enter(head, &x) != ACCEL_OK) return NULL;
        *second = x ? accel_module_call(head->children[1], pooled) : NULL; /* cls.seq_relationship */
        accel_tensor *y = *second ? accel__module_forward(head, x) : NULL;
        return accel_module_exit(head, &y) == ACCEL_OK ? y : NULL;
    }
    accel_tensor *y = has_pooler(c) ? pooled : h;
    double p = head_dropout(c);
    if (p >= 0) y = accel_dropout(y, p, m->training, NULL);
    return accel_module_call(head, y);
}

/* x where the root's hooks left its output y (a dispatch's return to the
 * ids' device, autocast's f32): the root's exit ran once, on y; pre-training's
 * second output follows it. */
static accel_tensor *like_output(accel_tensor *x, const accel_tensor *y) {
    if (x && !accel_device_eq(x->device, y->device)) x = accel_to_device(x, y->device);
    if (x && x->dtype != y->dtype) x = accel_to_dtype(x, y->dtype);
    return x;
}

/* The head of one of the public functions (fn) run on m's encoder, inside
 * the root's hooks (the Accelerator's autocast, a dispatch's return to the
 * ids' device): head_on's output (pre-training's seq_relationship logits in
 * *second). A model of another head is refused naming both. */
static accel_tensor *head_forward(accel_module *m, accel_bert_head want, accel_tensor *ids, accel_tensor *tt,
                                  accel_tensor *am, accel_tensor **second, const char *fn) {
    int t = type_of(m, -1);
    if (!m) { /* a failed from_pretrained's NULL: its error is the cause (docs/contract.md's chain rule) */
        accel_propagate_error(ACCEL_ERR_INVALID_ARG, "%s: the model is NULL", fn);
        return NULL;
    }
    if (t < 0 || m->ops != &ROOT_OPS[t][want]) {
        const char *wanted = ROOT_OPS[t >= 0 ? t : 0][want].type_name;
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the model is %s%s, not a %s built by accel_bert_new", fn,
                        t >= 0 ? "a " : "", m->ops->type_name, wanted ? wanted : accel_bert_head_name(want));
        return NULL;
    }
    const accel_bert_config *c = m->impl;
    accel_tensor *x = ids;
    if (accel_module_enter(m, &x) != ACCEL_OK) return NULL;
    accel_tensor *pooled = NULL;
    accel_tensor *h = x ? encode(m->children[base_index(c)], x, tt, am, has_pooler(c) ? &pooled : NULL, fn) : NULL;
    accel_tensor *y = h ? head_on(m, h, pooled, second) : NULL;
    if (accel_module_exit(m, &y) != ACCEL_OK) return NULL;
    if (y && second) *second = like_output(*second, y);
    return y && (!second || *second) ? y : NULL;
}

accel_tensor *accel_bert_classify(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                  accel_tensor *attention_mask) {
    return head_forward(m, ACCEL_BERT_SEQUENCE_CLASSIFICATION, ids, token_type_ids, attention_mask, NULL,
                        "accel_bert_classify");
}

/* labels: int64/int32 of ids' batch ([B]; multiple choice's ids [B, N, T]) or ids' shape ([B, T]). */
static bool check_labels(const char *fn, const char *arg, accel_tensor *t, accel_tensor *ids, bool per_token) {
    if (!accel_tensor_check(t, fn, arg)) return false;
    bool ok = t->ndim == (per_token ? 2 : 1) && (t->dtype == ACCEL_I64 || t->dtype == ACCEL_I32) &&
              (!ids || ids->ndim < 2 || (t->shape[0] == ids->shape[0] && (!per_token || t->shape[1] == ids->shape[1])));
    if (!ok) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: %s must be %s int64/int32 (of ids' %s), got %s %s", fn, arg,
                        per_token ? "[B, T]" : "[B]", ids && ids->ndim == 3 ? "[B, N, T]" : "[B, T]",
                        accel_dtype_name(t->dtype), accel_shape_str(t, b, sizeof b));
    }
    return ok;
}

/* transformers' CrossEntropyLoss (mean; -100 ignored) of logits y against
 * labels, which go to y's device first, as its heads move them
 * (labels.to(logits.device)): the caller's, wherever they are. */
static accel_tensor *cross_entropy(accel_tensor *y, accel_tensor *labels) {
    if (y && !accel_device_eq(labels->device, y->device)) labels = accel_to_device(labels, y->device);
    return y && labels ? accel_cross_entropy(y, labels, -100) : NULL;
}

/* A head's logits and their loss against labels: cross_entropy. A pooled head (sequence
 * classification, next sentence: per_position false) has logits [B, L]
 * and labels [B]; the token classifier and the masked LM (per_position)
 * [B T, L] against labels [B T]. fn names the caller. */
static accel_tensor *head_loss(accel_module *m, accel_bert_head head, bool per_position, accel_tensor *ids,
                               accel_tensor *token_type_ids, accel_tensor *attention_mask, accel_tensor *labels,
                               accel_tensor **logits, const char *fn) {
    if (logits) *logits = NULL;
    if (!check_labels(fn, "labels", labels, ids, per_position)) return NULL;
    accel_tensor *y = head_forward(m, head, ids, token_type_ids, attention_mask, NULL, fn);
    if (logits) *logits = y;
    return cross_entropy(y, labels);
}

accel_tensor *accel_bert_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                              accel_tensor *attention_mask, accel_tensor *labels, accel_tensor **logits) {
    /* transformers' single_label_classification */
    return head_loss(m, ACCEL_BERT_SEQUENCE_CLASSIFICATION, false, ids, token_type_ids, attention_mask, labels,
                     logits, "accel_bert_loss");
}

accel_tensor *accel_bert_token_classify(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                        accel_tensor *attention_mask) {
    return head_forward(m, ACCEL_BERT_TOKEN_CLASSIFICATION, ids, token_type_ids, attention_mask, NULL,
                        "accel_bert_token_classify");
}

accel_tensor *accel_bert_token_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                    accel_tensor *attention_mask, accel_tensor *labels, accel_tensor **logits) {
    return head_loss(m, ACCEL_BERT_TOKEN_CLASSIFICATION, true, ids, token_type_ids, attention_mask, labels, logits,
                     "accel_bert_token_loss");
}

accel_tensor *accel_bert_mlm_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                    accel_tensor *attention_mask) {
    return head_forward(m, ACCEL_BERT_MASKED_LM, ids, token_type_ids, attention_mask, NULL, "accel_bert_mlm_logits");
}

accel_tensor *accel_bert_mlm_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                  accel_tensor *attention_mask, accel_tensor *labels, accel_tensor **logits) {
    return head_loss(m, ACCEL_BERT_MASKED_LM, true, ids, token_type_ids, attention_mask, labels, logits,
                     "accel_bert_mlm_loss");
}

/* qa_outputs' [B, T, 2] split into the start and end logits [B, T], each
 * made contiguous (transformers' .contiguous()). */
static accel_tensor *qa_split(accel_module *m, accel_tensor *ids, accel_tensor *tt, accel_tensor *am,
                              accel_tensor **end, const char *fn) {
    accel_tensor *y = head_forward(m, ACCEL_BERT_QUESTION_ANSWERING, ids, tt, am, NULL, fn);
    accel_tensor *start = y ? accel_contiguous(accel_squeeze(accel_slice(y, 2, 0, 1, 1), 2)) : NULL;
    *end = start ? accel_contiguous(accel_squeeze(accel_slice(y, 2, 1, 2, 1), 2)) : NULL;
    return *end ? start : NULL;
}

accel_tensor *accel_bert_qa_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                   accel_tensor *attention_mask, accel_tensor **end_logits) {
    if (!end_logits) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert_qa_logits: end_logits is NULL");
        return NULL;
    }
    return qa_split(m, ids, token_type_ids, attention_mask, end_logits, "accel_bert_qa_logits");
}

/* positions [B] or [B, 1] clamped to [0, T] (T: ignored) as an int64 [B] on dev. */
static accel_tensor *clamped_positions(accel_tensor *pos, int64_t T, accel_device dev) {
    int64_t B = pos->shape[0];
    int64_t *v = accel_arena_alloc(accel_step_arena(), (size_t)B * sizeof *v, 64);
    if (!v || accel_to_int64s(pos, v) != ACCEL_OK) return NULL;
    for (int64_t i = 0; i < B; i++) v[i] = v[i] < 0 ? 0 : v[i] > T ? T : v[i];
    accel_tensor *t = accel_from_data(ACCEL_I64, 1, &B, v);
    return t ? accel_to_device(t, dev) : NULL;
}

accel_tensor *accel_bert_qa_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                 accel_tensor *attention_mask, accel_tensor *start_positions,
                                 accel_tensor *end_positions, accel_tensor **start_logits, accel_tensor **end_logits) {
    static const char *FN = "accel_bert_qa_loss";
    if (start_logits) *start_logits = NULL;
    if (end_logits) *end_logits = NULL;
    accel_tensor *pos[2] = {start_positions, end_positions};
    static const char *const ARG[2] = {"start_positions", "end_positions"};
    for (int i = 0; i < 2; i++) {
        /* [B, 1] (transformers squeezes the last dim) or [B] */
        bool col = pos[i] && pos[i]->ndim == 2 && pos[i]->shape[1] == 1;
        accel_tensor *p = col ? accel_squeeze(pos[i], 1) : pos[i];
        if (col && !p) return NULL;
        if (!check_labels(FN, ARG[i], p, ids, false)) return NULL;
        pos[i] = p;
    }
    accel_tensor *end = NULL, *start = qa_split(m, ids, token_type_ids, attention_mask, &end, FN);
    if (!start) return NULL;
    if (start_logits) *start_logits = start;
    if (end_logits) *end_logits = end;
    /* a position past the input (its answer truncated away) is clamped to T, the ignored index */
    int64_t T = start->shape[1];
    accel_tensor *ps = clamped_positions(pos[0], T, start->device), *pe = clamped_positions(pos[1], T, end->device);
    if (!ps || !pe) return NULL;
    return accel_mul_scalar(accel_add(accel_cross_entropy(start, ps, T), accel_cross_entropy(end, pe, T)), 0.5);
}

accel_tensor *accel_bert_pretraining_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                            accel_tensor *attention_mask, accel_tensor **seq_relationship_logits) {
    if (!seq_relationship_logits) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_bert_pretraining_logits: seq_relationship_logits is NULL");
        return NULL;
    }
    *seq_relationship_logits = NULL;
    accel_tensor *y = head_forward(m, ACCEL_BERT_PRETRAINING, ids, token_type_ids, attention_mask,
                                   seq_relationship_logits, "accel_bert_pretraining_logits");
    if (!y) *seq_relationship_logits = NULL;
    return y;
}

accel_tensor *accel_bert_pretraining_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                          accel_tensor *attention_mask, accel_tensor *labels,
                                          accel_tensor *next_sentence_label, accel_tensor **prediction_logits,
                                          accel_tensor **seq_relationship_logits) {
    static const char *FN = "accel_bert_pretraining_loss";
    if (prediction_logits) *prediction_logits = NULL;
    if (seq_relationship_logits) *seq_relationship_logits = NULL;
    if (!check_labels(FN, "labels", labels, ids, true) ||
        !check_labels(FN, "next_sentence_label", next_sentence_label, ids, false))
        return NULL;
    accel_tensor *nsp = NULL;
    accel_tensor *y = head_forward(m, ACCEL_BERT_PRETRAINING, ids, token_type_ids, attention_mask, &nsp, FN);
    if (!y) return NULL;
    if (prediction_logits) *prediction_logits = y;
    if (seq_relationship_logits) *seq_relationship_logits = nsp;
    /* transformers' total_loss: masked_lm_loss + next_sentence_loss, each a mean CrossEntropyLoss */
    return accel_add(cross_entropy(y, labels), cross_entropy(nsp, next_sentence_label));
}

accel_tensor *accel_bert_nsp_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                    accel_tensor *attention_mask) {
    return head_forward(m, ACCEL_BERT_NEXT_SENTENCE_PREDICTION, ids, token_type_ids, attention_mask, NULL,
                        "accel_bert_nsp_logits");
}

accel_tensor *accel_bert_nsp_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                  accel_tensor *attention_mask, accel_tensor *labels, accel_tensor **logits) {
    return head_loss(m, ACCEL_BERT_NEXT_SENTENCE_PREDICTION, false, ids, token_type_ids, attention_mask, labels,
                     logits, "accel_bert_nsp_loss");
}

/* t [B, N, T] (int64/int32; like ids when like is given) -> [B N, T]; NULL
 * t stays NULL (*ok true). */
static accel_tensor *flat_choices(const char *fn, const char *arg, accel_tensor *t, const accel_tensor *like,
                                  bool *ok) {
    *ok = true;
    if (!t && like) return NULL;
    *ok = accel_tensor_check(t, fn, arg);
    if (!*ok) return NULL;
    char b[64];
    *ok = t->ndim == 3 && (t->dtype == ACCEL_I64 || t->dtype == ACCEL_I32) &&
          (!like || (t->shape[0] == like->shape[0] && t->shape[1] == like->shape[1] && t->shape[2] == like->shape[2]));
    if (!*ok) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: %s must be [B, num_choices, T] int64/int32%s, got %s %s", fn, arg,
                        like ? " like ids" : "", accel_dtype_name(t->dtype), accel_shape_str(t, b, sizeof b));
        return NULL;
    }
    accel_tensor *flat = accel_reshape(t, 2, (int64_t[]){t->shape[0] * t->shape[1], t->shape[2]});
    *ok = flat != NULL;
    return flat;
}

/* Multiple choice: ids, token types, mask [B, N, T] flattened to [B N, T],
 * the encoder's pooled rows scored (head_forward: [B N, 1]), the scores
 * [B, N]. */
static accel_tensor *choice_logits(accel_module *m, accel_tensor *ids, accel_tensor *tt, accel_tensor *am,
                                   const char *fn) {
    bool ok_ids, ok_tt, ok_am;
    accel_tensor *fids = flat_choices(fn, "ids", ids, NULL, &ok_ids);
    accel_tensor *ftt = ok_ids ? flat_choices(fn, "token_type_ids", tt, ids, &ok_tt) : NULL;
    accel_tensor *fam = ok_ids && ok_tt ? flat_choices(fn, "attention_mask", am, ids, &ok_am) : NULL;
    if (!ok_ids || !ok_tt || !ok_am) return NULL;
    accel_tensor *y = head_forward(m, ACCEL_BERT_MULTIPLE_CHOICE, fids, ftt, fam, NULL, fn);
    return y ? accel_reshape(y, 2, (int64_t[]){ids->shape[0], ids->shape[1]}) : NULL;
}

accel_tensor *accel_bert_multiple_choice_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                                accel_tensor *attention_mask) {
    return choice_logits(m, ids, token_type_ids, attention_mask, "accel_bert_multiple_choice_logits");
}

accel_tensor *accel_bert_multiple_choice_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                              accel_tensor *attention_mask, accel_tensor *labels,
                                              accel_tensor **logits) {
    static const char *FN = "accel_bert_multiple_choice_loss";
    if (logits) *logits = NULL;
    if (!check_labels(FN, "labels", labels, ids, false)) return NULL;
    accel_tensor *y = choice_logits(m, ids, token_type_ids, attention_mask, FN);
    if (logits) *logits = y;
    return cross_entropy(y, labels); /* over the choices */
}

/* The module's forward (accel_module_call): the head's output, qa_outputs'
 * [B, T, 2] for question answering. */
static accel_tensor *root_forward(accel_module *m, accel_tensor *ids) {
    const accel_bert_config *c = m->impl;
    accel_tensor *second = NULL; /* pre-training's seq_relationship logits: the module call returns the MLM's */
    if (c->head == ACCEL_BERT_MULTIPLE_CHOICE) return choice_logits(m, ids, NULL, NULL, m->ops->type_name);
    return head_forward(m, c->head, ids, NULL, NULL, c->head == ACCEL_BERT_PRETRAINING ? &second : NULL,
                        m->ops->type_name);
}

/* BertOnlyNSPHead: pooled [B, C] -> seq_relationship's logits [B, 2]. */
static accel_tensor *nsp_forward(accel_module *head, accel_tensor *pooled) {
    return accel_module_call(head->children[0], pooled);
}

static accel_tensor *model_forward(accel_module *m, accel_tensor *ids) {
    return encode(m, ids, NULL, NULL, NULL, m->ops->type_name); /* "BertModel", "RobertaModel", ... */
}

/* BertPredictionHeadTransform inside its hooks (a map may give it a device
 * of its own): LayerNorm(act(dense(h))). */
static accel_tensor *transform_forward(accel_module *t, accel_tensor *h, const accel_bert_config *c) {
    if (accel_module_enter(t, &h) != ACCEL_OK) return NULL;
    accel_tensor *x = h ? accel_module_call(t->children[OUT_NORM],
                                            accel_gelu(accel_module_call(t->children[OUT_DENSE], h), c->gelu_tanh))
                        : NULL;
    return accel_module_exit(t, &x) == ACCEL_OK ? x : NULL;
}

/* BertOnlyMLMHead: h [B, T, C] -> logits [B, T, V] (the decoder: the word
 * embeddings' rows plus predictions.bias), predictions inside its hooks (it
 * holds the bias: a ZeRO-3 unit of its own, say). RobertaLMHead (its hooks
 * ran: the root's module call): dense, GELU (erf, whatever hidden_act
 * says), layer_norm, decoder (word embeddings' rows plus lm_head.bias). */
static accel_tensor *mlm_forward(accel_module *cls, accel_tensor *h) {
    const accel_bert_config *c = cls->impl;
    accel_module **lm = cls->children;
    if (is_roberta(c))
        return accel_module_call(lm[LM_DECODER],
                                 accel_module_call(lm[LM_NORM], accel_gelu(accel_module_call(lm[LM_DENSE], h), false)));
    accel_module *pred = cls->children[0], *t = pred->children[PRED_TRANSFORM];
    if (accel_module_enter(pred, &h) != ACCEL_OK) return NULL;
    accel_tensor *x = h ? transform_forward(t, h, c) : NULL;
    accel_tensor *y = x ? accel_module_call(pred->children[PRED_DECODER], x) : NULL;
    return accel_module_exit(pred, &y) == ACCEL_OK ? y : NULL;
}

/* RobertaClassificationHead: h [B, T, C] -> logits [B, L]: the <s>
 * position, dropout, dense, tanh, dropout, out_proj (the classifier
 * dropout both times). */
static accel_tensor *cls_head_forward(accel_module *head, accel_tensor *h) {
    const accel_bert_config *c = head->impl;
    double p = accel__bert_classifier_p(c);
    accel_tensor *x = first_token(h, head->ops->type_name);
    x = x ? accel_dropout(x, p, head->training, NULL) : NULL;
    x = accel_dropout(accel_tanh(accel_module_call(head->children[CLS_DENSE], x)), p, head->training, NULL);
    return accel_module_call(head->children[CLS_OUT_PROJ], x);
}
