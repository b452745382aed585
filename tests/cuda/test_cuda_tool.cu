// The tool's GPU step (tools/tightfit/device_cuda.cu, behind `tightfit grad --device cuda`)
// against reference_backend<double>'s full backprop, in test_cuda (so scripts/gpu-check runs it on
// a bare GPU machine, where the tool itself, which needs Eigen, oneTBB and nlohmann/json, cannot be
// built). Suite "cuda_host": require_cuda_device's error without a device. Suite "gpu":
// cuda_gradients on float weights handed over as the tool does (host spans, names in the model's
// order) for sft, grpo and dpo, stream and full, f32 to 1e-4 and bf16 to 2e-2 (the loss) and 1.25x
// PyTorch's largest bf16 error on the config (the gradients, support/bf16_yardstick.hpp), relative
// (max abs error / max abs reference, per tensor), and a parameter list that does not match the
// model is an error naming the parameter. cuda_train (behind `tightfit train --device cuda`)
// against train() on reference_backend<double> from the same float weights: sgd and adamw, three
// steps, stream with a short chunk and clipping: every step's loss to 1e-4 relative, the trained
// weights to 1e-4 (sgd) and 1e-3 (adamw: its first steps are about lr x sign(g), which float
// rounding can flip where a gradient is near zero) relative per tensor. bf16 training (fp32 master
// weights and moments) against the same reference for adam and adamw on a fixed batch: every loss
// within 2e-2 relative and falling, the fp32 master weights returned (most are not bf16 values) and
// each within 3 x steps x lr of the reference's (an Adam step moves an element by about lr), 12
// state bytes per parameter. The bench row (cuda_bench, behind `tightfit bench stream --device
// cuda`): full, checkpoint and stream agree on the loss (f32 1e-4, bf16 2e-2), checkpoint and
// stream peak below full in activation bytes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "device_cuda.hpp"
#include "support/bf16_yardstick.hpp"
#include "support/model_configs.hpp"
#include "support/testing.hpp"
#include "tightfit/backend/cuda.hpp"
#include "tightfit/backend/reference.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/optim/optim.hpp"

using namespace tightfit;

namespace {

bool tool_device() {
  static const bool yes = [] {
    const bool d = cuda_backend<float>::device_count() > 0;
    if (!d)
      std::printf(
          "test_cuda: no CUDA device: the tool's GPU step and training are not compared "
          "(they need one GPU)\n");
    return d;
  }();
  return yes;
}

model_config tool_config() {
  return testing::small_gqa_config(211);
}

/// `model` initialised by init_random(seed, 0.3, 0.2) and rounded to float, as the tool loads
/// it; returns those float weights per parameter (the host spans a job hands over).
std::vector<std::vector<float>> float_weights(llama_model<reference_backend<double>>& model,
                                              std::uint64_t seed) {
  model.init_random(seed, 0.3, 0.2);
  auto& p = model.parameters();
  std::vector<std::vector<float>> host(p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    for (double& v : p.value(i)) {
      v = static_cast<double>(static_cast<float>(v));
      host[i].push_back(static_cast<float>(v));
    }
  return host;
}

}  // namespace

TEST_SUITE("cuda_host") {
  TEST_CASE("the tool's require_cuda_device names --device cuda when there is no device") {
    if (cuda_backend<float>::device_count() > 0) {
      CHECK_THROWS_WITH_AS(cli::require_cuda_device(cuda_backend<float>::device_count()),
                           doctest::Contains("does not exist"), tightfit::error);
      return;
    }
    CHECK_THROWS_WITH_AS(cli::require_cuda_device(0),
                         doctest::Contains("--device cuda: no CUDA device is available"),
                         tightfit::error);
    cli::cuda_grad_job job;
    job.config = tool_config();
    sft_loss loss;
    CHECK_THROWS_WITH_AS(cli::cuda_gradients(job, loss),
                         doctest::Contains("no CUDA device is available"), tightfit::error);
    cli::cuda_train_job train_job;
    train_job.config = tool_config();
    CHECK_THROWS_WITH_AS(cli::cuda_train(train_job),
                         doctest::Contains("no CUDA device is available"), tightfit::error);
    train_job.dtype = cli::cuda_dtype::bf16;
    CHECK_THROWS_WITH_AS(cli::cuda_train(train_job),
                         doctest::Contains("no CUDA device is available"), tightfit::error);
    cli::cuda_bench_job bench_job;
    bench_job.config = tool_config();
    CHECK_THROWS_WITH_AS(cli::cuda_bench(bench_job, loss),
                         doctest::Contains("no CUDA device is available"), tightfit::error);
  }

  TEST_CASE("the tool's bf16 training refuses sgd by name, before any device call") {
    cli::cuda_train_job job;
    job.config = tool_config();
    job.dtype = cli::cuda_dtype::bf16;
    job.rule = sgd_update_rule{};
    CHECK_THROWS_WITH_AS(cli::cuda_train(job), doctest::Contains("not --optimizer sgd"),
                         tightfit::error);
  }
}

TEST_SUITE("gpu") {
  TEST_CASE("the tool's GPU step equals the reference backend (sft, grpo, dpo; f32, bf16)") {
    if (!tool_device()) return;
    const model_config cfg = tool_config();
    const index_t b = 4, t = 40;
    std::vector<token_id> ids(static_cast<std::size_t>(b * t)), targets(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<token_id>((i * 37 + 5) % static_cast<std::size_t>(cfg.vocab_size));
      targets[i] = i % 7 == 0 ? ignore_index : static_cast<token_id>((i * 11 + 3) % 211);
    }
    const std::vector<index_t> lengths{40, 33, 40, 21};
    const token_batch batch{b, t, ids, targets, lengths};
    const std::vector<double> adv{0.5, -1.0, 1.5, -0.25};
    const std::vector<index_t> chosen{0, 1}, rejected{2, 3};
    const std::vector<double> ref_w{-300.0, -250.0}, ref_l{-310.0, -240.0};
    // the reference model: float weights (what the tool loads), held in double
    reference_backend<double> rb;
    llama_model<reference_backend<double>> ref(rb, cfg);
    auto host = float_weights(ref, 11);
    auto& rp = ref.parameters();
    const struct {
      const char* name;
      std::function<backward_result(llama_model<reference_backend<double>>&,
                                    const backward_options&)>
          on_reference;
      std::function<cli::cuda_grad_result(cli::cuda_grad_job&)> on_gpu;
    } objectives[] = {
        {"sft",
         [&](auto& m, const backward_options& o) {
           sft_loss l;
           return compute_gradients(m, batch, l, o);
         },
         [&](cli::cuda_grad_job& j) {
           sft_loss l;
           return cli::cuda_gradients(j, l);
         }},
        {"grpo",
         [&](auto& m, const backward_options& o) {
           grpo_loss l(adv, {}, {});
           return compute_gradients(m, batch, l, o);
         },
         [&](cli::cuda_grad_job& j) {
           grpo_loss l(adv, {}, {});
           return cli::cuda_gradients(j, l);
         }},
        {"dpo",
         [&](auto& m, const backward_options& o) {
           dpo_loss l(chosen, rejected, ref_w, ref_l);
           return compute_gradients(m, batch, l, o);
         },
         [&](cli::cuda_grad_job& j) {
           dpo_loss l(chosen, rejected, ref_w, ref_l);
           return cli::cuda_gradients(j, l);
         }},
    };
    for (const auto& obj : objectives) {
      CAPTURE(obj.name);
      backward_options full;
      full.sched = backward_schedule::full;
      rp.zero_grads();  // gradients accumulate over calls
      const double want_loss = obj.on_reference(ref, full).loss;
      std::vector<std::vector<double>> want(rp.size());
      for (std::size_t i = 0; i < rp.size(); ++i)
        if (rp.has_grad(i)) want[i].assign(rp.grad(i).begin(), rp.grad(i).end());
      for (const auto sched : {backward_schedule::full, backward_schedule::stream})
        for (const auto dtype : {cli::cuda_dtype::f32, cli::cuda_dtype::bf16}) {
          const double tol = dtype == cli::cuda_dtype::f32 ? 1e-4 : 2e-2;
          const std::string what =
              std::string(to_string(sched)) + (dtype == cli::cuda_dtype::f32 ? " f32" : " bf16");
          CAPTURE(what);
          std::vector<std::vector<float>> grads(rp.size());
          cli::cuda_grad_job job;
          job.config = cfg;
          job.dtype = dtype;
          job.batch = batch;
          job.options.sched = sched;
          job.options.chunk = sched == backward_schedule::stream ? 13 : t;
          for (std::size_t i = 0; i < rp.size(); ++i) {
            grads[i].assign(host[i].size(), std::nanf(""));
            job.parameters.push_back({rp.name(i), host[i], grads[i]});
          }
          const auto got = obj.on_gpu(job);
          CHECK(std::abs(got.result.loss - want_loss) <= tol * std::abs(want_loss));
          CHECK(got.result.peak_bytes > 0);
          for (std::size_t i = 0; i < rp.size(); ++i) {
            CAPTURE(rp.name(i));
            CHECK(job.parameters[i].computed == rp.has_grad(i));
            if (!job.parameters[i].computed) continue;
            // bf16: 1.25x PyTorch's largest bf16 error on the config (bf16_yardstick.hpp)
            const double bound =
                dtype == cli::cuda_dtype::f32 ? tol : testing::bf16_gradient_bound("small_gqa");
            CHECK(testing::max_rel_diff(std::vector<double>(grads[i].begin(), grads[i].end()),
                                        want[i]) < bound);
          }
        }
    }
    // the tool hands over the host model's parameters: another list is refused by name
    cli::cuda_grad_job job;
    job.config = cfg;
    job.batch = batch;
    std::vector<std::vector<float>> grads(rp.size());
    for (std::size_t i = 0; i < rp.size(); ++i) {
      grads[i].resize(host[i].size());
      job.parameters.push_back({rp.name(i), host[i], grads[i]});
    }
    job.parameters[1].name = "not.a.parameter";
    sft_loss l;
    CHECK_THROWS_WITH_AS(cli::cuda_gradients(job, l), doctest::Contains("'not.a.parameter'"),
                         tightfit::error);
  }

  /// n rows of 24 tokens for the training tests: each row's labels are its ids, every fifth
  /// position ignored.
  token_dataset training_rows(const model_config& cfg, index_t n) {
    const index_t t = 24;
    std::vector<token_id> ids(static_cast<std::size_t>(n * t)), labels(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<token_id>((i * 29 + 7) % static_cast<std::size_t>(cfg.vocab_size));
      labels[i] = i % 5 == 0 ? ignore_index : ids[i];
    }
    return token_dataset(n, t, std::move(ids), std::move(labels));
  }

  TEST_CASE("the tool's GPU training equals train() on the reference backend (sgd, adamw)") {
    if (!tool_device()) return;
    const model_config cfg = tool_config();
    const token_dataset data = training_rows(cfg, 6);
    train_options o;
    o.steps = 3;
    o.batch = 2;
    o.backward.sched = backward_schedule::stream;
    o.backward.chunk = 7;
    const runtime_schedule sched = runtime_schedule::parse("cosine", o.steps);
    const double clip = 5.0;
    const std::vector<cli::cuda_train_job::rule_type> rules{sgd_update_rule{0.05},
                                                            adamw_update_rule{}};
    for (const auto& rule : rules) {
      const bool sgd = std::holds_alternative<sgd_update_rule>(rule);
      const double tol = sgd ? 1e-4 : 1e-3;
      CAPTURE(sgd);
      // the reference: float weights held in double, trained by train()
      reference_backend<double> rb;
      llama_model<reference_backend<double>> ref(rb, cfg);
      auto host = float_weights(ref, 13);
      auto& rp = ref.parameters();
      const train_summary want = std::visit(
          [&](const auto& r) {
            auto opt = make_full_optimizer(ref, r, clip);
            return train(ref, data, opt, sched, o, sft_loss{});
          },
          rule);
      cli::cuda_train_job job;
      job.config = cfg;
      for (std::size_t i = 0; i < rp.size(); ++i)
        job.parameters.push_back({rp.name(i), host[i], {}});
      job.data = &data;
      job.rule = rule;
      job.max_grad_norm = clip;
      job.schedule = sched;
      job.options = o;
      std::vector<double> step_losses;
      job.on_step = [&](const train_step& s) { step_losses.push_back(s.result->loss); };
      const auto got = cli::cuda_train(job);
      REQUIRE(got.summary.losses.size() == want.losses.size());
      CHECK(step_losses == got.summary.losses);
      for (std::size_t s = 0; s < want.losses.size(); ++s) {
        CAPTURE(s);
        CHECK(std::abs(got.summary.losses[s] - want.losses[s]) <= 1e-4 * std::abs(want.losses[s]));
      }
      CHECK(got.summary.peak_bytes > 0);
      CHECK(!got.device_name.empty());
      for (std::size_t i = 0; i < rp.size(); ++i) {
        CAPTURE(rp.name(i));
        const std::vector<double> trained(rp.value(i).begin(), rp.value(i).end());
        CHECK(testing::max_rel_diff(std::vector<double>(host[i].begin(), host[i].end()), trained) <
              tol);
      }
    }
  }
  TEST_CASE("the tool's bench rows: full, checkpoint and stream agree on the loss (f32, bf16)") {
    if (!tool_device()) return;
    const model_config cfg = tool_config();
    const index_t b = 2, t = 96;
    std::vector<token_id> ids(static_cast<std::size_t>(b * t)), targets(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<token_id>((i * 37 + 5) % static_cast<std::size_t>(cfg.vocab_size));
      targets[i] = static_cast<token_id>((i * 11 + 3) % static_cast<std::size_t>(cfg.vocab_size));
    }
    double f32_full = 0;
    for (const auto dtype : {cli::cuda_dtype::f32, cli::cuda_dtype::bf16}) {
      const double tol = dtype == cli::cuda_dtype::f32 ? 1e-4 : 2e-2;
      CAPTURE(tol);
      double full_loss = 0;
      std::size_t full_act = 0;
      for (const auto sched :
           {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
        const std::string sched_name = to_string(sched);
        CAPTURE(sched_name);
        cli::cuda_bench_job job;
        job.config = cfg;
        job.dtype = dtype;
        job.batch = {b, t, ids, targets, {}};
        job.options.sched = sched;
        job.options.chunk = 32;
        sft_loss loss;
        const auto r = cli::cuda_bench(job, loss);
        CHECK(std::isfinite(r.result.loss));
        CHECK(r.seconds > 0);
        CHECK(r.flops > 0);
        CHECK(r.peak_device_bytes > r.result.peak_activation_bytes);
        CHECK(!r.device_name.empty());
        if (sched == backward_schedule::full) {
          full_loss = r.result.loss;
          full_act = r.result.peak_activation_bytes;
          if (dtype == cli::cuda_dtype::f32)
            f32_full = full_loss;
          else
            CHECK(std::abs(full_loss - f32_full) <= tol * std::abs(f32_full));
        } else {
          CHECK(std::abs(r.result.loss - full_loss) <= tol * std::abs(full_loss));
          CHECK(r.result.peak_activation_bytes < full_act);
        }
      }
    }
  }

  TEST_CASE("the tool's bf16 training (adam, adamw): within 2e-2 of train() in double, falling") {
    if (!tool_device()) return;
    const model_config cfg = tool_config();
    const token_dataset data = training_rows(cfg, 4);
    train_options o;
    o.steps = 4;
    o.batch = data.rows();  // every step on the same rows: the loss must fall
    o.backward.sched = backward_schedule::stream;
    o.backward.chunk = 7;
    const runtime_schedule sched = runtime_schedule::parse("constant", o.steps);
    const double clip = 5.0;
    adam_update_rule adam;
    adam.lr = 3e-3;
    adamw_update_rule adamw;
    adamw.lr = 3e-3;
    const std::vector<cli::cuda_train_job::rule_type> rules{adam, adamw};
    for (const auto& rule : rules) {
      const std::size_t which = rule.index();  // 0 adam, 1 adamw
      CAPTURE(which);
      reference_backend<double> rb;
      llama_model<reference_backend<double>> ref(rb, cfg);
      auto host = float_weights(ref, 13);
      auto& rp = ref.parameters();
      const train_summary want = std::visit(
          [&](const auto& r) {
            auto opt = make_full_optimizer(ref, r, clip);
            return train(ref, data, opt, sched, o, sft_loss{});
          },
          rule);
      cli::cuda_train_job job;
      job.config = cfg;
      job.dtype = cli::cuda_dtype::bf16;
      for (std::size_t i = 0; i < rp.size(); ++i)
        job.parameters.push_back({rp.name(i), host[i], {}});
      job.data = &data;
      job.rule = rule;
      job.max_grad_norm = clip;
      job.schedule = sched;
      job.options = o;
      const auto got = cli::cuda_train(job);
      REQUIRE(got.summary.losses.size() == want.losses.size());
      for (std::size_t s = 0; s < want.losses.size(); ++s) {
        CAPTURE(s);
        CHECK(std::abs(got.summary.losses[s] - want.losses[s]) <= 2e-2 * std::abs(want.losses[s]));
        if (s > 0) CHECK(got.summary.losses[s] < got.summary.losses[s - 1]);
      }
      // fp32 master weights and two fp32 moments per parameter
      std::size_t numel = 0;
      for (std::size_t i = 0; i < rp.size(); ++i) numel += host[i].size();
      CHECK(got.summary.state_bytes == 12 * numel);
      // the fp32 master weights came back (not the bf16 copy: most are not bf16 values), each
      // element within 3 x steps x lr of the reference's (both move by about lr per step)
      std::size_t not_bf16 = 0;
      for (std::size_t i = 0; i < rp.size(); ++i) {
        CAPTURE(rp.name(i));
        double worst = 0;
        for (std::size_t k = 0; k < host[i].size(); ++k) {
          worst = std::max(worst, std::abs(double(host[i][k]) - rp.value(i)[k]));
          if (__bfloat162float(__float2bfloat16(host[i][k])) != host[i][k]) ++not_bf16;
        }
        CHECK(worst <= 3 * 4 * 3e-3);
      }
      CHECK(not_bf16 > numel / 2);
    }
  }
}
