#!/usr/bin/env python3
"""Writes the PyTorch reference fixtures of the linear-algebra, nn and loss ops.

Output: tests/data/ops_{matmul,nn,attention,loss}.bin. Each file is
    b"AOPF" | u32 count | count x (u32 name_len | name | u32 ndim | i64 shape[ndim] | f32 data)
little-endian. Integer tensors (targets) are stored as float32 (small exact values).
For each op the file holds its inputs, its output, the upstream gradient "gy"
(a fixed random tensor) and the gradients of the inputs for that upstream
gradient ("d<input>"). Run from the repository root:  python3 tools/gen_ops_fixtures.py
"""
import os
import struct

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb, repeat_kv

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")


def write(name, arrays):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(b"AOPF" + struct.pack("<I", len(arrays)))
        for key, t in arrays.items():
            t = t.detach().to(torch.float32).contiguous()
            kb = key.encode()
            f.write(struct.pack("<I", len(kb)) + kb + struct.pack("<I", t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().astype("<f4").tobytes())
    print(path, os.path.getsize(path), "bytes")


def leaf(*shape):
    return torch.randn(*shape, dtype=torch.float32).requires_grad_(True)


def run(prefix, fn, inputs, extra=None):
    """Forward, backward with a fixed upstream grad; returns the named arrays."""
    y = fn(*inputs.values())
    gy = torch.randn_like(y)
    y.backward(gy)
    out = {}
    for k, v in inputs.items():
        out[prefix + k] = v
    out.update({prefix + k: v for k, v in (extra or {}).items()})
    out[prefix + "y"] = y
    out[prefix + "gy"] = gy
    for k, v in inputs.items():
        if v.requires_grad:
            out[prefix + "d" + k] = v.grad
    return out


def rms_norm(x, w):
    """transformers' LlamaRMSNorm with w (a leaf) as its weight."""
    m = LlamaRMSNorm(x.shape[-1], eps=1e-6)
    del m.weight
    m.weight = w
    return m(x)


def rope(x, pos0, theta):
    B, H, T, D = x.shape
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    pos = torch.arange(pos0, pos0 + T, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None], emb.sin()[None]
    q, _ = apply_rotary_pos_emb(x, x, cos, sin)
    return q


def sdpa(q, k, v, causal):
    H, Hkv, Tq, Tk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k = repeat_kv(k, H // Hkv)
    v = repeat_kv(v, H // Hkv)
    mask = None
    if causal:  # bottom-right aligned: query i sees keys j <= i + Tk - Tq
        i = torch.arange(Tq)[:, None]
        j = torch.arange(Tk)[None, :]
        mask = j <= i + (Tk - Tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def main():
    torch.manual_seed(1234)
    os.makedirs(OUT, exist_ok=True)

    a = run("linear.", lambda x, w, b: F.linear(x, w, b), {"x": leaf(2, 3, 5), "w": leaf(4, 5), "b": leaf(4)})
    write("ops_matmul.bin", a)

    nn = {}
    nn.update(run("rms_norm.", rms_norm, {"x": leaf(3, 4, 6), "w": leaf(6)}))
    nn.update(run("layer_norm.", lambda x, w, b: F.layer_norm(x, (6,), w, b, 1e-5),
                  {"x": leaf(3, 4, 6), "w": leaf(6), "b": leaf(6)}))
    nn.update(run("softmax.", lambda x: torch.softmax(x, dim=1), {"x": leaf(3, 5, 4)}))
    nn.update(run("log_softmax.", lambda x: torch.log_softmax(x, dim=-1), {"x": leaf(4, 7)}))
    nn.update(run("rope.", lambda x: rope(x, 3, 10000.0), {"x": leaf(2, 2, 5, 8)}))
    write("ops_nn.bin", nn)

    att = {}
    att.update(run("sdpa_causal.", lambda q, k, v: sdpa(q, k, v, True),
                   {"q": leaf(2, 4, 3, 8), "k": leaf(2, 2, 5, 8), "v": leaf(2, 2, 5, 8)}))
    att.update(run("sdpa_full.", lambda q, k, v: sdpa(q, k, v, False),
                   {"q": leaf(1, 2, 4, 4), "k": leaf(1, 1, 6, 4), "v": leaf(1, 1, 6, 4)}))
    write("ops_attention.bin", att)

    loss = {}
    t = torch.tensor([1, -100, 4, 0, 2, -100])
    loss.update(run("ce.", lambda x: F.cross_entropy(x, t, ignore_index=-100), {"x": leaf(6, 5)},
                    {"t": t.float()}))
    loss.update(run("mse.", lambda p, q: F.mse_loss(p, q), {"p": leaf(3, 4), "q": leaf(3, 4)}))
    write("ops_loss.bin", loss)


if __name__ == "__main__":
    main()
