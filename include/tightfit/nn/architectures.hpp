// tightfit/nn/architectures.hpp: the one place that maps an architecture (model_config's
// Hugging Face name) to the shipped decoder layer that runs it:
//   LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM  -> decoder_layer
//   Gemma2ForCausalLM, Gemma3ForCausalLM                                    -> gemma_layer
// What an architecture changes outside its layer (norm offset, embedding multiplier, soft-capping,
// sliding-window pattern, the local RoPE base) is a fact of model_config (nn/config.hpp), so the
// schedules, the head and the planner hold no architecture branch: code that must pick the layer
// from a config read at run time (the tool, the planner's default) asks this header.
//
// with_config_layer(config, f) calls f(layer_template<L>{}) with L the shipped layer template of
// the config's architecture; the tag's member template `type` is L, e.g.
//   with_config_layer(cfg, [&](auto layer) {
//     using L = typename decltype(layer)::template type<B>;   // the layer on backend B
//     decoder_model<B, L> model(be, cfg); ...
//   });
// or, where a layer template is a template argument, run<decltype(layer)::template type>(...).
// config_layer is the tag that stands for "the layer the config names" where a layer template is
// a template argument (stream/planner.hpp's default).
#pragma once

#include <string>
#include <vector>

#include "tightfit/backend/meta.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// Stands for the shipped layer of a config's architecture, resolved at run time
/// (with_config_layer); never instantiated.
template <class B>
struct config_layer;

/// A layer template as a value: `type` is L.
template <template <class> class L>
struct layer_template {
  template <class B>
  using type = L<B>;
};

/// f(layer_template<L>{}) with L the shipped layer template of c's architecture (see the top
/// comment); returns what f returns.
template <class F>
decltype(auto) with_config_layer(const model_config& c, F&& f) {
  if (c.is_gemma()) return f(layer_template<gemma_layer>{});
  return f(layer_template<decoder_layer>{});
}

/// The parameter table of one decoder layer of the model c describes (names under
/// "model.layers.N.", shapes), as its shipped layer declares it.
inline std::vector<param_spec> config_layer_table(const model_config& c) {
  return with_config_layer(c, [&](auto layer) {
    return decltype(layer)::template type<meta_backend<double>>::parameter_table(c);
  });
}

}  // namespace tightfit
