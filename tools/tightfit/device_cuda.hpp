// The tool's CUDA path behind a host-only interface (no CUDA, no Eigen header): cmd_grad.cpp
// (host compiler) loads the model on the host in float and fills a cuda_grad_job; device_cuda.cu
// (nvcc, linked only in a -DTIGHTFIT_WITH_CUDA=ON build, which defines TIGHTFIT_CLI_CUDA) copies
// the weights to cuda_backend<float> or cuda_backend<__nv_bfloat16> (bf16: rounded on upload),
// runs the same compute_gradients, and writes every gradient back into the host model's
// gradient spans in float, so the CPU path's checks, --out file and JSON line follow unchanged.
// cmd_train.cpp likewise fills a cuda_train_job: the device trains a copy of the host model
// with a full-parameter optimizer under optim/train.hpp's train() (f32: Adam, AdamW, SGD; bf16:
// Adam, AdamW with fp32 master weights and moments), the host's callbacks print and log each
// step, and the trained weights come back into the host model's value spans, so the CPU path's
// summary line and --save-model follow unchanged. cmd_bench.cpp fills a cuda_bench_job per row
// of `tightfit bench stream --device cuda`: a random model made on the device, one gradient pass.
// Invariant: the job's parameters are the host model's, in its order, with the names and sizes
// the device model of the same config has (checked; a mismatch is a tightfit::error).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/optim/schedule.hpp"
#include "tightfit/optim/train.hpp"
#include "tightfit/optim/update_rules.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit::cli {

/// Storage of the device tensors: float, or bf16 with fp32 accumulation.
enum class cuda_dtype { f32, bf16 };

/// One parameter of the host model: values (numel; training writes the trained weights back)
/// and its gradient (numel, or empty when the host holds none; the gradient step fills it and
/// sets `computed` when the device computed one).
struct host_tensor {
  std::string name;
  std::span<float> value;
  std::span<float> grad;
  bool computed = false;
};

/// One gradient step on the GPU.
struct cuda_grad_job {
  model_config config;
  cuda_dtype dtype = cuda_dtype::f32;
  int device = 0;                       ///< CUDA ordinal (CUDA_VISIBLE_DEVICES applies)
  std::vector<host_tensor> parameters;  ///< the host model's, in its parameter order
  token_batch batch;                    ///< host spans (the backend copies ids per call)
  backward_options options;
};

/// What the step measured on the device (peaks from cuda_backend's memory counter; seconds:
/// forward + backward, synchronised, without the weight upload and gradient download).
struct cuda_grad_result {
  backward_result result;
  double seconds = 0;
  std::string device_name;
};

/// Training with a full-parameter optimizer on the GPU. f32: make_full_optimizer (adam, adamw,
/// sgd). bf16: the forward and backward read a bf16 copy of the weights and produce bf16
/// gradients; fp32 master weights and Adam / AdamW moments are updated (the backend's
/// mixed-precision adam_update) and the bf16 copy rewritten after each step; sgd is refused.
struct cuda_train_job {
  using rule_type = std::variant<adam_update_rule, adamw_update_rule, sgd_update_rule>;
  model_config config;
  cuda_dtype dtype = cuda_dtype::f32;
  int device = 0;
  std::vector<host_tensor> parameters;  ///< the host model's, in its order (grad unused)
  const token_dataset* data = nullptr;  ///< host rows
  rule_type rule;
  double max_grad_norm = 0;  ///< clipping (0: off)
  runtime_schedule schedule;
  train_options options;  ///< one process: grad_accum 1, parallel none
  bool deterministic = false;
  std::function<void(const train_step&)> on_step;    ///< called after every step
  std::function<void(const train_summary&)> on_end;  ///< called once at the end
};

/// The summary of the run (peaks and state from cuda_backend's memory counter) and the device.
struct cuda_train_result {
  train_summary summary;
  std::string device_name;
};

/// One row of `tightfit bench stream --device cuda`: a model of `config` initialised on the
/// device (init_random(seed): no host weights), one compute_gradients on the batch.
struct cuda_bench_job {
  model_config config;
  cuda_dtype dtype = cuda_dtype::f32;
  int device = 0;
  std::uint64_t seed = 1;
  token_batch batch;  ///< host spans
  backward_options options;
};

/// What the row measured: seconds of forward + backward (the stream synchronised before the
/// clock is read at each end), the backend's peak device bytes (parameters, gradients,
/// activations and scratch, from its memory counter), the GEMM and attention flops.
struct cuda_bench_result {
  backward_result result;
  double seconds = 0;
  std::size_t peak_device_bytes = 0;
  double flops = 0;
  std::string device_name;
};

/// Throws tightfit::error naming --device cuda unless CUDA device `device` exists (no
/// device, no driver, CUDA_VISIBLE_DEVICES hiding them all).
void require_cuda_device(int device);

/// The gradients of `job` under `loss` on the GPU (device_cuda.cu).
cuda_grad_result cuda_gradients(cuda_grad_job& job, sft_loss& loss);
cuda_grad_result cuda_gradients(cuda_grad_job& job, grpo_loss& loss);
cuda_grad_result cuda_gradients(cuda_grad_job& job, dpo_loss& loss);

/// One bench row on the GPU under `loss` (device_cuda.cu).
cuda_bench_result cuda_bench(const cuda_bench_job& job, sft_loss& loss);
cuda_bench_result cuda_bench(const cuda_bench_job& job, grpo_loss& loss);
cuda_bench_result cuda_bench(const cuda_bench_job& job, dpo_loss& loss);

/// Trains the host model of `job` on the GPU with the SFT loss (device_cuda.cu); the trained
/// weights are written into job.parameters[i].value.
cuda_train_result cuda_train(cuda_train_job& job);

}  // namespace tightfit::cli
