#!/usr/bin/env python3
"""Draws one generated bag with the PCA box and the MEBB box over its points (top view and side
view) as an SVG, without matplotlib.

    tightfit_mebb_bench --bags 40 --noise 1 --dump DIR      # writes DIR/bag_points.xyz, bag_boxes.txt
    python3 bench/geometry/plot_mebb.py DIR docs/mebb_bag.svg

The views are in the frame of the true body (x: length, y: width, z: up), so the boxes' offsets
from the body are what the picture shows.
"""
import math
import sys


def load(d):
    pts = []
    with open(f"{d}/bag_points.xyz") as f:
        for line in f:
            v = line.split()
            if len(v) >= 3:
                pts.append(tuple(float(x) for x in v[:3]))
    boxes = {}
    with open(f"{d}/bag_boxes.txt") as f:
        for line in f:
            v = line.split()
            c = [float(x) for x in v[1:4]]
            r = [[float(v[4 + 3 * i + j]) for j in range(3)] for i in range(3)]
            e = [float(x) for x in v[13:16]]
            boxes[v[0]] = (c, r, e)
    return pts, boxes


def to_frame(p, c, r):
    d = [p[k] - c[k] for k in range(3)]
    return [sum(r[k][a] * d[k] for k in range(3)) for a in range(3)]


def corners(box):
    c, r, e = box
    out = []
    for i in range(8):
        u = [(1 if i >> a & 1 else -1) * e[a] / 2 for a in range(3)]
        out.append([c[k] + sum(r[k][a] * u[a] for a in range(3)) for k in range(3)])
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    pts, boxes = load(sys.argv[1])
    truth = boxes["truth"]
    # body frame with the up axis last: the truth axis most aligned with world z
    c, r, e = truth
    up = max(range(3), key=lambda a: abs(r[2][a]))
    horiz = sorted([a for a in range(3) if a != up], key=lambda a: -e[a])
    order = horiz + [up]
    rr = [[r[k][a] for a in order] for k in range(3)]
    P = [to_frame(p, c, rr) for p in pts]
    colours = {"truth": "#2a9d2a", "pca": "#d62728", "mebb": "#1f5fbf"}
    views = [("top view (x: length, y: width)", 0, 1), ("side view (x: length, z: height)", 0, 2)]
    W, H, pad = 560, 420, 40
    span = max(max(abs(q[0]) for q in P), max(abs(q[1]) for q in P), max(abs(q[2]) for q in P)) * 1.1
    s = (W - 2 * pad) / (2 * span)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 60}" font-family="sans-serif" font-size="13">',
           f'<rect width="{2 * W}" height="{H + 60}" fill="white"/>']
    for vi, (title, ax, ay) in enumerate(views):
        ox, oy = vi * W + W / 2, H / 2 + 20
        svg.append(f'<text x="{vi * W + pad}" y="18">{title}</text>')
        step = max(1, len(P) // 2500)
        svg.append('<g fill="#888">')
        for q in P[::step]:
            svg.append(f'<circle cx="{ox + q[ax] * s:.0f}" cy="{oy - q[ay] * s:.0f}" r="1"/>')
        svg.append('</g>')
        for name in ("truth", "pca", "mebb"):
            cs = [to_frame(p, c, rr) for p in corners(boxes[name])]
            # outline of the projection: convex hull of the projected corners
            pts2 = sorted(set((round(q[ax], 6), round(q[ay], 6)) for q in cs))
            def cross(o, a, b):
                return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
            lower, upper = [], []
            for p in pts2:
                while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
                    lower.pop()
                lower.append(p)
            for p in reversed(pts2):
                while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
                    upper.pop()
                upper.append(p)
            hull = lower[:-1] + upper[:-1]
            path = " ".join(f"{ox + x * s:.1f},{oy - y * s:.1f}" for x, y in hull)
            dash = ' stroke-dasharray="6,4"' if name == "truth" else ""
            svg.append(f'<polygon points="{path}" fill="none" stroke="{colours[name]}" stroke-width="2"{dash}/>')
    y = H + 45
    for i, name in enumerate(("truth", "pca", "mebb")):
        dims = sorted(boxes[name][2], reverse=True)
        label = {"truth": "true main body (dashed)", "pca": "PCA box", "mebb": "MEBB"}[name]
        svg.append(f'<rect x="{40 + i * 330}" y="{y - 11}" width="24" height="4" fill="{colours[name]}"/>')
        svg.append(f'<text x="{70 + i * 330}" y="{y - 4}">{label}: {dims[0]*1000:.0f} x {dims[1]*1000:.0f} x {dims[2]*1000:.0f} mm</text>')
    svg.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
