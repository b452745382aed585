"""Exact gradients of a Hugging Face checkpoint: python3 gradients.py MODEL_DIR"""
import sys

import numpy as np

import tightfit

model = tightfit.Model.from_pretrained(sys.argv[1], dtype="float32")  # config.json + safetensors
rng = np.random.default_rng(0)
ids = rng.integers(0, model.config["vocab_size"], (2, 48))  # or torch CPU tensors (no copy)
labels = ids.copy()
labels[:, :8] = -100  # a prompt: not supervised
mask = np.ones_like(ids)
mask[1, 40:] = 0  # right padding
loss, grads = model.gradients(ids, labels, attention_mask=mask, schedule="stream", chunk=16)
print(f"sft loss {loss:.4f}, {len(grads)} gradients, e.g.",
      grads["model.layers.0.mlp.up_proj.weight"].shape)  # {Hugging Face name: array}
ref = model.logprobs(ids, labels, attention_mask=mask)  # (2, 48): log-prob of labels[t]
loss, grads = model.gradients(ids, labels, attention_mask=mask, objective="grpo",
                              advantages=np.array([1.0, -0.5]), old_logprobs=ref,
                              ref_logprobs=ref, beta=0.04, loss_type="dapo")
print(f"grpo loss {loss:.4f}")
plan = tightfit.plan(model, seq=32768, budget="8G")  # the memory planner
print("chunk for T = 32768 in 8 GiB of activations:", plan["chunk"])
