"""torch.distributed.pipelining peer of bench/bench_pipeline.c, for
bench/pipeline.sh: the same Llama (f32, untied; the weights accel's run wrote
with --save-pretrained, or transformers' init of the same config), the same
ids per step, SGD lr 0.01, the schedules ScheduleGPipe, Schedule1F1B and
ScheduleInterleaved1F1B, on gloo over the CPU, one process per stage, under
torchrun:

    torchrun --standalone --nproc_per_node P bench/pipeline_peer.py [--schedule 1f1b|gpipe|interleaved]
        [--virtual-stages V] [--micro-batches M] [--steps N] [--load DIR] [--no-recompute]
        [--batch 16 --seq 32 --hidden 128 --layers 8 --vocab 2048]

The stages are cut as accel cuts them: by parameter count (the embedding on
the first, the final norm and lm_head on the last; the contiguous split with
the smallest largest stage, the first such), interleaved into P x V equal
chunks, rank r holding chunks r, r + P, ... Each stage recomputes its forward
in the backward (torch.utils.checkpoint over the whole stage), as accel's
stages do (Megatron's full recomputation); --no-recompute keeps the
activations instead (torch.distributed.pipelining's default). The loss is
transformers' ForCausalLMLoss per micro-batch, the gradients scaled by 1 / M
(scale_grads), so a step's gradients are the whole batch's mean loss's, as
accel's. Per step each rank times schedule.step (wall, and its process CPU
time); the optimizer step is outside, as it is outside accel's report. Rank 0
prints, medians over the steps after the first (a warm-up):
    stage=s layers=[a,b) chunks=v cpu_ms=... idle_cpu=...
    impl=torch schedule=... p=P v=V m=M bubble_theory=... step_ms=... cpu_ms=... recompute=0|1
    losses=l0,l1,...
(step_ms: the slowest stage's wall; cpu_ms: the stages' CPU summed; idle_cpu =
1 - cpu / wall, the figure bench_pipeline also prints for accel).
"""
import argparse
import itertools
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from llama_peer import causal_lm_labels, load_llama, rope


def batch_ids(step, batch, seq, vocab):
    """bench_pipeline's ids of step s: (i * 2654435761 + s * 97) % V."""
    i = torch.arange(batch * seq, dtype=torch.int64)
    return ((i * 2654435761 + step * 97) % vocab).view(batch, seq)


def balanced_split(model, stages):
    """Layer bounds [0, ..., L] of `stages` contiguous stages, the largest
    stage's parameter count smallest (embedding on the first stage, final
    norm and lm_head on the last)."""
    count = lambda m: sum(p.numel() for p in m.parameters())
    layers = [count(layer) for layer in model.model.layers]
    first, last = count(model.model.embed_tokens), count(model.model.norm) + count(model.lm_head)
    best = None
    for cuts in itertools.combinations(range(1, len(layers)), stages - 1):
        b = (0,) + cuts + (len(layers),)
        sizes = [sum(layers[b[s]:b[s + 1]]) for s in range(stages)]
        sizes[0] += first
        sizes[-1] += last
        if best is None or max(sizes) < best[0]:
            best = (max(sizes), b)
    return list(best[1])


class Stage(torch.nn.Module):
    """Layers [lo, hi) of model; the first chunk embeds ids [b, T], the last
    returns logits [b, T, V]; the others map hidden states [b, T, C]."""

    def __init__(self, model, lo, hi, first, last, pe, recompute):
        super().__init__()
        self.embed = model.model.embed_tokens if first else None
        self.layers = torch.nn.ModuleList(model.model.layers[lo:hi])
        self.norm = model.model.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.pe, self.recompute = pe, recompute

    def run(self, x):
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers:
            h = layer(h, position_embeddings=self.pe)
        return self.lm_head(self.norm(h)) if self.lm_head is not None else h

    def forward(self, x):
        return checkpoint(self.run, x, use_reentrant=False) if self.recompute else self.run(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved"], default="1f1b")
    ap.add_argument("--virtual-stages", type=int, default=0)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--load", default=None, help="a transformers checkpoint (accel's --save-pretrained)")
    ap.add_argument("--no-recompute", action="store_true")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    from transformers import LlamaConfig, LlamaForCausalLM

    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    if args.load:
        model = load_llama(args.load, args)
    else:  # bench_pipeline's config (heads 8, ffn 3 C), transformers' init
        torch.manual_seed(1)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
            num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8,
            max_position_embeddings=args.seq, rms_norm_eps=1e-6, tie_word_embeddings=False,
            attn_implementation="sdpa"))
    model.train()
    v = args.virtual_stages if args.schedule == "interleaved" else 1
    v = v or 2
    chunks = p * v
    if v == 1:
        bounds = balanced_split(model, p)
    else:
        if args.layers % chunks:
            raise SystemExit(f"pipeline_peer: {args.layers} layers do not cut into {chunks} equal chunks")
        bounds = list(range(0, args.layers + 1, args.layers // chunks))
    pe = rope(model, args.seq)
    recompute = not args.no_recompute
    mine = list(range(rank, chunks, p))
    stages = [PipelineStage(Stage(model, bounds[c], bounds[c + 1], c == 0, c == chunks - 1, pe, recompute),
                            c, chunks, torch.device("cpu")) for c in mine]
    loss_fn = lambda logits, target: F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
    if args.schedule == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, args.micro_batches, loss_fn=loss_fn)
    else:
        kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
        sched = kind(stages[0], args.micro_batches, loss_fn=loss_fn)
    opt = torch.optim.SGD([q for s in stages for q in s.submod.parameters()], lr=0.01)
    first, last = 0 in mine, chunks - 1 in mine
    walls, cpus, losses = [], [], []
    for step in range(args.steps):
        ids = batch_ids(step, args.batch, args.seq, args.vocab)
        mb_losses = []
        t0, c0 = time.perf_counter(), time.process_time()
        if first and last:
            sched.step(ids, target=causal_lm_labels(ids), losses=mb_losses)
        elif first:
            sched.step(ids)
        elif last:
            sched.step(target=causal_lm_labels(ids), losses=mb_losses)
        else:
            sched.step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        opt.step()
        opt.zero_grad(set_to_none=False)
        loss = torch.stack(mb_losses).mean().detach() if last else torch.zeros(())
        dist.broadcast(loss, src=(chunks - 1) % p)
        everyone = [torch.zeros(2, dtype=torch.float64) for _ in range(p)]
        dist.all_gather(everyone, torch.tensor([wall, cpu], dtype=torch.float64))
        walls.append([float(x[0]) for x in everyone])
        cpus.append([float(x[1]) for x in everyone])
        losses.append(float(loss))
    if rank == 0:
        timed = range(1, args.steps)
        for s in range(p):
            lo, hi = bounds[s], bounds[s + 1]
            cpu_ms = statistics.median(cpus[k][s] for k in timed) * 1e3
            print(f"stage={s} layers=[{lo},{hi}) chunks={v} cpu_ms={cpu_ms:.1f} "
                  f"idle_cpu={statistics.median(1 - cpus[k][s] / walls[k][s] for k in timed):.3f}")
        print(f"impl=torch schedule={args.schedule} p={p} v={v} m={args.micro_batches} "
              f"bubble_theory={(p - 1) / (v * args.micro_batches + p - 1):.3f} "
              f"step_ms={statistics.median(max(walls[k]) for k in timed) * 1e3:.1f} "
              f"cpu_ms={statistics.median(sum(cpus[k]) for k in timed) * 1e3:.1f} recompute={int(recompute)}")
        print("losses=" + ",".join(f"{x:.6f}" for x in losses), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
