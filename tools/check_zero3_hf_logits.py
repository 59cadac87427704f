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
every logit matches within --tolerance (1e-4) and no weight is missing or unexpected; --verdict writes the result as JSON
(tests/data/zero3/hf_logits_verdict.json is one such run).

Under tensor parallelism (--tolerance 1e-5: the bar docs/parallelism.md records):

    ACCEL_TP_KEEP=1 build/bin/test_accelerator_tp            # prints "kept DIR" per mesh
    python3 tools/check_zero3_hf_logits.py DIR --tolerance 1e-5 \
        --model "tiny Llama trained 5 SGD steps, dp_shard 2 x tp 2 ZeRO-3" --verdict OUT.json

DIR holds save_model's output of the tiny Llama trained on that mesh and
accel_logits.safetensors: the tp model's logits (each rank's vocabulary
columns gathered over the tp group) for the ids [2, 8].

A 16-bit save (stage3_gather_16bit_weights_on_model_save under bf16/fp16):

    accel launch --num_processes 2 --use_deepspeed --zero_stage 3 \
        --zero3_save_16bit_model true --mixed_precision bf16 \
        build/tests/test_accelerator_zero3_checkpoint save16 DIR BF16
    python3 tools/check_zero3_hf_logits.py DIR/z3_model --masters DIR/masters \
        --expect-dtype bfloat16 --verdict OUT.json

accel's logits are then those of the weights rounded to 16 bits; --masters
names the f32 masters (accel_save_module of the gathered model): every saved
tensor must equal torch's rounding of its master (.to(dtype)), and
--expect-dtype the saved tensors' dtype (tests/data/zero3/hf_logits_16bit_verdict.json).
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
    ap.add_argument("--masters", help="a folder with the f32 masters' model.safetensors")
    ap.add_argument("--expect-dtype", help="the dtype every saved tensor must have (e.g. bfloat16)")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="the largest |logit difference| accepted")
    ap.add_argument("--model", default="Llama, 2 layers, hidden 16, vocab 40, tied embeddings, trained 2 AdamW "
                    "steps under ZeRO-3", help="what DIR's model is, recorded in the verdict")
    args = ap.parse_args()
    want = load_file(f"{args.model_dir}/accel_logits.safetensors")
    saved = load_file(f"{args.model_dir}/model.safetensors")
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in saved.values()})
    rounded = None
    if args.masters:
        masters = load_file(f"{args.masters}/model.safetensors")
        rounded = saved.keys() == masters.keys() and all(
            torch.equal(masters[k].to(t.dtype), t) for k, t in saved.items())
    model, info = LlamaForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32,
                                                   output_loading_info=True)
    model.eval()
    missing = sorted(set(info["missing_keys"]) - {"lm_head.weight"})  # tied: lm_head is embed_tokens
    with torch.no_grad():
        got = model(want["ids"]).logits
    diff = (got - want["logits"]).abs().max().item()
    verdict = {
        "model": args.model,
        "loaded_by": "transformers.LlamaForCausalLM.from_pretrained",
        "saved_by": args.saved_by,
        "parameters": sum(p.numel() for p in model.parameters()),
        "missing_keys": missing,
        "unexpected_keys": sorted(info["unexpected_keys"]),
        "logits_shape": list(got.shape),
        "max_abs_diff": diff,
        "tolerance": args.tolerance,
        "saved_dtypes": dtypes,
        "ok": diff <= args.tolerance and not missing and not info["unexpected_keys"],
    }
    if args.expect_dtype:
        verdict["ok"] = verdict["ok"] and dtypes == [args.expect_dtype]
    if rounded is not None:
        verdict["masters_rounded_by_torch_equal_saved"] = rounded
        verdict["ok"] = verdict["ok"] and rounded
    print(json.dumps(verdict, indent=2))
    if args.verdict:
        with open(args.verdict, "w") as f:
            json.dump(verdict, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
