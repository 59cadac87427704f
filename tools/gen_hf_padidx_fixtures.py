#!/usr/bin/env python3
"""transformers' embedding gradient with padding_idx, for the tiny checkpoints
of tools/gen_hf_arch_fixtures.py (tests/data/hf_arch_<name>) loaded with
pad_token_id = PAD_ID: Llama (nn.Embedding(padding_idx=pad_token_id), untied),
Gemma (the same, tied to lm_head: the pad row gets lm_head's gradient only)
and GPT-2 (its wte has no padding_idx: the pad row trains).

    python3 tools/gen_hf_padidx_fixtures.py

Writes tests/data/hf_padidx/<name>.safetensors:
    ids   [3, 20] i64   tools/gen_hf_padded_fixtures.py's left-padded batch
                        (pads PAD_ID), with PAD_ID also at kept positions
    mask  [3, 20] i64   its attention_mask
    loss, g.embed       model(ids, attention_mask=mask, labels=ids with -100 at
                        the pads).loss and the embedding weight's gradient
"""
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from gen_hf_padded_fixtures import DATA, PAD_ID, batch

NAMES = {"llama_linear": "model.embed_tokens", "gemma": "model.embed_tokens", "gpt2_long": "transformer.wte"}
KEPT_PADS = [(0, 5), (0, 17), (1, 12), (2, 19)]  # (row, position) given PAD_ID inside the prompts


def main():
    os.makedirs(os.path.join(DATA, "hf_padidx"), exist_ok=True)
    for name, embed in NAMES.items():
        model = AutoModelForCausalLM.from_pretrained(os.path.join(DATA, "hf_arch_" + name), dtype=torch.float32,
                                                     pad_token_id=PAD_ID).eval()
        module = model.get_submodule(embed)
        assert module.padding_idx == (None if name == "gpt2_long" else PAD_ID), (name, module.padding_idx)
        ids, mask = batch(model.config.vocab_size, 900)
        for b, t in KEPT_PADS:
            assert mask[b, t] == 1
            ids[b, t] = PAD_ID
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        g = module.weight.grad.detach().float()
        out = {"ids": ids, "mask": mask, "loss": loss.detach().float(), "g.embed": g}
        path = os.path.join(DATA, "hf_padidx", name + ".safetensors")
        save_file({k: t.contiguous() for k, t in out.items()}, path)
        print(f"{path}: {os.path.getsize(path)} bytes, |g[pad]| {g[PAD_ID].abs().max():.3g}, "
              f"|g| {g.abs().max():.3g}")


if __name__ == "__main__":
    main()
