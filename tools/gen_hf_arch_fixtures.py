#!/usr/bin/env python3
"""Tiny random checkpoints of each architecture / RoPE variant accel builds from
config.json, written by transformers, with transformers' outputs.

    python3 tools/gen_hf_arch_fixtures.py [OUT_DIR [NAME...]]  # default tests/data, every fixture
    python3 tools/gen_hf_arch_fixtures.py --greedy-only [OUT_DIR [NAME...]]
    python3 tools/gen_hf_arch_fixtures.py --check-saved ROOT [NAME...]

NAMEs (keys of FIXTURES) limit the run to those fixtures: each fixture's
seeds are its own, so the others' bytes stay as committed.

--greedy-only rebuilds each model (its weights are bit for bit those of its
model.safetensors, which it checks) and replaces only the greedy tensor of the
existing expected.safetensors: logits and gradients computed on another CPU
differ from the committed ones in the last bits (relative 1e-6), and stay as
they were committed.

--check-saved loads ROOT/<name> (written by accel's save_pretrained from
tests/data/hf_arch_<name>) with transformers' AutoModelForCausalLM and compares
its logits with the fixture's; exit status 0 when all are within 1e-5.

Writes OUT_DIR/hf_arch_<name>/ (save_pretrained: config.json + model.safetensors)
and expected.safetensors:
    ids        [2, 24] i64   input ids: past every sliding window (8) and every
                             RoPE threshold (max_position_embeddings or
                             original_max_position_embeddings 16)
    logits     [2, 24, V] f32  transformers' logits (no cache)
    loss       []     f32    model(ids, labels=ids).loss
    g.<param>         f32    that loss's gradient of every parameter
    prompt     [1, 4]  i64
    greedy     [1, 4 + N] i64  greedy generate(prompt, max_new_tokens=N), KV cache: N = 32,
                             fewer where GPT-2's learned positions end first (the
                             fixture's new_tokens: gpt2 29, gpt2_untied 21;
                             gpt2_long has room for 32)
and, for fixtures with a bf16 block check (BF16_BLOCK: qwen2_moe):
    block.x    [48, C] bf16  a sparse block's input (N(0, 1), rounded)
    block.y    [48, C] bf16  model.layers.0.mlp in bf16 (weights rounded) of block.x:
                             every rounding point of transformers' bf16 block
and, for fixtures over a tokenizer's vocabulary (TEXT: gpt2):
    text_greedy [1, n] i64   the tokenizer's ids of TEXT_PROMPT, then 8 greedy tokens
Weights are random with a large std (0.15; norms 1 + 0.1 N(0, 1), Gemma's, which
scale by 1 + weight, 0.1 N(0, 1)) so logits are
well separated and greedy decoding has no near-ties (tests/test_hf_archs.c).
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.core_model_loading import revert_weight_conversion

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None,
            tie_word_embeddings=False)

# PhiConfig has no head_dim (hidden_size / heads) nor rms_norm_eps (its LayerNorms' is layer_norm_eps);
# nor have StableLmConfig and Starcoder2Config (norm_epsilon)
PHI_BASE = {k: v for k, v in BASE.items() if k not in ("head_dim", "rms_norm_eps")}
# GPTNeoXConfig has no kv heads (as many as heads) either
NEOX_BASE = {k: v for k, v in PHI_BASE.items() if k != "num_key_value_heads"}

# GPT2Config's own keys (n_embd, n_layer, ...); vocab 900: tests/data/tokenizers/gpt2's vocabulary
GPT2_BASE = dict(vocab_size=900, n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=None,
                 eos_token_id=None, pad_token_id=None)

FIXTURES = {
    "llama_linear": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama_dynamic": ("llama", dict(max_position_embeddings=16,
                                    rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "llama_yarn": ("llama", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 16})),
    "llama_longrope": ("llama", dict(rope_scaling={
        "rope_type": "longrope", "original_max_position_embeddings": 16,
        "short_factor": [1.0, 1.1, 1.3, 1.6], "long_factor": [1.0, 1.5, 2.5, 4.0]})),
    "llama_llama3": ("llama", dict(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "mistral": ("mistral", dict(sliding_window=8)),
    "qwen2": ("qwen2", dict()),
    "qwen2_window": ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen3": ("qwen3", dict()),
    # the third item: the seeds of the fixtures added after the first nine, and
    # new_tokens where not 32
    "gemma": ("gemma", dict(tie_word_embeddings=True), dict(seed=9)),
    # soft-capping that bites (scores and logits of a few units), a query scale
    # other than head_dim's, the window (8) on layer 0
    "gemma2": ("gemma2", dict(tie_word_embeddings=True, sliding_window=8, attn_logit_softcapping=2.0,
                              final_logit_softcapping=3.0, query_pre_attn_scalar=16),
               dict(seed=10)),
    # Gemma 3: per-head q/k norms, the window (8) on the sliding layers of
    # sliding_window_pattern 2 (layers 0 and 2; 1 full), two RoPE bases (the
    # defaults 1e6 and 1e4), no soft-capping (its default)
    "gemma3": ("gemma3_text", dict(tie_word_embeddings=True, num_hidden_layers=3, sliding_window=8,
                                   sliding_window_pattern=2, query_pre_attn_scalar=16), dict(seed=14)),
    # an explicit layer_types list, linear RoPE scaling on the full layers,
    # other bases on both kinds, logit soft-capping that bites, an untied head
    # (attn_logit_softcapping: transformers' Gemma 3 never applies it; accel refuses it)
    "gemma3_linear": ("gemma3_text", dict(num_hidden_layers=3, sliding_window=8, layer_types=[
        "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
        final_logit_softcapping=3.0), dict(seed=19)),
    "granite": ("granite", dict(embedding_multiplier=6.0, attention_multiplier=0.2, residual_multiplier=0.4,
                                logits_scaling=4.0), dict(seed=11)),
    # fused qkv_proj / gate_up_proj, longrope over half of head_dim, a window
    "phi3": ("phi3", dict(partial_rotary_factor=0.5, original_max_position_embeddings=16, sliding_window=8,
                          rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.2],
                                        "long_factor": [1.5, 3.0]}), dict(seed=9)),
    # norms after attention and MLP, q/k norms over the whole projection
    "olmo2": ("olmo2", dict(), dict(seed=10)),
    "gpt2": ("gpt2", dict(), dict(seed=9, new_tokens=29)),
    # n_positions exactly the ids' length; unscaled attention, untied head, explicit n_inner
    "gpt2_untied": ("gpt2", dict(vocab_size=64, n_positions=24, n_inner=48, layer_norm_epsilon=1e-3,
                                 scale_attn_weights=False, tie_word_embeddings=False), dict(seed=10, new_tokens=21)),
    # room in n_positions for the prompt and 32 greedy tokens
    "gpt2_long": ("gpt2", dict(vocab_size=64, n_positions=40)),
    # mixtures of experts: Mixtral's 2 of 4 with the load-balancing loss in the
    # loss (a coefficient that shows in it) and a window; Qwen3-MoE's 3 of 8
    # renormalised, a dense layer 0 (decoder_sparse_step 2) and a sparse layer
    # 1; and 2 of 6 unnormalised, every layer sparse, with the balancing loss
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                                output_router_logits=True, router_aux_loss_coef=0.05), dict(seed=11)),
    "qwen3_moe": ("qwen3_moe", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
                                    norm_topk_prob=True, decoder_sparse_step=2), dict(seed=12)),
    "qwen3_moe_balance": ("qwen3_moe", dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
                                            output_router_logits=True, router_aux_loss_coef=0.05),
                          dict(seed=13)),
    # Qwen2-MoE: 2 of 4 unnormalised beside the shared expert, layer 1 dense
    # by mlp_only_layers, the balancing loss, the window (8) on layer 0 only
    # (the even layers below max_window_layers)
    "qwen2_moe": ("qwen2_moe", dict(num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=8, shared_expert_intermediate_size=16,
                                    mlp_only_layers=[1], output_router_logits=True, router_aux_loss_coef=0.05,
                                    use_sliding_window=True, sliding_window=8, max_window_layers=2),
                  dict(seed=18)),
    # Qwen2-MoE with qkv_bias false: no q/k/v biases (o_proj has none either);
    # every layer sparse, no window
    "qwen2_moe_nobias": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                                           shared_expert_intermediate_size=16, qkv_bias=False),
                         dict(seed=31)),
    # Phi: parallel attention and MLP from one LayerNorm, biases (lm_head's
    # too), half of each head rotated (PhiConfig's default), grouped kv heads,
    # phi-2's resid_pdrop (no effect in eval and the loss's gradients: eval mode)
    "phi": ("phi", dict(resid_pdrop=0.1), dict(seed=20)),
    # a tied head (its bias its own), linear RoPE over 6 of 8 dims, as many
    # kv heads as heads, another eps
    "phi_linear": ("phi", dict(tie_word_embeddings=True, num_key_value_heads=4, partial_rotary_factor=0.75,
                               layer_norm_eps=1e-3, rope_scaling={"rope_type": "linear", "factor": 2.0}),
                   dict(seed=21)),
    # qk_layernorm: a LayerNorm over each head of q and k before RoPE
    "phi_qk": ("phi", dict(qk_layernorm=True), dict(seed=22)),
    # GPT-NeoX: parallel residual from two LayerNorms, per-head fused qkv,
    # rotary_pct 0.25 (2 of 8 dims), untied embed_out; hidden_dropout 0.1
    # (no effect in eval and the loss's gradients: eval mode)
    "neox": ("gpt_neox", dict(hidden_dropout=0.1), dict(seed=23)),
    # sequential residual, tied head, no attention biases, linear RoPE of base
    # 500 on half of each head, eps 1e-3, GPT-NeoX-20B's tanh GELU (gelu_fast)
    "neox_seq": ("gpt_neox", dict(use_parallel_residual=False, tie_word_embeddings=True, attention_bias=False,
                                  hidden_act="gelu_fast",
                                  rotary_pct=0.5, rotary_emb_base=500.0, layer_norm_eps=1e-3,
                                  rope_scaling=dict(rope_type="linear", factor=2.0)), dict(seed=24)),
    # StableLM: sequential LayerNorm layers, q/k/v biases (use_qkv_bias),
    # a quarter of each head rotated (2 of 8 dims, StableLmConfig's default),
    # grouped kv heads, an untied head; dropouts (no effect in eval and the
    # loss's gradients: eval mode)
    "stablelm": ("stablelm", dict(use_qkv_bias=True, hidden_dropout=0.1, attention_dropout=0.1), dict(seed=25)),
    # parallel residual from one LayerNorm, no q/k/v biases, a tied head,
    # linear RoPE on half of each head, as many kv heads as heads, eps 1e-3
    "stablelm_par": ("stablelm", dict(use_parallel_residual=True, tie_word_embeddings=True, num_key_value_heads=4,
                                      partial_rotary_factor=0.5, layer_norm_eps=1e-3,
                                      rope_scaling=dict(rope_type="linear", factor=2.0)), dict(seed=26)),
    # qk_layernorm: a LayerNorm of its own per head of q and k (4 and 2
    # norms, each its random weight) before the rotary on a quarter of each
    # head; sequential, q/k/v biases, grouped kv heads
    "stablelm_qk": ("stablelm", dict(qk_layernorm=True, use_qkv_bias=True), dict(seed=29)),
    # and parallel from one LayerNorm, half of each head rotated, eps 1e-3
    "stablelm_qk_par": ("stablelm", dict(qk_layernorm=True, use_parallel_residual=True, partial_rotary_factor=0.5,
                                         layer_norm_eps=1e-3), dict(seed=30)),
    # Starcoder2: LayerNorms, biases everywhere (use_bias), c_fc ->
    # gelu_pytorch_tanh -> c_proj, grouped kv heads, a window of 8, a tied
    # head (Starcoder2Config's default); dropouts (eval mode: no effect)
    "starcoder2": ("starcoder2", dict(tie_word_embeddings=True, sliding_window=8, residual_dropout=0.1,
                                      embedding_dropout=0.1, attention_dropout=0.1), dict(seed=27)),
    # no biases, an untied head, eps 1e-3, RoPE of base 500, no window
    "starcoder2_nobias": ("starcoder2", dict(use_bias=False, tie_word_embeddings=False, norm_epsilon=1e-3,
                                             rope_theta=500.0), dict(seed=28)),
    # GPT-2 as Stanford CRFM's: layer i's scores also divided by i + 1,
    # reorder_and_upcast_attn set (read by transformers' eager attention only;
    # built with its default SDPA, as accel's fused attention)
    "gpt2_layer_scale": ("gpt2", dict(scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True),
                         dict(seed=32, new_tokens=29)),
    # the layer scaling on unscaled attention (scale_attn_weights false):
    # transformers' scaling is then 1 / (i + 1) alone, on every attention
    # implementation; three layers (factors 1, 2, 3), room for 32 new tokens
    "gpt2_unscaled_layer_scale": ("gpt2", dict(vocab_size=64, n_layer=3, n_positions=40, scale_attn_weights=False,
                                               scale_attn_by_inverse_layer_idx=True), dict(seed=33)),
}

# fixtures whose sparse block model.layers.0.mlp also runs in bf16 (block.x, block.y)
BF16_BLOCK = {"qwen2_moe"}

# fixtures whose generation also goes from text (TEXT_PROMPT) through a tokenizer.json
TEXT = {"gpt2": "tokenizers/gpt2/tokenizer.json"}
TEXT_PROMPT = "Hello world"


def options(i, spec):
    """(model_type, extra, seed, new_tokens) of FIXTURES' i-th entry."""
    model_type, extra, *rest = spec
    opts = rest[0] if rest else {}
    return model_type, extra, opts.get("seed", i), opts.get("new_tokens", 32)


def build(model_type, extra, seed):
    base = {"gpt2": GPT2_BASE, "phi": PHI_BASE, "gpt_neox": NEOX_BASE, "stablelm": PHI_BASE,
            "starcoder2": PHI_BASE}.get(model_type, BASE)
    cfg = AutoConfig.for_model(model_type, **{**base, **extra})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    # Gemma's norms scale by 1 + weight
    norm_base = 0.0 if model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if ("norm" in pname or ".ln_" in pname) and pname.endswith("weight"):
                p.copy_(norm_base + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def text_greedy(model, tokenizer_json):
    from tokenizers import Tokenizer
    data = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    ids = Tokenizer.from_file(os.path.join(data, tokenizer_json)).encode(TEXT_PROMPT).ids
    prompt = torch.tensor([ids])
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=8, do_sample=False,
                              attention_mask=torch.ones_like(prompt), pad_token_id=0)


def greedy(model, prompt, new_tokens):
    with torch.no_grad():
        gen = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, attention_mask=torch.ones_like(prompt), pad_token_id=0)
    top2 = torch.stack(gen.logits).topk(2, dim=-1).values
    print(f"  greedy: smallest gap between the top two logits {float((top2[..., 0] - top2[..., 1]).min()):.3g}")
    return gen.sequences


def update_greedy(model, d, new_tokens):
    """Replaces the greedy tensor of d's expected.safetensors, the rest kept as stored."""
    stored = load_file(os.path.join(d, "model.safetensors"))
    for name, t in model.state_dict().items():
        if name in stored and not torch.equal(stored[name], t):
            sys.exit(f"{d}: {name} differs from model.safetensors: the fixture's seed or recipe changed")
    path = os.path.join(d, "expected.safetensors")
    out = load_file(path)
    out["greedy"] = greedy(model, out["prompt"], new_tokens).contiguous()
    save_file(out, path)


def expected(model, seed, new_tokens):
    v = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, (2, 24), generator=g)
    prompt = torch.randint(0, v, (1, 4), generator=g)
    out = {"ids": ids, "prompt": prompt}
    with torch.no_grad():
        out["logits"] = model(input_ids=ids).logits.float()
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    out["loss"] = loss.detach().float()
    # under the checkpoint's names (the mixtures' experts.N.w1 ..., as
    # save_pretrained writes them, not the fused experts.gate_up_proj)
    grads = {name: p.grad.detach().float() for name, p in model.named_parameters()}
    for name, t in revert_weight_conversion(model, grads).items():
        out["g." + name] = t
    out["greedy"] = greedy(model, prompt, new_tokens)
    return {k: t.contiguous() for k, t in out.items()}


def bf16_block(model, seed):
    """The first layer's sparse block, a copy in bf16, on 48 tokens of bf16 input."""
    import copy
    block = copy.deepcopy(model.model.layers[0].mlp).to(torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(48, model.config.hidden_size, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        y = block(x.unsqueeze(0)).squeeze(0)
    return {"block.x": x, "block.y": y}


def check_saved(root, names):
    data = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    worst = 0.0
    for name in names:
        model = AutoModelForCausalLM.from_pretrained(os.path.join(root, name), dtype=torch.float32).eval()
        e = load_file(os.path.join(data, "hf_arch_" + name, "expected.safetensors"))
        with torch.no_grad():
            err = float((model(input_ids=e["ids"]).logits - e["logits"]).abs().max())
        print(f"{name}: {type(model).__name__} max |logits - fixture| = {err:.3g}")
        worst = max(worst, err)
    if not worst <= 1e-5:
        sys.exit(1)


def main():
    args = sys.argv[1:]
    check = bool(args) and args[0] == "--check-saved"
    greedy_only = bool(args) and args[0] == "--greedy-only"
    if check or greedy_only:
        args = args[1:]
    if not args and check:
        sys.exit("--check-saved needs ROOT")
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    names = args[1:] or list(FIXTURES)
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        sys.exit(f"unknown fixtures {unknown}; known: {list(FIXTURES)}")
    if check:
        check_saved(root, names)
        return
    total = 0
    for i, (name, spec) in enumerate(FIXTURES.items()):
        if name not in names:
            continue
        model_type, extra, seed, new_tokens = options(i, spec)
        d = os.path.join(root, "hf_arch_" + name)
        os.makedirs(d, exist_ok=True)
        model = build(model_type, extra, 4321 + seed)
        model.generation_config.eos_token_id = None
        if greedy_only:
            update_greedy(model, d, new_tokens)
            continue
        model.save_pretrained(d, safe_serialization=True)
        out = expected(model, 77 + seed, new_tokens)
        if name in TEXT:
            out["text_greedy"] = text_greedy(model, TEXT[name]).contiguous()
        if name in BF16_BLOCK:
            out.update({k: t.contiguous() for k, t in bf16_block(model, 99 + seed).items()})
        save_file(out, os.path.join(d, "expected.safetensors"))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        total += size
        print(f"{d}: {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
