/* Mixtures of experts (moe.c): the sparse block of the families whose
 * architecture row has moe (arch.h), and the load-balancing loss that
 * accel_llama_loss adds with output_router_logits. Internal to src/nn. */
#ifndef ACCEL_NN_MOE_H
#define ACCEL_NN_MOE_H

#include "accel/nn.h"
#include "arch.h"

/* The sparse block of row a for the resolved config c (which outlives it):
 * gate (Linear hidden -> experts, no bias) and experts.0 .. experts.E-1, each
 * an expert MLP (arch.h accel__moe), Qwen2-MoE's shared_expert and
 * shared_expert_gate after them, on dev with transformers' init. */
accel_module *accel__moe_block_create(const accel__arch *a, const accel_llama_config *c, accel_device dev);

/* The load-balancing statistics of one forward: while the calling thread
 * collects into one (accel__moe_aux_collect), each sparse block of that
 * model adds its rows' top-k counts and router probability sums, and, where
 * a backward will run through it, ties its probabilities to its output so
 * that the backward hands them their share of the loss's gradient (also
 * from a checkpointed block's recompute: the statistics are what
 * checkpointing replays, core_internal.h accel__replayed). In the step
 * arena: the backward reads them after accel_llama_loss has returned. */
typedef struct accel__moe_aux {
    int64_t experts, rows; /* rows: tokens counted x sparse layers seen */
    const uint8_t *keep;   /* [tokens] (B T, the batch's order): 0 where the attention_mask leaves a token
                            * out of the statistics; NULL: every token counts */
    int64_t tokens;        /* keep's length */
    int64_t block_rows;    /* the rows every sparse block routes (the batch's tokens; 0 until the first) */
    double *counts;        /* [experts]: top-k choices per expert */
    double *prob_sum;      /* [experts]: the f32 router probabilities summed over rows */
    bool with_grad;        /* grad mode was on when it began */
    bool counted;          /* the forward is over (accel__moe_aux_loss): recomputes add nothing */
    accel_tensor *grad_rows; /* [block_rows, experts] f32: each block's probabilities' share of the
                              * gradient that reached the balancing loss, made once by its backward
                              * (NULL: none to hand) */
    const accel_llama_config *cfg; /* the model's (its root's resolved config) */
} accel__moe_aux;

/* New statistics for a model of config c (zeroed) in the step arena, over
 * the tokens keep marks (keep[tokens], step memory; NULL: all, as
 * transformers without an attention_mask); NULL + error. */
accel__moe_aux *accel__moe_aux_begin(const accel_llama_config *c, const uint8_t *keep, int64_t tokens);
/* The calling thread's sparse blocks of x's model collect into x from now
 * on (NULL: stop); returns what was collecting before (to set back). */
accel__moe_aux *accel__moe_aux_collect(accel__moe_aux *x);
/* transformers' load_balancing_loss_func of what x collected: a 0-dim f32
 * tensor on the device of loss (the loss it is added to), sum_e (counts_e /
 * rows) (prob_sum_e / rows) * experts (0 when no sparse layer ran). Ends
 * the counting; with grad, its node's backward makes grad_rows for the
 * blocks' backward. */
accel_tensor *accel__moe_aux_loss(accel__moe_aux *x, accel_tensor *loss);

#endif
