"""tightfit.measure and read_cloud against `tightfit measure --json` on the same files, Open3D's
box conventions, the input layouts read in place, and the per-point labels."""
import json
import os
import re

import numpy as np
import pytest

import tightfit
from helpers import tool
from scans import box_on_belt, fixture_scans, write_ply

METHODS = ["mebb", "aabb", "pca", "trimmed", "hull"]


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    """(path, points): the first fixture scan when present, else the generated box."""
    found = fixture_scans()
    if found:
        return found[0], tightfit.read_cloud(found[0])
    path = tmp_path_factory.mktemp("scan") / "box.ply"
    write_ply(path, box_on_belt())
    return str(path), tightfit.read_cloud(path)


def tool_json(path, *options):
    return json.loads(tool("measure", path, "--json", *options).stdout)


def assert_same_as_tool(r, j, to_mm):
    """Every number of the tool's JSON (millimetres) equals the result's (x to_mm), bit for bit."""
    assert r.method == j["method"] and r.status == j["status"] and r.reasons == j["reasons"]
    assert [x * to_mm for x in r.dims] == [j["length"], j["width"], j["height"]]
    assert [x * to_mm for x in r.center] == j["centre"]
    assert list(r.R.ravel()) == j["rotation"]  # row-major
    assert [x * to_mm for x in r.extent] == j["extent"]
    assert [x * to_mm for x in r.envelope.dims] == j["envelope"]
    assert r.points == j["points"] and r.points_used == j["points_used"]
    if j["uncertainty_95"] is None:
        assert r.uncertainty_95 is None and r.trim is None
    else:
        assert [x * to_mm for x in r.uncertainty_95] == j["uncertainty_95"]
        assert {k: v * to_mm for k, v in r.trim.items()} == j["trim"]
    # the tool lists the first seven flags (face_hidden is reported as a reason)
    assert [f for f in r.flags if f != "face_hidden"] == j["flags"]
    if j["belt"] is None:
        assert r.belt is None
    else:
        assert list(r.belt["normal"]) == j["belt"]["normal"]
        assert r.belt["offset"] * to_mm == j["belt"]["offset"]
        assert r.belt["sigma"] * to_mm == j["belt"]["sigma"]


@pytest.mark.parametrize("method", METHODS)
def test_measure_equals_the_tool(scan, method):
    path, points = scan
    r = tightfit.measure(points, method=method)
    assert_same_as_tool(r, tool_json(path, "--method", method), 1000)


def test_every_fixture_scan_equals_the_tool():
    scans = fixture_scans()
    if not scans:
        pytest.skip("TIGHTFIT_MEBB_FIXTURES holds no bag_*.ply")
    for path in scans:
        assert_same_as_tool(tightfit.measure(tightfit.read_cloud(path)), tool_json(path), 1000)


def test_millimetres_and_belt_height_equal_the_tool(scan, tmp_path):
    """unit="mm" and belt=Z as the tool's --unit mm --belt Z, on a double-precision text cloud."""
    _, points = scan
    mm = points.astype(np.float64) * 1000
    path = tmp_path / "mm.xyz"
    np.savetxt(path, mm, fmt="%.17g")
    for belt, option in [("auto", "auto"), ("none", "none"), (0.0, "0")]:
        r = tightfit.measure(mm, unit="mm", belt=belt)
        assert_same_as_tool(r, tool_json(path, "--unit", "mm", "--belt", option), 1)


def test_open3d_box_conventions(scan):
    """The same box built in Open3D from center, R, extent has the same 8 corners, and every
    point Open3D finds inside it is labelled body (or belt) by MEBB."""
    o3d = pytest.importorskip("open3d")
    _, points = scan
    r = tightfit.measure(points)
    box = o3d.geometry.OrientedBoundingBox(r.center, r.R, r.extent)
    np.testing.assert_allclose(np.asarray(box.get_box_points()), r.get_box_points(), rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(np.asarray(r.to_open3d().get_box_points()), r.get_box_points(),
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(box.volume(), r.volume, rtol=1e-12)
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points.astype(np.float64)))
    inside = np.asarray(box.get_point_indices_within_bounding_box(cloud.points), dtype=np.int64)
    assert len(inside) > 1000
    assert set(np.unique(r.labels[inside])) <= {0, 2}


def test_labels_and_appendage_mask_follow_the_boxes(scan):
    """Body points lie in the box grown by faces.eps, appendage points outside it but inside the
    envelope grown by eps (computed here from center, R, extent in the input's frame)."""
    _, points = scan
    r = tightfit.measure(points)
    eps = tightfit.mebb_options()["faces.eps"]
    mask = r.appendage_mask
    assert mask.dtype == np.bool_ and mask.shape == (len(points),)
    np.testing.assert_array_equal(mask, r.labels == 1)
    assert 0 < mask.sum() < len(points)

    def inside(box, p, tol):
        u = (p.astype(np.float64) - box.center) @ box.R
        return np.all(np.abs(u) <= box.extent / 2 + tol + 1e-9, axis=1)

    body = r.labels == 0
    assert inside(r, points[body], eps).all()
    assert not inside(r, points[mask], eps - 1e-9).any()
    assert inside(r.envelope, points[mask], eps).all()
    assert tightfit.measure(points, method="pca").appendage_mask is None


def test_layouts_are_read_in_place_with_the_same_result(scan):
    """Fortran order, a column slice of a wider array, float64 and a torch tensor (DLPack) give
    the result of the C-contiguous float32 array."""
    _, points = scan
    ref = tightfit.measure(points)
    wide = np.zeros((len(points), 5), dtype=np.float32)
    wide[:, 1:4] = points
    inputs = [np.asfortranarray(points), wide[:, 1:4], memoryview(points)]
    torch = None
    try:
        import torch
    except ImportError:
        pass
    if torch is not None:
        inputs += [torch.from_numpy(points), torch.from_numpy(wide)[:, 1:4]]
    for x in inputs:
        r = tightfit.measure(x)
        assert (r.center == ref.center).all() and (r.R == ref.R).all()
        assert (r.extent == ref.extent).all() and r.reasons == ref.reasons
    r64 = tightfit.measure(points.astype(np.float64))  # float -> double is exact
    assert (r64.center == ref.center).all() and (r64.extent == ref.extent).all()


def test_option_spellings_and_defaults(scan):
    _, points = scan
    a = tightfit.measure(points, faces={"kappa": 0.3, "eps": 0.005})
    b = tightfit.measure(points, faces_kappa=0.3, faces_eps=0.005)
    c = tightfit.measure(points, **{"faces.kappa": 0.3, "faces.eps": 0.005})
    for other in (b, c):
        assert (a.center == other.center).all() and (a.extent == other.extent).all()
    d = tightfit.measure(points, solid_edge_grip_trim=False, cleaning={"voxel": 0.006})
    assert d.status in ("ok", "low_confidence", "failed")
    defaults = tightfit.measure(points, **{k: v for k, v in tightfit.mebb_options().items()})
    ref = tightfit.measure(points)
    assert (defaults.extent == ref.extent).all()


def test_every_mebb_option_is_reachable():
    """The option table names every field of mebb_options.hpp (its groups' members)."""
    header = os.path.join(os.path.dirname(__file__), "..", "..", "include", "tightfit",
                          "geometry", "mebb_options.hpp")
    text = open(header).read()
    groups = dict(re.findall(r"\n  (mebb_\w+_options) (\w+);", text))
    names = set()
    for struct, group in groups.items():
        body = re.search(r"struct " + struct + r" \{(.*?)\n\};", text, re.S).group(1)
        for line in re.findall(r"\n  (?:bool|double|int|std::size_t) ([^;]+);", body):
            for declarator in line.split(","):
                names.add(group + "." + declarator.split("=")[0].strip())
    assert len(groups) == 8 and len(names) > 60
    assert names == set(tightfit.mebb_options())


@pytest.mark.parametrize("bad, message", [
    (np.zeros((100, 2)), r"points has shape \(100, 2\), expected \(N, 3\)"),
    (np.zeros((100, 3), dtype=np.int64), r"points has dtype int64, expected float32 or float64"),
    (np.zeros((100, 3), dtype=np.float16), r"points has dtype 'e' \(2 bytes\)"),
    (np.zeros(300), r"points has shape \(300,\)"),
    ([[0.0, 0.0, 0.0]] * 10, r"measure: the cloud has 10 points, expected at least 30"),
])
def test_bad_arrays_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        tightfit.measure(bad)


def test_non_finite_points_are_named(scan):
    _, points = scan
    bad = points.copy()
    bad[17, 1] = np.nan
    with pytest.raises(ValueError, match=r"points\[17, 1\] is nan"):
        tightfit.measure(bad)
    bad[17, 1] = np.inf
    with pytest.raises(ValueError, match=r"points\[17, 1\] is inf"):
        tightfit.measure(bad, method="aabb")


@pytest.mark.parametrize("kwargs, message", [
    (dict(method="obb"), "method is 'obb', expected mebb, aabb, pca, trimmed or hull"),
    (dict(unit="km"), "unit is 'km', expected m or mm"),
    (dict(belt="floor"), "belt is 'floor', expected 'auto', 'none' or a height z"),
    (dict(faces_kapa=0.3), r"unknown MEBB option 'faces.kapa' \(expected one of: faces.column"),
    (dict(colour=1), "unknown MEBB option 'colour'"),
    (dict(faces={"kappa": 1.5}), r"mebb: faces.kappa is 1.5, expected in \(0, 1\]"),
    (dict(faces_kappa="big"), "MEBB option faces.kappa is 'big', expected a number"),
    (dict(checks_hidden=1), "MEBB option checks.hidden is 1, expected True or False"),
    (dict(cleaning_min_points=-3), "MEBB option cleaning.min_points is -3, expected >= 0"),
])
def test_bad_arguments_are_refused(scan, kwargs, message):
    _, points = scan
    with pytest.raises(ValueError, match=message):
        tightfit.measure(points, **kwargs)


def test_read_cloud(tmp_path):
    points = box_on_belt()[:500]
    write_ply(tmp_path / "a.ply", points)
    a = tightfit.read_cloud(tmp_path / "a.ply")
    assert a.dtype == np.float32 and a.flags.c_contiguous
    np.testing.assert_array_equal(a, points)
    np.savetxt(tmp_path / "b.xyz", points.astype(np.float64), fmt="%.17g")
    b = tightfit.read_cloud(str(tmp_path / "b.xyz"))
    assert b.dtype == np.float64
    np.testing.assert_array_equal(b, points.astype(np.float64))
    with pytest.raises(FileNotFoundError):
        tightfit.read_cloud(tmp_path / "missing.ply")
    (tmp_path / "bad.ply").write_bytes(b"ply\nformat ascii 1.0\nelement vertex 99\nend_header\n")
    with pytest.raises(ValueError, match="bad.ply"):
        tightfit.read_cloud(tmp_path / "bad.ply")
