#!/usr/bin/python3
"""Plots loss curves written by bench_optim (optim_convergence*.csv) into one PNG, one panel
per CSV.

usage: /usr/bin/python3 bench/optim/plot_convergence.py PNG PANEL [PANEL ...] [--smooth N]
  PANEL: CSV or CSV@TITLE or CSV@TITLE@FLOOR. With a FLOOR (the task's irreducible loss, printed
  by bench_optim) the panel draws it as a dashed line (training losses on noisy labels scatter
  around it, so their difference is not plotted).
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


def panel(ax, spec, smooth):
    parts = spec.split("@")
    path = parts[0]
    title = parts[1] if len(parts) > 1 else path
    floor = float(parts[2]) if len(parts) > 2 else 0.0
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, data = rows[0], rows[1:]
    steps = [int(r[0]) for r in data]
    for k, name in enumerate(header[1:], start=1):
        # Clamp at a tiny positive value for the log axis.
        ys = [max(v, 1e-9) for v in moving_average([float(r[k]) for r in data], smooth)]
        ax.plot(steps, ys, label=name, linewidth=1.2)
    if floor > 0:
        ax.axhline(floor, color="k", linestyle="--", linewidth=1, label=f"floor {floor:.4f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"SFT loss, moving avg {smooth}")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def main(argv):
    args = list(argv[1:])
    smooth = 10
    if "--smooth" in args:
        i = args.index("--smooth")
        smooth = int(args[i + 1])
        del args[i : i + 2]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    png, panels = args[0], args[1:]
    cols = min(len(panels), 2)
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, spec in zip([a for row in axes for a in row], panels):
        panel(ax, spec, smooth)
    for ax in [a for row in axes for a in row][len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
