// bench_cuda: the GPU benchmark of the CUDA backend (run by scripts/gpu-check on one GPU).
//
// A Qwen3-4B-shaped model with random weights (hidden 2560, 32/8 heads, head_dim 128,
// intermediate 9728, vocab 151936, tied embeddings), bf16 storage:
//  1. the cuBLAS bf16 GEMM rate (8192^3, fp32 accumulation), the yardstick of this run;
//  2. causal flash attention forward + backward (32/8 heads, head_dim 128) at --attn-seq,
//     GFLOP/s (FlashAttention's count: 4 hd flops per visible (query, key, head) forward,
//     10 hd backward) and its fraction of the GEMM rate;
//  3. the longest T whose activations fit --budget-gib with each schedule, from the memory
//     planner's dry run (meta_backend<float>, bytes halved for bf16 storage; bf16 parameters
//     and gradients subtracted from the budget first);
//  4. one SFT gradient at T = --seq with checkpoint and with stream (--chunk), on --layers
//     layers (36 is the real model; fewer to fit a time budget): seconds and counted peak bytes.
// Prints a table; --csv FILE writes section,name,value,unit rows (each as soon as measured).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tightfit/backend/cuda.hpp"
#include "tightfit/backend/meta.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/planner.hpp"

using namespace tightfit;
using bf16 = __nv_bfloat16;

namespace {

struct options {
  index_t seq = 32768, attn_seq = 8192, layers = 36, chunk = 2048;
  double budget_gib = 80;
  std::string csv;
  bool model = true;
};

/// Prints each result and appends it to the CSV at once (a run cut short keeps its rows).
struct report {
  std::ofstream csv;
  explicit report(const std::string& path) {
    if (path.empty()) return;
    csv.open(path);
    if (!csv) throw error("bench_cuda: cannot write " + path);
    csv.precision(10);
    csv << "section,name,value,unit\n" << std::flush;
  }
  void add(const std::string& section, const std::string& name, double value,
           const std::string& unit) {
    std::printf("%-12s %-52s %16.4f %s\n", section.c_str(), name.c_str(), value, unit.c_str());
    std::fflush(stdout);
    if (csv.is_open())
      csv << section << "," << name << "," << value << "," << unit << "\n" << std::flush;
  }
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Seconds per call of f() on the backend's stream (cudaEvent timing over `reps` calls).
template <class Fn>
double time_gpu(cuda_backend<bf16>& be, int reps, Fn&& f) {
  f();  // warm up
  cudaEvent_t a = nullptr, b = nullptr;
  detail::cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  detail::cuda_check(cudaEventCreate(&b), "cudaEventCreate");
  detail::cuda_check(cudaEventRecord(a, be.stream()), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) f();
  detail::cuda_check(cudaEventRecord(b, be.stream()), "cudaEventRecord");
  detail::cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  detail::cuda_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(ms) / 1e3 / reps;
}

/// A device buffer of n bf16 values, uniform in [-1, 1).
detail::cuda_buffer<bf16> random_buffer(cuda_backend<bf16>& be, index_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<bf16> h(static_cast<std::size_t>(n));
  for (auto& x : h) x = __float2bfloat16(u(g));
  auto buf = be.allocate<bf16>(n);
  be.upload(std::span<const bf16>(h), buf.span());
  return buf;
}

double gemm_rate(report& r) {
  cuda_backend<bf16> be;
  const index_t n = 8192;
  auto a = random_buffer(be, n * n, 1), b = random_buffer(be, n * n, 2);
  auto c = be.allocate<bf16>(n * n);
  const double s = time_gpu(be, 20, [&] {
    be.gemm(transpose::no, transpose::yes, 1.f, a.view(n, n), b.view(n, n), 0.f, c.view(n, n));
  });
  const double tflops = 2.0 * static_cast<double>(n) * n * n / s / 1e12;
  r.add("gemm", "cuBLAS bf16 8192^3 (fp32 accumulate)", tflops, "TFLOP/s");
  return tflops;
}

void attention_rate(report& r, const options& o, double gemm_tflops) {
  cuda_backend<bf16> be;
  const attention_shape shape{32, 8, 128};
  const index_t t = o.attn_seq, qc = 32 * 128, kc = 8 * 128;
  auto q = random_buffer(be, t * qc, 3), k = random_buffer(be, t * kc, 4),
       v = random_buffer(be, t * kc, 5), dout = random_buffer(be, t * qc, 6);
  auto out = be.allocate<bf16>(t * qc), lse = be.allocate<bf16>(t * 32);
  auto dq = be.allocate<bf16>(t * qc), dk = be.allocate<bf16>(t * kc),
       dv = be.allocate<bf16>(t * kc);
  const float scale = 1.f / std::sqrt(128.f);
  be.stats().reset();
  const double fwd = time_gpu(be, 3, [&] {
    be.attention_forward(shape, q.view(t, qc), k.view(t, kc), v.view(t, kc), {0, t}, scale,
                         out.view(t, qc), lse.view(t, 32));
  });
  const double fwd_flops = be.stats().attention_flops / 4;  // warm-up + 3 calls
  be.stats().reset();
  const double bwd = time_gpu(be, 3, [&] {
    be.attention_backward(shape, q.view(t, qc), k.view(t, kc), v.view(t, kc), out.view(t, qc),
                          dout.view(t, qc), lse.view(t, 32), {0, t}, scale, dq.view(t, qc),
                          dk.view(t, kc), dv.view(t, kc));
  });
  const double bwd_flops = be.stats().attention_flops / 4;
  const double gflops = (fwd_flops + bwd_flops) / (fwd + bwd) / 1e9;
  const std::string tag = "T=" + std::to_string(t) + " 32/8 heads hd 128 bf16";
  r.add("attention", "forward seconds " + tag, fwd, "s");
  r.add("attention", "backward seconds " + tag, bwd, "s");
  r.add("attention", "forward+backward rate", gflops, "GFLOP/s");
  r.add("attention", "fraction of the cuBLAS bf16 GEMM rate", gflops / (gemm_tflops * 1e3),
        "ratio");
}

model_config qwen3_4b(index_t layers) {
  model_config c = preset_config("qwen3-4b");
  c.num_hidden_layers = layers;
  return c;
}

void planner(report& r, const options& o) {
  const model_config cfg = qwen3_4b(36);
  // parameters + gradients in bf16 (tied embeddings: one table)
  meta_backend<float> mb;
  llama_model<meta_backend<float>> counted(mb, cfg);
  std::size_t numel = 0;
  for (std::size_t i = 0; i < counted.parameters().size(); ++i)
    numel += static_cast<std::size_t>(counted.parameters().numel(i));
  const double budget = o.budget_gib * 1024.0 * 1024.0 * 1024.0;
  const double activations = budget - 2.0 * 2.0 * static_cast<double>(numel);
  r.add("plan", "parameters (Qwen3-4B shape)", static_cast<double>(numel), "count");
  if (activations <= 0) return;
  // activation bytes of a bf16 run are half the fp32 dry run's
  const auto fp32_budget = static_cast<std::size_t>(2.0 * activations);
  sft_loss loss;
  const auto p = plan_memory<float>(cfg, 1, 4096, fp32_budget, loss, o.chunk, index_t{1} << 21);
  r.add("plan", "longest T checkpoint (" + std::to_string(static_cast<int>(o.budget_gib)) + " GiB)",
        static_cast<double>(p.max_seq_checkpoint), "tokens");
  r.add("plan", "longest T stream chunk " + std::to_string(p.stream_chunk),
        static_cast<double>(p.max_seq_stream), "tokens");
  r.add("plan", "stream / checkpoint",
        static_cast<double>(p.max_seq_stream) / static_cast<double>(p.max_seq_checkpoint), "ratio");
}

void model_times(report& r, const options& o) {
  const model_config cfg = qwen3_4b(o.layers);
  std::mt19937_64 g(9);
  std::uniform_int_distribution<token_id> tok(0, cfg.vocab_size - 1);
  std::vector<token_id> ids(static_cast<std::size_t>(o.seq)), targets(ids.size());
  for (auto& x : ids) x = tok(g);
  for (auto& x : targets) x = tok(g);
  const token_batch batch{1, o.seq, ids, targets, {}};
  double times[2] = {0, 0};
  const backward_schedule schedules[2] = {backward_schedule::checkpoint, backward_schedule::stream};
  for (int s = 0; s < 2; ++s) {
    cuda_backend<bf16> be;
    llama_model<cuda_backend<bf16>> model(be, cfg);
    model.init_random(11);
    sft_loss loss;
    backward_options opt;
    opt.sched = schedules[s];
    opt.chunk = schedules[s] == backward_schedule::stream ? o.chunk : o.seq;
    be.synchronize();
    const double t0 = now();
    const auto res = compute_gradients(model, batch, loss, opt);
    be.synchronize();
    times[s] = now() - t0;
    const std::string tag = std::string(to_string(schedules[s])) + " T=" + std::to_string(o.seq) +
                            " layers=" + std::to_string(o.layers);
    r.add("model", tag + " seconds", times[s], "s");
    r.add("model", tag + " activation peak", static_cast<double>(res.peak_activation_bytes) / 1e9,
          "GB");
    r.add("model", tag + " loss", res.loss, "nats");
  }
  r.add("model", "stream / checkpoint time", times[1] / times[0], "ratio");
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cuda: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seq")
      o.seq = std::stol(next());
    else if (a == "--attn-seq")
      o.attn_seq = std::stol(next());
    else if (a == "--layers")
      o.layers = std::stol(next());
    else if (a == "--chunk")
      o.chunk = std::stol(next());
    else if (a == "--budget-gib")
      o.budget_gib = std::stod(next());
    else if (a == "--csv")
      o.csv = next();
    else if (a == "--no-model")
      o.model = false;
    else {
      std::fprintf(stderr,
                   "usage: bench_cuda [--seq T] [--attn-seq T] [--layers L] [--chunk C] "
                   "[--budget-gib G] [--csv FILE] [--no-model]\n");
      return 2;
    }
  }
  try {
    report r(o.csv);
    planner(r, o);  // host only
    if (cuda_backend<bf16>::device_count() == 0) {
      std::printf("bench_cuda: no CUDA device: the GPU sections are skipped\n");
    } else {
      const double tflops = gemm_rate(r);
      attention_rate(r, o, tflops);
      if (o.model) model_times(r, o);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
