"""The timed greedy decode of the transformers peers (bench/bigmodel_peer.py
decode, bench/families_peer.py decode): one warm-up generate of 2 new tokens,
then the first token alone (generate(max_new_tokens=1): the prompt's forward
and one token) and the whole generation, greedy with the KV cache, in no_grad.

Prints generated_ids, first_token_ms and decode_tokens_per_s (the new tokens
after the first over the whole generation's time less the first token's: the
prompt's forward taken out as examples/generate does).
"""
import time


def greedy_decode(model, prompt, new_tokens):
    import torch
    ids = torch.tensor([[int(t) for t in prompt.split(",")]])
    kw = dict(do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        t2 = time.perf_counter()
    n_new = out.shape[1] - ids.shape[1]
    print(f"generated_ids={out[0].tolist()}")
    print(f"first_token_ms={(t1 - t0) * 1e3:.1f}")
    print(f"decode_tokens_per_s={(n_new - 1) / ((t2 - t1) - (t1 - t0)):.1f}")
