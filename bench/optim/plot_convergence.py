#!/usr/bin/python3
"""Plots the loss curves written by bench_optim (optim_convergence.csv) into a PNG.

usage: /usr/bin/python3 bench/optim/plot_convergence.py CSV PNG [--smooth N]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def moving_average(values, n):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= n:
            acc -= values[i - n]
        out.append(acc / min(i + 1, n))
    return out


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    smooth = int(argv[argv.index("--smooth") + 1]) if "--smooth" in argv else 10
    with open(argv[1], newline="") as f:
        rows = list(csv.reader(f))
    header, data = rows[0], rows[1:]
    steps = [int(r[0]) for r in data]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k, name in enumerate(header[1:], start=1):
        ax.plot(steps, moving_average([float(r[k]) for r in data], smooth), label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"SFT loss (moving average of {smooth})")
    ax.set_yscale("log")
    ax.set_title("Copy task from scratch: Adam vs BAdam vs BREAD")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
