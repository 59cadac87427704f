"""The timed greedy decode of the transformers peers (bench/bigmodel_peer.py
decode, bench/families_peer.py decode): one warm-up generate of 2 new tokens,
then the first token alone (generate(max_new_tokens=1): the prompt's forward
and one token) and the whole generation, greedy with the KV cache, in no_grad.

The first token is timed first_reps times (examples/generate --first-reps
alike): first_token_ms is the median wall time, first_token_cpu_ms the median
of the process's CPU time over it (all threads: time.process_time), which
another process's load cannot add to.

Prints generated_ids, first_token_ms, first_token_cpu_ms and
decode_tokens_per_s (the new tokens after the first over the whole
generation's time less the first token's: the prompt's forward taken out as
examples/generate does).
"""
import statistics
import time


def greedy_decode(model, prompt, new_tokens, first_reps=1):
    import torch
    ids = torch.tensor([[int(t) for t in prompt.split(",")]])
    kw = dict(do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0, eos_token_id=None)
    walls, cpus = [], []
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
        for _ in range(first_reps):
            t0, c0 = time.perf_counter(), time.process_time()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        first = statistics.median(walls)
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        t2 = time.perf_counter()
    n_new = out.shape[1] - ids.shape[1]
    print(f"generated_ids={out[0].tolist()}")
    print(f"first_token_ms={first * 1e3:.2f}")
    print(f"first_token_cpu_ms={statistics.median(cpus) * 1e3:.2f}")
    print(f"decode_tokens_per_s={(n_new - 1) / ((t2 - t1) - first):.1f}")
