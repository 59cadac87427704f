#!/usr/bin/env python3
"""Reference numbers for tests/test_llama_numerics.c and tests/test_nn_layers.c.

Writes into tests/data/:
  llama_linear.safetensors   x [3,5], weight [4,5], bias [4], gy [3,4] (upstream grad)
                             and y, gx, gweight, gbias of y = x W^T + b.
  llama_tiny_untied.safetensors, llama_tiny_tied.safetensors
                             a 2-layer Llama (hidden 32, heads 4, kv heads 2, intermediate 64,
                             vocab 64), the config in __metadata__, its initial weights
                             "w.<name>" (transformers' init, torch seed 0, initializer_range 0.1,
                             norm weights perturbed to 1 + 0.1 N(0,1) so they matter), input ids
                             "ids" [2, 8], expected "logits", "loss" and gradients "g.<name>" of
                             the loss (labels = ids). The untied file also holds "adamw_losses"
                             [10]: losses of 10 AdamW steps (lr 1e-3, weight_decay 0.01) on ids.
The expected values are computed in float64 from the float32 weights (so they are
PyTorch's answer without its float32 rounding) and stored as float32.

Run: python3 tools/gen_llama_fixtures.py   (needs torch, transformers, safetensors)
"""
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def gen_linear():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, generator=g)
    w = torch.randn(4, 5, generator=g)
    b = torch.randn(4, generator=g)
    gy = torch.randn(3, 4, generator=g)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    y = torch.nn.functional.linear(xd, wd, bd)
    y.backward(gy.double())
    save_file({"x": x, "weight": w, "bias": b, "gy": gy, "y": f32(y), "gx": f32(xd.grad),
               "gweight": f32(wd.grad), "gbias": f32(bd.grad)},
              os.path.join(OUT, "llama_linear.safetensors"), metadata={"format": "pt"})


def seeded_llama(cfg):
    """LlamaForCausalLM(cfg) with transformers' init from torch seed 0, its norm weights
    perturbed to 1 + 0.1 N(0, 1) so that they matter (also tools/gen_autocast_fixture.py)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model


def gen_llama(name, rope_theta, tied, adamw_steps):
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rope_theta=rope_theta, tie_word_embeddings=tied, initializer_range=0.1,
                      rms_norm_eps=1e-6, attn_implementation="eager")
    model = seeded_llama(cfg)
    weights = {n: f32(p) for n, p in model.state_dict().items()
               if not (tied and n == "lm_head.weight")}
    ids = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))

    model = model.double()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    tensors = {"w." + n: t for n, t in weights.items()}
    tensors["ids"] = ids.to(torch.int64)
    tensors["logits"] = f32(out.logits)
    tensors["loss"] = f32(out.loss.reshape(1))
    for n, p in model.named_parameters():
        tensors["g." + n] = f32(p.grad)

    if adamw_steps:
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
        model.load_state_dict({n: t for n, t in weights.items()}, strict=not tied)
        model = model.double()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        losses = []
        for _ in range(adamw_steps):
            loss = model(input_ids=ids, labels=ids).loss
            losses.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad()
        tensors["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)

    meta = {"format": "pt", "rope_theta": repr(float(rope_theta)), "tie_word_embeddings": str(int(tied))}
    save_file(tensors, os.path.join(OUT, name), metadata=meta)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    gen_linear()
    gen_llama("llama_tiny_untied.safetensors", 10000.0, False, 10)
    gen_llama("llama_tiny_tied.safetensors", 500000.0, True, 0)
