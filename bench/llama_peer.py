"""The PyTorch side's Llama, shared by the peers of bench/ (llama_step_peer.py,
zero_peer.py, gpu_step_peer.py): the same command-line config as accel's
bench programs (bench/bench_util.h) and the same seeded HF model, so every
peer measures the model accel's side measures.
"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def add_model_args(ap):
    """The model and batch flags, with the bench config as defaults."""
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=8192)


def build_llama(args):
    """LlamaForCausalLM of the config in args (sdpa attention, no GQA), weights
    from torch.manual_seed(0)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.heads, max_position_embeddings=args.seq,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def adamw(model):
    """The optimizer of accel's bench step: AdamW, lr 1e-4, weight decay 0.01."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
