// Helpers for the kernel tests: small dense matrices, central finite differences, error checks.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "support/testing.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::testing {

/// A dense row-major (rows, cols) matrix of doubles owned by the test.
struct dmat {
  index_t rows = 0, cols = 0;
  std::vector<double> v;

  dmat() = default;
  dmat(index_t r, index_t c, double value = 0.0)
      : rows(r), cols(c), v(static_cast<std::size_t>(r * c), value) {}
  /// Uniform entries in [lo, hi) from a seed.
  static dmat random(index_t r, index_t c, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
    dmat m(r, c);
    fill_uniform<double>(m.v, seed, lo, hi);
    return m;
  }
  double& operator()(index_t i, index_t j) { return v[static_cast<std::size_t>(i * cols + j)]; }
  double operator()(index_t i, index_t j) const {
    return v[static_cast<std::size_t>(i * cols + j)];
  }
  matrix_view<double> view() { return {v.data(), rows, cols}; }
  matrix_view<const double> cview() const { return {v.data(), rows, cols}; }
  std::span<double> span() { return v; }
  std::span<const double> cspan() const { return v; }
};

/// sum_i w_i y_i.
inline double weighted_sum(const std::vector<double>& w, const std::vector<double>& y) {
  REQUIRE(w.size() == y.size());
  return std::inner_product(w.begin(), w.end(), y.begin(), 0.0);
}

/// Central finite differences of f() with respect to every entry of x (restored afterwards).
inline std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& f,
                                        double h = 1e-6) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double old = x[i];
    x[i] = old + h;
    const double fp = f();
    x[i] = old - h;
    const double fm = f();
    x[i] = old;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

/// Relative tolerance of gradient checks (max abs difference over max abs entry).
inline constexpr double grad_tol = 1e-6;

/// Runs `call`, expects tightfit::error whose message contains every string of `parts`.
template <class Call>
void check_error(Call&& call, std::initializer_list<std::string> parts) {
  try {
    call();
    FAIL("no tightfit::error thrown; expected one mentioning " << *parts.begin());
  } catch (const error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) {
      CHECK_MESSAGE(msg.find(p) != std::string::npos, "'" << p << "' missing from: " << msg);
    }
  }
}

}  // namespace tightfit::testing
