#!/usr/bin/env python3
"""What GPT-2's reorder_and_upcast_attn changes in the installed transformers
(docs/nn.md, GPT-2): the attention implementation from_config and
from_pretrained pick by default, and whether the flag moves the logits of the
tests/data/hf_arch_gpt2_layer_scale checkpoint (which sets it) in bf16, under
bf16 autocast and in f32, with a left-padded attention_mask, under that
default (SDPA) and under eager attention.

    python3 tools/check_gpt2_upcast_unread.py

Prints each max |logits(flag) - logits(no flag)|; exits non-zero unless the
default is SDPA and the flag changes nothing there, while it does change the
bf16 logits under eager (where transformers reads it): accel, which keeps the
flag unread, then does what a user of the default gets.
"""
import os
import sys
import warnings

import torch
from transformers import AutoModelForCausalLM

DIR = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "hf_arch_gpt2_layer_scale")


def logits(model, ids, mask, mode):
    m = model.to(torch.bfloat16) if mode == "bf16" else model.float()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
        return m(input_ids=ids, attention_mask=mask).logits.float()


def main():
    warnings.filterwarnings("ignore")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 900, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    default = AutoModelForCausalLM.from_pretrained(DIR).config._attn_implementation
    print(f"from_pretrained's attention: {default}")
    ok = default == "sdpa"
    for impl in ("sdpa", "eager"):
        on = AutoModelForCausalLM.from_pretrained(DIR, attn_implementation=impl).eval()
        off = AutoModelForCausalLM.from_pretrained(DIR, attn_implementation=impl).eval()
        off.config.reorder_and_upcast_attn = False
        for layer in off.transformer.h:
            layer.attn.reorder_and_upcast_attn = False
        for mode in ("f32", "autocast", "bf16"):
            d = float((logits(on, ids, mask, mode) - logits(off, ids, mask, mode)).abs().max())
            print(f"{impl:5} {mode:8}: max |flag - no flag| = {d:.3g}")
            if impl == "sdpa":
                ok &= d == 0
            elif mode == "bf16":
                ok &= d > 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
