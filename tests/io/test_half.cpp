// Tests of io/detail/half.hpp against an independent oracle: the value of every bit pattern
// computed with ldexp from the IEEE field definitions, and rounding checked by searching the
// sorted table of representable values (nearest, ties to the even pattern, overflow to inf).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "tightfit/io/detail/half.hpp"

using namespace tightfit::io::detail;

namespace {

/// The value of a 16-bit pattern with `eb` exponent and `fb` fraction bits, from the field
/// definitions (independent of the code under test).
double narrow_value(std::uint32_t bits, int eb, int fb) {
  const int bias = (1 << (eb - 1)) - 1;
  const bool negative = (bits >> 15) != 0;
  const int e = static_cast<int>((bits >> fb) & ((1u << eb) - 1));
  const auto m = static_cast<double>(bits & ((1u << fb) - 1));
  double v = 0;
  if (e == (1 << eb) - 1)
    v = m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(m, 1 - bias - fb);
  else
    v = std::ldexp(std::ldexp(1.0, fb) + m, e - bias - fb);
  return negative ? -v : v;
}

struct format {
  int eb, fb;
  std::uint16_t (*encode)(double);
  float (*decode)(std::uint16_t);
};
const format f16{5, 10, double_to_f16, f16_to_float};
const format bf16{8, 7, double_to_bf16, bf16_to_float};

/// Non-negative finite values with their patterns, ascending, then the first overflowing value
/// of the same spacing (2^(emax+1)) mapped to the infinity pattern (even mantissa).
std::vector<std::pair<double, std::uint16_t>> table(const format& f) {
  std::vector<std::pair<double, std::uint16_t>> t;
  const std::uint32_t inf_bits = ((1u << f.eb) - 1) << f.fb;
  for (std::uint32_t b = 0; b < inf_bits; ++b)
    t.emplace_back(narrow_value(b, f.eb, f.fb), static_cast<std::uint16_t>(b));
  const double max = t.back().first;
  const double ulp = max - t[t.size() - 2].first;
  t.emplace_back(max + ulp, static_cast<std::uint16_t>(inf_bits));
  return t;
}

/// Round-to-nearest-even by search in the table.
std::uint16_t oracle(double x, const std::vector<std::pair<double, std::uint16_t>>& t) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= t.back().first) return static_cast<std::uint16_t>(sign | t.back().second);
  auto hi = std::lower_bound(t.begin(), t.end(), a,
                             [](const auto& entry, double v) { return entry.first < v; });
  if (hi->first == a || hi == t.begin()) return static_cast<std::uint16_t>(sign | hi->second);
  auto lo = hi - 1;
  const double dlo = a - lo->first, dhi = hi->first - a;
  std::uint16_t pick = dlo < dhi ? lo->second : hi->second;
  if (dlo == dhi) pick = (lo->second & 1u) == 0 ? lo->second : hi->second;
  return static_cast<std::uint16_t>(sign | pick);
}

void check_decode_all(const format& f) {
  int mismatches = 0, nans = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const double want = narrow_value(b, f.eb, f.fb);
    const float got = f.decode(static_cast<std::uint16_t>(b));
    if (std::isnan(want)) {
      nans += std::isnan(got) ? 1 : 0;
      continue;
    }
    if (static_cast<double>(got) != want || std::signbit(got) != std::signbit(want)) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(nans == 2 * ((1 << f.fb) - 1));  // every NaN pattern decodes to NaN
}

void check_encode(const format& f, double lo_exp, double hi_exp, std::uint64_t seed) {
  const auto t = table(f);
  std::vector<double> inputs;
  for (std::size_t i = 0; i + 1 < t.size(); ++i) {
    const double lo = t[i].first, hi = t[i + 1].first, mid = 0.5 * (lo + hi);
    for (double v : {lo, mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300)}) {
      inputs.push_back(v);
      inputs.push_back(-v);
    }
  }
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> exponent(lo_exp, hi_exp), unit(1.0, 2.0);
  for (int i = 0; i < 100000; ++i)
    inputs.push_back((i % 2 ? -1 : 1) * unit(gen) * std::exp2(exponent(gen)));
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {0.0, -0.0, inf, -inf, 1e300, -1e300, 1e-300, -1e-300, 5e-324,
                   static_cast<double>(std::numeric_limits<float>::denorm_min())})
    inputs.push_back(v);

  int mismatches = 0, float_mismatches = 0;
  for (double x : inputs) {
    const std::uint16_t want = oracle(x, t);
    if (f.encode(x) != want) ++mismatches;
    // A float input rounds like its (exact) double value.
    const auto xf = static_cast<float>(x);
    if (f.encode(static_cast<double>(xf)) != oracle(static_cast<double>(xf), t)) ++float_mismatches;
  }
  CHECK(inputs.size() > 100000);
  CHECK(mismatches == 0);
  CHECK(float_mismatches == 0);

  // NaN stays a NaN, with its sign.
  const std::uint16_t n = f.encode(std::numeric_limits<double>::quiet_NaN());
  CHECK(std::isnan(f.decode(n)));
  CHECK(std::isnan(f.decode(f.encode(-std::numeric_limits<double>::quiet_NaN()))));
  CHECK(std::signbit(f.decode(f.encode(-std::numeric_limits<double>::quiet_NaN()))));
  // Signalling NaN with a payload only in the low bits is still a NaN (not infinity).
  CHECK(std::isnan(f.decode(f.encode(std::bit_cast<double>(std::uint64_t{0x7ff0000000000001})))));
}

}  // namespace

TEST_CASE("f16 and bf16 decode every bit pattern exactly (subnormals, inf, NaN, -0)") {
  check_decode_all(f16);
  check_decode_all(bf16);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16_to_float(0x7bff) == 65504.0f);               // largest finite
  CHECK(bf16_to_float(0x0001) == std::ldexp(1.0f, -133));
}

TEST_CASE("double -> f16 rounds to nearest even, overflows to inf") {
  check_encode(f16, -30.0, 17.0, 1);
  // Spot checks derived from the definitions: 65520 is the midpoint between the largest
  // finite 65504 (odd pattern) and 2^16, so it rounds to inf; just below it stays finite.
  CHECK(double_to_f16(65520.0) == 0x7c00);
  CHECK(double_to_f16(std::nextafter(65520.0, 0.0)) == 0x7bff);
  CHECK(double_to_f16(std::ldexp(1.0, -25)) == 0x0000);  // half the smallest subnormal: to even
  CHECK(double_to_f16(std::nextafter(std::ldexp(1.0, -25), 1.0)) == 0x0001);
  CHECK(double_to_f16(-0.0) == 0x8000);
}

TEST_CASE("double -> bf16 rounds to nearest even, overflows to inf") {
  check_encode(bf16, -140.0, 130.0, 2);
  CHECK(double_to_bf16(1.0 + std::ldexp(1.0, -8)) == 0x3f80);      // tie: to even (1.0)
  CHECK(double_to_bf16(1.0 + 3 * std::ldexp(1.0, -8)) == 0x3f82);  // tie: to even (1+2^-6)
}

TEST_CASE("widening then narrowing is the identity on every non-NaN pattern") {
  for (const format* f : {&f16, &bf16}) {
    int bad = 0;
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const float v = f->decode(static_cast<std::uint16_t>(b));
      if (std::isnan(v)) continue;
      if (f->encode(static_cast<double>(v)) != b) ++bad;
    }
    CHECK(bad == 0);
  }
}
