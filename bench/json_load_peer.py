#!/usr/bin/env python3
"""The JSON file of bench/json_load.sh, and Python's json.load as the peer.

    json_load_peer.py make FILE MB      writes a DeepSpeed-config-like JSON of about MB megabytes
    json_load_peer.py load FILE ROUNDS  prints name=python_json_load ms=<median> cpu_ms=<median> min_ms=...
"""
import json
import statistics
import sys
import time


def make(path, mb):
    # A DeepSpeed config with a large safetensors-index-like weight map and
    # per-layer tables of numbers: keys, strings, ints, floats and nesting.
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
        "bf16": {"enabled": True},
        "weight_map": {},
        "layer_stats": [],
    }
    size, i = 0, 0
    target = mb * 1000 * 1000
    while size < target:
        for part in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            key = f"model.layers.{i}.self_attn.{part}.weight"
            cfg["weight_map"][key] = f"model-{i % 97 + 1:05d}-of-00097.safetensors"
            size += len(key) + 45  # as json.dump(indent=2) writes it
        cfg["layer_stats"].append({"layer": i, "scale": [((i * 7 + k) % 1000) / 997.0 for k in range(16)],
                                   "name": f"layer_{i}", "frozen": i % 3 == 0})
        size += 16 * 29 + 110
        i += 1
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def load(path, rounds):
    wall, cpu = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        with open(path) as f:
            json.load(f)
        wall.append((time.perf_counter() - w0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    print(f"name=python_json_load ms={statistics.median(wall):.1f} cpu_ms={statistics.median(cpu):.1f} "
          f"min_ms={min(wall):.1f} rounds={rounds} python={sys.version.split()[0]}")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    else:
        load(sys.argv[2], int(sys.argv[3]))
