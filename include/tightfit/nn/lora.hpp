// tightfit/nn/lora.hpp: LoRA adapters of a decoder model (Hu et al., "LoRA: Low-Rank Adaptation
// of Large Language Models", ICLR 2022, arXiv 2106.09685; rsLoRA: Kalajdzievski, arXiv
// 2312.03732), laid out and initialised as Hugging Face PEFT does.
//
// Each targeted projection W (out, in) of every decoder layer gets A (r, in) and B (out, r); the
// layer computes y = x W^T (+ b) + s (x A^T) B^T with s = alpha / r (rsLoRA: alpha / sqrt(r)).
// Any DecoderModel whose layer takes adapters (LoraLayer, nn/adapters.hpp: every layer built on
// nn/streambp_layer.hpp, or a user's own) gets them; the shapes are those of the base weights
// "model.layers.N.<module>.weight" in the model's parameters (the layer's parameter table).
// The adapters live in their own parameter_set under PEFT's tensor names
// ("base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight"), so that the set is
// saved as adapter_model.safetensors as is (nn/peft.hpp) and an update rule of optim/ steps it.
// Initialisation (PEFT's init_lora_weights = true): A ~ Kaiming-uniform with a = sqrt(5) as
// torch.nn.Linear, i.e. U(-1/sqrt(in), 1/sqrt(in)), from a seeded generator; B = 0.
//
// Dropout (PEFT's lora_dropout, nn/lora_dropout.hpp): the adapters' inputs are dropped with
// probability p in a training pass only (lora_training_pass: lora_optimizer's steps), by a mask
// that is a function of (seed, the pass's draw key, layer, projection, token, element); outside
// one the model computes W0 + s B A exactly.
//
// Invariants: while a lora_adapters object lives (and until merge()), the model's layers are
// bound to it (nn/adapters.hpp) and the model computes W0 + s B A (outside a training pass);
// merge() adds s B A into the base weights and unbinds, so the model's function does not
// change.
// Lifetime: construct the adapters after the model and destroy them before it (the destructor
// unbinds the layers).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/limits.hpp"
#include "tightfit/nn/adapters.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// The projection named `name` ("q_proj", ..., "down_proj"); an error naming it otherwise.
inline projection parse_projection(const std::string& name) {
  for (int p = 0; p < projection_count; ++p)
    if (name == projection_name(static_cast<projection>(p))) return static_cast<projection>(p);
  fail("LoRA target module '", name,
       "' is not a projection of the decoder layer, expected q_proj, k_proj, v_proj, o_proj, "
       "gate_proj, up_proj, down_proj or all-linear");
}

/// "q_proj,v_proj" -> {"q_proj", "v_proj"}; "all-linear" stays one entry.
inline std::vector<std::string> split_target_modules(const std::string& csv) {
  std::vector<std::string> out;
  std::stringstream in(csv);
  std::string item;
  while (std::getline(in, item, ',')) {
    check(!item.empty(), "LoRA target modules '", csv, "' hold an empty name");
    out.push_back(item);
  }
  check(!out.empty(), "LoRA target modules are empty, expected e.g. q_proj,v_proj or all-linear");
  return out;
}

/// The hyper-parameters of LoRA (PEFT's LoraConfig names in the comments).
struct lora_config {
  index_t rank = 8;         ///< r
  double alpha = 8;         ///< lora_alpha
  double dropout = 0;       ///< lora_dropout: p in [0, 1), in training passes only
  bool use_rslora = false;  ///< use_rslora: scale alpha / sqrt(r) instead of alpha / r
  std::vector<std::string> target_modules{"q_proj", "v_proj"};  ///< or {"all-linear"}
  std::uint64_t seed = 0;  ///< the generator of A's initialisation and the dropout masks' seed

  /// s: alpha / r, or alpha / sqrt(r) with use_rslora.
  double scale() const {
    const double r = static_cast<double>(rank);
    return use_rslora ? alpha / std::sqrt(r) : alpha / r;
  }
  /// The targeted projections in layer order; "all-linear" (PEFT: every linear layer but the
  /// output layer) is all seven. Errors name an unknown or repeated module.
  std::vector<projection> projections() const {
    std::vector<bool> on(projection_count, false);
    for (const auto& m : target_modules) {
      if (m == "all-linear") {
        check(target_modules.size() == 1, "LoRA target modules: all-linear stands alone, got ",
              target_modules.size(), " entries");
        on.assign(projection_count, true);
        continue;
      }
      const auto p = static_cast<std::size_t>(parse_projection(m));
      check(!on[p], "LoRA target module '", m, "' is given twice");
      on[p] = true;
    }
    std::vector<projection> out;
    for (int p = 0; p < projection_count; ++p)
      if (on[static_cast<std::size_t>(p)]) out.push_back(static_cast<projection>(p));
    return out;
  }
  /// Throws tightfit::error naming the first bad value.
  void validate() const {
    check(rank >= 1, "LoRA rank r is ", rank, ", expected >= 1");
    check(std::isfinite(alpha) && alpha > 0, "LoRA alpha is ", alpha, ", expected > 0");
    check(dropout >= 0 && dropout < 1, "LoRA dropout is ", dropout,
          ", expected in [0, 1) (the probability of zeroing an adapter's input)");
    check(!target_modules.empty(), "LoRA target modules are empty");
    (void)projections();
  }
};

/// PEFT's name of layer l's adapter matrix `which` ('A' or 'B') on projection p:
/// "base_model.model.model.layers.<l>.<module>.lora_<which>.weight".
inline std::string peft_lora_name(index_t l, projection p, char which) {
  return "base_model.model." + hf_names::layer_prefix(l) + projection_module(p) + ".lora_" +
         std::string(1, which) + ".weight";
}

/// The (out, in) extents of projection p's weight "<module>.weight" in a layer's parameter table
/// (L::parameter_table(config), nn/layer.hpp: the shapes the model declares and loads): LoRA's A
/// is (r, in), B is (out, r). Errors name a projection the layer lacks or that is not a matrix.
inline std::pair<index_t, index_t> projection_extents(std::span<const param_spec> layer_table,
                                                      projection p) {
  const std::string name = projection_module(p) + ".weight";
  for (const auto& row : layer_table)
    if (row.name == name) {
      check(row.shape.size() == 2, "LoRA: the layer's parameter '", name, "' is not a matrix");
      return {row.shape[0], row.shape[1]};
    }
  fail("LoRA: the layer has no parameter '", name, "' to adapt");
}

/// The number of adapter values (A and B of every target of every layer) of `cfg` on a model of
/// `num_layers` layers whose parameter table is `layer_table`, or nullopt when it does not fit in
/// 64 bits: what lora_adapters allocates per copy.
inline std::optional<std::uint64_t> lora_value_count(std::span<const param_spec> layer_table,
                                                     index_t num_layers, const lora_config& cfg) {
  std::uint64_t total = 0;
  for (projection p : cfg.projections()) {
    const auto [out, in] = projection_extents(layer_table, p);
    const auto per_layer =
        checked_product({static_cast<std::uint64_t>(cfg.rank),
                         static_cast<std::uint64_t>(in) + static_cast<std::uint64_t>(out)});
    if (!per_layer) return std::nullopt;
    const auto all = checked_product({*per_layer, static_cast<std::uint64_t>(num_layers)});
    if (!all) return std::nullopt;
    const auto sum = checked_sum(total, *all);
    if (!sum) return std::nullopt;
    total = *sum;
  }
  return total;
}

/// The LoRA adapters of a decoder model: owns them, binds them to the model's layers.
template <DecoderModel M>
requires LoraLayer<typename M::layer_type, typename M::backend_type>
class lora_adapters {
 public:
  using B = typename M::backend_type;
  using T = storage_t<B>;
  using A = accum_t<B>;

  lora_adapters(M& model, lora_config config)
      : model_(&model), cfg_(std::move(config)), params_(model.backend()) {
    cfg_.validate();
    dropout_.p = cfg_.dropout;
    dropout_.seed = cfg_.seed;
    const model_config& mc = model.config();
    targets_ = cfg_.projections();
    for (index_t l = 0; l < mc.num_hidden_layers; ++l) {
      lora_binding<B> b;
      b.adapters = &params_;
      b.rank = cfg_.rank;
      b.scale = cfg_.scale();
      b.dropout = &dropout_;
      b.layer = l;
      for (projection p : targets_) {
        const auto shape = model.parameters().shape(base_id(l, p));  // (out, in)
        check(shape.size() == 2, "lora_adapters: parameter '",
              model.parameters().name(base_id(l, p)), "' is not a matrix");
        const index_t out = shape[0], in = shape[1];
        const auto k = static_cast<std::size_t>(p);
        b.a[k] =
            static_cast<std::ptrdiff_t>(params_.add(peft_lora_name(l, p, 'A'), {cfg_.rank, in}));
        b.b[k] =
            static_cast<std::ptrdiff_t>(params_.add(peft_lora_name(l, p, 'B'), {out, cfg_.rank}));
      }
      bindings_.push_back(b);
    }
    init(cfg_.seed);
    bind();
  }
  ~lora_adapters() {
    if (bound_) unbind();
  }
  lora_adapters(const lora_adapters&) = delete;
  lora_adapters& operator=(const lora_adapters&) = delete;

  const lora_config& config() const { return cfg_; }
  double scale() const { return cfg_.scale(); }
  const std::vector<projection>& targets() const { return targets_; }
  /// The adapters: A (r, in) and B (out, r) of every targeted projection, PEFT names.
  parameter_set<B>& parameters() { return params_; }
  const parameter_set<B>& parameters() const { return params_; }
  M& model() const { return *model_; }
  /// Whether the layers compute with the adapters (false after merge()).
  bool bound() const { return bound_; }
  /// The dropout the layers read: p and seed of the config, and the pass's state.
  const lora_dropout& dropout() const { return dropout_; }
  /// Starts (training: the adapters' inputs are dropped, masks keyed by `draw`) or ends a
  /// training pass; lora_training_pass does both. No effect on the function with p = 0.
  void set_training(bool training, std::uint64_t draw = 0) {
    dropout_.training = training;
    dropout_.draw = training ? draw : 0;
  }
  /// Positions of layer l's A and B of projection p in parameters().
  std::size_t a_id(index_t l, projection p) const {
    return bindings_[static_cast<std::size_t>(l)].a_id(p);
  }
  std::size_t b_id(index_t l, projection p) const {
    return bindings_[static_cast<std::size_t>(l)].b_id(p);
  }
  /// The base weight of layer l's projection p in the model's parameters.
  std::size_t base_id(index_t l, projection p) const {
    return model_->parameters().at(hf_names::layer_prefix(l) + projection_module(p) + ".weight");
  }

  /// PEFT's initialisation: A ~ U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform, a = sqrt(5)) drawn
  /// in parameter order from mt19937_64(seed); B = 0.
  void init(std::uint64_t seed) {
    std::mt19937_64 gen(seed);
    auto& be = params_.backend();
    for (const auto& b : bindings_)
      for (projection p : targets_) {
        const std::size_t ia = b.a_id(p), ib = b.b_id(p);
        const double bound = 1.0 / std::sqrt(static_cast<double>(params_.shape(ia)[1]));
        std::uniform_real_distribution<double> dist(-bound, bound);
        std::vector<T> h(static_cast<std::size_t>(params_.numel(ia)));
        for (auto& x : h) x = static_cast<T>(dist(gen));
        be.upload(std::span<const T>(h), params_.value(ia));
        be.fill(as_row(params_.value(ib)), A(0));
      }
  }

  /// Per parameter of the model: true for every decoder-layer parameter (base weights, biases,
  /// norms), the embedding and the head: what backward_options::frozen_params takes.
  std::vector<bool> frozen_base() const {
    return std::vector<bool>(model_->parameters().size(), true);
  }

  /// W0 += s B A for every adapter, then unbinds the layers: the model alone computes what the
  /// model with adapters computed (to rounding). The adapters keep their values.
  void merge() {
    check(bound_, "lora_adapters::merge: the adapters were already merged");
    auto& be = params_.backend();
    auto& mp = model_->parameters();
    const A s = A(cfg_.scale());
    for (index_t l = 0; l < static_cast<index_t>(bindings_.size()); ++l)
      for (projection p : targets_) {
        const std::size_t w = base_id(l, p), ia = a_id(l, p), ib = b_id(l, p);
        const index_t out = params_.shape(ib)[0], in = params_.shape(ia)[1], r = cfg_.rank;
        be.gemm(transpose::no, transpose::no, s,
                as_matrix(std::span<const T>(params_.value(ib)), out, r),
                as_matrix(std::span<const T>(params_.value(ia)), r, in), A(1),
                as_matrix(mp.value(w), out, in));
      }
    unbind();
  }

 private:
  void bind() {
    for (index_t l = 0; l < static_cast<index_t>(bindings_.size()); ++l)
      model_->layer(l).set_lora(bindings_[static_cast<std::size_t>(l)]);
    bound_ = true;
  }
  void unbind() {
    for (index_t l = 0; l < static_cast<index_t>(bindings_.size()); ++l)
      model_->layer(l).set_lora(lora_binding<B>{});
    bound_ = false;
  }

  M* model_;
  lora_config cfg_;
  parameter_set<B> params_;
  std::vector<projection> targets_;
  std::vector<lora_binding<B>> bindings_;  // per layer
  lora_dropout dropout_;                   // the bindings point to it
  bool bound_ = false;
};

/// A training pass of `adapters` for its lifetime (lora_adapters::set_training): the adapters'
/// inputs are dropped with the config's p, masks keyed by `draw` (lora_optimizer: its step
/// count); the pass ends when the object goes, also by an exception.
template <class Adapters>
class lora_training_pass {
 public:
  lora_training_pass(Adapters& adapters, std::uint64_t draw) : adapters_(&adapters) {
    adapters.set_training(true, draw);
  }
  ~lora_training_pass() { adapters_->set_training(false); }
  lora_training_pass(const lora_training_pass&) = delete;
  lora_training_pass& operator=(const lora_training_pass&) = delete;

 private:
  Adapters* adapters_;
};

}  // namespace tightfit
