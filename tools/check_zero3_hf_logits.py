#!/usr/bin/env python3
"""save_model under ZeRO-3 / FULL_SHARD writes a Hugging Face model: check that
transformers loads it and computes accel's logits.

    ACCEL_Z3_KEEP=1 accel launch --num_processes 2 --use_fsdp \\
        build/tests/test_accelerator_zero3_checkpoint        # prints "kept DIR"
    python3 tools/check_zero3_hf_logits.py DIR/z3_model [--verdict OUT.json]

DIR/z3_model holds what accel_accelerator_save_model wrote for a two-layer
Llama with tied embeddings trained two steps under ZeRO-3 (model.safetensors,
the real weights gathered unit by unit), config.json, and
accel_logits.safetensors (ids [2, 7] and accel's logits for them, computed on
the gathered model). The script loads the folder with
LlamaForCausalLM.from_pretrained, runs the ids and compares. Exit status 0 when
every logit matches within 1e-4 and no weight is missing or unexpected; --verdict writes the result as JSON
(tests/data/zero3/hf_logits_verdict.json is one such run).
"""
import argparse
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--verdict")
    ap.add_argument("--saved-by", default="", help="how DIR was made, recorded in the verdict")
    args = ap.parse_args()
    want = load_file(f"{args.model_dir}/accel_logits.safetensors")
    model, info = LlamaForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32,
                                                   output_loading_info=True)
    model.eval()
    missing = sorted(set(info["missing_keys"]) - {"lm_head.weight"})  # tied: lm_head is embed_tokens
    with torch.no_grad():
        got = model(want["ids"]).logits
    diff = (got - want["logits"]).abs().max().item()
    verdict = {
        "model": "Llama, 2 layers, hidden 16, vocab 40, tied embeddings, trained 2 AdamW steps under ZeRO-3",
        "loaded_by": "transformers.LlamaForCausalLM.from_pretrained",
        "saved_by": args.saved_by,
        "parameters": sum(p.numel() for p in model.parameters()),
        "missing_keys": missing,
        "unexpected_keys": sorted(info["unexpected_keys"]),
        "logits_shape": list(got.shape),
        "max_abs_diff": diff,
        "tolerance": 1e-4,
        "ok": diff <= 1e-4 and not missing and not info["unexpected_keys"],
    }
    print(json.dumps(verdict, indent=2))
    if args.verdict:
        with open(args.verdict, "w") as f:
            json.dump(verdict, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
