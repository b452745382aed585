// The Communicator concept, the one-rank communicator and gradient accumulation over
// micro-batches (step_gradients and sequence_step_gradients with self_communicator); no MPI
// needed.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "dp_testing.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/distributed/agreement.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/distributed/self_communicator.hpp"
#include "tightfit/distributed/sequence_parallel.hpp"
#include "tightfit/distributed/sequence_step.hpp"
#include "tightfit/nn/decoder_layer.hpp"

using namespace tightfit;

namespace {
/// A type with every member but barrier(): not a Communicator.
struct no_barrier {
  struct request {
    void wait() {}
    bool done() { return true; }
  };
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T>
  request all_reduce_sum(std::span<T>) {
    return {};
  }
  template <class T>
  void all_gather(std::span<const T>, std::span<T>) {}
  template <class T>
  void reduce_scatter_sum(std::span<const T>, std::span<T>) {}
  template <class T>
  void broadcast(std::span<T>, int) {}
  template <class T>
  void ring_shift(std::span<const T>, std::span<T>) {}
  comm_stats& stats() { return stats_; }
  comm_stats stats_;
};
}  // namespace

TEST_CASE("self_communicator is a Communicator; a type without barrier() is not") {
  static_assert(Communicator<self_communicator>);
  static_assert(!Communicator<no_barrier>);
  static_assert(CommRequest<self_communicator::request>);
}

TEST_CASE("self_communicator: identity collectives, counted, shapes checked") {
  self_communicator comm;
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  std::vector<double> x{1.5, -2.0};
  auto r = comm.all_reduce_sum(std::span<double>(x));
  r.wait();
  CHECK(x == std::vector<double>{1.5, -2.0});
  std::vector<float> in{3.f, 4.f}, out(2);
  comm.all_gather(std::span<const float>(in), std::span<float>(out));
  CHECK(out == in);
  std::vector<std::int64_t> big{7, 8}, small(2);
  comm.reduce_scatter_sum(std::span<const std::int64_t>(big), std::span<std::int64_t>(small));
  CHECK(small == big);
  std::vector<float> wrong(3);
  CHECK_THROWS_WITH_AS(comm.all_gather(std::span<const float>(in), std::span<float>(wrong)),
                       doctest::Contains("out has 3 values, expected 2"), error);
  CHECK_THROWS_WITH_AS(comm.broadcast(std::span<double>(x), 1), doctest::Contains("root is 1"),
                       error);
  std::vector<double> ring_out(2);
  comm.ring_shift(std::span<const double>(x), std::span<double>(ring_out));
  CHECK(ring_out == x);  // one rank: its own values come back
  std::vector<double> ring_bad(3);
  CHECK_THROWS_WITH_AS(comm.ring_shift(std::span<const double>(x), std::span<double>(ring_bad)),
                       doctest::Contains("ring_shift: out has 3 values, expected 2"), error);
  CHECK(comm.stats().ring_shift_calls == 1);
  comm.barrier();
  CHECK(comm.stats().all_reduce_calls == 1);
  CHECK(comm.stats().all_gather_calls == 1);
  CHECK(comm.stats().reduce_scatter_calls == 1);
  CHECK(comm.stats().barrier_calls == 1);
  CHECK(comm.stats().bytes == 0);
  CHECK_NOTHROW(check_agreement(comm, "model A", "model configuration"));
}

TEST_CASE("description_hash separates descriptions that differ in one character") {
  CHECK(description_hash("hidden 512") != description_hash("hidden 513"));
  CHECK(description_hash("") != description_hash(" "));
  CHECK(description_hash("abc") == description_hash(std::string("abc")));
}

// ---- gradient accumulation: micro-batches of one step == their union -------------------------

using namespace tightfit::testing;

namespace {
backward_options stream_opts(index_t chunk) {
  backward_options o;
  o.sched = backward_schedule::stream;
  o.chunk = chunk;
  return o;
}
}  // namespace

TEST_CASE("step_gradients: N micro-batches give the gradient of their union (double, 1e-12)") {
  const model_config cfg = tiny_config(4, 2, true, false);
  const piece a(2, 7, cfg.vocab_size, 11), b(4, 9, cfg.vocab_size, 12), c(2, 5, cfg.vocab_size, 13);
  const std::vector<const piece*> pieces{&a, &b, &c};
  const std::vector<token_batch> micro{a.rows.view(), b.rows.view(), c.rows.view()};
  for (const char* name : {"sft", "grpo", "bnpo", "dr_grpo", "dpo", "ipo"}) {
    const objective_spec spec{name, 9};
    for (auto sched : {backward_schedule::full, backward_schedule::stream}) {
      CAPTURE(name);
      backward_options opt = stream_opts(3);  // chunks of 3 do not divide T = 7, 9, 5
      opt.sched = sched;
      const union_result want = run_union(cfg, pieces, spec, opt);

      reference_backend<double> be;
      llama_model<reference_backend<double>> model(be, cfg);
      seed_weights(model);
      std::vector<test_objective> objectives;
      for (const piece* p : pieces) objectives.push_back(make_objective(spec, *p));
      self_communicator comm;
      data_parallel_stats st;
      const backward_result got = step_gradients(
          model, std::span<const token_batch>(micro),
          [&](std::size_t i) -> test_objective& { return objectives[i]; }, opt, comm, &st);
      CHECK(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss));
      CHECK(max_grads_rel_diff(model_grads(model), want.grads) <= 1e-12);
      CHECK(st.step_counts.tokens == want.counts.tokens);
      CHECK(st.step_counts.sequences == want.counts.sequences);
      CHECK(st.step_counts.pairs == want.counts.pairs);
      // One reduction per gradient group: the head, each layer, the embedding.
      CHECK(st.gradient_reductions == cfg.num_hidden_layers + 2);
    }
  }
}

TEST_CASE("negative control: micro-batches normalised each by itself miss the union's gradient") {
  const model_config cfg = tiny_config(4, 2, true, false);
  const piece a(2, 7, cfg.vocab_size, 11), b(4, 9, cfg.vocab_size, 12);
  const objective_spec spec{"sft"};
  const union_result want = run_union(cfg, {&a, &b}, spec, stream_opts(3));
  reference_backend<double> be;
  llama_model<reference_backend<double>> model(be, cfg);
  seed_weights(model);
  double loss = 0;
  for (const piece* p : {&a, &b}) {
    sft_loss per_piece;  // mean over this piece only: the normalisation bug
    loss += compute_gradients(model, p->rows.view(), per_piece, stream_opts(3)).loss / 2;
  }
  CHECK(max_grads_rel_diff(model_grads(model), want.grads) > 1e-3);
}

TEST_CASE("sequence parallel in one process (self_communicator): compute_gradients' gradients") {
  // One rank owns every position (zig-zag: two blocks); the driver's shard path (deferred K/V
  // projections, the objective adapter) must still give one process's gradients.
  const model_config cfg = tiny_config(4, 2, true, false, 2);
  const piece p(4, 9, cfg.vocab_size, 17);
  for (const char* name : {"sft", "grpo", "dpo"})
    for (auto assign : {sequence_assignment::contiguous, sequence_assignment::zigzag}) {
      CAPTURE(name);
      CAPTURE(static_cast<int>(assign));
      backward_options opt;
      opt.chunk = 2;
      reference_backend<double> be1, be2;
      llama_model<reference_backend<double>> one(be1, cfg), sp(be2, cfg);
      seed_weights(one);
      seed_weights(sp);
      test_objective o1 = make_objective({name, 0}, p), o2 = make_objective({name, 0}, p);
      const double want = compute_gradients(one, p.rows.view(), o1, opt).loss;
      self_communicator self;
      sequence_parallel_stats st;
      const double got =
          sequence_parallel_gradients(sp, p.rows.view(), o2, opt, self, {assign}, &st).loss;
      CHECK(std::abs(got - want) <= 1e-12 * std::abs(want));
      CHECK(max_grads_rel_diff(model_grads(sp), model_grads(one)) <= 1e-12);
      CHECK(st.local_positions == 9);
    }
}

TEST_CASE("sequence_step_gradients in one process: micro-batches give their union's gradient") {
  // Each micro-batch sequence parallel over one rank; the step's counts span both (no message):
  // the loss and gradients of the union batch, 1e-12 in double.
  const model_config cfg = tiny_config(4, 2, true, false, 2);
  const piece a(2, 9, cfg.vocab_size, 21), b(4, 9, cfg.vocab_size, 22);
  const std::vector<token_batch> micro{a.rows.view(), b.rows.view()};
  for (const char* name : {"sft", "grpo", "bnpo", "dpo"}) {
    CAPTURE(name);
    const objective_spec spec{name, 9};
    backward_options opt = stream_opts(2);
    const union_result want = run_union(cfg, {&a, &b}, spec, opt);
    reference_backend<double> be;
    llama_model<reference_backend<double>> model(be, cfg);
    seed_weights(model);
    std::vector<test_objective> objectives{make_objective(spec, a), make_objective(spec, b)};
    self_communicator self;
    const backward_result got = sequence_step_gradients(
        model, std::span<const token_batch>(micro),
        [&](std::size_t i) -> test_objective& { return objectives[i]; }, opt, self);
    CHECK(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss));
    CHECK(max_grads_rel_diff(model_grads(model), want.grads) <= 1e-12);
  }
}
