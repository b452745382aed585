// bench_dist: what data-parallel training costs on the wire, per step and per rank, run under
// `mpirun -np N` (bench/distributed/run.sh runs N = 1, 2, 4 and prints the table of
// docs/distributed.md).
//
//   mpirun -np N bench_dist [--preset qwen3-bench] [--seq 512] [--batch 1] [--chunk 128]
//                           [--steps 3] [--active-layer L]   (BAdam: only layer L trains)
//
// Every rank runs step_gradients (distributed/data_parallel.hpp) on its own random batch with
// eigen_backend<float>; rank 0 prints one CSV line: ranks, mode, payload bytes per step and rank,
// messages per step, gradient reductions per step, backward seconds, seconds blocked on the
// reductions after the last layer's backward, and peak activation bytes (mean over the timed
// steps, the slowest rank). On a 2-core machine several ranks share cores: read bytes, messages
// and the wait share, not speed-ups.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tightfit/backend/eigen.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/distributed/mpi_communicator.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/presets.hpp"

using namespace tightfit;

namespace {

struct options {
  std::string preset = "qwen3-bench";
  index_t seq = 512, batch = 1, chunk = 128, steps = 3, active_layer = -1;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    check(i + 1 < argc, "bench_dist: ", key, " needs a value");
    const std::string value = argv[++i];
    auto count = [&] {
      const long long v = std::stoll(value);
      check(v >= 0 && v <= (1LL << 30), "bench_dist: ", key, " is ", value);
      return static_cast<index_t>(v);
    };
    if (key == "--preset")
      o.preset = value;
    else if (key == "--seq")
      o.seq = count();
    else if (key == "--batch")
      o.batch = count();
    else if (key == "--chunk")
      o.chunk = count();
    else if (key == "--steps")
      o.steps = count();
    else if (key == "--active-layer")
      o.active_layer = count();
    else
      fail("bench_dist: unknown option ", key);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  mpi_environment env(&argc, &argv);
  mpi_communicator comm;
  try {
    const options o = parse(argc, argv);
    const model_config cfg = preset_config(o.preset);
    eigen_backend<float> be;
    llama_model<eigen_backend<float>> model(be, cfg);
    model.init_random(1);
    // This rank's batch: its own random tokens.
    std::mt19937_64 gen(1000 + static_cast<std::uint64_t>(comm.rank()));
    std::uniform_int_distribution<token_id> tok(0, static_cast<token_id>(cfg.vocab_size - 1));
    std::vector<token_id> ids(static_cast<std::size_t>(o.batch * o.seq));
    for (auto& id : ids) id = tok(gen);
    const std::vector<token_id> targets = shift_labels(ids, o.batch, o.seq);
    const token_batch batch{o.batch, o.seq, ids, targets, {}};

    backward_options opt;
    opt.sched = backward_schedule::stream;
    opt.chunk = o.chunk;
    if (o.active_layer >= 0) {
      check(o.active_layer < cfg.num_hidden_layers, "bench_dist: --active-layer is ",
            o.active_layer, ", the model has ", cfg.num_hidden_layers, " layers");
      opt.layer_weight_grads.assign(static_cast<std::size_t>(cfg.num_hidden_layers), false);
      opt.layer_weight_grads[static_cast<std::size_t>(o.active_layer)] = true;
      opt.head_grad = false;
      opt.embedding_grad = false;
    }
    // [bytes, messages, reductions, backward s, wait s, peak activation bytes] summed over the
    // timed steps (the first step is a warm-up).
    double sums[6] = {0, 0, 0, 0, 0, 0};
    for (index_t step = 0; step <= o.steps; ++step) {
      model.parameters().zero_grads();
      sft_loss loss;
      data_parallel_stats st;
      const auto before = comm.stats();
      const backward_result r = data_parallel_gradients(model, batch, loss, opt, comm, &st);
      if (step == 0) continue;
      sums[0] += static_cast<double>(comm.stats().bytes - before.bytes);
      sums[1] += static_cast<double>(comm.stats().messages() - before.messages());
      sums[2] += static_cast<double>(st.gradient_reductions);
      sums[3] += r.seconds;
      sums[4] += st.wait_seconds;
      sums[5] += static_cast<double>(r.peak_activation_bytes);
    }
    std::vector<double> all(static_cast<std::size_t>(6 * comm.size()));
    comm.all_gather(std::span<const double>(sums), std::span<double>(all));
    if (comm.rank() == 0) {
      double worst[6] = {0, 0, 0, 0, 0, 0};
      for (int r = 0; r < comm.size(); ++r)
        for (int k = 0; k < 6; ++k)
          worst[k] = std::max(worst[k], all[static_cast<std::size_t>(6 * r + k)]);
      const double n = static_cast<double>(o.steps);
      std::printf("%d,%s,%.0f,%.1f,%.1f,%.3f,%.4f,%.0f\n", comm.size(),
                  o.active_layer >= 0 ? "badam" : "full", worst[0] / n, worst[1] / n, worst[2] / n,
                  worst[3] / n, worst[4] / n, worst[5] / n);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dist (rank %d): %s\n", comm.rank(), e.what());
    comm.abort(1);
  }
  return 0;
}
