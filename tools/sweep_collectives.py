#!/usr/bin/env python3
"""A generated sweep of the Accelerator's process collectives against Accelerate's, on 2-4
processes.

    python3 tools/sweep_collectives.py [--n 600] [--seed 0] [--accel build/bin/accel]
                                       [--shim build/bin/coll_sweep_shim] [--work DIR] [--keep]
                                       [--timeout SEC] [--verbose]

Each case (its own seeded random.Random) draws a number of processes (2-4), an operation, a dtype
(float32, bfloat16, float16, float64, int64, int32, int8, uint8, bool; gloo has no int16) and
every rank's tensor (0-d to 4-d, dims of 0-4, values over the dtype's range with inf, NaN, -0.0
and subnormals):

  gather     equal shapes; now and then the ranks' shapes differ
  gfm        gather_for_metrics with no data loader, at the first batch or at the last batch of a
             prepared loader of LEN samples in batches of BS (the remainder cut); accel also runs
             gather_for_metrics_n of the tensor twice, both compared with the peer's result
  reduce     sum / mean / max, scale 1 or another (see below), shapes as gather's
  pad        pad_across_processes: the ranks' sizes along dim differ (and the other dims now and
             then), dim from -ndim-1 to ndim (out of range too), pad_index of every kind
             (0, -1, 0.5, 300, 2**40, inf, nan), pad_first
  broadcast  from a random rank (now and then one that is not: -1, N), shapes as gather's

The peer is Accelerate's utils.operations (gather, reduce, pad_across_processes, broadcast) and
Accelerator.gather_for_metrics, under torch.distributed with gloo on 127.0.0.1 in N processes
(torch.multiprocessing); accel is build/bin/coll_sweep_shim (tools/coll_sweep_shim.c) under
`build/bin/accel launch --num_processes N`. The cases of one N run in one launch on each side. Per
rank every result is compared bit for bit (dtype, shape, bytes; in a reduce's float result any NaN
equals any NaN), and errors: both refuse, or neither.

Where the peer's behaviour is not defined the case is judged against the documented rule
(docs/accelerator.md, Collectives):
  - ranks with different shapes (gather, gfm, reduce, broadcast): gloo's all-gather then returns
    another rank's bytes misread or aborts the process, so the peer runs such a case in Accelerate's
    debug mode (its shape check, DistributedOperationException); accel must refuse it too
  - reduce with scale != 1: Accelerate applies scale on XLA only (all_reduce(op, [t], scale)), so
    the peer computes XLA's rule: the reduced tensor times scale, then / N for mean, each in the
    tensor's dtype
  - max where a rank holds a NaN: accel's is NaN (torch.maximum's rule); of 0.0 and -0.0 the
    lowest rank's; gloo's std::max keeps the NaN or drops it, and picks the zero, by the order the
    ranks' values meet
  - a bool tensor's sum: torch (gloo) leaves the count in the bool's byte (2 for two trues);
    accel's is any-true, byte 1: compared as truth values
  - accel's documented refusals: pad_across_processes with a dim out of range (Accelerate returns
    the tensor unpadded) and a pad_index the tensor's dtype cannot hold (Accelerate wraps it,
    or returns a float tensor, on the padded ranks only); a bool tensor is padded as bool
    (Accelerate's pad returns int64 on the padded ranks)

A case ends match, refused (both refuse), documented (one of the rules above), or MISMATCH; a
launch that hangs or crashes marks its unanswered cases HANG / CRASH. Exit status 1 on any
MISMATCH, HANG or CRASH.
"""
import argparse
import math
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# int16 is not among them: torch's gloo refuses it ("Invalid scalar type") for every collective.
DTYPES = ["float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]
FLOATS = {"float32", "bfloat16", "float16", "float64"}
OPS = ["gather", "gfm", "reduce", "pad", "broadcast"]
PAD_INDICES = ["0", "-1", "1", "0.5", "300", "1099511627776", "inf", "nan", "-2.5"]


# ------------------------------------------------------------ drawing

def element_bytes(r, dtype, exact):
    """One element's bytes; exact: small integers, whose sums no order of addition rounds."""
    if dtype == "bool":
        return bytes([r.random() < 0.5])
    if dtype in FLOATS:
        if exact:
            v = float(r.randint(-8, 8)) / r.choice([1, 2, 4])
        else:
            v = r.choice([r.uniform(-1, 1), r.uniform(-1e4, 1e4), 0.0, -0.0, math.inf, -math.inf, math.nan,
                          r.uniform(-1, 1) * 1e-42, r.uniform(-1, 1) * 6e-8, 65504.0, 3e38, 1.0 / 3])
        if dtype == "float64":
            return struct.pack("<d", v)
        if dtype == "float16":
            return struct.pack("<e", v) if abs(v) <= 65504 or not math.isfinite(v) else struct.pack("<e", math.copysign(math.inf, v))
        f = struct.pack("<f", v) if abs(v) < 3.4e38 or not math.isfinite(v) else struct.pack("<f", v / 10)
        return f[2:] if dtype == "bfloat16" else f  # bf16: the top half of the f32 (truncated)
    bits = {"int64": 64, "int32": 32, "int16": 16, "int8": 8, "uint8": 8}[dtype]
    lo, hi = (0, 2 ** bits - 1) if dtype == "uint8" else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
    if exact:
        v = r.randint(max(lo, -8), 8)
    else:
        v = r.choice([r.randint(lo, hi), r.randint(max(lo, -100), 100), lo, hi])
    return v.to_bytes(bits // 8, "little", signed=dtype != "uint8")


def tensor_hex(r, dtype, shape, exact):
    n = math.prod(shape)
    return "".join(element_bytes(r, dtype, exact).hex() for _ in range(n)) or "-"


def draw_shape(r, ndim):
    return [r.choice([0, 1, 1, 2, 3, 4]) if r.random() < 0.9 else r.randint(1, 4) for _ in range(ndim)]


def make_case(i, seed):
    r = random.Random(seed * 1000003 + i)
    n = r.choice([2, 2, 3, 4])
    op = r.choice(OPS)
    dtype = r.choice(DTYPES)
    ndim = r.choice([0, 1, 1, 2, 2, 3, 4])
    c = dict(id=f"c{i}", op=op, dtype=dtype, ndim=ndim, n=n, dim=0, pad_index="0", pad_first=0,
             reduction="sum", scale="1", src=0, len=0, bs=1, at=-1, debug=0)
    base = draw_shape(r, ndim)
    shapes = [list(base) for _ in range(n)]
    if op == "pad":
        c["dim"] = r.randint(-ndim - 1, ndim) if r.random() < 0.2 else (r.randint(-ndim, ndim - 1) if ndim else 0)
        d = c["dim"] + ndim if c["dim"] < 0 else c["dim"]
        for s in shapes:
            if 0 <= d < ndim:
                s[d] = r.choice([0, 1, 2, 3, 5])
            if r.random() < 0.2 and ndim:
                k = r.randrange(ndim)
                if k != d:
                    s[k] = r.randint(0, 3)
        c["pad_index"] = r.choice(PAD_INDICES[:4]) if r.random() < 0.6 else r.choice(PAD_INDICES)
        c["pad_first"] = r.randint(0, 1)
    elif r.random() < 0.12 and ndim:
        k = r.randrange(ndim)
        shapes[r.randrange(n)][k] += r.randint(1, 2)  # mismatched shapes: the peer in debug mode
        c["debug"] = 1
    if op == "reduce":
        c["reduction"] = r.choice(["sum", "mean", "max"])
        c["scale"] = "1" if r.random() < 0.6 else r.choice(["2", "0.5", "0.1", "-3", "1e-3"])
    if op == "broadcast":
        c["src"] = r.randrange(n) if r.random() < 0.95 else r.choice([n, -1])  # no such rank: both refuse
    if op == "gfm":
        c["at"] = r.choice([-1, 0, 1, 1, 1])
        c["bs"] = r.randint(1, 5)
        c["len"] = r.randint(1, 3 * n * c["bs"] + 2)
    exact = op == "reduce" and n > 2
    c["shapes"] = shapes
    c["hex"] = [tensor_hex(r, dtype, s, exact) for s in shapes]
    return c


def case_line(c):
    ranks = " ".join(" ".join(str(x) for x in s) + (" " if s else "") + h for s, h in zip(c["shapes"], c["hex"]))
    return (f"{c['id']} {c['op']} {c['dtype']} {c['ndim']} {c['n']} {ranks} {c['dim']} {c['pad_index']} "
            f"{c['pad_first']} {c['reduction']} {c['scale']} {c['src']} {c['len']} {c['bs']} {c['at']}\n")


# ------------------------------------------------------------ the peer (Accelerate)

def peer_rank(rank, n, port, cases_path, out_dir, debug):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import operations as ops
    acc = Accelerator(cpu=True)
    PartialState().debug = bool(debug)
    tdt = {k: getattr(torch, k) for k in DTYPES}
    with open(cases_path) as f, open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as out:
        for line in f:
            tok = line.split()
            cid, op, dtype, ndim, world = tok[0], tok[1], tok[2], int(tok[3]), int(tok[4])
            k = 5
            for r in range(world):
                shape = [int(x) for x in tok[k:k + ndim]]
                h = tok[k + ndim]
                k += ndim + 1
                if r == rank:
                    data = bytearray(bytes.fromhex(h) if h != "-" else b"")
                    t = (torch.frombuffer(data, dtype=tdt[dtype]) if data else torch.empty(0, dtype=tdt[dtype]))
                    t = t.reshape(shape).clone()
            dim, pad_index, pad_first, reduction, scale, src, ln, bs, at = tok[k:k + 9]

            def emit(slot, res):
                if isinstance(res, Exception):
                    msg = (type(res).__name__ + ": " + str(res)).replace("\n", " ")
                    out.write(f"{cid} {slot} err {msg}\n")
                else:
                    res = res.contiguous()
                    h = res.reshape(-1).view(torch.uint8).numpy().tobytes().hex() if res.numel() else "-"
                    shape = " ".join(str(x) for x in res.shape)
                    out.write(f"{cid} {slot} ok {str(res.dtype)[6:]} {res.ndim}{' ' if shape else ''}{shape} {h}\n")

            def attempt(fn):
                try:
                    return fn()
                except Exception as e:  # noqa: BLE001 - every refusal is a result
                    return e

            if op == "gather":
                emit(0, attempt(lambda: ops.gather(t)))
            elif op == "broadcast":
                emit(0, attempt(lambda: ops.broadcast(t.clone(), from_process=int(src))))
            elif op == "pad":
                pi = float(pad_index) if any(ch in pad_index for ch in ".naie") else int(pad_index)
                emit(0, attempt(lambda: ops.pad_across_processes(t, dim=int(dim), pad_index=pi,
                                                                 pad_first=bool(int(pad_first)))))
            elif op == "reduce":
                if float(scale) == 1.0:
                    emit(0, attempt(lambda: ops.reduce(t, reduction=reduction)))
                else:  # XLA's rule: times scale after the all-reduce, then / N for mean
                    def xla():
                        x = ops.reduce(t, reduction="max" if reduction == "max" else "sum")
                        x *= float(scale)
                        if reduction == "mean":
                            x /= world
                        return x
                    emit(0, attempt(xla))
            elif op == "gfm":
                at = int(at)
                if at < 0:
                    emit(0, attempt(lambda: acc.gather_for_metrics(t)))
                else:
                    dl = acc.prepare(DataLoader(TensorDataset(torch.arange(int(ln))), batch_size=int(bs)))
                    done = False
                    for i, _ in enumerate(dl):
                        if not done and (at == 0 or acc.gradient_state.end_of_dataloader):
                            emit(0, attempt(lambda: acc.gather_for_metrics(t)))
                            done = True
                    acc._dataloaders.clear()
            out.flush()


def run_peer(n, cases_path, out_dir, debug, timeout):
    """Accelerate's side in n processes: "ok", "hang" or "crash: <its stderr's tail>"."""
    code = ("import sys; sys.path.insert(0, %r); import sweep_collectives as s, torch.multiprocessing as mp; "
            "mp.spawn(s.peer_rank, args=(%d, %d, %r, %r, %d), nprocs=%d)"
            % (os.path.dirname(os.path.abspath(__file__)), n, free_port(), cases_path, out_dir, debug, n))
    return run_bounded([sys.executable, "-c", code], None, timeout)


def run_accel(accel, shim, n, cases_path, out_dir, debug, timeout):
    """accel's side: the shim under `accel launch`; as run_peer."""
    env = dict(os.environ, ACCEL_DIST_TIMEOUT="30", ACCEL_DEBUG_MODE=str(debug))
    return run_bounded([accel, "launch", "--quiet", "--main_process_port", "0", "--num_processes", str(n),
                        shim, cases_path, out_dir], env, timeout)


def run_bounded(argv, env, timeout):
    """argv in a session of its own (env None: ours): "ok", "hang" (killed, the whole session, past timeout
    seconds) or "crash: " with the end of its stderr."""
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        return "hang"
    return "ok" if p.returncode == 0 else "crash: " + err.decode(errors="replace")[-400:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_results(out_dir, n):
    """{(id, rank, slot): ("ok", dtype, shape, hex) | ("err", message)}"""
    res = {}
    for rank in range(n):
        path = os.path.join(out_dir, f"rank{rank}.txt")
        if not os.path.exists(path):
            continue
        for line in open(path):
            tok = line.rstrip("\n").split(" ")
            key = (tok[0], rank, int(tok[1]))
            if tok[2] == "err":
                res[key] = ("err", " ".join(tok[3:]))
            else:
                nd = int(tok[4])
                res[key] = ("ok", tok[3], tuple(int(x) for x in tok[5:5 + nd]), tok[5 + nd])
    return res


# ------------------------------------------------------------ judging

def raw(h):
    return bytes.fromhex(h) if h != "-" else b""


def decode(dtype, h):
    b = raw(h)
    if dtype == "bfloat16":
        return [struct.unpack("<f", b"\0\0" + b[i:i + 2])[0] for i in range(0, len(b), 2)]
    fmt = {"float32": "f", "float16": "e", "float64": "d"}.get(dtype)
    if fmt:
        sz = struct.calcsize(fmt)
        return [struct.unpack("<" + fmt, b[i:i + sz])[0] for i in range(0, len(b), sz)]
    return list(b)


def same_values(c, dtype, ha, hp):
    if ha == hp:
        return True
    if c["op"] != "reduce" or dtype not in FLOATS:
        return False
    a, p = decode(dtype, ha), decode(dtype, hp)  # a reduce's NaN: any NaN
    return len(a) == len(p) and all((math.isnan(x) and math.isnan(y)) or
                                    struct.pack("<d", x) == struct.pack("<d", y) for x, y in zip(a, p))


def documented(c, a, p):
    """The documented rule a difference follows, or None."""
    if c["op"] == "reduce" and c["dtype"] == "bool" and a[0] == p[0] == "ok" and a[1:3] == p[1:3] and \
            [bool(v) for v in raw(a[3])] == [bool(v) for v in raw(p[3])]:
        return "reduce: a bool sum is true/false (torch's gloo leaves the count in the bool's byte)"
    if c["op"] == "reduce" and c["reduction"] == "max" and c["dtype"] in FLOATS and a[0] == p[0] == "ok" \
            and a[1:3] == p[1:3]:
        ins = [decode(c["dtype"], h) for h in c["hex"]]
        av, pv = decode(c["dtype"], a[3]), decode(c["dtype"], p[3])
        if all(struct.pack("<d", x) == struct.pack("<d", y) or (math.isnan(x) and any(math.isnan(v[i]) for v in ins))
               or x == y == 0 for i, (x, y) in enumerate(zip(av, pv))):
            return "reduce: max with a NaN is NaN, of 0.0 and -0.0 the lowest rank's (gloo's: by rank order)"
    if c["op"] != "pad":
        return None
    nd = c["ndim"]
    if a[0] == "err" and p[0] == "ok":
        if not -nd <= c["dim"] < nd and "out of range" in a[1]:
            return "pad: dim out of range refused (Accelerate returns the tensor unpadded)"
        if "pad_index" in a[1]:
            return "pad: a pad_index the dtype cannot hold refused"
    if a[0] == "ok" and p[0] == "ok" and c["dtype"] == "bool" and a[1] == "bool" and p[1] == "int64" \
            and a[2] == p[2] and list(raw(a[3])) == [1 if v else 0 for v in raw(p[3])[::8]]:
        return "pad: bool padded as bool (Accelerate: int64 on the padded ranks)"
    return None


def judge(c, acc_res, peer_res, peer_status, accel_status):
    verdicts = []
    slots = [0, 1, 2] if c["op"] == "gfm" else [0]
    for rank in range(c["n"]):
        for slot in slots:
            a = acc_res.get((c["id"], rank, slot))
            p = peer_res.get((c["id"], rank, 0))
            if a is None:
                verdicts.append(("HANG" if accel_status == "hang" else "CRASH", f"accel: no result ({accel_status})"))
                continue
            if p is None:
                verdicts.append(("HANG" if peer_status == "hang" else "CRASH", f"peer: no result ({peer_status})"))
                continue
            if a[0] == "err" and p[0] == "err":
                verdicts.append(("refused", a[1]))
            elif a[0] == "ok" and p[0] == "ok" and a[1:3] == p[1:3] and same_values(c, a[1], a[3], p[3]):
                verdicts.append(("match", ""))
            else:
                why = documented(c, a, p)
                verdicts.append(("documented", why) if why else
                                ("MISMATCH", f"rank {rank} slot {slot}: accel {a[:3]} {a[-1][:80]} / peer {p[:3]} {p[-1][:80]}"))
    order = ["CRASH", "HANG", "MISMATCH", "documented", "refused", "match"]
    return min(verdicts, key=lambda v: order.index(v[0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--accel", default=os.path.join(ROOT, "build/bin/accel"))
    ap.add_argument("--shim", default=os.path.join(ROOT, "build/bin/coll_sweep_shim"))
    ap.add_argument("--work")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--timeout", type=float, default=600.0, help="per launch, seconds")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    for path in (a.accel, a.shim):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is not built (cmake --build build)")
    work = a.work or tempfile.mkdtemp(prefix="sweep_coll_")
    os.makedirs(work, exist_ok=True)
    cases = [make_case(i, a.seed) for i in range(a.n)]
    counts, notes, bad = Counter(), defaultdict(Counter), []
    for n, debug in ((2, 0), (3, 0), (4, 0), (2, 1), (3, 1), (4, 1)):
        mine = [c for c in cases if c["n"] == n and c["debug"] == debug]
        if not mine:
            continue
        tag = f"{n}{'_debug' if debug else ''}"
        path = os.path.join(work, f"cases_{tag}.txt")
        with open(path, "w") as f:
            f.writelines(case_line(c) for c in mine)
        outs = {}
        for side in ("peer", "accel"):
            outs[side] = os.path.join(work, f"{side}_{tag}")
            shutil.rmtree(outs[side], ignore_errors=True)
            os.makedirs(outs[side])
        ps = run_peer(n, path, outs["peer"], debug, a.timeout)
        st = run_accel(a.accel, a.shim, n, path, outs["accel"], debug, a.timeout)
        print(f"{n} processes{' (debug mode)' if debug else ''}: {len(mine)} cases, peer {ps[:200]}, "
              f"accel {st[:200]}", flush=True)
        peer_res, acc_res = read_results(outs["peer"], n), read_results(outs["accel"], n)
        for c in mine:
            v, why = judge(c, acc_res, peer_res, ps, st)
            counts[v] += 1
            counts[f"{c['op']}:{v}"] += 1
            if v in ("refused", "documented"):
                notes[v][why[:160]] += 1
            if v in ("MISMATCH", "HANG", "CRASH"):
                bad.append((c, v, why))
    print(f"\n{a.n} cases (seed {a.seed}): " + ", ".join(f"{k} {counts[k]}" for k in
          ("match", "refused", "documented", "MISMATCH", "HANG", "CRASH")))
    print("by op: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if ":" in k))
    for kind in ("documented", "refused"):
        for msg, k in notes[kind].most_common(12 if a.verbose else 6):
            print(f"  {kind} x{k}: {msg}")
    for c, v, why in bad[:40]:
        print(f"{v} {c['id']} n={c['n']} {c['op']} {c['dtype']} shapes={c['shapes']} dim={c['dim']} "
              f"pad_index={c['pad_index']} first={c['pad_first']} {c['reduction']} scale={c['scale']} "
              f"src={c['src']} len={c['len']} bs={c['bs']} at={c['at']}: {why}")
    if not a.keep and not a.work:
        shutil.rmtree(work)
    else:
        print(f"work folder: {work}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
