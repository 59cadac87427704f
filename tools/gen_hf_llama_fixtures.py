#!/usr/bin/env python3
"""Tiny random Llama checkpoints written by transformers, with expected outputs.

    python3 tools/gen_hf_llama_fixtures.py [OUT_DIR]         # default tests/data
    python3 tools/gen_hf_llama_fixtures.py --check-accel DIR --ids 1,2,3 --logits L.npy

Generate mode writes OUT_DIR/hf_llama_<name>/ for each config below with
LlamaForCausalLM.save_pretrained (config.json + model.safetensors, or shards +
index for "sharded"), plus expected.safetensors:
    ids        [2, 7]  i64   fixed input ids
    logits     [2, 7, V] f32 transformers' logits for ids (no cache)
    prompt     [1, 4]  i64   greedy prompt
    greedy     [1, 12] i64   transformers' greedy generate(prompt, max_new_tokens=8)
Weights are random with a large std (0.15) so logits are well separated and
greedy decoding has no near-ties. Total size stays far below 1 MB.

--check-accel loads DIR (written by accel's save_pretrained) with
transformers.LlamaForCausalLM.from_pretrained, runs the ids and compares the
last position's logits with the float32 .npy written by accel
(examples/generate --dump-logits). Exit status 0 when they match within 1e-4.
"""
import argparse
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
            rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None)

CONFIGS = {
    "basic": {},
    "gqa": dict(num_key_value_heads=2, num_hidden_layers=3),
    "tied": dict(tie_word_embeddings=True),
    "rope": dict(rope_theta=500000.0, rms_norm_eps=1e-5, num_attention_heads=2,
                 num_key_value_heads=1),
    "sharded": dict(num_hidden_layers=3),
}
SHARD_SIZE = {"sharded": "20KB"}


def build(name, seed):
    cfg = LlamaConfig(**{**BASE, **CONFIGS[name]})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def expected(model, seed):
    v = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, (2, 7), generator=g)
    prompt = torch.randint(0, v, (1, 4), generator=g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float().contiguous()
        greedy = model.generate(prompt, max_new_tokens=8, do_sample=False,
                                attention_mask=torch.ones_like(prompt), pad_token_id=0)
    return {"ids": ids.contiguous(), "logits": logits, "prompt": prompt.contiguous(),
            "greedy": greedy.contiguous()}


def generate(out_dir):
    total = 0
    for i, name in enumerate(CONFIGS):
        d = os.path.join(out_dir, "hf_llama_" + name)
        os.makedirs(d, exist_ok=True)
        model = build(name, 1234 + i)
        model.generation_config.eos_token_id = None
        kw = {"max_shard_size": SHARD_SIZE[name]} if name in SHARD_SIZE else {}
        model.save_pretrained(d, safe_serialization=True, **kw)
        save_file(expected(model, 99 + i), os.path.join(d, "expected.safetensors"))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        total += size
        print(f"{d}: {sorted(os.listdir(d))} {size} bytes")
    print(f"total {total} bytes")
    if total >= 1 << 20:
        sys.exit("fixtures exceed 1 MB")


def check_accel(d, ids, logits_path):
    model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    x = torch.tensor([[int(t) for t in ids.split(",")]])
    with torch.no_grad():
        ref = model(input_ids=x).logits[0, -1].float().numpy()
    got = np.load(logits_path).astype(np.float32).reshape(-1)
    if got.shape != ref.shape:
        sys.exit(f"check-accel: shape {got.shape} from accel vs {ref.shape} from transformers")
    err = float(np.max(np.abs(got - ref)))
    print(f"check-accel: {d}: max |accel - transformers| = {err:.3g}")
    if not err <= 1e-4:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", nargs="?",
                    default=os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
    ap.add_argument("--check-accel", metavar="DIR")
    ap.add_argument("--ids", default="1,2,3")
    ap.add_argument("--logits", metavar="NPY")
    a = ap.parse_args()
    if a.check_accel:
        if not a.logits:
            sys.exit("--check-accel needs --logits FILE.npy")
        check_accel(a.check_accel, a.ids, a.logits)
    else:
        generate(a.out_dir)


if __name__ == "__main__":
    main()
