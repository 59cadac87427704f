#!/usr/bin/env python3
"""What transformers' from_pretrained does with two kinds of checkpoints that
tiny models of the repository's fixtures are edited into:

1. a tied pair stored under both names (tie_word_embeddings true): with
   different values transformers unties them (each module keeps its own stored
   value, a warning names both), with equal values it keeps them tied, with one
   name only it ties both to it; equality is that of the loaded parameters
   (llama_bf16_equal: untied in f32, tied when loaded as bf16);
2. the non-persistent buffers old checkpoints saved (GPT-2's attn.bias /
   attn.masked_bias, GPT-NeoX's attention.bias / masked_bias /
   rotary_emb.inv_freq, Llama's rotary_emb.inv_freq, BERT's position_ids):
   skipped silently where the class's _keys_to_ignore_on_load_unexpected (and
   the rotary / position_ids additions) match, reported as unexpected where not.

    python3 tools/gen_hf_tied_fixtures.py

Writes tests/data/hf_tied/<case>/: config.json (the source fixture's),
model.safetensors (its weights, edited) and expected.safetensors:
    ids [2, 7] i64, logits [2, 7, V] f32   decoders: transformers' logits on ids
    unexpected  u8                          the unexpected keys transformers
                                            reports, sorted, '\n'-joined
    untied      u8                          the model's tied target names it
                                            untied, sorted, '\n'-joined
"""
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
OUT = os.path.join(DATA, "hf_tied")


def other(t):
    """Values unlike t's everywhere (same shape and dtype)."""
    return (t.flip(0) * 0.5 + 0.25).to(t.dtype).contiguous()


def tril(n):
    return torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)


def layers(cfg):
    return cfg.get("num_hidden_layers", cfg.get("n_layer"))


def llama_unequal(sd, cfg):
    sd["lm_head.weight"] = other(sd["model.embed_tokens.weight"])


def llama_equal(sd, cfg):
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()


def llama_head_only(sd, cfg):
    sd["lm_head.weight"] = other(sd.pop("model.embed_tokens.weight"))


def llama_bf16_equal(sd, cfg):
    """different in f32, equal once rounded to bf16: loaded as bf16 (dtype=) the pair stays tied"""
    e = sd["model.embed_tokens.weight"]
    head = e.bfloat16().float()  # e's bf16 values: each differs from e's f32 one
    moved = head != e
    assert moved.float().mean() > 0.9 and torch.equal(head.bfloat16(), e.bfloat16())
    sd["lm_head.weight"] = head


def gpt2_unequal(sd, cfg):
    sd["lm_head.weight"] = other(sd["transformer.wte.weight"])


def bert_mlm_unequal(sd, cfg):
    """both pairs: the decoder's weight and its bias"""
    sd["cls.predictions.decoder.weight"] = other(sd["bert.embeddings.word_embeddings.weight"])
    sd["cls.predictions.decoder.bias"] = other(sd["cls.predictions.bias"])


def roberta_mlm_unequal(sd, cfg):
    """the weight differs, the bias is equal: one pair untied, one kept"""
    sd["lm_head.decoder.weight"] = other(sd["roberta.embeddings.word_embeddings.weight"])
    sd["lm_head.decoder.bias"] = sd["lm_head.bias"].clone()


def neox_buffers(sd, cfg):
    n, hd = cfg["max_position_embeddings"], cfg["hidden_size"] // cfg["num_attention_heads"]
    rot = int(hd * cfg.get("rotary_pct", 1.0))
    for i in range(layers(cfg)):
        p = f"gpt_neox.layers.{i}.attention."
        sd[p + "bias"] = tril(n)
        sd[p + "masked_bias"] = torch.tensor(-1e9)
        sd[p + "rotary_emb.inv_freq"] = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))


def neox_buffers_extra(sd, cfg):
    neox_buffers(sd, cfg)
    sd["gpt_neox.layers.0.attention.extra_scale"] = torch.ones(1)


def gpt2_buffers(sd, cfg):
    """attn.masked_bias is not among GPT-2's patterns: transformers reports it"""
    for i in range(layers(cfg)):
        sd[f"transformer.h.{i}.attn.bias"] = tril(cfg["n_positions"])
        sd[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)


def rotary_buffers(sd, cfg):
    for i in range(layers(cfg)):
        sd[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.ones(4)


def bert_buffers(sd, cfg):
    """position_ids skipped; token_type_ids, and a name that only contains position_ids, reported"""
    sd["bert.embeddings.position_ids"] = torch.arange(cfg["max_position_embeddings"]).view(1, -1)
    sd["bert.embeddings.xposition_ids"] = torch.arange(cfg["max_position_embeddings"]).view(1, -1)
    sd["bert.embeddings.token_type_ids"] = torch.zeros(1, cfg["max_position_embeddings"], dtype=torch.long)


CASES = {  # case: (source fixture, edit, masked LM)
    "llama_unequal": ("hf_llama_tied", llama_unequal, False),
    "llama_equal": ("hf_llama_tied", llama_equal, False),
    "llama_head_only": ("hf_llama_tied", llama_head_only, False),
    "llama_bf16_equal": ("hf_llama_tied", llama_bf16_equal, False),
    "gpt2_unequal": ("hf_arch_gpt2", gpt2_unequal, False),
    "bert_mlm_unequal": ("hf_bert_mlm", bert_mlm_unequal, True),
    "roberta_mlm_unequal": ("hf_roberta_mlm", roberta_mlm_unequal, True),
    "neox_buffers": ("hf_arch_neox", neox_buffers, False),
    "neox_buffers_extra": ("hf_arch_neox", neox_buffers_extra, False),
    "gpt2_buffers": ("hf_arch_gpt2", gpt2_buffers, False),
    "llama_buffers": ("hf_llama_tied", rotary_buffers, False),
    "gemma3_buffers": ("hf_arch_gemma3", rotary_buffers, False),  # no inv_freq pattern in Gemma 3
    "bert_buffers": ("hf_bert_mlm", bert_buffers, True),
}


def names(keys):
    return torch.frombuffer(bytearray("\n".join(sorted(keys)).encode() or b"\n"), dtype=torch.uint8).clone()


def make(case, src, edit, mlm):
    d = os.path.join(OUT, case)
    os.makedirs(d, exist_ok=True)
    cfg = json.load(open(os.path.join(DATA, src, "config.json")))
    shutil.copy(os.path.join(DATA, src, "config.json"), d)
    sd = load_file(os.path.join(DATA, src, "model.safetensors"))
    edit(sd, cfg)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    cls = AutoModelForMaskedLM if mlm else AutoModelForCausalLM
    model, info = cls.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    model.eval()
    declared = cls.from_pretrained(os.path.join(DATA, src), dtype=torch.float32).all_tied_weights_keys
    untied = sorted(set(declared) - set(model.all_tied_weights_keys))
    for target in untied:  # each module holds its own stored value
        assert model.get_parameter(target) is not model.get_parameter(declared[target])
        assert torch.equal(model.get_parameter(target), sd[target]), target
    out = {"unexpected": names(info["unexpected_keys"]), "untied": names(untied)}
    if not mlm:
        g = torch.Generator().manual_seed(7)
        ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=g)
        with torch.no_grad():
            out["ids"], out["logits"] = ids, model(ids).logits.float()
    if case == "llama_bf16_equal":  # compared as loaded: in the dtype asked for
        in_bf16 = cls.from_pretrained(d, dtype=torch.bfloat16)
        assert untied == ["lm_head.weight"] and in_bf16.lm_head.weight is in_bf16.model.embed_tokens.weight
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(d, "expected.safetensors"))
    print(f"{case}: untied {untied}, unexpected {sorted(info['unexpected_keys'])}")


def main():
    for case, (src, edit, mlm) in CASES.items():
        make(case, src, edit, mlm)


if __name__ == "__main__":
    main()
