/* The tape: nodes recorded in the step arena by ops, run backwards by
 * accel_backward. */
#include <stdlib.h>
#include <string.h>

#include "accel/autograd.h"
#include "core/backend.h"
#include "core/core_internal.h"
#include "core/prepared.h"
#include "core/step_casts.h"

typedef struct tape {
    accel_node **nodes; /* arena memory of the generation below */
    int n, cap;
    uint32_t gen;       /* arena generation the nodes belong to */
    uint32_t pass;      /* backward pass counter (leaf scratch stamps) */
} tape;

static _Thread_local tape tl_tape;
static _Thread_local bool tl_grad_disabled;
static _Thread_local accel_grad_ready_fn tl_ready_fn;
static _Thread_local void *tl_ready_ctx;
typedef void (*pass_begin_fn)(void *ctx);
static _Thread_local pass_begin_fn tl_pass_fn;
static _Thread_local void *tl_pass_ctx;
/* The output gradient of the node whose backward runs when it is shared
 * (ACCEL_TF_GRAD_SHARED), else NULL: nothing may take its elements over. */
static _Thread_local const accel_tensor *tl_out_shared;
/* The output accel_backward seeded with ones (accel__grad_is_implicit_one), while its backward runs. */
static _Thread_local const accel_tensor *tl_seeded_one;
static _Thread_local void *tl_replayed;

bool accel_set_grad_enabled(bool enabled) {
    bool prev = !tl_grad_disabled;
    tl_grad_disabled = !enabled;
    return prev;
}

bool accel_is_grad_enabled(void) { return !tl_grad_disabled; }

accel_status accel_requires_grad_(accel_tensor *t, bool requires) {
    if (!accel_tensor_check(t, "accel_requires_grad_", "t")) return accel_last_status();
    if (requires && !accel_dtype_is_float(t->dtype)) /* as torch: the tape never tracks it */
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_requires_grad_: t is %s: only a floating-point tensor can require grad",
                               accel_dtype_name(t->dtype));
    t->requires_grad = requires;
    return ACCEL_OK;
}

void accel_set_grad_ready_hook(accel_grad_ready_fn fn, void *ctx) {
    tl_ready_fn = fn;
    tl_ready_ctx = ctx;
}

void accel__grad_ready_hook(void (**fn)(accel_tensor *leaf, void *ctx), void **ctx) {
    *fn = tl_ready_fn;
    *ctx = tl_ready_ctx;
}

/* The tape of the current arena generation (empty after a step reset). */
static tape *current_tape(void) {
    uint32_t gen = accel_arena_generation(accel_step_arena());
    if (tl_tape.gen != gen) {
        tl_tape.nodes = NULL;
        tl_tape.n = tl_tape.cap = 0;
        tl_tape.gen = gen;
    }
    return &tl_tape;
}

int accel_tape_size(void) { return current_tape()->n; }

void accel_tape_clear(void) {
    tape *t = current_tape();
    t->n = 0;
}

bool accel_needs_grad(int n, accel_tensor *const *inputs) {
    if (tl_grad_disabled) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) return true;
    return false;
}

static int node_arity(const accel_node *n) { return n->n_inputs + n->n_more; }

static accel_tensor *node_input(const accel_node *n, int k) {
    return k < n->n_inputs ? n->inputs[k] : n->more[k - n->n_inputs];
}

/* Appends a node; `more` is already arena memory (or NULL). */
static accel_node *record_node(const char *op, accel_backward_fn backward, accel_tensor *out, int n_inputs,
                               accel_tensor *const *inputs, int n_more, accel_tensor **more) {
    if (!out || !(accel_needs_grad(n_inputs, inputs) || accel_needs_grad(n_more, more))) return NULL;
    ACCEL_ASSERT(n_inputs <= ACCEL_NODE_MAX_INPUTS);
    tape *t = current_tape();
    accel_arena *a = accel_step_arena();
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        accel_node **nodes = accel_arena_alloc(a, (size_t)cap * sizeof *nodes, 64);
        if (!nodes) return NULL;
        if (t->n) memcpy(nodes, t->nodes, (size_t)t->n * sizeof *nodes);
        t->nodes = nodes;
        t->cap = cap;
    }
    accel_node *node = accel_arena_alloc(a, sizeof *node, 64);
    if (!node) return NULL;
    memset(node, 0, sizeof *node);
    node->op = op;
    node->backward = backward;
    node->out = out;
    node->n_inputs = n_inputs;
    for (int i = 0; i < n_inputs; i++) node->inputs[i] = inputs[i];
    node->n_more = n_more;
    node->more = more;
    node->index = t->n;
    t->nodes[t->n++] = node;
    out->requires_grad = true;
    out->grad_fn = node;
    return node;
}

accel_node *accel_tape_record(const char *op, accel_backward_fn backward, accel_tensor *out,
                              int n_inputs, accel_tensor *const *inputs) {
    return record_node(op, backward, out, n_inputs, inputs, 0, NULL);
}

static bool is_leaf(const accel_tensor *t) { return t->requires_grad && !t->grad_fn; }

/* ---- tensors freed while the tape reads them */

/* The backward of a node one of whose tensors was freed after its forward:
 * it cannot run (its pointers are gone), and says which and why. ctx: the
 * freed tensor's name in the arena, or NULL. */
static accel_status freed_backward(accel_node *node, accel_tensor *grad_out) {
    (void)grad_out;
    const char *name = node->ctx;
    return accel_set_error(ACCEL_ERR_STATE, "accel_backward: '%s' of this graph reads %s%s%s, which was freed after "
                           "its forward (accel_tensor_free / accel_module_free): free it after the backward, or "
                           "after accel_step_reset()", node->op, name ? "\"" : "a tensor", name ? name : "",
                           name ? "\"" : "");
}

/* The backward of a node whose tensor went to meta after the forward
 * (accel__tape_forget_data): refused, naming it. */
static accel_status dropped_backward(accel_node *node, accel_tensor *grad_out) {
    (void)grad_out;
    const char *name = node->ctx;
    return accel_set_error(ACCEL_ERR_STATE, "accel_backward: '%s' of this graph reads %s%s%s, whose data went to meta "
                           "after its forward (an offloaded weight of a dispatched model goes back to disk or its "
                           "host copy once its module has run): backward through offloaded weights is not "
                           "implemented; map what you train to a device or the cpu, without offload",
                           node->op, name ? "\"" : "a tensor", name ? name : "", name ? "\"" : "");
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)*(accel_tensor *const *)a, y = (uintptr_t)*(accel_tensor *const *)b;
    return x < y ? -1 : x > y;
}

static bool in_sorted(accel_tensor *const *sorted, int n, const accel_tensor *t) {
    return t && bsearch(&t, sorted, (size_t)n, sizeof *sorted, cmp_ptr);
}

/* Node n loses t (NULL where it was) and its backward becomes `why`
 * (freed_backward or dropped_backward), naming t. */
static void poison(accel_node *n, const accel_tensor *t, accel_backward_fn why) {
    if (n->backward != freed_backward && n->backward != dropped_backward) {
        const char *name = t->name;
        char *copy = name ? accel_arena_alloc(accel_step_arena(), strlen(name) + 1, 1) : NULL;
        if (copy) memcpy(copy, name, strlen(name) + 1);
        n->backward = why;
        n->ctx = copy;
    }
}

bool accel__tape_live(void) { return accel__step_arena_if_made() && current_tape()->n > 0; }

void accel__tape_drop(void) { tl_tape = (tape){0}; }

static void forget(accel_tensor *const *ts, int n, accel_backward_fn why) {
    if (n <= 0 || !accel__tape_live()) return; /* a free makes no step arena */
    tape *tp = current_tape();
    accel_tensor *one[1], **sorted = n == 1 ? one : accel_malloc((size_t)n * sizeof *sorted);
    if (!sorted) { /* out of memory: one at a time */
        for (int i = 0; i < n; i++) forget(ts + i, 1, why);
        return;
    }
    memcpy(sorted, ts, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_ptr);
    for (int i = 0; i < tp->n; i++) {
        accel_node *nd = tp->nodes[i];
        for (int k = 0; k < nd->n_inputs; k++)
            if (in_sorted(sorted, n, nd->inputs[k])) poison(nd, nd->inputs[k], why), nd->inputs[k] = NULL;
        for (int k = 0; k < nd->n_more; k++)
            if (in_sorted(sorted, n, nd->more[k])) poison(nd, nd->more[k], why), nd->more[k] = NULL;
        for (int k = 0; k < 4; k++)
            if (in_sorted(sorted, n, nd->saved[k])) poison(nd, nd->saved[k], why), nd->saved[k] = NULL;
        /* an in-place op's output a persistent tensor: the walk reads
         * out->grad, so a header of the step without one stands in */
        if (in_sorted(sorted, n, nd->out)) {
            poison(nd, nd->out, why);
            accel_tensor *stand_in = accel__arena_header(nd->out->dtype, nd->out->ndim, nd->out->shape, nd->out->device);
            if (!stand_in) { /* no memory for it: the tape ends before this node (its graph "freed") */
                tp->n = i;
                break;
            }
            nd->out = stand_in;
        }
    }
    if (sorted != one) accel_free(sorted);
}

void accel__tape_forget(accel_tensor *const *ts, int n) { forget(ts, n, freed_backward); }

void accel__tape_forget_data(accel_tensor *const *ts, int n) { forget(ts, n, dropped_backward); }

bool accel__grad_first_is_step(const accel_tensor *t) {
    return t->requires_grad && !t->grad && (t->grad_fn || (t->flags & ACCEL_TF_ARENA));
}

accel_status accel_grad_accumulate(accel_tensor *t, const accel_tensor *g) {
    if (!accel_tensor_check(t, "accel_grad_accumulate", "t") ||
        !accel_tensor_check(g, "accel_grad_accumulate", "grad"))
        return accel_last_status();
    if (!t->requires_grad) return ACCEL_OK;
    if (!accel_same_shape(t, g)) {
        char a[64], b[64];
        return accel_set_error(ACCEL_ERR_SHAPE, "autograd: gradient of shape %s for a tensor of shape %s",
                               accel_shape_str(g, b, sizeof b), accel_shape_str(t, a, sizeof a));
    }
    if (t->device.type == ACCEL_DEV_META) return ACCEL_OK;
    if (!accel_device_eq(t->device, g->device)) {
        char a[32], b[32];
        return accel_set_error(ACCEL_ERR_DEVICE, "autograd: gradient on %s for a tensor on %s",
                               accel_device_str(g->device, b, sizeof b), accel_device_str(t->device, a, sizeof a));
    }
    if (accel__grad_first_is_step(t)) {
        /* A step tensor's first gradient: a copy, not zeros + add; of
         * another dtype, the conversion an op made of g in its own pass
         * where it offered one (a decoder norm's backward, ops/norm.h),
         * taken: t's alone from now on. */
        if (g->dtype != t->dtype && (t->grad = accel__step_cast_take(g, ACCEL__FORM_CAST, t->dtype)))
            return ACCEL_OK;
        t->grad = accel_empty_on(t->dtype, t->ndim, t->shape, t->device);
        if (t->grad && accel_copy_(t->grad, g) != ACCEL_OK) return accel_last_status();
        return t->grad ? ACCEL_OK : accel_last_status();
    }
    if (accel__grad_is_shared(t)) {
        /* Another tensor holds these elements as its gradient: the sum goes
         * to fresh memory, t's alone. f32: one pass, the same float add as
         * the in-place one; else a copy to add into. */
        bool f32 = t->grad->dtype == ACCEL_F32 && g->dtype == ACCEL_F32;
        accel_tensor *sum = accel_empty_on(t->grad->dtype, t->ndim, t->shape, t->device);
        if (!sum) return accel_last_status();
        accel_k_binary add = {.out = sum, .a = t->grad, .b = (accel_tensor *)g, .op = ACCEL_B_ADD};
        accel_status st = f32 ? ACCEL_KERNEL("accel_grad_accumulate", t->device, binary, &add) : accel_copy_(sum, t->grad);
        if (st != ACCEL_OK) return st; /* t still holds the shared buffer, unchanged */
        t->grad = sum;
        if (f32) {
            accel__tensor_written(sum);
            return ACCEL_OK;
        }
    }
    if (!t->grad) {
        if (!(t->grad = accel_tensor_new(t->dtype, t->ndim, t->shape, t->device))) return accel_last_status();
        t->grad->flags |= ACCEL_TF_GRAD;
    }
    accel_k_accumulate k = {.out = t->grad, .in = (accel_tensor *)g};
    accel_status st = ACCEL_KERNEL("accel_grad_accumulate", t->device, accumulate, &k);
    accel__tensor_written(t->grad);
    return st;
}

/* Whether t's first gradient may be g's own elements (core_internal.h:
 * accel__grad_move): t's first gradient is step memory, g dense step memory
 * of t's shape, dtype and device. */
static bool can_take(const accel_tensor *t, const accel_tensor *g) {
    uintptr_t lo, hi, slo, shi;
    return accel__grad_first_is_step(t) && g->dtype == t->dtype && accel_same_shape(t, g) && accel_is_contiguous(g) &&
           accel_device_eq(g->device, t->device) && accel__tensor_span(g, &lo, &hi) &&
           accel__in_own_step_arena((const void *)lo, hi - lo) &&
           !(tl_out_shared && accel__tensor_span(tl_out_shared, &slo, &shi) && lo < shi && slo < hi);
}

accel_status accel__grad_move(accel_tensor *t, accel_tensor *g) {
    if (!accel_tensor_check(t, "accel_grad_accumulate", "t") ||
        !accel_tensor_check(g, "accel_grad_accumulate", "grad"))
        return accel_last_status();
    if (!can_take(t, g)) return accel_grad_accumulate(t, g);
    t->grad = g;
    return ACCEL_OK;
}

bool accel__grad_is_shared(const accel_tensor *t) { return t->grad && (t->grad->flags & ACCEL_TF_GRAD_SHARED); }

/* Whether t is the output of a node of the running tape: the reverse walk
 * will run that node (unless a backward fails first) and end t's share. */
static bool on_tape(const accel_tensor *t) {
    const tape *tp = current_tape();
    const accel_node *n = t->grad_fn;
    return n && n->index < tp->n && tp->nodes[n->index] == n;
}

accel_status accel__grad_share(accel_tensor *t, accel_tensor *holder) {
    if (!accel_tensor_check(t, "accel_grad_accumulate", "t") ||
        !accel_tensor_check(holder, "accel_grad_accumulate", "holder") ||
        !accel_tensor_check(holder->grad, "accel_grad_accumulate", "grad"))
        return accel_last_status();
    accel_tensor *g = holder->grad;
    /* t's node, run later in this pass, ends the share. t a leaf (or a
     * node's output from a freed graph) has none: it would keep the buffer
     * with the holder after the pass, one gradient that the user or
     * clip_grad_norm treat as two. A leaf holder's grad-ready hook would
     * fire while t still reads the buffer. */
    if (!(g->flags & ACCEL_TF_ARENA) || !on_tape(t) || (!on_tape(holder) && tl_ready_fn) || !can_take(t, g))
        return accel_grad_accumulate(t, g);
    g->flags |= ACCEL_TF_GRAD_SHARED;
    t->grad = g;
    return ACCEL_OK;
}

accel_status accel__grad_move_out(accel_node *n, accel_tensor *x, accel_tensor *gx) {
    accel_status st = accel__grad_move(x, gx);
    if (x->grad == gx && accel__same_data(gx, n->out->grad)) n->out->grad = NULL;
    return st;
}

void accel__set_pass_begin_hook(void (*fn)(void *ctx), void *ctx) {
    tl_pass_fn = fn;
    tl_pass_ctx = ctx;
}

bool accel__leaf_in_pass(const accel_tensor *t) { return t && t->ag_gen == tl_tape.pass; }

static void fire_ready(accel_tensor *leaf) {
    if (tl_ready_fn) tl_ready_fn(leaf, tl_ready_ctx);
}

accel_status accel_backward_with(accel_tensor *out, accel_tensor *grad) {
    if (!accel_tensor_check(out, "accel_backward", "output") ||
        !accel_tensor_check(grad, "accel_backward", "grad"))
        return accel_last_status();
    if (!out->requires_grad)
        return accel_set_error(ACCEL_ERR_STATE,
                               "accel_backward: the tensor does not require grad and has no grad_fn "
                               "(was it computed with grad disabled, or from no parameter?)");
    tape *t = current_tape();
    accel_node *root = out->grad_fn;
    if (root && (root->index >= t->n || t->nodes[root->index] != root))
        return accel_set_error(ACCEL_ERR_STATE,
                               "accel_backward: the graph of this tensor was already freed "
                               "(backward called twice, or after accel_step_reset)");
    bool prev = accel_set_grad_enabled(false);
    accel_status st = accel_grad_accumulate(out, grad);
    if (!root || st != ACCEL_OK) {
        if (st == ACCEL_OK && is_leaf(out)) fire_ready(out);
        accel_set_grad_enabled(prev);
        return st;
    }

    /* Stamp each leaf with the first tape index that uses it: its gradient is
     * complete once the reverse walk has passed that node. */
    uint32_t pass = ++t->pass;
    for (int i = 0; i <= root->index; i++) {
        accel_node *n = t->nodes[i];
        for (int k = 0; k < node_arity(n); k++) {
            accel_tensor *in = node_input(n, k);
            if (in && is_leaf(in) && in->ag_gen != pass) {
                in->ag_gen = pass;
                in->ag_first_use = i;
            }
        }
    }
    if (tl_ready_fn && tl_pass_fn) tl_pass_fn(tl_pass_ctx); /* not a checkpoint's nested walk */
    int failed = -1;
    for (int i = root->index; i >= 0 && st == ACCEL_OK; i--) {
        accel_node *n = t->nodes[i];
        failed = i;
        if (n->out->grad) {
            accel_tensor *g = n->out->grad;
            bool shared = g->flags & ACCEL_TF_GRAD_SHARED;
            const accel_tensor *prev_shared = tl_out_shared;
            tl_out_shared = shared ? g : NULL;
            st = n->backward(n, g);
            tl_out_shared = prev_shared;
            if (st != ACCEL_OK && accel_last_status() == ACCEL_OK)
                accel_set_error(st, "accel_backward: backward of '%s' failed", n->op);
            /* n->out's gradient is read: the other holder has g alone. */
            if (shared) {
                g->flags &= ~(uint32_t)ACCEL_TF_GRAD_SHARED;
                n->out->grad = NULL;
            }
        }
        for (int k = 0; k < node_arity(n); k++) {
            accel_tensor *in = node_input(n, k);
            if (in && is_leaf(in) && in->ag_gen == pass && in->ag_first_use == i) {
                in->ag_first_use = -1;
                fire_ready(in);
            }
        }
    }
    /* A failed pass leaves the nodes below unrun: their outputs drop the
     * gradients they still share (partial sums either way), so that no
     * buffer stays held twice: the other holder keeps it alone. */
    for (int i = st == ACCEL_OK ? -1 : failed - 1; i >= 0; i--) {
        accel_tensor *o = t->nodes[i]->out;
        if (accel__grad_is_shared(o)) {
            o->grad->flags &= ~(uint32_t)ACCEL_TF_GRAD_SHARED;
            o->grad = NULL;
        }
    }
    /* The graph is freed, as in PyTorch; later ops record a new one. */
    t->n = 0;
    accel_set_grad_enabled(prev);
    return st;
}

accel_status accel_backward(accel_tensor *loss) {
    if (!accel_tensor_check(loss, "accel_backward", "loss")) return accel_last_status();
    if (accel_numel(loss) != 1) {
        char b[64];
        return accel_set_error(ACCEL_ERR_SHAPE,
                               "accel_backward: grad can be implicitly created only for one-element "
                               "outputs, got shape %s", accel_shape_str(loss, b, sizeof b));
    }
    accel_tensor *seed = accel_empty_on(loss->dtype, loss->ndim, loss->shape, loss->device);
    if (!seed) return accel_last_status();
    if (accel_fill_(seed, 1.0) != ACCEL_OK) return accel_last_status();
    const accel_tensor *prev = tl_seeded_one;
    tl_seeded_one = loss;
    accel_status st = accel_backward_with(loss, seed);
    tl_seeded_one = prev;
    return st;
}

bool accel__grad_is_implicit_one(const accel_tensor *t) { return t && t == tl_seeded_one; }

/* ---- activation checkpointing */

void *accel__replayed(void) { return tl_replayed; }

void *accel__set_replayed(void *p) {
    void *prev = tl_replayed;
    tl_replayed = p;
    return prev;
}

typedef struct checkpoint_ctx {
    accel_activation_checkpoint_fn fn;
    void *ctx;
    accel_rng rng;        /* the default generator before the first run */
    accel_dtype autocast; /* the autocast dtype of the first run */
    void *replayed;       /* accel__replayed() at the first run */
} checkpoint_ctx;

/* A leaf's backward-pass scratch, kept across the recompute's own pass. */
typedef struct leaf_stamp {
    int32_t first_use;
    uint32_t gen;
} leaf_stamp;

/* Re-runs the checkpointed function as it ran in the forward (same RNG state,
 * autocast and replayed pointer, grad on), from xs. The caller has given it a tape of its own. */
static accel_tensor *recompute(const checkpoint_ctx *c, accel_tensor *xs) {
    accel_rng *rng = accel_default_rng(), now = accel__rng_get(rng);
    accel__rng_set(rng, c->rng);
    accel_dtype autocast = accel_autocast_begin(c->autocast);
    bool grad = accel_set_grad_enabled(true);
    void *replayed = accel__set_replayed(c->replayed);
    accel_tensor *ys = c->fn(c->ctx, xs);
    accel__set_replayed(replayed);
    accel_set_grad_enabled(grad);
    accel_autocast_end(autocast);
    accel__rng_set(rng, now);
    if (!ys && accel_last_status() == ACCEL_OK)
        accel_set_error(ACCEL_ERR_STATE, "accel_activation_checkpoint: the recomputed forward returned NULL");
    return ys;
}

/* *slot: the step-arena gradient t would get from the recompute's pass (an
 * input without one yet that is not a persistent leaf), allocated before the
 * arena mark so that it outlives the rewind; NULL when t needs none. False on
 * out of memory. */
static bool grad_slot(const accel_tensor *t, accel_tensor **slot) {
    *slot = NULL;
    if (!t || !accel__grad_first_is_step(t)) return true;
    *slot = accel_empty_on(t->dtype, t->ndim, t->shape, t->device);
    return *slot != NULL;
}

/* Moves t's gradient from the recompute's arena memory into its slot. */
static accel_status keep_grad(accel_tensor *t, accel_tensor *slot) {
    if (!slot || !t->grad) return ACCEL_OK;
    accel_status st = accel_copy_(slot, t->grad);
    t->grad = slot;
    return st;
}

/* The recompute and its backward, on a tape of their own, firing no
 * grad-ready hook (the outer walk fires them for node->more, the parameters).
 * x gets its gradient from xs's. */
static accel_status recompute_backward(const checkpoint_ctx *c, accel_tensor *x, accel_tensor *xs, accel_tensor *g,
                                       accel_tensor *x_slot) {
    tape outer = tl_tape;
    tl_tape = (tape){.gen = outer.gen, .pass = outer.pass};
    accel_grad_ready_fn ready = tl_ready_fn;
    tl_ready_fn = NULL;
    accel_tensor *ys = recompute(c, xs);
    /* Nothing of the recompute requires grad (x stopped requiring it after
     * the forward and the function has no parameters): nothing to hand back,
     * as any op's backward skips such inputs. */
    accel_status st = !ys ? accel_last_status() : ys->requires_grad ? accel_backward_with(ys, g) : ACCEL_OK;
    tl_ready_fn = ready;
    outer.pass = tl_tape.pass;
    tl_tape = outer;
    if (st != ACCEL_OK || !xs->grad) return st;
    if (!x_slot) return accel_grad_accumulate(x, xs->grad);
    if (accel_copy_(x_slot, xs->grad) != ACCEL_OK) return accel_last_status();
    x->grad = x_slot; /* the first gradient of x: a copy, as accel_grad_accumulate does */
    return ACCEL_OK;
}

/* Backward of a checkpoint node: recompute on a nested tape, back-propagate g
 * through it, hand x its gradient; then free the recompute's step memory (an
 * arena rewind), so that one unit's activations live at a time. The gradients
 * that outlive it (x's, and those of arena parameters) get slots allocated
 * before the mark. The outer pass's leaf stamps are left as they were. */
static accel_status checkpoint_backward(accel_node *n, accel_tensor *g) {
    const checkpoint_ctx *c = n->ctx;
    int arity = node_arity(n);
    accel_arena *a = accel_step_arena();
    accel_tensor *x = n->inputs[0], *xs = accel_alias(x); /* a leaf of the recomputed graph */
    leaf_stamp *stamps = accel_arena_alloc(a, (size_t)arity * sizeof *stamps, 8);
    accel_tensor **slots = accel_arena_alloc(a, (size_t)arity * sizeof *slots, 8);
    if (!xs || !stamps || !slots) return accel_last_status();
    xs->requires_grad = x->requires_grad;
    for (int k = 0; k < arity; k++) {
        accel_tensor *in = node_input(n, k);
        if (!grad_slot(in, &slots[k])) return accel_last_status();
        if (in) stamps[k] = (leaf_stamp){in->ag_first_use, in->ag_gen};
    }

    accel_arena_mark mark = accel_arena_mark_now(a);
    accel_status st = recompute_backward(c, x, xs, g, slots[0]);
    for (int k = 1; k < arity && st == ACCEL_OK; k++)
        if (node_input(n, k)) st = keep_grad(node_input(n, k), slots[k]);
    xs->grad = NULL;
    accel_arena_rewind(a, mark);

    for (int k = 0; k < arity; k++)
        if (node_input(n, k)) {
            node_input(n, k)->ag_first_use = stamps[k].first_use;
            node_input(n, k)->ag_gen = stamps[k].gen;
        }
    return st;
}

accel_tensor *accel_activation_checkpoint(accel_activation_checkpoint_fn fn, void *ctx, accel_tensor *x, int n_params,
                               accel_tensor *const *params) {
    if (!fn || n_params < 0 || (n_params > 0 && !params)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_activation_checkpoint: %s", !fn ? "fn is NULL" : "bad params array");
        return NULL;
    }
    if (!accel_tensor_check(x, "accel_activation_checkpoint", "x")) return NULL;
    if (!accel_needs_grad(1, &x) && !accel_needs_grad(n_params, params)) return fn(ctx, x);
    accel_arena *a = accel_step_arena();
    checkpoint_ctx *c = accel_arena_alloc(a, sizeof *c, 8);
    accel_tensor **more = accel_arena_alloc(a, (size_t)(n_params ? n_params : 1) * sizeof *more, 8);
    if (!c || !more) return NULL;
    *c = (checkpoint_ctx){fn, ctx, accel__rng_get(accel_default_rng()), accel_autocast_dtype(), tl_replayed};
    for (int i = 0; i < n_params; i++) more[i] = params[i];
    /* The forward's intermediates are freed at once: only the output is kept
     * (a tensor of the node's own; y may be x itself, or a parameter). */
    accel_arena_mark mark = accel_arena_mark_now(a);
    bool grad = accel_set_grad_enabled(false);
    accel_tensor *y = fn(ctx, x);
    accel_set_grad_enabled(grad);
    accel_tensor *out = y ? accel__rewind_keeping(mark, y) : NULL;
    if (!y) accel_arena_rewind(a, mark);
    if (!out) return NULL;
    accel_node *node = record_node("checkpoint", checkpoint_backward, out, 1, &x, n_params, more);
    if (!node) return NULL;
    node->ctx = c;
    return out;
}
