// The parts of the extension module tightfit._tightfit, each registered by its own file:
// geometry (measure, read_cloud, boxes) and the model (gradients, log-probs, planner).
#pragma once

#include <pybind11/pybind11.h>

namespace tightfit::python {

void bind_geometry(pybind11::module_& m);
void bind_model(pybind11::module_& m);

}  // namespace tightfit::python
