// Sequence-parallel StreamBP under mpirun (part of test_dist, run as dist_np2 and dist_np3):
// every rank holds the whole batch and computes its shard of the positions; in double the loss
// and every gradient equal one process's compute_gradients on the whole batch to 1e-12
// relative, for SFT, GRPO (token and sequence level), DPO and IPO, with T not divisible by the
// rank count and right-padded rows, contiguous and zig-zag assignments, stream and checkpoint.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dist_testing.hpp"
#include "dp_testing.hpp"
#include "tightfit/distributed/sequence_parallel.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/nn/lora.hpp"
#include "tightfit/nn/sequence_shard.hpp"
#include "tightfit/optim/lora_optimizer.hpp"

using namespace tightfit;
using namespace tightfit::testing;

namespace {

static_assert(
    SequenceParallelLayer<decoder_layer<reference_backend<double>>, reference_backend<double>>);
// The ring comes from the layer skeleton (nn/ring_attention.hpp): Gemma has it too.
static_assert(
    SequenceParallelLayer<gemma_layer<reference_backend<double>>, reference_backend<double>>);

/// The objective of `name` over piece `p` (the whole batch): make_objective's, and "gspo"
/// (GRPO with the sequence-level ratio: a two-pass objective).
test_objective seqpar_objective(const std::string& name, const piece& p) {
  if (name == "gspo") {
    grpo_options o = grpo_opts({"grpo", 0});
    o.level = importance_sampling_level::sequence;
    return {grpo_loss(p.advantages, p.old_lp, p.ref_lp, o)};
  }
  return make_objective({name, 0}, p);
}

backward_options seqpar_opts(backward_schedule s, index_t chunk) {
  backward_options o;
  o.sched = s;
  o.chunk = chunk;
  return o;
}

struct one_process {
  double loss = 0;
  std::vector<std::vector<double>> grads;
  double attention_flops = 0;
};

one_process run_one(const model_config& cfg, const piece& p, const std::string& name,
                    const backward_options& opt) {
  reference_backend<double> be;
  llama_model<reference_backend<double>> model(be, cfg);
  seed_weights(model);
  test_objective objective = seqpar_objective(name, p);
  one_process out;
  out.loss = compute_gradients(model, p.rows.view(), objective, opt).loss;
  out.grads = model_grads(model);
  out.attention_flops = be.stats().attention_flops;
  return out;
}

}  // namespace

TEST_CASE("sequence shards partition the positions; bad counts are named") {
  for (int n : {1, 2, 3, 4})
    for (auto a : {sequence_assignment::contiguous, sequence_assignment::zigzag})
      for (index_t t : {8, 13, 29}) {
        std::vector<int> owner(static_cast<std::size_t>(t), -1);
        for (int r = 0; r < n; ++r) {
          const sequence_shard s = make_sequence_shard(t, n, r, a);
          for (index_t i = 0; i < s.local_len(); ++i) {
            const index_t p = s.global_of(i);
            CHECK(owner[static_cast<std::size_t>(p)] == -1);
            owner[static_cast<std::size_t>(p)] = r;
            CHECK(s.local_of(p) == i);
          }
        }
        CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
      }
  CHECK_THROWS_WITH(make_sequence_shard(5, 3, 0, sequence_assignment::zigzag),
                    doctest::Contains("T is 5 positions, too few for 3 ranks"));
  CHECK_THROWS_WITH(parse_sequence_assignment("striped"),
                    doctest::Contains("unknown sequence assignment 'striped'"));
}

TEST_CASE("sequence parallel: every rank gets one process's gradient of the whole batch (1e-12)") {
  auto& comm = world();
  const int n = comm.size();
  for (bool tied : {false, true}) {
    model_config cfg = tiny_config(4, 2, !tied, tied, 3);
    cfg.qkv_bias = tied;
    // B = 4 rows, T = 13 (not divisible by 2 or 3), lengths 13, 11, 12, 13 (right padding)
    const piece p(4, 13, cfg.vocab_size, 31);
    for (const char* name : {"sft", "grpo", "bnpo", "dr_grpo", "gspo", "dpo", "ipo"}) {
      if (tied && std::string(name) != "sft" && std::string(name) != "dpo") continue;
      for (auto sched : {backward_schedule::checkpoint, backward_schedule::stream})
        for (auto assign : {sequence_assignment::contiguous, sequence_assignment::zigzag}) {
          CAPTURE(name);
          CAPTURE(tied);
          CAPTURE(static_cast<int>(sched));
          CAPTURE(static_cast<int>(assign));
          const auto opt = seqpar_opts(sched, 2);
          const one_process want = run_one(cfg, p, name, opt);
          reference_backend<double> be;
          llama_model<reference_backend<double>> model(be, cfg);
          seed_weights(model);
          test_objective objective = seqpar_objective(name, p);
          sequence_parallel_stats st;
          const backward_result got = sequence_parallel_gradients(model, p.rows.view(), objective,
                                                                  opt, comm, {assign}, &st);
          CHECK(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss));
          CHECK(max_grads_rel_diff(model_grads(model), want.grads) <= 1e-12);
          const index_t layers = cfg.num_hidden_layers;
          // ring shifts per layer: 2 (N - 1) forward, 2 (N - 1) + 2 (N - 1) + 2 N backward
          CHECK(st.kv_shifts == (n > 1 ? layers * (8 * n - 6) : 0));
          CHECK(st.gradient_groups == layers + 2);  // head, layers, embedding
          index_t with_grad = 0;                    // each parameter's gradient reduced once
          for (std::size_t i = 0; i < model.parameters().size(); ++i)
            with_grad += model.parameters().has_grad(i) ? 1 : 0;
          CHECK(st.gradient_messages == with_grad);
          // agreement, loss; the two-pass objectives' log-probs
          CHECK(st.other_messages == (objective.statistics_pass() ? 3 : 2));
          // The ranks' attention work adds up to one process's (the reference backend counts
          // every computed query-key pair).
          std::vector<double> flops(static_cast<std::size_t>(n));
          comm.all_gather(std::span<const double>(&st.attention_flops, 1),
                          std::span<double>(flops));
          CHECK(std::accumulate(flops.begin(), flops.end(), 0.0) ==
                doctest::Approx(want.attention_flops).epsilon(1e-12));
        }
    }
  }
}

TEST_CASE("sequence parallel ring: sliding windows, uneven blocks, chunks across blocks (1e-12)") {
  // The K/V ring under windows that end inside a block (layers 0 and 2 slide, window 3 and
  // 6), blocks of uneven sizes (T = 23 over 2 or 3 ranks: zig-zag blocks of 3, 4, 4 ... and
  // contiguous blocks of 7 and 8 positions), chunks of 3 that split blocks, right padding,
  // q/k-norm and GQA; SFT and DPO (a two-pass objective).
  auto& comm = world();
  for (index_t window : {index_t{3}, index_t{6}}) {
    model_config cfg = tiny_config(4, 2, true, false, 3);
    cfg.sliding_window = window;
    cfg.sliding_layers = {true, false, true};
    const piece p(4, 23, cfg.vocab_size, 57);
    for (const char* name : {"sft", "dpo"})
      for (auto assign : {sequence_assignment::contiguous, sequence_assignment::zigzag}) {
        CAPTURE(window);
        CAPTURE(name);
        CAPTURE(static_cast<int>(assign));
        const auto opt = seqpar_opts(backward_schedule::stream, 3);
        const one_process want = run_one(cfg, p, name, opt);
        reference_backend<double> be;
        llama_model<reference_backend<double>> model(be, cfg);
        seed_weights(model);
        test_objective objective = seqpar_objective(name, p);
        const backward_result got =
            sequence_parallel_gradients(model, p.rows.view(), objective, opt, comm, {assign});
        CHECK(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss));
        CHECK(max_grads_rel_diff(model_grads(model), want.grads) <= 1e-12);
      }
  }
}

TEST_CASE("sequence parallel Gemma 2 and Gemma 3: one process's gradients (1e-12)") {
  // The Gemma layer over the ring: (1 + w) norms, sqrt(d) embedding scaling, q/k-norm and a
  // local RoPE base (Gemma 3), attention and final logit soft-capping (Gemma 2), sliding
  // windows that end inside a block, T = 23 over the ranks, SFT and DPO.
  auto& comm = world();
  for (const bool gemma2 : {false, true}) {
    model_config cfg = tiny_config(4, 2, !gemma2, !gemma2, 3);
    cfg.architecture = gemma2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM";
    cfg.query_pre_attn_scalar = 10;
    cfg.sliding_window = 4;
    cfg.sliding_layers = {true, false, true};
    if (gemma2) {
      cfg.attn_logit_softcapping = 1.5;
      cfg.final_logit_softcapping = 2.0;
    } else {
      cfg.rope_local_base_freq = 100;
    }
    const piece p(4, 23, cfg.vocab_size, 57);
    for (const char* name : {"sft", "dpo"})
      for (auto assign : {sequence_assignment::contiguous, sequence_assignment::zigzag}) {
        CAPTURE(gemma2);
        CAPTURE(name);
        CAPTURE(static_cast<int>(assign));
        const auto opt = seqpar_opts(backward_schedule::stream, 3);
        using ref = reference_backend<double>;
        ref be_one, be;
        gemma_model<ref> one(be_one, cfg), model(be, cfg);
        one.init_random(7, 0.3, 0.2);
        model.init_random(7, 0.3, 0.2);
        test_objective want_objective = seqpar_objective(name, p);
        const double want = compute_gradients(one, p.rows.view(), want_objective, opt).loss;
        test_objective objective = seqpar_objective(name, p);
        const backward_result got =
            sequence_parallel_gradients(model, p.rows.view(), objective, opt, comm, {assign});
        CHECK(std::abs(got.loss - want) <= 1e-12 * std::abs(want));
        CHECK(max_grads_rel_diff(model_grads(model), model_grads(one)) <= 1e-12);
      }
  }
}

TEST_CASE("sequence parallel: zig-zag evens out the attention work of causal attention") {
  auto& comm = world();
  const int n = comm.size();
  const model_config cfg = tiny_config(2, 1, false, false, 1);
  const random_batch rows(1, 60, cfg.vocab_size, {}, 5);
  double imbalance[2] = {0, 0};
  for (auto assign : {sequence_assignment::contiguous, sequence_assignment::zigzag}) {
    reference_backend<double> be;
    llama_model<reference_backend<double>> model(be, cfg);
    seed_weights(model);
    sft_loss objective;
    sequence_parallel_stats st;
    sequence_parallel_gradients(model, rows.view(), objective,
                                seqpar_opts(backward_schedule::stream, 4), comm, {assign}, &st);
    std::vector<double> flops(static_cast<std::size_t>(n));
    comm.all_gather(std::span<const double>(&st.attention_flops, 1), std::span<double>(flops));
    const double mean = std::accumulate(flops.begin(), flops.end(), 0.0) / n;
    imbalance[static_cast<int>(assign)] = *std::max_element(flops.begin(), flops.end()) / mean;
  }
  MESSAGE("attention work, max rank / mean over ", n, " ranks at T = 60: contiguous ", imbalance[0],
          ", zigzag ", imbalance[1]);
  CHECK(imbalance[1] < imbalance[0]);
  CHECK(imbalance[1] < 1.05);
}

TEST_CASE(
    "sequence parallel: unsupported options and disagreeing ranks are refused on every rank") {
  auto& comm = world();
  const model_config cfg = tiny_config(4, 2, true, false, 2);
  reference_backend<double> be;
  llama_model<reference_backend<double>> model(be, cfg);
  seed_weights(model);
  const random_batch rows(1, 9, cfg.vocab_size, {}, 3);
  sft_loss objective;
  CHECK_THROWS_WITH(sequence_parallel_gradients(model, rows.view(), objective,
                                                seqpar_opts(backward_schedule::full, 2), comm),
                    doctest::Contains("the full schedule"));
  auto opt = seqpar_opts(backward_schedule::stream, 2);
  opt.keep_every = 2;
  CHECK_THROWS_WITH(sequence_parallel_gradients(model, rows.view(), objective, opt, comm),
                    doctest::Contains("keep_every is 2"));
  // Ranks that disagree (here on the assignment) fail at the first collective, on every rank.
  if (comm.size() >= 2) {
    const auto mixed =
        comm.rank() == 0 ? sequence_assignment::contiguous : sequence_assignment::zigzag;
    CHECK_THROWS_WITH(
        sequence_parallel_gradients(model, rows.view(), objective,
                                    seqpar_opts(backward_schedule::stream, 2), comm, {mixed}),
        doctest::Contains("ranks disagree on the model, batch shape and options"));
  }
  const random_batch short_rows(1, 3, cfg.vocab_size, {}, 3);
  if (comm.size() >= 2)
    CHECK_THROWS_WITH(sequence_parallel_gradients(model, short_rows.view(), objective,
                                                  seqpar_opts(backward_schedule::stream, 2), comm),
                      doctest::Contains("too few for"));
}

TEST_CASE("sequence parallel LoRA with dropout: the ranks' masks are one process's (1e-12)") {
  // Each rank drops the adapters' inputs of its own positions; the masks are a function of the
  // global position, so the ranks' adapter gradients (not reduced by the pass: summed here) and
  // the reduced embedding gradient are one process's on the whole batch.
  auto& comm = world();
  const model_config cfg = tiny_config(4, 2, true, false, 3);
  const piece p(4, 13, cfg.vocab_size, 31);
  lora_config lc;
  lc.rank = 3;
  lc.alpha = 5;
  lc.dropout = 0.1;
  lc.target_modules = {"all-linear"};
  lc.seed = 11;
  using model_t = llama_model<reference_backend<double>>;
  // loss, adapter gradients and the embedding's, in a training pass keyed 7
  auto run = [&](bool sharded, backward_schedule sched, sequence_assignment assign) {
    reference_backend<double> be;
    model_t model(be, cfg);
    seed_weights(model);
    lora_adapters<model_t> lora(model, lc);
    std::mt19937_64 gen(17);
    std::normal_distribution<double> dist(0.0, 0.3);
    for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
      for (projection pr : lora.targets())
        for (auto& x : lora.parameters().value(lora.b_id(l, pr))) x = dist(gen);
    lora_optimizer<model_t> lopt(lora);
    auto& ap = lora.parameters();
    for (std::size_t i = 0; i < ap.size(); ++i) {
      ap.allocate_grad(i);
      be.fill(as_row(ap.grad(i)), 0.0);
    }
    backward_options opt = lopt.lora_backward_options(seqpar_opts(sched, 2));
    opt.embedding_grad = true;
    sft_loss loss;
    double value = 0;
    {
      lora_training_pass<lora_adapters<model_t>> pass(lora, 7);
      value =
          sharded
              ? sequence_parallel_gradients(model, p.rows.view(), loss, opt, comm, {assign}).loss
              : compute_gradients(model, p.rows.view(), loss, opt).loss;
    }
    if (sharded)
      for (std::size_t i = 0; i < ap.size(); ++i) comm.all_reduce_sum(ap.grad(i)).wait();
    auto grads = grads_of(ap);
    auto g = model.parameters().grad(model.embed_id());
    grads.emplace_back(g.begin(), g.end());
    return std::pair{value, grads};
  };
  for (auto sched : {backward_schedule::checkpoint, backward_schedule::stream})
    for (auto assign : {sequence_assignment::contiguous, sequence_assignment::zigzag}) {
      CAPTURE(static_cast<int>(sched));
      CAPTURE(static_cast<int>(assign));
      const auto want = run(false, sched, assign);
      const auto got = run(true, sched, assign);
      CHECK(std::abs(got.first - want.first) <= 1e-12 * std::abs(want.first));
      CHECK(max_grads_rel_diff(got.second, want.second) <= 1e-12);
    }
}
