/* Training memory of accel's Llama, counted from what its ops allocate
 * (docs/bigmodel.md "Training memory"): the step arena's high-water mark over
 * one training step (activations), and the persistent per-rank bytes of each
 * sharding strategy (weights, gradients, Adam state, ZeRO-3's gathered units).
 *
 * Nothing here is fitted to a measurement. A CPU training step allocates all
 * of its step tensors from the step arena and frees none before
 * accel_step_reset, except activation checkpointing's rewinds (src/autograd/
 * tape.c): so the plain step's peak is the sum of every tensor its forward and
 * backward allocate, and a checkpointed step's peak is what outlives the
 * rewinds plus the largest single recompute (one decoder layer's forward and
 * backward). The section "What the ops allocate" mirrors src/ops/ (and the
 * gradient allocation of src/autograd/tape.c, src/ops/nn_common.c): it is the
 * one place to update when an op starts keeping more or fewer tensors.
 * Tensor headers, tape nodes and kernels' per-thread scratch rows (a few KB a
 * layer) are not counted, nor oneDNN's scratchpad. What one GEMM call
 * takes for itself (operands widened for the call, the scratchpad) is given
 * back at the call's end (accel__gemm), so only the largest call's panels
 * are counted, once, on top: no CPU kind's scratchpads pile up. */
#include <math.h>
#include <string.h>

#include "accel/bigmodel.h"
#include "backends/cpu/gemm.h"
#include "nn/arch.h"

/* The dtypes of a step: the autocast dtype (f32 = none) and whether the CPU
 * GEMM multiplies that dtype itself (oneDNN on AMX / AVX512-BF16) or on f32
 * panels made once per op (accel__mm_operand). Parameters are f32. */
typedef struct step_kind {
    accel_dtype ac;
    bool native;
    bool widens_per_call; /* native, but each GEMM widens to f32 panels for the call (accel__gemm_widens_per_call) */
    bool f32_logits;      /* the Accelerator's autocast hook converts the logits to f32 */
    bool zero3;           /* ZeRO-3 units: one more copy of each unit output's gradient */
    double threads;
} step_kind;

static double esz(accel_dtype dt) { return (double)accel_dtype_size(dt); }

/* ------------------------------------------------------------ what the ops allocate
 * Each helper returns the bytes one op helper allocates in the step arena for a
 * tensor of e elements. "contig": whether the tensor it is handed is dense. */

/* accel__f32_contig / accel__dense_f32: a copy unless already dense f32. */
static double f32_contig(double e, accel_dtype dt, bool contig) {
    return dt == ACCEL_F32 && contig ? 0 : 4 * e;
}

/* accel__contig / accel__dense: a copy of its own dtype unless dense. */
static double dense(double e, accel_dtype dt, bool contig) { return contig ? 0 : e * esz(dt); }

/* accel__contig_as: a copy in dt unless already dense in dt. */
static double contig_as(double e, accel_dtype from, accel_dtype dt, bool contig) {
    return from == dt && contig ? 0 : e * esz(dt);
}

/* accel__mm_dtype: the dtype matmul, linear and sdpa compute and return. */
static accel_dtype mm_dtype(const step_kind *k) { return k->ac; }

/* accel__mm_operand. */
static double mm_operand(const step_kind *k, double e, accel_dtype dt, bool contig) {
    if (k->ac == ACCEL_F32) return dense(e, dt, contig);
    if (!k->native) return (dt == k->ac ? 0 : e * esz(k->ac)) + 4 * e; /* rounded, then widened once */
    return dt == k->ac ? dense(e, dt, contig) : e * esz(k->ac);
}

/* accel__mm_grad: the output gradient (dtype gdt) as the backward GEMMs read it. */
static double mm_grad(const step_kind *k, double e, accel_dtype gdt) {
    if (k->ac != ACCEL_F32 && k->native) return gdt == k->ac ? 0 : e * esz(k->ac);
    return f32_contig(e, gdt, true);
}

/* accel_grad_accumulate: the first gradient of a step tensor is a copy in
 * its dtype; later ones add in place. */
static double grad_copy(double e, accel_dtype dt, bool has_grad) { return has_grad ? 0 : e * esz(dt); }

/* accel__gbuf_begin + _end: an f32 input without a gradient gets its own,
 * written directly; a low-precision one gets an f32 scratch that is then
 * accumulated (a copy in its dtype the first time). */
static double gbuf(double e, accel_dtype dt, bool has_grad) {
    if (dt == ACCEL_F32) return has_grad ? 0 : 4 * e;
    return 4 * e + grad_copy(e, dt, has_grad);
}

/* accel__gbuf_begin_native: a low-precision input's gradient in its dtype. */
static double gbuf_native(double e, accel_dtype dt, bool has_grad) {
    return dt == ACCEL_F32 ? gbuf(e, dt, has_grad) : grad_copy(e, dt, has_grad);
}

/* ------------------------------------------------------------ one training step */

typedef struct dims {
    double n;             /* tokens B*T */
    double B, T, C, Q, K, I, V, H, D;
} dims;

typedef struct ledger {
    const step_kind *k;
    const dims *d;
    double bytes;
    double call; /* the most one GEMM call takes for itself (given back at its end) */
} ledger;

/* One GEMM call's own memory, given back at its end: its f32 panels of e
 * elements in all where it widens its operands, and an f32 C of c elements
 * where its C is bf16/f16 (c 0: an f32 C) and oneDNN does not write that
 * dtype itself (the CPU's gemm kernel: backends/cpu/gemm.c). */
static void gemm_call(ledger *l, double e, double c) {
    double own = (l->k->widens_per_call ? 4 * e : 0) + (l->k->native && !l->k->widens_per_call ? 0 : 4 * c);
    if (own > l->call) l->call = own;
}

/* accel_linear forward over n tokens: x [n, in] of dtype xdt (dense), weight
 * [out, in] f32: its operand is a prepared form outside the arena (one per
 * weight, made once per step: core/prepared.h; accel_rank_memory.prepared).
 * Returns the output dtype. */
static accel_dtype linear_fwd(ledger *l, double in, double out, accel_dtype xdt) {
    accel_dtype odt = mm_dtype(l->k);
    double n = l->d->n;
    l->bytes += n * out * esz(odt) + mm_operand(l->k, n * in, xdt, true);
    gemm_call(l, n * in + in * out, odt == ACCEL_F32 ? 0 : n * out); /* Y = X W^T, written in odt */
    return odt;
}

/* accel_linear backward: the output gradient of dtype odt read by the GEMMs,
 * the input's gradient (the weight's adds into its persistent one; a
 * low-precision input's first one written by the GEMM in its dtype). */
static void linear_bwd(ledger *l, double in, double out, accel_dtype odt, accel_dtype xdt, bool x_has_grad) {
    double n = l->d->n;
    bool native_dx = xdt != ACCEL_F32 && !x_has_grad;
    l->bytes += mm_grad(l->k, n * out, odt) + (native_dx ? gbuf_native(n * in, xdt, false) : gbuf(n * in, xdt, x_has_grad));
    gemm_call(l, n * out + in * out, native_dx ? n * in : 0); /* dX = dY W */
    gemm_call(l, n * out + n * in, 0);                        /* dW = dY^T X */
}

/* accel_rms_norm forward of x [n, C] f32 (an embedding's or an add's output):
 * the output (f32, also under autocast) and rstd [n]. */
static accel_dtype rms_norm_fwd(ledger *l) {
    l->bytes += f32_contig(l->d->n * l->d->C, ACCEL_F32, true) + 4 * l->d->n * l->d->C + 4 * l->d->n;
    return ACCEL_F32;
}

/* accel_rope forward of a head-split projection [B, h, T, D] of dtype dt
 * (a transposed view, read in place) with e = n*h*D elements: the cos/sin
 * tables [T, D/2] and the output, written in dt. */
static void rope_fwd(ledger *l, double e, accel_dtype dt) { l->bytes += 2 * 4 * l->d->T * l->d->D / 2 + e * esz(dt); }

/* accel_rope backward: the output gradient read as it is, the input view's
 * gradient in its dtype. */
static void rope_bwd(ledger *l, double e, accel_dtype dt) { l->bytes += gbuf_native(e, dt, false); }

/* The backward of split_heads (reshape then transpose of a projection output
 * of dtype dt): the transpose's dense gradient, the copies into the
 * reshape's and the projection's gradients. */
static void split_heads_bwd(ledger *l, double e, accel_dtype dt) {
    l->bytes += dense(e, dt, false) + grad_copy(e, dt, false) + grad_copy(e, dt, false);
}

/* accel_add forward of f32 x and y of dtype ydt: the f32 output, y made f32. */
static void add_fwd(ledger *l, accel_dtype ydt) {
    double e = l->d->n * l->d->C;
    l->bytes += 4 * e + f32_contig(e, ydt, true);
}

/* What one decoder layer's forward and backward allocate (ops in the order
 * of src/nn/llama.c layer_body; dtypes as they flow under autocast). */
static void layer_step(ledger *fwd, ledger *bwd) {
    const dims *d = fwd->d;
    const step_kind *k = fwd->k;
    double n = d->n, eC = n * d->C, eQ = n * d->Q, eK = n * d->K, eI = n * d->I;
    /* forward: input_layernorm, q/k/v projections, RoPE on q and k */
    accel_dtype n1 = rms_norm_fwd(fwd);
    accel_dtype q = linear_fwd(fwd, d->C, d->Q, n1), kk = linear_fwd(fwd, d->C, d->K, n1),
                v = linear_fwd(fwd, d->C, d->K, n1);
    rope_fwd(fwd, eQ, q);
    rope_fwd(fwd, eK, kk);
    /* sdpa: the output (its kernel writes s itself); q and k dense (RoPE's
     * outputs), v a transposed view, each dense in s; the f32 probabilities
     * [B, H, T, T] kept for the backward */
    accel_dtype s = mm_dtype(k);
    fwd->bytes += eQ * esz(s) + contig_as(eQ, q, s, true) + contig_as(eK, kk, s, true) + contig_as(eK, v, s, false) +
                  4 * d->B * d->H * d->T * d->T;
    /* [B, H, T, D] -> [B, T, H*D]: the reshape of the transposed view copies */
    fwd->bytes += dense(eQ, s, false);
    accel_dtype o = linear_fwd(fwd, d->Q, d->C, s);
    add_fwd(fwd, o);
    accel_dtype n2 = rms_norm_fwd(fwd);
    accel_dtype g = linear_fwd(fwd, d->C, d->I, n2), u = linear_fwd(fwd, d->C, d->I, n2);
    accel_dtype sw = g; /* accel_swiglu: one fused output, its inputs kept as they are */
    fwd->bytes += eI * esz(sw);
    accel_dtype m = linear_fwd(fwd, d->I, d->C, sw);
    add_fwd(fwd, m);

    /* backward, in reverse. The output's gradient came from above. */
    bwd->bytes += grad_copy(eC, ACCEL_F32, false) + grad_copy(eC, m, false); /* add: h, mlp output */
    linear_bwd(bwd, d->I, d->C, m, sw, false);                                  /* down_proj */
    bwd->bytes += dense(eI, sw, true) + gbuf_native(eI, g, false) + gbuf_native(eI, u, false); /* swiglu */
    linear_bwd(bwd, d->C, d->I, u, n2, false); /* up_proj: the norm's output gets its gradient */
    linear_bwd(bwd, d->C, d->I, g, n2, true);  /* gate_proj adds into it */
    /* post_attention_layernorm adds into h's gradient: nothing new */
    /* add: the layer input's, the attention output's */
    bwd->bytes += grad_copy(eC, ACCEL_F32, false) + grad_copy(eC, o, false);
    linear_bwd(bwd, d->Q, d->C, o, s, false);                                /* o_proj */
    /* the reshape's view, the transpose's dense gradient, sdpa's output's */
    bwd->bytes += grad_copy(eQ, s, false) + dense(eQ, s, false) + grad_copy(eQ, s, false);
    /* sdpa: the output gradient as it is, the gradients of q, k, v in their dtype */
    bwd->bytes += dense(eQ, s, true) + gbuf_native(eQ, q, false) + gbuf_native(eK, kk, false) + gbuf_native(eK, v, false);
    rope_bwd(bwd, eK, kk);
    rope_bwd(bwd, eQ, q);
    split_heads_bwd(bwd, eK, v);
    split_heads_bwd(bwd, eK, kk);
    split_heads_bwd(bwd, eQ, q);
    linear_bwd(bwd, d->C, d->K, v, n1, false); /* v_proj: the norm's output gets its gradient */
    linear_bwd(bwd, d->C, d->K, kk, n1, true);
    linear_bwd(bwd, d->C, d->Q, q, n1, true);
    /* input_layernorm adds into the layer input's gradient: nothing new */
}

/* The step outside the layers: ids, embedding, final norm, lm_head, the
 * loss (labels; the fused cross-entropy keeps the logits' gradient) and
 * their backward. */
static void outer_step(ledger *l) {
    const dims *d = l->d;
    double n = d->n;
    l->bytes += 8 * n;                  /* ids [B, T] i64 */
    l->bytes += 4 * n * d->C;           /* embedding output (f32 weight) */
    accel_dtype hn = rms_norm_fwd(l);   /* model.norm */
    accel_dtype lo = linear_fwd(l, d->C, d->V, hn);
    double nV = n * d->V;
    if (l->k->zero3) /* the gradients of the embedding's, the norm's and the head's outputs, copied */
        l->bytes += grad_copy(2 * n * d->C, ACCEL_F32, false) + grad_copy(nV, lo, false);
    accel_dtype loss_in = lo;
    if (l->k->f32_logits && lo != ACCEL_F32) { /* accel_to_dtype, and its backward's copy */
        l->bytes += 4 * nV + grad_copy(nV, lo, false);
        loss_in = ACCEL_F32;
    }
    l->bytes += 8 * d->B + 8 * n + 8 * n; /* the pad column, labels, targets as [n] i64 */
    if (loss_in == ACCEL_F32 || loss_in == ACCEL_BF16) /* fused: the logits' gradient, per-thread rows */
        l->bytes += nV * esz(loss_in) + l->k->threads * 4 * d->V;
    else /* f16: f32 logits and lse; the backward's gradient */
        l->bytes += f32_contig(nV, loss_in, true) + 4 * n + gbuf(nV, loss_in, false);
    linear_bwd(l, d->C, d->V, lo, hn, false); /* lm_head: the norm's output gets its gradient */
    l->bytes += gbuf(n * d->C, ACCEL_F32, false); /* model.norm: the last layer's output gradient */
    /* the embedding's backward adds into its weight's gradient */
}

static bool resolve(const accel_llama_config *cfg, dims *d, const accel_activation_opts *o) {
    if (accel_llama_config_check(cfg, "accel_llama_activation_bytes") != ACCEL_OK) return false;
    if (accel__arch_find(cfg->model_type)->blocks != ACCEL__BLOCKS_LLAMA) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_llama_activation_bytes: the step's activations are modelled "
                        "for the Llama block (RMSNorm, RoPE, gated MLP), not for %s models", cfg->model_type);
        return false;
    }
    double heads = (double)cfg->num_attention_heads;
    double kv = (double)(cfg->num_key_value_heads ? cfg->num_key_value_heads : cfg->num_attention_heads);
    double hd = (double)(cfg->head_dim ? cfg->head_dim : cfg->hidden_size / cfg->num_attention_heads);
    *d = (dims){.B = (double)o->batch_size, .T = (double)o->seq_len, .C = (double)cfg->hidden_size,
                .Q = heads * hd, .K = kv * hd, .I = (double)cfg->intermediate_size,
                .V = (double)cfg->vocab_size, .H = heads, .D = hd};
    d->n = d->B * d->T;
    return true;
}

/* Bytes as int64, or false when they reach 2^62 (a config or batch no step
 * could hold, named in the caller's error). */
static bool to_bytes(double b, int64_t *out) {
    if (!(b < 0x1p62)) return false;
    *out = (int64_t)llround(b);
    return true;
}

accel_status accel_llama_activation_bytes(const accel_llama_config *cfg, const accel_activation_opts *o,
                                          accel_activation_bytes *out) {
    static const char *FN = "accel_llama_activation_bytes";
    if (!cfg || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s is NULL", FN, cfg ? "out" : "cfg");
    if (!o) /* the one options struct without defaults: the shape of a step is the question */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: options are NULL: batch_size and seq_len have no default",
                               FN);
    memset(out, 0, sizeof *out);
    if (o->batch_size < 1 || o->seq_len < 2)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: batch_size %lld and seq_len %lld: need batch_size >= 1 and seq_len >= 2 (the "
                               "loss shifts the labels by one)",
                               FN, (long long)o->batch_size, (long long)o->seq_len);
    if (o->autocast != ACCEL_F32 && o->autocast != ACCEL_BF16 && o->autocast != ACCEL_F16)
        return accel_set_error(ACCEL_ERR_DTYPE, "%s: autocast must be float32 (none), bfloat16 or float16, got %s",
                               FN, accel_dtype_name(o->autocast));
    dims d;
    if (!resolve(cfg, &d, o)) return accel_last_status();
    step_kind k = {o->autocast, o->autocast != ACCEL_F32 && accel__gemm_native(o->autocast),
                   accel__gemm_widens_per_call(o->autocast), o->accelerator, o->zero3, (double)accel_num_threads()};
    ledger lf = {&k, &d, 0, 0}, lb = {&k, &d, 0, 0}, outer = {&k, &d, 0, 0};
    layer_step(&lf, &lb);
    outer_step(&outer);
    double L = (double)cfg->num_hidden_layers, layer = lf.bytes + lb.bytes;
    /* Checkpointed, a layer leaves its output (f32) and, once its backward
     * has run, its input's gradient slot; the recompute of one layer at a
     * time sits on top, the last (layer 0) on the most. ZeRO-3's node on a
     * layer's output copies that output's gradient. */
    double kept = (o->checkpointing ? 2 * 4 * d.n * d.C : layer) + (o->zero3 ? 4 * d.n * d.C : 0);
    /* and on top, one GEMM call's own panels at a time (the largest) */
    double call = fmax(fmax(lf.call, lb.call), outer.call);
    double peak = outer.bytes + L * kept + (o->checkpointing && L > 0 ? layer : 0) + call;
    if (!to_bytes(peak, &out->peak) || !to_bytes(lf.bytes, &out->layer_forward) ||
        !to_bytes(lb.bytes, &out->layer_backward) || !to_bytes(kept, &out->kept_per_layer) ||
        !to_bytes(outer.bytes, &out->outer))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: the activations of batch %lld x seq_len %lld would take more than 2^62 bytes "
                               "(hidden_size %lld, intermediate_size %lld, vocab_size %lld, %lld layers)",
                               FN, (long long)o->batch_size, (long long)o->seq_len, (long long)cfg->hidden_size,
                               (long long)cfg->intermediate_size, (long long)cfg->vocab_size,
                               (long long)cfg->num_hidden_layers);
    return ACCEL_OK;
}

/* ------------------------------------------------------------ per rank */

const char *accel_shard_strategy_name(accel_shard_strategy s) {
    static const char *const NAMES[ACCEL_SHARD_STRATEGIES] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
    return (unsigned)s < ACCEL_SHARD_STRATEGIES ? NAMES[s] : "?";
}

accel_status accel_rank_memory_estimate(accel_shard_strategy s, int64_t param_bytes, int64_t largest_unit_bytes,
                                        int world, accel_dtype autocast, int64_t activation_bytes,
                                        accel_rank_memory *out) {
    static const char *FN = "accel_rank_memory_estimate";
    if (!out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: out is NULL", FN);
    memset(out, 0, sizeof *out);
    if (autocast != ACCEL_F32 && autocast != ACCEL_BF16 && autocast != ACCEL_F16)
        return accel_set_error(ACCEL_ERR_DTYPE, "%s: autocast must be float32 (none), bfloat16 or "
                               "float16, got %s", FN, accel_dtype_name(autocast));
    bool bf16 = autocast == ACCEL_BF16, half = autocast != ACCEL_F32;
    if ((unsigned)s >= ACCEL_SHARD_STRATEGIES || world < 1 || param_bytes < 0 || largest_unit_bytes < 0 ||
        largest_unit_bytes > param_bytes || activation_bytes < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: strategy %d, world %d, %lld parameter bytes, largest unit %lld, activations %lld",
                               FN, (int)s, world, (long long)param_bytes, (long long)largest_unit_bytes,
                               (long long)activation_bytes);
    /* f32 parameters P bytes: the flat parameter and gradient buffers, Adam's
     * exp_avg and exp_avg_sq; a shard is 1/world of each. */
    double P = (double)param_bytes, shard = P / world, L = (double)largest_unit_bytes;
    double w = P, g = P, opt = 2 * P, gathered = 0;
    if (s >= ACCEL_SHARD_ZERO1) opt = 2 * shard;
    if (s == ACCEL_SHARD_ZERO2) g = P + shard; /* the full buffer autograd fills, and the reduced shard */
    if (s == ACCEL_SHARD_ZERO3) {
        /* shards, and two units' full parameters (the current one and the
         * prefetch) and gradients (the one being made, the one reducing);
         * bf16 gathers send a bf16 copy of the shard */
        w = shard + (bf16 ? shard / 2 : 0);
        g = shard;
        gathered = 4 * L;
    }
    /* autocast's copy of every weight (core/prepared.h): bf16 / f16 on a CPU
     * that multiplies it, else those values widened to f32; and where oneDNN
     * multiplies the linears, up to two copies of each in its layout
     * (forward's, dX's: accel__gemm_weight_forms) */
    double prepared = half ? P / (accel__gemm_native(autocast) ? 2 : 1) * (1 + accel__gemm_weight_forms(autocast))
                           : P * accel__gemm_weight_forms(ACCEL_F32);
    double total = w + g + opt + gathered + prepared + (double)activation_bytes;
    if (!to_bytes(total, &out->total))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: more than 2^62 bytes per rank", FN);
    to_bytes(w, &out->weights);
    to_bytes(g, &out->grads);
    to_bytes(opt, &out->optimizer);
    to_bytes(gathered, &out->gathered);
    to_bytes(prepared, &out->prepared);
    out->activations = activation_bytes;
    return ACCEL_OK;
}
