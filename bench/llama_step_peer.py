"""PyTorch eager peer for bench_llama_step: the same Llama training step
(forward, backward, AdamW) on the same config and thread count.

Prints one line per measured step and a final summary line:
    peer=pytorch tokens_per_s=... step_ms_median=...
Usage: python3 bench/llama_step_peer.py --threads 2 --steps 5 [--batch 8 --seq 256]
    [--mixed_precision no|bf16|fp16] [--compile]
--mixed_precision bf16|fp16 runs forward and loss under torch.autocast("cpu",
dtype) (f32 master weights, as Accelerate does); --compile runs
torch.compile(model) (its compilation happens in the warm-up steps).
With --ddp it runs under `accel launch`/torchrun env as PyTorch + Accelerate (gloo).
"""
import argparse
import os
import statistics
import time

import torch

from llama_peer import adamw, add_model_args, build_llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    add_model_args(ap)
    ap.add_argument("--accelerate", action="store_true",
                    help="wrap with accelerate.Accelerator (gloo DDP under a launcher)")
    ap.add_argument("--mixed_precision", choices=["no", "bf16", "fp16"], default="no")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = ap.parse_args()
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.mixed_precision)

    torch.set_num_threads(args.threads)
    model = build_llama(args)
    opt = adamw(model)
    if args.compile:
        model = torch.compile(model)
    accelerator = None
    if args.accelerate:
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=True)
        model, opt = accelerator.prepare(model, opt)
        if accelerator.is_main_process:
            # Proof of the mode actually run (MULTI_CPU + gloo under 2 processes, DDP-wrapped model).
            print(f"accelerate state: {str(accelerator.state).strip()}".replace("\n", " | "), flush=True)
            print(f"accelerate model: {type(model).__name__} "
                  f"torch_threads={torch.get_num_threads()} "
                  f"backend={accelerator.state.backend}", flush=True)
    # Each rank its own batch (data parallel), the same for a given rank on every run.
    gen = torch.Generator().manual_seed(1234 + int(os.environ.get("RANK", "0")))
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    times, cpus = [], []  # wall and process CPU (all threads) seconds per step
    for step in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=amp_dtype, enabled=amp_dtype is not None):
            out = model(input_ids=ids, labels=ids)
        if accelerator is not None:
            accelerator.backward(out.loss)
        else:
            out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if step >= args.warmup:
            times.append(dt)
            cpus.append(dc)
    med = statistics.median(times)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        tok = args.batch * args.seq * world / med
        print(f"peer=pytorch{'+accelerate' if args.accelerate else ''} world={world} "
              f"mixed_precision={args.mixed_precision} compile={int(args.compile)} "
              f"threads={args.threads} tokens_per_s={tok:.1f} step_ms_median={med * 1e3:.1f} "
              f"cpu_ms_median={statistics.median(cpus) * 1e3:.1f} "
              f"loss={out.loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
