#!/usr/bin/env python3
"""Per-face error analysis of a traced MEBB bench run (docs/benchmarks.md, issue 13, seventh round).

Reads the stderr of `TIGHTFIT_BENCH_TRACE=1 tightfit_mebb_bench --bags N --noise K --no-cgal`
(its `trace`, `face` and `tilt` lines) and prints, over the ok bags' vertical faces:
- the mean signed error (outward positive) per face of the true body (+x/-x the ends);
- the mean signed error by the true tan alpha of the camera ray at the face's top edge;
- least-squares fits of the face error on the ray tilt alpha (radians) and the edge radius (mm);
- what the geometric silhouette r (1 - cos alpha), with the generator's own r and alpha, would
  leave of L's and W's P95 (an oracle: no fitted constant);
- how well the scan's own estimates (edge radius, tan alpha) read the generator's;
- how many outer iterations the bags took;
- a fit through zero of the face error on the point pitch (faces without a solid-edge depth): on
  a run with TIGHTFIT_BENCH_OPTIONS=offsets.side_pitch=0, the pitch offset that centres the faces.

    TIGHTFIT_BENCH_TRACE=1 build/rel/bench/geometry/tightfit_mebb_bench --bags 200 --noise 1 \
        --no-cgal 2> trace.txt >/dev/null
    python3 bench/geometry/face_errors.py trace.txt
"""
import collections
import math
import sys


def fields(line):
    parts = line.split()
    return parts[0], dict(zip(parts[1::2], parts[2::2])), parts


def solve(a, b):
    """Least squares x minimising |A x - b| (normal equations, Gauss-Jordan; small systems)."""
    n = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] + [sum(r[i] * y for r, y in zip(a, b))]
         for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c and m[c][c] != 0:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def p95(values):
    v = sorted(abs(x) for x in values)
    return v[min(len(v) - 1, int(round(0.95 * (len(v) - 1))))] if v else float("nan")


def main(path):
    bags, faces, tilts = {}, {}, {}
    for line in open(path):
        if not line.strip():
            continue
        kind, kv, parts = fields(line)
        if kind == "trace":
            bags[kv["seed"]] = kv
        elif kind == "face" and kv["status"] == "ok" and int(kv["f"]) < 4:
            faces[(kv["seed"], int(kv["f"]))] = kv
        elif kind == "tilt":
            tilts[(kv["seed"], int(kv["f"]))] = kv
    if not faces or not tilts:
        sys.exit(f"{path}: no face/tilt lines (run the bench with TIGHTFIT_BENCH_TRACE=1)")

    by_body = collections.defaultdict(list)
    rows = []
    for key, kv in faces.items():
        t = tilts[key]
        err = float(kv["err"])
        by_body[kv["body"]].append(err)
        rows.append(dict(err=err, alpha=math.atan2(float(t["out"]), float(t["drop"])),
                         tan=float(t["out"]) / float(t["drop"]), rc=float(t["rc"]),
                         est_rc=float(t["est_rc"]), est_tan=float(t["est_tilt"]), key=key,
                         span=float(kv["span"])))
    print("mean signed face error by face of the true body (outward positive), mm")
    for body in sorted(by_body):
        v = by_body[body]
        print(f"  {body}: {sum(v) / len(v):+.2f} over {len(v)} faces")

    print("mean signed face error by the true tan alpha, mm")
    bins = [(-9, 0), (0, 0.1), (0.1, 0.15), (0.15, 0.2), (0.2, 0.25), (0.25, 0.3), (0.3, 9)]
    for lo, hi in bins:
        v = [r["err"] for r in rows if lo <= r["tan"] < hi]
        if v:
            print(f"  [{lo:g}, {hi:g}): {sum(v) / len(v):+.2f} over {len(v)} faces")

    y = [r["err"] for r in rows]
    rms0 = math.sqrt(sum((e - sum(y) / len(y)) ** 2 for e in y) / len(y))
    for names in (["alpha"], ["rc"], ["alpha", "rc"], ["alpha", "rc", "span"]):
        a = [[1.0] + [r[n] / (1000 if n == "span" else 1) for n in names] for r in rows]
        c = solve(a, y)
        rms = math.sqrt(sum((e - sum(ci * ai for ci, ai in zip(c, ar))) ** 2
                            for e, ar in zip(y, a)) / len(y))
        terms = " ".join(f"{ci:+.3f} x {n}" for ci, n in zip(c[1:], names))
        print(f"fit err = {c[0]:+.3f} {terms} (span in m, rc in mm): rms {rms0:.2f} -> {rms:.2f} mm")

    # the oracle: each face moved out by the generator's r (1 - cos alpha), for unseen walls
    dims = collections.defaultdict(dict)
    for r in rows:
        seed, f = r["key"]
        shift = r["rc"] * (1 - math.cos(r["alpha"])) if r["alpha"] > 0 else 0.0
        dims[seed][f] = (r["err"], r["err"] + shift, r["span"])
    ls, ws, lo_, wo = [], [], [], []
    for seed, fs in dims.items():
        if len(fs) < 4:
            continue
        a0 = (fs[0][0] + fs[1][0], fs[0][1] + fs[1][1])
        a1 = (fs[2][0] + fs[3][0], fs[2][1] + fs[3][1])
        l_axis, w_axis = (a0, a1) if fs[0][2] < fs[2][2] else (a1, a0)  # L: the shorter faces
        ls.append(l_axis[0]), lo_.append(l_axis[1]), ws.append(w_axis[0]), wo.append(w_axis[1])
    print(f"P95 of L / W over the faces' sums: {p95(ls):.1f} / {p95(ws):.1f} mm; with the "
          f"generator's r (1 - cos alpha) added (oracle): {p95(lo_):.1f} / {p95(wo):.1f} mm")

    radius = [r["est_rc"] - r["rc"] for r in rows if r["est_rc"] > 0 and r["key"][1] == 0]
    tilt = [r["est_tan"] - r["tan"] for r in rows if r["est_tan"] >= 0 and r["tan"] > 0.05]
    measured = sum(1 for r in rows if r["est_tan"] >= 0)

    def mean_sd(v):
        m = sum(v) / len(v)
        return m, math.sqrt(sum((x - m) ** 2 for x in v) / len(v))

    if radius:
        m, s = mean_sd(radius)
        print(f"edge radius read - true: {m:+.1f} mm (sd {s:.1f}) over {len(radius)} bags")
    if tilt:
        m, s = mean_sd(tilt)
        print(f"tan alpha read - true: {m:+.3f} (sd {s:.3f}) over {len(tilt)} unseen faces; "
              f"measured on {measured} of {len(rows)} faces")
    pitch_rows = [(float(bags[r["key"][0]]["pitch"]), r["err"]) for r in rows
                  if float(faces[r["key"]]["reach"]) == 0]
    k = sum(p * e for p, e in pitch_rows) / sum(p * p for p, e in pitch_rows)
    print(f"fit through zero: err = {k:+.3f} x pitch over {len(pitch_rows)} faces")
    runs = collections.Counter(kv.get("outer", "?") for kv in bags.values())
    print("outer iterations per bag: " + ", ".join(f"{k}: {v}" for k, v in sorted(runs.items())))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: face_errors.py TRACE_FILE")
    main(sys.argv[1])
