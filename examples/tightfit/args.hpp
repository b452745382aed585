// A small "--key value" / "--flag" parser for the tightfit subcommands.
#pragma once

#include <cstdio>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace tightfit::cli {

/// Thrown for wrong arguments: the subcommand prints the usage and exits 2.
struct usage_error {
  std::string message;
};

/// `text` as a number; anything else (empty, trailing characters) is a usage error naming `key`.
inline double parse_number(const std::string& key, const std::string& text) {
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

/// Parsed options of one subcommand. Options take one value unless declared as flags.
class arguments {
 public:
  /// argv[0] is the subcommand name; `valued` and `flags` list the accepted option names.
  arguments(int argc, char** argv, std::set<std::string> valued, std::set<std::string> flags) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        help_ = true;
      } else if (flags.contains(a)) {
        values_[a] = "1";
      } else if (valued.contains(a)) {
        if (i + 1 >= argc) throw usage_error{a + " needs a value"};
        values_[a] = argv[++i];
      } else if (a.rfind("--", 0) == 0) {
        throw usage_error{"unknown option " + a};
      } else {
        positional_.push_back(a);
      }
    }
  }

  bool help() const { return help_; }
  bool has(const std::string& key) const { return values_.contains(key); }
  std::string get(const std::string& key, const std::string& fallback = "") const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : it->second;
  }
  /// The option's value as a number; a malformed number is a usage error naming it.
  double number(const std::string& key, double fallback) const {
    return has(key) ? parse_number(key, get(key)) : fallback;
  }
  long long integer(const std::string& key, long long fallback) const {
    if (!has(key)) return fallback;
    try {
      std::size_t used = 0;
      const long long v = std::stoll(get(key), &used);
      if (used == get(key).size()) return v;
    } catch (...) {
    }
    throw usage_error{key + " expects an integer, got '" + get(key) + "'"};
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  bool help_ = false;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

/// Runs body(args); usage errors print the message and the usage, and return 2.
template <class Body>
int with_arguments(int argc, char** argv, std::set<std::string> valued, std::set<std::string> flags,
                   const char* usage, Body&& body) {
  try {
    arguments args(argc, argv, std::move(valued), std::move(flags));
    if (args.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    return body(args);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "tightfit %s: %s\n%s", argv[0], e.message.c_str(), usage);
    return 2;
  }
}

}  // namespace tightfit::cli
