// Offload of the layer inputs to a host memory tier, tested on the CPU through
// two_tier_backend (deferred copies, two counted tiers): exact gradients, measured peaks equal
// to the planner's dry run in both tiers, the bytes moved, and the errors.
#include <doctest/doctest.h>

#include <cmath>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/backend/offload.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/stream/planner.hpp"

using namespace tightfit;
using tightfit::testing::random_batch;
using tightfit::testing::tiny_config;

static_assert(OffloadBackend<two_tier_backend<reference_backend<double>>>);
static_assert(OffloadBackend<two_tier_backend<meta_backend<float>>>);
static_assert(Backend<two_tier_backend<reference_backend<double>>>);
static_assert(!OffloadBackend<reference_backend<double>>);

TEST_CASE("two_tier_backend: copies land at wait_copies, host bytes counted apart") {
  two_tier_backend<reference_backend<double>> be;
  auto dev = be.allocate<double>(4);
  auto host = be.allocate_host<double>(4);
  CHECK(be.memory().live() == 4 * sizeof(double));
  CHECK(be.host_memory().live() == 4 * sizeof(double));
  for (index_t i = 0; i < 4; ++i) dev.span()[static_cast<std::size_t>(i)] = double(i + 1);
  be.copy_to_host(std::span<const double>(dev.span()), host.span());
  CHECK(be.pending_copies() == 1);
  CHECK(host.span()[3] == 0.0);  // not yet: a reader that skips the wait sees stale data
  be.wait_copies();
  CHECK(host.span()[3] == 4.0);
  CHECK(be.transfers().bytes_to_host == 4 * sizeof(double));
  auto small = be.allocate_host<double>(3);
  CHECK_THROWS_WITH_AS(be.copy_to_device(std::span<const double>(small.span()), dev.span()),
                       doctest::Contains("copy_to_device: src has 3 elements, dst 4"), error);
}

TEST_CASE("offloaded layer inputs: exact gradients, peaks == prediction in both tiers") {
  const auto cfg = tiny_config(4, 2, true, false, 5);
  const random_batch batch(2, 13, cfg.vocab_size, {13, 9}, 23);
  const auto input_bytes =
      static_cast<std::size_t>(batch.batch * batch.seq_len * cfg.hidden_size) * sizeof(double);
  using plain = reference_backend<double>;
  using tiered = two_tier_backend<reference_backend<double>>;
  for (bool embedding_grad : {true, false}) {
    backward_options base;
    base.embedding_grad = embedding_grad;
    if (!embedding_grad) base.layer_weight_grads = {false, true, true, true, true};  // lowest 1
    const index_t layers = embedding_grad ? 5 : 4;  // backpropagated layers
    for (auto s : {backward_schedule::checkpoint, backward_schedule::stream}) {
      for (index_t chunk : {index_t{4}, index_t{5}}) {  // neither divides T = 13
        for (index_t k = 1; k <= 5; ++k) {
          CAPTURE(to_string(s));
          CAPTURE(chunk);
          CAPTURE(k);
          CAPTURE(embedding_grad);
          backward_options o = base;
          o.sched = s;
          o.chunk = chunk;
          o.keep_every = k;
          plain pbe;
          llama_model<plain> pmodel(pbe, cfg);
          pmodel.init_random(4, 0.3, 0.2);
          sft_loss ploss;
          const backward_result want = compute_gradients(pmodel, batch.view(), ploss, o);
          const auto want_grads = tightfit::testing::grads_of(pmodel.parameters());

          o.offload_layer_inputs = true;
          tiered tbe;
          llama_model<tiered> tmodel(tbe, cfg);
          tmodel.init_random(4, 0.3, 0.2);
          sft_loss tloss;
          const backward_result got = compute_gradients(tmodel, batch.view(), tloss, o);
          const auto grads = tightfit::testing::grads_of(tmodel.parameters());
          CHECK(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss));
          for (std::size_t i = 0; i < grads.size(); ++i)
            CHECK(tightfit::testing::max_rel_diff(grads[i], want_grads[i], 1e-300) <= 1e-12);
          CHECK(got.recomputed_layers == want.recomputed_layers);

          // The kept inputs but the top one went to the host tier and came back once each.
          const auto kept = static_cast<std::size_t>((layers + k - 1) / k);
          CHECK(got.peak_host_bytes == (kept - 1) * input_bytes);
          CHECK(tbe.transfers().bytes_to_host == (kept - 1) * input_bytes);
          CHECK(tbe.transfers().bytes_to_device == (kept - 1) * input_bytes);
          CHECK(got.offload_bytes == 2 * (kept - 1) * input_bytes);
          CHECK(tbe.pending_copies() == 0);
          CHECK(tbe.host_memory().live() == 0);
          if (kept > 3) CHECK(got.peak_activation_bytes < want.peak_activation_bytes);

          const auto predicted =
              predict_peaks<double>(cfg, batch.batch, batch.seq_len, o, sft_loss{});
          CHECK(predicted.activation_bytes == got.peak_activation_bytes);
          CHECK(predicted.host_bytes == got.peak_host_bytes);
        }
      }
    }
  }
}

TEST_CASE("offload: clear errors for a backend without a host tier and for the full schedule") {
  const auto cfg = tiny_config(4, 2, true, false, 2);
  const random_batch batch(1, 7, cfg.vocab_size, {}, 5);
  backward_options o;
  o.offload_layer_inputs = true;
  reference_backend<double> be;
  llama_model<reference_backend<double>> model(be, cfg);
  sft_loss loss;
  CHECK_THROWS_WITH_AS(compute_gradients(model, batch.view(), loss, o),
                       doctest::Contains("offload_layer_inputs needs a backend with a host memory "
                                         "tier"),
                       error);
  two_tier_backend<reference_backend<double>> tbe;
  llama_model<two_tier_backend<reference_backend<double>>> tmodel(tbe, cfg);
  o.sched = backward_schedule::full;
  CHECK_THROWS_WITH_AS(compute_gradients(tmodel, batch.view(), loss, o),
                       doctest::Contains("offload_layer_inputs needs the checkpoint or stream"),
                       error);
}

TEST_CASE("the planner prices offload: a longer T in the same device budget, host bytes beside") {
  auto cfg = tiny_config(4, 2, true, false, 6);
  cfg.vocab_size = 64;
  const std::size_t budget = std::size_t{1} << 20;
  const auto plan = plan_memory<float>(cfg, 1, 256, budget, sft_loss{}, 16, 1 << 15);
  CHECK(plan.max_seq_stream_offload > plan.max_seq_stream);
  CHECK(plan.max_seq_checkpoint_offload > plan.max_seq_checkpoint);
  // The reported T fits the device budget, one more does not; the host bytes are its dry run's.
  backward_options o;
  o.chunk = 16;
  o.offload_layer_inputs = true;
  const auto at = predict_peaks<float>(cfg, 1, plan.max_seq_stream_offload, o, sft_loss{});
  CHECK(at.activation_bytes <= budget);
  CHECK(at.host_bytes == plan.stream_offload_host_bytes);
  CHECK(at.host_bytes > 0);
  CHECK(predict_peaks<float>(cfg, 1, plan.max_seq_stream_offload + 1, o, sft_loss{})
            .activation_bytes > budget);
}
