#!/usr/bin/env python3
"""Peer of bench/bench_moe_step.c: the same mixture-of-experts decoder in
transformers, trained on the same ids (bench_util.h's bench_llama_ids LCG,
seed 1) with AdamW (lr 1e-4), a step = forward with labels, backward,
optimizer step, zero_grad.

    moe_step_peer.py [--family mixtral|qwen3_moe|qwen2_moe] [--experts-impl grouped_mm|eager]
                     [--mixed_precision no|bf16] [--steps N] [--warmup W] [--batch B] [--seq T]
                     [--hidden C] [--layers L] [--heads H] [--ffn F] [--vocab V] [--experts E] [--topk K]

--experts-impl picks transformers' experts implementation (grouped_mm, its
default, or the eager loop over the experts). bf16: torch.autocast on the
CPU around the forward and loss, as Accelerate's mixed_precision="bf16".
Prints one line per timed step and
    impl=torch_<experts-impl> family=... step_ms_median=... loss=...
"""
import argparse
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def lcg_ids(b, t, v, seed):
    out = []
    for _ in range(b * t):
        seed = (seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((seed >> 33) % v)
    return torch.tensor(out, dtype=torch.int64).view(b, t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="mixtral", choices=["mixtral", "qwen3_moe", "qwen2_moe"])
    ap.add_argument("--experts-impl", default="grouped_mm", choices=["grouped_mm", "eager"])
    ap.add_argument("--mixed_precision", default="no", choices=["no", "bf16"])
    for k, d in [("steps", 5), ("warmup", 1), ("batch", 8), ("seq", 256), ("hidden", 512), ("layers", 8),
                 ("heads", 8), ("ffn", 1536), ("vocab", 8192), ("experts", 8), ("topk", 2)]:
        ap.add_argument("--" + k, type=int, default=d)
    a = ap.parse_args()
    kw = dict(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
              num_attention_heads=a.heads, num_key_value_heads=max(a.heads // 2, 1), max_position_embeddings=a.seq,
              rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
              tie_word_embeddings=False, num_experts_per_tok=a.topk, router_aux_loss_coef=0.001)
    if a.family == "mixtral":
        kw.update(num_local_experts=a.experts)
    elif a.family == "qwen3_moe":
        kw.update(num_experts=a.experts, moe_intermediate_size=a.ffn, norm_topk_prob=True, decoder_sparse_step=1)
    else:  # Qwen2-MoE: not renormalised, a shared expert of ffn beside the routed ones
        kw.update(num_experts=a.experts, moe_intermediate_size=a.ffn, decoder_sparse_step=1,
                  shared_expert_intermediate_size=a.ffn)
    cfg = AutoConfig.for_model(a.family, **kw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, experts_implementation=a.experts_impl)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = lcg_ids(a.batch, a.seq, a.vocab, 1)
    times, loss = [], None
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.mixed_precision == "bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        ms = (time.perf_counter() - t0) * 1e3
        if s >= a.warmup:
            times.append(ms)
            print(f"step {s - a.warmup} ms={ms:.1f} loss={loss.item():.4f}")
    print(f"impl=torch_{a.experts_impl} family={a.family} mixed_precision={a.mixed_precision} "
          f"step_ms_median={statistics.median(times):.1f} loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
