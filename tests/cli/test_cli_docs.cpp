// The tool's help and docs/tool.md say the same thing: every command of `tightfit --help` has a
// section `## tightfit CMD` in docs/tool.md and every section a command; within a command, every
// option of `tightfit CMD --help` appears in its section and every option its section names
// appears in its help.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "cli_testing.hpp"

namespace {

using namespace tightfit::cli_testing;

/// The `--name` options a text mentions (`--help` aside: every command has it).
std::set<std::string> options_in(const std::string& text) {
  static const std::regex option{R"((^|[^A-Za-z0-9-])(--[a-z][a-z0-9-]*[a-z0-9]))"};
  std::set<std::string> found;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), option);
       it != std::sregex_iterator(); ++it)
    found.insert((*it)[2].str());
  found.erase("--help");
  return found;
}

/// The commands listed by `tightfit --help` (the lines under "commands:").
std::vector<std::string> commands_in_usage(const std::string& usage) {
  std::vector<std::string> names;
  std::istringstream in(usage);
  std::string line;
  bool listing = false;
  static const std::regex entry{R"(^  ([a-z]+)  +\S)"};
  while (std::getline(in, line)) {
    if (line == "commands:") {
      listing = true;
      continue;
    }
    std::smatch m;
    if (listing && std::regex_search(line, m, entry)) names.push_back(m[1].str());
  }
  return names;
}

/// docs/tool.md's sections `## tightfit NAME[ SUBCOMMAND]`, keyed by NAME, each with its text.
std::map<std::string, std::string> tool_doc_sections() {
  const std::string doc = slurp(fs::path(TIGHTFIT_DOCS_DIR) / "tool.md");
  REQUIRE_MESSAGE(!doc.empty(), "docs/tool.md is missing or empty under " TIGHTFIT_DOCS_DIR);
  std::map<std::string, std::string> sections;
  std::istringstream in(doc);
  std::string line, current;
  static const std::regex heading{R"(^## tightfit ([a-z]+))"};
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.rfind("## ", 0) == 0) current = std::regex_search(line, m, heading) ? m[1].str() : "";
    if (!current.empty()) sections[current] += line + "\n";
  }
  return sections;
}

/// `text` without its lines that are HTML comments (the generated tables' markers).
std::string without_comments(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind("<!--", 0) != 0) out += line + "\n";
  return out;
}

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : " ") + x;
  return out;
}

}  // namespace

TEST_CASE("tool docs: every command of the usage text has a docs/tool.md section, and back") {
  const outcome top = run("--help");
  REQUIRE(top.code == 0);
  const auto commands = commands_in_usage(top.out);
  REQUIRE_MESSAGE(commands.size() >= 6, "usage text lists too few commands:\n" << top.out);
  const auto sections = tool_doc_sections();
  for (const auto& c : commands)
    CHECK_MESSAGE(sections.count(c) == 1, "docs/tool.md has no section '## tightfit " << c << "'");
  for (const auto& [name, text] : sections)
    CHECK_MESSAGE(std::find(commands.begin(), commands.end(), name) != commands.end(),
                  "docs/tool.md documents 'tightfit " << name << "', which the usage text lacks");
}

TEST_CASE("tool docs: each command's options are in its docs/tool.md section, and back") {
  const auto commands = commands_in_usage(run("--help").out);
  const auto sections = tool_doc_sections();
  for (const auto& c : commands) {
    CAPTURE(c);
    if (sections.count(c) == 0) continue;  // reported by the test above
    // bench's options are those of its one subcommand, `bench stream`
    const outcome help = run(c == "bench" ? "bench stream --help" : c + " --help");
    CHECK_MESSAGE(help.code == 0, "tightfit " << c << " --help exits " << help.code);
    if (help.code != 0) continue;
    const auto in_help = options_in(help.out + help.err);
    const auto in_doc = options_in(without_comments(sections.at(c)));
    CHECK_MESSAGE(!in_help.empty(), "tightfit " << c << " --help names no option");
    std::set<std::string> undocumented, unknown;
    std::set_difference(in_help.begin(), in_help.end(), in_doc.begin(), in_doc.end(),
                        std::inserter(undocumented, undocumented.end()));
    std::set_difference(in_doc.begin(), in_doc.end(), in_help.begin(), in_help.end(),
                        std::inserter(unknown, unknown.end()));
    CHECK_MESSAGE(undocumented.empty(), "tightfit " << c << " --help has options docs/tool.md's "
                                                    << "section lacks: " << joined(undocumented));
    CHECK_MESSAGE(unknown.empty(), "docs/tool.md's section on tightfit "
                                       << c
                                       << " names options its --help lacks: " << joined(unknown));
  }
}

TEST_CASE("tool docs: each command's options table is generated from its declarations") {
  const auto commands = commands_in_usage(run("--help").out);
  const auto sections = tool_doc_sections();
  for (const auto& c : commands) {
    CAPTURE(c);
    if (c == "help" || sections.count(c) == 0) continue;
    const std::string& text = sections.at(c);
    const std::string begin = "<!-- generated: tightfit help " + c + " --markdown -->\n";
    const std::string end = "<!-- end generated -->";
    const auto from = text.find(begin);
    REQUIRE_MESSAGE(from != std::string::npos,
                    "docs/tool.md's section on tightfit " << c << " has no generated table");
    const auto to = text.find(end, from);
    REQUIRE(to != std::string::npos);
    const std::string table = text.substr(from + begin.size(), to - from - begin.size());
    const outcome generated = run("help " + c + " --markdown");
    REQUIRE(generated.code == 0);
    CHECK_MESSAGE(generated.out.rfind("| option | default | config key | what |\n", 0) == 0,
                  generated.out);
    CHECK_MESSAGE(table == generated.out, "docs/tool.md's table of tightfit "
                                              << c << " differs from `tightfit help " << c
                                              << " --markdown`; run scripts/tool-docs");
  }
}

TEST_CASE("tool docs: the option scanner finds options and ignores the rest") {
  CHECK(options_in("use --seq 5, --max-seq=3 or (--chunk) but not a--b, ---x, --help or -- z") ==
        std::set<std::string>{"--seq", "--max-seq", "--chunk"});
  CHECK(commands_in_usage("usage: x\ncommands:\n  grad      g\n  plan  p\nrun it\n") ==
        std::vector<std::string>{"grad", "plan"});
}
