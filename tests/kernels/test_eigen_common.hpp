// Helpers shared by the eigen_backend tests: padded (strided) matrices whose padding must stay
// untouched, tolerances per value type, and an eigen/reference pair of backends.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "reference_testing.hpp"  // check_error
#include "support/testing.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/backend/reference.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::testing {

/// Relative agreement expected between eigen_backend and reference_backend.
template <class T>
constexpr double eigen_tol() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

/// A (rows, cols) matrix stored with row stride cols + pad; the padding holds a sentinel that no
/// kernel may overwrite.
template <class T>
struct padded {
  static constexpr double sentinel = 12345.0;
  index_t rows = 0, cols = 0, stride = 0;
  std::vector<T> buf;

  padded() = default;
  padded(index_t r, index_t c, index_t pad = 0)
      : rows(r), cols(c), stride(c + pad), buf(static_cast<std::size_t>(r * (c + pad)), T(0)) {
    for (index_t i = 0; i < r; ++i)
      for (index_t j = c; j < stride; ++j) at(i, j) = static_cast<T>(sentinel);
  }
  /// Uniform entries in [lo, hi) from a seed.
  static padded random(index_t r, index_t c, std::uint64_t seed, index_t pad = 0, double lo = -1.0,
                       double hi = 1.0) {
    padded m(r, c, pad);
    const auto vals = uniform<T>(r * c, seed, lo, hi);
    for (index_t i = 0; i < r; ++i)
      for (index_t j = 0; j < c; ++j) m.at(i, j) = vals[static_cast<std::size_t>(i * c + j)];
    return m;
  }
  T& at(index_t i, index_t j) { return buf[static_cast<std::size_t>(i * stride + j)]; }
  T at(index_t i, index_t j) const { return buf[static_cast<std::size_t>(i * stride + j)]; }
  matrix_view<T> view() { return {buf.data(), rows, cols, stride}; }
  matrix_view<const T> cview() const { return {buf.data(), rows, cols, stride}; }
  /// The elements row by row, without padding.
  std::vector<T> values() const { return to_vector(cview()); }
  bool padding_intact() const {
    for (index_t i = 0; i < rows; ++i)
      for (index_t j = cols; j < stride; ++j)
        if (at(i, j) != static_cast<T>(sentinel)) return false;
    return true;
  }
};

/// max relative difference of two matrices' elements.
template <class T>
double rel_diff(const padded<T>& a, const padded<T>& b) {
  return max_rel_diff(a.values(), b.values());
}

/// Checks that eigen's result `got` matches the reference result `want` within eigen_tol<T>()
/// (times `slack`), and that neither wrote into its padding.
template <class T>
void check_matches(const padded<T>& got, const padded<T>& want, const std::string& what,
                   double slack = 1.0) {
  const double err = rel_diff(got, want);
  CHECK_MESSAGE(err <= eigen_tol<T>() * slack, what << ": relative difference " << err);
  CHECK_MESSAGE(got.padding_intact(), what << ": padding overwritten");
}

template <class T>
void check_matches(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                   double slack = 1.0) {
  REQUIRE(got.size() == want.size());
  const double err = max_rel_diff(got, want);
  CHECK_MESSAGE(err <= eigen_tol<T>() * slack, what << ": relative difference " << err);
}

/// Options that force every parallel code path even on small shapes.
inline eigen_backend_options eager_parallel_options() {
  eigen_backend_options o;
  o.gemm_parallel_min_flops = 0;
  o.gemm_min_block = 4;
  return o;
}

}  // namespace tightfit::testing
