#!/usr/bin/python3
"""PyTorch beside tightfit on the GPU (scripts/gpu-check runs it), three subcommands:

yardstick --out FILE [--device cuda|cpu] [--seeds 3]
    PyTorch's own bf16 gradient error against fp64 on the CUDA tests' bf16 model configs (Qwen3
    shape with q/k-norm, 2 layers, 8/2 heads, hidden 64, head_dim 16; and the same with head_dim 64,
    4/2 heads, hidden 128, where tightfit's tensor-core attention runs), batch B = 2, T = 150,
    lengths 150 and 97, a fifth of the targets ignored, weights drawn as the tests draw them
    (normal, std 0.3; norm weights 1 + 0.2 normal). Per parameter tensor: max |g_bf16 - g_64| /
    max |g_64| (the tests' measure), g_64 from the unrounded weights in float64, g_bf16 from the
    same weights rounded to bf16 in pure bf16 (transformers' Qwen3ForCausalLM when transformers is
    installed, else the plain-PyTorch Qwen3 below: RMSNorm and softmax in fp32, as transformers
    computes them), the max over --seeds draws. Writes FILE: one line per tensor,
    "config name error", which tests/cuda reads (TIGHTFIT_BF16_YARDSTICK) to bound tightfit's
    bf16 gradients by 1.25 x PyTorch's per tensor; autocast's errors (fp32 weights, bf16
    matmuls) are printed beside, not written.

sft --seq 4096,32768 [--layers 2] [--csv FILE] [--modes plain,checkpointing]
    One SFT step (forward + backward, B = 1, random weights and tokens) of the Qwen3-4B shape
    (hidden 2560, 32/8 heads, head_dim 128, intermediate 9728, vocab 151936, tied embeddings)
    in transformers (bf16, attn_implementation="sdpa"), with and without
    gradient_checkpointing_enable(), per T: seconds (CUDA-synchronised), peak allocated bytes,
    activation bytes (peak minus parameters and gradients), loss. Rows "section,name,value,unit"
    as bench_cuda writes them; an out-of-memory step is a row with value -1.

bisect --layers 36 --budget-gib 80 [--csv FILE] [--lo 8192] [--hi 131072] [--steps 5]
    The longest T (a multiple of 1024) at which one SFT step of the full model with
    gradient checkpointing fits --budget-gib (torch.cuda.set_per_process_memory_fraction),
    by bisection in at most --steps trials between --lo and --hi.

Needs torch (>= 1.13 for yardstick on the CPU; CUDA and transformers for sft and bisect).
"""
import argparse
import gc
import math
import sys
import time

import torch

TEST_CONFIGS = {
    # tests/support/model_configs.hpp: small_gqa_config(301)
    "small_gqa": dict(vocab_size=301, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False),
    # the same with head_dim 64 (tightfit's tensor-core attention)
    "small_gqa_hd64": dict(vocab_size=301, hidden_size=128, intermediate_size=192,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                           tie_word_embeddings=False),
}
QWEN3_4B = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=1 << 20)
IGNORE = -100


def param_shapes(c):
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    h, hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, d)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (h * hd, d),
            p + "self_attn.k_proj.weight": (hkv * hd, d),
            p + "self_attn.v_proj.weight": (hkv * hd, d),
            p + "self_attn.o_proj.weight": (d, h * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        })
    shapes["model.norm.weight"] = (d,)
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    return shapes


def random_weights(c, seed):
    """The tests' draw (nn/model.hpp init_random(seed, 0.3, 0.2)): normal(0, 0.3), norm weights
    1 + 0.2 normal; float64, not rounded."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in param_shapes(c).items():
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        out[name] = 1 + 0.2 * x if name.endswith("norm.weight") else 0.3 * x
    return out


def test_batch(c, seed):
    """B = 2, T = 150, lengths (150, 97), a fifth of the targets ignored: (ids, targets, lengths)."""
    g = torch.Generator().manual_seed(1000 + seed)
    B, T, v = 2, 150, c["vocab_size"]
    ids = torch.randint(0, v, (B, T), generator=g)
    targets = torch.randint(0, v, (B, T), generator=g)
    targets[torch.rand(B, T, generator=g) < 0.2] = IGNORE
    return ids, targets, torch.tensor([150, 97])


class PlainQwen3:
    """Qwen3 forward in plain PyTorch for any dtype: RMSNorm in fp32 (cast back, then times the
    weight), RoPE cos/sin in fp32, attention scores' softmax in fp32 (transformers' eager path),
    causal plus right padding."""

    def __init__(self, c, params):
        self.c, self.p = c, params

    def rms(self, x, w):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"])
        return w * y.to(x.dtype)

    def logits(self, ids, lengths):
        c, p = self.c, self.p
        B, T = ids.shape
        h, hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        dt = p["model.embed_tokens.weight"].dtype
        x = p["model.embed_tokens.weight"][ids]
        inv = 1.0 / c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], -1)
        if dt != torch.float64:  # transformers computes cos / sin in fp32, then casts
            emb = emb.float()
        dev = ids.device
        cos, sin = emb.cos().to(device=dev, dtype=dt), emb.sin().to(device=dev, dtype=dt)

        def rope(t):
            t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
            return t * cos + torch.cat([-t2, t1], -1) * sin

        keys = torch.arange(T, device=dev)
        allowed = (keys[None, :] <= keys[:, None])[None, :, :] & \
            (keys[None, None, :] < lengths[:, None, None])
        # a padded row keeps the keys below its length (never all masked)
        for l in range(c["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            a = self.rms(x, p[pre + "input_layernorm.weight"])
            q = (a @ p[pre + "self_attn.q_proj.weight"].T).view(B, T, h, hd)
            k = (a @ p[pre + "self_attn.k_proj.weight"].T).view(B, T, hkv, hd)
            v = (a @ p[pre + "self_attn.v_proj.weight"].T).view(B, T, hkv, hd)
            q = rope(self.rms(q, p[pre + "self_attn.q_norm.weight"]).transpose(1, 2))
            k = rope(self.rms(k, p[pre + "self_attn.k_norm.weight"]).transpose(1, 2))
            v = v.transpose(1, 2)
            k = k.repeat_interleave(h // hkv, 1)
            v = v.repeat_interleave(h // hkv, 1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(~allowed[:, None], float("-inf"))
            pr = torch.softmax(s, -1, dtype=torch.float32 if dt != torch.float64 else dt).to(dt)
            o = (pr @ v).transpose(1, 2).reshape(B, T, h * hd)
            x = x + o @ p[pre + "self_attn.o_proj.weight"].T
            a = self.rms(x, p[pre + "post_attention_layernorm.weight"])
            g = a @ p[pre + "mlp.gate_proj.weight"].T
            u = a @ p[pre + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ p[pre + "mlp.down_proj.weight"].T
        x = self.rms(x, p["model.norm.weight"])
        head = p.get("lm_head.weight", p["model.embed_tokens.weight"])
        return x @ head.T


def hf_model(c, params, dtype, device):
    """transformers' Qwen3ForCausalLM with these weights (None without transformers)."""
    try:
        import transformers
    except ImportError:
        return None
    cfg = transformers.Qwen3Config(**c, attention_bias=False, hidden_act="silu",
                                   max_position_embeddings=4096)
    model = transformers.Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype)
    state = {k: v.to(dtype) for k, v in params.items()}
    # strict: a name that did not load would leave random weights and a meaningless yardstick
    model.load_state_dict(state, strict=not c["tie_word_embeddings"])
    if c["tie_word_embeddings"]:
        model.tie_weights()
    return model


def sft_loss(logits, targets, lengths):
    """Mean NLL over counted tokens (target not ignored, position below the length), in fp32 or
    better."""
    B, T, V = logits.shape
    counted = (targets != IGNORE) & (torch.arange(T)[None, :].to(lengths.device) < lengths[:, None])
    lf = logits.float() if logits.dtype != torch.float64 else logits
    lp = torch.log_softmax(lf, -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return -(lp * counted).sum() / counted.sum()


def gradients(c, weights, dtype, device, autocast=False, impl="plain"):
    """({name: grad (float64, cpu)}, loss) of the SFT loss on the test batch (weights rounded
    to dtype)."""
    ids, targets, lengths = weights["__batch"]
    params = {k: (v.float() if autocast else v.to(dtype)).detach().clone().to(device)
              .requires_grad_(True)
              for k, v in weights.items() if not k.startswith("__")}
    ids, targets, lengths = ids.to(device), targets.to(device), lengths.to(device)
    ctx = torch.autocast(device_type=device, dtype=torch.bfloat16) if autocast else None
    if impl == "hf" and dtype != torch.float64:
        model = hf_model(c, {k: v.detach() for k, v in params.items()}, params[
            "model.embed_tokens.weight"].dtype, device)
        keys = torch.arange(ids.shape[1], device=device)[None, :]
        mask = (keys < lengths[:, None]).long()
        if ctx:
            with ctx:
                logits = model(input_ids=ids, attention_mask=mask).logits
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits
        loss = sft_loss(logits, targets, lengths)
        loss.backward()
        named = dict(model.named_parameters())
        return {k: named[k].grad.double().cpu() for k in params if k in named}, loss.item()
    m = PlainQwen3(c, params)
    if ctx:
        with ctx:
            logits = m.logits(ids, lengths)
    else:
        logits = m.logits(ids, lengths)
    loss = sft_loss(logits, targets, lengths)
    loss.backward()
    return {k: v.grad.double().cpu() for k, v in params.items()}, loss.item()


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).item()


def yardstick(args):
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_cuda.py yardstick: no CUDA device (use --device cpu)")
    try:
        import transformers  # noqa: F401
        impl = "hf"
    except ImportError:
        impl = "plain"
    lines = []
    for name, c in TEST_CONFIGS.items():
        worst, worst_ac = {}, {}
        for seed in range(args.seeds):
            w = random_weights(c, seed)
            w["__batch"] = test_batch(c, seed)
            # the reference runs in float64 on the CPU (CUDA float64 would do as well)
            ref, ref_loss = gradients(c, w, torch.float64, "cpu")
            got, got_loss = gradients(c, w, torch.bfloat16, device, impl=impl)
            ac, _ = gradients(c, w, torch.bfloat16, device, autocast=True, impl="plain")
            # the same model in both precisions, or the yardstick means nothing
            if abs(got_loss - ref_loss) > 0.05 * abs(ref_loss) or set(got) != set(ref):
                sys.exit(f"yardstick: {name} seed {seed}: the bf16 model ({impl}) disagrees with "
                         f"fp64: loss {got_loss} against {ref_loss}, tensors "
                         f"{sorted(set(ref) ^ set(got))}")
            for k in ref:
                worst[k] = max(worst.get(k, 0.0), rel_err(got[k], ref[k]))
                worst_ac[k] = max(worst_ac.get(k, 0.0), rel_err(ac[k], ref[k]))
        for k in worst:
            print(f"yardstick {name:16s} {k:48s} bf16 {worst[k]:.4e}  autocast {worst_ac[k]:.4e}")
            lines.append(f"{name} {k} {worst[k]:.6e}")
        vals = sorted(worst.values())
        print(f"yardstick {name}: pure bf16 ({impl}) max {vals[-1]:.4e} median "
              f"{vals[len(vals) // 2]:.4e} over {len(vals)} tensors, {args.seeds} seeds")
    with open(args.out, "w") as f:
        f.write(f"# torch {torch.__version__} {impl} {device}: config tensor max_rel_err\n")
        f.write("\n".join(lines) + "\n")
    print(f"yardstick: wrote {args.out}")


class Rows:
    def __init__(self, path):
        self.f = open(path, "a") if path else None

    def add(self, section, name, value, unit):
        print(f"{section:12s} {name:60s} {value:16.4f} {unit}", flush=True)
        if self.f:
            self.f.write(f"{section},{name},{value},{unit}\n")
            self.f.flush()


def from_config(cfg, dtype):
    """A Qwen3ForCausalLM from cfg with SDPA attention and dtype, built on the current default
    device: AutoModelForCausalLM.from_config (transformers 5: dtype=, 4.x: torch_dtype=), else
    the class itself."""
    import transformers
    for kw in ("dtype", "torch_dtype"):
        try:
            return transformers.AutoModelForCausalLM.from_config(
                cfg, attn_implementation="sdpa", **{kw: dtype})
        except (TypeError, ValueError):
            continue
    cfg._attn_implementation = "sdpa"
    return transformers.Qwen3ForCausalLM(cfg).to(dtype)


def qwen3_4b(layers):
    """transformers' Qwen3ForCausalLM of the Qwen3-4B shape, bf16, SDPA, built on the GPU."""
    import transformers
    cfg = transformers.Qwen3Config(**QWEN3_4B, num_hidden_layers=layers, attention_bias=False,
                                   hidden_act="silu", use_cache=False)
    with torch.device("cuda"):
        model = from_config(cfg, torch.bfloat16)
    impl = getattr(model.config, "_attn_implementation", "?")
    print(f"peers: {type(model).__name__}, {layers} layers, {model.dtype}, attention {impl}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}e9 parameters", flush=True)
    return model


def one_step(model, T, checkpointing):
    """(seconds, peak allocated, parameter + gradient bytes, loss) of one SFT step at T."""
    if checkpointing:
        model.gradient_checkpointing_enable()
    else:
        model.gradient_checkpointing_disable()
    model.train()
    model.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()
    g = torch.Generator(device="cuda").manual_seed(T)
    ids = torch.randint(0, model.config.vocab_size, (1, T), device="cuda", generator=g)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated()
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gbytes = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                 if p.grad is not None)
    out = (seconds, peak, pbytes + gbytes, loss.item())
    del loss, ids
    model.zero_grad(set_to_none=True)
    return out


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


def sft(args):
    rows = Rows(args.csv)
    model = qwen3_4b(args.layers)
    one_step(model, 1024, False)  # warm-up: kernels, cuBLAS handles, allocator
    for T in [int(t) for t in args.seq.split(",")]:
        for mode in args.modes.split(","):
            tag = f"pytorch {mode} T={T} layers={args.layers}"
            try:
                s, peak, pg, loss = one_step(model, T, mode == "checkpointing")
            except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                if not is_oom(e):
                    raise
                rows.add("peers", tag + " seconds", -1, "s (out of memory)")
                gc.collect()
                torch.cuda.empty_cache()
                continue
            rows.add("peers", tag + " seconds", s, "s")
            rows.add("peers", tag + " peak allocated", peak / 1e9, "GB")
            rows.add("peers", tag + " activation bytes", (peak - pg) / 1e9, "GB")
            rows.add("peers", tag + " loss", loss, "nats")


def bisect(args):
    rows = Rows(args.csv)
    total = torch.cuda.get_device_properties(0).total_memory
    budget = args.budget_gib * 2**30
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    model = qwen3_4b(args.layers)
    one_step(model, 1024, True)
    lo, hi = args.lo, args.hi  # lo is tried first; hi is an upper bound that is not tried
    best = 0
    for step in range(args.steps):
        T = lo if step == 0 else ((lo + hi) // 2) // 1024 * 1024
        if step > 0 and (T <= best or T >= hi):
            break
        try:
            s, peak, _, _ = one_step(model, T, True)
            rows.add("depth", f"pytorch checkpointing T={T} layers={args.layers} seconds", s, "s")
            rows.add("depth", f"pytorch checkpointing T={T} peak allocated", peak / 1e9, "GB")
            best = T
            lo = T
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            if not is_oom(e):
                raise
            rows.add("depth", f"pytorch checkpointing T={T} layers={args.layers}", -1,
                     "out of memory")
            hi = T
            if step == 0:
                lo = 0
        gc.collect()
        torch.cuda.empty_cache()
    rows.add("depth", f"pytorch checkpointing longest T ({args.budget_gib:g} GiB, "
             f"{args.layers} layers, bisection)", best, "tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    y = sub.add_parser("yardstick")
    y.add_argument("--out", required=True)
    y.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    y.add_argument("--seeds", type=int, default=3)
    s = sub.add_parser("sft")
    s.add_argument("--seq", default="4096,32768")
    s.add_argument("--layers", type=int, default=2)
    s.add_argument("--csv", default="")
    s.add_argument("--modes", default="checkpointing,plain")
    b = sub.add_parser("bisect")
    b.add_argument("--layers", type=int, default=36)
    b.add_argument("--budget-gib", type=float, default=80)
    b.add_argument("--csv", default="")
    b.add_argument("--lo", type=int, default=16384)
    b.add_argument("--hi", type=int, default=131072)
    b.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    {"yardstick": yardstick, "sft": sft, "bisect": bisect}[args.cmd](args)


if __name__ == "__main__":
    main()
