"""PyTorch FSDP peer for bench/zero.sh: the Llama training step of
bench_ddp_step (same config, AdamW lr 1e-4, f32) sharded with FSDP on CPU
over gloo, under torchrun.

    torchrun --standalone --nproc_per_node 2 bench/zero_peer.py [--fsdp 2|1] [--threads 1]
        [--steps 4 --warmup 2 --batch 8 --seq 256 --hidden 512 --layers 8 --heads 8 --ffn 1536 --vocab 8192]

--fsdp 2 (default): FSDP2 `fully_shard` on every decoder layer, then the root
(reshard_after_forward=True: ZeRO-3). --fsdp 1: FSDP1 FullyShardedDataParallel
with FULL_SHARD and the decoder layers as wrap units. Every rank prints
    rank R peak_rss_mb=...
and rank 0 the summary line
    peer=pytorch-fsdpN world=W threads=T step_ms_median=... cpu_ms_median=... loss=...
(step_ms_median: rank 0's median; FSDP steps are lock-step).
"""
import argparse
import functools
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from llama_peer import adamw, add_model_args, build_llama


def shard_fsdp2(model):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return model


def shard_fsdp1(model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=policy,
                device_id=torch.device("cpu"), use_orig_params=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdp", choices=["1", "2"], default="2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    add_model_args(ap)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_llama(args)
    model = shard_fsdp2(model) if args.fsdp == "2" else shard_fsdp1(model)
    opt = adamw(model)
    gen = torch.Generator().manual_seed(1234 + rank)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    times, cpus = [], []
    for step in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        print(f"rank {rank} step {step}{' (warm-up)' if step < args.warmup else ''}: {dt * 1e3:.1f} ms "
              f"cpu {dc * 1e3:.1f} ms loss {loss.item():.4f}", flush=True)
        if step >= args.warmup:
            times.append(dt)
            cpus.append(dc)
    print(f"rank {rank} peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}", flush=True)
    dist.barrier()
    if rank == 0:
        print(f"peer=pytorch-fsdp{args.fsdp} world={world} threads={args.threads} "
              f"step_ms_median={statistics.median(times) * 1e3:.1f} "
              f"cpu_ms_median={statistics.median(cpus) * 1e3:.1f} loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
