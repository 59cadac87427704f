#!/usr/bin/env python3
"""Writes the PyTorch fixtures of the window and batch-norm ops (tests/test_ops_conv.c).

Output: tests/data/ops_conv.bin (conv2d, conv1d, also padding="same"), ops_pad.bin
(F.pad, every mode), nn_conv_modes.bin (Conv2d / Conv1d with a padding_mode), ops_pool.bin (max/avg/adaptive
pooling), ops_bn.bin (batch_norm). Same format as tools/gen_ops_fixtures.py
(b"AOPF" | u32 count | count x (u32 name_len | name | u32 ndim | i64 shape | f32 data)).
Every case k is a set of tensors "<kind><k>.<what>": its inputs, the output y,
a fixed upstream gradient gy and the inputs' gradients d<input>, and a
parameter vector p (the case's integer arguments as floats), so the C test
walks the cases without knowing them. Run from the repository root:
    python3 tools/gen_conv_fixtures.py
"""
import os
import struct

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")


def write(name, arrays):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(b"AOPF" + struct.pack("<I", len(arrays)))
        for key, t in arrays.items():
            t = torch.as_tensor(t).detach().to(torch.float32).contiguous()
            kb = key.encode()
            f.write(struct.pack("<I", len(kb)) + kb + struct.pack("<I", t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().astype("<f4").tobytes())
    print(path, len(arrays), "tensors", os.path.getsize(path), "bytes")


def leaf(*shape):
    return torch.randn(*shape, dtype=torch.float32).requires_grad_(True)


def grads(out, prefix, inputs, y):
    gy = torch.randn_like(y)
    y.backward(gy)
    for k, v in inputs.items():
        out[prefix + k] = v
        if v.requires_grad:
            out[prefix + "d" + k] = v.grad
    out[prefix + "y"] = y
    out[prefix + "gy"] = gy


# (N, C, H, W, O, (kh, kw), stride, padding, dilation, groups, bias)
CONV2D = [
    (2, 3, 7, 6, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),   # the usual 3x3
    (2, 4, 9, 8, 6, (3, 2), (2, 3), (0, 1), (1, 1), 2, True),   # odd kernel, strides, groups
    (1, 3, 5, 5, 2, (5, 5), (1, 1), (2, 2), (1, 1), 1, False),  # kernel = input, padded
    (2, 4, 7, 7, 4, (3, 3), (1, 1), (1, 1), (1, 1), 4, True),   # depthwise
    (2, 3, 6, 12, 6, (3, 3), (1, 1), (1, 1), (1, 1), 3, False), # depthwise, 2 filters per channel
    (2, 3, 8, 7, 5, (3, 3), (1, 2), (2, 1), (2, 2), 1, True),   # dilation
    (2, 6, 5, 5, 6, (1, 1), (1, 1), (0, 0), (1, 1), 3, True),   # 1x1 read in place, groups
    (2, 3, 6, 6, 2, (2, 2), (3, 3), (0, 0), (1, 1), 1, True),   # stride > kernel
    (1, 2, 3, 3, 3, (5, 4), (1, 1), (2, 2), (1, 1), 1, True),   # kernel > input, padding covers it
    (3, 2, 5, 4, 2, (1, 1), (2, 2), (0, 0), (1, 1), 1, False),  # strided 1x1 (im2col)
    (2, 4, 6, 6, 8, (3, 3), (2, 2), (1, 1), (1, 1), 1, False),  # a ResNet downsample
    (2, 2, 1, 9, 3, (1, 3), (1, 1), (0, 1), (1, 1), 1, True),   # one row
]

# (N, C, L, O, k, stride, padding, dilation, groups, bias)
CONV1D = [
    (2, 3, 10, 4, 3, 1, 1, 1, 1, True),
    (2, 4, 9, 6, 2, 2, 0, 2, 2, False),
    (1, 2, 5, 2, 7, 1, 3, 1, 2, True),
]

# padding="same", stride 1: (N, C, H, W, O, (kh, kw), dilation, groups, bias)
SAME2D = [
    (2, 3, 7, 6, 4, (3, 3), (1, 1), 1, True),   # odd kernel: the same padding on both sides
    (2, 4, 6, 7, 6, (4, 2), (1, 1), 2, True),   # even kernels: one more after (x padded first)
    (1, 3, 5, 6, 2, (3, 4), (2, 1), 1, False),  # dilated: 4 (even) and 3 (odd) in all
    (2, 2, 1, 1, 3, (4, 4), (1, 1), 1, True),   # kernel larger than the input
    (1, 4, 5, 5, 4, (2, 3), (3, 1), 4, True),   # depthwise, dilation 3 of an even kernel
]

# (N, C, L, O, k, dilation, groups, bias)
SAME1D = [
    (2, 3, 10, 4, 4, 1, 1, True),
    (1, 2, 7, 2, 3, 2, 2, False),
    (2, 2, 5, 3, 6, 1, 1, True),
]


def conv_file():
    torch.manual_seed(0)
    out = {}
    for i, (N, C, H, W, O, k, s, p, d, g, bias) in enumerate(CONV2D):
        inp = {"x": leaf(N, C, H, W), "w": leaf(O, C // g, *k)}
        if bias:
            inp["b"] = leaf(O)
        y = F.conv2d(inp["x"], inp["w"], inp.get("b"), s, p, d, g)
        out["c%d.p" % i] = torch.tensor([*s, *p, *d, g, bias], dtype=torch.float32)
        grads(out, "c%d." % i, inp, y)
    for i, (N, C, L, O, k, s, p, d, g, bias) in enumerate(CONV1D):
        inp = {"x": leaf(N, C, L), "w": leaf(O, C // g, k)}
        if bias:
            inp["b"] = leaf(O)
        y = F.conv1d(inp["x"], inp["w"], inp.get("b"), s, p, d, g)
        out["l%d.p" % i] = torch.tensor([s, p, d, g, bias], dtype=torch.float32)
        grads(out, "l%d." % i, inp, y)
    # padding="same" (after the cases above: their draws stay as they were)
    for i, (N, C, H, W, O, k, d, g, bias) in enumerate(SAME2D):
        inp = {"x": leaf(N, C, H, W), "w": leaf(O, C // g, *k)}
        if bias:
            inp["b"] = leaf(O)
        y = F.conv2d(inp["x"], inp["w"], inp.get("b"), 1, "same", d, g)
        assert y.shape[2:] == inp["x"].shape[2:]
        out["s%d.p" % i] = torch.tensor([*d, g, bias], dtype=torch.float32)
        grads(out, "s%d." % i, inp, y)
    for i, (N, C, L, O, k, d, g, bias) in enumerate(SAME1D):
        inp = {"x": leaf(N, C, L), "w": leaf(O, C // g, k)}
        if bias:
            inp["b"] = leaf(O)
        y = F.conv1d(inp["x"], inp["w"], inp.get("b"), 1, "same", d, g)
        out["t%d.p" % i] = torch.tensor([d, g, bias], dtype=torch.float32)
        grads(out, "t%d." % i, inp, y)
    write("ops_conv.bin", out)


# nn.Conv2d / Conv1d with a padding_mode: (x shape, O, kernel, stride, padding ("same" or ints), dilation,
# groups, mode); p = [ndim of the kernel, *kernel, *stride, *padding (-1: same), *dilation, groups, mode index]
MODULES = [
    ((2, 3, 6, 7), 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, "reflect"),
    ((1, 2, 5, 6), 4, (3, 2), (2, 1), (2, 1), (1, 2), 2, "replicate"),
    ((2, 2, 5, 5), 3, (4, 3), (1, 1), "same", (1, 2), 1, "circular"),
    ((2, 3, 9), 2, (3,), (2,), (2,), (1,), 1, "reflect"),
    ((1, 2, 8), 4, (4,), (1,), "same", (2,), 2, "replicate"),
]


def module_file():
    torch.manual_seed(4)
    out = {}
    for i, (shape, O, k, s, p, d, g, mode) in enumerate(MODULES):
        Conv = torch.nn.Conv2d if len(k) == 2 else torch.nn.Conv1d
        m = Conv(shape[1], O, k, s, p, d, g, True, padding_mode=mode)
        x = leaf(*shape)
        y = m(x)
        pads = [-1] * len(k) if p == "same" else list(p)
        out["m%d.p" % i] = torch.tensor([len(k), *k, *s, *pads, *d, g, MODES.index(mode)], dtype=torch.float32)
        grads(out, "m%d." % i, {"x": x, "w": m.weight, "b": m.bias}, y)
    write("nn_conv_modes.bin", out)


# F.pad: (x shape, pad, value, mode); negative amounts crop (constant mode)
MODES = ["constant", "reflect", "replicate", "circular"]
PADS = [
    ((2, 3), (1, 1), 0.0, "constant"),
    ((2, 3, 4), (1, 2, 0, 1), 1.5, "constant"),
    ((2, 3, 4), (-1, 2, 1, -2), 0.0, "constant"),      # crop and pad in one dim, both ways
    ((2, 2, 3, 3), (1, 0, 2, 3, 1, 1, 0, 2), -2.0, "constant"),  # every dim
    ((3, 5), (-2, -1), 0.5, "constant"),               # cropped on both sides
    ((4,), (0, 0), 0.0, "constant"),                   # nothing to pad: a copy
    ((2, 3, 5), (2, 4), 0.0, "reflect"),               # 4: the most below the size
    ((2, 2, 4, 5), (1, 2, 3, 0), 0.0, "reflect"),
    ((2, 2, 3, 4, 3), (2, 1, 0, 2, 1, 1), 0.0, "reflect"),
    ((3, 4), (2, 3), 0.0, "replicate"),                # unbatched
    ((1, 2, 3, 4, 2), (1, 1, 2, 0, 1, 4), 0.0, "replicate"),
    ((2, 3, 4), (4, 1), 0.0, "circular"),              # 4: the whole dim once
    ((1, 2, 3, 4), (1, 3, 2, 2), 0.0, "circular"),
]


def pad_file():
    torch.manual_seed(3)
    out = {}
    for i, (shape, pad, value, mode) in enumerate(PADS):
        x = leaf(*shape)
        y = F.pad(x, pad, mode=mode, value=value) if mode == "constant" else F.pad(x, pad, mode=mode)
        out["d%d.p" % i] = torch.tensor([len(pad), *pad, value, MODES.index(mode)], dtype=torch.float32)
        grads(out, "d%d." % i, {"x": x}, y)
    write("ops_pad.bin", out)


# kind 0 max (k, s, p, d, ceil), kind 1 avg (k, s, p, ceil, count_include_pad), kind 2 adaptive (oh, ow)
POOLS = [
    (0, (1, 2, 7, 8), ((2, 2), (2, 2), (0, 0), (1, 1), False)),
    (0, (2, 2, 7, 8), ((3, 3), (2, 2), (1, 1), (1, 1), False)),
    (0, (1, 3, 7, 8), ((3, 2), (2, 2), (1, 1), (1, 1), True)),
    (0, (1, 2, 9, 8), ((2, 3), (3, 2), (1, 1), (2, 2), True)),   # dilated, ceil
    (0, (1, 2, 6, 7), ((3, 3), (1, 1), (1, 1), (1, 1), False)),  # overlapping windows
    (0, (1, 2, 7, 7), ((2, 2), (3, 3), (0, 0), (1, 1), True)),   # stride > kernel
    (0, (2, 5, 5), ((3, 3), (2, 2), (0, 0), (1, 1), False)),     # unbatched
    (1, (1, 2, 7, 8), ((3, 3), (2, 2), (1, 1), False, True)),
    (1, (1, 2, 7, 8), ((3, 3), (2, 2), (1, 1), True, False)),
    (1, (2, 2, 6, 7), ((2, 2), (2, 2), (0, 0), True, True)),
    (1, (1, 3, 8, 8), ((3, 2), (3, 3), (1, 1), True, True)),     # ceil with padding
    (1, (1, 2, 5, 6), ((2, 3), (1, 2), (1, 0), False, False)),
    (1, (1, 2, 8, 8), ((3, 3), (2, 2), (1, 1), True, True)),      # ceil's last window cut at H + padding
    (2, (1, 2, 7, 8), ((3, 3),)),
    (2, (2, 2, 7, 8), ((1, 1),)),
    (2, (1, 2, 7, 8), ((4, 5),)),
    (2, (1, 2, 5, 7), ((9, 10),)),                                # larger than the input
]


def pool_file():
    torch.manual_seed(1)
    out = {}
    for i, (kind, shape, a) in enumerate(POOLS):
        x = leaf(*shape)
        if kind == 0:
            k, s, p, d, ceil = a
            y = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil)
            par = [kind, *k, *s, *p, *d, ceil, 0]
        elif kind == 1:
            k, s, p, ceil, inc = a
            y = F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=inc)
            par = [kind, *k, *s, *p, 1, 1, ceil, inc]
        else:
            y = F.adaptive_avg_pool2d(x, a[0])
            par = [kind, *a[0], 0, 0, 0, 0, 0, 0, 0, 0]
        out["p%d.p" % i] = torch.tensor(par, dtype=torch.float32)
        grads(out, "p%d." % i, {"x": x}, y)
    write("ops_pool.bin", out)


# (x shape, momentum (None: cumulative average), affine, track_running_stats)
BNS = [
    ((6, 3), 0.1, True, True),
    ((4, 3, 5), 0.3, True, True),
    ((3, 2, 4, 5), 0.1, True, True),
    ((3, 2, 4, 5), None, False, True),
    ((2, 3, 3, 3), 0.1, True, False),
]
BN_STEPS = 3


def bn_file():
    torch.manual_seed(2)
    out = {}
    for i, (shape, mom, affine, track) in enumerate(BNS):
        C = shape[1]
        cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)]
        m = cls(C, momentum=mom, affine=affine, track_running_stats=track)
        if affine:
            with torch.no_grad():
                m.weight.copy_(torch.randn(C))
                m.bias.copy_(torch.randn(C))
        pre = "b%d." % i
        out[pre + "p"] = torch.tensor([-1.0 if mom is None else mom, affine, track], dtype=torch.float32)
        if affine:
            out[pre + "w"] = m.weight.detach().clone()
            out[pre + "bias"] = m.bias.detach().clone()
        m.train()
        for s in range(BN_STEPS):
            x = (torch.randn(*shape) * 2 + 0.5).requires_grad_(True)
            y = m(x)
            if s == 0:  # the gradients of the first training step
                gy = torch.randn_like(y)
                y.backward(gy)
                out[pre + "gy"] = gy
                out[pre + "dx"] = x.grad
                if affine:  # copies: the eval step's backward below adds to them
                    out[pre + "dw"] = m.weight.grad.clone()
                    out[pre + "db"] = m.bias.grad.clone()
            out[pre + "x%d" % s] = x
            out[pre + "y%d" % s] = y
        if track:
            out[pre + "rm"] = m.running_mean
            out[pre + "rv"] = m.running_var
            m.eval()
            xe = torch.randn(*shape).requires_grad_(True)
            ye = m(xe)
            gy = torch.randn_like(ye)
            ye.backward(gy)
            out[pre + "xe"] = xe
            out[pre + "ye"] = ye
            out[pre + "gye"] = gy
            out[pre + "dxe"] = xe.grad
    write("ops_bn.bin", out)


if __name__ == "__main__":
    conv_file()
    pool_file()
    bn_file()
    pad_file()
    module_file()
