// The one argument parser of the tightfit tool. Each command declares its options once, as a
// command_spec (name, value, what it does, default, TRL's name); from that declaration come the
// parser (`--key value`, `--key=value`, flags, positional arguments, `--config FILE`), the
// command's `--help` and the options table of docs/tool.md (`tightfit help CMD --markdown`,
// which tests/cli/test_cli_docs.cpp compares with the docs). A value read by a name the command
// did not declare is a programming error (std::logic_error), so a typo cannot pass silently.
//
// Why not CLI11: the tool's contract for a wrong argument (one line naming the option and the
// value, exit 2; docs/tool.md), its strict value parsers (values.hpp), TRL names for config
// files and a docs table generated from the same declarations are most of the work, and none of
// them is CLI11's; this parser is what remains (about 300 lines, no dependency).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "values.hpp"

namespace tightfit::cli {

/// The parts appended in order (GCC 12 warns, wrongly, on `"literal" + std::string(...)`).
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (out.append(parts), ...);
  return out;
}

/// One option of a command.
struct option_spec {
  std::string_view name;      ///< "--lr"
  std::string_view value;     ///< what the value is in the help ("X", "DIR"); empty: a flag
  std::string_view help;      ///< what it does (one paragraph; the help wraps it)
  std::string_view fallback;  ///< the default when not given, shown as such; empty: none
  std::string_view trl;       ///< TRL's (or transformers') name for it in a --config file
  std::string_view alias_of;  ///< another name of that option ("--clip" of "--max-grad-norm")

  option_spec(std::string_view name_, std::string_view value_ = {}, std::string_view help_ = {},
              std::string_view fallback_ = {}, std::string_view trl_ = {},
              std::string_view alias_of_ = {})
      : name(name_),
        value(value_),
        help(help_),
        fallback(fallback_),
        trl(trl_),
        alias_of(alias_of_) {}
  bool flag() const { return value.empty(); }
};

/// One option of a config file, as the command's option: --name value (a flag: no value).
struct config_option {
  std::string key;  ///< the file's key, for messages
  std::string name;
  std::string value;
  bool flag = false;
};

struct command_spec;
/// Reads `--config path` into the command's options (config_file.hpp).
using config_reader = std::vector<config_option> (*)(const std::string& path,
                                                     const command_spec& command);

/// A command: its name, its synopsis (after "usage: tightfit NAME "), its options, what its
/// positional arguments are (empty: none), and the text the help ends with.
struct command_spec {
  std::string name;                  ///< "train", "bench stream"
  std::string program = "tightfit";  ///< what the usage line starts with
  std::string synopsis;
  std::vector<option_spec> options;
  std::string positional;  ///< "CLOUD [CLOUD ...]"
  std::string notes;
  config_reader config = nullptr;  ///< reads --config (which must then be an option)
  /// Names the command refuses with a pointer to its own option (one name, one meaning).
  std::vector<std::pair<std::string, std::string>> misnamed;

  /// The option named `name` (an alias gives its own entry); nullptr when none is.
  const option_spec* find(std::string_view option) const {
    for (const auto& o : options)
      if (o.name == option) return &o;
    return nullptr;
  }
  /// The option a name stands for: itself, or what it is an alias of.
  std::string_view canonical(std::string_view option) const {
    const option_spec* o = find(option);
    return o != nullptr && !o->alias_of.empty() ? o->alias_of : option;
  }
  /// "usage: tightfit NAME SYNOPSIS\n".
  std::string usage() const {
    return concat("usage: ", program, name.empty() ? "" : " ", name, " ", synopsis, "\n");
  }
};

/// `text` wrapped to lines of at most `width` characters, each after `indent` spaces but the
/// first (which continues a line already `first` characters long).
inline std::string wrapped(std::string_view text, std::size_t first, std::size_t indent,
                           std::size_t width) {
  std::string out;
  std::size_t column = first;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t end = std::min(text.find(' ', i), text.size());
    const std::string_view word = text.substr(i, end - i);
    if (column > indent && column + 1 + word.size() > width) {
      out += '\n';
      out.append(indent, ' ');
      column = indent;
    } else if (column > indent || (column == indent && !out.empty() && out.back() != ' ')) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    i = end + 1;
  }
  return out;
}

/// What the help says of an option after its text: its default, its TRL name, its alias.
inline std::string option_facts(const option_spec& o) {
  std::string facts;
  auto add = [&](const std::string& s) { facts += (facts.empty() ? "" : "; ") + s; };
  if (!o.fallback.empty()) add(concat("default ", o.fallback));
  if (!o.trl.empty()) add(concat("config: ", o.trl));
  return facts;
}

/// The command's help: the usage, every option with its value, text and default, the notes.
inline std::string help_text(const command_spec& c) {
  constexpr std::size_t column = 26, width = 100;
  std::string out = c.usage();
  if (!c.options.empty()) out += "options:\n";
  for (const auto& o : c.options) {
    const std::string head = concat("  ", o.name, o.flag() ? "" : " ", o.value);
    std::string text =
        o.alias_of.empty() ? std::string(o.help) : concat("the same as ", o.alias_of);
    if (const std::string facts = option_facts(o); !facts.empty())
      text += (text.empty() ? "(" : " (") + facts + ")";
    if (head.size() + 2 > column) {
      out += head + '\n';
      out.append(column, ' ');
    } else {
      out += head + std::string(column - head.size(), ' ');
    }
    out += wrapped(text, column, column, width) + "\n";
  }
  if (!c.notes.empty()) out += c.notes + (c.notes.back() == '\n' ? "" : "\n");
  return out;
}

/// `text` for a Markdown table cell: '|' escaped.
inline std::string table_cell(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

/// docs/tool.md's options table of the command: | option | default | config key | what |.
inline std::string markdown_options(const command_spec& c) {
  std::string out = "| option | default | config key | what |\n|---|---|---|---|\n";
  for (const auto& o : c.options) {
    const std::string head = concat(o.name, o.flag() ? "" : " ", o.value);
    const std::string text =
        o.alias_of.empty() ? std::string(o.help) : concat("the same as `", o.alias_of, "`");
    out += concat("| `", table_cell(head), "` | ",
                  o.fallback.empty() ? "" : concat("`", table_cell(o.fallback), "`"), " | ",
                  o.trl.empty() ? "" : concat("`", o.trl, "`"), " | ", table_cell(text), " |\n");
  }
  return out;
}

/// A command line's items and where each came from ("" the command line itself).
struct command_line {
  std::vector<std::string> items, origins;
};

/// argv after the command's name, with each `--config FILE` replaced by the file's options
/// (spec.config), all of them before the command line's, which so override them.
inline command_line expand_config(const command_spec& spec, int argc, char** argv) {
  command_line line;
  std::vector<std::string> given(argv + 1, argv + argc);
  if (spec.config == nullptr) {
    line.items = given;
    return line;
  }
  std::vector<std::string> rest;
  for (std::size_t i = 0; i < given.size(); ++i) {
    std::string path;
    if (given[i] == "--config") {
      if (i + 1 >= given.size()) throw usage_error{"--config needs a value"};
      path = given[++i];
    } else if (given[i].rfind("--config=", 0) == 0) {
      path = given[i].substr(9);
    } else {
      rest.push_back(given[i]);
      continue;
    }
    for (const auto& o : spec.config(path, spec)) {
      line.items.push_back(o.name + (o.flag ? "" : "=" + o.value));
      line.origins.push_back("--config " + path + " key '" + o.key + "'");
    }
  }
  line.origins.resize(line.origins.size() + rest.size());
  line.items.insert(line.items.end(), rest.begin(), rest.end());
  return line;
}

/// Parsed options of one command: the values given (last one wins), where each came from, and
/// the positional arguments.
class arguments {
 public:
  /// `items`: the arguments after the command's name; origins[i] (when given) names where item i
  /// came from ("--config F key 'k'"; empty: the command line). Throws usage_error for an unknown
  /// option, a missing value, or a positional argument the command does not take.
  arguments(const command_spec& spec, const std::vector<std::string>& items,
            const std::vector<std::string>& origins = {})
      : spec_(&spec) {
    for (std::size_t i = 0; i < items.size(); ++i) {
      std::string a = items[i];
      const std::string origin = i < origins.size() ? origins[i] : std::string();
      const std::string from = origin.empty() ? "" : " (" + origin + ")";
      if (a == "--help" || a == "-h") {
        help_ = true;
        continue;
      }
      std::string inline_value;
      bool has_inline = false;
      if (const auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos && eq > 2) {
        inline_value = a.substr(eq + 1);
        a.resize(eq);
        has_inline = true;
      }
      const option_spec* o = spec.find(a);
      const bool looks_like_option =
          a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.';
      for (const auto& [name, why] : spec.misnamed)
        if (o == nullptr && a == name) throw usage_error{why};
      if (o == nullptr && looks_like_option) throw usage_error{"unknown option '" + a + "'" + from};
      if (o == nullptr) {
        if (spec.positional.empty()) throw usage_error{"unexpected argument '" + a + "'"};
        positional_.push_back(a);
        continue;
      }
      given& g = values_[std::string(spec.canonical(a))];
      g.spelling = a;
      g.origin = origin;
      if (o->flag()) {
        if (has_inline) throw usage_error{a + " takes no value, got '" + inline_value + "'" + from};
        g.value = "1";
      } else if (has_inline) {
        g.value = inline_value;
      } else {
        if (i + 1 >= items.size()) throw usage_error{a + " needs a value" + from};
        g.value = items[++i];
      }
    }
  }
  /// The command line (argv[0] the command's name) with `--config FILE` expanded first.
  arguments(const command_spec& spec, int argc, char** argv)
      : arguments(spec, expand_config(spec, argc, argv)) {}
  arguments(const command_spec& spec, const command_line& line)
      : arguments(spec, line.items, line.origins) {}

  const command_spec& spec() const { return *spec_; }
  bool help() const { return help_; }
  /// Whether the option was given (on the command line or in a config file).
  bool has(std::string_view key) const { return values_.contains(declared(key)); }
  /// The value given, else the declared default, else "".
  std::string get(std::string_view key) const {
    const std::string k = declared(key);
    if (auto it = values_.find(k); it != values_.end()) return it->second.value;
    return std::string(spec_->find(k)->fallback);
  }
  /// The value given, else `fallback` (for defaults that depend on other options).
  std::string get(std::string_view key, const std::string& fallback) const {
    no_declared_default(key);
    return has(key) ? get(key) : fallback;
  }
  /// The option as the messages name it: its spelling and, from a config file, the file's key.
  std::string label(std::string_view key) const {
    const std::string k = declared(key);
    const auto it = values_.find(k);
    if (it == values_.end()) return k;
    return it->second.spelling + (it->second.origin.empty() ? "" : " (" + it->second.origin + ")");
  }
  /// Where the value came from: "" the command line, else "--config F key 'k'".
  std::string origin(std::string_view key) const {
    const auto it = values_.find(declared(key));
    return it == values_.end() ? "" : it->second.origin;
  }
  /// Forgets a value given (a config file's, overridden by another option of the command line).
  void erase(std::string_view key) { values_.erase(declared(key)); }

  /// The option's value (or declared default) as a number; malformed: a usage error naming it.
  double number(std::string_view key) const { return parse_number(label(key), get(key)); }
  double number(std::string_view key, double fallback) const {
    no_declared_default(key);
    return has(key) ? number(key) : fallback;
  }
  /// The option's value as an integer in [min, max] (parse_integer); else the default.
  long long integer(std::string_view key, long long min, long long max) const {
    return parse_integer(label(key), get(key), min, max);
  }
  long long integer(std::string_view key, long long fallback, long long min, long long max) const {
    no_declared_default(key);
    return has(key) ? integer(key, min, max) : fallback;
  }
  long long integer(std::string_view key, long long fallback) const {
    return integer(key, fallback, std::numeric_limits<long long>::min(),
                   std::numeric_limits<long long>::max());
  }
  /// The option's value as a finite number in [min, max] (parse_real); else the default.
  double real(std::string_view key, double min, double max) const {
    return parse_real(label(key), get(key), min, max);
  }
  double real(std::string_view key, double fallback, double min, double max) const {
    no_declared_default(key);
    return has(key) ? real(key, min, max) : fallback;
  }
  /// The value (or default) as one of `names`; otherwise a usage error listing them.
  std::string choice(std::string_view key, const std::vector<std::string>& names) const {
    const std::string v = get(key);
    if (std::find(names.begin(), names.end(), v) != names.end()) return v;
    std::string list;
    for (std::size_t i = 0; i < names.size(); ++i)
      list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    throw usage_error{label(key) + " expects " + list + ", got '" + v + "'"};
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  struct given {
    std::string value, spelling, origin;
  };
  /// The canonical name of a declared option; an undeclared one is the program's error.
  std::string declared(std::string_view key) const {
    if (spec_->find(key) == nullptr)
      throw std::logic_error(
          concat("tightfit ", spec_->name, " reads option ", key, ", which it does not declare"));
    return std::string(spec_->canonical(key));
  }
  /// A fallback passed where the option declares its default would be a second default.
  void no_declared_default(std::string_view key) const {
    if (!spec_->find(declared(key))->fallback.empty())
      throw std::logic_error(concat("tightfit ", spec_->name, " passes a default for ", key,
                                    ", which declares its own"));
  }
  const command_spec* spec_;
  bool help_ = false;
  std::map<std::string, given> values_;
  std::vector<std::string> positional_;
};

/// Whether mpirun started this process as a rank other than 0 (OpenMPI, MPICH / PMI): arguments
/// are checked before MPI starts, and only the first rank reports them.
inline bool launched_rank_above_0() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name)) return std::string(v) != "0";
  return false;
}

/// Prints a usage error: "tightfit CMD: message", the usage line, and where the help is (rank 0
/// of an mpirun only).
inline void print_usage_error(const command_spec& c, const std::string& message) {
  if (launched_rank_above_0()) return;
  std::fprintf(stderr, "tightfit %s: %s\n%srun 'tightfit %s --help' for its options\n",
               c.name.c_str(), message.c_str(), c.usage().c_str(), c.name.c_str());
}

/// Runs body(args) on the parsed command line; --help prints the help; usage errors (thrown by
/// the parser or the body) print the message and the usage, and return 2.
template <class Body>
int with_arguments(const command_spec& spec, int argc, char** argv, Body&& body) {
  try {
    arguments args(spec, argc, argv);
    if (args.help()) {
      std::fputs(help_text(spec).c_str(), stdout);
      return 0;
    }
    return body(args);
  } catch (const usage_error& e) {
    print_usage_error(spec, e.message);
    return 2;
  }
}

}  // namespace tightfit::cli
