// The extension module tightfit._tightfit (the package python/tightfit wraps it): the errors'
// translation and the parts' registration. tightfit::error (bad input, a message naming the
// value) becomes ValueError; nothing the library throws reaches Python as a crash.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "tightfit/core/error.hpp"

PYBIND11_MODULE(_tightfit, m) {
  m.doc() = "tightfit's C++ core (use the tightfit package)";
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tightfit::error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  tightfit::python::bind_geometry(m);
  tightfit::python::bind_model(m);
}
