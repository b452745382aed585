// The tool against bad input, second round (issue 35: inputs truncated while read, an
// overwritten adapter, outputs inside the model folder, write failures, the planner's cost):
// one regression test per numbered defect, with the exact input written here, the documented
// exit code (1 bad input, 2 wrong arguments) and one line naming the problem, under `ulimit -v`
// (cli_testing::run_limited) where memory is the point. docs/tool.md lists what each command
// checks.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cli_model.hpp"
#include "cli_testing.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/hf_model.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using namespace tightfit::cli_testing;  // run, run_limited, run_with, q, outcome, scratch, ...

namespace {

/// A 2-layer random Qwen3 model directory (cli_model.hpp), a counting data set and an SFT batch
/// beside it.
struct fixture : cli_testing::model_fixture {
  explicit fixture(const std::string& name) : model_fixture(name, 2) {}
  fs::path data() const {
    const index_t n = 4, t = 8;
    const auto ids = cli_testing::counting_ids(n, t);
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {n, t}, std::span<const std::int64_t>(ids));
    w.write(dir / "data.safetensors");
    return dir / "data.safetensors";
  }
  fs::path batch() const {
    const std::vector<std::int64_t> ids = {1, 2, 3, 4, 5, 6}, labels = {-100, 2, 3, 4, 5, 6};
    safetensors_writer w;
    w.add("input_ids", {1, 6}, std::span<const std::int64_t>(ids));
    w.add("labels", {1, 6}, std::span<const std::int64_t>(labels));
    w.write(dir / "batch.safetensors");
    return dir / "batch.safetensors";
  }
  /// A PEFT adapter folder for this model: rank r in adapter_config.json, q_proj and v_proj
  /// tensors of rank `stored_r` in adapter_model.safetensors (0: none written), every value
  /// `value` but one `odd` at lora_B of layer 1's v_proj.
  fs::path adapter(const std::string& name, index_t r, index_t stored_r, double value = 0.01,
                   double odd = 0.01) const {
    const fs::path a = dir / name;
    fs::create_directories(a);
    std::ofstream(a / "adapter_config.json") << nlohmann::json{
        {"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"r", r},
        {"lora_alpha", 4},     {"lora_dropout", 0.0},      {"target_modules", {"q_proj", "v_proj"}},
        {"bias", "none"},      {"fan_in_fan_out", false},  {"use_rslora", false},
        {"use_dora", false}}.dump();
    if (stored_r == 0) return a;
    safetensors_writer w;
    for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
      for (const char* m : {"q_proj", "v_proj"}) {
        const index_t out = std::string(m) == "q_proj" ? cfg.q_width() : cfg.kv_width();
        const std::string p =
            "base_model.model.model.layers." + std::to_string(l) + ".self_attn." + m;
        std::vector<double> av(static_cast<std::size_t>(stored_r * cfg.hidden_size), value);
        std::vector<double> bv(static_cast<std::size_t>(out * stored_r), value);
        if (l == 1 && std::string(m) == "v_proj") bv[1] = odd;
        w.add(p + ".lora_A.weight", {stored_r, cfg.hidden_size}, std::span<const double>(av));
        w.add(p + ".lora_B.weight", {out, stored_r}, std::span<const double>(bv));
      }
    w.write(a / "adapter_model.safetensors");
    return a;
  }
};

/// Exactly one problem line (exit 1; exit 2 adds the usage after it) holding every `part`; no
/// crash, allocation failure or libstdc++ message.
void check_one_line(const outcome& r, int code, std::initializer_list<std::string> parts) {
  CAPTURE(r.err);
  CHECK(r.code == code);
  const auto problems = problem_lines(r.err);
  REQUIRE(!problems.empty());
  if (code == 1) CHECK(problems.size() == 1);
  for (const auto& p : parts) CHECK(problems.front().find(p) != std::string::npos);
  for (const char* never : {"bad_alloc", "max_size", "stoll", "stod", "basic_", "type_error",
                            "Segmentation", "Bus error"})
    CHECK(r.err.find(never) == std::string::npos);
}

/// A safetensors file of U8 tensors holding ones, written by hand (the writer stores integers as
/// I64 or I32): a large batch in a file of one byte per token.
void write_u8_file(const fs::path& p,
                   const std::vector<std::pair<std::string, std::vector<index_t>>>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    std::uint64_t n = 1;
    for (const index_t e : shape) n *= static_cast<std::uint64_t>(e);
    header[name] = {{"dtype", "U8"}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(p, std::ios::binary);
  const std::uint64_t length = text.size();
  for (int k = 0; k < 8; ++k) out.put(static_cast<char>(length >> (8 * k) & 0xff));
  out << text;
  const std::string ones(1 << 20, '\x01');
  for (std::uint64_t done = 0; done < offset; done += ones.size())
    out.write(ones.data(),
              static_cast<std::streamsize>(std::min<std::uint64_t>(ones.size(), offset - done)));
}

/// Whether measure measured the cloud: exit 0, or 3 (measured, but not a trustworthy box: the
/// synthetic clouds here are a filled box, not a bag on a belt).
bool measured(const outcome& r) {
  return r.code == 0 || r.code == 3;
}

std::string bytes_of(const fs::path& p) {
  return cli_testing::slurp(p);
}

/// A binary little-endian PLY of `n` float points (x, y, z) in a box.
void write_float_ply(const fs::path& p, std::size_t n) {
  std::ofstream out(p, std::ios::binary);
  out << "ply\nformat binary_little_endian 1.0\nelement vertex " << n
      << "\nproperty float x\nproperty float y\nproperty float z\nend_header\n";
  std::vector<float> xyz(3 * n);
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {  // uniform in a 0.4 x 0.3 x 0.2 m box
    xyz[3 * i] = 0.4f * u(gen);
    xyz[3 * i + 1] = 0.3f * u(gen);
    xyz[3 * i + 2] = 0.2f * u(gen);
  }
  out.write(reinterpret_cast<const char*>(xyz.data()),
            static_cast<std::streamsize>(4 * xyz.size()));
}

}  // namespace

TEST_CASE("1. truncated while read: 100 races end in exit 0 or 1 naming the file, no signal") {
  // Another process shrinks the input to nothing at a varying moment while the tool reads it:
  // the read either happened before (measured: exit 0 or 3) or reports the file (exit 1); a
  // mapped reader died
  // of SIGBUS here (issue 35: 28 of 36 trials).
  const fs::path dir = cli_testing::scratch("race");
  const fs::path ply = dir / "shrinks.ply";
  int errors = 0;
  for (int trial = 0; trial < 100; ++trial) {
    write_float_ply(ply, 1 << 20);  // 12 MiB of vertices
    const std::string delay = std::to_string(0.001 * (trial % 20));
    const auto r = run_with("( sleep " + delay + " && : > " + q(ply) + " ) & ",
                            "measure --method aabb " + q(ply));
    CAPTURE(trial);
    CAPTURE(r.err);
    REQUIRE((measured(r) || r.code == 1));  // a signal makes the shell report 128 + N
    if (r.code == 1) {
      ++errors;
      CHECK(problem_lines(r.err).size() == 1);
      CHECK(r.err.find(ply.string()) != std::string::npos);
    }
  }
  MESSAGE(errors << " of 100 races read a truncated file");
  // the safetensors reader: train --data shrunk while it is read
  fixture f("race-st");
  const fs::path data = dir / "shrinks.safetensors";
  const index_t n = 512, t = 1024;  // 4 MiB per tensor
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n * t));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i % 8);
  for (int trial = 0; trial < 30; ++trial) {
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {n, t}, std::span<const std::int64_t>(ids));
    w.write(data);
    const std::string delay = std::to_string(0.002 * (trial % 15));
    const auto r = run_with("( sleep " + delay + " && : > " + q(data) + " ) & ",
                            "train --model " + q(f.model) + " --data " + q(data) +
                                " --optimizer adam --steps 0 --quiet");
    CAPTURE(trial);
    CAPTURE(r.err);
    REQUIRE((r.code == 0 || r.code == 1));
    if (r.code == 1) CHECK(r.err.find(data.string()) != std::string::npos);
  }
}

TEST_CASE("2./3. outputs: never an input, never inside the model or adapter folder") {
  fixture f("outputs");
  const auto data = f.data();
  const auto batch = f.batch();
  const auto adapter = f.adapter("adapter", 2, 2);
  const std::string weights = bytes_of(f.model / "model.safetensors");
  const std::string adapter_bytes = bytes_of(adapter / "adapter_model.safetensors");
  const std::string adapter_json = bytes_of(adapter / "adapter_config.json");
  const std::string lora = "train --model " + q(f.model) + " --data " + q(data) +
                           " --optimizer lora --adapter " + q(adapter) + " --steps 1 --quiet";
  // train's outputs onto the adapter it reads (issue 35: it replaced the adapter)
  check_one_line(run_limited(lora + " --save-state " + q(adapter / "adapter_model.safetensors")), 2,
                 {"--save-state", "would overwrite the input"});
  check_one_line(run_limited(lora + " --log " + q(adapter / "adapter_config.json")), 2,
                 {"--log", "would overwrite the input"});
  check_one_line(run_limited(lora + " --save-model " + q(adapter)), 2,
                 {"--save-model", "input directory"});
  const auto to_adapter = f.dir / "to-adapter";
  fs::remove(to_adapter);
  fs::create_directory_symlink(adapter, to_adapter);
  check_one_line(run_limited(lora + " --log " + q(to_adapter / "new.jsonl")), 2,
                 {"--log", "input directory"});
  check_one_line(run_limited(lora + " --log " + q(to_adapter / "adapter_config.json")), 2,
                 {"--log", "would overwrite the input"});
  // new files inside the model folder: grad, logprobs, train (also through links)
  check_one_line(run_limited("grad --model " + q(f.model) + " --batch " + q(batch) + " --out " +
                             q(f.model / "new.safetensors")),
                 2, {"--out", "input directory"});
  check_one_line(run_limited("logprobs --model " + q(f.model) + " --batch " + q(batch) + " --out " +
                             q(f.model / "lp.safetensors")),
                 2, {"--out", "input directory"});
  const std::string train =
      "train --model " + q(f.model) + " --data " + q(data) + " --optimizer adam --steps 1 --quiet";
  check_one_line(run_limited(train + " --log " + q(f.model / "log.jsonl")), 2,
                 {"--log", "input directory"});
  check_one_line(run_limited(train + " --save-state " + q(f.model / "s.safetensors")), 2,
                 {"--save-state", "input directory"});
  const auto dangling = f.dir / "dangling.safetensors";
  fs::remove(dangling);
  fs::create_symlink(f.model / "not-yet.safetensors", dangling);  // points into the model
  check_one_line(
      run_limited("grad --model " + q(f.model) + " --batch " + q(batch) + " --out " + q(dangling)),
      2, {"--out", "input directory"});
  CHECK(!fs::exists(f.model / "not-yet.safetensors"));
  const auto model_link = f.dir / "model-link";
  fs::remove(model_link);
  fs::create_directory_symlink(f.model, model_link);
  check_one_line(run_limited(train + " --save-model " + q(model_link)), 2,
                 {"--save-model", "input directory"});
  // a dangling link to the batch's name, and a hard link to it
  const auto hard = f.dir / "hard.safetensors";
  fs::remove(hard);
  fs::create_hard_link(batch, hard);
  check_one_line(
      run_limited("logprobs --model " + q(f.model) + " --batch " + q(batch) + " --out " + q(hard)),
      2, {"--out", "would overwrite"});
  // nothing was written anywhere
  CHECK(bytes_of(f.model / "model.safetensors") == weights);
  CHECK(bytes_of(adapter / "adapter_model.safetensors") == adapter_bytes);
  CHECK(bytes_of(adapter / "adapter_config.json") == adapter_json);
  std::size_t model_files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(f.model)) ++model_files;
  CHECK(model_files == 2);  // config.json, model.safetensors
  // the rule lets a correct run through
  CHECK(
      run(lora + " --save-model " + q(f.dir / "adapter-out") + " --log " + q(f.dir / "lora.jsonl"))
          .code == 0);
}

TEST_CASE("4. write failures: a log or CSV that cannot be written is exit 1, naming it") {
  fixture f("full");
  const auto data = f.data();
  check_one_line(run_limited("train --model " + q(f.model) + " --data " + q(data) +
                             " --optimizer adam --steps 2 --quiet --log /dev/full"),
                 1, {"/dev/full", "cannot write the log"});
  const auto r = run_limited(
      "bench stream --seq 32 --schedules stream --chunk 16 --preset qwen3-bench --csv /dev/full");
  CAPTURE(r.err);
  CHECK(r.code == 1);
  CHECK(r.err.find("cannot write /dev/full") != std::string::npos);
}

TEST_CASE("5. logprobs: a batch holding non-finite values is refused; nothing is written") {
  fixture f("lp-nan");
  const std::vector<std::int64_t> ids = {1, 2, 3, 4, 5, 6, 1, 3, 5, 7, 2, 4};
  const std::vector<double> adv = {1.0, std::numeric_limits<double>::quiet_NaN()};
  std::vector<double> old(12, -1.0);
  old[7] = std::numeric_limits<double>::infinity();
  for (const bool bad_old : {false, true}) {
    safetensors_writer w;
    w.add("input_ids", {2, 6}, std::span<const std::int64_t>(ids));
    w.add("labels", {2, 6}, std::span<const std::int64_t>(ids));
    const std::vector<double> fine = {1.0, -1.0};
    w.add("advantages", {2}, std::span<const double>(bad_old ? fine : adv));
    if (bad_old) w.add("old_logprobs", {2, 6}, std::span<const double>(old));
    const auto batch = f.dir / "nan.safetensors", out = f.dir / "nan-out.safetensors";
    w.write(batch);
    fs::remove(out);
    const auto r =
        run_limited("logprobs --model " + q(f.model) + " --batch " + q(batch) + " --out " + q(out));
    CAPTURE(bad_old);
    check_one_line(r, 1,
                   {batch.string(), bad_old ? "tensor 'old_logprobs' holds inf at index 7"
                                            : "tensor 'advantages' holds nan at index 1"});
    CHECK(!fs::exists(out));
    // grad refuses the same batch the same way
    check_one_line(
        run_limited("grad --model " + q(f.model) + " --objective grpo --batch " + q(batch)), 1,
        {bad_old ? "old_logprobs" : "advantages", "expected finite values"});
  }
}

TEST_CASE("6. a non-finite adapter is refused when loaded; nothing is written") {
  fixture f("nan-adapter");
  const auto data = f.data();
  const auto adapter =
      f.adapter("nan-adapter", 2, 2, 0.01, std::numeric_limits<double>::quiet_NaN());
  const auto saved = f.dir / "saved", merged = f.dir / "merged";
  const auto r = run_limited(
      "train --model " + q(f.model) + " --data " + q(data) + " --optimizer lora --adapter " +
      q(adapter) + " --steps 0 --quiet --save-model " + q(saved) + " --merge-out " + q(merged));
  check_one_line(r, 1,
                 {"adapter_model.safetensors",
                  "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight' holds nan"});
  CHECK(!fs::exists(saved / "adapter_model.safetensors"));
  CHECK(!fs::exists(merged / "model.safetensors"));
}

TEST_CASE("7. sizes before allocation: adapters, batches, data sets and clouds") {
  fixture f("sizes");
  const auto data = f.data();
  const std::string lora = "train --model " + q(f.model) + " --data " + q(data) +
                           " --optimizer lora --steps 1 --quiet --adapter ";
  // an adapter's rank: 2^40 and 2^20 (issue 35: bad_alloc, or 3.9 GB before the shape error)
  for (const index_t r : {index_t{1} << 40, index_t{1} << 20}) {
    const auto a = f.adapter("rank-" + std::to_string(r), r, 2);
    check_one_line(run_limited(lora + q(a)), 1,
                   {"adapter_config.json", "field \"r\" is " + std::to_string(r),
                    "largest rank tightfit trains (65536)"});
  }
  // a rank within the limit whose tensors hold another rank: refused from the header
  const auto mismatch = f.adapter("mismatch", 4096, 2);
  check_one_line(
      run_limited(lora + q(mismatch)), 1,
      {"adapter_model.safetensors", "lora_A.weight' has shape [2, 16]", "expected [4096, 16]"});
  const auto missing = f.adapter("missing", 2, 0);
  check_one_line(run_limited(lora + q(missing)), 1, {"adapter_model.safetensors", "cannot open"});
  // a batch of 8 x 2^21 tokens (U8, 16 MiB per tensor): refused from its header, before the model
  // or the batch is read (issue 35: 7.5 GB RSS and 34 s before the refusal)
  {
    const index_t b = 8, t = index_t{1} << 21;
    const auto big = f.dir / "big-batch.safetensors";
    write_u8_file(big, {{"input_ids", {b, t}}, {"labels", {b, t}}});
    for (const std::string cmd : {"grad", "logprobs"}) {
      CAPTURE(cmd);
      check_one_line(
          run_limited(cmd + " --model " + q(f.model) + " --batch " + q(big) +
                      (cmd == "logprobs" ? " --out " + q(f.dir / "lp.safetensors") : "")),
          1, {big.string(), "8 x 2097152 tokens", "this process may use"});
    }
  }
#ifndef TIGHTFIT_CLI_TESTING_ASAN  // sanitizers reserve terabytes: no ulimit -v there
  // a data set of 1600 x 2^15 tokens against a 1.5 GiB address space: refused before it is read
  {
    const index_t n = 1600, t = index_t{1} << 15;
    const auto big = f.dir / "big-data.safetensors";
    write_u8_file(big, {{"input_ids", {n, t}}});
    const auto r =
        run_with("ulimit -v 1572864 && MALLOC_ARENA_MAX=2 ",
                 "train --preset tiny --data " + q(big) + " --optimizer adam --steps 1 --quiet");
    check_one_line(r, 1, {big.string(), "input_ids (1600, 32768)", "this process may use"});
  }
#endif
  // clouds: --max-points, and what the memory holds (2 M points under a 400 MiB address space)
  const fs::path cloud = f.dir / "cloud.ply";
  write_float_ply(cloud, 20000);
  check_one_line(run_limited("measure --max-points 19999 " + q(cloud)), 1,
                 {"has 20000 vertices, more than the limit of 19999 points", "--max-points"});
  CHECK(measured(run_limited("measure --max-points 20000 --method aabb " + q(cloud))));
#ifndef TIGHTFIT_CLI_TESTING_ASAN
  write_float_ply(cloud, 2000000);
  const auto r = run_with("ulimit -v 409600 && MALLOC_ARENA_MAX=2 ", "measure " + q(cloud));
  check_one_line(r, 1, {"has 2000000 vertices, more than the limit of", "this process may use"});
#endif
}

TEST_CASE("8. measure --json: file names that are not UTF-8 come out as U+FFFD") {
  const fs::path dir = cli_testing::scratch("utf8");
  const fs::path bad = dir / "bag\xff\xfe.ply", good = dir / "good.ply";
  write_float_ply(bad, 3000);
  write_float_ply(good, 3000);
  const auto r = run("measure --method aabb --json " + q(bad) + " " + q(good));
  CAPTURE(r.err);
  CHECK(measured(r));
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.size() == 2);  // the other cloud's result is not lost
  CHECK(j[0]["file"].get<std::string>().find("\xef\xbf\xbd") != std::string::npos);
  CHECK(j[1]["file"] == good.string());
}

TEST_CASE("9. exit codes: argument errors are found before any file is read") {
  fixture f("codes");
  const std::vector<std::int64_t> ids = {1, 2, 3, 4};
  safetensors_writer w;
  for (const char* k :
       {"chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"})
    w.add(k, {1, 4}, std::span<const std::int64_t>(ids));
  const auto dpo = f.dir / "dpo.safetensors";
  w.write(dpo);
  check_one_line(run_limited("logprobs --model " + q(f.model) + " --batch " + q(dpo) + " --out " +
                             q(f.dir / "o.safetensors") + " --as old"),
                 2, {"--as applies to --objective grpo, not dpo"});
  const std::string missing_model = "grad --model " + q(f.dir / "no-model") + " --batch " + q(dpo);
  check_one_line(run_limited(missing_model + " --objective grpo --epsilon-low 1"), 2,
                 {"--epsilon-low is 1, expected in [0, 1)"});
  check_one_line(run_limited(missing_model + " --objective dpo --beta 0"), 2,
                 {"--beta is 0, expected > 0 for --objective dpo"});
  // integers are written in decimal, without spaces
  for (const std::string v : {"0x10", "' 7'", "'7 '", "+", "1e", "inf"})
    check_one_line(run_limited(missing_model + " --chunk " + v), 2, {"--chunk"});
  check_one_line(run_limited("plan --preset small --seq ' 64' --budget 1G"), 2, {"--seq"});
}

TEST_CASE("10. malformed PLY headers are refused, naming the line") {
  const fs::path dir = cli_testing::scratch("ply-headers");
  const std::string tail = "property float x\nproperty float y\nproperty float z\nend_header\n";
  const std::pair<std::string, std::string> cases[] = {
      {"ply\nformat binary_little_endian 1.0\nelement vertex 46013abc\n" + tail,
       "bad element line"},
      {"ply\nformat binary_little_endian 1.0\nelement vertex 46013 999\n" + tail,
       "bad element line"},
      {"ply\nformat binary_little_endian 1.0\nelement vertex 0x10\n" + tail, "bad element line"},
      {"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty float x\nproperty float "
       "y\nproperty float z junk\nend_header\n",
       "bad property line"},
      {"ply\nformat binary_little_endian 1.0 extra\nelement vertex 1\n" + tail, "bad format line"},
  };
  for (const auto& [text, why] : cases) {
    const fs::path p = dir / "bad.ply";
    std::ofstream(p, std::ios::binary) << text << std::string(12, '\0');
    CAPTURE(text);
    check_one_line(run_limited("measure " + q(p)), 1, {p.string(), why});
  }
}

TEST_CASE("11. a resumed state whose step count would overflow is refused, naming it") {
  fixture f("steps");
  const auto data = f.data();
  const auto state = f.dir / "state.safetensors", bad = f.dir / "state-max.safetensors";
  const std::string common = "train --model " + q(f.model) + " --data " + q(data) +
                             " --optimizer badam --switch-every 2 --batch 2 --quiet --chunk 4";
  REQUIRE(run(common + " --steps 1 --save-state " + q(state)).code == 0);
  {
    const auto in = safetensors_file::open(state);
    safetensors_writer w;
    for (const auto& t : in.tensors()) {
      if (t.type == dtype::i64) {
        auto v = in.read_ints(t.name);
        if (t.name == "optim.counters") v[3] = std::numeric_limits<std::int64_t>::max();
        w.add(t.name, t.shape, std::span<const std::int64_t>(v));
      } else {
        const auto v = in.read<double>(t.name);
        w.add(t.name, t.shape, std::span<const double>(v), t.type);
      }
    }
    for (const auto& [k, v] : in.metadata()) w.set_metadata(k, v);
    w.write(bad);
  }
  const auto r = run_limited(common + " --steps 1 --resume " + q(bad));
  check_one_line(r, 1, {bad.string(), "9223372036854775807 steps", "past step 2^62"});
  CHECK(r.err.find("-9223372036854775808") == std::string::npos);
}

TEST_CASE("12. plan answers at T = 2^21 for any budget (the closed form, no scan)") {
  // Timing is bench/stream/bench_planner's; here the answers exist and are consistent.
  for (const std::string preset : {"qwen3-4b", "gemma3-4b"})
    for (const std::string budget : {"1", "1G", "64G"}) {
      const auto r = run("plan --preset " + preset + " --seq 2097152 --budget " + budget);
      CAPTURE(preset);
      CAPTURE(budget);
      CAPTURE(r.err);
      CHECK(r.code == 0);
      CHECK(r.out.find("largest T: full") != std::string::npos);
      if (budget == "1") CHECK(r.out.find("none fits") != std::string::npos);
    }
}

TEST_CASE("minor: a FIFO without a writer, a directory, control bytes in names") {
  const fs::path dir = cli_testing::scratch("minor");
  const fs::path fifo = dir / "pipe.ply";
  fs::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // `timeout` only guards the test: the tool must not wait for a writer
  const auto r = run_with("timeout 60 env ", "measure " + q(fifo));
  check_one_line(r, 1, {fifo.string(), "expected 'ply'"});
  const fs::path folder = dir / "folder.ply";
  fs::create_directories(folder);
  check_one_line(run_limited("measure " + q(folder)), 1, {"is a directory"});
  // an escape sequence in a file name is printed escaped, not sent to the terminal
  const fs::path odd = dir / "odd\x1b[2Jname.ply";
  write_float_ply(odd, 3000);
  const auto t = run("measure --method aabb " + q(odd));
  CHECK(measured(t));
  CHECK(t.out.find('\x1b') == std::string::npos);
  CHECK(t.out.find("odd\\x1b[2Jname.ply") != std::string::npos);
}
