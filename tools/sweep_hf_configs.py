#!/usr/bin/env python3
"""A generated sweep of small Hugging Face configs: accel's load and forward
against transformers' logits, case by case.

    python3 tools/sweep_hf_configs.py [--n N] [--seed S] [--families a,b] [--lib PATH]
                                      [--work DIR] [--keep] [--tol T] [--timeout SEC]
                                      [--dtype bfloat16] [--preload "LIBASAN LIBUBSAN"]

For each case (family i % len(families), its own seeded random.Random) it
draws a config of the kind real checkpoints vary (hidden size, heads, kv
heads, an explicit head_dim, intermediate size, 1-3 layers, RoPE type and
parameters, partial rotary, biases, tied head, eps, activation, sliding
window shorter than the input, max_position_embeddings, vocab, and each
family's own keys), has transformers build the model (random weights from
torch.manual_seed, large enough that logits are a few units), save_pretrained
it (safetensors, f32 unless --dtype), half the cases' config.json rewritten
in transformers 4.x's layout (rope_theta and rope_scaling, torch_dtype: most
Hub checkpoints'), load it back with transformers and take its logits (eager
attention) on ids [2, T], T <= 24: in one forward without a cache, and
(decoders) in two, the second through the KV cache. A config transformers
refuses is drawn again.

Then accel (libaccel.so through ctypes, in worker processes: --lib,
default build/lib/libaccel.so) loads each directory with
accel_llama_from_pretrained (BERT / RoBERTa / XLM-RoBERTa:
accel_bert_from_pretrained_head, the masked LM) and runs the forward on the
same ids, and the decoders' two forwards through accel_llama_kv_cache_new's
cache. Each case ends as one of:

    match     max |accel - transformers| <= tol * max(1, max |transformers|)
    refused   accel's error; the report lists each distinct message (file
              paths cut) so that one can check that it names the field and
              that the feature is documented as unsupported
    MISMATCH  logits beyond tolerance (or a different shape)
    CRASH     the worker died on the case (a signal, an abort); HANG: no
              answer within --timeout seconds

Exit status 1 when any case is MISMATCH, CRASH or HANG. The cases' folders
(config.json, model.safetensors, ids and transformers' logits in
case.safetensors) stay in --work, or in the temporary folder with --keep, to
reproduce one by hand.
"""
import argparse
import collections
import ctypes
import json
import math
import os
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

DECODERS = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "granite", "phi3", "olmo2",
            "gpt2", "mixtral", "qwen3_moe", "qwen2_moe", "phi", "gpt_neox", "stablelm", "starcoder2"]
ENCODERS = ["bert", "roberta", "xlm-roberta"]
FAMILIES = DECODERS + ENCODERS

# accel_bert_head's ACCEL_BERT_MASKED_LM
BERT_MASKED_LM = 3


# ------------------------------------------------------------ configs

def rope_parameters(r, rotary_dims, theta):
    """A rope_parameters dict of a random type (transformers' six) and parameters; rotary_dims: the rotated
    dims of a head (longrope's factors are half as many)."""
    kind = r.choice(["default", "default", "linear", "dynamic", "yarn", "longrope", "llama3"])
    p = {"rope_type": kind, "rope_theta": theta}
    if kind in ("linear", "dynamic"):
        p["factor"] = r.choice([1.0, 1.5, 2.0, 4.0, r.uniform(1.0, 8.0)])
    elif kind == "yarn":
        p["factor"] = r.choice([2.0, 4.0, r.uniform(1.0, 16.0)])
        p["original_max_position_embeddings"] = r.randint(4, 20)
        for key, lo, hi in (("beta_fast", 8.0, 64.0), ("beta_slow", 0.5, 2.0), ("attention_factor", 0.5, 2.0),
                            ("mscale", 0.5, 2.0), ("mscale_all_dim", 0.5, 2.0)):
            if r.random() < 0.25:
                p[key] = round(r.uniform(lo, hi), 3)
        if r.random() < 0.25:
            p["truncate"] = r.random() < 0.5
    elif kind == "longrope":
        n = rotary_dims // 2
        p["short_factor"] = [round(r.uniform(1.0, 2.0), 3) for _ in range(n)]
        p["long_factor"] = [round(r.uniform(1.0, 8.0), 3) for _ in range(n)]
        p["original_max_position_embeddings"] = r.randint(4, 20)
        if r.random() < 0.3:
            p["attention_factor"] = round(r.uniform(0.5, 2.0), 3)
        if r.random() < 0.3:
            p["factor"] = round(r.uniform(1.0, 8.0), 3)
    elif kind == "llama3":
        p["factor"] = r.choice([2.0, 8.0, r.uniform(1.0, 16.0)])
        p["low_freq_factor"] = r.choice([1.0, r.uniform(0.5, 2.0)])
        p["high_freq_factor"] = p["low_freq_factor"] + r.choice([3.0, r.uniform(0.5, 6.0)])
        p["original_max_position_embeddings"] = r.randint(4, 20)
    return p


def config_keys(family):
    """The keys of the family's config class's constructor."""
    import inspect
    from transformers import CONFIG_MAPPING
    return inspect.signature(CONFIG_MAPPING[family].__init__).parameters


def heads(r, max_hidden=64):
    """(hidden, heads, kv heads, head_dim or None): GQA, MQA, MHA; head_dim explicit, and other than
    hidden / heads, half the time."""
    nh = r.choice([1, 2, 4, 8])
    kv = r.choice([d for d in (1, 2, 4, 8) if nh % d == 0])
    if r.random() < 0.5:
        hd = r.choice([4, 6, 8, 12, 16])
        hidden = r.choice([16, 24, 32, 48, 64])
        return hidden, nh, kv, hd
    hd = r.choice([d for d in (2, 4, 6, 8) if nh * d <= max_hidden])
    return nh * hd, nh, kv, None


def decoder_config(family, r, T):
    """A random config dict of a decoder family (AutoConfig.for_model's kwargs)."""
    hidden, nh, kv, hd = heads(r)
    head_dim = hd or hidden // nh
    c = dict(vocab_size=r.randint(16, 128), hidden_size=hidden, num_attention_heads=nh, num_key_value_heads=kv,
             intermediate_size=r.randint(8, 96), num_hidden_layers=r.randint(1, 3),
             max_position_embeddings=r.choice([T, 32, 64, r.randint(8, 64)]),
             tie_word_embeddings=r.random() < 0.4, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if hd:
        c["head_dim"] = hd
    theta = r.choice([10000.0, 1e6, 500.0, 2.0, round(10 ** r.uniform(2, 6), 1)])
    eps = r.choice([1e-6, 1e-5, 1e-3, 0.1])
    prf = 1.0
    partial = family in ("phi3", "phi", "gpt_neox", "stablelm")
    if partial or r.random() < 0.1:
        prf = r.choice([1.0, 0.5, 0.25, 0.75, 0.4])
        c["partial_rotary_factor"] = prf
    rot = int(head_dim * prf)
    rot -= rot % 2
    if r.random() < 0.6 or family == "gpt_neox":
        rp = rope_parameters(r, max(rot, 2), theta)
        if rp.get("rope_type") == "longrope" and rot < 2:
            rp = {"rope_type": "default", "rope_theta": theta}
        c["rope_parameters"] = rp
    else:
        c["rope_theta"] = theta
    if family not in ("phi", "gpt_neox", "stablelm", "starcoder2"):
        c["rms_norm_eps"] = eps
    if r.random() < 0.2:
        c["hidden_act"] = r.choice(["silu", "gelu", "gelu_pytorch_tanh", "relu", "gelu_new"])
    # the bias keys where the family's config has them (elsewhere transformers ignores them, accel refuses true)
    for key, p in (("attention_bias", 0.3), ("mlp_bias", 0.2)):
        if key in config_keys(family) and r.random() < p:
            c[key] = r.random() < 0.7
    # not 1: transformers 5.25's cached decode step with a window of 1 differs from its own full forward
    window = r.choice([2, T, r.randint(2, max(2, T - 1)), r.randint(2, max(2, T - 1))])
    if r.random() < 0.05:
        c["num_key_value_heads"] = None  # as many as heads
    if family == "mistral" or family == "mixtral" or family == "starcoder2" or family == "phi3":
        if r.random() < 0.6:
            c["sliding_window"] = window
    if family in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe"):
        if r.random() < 0.6:
            c["use_sliding_window"] = r.random() < 0.8
            c["sliding_window"] = window
            if family != "qwen3_moe":
                c["max_window_layers"] = r.randint(0, c["num_hidden_layers"])
            if family in ("qwen2", "qwen3") and r.random() < 0.3:  # full layers first, then sliding ones
                n = c["num_hidden_layers"]
                first = r.randint(0, n)
                c["layer_types"] = ["full_attention"] * first + ["sliding_attention"] * (n - first)
    if family == "gemma":
        c["hidden_act"] = r.choice(["gelu_pytorch_tanh", "gelu", "gelu_pytorch_tanh"])
    if family in ("gemma2", "gemma3_text"):
        c["sliding_window"] = window
        c["query_pre_attn_scalar"] = r.choice([head_dim, 16, r.randint(1, 64)])
        if r.random() < 0.6:
            c["final_logit_softcapping"] = r.choice([None, 3.0, 30.0, round(r.uniform(0.5, 10), 2)])
        if family == "gemma2" and r.random() < 0.7:
            c["attn_logit_softcapping"] = r.choice([None, 2.0, 50.0, round(r.uniform(0.5, 10), 2)])
        c.pop("hidden_act", None)
        if r.random() < 0.1:
            c["hidden_activation"] = r.choice(["gelu_pytorch_tanh", "gelu"])
    if family == "gemma3_text":
        n = c["num_hidden_layers"]
        if r.random() < 0.5:
            c["layer_types"] = [r.choice(["full_attention", "sliding_attention"]) for _ in range(n)]
        else:
            c["sliding_window_pattern"] = r.randint(1, 4)
        if "rope_parameters" in c or r.random() < 0.5:
            full = c.pop("rope_parameters", {"rope_type": "default", "rope_theta": theta})
            c.pop("rope_theta", None)
            local = {"rope_type": "default", "rope_theta": r.choice([10000.0, 100.0, round(10 ** r.uniform(2, 5))])}
            c["rope_parameters"] = {"full_attention": full, "sliding_attention": local}
    if family == "granite":
        for k in ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"):
            if r.random() < 0.7:
                c[k] = round(r.uniform(0.1, 8.0), 3)
    if family == "phi3":
        c["original_max_position_embeddings"] = r.randint(4, 20)
        if r.random() < 0.1:
            c["resid_pdrop"] = 0.1
    if family in ("phi", "stablelm", "gpt_neox"):
        c["layer_norm_eps"] = eps
        if family != "gpt_neox":
            c["qk_layernorm"] = r.random() < 0.4
    if family == "stablelm":
        c["use_qkv_bias"] = r.random() < 0.5
        c["use_parallel_residual"] = r.random() < 0.4
    # GPT-NeoX's heads are hidden_size / num_attention_heads wide, and so are Phi's without head_dim: fewer
    # heads where that would pass a hidden size of 64 (kv heads, powers of 2, still dividing them)
    narrow = nh
    while narrow * head_dim > 64:
        narrow //= 2
    if family == "gpt_neox":
        c.pop("num_key_value_heads")
        c.pop("head_dim", None)
        c["num_attention_heads"] = narrow
        c["hidden_size"] = narrow * head_dim
        c["use_parallel_residual"] = r.random() < 0.6
        c["hidden_act"] = r.choice(["gelu", "gelu_fast", "gelu_new", "gelu_pytorch_tanh", "relu"])
        if "rope_theta" in c:
            c["rotary_emb_base"] = c.pop("rope_theta")
        c["rotary_pct"] = c.pop("partial_rotary_factor", 0.25)
    if family == "phi" and "head_dim" in c and r.random() < 0.7:
        del c["head_dim"]
        c["num_attention_heads"], c["num_key_value_heads"] = narrow, min(kv, narrow)
        c["hidden_size"] = narrow * head_dim
    if family == "starcoder2":
        c["norm_epsilon"] = eps
        c["use_bias"] = r.random() < 0.6
        c.pop("attention_bias", None)
        c.pop("mlp_bias", None)
    if family == "mixtral":
        c["num_local_experts"] = r.randint(2, 6)
        c["num_experts_per_tok"] = r.randint(1, c["num_local_experts"])
    if family in ("qwen3_moe", "qwen2_moe"):
        c["num_experts"] = r.randint(2, 8)
        c["num_experts_per_tok"] = r.randint(1, c["num_experts"])
        c["moe_intermediate_size"] = r.randint(4, 48)
        c["norm_topk_prob"] = r.random() < 0.5
        c["decoder_sparse_step"] = r.randint(1, 2)
        if r.random() < 0.3:
            c["mlp_only_layers"] = sorted(r.sample(range(c["num_hidden_layers"]), r.randint(0, 1)))
        if family == "qwen2_moe":
            c["shared_expert_intermediate_size"] = r.randint(4, 48)
            c["qkv_bias"] = r.random() < 0.6
    return c


def gpt2_config(r, T):
    nh = r.choice([1, 2, 4, 8])
    hd = r.choice([d for d in (2, 4, 6, 8) if nh * d <= 64])
    c = dict(vocab_size=r.randint(16, 128), n_embd=nh * hd, n_head=nh, n_layer=r.randint(1, 3),
             n_positions=r.randint(T, 40), layer_norm_epsilon=r.choice([1e-5, 1e-3, 0.1]),
             tie_word_embeddings=r.random() < 0.6, bos_token_id=None, eos_token_id=None, pad_token_id=None,
             scale_attn_weights=r.random() < 0.7, scale_attn_by_inverse_layer_idx=r.random() < 0.3,
             reorder_and_upcast_attn=r.random() < 0.3)
    if r.random() < 0.5:
        c["n_inner"] = r.randint(8, 96)
    if r.random() < 0.15:
        c["activation_function"] = r.choice(["gelu_new", "gelu", "relu", "gelu_pytorch_tanh"])
    return c


def bert_config(family, r, T):
    nh = r.choice([1, 2, 4, 8])
    hd = r.choice([d for d in (2, 4, 6, 8) if nh * d <= 64])
    pad = r.randint(0, 3)
    c = dict(vocab_size=r.randint(16, 128), hidden_size=nh * hd, num_attention_heads=nh,
             num_hidden_layers=r.randint(1, 3), intermediate_size=r.randint(8, 96),
             max_position_embeddings=T + pad + 2 + r.randint(0, 16), type_vocab_size=r.randint(1, 3),
             layer_norm_eps=r.choice([1e-12, 1e-5, 1e-3, 0.1]), pad_token_id=pad,
             hidden_act=r.choice(["gelu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"]))
    if r.random() < 0.15:
        c["tie_word_embeddings"] = r.random() < 0.5
    if family == "bert" and r.random() < 0.1:
        c["pad_token_id"] = None
    if family != "bert" and r.random() < 0.2:  # RoBERTa's positions end exactly at the last one
        c["max_position_embeddings"] = T + pad + 1
    return c


def draw_config(family, r, T):
    if family == "gpt2":
        return gpt2_config(r, T)
    if family in ENCODERS:
        return bert_config(family, r, T)
    return decoder_config(family, r, T)


def legacy_layout(d, family, r):
    """Rewrites d/config.json as transformers 4.x wrote it, the layout of most checkpoints on the Hub:
    rope_theta (GPT-NeoX: rotary_emb_base) and partial_rotary_factor (rotary_pct) at the top level,
    rope_scaling (null for the plain RoPE; its type under "type" or "rope_type"), torch_dtype; Gemma 3's
    rope_local_base_freq."""
    path = os.path.join(d, "config.json")
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters", None)
    if rp:
        if family == "gemma3_text":
            c["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
            rp = dict(rp["full_attention"])
        else:
            rp = dict(rp)
        theta, prf = rp.pop("rope_theta", None), rp.pop("partial_rotary_factor", None)
        c["rotary_emb_base" if family == "gpt_neox" else "rope_theta"] = theta
        if prf is not None:
            c["rotary_pct" if family == "gpt_neox" else "partial_rotary_factor"] = prf
        kind = rp.pop("rope_type", "default")
        c["rope_scaling"] = None if kind == "default" else {("type" if r.random() < 0.3 else "rope_type"): kind, **rp}
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    # the experts' count under the other name transformers' attribute maps read
    alias = {"mixtral": ("num_local_experts", "num_experts"), "qwen3_moe": ("num_experts", "num_local_experts")}
    if family in alias and r.random() < 0.5:
        c[alias[family][1]] = c.pop(alias[family][0])
    c["transformers_version"] = "4.46.0"
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


# ------------------------------------------------------------ transformers

def randomize(model, family):
    """Large random weights (std 0.15; norms 1 + 0.1 N(0, 1); Gemma's, which scale by 1 + weight, 0.1 N(0, 1))
    as tools/gen_hf_arch_fixtures.py draws them: logits of a few units."""
    import torch
    norm_base = 0.0 if family.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            low = name.lower()
            if ("norm" in low or ".ln_" in low) and name.endswith("weight"):
                p.copy_(norm_base + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))


def make_case(family, seed, d, dtype="float32"):
    """Draws configs (seeded) until transformers builds one; saves it in d with case.safetensors (ids,
    token_type_ids, logits). Returns the config dict."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.utils import logging
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    r = random.Random(seed)
    auto = AutoModelForMaskedLM if family in ENCODERS else AutoModelForCausalLM
    last = "non-finite logits"
    for _ in range(50):
        T = r.randint(8, 24)
        extra = draw_config(family, r, T)
        try:
            cfg = AutoConfig.for_model(family, **extra)
            cfg._attn_implementation = "eager"
            torch.manual_seed(seed)
            model = auto.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
            randomize(model, family)
            shutil.rmtree(d, ignore_errors=True)
            model.to(getattr(torch, dtype)).save_pretrained(d, safe_serialization=True)
            if r.random() < 0.5:
                legacy_layout(d, family, r)
            model = auto.from_pretrained(d, dtype=getattr(torch, dtype), attn_implementation="eager").eval()
            g = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, model.config.vocab_size, (2, T), generator=g)
            out = {"ids": ids}
            kw = {}
            if family in ENCODERS:
                tt = torch.randint(0, model.config.type_vocab_size, (2, T), generator=g)
                out["token_type_ids"] = kw["token_type_ids"] = tt
            with torch.no_grad():
                # the same ids in two forwards, the second through the KV cache; first, as dynamic RoPE keeps
                # the frequencies of the longest input seen
                if family not in ENCODERS:
                    k = r.randint(1, T - 1)
                    first = model(input_ids=ids[:, :k], use_cache=True)
                    second = model(input_ids=ids[:, k:], past_key_values=first.past_key_values, use_cache=True)
                    out["ids_a"], out["ids_b"] = ids[:, :k], ids[:, k:]
                    out["cached_logits"] = torch.cat([first.logits, second.logits], 1).float()
                logits = model(input_ids=ids, **kw).logits.float()
                if "cached_logits" in out:
                    logits = torch.cat([logits, out["cached_logits"]])
            if not torch.isfinite(logits).all():
                continue
            out["logits"] = logits[:2]
            if dtype != "float32":  # transformers' own rounding: its logits against the checkpoint run in f32
                f32 = auto.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
                with torch.no_grad():
                    out["noise"] = (f32(input_ids=ids, **kw).logits - out["logits"]).abs().max().reshape(1)
            save_file({k: t.contiguous() for k, t in out.items()}, os.path.join(d, "case.safetensors"))
            return extra
        except Exception as e:  # a config transformers refuses: draw another
            last = e
            continue
    raise RuntimeError(f"{family} seed {seed}: no config transformers accepts in 50 draws ({last})")


# ------------------------------------------------------------ accel (worker)

class Accel:
    """The few libaccel calls the sweep makes (ctypes)."""

    def __init__(self, path):
        L = ctypes.CDLL(path)
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int

        class Device(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("index", ctypes.c_int)]
        self.cpu = Device(0, 0)
        sig = {
            "accel_last_error": (cp, []),
            "accel_clear_error": (None, []),
            "accel_step_reset": (None, []),
            "accel_set_grad_enabled": (ctypes.c_bool, [ctypes.c_bool]),
            "accel_safetensors_open": (vp, [cp]),
            "accel_safetensors_close": (None, [vp]),
            "accel_safetensors_tensor": (vp, [vp, cp, i]),
            "accel_safetensors_save": (i, [cp, i, ctypes.POINTER(cp), ctypes.POINTER(vp), i, vp]),
            "accel_tensor_free": (None, [vp]),
            "accel_module_free": (None, [vp]),
            "accel_dispatched_free": (None, [vp]),
            "accel_llama_from_pretrained": (vp, [cp, vp, cp, vp, vp, ctypes.POINTER(vp)]),
            "accel_llama_forward": (vp, [vp, vp, vp]),
            "accel_llama_kv_cache_new": (vp, [vp, ctypes.c_int64, ctypes.c_int64, Device]),
            "accel_kv_cache_free": (None, [vp]),
            "accel_bert_from_pretrained_head": (vp, [cp, i, ctypes.c_int64, Device]),
            "accel_bert_mlm_logits": (vp, [vp, vp, vp, vp]),
        }
        for name, (res, args) in sig.items():
            f = getattr(L, name)
            f.restype, f.argtypes = res, args
        self.L = L
        L.accel_set_grad_enabled(False)

    def error(self):
        return (self.L.accel_last_error() or b"").decode("utf-8", "replace")

    def run(self, d, encoder):
        """accel's logits of case d into d/accel.safetensors: None, or accel's error message."""
        L = self.L
        st = L.accel_safetensors_open(os.path.join(d, "case.safetensors").encode())
        if not st:
            return "case.safetensors: " + self.error()
        ids = L.accel_safetensors_tensor(st, b"ids", -1)
        tt = L.accel_safetensors_tensor(st, b"token_type_ids", -1) if encoder else None
        disp = ctypes.c_void_p()
        if encoder:
            m = L.accel_bert_from_pretrained_head(d.encode(), BERT_MASKED_LM, 0, self.cpu)
        else:
            m = L.accel_llama_from_pretrained(d.encode(), None, None, None, None, ctypes.byref(disp))
        err, kc, parts = None, None, []
        if not m:
            err = self.error()
        else:
            y = L.accel_bert_mlm_logits(m, ids, tt, None) if encoder else L.accel_llama_forward(m, ids, None)
            err = None if y else self.error()
            outs = [(b"logits", y)]
            if y and not encoder:  # the two forwards through a KV cache
                parts = [L.accel_safetensors_tensor(st, name, -1) for name in (b"ids_a", b"ids_b")]
                kc = L.accel_llama_kv_cache_new(m, 2, 64, self.cpu)
                ya = kc and L.accel_llama_forward(m, parts[0], kc)
                yb = ya and L.accel_llama_forward(m, parts[1], kc)
                err = None if yb else "with a KV cache: " + self.error()
                outs += [(b"cached_a", ya), (b"cached_b", yb)]
            if not err:
                names = (ctypes.c_char_p * len(outs))(*[n for n, _ in outs])
                ts = (ctypes.c_void_p * len(outs))(*[t for _, t in outs])
                if L.accel_safetensors_save(os.path.join(d, "accel.safetensors").encode(), len(outs), names, ts, 0,
                                            None):
                    err = "saving accel's logits: " + self.error()
        L.accel_step_reset()
        if kc:
            L.accel_kv_cache_free(kc)
        if m:
            L.accel_module_free(m)
        if disp:
            L.accel_dispatched_free(disp)
        for t in [ids, tt] + parts:
            if t:
                L.accel_tensor_free(t)
        L.accel_safetensors_close(st)
        L.accel_clear_error()
        return err


def serve(run_case):
    """The workers' protocol (this sweep's and those reusing its case loop): reads 'DIR FAMILY'
    lines on stdin; answers 'done' or 'refused <message>' per line, run_case(dir, family)
    giving the message or None."""
    for line in sys.stdin:
        d, family = line.split()
        err = run_case(d, family)
        print("refused " + json.dumps(err) if err else "done", flush=True)


def worker(lib):
    acc = Accel(lib)
    serve(lambda d, family: acc.run(d, family in ENCODERS))


def run_accel(cases, lib, timeout, preload, script=__file__):
    """accel on every case (a list of (dir, family)); {dir: ("ok"|"refused"|"CRASH"|"HANG", detail)}.
    preload: LD_PRELOAD of the workers (a sanitizer's runtime), or None; script: the sweep whose --worker
    runs them (this one's, or another's of the same protocol)."""
    out = {}
    todo = list(cases)
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = preload
        env.setdefault("ASAN_OPTIONS", "detect_leaks=0:intercept_tls_get_addr=0")
        env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
    while todo:
        p = subprocess.Popen([sys.executable, os.path.abspath(script), "--worker", "--lib", lib],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
        while todo:
            d, family = todo[0]
            try:
                p.stdin.write(f"{d} {family}\n")
                p.stdin.flush()
            except BrokenPipeError:
                pass
            ready, _, _ = select.select([p.stdout], [], [], timeout)
            line = p.stdout.readline() if ready else None
            if line is None:
                p.kill()
                out[d] = ("HANG", f"no answer in {timeout} s")
                todo.pop(0)
                break
            if not line:
                p.wait()
                tail = p.stderr.read()[-2000:]
                out[d] = ("CRASH", f"worker exit {p.returncode}: {tail.strip()}")
                todo.pop(0)
                break
            todo.pop(0)
            if line.startswith("refused "):
                out[d] = ("refused", json.loads(line[8:]))
            else:
                out[d] = ("ok", "")
        else:
            p.stdin.close()
            p.wait()
        for f in (p.stdin, p.stdout, p.stderr):
            try:
                f.close()
            except Exception:
                pass
    return out


# ------------------------------------------------------------ compare, report

def compare(d, tol):
    """(within tol, what differs): the logits of the whole input, and (decoders) of its two parts through
    the KV cache."""
    import torch
    from safetensors.torch import load_file
    want = load_file(os.path.join(d, "case.safetensors"))
    got = load_file(os.path.join(d, "accel.safetensors"))
    pairs = [("logits", got["logits"], want["logits"])]
    if "cached_logits" in want:
        pairs.append(("with a KV cache", torch.cat([got["cached_a"], got["cached_b"]], 1), want["cached_logits"]))
    # a checkpoint in bf16: also within twice transformers' own distance from its f32 run, or 4 units in the
    # last place of bf16 logits of that scale (both round the logits to bf16)
    noise = 2 * float(want["noise"][0]) if "noise" in want else 0.0
    notes = [f"twice transformers' bf16 - f32 {noise:.3g}"] if "noise" in want else []
    good = True
    for what, g, w in pairs:
        g = g.float()
        if g.shape != w.shape:
            return False, f"{what}: shape {tuple(g.shape)}, transformers {tuple(w.shape)}"
        if not torch.isfinite(g).all():
            return False, f"{what}: non-finite logits"
        scale = max(1.0, float(w.abs().max()))
        err = float((g - w).abs().max())
        ulps = 4 * 2.0 ** (math.floor(math.log2(scale)) - 7) if "noise" in want else 0.0
        good = good and err <= max(tol * scale, noise, ulps)
        notes.append(f"{what}: max |diff| {err:.3g} (logit scale {scale:.3g})")
    return good, "; ".join(notes)


def short(msg):
    """A refusal's message without the case's path."""
    return re.sub(r"\S*/case_\d+/", "", msg)


def sweep_args(doc, n, families, timeout=120.0):
    """The arguments both sweeps take (this one's and sweep_batch_generate.py's); the caller adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=n, help="cases (families taken in turn)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--families", default=",".join(families))
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "lib", "libaccel.so"))
    ap.add_argument("--work", default=None, help="cases' folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the cases' folders")
    ap.add_argument("--timeout", type=float, default=timeout)
    ap.add_argument("--preload", default=None,
                    help="LD_PRELOAD of the accel workers: a sanitizer's runtime for a --lib built with "
                         "-DACCEL_SANITIZE=ON, e.g. \"$(gcc -print-file-name=libasan.so) "
                         "$(gcc -print-file-name=libubsan.so)\"")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap


def run_sweep(a, known, prefix, make, judge, show=lambda made: [made], script=__file__):
    """Makes a.n cases (make(family, seed, dir) -> what judge needs: transformers' side), runs accel on them
    (script's --worker), judges each that ran (judge(dir, made) -> (verdict, detail)), prints the report
    (show(made): what to print of a bad case); exits 1 when any case is MISMATCH, CRASH or HANG."""
    families = a.families.split(",")
    unknown = [f for f in families if f not in known]
    if unknown:
        sys.exit(f"unknown families {unknown}; known: {known}")
    if not os.path.exists(a.lib):
        sys.exit(f"{a.lib}: no such library (build accel first, or --lib)")
    work = a.work or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(work, exist_ok=True)
    t0 = time.time()
    cases, made = [], {}
    for i in range(a.n):
        family = families[i % len(families)]
        d = os.path.join(work, f"case_{i}")
        made[d] = (i, make(family, a.seed * 1000003 + i, d))
        cases.append((d, family))
    t1 = time.time()
    results = run_accel(cases, a.lib, a.timeout, a.preload, script=script)
    t2 = time.time()
    tally = collections.Counter()
    per_family = collections.defaultdict(collections.Counter)
    refusals = collections.Counter()
    bad = []
    for d, family in cases:
        i, m = made[d]
        verdict, detail = results[d]
        if verdict == "ok":
            verdict, detail = judge(d, m)
        if verdict == "refused":
            refusals[(family, short(detail))] += 1
        tally[verdict] += 1
        per_family[family][verdict] += 1
        if verdict not in ("match", "refused"):
            bad.append((verdict, i, family, detail, show(m)))
    print(f"{a.n} cases, seed {a.seed}: {dict(tally)}  (transformers {t1 - t0:.0f} s, accel {t2 - t1:.0f} s)")
    for family in families[:a.n]:
        print(f"  {family:12s} {dict(per_family[family])}")
    if refusals:
        print("refusals (family, message, cases):")
        for (family, msg), n in sorted(refusals.items()):
            print(f"  {family}: {msg} [{n}]")
    for verdict, i, family, detail, shown in bad:
        print(f"{verdict} case {i} ({family}): {detail}\n  " + "\n  ".join(json.dumps(x) for x in shown))
    if a.keep or a.work:
        print(f"cases in {work}/case_<i>")
    else:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if any(v in ("MISMATCH", "CRASH", "HANG") for v, *_ in bad) else 0)


def main():
    ap = sweep_args(__doc__, 360, FAMILIES)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the checkpoints' dtype, which both run in (bfloat16: a case matches within --tol, "
                         "twice transformers' own distance from the f32 run, or 4 bf16 units in the last place of "
                         "the logit scale; transformers' MoE families fail on CPU in bf16)")
    a = ap.parse_args()
    if a.worker:
        worker(a.lib)
        return

    def judge(d, _):
        good, detail = compare(d, a.tol)
        return ("match" if good else "MISMATCH"), detail

    run_sweep(a, FAMILIES, "accel_sweep_", lambda family, seed, d: make_case(family, seed, d, a.dtype), judge)


if __name__ == "__main__":
    main()
