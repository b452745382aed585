// tightfit/optim/expansion.hpp: landscape expansion of a block coordinate optimizer (BREAD: Luo,
// Shen, Peng, Li, Li, "Accelerating Block Coordinate Descent for LLM Finetuning via Landscape
// Expansion", NeurIPS 2025): cheap updates of the INACTIVE decoder layers inside the same
// backward pass that computes the active block's gradient.
//
// Which inactive layers (expansion_scope): partial = those deeper than the active block (closer
// to the output, whose activation gradients are computed anyway), all = every inactive layer
// (backprop then runs to the input). The embedding and the head are never expanded.
//
//  - no_expansion: plain BAdam.
//  - sgd_expansion (BREAD-SGD): when layer l's weight gradient is final (grads_ready), apply
//    W -= lr * g (or lr * sign(g)) at once and free g (LOMO style): the backward allocates the
//    layer's gradient lazily, so only one inactive layer's gradient exists at a time. Exact:
//    layer l's weights are not read again by the rest of the backward, so this equals computing
//    every gradient first and then applying the update.
//  - lora_expansion (BREAD-LoRA): every matrix W (out, in) of a decoder layer carries a low-rank
//    correction s U V (U (out, r) zero-initialised, V (r, in) Kaiming-uniform, bound
//    1/sqrt(in) as peft's lora_A). The model's W always holds the EFFECTIVE weight
//    W_eff = W0 + s U V, so the decoder layer is untouched: the gradient of W_eff (computed
//    for expanded layers, then freed) gives dU = s dW V^T and dV = s U^T dW exactly; after
//    Adam steps on U and V (LoRA+: lr(U) = ratio * lr(V)) the layer's weight becomes
//    W_eff += s (U'V' - U V). Adapter Adam state persists across block switches. Cost: the
//    weight-gradient GEMMs of the expanded layers run (the paper's extra time) plus two rank-r
//    GEMMs per matrix; memory: one layer's gradient plus U, V and their moments. Because W is
//    already W_eff, "merging" only restarts the adapters (U = 0, V fresh, moments cleared).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/nn/layer.hpp"

namespace tightfit {

/// Which inactive layers an expansion updates.
enum class expansion_scope { partial, all };

template <TrainableModel M>
class sgd_expansion_runner;
template <TrainableModel M>
class lora_expansion_runner;

/// No expansion (BAdam).
struct no_expansion {
  expansion_scope scope = expansion_scope::partial;
  static constexpr const char* name = "none";
  static constexpr bool expands = false;

  template <TrainableModel M>
  class runner {
   public:
    runner(const no_expansion& /*e*/, M& /*model*/) {}
    void apply_layer(index_t /*l*/, double /*lr_factor*/) {}
    std::size_t bytes() const { return 0; }
    template <class W>
    void save(W& /*w*/) const {}
    template <class R>
    void load(const R& /*r*/) {}
  };
};

/// BREAD-SGD: SGD (or signSGD) on the inactive layers inside the backward.
struct sgd_expansion {
  double lr = 1e-5;  ///< beta of the paper
  bool use_sign = false;
  expansion_scope scope = expansion_scope::partial;
  static constexpr const char* name = "sgd";
  static constexpr bool expands = true;

  template <TrainableModel M>
  using runner = sgd_expansion_runner<M>;
};

/// The per-run state of sgd_expansion.
template <TrainableModel M>
class sgd_expansion_runner {
 public:
  using T = typename M::backend_type::value_type;
  sgd_expansion_runner(const sgd_expansion& e, M& model) : e_(e), model_(&model) {
    check(e.lr >= 0, "sgd_expansion: lr is ", e.lr, ", expected >= 0");
  }
  /// W -= lr g (sign(g)) for every parameter of layer l, then frees its gradients.
  void apply_layer(index_t l, double lr_factor) {
    auto& params = model_->parameters();
    sgd_hyper<T> h;
    h.lr = static_cast<T>(e_.lr * lr_factor);
    h.use_sign = e_.use_sign;
    for (std::size_t id : model_->layer_param_ids(l)) {
      if (!params.has_grad(id)) continue;
      params.backend().sgd_update(params.value(id), std::span<const T>(params.grad(id)),
                                  std::span<T>{}, h);
      params.release_grad(id);
    }
  }
  std::size_t bytes() const { return 0; }
  template <class W>
  void save(W& /*w*/) const {}
  template <class R>
  void load(const R& /*r*/) {}

 private:
  sgd_expansion e_;
  M* model_;
};

/// BREAD-LoRA: low-rank corrections of the inactive layers' matrices, trained by Adam.
struct lora_expansion {
  index_t rank = 8;
  double lr = 1e-4;           ///< Adam learning rate of V (and of U times loraplus_ratio)
  double loraplus_ratio = 1;  ///< lr(U) / lr(V); LoRA+ uses 16
  double scale = 1;           ///< s in W0 + s U V
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::uint64_t seed = 0x10A;  ///< V's initialisation
  expansion_scope scope = expansion_scope::partial;
  static constexpr const char* name = "lora";
  static constexpr bool expands = true;

  template <TrainableModel M>
  using runner = lora_expansion_runner<M>;
};

/// The per-run state of lora_expansion.
template <TrainableModel M>
class lora_expansion_runner {
 public:
  using B = typename M::backend_type;
  using T = typename B::value_type;
  lora_expansion_runner(const lora_expansion& e, M& model) : e_(e), model_(&model), rng_(e.seed) {
    check(e.rank >= 1, "lora_expansion: rank is ", e.rank, ", expected >= 1");
    check(e.lr >= 0, "lora_expansion: lr is ", e.lr, ", expected >= 0");
    check(e.loraplus_ratio > 0, "lora_expansion: loraplus_ratio is ", e.loraplus_ratio,
          ", expected > 0");
    auto& params = model.parameters();
    const index_t nl = model.config().num_hidden_layers;
    layers_.resize(static_cast<std::size_t>(nl));
    for (index_t l = 0; l < nl; ++l)
      for (std::size_t id : model.layer_param_ids(l)) {
        const auto shape = params.shape(id);
        if (shape.size() != 2) continue;
        check(e.rank <= std::min(shape[0], shape[1]), "lora_expansion: rank is ", e.rank,
              ", larger than parameter '", params.name(id), "' allows (", shape[0], "x", shape[1],
              ")");
        adapter a;
        a.id = id;
        a.out = shape[0];
        a.in = shape[1];
        auto& be = params.backend();
        for (auto* buf : {&a.u, &a.mu, &a.vu}) *buf = be.template allocate<T>(a.out * e.rank);
        for (auto* buf : {&a.v, &a.mv, &a.vv}) *buf = be.template allocate<T>(e.rank * a.in);
        init_v(a);
        layers_[static_cast<std::size_t>(l)].adapters.push_back(std::move(a));
      }
  }

  /// Adam step on the adapters of layer l from the gradient of its effective weights, then
  /// W_eff += s (U'V' - UV); frees the layer's gradients.
  void apply_layer(index_t l, double lr_factor) {
    auto& params = model_->parameters();
    auto& be = params.backend();
    auto& layer = layers_[static_cast<std::size_t>(l)];
    const index_t r = e_.rank;
    const T s = static_cast<T>(e_.scale);
    ++layer.steps;
    adam_hyper<T> hu, hv;
    hv.lr = static_cast<T>(e_.lr * lr_factor);
    hu.lr = static_cast<T>(e_.lr * lr_factor * e_.loraplus_ratio);
    for (auto* h : {&hu, &hv}) {
      h->beta1 = static_cast<T>(e_.beta1);
      h->beta2 = static_cast<T>(e_.beta2);
      h->eps = static_cast<T>(e_.eps);
      h->step = layer.steps;
    }
    for (auto& a : layer.adapters) {
      if (!params.has_grad(a.id)) continue;
      auto w = as_matrix(params.value(a.id), a.out, a.in);  // (out, in)
      auto dw = as_matrix(std::span<const T>(params.grad(a.id)), a.out, a.in);
      auto du = be.template allocate<T>(a.out * r);  // (out, r)
      auto dv = be.template allocate<T>(r * a.in);   // (r, in)
      auto u = a.u.view(a.out, r);
      auto v = a.v.view(r, a.in);
      be.gemm(transpose::no, transpose::yes, s, dw, matrix_view<const T>(v), T(0),
              du.view(a.out, r));
      be.gemm(transpose::yes, transpose::no, s, matrix_view<const T>(u), dw, T(0),
              dv.view(r, a.in));
      params.release_grad(a.id);
      be.gemm(transpose::no, transpose::no, -s, matrix_view<const T>(u), matrix_view<const T>(v),
              T(1), w);  // W0 = W_eff - s U V
      be.adam_update(a.u.span(), std::span<const T>(du.span()), a.mu.span(), a.vu.span(), hu);
      be.adam_update(a.v.span(), std::span<const T>(dv.span()), a.mv.span(), a.vv.span(), hv);
      be.gemm(transpose::no, transpose::no, s, matrix_view<const T>(u), matrix_view<const T>(v),
              T(1), w);  // W_eff = W0 + s U' V'
    }
    for (std::size_t id : model_->layer_param_ids(l)) params.release_grad(id);
  }

  /// Restarts every adapter (W already holds the merged weights): U = 0, V fresh, moments 0.
  void merge() {
    auto& be = model_->parameters().backend();
    for (auto& layer : layers_) {
      layer.steps = 0;
      for (auto& a : layer.adapters) {
        for (auto* buf : {&a.u, &a.mu, &a.vu, &a.mv, &a.vv}) be.fill(as_row(buf->span()), T(0));
        init_v(a);
      }
    }
  }

  /// Bytes of U, V and their Adam moments.
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& layer : layers_)
      for (const auto& a : layer.adapters)
        n += 3 * static_cast<std::size_t>(a.u.size() + a.v.size()) * sizeof(T);
    return n;
  }

  template <class W>
  void save(W& w) const {
    auto& params = model_->parameters();
    std::vector<std::int64_t> steps;
    for (const auto& layer : layers_) {
      steps.push_back(layer.steps);
      for (const auto& a : layer.adapters) {
        const std::string p = "optim.lora." + params.name(a.id) + ".";
        put(w, p + "U", {a.out, e_.rank}, a.u);
        put(w, p + "V", {e_.rank, a.in}, a.v);
        put(w, p + "mU", {a.out, e_.rank}, a.mu);
        put(w, p + "vU", {a.out, e_.rank}, a.vu);
        put(w, p + "mV", {e_.rank, a.in}, a.mv);
        put(w, p + "vV", {e_.rank, a.in}, a.vv);
      }
    }
    w.add("optim.lora.steps", {static_cast<index_t>(steps.size())},
          std::span<const std::int64_t>(steps));
    std::ostringstream out;
    out << rng_;
    w.set_metadata("optim.lora.rng", out.str());
    w.set_metadata("optim.lora.rank", std::to_string(e_.rank));
  }

  template <class R>
  void load(const R& r) {
    auto& params = model_->parameters();
    const auto& meta = r.metadata();
    auto rank = meta.find("optim.lora.rank");
    check(rank != meta.end() && rank->second == std::to_string(e_.rank),
          "lora_expansion: the saved state has rank ",
          rank == meta.end() ? std::string("(none)") : rank->second, ", expected ", e_.rank);
    const auto steps = r.read_ints("optim.lora.steps");
    check(steps.size() == layers_.size(), "lora_expansion: the saved state has ", steps.size(),
          " layers, expected ", layers_.size());
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      check(steps[l] >= 0, "lora_expansion: optim.lora.steps[", l, "] is ", steps[l],
            ", expected >= 0");
      layers_[l].steps = steps[l];
      for (auto& a : layers_[l].adapters) {
        const std::string p = "optim.lora." + params.name(a.id) + ".";
        get(r, p + "U", a.u);
        get(r, p + "V", a.v);
        get(r, p + "mU", a.mu);
        get(r, p + "vU", a.vu);
        get(r, p + "mV", a.mv);
        get(r, p + "vV", a.vv);
      }
    }
    std::istringstream in(meta.at("optim.lora.rng"));
    in >> rng_;
    check(!in.fail(), "lora_expansion: bad saved generator state");
  }

  /// The adapters of layer l as host copies (tests): U (out, r) and V (r, in) per matrix.
  std::vector<std::pair<std::vector<T>, std::vector<T>>> adapters(index_t l) const {
    std::vector<std::pair<std::vector<T>, std::vector<T>>> out;
    for (const auto& a : layers_[static_cast<std::size_t>(l)].adapters)
      out.emplace_back(host(a.u), host(a.v));
    return out;
  }

 private:
  struct adapter {
    std::size_t id = 0;
    index_t out = 0, in = 0;
    buffer_t<B> u, v, mu, vu, mv, vv;  // U (out, r), V (r, in) and their Adam moments
  };
  struct layer_adapters {
    std::vector<adapter> adapters;
    std::int64_t steps = 0;
  };

  void init_v(adapter& a) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(a.in));
    std::uniform_real_distribution<double> dist(-bound, bound);
    std::vector<T> h(static_cast<std::size_t>(a.v.size()));
    for (auto& x : h) x = static_cast<T>(dist(rng_));
    model_->parameters().backend().upload(std::span<const T>(h), a.v.span());
  }
  std::vector<T> host(const buffer_t<B>& b) const {
    std::vector<T> h(static_cast<std::size_t>(b.size()));
    model_->parameters().backend().download(std::span<const T>(b.span()), std::span<T>(h));
    return h;
  }
  template <class W>
  void put(W& w, const std::string& name, std::vector<index_t> shape, const buffer_t<B>& b) const {
    const auto h = host(b);
    w.add(name, std::move(shape), std::span<const T>(h));
  }
  template <class R>
  void get(const R& r, const std::string& name, buffer_t<B>& b) {
    std::vector<T> h(static_cast<std::size_t>(b.size()));
    r.template read<T>(name, std::span<T>(h));
    for (std::size_t e = 0; e < h.size(); ++e)
      check(std::isfinite(static_cast<double>(h[e])), "lora_expansion: tensor '", name, "' holds ",
            h[e], " at index ", e, " (not finite)");
    model_->parameters().backend().upload(std::span<const T>(h), b.span());
  }

  lora_expansion e_;
  M* model_;
  std::mt19937_64 rng_;
  std::vector<layer_adapters> layers_;
};

}  // namespace tightfit
