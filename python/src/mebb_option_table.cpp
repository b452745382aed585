// The table of mebb_options fields by name (mebb_option_table.hpp).
#include "mebb_option_table.hpp"

#include <cmath>
#include <cstddef>
#include <functional>
#include <type_traits>

#include "tightfit/core/error.hpp"

namespace tightfit::python {

namespace {

using geometry::mebb_options;

/// Writes a Python value into a field of type T: bool takes True/False, integers take ints,
/// doubles take ints or floats (finite); anything else names the field and the value.
template <class T>
void assign(T& field, py::handle v, const char* name) {
  const std::string shown = py::repr(v);
  if constexpr (std::is_same_v<T, bool>) {
    check(py::isinstance<py::bool_>(v), "MEBB option ", name, " is ", shown,
          ", expected True or False");
    field = v.cast<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    check(py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v), "MEBB option ", name,
          " is ", shown, ", expected an integer");
    const long long x = v.cast<long long>();
    check(x >= 0 || std::is_signed_v<T>, "MEBB option ", name, " is ", x, ", expected >= 0");
    field = static_cast<T>(x);
  } else {
    check((py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)) &&
              !py::isinstance<py::bool_>(v),
          "MEBB option ", name, " is ", shown, ", expected a number");
    const double x = v.cast<double>();
    check(std::isfinite(x), "MEBB option ", name, " is ", x, ", expected a finite number");
    field = x;
  }
}

struct field {
  const char* name;
  std::function<void(mebb_options&, py::handle)> set;
  std::function<py::object(const mebb_options&)> get;
};

/// The field `member` of group `group`, named "group.member".
template <class G, class T>
field make(const char* name, G mebb_options::*group, T G::*member) {
  return {name, [=](mebb_options& o, py::handle v) { assign(o.*group.*member, v, name); },
          [=](const mebb_options& o) { return py::cast(o.*group.*member); }};
}

const std::vector<field>& fields() {
  using O = mebb_options;
  namespace g = geometry;
  static const std::vector<field> table = {
      make("belt.min_height", &O::belt, &g::mebb_belt_options::min_height),
      make("belt.sigma", &O::belt, &g::mebb_belt_options::sigma),
      make("belt.veil_share", &O::belt, &g::mebb_belt_options::veil_share),
      make("cleaning.enabled", &O::cleaning, &g::mebb_cleaning_options::enabled),
      make("cleaning.voxel", &O::cleaning, &g::mebb_cleaning_options::voxel),
      make("cleaning.cluster_radius", &O::cleaning, &g::mebb_cleaning_options::cluster_radius),
      make("cleaning.sor_k", &O::cleaning, &g::mebb_cleaning_options::sor_k),
      make("cleaning.sor_sigma", &O::cleaning, &g::mebb_cleaning_options::sor_sigma),
      make("cleaning.min_points", &O::cleaning, &g::mebb_cleaning_options::min_points),
      make("yaw.square_ratio", &O::yaw, &g::mebb_yaw_options::square_ratio),
      make("yaw.edge_always", &O::yaw, &g::mebb_yaw_options::edge_always),
      make("yaw.edge_radius", &O::yaw, &g::mebb_yaw_options::edge_radius),
      make("yaw.edge_elongation", &O::yaw, &g::mebb_yaw_options::edge_elongation),
      make("yaw.from_walls", &O::yaw, &g::mebb_yaw_options::from_walls),
      make("yaw.outer_iterations", &O::yaw, &g::mebb_yaw_options::outer_iterations),
      make("yaw.settle", &O::yaw, &g::mebb_yaw_options::settle),
      make("yaw.max_outer_iterations", &O::yaw, &g::mebb_yaw_options::max_outer_iterations),
      make("faces.column", &O::faces, &g::mebb_face_options::column),
      make("faces.eps", &O::faces, &g::mebb_face_options::eps),
      make("faces.kappa", &O::faces, &g::mebb_face_options::kappa),
      make("faces.tau", &O::faces, &g::mebb_face_options::tau),
      make("faces.safeguard_quantile", &O::faces, &g::mebb_face_options::safeguard_quantile),
      make("faces.belt_top_safeguard", &O::faces, &g::mebb_face_options::belt_top_safeguard),
      make("faces.side_band", &O::faces, &g::mebb_face_options::side_band),
      make("faces.snap_inner", &O::faces, &g::mebb_face_options::snap_inner),
      make("faces.snap_outer", &O::faces, &g::mebb_face_options::snap_outer),
      make("faces.side_quantile", &O::faces, &g::mebb_face_options::side_quantile),
      make("faces.max_passes", &O::faces, &g::mebb_face_options::max_passes),
      make("faces.adaptive", &O::faces, &g::mebb_face_options::adaptive),
      make("faces.retry_fraction", &O::faces, &g::mebb_face_options::retry_fraction),
      make("faces.fine", &O::faces, &g::mebb_face_options::fine),
      make("faces.fine_passes", &O::faces, &g::mebb_face_options::fine_passes),
      make("offsets.side", &O::offsets, &g::mebb_offset_options::side),
      make("offsets.side_pitch", &O::offsets, &g::mebb_offset_options::side_pitch),
      make("offsets.silhouette", &O::offsets, &g::mebb_offset_options::silhouette),
      make("offsets.shadow_reach", &O::offsets, &g::mebb_offset_options::shadow_reach),
      make("offsets.radius_max", &O::offsets, &g::mebb_offset_options::radius_max),
      make("offsets.edge_profile", &O::offsets, &g::mebb_offset_options::edge_profile),
      make("offsets.profile_depth", &O::offsets, &g::mebb_offset_options::profile_depth),
      make("offsets.profile_max_shift", &O::offsets, &g::mebb_offset_options::profile_max_shift),
      make("offsets.bias_side", &O::offsets, &g::mebb_offset_options::bias_side),
      make("offsets.bias_top", &O::offsets, &g::mebb_offset_options::bias_top),
      make("solid_edge.share", &O::solid_edge, &g::mebb_solid_edge_options::share),
      make("solid_edge.depth", &O::solid_edge, &g::mebb_solid_edge_options::depth),
      make("solid_edge.gap", &O::solid_edge, &g::mebb_solid_edge_options::gap),
      make("solid_edge.top_run", &O::solid_edge, &g::mebb_solid_edge_options::top_run),
      make("solid_edge.shadow_gap", &O::solid_edge, &g::mebb_solid_edge_options::shadow_gap),
      make("solid_edge.grip_trim", &O::solid_edge, &g::mebb_solid_edge_options::grip_trim),
      make("checks.past_reach", &O::checks, &g::mebb_check_options::past_reach),
      make("checks.hidden", &O::checks, &g::mebb_check_options::hidden),
      make("checks.hidden_height", &O::checks, &g::mebb_check_options::hidden_height),
      make("checks.hidden_margin", &O::checks, &g::mebb_check_options::hidden_margin),
      make("checks.hidden_flag_share", &O::checks, &g::mebb_check_options::hidden_flag_share),
      make("checks.hidden_top_points", &O::checks, &g::mebb_check_options::hidden_top_points),
      make("checks.appendage_flag", &O::checks, &g::mebb_check_options::appendage_flag),
      make("uncertainty.floor_top", &O::uncertainty, &g::mebb_uncertainty_options::floor_top),
      make("uncertainty.floor_side", &O::uncertainty, &g::mebb_uncertainty_options::floor_side),
      make("uncertainty.spread", &O::uncertainty, &g::mebb_uncertainty_options::spread),
      make("uncertainty.profile", &O::uncertainty, &g::mebb_uncertainty_options::profile),
      make("uncertainty.noise", &O::uncertainty, &g::mebb_uncertainty_options::noise),
      make("uncertainty.stability", &O::uncertainty, &g::mebb_uncertainty_options::stability),
      make("uncertainty.kappa_probe", &O::uncertainty, &g::mebb_uncertainty_options::kappa_probe),
      make("uncertainty.scale", &O::uncertainty, &g::mebb_uncertainty_options::scale),
      make("uncertainty.phase_check", &O::uncertainty, &g::mebb_uncertainty_options::phase_check),
  };
  return table;
}

}  // namespace

void apply_mebb_options(mebb_options& o, const py::dict& options) {
  for (const auto& [key, value] : options) {
    const std::string name = py::str(key);
    const field* f = nullptr;
    for (const auto& candidate : fields())
      if (name == candidate.name) f = &candidate;
    if (f == nullptr) {
      std::string groups;  // the group's fields when the group is known, else the groups
      const std::string group = name.substr(0, name.find('.'));
      for (const auto& candidate : fields()) {
        const std::string n = candidate.name;
        if (n.rfind(group + ".", 0) == 0) groups += (groups.empty() ? "" : ", ") + n;
      }
      if (groups.empty())
        groups =
            "belt, cleaning, yaw, faces, offsets, solid_edge, checks, uncertainty (group.field)";
      fail("unknown MEBB option '", name, "' (expected one of: ", groups, ")");
    }
    f->set(o, value);
  }
  geometry::detail::check_options(o);
}

py::dict mebb_options_dict(const mebb_options& o) {
  py::dict out;
  for (const auto& f : fields()) out[f.name] = f.get(o);
  return out;
}

}  // namespace tightfit::python
