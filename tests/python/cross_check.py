#!/usr/bin/python3
"""Cross-check of `tightfit grad` against PyTorch autograd (an independent framework).

Builds small random Llama-, Qwen2- (q/k/v biases), Qwen3-style models and a Llama with
attention_bias (q/k/v/o biases) in plain PyTorch (own modules, float64),
saves config.json + model.safetensors and batches, runs `tightfit grad --dtype f64` under
every schedule for SFT, GRPO and DPO, and compares the loss and every gradient with torch
autograd: relative error (max |diff| / max |ref| per tensor) at most 1e-9.

usage: cross_check.py PATH_TO_TIGHTFIT [WORKDIR]
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

import st

torch.set_default_dtype(torch.float64)
TOL = 1e-9


class Model(torch.nn.Module):
    def __init__(self, cfg, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        h, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = cfg.get("head_dim", d // h)  # Qwen2 configs do not give head_dim
        self.head_dim = hd
        arch = cfg["architectures"][0]
        self.qk_norm = arch == "Qwen3ForCausalLM"
        # transformers: Qwen2 has q/k/v biases always and no o_proj bias; Llama / Qwen3 put
        # biases on q/k/v/o when attention_bias is true
        self.qkv_bias = arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False)
        self.o_bias = arch != "Qwen2ForCausalLM" and cfg.get("attention_bias", False)
        p = {}

        def mat(*shape):
            return torch.randn(*shape, generator=g) * 0.3

        def norm(n):
            return 1 + 0.2 * torch.randn(n, generator=g)

        p["model.embed_tokens.weight"] = mat(v, d)
        for l in range(cfg["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            p[pre + "input_layernorm.weight"] = norm(d)
            p[pre + "self_attn.q_proj.weight"] = mat(h * hd, d)
            p[pre + "self_attn.k_proj.weight"] = mat(hkv * hd, d)
            p[pre + "self_attn.v_proj.weight"] = mat(hkv * hd, d)
            p[pre + "self_attn.o_proj.weight"] = mat(d, h * hd)
            if self.qkv_bias:
                p[pre + "self_attn.q_proj.bias"] = mat(h * hd)
                p[pre + "self_attn.k_proj.bias"] = mat(hkv * hd)
                p[pre + "self_attn.v_proj.bias"] = mat(hkv * hd)
            if self.o_bias:
                p[pre + "self_attn.o_proj.bias"] = mat(d)
            if self.qk_norm:
                p[pre + "self_attn.q_norm.weight"] = norm(hd)
                p[pre + "self_attn.k_norm.weight"] = norm(hd)
            p[pre + "post_attention_layernorm.weight"] = norm(d)
            p[pre + "mlp.gate_proj.weight"] = mat(f, d)
            p[pre + "mlp.up_proj.weight"] = mat(f, d)
            p[pre + "mlp.down_proj.weight"] = mat(d, f)
        p["model.norm.weight"] = norm(d)
        if not cfg["tie_word_embeddings"]:
            p["lm_head.weight"] = mat(v, d)
        self.params = {k: torch.nn.Parameter(t) for k, t in p.items()}

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"]) * w

    def rope(self, x):  # x (B, heads, T, hd)
        hd = x.shape[-1]
        inv = 1.0 / (self.cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(x.shape[2], dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()

    def logits(self, ids, lengths):
        c, P = self.cfg, self.params
        B, T = ids.shape
        h, hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], self.head_dim
        x = P["model.embed_tokens.weight"][ids]
        pos = torch.arange(T)
        mask = (pos[None, :] <= pos[:, None])[None, :, :] & (pos[None, None, :] < lengths[:, None, None])
        for l in range(c["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            a = self.rms(x, P[pre + "input_layernorm.weight"])

            def linear(name, inp):
                w, b = P[pre + name + ".weight"], P.get(pre + name + ".bias")
                return torch.nn.functional.linear(inp, w, b)

            q = linear("self_attn.q_proj", a).view(B, T, h, hd).transpose(1, 2)
            k = linear("self_attn.k_proj", a).view(B, T, hkv, hd).transpose(1, 2)
            v = linear("self_attn.v_proj", a).view(B, T, hkv, hd).transpose(1, 2)
            if self.qk_norm:
                q = self.rms(q, P[pre + "self_attn.q_norm.weight"])
                k = self.rms(k, P[pre + "self_attn.k_norm.weight"])
            q, k = self.rope(q), self.rope(k)
            k = k.repeat_interleave(h // hkv, dim=1)
            v = v.repeat_interleave(h // hkv, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(~mask[:, None, :, :], float("-inf"))
            o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, h * hd)
            x = x + linear("self_attn.o_proj", o)
            m = self.rms(x, P[pre + "post_attention_layernorm.weight"])
            act = torch.nn.functional.silu(m @ P[pre + "mlp.gate_proj.weight"].T) * (m @ P[pre + "mlp.up_proj.weight"].T)
            x = x + act @ P[pre + "mlp.down_proj.weight"].T
        x = self.rms(x, P["model.norm.weight"])
        head = P["model.embed_tokens.weight"] if c["tie_word_embeddings"] else P["lm_head.weight"]
        return x @ head.T


def token_logprobs(model, ids, labels, lengths, tau):
    """lp (B, T-1) of labels[:, 1:], and the mask of counted tokens (HF shift)."""
    logits = model.logits(ids, lengths) / tau
    lp_all = logits.log_softmax(-1)[:, :-1, :]
    tgt = labels[:, 1:]
    valid = (tgt != -100) & (torch.arange(1, ids.shape[1])[None, :] < lengths[:, None])
    lp = lp_all.gather(-1, tgt.clamp(min=0)[..., None])[..., 0]
    return lp * valid, valid


def sft_loss(model, batch, opts):
    lp, m = token_logprobs(model, batch["input_ids"], batch["labels"], batch["lengths"], 1.0)
    return -(lp * m).sum() / m.sum()


def grpo_loss(model, batch, opts):
    lp, m = token_logprobs(model, batch["input_ids"], batch["labels"], batch["lengths"], opts["temperature"])
    old = batch["old_logprobs"][:, 1:]
    ref = batch["ref_logprobs"][:, 1:]
    adv = batch["advantages"][:, None]
    r = torch.exp(lp - old)
    s = torch.min(r * adv, torch.clamp(r, 1 - opts["epsilon_low"], 1 + opts["epsilon_high"]) * adv)
    kl = torch.exp(ref - lp) - (ref - lp) - 1
    l = (-s + opts["beta"] * kl) * m
    kind = opts["loss_type"]
    if kind == "grpo":
        return (l.sum(-1) / m.sum(-1).clamp(min=1)).mean()
    if kind == "bnpo":
        return l.sum() / m.sum()
    return l.sum() / (l.shape[0] * batch["input_ids"].shape[1])


def dpo_loss(model, batch, opts):
    def sums(prefix):
        lp, m = token_logprobs(model, batch[prefix + "_input_ids"], batch[prefix + "_labels"],
                               batch[prefix + "_lengths"], 1.0)
        return (lp * m).sum(-1)
    h = (sums("chosen") - batch["ref_chosen_logps"]) - (sums("rejected") - batch["ref_rejected_logps"])
    beta, eps = opts["beta"], opts["label_smoothing"]
    u = beta * h
    if opts["loss_type"] == "sigmoid":
        l = -(1 - eps) * torch.nn.functional.logsigmoid(u) - eps * torch.nn.functional.logsigmoid(-u)
    elif opts["loss_type"] == "ipo":
        l = (h - 1 / (2 * beta)) ** 2
    else:
        l = torch.relu(1 - u)
    return l.mean()


def make_batch(g, B, T, vocab, lengths):
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100  # a prompt
    mask = torch.zeros(B, T, dtype=torch.int64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        # Padding keeps real token ids as labels (not -100): positions outside attention_mask
        # must never be supervised whatever their label (the torch reference masks them by
        # length; a tool that counted them would disagree).
        labels[b, n:] = ids[b, n:]
    return ids, labels, mask


def compare(name, ours, theirs):
    worst = 0.0
    for key, ref in theirs.items():
        if key not in ours:
            raise SystemExit(f"{name}: tightfit wrote no gradient for {key}")
        diff = (ours[key] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-300)
        worst = max(worst, diff)
        if diff > TOL:
            raise SystemExit(f"{name}: gradient of {key} differs by {diff:.3e} (relative)")
    return worst


def main():
    tool = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="tightfit-xcheck-")
    os.makedirs(work, exist_ok=True)
    configs = {
        "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=53,
                      hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      hidden_act="silu", max_position_embeddings=64),
        "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=61,
                      hidden_size=20, intermediate_size=36, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                      rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                      hidden_act="silu", max_position_embeddings=64),
        "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=47,
                      hidden_size=24, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                      rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu",
                      use_sliding_window=False, max_position_embeddings=64),
        "llama-bias": dict(architectures=["LlamaForCausalLM"], model_type="llama",
                           vocab_size=41, hidden_size=16, intermediate_size=28,
                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0,
                           tie_word_embeddings=False, attention_bias=True, mlp_bias=False,
                           hidden_act="silu", max_position_embeddings=64),
    }
    checks = 0
    worst = 0.0
    for arch, cfg in configs.items():
        model_dir = os.path.join(work, arch)
        os.makedirs(model_dir, exist_ok=True)
        model = Model(cfg, seed=len(arch))
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        st.save(os.path.join(model_dir, "model.safetensors"), {k: v.detach() for k, v in model.params.items()})
        g = torch.Generator().manual_seed(7)
        B, T, V = 3, 11, cfg["vocab_size"]
        ids, labels, mask = make_batch(g, B, T, V, [11, 7, 9])
        lengths = mask.sum(-1)
        with torch.no_grad():
            lp0, _ = token_logprobs(model, ids, labels, lengths, 1.0)
        old = torch.zeros(B, T)
        old[:, 1:] = lp0 + 0.4 * torch.randn(B, T - 1, generator=g)
        ref = torch.zeros(B, T)
        ref[:, 1:] = lp0 + 0.2 * torch.randn(B, T - 1, generator=g)
        P = 2
        cids, clab, cmask = make_batch(g, P, T, V, [11, 8])
        rids, rlab, rmask = make_batch(g, P, T, V, [9, 11])
        batches = {
            "sft": ({"input_ids": ids, "labels": labels, "attention_mask": mask}, {}),
            "grpo": ({"input_ids": ids, "labels": labels, "attention_mask": mask,
                      "advantages": torch.tensor([1.2, -0.6, 0.3]), "old_logprobs": old,
                      "ref_logprobs": ref},
                     {"beta": 0.05, "epsilon_low": 0.2, "epsilon_high": 0.28, "loss_type": "bnpo",
                      "temperature": 0.9}),
            "dpo": ({"chosen_input_ids": cids, "chosen_labels": clab, "chosen_attention_mask": cmask,
                     "rejected_input_ids": rids, "rejected_labels": rlab,
                     "rejected_attention_mask": rmask,
                     "ref_chosen_logps": torch.tensor([-30.0, -25.0]),
                     "ref_rejected_logps": torch.tensor([-28.0, -31.0])},
                    {"beta": 0.1, "label_smoothing": 0.1, "loss_type": "sigmoid"}),
        }
        losses = {"sft": sft_loss, "grpo": grpo_loss, "dpo": dpo_loss}
        for objective, (tensors, opts) in batches.items():
            batch_path = os.path.join(work, f"{arch}-{objective}.safetensors")
            st.save(batch_path, tensors)
            tb = {k: v for k, v in tensors.items()}
            tb["lengths"] = lengths
            if objective == "dpo":
                tb["chosen_lengths"] = cmask.sum(-1)
                tb["rejected_lengths"] = rmask.sum(-1)
            for p in model.params.values():
                p.grad = None
            loss = losses[objective](model, tb, opts)
            loss.backward()
            expected = {k: p.grad for k, p in model.params.items()}
            for schedule in ("full", "checkpoint", "stream"):
                out = os.path.join(work, f"{arch}-{objective}-{schedule}-grads.safetensors")
                cmd = [tool, "grad", "--model", model_dir, "--batch", batch_path, "--objective",
                       objective, "--schedule", schedule, "--chunk", "4", "--dtype", "f64",
                       "--out", out]
                for key, value in opts.items():
                    cmd += ["--" + key.replace("_", "-"), str(value)]
                run = subprocess.run(cmd, capture_output=True, text=True)
                if run.returncode != 0:
                    raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr}")
                report = json.loads(run.stdout.strip().splitlines()[-1])
                rel = abs(report["loss"] - loss.item()) / abs(loss.item())
                if rel > TOL:
                    raise SystemExit(f"{arch} {objective} {schedule}: loss {report['loss']} vs torch {loss.item()}")
                worst = max(worst, compare(f"{arch} {objective} {schedule}", st.load(out), expected))
                checks += 1
                print(f"{arch:6s} {objective:5s} {schedule:10s} loss {report['loss']:.12f} "
                      f"(torch {loss.item():.12f}) worst gradient rel. error so far {worst:.2e}")
    print(f"cross-check: {checks} passed, 0 failed (every gradient within {TOL:g} of torch autograd)")


if __name__ == "__main__":
    main()
