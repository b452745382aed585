// The tightfit tool end to end: exit codes (0 ok, 1 bad input, 2 wrong arguments), one-line
// errors, the JSON line of `grad`, and that its gradients equal the library's.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_testing.hpp"
#include "stream/stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/forward.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::lines;
using cli_testing::run;

namespace {

/// A tiny random model directory and a batch file.
struct fixture {
  fs::path dir = cli_testing::scratch("model");
  /// Where the commands write: never inside the model folder (docs/tool.md, output paths).
  fs::path out = cli_testing::scratch("model-out");
  model_config cfg = testing::tiny_config(4, 2, true, false);
  fixture() {
    cfg.architecture = "Qwen3ForCausalLM";
    reference_backend<double> be;
    llama_model<reference_backend<double>> model(be, cfg);
    model.init_random(3, 0.3, 0.2);
    save_hf_config(cfg, dir / "config.json");
    save_hf_weights(dir / "model.safetensors", model.parameters());
  }
  fs::path batch(const std::vector<std::int64_t>& ids, const std::vector<std::int64_t>& labels,
                 index_t b, index_t t, const std::string& name) const {
    safetensors_writer w;
    w.add("input_ids", {b, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {b, t}, std::span<const std::int64_t>(labels));
    const auto path = dir / name;
    w.write(path);
    return path;
  }
};

}  // namespace

TEST_CASE("usage errors exit 2, help exits 0") {
  CHECK(run("").code == 2);
  CHECK(run("frobnicate").code == 2);
  CHECK(run("--help").code == 0);
  for (std::string cmd : {"grad", "logprobs", "plan", "bench", "measure", "train"}) {
    CAPTURE(cmd);
    CHECK(run(cmd + " --help").code == 0);
  }
  CHECK(run("grad").code == 2);
  CHECK(run("grad --model x --batch y --sched fast").code == 2);
  // --schedule is train's learning-rate schedule: grad refuses it (no option means two things)
  CHECK(run("grad --model x --batch y --schedule stream").code == 2);
  CHECK(run("grad --model x --batch y --objective ppo").code == 2);
  CHECK(run("grad --model x --batch y --bogus 1").code == 2);
  CHECK(run("plan --preset qwen3-bench --seq 100").code == 2);
  CHECK(run("plan --preset qwen3-bench --seq 100 --budget lots").code == 2);
}

TEST_CASE("grad: GRPO and DPO option values are argument errors naming them") {
  const struct {
    const char* args;
    const char* named;
  } cases[] = {
      {"--objective grpo --loss-type ppo", "'ppo'"},
      {"--objective grpo --importance-sampling-level group", "'group'"},
      {"--objective grpo --delta 0.9", "--delta is 0.9"},
      {"--objective grpo --delta inf", "--delta"},
      {"--objective grpo --mask-truncated-completions", "--eos-token-id"},
      {"--objective grpo --eos-token-id 2", "--mask-truncated-completions"},
      {"--objective grpo --mask-truncated-completions --eos-token-id 2,x", "'x'"},
      {"--objective grpo --mask-truncated-completions --eos-token-id -3", "--eos-token-id"},
      {"--objective dpo --loss-type kto", "'kto'"},
      {"--objective dpo --rpo-alpha -1", "--rpo-alpha"},
      {"--objective dpo --simpo-gamma nan", "--simpo-gamma"},
      {"--objective dpo --label-smoothing 0.7", "--label-smoothing"},
      {"--objective dpo --delta 2", "--delta applies to --objective grpo"},
      {"--objective grpo --simpo-gamma 1", "--simpo-gamma applies to --objective dpo"},
      {"--loss-type dapo", "--loss-type applies"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const auto r = run(std::string("grad --model x --batch y ") + c.args);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.named) != std::string::npos);
  }
}

TEST_CASE("grad: JSON line and gradients equal to the library's") {
  fixture f;
  const index_t b = 2, t = 7;
  std::vector<std::int64_t> ids, labels;
  for (index_t i = 0; i < b * t; ++i) {
    ids.push_back((i * 7 + 3) % f.cfg.vocab_size);
    labels.push_back(i % t < 2 ? -100 : ids.back());
  }
  const auto batch = f.batch(ids, labels, b, t, "batch.safetensors");
  const auto grads = f.out / "grads.safetensors";
  const auto r = run("grad --model '" + f.dir.string() + "' --batch '" + batch.string() +
                     "' --dtype f64 --sched stream --chunk 3 --out '" + grads.string() + "'");
  REQUIRE(r.code == 0);
  CHECK(lines(r.out) == 1);
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"loss", "schedule", "chunk", "peak_activation_bytes", "seconds"})
    CHECK(j.contains(key));
  CHECK(j["schedule"] == "stream");
  CHECK(j["chunk"] == 3);
  // the same computation through the library
  reference_backend<double> be;
  llama_model<reference_backend<double>> model(be, f.cfg);
  load_hf_weights(f.dir, model.parameters());
  const auto targets = shift_labels(labels, b, t);
  sft_loss loss;
  backward_options o;
  o.sched = backward_schedule::full;
  const double expected = compute_gradients(model, {b, t, ids, targets, {}}, loss, o).loss;
  CHECK(std::abs(j["loss"].get<double>() - expected) < 1e-12 * std::abs(expected));
  const auto file = safetensors_file::open(grads);
  auto& p = model.parameters();
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto g = file.read<double>(p.name(i));
    std::vector<double> want(p.grad(i).begin(), p.grad(i).end());
    CAPTURE(p.name(i));
    CHECK(testing::max_rel_diff(g, want, 1e-300) < 1e-10);
  }
}

TEST_CASE("grad: bad input exits 1 with one line naming the problem") {
  fixture f;
  const index_t b = 1, t = 4;
  std::vector<std::int64_t> ids = {1, 2, 3, 4}, labels = {1, 2, 3, 4};
  ids[2] = f.cfg.vocab_size + 5;
  const auto bad_ids = f.batch(ids, labels, b, t, "bad_ids.safetensors");
  auto r = run("grad --model '" + f.dir.string() + "' --batch '" + bad_ids.string() + "'");
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("input_ids[0][2] is 42") != std::string::npos);
  r = run("grad --model /nonexistent/model --batch x");
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("/nonexistent/model") != std::string::npos);
  const auto garbage = f.dir / "garbage.safetensors";
  std::ofstream(garbage) << "this is not a safetensors file at all";
  r = run("grad --model '" + f.dir.string() + "' --batch '" + garbage.string() + "'");
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("garbage.safetensors") != std::string::npos);
  labels = {1, 2, -7, 4};
  ids = {1, 2, 3, 4};
  const auto bad_labels = f.batch(ids, labels, b, t, "bad_labels.safetensors");
  r = run("grad --model '" + f.dir.string() + "' --batch '" + bad_labels.string() + "'");
  CHECK(r.code == 1);
  CHECK(r.err.find("is -7") != std::string::npos);
}

TEST_CASE("--device and --dtype: bad values are argument errors naming them") {
  const struct {
    const char* args;
    const char* named;
  } cases[] = {
      {"grad --model x --batch y --device tpu", "'tpu'"},
      {"grad --model x --batch y --dtype f16", "'f16'"},
      {"grad --model x --batch y --device cuda --dtype f16", "'f16'"},
      {"grad --model x --batch y --dtype bf16", "--dtype bf16 needs --device cuda"},
      {"grad --model x --batch y --device cpu --dtype bf16", "--dtype bf16 needs --device cuda"},
      {"grad --model x --batch y --device cuda --dtype f64", "--dtype f64"},
      {"grad --model x --batch y --device cuda --parallel data", "--parallel data"},
      {"train --preset tiny --data x --optimizer badam --device cuda", "--optimizer badam"},
      {"train --preset tiny --data x --optimizer bread-sgd --device cuda", "--optimizer bread-sgd"},
      {"train --preset tiny --data x --optimizer bread-lora --device cuda",
       "--optimizer bread-lora"},
      {"train --preset tiny --data x --optimizer lora --device cuda", "--optimizer lora"},
      {"train --preset tiny --data x --optimizer sgd --device cuda --dtype bf16",
       "not --optimizer sgd yet"},
      {"train --preset tiny --data x --optimizer adam --device cuda --dtype f16", "not f16"},
      {"train --preset tiny --data x --optimizer adam --device cuda --dtype f64", "not f64"},
      {"train --preset tiny --data x --optimizer sgd --device cuda --parallel data",
       "--parallel data"},
      {"train --preset tiny --data x --optimizer adamw --device cuda --grad-accum 2",
       "--grad-accum 2"},
      {"train --preset tiny --data x --optimizer adam --device cuda --resume y", "--resume"},
      {"train --preset tiny --data x --optimizer adam --device cuda --save-state y",
       "--save-state"},
      {"train --preset tiny --data x --optimizer adam --device tpu", "'tpu'"},
      {"train --preset tiny --data x --optimizer adam --dtype bf16", "'bf16'"},
      {"bench stream --device tpu", "'tpu'"},
      {"bench stream --device", "--device needs a value"},
      {"bench stream --dtype bf16", "--dtype bf16 needs --device cuda"},
      {"bench stream --device cpu --dtype bf16", "--dtype bf16 needs --device cuda"},
      {"bench stream --device cuda --dtype f16", "'f16'"},
      {"bench stream --device cuda --compare", "--compare"},
      {"bench stream --device cuda --seq 0", "--seq"},
      {"bench stream --device cuda --schedules stream-k0", "stream-k0"},
      {"bench stream --device cuda --preset nope", "nope"},
      {"bench stream --device cuda --objective dpo --batch 3", "--batch"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const auto r = run(c.args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find(c.named) != std::string::npos);
  }
}

// Without the CUDA build the tool says how to get it; with it (TIGHTFIT_CLI_CUDA, also in
// tests/cli/test_cli_cuda.cpp) and no visible device, the backend's "no CUDA device" error.
// Either way exit 1, one line, nothing on stdout, before any file is read or written.
TEST_CASE("grad --device cuda without a CUDA build or a device: exit 1 naming the reason") {
  fixture f;
  const std::vector<std::int64_t> ids = {1, 2, 3, 4}, labels = {1, 2, 3, 4};
  const auto batch = f.batch(ids, labels, 1, 4, "device_batch.safetensors");
  const auto out = f.out / "device_grads.safetensors";
  const auto r = cli_testing::run_with(
      "CUDA_VISIBLE_DEVICES= ", "grad --device cuda --model '" + f.dir.string() + "' --batch '" +
                                    batch.string() + "' --out '" + out.string() + "'");
  CHECK(r.code == 1);
  CHECK(r.out.empty());
  CHECK(cli_testing::problem_lines(r.err).size() == 1);
#if defined(TIGHTFIT_CLI_CUDA)
  CHECK(r.err.find("--device cuda: no CUDA device is available") != std::string::npos);
#else
  CHECK(r.err.find("--device cuda: this tightfit was built without CUDA") != std::string::npos);
  CHECK(r.err.find("-DTIGHTFIT_WITH_CUDA=ON") != std::string::npos);
#endif
  CHECK(!fs::exists(out));
}

// train likewise: the device is checked before the data (here: a file that does not exist) is read.
TEST_CASE("train --device cuda without a CUDA build or a device: exit 1 before reading the data") {
  fixture f;
  const auto out = f.out / "device_trained";
  const auto r = cli_testing::run_with(
      "CUDA_VISIBLE_DEVICES= ", "train --device cuda --optimizer adam --preset tiny --data '" +
                                    (f.dir / "no_such_data.safetensors").string() +
                                    "' --save-model '" + out.string() + "'");
  CHECK(r.code == 1);
  CHECK(r.out.empty());
  CHECK(cli_testing::problem_lines(r.err).size() == 1);
  CHECK(r.err.find("no_such_data") == std::string::npos);
#if defined(TIGHTFIT_CLI_CUDA)
  CHECK(r.err.find("--device cuda: no CUDA device is available") != std::string::npos);
#else
  CHECK(r.err.find("--device cuda: this tightfit was built without CUDA") != std::string::npos);
  CHECK(r.err.find("-DTIGHTFIT_WITH_CUDA=ON") != std::string::npos);
#endif
  CHECK(!fs::exists(out));
}

// bench stream likewise, after its options are checked and before the --csv file is written.
TEST_CASE("bench stream --device cuda without a CUDA build or a device: exit 1 naming the reason") {
  fixture f;
  const auto csv = f.out / "device_bench.csv";
  for (const std::string dtype : {"f32", "bf16"}) {
    CAPTURE(dtype);
    const auto r = cli_testing::run_with(
        "CUDA_VISIBLE_DEVICES= ", "bench stream --device cuda --dtype " + dtype +
                                      " --preset small --seq 64 --csv '" + csv.string() + "'");
    CHECK(r.code == 1);
    CHECK(r.out.empty());
    CHECK(cli_testing::problem_lines(r.err).size() == 1);
#if defined(TIGHTFIT_CLI_CUDA)
    CHECK(r.err.find("--device cuda: no CUDA device is available") != std::string::npos);
#else
    CHECK(r.err.find("--device cuda: this tightfit was built without CUDA") != std::string::npos);
#endif
    CHECK(!fs::exists(csv));
  }
}

TEST_CASE("logprobs: forward-only log-probs that grad reads back without renaming") {
  fixture f;
  const index_t p = 2, t = 6;
  std::vector<std::int64_t> cid, rid, clab, rlab;
  for (index_t i = 0; i < p * t; ++i) {
    cid.push_back((i * 5 + 1) % f.cfg.vocab_size);
    rid.push_back((i * 3 + 2) % f.cfg.vocab_size);
    clab.push_back(i % t < 2 ? -100 : cid.back());
    rlab.push_back(i % t < 2 ? -100 : rid.back());
  }
  safetensors_writer w;
  w.add("chosen_input_ids", {p, t}, std::span<const std::int64_t>(cid));
  w.add("chosen_labels", {p, t}, std::span<const std::int64_t>(clab));
  w.add("rejected_input_ids", {p, t}, std::span<const std::int64_t>(rid));
  w.add("rejected_labels", {p, t}, std::span<const std::int64_t>(rlab));
  const auto dpo = f.dir / "dpo.safetensors";
  w.write(dpo);
  const auto with_ref = f.out / "dpo_ref.safetensors";
  auto r = run("logprobs --model '" + f.dir.string() + "' --batch '" + dpo.string() + "' --out '" +
               with_ref.string() + "' --dtype f64 --chunk 4");
  REQUIRE(r.code == 0);
  CHECK(lines(r.out) == 1);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["objective"] == "dpo");
  CHECK(j["peak_activation_bytes"].get<double>() > 0);
  // the sums equal the library's forward on the reference backend
  reference_backend<double> be;
  llama_model<reference_backend<double>> model(be, f.cfg);
  load_hf_weights(f.dir, model.parameters());
  std::vector<std::int64_t> ids = cid, labels = clab;
  ids.insert(ids.end(), rid.begin(), rid.end());
  labels.insert(labels.end(), rlab.begin(), rlab.end());
  const auto targets = shift_labels(labels, 2 * p, t);
  const auto sums = sequence_logprob_sums(model, {2 * p, t, ids, targets, {}});
  const auto file = safetensors_file::open(with_ref);
  const auto got_w = file.read<double>("ref_chosen_logps"),
             got_l = file.read<double>("ref_rejected_logps");
  REQUIRE(got_w.size() == 2);
  REQUIRE(got_l.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(std::abs(got_w[i] - sums[i]) <= 1e-12 * std::abs(sums[i]));
    CHECK(std::abs(got_l[i] - sums[2 + i]) <= 1e-12 * std::abs(sums[2 + i]));
  }
  CHECK(file.read_ints("chosen_input_ids") == cid);  // the batch travels with them
  // round trip: the policy is the reference, so every margin is 0 and the sigmoid loss log 2
  r = run("grad --model '" + f.dir.string() + "' --batch '" + with_ref.string() +
          "' --objective dpo --dtype f64");
  REQUIRE(r.code == 0);
  const double via_logprobs = nlohmann::json::parse(r.out)["loss"].get<double>();
  CHECK(std::abs(via_logprobs - std::log(2.0)) < 1e-12);
  // the same reference sums given another way (the library's forward, written here)
  const std::vector<double> lib_w(sums.begin(), sums.begin() + 2),
      lib_l(sums.begin() + 2, sums.end());
  w.add("ref_chosen_logps", {p}, std::span<const double>(lib_w));
  w.add("ref_rejected_logps", {p}, std::span<const double>(lib_l));
  const auto given = f.dir / "dpo_given.safetensors";
  w.write(given);
  r = run("grad --model '" + f.dir.string() + "' --batch '" + given.string() +
          "' --objective dpo --dtype f64");
  REQUIRE(r.code == 0);
  CHECK(std::abs(nlohmann::json::parse(r.out)["loss"].get<double>() - via_logprobs) < 1e-12);

  // GRPO: old_logprobs from the same model make every ratio 1, so the loss is -mean(A)
  std::vector<std::int64_t> gid(cid), glab(clab);
  const std::vector<double> adv{0.7, -0.2};
  safetensors_writer g;
  g.add("input_ids", {p, t}, std::span<const std::int64_t>(gid));
  g.add("labels", {p, t}, std::span<const std::int64_t>(glab));
  g.add("advantages", {p}, std::span<const double>(adv));
  const auto grpo = f.dir / "grpo.safetensors", with_old = f.out / "grpo_old.safetensors";
  g.write(grpo);
  r = run("logprobs --model '" + f.dir.string() + "' --batch '" + grpo.string() + "' --out '" +
          with_old.string() + "' --dtype f64 --as old --temperature 0.8");
  REQUIRE(r.code == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["keys"][0] == "old_logprobs");
  r = run("grad --model '" + f.dir.string() + "' --batch '" + with_old.string() +
          "' --objective grpo --dtype f64 --temperature 0.8");
  REQUIRE(r.code == 0);
  CHECK(std::abs(nlohmann::json::parse(r.out)["loss"].get<double>() + 0.25) < 1e-12);

  // arguments and inputs
  const std::string base = "logprobs --model '" + f.dir.string() + "' --batch '" + grpo.string();
  CHECK(run(base + "' --out x.safetensors --as new").code == 2);
  CHECK(run(base + "' --out x.safetensors --objective sft").code == 2);
  CHECK(run(base + "'").code == 2);
  r = run(base + "' --out '" + grpo.string() + "'");
  CHECK(r.code != 0);
  CHECK(r.err.find("grpo.safetensors") != std::string::npos);
}

TEST_CASE("plan prints the chunk and the largest sequence per schedule") {
  const auto r = run("plan --preset small --seq 4096 --budget 512M --max-seq 100000");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("largest T: full") != std::string::npos);
  CHECK(r.out.find("stream / checkpoint") != std::string::npos);
  CHECK(r.out.find("offloaded to host memory (device backends): checkpoint") != std::string::npos);
}
