// The one rule for the paths a tightfit command writes, shared by every command (grad,
// logprobs, train, bench stream, prepare, ...): before any work, each output path is resolved
// through symbolic links (a dangling link to the place it would create, links in its directories
// too) and refused with a usage_error (exit 2) naming the option when it
//  - is an input file (the same path after resolving links, or the same file by a hard link),
//  - lies in an input folder or is one (a model folder, an adapter folder: nothing is ever
//    written inside a folder the command reads),
//  - is also written by another option,
//  - cannot be written: its folder missing (and not created by an output folder of the same
//    command), not a folder, or not writable; the path a folder, or an existing file not writable.
// Inputs and outputs may be registered in any order: registering an input checks the outputs
// already registered against it.
//
//   output_paths paths;
//   paths.input_dir(model_dir);                  // a folder the command reads
//   paths.input_file(batch);                     // a file the command reads
//   paths.output_file("--out", out);             // a file the command writes
//   paths.output_dir("--save-model", dir, {"model.safetensors", "config.json"});
//   paths.output_dir("--save-model", dir, {"model-*-of-*.safetensors"});  // '*': any characters
// A name with '*' stands for every file of the folder it matches (the shards of a model whose
// count is known only once it is written): an input or another output it matches is refused.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "args.hpp"

namespace tightfit::cli {

class output_paths {
 public:
  using path = std::filesystem::path;

  /// Where `p` leads: absolute, every symbolic link resolved, including a final dangling one (the
  /// file writing to `p` would create) and links in its folders. Parts that do not exist stay as
  /// written (lexically normalised).
  static path resolve(const path& p) {
    namespace fs = std::filesystem;
    std::error_code ec;
    path at = fs::absolute(p, ec);
    if (ec) at = p;
    for (int hops = 0; hops < 40; ++hops) {  // a loop of links ends as written
      const auto st = fs::symlink_status(at, ec);
      if (ec || !fs::is_symlink(st)) break;
      const path target = fs::read_symlink(at, ec);
      if (ec) break;
      at = target.is_absolute() ? target : at.parent_path() / target;
    }
    const path canonical = fs::weakly_canonical(at, ec);
    return ec ? at.lexically_normal() : canonical;
  }

  /// A file the command reads (nothing is checked about it here: opening it reports errors).
  void input_file(const path& p) {
    inputs_.push_back({p, resolve(p)});
    for (const auto& o : outputs_) check_against_input(o, inputs_.back(), false);
    for (const auto& pat : patterns_)
      check_against_pattern(pat, inputs_.back().resolved,
                            "would overwrite the input '" + p.string() + "'");
  }
  /// A folder the command reads (a model or adapter folder): nothing may be written in it, and
  /// its files are inputs (so that a message names the file an output would overwrite).
  void input_dir(const path& p) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(p, ec))
      if (e.is_regular_file(ec)) input_file(e.path());
    input_dirs_.push_back({p, resolve(p)});
    for (const auto& o : outputs_) check_against_input(o, input_dirs_.back(), true);
  }
  /// input_dir when `p` is an existing folder, else input_file.
  void input(const path& p) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec))
      input_dir(p);
    else
      input_file(p);
  }

  /// The file named by option `key`. When `p` is an existing folder and `in_dir` is given, the
  /// file written is p / in_dir (as save_hf_weights does); otherwise a folder is refused.
  void output_file(const std::string& key, const path& p, const char* in_dir = nullptr) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      if (in_dir == nullptr) refuse(key, p, "is a directory, expected a file name");
      for (const auto& in : input_dirs_)
        if (inside(resolve(p), in.resolved))
          refuse(key, p, "is the input directory '" + in.given.string() + "' or inside it");
      add_output(key, p, p / in_dir);
    } else {
      add_output(key, p, p);
    }
  }

  /// The folder named by option `key` (created when missing) receiving `files` (names, or
  /// patterns with '*').
  void output_dir(const std::string& key, const path& p, const std::vector<std::string>& files) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const path dir = resolve(p);
    for (const auto& in : input_dirs_)
      if (inside(dir, in.resolved))
        refuse(key, p, "is inside the input directory '" + in.given.string() + "'");
    for (const auto& in : inputs_)
      if (dir == in.resolved) refuse(key, p, "is the input '" + in.given.string() + "'");
    if (fs::exists(dir, ec)) {
      if (!fs::is_directory(dir, ec)) refuse(key, p, "exists and is not a directory");
      if (::access(dir.c_str(), W_OK | X_OK) != 0) refuse(key, p, "is not writable");
    } else {
      path up = dir.parent_path();
      while (!up.empty() && !fs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
      if (!fs::is_directory(up, ec))
        refuse(key, p, "cannot be created ('" + up.string() + "' is not a directory)");
      if (::access(up.c_str(), W_OK | X_OK) != 0)
        refuse(key, p, "cannot be created ('" + up.string() + "' is not writable)");
    }
    created_.push_back(dir);
    for (const std::string& name : files) {
      if (name.find('*') == std::string::npos) {
        add_output(key, p, p / name);
        continue;
      }
      const pattern pat{key, p, dir, name};
      for (const auto& in : inputs_)
        check_against_pattern(pat, in.resolved,
                              "would overwrite the input '" + in.given.string() + "'");
      for (const auto& o : outputs_)
        if (o.key != key)
          check_against_pattern(pat, o.resolved,
                                "may write a file also written by another option (" + o.key + " '" +
                                    o.shown.string() + "')");
      patterns_.push_back(pat);
    }
  }

  /// Whether `name` matches `glob`, where '*' stands for any characters (none too).
  static bool matches(const std::string& glob, const std::string& name) {
    std::size_t g = 0, n = 0, star = std::string::npos, from = 0;
    while (n < name.size()) {
      if (g < glob.size() && glob[g] == '*') {
        star = g++;
        from = n;
      } else if (g < glob.size() && glob[g] == name[n]) {
        ++g;
        ++n;
      } else if (star != std::string::npos) {
        g = star + 1;
        n = ++from;
      } else {
        return false;
      }
    }
    while (g < glob.size() && glob[g] == '*') ++g;
    return g == glob.size();
  }

 private:
  struct entry {
    path given, resolved;
  };
  struct output {
    std::string key;
    path shown, resolved;
  };
  /// Files matching `glob` in the folder `dir` (resolved), written by option `key`.
  struct pattern {
    std::string key;
    path shown, dir;
    std::string glob;
  };

  /// Refuses `file` (resolved) when it lies in the pattern's folder and matches it.
  static void check_against_pattern(const pattern& pat, const path& file, const std::string& why) {
    if (file.parent_path() == pat.dir && matches(pat.glob, file.filename().string()))
      refuse(pat.key, pat.shown, "(its files " + pat.glob + ") " + why);
  }

  [[noreturn]] static void refuse(const std::string& key, const path& p, const std::string& why) {
    throw usage_error{key + " '" + p.string() + "' " + why};
  }

  /// Whether `p` is `dir` or lies below it (both resolved).
  static bool inside(const path& p, const path& dir) {
    std::string d = dir.string(), f = p.string();
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    while (f.size() > 1 && f.back() == '/') f.pop_back();
    return f == d || (f.size() > d.size() && f.compare(0, d.size(), d) == 0 &&
                      (d == "/" || f[d.size()] == '/'));
  }

  void check_against_input(const output& o, const entry& in, bool dir) const {
    std::error_code ec;
    if (dir) {
      if (inside(o.resolved, in.resolved))
        refuse(o.key, o.shown,
               "would write '" + o.resolved.string() + "' inside the input directory '" +
                   in.given.string() + "'");
    } else if (o.resolved == in.resolved ||
               (std::filesystem::exists(o.resolved, ec) &&
                std::filesystem::equivalent(o.resolved, in.resolved, ec))) {
      refuse(o.key, o.shown, "would overwrite the input '" + in.given.string() + "'");
    }
  }

  void add_output(const std::string& key, const path& shown, const path& file) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const output o{key, shown, resolve(file)};
    for (const auto& in : inputs_) check_against_input(o, in, false);
    for (const auto& in : input_dirs_) check_against_input(o, in, true);
    for (const auto& pat : patterns_)
      if (pat.key != key && o.resolved.parent_path() == pat.dir &&
          matches(pat.glob, o.resolved.filename().string()))
        refuse(key, shown,
               "is also written by another option (" + pat.key + " '" + pat.shown.string() +
                   "', its files " + pat.glob + ")");
    for (const auto& other : outputs_)
      if (other.resolved == o.resolved ||
          (fs::exists(o.resolved, ec) && fs::equivalent(o.resolved, other.resolved, ec)))
        refuse(
            key, shown,
            "is also written by another option (" + other.key + " '" + other.shown.string() + "')");
    if (fs::exists(o.resolved, ec)) {
      if (fs::is_directory(o.resolved, ec))
        refuse(key, shown, "names a directory '" + o.resolved.string() + "'");
      if (::access(o.resolved.c_str(), W_OK) != 0) refuse(key, shown, "is not writable");
    } else {
      const path dir = o.resolved.parent_path();
      if (fs::exists(dir, ec)) {
        if (!fs::is_directory(dir, ec))
          refuse(key, shown, "is inside '" + dir.string() + "', which is not a directory");
        if (::access(dir.c_str(), W_OK | X_OK) != 0)
          refuse(key, shown, "cannot be written: '" + dir.string() + "' is not writable");
      } else if (!created(dir)) {
        refuse(key, shown, "cannot be written: directory '" + dir.string() + "' does not exist");
      }
    }
    outputs_.push_back(o);
  }

  /// Whether `dir` is a folder an output_dir call will create.
  bool created(const path& dir) const {
    for (const auto& d : created_)
      if (d == dir) return true;
    return false;
  }

  std::vector<entry> inputs_, input_dirs_;
  std::vector<output> outputs_;
  std::vector<pattern> patterns_;
  std::vector<path> created_;
};

}  // namespace tightfit::cli
