"""Test helpers: safetensors files and a tiny random Hugging Face checkpoint (through the
cross-checks' st.py and hf_params.py, independent of tightfit's C++ code), running the tightfit
tool, comparing gradients."""
import json
import os
import subprocess
import sys

import numpy as np

# the safetensors reader / writer and the Hugging Face parameter layout of the PyTorch
# cross-checks (tests/python), shared
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
import st  # noqa: E402
from hf_params import hf_parameters  # noqa: E402


save_safetensors = st.save  # numpy arrays or torch tensors
load_safetensors = st.load_numpy  # numpy arrays

LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=53,
             hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=6, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False, hidden_act="silu", max_position_embeddings=64)


def write_model(directory, cfg=LLAMA, seed=3):
    """A random checkpoint of `cfg` (Llama / Qwen layout, F64 weights) in `directory`."""
    g = np.random.default_rng(seed)
    p = hf_parameters(cfg, lambda *shape: g.standard_normal(shape) * 0.3,
                      lambda n: 1 + 0.2 * g.standard_normal(n))
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
