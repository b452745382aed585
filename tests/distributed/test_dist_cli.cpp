// `mpirun -np 2 tightfit train --parallel data` end to end (run by ctest as dist_cli): in double
// precision the losses and the trained weights equal the single-process run on the union batch
// (every step's rows of both ranks) to 1e-12 for ZeRO-1 AdamW with gradient accumulation, BAdam
// and BREAD-SGD; rank 0 alone prints and writes; a sharded state saved by 2 ranks resumes on 2
// (4 steps = 2, save, resume 2) and is refused on 3 with a message naming both counts; bad input
// ends the whole job, a wrong argument prints the usage once (rank 0). `tightfit grad
// --parallel data|sequence` on 2 and 3 ranks: loss and gradients equal one process (1e-12).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli/cli_model.hpp"
#include "cli/cli_testing.hpp"
#include "stream/stream_testing.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/hf_model.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::lines;
using cli_testing::q;

namespace {

/// `mpirun -np N tightfit ARGS` (loopback TCP, oversubscribed), stdout and stderr captured.
cli_testing::outcome mpirun(int ranks, const std::string& args) {
  return cli_testing::run_with(
      std::string(TIGHTFIT_MPIRUN) + " -np " + std::to_string(ranks) + " env ", args);
}

struct fixture : cli_testing::model_fixture {
  fs::path data = dir / "data.safetensors";
  fixture() : model_fixture("dist") {
    // 9 rows of 10 tokens (steps wrap around); row r ignores its first 1 + 3r mod 5 labels, so
    // that the ranks' pieces supervise different numbers of tokens.
    const index_t n = 9, t = 10;
    std::vector<std::int64_t> ids, labels;
    for (index_t r = 0; r < n; ++r)
      for (index_t k = 0; k < t; ++k) {
        ids.push_back((3 * r + k) % 8);
        labels.push_back(k < 1 + (3 * r) % 5 ? ignore_index : ids.back());
      }
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {n, t}, std::span<const std::int64_t>(labels));
    w.write(data);
  }
  std::string common(const std::string& optimizer) const {
    return "train --model " + q(model) + " --data " + q(data) + " --optimizer " + optimizer +
           " --dtype f64 --lr 0.02 --switch-every 2 --bread-lr 0.05 --chunk 4 --quiet";
  }
};

std::vector<double> logged_losses(const fs::path& log) {
  std::ifstream in(log);
  std::vector<double> losses;
  std::string line;
  while (std::getline(in, line))
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return losses;
}

/// Largest |a - b| of a tensor over the tensor's largest |b|, over every tensor.
double max_rel(const std::vector<std::vector<double>>& a,
               const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    double diff = 0, scale = 1e-300;
    for (std::size_t k = 0; k < a[i].size(); ++k) {
      diff = std::max(diff, std::abs(a[i][k] - b[i][k]));
      scale = std::max(scale, std::abs(b[i][k]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

/// `tightfit BASE ONE` in one process against `mpirun -np RANKS tightfit BASE PAR`: rank 0 alone
/// prints, the JSON-log losses (`steps` of them) and the saved weights equal to 1e-12, and the
/// weights moved from the initial model's.
void expect_one_process_training(const fixture& f, const std::string& tag, const std::string& base,
                                 const std::string& one_args, int ranks,
                                 const std::string& par_args, std::size_t steps) {
  const auto log1 = f.dir / (tag + "-1.jsonl"), log2 = f.dir / (tag + "-n.jsonl");
  const auto out1 = f.dir / (tag + "-1"), out2 = f.dir / (tag + "-n");
  const auto one =
      cli_testing::run(base + " " + one_args + " --log " + q(log1) + " --save-model " + q(out1));
  INFO(one.err);
  REQUIRE(one.code == 0);
  const auto par =
      mpirun(ranks, base + " " + par_args + " --log " + q(log2) + " --save-model " + q(out2));
  INFO(par.err);
  REQUIRE(par.code == 0);
  CHECK(lines(par.out) == 1);  // rank 0's summary only
  CHECK(par.out.find("optimizer ") != std::string::npos);
  const auto l1 = logged_losses(log1), l2 = logged_losses(log2);
  REQUIRE(l1.size() == steps);
  CHECK(max_rel(l2, l1) <= 1e-12);
  CHECK(max_rel(f.weights(out2), f.weights(out1)) <= 1e-12);
  CHECK(max_rel(f.weights(out1), f.weights(f.model)) > 1e-4);  // it trained
}

}  // namespace

TEST_CASE("mpirun -np 2 train --parallel data equals one process on the union batch (f64)") {
  fixture f;
  struct run_case {
    const char* optimizer;
    int accum;
    const char* extra;
  };
  for (const run_case& c : {run_case{"adamw", 2, "--clip 0.5"}, run_case{"badam", 2, ""},
                            run_case{"bread-sgd", 2, "--bread-scope all"}}) {
    const std::string name = c.optimizer;
    CAPTURE(name);
    const std::string base = f.common(name) + " " + c.extra + " --steps 4";
    expect_one_process_training(f, name, base, "--batch " + std::to_string(2 * c.accum), 2,
                                "--parallel data --batch 1 --grad-accum " + std::to_string(c.accum),
                                4);
  }
}

TEST_CASE("mpirun -np 2 and 3 train --parallel sequence equals one process (f64)") {
  // Every rank trains on the step's rows (2 micro-batches of 2), a shard of their positions
  // (T = 10: not divisible by 3, zig-zag blocks of 1 and 2): losses and weights equal one
  // process with --batch 4.
  fixture f;
  struct run_case {
    const char* optimizer;
    int ranks;
    const char* both;      // options of both runs
    const char* parallel;  // options of the parallel run
  };
  for (const run_case& c :
       {run_case{"adamw", 2, "--clip 0.5", ""}, run_case{"adamw", 3, "--clip 0.5", ""},
        run_case{"adam", 2, "--sched checkpoint", "--assignment contiguous"},
        run_case{"badam", 2, "", ""}, run_case{"badam", 3, "", "--assignment contiguous"}}) {
    const std::string name = c.optimizer;
    CAPTURE(name);
    CAPTURE(c.ranks);
    CAPTURE(std::string(c.parallel));
    const std::string base = f.common(name) + " --steps 4 " + c.both;
    expect_one_process_training(
        f, name + "-seq" + std::to_string(c.ranks), base, "--batch 4", c.ranks,
        std::string("--parallel sequence --batch 2 --grad-accum 2 ") + c.parallel, 4);
  }
  // What sequence parallelism does not train: refused before MPI starts (exit 2, usage once).
  for (const std::string& refused :
       {std::string("--optimizer bread-sgd"), std::string("--optimizer adam --sched full")}) {
    CAPTURE(refused);
    const auto r = mpirun(2, "train --model " + q(f.model) + " --data " + q(f.data) + " " +
                                 refused + " --parallel sequence --quiet");
    CHECK(r.code == 2);
    CHECK(r.err.find("--parallel sequence") != std::string::npos);
    CHECK(r.out.empty());
  }
}

TEST_CASE("mpirun -np 2: a ZeRO-1 state saved by 2 ranks resumes on 2, and not on 3") {
  fixture f;
  const std::string base = f.common("adam") + " --parallel data --batch 1 --grad-accum 2";
  const auto whole = f.dir / "whole", resumed = f.dir / "resumed";
  const auto state = f.dir / "state.safetensors";
  REQUIRE(mpirun(2, base + " --steps 4 --save-model " + q(whole)).code == 0);
  const auto first = mpirun(2, base + " --steps 2 --save-state " + q(state));
  INFO(first.err);
  REQUIRE(first.code == 0);
  CHECK(fs::exists(state));
  CHECK(fs::exists(state.string() + ".rank1"));  // rank 1's shard
  CHECK(safetensors_file::open(state).metadata().at("dist.ranks") == "2");
  const auto second =
      mpirun(2, base + " --steps 2 --resume " + q(state) + " --save-model " + q(resumed));
  INFO(second.err);
  REQUIRE(second.code == 0);
  CHECK(max_rel(f.weights(resumed), f.weights(whole)) <= 1e-12);

  const auto three = mpirun(3, base + " --steps 1 --resume " + q(state));
  CHECK(three.code != 0);
  CHECK(three.err.find("saved by a run of 2 ranks, this run has 3") != std::string::npos);
  const auto alone =
      cli_testing::run(f.common("adam") + " --batch 2 --steps 1 --resume " + q(state));
  CHECK(alone.code == 1);
  CHECK(alone.err.find("saved by a run of 2 ranks, this run has 1") != std::string::npos);
}

TEST_CASE("mpirun -np 3: a rank's share of --save-state is never an input") {
  fixture f;
  // rank 2's share of STATE (STATE.rank2) is the data file: refused by every rank, nothing
  // written, the data file unchanged
  const auto state = f.dir / "rows.safetensors";
  const auto data = fs::path(state.string() + ".rank2");
  fs::copy_file(f.data, data);
  const auto before = fs::file_size(data);
  const auto r =
      mpirun(3, "train --model " + q(f.model) + " --data " + q(data) +
                    " --optimizer adam --dtype f64 --parallel data --steps 1 --save-state " +
                    q(state) + " --quiet");
  CHECK(r.code == 2);
  CHECK(r.err.find("--save-state (rank 2's share) '" + data.string() + "'") != std::string::npos);
  CHECK(r.out.empty());
  CHECK(!fs::exists(state));
  CHECK(fs::file_size(data) == before);
}

TEST_CASE("mpirun -np 2: bad input ends the whole job with one report per rank, usage once") {
  fixture f;
  // A data file that does not exist: every rank fails before any collective, the job ends.
  const auto missing = f.dir / "no-such-rows.safetensors";
  auto r = mpirun(2, "train --model " + q(f.model) + " --data " + q(missing) +
                         " --optimizer adam --parallel data --quiet");
  CHECK(r.code != 0);
  CHECK(r.err.find("tightfit train: ") != std::string::npos);
  CHECK(r.err.find("no-such-rows.safetensors") != std::string::npos);
  CHECK(r.out.empty());
  // A wrong argument: exit 2, the message and the usage from rank 0 only.
  r = mpirun(2, f.common("adam") + " --parallel data --grad-accum 0");
  CHECK(r.code == 2);
  std::size_t usages = 0;
  for (auto at = r.err.find("usage: tightfit train"); at != std::string::npos;
       at = r.err.find("usage: tightfit train", at + 1))
    ++usages;
  CHECK(usages == 1);
  CHECK(r.err.find("--grad-accum") != std::string::npos);
}

namespace {

/// Batch files for `tightfit grad`: sft and grpo (3 rows of T = 11, right padding to 11, 9
/// and 10, some labels ignored; grpo adds advantages and old/ref log-probs) and dpo (2 pairs).
struct grad_fixture : fixture {
  fs::path sft = dir / "sft.safetensors", grpo = dir / "grpo.safetensors",
           dpo = dir / "dpo.safetensors";
  grad_fixture() {
    const index_t b = 3, t = 11;
    const std::vector<index_t> lens{11, 9, 10};
    std::vector<std::int64_t> ids, labels, mask;
    std::vector<double> adv, old_lp, ref_lp;
    for (index_t r = 0; r < b; ++r) {
      adv.push_back(0.5 - 0.4 * static_cast<double>(r));
      for (index_t k = 0; k < t; ++k) {
        ids.push_back((5 * r + 3 * k + 1) % 8);
        labels.push_back(k < 1 + r ? ignore_index : ids.back());
        mask.push_back(k < lens[static_cast<std::size_t>(r)] ? 1 : 0);
        old_lp.push_back(-2.1 + 0.05 * static_cast<double>((r + k) % 7));
        ref_lp.push_back(-2.0 - 0.03 * static_cast<double>((2 * r + k) % 5));
      }
    }
    safetensors_writer w;
    w.add("input_ids", {b, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {b, t}, std::span<const std::int64_t>(labels));
    w.add("attention_mask", {b, t}, std::span<const std::int64_t>(mask));
    w.write(sft);
    w.add("advantages", {b}, std::span<const double>(adv));
    w.add("old_logprobs", {b, t}, std::span<const double>(old_lp));
    w.add("ref_logprobs", {b, t}, std::span<const double>(ref_lp));
    w.write(grpo);
    const index_t p = 2;
    std::vector<std::int64_t> ci, cl, ri, rl, cm, rm;
    for (index_t r = 0; r < p; ++r)
      for (index_t k = 0; k < t; ++k) {
        ci.push_back((2 * r + k) % 8);
        ri.push_back((3 * r + 2 * k + 1) % 8);
        cl.push_back(k < 3 ? ignore_index : ci.back());
        rl.push_back(k < 3 ? ignore_index : ri.back());
        cm.push_back(k < t - r ? 1 : 0);
        rm.push_back(k < t - 2 * r ? 1 : 0);
      }
    const std::vector<double> ref_w{-15.0, -16.5}, ref_l{-15.5, -16.0};
    safetensors_writer d;
    d.add("chosen_input_ids", {p, t}, std::span<const std::int64_t>(ci));
    d.add("chosen_labels", {p, t}, std::span<const std::int64_t>(cl));
    d.add("rejected_input_ids", {p, t}, std::span<const std::int64_t>(ri));
    d.add("rejected_labels", {p, t}, std::span<const std::int64_t>(rl));
    d.add("chosen_attention_mask", {p, t}, std::span<const std::int64_t>(cm));
    d.add("rejected_attention_mask", {p, t}, std::span<const std::int64_t>(rm));
    d.add("ref_chosen_logps", {p}, std::span<const double>(ref_w));
    d.add("ref_rejected_logps", {p}, std::span<const double>(ref_l));
    d.write(dpo);
  }
};

/// Every tensor of a gradient file, in the file's order.
std::vector<std::vector<double>> gradient_file(const fs::path& p) {
  const auto f = safetensors_file::open(p);
  std::vector<std::vector<double>> out;
  for (const auto& t : f.tensors()) out.push_back(f.template read<double>(t.name));
  return out;
}

/// A `tightfit grad` case: objective, batch file, options.
struct grad_case {
  const char* objective;
  const fs::path* batch;
  const char* extra;
  std::string command(const fs::path& model) const {
    return "grad --model " + q(model) + " --batch " + q(*batch) + " --objective " + objective +
           " --dtype f64 --chunk 2 " + extra;
  }
};

/// `tightfit BASE` in one process, then `mpirun -np RANKS tightfit BASE ARGS` for each run:
/// rank 0 alone prints, its JSON line names the ranks, the loss and every gradient written to
/// --out equal the one process's to 1e-12 relative.
void expect_one_process_gradients(const fs::path& dir, const std::string& base,
                                  const std::vector<std::pair<int, std::string>>& runs) {
  const auto want_out = dir / "one.safetensors";
  const auto one = cli_testing::run(base + " --out " + q(want_out));
  INFO(one.err);
  REQUIRE(one.code == 0);
  const double want_loss = nlohmann::json::parse(one.out)["loss"].get<double>();
  const auto want = gradient_file(want_out);
  for (const auto& [ranks, args] : runs) {
    CAPTURE(ranks);
    CAPTURE(args);
    const auto got_out = dir / "par.safetensors";
    fs::remove(got_out);
    const auto got = mpirun(ranks, base + " " + args + " --out " + q(got_out));
    INFO(got.err);
    REQUIRE(got.code == 0);
    CHECK(lines(got.out) == 1);  // rank 0 alone prints
    const auto json = nlohmann::json::parse(got.out);
    CHECK(json["ranks"].get<int>() == ranks);
    CHECK(std::abs(json["loss"].get<double>() - want_loss) <= 1e-12 * std::abs(want_loss));
    CHECK(max_rel(gradient_file(got_out), want) <= 1e-12);
  }
}

}  // namespace

TEST_CASE("mpirun -np 2 and 3 grad --parallel data|sequence equal one process (f64)") {
  grad_fixture f;
  for (const grad_case& c :
       {grad_case{"sft", &f.sft, ""}, grad_case{"grpo", &f.grpo, "--beta 0.04"},
        grad_case{"dpo", &f.dpo, "--beta 0.1"}}) {
    const std::string name = c.objective;
    const std::string base = c.command(f.model);
    CAPTURE(name);
    std::vector<std::pair<int, std::string>> runs{
        {2, "--parallel sequence"},
        {3, "--parallel sequence"},
        {2, "--parallel sequence --assignment contiguous"},
        {3, "--parallel sequence --assignment contiguous --sched checkpoint"},
        {2, "--parallel data"}};
    if (name != "dpo") runs.emplace_back(3, "--parallel data");  // dpo: 2 pairs
    expect_one_process_gradients(f.dir, base, runs);
  }
  // Arguments: a wrong --parallel exits 2 with the usage once; too few positions per rank end
  // the whole job with the error naming T and the ranks.
  auto r = mpirun(2, "grad --model " + q(f.model) + " --batch " + q(f.sft) + " --parallel rows");
  CHECK(r.code == 2);
  std::size_t usages = 0;
  for (auto at = r.err.find("usage: tightfit grad"); at != std::string::npos;
       at = r.err.find("usage: tightfit grad", at + 1))
    ++usages;
  CHECK(usages == 1);
  CHECK(r.err.find("--parallel expects data or sequence, got 'rows'") != std::string::npos);
  r = mpirun(3, "grad --model " + q(f.model) + " --batch " + q(f.dpo) +
                    " --objective dpo --parallel data");
  CHECK(r.code != 0);
  CHECK(r.err.find("2 pairs for 3 ranks") != std::string::npos);
}

namespace {

/// Packed batch files (position_ids): sft and grpo, 4 rows of T = 11 holding documents of
/// 4 + 7, 11, 3 + 3 + 5 and 6 + 5 tokens (8 documents, one advantage each); dpo, 5 pairs packed
/// in 3 chosen rows (5 + 6, 11, 4 + 7) and 3 rejected rows (3 + 8, 11, 6 + 5) that break where
/// the chosen rows do; and the sft rows without position_ids (the documents attend to each
/// other: another loss).
struct packed_fixture : fixture {
  fs::path sft = dir / "packed-sft.safetensors", grpo = dir / "packed-grpo.safetensors",
           dpo = dir / "packed-dpo.safetensors", leaky = dir / "leaky-sft.safetensors";
  static constexpr index_t t = 11;
  /// ids, labels (the first token of each document ignored) and positions of packed rows.
  static void pack(const std::vector<std::vector<index_t>>& rows, index_t salt,
                   std::vector<std::int64_t>& ids, std::vector<std::int64_t>& labels,
                   std::vector<std::int64_t>& pos) {
    index_t doc = 0;
    for (const auto& row : rows) {
      for (index_t len : row) {
        for (index_t k = 0; k < len; ++k) {
          ids.push_back((salt + 5 * doc + 3 * k + 1) % 8);
          labels.push_back(k == 0 || (k + doc) % 4 == 3 ? ignore_index : ids.back());
          pos.push_back(k);
        }
        ++doc;
      }
    }
  }
  packed_fixture() {
    std::vector<std::int64_t> ids, labels, pos;
    pack({{4, 7}, {11}, {3, 3, 5}, {6, 5}}, 0, ids, labels, pos);
    const index_t b = 4, docs = 8;
    std::vector<double> adv, old_lp, ref_lp;
    for (index_t d = 0; d < docs; ++d) adv.push_back(0.6 - 0.17 * static_cast<double>(d));
    for (index_t i = 0; i < b * t; ++i) {
      old_lp.push_back(-2.1 + 0.05 * static_cast<double>(i % 7));
      ref_lp.push_back(-2.0 - 0.03 * static_cast<double>((2 * i) % 5));
    }
    safetensors_writer w;
    w.add("input_ids", {b, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {b, t}, std::span<const std::int64_t>(labels));
    w.write(leaky);
    w.add("position_ids", {b, t}, std::span<const std::int64_t>(pos));
    w.write(sft);
    w.add("advantages", {docs}, std::span<const double>(adv));
    w.add("old_logprobs", {b, t}, std::span<const double>(old_lp));
    w.add("ref_logprobs", {b, t}, std::span<const double>(ref_lp));
    w.write(grpo);
    std::vector<std::int64_t> ci, cl, cp, ri, rl, rp;
    pack({{5, 6}, {11}, {4, 7}}, 1, ci, cl, cp);
    pack({{3, 8}, {11}, {6, 5}}, 4, ri, rl, rp);
    const std::vector<double> ref_w{-9.0, -11.5, -20.0, -7.5, -13.0},
        ref_l{-6.5, -16.0, -19.0, -12.5, -10.0};
    safetensors_writer d;
    d.add("chosen_input_ids", {3, t}, std::span<const std::int64_t>(ci));
    d.add("chosen_labels", {3, t}, std::span<const std::int64_t>(cl));
    d.add("chosen_position_ids", {3, t}, std::span<const std::int64_t>(cp));
    d.add("rejected_input_ids", {3, t}, std::span<const std::int64_t>(ri));
    d.add("rejected_labels", {3, t}, std::span<const std::int64_t>(rl));
    d.add("rejected_position_ids", {3, t}, std::span<const std::int64_t>(rp));
    d.add("ref_chosen_logps", {5}, std::span<const double>(ref_w));
    d.add("ref_rejected_logps", {5}, std::span<const double>(ref_l));
    d.write(dpo);
  }
};

}  // namespace

TEST_CASE("mpirun -np 2 and 3 grad --parallel data on packed rows equals one process (f64)") {
  // Each rank takes whole rows and the documents in them (grpo: their advantages; dpo: the
  // chosen rows and the rejected rows of their pairs); the per-document statistics and the
  // normalisers span the union batch. Packed sft also runs --parallel sequence.
  packed_fixture f;
  for (const grad_case& c :
       {grad_case{"sft", &f.sft, ""}, grad_case{"grpo", &f.grpo, "--beta 0.04"},
        grad_case{"grpo", &f.grpo, "--loss-type bnpo --importance-sampling-level sequence"},
        grad_case{"dpo", &f.dpo, "--beta 0.1"}}) {
    const std::string name = c.objective;
    const std::string base = c.command(f.model);
    CAPTURE(name);
    CAPTURE(std::string(c.extra));
    std::vector<std::pair<int, std::string>> runs{{2, "--parallel data"}, {3, "--parallel data"}};
    if (name == "sft") {
      runs.emplace_back(2, "--parallel sequence");
      runs.emplace_back(3, "--parallel sequence --assignment contiguous");
    }
    expect_one_process_gradients(f.dir, base, runs);
  }
  // The packing matters (the check above can fail): without position_ids the documents attend
  // to each other, another loss.
  const auto leaky = cli_testing::run("grad --model " + q(f.model) + " --batch " + q(f.leaky) +
                                      " --dtype f64 --chunk 2");
  const auto packed = cli_testing::run("grad --model " + q(f.model) + " --batch " + q(f.sft) +
                                       " --dtype f64 --chunk 2");
  REQUIRE(leaky.code == 0);
  REQUIRE(packed.code == 0);
  CHECK(std::abs(nlohmann::json::parse(leaky.out)["loss"].get<double>() -
                 nlohmann::json::parse(packed.out)["loss"].get<double>()) > 1e-6);
  // Packed grpo under --parallel sequence is refused by name.
  const auto r = mpirun(2, "grad --model " + q(f.model) + " --batch " + q(f.grpo) +
                               " --objective grpo --parallel sequence");
  CHECK(r.code != 0);
  CHECK(r.err.find("runs --objective sft only") != std::string::npos);
}

TEST_CASE("mpirun train --parallel data|sequence on packed rows equals one process (f64)") {
  packed_fixture f;
  const std::string base = "train --model " + q(f.model) + " --data " + q(f.sft) +
                           " --optimizer adamw --dtype f64 --lr 0.02 --chunk 4 --steps 3 --quiet";
  expect_one_process_training(f, "packed", base, "--batch 2", 2, "--parallel data --batch 1", 3);
  // sequence parallel: every rank the step's packed rows, a shard of their positions
  expect_one_process_training(f, "packed-seq2", base, "--batch 2", 2,
                              "--parallel sequence --batch 1 --grad-accum 2", 3);
  expect_one_process_training(f, "packed-seq3", base, "--batch 2", 3,
                              "--parallel sequence --batch 2 --assignment contiguous", 3);
}

TEST_CASE("mpirun train --objective dpo|grpo --parallel data|sequence equals one process (f64)") {
  grad_fixture f;
  // grad's GRPO batch without old_logprobs (train takes the policy's own at each step)
  const auto grpo = f.dir / "grpo_train.safetensors";
  {
    const auto in = safetensors_file::open(f.grpo);
    safetensors_writer w;
    for (const char* key : {"input_ids", "labels", "attention_mask"}) {
      const auto v = in.read_ints(key);
      w.add(key, in.info(key).shape, std::span<const std::int64_t>(v));
    }
    for (const char* key : {"advantages", "ref_logprobs"}) {
      const auto v = in.read<double>(key);
      w.add(key, in.info(key).shape, std::span<const double>(v));
    }
    w.write(grpo);
  }
  const std::string dpo_base = "train --model " + q(f.model) + " --data " + q(f.dpo) +
                               " --objective dpo --beta 0.2 --optimizer adamw --lr 0.02 "
                               "--dtype f64 --chunk 4 --quiet --steps 3";
  expect_one_process_training(f, "dpo-data", dpo_base, "--batch 2", 2, "--parallel data --batch 1",
                              3);
  expect_one_process_training(f, "dpo-seq", dpo_base, "--batch 2", 2,
                              "--parallel sequence --batch 2", 3);
  const std::string grpo_base = "train --model " + q(f.model) + " --data " + q(grpo) +
                                " --objective grpo --beta 0.04 --loss-type bnpo --optimizer "
                                "adamw --lr 0.02 --dtype f64 --chunk 4 --quiet --steps 3";
  expect_one_process_training(f, "grpo-data", grpo_base, "--batch 2", 2,
                              "--parallel data --batch 1", 3);
  expect_one_process_training(f, "grpo-seq", grpo_base, "--batch 2 --grad-accum 2", 3,
                              "--parallel sequence --batch 2 --grad-accum 2", 3);
}
