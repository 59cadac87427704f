#!/usr/bin/env python3
"""Expected `accelerate to-fsdp2` conversions for tests/test_cli_to_fsdp2.c.

Generates configs (a fixed seed): fsdp_config with FSDP1's keys in random
order and subsets, each with values of every YAML kind (strategy names, other
strings, booleans, ints, floats, null, lists, mappings, empty ones), unknown
keys beside them, fsdp_version 1 / 2 / 2.0 / "2" / true, both
fsdp_sharding_strategy and fsdp_reshard_after_forward, and configs with no
fsdp_config or an empty / null / false one. Each is written as YAML, converted
by Accelerate's own convert_config_to_fsdp2 and written with yaml.dump, as
`accelerate to-fsdp2` does, into tests/data/to_fsdp2_cases.json:
    {"input": yaml text, "output": yaml text, "warnings": stderr lines}
The C test runs `accel to-fsdp2 --config_file IN --output_file OUT` on each and
compares the file and the warnings byte for byte.
Run: python3 tools/gen_to_fsdp2_cases.py
"""
import io
import json
import logging
import os
import random

import yaml
from accelerate.commands.to_fsdp2 import convert_config_to_fsdp2

FSDP1_KEYS = [
    "fsdp_version", "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_backward_prefetch",
    "fsdp_forward_prefetch", "fsdp_cpu_ram_efficient_loading", "fsdp_offload_params", "fsdp_sharding_strategy",
    "fsdp_state_dict_type", "fsdp_sync_module_states", "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params", "fsdp_use_orig_params", "fsdp_activation_checkpointing",
]
STRATEGIES = ["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "NO_SHARD"]


def value(rng, depth=0):
    kind = rng.randrange(12 if depth < 1 else 8)
    if kind == 0:
        return rng.choice(STRATEGIES)
    if kind == 1:
        return rng.choice(["BACKWARD_PRE", "TRANSFORMER_BASED_WRAP", "LlamaDecoderLayer", "no", "yes", "1e-5",
                           "", "full_shard", "x y", "2", "null", "~", "é"])
    if kind == 2:
        return rng.random() < 0.5
    if kind == 3:
        return rng.choice([0, 1, 2, -3, 100000000, 1 << 40])
    if kind == 4:
        return rng.choice([0.5, 2.0, 1e-05, 1e16, -0.0, 3.25])
    if kind == 5:
        return None
    if kind == 6:
        return rng.choice(STRATEGIES).lower()
    if kind == 7:
        return rng.choice([[], {}])
    if kind in (8, 9):
        return [value(rng, depth + 1) for _ in range(rng.randrange(1, 4))]
    return {f"k{i}": value(rng, depth + 1) for i in range(rng.randrange(1, 4))}


def fsdp_config(rng):
    keys = rng.sample(FSDP1_KEYS, rng.randrange(1, len(FSDP1_KEYS) + 1))
    keys += [f"extra_{i}" for i in range(rng.randrange(0, 3))]
    rng.shuffle(keys)
    c = {}
    for k in keys:
        if k == "fsdp_version":
            c[k] = rng.choice([1, 1, 2, 2.0, "2", True, 3])
        elif k in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward"):
            # hashable values only: Accelerate's value map raises TypeError on a list or mapping
            # (accel keeps it as it is: tested by hand in the C test)
            c[k] = rng.choice(STRATEGIES + [1, True, False, None, "other", 2.5])
        else:
            c[k] = value(rng)
    return c


def config(rng, i):
    c = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "no",
         "num_processes": rng.randrange(1, 9)}
    if rng.random() < 0.3:
        c["main_process_ip"] = None
    if rng.random() < 0.3:
        c["deepspeed_config"] = {}
    if i % 10 == 9:
        c["fsdp_config"] = rng.choice([{}, None, False, 0])
    elif i % 10 != 8:
        c["fsdp_config"] = fsdp_config(rng)
    return c


def main():
    rng = random.Random(20261206)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("accelerate.commands.to_fsdp2")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    cases = []
    for i in range(200):
        text = yaml.dump(config(rng, i))
        log.seek(0)
        log.truncate()
        out = yaml.dump(convert_config_to_fsdp2(yaml.safe_load(text)))
        cases.append({"input": text, "output": out, "warnings": log.getvalue()})
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "to_fsdp2_cases.json")
    with open(path, "w") as f:
        json.dump(cases, f, indent=0, ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} cases -> {path}")


if __name__ == "__main__":
    main()
