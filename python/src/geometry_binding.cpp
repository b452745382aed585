// tightfit.measure / read_cloud: MEBB and the baseline boxes on an (N, 3) array read in place
// (strided_cloud over the buffer or DLPack view), results with Open3D's names (center, R,
// extent, get_box_points in OrientedBoundingBox's corner order).
// Invariants: the array is checked (shape, dtype, finite) before any work and never copied; the
// GIL is released while measuring; every length of a result is in the input's unit (`unit`),
// computed as the tool computes its millimetres (value x 1000 for mm), so a result equals
// `tightfit measure --json` bit for bit.
#include <pybind11/eigen.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <Eigen/Core>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "mebb_option_table.hpp"
#include "strided_cloud.hpp"
#include "tightfit/geometry/cloud_io.hpp"
#include "tightfit/geometry/measure.hpp"

namespace tightfit::python {

namespace {

namespace tg = tightfit::geometry;

/// A box in the input's unit, with Open3D's OrientedBoundingBox names.
struct box {
  Eigen::Vector3d center;
  Eigen::Matrix3d R;  ///< columns: the box axes
  Eigen::Vector3d extent;

  box() = default;
  box(const tg::oriented_box& b, double factor)
      : center(b.centre * factor), R(b.rotation), extent(b.extent * factor) {}

  /// The 8 corners in Open3D's order (OrientedBoundingBox::GetBoxPoints).
  Eigen::Matrix<double, 8, 3, Eigen::RowMajor> corners() const {
    const Eigen::Vector3d x = R * Eigen::Vector3d(extent[0] / 2, 0, 0);
    const Eigen::Vector3d y = R * Eigen::Vector3d(0, extent[1] / 2, 0);
    const Eigen::Vector3d z = R * Eigen::Vector3d(0, 0, extent[2] / 2);
    Eigen::Matrix<double, 8, 3, Eigen::RowMajor> p;
    p.row(0) = center - x - y - z;
    p.row(1) = center + x - y - z;
    p.row(2) = center - x + y - z;
    p.row(3) = center - x - y + z;
    p.row(4) = center + x + y + z;
    p.row(5) = center - x + y + z;
    p.row(6) = center + x - y + z;
    p.row(7) = center + x + y - z;
    return p;
  }
  std::array<double, 3> dims() const {
    tg::oriented_box b;
    b.extent = extent;
    return b.sorted_dims();
  }
};

/// One measurement, with what its per-point labels need (the input is viewed again on demand).
struct result : box {
  tg::measurement m;
  double factor = 1;  ///< metres -> the input's unit
  box envelope;
  py::object input;          ///< the array measured (labels)
  double scale = 1;          ///< the input's unit -> metres
  tg::mebb_options options;  ///< as measured (labels: the belt cut and eps)
  std::optional<py::array> labels_cache;
};

/// Calls f(cloud) with the cloud of the view's element type and layout (C-contiguous or not).
template <class F>
auto with_cloud(const array_view& v, double scale, F&& f) {
  const auto n = static_cast<std::size_t>(v.shape[0]);
  auto of = [&](auto zero) {
    using T = decltype(zero);
    const auto size = static_cast<std::int64_t>(sizeof(T));
    if (v.strides[1] == size && (v.strides[0] == 3 * size || n <= 1))
      return f(contiguous_cloud<T>(v.data, n, scale));
    return f(strided_cloud<T>(v.data, n, v.strides[0], v.strides[1], scale));
  };
  return v.type == element::f32 ? of(float{}) : of(double{});
}

/// Whether all n values are finite: an all-ones exponent (inf, nan) in any of them, found by
/// integer operations that the compiler vectorises (std::isfinite in a loop it does not).
template <class T>
bool all_finite(const T* x, std::size_t n) {
  using bits = std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t>;
  constexpr bits exponent = sizeof(T) == 8 ? bits{0x7ff} << 52 : bits{0xff} << 23;
  bits any = 0;  // an exponent field all ones
  for (std::size_t i = 0; i < n; ++i) {
    bits b;
    std::memcpy(&b, x + i, sizeof b);
    any |= static_cast<bits>((b & exponent) == exponent);
  }
  return any == 0;
}

/// The input as a checked (N, 3) float32 / float64 view: shape, dtype and finite coordinates,
/// before any work.
array_view cloud_view(py::handle points) {
  array_view v = view_array(points, "points");
  check(v.shape.size() == 2 && v.shape[1] == 3, "points has shape ", shape_string(v),
        ", expected (N, 3)");
  check(v.type == element::f32 || v.type == element::f64, "points has dtype ", v.type_name,
        ", expected float32 or float64");
  with_cloud(v, 1.0, [&](const auto& cloud) {
    const std::size_t n = cloud.kdtree_get_point_count();
    bool finite = true;  // one branch-free pass; the first bad coordinate is found after it
    if constexpr (requires { cloud.coordinates(); }) {
      if (const auto* x = cloud.coordinates())  // aligned and contiguous: a vectorised pass
        finite = all_finite(x, 3 * n);
      else
        finite = false;  // checked one by one below
    } else {
      for (std::size_t i = 0; i < n; ++i)
        finite &= std::isfinite(cloud.kdtree_get_pt(i, 0) + cloud.kdtree_get_pt(i, 1) +
                                cloud.kdtree_get_pt(i, 2));
    }
    for (std::size_t i = 0; !finite && i < n; ++i)
      for (std::size_t d = 0; d < 3; ++d) {
        const double x = cloud.kdtree_get_pt(i, d);
        check(std::isfinite(x), "points[", i, ", ", d, "] is ", x, ", expected finite coordinates");
      }
    return 0;
  });
  return v;
}

double unit_scale(const std::string& unit) {
  check(unit == "m" || unit == "mm", "unit is '", unit, "', expected m or mm");
  return unit == "mm" ? 0.001 : 1.0;
}

/// "auto", "none" or the height z of the belt plane (in the input's unit).
tg::belt_choice parse_belt(py::handle belt, double scale) {
  if (py::isinstance<py::str>(belt)) {
    const std::string s = py::str(belt);
    if (s == "auto") return {};
    check(s == "none", "belt is '", s, "', expected 'auto', 'none' or a height z");
    tg::belt_choice c;
    c.kind = tg::belt_choice::none;
    return c;
  }
  check(!py::isinstance<py::bool_>(belt) &&
            (py::isinstance<py::float_>(belt) || py::isinstance<py::int_>(belt)),
        "belt is ", std::string(py::repr(belt)), ", expected 'auto', 'none' or a height z");
  const double z = belt.cast<double>();
  check(std::isfinite(z), "belt is ", z, ", expected a finite height");
  return tg::belt_choice::at_z(z * scale);
}

result measure(py::handle points, const std::string& method, const std::string& unit,
               py::handle belt, const py::dict& options) {
  // every argument checked before the work
  const tg::box_method how = tg::parse_box_method(method);
  const double scale = unit_scale(unit);
  const tg::belt_choice choice = parse_belt(belt, scale);
  result r;
  apply_mebb_options(r.options, options);
  const array_view v = cloud_view(points);
  {
    py::gil_scoped_release unlocked;
    r.m = with_cloud(v, scale,
                     [&](const auto& cloud) { return tg::measure(cloud, how, choice, r.options); });
  }
  r.factor = unit == "mm" ? 1000.0 : 1.0;
  static_cast<box&>(r) = box(r.m.box, r.factor);
  r.envelope = box(r.m.envelope, r.factor);
  r.input = py::reinterpret_borrow<py::object>(points);
  r.scale = scale;
  r.options.belt.sigma = std::max(r.options.belt.sigma, r.m.belt_sigma);  // as measure() cut
  return r;
}

/// Per-point labels (uint8: 0 body, 1 appendage, 2 belt, 3 outlier; geometry::label_points) of
/// an MEBB result, from the array it measured; None for a baseline box.
py::object labels(result& r) {
  if (!r.m.mebb) return py::none();
  if (r.labels_cache) return *r.labels_cache;
  const array_view v = cloud_view(r.input);
  check(static_cast<std::size_t>(v.shape[0]) == r.m.points_in, "points: the array holds ",
        v.shape[0], " points now, ", r.m.points_in, " when it was measured");
  py::array_t<std::uint8_t> out(v.shape[0]);
  {
    py::gil_scoped_release unlocked;
    const tg::rigid_transform to_frame =
        r.m.belt ? tg::belt_frame(*r.m.belt) : tg::rigid_transform{};
    tg::points p(static_cast<std::size_t>(v.shape[0]));  // in the frame the box was solved in
    with_cloud(v, r.scale, [&](const auto& cloud) {
      for (std::size_t i = 0; i < p.size(); ++i) p[i] = to_frame.apply(tg::point_at(cloud, i));
      return 0;
    });
    const auto l = tg::label_points(p, *r.m.mebb, r.m.belt.has_value(), r.options);
    for (std::size_t i = 0; i < l.size(); ++i)
      out.mutable_data()[i] = static_cast<std::uint8_t>(l[i]);
  }
  r.labels_cache = out;
  return out;
}

py::array read_cloud(const std::string& path) {
  tg::stored_cloud cloud;
  {
    py::gil_scoped_release unlocked;
    cloud = tg::read_cloud_stored(path);
  }
  return std::visit(
      [](const auto& c) -> py::array {
        if constexpr (std::is_same_v<std::decay_t<decltype(c)>, tg::float_cloud>) {
          const std::size_t n = c.kdtree_get_point_count();
          py::array_t<float> out({static_cast<py::ssize_t>(n), py::ssize_t{3}});
          float* o = out.mutable_data();
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t d = 0; d < 3; ++d) o[3 * i + d] = c.coord(i, d);
          return out;
        } else {
          py::array_t<double> out({static_cast<py::ssize_t>(c.size()), py::ssize_t{3}});
          double* o = out.mutable_data();
          for (std::size_t i = 0; i < c.size(); ++i)
            for (Eigen::Index d = 0; d < 3; ++d) o[3 * i + static_cast<std::size_t>(d)] = c[i][d];
          return out;
        }
      },
      cloud);
}

}  // namespace

void bind_geometry(py::module_& m) {
  py::class_<box>(m, "OrientedBox",
                  "A box with Open3D's OrientedBoundingBox names: center, R (columns: the axes), "
                  "extent (along each column of R), in the unit of the measured cloud.")
      .def_readonly("center", &box::center)
      .def_readonly("R", &box::R)
      .def_readonly("extent", &box::extent)
      .def("get_box_points", &box::corners,
           "The 8 corners (8, 3) in Open3D's OrientedBoundingBox.get_box_points() order.")
      .def_property_readonly("dims", &box::dims, "The side lengths, sorted L >= W >= H.")
      .def_property_readonly("volume", [](const box& b) { return b.extent.prod(); });

  py::class_<result, box>(m, "Measurement",
                          "tightfit.measure's result: the main body's box (center, R, extent, "
                          "get_box_points) and its envelope, status, reasons, uncertainty.")
      .def_property_readonly("method", [](const result& r) { return tg::method_name(r.m.method); })
      .def_property_readonly("status", [](const result& r) { return tg::status_name(r.m.status); })
      .def_property_readonly("reasons", [](const result& r) { return r.m.reasons; })
      .def_property_readonly("uncertainty_95",
                             [](const result& r) -> py::object {
                               if (!r.m.mebb) return py::none();
                               return py::cast(std::array<double, 3>{
                                   r.m.uncertainty[0] * r.factor, r.m.uncertainty[1] * r.factor,
                                   r.m.uncertainty[2] * r.factor});
                             })
      .def_property_readonly("dims",
                             [](const result& r) {
                               return std::array<double, 3>{r.m.dims[0] * r.factor,
                                                            r.m.dims[1] * r.factor,
                                                            r.m.dims[2] * r.factor};
                             })
      .def_property_readonly("box", [](const result& r) { return static_cast<const box&>(r); })
      .def_readonly("envelope", &result::envelope)
      .def_property_readonly("belt",
                             [](const result& r) -> py::object {
                               if (!r.m.belt) return py::none();
                               py::dict b;
                               b["normal"] = r.m.belt->normal;
                               b["offset"] = r.m.belt->offset * r.factor;
                               b["sigma"] = r.m.belt_sigma * r.factor;
                               return b;
                             })
      .def_property_readonly("flags",
                             [](const result& r) {
                               std::vector<std::string> f;
                               if (r.m.mebb)
                                 for (std::size_t k = 0; k < tg::mebb_flag_names.size(); ++k)
                                   if (r.m.mebb->flags >> k & 1u)
                                     f.emplace_back(tg::mebb_flag_names[k]);
                               return f;
                             })
      .def_property_readonly("trim",
                             [](const result& r) -> py::object {
                               if (!r.m.mebb) return py::none();
                               const char* faces[] = {"+x", "-x", "+y", "-y", "+z", "-z"};
                               py::dict t;
                               for (std::size_t f = 0; f < 6; ++f)
                                 t[faces[f]] = r.m.mebb->trim[f] * r.factor;
                               return t;
                             })
      .def_property_readonly("points", [](const result& r) { return r.m.points_in; })
      .def_property_readonly("points_used", [](const result& r) { return r.m.points_used; })
      .def_property_readonly("labels", &labels,
                             "Per point (uint8): 0 body, 1 appendage, 2 belt, 3 outlier "
                             "(MEBB only, else None), computed on first use from the array.")
      .def_property_readonly(
          "appendage_mask",
          [](result& r) -> py::object {
            py::object l = labels(r);
            if (l.is_none()) return l;
            return l.attr("__eq__")(1);
          },
          "Per point: True where MEBB trimmed the point as an appendage (MEBB only, else None).");

  m.def("_measure", &measure, py::arg("points"), py::arg("method"), py::arg("unit"),
        py::arg("belt"), py::arg("options"));
  m.def("_mebb_options", [] { return mebb_options_dict({}); });
  m.def("_read_cloud", &read_cloud, py::arg("path"),
        "Reads a PLY or XYZ/CSV cloud into an (N, 3) array: float32 for a binary PLY with float "
        "x, y, z (as stored), float64 otherwise.");
}

}  // namespace tightfit::python
