// _tightfit_bench.measure_seconds(points, method): the C++ call the Python module's measure()
// is compared with (bench/python/measure_overhead.py): geometry::measure on the array's own
// memory through the library's Eigen adaptor (matrix_cloud over an Eigen::Map, no copy),
// timed in C++ around that call alone. Returns (seconds, sorted dims).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <Eigen/Core>
#include <array>
#include <chrono>
#include <string>
#include <utility>

#include "tightfit/geometry/measure.hpp"

namespace py = pybind11;
namespace tg = tightfit::geometry;

namespace {

template <class T>
std::pair<double, std::array<double, 3>> timed(const py::array& a, const std::string& method) {
  // no forcecast: a C-contiguous (N, 3) array of T is viewed, anything else refused
  const auto points = py::array_t<T, py::array::c_style>::ensure(a);
  if (!points || points.ndim() != 2 || points.shape(1) != 3 || points.data() != a.data())
    throw py::value_error("expected a C-contiguous (N, 3) array, viewed without a copy");
  using map = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 3, Eigen::RowMajor>>;
  const map m(points.data(), points.shape(0), 3);
  const tg::matrix_cloud<map> cloud(m);
  const tg::box_method how = tg::parse_box_method(method);
  py::gil_scoped_release unlocked;
  const auto start = std::chrono::steady_clock::now();
  const tg::measurement r = tg::measure(cloud, how);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {seconds, r.dims};
}

}  // namespace

PYBIND11_MODULE(_tightfit_bench, m) {
  m.def(
      "measure_seconds",
      [](const py::array& a, const std::string& method) {
        if (a.dtype().is(py::dtype::of<float>())) return timed<float>(a, method);
        return timed<double>(a, method);
      },
      py::arg("points"), py::arg("method") = "mebb");
}
