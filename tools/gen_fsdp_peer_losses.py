#!/usr/bin/env python3
"""The peer of tests/test_fsdp_peer.c: transformers + Accelerate fine-tune a
tiny non-Llama checkpoint on 2 CPU processes (gloo) for a few AdamW steps on
fixed ids, and write the per-step, per-rank losses as a fixture; accel's FSDP
FULL_SHARD must reproduce them.

    OMP_NUM_THREADS=1 accelerate launch --config_file tools/fsdp_peer_cpu.yaml \\
        tools/gen_fsdp_peer_losses.py tests/data/hf_arch_qwen2 tests/data/hf_fsdp_peer_qwen2.safetensors

Accelerate (1.16) cannot run FSDP on CPU: AcceleratorState turns
ACCELERATE_USE_FSDP into DistributedType.FSDP only when the process group is
on an accelerator (MULTI_GPU, MULTI_NPU, MULTI_XPU, ...); a CPU job stays
MULTI_CPU, i.e. DDP, whatever the FSDP config says. So the fixture is
Accelerate's DDP over gloo. FSDP averages the ranks' gradients as DDP does; to
show it on these numbers the script also trains with torch's own FSDP
(FULL_SHARD, each decoder layer a unit: what Accelerate's FSDP plugin sets up
on an accelerator) on the same process group, and fails unless its losses
equal Accelerate's within 1e-6 relative (on torch 2.15 they are bit-identical).

MODEL_DIR: a from_pretrained directory (tests/data/hf_arch_qwen2). OUT gets
    ids     [STEPS, 2, B, T] i64  rank r's batch of step s is ids[s, r] (the
                                  same every step: the model fits it)
    losses_adamw [STEPS, 2] f32   rank r's loss of step s (before its update),
                                  AdamW(lr 1e-2, betas (0.9, 0.999), eps 1e-8,
                                  weight_decay 0)
    losses_sgd   [STEPS, 2] f32   the same from the checkpoint again, SGD(lr 0.5)
The loss is transformers' model(ids, labels=ids).loss.
"""
import functools
import sys

import torch
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from accelerate import Accelerator
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

STEPS, B, T = 6, 2, 16
# AdamW as fine-tuning uses it; SGD too, whose update is proportional to the
# gradient, so a wrong gradient scale (a sum for a mean) shows in its losses
OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.5),
}


def train(acc, model_dir, ids, make_opt, torch_fsdp=False):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    if torch_fsdp:
        wrap = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={type(model.model.layers[0])})
        model = FullyShardedDataParallel(model, auto_wrap_policy=wrap, sharding_strategy=ShardingStrategy.FULL_SHARD,
                                         use_orig_params=True, device_id=torch.device("cpu"))
        opt = make_opt(model.parameters())
    else:
        model, opt = acc.prepare(model, make_opt(model.parameters()))
    losses = torch.zeros(STEPS, 2)
    for s in range(STEPS):
        x = ids[s, acc.process_index]
        loss = model(input_ids=x, labels=x).loss
        loss.backward() if torch_fsdp else acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses[s] = acc.gather(loss.detach().reshape(1)).cpu()
    return losses


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    acc = Accelerator(cpu=True)  # on CPU: MULTI_CPU over gloo
    assert acc.num_processes == 2, "run under accelerate launch with 2 processes"
    assert acc.distributed_type.name == "MULTI_CPU", f"expected Accelerate's CPU DDP, got {acc.distributed_type}"
    g = torch.Generator().manual_seed(2026)
    vocab = AutoModelForCausalLM.from_pretrained(model_dir).config.vocab_size
    # each rank's batch is the same every step, so the loss falls as it fits them
    ids = torch.randint(0, vocab, (1, 2, B, T), generator=g).expand(STEPS, 2, B, T).contiguous()
    out_tensors = {"ids": ids}
    for name, make_opt in OPTIMIZERS.items():
        out_tensors["losses_" + name] = train(acc, model_dir, ids, make_opt)
        fsdp = train(acc, model_dir, ids, make_opt, torch_fsdp=True)
        rel = float(((fsdp - out_tensors["losses_" + name]).abs() / fsdp.abs()).max())
        if acc.is_main_process:
            print(f"{name}: torch FSDP FULL_SHARD against Accelerate's DDP: max relative loss difference {rel:.3g}")
        assert rel <= 1e-6, f"{name}: torch FSDP's losses differ from Accelerate DDP's by {rel}"
    if acc.is_main_process:
        print(f"accelerate {acc.distributed_type.name} world {acc.num_processes} backend {acc.state.backend}")
        for k, v in out_tensors.items():
            if k != "ids":
                print(k, [[round(x, 5) for x in row] for row in v.tolist()])
        save_file({k: v.contiguous() for k, v in out_tensors.items()}, out)


if __name__ == "__main__":
    main()
