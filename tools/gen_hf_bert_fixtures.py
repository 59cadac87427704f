#!/usr/bin/env python3
"""A tiny random BertForSequenceClassification written by transformers, with
transformers' outputs, for tests/test_bert.c; and the config of the tiny BERT
that examples/nlp_example.c trains in its test.

    python3 tools/gen_hf_bert_fixtures.py [OUT_DIR]     # default tests/data
    python3 tools/gen_hf_bert_fixtures.py --heads [OUT_DIR]   # hf_bert_tok and hf_bert_qa only
    python3 tools/gen_hf_bert_fixtures.py --mlm [OUT_DIR]     # hf_bert_mlm only
    python3 tools/gen_hf_bert_fixtures.py --check-saved DIR...

--check-saved loads each DIR (written by accel's save_pretrained from
tests/data/hf_bert_cls, hf_bert_tok, hf_bert_qa or hf_bert_mlm: the class its config.json's
"architectures" names picks the fixture) with transformers' AutoModelFor<task>
and compares its logits with the fixture's; exit status 0 when within 1e-5.

Writes only these (never the other fixtures' bytes):
OUT_DIR/hf_bert_cls/ (save_pretrained: config.json + model.safetensors) and
expected.safetensors:
    ids            [3, 12] i64  input ids
    token_type_ids [3, 12] i64  0 for the first segment, 1 for the second
    attention_mask [3, 12] i64  rows padded by 0, 4 and 7 positions
    labels         [3]     i64
    hidden         [3, 12, 32] f32  bert(...).last_hidden_state
    pooled         [3, 32] f32      bert(...).pooler_output
    logits         [3, 3]  f32
    loss           []      f32  model(..., labels=labels).loss (cross-entropy)
    g.<param>             f32  that loss's gradient of every parameter
The model runs in eval mode (dropout off), with eager attention. Weights are
random with a large std (0.15; LayerNorm weights 1 + 0.1 N(0, 1), biases
0.1 N(0, 1)) so that every term shows in the outputs.
OUT_DIR/hf_bert_nlp/config.json: the tiny BERT of the nlp_example test (the
vocabulary of tests/data/tokenizers/bert, 2 labels).
Two checkpoints of hf_bert_cls's weights as users find them, for the loaders
(tests/test_bert.c: both from_pretrained paths take both; no expected file of
their own, hf_bert_cls's holds their outputs):
OUT_DIR/hf_bert_base/: the body alone, BertModel.save_pretrained (names
    without "bert.", no classifier), as the Hub's bert-base-uncased; its
    last_hidden_state and pooler_output are hf_bert_cls's hidden and pooled.
OUT_DIR/hf_bert_legacy/: the whole model with every LayerNorm's weight and
    bias named gamma and beta, as the original Google BERT checkpoints
    (transformers renames them on load); its logits are hf_bert_cls's. Checked
    here: transformers loads both to those outputs.
OUT_DIR/hf_bert_tok/ and OUT_DIR/hf_bert_qa/ (--heads, or with the rest): a
smaller tiny BertForTokenClassification (5 labels) and
BertForQuestionAnswering (TOK's sizes, one layer), save_pretrained, and
expected.safetensors:
    ids, token_type_ids, attention_mask [3, 10] i64 (rows padded by 0, 3, 5)
    tok: labels [3, 10] i64, -100 at [CLS], the padding and a later sub-token
         logits [3, 10, 5] f32
    qa:  start_positions, end_positions [3] i64: in range, negative (clamped
         to 0), past the input (10 and 99: ignored)
         start_logits, end_logits [3, 10] f32
    loss [] f32, g.<param> f32: that loss's gradient of every parameter
OUT_DIR/hf_bert_mlm/ (--mlm, or with the rest): a tiny BertForMaskedLM of
TOK's sizes (decoder tied to the word embeddings, its bias to
cls.predictions.bias: save_pretrained drops both), save_pretrained, and
expected.safetensors: hf_bert_tok's inputs with five kept positions set to
MASK_ID, labels [3, 10] i64 their ids there and -100 elsewhere, logits
[3, 10, 40] f32, loss [] f32 and g.<param> f32 (the word embeddings' pad row
0 gets the decoder's share only: padding_idx).
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForMaskedLM, AutoModelForQuestionAnswering, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification, BertConfig, BertForMaskedLM, BertForQuestionAnswering,
                          BertForSequenceClassification, BertForTokenClassification)

CLS = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
           max_position_embeddings=32, type_vocab_size=2, num_labels=3, layer_norm_eps=1e-12)
NLP = dict(vocab_size=1200, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           max_position_embeddings=64, type_vocab_size=2, num_labels=2)


TOK = dict(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
           max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12)


def build(seed, cls=BertForSequenceClassification, sizes=CLS):
    torch.manual_seed(seed)
    model = cls(BertConfig(**sizes, attn_implementation="eager")).eval()
    randomize(model)
    return model


def randomize(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "LayerNorm.bias" in name:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, CLS["vocab_size"], (3, 12), generator=g)
    tt = torch.zeros(3, 12, dtype=torch.long)
    mask = torch.ones(3, 12, dtype=torch.long)
    for row, (split, pad) in enumerate([(6, 0), (5, 4), (3, 7)]):
        tt[row, split:12 - pad] = 1
        if pad:
            mask[row, 12 - pad:] = 0
            ids[row, 12 - pad:] = 0
    labels = torch.tensor([2, 0, 1])
    return {"ids": ids, "token_type_ids": tt, "attention_mask": mask, "labels": labels}


def expected(model, seed):
    out = inputs(seed)
    kw = dict(input_ids=out["ids"], token_type_ids=out["token_type_ids"], attention_mask=out["attention_mask"])
    with torch.no_grad():
        base = model.bert(**kw)
        out["hidden"] = base.last_hidden_state
        out["pooled"] = base.pooler_output
        out["logits"] = model(**kw).logits
    model.zero_grad()
    loss = model(**kw, labels=out["labels"]).loss
    loss.backward()
    out["loss"] = loss.detach()
    for name, p in model.named_parameters():
        out["g." + name] = p.grad.detach()
    return {k: t.contiguous() for k, t in out.items()}


def head_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, TOK["vocab_size"], (3, 10), generator=g)
    tt = torch.zeros(3, 10, dtype=torch.long)
    mask = torch.ones(3, 10, dtype=torch.long)
    for row, (split, pad) in enumerate([(4, 0), (5, 3), (2, 5)]):
        tt[row, split:10 - pad] = 1
        if pad:
            mask[row, 10 - pad:] = 0
            ids[row, 10 - pad:] = 0
    return {"ids": ids, "token_type_ids": tt, "attention_mask": mask}


def head_expected(model, seed):
    """hf_bert_tok's or hf_bert_qa's expected.safetensors (module docstring)."""
    out = head_inputs(seed)
    kw = dict(input_ids=out["ids"], token_type_ids=out["token_type_ids"], attention_mask=out["attention_mask"])
    g = torch.Generator().manual_seed(seed + 1)
    if isinstance(model, BertForTokenClassification):
        labels = torch.randint(0, model.config.num_labels, (3, 10), generator=g)
        labels[:, 0] = -100                          # [CLS]
        labels[out["attention_mask"] == 0] = -100    # padding
        labels[0, 3] = -100                          # a word's later sub-token
        out["labels"] = labels
        targets = dict(labels=labels)
    else:
        out["start_positions"] = torch.tensor([3, -2, 10])  # -2 clamps to 0; 10 (= T) is ignored
        out["end_positions"] = torch.tensor([6, 4, 99])     # 99 clamps to T: ignored
        targets = dict(start_positions=out["start_positions"], end_positions=out["end_positions"])
    with torch.no_grad():
        y = model(**kw)
    if isinstance(model, BertForTokenClassification):
        out["logits"] = y.logits
    else:
        out["start_logits"], out["end_logits"] = y.start_logits, y.end_logits
    model.zero_grad()
    loss = model(**kw, **targets).loss
    loss.backward()
    out["loss"] = loss.detach()
    for name, p in model.named_parameters():
        out["g." + name] = p.grad.detach()
    return {k: t.contiguous() for k, t in out.items()}


MASK_ID = 39
MASKED = [(0, 2), (0, 6), (1, 1), (1, 5), (2, 3)]  # (row, position), all kept by the attention mask


def write_mlm(out_dir):
    """hf_bert_mlm (module docstring); returns its directory."""
    d = os.path.join(out_dir, "hf_bert_mlm")
    os.makedirs(d, exist_ok=True)
    model = build(4321, BertForMaskedLM, TOK)
    model.save_pretrained(d, safe_serialization=True)
    out = head_inputs(77)
    labels = torch.full_like(out["ids"], -100)
    for b, t in MASKED:
        assert out["attention_mask"][b, t] == 1
        labels[b, t] = out["ids"][b, t]
        out["ids"][b, t] = MASK_ID
    out["labels"] = labels
    kw = dict(input_ids=out["ids"], token_type_ids=out["token_type_ids"], attention_mask=out["attention_mask"])
    with torch.no_grad():
        out["logits"] = model(**kw).logits
    model.zero_grad()
    loss = model(**kw, labels=labels).loss
    loss.backward()
    out["loss"] = loss.detach()
    for name, p in model.named_parameters():
        out["g." + name] = p.grad.detach()
    save_file({k: t.contiguous() for k, t in out.items()}, os.path.join(d, "expected.safetensors"))
    return d


def write_heads(out_dir):
    """hf_bert_tok and hf_bert_qa (module docstring); returns their directories."""
    dirs = []
    for name, cls, extra in [("hf_bert_tok", BertForTokenClassification, dict(num_labels=5)),
                             ("hf_bert_qa", BertForQuestionAnswering, {})]:
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        model = build(4321, cls, dict(TOK, **extra))
        model.save_pretrained(d, safe_serialization=True)
        save_file(head_expected(model, 77), os.path.join(d, "expected.safetensors"))
        dirs.append(d)
    return dirs


def check_saved(path):
    import json
    with open(os.path.join(path, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    fixture, auto, outs = {
        "BertForSequenceClassification": ("hf_bert_cls", AutoModelForSequenceClassification, ["logits"]),
        "BertForTokenClassification": ("hf_bert_tok", AutoModelForTokenClassification, ["logits"]),
        "BertForQuestionAnswering": ("hf_bert_qa", AutoModelForQuestionAnswering, ["start_logits", "end_logits"]),
        "BertForMaskedLM": ("hf_bert_mlm", AutoModelForMaskedLM, ["logits"]),
    }[arch]
    data = os.path.join(os.path.dirname(__file__), "..", "tests", "data", fixture)
    model = auto.from_pretrained(path, dtype=torch.float32).eval()
    e = load_file(os.path.join(data, "expected.safetensors"))
    with torch.no_grad():
        y = model(input_ids=e["ids"], token_type_ids=e["token_type_ids"], attention_mask=e["attention_mask"])
    err = max(float((getattr(y, k) - e[k]).abs().max()) for k in outs)
    print(f"{path}: {type(model).__name__} max |{' and '.join(outs)} - {fixture}| = {err:.3g}")
    if not err <= 1e-5:
        sys.exit(1)


def legacy_names(sd):
    """LayerNorm.weight / .bias as gamma / beta (the reverse of transformers' legacy renames)."""
    out = {}
    for k, t in sd.items():
        if ".LayerNorm." in k:
            k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        out[k] = t.contiguous()
    return out


def user_checkpoints(model, out_dir, cls_dir):
    """hf_bert_base and hf_bert_legacy (see the module docstring), each checked with transformers."""
    from transformers import BertModel
    base = os.path.join(out_dir, "hf_bert_base")
    model.bert.save_pretrained(base, safe_serialization=True)
    legacy = os.path.join(out_dir, "hf_bert_legacy")
    os.makedirs(legacy, exist_ok=True)
    model.config.save_pretrained(legacy)
    save_file(legacy_names(model.state_dict()), os.path.join(legacy, "model.safetensors"), metadata={"format": "pt"})
    e = load_file(os.path.join(cls_dir, "expected.safetensors"))
    kw = dict(input_ids=e["ids"], token_type_ids=e["token_type_ids"], attention_mask=e["attention_mask"])
    with torch.no_grad():
        b = BertModel.from_pretrained(base, dtype=torch.float32).eval()(**kw)
        y = BertForSequenceClassification.from_pretrained(legacy, dtype=torch.float32).eval()(**kw).logits
    for what, got, want in [("base hidden", b.last_hidden_state, e["hidden"]), ("base pooled", b.pooler_output,
                            e["pooled"]), ("legacy logits", y, e["logits"])]:
        err = float((got - want).abs().max())
        assert err <= 1e-5, f"{what}: transformers' load differs by {err}"
    return base, legacy


def run_check_saved(argv, check_saved):
    """`--check-saved DIR...`: check_saved(DIR) for each DIR; True when argv asks
    for it. (Only one DIR was taken: a second one made the command line a
    generation whose OUT_DIR was "--check-saved".)"""
    if argv[1:2] != ["--check-saved"]:
        return False
    if len(argv) < 3:
        sys.exit("--check-saved needs DIR...")
    for d in argv[2:]:
        check_saved(d)
    return True


def out_dir_arg(args):
    """[OUT_DIR] (tests/data by default). An option or a second argument exits:
    it used to become the directory the fixtures were written into."""
    if len(args) > 1 or (args and args[0].startswith("-")):
        sys.exit(f"unexpected arguments {args}: expected [OUT_DIR], or --check-saved DIR...")
    return args[0] if args else os.path.join(os.path.dirname(__file__), "..", "tests", "data")


def main():
    if run_check_saved(sys.argv, check_saved):
        return
    heads_only = len(sys.argv) > 1 and sys.argv[1] in ("--heads", "--mlm")
    out_dir = out_dir_arg(sys.argv[2:] if heads_only else sys.argv[1:])
    if heads_only:
        for x in write_heads(out_dir) if sys.argv[1] == "--heads" else [write_mlm(out_dir)]:
            print(f"{x}: {sum(os.path.getsize(os.path.join(x, f)) for f in os.listdir(x))} bytes")
        return
    d = os.path.join(out_dir, "hf_bert_cls")
    os.makedirs(d, exist_ok=True)
    model = build(1234)
    model.save_pretrained(d, safe_serialization=True)
    save_file(expected(model, 99), os.path.join(d, "expected.safetensors"))
    nlp = os.path.join(out_dir, "hf_bert_nlp")
    BertConfig(**NLP).save_pretrained(nlp)
    for x in (d, nlp) + user_checkpoints(model, out_dir, d) + tuple(write_heads(out_dir)) + (write_mlm(out_dir),):
        print(f"{x}: {sum(os.path.getsize(os.path.join(x, f)) for f in os.listdir(x))} bytes")


if __name__ == "__main__":
    main()
