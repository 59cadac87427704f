"""Writes tests/data/st_small.safetensors (+ st_small.json with the expected
values) with the reference safetensors/torch implementation, for the C interop
test (tests/test_safetensors.c). Run from the repository root:
    python3 tools/gen_safetensors_fixture.py
"""
import json

import torch
from safetensors.torch import save_file

tensors = {
    "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4 - 0.5,
    "bf16": torch.tensor([1.0, -2.5, 3.140625, 1e-3], dtype=torch.bfloat16),
    "f16": torch.tensor([[0.5, -1.25], [65504.0, 6.1e-05]], dtype=torch.float16),
    "i64": torch.tensor([-3, 0, 1 << 40], dtype=torch.int64),
    "scalar": torch.tensor(7.0, dtype=torch.float32),
    "empty": torch.zeros(0, 4, dtype=torch.float32),
}
save_file(tensors, "tests/data/st_small.safetensors", metadata={"format": "pt", "note": "fixture"})
expected = {
    name: {
        "dtype": str(t.dtype).replace("torch.", ""),
        "shape": list(t.shape),
        "values": [float(v) for v in t.flatten().tolist()],
    }
    for name, t in tensors.items()
}
with open("tests/data/st_small.json", "w") as f:
    json.dump(expected, f, indent=2, sort_keys=True)
    f.write("\n")
