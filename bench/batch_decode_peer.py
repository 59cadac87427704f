#!/usr/bin/env python3
"""Peer for bench/batch_decode.sh: transformers' generate on a left-padded batch.

    batch_decode_peer.py CKPT --new-tokens N --ids 1,2,3 [--ids 4,5 ...]

LlamaForCausalLM.from_pretrained (f32), the prompts left-padded with 0 and
their attention_mask, one warm-up generate of 2 new tokens, then
generate(max_new_tokens=1) (the prompt's forward and first token) and the
whole greedy generation with the KV cache, in no_grad. Prints each row's
ids without its pads (generated_ids[b]=[...]), first_token_ms,
decode_tokens_per_s: every row's new tokens after the first over the whole
generation's time less the first token's (as examples/generate counts them),
and decode_tokens_per_cpu_s: the same over the process's CPU time.
"""
import argparse
import time

import torch
from transformers import LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--ids", action="append", required=True)
    a = ap.parse_args()
    rows = [[int(t) for t in s.split(",")] for s in a.ids]
    T = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (T - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows])
    model = LlamaForCausalLM.from_pretrained(a.ckpt, dtype=torch.float32).eval()
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, **kw)
        t0, c0 = time.perf_counter(), time.process_time()
        model.generate(ids, max_new_tokens=1, **kw)
        t1, c1 = time.perf_counter(), time.process_time()
        out = model.generate(ids, max_new_tokens=a.new_tokens, **kw)
        t2, c2 = time.perf_counter(), time.process_time()
    n_new = out.shape[1] - T
    for b, r in enumerate(rows):
        print(f"generated_ids[{b}]=[{', '.join(str(int(t)) for t in out[b, T - len(r):])}]")
    first, toks = t1 - t0, len(rows) * (n_new - 1)
    print(f"first_token_ms={first * 1e3:.2f} decode_tokens_per_s={toks / ((t2 - t1) - first):.1f} "
          f"decode_tokens_per_cpu_s={toks / ((c2 - c1) - (c1 - c0)):.1f}")


if __name__ == "__main__":
    main()
