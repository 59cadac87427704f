"""PyTorch DTensor tensor-parallel peer of bench/bench_tp_step.c, for
bench/tp.sh: the same Llama (transformers' LlamaForCausalLM, f32, seeded
weights), the same token ids (bench_llama_ids' LCG, seeded by the
data-parallel rank), AdamW lr 1e-4, on gloo over the CPU, under torchrun:

    torchrun --standalone --nproc_per_node N bench/tp_peer.py --tp P [--sp] [--load DIR]
        [--steps 4 --warmup 1 --batch 4 --seq 128 --hidden 256 --layers 2 --heads 8 --ffn 768 --vocab 4096]

--load DIR: the weights of a transformers checkpoint (what bench_tp_step
--save-pretrained wrote: then both sides train the same model). The mesh is
(dp N / P, tp P). With P > 1 `parallelize_module` applies
torchtitan's Llama plan: q/k/v, gate/up ColwiseParallel, o/down
RowwiseParallel, the embedding RowwiseParallel (vocabulary-parallel), lm_head
ColwiseParallel with its logits left sharded over the vocabulary and the
cross-entropy under `loss_parallel` (never gathered); --sp adds
SequenceParallel on the norms, the layers' inputs redistributed from
Shard(1) with PrepareModuleInput and the row-parallel outputs reduce-scattered
to Shard(1). Over dp the gradients are averaged as DDP does (one all-reduce of
a flat buffer over the dp group after the backward). Per step: forward, loss,
backward, (dp all-reduce), AdamW step, zero_grad.

Rank 0 prints
    impl=torch tp=P sp=0|1 world=N step_ms_median=... cpu_ms_median=... tp_bytes_per_step=... peak_rss_mb=... loss0=...
step_ms_median: the slowest rank's median over the timed steps; cpu_ms: the
same rank's process CPU time per step; tp_bytes_per_step: what rank 0 handed
to the tensor-parallel collectives in one more step run after the timed ones
under a dispatch mode that sees DTensor's functional collectives (each
all-reduce's buffer, each all-gather's and reduce-scatter's input, as
accel's src/ops/tp_stats.h counts; the dp gradient all-reduce not counted);
peak_rss_mb: rank 0's ru_maxrss; loss0: rank 0's loss of the first step (the
initial weights: every mesh's equals one process's).
"""
import argparse
import collections
import contextlib
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from llama_peer import adamw, add_model_args, build_llama, causal_lm_labels, load_llama, rope


def lcg_ids(batch, seq, vocab, seed):
    """bench_util.h's bench_llama_ids: ids [B, T] from a 64-bit LCG."""
    out = []
    for _ in range(batch * seq):
        seed = (seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((seed >> 33) % vocab)
    return torch.tensor(out, dtype=torch.int64).view(batch, seq)


def parallelize(model, tp_mesh, sp):
    """torchtitan's Llama tensor-parallel plan (with SequenceParallel when sp)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    seq = Shard(1) if sp else Replicate()
    top = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
    }
    if sp:
        top["model.norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, top)
    for layer in model.model.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=seq),
        }
        if sp:
            plan.update({
                "input_layernorm": SequenceParallel(),
                "post_attention_layernorm": SequenceParallel(),
                # LlamaDecoderLayer calls self_attn(hidden_states=...) by keyword, mlp(x) by position
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(layer, tp_mesh, plan)
    # the attention reshapes q/k/v by head_dim (-1 heads): each rank runs its heads / tp heads
    return model


class CommBytes(TorchDispatchMode):
    """Counts the bytes handed to functional collectives (DTensor's comms)."""

    OPS = {"all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_gather_into_tensor": "all_gather",
           "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}

    def __init__(self):
        super().__init__()
        self.bytes = 0
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor desugar into its collectives first (as CommDebugMode does)
        ns, _, name = func._schema.name.partition("::")
        if ns.startswith("_c10d_functional") and name in self.OPS:
            self.bytes += args[0].numel() * args[0].element_size()
            self.counts[self.OPS[name]] += 1
        return func(*args, **(kwargs or {}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--sp", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--load", default=None, help="a transformers checkpoint (bench_tp_step's --save-pretrained)")
    add_model_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.tp < 1 or world % args.tp:
        raise SystemExit(f"tp_peer: --tp {args.tp} does not divide the {world} processes")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    dp = world // args.tp
    mesh = init_device_mesh("cpu", (dp, args.tp), mesh_dim_names=("dp", "tp"))
    model = load_llama(args.load, args) if args.load else build_llama(args)
    if args.tp > 1:
        parallelize(model, mesh["tp"], args.sp)
    opt = adamw(model)
    params = [p for p in model.parameters()]
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t
    dp_group = mesh["dp"].get_group() if dp > 1 else None
    ids = lcg_ids(args.batch, args.seq, args.vocab, 12345 + 7919 * mesh.get_local_rank("dp"))
    labels = causal_lm_labels(ids).flatten()
    pe = rope(model, args.seq)
    lp = loss_parallel if args.tp > 1 else contextlib.nullcontext

    def step():
        with lp():
            h = model.model.embed_tokens(ids)
            for layer in model.model.layers:
                h = layer(h, position_embeddings=pe)
            logits = model.lm_head(model.model.norm(h))  # [B, T, V] (tp: a DTensor sharded over V)
            loss = F.cross_entropy(logits.flatten(0, 1), labels, ignore_index=-100)
            loss.backward()
        if dp_group is not None:  # DDP's average, one bucket
            grads = [local(p.grad) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group)
            flat /= dp
            torch._foreach_copy_(grads, [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in grads]), grads)])
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    times, cpus = [], []
    dist.barrier()
    for it in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        if it == 0:
            loss0 = float(local(loss.detach()))
        if it >= args.warmup:
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    counter = CommBytes()
    with counter:
        step()
    mine = torch.tensor([statistics.median(times), statistics.median(cpus)], dtype=torch.float64)
    slowest = mine.clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        comms = " ".join(f"{k}={v}" for k, v in sorted(counter.counts.items()))
        print(f"impl=torch tp={args.tp} sp={int(args.sp)} world={world} step_ms_median={slowest[0] * 1e3:.1f} "
              f"cpu_ms_median={mine[1] * 1e3:.1f} tp_bytes_per_step={counter.bytes} "
              f"peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} "
              f"loss0={loss0:.6f} comms: {comms or 'none'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
