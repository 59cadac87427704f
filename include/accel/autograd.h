/*
 * accel/autograd.h — reverse-mode automatic differentiation on a tape.
 *
 * Every differentiable op, when grad mode is on and one of its inputs
 * requires grad, appends a node to the calling thread's tape (in the step
 * arena). accel_backward(loss) walks the tape from the end: each node turns
 * the gradient of its output into gradients of its inputs. Gradients of
 * leaves (tensors created with requires_grad, typically parameters)
 * accumulate into leaf->grad across backward calls until zeroed; gradients
 * of intermediate tensors live in the step arena.
 *
 * The tape is cleared by accel_step_reset() (and after a backward pass, as
 * PyTorch frees its graph). A second backward over the same tape is an error.
 */
#ifndef ACCEL_AUTOGRAD_H
#define ACCEL_AUTOGRAD_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ACCEL_NODE_MAX_INPUTS 4

typedef struct accel_node accel_node;

/* Computes the gradients of node->inputs[i] from `grad_out` (the gradient of
 * node->out, same shape) and hands each to accel_grad_accumulate(). Runs in
 * grad-disabled mode. Returns ACCEL_OK or an error status. */
typedef accel_status (*accel_backward_fn)(accel_node *node, accel_tensor *grad_out);

struct accel_node {
    const char *op;                         /* "add", "linear", ... (for errors) */
    accel_backward_fn backward;
    accel_tensor *out;
    int n_inputs;
    accel_tensor *inputs[ACCEL_NODE_MAX_INPUTS];
    /* Op-specific saved values. */
    accel_tensor *saved[4];
    int64_t iarg[8];
    double farg[4];
    void *ctx;                              /* arena memory, op-specific */
    int32_t index;                          /* position on the tape */
    /* Leaves used besides inputs[] (a checkpoint node's parameters): an
     * arena array, counted like inputs for grad-ready hooks. */
    int n_more;
    accel_tensor **more;
};

/* Grad mode (thread-local; default on). Returns the previous value. */
bool accel_set_grad_enabled(bool enabled);
bool accel_is_grad_enabled(void);

/* Thread-local autocast dtype: ACCEL_F32 means off. Returns the previous one.
 * Ops read it (ops.h); here beside grad mode because activation
 * checkpointing replays a forward under the autocast it first ran in.
 * Only ACCEL_BF16, ACCEL_F16 and ACCEL_F32 are taken: another dtype sets an
 * error (ACCEL_ERR_DTYPE) and leaves the autocast dtype unchanged. */
accel_dtype accel_autocast_begin(accel_dtype dt);
void accel_autocast_end(accel_dtype previous);
accel_dtype accel_autocast_dtype(void);

/* Marks a tensor as a leaf that requires grad. Fails on a dead or expired tensor,
 * and (as torch) on an integer or bool one asked to require grad. */
accel_status accel_requires_grad_(accel_tensor *t, bool requires);

/* True when an op with these inputs should record a node. */
bool accel_needs_grad(int n, accel_tensor *const *inputs);

/* Appends a node producing `out` from inputs (NULL entries allowed) and
 * sets out->requires_grad / out->grad_fn. Returns the node for the op to fill
 * its saved fields, or NULL when no node is needed (grad off, or no input
 * requires grad). */
accel_node *accel_tape_record(const char *op, accel_backward_fn backward, accel_tensor *out,
                              int n_inputs, accel_tensor *const *inputs);

/* Adds g (any dtype; converted to t's dtype) into t->grad. For leaves the grad
 * is persistent (allocated on first use, zero-filled) unless already bound
 * (e.g. to a view of a flat gradient buffer); for others it lives in the arena.
 * g may be broadcast-reduced by the caller first; shapes must match. */
accel_status accel_grad_accumulate(accel_tensor *t, const accel_tensor *g);

/* Runs the backward pass from a one-element tensor (seed gradient 1). */
accel_status accel_backward(accel_tensor *loss);
/* Runs the backward pass from `out` with the given seed gradient. */
accel_status accel_backward_with(accel_tensor *out, accel_tensor *grad);

/* Called once per leaf during a backward pass, as soon as its gradient for this
 * pass is complete (no later node will add to it). Data-parallel training uses
 * this to start gradient all-reduces while backward goes on; a hook set here
 * stays set through accel_accelerator_backward, which calls it for each leaf
 * before its own (it sees the local gradient, and what it changes is what is
 * reduced; as torch's post-accumulate-grad hooks beside DDP's). One per
 * thread; NULL removes it. */
typedef void (*accel_grad_ready_fn)(accel_tensor *leaf, void *ctx);
void accel_set_grad_ready_hook(accel_grad_ready_fn fn, void *ctx);

/* Activation (gradient) checkpointing, as torch.utils.checkpoint: runs
 * fn(ctx, x) with grad disabled, so none of its intermediates is saved on the
 * tape, and records ONE node producing its output, with inputs x and
 * params[0..n_params) (the leaves fn uses: a module's parameters). Its
 * backward re-runs fn(ctx, x) with grad on, on a tape of its own, under the
 * default RNG state and autocast dtype of the first run (dropout draws the
 * same mask), and back-propagates through that: gradients are bit-identical
 * to a run without checkpointing. Grad-ready hooks fire for params as for
 * any node's inputs, once the walk has passed their first use; fn must not
 * use tensors requiring grad other than x and params. Step memory: what fn
 * allocates in the step arena is freed when it returns (an arena rewind; the
 * output is a copy made after it), and the recompute's when its backward is
 * done, so one call's intermediates live at a time. ctx must live until the
 * backward (e.g. in the step arena, allocated before the call). Without grad
 * to record, it is fn(ctx, x). Returns the output (a step tensor), NULL on
 * error. */
typedef accel_tensor *(*accel_activation_checkpoint_fn)(void *ctx, accel_tensor *x);
accel_tensor *accel_activation_checkpoint(accel_activation_checkpoint_fn fn, void *ctx, accel_tensor *x, int n_params,
                               accel_tensor *const *params);

/* Number of nodes on the tape (tests). */
int accel_tape_size(void);
/* Drops the tape without running it (called by accel_step_reset). */
void accel_tape_clear(void);

/* Reduces a gradient of a broadcast result back to `shape` (sums over the
 * broadcast dims). Returns g itself when shapes already match. */
accel_tensor *accel_sum_to_shape(accel_tensor *g, int ndim, const int64_t *shape);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_AUTOGRAD_H */
