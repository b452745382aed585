#!/usr/bin/env python3
"""An independent safetensors implementation (standard library only) for cross-checking.

  xcheck_safetensors.py check FILE   validates FILE by the reference implementation's rules
                                     (and the writer's: header padded to 8 bytes, tensors
                                     contiguous in order) and prints {name: {dtype, shape,
                                     values}} as JSON; exit status 1 with a message if invalid.
  xcheck_safetensors.py write FILE   writes a file of every common dtype and prints the values
                                     a reader must decode, as JSON.
"""
import json
import math
import struct
import sys

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4,
         "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
FORMATS = {"BOOL": "?", "U8": "B", "I8": "b", "I16": "h", "U16": "H", "F16": "e", "I32": "i",
           "U32": "I", "F32": "f", "I64": "q", "U64": "Q", "F64": "d"}


def jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)  # "inf", "-inf", "nan"
    return x


def decode(dtype, raw):
    n = len(raw) // SIZES[dtype]
    if dtype == "BF16":
        bits = struct.unpack(f"<{n}H", raw)
        return [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bits]
    return list(struct.unpack(f"<{n}{FORMATS[dtype]}", raw))


def check(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        sys.exit("truncated")
    (n,) = struct.unpack("<Q", data[:8])
    if n % 8 != 0:
        sys.exit(f"header length {n} is not a multiple of 8")
    if 8 + n > len(data):
        sys.exit("header past the end")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    start = 0
    out = {}
    for name, info in entries:
        b, e = info["data_offsets"]
        if b != start or e < b:
            sys.exit(f"{name}: offsets {b},{e} not contiguous (expected begin {start})")
        count = 1
        for d in info["shape"]:
            count *= d
        if count * SIZES[info["dtype"]] != e - b:
            sys.exit(f"{name}: {e - b} bytes for shape {info['shape']}")
        if b % SIZES[info["dtype"]] != 0:
            sys.exit(f"{name}: offset {b} not aligned")
        start = e
        values = decode(info["dtype"], data[8 + n + b:8 + n + e])
        out[name] = {"dtype": info["dtype"], "shape": info["shape"],
                     "values": [jsonable(v) for v in values]}
    if 8 + n + start != len(data):
        sys.exit(f"data area holds {len(data) - 8 - n} bytes, tensors {start}")
    print(json.dumps(out))


def bf16_bits(x):
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round half to even


def write(path):
    floats = [0.1 * i - 0.35 for i in range(7)] + [1e-7, 65504.0, -3.0e38, 1.0 / 3.0]
    tensors = {}
    tensors["f64"] = ("F64", [len(floats)], struct.pack(f"<{len(floats)}d", *floats))
    tensors["f32"] = ("F32", [len(floats)], struct.pack(f"<{len(floats)}f", *floats))
    halves = floats[:9] + [6.0e-8, -0.0]
    tensors["f16"] = ("F16", [len(halves)], struct.pack(f"<{len(halves)}e", *halves))
    bits = [bf16_bits(struct.unpack("<f", struct.pack("<f", x))[0]) for x in floats]
    tensors["bf16"] = ("BF16", [len(bits)], struct.pack(f"<{len(bits)}H", *bits))
    ids = [1, -100, 2**40, -(2**40), 0, 31999]
    tensors["ids.i64"] = ("I64", [2, 3], struct.pack("<6q", *ids))
    tensors["ids.i32"] = ("I32", [3, 2], struct.pack("<6i", 1, -100, 7, 8, 9, 10))
    tensors["mask"] = ("BOOL", [4], bytes([1, 0, 0, 1]))
    header, blob = {"__metadata__": {"format": "pt"}}, b""
    for name, (dtype, shape, raw) in tensors.items():
        blob += b"\0" * ((-len(blob)) % SIZES[dtype])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)
    expected = {name: {"dtype": d, "shape": s, "values": [jsonable(v) for v in decode(d, raw)]}
                for name, (d, s, raw) in tensors.items()}
    print(json.dumps(expected))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write"):
        sys.exit(__doc__)
    (check if sys.argv[1] == "check" else write)(sys.argv[2])
