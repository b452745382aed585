"""What measuring a 1 M-point numpy cloud through the Python module costs over the C++ call.

    PYTHONPATH=build/dev/python:build/dev/bench/python /usr/bin/python3 \
        bench/python/measure_overhead.py [--runs 10] [--points 1000000] [--method mebb]

Both sides measure the same array in one process, interleaved (the order rotates from round to
round): the C++ side is geometry::measure on the array's memory through the Eigen
adaptor, timed in C++ around the call (_tightfit_bench.measure_seconds); the Python side is
timed around tightfit.measure(points), which checks the array, reads it in place and builds the
result object. Both are timed in wall-clock seconds and in the process's CPU seconds (every
thread; steadier on a loaded machine). A third call, the C++ measure() through the module's own
adaptor (contiguous_cloud), tells the adaptor's share. Prints each round and the median ratios
for a float64 and a float32 array (the results must be identical).
"""
import argparse
import statistics
import time

import numpy as np

import _tightfit_bench
import tightfit


def scan(n, seed=1):
    """A 600 x 400 x 250 mm box yawed 20 degrees on a belt with a handle on top, seen from
    above with 1 mm noise: `n` points (metres), drawn from a denser grid."""
    g = np.random.default_rng(seed)
    parts = []
    gx, gy = np.meshgrid(np.arange(-0.75, 0.75, 0.0016), np.arange(-0.6, 0.6, 0.0016))
    belt = np.stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)], 1)
    parts.append(belt[~((np.abs(belt[:, 0]) < 0.36) & (np.abs(belt[:, 1]) < 0.26))])
    L, W, H, s = 0.6, 0.4, 0.25, 0.0012
    u, v = np.meshgrid(np.arange(-L / 2, L / 2, s), np.arange(-W / 2, W / 2, s))
    parts.append(np.stack([u.ravel(), v.ravel(), np.full(u.size, H)], 1))
    for sign in (-1, 1):
        a, z = np.meshgrid(np.arange(-L / 2, L / 2, s), np.arange(0.01, H, s))
        parts.append(np.stack([a.ravel(), np.full(a.size, sign * W / 2), z.ravel()], 1))
        b, z = np.meshgrid(np.arange(-W / 2, W / 2, s), np.arange(0.01, H, s))
        parts.append(np.stack([np.full(b.size, sign * L / 2), b.ravel(), z.ravel()], 1))
    a, b = np.meshgrid(np.arange(-0.1, 0.1, s), np.arange(-0.01, 0.01, s))
    parts.append(np.stack([a.ravel(), b.ravel(), np.full(a.size, H + 0.04)], 1))
    p = np.concatenate(parts)
    p = p[g.choice(len(p), n, replace=False)] + g.normal(0, 0.001, (n, 3))
    c, s = np.cos(np.radians(20)), np.sin(np.radians(20))
    p[:, :2] = p[:, :2] @ np.array([[c, s], [-s, c]]) + [0.05, -0.02]
    return p


def python_call(points, method):
    start, cpu = time.perf_counter(), time.process_time()
    r = tightfit.measure(points, method=method)
    return time.perf_counter() - start, time.process_time() - cpu, r


def rounds(points, runs, method):
    """Ratios over `runs` interleaved rounds (the order rotates): {"wall": [...], "CPU": [...],
    "adaptor CPU": [...]}, Python / C++ and the module's adaptor in C++ / C++."""
    calls = [lambda: _tightfit_bench.measure_seconds(points, method),
             lambda: python_call(points, method),
             lambda: _tightfit_bench.measure_seconds_module_cloud(points, method)]
    out = {"wall": [], "CPU": [], "adaptor CPU": []}
    for i in range(runs):
        got = [None] * 3
        for k in range(3):
            got[(i + k) % 3] = calls[(i + k) % 3]()
        (c_wall, c_cpu, dims), (p_wall, p_cpu, r), (_, a_cpu, a_dims) = got
        assert list(r.dims) == list(dims) == list(a_dims), (r.dims, dims, a_dims)
        out["wall"].append(p_wall / c_wall)
        out["CPU"].append(p_cpu / c_cpu)
        out["adaptor CPU"].append(a_cpu / c_cpu)
        print(f"  round {i:2d}: C++ {c_wall * 1e3:7.1f} ms ({c_cpu * 1e3:7.1f} ms CPU)   Python "
              f"{p_wall * 1e3:7.1f} ms ({p_cpu * 1e3:7.1f} ms CPU)   C++ through the module's "
              f"adaptor {a_cpu * 1e3:7.1f} ms CPU")
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--method", default="mebb")
    a = parser.parse_args()
    cloud = scan(a.points)
    for dtype in (np.float64, np.float32):
        points = np.ascontiguousarray(cloud, dtype=dtype)
        print(f"{a.points} points, {np.dtype(dtype).name}, method {a.method}, {a.runs} rounds")
        tightfit.measure(points, method=a.method)  # warm-up (page faults, thread pool)
        labels = {"wall": "Python / C++, wall", "CPU": "Python / C++, CPU",
                  "adaptor CPU": "C++ through the module's adaptor / C++, CPU"}
        for name, ratios in rounds(points, a.runs, a.method).items():
            print(f"  median ratio {labels[name]}: {statistics.median(ratios):.4f} "
                  f"(min {min(ratios):.4f}, max {max(ratios):.4f})")


if __name__ == "__main__":
    main()
