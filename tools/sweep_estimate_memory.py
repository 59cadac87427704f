"""A generated sweep of `accel estimate-memory DIR` against Accelerate's own table.

For every model family accel's estimate-memory reads, random small configs
(seeded) are written with transformers' config classes (save_pretrained, so
config.json holds what transformers writes), and each is measured twice:

  accel     `accel estimate-memory DIR [--dtypes ...]`, its stdout
  peer      Accelerate's `estimate_command` on the same parsed arguments, its
            model made as Accelerate's create_empty_model makes it from a Hub
            repo (AutoModel.from_config under init_empty_weights, float32),
            from the local config instead of the Hub

The two tables are compared character for character. A config transformers
refuses is drawn again; one accel refuses is a finding like a different
table (estimate-memory claims every family below).

    python3 tools/sweep_estimate_memory.py [--accel build/bin/accel] [--n 40] [--seed 0] [--only gpt2,phi]

Prints one line per disagreement (family, config, both tables) and a summary;
exit status 1 when any disagreed. Needs torch, transformers and accelerate.
"""
import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile

import torch
import transformers
from accelerate import init_empty_weights
from accelerate.commands import estimate as accel_estimate


def attn(r, heads_max=8):
    """hidden, heads, kv heads, head_dim (None: hidden / heads)."""
    heads = r.choice([1, 2, 4, 8][: 1 + [1, 2, 4, 8].index(heads_max)])
    kv = r.choice([d for d in (1, 2, 4, 8) if d <= heads and heads % d == 0])
    hd = r.choice([2, 4, 8, 16, 32])  # tiny ones: tables in bytes, exact to the byte
    hidden = heads * hd
    explicit = r.random() < 0.3
    if explicit:
        hd = r.choice([2, 6, 8, 16, 24, 64])
    return hidden, heads, kv, (hd if explicit else None)


def common(r, cfg):
    cfg["vocab_size"] = r.choice([5, 17, 64, 100, 1000, 4099, 32000])
    cfg["num_hidden_layers"] = r.randint(1, 4)
    cfg["intermediate_size"] = r.choice([2, 6, 16, 48, 100, 256])
    cfg["tie_word_embeddings"] = r.random() < 0.5
    cfg["max_position_embeddings"] = r.choice([64, 128, 2048])
    return cfg


def decoder(r, model_type, extra=None):
    hidden, heads, kv, hd = attn(r)
    cfg = common(r, {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv})
    # StableLM's attention ignores head_dim (hidden / heads); accel refuses a config that says otherwise
    if hd is not None and model_type != "stablelm":
        cfg["head_dim"] = hd
    # token ids inside the vocabulary (Phi-3's default pad id, 32000, is an embedding's padding_idx)
    cfg.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    for k, v in (extra or {}).items():
        cfg[k] = v(r) if callable(v) else v
    return cfg


def coin(p=0.5):
    return lambda r: r.random() < p


def moe(r, model_type):
    cfg = decoder(r, model_type)
    if model_type == "mixtral":
        cfg["num_local_experts"] = r.randint(1, 6)
        cfg["num_experts_per_tok"] = r.randint(1, cfg["num_local_experts"])
    else:
        cfg["num_experts"] = r.randint(1, 6)
        cfg["num_experts_per_tok"] = r.randint(1, cfg["num_experts"])
        cfg["moe_intermediate_size"] = r.choice([2, 8, 24, 64])
        cfg["norm_topk_prob"] = r.random() < 0.5
        if model_type == "qwen2_moe":
            cfg["shared_expert_intermediate_size"] = r.choice([8, 32, 96])
        cfg["decoder_sparse_step"] = r.choice([1, 1, 2])
        cfg["mlp_only_layers"] = sorted(r.sample(range(cfg["num_hidden_layers"]), r.randint(0, 1)))
    return cfg


def gemma3(r, model_type):
    """Its rotary embedding holds a pair of buffers for each layer type its layers have."""
    cfg = decoder(r, model_type, {"sliding_window": lambda r: r.choice([16, 512])})
    n = cfg["num_hidden_layers"]
    kind = r.choice(["default", "sliding", "full", "mixed"])
    if kind != "default":
        cfg["layer_types"] = [{"sliding": "sliding_attention", "full": "full_attention"}.get(
            kind, r.choice(["sliding_attention", "full_attention"])) for _ in range(n)]
    return cfg


def gpt2(r, _):
    heads = r.choice([1, 2, 4])
    return {"n_embd": heads * r.choice([2, 8, 16]), "n_head": heads, "n_layer": r.randint(1, 4),
            "n_positions": r.choice([4, 16, 64, 1024]), "vocab_size": r.choice([5, 17, 1000, 50257]),
            "n_inner": r.choice([None, 40, 128]), "tie_word_embeddings": r.random() < 0.8}


def gpt_neox(r, _):
    heads = r.choice([1, 2, 4])
    hidden = heads * r.choice([4, 8, 16])
    return {"hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": r.randint(1, 4),
            "intermediate_size": r.choice([2, 16, 64, 100]), "vocab_size": r.choice([5, 17, 1000, 50304]),
            "rotary_pct": r.choice([0.25, 0.5, 1.0]), "use_parallel_residual": r.random() < 0.5,
            "max_position_embeddings": r.choice([64, 2048]), "tie_word_embeddings": r.random() < 0.3,
            "attention_bias": r.random() < 0.7}


def bert(r, model_type):
    heads = r.choice([1, 2, 4])
    return {"hidden_size": heads * r.choice([2, 8, 16]), "num_attention_heads": heads,
            "num_hidden_layers": r.randint(1, 4), "intermediate_size": r.choice([2, 16, 64, 100]),
            "vocab_size": r.choice([5, 17, 1000, 30522]), "type_vocab_size": r.choice([1, 2]),
            "max_position_embeddings": r.choice([8, 64, 514]), "tie_word_embeddings": r.random() < 0.5}


FAMILIES = {
    "llama": lambda r, t: decoder(r, t, {"attention_bias": coin(0.2), "mlp_bias": coin(0.2)}),
    "mistral": lambda r, t: decoder(r, t, {"sliding_window": lambda r: r.choice([None, 16, 4096])}),
    "qwen2": lambda r, t: decoder(r, t),
    "qwen3": lambda r, t: decoder(r, t, {"attention_bias": coin(0.2)}),
    "gemma": lambda r, t: decoder(r, t),
    "gemma2": lambda r, t: decoder(r, t, {"query_pre_attn_scalar": lambda r: r.choice([16, 64])}),
    "gemma3_text": lambda r, t: gemma3(r, t),
    "granite": lambda r, t: decoder(r, t, {"attention_bias": coin(0.3), "mlp_bias": coin(0.3)}),
    "olmo2": lambda r, t: decoder(r, t, {"attention_bias": coin(0.2)}),
    "phi": lambda r, t: decoder(r, t, {"partial_rotary_factor": lambda r: r.choice([0.25, 0.5, 1.0]),
                                       "qk_layernorm": coin(0.3)}),
    "phi3": lambda r, t: decoder(r, t, {"partial_rotary_factor": lambda r: r.choice([0.5, 1.0])}),
    "stablelm": lambda r, t: decoder(r, t, {"use_qkv_bias": coin(), "qk_layernorm": coin(0.3),
                                            "use_parallel_residual": coin(0.3),
                                            "partial_rotary_factor": lambda r: r.choice([0.25, 1.0])}),
    "starcoder2": lambda r, t: decoder(r, t, {"use_bias": coin(0.7)}),
    "mixtral": moe,
    "qwen2_moe": moe,
    "qwen3_moe": moe,
    "gpt2": gpt2,
    "gpt_neox": gpt_neox,
    "bert": bert,
    "roberta": bert,
    "xlm-roberta": bert,
}


def make_config(model_type, fields):
    cls = transformers.AutoConfig.for_model(model_type).__class__
    fields = {k: v for k, v in fields.items() if v is not None or k == "n_inner"}
    if model_type in ("phi", "gpt2", "gpt_neox", "bert", "roberta", "xlm-roberta"):
        fields.pop("num_key_value_heads", None)
    return cls(**fields)


def drawn(model_type, r, n, tmp, measure):
    """Up to n random configs of model_type, each saved in a directory of its own under tmp:
    yields (fields, config, directory, measure(config, directory)); a config transformers
    refuses, or measure does (raising), is drawn again."""
    done = tries = 0
    while done < n and tries < 20 * n:
        tries += 1
        fields = FAMILIES[model_type](r, model_type)
        try:
            config = make_config(model_type, fields)
            d = os.path.join(tmp, f"{model_type}_{done}")
            config.save_pretrained(d)
            value = measure(config, d)
        except Exception:  # noqa: BLE001 - transformers' refusals take many types
            continue
        done += 1
        yield fields, config, d, value


def refusal(model_type, config):
    """The words of accel's refusal where it refuses by design a config transformers builds, else None:
    rotary dims (head_dim x partial_rotary_factor) that are odd or 0 (transformers then rotates
    2 ceil(dims / 2) of them), Phi's q/k LayerNorms narrower than a head given by head_dim (its
    forward fails)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if model_type == "stablelm":
        head_dim = config.hidden_size // heads
    frac = getattr(config, "partial_rotary_factor", None) or getattr(config, "rotary_pct", None) or 1.0
    rope = getattr(config, "rope_parameters", None) or {}
    frac = rope.get("partial_rotary_factor", frac) if isinstance(rope, dict) else frac
    if model_type in ("gpt2", "bert", "roberta", "xlm-roberta"):
        return None
    if model_type == "phi" and getattr(config, "qk_layernorm", False) and head_dim != config.hidden_size // heads:
        return "qk_layernorm is only implemented"
    dims = int(head_dim * frac)
    if dims <= 0 or dims % 2:
        return "rotary dims"
    return None


def peer_table(cfg_dir, config, dtypes):
    with init_empty_weights():
        model = transformers.AutoModel.from_config(config, torch_dtype=torch.float32)
    saved = accel_estimate.create_empty_model
    accel_estimate.create_empty_model = lambda *a, **k: model
    try:
        parser = accel_estimate.estimate_command_parser()
        args = parser.parse_args([cfg_dir] + (["--dtypes"] + dtypes if dtypes else []))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            accel_estimate.estimate_command(args)
    finally:
        accel_estimate.create_empty_model = saved
    return out.getvalue()


def accel_table(accel, cfg_dir, dtypes):
    cmd = [accel, "estimate-memory", cfg_dir] + (["--dtypes"] + dtypes if dtypes else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", default="build/bin/accel")
    ap.add_argument("--n", type=int, default=40, help="configs per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    transformers.logging.set_verbosity_error()
    bad = total = refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in FAMILIES:
            if only and model_type not in only:
                continue
            r = random.Random(f"{a.seed}:{model_type}")
            def measure(config, d):
                dtypes = r.choice([[], [], ["float32"], ["int4", "float16"]])
                return dtypes, peer_table(d, config, dtypes)
            done = 0
            for fields, config, d, (dtypes, want) in drawn(model_type, r, a.n, tmp, measure):
                done += 1
                total += 1
                rc, got, err = accel_table(a.accel, d, dtypes)
                words = refusal(model_type, config)
                if words:
                    refused += 1
                    if rc != 1 or words not in err:
                        bad += 1
                        print(f"NOT REFUSED {model_type} {json.dumps(fields)} rc={rc} (expected '{words}')\n{err}")
                elif rc != 0 or got != want:
                    bad += 1
                    print(f"DISAGREE {model_type} {json.dumps(fields)} dtypes={dtypes} rc={rc}")
                    print("  accel:", err.strip() if rc else "")
                    print(got)
                    print("  accelerate:")
                    print(want)
            print(f"{model_type}: {done} configs", file=sys.stderr)
    print(f"{total} configs ({refused} refused by design), {bad} disagreed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
