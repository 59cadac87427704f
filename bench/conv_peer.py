"""PyTorch peer of bench_conv: F.conv2d on the same ResNet shapes (forward;
forward + backward) and one training step of the same small ResNet
(examples/cv_resnet.h: torchvision's BasicBlock, 16/32 channels), Adam.

Prints the same lines as bench_conv ("conv name=... fwd_ms=... fwdbwd_ms=...",
"step ... step_ms=... cpu_ms=..."), medians of --reps timed calls after one
warm-up (two with --compile, which compiles the model; the conv lines are
then skipped).
Usage: python3 bench/conv_peer.py [--threads 2] [--reps 5] [--batch 64] [--image 32] [--compile]
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = [  # name, N, C, H, O, k, s, p: bench_conv.c's
    ("stem7x7s2", 8, 3, 224, 64, 7, 2, 3), ("l1_3x3", 8, 64, 56, 64, 3, 1, 1),
    ("l2_3x3", 8, 128, 28, 128, 3, 1, 1), ("l3_3x3", 8, 256, 14, 256, 3, 1, 1),
    ("l2_3x3s2", 8, 64, 56, 128, 3, 2, 1), ("l2_down1x1s2", 8, 64, 56, 128, 1, 2, 0),
    ("bottleneck1x1", 8, 256, 56, 64, 1, 1, 0),
]


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet(classes):
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Sequential(BasicBlock(16, 16, 1)), nn.Sequential(BasicBlock(16, 32, 2)),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def timed(fn, reps, warmup=1):
    ms, cpu = [], []
    for i in range(warmup + reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        if i >= warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(ms), statistics.median(cpu)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if not a.compile:
        for name, N, C, H, O, k, s, p in SHAPES:
            x = torch.randn(N, C, H, H)
            w = torch.randn(O, C, k, k) * 0.05
            with torch.no_grad():
                fwd, _ = timed(lambda: F.conv2d(x, w, None, s, p), a.reps)
            x.requires_grad_(True)
            w.requires_grad_(True)
            both, _ = timed(lambda: F.conv2d(x, w, None, s, p).sum().backward(), a.reps)
            print(f"conv name={name} shape={N}x{C}x{H}x{H} out={O} k={k} s={s} fwd_ms={fwd:.2f} fwdbwd_ms={both:.2f}",
                  flush=True)
    model = resnet(10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fwd = torch.compile(model) if a.compile else model
    x = torch.randn(a.batch, 3, a.image, a.image)
    labels = torch.arange(a.batch) % 10

    def step():
        loss = F.cross_entropy(fwd(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    ms, cpu = timed(step, a.reps, warmup=2 if a.compile else 1)
    print(f"step batch={a.batch} image={a.image} step_ms={ms:.2f} cpu_ms={cpu:.2f}", flush=True)


if __name__ == "__main__":
    main()
