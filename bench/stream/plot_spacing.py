#!/usr/bin/python3
"""The longest sequence each schedule fits against the activation budget, from the exact planner
(`tightfit plan`): checkpoint, stream, and stream with layer-input spacing (docs/streambp.md).

usage: plot_spacing.py TIGHTFIT_BINARY OUT.png [--csv FILE] [--preset qwen3-bench]
                       [--budgets 1,2,4,8,16]
Writes OUT.png, and FILE (budget_gib, checkpoint, stream, stream_spaced, keep_every) when given.
"""
import argparse
import re
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("tightfit")
ap.add_argument("out")
ap.add_argument("--preset", default="qwen3-bench")
ap.add_argument("--budgets", default="1,2,4,8,16")
ap.add_argument("--csv")
args = ap.parse_args()
rows = []
for gib in [float(b) for b in args.budgets.split(",")]:
    text = subprocess.run([args.tightfit, "plan", "--preset", args.preset, "--seq", "4096",
                           "--budget", f"{int(gib * 1024)}M"], capture_output=True, text=True,
                          check=True).stdout
    plain = re.search(r"largest T: full (\d+), checkpoint (\d+), stream (\d+)", text)
    spaced = re.search(r"spacing: checkpoint (\d+) \(keep_every (\d+)\), stream (\d+) \(keep_every (\d+)\)", text)
    rows.append((gib, int(plain[2]), int(plain[3]), int(spaced[3]), int(spaced[4])))
for r in rows:
    print(*r)
if args.csv:
    with open(args.csv, "w") as f:
        f.write("budget_gib,checkpoint,stream,stream_spaced,keep_every\n")
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 4))
b = [r[0] for r in rows]
ax.plot(b, [r[1] for r in rows], marker="o", label="checkpoint")
ax.plot(b, [r[2] for r in rows], marker="o", label="stream")
ax.plot(b, [r[3] for r in rows], marker="o", label="stream, layer-input spacing")
ax.set(xscale="log", yscale="log", xlabel="activation budget (GiB)", ylabel="longest T (tokens)",
       title=f"{args.preset}, float, B = 1 (exact planner)")
ax.legend()
fig.tight_layout()
fig.savefig(args.out, dpi=100)
