// Tests of reference_backend<double>: dense kernels, embedding, RMSNorm, RoPE, SwiGLU and
// cross-entropy against formulas written in the test, and every backward kernel against
// central finite differences of sum(w_out * forward(x)).
#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <limits>
#include <vector>

#include "reference_testing.hpp"
#include "tightfit/backend/reference.hpp"

using namespace tightfit;
using namespace tightfit::testing;

namespace {

/// op(X) as an explicit matrix.
dmat op_of(const dmat& x, transpose t) {
  if (t == transpose::no) return x;
  dmat r(x.cols, x.rows);
  for (index_t i = 0; i < x.rows; ++i)
    for (index_t j = 0; j < x.cols; ++j) r(j, i) = x(i, j);
  return r;
}

dmat naive_product(const dmat& a, const dmat& b) {
  dmat c(a.rows, b.cols);
  for (index_t i = 0; i < a.rows; ++i)
    for (index_t j = 0; j < b.cols; ++j)
      for (index_t l = 0; l < a.cols; ++l) c(i, j) += a(i, l) * b(l, j);
  return c;
}

}  // namespace

TEST_CASE("gemm: every transpose combination against a naive product, alpha and beta") {
  reference_backend<double> be;
  const index_t m = 5, n = 3, k = 7;
  const double alpha = 0.75, beta = -1.25;
  for (transpose ta : {transpose::no, transpose::yes})
    for (transpose tb : {transpose::no, transpose::yes}) {
      CAPTURE(static_cast<int>(ta));
      CAPTURE(static_cast<int>(tb));
      // stored shapes: A is (m,k) or (k,m); B is (k,n) or (n,k)
      const dmat a = ta == transpose::no ? dmat::random(m, k, 1) : dmat::random(k, m, 1);
      const dmat b = tb == transpose::no ? dmat::random(k, n, 2) : dmat::random(n, k, 2);
      const dmat c0 = dmat::random(m, n, 3);
      const dmat prod = naive_product(op_of(a, ta), op_of(b, tb));
      dmat c = c0;
      be.gemm(ta, tb, alpha, a.cview(), b.cview(), beta, c.view());
      dmat want(m, n);
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) want(i, j) = alpha * prod(i, j) + beta * c0(i, j);
      CHECK(max_rel_diff(c.v, want.v) < 1e-14);

      // beta == 0 overwrites: NaN in C must not propagate
      dmat cn(m, n, std::numeric_limits<double>::quiet_NaN());
      be.gemm(ta, tb, 1.0, a.cview(), b.cview(), 0.0, cn.view());
      CHECK(max_rel_diff(cn.v, prod.v) < 1e-14);
    }
}

TEST_CASE("gemm: strided views (sub-blocks of wider buffers), k == 0, stats") {
  reference_backend<double> be;
  dmat big_a = dmat::random(6, 10, 4), big_b = dmat::random(9, 8, 5);
  dmat big_c = dmat::random(7, 7, 6);
  const dmat c_before = big_c;
  auto a = big_a.view().row_range(1, 5).col_range(2, 8);  // (4, 6)
  auto b = big_b.view().row_range(0, 6).col_range(3, 6);  // (6, 3)
  auto c = big_c.view().row_range(2, 6).col_range(1, 4);  // (4, 3)
  be.gemm(transpose::no, transpose::no, 1.0, a, b, 0.0, c);
  dmat da(4, 6), db(6, 3);
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 6; ++j) da(i, j) = a(i, j);
  for (index_t i = 0; i < 6; ++i)
    for (index_t j = 0; j < 3; ++j) db(i, j) = b(i, j);
  const dmat want = naive_product(da, db);
  CHECK(max_rel_diff(to_vector(matrix_view<const double>(c)), want.v) < 1e-14);
  // elements outside the C block are untouched
  for (index_t i = 0; i < 7; ++i)
    for (index_t j = 0; j < 7; ++j)
      if (i < 2 || i >= 6 || j < 1 || j >= 4) CHECK(big_c(i, j) == c_before(i, j));
  CHECK(be.stats().gemm_calls == 1);
  CHECK(be.stats().gemm_flops == doctest::Approx(2.0 * 4 * 3 * 6));

  // k == 0: C = beta C
  dmat e0(3, 0), e1(0, 2), cz = dmat::random(3, 2, 7);
  const dmat cz0 = cz;
  be.gemm(transpose::no, transpose::no, 1.0, e0.cview(), e1.cview(), 2.0, cz.view());
  for (std::size_t i = 0; i < cz.v.size(); ++i) CHECK(cz.v[i] == doctest::Approx(2 * cz0.v[i]));
}

TEST_CASE("gemm_batched equals gemm per batch entry") {
  reference_backend<double> be;
  const index_t batch = 3, m = 4, n = 5, k = 2;
  const dmat a = dmat::random(batch * k, m, 8);  // each entry (k, m): used transposed
  const dmat b = dmat::random(batch * k, n, 9);  // each entry (k, n)
  dmat c = dmat::random(batch * m, n, 10);
  dmat c_ref = c;
  be.gemm_batched(transpose::yes, transpose::no, 0.5, {a.v.data(), batch, k, m},
                  {b.v.data(), batch, k, n}, 2.0, {c.v.data(), batch, m, n});
  CHECK(be.stats().gemm_calls == 1);
  CHECK(be.stats().gemm_flops == doctest::Approx(2.0 * m * n * k * batch));
  for (index_t i = 0; i < batch; ++i)
    be.gemm(transpose::yes, transpose::no, 0.5, {a.v.data() + i * k * m, k, m},
            {b.v.data() + i * k * n, k, n}, 2.0, {c_ref.v.data() + i * m * n, m, n});
  CHECK(max_rel_diff(c.v, c_ref.v) == 0.0);
}

TEST_CASE("gemm gradients by finite differences (the transposed products of backprop)") {
  // f(A, B) = sum W * (A B^T): dA = W B, dB = W^T A, computed with gemm's transpose flags.
  reference_backend<double> be;
  dmat a = dmat::random(4, 3, 11), b = dmat::random(5, 3, 12);
  const dmat w = dmat::random(4, 5, 13);
  auto f = [&] {
    dmat c(4, 5);
    be.gemm(transpose::no, transpose::yes, 1.0, a.cview(), b.cview(), 0.0, c.view());
    return weighted_sum(w.v, c.v);
  };
  dmat da(4, 3), db(5, 3);
  be.gemm(transpose::no, transpose::no, 1.0, w.cview(), b.cview(), 0.0, da.view());
  be.gemm(transpose::yes, transpose::no, 1.0, w.cview(), a.cview(), 0.0, db.view());
  CHECK(max_rel_diff(da.v, numeric_grad(a.v, f)) < grad_tol);
  CHECK(max_rel_diff(db.v, numeric_grad(b.v, f)) < grad_tol);
}

TEST_CASE("axpy, scale, fill, copy") {
  reference_backend<double> be;
  const dmat x = dmat::random(3, 4, 14);
  dmat y = dmat::random(3, 4, 15);
  const dmat y0 = y;
  be.axpy(-0.5, x.cview(), y.view());
  for (std::size_t i = 0; i < y.v.size(); ++i)
    CHECK(y.v[i] == doctest::Approx(y0.v[i] - 0.5 * x.v[i]));
  be.scale(3.0, y.view());
  for (std::size_t i = 0; i < y.v.size(); ++i)
    CHECK(y.v[i] == doctest::Approx(3 * (y0.v[i] - 0.5 * x.v[i])));
  be.copy(x.cview(), y.view());
  CHECK(y.v == x.v);
  // fill on a strided block touches only the block
  dmat z(4, 5, 1.0);
  be.fill(z.view().row_range(1, 3).col_range(2, 4), 7.0);
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 5; ++j)
      CHECK(z(i, j) == ((i >= 1 && i < 3 && j >= 2 && j < 4) ? 7.0 : 1.0));
}

TEST_CASE("upload, download, allocate are counted") {
  reference_backend<double> be;
  {
    auto buf = be.allocate<double>(10);
    CHECK(buf.size() == 10);
    CHECK(be.memory().live() == 10 * sizeof(double));
    std::vector<double> host = uniform<double>(10, 16), back(10);
    be.upload(host, buf.span());
    be.download(buf.span(), back);
    CHECK(back == host);
    auto ints = be.allocate<token_id>(3);
    CHECK(be.memory().live() == 10 * sizeof(double) + 3 * sizeof(token_id));
  }
  CHECK(be.memory().live() == 0);
  CHECK(be.memory().peak() == 10 * sizeof(double) + 3 * sizeof(token_id));
}

TEST_CASE("embedding forward gathers rows, backward scatters with repeats") {
  reference_backend<double> be;
  const index_t vocab = 6, d = 4;
  dmat table = dmat::random(vocab, d, 17);
  const std::vector<token_id> ids = {3, 0, 3, 5, 1, 3, 2};
  const auto n = static_cast<index_t>(ids.size());
  dmat out(n, d);
  be.embedding_forward(table.cview(), ids, out.view());
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < d; ++j) CHECK(out(i, j) == table(ids[static_cast<std::size_t>(i)], j));

  const dmat w = dmat::random(n, d, 18);
  auto f = [&] {
    dmat o(n, d);
    be.embedding_forward(table.cview(), ids, o.view());
    return weighted_sum(w.v, o.v);
  };
  dmat dtable = dmat::random(vocab, d, 19);  // backward accumulates onto what is there
  const dmat dtable0 = dtable;
  be.embedding_backward(w.cview(), ids, dtable.view());
  const auto fd = numeric_grad(table.v, f);
  std::vector<double> added(dtable.v.size());
  for (std::size_t i = 0; i < added.size(); ++i) added[i] = dtable.v[i] - dtable0.v[i];
  CHECK(max_rel_diff(added, fd) < grad_tol);
}

TEST_CASE("rmsnorm forward matches the formula, backward matches finite differences") {
  reference_backend<double> be;
  const index_t n = 5, d = 7;
  const double eps = 1e-5;
  dmat x = dmat::random(n, d, 20);
  std::vector<double> w = uniform<double>(d, 21, 0.5, 1.5);
  dmat y(n, d);
  std::vector<double> rstd(static_cast<std::size_t>(n));
  be.rmsnorm_forward(x.cview(), std::span<const double>(w), eps, y.view(), std::span(rstd));
  for (index_t i = 0; i < n; ++i) {
    double ms = 0;
    for (index_t j = 0; j < d; ++j) ms += x(i, j) * x(i, j) / static_cast<double>(d);
    CHECK(rstd[static_cast<std::size_t>(i)] ==
          doctest::Approx(1 / std::sqrt(ms + eps)).epsilon(1e-14));
    for (index_t j = 0; j < d; ++j)
      CHECK(y(i, j) ==
            doctest::Approx(x(i, j) / std::sqrt(ms + eps) * w[static_cast<std::size_t>(j)])
                .epsilon(1e-14));
  }

  const dmat wout = dmat::random(n, d, 22);
  auto f = [&] {
    dmat yy(n, d);
    std::vector<double> rr(static_cast<std::size_t>(n));
    be.rmsnorm_forward(x.cview(), std::span<const double>(w), eps, yy.view(), std::span(rr));
    return weighted_sum(wout.v, yy.v);
  };
  dmat dx(n, d);
  std::vector<double> dw(static_cast<std::size_t>(d));
  be.rmsnorm_backward(x.cview(), std::span<const double>(w), std::span<const double>(rstd),
                      wout.cview(), dx.view(), std::span(dw));
  CHECK(max_rel_diff(dx.v, numeric_grad(x.v, f)) < grad_tol);
  CHECK(max_rel_diff(dw, numeric_grad(w, f)) < grad_tol);

  // accumulation: a second call doubles dx and dw; an empty dw skips the weight gradient
  const dmat dx1 = dx;
  const std::vector<double> dw1 = dw;
  be.rmsnorm_backward(x.cview(), std::span<const double>(w), std::span<const double>(rstd),
                      wout.cview(), dx.view(), std::span(dw));
  for (std::size_t i = 0; i < dx.v.size(); ++i) CHECK(dx.v[i] == doctest::Approx(2 * dx1.v[i]));
  for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw[i] == doctest::Approx(2 * dw1[i]));
  dmat dx_only(n, d);
  be.rmsnorm_backward(x.cview(), std::span<const double>(w), std::span<const double>(rstd),
                      wout.cview(), dx_only.view(), std::span<double>());
  CHECK(max_rel_diff(dx_only.v, dx1.v) < 1e-15);
}

TEST_CASE("rmsnorm per head: (n, H*hd) reshaped to (n*H, hd)") {
  reference_backend<double> be;
  const index_t n = 3, heads = 4, hd = 6;
  const dmat x = dmat::random(n, heads * hd, 23);
  const std::vector<double> w = uniform<double>(hd, 24, 0.5, 1.5);
  dmat y(n, heads * hd);
  std::vector<double> rstd(static_cast<std::size_t>(n * heads));
  be.rmsnorm_forward(x.cview().reshape(n * heads, hd), std::span<const double>(w), 1e-6,
                     y.view().reshape(n * heads, hd), std::span(rstd));
  // head 2 of row 1 alone
  dmat xh(1, hd), yh(1, hd);
  for (index_t c = 0; c < hd; ++c) xh(0, c) = x(1, 2 * hd + c);
  std::vector<double> r1(1);
  be.rmsnorm_forward(xh.cview(), std::span<const double>(w), 1e-6, yh.view(), std::span(r1));
  for (index_t c = 0; c < hd; ++c) CHECK(y(1, 2 * hd + c) == yh(0, c));
  CHECK(rstd[1 * heads + 2] == r1[0]);
}

TEST_CASE("rope forward matches the complex rotation and is relative in position") {
  reference_backend<double> be;
  const index_t n = 5, heads = 3, hd = 8, pos0 = 11;
  const double theta = 10000.0;
  const dmat x = dmat::random(n, heads * hd, 25);
  dmat y = x;
  be.rope_forward(y.view(), heads, hd, {pos0, {}, {}, theta});
  const index_t half = hd / 2;
  for (index_t i = 0; i < n; ++i)
    for (index_t h = 0; h < heads; ++h)
      for (index_t k = 0; k < half; ++k) {
        // (x1 + i x2) * exp(i angle), angle = p / theta^(2k/hd)
        const double angle = static_cast<double>(pos0 + i) /
                             std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(hd));
        const std::complex<double> z =
            std::complex<double>(x(i, h * hd + k), x(i, h * hd + k + half)) *
            std::polar(1.0, angle);
        CHECK(y(i, h * hd + k) == doctest::Approx(z.real()).epsilon(1e-13));
        CHECK(y(i, h * hd + k + half) == doctest::Approx(z.imag()).epsilon(1e-13));
      }

  // q.k after rope depends only on the position difference: rows at pos0 = 11 vs pos0 = 4
  dmat q = dmat::random(1, hd, 26), k = dmat::random(1, hd, 27);
  auto rotated_dot = [&](index_t pq, index_t pk) {
    dmat qq = q, kk = k;
    be.rope_forward(qq.view(), 1, hd, {pq, {}, {}, theta});
    be.rope_forward(kk.view(), 1, hd, {pk, {}, {}, theta});
    return weighted_sum(qq.v, kk.v);
  };
  CHECK(rotated_dot(20, 13) == doctest::Approx(rotated_dot(9, 2)).epsilon(1e-12));
  CHECK(rotated_dot(0, 0) == doctest::Approx(weighted_sum(q.v, k.v)).epsilon(1e-14));
}

TEST_CASE("rope backward is the transpose (finite differences), odd head_dim rejected") {
  reference_backend<double> be;
  const index_t n = 4, heads = 2, hd = 6, pos0 = 3;
  const double theta = 500.0;
  dmat x = dmat::random(n, heads * hd, 28);
  const dmat w = dmat::random(n, heads * hd, 29);
  auto f = [&] {
    dmat y = x;
    be.rope_forward(y.view(), heads, hd, {pos0, {}, {}, theta});
    return weighted_sum(w.v, y.v);
  };
  dmat dx = w;
  be.rope_backward(dx.view(), heads, hd, {pos0, {}, {}, theta});
  CHECK(max_rel_diff(dx.v, numeric_grad(x.v, f)) < grad_tol);
  // backward undoes forward (a rotation)
  dmat y = x;
  be.rope_forward(y.view(), heads, hd, {pos0, {}, {}, theta});
  be.rope_backward(y.view(), heads, hd, {pos0, {}, {}, theta});
  CHECK(max_rel_diff(y.v, x.v) < 1e-14);

  dmat odd(2, 10);
  check_error(
      [&] {
        be.rope_forward(odd.view(), 2, 5, {0, {}, {}, theta});
      },
      {"rope_forward", "head_dim is 5"});
  check_error(
      [&] {
        be.rope_backward(odd.view(), 2, 5, {0, {}, {}, theta});
      },
      {"rope_backward", "5"});
}

TEST_CASE("swiglu forward matches the formula, backward matches finite differences") {
  reference_backend<double> be;
  const index_t n = 4, f_dim = 9;
  dmat gate = dmat::random(n, f_dim, 30, -4, 4), up = dmat::random(n, f_dim, 31);
  dmat out(n, f_dim);
  be.swiglu_forward(gate.cview(), up.cview(), out.view());
  for (std::size_t i = 0; i < out.v.size(); ++i)
    CHECK(out.v[i] ==
          doctest::Approx(gate.v[i] / (1 + std::exp(-gate.v[i])) * up.v[i]).epsilon(1e-14));

  const dmat w = dmat::random(n, f_dim, 32);
  auto f = [&] {
    dmat o(n, f_dim);
    be.swiglu_forward(gate.cview(), up.cview(), o.view());
    return weighted_sum(w.v, o.v);
  };
  dmat dgate(n, f_dim), dup(n, f_dim);
  be.swiglu_backward(gate.cview(), up.cview(), w.cview(), dgate.view(), dup.view());
  CHECK(max_rel_diff(dgate.v, numeric_grad(gate.v, f)) < grad_tol);
  CHECK(max_rel_diff(dup.v, numeric_grad(up.v, f)) < grad_tol);
}

TEST_CASE("geglu forward matches the formula, backward matches finite differences") {
  reference_backend<double> be;
  const index_t n = 4, f_dim = 9;
  dmat gate = dmat::random(n, f_dim, 30, -4, 4), up = dmat::random(n, f_dim, 31);
  dmat out(n, f_dim);
  be.geglu_forward(gate.cview(), up.cview(), out.view());
  const double pi = 3.14159265358979323846;
  for (std::size_t i = 0; i < out.v.size(); ++i) {
    const double g = gate.v[i];  // PyTorch's gelu(approximate="tanh"), written out
    const double gelu = 0.5 * g * (1 + std::tanh(std::sqrt(2 / pi) * (g + 0.044715 * g * g * g)));
    CHECK(out.v[i] == doctest::Approx(gelu * up.v[i]).epsilon(1e-14));
  }
  const dmat w = dmat::random(n, f_dim, 32);
  auto f = [&] {
    dmat o(n, f_dim);
    be.geglu_forward(gate.cview(), up.cview(), o.view());
    return weighted_sum(w.v, o.v);
  };
  dmat dgate(n, f_dim), dup(n, f_dim);
  be.geglu_backward(gate.cview(), up.cview(), w.cview(), dgate.view(), dup.view());
  CHECK(max_rel_diff(dgate.v, numeric_grad(gate.v, f)) < grad_tol);
  CHECK(max_rel_diff(dup.v, numeric_grad(up.v, f)) < grad_tol);
}

TEST_CASE("logit soft-capping: cap tanh(z / cap), backward matches finite differences") {
  reference_backend<double> be;
  const index_t n = 3, v = 8;
  const double cap = 2.5;
  dmat z = dmat::random(n, v, 34, -6, 6);
  dmat y = z;
  be.logit_softcap_forward(y.view(), cap);
  for (std::size_t i = 0; i < y.v.size(); ++i)
    CHECK(y.v[i] == doctest::Approx(cap * std::tanh(z.v[i] / cap)).epsilon(1e-14));
  const dmat w = dmat::random(n, v, 35);
  auto f = [&] {
    dmat o = z;
    be.logit_softcap_forward(o.view(), cap);
    return weighted_sum(w.v, o.v);
  };
  dmat dz = w;  // dL/dy = w
  be.logit_softcap_backward(y.cview(), dz.view(), cap);
  CHECK(max_rel_diff(dz.v, numeric_grad(z.v, f)) < grad_tol);
  CHECK_THROWS_WITH_AS(be.logit_softcap_forward(y.view(), 0.0),
                       doctest::Contains("logit_softcap_forward: cap is 0"), error);
}

TEST_CASE("xent forward matches a naive log-softmax, backward matches finite differences") {
  reference_backend<double> be;
  const index_t n = 5, vocab = 7;
  const double tau = 0.7;
  dmat logits = dmat::random(n, vocab, 33, -3, 3);
  const std::vector<token_id> labels = {2, ignore_index, 0, 6, 3};
  std::vector<double> lse(static_cast<std::size_t>(n)), lp(static_cast<std::size_t>(n));
  be.xent_forward(logits.cview(), labels, tau, std::span(lse), std::span(lp));
  for (index_t i = 0; i < n; ++i) {
    double sum = 0;
    for (index_t j = 0; j < vocab; ++j) sum += std::exp(logits(i, j) / tau);
    const auto r = static_cast<std::size_t>(i);
    CHECK(lse[r] == doctest::Approx(std::log(sum)).epsilon(1e-14));
    if (labels[r] == ignore_index)
      CHECK(lp[r] == 0.0);
    else
      CHECK(lp[r] ==
            doctest::Approx(std::log(std::exp(logits(i, labels[r]) / tau) / sum)).epsilon(1e-13));
  }

  const std::vector<double> coeff = uniform<double>(n, 34, -2, 2);
  auto f = [&] {
    std::vector<double> l(static_cast<std::size_t>(n)), p(static_cast<std::size_t>(n));
    be.xent_forward(logits.cview(), labels, tau, std::span(l), std::span(p));
    return weighted_sum(coeff, p);
  };
  const auto fd = numeric_grad(logits.v, f);
  dmat grad = logits;
  be.xent_backward(grad.view(), labels, std::span<const double>(lse),
                   std::span<const double>(coeff), tau);
  CHECK(max_rel_diff(grad.v, fd) < grad_tol);
  for (index_t j = 0; j < vocab; ++j) CHECK(grad(1, j) == 0.0);  // the ignored row
}

TEST_CASE("xent is stable for huge logits") {
  reference_backend<double> be;
  dmat logits(2, 3);
  logits(0, 0) = 1000;
  logits(0, 1) = 999;
  logits(0, 2) = -1000;
  logits(1, 0) = -800;
  logits(1, 1) = -801;
  logits(1, 2) = -802;
  const std::vector<token_id> labels = {1, 2};
  std::vector<double> lse(2), lp(2);
  be.xent_forward(logits.cview(), labels, 1.0, std::span(lse), std::span(lp));
  CHECK(std::isfinite(lse[0]));
  CHECK(lp[0] == doctest::Approx(-1 - std::log1p(std::exp(-1.0))).epsilon(1e-12));
  CHECK(lp[1] ==
        doctest::Approx(-2 - std::log(1 + std::exp(-1.0) + std::exp(-2.0))).epsilon(1e-12));
}

TEST_CASE("reference_backend<float> agrees with double to float precision") {
  reference_backend<float> bf;
  reference_backend<double> bd;
  const index_t n = 6, d = 16;
  const dmat x = dmat::random(n, d, 35);
  std::vector<float> xf(x.v.begin(), x.v.end()), w(static_cast<std::size_t>(d), 1.0f),
      yf(x.v.size()), rf(static_cast<std::size_t>(n));
  std::vector<double> wd(static_cast<std::size_t>(d), 1.0), yd(x.v.size()),
      rd(static_cast<std::size_t>(n));
  bf.rmsnorm_forward(matrix_view<const float>(xf.data(), n, d), std::span<const float>(w), 1e-6f,
                     matrix_view<float>(yf.data(), n, d), std::span(rf));
  bd.rmsnorm_forward(x.cview(), std::span<const double>(wd), 1e-6,
                     matrix_view<double>(yd.data(), n, d), std::span(rd));
  CHECK(max_rel_diff(yf, yd) < 1e-6);
  std::vector<float> cf(static_cast<std::size_t>(n * n));
  std::vector<double> cd(static_cast<std::size_t>(n * n));
  bf.gemm(transpose::no, transpose::yes, 1.0f, matrix_view<const float>(xf.data(), n, d),
          matrix_view<const float>(xf.data(), n, d), 0.0f, matrix_view<float>(cf.data(), n, n));
  bd.gemm(transpose::no, transpose::yes, 1.0, x.cview(), x.cview(), 0.0,
          matrix_view<double>(cd.data(), n, n));
  CHECK(max_rel_diff(cf, cd) < 1e-6);
}
