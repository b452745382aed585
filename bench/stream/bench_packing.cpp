// bench_packing: packed (padding-free, position_ids) against right-padded batches of the same
// documents of mixed lengths: SFT forward + backward under StreamBP on the Eigen backend,
// measured side by side (alternating runs) so the ratio survives a noisy machine. Counts only
// real tokens in tokens/s and shows the padding each layout computes (docs/benchmarks.md).
//
// usage: bench_packing [--preset small] [--lengths 64,300,...] [--reps 3] [--chunk 256]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tightfit/backend/eigen.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/packing.hpp"

using namespace tightfit;

namespace {

struct layout {
  const char* name = "";
  index_t rows = 0, seq_len = 0;
  std::vector<token_id> ids, targets;  // (rows*T)
  std::vector<index_t> lengths;        // (rows)
  std::vector<index_t> positions;      // (rows*T) packed only
  index_t real_tokens = 0;
  token_batch view() const { return {rows, seq_len, ids, targets, lengths, positions}; }
};

token_id token(index_t doc, index_t t, index_t vocab) {
  return static_cast<token_id>((doc * 7919 + t * 104729) % vocab);
}

/// One document per row, right-padded to the longest.
layout padded(const std::vector<index_t>& lens, index_t vocab) {
  layout l;
  l.name = "padded";
  l.rows = static_cast<index_t>(lens.size());
  l.seq_len = *std::max_element(lens.begin(), lens.end());
  for (index_t d = 0; d < l.rows; ++d) {
    const index_t n = lens[static_cast<std::size_t>(d)];
    for (index_t t = 0; t < l.seq_len; ++t) {
      l.ids.push_back(t < n ? token(d, t, vocab) : 0);
      l.targets.push_back(t + 1 < n ? token(d, t + 1, vocab) : ignore_index);
    }
    l.lengths.push_back(n);
    l.real_tokens += n;
  }
  return l;
}

/// Documents packed best-fit decreasing (stream/packing.hpp) into rows of the longest document's
/// length.
layout packed(const std::vector<index_t>& lens, index_t vocab) {
  layout l;
  l.name = "packed";
  l.seq_len = *std::max_element(lens.begin(), lens.end());
  std::vector<std::vector<token_id>> ids(lens.size());
  for (std::size_t d = 0; d < lens.size(); ++d)
    for (index_t t = 0; t < lens[d]; ++t)
      ids[d].push_back(token(static_cast<index_t>(d), t, vocab));
  const packing rows = pack_best_fit_decreasing(lens, l.seq_len);
  const packed_rows p = lay_out_rows(rows, ids, ids, l.seq_len, 0);
  l.rows = p.rows;
  l.ids = p.input_ids;
  l.targets = shift_labels(p.labels, p.rows, p.seq_len);  // a document's last target never counts
  l.positions = p.position_ids;
  for (const auto& row : rows) {
    index_t used = 0;
    for (const index_t d : row) used += lens[static_cast<std::size_t>(d)];
    l.lengths.push_back(used);
    l.real_tokens += used;
  }
  return l;
}

std::vector<index_t> parse_lengths(const std::string& s) {
  std::vector<index_t> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = s.find(',', start);
    out.push_back(std::stoll(s.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "small";
  std::vector<index_t> lens{64, 300, 128, 512, 90, 256, 40, 400, 180, 32, 350, 150};
  int reps = 3;
  index_t chunk = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--preset")
      preset = v;
    else if (k == "--lengths")
      lens = parse_lengths(v);
    else if (k == "--reps")
      reps = std::atoi(v.c_str());
    else if (k == "--chunk")
      chunk = std::stoll(v);
    else {
      std::fprintf(stderr,
                   "usage: bench_packing [--preset NAME] [--lengths N,N,...] [--reps R] "
                   "[--chunk C]\n");
      return 2;
    }
  }
  const model_config cfg = preset_config(preset);
  eigen_backend<float> be;
  llama_model<eigen_backend<float>> model(be, cfg);
  model.init_random(1, 0.02, 0.1);
  const layout layouts[2] = {padded(lens, cfg.vocab_size), packed(lens, cfg.vocab_size)};
  backward_options opt;
  opt.sched = backward_schedule::stream;
  opt.chunk = chunk;
  std::vector<double> seconds[2], losses[2];
  sft_loss loss;
  for (int rep = 0; rep <= reps; ++rep)  // rep 0 warms up; the layouts alternate
    for (int k = 0; k < 2; ++k) {
      model.parameters().zero_grads();
      const auto r = compute_gradients(model, layouts[k].view(), loss, opt);
      if (rep > 0) {
        seconds[k].push_back(r.seconds);
        losses[k].push_back(r.loss);
      }
    }
  std::printf(
      "bench_packing: preset %s, %zu documents, %d runs each (alternating), stream chunk "
      "%lld, float\n",
      preset.c_str(), lens.size(), reps, static_cast<long long>(chunk));
  std::printf("%-8s %10s %12s %12s %9s %10s %14s %10s\n", "layout", "rows x T", "real tokens",
              "positions", "padding", "median s", "real tokens/s", "loss");
  double median[2];
  for (int k = 0; k < 2; ++k) {
    auto s = seconds[k];
    std::sort(s.begin(), s.end());
    median[k] = s[s.size() / 2];
    const auto& l = layouts[k];
    const index_t positions = l.rows * l.seq_len;
    std::printf(
        "%-8s %4lld x %-4lld %12lld %12lld %8.1f%% %10.3f %14.1f %10.6f\n", l.name,
        static_cast<long long>(l.rows), static_cast<long long>(l.seq_len),
        static_cast<long long>(l.real_tokens), static_cast<long long>(positions),
        100.0 * static_cast<double>(positions - l.real_tokens) / static_cast<double>(positions),
        median[k], static_cast<double>(l.real_tokens) / median[k], losses[k].back());
  }
  std::printf("packed / padded throughput: %.2fx (medians of the same run)\n",
              median[0] / median[1]);
  return 0;
}
