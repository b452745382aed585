#!/usr/bin/python3
"""Cross-check of `tightfit grad` against PyTorch autograd (an independent framework).

Builds small random Llama-, Qwen2- (q/k/v biases), Qwen3-style models and a Llama with
attention_bias (q/k/v/o biases) in plain PyTorch (own modules, float64),
saves config.json + model.safetensors and batches, runs `tightfit grad --dtype f64` under
every schedule for SFT, GRPO (TRL's loss types grpo / bnpo / dapo / dr_grpo, GSPO's
sequence-level ratio, two-sided clipping delta, mask_truncated_completions) and the preference
losses (DPO sigmoid with label smoothing, IPO, hinge, RPO's rpo_alpha, SimPO, ORPO), and compares the loss and every gradient with torch
autograd: relative error (max |diff| / max |ref| per tensor) at most 1e-9.

Then (SFT, every schedule, a chunk smaller than the window): a Llama 3.1-style model with llama3
rope scaling at positions past original_max_position_embeddings and mlp_bias, a yarn model, a
Mistral with a sliding window shorter than T, a Qwen2 with a window on its upper layer and
dynamic NTK rope, and a packed batch (position_ids, documents restarting at 0) whose reference
runs every document alone. The rope scalings are written here from their definitions
(transformers' ROPE_INIT_FUNCTIONS), in float64.

Then a Gemma 2 style model (attention and final logit soft-capping, even layers sliding) and a
Gemma 3 style model (q/k-norm, 2 local : 1 global layers, a local RoPE base, linear scaling on the
global layer), written here after transformers' Gemma2/Gemma3 modules: RMSNorm scaled by (1 + w),
the embedding times sqrt(hidden_size), pre- and post-norms around attention and MLP, GELU (tanh)
gated MLP, query_pre_attn_scalar, tied embeddings; SFT under every schedule, chunk < window < T.

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
from hf_params import hf_parameters

torch.set_default_dtype(torch.float64)
TOL = 1e-9


class Model(torch.nn.Module):
    def __init__(self, cfg, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        d, h = cfg["hidden_size"], cfg["num_attention_heads"]
        self.head_dim = cfg.get("head_dim", d // h)  # Qwen2 configs do not give head_dim
        arch = cfg["architectures"][0]
        self.qk_norm = arch == "Qwen3ForCausalLM"
        # transformers: Qwen2 has q/k/v biases always and no o_proj bias; Llama / Qwen3 put
        # biases on q/k/v/o when attention_bias is true
        self.qkv_bias = arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False)
        self.o_bias = arch != "Qwen2ForCausalLM" and cfg.get("attention_bias", False)
        self.mlp_bias = arch == "LlamaForCausalLM" and cfg.get("mlp_bias", False)

        def mat(*shape):
            return torch.randn(*shape, generator=g) * 0.3

        def norm(n):
            return 1 + 0.2 * torch.randn(n, generator=g)

        p = hf_parameters(cfg, mat, norm)
        self.params = {k: torch.nn.Parameter(t) for k, t in p.items()}

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"]) * w

    def rope_params(self, seq_len, c=None):
        """inv_freq (hd/2) and the cos/sin scaling of the config's rope_scaling."""
        c, hd = c or self.cfg, self.head_dim
        theta = c["rope_theta"]
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        rs = c.get("rope_scaling") or {"rope_type": "default"}
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "default":
            return inv, 1.0
        factor = rs["factor"]
        if kind == "linear":
            return inv / factor, 1.0
        if kind == "dynamic":
            m = c["max_position_embeddings"]
            if seq_len <= m:
                return inv, 1.0
            base = theta * (factor * seq_len / m - (factor - 1)) ** (hd / (hd - 2))
            return 1.0 / base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd), 1.0
        if kind == "llama3":
            old = rs["original_max_position_embeddings"]
            lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
            out = []
            for f in inv.tolist():
                wl = 2 * math.pi / f
                if wl < old / hi:
                    out.append(f)
                elif wl > old / lo:
                    out.append(f / factor)
                else:
                    smooth = (old / wl - lo) / (hi - lo)
                    out.append((1 - smooth) * f / factor + smooth * f)
            return torch.tensor(out), 1.0
        if kind == "yarn":
            orig = rs.get("original_max_position_embeddings") or c["max_position_embeddings"]
            scaling = rs.get("attention_factor") or 0.1 * math.log(factor) + 1.0

            def dim_of(rot):
                return hd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
            low = max(math.floor(dim_of(rs.get("beta_fast", 32))), 0)
            high = min(math.ceil(dim_of(rs.get("beta_slow", 1))), hd - 1)
            if low == high:
                high += 0.001
            ramp = ((torch.arange(hd // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
            keep = 1 - ramp  # weight of the unscaled (extrapolated) frequency
            return inv / factor * (1 - keep) + inv * keep, scaling
        raise ValueError(kind)

    def rope(self, x, pos, c=None):  # x (B, heads, T, hd), pos (B, T) positions
        hd = x.shape[-1]
        inv, scaling = self.rope_params(int(pos.max().item()) + 1, c)
        ang = pos.to(torch.float64)[:, :, None] * inv[None, None, :]  # (B, T, hd/2)
        emb = torch.cat([ang, ang], dim=-1)[:, None, :, :]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * (emb.cos() * scaling) + torch.cat([-x2, x1], dim=-1) * (emb.sin() * scaling)

    def window(self, l):
        """The sliding window of layer l (0: none), from the config as transformers reads it."""
        c = self.cfg
        arch = c["architectures"][0]
        if arch == "MistralForCausalLM":
            return c.get("sliding_window") or 0
        if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and c.get("use_sliding_window"):
            return c["sliding_window"] if l >= c.get("max_window_layers", 28) else 0
        return 0

    def logits(self, ids, lengths, positions=None):
        c, P = self.cfg, self.params
        B, T = ids.shape
        h, hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], self.head_dim
        x = P["model.embed_tokens.weight"][ids]
        pos = torch.arange(T)
        if positions is None:
            positions = pos[None, :].expand(B, T)
        start = pos[None, :] - positions  # (B, T) first position of each token's document
        causal = (pos[None, :] <= pos[:, None])[None, :, :] & (pos[None, None, :] < lengths[:, None, None])
        causal = causal & (pos[None, None, :] >= start[:, :, None])
        for l in range(c["num_hidden_layers"]):
            mask = causal
            if self.window(l) > 0:
                mask = mask & (pos[:, None] - pos[None, :] < self.window(l))[None, :, :]
                # a padded row left without keys (past its window) sees its last valid key, as
                # tightfit defines it (any finite choice: padded rows are never supervised)
                last = torch.minimum(pos[None, :], lengths[:, None] - 1)  # (B, T)
                empty = ~mask.any(-1)
                mask = mask | (empty[:, :, None] & (pos[None, None, :] == last[:, :, None]))
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
            q, k = self.rope(q, positions), self.rope(k, positions)
            k = k.repeat_interleave(h // hkv, dim=1)
            v = v.repeat_interleave(h // hkv, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(~mask[:, None, :, :], float("-inf"))
            o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, h * hd)
            x = x + linear("self_attn.o_proj", o)
            m = self.rms(x, P[pre + "post_attention_layernorm.weight"])
            act = torch.nn.functional.silu(linear("mlp.gate_proj", m)) * linear("mlp.up_proj", m)
            x = x + linear("mlp.down_proj", act)
        x = self.rms(x, P["model.norm.weight"])
        head = P["model.embed_tokens.weight"] if c["tie_word_embeddings"] else P["lm_head.weight"]
        return x @ head.T


class GemmaModel(Model):
    """Gemma 2 / Gemma 3 (text) after transformers' modeling_gemma2.py / modeling_gemma3.py."""

    def __init__(self, cfg, seed):
        torch.nn.Module.__init__(self)
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        h, hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.head_dim = hd
        self.gemma3 = cfg["architectures"][0] == "Gemma3ForCausalLM"
        p = {}

        def mat(*shape):
            return torch.randn(*shape, generator=g) * 0.3

        def norm(n):  # stored w of the (1 + w) scale
            return 0.2 * torch.randn(n, generator=g)

        p["model.embed_tokens.weight"] = mat(v, d)
        for l in range(cfg["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            p[pre + "input_layernorm.weight"] = norm(d)
            p[pre + "self_attn.q_proj.weight"] = mat(h * hd, d)
            p[pre + "self_attn.k_proj.weight"] = mat(hkv * hd, d)
            p[pre + "self_attn.v_proj.weight"] = mat(hkv * hd, d)
            p[pre + "self_attn.o_proj.weight"] = mat(d, h * hd)
            if self.gemma3:
                p[pre + "self_attn.q_norm.weight"] = norm(hd)
                p[pre + "self_attn.k_norm.weight"] = norm(hd)
            for n in ("post_attention_layernorm", "pre_feedforward_layernorm",
                      "post_feedforward_layernorm"):
                p[pre + n + ".weight"] = norm(d)
            p[pre + "mlp.gate_proj.weight"] = mat(f, d)
            p[pre + "mlp.up_proj.weight"] = mat(f, d)
            p[pre + "mlp.down_proj.weight"] = mat(d, f)
        p["model.norm.weight"] = norm(d)
        self.params = {k: torch.nn.Parameter(t) for k, t in p.items()}

    def rms(self, x, w):  # Gemma's RMSNorm: (1 + w)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"]) * (1 + w)

    def window(self, l):
        c = self.cfg
        if self.gemma3:
            sliding = (l + 1) % c["sliding_window_pattern"] != 0
        else:
            sliding = (l + 1) % 2 != 0  # layers 0, 2, ... are local
        return c["sliding_window"] if sliding else 0

    def logits(self, ids, lengths, positions=None):
        c, P = self.cfg, self.params
        B, T = ids.shape
        h, hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], self.head_dim
        x = P["model.embed_tokens.weight"][ids] * torch.tensor(c["hidden_size"] ** 0.5)
        pos = torch.arange(T)
        if positions is None:
            positions = pos[None, :].expand(B, T)
        causal = (pos[None, :] <= pos[:, None])[None, :, :] & (pos[None, None, :] < lengths[:, None, None])
        softcap = c.get("attn_logit_softcapping")
        for l in range(c["num_hidden_layers"]):
            mask = causal
            rope_cfg = c
            if self.window(l) > 0:
                mask = mask & (pos[:, None] - pos[None, :] < self.window(l))[None, :, :]
                last = torch.minimum(pos[None, :], lengths[:, None] - 1)  # see Model.logits
                empty = ~mask.any(-1)
                mask = mask | (empty[:, :, None] & (pos[None, None, :] == last[:, :, None]))
                if self.gemma3:  # local layers: rope_local_base_freq, default rope
                    rope_cfg = dict(c, rope_theta=c["rope_local_base_freq"], rope_scaling=None)
            pre = f"model.layers.{l}."

            def linear(name, inp):
                return torch.nn.functional.linear(inp, P[pre + name + ".weight"])

            a = self.rms(x, P[pre + "input_layernorm.weight"])
            q = linear("self_attn.q_proj", a).view(B, T, h, hd).transpose(1, 2)
            k = linear("self_attn.k_proj", a).view(B, T, hkv, hd).transpose(1, 2)
            v = linear("self_attn.v_proj", a).view(B, T, hkv, hd).transpose(1, 2)
            if self.gemma3:
                q = self.rms(q, P[pre + "self_attn.q_norm.weight"])
                k = self.rms(k, P[pre + "self_attn.k_norm.weight"])
            q, k = self.rope(q, positions, rope_cfg), self.rope(k, positions, rope_cfg)
            k = k.repeat_interleave(h // hkv, dim=1)
            v = v.repeat_interleave(h // hkv, dim=1)
            s = (q @ k.transpose(-1, -2)) * c["query_pre_attn_scalar"] ** -0.5
            if softcap:
                s = torch.tanh(s / softcap) * softcap
            s = s.masked_fill(~mask[:, None, :, :], float("-inf"))
            o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, h * hd)
            x = x + self.rms(linear("self_attn.o_proj", o), P[pre + "post_attention_layernorm.weight"])
            m = self.rms(x, P[pre + "pre_feedforward_layernorm.weight"])
            act = (torch.nn.functional.gelu(linear("mlp.gate_proj", m), approximate="tanh")
                   * linear("mlp.up_proj", m))
            x = x + self.rms(linear("mlp.down_proj", act), P[pre + "post_feedforward_layernorm.weight"])
        x = self.rms(x, P["model.norm.weight"])
        logits = x @ P["model.embed_tokens.weight"].T
        cap = c.get("final_logit_softcapping")
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits


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
    """TRL's GRPOTrainer loss: loss_type grpo|bnpo|dapo|dr_grpo, importance_sampling_level
    token|sequence (GSPO), delta (upper clip of the unclipped ratio), mask_truncated_completions
    (a completion whose last valid token is not EOS adds no loss)."""
    ids, lengths = batch["input_ids"], batch["lengths"]
    lp, m = token_logprobs(model, ids, batch["labels"], lengths, opts["temperature"])
    if opts.get("mask_truncated_completions"):
        last = ids.gather(1, (lengths - 1)[:, None])[:, 0]
        m = m & (last == opts["eos_token_id"])[:, None]
    m = m.to(torch.float64)
    old = batch["old_logprobs"][:, 1:]
    ref = batch["ref_logprobs"][:, 1:]
    adv = batch["advantages"][:, None]
    log_ratio = lp - old
    if opts.get("importance_sampling_level", "token") == "sequence":
        log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1))[:, None]
    r = torch.exp(log_ratio)
    r1 = torch.clamp(r, max=opts["delta"]) if "delta" in opts else r
    s = torch.min(r1 * adv, torch.clamp(r, 1 - opts["epsilon_low"], 1 + opts["epsilon_high"]) * adv)
    kl = torch.exp(ref - lp) - (ref - lp) - 1
    l = (-s + opts["beta"] * kl) * m
    kind = opts["loss_type"]
    if kind == "grpo":
        return (l.sum(-1) / m.sum(-1).clamp(min=1)).mean()
    if kind in ("bnpo", "dapo"):
        return l.sum() / m.sum()
    return l.sum() / (l.shape[0] * batch["input_ids"].shape[1])


def dpo_loss(model, batch, opts):
    """TRL's DPO losses (sigmoid with label smoothing, ipo, hinge; rpo_alpha's NLL on chosen
    tokens), CPOTrainer's SimPO and ORPOTrainer's ORPO (reference-free, length-normalised)."""
    def stats(prefix):
        lp, m = token_logprobs(model, batch[prefix + "_input_ids"], batch[prefix + "_labels"],
                               batch[prefix + "_lengths"], 1.0)
        return (lp * m).sum(-1), m.sum(-1)
    pi_w, n_w = stats("chosen")
    pi_l, n_l = stats("rejected")
    beta, eps, kind = opts["beta"], opts.get("label_smoothing", 0.0), opts["loss_type"]
    logsig = torch.nn.functional.logsigmoid
    if kind in ("sigmoid", "ipo", "hinge"):
        h = (pi_w - batch["ref_chosen_logps"]) - (pi_l - batch["ref_rejected_logps"])
        u = beta * h
        if kind == "sigmoid":
            l = -(1 - eps) * logsig(u) - eps * logsig(-u)
        elif kind == "ipo":
            l = (h - 1 / (2 * beta)) ** 2
        else:
            l = torch.relu(1 - u)
    elif kind == "simpo":
        u = beta * (pi_w / n_w - pi_l / n_l) - opts.get("simpo_gamma", 0.5)  # TRL default
        l = -(1 - eps) * logsig(u) - eps * logsig(-u)
    else:  # orpo
        a_w, a_l = pi_w / n_w, pi_l / n_l
        log_odds = (a_w - a_l) - (torch.log1p(-torch.exp(a_w)) - torch.log1p(-torch.exp(a_l)))
        l = -beta * logsig(log_odds)
    loss = l.mean()
    alpha = 1.0 if kind == "orpo" else opts.get("rpo_alpha", 0.0)
    if alpha > 0:
        loss = loss + alpha * (-pi_w.sum() / n_w.sum())
    return loss


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
        if not diff <= TOL:  # NaN fails too
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
        # GRPO with mask_truncated_completions: rows 0 and 2 end with EOS (complete), row 1
        # (length 7) does not (truncated: it adds no loss but still counts in grpo's mean)
        eos = 5
        ids_eos, labels_eos = ids.clone(), labels.clone()
        for row, n in ((0, 11), (2, 9)):
            ids_eos[row, n - 1] = labels_eos[row, n - 1] = eos
        if ids_eos[1, 6] == eos:
            ids_eos[1, 6] = labels_eos[1, 6] = eos + 1
        grpo_tensors = {"input_ids": ids, "labels": labels, "attention_mask": mask,
                        "advantages": torch.tensor([1.2, -0.6, 0.3]), "old_logprobs": old,
                        "ref_logprobs": ref}
        grpo_opts = {"beta": 0.05, "epsilon_low": 0.2, "epsilon_high": 0.28, "loss_type": "bnpo",
                     "temperature": 0.9}
        dpo_tensors = {"chosen_input_ids": cids, "chosen_labels": clab,
                       "chosen_attention_mask": cmask, "rejected_input_ids": rids,
                       "rejected_labels": rlab, "rejected_attention_mask": rmask,
                       "ref_chosen_logps": torch.tensor([-30.0, -25.0]),
                       "ref_rejected_logps": torch.tensor([-28.0, -31.0])}
        reference_free = {k: v for k, v in dpo_tensors.items() if not k.startswith("ref_")}
        # (objective, case name, batch tensors, options: TRL's names, passed as --name-with-dashes)
        cases = [
            ("sft", "sft", {"input_ids": ids, "labels": labels, "attention_mask": mask}, {}),
            ("grpo", "bnpo", grpo_tensors, grpo_opts),
            ("grpo", "dapo", grpo_tensors, dict(grpo_opts, loss_type="dapo")),
            ("grpo", "gspo", grpo_tensors,
             dict(grpo_opts, loss_type="grpo", importance_sampling_level="sequence")),
            ("grpo", "gspo-dr", grpo_tensors,
             dict(grpo_opts, loss_type="dr_grpo", importance_sampling_level="sequence",
                  epsilon_low=0.02, epsilon_high=0.03)),
            ("grpo", "delta", grpo_tensors, dict(grpo_opts, loss_type="grpo", delta=1.1)),
            ("grpo", "truncated", dict(grpo_tensors, input_ids=ids_eos, labels=labels_eos),
             dict(grpo_opts, loss_type="dapo", mask_truncated_completions=True,
                  eos_token_id=eos)),
            ("dpo", "sigmoid", dpo_tensors,
             {"beta": 0.1, "label_smoothing": 0.1, "loss_type": "sigmoid"}),
            ("dpo", "ipo", dpo_tensors, {"beta": 0.1, "loss_type": "ipo"}),
            ("dpo", "hinge", dpo_tensors, {"beta": 0.1, "loss_type": "hinge"}),
            ("dpo", "rpo", dpo_tensors, {"beta": 0.1, "loss_type": "sigmoid", "rpo_alpha": 0.7}),
            ("dpo", "simpo", reference_free,
             {"beta": 2.0, "label_smoothing": 0.05, "loss_type": "simpo", "simpo_gamma": 0.3}),
            ("dpo", "orpo", reference_free, {"beta": 0.25, "loss_type": "orpo"}),
        ]
        losses = {"sft": sft_loss, "grpo": grpo_loss, "dpo": dpo_loss}
        for objective, case, tensors, opts in cases:
            batch_path = os.path.join(work, f"{arch}-{objective}-{case}.safetensors")
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
            # each option must change the loss of this batch (else its case tests nothing)
            for key in ("delta", "mask_truncated_completions", "rpo_alpha", "simpo_gamma"):
                if key in opts:
                    with torch.no_grad():
                        without = losses[objective](model, tb, {k: v for k, v in opts.items()
                                                                if k != key})
                    if not abs(without.item() - loss.item()) > 1e-6 * abs(loss.item()):
                        raise SystemExit(f"{arch} {case}: {key} does not change the loss")
            for schedule in ("full", "checkpoint", "stream"):
                out = os.path.join(work, f"{arch}-{objective}-{case}-{schedule}-grads.safetensors")
                cmd = [tool, "grad", "--model", model_dir, "--batch", batch_path, "--objective",
                       objective, "--sched", schedule, "--chunk", "4", "--dtype", "f64",
                       "--out", out]
                for key, value in opts.items():
                    cmd += ["--" + key.replace("_", "-")] + ([] if value is True else [str(value)])
                run = subprocess.run(cmd, capture_output=True, text=True)
                if run.returncode != 0:
                    raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr}")
                report = json.loads(run.stdout.strip().splitlines()[-1])
                if opts.get("mask_truncated_completions") and report["truncated_completions"] != 1:
                    raise SystemExit(f"{arch} {case}: {report['truncated_completions']} rows "
                                     "masked as truncated, expected 1")
                rel = abs(report["loss"] - loss.item()) / abs(loss.item())
                if not rel <= TOL:
                    raise SystemExit(f"{arch} {objective} {case} {schedule}: loss {report['loss']} "
                                     f"vs torch {loss.item()}")
                worst = max(worst, compare(f"{arch} {objective} {case} {schedule}", st.load(out),
                                           expected))
                checks += 1
                print(f"{arch:6s} {objective:5s} {case:9s} {schedule:10s} loss {report['loss']:.12f} "
                      f"(torch {loss.item():.12f}) worst gradient rel. error so far {worst:.2e}")
    more, worst = scaled_and_packed(tool, work, worst)
    checks += more
    more, worst = packed_objectives_and_logprobs(tool, work, configs["llama"], worst)
    checks += more
    print(f"cross-check: {checks} passed, 0 failed (every gradient within {TOL:g} of torch autograd)")


def run_tool(tool, model_dir, batch_path, out, schedule, chunk):
    cmd = [tool, "grad", "--model", model_dir, "--batch", batch_path, "--objective", "sft",
           "--sched", schedule, "--chunk", str(chunk), "--dtype", "f64", "--out", out]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def scaled_and_packed(tool, work, worst):
    """Rope scaling, sliding windows, mlp_bias and packed batches (SFT, every schedule)."""
    base = dict(vocab_size=43, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5,
                rope_theta=100.0, tie_word_embeddings=False, hidden_act="silu")
    llama = dict(architectures=["LlamaForCausalLM"], model_type="llama")
    configs = {
        # wavelengths 6.3 (kept), 13.5 and 29 (smoothed), 63+ (divided); positions up to 39 > 32
        "llama3.1": dict(base, **llama, max_position_embeddings=256, mlp_bias=True,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=32)),
        "yarn": dict(base, **llama, max_position_embeddings=64,
                     rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=8, beta_slow=1,
                                       original_max_position_embeddings=16)),
        "mistral": dict(base, architectures=["MistralForCausalLM"], model_type="mistral",
                        sliding_window=6, max_position_embeddings=64),
        "qwen2-window": dict(base, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                             use_sliding_window=True, sliding_window=5, max_window_layers=1,
                             max_position_embeddings=16,
                             rope_scaling=dict(type="dynamic", factor=2.0)),
    }
    gemma = dict(vocab_size=43, hidden_size=24, intermediate_size=32, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-6,
                 hidden_activation="gelu_pytorch_tanh", max_position_embeddings=64,
                 attention_bias=False, sliding_window=6)
    configs.update({
        "gemma2": dict(gemma, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                       hidden_act="gelu_pytorch_tanh", rope_theta=100.0,
                       query_pre_attn_scalar=10, attn_logit_softcapping=3.0,
                       final_logit_softcapping=5.0),
        "gemma3": dict(gemma, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                       rope_theta=1000.0, rope_local_base_freq=50.0,
                       rope_scaling=dict(rope_type="linear", factor=4.0),
                       query_pre_attn_scalar=16, sliding_window_pattern=3,
                       attn_logit_softcapping=None, final_logit_softcapping=None),
    })
    checks = 0
    for name, cfg in configs.items():
        model_dir = os.path.join(work, name)
        os.makedirs(model_dir, exist_ok=True)
        model = (GemmaModel if name.startswith("gemma") else Model)(cfg, seed=3 + len(name))
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        st.save(os.path.join(model_dir, "model.safetensors"),
                {k: v.detach() for k, v in model.params.items()})
        g = torch.Generator().manual_seed(11)
        B, T = 2, 40
        ids, labels, mask = make_batch(g, B, T, cfg["vocab_size"], [40, 29])
        lengths = mask.sum(-1)
        for p in model.params.values():
            p.grad = None
        loss = sft_loss(model, {"input_ids": ids, "labels": labels, "lengths": lengths}, {})
        loss.backward()
        expected = {k: p.grad for k, p in model.params.items()}
        batch_path = os.path.join(work, f"{name}-sft.safetensors")
        st.save(batch_path, {"input_ids": ids, "labels": labels, "attention_mask": mask})
        for schedule in ("full", "checkpoint", "stream"):
            out = os.path.join(work, f"{name}-{schedule}-grads.safetensors")
            report = run_tool(tool, model_dir, batch_path, out, schedule, 4)  # 4 < every window
            rel = abs(report["loss"] - loss.item()) / abs(loss.item())
            if not rel <= TOL:
                raise SystemExit(f"{name} {schedule}: loss {report['loss']} vs torch {loss.item()}")
            worst = max(worst, compare(f"{name} {schedule}", st.load(out), expected))
            checks += 1
            print(f"{name:12s} sft   {schedule:10s} loss {report['loss']:.12f} "
                  f"(torch {loss.item():.12f}) worst gradient rel. error so far {worst:.2e}")

    # Packed: rows of documents restarting at position 0; the reference runs each document
    # alone (its own sequence), so nothing may cross a document boundary.
    name = "llama3.1"
    cfg = configs[name]
    model_dir = os.path.join(work, name)
    model = Model(cfg, seed=3 + len(name))
    g = torch.Generator().manual_seed(5)
    docs = [[4, 7, 29], [3, 3, 5, 29]]
    B, T = len(docs), 40
    ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    labels = ids.clone()  # labels across document boundaries too: the tool must drop them
    positions = torch.zeros(B, T, dtype=torch.int64)
    for b, row in enumerate(docs):
        t = 0
        for n in row:
            positions[b, t:t + n] = torch.arange(n)
            t += n
    for p in model.params.values():
        p.grad = None
    total, count = 0.0, 0
    for b, row in enumerate(docs):
        t = 0
        for n in row:
            doc = ids[b:b + 1, t:t + n]
            logits = model.logits(doc, torch.tensor([n]))
            lp = logits.log_softmax(-1)[0, :-1, :].gather(-1, doc[0, 1:, None])[:, 0]
            total = total + lp.sum()
            count += n - 1
            t += n
    loss = -total / count
    loss.backward()
    expected = {k: p.grad for k, p in model.params.items()}
    batch_path = os.path.join(work, "packed-sft.safetensors")
    st.save(batch_path, {"input_ids": ids, "labels": labels, "position_ids": positions})
    for schedule in ("full", "checkpoint", "stream"):
        for chunk in (4, 7):  # chunks crossing document boundaries
            out = os.path.join(work, f"packed-{schedule}-{chunk}-grads.safetensors")
            report = run_tool(tool, model_dir, batch_path, out, schedule, chunk)
            rel = abs(report["loss"] - loss.item()) / abs(loss.item())
            if not rel <= TOL:
                raise SystemExit(f"packed {schedule}: loss {report['loss']} vs torch {loss.item()}")
            worst = max(worst, compare(f"packed {schedule} chunk {chunk}", st.load(out), expected))
            checks += 1
            print(f"packed       sft   {schedule:10s} chunk {chunk} loss {report['loss']:.12f} "
                  f"(torch {loss.item():.12f}) worst gradient rel. error so far {worst:.2e}")
    # a batch key the tool does not understand is an error naming it
    bad = os.path.join(work, "unknown-key.safetensors")
    st.save(bad, {"input_ids": ids, "labels": labels, "cu_seqlens": torch.tensor([0, 4, 11])})
    run = subprocess.run([tool, "grad", "--model", model_dir, "--batch", bad, "--dtype", "f64"],
                         capture_output=True, text=True)
    if run.returncode != 1 or "'cu_seqlens'" not in run.stderr:
        raise SystemExit(f"an unknown batch key was not refused by name: {run.returncode} {run.stderr}")
    return checks, worst


def pack(docs, rows, T, keys):
    """Packs documents (dicts of 1-D tensors of one length each, keys `keys`) into rows of T:
    rows[b] lists the documents of row b in order; a row shorter than T is right-padded
    (attention_mask 0, positions continuing, padding ids 0, labels -100, values 0)."""
    out = {k: torch.zeros(len(rows), T, dtype=docs[0][k].dtype) for k in keys}
    out["position_ids"] = torch.zeros(len(rows), T, dtype=torch.int64)
    out["attention_mask"] = torch.zeros(len(rows), T, dtype=torch.int64)
    if "labels" in out:
        out["labels"][:] = -100
    for b, row in enumerate(rows):
        t = 0
        for d in row:
            n = len(docs[d]["input_ids"])
            for k in keys:
                out[k][b, t:t + n] = docs[d][k]
            out["position_ids"][b, t:t + n] = torch.arange(n)
            t += n
        out["attention_mask"][b, :t] = 1
        out["position_ids"][b, t:] = out["position_ids"][b, t - 1] + 1 + torch.arange(T - t)
    return out


def unpack(docs, keys):
    """The documents as rows of their own, right-padded to the longest ("lengths" (D))."""
    T = max(len(d["input_ids"]) for d in docs)
    out = {k: torch.zeros(len(docs), T, dtype=docs[0][k].dtype) for k in keys}
    for i, d in enumerate(docs):
        n = len(d["input_ids"])
        for k in keys:
            out[k][i, :n] = d[k]
        if "labels" in out:
            out["labels"][i, n:] = -100
    out["lengths"] = torch.tensor([len(d["input_ids"]) for d in docs])
    return out


def random_docs(g, lengths, vocab, eos=None):
    docs = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, vocab, (n,), generator=g)
        if eos is not None:  # even documents end with EOS (complete), odd ones do not
            ids[-1] = eos if i % 2 == 0 else (eos + 1) % vocab
        labels = ids.clone()
        labels[:2] = -100  # the prompt
        docs.append({"input_ids": ids, "labels": labels})
    return docs


def run_grad(tool, model_dir, batch_path, objective, schedule, chunk, opts, out):
    cmd = [tool, "grad", "--model", model_dir, "--batch", batch_path, "--objective", objective,
           "--sched", schedule, "--chunk", str(chunk), "--dtype", "f64", "--out", out]
    for key, value in opts.items():
        cmd += ["--" + key.replace("_", "-")] + ([] if value is True else [str(value)])
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def check_case(tool, model, model_dir, name, batch_path, objective, opts, loss, worst,
               chunks=(4, 7)):
    """Runs `tightfit grad` under every schedule and `chunks`, against torch's `loss`."""
    for p in model.params.values():
        p.grad = None
    loss.backward()
    expected = {k: p.grad for k, p in model.params.items()}
    checks = 0
    for schedule in ("full", "checkpoint", "stream"):
        for chunk in chunks:
            out = os.path.join(os.path.dirname(batch_path), f"{name}-{schedule}-{chunk}.safetensors")
            report = run_grad(tool, model_dir, batch_path, objective, schedule, chunk, opts, out)
            rel = abs(report["loss"] - loss.item()) / abs(loss.item())
            if not rel <= TOL:
                raise SystemExit(f"{name} {schedule}: loss {report['loss']} vs torch {loss.item()}")
            worst = max(worst, compare(f"{name} {schedule} chunk {chunk}", st.load(out), expected))
            checks += 1
            print(f"{name:22s} {schedule:10s} chunk {chunk} loss {report['loss']:.12f} "
                  f"(torch {loss.item():.12f}) worst gradient rel. error so far {worst:.2e}")
    return checks, worst


def run_logprobs(tool, model_dir, batch_path, out, extra=()):
    cmd = [tool, "logprobs", "--model", model_dir, "--batch", batch_path, "--out", out,
           "--dtype", "f64", "--chunk", "4", *extra]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr}")
    report = json.loads(run.stdout.strip().splitlines()[-1])
    if not report["peak_activation_bytes"] > 0:
        raise SystemExit(f"logprobs reported no peak: {report}")
    return st.load(out)


def packed_objectives_and_logprobs(tool, work, cfg, worst):
    """Packed GRPO and DPO (every document one completion / one chosen or rejected sequence;
    the torch reference runs every document as a row of its own), and `tightfit logprobs`:
    its log-probs against torch's, and the round trip into `tightfit grad`."""
    model_dir = os.path.join(work, "llama")
    model = Model(cfg, seed=len("llama"))
    ref_model = Model(cfg, seed=99)  # the reference policy of the logprobs round trip
    ref_dir = os.path.join(work, "llama-ref")
    os.makedirs(ref_dir, exist_ok=True)
    with open(os.path.join(ref_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    st.save(os.path.join(ref_dir, "model.safetensors"),
            {k: v.detach() for k, v in ref_model.params.items()})
    g = torch.Generator().manual_seed(23)
    V, eos, checks = cfg["vocab_size"], 3, 0

    # GRPO: 5 completions in 2 rows of 20 (the second padded), chunks 4 and 7 cross documents
    docs = random_docs(g, [4, 7, 9, 6, 5], V, eos=eos)
    rows = [[0, 1, 2], [3, 4]]
    flat = unpack(docs, ["input_ids", "labels"])
    with torch.no_grad():
        lp0, valid = token_logprobs(model, flat["input_ids"], flat["labels"], flat["lengths"], 0.9)
    for i, d in enumerate(docs):
        n = len(d["input_ids"])
        d["old_logprobs"] = torch.zeros(n)
        d["old_logprobs"][1:] = lp0[i, :n - 1] + 0.3 * torch.randn(n - 1, generator=g)
        d["ref_logprobs"] = torch.zeros(n)
        d["ref_logprobs"][1:] = lp0[i, :n - 1] + 0.2 * torch.randn(n - 1, generator=g)
    keys = ["input_ids", "labels", "old_logprobs", "ref_logprobs"]
    packed = pack(docs, rows, 20, keys)
    packed["advantages"] = torch.tensor([0.9, -1.1, 0.4, -0.3, 1.5])  # per document
    flat = unpack(docs, keys)
    flat["advantages"] = packed["advantages"]
    batch_path = os.path.join(work, "packed-grpo.safetensors")
    st.save(batch_path, packed)
    base = {"beta": 0.04, "epsilon_low": 0.2, "epsilon_high": 0.28, "temperature": 0.9}
    for name, opts in (
            ("packed grpo gspo", dict(base, loss_type="grpo", importance_sampling_level="sequence")),
            ("packed grpo dapo trunc", dict(base, loss_type="dapo", delta=1.2,
                                            mask_truncated_completions=True, eos_token_id=eos)),
            ("packed grpo dr_grpo", dict(base, loss_type="dr_grpo"))):
        tool_opts = dict(opts)
        if opts["loss_type"] == "dr_grpo":  # L_max: the unpacked reference's T
            tool_opts["max_completion_length"] = flat["input_ids"].shape[1]
        loss = grpo_loss(model, flat, opts)
        more, worst = check_case(tool, model, model_dir, name.replace(" ", "-"), batch_path,
                                 "grpo", tool_opts, loss, worst)
        checks += more

    # DPO: 3 pairs; chosen documents in 2 rows of 14 (the second padded), rejected in 1 row
    chosen = random_docs(g, [5, 9, 8], V)
    rejected = random_docs(g, [6, 4, 4], V)
    pc = pack(chosen, [[0, 1], [2]], 14, ["input_ids", "labels"])
    pr = pack(rejected, [[0, 1, 2]], 14, ["input_ids", "labels"])
    packed = {"chosen_" + k: v for k, v in pc.items()}
    packed.update({"rejected_" + k: v for k, v in pr.items()})
    fc, fr = unpack(chosen, ["input_ids", "labels"]), unpack(rejected, ["input_ids", "labels"])
    flat = {"chosen_" + k: v for k, v in fc.items()}
    flat.update({"rejected_" + k: v for k, v in fr.items()})
    with torch.no_grad():  # the reference model's sums, computed here by torch
        for side, f in (("chosen", fc), ("rejected", fr)):
            lp, m = token_logprobs(ref_model, f["input_ids"], f["labels"], f["lengths"], 1.0)
            flat[f"ref_{side}_logps"] = (lp * m).sum(-1)
    free = os.path.join(work, "packed-dpo-free.safetensors")
    st.save(free, packed)
    opts = {"beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.1, "rpo_alpha": 0.5}
    # the round trip: tightfit logprobs writes the reference sums into the batch
    with_ref = os.path.join(work, "packed-dpo-ref.safetensors")
    written = run_logprobs(tool, ref_dir, free, with_ref)
    for side in ("chosen", "rejected"):
        got, want = written[f"ref_{side}_logps"], flat[f"ref_{side}_logps"]
        diff = (got - want).abs().max().item() / want.abs().max().item()
        if not diff <= TOL:
            raise SystemExit(f"logprobs ref_{side}_logps {got} vs torch {want}")
    more, worst = check_case(tool, model, model_dir, "packed-dpo-logprobs", with_ref, "dpo", opts,
                             dpo_loss(model, flat, opts), worst)
    checks += more
    opts = {"beta": 0.3, "loss_type": "orpo"}
    more, worst = check_case(tool, model, model_dir, "packed-dpo-orpo", free, "dpo", opts,
                             dpo_loss(model, flat, opts), worst)
    checks += more

    # logprobs of an unpacked GRPO batch (ref and --as old) against torch, to 1e-9
    ids, labels, mask = make_batch(g, 3, 11, V, [11, 7, 9])
    plain = os.path.join(work, "logprobs-grpo.safetensors")
    st.save(plain, {"input_ids": ids, "labels": labels, "attention_mask": mask,
                    "advantages": torch.tensor([1.0, -1.0, 0.5])})
    with torch.no_grad():
        lp, m = token_logprobs(ref_model, ids, labels, mask.sum(-1), 0.7)
    for as_key in ("ref", "old"):
        out = run_logprobs(tool, ref_dir, plain, os.path.join(work, f"lp-{as_key}.safetensors"),
                           ["--as", as_key, "--temperature", "0.7"])
        got = out[f"{as_key}_logprobs"][:, 1:] * m
        diff = (got - lp * m).abs().max().item() / (lp * m).abs().max().item()
        if not diff <= TOL or not torch.equal(out["input_ids"], ids):
            raise SystemExit(f"logprobs {as_key}_logprobs differ from torch by {diff:.3e}")
        checks += 1
        print(f"logprobs grpo --as {as_key:3s}    log-probs rel. error {diff:.2e}")
    return checks, worst


if __name__ == "__main__":
    main()
