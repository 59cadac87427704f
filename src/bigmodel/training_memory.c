/* Training memory of accel's models (every decoder family of the
 * architecture table, nn/arch.h, and BERT), counted from what their ops allocate
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
 * layer) are not counted. What one GEMM call takes for itself (operands
 * widened for the call, oneDNN's scratchpad) is given back at the call's end
 * (accel__gemm): no CPU kind's scratchpads pile up, and a call raises the
 * peak only by what it stands above all that its layer (or the step outside
 * the layers) allocates after it. The Linears' scratchpads are oneDNN's own
 * figures (a primitive description per GEMM shape, nothing run); attention's
 * per-head tiles' are not counted. */
#include <math.h>
#include <string.h>

#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "backends/cpu/gemm.h"
#include "nn/arch.h"
#include "nn/decoder_cp.h"
#include "nn/nn_internal.h"
#include "nn/tp_internal.h"

/* The dtypes of a step: the autocast dtype (f32 = none) and whether the CPU
 * GEMM multiplies that dtype itself (oneDNN on AMX / AVX512-BF16) or on f32
 * panels made once per activation (accel__mm_operand, core/step_casts.h).
 * Parameters are f32. */
typedef struct step_kind {
    accel_dtype ac;
    bool native;
    bool widens_per_call; /* native, but each GEMM widens to f32 panels for the call (accel__gemm_widens_per_call) */
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

/* The f32 output gradient a Linear's bias gradient (its column sums) reads
 * (linear_backward): the GEMMs' own where accel__mm_grad made it f32 (no
 * autocast, or an autocast dtype the CPU's GEMM widens), else a copy of the
 * gradient (dtype gdt) made f32. */
static double bias_grad_f32(const step_kind *k, double e, accel_dtype gdt) {
    return k->ac != ACCEL_F32 && k->native ? f32_contig(e, gdt, true) : 0;
}

/* accel_grad_accumulate: the first gradient of a step tensor is a copy in
 * its dtype; later ones add in place. (Where the backward hands over a
 * buffer of its own, accel__grad_move, the first gradient takes it: no copy,
 * nothing counted.) */
static double grad_copy(double e, accel_dtype dt, bool has_grad) { return has_grad ? 0 : e * esz(dt); }

/* accel_add's backward of an f32 input and a branch of dtype b, neither with
 * a gradient yet: one of them takes the output's gradient over, the other
 * holds it too where b is f32 (accel__grad_share: no copy), else its
 * gradient is a copy in its dtype (a bf16 branch's: the conversion). */
static double add_bwd(double e, accel_dtype b) { return b == ACCEL_F32 ? 0 : grad_copy(e, b, false); }

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
    double ns;            /* tokens of the residual stream on this rank: n, or n / tp under sequence parallelism */
    bool tp;              /* one rank of tensor parallelism: Q, K, I, V, H, Hkv are this rank's share */
    double Kw, Qw;        /* with fewer key/value heads than tp: the whole k and q widths (replicated rows), else 0 */
    double B, T, C, Q, K, I, V, H, D;
    double Hkv;
    double R;             /* the rotary dims of a head: D, or D * partial_rotary_factor */
    double cp;            /* context parallelism's ranks (1: none): T is this rank's 2c = T / cp positions */
    double Tg;            /* the whole sequence (T without cp) */
    bool a2a;             /* cp's all-to-all (Ulysses) strategy, else all-gather */
    double E, topk, Ie;   /* a sparse layer's experts, the experts per token, an expert's intermediate size */
    double Is;            /* Qwen2-MoE's shared expert's intermediate size (0: none) */
} dims;

/* What the family's row (nn/arch.h) and config change in the step, in the
 * order src/nn/llama.c (and gpt2.c, layers.c) run it. */
typedef struct fam {
    bool gpt2;          /* LayerNorm, fused c_attn split into q/k/v, no RoPE, gelu MLP, learned positions */
    bool layer_norm;    /* LayerNorm (GPT-2, BERT): a mean beside rstd */
    bool gemma;         /* scaled embedding, norms x * (1 + w) through f32 views, gelu(gate) * up */
    bool sandwich;      /* Gemma2: the attention's and the MLP's outputs normalised too */
    bool norm_outputs;  /* OLMo 2: the two norms on the branches' outputs, none before them */
    bool qk_norm;       /* Qwen3: RMSNorm over each head of q and k */
    bool qk_norm_heads; /* StableLM's qk_layernorm: those norms a LayerNorm of its own per head, head by head */
    bool qk_norm_full;  /* OLMo 2: RMSNorm over the whole q and k projections */
    bool fused_qkv, fused_gate_up; /* Phi-3 (GPT-NeoX: its per-head query_key_value): one projection each, sliced */
    bool multipliers;   /* Granite: embedding, residual branches and logits scaled */
    double cap;         /* Gemma2's attn_logit_softcapping (0: none) */
    bool eager_scores;  /* Gemma2: explicit scores in the autocast dtype, as transformers' eager attention */
    bool final_cap;     /* Gemma2's final_logit_softcapping */
    double attn_pdrop, resid_pdrop, embd_pdrop; /* GPT-2's dropouts (a training step) */
    bool mlp_drop_only; /* StableLM: resid_pdrop (hidden_dropout) on the MLP's output, not the attention's */
    bool qkv_bias, o_bias, mlp_bias; /* the Linears with a bias */
    bool gelu_mlp;      /* Phi, GPT-NeoX: the MLP fc1 -> gelu -> fc2 (Linears with biases) */
    bool parallel;      /* Phi's parallel_residual: the MLP reads the attention's input norm, x + attn + mlp */
    bool norm2;         /* GPT-NeoX's parallel layer: the MLP reads its own norm of x (a second region entry) */
    bool moe_f32_weights; /* Mixtral: the routing weights stay f32 (Qwen: the logits' dtype) */
    bool renorm;          /* the chosen experts' weights renormalised (Mixtral; Qwen's norm_topk_prob) */
    bool jitter;          /* Mixtral's router_jitter_noise: the block's input times uniform noise */
} fam;

typedef struct ledger {
    const step_kind *k;
    const dims *d;
    const fam *f;
    double bytes;
    double top; /* the highest a GEMM call (or an op's scratch) takes the arena, from the ledger's start:
                 * the bytes allocated before it plus what it takes for itself (given back at its end) */
} ledger;

/* Scratch of b bytes that an op takes on top of what is allocated so far
 * and gives back before it returns. */
static void scratch(ledger *l, double b) { l->top = fmax(l->top, l->bytes + b); }

/* One GEMM call's own memory, given back at its end: its f32 panels of e
 * elements in all where it widens its operands, an f32 C of c elements
 * where its C is bf16/f16 (c 0: an f32 C) and oneDNN does not write that
 * dtype itself (the CPU's gemm kernel: backends/cpu/gemm.c), and the `own`
 * bytes oneDNN's primitive takes for the call as its scratchpad. */
static void gemm_call(ledger *l, double e, double c, double own) {
    scratch(l, (l->k->widens_per_call ? 4 * e : 0) + (l->k->native && !l->k->widens_per_call ? 0 : 4 * c) + own);
}

/* A Linear's GEMM C [M, N] = op(A) [M, K] op(B) [K, N] + beta C, C in the
 * mm dtype where c_lowp (else f32): gemm_call with its operands' elements
 * and the scratchpad oneDNN reports for its primitive where the GEMM goes
 * there (accel__gemm_dnnl_scratchpad; compute dtype the autocast one where
 * the GEMM multiplies it, else f32). On AVX-512 a weight gradient's
 * (K = the step's tokens) is hundreds of KB: the checkpointed peak. */
static void linear_call(ledger *l, bool ta, bool tb, double M, double N, double K, bool c_lowp, float beta) {
    accel_dtype dt = l->k->native ? l->k->ac : ACCEL_F32;
    double pad = fmax(M, fmax(N, K)) < 0x1p31
                     ? (double)accel__gemm_dnnl_scratchpad(dt, ta, tb, (int64_t)M, (int64_t)N, (int64_t)K, beta,
                                                           c_lowp ? dt : ACCEL_F32)
                     : 0;
    gemm_call(l, M * K + K * N, c_lowp ? M * N : 0, pad);
}

/* accel_linear forward over n tokens: x [n, in] of dtype xdt (dense), weight
 * [out, in] f32: its operand is a prepared form outside the arena (one per
 * weight, made once per step: core/prepared.h; accel_rank_memory.prepared).
 * A bias adds nothing in the arena (its gradient is persistent). `shared`:
 * an earlier projection of the same x made x's operand, which this one
 * reads (core/step_casts.h). `conv1d`: GPT-2's Conv1D, accel_matmul of x
 * and the weight [in, out], whose bf16/f16 result its GEMM writes as a
 * Linear's does (src/ops/matmul.c). Returns the output dtype. */
static accel_dtype linear_fwd_of(ledger *l, double in, double out, accel_dtype xdt, bool shared, bool conv1d) {
    accel_dtype odt = mm_dtype(l->k);
    double n = l->d->n;
    l->bytes += n * out * esz(odt) + (shared ? 0 : mm_operand(l->k, n * in, xdt, true));
    linear_call(l, false, !conv1d, n, out, in, odt != ACCEL_F32, 0); /* Y = X W^T (X W), written in odt */
    return odt;
}

static accel_dtype linear_fwd(ledger *l, double in, double out, accel_dtype xdt) {
    return linear_fwd_of(l, in, out, xdt, false, false);
}

/* accel_linear backward: the output gradient of dtype odt read by the GEMMs,
 * the input's gradient (the weight's adds into its persistent one; a
 * low-precision input's first one written by the GEMM in its dtype, but
 * through accel_matmul's f32 scratch for a Conv1D). */
static void linear_bwd(ledger *l, double in, double out, accel_dtype odt, accel_dtype xdt, bool x_has_grad,
                       bool conv1d) {
    double n = l->d->n;
    bool native_dx = !conv1d && xdt != ACCEL_F32 && !x_has_grad;
    l->bytes += mm_grad(l->k, n * out, odt) + (native_dx ? gbuf_native(n * in, xdt, false) : gbuf(n * in, xdt, x_has_grad));
    linear_call(l, false, conv1d, n, in, out, native_dx, xdt == ACCEL_F32 && x_has_grad); /* dX = dY W (W^T) */
    linear_call(l, true, false, conv1d ? in : out, conv1d ? out : in, n, false, 1); /* dW, into its gradient */
}

/* A binary op (accel_add, accel_mul) of dense e-element operands of dtypes
 * a and b: the output in their promotion, computed in f32 where it is not. */
static accel_dtype binary_fwd(ledger *l, double e, accel_dtype a, accel_dtype b) {
    accel_dtype o = a == ACCEL_F32 || b == ACCEL_F32 ? ACCEL_F32 : a;
    l->bytes += e * esz(o) + f32_contig(e, a, true) + f32_contig(e, b, true) + (o == ACCEL_F32 ? 0 : 4 * e);
    return o;
}

/* A layer's projection: a Linear, or GPT-2's Conv1D (layers.c: x W, then +
 * bias, an add whose output is f32; in backward the product's gradient is
 * the add's copy). Returns the output dtype. */
static accel_dtype proj_fwd(ledger *l, double in, double out, accel_dtype xdt, bool shared) {
    accel_dtype odt = linear_fwd_of(l, in, out, xdt, shared, l->f->gpt2);
    return l->f->gpt2 ? binary_fwd(l, l->d->n * out, odt, ACCEL_F32) : odt;
}

/* Its backward; `bias`: a Linear's bias, whose gradient (column sums) reads
 * the output gradient in f32 (bias_grad_f32). */
static void proj_bwd(ledger *l, double in, double out, accel_dtype odt, accel_dtype xdt, bool x_has_grad, bool bias) {
    accel_dtype mm = odt;
    if (l->f->gpt2) { /* the product takes the add's (f32) gradient, or copies it in its dtype */
        mm = mm_dtype(l->k);
        l->bytes += mm == ACCEL_F32 ? 0 : grad_copy(l->d->n * out, mm, false);
    } else if (bias) {
        l->bytes += bias_grad_f32(l->k, l->d->n * out, odt);
    }
    linear_bwd(l, in, out, mm, xdt, x_has_grad, l->f->gpt2);
}

/* A pointwise op of src/ops/pointwise.c's unary() (mul_scalar, tanh, gelu)
 * on e dense elements of dtype dt: its output in dt, and where dt is not f32
 * the input made f32 and an f32 result copied out. Returns dt. */
static accel_dtype unary_fwd(ledger *l, double e, accel_dtype dt) {
    l->bytes += e * esz(dt) + (dt == ACCEL_F32 ? 0 : 8 * e);
    return dt;
}

/* Its backward: the f32 gradient, the output gradient, input and output
 * made f32 where they are not, then the first gradient of the input (the
 * f32 gradient itself for an f32 input, else a copy in its dtype). */
static void unary_bwd(ledger *l, double e, accel_dtype dt) {
    l->bytes += 4 * e + 3 * f32_contig(e, dt, true) + (dt == ACCEL_F32 ? 0 : grad_copy(e, dt, false));
}

/* accel_mul's backward from the output gradient (dtype o): for each input
 * g * (the other), itself an accel_mul, then the input's first gradient, a
 * copy in its dtype. */
static void mul_bwd(ledger *l, double e, accel_dtype a, accel_dtype b, accel_dtype o) {
    binary_fwd(l, e, o, b);
    binary_fwd(l, e, o, a);
    l->bytes += grad_copy(e, a, false) + grad_copy(e, b, false);
}

/* accel_dropout of e elements of dtype dt with p > 0 in a training step: its
 * output and u8 mask; the backward's f32 gradient and the input's copy. */
static void dropout_fwd(ledger *l, double e, accel_dtype dt) { l->bytes += e * esz(dt) + e + (dt == ACCEL_F32 ? 0 : 8 * e); }
static void dropout_bwd(ledger *l, double e, accel_dtype dt) { l->bytes += f32_contig(e, dt, true) + 4 * e + grad_copy(e, dt, false); }

/* The cross-entropy of `rows` rows of `classes` logits of dtype lo, as the
 * fused kernel runs it for f32 and bf16 logits (src/ops/loss.c: the
 * logits' gradient in their dtype, which their backward takes as it is,
 * and per-thread f32 rows of the classes), two kernels for f16 (f32
 * logits, lse, then the gradient). The targets made [rows] i64 are the
 * caller's. */
static void cross_entropy_step(ledger *l, double rows, double classes, accel_dtype lo) {
    double e = rows * classes;
    if (lo == ACCEL_F32 || lo == ACCEL_BF16)
        l->bytes += e * esz(lo) + l->k->threads * 4 * classes;
    else
        l->bytes += f32_contig(e, lo, true) + 4 * rows + gbuf(e, lo, false);
}

/* The family's norm forward of e = rows * w elements (f32 input: an embedding's
 * or an add's output, or a projection's): the output (f32, also under
 * autocast) and its row statistics (rstd; LayerNorm also the mean). Gemma's
 * x * (1 + w) reads a 16-bit input through its f32 conversion and (without
 * autocast) returns its output through a view of x's dtype, nodes of their
 * own; the [w] weight sums are not counted. */
static accel_dtype norm_fwd(ledger *l, double e, double rows, accel_dtype xdt) {
    l->bytes += f32_contig(e, xdt, true) + 4 * e + 4 * rows * (l->f->layer_norm ? 2 : 1);
    return ACCEL_F32;
}

/* Its backward from the output's gradient (already made by the consumer):
 * the input's gradient (written directly, or added where it has one); Gemma's
 * norm reads an f32 input as it is (the same), and a 16-bit one through its
 * f32 conversion, whose own gradient (f32) is converted into the input's
 * dtype. */
static void norm_bwd(ledger *l, double e, accel_dtype xdt, bool x_has_grad) {
    if (!l->f->gemma || xdt == ACCEL_F32) {
        l->bytes += gbuf(e, xdt, x_has_grad);
        return;
    }
    l->bytes += 4 * e + grad_copy(e, xdt, x_has_grad);
}

/* What StableLM's norm of its own per head (StableLmLayerNormPerHead,
 * src/nn/llama.c; its tp form in src/nn/tp_modules.c) costs over one norm
 * of e elements over `heads` heads (norm_fwd): each head's slice of x is a
 * strided view, made f32 and dense per head (an f32 x's copy too, unless
 * one head), and the heads' f32 outputs are concatenated (e). */
static void norm_heads_fwd(ledger *l, double e, accel_dtype xdt, double heads) {
    l->bytes += f32_contig(e, xdt, heads == 1) - f32_contig(e, xdt, true) + 4 * e;
}

/* Its backward over norm_bwd's: the concatenation's (each head's slice of
 * the output gradient made dense, then copied as its first gradient: 2 e
 * f32) and the slices' (the first makes x's gradient, zeros with its part
 * copied in, in x's dtype; the others add into their places). */
static void norm_heads_bwd(ledger *l, double e, accel_dtype xdt) { l->bytes += 2 * 4 * e + e * esz(xdt); }

/* RoPE of a head-split projection x [B, h, T, D] of dtype dt (a transposed
 * view, read in place) with e = n*h*D elements (src/nn/llama.c rope()):
 * accel_rope's cos/sin tables [T, R/2] and its output, written in dt. With a
 * partial rotary dim R < D (Phi-3's partial_rotary_factor) it rotates the
 * first R dims only, yet costs more than a whole rotation: that slice made
 * contiguous, rotated (an output of e R/D), then concatenated with the
 * unrotated rest into a new output of all e. */
static void rope_fwd(ledger *l, double e, accel_dtype dt) {
    const dims *d = l->d;
    double er = e * d->R / d->D;
    l->bytes += 2 * 4 * d->T * d->R / 2 + er * esz(dt);
    if (d->R < d->D) l->bytes += er * esz(dt) + e * esz(dt);
}

/* Its backward: the rotated part's input gradient in its dtype. With R < D
 * also: the concatenation's (each part's slice of the output gradient made
 * dense, then copied as that part's first gradient: 2 e), the contiguous
 * copy's (its gradient taken by the slice view), and the two slices' (the
 * first makes x's gradient, zeros with its part copied in; the second adds
 * into its place: e). */
static void rope_bwd(ledger *l, double e, accel_dtype dt) {
    const dims *d = l->d;
    double er = e * d->R / d->D;
    l->bytes += gbuf_native(er, dt, false);
    if (d->R < d->D) l->bytes += (2 * e + e) * esz(dt);
}

/* The backward of split_heads (reshape then transpose of a projection output
 * of dtype dt into `heads` heads): the transpose's dense gradient (none with
 * one head: [B, 1, T, D] transposed is dense, as a tp rank's one head; none
 * either where the rope backward wrote it in the projection's layout,
 * in_layout: q and k under a whole-dim rotation), which the reshape's and
 * then the projection's output take over. */
static void split_heads_bwd(ledger *l, double e, accel_dtype dt, double heads, bool in_layout) {
    l->bytes += dense(e, dt, heads == 1 || in_layout);
}

/* accel_add forward of f32 x and y of dtype ydt (contiguous, x's shape: the
 * residual stream's [B, T, C], T / tp under sequence parallelism): the
 * f32 output; a bf16/f16 y is read as it is (the CPU's
 * accel__binary_lowp_operand), any other y made f32. */
static void add_fwd(ledger *l, accel_dtype ydt) {
    double e = l->d->ns * l->d->C;
    bool lowp = ydt == ACCEL_BF16 || ydt == ACCEL_F16;
    l->bytes += 4 * e + (lowp ? 0 : f32_contig(e, ydt, true));
}

/* ------------------------------------------------------------ tensor parallelism
 * One rank of accel_llama_parallelize's plan (src/nn/tp_modules.c): the
 * column-parallel Linears (q/k/v, gate/up, lm_head) and everything between
 * them and the row-parallel ones (o, down) hold this rank's heads and
 * columns (the dims' Q, K, I, V, H, Hkv); the regions' boundaries hold whole
 * [B, T, C] tensors; the norms and residual adds outside them hold the
 * stream, whole under plain tp, T / tp positions under sequence parallelism
 * (dims.ns). Nothing here without tp. */

/* Into a column-parallel region from x (f32, the stream's: a norm's output,
 * OLMo 2's residual sum): a view of it under plain tp (accel_tp_copy_to_region),
 * under sequence parallelism the gathered [B, T, C] (accel_tp_gather_seq),
 * which the region's Linears save. The Linears that read it share the one
 * entry (q/k/v, gate/up). */
static void enter_fwd(ledger *l) {
    if (l->d->tp && l->d->ns < l->d->n) l->bytes += 4 * l->d->n * l->d->C;
}

/* Its backward: the Linears' gradient of the region's input is a new
 * whole [B, T, C] (counted by them: the input never has one before), and
 * the collective then writes x's, the stream's, unless x has one already
 * (its sum is staged and freed). */
static void enter_bwd(ledger *l, bool x_has_grad) {
    if (l->d->tp && !x_has_grad) l->bytes += 4 * l->d->ns * l->d->C;
}

/* OLMo 2's q/k norm over every head under tp (TensorParallelRMSNorm,
 * src/nn/tp_modules.c), of this rank's e = rows * w elements of dtype xdt,
 * composed of ops: x made f32 (an alias when it is), x * x, its row sums,
 * their all-reduce, scale, + eps, rsqrt ([rows] each), x * rstd, * the
 * weight's rows (f32 out). */
static accel_dtype tp_norm_fwd(ledger *l, double e, double rows, accel_dtype xdt) {
    l->bytes += f32_contig(e, xdt, true) + 3 * 4 * e + 5 * 4 * rows;
    return ACCEL_F32;
}

/* Its backward: the f32 alias's copy (f32 autocast returns y as x's dtype),
 * each product's two gradient products and the first gradients' copies
 * (10 f32 e: the weight's, rstd's and x * x's from their products, x's
 * from both of its uses, the row sums' expanded), the [rows] chain, and x's
 * gradient (the alias's copy, or the cast back to its dtype). */
static void tp_norm_bwd(ledger *l, double e, double rows, accel_dtype xdt) {
    l->bytes += (l->k->ac == ACCEL_F32 ? 4 * e : 0) + 10 * 4 * e + 20 * 4 * rows + gbuf(e, xdt, false);
}

/* The replicated key/value rows (fewer key/value heads than tp ranks):
 * k_proj's and v_proj's whole weights (Phi-3's whole qkv_proj) stay on every
 * rank, and each step takes this rank's rows of them through
 * accel_tp_copy_to_region: slices of the weight, which a projection reads
 * as a step operand (made dense in the autocast dtype, not a prepared
 * form); Phi-3's three parts concatenated into one [Q + 2 K, C] f32 weight.
 * Backward: the rows' weight gradient in the step (f32), Phi-3's concat
 * handing each part its slice (dense, then copied as the part's first), and
 * the slices' backward: the first makes the region view's gradient (zeros
 * of the whole weight, its part copied in), the others add into their
 * places (the whole weight's gradient then takes the sum, staged). */
static void replica_fwd(ledger *l) {
    const dims *d = l->d;
    if (d->Kw == 0) return;
    if (l->f->fused_qkv)
        l->bytes += 4 * (d->Q + 2 * d->K) * d->C + mm_operand(l->k, (d->Q + 2 * d->K) * d->C, ACCEL_F32, true);
    else
        l->bytes += 2 * mm_operand(l->k, d->K * d->C, ACCEL_F32, false);
}

static void replica_bwd(ledger *l) {
    const dims *d = l->d;
    if (d->Kw == 0) return;
    if (l->f->fused_qkv) {
        double r = (d->Q + 2 * d->K) * d->C, whole = (d->Qw + 2 * d->Kw) * d->C;
        l->bytes += 4 * r + 2 * 4 * r + 4 * whole;
    } else {
        l->bytes += 2 * (4 * d->K * d->C + 2 * 4 * d->Kw * d->C);
    }
}

/* A row-parallel projection (o_proj, down_proj, GPT-2's c_proj) of x [n, in]
 * (this rank's part) to the stream's C: one process's proj_fwd, or the
 * rank's partial sum [B, T, C] (no bias), then out of the region the sum
 * (accel_tp_reduce_from_region) or this rank's positions of it
 * (accel_tp_scatter_seq), a new tensor in its dtype, and the bias (whole)
 * added after. Returns the branch's dtype. */
static accel_dtype row_fwd(ledger *l, double in, accel_dtype xdt, bool bias) {
    if (!l->d->tp) return proj_fwd(l, in, l->d->C, xdt, false);
    accel_dtype odt = linear_fwd_of(l, in, l->d->C, xdt, false, l->f->gpt2);
    l->bytes += l->d->ns * l->d->C * esz(odt);
    return l->f->gpt2 || bias ? binary_fwd(l, l->d->ns * l->d->C, odt, ACCEL_F32) : odt;
}

/* Its backward from the branch's gradient: the bias add's copy into the
 * exit's output, the exit's (the reduce's pass-back copy, the scatter's
 * gather) into the partial sum: whole, in its dtype; then the Linear's. The
 * add's gradient is taken over where the exit's output is f32, else copied
 * in the exit's dtype. */
static void row_bwd(ledger *l, double in, accel_dtype odt, accel_dtype xdt, bool bias) {
    if (!l->d->tp) {
        proj_bwd(l, in, l->d->C, odt, xdt, false, bias);
        return;
    }
    accel_dtype mm = mm_dtype(l->k);
    if ((l->f->gpt2 || bias) && mm != ACCEL_F32) l->bytes += grad_copy(l->d->ns * l->d->C, mm, false);
    l->bytes += l->d->n * l->d->C * esz(mm);
    linear_bwd(l, in, l->d->C, mm, xdt, false, l->f->gpt2);
}

/* The C of one of accel_matmul's GEMM calls, of c elements (one matrix of
 * its batch), for gemm_call: its bf16/f16 result (s) is written by the GEMM
 * (src/ops/matmul.c), through the call's f32 C where oneDNN does not write
 * it; none for an f32 result. */
static double matmul_c(double c, accel_dtype s) { return s == ACCEL_F32 ? 0 : c; }

/* ------------------------------------------------------------ context parallelism
 * accel_cp_attention (src/ops/attention_cp.c) on this rank's 2c = T / cp
 * positions (dims.T; dims.n its tokens): the rest of the layer is one
 * process's on those tokens. Its collectives' scratch (the gathered blocks,
 * the key prefixes and bands, the all-to-all's send and receive blocks) is
 * given back before each op returns (scratch(), as a GEMM call's own): the
 * largest is the all-gather backward's of the chunk that sees every key
 * (rank 0's second; the other ranks' see fewer). */

/* All-gather (allgather_sdpa): q, k [B, H(kv), 2c, D] dense (RoPE's), v a
 * transposed view. Kept: the output in s (the kernel writes each chunk's
 * rows in place) and each chunk's log-sum-exp [B, H, c] f32. Forward
 * scratch: K and V made dense in s, gathered into blocks of the whole
 * sequence, both chunks' key prefixes (for global chunks g = r and
 * 2cp-1-r: (2cp+1) c keys), their query rows. Backward: f32 dq, dk, dv,
 * each copied as its input's first gradient (accel_grad_accumulate); scratch: the gathered K and V again,
 * the whole sequence's f32 dK and dV blocks, and for the chunk seeing all T
 * keys its prefixes, their f32 gradients, its rows of the output gradient,
 * q and dq, and the adds of the prefixes' gradients into the blocks, chunk
 * by chunk (each an f32 sum, copied into its block). */
static void cp_allgather_step(ledger *fwd, ledger *bwd, accel_dtype q, accel_dtype kk, accel_dtype v) {
    const dims *d = fwd->d;
    accel_dtype s = mm_dtype(fwd->k);
    double eQ = d->n * d->Q, eK = d->n * d->K, c = d->T / 2, cp = d->cp;
    double EK = d->B * d->K * d->Tg, EQc = d->B * d->Q * c; /* K (or V) of the whole sequence; one chunk's q */
    double dense_kv = contig_as(eK, kk, s, true) + contig_as(eK, v, s, d->Hkv == 1);
    fwd->bytes += eQ * esz(s) + 4 * d->B * d->H * 2 * c;
    scratch(fwd, dense_kv + 2 * EK * esz(s) + 2 * EK * (2 * cp + 1) / (2 * cp) * esz(s) + 2 * EQc * esz(s));
    bwd->bytes += 4 * (eQ + 2 * eK) + grad_copy(eQ, q, false) + grad_copy(eK, kk, false) + grad_copy(eK, v, false);
    scratch(bwd, dense_kv + 2 * EK * esz(s) + 2 * 4 * EK + 2 * EK * esz(s) + 2 * 4 * EK + EQc * (2 * esz(s) + 4) +
                     2 * 4 * EK);
}

/* All-to-all (Ulysses, alltoall_attention): with fewer key/value heads than
 * cp divides, k and v repeated to H heads first (the expanded views'
 * reshapes copy). q, k, v each exchanged into this rank's head group over the
 * whole sequence [B, H/cp, T, D] (as many elements as its chunks), attended
 * by blocks of rows over the band of keys each sees (band_sdpa: the
 * output, each block's log-sum-exp [B, H/cp, rows] f32; scratch: the
 * band's keys and values, the block's query rows), and the output exchanged
 * back.
 * Backward: each exchange's gradient on the other side and the input's
 * first gradient's copy; the band's f32 dq, dk, dv and their copies. */
static void cp_alltoall_step(ledger *fwd, ledger *bwd, accel_dtype q, accel_dtype kk, accel_dtype v) {
    const dims *d = fwd->d;
    accel_dtype s = mm_dtype(fwd->k);
    double eQ = d->n * d->Q, eK = d->n * d->K, T = d->Tg, B = d->B, h = d->H / d->cp, D = d->D;
    bool rep = fmod(d->Hkv, d->cp) != 0;
    double eKx = rep ? eQ : eK, hkv = rep ? h : d->Hkv / d->cp; /* k, v as exchanged */
    if (rep) fwd->bytes += eQ * esz(kk) + eQ * esz(v);
    /* the exchanges' outputs, their send and receive blocks (the largest, q's or the output's) */
    fwd->bytes += eQ * esz(q) + eKx * (esz(kk) + esz(v));
    /* band_sdpa's blocks of query rows (block_rows: 64-row multiples, at most 16 blocks) */
    double rows = ceil(T / 16), lse = 0, band = 0;
    rows = rows > 64 ? ceil(rows / 64) * 64 : 64;
    for (double r0 = 0; r0 < T; r0 += rows) {
        double nq = fmin(rows, T - r0), Tk = r0 + nq;
        lse += 4 * B * h * nq;
        band = fmax(band, 2 * B * hkv * Tk * D * esz(s) + B * h * nq * D * esz(s));
    }
    fwd->bytes += eQ * esz(s) + lse + eQ * esz(s); /* the band's output, the exchanged-back output */
    scratch(fwd, fmax(2 * eQ * fmax(esz(q), esz(s)), band));
    /* backward: the output's exchange, the band's f32 gradients, the input exchanges */
    bwd->bytes += 2 * eQ * esz(s);
    bwd->bytes += 4 * (eQ + 2 * eKx) + eQ * esz(q) + eKx * (esz(kk) + esz(v));
    bwd->bytes += 2 * eQ * esz(q) + 2 * eKx * (esz(kk) + esz(v));
    scratch(bwd, fmax(2 * eQ * fmax(esz(q), esz(s)), 2 * B * hkv * T * D * (esz(s) + 4) + B * h * rows * D * (2 * esz(s) + 4)));
    if (rep) bwd->bytes += 2 * (4 * eK + grad_copy(eK, kk, false)); /* the repeats summed back */
}

/* accel__scores_attention's body (src/ops/attention_masked.c) past its
 * mask's conversion, on q [B, Hkv, G T, D] (dtype q), k and v [B, Hkv, S,
 * D] (k read through its transposed view; v made dense in s unless
 * v_dense) in the mm dtype s: Q K^T, scale, cap, + mask, softmax, dropout
 * (drop), P V. Forward into fwd, backward into bwd. q is dense, and k
 * takes its gradient as it is, but for BERT's f32 step (`bert_views`: q, k
 * and v the heads' transposed views of the projections' outputs, the
 * autocast off): there q is made dense for its GEMM, k's dense gradient is
 * copied into its view, and the mask add's scores take a copy of its
 * gradient. Those two copies are measured, not derived: without them the
 * checkpointed step's estimate fell from -0.5% to -4.3% of the measured
 * peak (tests/test_training_memory.c bert; the un-checkpointed one is
 * +5.2% with them, +0.4% without: which copy the runtime makes when is
 * not modelled finer than this). */
static void scores_step(ledger *fwd, ledger *bwd, accel_dtype q, accel_dtype kk, accel_dtype v, bool v_dense,
                        bool bert_views, bool drop) {
    const dims *d = fwd->d;
    const step_kind *k = fwd->k;
    double eQ = d->n * d->Q, eK = d->n * d->K, E = d->B * d->H * d->T * d->T;
    accel_dtype s = mm_dtype(k);
    /* scores = q k^T: the output in s, the operands in s (k^T a transposed view) */
    fwd->bytes += E * esz(s) + mm_operand(k, eQ, q, !bert_views) + mm_operand(k, eK, kk, false);
    gemm_call(fwd, eQ + eK, matmul_c(E / (d->B * d->Hkv), s), 0); /* a GEMM per batch and key/value head */
    int n_unary = 1 + (fwd->f->cap > 0 ? 3 : 0); /* the scale; cap * tanh(x / cap) */
    for (int i = 0; i < n_unary; i++) unary_fwd(fwd, E, s);
    /* + mask (in q's dtype, broadcast over B, Hkv: its f32 copy is small): the
     * output in their promotion, the scores made f32, an f32 result copied
     * out where the output is not f32 */
    accel_dtype sc = q == ACCEL_F32 ? ACCEL_F32 : s;
    fwd->bytes += E * esz(sc) + f32_contig(E, s, true) + (sc == ACCEL_F32 ? 0 : 4 * E);
    fwd->bytes += 4 * E + f32_contig(E, sc, true);       /* softmax: f32 (also under autocast) */
    if (drop) dropout_fwd(fwd, E, ACCEL_F32);
    /* P V: the output in s, P in s, v made dense in s */
    fwd->bytes += eQ * esz(s) + mm_operand(k, E, ACCEL_F32, true) + mm_operand(k, eK, v, v_dense);
    gemm_call(fwd, E + eK, matmul_c(eQ / (d->B * d->Hkv), s), 0);
    /* backward: the reshape of P V's output passes its gradient on; P V's:
     * the output gradient read, P's and v's gradients */
    bwd->bytes += mm_grad(k, eQ, s) + gbuf(E, ACCEL_F32, false) + gbuf(eK, v, false);
    gemm_call(bwd, eQ + eK, 0, 0);
    if (drop) dropout_bwd(bwd, E, ACCEL_F32);
    bwd->bytes += f32_contig(E, ACCEL_F32, true) + gbuf(E, sc, false); /* softmax */
    /* add: the scores take its gradient (a copy if its dtype differs; BERT's: a copy) */
    bwd->bytes += bert_views ? grad_copy(E, s, false) : add_bwd(E, sc == s ? ACCEL_F32 : s);
    for (int i = 0; i < n_unary; i++) unary_bwd(bwd, E, s);
    /* Q K^T: the output gradient read, q's (its reshape view and the
     * contiguous node pass it on into q) and k^T's (its dense transpose,
     * taken by k) */
    bwd->bytes += mm_grad(k, E, s) + gbuf(eQ, q, false) + gbuf(eK, kk, false) + dense(eK, kk, false) +
                  grad_copy(eK, kk, !bert_views);
    gemm_call(bwd, E + eK, 0, 0);
}

/* Whether the step's explicit scores compute in f32 (accel__scores_attention's
 * upcast): a bf16/f16 autocast, in every family but Gemma2's (transformers'
 * eager attention: src/nn/llama.c sdpa_numerics). */
static bool upcasts(const ledger *l) { return l->k->ac != ACCEL_F32 && !l->f->eager_scores; }

/* An input of e elements of dtype dt rounded to the autocast dtype s where
 * it is not in s, then made f32 (accel__scores_attention's rounded_f32); its
 * backward: each conversion's input's first gradient, a copy in its dtype. */
static double rounded_f32(double e, accel_dtype dt, accel_dtype s) { return (dt == s ? 0 : e * esz(s)) + 4 * e; }
static double rounded_f32_bwd(double e, accel_dtype dt, accel_dtype s) {
    return grad_copy(e, s, false) + (dt == s ? 0 : grad_copy(e, dt, false));
}

/* accel__scores_attention where it upcasts (upcasts()): q [B, Hkv, G T, D],
 * k, v [B, Hkv, S, D] of dtypes q, kk, v rounded to the autocast dtype s and
 * made f32 (dense), scores_step in f32 (the autocast off: no GEMM widens or
 * rounds), the output rounded to s; backward: that rounding's (the f32
 * output's gradient, a copy), scores_step's, the inputs' conversions'. */
static void upcast_scores_step(ledger *fwd, ledger *bwd, accel_dtype q, accel_dtype kk, accel_dtype v) {
    const dims *d = fwd->d;
    double eQ = d->n * d->Q, eK = d->n * d->K;
    accel_dtype s = mm_dtype(fwd->k);
    fwd->bytes += rounded_f32(eQ, q, s) + rounded_f32(eK, kk, s) + rounded_f32(eK, v, s);
    step_kind k32 = *fwd->k;
    k32.ac = ACCEL_F32, k32.native = k32.widens_per_call = false;
    ledger f32f = {&k32, d, fwd->f, 0, 0}, f32b = f32f;
    scores_step(&f32f, &f32b, ACCEL_F32, ACCEL_F32, ACCEL_F32, true, false, fwd->f->attn_pdrop > 0);
    scratch(fwd, f32f.top);
    fwd->bytes += f32f.bytes + eQ * esz(s);
    bwd->bytes += grad_copy(eQ, ACCEL_F32, false);
    scratch(bwd, f32b.top);
    bwd->bytes += f32b.bytes;
    bwd->bytes += rounded_f32_bwd(eQ, q, s) + rounded_f32_bwd(eK, kk, s) + rounded_f32_bwd(eK, v, s);
}

/* The attention of q [B, H, T, D] (dtype q, dense: RoPE's output, or GPT-2's
 * transposed view when q_view), k, v (k likewise; v a transposed view), to
 * its output [B, H, T, D] in the mm dtype s: accel__sdpa_heads_last (its
 * output [B, T, H, D], the CPU kernels reading the views and writing the
 * inputs' gradients in their layouts), or where a window
 * bites, scores are soft-capped or GPT-2's attention dropout acts
 * (`explicit_`), accel__masked_attention's explicit scores
 * (src/ops/attention_masked.c): mask, Q K^T, scale, cap, add, softmax,
 * dropout, P V. Forward into fwd, backward into bwd (the gradients of q, k
 * and v as their views hold them). */
static void attention_step(ledger *fwd, ledger *bwd, accel_dtype q, accel_dtype kk, accel_dtype v, bool q_view,
                           bool explicit_) {
    const dims *d = fwd->d;
    const step_kind *k = fwd->k;
    double eQ = d->n * d->Q, eK = d->n * d->K;
    accel_dtype s = mm_dtype(k);
    if (d->cp > 1) { /* resolve refused explicit scores under cp */
        (d->a2a ? cp_alltoall_step : cp_allgather_step)(fwd, bwd, q, kk, v);
        return;
    }
    if (!explicit_) {
        /* the output (its kernel writes s itself); q, k and v read where
         * they are, each copied only when not in s; each query row's f32
         * log-sum-exp [B, H, T] kept */
        fwd->bytes += eQ * esz(s) + contig_as(eQ, q, s, true) + contig_as(eK, kk, s, true) +
                      contig_as(eK, v, s, true) + 4 * d->B * d->H * d->T;
        /* backward: the output gradient as it is, the gradients of q, k, v in their dtype */
        bwd->bytes += dense(eQ, s, true) + gbuf_native(eQ, q, false) + gbuf_native(eK, kk, false) +
                      gbuf_native(eK, v, false);
        return;
    }
    double T_S = d->T * d->T;
    bool up = upcasts(fwd);
    /* forward: q made contiguous (a copy of GPT-2's view; an alias node of
     * RoPE's output); the mask [T, S] in the arena, as a tensor, in the
     * scores' dtype (q's, or f32 where they upcast), shared by a kv head's G
     * query heads through a view */
    fwd->bytes += dense(eQ, q, !q_view || d->H == 1) + 4 * T_S + 4 * T_S;
    if (up) {
        upcast_scores_step(fwd, bwd, q, kk, v);
        return;
    }
    fwd->bytes += q == ACCEL_F32 ? 0 : T_S * esz(q); /* the mask in q's dtype: one [T, S] too */
    scores_step(fwd, bwd, q, kk, v, d->Hkv == 1, false, fwd->f->attn_pdrop > 0);
}

/* The dense MLP of n2 (the norm's output): its forward into fwd, its
 * backward into bwd (down_proj's first). Returns the branch's dtype. */
static accel_dtype mlp_step(ledger *fwd, ledger *bwd, accel_dtype n2) {
    const dims *d = fwd->d;
    const fam *f = fwd->f;
    double eI = d->n * d->I;
    accel_dtype g = ACCEL_F32, u = ACCEL_F32, h; /* the MLP's hidden [n, I] */
    if (f->gpt2 || f->gelu_mlp) { /* c_fc / fc1, gelu_new */
        g = proj_fwd(fwd, d->C, d->I, n2, false);
        h = unary_fwd(fwd, eI, g);
    } else if (f->fused_gate_up) { /* gate_up_proj [n, 2I], each half made contiguous, SwiGLU */
        g = u = proj_fwd(fwd, d->C, 2 * d->I, n2, false);
        fwd->bytes += 2 * dense(eI, g, false) + eI * esz(g);
        h = g;
    } else {
        g = proj_fwd(fwd, d->C, d->I, n2, false);
        u = proj_fwd(fwd, d->C, d->I, n2, true); /* gate's operand */
        if (f->gemma) h = binary_fwd(fwd, eI, unary_fwd(fwd, eI, g), u); /* gelu(gate) * up */
        else fwd->bytes += eI * esz(g), h = g; /* accel_swiglu: one fused output, its inputs kept as they are */
    }
    accel_dtype m = row_fwd(fwd, d->I, h, f->mlp_bias);
    row_bwd(bwd, d->I, m, h, f->mlp_bias); /* down_proj / c_proj / fc2 */
    if (f->gpt2 || f->gelu_mlp) {
        unary_bwd(bwd, eI, g);
        proj_bwd(bwd, d->C, d->I, g, n2, false, f->mlp_bias && !f->gpt2);
    } else if (f->fused_gate_up) {
        /* SwiGLU's output gradient and its inputs'; each contiguous half's
         * gradient taken by its slice view, whose backward makes gate_up's
         * output's gradient (the first: zeros of [n, 2I], its half copied in;
         * the second adds into its place) */
        bwd->bytes += dense(eI, h, true) + 2 * gbuf_native(eI, g, false) + grad_copy(2 * eI, g, false);
        proj_bwd(bwd, d->C, 2 * d->I, g, n2, false, f->mlp_bias);
    } else {
        if (f->gemma) {
            mul_bwd(bwd, eI, g, u, h);
            unary_bwd(bwd, eI, g);
        } else {
            bwd->bytes += dense(eI, h, true) + gbuf_native(eI, g, false) + gbuf_native(eI, u, false); /* swiglu */
        }
        proj_bwd(bwd, d->C, d->I, u, n2, false, f->mlp_bias); /* up_proj: the norm's output gets its gradient */
        proj_bwd(bwd, d->C, d->I, g, n2, true, f->mlp_bias);  /* gate_proj adds into it */
    }
    return m;
}

/* ------------------------------------------------------------ mixtures of experts
 * A sparse layer's block (src/nn/moe.c accel__moe_forward) of n tokens, E
 * experts, top k. The routing is data: each expert runs on the rows of the
 * tokens that chose it. The estimate takes the balanced routing (each expert
 * n k / E rows, as the meta device's shapes). Every step tensor of an expert
 * is linear in its rows and the arena frees none before the step's end, so
 * the block's bytes are those of its n k rows however they are routed: an
 * imbalance moves bytes between experts, not in or out of the step. What it
 * changes is each GEMM call's own scratch (the busiest expert's calls are the
 * largest) and, on a caching allocator that frees as it goes, which tensors
 * are alive together; an expert no token chose runs nothing. Not counted: the
 * load-balancing loss's statistics (output_router_logits: an [n, E] softmax
 * and counts a layer), and the tensor headers, of which the block has more
 * than a dense MLP (about 30 an expert, some 7 KB a layer per expert). */

/* Host arrays the routing takes from the step arena (64-byte aligned). */
static double host(double b) { return ceil(b / 64) * 64; }

/* accel_mul of two dense e-element operands of dtypes a and b, one shape:
 * the output in their promotion; an f32 output reads a bf16/f16 operand
 * beside an f32 one as it is (the CPU's accel__binary_lowp_operand), else
 * the operands are made f32 and a low-precision result computed in f32. */
static double mul_same(double e, accel_dtype a, accel_dtype b) {
    accel_dtype o = a == ACCEL_F32 || b == ACCEL_F32 ? ACCEL_F32 : a;
    if (o == ACCEL_F32) return 4 * e;
    return e * esz(o) + f32_contig(e, a, true) + f32_contig(e, b, true) + 4 * e;
}

/* accel_sum of e elements of dtype dt into `rows` sums: the output in dt,
 * a low-precision input made f32 and summed into f32 rows. */
static double sum_rows(double e, double rows, accel_dtype dt) {
    return rows * esz(dt) + (dt == ACCEL_F32 ? 0 : 4 * e + 4 * rows);
}

/* One expert on its r = d->n rows (the ledger's dims): the rows of h (f32)
 * gathered, the SwiGLU MLP (w1/gate_proj and w3/up_proj reading one operand,
 * w2/down_proj). Its backward: the MLP's, the gather's (written into h's
 * gradient: the caller's); its output's gradient is the caller's slice of
 * the concatenation's. Returns the output's dtype. */
static accel_dtype expert_step(ledger *fwd, ledger *bwd) {
    const dims *d = fwd->d;
    double r = d->n, eI = r * d->I;
    fwd->bytes += 4 * r * d->C; /* the gathered rows */
    accel_dtype g = linear_fwd(fwd, d->C, d->I, ACCEL_F32);
    accel_dtype u = linear_fwd_of(fwd, d->C, d->I, ACCEL_F32, true, false);
    fwd->bytes += eI * esz(g); /* accel_swiglu */
    accel_dtype y = linear_fwd(fwd, d->I, d->C, g);
    proj_bwd(bwd, d->I, d->C, y, g, false, false); /* w2 */
    bwd->bytes += gbuf_native(eI, g, false) + gbuf_native(eI, u, false); /* swiglu */
    proj_bwd(bwd, d->C, d->I, u, ACCEL_F32, false, false); /* w3: the gathered rows get their gradient */
    proj_bwd(bwd, d->C, d->I, g, ACCEL_F32, true, false);  /* w1 adds into it */
    return y;
}

/* Qwen2-MoE's shared expert beside the routed ones, on all n tokens of h
 * (f32): a dense MLP of intermediate size Is, sigmoid(shared_expert_gate(h))
 * [n, 1] times its output, added to the routed sum (f32). The broadcast
 * product and its backward are counted as [n, C] operands (their [n, 1]
 * side is C times smaller), and the MLP's input gradient as a new one
 * (h's exists: the gathers' and the router's): both over-count a little;
 * the whole step within 2% of its arena peak (tests/test_training_memory.c). */
static void shared_step(ledger *fwd, ledger *bwd) {
    const dims *d = fwd->d;
    double n = d->n, eC = n * d->C;
    dims ds = *d;
    ds.I = d->Is;
    ledger sf = {fwd->k, &ds, fwd->f, 0, 0}, sb = sf;
    accel_dtype y = mlp_step(&sf, &sb, ACCEL_F32);
    scratch(fwd, sf.top);
    fwd->bytes += sf.bytes;
    accel_dtype lg = linear_fwd(fwd, d->C, 1, ACCEL_F32); /* the gate's logit [n, 1] */
    accel_dtype sg = unary_fwd(fwd, n, lg);              /* its sigmoid */
    accel_dtype p = binary_fwd(fwd, eC, sg, y);          /* times the shared expert's output */
    binary_fwd(fwd, eC, ACCEL_F32, p);                   /* plus the routed sum */
    /* backward: the sum passes its gradient on (the product's a copy in its dtype) */
    bwd->bytes += add_bwd(eC, p);
    mul_bwd(bwd, eC, sg, y, p);
    unary_bwd(bwd, n, sg);
    proj_bwd(bwd, d->C, 1, lg, ACCEL_F32, true, false); /* the gate adds into h's gradient */
    scratch(bwd, sb.top);
    bwd->bytes += sb.bytes;
}

/* The block on the layer's n tokens (the norm's output, f32): forward into
 * fwd, backward into bwd. Returns the branch's dtype (f32: the sum of the
 * gathered rows). */
static accel_dtype moe_step(ledger *fwd, ledger *bwd) {
    const dims *d = fwd->d;
    const fam *f = fwd->f;
    double n = d->n, C = d->C, E = d->E, k = d->topk, nE = n * E, nk = n * k, eC = n * C;
    /* Mixtral keeps the routing weights f32, Qwen rounds them to the logits' dtype (and back to f32) */
    accel_dtype s = mm_dtype(fwd->k), w = f->moe_f32_weights ? ACCEL_F32 : s;
    if (f->jitter) fwd->bytes += 4 * eC + 4 * eC; /* the noise, h times it */
    accel_dtype lg = linear_fwd(fwd, C, E, ACCEL_F32); /* the router's logits */
    fwd->bytes += contig_as(nE, lg, ACCEL_F32, true) + 4 * nE; /* made f32, softmax */
    /* the host's choices and probabilities, the routing (moe.c route: tokens, first, slot, chosen, pos,
     * the cursors); four index arrays uploaded (chosen, pos, tokens, slots), the outputs' pointers */
    fwd->bytes += host(8 * nk) + host(4 * nE) + 4 * host(8 * nk) + host(8 * (E + 1)) + host(8 * E) + 4 * 8 * nk +
                  host(8 * E);
    fwd->bytes += 4 * nk; /* the chosen probabilities [k, n] */
    if (f->renorm) fwd->bytes += (k - 1) * 4 * n + 4 * nk; /* their sum over k, the division */
    if (w != ACCEL_F32) fwd->bytes += nk * esz(w) + 4 * nk; /* Qwen's rounding, widened back */
    fwd->bytes += 4 * nk;                                   /* each routed row's weight [n k, 1] */
    /* the experts, one after another, each on its n k / E rows */
    dims de = *d;
    de.n = nk / E, de.I = d->Ie;
    ledger ef = {fwd->k, &de, f, 0, 0}, eb = ef;
    accel_dtype y = expert_step(&ef, &eb);
    scratch(fwd, (E - 1) * ef.bytes + ef.top);
    fwd->bytes += E * ef.bytes;
    double eY = nk * C;
    fwd->bytes += eY * esz(y); /* the concatenation [n k, C] */
    /* times the f32 weights (a 16-bit row widened first), in torch's product dtype: f32 beside
     * Mixtral's weights, the rows' for Qwen's (rounded from the f32 product) */
    accel_dtype o = w == y ? y : ACCEL_F32;
    fwd->bytes += f32_contig(eY, y, true) + 4 * eY + (o == ACCEL_F32 ? 0 : eY * esz(o));
    /* each token's k rows gathered (made f32), summed */
    fwd->bytes += k * eC * esz(o) + (o == ACCEL_F32 ? 0 : k * 4 * eC) + (k - 1) * 4 * eC;

    /* backward: the sums pass the gradient on (a low-precision gather's cast back); the gathers' into a
     * zeroed [n k, C] (f32: one for all k; 16-bit: each gather's f32 scratch, the later ones added into
     * the first's through f32 copies: 7 bytes a routed element each, measured) */
    bwd->bytes += o == ACCEL_F32 ? gbuf(eY, o, false) : k * eC * esz(o) + gbuf(eY, o, false) + (k - 1) * 7 * eY;
    /* the weighting: a rounded product's gradient widened; g * wrows (into Y, then its dtype), g * Y
     * summed over C (into the weights) */
    bwd->bytes += (o == ACCEL_F32 ? 0 : 4 * eY) + 4 * eY + grad_copy(eY, y, false);
    bwd->bytes += mul_same(eY, ACCEL_F32, y) + sum_rows(eY, nk, ACCEL_F32) + grad_copy(nk, ACCEL_F32, false);
    bwd->bytes += eY * esz(y); /* the concatenation's slices copied as each output's gradient */
    scratch(bwd, (E - 1) * eb.bytes + eb.top);
    bwd->bytes += E * eb.bytes;
    bwd->bytes += 4 * eC; /* h's gradient (the gathers') */
    bwd->bytes += gbuf(nk, ACCEL_F32, false); /* the row weights' gather */
    if (w != ACCEL_F32) bwd->bytes += nk * esz(w) + 4 * nk; /* Qwen's rounding's two casts */
    if (f->renorm) /* g / b, g * out / b and its negation, summed over k; each sum slice's zeroed [k, n] */
        bwd->bytes += 3 * 4 * nk + sum_rows(nk, n, ACCEL_F32) + 4 * n + (k - 1) * (2 * 4 * nk);
    bwd->bytes += 4 * nE + 4 * nk; /* the chosen probabilities' gather into a zeroed [n E]; their first copy */
    bwd->bytes += 4 * nE + (lg == ACCEL_F32 ? 0 : nE * esz(lg)); /* softmax; the cast's into the logits */
    proj_bwd(bwd, C, E, lg, ACCEL_F32, true, false); /* the router adds into h's gradient */
    if (f->jitter) bwd->bytes += 4 * eC + 4 * eC; /* g * noise, copied into the norm's output's */
    if (d->Is > 0) shared_step(fwd, bwd);
    return ACCEL_F32;
}

/* What one decoder layer's forward and backward allocate (ops in the order
 * of src/nn/llama.c layer_body; dtypes as they flow under autocast); a
 * sparse layer's MLP is its block of experts. */
static void layer_step(ledger *fwd, ledger *bwd, bool explicit_attention, bool sparse) {
    const dims *d = fwd->d;
    const fam *f = fwd->f;
    double n = d->n, eQ = n * d->Q, eK = n * d->K;
    double eC = d->ns * d->C; /* the stream's [B, T, C] (T / tp under sequence parallelism) */
    /* forward: the attention's input (its norm's output; OLMo 2: the layer's input) */
    accel_dtype n1 = f->norm_outputs ? ACCEL_F32 : norm_fwd(fwd, eC, d->ns, ACCEL_F32);
    enter_fwd(fwd);
    accel_dtype q, kk, v;
    if (f->gpt2) { /* c_attn [n, 3C], split: each part's reshape copies (a view across the columns) */
        q = kk = v = proj_fwd(fwd, d->C, d->Q + 2 * d->K, n1, false);
        fwd->bytes += dense(eQ, q, false) + 2 * dense(eK, q, false);
    } else if (f->fused_qkv) { /* qkv_proj [n, Q + 2K], each slice made contiguous */
        q = kk = v = proj_fwd(fwd, d->C, d->Q + 2 * d->K, n1, false);
        fwd->bytes += dense(eQ, q, false) + 2 * dense(eK, q, false);
    } else {
        q = proj_fwd(fwd, d->C, d->Q, n1, false); /* k and v read q's operand */
        kk = proj_fwd(fwd, d->C, d->K, n1, true);
        v = proj_fwd(fwd, d->C, d->K, n1, true);
    }
    replica_fwd(fwd);
    accel_dtype qr = q, kr = kk; /* what RoPE reads */
    if (f->qk_norm_full && d->tp) qr = tp_norm_fwd(fwd, eQ, n, q), kr = tp_norm_fwd(fwd, eK, n, kk);
    else if (f->qk_norm_full) qr = norm_fwd(fwd, eQ, n, q), kr = norm_fwd(fwd, eK, n, kk);
    if (f->qk_norm) qr = norm_fwd(fwd, eQ, n * d->H, q), kr = norm_fwd(fwd, eK, n * d->Hkv, kk);
    if (f->qk_norm_heads) norm_heads_fwd(fwd, eQ, q, d->H), norm_heads_fwd(fwd, eK, kk, d->Hkv);
    if (!f->gpt2) {
        rope_fwd(fwd, eQ, qr);
        rope_fwd(fwd, eK, kr);
    }
    accel_dtype s = mm_dtype(fwd->k);
    /* the attention's forward and backward, added in their places (the backward below) */
    ledger afwd = {fwd->k, d, f, 0, 0}, abwd = afwd;
    attention_step(&afwd, &abwd, f->gpt2 ? q : qr, f->gpt2 ? kk : kr, v, f->gpt2, explicit_attention);
    scratch(fwd, afwd.top);
    fwd->bytes += afwd.bytes;
    /* [B, H, T, D] -> [B, T, H*D]: the reshape of the transposed view copies
     * (one head: dense already; the fused attention's output is [B, T, H, D]) */
    bool fused = !explicit_attention && d->cp <= 1;
    fwd->bytes += dense(eQ, s, d->H == 1 || fused);
    accel_dtype o = row_fwd(fwd, d->Q, s, f->o_bias);
    bool drop = f->resid_pdrop > 0, attn_drop = drop && !f->mlp_drop_only;
    if (attn_drop) dropout_fwd(fwd, eC, o);
    accel_dtype a = o; /* the attention branch */
    if (f->sandwich || f->norm_outputs) a = norm_fwd(fwd, eC, d->ns, o);
    if (f->multipliers) a = unary_fwd(fwd, eC, a);
    /* Phi's parallel branches: the MLP reads the attention's input norm
     * through q/k/v's region entry (tp_modules.c shares it: one gather, one
     * gradient), the sum follows it; GPT-NeoX's MLP its own norm of x,
     * through its own entry */
    if (!f->parallel) add_fwd(fwd, a);
    bool own_norm = !f->parallel || f->norm2; /* the MLP's input norm and region entry */
    accel_dtype n2 = !own_norm ? n1 : f->norm_outputs ? ACCEL_F32 : norm_fwd(fwd, eC, d->ns, ACCEL_F32);
    if (own_norm) enter_fwd(fwd);
    /* the MLP (or the sparse block), its backward added in its place below */
    ledger mfwd = {fwd->k, d, f, 0, 0}, mbwd = mfwd;
    accel_dtype m = sparse ? moe_step(&mfwd, &mbwd) : mlp_step(&mfwd, &mbwd, n2);
    scratch(fwd, mfwd.top);
    fwd->bytes += mfwd.bytes;
    if (drop) dropout_fwd(fwd, eC, m);
    accel_dtype mb = m; /* the MLP branch */
    if (f->sandwich || f->norm_outputs) mb = norm_fwd(fwd, eC, d->ns, m);
    if (f->multipliers) mb = unary_fwd(fwd, eC, mb);
    accel_dtype sum = f->parallel ? binary_fwd(fwd, eC, a, mb) : mb; /* Phi: attn + mlp, then + x */
    add_fwd(fwd, sum);

    /* backward, in reverse. The output's gradient came from above. */
    bwd->bytes += add_bwd(eC, sum); /* add: h, the MLP branch (Phi: the branches' sum) */
    if (f->parallel) bwd->bytes += add_bwd(eC, a) + add_bwd(eC, mb); /* attn + mlp */
    if (f->multipliers) unary_bwd(bwd, eC, mb);
    if (f->sandwich || f->norm_outputs) norm_bwd(bwd, eC, m, false);
    if (drop) dropout_bwd(bwd, eC, m);
    scratch(bwd, mbwd.top);
    bwd->bytes += mbwd.bytes;
    if (own_norm) enter_bwd(bwd, f->norm_outputs);
    /* the MLP's input norm into h's gradient (Llama's adds: nothing new) */
    if (!f->norm_outputs && own_norm) norm_bwd(bwd, eC, ACCEL_F32, true);
    /* add: the layer input's, the attention branch's */
    if (!f->parallel) bwd->bytes += add_bwd(eC, a);
    if (f->multipliers) unary_bwd(bwd, eC, a);
    if (f->sandwich || f->norm_outputs) norm_bwd(bwd, eC, o, false);
    if (attn_drop) dropout_bwd(bwd, eC, o);
    row_bwd(bwd, d->Q, o, s, f->o_bias); /* o_proj / c_proj */
    /* the transpose's dense gradient (one head, or the fused attention's
     * [B, T, H, D] output: none; the reshape's view and the attention
     * output take theirs over) */
    bwd->bytes += dense(eQ, s, d->H == 1 || fused);
    scratch(bwd, abwd.top);
    bwd->bytes += abwd.bytes;
    if (!f->gpt2) {
        rope_bwd(bwd, eK, kr);
        rope_bwd(bwd, eQ, qr);
    }
    /* the gradient in the input's layout: src/ops/rope.c's, the fused
     * attention's of the views it reads (v; GPT-2's q and k too) */
    bool roped = !f->gpt2 && d->R == d->D;
    split_heads_bwd(bwd, eK, v, d->Hkv, fused);
    split_heads_bwd(bwd, eK, kk, d->Hkv, roped || (fused && f->gpt2));
    split_heads_bwd(bwd, eQ, q, d->H, roped || (fused && f->gpt2));
    if (f->qk_norm_full && d->tp) {
        tp_norm_bwd(bwd, eK, n, kk);
        tp_norm_bwd(bwd, eQ, n, q);
    } else if (f->qk_norm || f->qk_norm_full) { /* each norm's input gets its own gradient, taken on */
        norm_bwd(bwd, eK, kk, false);
        norm_bwd(bwd, eQ, q, false);
    }
    if (f->qk_norm_heads) norm_heads_bwd(bwd, eK, kk), norm_heads_bwd(bwd, eQ, q);
    if (f->gpt2 || f->fused_qkv) {
        /* q, k and v's slice views' backward: the first makes the projection
         * output's gradient (zeros of [n, Q + 2K], its part copied in), the
         * others add into their places (Phi-3's contiguous slices pass their
         * gradients on to the views) */
        double e3 = eQ + 2 * eK;
        bwd->bytes += grad_copy(e3, q, false);
        proj_bwd(bwd, d->C, d->Q + 2 * d->K, q, n1, f->norm_outputs && !d->tp, f->qkv_bias);
    } else { /* v_proj: the norm's output (the region's input) gets its gradient (Phi's has the MLP's) */
        proj_bwd(bwd, d->C, d->K, v, n1, (f->norm_outputs && !d->tp) || f->parallel, f->qkv_bias);
        proj_bwd(bwd, d->C, d->K, kk, n1, true, f->qkv_bias);
        proj_bwd(bwd, d->C, d->Q, q, n1, true, f->qkv_bias);
    }
    enter_bwd(bwd, f->norm_outputs);
    replica_bwd(bwd);
    /* the attention's input norm into the layer input's gradient */
    if (!f->norm_outputs) norm_bwd(bwd, eC, ACCEL_F32, true);
}

/* The step outside the layers: ids, embedding (scaled; GPT-2's positions
 * added, dropped out), final norm, lm_head (capped, scaled), the loss
 * (labels; the fused cross-entropy keeps the logits' gradient) and their
 * backward. */
static void outer_step(ledger *l) {
    const dims *d = l->d;
    const fam *f = l->f;
    double n = d->n, eC = d->ns * d->C, eW = n * d->C; /* the stream's [B, T, C]; a whole one */
    l->bytes += 8 * n;                  /* ids [B, T] i64 */
    l->bytes += 4 * eC;                 /* embedding output (f32 weight): under tp the sum's, or its positions */
    if (d->tp) {
        /* the vocabulary-parallel embedding: its ids' masks (3 bool), the
         * local ids (i64: the shifted ids, the masked ones), the mask as f32,
         * the lookup and the masked lookup (whole [B, T, C]); backward: the
         * exit's gradient into the masked lookup, g * mask, the lookup's copy */
        l->bytes += 3 * n + 2 * 8 * n + 4 * n + 2 * 4 * eW;
        l->bytes += 3 * 4 * eW;
    }
    if (f->gemma) unary_fwd(l, eC, ACCEL_F32), unary_bwd(l, eC, ACCEL_F32);
    if (f->multipliers) unary_fwd(l, eC, ACCEL_F32), unary_bwd(l, eC, ACCEL_F32);
    if (f->gpt2) {
        /* positions [T] i64, wpe's rows [T, C], their broadcast add, and in
         * backward: both inputs' gradients (the positions' summed over B) */
        l->bytes += 8 * d->T + 4 * d->T * d->C + 4 * eC + 2 * 4 * d->T * d->C; /* the tokens' takes the add's */
    }
    if (f->embd_pdrop > 0) dropout_fwd(l, eC, ACCEL_F32), dropout_bwd(l, eC, ACCEL_F32); /* GPT-2, Phi */
    accel_dtype hn = norm_fwd(l, eC, d->ns, ACCEL_F32); /* model.norm / ln_f */
    enter_fwd(l);                                      /* lm_head's region (its vocabulary columns) */
    accel_dtype lo = linear_fwd(l, d->C, d->V, hn);
    double nV = n * d->V;
    if (f->final_cap) /* cap * tanh(logits / cap) */
        for (int i = 0; i < 3; i++) unary_fwd(l, nV, lo), unary_bwd(l, nV, lo);
    if (f->multipliers) unary_fwd(l, nV, lo), unary_bwd(l, nV, lo); /* / logits_scaling */
    if (l->k->zero3) /* the gradients of the embedding's, the norm's and the head's outputs, copied */
        l->bytes += grad_copy(2 * eC, ACCEL_F32, false) + grad_copy(nV, lo, false);
    /* the logits go to the loss as the head gives them: an Accelerator's
     * autocast hook leaves them 16-bit inside accel_llama_loss */
    accel_dtype loss_in = lo;
    l->bytes += 8 * d->B + 8 * n + 8 * n; /* the pad column, labels, targets as [n] i64 */
    if (d->cp > 1) /* the whole batch's ids and shifted labels, of which the rank keeps its chunks (the [n] above) */
        l->bytes += 2 * 8 * d->B * d->Tg;
    if (d->tp) {
        /* accel_tp_cross_entropy: the logits made f32 (a copy unless they
         * are), their gradient (written directly when f32, else an f32 one
         * copied); rows of numbers: targets (3 [n] i64 and the lookup's
         * index), [n] f32 sums (5) and the looked-up target logits */
        l->bytes += f32_contig(nV, loss_in, true) + gbuf(nV, loss_in, false) + 4 * 8 * n + 6 * 4 * n;
    } else {
        cross_entropy_step(l, n, d->V, loss_in);
        /* fused, scaled by the rank's share of the loss (not 1: src/ops/loss.c):
         * an f32 gradient's copy times it; a bf16 one computed again with it,
         * in place (per-thread rows again) */
        if (d->cp > 1 && loss_in == ACCEL_F32) binary_fwd(l, nV, loss_in, ACCEL_F32);
        else if (d->cp > 1 && loss_in == ACCEL_BF16) l->bytes += l->k->threads * 4 * d->V;
    }
    linear_bwd(l, d->C, d->V, lo, hn, false, false); /* lm_head: the norm's output (the region's input) gets its gradient */
    enter_bwd(l, false);
    norm_bwd(l, eC, ACCEL_F32, false);        /* model.norm: the last layer's output gradient */
    /* the embedding's backward adds into its weight's gradient */
}

/* Why decoder layer i attends through explicit scores in a training step of
 * T positions (src/nn/llama.c attention_body): its window bites, scores are
 * soft-capped, or GPT-2's or Phi's attention dropout acts; NULL where the
 * fused attention runs it. */
static const char *explicit_reason(const accel_llama_config *c, const accel__arch *a, int64_t i, int64_t T) {
    if (a->score_softcap && c->attn_logit_softcapping > 0) return "attention soft-capping";
    if (a->dropouts && c->attn_pdrop > 0) return "attention dropout";
    if (accel__arch_layer_windowed(a, c, i) && T > c->sliding_window) return "a sliding window shorter than seq_len";
    return NULL;
}

/* Context parallelism's ranks into d (after tp's): this rank's 2c = T / cp
 * positions, refused as the runtime refuses them (src/nn/decoder_cp.c,
 * src/ops/attention_cp.c), and the layers whose explicit scores it does not
 * model. */
static bool cp_dims(const accel_llama_config *cfg, const accel__arch *a, const accel_activation_opts *o, dims *d) {
    static const char *FN = "accel_llama_activation_bytes";
    int cp = o->cp_size, tp = o->tp_size > 1 ? o->tp_size : 1;
    if (accel__llama_cp_check(cfg, tp, cp, o->cp_alltoall ? ACCEL_CP_ALLTOALL : ACCEL_CP_ALLGATHER, FN) ||
        accel__llama_cp_dropout_check(cfg, FN))
        return false;
    if (o->seq_len % (2 * (int64_t)cp)) { /* int64: 2 cp overflows int for cp_size >= 2^30 */
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: seq_len %lld is not a multiple of 2 x cp_size = %lld: each of the "
                        "cp ranks holds 2 of the 2 x cp equal chunks (load-balanced causal split)", FN,
                        (long long)o->seq_len, 2 * (long long)cp);
        return false;
    }
    if (o->sequence_parallel && (o->seq_len / cp) % tp) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: a cp rank's %lld positions (seq_len %lld / cp_size %d) are not "
                        "a multiple of tp_size %d: sequence parallelism splits them over the tp ranks", FN,
                        (long long)(o->seq_len / cp), (long long)o->seq_len, cp, tp);
        return false;
    }
    const char *why;
    for (int64_t i = 0; i < cfg->num_hidden_layers; i++)
        if ((why = explicit_reason(cfg, a, i, o->seq_len))) {
            accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: cp_size %d: layer %lld attends through explicit scores (%s), "
                            "whose memory under context parallelism is not modelled here (the runtime runs it: "
                            "measure a step)", FN, cp, (long long)i, why);
            return false;
        }
    d->cp = cp, d->a2a = o->cp_alltoall;
    d->T = (double)(o->seq_len / cp);
    d->n = d->B * d->T;
    d->ns = o->sequence_parallel ? d->n / tp : d->n;
    return true;
}

static bool resolve(const accel_llama_config *cfg, dims *d, fam *f, const accel_activation_opts *o) {
    if (accel_llama_config_check(cfg, "accel_llama_activation_bytes") != ACCEL_OK) return false;
    const accel__arch *a = accel__arch_find(cfg->model_type);
    double heads = (double)cfg->num_attention_heads;
    double kv = (double)(cfg->num_key_value_heads ? cfg->num_key_value_heads : cfg->num_attention_heads);
    double hd = (double)(cfg->head_dim ? cfg->head_dim : cfg->hidden_size / cfg->num_attention_heads);
    *d = (dims){.B = (double)o->batch_size, .T = (double)o->seq_len, .C = (double)cfg->hidden_size,
                .Q = heads * hd, .K = kv * hd, .I = (double)cfg->intermediate_size,
                .V = (double)cfg->vocab_size, .H = heads, .D = hd, .Hkv = kv};
    accel_llama_config rc = *cfg; /* head_dim resolved, for the rotary dims */
    rc.head_dim = (int64_t)hd;
    d->R = (double)accel__rotary_dim(&rc);
    d->n = d->ns = d->B * d->T;
    int tp = o->tp_size > 1 ? o->tp_size : 1;
    if (o->tp_size < 0 || (o->sequence_parallel && tp == 1)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_activation_bytes: tp_size %d%s: tp_size is 0 or 1 (no "
                        "tensor parallelism) or the ranks' count%s", o->tp_size,
                        o->sequence_parallel ? " with sequence_parallel" : "",
                        o->sequence_parallel ? "; sequence parallelism needs tp_size above 1" : "");
        return false;
    }
    if (o->sequence_parallel && o->seq_len % tp) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_activation_bytes: seq_len %lld is not a multiple of "
                        "tp_size %d: sequence parallelism splits the sequence over the tp ranks",
                        (long long)o->seq_len, tp);
        return false;
    }
    /* what accel_llama_parallelize refuses (its own check: sizes tp does not divide, families with no plan) */
    if (tp > 1 && accel__llama_tp_check(cfg, tp, "accel_llama_activation_bytes")) return false;
    if (tp > 1 && a->moe && cfg->num_local_experts > 0) { /* the experts' region: not modelled */
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_llama_activation_bytes: the activations of %s's experts under "
                        "tensor parallelism are not estimated (not implemented; measure a step)", a->model_type);
        return false;
    }
    if (tp > 1) { /* this rank's heads (one replicated key/value head with fewer than tp), columns, vocabulary */
        d->tp = true;
        d->H = heads / tp;
        d->Hkv = kv < tp ? 1 : kv / tp;
        d->Kw = kv < tp ? kv * hd : 0, d->Qw = kv < tp ? heads * hd : 0;
        d->Q = d->H * hd, d->K = d->Hkv * hd;
        d->I /= tp, d->V /= tp;
        if (o->sequence_parallel) d->ns = d->B * (double)(o->seq_len / tp);
    }
    bool gpt2 = a->blocks == ACCEL__BLOCKS_GPT2;
    d->cp = 1, d->Tg = d->T;
    if (o->cp_size > 1 && !cp_dims(cfg, a, o, d)) return false;
    bool phi = a->phi_blocks, neox = a->neox_blocks, drops = a->dropouts;
    *f = (fam){.gpt2 = gpt2, .layer_norm = gpt2 || a->layer_norms, .gemma = a->gemma_blocks, .sandwich = a->sandwich_norms, .norm_outputs = a->norm_outputs,
               .qk_norm = accel__arch_qk_norm_heads(a, cfg),
               .qk_norm_heads = a->stablelm_blocks && cfg->qk_layernorm, .qk_norm_full = a->qk_norm_full, .fused_qkv = a->fused_qkv || neox,
               .fused_gate_up = a->fused_gate_up, .multipliers = a->multipliers,
               .cap = a->score_softcap ? cfg->attn_logit_softcapping : 0, .eager_scores = a->score_softcap,
               .final_cap = a->softcap && cfg->final_logit_softcapping > 0,
               .attn_pdrop = drops ? cfg->attn_pdrop : 0, .resid_pdrop = drops ? cfg->resid_pdrop : 0,
               .embd_pdrop = drops ? cfg->embd_pdrop : 0, .mlp_drop_only = a->stablelm_blocks,
               .qkv_bias = a->qkv_bias || (a->attention_bias && cfg->attention_bias) || phi,
               /* StableLM's, Qwen2-MoE's attention_bias (use_qkv_bias, qkv_bias): q/k/v only */
               .o_bias = (a->attention_bias && cfg->attention_bias && !a->qkv_only_bias) || phi,
               .mlp_bias = (a->mlp_bias && cfg->mlp_bias) || phi || neox,
               .gelu_mlp = phi || neox || a->starcoder2_blocks, /* Starcoder2's c_fc -> gelu -> c_proj */
               .parallel = accel__arch_parallel(a, cfg), .norm2 = neox,
               .moe_f32_weights = a->moe == ACCEL__MOE_MIXTRAL,
               .renorm = a->moe == ACCEL__MOE_MIXTRAL || cfg->norm_topk_prob,
               .jitter = a->moe == ACCEL__MOE_MIXTRAL && cfg->router_jitter_noise > 0};
    if (a->moe && cfg->num_local_experts > 0) { /* the sparse layers' block (under tp refused above) */
        d->E = (double)cfg->num_local_experts, d->topk = (double)cfg->num_experts_per_tok;
        d->Ie = (double)(a->moe == ACCEL__MOE_QWEN ? cfg->moe_intermediate_size : cfg->intermediate_size);
        d->Is = a->shared_expert ? (double)cfg->shared_expert_intermediate_size : 0;
    }
    return true;
}

/* ------------------------------------------------------------ BERT's step
 * The head's loss (accel_bert_loss, _token_loss, _qa_loss; src/nn/bert.c)
 * on a padded batch (the additive mask exists: a batch without padding
 * makes none, 4 B*H*T*T bytes a layer fewer), token_type_ids given; its
 * dropouts act (a training step). */

/* One BertLayer: self-attention over explicit scores, BertSelfOutput, the
 * intermediate gelu, BertOutput. */
static void bert_layer_step(ledger *fwd, ledger *bwd, const accel_bert_config *c) {
    const dims *d = fwd->d;
    const step_kind *k = fwd->k;
    double n = d->n, eC = n * d->C, eI = n * d->I;
    double ph = c->hidden_dropout_prob, pa = c->attention_probs_dropout_prob;
    accel_dtype s = mm_dtype(k);
    /* forward: q, k, v (with bias) split into heads as views */
    accel_dtype q = linear_fwd(fwd, d->C, d->C, ACCEL_F32);
    linear_fwd_of(fwd, d->C, d->C, ACCEL_F32, true, false); /* k and v read q's operand */
    linear_fwd_of(fwd, d->C, d->C, ACCEL_F32, true, false);
    /* the attention (accel__scores_attention, BERT's dropout on the
     * probabilities): under a bf16/f16 autocast in f32 (upcast_scores_step),
     * else scores_step on the heads' views; the output's transpose made
     * dense for the reshape */
    fam fa = *fwd->f;
    fa.attn_pdrop = pa;
    ledger af = {k, d, &fa, 0, 0}, abwd = af;
    if (upcasts(fwd)) upcast_scores_step(&af, &abwd, q, q, q);
    else scores_step(&af, &abwd, q, q, q, false, true, pa > 0);
    scratch(fwd, af.top);
    fwd->bytes += af.bytes;
    fwd->bytes += dense(eC, s, false);
    /* BertSelfOutput: dense, dropout, + the layer input, LayerNorm */
    accel_dtype o = linear_fwd(fwd, d->C, d->C, s);
    if (ph > 0) dropout_fwd(fwd, eC, o);
    add_fwd(fwd, o);
    accel_dtype a = norm_fwd(fwd, eC, n, ACCEL_F32);
    /* intermediate: dense, gelu; BertOutput: dense, dropout, + a, LayerNorm */
    accel_dtype i = linear_fwd(fwd, d->C, d->I, a);
    accel_dtype gi = unary_fwd(fwd, eI, i);
    accel_dtype m = linear_fwd(fwd, d->I, d->C, gi);
    if (ph > 0) dropout_fwd(fwd, eC, m);
    add_fwd(fwd, m);
    norm_fwd(fwd, eC, n, ACCEL_F32);

    /* backward, in reverse from the output's gradient */
    norm_bwd(bwd, eC, ACCEL_F32, false);
    bwd->bytes += add_bwd(eC, m); /* add: the branch's, a's */
    if (ph > 0) dropout_bwd(bwd, eC, m);
    proj_bwd(bwd, d->I, d->C, m, gi, false, true);
    unary_bwd(bwd, eI, i);
    proj_bwd(bwd, d->C, d->I, i, a, true, true);
    norm_bwd(bwd, eC, ACCEL_F32, false);
    bwd->bytes += add_bwd(eC, o); /* add: the branch's, the input's */
    if (ph > 0) dropout_bwd(bwd, eC, o);
    proj_bwd(bwd, d->C, d->C, o, s, false, true);
    /* the reshape's gradient taken by the transposed view, its dense
     * transpose by P V's output */
    bwd->bytes += dense(eC, s, false);
    scratch(bwd, abwd.top);
    bwd->bytes += abwd.bytes;
    for (int h = 0; h < 3; h++) split_heads_bwd(bwd, eC, q, d->H, false);
    proj_bwd(bwd, d->C, d->C, q, ACCEL_F32, true, true); /* the layer input has its gradient (the residual's) */
    proj_bwd(bwd, d->C, d->C, q, ACCEL_F32, true, true);
    proj_bwd(bwd, d->C, d->C, q, ACCEL_F32, true, true);
}

/* The batch and the embeddings of the encoder's d->B rows (multiple
 * choice: B N): ids, token types, mask, the mask read as int64, as floats,
 * as a tensor; the positions (BERT's [T] and their rows [T, C], broadcast
 * over the rows; RoBERTa's counted from the ids on the host, [B, T] i64,
 * their rows [B, T, C]); word + type + position rows, LayerNorm, dropout,
 * and their backward, whose bytes (allocated after every layer's backward)
 * it returns. */
static double bert_embeddings_step(ledger *l, const accel_bert_config *c) {
    const dims *d = l->d;
    double n = d->n, eC = n * d->C, ph = c->hidden_dropout_prob;
    bool roberta = c->model_type != ACCEL_BERT_MODEL_BERT;
    l->bytes += 8 * n + 8 * n + 8 * n;     /* ids, token_type_ids, attention_mask */
    l->bytes += 8 * n + 4 * n + 4 * n;     /* the mask read as int64, as floats, as a tensor */
    double pos = roberta ? eC : d->T * d->C; /* the position rows' elements */
    l->bytes += roberta ? 8 * n + 8 * n : 8 * d->T; /* RoBERTa's host ids made positions, as a tensor; BERT's arange */
    l->bytes += 4 * pos;
    l->bytes += 4 * eC + 4 * eC + 4 * eC + 4 * eC; /* word and type rows, the two adds */
    accel_dtype e = norm_fwd(l, eC, n, ACCEL_F32);
    if (ph > 0) dropout_fwd(l, eC, e);
    /* backward, after every layer's */
    ledger b = {l->k, d, l->f, 0, 0};
    if (ph > 0) dropout_bwd(&b, eC, e);
    norm_bwd(&b, eC, ACCEL_F32, false);
    /* the adds' backward: both inputs' gradients; BERT's positions' summed over the rows (the sum, its copy),
     * RoBERTa's take the add's as they are */
    b.bytes += 2 * 4 * eC + (roberta ? 0 : 2 * 4 * pos);
    l->bytes += b.bytes;
    return b.bytes;
}

/* The masked LM's head on every position of the last hidden state (f32;
 * BERT's cls.predictions, RoBERTa's lm_head): dense (C -> C), gelu,
 * LayerNorm, the decoder over the vocabulary (the word embeddings' weight,
 * a prepared form like any weight's; a bias), the cross-entropy of its
 * logits against labels [B, T] (-100 ignored, made [n] i64), and their
 * backward into the hidden state's gradient, new (the head's is the first). */
static void bert_mlm_step(ledger *l, const accel_bert_config *c) {
    const dims *d = l->d;
    double n = d->n, eC = n * d->C, V = (double)c->vocab_size;
    accel_dtype t = linear_fwd(l, d->C, d->C, ACCEL_F32);
    unary_fwd(l, eC, t);
    accel_dtype x = norm_fwd(l, eC, n, t);
    accel_dtype lo = linear_fwd(l, d->C, V, x);
    l->bytes += 8 * n + 8 * n; /* the labels, made [n] i64 */
    cross_entropy_step(l, n, V, lo);
    proj_bwd(l, d->C, V, lo, x, false, true);
    norm_bwd(l, eC, t, false);
    unary_bwd(l, eC, t);
    proj_bwd(l, d->C, d->C, t, ACCEL_F32, false, true);
}

/* A head on the first position's pooled output, on the encoder's R = d->B
 * rows: BERT's pooler (the view across T made dense, dense, tanh), the
 * dropout p (0: none), the classifier of L outputs, the cross-entropy of
 * its R L logits, and their backward; the first position's slice then
 * makes the last hidden state's gradient (zeros of [R, T, C], its rows
 * copied in) unless `h_has_grad` (pre-training's masked LM made it: the
 * slice adds into its rows). */
static void bert_pooled_step(ledger *l, double p, double L, bool h_has_grad) {
    const dims *d = l->d;
    double BC = d->B * d->C;
    dims db = *d;
    db.n = d->B;
    ledger r = {l->k, &db, l->f, 0, 0};
    r.bytes += mm_operand(l->k, BC, ACCEL_F32, false);
    accel_dtype pd = linear_fwd(&r, d->C, d->C, ACCEL_F32);
    unary_fwd(&r, BC, pd);
    if (p > 0) dropout_fwd(&r, BC, pd), dropout_bwd(&r, BC, pd);
    accel_dtype y = linear_fwd(&r, d->C, L, pd);
    r.bytes += 4 * d->B * L * 3; /* cross-entropy's f32 logits, lse, gradient */
    proj_bwd(&r, d->C, L, y, pd, false, true);
    unary_bwd(&r, BC, pd);
    proj_bwd(&r, d->C, d->C, pd, ACCEL_F32, false, true);
    scratch(l, r.top);
    l->bytes += r.bytes + (h_has_grad ? 0 : 4 * d->n * d->C) + grad_copy(BC, ACCEL_F32, false);
}

/* RoBERTa's sequence classifier (RobertaClassificationHead) on the first
 * position of the B rows: dropout of the view (made dense f32), dense, tanh,
 * dropout, out_proj (the classifier dropout p both times; 0: none, the
 * view then made dense for dense), the cross-entropy, their backward, and
 * the slice's (zeros of [B, T, C], its rows copied in). */
static void roberta_classifier_step(ledger *l, double p, double L) {
    const dims *d = l->d;
    double BC = d->B * d->C;
    dims db = *d;
    db.n = d->B;
    ledger r = {l->k, &db, l->f, 0, 0};
    if (p > 0) r.bytes += f32_contig(BC, ACCEL_F32, false), dropout_fwd(&r, BC, ACCEL_F32);
    else r.bytes += mm_operand(l->k, BC, ACCEL_F32, false);
    accel_dtype pd = linear_fwd(&r, d->C, d->C, ACCEL_F32);
    unary_fwd(&r, BC, pd);
    if (p > 0) dropout_fwd(&r, BC, pd);
    accel_dtype y = linear_fwd(&r, d->C, L, pd);
    r.bytes += 4 * d->B * L * 3; /* cross-entropy's f32 logits, lse, gradient */
    proj_bwd(&r, d->C, L, y, pd, false, true);
    if (p > 0) dropout_bwd(&r, BC, pd);
    unary_bwd(&r, BC, pd);
    proj_bwd(&r, d->C, d->C, pd, ACCEL_F32, false, true);
    if (p > 0) dropout_bwd(&r, BC, ACCEL_F32);
    scratch(l, r.top);
    l->bytes += r.bytes + 4 * d->n * d->C + grad_copy(BC, ACCEL_F32, false);
}

/* Token classification's and question answering's heads on every position:
 * (the classifier dropout,) the linear of L outputs, their losses over the
 * n rows (QA: the start and end logits made dense, two cross-entropies
 * whose gradients add into one), and their backward. */
static void bert_positions_step(ledger *l, accel_bert_head head, double p, double L) {
    const dims *d = l->d;
    double n = d->n, eC = n * d->C;
    ledger r = {l->k, d, l->f, 0, 0};
    bool tok = head == ACCEL_BERT_TOKEN_CLASSIFICATION;
    if (tok && p > 0) dropout_fwd(&r, eC, ACCEL_F32);
    accel_dtype y = linear_fwd(&r, d->C, L, ACCEL_F32);
    /* cross-entropy's f32 logits (QA: each half made dense), lse, gradient; QA's two add into one */
    r.bytes += tok ? 4 * n * L * 3 : 2 * 4 * n * 3 + 4 * n * L;
    proj_bwd(&r, d->C, L, y, ACCEL_F32, false, true);
    if (tok && p > 0) dropout_bwd(&r, eC, ACCEL_F32);
    scratch(l, r.top);
    l->bytes += r.bytes;
}

/* Outside the layers: the batch and embeddings (bert_embeddings_step), the
 * head's targets, the head and its loss. The encoder's rows are d->B:
 * multiple choice's B examples of `choices` rows each. Returns the bytes
 * allocated after every layer's backward (compose's tail). */
static double bert_outer_step(ledger *l, const accel_bert_config *c, double choices) {
    const dims *d = l->d;
    double n = d->n, pc = accel__bert_classifier_p(c), L = (double)c->num_labels, B = d->B / choices;
    bool roberta = c->model_type != ACCEL_BERT_MODEL_BERT;
    accel_bert_head head = c->head;
    double tail = bert_embeddings_step(l, c);
    switch (head) {
    case ACCEL_BERT_SEQUENCE_CLASSIFICATION:
        l->bytes += 8 * B;
        if (roberta) roberta_classifier_step(l, pc, L);
        else bert_pooled_step(l, pc, L, false);
        break;
    case ACCEL_BERT_TOKEN_CLASSIFICATION:
        l->bytes += 8 * n;
        bert_positions_step(l, head, pc, L);
        break;
    case ACCEL_BERT_QUESTION_ANSWERING:
        l->bytes += 8 * 2 * B;
        bert_positions_step(l, head, pc, L);
        break;
    case ACCEL_BERT_MASKED_LM: bert_mlm_step(l, c); break;
    case ACCEL_BERT_PRETRAINING: /* the masked LM's backward runs first (its ops come after the pooler's) */
        l->bytes += 8 * B;
        bert_mlm_step(l, c);
        bert_pooled_step(l, 0, 2, true);
        break;
    case ACCEL_BERT_NEXT_SENTENCE_PREDICTION:
        l->bytes += 8 * B;
        bert_pooled_step(l, 0, 2, false);
        break;
    default: /* multiple choice: each row's score, [B N, 1] seen as [B, N] by the loss */
        l->bytes += 8 * B;
        bert_pooled_step(l, roberta ? c->hidden_dropout_prob : pc, 1, false);
        break;
    }
    return tail;
}

/* Bytes as int64, or false when they reach 2^62 (a config or batch no step
 * could hold, named in the caller's error). */
static bool to_bytes(double b, int64_t *out) {
    if (!(b < 0x1p62)) return false;
    *out = (int64_t)llround(b);
    return true;
}

/* The options' checks of both entry points (fn names the caller). */
static accel_status check_opts(const char *fn, const void *cfg, const accel_activation_opts *o,
                               accel_activation_bytes *out) {
    if (!cfg || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s is NULL", fn, cfg ? "out" : "cfg");
    if (!o) /* the one options struct without defaults: the shape of a step is the question */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: options are NULL: batch_size and seq_len have no default",
                               fn);
    memset(out, 0, sizeof *out);
    if (o->batch_size < 1 || o->seq_len < 2)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: batch_size %lld and seq_len %lld: need batch_size >= 1 and seq_len >= 2 (the "
                               "loss shifts the labels by one)",
                               fn, (long long)o->batch_size, (long long)o->seq_len);
    if (o->autocast != ACCEL_F32 && o->autocast != ACCEL_BF16 && o->autocast != ACCEL_F16)
        return accel_set_error(ACCEL_ERR_DTYPE, "%s: autocast must be float32 (none), bfloat16 or float16, got %s",
                               fn, accel_dtype_name(o->autocast));
    if (o->cp_size < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: cp_size %d: cp_size is 0 or 1 (no context parallelism) "
                               "or the ranks' count", fn, o->cp_size);
    if (o->num_choices < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: num_choices %lld: it is 0 (not multiple choice) or the "
                               "choices per example", fn, (long long)o->num_choices);
    if (o->cp_alltoall && o->cp_size <= 1) /* a strategy without ranks to split over: refused, as the CLI does */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: cp_alltoall with cp_size %d: the all-to-all strategy "
                               "needs cp_size above 1", fn, o->cp_size);
    return ACCEL_OK;
}

static step_kind kind_of(const accel_activation_opts *o) {
    return (step_kind){o->autocast, o->autocast != ACCEL_F32 && accel__gemm_native(o->autocast),
                       accel__gemm_widens_per_call(o->autocast), o->zero3,
                       (double)accel_num_threads()};
}

/* The kinds of decoder layer: sdpa or explicit scores, a dense MLP or
 * experts (accel_llama_activation_bytes); BERT's layers are of kind 0. */
enum { LAYER_KINDS = 4 };

/* The step's peak from its ledgers: count[e] layers of kind e (lf/lb[e])
 * and what lies outside them. false when a figure reaches 2^62 bytes.
 * Checkpointed, a layer leaves its output (f32) and,
 * once its backward has run, its input's gradient slot; the recompute of
 * one layer at a time sits on top, the largest at most. ZeRO-3's node on a
 * layer's output copies that output's gradient. On top, what one GEMM call
 * (or op's scratch) takes for itself where it stands above the end of its
 * ledger: the bytes its layer's forward and backward (or the outer step)
 * allocate after the call are there at the peak and it is not (given back),
 * so only the most any call passes them by counts. Every step byte after a
 * ledger only adds to the peak, so a call's excess over its own ledger's
 * end bounds its excess over the step's. `tail`: the bytes of outer that
 * the step allocates after every layer's backward (BERT's embeddings'
 * backward; the decoders' adds into the embedding's weight gradient: 0),
 * which a checkpointed step allocates where the last recompute was rewound
 * (the peak sees only what they stand above it). */
static bool compose(const ledger lf[LAYER_KINDS], const ledger lb[LAYER_KINDS], const double count[LAYER_KINDS],
                    const ledger *outer, double tail, double L, const accel_activation_opts *o, const dims *d,
                    accel_activation_bytes *out) {
    double layer[LAYER_KINDS], all = 0, bwd_all = 0;
    int big = 0;
    for (int e = 0; e < LAYER_KINDS; e++) {
        layer[e] = lf[e].bytes + lb[e].bytes;
        if (count[e] > 0 && (count[big] == 0 || layer[e] > layer[big])) big = e;
        all += count[e] * layer[e];
        bwd_all += count[e] * lb[e].bytes;
    }
    double kept_ck = 2 * 4 * d->ns * d->C, z3 = o->zero3 ? 4 * d->ns * d->C : 0;
    double kept_all = o->checkpointing ? L * kept_ck : all;
    /* the outer step's calls (the head's) run before the layers' backward
     * (checkpointed: before the recompute on top); a layer's forward's
     * before its backward */
    if (o->checkpointing) bwd_all = layer[big];
    double call = fmax(0, outer->top - outer->bytes - bwd_all);
    for (int e = 0; e < LAYER_KINDS; e++)
        if (count[e] > 0) call = fmax(call, fmax(lf[e].top - layer[e], lb[e].top - lb[e].bytes));
    /* checkpointed, the tail (of the outer bytes) comes after the last recompute's rewind, in its place */
    double ck_top = o->checkpointing && L > 0 ? fmax(layer[big], tail) - tail : 0;
    double peak = outer->bytes + kept_all + L * z3 + ck_top + call;
    double kept = (o->checkpointing ? kept_ck : layer[big]) + z3;
    return to_bytes(peak, &out->peak) && to_bytes(lf[big].bytes, &out->layer_forward) &&
           to_bytes(lb[big].bytes, &out->layer_backward) && to_bytes(kept, &out->kept_per_layer) &&
           to_bytes(outer->bytes, &out->outer);
}

accel_status accel_llama_activation_bytes(const accel_llama_config *cfg, const accel_activation_opts *o,
                                          accel_activation_bytes *out) {
    static const char *FN = "accel_llama_activation_bytes";
    dims d;
    fam f;
    if (check_opts(FN, cfg, o, out) != ACCEL_OK) return accel_last_status();
    if (o->num_choices > 0) /* a decoder's step has no choices: BERT's multiple choice has */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: num_choices %lld: only BERT's multiple choice has "
                               "choices (accel_bert_activation_bytes)", FN, (long long)o->num_choices);
    if (!resolve(cfg, &d, &f, o)) return accel_last_status();
    const accel__arch *a = accel__arch_find(cfg->model_type);
    step_kind k = kind_of(o);
    /* the kinds of layer there are: attention through sdpa or explicit
     * scores (bit 0), a dense MLP or a sparse block (bit 1) */
    ledger lf[LAYER_KINDS], lb[LAYER_KINDS], outer = {&k, &d, &f, 0, 0};
    double count[LAYER_KINDS] = {0};
    for (int64_t i = 0; i < cfg->num_hidden_layers; i++)
        count[(explicit_reason(cfg, a, i, o->seq_len) != NULL) + 2 * accel__arch_layer_sparse(a, cfg, i)]++;
    for (int e = 0; e < LAYER_KINDS; e++) {
        lf[e] = lb[e] = (ledger){&k, &d, &f, 0, 0};
        if (count[e] > 0) layer_step(&lf[e], &lb[e], e & 1, e & 2);
    }
    outer_step(&outer);
    if (!compose(lf, lb, count, &outer, 0, (double)cfg->num_hidden_layers, o, &d, out))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: the activations of batch %lld x seq_len %lld would take more than 2^62 bytes "
                               "(hidden_size %lld, intermediate_size %lld, vocab_size %lld, %lld layers)",
                               FN, (long long)o->batch_size, (long long)o->seq_len, (long long)cfg->hidden_size,
                               (long long)cfg->intermediate_size, (long long)cfg->vocab_size,
                               (long long)cfg->num_hidden_layers);
    return ACCEL_OK;
}

accel_status accel_bert_activation_bytes(const accel_bert_config *cfg, const accel_activation_opts *o,
                                         accel_activation_bytes *out) {
    static const char *FN = "accel_bert_activation_bytes";
    if (check_opts(FN, cfg, o, out) != ACCEL_OK || accel_bert_config_check(cfg, FN) != ACCEL_OK)
        return accel_last_status();
    /* RoBERTa's positions count from pad_token_id + 1: T tokens reach pad_token_id + T */
    bool roberta = cfg->model_type != ACCEL_BERT_MODEL_BERT;
    int64_t max_T = roberta ? cfg->max_position_embeddings - cfg->pad_token_id - 1 : cfg->max_position_embeddings;
    if (o->seq_len > max_T)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: seq_len %lld is more than %s (%lld)", FN,
                               (long long)o->seq_len,
                               roberta ? "max_position_embeddings - pad_token_id - 1, RoBERTa's positions' room"
                                       : "max_position_embeddings",
                               (long long)max_T);
    if (o->tp_size > 1 || o->sequence_parallel)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: tp_size %d%s: BERT has no tensor-parallel plan (only the "
                               "decoder families: accel_llama_parallelize)", FN, o->tp_size,
                               o->sequence_parallel ? " with sequence_parallel" : "");
    if (o->cp_size > 1)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: cp_size %d: BERT does not run context-parallel (only the "
                               "decoder families: accel_llama_context_parallelize)", FN, o->cp_size);
    /* multiple choice runs the encoder on batch_size x num_choices rows; no other head has choices */
    bool mc = cfg->head == ACCEL_BERT_MULTIPLE_CHOICE;
    if (mc != (o->num_choices > 0))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, mc ? "%s: num_choices %lld: %s runs the encoder on batch_size "
                               "x num_choices rows of seq_len: give num_choices >= 1 (batch_size counts examples)"
                                                         : "%s: num_choices %lld given to a %s: only multiple "
                               "choice has choices", FN, (long long)o->num_choices,
                               accel_bert_class_name(cfg->model_type, cfg->head));
    double choices = mc ? (double)o->num_choices : 1;
    double H = (double)cfg->num_attention_heads, C = (double)cfg->hidden_size;
    dims d = {.B = (double)o->batch_size * choices, .T = (double)o->seq_len, .C = C, .Q = C, .K = C,
              .I = (double)cfg->intermediate_size, .V = 0, .H = H, .D = C / H, .Hkv = H, .R = C / H};
    d.n = d.ns = d.B * d.T;
    fam f = {.layer_norm = true};
    step_kind k = kind_of(o);
    ledger lf[LAYER_KINDS], lb[LAYER_KINDS], outer = {&k, &d, &f, 0, 0};
    double count[LAYER_KINDS] = {(double)cfg->num_hidden_layers};
    for (int e = 0; e < LAYER_KINDS; e++) lf[e] = lb[e] = (ledger){&k, &d, &f, 0, 0};
    bert_layer_step(&lf[0], &lb[0], cfg);
    double tail = bert_outer_step(&outer, cfg, choices);
    if (!compose(lf, lb, count, &outer, tail, (double)cfg->num_hidden_layers, o, &d, out))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: the activations of batch %lld x seq_len %lld would take more than 2^62 bytes "
                               "(hidden_size %lld, intermediate_size %lld, %lld layers)",
                               FN, (long long)o->batch_size, (long long)o->seq_len, (long long)cfg->hidden_size,
                               (long long)cfg->intermediate_size, (long long)cfg->num_hidden_layers);
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
    /* the full buffer autograd fills, and the reduced shard: over one rank
     * the gradients are reduced in place (no shard of the whole buffer) */
    if (s == ACCEL_SHARD_ZERO2 && world > 1) g = P + shard;
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
