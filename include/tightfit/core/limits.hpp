// tightfit/core/limits.hpp: sizes that come from outside (a file header, a config.json extent,
// a command-line option), checked against what can exist before anything is allocated.
//
// One rule for every reader: a count that decides an allocation is first multiplied out with
// overflow checks (checked_product) and compared (check_size) with a limit that exists
// independently of the count: the file's own length, a declared maximum, or the memory this
// process may use (memory_limit_bytes: physical memory, lowered by `ulimit -v` / `ulimit -d`).
// The message names the value and the limit, e.g.
//   "config.json: the model has 8030261248 parameters, more than the 131200 values the
//    checkpoint holds"
// so that a hostile or mistaken size ends as a tightfit::error, never as std::bad_alloc, a
// length_error or a multi-gigabyte allocation that fails later.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/resource.h>
#include <unistd.h>
#endif

#include "tightfit/core/error.hpp"

namespace tightfit {

/// The product of non-negative counts, or nullopt when it does not fit in 64 bits.
inline std::optional<std::uint64_t> checked_product(std::initializer_list<std::uint64_t> factors) {
  std::uint64_t p = 1;
  for (std::uint64_t f : factors) {
    if (f != 0 && p > std::numeric_limits<std::uint64_t>::max() / f) return std::nullopt;
    p *= f;
  }
  return p;
}

/// a + b, or nullopt when it does not fit in 64 bits.
inline std::optional<std::uint64_t> checked_sum(std::uint64_t a, std::uint64_t b) {
  if (a > std::numeric_limits<std::uint64_t>::max() - b) return std::nullopt;
  return a + b;
}

/// A byte count for messages: "123 bytes", "1.5 MiB", "7.9 GiB".
inline std::string byte_string(std::uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return std::to_string(bytes) + " bytes";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", v, units[u]);
  return text;
}

/// Bytes this process may allocate: the machine's physical memory, lowered by the address-space
/// and data-segment limits (ulimit -v / -d) when they are set. Without a way to ask (not a
/// POSIX system): the largest 64-bit count.
inline std::uint64_t memory_limit_bytes() {
  std::uint64_t limit = std::numeric_limits<std::uint64_t>::max();
#if defined(__unix__) || defined(__APPLE__)
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0)
    if (auto p =
            checked_product({static_cast<std::uint64_t>(pages), static_cast<std::uint64_t>(page)}))
      limit = *p;
  for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit r{};
    if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
      limit = std::min<std::uint64_t>(limit, static_cast<std::uint64_t>(r.rlim_cur));
  }
#endif
  return limit;
}

/// Throws tightfit::error "<what> is <value>, more than <limit> (<limit_what>)" unless
/// value <= limit.
inline void check_size(std::string_view what, std::uint64_t value, std::uint64_t limit,
                       std::string_view limit_what) {
  check(value <= limit, what, " is ", value, ", more than ", limit, " (", limit_what, ")");
}

/// Throws tightfit::error naming `what` when a product of counts overflows 64 bits, else
/// returns it. `what` describes the product, e.g. "batch x seq tokens".
inline std::uint64_t checked_product_or_fail(std::string_view what,
                                             std::initializer_list<std::uint64_t> factors) {
  const auto p = checked_product(factors);
  check(p.has_value(), what, " does not fit in 64 bits");
  return *p;
}

/// Throws tightfit::error "<what> needs <bytes>, more than the <limit> this process may use
/// (...)" unless `bytes` fits memory_limit_bytes().
inline void check_memory(std::string_view what, std::uint64_t bytes) {
  const std::uint64_t limit = memory_limit_bytes();
  check(bytes <= limit, what, " needs ", byte_string(bytes), " (", bytes, " bytes), more than the ",
        byte_string(limit), " this process may use (physical memory, ulimit -v / -d)");
}

}  // namespace tightfit
