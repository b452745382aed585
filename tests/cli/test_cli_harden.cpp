// The tool against bad input (issue "hardening the tool and the readers"): one regression test
// per defect found, each with the exact input written here, the documented exit code (1 bad
// input, 2 wrong arguments) and one line naming the problem, run under `ulimit -v`
// (cli_testing::run_limited) so that an allocation made before validation fails the test.
// docs/tool.md lists what each command checks.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli_testing.hpp"
#include "stream/stream_testing.hpp"
#include "tightfit/core/limits.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/backward.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::outcome;
using cli_testing::problem_lines;
using cli_testing::q;
using cli_testing::run;
using cli_testing::run_limited;

namespace {

using ref = reference_backend<double>;

/// A 2-layer random Qwen3 model directory (F64 weights), a counting data set and an SFT batch.
struct harden_fixture {
  fs::path dir = cli_testing::scratch("harden");
  fs::path model;
  model_config cfg = testing::tiny_config(4, 2, true, false, 2);
  /// The model directory `name` with weights ~ N(0, scale^2).
  explicit harden_fixture(const std::string& name = "model", double scale = 0.1)
      : model(dir / name) {
    fs::create_directories(model);
    ref be;
    llama_model<ref> m(be, cfg);
    m.init_random(5, scale);
    save_hf_config(cfg, model);
    save_hf_weights(model, m.parameters());
  }
  /// Counting sequences (N = 4 rows of T = 8 tokens), labels = inputs.
  fs::path data(const std::string& name = "data.safetensors") const {
    const index_t n = 4, t = 8;
    std::vector<std::int64_t> ids;
    for (index_t r = 0; r < n; ++r)
      for (index_t k = 0; k < t; ++k) ids.push_back((3 * r + k) % 8);
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {n, t}, std::span<const std::int64_t>(ids));
    w.write(dir / name);
    return dir / name;
  }
  /// An SFT batch: input_ids and labels (B, T), and an attention mask when given.
  fs::path batch(const std::string& name, index_t b, index_t t,
                 const std::vector<std::int64_t>& ids, const std::vector<std::int64_t>& labels,
                 const std::vector<std::int64_t>& mask = {}) const {
    safetensors_writer w;
    w.add("input_ids", {b, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {b, t}, std::span<const std::int64_t>(labels));
    if (!mask.empty()) w.add("attention_mask", {b, t}, std::span<const std::int64_t>(mask));
    w.write(dir / name);
    return dir / name;
  }
  fs::path small_batch() const {
    return batch("batch.safetensors", 1, 6, {1, 2, 3, 4, 5, 6}, {-100, 2, 3, 4, 5, 6});
  }
  std::string train(const fs::path& data_file) const {
    return "train --model " + q(model) + " --data " + q(data_file) + " --quiet --chunk 4";
  }
};

/// The problem line: exactly one line (besides a build warning) that contains every `part`.
void check_one_line(const outcome& r, int code, std::initializer_list<std::string> parts) {
  CAPTURE(r.err);
  CHECK(r.code == code);
  const auto problems = problem_lines(r.err);
  REQUIRE(!problems.empty());
  if (code == 1) CHECK(problems.size() == 1);  // exit 2 adds the usage after the line
  for (const auto& p : parts) CHECK(problems.front().find(p) != std::string::npos);
  for (const char* never : {"bad_alloc", "max_size", "stoll", "stod", "Segmentation"})
    CHECK(r.err.find(never) == std::string::npos);
}

/// Copies a safetensors file tensor by tensor (metadata too), letting `edit_ints` and
/// `edit_floats` change the values of the named tensors.
void rewrite(const fs::path& in, const fs::path& out,
             const std::function<void(const std::string&, std::vector<std::int64_t>&)>& edit_ints,
             const std::function<void(const std::string&, std::vector<float>&)>& edit_floats) {
  const auto f = safetensors_file::open(in);
  safetensors_writer w;
  for (const auto& t : f.tensors()) {
    if (t.type == dtype::i64) {
      auto v = f.read_ints(t.name);
      edit_ints(t.name, v);
      w.add(t.name, t.shape, std::span<const std::int64_t>(v));
    } else {
      auto v = f.read<float>(t.name);
      edit_floats(t.name, v);
      w.add(t.name, t.shape, std::span<const float>(v));
    }
  }
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  w.write(out);
}

std::string bytes_of(const fs::path& p) {
  return cli_testing::slurp(p);
}

}  // namespace

TEST_CASE("1. crash: a state file with a counter out of range is refused, naming the field") {
  harden_fixture f;
  const auto data = f.data();
  const auto state = f.dir / "state.safetensors";
  const std::string common = f.train(data) + " --optimizer badam --switch-every 2 --batch 2";
  REQUIRE(run(common + " --steps 3 --save-state " + q(state)).code == 0);
  const auto keep = [](const std::string&, auto&) {};
  struct tamper {
    std::size_t index;
    std::int64_t value;
    const char* field;
  };
  for (const tamper& t : {tamper{3, -5, "optim.counters[3] (total steps) is -5"},
                          tamper{5, -1, "optim.counters[5] (position) is -1"},
                          tamper{5, 1000, "optim.counters[5] (position) is 1000"},
                          tamper{2, -7, "optim.counters[2] (steps in block) is -7"},
                          tamper{0, 3, "optim.counters[0] (started) is 3"}}) {
    CAPTURE(t.field);
    const auto bad = f.dir / "bad-state.safetensors";
    rewrite(
        state, bad,
        [&](const std::string& name, std::vector<std::int64_t>& v) {
          if (name == "optim.counters") v[t.index] = t.value;
        },
        keep);
    check_one_line(run_limited(common + " --steps 2 --resume " + q(bad)), 1,
                   {bad.string(), t.field});
  }
  // A saved block outside the partition, and a sequence longer than the blocks.
  const auto bad = f.dir / "bad-sequence.safetensors";
  rewrite(
      state, bad,
      [](const std::string& name, std::vector<std::int64_t>& v) {
        if (name == "optim.sequence") v[0] = -3;
      },
      keep);
  check_one_line(run_limited(common + " --steps 2 --resume " + q(bad)), 1, {"saved block -3"});
}

TEST_CASE("2. injection: bench options are validated in the parent, never pasted into a shell") {
  const fs::path marker = cli_testing::scratch("harden") / "injected";
  fs::remove(marker);
  const auto r = run_limited("bench stream --seq 16 --preset small --objective 'sft; touch " +
                             marker.string() + "; true'");
  check_one_line(r, 2, {"--objective", "sft; touch"});
  CHECK(!fs::exists(marker));
  // Every value in the parent, before any setup (exit 2, naming the value).
  check_one_line(run_limited("bench stream --chunk abc"), 2, {"--chunk", "'abc'"});
  check_one_line(run_limited("bench stream --chunk -7"), 2, {"--chunk is -7"});
  check_one_line(run_limited("bench stream --seq 16,,32"), 2, {"--seq", "''"});
  check_one_line(run_limited("bench stream --seq '16;id'"), 2, {"--seq", "16;id"});
  check_one_line(run_limited("bench stream --schedules full,fast"), 2, {"fast"});
  check_one_line(run_limited("bench stream --preset huge"), 2, {"huge"});
  check_one_line(run_limited("bench stream --objective dpo --batch 3"), 2, {"even", "3"});
  check_one_line(run_limited("bench stream --csv /nonexistent-dir/x.csv"), 2,
                 {"--csv", "/nonexistent-dir"});
  // Valid options still run each row in a child (an argument vector, no shell).
  const auto csv = cli_testing::scratch("harden") / "bench.csv";
  const auto ok = run_limited(
      "bench stream --seq 16 --preset small --schedules stream --chunk 8 "
      "--csv " +
      q(csv));
  CAPTURE(ok.err);
  CHECK(ok.code == 0);
  CHECK(ok.out.find("stream") != std::string::npos);
  CHECK(cli_testing::slurp(csv).find("sft,stream,16,8,1,") != std::string::npos);
  // A row whose memory exceeds the limit is refused before any child runs.
  check_one_line(run_limited("bench stream --seq 1000000000000"), 2,
                 {"--seq 1000000000000", "this process may use"});
  check_one_line(run_limited("bench stream --seq 1e12"), 2,
                 {"--seq 1000000000000", "this process may use"});
  check_one_line(run_limited("bench stream --seq 1e15"), 2, {"--seq is 1e15", "outside"});
}

TEST_CASE("3. overwritten input: output paths that are inputs are refused before any work") {
  harden_fixture f;
  const auto batch = f.small_batch();
  const auto data = f.data();
  const std::string weights = bytes_of(f.model / "model.safetensors");
  const std::string batch_bytes = bytes_of(batch);
  const std::string grad = "grad --model " + q(f.model) + " --batch " + q(batch) + " --chunk 2";
  // --out naming the model directory (it would receive model.safetensors), the batch, the
  // model file itself, and a link to the batch.
  check_one_line(run_limited(grad + " --out " + q(f.model)), 2, {"--out", "input directory"});
  check_one_line(run_limited(grad + " --out " + q(batch)), 2, {"--out", "would overwrite"});
  check_one_line(run_limited(grad + " --out " + q(f.model / "model.safetensors")), 2,
                 {"would overwrite"});
  const auto link = f.dir / "link.safetensors";
  fs::remove(link);
  fs::create_symlink(batch, link);
  check_one_line(run_limited(grad + " --out " + q(link)), 2, {"would overwrite"});
  check_one_line(run_limited(grad + " --out " + q(f.dir / "missing-dir" / "g.safetensors")), 2,
                 {"does not exist"});
  CHECK(bytes_of(f.model / "model.safetensors") == weights);
  CHECK(bytes_of(batch) == batch_bytes);
  // train: --save-model into the model directory, --save-state / --log onto the data, the
  // resume file, or into a missing directory; the checks come before any training.
  const std::string train = f.train(data) + " --optimizer adam --steps 1";
  check_one_line(run_limited(train + " --save-model " + q(f.model)), 2, {"--save-model"});
  check_one_line(run_limited(train + " --save-state " + q(data)), 2, {"--save-state"});
  check_one_line(run_limited(train + " --log " + q(data)), 2, {"--log", "would overwrite"});
  check_one_line(run_limited(train + " --log " + q(f.dir / "nope" / "log.jsonl")), 2,
                 {"--log", "does not exist"});
  check_one_line(
      run_limited(train + " --log " + q(f.dir / "same") + " --save-state " + q(f.dir / "same")), 2,
      {"another option"});
  const auto state = f.dir / "state.safetensors";
  REQUIRE(run(train + " --save-state " + q(state)).code == 0);
  check_one_line(run_limited(train + " --resume " + q(state) + " --save-state " + q(state)), 2,
                 {"--save-state", "would overwrite"});
  CHECK(bytes_of(f.model / "model.safetensors") == weights);
}

TEST_CASE("4. non-finite: NaN weights, states and hyper-parameters are refused, naming them") {
  harden_fixture f;
  const auto batch = f.small_batch();
  const auto data = f.data();
  // NaN in the model: grad and train exit 1 naming the tensor; nothing is written.
  const auto nan_model = f.dir / "nan-model";
  fs::create_directories(nan_model);
  fs::copy_file(f.model / "config.json", nan_model / "config.json",
                fs::copy_options::overwrite_existing);
  rewrite(
      f.model / "model.safetensors", nan_model / "model.safetensors",
      [](const std::string&, auto&) {},
      [](const std::string& name, std::vector<float>& v) {
        if (name == "model.layers.1.mlp.up_proj.weight") v[5] = std::nanf("");
      });
  const auto out = f.dir / "nan-grads.safetensors";
  check_one_line(
      run_limited("grad --model " + q(nan_model) + " --batch " + q(batch) + " --out " + q(out)), 1,
      {"model.layers.1.mlp.up_proj.weight", "nan"});
  CHECK(!fs::exists(out));
  check_one_line(run_limited("train --model " + q(nan_model) + " --data " + q(data) +
                             " --optimizer adam --steps 1 --quiet"),
                 1, {"model.layers.1.mlp.up_proj.weight", "nan"});
  // Finite weights whose logits overflow: a non-finite loss at step 1, nothing written.
  harden_fixture huge("huge-model", 1e30);
  const auto huge_out = huge.dir / "huge-grads.safetensors";
  check_one_line(run_limited("grad --model " + q(huge.model) + " --batch " + q(batch) + " --out " +
                             q(huge_out)),
                 1, {"step 1", "not finite"});
  CHECK(!fs::exists(huge_out));
  const auto saved = huge.dir / "huge-trained";
  const auto log = huge.dir / "huge.jsonl";
  check_one_line(run_limited("train --model " + q(huge.model) + " --data " + q(data) +
                             " --optimizer adam --steps 2 --quiet --log " + q(log) +
                             " --save-model " + q(saved)),
                 1, {"step 1", "not finite"});
  CHECK(!fs::exists(saved));
  CHECK(bytes_of(log).find("nan") == std::string::npos);
  // Non-finite and absurd hyper-parameters: argument errors naming the value.
  const std::string train = f.train(data) + " --steps 1";
  for (const std::string bad : {"--lr inf", "--lr 1e300", "--lr nan", "--lr -0.1"})
    check_one_line(run_limited(train + " --optimizer adam " + bad), 2, {bad.substr(0, 4)});
  check_one_line(run_limited(train + " --optimizer bread-sgd --bread-lr inf"), 2, {"--bread-lr"});
  check_one_line(run_limited(train + " --optimizer adam --clip nan"), 2, {"--clip"});
  check_one_line(run_limited(train + " --optimizer bread-lora --loraplus inf"), 2, {"--loraplus"});
  check_one_line(
      run_limited("grad --model " + q(f.model) + " --batch " + q(batch) + " --temperature inf"), 2,
      {"--temperature"});
  check_one_line(run_limited("grad --model " + q(f.model) + " --batch " + q(batch) +
                             " --objective dpo --beta nan"),
                 2, {"--beta"});
  // A state file holding NaN (optimizer moments, or weights): exit 1 naming the tensor.
  const auto state = f.dir / "state.safetensors";
  const std::string adam = f.train(data) + " --optimizer adam";
  REQUIRE(run(adam + " --steps 2 --save-state " + q(state)).code == 0);
  const auto nan_state = f.dir / "nan-state.safetensors";
  rewrite(
      state, nan_state, [](const std::string&, auto&) {},
      [](const std::string& name, std::vector<float>& v) {
        if (name == "optim.state.model.norm.weight.1") v[0] = std::nanf("");
      });
  check_one_line(run_limited(adam + " --steps 1 --resume " + q(nan_state)), 1,
                 {"optim.state.model.norm.weight.1", "not finite"});
  rewrite(
      state, nan_state, [](const std::string&, auto&) {},
      [](const std::string& name, std::vector<float>& v) {
        if (name == "model.norm.weight") v[1] = std::numeric_limits<float>::infinity();
      });
  check_one_line(run_limited(adam + " --steps 1 --resume " + q(nan_state)), 1,
                 {"model.norm.weight", "inf"});
}

TEST_CASE("5./6. memory before validation: sizes are checked before anything is allocated") {
  harden_fixture f;
  const auto batch = f.small_batch();
  const auto data = f.data();
  // config.json describing an 8B model beside tiny weights, and absurd extents.
  const auto write_config = [&](const std::string& name, const nlohmann::json& edits) {
    const auto d = f.dir / name;
    fs::create_directories(d);
    auto j = nlohmann::json::parse(bytes_of(f.model / "config.json"));
    j.update(edits);
    std::ofstream(d / "config.json") << j.dump();
    fs::copy_file(f.model / "model.safetensors", d / "model.safetensors",
                  fs::copy_options::overwrite_existing);
    return d;
  };
  const auto big = write_config("big", {{"vocab_size", 128256},
                                        {"hidden_size", 4096},
                                        {"intermediate_size", 14336},
                                        {"num_hidden_layers", 32},
                                        {"num_attention_heads", 32},
                                        {"num_key_value_heads", 8},
                                        {"head_dim", 128}});
  check_one_line(run_limited("grad --model " + q(big) + " --batch " + q(batch)), 1,
                 {"model.embed_tokens.weight", "vocab_size 128256"});
  check_one_line(run_limited("train --model " + q(big) + " --data " + q(data) +
                             " --optimizer adam --steps 1 --quiet"),
                 1, {"vocab_size 128256"});
  const auto layers = write_config("layers", {{"num_hidden_layers", 1000000000}});
  check_one_line(run_limited("grad --model " + q(layers) + " --batch " + q(batch)), 1,
                 {"num_hidden_layers 1000000000", "parameters"});
  check_one_line(run_limited("plan --model " + q(layers) + " --seq 64 --budget 1G"), 1,
                 {"num_hidden_layers 1000000000"});
  const auto inter = write_config("inter", {{"intermediate_size", 1099511627776LL}});
  check_one_line(run_limited("grad --model " + q(inter) + " --batch " + q(batch)), 1,
                 {"intermediate_size 1099511627776", "declared maximum"});
  const auto wide = write_config("wide", {{"num_hidden_layers", 20000}});
  check_one_line(run_limited("grad --model " + q(wide) + " --batch " + q(batch)), 1,
                 {"describes a model of", "values the checkpoint holds"});
#ifndef TIGHTFIT_CLI_TESTING_ASAN  // without ulimit -v a large machine could hold it
  // A preset that does not fit this process: refused before it is allocated.
  check_one_line(run_limited("train --preset qwen3-8b --data " + q(data) +
                             " --optimizer adam --steps 1 --quiet"),
                 1, {"the model", "this process may use"});
#endif
  // Sizes given as arguments: exit 2 naming the value and the limit.
  check_one_line(run_limited(f.train(data) + " --optimizer adam --steps 1 --batch 1000000000000"),
                 2, {"--batch 1000000000000", "this process may use"});
  check_one_line(run_limited(f.train(data) + " --optimizer adam --steps 1 --batch 1e12"), 2,
                 {"--batch 1000000000000", "this process may use"});
  check_one_line(
      run_limited("plan --preset small --seq 64 --budget 1G --max-seq 9223372036854775807"), 2,
      {"--max-seq", "9223372036854775807"});
  // The planner prices any T by a closed form (no allocation per token, issue 35): these are
  // answered under the address-space limit; only a token count past 2^62 is refused.
  const auto huge_max =
      run_limited("plan --preset small --seq 64 --budget 1G --max-seq 4611686018427387904");
  CHECK(huge_max.code == 0);
  CHECK(huge_max.out.find("largest T: full") != std::string::npos);
  const auto huge_seq = run_limited("plan --preset small --seq 100000000000000 --budget 1G");
  CHECK(huge_seq.code == 0);
  CHECK(huge_seq.out.find("chunk at T=100000000000000: none fits") != std::string::npos);
  check_one_line(run_limited("plan --preset small --seq 4611686018427387904 --batch 2 --budget 1G"),
                 2, {"--seq 4611686018427387904 x --batch 2", "more than 2^62 tokens"});
}

TEST_CASE("7. budgets and numbers: byte counts and counts out of range are argument errors") {
  harden_fixture f;
  const auto batch = f.small_batch();
  const std::string plan = "plan --preset small --seq 64 ";
  for (const std::string b : {"1e30", "inf", "18446744073709551616", "20000000000G"})
    check_one_line(run_limited(plan + "--budget " + b), 2, {"--budget", b});
  check_one_line(run_limited(plan + "--budget -1"), 2, {"--budget is -1"});
  check_one_line(run_limited(plan + "--budget 0"), 2, {"--budget is 0"});
  check_one_line(run_limited(plan + "--budget 4Gx"), 2, {"--budget", "4Gx"});
  check_one_line(run_limited(plan + "--budget 1G --max-seq 0"), 2, {"--max-seq is 0"});
  check_one_line(run_limited(plan + "--budget 1G --chunk -7"), 2, {"--chunk is -7"});
  check_one_line(run_limited(plan + "--budget 1G --batch 0"), 2, {"--batch is 0"});
  const std::string grad = "grad --model " + q(f.model) + " --batch " + q(batch);
  check_one_line(run_limited(grad + " --chunk auto --budget -1"), 2, {"--budget is -1"});
  check_one_line(run_limited(grad + " --chunk auto --budget 4Gx"), 2, {"4Gx"});
  check_one_line(run_limited(grad + " --chunk -7"), 2, {"--chunk is -7"});
  check_one_line(run_limited(grad + " --chunk abc"), 2, {"--chunk", "'abc'"});
  check_one_line(run_limited(grad + " --head-chunk -1"), 2, {"--head-chunk is -1"});
  // a valid budget still plans
  const auto ok = run_limited(plan + "--budget 1.5G");
  CHECK(ok.code == 0);
  CHECK(ok.out.find("largest T") != std::string::npos);
}

TEST_CASE("8. labels in padding are never supervised; attention_mask holds 0 / 1 only") {
  harden_fixture f;
  const index_t b = 2, t = 6;
  const std::vector<std::int64_t> ids = {1, 5, 9, 2, 0, 0, 3, 4, 8, 7, 6, 2};
  const std::vector<std::int64_t> mask = {1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1};
  std::vector<std::int64_t> clean = ids;  // padding labels -100, first position -100
  clean[0] = clean[6] = -100;
  clean[4] = clean[5] = -100;
  std::vector<std::int64_t> dirty = clean;  // padding labels that are real tokens
  dirty[4] = 11;
  dirty[5] = 12;
  const auto loss_of = [&](const fs::path& p) {
    const auto r =
        run_limited("grad --model " + q(f.model) + " --batch " + q(p) + " --dtype f64 --chunk 2");
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out)["loss"].get<double>();
  };
  const double with_clean = loss_of(f.batch("clean.safetensors", b, t, ids, clean, mask));
  const double with_dirty = loss_of(f.batch("dirty.safetensors", b, t, ids, dirty, mask));
  CHECK(with_dirty == with_clean);
  // Without the mask the same labels are supervised: the loss differs.
  CHECK(loss_of(f.batch("nomask.safetensors", b, t, ids, dirty)) != with_clean);
  // The reference: the library on row lengths (4, 6) with only the 3 + 5 labels inside.
  ref be;
  llama_model<ref> model(be, f.cfg);
  load_hf_weights(f.model, model.parameters());
  const auto targets = shift_labels(clean, b, t);
  const std::vector<index_t> lengths = {4, 6};
  sft_loss loss;
  backward_options o;
  const double expected = compute_gradients(model, {b, t, ids, targets, lengths}, loss, o).loss;
  CHECK(std::abs(with_clean - expected) < 1e-12 * std::abs(expected));
  // A mask value other than 0 / 1 is an error naming it.
  for (const std::int64_t v : {2, -1}) {
    auto m = mask;
    m[1] = v;
    const auto p = f.batch("badmask.safetensors", b, t, ids, clean, m);
    check_one_line(run_limited("grad --model " + q(f.model) + " --batch " + q(p)), 1,
                   {"attention_mask[0][1] is " + std::to_string(v), "expected 0 or 1"});
  }
}

TEST_CASE("9. output: stdout that cannot be written is exit 1; JSON strings are escaped") {
  harden_fixture f;
  const auto batch = f.small_batch();
  const auto data = f.data();
  if (fs::exists("/dev/full")) {
    check_one_line(run_limited("plan --preset small --seq 64 --budget 1G", "/dev/full"), 1,
                   {"cannot write to standard output"});
    check_one_line(run_limited("grad --model " + q(f.model) + " --batch " + q(batch), "/dev/full"),
                   1, {"cannot write to standard output"});
    check_one_line(run_limited(f.train(data) + " --optimizer sgd --steps 1", "/dev/full"), 1,
                   {"cannot write to standard output"});
  }
  // A gradient file name with a quote, a backslash and a newline: the JSON line still parses
  // and names it exactly.
  const fs::path odd = f.dir / "odd \" \\ \n name.safetensors";  // sh keeps all in '...'
  const auto r =
      run_limited("grad --model " + q(f.model) + " --batch " + q(batch) + " --out " + q(odd));
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["gradients"].get<std::string>() == odd.string());
  CHECK(fs::exists(odd));
}

TEST_CASE("core/limits.hpp: products that overflow, limits named in the message") {
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  CHECK(checked_product({3, 5, 7}) == std::optional<std::uint64_t>(105));
  CHECK(checked_product({std::uint64_t{1} << 32, std::uint64_t{1} << 32}) == std::nullopt);
  CHECK(checked_product({max, 0}) == std::optional<std::uint64_t>(0));
  CHECK(checked_sum(max, 1) == std::nullopt);
  CHECK(checked_sum(max - 1, 1) == std::optional<std::uint64_t>(max));
  CHECK_THROWS_WITH_AS(check_size("vocab_size", 1001, 1000, "the header"),
                       "vocab_size is 1001, more than 1000 (the header)", error);
  CHECK_NOTHROW(check_size("vocab_size", 1000, 1000, "the header"));
  CHECK(byte_string(512) == "512 bytes");
  CHECK(byte_string(std::uint64_t{3} << 29) == "1.5 GiB");
  const std::uint64_t limit = memory_limit_bytes();
  CHECK(limit > 0);
  CHECK_NOTHROW(check_memory("a small buffer", 1024));
  CHECK_THROWS_AS(check_memory("everything", max), error);
  try {
    check_memory("the batch", max);
  } catch (const error& e) {
    const std::string m = e.what();
    CHECK(m.find("the batch needs") == 0);
    CHECK(m.find(byte_string(limit)) != std::string::npos);
  }
}
