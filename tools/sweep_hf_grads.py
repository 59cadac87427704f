#!/usr/bin/env python3
"""A generated sweep of training numerics: accel's loss and every parameter's
gradient against transformers', on padded batches with ignored labels.

    python3 tools/sweep_hf_grads.py [--n N] [--seed S] [--families a,b] [--lib PATH]
                                    [--work DIR] [--keep] [--tol T] [--timeout SEC]
                                    [--dtype bfloat16] [--preload "LIBASAN LIBUBSAN"] [--packed]

Each case takes tools/sweep_hf_configs.py's checkpoint (its make_case: a
random config of the family, random weights, f32 or --dtype), every dropout
0, and draws a batch of 1-3 rows of T ids, the rows of lengths 1..T (one of
T), left- or right-padded (or not) with an attention mask, decoders half
the time with position_ids (generate's mask.cumsum - 1, those plus an
offset, or restarting at a random column), and runs transformers' training
step on it: eval mode (no dropout; the gradients are still taken), its
default attention (SDPA; Gemma 2: eager), as accel follows it (docs/nn.md
"Padded batches": a left pad's query that sees no key). The runs, each a loss and every parameter's gradient
(model.zero_grad(), loss.backward(), under the checkpoint's names):

    lm    decoders: model(ids, attention_mask, labels) with labels -100 at
          the pads and at random other positions (transformers shifts them:
          the mean over the positions whose next label counts; no
          num_items_in_batch: a plain mean). accel: accel_llama_forward_ex
          with the mask, accel_cross_entropy against the shifted labels
          (ignore_index -100), accel_backward; again with gradient
          checkpointing on every decoder layer (lm_ckpt)
    pad   decoders: labels = ids, -100 at the pads only. accel:
          accel_llama_loss_ex with the mask (its documented loss)
    mlm   encoders: BertForMaskedLM (RobertaForMaskedLM ...) with labels the
          ids at random kept positions, -100 elsewhere, and token_type_ids.
          accel: accel_bert_mlm_loss (also with gradient checkpointing:
          mlm_ckpt)
    cls   encoders: ...ForSequenceClassification (2-5 labels, single-label
          cross-entropy), its head drawn too and saved in DIR/cls. accel:
          accel_bert_from_pretrained_head + accel_bert_loss

--packed: the decoders' batches are packed rows instead
(DataCollatorWithFlattening's format): 1-3 rows of T ids, each a run of
sequences cut at random columns, their position ids restarting at 0 or at a
small offset (a restart is any step other than +1, find_packed_sequence_indices'
rule), no attention_mask, and transformers' runs with use_cache=False (each
sequence attends within itself); lm's labels as above, pad's the collator's
(-100 at each sequence's first token). accel: accel_llama_inputs with no_cache
and no mask (lm, lm_ckpt; pad: accel_llama_loss_ex, whose packed loss is the
collator's). Without it the draws are those of earlier runs, seed for seed.

A case is match when every run's loss is within tol (relative) and every
gradient's max |accel - transformers| <= tol * max(1, max |transformers|)
(--tol 1e-4; in bf16 also within 4 bf16 units in the last place of the
scale, or as close to transformers' f32 step as twice transformers' bf16
one, per parameter), else MISMATCH naming the run
and the parameter; refused (accel's error, listed), CRASH or HANG as in
sweep_hf_configs.py, whose case loop, workers and report this reuses
(sweep_args, run_sweep). Exit status 1 on MISMATCH, CRASH or HANG.
"""
import ctypes
import json
import math
import os
import random
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_hf_configs as hf  # noqa: E402  (its config drawing, case making, case loop and report)

ROOT = hf.ROOT
BERT_SEQUENCE_CLASSIFICATION = 0  # accel_bert_head
ACCEL_I64 = 4                     # accel_dtype


# ------------------------------------------------------------ transformers

def draw_batch(r, vocab, T, pad):
    """(ids, mask, side): B rows of T ids, one of length T, the others 1..T, padded with pad on one side."""
    B = r.randint(1, 3)
    side = r.choice(["left", "right", "none"])
    lengths = [T] + [T if side == "none" else r.randint(1, T) for _ in range(B - 1)]
    r.shuffle(lengths)
    ids, mask = [], []
    for n in lengths:
        row = [r.randrange(vocab) for _ in range(n)]
        fill = [pad] * (T - n)
        ids.append(fill + row if side == "left" else row + fill)
        mask.append([0] * (T - n) + [1] * n if side == "left" else [1] * n + [0] * (T - n))
    return ids, mask, side


def position_ids(r, mask, limit):
    """None (transformers' 0..T-1 in every row), or half the time position ids: generate's (mask.cumsum - 1,
    0 at the pads), or those plus an offset, or restarting at random columns; all below limit (GPT-2's
    n_positions)."""
    kind = r.choice([None, None, "generate", "offset", "offset", "restart"])
    T = len(mask[0])
    if kind is None:
        return None
    gen = [[max(0, sum(row[:t + 1]) - 1) for t in range(T)] for row in mask]
    if kind == "generate":
        return gen
    if kind == "offset":
        off = max(1, min(r.choice([r.randint(1, 16), r.randint(16, 96)]), limit - T))
        return [[min(limit - 1, p + off) for p in row] for row in gen]
    out = []
    for row in gen:
        start = r.randrange(T)
        out.append([p if t < start else min(limit - 1, p - row[start] + r.randint(0, 3)) for t, p in enumerate(row)])
    return out


def packed_positions(r, T, B, limit):
    """B rows of T position ids, each a run of sequences cut at random columns (a quarter), each starting at 0
    or (a third) at 1..4; all below limit (GPT-2's n_positions)."""
    out = []
    for _ in range(B):
        row, p = [], 0
        for t in range(T):
            if t == 0 or r.random() < 0.25:
                p = 0 if r.random() < 2 / 3 else r.randint(1, 4)
            row.append(min(limit - 1, p))
            p += 1
        out.append(row)
    return out


def first_tokens_ignored(ids, pos):
    """DataCollatorWithFlattening's labels: ids, -100 at each packed sequence's first token (where the position
    does not step by +1: transformers' find_packed_sequence_indices)."""
    return [[-100 if t == 0 or prow[t] != prow[t - 1] + 1 else x for t, x in enumerate(row)]
            for row, prow in zip(ids, pos)]


def causal_labels(r, ids, mask):
    """ids, -100 at the pads and (a quarter) at other positions; at least one label after the first column."""
    while True:
        labels = [[t if m and r.random() >= 0.25 else -100 for t, m in zip(row, mrow)]
                  for row, mrow in zip(ids, mask)]
        if any(x != -100 for row in labels for x in row[1:]):
            return labels


def mlm_labels(r, ids, mask):
    """The ids at a random third of the kept positions (at least one), -100 elsewhere."""
    while True:
        labels = [[t if m and r.random() < 0.35 else -100 for t, m in zip(row, mrow)]
                  for row, mrow in zip(ids, mask)]
        if any(x != -100 for row in labels for x in row):
            return labels


def no_dropout(model):
    import torch
    for mod in model.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0


def step(model, prefix, **kw):
    """{prefix + "loss", prefix + "g.<param>"} of one training step (every gradient, zeros where none)."""
    import torch
    from transformers.core_model_loading import revert_weight_conversion
    model.zero_grad()
    loss = model(**kw).loss
    loss.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().float()
             for n, p in model.named_parameters()}
    out = {prefix + "loss": loss.detach().float().reshape(1)}
    for n, t in revert_weight_conversion(model, grads).items():
        out[prefix + "g." + n] = t
    return out


def steps(model, family, case, dtype):
    """transformers' runs of the case (a dict of lists) on model (in dtype)."""
    import torch
    ids, mask = torch.tensor(case["ids"]), torch.tensor(case["mask"])
    if family in hf.ENCODERS:
        tt = torch.tensor(case["token_type_ids"])
        return step(model, "mlm.", input_ids=ids, attention_mask=mask, token_type_ids=tt,
                    labels=torch.tensor(case["labels"]))
    pos = None if case["position_ids"] is None else torch.tensor(case["position_ids"])
    if case.get("packed"):  # no mask, no cache: transformers' packed-sequence attention
        flat = torch.tensor(case["flat_labels"])
        out = step(model, "lm.", input_ids=ids, position_ids=pos, labels=torch.tensor(case["labels"]),
                   use_cache=False)
        out.update(step(model, "pad.", input_ids=ids, position_ids=pos, labels=flat, use_cache=False))
        return out
    out = step(model, "lm.", input_ids=ids, attention_mask=mask, position_ids=pos, labels=torch.tensor(case["labels"]))
    out.update(step(model, "pad.", input_ids=ids, attention_mask=mask, position_ids=pos,
                    labels=ids.masked_fill(mask == 0, -100)))
    return out


def classifier(d, family, case, dtype, seed):
    """d's encoder under a sequence-classification head of random weights, saved in d/cls; its run."""
    import torch
    from transformers import AutoModelForSequenceClassification
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(d, num_labels=case["num_labels"], dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "classifier" in name:
                p.copy_(0.15 * torch.randn_like(p))
    cls = os.path.join(d, "cls")
    model.to(getattr(torch, dtype)).save_pretrained(cls, safe_serialization=True)
    runs = {}
    for dt in {dtype, "float32"}:
        m = AutoModelForSequenceClassification.from_pretrained(cls, dtype=getattr(torch, dt)).eval()
        no_dropout(m)
        runs[dt] = step(m, "cls.", input_ids=torch.tensor(case["ids"]), attention_mask=torch.tensor(case["mask"]),
                        token_type_ids=torch.tensor(case["token_type_ids"]),
                        labels=torch.tensor(case["cls_labels"]))
    return runs


def make_grad_case(family, seed, d, dtype, packed=False):
    """make_case's checkpoint in d, a batch drawn for it (packed: packed rows for a decoder), transformers' runs:
    d/grad_case.json (inputs) and d/grad_want.safetensors (losses, gradients; in bf16 also f32.<key>:
    transformers' f32 step's)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    extra = hf.make_case(family, seed, d, dtype)
    encoder = family in hf.ENCODERS
    auto = AutoModelForMaskedLM if encoder else AutoModelForCausalLM
    cfg = auto.from_pretrained(d, dtype=torch.float32).config
    r = random.Random(seed * 7 + 5)
    vocab = cfg.vocab_size
    if family == "gpt2":  # learned positions end at n_positions
        T = r.randint(2, min(16, cfg.n_positions))
    elif encoder:  # RoBERTa's positions start after the pad id's
        room = cfg.max_position_embeddings - (0 if family == "bert" else (cfg.pad_token_id or 0) + 1)
        T = r.randint(2, min(16, room))
    else:
        T = r.randint(2, 16)
    # the encoders pad with their pad id (RoBERTa's positions count the ids that are not it)
    pad = (cfg.pad_token_id or 0) if encoder else r.randrange(vocab)
    ids, mask, side = draw_batch(r, vocab, T, pad)
    case = dict(family=family, ids=ids, mask=mask, side=side, dtype=dtype)
    if encoder:
        case["token_type_ids"] = [[r.randrange(cfg.type_vocab_size) for _ in row] for row in ids]
        case["labels"] = mlm_labels(r, ids, mask)
        case["num_labels"] = r.randint(2, 5)
        case["cls_labels"] = [r.randrange(case["num_labels"]) for _ in ids]
    elif packed:
        limit = cfg.n_positions if family == "gpt2" else 1 << 20
        case.update(packed=True, side="packed", mask=[[1] * T for _ in ids])
        case["position_ids"] = packed_positions(r, T, len(ids), limit)
        case["labels"] = causal_labels(r, ids, case["mask"])
        case["flat_labels"] = first_tokens_ignored(ids, case["position_ids"])
    else:
        case["labels"] = causal_labels(r, ids, mask)
        case["position_ids"] = position_ids(r, mask, cfg.n_positions if family == "gpt2" else 1 << 20)
    runs = {}
    for dt in {dtype, "float32"}:
        model = auto.from_pretrained(d, dtype=getattr(torch, dt)).eval()
        no_dropout(model)
        runs[dt] = steps(model, family, case, dt)
    if encoder:
        for dt, run in classifier(d, family, case, dtype, seed).items():
            runs[dt].update(run)
    want = dict(runs[dtype])
    if dtype != "float32":  # transformers' f32 step: how close its own bf16 one comes
        want.update({"f32." + k: t for k, t in runs["float32"].items()})
    if not all(torch.isfinite(t).all() for t in want.values()):
        case["nonfinite"] = True  # a step transformers cannot take in this dtype: not compared
    with open(os.path.join(d, "grad_case.json"), "w") as f:
        json.dump(case, f)
    save_file({k: t.float().contiguous() for k, t in want.items()}, os.path.join(d, "grad_want.safetensors"))
    return extra, case


# ------------------------------------------------------------ accel (worker)

class Tensor(ctypes.Structure):
    """The leading fields of struct accel_tensor (include/accel/core.h): the ones a user reads, through grad."""
    _fields_ = [("magic", ctypes.c_uint32), ("gen", ctypes.c_uint32), ("dtype", ctypes.c_int),
                ("device_type", ctypes.c_int), ("device_index", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 8), ("stride", ctypes.c_int64 * 8), ("data", ctypes.c_void_p),
                ("flags", ctypes.c_uint32), ("requires_grad", ctypes.c_bool), ("grad", ctypes.c_void_p)]


class StateEntry(ctypes.Structure):
    """accel_state_entry (include/accel/nn.h)."""
    _fields_ = [("name", ctypes.c_char_p), ("t", ctypes.POINTER(Tensor)), ("owner", ctypes.c_void_p),
                ("is_buffer", ctypes.c_bool), ("is_tied_alias", ctypes.c_bool)]


class StateDict(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int), ("entries", ctypes.POINTER(StateEntry)), ("names", ctypes.c_char_p)]


class LlamaInputs(ctypes.Structure):
    """accel_llama_inputs (include/accel/nn.h)."""
    _fields_ = [("ids", ctypes.c_void_p), ("attention_mask", ctypes.c_void_p), ("position_ids", ctypes.c_void_p),
                ("cache", ctypes.c_void_p), ("no_cache", ctypes.c_bool)]


class Failed(Exception):
    """An accel call that returned its error."""


class Accel(hf.Accel):
    """The sibling's calls and the training ones."""

    def __init__(self, path):
        super().__init__(path)
        vp, i, i64, p64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
        sig = {
            "accel_tensor_wrap": (vp, [vp, i, i, p64, type(self.cpu)]),
            "accel_llama_forward_ex": (vp, [vp, ctypes.POINTER(LlamaInputs)]),
            "accel_llama_loss_ex": (vp, [vp, ctypes.POINTER(LlamaInputs)]),
            "accel_cross_entropy": (vp, [vp, vp, i64]),
            "accel_bert_mlm_loss": (vp, [vp, vp, vp, vp, vp, vp]),
            "accel_bert_loss": (vp, [vp, vp, vp, vp, vp, vp]),
            "accel_backward": (i, [vp]),
            "accel_module_train": (None, [vp, ctypes.c_bool]),
            "accel_module_set_gradient_checkpointing": (i, [vp, ctypes.c_bool]),
            "accel_module_state_dict": (ctypes.POINTER(StateDict), [vp]),
            "accel_state_dict_free": (None, [ctypes.POINTER(StateDict)]),
        }
        for name, (res, args) in sig.items():
            f = getattr(self.L, name)
            f.restype, f.argtypes = res, args
        self.L.accel_set_grad_enabled(True)
        self.keep, self.wrapped = [], []  # the case's host buffers and the tensors over them

    def check(self, x, what):
        if not x:
            raise Failed(f"{what}: {self.error()}")
        return x

    def wrap(self, rows):
        """An i64 tensor over a host copy of rows (a list of lists or a list)."""
        flat = [x for row in rows for x in row] if isinstance(rows[0], list) else rows
        shape = [len(rows), len(rows[0])] if isinstance(rows[0], list) else [len(rows)]
        buf = (ctypes.c_int64 * len(flat))(*flat)
        self.keep.append(buf)
        t = self.check(self.L.accel_tensor_wrap(buf, ACCEL_I64, len(shape), (ctypes.c_int64 * 2)(*shape),
                                                self.cpu), "accel_tensor_wrap")
        self.wrapped.append(t)
        return t

    def run_one(self, load, loss_of, checkpointing, prefix):
        """One training step: a fresh model (load(disp)), its loss (loss_of(m)), backward; the loss and every
        gradient into d/<prefix>accel.safetensors."""
        disp, out = ctypes.c_void_p(), {}
        m = load(disp)
        try:
            self.check(m, "loading")
            self.L.accel_module_train(m, False)
            if checkpointing and self.L.accel_module_set_gradient_checkpointing(m, True):
                raise Failed("gradient checkpointing: " + self.error())
            loss = self.check(loss_of(m), prefix + "loss")
            if self.L.accel_backward(loss):
                raise Failed("backward: " + self.error())
            out[prefix + "loss"] = loss
            sd = self.check(self.L.accel_module_state_dict(m), "state dict")
            for k in range(sd.contents.n):
                e = sd.contents.entries[k]
                if e.is_tied_alias or e.is_buffer or not e.t.contents.grad:
                    continue
                out[prefix + "g." + e.name.decode()] = e.t.contents.grad
            self.L.accel_state_dict_free(sd)
            self.save(out, os.path.join(self.dir, prefix + "accel.safetensors"))
        finally:
            self.L.accel_step_reset()
            if m:
                self.L.accel_module_free(m)
            if disp:
                self.L.accel_dispatched_free(disp)

    def save(self, out, path):
        names = (ctypes.c_char_p * len(out))(*[k.encode() for k in out])
        ts = (ctypes.c_void_p * len(out))(*out.values())
        if self.L.accel_safetensors_save(path.encode(), len(out), names, ts, 0, None):
            raise Failed("saving: " + self.error())

    def run_case(self, d):
        """accel's runs of d/grad_case.json into d/<run>.accel.safetensors: None, or accel's error."""
        with open(os.path.join(d, "grad_case.json")) as f:
            c = json.load(f)
        self.dir, L = d, self.L
        try:
            ids, mask = self.wrap(c["ids"]), self.wrap(c["mask"])
            labels = self.wrap(c["labels"])
            if c["family"] in hf.ENCODERS:
                tt = self.wrap(c["token_type_ids"])
                mlm = lambda disp: L.accel_bert_from_pretrained_head(d.encode(), hf.BERT_MASKED_LM, 0, self.cpu)  # noqa
                for ckpt, prefix in ((False, "mlm."), (True, "mlm_ckpt.")):
                    self.run_one(mlm, lambda m: L.accel_bert_mlm_loss(m, ids, tt, mask, labels, None), ckpt, prefix)
                cls = os.path.join(d, "cls").encode()
                targets = self.wrap(c["cls_labels"])
                self.run_one(lambda disp: L.accel_bert_from_pretrained_head(cls, BERT_SEQUENCE_CLASSIFICATION, 0,
                                                                            self.cpu),
                             lambda m: L.accel_bert_loss(m, ids, tt, mask, targets, None), False, "cls.")
            else:
                # transformers' shift: position t predicts label t + 1, the last position nothing
                shifted = self.wrap([row[1:] + [-100] for row in c["labels"]])
                pos = None if c["position_ids"] is None else self.wrap(c["position_ids"])
                # packed: no mask, and transformers' use_cache=False
                inputs = LlamaInputs(ids, None, pos, None, True) if c.get("packed") else LlamaInputs(ids, mask, pos, None)
                llama = lambda disp: L.accel_llama_from_pretrained(d.encode(), None, None, None, None,  # noqa
                                                                  ctypes.byref(disp))

                def lm(m):
                    logits = L.accel_llama_forward_ex(m, ctypes.byref(inputs))
                    return logits and L.accel_cross_entropy(logits, shifted, -100)
                for ckpt, prefix in ((False, "lm."), (True, "lm_ckpt.")):
                    self.run_one(llama, lm, ckpt, prefix)
                self.run_one(llama, lambda m: L.accel_llama_loss_ex(m, ctypes.byref(inputs)), False, "pad.")
            err = None
        except Failed as e:
            err = str(e)
        for t in self.wrapped:
            L.accel_tensor_free(t)
        self.keep, self.wrapped = [], []
        L.accel_step_reset()
        L.accel_clear_error()
        return err


def worker(lib):
    acc = Accel(lib)
    hf.serve(lambda d, _family: acc.run_case(d))


# ------------------------------------------------------------ compare, report

def compare(d, case, tol):
    """(verdict, notes): every run's loss and gradients against transformers'."""
    from safetensors.torch import load_file
    want = load_file(os.path.join(d, "grad_want.safetensors"))
    notes, good = [], True
    runs = ["mlm", "mlm_ckpt", "cls"] if case["family"] in hf.ENCODERS else ["lm", "lm_ckpt", "pad"]
    for run in runs:
        ref = run.replace("_ckpt", "")
        got = load_file(os.path.join(d, run + ".accel.safetensors"))
        worst, worst_name = 0.0, None
        for key, w in want.items():
            if not key.startswith(ref + "."):
                continue
            name = key[len(ref) + 1:]
            g = got.get(run + "." + name)
            if g is None:
                if name == "loss" or w.abs().max() > 0:
                    return "MISMATCH", f"{run}: no {name} in accel's step"
                continue
            g = g.float().reshape(w.shape) if g.numel() == w.numel() else g.float()
            if g.shape != w.shape:
                return "MISMATCH", f"{run}: {name} shape {tuple(g.shape)}, transformers {tuple(w.shape)}"
            err = float((g - w).abs().max())
            if math.isnan(err):
                return "MISMATCH", f"{run}: {name} not finite"
            scale = abs(float(w)) if name == "loss" else max(1.0, float(w.abs().max()))
            over = err / max(tol * scale, 1e-30)
            if "f32." + key in want:  # bf16: or as close to transformers' f32 step as twice its own bf16 one,
                f32 = want["f32." + key]  # or 4 bf16 units in the last place of the scale (the sibling's rule)
                ulps = 4 * 2.0 ** (math.floor(math.log2(scale)) - 7)
                over = min(over, err / ulps,
                           float((g - f32).abs().max()) / max(2 * float((w - f32).abs().max()), 1e-30))
            if name == "loss":
                notes.append(f"{run} loss {float(w):.6g} |diff| {err:.3g}")
            if over > worst:
                worst, worst_name = over, f"{name} max |diff| {err:.3g} (scale {scale:.3g})"
        if worst > 1:
            good = False
            notes.append(f"{run}: {worst_name}")
    return ("match" if good else "MISMATCH"), "; ".join(notes)


def main():
    ap = hf.sweep_args(__doc__, 210, hf.FAMILIES)
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="loss: |diff| <= tol |loss|; a gradient: max |diff| <= tol * max(1, max |grad|)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the checkpoints' dtype, which both train in (bfloat16: also within 4 bf16 units in "
                         "the last place of the scale, or as close to transformers' f32 step as twice its bf16 "
                         "one; transformers' MoE families fail on CPU in bf16)")
    ap.add_argument("--packed", action="store_true",
                    help="the decoders' batches packed rows (position ids that restart, no mask, use_cache=False)")
    a = ap.parse_args()
    if a.worker:
        worker(a.lib)
        return
    warnings.filterwarnings("ignore")

    def judge(d, made):
        case = made[1]
        if case.get("nonfinite"):
            return "refused", "transformers' step is not finite in this dtype (not compared)"
        return compare(d, case, a.tol)

    def show(made):
        extra, c = made
        return [extra, {k: c.get(k) for k in ("ids", "mask", "side", "labels", "position_ids", "flat_labels")}]

    hf.run_sweep(a, hf.FAMILIES, "accel_gradsweep_",
                 lambda family, seed, d: make_grad_case(family, seed, d, a.dtype, a.packed), judge, show,
                 script=__file__)


if __name__ == "__main__":
    main()
