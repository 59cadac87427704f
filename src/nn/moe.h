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
 * model adds its rows' top-k counts and f32 router probability sums. */
typedef struct accel__moe_aux {
    int64_t experts, rows;  /* rows: tokens x sparse layers seen */
    double *counts;         /* [experts]: top-k choices per expert (the step arena's) */
    accel_tensor *prob_sum; /* [experts] f32, with its graph: the probabilities summed over rows */
    bool with_grad;         /* grad mode was on when it began: a block that runs with it off is refused */
    const accel_llama_config *cfg; /* the model's (its root's resolved config) */
} accel__moe_aux;

/* Starts x for a model of config c (counts zeroed). */
accel_status accel__moe_aux_begin(accel__moe_aux *x, const accel_llama_config *c);
/* The calling thread's sparse blocks of x's model collect into x from now
 * on (NULL: stop); returns what was collecting before (to set back). */
accel__moe_aux *accel__moe_aux_collect(accel__moe_aux *x);
/* transformers' load_balancing_loss_func of what x collected: a 0-dim f32
 * tensor on dev, sum_e (counts_e / rows) (prob_sum_e / rows) * experts (0
 * when no sparse layer ran). */
accel_tensor *accel__moe_aux_loss(accel__moe_aux *x, accel_device dev);
/* Forgets what x holds (its counts and tensor belong to the step). */
void accel__moe_aux_end(accel__moe_aux *x);

#endif
