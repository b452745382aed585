#!/usr/bin/env python3
"""Open3D's oriented bounding box on the clouds tightfit_mebb_bench --dump-clean DIR wrote (the
same cleaned points MEBB and the baselines see, belt frame, with the footprint added at z = 0),
against the truth in DIR/truth.csv. Prints the markdown rows of the accuracy table and writes
DIR/open3d.csv ("seed,noise,L,W,H", metres) for tightfit_mebb_bench --open3d.

    /usr/bin/python3 bench/geometry/open3d_boxes.py DIR
Open3D 0.16 (Debian python3-open3d) has get_oriented_bounding_box (PCA-based); its
get_minimal_oriented_bounding_box arrived later and is used when present."""
import csv
import os
import statistics
import sys

import numpy as np
import open3d as o3d


def main(d):
    truth = {}
    with open(os.path.join(d, "truth.csv")) as f:
        for row in csv.reader(f):
            truth[(row[0], row[1])] = ([float(x) for x in row[2:5]], row[5])
    minimal = hasattr(o3d.geometry.PointCloud, "get_minimal_oriented_bounding_box")
    out, errs = [], {}
    for (seed, noise), (gt, status) in sorted(truth.items()):
        path = os.path.join(d, "clean_%s_%s.ply" % (seed, noise))
        pc = o3d.io.read_point_cloud(path)
        box = pc.get_minimal_oriented_bounding_box() if minimal else pc.get_oriented_bounding_box()
        dims = sorted(np.asarray(box.extent).tolist(), reverse=True)
        out.append((seed, noise, *dims))
        if status == "ok":
            errs.setdefault(noise, []).append([(a - b) * 1000 for a, b in zip(dims, gt)])
    with open(os.path.join(d, "open3d.csv"), "w") as f:
        for r in out:
            f.write("%s,%s,%.6f,%.6f,%.6f\n" % r)
    name = "open3d minimal obb" if minimal else "open3d obb (0.16, PCA)"
    for noise, e in sorted(errs.items()):
        for k, dim in enumerate("LWH"):
            a = sorted(abs(x[k]) for x in e)
            print("| noise x%s | %s | %s | %+.1f | %.1f | %.1f | %.1f |" % (
                noise, name, dim, statistics.mean(x[k] for x in e), statistics.mean(a),
                a[min(len(a) - 1, int(0.95 * len(a)))], a[-1]))


if __name__ == "__main__":
    main(sys.argv[1])
