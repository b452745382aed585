// Option values of the tightfit tool: numbers, integers and byte counts parsed strictly, each
// error a usage_error naming the option and the value (exit 2).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

namespace tightfit::cli {

/// Thrown for wrong arguments: the subcommand prints the usage and exits 2.
struct usage_error {
  std::string message;
};

/// Whether `text` is a plain decimal number: an optional sign, digits with an optional decimal
/// point, an optional exponent; nothing else (no spaces, no hexadecimal "0x10", no "inf" or "nan").
inline bool is_decimal(const std::string& text) {
  std::size_t i = 0, n = text.size();
  auto digits = [&] {
    const std::size_t from = i;
    while (i < n && text[i] >= '0' && text[i] <= '9') ++i;
    return i - from;
  };
  if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
  std::size_t mantissa = digits();
  if (i < n && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == n;
}

/// `text` as a number; anything else (empty, trailing characters) is a usage error naming `key`.
inline double parse_number(const std::string& key, const std::string& text) {
  if (!is_decimal(text)) throw usage_error{key + " expects a number, got '" + text + "'"};
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw usage_error{key + " expects a number, got '" + text + "'"};
  return v;
}

/// `text` as an integer in [min, max]: decimal digits, or a number written with an exponent
/// that is an exact integer (1e6). Anything else, or a value outside the range, is a usage
/// error naming the option, the value and the range.
inline long long parse_integer(const std::string& key, const std::string& text, long long min,
                               long long max) {
  if (!is_decimal(text)) throw usage_error{key + " expects an integer, got '" + text + "'"};
  long long v = 0;
  bool ok = false;
  try {
    std::size_t used = 0;
    v = std::stoll(text, &used);
    ok = used == text.size();
  } catch (const std::out_of_range&) {
    throw usage_error{key + " is " + text + ", outside [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]"};
  } catch (const std::exception&) {
  }
  if (!ok) {  // 1e6, 2.5e3: an exact integer written with an exponent
    std::size_t used = 0;
    double d = 0;
    try {
      d = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || !std::isfinite(d) || d != std::floor(d))
      throw usage_error{key + " expects an integer, got '" + text + "'"};
    if (d < static_cast<double>(min) || d > static_cast<double>(max))
      throw usage_error{key + " is " + text + ", outside [" + std::to_string(min) + ", " +
                        std::to_string(max) + "]"};
    v = static_cast<long long>(d);
  }
  if (v < min || v > max)
    throw usage_error{key + " is " + text + ", outside [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]"};
  return v;
}

/// `text` as a finite number in [min, max]; inf, nan and values outside the range are usage
/// errors naming the option, the value and the range.
inline double parse_real(const std::string& key, const std::string& text, double min, double max) {
  const double v = parse_number(key, text);
  if (!std::isfinite(v) || v < min || v > max) {
    char range[96];
    std::snprintf(range, sizeof range, "[%g, %g]", min, max);
    throw usage_error{key + " is " + text + ", expected a finite number in " + range};
  }
  return v;
}

/// A byte count: a number with an optional suffix K, M, G or T (powers of 1024, either case):
/// "512M", "4G", "1.5G", "1000000". It must be > 0 and below 2^64 bytes; anything else (inf,
/// -1, 1e30, "4Gx") is a usage error naming the option and the value.
inline std::uint64_t parse_bytes(const std::string& key, const std::string& text) {
  std::string digits = text;
  double scale = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K':
      case 'k':
        scale = 1024.0;
        break;
      case 'M':
      case 'm':
        scale = 1024.0 * 1024.0;
        break;
      case 'G':
      case 'g':
        scale = 1024.0 * 1024.0 * 1024.0;
        break;
      case 'T':
      case 't':
        scale = 1024.0 * 1024.0 * 1024.0 * 1024.0;
        break;
      default:
        break;
    }
    if (scale > 1) digits.pop_back();
  }
  std::size_t used = 0;
  double v = 0;
  try {
    if (is_decimal(digits)) v = std::stod(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != digits.size() || !std::isfinite(v))
    throw usage_error{key + " expects a byte count like 4G, got '" + text + "'"};
  const double bytes = v * scale;
  if (!(bytes >= 1)) throw usage_error{key + " is " + text + ", expected at least 1 byte"};
  if (bytes >= 18446744073709551616.0)  // 2^64
    throw usage_error{key + " is " + text + ", expected less than 2^64 bytes (16 EiB)"};
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace tightfit::cli
