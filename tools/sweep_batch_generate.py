#!/usr/bin/env python3
"""A generated sweep of padded batch generation (greedy): accel_generate_batch
and accel_generate against transformers' generate, case by case.

    python3 tools/sweep_batch_generate.py [--n N] [--seed S] [--families a,b] [--lib PATH]
                                          [--work DIR] [--keep] [--tol T] [--tie G] [--timeout SEC]
                                          [--preload "LIBASAN LIBUBSAN"]

Each case draws a config of a decoder family as tools/sweep_hf_configs.py
does (its make_case builds, randomizes and saves the checkpoint: sliding
windows of 2 .. 24 positions, shorter than many prompts + generations
here), then a batch of 2-4 prompts of different lengths (1..16 random ids,
some equal to the pad or eos id), left-padded with an attention mask,
max_new_tokens 1..12, a pad_token_id (now and then none: eos pads), and
half the time an eos_token_id taken from the tokens a first run generated,
so that rows finish early. transformers' generate (eager attention, do_sample=False, output_logits)
gives the sequences and every step's logits.

accel (libaccel.so through ctypes, in worker processes, as the sibling
sweep) runs accel_generate_batch on the same batch, accel_generate on each
prompt alone, and, for the logits, accel_generate with max_new_tokens 0
and prompt_logits on each row's prompt followed by the first s tokens that
transformers (and, where it differs, accel's batch) generated. Per row:

    * the logits of every step transformers took for the row (the first
      one: the padded prompt's last position) within tol * max(1, scale);
    * the batch's row, pads after eos included, equal to transformers';
    * accel_generate on the prompt alone equal to the batch's row.

The first step's logits come from accel_llama_forward_ex on the padded
batch; the later steps' from the prompt alone, and a prompt alone matches
its row, only where the RoPE does not depend on the length (dynamic and
longrope take the batch's largest position in transformers: a row's logits
then depend on the others).

Where tokens diverge, the two candidates' logits at that step (transformers'
for the batch, accel's unpadded ones for the single run) decide: a gap
below --tie * scale is a TIE (a greedy near-tie that rounding may flip), a
larger one a MISMATCH. A case is match, TIE, refused (accel's error,
listed), MISMATCH, CRASH or HANG. Exit status 1 on MISMATCH, CRASH or HANG.
"""
import ctypes
import json
import os
import random
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_hf_configs as hf  # noqa: E402  (its config drawing and case making)

ROOT = hf.ROOT
FAMILIES = hf.DECODERS
RANK = {"match": 0, "TIE": 1, "MISMATCH": 2}


# ------------------------------------------------------------ transformers

def draw_batch(r, vocab, max_total):
    """(prompts, max_new_tokens, pad id): 2-4 prompts of distinct lengths in 1..16, some ids the pad's;
    the longest prompt + max_new_tokens at most max_total."""
    n_new = r.randint(1, min(12, max_total - 2))
    longest = min(16, max_total - n_new)
    B = r.randint(2, min(4, longest))
    lengths = r.sample(range(1, longest + 1), B)
    pad = r.randrange(vocab)
    prompts = [[pad if r.random() < 0.1 else r.randrange(vocab) for _ in range(n)] for n in lengths]
    return prompts, n_new, pad


def left_pad(prompts, pad):
    T = max(len(p) for p in prompts)
    ids = [[pad] * (T - len(p)) + p for p in prompts]
    mask = [[0] * (T - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask


def tf_generate(model, ids, mask, n_new, pad, eos):
    """transformers' greedy generate: (sequences [B][T + steps], raw logits [steps][B][V])."""
    import torch
    kw = dict(max_new_tokens=n_new, do_sample=False, pad_token_id=pad, eos_token_id=eos, output_logits=True,
              return_dict_in_generate=True, bos_token_id=None, num_beams=1, top_k=None, top_p=None,
              temperature=None)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), **kw)
    return out.sequences.tolist(), [step.float().tolist() for step in out.logits]


def make_batch_case(family, seed, d):
    """make_case's checkpoint in d, a batch drawn for it, transformers' generation: d/batch.json."""
    import torch
    from transformers import AutoModelForCausalLM
    extra = hf.make_case(family, seed, d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    r = random.Random(seed * 7 + 3)
    vocab = model.config.vocab_size
    # GPT-2's learned positions end at n_positions (an IndexError past them); RoPE has no such end
    max_total = model.config.n_positions if family == "gpt2" else 28
    prompts, n_new, pad = draw_batch(r, vocab, max_total)
    ids, mask = left_pad(prompts, pad)
    eos = None
    if r.random() < 0.5:  # a token some row generates: it finishes early
        seqs, _ = tf_generate(model, ids, mask, n_new, pad, None)
        T = len(ids[0])
        eos = r.choice([t for row in seqs for t in row[T:]])
        for p in prompts:
            if r.random() < 0.2:
                p[r.randrange(len(p))] = eos
        ids, mask = left_pad(prompts, pad)
        # afresh: dynamic RoPE keeps the frequencies of the longest input the model object has seen
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    # now and then no pad_token_id: a finished row's next tokens are then eos (in both)
    pad_gen = None if eos is not None and r.random() < 0.3 else pad
    seqs, logits = tf_generate(model, ids, mask, n_new, pad_gen, eos)
    # dynamic and longrope RoPE take the batch's largest position (transformers' dynamic_rope_update): a row's
    # logits then depend on the other rows, and a prompt alone may differ from its row
    rope = json.dumps(getattr(model.config, "rope_parameters", None))
    by_length = '"dynamic"' in rope or '"longrope"' in rope
    case = dict(family=family, ids=ids, mask=mask, prompts=prompts, n_new=n_new, pad=pad_gen, eos=eos, tf=seqs,
                tf_logits=logits, rope_by_length=by_length)
    with open(os.path.join(d, "batch.json"), "w") as f:
        json.dump(case, f)
    return extra, case


# ------------------------------------------------------------ accel (worker)

class GenerateOpts(ctypes.Structure):
    """accel_generate_opts (include/accel/bigmodel.h)."""
    _fields_ = [("max_new_tokens", ctypes.c_int64), ("do_sample", ctypes.c_bool), ("temperature", ctypes.c_double),
                ("top_k", ctypes.c_int64), ("top_p", ctypes.c_double), ("seed", ctypes.c_uint64),
                ("has_eos", ctypes.c_bool), ("eos_token_id", ctypes.c_int64), ("has_pad", ctypes.c_bool),
                ("pad_token_id", ctypes.c_int64), ("prompt_logits", ctypes.c_void_p)]


class LlamaInputs(ctypes.Structure):
    """accel_llama_inputs (include/accel/nn.h)."""
    _fields_ = [("ids", ctypes.c_void_p), ("attention_mask", ctypes.c_void_p), ("position_ids", ctypes.c_void_p),
                ("cache", ctypes.c_void_p), ("no_cache", ctypes.c_bool)]


class Accel(hf.Accel):
    """The sibling's calls and the generation ones."""

    def __init__(self, path):
        super().__init__(path)
        vp, i64, p64 = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
        opts = ctypes.POINTER(GenerateOpts)
        sig = {
            "accel_generate": (ctypes.c_int, [vp, p64, i64, opts, p64, p64]),
            "accel_generate_batch": (ctypes.c_int, [vp, p64, p64, i64, i64, opts, p64, p64]),
            "accel_tensor_wrap": (vp, [vp, ctypes.c_int, ctypes.c_int, p64, type(self.cpu)]),
            "accel_llama_forward_ex": (vp, [vp, ctypes.POINTER(LlamaInputs)]),
            "accel_tensor_to_host": (ctypes.c_int, [vp, vp]),
        }
        for name, (res, args) in sig.items():
            f = getattr(self.L, name)
            f.restype, f.argtypes = res, args

    def generate(self, m, prompt, opts):
        """accel_generate's new tokens; raises with accel's error."""
        n = len(prompt)
        out = (ctypes.c_int64 * (n + opts.max_new_tokens))()
        n_out = ctypes.c_int64()
        if self.L.accel_generate(m, (ctypes.c_int64 * n)(*prompt), n, ctypes.byref(opts), out, ctypes.byref(n_out)):
            raise RuntimeError("accel_generate: " + self.error())
        return list(out[n:n_out.value])

    def logits(self, m, prompt, vocab):
        """The logits at the prompt's last position (accel_generate's prompt_logits)."""
        buf = (ctypes.c_float * vocab)()
        t = self.L.accel_tensor_wrap(buf, 0, 1, (ctypes.c_int64 * 1)(vocab), self.cpu)  # ACCEL_F32
        opts = GenerateOpts(max_new_tokens=0, prompt_logits=t)
        try:
            self.generate(m, prompt, opts)
        finally:
            self.L.accel_tensor_free(t)
        return list(buf)

    def first_logits(self, m, c, vocab):
        """Every row's logits at the padded batch's last column: generate's first forward (the mask, positions
        cumsum - 1, 0 at the pads) through accel_llama_forward_ex."""
        B, T = len(c["ids"]), len(c["ids"][0])
        pos = [[max(0, sum(row[:t + 1]) - 1) for t in range(T)] for row in c["mask"]]
        shape = (ctypes.c_int64 * 2)(B, T)
        host = [(ctypes.c_int64 * (B * T))(*[x for row in rows for x in row]) for rows in (c["ids"], c["mask"], pos)]
        ts = [self.L.accel_tensor_wrap(h, 4, 2, shape, self.cpu) for h in host]  # ACCEL_I64
        y = self.L.accel_llama_forward_ex(m, ctypes.byref(LlamaInputs(*ts, None)))
        out = (ctypes.c_float * (B * T * vocab))()
        ok = y and not self.L.accel_tensor_to_host(y, out)
        err = None if ok else "accel_llama_forward_ex: " + self.error()
        for t in ts:
            self.L.accel_tensor_free(t)
        if err:
            raise RuntimeError(err)
        return [list(out[(b * T + T - 1) * vocab:(b * T + T) * vocab]) for b in range(B)]

    def batch(self, m, c):
        B, T = len(c["ids"]), len(c["ids"][0])
        flat = lambda rows: (ctypes.c_int64 * (B * T))(*[x for row in rows for x in row])  # noqa: E731
        opts = self.options(c, c["n_new"])
        out = (ctypes.c_int64 * (B * (T + c["n_new"])))()
        cols = ctypes.c_int64()
        if self.L.accel_generate_batch(m, flat(c["ids"]), flat(c["mask"]), B, T, ctypes.byref(opts), out,
                                       ctypes.byref(cols)):
            raise RuntimeError("accel_generate_batch: " + self.error())
        n = cols.value
        return [list(out[b * n:(b + 1) * n]) for b in range(B)]

    @staticmethod
    def options(c, n_new):
        o = GenerateOpts(max_new_tokens=n_new)
        if c["pad"] is not None:
            o.has_pad, o.pad_token_id = True, c["pad"]
        if c["eos"] is not None:
            o.has_eos, o.eos_token_id = True, c["eos"]
        return o

    def run_case(self, d):
        """accel's side of d/batch.json into d/accel.json: None, or accel's error message."""
        with open(os.path.join(d, "batch.json")) as f:
            c = json.load(f)
        disp = ctypes.c_void_p()
        m = self.L.accel_llama_from_pretrained(d.encode(), None, None, None, None, ctypes.byref(disp))
        err = None
        try:
            if not m:
                raise RuntimeError(self.error())
            vocab = len(c["tf_logits"][0][0])
            T = len(c["ids"][0])
            first = self.first_logits(m, c, vocab)
            self.L.accel_step_reset()
            batch = self.batch(m, c)
            single = [self.generate(m, p, self.options(c, c["n_new"])) for p in c["prompts"]]
            forced_tf, forced_batch = [], []
            for b, p in enumerate(c["prompts"]):
                # the logits after each prefix of the row's generation (through its eos: the steps that count)
                for gen, into in ((c["tf"][b][T:], forced_tf), (batch[b][T:], forced_batch)):
                    gen = finished(gen, c["eos"])
                    into.append([] if into is forced_batch and gen == finished(c["tf"][b][T:], c["eos"]) else
                                [self.logits(m, p + gen[:s], vocab) for s in range(len(gen))])
            with open(os.path.join(d, "accel.json"), "w") as f:
                json.dump(dict(first=first, batch=batch, single=single, forced_tf=forced_tf,
                               forced_batch=forced_batch), f)
        except RuntimeError as e:
            err = str(e)
        self.L.accel_step_reset()
        if m:
            self.L.accel_module_free(m)
        if disp:
            self.L.accel_dispatched_free(disp)
        self.L.accel_clear_error()
        return err


def worker(lib):
    acc = Accel(lib)
    hf.serve(lambda d, _family: acc.run_case(d))


# ------------------------------------------------------------ compare, report

def finished(gen, eos):
    """gen through its first eos (the tokens after it are the pads)."""
    return gen[:gen.index(eos) + 1] if eos is not None and eos in gen else gen


def scale_of(logits):
    return max(1.0, max(abs(x) for x in logits))


def tie_or_mismatch(logits, a, b, tie):
    """TIE where tokens a and b score within tie * scale at the step, else MISMATCH."""
    gap = abs(logits[a] - logits[b])
    return ("TIE" if gap <= tie * scale_of(logits) else "MISMATCH"), gap


def compare(c, got, tol, tie):
    """(verdict, notes) of one case: the worst row's."""
    T, eos = len(c["ids"][0]), c["eos"]
    verdict, notes = "match", []

    def worse(v, note):
        nonlocal verdict
        if RANK[v] > RANK[verdict]:
            verdict = v
        notes.append(f"{v}: {note}")

    for b in range(len(c["ids"])):
        want = finished(c["tf"][b][T:], eos)
        ref = c["tf_logits"][0][b]
        err = max(abs(x - y) for x, y in zip(got["first"][b], ref))
        if err > tol * scale_of(ref):
            worse("MISMATCH", f"row {b}: padded first step's logits max |diff| {err:.3g} (scale {scale_of(ref):.3g})")
        # the prompt alone (teacher-forced along transformers' tokens): its logits and tokens those of the row
        alone_counts = not c["rope_by_length"]
        for s, acc in enumerate(got["forced_tf"][b] if alone_counts else []):
            ref = c["tf_logits"][s][b]
            err = max(abs(x - y) for x, y in zip(acc, ref))
            if err > tol * scale_of(ref):
                worse("MISMATCH", f"row {b} step {s}: logits max |diff| {err:.3g} (scale {scale_of(ref):.3g})")
                break
        row, ref_row = got["batch"][b], c["tf"][b]
        k = next((i for i, (x, y) in enumerate(zip(row, ref_row)) if x != y), None)
        if k is None and len(row) != len(ref_row):
            worse("MISMATCH", f"row {b}: {len(row)} columns, transformers {len(ref_row)}")
        elif k is not None:
            s = k - T
            if s >= len(want):  # after the row's eos: the pads
                worse("MISMATCH", f"row {b} column {k}: {row[k]} after eos, transformers' pad {ref_row[k]}")
            else:
                v, gap = tie_or_mismatch(c["tf_logits"][s][b], row[k], ref_row[k], tie)
                worse(v, f"row {b} step {s}: batch {row[k]}, transformers {ref_row[k]} (gap {gap:.3g})")
        mine = finished(row[T:], eos)
        alone = got["single"][b] if alone_counts else mine
        k = next((i for i, (x, y) in enumerate(zip(alone, mine)) if x != y), None)
        if k is None and len(alone) != len(mine):
            worse("MISMATCH", f"row {b}: alone {len(alone)} tokens, in the batch {len(mine)}")
        elif k is not None:
            forced = got["forced_batch"][b] or got["forced_tf"][b]
            v, gap = tie_or_mismatch(forced[k], alone[k], mine[k], tie)
            worse(v, f"row {b} step {k}: alone {alone[k]}, in the batch {mine[k]} (gap {gap:.3g})")
    return verdict, notes


def main():
    ap = hf.sweep_args(__doc__, 216, FAMILIES)
    ap.add_argument("--tol", type=float, default=1e-4, help="logits: max |diff| <= tol * max(1, max |logit|)")
    ap.add_argument("--tie", type=float, default=1e-4, help="a divergence whose two tokens' logits differ by "
                                                            "at most tie * scale is a TIE")
    a = ap.parse_args()
    if a.worker:
        worker(a.lib)
        return
    warnings.filterwarnings("ignore")

    def judge(d, made):
        with open(os.path.join(d, "accel.json")) as f:
            verdict, notes = compare(made[1], json.load(f), a.tol, a.tie)
        return verdict, "; ".join(notes)

    def show(made):
        extra, c = made
        return [extra, {k: c[k] for k in ("prompts", "n_new", "pad", "eos")}]

    hf.run_sweep(a, FAMILIES, "accel_batchgen_", make_batch_case, judge, show, script=__file__)


if __name__ == "__main__":
    main()
