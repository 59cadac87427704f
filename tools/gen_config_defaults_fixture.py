#!/usr/bin/env python3
"""transformers' AutoConfig.for_model(model_type) for every decoder family accel
builds, the fields accel_llama_config_for gives, into
tests/data/hf_config_defaults.json (read by tests/test_hf_config_for.c).

    python3 tools/gen_config_defaults_fixture.py

Each family's fields as transformers names them through the config's
attribute_map (GPT-2's n_embd as hidden_size, ...); a field the family's
config lacks (or holds as None) is left out. The bias fields are the
family's own key for its q/k/v biases (attention_bias, qkv_bias,
use_qkv_bias, use_bias), written as "qkv_biased": whether q_proj has a bias
in a model built from the default config."""
import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "granite", "phi3", "olmo2",
            "gpt2", "mixtral", "qwen3_moe", "qwen2_moe", "phi", "gpt_neox", "stablelm", "starcoder2"]
FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings"]


def q_biased(mt):
    """Whether a model of cfg's sizes, shrunk, has a bias on its first q projection (or GPT-2's c_attn,
    GPT-NeoX's query_key_value)."""
    small = AutoConfig.for_model(mt)
    for k, v in {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
                 "intermediate_size": 128, "vocab_size": 128, "head_dim": 16, "moe_intermediate_size": 32,
                 "shared_expert_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4}.items():
        if hasattr(small, k) and getattr(small, k) is not None:
            setattr(small, k, v)
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids past the shrunk vocabulary
        if hasattr(small, k):
            setattr(small, k, None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(small)
    for name, p in model.named_parameters():
        if name.endswith(("q_proj.bias", "c_attn.bias", "query_key_value.bias", "qkv_proj.bias")):
            return True
    return False


def main():
    out = {"transformers": transformers.__version__, "families": {}}
    for mt in FAMILIES:
        cfg = AutoConfig.for_model(mt)
        row = {}
        for f in FIELDS:
            v = getattr(cfg, f, None)
            if v is not None:
                row[f] = v
        row["qkv_biased"] = q_biased(mt)
        out["families"][mt] = row
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/hf_config_defaults.json"
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
