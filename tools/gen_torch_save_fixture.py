"""Writes the torch.save fixtures for tests/test_torch_save.c into
tests/data/torch_save/: what Accelerate's save_model(safe_serialization=False)
hands torch.save (a plain dict of a model's state_dict() tensors, tied weights
as distinct tensors over one storage). The C test writes the same dicts with
accel and compares data.pkl byte for byte and the zip layout. Run from the
repository root:
    python3 tools/gen_torch_save_fixture.py
"""
import os

import torch

OUT = "tests/data/torch_save"


def small():
    embed = torch.arange(12, dtype=torch.float32).reshape(4, 3) / 4 - 0.5
    return {
        "embed.weight": embed.detach(),
        "norm.weight": torch.tensor([1.0, -2.5, 3.140625, 1e-3], dtype=torch.bfloat16),
        "proj.weight": torch.tensor([[0.5, -1.25], [65504.0, 6.1e-05]], dtype=torch.float16),
        "step": torch.tensor(7.0, dtype=torch.float32),
        "empty": torch.zeros(0, 4, dtype=torch.float32),
        "lm_head.weight": embed.detach(),  # tied: another tensor, the same storage
    }


def one():
    # a single item: SETITEM instead of MARK ... SETITEMS
    return {"w": torch.tensor([[1.5, -2.0, 3.0]], dtype=torch.bfloat16)}


def many():
    # 1001 entries: memo indices past 255 (LONG_BINPUT) and two SETITEMS batches.
    return {f"p{i}": torch.tensor([float(i)], dtype=torch.float32) for i in range(1001)}


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, sd in [("small", small()), ("empty", {}), ("one", one()), ("many", many())]:
        torch.save(sd, f"{OUT}/{name}.bin")
    print(torch.__version__)
