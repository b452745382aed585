// bench_kernels: Google Benchmark micro-benchmarks of eigen_backend's kernels.
//
//   gemm            C = A B^T style products: 4096x512x512 (a projection), 4096x1536x512 (MLP),
//                   1024x32768x512 (one LM head chunk), 512^3; float and double; "single" runs
//                   one serial Eigen call (the split across threads switched off).
//   attention       causal flash attention at T = 4096, head_dim 64, 8 query / 2 KV heads,
//                   q0 = 0, nk = T: forward, backward, forward+backward; tilings and the two
//                   backward strategies.
//   rmsnorm, xent   RMSNorm (4096 x 512) forward+backward, cross-entropy over a logits chunk
//                   (1024 x 32768) forward+backward.
// Counters: FLOP/s (a rate; attention counts the causal useful work only: forward
// 4*hd*T(T+1)/2*heads, backward 2.5x that, whatever the kernel recomputes) and bytes_per_second.
// Clock (a flag of this program, accepted among Google Benchmark's own flags):
//   --clock=wall (default)  wall-clock time: the throughput of all oneTBB workers together;
//   --clock=cpu             CPU time of the whole process: rates are per CPU-second, i.e. the
//                           per-core efficiency, robust to other load on a shared machine.
// bench/kernels/ratio.sh prints the attention / GEMM ratio of one run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tightfit/backend/eigen.hpp"
#include "tightfit/core/parallel.hpp"

namespace {

using namespace tightfit;

template <class T>
std::vector<T> random_vector(index_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::vector<T> v(static_cast<std::size_t>(n));
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {  // xorshift: fast enough for 10^8 elements, no <random> per element cost
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const double u = static_cast<double>(s >> 11) * 0x1.0p-53;
    x = static_cast<T>(lo + (hi - lo) * u);
  }
  return v;
}

/// Peak bytes allocated through the backend (its scratch: the benchmark's own buffers are not
/// counted). Every benchmark sets it: the CSV reporter wants the first row to name all counters.
void set_peak(benchmark::State& state, const memory_counter& memory) {
  state.counters["peak_MiB"] = static_cast<double>(memory.peak()) / (1024.0 * 1024.0);
}

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

// ---- gemm: C (m, n) = A (m, k) B (n, k)^T ---------------------------------------------------

template <class T>
void bm_gemm(benchmark::State& state, bool split) {
  const index_t m = state.range(0), n = state.range(1), k = state.range(2);
  eigen_backend_options opt;
  if (!split) opt.gemm_parallel_min_flops = std::numeric_limits<double>::infinity();
  eigen_backend<T> be(opt);
  const auto a = random_vector<T>(m * k, 1), b = random_vector<T>(n * k, 2);
  std::vector<T> c(static_cast<std::size_t>(m * n));
  const matrix_view<const T> av(a.data(), m, k), bv(b.data(), n, k);
  const matrix_view<T> cv(c.data(), m, n);
  be.gemm(transpose::no, transpose::yes, T(1), av, bv, T(0), cv);  // warm-up (threads, caches)
  for (auto _ : state) {
    be.gemm(transpose::no, transpose::yes, T(1), av, bv, T(0), cv);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  set_peak(state, be.memory());
  state.SetBytesProcessed(state.iterations() * (m * k + n * k + m * n) *
                          static_cast<std::int64_t>(sizeof(T)));
}

template <class T>
void bm_gemm_split(benchmark::State& state) {
  bm_gemm<T>(state, true);
}
template <class T>
void bm_gemm_single(benchmark::State& state) {
  bm_gemm<T>(state, false);
}

// ---- attention --------------------------------------------------------------------------------

enum class attention_pass { forward, backward, both };

/// Useful flops of one forward: 4 hd per visible (query, key) pair per head (causal, or within
/// a sliding window of w keys when w > 0).
double attention_forward_flops(index_t t, index_t heads, index_t hd, index_t w = 0) {
  double pairs = 0;
  for (index_t p = 0; p < t; ++p) pairs += static_cast<double>(w > 0 ? std::min(p + 1, w) : p + 1);
  return 4.0 * static_cast<double>(hd) * pairs * static_cast<double>(heads);
}

template <class T>
void bm_attention(benchmark::State& state, attention_pass pass, index_t window = 0) {
  const index_t t = state.range(0);
  const attention_shape shape{8, 2, 64};
  eigen_backend_options opt;
  opt.attention_tile_q = state.range(1);
  opt.attention_tile_k = state.range(2);
  opt.attention_backward = state.range(3) == 0 ? attention_backward_strategy::thread_partials
                                               : attention_backward_strategy::two_pass;
  eigen_backend<T> be(opt);
  const index_t qw = shape.heads * shape.head_dim, kw = shape.kv_heads * shape.head_dim;
  const auto q = random_vector<T>(t * qw, 3), k = random_vector<T>(t * kw, 4),
             v = random_vector<T>(t * kw, 5), d_o = random_vector<T>(t * qw, 6);
  std::vector<T> o(q.size()), lse(static_cast<std::size_t>(t * shape.heads)), dq(q.size()),
      dk(k.size()), dv(v.size());
  const T scale = T(0.125);  // 1 / sqrt(64)
  const matrix_view<const T> qv(q.data(), t, qw), kv(k.data(), t, kw), vv(v.data(), t, kw),
      dov(d_o.data(), t, qw);
  auto forward = [&] {
    be.attention_forward(shape, qv, kv, vv, {0, t, window}, scale, matrix_view<T>(o.data(), t, qw),
                         matrix_view<T>(lse.data(), t, shape.heads));
  };
  auto backward = [&] {
    be.attention_backward(shape, qv, kv, vv, matrix_view<const T>(o.data(), t, qw), dov,
                          matrix_view<const T>(lse.data(), t, shape.heads), {0, t, window}, scale,
                          matrix_view<T>(dq.data(), t, qw), matrix_view<T>(dk.data(), t, kw),
                          matrix_view<T>(dv.data(), t, kw));
  };
  forward();
  for (auto _ : state) {
    if (pass != attention_pass::backward) forward();
    if (pass != attention_pass::forward) backward();
    benchmark::ClobberMemory();
  }
  const double fwd = attention_forward_flops(t, shape.heads, shape.head_dim, window);
  const double flops = pass == attention_pass::forward    ? fwd
                       : pass == attention_pass::backward ? 2.5 * fwd
                                                          : 3.5 * fwd;
  set_flops(state, flops);
  set_peak(state, be.memory());
}

template <class T>
void bm_attention_forward(benchmark::State& state) {
  bm_attention<T>(state, attention_pass::forward);
}
template <class T>
void bm_attention_backward(benchmark::State& state) {
  bm_attention<T>(state, attention_pass::backward);
}
template <class T>
void bm_attention_both(benchmark::State& state) {
  bm_attention<T>(state, attention_pass::both);
}
/// Forward + backward under a sliding window of range(4) keys (tiles outside it are skipped).
template <class T>
void bm_attention_window(benchmark::State& state) {
  bm_attention<T>(state, attention_pass::both, state.range(4));
}

// ---- RMSNorm and cross-entropy -------------------------------------------------------------

template <class T>
void bm_rmsnorm(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  eigen_backend<T> be;
  const auto x = random_vector<T>(n * d, 7), dy = random_vector<T>(n * d, 8);
  const auto w = random_vector<T>(d, 9, 0.5, 1.5);
  std::vector<T> y(x.size()), dx(x.size()), rstd(static_cast<std::size_t>(n)),
      dw(static_cast<std::size_t>(d));
  const matrix_view<const T> xv(x.data(), n, d);
  be.rmsnorm_forward(xv, w, T(1e-6), matrix_view<T>(y.data(), n, d), rstd);  // warm-up
  for (auto _ : state) {
    be.rmsnorm_forward(xv, w, T(1e-6), matrix_view<T>(y.data(), n, d), rstd);
    be.rmsnorm_backward(xv, w, rstd, matrix_view<const T>(dy.data(), n, d),
                        matrix_view<T>(dx.data(), n, d), dw);
    benchmark::ClobberMemory();
  }
  // forward reads x, writes y; backward reads x, dy, reads and writes dx
  state.SetBytesProcessed(state.iterations() * 6 * n * d * static_cast<std::int64_t>(sizeof(T)));
  set_peak(state, be.memory());
}

template <class T>
void bm_xent(benchmark::State& state) {
  const index_t n = state.range(0), vocab = state.range(1);
  eigen_backend<T> be;
  const auto logits0 = random_vector<T>(n * vocab, 10, -10, 10);
  std::vector<T> logits = logits0, lse(static_cast<std::size_t>(n)), lp(lse.size()),
                 coeff(lse.size(), T(1) / static_cast<T>(n));
  std::vector<token_id> labels(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = (i * 7919) % vocab;
  const matrix_view<T> lv(logits.data(), n, vocab);
  be.xent_forward(lv, labels, T(1), lse, lp);  // warm-up
  for (auto _ : state) {
    be.xent_forward(lv, labels, T(1), lse, lp);
    be.xent_backward(lv, labels, lse, coeff, T(1));  // in place: the next forward sees gradients,
    benchmark::ClobberMemory();                      // same cost
  }
  // forward reads the chunk twice (max, sum), backward reads and writes it once
  set_peak(state, be.memory());
  state.SetBytesProcessed(state.iterations() * 4 * n * vocab *
                          static_cast<std::int64_t>(sizeof(T)));
}
bool cpu_clock = false;

/// The clock of every benchmark, plus a "max" statistic over repetitions (the best rate when
/// other processes share the machine).
benchmark::internal::Benchmark* timed(benchmark::internal::Benchmark* b) {
  b->ComputeStatistics("max", [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  });
  if (cpu_clock) return b->MeasureProcessCPUTime();
  return b->UseRealTime();
}

void register_all() {
  using benchmark::RegisterBenchmark;
  const std::vector<std::vector<std::int64_t>> gemm_shapes = {
      {4096, 512, 512}, {4096, 1536, 512}, {1024, 32768, 512}, {512, 512, 512}};
  auto gemm = [&](const char* name, auto fn) {
    auto* b = RegisterBenchmark(name, fn)->ArgNames({"m", "n", "k"});
    for (const auto& shape : gemm_shapes) b->Args(shape);
    timed(b->Unit(benchmark::kMillisecond));
  };
  gemm("gemm<float>", bm_gemm_split<float>);
  gemm("gemm_single<float>", bm_gemm_single<float>);
  gemm("gemm<double>", bm_gemm_split<double>);
  gemm("gemm_single<double>", bm_gemm_single<double>);

  // attention: T, tile_q, tile_k, strategy (0 thread_partials, 1 two_pass)
  const eigen_backend_options opt;  // the backend's default tiles
  const std::vector<std::int64_t> defaults = {4096, opt.attention_tile_q, opt.attention_tile_k, 0};
  auto attention = [&](const std::string& name, auto fn) {
    return RegisterBenchmark(name.c_str(), fn)->ArgNames({"T", "tq", "tk", "two_pass"});
  };
  timed(attention("attention_fwd_bwd<float>", bm_attention_both<float>)
            ->Args(defaults)
            ->Unit(benchmark::kMillisecond));
  timed(attention("attention_fwd<float>", bm_attention_forward<float>)
            ->Args(defaults)
            ->Unit(benchmark::kMillisecond));
  timed(attention("attention_bwd<float>", bm_attention_backward<float>)
            ->Args(defaults)
            ->Unit(benchmark::kMillisecond));
  // sliding windows (Mistral, Qwen2): the work, and so the time, drops to about T W
  timed(RegisterBenchmark("attention_fwd_bwd_window<float>", bm_attention_window<float>)
            ->ArgNames({"T", "tq", "tk", "two_pass", "W"})
            ->Args({4096, opt.attention_tile_q, opt.attention_tile_k, 0, 512})
            ->Args({4096, opt.attention_tile_q, opt.attention_tile_k, 0, 128})
            ->Unit(benchmark::kMillisecond));
  auto* tune = attention("tune/attention_fwd_bwd<float>", bm_attention_both<float>);
  for (const auto& [tq, tk] : {std::pair<int, int>{16, 64},
                               {32, 64},
                               {32, 128},
                               {64, 64},
                               {64, 128},
                               {128, 64},
                               {128, 128}}) {
    tune->Args({4096, tq, tk, 0});
  }
  tune->Args({4096, opt.attention_tile_q, opt.attention_tile_k, 1});
  timed(tune->Unit(benchmark::kMillisecond));

  timed(RegisterBenchmark("rmsnorm_fwd_bwd<float>", bm_rmsnorm<float>)
            ->ArgNames({"n", "d"})
            ->Args({4096, 512})
            ->Unit(benchmark::kMicrosecond));
  timed(RegisterBenchmark("xent_fwd_bwd<float>", bm_xent<float>)
            ->ArgNames({"n", "V"})
            ->Args({1024, 32768})
            ->Unit(benchmark::kMillisecond));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--clock=cpu") == 0) {
      cpu_clock = true;
    } else if (std::strcmp(argv[i], "--clock=wall") != 0) {
      args.push_back(argv[i]);
    }
  }
  int count = static_cast<int>(args.size());
  register_all();
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::AddCustomContext(
      "clock", cpu_clock ? "process CPU time (rates per CPU-second)" : "wall-clock time");
  benchmark::AddCustomContext("threads", std::to_string(concurrency()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
