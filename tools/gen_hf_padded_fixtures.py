#!/usr/bin/env python3
"""transformers' outputs on a left-padded batch, for the tiny checkpoints of
tools/gen_hf_arch_fixtures.py (tests/data/hf_arch_<name>, loaded as they are).

    python3 tools/gen_hf_padded_fixtures.py [NAME...]   # default: every name of NAMES

Writes tests/data/hf_padded/<name>.safetensors:
    ids        [3, 20] i64   three prompts of 20, 13 and 9 tokens, left-padded
                             with PAD_ID (past the windows of 8)
    mask       [3, 20] i64   their attention_mask (tokenizer(padding_side="left"))
    rows       [42] i64      the flat indices (b 20 + t) of the mask's ones
    logits     [42, V] f32   model(ids, attention_mask=mask).logits at those rows
                             (transformers' forward: positions 0..19 in every row)
    logits_pos [42, V] f32   the same with position_ids = mask.cumsum(-1) - 1,
                             0 at the pads (what its generate passes)
    loss, g.<param>          model(ids, attention_mask=mask, labels=ids with -100
                             at the pads).loss and every gradient (mixtral,
                             qwen2_moe: plus the routers' load-balancing loss,
                             whose means leave the masked tokens out)
    greedy     [3, 20 + 12]  generate(ids, attention_mask=mask, max_new_tokens=12,
                             greedy, eos_token_id=eos, pad_token_id=PAD_ID)
    eos        [1] i64       row 1's third (or later) new token of a run without
                             eos, one no other row makes before it: row 1 stops
                             early, pads after (the first seed with one)
and, for the names of TAIL_NAMES (llama_dynamic, llama_longrope: RoPE chosen by the largest position):
    tail_logits [3, TAIL, V] f32  model(ids[:, -TAIL:], attention_mask=mask[:, -TAIL:], position_ids=
                             the last TAIL of logits_pos's): TAIL tokens at positions up to 19, past the
                             16 where their RoPE changes (transformers takes max(position_ids) + 1)
and, for the names of TRAIN (gpt2_layer_scale):
    train_loss, train_g.<param>  the loss and gradients of model.train() with
                             attn_pdrop ATTN_P (an attention dropout that drops
                             nothing: 1 - p is 1.0 in double) and no other
                             dropout: what a model training with attention
                             dropout computes, minus the draws (accel then
                             takes its explicit-score attention)
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.core_model_loading import revert_weight_conversion

NAMES = ["llama_linear", "mistral", "qwen2_window", "qwen3", "gemma", "gemma2", "gemma3", "granite", "phi3",
         "olmo2", "gpt2_long", "mixtral", "qwen3_moe", "qwen2_moe", "phi", "neox", "stablelm", "starcoder2",
         "stablelm_qk", "gpt2_layer_scale", "llama_dynamic", "llama_longrope"]
# GPT-2 with scale_attn_by_inverse_layer_idx: also in training mode, its attention dropout on
TRAIN = {"gpt2_layer_scale"}
ATTN_P = 1e-30
TAIL_NAMES = {"llama_dynamic", "llama_longrope"}
TAIL = 8
LENGTHS = [20, 13, 9]
PAD_ID = 3
NEW = 12
DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data")


def batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    T = max(LENGTHS)
    ids = torch.full((len(LENGTHS), T), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(LENGTHS), T), dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        ids[b, T - n:] = torch.randint(0, vocab, (n,), generator=g)
        mask[b, T - n:] = 1
    return ids, mask


def pick_eos(model, ids, mask):
    with torch.no_grad():
        free = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=PAD_ID)[:, ids.shape[1]:]
    for k in range(2, NEW - 1):
        tok = int(free[1, k])
        first = [int((free[b] == tok).nonzero()[0]) if (free[b] == tok).any() else NEW for b in range(3)]
        if tok != PAD_ID and first[1] == k and all(first[b] > k + 1 for b in (0, 2)):
            return tok
    return None


def loss_and_grads(model, ids, mask, prefix):
    """{prefix + "loss": the loss of ids with the mask (labels -100 at the pads), prefix + "g.<param>": its
    gradients} under the checkpoint's names."""
    model.zero_grad()
    loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    out = {prefix + "loss": loss.detach().float()}
    grads = {n: p.grad.detach().float() for n, p in model.named_parameters()}
    for n, t in revert_weight_conversion(model, grads).items():
        out[prefix + "g." + n] = t
    return out


def training_with_attention_dropout(model, ids, mask):
    """loss_and_grads as "train_" in model.train(), every attention dropout at ATTN_P, the other dropouts off."""
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = ATTN_P if name.endswith("attn_dropout") else 0.0
    model.train()
    out = loss_and_grads(model, ids, mask, "train_")
    model.eval()
    return out


def main():
    names = sys.argv[1:] or NAMES
    os.makedirs(os.path.join(DATA, "hf_padded"), exist_ok=True)
    for i, name in enumerate(names):
        model = AutoModelForCausalLM.from_pretrained(os.path.join(DATA, "hf_arch_" + name),
                                                     dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None
        # the routers' balance in the loss only: transformers' generate fails on it
        # with a cache (its mask is the whole sequence's)
        balance = getattr(model.config, "output_router_logits", False)
        model.config.output_router_logits = False
        # the first seed whose batch has an eos candidate
        for seed in range(500 + 100 * NAMES.index(name), 600 + 100 * NAMES.index(name)):
            ids, mask = batch(model.config.vocab_size, seed)
            eos = pick_eos(model, ids, mask)
            if eos is not None:
                break
        else:
            sys.exit(f"{name}: no eos candidate in 100 seeds")
        # afresh: dynamic RoPE keeps the frequencies of the longest input the model object has seen (pick_eos's)
        model = AutoModelForCausalLM.from_pretrained(os.path.join(DATA, "hf_arch_" + name), dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None
        model.config.output_router_logits = False
        rows = mask.flatten().nonzero().squeeze(1)
        out = {"ids": ids, "mask": mask, "rows": rows}
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        with torch.no_grad():
            V = model.config.vocab_size
            out["logits"] = model(input_ids=ids, attention_mask=mask).logits.reshape(-1, V)[rows].float()
            out["logits_pos"] = model(input_ids=ids, attention_mask=mask,
                                      position_ids=pos).logits.reshape(-1, V)[rows].float()
            if name in TAIL_NAMES:
                out["tail_logits"] = model(input_ids=ids[:, -TAIL:], attention_mask=mask[:, -TAIL:],
                                           position_ids=pos[:, -TAIL:]).logits.float()
        model.config.output_router_logits = balance
        out.update(loss_and_grads(model, ids, mask, ""))
        model.config.output_router_logits = False
        with torch.no_grad():
            out["greedy"] = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                           eos_token_id=eos, pad_token_id=PAD_ID)
        out["eos"] = torch.tensor([eos])
        if name in TRAIN:
            out.update(training_with_attention_dropout(model, ids, mask))
            print(f"  train: loss {float(out['train_loss']):.6g} (eval {float(out['loss']):.6g})")
        path = os.path.join(DATA, "hf_padded", name + ".safetensors")
        save_file({k: t.contiguous() for k, t in out.items()}, path)
        print(f"{path}: {os.path.getsize(path)} bytes, eos {eos}, greedy rows end "
              f"{out['greedy'][:, -4:].tolist()}")


if __name__ == "__main__":
    main()
