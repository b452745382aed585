"""tightfit.measure: MEBB and the baseline boxes, with MEBB's options by group.

Options name a field of the C++ mebb_options (include/tightfit/geometry/mebb_options.hpp) in
one of three equivalent spellings: a nested dict per group (faces={"kappa": 0.3}), the group and
field joined by an underscore (faces_kappa=0.3), or the dotted path (**{"faces.kappa": 0.3}).
"""
import os

from . import _tightfit

# the groups of mebb_options, longest first (solid_edge before a hypothetical "solid")
_GROUPS = sorted({name.split(".")[0] for name in _tightfit._mebb_options()}, key=len,
                 reverse=True)


def _option_names(options):
    """{"faces.kappa": value, ...} from any mix of the three spellings."""
    flat = {}
    for key, value in options.items():
        if isinstance(value, dict) and key in _GROUPS:
            for field, v in value.items():
                flat[f"{key}.{field}"] = v
            continue
        name = key
        if "." not in key:
            for group in _GROUPS:
                if key.startswith(group + "_"):
                    name = group + "." + key[len(group) + 1:]
                    break
        if name in flat:
            raise ValueError(f"MEBB option {name} is given twice")
        flat[name] = value
    return flat


def measure(points, method="mebb", unit="m", belt="auto", **options):
    """Measures the object in an (N, 3) float32 or float64 array (read in place, never copied).

    method: "mebb" (the main body, appendages left out) or a baseline box: "aabb", "pca",
    "trimmed", "hull". unit: the coordinates' unit, "m" or "mm"; every length of the result is in
    it. belt: "auto" (find the belt plane), "none" (full 3D) or the height z of the plane z = Z.
    options: mebb_options fields (see mebb_options()). Returns a Measurement: center, R, extent,
    get_box_points() (Open3D's names and corner order), dims, status, reasons, uncertainty_95,
    envelope, belt, flags, trim, labels, appendage_mask.
    """
    return _tightfit._measure(points, method, unit, belt, _option_names(options))


def read_cloud(path):
    """Reads a PLY (ASCII or binary little-endian) or XYZ/CSV cloud into an (N, 3) array:
    float32 for a binary PLY with float x, y, z (the values as stored), float64 otherwise."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such cloud: {path!r}")
    return _tightfit._read_cloud(path)


def mebb_options():
    """Every MEBB option ("group.field") with its default."""
    return dict(_tightfit._mebb_options())


def _to_open3d(box):
    """This box as an open3d.geometry.OrientedBoundingBox (needs open3d)."""
    import open3d  # optional: only this method needs it
    return open3d.geometry.OrientedBoundingBox(box.center, box.R, box.extent)


_tightfit.OrientedBox.to_open3d = _to_open3d
