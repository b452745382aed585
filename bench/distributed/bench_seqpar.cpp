// bench_seqpar: what sequence-parallel StreamBP (distributed/sequence_parallel.hpp) holds and sends
// per rank, run under `mpirun -np N` (bench/distributed/run_seqpar.sh runs N = 1, 2, 4 and prints
// the table of docs/distributed.md).
//
//   mpirun -np N bench_seqpar [--preset qwen3-bench] [--seq 1024] [--chunk 128]
//                             [--assignment zigzag|contiguous] [--one-process 1]
//   bench_seqpar --dry-ranks N [--seq T] ...   (one process, no MPI traffic)
//
// One sequence of T random tokens, the same on every rank, SFT, eigen_backend<float>, stream
// schedule. With --one-process 1 (and one rank) it runs compute_gradients instead: the
// single-process peak the ranks' peaks are compared with. Rank 0 prints one CSV line: ranks,
// assignment, T, peak activation bytes (the largest over the ranks), attention work of the
// busiest rank over the mean, payload bytes per rank (the largest), messages per rank, seconds
// (the slowest rank; on a 2-core machine ranks share cores, so not a speed-up).
//
// --dry-ranks N: the peaks of every rank of N and of one process by dry runs on meta_backend
// (backend/meta.hpp: every allocation counted, nothing computed) with a communicator that
// moves nothing: the bytes a rank holds do not depend on the values, so this gives each rank's
// exact peak at any T in milliseconds (the real runs above check it to the byte). Prints: dry,
// N, assignment, T, the largest rank's peak, the one-process peak, their ratio.
#include <algorithm>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tightfit/backend/eigen.hpp"
#include "tightfit/backend/meta.hpp"
#include "tightfit/distributed/mpi_communicator.hpp"
#include "tightfit/distributed/sequence_parallel.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/presets.hpp"

using namespace tightfit;

namespace {

struct options {
  std::string preset = "qwen3-bench";
  index_t seq = 1024, chunk = 128;
  sequence_assignment assignment = sequence_assignment::zigzag;
  bool one_process = false;
  int dry_ranks = 0;
};

/// Rank `rank` of `size` that moves nothing (dry runs: the memory does not depend on values).
class dry_communicator {
 public:
  struct request {
    void wait() {}
    bool done() { return true; }
  };
  dry_communicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const { return rank_; }
  int size() const { return size_; }
  template <class T>
  request all_reduce_sum(std::span<T>) {
    ++stats_.all_reduce_calls;
    return {};
  }
  template <class T>
  void all_gather(std::span<const T>, std::span<T>) {
    ++stats_.all_gather_calls;
  }
  template <class T>
  void reduce_scatter_sum(std::span<const T>, std::span<T>) {
    ++stats_.reduce_scatter_calls;
  }
  template <class T>
  void broadcast(std::span<T>, int) {
    ++stats_.broadcast_calls;
  }
  template <class T>
  void ring_shift(std::span<const T>, std::span<T>) {
    ++stats_.ring_shift_calls;
  }
  void barrier() {}
  comm_stats& stats() { return stats_; }

 private:
  int rank_ = 0, size_ = 1;
  comm_stats stats_;
};
static_assert(Communicator<dry_communicator>);

/// The dry-run table line (see the top comment).
void dry_run(const options& o, const model_config& cfg, const token_batch& batch,
             const backward_options& opt) {
  std::size_t worst = 0;
  for (int r = 0; r < o.dry_ranks; ++r) {
    meta_backend<float> be;
    llama_model<meta_backend<float>> model(be, cfg);
    dry_communicator comm(r, o.dry_ranks);
    sft_loss loss;
    const backward_result res =
        sequence_parallel_gradients(model, batch, loss, opt, comm, {o.assignment});
    worst = std::max(worst, res.peak_activation_bytes);
  }
  meta_backend<float> be;
  llama_model<meta_backend<float>> model(be, cfg);
  sft_loss loss;
  const std::size_t one = compute_gradients(model, batch, loss, opt).peak_activation_bytes;
  std::printf("dry,%d,%s,%lld,%zu,%zu,%.3f\n", o.dry_ranks, to_string(o.assignment),
              static_cast<long long>(o.seq), worst, one,
              static_cast<double>(worst) / static_cast<double>(one));
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    check(i + 1 < argc, "bench_seqpar: ", key, " needs a value");
    const std::string value = argv[++i];
    auto count = [&] {
      const long long v = std::stoll(value);
      check(v >= 0 && v <= (1LL << 30), "bench_seqpar: ", key, " is ", value);
      return static_cast<index_t>(v);
    };
    if (key == "--preset")
      o.preset = value;
    else if (key == "--seq")
      o.seq = count();
    else if (key == "--chunk")
      o.chunk = count();
    else if (key == "--assignment")
      o.assignment = parse_sequence_assignment(value);
    else if (key == "--one-process")
      o.one_process = count() != 0;
    else if (key == "--dry-ranks")
      o.dry_ranks = static_cast<int>(count());
    else
      fail("bench_seqpar: unknown option ", key);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--dry-ranks") {  // one process, no MPI
      try {
        const options o = parse(argc, argv);
        const model_config cfg = preset_config(o.preset);
        std::vector<token_id> ids(static_cast<std::size_t>(o.seq), 1);
        const std::vector<token_id> targets = shift_labels(ids, 1, o.seq);
        backward_options opt;
        opt.sched = backward_schedule::stream;
        opt.chunk = o.chunk;
        dry_run(o, cfg, token_batch{1, o.seq, ids, targets, {}}, opt);
        return 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_seqpar: %s\n", e.what());
        return 1;
      }
    }
  mpi_environment env(&argc, &argv);
  mpi_communicator comm;
  try {
    const options o = parse(argc, argv);
    check(!o.one_process || comm.size() == 1, "bench_seqpar: --one-process needs one rank");
    const model_config cfg = preset_config(o.preset);
    eigen_backend<float> be;
    llama_model<eigen_backend<float>> model(be, cfg);
    model.init_random(1);
    std::mt19937_64 gen(1000);
    std::uniform_int_distribution<token_id> tok(0, static_cast<token_id>(cfg.vocab_size - 1));
    std::vector<token_id> ids(static_cast<std::size_t>(o.seq));
    for (auto& id : ids) id = tok(gen);
    const std::vector<token_id> targets = shift_labels(ids, 1, o.seq);
    const token_batch batch{1, o.seq, ids, targets, {}};
    backward_options opt;
    opt.sched = backward_schedule::stream;
    opt.chunk = o.chunk;
    sft_loss loss;
    // [peak activation bytes, attention flops, payload bytes, messages, seconds]
    double mine[5] = {0, 0, 0, 0, 0};
    if (o.one_process) {
      const backward_result r = compute_gradients(model, batch, loss, opt);
      mine[0] = static_cast<double>(r.peak_activation_bytes);
      mine[1] = be.stats().attention_flops;
      mine[4] = r.seconds;
    } else {
      sequence_parallel_stats st;
      const auto before = comm.stats();
      const backward_result r =
          sequence_parallel_gradients(model, batch, loss, opt, comm, {o.assignment}, &st);
      mine[0] = static_cast<double>(r.peak_activation_bytes);
      mine[1] = st.attention_flops;
      mine[2] = static_cast<double>(st.bytes);
      mine[3] = static_cast<double>(comm.stats().messages() - before.messages());
      mine[4] = r.seconds;
    }
    std::vector<double> all(static_cast<std::size_t>(5 * comm.size()));
    comm.all_gather(std::span<const double>(mine), std::span<double>(all));
    if (comm.rank() == 0) {
      double worst[5] = {0, 0, 0, 0, 0}, flops_sum = 0;
      for (int r = 0; r < comm.size(); ++r) {
        for (int k = 0; k < 5; ++k)
          worst[k] = std::max(worst[k], all[static_cast<std::size_t>(5 * r + k)]);
        flops_sum += all[static_cast<std::size_t>(5 * r + 1)];
      }
      std::printf("%d,%s,%lld,%.0f,%.3f,%.0f,%.0f,%.2f\n", comm.size(),
                  o.one_process ? "one-process" : to_string(o.assignment),
                  static_cast<long long>(o.seq), worst[0], worst[1] / (flops_sum / comm.size()),
                  worst[2], worst[3], worst[4]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_seqpar (rank %d): %s\n", comm.rank(), e.what());
    comm.abort(1);
  }
  return 0;
}
