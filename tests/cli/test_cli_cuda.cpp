// `tightfit grad --device cuda` end to end, in a -DTIGHTFIT_WITH_CUDA=ON build (host compiler;
// the device count comes from the CUDA runtime's C API). Two suites:
//  - "cli_cuda_host" (ctest cli_cuda, runs without a GPU): with no visible device the tool exits
//    1 with the backend's one-line "no CUDA device" error, before writing anything;
//  - "cli_cuda_gpu" (ctest cli_cuda_gpu, label gpu): the CPU tool (--dtype f64) and the GPU tool
//    on the same random model and padded batch, for full and stream: the JSON lines carry the
//    same keys, and the losses and every gradient in the --out files agree (relative: max abs
//    difference / max abs CPU value, per tensor), f32 to 1e-4, bf16 to 2e-2 (the loss) and
//    1.25x PyTorch's largest bf16 error on the config (gradients, support/bf16_yardstick.hpp);
//    outputs go to their own scratch folder, never under the model directory; and `tightfit
//    train --device cuda` against the CPU tool (--dtype f64) for sgd and adamw: the same summary
//    line, every logged loss to 1e-4 relative, the saved weights to 1e-4 (sgd) and 1e-3 (adamw)
//    relative per tensor; `train --device cuda --dtype bf16` (adamw, fp32 master weights) against
//    the CPU tool in f32: each logged loss within 2e-2 relative, and falling step by step on a
//    fixed batch; `bench stream --device cuda` (f32, bf16): a CSV row per schedule whose losses
//    agree (1e-4 f32, 2e-2 bf16), stream's activation peak below full's.
//    Without a device it prints one line and passes. The host suite also checks that train
//    --dtype bf16 and bench --device cuda exit 1 without a device, before any file is touched.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_testing.hpp"
#include "support/bf16_yardstick.hpp"
#include "support/model_configs.hpp"
#include "support/testing.hpp"
#include "tightfit/backend/reference.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/model.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::q;
using cli_testing::run;

namespace {

bool have_device() {
  static const bool yes = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    if (n == 0)
      std::printf(
          "test_cli_cuda: no CUDA device: tightfit grad and train --device cuda are not "
          "compared with the CPU (they need one GPU)\n");
    return n > 0;
  }();
  return yes;
}

/// A random model directory (GQA 8/2 heads of 16, q/k-norm, untied) and a padded sft batch.
struct fixture {
  fs::path dir = cli_testing::scratch("cuda_model");
  fs::path outputs = cli_testing::scratch("cuda_out");  // never under the model directory
  model_config cfg = testing::small_gqa_config(301);
  fs::path batch = dir / "batch.safetensors";
  fixture() {
    reference_backend<double> be;
    llama_model<reference_backend<double>> model(be, cfg);
    model.init_random(7, 0.3, 0.2);
    save_hf_config(cfg, dir / "config.json");
    save_hf_weights(dir / "model.safetensors", model.parameters());
    const index_t b = 2, t = 75;
    std::vector<std::int64_t> ids, labels, mask;
    for (index_t i = 0; i < b * t; ++i) {
      const index_t r = i / t, k = i % t;
      ids.push_back((i * 37 + 11) % cfg.vocab_size);
      mask.push_back(r == 1 && k >= 48 ? 0 : 1);  // row 1: 48 tokens, right padding
      labels.push_back(k % 5 == 0 ? -100 : ids.back());
    }
    safetensors_writer w;
    w.add("input_ids", {b, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {b, t}, std::span<const std::int64_t>(labels));
    w.add("attention_mask", {b, t}, std::span<const std::int64_t>(mask));
    w.write(batch);
  }
  /// Training rows (6 x 24, unpadded) for train.
  fs::path train_data() const {
    const index_t n = 6, t = 24;
    std::vector<std::int64_t> ids;
    for (index_t i = 0; i < n * t; ++i) ids.push_back((i * 29 + 7) % cfg.vocab_size);
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    const auto path = dir / "train.safetensors";
    w.write(path);
    return path;
  }
  /// Runs grad; returns its JSON line (REQUIREs exit 0) and writes the gradients to `out`.
  nlohmann::json grad(const std::string& options, const fs::path& out) const {
    const auto r =
        run("grad --model " + q(dir) + " --batch " + q(batch) + " --out " + q(out) + " " + options);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  }
};

/// The "loss" of every line of a JSON-lines log.
std::vector<double> logged_losses(const fs::path& log) {
  std::ifstream in(log);
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);)
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return losses;
}

}  // namespace

TEST_SUITE("cli_cuda_host") {
  TEST_CASE("grad --device cuda with no visible device: exit 1, the backend's error, no output") {
    fixture f;
    const auto out = f.outputs / "none.safetensors";
    const auto r = cli_testing::run_with(
        "CUDA_VISIBLE_DEVICES= ",
        "grad --device cuda --model " + q(f.dir) + " --batch " + q(f.batch) + " --out " + q(out));
    CHECK(r.code == 1);
    CHECK(r.out.empty());
    CHECK(cli_testing::problem_lines(r.err).size() == 1);
    CHECK(r.err.find("--device cuda: no CUDA device is available") != std::string::npos);
    CHECK(!fs::exists(out));
  }

  TEST_CASE("train --dtype bf16 and bench --device cuda with no visible device: exit 1 first") {
    fixture f;
    const auto out = f.outputs / "none_trained";
    const auto missing = f.dir / "no_such.safetensors";
    const std::string train_args = "train --device cuda --dtype bf16 --optimizer adamw --model " +
                                   q(f.dir) + " --data " + q(missing) + " --save-model " + q(out);
    const auto t = cli_testing::run_with("CUDA_VISIBLE_DEVICES= ", train_args);
    CHECK(t.code == 1);
    CHECK(t.out.empty());
    CHECK(t.err.find("--device cuda: no CUDA device is available") != std::string::npos);
    CHECK(!fs::exists(out));
    const auto csv = f.outputs / "none.csv";
    const auto b = cli_testing::run_with(
        "CUDA_VISIBLE_DEVICES= ",
        "bench stream --device cuda --dtype bf16 --preset small --seq 64 --csv " + q(csv));
    CHECK(b.code == 1);
    CHECK(b.out.empty());
    CHECK(b.err.find("--device cuda: no CUDA device is available") != std::string::npos);
    CHECK(!fs::exists(csv));
  }
}

namespace {

/// The rows of a `bench stream --device cuda` CSV: schedule -> (loss, peak_activation_bytes,
/// peak_device_bytes), after checking the header's columns.
std::map<std::string, std::array<double, 3>> bench_rows(const fs::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  CHECK(line ==
        "objective,schedule,T,chunk,batch,dtype,device,peak_device_bytes,peak_activation_bytes,"
        "bytes_per_token,total_s,gflops,loss,statistics_s");
  std::map<std::string, std::array<double, 3>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> cell;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cell.push_back(c);
    REQUIRE(cell.size() == 14);
    rows[cell[1]] = {std::stod(cell[12]), std::stod(cell[8]), std::stod(cell[7])};
  }
  return rows;
}

}  // namespace

TEST_SUITE("cli_cuda_gpu") {
  TEST_CASE("bench stream --device cuda: every schedule's row, the same loss, less for stream") {
    if (!have_device()) return;
    const auto dir = cli_testing::scratch("cuda_bench");
    std::map<std::string, double> f32_loss;
    for (const auto& [dtype, tol] : {std::pair{"f32", 1e-4}, std::pair{"bf16", 2e-2}}) {
      CAPTURE(dtype);
      const auto csv = dir / (std::string(dtype) + ".csv");
      const auto r = run(std::string("bench stream --device cuda --dtype ") + dtype +
                         " --preset small --seq 256 --chunk 64 "
                         "--schedules full,checkpoint,stream,stream-k2 --csv " +
                         q(csv));
      INFO(r.err);
      REQUIRE(r.code == 0);
      CHECK(r.out.find("tightfit bench stream --device cuda") != std::string::npos);
      const auto rows = bench_rows(csv);
      REQUIRE(rows.size() == 4);
      const double full = rows.at("full")[0];
      CHECK(std::isfinite(full));
      for (const auto& [sched, v] : rows) {
        CAPTURE(sched);
        CHECK(std::abs(v[0] - full) <= tol * std::abs(full));
        CHECK(v[1] > 0);
        CHECK(v[2] > v[1]);  // parameters and gradients on top of the activations
      }
      CHECK(rows.at("stream")[1] < rows.at("full")[1]);
      if (f32_loss.empty())
        f32_loss["full"] = full;
      else
        CHECK(std::abs(full - f32_loss["full"]) <= tol * std::abs(f32_loss["full"]));
    }
  }

  TEST_CASE("train --device cuda --dtype bf16 (adamw): the loss falls, within 2e-2 of the CPU") {
    if (!have_device()) return;
    fixture f;
    const auto data = f.train_data();
    // 6 rows, batch 6: every step trains on the same rows, so the loss must fall
    const std::string common = "train --model " + q(f.dir) + " --data " + q(data) +
                               " --optimizer adamw --lr 3e-3 --steps 4 --batch 6 --sched stream "
                               "--chunk 7 --clip 5 --quiet";
    const auto cpu_log = f.outputs / "cpu_bf16ref.jsonl", gpu_log = f.outputs / "gpu_bf16.jsonl";
    const auto cpu = run(common + " --dtype f32 --log " + q(cpu_log));
    INFO(cpu.err);
    REQUIRE(cpu.code == 0);
    const auto gpu_dir = f.outputs / "gpu_bf16";
    const auto gpu = run(common + " --device cuda --dtype bf16 --log " + q(gpu_log) +
                         " --save-model " + q(gpu_dir));
    INFO(gpu.err);
    REQUIRE(gpu.code == 0);
    CHECK(gpu.out.rfind("optimizer adamw  steps 4  loss ", 0) == 0);
    const auto want = logged_losses(cpu_log), got = logged_losses(gpu_log);
    REQUIRE(want.size() == 4);
    REQUIRE(got.size() == want.size());
    for (std::size_t s = 0; s < want.size(); ++s) {
      CAPTURE(s);
      CHECK(std::abs(got[s] - want[s]) <= 2e-2 * std::abs(want[s]));
      if (s > 0) CHECK(got[s] < got[s - 1]);
    }
    CHECK(fs::exists(gpu_dir / "model.safetensors"));
  }

  TEST_CASE("grad --device cuda equals the CPU tool: f32 to 1e-4, bf16 to 1.25x PyTorch's") {
    if (!have_device()) return;
    fixture f;
    for (const std::string sched : {"full", "stream"}) {
      CAPTURE(sched);
      const std::string common = "--sched " + sched + (sched == "stream" ? " --chunk 16" : "");
      const auto cpu_file = f.outputs / ("cpu_" + sched + ".safetensors");
      const auto cpu = f.grad(common + " --dtype f64", cpu_file);
      const auto cpu_grads = safetensors_file::open(cpu_file);
      for (const auto& [dtype, tol] : {std::pair{"f32", 1e-4}, std::pair{"bf16", 2e-2}}) {
        CAPTURE(dtype);
        const auto gpu_file = f.outputs / ("gpu_" + sched + "_" + dtype + ".safetensors");
        const auto gpu = f.grad(common + " --device cuda --dtype " + dtype, gpu_file);
        for (const auto& [key, value] : cpu.items()) {
          CAPTURE(key);
          CHECK(gpu.contains(key));  // the same JSON line, plus device and device_name
        }
        CHECK(gpu["device"] == "cuda");
        CHECK(gpu["dtype"] == dtype);
        CHECK(gpu["schedule"] == sched);
        const double want = cpu["loss"].get<double>();
        CHECK(std::abs(gpu["loss"].get<double>() - want) <= tol * std::abs(want));
        const auto gpu_grads = safetensors_file::open(gpu_file);
        CHECK(gpu_grads.names() == cpu_grads.names());
        for (const auto& name : cpu_grads.names()) {
          CAPTURE(name);
          // bf16: within 1.25x PyTorch's own bf16 error (support/bf16_yardstick.hpp)
          const double bound =
              std::string(dtype) == "bf16" ? testing::bf16_gradient_bound("small_gqa") : tol;
          CHECK(testing::max_rel_diff(gpu_grads.read<double>(name), cpu_grads.read<double>(name)) <
                bound);
        }
      }
    }
  }

  TEST_CASE("train --device cuda equals the CPU tool (sgd, adamw; f32)") {
    if (!have_device()) return;
    fixture f;
    const auto data = f.train_data();
    for (const auto& [optimizer, tol] : {std::pair{"sgd", 1e-4}, std::pair{"adamw", 1e-3}}) {
      CAPTURE(optimizer);
      const std::string common = "train --model " + q(f.dir) + " --data " + q(data) +
                                 " --optimizer " + optimizer +
                                 " --steps 3 --batch 2 --sched stream --chunk 7 --clip 5 "
                                 "--schedule cosine --quiet";
      const auto tag = std::string(optimizer);
      const auto cpu_dir = f.outputs / ("cpu_" + tag), gpu_dir = f.outputs / ("gpu_" + tag);
      const auto cpu_log = f.outputs / ("cpu_" + tag + ".jsonl"),
                 gpu_log = f.outputs / ("gpu_" + tag + ".jsonl");
      const auto cpu =
          run(common + " --dtype f64 --log " + q(cpu_log) + " --save-model " + q(cpu_dir));
      INFO(cpu.err);
      REQUIRE(cpu.code == 0);
      const auto gpu =
          run(common + " --device cuda --log " + q(gpu_log) + " --save-model " + q(gpu_dir));
      INFO(gpu.err);
      REQUIRE(gpu.code == 0);
      CHECK(gpu.out.rfind("optimizer " + tag + "  steps 3  loss ", 0) == 0);
      const auto want = logged_losses(cpu_log), got = logged_losses(gpu_log);
      REQUIRE(want.size() == 3);
      REQUIRE(got.size() == want.size());
      for (std::size_t s = 0; s < want.size(); ++s)
        CHECK(std::abs(got[s] - want[s]) <= 1e-4 * std::abs(want[s]));
      const auto cpu_w = safetensors_file::open(cpu_dir / "model.safetensors");
      const auto gpu_w = safetensors_file::open(gpu_dir / "model.safetensors");
      CHECK(gpu_w.names() == cpu_w.names());
      for (const auto& name : cpu_w.names()) {
        CAPTURE(name);
        CHECK(testing::max_rel_diff(gpu_w.read<double>(name), cpu_w.read<double>(name)) < tol);
      }
      CHECK(fs::exists(gpu_dir / "config.json"));
    }
  }
}
