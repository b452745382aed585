#!/usr/bin/python3
"""tightfit against PyTorch on the identical model, weights and batch, side by side.

One command measures one forward+backward step (SFT, float32, B = 1) of the qwen3-bench model
(hidden 512, 8 layers, 8/2 heads, head_dim 64, intermediate 1536, vocab 32768, q/k-norm) for
each T: tightfit's full / checkpoint / stream schedules (`tightfit grad`) and PyTorch's full
backprop and per-layer checkpointing (torch.utils.checkpoint), each row in a fresh process so
that its peak RSS is its own. The model and batch are written once per T as config.json +
model.safetensors + batch.safetensors and read by both sides; the losses must agree to 1e-4.

PyTorch runs with 2 threads, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (the BLAS kernel it
picked is printed), the attention of transformers' eager Llama/Qwen3 code (PyTorch 1.13 has no
fused attention), and stops at a 20 GiB data limit ("> 20 GiB").

usage: peers.py TIGHTFIT_BINARY [--seq 1024,2048,4096] [--csv FILE] [--plot FILE.png]
                [--chunk 512] [--rows full,checkpoint,stream,torch-full,torch-checkpoint]
       peers.py --from-csv A.csv,B.csv [--plot FILE.png]   (the table and plot of earlier runs)
Internal: peers.py --torch-row MODE DIR   (one PyTorch measurement, JSON on stdout)
"""
import argparse
import ctypes
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))

LIMIT_BYTES = 20 * 2**30
CONFIG = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=32768,
              hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
              rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu",
              max_position_embeddings=131072)


def export(directory, seq, seed=1):
    """Random weights (std 0.02, norms 1) and a batch of T random tokens, all supervised."""
    import torch
    import st
    g = torch.Generator().manual_seed(seed)
    c = CONFIG
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    h, hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    p = {}

    def mat(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * 0.02

    p["model.embed_tokens.weight"] = mat(v, d)
    for l in range(c["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        p[pre + "input_layernorm.weight"] = torch.ones(d)
        p[pre + "self_attn.q_proj.weight"] = mat(h * hd, d)
        p[pre + "self_attn.k_proj.weight"] = mat(hkv * hd, d)
        p[pre + "self_attn.v_proj.weight"] = mat(hkv * hd, d)
        p[pre + "self_attn.o_proj.weight"] = mat(d, h * hd)
        p[pre + "self_attn.q_norm.weight"] = torch.ones(hd)
        p[pre + "self_attn.k_norm.weight"] = torch.ones(hd)
        p[pre + "post_attention_layernorm.weight"] = torch.ones(d)
        p[pre + "mlp.gate_proj.weight"] = mat(f, d)
        p[pre + "mlp.up_proj.weight"] = mat(f, d)
        p[pre + "mlp.down_proj.weight"] = mat(d, f)
    p["model.norm.weight"] = torch.ones(d)
    p["lm_head.weight"] = mat(v, d)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as out:
        json.dump(c, out)
    st.save(os.path.join(directory, "model.safetensors"), p)
    ids = torch.randint(0, v, (1, seq), generator=g)
    st.save(os.path.join(directory, "batch.safetensors"),
            {"input_ids": ids, "labels": ids.clone(),
             "attention_mask": torch.ones(1, seq, dtype=torch.int64)})


def blas_kernel():
    """The OpenBLAS core the process runs (openblas_get_corename), or what is known."""
    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "openblas" in line and ".so" in line})
        for lib in libs:
            handle = ctypes.CDLL(lib)
            for fn in ("openblas_get_corename", "openblas_get_corename64_"):
                if hasattr(handle, fn):
                    getattr(handle, fn).restype = ctypes.c_char_p
                    return f"OpenBLAS {getattr(handle, fn)().decode()} ({os.path.basename(lib)})"
        return "no OpenBLAS loaded: " + ", ".join(libs)
    except OSError as e:
        return f"unknown ({e})"


def torch_row(mode, directory):
    """One PyTorch forward+backward; prints JSON (seconds, loss, blas)."""
    resource.setrlimit(resource.RLIMIT_DATA, (LIMIT_BYTES, LIMIT_BYTES))
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint
    import st
    torch.set_num_threads(2)
    c = CONFIG
    h, hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    P = {k: t.requires_grad_(True) for k, t in st.load(os.path.join(directory, "model.safetensors")).items()}
    batch = st.load(os.path.join(directory, "batch.safetensors"))
    ids, labels = batch["input_ids"], batch["labels"]
    B, T = ids.shape
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.full((T, T), float("-inf")).triu(1)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def layer(x, l):
        pre = f"model.layers.{l}."
        a = rms(x, P[pre + "input_layernorm.weight"])
        q = F.linear(a, P[pre + "self_attn.q_proj.weight"]).view(B, T, h, hd).transpose(1, 2)
        k = F.linear(a, P[pre + "self_attn.k_proj.weight"]).view(B, T, hkv, hd).transpose(1, 2)
        v = F.linear(a, P[pre + "self_attn.v_proj.weight"]).view(B, T, hkv, hd).transpose(1, 2)
        q = rope(rms(q, P[pre + "self_attn.q_norm.weight"]))
        k = rope(rms(k, P[pre + "self_attn.k_norm.weight"]))
        k = k.repeat_interleave(h // hkv, dim=1)  # transformers' repeat_kv
        v = v.repeat_interleave(h // hkv, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd) + causal
        o = torch.matmul(s.softmax(-1), v).transpose(1, 2).reshape(B, T, h * hd)
        x = x + F.linear(o, P[pre + "self_attn.o_proj.weight"])
        m = rms(x, P[pre + "post_attention_layernorm.weight"])
        act = F.silu(F.linear(m, P[pre + "mlp.gate_proj.weight"])) * F.linear(m, P[pre + "mlp.up_proj.weight"])
        return x + F.linear(act, P[pre + "mlp.down_proj.weight"])

    start = time.perf_counter()
    try:
        x = P["model.embed_tokens.weight"][ids]
        for l in range(c["num_hidden_layers"]):
            if mode == "checkpoint":
                x = torch.utils.checkpoint.checkpoint(layer, x, l, use_reentrant=False)
            else:
                x = layer(x, l)
        logits = F.linear(rms(x, P["model.norm.weight"]), P["lm_head.weight"])
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, c["vocab_size"]), labels[:, 1:].reshape(-1),
                               ignore_index=-100)
        loss.backward()
    except (MemoryError, RuntimeError) as e:
        print(json.dumps({"error": f"out of memory at the {LIMIT_BYTES >> 30} GiB limit ({type(e).__name__})"}))
        return
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "loss": loss.item(), "blas": blas_kernel()}))


# The row runs as the child of a fresh, small interpreter: Linux carries a process's peak RSS
# across fork and exec (exec keeps the larger of the old and new address space's high-water
# mark), so a row forked from this script, which holds PyTorch and the exported tensors
# (about 0.7 GiB), would report at least that much whatever it used itself.
LAUNCHER = """import os, sys
fd, cmd = int(sys.argv[1]), sys.argv[2:]
pid = os.fork()
if pid == 0:
    os.close(fd)
    os.execvp(cmd[0], cmd)
_, status, usage = os.wait4(pid, 0)
os.write(fd, f"{usage.ru_maxrss * 1024} {usage.ru_utime + usage.ru_stime}".encode())
sys.exit(os.waitstatus_to_exitcode(status))
"""


def measured(cmd, env=None):
    """Runs cmd; returns (stdout, stderr, status, peak RSS bytes, CPU seconds of cmd's own process)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        rss_read, rss_write = os.pipe()
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(rss_write)] + cmd,
                                stdout=out, stderr=err, env=env, text=True,
                                pass_fds=(rss_write,))
        os.close(rss_write)
        with os.fdopen(rss_read) as r:
            rss, cpu = (r.read() or "0 0").split()
        proc.wait()
        out.seek(0)
        err.seek(0)
        return out.read(), err.read(), proc.returncode, int(rss), float(cpu)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--torch-row":
        torch_row(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tightfit", nargs="?")
    ap.add_argument("--seq", default="1024,2048,4096")
    ap.add_argument("--chunk", default="512")
    ap.add_argument("--rows", default="full,checkpoint,stream,torch-full,torch-checkpoint")
    ap.add_argument("--csv")
    ap.add_argument("--plot")
    ap.add_argument("--workdir")
    ap.add_argument("--from-csv", help="no measuring: the table and plot of earlier --csv files (comma-separated)")
    args = ap.parse_args()
    rows = args.rows.split(",")
    if args.from_csv:
        results = [r for path in args.from_csv.split(",") for r in read_csv(path)]
        seqs = sorted({r["T"] for r in results})
    elif args.tightfit:
        seqs = [int(s) for s in args.seq.split(",")]
        results = measure_all(args, seqs, rows)
    else:
        ap.error("give the tightfit binary to measure, or --from-csv")
    print_table(results, seqs, rows)
    if args.csv:
        write_csv(args.csv, results)
    if args.plot:
        plot(args.plot, results, rows)


def measure_all(args, seqs, rows):
    work = args.workdir or tempfile.mkdtemp(prefix="tightfit-peers-")
    torch_env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    results = []
    blas = None
    for seq in seqs:
        directory = os.path.join(work, f"T{seq}")
        export(directory, seq)
        for row in rows:
            if row.startswith("torch-"):
                cmd = [sys.executable, os.path.abspath(__file__), "--torch-row", row[6:], directory]
                out, err, status, rss, cpu = measured(cmd, torch_env)
            else:
                cmd = [args.tightfit, "grad", "--model", directory, "--batch",
                       os.path.join(directory, "batch.safetensors"), "--objective", "sft",
                       "--sched", row, "--chunk", args.chunk, "--dtype", "f32"]
                out, err, status, rss, cpu = measured(cmd)
            line = out.strip().splitlines()[-1] if out.strip() else "{}"
            report = json.loads(line) if status == 0 else {"error": err.strip().splitlines()[-1:] or status}
            if "blas" in report:
                blas = report["blas"]
            ok = "error" not in report
            results.append(dict(T=seq, row=row, seconds=report.get("seconds"), loss=report.get("loss"),
                                rss=rss if ok else None, cpu=cpu if ok else None, error=report.get("error")))
            r = results[-1]
            print(f"T {seq:6d} {row:17s} " + (f"{r['seconds']:8.2f} s  {cpu:8.2f} CPU-s  {rss / 2**20:8.0f} MiB  loss {r['loss']:.6f}"
                                             if r["seconds"] is not None else f"{r['error']}"), flush=True)
    # Losses agree?
    for seq in seqs:
        losses = [r["loss"] for r in results if r["T"] == seq and r["loss"] is not None]
        if losses and max(losses) - min(losses) > 1e-4 * max(abs(x) for x in losses):
            raise SystemExit(f"T {seq}: the losses differ beyond 1e-4: {losses}")
    print(f"\nPyTorch BLAS: {blas}")
    return results


def print_table(results, seqs, rows):
    print("\n| T | " + " | ".join(rows) + " | stream / torch-checkpoint (time, RSS) |")
    print("|---:|" + "---:|" * (len(rows) + 1))
    for seq in seqs:
        cells, by = [], {r["row"]: r for r in results if r["T"] == seq}
        for row in rows:
            r = by.get(row)
            cells.append(f"{r['seconds']:.2f} s, {r['rss'] / 2**30:.2f} GiB" if r and r["seconds"] else "> 20 GiB"
                         if r and r["error"] else "-")
        s, c = by.get("stream"), by.get("torch-checkpoint")
        ratio = (f"{s['seconds'] / c['seconds']:.2f}x, {s['rss'] / c['rss']:.3f}x"
                 if s and c and s["seconds"] and c["seconds"] else "-")
        if ratio != "-" and s.get("cpu") and c.get("cpu"):
            ratio += f" (process CPU-s {s['cpu']:.0f} / {c['cpu']:.0f} = {s['cpu'] / c['cpu']:.2f}x)"
        print(f"| {seq} | " + " | ".join(cells) + f" | {ratio} |")


def write_csv(path, results):
    with open(path, "w") as out:
        out.write("T,row,seconds,peak_rss_bytes,loss,error,cpu_seconds\n")
        for r in results:
            out.write(f"{r['T']},{r['row']},{r['seconds'] or ''},{r['rss'] or ''},{r['loss'] or ''},{r['error'] or ''},"
                      f"{r.get('cpu') or ''}\n")


def read_csv(path):
    import csv
    number = lambda text, kind: kind(text) if text else None
    with open(path) as f:
        return [dict(T=int(r["T"]), row=r["row"], seconds=number(r["seconds"], float),
                     rss=number(r["peak_rss_bytes"], int), loss=number(r["loss"], float), error=r["error"] or None,
                     cpu=number(r.get("cpu_seconds"), float))
                for r in csv.DictReader(f)]


def plot(path, results, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for row in rows:
        pts = sorted((r["T"], r["seconds"], r["rss"]) for r in results if r["row"] == row and r["seconds"])
        if not pts:
            continue
        a1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=row)
        a2.plot([p[0] for p in pts], [p[2] / 2**30 for p in pts], marker="o", label=row)
    a1.set(xlabel="T (tokens)", ylabel="seconds per step", xscale="log", yscale="log", title="time")
    a2.set(xlabel="T (tokens)", ylabel="peak RSS (GiB)", xscale="log", yscale="log", title="memory")
    a1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)

if __name__ == "__main__":
    main()
