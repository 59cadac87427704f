/* Mixtures of experts (arch.h accel__moe): the sparse block of Mixtral,
 * Qwen3-MoE and Qwen2-MoE (with its shared expert) with transformers' module
 * tree, names, routing and arithmetic, and the load-balancing loss of their
 * causal LMs.
 *
 * The router is data: each token's experts are chosen on the host from the
 * router's probabilities (as transformers' loop over the experts that got
 * tokens reads them), and the rest is ops with gradients: each expert runs
 * on the rows of its tokens (an embedding of the hidden states by token
 * index), its output weighted by the token's routing weight, and each token
 * sums its K outputs in f32, in top-k order, rounded once to the hidden
 * states' dtype: transformers 5's default experts implementation
 * (grouped_mm: the weighted rows, then .sum(dim=1) of [tokens, K, hidden]).
 * The routing weights are the probabilities masked to the chosen experts
 * (and renormalised), so their gradient reaches the router as topk's does.
 * Under tensor parallelism (decoder_tp.c) the block is one region: the
 * router whole on every rank, each expert's features split, the weighted
 * per-token sums of the experts' partial outputs summed over the ranks once. */
#include <math.h>
#include <string.h>

#include "accel/dist.h"
#include "accel/nn.h"
#include "arch.h"
#include "core/core_internal.h"
#include "decoder_cp.h"
#include "moe.h"
#include "nn_internal.h"
#include "tp_internal.h"

/* A sparse block: gate (router Linear hidden -> experts), experts (ModuleList);
 * Qwen2-MoE's also shared_expert (an MLP) and shared_expert_gate (Linear hidden -> 1). */
enum { MOE_GATE = 0, MOE_EXPERTS = 1, MOE_SHARED = 2, MOE_SHARED_GATE = 3 };
/* Mixtral's expert: transformers' construction order w1, w2, w3. */
enum { EXPERT_W1 = 0, EXPERT_W2 = 1, EXPERT_W3 = 2 };

typedef struct moe_impl {
    const accel_llama_config *cfg; /* the root's (resolved), which outlives its layers */
    const accel__arch *arch;
} moe_impl;

static accel_module *linear(const accel_llama_config *c, int64_t in, int64_t out, accel_device dev) {
    return accel__linear_create(in, out, false, dev, c->torch_dtype, c->initializer_range);
}

/* One expert MLP of row a and intermediate size I: Mixtral's w1/w2/w3, Qwen's
 * gate/up/down_proj (its MLP class, also Qwen2-MoE's shared expert). */
static accel_module *expert_new(const accel__arch *a, const accel_llama_config *c, int64_t I, accel_device dev) {
    int64_t C = c->hidden_size;
    bool mixtral = a->moe == ACCEL__MOE_MIXTRAL;
    accel_module *m = accel_module_new(mixtral ? &a->expert : &a->mlp, NULL);
    bool ok = m && (mixtral ? accel_module_add_child(m, "w1", linear(c, C, I, dev)) &&
                                  accel_module_add_child(m, "w2", linear(c, I, C, dev)) &&
                                  accel_module_add_child(m, "w3", linear(c, C, I, dev))
                            : accel_module_add_child(m, "gate_proj", linear(c, C, I, dev)) &&
                                  accel_module_add_child(m, "up_proj", linear(c, C, I, dev)) &&
                                  accel_module_add_child(m, "down_proj", linear(c, I, C, dev)));
    if (!ok) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

accel_module *accel__moe_block_create(const accel__arch *a, const accel_llama_config *c, accel_device dev) {
    moe_impl *mi = accel_malloc(sizeof *mi);
    if (!mi) return NULL;
    mi->cfg = c;
    mi->arch = a;
    accel_module *block = accel_module_new(&a->moe_block, mi);
    if (!block) {
        accel_free(mi);
        return NULL;
    }
    accel_module *experts = NULL;
    bool ok = accel_module_add_child(block, "gate", linear(c, c->hidden_size, c->num_local_experts, dev)) &&
              (experts = accel_module_add_child(block, "experts", accel_module_new(&accel__module_list_ops, NULL)));
    int64_t I = a->moe == ACCEL__MOE_QWEN ? c->moe_intermediate_size : c->intermediate_size;
    for (int64_t e = 0; ok && e < c->num_local_experts; e++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)e);
        ok = accel_module_add_child(experts, name, expert_new(a, c, I, dev)) != NULL;
    }
    ok = ok && (!a->shared_expert ||
                (accel_module_add_child(block, "shared_expert",
                                        expert_new(a, c, c->shared_expert_intermediate_size, dev)) &&
                 accel_module_add_child(block, "shared_expert_gate", linear(c, c->hidden_size, 1, dev))));
    if (!ok) {
        accel_module_free(block);
        return NULL;
    }
    return block;
}

accel_tensor *accel__moe_expert_forward(accel_module *expert, accel_tensor *x) {
    accel_module **p = expert->children;
    accel_tensor *h = accel_swiglu(accel_module_call(p[EXPERT_W1], x), accel_module_call(p[EXPERT_W3], x));
    return accel_module_call(p[EXPERT_W2], h);
}

/* ---------------------------------------------------------------- routing */

/* Whether probability a at expert i ranks before b at expert j: larger
 * first, NaN above all (torch.topk), the lower expert on ties. */
static bool ranks_before(float a, int64_t i, float b, int64_t j) {
    if (isnan(a) || isnan(b)) return isnan(a) && (!isnan(b) || i < j);
    return a > b || (a == b && i < j);
}

/* sel[n K ..] = the K experts of row n of P [N, E], best first (torch.topk's order). */
static void top_k(const float *P, int64_t N, int64_t E, int64_t K, int64_t *sel) {
    for (int64_t n = 0; n < N; n++) {
        const float *p = P + n * E;
        int64_t *s = sel + n * K;
        /* insertion into the K best so far, best first */
        int64_t have = 0;
        for (int64_t e = 0; e < E; e++) {
            int64_t at = have;
            while (at > 0 && ranks_before(p[e], e, p[s[at - 1]], s[at - 1])) at--;
            if (at >= K) continue;
            for (int64_t m = (have < K ? have : K - 1); m > at; m--) s[m] = s[m - 1];
            s[at] = e;
            if (have < K) have++;
        }
    }
}

/* Where each token's rows go. The routed rows: expert 0's tokens
 * (ascending), then expert 1's, ...: tokens[row] the token, first[e] where
 * expert e's begin (first[E] = N K). Slot-major [K, N] (slot k: every
 * token's k-th best): slot[k N + n] the row of token n's k-th expert,
 * chosen[k N + n] = n E + that expert (its probability's index in [N, E]);
 * pos[row] = k N + n, the way back. */
typedef struct routing {
    int64_t *tokens, *first, *slot, *chosen, *pos;
} routing;

static bool route(accel_arena *ar, const int64_t *sel, int64_t N, int64_t E, int64_t K, routing *r) {
    size_t nk = (size_t)(N * K) * sizeof(int64_t);
    r->tokens = accel_arena_alloc(ar, nk, 64);
    r->first = accel_arena_alloc(ar, (size_t)(E + 1) * sizeof *r->first, 64);
    r->slot = accel_arena_alloc(ar, nk, 64);
    r->chosen = accel_arena_alloc(ar, nk, 64);
    r->pos = accel_arena_alloc(ar, nk, 64);
    if (!r->tokens || !r->first || !r->slot || !r->chosen || !r->pos) return false;
    memset(r->first, 0, (size_t)(E + 1) * sizeof *r->first);
    for (int64_t i = 0; i < N * K; i++) r->first[sel[i] + 1]++;
    for (int64_t e = 0; e < E; e++) r->first[e + 1] += r->first[e];
    int64_t *cursor = accel_arena_alloc(ar, (size_t)E * sizeof *cursor, 64);
    if (!cursor) return false;
    memcpy(cursor, r->first, (size_t)E * sizeof *cursor);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int64_t e = sel[n * K + k], row = cursor[e]++;
            r->tokens[row] = n;
            r->slot[k * N + n] = row;
            r->chosen[k * N + n] = n * E + e;
            r->pos[row] = k * N + n;
        }
    return true;
}

/* A balanced routing of shapes only (meta tensors: no probabilities to
 * read): token n's k-th expert is (n K + k) mod E, so each expert gets its
 * share of the rows and the graph has the shapes a real step has. */
static void route_balanced(int64_t *sel, int64_t N, int64_t E, int64_t K) {
    for (int64_t i = 0; i < N * K; i++) sel[i] = i % E; /* K <= E: a token's K are distinct */
}

/* Host data as a tensor on dev (meta: shape only). */
static accel_tensor *upload(accel_dtype dt, int ndim, const int64_t *shape, const void *data, accel_device dev) {
    if (dev.type == ACCEL_DEV_META) return accel_empty_on(dt, ndim, shape, dev);
    accel_tensor *t = accel_from_data(dt, ndim, shape, data);
    return t && !accel_device_eq(t->device, dev) ? accel_to_device(t, dev) : t;
}

/* ---------------------------------------------------------------- the block */

/* The load-balancing statistics the calling thread's accel_llama_loss
 * collects (accel__moe_aux_collect), for the model whose config they name:
 * another thread's forward of the same model collects nothing. Kept in the
 * pointer activation checkpointing replays, so that a checkpointed block's
 * recompute in the backward finds them. */
accel__moe_aux *accel__moe_aux_collect(accel__moe_aux *x) { return accel__set_replayed(x); }

static accel__moe_aux *aux_of(const accel_llama_config *c) {
    accel__moe_aux *x = accel__replayed();
    return x && x->cfg == c ? x : NULL;
}

/* Backward of the tie between a block's output and its router
 * probabilities p [N, E] (f32): the output's gradient passes, and p gets
 * its share of the balancing loss's, x->grad_rows (the loss's backward made
 * it: it ran first, being later on the tape than every block of its
 * forward). */
static accel_status balance_backward(accel_node *n, accel_tensor *g) {
    const accel__moe_aux *x = n->ctx;
    accel_tensor *out = n->inputs[0], *p = n->inputs[1];
    if (out->requires_grad && accel__grad_move_out(n, out, g) != ACCEL_OK) return accel_last_status();
    if (!p->requires_grad || !x->grad_rows) return ACCEL_OK;
    accel_tensor *gp = accel_device_eq(x->grad_rows->device, p->device) ? x->grad_rows
                                                                       : accel_to_device(x->grad_rows, p->device);
    return gp ? accel_grad_accumulate(p, gp) : accel_last_status();
}

/* Adds a layer's router statistics to x (in the forward; a checkpointed
 * block's recompute has been counted) from its logits [N, E]: the softmax in
 * the logits' dtype, the top K of those probabilities counted, the
 * probabilities summed (transformers' load_balancing_loss_func; probs32:
 * the f32 softmax, P its host copy, sel the f32 top K). Where a backward
 * will come through this block (grad on: the forward, or a checkpoint's
 * recompute), *tie gets the f32 probabilities whose gradient carries the
 * balancing loss's (balance_backward), else NULL. */
static accel_status aux_add(accel__moe_aux *x, accel_tensor *logits, accel_tensor *probs32, const float *P,
                            const int64_t *sel, int64_t K, accel_pg *tp, accel_tensor **tie) {
    int64_t N = logits->shape[0], E = logits->shape[1];
    accel_tensor *p = probs32;
    *tie = NULL;
    if (x->keep && N != x->tokens)
        return accel_set_error(ACCEL_ERR_SHAPE, "accel_llama_loss: a sparse block saw %lld tokens, the "
                               "attention_mask of the load-balancing loss covers %lld", (long long)N,
                               (long long)x->tokens);
    if (x->block_rows && N != x->block_rows) /* one gradient share serves every block: the same rows */
        return accel_set_error(ACCEL_ERR_SHAPE, "accel_llama_loss: a sparse block saw %lld tokens, another %lld",
                               (long long)N, (long long)x->block_rows);
    x->block_rows = N;
    /* Under tensor parallelism every rank holds the same statistics, but the
     * region's collectives sum what reaches the router and the input from
     * each rank: the loss's gradient goes through rank 0's alone. */
    bool tying = x->with_grad && accel_is_grad_enabled() && (!tp || accel_pg_rank(tp) == 0);
    if (x->counted && !tying) return ACCEL_OK; /* a recompute with nothing to tie */
    if (logits->dtype != ACCEL_F32 && !(p = accel_to_dtype(accel_softmax(logits, 1), ACCEL_F32)))
        return accel_last_status();
    if (p != probs32 && !x->counted) { /* the counts of the top K in the logits' dtype */
        accel_arena *ar = accel_step_arena();
        float *P16 = accel_arena_alloc(ar, (size_t)(N * E) * sizeof *P16, 64);
        int64_t *s = accel_arena_alloc(ar, (size_t)(N * K) * sizeof *s, 64);
        if (!P16 || !s || accel_tensor_to_host(p, P16) != ACCEL_OK) return accel_last_status();
        top_k(P16, N, E, K, s);
        sel = s, P = P16;
    }
    if (!x->counted) /* the tokens the attention_mask keeps (transformers' masked means) */
        for (int64_t n = 0; n < N; n++) {
            if (x->keep && !x->keep[n]) continue;
            for (int64_t k = 0; k < K; k++) x->counts[sel[n * K + k]] += 1;
            for (int64_t e = 0; e < E; e++) x->prob_sum[e] += P[n * E + e];
            x->rows++;
        }
    if (tying && p->requires_grad) *tie = p;
    return ACCEL_OK;
}

/* out, tied to the router probabilities p (see balance_backward). */
static accel_tensor *balance_tie(accel__moe_aux *x, accel_tensor *out, accel_tensor *p) {
    accel_tensor *y = accel_alias(out);
    accel_node *n = y ? accel_tape_record("moe_balance", balance_backward, y, 2, (accel_tensor *[]){out, p}) : NULL;
    if (n) n->ctx = x;
    return y;
}

accel_tensor *accel__moe_forward(accel_module *block, accel_tensor *x) {
    const moe_impl *mi = block->impl;
    const accel_llama_config *c = mi->cfg;
    const accel__arch *a = mi->arch;
    accel_module *gate = block->children[MOE_GATE], **experts = block->children[MOE_EXPERTS]->children;
    /* Tensor parallelism (decoder_tp.c): the block is one region, entered
     * here (under sequence parallelism the whole sequence gathered), so each
     * rank routes every token as one process does, and left at the end. */
    accel_pg *tp = accel__tp_group(gate);
    if (tp && !(x = accel__tp_enter(gate, x))) return NULL;
    int64_t C = x->shape[x->ndim - 1], N = accel_numel(x) / C, E = c->num_local_experts, K = c->num_experts_per_tok;
    accel_device dev = x->device;
    bool meta = dev.type == ACCEL_DEV_META;
    accel_tensor *h = accel_reshape(x, 2, (int64_t[]){N, C}); /* [N, C] */
    if (h && a->moe == ACCEL__MOE_MIXTRAL && c->router_jitter_noise > 0 && block->training && !meta) {
        /* Mixtral's jitter: the router and the experts see h times U(1 - j, 1 + j) */
        accel_tensor *noise = accel_empty_on(h->dtype, 2, h->shape, dev);
        if (!noise || accel_rng_uniform_(NULL, noise, 1.0 - c->router_jitter_noise, 1.0 + c->router_jitter_noise))
            return NULL;
        /* rank 0's noise on every rank: each must route alike, whatever its generator's state */
        if (tp && accel_pg_broadcast(tp, accel__device_ptr(noise), (size_t)N * (size_t)C, noise->dtype, 0))
            return NULL;
        h = accel_mul(h, noise);
    }
    accel_tensor *logits = accel_module_call(gate, h);                 /* [N, E], the weights' dtype */
    accel_tensor *probs = logits ? accel_softmax(accel_to_dtype(logits, ACCEL_F32), 1) : NULL; /* f32 */
    if (!probs) return NULL;
    accel_arena *ar = accel_step_arena();
    int64_t *sel = accel_arena_alloc(ar, (size_t)(N * K) * sizeof *sel, 64);
    float *P = meta ? NULL : accel_arena_alloc(ar, (size_t)(N * E) * sizeof *P, 64);
    routing r;
    if (!sel || (!meta && !P)) return NULL;
    if (meta) route_balanced(sel, N, E, K);
    else if (accel_tensor_to_host(probs, P) != ACCEL_OK) return NULL;
    else top_k(P, N, E, K, sel);
    if (!route(ar, sel, N, E, K, &r)) return NULL;
    accel__moe_aux *aux = meta ? NULL : aux_of(c);
    accel_tensor *tie = NULL;
    if (aux && aux_add(aux, logits, probs, P, sel, K, tp, &tie) != ACCEL_OK) return NULL;
    /* routing weights [K, N]: each token's chosen probabilities, best first
     * (gathered: their gradient goes to the chosen, as topk's), divided by
     * their f32 sum in that order (torch's sum over K) */
    accel_tensor *w = accel_reshape(accel_embedding(upload(ACCEL_I64, 1, (int64_t[]){K * N}, r.chosen, dev),
                                                    accel_reshape(probs, 2, (int64_t[]){N * E, 1})),
                                    2, (int64_t[]){K, N});
    if (w && (a->moe == ACCEL__MOE_MIXTRAL || c->norm_topk_prob)) {
        accel_tensor *sum = accel_slice(w, 0, 0, 1, 1);
        for (int64_t k = 1; k < K && sum; k++) sum = accel_add(sum, accel_slice(w, 0, k, k + 1, 1));
        w = accel_div(w, sum);
    }
    /* Qwen's weights rounded to the router's dtype (its product with a
     * 16-bit expert output is 16-bit, as torch's, rounded below); Mixtral's
     * stay f32 (its products are f32). The products are made in f32 either
     * way: an f32 weight beside a 16-bit row is read as it is, where two
     * 16-bit operands would be widened, and their backward too. */
    accel_dtype wdt = a->moe == ACCEL__MOE_QWEN ? logits->dtype : ACCEL_F32;
    if (w && wdt != ACCEL_F32) w = accel_to_dtype(accel_to_dtype(w, wdt), ACCEL_F32);
    /* each routed row's weight [N K, 1], in the rows' order */
    accel_tensor *wrows = w ? accel_embedding(upload(ACCEL_I64, 1, (int64_t[]){N * K}, r.pos, dev),
                                              accel_reshape(w, 2, (int64_t[]){K * N, 1})) : NULL;
    accel_tensor *tokens = upload(ACCEL_I64, 1, (int64_t[]){N * K}, r.tokens, dev);
    accel_tensor *slots = upload(ACCEL_I64, 2, (int64_t[]){K, N}, r.slot, dev);
    accel_tensor **outs = accel_arena_alloc(ar, (size_t)E * sizeof *outs, 64);
    if (!wrows || !tokens || !slots || !outs) return NULL;
    int n_out = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t lo = r.first[e], hi = r.first[e + 1];
        if (lo == hi) continue; /* no token chose it: not run (transformers' expert_hit) */
        accel_tensor *ids = accel_slice(tokens, 0, lo, hi, 1);          /* [n_e] */
        accel_tensor *y = accel_module_call(experts[e], accel_embedding(ids, h)); /* [n_e, C] */
        if (!y) return NULL;
        outs[n_out++] = y;
    }
    accel_tensor *Y = n_out == 1 ? outs[0] : accel_concat(n_out, outs, 0); /* [N K, C] */
    /* each row times its weight, in torch's product dtype: f32 beside Mixtral's
     * f32 weights, else the rows' (a bf16 x bf16 product rounded once) */
    accel_dtype pdt = Y && Y->dtype == wdt ? wdt : ACCEL_F32;
    Y = accel_mul(Y, wrows);
    if (Y && pdt != ACCEL_F32) Y = accel_to_dtype(Y, pdt);
    accel_tensor *out = NULL;
    for (int64_t k = 0; k < K && Y; k++) { /* token n's k-th best, summed in f32 */
        accel_tensor *g = accel_embedding(accel_reshape(accel_slice(slots, 0, k, k + 1, 1), 1, (int64_t[]){N}), Y);
        if (g && g->dtype != ACCEL_F32) g = accel_to_dtype(g, ACCEL_F32);
        out = out ? accel_add(out, g) : g;
    }
    if (out && out->dtype != h->dtype) out = accel_to_dtype(out, h->dtype);
    if (out && a->shared_expert) {
        /* + sigmoid(shared_expert_gate(h)) [N, 1] * shared_expert(h) [N, C], each op in
         * h's dtype (torch's: a 16-bit product and sum rounded once each); under
         * tensor parallelism the shared expert's output is this rank's partial
         * one, and the gate (whole on every rank) scales each alike */
        accel_tensor *g = accel_sigmoid(accel_module_call(block->children[MOE_SHARED_GATE], h));
        out = accel_add(out, accel_mul(g, accel_module_call(block->children[MOE_SHARED], h)));
    }
    /* under tensor parallelism each rank's sum is of its features' partial outputs */
    out = out ? accel_reshape(out, x->ndim, x->shape) : NULL;
    if (out && tie) out = balance_tie(aux, out, tie);
    return tp && out ? accel__tp_leave(gate, out) : out;
}

/* ---------------------------------------------------------------- load balancing */

accel__moe_aux *accel__moe_aux_begin(const accel_llama_config *c, const uint8_t *keep, int64_t tokens) {
    accel_arena *ar = accel_step_arena();
    accel__moe_aux *x = accel_arena_alloc(ar, sizeof *x, 64);
    double *sums = accel_arena_alloc(ar, 2 * (size_t)c->num_local_experts * sizeof *sums, 64);
    if (!x || !sums) return NULL;
    memset(sums, 0, 2 * (size_t)c->num_local_experts * sizeof *sums);
    *x = (accel__moe_aux){.experts = c->num_local_experts, .keep = keep, .tokens = tokens, .counts = sums,
                          .prob_sum = sums + c->num_local_experts, .with_grad = accel_is_grad_enabled(), .cfg = c};
    return x;
}

/* Backward of the balancing loss: makes, once for every block's tie
 * (balance_backward), the probabilities' share of the gradient g that
 * reached it, g d/dp of E sum_e (counts_e / rows) (prob_sum_e / rows):
 * g E counts_e / rows^2 on every row, 0 on a masked token's (in no mean).
 * In the outer backward's step memory, before any checkpoint's recompute
 * (whose memory is rewound). The loss it was recorded beside gets nothing. */
static accel_status balance_loss_backward(accel_node *n, accel_tensor *g) {
    accel__moe_aux *x = n->ctx;
    float v = 1;
    if (!accel__grad_is_implicit_one(g) && accel_tensor_to_host(accel_to_dtype(g, ACCEL_F32), &v) != ACCEL_OK)
        return accel_last_status();
    x->grad_rows = NULL;
    int64_t N = x->block_rows, E = x->experts;
    if (v == 0 || !x->rows || !N) return ACCEL_OK;
    float *G = accel_arena_alloc(accel_step_arena(), (size_t)(N * E) * sizeof *G, 64);
    if (!G) return accel_last_status();
    double rows = (double)x->rows;
    for (int64_t e = 0; e < E; e++) G[e] = (float)((double)v * (double)E * x->counts[e] / rows / rows);
    for (int64_t i = 1; i < N; i++) memcpy(G + i * E, G, (size_t)E * sizeof *G);
    for (int64_t i = 0; x->keep && i < N; i++)
        if (!x->keep[i]) memset(G + i * E, 0, (size_t)E * sizeof *G);
    x->grad_rows = upload(ACCEL_F32, 2, (int64_t[]){N, E}, G, g->device);
    return x->grad_rows ? ACCEL_OK : accel_last_status();
}

accel_tensor *accel__moe_aux_loss(accel__moe_aux *x, accel_tensor *loss) {
    x->counted = true;
    double lb = 0; /* no sparse layer ran: transformers' 0 */
    for (int64_t e = 0; x->rows && e < x->experts; e++)
        lb += (double)x->counts[e] / (double)x->rows * (x->prob_sum[e] / (double)x->rows);
    float v = (float)(lb * (double)x->experts);
    accel_tensor *t = upload(ACCEL_F32, 0, NULL, &v, loss->device);
    accel_node *n = t && x->with_grad ? accel_tape_record("moe_balance_loss", balance_loss_backward, t, 1, &loss) : NULL;
    if (n) n->ctx = x;
    return t;
}
