#!/usr/bin/env python3
"""Do `tightfit train`'s outputs load as they are in transformers and PEFT? (issue #33, item 4)

    python3 tests/python/hf_load_check.py TIGHTFIT [WORKDIR]

Needs torch, transformers, peft and safetensors (the GPU machine has them; scripts/gpu-check runs
this on its CPUs). On a tiny Qwen3 model that transformers itself writes (bf16 and f32):
  1. full weights: `train --save-model` of the bf16 checkpoint loads with
     AutoModelForCausalLM.from_pretrained, its tensors are bf16, every field of the original
     config.json is present with the same value, generation_config.json is there; the label
     log-probs transformers computes (in float64) equal `tightfit logprobs --dtype f64` on the
     saved folder (1e-9: both read the same bf16 weights);
  2. LoRA with dropout: the adapter folder loads with PeftModel.from_pretrained (its
     adapter_config.json records lora_dropout 0.1); PEFT's merge (float64, then the base's f32)
     equals `--merge-out`'s tensors to one f32 ulp; PEFT's log-probs in eval mode equal
     `tightfit logprobs` on the merged folder (1e-5: the merged weights are rounded to f32).
Prints one line per check and exits 1 on the first failure.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
from peft import PeftModel

tool = sys.argv[1]
work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="hf-load-")
os.makedirs(work, exist_ok=True)


def run(*args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"hf-load-check: tightfit {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r.stdout


def check(ok, what):
    print(("ok     " if ok else "FAILED ") + what, flush=True)
    if not ok:
        sys.exit(1)


def base_model(dtype, name):
    torch.manual_seed(3)
    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2)
    model = Qwen3ForCausalLM(cfg).to(dtype)
    path = os.path.join(work, name)
    model.save_pretrained(path, safe_serialization=True)
    return path


def label_logprobs(model, ids):
    """(B, T-1) log-probs of ids[:, 1:] in float64: what tightfit logprobs writes at t >= 1."""
    model = model.double().eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    lp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return lp.gather(-1, ids[:, 1:, None])[..., 0]


def tightfit_logprobs(model_dir, batch):
    out = os.path.join(work, os.path.basename(model_dir) + "-lp.safetensors")
    run("logprobs", "--model", model_dir, "--batch", batch, "--out", out, "--objective", "grpo",
        "--dtype", "f64", "--chunk", "8")
    return load_file(out)["ref_logprobs"][:, 1:].double()


g = torch.Generator().manual_seed(5)
ids = torch.randint(3, 128, (2, 12), generator=g)
data = os.path.join(work, "data.safetensors")
save_file({"input_ids": ids, "labels": ids.clone()}, data)
batch = os.path.join(work, "batch.safetensors")  # grad's grpo layout, for logprobs
save_file({"input_ids": ids, "labels": ids.clone(), "advantages": torch.ones(2, dtype=torch.float64)},
          batch)

# 1. full weights, bf16
base = base_model(torch.bfloat16, "base-bf16")
saved = os.path.join(work, "trained-bf16")
run("train", "--model", base, "--data", data, "--optimizer", "adamw", "--lr", "1e-3", "--steps",
    "2", "--batch", "2", "--chunk", "8", "--quiet", "--save-model", saved)
original = json.load(open(os.path.join(base, "config.json")))
written = json.load(open(os.path.join(saved, "config.json")))
check(all(k in written and written[k] == v for k, v in original.items()),
      "config.json keeps every original field with its value")
check(os.path.exists(os.path.join(saved, "generation_config.json")), "generation_config.json copied")
tensors = load_file(os.path.join(saved, "model.safetensors"))
check(all(t.dtype == torch.bfloat16 for t in tensors.values()), "the saved tensors are bf16")
loaded = AutoModelForCausalLM.from_pretrained(saved)
ours = tightfit_logprobs(saved, batch)
theirs = label_logprobs(loaded, ids)
err = (ours - theirs).abs().max().item()
check(err < 1e-9, f"transformers' log-probs of the saved model = tightfit logprobs ({err:.2e})")

# 2. LoRA with dropout, f32 base
base32 = base_model(torch.float32, "base-f32")
adapter, merged = os.path.join(work, "adapter"), os.path.join(work, "merged")
run("train", "--model", base32, "--data", data, "--optimizer", "lora", "--lora-rank", "4",
    "--lora-alpha", "8", "--lora-dropout", "0.1", "--target-modules", "all-linear", "--lr", "1e-2",
    "--steps", "3", "--batch", "2", "--chunk", "8", "--dtype", "f64", "--quiet", "--save-model",
    adapter, "--merge-out", merged)
acfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
check(acfg.get("lora_dropout") == 0.1, "adapter_config.json records lora_dropout 0.1")
peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base32).double(),
                                       adapter).eval()
check(any("lora_A" in n for n, _ in peft_model.named_parameters()), "PEFT loads the adapter")
peft_lp = label_logprobs(peft_model, ids)
merged_ours = load_file(os.path.join(merged, "model.safetensors"))
merged_peft = {k: v.float() for k, v in peft_model.merge_and_unload().state_dict().items()}
worst = 0.0
for name, t in merged_ours.items():
    p = merged_peft[name]
    ulp = torch.finfo(torch.float32).eps * p.abs().clamp_min(torch.finfo(torch.float32).tiny)
    worst = max(worst, ((t.float() - p).abs() / ulp).max().item())
check(worst <= 1.0, f"--merge-out's tensors = PEFT's merge to {worst:.2f} f32 ulp")
err = (tightfit_logprobs(merged, batch) - peft_lp).abs().max().item()
check(err < 1e-5, f"PEFT's log-probs (eval mode) = tightfit logprobs of --merge-out ({err:.2e})")
print("hf-load-check: passed")
