// Tests run by every rank under mpirun (dist_np2, dist_np3): the MPI communicator's collectives
// against sums computed here from the rank numbers, error reporting, and the agreement check.
// With TIGHTFIT_DIST_FAILURE=throw|die|disagree it runs a failure scenario instead
// (expect_failure.sh): rank 1 misbehaves and the whole job must end, never hang.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dist_testing.hpp"
#include "dp_testing.hpp"
#include "tightfit/distributed/agreement.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/distributed/mpi_communicator.hpp"
#include "tightfit/distributed/sequence_step.hpp"
#include "tightfit/optim/zero1.hpp"
#if defined(TIGHTFIT_TEST_IO)
#include "tightfit/io/safetensors.hpp"
#endif
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/optim/block_optimizer.hpp"
#include "tightfit/optim/checkpoint.hpp"
#include "tightfit/optim/train.hpp"

using namespace tightfit;
using namespace tightfit::testing;

TEST_CASE("all_reduce_sum: every rank gets the sum, non-blocking, counted") {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  std::vector<double> x(1000), y(7);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (me + 1) * 0.5 + static_cast<double>(i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = me == 0 ? 1.0 : 0.0;
  const auto before = comm.stats();
  auto rx = comm.all_reduce_sum(std::span<double>(x));
  auto ry = comm.all_reduce_sum(std::span<double>(y));  // two in flight at once
  ry.wait();
  rx.wait();
  CHECK(rx.done());
  const double rank_part = 0.5 * n * (n + 1) / 2.0;
  for (std::size_t i = 0; i < x.size(); ++i)
    REQUIRE(x[i] == doctest::Approx(rank_part + n * static_cast<double>(i)).epsilon(1e-15));
  for (double v : y) CHECK(v == 1.0);
  CHECK(comm.stats().all_reduce_calls - before.all_reduce_calls == 2);
  CHECK(comm.stats().bytes - before.bytes ==
        static_cast<std::int64_t>((x.size() + y.size()) * sizeof(double)));

  std::vector<float> f(3, 1.f);
  comm.all_reduce_sum(std::span<float>(f)).wait();
  CHECK(f[2] == static_cast<float>(n));
  std::int64_t i = me;
  comm.all_reduce_sum(std::span<std::int64_t>(&i, 1)).wait();
  CHECK(i == std::int64_t{n} * (n - 1) / 2);
}

TEST_CASE("all_gather, reduce_scatter_sum, broadcast") {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  std::vector<std::int64_t> mine{me, 10 * me}, all(static_cast<std::size_t>(2 * n));
  comm.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  for (int r = 0; r < n; ++r) {
    CHECK(all[static_cast<std::size_t>(2 * r)] == r);
    CHECK(all[static_cast<std::size_t>(2 * r + 1)] == 10 * r);
  }
  // Every rank contributes value (rank + 1) * (k + 1) at position k of N*2 values: the block of
  // rank me sums to (sum of ranks + N) * (k + 1).
  std::vector<double> in(static_cast<std::size_t>(2 * n)), out(2);
  for (std::size_t k = 0; k < in.size(); ++k) in[k] = (me + 1) * static_cast<double>(k + 1);
  comm.reduce_scatter_sum(std::span<const double>(in), std::span<double>(out));
  const double ranks_sum = n * (n + 1) / 2.0;
  CHECK(out[0] == ranks_sum * static_cast<double>(2 * me + 1));
  CHECK(out[1] == ranks_sum * static_cast<double>(2 * me + 2));
  std::vector<float> b{static_cast<float>(me), 5.f};
  comm.broadcast(std::span<float>(b), n - 1);
  CHECK(b[0] == static_cast<float>(n - 1));
  CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(b), n), doctest::Contains("root is"), error);
  std::vector<double> wrong(3);
  CHECK_THROWS_WITH_AS(
      comm.reduce_scatter_sum(std::span<const double>(in), std::span<double>(wrong)),
      doctest::Contains("reduce_scatter_sum: in has"), error);
  // ring_shift: every rank receives rank (me - 1)'s values
  const std::vector<double> ring_in{static_cast<double>(me), 10.0 + me};
  std::vector<double> prev(2);
  comm.ring_shift(std::span<const double>(ring_in), std::span<double>(prev));
  const int from = (me + n - 1) % n;
  CHECK(prev[0] == static_cast<double>(from));
  CHECK(prev[1] == 10.0 + from);
  CHECK_THROWS_WITH_AS(comm.ring_shift(std::span<const double>(ring_in), std::span<double>(wrong)),
                       doctest::Contains("ring_shift: out has 3"), error);
  comm.barrier();
}

TEST_CASE("check_agreement: equal descriptions pass, one differing rank is named on every rank") {
  auto& comm = world();
  CHECK_NOTHROW(check_agreement(comm, "hidden 16, layers 2", "model configuration"));
  const std::string mine = comm.rank() == 1 ? "hidden 17, layers 2" : "hidden 16, layers 2";
  CHECK_THROWS_WITH_AS(check_agreement(comm, mine, "model configuration"),
                       doctest::Contains("rank(s) 1 differ from rank 0"), error);
}

namespace {

/// Rank r's micro-batches: rows, lengths and token counts differ from rank to rank.
std::vector<piece> pieces_of(int r, index_t vocab) {
  const auto u = static_cast<std::uint64_t>(r);
  std::vector<piece> out;
  out.emplace_back(2 + 2 * (r % 2), 6 + r, vocab, 100 + 10 * u);
  out.emplace_back(2, 5 + 2 * r, vocab, 101 + 10 * u);
  return out;
}

backward_options opts(backward_schedule s) {
  backward_options o;
  o.sched = s;
  o.chunk = 3;
  return o;
}

}  // namespace

TEST_CASE("data parallel: every rank gets one process's gradient of the union batch (1e-12)") {
  auto& comm = world();
  const int n = comm.size();
  for (bool tied : {false, true}) {
    const model_config cfg = tiny_config(4, 2, true, tied, 3);
    std::vector<std::vector<piece>> all;
    for (int r = 0; r < n; ++r) all.push_back(pieces_of(r, cfg.vocab_size));
    std::vector<const piece*> union_pieces;
    index_t longest = 0;
    for (auto& rank_pieces : all)
      for (auto& p : rank_pieces) {
        union_pieces.push_back(&p);
        longest = std::max(longest, p.rows.seq_len);
      }
    auto& mine = all[static_cast<std::size_t>(comm.rank())];
    const std::vector<token_batch> micro{mine[0].rows.view(), mine[1].rows.view()};
    for (const char* name : {"sft", "grpo", "bnpo", "dr_grpo", "dpo", "ipo"}) {
      if (tied && std::string(name) != "sft") continue;
      for (auto sched :
           {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
        CAPTURE(name);
        CAPTURE(tied);
        CAPTURE(static_cast<int>(sched));
        const objective_spec spec{name, longest};
        const union_result want = run_union(cfg, union_pieces, spec, opts(sched));
        reference_backend<double> be;
        llama_model<reference_backend<double>> model(be, cfg);
        seed_weights(model);
        std::vector<test_objective> objectives;
        for (auto& p : mine) objectives.push_back(make_objective(spec, p));
        data_parallel_stats st;
        const backward_result got = step_gradients(
            model, std::span<const token_batch>(micro),
            [&](std::size_t i) -> test_objective& { return objectives[i]; }, opts(sched), comm,
            &st);
        CHECK(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss));
        CHECK(max_grads_rel_diff(model_grads(model), want.grads) <= 1e-12);
        CHECK(st.step_counts.tokens == want.counts.tokens);
        CHECK(st.gradient_reductions == cfg.num_hidden_layers + 2);  // head, layers, embedding
        CHECK(st.other_messages == 3);                               // agreement, counts, loss
      }
    }
  }
}

TEST_CASE("data parallel with a block optimizer's mask: only the active layer crosses the wire") {
  auto& comm = world();
  const model_config cfg = tiny_config(4, 2, true, false, 3);
  const auto mine = pieces_of(comm.rank(), cfg.vocab_size);
  backward_options opt = opts(backward_schedule::stream);
  opt.layer_weight_grads = {false, true, false};
  opt.head_grad = false;
  opt.embedding_grad = false;
  reference_backend<double> be;
  llama_model<reference_backend<double>> model(be, cfg);
  seed_weights(model);
  sft_loss loss;
  data_parallel_stats st;
  data_parallel_gradients(model, mine[0].rows.view(), loss, opt, comm, &st);
  CHECK(st.gradient_reductions == 1);
  std::int64_t layer_bytes = 0;
  for (auto id : model.layer_param_ids(1))
    layer_bytes += static_cast<std::int64_t>(model.parameters().numel(id) * sizeof(double));
  CHECK(st.gradient_bytes == layer_bytes);
}

TEST_CASE("ZeRO-1 AdamW: 5 steps over the ranks equal one process on the union batch (1e-12)") {
  auto& comm = world();
  const int n = comm.size();
  const model_config cfg = tiny_config(4, 2, true, false, 2);
  std::vector<std::vector<piece>> all;
  std::vector<const piece*> union_pieces;
  for (int r = 0; r < n; ++r) all.push_back(pieces_of(r, cfg.vocab_size));
  for (auto& rank_pieces : all)
    for (auto& p : rank_pieces) union_pieces.push_back(&p);
  auto& mine = all[static_cast<std::size_t>(comm.rank())];
  const std::vector<token_batch> micro{mine[0].rows.view(), mine[1].rows.view()};
  const objective_spec spec{"sft"};
  adamw_update_rule rule;
  rule.lr = 3e-2;  // large steps, so that a wrong update shows

  // One process, the whole union batch, every parameter's state.
  using ref = reference_backend<double>;
  ref be1;
  llama_model<ref> one(be1, cfg);
  seed_weights(one);
  std::vector<std::size_t> ids(one.parameters().size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  rule_state<ref, adamw_update_rule> state(one.parameters(), ids, rule);
  const union_batch u(union_pieces);
  for (int step = 0; step < 5; ++step) {
    one.parameters().zero_grads();
    test_objective objective = make_objective(spec, u);
    compute_gradients(one, u.rows.view(), objective, opts(backward_schedule::stream));
    state.step(one.parameters(), rule, 1.0);
  }

  // The ranks: each its own micro-batches, the state sharded.
  ref be;
  llama_model<ref> model(be, cfg);
  seed_weights(model);
  for (std::size_t id : ids) model.parameters().allocate_grad(id);
  zero1_optimizer<ref, adamw_update_rule, mpi_communicator> zero(model.parameters(), ids, rule,
                                                                 comm);
  for (int step = 0; step < 5; ++step) {
    model.parameters().zero_grads();
    std::vector<test_objective> objectives;
    for (auto& p : mine) objectives.push_back(make_objective(spec, p));
    step_gradients(
        model, std::span<const token_batch>(micro),
        [&](std::size_t i) -> test_objective& { return objectives[i]; },
        opts(backward_schedule::stream), comm, nullptr, gradient_sync::none);
    zero.step();
  }
  double worst = 0;
  for (std::size_t id : ids) {
    const auto a = model.parameters().value(id), b = one.parameters().value(id);
    worst = std::max(worst, max_rel_diff(std::vector<double>(a.begin(), a.end()),
                                         std::vector<double>(b.begin(), b.end())));
  }
  CHECK(worst <= 1e-12);
  // The parameters moved (the comparison is not between two untouched models).
  const auto v = model.parameters().value(0);
  llama_model<ref> fresh(be, cfg);
  seed_weights(fresh);
  CHECK(max_rel_diff(std::vector<double>(v.begin(), v.end()),
                     std::vector<double>(fresh.parameters().value(0).begin(),
                                         fresh.parameters().value(0).end())) > 1e-3);
  // Each rank holds m and v of one shard: 1/N of one process's state (up to the padding).
  CHECK(zero.state_bytes() <= 2 * static_cast<std::size_t>(zero.shard_size()) * sizeof(double));
  CHECK(zero.shard_size() * n >= zero.total_size());
  CHECK(zero.shard_size() * n < zero.total_size() + n);
}

TEST_CASE("BAdam and BREAD-SGD data parallel: 5 steps equal one process on the union batch") {
  auto& comm = world();
  const int n = comm.size();
  const model_config cfg = tiny_config(4, 2, true, false, 3);
  // One batch per rank, the same T (so that each rank's mean and the union's are comparable
  // through the step counts, not by luck).
  std::vector<piece> all;
  std::vector<const piece*> union_pieces;
  for (int r = 0; r < n; ++r)
    all.emplace_back(1 + r % 2, 7, cfg.vocab_size, 300 + static_cast<std::uint64_t>(r));
  for (auto& p : all) union_pieces.push_back(&p);
  const union_batch u(union_pieces);
  const piece& mine = all[static_cast<std::size_t>(comm.rank())];
  adam_update_rule rule;
  rule.lr = 2e-2;
  block_options k2;
  k2.switch_every = 2;  // 5 steps cross two block switches
  k2.seed = 11;         // every rank draws the same block order
  using ref = reference_backend<double>;

  auto run = [&](auto expansion, bool distributed) {
    using E = decltype(expansion);
    ref be;
    llama_model<ref> model(be, cfg);
    seed_weights(model);
    block_optimizer<llama_model<ref>, adam_update_rule, random_reshuffle, E> opt(
        model, block_partition::by_layer(model.parameters()), rule, random_reshuffle{}, expansion,
        k2);
    data_parallel_stats st;
    for (int step = 0; step < 5; ++step) {
      sft_loss loss;
      if (distributed) {
        opt.step(mine.rows.view(), loss, opts(backward_schedule::stream),
                 data_parallel<mpi_communicator>(comm, &st));
        // Only the active block's layer (plus the expansion's layers) crossed the wire.
        if constexpr (!E::expands) CHECK(st.gradient_reductions == 1);
      } else {
        opt.step(u.rows.view(), loss, opts(backward_schedule::stream));
      }
    }
    std::vector<std::vector<double>> values;
    for (std::size_t i = 0; i < model.parameters().size(); ++i) {
      const auto v = model.parameters().value(i);
      values.emplace_back(v.begin(), v.end());
    }
    return values;
  };
  sgd_expansion bread;
  bread.lr = 0.05;
  for (bool with_bread : {false, true}) {
    CAPTURE(with_bread);
    const auto one = with_bread ? run(bread, false) : run(no_expansion{}, false);
    const auto dist = with_bread ? run(bread, true) : run(no_expansion{}, true);
    CHECK(max_grads_rel_diff(dist, one) <= 1e-12);
    // The blocks trained moved (the comparison is not between untouched weights).
    ref be;
    llama_model<ref> initial(be, cfg);
    seed_weights(initial);
    double moved = 0;
    for (std::size_t i = 0; i < one.size(); ++i) {
      const auto v = initial.parameters().value(i);
      moved = std::max(moved, max_rel_diff(one[i], std::vector<double>(v.begin(), v.end())));
    }
    CHECK(moved > 1e-3);
  }
}

namespace {
/// A data set of `rows` rows of T tokens whose rows supervise different numbers of tokens (a
/// mean per piece would differ from the step's).
token_dataset uneven_rows(index_t rows, index_t t, index_t vocab) {
  std::vector<token_id> ids, labels;
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < t; ++c) {
      ids.push_back(static_cast<token_id>((7 * c + 3 * r + 2) % vocab));
      labels.push_back(c < 1 + (r * 3) % 5 ? ignore_index : ids.back());
    }
  return token_dataset(rows, t, ids, labels);
}

std::vector<std::vector<double>> weights_of(llama_model<reference_backend<double>>& m) {
  std::vector<std::vector<double>> out;
  for (std::size_t i = 0; i < m.parameters().size(); ++i) {
    const auto v = m.parameters().value(i);
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

double max_losses_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1e-300, std::abs(b[i])));
  return worst;
}
}  // namespace

namespace {

/// Losses, weights and gradient norms of train() from the seeded weights of `cfg` as rank
/// comm.rank() (a self_communicator: one process) with `optimizer`: "adam" (replicated),
/// "adamw" (clipped at 0.5; over the ranks ZeRO-1), "badam" or "bread-sgd" (one layer per
/// block, 2 steps per block, lr 2e-2; BREAD's in-backward step 0.05).
struct trained {
  std::vector<double> losses, norms;
  std::vector<std::vector<double>> weights;
};
/// train() with `gradients` (data_parallel_training or sequence_parallel_training over a
/// communicator) and the optimizer named.
template <class P>
trained train_with(const P& gradients, const std::string& optimizer, const model_config& cfg,
                   const token_dataset& data, const train_options& options) {
  using ref = reference_backend<double>;
  using Comm = std::remove_pointer_t<decltype(gradients.comm)>;
  adamw_update_rule adamw;
  adamw.lr = 2e-2;
  adam_update_rule adam;
  adam.lr = 2e-2;
  block_options k2;
  k2.switch_every = 2;
  k2.seed = 5;
  sgd_expansion bread;
  bread.lr = 0.05;
  ref be;
  llama_model<ref> m(be, cfg);
  seed_weights(m);
  trained out;
  auto record = [&](std::int64_t, const step_result& r) { out.norms.push_back(r.grad_norm); };
  const constant_schedule sched;
  if (optimizer == "adam") {
    auto opt = make_full_optimizer(m, adam, 0.0);
    out.losses = train(gradients, m, data, opt, sched, options, sft_loss{}, record).losses;
  } else if (optimizer == "adamw") {
    if constexpr (std::is_same_v<Comm, mpi_communicator>) {
      zero1_full_optimizer<llama_model<ref>, adamw_update_rule, mpi_communicator> opt(
          m, adamw, *gradients.comm, 0.5);
      out.losses = train(gradients, m, data, opt, sched, options, sft_loss{}, record).losses;
    } else {
      auto opt = make_full_optimizer(m, adamw, 0.5);
      out.losses = train(gradients, m, data, opt, sched, options, sft_loss{}, record).losses;
    }
  } else if (optimizer == "badam") {
    block_optimizer<llama_model<ref>> opt(m, block_partition::by_layer(m.parameters()), adam, {},
                                          {}, k2);
    out.losses = train(gradients, m, data, opt, sched, options, sft_loss{}, record).losses;
  } else {
    block_optimizer<llama_model<ref>, adam_update_rule, random_reshuffle, sgd_expansion> opt(
        m, block_partition::by_layer(m.parameters()), adam, {}, bread, k2);
    out.losses = train(gradients, m, data, opt, sched, options, sft_loss{}, record).losses;
  }
  out.weights = weights_of(m);
  return out;
}

/// train_with over the ranks (`dist`) against one process (`one`): losses, weights and (adamw)
/// the clipped gradient norms equal to 1e-12; the clipping acted; the weights moved.
template <class P>
void expect_one_process_training(const std::string& optimizer, const model_config& cfg,
                                 const token_dataset& data, const P& over_ranks,
                                 const train_options& dist, const train_options& one) {
  self_communicator self;
  const trained a =
      train_with(data_parallel_training<self_communicator>{&self}, optimizer, cfg, data, one);
  const trained b = train_with(over_ranks, optimizer, cfg, data, dist);
  CHECK(max_losses_rel_diff(b.losses, a.losses) <= 1e-12);
  CHECK(max_grads_rel_diff(b.weights, a.weights) <= 1e-12);
  if (optimizer == "adamw") {
    REQUIRE(a.norms.size() == static_cast<std::size_t>(one.steps));
    CHECK(a.norms[0] > 0.5);  // the clipping acted
    CHECK(max_losses_rel_diff(b.norms, a.norms) <= 1e-12);
  }
  reference_backend<double> be;
  llama_model<reference_backend<double>> initial(be, cfg);
  seed_weights(initial);
  CHECK(max_grads_rel_diff(a.weights, weights_of(initial)) > 1e-3);  // trained
}

}  // namespace

TEST_CASE("train() over the ranks with grad_accum 2 equals one process on the union batch") {
  // ZeRO-1 AdamW with clipping, BAdam and BREAD-SGD, 2 micro-batches per rank (BREAD's
  // in-backward update uses the gradient of the whole step): losses and weights after 4 steps
  // equal train() in one process with a batch of all the step's rows.
  const index_t n = world().size();
  const model_config cfg = tiny_config(4, 2, true, false, 2);
  const token_dataset data = uneven_rows(13, 7, cfg.vocab_size);  // 13: steps wrap around
  for (const std::string& optimizer : std::vector<std::string>{"adamw", "badam", "bread-sgd"}) {
    CAPTURE(optimizer);
    const index_t accum = 2;
    train_options o;
    o.steps = 4;
    o.batch = 1;
    o.grad_accum = accum;
    o.backward = opts(backward_schedule::stream);
    train_options u = o;
    u.batch = n * accum;
    u.grad_accum = 1;
    expect_one_process_training(optimizer, cfg, data,
                                data_parallel_training<mpi_communicator>{&world()}, o, u);
  }
}

TEST_CASE("train() sequence parallel with grad_accum 2 equals one process on the union batch") {
  // Every rank trains on the step's rows, a shard of their positions: replicated Adam, ZeRO-1
  // AdamW with clipping and BAdam, 2 micro-batches of 2 rows of T = 11 (not divisible by 2 or
  // 3, uneven supervised lengths): losses and weights after 4 steps equal train() in one
  // process with a batch of the step's 4 rows, for both assignments.
  const model_config cfg = tiny_config(4, 2, true, false, 2);
  const token_dataset data = uneven_rows(9, 11, cfg.vocab_size);  // 9: steps wrap around
  for (const std::string& optimizer : std::vector<std::string>{"adam", "adamw", "badam"})
    for (const auto assignment : {sequence_assignment::zigzag, sequence_assignment::contiguous}) {
      CAPTURE(optimizer);
      CAPTURE(to_string(assignment));
      train_options o;
      o.steps = 4;
      o.batch = 2;
      o.grad_accum = 2;
      o.backward = opts(backward_schedule::stream);
      train_options u = o;
      u.batch = 4;
      u.grad_accum = 1;
      expect_one_process_training(
          optimizer, cfg, data,
          sequence_parallel_training<mpi_communicator>{&world(), {assignment}}, o, u);
    }
}

#if defined(TIGHTFIT_TEST_IO)
TEST_CASE("ZeRO-1 save / resume: 4 steps equal 2, save (one file per rank), resume, 2") {
  auto& comm = world();
  const model_config cfg = tiny_config(4, 2, true, false, 2);
  const token_dataset data = uneven_rows(9, 6, cfg.vocab_size);
  using ref = reference_backend<double>;
  using zero1_t = zero1_full_optimizer<llama_model<ref>, adam_update_rule, mpi_communicator>;
  adam_update_rule adam;
  adam.lr = 2e-2;
  train_options o;
  o.batch = 1;
  o.grad_accum = 2;
  o.backward = opts(backward_schedule::stream);
  const cosine_schedule sched{1, 4};  // the schedule continues across the resume
  ref be_a;
  llama_model<ref> a(be_a, cfg);
  seed_weights(a);
  zero1_t opt_a(a, adam, comm);
  o.steps = 4;
  const auto whole = train(comm, a, data, opt_a, sched, o, sft_loss{}).losses;

  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tightfit_zero1_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();  // one file per rank: each process has its own pid
  ref be_b;
  llama_model<ref> b(be_b, cfg);
  seed_weights(b);
  zero1_t opt_b(b, adam, comm);
  o.steps = 2;
  auto losses = train(comm, b, data, opt_b, sched, o, sft_loss{}).losses;
  {
    safetensors_writer w;
    save_checkpoint(w, b, opt_b);
    w.write(path);
  }
  ref be_c;
  llama_model<ref> c(be_c, cfg);
  c.init_random(99, 0.3, 0.2);  // other weights: the checkpoint restores them
  zero1_t opt_c(c, adam, comm);
  const auto file = safetensors_file::open(path);
  load_checkpoint(file, c, opt_c);
  CHECK(opt_c.steps() == 2);
  const auto more = train(comm, c, data, opt_c, sched, o, sft_loss{}).losses;
  losses.insert(losses.end(), more.begin(), more.end());
  CHECK(max_losses_rel_diff(losses, whole) <= 1e-12);
  CHECK(max_grads_rel_diff(weights_of(c), weights_of(a)) <= 1e-12);
  CHECK(file.metadata().at("dist.ranks") == std::to_string(comm.size()));

  // Another number of ranks, another rank's shard: errors naming both.
  self_communicator self;
  zero1_full_optimizer<llama_model<ref>, adam_update_rule, self_communicator> alone(c, adam, self);
  if (comm.size() != 1) {
    const std::string want =
        "saved by a run of " + std::to_string(comm.size()) + " ranks, this run has 1";
    CHECK_THROWS_WITH_AS(alone.load(file), doctest::Contains(want.c_str()), error);
  }
  zero1_full_optimizer<llama_model<ref>, adamw_update_rule, mpi_communicator> other_rule(c, {},
                                                                                         comm);
  CHECK_THROWS_WITH_AS(other_rule.load(file), doctest::Contains("saved update rule is 'adam'"),
                       error);
  std::filesystem::remove(path);
}
#endif

namespace {
/// The failure scenarios of expect_failure.sh. Rank 1 misbehaves; the others go on into a
/// collective, where they would wait for ever without the abort.
int run_failure(const std::string& mode) {
  auto& comm = world();
  try {
    if (mode == "throw" && comm.rank() == 1) fail("rank 1 failed on purpose");
    if (mode == "die" && comm.rank() == 1) std::_Exit(3);
    check_agreement(comm, mode == "disagree" && comm.rank() == 1 ? "other" : "same",
                    "model configuration");
    comm.barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
    comm.abort(1);
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  mpi_environment env(&argc, &argv);
  if (const char* mode = std::getenv("TIGHTFIT_DIST_FAILURE")) return run_failure(mode);
  doctest::Context context(argc, argv);
  const int failed = context.run();
  // A rank whose checks failed must fail the job even if the others passed.
  int any = failed != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
