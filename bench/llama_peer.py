"""The PyTorch side's Llama, shared by the peers of bench/ (llama_step_peer.py,
zero_peer.py, gpu_step_peer.py, tp_peer.py, pipeline_peer.py): the same command-line config as accel's
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


def load_llama(path, args):
    """LlamaForCausalLM from the transformers checkpoint at path (accel's
    bench programs write one with --save-pretrained), f32, sdpa, in training
    mode; refused unless it has the vocabulary, width and depth of args."""
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    c = model.config
    if (c.vocab_size, c.hidden_size, c.num_hidden_layers) != (args.vocab, args.hidden, args.layers):
        raise SystemExit(f"{path} holds a Llama of vocab {c.vocab_size}, hidden {c.hidden_size}, {c.num_hidden_layers} "
                         f"layers, not the flags' {args.vocab}, {args.hidden}, {args.layers}")
    return model.train()


def adamw(model):
    """The optimizer of accel's bench step: AdamW, lr 1e-4, weight decay 0.01."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)


def rope(model, seq):
    """The rotary (cos, sin), each [1, seq, head_dim], of positions 0..seq-1:
    what LlamaModel.forward hands every decoder layer. The peers that split
    the model (tp_peer.py, pipeline_peer.py) run the layers themselves, as
    torchtitan does, because under sequence parallelism or on a pipeline
    stage the hidden states a layer sees are not the whole sequence."""
    return model.model.rotary_emb(torch.empty(0), torch.arange(seq)[None])


def causal_lm_labels(ids):
    """transformers' ForCausalLMLoss targets for ids [B, T]: ids shifted left,
    the last position ignored (-100), so cross_entropy over the unshifted
    logits [B T, V] is the mean over the B (T - 1) predicted tokens."""
    return torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
