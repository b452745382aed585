// Resume equality on the CPU backend (eigen_backend<float>): BAdam, BREAD-SGD and BREAD-LoRA
// continue bit for bit after save_checkpoint / load_checkpoint, provided the backend is
// deterministic: the attention backward runs two_pass (the default thread_partials sums per-thread
// dQ partials in scheduling order). Small attention tiles and a zero GEMM threshold make every
// parallel path of the backend run on this tiny model (several key tiles per sequence, GEMMs
// split over threads). Negative controls: a checkpoint whose generator state or moments are
// altered, or a restore of the weights alone, must end with other weights, so the comparison
// can fail.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "optim_testing.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/optim/checkpoint.hpp"

using namespace tightfit;
using tightfit::testing::random_batch;

namespace {

using fb = eigen_backend<float>;
namespace fs = std::filesystem;

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() /
         ("tightfit_resume_eigen_" + std::to_string(::getpid()) + "_" + name);
}

/// Every parallel path of the backend on a tiny model; deterministic attention backward.
eigen_backend_options deterministic_options() {
  eigen_backend_options o;
  o.attention_backward = attention_backward_strategy::two_pass;
  o.attention_tile_q = 8;
  o.attention_tile_k = 8;
  o.gemm_parallel_min_flops = 0;
  o.gemm_min_block = 4;
  return o;
}

model_config resume_config() {
  auto c = tightfit::testing::tiny_config(4, 2, true, false, 4);
  c.hidden_size = 24;
  c.intermediate_size = 40;
  return c;
}

backward_options stream_opts() {
  backward_options o;
  o.chunk = 16;  // three chunks of a 40-token row, streaming head
  return o;
}

/// The weights as raw bytes, parameter after parameter.
std::string weight_bytes(parameter_set<fb>& p) {
  std::string out;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto v = p.value(i);
    out.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
  }
  return out;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Copies the checkpoint `from` to `to`, zeroing the F32 tensors whose name `zero` accepts and
/// replacing metadata entries by `meta` (key, value) pairs.
void tamper(const fs::path& from, const fs::path& to,
            const std::function<bool(const std::string&)>& zero,
            const std::vector<std::pair<std::string, std::string>>& meta) {
  const auto f = safetensors_file::open(from);
  safetensors_writer w;
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  for (const auto& [k, v] : meta) w.set_metadata(k, v);
  int zeroed = 0;
  for (const auto& name : f.names()) {
    const tensor_info& t = f.info(name);
    if (t.type == dtype::f32) {
      auto v = f.read<float>(name);
      if (zero(name)) {
        std::fill(v.begin(), v.end(), 0.0f);
        ++zeroed;
      }
      w.add(name, t.shape, std::span<const float>(v));
    } else {
      const auto v = f.read_ints(name);
      w.add(name, t.shape, std::span<const std::int64_t>(v));
    }
  }
  if (meta.empty()) REQUIRE(zeroed > 0);  // the mutation must touch something
  w.write(to);
}

/// The generator state saved in `path`, advanced by one draw (a restore that is one draw off).
std::string rng_one_draw_later(const fs::path& path) {
  const auto f = safetensors_file::open(path);
  std::istringstream in(f.metadata().at("optim.rng"));
  std::mt19937_64 g;
  in >> g;
  g.discard(1);
  std::ostringstream out;
  out << g;
  return out.str();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

block_options opts(index_t k) {
  block_options o;
  o.switch_every = k;
  o.seed = 11;
  return o;
}

/// Runs `first` steps, saves, runs `second` more (run A). A fresh model and optimizer restore the
/// save and run `second` steps (run B): weights and saved states must be bit-identical. Then each
/// mutation of the save (see tamper) restored the same way must give other weights.
/// Named mutations of a saved checkpoint: (from, to) writes the altered copy.
using mutation_list =
    std::vector<std::pair<std::string, std::function<void(const fs::path&, const fs::path&)>>>;

template <class Make>
void check_resume(Make make, int first, int second, const mutation_list& mutations) {
  const auto cfg = resume_config();
  std::vector<random_batch> batches;
  for (int s = 0; s < first + second; ++s)
    batches.emplace_back(2, 40, cfg.vocab_size, std::vector<index_t>{40, 33}, 500 + s);
  const auto saved = temp_file("saved.safetensors");
  sft_loss loss;

  fb be_a(deterministic_options());
  llama_model<fb> a(be_a, cfg);
  a.init_random(7, 0.3, 0.2);
  auto opt_a = make(a);
  for (int s = 0; s < first; ++s) opt_a.step(batches[s].view(), loss, stream_opts());
  optim_testing::save_state_file(saved, a, opt_a);
  for (int s = first; s < first + second; ++s) opt_a.step(batches[s].view(), loss, stream_opts());
  const std::string expected = weight_bytes(a.parameters());

  // Restores `path` (optimizer state too unless weights_only) into a fresh run and continues.
  auto resumed = [&](const fs::path& path, bool weights_only) {
    fb be(deterministic_options());
    llama_model<fb> m(be, cfg);
    m.init_random(99, 0.3, 0.2);  // other weights: the restore must replace them
    auto opt = make(m);
    if (weights_only)
      load_hf_weights(path, m.parameters(), hf_load_options{true});
    else
      optim_testing::load_state_file(path, m, opt);
    for (int s = first; s < first + second; ++s) opt.step(batches[s].view(), loss, stream_opts());
    std::string state;
    if (!weights_only) {
      const auto out = temp_file("b.safetensors");
      optim_testing::save_state_file(out, m, opt);
      state = file_bytes(out);
      fs::remove(out);
    }
    return std::make_pair(weight_bytes(m.parameters()), state);
  };

  const auto [got, state_b] = resumed(saved, false);
  REQUIRE(got.size() == expected.size());
  CHECK(std::memcmp(got.data(), expected.data(), got.size()) == 0);
  const auto state_path = temp_file("a.safetensors");
  optim_testing::save_state_file(state_path, a, opt_a);
  CHECK(file_bytes(state_path) == state_b);  // moments, counters, generator, adapters too
  fs::remove(state_path);

  // The comparison can fail: a restore of the weights alone, and each mutation, differ.
  CHECK(resumed(saved, true).first != expected);
  const auto bad = temp_file("tampered.safetensors");
  for (const auto& [what, mutate] : mutations) {
    CAPTURE(what);
    mutate(saved, bad);
    const auto [w, st] = resumed(bad, false);
    CHECK(w != expected);
  }
  fs::remove(bad);
  fs::remove(saved);
}

/// The generic mutations: generator one draw off, Adam moments of the active block zeroed.
mutation_list mutations() {
  mutation_list extra;
  extra.emplace_back("generator one draw off", [](const fs::path& from, const fs::path& to) {
    tamper(from, to, [](const std::string&) { return false; },
           {{"optim.rng", rng_one_draw_later(from)}});
  });
  extra.emplace_back("active block's moments zeroed", [](const fs::path& from, const fs::path& to) {
    tamper(from, to, [](const std::string& n) { return n.rfind("optim.state.", 0) == 0; }, {});
  });
  return extra;
}

}  // namespace

// 4 layers, K = 2: a pass is 8 steps; saving after 5 steps and running 6 more crosses a pass
// boundary, so the resumed run draws a fresh permutation from the restored generator.
TEST_CASE("eigen float resume: BAdam (random order) continues bit for bit") {
  using opt_t = block_optimizer<llama_model<fb>>;
  check_resume(
      [](llama_model<fb>& m) {
        adam_update_rule r;
        r.lr = 0.01;
        return opt_t(m, block_partition::by_layer(m.parameters()), r, {}, {}, opts(2));
      },
      5, 6, mutations());
}

TEST_CASE("eigen float resume: BREAD-SGD (all inactive layers, random order) bit for bit") {
  using opt_t = block_optimizer<llama_model<fb>, adam_update_rule, random_reshuffle, sgd_expansion>;
  check_resume(
      [](llama_model<fb>& m) {
        adam_update_rule r;
        r.lr = 0.01;
        sgd_expansion e;
        e.lr = 0.01;
        e.scope = expansion_scope::all;
        return opt_t(m, block_partition::by_layer(m.parameters()), r, {}, e, opts(2));
      },
      5, 6, mutations());
}

// 6 blocks (embedding and head too): a pass is 12 steps, crossed between steps 9 and 15.
TEST_CASE("eigen float resume: BREAD-LoRA (adapters and their Adam state) bit for bit") {
  using opt_t =
      block_optimizer<llama_model<fb>, adamw_update_rule, random_reshuffle, lora_expansion>;
  auto extra = mutations();
  extra.emplace_back("adapter moments zeroed", [](const fs::path& from, const fs::path& to) {
    tamper(from, to,
           [](const std::string& n) {
             return n.rfind("optim.lora.", 0) == 0 && (ends_with(n, ".mU") || ends_with(n, ".vU") ||
                                                       ends_with(n, ".mV") || ends_with(n, ".vV"));
           },
           {});
  });
  check_resume(
      [](llama_model<fb>& m) {
        adamw_update_rule r;
        r.lr = 0.01;
        lora_expansion e;
        e.rank = 2;
        e.lr = 0.01;
        e.loraplus_ratio = 4;
        e.scope = expansion_scope::all;
        return opt_t(m, block_partition::by_layer(m.parameters(), true, true), r, {}, e, opts(2));
      },
      9, 6, extra);
}
