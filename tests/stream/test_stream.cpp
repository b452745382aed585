// StreamBP exactness: stream == full == checkpoint gradients in double, finite differences,
// float against double, frozen layers, bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/nn/decoder_layer.hpp"

using namespace tightfit;
using tightfit::testing::grads_of;
using tightfit::testing::random_batch;
using tightfit::testing::tiny_config;

namespace {

using ref = reference_backend<double>;

struct run_output {
  double loss = 0;
  std::vector<std::vector<double>> grads;
  backward_result result;
};

run_output run(const model_config& cfg, const random_batch& batch, const backward_options& opt,
               std::uint64_t seed = 7) {
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(seed, 0.3, 0.2);
  sft_loss loss;
  run_output out;
  out.result = compute_gradients(model, batch.view(), loss, opt);
  out.loss = out.result.loss;
  out.grads = grads_of(model.parameters());
  return out;
}

double max_grad_rel_diff(const run_output& a, const run_output& b) {
  REQUIRE(a.grads.size() == b.grads.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    REQUIRE(a.grads[i].size() == b.grads[i].size());
    worst = std::max(worst, tightfit::testing::max_rel_diff(a.grads[i], b.grads[i], 1e-12));
  }
  return worst;
}

backward_options with(backward_schedule s, index_t chunk) {
  backward_options o;
  o.sched = s;
  o.chunk = chunk;
  return o;
}

}  // namespace

TEST_CASE("stream, checkpoint and full give the same loss and gradients (double)") {
  struct variant {
    index_t heads, kv_heads;
    bool qk_norm, tied;
    index_t batch, seq_len;
    std::vector<index_t> lengths;
    index_t chunk;
    bool qkv_bias, o_bias;
  };
  const std::vector<variant> variants = {
      {2, 2, false, false, 1, 11, {}, 4, false, false},       // MHA, T not a multiple of chunk
      {4, 2, true, false, 2, 9, {9, 5}, 2, false, false},     // GQA 2, q/k-norm, padding
      {4, 1, true, true, 3, 7, {7, 3, 6}, 3, false, false},   // GQA 4, tied, three lengths
      {2, 1, false, true, 2, 6, {4, 6}, 1, false, false},     // chunk = 1
      {4, 4, true, false, 1, 5, {}, 8, false, false},         // chunk >= T: one chunk
      {4, 2, false, false, 2, 13, {13, 1}, 5, false, false},  // a sequence of length 1
      {4, 2, false, true, 2, 9, {9, 6}, 4, true, false},      // Qwen2: q/k/v biases
      {4, 1, true, false, 2, 7, {5, 7}, 3, true, true},       // q/k/v/o biases before q/k-norm
  };
  for (const auto& v : variants) {
    CAPTURE(v.heads);
    CAPTURE(v.kv_heads);
    CAPTURE(v.qk_norm);
    CAPTURE(v.tied);
    CAPTURE(v.batch);
    CAPTURE(v.chunk);
    CAPTURE(v.qkv_bias);
    CAPTURE(v.o_bias);
    auto cfg = tiny_config(v.heads, v.kv_heads, v.qk_norm, v.tied);
    cfg.qkv_bias = v.qkv_bias;
    cfg.o_bias = v.o_bias;
    const random_batch batch(v.batch, v.seq_len, cfg.vocab_size, v.lengths, 11 + v.chunk);
    const auto full = run(cfg, batch, with(backward_schedule::full, v.chunk));
    const auto ckpt = run(cfg, batch, with(backward_schedule::checkpoint, v.chunk));
    const auto stream = run(cfg, batch, with(backward_schedule::stream, v.chunk));
    CHECK(std::isfinite(full.loss));
    CHECK(full.loss > 0);
    CHECK(std::abs(stream.loss - full.loss) <= 1e-12 * std::abs(full.loss));
    CHECK(std::abs(ckpt.loss - full.loss) <= 1e-12 * std::abs(full.loss));
    CHECK(max_grad_rel_diff(stream, full) < 1e-10);
    CHECK(max_grad_rel_diff(ckpt, full) < 1e-10);
    // the streaming head alone and the materialised head under stream agree too
    auto o = with(backward_schedule::stream, v.chunk);
    o.head = head_mode::materialized;
    CHECK(max_grad_rel_diff(run(cfg, batch, o), full) < 1e-10);
    o = with(backward_schedule::checkpoint, v.chunk);
    o.head = head_mode::streaming;
    o.head_chunk_rows = 3;
    CHECK(max_grad_rel_diff(run(cfg, batch, o), full) < 1e-10);
    // every parameter got a non-zero gradient (the comparison is not vacuous)
    for (const auto& g : full.grads) {
      REQUIRE_FALSE(g.empty());
      double norm = 0;
      for (double x : g) norm += x * x;
      CHECK(norm > 0);
    }
  }
}

TEST_CASE("finite differences of the loss match the stream gradients") {
  for (const bool biases : {false, true}) {  // q/k/v/o biases (before the q/k-norm)
    CAPTURE(biases);
    auto cfg = tiny_config(4, 2, true, false);
    cfg.qkv_bias = cfg.o_bias = biases;
    const random_batch batch(2, 6, cfg.vocab_size, {6, 4}, 5, 0.1);
    ref be;
    llama_model<ref> model(be, cfg);
    model.init_random(3, 0.3, 0.2);
    sft_loss loss;
    compute_gradients(model, batch.view(), loss, with(backward_schedule::stream, 4));
    auto& params = model.parameters();
    backward_options loss_only = with(backward_schedule::stream, 4);
    loss_only.embedding_grad = false;
    loss_only.head_grad = false;
    loss_only.layer_weight_grads.assign(static_cast<std::size_t>(cfg.num_hidden_layers), false);
    auto loss_at = [&] {
      sft_loss l;
      return compute_gradients(model, batch.view(), l, loss_only).loss;
    };
    const double h = 1e-5;
    int checked = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto value = params.value(i);
      auto grad = params.grad(i);
      for (std::size_t k : {std::size_t{0}, value.size() / 2, value.size() - 1}) {
        const double saved = value[k];
        value[k] = saved + h;
        const double up = loss_at();
        value[k] = saved - h;
        const double down = loss_at();
        value[k] = saved;
        const double fd = (up - down) / (2 * h);
        CAPTURE(params.name(i));
        CAPTURE(k);
        CHECK(std::abs(fd - grad[k]) <= 1e-6 * std::max(1.0, std::abs(fd)));
        ++checked;
      }
    }
    CHECK(checked == 3 * static_cast<int>(params.size()));
  }
}

TEST_CASE("float stream matches double full within 1e-4") {
  const auto cfg = tiny_config(4, 2, true, false);
  const random_batch batch(2, 12, cfg.vocab_size, {12, 8}, 9);
  const auto full = run(cfg, batch, with(backward_schedule::full, 4));
  reference_backend<float> fbe;
  llama_model<reference_backend<float>> model(fbe, cfg);
  model.init_random(7, 0.3, 0.2);  // the same seed: the same values, rounded to float
  sft_loss loss;
  const auto r = compute_gradients(model, batch.view(), loss, with(backward_schedule::stream, 5));
  CHECK(std::abs(r.loss - full.loss) <= 1e-4 * std::abs(full.loss));
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto g = params.grad(i);
    std::vector<double> gd(g.begin(), g.end());
    CAPTURE(params.name(i));
    CHECK(tightfit::testing::max_rel_diff(gd, full.grads[i]) < 1e-4);
  }
}

TEST_CASE("frozen layers get no gradient and run no weight-gradient GEMM") {
  const auto cfg = tiny_config(4, 2, true, false, 3);
  const random_batch batch(1, 10, cfg.vocab_size, {}, 4);
  const index_t chunk = 3, chunks = 4;
  auto gemms = [&](std::vector<bool> trainable, bool embedding, run_output* out) {
    ref be;
    llama_model<ref> model(be, cfg);
    model.init_random(7, 0.3, 0.2);
    sft_loss loss;
    auto o = with(backward_schedule::stream, chunk);
    o.layer_weight_grads = trainable;
    o.embedding_grad = embedding;
    std::vector<index_t> ready;
    o.on_grads_ready = [&](const grads_ready& g) {
      if (g.what == grads_ready::kind::layer) ready.push_back(g.layer);
    };
    out->result = compute_gradients(model, batch.view(), loss, o);
    out->grads = grads_of(model.parameters());
    for (index_t l = 0; l < cfg.num_hidden_layers; ++l) {
      const bool wanted = trainable[static_cast<std::size_t>(l)];
      for (auto id : model.layer_param_ids(l)) CHECK(model.parameters().has_grad(id) == wanted);
    }
    // the callback fired once per trainable layer, top to bottom
    std::vector<index_t> expected;
    for (index_t l = cfg.num_hidden_layers - 1; l >= 0; --l)
      if (trainable[static_cast<std::size_t>(l)]) expected.push_back(l);
    CHECK(ready == expected);
    return be.stats().gemm_calls;
  };
  run_output all, middle, top;
  const auto all_calls = gemms({true, true, true}, true, &all);
  const auto middle_calls = gemms({false, true, false}, false, &middle);
  const auto top_calls = gemms({false, false, true}, false, &top);
  // backprop stopped below layer 1: layer 0 does no backward at all
  CHECK(middle.result.lowest_layer == 1);
  CHECK(top.result.lowest_layer == 2);
  // per chunk a layer's backward runs 7 weight-gradient GEMMs, its recompute 6 (q, k, v is
  // done once per layer for all rows: 2 GEMMs per kv block), and 3 dX GEMMs + 4 others
  const std::int64_t weight_gemms_per_layer = 7 * chunks;
  CHECK(all_calls > middle_calls);
  // layer 2 frozen but backpropagated: exactly its weight-gradient GEMMs are missing, plus
  // everything of layer 0 and the lowest layer's dX GEMMs (3 per chunk).
  const std::int64_t layer_backward = all_calls - top_calls;  // two layers' backward, see below
  CHECK(layer_backward > 0);
  {
    // compare "all trainable" with "layer 2 frozen, layers 0 and 1 trainable": the difference
    // is exactly layer 2's weight-gradient GEMMs
    run_output partial;
    const auto partial_calls = gemms({true, true, false}, true, &partial);
    CHECK(all_calls - partial_calls == weight_gemms_per_layer);
    // the trainable layers' gradients are unchanged by freezing another layer
    for (std::size_t i = 0; i < all.grads.size(); ++i)
      if (!partial.grads[i].empty())
        CHECK(tightfit::testing::max_rel_diff(partial.grads[i], all.grads[i], 1e-12) < 1e-12);
  }
  // middle-only gradients equal the full run's restricted to layer 1
  for (std::size_t i = 0; i < all.grads.size(); ++i)
    if (!middle.grads[i].empty())
      CHECK(tightfit::testing::max_rel_diff(middle.grads[i], all.grads[i], 1e-12) < 1e-12);
}

TEST_CASE("bad input gets a clear error") {
  const auto cfg = tiny_config(2, 1, false, false);
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(1);
  sft_loss loss;
  auto message = [&](const token_batch& b, const backward_options& o) -> std::string {
    try {
      compute_gradients(model, b, loss, o);
    } catch (const error& e) {
      return e.what();
    }
    return "no error";
  };
  random_batch good(1, 4, cfg.vocab_size, {}, 1);
  auto o = with(backward_schedule::stream, 2);
  auto bad_id = good;
  bad_id.ids[2] = cfg.vocab_size;
  CHECK(message(bad_id.view(), o).find("input_ids[0][2] is 37") != std::string::npos);
  auto neg_id = good;
  neg_id.ids[1] = -1;
  CHECK(message(neg_id.view(), o).find("is -1") != std::string::npos);
  auto bad_label = good;
  bad_label.targets[3] = -5;
  CHECK(message(bad_label.view(), o).find("targets[0][3] is -5") != std::string::npos);
  auto empty = good;
  empty.seq_len = 0;
  empty.ids.clear();
  empty.targets.clear();
  CHECK(message(empty.view(), o).find("sequence length T is 0") != std::string::npos);
  auto zero_chunk = with(backward_schedule::stream, 0);
  CHECK(message(good.view(), zero_chunk).find("chunk is 0") != std::string::npos);
  auto short_ids = good;
  short_ids.ids.pop_back();
  CHECK(message(short_ids.view(), o).find("input_ids.size is 3, expected 4") != std::string::npos);
  random_batch padded(2, 4, cfg.vocab_size, {4, 5}, 1);
  CHECK(message(padded.view(), o).find("lengths[1] is 5") != std::string::npos);
  auto bad_mask = with(backward_schedule::stream, 2);
  bad_mask.layer_weight_grads = {true};
  CHECK(message(good.view(), bad_mask).find("expected 2") != std::string::npos);
  CHECK_THROWS_WITH_AS(parse_backward_schedule("fast"),
                       doctest::Contains("unknown schedule 'fast'"), error);
}

TEST_CASE("lazy layer gradients: one layer's gradients at a time, same values") {
  const auto cfg = tiny_config(4, 2, true, false, 3);
  const random_batch batch(2, 9, cfg.vocab_size, {9, 6}, 8);
  const auto eager = run(cfg, batch, with(backward_schedule::stream, 4));
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(7, 0.3, 0.2);
  sft_loss loss;
  auto o = with(backward_schedule::stream, 4);
  o.lazy_layer_grads = true;
  auto& params = model.parameters();
  std::vector<std::vector<double>> captured(params.size());
  std::size_t most_layers_with_grads = 0;
  o.on_grads_ready = [&](const grads_ready& g) {
    if (g.what != grads_ready::kind::layer) return;
    std::size_t layers_with_grads = 0;
    for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
      if (params.has_grad(model.layer_param_ids(l).front())) ++layers_with_grads;
    most_layers_with_grads = std::max(most_layers_with_grads, layers_with_grads);
    for (auto id : model.layer_param_ids(g.layer)) {
      captured[id].assign(params.grad(id).begin(), params.grad(id).end());
      params.release_grad(id);
    }
  };
  compute_gradients(model, batch.view(), loss, o);
  CHECK(most_layers_with_grads == 1);
  for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (auto id : model.layer_param_ids(l)) {
      CHECK_FALSE(params.has_grad(id));
      CHECK(tightfit::testing::max_rel_diff(captured[id], eager.grads[id], 1e-12) < 1e-12);
    }
}

namespace {

run_output run_batch(const model_config& cfg, const token_batch& batch, const backward_options& opt,
                     std::uint64_t seed = 7) {
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(seed, 0.3, 0.2);
  sft_loss loss;
  run_output out;
  out.result = compute_gradients(model, batch, loss, opt);
  out.loss = out.result.loss;
  out.grads = grads_of(model.parameters());
  return out;
}

}  // namespace

TEST_CASE("sliding windows, rope scaling, mlp_bias and packing: every schedule equals full") {
  struct variant {
    const char* what;
    index_t window;
    std::vector<bool> sliding;
    std::string rope_type;
    bool mlp_bias;
    std::vector<index_t> positions;  // one row, packed; empty: 2 rows of 13 unpacked
  };
  const std::vector<variant> variants = {
      {"window 4", 4, {}, "default", false, {}},
      {"window 5 on layer 1 only, llama3 rope", 5, {false, true}, "llama3", false, {}},
      {"yarn, mlp_bias", 0, {}, "yarn", true, {}},
      {"dynamic ntk past max_position_embeddings", 3, {}, "dynamic", false, {}},
      {"linear, packed documents 5 + 1 + 7",
       0,
       {},
       "linear",
       true,
       {0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5, 6}},
      {"window 3 and packed documents",
       3,
       {},
       "default",
       false,
       {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4}},
  };
  for (const auto& v : variants) {
    CAPTURE(v.what);
    auto cfg = tiny_config(4, 2, true, false);
    cfg.sliding_window = v.window;
    cfg.sliding_layers = v.sliding;
    cfg.mlp_bias = v.mlp_bias;
    cfg.max_position_embeddings = 8;  // T = 13 is past it: dynamic and yarn scale
    cfg.rope_scaling.rope_type = v.rope_type;
    cfg.rope_scaling.factor = 2.5;
    cfg.rope_scaling.original_max_position_embeddings = v.rope_type == "llama3" ? 6 : 0;
    cfg.rope_scaling.low_freq_factor = 1;
    cfg.rope_scaling.high_freq_factor = 3;
    const bool packed = !v.positions.empty();
    const random_batch rb(packed ? 1 : 2, 13, cfg.vocab_size,
                          packed ? std::vector<index_t>{} : std::vector<index_t>{13, 10}, 29);
    token_batch batch = rb.view();
    batch.position_ids = v.positions;
    const auto full = run_batch(cfg, batch, with(backward_schedule::full, 13));
    CHECK(std::isfinite(full.loss));
    for (index_t chunk : {index_t{1}, index_t{2}, index_t{5}}) {  // smaller than the window
      CAPTURE(chunk);
      const auto ckpt = run_batch(cfg, batch, with(backward_schedule::checkpoint, chunk));
      const auto stream = run_batch(cfg, batch, with(backward_schedule::stream, chunk));
      CHECK(std::abs(stream.loss - full.loss) <= 1e-12 * std::abs(full.loss));
      CHECK(std::abs(ckpt.loss - full.loss) <= 1e-12 * std::abs(full.loss));
      CHECK(max_grad_rel_diff(stream, full) < 1e-10);
      CHECK(max_grad_rel_diff(ckpt, full) < 1e-10);
    }
    // the variant changes the result: not a vacuous comparison
    auto plain = tiny_config(4, 2, true, false);
    plain.mlp_bias = v.mlp_bias;
    token_batch unpacked = batch;
    unpacked.position_ids = {};
    CHECK(std::abs(run_batch(plain, unpacked, with(backward_schedule::full, 13)).loss - full.loss) >
          1e-9);
  }
}

TEST_CASE("packed documents == the same documents unpacked, under every schedule (1e-12)") {
  // documents of 5, 3 and 6 tokens: one packed row of 14, or three right-padded rows of 6
  const std::vector<index_t> lengths{5, 3, 6};
  auto cfg = tiny_config(4, 2, true, true, 3);
  cfg.sliding_window = 4;  // documents and a window together
  cfg.sliding_layers = {true, false, true};
  const random_batch docs(3, 6, cfg.vocab_size, {}, 41, 0.1);
  std::vector<token_id> ids_u, tgt_u, ids_p, tgt_p;
  std::vector<index_t> pos_p;
  for (index_t b = 0; b < 3; ++b) {
    const index_t len = lengths[static_cast<std::size_t>(b)];
    for (index_t t = 0; t < 6; ++t) {
      const auto i = static_cast<std::size_t>(b * 6 + t);
      // the last token of a document predicts nothing here (so both layouts agree on it)
      const token_id y = t == len - 1 ? ignore_index : docs.targets[i];
      ids_u.push_back(docs.ids[i]);
      tgt_u.push_back(y);
      if (t < len) {
        ids_p.push_back(docs.ids[i]);
        tgt_p.push_back(y);
        pos_p.push_back(t);
      }
    }
  }
  // one more variant: the packed row's documents keep targets across boundaries; those must be
  // dropped by compute_gradients (they predict another document's first token)
  std::vector<token_id> tgt_leaky = tgt_p;
  for (std::size_t i = 0; i + 1 < tgt_leaky.size(); ++i)
    if (pos_p[i + 1] == 0) tgt_leaky[i] = ids_p[i + 1];
  const token_batch unpacked{3, 6, ids_u, tgt_u, lengths};
  const token_batch packed{1, 14, ids_p, tgt_p, {}, pos_p};
  const token_batch leaky{1, 14, ids_p, tgt_leaky, {}, pos_p};
  for (auto sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    for (index_t chunk : {index_t{2}, index_t{4}, index_t{14}}) {
      CAPTURE(to_string(sched));
      CAPTURE(chunk);
      const auto u = run_batch(cfg, unpacked, with(sched, chunk));
      const auto p = run_batch(cfg, packed, with(sched, chunk));
      const auto l = run_batch(cfg, leaky, with(sched, chunk));
      CHECK(std::abs(p.loss - u.loss) <= 1e-12 * std::abs(u.loss));
      CHECK(max_grad_rel_diff(p, u) < 1e-12);
      CHECK(std::abs(l.loss - u.loss) <= 1e-12 * std::abs(u.loss));
      CHECK(max_grad_rel_diff(l, u) < 1e-12);
    }
  }
}

TEST_CASE("position_ids are validated, errors name the row, position and value") {
  auto cfg = tiny_config(2, 1, false, false);
  const random_batch rb(2, 4, cfg.vocab_size, {}, 3);
  auto message = [&](std::vector<index_t> pos) -> std::string {
    token_batch b = rb.view();
    b.position_ids = pos;
    try {
      run_batch(cfg, b, with(backward_schedule::stream, 2));
    } catch (const error& e) {
      return e.what();
    }
    return "<no error>";
  };
  CHECK(message({0, 1, 0, 1, 0, 1, 2, 3}) == "<no error>");
  CHECK(message({0, 1, 2}).find("position_ids.size") != std::string::npos);
  CHECK(message({0, 1, 2, 3, 1, 2, 3, 4}).find("position_ids[1][0] is 1, expected 0") !=
        std::string::npos);
  CHECK(message({0, 1, 3, 4, 0, 1, 2, 3}).find("position_ids[0][2] is 3, expected 2") !=
        std::string::npos);
}
