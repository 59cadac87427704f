/*
 * accel/optim.h — optimizers (SGD, Adam, AdamW), gradient clipping, LR schedulers.
 *
 * Semantics are PyTorch's (torch.optim.SGD / Adam / AdamW, single-tensor
 * "foreach=False" math, computed in f32 with the scalar factors in double):
 *
 *   SGD:   g += wd * p; if momentum: buf = step==1 ? g : momentum*buf + (1-dampening)*g,
 *          g = nesterov ? g + momentum*buf : buf;  p -= lr * g
 *   Adam:  g += wd * p (L2); m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 *          p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
 *   AdamW: p *= 1 - lr*wd (decoupled); then Adam's update without the L2 term.
 *
 * in torch's order of operations, which decides the non-finite and
 * underflowing cases (tools/sweep_optim.py compares them with torch):
 * SGD's adds with an alpha (the wd, (1-dampening), nesterov and lr terms) are
 * multiply-adds rounded once, as torch's CPU kernels fuse them (1-dampening
 * computed in double); Adam's g += wd * p only when wd != 0, and fused too,
 * m = lerp(m, g,
 * 1-b1) as torch's lerp (m + w*(g - m) for a weight w < 0.5, else
 * g - (g - m)*(1 - w)), and p += (-lr/(1-b1^t) * m) / denom (addcdiv_'s
 * order: the product may underflow to 0 where m / denom would not).
 *
 * What an optimizer updates: a list of *segments*, each a contiguous run of f32
 * parameters with its f32 gradient of the same length:
 *   - tensor segments (accel_optimizer_add_params): one per parameter tensor;
 *     data and grad pointers are read from the tensor at every step, so
 *     parameters may be flattened (accel_module_flatten) or get their grads
 *     lazily after the optimizer was made. A parameter whose grad is NULL is
 *     skipped (as PyTorch skips grad None) and its step count does not advance.
 *   - flat segments (accel_optimizer_add_flat): a contiguous f32 tensor of
 *     parameters and one of gradients with as many elements, on one device
 *     (any: cpu, cuda:N, ...), e.g. a ZeRO rank's shard [lo, hi) of a flat
 *     parameter buffer and of the flat (reduce-scattered) gradients, as 1-d
 *     views of those buffers. The optimizer keeps views of their memory, not
 *     the tensors: the memory must outlive the optimizer, the headers need not.
 * Updates, norms and clipping run on the segment's device through its
 * backend's kernels (sgd, adam, norm_partial): a backend without one fails
 * with "kernel <name> is not implemented on <device>".
 * Each call adding segments makes a new param group with its own
 * hyperparameters (e.g. no weight decay for norms and biases).
 *
 * Memory: optimizer state (exp_avg, exp_avg_sq, momentum_buffer) is allocated,
 * zeroed, when segments are added; accel_optimizer_step never allocates.
 *
 * Dtypes: parameters and gradients must be f32 (contiguous). Mixed precision
 * keeps f32 master weights (the accelerator's job) and runs the optimizer on
 * those; a bf16/f16 parameter is refused with ACCEL_ERR_DTYPE.
 *
 * Saving: accel_optimizer_state lists the state as named tensors and scalars
 * in PyTorch's state_dict vocabulary, ready for a safetensors file:
 *   "step"                          optimizer.step() calls so far (scalar)
 *   "state.<i>.step"                steps taken by segment i (scalar)
 *   "state.<i>.exp_avg", "state.<i>.exp_avg_sq"   (Adam/AdamW, f32 [numel])
 *   "state.<i>.momentum_buffer"     (SGD with momentum, f32 [numel])
 *   "param_groups.<g>.lr", ".weight_decay", ".momentum", ".dampening",
 *   ".nesterov", ".beta1", ".beta2", ".eps"      (scalars)
 *   "param_groups.<g>.num_params"  segments group g holds (scalar)
 * where i numbers segments across groups in the order they were added (as
 * PyTorch numbers parameters) and "state.<i>.*" is present only once segment i
 * has taken a step. num_params is what torch's param_groups[g]["params"]
 * says: that list holds the numbers of the group's parameters, which run
 * group after group, so its length says which ones they are. Scheduler
 * state: "last_epoch", "base_lrs.<g>".
 */
#ifndef ACCEL_OPTIM_H
#define ACCEL_OPTIM_H

#include "core.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- optimizers */

typedef enum accel_optim_kind {
    ACCEL_OPTIM_SGD = 0,
    ACCEL_OPTIM_ADAM,
    ACCEL_OPTIM_ADAMW,
} accel_optim_kind;

/* A zero field means PyTorch's default (betas 0.9/0.999, eps 1e-8, momentum
 * and dampening 0, no nesterov), except two that have none: lr must be > 0,
 * and weight_decay is taken as given (0: none; accel_optim_defaults gives
 * AdamW's 0.01). `{.lr = 1e-3}` is Adam's defaults. Every value must be
 * finite (PyTorch takes an inf lr and turns every parameter NaN); lr,
 * weight_decay, momentum and eps >= 0, betas in [0, 1); else the add is
 * ACCEL_ERR_INVALID_ARG naming the field. */
typedef struct accel_optim_hparams {
    double lr;
    double weight_decay;
    /* SGD */
    double momentum;
    double dampening;
    bool nesterov;
    /* Adam / AdamW */
    double beta1, beta2;
    double eps;
} accel_optim_hparams;

/* PyTorch's defaults for kind with learning rate lr: SGD (momentum 0, wd 0),
 * Adam (betas 0.9/0.999, eps 1e-8, wd 0), AdamW (same, wd 0.01). */
accel_optim_hparams accel_optim_defaults(accel_optim_kind kind, double lr);
/* "sgd", "adam", "adamw" (case-insensitive); -1 when unknown. */
int accel_optim_kind_parse(const char *s);
const char *accel_optim_kind_name(accel_optim_kind kind);

typedef struct accel_optimizer accel_optimizer;

/* An optimizer with no parameters yet. */
accel_optimizer *accel_optimizer_new(accel_optim_kind kind);
/* Convenience: new + add_params / new + add_flat. NULL + error. Wherever the
 * optimizer takes hparams, h NULL = the kind's defaults with lr 1e-3
 * (accel_optim_defaults(kind, 1e-3), torch.optim's defaults). */
accel_optimizer *accel_optimizer_new_params(accel_optim_kind kind, int n,
                                            accel_tensor *const *params,
                                            const accel_optim_hparams *h);
accel_optimizer *accel_optimizer_new_flat(accel_optim_kind kind, const accel_tensor *params,
                                          const accel_tensor *grads, const accel_optim_hparams *h);
/* Convenience, as torch.optim.X(model.parameters(), ...): one group with every
 * parameter of the module (accel_module_parameters order). The optimizer
 * keeps a link to the model: freed first, the model leaves it refusing
 * every call that would read the parameters (ACCEL_ERR_STATE) but its free. */
accel_optimizer *accel_optimizer_new_module(accel_optim_kind kind, accel_module *model,
                                            const accel_optim_hparams *h);
void accel_optimizer_free(accel_optimizer *opt); /* NULL is a no-op; params are not freed */

/* Adds a param group of n parameter tensors (borrowed: they must outlive the
 * optimizer, so persistent ones). Returns the group index, or -1 + error
 * (invalid hparams, a step tensor, a non-f32 or non-contiguous parameter, a
 * parameter given twice or already in one of opt's groups: it would be
 * updated twice per step; PyTorch refuses it too). */
int accel_optimizer_add_params(accel_optimizer *opt, int n, accel_tensor *const *params,
                               const accel_optim_hparams *h);
/* Adds a param group of one flat segment: params updated from grads, both
 * contiguous f32 tensors of the same numel on one device (not meta), viewed
 * as 1-d runs (their memory borrowed, see the top of this file). Returns the
 * group index, or -1 + error naming what does not fit (params sharing memory
 * with a segment already in opt is refused: updated twice per step). */
int accel_optimizer_add_flat(accel_optimizer *opt, const accel_tensor *params, const accel_tensor *grads,
                             const accel_optim_hparams *h);

/* One update of every segment. No allocation. Refused, nothing updated,
 * when a group's live hyperparameters are bad (accel_optimizer_hparams). */
accel_status accel_optimizer_step(accel_optimizer *opt);
/* Zeroes every gradient (PyTorch's zero_grad(set_to_none=False)): one memset
 * per flat segment, one per tensor that has a grad. */
accel_status accel_optimizer_zero_grad(accel_optimizer *opt);

int accel_optimizer_num_groups(const accel_optimizer *opt);
int accel_optimizer_num_segments(const accel_optimizer *opt);
accel_optim_kind accel_optimizer_kind(const accel_optimizer *opt);
double accel_optimizer_get_lr(const accel_optimizer *opt, int group);
/* group -1: all (another group not in opt is ACCEL_ERR_INVALID_ARG). lr must be a finite number >= 0 (0: a schedule's start or
 * end); anything else is ACCEL_ERR_INVALID_ARG, the lr unchanged. */
accel_status accel_optimizer_set_lr(accel_optimizer *opt, int group, double lr);
/* The group's hyperparameters (live: writes take effect at the next step,
 * which refuses values out of the ranges above (lr may be 0 there) and an
 * SGD momentum switched on or off, its momentum_buffer being made or not when
 * the group was added: ACCEL_ERR_INVALID_ARG naming the group, nothing
 * updated). */
accel_optim_hparams *accel_optimizer_hparams(accel_optimizer *opt, int group);
int64_t accel_optimizer_step_count(const accel_optimizer *opt);

/* For ZeRO (the accelerator re-targets a prepared optimizer to its shard and
 * back). segment_param: segment i's parameter tensor (NULL for a flat
 * segment) and its group in *group (may be NULL). set_segments replaces every
 * segment by n new ones, each a tensor segment (params[k] != NULL: borrowed,
 * as add_params) or a flat one (flat_params[k], flat_grads[k]: as add_flat),
 * in existing group groups[k]. params may be NULL when every segment is flat,
 * flat_params and flat_grads when none is. The new state is zeroed, on each
 * segment's device, with step counts 0 (restore it with
 * accel_optimizer_load_state); the groups and the optimizer-wide step count
 * are kept. On error nothing changes. */
accel_tensor *accel_optimizer_segment_param(const accel_optimizer *opt, int i, int *group);
accel_status accel_optimizer_set_segments(accel_optimizer *opt, int n, accel_tensor *const *params,
                                          const accel_tensor *const *flat_params,
                                          const accel_tensor *const *flat_grads, const int *groups);

/* ---------------------------------------------------------------- state save/restore */

typedef struct accel_named_state {
    char *name;          /* owned */
    accel_tensor *t;     /* tensor state: a persistent header viewing the live state
                          * memory (not owning it; freed by accel_named_state_free);
                          * NULL for a scalar */
    double value;        /* the scalar when t == NULL */
} accel_named_state;

/* Lists the optimizer's state (see the top of this file). Returns the count
 * (>= 0) and sets *out (free with accel_named_state_free), or -1 + error. The
 * views stay valid while the optimizer lives and see later steps. */
int accel_optimizer_state(accel_optimizer *opt, accel_named_state **out);
/* Restores state saved by accel_optimizer_state from an optimizer built the
 * same way. A tensor entry may be any tensor with data (any device, f32 or
 * convertible) with the segment's numel; a scalar entry may instead be a one-element tensor. Unknown
 * names and size mismatches -> ACCEL_ERR_FORMAT naming the entry. Missing
 * "state.<i>.*" entries mean segment i has not stepped yet (its state is zeroed).
 * A state of another grouping (groups [A, B], [C] saved, [A], [B, C] here:
 * every entry would fit, and B would get group 0's lr) is refused as
 * PyTorch's load_state_dict refuses it: a "param_groups.<g>.num_params"
 * other than group g's count here, or a state recording some groups'
 * counts but not every group's here, is ACCEL_ERR_FORMAT naming the group
 * and both counts. A state without these entries (saved before they were
 * written) loads unchecked: nothing in it says how it was grouped. Every
 * entry is checked before anything is written: on error nothing changed. */
accel_status accel_optimizer_load_state(accel_optimizer *opt, int n, const accel_named_state *st);
void accel_named_state_free(accel_named_state *st, int n);

/* ---------------------------------------------------------------- gradient clipping */

/* torch.nn.utils.clip_grad_norm_: total = norm_type-norm of all gradients
 * (norm_type 2, 1, any p > 0, or INFINITY); every grad is multiplied by
 * min(1, max_norm / (total + 1e-6)). Parameters without a grad are skipped.
 * The total is what torch computes on a CPU in float32, the norm of each
 * gradient's norm: each |g|^p rounded to float32 (inf beyond FLT_MAX, 0 below
 * its smallest subnormal: for p = 1000 every |g| < 0.9), a sum of them past
 * FLT_MAX inf, a one-element gradient's norm its |g|. So grads of 1e20 have
 * an inf 2-norm (every grad zeroed) and grads of 0.5 a 1000-norm of 0 (none
 * clipped), as torch's; a double sum of every |g|^p gave finite totals and
 * clipped. (The accelerator's sharded clip, accel_accelerator_clip_grad_norm
 * under ZeRO or tensor parallelism, sums each rank's f32 terms instead of
 * per-tensor norms, and its norm past FLT_MAX is inf likewise.)
 * max_norm must be >= 0 (a negative one would flip every gradient).
 * Returns the total norm before clipping (NAN + error on failure). A NaN in
 * a gradient makes the total NaN (for every norm_type, INFINITY's max
 * included): NAN + ACCEL_ERR_INVALID_ARG, the gradients left as they were
 * (torch's error_if_nonfinite=True; without it torch multiplies them all by
 * NaN). An inf gradient gives an inf total and coefficient 0, as torch. */
double accel_clip_grad_norm(int n, accel_tensor *const *params, double max_norm, double norm_type);
/* The same over the optimizer's gradients (tensor and flat segments). */
double accel_optimizer_clip_grad_norm(accel_optimizer *opt, double max_norm, double norm_type);
/* Pieces for distributed clipping (each rank holds part of the gradients):
 * partial = accel_grad_norm_partial(g, p) per rank (sum |g|^p, or max |g|
 * for INFINITY, NaN when g holds one; g a contiguous f32 tensor on any device, reduced there by its
 * backend's norm_partial kernel), combined (accel_grad_norm_combine here;
 * across ranks a SUM all-reduce, or for INFINITY a MAX one, which drops a
 * NaN on NCCL and MPI: reduce a NaN flag beside it, as the accelerator does),
 * then total = accel_grad_norm_finish(combined, p) and
 * grads *= accel_clip_coef(total, max_norm). NAN + error on failure. */
double accel_grad_norm_partial(const accel_tensor *g, double norm_type);
/* combined + part, or for INFINITY the larger; a NaN on either side gives
 * NaN (fmax would drop it: a NaN gradient then gave a finite inf-norm). */
double accel_grad_norm_combine(double combined, double part, double norm_type);
/* combined^(1/p), or inf where combined (a sum of |g|^p) is past FLT_MAX: torch's f32 sum. */
double accel_grad_norm_finish(double combined, double norm_type);
double accel_clip_coef(double total_norm, double max_norm);

/* ---------------------------------------------------------------- LR schedulers */

/* transformers' SchedulerType names: "constant", "constant_with_warmup",
 * "linear", "cosine". */
typedef enum accel_sched_kind {
    ACCEL_SCHED_CONSTANT = 0,
    ACCEL_SCHED_CONSTANT_WARMUP,
    ACCEL_SCHED_LINEAR,
    ACCEL_SCHED_COSINE,
    ACCEL_SCHED_LAMBDA,
} accel_sched_kind;

int accel_sched_kind_parse(const char *s); /* -1 when unknown ("lambda" is not a name) */
const char *accel_sched_kind_name(accel_sched_kind kind);

/* Multiplier of the base lr at step `step` (LambdaLR's lr_lambda). */
typedef double (*accel_lr_lambda_fn)(int64_t step, void *ctx);

typedef struct accel_lr_scheduler accel_lr_scheduler;

/* A LambdaLR over every group of opt (borrowed, either may be freed first:
 * a scheduler whose optimizer was freed refuses step, get_lr and load_state,
 * directly or through an accelerator, with ACCEL_ERR_STATE, and can only be
 * freed) with transformers'
 * get_<kind>_schedule_with_warmup factor:
 *   warmup (step < warmup_steps): step / max(1, warmup_steps)
 *   constant: 1;  linear: max(0, (total - step) / max(1, total - warmup))
 *   cosine: max(0, 0.5 * (1 + cos(pi * 2 * 0.5 * progress))),
 *           progress = (step - warmup) / max(1, total - warmup)
 * As in PyTorch, construction records each group's lr as its base lr and sets
 * lr = base * factor(0). */
accel_lr_scheduler *accel_lr_scheduler_new(accel_optimizer *opt, accel_sched_kind kind,
                                           int64_t warmup_steps, int64_t total_steps);
/* A LambdaLR with a user factor function (ctx borrowed). */
accel_lr_scheduler *accel_lr_scheduler_lambda(accel_optimizer *opt, accel_lr_lambda_fn fn,
                                              void *ctx);
void accel_lr_scheduler_free(accel_lr_scheduler *s);
/* scheduler.step(): last_epoch += 1; lr_g = base_g * factor(last_epoch). A
 * factor that makes an lr NaN, infinite or negative (a lambda's) is
 * ACCEL_ERR_INVALID_ARG: no lr changes and last_epoch stays (at construction:
 * NULL). */
accel_status accel_lr_scheduler_step(accel_lr_scheduler *s);
/* get_last_lr()[group]. */
double accel_lr_scheduler_get_lr(const accel_lr_scheduler *s, int group);
int64_t accel_lr_scheduler_last_epoch(const accel_lr_scheduler *s);
/* "last_epoch" and "base_lrs.<g>" scalars (free with accel_named_state_free). */
int accel_lr_scheduler_state(accel_lr_scheduler *s, accel_named_state **out);
/* Restores them and sets each group's lr = base * factor(last_epoch).
 * last_epoch must be a whole number >= 0 and a base lr finite and >= 0; a bad
 * or unknown entry is ACCEL_ERR_FORMAT naming it, and nothing is loaded. */
accel_status accel_lr_scheduler_load_state(accel_lr_scheduler *s, int n,
                                           const accel_named_state *st);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_OPTIM_H */
