// tightfit grad --device cuda: the gradient step of device_cuda.hpp on cuda_backend<float> or
// cuda_backend<__nv_bfloat16> (nvcc; built only with -DTIGHTFIT_WITH_CUDA=ON). The host model's
// float weights are uploaded (bf16: rounded to nearest even), compute_gradients runs the same
// schedule and objective as on the CPU, and the gradients come back to the host in float.
// tightfit train --device cuda: the same upload, then train() with make_full_optimizer on
// cuda_backend<float>, and the trained weights come back into the host model.
#include <chrono>
#include <string>
#include <type_traits>
#include <vector>

#include "device_cuda.hpp"
#include "tightfit/backend/cuda.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/optim/optim.hpp"

namespace tightfit::cli {

namespace {

template <class S>
S from_float(float x) {
  if constexpr (std::is_same_v<S, float>)
    return x;
  else
    return __float2bfloat16(x);
}
template <class S>
float to_float(S x) {
  if constexpr (std::is_same_v<S, float>)
    return x;
  else
    return __bfloat162float(x);
}

/// Copies the host weights into the device model `p` (same names and sizes, checked).
template <class S, class Params>
void upload_weights(Params& p, std::span<const host_tensor> host) {
  check(p.size() == host.size(), "--device cuda: the device model has ", p.size(),
        " parameters, the host model ", host.size());
  std::vector<S> staging;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const host_tensor& h = host[i];
    check(p.name(i) == h.name && static_cast<std::size_t>(p.numel(i)) == h.value.size(),
          "--device cuda: parameter ", i, " is '", p.name(i), "' (", p.numel(i),
          " values) on the device and '", h.name, "' (", h.value.size(), ") on the host");
    staging.resize(h.value.size());
    for (std::size_t k = 0; k < staging.size(); ++k) staging[k] = from_float<S>(h.value[k]);
    p.backend().upload(std::span<const S>(staging), p.value(i));
  }
  p.backend().synchronize();
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, device) == cudaSuccess ? std::string(prop.name)
                                                               : std::string();
}

template <class S, template <class> class Layer, class Loss>
cuda_grad_result run(cuda_grad_job& job, Loss& loss) {
  using B = cuda_backend<S>;
  B be(cuda_backend_options{job.device, false, false});
  decoder_model<B, Layer<B>> model(be, job.config);
  auto& p = model.parameters();
  upload_weights<S>(p, job.parameters);
  std::vector<S> staging;
  const auto start = std::chrono::steady_clock::now();
  cuda_grad_result out;
  out.result = compute_gradients(model, job.batch, loss, job.options);
  be.synchronize();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (std::size_t i = 0; i < p.size(); ++i) {
    host_tensor& h = job.parameters[i];
    h.computed = p.has_grad(i);
    if (!h.computed) continue;
    check(h.grad.size() == h.value.size(), "--device cuda: the host holds no gradient for '",
          h.name, "'");
    staging.resize(h.grad.size());
    be.download(std::span<const S>(p.grad(i)), std::span<S>(staging));
    for (std::size_t k = 0; k < staging.size(); ++k) h.grad[k] = to_float(staging[k]);
  }
  out.device_name = device_name(job.device);
  return out;
}

/// The callbacks of a cuda_train_job for train().
struct job_callbacks {
  cuda_train_job* job;
  void on_step(const train_step& s) const {
    if (job->on_step) job->on_step(s);
  }
  void on_end(const train_summary& s) const {
    if (job->on_end) job->on_end(s);
  }
};

template <class Loss>
cuda_grad_result dispatch(cuda_grad_job& job, Loss& loss) {
  require_cuda_device(job.device);
  const bool gemma = job.config.is_gemma();
  if (job.dtype == cuda_dtype::bf16)
    return gemma ? run<__nv_bfloat16, gemma_layer>(job, loss)
                 : run<__nv_bfloat16, decoder_layer>(job, loss);
  return gemma ? run<float, gemma_layer>(job, loss) : run<float, decoder_layer>(job, loss);
}

}  // namespace

cuda_train_result cuda_train(cuda_train_job& job) {
  require_cuda_device(job.device);
  check(job.data != nullptr, "--device cuda: no training data");
  using B = cuda_backend<float>;
  B be(cuda_backend_options{job.device, false, job.deterministic});
  decoder_model<B> model(be, job.config);
  auto& p = model.parameters();
  upload_weights<float>(p, job.parameters);
  cuda_train_result out;
  out.summary = std::visit(
      [&](const auto& rule) {
        auto opt = make_full_optimizer(model, rule, job.max_grad_norm);
        return train(model, *job.data, opt, job.schedule, job.options, sft_loss{},
                     job_callbacks{&job});
      },
      job.rule);
  be.synchronize();
  for (std::size_t i = 0; i < p.size(); ++i)
    be.download(std::span<const float>(p.value(i)), job.parameters[i].value);
  out.device_name = device_name(job.device);
  return out;
}

void require_cuda_device(int device) {
  const int count = cuda_backend<float>::device_count();
  check(count > 0,
        "--device cuda: no CUDA device is available (cudaGetDeviceCount found none; "
        "CUDA_VISIBLE_DEVICES may hide them)");
  check(device >= 0 && device < count, "--device cuda: device ", device, " does not exist (", count,
        " visible)");
}

cuda_grad_result cuda_gradients(cuda_grad_job& job, sft_loss& loss) {
  return dispatch(job, loss);
}
cuda_grad_result cuda_gradients(cuda_grad_job& job, grpo_loss& loss) {
  return dispatch(job, loss);
}
cuda_grad_result cuda_gradients(cuda_grad_job& job, dpo_loss& loss) {
  return dispatch(job, loss);
}

}  // namespace tightfit::cli
