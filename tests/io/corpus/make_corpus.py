#!/usr/bin/env python3
"""Writes the safetensors corpus used by tests/io and as fuzzing seeds.

Each malformed file is listed in expected.tsv with a substring that tightfit's error message
must contain; valid_*.safetensors files must parse. Uses only the standard library, so the
files are an independent construction of the format. Run from anywhere:
    python3 tests/io/corpus/make_corpus.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def image(header, data=b"", pad=True, length=None):
    text = header if isinstance(header, (bytes, bytearray)) else json.dumps(header).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


f32x4 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
valid = {
    "valid_f32.safetensors": image({"w": t("F32", [2, 2], 0, 16)}, f32x4),
    "valid_mixed.safetensors": image(
        {"__metadata__": {"format": "pt"},
         "ids": t("I64", [1, 3], 0, 24),
         "h": t("F16", [2], 24, 28),
         "b": t("BF16", [2], 28, 32),
         "m": t("BOOL", [3], 32, 35)},
        struct.pack("<3q", 5, -100, 7) + struct.pack("<2H", 0x3C00, 0x8001)
        + struct.pack("<2H", 0x3F80, 0x7F80) + bytes([1, 0, 1])),
    "valid_empty.safetensors": image({}),
    "valid_scalar_and_zero.safetensors": image(
        {"s": t("F64", [], 0, 8), "z": t("F32", [0, 5], 8, 8)}, struct.pack("<d", 2.5)),
}

malformed = [
    # (file, bytes, substring of the expected message)
    ("truncated_length.safetensors", b"\x10\x00\x00", "truncated"),
    ("empty_file.safetensors", b"", "truncated"),
    ("header_past_end.safetensors", image({"w": t("F32", [1], 0, 4)}, b"", length=4096),
     "runs past the end of the file"),
    ("header_huge.safetensors", struct.pack("<Q", 2**63 + 5) + b"{}      ", "larger than the limit"),
    ("not_json.safetensors", image(b"{this is not json}"), "not valid JSON"),
    ("truncated_json.safetensors", image(b'{"w": {"dtype": "F32", "sha'), "not valid JSON"),
    ("json_array.safetensors", image(b"[1, 2, 3]"), "expected an object"),
    ("entry_not_object.safetensors", image({"w": 5}), "entry is a JSON number"),
    ("negative_shape.safetensors", image({"w": t("F32", [2, -2], 0, 16)}, f32x4),
     "shape[1] is negative"),
    ("float_shape.safetensors", image({"w": t("F32", [2.5], 0, 16)}, f32x4),
     "expected a non-negative integer"),
    ("overflow_shape.safetensors",
     image({"w": t("F32", [2**32, 2**32, 2], 0, 16)}, f32x4), "overflows the element count"),
    ("overflow_bytes.safetensors", image({"w": t("F64", [2**62], 0, 16)}, f32x4),
     "overflows the byte count"),
    ("shape_beyond_u64.safetensors", image(b'{"w": {"dtype": "F32", "shape": [18446744073709551616], '
                                            b'"data_offsets": [0, 16]}}', f32x4),
     "expected a non-negative integer"),
    ("offsets_past_end.safetensors", image({"w": t("F32", [2, 2], 8, 24)}, f32x4),
     "run past the end of the data area"),
    ("offsets_reversed.safetensors", image({"w": t("F32", [0], 16, 8)}, f32x4), "begin > end"),
    ("offsets_negative.safetensors", image({"w": t("F32", [1], -4, 0)}, f32x4),
     "data_offsets[0] is negative"),
    ("offsets_not_pair.safetensors", image({"w": {"dtype": "F32", "shape": [1],
                                                  "data_offsets": [0, 4, 8]}}, f32x4),
     "expected [begin, end]"),
    ("overlap.safetensors", image({"a": t("F32", [3], 0, 12), "b": t("F32", [2], 8, 16)}, f32x4),
     "overlap"),
    ("size_mismatch.safetensors", image({"w": t("F32", [3], 0, 16)}, f32x4), "expected 12"),
    ("unknown_dtype.safetensors", image({"w": t("F128", [1], 0, 16)}, f32x4), "unknown dtype"),
    ("dtype_not_string.safetensors", image({"w": t(4, [1], 0, 4)}, f32x4), "dtype is 4"),
    ("duplicate_name.safetensors",
     image(b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
           b'"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', f32x4),
     "duplicate tensor name 'w'"),
    ("duplicate_key.safetensors",
     image(b'{"w": {"dtype": "F32", "dtype": "F64", "shape": [2], "data_offsets": [0, 8]}}', f32x4),
     "duplicate key 'dtype'"),
    ("missing_dtype.safetensors", image({"w": {"shape": [1], "data_offsets": [0, 4]}}, f32x4),
     "missing dtype"),
    ("missing_shape.safetensors", image({"w": {"dtype": "F32", "data_offsets": [0, 4]}}, f32x4),
     "missing shape"),
    ("missing_offsets.safetensors", image({"w": {"dtype": "F32", "shape": [1]}}, f32x4),
     "missing data_offsets"),
    ("metadata_not_strings.safetensors", image({"__metadata__": {"k": 1}}), "expected a string"),
    ("deep_nesting.safetensors", image(b'{"w": {"dtype": "F32", "shape": [[[1]]]}}'),
     "nests arrays too deeply"),
    ("bad_utf8.safetensors", image(b'{"w\xff": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
                                   f32x4), "not valid JSON"),
    ("header_too_short.safetensors", struct.pack("<Q", 1) + b"{", "expected at least 2"),
]


def main():
    names = []
    for name, data in valid.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
    with open(os.path.join(HERE, "expected.tsv"), "w") as out:
        out.write("# file\tsubstring of the tightfit::error message (generated by make_corpus.py)\n")
        for name, data, message in malformed:
            with open(os.path.join(HERE, name), "wb") as f:
                f.write(data)
            out.write(f"{name}\t{message}\n")
            names.append(name)
    print(f"wrote {len(valid)} valid and {len(names)} malformed files to {HERE}")


if __name__ == "__main__":
    main()
