// LoRA (nn/lora.hpp, optim/lora_optimizer.hpp): the adapters' gradients equal those of the merged
// weight W0 + s B A from plain backprop (dB = s dW A^T, dA = s B^T dW), under every schedule, with
// and without biases; no base-weight gradient GEMM runs (counted); merge; PEFT files; training.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "optim_testing.hpp"
#include "tightfit/backend/meta.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/lora.hpp"
#include "tightfit/nn/peft.hpp"
#include "tightfit/optim/lora_optimizer.hpp"
#include "tightfit/optim/train.hpp"

using namespace tightfit;
using optim_testing::matmul;
using optim_testing::ref;
using tightfit::testing::max_rel_diff;
using tightfit::testing::random_batch;

namespace {

/// The reference backend, recording each GEMM's shape: the flops of GEMMs with the adapter rank
/// r as one of m, n, k (the adapters' work), of the others, and the number of GEMMs whose
/// output has the shape of a base weight matrix (a weight-gradient GEMM).
class spy_backend : public reference_backend<double> {
 public:
  index_t rank = 0;
  std::set<std::pair<index_t, index_t>> weight_shapes;
  double rank_flops = 0, other_flops = 0;
  std::int64_t weight_shaped = 0;

  void gemm(transpose ta, transpose tb, double alpha, matrix_view<const double> a,
            matrix_view<const double> b, double beta, matrix_view<double> c) {
    const index_t k = ta == transpose::no ? a.cols : a.rows;
    const double flops = 2.0 * static_cast<double>(c.rows * c.cols * k);
    if (c.rows == rank || c.cols == rank || k == rank)
      rank_flops += flops;
    else
      other_flops += flops;
    if (weight_shapes.contains({c.rows, c.cols})) ++weight_shaped;
    reference_backend<double>::gemm(ta, tb, alpha, a, b, beta, c);
  }
  void reset_counts() {
    rank_flops = other_flops = 0;
    weight_shaped = 0;
  }
};

template <class B>
std::vector<double> host(parameter_set<B>& p, std::size_t i) {
  auto v = p.value(i);
  return {v.begin(), v.end()};
}
template <class B>
void set_host(parameter_set<B>& p, std::size_t i, const std::vector<double>& h) {
  std::copy(h.begin(), h.end(), p.value(i).begin());
}

model_config lora_test_config(bool biases) {
  auto c = tightfit::testing::tiny_config(4, 2, true, false, 3);
  c.qkv_bias = biases;
  c.o_bias = biases;
  c.mlp_bias = biases;
  return c;
}

/// Random B (A is PEFT-initialised; B = 0 would make dA zero and the test weak).
template <class B>
void randomise_b(lora_adapters<llama_model<B>>& lora, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 0.3);
  auto& ap = lora.parameters();
  for (index_t l = 0; l < lora.model().config().num_hidden_layers; ++l)
    for (projection p : lora.targets()) {
      auto v = ap.value(lora.b_id(l, p));
      for (auto& x : v) x = dist(gen);
    }
}

backward_options schedule_opts(backward_schedule s) {
  backward_options o;
  o.sched = s;
  o.chunk = 4;
  return o;
}

}  // namespace

TEST_CASE("LoRA gradients equal those of the merged weight W0 + s B A, every schedule") {
  for (bool biases : {false, true})
    for (const std::vector<std::string>& targets :
         {std::vector<std::string>{"all-linear"}, std::vector<std::string>{"q_proj", "v_proj"},
          std::vector<std::string>{"k_proj", "o_proj", "down_proj"}})
      for (auto sched :
           {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
        CAPTURE(biases);
        CAPTURE(targets.front());
        CAPTURE(to_string(sched));
        const auto cfg = lora_test_config(biases);
        const random_batch batch(2, 9, cfg.vocab_size, {9, 7}, 5);
        lora_config lc;
        lc.rank = 3;
        lc.alpha = 5;
        lc.target_modules = targets;
        lc.seed = 11;

        // The LoRA model: adapter gradients only.
        ref be;
        llama_model<ref> model(be, cfg);
        model.init_random(3, 0.3, 0.2);
        lora_adapters<llama_model<ref>> lora(model, lc);
        randomise_b(lora, 17);
        auto& ap = lora.parameters();
        for (std::size_t i = 0; i < ap.size(); ++i) ap.allocate_grad(i);
        lora_optimizer<llama_model<ref>> lopt(lora);
        sft_loss loss;
        const auto r = compute_gradients(model, batch.view(), loss,
                                         lopt.lora_backward_options(schedule_opts(sched)));
        for (std::size_t i = 0; i < model.parameters().size(); ++i)
          CHECK_FALSE(model.parameters().has_grad(i));

        // The merged model, plain backprop of every parameter.
        ref be_m;
        llama_model<ref> merged(be_m, cfg);
        merged.init_random(3, 0.3, 0.2);
        const double s = lc.scale();
        CHECK(s == doctest::Approx(5.0 / 3.0));
        for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
          for (projection p : lora.targets()) {
            const std::size_t w = lora.base_id(l, p);
            const auto a = host(ap, lora.a_id(l, p)), b = host(ap, lora.b_id(l, p));
            const index_t out = ap.shape(lora.b_id(l, p))[0], in = ap.shape(lora.a_id(l, p))[1];
            auto w0 = host(merged.parameters(), w);
            const auto ba = matmul(b, a, out, 3, in, false, false, s);
            for (std::size_t e = 0; e < w0.size(); ++e) w0[e] += ba[e];
            set_host(merged.parameters(), w, w0);
          }
        sft_loss loss_m;
        const auto rm = compute_gradients(merged, batch.view(), loss_m, schedule_opts(sched));
        CHECK(r.loss == doctest::Approx(rm.loss).epsilon(1e-13));

        double worst = 0;
        int compared = 0;
        for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
          for (projection p : lora.targets()) {
            const std::size_t ia = lora.a_id(l, p), ib = lora.b_id(l, p);
            const auto a = host(ap, ia), b = host(ap, ib);
            const index_t out = ap.shape(ib)[0], in = ap.shape(ia)[1];
            auto dw_span = merged.parameters().grad(lora.base_id(l, p));
            const std::vector<double> dw(dw_span.begin(), dw_span.end());  // (out, in)
            const auto db = matmul(dw, a, out, in, 3, false, true, s);     // s dW A^T
            const auto da = matmul(b, dw, 3, out, in, true, false, s);     // s B^T dW
            auto ga = ap.grad(ia), gb = ap.grad(ib);
            worst = std::max(worst, max_rel_diff(std::vector<double>(ga.begin(), ga.end()), da));
            worst = std::max(worst, max_rel_diff(std::vector<double>(gb.begin(), gb.end()), db));
            CHECK(max_rel_diff(std::vector<double>(ga.begin(), ga.end()),
                               std::vector<double>(da.size(), 0.0)) > 0);
            compared += 2;
          }
        CHECK(compared == 2 * 3 * static_cast<int>(lora.targets().size()));
        CHECK(worst < 1e-12);
      }
}

TEST_CASE("LoRA runs no base-weight gradient GEMM (counted), every schedule") {
  const auto cfg = lora_test_config(false);
  const random_batch batch(2, 9, cfg.vocab_size, {9, 7}, 6);
  const index_t rows = 2 * 9, d = cfg.hidden_size, qw = cfg.q_width(), kvw = cfg.kv_width(),
                f = cfg.intermediate_size;
  // Base weight-gradient flops of one layer (2 rows out in per matrix, whatever the chunking),
  // and layer 0's dh1 (3 GEMMs, needed by the full run only for input_layernorm's gradient).
  const double weight_grad_flops =
      2.0 * static_cast<double>(rows) *
      static_cast<double>(qw * d + 2 * kvw * d + d * qw + 2 * f * d + d * f);
  const double layer0_dh1 = 2.0 * static_cast<double>(rows * d * (qw + 2 * kvw));
  for (auto sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    CAPTURE(to_string(sched));
    spy_backend plain_be;
    plain_be.rank = 3;
    llama_model<spy_backend> plain(plain_be, cfg);
    plain.init_random(3, 0.3, 0.2);
    for (std::size_t i = 0; i < plain.parameters().size(); ++i)
      if (plain.parameters().shape(i).size() == 2)
        plain_be.weight_shapes.insert(
            {plain.parameters().shape(i)[0], plain.parameters().shape(i)[1]});
    plain_be.weight_shapes.erase({cfg.vocab_size, d});  // the embedding / head (no GEMM gradient)
    auto opt = schedule_opts(sched);
    opt.embedding_grad = false;
    opt.head_grad = false;
    sft_loss loss;
    compute_gradients(plain, batch.view(), loss, opt);
    // the counter can fail: the plain backward runs 7 weight-gradient GEMMs per layer and chunk
    CHECK(plain_be.weight_shaped > 0);
    CHECK(plain_be.rank_flops == 0);

    spy_backend lora_be;
    lora_be.rank = 3;
    lora_be.weight_shapes = plain_be.weight_shapes;
    llama_model<spy_backend> model(lora_be, cfg);
    model.init_random(3, 0.3, 0.2);
    lora_config lc;
    lc.rank = 3;
    lc.alpha = 6;
    lc.target_modules = {"all-linear"};
    lora_adapters<llama_model<spy_backend>> lora(model, lc);
    randomise_b(lora, 4);
    lora_optimizer<llama_model<spy_backend>> lopt(lora);
    lora_be.reset_counts();
    sft_loss loss_l;
    lopt.step(batch.view(), loss_l, schedule_opts(sched));
    CHECK(lora_be.weight_shaped == 0);
    CHECK(lora_be.rank_flops > 0);
    // Every GEMM but the adapters' is one the plain backward runs, minus its weight gradients.
    const double expected = plain_be.other_flops -
                            static_cast<double>(cfg.num_hidden_layers) * weight_grad_flops -
                            layer0_dh1;
    CHECK(lora_be.other_flops == expected);
  }
}

TEST_CASE("LoRA merge: W0 + s B A, same loss; rsLoRA scale; bad configurations") {
  const auto cfg = lora_test_config(true);
  const random_batch batch(1, 8, cfg.vocab_size, {}, 9);
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(3, 0.3, 0.2);
  lora_config lc;
  lc.rank = 2;
  lc.alpha = 4;
  lc.use_rslora = true;
  lc.target_modules = {"q_proj", "down_proj"};
  CHECK(lc.scale() == doctest::Approx(4.0 / std::sqrt(2.0)));
  lora_adapters<llama_model<ref>> lora(model, lc);
  randomise_b(lora, 8);
  std::vector<std::vector<double>> w0;
  for (std::size_t i = 0; i < model.parameters().size(); ++i)
    w0.push_back(host(model.parameters(), i));
  backward_options fwd;
  fwd.layer_weight_grads.assign(3, false);
  fwd.embedding_grad = false;
  fwd.head_grad = false;
  sft_loss l1;
  const double with_adapters = compute_gradients(model, batch.view(), l1, fwd).loss;
  lora.merge();
  CHECK_FALSE(lora.bound());
  auto& ap = lora.parameters();
  for (std::size_t i = 0; i < model.parameters().size(); ++i) {
    std::vector<double> want = w0[i];
    for (index_t l = 0; l < 3; ++l)
      for (projection p : lora.targets())
        if (lora.base_id(l, p) == i) {
          const index_t out = ap.shape(lora.b_id(l, p))[0], in = ap.shape(lora.a_id(l, p))[1];
          const auto ba = matmul(host(ap, lora.b_id(l, p)), host(ap, lora.a_id(l, p)), out, 2, in,
                                 false, false, lc.scale());
          for (std::size_t e = 0; e < want.size(); ++e) want[e] += ba[e];
        }
    CHECK(max_rel_diff(host(model.parameters(), i), want) < 1e-15);
  }
  sft_loss l2;
  CHECK(compute_gradients(model, batch.view(), l2, fwd).loss ==
        doctest::Approx(with_adapters).epsilon(1e-13));
  CHECK_THROWS_WITH_AS(lora.merge(), doctest::Contains("already merged"), error);

  lora_config bad = lc;
  bad.dropout = 1;  // a probability in [0, 1) (tests/optim/test_lora_dropout.cpp trains with one)
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("dropout is 1"), error);
  bad.dropout = -0.05;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("dropout is -0.05"), error);
  bad = lc;
  bad.target_modules = {"qkv_proj"};
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("'qkv_proj'"), error);
  bad.target_modules = {"q_proj", "q_proj"};
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("given twice"), error);
  bad = lc;
  bad.rank = 0;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("rank r is 0"), error);
  CHECK(split_target_modules("q_proj,v_proj") == std::vector<std::string>{"q_proj", "v_proj"});
  backward_options wrong;
  wrong.frozen_params.assign(3, true);
  sft_loss l3;
  CHECK_THROWS_WITH_AS(compute_gradients(model, batch.view(), l3, wrong),
                       doctest::Contains("frozen_params has 3 entries"), error);
}

TEST_CASE("LoRA initialisation: PEFT's (A uniform in 1/sqrt(in), B zero), seeded") {
  const auto cfg = lora_test_config(false);
  ref be;
  llama_model<ref> model(be, cfg);
  lora_config lc;
  lc.rank = 4;
  lc.target_modules = {"all-linear"};
  lc.seed = 5;
  lora_adapters<llama_model<ref>> a(model, lc);
  auto& ap = a.parameters();
  CHECK(ap.size() == 3 * 7 * 2);
  CHECK(ap.name(0) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  const auto down_a = a.a_id(2, projection::down_proj);
  CHECK(ap.name(down_a) == "base_model.model.model.layers.2.mlp.down_proj.lora_A.weight");
  CHECK(ap.shape(down_a)[0] == 4);
  CHECK(ap.shape(down_a)[1] == cfg.intermediate_size);
  CHECK(ap.shape(a.b_id(2, projection::down_proj))[0] == cfg.hidden_size);
  double largest = 0;
  for (double x : host(ap, down_a)) largest = std::max(largest, std::abs(x));
  CHECK(largest <= 1.0 / std::sqrt(static_cast<double>(cfg.intermediate_size)));
  CHECK(largest > 0.5 / std::sqrt(static_cast<double>(cfg.intermediate_size)));
  for (double x : host(ap, a.b_id(0, projection::q_proj))) CHECK(x == 0);
  const auto first = host(ap, 0);
  a.init(5);
  CHECK(host(ap, 0) == first);
  a.init(6);
  CHECK(host(ap, 0) != first);
}

TEST_CASE("LoRA peak bytes: a dry run on meta_backend equals the measured peak") {
  const auto cfg = lora_test_config(true);
  const random_batch batch(2, 9, cfg.vocab_size, {9, 7}, 6);
  lora_config lc;
  lc.rank = 3;
  lc.target_modules = {"all-linear"};
  for (auto sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    CAPTURE(to_string(sched));
    ref be;
    llama_model<ref> model(be, cfg);
    model.init_random(3, 0.3, 0.2);
    lora_adapters<llama_model<ref>> lora(model, lc);
    lora_optimizer<llama_model<ref>> opt(lora);
    sft_loss loss;
    const auto measured = opt.step(batch.view(), loss, schedule_opts(sched)).backward;

    meta_backend<double> dry_be;
    llama_model<meta_backend<double>> dry(dry_be, cfg);
    lora_adapters<llama_model<meta_backend<double>>> dry_lora(dry, lc);
    lora_optimizer<llama_model<meta_backend<double>>> dry_opt(dry_lora);
    sft_loss dry_loss;
    const auto predicted = dry_opt.step(batch.view(), dry_loss, schedule_opts(sched)).backward;
    CHECK(predicted.peak_activation_bytes == measured.peak_activation_bytes);
    CHECK(predicted.peak_bytes == measured.peak_bytes);
    CHECK(dry_opt.state_bytes() == 2 * lora.parameters().total_numel() * sizeof(double));
  }
}

TEST_CASE("LoRA training: train() with AdamW on the adapters lowers the loss, base frozen") {
  const auto cfg = optim_testing::config(3);
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(5, 0.1);
  std::vector<std::vector<double>> base;
  for (std::size_t i = 0; i < model.parameters().size(); ++i)
    base.push_back(host(model.parameters(), i));
  // counting sequences: token t + 1 follows token t (mod 8)
  const index_t n = 4, t = 16;
  std::vector<token_id> ids;
  for (index_t r = 0; r < n; ++r)
    for (index_t k = 0; k < t; ++k) ids.push_back((3 * r + k) % 8);
  token_dataset data(n, t, ids);
  lora_config lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.target_modules = {"all-linear"};
  lora_adapters<llama_model<ref>> lora(model, lc);
  adamw_update_rule w;
  w.lr = 0.02;
  lora_optimizer<llama_model<ref>> opt(lora, w, 1.0);
  train_options o;
  o.steps = 30;
  o.batch = 2;
  o.backward.chunk = 8;
  const auto sum = train(model, data, opt, constant_schedule{}, o, sft_loss{});
  REQUIRE(sum.losses.size() == 30);
  const double first = sum.losses[0] + sum.losses[1], last = sum.losses[28] + sum.losses[29];
  CHECK(last < 0.8 * first);
  CHECK(opt.steps() == 30);
  for (std::size_t i = 0; i < model.parameters().size(); ++i) {
    CHECK(host(model.parameters(), i) == base[i]);  // bit for bit: frozen
    CHECK_FALSE(model.parameters().has_grad(i));
  }
  // gradient accumulation over 2 micro-batches of 1 row == one batch of 2 rows (1e-12)
  ref be2;
  llama_model<ref> m1(be2, cfg), m2(be2, cfg);
  m1.init_random(5, 0.1);
  m2.init_random(5, 0.1);
  lora_adapters<llama_model<ref>> l1(m1, lc), l2(m2, lc);
  randomise_b(l1, 3);
  randomise_b(l2, 3);
  lora_optimizer<llama_model<ref>> o1(l1, w), o2(l2, w);
  train_options one = o, acc = o;
  one.steps = acc.steps = 3;
  acc.batch = 1;
  acc.grad_accum = 2;
  train(m1, data, o1, constant_schedule{}, one, sft_loss{});
  train(m2, data, o2, constant_schedule{}, acc, sft_loss{});
  double worst = 0;
  for (std::size_t i = 0; i < l1.parameters().size(); ++i)
    worst = std::max(worst, max_rel_diff(host(l2.parameters(), i), host(l1.parameters(), i)));
  CHECK(worst < 1e-12);
}

TEST_CASE("LoRA PEFT files: save, load into fresh adapters, refuse a different configuration") {
  const auto cfg = lora_test_config(false);
  ref be;
  llama_model<ref> model(be, cfg);
  lora_config lc;
  lc.rank = 2;
  lc.alpha = 3;
  lc.target_modules = {"v_proj", "gate_proj"};
  lora_adapters<llama_model<ref>> lora(model, lc);
  randomise_b(lora, 21);
  const auto dir =
      std::filesystem::temp_directory_path() / ("tightfit_lora_" + std::to_string(::getpid()));
  save_peft_adapter(dir, lora, {"my/base", true});
  const lora_config back = read_peft_config(dir);
  CHECK(back.rank == 2);
  CHECK(back.alpha == 3);
  CHECK(back.projections() == lora.targets());
  ref be2;
  llama_model<ref> model2(be2, cfg);
  lora_config other = back;
  other.seed = 99;  // a different initialisation, overwritten by the load
  lora_adapters<llama_model<ref>> lora2(model2, other);
  load_peft_adapter(dir, lora2);
  for (std::size_t i = 0; i < lora.parameters().size(); ++i)
    CHECK(host(lora2.parameters(), i) == host(lora.parameters(), i));
  ref be3;
  llama_model<ref> model3(be3, cfg);
  lora_config wrong = back;
  wrong.rank = 4;
  lora_adapters<llama_model<ref>> lora3(model3, wrong);
  CHECK_THROWS_WITH_AS(load_peft_adapter(dir, lora3), doctest::Contains("r is 2"), error);
  // a dropout that is no probability in [0, 1) is refused, naming the field and the file
  {
    std::ifstream in(dir / "adapter_config.json");
    auto j = nlohmann::json::parse(in);
    j["lora_dropout"] = 1.0;
    std::ofstream(dir / "adapter_config.json") << j.dump();
  }
  CHECK_THROWS_WITH_AS(read_peft_config(dir), doctest::Contains("\"lora_dropout\" is 1"), error);
  CHECK_THROWS_WITH_AS(read_peft_config(dir), doctest::Contains("adapter_config.json"), error);
  std::filesystem::remove_all(dir);
}
