"""Point clouds for the tests: a generated scan of a box with a handle on a belt (always there)
and the independent fixtures (TIGHTFIT_MEBB_FIXTURES, when present), as binary float PLY."""
import glob
import os

import numpy as np


def write_ply(path, points):
    """A binary little-endian PLY with float x, y, z."""
    points = np.ascontiguousarray(points, dtype="<f4")
    with open(path, "wb") as f:
        f.write(b"ply\nformat binary_little_endian 1.0\n")
        f.write(b"element vertex %d\n" % len(points))
        f.write(b"property float x\nproperty float y\nproperty float z\nend_header\n")
        f.write(points.tobytes())


def box_on_belt(seed=5, handle=True):
    """A 600 x 400 x 250 mm box yawed 20 degrees on the belt z = 0, seen from above (top and
    side faces, 1 mm noise), with a handle 40 mm above its top; float32 (N, 3), metres."""
    g = np.random.default_rng(seed)
    parts = []
    gx, gy = np.meshgrid(np.arange(-0.6, 0.6, 0.004), np.arange(-0.5, 0.5, 0.004))
    belt = np.stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)], 1)
    inside = (np.abs(belt[:, 0]) < 0.36) & (np.abs(belt[:, 1]) < 0.26)  # hidden under the box
    parts.append(belt[~inside])
    L, W, H = 0.6, 0.4, 0.25
    u, v = np.meshgrid(np.arange(-L / 2, L / 2, 0.003), np.arange(-W / 2, W / 2, 0.003))
    parts.append(np.stack([u.ravel(), v.ravel(), np.full(u.size, H)], 1))
    for sign in (-1, 1):
        a, z = np.meshgrid(np.arange(-L / 2, L / 2, 0.003), np.arange(0.01, H, 0.003))
        parts.append(np.stack([a.ravel(), np.full(a.size, sign * W / 2), z.ravel()], 1))
        b, z = np.meshgrid(np.arange(-W / 2, W / 2, 0.003), np.arange(0.01, H, 0.003))
        parts.append(np.stack([np.full(b.size, sign * L / 2), b.ravel(), z.ravel()], 1))
    if handle:
        a, b = np.meshgrid(np.arange(-0.1, 0.1, 0.003), np.arange(-0.01, 0.01, 0.003))
        parts.append(np.stack([a.ravel(), b.ravel(), np.full(a.size, H + 0.04)], 1))
        for x in (-0.1, 0.1):
            z = np.arange(H, H + 0.04, 0.003)
            parts.append(np.stack([np.full(z.size, x), np.zeros(z.size), z], 1))
    p = np.concatenate(parts)
    p += g.normal(0, 0.001, p.shape)
    c, s = np.cos(np.radians(20)), np.sin(np.radians(20))
    p[:, :2] = p[:, :2] @ np.array([[c, s], [-s, c]]) + [0.05, -0.02]
    return p.astype(np.float32)


def fixture_scans():
    """The fixtures' PLY files, or [] when TIGHTFIT_MEBB_FIXTURES names no such folder."""
    folder = os.environ.get("TIGHTFIT_MEBB_FIXTURES", "")
    return sorted(glob.glob(os.path.join(folder, "bag_*.ply"))) if folder else []
