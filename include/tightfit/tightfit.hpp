// tightfit/tightfit.hpp: the umbrella header. Includes every component whose dependencies the
// including translation unit can see (Eigen, nanoflann, nlohmann-json, PCRE2 and utf8proc are
// detected with __has_include; link the matching tightfit:: targets).
#pragma once

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/meta.hpp"
#include "tightfit/backend/reference.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/objective.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/nn/parameters.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/optim/optim.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/forward.hpp"
#include "tightfit/stream/head.hpp"
#include "tightfit/stream/packing.hpp"
#include "tightfit/stream/planner.hpp"

#if __has_include(<Eigen/Core>)
#include "tightfit/backend/eigen.hpp"
#endif
#if __has_include(<Eigen/Core>) && __has_include(<nanoflann.hpp>)
#include "tightfit/geometry/geometry.hpp"
#endif
#if __has_include(<nlohmann/json.hpp>)
#include "tightfit/io/hf.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/io/token_file.hpp"
#include "tightfit/nn/hf_model.hpp"
#endif
#if __has_include(<nlohmann/json.hpp>) && __has_include(<pcre2.h>) && __has_include(<utf8proc.h>)
#include "tightfit/text/chat.hpp"
#include "tightfit/text/examples.hpp"
#include "tightfit/text/tokenizer.hpp"
#endif
