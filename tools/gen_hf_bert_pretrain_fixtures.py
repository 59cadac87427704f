#!/usr/bin/env python3
"""Tiny random BertForPreTraining, BertForNextSentencePrediction and
<Type>ForMultipleChoice (BERT, RoBERTa, XLM-RoBERTa) written by transformers,
with transformers' outputs, for tests/test_bert_pretrain.c.

    python3 tools/gen_hf_bert_pretrain_fixtures.py [OUT_DIR]     # default tests/data
    python3 tools/gen_hf_bert_pretrain_fixtures.py --check-saved DIR...

--check-saved loads each DIR (written by accel's save_pretrained from one of the
fixtures below: its config.json's "architectures" picks which) with
transformers' class of that name and compares its outputs with the
fixture's; exit status 0 when within 1e-5.

Sizes, weights and batches are tools/gen_hf_bert_fixtures.py's (TOK: vocab
40, hidden 16, one layer; std 0.15, LayerNorms near 1 and 0) and
tools/gen_hf_roberta_fixtures.py's (its TYPES and batch); eval mode (dropout
off), eager attention. Each OUT_DIR/<name>/ holds save_pretrained's
config.json + model.safetensors and expected.safetensors:

hf_bert_pretrain (BertForPreTraining; save_pretrained drops the decoder tied
to the word embeddings and cls.predictions.bias):
    ids, token_type_ids, attention_mask [3, 10] i64: gen_hf_bert_fixtures'
        head batch with its five MASKED positions set to MASK_ID
    labels [3, 10] i64: their ids there, -100 elsewhere
    next_sentence_label [3] i64
    prediction_logits [3, 10, 40], seq_relationship_logits [3, 2] f32
    loss [] f32 (masked LM + next sentence), g.<param> f32: its gradients
    nsp_logits [3, 2] f32: BertForNextSentencePrediction.from_pretrained of
        this directory (the pre-training checkpoint's seq_relationship and
        pooler; cls.predictions unused)
hf_bert_nsp (BertForNextSentencePrediction): the head batch, labels [3] i64,
    logits [3, 2] f32, loss, g.<param>
hf_bert_mc, hf_roberta_mc, hf_xlm_roberta_mc (<Type>ForMultipleChoice):
    ids, attention_mask (and token_type_ids but roberta's) [2, 3, 10] i64:
        two of the type's [3, 10] batches (seeds 77 and 78) stacked, choices
        of one question each
    labels [2] i64, logits [2, 3] f32, loss, g.<param>
    state_dict_names [n] u8: the state_dict keys in order, joined by newlines
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
import transformers
from transformers import BertForNextSentencePrediction, BertForPreTraining

sys.path.insert(0, os.path.dirname(__file__))
from gen_hf_bert_fixtures import MASK_ID, MASKED, TOK, build, head_inputs, out_dir_arg, run_check_saved  # noqa: E402
import gen_hf_roberta_fixtures as rob  # noqa: E402

MC_TYPES = {"bert": (transformers.BertConfig, "Bert", TOK)}
MC_TYPES.update({t: v for t, v in rob.TYPES.items()})


def grads(model, out, loss):
    loss.backward()
    out["loss"] = loss.detach()
    for name, p in model.named_parameters():
        out["g." + name] = p.grad.detach()


def names(model):
    return torch.tensor(list("\n".join(model.state_dict()).encode()), dtype=torch.uint8)


def kwargs(out):
    return dict(input_ids=out["ids"], token_type_ids=out.get("token_type_ids"), attention_mask=out["attention_mask"])


def save(model, out_dir, name, out):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    save_file({k: t.contiguous() for k, t in out.items()}, os.path.join(d, "expected.safetensors"))
    return d


def write_pretrain(out_dir):
    model = build(4321, BertForPreTraining, TOK)
    out = head_inputs(77)
    labels = torch.full_like(out["ids"], -100)
    for b, t in MASKED:
        labels[b, t] = out["ids"][b, t]
        out["ids"][b, t] = MASK_ID
    out["labels"] = labels
    out["next_sentence_label"] = torch.tensor([1, 0, 1])
    with torch.no_grad():
        y = model(**kwargs(out))
    out["prediction_logits"], out["seq_relationship_logits"] = y.prediction_logits, y.seq_relationship_logits
    model.zero_grad()
    grads(model, out, model(**kwargs(out), labels=labels, next_sentence_label=out["next_sentence_label"]).loss)
    d = save(model, out_dir, "hf_bert_pretrain", out)
    nsp = BertForNextSentencePrediction.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        out["nsp_logits"] = nsp(**kwargs(out)).logits
    save_file({k: t.contiguous() for k, t in out.items()}, os.path.join(d, "expected.safetensors"))
    return d


def write_nsp(out_dir):
    model = build(4321, BertForNextSentencePrediction, TOK)
    out = head_inputs(77)
    out["labels"] = torch.tensor([0, 1, 1])
    with torch.no_grad():
        out["logits"] = model(**kwargs(out)).logits
    model.zero_grad()
    grads(model, out, model(**kwargs(out), labels=out["labels"]).loss)
    return save(model, out_dir, "hf_bert_nsp", out)


def choices(typ, sizes):
    """Two [3, T] batches of the type stacked: [2, 3, T]."""
    if typ == "bert":
        a, b = head_inputs(77), head_inputs(78)
    else:
        types = sizes["type_vocab_size"] > 1
        a, b = rob.batch(sizes, 77, types), rob.batch(sizes, 78, types)
    return {k: torch.stack([a[k], b[k]]) for k in a if k in ("ids", "token_type_ids", "attention_mask")}


def write_mc(out_dir, typ):
    cfg_cls, prefix, sizes = MC_TYPES[typ]
    torch.manual_seed(4321)
    model = getattr(transformers, prefix + "ForMultipleChoice")(cfg_cls(**sizes, attn_implementation="eager")).eval()
    rob.randomize(model)
    out = choices(typ, sizes)
    out["labels"] = torch.tensor([2, 0])
    with torch.no_grad():
        out["logits"] = model(**kwargs(out)).logits
    model.zero_grad()
    grads(model, out, model(**kwargs(out), labels=out["labels"]).loss)
    out["state_dict_names"] = names(model)
    return save(model, out_dir, f"hf_{typ}_mc", out)


FIXTURE_OF = {"BertForPreTraining": ("hf_bert_pretrain", ["prediction_logits", "seq_relationship_logits"]),
              "BertForNextSentencePrediction": ("hf_bert_nsp", ["logits"]),
              "BertForMultipleChoice": ("hf_bert_mc", ["logits"]),
              "RobertaForMultipleChoice": ("hf_roberta_mc", ["logits"]),
              "XLMRobertaForMultipleChoice": ("hf_xlm_roberta_mc", ["logits"])}


def check_saved(path):
    with open(os.path.join(path, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    fixture, outs = FIXTURE_OF[arch]
    e = load_file(os.path.join(os.path.dirname(__file__), "..", "tests", "data", fixture, "expected.safetensors"))
    model = getattr(transformers, arch).from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        y = model(**kwargs(e))
    err = max(float((getattr(y, k) - e[k]).abs().max()) for k in outs)
    print(f"{path}: {arch} max |{' and '.join(outs)} - {fixture}| = {err:.3g}")
    if not err <= 1e-5:
        sys.exit(1)


def main():
    if run_check_saved(sys.argv, check_saved):
        return
    out_dir = out_dir_arg(sys.argv[1:])
    dirs = [write_pretrain(out_dir), write_nsp(out_dir)] + [write_mc(out_dir, t) for t in MC_TYPES]
    for x in dirs:
        print(f"{x}: {sum(os.path.getsize(os.path.join(x, f)) for f in os.listdir(x))} bytes")


if __name__ == "__main__":
    main()
