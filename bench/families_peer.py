#!/usr/bin/env python3
"""Peer and model maker of bench/families.sh: transformers on each architecture
family accel builds from config.json.

    families_peer.py make OUT_DIR
        writes OUT_DIR/<family>/ (config.json + model.safetensors, f32, random
        weights of transformers' own init, seed 0) for every family of FAMILIES:
        hidden 512, intermediate 1024, 4 layers, 8 heads (4 key/value heads where
        the family has GQA), head_dim 64, vocabulary 32000; the mixtures 8 experts,
        2 per token (Mixtral's of intermediate 1024, Qwen3-MoE's and Qwen2-MoE's of
        512, Qwen2-MoE's shared expert of 1024).
    families_peer.py decode DIR [--ids 1,2,...] [--new-tokens 32] [--dtype float32|bfloat16] [--first-reps N]
        AutoModelForCausalLM.from_pretrained(DIR) in that dtype (default f32), then
        bench/peer_decode.py's greedy_decode (as bench/bigmodel_peer.py decode):
        prints generated_ids, first_token_ms (warm: the prompt's forward and the
        first token, generate(max_new_tokens=1); the median of N, beside its
        CPU time first_token_cpu_ms) and decode_tokens_per_s (new tokens after
        the first over their time).
"""
import argparse
import os

from peer_decode import greedy_decode  # bench/, the script's directory

COMMON = dict(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=256,
              bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
FAMILIES = {
    "llama": {},
    "mistral": dict(sliding_window=32),
    "qwen2": {},
    "qwen3": {},
    "gemma": dict(tie_word_embeddings=True),
    "gemma2": dict(tie_word_embeddings=True, sliding_window=32),
    "gemma3_text": dict(tie_word_embeddings=True, sliding_window=32, sliding_window_pattern=2),
    "granite": dict(embedding_multiplier=6.0, attention_multiplier=0.02, residual_multiplier=0.4, logits_scaling=4.0),
    "phi3": dict(num_key_value_heads=8),
    "olmo2": dict(num_key_value_heads=8),
    "gpt2": None,  # GPT2Config's own keys below
    # mixtures of experts: 8 experts of 1024 (Mixtral) / 512 (Qwen3-MoE), 2 per token
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, sliding_window=32),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=512, norm_topk_prob=True),
    # and Qwen2-MoE's beside a shared expert of 1024
    "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=512, shared_expert_intermediate_size=1024),
}
GPT2 = dict(vocab_size=32000, n_embd=512, n_inner=1024, n_layer=4, n_head=8, n_positions=256,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)


def make(out):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    for name, extra in FAMILIES.items():
        kw = GPT2 if extra is None else {**COMMON, **extra}
        cfg = AutoConfig.for_model("gpt2" if extra is None else name, **kw)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None
        model.save_pretrained(os.path.join(out, name), safe_serialization=True)
        print(name, sum(p.numel() for p in model.parameters()), "parameters")


def decode(d, prompt, new_tokens, dtype, first_reps):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, dtype)).eval()
    greedy_decode(model, prompt, new_tokens, first_reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["make", "decode"])
    ap.add_argument("dir")
    ap.add_argument("--ids", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--first-reps", type=int, default=1)
    a = ap.parse_args()
    if a.mode == "make":
        make(a.dir)
    else:
        decode(a.dir, a.ids, a.new_tokens, a.dtype, a.first_reps)


if __name__ == "__main__":
    main()
