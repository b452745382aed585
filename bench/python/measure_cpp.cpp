// _tightfit_bench.measure_seconds(points, method): the C++ call the Python module's measure()
// is compared with (bench/python/measure_overhead.py): geometry::measure on the array's own
// memory through the library's Eigen adaptor (matrix_cloud over an Eigen::Map, no copy),
// timed in C++ around that call alone. Returns (wall seconds, process CPU seconds, sorted dims).
// measure_seconds_module_cloud: the same through the module's own adaptor (contiguous_cloud,
// python/src/strided_cloud.hpp), which tells the adaptor's cost from the binding's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <Eigen/Core>
#include <array>
#include <chrono>
#include <ctime>
#include <string>
#include <tuple>

#include "strided_cloud.hpp"
#include "tightfit/geometry/measure.hpp"

namespace py = pybind11;
namespace tg = tightfit::geometry;

namespace {

using timing = std::tuple<double, double, std::array<double, 3>>;

/// The (N, 3) C-contiguous array `a` of T (no forcecast: anything else is refused).
template <class T>
py::array_t<T, py::array::c_style> viewed(const py::array& a) {
  auto points = py::array_t<T, py::array::c_style>::ensure(a);
  if (!points || points.ndim() != 2 || points.shape(1) != 3 || points.data() != a.data())
    throw py::value_error("expected a C-contiguous (N, 3) array, viewed without a copy");
  return points;
}

template <class Cloud>
timing timed(const Cloud& cloud, const std::string& method) {
  const tg::box_method how = tg::parse_box_method(method);
  py::gil_scoped_release unlocked;
  const std::clock_t cpu = std::clock();  // every thread of the process
  const auto start = std::chrono::steady_clock::now();
  const tg::measurement r = tg::measure(cloud, how);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {seconds, static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC, r.dims};
}

template <class T>
timing eigen_timed(const py::array& a, const std::string& method) {
  const auto points = viewed<T>(a);
  using map = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 3, Eigen::RowMajor>>;
  const map m(points.data(), points.shape(0), 3);
  return timed(tg::matrix_cloud<map>(m), method);
}

template <class T>
timing module_timed(const py::array& a, const std::string& method) {
  const auto points = viewed<T>(a);
  const auto* bytes = reinterpret_cast<const unsigned char*>(points.data());
  return timed(
      tightfit::python::contiguous_cloud<T>(bytes, static_cast<std::size_t>(points.shape(0)), 1.0),
      method);
}

}  // namespace

PYBIND11_MODULE(_tightfit_bench, m) {
  m.def(
      "measure_seconds",
      [](const py::array& a, const std::string& method) {
        if (a.dtype().is(py::dtype::of<float>())) return eigen_timed<float>(a, method);
        return eigen_timed<double>(a, method);
      },
      py::arg("points"), py::arg("method") = "mebb");
  m.def(
      "measure_seconds_module_cloud",
      [](const py::array& a, const std::string& method) {
        if (a.dtype().is(py::dtype::of<float>())) return module_timed<float>(a, method);
        return module_timed<double>(a, method);
      },
      py::arg("points"), py::arg("method") = "mebb");
}
