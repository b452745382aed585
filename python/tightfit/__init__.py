"""tightfit from Python: MEBB box measurement of point clouds and StreamBP gradients of Hugging
Face checkpoints, on the C++ library's own code (docs/python.md).

    boxes:      tightfit.measure(points, method="mebb", unit="m", **options) -> Measurement
                tightfit.read_cloud(path) -> (N, 3) array
    training:   tightfit.Model.from_pretrained(dir, dtype="float32")
                model.gradients(input_ids, labels=None, ...) -> (loss, {name: array})
                model.logprobs(input_ids, labels=None, ...) -> (B, T) array
                tightfit.plan(model or preset=..., seq=..., budget=...) -> dict

Arrays are read in place (buffer protocol or __dlpack__: numpy arrays, torch CPU tensors); bad
input raises ValueError naming the value; Ctrl-C stops a long call between layers.
"""
from ._tightfit import Measurement, OrientedBox
from ._geometry import measure, mebb_options, read_cloud
from ._model import Model, plan, presets

__all__ = ["Measurement", "Model", "OrientedBox", "measure", "mebb_options", "plan", "presets",
           "read_cloud"]
