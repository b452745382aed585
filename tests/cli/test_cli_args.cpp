// The tool's one argument parser (tools/tightfit/args.hpp) on a declared command: `--key value`
// and `--key=value`, flags, aliases, declared defaults, positional arguments, a misnamed option's
// pointer, config-file origins in messages; its help and docs table come from the same
// declarations. End-to-end: test_cli_docs.cpp (docs/tool.md's tables equal the tool's).
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "args.hpp"

namespace {

using namespace tightfit::cli;

const command_spec& demo() {
  static const command_spec spec = [] {
    command_spec c;
    c.name = "demo";
    c.synopsis = "--model DIR [options]";
    c.options = {
        {"--model", "DIR", "the model"},
        {"--lr", "X", "the learning rate", "2e-5", "learning_rate"},
        {"--max-grad-norm", "X", "clip to this norm", "1", "max_grad_norm"},
        {"--clip", "X", "", "", "", "--max-grad-norm"},
        {"--pick", "NAME", "a | b", "a"},
        {"--quiet", "", "no progress line"},
    };
    c.positional = "FILE";
    c.misnamed = {{"--schedule", "--schedule is another command's; this one has --pick"}};
    return c;
  }();
  return spec;
}

arguments parse(const std::vector<std::string>& items,
                const std::vector<std::string>& origins = {}) {
  return arguments(demo(), items, origins);
}

/// The usage_error `f` throws, or "(none)".
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const usage_error& e) {
    return e.message;
  }
  return "(none)";
}

std::string usage_message(const std::vector<std::string>& items) {
  return message_of([&] { (void)parse(items); });
}

}  // namespace

TEST_CASE("args: both value forms, flags, aliases, positional, last one wins") {
  const auto a =
      parse({"--model", "m", "--lr=0.5", "f1", "--quiet", "--clip", "3", "f2", "--lr", "0.25"});
  CHECK(a.get("--model") == "m");
  CHECK(a.number("--lr") == 0.25);
  CHECK(a.has("--quiet"));
  CHECK(a.has("--max-grad-norm"));  // --clip is its alias
  CHECK(a.real("--max-grad-norm", 0, 10) == 3);
  CHECK(a.positional() == std::vector<std::string>{"f1", "f2"});
  CHECK(parse({"--model=a=b"}).get("--model") == "a=b");  // a value may hold '='
}

TEST_CASE("args: declared defaults are the one source of a default") {
  const auto a = parse({});
  CHECK_FALSE(a.has("--lr"));
  CHECK(a.number("--lr") == 2e-5);
  CHECK(a.get("--pick") == "a");
  CHECK(a.get("--model") == "");
  CHECK(a.get("--model", "fallback") == "fallback");  // no declared default: the caller's
  // a caller's fallback for an option that declares one, or an undeclared name, is the program's
  // error, found by any test that reaches it
  CHECK_THROWS_AS((void)a.get("--lr", "1e-3"), std::logic_error);
  CHECK_THROWS_AS((void)a.real("--lr", 1e-3, 0, 1), std::logic_error);
  CHECK_THROWS_AS((void)a.has("--typo"), std::logic_error);
}

TEST_CASE("args: wrong arguments are usage errors naming the option and the value") {
  CHECK(usage_message({"--bogus"}) == "unknown option '--bogus'");
  CHECK(usage_message({"--bogus=1"}) == "unknown option '--bogus'");
  CHECK(usage_message({"--lr"}) == "--lr needs a value");
  CHECK(usage_message({"--quiet=yes"}) == "--quiet takes no value, got 'yes'");
  CHECK(usage_message({"-x"}) == "unknown option '-x'");
  CHECK(usage_message({"--schedule", "cosine"}) ==
        "--schedule is another command's; this one has --pick");
  CHECK(usage_message({"-3"}) == "(none)");  // a negative number is a positional argument
  const auto a = parse({"--lr", "fast", "--pick", "c", "--clip", "-1"});
  CHECK(message_of([&] { (void)a.number("--lr"); }) == "--lr expects a number, got 'fast'");
  CHECK(message_of([&] {
          (void)a.choice("--pick", {"a", "b"});
        }) == "--pick expects a or b, got 'c'");
  // named as given: the alias
  CHECK(message_of([&] { (void)a.real("--max-grad-norm", 0, 10); }) ==
        "--clip is -1, expected a finite number in [0, 10]");
}

TEST_CASE("args: a config file's values name the file's key; the command line overrides them") {
  const auto a =
      parse({"--lr=bad", "--max-grad-norm=2", "--max-grad-norm", "5"},
            {"--config c.yaml key 'learning_rate'", "--config c.yaml key 'max_grad_norm'"});
  CHECK(a.origin("--lr") == "--config c.yaml key 'learning_rate'");
  CHECK(a.origin("--max-grad-norm").empty());
  CHECK(a.number("--max-grad-norm") == 5);
  CHECK(message_of([&] { (void)a.number("--lr"); }) ==
        "--lr (--config c.yaml key 'learning_rate') expects a number, got 'bad'");
}

TEST_CASE("args: the help and the docs table come from the declarations") {
  const std::string help = help_text(demo());
  CHECK(help.rfind("usage: tightfit demo --model DIR [options]\noptions:\n", 0) == 0);
  CHECK(help.find("  --lr X                  the learning rate (default 2e-5; config: "
                  "learning_rate)\n") != std::string::npos);
  CHECK(help.find("  --clip X                the same as --max-grad-norm\n") != std::string::npos);
  CHECK(help.find("  --quiet                 no progress line\n") != std::string::npos);
  const std::string table = markdown_options(demo());
  CHECK(table.rfind("| option | default | config key | what |\n|---|---|---|---|\n", 0) == 0);
  CHECK(table.find("| `--lr X` | `2e-5` | `learning_rate` | the learning rate |\n") !=
        std::string::npos);
  CHECK(table.find("| `--pick NAME` | `a` |  | a \\| b |\n") != std::string::npos);
  // every option is a row, in declaration order
  std::size_t rows = 0, at = 0;
  for (const auto& o : demo().options) {
    const auto found = table.find("| `" + std::string(o.name), at);
    CHECK_MESSAGE(found != std::string::npos, o.name);
    at = found;
    ++rows;
  }
  CHECK(rows == demo().options.size());
}

TEST_CASE("args: help text wraps at 100 columns under the text's column") {
  const std::string w = wrapped("aaa bbb ccc ddd", 26, 26, 34);
  CHECK(w == "aaa bbb\n                          ccc ddd");
}
