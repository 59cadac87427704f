"""PyTorch peer of bench_gpu_step: the same Llama training step (forward and
loss under torch.autocast(bf16), backward, AdamW, zero_grad) on the same
config and device, with MFU against a bf16 matmul peak measured in the same
process, and the same FLOP count.

    python3 bench/gpu_step_peer.py --device cuda --steps 10 [--batch 8 --seq 256 ...]
        [--mixed_precision bf16|fp16|no] [--peak-size 8192]

Prints one line per step and the summary line
    peer=pytorch device=... mixed_precision=... tokens_per_s=... step_ms_median=...
    gemm_peak_tflops=... achieved_tflops=... mfu=... loss=...
tools/gpu_check.sh runs it beside bench_gpu_step (and, in its dry mode, on
the cpu with a tiny config).
"""
import argparse
import statistics
import time

import torch

from llama_peer import adamw, add_model_args, build_llama


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_peak(device, size):
    """TFLOP/s of a bf16 matmul size^3: the best of 10 after 2 warm-ups."""
    a = torch.full((size, size), 0.01, dtype=torch.bfloat16, device=device)
    b = torch.full((size, size), 0.02, dtype=torch.bfloat16, device=device)
    best = float("inf")
    for r in range(12):
        sync(device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        if r >= 2:
            best = min(best, time.perf_counter() - t0)
    return 2.0 * size ** 3 / best / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    add_model_args(ap)
    ap.add_argument("--mixed_precision", choices=["no", "bf16", "fp16"], default="bf16")
    ap.add_argument("--peak-size", type=int, default=8192)
    args = ap.parse_args()
    device = torch.device(args.device)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.mixed_precision)

    peak = gemm_peak(device, args.peak_size)
    print(f"device={device} gemm_peak_tflops={peak:.2f} (torch.matmul bf16 {args.peak_size}^3)", flush=True)
    model = build_llama(args).to(device)
    opt = adamw(model)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)

    C, L, F, V, B, T = args.hidden, args.layers, args.ffn, args.vocab, args.batch, args.seq
    n_mm = L * (4 * C * C + 3 * C * F) + C * V
    flops = 6.0 * n_mm * B * T + 12.0 * L * B * T * T * C
    times, loss_v = [], 0.0
    for it in range(args.warmup + args.steps):
        sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        dt = time.perf_counter() - t0
        loss_v = loss.item()
        warm = " (warm-up)" if it < args.warmup else ""
        print(f"step {it}{warm}: {dt * 1e3:.1f} ms loss {loss_v:.4f}", flush=True)
        if it >= args.warmup:
            times.append(dt)
    med = statistics.median(times)
    achieved = flops / med / 1e12
    print(f"peer=pytorch device={device} mixed_precision={args.mixed_precision} "
          f"tokens_per_s={B * T / med:.1f} step_ms_median={med * 1e3:.2f} gemm_peak_tflops={peak:.2f} "
          f"achieved_tflops={achieved:.2f} mfu={achieved / peak:.3f} loss={loss_v:.4f} torch={torch.__version__}",
          flush=True)


if __name__ == "__main__":
    main()
