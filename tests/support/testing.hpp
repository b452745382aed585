// Helpers shared by tightfit's tests: seeded random data and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::testing {

/// Fills `out` with uniform values in [lo, hi) from a seeded generator.
template <class T>
void fill_uniform(std::span<T> out, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (auto& x : out) x = static_cast<T>(dist(gen));
}

/// A vector of n uniform values in [lo, hi).
template <class T>
std::vector<T> uniform(index_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::vector<T> v(static_cast<std::size_t>(n));
  fill_uniform<T>(v, seed, lo, hi);
  return v;
}

/// max_i |a_i - b_i| / max(max_i |b_i|, floor): a relative error robust to tiny entries.
template <class A, class B>
double max_rel_diff(std::span<const A> a, std::span<const B> b, double floor = 1e-300) {
  double num = 0, den = floor;
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  if (a.size() != b.size()) return INFINITY;
  return num / den;
}

template <class A, class B>
double max_rel_diff(const std::vector<A>& a, const std::vector<B>& b, double floor = 1e-300) {
  return max_rel_diff(std::span<const A>(a), std::span<const B>(b), floor);
}

/// The elements of a (possibly strided) view, row by row.
template <class T>
std::vector<std::remove_const_t<T>> to_vector(matrix_view<T> v) {
  std::vector<std::remove_const_t<T>> out;
  out.reserve(static_cast<std::size_t>(v.rows * v.cols));
  for (index_t i = 0; i < v.rows; ++i)
    for (index_t j = 0; j < v.cols; ++j) out.push_back(v(i, j));
  return out;
}

}  // namespace tightfit::testing
