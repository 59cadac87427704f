#!/usr/bin/env python3
"""transformers' outputs on packed rows (DataCollatorWithFlattening's format:
several sequences a row, position ids that restart, no attention_mask), for
the tiny checkpoints of tools/gen_hf_arch_fixtures.py (tests/data/hf_arch_<name>).

    python3 tools/gen_hf_packed_fixtures.py [NAME...]   # default: every name of NAMES

Writes tests/data/hf_packed/<name>.safetensors:
    ids          [2, 20] i64  row 0: sequences of 7, 9 and 4 tokens, row 1: of
                              11, 1 and 8 (the last at positions 3..10, not 0..7:
                              a restart is any step other than +1), each row
                              DataCollatorWithFlattening's of its sequences
    pos          [2, 20] i64  their position_ids
    logits       [2, 20, V]   model(ids, position_ids=pos, use_cache=False).logits:
                              each sequence attends within itself (transformers'
                              packed-sequence mask; the windows of 8 bite in the
                              9- and 11-token ones)
    cache_logits [2, 20, V]   the same with use_cache=True (the configs' default):
                              transformers detects no packing with a cache and
                              attends over the whole row
    loss, g.<param>           model(ids, position_ids=pos, labels=the collator's
                              labels (-100 at each sequence's first token),
                              use_cache=False).loss and every gradient (mixtral:
                              plus the routers' load-balancing loss over every token)
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening
from transformers.core_model_loading import revert_weight_conversion

NAMES = ["llama_linear", "mistral", "qwen2_window", "gemma2", "gpt2_long", "mixtral", "neox"]
ROWS = [[7, 9, 4], [11, 1, 8]]
# (row, sequence): a first position other than 0
START = {(1, 2): 3}
DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data")


def packed_batch(vocab, seed):
    """ids, position_ids, labels [len(ROWS), T]: each row the collator's flattening of its sequences."""
    g = torch.Generator().manual_seed(seed)
    collate = DataCollatorWithFlattening(return_tensors="pt")
    rows = []
    for r, lengths in enumerate(ROWS):
        seqs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
        b = collate([{"input_ids": s, "labels": s} for s in seqs])
        at = 0
        for s, n in enumerate(lengths):
            b["position_ids"][0, at:at + n] += START.get((r, s), 0)
            at += n
        rows.append(b)
    return tuple(torch.cat([b[k] for b in rows]) for k in ("input_ids", "position_ids", "labels"))


def main():
    names = sys.argv[1:] or NAMES
    os.makedirs(os.path.join(DATA, "hf_packed"), exist_ok=True)
    for name in names:
        model = AutoModelForCausalLM.from_pretrained(os.path.join(DATA, "hf_arch_" + name),
                                                     dtype=torch.float32).eval()
        ids, pos, labels = packed_batch(model.config.vocab_size, 900 + NAMES.index(name))
        out = {"ids": ids, "pos": pos}
        balance = getattr(model.config, "output_router_logits", False)
        model.config.output_router_logits = False
        with torch.no_grad():
            out["logits"] = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
            out["cache_logits"] = model(input_ids=ids, position_ids=pos, use_cache=True).logits.float()
        model.config.output_router_logits = balance
        loss = model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False).loss
        loss.backward()
        out["loss"] = loss.detach().float()
        grads = {n: p.grad.detach().float() for n, p in model.named_parameters()}
        for n, t in revert_weight_conversion(model, grads).items():
            out["g." + n] = t
        path = os.path.join(DATA, "hf_packed", name + ".safetensors")
        save_file({k: t.contiguous() for k, t in out.items()}, path)
        differ = float((out["logits"] - out["cache_logits"]).abs().max())
        print(f"{path}: {os.path.getsize(path)} bytes, loss {float(loss):.6g}, packed vs whole-row logits "
              f"differ by {differ:.3g}")


if __name__ == "__main__":
    main()
