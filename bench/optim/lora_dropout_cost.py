#!/usr/bin/env python3
"""LoRA dropout's cost in `tightfit train`: --lora-dropout 0.1 against 0, alternated, CPU time.

    python3 bench/optim/lora_dropout_cost.py TIGHTFIT [--runs 7] [--workdir DIR]

The small preset (hidden 512, 4 layers, vocabulary 8192), LoRA r = 8 on all seven projections,
2 rows of T = 256 random tokens a step, 4 steps, the stream schedule. Each run's CPU time (user +
sys of the child) and peak RSS; the two commands alternate, so a busy machine slows both alike,
and the figure is the paired ratio of CPU times (median, min, max). docs/benchmarks.md "LoRA
dropout's cost" records a run.
"""
import argparse
import json
import os
import random
import statistics
import struct
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("tool")
ap.add_argument("--runs", type=int, default=7)
ap.add_argument("--workdir", default=None)
args = ap.parse_args()
work = args.workdir or tempfile.mkdtemp(prefix="lora-dropout-")
os.makedirs(work, exist_ok=True)

# 8 rows of T = 256 random ids below 1000 (input_ids = labels), a safetensors file by hand
rng = random.Random(1)
n, t = 8, 256
raw = struct.pack("<%dq" % (n * t), *[rng.randrange(1000) for _ in range(n * t)])
header = {"input_ids": {"dtype": "I64", "shape": [n, t], "data_offsets": [0, len(raw)]},
          "labels": {"dtype": "I64", "shape": [n, t], "data_offsets": [len(raw), 2 * len(raw)]}}
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
data = os.path.join(work, "d.safetensors")
with open(data, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + raw + raw)

base = [args.tool, "train", "--preset", "small", "--data", data, "--optimizer", "lora",
        "--target-modules", "all-linear", "--steps", "4", "--batch", "2", "--quiet"]
commands = {"dropout 0.1": base + ["--lora-dropout", "0.1"], "dropout 0": base}


def measure(cmd):
    pid = subprocess.Popen(cmd, stdout=subprocess.DEVNULL).pid
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {status}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


cpu = {k: [] for k in commands}
rss = {k: [] for k in commands}
for _ in range(args.runs):
    for k, cmd in commands.items():
        c, r = measure(cmd)
        cpu[k].append(c)
        rss[k].append(r)
ratios = [a / b for a, b in zip(cpu["dropout 0.1"], cpu["dropout 0"])]
print("| | CPU s (median of %d) | peak RSS MiB (median) |" % args.runs)
print("|---|---|---|")
for k in commands:
    print(f"| {k} | {statistics.median(cpu[k]):.3f} | {statistics.median(rss[k]):.1f} |")
print(f"| ratio (paired, min - max) | {statistics.median(ratios):.3f} "
      f"({min(ratios):.3f} - {max(ratios):.3f}) | |")
