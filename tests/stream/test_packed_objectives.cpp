// Packed GRPO and DPO: every document of a packed row is one sequence of the objective (a
// completion with its advantage and sequence-level statistics; a chosen or rejected sequence),
// so a packed batch gives the loss and gradients of the same documents run as rows of their own
// (double, 1e-12), under every schedule and chunks that cross document boundaries.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/nn/decoder_layer.hpp"

using namespace tightfit;
using tightfit::testing::grads_of;
using tightfit::testing::random_batch;
using tightfit::testing::tiny_config;

namespace {

using ref = reference_backend<double>;

/// Four documents (5, 4, 6, 4 tokens) as four right-padded rows of 6, and packed as two rows of
/// 10 (5 + 4 and 1 token of padding; 6 + 4); per-token values (old / reference log-probs) and
/// targets in the same target alignment in both layouts.
struct two_layouts {
  std::vector<index_t> doc_len{5, 4, 6, 4};
  std::vector<token_id> ids_u, tgt_u, ids_p, tgt_p;
  std::vector<index_t> len_u, len_p{9, 10}, pos_p;
  std::vector<double> old_u, ref_u, old_p, ref_p;

  explicit two_layouts(index_t vocab) {
    const random_batch docs(4, 6, vocab, {}, 43, 0.0);  // every target counts
    const std::vector<std::vector<index_t>> rows{{0, 1}, {2, 3}};
    auto value = [](index_t d, index_t t, double scale) {  // a log-prob-like value
      return -1.5 + scale * std::sin(1.7 * static_cast<double>(d * 6 + t) + scale);
    };
    for (index_t d = 0; d < 4; ++d) {
      const index_t n = doc_len[static_cast<std::size_t>(d)];
      len_u.push_back(n);
      for (index_t t = 0; t < 6; ++t) {
        const auto i = static_cast<std::size_t>(d * 6 + t);
        ids_u.push_back(docs.ids[i]);
        // a one-token prompt; the last token of a document predicts nothing
        tgt_u.push_back(t == 0 || t >= n - 1 ? ignore_index : docs.targets[i]);
        old_u.push_back(value(d, t, 0.4));
        ref_u.push_back(value(d, t, 0.3));
      }
    }
    for (const auto& row : rows) {
      index_t used = 0;
      for (index_t d : row)
        for (index_t t = 0; t < doc_len[static_cast<std::size_t>(d)]; ++t, ++used) {
          const auto i = static_cast<std::size_t>(d * 6 + t);
          ids_p.push_back(ids_u[i]);
          tgt_p.push_back(tgt_u[i]);
          pos_p.push_back(t);
          old_p.push_back(old_u[i]);
          ref_p.push_back(ref_u[i]);
        }
      for (; used < 10; ++used) {  // padding: positions continue the last document
        ids_p.push_back(1);
        tgt_p.push_back(2);  // a label in the padding: never counted
        pos_p.push_back(pos_p.back() + 1);
        old_p.push_back(0);
        ref_p.push_back(0);
      }
    }
  }
  token_batch unpacked() const { return {4, 6, ids_u, tgt_u, len_u}; }
  token_batch packed() const { return {2, 10, ids_p, tgt_p, len_p, pos_p}; }
};

struct run_output {
  double loss = 0;
  std::vector<std::vector<double>> grads;
};

template <class O>
run_output run_objective(const model_config& cfg, const token_batch& batch, O& objective,
                         backward_schedule s, index_t chunk) {
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(5, 0.3, 0.2);
  backward_options o;
  o.sched = s;
  o.chunk = chunk;
  run_output out;
  out.loss = compute_gradients(model, batch, objective, o).loss;
  out.grads = grads_of(model.parameters());
  return out;
}

double max_grad_rel_diff(const run_output& a, const run_output& b) {
  REQUIRE(a.grads.size() == b.grads.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    worst = std::max(worst, tightfit::testing::max_rel_diff(a.grads[i], b.grads[i], 1e-12));
  return worst;
}

/// The objective on each layout: (layout, unpacked?) -> loss and gradients.
void check_packed_equals_unpacked(
    const two_layouts& l,
    const std::function<run_output(const token_batch&, bool, backward_schedule, index_t)>& run) {
  for (auto sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    for (index_t chunk : {index_t{3}, index_t{4}, index_t{10}}) {  // 3, 4 cross documents
      CAPTURE(to_string(sched));
      CAPTURE(chunk);
      const auto u = run(l.unpacked(), true, sched, chunk);
      const auto p = run(l.packed(), false, sched, chunk);
      CHECK(std::isfinite(u.loss));
      CHECK(std::abs(p.loss - u.loss) <= 1e-12 * std::abs(u.loss));
      CHECK(max_grad_rel_diff(p, u) < 1e-12);
    }
  }
}

}  // namespace

TEST_CASE("packed GRPO == the same completions unpacked, every schedule (1e-12)") {
  const auto cfg = tiny_config(4, 2, true, true, 2);
  const two_layouts l(cfg.vocab_size);
  const std::vector<double> adv{0.8, -1.2, 0.5, -0.4};  // one per document
  struct variant {
    const char* name;
    grpo_options opt;
  };
  std::vector<variant> variants;
  grpo_options o;
  o.beta = 0.05;
  o.epsilon_high = 0.28;
  variants.push_back({"grpo token", o});
  o.aggregation = grpo_aggregation::dapo;
  o.level = importance_sampling_level::sequence;
  variants.push_back({"dapo sequence (GSPO)", o});
  o.aggregation = grpo_aggregation::dr_grpo;
  o.level = importance_sampling_level::token;
  o.delta = 1.3;
  o.max_completion_length = 6;  // L_max given: the packed row's T is not the completions'
  variants.push_back({"dr_grpo delta", o});
  for (const auto& v : variants) {
    CAPTURE(v.name);
    check_packed_equals_unpacked(
        l, [&](const token_batch& b, bool unpacked, backward_schedule s, index_t chunk) {
          grpo_loss loss(adv, unpacked ? l.old_u : l.old_p, unpacked ? l.ref_u : l.ref_p, v.opt);
          return run_objective(cfg, b, loss, s, chunk);
        });
  }
}

TEST_CASE("packed DPO == the same pairs unpacked, every schedule (1e-12)") {
  const auto cfg = tiny_config(4, 2, true, true, 2);
  const two_layouts l(cfg.vocab_size);
  // pairs (document 0, document 2) and (1, 3): rows in one layout, documents in the other
  const std::vector<index_t> chosen{0, 1}, rejected{2, 3};
  const std::vector<double> ref_w{-9.0, -4.0}, ref_l{-11.0, -5.5};
  struct variant {
    const char* name;
    dpo_options opt;
  };
  std::vector<variant> variants;
  dpo_options o;
  o.label_smoothing = 0.1;
  o.rpo_alpha = 0.5;
  variants.push_back({"sigmoid + rpo", o});
  o.loss = dpo_loss_type::simpo;
  o.beta = 2.0;
  variants.push_back({"simpo", o});
  o.loss = dpo_loss_type::orpo;
  o.beta = 0.2;
  variants.push_back({"orpo", o});
  for (const auto& v : variants) {
    CAPTURE(v.name);
    check_packed_equals_unpacked(
        l, [&](const token_batch& b, bool, backward_schedule s, index_t chunk) {
          dpo_loss loss(chosen, rejected, ref_w, ref_l, v.opt);
          return run_objective(cfg, b, loss, s, chunk);
        });
  }
}

TEST_CASE("mask_truncated_completions masks each packed document without a stop token") {
  // row 0: documents [5 7 9] [4 9] [3 3] + 1 padding; row 1: [9 9 9 9 8] + 3 padding; stop 9
  const std::vector<token_id> ids{5, 7, 9, 4, 9, 3, 3, 0, 9, 9, 9, 9, 8, 1, 1, 1};
  const std::vector<index_t> pos{0, 1, 2, 0, 1, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<index_t> lengths{7, 5};
  std::vector<token_id> targets(16, 1);
  const std::vector<token_id> stop{9};
  const index_t masked = mask_truncated_completions(targets, ids, 2, 8, lengths, stop, pos);
  CHECK(masked == 2);  // [3 3] (and the padding after it), [9 9 9 9 8]
  for (std::size_t i = 0; i < targets.size(); ++i) {
    CAPTURE(i);
    CHECK(targets[i] == (i < 5 ? 1 : ignore_index));
  }
  // unpacked: row 0 ends with 3 (truncated), row 1 with 8
  std::vector<token_id> rows(16, 1);
  CHECK(mask_truncated_completions(rows, ids, 2, 8, lengths, stop) == 2);
}

// Also the regression test of default grpo_options passed on (see grpo_loss's constructor).
TEST_CASE("packed GRPO: advantages are one per document, named in the error") {
  const auto cfg = tiny_config(4, 2, true, true, 2);
  const two_layouts l(cfg.vocab_size);
  const std::vector<double> per_row{0.8, -1.2};
  grpo_options o;
  const std::vector<double> none;
  grpo_loss loss(per_row, none, none, o);
  try {
    run_objective(cfg, l.packed(), loss, backward_schedule::stream, 4);
    FAIL("no error");
  } catch (const error& e) {
    CHECK(std::string(e.what()).find("advantages.size") != std::string::npos);
  }
}
