"""PyTorch peer for bench_matmul: torch.mm on the Llama step's 12 GEMMs
(bench/llama_gemms.h: hidden 512, ffn 1536, vocab 8192, 2048 tokens; each
layer's forward Y = X W^T, dX = dY W and dW = dY^T X on the same transposed
views a training step hands to torch), f32 and bf16, on the thread count given.
What PyTorch's own GEMMs reach on this CPU (MKL's sgemm or oneDNN, whichever
it dispatches to), so that a step's ratio to PyTorch can be read against
GEMMs of the same speed or not.

Prints a markdown section: torch's version and BLAS, then per shape the median
GFLOP/s of REPS calls after one warm-up (wall time; the load average before
and after). Usage: python3 bench/matmul_peer.py [--threads 2] [--reps 7]
"""
import argparse
import os
import re
import statistics
import time

import torch

TOKENS = 2048
LAYERS = [("attn q/o proj", 512, 512), ("mlp up/gate", 512, 1536),
          ("mlp down", 1536, 512), ("lm_head", 512, 8192)]
PIECES = ["forward Y = X W^T (NT)", "dX = dY W (NN)", "dW = dY^T X (TN)"]


def operands(piece, nin, nout, dtype):
    """The piece's (a, b) as a step hands them to torch.mm: views, not copies."""
    x = torch.randn(TOKENS, nin).to(dtype)
    w = torch.randn(nout, nin).to(dtype)
    dy = torch.randn(TOKENS, nout).to(dtype)
    if piece == 0:
        return x, w.t()
    if piece == 1:
        return dy, w
    return dy.t(), x


def gflops(a, b, reps):
    c = torch.mm(a, b)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        times.append(time.perf_counter() - t0)
    m, k = a.shape
    n = b.shape[1]
    return 2.0 * m * n * k / statistics.median(times) * 1e-9


def blas_line():
    cfg = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=([^,\s]+)", cfg)
    mkl = re.search(r"Math Kernel Library Version ([^ ]+)", cfg)
    return (f"BLAS {blas.group(1) if blas else 'not reported'}"
            + (f" (MKL {mkl.group(1)})" if mkl else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print("## PyTorch's matmul on the same shapes (bench/matmul_peer.py, same run)\n")
    print(f"torch {torch.__version__}, {blas_line()}, oneDNN (mkldnn) "
          f"{'available' if torch.backends.mkldnn.is_available() else 'absent'}, "
          f"{args.threads} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; "
          f"torch.mm on the step's transposed views, median of {args.reps} calls after one warm-up, "
          f"GFLOP/s of wall time. Load average before: {load}.\n")
    print("| layer | piece | M x N x K | torch f32 | torch bf16 |")
    print("|---|---|---|---|---|")
    for name, nin, nout in LAYERS:
        for p, piece in enumerate(PIECES):
            row = []
            for dt in (torch.float32, torch.bfloat16):
                a, b = operands(p, nin, nout, dt)
                row.append(gflops(a, b, args.reps))
            m, k = a.shape
            print(f"| {name} | {piece} | {m} x {b.shape[1]} x {k} | {row[0]:.1f} | {row[1]:.1f} |")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"\nLoad average after: {load}")


if __name__ == "__main__":
    main()
