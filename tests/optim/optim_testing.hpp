// Helpers for the optimizer tests: tiny models with identical weights, weight snapshots.
#pragma once

#include <filesystem>
#include <vector>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/optim/checkpoint.hpp"
#include "tightfit/optim/optim.hpp"

namespace tightfit::optim_testing {

using ref = reference_backend<double>;

/// Every parameter value, by parameter.
template <class B>
std::vector<std::vector<double>> values_of(parameter_set<B>& p) {
  std::vector<std::vector<double>> out;
  for (std::size_t i = 0; i < p.size(); ++i) {
    auto v = p.value(i);
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

/// Largest relative difference over every parameter.
inline double max_diff(const std::vector<std::vector<double>>& a,
                       const std::vector<std::vector<double>>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, tightfit::testing::max_rel_diff(a[i], b[i], 1e-12));
  return worst;
}

/// save_checkpoint / load_checkpoint through a safetensors file at `path`.
template <class M, class Opt>
void save_state_file(const std::filesystem::path& path, M& model, const Opt& opt) {
  safetensors_writer w;
  save_checkpoint(w, model, opt);
  w.write(path);
}
template <class M, class Opt>
void load_state_file(const std::filesystem::path& path, M& model, Opt& opt) {
  load_checkpoint(safetensors_file::open(path), model, opt);
}

/// C (m, n) = alpha * op(X) op(Y) with op(X) (m, k), op(Y) (k, n): plain loops (the tests' own
/// arithmetic, independent of the backends).
inline std::vector<double> matmul(const std::vector<double>& x, const std::vector<double>& y,
                                  index_t m, index_t k, index_t n, bool tx, bool ty, double alpha) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0;
      for (index_t q = 0; q < k; ++q) {
        const double xv =
            tx ? x[static_cast<std::size_t>(q * m + i)] : x[static_cast<std::size_t>(i * k + q)];
        const double yv =
            ty ? y[static_cast<std::size_t>(j * k + q)] : y[static_cast<std::size_t>(q * n + j)];
        s += xv * yv;
      }
      c[static_cast<std::size_t>(i * n + j)] = alpha * s;
    }
  return c;
}

inline model_config config(index_t layers = 3) {
  return tightfit::testing::tiny_config(4, 2, true, false, layers);
}

}  // namespace tightfit::optim_testing
