#!/usr/bin/env python3
"""A generated sweep of accel's optimizers, gradient clipping, LR schedules and fp16 loss scaling
against PyTorch, case by case.

    python3 tools/sweep_optim.py [--n N] [--seed S] [--families sgd,adam,adamw,clip,sched,fp16]
                                 [--lib PATH] [--work DIR] [--keep] [--timeout SEC] [--ulps U]

Each case (family i % len(families), its own seeded random.Random) is drawn, run by torch and
written as case.json (the case and torch's numbers); accel (build/lib/libaccel.so through ctypes, in
worker processes, as tools/sweep_hf_configs.py runs them; the fp16 family also through
tools/opt_sweep_shim.c, built here) runs the same case:

  sgd, adam, adamw  torch.optim.X(foreach=False) vs accel_optimizer_*: 1-4 param groups of 1-4
                    tensors of random shapes, hyperparameters over their whole range and edges (lr 0,
                    momentum 0 / 0.99, dampening, nesterov, betas near 0 and 1, eps 0 and large, weight
                    decay large), 1-30 steps with gradients drawn per step (grad None, zeros, huge,
                    tiny, subnormal, inf / nan), lr and hyperparameters changed between steps (through
                    accel_optimizer_hparams), the state saved and loaded into a fresh optimizer
                    mid-run; the parameters compared after every step
  clip              torch.nn.utils.clip_grad_norm_ vs accel_clip_grad_norm /
                    accel_optimizer_clip_grad_norm: norm types 2, 1, inf, 0.5, 3, 50, 1000, max_norm
                    0 / tiny / huge, gradients of every magnitude; the returned norm and the clipped
                    gradients
  sched             transformers' get_<kind>_schedule_with_warmup vs accel_lr_scheduler_new: random
                    warmup / total (0, equal, warmup > total), stepped far past total, the scheduler
                    state saved and loaded into a fresh one mid-run; every group's lr after every step
  fp16              the Accelerator's fp16 path (accumulate, backward, optimizer_step,
                    scheduler_step, zero_grad) vs torch.amp.GradScaler("cpu") and Accelerate's
                    AcceleratedScheduler.step logic (accelerate/scheduler.py, one process) on the same
                    micro-batches of finite / inf / nan / overflowing gradients: the scale and whether
                    the step was skipped after each optimizer step, the lr, the parameters

Tolerances: parameters and gradients are f32, and torch's vectorised CPU kernels fuse some
multiply-adds that accel's do not (lerp; accel fuses the adds with alpha as torch does), so an
element may differ by an ulp of the terms per operation: a case matches when every element is within --ulps (4) x (steps so far) f32 ulps of the
largest magnitude that tensor had in torch's run, plus twice the distance between torch's f32 and
f64 runs of the case (an ill-conditioned case, e.g. Adam with lr x weight_decay in the hundreds,
amplifies that ulp step by step; the f64 run measures how much); non-finite values must agree
exactly (NaN where torch has NaN, the same infinity; torch's f64 run's also counts); a clip's
returned norm (torch sums in f32) within 1e-5 relative;
lrs within 1e-12 relative; loss scales and skipped steps exactly.

A case ends match, refused (accel's error where torch refuses the case too, e.g. GradScaler's
growth_factor 1, or where accel documents the refusal: a NaN total norm, torch's
error_if_nonfinite; the report lists each distinct message), MISMATCH (also: accel refused a case
torch runs, or ran one torch refuses) or CRASH / HANG, as in tools/sweep_hf_configs.py. Exit
status 1 on any MISMATCH, CRASH or HANG.
"""
import atexit
import ctypes
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_hf_configs import ROOT, run_sweep, sweep_args  # noqa: E402

FAMILIES = ["sgd", "adam", "adamw", "clip", "sched", "fp16"]
SCHEDS = ["constant", "constant_with_warmup", "linear", "cosine"]
F32_EPS = 2.0 ** -23


# ------------------------------------------------------------ drawing

def f32(x):
    """x rounded to float32, as a Python float."""
    import struct
    return struct.unpack("f", struct.pack("f", x))[0] if math.isfinite(x) and abs(x) < 3.4e38 else \
        (x if not math.isfinite(x) else math.copysign(math.inf, x))


def values(r, n, regime=None):
    """n float32 values of a random regime (magnitudes from subnormal to huge, zeros, inf / nan)."""
    regime = regime or r.choices(["normal", "zeros", "huge", "tiny", "subnormal", "mixed", "special"],
                                 [50, 6, 6, 6, 5, 20, 4])[0]
    out = []
    for _ in range(n):
        k = regime if regime != "mixed" else r.choice(["normal", "normal", "zeros", "huge", "tiny", "subnormal"])
        if k == "normal":
            v = r.gauss(0, 1) * 10 ** r.uniform(-3, 3)
        elif k == "zeros":
            v = 0.0
        elif k == "huge":
            v = r.choice([-1, 1]) * 10 ** r.uniform(20, 38)
        elif k == "tiny":
            v = r.gauss(0, 1) * 10 ** r.uniform(-37, -20)
        elif k == "subnormal":
            v = r.choice([-1, 1]) * 10 ** r.uniform(-44.5, -38.5)
        else:
            v = r.choice([math.inf, -math.inf, math.nan, r.gauss(0, 1), r.gauss(0, 1)])
        out.append(f32(v))
    return out


def shape(r):
    return r.choice([[1], [r.randint(1, 6)], [r.randint(1, 3), r.randint(1, 4)], [2, 1, 3], [r.randint(1, 8)]])


def numel(s):
    return math.prod(s)


def hparams(r, kind):
    """One param group's hyperparameters (torch's names), across their valid range and its edges."""
    h = {"lr": r.choice([0.0, 1e-3, 0.1, 1.0, 10 ** r.uniform(-6, 1)]),
         "weight_decay": r.choice([0.0, 0.0, 0.01, 1e-4, 10 ** r.uniform(-4, 1), 100.0])}
    if kind == "sgd":
        h["momentum"] = r.choice([0.0, 0.0, 0.9, 0.99, r.random()])
        h["dampening"] = r.choice([0.0, 0.0, 0.1, 0.5, r.random()]) if h["momentum"] else 0.0
        h["nesterov"] = bool(h["momentum"] and not h["dampening"] and r.random() < 0.5)
    else:
        h["betas"] = [r.choice([0.0, 1e-3, 0.9, 0.99, 1 - 1e-6, r.random()]),
                      r.choice([0.0, 1e-3, 0.5, 0.999, 1 - 1e-7, r.random()])]
        h["eps"] = r.choice([0.0, 1e-8, 1e-3, 1.0, 10 ** r.uniform(-12, 1)])
    return h


def draw_optim(kind, r):
    groups = []
    for _ in range(r.randint(1, 4)):
        groups.append({"h": hparams(r, kind),
                       "params": [{"shape": shape(r)} for _ in range(r.randint(1, 4))]})
    for g in groups:
        for p in g["params"]:
            p["init"] = values(r, numel(p["shape"]), r.choice(["normal", "normal", "mixed", "zeros"]))
    steps = []
    for _ in range(r.randint(1, 30)):
        st = {"grads": [[None if r.random() < 0.15 else values(r, numel(p["shape"])) for p in g["params"]]
                        for g in groups]}
        if r.random() < 0.2:  # hyperparameters changed before this step
            gi = r.randrange(len(groups))
            ch = {"lr": r.choice([0.0, 1e-3, 10 ** r.uniform(-5, 0)])}
            if r.random() < 0.5:
                ch.update({k: v for k, v in hparams(r, kind).items()
                           if k not in ("momentum", "nesterov", "dampening")})
            st["set"] = [gi, ch]
        if r.random() < 0.08:
            st["reload"] = True  # state saved and loaded into a fresh optimizer before this step
        steps.append(st)
    return {"family": kind, "groups": groups, "steps": steps}


def draw_clip(r):
    params = [{"shape": shape(r)} for _ in range(r.randint(1, 5))]
    regime = r.choice([None, None, "normal", "huge", "tiny", "subnormal"])
    for p in params:
        p["grad"] = None if r.random() < 0.15 else values(r, numel(p["shape"]), regime)
    return {"family": "clip", "params": params,
            "norm_type": r.choice([2.0, 2.0, 1.0, math.inf, 0.5, 3.0, 50.0, 1000.0, round(r.uniform(0.3, 8), 2)]),
            "max_norm": r.choice([0.0, 1e-30, 1e-3, 1.0, 1e30, 10 ** r.uniform(-3, 3)]),
            "through_optimizer": r.random() < 0.5}


def draw_sched(r):
    total = r.choice([0, 1, r.randint(1, 10), r.randint(10, 200)])
    warmup = r.choice([0, total, total + r.randint(1, 10), r.randint(0, max(0, total)), 1])
    n = r.randint(0, 2 * total + 20)
    return {"family": "sched", "kind": r.choice(SCHEDS), "warmup": warmup, "total": total,
            "lrs": [r.choice([1e-3, 0.1, 1.0, 10 ** r.uniform(-6, 1)]) for _ in range(r.randint(1, 3))],
            "steps": n, "reload_at": r.randint(0, n) if r.random() < 0.3 else -1}


def draw_fp16(r):
    micro = []
    for _ in range(r.randint(1, 40)):
        kind = r.choices(["finite", "inf", "nan", "big"], [70, 10, 8, 12])[0]
        micro.append(kind)
    return {"family": "fp16",
            "init_scale": r.choice([65536.0, 65536.0, 1.0, 2.0 ** r.randint(-10, 30), round(10 ** r.uniform(-2, 6), 3),
                                    2.0 ** 126]),
            # 1: refused by torch (and accel)
            "growth_factor": r.choices([2.0, 1.5, round(r.uniform(1.001, 4), 3), 1.0], [40, 20, 35, 5])[0],
            "backoff_factor": r.choices([0.5, 0.25, round(r.uniform(0.05, 0.999), 3), 1.0], [40, 20, 35, 5])[0],
            "growth_interval": r.choice([1, 1, 2, 3, r.randint(1, 6), 2000]),
            "accum": r.choice([1, 1, 2, 3]), "split_batches": r.random() < 0.3,
            "no_step_sched": r.random() < 0.2, "sched": r.choice(SCHEDS), "warmup": r.randint(0, 5),
            "total": r.randint(0, 30), "micro": micro, "seed": r.randrange(1 << 30)}


def draw(family, r):
    if family in ("sgd", "adam", "adamw"):
        return draw_optim(family, r)
    return {"clip": draw_clip, "sched": draw_sched, "fp16": draw_fp16}[family](r)


# ------------------------------------------------------------ torch's side

def t_optimizer(kind, groups):
    import torch
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    extra = {"foreach": False} if kind == "sgd" else {"foreach": False, "fused": False}
    pg = [dict(params=g["tensors"], **{k: (tuple(v) if k == "betas" else v) for k, v in g["h"].items()})
          for g in groups]
    return cls(pg, **extra)


def torch_optim(c):
    """torch's parameters after each step in float32 ("params") and in float64 ("params_f64": their distance
    is what f32 rounding does to the case, which an ill-conditioned one, e.g. Adam with lr * weight_decay in
    the hundreds, amplifies step by step from the ulp that torch's fused lerp and accel's order
    leave apart)."""
    import torch
    return {"params": torch_optim_run(c, torch.float32), "params_f64": torch_optim_run(c, torch.float64)}


def torch_optim_run(c, dtype):
    import torch
    groups = [{"h": g["h"], "tensors": [torch.tensor(p["init"], dtype=dtype).reshape(p["shape"])
                                        for p in g["params"]]} for g in c["groups"]]
    opt = t_optimizer(c["family"], groups)
    out = []
    for st in c["steps"]:
        if "set" in st:
            gi, ch = st["set"]
            for k, v in ch.items():
                opt.param_groups[gi][k] = tuple(v) if k == "betas" else v
        for g, grads in zip(groups, st["grads"]):
            for t, gv in zip(g["tensors"], grads):
                t.grad = None if gv is None else torch.tensor(gv, dtype=t.dtype).reshape(t.shape)
        opt.step()
        out.append([[t.flatten().tolist() for t in g["tensors"]] for g in groups])
    return out


def torch_clip(c):
    import torch
    ts = []
    for p in c["params"]:
        t = torch.zeros(p["shape"], dtype=torch.float32)
        t.grad = None if p["grad"] is None else torch.tensor(p["grad"], dtype=torch.float32).reshape(p["shape"])
        ts.append(t)
    total = torch.nn.utils.clip_grad_norm_(ts, c["max_norm"], c["norm_type"])
    return {"total": float(total), "grads": [None if t.grad is None else t.grad.flatten().tolist() for t in ts]}


def t_schedule(opt, kind, warmup, total):
    import transformers
    if kind == "constant":
        return transformers.get_constant_schedule(opt)
    if kind == "constant_with_warmup":
        return transformers.get_constant_schedule_with_warmup(opt, warmup)
    f = {"linear": transformers.get_linear_schedule_with_warmup,
         "cosine": transformers.get_cosine_schedule_with_warmup}[kind]
    return f(opt, warmup, total)


def torch_sched(c):
    import torch
    opt = torch.optim.SGD([{"params": [torch.zeros(1)], "lr": lr} for lr in c["lrs"]], lr=1.0)
    s = t_schedule(opt, c["kind"], c["warmup"], c["total"])
    lrs = [s.get_last_lr()]
    for _ in range(c["steps"]):
        s.step()
        lrs.append(s.get_last_lr())
    return {"lrs": lrs}


def fp16_consts(c):
    """Per micro-batch: the constants C (for the weight [2, 3]) and D (the bias [2]) of loss = sum(w*C) + sum(b*D)."""
    r = random.Random(c["seed"])
    out = []
    for kind in c["micro"]:
        v = [f32(r.gauss(0, 1) * 10 ** r.uniform(-2, 1)) for _ in range(8)]
        j = r.randrange(8)
        if kind == "inf":
            v[j] = r.choice([math.inf, -math.inf])
        elif kind == "nan":
            v[j] = math.nan
        elif kind == "big":
            v[j] = f32(r.choice([-1, 1]) * 10 ** r.uniform(30, 38))
        out.append(v)
    return out


def fp16_init(c):
    r = random.Random(c["seed"] + 1)
    return [f32(r.uniform(-1, 1)) for _ in range(8)]


def torch_fp16(c):
    """The Accelerator's loop in torch and accelerate's logic: GradientState's sync every `accum` micro-batches,
    loss / accum, GradScaler.scale / step / update at sync steps, AcceleratedScheduler.step's rules."""
    import torch
    init = fp16_init(c)
    w = torch.tensor(init[:6], dtype=torch.float32).reshape(2, 3).requires_grad_()
    b = torch.tensor(init[6:], dtype=torch.float32).requires_grad_()
    opt = torch.optim.SGD([w, b], lr=0.01, foreach=False)
    sched = t_schedule(opt, c["sched"], c["warmup"], c["total"])
    scaler = torch.amp.GradScaler("cpu", init_scale=c["init_scale"], growth_factor=c["growth_factor"],
                                  backoff_factor=c["backoff_factor"], growth_interval=c["growth_interval"])
    step, skipped, out = 0, False, []
    for consts in fp16_consts(c):
        step += 1
        sync = step % c["accum"] == 0
        C = torch.tensor(consts[:6], dtype=torch.float32).reshape(2, 3)
        D = torch.tensor(consts[6:], dtype=torch.float32)
        loss = (w * C).sum() + (b * D).sum()
        if c["accum"] > 1:
            loss = loss / c["accum"]
        scaler.scale(loss).backward()
        if sync:
            scaler.step(opt)
            skipped = bool(sum(v.item() for v in scaler._found_inf_per_device(opt).values()))
            scaler.update()
        if c["no_step_sched"]:
            sched.step()
        elif sync and not skipped:
            num_processes = 1  # the sweep's accelerator runs alone (world 1)
            for _ in range(1 if c["split_batches"] else num_processes):
                sched.step()
        if sync:
            opt.zero_grad(set_to_none=False)
        out.append({"scale": scaler.get_scale(), "skipped": skipped, "lr": sched.get_last_lr()[0],
                    "params": w.detach().flatten().tolist() + b.detach().flatten().tolist()})
    return {"steps": out}


def make_case(family, seed, d):
    import torch
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    r = random.Random(seed)
    c = draw(family, r)
    run = {"sgd": torch_optim, "adam": torch_optim, "adamw": torch_optim, "clip": torch_clip,
           "sched": torch_sched, "fp16": torch_fp16}[family]
    try:
        c["torch"] = run(c)
    except (AssertionError, ValueError, RuntimeError) as e:  # torch refuses the case: accel must too
        c["torch"] = {"error": f"{type(e).__name__}: {e}"}
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(c, f)
    return c


# ------------------------------------------------------------ accel's side (worker)

class Tensor(ctypes.Structure):
    """accel_tensor's leading fields (include/accel/core.h), up to the grad the sweep sets."""
    _fields_ = [("magic", ctypes.c_uint32), ("gen", ctypes.c_uint32), ("dtype", ctypes.c_int),
                ("device_type", ctypes.c_int), ("device_index", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 8), ("stride", ctypes.c_int64 * 8), ("data", ctypes.c_void_p),
                ("flags", ctypes.c_uint32), ("requires_grad", ctypes.c_bool), ("grad", ctypes.c_void_p)]


class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("index", ctypes.c_int)]


CPU = Device(0, 0)


class Hparams(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("weight_decay", ctypes.c_double), ("momentum", ctypes.c_double),
                ("dampening", ctypes.c_double), ("nesterov", ctypes.c_bool), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double)]


class NamedState(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("t", ctypes.c_void_p), ("value", ctypes.c_double)]


class Refused(Exception):
    pass


def build_shim(lib):
    """tools/opt_sweep_shim.c built as a shared library (in a temporary folder) linked to lib."""
    tmp = tempfile.mkdtemp(prefix="accel_optshim_")
    atexit.register(shutil.rmtree, tmp, True)
    out = os.path.join(tmp, "libopt_sweep_shim.so")
    libdir = os.path.dirname(os.path.abspath(lib))
    subprocess.run(["cc", "-std=c11", "-shared", "-fPIC", "-I" + os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "tools", "opt_sweep_shim.c"), "-o", out, "-L" + libdir, "-laccel",
                    "-Wl,-rpath," + libdir], check=True)
    return out


class Accel:
    """accel's side of each family (ctypes on libaccel; the fp16 family's accelerator through the shim)."""

    def __init__(self, path):
        L = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        vp, i, d, i64, b = ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_int64, ctypes.c_bool
        sig = {
            "accel_last_error": (ctypes.c_char_p, []), "accel_clear_error": (None, []),
            "accel_step_reset": (None, []),
            "accel_tensor_new": (vp, [i, i, ctypes.POINTER(i64), Device]),
            "accel_tensor_free": (None, [vp]), "accel_tensor_from_host": (i, [vp, vp]),
            "accel_tensor_to_host": (i, [vp, vp]), "accel_from_floats": (vp, [i, ctypes.POINTER(i64), vp]),
            "accel_optimizer_new": (vp, [i]), "accel_optimizer_free": (None, [vp]),
            "accel_optimizer_add_params": (i, [vp, i, ctypes.POINTER(vp), ctypes.POINTER(Hparams)]),
            "accel_optimizer_hparams": (ctypes.POINTER(Hparams), [vp, i]),
            "accel_optimizer_step": (i, [vp]),
            "accel_optimizer_state": (i, [vp, ctypes.POINTER(ctypes.POINTER(NamedState))]),
            "accel_optimizer_load_state": (i, [vp, i, ctypes.POINTER(NamedState)]),
            "accel_named_state_free": (None, [ctypes.POINTER(NamedState), i]),
            "accel_clip_grad_norm": (d, [i, ctypes.POINTER(vp), d, d]),
            "accel_optimizer_clip_grad_norm": (d, [vp, d, d]),
            "accel_lr_scheduler_new": (vp, [vp, i, i64, i64]), "accel_lr_scheduler_free": (None, [vp]),
            "accel_lr_scheduler_step": (i, [vp]), "accel_lr_scheduler_get_lr": (d, [vp, i]),
            "accel_lr_scheduler_state": (i, [vp, ctypes.POINTER(ctypes.POINTER(NamedState))]),
            "accel_lr_scheduler_load_state": (i, [vp, i, ctypes.POINTER(NamedState)]),
            "accel_sched_kind_parse": (i, [ctypes.c_char_p]),
            "accel_linear_new": (vp, [i64, i64, b, Device, i]), "accel_module_free": (None, [vp]),
            "accel_module_parameters": (i, [vp, ctypes.POINTER(ctypes.POINTER(vp))]),
            "accel_free": (None, [vp]),
            "accel_mul": (vp, [vp, vp]), "accel_add": (vp, [vp, vp]), "accel_sum_all": (vp, [vp]),
            "accel_accelerator_free": (None, [vp]),
            "accel_accelerator_prepare_model": (i, [vp, vp]), "accel_accelerator_prepare_optimizer": (i, [vp, vp]),
            "accel_accelerator_prepare_scheduler": (i, [vp, vp]), "accel_accelerator_accumulate": (i, [vp]),
            "accel_accelerator_backward": (i, [vp, vp]), "accel_accelerator_optimizer_step": (i, [vp, vp]),
            "accel_accelerator_scheduler_step": (i, [vp, vp]), "accel_accelerator_zero_grad": (i, [vp, vp]),
            "accel_accelerator_loss_scale": (d, [vp]), "accel_accelerator_optimizer_step_was_skipped": (b, [vp]),
        }
        for name, (res, args) in sig.items():
            f = getattr(L, name)
            f.restype, f.argtypes = res, args
        self.L = L
        self.shim = None
        self.lib = path

    def error(self):
        return (self.L.accel_last_error() or b"").decode("utf-8", "replace")

    def check(self, ok, what):
        if not ok:
            raise Refused(f"{what}: {self.error()}")

    def tensor(self, shape, vals):
        L = self.L
        s = (ctypes.c_int64 * len(shape))(*shape)
        t = L.accel_tensor_new(0, len(shape), s, CPU)
        self.check(t, "accel_tensor_new")
        if vals is not None:
            self.write(t, vals)
        return t

    def write(self, t, vals):
        buf = (ctypes.c_float * len(vals))(*vals)
        self.check(self.L.accel_tensor_from_host(t, buf) == 0, "accel_tensor_from_host")

    def read(self, t, n):
        buf = (ctypes.c_float * n)()
        self.check(self.L.accel_tensor_to_host(t, buf) == 0, "accel_tensor_to_host")
        return list(buf)

    @staticmethod
    def set_grad(t, g):
        ctypes.cast(t, ctypes.POINTER(Tensor)).contents.grad = g

    # ---- optimizers

    def make_opt(self, kind, groups, tensors, live):
        """An optimizer over tensors (per group) with each group's live hyperparameters (torch's names)."""
        L = self.L
        opt = L.accel_optimizer_new(FAMILIES.index(kind))
        self.check(opt, "accel_optimizer_new")
        for g, ts in zip(groups, tensors):
            arr = (ctypes.c_void_p * len(ts))(*ts)
            # lr 1 (0 is refused here, not at a step), zero betas / eps: the defaults; the exact values are
            # written below; the momentum decides whether the group holds a momentum_buffer
            h = Hparams(lr=1.0, momentum=g["h"].get("momentum", 0.0), dampening=g["h"].get("dampening", 0.0),
                        nesterov=g["h"].get("nesterov", False))
            if L.accel_optimizer_add_params(opt, len(ts), arr, ctypes.byref(h)) < 0:
                err = self.error()
                L.accel_optimizer_free(opt)
                raise Refused("accel_optimizer_add_params: " + err)
        for gi, h in enumerate(live):
            self.set_hparams(opt, gi, h)
        return opt

    def set_hparams(self, opt, gi, h):
        p = self.L.accel_optimizer_hparams(opt, gi).contents
        for k, v in h.items():
            if k == "betas":
                p.beta1, p.beta2 = v
            else:
                setattr(p, k, v)

    def run_optim(self, c):
        L = self.L
        tensors = [[self.tensor(p["shape"], p["init"]) for p in g["params"]] for g in c["groups"]]
        grads = [[self.tensor(p["shape"], None) for p in g["params"]] for g in c["groups"]]
        live = [dict(g["h"]) for g in c["groups"]]
        opt, out = None, []
        try:
            opt = self.make_opt(c["family"], c["groups"], tensors, live)
            for st in c["steps"]:
                if "set" in st:
                    gi, ch = st["set"]
                    live[gi].update(ch)
                    self.set_hparams(opt, gi, ch)
                if st.get("reload"):
                    opt = self.reload(opt, c, tensors, live)
                for ts, gs, gv in zip(tensors, grads, st["grads"]):
                    for t, g, v in zip(ts, gs, gv):
                        self.set_grad(t, None if v is None else g)
                        if v is not None:
                            self.write(g, v)
                self.check(L.accel_optimizer_step(opt) == 0, "accel_optimizer_step")
                out.append([[self.read(t, numel(p["shape"])) for t, p in zip(ts, g["params"])]
                            for ts, g in zip(tensors, c["groups"])])
        finally:
            L.accel_optimizer_free(opt)
            for ts, gs in zip(tensors, grads):
                for t, g in zip(ts, gs):
                    self.set_grad(t, None)
                    L.accel_tensor_free(t)
                    L.accel_tensor_free(g)
        return {"params": out}

    def reload(self, opt, c, tensors, live):
        """accel_optimizer_state of opt loaded into a fresh optimizer built the same way (opt freed)."""
        L = self.L
        st = ctypes.POINTER(NamedState)()
        n = L.accel_optimizer_state(opt, ctypes.byref(st))
        self.check(n >= 0, "accel_optimizer_state")
        # built as opt was (the momentum decides the state it holds); the values come from the state
        fresh = self.make_opt(c["family"], c["groups"], tensors,
                              [{"lr": 0.5, "weight_decay": 0.0} for _ in live])
        ok = L.accel_optimizer_load_state(fresh, n, st) == 0
        err = self.error()
        L.accel_named_state_free(st, n)
        if not ok:
            L.accel_optimizer_free(fresh)
            raise Refused("accel_optimizer_load_state: " + err)
        L.accel_optimizer_free(opt)
        return fresh

    # ---- clipping

    def run_clip(self, c):
        L = self.L
        ts = [self.tensor(p["shape"], None) for p in c["params"]]
        gs = [None if p["grad"] is None else self.tensor(p["shape"], p["grad"]) for p in c["params"]]
        opt = None
        try:
            for t, g in zip(ts, gs):
                self.set_grad(t, g)
            arr = (ctypes.c_void_p * len(ts))(*ts)
            if c["through_optimizer"]:
                opt = L.accel_optimizer_new(0)
                h = Hparams(lr=1.0)
                self.check(L.accel_optimizer_add_params(opt, len(ts), arr, ctypes.byref(h)) >= 0, "add_params")
                total = L.accel_optimizer_clip_grad_norm(opt, c["max_norm"], c["norm_type"])
            else:
                total = L.accel_clip_grad_norm(len(ts), arr, c["max_norm"], c["norm_type"])
            if math.isnan(total):
                raise Refused("clip_grad_norm: " + self.error())
            return {"total": total,
                    "grads": [None if g is None else self.read(g, numel(p["shape"])) for g, p in zip(gs, c["params"])]}
        finally:
            L.accel_optimizer_free(opt)
            for t, g in zip(ts, gs):
                self.set_grad(t, None)
                L.accel_tensor_free(t)
                if g:
                    L.accel_tensor_free(g)

    # ---- schedules

    def sched_lrs(self, s, n):
        return [self.L.accel_lr_scheduler_get_lr(s, g) for g in range(n)]

    def run_sched(self, c):
        L = self.L
        ts = [self.tensor([1], None) for _ in c["lrs"]]
        opt = L.accel_optimizer_new(0)
        s = None
        try:
            for t, lr in zip(ts, c["lrs"]):
                h = Hparams(lr=lr)
                self.check(L.accel_optimizer_add_params(opt, 1, (ctypes.c_void_p * 1)(t), ctypes.byref(h)) >= 0,
                           "add_params")
            kind = L.accel_sched_kind_parse(c["kind"].encode())
            s = L.accel_lr_scheduler_new(opt, kind, c["warmup"], c["total"])
            self.check(s, "accel_lr_scheduler_new")
            lrs = [self.sched_lrs(s, len(c["lrs"]))]
            for k in range(c["steps"]):
                if k == c["reload_at"]:
                    st = ctypes.POINTER(NamedState)()
                    n = L.accel_lr_scheduler_state(s, ctypes.byref(st))
                    self.check(n >= 0, "accel_lr_scheduler_state")
                    L.accel_lr_scheduler_free(s)
                    s = L.accel_lr_scheduler_new(opt, kind, c["warmup"], c["total"])
                    ok = s and L.accel_lr_scheduler_load_state(s, n, st) == 0
                    L.accel_named_state_free(st, n)
                    self.check(ok, "accel_lr_scheduler_load_state")
                self.check(L.accel_lr_scheduler_step(s) == 0, "accel_lr_scheduler_step")
                lrs.append(self.sched_lrs(s, len(c["lrs"])))
            return {"lrs": lrs}
        finally:
            L.accel_lr_scheduler_free(s)
            L.accel_optimizer_free(opt)
            for t in ts:
                L.accel_tensor_free(t)

    # ---- fp16 through the Accelerator

    def run_fp16(self, c):
        L = self.L
        if not self.shim:
            self.shim = ctypes.CDLL(build_shim(self.lib))
            self.shim.opt_sweep_accelerator.restype = ctypes.c_void_p
            self.shim.opt_sweep_accelerator.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_bool, ctypes.c_bool,
                                                        ctypes.c_double, ctypes.c_double, ctypes.c_double,
                                                        ctypes.c_int64]
        acc = self.shim.opt_sweep_accelerator(b"fp16", c["accum"], c["split_batches"], c["no_step_sched"],
                                              c["init_scale"], c["growth_factor"], c["backoff_factor"],
                                              c["growth_interval"])
        self.check(acc, "accel_accelerator_new")
        m = L.accel_linear_new(3, 2, True, CPU, 0)
        opt = s = None
        try:
            self.check(m, "accel_linear_new")
            ps = ctypes.POINTER(ctypes.c_void_p)()
            self.check(L.accel_module_parameters(m, ctypes.byref(ps)) == 2, "accel_module_parameters")
            w, b = ps[0], ps[1]
            L.accel_free(ctypes.cast(ps, ctypes.c_void_p))
            init = fp16_init(c)
            self.write(w, init[:6])
            self.write(b, init[6:])
            opt = L.accel_optimizer_new(0)
            h = Hparams(lr=0.01)
            self.check(L.accel_optimizer_add_params(opt, 2, (ctypes.c_void_p * 2)(w, b), ctypes.byref(h)) >= 0,
                       "add_params")
            s = L.accel_lr_scheduler_new(opt, L.accel_sched_kind_parse(c["sched"].encode()), c["warmup"], c["total"])
            self.check(s, "accel_lr_scheduler_new")
            self.check(L.accel_accelerator_prepare_model(acc, m) == 0, "prepare_model")
            self.check(L.accel_accelerator_prepare_optimizer(acc, opt) == 0, "prepare_optimizer")
            self.check(L.accel_accelerator_prepare_scheduler(acc, s) == 0, "prepare_scheduler")
            out = []
            for consts in fp16_consts(c):
                self.check(L.accel_accelerator_accumulate(acc) == 0, "accumulate")
                C = L.accel_from_floats(2, (ctypes.c_int64 * 2)(2, 3), (ctypes.c_float * 6)(*consts[:6]))
                D = L.accel_from_floats(1, (ctypes.c_int64 * 1)(2), (ctypes.c_float * 2)(*consts[6:]))
                loss = L.accel_add(L.accel_sum_all(L.accel_mul(w, C)), L.accel_sum_all(L.accel_mul(b, D)))
                self.check(loss, "loss")
                self.check(L.accel_accelerator_backward(acc, loss) == 0, "backward")
                self.check(L.accel_accelerator_optimizer_step(acc, opt) == 0, "optimizer_step")
                self.check(L.accel_accelerator_scheduler_step(acc, s) == 0, "scheduler_step")
                self.check(L.accel_accelerator_zero_grad(acc, opt) == 0, "zero_grad")
                L.accel_step_reset()
                out.append({"scale": L.accel_accelerator_loss_scale(acc),
                            "skipped": bool(L.accel_accelerator_optimizer_step_was_skipped(acc)),
                            "lr": L.accel_lr_scheduler_get_lr(s, 0), "params": self.read(w, 6) + self.read(b, 2)})
            return {"steps": out}
        finally:
            L.accel_step_reset()
            L.accel_accelerator_free(acc)
            L.accel_lr_scheduler_free(s)
            L.accel_optimizer_free(opt)
            L.accel_module_free(m)

    def run(self, d):
        with open(os.path.join(d, "case.json")) as f:
            c = json.load(f)
        fam = c["family"]
        run = {"sgd": self.run_optim, "adam": self.run_optim, "adamw": self.run_optim, "clip": self.run_clip,
               "sched": self.run_sched, "fp16": self.run_fp16}[fam]
        try:
            res = run(c)
        except Refused as e:  # judged against torch's side: a refusal where torch has an answer is a MISMATCH
            res = {"refused": str(e)}
        with open(os.path.join(d, "accel.json"), "w") as f:
            json.dump(res, f)
        self.L.accel_clear_error()
        return None


def worker(lib):
    """Reads 'DIR FAMILY' lines on stdin; answers 'done' or 'refused <message>' per line."""
    acc = Accel(lib)
    for line in sys.stdin:
        d, _family = line.split()
        err = acc.run(d)
        print("refused " + json.dumps(err) if err else "done", flush=True)


# ------------------------------------------------------------ judging

def same_nonfinite(a, t):
    return (math.isnan(a) and math.isnan(t)) or a == t


def close_tensor(a, t, tol, t2=None):
    """Where the f32 values a differ from torch's t beyond tol (absolute), or None. t2: torch's values in
    float64, or None: an element may then be as far from t as twice their distance, and where either is not
    finite, equal either."""
    t2 = t2 or t
    for k, (x, y, y2) in enumerate(zip(a, t, t2)):
        if not (math.isfinite(y) and math.isfinite(y2) and math.isfinite(x)):
            if not (same_nonfinite(x, y) or same_nonfinite(x, y2)):
                return f"element {k}: accel {x!r}, torch {y!r}"
        elif abs(x - y) > tol + 2 * abs(y - y2):
            return (f"element {k}: accel {x!r}, torch {y!r} (|diff| {abs(x - y):.3g} > {tol:.3g} + twice torch's "
                    f"f32 - f64 distance {abs(y - y2):.3g})")
    return None


def finite_max(vals):
    return max([abs(v) for v in vals if math.isfinite(v)] + [0.0])


def judge_optim(c, got, ulps):
    scale = {}
    for k, (ga, gt, gf) in enumerate(zip(got["params"], c["torch"]["params"], c["torch"]["params_f64"])):
        for gi, (pa, pt, pf) in enumerate(zip(ga, gt, gf)):
            for j, (a, t, tf) in enumerate(zip(pa, pt, pf)):
                key = (gi, j)
                scale[key] = max(scale.get(key, finite_max(c["groups"][gi]["params"][j]["init"])), finite_max(t))
                bad = close_tensor(a, t, ulps * (k + 1) * F32_EPS * scale[key] + 1e-44, tf)
                if bad:
                    return "MISMATCH", f"step {k}, group {gi}, tensor {j}: {bad}"
    return "match", f"{len(c['steps'])} steps"


def judge_clip(c, got, ulps):
    ta, tt = got["total"], c["torch"]["total"]
    if not (same_nonfinite(ta, tt) if not (math.isfinite(ta) and math.isfinite(tt))
            else abs(ta - tt) <= 1e-5 * abs(tt) + 1e-44):
        return "MISMATCH", f"total norm: accel {ta!r}, torch {tt!r}"
    for j, (a, t) in enumerate(zip(got["grads"], c["torch"]["grads"])):
        if (a is None) != (t is None):
            return "MISMATCH", f"grad {j}: None on one side"
        if a is not None:
            # the coefficient is max_norm / (total + 1e-6): relative 1e-5 as the total's
            bad = close_tensor(a, t, 1e-5 * finite_max(t) + 1e-44)
            if bad:
                return "MISMATCH", f"grad {j}: {bad} (total {tt!r})"
    return "match", f"total {tt!r}"


def close_lr(a, t):
    return a == t or abs(a - t) <= 1e-12 * abs(t)


def judge_sched(c, got, ulps):
    for k, (la, lt) in enumerate(zip(got["lrs"], c["torch"]["lrs"])):
        for g, (a, t) in enumerate(zip(la, lt)):
            if not close_lr(a, t):
                return "MISMATCH", f"step {k}, group {g}: lr accel {a!r}, torch {t!r}"
    return "match", f"{c['steps']} steps"


def judge_fp16(c, got, ulps):
    for k, (a, t) in enumerate(zip(got["steps"], c["torch"]["steps"])):
        if a["scale"] != t["scale"] or a["skipped"] != t["skipped"]:
            return "MISMATCH", (f"micro-batch {k}: scale accel {a['scale']!r} skipped {a['skipped']}, torch "
                                f"{t['scale']!r} skipped {t['skipped']}")
        if not close_lr(a["lr"], t["lr"]):
            return "MISMATCH", f"micro-batch {k}: lr accel {a['lr']!r}, torch {t['lr']!r}"
        bad = close_tensor(a["params"], t["params"], ulps * (k + 1) * F32_EPS * max(1.0, finite_max(t["params"])))
        if bad:
            return "MISMATCH", f"micro-batch {k}: parameters {bad}"
    return "match", f"{len(c['micro'])} micro-batches"


def main():
    ap = sweep_args(__doc__, 600, FAMILIES)
    ap.add_argument("--ulps", type=float, default=4.0)
    a = ap.parse_args()
    if a.worker:
        worker(a.lib)
        return

    def judge(d, c):
        with open(os.path.join(d, "accel.json")) as f:
            got = json.load(f)
        if "refused" in got:
            expected = "error" in c["torch"] or (c["family"] == "clip" and math.isnan(c["torch"]["total"]))
            # the message with its numbers as N: the report lists each kind once
            return ("refused", re.sub(r"(?<![\w.])-?\d[\d.]*(e[-+]?\d+)?", "N", got["refused"])) if expected else \
                ("MISMATCH", "accel refused a case torch runs: " + got["refused"])
        if "error" in c["torch"]:
            return "MISMATCH", "accel ran a case torch refuses: " + c["torch"]["error"]
        j = {"sgd": judge_optim, "adam": judge_optim, "adamw": judge_optim, "clip": judge_clip,
             "sched": judge_sched, "fp16": judge_fp16}[c["family"]]
        return j(c, got, a.ulps)

    def show(c):
        """The case without its values (the case folder's case.json has them: --work or --keep)."""
        if "groups" in c:
            return [{"groups": [{"h": g["h"], "shapes": [p["shape"] for p in g["params"]]} for g in c["groups"]],
                     "steps": len(c["steps"]), "set": [[k, s["set"]] for k, s in enumerate(c["steps"]) if "set" in s],
                     "reload": [k for k, s in enumerate(c["steps"]) if s.get("reload")]}]
        return [{k: v for k, v in c.items() if k not in ("torch", "params", "micro")}]

    run_sweep(a, FAMILIES, "accel_optsweep_", make_case, judge, show=show, script=__file__)


if __name__ == "__main__":
    main()
