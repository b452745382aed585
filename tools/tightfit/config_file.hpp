// `--config FILE` of `tightfit train` and `tightfit prepare`: a flat JSON object or YAML mapping
// whose keys are TRL's (and transformers' TrainingArguments') names, turned into the command's
// own options, which the command line then overrides (it comes after). Each option declares its
// TRL name (option_spec::trl, args.hpp): learning_rate -> --lr, per_device_train_batch_size ->
// --batch, num_train_epochs -> --epochs, max_steps -> --steps (ignored when <= 0, as TRL does),
// epsilon -> --epsilon-low, ...; lr_scheduler_type + warmup_steps -> --schedule (constant,
// constant_with_warmup, cosine). Any other key k is the option --k with '_' as '-' (optimizer,
// objective, chunk, max_length, ...), so an option the command does not have is an error naming
// the file and the key; a key of the other command (train's learning_rate in prepare's config,
// prepare's max_length in train's) is named on stderr and skipped, so one file serves both.
// true adds a flag, false leaves it out.
// YAML: one `key: value` per line, `#` comments; nesting, lists and anchors are refused.
#pragma once

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "args.hpp"

namespace tightfit::cli {

/// A scalar of a flat config: its text, and whether it is a boolean.
struct config_scalar {
  std::string text;
  bool is_bool = false, truth = false;
};

/// The key -> scalar pairs of a flat JSON object or YAML mapping (JSON when the text starts
/// with '{'), in file order; anything else is a usage_error naming the file and the line or key.
inline std::vector<std::pair<std::string, config_scalar>> read_flat_config(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) throw usage_error{"--config " + path + ": cannot be read"};
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  std::vector<std::pair<std::string, config_scalar>> out;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(text);
    } catch (const std::exception& e) {
      throw usage_error{"--config " + path + ": not valid JSON (" + e.what() + ")"};
    }
    for (const auto& [k, v] : j.items()) {
      config_scalar s;
      if (v.is_boolean()) {
        s.is_bool = true;
        s.truth = v.get<bool>();
        s.text = s.truth ? "true" : "false";
      } else if (v.is_number()) {
        s.text = v.dump();
      } else if (v.is_string()) {
        s.text = v.get<std::string>();
      } else if (v.is_null()) {
        continue;  // TRL writes null for "not set"
      } else {
        throw usage_error{"--config " + path + ": key '" + k +
                          "' is not a number, string or boolean (the config is flat)"};
      }
      out.emplace_back(k, s);
    }
    return out;
  }
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  auto trim = [](std::string s) {
    const auto a = s.find_first_not_of(" \t\r");
    if (a == std::string::npos) return std::string{};
    const auto b = s.find_last_not_of(" \t\r");
    return s.substr(a, b - a + 1);
  };
  while (std::getline(lines, line)) {
    ++number;
    const std::string where = "--config " + path + " line " + std::to_string(number);
    // a comment: # at the start or after a space, outside quotes
    bool quoted = false;
    char quote = 0;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (quoted) {
        if (c == quote) quoted = false;
      } else if (c == '"' || c == '\'') {
        quoted = true;
        quote = c;
      } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
        line.resize(i);
        break;
      }
    }
    if (trim(line).empty() || trim(line) == "---") continue;
    if (line[0] == ' ' || line[0] == '\t' || trim(line)[0] == '-')
      throw usage_error{where + ": nested values and lists are not read (the config is flat)"};
    const auto colon = line.find(':');
    if (colon == std::string::npos) throw usage_error{where + ": expected 'key: value'"};
    const std::string key = trim(line.substr(0, colon));
    std::string value = trim(line.substr(colon + 1));
    if (value.empty() || value[0] == '&' || value[0] == '*' || value[0] == '[' || value[0] == '{' ||
        value[0] == '|' || value[0] == '>')
      throw usage_error{where + ": key '" + key + "' has no plain value (the config is flat)"};
    config_scalar s;
    if (value.size() >= 2 && (value[0] == '"' || value[0] == '\'') && value.back() == value[0]) {
      s.text = value.substr(1, value.size() - 2);
    } else if (value == "null" || value == "~") {
      continue;
    } else {
      s.text = value;
      if (value == "true" || value == "True" || value == "false" || value == "False") {
        s.is_bool = true;
        s.truth = value[0] == 't' || value[0] == 'T';
      }
    }
    out.emplace_back(key, s);
  }
  return out;
}

/// The option of `command` a config key names: the option whose TRL name it is, else the
/// option --key with '_' as '-' when the command has it; empty when none.
inline std::string dashed(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}
inline std::string option_of_config_key(const command_spec& command, const std::string& key) {
  for (const auto& o : command.options)
    if (o.trl == key) return std::string(o.name);
  const std::string name = concat("--", dashed(key));
  return command.find(name) != nullptr ? name : std::string();
}

/// The options `--config path` gives `command` (see the top comment). Keys of `sibling` (train's
/// in prepare's config and back: one file may serve both) are named on stderr and skipped.
inline std::vector<config_option> read_config(const std::string& path, const command_spec& command,
                                              const command_spec& sibling) {
  std::vector<config_option> out;
  std::string scheduler, warmup;
  const bool schedules = command.find("--schedule") != nullptr;
  for (const auto& [key, v] : read_flat_config(path)) {
    if (schedules && key == "lr_scheduler_type") {
      scheduler = v.text;
      continue;
    }
    if (schedules && key == "warmup_steps") {
      warmup = v.text;
      continue;
    }
    const std::string name = option_of_config_key(command, key);
    if (name.empty()) {
      const bool theirs = !option_of_config_key(sibling, key).empty() ||
                          (key == "lr_scheduler_type" || key == "warmup_steps");
      if (!theirs)
        throw usage_error{concat("--config ", path, ": unknown option '--", dashed(key), "' (key '",
                                 key, "'): tightfit ", command.name, " has no such option")};
      std::fprintf(stderr, "tightfit %s: --config %s: '%s' is tightfit %s's; skipped\n",
                   command.name.c_str(), path.c_str(), key.c_str(), sibling.name.c_str());
      continue;
    }
    if (key == "max_steps" && !v.is_bool && !v.text.empty() && v.text[0] == '-') continue;
    std::string value = v.text;
    if (key == "optim") {  // transformers' optimizer names
      if (value.rfind("adamw", 0) == 0)
        value = "adamw";
      else if (value != "sgd" && value != "adam")
        throw usage_error{"--config " + path + ": optim '" + value +
                          "' has no tightfit optimizer (adamw_torch, adamw_*, adam, sgd; or give "
                          "tightfit's 'optimizer')"};
    }
    const option_spec* o = command.find(name);
    if (v.is_bool && !o->flag()) {  // a boolean for a valued option: scale_rewards, ...
      value = name == "--scale-rewards" ? (v.truth ? "group" : "none") : v.truth ? "true" : "false";
    } else if (v.is_bool) {
      if (v.truth) out.push_back({key, name, "", true});
      continue;
    } else if (o->flag()) {
      throw usage_error{"--config " + path + ": key '" + key + "' is a flag: true or false, got '" +
                        v.text + "'"};
    }
    out.push_back({key, name, value, false});
  }
  // TRL: max_steps > 0 overrides num_train_epochs
  if (std::any_of(out.begin(), out.end(),
                  [](const config_option& o) { return o.name == "--steps"; }))
    std::erase_if(out, [](const config_option& o) { return o.name == "--epochs"; });
  if (!scheduler.empty() || !warmup.empty()) {
    const std::string w = warmup.empty() || warmup == "0" ? "" : ":" + warmup;
    std::string s;
    if (scheduler.empty() || scheduler == "constant" || scheduler == "constant_with_warmup")
      s = w.empty() ? "constant" : "warmup" + w;
    else if (scheduler == "cosine")
      s = "cosine" + w;
    else
      throw usage_error{"--config " + path + ": lr_scheduler_type '" + scheduler +
                        "' is not one of tightfit's (constant, constant_with_warmup, cosine)"};
    out.push_back({"lr_scheduler_type", "--schedule", s, false});
  }
  return out;
}

}  // namespace tightfit::cli
