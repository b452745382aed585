// tightfit/tightfit.hpp: the umbrella header. Includes every component whose dependencies the
// including translation unit can see (Eigen, nanoflann, nlohmann-json, PCRE2 and utf8proc, MPI
// are detected with __has_include; link the matching tightfit:: targets).
// tests/support/check_umbrellas.cmake checks that every public header is included here or
// through a folder's umbrella, but
// not included: tightfit/backend/cuda.hpp (CUDA kernels: include it in a .cu file, nvcc)
// not included: tightfit/distributed/nccl_communicator.hpp (needs CUDA and NCCL: link
// tightfit::nccl)
#pragma once

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/meta.hpp"
#include "tightfit/backend/offload.hpp"
#include "tightfit/backend/reference.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/hash.hpp"
#include "tightfit/core/limits.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/splitmix.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"
#include "tightfit/distributed/agreement.hpp"
#include "tightfit/distributed/communicator.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/distributed/self_communicator.hpp"
#include "tightfit/distributed/sequence_parallel.hpp"
#include "tightfit/distributed/sequence_step.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/objective.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/adapters.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/block_params.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/lora.hpp"
#include "tightfit/nn/lora_dropout.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/nn/norm_weight.hpp"
#include "tightfit/nn/parameters.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/nn/ring_attention.hpp"
#include "tightfit/nn/rope.hpp"
#include "tightfit/nn/sequence_shard.hpp"
#include "tightfit/nn/streambp_layer.hpp"
#include "tightfit/optim/optim.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/forward.hpp"
#include "tightfit/stream/head.hpp"
#include "tightfit/stream/layer_inputs.hpp"
#include "tightfit/stream/packing.hpp"
#include "tightfit/stream/peak_model.hpp"
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
#include "tightfit/nn/hf_save.hpp"
#include "tightfit/nn/peft.hpp"
#endif
#if __has_include(<mpi.h>)
#include "tightfit/distributed/mpi_communicator.hpp"
#endif
#if __has_include(<nlohmann/json.hpp>) && __has_include(<pcre2.h>) && __has_include(<utf8proc.h>)
#include "tightfit/text/bpe.hpp"
#include "tightfit/text/chat.hpp"
#include "tightfit/text/concept.hpp"
#include "tightfit/text/examples.hpp"
#include "tightfit/text/normalize.hpp"
#include "tightfit/text/regex.hpp"
#include "tightfit/text/tokenizer.hpp"
#include "tightfit/text/utf8.hpp"
#endif
