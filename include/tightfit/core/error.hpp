// tightfit/core/error.hpp: the one exception type of the library and the checks that raise it.
//
// Every public entry point validates its input (shapes, indices, files, clouds) and throws
// tightfit::error with a message that names the offending value and the expected one, e.g.
//   "rmsnorm_forward: y.rows is 7, expected 8 (x.rows)".
// Inner loops stay unchecked.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tightfit {

/// The single exception type thrown for bad input anywhere in tightfit.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  out.precision(17);
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

/// Throws tightfit::error with the streamed concatenation of `parts`.
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw error(detail::concat(std::forward<Parts>(parts)...));
}

/// Throws tightfit::error with the streamed concatenation of `parts` unless `condition` holds.
template <class... Parts>
void check(bool condition, Parts&&... parts) {
  if (!condition) fail(std::forward<Parts>(parts)...);
}

/// Checks that an extent equals the expected one: "<where>: <what> is <got>, expected <want>".
template <class Got, class Want>
void check_extent(const char* where, const char* what, Got got, Want want) {
  if (got != static_cast<Got>(want)) fail(where, ": ", what, " is ", got, ", expected ", want);
}

}  // namespace tightfit
