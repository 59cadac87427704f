"""Writes tests/data/st_verdicts/: small valid and corrupt safetensors files and
verdicts.json, the reference Python `safetensors` library's verdict on each
(accepted, or the error it raised). tests/test_safetensors.c checks that accel
accepts and rejects exactly the same files, and tests/io.cmake replays them
through the fuzz target. Run from the repository root:
    python3 tools/gen_safetensors_verdicts.py
"""
import json
import os
import struct

import safetensors
import torch
from safetensors import safe_open
from safetensors.torch import save

OUT = "tests/data/st_verdicts"


def header(obj, pad=0):
    return json.dumps(obj, separators=(",", ":")).encode() + b" " * pad


def raw(hdr, data_len, hlen=None):
    """8-byte length (default: len(hdr)), header bytes, data_len bytes of 0x11."""
    n = len(hdr) if hlen is None else hlen
    return struct.pack("<Q", n) + hdr + b"\x11" * data_len


def info(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def python_file():
    """A file as the reference writer makes it, with at least one byte of header padding."""
    for n in range(1, 16):
        blob = save({"w": torch.arange(n, dtype=torch.float32), "b": torch.ones(3, dtype=torch.float16)})
        hlen = struct.unpack("<Q", blob[:8])[0]
        if blob[8 + hlen - 1 : 8 + hlen] == b" ":
            return blob, hlen
    raise SystemExit("no padded header found")


def cases():
    blob, hlen = python_file()
    one = header({"a": info("F32", [2], 0, 8)})
    c = {
        # accepted
        "ok_python_writer": blob,
        "ok_one_tensor": raw(one, 8),
        "ok_header_order_differs": raw(header({"b": info("U8", [4], 8, 12), "a": info("F32", [2], 0, 8)}), 12),
        "ok_empty_header": raw(b"{}      ", 0),
        "ok_empty_tensor_first": raw(header({"e": info("F32", [0], 0, 0), "a": info("F32", [2], 0, 8)}), 8),
        "ok_empty_tensor_last": raw(header({"a": info("F32", [2], 0, 8), "e": info("I64", [0, 3], 8, 8)}), 8),
        "ok_scalar": raw(header({"s": info("F64", [], 0, 8)}), 8),
        "ok_unpadded_misaligned": raw(header({"a": info("U8", [1], 0, 1), "b": info("F32", [1], 1, 5)}), 5),
        "ok_leading_space": raw(b" " + one, 8),
        "ok_metadata": raw(header({"__metadata__": {"format": "pt", "k": "v"}, "a": info("F32", [2], 0, 8)}), 8),
        "ok_metadata_null": raw(header({"__metadata__": None, "a": info("F32", [2], 0, 8)}), 8),
        "ok_extra_key": raw(header({"a": dict(info("F32", [2], 0, 8), extra=1)}), 8),
        # the data section is not exactly covered
        "bad_header_len_one_short": struct.pack("<Q", hlen - 1) + blob[8:],
        "bad_header_len_one_long": struct.pack("<Q", hlen + 1) + blob[8:],
        "bad_trailing_byte": raw(one, 9),
        "bad_truncated_data": raw(one, 7),
        "bad_gap_at_start": raw(header({"a": info("F32", [2], 4, 12)}), 12),
        "bad_gap_between": raw(header({"a": info("F32", [2], 0, 8), "b": info("U8", [2], 10, 12)}), 12),
        "bad_overlap": raw(header({"a": info("F32", [2], 0, 8), "b": info("F32", [2], 4, 12)}), 12),
        "bad_same_range": raw(header({"a": info("F32", [2], 0, 8), "b": info("F32", [2], 0, 8)}), 8),
        "bad_empty_tensor_inside": raw(header({"a": info("F32", [2], 0, 8), "e": info("F32", [0], 4, 4)}), 8),
        "bad_empty_tensor_past_end": raw(header({"a": info("F32", [2], 0, 8), "e": info("F32", [0], 9, 9)}), 8),
        "bad_empty_header_with_data": raw(b"{}      ", 4),
        "bad_offsets_past_end": raw(header({"a": info("U8", [4], 100, 104)}), 8),
        "bad_end_before_begin": raw(header({"a": info("U8", [0], 4, 0)}), 4),
        # tensor entries
        "bad_nbytes_mismatch": raw(header({"a": info("F32", [2, 3], 0, 12)}), 12),
        "bad_shape_overflow": raw(header({"a": info("F64", [4294967296, 4294967296], 0, 8)}), 8),
        "bad_negative_shape": raw(header({"a": info("U8", [-1], 0, 1)}), 1),
        "bad_float_shape": raw(header({"a": info("F32", [2.0], 0, 8)}), 8),
        "bad_float_offset": raw(header({"a": info("F32", [2], 0, 8.0)}), 8),
        "bad_three_offsets": raw(header({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 1]}}), 1),
        "bad_missing_dtype": raw(header({"a": {"shape": [1], "data_offsets": [0, 1]}}), 1),
        "bad_unknown_dtype": raw(header({"a": info("Q4", [1], 0, 1)}), 1),
        "bad_entry_not_object": raw(header({"a": [1, 2]}), 0),
        "bad_metadata_not_string": raw(header({"__metadata__": {"n": 1}}), 0),
        "bad_duplicate_name": raw(b'{"a":' + header(info("U8", [1], 0, 1)) + b',"a":'
                                  + header(info("U8", [1], 1, 2)) + b"}", 2),
        # the header itself
        "bad_file_too_short": b"\x05\x00\x00",
        "bad_header_len_zero": struct.pack("<Q", 0),
        "bad_header_len_past_eof": raw(b"{}", 0, hlen=65535),
        "bad_header_len_huge": raw(b"{}", 0, hlen=1 << 62),
        "bad_header_not_object": raw(b"[1,2]   ", 0),
        "bad_header_invalid_json": raw(b'{"a":{"dtype":"F32",', 0),
        "bad_header_nul_padding": raw(one + b"\x00\x00\x00", 8),
        "bad_header_bom": raw(b"\xef\xbb\xbf" + one, 8),
        "bad_header_invalid_utf8": raw(b'{"\xff":' + header(info("U8", [1], 0, 1)) + b"}", 1),
    }
    return c


def verdict(path):
    try:
        with safe_open(path, "pt") as f:
            for k in f.keys():
                f.get_tensor(k)
        return "ok"
    except Exception as e:  # the library's message is the verdict
        return f"{type(e).__name__}: {e}"


def main():
    os.makedirs(OUT, exist_ok=True)
    verdicts = {}
    for name, data in cases().items():
        path = os.path.join(OUT, name + ".safetensors")
        with open(path, "wb") as f:
            f.write(data)
        verdicts[name] = verdict(path)
        want_ok = name.startswith("ok_")
        if (verdicts[name] == "ok") != want_ok:
            raise SystemExit(f"{name}: safetensors {safetensors.__version__} says {verdicts[name]}")
    doc = {"safetensors_version": safetensors.__version__, "verdicts": verdicts}
    with open(os.path.join(OUT, "verdicts.json"), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
