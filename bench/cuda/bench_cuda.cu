// bench_cuda: the GPU benchmark of the CUDA backend (run by scripts/gpu-check on one GPU).
//
// A Qwen3-4B-shaped model (hidden 2560, 32/8 heads, head_dim 128, intermediate 9728, vocab
// 151936, tied embeddings), bf16 storage, weights set on the device (fill_weights: a host draw
// of 4e9 normals would take minutes; values change neither time nor memory), random tokens:
//  1. the cuBLAS bf16 GEMM rate (8192^3, fp32 accumulation), the yardstick of this run;
//  2. causal flash attention forward + backward (32/8 heads, head_dim 128) at --attn-seq,
//     GFLOP/s (FlashAttention's count: 4 hd flops per visible (query, key, head) forward,
//     10 hd backward) and its fraction of the GEMM rate, per engine: the tensor-core kernels
//     (atomic and deterministic dQ; head_dim 64 too) and the CUDA-core kernels, then the
//     tensor cores' O, dQ, dK, dV against the CUDA cores' at that T;
//  3. the longest T whose activations fit --budget-gib with each schedule, from the memory
//     planner's dry run (meta_backend<float>, bytes halved for bf16 storage; bf16 parameters
//     and gradients subtracted from the budget first);
//  4. one SFT gradient at T = --seq with checkpoint and with stream (--chunk), on --layers
//     layers (36 is the real model; fewer to fit a time budget): seconds, counted activation
//     and device peaks, the memory pool's high-water mark and cudaMemGetInfo;
//  5. with --full-depth: the 36-layer model at the planner's longest stream T (a window of
//     --probe-window keys keeps it to GEMM time), its measured device peak against the plan.
// Prints a table; --csv FILE writes section,name,value,unit rows (each as soon as measured).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <utility>
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
  std::string sections = "plan,gemm,attention,model";  ///< and depth (the 36-layer probe)
  bool cuda_core_attention = true;  ///< also time the CUDA-core attention (about 3 s at 8192)
  index_t full_seq = 0;             ///< its T (0: the planner's longest stream T)
  index_t probe_window = 512;       ///< its attention window (0: full causal attention)
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

/// max |a - b| / max |b| over two bf16 host copies.
double rel_diff(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  double num = 0, den = 1e-30;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num = std::isfinite(x) ? std::max(num, std::abs(x - y)) : INFINITY;
    den = std::max(den, std::abs(y));
  }
  return num / den;
}

/// Attention forward + backward at T = --attn-seq, causal, 32/8 heads: the tensor-core kernels
/// (atomic dQ, then deterministic dQ; head_dim 128, then 64) and the CUDA-core kernels on the
/// same inputs; then the engines' O, dQ, dK, dV against the CUDA cores' (max relative
/// difference), a large-T correctness cross-check beside the unit tests' small cases.
void attention_rate(report& r, const options& o, double gemm_tflops) {
  struct engine_run {
    std::string name;
    attention_engine engine;
    bool deterministic;
    index_t hd;
    int reps;
  };
  const std::vector<engine_run> runs = {
      {"tensor cores", attention_engine::tensor_cores, false, 128, 5},
      {"tensor cores deterministic", attention_engine::tensor_cores, true, 128, 3},
      {"tensor cores hd 64", attention_engine::tensor_cores, false, 64, 3},
      {"cuda cores", attention_engine::cuda_cores, true, 128, o.cuda_core_attention ? 1 : 0}};
  const index_t t = o.attn_seq;
  std::vector<std::vector<bf16>> results[2];  // hd 128: tensor cores, cuda cores: O dQ dK dV
  for (const auto& e : runs) {
    if (e.reps == 0) continue;
    cuda_backend<bf16> be(cuda_backend_options{0, false, e.deterministic, e.engine});
    const attention_shape shape{32, 8, e.hd};
    const index_t qc = 32 * e.hd, kc = 8 * e.hd;
    auto q = random_buffer(be, t * qc, 3), k = random_buffer(be, t * kc, 4),
         v = random_buffer(be, t * kc, 5), dout = random_buffer(be, t * qc, 6);
    auto out = be.allocate<bf16>(t * qc);
    auto lse = be.allocate<float>(t * 32);  // fp32 statistics
    auto dq = be.allocate<bf16>(t * qc), dk = be.allocate<bf16>(t * kc),
         dv = be.allocate<bf16>(t * kc);
    const float scale = 1.f / std::sqrt(static_cast<float>(e.hd));
    auto forward = [&] {
      be.attention_forward(shape, q.view(t, qc), k.view(t, kc), v.view(t, kc), {0, t}, scale,
                           out.view(t, qc), lse.view(t, 32));
    };
    auto backward = [&] {
      be.attention_backward(shape, q.view(t, qc), k.view(t, kc), v.view(t, kc), out.view(t, qc),
                            dout.view(t, qc), lse.view(t, 32), {0, t}, scale, dq.view(t, qc),
                            dk.view(t, kc), dv.view(t, kc));
    };
    be.stats().reset();
    const double fwd = time_gpu(be, e.reps, forward);
    const double fwd_flops = be.stats().attention_flops / (e.reps + 1);  // warm-up + reps
    be.stats().reset();
    const double bwd = time_gpu(be, e.reps, backward);
    const double bwd_flops = be.stats().attention_flops / (e.reps + 1);
    const double gflops = (fwd_flops + bwd_flops) / (fwd + bwd) / 1e9;
    const std::string tag = e.name + " T=" + std::to_string(t);
    r.add("attention", tag + " forward seconds", fwd, "s");
    r.add("attention", tag + " backward seconds", bwd, "s");
    r.add("attention", tag + " forward rate", fwd_flops / fwd / 1e9, "GFLOP/s");
    r.add("attention", tag + " backward rate", bwd_flops / bwd / 1e9, "GFLOP/s");
    r.add("attention", tag + " forward+backward rate", gflops, "GFLOP/s");
    r.add("attention", tag + " fraction of the cuBLAS bf16 GEMM rate", gflops / (gemm_tflops * 1e3),
          "ratio");
    if (e.engine == attention_engine::tensor_cores && !e.deterministic && e.hd == 128)
      r.add("attention", "fraction of the cuBLAS bf16 GEMM rate", gflops / (gemm_tflops * 1e3),
            "ratio");
    if (e.hd != 128 || (e.engine == attention_engine::tensor_cores && e.deterministic)) continue;
    // one clean backward for the cross-check
    be.fill(dq.view(t, qc), 0.f);
    be.fill(dk.view(t, kc), 0.f);
    be.fill(dv.view(t, kc), 0.f);
    forward();
    backward();
    auto& res = results[e.engine == attention_engine::tensor_cores ? 0 : 1];
    for (auto* b : {&out, &dq, &dk, &dv}) {
      std::vector<bf16> h(static_cast<std::size_t>(b->size()));
      be.download(std::span<const bf16>(b->span()), std::span<bf16>(h));
      res.push_back(std::move(h));
    }
  }
  if (results[0].empty() || results[1].empty()) return;
  const char* names[] = {"O", "dQ", "dK", "dV"};
  for (int i = 0; i < 4; ++i)
    r.add(
        "attention", std::string("tensor cores vs cuda cores max rel diff ") + names[i],
        rel_diff(results[0][static_cast<std::size_t>(i)], results[1][static_cast<std::size_t>(i)]),
        "ratio");
}

/// The device's memory high-water marks since reset(): the stream-ordered pool's used and
/// reserved bytes, and cudaMemGetInfo's used bytes now (the pool keeps what it reserved).
struct device_peaks {
  cudaMemPool_t pool = nullptr;
  explicit device_peaks(int device) {
    detail::cuda_check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  }
  void reset() {
    detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    detail::cuda_check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
    std::uint64_t zero = 0;
    detail::cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero),
                       "cudaMemPoolSetAttribute");
    detail::cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero),
                       "cudaMemPoolSetAttribute");
  }
  double used_high() const { return attr(cudaMemPoolAttrUsedMemHigh); }
  double reserved_high() const { return attr(cudaMemPoolAttrReservedMemHigh); }
  static double meminfo_used() {
    std::size_t free = 0, total = 0;
    detail::cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return static_cast<double>(total - free);
  }

 private:
  double attr(cudaMemPoolAttr a) const {
    std::uint64_t v = 0;
    detail::cuda_check(cudaMemPoolGetAttribute(pool, a, &v), "cudaMemPoolGetAttribute");
    return static_cast<double>(v);
  }
};

model_config qwen3_4b(index_t layers) {
  model_config c = preset_config("qwen3-4b");
  c.num_hidden_layers = layers;
  return c;
}

/// The planner's longest T per schedule at --budget-gib; returns the stream plan (T, chunk).
std::pair<index_t, index_t> planner(report& r, const options& o) {
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
  if (activations <= 0) return {0, 0};
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
  return {p.max_seq_stream, p.stream_chunk};
}

/// Random token ids and targets of one sequence of length t.
token_batch random_batch(const model_config& cfg, index_t t, std::vector<token_id>& ids,
                         std::vector<token_id>& targets) {
  std::mt19937_64 g(9);
  std::uniform_int_distribution<token_id> tok(0, cfg.vocab_size - 1);
  ids.resize(static_cast<std::size_t>(t));
  targets.resize(ids.size());
  for (auto& x : ids) x = tok(g);
  for (auto& x : targets) x = tok(g);
  return token_batch{1, t, ids, targets, {}};
}

/// Every weight set on the device: norms 1, the rest small values alternating by tensor. The
/// step's time and memory do not depend on the values, and init_random's host draw of 4e9
/// normals would take minutes at 36 layers; the loss is then about log(vocab).
void fill_weights(cuda_backend<bf16>& be, llama_model<cuda_backend<bf16>>& model) {
  auto& p = model.parameters();
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto v = p.value(i);
    const bool norm = p.name(i).find("norm") != std::string::npos;
    be.fill(matrix_view<bf16>(v.data(), 1, static_cast<index_t>(v.size())),
            norm ? 1.f : (i % 2 == 0 ? 0.02f : -0.015f));
  }
}

/// One SFT gradient on a fresh bf16 model: seconds, loss and the memory figures, reported
/// under `tag`.
void one_step(report& r, const std::string& section, const std::string& tag,
              const model_config& cfg, index_t t, backward_schedule sched, index_t chunk,
              double* seconds = nullptr) {
  std::vector<token_id> ids, targets;
  const token_batch batch = random_batch(cfg, t, ids, targets);
  device_peaks peaks(0);
  peaks.reset();
  cuda_backend<bf16> be;
  llama_model<cuda_backend<bf16>> model(be, cfg);
  fill_weights(be, model);
  sft_loss loss;
  backward_options opt;
  opt.sched = sched;
  opt.chunk = chunk;
  be.synchronize();
  const double t0 = now();
  const auto res = compute_gradients(model, batch, loss, opt);
  be.synchronize();
  const double s = now() - t0;
  if (seconds != nullptr) *seconds = s;
  r.add(section, tag + " seconds", s, "s");
  r.add(section, tag + " activation peak", static_cast<double>(res.peak_activation_bytes) / 1e9,
        "GB");
  r.add(section, tag + " counted device peak (parameters, gradients, activations)",
        static_cast<double>(be.memory().peak()) / 1e9, "GB");
  r.add(section, tag + " memory pool used high-water", peaks.used_high() / 1e9, "GB");
  r.add(section, tag + " memory pool reserved high-water", peaks.reserved_high() / 1e9, "GB");
  r.add(section, tag + " cudaMemGetInfo used after", device_peaks::meminfo_used() / 1e9, "GB");
  r.add(section, tag + " loss", res.loss, "nats");
  r.add(section, tag + " tensor-core attention calls",
        static_cast<double>(be.tensor_core_attention_calls()), "count");
}

void model_times(report& r, const options& o) {
  const model_config cfg = qwen3_4b(o.layers);
  double times[2] = {0, 0};
  const backward_schedule schedules[2] = {backward_schedule::checkpoint, backward_schedule::stream};
  for (int s = 0; s < 2; ++s) {
    const std::string tag = std::string(to_string(schedules[s])) + " T=" + std::to_string(o.seq) +
                            " layers=" + std::to_string(o.layers);
    one_step(r, "model", tag, cfg, o.seq, schedules[s],
             schedules[s] == backward_schedule::stream ? o.chunk : o.seq, &times[s]);
  }
  r.add("model", "stream / checkpoint time", times[1] / times[0], "ratio");
}

/// The full-depth probe: the 36-layer Qwen3-4B shape at the planner's longest stream T for
/// --budget-gib (or --full-seq), stream with the planner's chunk, its measured device peak
/// against the plan. With --probe-window W > 0 every layer attends a window of W keys, which
/// changes no buffer (the planner's bytes do not depend on it) and turns the T^2 attention into
/// T W, so the probe costs GEMM time only (about 30 s at 348k tokens on an H200, estimated);
/// its seconds are not a training step's.
void full_depth(report& r, const options& o, std::pair<index_t, index_t> plan) {
  model_config cfg = qwen3_4b(36);
  const index_t t = o.full_seq > 0 ? o.full_seq : plan.first;
  const index_t chunk = plan.second > 0 ? plan.second : o.chunk;
  if (t <= 0) return;
  sft_loss loss;
  backward_options opt;
  opt.sched = backward_schedule::stream;
  opt.chunk = chunk;
  const double predicted =
      static_cast<double>(predict_peak_activation_bytes<float>(cfg, 1, t, opt, loss)) / 2;
  const std::string tag = "36 layers stream T=" + std::to_string(t) +
                          " chunk=" + std::to_string(chunk) +
                          " window=" + std::to_string(o.probe_window);
  r.add("depth", tag + " planned activation bytes (bf16)", predicted / 1e9, "GB");
  cfg.sliding_window = o.probe_window;
  one_step(r, "depth", tag, cfg, t, backward_schedule::stream, chunk);
  r.add("depth", "budget", o.budget_gib * 1024 * 1024 * 1024 / 1e9, "GB");
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
      o.sections = "plan,gemm,attention";
    else if (a == "--sections")
      o.sections = next();
    else if (a == "--no-cuda-core-attention")
      o.cuda_core_attention = false;
    else if (a == "--full-depth")
      o.sections += ",depth";
    else if (a == "--full-seq")
      o.full_seq = std::stol(next());
    else if (a == "--probe-window")
      o.probe_window = std::stol(next());
    else {
      std::fprintf(stderr,
                   "usage: bench_cuda [--seq T] [--attn-seq T] [--layers L] [--chunk C] "
                   "[--budget-gib G] [--csv FILE] [--no-model] [--sections plan,gemm,attention,"
                   "model,depth] [--no-cuda-core-attention] [--full-depth] [--full-seq T] "
                   "[--probe-window W]\n");
      return 2;
    }
  }
  try {
    report r(o.csv);
    auto has = [&](const std::string& s) {
      return ("," + o.sections + ",").find("," + s + ",") != std::string::npos;
    };
    // host only; the depth probe needs the plan
    const auto plan = has("plan") || has("depth") ? planner(r, o) : std::pair<index_t, index_t>{};
    if (cuda_backend<bf16>::device_count() == 0) {
      std::printf("bench_cuda: no CUDA device: the GPU sections are skipped\n");
    } else {
      const double tflops = has("gemm") || has("attention") ? gemm_rate(r) : 0;
      if (has("attention")) attention_rate(r, o, tflops);
      if (has("model")) model_times(r, o);
      if (has("depth")) full_depth(r, o, plan);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
