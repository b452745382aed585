"""Minimal safetensors reader/writer (json + struct), independent of tightfit's C++ code."""
import json
import struct

import torch

_DTYPES = {torch.float64: ("F64", 8), torch.float32: ("F32", 4), torch.int64: ("I64", 8),
           torch.int32: ("I32", 4)}
_BY_NAME = {"F64": torch.float64, "F32": torch.float32, "I64": torch.int64, "I32": torch.int32}


def save(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()
        code, _ = _DTYPES[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = _BY_NAME[info["dtype"]]
        t = torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out
