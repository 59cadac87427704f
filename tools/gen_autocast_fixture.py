#!/usr/bin/env python3
"""Reference numbers of a mixed-precision Llama step for tests/test_llama_autocast.c.

Writes tests/data/llama_autocast.safetensors: a 2-layer Llama (hidden 32, heads 4, kv heads 2,
head_dim 8, intermediate 32, vocab 32, rope_theta 10000, untied, attn_implementation "sdpa" as
transformers' default), its f32 master weights "w.<name>" (transformers' init, torch seed 0,
initializer_range 0.2, norm weights 1 + 0.1 N(0,1)), input ids "ids" [2, 12] (labels = ids),
and the forward and backward of the loss on the f32 weights under
    bf16         torch.autocast("cpu", dtype=torch.bfloat16) (Accelerate's --mixed_precision bf16)
    bf16_attn32  the same with the attention computed as accel computes it: SDPA in f32 on
                 the bf16-rounded q, k, v, its output rounded to bf16 once (torch's CPU bf16
                 SDPA kernel also rounds the unnormalised probabilities to bf16 before P V,
                 the largest difference between the two; everything else rounds alike)
    f16_attn32   bf16_attn32 in float16 (fp16 without its loss scale, which cancels in the
                 gradients)
each stored as "<tag>.logits" [2, 12, 32] (f32, as Accelerate's convert_outputs_to_fp32 returns
them) and "<tag>.loss" [1], and for the two bf16 runs the f32 gradient of every master weight
"<tag>.g.<name>". "f16.logits"/"f16.loss" are plain torch.autocast float16; "f32.logits" and
"f32.loss" (no autocast, float64 math rounded to f32) let the test show that its tolerances
separate the autocast results from f32 ones.

Also tests/data/llama_autocast_64.safetensors: the same model and tags but for the f16 runs, on
ids [2, 64] (seed 3): whole 64-query blocks, the sequences on which accel's CPU attention runs
its GEMMs in bf16 on P and dS rounded to bf16 where oneDNN multiplies bf16 (docs/cpu.md, "The
tile GEMMs in bf16/f16").

Run: python3 tools/gen_autocast_fixture.py   (needs torch, transformers, safetensors)
"""
import contextlib
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig

from gen_llama_fixtures import seeded_llama

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")

CONFIG = dict(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.2,
              rms_norm_eps=1e-6)


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def build():
    return seeded_llama(LlamaConfig(**CONFIG, attn_implementation="sdpa"))


@contextlib.contextmanager
def attention_in_f32(dtype):
    """F.scaled_dot_product_attention (what transformers' sdpa attention calls) in f32 on the
    inputs rounded to dtype, its output rounded to dtype."""
    sdpa = F.scaled_dot_product_attention

    def f32_sdpa(q, k, v, *args, **kw):
        with torch.autocast("cpu", enabled=False):
            o = sdpa(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), *args, **kw)
        return o.to(dtype)

    F.scaled_dot_product_attention = f32_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa


def autocast_step(model, ids, dtype, tag, tensors, attn32, grads):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype), (attention_in_f32(dtype) if attn32 else contextlib.nullcontext()):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    tensors[tag + ".logits"] = f32(out.logits)
    tensors[tag + ".loss"] = f32(out.loss.reshape(1))
    for n, p in model.named_parameters() if grads else ():
        tensors[tag + ".g." + n] = f32(p.grad)


def write(name, seq, f16):
    model = build()
    ids = torch.randint(0, CONFIG["vocab_size"], (2, seq), generator=torch.Generator().manual_seed(3))
    tensors = {"w." + n: f32(p) for n, p in model.state_dict().items()}
    tensors["ids"] = ids.to(torch.int64)
    autocast_step(model, ids, torch.bfloat16, "bf16", tensors, attn32=False, grads=True)
    autocast_step(model, ids, torch.bfloat16, "bf16_attn32", tensors, attn32=True, grads=True)
    if f16:
        autocast_step(model, ids, torch.float16, "f16", tensors, attn32=False, grads=False)
        autocast_step(model, ids, torch.float16, "f16_attn32", tensors, attn32=True, grads=False)
    with torch.no_grad():
        out = model.double()(input_ids=ids, labels=ids)
    tensors["f32.logits"] = f32(out.logits)
    tensors["f32.loss"] = f32(out.loss.reshape(1))
    meta = {"format": "pt", **{k: repr(v) for k, v in CONFIG.items()}}
    out = os.path.join(DATA, name)
    save_file(tensors, out, metadata=meta)
    print(f"{out}: {os.path.getsize(out)} bytes")


def main():
    write("llama_autocast.safetensors", 12, f16=True)
    write("llama_autocast_64.safetensors", 64, f16=False)


if __name__ == "__main__":
    main()
