#!/usr/bin/python3
"""Plots peak activation memory (and peak RSS) against sequence length per schedule from the
CSV of bench_stream / `tightfit bench stream --csv`.

usage: plot_memory.py RESULTS.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for sched, style in (("full", "o-"), ("checkpoint", "s-"), ("stream", "^-")):
        pts = sorted((int(r["T"]), float(r["peak_activation_bytes"]) / 2**20, float(r["peak_rss_mib"]))
                     for r in rows if r["schedule"] == sched and r.get("objective", "sft") == "sft")
        if not pts:
            continue
        t = [p[0] for p in pts]
        axes[0].plot(t, [p[1] for p in pts], style, label=sched)
        axes[1].plot(t, [p[2] for p in pts], style, label=sched)
    for ax, title in zip(axes, ("peak activation bytes (library counter)", "process peak RSS")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("MiB")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("StreamBP vs checkpointing vs full backprop (qwen3-bench config, float, B=1)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
