#!/usr/bin/env python3
"""Loads the PyTorch-format files accel writes with torch and transformers,
and records the verdict in tests/data/torch_save/torch_load_verdict.json.

  python3 tools/check_torch_loads_accel.py [BUILD_DIR=build]   (from the repository's root;
  ctest torch_loads_accel_nosan where torch and transformers import)

1. Runs BUILD_DIR/bin/test_torch_save with ACCEL_TORCH_SAVE_KEEP=<tmp> and
   torch.load(weights_only=True)s what it wrote: the f32/bf16/f16/scalar/empty
   dict with a tied pair (compared with tools/gen_torch_save_fixture.py's),
   the empty dict, 1001 entries, and save_model's pytorch_model-*.bin shards
   through their index (equal to the one-file save of the same model).
2. Runs BUILD_DIR/bin/save_model (a tiny tied Llama trained a few steps under
   the Accelerator, saved with save_model both ways) under `accel launch` on
   1 and 2 processes, bf16 mixed precision, ZeRO-2 and small shards, and loads
   each folder with LlamaForCausalLM.from_pretrained: no missing, unexpected
   or mismatched keys, lm_head tied, the two formats' weights and logits equal.
Exits non-zero naming the first check that failed.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from gen_torch_save_fixture import many, small  # noqa: E402

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
# ACCEL_TORCH_VERDICT: where the verdict goes ("" none: ctest's run)
VERDICT = os.environ.get("ACCEL_TORCH_VERDICT", "tests/data/torch_save/torch_load_verdict.json")
checks = []


def check(name, ok, detail=""):
    checks.append({"check": name, "ok": bool(ok), "detail": detail})
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def load(path):
    return torch.load(path, weights_only=True, map_location="cpu")


def check_unit_files(tmp):
    env = dict(os.environ, ACCEL_TORCH_SAVE_KEEP=tmp)
    subprocess.run([f"{BUILD}/bin/test_torch_save"], cwd="tests", env=env, check=True, capture_output=True)
    got, want = load(f"{tmp}/small.bin"), small()
    check("small.bin loads with torch.load(weights_only=True)", list(got) == list(want))
    check("small.bin: every tensor equal (dtype, shape, values)", all(same(got[k], want[k]) for k in want),
          ", ".join(f"{k}:{str(got[k].dtype)[6:]}{list(got[k].shape)}" for k in got))
    check("small.bin: lm_head.weight shares embed.weight's storage",
          got["lm_head.weight"].untyped_storage().data_ptr() == got["embed.weight"].untyped_storage().data_ptr())
    check("empty.bin loads as {}", load(f"{tmp}/empty.bin") == {})
    got, want = load(f"{tmp}/many.bin"), many()
    check("many.bin: 1001 entries equal", list(got) == list(want) and all(same(got[k], want[k]) for k in want))
    # save_model of one tied Llama: ints/ in 600-byte shards, bin/ in one file
    index = json.load(open(f"{tmp}/ints/pytorch_model.bin.index.json"))
    shards = {f: load(f"{tmp}/ints/{f}") for f in set(index["weight_map"].values())}
    whole = load(f"{tmp}/bin/pytorch_model.bin")
    check("sharded pytorch_model-*.bin: every name in its indexed shard, equal to the one-file save",
          set(whole) == set(index["weight_map"]) and len(shards) > 1
          and all(same(shards[f][k], whole[k]) for k, f in index["weight_map"].items()),
          f"{len(shards)} shards, {len(whole)} tensors")


def from_pretrained(path, **kw):
    model, info = LlamaForCausalLM.from_pretrained(path, output_loading_info=True, **kw)
    bad = {k: v for k, v in info.items() if v}
    return model.eval(), bad


def check_save_model(tmp, label, launch, shard):
    out = f"{tmp}/{label.replace(' ', '_')}"
    cmd = [f"{BUILD}/bin/accel", "launch", "--quiet", "--main_process_port", "0", *launch, f"{BUILD}/bin/save_model",
           out, shard]
    run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if run.returncode:
        check(f"{label}: save_model runs", False, run.stderr[-500:])
        return
    files = sorted(os.listdir(f"{out}/pytorch"))
    safe, bad_safe = from_pretrained(f"{out}/safetensors")
    pt, bad_pt = from_pretrained(f"{out}/pytorch", use_safetensors=False)
    check(f"{label}: from_pretrained(safetensors) loads every key", not bad_safe, str(bad_safe))
    check(f"{label}: from_pretrained(pytorch_model*.bin) loads every key", not bad_pt, " ".join(files))
    sa, sb = safe.state_dict(), pt.state_dict()
    check(f"{label}: both formats hold the same weights", sa.keys() == sb.keys() and all(same(sa[k], sb[k]) for k in sa))
    check(f"{label}: lm_head tied after loading the .bin",
          pt.lm_head.weight.data_ptr() == pt.model.embed_tokens.weight.data_ptr())
    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
    with torch.no_grad():
        check(f"{label}: logits equal", torch.equal(safe(ids).logits, pt(ids).logits))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(f"{tmp}/unit")
        check_unit_files(f"{tmp}/unit")
        for label, launch, shard in [
            ("1 process", ["--num_processes", "1"], "10GB"),
            ("2 processes", ["--num_processes", "2"], "10GB"),
            ("2 processes bf16", ["--num_processes", "2", "--mixed_precision", "bf16"], "10GB"),
            ("2 processes ZeRO-2", ["--num_processes", "2", "--use_deepspeed", "--zero_stage", "2"], "10GB"),
            ("2 processes 20KB shards", ["--num_processes", "2"], "20KB"),
        ]:
            check_save_model(tmp, label, launch, shard)
    verdict = {"torch": torch.__version__, "transformers": transformers.__version__,
               "all_ok": all(c["ok"] for c in checks), "checks": checks}
    if VERDICT:
        with open(VERDICT, "w") as f:
            json.dump(verdict, f, indent=2)
            f.write("\n")
        print(f"wrote {VERDICT}")
    return 0 if verdict["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
