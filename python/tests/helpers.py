"""Test helpers: a numpy safetensors reader/writer (independent of tightfit's C++ code), a tiny
random Hugging Face checkpoint, and running the tightfit tool."""
import json
import os
import struct
import subprocess

import numpy as np

_CODES = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("int64"): "I64",
          np.dtype("int32"): "I32"}
_DTYPES = {v: k for k, v in _CODES.items()}


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _CODES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        a = np.frombuffer(data[8 + n + begin:8 + n + end], dtype=_DTYPES[info["dtype"]])
        out[name] = a.reshape(info["shape"]).copy()
    return out


LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=53,
             hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=6, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False, hidden_act="silu", max_position_embeddings=64)


def write_model(directory, cfg=LLAMA, seed=3):
    """A random checkpoint of `cfg` (Llama / Qwen layout, F64 weights) in `directory`."""
    g = np.random.default_rng(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    h, hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    qk_norm = cfg["architectures"][0] == "Qwen3ForCausalLM"

    def mat(*shape):
        return g.standard_normal(shape) * 0.3

    def norm(n):
        return 1 + 0.2 * g.standard_normal(n)

    p = {"model.embed_tokens.weight": mat(v, d), "model.norm.weight": norm(d)}
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        p[pre + "input_layernorm.weight"] = norm(d)
        p[pre + "self_attn.q_proj.weight"] = mat(h * hd, d)
        p[pre + "self_attn.k_proj.weight"] = mat(hkv * hd, d)
        p[pre + "self_attn.v_proj.weight"] = mat(hkv * hd, d)
        p[pre + "self_attn.o_proj.weight"] = mat(d, h * hd)
        if qk_norm:
            p[pre + "self_attn.q_norm.weight"] = norm(hd)
            p[pre + "self_attn.k_norm.weight"] = norm(hd)
        p[pre + "post_attention_layernorm.weight"] = norm(d)
        p[pre + "mlp.gate_proj.weight"] = mat(f, d)
        p[pre + "mlp.up_proj.weight"] = mat(f, d)
        p[pre + "mlp.down_proj.weight"] = mat(d, f)
    if not cfg["tie_word_embeddings"]:
        p["lm_head.weight"] = mat(v, d)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as out:
        json.dump(cfg, out)
    save_safetensors(os.path.join(directory, "model.safetensors"), p)
    return p


def tool(*args, check=True):
    """Runs the tightfit tool; returns its completed process (stdout, stderr as text)."""
    run = subprocess.run([os.environ["TIGHTFIT_CLI"], *map(str, args)], capture_output=True,
                         text=True)
    if check and run.returncode not in (0, 3):
        raise AssertionError(f"tightfit {' '.join(map(str, args))}: exit {run.returncode}: "
                             f"{run.stderr}")
    return run


def worst_relative(ours, theirs):
    """max |a - b| / max |b| over every tensor of `theirs` (each must be in `ours`)."""
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    worst = 0.0
    for name, ref in theirs.items():
        assert ours[name].shape == ref.shape, name
        worst = max(worst, np.abs(ours[name] - ref).max() / max(np.abs(ref).max(), 1e-300))
    return worst
