// Resume equality (bit for bit), full optimizers against the kernels, the training loop, the
// data set file.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "optim_testing.hpp"
#include "tightfit/io/token_file.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/optim/callbacks.hpp"
#include "tightfit/optim/checkpoint.hpp"
#include "tightfit/optim/train.hpp"

using namespace tightfit;
using optim_testing::ref;
using optim_testing::values_of;
using tightfit::testing::random_batch;

namespace {

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("tightfit_optim_" + std::to_string(::getpid()) + "_" + name);
}

backward_options stream_opts() {
  backward_options o;
  o.chunk = 4;
  return o;
}

/// Runs `first` steps, saves, runs `second` more; then a fresh model + optimizer loads the
/// checkpoint and runs `second` steps: both must end with identical weights and state.
template <class Opt, class Make>
void check_resume(Make make, int first, int second) {
  const auto cfg = optim_testing::config(3);
  std::vector<random_batch> batches;
  for (int s = 0; s < first + second; ++s)
    batches.emplace_back(1, 8, cfg.vocab_size, std::vector<index_t>{}, 100 + s);
  const auto path = temp_file("resume.safetensors");
  ref be_a;
  llama_model<ref> a(be_a, cfg);
  a.init_random(7, 0.3, 0.2);
  auto opt_a = make(a);
  sft_loss loss;
  for (int s = 0; s < first; ++s) opt_a.step(batches[s].view(), loss, stream_opts());
  optim_testing::save_state_file(path, a, opt_a);
  for (int s = first; s < first + second; ++s) opt_a.step(batches[s].view(), loss, stream_opts());

  ref be_b;
  llama_model<ref> b(be_b, cfg);
  b.init_random(99, 0.3, 0.2);  // other weights: the checkpoint must restore them
  auto opt_b = make(b);
  optim_testing::load_state_file(path, b, opt_b);
  CHECK(opt_b.steps() == first);
  for (int s = first; s < first + second; ++s) opt_b.step(batches[s].view(), loss, stream_opts());
  CHECK(opt_b.active_block() == opt_a.active_block());
  CHECK(opt_b.steps_in_block() == opt_a.steps_in_block());
  const auto wa = values_of(a.parameters()), wb = values_of(b.parameters());
  bool identical = true;
  for (std::size_t i = 0; i < wa.size(); ++i) identical = identical && wa[i] == wb[i];
  CHECK(identical);
  // and the saved states match too
  const auto pa = temp_file("a.safetensors"), pb = temp_file("b.safetensors");
  optim_testing::save_state_file(pa, a, opt_a);
  optim_testing::save_state_file(pb, b, opt_b);
  std::ifstream fa(pa, std::ios::binary), fb(pb, std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(fa)), {}),
      sb((std::istreambuf_iterator<char>(fb)), {});
  CHECK(sa == sb);
  std::filesystem::remove(path);
  std::filesystem::remove(pa);
  std::filesystem::remove(pb);
}

block_options opts(index_t k, std::uint64_t seed = 3) {
  block_options o;
  o.switch_every = k;
  o.seed = seed;
  return o;
}

}  // namespace

TEST_CASE("resume: BAdam with random order continues bit for bit (mid-block and at a switch)") {
  using opt_t = block_optimizer<llama_model<ref>>;
  auto make = [](llama_model<ref>& m) {
    return opt_t(m, block_partition::by_layer(m.parameters()), {}, {}, {}, opts(2));
  };
  check_resume<opt_t>(make, 3, 5);  // saved mid-block
  check_resume<opt_t>(make, 6, 4);  // saved at the end of a pass (next step switches)
}

TEST_CASE("resume: BREAD-LoRA (adapter state) and BREAD-SGD continue bit for bit") {
  using lora_t =
      block_optimizer<llama_model<ref>, adamw_update_rule, random_reshuffle, lora_expansion>;
  check_resume<lora_t>(
      [](llama_model<ref>& m) {
        lora_expansion e;
        e.rank = 2;
        e.scope = expansion_scope::all;
        return lora_t(m, block_partition::by_layer(m.parameters(), true, true), {}, {}, e, opts(2));
      },
      3, 4);
  using sgd_t =
      block_optimizer<llama_model<ref>, adam_update_rule, descending_order, sgd_expansion>;
  check_resume<sgd_t>(
      [](llama_model<ref>& m) {
        return sgd_t(m, block_partition::by_layer(m.parameters()), {}, {}, {}, opts(2));
      },
      2, 3);
}

TEST_CASE("load refuses a state saved by another optimizer") {
  const auto cfg = optim_testing::config(2);
  ref be;
  llama_model<ref> m(be, cfg);
  block_optimizer<llama_model<ref>> badam(m, block_partition::by_layer(m.parameters()));
  const auto path = temp_file("other.safetensors");
  optim_testing::save_state_file(path, m, badam);
  block_optimizer<llama_model<ref>, sgd_update_rule> sgd(m,
                                                         block_partition::by_layer(m.parameters()));
  CHECK_THROWS_WITH_AS(optim_testing::load_state_file(path, m, sgd),
                       doctest::Contains("saved update rule is 'adam', this optimizer uses 'sgd'"),
                       error);
  block_optimizer<llama_model<ref>> more(m, block_partition::by_layer(m.parameters(), true));
  CHECK_THROWS_WITH_AS(optim_testing::load_state_file(path, m, more),
                       doctest::Contains("the saved partition has other blocks"), error);
  std::filesystem::remove(path);
}

TEST_CASE("full optimizers: Adam over every parameter equals the kernel, state kept") {
  const auto cfg = optim_testing::config(2);
  const random_batch batch(1, 8, cfg.vocab_size, {}, 3);
  ref be;
  llama_model<ref> m(be, cfg);
  m.init_random(7, 0.3, 0.2);
  adam_update_rule rule;
  rule.lr = 0.01;
  auto opt = make_full_optimizer(m, rule);
  ref be2;
  llama_model<ref> o(be2, cfg);
  o.init_random(7, 0.3, 0.2);
  auto& p2 = o.parameters();
  std::vector<std::vector<double>> ms(p2.size()), vs(p2.size());
  for (std::size_t i = 0; i < p2.size(); ++i) {
    ms[i].assign(static_cast<std::size_t>(p2.numel(i)), 0.0);
    vs[i] = ms[i];
  }
  sft_loss loss;
  for (int s = 1; s <= 3; ++s) {
    const auto r = opt.step(batch.view(), loss, stream_opts());
    CHECK(r.switched == (s == 1));
    p2.zero_grads();
    compute_gradients(o, batch.view(), loss, stream_opts());
    for (std::size_t i = 0; i < p2.size(); ++i) {
      adam_hyper<double> h;
      h.lr = 0.01;
      h.step = s;
      be2.adam_update(p2.value(i), std::span<const double>(p2.grad(i)), std::span<double>(ms[i]),
                      std::span<double>(vs[i]), h);
    }
  }
  CHECK(optim_testing::max_diff(values_of(m.parameters()), values_of(p2)) < 1e-13);
  CHECK(opt.state_bytes() == 2 * sizeof(double) * static_cast<std::size_t>(p2.total_numel()));
}

TEST_CASE("training loop: data set file, log lines, schedule, falling loss, checkpoint") {
  const auto cfg = optim_testing::config(2);
  std::vector<token_id> ids, labels;
  for (index_t r = 0; r < 2; ++r)
    for (index_t t = 0; t < 10; ++t) {
      ids.push_back((3 * t + r) % cfg.vocab_size);
      labels.push_back(t < 2 ? ignore_index : ids.back());
    }
  const token_dataset data(2, 10, ids, labels);
  const auto file = temp_file("data.safetensors");
  write_token_table(file, data.rows(), data.seq_len(), data.input_ids(), data.labels());
  auto table = read_token_table(file);
  const token_dataset loaded(table.rows, table.seq_len, std::move(table.input_ids),
                             std::move(table.labels));
  CHECK(loaded.input_ids() == ids);
  CHECK(loaded.labels() == labels);
  const auto b = make_batch(loaded, 1, 2);  // rows 1, 0
  CHECK(b.ids[0] == ids[10]);
  CHECK(b.targets[0] == labels[11]);
  CHECK(b.targets[9] == ignore_index);

  ref be;
  llama_model<ref> m(be, cfg);
  m.init_random(7, 0.1);
  adam_update_rule rule;
  rule.lr = 0.02;
  auto opt = make_full_optimizer(m, rule);
  train_options o;
  o.steps = 12;
  o.batch = 2;
  const auto log_path = temp_file("log.jsonl"), state_path = temp_file("state.safetensors");
  std::vector<double> factors;
  struct counter {  // a callback with only on_begin and on_end
    int begun = 0, ended = 0;
    void on_begin(const train_begin& b) { begun += b.steps == 12; }
    void on_end(const train_summary& s) { ended += s.losses.size() == 12; }
  } events;
  const auto sum =
      train(m, loaded, opt, cosine_schedule{3, 12}, o, sft_loss{}, json_log(log_path), events,
            [&](std::int64_t, const step_result&) { factors.push_back(opt.lr_factor()); });
  optim_testing::save_state_file(state_path, m, opt);
  CHECK(events.begun == 1);
  CHECK(events.ended == 1);
  REQUIRE(sum.losses.size() == 12);
  CHECK(sum.losses.back() < 0.8 * sum.losses.front());
  CHECK(factors[0] == doctest::Approx(1.0 / 3));
  CHECK(factors[11] == doctest::Approx(0.0));
  CHECK(sum.peak_bytes > 0);
  std::ifstream log(log_path);
  std::string line;
  int lines = 0;
  while (std::getline(log, line)) {
    ++lines;
    CHECK(line.find("\"loss\":") != std::string::npos);
  }
  CHECK(lines == 12);
  const auto st = safetensors_file::open(state_path);
  CHECK(st.contains("optim.counters"));
  CHECK(st.read_ints("optim.counters")[3] == 12);

  token_dataset bad(1, 4, {0, 1, 2, 99});
  CHECK_THROWS_WITH_AS(train(m, bad, opt, constant_schedule{}, o, sft_loss{}),
                       doctest::Contains("input_ids[0][3] is 99"), error);
  CHECK_THROWS_WITH_AS(token_dataset(1, 4, {0, 1, 2}), doctest::Contains("input_ids.size is 3"),
                       error);
  for (const auto& p : {file, log_path, state_path}) std::filesystem::remove(p);
}

TEST_CASE("training loop: an objective factory builds each step's objective from its batch") {
  const auto cfg = optim_testing::config(2);
  std::vector<token_id> ids;
  for (index_t t = 0; t < 3 * 6; ++t) ids.push_back((5 * t + 1) % cfg.vocab_size);
  const token_dataset data(3, 6, ids);
  auto run = [&](auto&& objective) {
    ref be;
    llama_model<ref> m(be, cfg);
    m.init_random(5, 0.1);
    auto opt = make_full_optimizer(m, adam_update_rule{});
    train_options o;
    o.steps = 3;
    return train(m, data, opt, constant_schedule{}, o, objective).losses;
  };
  std::vector<index_t> seen;
  const auto from_factory = run([&](const dataset_batch& b) {
    seen.push_back(b.ids.front());
    return sft_loss(sft_loss::reduction::sum);
  });
  const auto direct = run(sft_loss(sft_loss::reduction::sum));
  CHECK(seen == std::vector<index_t>{ids[0], ids[6], ids[12]});  // rows 0, 1, 2
  CHECK(from_factory == direct);
  CHECK(direct != run(sft_loss{}));  // sum and mean differ: the objective given is the one used
}

TEST_CASE("training loop: grad_accum micro-batches give the update of one union batch (1e-12)") {
  // Rows of different supervised lengths, so that a mean per micro-batch would differ from the
  // step's mean.
  const auto cfg = optim_testing::config(2);
  const index_t rows = 8, t = 7;
  std::vector<token_id> ids, labels;
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < t; ++c) {
      ids.push_back(static_cast<token_id>((5 * c + 3 * r + 1) % cfg.vocab_size));
      labels.push_back(c < 1 + (r * 3) % 5 ? ignore_index : ids.back());
    }
  const token_dataset data(rows, t, ids, labels);
  auto run = [&](index_t batch, index_t accum, bool blocks) {
    ref be;
    llama_model<ref> m(be, cfg);
    m.init_random(11, 0.2, 0.1);
    train_options o;
    o.steps = 3;
    o.batch = batch;
    o.grad_accum = accum;
    o.backward = stream_opts();
    adam_update_rule rule;
    rule.lr = 0.01;
    std::vector<double> losses;
    if (blocks) {
      block_optimizer<llama_model<ref>> opt(m, block_partition::by_layer(m.parameters()), rule, {},
                                            {}, opts(2));
      losses = train(m, data, opt, constant_schedule{}, o, sft_loss{}).losses;
    } else {
      auto opt = make_full_optimizer(m, rule, 0.5);  // with clipping
      losses = train(m, data, opt, constant_schedule{}, o, sft_loss{}).losses;
    }
    return std::make_pair(losses, values_of(m.parameters()));
  };
  for (bool blocks : {false, true}) {
    CAPTURE(blocks);
    const auto one = run(4, 1, blocks);
    for (index_t accum : {2, 4}) {
      CAPTURE(accum);
      const auto acc = run(4 / accum, accum, blocks);
      REQUIRE(acc.first.size() == one.first.size());
      for (std::size_t s = 0; s < one.first.size(); ++s)
        CHECK(std::abs(acc.first[s] - one.first[s]) <= 1e-12 * std::abs(one.first[s]));
      CHECK(optim_testing::max_diff(acc.second, one.second) <= 1e-12);
    }
    // Negative control: the steps see other rows with another batch, the weights differ.
    CHECK(optim_testing::max_diff(run(2, 1, blocks).second, one.second) > 1e-6);
  }
  CHECK_THROWS_WITH_AS(
      [&] {
        ref be;
        llama_model<ref> m(be, cfg);
        auto opt = make_full_optimizer(m, adam_update_rule{});
        train_options o;
        o.grad_accum = 0;
        train(m, data, opt, constant_schedule{}, o, sft_loss{});
      }(),
      doctest::Contains("grad_accum is 0"), error);
}

TEST_CASE("row_order: in order, or a seeded permutation of whole units per epoch") {
  row_order in_order(6, {});
  for (std::int64_t k = 0; k < 14; ++k) CHECK(in_order(k) == k % 6);

  const row_order_options shuffled{true, 11, 2};
  row_order a(6, shuffled), b(6, shuffled);
  std::vector<index_t> first_epoch;
  for (std::int64_t e = 0; e < 3; ++e) {
    std::vector<index_t> epoch;
    for (std::int64_t k = 6 * e; k < 6 * e + 6; ++k) {
      const index_t r = a(k);
      CHECK(r == b(k));  // the same seed, the same order
      epoch.push_back(r);
    }
    for (std::size_t k = 0; k < 6; k += 2) {  // a unit stays together and in order
      CHECK(epoch[k] % 2 == 0);
      CHECK(epoch[k + 1] == epoch[k] + 1);
    }
    std::vector<index_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == std::vector<index_t>{0, 1, 2, 3, 4, 5});  // every row once
    if (e == 0) first_epoch = epoch;
  }
  // a later epoch asked for out of order gives the same rows (the order is a function of k)
  row_order c(6, shuffled);
  CHECK(c(13) == a(13));
  CHECK(c(0) == first_epoch[0]);
  // the permutations of 8 units over 20 epochs are not all the same
  std::set<std::vector<index_t>> seen;
  for (std::int64_t e = 0; e < 20; ++e) seen.insert(epoch_permutation(8, 11, e));
  CHECK(seen.size() > 10);
  CHECK_THROWS_WITH(row_order(5, shuffled), doctest::Contains("5 rows are not whole units of 2"));
}

TEST_CASE("train: the rows of a shuffled run are the shuffled order's, a unit never split") {
  const auto cfg = optim_testing::config(2);
  const index_t n = 6, t = 5;
  std::vector<token_id> ids(static_cast<std::size_t>(n * t));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<token_id>((i * 7 + i / 5) % static_cast<std::size_t>(cfg.vocab_size));
  const token_dataset data(n, t, ids);
  ref be;
  llama_model<ref> m(be, cfg);
  m.init_random(3, 0.1);
  sgd_update_rule rule;
  rule.lr = 0;  // every step's loss is its rows' loss under the initial model
  auto opt = make_full_optimizer(m, rule);
  train_options o;
  o.steps = 6;
  o.batch = 2;
  o.order = {true, 5, 2};
  std::vector<std::vector<index_t>> rows_seen;
  auto factory = [&](const dataset_batch& b) {
    rows_seen.push_back(b.rows);
    return sft_loss{};
  };
  const auto s = train(m, data, opt, constant_schedule{}, o, factory);
  row_order expected(n, o.order);
  REQUIRE(rows_seen.size() == 6);
  for (std::size_t step = 0; step < rows_seen.size(); ++step) {
    const auto k = static_cast<std::int64_t>(2 * step);
    CHECK(rows_seen[step] == std::vector<index_t>{expected(k), expected(k + 1)});
    CHECK(rows_seen[step][1] == rows_seen[step][0] + 1);
    // the loss is that of the batch of those rows
    const auto b = make_batch(data, k, 2, expected);
    sft_loss loss;
    CHECK(s.losses[step] ==
          doctest::Approx(compute_gradients(m, b.view(), loss, stream_opts()).loss).epsilon(1e-12));
  }
  o.batch = 3;
  CHECK_THROWS_WITH(train(m, data, opt, constant_schedule{}, o, sft_loss{}),
                    doctest::Contains("batch is 3 rows, not whole units of 2"));
}
