// MEBB's options by name: every field of geometry::mebb_options as "group.field" (faces.kappa,
// cleaning.voxel, ...), read from and written to Python values. The Python layer turns
// `faces={"kappa": 0.3}` and `faces_kappa=0.3` into these names (docs/python.md).
// Invariant: the table lists every field (tests/test_options.py compares it with the header);
// a value of the wrong type or an unknown name is a ValueError naming it.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "tightfit/geometry/mebb_options.hpp"

namespace tightfit::python {

namespace py = pybind11;

/// Sets the fields of `o` named in `options` ({"faces.kappa": 0.3, ...}), then checks the
/// ranges (geometry::detail::check_options); throws tightfit::error naming a bad name or value.
void apply_mebb_options(geometry::mebb_options& o, const py::dict& options);

/// Every field's name and its value in `o`, in the header's order.
py::dict mebb_options_dict(const geometry::mebb_options& o);

}  // namespace tightfit::python
