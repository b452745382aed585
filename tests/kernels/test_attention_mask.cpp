// Tests of the attention_mask seam (sliding window, packed documents) and of rope_args
// (per-row positions, given inverse frequencies, yarn's attention scaling):
//  - reference_backend against a dense softmax written here from the mask's definition;
//  - eigen_backend against the reference (float, double), every tiling and both backward
//    strategies, whole calls and chunked query ranges [q0, q1) against their key prefixes;
//  - eigen's backward against finite differences (double) under a window and documents;
//  - the counted work: exact for the reference, within a tile per row edge for eigen, and it
//    drops with the window as predicted;
//  - bad masks and bad rope arguments are errors naming the value.
// Built only when Eigen is visible (tests/kernels links tightfit::eigen when it is found).
#if __has_include(<Eigen/Core>)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "test_eigen_common.hpp"

using namespace tightfit;
using namespace tightfit::testing;

namespace {

struct mask_case {
  index_t heads, kv_heads, hd, n, window;
  std::vector<index_t> doc_lengths;  ///< empty: one document of n positions
  index_t valid_len;                 ///< right padding (0: n)
  double softcap = 0;                ///< Gemma 2's score soft-capping (0: none)
};

/// doc_start of every position for documents of the given lengths (their sum is n).
std::vector<index_t> doc_starts(const std::vector<index_t>& lengths) {
  std::vector<index_t> out;
  index_t start = 0;
  for (index_t len : lengths) {
    for (index_t i = 0; i < len; ++i) out.push_back(start);
    start += len;
  }
  return out;
}

/// One sequence of n positions: Q (n, H hd), K, V (n, Hkv hd), dO, and outputs.
template <class T>
struct problem {
  attention_shape shape;
  index_t n;
  std::vector<index_t> docs;
  attention_mask mask;
  padded<T> q, k, v, d_o, o, lse, dq, dk, dv;

  problem(const mask_case& c, std::uint64_t seed)
      : shape{c.heads, c.kv_heads, c.hd},
        n(c.n),
        docs(doc_starts(c.doc_lengths)),
        q(padded<T>::random(c.n, c.heads * c.hd, seed, 1)),
        k(padded<T>::random(c.n, c.kv_heads * c.hd, seed + 1, 2)),
        v(padded<T>::random(c.n, c.kv_heads * c.hd, seed + 2)),
        d_o(padded<T>::random(c.n, c.heads * c.hd, seed + 3)),
        o(c.n, c.heads * c.hd, 1),
        lse(c.n, c.heads),
        dq(c.n, c.heads * c.hd, 1),
        dk(c.n, c.kv_heads * c.hd),
        dv(c.n, c.kv_heads * c.hd, 3) {
    mask.q0 = 0;
    mask.valid_len = c.valid_len > 0 ? c.valid_len : c.n;
    mask.window = c.window;
    mask.doc_start = docs;
    mask.softcap = c.softcap;
  }
  T scale() const { return static_cast<T>(1.0 / std::sqrt(static_cast<double>(shape.head_dim))); }

  template <class Be>
  void forward(Be& be) {
    be.attention_forward(shape, q.cview(), k.cview(), v.cview(), mask, scale(), o.view(),
                         lse.view());
  }
  template <class Be>
  void backward(Be& be) {
    be.attention_backward(shape, q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(),
                          lse.cview(), mask, scale(), dq.view(), dk.view(), dv.view());
  }
  /// Forward and backward over query chunks [q0, q1), each against its key prefix [0, q1).
  template <class Be>
  void chunked(Be& be, index_t chunk) {
    for (index_t c0 = 0; c0 < n; c0 += chunk) {
      const index_t c1 = std::min(n, c0 + chunk);
      attention_mask m = mask;
      m.q0 = c0;
      be.attention_forward(shape, q.cview().row_range(c0, c1), k.cview().row_range(0, c1),
                           v.cview().row_range(0, c1), m, scale(), o.view().row_range(c0, c1),
                           lse.view().row_range(c0, c1));
    }
    for (index_t c0 = ((n - 1) / chunk) * chunk; c0 >= 0; c0 -= chunk) {  // last to first
      const index_t c1 = std::min(n, c0 + chunk);
      attention_mask m = mask;
      m.q0 = c0;
      be.attention_backward(shape, q.cview().row_range(c0, c1), k.cview().row_range(0, c1),
                            v.cview().row_range(0, c1), o.cview().row_range(c0, c1),
                            d_o.cview().row_range(c0, c1), lse.cview().row_range(c0, c1), m,
                            scale(), dq.view().row_range(c0, c1), dk.view().row_range(0, c1),
                            dv.view().row_range(0, c1));
    }
  }
};

/// The keys query p sees, from the definition: j <= p, j < valid_len, p - j < W (W > 0),
/// j >= doc_start[p]; a row left with none sees min(p, valid_len - 1) only.
std::vector<index_t> visible(const attention_mask& m, index_t p, index_t nk) {
  std::vector<index_t> keys;
  for (index_t j = 0; j < nk; ++j) {
    bool ok = j <= p && j < m.valid_len;
    if (m.window > 0) ok = ok && p - j < m.window;
    if (!m.doc_start.empty()) ok = ok && j >= m.doc_start[static_cast<std::size_t>(p)];
    if (ok) keys.push_back(j);
  }
  if (keys.empty()) keys.push_back(std::min({p, m.valid_len - 1, nk - 1}));
  return keys;
}

const std::vector<mask_case> kCases = {
    // heads kv hd n window docs valid
    {2, 1, 4, 23, 5, {}, 0},                   // a window, one document
    {4, 2, 6, 31, 0, {7, 1, 12, 11}, 0},       // documents (one of length 1), no window
    {4, 1, 8, 40, 6, {15, 3, 22}, 0},          // both: the window inside long documents
    {2, 2, 3, 29, 4, {}, 20},                  // a window and right padding
    {8, 2, 4, 37, 2, {10, 27}, 0},             // window 2: a query and its predecessor
    {4, 4, 8, 150, 17, {60, 90}, 0},           // several default tiles
    {2, 1, 8, 50, 100, {}, 0},                 // a window longer than the sequence: causal
    {4, 2, 6, 31, 5, {7, 1, 12, 11}, 0, 0.8},  // soft-capped scores, window and documents
    {2, 1, 8, 150, 0, {}, 120, 2.5},           // soft-capped, causal, padding, several tiles
};

/// Tilings: default, odd small tiles, bq < bk, bq > bk; each with both backward strategies.
std::vector<eigen_backend_options> tilings() {
  std::vector<eigen_backend_options> out;
  const std::pair<index_t, index_t> tiles[] = {{64, 128}, {5, 7}, {4, 16}, {16, 3}};
  for (const auto& tile : tiles)
    for (const auto strategy :
         {attention_backward_strategy::thread_partials, attention_backward_strategy::two_pass}) {
      eigen_backend_options o;
      o.attention_tile_q = tile.first;
      o.attention_tile_k = tile.second;
      o.attention_backward = strategy;
      out.push_back(o);
    }
  return out;
}

}  // namespace

TEST_CASE("reference attention under a mask equals a dense softmax over the visible keys") {
  std::uint64_t seed = 300;
  for (const auto& c : kCases) {
    CAPTURE(c.n);
    CAPTURE(c.window);
    problem<double> p(c, seed += 10);
    reference_backend<double> ref;
    p.forward(ref);
    const index_t hd = c.hd, group = c.heads / c.kv_heads;
    double worst = 0;
    for (index_t i = 0; i < c.n; ++i) {
      const auto keys = visible(p.mask, i, c.n);
      for (index_t h = 0; h < c.heads; ++h) {
        std::vector<double> s;
        for (index_t j : keys) {
          double dot = 0;
          for (index_t x = 0; x < hd; ++x)
            dot += p.q.at(i, h * hd + x) * p.k.at(j, (h / group) * hd + x);
          const double sc = dot * p.scale();
          s.push_back(c.softcap > 0 ? c.softcap * std::tanh(sc / c.softcap) : sc);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double e : s) sum += std::exp(e - mx);
        worst = std::max(worst, std::abs(p.lse.at(i, h) - (mx + std::log(sum))));
        for (index_t x = 0; x < hd; ++x) {
          double out = 0;
          for (std::size_t t = 0; t < keys.size(); ++t)
            out += std::exp(s[t] - mx) / sum * p.v.at(keys[t], (h / group) * hd + x);
          worst = std::max(worst, std::abs(p.o.at(i, h * hd + x) - out));
        }
      }
    }
    CHECK(worst < 1e-12);
    // counted work: 4 hd per visible (query, key, head) triple
    double triples = 0;
    for (index_t i = 0; i < c.n; ++i)
      triples += static_cast<double>(visible(p.mask, i, c.n).size());
    CHECK(ref.stats().attention_flops ==
          doctest::Approx(4.0 * static_cast<double>(hd * c.heads) * triples));
  }
}

TEST_CASE_TEMPLATE("eigen attention under a mask matches the reference, whole and chunked", T,
                   float, double) {
  std::uint64_t seed = 500;
  for (const auto& c : kCases) {
    CAPTURE(c.n);
    CAPTURE(c.window);
    CAPTURE(c.doc_lengths.size());
    seed += 10;
    reference_backend<T> ref;
    problem<T> want(c, seed);
    want.forward(ref);
    want.backward(ref);
    for (const auto& opt : tilings()) {
      CAPTURE(opt.attention_tile_q);
      CAPTURE(opt.attention_tile_k);
      eigen_backend<T> eig(opt);
      problem<T> got(c, seed);
      got.forward(eig);
      check_matches(got.o, want.o, "O");
      check_matches(got.lse, want.lse, "lse");
      got.o = want.o;
      got.lse = want.lse;
      got.backward(eig);
      check_matches(got.dq, want.dq, "dQ", 4);
      check_matches(got.dk, want.dk, "dK", 4);
      check_matches(got.dv, want.dv, "dV", 4);
      CHECK(eig.memory().live() == 0);
      // chunks smaller than the window, not dividing n, crossing document boundaries
      for (index_t chunk : {index_t{3}, index_t{8}, c.n}) {
        CAPTURE(chunk);
        problem<T> ch(c, seed);
        ch.chunked(eig, chunk);
        check_matches(ch.o, want.o, "O (chunked)");
        check_matches(ch.lse, want.lse, "lse (chunked)");
        check_matches(ch.dq, want.dq, "dQ (chunked)", 8);
        check_matches(ch.dk, want.dk, "dK (chunked)", 8);
        check_matches(ch.dv, want.dv, "dV (chunked)", 8);
      }
    }
  }
}

/// Runs p's attention as query chunks x key blocks (sequence parallelism): for each chunk
/// [c0, c1), each key block [b0, min(b1, c1)) with b0 < c1 is one call with mask.k0 = b0 and
/// key_end = c1, the forward's partial (O, lse) merged by merge_attention_blocks (blocks
/// visited from `last_first`), the backward with the merged O and lse of the whole call.
template <class T, class Be>
void run_key_blocks(Be& be, problem<T>& p, index_t chunk, const std::vector<index_t>& cuts,
                    bool last_first) {
  const index_t hq = p.shape.heads * p.shape.head_dim;
  std::vector<std::pair<index_t, index_t>> blocks;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) blocks.emplace_back(cuts[i], cuts[i + 1]);
  if (last_first) std::reverse(blocks.begin(), blocks.end());
  for (index_t c0 = 0; c0 < p.n; c0 += chunk) {
    const index_t c1 = std::min(p.n, c0 + chunk), c = c1 - c0;
    auto o = p.o.view().row_range(c0, c1);
    auto lse = p.lse.view().row_range(c0, c1);
    be.fill(o, T(0));
    be.fill(lse, -std::numeric_limits<T>::infinity());
    for (auto [b0, b1] : blocks) {
      if (b0 >= c1) continue;  // causal: no query of the chunk sees the block
      b1 = std::min(b1, c1);
      attention_mask m = p.mask;
      m.q0 = c0;
      m.k0 = b0;
      m.key_end = c1;
      padded<T> ob(c, hq), lb(c, p.shape.heads);
      be.attention_forward(p.shape, p.q.cview().row_range(c0, c1), p.k.cview().row_range(b0, b1),
                           p.v.cview().row_range(b0, b1), m, p.scale(), ob.view(), lb.view());
      for (index_t i = 0; i < c; ++i)  // a row with no key in the block contributes nothing
        for (index_t h = 0; h < p.shape.heads; ++h) {
          const auto [lo, hi] = m.key_rows(c0 + i, b1 - b0);
          if (lo < hi) continue;
          CHECK(lb.at(i, h) == -std::numeric_limits<T>::infinity());
          for (index_t x = 0; x < p.shape.head_dim; ++x)
            CHECK(ob.at(i, h * p.shape.head_dim + x) == 0);
        }
      merge_attention_blocks(p.shape.heads, p.shape.head_dim, o, lse,
                             matrix_view<const T>(ob.view()), matrix_view<const T>(lb.view()));
    }
  }
  for (index_t c0 = 0; c0 < p.n; c0 += chunk) {
    const index_t c1 = std::min(p.n, c0 + chunk);
    for (auto [b0, b1] : blocks) {
      if (b0 >= c1) continue;
      b1 = std::min(b1, c1);
      attention_mask m = p.mask;
      m.q0 = c0;
      m.k0 = b0;
      m.key_end = c1;
      be.attention_backward(p.shape, p.q.cview().row_range(c0, c1), p.k.cview().row_range(b0, b1),
                            p.v.cview().row_range(b0, b1), p.o.cview().row_range(c0, c1),
                            p.d_o.cview().row_range(c0, c1), p.lse.cview().row_range(c0, c1), m,
                            p.scale(), p.dq.view().row_range(c0, c1), p.dk.view().row_range(b0, b1),
                            p.dv.view().row_range(b0, b1));
    }
  }
}

TEST_CASE("attention over key blocks (k0, key_end) merged by log-sum-exp equals one call") {
  // reference and eigen (small odd tiles, both backward strategies), double: every mask case
  // (window, documents, padding, soft-capping), key blocks of uneven sizes (one of a single
  // key), whole and chunked queries, blocks merged in both orders.
  std::uint64_t seed = 900;
  for (const auto& c : kCases) {
    CAPTURE(c.n);
    CAPTURE(c.window);
    CAPTURE(c.softcap);
    seed += 10;
    reference_backend<double> ref;
    problem<double> want(c, seed);
    want.forward(ref);
    want.backward(ref);
    const std::vector<index_t> cuts = {0, 5, 6, c.n / 2 + 1, c.n - 3, c.n};
    for (const int variant : {0, 1, 2}) {
      CAPTURE(variant);
      eigen_backend_options opt;
      opt.attention_tile_q = 4;
      opt.attention_tile_k = 3;
      opt.attention_backward = variant == 1 ? attention_backward_strategy::two_pass
                                            : attention_backward_strategy::thread_partials;
      eigen_backend<double> eig(opt);
      for (index_t chunk : {index_t{7}, c.n}) {
        for (bool last_first : {false, true}) {
          CAPTURE(chunk);
          CAPTURE(last_first);
          problem<double> got(c, seed);
          if (variant == 2)
            run_key_blocks(ref, got, chunk, cuts, last_first);
          else
            run_key_blocks(eig, got, chunk, cuts, last_first);
          CHECK(rel_diff(got.o, want.o) < 1e-12);
          CHECK(rel_diff(got.lse, want.lse) < 1e-12);
          CHECK(rel_diff(got.dq, want.dq) < 1e-12);
          CHECK(rel_diff(got.dk, want.dk) < 1e-12);
          CHECK(rel_diff(got.dv, want.dv) < 1e-12);
          CHECK(got.dk.padding_intact());
        }
      }
    }
  }
}

TEST_CASE("merge_attention_blocks: -inf sides contribute nothing, the order does not matter") {
  // one row, two heads of width 2: head 0 sees both blocks, head 1 only block b
  std::vector<double> o = {0, 0, 0, 0}, lse = {-INFINITY, -INFINITY};
  const std::vector<double> oa = {1, 2, 0, 0}, la = {0.5, -INFINITY};
  const std::vector<double> ob = {3, -1, 5, 6}, lb = {1.5, 0.25};
  auto mv = [](std::vector<double>& v, index_t cols) {
    return as_matrix(std::span<double>(v), 1, cols);
  };
  auto cmv = [](const std::vector<double>& v, index_t cols) {
    return as_matrix(std::span<const double>(v), 1, cols);
  };
  merge_attention_blocks<double>(2, 2, mv(o, 4), mv(lse, 2), cmv(oa, 4), cmv(la, 2));
  merge_attention_blocks<double>(2, 2, mv(o, 4), mv(lse, 2), cmv(ob, 4), cmv(lb, 2));
  const double l0 = std::log(std::exp(0.5) + std::exp(1.5));
  const double wa = std::exp(0.5 - l0), wb = std::exp(1.5 - l0);
  CHECK(lse[0] == doctest::Approx(l0).epsilon(1e-15));
  CHECK(o[0] == doctest::Approx(wa * 1 + wb * 3).epsilon(1e-15));
  CHECK(o[1] == doctest::Approx(wa * 2 - wb * 1).epsilon(1e-15));
  CHECK(lse[1] == 0.25);  // head 1: block b alone, copied
  CHECK(o[2] == 5);
  CHECK(o[3] == 6);
}

TEST_CASE("eigen attention backward under a mask matches finite differences (double)") {
  const mask_case cases[] = {{4, 2, 3, 11, 3, {}, 0},
                             {2, 1, 4, 10, 0, {4, 1, 5}, 0},
                             {2, 2, 2, 12, 4, {7, 5}, 9},
                             {4, 2, 3, 11, 4, {}, 0, 0.6},  // soft-capped scores (Gemma 2)
                             {2, 1, 4, 10, 0, {4, 6}, 8, 1.5}};
  for (const auto& c : cases) {
    CAPTURE(c.n);
    CAPTURE(c.softcap);
    // the two eigen strategies, then (index 2) the reference backend
    for (const int variant : {0, 1, 2}) {
      CAPTURE(variant);
      eigen_backend_options opt;
      opt.attention_tile_q = 2;
      opt.attention_tile_k = 3;
      opt.attention_backward = variant == 0 ? attention_backward_strategy::thread_partials
                                            : attention_backward_strategy::two_pass;
      eigen_backend<double> eig_backend(opt);
      reference_backend<double> ref_backend;
      auto run_forward = [&](problem<double>& pr) {
        if (variant == 2)
          pr.forward(ref_backend);
        else
          pr.forward(eig_backend);
      };
      auto run_backward = [&](problem<double>& pr) {
        if (variant == 2)
          pr.backward(ref_backend);
        else
          pr.backward(eig_backend);
      };
      problem<double> p(c, 91);
      const auto weights = p.d_o;  // L = sum(weights * O): dO = weights
      auto loss = [&]() {
        run_forward(p);
        double sum = 0;
        for (index_t i = 0; i < c.n; ++i)
          for (index_t j = 0; j < p.o.cols; ++j) sum += weights.at(i, j) * p.o.at(i, j);
        return sum;
      };
      loss();
      run_backward(p);
      auto numeric = [&](padded<double>& buf) {
        padded<double> g(buf.rows, buf.cols);
        const double h = 1e-6;
        for (index_t i = 0; i < buf.rows; ++i)
          for (index_t j = 0; j < buf.cols; ++j) {
            const double old = buf.at(i, j);
            buf.at(i, j) = old + h;
            const double fp = loss();
            buf.at(i, j) = old - h;
            const double fm = loss();
            buf.at(i, j) = old;
            g.at(i, j) = (fp - fm) / (2 * h);
          }
        return g;
      };
      auto strip = [](const padded<double>& x) {  // the same values without padding
        padded<double> y(x.rows, x.cols);
        for (index_t i = 0; i < x.rows; ++i)
          for (index_t j = 0; j < x.cols; ++j) y.at(i, j) = x.at(i, j);
        return y;
      };
      CHECK(rel_diff(strip(p.dq), numeric(p.q)) < 1e-6);
      CHECK(rel_diff(strip(p.dk), numeric(p.k)) < 1e-6);
      CHECK(rel_diff(strip(p.dv), numeric(p.v)) < 1e-6);
    }
  }
}

TEST_CASE_TEMPLATE("eigen attention work drops with the window as predicted", T, float, double) {
  // T = 512 positions, window W: the exact work is sum_p min(p + 1, W) pairs per head; eigen
  // computes whole tiles, so at most one key tile more per row edge (two edges with a window)
  const index_t n = 512, tq = 16, tk = 16;
  double previous = std::numeric_limits<double>::infinity();
  for (index_t w : {index_t{0}, index_t{256}, index_t{64}, index_t{16}}) {
    CAPTURE(w);
    const mask_case c{2, 1, 8, n, w, {}, 0};
    eigen_backend_options opt;
    opt.attention_tile_q = tq;
    opt.attention_tile_k = tk;
    eigen_backend<T> eig(opt);
    reference_backend<T> ref;
    problem<T> a(c, 7), b(c, 7);
    a.forward(ref);
    b.forward(eig);
    double pairs = 0;
    for (index_t p = 0; p < n; ++p)
      pairs += static_cast<double>(w > 0 ? std::min(p + 1, w) : p + 1);
    const double per_element = 4.0 * static_cast<double>(c.hd * c.heads);
    CHECK(ref.stats().attention_flops == doctest::Approx(per_element * pairs));
    const double got = eig.stats().attention_flops;
    CHECK(got >= per_element * pairs);
    CHECK(got <= per_element * (pairs + static_cast<double>(n * (tq + 2 * tk))));
    CHECK(got < previous);
    previous = got;
    // the backward's key-major pass (thread_partials: 5 tile products per element) too
    b.backward(eig);
    const double backward = eig.stats().attention_flops - got;
    CHECK(backward >= 2.5 * per_element * pairs);
    CHECK(backward <= 2.5 * per_element * (pairs + static_cast<double>(n * (tq + 2 * tk))));
  }
  CHECK(previous < 0.15 * 4.0 * 8 * 2 * (n * (n + 1) / 2.0));  // W = 16 vs causal
}

TEST_CASE("attention masks are validated, errors name the value") {
  reference_backend<double> ref;
  eigen_backend<double> eig;
  const mask_case c{2, 1, 4, 6, 0, {3, 3}, 0};
  problem<double> p(c, 3);
  auto both = [&](attention_mask m, std::initializer_list<std::string> words) {
    p.mask = m;
    check_error([&] { p.forward(ref); }, words);
    check_error([&] { p.forward(eig); }, words);
    check_error([&] { p.backward(ref); }, words);
    check_error([&] { p.backward(eig); }, words);
  };
  const attention_mask good = p.mask;
  attention_mask m = good;
  m.window = -2;
  both(m, {"attention", "window is -2"});
  const std::vector<index_t> short_docs{0, 0, 0};
  m = good;
  m.doc_start = short_docs;
  both(m, {"doc_start.size is 3", "expected >= q0 + Q.rows = 6"});
  const std::vector<index_t> decreasing{0, 0, 2, 1, 1, 1};
  m = good;
  m.doc_start = decreasing;
  both(m, {"doc_start[3] is 1", "expected in [2, 3]"});
  const std::vector<index_t> ahead{0, 2, 2, 2, 2, 2};
  m = good;
  m.doc_start = ahead;
  both(m, {"doc_start[1] is 2", "expected in [0, 1]"});
  m = good;
  m.q0 = -1;
  both(m, {"q0 is -1"});
  m = good;
  m.valid_len = 0;
  both(m, {"valid_len is 0"});
}

TEST_CASE_TEMPLATE("rope_args: positions per row, given frequencies, attention scaling", T, float,
                   double) {
  const index_t heads = 3, hd = 8, n = 9;
  const auto base = padded<T>::random(n, heads * hd, 17, 2);
  reference_backend<T> ref;
  eigen_backend<T> eig;
  // positions per row equal to pos0 + i give the pos0 result, on both backends
  std::vector<index_t> pos(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = 5 + i;
  std::vector<double> inv(static_cast<std::size_t>(hd / 2));
  for (index_t k = 0; k < hd / 2; ++k)
    inv[static_cast<std::size_t>(k)] = std::pow(1e4, -2.0 * static_cast<double>(k) / hd);
  auto a = base, b = base, e = base;
  ref.rope_forward(a.view(), heads, hd, {5, {}, {}, 1e4});
  rope_args r;
  r.positions = pos;
  r.inv_freq = inv;
  ref.rope_forward(b.view(), heads, hd, r);
  eig.rope_forward(e.view(), heads, hd, r);
  check_matches(b, a, "positions + inv_freq vs pos0 + theta");
  check_matches(e, a, "eigen");
  // packed positions (restarting at 0) rotate each row as its own position would
  const std::vector<index_t> packed{0, 1, 2, 0, 1, 0, 1, 2, 3};
  r.positions = packed;
  auto p1 = base, p2 = base;
  ref.rope_forward(p1.view(), heads, hd, r);
  eig.rope_forward(p2.view(), heads, hd, r);
  check_matches(p2, p1, "eigen, packed positions");
  for (index_t i = 0; i < n; ++i) {
    padded<T> want(1, heads * hd);
    for (index_t j = 0; j < heads * hd; ++j) want.at(0, j) = base.at(i, j);
    ref.rope_forward(want.view(), heads, hd, {packed[static_cast<std::size_t>(i)], {}, {}, 1e4});
    for (index_t j = 0; j < heads * hd; ++j) CHECK(p1.at(i, j) == doctest::Approx(want.at(0, j)));
  }
  // yarn's scaling multiplies cos and sin: forward then backward scales by a^2
  r.attention_scaling = 1.25;
  auto s1 = base, s2 = base;
  ref.rope_forward(s1.view(), heads, hd, r);
  ref.rope_backward(s1.view(), heads, hd, r);
  eig.rope_forward(s2.view(), heads, hd, r);
  eig.rope_backward(s2.view(), heads, hd, r);
  auto scaled = base;
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < heads * hd; ++j)
      scaled.at(i, j) = static_cast<T>(1.5625 * base.at(i, j));
  check_matches(s1, scaled, "forward then backward = a^2");
  check_matches(s2, scaled, "eigen: forward then backward = a^2");
  // errors name the argument
  const std::vector<double> short_inv{1.0, 0.5};
  rope_args bad;
  bad.inv_freq = short_inv;
  auto x = base;
  check_error([&] { ref.rope_forward(x.view(), heads, hd, bad); },
              {"rope_forward", "inv_freq.size is 2", "expected 4"});
  check_error([&] { eig.rope_backward(x.view(), heads, hd, bad); },
              {"rope_backward", "inv_freq.size is 2"});
  const std::vector<index_t> few{0, 1};
  bad = rope_args{};
  bad.positions = few;
  check_error([&] { ref.rope_forward(x.view(), heads, hd, bad); },
              {"rope_forward", "positions.size is 2", "expected 9"});
  const std::vector<index_t> negative{0, 1, 2, 3, -4, 5, 6, 7, 8};
  bad.positions = negative;
  check_error([&] { eig.rope_forward(x.view(), heads, hd, bad); }, {"positions[4] is -4"});
}
#endif
