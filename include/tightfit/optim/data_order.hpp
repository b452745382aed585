// tightfit/optim/data_order.hpp: the order in which train() (optim/train.hpp) takes the rows of
// a data set: in order, wrapping around, or a seeded shuffle per epoch.
//
// A row order maps k, the k-th row a run takes counting from the first step (step s takes
// k in [s G, s G + G)), to a data row. With shuffle on, epoch e = k / N visits the data set's
// units (a unit: `unit` consecutive rows that stay together and in order, e.g. the chosen and
// the rejected row of a DPO pair) in a permutation drawn from (seed, e) by an explicit
// Fisher-Yates over splitmix64 (core/splitmix.hpp) draws: std::shuffle's use of an
// engine is unspecified, this one gives the same rows in the same order on every machine, and
// after a resume, since the order is a function of k alone.
// Invariants: each epoch visits every row exactly once; the rows of a unit stay adjacent and in
// order, and a unit starts at a multiple of `unit` within the epoch.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/splitmix.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit {

/// How train() orders a data set's rows (train_options::order).
struct row_order_options {
  bool shuffle = false;    ///< a seeded permutation of the units per epoch; off: rows in order
  std::uint64_t seed = 0;  ///< the shuffle's seed
  index_t unit = 1;        ///< rows that stay together (2: DPO's chosen and rejected row)
};

/// The units 0..units-1 in the seeded order of epoch `epoch` (Fisher-Yates over splitmix64
/// draws; the modulo bias is below 2^-40 for fewer than 2^24 units).
inline std::vector<index_t> epoch_permutation(index_t units, std::uint64_t seed,
                                              std::int64_t epoch) {
  std::vector<index_t> p(static_cast<std::size_t>(units));
  std::iota(p.begin(), p.end(), index_t{0});
  std::uint64_t state = seed ^ (0xD1B54A32D192ED03ULL * static_cast<std::uint64_t>(epoch + 1));
  for (index_t i = units - 1; i > 0; --i) {
    const auto j = static_cast<index_t>(splitmix64(state) % static_cast<std::uint64_t>(i + 1));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

/// The row order of a data set of `rows` rows (see the top comment); keeps the permutation of
/// the last epoch asked for.
class row_order {
 public:
  row_order(index_t rows, const row_order_options& options) : rows_(rows), opt_(options) {
    check(opt_.unit >= 1 && rows >= opt_.unit && rows % opt_.unit == 0, "row_order: ", rows,
          " rows are not whole units of ", opt_.unit, " rows");
  }
  /// The data row of the run's k-th row (k >= 0).
  index_t operator()(std::int64_t k) {
    const std::int64_t epoch = k / rows_;
    const auto within = static_cast<index_t>(k % rows_);
    if (!opt_.shuffle) return within;
    if (epoch != epoch_) {
      units_ = epoch_permutation(rows_ / opt_.unit, opt_.seed, epoch);
      epoch_ = epoch;
    }
    return units_[static_cast<std::size_t>(within / opt_.unit)] * opt_.unit + within % opt_.unit;
  }
  index_t rows() const { return rows_; }
  const row_order_options& options() const { return opt_; }

 private:
  index_t rows_;
  row_order_options opt_;
  std::int64_t epoch_ = -1;
  std::vector<index_t> units_;  // (rows / unit) this epoch's units in order
};

}  // namespace tightfit
