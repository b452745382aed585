#!/usr/bin/python3
"""Cross-check of `tightfit train --optimizer lora` against PyTorch (plain autograd, no PEFT).

A Llama with attention and MLP biases (and a Qwen3 with q/k-norm and tied embeddings) in plain
PyTorch (cross_check.Model, float64) is saved; `tightfit train --optimizer lora --dtype f64`
writes its initial adapter (--steps 0: A as PEFT initialises it, B = 0), then trains 3 AdamW steps
under each schedule. The reference takes the same A and B, computes every targeted weight as
W0 + (alpha / r) B A (rsLoRA: alpha / sqrt(r)) inside the torch model, and runs
torch.optim.AdamW (weight decay 0.01, given to tightfit, no clipping) on A and B with autograd
gradients.
The trained adapters must agree to 1e-9 (relative, per tensor), and the PEFT names and shapes
of adapter_model.safetensors must be the ones the torch side builds from the module names.

usage: cross_check_lora.py PATH_TO_TIGHTFIT [WORKDIR]
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

import st
from cross_check import Model, make_batch, token_logprobs

torch.set_default_dtype(torch.float64)
TOL = 1e-9
MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
           "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")


def torch_lora_steps(cfg, seed, init, targets, rank, alpha, rslora, ids, labels, steps, lr):
    """Adapters after `steps` AdamW steps of plain autograd on the merged weights."""
    model = Model(cfg, seed)
    for p in model.params.values():
        p.requires_grad_(False)
    base = {k: v.detach().clone() for k, v in model.params.items()}
    s = alpha / math.sqrt(rank) if rslora else alpha / rank
    adapters = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    opt = torch.optim.AdamW(list(adapters.values()), lr=lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    lengths = torch.full((ids.shape[0],), ids.shape[1])
    for _ in range(steps):
        opt.zero_grad()
        for l in range(cfg["num_hidden_layers"]):
            for m in targets:
                stem = f"model.layers.{l}.{MODULES[m]}.{m}"
                A = adapters[f"base_model.model.{stem}.lora_A.weight"]
                B = adapters[f"base_model.model.{stem}.lora_B.weight"]
                model.params[stem + ".weight"] = base[stem + ".weight"] + s * (B @ A)
        lp, mask = token_logprobs(model, ids, labels, lengths, 1.0)
        loss = -(lp * mask).sum() / mask.sum()
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in adapters.items()}


def main():
    tool = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="tightfit-xlora-")
    os.makedirs(work, exist_ok=True)
    cases = {
        "llama-bias": (dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=41,
                            hidden_size=16, intermediate_size=28, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                            attention_bias=True, mlp_bias=True, hidden_act="silu",
                            max_position_embeddings=64),
                       "all-linear", 3, 6.0, False),
        "qwen3": (dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=61,
                       hidden_size=20, intermediate_size=36, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                       hidden_act="silu", max_position_embeddings=64),
                  "q_proj,v_proj,down_proj", 2, 4.0, True),
    }
    worst = 0.0
    for name, (cfg, targets, rank, alpha, rslora) in cases.items():
        model_dir = os.path.join(work, name)
        os.makedirs(model_dir, exist_ok=True)
        seed = len(name)
        model = Model(cfg, seed)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        st.save(os.path.join(model_dir, "model.safetensors"),
                {k: v.detach() for k, v in model.params.items()})
        g = torch.Generator().manual_seed(3)
        ids, labels, _ = make_batch(g, 2, 10, cfg["vocab_size"], [10, 10])
        data = os.path.join(work, name + "-data.safetensors")
        st.save(data, {"input_ids": ids, "labels": labels})
        names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] \
            if targets == "all-linear" else targets.split(",")
        common = [tool, "train", "--model", model_dir, "--data", data, "--optimizer", "lora",
                  "--dtype", "f64", "--batch", "2", "--lr", "0.01", "--weight-decay", "0.01",
                  "--max-grad-norm", "0", "--lora-rank", str(rank),
                  "--lora-alpha", str(alpha), "--target-modules", targets, "--seed", "4",
                  "--quiet"] + (["--rslora"] if rslora else [])
        init_dir = os.path.join(work, name + "-init")
        run(common + ["--steps", "0", "--save-model", init_dir])
        init = st.load(os.path.join(init_dir, "adapter_model.safetensors"))
        want_names = set()
        for l in range(cfg["num_hidden_layers"]):
            for m in names:
                stem = f"base_model.model.model.layers.{l}.{MODULES[m]}.{m}"
                want_names |= {stem + ".lora_A.weight", stem + ".lora_B.weight"}
        if set(init) != want_names:
            raise SystemExit(f"{name}: adapter tensors {sorted(init)} != {sorted(want_names)}")
        for k, v in init.items():
            if "lora_B" in k and v.abs().max().item() != 0:
                raise SystemExit(f"{name}: {k} is not initialised to zero")
        expected = torch_lora_steps(cfg, seed, init, names, rank, alpha, rslora, ids, labels, 3,
                                    0.01)
        for schedule, chunk in [("full", 10), ("checkpoint", 10), ("stream", 4)]:
            out = os.path.join(work, f"{name}-{schedule}")
            run(common + ["--steps", "3", "--sched", schedule, "--chunk", str(chunk),
                          "--save-model", out])
            got = st.load(os.path.join(out, "adapter_model.safetensors"))
            for k, ref in expected.items():
                diff = (got[k] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-300)
                worst = max(worst, diff)
                if not diff <= TOL:
                    raise SystemExit(f"{name} {schedule}: adapter {k} differs by {diff:.3e}")
            print(f"lora {name:10s} {schedule:10s} 3 AdamW steps: adapters agree, worst rel. "
                  f"error so far {worst:.2e}")
    print(f"LoRA cross-check passed: worst relative error {worst:.2e} (tolerance {TOL:g})")


if __name__ == "__main__":
    main()
