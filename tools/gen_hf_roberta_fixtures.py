#!/usr/bin/env python3
"""Tiny random RoBERTa and XLM-RoBERTa models of every head accel builds,
written by transformers, with transformers' outputs, for tests/test_roberta.c.

    python3 tools/gen_hf_roberta_fixtures.py [OUT_DIR]     # default tests/data
    python3 tools/gen_hf_roberta_fixtures.py --check-saved DIR...

--check-saved loads each DIR (written by accel's save_pretrained from one of the
fixtures below: its config.json's model_type and "architectures" pick which)
with transformers' AutoModelFor<task> and compares its outputs with the
fixture's; exit status 0 when within 1e-5.

OUT_DIR/hf_<type>_<head>/, type roberta or xlm_roberta, head seq, tok, qa or
mlm: <Class>For<Head>.save_pretrained (config.json + model.safetensors; the
masked LM without its tied decoder) and expected.safetensors:
    ids            [3, 10] i64  row 0 unpadded; row 1 a pad token in the middle
                                (attended: attention_mask 1) and 3 pads on the
                                right; row 2 3 pads on the left
    token_type_ids [3, 10] i64  xlm_roberta only (type_vocab_size 2: segments 0
                                and 1); roberta's has type_vocab_size 1, as
                                roberta-base, and the test passes none (zeros)
    attention_mask [3, 10] i64  0 at the right and left padding
    seq: labels [3] i64, logits [3, 3] f32
    tok: labels [3, 10] i64 (-100 at <s>, the padding and one more), logits [3, 10, 5]
    qa:  start_positions, end_positions [3] i64 (in range, negative: clamped to
         0, past the input: ignored), start_logits, end_logits [3, 10] f32
    mlm: ids with four attended positions set to MASK_ID, labels [3, 10] i64
         (their ids there, -100 elsewhere), logits [3, 10, vocab] f32
    loss [] f32, g.<param> f32: that loss's gradient of every parameter
    state_dict_names [n] u8: the model's state_dict keys in order, joined by
                     newlines (XLMRoberta<Head> lists its head first)
The models run in eval mode (dropout off) with eager attention; weights as
tools/gen_hf_bert_fixtures.py's (std 0.15, LayerNorms near 1 and 0).
roberta: vocab 40, hidden 16, 1 layer, pad_token_id 1 (position ids from 2),
max_position_embeddings 16, layer_norm_eps 1e-5. xlm_roberta: vocab 32,
hidden 8, pad_token_id 3 (position ids from 4), max_position_embeddings 16,
hidden_act gelu_new (the masked LM's head keeps GELU, erf).
OUT_DIR/hf_roberta_hub/: hf_roberta_mlm's weights as the Hub's roberta-base
file holds them: with a roberta.pooler (random), the tied
lm_head.decoder.weight and lm_head.decoder.bias written out, and the
roberta.embeddings.position_ids buffer; config.json names
RobertaForMaskedLM. Checked here: transformers' RobertaForMaskedLM loads it to
hf_roberta_mlm's logits.
OUT_DIR/hf_roberta_nlp/config.json: the tiny RoBERTa of the nlp_example test
(the vocabulary of tests/data/tokenizers/bert, 2 labels, type_vocab_size 1).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForMaskedLM, AutoModelForQuestionAnswering, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification, RobertaConfig, XLMRobertaConfig)
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from gen_hf_bert_fixtures import out_dir_arg, randomize, run_check_saved  # noqa: E402

TYPES = {
    "roberta": (RobertaConfig, "Roberta", dict(vocab_size=40, hidden_size=16, intermediate_size=24,
                                               num_hidden_layers=1, num_attention_heads=2,
                                               max_position_embeddings=16, type_vocab_size=1, pad_token_id=1,
                                               layer_norm_eps=1e-5)),
    "xlm_roberta": (XLMRobertaConfig, "XLMRoberta", dict(vocab_size=32, hidden_size=8, intermediate_size=12,
                                                         num_hidden_layers=1, num_attention_heads=2,
                                                         max_position_embeddings=16, type_vocab_size=2,
                                                         pad_token_id=3, layer_norm_eps=1e-5, hidden_act="gelu_new")),
}
HEADS = {"seq": ("ForSequenceClassification", dict(num_labels=3)), "tok": ("ForTokenClassification",
         dict(num_labels=5)), "qa": ("ForQuestionAnswering", {}), "mlm": ("ForMaskedLM", {})}
AUTO = {"seq": AutoModelForSequenceClassification, "tok": AutoModelForTokenClassification,
        "qa": AutoModelForQuestionAnswering, "mlm": AutoModelForMaskedLM}
OUTS = {"seq": ["logits"], "tok": ["logits"], "qa": ["start_logits", "end_logits"], "mlm": ["logits"]}
T = 10
MASKED = [(0, 2), (0, 7), (1, 1), (2, 5)]  # (row, position): attended, not a pad token


def batch(sizes, seed, with_types):
    g = torch.Generator().manual_seed(seed)
    pad, V = sizes["pad_token_id"], sizes["vocab_size"]
    ids = torch.randint(pad + 1, V - 1, (3, T), generator=g)  # V - 1: MASK_ID, none of them a pad
    mask = torch.ones(3, T, dtype=torch.long)
    ids[1, 4] = pad                 # a pad token in the middle, attended
    ids[1, T - 3:] = pad            # right padding
    mask[1, T - 3:] = 0
    ids[2, :3] = pad                # left padding
    mask[2, :3] = 0
    out = {"ids": ids, "attention_mask": mask}
    if with_types:
        tt = torch.zeros(3, T, dtype=torch.long)
        tt[:, 6:] = 1
        out["token_type_ids"] = tt
    return out


def write(out_dir, typ, head):
    cfg_cls, prefix, sizes = TYPES[typ]
    cls_name, extra = HEADS[head]
    cls = getattr(transformers, prefix + cls_name)
    torch.manual_seed(4321)
    model = cls(cfg_cls(**sizes, **extra, attn_implementation="eager")).eval()
    randomize(model)
    d = os.path.join(out_dir, f"hf_{typ}_{head}")
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    out = batch(sizes, 77, sizes["type_vocab_size"] > 1)
    g = torch.Generator().manual_seed(78)
    if head == "seq":
        out["labels"] = torch.tensor([2, 0, 1])
        targets = dict(labels=out["labels"])
    elif head == "tok":
        labels = torch.randint(0, 5, (3, T), generator=g)
        labels[:, 0] = -100
        labels[out["attention_mask"] == 0] = -100
        labels[0, 3] = -100
        out["labels"] = labels
        targets = dict(labels=labels)
    elif head == "qa":
        out["start_positions"] = torch.tensor([3, -2, T])
        out["end_positions"] = torch.tensor([6, 4, 99])
        targets = dict(start_positions=out["start_positions"], end_positions=out["end_positions"])
    else:
        labels = torch.full_like(out["ids"], -100)
        for b, t in MASKED:
            assert out["attention_mask"][b, t] == 1 and out["ids"][b, t] != sizes["pad_token_id"]
            labels[b, t] = out["ids"][b, t]
            out["ids"][b, t] = sizes["vocab_size"] - 1
        out["labels"] = labels
        targets = dict(labels=labels)
    kw = dict(input_ids=out["ids"], attention_mask=out["attention_mask"], token_type_ids=out.get("token_type_ids"))
    with torch.no_grad():
        y = model(**kw)
    for k in OUTS[head]:
        out[k] = getattr(y, k)
    model.zero_grad()
    loss = model(**kw, **targets).loss
    loss.backward()
    out["loss"] = loss.detach()
    for name, p in model.named_parameters():
        out["g." + name] = p.grad.detach()
    out["state_dict_names"] = torch.tensor(list("\n".join(model.state_dict()).encode()), dtype=torch.uint8)
    save_file({k: t.contiguous() for k, t in out.items()}, os.path.join(d, "expected.safetensors"))
    return d, model


def write_hub(out_dir, mlm_model, mlm_dir):
    """hf_roberta_hub (module docstring), checked with transformers."""
    d = os.path.join(out_dir, "hf_roberta_hub")
    os.makedirs(d, exist_ok=True)
    mlm_model.config.save_pretrained(d)
    sd = {k: t.detach().clone() for k, t in mlm_model.state_dict().items()}
    C = mlm_model.config.hidden_size
    g = torch.Generator().manual_seed(5)
    sd["roberta.pooler.dense.weight"] = 0.15 * torch.randn(C, C, generator=g)
    sd["roberta.pooler.dense.bias"] = 0.15 * torch.randn(C, generator=g)
    sd["lm_head.decoder.weight"] = sd["roberta.embeddings.word_embeddings.weight"].clone()
    sd["lm_head.decoder.bias"] = sd["lm_head.bias"].clone()
    sd["roberta.embeddings.position_ids"] = torch.arange(mlm_model.config.max_position_embeddings)[None]
    save_file({k: t.contiguous() for k, t in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    err = check_outputs(transformers.RobertaForMaskedLM.from_pretrained(d, dtype=torch.float32).eval(), mlm_dir,
                        "mlm", d)
    assert err <= 1e-5, f"transformers' load of {d} differs by {err}"
    return d


def check_outputs(model, fixture, head, what):
    e = load_file(os.path.join(fixture, "expected.safetensors"))
    with torch.no_grad():
        y = model(input_ids=e["ids"], attention_mask=e["attention_mask"], token_type_ids=e.get("token_type_ids"))
    err = max(float((getattr(y, k) - e[k]).abs().max()) for k in OUTS[head])
    print(f"{what}: {type(model).__name__} max |{' and '.join(OUTS[head])} - {os.path.basename(fixture)}| = {err:.3g}")
    return err


def check_saved(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    typ = cfg["model_type"].replace("-", "_")
    head = next(h for h, (name, _) in HEADS.items() if cfg["architectures"][0].endswith(name))
    fixture = os.path.join(os.path.dirname(__file__), "..", "tests", "data", f"hf_{typ}_{head}")
    if check_outputs(AUTO[head].from_pretrained(path, dtype=torch.float32).eval(), fixture, head, path) > 1e-5:
        sys.exit(1)


def main():
    if run_check_saved(sys.argv, check_saved):
        return
    out_dir = out_dir_arg(sys.argv[1:])
    nlp = os.path.join(out_dir, "hf_roberta_nlp")
    RobertaConfig(vocab_size=1200, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=40, type_vocab_size=1, num_labels=2, layer_norm_eps=1e-5).save_pretrained(nlp)
    dirs = [nlp]
    for typ in TYPES:
        for head in HEADS:
            d, model = write(out_dir, typ, head)
            dirs.append(d)
            if typ == "roberta" and head == "mlm":
                dirs.append(write_hub(out_dir, model, d))
    for x in dirs:
        print(f"{x}: {sum(os.path.getsize(os.path.join(x, f)) for f in os.listdir(x))} bytes")


if __name__ == "__main__":
    main()
