/* Internals shared by the files of src/nn (not public API). */
#ifndef ACCEL_NN_INTERNAL_H
#define ACCEL_NN_INTERNAL_H

#include "accel/autograd.h"
#include "accel/dist.h"
#include "accel/nn.h"

/* Unique tensors of the tree in state_dict order (tied aliases once);
 * params_only keeps parameters that require grad. Returns the count, or -1
 * with an error; *out is freed by the caller with accel_free. */
int accel__module_unique_tensors(accel_module *root, bool params_only, accel_tensor ***out);

/* The module whose 16-bit outputs the Accelerator's autocast hook leaves in
 * their dtype on this thread, instead of converting them to f32 (Accelerate's
 * convert_outputs_to_fp32): a model's own loss entry point (accel_llama_loss)
 * sets its root for its forward, whose logits go to the loss (which reads
 * 16-bit logits in f32 itself) and to no caller. Returns the module set
 * before, to set back. */
accel_module *accel__module_keep_outputs(accel_module *m);
bool accel__module_outputs_kept(const accel_module *m);

/* transformers' ModuleList: a container without a forward of its own. */
extern const accel_module_ops accel__module_list_ops;

/* Linear with a chosen init: init_std > 0 draws the weight from
 * normal(0, init_std) and zeros the bias (transformers' _init_weights);
 * init_std <= 0 is PyTorch's default kaiming-uniform. */
accel_module *accel__linear_create(int64_t in, int64_t out, bool bias, accel_device dev,
                                   accel_dtype dt, double init_std);
/* y = x w^T + b for Linear-like module m (a Linear, a tensor-parallel one
 * with w and b its slices or rows): the fp8 Linear with m's meta under an
 * fp8 autocast when m was converted (nn/fp8_modules.h), else accel_linear. */
accel_tensor *accel__linear_apply(accel_module *m, accel_tensor *x, accel_tensor *w, accel_tensor *b);
/* RMSNorm module with the given ops (type name "RMSNorm", "LlamaRMSNorm", ...)
 * and roles (ops/norm.h: ACCEL__NORM_*; 0 for accel_rms_norm's plain one). */
accel_module *accel__rms_norm_create(const accel_module_ops *ops, int64_t dim, double eps,
                                    accel_device dev, accel_dtype dt, unsigned roles);
/* LayerNorm (weight 1, bias 0) with the given ops. */
accel_module *accel__layer_norm_create(const accel_module_ops *ops, int64_t dim, double eps, accel_device dev,
                                       accel_dtype dt);
/* x [B, T, n, D] -> [B, T, n, D]: fn(ctx, h, x's head h [B, T, 1, D]) for
 * each head, concatenated (StableLM's per-head q/k norms). NULL + error
 * when a head's fails. */
accel_tensor *accel__each_head(accel_tensor *x, accel_tensor *(*fn)(void *ctx, int64_t h, accel_tensor *xh),
                               void *ctx);
/* nn.LayerNorm(dim, eps, bias=False): weight 1, no bias (StableLM's per-head
 * q/k norms). */
accel_module *accel__layer_norm_no_bias_create(int64_t dim, double eps, accel_device dev, accel_dtype dt);
/* transformers' Conv1D: weight [in, out] from normal(0, init_std), bias [out]
 * zero; y = x weight + bias. */
accel_module *accel__conv1d_create(int64_t in, int64_t out, accel_device dev, accel_dtype dt, double init_std);
/* Embedding with normal(0, std) init. */
accel_module *accel__embedding_create(int64_t num, int64_t dim, accel_device dev, accel_dtype dt,
                                      double std);
/* nn.Embedding(num, dim, padding_idx) (padded_embedding.c): that one with
 * row padding_idx zeroed at init and given no gradient (-1: none, the plain
 * one; at least num refused naming it). */
accel_module *accel__padded_embedding_create(int64_t num, int64_t dim, accel_device dev, accel_dtype dt, double std,
                                             int64_t padding_idx);
/* The padding_idx of an Embedding module m (-1: none). */
int64_t accel__embedding_padding_idx(const accel_module *m);

/* The SyncBatchNorms under m converted with a NULL group take dp, the
 * preparing accelerator's data-parallel group (the default group counts a
 * tp group's one batch once per rank, and spans pipeline stages that never
 * meet in the collective); dp NULL at the model's release gives them back
 * the default group (the accelerator frees dp, the model may outlive it).
 * An explicitly converted group is never touched. */
void accel__sync_batchnorm_bind(accel_module *m, accel_pg *dp);

/* Why m's tensors do not hold its whole values, so that saving or exporting
 * them would write pieces (a sentence for an error), or NULL: m, one of its
 * ancestors or one of its descendants is held by an owner that took the
 * values away (accel__link_away: an Accelerator's ZeRO-3 / FSDP FULL_SHARD),
 * or a module of the subtree is a tensor-parallel slice of a group of more
 * than one rank. */
const char *accel__module_values_away(const accel_module *m);

/* BERT's classifiers' dropout: classifier_dropout, else (config null)
 * hidden_dropout_prob (the model's and the activation estimate's). */
struct accel_bert_config;
double accel__bert_classifier_p(const struct accel_bert_config *c);

/* Weight and bias (NULL when absent) of a Linear/Embedding/norm module:
 * its tensors named "weight" and "bias". */
accel_tensor *accel__module_tensor(accel_module *m, const char *name);
/* Gives the tied tensor's non-owning name of a and b (full names of one
 * tensor) a new tensor of its own (same shape, dtype, device, kind; values
 * unset): a tied pair untied (a checkpoint that holds both with different
 * values). *untied: that name (a or b). */
accel_status accel__module_untie(accel_module *root, const char *a, const char *b, const char **untied);
/* A new parameter `name` of m (NULL m: NULL, the error kept), on the default
 * parameter device (meta inside init_empty_weights), zero-filled. */
accel_tensor *accel__new_param(accel_module *m, const char *name, accel_dtype dt, int ndim, const int64_t *shape,
                               accel_device dev);

/* Runs body(ctx, x) for module m: under accel_activation_checkpoint with m's
 * parameters when m->gradient_checkpointing, else as is. */
accel_tensor *accel__module_run(accel_module *m, accel_activation_checkpoint_fn body, void *ctx, accel_tensor *x);
/* m's own forward on x through accel__module_run, m's hooks not run: for a
 * module whose caller runs its hooks around more than this forward
 * (BertPreTrainingHeads: seq_relationship inside them too). */
accel_tensor *accel__module_forward(accel_module *m, accel_tensor *x);

/* Sets gradient checkpointing on every decoder layer of m when m is a causal
 * LM root or its model of the architecture table (LlamaForCausalLM,
 * Qwen2Model, ...: true), else does nothing (false): the decoder row of the
 * family table (family.h). */
bool accel__decoder_checkpoint_layers(accel_module *m, bool enable);

#endif
