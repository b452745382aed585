// stream/packing.hpp: best-fit decreasing and in-order packing place every document once within
// the row length, best fit picks the fullest row that has room, pairs break together; and the
// rows lay_out_rows gives compute the SFT loss and gradients of the same documents padded, one
// per row (double, 1e-12, every schedule).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/stream/packing.hpp"

using namespace tightfit;

namespace {

void check_partition(const packing& rows, std::span<const index_t> lengths, index_t capacity) {
  std::vector<int> seen(lengths.size(), 0);
  for (const auto& row : rows) {
    index_t used = 0;
    for (const index_t d : row) {
      ++seen[static_cast<std::size_t>(d)];
      used += lengths[static_cast<std::size_t>(d)];
    }
    CHECK(used <= capacity);
    CHECK(!row.empty());
  }
  for (const int s : seen) CHECK(s == 1);
}

}  // namespace

TEST_CASE("packing: every document once, within the row, the best fit first") {
  const std::vector<index_t> lens{64, 300, 128, 512, 90, 256, 40, 400, 180, 32, 350, 150};
  const auto bfd = pack_best_fit_decreasing(lens, 512);
  check_partition(bfd, lens, 512);
  CHECK(bfd.size() == 5);                    // 2,502 tokens: 5 rows of 512 is the least
  CHECK(bfd[0] == std::vector<index_t>{3});  // 512 alone, then 400 + 90, ...
  CHECK(bfd[1] == std::vector<index_t>{7, 4});
  // best fit: 3 goes to the row it fills exactly (1 and 2 hold 8 and 7, capacity 10)
  const std::vector<index_t> fit{8, 7, 3, 2};
  const auto b = pack_best_fit_decreasing(fit, 10);
  REQUIRE(b.size() == 2);
  CHECK(b[1] == std::vector<index_t>{1, 2});
  CHECK(b[0] == std::vector<index_t>{0, 3});
  const auto io = pack_in_order(lens, 512);
  check_partition(io, lens, 512);
  for (std::size_t r = 0, d = 0; r < io.size(); ++r)  // data set order kept
    for (const index_t x : io[r]) CHECK(x == static_cast<index_t>(d++));
  // pairs: both halves fit in every row
  const std::vector<index_t> a{5, 1, 4, 2}, c{1, 5, 2, 4};
  for (const auto& rows : {pack_best_fit_decreasing(a, c, 6), pack_in_order(a, c, 6)}) {
    check_partition(rows, a, 6);
    check_partition(rows, c, 6);
  }
  CHECK_THROWS_AS(pack_best_fit_decreasing(lens, 300), error);  // 512 does not fit
  CHECK_THROWS_AS(pack_in_order(std::vector<index_t>{0}, 4), error);
}

TEST_CASE("packed rows (lay_out_rows) == the same documents padded: SFT loss and gradients") {
  using ref = reference_backend<double>;
  const auto cfg = testing::tiny_config(4, 2, true, false);
  const std::vector<index_t> lens{7, 3, 5, 9, 2, 6};
  std::vector<std::vector<token_id>> ids, labels;
  for (std::size_t d = 0; d < lens.size(); ++d) {
    ids.emplace_back();
    labels.emplace_back();
    for (index_t t = 0; t < lens[d]; ++t) {
      const auto id = static_cast<token_id>((static_cast<index_t>(d) * 11 + t * 5 + 1) % 37);
      ids.back().push_back(id);
      labels.back().push_back(t < 2 ? ignore_index : id);  // a masked prompt of 2 tokens
    }
  }
  // padded: one document per row, T = 9
  std::vector<token_id> pid, plab;
  std::vector<index_t> plen;
  for (std::size_t d = 0; d < lens.size(); ++d) {
    for (index_t t = 0; t < 9; ++t) {
      pid.push_back(t < lens[d] ? ids[d][static_cast<std::size_t>(t)] : 0);
      plab.push_back(t < lens[d] ? labels[d][static_cast<std::size_t>(t)] : ignore_index);
    }
    plen.push_back(lens[d]);
  }
  const auto ptgt = shift_labels(plab, 6, 9);
  const token_batch padded{6, 9, pid, ptgt, plen};
  const auto rows = pack_best_fit_decreasing(lens, 12);
  const auto p = lay_out_rows(rows, ids, labels, 12, 0);
  CHECK(p.rows < 6);
  const auto ktgt = shift_labels(p.labels, p.rows, p.seq_len);
  const token_batch packed{p.rows, p.seq_len, p.input_ids, ktgt, {}, p.position_ids};
  for (auto sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    CAPTURE(to_string(sched));
    auto run = [&](const token_batch& b) {
      ref be;
      llama_model<ref> model(be, cfg);
      model.init_random(3, 0.3, 0.2);
      backward_options o;
      o.sched = sched;
      o.chunk = 4;
      sft_loss loss;
      const double l = compute_gradients(model, b, loss, o).loss;
      return std::make_pair(l, testing::grads_of(model.parameters()));
    };
    const auto [lu, gu] = run(padded);
    const auto [lk, gk] = run(packed);
    CHECK(std::abs(lk - lu) <= 1e-12 * std::abs(lu));
    REQUIRE(gu.size() == gk.size());
    for (std::size_t i = 0; i < gu.size(); ++i)
      CHECK(testing::max_rel_diff(gk[i], gu[i], 1e-12) < 1e-12);
  }
}
