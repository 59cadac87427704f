#!/usr/bin/env python3
"""Peer for bench/bench_bigmodel.sh: Accelerate + transformers on the seed's
20-layer checkpoint (examples/save_fake_llama).

    bigmodel_peer.py first-logits CKPT [--devices cpu,disk]
        init_empty_weights skeleton, load_checkpoint_and_dispatch with the
        seed's explicit two-device map (embed + layers 0-9 on A, layers 10-19 +
        norm + lm_head on B; "disk" needs an offload folder: a temp dir), one
        forward on [[1, 2, 3]]; prints process_to_logits_ms (since the process
        started, imports included, like the C example).
    bigmodel_peer.py decode CKPT [--new-tokens 32] [--dtype float32|bfloat16] [--ids 1,2,3] [--first-reps N]
        LlamaForCausalLM.from_pretrained in that dtype, then
        bench/peer_decode.py's greedy_decode (greedy generate with the KV
        cache); prints load_ms (from_pretrained), generated_ids, first_token_ms,
        first_token_cpu_ms (medians of N first tokens) and decode_tokens_per_s (new tokens after the first / their time, the
        prompt's forward and first token taken out as examples/generate does).
        Used by bench/bench_bigmodel.sh and bench/decode.sh.
"""
import argparse
import os
import tempfile
import time

from peer_decode import greedy_decode  # bench/, the script's directory


def since_process_start():
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22 of stat: starttime
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")


def first_logits(ckpt, devices):
    import torch
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    from transformers import LlamaConfig, LlamaForCausalLM

    a, b = devices.split(",")
    config = LlamaConfig.from_pretrained(ckpt)
    n = config.num_hidden_layers
    device_map = {"model.embed_tokens": a}
    device_map.update({f"model.layers.{i}": a if i < n // 2 else b for i in range(n)})
    device_map.update({"model.norm": b, "lm_head": b})
    with init_empty_weights():
        skeleton = LlamaForCausalLM(config)
    with tempfile.TemporaryDirectory() as off:
        model = load_checkpoint_and_dispatch(skeleton, checkpoint=ckpt, device_map=device_map,
                                             no_split_module_classes=["LlamaDecoderLayer"],
                                             offload_folder=off)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([[1, 2, 3]])).logits
        t = since_process_start()
    print(f"out_shape={list(out.shape)}")
    print(f"process_to_logits_ms={t * 1e3:.1f}")


def decode(ckpt, new_tokens, dtype, prompt, first_reps):
    import torch
    from transformers import LlamaForCausalLM

    t_load = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, dtype)).eval()
    print(f"load_ms={(time.perf_counter() - t_load) * 1e3:.1f}")
    greedy_decode(model, prompt, new_tokens, first_reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["first-logits", "decode"])
    ap.add_argument("ckpt")
    ap.add_argument("--devices", default="cpu,disk")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--ids", default="1,2,3")
    ap.add_argument("--first-reps", type=int, default=1)
    a = ap.parse_args()
    if a.mode == "first-logits":
        first_logits(a.ckpt, a.devices)
    else:
        decode(a.ckpt, a.new_tokens, a.dtype, a.ids, a.first_reps)


if __name__ == "__main__":
    main()
