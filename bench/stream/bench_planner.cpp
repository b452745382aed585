// bench_planner: the memory planner's cost (stream/planner.hpp): one plan_memory call per preset
// at T up to 2^21 and budgets from 1 byte to 64 GiB. The closed form (stream/peak_model.hpp)
// makes it independent of T; before it, qwen3-4b at T = 32768 and 1 byte took 95 s.
//   bench_planner --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstddef>
#include <string>

#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/stream/planner.hpp"

namespace {

void plan(benchmark::State& state, const std::string& preset, tightfit::index_t seq,
          std::size_t budget) {
  const tightfit::model_config cfg = tightfit::preset_config(preset);
  for (auto _ : state) {
    const auto p = tightfit::plan_memory<float>(cfg, 1, seq, budget, tightfit::sft_loss{}, 512,
                                                tightfit::index_t{1} << 22);
    benchmark::DoNotOptimize(p.max_seq_stream);
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (const std::string& preset : tightfit::preset_names())
    for (const tightfit::index_t seq : {tightfit::index_t{32768}, tightfit::index_t{1} << 21})
      for (const std::size_t budget : {std::size_t{1}, std::size_t{1} << 30, std::size_t{64} << 30})
        benchmark::RegisterBenchmark(
            ("plan/" + preset + "/T:" + std::to_string(seq) + "/budget:" + std::to_string(budget))
                .c_str(),
            plan, preset, seq, budget)
            ->Unit(benchmark::kMillisecond)
            ->MeasureProcessCPUTime();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
