"""Measures the bag in a scan (PLY or XYZ) with MEBB: python3 measure_scan.py SCAN.ply"""
import sys

import tightfit

points = tightfit.read_cloud(sys.argv[1])  # (N, 3) float32 as stored (metres), never copied again
r = tightfit.measure(points)  # MEBB, belt plane found; unit="mm" for millimetre clouds
L, W, H = (x * 1000 for x in r.dims)  # the main body, sorted, in the cloud's unit (m)
print(f"{L:.0f} x {W:.0f} x {H:.0f} mm, {r.status} {r.reasons}")
if r.status != "ok":  # "low_confidence" / "failed": the reasons say why (quality.hpp)
    print("not a trustworthy measurement")
print("95 % half-widths (mm):", [round(u * 1000, 1) for u in r.uncertainty_95])
print("center", r.center, "axes (columns)", r.R, "extent", r.extent)  # Open3D's names
corners = r.get_box_points()  # (8, 3) in OrientedBoundingBox.get_box_points() order
handles = points[r.appendage_mask]  # the points trimmed as appendages (handles, wheels)
print(f"{len(handles)} appendage points; envelope {[round(x * 1000) for x in r.envelope.dims]} mm")
softer = tightfit.measure(points, faces={"kappa": 0.3})  # options by group (or faces_kappa=0.3)
aabb = tightfit.measure(points, method="aabb")  # the baselines: aabb, pca, trimmed, hull
print("AABB", [round(x * 1000) for x in aabb.dims], "mm")
try:
    import open3d  # optional: the same box as an open3d.geometry.OrientedBoundingBox
    print(r.to_open3d())
except ImportError:
    pass
