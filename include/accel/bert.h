/*
 * accel/bert.h — BERT (config.json model_type "bert"): transformers' BertModel,
 * a bidirectional encoder, and a task head on top of it (accel_bert_head):
 * BertForSequenceClassification, BertForTokenClassification (NER),
 * BertForQuestionAnswering (extractive QA, SQuAD), BertForMaskedLM,
 * BertForPreTraining (masked LM + next sentence), BertForNextSentencePrediction
 * or BertForMultipleChoice.
 * RoBERTa and XLM-RoBERTa (model_type "roberta", "xlm-roberta") are the same
 * encoder with the same functions: the config's model_type
 * (accel_bert_model_type) says which, and from_pretrained reads it.
 *
 *     BertFor<Head>
 *       bert (BertModel)
 *         embeddings: word_embeddings, position_embeddings, token_type_embeddings, LayerNorm
 *         encoder.layer.N (BertLayer): attention.self.{query,key,value},
 *             attention.output.{dense,LayerNorm}, intermediate.dense, output.{dense,LayerNorm}
 *         pooler.dense              (sequence classification, pre-training, next sentence, multiple choice)
 *       classifier                  (sequence and token classification: Linear(C -> num_labels);
 *                                    multiple choice: Linear(C -> 1))
 *       qa_outputs                  (question answering: Linear(C -> 2))
 *       cls.predictions             (masked LM, pre-training: bias [V], transform.{dense,LayerNorm}, decoder:
 *                                    Linear(C -> V) whose weight is the word embeddings' and bias is
 *                                    predictions.bias)
 *       cls.seq_relationship        (pre-training, next sentence prediction: Linear(C -> 2) on the pooler)
 *
 *     RobertaFor<Head> (XLMRobertaFor<Head>: the same names, the head first)
 *       roberta (RobertaModel; a pooler for multiple choice only)
 *         embeddings: word_embeddings, token_type_embeddings, LayerNorm, position_embeddings
 *         encoder.layer.N (RobertaLayer): as BertLayer
 *       classifier                  (sequence classification: RobertaClassificationHead, dense (C -> C) and
 *                                    out_proj (C -> num_labels) on the <s> token; token classification: Linear;
 *                                    multiple choice: Linear(C -> 1) on the pooler)
 *       qa_outputs                  (question answering: Linear(C -> 2))
 *       lm_head                     (masked LM: bias [V], dense, layer_norm, decoder: Linear(C -> V) whose
 *                                    weight is the word embeddings' and bias is lm_head.bias)
 *
 * Names, state_dict order, init and numerics are transformers' (XLM-RoBERTa
 * registers its head before "roberta", and so does accel): absolute
 * positions, LayerNorm with bias after each residual (post-LN), GELU, padding
 * masked by attention_mask, pooler = tanh(dense(h[:, 0])), dropout (hidden,
 * attention probabilities, the classifiers'; QA has none) while the module
 * is training; the word embeddings' row pad_token_id gets no gradient (padding_idx).
 * RoBERTa's differences: position ids counted from the ids, pad_token_id + 1
 * onwards over the tokens that are not pad_token_id, pad_token_id at a pad
 * (whatever attention_mask says), and its position embeddings' row
 * pad_token_id gets no gradient; the sequence classifier is
 * out_proj(dropout(tanh(dense(dropout(h[:, 0]))))); the masked LM's
 * activation is GELU (erf) whatever hidden_act says.
 * accel_module_set_gradient_checkpointing on the root (or its "bert")
 * checkpoints every BertLayer (the recompute draws the same dropout masks);
 * BertLayer is the model's accel_module_decoder_layer_class (FSDP, ZeRO-3).
 * A config field that changes the model and accel does not implement is
 * refused naming it (position_embedding_type other than "absolute",
 * is_decoder, add_cross_attention, a sequence classifier's problem_type
 * other than single_label_classification, ...). The pre-training and next
 * sentence heads are BERT's only (transformers has no RoBERTa class of
 * them): a RoBERTa config with one is refused.
 * Multiple choice takes ids [B, num_choices, T] (token types and mask alike),
 * runs the encoder on the [B num_choices, T] rows, and scores each row's
 * pooled output with classifier (after the classifier dropout; RoBERTa's:
 * hidden_dropout_prob, as transformers').
 *
 * Ownership: accel_bert_new returns a module freed by accel_module_free.
 */
#ifndef ACCEL_BERT_H
#define ACCEL_BERT_H

#include "core.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The task head (transformers' class). Zero is sequence classification, so
 * that a config written field by field keeps the head it always had. */
typedef enum accel_bert_head {
    ACCEL_BERT_SEQUENCE_CLASSIFICATION = 0, /* BertForSequenceClassification: logits [B, num_labels] */
    ACCEL_BERT_TOKEN_CLASSIFICATION,        /* BertForTokenClassification: logits [B, T, num_labels] */
    ACCEL_BERT_QUESTION_ANSWERING,          /* BertForQuestionAnswering: start/end logits [B, T] each */
    ACCEL_BERT_MASKED_LM,                   /* BertForMaskedLM: logits [B, T, vocab_size] */
    ACCEL_BERT_PRETRAINING,                 /* BertForPreTraining: prediction logits [B, T, vocab_size] and
                                             * seq_relationship logits [B, 2] (BERT only) */
    ACCEL_BERT_NEXT_SENTENCE_PREDICTION,    /* BertForNextSentencePrediction: logits [B, 2] (BERT only) */
    ACCEL_BERT_MULTIPLE_CHOICE,             /* BertForMultipleChoice: logits [B, num_choices] */
    ACCEL_BERT_HEADS
} accel_bert_head;

/* Which encoder (config.json's model_type). Zero is BERT, so that a config
 * written field by field keeps the model it always had. */
typedef enum accel_bert_model_type {
    ACCEL_BERT_MODEL_BERT = 0,    /* "bert": BertFor<head> */
    ACCEL_BERT_MODEL_ROBERTA,     /* "roberta": RobertaFor<head> */
    ACCEL_BERT_MODEL_XLM_ROBERTA, /* "xlm-roberta": XLMRobertaFor<head> */
    ACCEL_BERT_MODEL_TYPES
} accel_bert_model_type;

/* transformers' BERT class name of head ("BertForTokenClassification"), or NULL. */
const char *accel_bert_head_name(accel_bert_head head);
/* The class name of head in model type t ("RobertaForMaskedLM"), or NULL
 * (RoBERTa's pre-training and next sentence heads: transformers has none). */
const char *accel_bert_class_name(accel_bert_model_type t, accel_bert_head head);
/* config.json's model_type of t ("bert", "roberta", "xlm-roberta"), or NULL. */
const char *accel_bert_model_type_name(accel_bert_model_type t);
/* The base model's name in t's tree, transformers' base_model_prefix
 * ("bert"; "roberta" for both RoBERTa families), or NULL. */
const char *accel_bert_base_model_prefix(accel_bert_model_type t);

typedef struct accel_bert_config {
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;      /* head_dim = hidden_size / heads */
    int64_t intermediate_size;
    int64_t max_position_embeddings;
    int64_t type_vocab_size;
    int64_t num_labels;               /* head outputs: >= 2 for sequence classification (single-label),
                                       * >= 1 for token classification, 2 for question answering */
    int64_t pad_token_id;             /* its word embedding row starts at zero; -1: none (BERT only: RoBERTa
                                       * counts positions from it, 0 <= pad_token_id < max_position_embeddings - 1) */
    double layer_norm_eps;
    double initializer_range;
    double hidden_dropout_prob;
    double attention_probs_dropout_prob;
    double classifier_dropout;        /* < 0: hidden_dropout_prob (config null) */
    bool gelu_tanh;                   /* hidden_act "gelu_new"/"gelu_pytorch_tanh"; else "gelu" (erf) */
    bool untied_word_embeddings;      /* tie_word_embeddings false: refused for the masked LM (its decoder
                                       * is the word embeddings; an untied one is not implemented) */
    accel_dtype torch_dtype;
    accel_bert_head head;             /* config.json's "architectures" (accel_bert_config_load) */
    accel_bert_model_type model_type; /* config.json's model_type */
} accel_bert_config;

/* transformers' BertConfig defaults (bert-base: vocab 30522, hidden 768, 12
 * layers, 12 heads), num_labels 2, sequence classification. */
accel_bert_config accel_bert_config_default(void);
/* The defaults of t's config class, what a key config.json lacks gets:
 * BertConfig's above; RobertaConfig's are BertConfig's with vocab_size 50265
 * and pad_token_id 1, XLMRobertaConfig's BertConfig's with pad_token_id 1
 * (max_position_embeddings 512 and type_vocab_size 2 in both: the released
 * checkpoints' config.json say 514 and 1, layer_norm_eps 1e-5). */
accel_bert_config accel_bert_config_default_for(accel_bert_model_type t);
/* ACCEL_OK when accel_bert_new can build cfg (sizes positive, hidden a
 * multiple of heads, dropouts in [0, 1), weights' bytes within int64), else
 * ACCEL_ERR_INVALID_ARG with a message starting with who. */
accel_status accel_bert_config_check(const accel_bert_config *cfg, const char *who);
/* config.json (a file or a directory holding one) of model_type "bert",
 * "roberta" or "xlm-roberta" (out->model_type; absent keys get that class's
 * defaults, accel_bert_config_default_for). The
 * head: the first of "architectures" that names one of the task heads
 * (sequence, token, QA, next sentence, multiple choice), else sequence
 * classification (bert-base-uncased's config says BertForMaskedLM, others'
 * BertForPreTraining, and users load them into any head: the masked LM and
 * pre-training heads are built only when asked for,
 * accel_bert_from_pretrained_head). problem_type is read
 * for sequence classification only (the other heads' losses ignore it, as
 * transformers' do). */
accel_status accel_bert_config_load(const char *path_or_dir, accel_bert_config *out);
/* Writes config.json (into a directory, created, or to a *.json path) as
 * transformers writes the head's class's ("architectures"). */
accel_status accel_bert_config_save(const char *dir_or_path, const accel_bert_config *cfg);

/* BertFor<cfg->head>, weights initialised as transformers does
 * (normal(0, initializer_range), biases 0, LayerNorm 1/0, the pad row 0) from
 * the default generator; inside init_empty_weights on meta. */
accel_module *accel_bert_new(const accel_bert_config *cfg, accel_device dev);
/* The config of a model built by accel_bert_new (the root or its "bert");
 * its head says which head's functions take the model. */
const accel_bert_config *accel_bert_config_of(const accel_module *m);

/* BertModel: ids [B, T] (i64/i32, T <= max_position_embeddings; RoBERTa:
 * its largest position id, pad_token_id + the tokens of a row, below it);
 * token_type_ids [B, T] or NULL (all 0); attention_mask [B, T] (1 = token,
 * 0 = padding) or NULL (all 1); those two on any device (moved where they
 * are used; the losses' labels too, to the logits' device). m: the root or
 * its "bert" ("roberta") child. Returns the last hidden state [B, T, C]; *pooled (when not NULL) gets the pooler's
 * output [B, C] (the token, QA and masked-LM heads, and every RoBERTa head but multiple choice, have no
 * pooler: pooled must be
 * NULL there, else an error says so). */
accel_tensor *accel_bert_encode(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                accel_tensor *attention_mask, accel_tensor **pooled);
/* BertForSequenceClassification: logits [B, num_labels] (f32 unless autocast).
 * A model of another head is refused naming its class (so is every head's
 * function given a model of another head). */
accel_tensor *accel_bert_classify(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                  accel_tensor *attention_mask);
/* Mean cross-entropy of the logits against labels [B] (i64/i32), as
 * transformers' single_label_classification; *logits (when not NULL) gets
 * the logits. */
accel_tensor *accel_bert_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                              accel_tensor *attention_mask, accel_tensor *labels, accel_tensor **logits);

/* BertForTokenClassification: logits [B, T, num_labels] of every position
 * (classifier dropout, then the classifier, on the last hidden state). */
accel_tensor *accel_bert_token_classify(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                        accel_tensor *attention_mask);
/* Mean cross-entropy of every position's logits against labels [B, T]
 * (i64/i32), a label of -100 ignored (padding, a word's later sub-tokens);
 * every label -100: NaN, as transformers. *logits (when not NULL) gets the
 * logits. */
accel_tensor *accel_bert_token_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                    accel_tensor *attention_mask, accel_tensor *labels, accel_tensor **logits);
/* BertForQuestionAnswering: the answer span's start logits [B, T]
 * (returned) and end logits [B, T] (*end_logits, required): qa_outputs on
 * the last hidden state, its two outputs split. */
accel_tensor *accel_bert_qa_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                   accel_tensor *attention_mask, accel_tensor **end_logits);
/* (CE(start logits, start_positions) + CE(end logits, end_positions)) / 2,
 * positions [B] or [B, 1] (i64/i32) clamped to [0, T] and T ignored: a
 * position past the input (the answer cut off) adds nothing, a negative one
 * counts as position 0, as transformers. *start_logits / *end_logits (when
 * not NULL) get the logits. */
accel_tensor *accel_bert_qa_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                 accel_tensor *attention_mask, accel_tensor *start_positions,
                                 accel_tensor *end_positions, accel_tensor **start_logits, accel_tensor **end_logits);

/* BertForMaskedLM: the vocabulary's logits [B, T, vocab_size] of every
 * position: cls.predictions (dense, the activation, LayerNorm, then the
 * decoder, whose weight is the word embeddings' and bias predictions.bias:
 * tied, as transformers) on the last hidden state. No pooler, no dropout in
 * the head. */
accel_tensor *accel_bert_mlm_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                    accel_tensor *attention_mask);
/* Mean cross-entropy of every position's logits against labels [B, T]
 * (i64/i32; -100 ignored: the positions not masked out for prediction);
 * every label -100: NaN, as transformers. *logits (when not NULL) gets the
 * logits. */
accel_tensor *accel_bert_mlm_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                  accel_tensor *attention_mask, accel_tensor *labels, accel_tensor **logits);

/* BertForPreTraining: the masked LM's logits [B, T, vocab_size] (returned,
 * as accel_bert_mlm_logits's) and the next sentence's [B, 2]
 * (*seq_relationship_logits, required): cls.seq_relationship on the pooler's
 * output (no dropout). */
accel_tensor *accel_bert_pretraining_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                            accel_tensor *attention_mask, accel_tensor **seq_relationship_logits);
/* The masked LM's mean cross-entropy against labels [B, T] (-100 ignored)
 * plus the next sentence's against next_sentence_label [B] (0: B follows A,
 * 1: random; -100 ignored), both required, as transformers computes the loss
 * only when both are given. *prediction_logits / *seq_relationship_logits
 * (when not NULL) get the logits. */
accel_tensor *accel_bert_pretraining_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                          accel_tensor *attention_mask, accel_tensor *labels,
                                          accel_tensor *next_sentence_label, accel_tensor **prediction_logits,
                                          accel_tensor **seq_relationship_logits);

/* BertForNextSentencePrediction: logits [B, 2] (cls.seq_relationship on the
 * pooler's output, no dropout). */
accel_tensor *accel_bert_nsp_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                    accel_tensor *attention_mask);
/* Mean cross-entropy of the logits against labels [B] (0: B follows A, 1:
 * random; -100 ignored). *logits (when not NULL) gets the logits. */
accel_tensor *accel_bert_nsp_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                  accel_tensor *attention_mask, accel_tensor *labels, accel_tensor **logits);

/* BertForMultipleChoice (RobertaForMultipleChoice, XLMRobertaForMultipleChoice):
 * ids [B, N, T] (i64/i32: N choices of T tokens each), token_type_ids and
 * attention_mask [B, N, T] or NULL; logits [B, N]: the classifier's score
 * of each choice's pooled output. */
accel_tensor *accel_bert_multiple_choice_logits(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                                accel_tensor *attention_mask);
/* Mean cross-entropy over the choices against labels [B] (the right
 * choice's index; -100 ignored). *logits (when not NULL) gets the logits. */
accel_tensor *accel_bert_multiple_choice_loss(accel_module *m, accel_tensor *ids, accel_tensor *token_type_ids,
                                              accel_tensor *attention_mask, accel_tensor *labels,
                                              accel_tensor **logits);

/* save_pretrained: config.json + model.safetensors (sharded with an index
 * past max_shard_bytes; <= 0: 5 GB), loadable by transformers'
 * BertFor<head>.from_pretrained (and its AutoModelFor<task>). Refused,
 * as accel_save_pretrained, while the parameters are sharded across
 * processes (ACCEL_ERR_STATE). Crash-safe as accel_save_pretrained. */
accel_status accel_bert_save_pretrained(accel_module *m, const char *dir, int64_t max_shard_bytes);
/* from_pretrained: dir's config.json, then the weights of its safetensors
 * (model.safetensors or the shards of model.safetensors.index.json) when it
 * has them, by name (a bare BertModel's names, without "bert.", too;
 * RoBERTa's without "roberta."). The
 * head is the config's (accel_bert_config_load). A weight of the model the
 * checkpoint lacks keeps its initialisation only when it is the head's (the
 * pooler, classifier, qa_outputs, cls or lm_head: a pre-trained encoder gets a new head,
 * as transformers does, and says so on stderr); any other missing weight is
 * an error naming it. Checkpoint weights the model has no place for (another
 * head's: a sequence classifier's pooler loaded into a token classifier) are
 * not used, with a note on stderr. dir without weights: a randomly
 * initialised model of its config. The model is in eval mode, as
 * transformers returns it (dropout off: accel_module_train(m, true) before
 * training). With a device map, cpu or disk offload:
 * accel_bert_from_pretrained_dispatched (accel/bigmodel.h). */
accel_module *accel_bert_from_pretrained(const char *dir, accel_device dev);
/* The same with the head chosen by the caller whatever the config says,
 * and num_labels when > 0 (else the config's): transformers'
 * BertFor<head>.from_pretrained(dir, num_labels=...), a pre-trained
 * encoder's checkpoint fine-tuned for NER (its tag set) or QA. */
accel_module *accel_bert_from_pretrained_head(const char *dir, accel_bert_head head, int64_t num_labels,
                                              accel_device dev);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_BERT_H */
