"""Minimal safetensors reader/writer (json + struct), independent of tightfit's C++ code. It
writes numpy arrays or torch tensors; load() gives torch tensors (the cross-checks), load_numpy()
numpy arrays (python/tests, which run without torch)."""
import json
import struct

import numpy as np

_CODES = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("int64"): "I64",
          np.dtype("int32"): "I32"}
_BY_NAME = {code: dtype for dtype, code in _CODES.items()}


def save(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if hasattr(t, "detach"):  # a torch tensor
            t = t.detach().cpu().contiguous().numpy()
        t = np.ascontiguousarray(t)
        raw = t.astype(t.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_numpy(path):
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
        a = np.frombuffer(data[base + begin:base + end], dtype=_BY_NAME[info["dtype"]])
        out[name] = a.reshape(info["shape"]).copy()
    return out


def load(path):
    import torch  # only the cross-checks read torch tensors

    return {name: torch.from_numpy(a) for name, a in load_numpy(path).items()}
