// tightfit/io/detail/half.hpp: exact conversions between IEEE binary16 (F16), bfloat16 (BF16)
// and float/double. Widening is exact (subnormals, infinities and NaN payloads included);
// narrowing rounds to nearest, ties to even, directly from the double value (no double
// rounding through float), overflows to infinity and keeps NaN a (quiet) NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace tightfit::io::detail {

/// binary16 bits -> float (exact).
inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f)  // inf / NaN: payload kept
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero / subnormal: mantissa * 2^-24 (exact in float)
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// bfloat16 bits -> float (exact: bf16 is the upper half of a float).
inline float bf16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// Rounds a double to a binary format with `ExpBits` exponent and `FracBits` fraction bits
/// (16 bits in all), to nearest, ties to even. Returns the bit pattern.
template <int ExpBits, int FracBits>
std::uint16_t round_double_to_narrow(double x) {
  static_assert(1 + ExpBits + FracBits == 16);
  constexpr int bias = (1 << (ExpBits - 1)) - 1;
  constexpr int emin = 1 - bias;
  constexpr std::uint32_t inf_bits = ((1u << ExpBits) - 1u) << FracBits;
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
  const auto sign = static_cast<std::uint32_t>((bits >> 48) & 0x8000u);
  const int exponent = static_cast<int>((bits >> 52) & 0x7ffu);
  const std::uint64_t fraction = bits & ((std::uint64_t{1} << 52) - 1);
  if (exponent == 0x7ff) {
    if (fraction == 0) return static_cast<std::uint16_t>(sign | inf_bits);
    const auto payload = static_cast<std::uint32_t>(fraction >> (52 - FracBits));
    return static_cast<std::uint16_t>(sign | inf_bits | (1u << (FracBits - 1)) | payload);
  }
  if (exponent == 0) return static_cast<std::uint16_t>(sign);  // |x| < 2^-1022: rounds to 0
  const int e = exponent - 1023;                               // x = m * 2^(e - 52)
  const std::uint64_t m = fraction | (std::uint64_t{1} << 52);
  int shift = 52 - FracBits;
  if (e < emin) shift += emin - e;  // subnormal result: quantum 2^(emin - FracBits)
  if (shift > 62) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
  std::uint64_t q = m >> shift;
  const std::uint64_t rest = m & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t half = std::uint64_t{1} << (shift - 1);
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
  std::uint64_t magnitude = q;  // subnormal (q may carry into the smallest normal)
  if (e >= emin) {
    if (e - emin >= (1 << ExpBits)) return static_cast<std::uint16_t>(sign | inf_bits);
    magnitude = (static_cast<std::uint64_t>(e - emin) << FracBits) + q;  // q holds the leading 1
  }
  if (magnitude >= inf_bits) return static_cast<std::uint16_t>(sign | inf_bits);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(magnitude));
}

/// double -> binary16 bits, round to nearest even.
inline std::uint16_t double_to_f16(double x) {
  return round_double_to_narrow<5, 10>(x);
}
/// double -> bfloat16 bits, round to nearest even.
inline std::uint16_t double_to_bf16(double x) {
  return round_double_to_narrow<8, 7>(x);
}

}  // namespace tightfit::io::detail
