#!/usr/bin/env python3
"""transformers under torch.autocast("cpu", bfloat16) where accel's attention takes explicit scores
(src/ops/attention_masked.c), for tests/test_hf_bf16_scores.c.

    python3 tools/gen_hf_bf16_scores_fixtures.py [NAME...]   # default: bert and every name of NAMES

For each name, the tiny checkpoint tests/data/hf_arch_<name> (tools/gen_hf_arch_fixtures.py) with its
query and key projections times QK_GAIN, so that its attention scores are a few units large (the
checkpoints' are a few hundredths: rounding them to bf16 would change nothing measurable), and its
q, k, v biases 0 (gain_qk), saved as tests/data/hf_bf16_scores/<name>/ (config.json, model.safetensors), and in
tests/data/hf_bf16_scores/<name>.safetensors:
    ids        [3, 20] i64   row 0 whole, rows 1 and 2 left-padded (7 and 11 pads) with PAD_ID
    mask       [3, 20] i64   their attention_mask, with a hole (a 0 between ones) in rows 0 and 1:
                             no fused attention's key range takes it (every family takes the
                             explicit scores; Mistral's and Gemma2's windows of 8 bite too)
    rows       [n] i64       the flat indices (b 20 + t) of the mask's ones
    logits     [n, V] f32    the model's logits at those rows, with its default attention
                             (transformers' from_pretrained: "sdpa" for every name but gemma2,
                             "eager"), under torch.autocast("cpu", dtype=torch.bfloat16)
    loss, g.<param>          the loss with labels -100 at the pads and its f32 gradients, the same
                             autocast (model.train() with every dropout off but the attention's, at
                             ATTN_P: 1 - p is 1.0, nothing dropped, as tools/gen_hf_padded_fixtures.py
                             trains: in accel a training model with attention dropout takes the
                             explicit scores even without the mask's hole)
    other      [n, V] f32    the logits of the other rounding: "eager" for the sdpa names; for
                             gemma2 (which has no sdpa) its eager attention computed in f32 on q, k, v
                             made f32, its output rounded to bf16 (F32_EAGER): how far apart the two
                             are (the test's tolerance must separate them)
And for BERT (tests/data/hf_bert_base, a BertModel; its attention is always explicit scores in accel,
SDPA by default in transformers), the same change, tests/data/hf_bf16_scores/bert/ and
bert.safetensors: ids, mask (right-padded by 0, 6 and 9, a hole in row 0), rows, "hidden" (the last
hidden state at the mask's ones, [n, C]) with the default attention and "other" with eager, under
the bf16 autocast.
GPT-2 is not among the names: its logits are as far from transformers' eager ones as from its SDPA
ones (0.93% and 0.88%, 2-norms), its layer scaling shrinking the scores; Phi stands for the families
with attention dropout (its training takes the explicit scores).
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AttentionInterface, AutoModel, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager

NAMES = ["mistral", "phi", "gemma2"]
QK_GAIN = 6.0
ATTN_P = 1e-30
PAD_ID = 3
B, T = 3, 20
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")


def f32_eager(module, q, k, v, mask, **kw):
    """Gemma2's eager attention in f32 with the autocast off, the output rounded to q's dtype (its mask:
    eager's, registered under the same name)."""
    with torch.autocast("cpu", enabled=False):
        o, w = gemma2_eager(module, q.float(), k.float(), v.float(), None if mask is None else mask.float(), **kw)
    return o.to(q.dtype), w


F32_EAGER = "f32_eager"
AttentionInterface.register(F32_EAGER, f32_eager)
AttentionMaskInterface.register(F32_EAGER, eager_mask)


def batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones((B, T), dtype=torch.long)
    for b, pads in enumerate([0, 7, 11]):
        ids[b, :pads] = PAD_ID
        mask[b, :pads] = 0
    mask[0, 9] = 0  # the holes
    mask[1, 14] = 0
    return ids, mask


@torch.no_grad()
def gain_qk(model):
    """The query and key projections times QK_GAIN (scores QK_GAIN^2 larger), the q, k, v biases 0: accel
    adds a bias to a bf16 product in f32 and rounds the sum again where torch's addmm rounds once, which
    would move q and k by an ulp here and there, as much as the scores' rounding this fixture is about."""
    for name, mod in model.named_modules():
        if name.endswith(("q_proj", "k_proj", "v_proj", "c_attn", ".query", ".key", ".value")) and mod.bias is not None:
            mod.bias.zero_()
        if name.endswith(("q_proj", "k_proj", ".query", ".key")):
            mod.weight.mul_(QK_GAIN)
        elif name.endswith("c_attn"):  # GPT-2's Conv1D [in, 3 C]: q | k | v columns
            mod.weight[:, :2 * mod.weight.shape[0]].mul_(QK_GAIN)


def load(path, attn=None):
    kw = {"attn_implementation": attn} if attn else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()


def logits(model, ids, mask, rows):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask).logits
    return out.float().reshape(-1, out.shape[-1])[rows].contiguous()


def training_loss(model, ids, mask):
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = ATTN_P if name.endswith(("attn_dropout", "attention_dropout")) else 0.0
    if hasattr(model.config, "attention_dropout"):
        model.config.attention_dropout = ATTN_P
        for mod in model.modules():
            if hasattr(mod, "attention_dropout") and isinstance(mod.attention_dropout, float):
                mod.attention_dropout = ATTN_P
    model.train()
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    out = {"loss": loss.detach().float().reshape(1)}
    for n, p in model.named_parameters():
        out["g." + n] = p.grad.detach().float().contiguous()
    model.eval()
    return out


def bert():
    """BERT's fixture (above)."""
    model = AutoModel.from_pretrained(os.path.join(DATA, "hf_bert_base"), dtype=torch.float32).eval()
    gain_qk(model)
    path = os.path.join(DATA, "hf_bf16_scores", "bert")
    model.save_pretrained(path)
    default = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    other = AutoModel.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(800)
    ids = torch.randint(0, model.config.vocab_size, (B, T), generator=g)
    mask = torch.ones((B, T), dtype=torch.long)
    for b, pads in enumerate([0, 6, 9]):
        mask[b, T - pads:] = 0
    mask[0, 5] = 0
    rows = mask.flatten().nonzero().squeeze(1)
    out = {"ids": ids, "mask": mask, "rows": rows}
    for key, m in (("hidden", default), ("other", other)):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            h = m(input_ids=ids, attention_mask=mask).last_hidden_state
        out[key] = h.float().reshape(-1, h.shape[-1])[rows].contiguous()
    save_file(out, path + ".safetensors")
    gap = float((out["hidden"] - out["other"]).norm() / out["hidden"].norm())
    print(f"bert: {default.config._attn_implementation}, eager apart by {gap:.4g} (2-norm)")


def main():
    if not sys.argv[1:] or "bert" in sys.argv[1:]:
        bert()
    for name in [n for n in sys.argv[1:] if n != "bert"] if sys.argv[1:] else NAMES:
        model = load(os.path.join(DATA, "hf_arch_" + name))
        gain_qk(model)
        path = os.path.join(DATA, "hf_bf16_scores", name)
        model.save_pretrained(path)
        default = load(path)
        other = load(path, F32_EAGER if default.config._attn_implementation == "eager" else "eager")
        ids, mask = batch(model.config.vocab_size, 700 + NAMES.index(name))
        rows = mask.flatten().nonzero().squeeze(1)
        out = {"ids": ids, "mask": mask, "rows": rows, "logits": logits(default, ids, mask, rows),
               "other": logits(other, ids, mask, rows)}
        out.update(training_loss(default, ids, mask))
        save_file(out, path + ".safetensors")
        gap = float((out["logits"] - out["other"]).abs().max())
        print(f"{name}: {default.config._attn_implementation}, {other.config._attn_implementation} apart by {gap:.4g}, "
              f"logits max {float(out['logits'].abs().max()):.4g}, loss {float(out['loss']):.6g}")


if __name__ == "__main__":
    main()
