#!/usr/bin/env python3
"""The summary table of a scripts/gpu-check run (no third-party modules).

usage: gpu_summary.py OUTDIR
Reads OUTDIR/{bench_cuda.csv, bench_model.csv, peers.csv, depth.csv, test_attention.txt,
test_cuda.txt, attention_check.txt, bf16_vs_pytorch.txt, tool_check.txt} (whichever exist) and
prints: the correctness verdicts,
the attention rate per engine and its fraction of the cuBLAS bf16 GEMM rate, the SFT step at
T = 32768 side by side with PyTorch (seconds, activation bytes, the issue's ratios), and the
full-depth probe against the plan and PyTorch's longest T. A missing figure prints as "-".
"""
import csv
import os
import re
import sys


def rows(path):
    """{name: (value, unit)} of a section,name,value,unit CSV."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for r in csv.reader(f):
            if len(r) < 4 or r[0] == "section":
                continue
            try:
                out[r[1]] = (float(r[2]), r[3])
            except ValueError:
                pass
    return out


def find(table, pattern):
    """The value of the first row whose name matches the regular expression, else None."""
    for name, (value, _) in table.items():
        if re.search(pattern, name):
            return value
    return None


def fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b <= 0 or a < 0 else a / b


def verdict(x, limit, below=True):
    if x is None:
        return "-"
    return "meets" if (x <= limit if below else x >= limit) else "misses"


def text(path):
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def doctest_status(path):
    t = text(path)
    m = re.findall(r"\[doctest\] test cases:.*", t)
    return m[-1].strip() if m else ("(no output)" if not t else "(no doctest summary: cut?)")


def attention_checks(path):
    """{engine: (worst rel, case, tensor)} over the attention-check lines against the reference."""
    worst = {}
    for line in text(path).splitlines():
        m = re.match(r"attention-check (.*?) \| (.*?)\s+(O|lse|dQ|dK|dV)\s+rel (\S+)", line)
        if not m or " vs " in m.group(2):
            continue
        case, engine, tensor, rel = m.group(1), m.group(2).strip(), m.group(3), float(m.group(4))
        if engine not in worst or rel > worst[engine][0] or rel != rel:
            worst[engine] = (rel, case, tensor)
    return worst


def bf16_ratios(path):
    """{(config, engine): (worst ratio tightfit / PyTorch, tensor)}."""
    worst = {}
    for line in text(path).splitlines():
        m = re.match(r"bf16-vs-pytorch (\S+)\s+(tc|cc)\s+(\S+)\s+tightfit (\S+) pytorch (\S+).*ratio (\S+)",
                     line)
        if not m:
            continue
        key, r = (m.group(1), m.group(2)), float(m.group(6))
        if key not in worst or r > worst[key][0]:
            worst[key] = (r, m.group(3))
    return worst


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    b = rows(os.path.join(d, "bench_cuda.csv"))
    b.update(rows(os.path.join(d, "bench_model.csv")))
    p = rows(os.path.join(d, "peers.csv"))
    z = rows(os.path.join(d, "depth.csv"))
    print(f"gpu-check summary ({d})")
    print("\ncorrectness")
    print(f"  attention tests   {doctest_status(os.path.join(d, 'test_attention.txt'))}")
    last = [l for l in text(os.path.join(d, "attention_check.txt")).splitlines()
            if l.startswith("attention-check")]
    if last and last[-1].startswith("attention-check start"):
        print(f"  the attention tests stopped during: {last[-1][len('attention-check start '):]}")
    print(f"  test_cuda (rest)  {doctest_status(os.path.join(d, 'test_cuda.txt'))}")
    print(f"  tool (cli_cuda)   {doctest_status(os.path.join(d, 'tool_check.txt'))}")
    for engine, (rel, case, tensor) in sorted(attention_checks(
            os.path.join(d, "attention_check.txt")).items()):
        print(f"  attention {engine:18s} worst rel err {rel:.3e} ({tensor}, {case}; limit 2e-2: "
              f"{verdict(rel, 2e-2)})")
    for (config, engine), (r, tensor) in sorted(bf16_ratios(
            os.path.join(d, "bf16_vs_pytorch.txt")).items()):
        print(f"  bf16 {config:15s} {engine}: worst tightfit/PyTorch error {r:.2f} ({tensor}; "
              f"limit 1.25: {verdict(r, 1.25)})")
    for t in ("O", "dQ", "dK", "dV"):
        x = find(b, rf"tensor cores vs cuda cores max rel diff {t}$")
        if x is not None:
            print(f"  T=8192 tensor cores vs CUDA cores, {t}: max rel diff {x:.3e}")

    gemm = find(b, r"^cuBLAS bf16")
    print(f"\nattention, T=8192, 32/8 heads, head_dim 128, causal (cuBLAS bf16 GEMM {fmt(gemm)} "
          f"TFLOP/s)")
    print(f"  {'engine':30s} {'fwd s':>9s} {'bwd s':>9s} {'TFLOP/s':>9s} {'of GEMM':>8s}")
    for e in ("tensor cores", "tensor cores deterministic", "tensor cores hd 64", "cuda cores"):
        fw = find(b, rf"^{e} T=\d+ forward seconds")
        bw = find(b, rf"^{e} T=\d+ backward seconds")
        rate = find(b, rf"^{e} T=\d+ forward\+backward rate")
        frac = find(b, rf"^{e} T=\d+ fraction")
        print(f"  {e:30s} {fmt(fw):>9s} {fmt(bw):>9s} {fmt(None if rate is None else rate / 1e3):>9s}"
              f" {fmt(frac, '.3f'):>8s}")
    frac = find(b, r"^fraction of the cuBLAS bf16 GEMM rate")
    print(f"  target: tensor cores >= 0.40 of the GEMM rate: {fmt(frac, '.3f')} ({verdict(frac, 0.40, False)})")

    m = next((re.search(r"T=(\d+) layers=(\d+)", n) for n in b if n.startswith("checkpoint T=")), None)
    T, L = (m.group(1), m.group(2)) if m else ("32768", "2")
    ck = find(b, rf"^checkpoint T={T} layers={L} seconds")
    st = find(b, rf"^stream T={T} layers={L} seconds")
    ck_a = find(b, rf"^checkpoint T={T} layers={L} activation peak")
    st_a = find(b, rf"^stream T={T} layers={L} activation peak")
    pc = find(p, rf"^pytorch checkpointing T={T} layers={L} seconds")
    pp = find(p, rf"^pytorch plain T={T} layers={L} seconds")
    pc_a = find(p, rf"^pytorch checkpointing T={T} layers={L} activation bytes")
    pp_a = find(p, rf"^pytorch plain T={T} layers={L} activation bytes")
    print(f"\none SFT step, T={T}, Qwen3-4B shape, {L} layers, bf16")
    print(f"  {'':22s} {'tightfit ckpt':>14s} {'tightfit stream':>16s} {'PyTorch ckpt':>13s} "
          f"{'PyTorch plain':>14s}")
    print(f"  {'seconds':22s} {fmt(ck):>14s} {fmt(st):>16s} {fmt(pc):>13s} {fmt(pp):>14s}")
    print(f"  {'activation GB':22s} {fmt(ck_a):>14s} {fmt(st_a):>16s} {fmt(pc_a):>13s} "
          f"{fmt(pp_a):>14s}")
    r1, r2, r3 = ratio(st, pc), ratio(ck, pc), ratio(st, ck)
    r4 = ratio(st_a, pc_a)
    print(f"  stream / PyTorch ckpt time   {fmt(r1)} (target <= 1.0: {verdict(r1, 1.0)})")
    print(f"  ckpt / PyTorch ckpt time     {fmt(r2)} (target <= 0.9: {verdict(r2, 0.9)})")
    print(f"  stream / ckpt time           {fmt(r3)} (target <= 1.1: {verdict(r3, 1.1)})")
    print(f"  stream / PyTorch ckpt bytes  {fmt(r4)} (target <= 1/30 = 0.0333: "
          f"{verdict(r4, 1 / 30)})")
    p4 = find(p, r"^pytorch checkpointing T=4096 layers=\d+ seconds")
    p4p = find(p, r"^pytorch plain T=4096 layers=\d+ seconds")
    if p4 is not None or p4p is not None:
        print(f"  (PyTorch at T=4096: checkpointing {fmt(p4)} s, plain {fmt(p4p)} s)")

    plan_st = find(b, r"^longest T stream") or find(z, r"^longest T stream")
    planned = find(z, r"planned activation bytes")
    act = find(z, r"^36 layers .* activation peak")
    dev = find(z, r"^36 layers .* counted device peak")
    pool = find(z, r"^36 layers .* memory pool used high-water")
    info = find(z, r"^36 layers .* cudaMemGetInfo used after")
    secs = find(z, r"^36 layers .* seconds")
    ptT = find(z, r"^pytorch checkpointing longest T")
    tag = next((n for n in z if n.startswith("36 layers") and n.endswith(" seconds")), "")
    tmatch = re.search(r"T=(\d+)", tag)
    depthT = float(tmatch.group(1)) if tmatch else None
    print("\nfull depth, 36 layers, stream, 80 GiB")
    print(f"  {tag[:-8] if tag else '(not run)'}")
    print(f"  planned activation GB {fmt(planned)}, measured activation peak GB {fmt(act)}, "
          f"device peak GB: counted {fmt(dev)}, pool {fmt(pool)}, cudaMemGetInfo {fmt(info)}, "
          f"budget {80 * 2**30 / 1e9:.1f} GB; seconds {fmt(secs)} (a windowed probe, not a step)")
    fits = None if info is None else info <= 80 * 2**30 / 1e9
    print(f"  fits 80 GiB (cudaMemGetInfo): {'-' if fits is None else ('yes' if fits else 'no')}; "
          f"planner's longest stream T {fmt(plan_st, '.0f')}")
    r5 = ratio(depthT, ptT)
    print(f"  PyTorch checkpointing's longest T {fmt(ptT, '.0f')}; stream / PyTorch "
          f"{fmt(r5)} (target >= 10 and stream >= 300k: {verdict(r5, 10, False)}, "
          f"{verdict(depthT, 300000, False)})")


if __name__ == "__main__":
    main()
