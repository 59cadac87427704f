#!/usr/bin/env python3
"""Writes the torch.save fixtures accel's PyTorch-file reader is tested on
(tests/test_torch_load.c) into tests/data/torch_load/. Run from the
repository root:
    python3 tools/gen_torch_load_fixtures.py

  mixed.bin          torch.save(model-style OrderedDict state dict): every
                     storage type accel reads (f32 f16 bf16 f64 i64 i32 i16 i8
                     u8 bool), a tied pair (two names, one storage), a view at
                     a storage offset, a transpose (not contiguous), an
                     nn.Parameter, a scalar, an empty tensor, and the
                     `_metadata` attribute state_dict() sets (pickled by BUILD)
  mixed.expected.safetensors   the same tensors, each contiguous, by
                     safetensors: what accel must read from mixed.bin
  proto4.bin         a dict saved with pickle_protocol=4 (FRAME, MEMOIZE,
                     SHORT_BINUNICODE, STACK_GLOBAL)
  expand.bin         an expanded tensor (stride 0) larger than its storage
  nested.bin         {"model": state dict, "step": 3}: not a state dict
  strided_big.bin    a Linear(256, 256)'s state dict whose weight is saved
                     transposed (w.t(): strides (1, 256), 256 KiB, gathered
                     into a copy by the reader): w[i][j] = (256 j + i) % 251,
                     bias[i] = i - 128
  llama_bin/         hf_llama_tied's weights as transformers 4.x's
                     save_pretrained(safe_serialization=False) wrote them
                     (transformers 5 writes safetensors only): the state dict
                     split by huggingface_hub.split_torch_state_dict_into_shards
                     (max_shard_size 30KB), each shard torch.save'd,
                     pytorch_model.bin.index.json, and config.json
Python is needed only to regenerate these; the tests read the files.
"""
import collections
import json
import os
import shutil

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import save_file

OUT = "tests/data/torch_load"
LLAMA = "tests/data/hf_llama_tied"


def mixed():
    a = (torch.arange(6, dtype=torch.float32) - 2.5).reshape(2, 3)
    sd = collections.OrderedDict()
    sd["a"] = a
    sd["a_tied"] = a  # tied: the same tensor under two names
    sd["row"] = a[1]  # storage offset 3
    sd["t"] = a.t()  # strides (1, 3)
    sd["half"] = torch.tensor([0.5, -1.25, 65504.0], dtype=torch.float16)
    sd["bf"] = torch.tensor([[1.0, -2.5], [3.140625, 1e-3]], dtype=torch.bfloat16)
    sd["f64"] = torch.tensor([1e300, -0.1], dtype=torch.float64)
    sd["i64"] = torch.tensor([-(2**40), 7, 2**62], dtype=torch.int64)
    sd["i32"] = torch.tensor([-5, 2**31 - 1], dtype=torch.int32)
    sd["i16"] = torch.tensor([-300, 300], dtype=torch.int16)
    sd["i8"] = torch.tensor([-128, 127], dtype=torch.int8)
    sd["u8"] = torch.tensor([0, 255], dtype=torch.uint8)
    sd["mask"] = torch.tensor([True, False, True], dtype=torch.bool)
    sd["param"] = torch.nn.Parameter(torch.tensor([[0.25, 4.0]]))
    sd["step"] = torch.tensor(7.0)
    sd["empty"] = torch.zeros(0, 4)
    sd._metadata = collections.OrderedDict([("", {"version": 1}), ("layer", {"version": 2})])
    return sd


def strided_big():
    w = (torch.arange(256 * 256, dtype=torch.float32) % 251).reshape(256, 256)
    torch.save({"weight": w.t(), "bias": torch.arange(256, dtype=torch.float32) - 128}, f"{OUT}/strided_big.bin")


def main():
    os.makedirs(OUT, exist_ok=True)
    sd = mixed()
    torch.save(sd, f"{OUT}/mixed.bin")
    save_file({k: v.detach().contiguous().clone() for k, v in sd.items()}, f"{OUT}/mixed.expected.safetensors")
    torch.save({"w": torch.tensor([[1.5, -2.0]]), "n": torch.tensor([3], dtype=torch.int64)},
               f"{OUT}/proto4.bin", pickle_protocol=4)
    torch.save({"big": torch.tensor([1.0]).expand(64, 64)}, f"{OUT}/expand.bin")
    torch.save({"model": {"w": torch.ones(1)}, "step": 3}, f"{OUT}/nested.bin")
    strided_big()

    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(LLAMA)
    state = model.state_dict()  # lm_head.weight and embed_tokens.weight: one storage
    out = f"{OUT}/llama_bin"
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    split = split_torch_state_dict_into_shards(state, filename_pattern="pytorch_model{suffix}.bin",
                                               max_shard_size="30KB")
    for fname, names in split.filename_to_tensors.items():
        torch.save({n: state[n] for n in names}, f"{out}/{fname}")
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in
                                            {id(t): t for t in state.values()}.values())},
             "weight_map": split.tensor_to_filename}
    with open(f"{out}/pytorch_model.bin.index.json", "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    shutil.copy(f"{LLAMA}/config.json", f"{out}/config.json")
    print(sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
