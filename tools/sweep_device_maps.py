"""A generated sweep of accel's device maps against Accelerate's infer_auto_device_map.

For random small configs of every decoder family (the generator of
tools/sweep_estimate_memory.py), random budgets (0-3 GPUs, the cpu, the disk,
each a random share of the model's size) and each strategy (auto, balanced,
balanced_low_0, sequential), the map is computed twice:

  accel     build/bin/device_map_probe (tools/device_map_probe.c): the map
            accel_llama_from_pretrained builds for that directory, strategy and
            budgets, without loading a weight
  peer      what transformers' from_pretrained(device_map=...) asks of Accelerate:
            AutoModelForCausalLM.from_config under init_empty_weights, then
            get_balanced_memory (all but sequential; low_zero for
            balanced_low_0) and infer_auto_device_map with the model's
            _no_split_modules

The maps are compared entry by entry and in order; an error on one side must
be an error on the other. Two differences are by design and taken out of the
peer's: the modules without a weight transformers keeps (the rotary embedding,
dropouts), which accel's model lacks, are dropped from its map, and its
buffers (the rotary tables, Gemma's embedding scale: a few hundred bytes that
accel computes instead of keeping) are emptied before it places; how many of
Accelerate's maps those buffers moved is counted and printed (a budget within
those bytes of a boundary).

    python3 tools/sweep_device_maps.py [--probe build/bin/device_map_probe] [--n 30] [--seed 0] [--only llama]

Prints each disagreement and a summary; exit status 1 when any disagreed.
Needs torch, transformers and accelerate.
"""
import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings

import torch
import transformers
from accelerate import init_empty_weights
from accelerate.utils import compute_module_sizes, get_balanced_memory, infer_auto_device_map

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_estimate_memory import FAMILIES, drawn, refusal  # noqa: E402

DECODERS = [f for f in FAMILIES if f not in ("bert", "roberta", "xlm-roberta")]
STRATEGIES = ["auto", "balanced", "balanced_low_0", "sequential"]
# transformers 5 renames GPT-NeoX's head module (its checkpoints still say embed_out.weight)
NEOX_HEAD = {"lm_head": "embed_out"}


def budgets(r, total):
    """Random budgets in bytes: GPU indices first, then cpu, then disk (the order Accelerate sorts them in)."""
    share = lambda: max(1, int(total * r.choice([0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5])))
    mm = {}
    for i in range(r.choice([0, 1, 1, 2, 2, 3])):
        mm[i] = share()
    if r.random() < 0.9:
        mm["cpu"] = share() if r.random() < 0.6 else 10 * total
    if r.random() < 0.4:
        mm["disk"] = 100 * total
    return mm


def model_size(config, _):
    """The bytes of the model transformers builds for config; ValueError for a config accel refuses by design."""
    if refusal(config.model_type, config):
        raise ValueError("refused by design")
    with init_empty_weights():
        return compute_module_sizes(transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32))[""]


def peer_map(model_type, config, strategy, mm, buffers):
    """buffers False: transformers' buffers emptied first (the rotary tables, Gemma's embedding
    scale), which accel computes instead of keeping and so places nothing for."""
    with init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # from_pretrained ties before it places (from_config on meta does not)
    for mod in model.modules():
        for name, _ in list(mod.named_buffers(recurse=False)) if not buffers else []:
            setattr(mod, name, torch.empty(0, device="meta"))
    no_split = model._no_split_modules
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        warnings.simplefilter("ignore")
        if strategy != "sequential":
            mm = get_balanced_memory(model, max_memory=dict(mm), no_split_module_classes=no_split,
                                     low_zero=strategy == "balanced_low_0")
        placed = infer_auto_device_map(model, max_memory=dict(mm), no_split_module_classes=no_split)
    # accel computes the rotary tables instead of keeping transformers' buffers, and keeps no
    # module without weights (dropouts: GPT-2's drop, Phi's embed_dropout): nothing to place
    head = NEOX_HEAD if model_type == "gpt_neox" else {}
    weightless = lambda k: k and not any(True for _ in model.get_submodule(k).parameters())
    return [(head.get(k, k), v) for k, v in placed.items() if not weightless(k)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", default="build/bin/device_map_probe")
    ap.add_argument("--n", type=int, default=30, help="configs per family (each with every strategy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    transformers.logging.set_verbosity_error()
    probe = subprocess.Popen([a.probe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    bad = total = peer_crashed = moved_by_buffers = 0
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in DECODERS:
            if only and model_type not in only:
                continue
            r = random.Random(f"{a.seed}:{model_type}:maps")
            done = 0
            for _, config, d, size in drawn(model_type, r, a.n, tmp, model_size):
                done += 1
                for strategy in STRATEGIES:
                    mm = budgets(r, size)
                    total += 1
                    try:
                        want, err_want = peer_map(model_type, config, strategy, mm, False), None
                        moved_by_buffers += want != peer_map(model_type, config, strategy, mm, True)
                    except Exception as e:  # noqa: BLE001 - the peer's refusal is the expected outcome
                        want, err_want = None, f"{type(e).__name__}: {e}"
                    if err_want and "device string: disk" in err_want:
                        peer_crashed += 1  # get_balanced_memory calls torch.device("disk"): no map to compare
                        continue
                    spec = ",".join(f"{k}={v}" for k, v in mm.items())
                    probe.stdin.write(f"{d}\t{strategy}\t{spec}\n")
                    line = probe.stdout.readline().rstrip("\n")
                    got = None if line.startswith("ERROR ") else list(json.loads(line).items())
                    if (got is None) != (want is None) or (got is not None and got != want):
                        bad += 1
                        print(f"DISAGREE {model_type} {strategy} budgets={mm} config={config.to_json_string()!r}")
                        print(f"  accel:      {line}")
                        print(f"  accelerate: {json.dumps(dict(want)) if want is not None else err_want}")
            print(f"{model_type}: {done} configs", file=sys.stderr)
    probe.stdin.close()
    probe.wait()
    print(f"{total} maps ({peer_crashed} of them a balanced strategy over a disk budget, which Accelerate's "
          f"get_balanced_memory fails on: not compared), {bad} disagreed; transformers' buffers moved "
          f"{moved_by_buffers} of Accelerate's maps")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
