// tightfit grad --device cuda: the gradient step of device_cuda.hpp on cuda_backend<float> or
// cuda_backend<__nv_bfloat16> (nvcc; built only with -DTIGHTFIT_WITH_CUDA=ON). The host model's
// float weights are uploaded (bf16: rounded to nearest even), compute_gradients runs the same
// schedule and objective as on the CPU, and the gradients come back to the host in float.
// tightfit train --device cuda: the same upload, then train() with make_full_optimizer on
// cuda_backend<float>, or (bf16) with mixed_adam below on cuda_backend<__nv_bfloat16>, and the
// trained weights come back into the host model. tightfit bench stream --device cuda: one
// gradient pass of a model initialised on the device, timed between two synchronisations.
#include <chrono>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "device_cuda.hpp"
#include "tightfit/backend/cuda.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/decoder_layer.hpp"
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

/// Full-parameter Adam / AdamW for bf16 storage: fp32 master weights and moments (m, v), each
/// of the parameter's size, updated by the backend's mixed-precision adam_update, which also
/// rewrites the bf16 weights the forward and backward read. What train() calls of an optimizer:
/// steps, the learning-rate factor, state bytes and step(batch, objective, options, gradients).
/// Clipping (max_grad_norm > 0) as clip_grad_norm: the global 2-norm of the bf16 gradients,
/// summed in double on the host, and the gradients scaled by max_norm / (norm + 1e-6) when
/// that is below 1.
template <class Rule>
class mixed_adam {
 public:
  using S = __nv_bfloat16;
  using B = cuda_backend<S>;

  mixed_adam(llama_model<B>& model, Rule rule, double max_grad_norm,
             std::span<const host_tensor> host)
      : model_(&model), rule_(rule), clip_(max_grad_norm) {
    rule_.validate();
    auto& p = model.parameters();
    B& be = p.backend();
    check(p.size() == host.size(), "--device cuda: the device model has ", p.size(),
          " parameters, the host model ", host.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      state e;
      e.master = be.template allocate<float>(p.numel(i));  // (numel) fp32 weights
      e.m = be.template allocate<float>(p.numel(i));       // (numel) first moment
      e.v = be.template allocate<float>(p.numel(i));       // (numel) second moment
      be.upload(std::span<const float>(host[i].value), e.master.span());
      e.decay = decays(p.name(i), p.shape(i).size());
      bytes_ += 3 * sizeof(float) * static_cast<std::size_t>(p.numel(i));
      state_.push_back(std::move(e));
    }
  }

  std::int64_t steps() const { return steps_; }
  void set_lr_factor(double f) { lr_factor_ = f; }
  double lr_factor() const { return lr_factor_; }
  /// Bytes of the master weights and both moments (fp32).
  std::size_t state_bytes() const { return bytes_; }
  /// The fp32 master weights of parameter i.
  std::span<const float> master(std::size_t i) const { return state_[i].master.span(); }

  template <Objective O, class Gradients = local_gradients>
  step_result step(const token_batch& batch, O& objective, const backward_options& options = {},
                   Gradients&& gradients = {}) {
    backward_options opt = options;
    auto& p = model_->parameters();
    B& be = p.backend();
    opt.layer_weight_grads.assign(static_cast<std::size_t>(model_->config().num_hidden_layers),
                                  true);
    opt.embedding_grad = true;
    opt.head_grad = true;
    for (std::size_t i = 0; i < p.size(); ++i)
      if (p.has_grad(i)) be.fill(as_row(p.grad(i)), 0.f);
    step_result res;
    res.switched = steps_ == 0;
    res.block = 0;
    res.backward = gradients(*model_, batch, objective, opt);
    res.loss = res.backward.loss;
    if (clip_ > 0) res.grad_norm = clip();
    ++steps_;
    adam_hyper<float> h;
    h.lr = static_cast<float>(rule_.lr * lr_factor_);
    h.beta1 = static_cast<float>(rule_.beta1);
    h.beta2 = static_cast<float>(rule_.beta2);
    h.eps = static_cast<float>(rule_.eps);
    h.decoupled = Rule::decoupled;
    h.step = steps_;
    for (std::size_t i = 0; i < p.size(); ++i) {
      check(p.has_grad(i), "--device cuda: parameter '", p.name(i), "' has no gradient");
      state& e = state_[i];
      h.weight_decay = static_cast<float>(e.decay ? rule_.weight_decay : 0.0);
      be.adam_update(e.master.span(), std::span<const S>(p.grad(i)), e.m.span(), e.v.span(), h,
                     p.value(i));
    }
    return res;
  }

 private:
  struct state {
    detail::cuda_buffer<float> master, m, v;
    bool decay = false;
  };

  double clip() {
    auto& p = model_->parameters();
    B& be = p.backend();
    double sum = 0;
    std::vector<S> host;
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!p.has_grad(i)) continue;
      host.resize(p.grad(i).size());
      be.download(std::span<const S>(p.grad(i)), std::span<S>(host));
      for (S x : host) sum += static_cast<double>(__bfloat162float(x)) * __bfloat162float(x);
    }
    const double norm = std::sqrt(sum);
    const double factor = clip_ / (norm + 1e-6);
    if (factor < 1)
      for (std::size_t i = 0; i < p.size(); ++i)
        if (p.has_grad(i)) be.scale(static_cast<float>(factor), as_row(p.grad(i)));
    return norm;
  }

  llama_model<B>* model_;
  Rule rule_;
  double clip_ = 0;
  std::vector<state> state_;
  std::size_t bytes_ = 0;
  std::int64_t steps_ = 0;
  double lr_factor_ = 1.0;
};

/// train --device cuda --dtype bf16: mixed_adam over a bf16 copy of the host weights; the fp32
/// master weights come back into the host model.
cuda_train_result train_bf16(cuda_train_job& job) {
  using B = cuda_backend<__nv_bfloat16>;
  B be(cuda_backend_options{job.device, false, job.deterministic});
  llama_model<B> model(be, job.config);
  auto& p = model.parameters();
  upload_weights<__nv_bfloat16>(p, job.parameters);
  cuda_train_result out;
  const auto run_rule = [&](const auto& rule) {
    using R = std::remove_cvref_t<decltype(rule)>;
    mixed_adam<R> opt(model, rule, job.max_grad_norm, job.parameters);
    out.summary =
        train(model, *job.data, opt, job.schedule, job.options, sft_loss{}, job_callbacks{&job});
    be.synchronize();
    for (std::size_t i = 0; i < p.size(); ++i) be.download(opt.master(i), job.parameters[i].value);
  };
  if (const auto* r = std::get_if<adam_update_rule>(&job.rule))
    run_rule(*r);
  else if (const auto* w = std::get_if<adamw_update_rule>(&job.rule))
    run_rule(*w);
  out.device_name = device_name(job.device);
  return out;
}

template <class S, template <class> class Layer, class Loss>
cuda_bench_result bench_row(const cuda_bench_job& job, Loss& loss) {
  using B = cuda_backend<S>;
  B be(cuda_backend_options{job.device, false, false});
  decoder_model<B, Layer<B>> model(be, job.config);
  model.init_random(job.seed);
  be.synchronize();
  be.stats().reset();
  cuda_bench_result out;
  const auto start = std::chrono::steady_clock::now();
  out.result = compute_gradients(model, job.batch, loss, job.options);
  be.synchronize();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.peak_device_bytes = be.memory().peak();
  out.flops = be.stats().gemm_flops + be.stats().attention_flops;
  out.device_name = device_name(job.device);
  return out;
}

template <class Loss>
cuda_bench_result bench_dispatch(const cuda_bench_job& job, Loss& loss) {
  require_cuda_device(job.device);
  return with_config_layer(job.config, [&](auto layer) {
    return job.dtype == cuda_dtype::bf16
               ? bench_row<__nv_bfloat16, decltype(layer)::template type>(job, loss)
               : bench_row<float, decltype(layer)::template type>(job, loss);
  });
}

template <class Loss>
cuda_grad_result dispatch(cuda_grad_job& job, Loss& loss) {
  require_cuda_device(job.device);
  return with_config_layer(job.config, [&](auto layer) {
    return job.dtype == cuda_dtype::bf16
               ? run<__nv_bfloat16, decltype(layer)::template type>(job, loss)
               : run<float, decltype(layer)::template type>(job, loss);
  });
}

}  // namespace

cuda_train_result cuda_train(cuda_train_job& job) {
  check(job.dtype == cuda_dtype::f32 || !std::holds_alternative<sgd_update_rule>(job.rule),
        "--device cuda --dtype bf16 trains adam and adamw (fp32 master weights and moments); "
        "not --optimizer sgd yet");
  require_cuda_device(job.device);
  check(job.data != nullptr, "--device cuda: no training data");
  if (job.dtype == cuda_dtype::bf16) return train_bf16(job);
  using B = cuda_backend<float>;
  B be(cuda_backend_options{job.device, false, job.deterministic});
  llama_model<B> model(be, job.config);
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

cuda_bench_result cuda_bench(const cuda_bench_job& job, sft_loss& loss) {
  return bench_dispatch(job, loss);
}
cuda_bench_result cuda_bench(const cuda_bench_job& job, grpo_loss& loss) {
  return bench_dispatch(job, loss);
}
cuda_bench_result cuda_bench(const cuda_bench_job& job, dpo_loss& loss) {
  return bench_dispatch(job, loss);
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
