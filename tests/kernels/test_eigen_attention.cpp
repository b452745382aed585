// Tests of eigen_backend's flash attention against reference_backend (float and double): GQA
// ratios 1/2/4/8, query ranges [q0, q1) and key prefixes that are not multiples of any tile,
// padding (valid_len < nk, also below q0), queries past the last key, strided Q/K/V inside one
// fused QKV buffer, accumulation into non-zero gradients, both backward strategies and several
// tilings; the backward against finite differences (double); the tiles skipped above the
// diagonal (flop counts); the memory bound (no score matrix); and bad input.
// Built only when Eigen is visible (tests/kernels links tightfit::eigen when it is found).
#if __has_include(<Eigen/Core>)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "test_eigen_common.hpp"

#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
#include <tbb/task_arena.h>
#endif

using namespace tightfit;
using namespace tightfit::testing;

namespace {

struct attention_case {
  index_t heads, kv_heads, hd, nq, nk, q0, valid_len;
};

/// Q, K, V as column blocks of one fused (rows, (H + 2 Hkv) hd + pad) buffer, as a QKV
/// projection writes them; dQ, dK, dV likewise, filled with non-zero values (accumulation).
template <class T>
struct attention_data {
  attention_shape shape;
  index_t nq, nk;
  padded<T> qkv_q, qkv_k;  // fused buffers: rows of queries, rows of keys
  padded<T> o, lse, d_o;
  padded<T> grad_q, grad_k;  // fused gradient buffers

  attention_data(const attention_case& c, std::uint64_t seed)
      : shape{c.heads, c.kv_heads, c.hd},
        nq(c.nq),
        nk(c.nk),
        qkv_q(padded<T>::random(c.nq, width(c), seed, 3)),
        qkv_k(padded<T>::random(c.nk, width(c), seed + 1, 1)),
        o(c.nq, c.heads * c.hd, 2),
        lse(c.nq, c.heads, 1),
        d_o(padded<T>::random(c.nq, c.heads * c.hd, seed + 2, 2)),
        grad_q(padded<T>::random(c.nq, width(c), seed + 3, 3, -0.1, 0.1)),
        grad_k(padded<T>::random(c.nk, width(c), seed + 4, 1, -0.1, 0.1)) {}
  static index_t width(const attention_case& c) { return (c.heads + 2 * c.kv_heads) * c.hd; }
  index_t qw() const { return shape.heads * shape.head_dim; }
  index_t kw() const { return shape.kv_heads * shape.head_dim; }
  matrix_view<const T> q() const { return qkv_q.cview().col_range(0, qw()); }
  matrix_view<const T> k() const { return qkv_k.cview().col_range(qw(), qw() + kw()); }
  matrix_view<const T> v() const { return qkv_k.cview().col_range(qw() + kw(), qw() + 2 * kw()); }
  matrix_view<T> dq() { return grad_q.view().col_range(0, qw()); }
  matrix_view<T> dk() { return grad_k.view().col_range(qw(), qw() + kw()); }
  matrix_view<T> dv() { return grad_k.view().col_range(qw() + kw(), qw() + 2 * kw()); }
};

template <class T>
T scale_of(index_t hd) {
  return static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
}

template <class Backend, class T>
void run_forward(Backend& be, attention_data<T>& d, const attention_case& c) {
  be.attention_forward(d.shape, d.q(), d.k(), d.v(), {c.q0, c.valid_len}, scale_of<T>(c.hd),
                       d.o.view(), d.lse.view());
}

template <class Backend, class T>
void run_backward(Backend& be, attention_data<T>& d, const attention_case& c) {
  be.attention_backward(d.shape, d.q(), d.k(), d.v(), d.o.cview(), d.d_o.cview(), d.lse.cview(),
                        {c.q0, c.valid_len}, scale_of<T>(c.hd), d.dq(), d.dk(), d.dv());
}

const attention_case kCases[] = {
    // heads kv hd  nq  nk  q0 valid
    {1, 1, 8, 1, 1, 0, 1},         // one row, one key
    {2, 2, 4, 13, 13, 0, 13},      // GQA 1, full causal
    {4, 2, 6, 17, 40, 23, 40},     // GQA 2, a query range [23, 40) against its key prefix
    {4, 1, 8, 9, 31, 11, 31},      // GQA 4, keys past the queries (never attended)
    {8, 1, 4, 21, 50, 29, 37},     // GQA 8, padding inside the range
    {6, 3, 10, 15, 33, 5, 3},      // all but 3 keys padded, valid_len below q0
    {2, 1, 16, 70, 67, 0, 67},     // queries past the last key (p >= nk)
    {8, 2, 64, 150, 150, 0, 150},  // several default tiles, partial last tile
    {4, 4, 32, 100, 230, 130, 201},
};

/// Tilings: the default, 64 x 64, small odd tiles, bq < bk, bq > bk, each with both backward
/// strategies.
std::vector<eigen_backend_options> tilings() {
  std::vector<eigen_backend_options> out;
  const std::pair<index_t, index_t> tiles[] = {{64, 128}, {64, 64}, {5, 7}, {8, 16}, {16, 3}};
  for (const auto& tile : tiles) {
    for (const auto strategy :
         {attention_backward_strategy::thread_partials, attention_backward_strategy::two_pass}) {
      eigen_backend_options o;
      o.attention_tile_q = tile.first;
      o.attention_tile_k = tile.second;
      o.attention_backward = strategy;
      out.push_back(o);
    }
  }
  return out;
}

std::string describe(const eigen_backend_options& o) {
  return std::to_string(o.attention_tile_q) + "x" + std::to_string(o.attention_tile_k) +
         (o.attention_backward == attention_backward_strategy::two_pass ? " two_pass"
                                                                        : " partials");
}

}  // namespace

TEST_CASE_TEMPLATE("eigen attention forward and backward match the reference", T, float, double) {
  std::uint64_t seed = 1000;
  for (const auto& c : kCases) {
    CAPTURE(c.heads);
    CAPTURE(c.kv_heads);
    CAPTURE(c.hd);
    CAPTURE(c.nq);
    CAPTURE(c.nk);
    CAPTURE(c.q0);
    CAPTURE(c.valid_len);
    seed += 10;
    reference_backend<T> ref;
    attention_data<T> want(c, seed);
    run_forward(ref, want, c);
    run_backward(ref, want, c);
    for (const auto& opt : tilings()) {
      const std::string tiling = describe(opt);
      CAPTURE(tiling);
      eigen_backend<T> eig(opt);
      attention_data<T> got(c, seed);
      run_forward(eig, got, c);
      const auto values = got.o.values();
      REQUIRE(std::all_of(values.begin(), values.end(), [](T x) { return std::isfinite(x); }));
      check_matches(got.o, want.o, "O");
      check_matches(got.lse, want.lse, "lse");
      // The backward uses the reference forward's O and lse, so it is compared alone.
      got.o = want.o;
      got.lse = want.lse;
      run_backward(eig, got, c);
      check_matches(got.grad_q, want.grad_q, "dQ (fused buffer)", 4);
      check_matches(got.grad_k, want.grad_k, "dK, dV (fused buffer)", 4);
      CHECK(got.qkv_q.padding_intact());
      CHECK(got.qkv_k.padding_intact());
      CHECK(eig.memory().live() == 0);
      CHECK(eig.stats().attention_forward_calls == 1);
      CHECK(eig.stats().attention_backward_calls == 1);
    }
  }
}

TEST_CASE("eigen attention backward matches finite differences (double)") {
  const attention_case cases[] = {
      {4, 2, 4, 5, 9, 3, 9}, {4, 1, 2, 6, 6, 0, 4}, {2, 2, 3, 4, 7, 2, 7}};
  for (const auto& c : cases) {
    CAPTURE(c.heads);
    CAPTURE(c.kv_heads);
    for (const auto strategy :
         {attention_backward_strategy::thread_partials, attention_backward_strategy::two_pass}) {
      eigen_backend_options opt;
      opt.attention_tile_q = 2;
      opt.attention_tile_k = 3;
      opt.attention_backward = strategy;
      eigen_backend<double> eig(opt);
      attention_data<double> d(c, 77);
      const auto weights = d.d_o;  // L = sum(weights * O), so dO = weights
      auto loss = [&]() {
        run_forward(eig, d, c);
        double sum = 0;
        for (index_t i = 0; i < d.nq; ++i)
          for (index_t j = 0; j < d.qw(); ++j) sum += weights.at(i, j) * d.o.at(i, j);
        return sum;
      };
      loss();
      const auto dq0 = d.grad_q, dk0 = d.grad_k;
      run_backward(eig, d, c);
      // numeric gradient over every entry of the fused buffers (Q, K, V columns)
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
      const auto gq = numeric(d.qkv_q), gk = numeric(d.qkv_k);
      padded<double> aq(d.nq, d.grad_q.cols), ak(d.nk, d.grad_k.cols);
      for (index_t i = 0; i < d.nq; ++i)
        for (index_t j = 0; j < aq.cols; ++j) aq.at(i, j) = d.grad_q.at(i, j) - dq0.at(i, j);
      for (index_t i = 0; i < d.nk; ++i)
        for (index_t j = 0; j < ak.cols; ++j) ak.at(i, j) = d.grad_k.at(i, j) - dk0.at(i, j);
      // only the Q columns of the query buffer and the K, V columns of the key buffer carry
      // gradients; every other column must stay untouched (numeric gradient zero there too)
      CHECK(rel_diff(aq, gq) < 1e-6);
      CHECK(rel_diff(ak, gk) < 1e-6);
    }
  }
}

TEST_CASE_TEMPLATE("eigen attention computes only tiles on or below the diagonal", T, float,
                   double) {
  // flops of computed tiles lie between the exact causal work (the reference counts visible
  // (query, key) pairs) and that plus less than one key tile per (head, query row): a row
  // computes only the key tiles that start at or before its position
  const attention_case c{4, 2, 8, 96, 96, 0, 96};
  for (const auto& tile : {std::pair<index_t, index_t>{16, 16}, {8, 32}, {32, 8}}) {
    const index_t tq = tile.first, tk = tile.second;
    eigen_backend_options opt;
    opt.attention_tile_q = tq;
    opt.attention_tile_k = tk;
    eigen_backend<T> eig(opt);
    reference_backend<T> ref;
    attention_data<T> a(c, 5), b(c, 5);
    run_forward(ref, a, c);
    run_forward(eig, b, c);
    const double exact = ref.stats().attention_flops;
    const double per_element = 4.0 * static_cast<double>(c.hd);
    const double waste = per_element * static_cast<double>(c.heads * c.nq * tk);
    const double full = per_element * static_cast<double>(c.heads * c.nq * c.nk);
    CHECK(eig.stats().attention_flops >= exact);
    CHECK(eig.stats().attention_flops <= exact + waste);
    CHECK(eig.stats().attention_flops < 0.7 * full);
    // backward (thread_partials): 5 tile products per computed element, 2.5x the forward's
    const double forward = eig.stats().attention_flops;
    run_backward(eig, b, c);
    const double backward = eig.stats().attention_flops - forward;
    CHECK(backward >= 2.5 * exact);
    CHECK(backward <= 2.5 * (exact + waste));
  }
}

TEST_CASE_TEMPLATE("eigen attention scratch memory: no score matrix, tiles only", T, float,
                   double) {
  for (const auto strategy :
       {attention_backward_strategy::thread_partials, attention_backward_strategy::two_pass}) {
    std::size_t forward_one[2] = {}, forward_all[2] = {}, backward_all[2] = {};
    const index_t lengths[2] = {512, 1024};
    for (int i = 0; i < 2; ++i) {
      const attention_case c{2, 1, 16, lengths[i], lengths[i], 0, lengths[i]};
      eigen_backend_options opt;
      opt.attention_backward = strategy;
      opt.threads = 1;  // a backend with one worker
      eigen_backend<T> one(opt);
      attention_data<T> d(c, 9);
      run_forward(one, d, c);
      forward_one[i] = one.memory().peak();
      opt.threads = 0;  // and one with a worker per core
      eigen_backend<T> eig(opt);
      run_forward(eig, d, c);
      forward_all[i] = eig.memory().peak();
      eig.memory().reset_peak();
      run_backward(eig, d, c);
      backward_all[i] = eig.memory().peak();
      CHECK(eig.memory().live() == 0);
    }
    CHECK(forward_one[0] > 0);                // scratch goes through allocate
    CHECK(forward_one[1] == forward_one[0]);  // one worker: one tile's scratch, whatever T
    for (int i = 0; i < 2; ++i) {             // one tile's scratch per worker
      CHECK(forward_all[i] <=
            static_cast<std::size_t>(eigen_backend<T>().threads()) * forward_one[0]);
    }
    const auto score_matrix = static_cast<std::size_t>(1024 * 1024) * sizeof(T);  // one head
    CHECK(backward_all[1] < score_matrix / 4);
  }
}

#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
TEST_CASE("eigen attention backward with per-thread dQ partials in a 2-slot arena") {
  // A backend whose arena has 2 slots takes the partial-sum path even on one core.
  const attention_case c{8, 2, 8, 64, 64, 0, 60};
  reference_backend<double> ref;
  attention_data<double> want(c, 31);
  run_forward(ref, want, c);
  run_backward(ref, want, c);
  eigen_backend_options opt;
  opt.attention_tile_q = 8;
  opt.attention_tile_k = 8;
  opt.threads = 2;
  eigen_backend<double> eig(opt);
  CHECK(eig.threads() == 2);
  attention_data<double> got(c, 31);
  run_forward(eig, got, c);
  run_backward(eig, got, c);
  check_matches(got.o, want.o, "O");
  check_matches(got.grad_q, want.grad_q, "dQ", 4);
  check_matches(got.grad_k, want.grad_k, "dK, dV", 4);
}

TEST_CASE("eigen attention backward falls back to two_pass when the dQ partials are too big") {
  const attention_case c{4, 2, 8, 40, 40, 0, 40};
  auto backward_flops = [&](attention_backward_strategy strategy, std::size_t max_bytes) {
    eigen_backend_options opt;
    opt.attention_tile_q = 8;
    opt.attention_tile_k = 8;
    opt.attention_backward = strategy;
    opt.attention_partials_max_bytes = max_bytes;
    opt.threads = 2;
    eigen_backend<double> eig(opt);
    attention_data<double> d(c, 41);
    run_forward(eig, d, c);
    const double forward = eig.stats().attention_flops;
    run_backward(eig, d, c);
    return eig.stats().attention_flops - forward;
  };
  const double partials = backward_flops(attention_backward_strategy::thread_partials, 1u << 30);
  const double two_pass = backward_flops(attention_backward_strategy::two_pass, 1u << 30);
  CHECK(two_pass > partials);  // the query-major pass recomputes S, dP
  CHECK(backward_flops(attention_backward_strategy::thread_partials, 0) == two_pass);
}
#endif

TEST_CASE("eigen attention rejects inconsistent shapes") {
  eigen_backend<double> be;
  const attention_case c{4, 2, 8, 5, 9, 0, 9};
  attention_data<double> d(c, 3);
  padded<double> bad_o(5, 31), bad_lse(5, 3), bad_k(9, 17);
  check_error(
      [&] {
        be.attention_forward({4, 3, 8}, d.q(), d.k(), d.v(), {0, 9}, 0.5, d.o.view(), d.lse.view());
      },
      {"attention_forward", "kv_heads 3"});
  check_error(
      [&] {
        be.attention_forward(d.shape, d.q(), d.k(), d.v(), {0, 9}, 0.5, bad_o.view(), d.lse.view());
      },
      {"attention_forward", "O", "(5 x 31)", "(5 x 32)"});
  check_error(
      [&] {
        be.attention_forward(d.shape, d.q(), d.k(), d.v(), {0, 9}, 0.5, d.o.view(), bad_lse.view());
      },
      {"attention_forward", "lse", "(5 x 3)", "(5 x 4)"});
  check_error(
      [&] {
        be.attention_forward(d.shape, d.q(), bad_k.cview(), d.v(), {0, 9}, 0.5, d.o.view(),
                             d.lse.view());
      },
      {"attention_forward", "K.cols", "17", "16"});
  check_error(
      [&] {
        be.attention_forward(d.shape, d.q(), d.k(), d.v(), {0, 0}, 0.5, d.o.view(), d.lse.view());
      },
      {"attention_forward", "valid_len", "0"});
  check_error(
      [&] {
        be.attention_backward(d.shape, d.q(), d.k(), d.v(), d.o.cview(), d.d_o.cview(),
                              d.lse.cview(), {0, 9}, 0.5, d.dq(), bad_k.view(), d.dv());
      },
      {"attention_backward", "dK", "(9 x 17)", "(9 x 16)"});
}

#endif  // __has_include(<Eigen/Core>)
