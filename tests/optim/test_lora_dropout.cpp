// LoRA dropout (nn/lora_dropout.hpp, nn/adapters.hpp, nn/lora.hpp): the mask (kept fraction
// against a 6-sigma bound, the 1 / (1 - p) scale, a different mask for every key, the same one
// on recomputation and for any chunking of the rows); the adapters' and the inputs' gradients
// equal under the full, checkpoint and stream schedules and every chunk size, over a sequence
// shard, and equal finite differences of the loss; p = 0 and forward-only passes are the code
// without dropout, bit for bit; a step's micro-batches draw the masks of the one batch of their
// rows; lora_dropout in adapter_config.json.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "optim_testing.hpp"
#include "tightfit/backend/meta.hpp"
#include "tightfit/distributed/self_communicator.hpp"
#include "tightfit/distributed/sequence_parallel.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/nn/lora.hpp"
#include "tightfit/nn/lora_dropout.hpp"
#include "tightfit/nn/peft.hpp"
#include "tightfit/optim/lora_optimizer.hpp"
#include "tightfit/optim/train.hpp"
#include "tightfit/stream/forward.hpp"

using namespace tightfit;
using optim_testing::ref;
using tightfit::testing::max_rel_diff;
using tightfit::testing::random_batch;

namespace {

// ---------------------------------------------------------------------------------------------
// The mask

/// A nonzero input value of sequence b, position t, column j (a function of the coordinates, so
/// that any chunk of rows can be built alike).
double input_value(index_t b, index_t t, index_t j) {
  return 0.5 + static_cast<double>((b * 131 + t * 17 + j * 7) % 97) / 97.0;
}

/// dropout(x) of the rows of `batch` sequences at positions [c0, c1), x from input_value, and x.
struct dropped {
  std::vector<double> x, y;  // (B (c1 - c0), cols) row b (c1 - c0) + (t - c0)
  index_t cols = 0;
  /// 1 where element (row, j) was kept, 0 where dropped.
  std::vector<char> kept() const {
    std::vector<char> k(y.size());
    for (std::size_t e = 0; e < y.size(); ++e) k[e] = y[e] != 0 ? 1 : 0;
    return k;
  }
};

dropped drop(const lora_dropout& d, index_t layer, int proj, std::int64_t first_row, index_t batch,
             index_t c0, index_t c1, index_t cols) {
  dropped r;
  r.cols = cols;
  const index_t c = c1 - c0, n = batch * c;
  for (index_t b = 0; b < batch; ++b)
    for (index_t t = c0; t < c1; ++t)
      for (index_t j = 0; j < cols; ++j) r.x.push_back(input_value(b, t, j));
  r.y.assign(r.x.size(), std::numeric_limits<double>::quiet_NaN());
  ref be;
  apply_lora_dropout(be, d, layer, proj, lora_rows{first_row, c0, c1},
                     as_matrix(std::span<const double>(r.x), n, cols),
                     as_matrix(std::span<double>(r.y), n, cols));
  return r;
}

/// The share of elements where two masks differ.
double differing(const std::vector<char>& a, const std::vector<char>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t n = 0;
  for (std::size_t e = 0; e < a.size(); ++e) n += a[e] != b[e] ? 1 : 0;
  return static_cast<double>(n) / static_cast<double>(a.size());
}

/// Whether a share observed over n Bernoulli(q) trials lies within 6 standard deviations of q.
bool within_six_sigma(double share, double q, std::size_t n) {
  const double sigma = std::sqrt(q * (1 - q) / static_cast<double>(n));
  return std::abs(share - q) <= 6 * sigma;
}

// ---------------------------------------------------------------------------------------------
// The gradients

model_config llama_dropout_config() {
  auto c = tightfit::testing::tiny_config(4, 2, true, false, 3);
  c.qkv_bias = true;
  c.mlp_bias = true;
  return c;
}
/// Gemma 3 style (post-norms: the o and down projections' adapters feed a norm); untied, so
/// that the embedding's gradient is the layers' input gradient alone.
model_config gemma_dropout_config() {
  model_config c = tightfit::testing::tiny_config(4, 2, true, false, 2);
  c.architecture = "Gemma3ForCausalLM";
  c.rope_local_base_freq = 100;
  c.query_pre_attn_scalar = 10;
  c.sliding_window = 4;
  c.sliding_layers = {true, false};
  return c;
}

lora_config dropout_lora(double p) {
  lora_config lc;
  lc.rank = 3;
  lc.alpha = 5;
  lc.dropout = p;
  lc.target_modules = {"all-linear"};
  lc.seed = 11;
  return lc;
}

/// Loss, the adapters' gradients and the embedding's (the gradient of the layers' input,
/// gathered by token).
struct lora_grads {
  double loss = 0;
  std::vector<std::vector<double>> adapters;
  std::vector<double> embedding;
};

double grads_diff(const lora_grads& a, const lora_grads& b) {
  double worst = optim_testing::max_diff(a.adapters, b.adapters);
  return std::max(worst, max_rel_diff(a.embedding, b.embedding));
}

/// A model with random weights and LoRA adapters of `lc` (B random too: with B = 0, dA and the
/// inputs' adapter gradient would vanish).
template <class M>
struct lora_model {
  ref be;
  M model;
  lora_adapters<M> lora;
  lora_optimizer<M> lopt;

  lora_model(const model_config& cfg, const lora_config& lc)
      : model(be, cfg), lora(model, lc), lopt(lora) {
    model.init_random(3, 0.3, 0.2);
    std::mt19937_64 gen(17);
    std::normal_distribution<double> dist(0.0, 0.3);
    auto& ap = lora.parameters();
    for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
      for (projection p : lora.targets())
        for (auto& x : ap.value(lora.b_id(l, p))) x = dist(gen);
  }

  backward_options options(backward_schedule s, index_t chunk) const {
    backward_options o;
    o.sched = s;
    o.chunk = chunk;
    o = lopt.lora_backward_options(o);
    o.embedding_grad = true;  // the layers' input gradient, all the way down
    return o;
  }

  /// Loss and gradients, in a training pass keyed `draw` when given (sequence parallel over one
  /// rank when `shard` is given: the ring's code path).
  lora_grads grads(const token_batch& batch, const backward_options& o,
                   std::optional<std::uint64_t> draw,
                   std::optional<sequence_assignment> shard = std::nullopt) {
    auto& ap = lora.parameters();
    for (std::size_t i = 0; i < ap.size(); ++i) {
      ap.allocate_grad(i);
      be.fill(as_row(ap.grad(i)), 0.0);
    }
    std::optional<lora_training_pass<lora_adapters<M>>> pass;
    if (draw) pass.emplace(lora, *draw);
    sft_loss loss;
    lora_grads r;
    if (shard) {
      self_communicator self;
      r.loss = sequence_parallel_gradients(model, batch, loss, o, self, {*shard}).loss;
    } else {
      r.loss = compute_gradients(model, batch, loss, o).loss;
    }
    r.adapters = tightfit::testing::grads_of(ap);
    auto g = model.parameters().grad(model.embed_id());
    r.embedding.assign(g.begin(), g.end());
    return r;
  }
  /// The loss alone (the same pass).
  double loss(const token_batch& batch, std::uint64_t draw) {
    lora_training_pass<lora_adapters<M>> pass(lora, draw);
    backward_options o;
    o.layer_weight_grads.assign(static_cast<std::size_t>(model.config().num_hidden_layers), false);
    o.embedding_grad = false;
    o.head_grad = false;
    o.frozen_params = lora.frozen_base();
    sft_loss l;
    return compute_gradients(model, batch, l, o).loss;
  }
};

/// Every schedule and chunk size (T = 9: chunks 2 and 4 do not divide it) against the full
/// schedule, the one-rank sequence shards too; then central differences of the loss in the
/// adapters and the embedding. Returns the full schedule's gradients.
template <class M>
lora_grads check_schedules_and_differences(const model_config& cfg, double p) {
  const random_batch batch(2, 9, cfg.vocab_size, {9, 7}, 5);
  lora_model<M> m(cfg, dropout_lora(p));
  const std::uint64_t draw = 7;
  const auto want = m.grads(batch.view(), m.options(backward_schedule::full, 9), draw);
  REQUIRE(want.adapters.size() == m.lora.parameters().size());
  for (auto [sched, chunk] : {std::pair{backward_schedule::checkpoint, index_t{9}},
                              std::pair{backward_schedule::stream, index_t{2}},
                              std::pair{backward_schedule::stream, index_t{3}},
                              std::pair{backward_schedule::stream, index_t{4}},
                              std::pair{backward_schedule::stream, index_t{9}}}) {
    const std::string schedule = to_string(sched);
    CAPTURE(schedule);
    CAPTURE(chunk);
    const auto got = m.grads(batch.view(), m.options(sched, chunk), draw);
    CHECK(std::abs(got.loss - want.loss) <= 1e-13 * std::abs(want.loss));
    CHECK(grads_diff(got, want) <= 1e-12);
  }
  for (auto assign : {sequence_assignment::contiguous, sequence_assignment::zigzag}) {
    const std::string assignment = to_string(assign);
    CAPTURE(assignment);
    const auto got = m.grads(batch.view(), m.options(backward_schedule::stream, 2), draw, assign);
    CHECK(std::abs(got.loss - want.loss) <= 1e-13 * std::abs(want.loss));
    CHECK(grads_diff(got, want) <= 1e-12);
  }

  // Central differences: with the key fixed the mask is fixed, the loss smooth.
  const double h = 1e-5;
  auto& ap = m.lora.parameters();
  auto central = [&](std::span<double> values, std::size_t e) {
    const double x0 = values[e];
    values[e] = x0 + h;
    const double up = m.loss(batch.view(), draw);
    values[e] = x0 - h;
    const double down = m.loss(batch.view(), draw);
    values[e] = x0;
    return (up - down) / (2 * h);
  };
  double largest = 0;
  for (const auto& g : want.adapters)
    for (double x : g) largest = std::max(largest, std::abs(x));
  REQUIRE(largest > 0);
  int compared = 0;
  for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (projection pr : {projection::q_proj, projection::v_proj, projection::o_proj,
                          projection::up_proj, projection::down_proj}) {
      for (std::size_t id : {m.lora.a_id(l, pr), m.lora.b_id(l, pr)}) {
        // the entry with the largest gradient of this matrix
        const auto& g = want.adapters[id];
        std::size_t e = 0;
        for (std::size_t k = 0; k < g.size(); ++k)
          if (std::abs(g[k]) > std::abs(g[e])) e = k;
        CAPTURE(ap.name(id));
        CHECK(std::abs(central(ap.value(id), e) - g[e]) <= 1e-7 * largest);
        ++compared;
      }
    }
  CHECK(compared == cfg.num_hidden_layers * 10);
  // the embedding of the first token (its rows' input gradients, summed)
  auto table = m.model.parameters().value(m.model.embed_id());
  const auto row = static_cast<std::size_t>(batch.ids[0] * cfg.hidden_size);
  double largest_e = 0;
  for (double x : want.embedding) largest_e = std::max(largest_e, std::abs(x));
  for (std::size_t j = 0; j < 4; ++j) {
    CHECK(std::abs(central(table, row + j) - want.embedding[row + j]) <= 1e-7 * largest_e);
  }
  return want;
}

}  // namespace

TEST_CASE("LoRA dropout mask: kept share within 6 sigma, kept values scaled by 1 / (1 - p)") {
  for (double p : {0.1, 0.5}) {
    CAPTURE(p);
    lora_dropout d;
    d.p = p;
    d.seed = 3;
    d.draw = 1;
    d.training = true;
    const auto r = drop(d, 2, 4, 0, 4, 0, 50, 512);
    const auto kept = r.kept();
    std::size_t n_kept = 0;
    double worst = 0;
    for (std::size_t e = 0; e < r.y.size(); ++e) {
      if (!kept[e]) continue;
      ++n_kept;
      worst = std::max(worst, std::abs(r.y[e] - r.x[e] / (1 - p)) / std::abs(r.x[e] / (1 - p)));
    }
    CHECK(worst <= 1e-15);
    // 102400 elements: sigma = sqrt(p (1 - p) / N) (1e-3 for p = 0.1)
    CHECK(within_six_sigma(static_cast<double>(n_kept) / static_cast<double>(r.y.size()), 1 - p,
                           r.y.size()));
    // neighbouring rows (positions, sequences) draw unrelated masks: they differ in 2 p (1 - p)
    const std::size_t row = 512, per_seq = 50 * row;
    std::vector<char> a, b, c;
    for (std::size_t e = 0; e + row < per_seq; ++e) {  // position t against t + 1, sequence 0
      a.push_back(kept[e]);
      b.push_back(kept[e + row]);
    }
    CHECK(within_six_sigma(differing(a, b), 2 * p * (1 - p), a.size()));
    a.assign(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(per_seq));
    c.assign(kept.begin() + static_cast<std::ptrdiff_t>(per_seq),
             kept.begin() + static_cast<std::ptrdiff_t>(2 * per_seq));
    CHECK(within_six_sigma(differing(a, c), 2 * p * (1 - p), a.size()));  // sequence 0 against 1
  }
}

TEST_CASE("LoRA dropout mask: every key gives another mask; recomputed and any chunk: the same") {
  const double p = 0.1;
  lora_dropout d;
  d.p = p;
  d.seed = 3;
  d.draw = 1;
  d.training = true;
  const index_t batch = 3, t = 40, cols = 256;
  const auto base = drop(d, 2, 4, 10, batch, 0, t, cols);
  const auto mask = base.kept();
  const double q = 2 * p * (1 - p);  // the share two independent masks differ in
  lora_dropout other = d;
  other.draw = 2;
  CHECK(within_six_sigma(differing(drop(other, 2, 4, 10, batch, 0, t, cols).kept(), mask), q,
                         mask.size()));
  other = d;
  other.seed = 4;
  CHECK(within_six_sigma(differing(drop(other, 2, 4, 10, batch, 0, t, cols).kept(), mask), q,
                         mask.size()));
  CHECK(within_six_sigma(differing(drop(d, 1, 4, 10, batch, 0, t, cols).kept(), mask), q,
                         mask.size()));  // layer
  CHECK(within_six_sigma(differing(drop(d, 2, 5, 10, batch, 0, t, cols).kept(), mask), q,
                         mask.size()));  // projection
  CHECK(within_six_sigma(differing(drop(d, 2, 4, 13, batch, 0, t, cols).kept(), mask), q,
                         mask.size()));  // the run's rows (another micro-batch)
  // recomputation: the same values, bit for bit
  CHECK(drop(d, 2, 4, 10, batch, 0, t, cols).y == base.y);
  // any chunk of positions: the rows of the whole batch's mask
  for (auto [c0, c1] : {std::pair{index_t{0}, index_t{7}}, std::pair{index_t{7}, index_t{23}},
                        std::pair{index_t{39}, index_t{40}}}) {
    CAPTURE(c0);
    const auto part = drop(d, 2, 4, 10, batch, c0, c1, cols);
    const index_t c = c1 - c0;
    bool same = true;
    for (index_t b = 0; b < batch; ++b)
      for (index_t pos = c0; pos < c1; ++pos)
        for (index_t j = 0; j < cols; ++j)
          same = same && part.y[static_cast<std::size_t>((b * c + pos - c0) * cols + j)] ==
                             base.y[static_cast<std::size_t>((b * t + pos) * cols + j)];
    CHECK(same);
  }
  // sequence b of a batch starting at run row 10 is sequence b + 1 of one starting at row 9
  const auto shifted = drop(d, 2, 4, 9, batch + 1, 0, t, cols).kept();
  CHECK(std::vector<char>(shifted.begin() + t * cols, shifted.end()) == mask);
}

TEST_CASE("LoRA dropout mask: p = 0 is the identity; thresholds; bad p and unknown rows") {
  lora_dropout d;
  d.training = true;
  const auto r = drop(d, 0, 0, 0, 2, 0, 5, 33);
  CHECK(r.y == r.x);
  CHECK(lora_dropout_threshold(0) == 0);
  CHECK(lora_dropout_threshold(0.5) == std::uint64_t{1} << 63);
  CHECK(lora_dropout_threshold(0.25) == std::uint64_t{1} << 62);
  CHECK(lora_dropout_threshold(std::nextafter(1.0, 0.0)) == ~std::uint64_t{0} - 2047);
  CHECK_THROWS_WITH_AS(lora_dropout_threshold(1.0), doctest::Contains("dropout is 1"), error);
  CHECK_THROWS_WITH_AS(lora_dropout_threshold(-0.25), doctest::Contains("dropout is -0.25"), error);
  CHECK_THROWS_WITH_AS(lora_dropout_threshold(std::nan("")), doctest::Contains("dropout is nan"),
                       error);
  d.p = 0.1;
  ref be;
  std::vector<double> x(6, 1.0), y(6);
  CHECK_THROWS_WITH_AS(
      apply_lora_dropout(be, d, 0, 0, lora_rows{}, as_matrix(std::span<const double>(x), 2, 3),
                         as_matrix(std::span<double>(y), 2, 3)),
      doctest::Contains("did not say which tokens"), error);
}

TEST_CASE(
    "LoRA dropout gradients: every schedule and chunk, a sequence shard, finite differences") {
  SUBCASE("llama (biases)") {
    const auto cfg = llama_dropout_config();
    const auto with = check_schedules_and_differences<llama_model<ref>>(cfg, 0.1);
    // without dropout the gradients are others (the test above would pass for p = 0 too)
    const auto without = check_schedules_and_differences<llama_model<ref>>(cfg, 0.0);
    CHECK(grads_diff(with, without) > 1e-3);
    CHECK(with.loss != without.loss);
  }
  SUBCASE("gemma 3 (post-norms)") {
    check_schedules_and_differences<gemma_model<ref>>(gemma_dropout_config(), 0.1);
  }
}

TEST_CASE("LoRA dropout: p = 0 and passes that are not training run the code without dropout") {
  const auto cfg = llama_dropout_config();
  const random_batch batch(2, 9, cfg.vocab_size, {9, 7}, 5);
  lora_model<llama_model<ref>> zero(cfg, dropout_lora(0)), drop_m(cfg, dropout_lora(0.1));
  const auto o = zero.options(backward_schedule::stream, 4);
  // p = 0: a training pass is bit for bit the pass without one
  const auto plain = zero.grads(batch.view(), o, std::nullopt);
  const auto trained = zero.grads(batch.view(), o, 5);
  CHECK(trained.loss == plain.loss);
  CHECK(trained.adapters == plain.adapters);
  CHECK(trained.embedding == plain.embedding);
  // p = 0.1 outside a training pass (evaluation): the adapters without dropout, bit for bit
  const auto eval = drop_m.grads(batch.view(), o, std::nullopt);
  CHECK(eval.loss == plain.loss);
  CHECK(eval.adapters == plain.adapters);
  CHECK(eval.embedding == plain.embedding);
  const auto lp_zero = model_logprobs(zero.model, batch.view());
  CHECK(model_logprobs(drop_m.model, batch.view()) == lp_zero);
  // in a training pass with p = 0.1 the loss differs; the step's pass ends with the step
  CHECK(drop_m.grads(batch.view(), o, 5).loss != plain.loss);
  sft_loss loss;
  drop_m.lopt.step(batch.view(), loss, o);
  CHECK_FALSE(drop_m.lora.dropout().training);
  CHECK(drop_m.lopt.steps() == 1);
}

TEST_CASE("LoRA dropout peak bytes: a dry run on meta_backend equals the measured peak") {
  const auto cfg = llama_dropout_config();
  const random_batch batch(2, 9, cfg.vocab_size, {9, 7}, 6);
  for (auto sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    const std::string schedule = to_string(sched);
    CAPTURE(schedule);
    backward_options o;
    o.sched = sched;
    o.chunk = 4;
    auto measure = [&](double p) {
      ref be;
      llama_model<ref> model(be, cfg);
      model.init_random(3, 0.3, 0.2);
      lora_adapters<llama_model<ref>> lora(model, dropout_lora(p));
      lora_optimizer<llama_model<ref>> opt(lora);
      sft_loss loss;
      return opt.step(batch.view(), loss, o).backward;
    };
    const auto measured = measure(0.1);
    meta_backend<double> dry_be;
    llama_model<meta_backend<double>> dry(dry_be, cfg);
    lora_adapters<llama_model<meta_backend<double>>> dry_lora(dry, dropout_lora(0.1));
    lora_optimizer<llama_model<meta_backend<double>>> dry_opt(dry_lora);
    sft_loss dry_loss;
    const auto predicted = dry_opt.step(batch.view(), dry_loss, o).backward;
    CHECK(predicted.peak_activation_bytes == measured.peak_activation_bytes);
    CHECK(predicted.peak_bytes == measured.peak_bytes);
    // the dropped inputs are counted buffers: never below the peak without dropout
    CHECK(measured.peak_activation_bytes >= measure(0).peak_activation_bytes);
  }
}

TEST_CASE("LoRA dropout in train(): micro-batches draw the one batch's masks; seeded; resumable") {
  const auto cfg = optim_testing::config(3);
  const index_t n = 4, t = 12;
  std::vector<token_id> ids;
  for (index_t r = 0; r < n; ++r)
    for (index_t k = 0; k < t; ++k) ids.push_back((3 * r + k) % 8);
  const token_dataset data(n, t, ids);
  adamw_update_rule w;
  w.lr = 0.02;
  // train() once per segment of steps, the optimizer's state carried over (a resumed run)
  auto run = [&](double p, std::uint64_t seed, index_t batch_rows, index_t accum,
                 std::vector<std::int64_t> segments) {
    ref be;
    llama_model<ref> model(be, cfg);
    model.init_random(5, 0.1);
    lora_config lc = dropout_lora(p);
    lc.seed = seed;
    lora_adapters<llama_model<ref>> lora(model, lc);
    lora_optimizer<llama_model<ref>> opt(lora, w);
    train_options o;
    o.batch = batch_rows;
    o.grad_accum = accum;
    o.backward.chunk = 5;
    std::vector<double> losses;
    for (std::int64_t steps : segments) {
      o.steps = steps;
      const auto sum = train(model, data, opt, constant_schedule{}, o, sft_loss{});
      losses.insert(losses.end(), sum.losses.begin(), sum.losses.end());
    }
    CHECK_FALSE(lora.dropout().training);
    return std::pair{optim_testing::values_of(lora.parameters()), losses};
  };
  const auto one = run(0.1, 1, 2, 1, {3});
  const auto acc = run(0.1, 1, 1, 2, {3});
  CHECK(optim_testing::max_diff(acc.first, one.first) <= 1e-12);
  const auto again = run(0.1, 1, 2, 1, {3});  // same seed: the same bits
  CHECK(again.first == one.first);
  CHECK(again.second == one.second);
  const auto resumed = run(0.1, 1, 2, 1, {2, 1});  // steps 0-1, then step 2: the same bits
  CHECK(resumed.first == one.first);
  CHECK(resumed.second == one.second);
  CHECK(optim_testing::max_diff(run(0.1, 2, 2, 1, {3}).first, one.first) > 1e-6);  // other seed
  CHECK(optim_testing::max_diff(run(0.0, 1, 2, 1, {3}).first, one.first) > 1e-6);  // no dropout
}

TEST_CASE("LoRA dropout in adapter_config.json: written, read back; 1, negative, nan refused") {
  const auto cfg = tightfit::testing::tiny_config(4, 2, true, false, 2);
  ref be;
  llama_model<ref> model(be, cfg);
  lora_config lc = dropout_lora(0.05);
  lora_adapters<llama_model<ref>> lora(model, lc);
  CHECK(lora.dropout().p == 0.05);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tightfit_lora_dropout_" + std::to_string(::getpid()));
  save_peft_adapter(dir, lora, {"my/base", true});
  {
    std::ifstream in(dir / "adapter_config.json");
    CHECK(nlohmann::json::parse(in)["lora_dropout"].get<double>() == 0.05);
  }
  CHECK(read_peft_config(dir).dropout == 0.05);
  auto write_dropout = [&](const nlohmann::json& v) {
    std::ifstream in(dir / "adapter_config.json");
    auto j = nlohmann::json::parse(in);
    j["lora_dropout"] = v;
    std::ofstream(dir / "adapter_config.json") << j.dump();
  };
  write_dropout(1.0);
  CHECK_THROWS_WITH_AS(read_peft_config(dir), doctest::Contains("\"lora_dropout\" is 1"), error);
  write_dropout(-0.1);
  CHECK_THROWS_WITH_AS(read_peft_config(dir), doctest::Contains("\"lora_dropout\" is -0.1"), error);
  write_dropout("0.1");
  CHECK_THROWS_WITH_AS(read_peft_config(dir), doctest::Contains("lora_dropout"), error);
  write_dropout(0.1);
  CHECK(read_peft_config(dir).dropout == 0.1);
  std::filesystem::remove_all(dir);
  lora_config bad = lc;
  bad.dropout = 1;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("dropout is 1"), error);
  bad.dropout = std::nan("");
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("dropout is nan"), error);
}
