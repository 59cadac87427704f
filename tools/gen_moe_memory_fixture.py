#!/usr/bin/env python3
"""The real mixtures of experts' configs and transformers' / Accelerate's sizes of them.

Writes tests/data/mixtral_8x7b_config/config.json,
tests/data/qwen3_30b_a3b_config/config.json and
tests/data/qwen15_moe_a27b_config/config.json from transformers' MixtralConfig,
Qwen3MoeConfig and Qwen2MoeConfig with the Hub's values
(mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B, Qwen/Qwen1.5-MoE-A2.7B;
nothing is downloaded), then prints for each what tests/bigmodel.cmake
(bigmodel_estimate_memory_{mixtral,qwen3_moe,qwen2_moe}) and
tests/test_device_map.c (test_moe_real_configs) expect:
the parameters of the causal LM and of AutoModel (the body Accelerate
measures) built on the meta device under accelerate's init_empty_weights,
their f32 bytes, the largest layer (calculate_maximum_sizes with the model's
_no_split_modules), the table `accelerate estimate-memory` prints, run
through its own functions on the local config (its create_empty_model reads
the Hub, which this machine cannot reach), and infer_auto_device_map of the
causal LM in bfloat16 over 30 GB + 30 GB + 200 GB of cpu (it warns that
devices 0 and 1 are absent here: the map is the budgets').

    python3 tools/gen_moe_memory_fixture.py [--write] [NAME...]

NAMEs (keys of CONFIGS) limit the run to those configs. Also writes
tests/data/phi2_config (microsoft/phi-2's, a dense model),
tests/data/pythia1b_config (EleutherAI/pythia-1b's), tests/data/stablelm2_1_6b_config
(stabilityai/stablelm-2-1_6b's), tests/data/stablelm2_12b_config (stabilityai/stablelm-2-12b's
sizes, with qk_layernorm) and tests/data/starcoder2_3b_config
(bigcode/starcoder2-3b's) the same way.
"""
import argparse
import json
import os
from types import SimpleNamespace

import torch
import transformers
from accelerate import infer_auto_device_map, init_empty_weights
from accelerate.commands import estimate
from accelerate.utils import calculate_maximum_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data")

CONFIGS = {
    # mistralai/Mixtral-8x7B-v0.1 config.json
    "mixtral_8x7b_config": lambda: transformers.MixtralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_theta=1e6, num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.02,
        sliding_window=None, tie_word_embeddings=False, torch_dtype="bfloat16"),
    # Qwen/Qwen3-30B-A3B config.json
    "qwen3_30b_a3b_config": lambda: transformers.Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        router_aux_loss_coef=0.001, tie_word_embeddings=False, use_sliding_window=False,
        sliding_window=None, torch_dtype="bfloat16"),
    # Qwen/Qwen1.5-MoE-A2.7B config.json (60 experts of 1408 beside a shared expert of 5632)
    "qwen15_moe_a27b_config": lambda: transformers.Qwen2MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=8192, max_window_layers=21, rms_norm_eps=1e-6,
        rope_theta=1e6, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False, decoder_sparse_step=1,
        router_aux_loss_coef=0.001, tie_word_embeddings=False, use_sliding_window=False, sliding_window=32768,
        bos_token_id=151643, eos_token_id=151643, torch_dtype="bfloat16"),
    # microsoft/phi-2 config.json (PhiModel: a dense model, measured by the same tools)
    "phi2_config": lambda: transformers.PhiConfig(
        vocab_size=51200, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048, layer_norm_eps=1e-5,
        partial_rotary_factor=0.4, rope_theta=10000.0, resid_pdrop=0.1, embd_pdrop=0.0, attention_dropout=0.0,
        hidden_act="gelu_new", qk_layernorm=False, tie_word_embeddings=False, bos_token_id=50256,
        eos_token_id=50256, torch_dtype="float16"),
    # EleutherAI/pythia-1b config.json (GPTNeoXModel: a dense model; the Hub's keys rotary_pct and
    # rotary_emb_base, which GPTNeoXConfig reads into rope_parameters)
    "pythia1b_config": lambda: transformers.GPTNeoXConfig(
        vocab_size=50304, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=8, max_position_embeddings=2048, layer_norm_eps=1e-5, rotary_pct=0.25,
        rotary_emb_base=10000, hidden_act="gelu", use_parallel_residual=True, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, torch_dtype="float16"),
    # stabilityai/stablelm-2-1_6b config.json (StableLmModel: sequential, q/k/v biases, a quarter of each
    # head rotated, an untied head)
    "stablelm2_1_6b_config": lambda: transformers.StableLmConfig(
        vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, layer_norm_eps=1e-5,
        partial_rotary_factor=0.25, rope_theta=10000, use_qkv_bias=True, qk_layernorm=False,
        use_parallel_residual=False, hidden_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=False,
        bos_token_id=100257, eos_token_id=100257, torch_dtype="bfloat16"),
    # stabilityai/stablelm-2-12b's sizes (its model card: 5120 wide, 40 layers, 32 heads, 8 kv heads,
    # 4096 positions; parallel attention and MLP from one LayerNorm, per-head q/k LayerNorms
    # (qk_layernorm), no biases, a quarter of each head rotated; the 1.6B's vocabulary and untied head)
    "stablelm2_12b_config": lambda: transformers.StableLmConfig(
        vocab_size=100352, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096, layer_norm_eps=1e-5,
        partial_rotary_factor=0.25, rope_theta=10000, use_qkv_bias=False, qk_layernorm=True,
        use_parallel_residual=True, hidden_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=False,
        bos_token_id=100257, eos_token_id=100257, torch_dtype="bfloat16"),
    # bigcode/starcoder2-3b config.json (Starcoder2Model: biases, 2 kv heads, a window of 4096, a tied head)
    "starcoder2_3b_config": lambda: transformers.Starcoder2Config(
        vocab_size=49152, hidden_size=3072, intermediate_size=12288, num_hidden_layers=30,
        num_attention_heads=24, num_key_value_heads=2, max_position_embeddings=16384, norm_epsilon=1e-5,
        rope_theta=999999.4420358813, sliding_window=4096, use_bias=True, attention_dropout=0.1,
        residual_dropout=0.1, embedding_dropout=0.1, initializer_range=0.018042, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, torch_dtype="float32"),
}


def numel(model):
    return sum(p.numel() for p in model.parameters())


def report(name, config):
    with init_empty_weights():
        lm = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        body = transformers.AutoModel.from_config(config, torch_dtype=torch.float32)
    total, largest = calculate_maximum_sizes(body)
    print(f"{name}: {type(lm).__name__} {numel(lm)} parameters ({4 * numel(lm)} f32 bytes); "
          f"{type(body).__name__} {numel(body)} parameters, calculate_maximum_sizes total {total} bytes, "
          f"largest layer {largest[0]} bytes ({', '.join(largest[1])}); no-split {body._no_split_modules}")
    budgets = {0: "30GB", 1: "30GB", "cpu": "200GB"}
    device_map = infer_auto_device_map(lm, max_memory=budgets, no_split_module_classes=lm._no_split_modules,
                                       dtype=torch.bfloat16)
    print(f"{name}: infer_auto_device_map {json.dumps(budgets)} bfloat16: {json.dumps(device_map)}")
    # `accelerate estimate-memory` on this config: its own table, the model made here
    estimate.create_empty_model = lambda *a, **k: body
    estimate.estimate_command(SimpleNamespace(model_name=f"data/{name}", library_name="transformers",
                                              dtypes=["float32", "float16", "int8", "int4"],
                                              trust_remote_code=False))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the config.json files under tests/data")
    ap.add_argument("names", nargs="*", help="configs to run (default: all)")
    args = ap.parse_args()
    for name, make in CONFIGS.items():
        if args.names and name not in args.names:
            continue
        config = make()
        if args.write:
            os.makedirs(os.path.join(DATA, name), exist_ok=True)
            config.save_pretrained(os.path.join(DATA, name))
        report(name, config)


if __name__ == "__main__":
    main()
