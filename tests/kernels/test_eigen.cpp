// Tests of eigen_backend<T> (float and double) against reference_backend<T>, the oracle: every
// dense, row-wise, cross-entropy and optimizer kernel on odd shapes, strided views whose padding
// must survive, accumulation into non-zero outputs, beta = 0 over NaN, the parallel GEMM split,
// determinism of the row reductions across thread counts, and bad input.
// Built only when Eigen is visible (tests/kernels links tightfit::eigen when it is found).
#if __has_include(<Eigen/Core>)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "test_eigen_common.hpp"

#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
#include <tbb/info.h>
#include <tbb/task_arena.h>
#endif

using namespace tightfit;
using namespace tightfit::testing;

namespace {

struct gemm_case {
  index_t m, n, k;
  double alpha, beta;
};

}  // namespace

TEST_CASE_TEMPLATE("eigen gemm matches the reference: transposes, strides, alpha, beta", T, float,
                   double) {
  const gemm_case cases[] = {{1, 1, 1, 1.0, 0.0},       {5, 3, 7, -0.5, 1.0},
                             {13, 1, 9, 2.0, 0.5},      {1, 17, 4, 1.0, -1.0},
                             {37, 29, 11, 0.7, 0.0},    {70, 150, 33, 1.0, 1.0},
                             {150, 70, 65, -1.0, 0.25}, {9, 8, 0, 1.0, 0.5}};
  std::uint64_t seed = 100;
  for (const bool eager : {false, true}) {
    eigen_backend<T> eig(eager ? eager_parallel_options() : eigen_backend_options{});
    reference_backend<T> ref;
    for (const auto& c : cases)
      for (const auto ta : {transpose::no, transpose::yes})
        for (const auto tb : {transpose::no, transpose::yes}) {
          CAPTURE(c.m);
          CAPTURE(c.n);
          CAPTURE(c.k);
          CAPTURE(eager);
          const bool at = ta == transpose::yes, bt = tb == transpose::yes;
          const auto a = padded<T>::random(at ? c.k : c.m, at ? c.m : c.k, ++seed, 3);
          const auto b = padded<T>::random(bt ? c.n : c.k, bt ? c.k : c.n, ++seed, 2);
          auto c_ref = padded<T>::random(c.m, c.n, ++seed, 5);
          auto c_eig = c_ref;
          const auto alpha = static_cast<T>(c.alpha), beta = static_cast<T>(c.beta);
          ref.gemm(ta, tb, alpha, a.cview(), b.cview(), beta, c_ref.view());
          eig.gemm(ta, tb, alpha, a.cview(), b.cview(), beta, c_eig.view());
          check_matches(c_eig, c_ref, "gemm");
        }
    CHECK(eig.stats().gemm_calls == ref.stats().gemm_calls);
    CHECK(eig.stats().gemm_flops == ref.stats().gemm_flops);
  }
}

TEST_CASE_TEMPLATE("eigen gemm with beta = 0 overwrites NaN in C (serial and split)", T, float,
                   double) {
  for (const bool eager : {false, true}) {
    eigen_backend<T> eig(eager ? eager_parallel_options() : eigen_backend_options{});
    reference_backend<T> ref;
    for (const index_t k : {index_t{0}, index_t{6}}) {
      const auto a = padded<T>::random(40, k, 1);
      const auto b = padded<T>::random(k, 24, 2);
      padded<T> c_eig(40, 24, 1), c_ref(40, 24, 1);
      for (index_t i = 0; i < 40; ++i)
        for (index_t j = 0; j < 24; ++j) c_eig.at(i, j) = std::numeric_limits<T>::quiet_NaN();
      ref.gemm(transpose::no, transpose::no, T(1), a.cview(), b.cview(), T(0), c_ref.view());
      eig.gemm(transpose::no, transpose::no, T(1), a.cview(), b.cview(), T(0), c_eig.view());
      const auto values = c_eig.values();
      REQUIRE(std::all_of(values.begin(), values.end(), [](T x) { return std::isfinite(x); }));
      check_matches(c_eig, c_ref, "gemm beta 0");
    }
  }
}

TEST_CASE_TEMPLATE("eigen gemm_batched matches the reference on strided batches", T, float,
                   double) {
  for (const bool eager : {false, true}) {
    eigen_backend<T> eig(eager ? eager_parallel_options() : eigen_backend_options{});
    reference_backend<T> ref;
    const index_t batch = 3, m = 19, n = 11, k = 7;
    // A is (batch, k, m) used transposed, each batch entry padded by 4 elements.
    const auto a = uniform<T>(batch * (k * m + 4), 7);
    const auto b = uniform<T>(batch * k * n, 8);
    auto c_ref = uniform<T>(batch * m * (n + 2), 9);
    auto c_eig = c_ref;
    const tensor3_view<const T> av(a.data(), batch, k, m, k * m + 4, m);
    const tensor3_view<const T> bv(b.data(), batch, k, n);
    ref.gemm_batched(transpose::yes, transpose::no, T(0.5), av, bv, T(2),
                     tensor3_view<T>(c_ref.data(), batch, m, n, m * (n + 2), n + 2));
    eig.gemm_batched(transpose::yes, transpose::no, T(0.5), av, bv, T(2),
                     tensor3_view<T>(c_eig.data(), batch, m, n, m * (n + 2), n + 2));
    check_matches(c_eig, c_ref, "gemm_batched");
    CHECK(eig.stats().gemm_flops == ref.stats().gemm_flops);
  }
}

TEST_CASE_TEMPLATE("eigen axpy, scale, fill, copy on strided views", T, float, double) {
  eigen_backend<T> eig;
  reference_backend<T> ref;
  const auto x = padded<T>::random(33, 17, 1, 3);
  auto y_ref = padded<T>::random(33, 17, 2, 2);
  auto y_eig = y_ref;
  ref.axpy(T(-0.75), x.cview(), y_ref.view());
  eig.axpy(T(-0.75), x.cview(), y_eig.view());
  check_matches(y_eig, y_ref, "axpy");
  ref.scale(T(1.5), y_ref.view());
  eig.scale(T(1.5), y_eig.view());
  check_matches(y_eig, y_ref, "scale");
  ref.fill(y_ref.view().col_range(3, 9), T(4));
  eig.fill(y_eig.view().col_range(3, 9), T(4));
  check_matches(y_eig, y_ref, "fill");
  ref.copy(x.cview().row_range(2, 20), y_ref.view().row_range(10, 28));
  eig.copy(x.cview().row_range(2, 20), y_eig.view().row_range(10, 28));
  check_matches(y_eig, y_ref, "copy");
  // copy is exact
  CHECK(to_vector(y_eig.cview().row_range(10, 28)) == to_vector(x.cview().row_range(2, 20)));
}

TEST_CASE_TEMPLATE("eigen allocate, upload, download are counted", T, float, double) {
  eigen_backend<T> eig;
  {
    auto buf = eig.template allocate<T>(21);
    CHECK(eig.memory().live() == 21 * sizeof(T));
    const auto host = uniform<T>(21, 3);
    std::vector<T> back(21);
    eig.upload(host, buf.span());
    eig.download(buf.span(), back);
    CHECK(back == host);
  }
  CHECK(eig.memory().live() == 0);
  CHECK(eig.memory().peak() == 21 * sizeof(T));
}

TEST_CASE_TEMPLATE("eigen embedding forward and backward (repeated ids, accumulation)", T, float,
                   double) {
  eigen_backend<T> eig;
  reference_backend<T> ref;
  for (const index_t d : {index_t{1}, index_t{7}, index_t{300}}) {
    const index_t vocab = 11, n = 40;
    std::vector<token_id> ids(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i)
      ids[static_cast<std::size_t>(i)] = (i * 7 + 3) % 5 + (i % 3) * 2;
    const auto table = padded<T>::random(vocab, d, 4, 2);
    padded<T> out_ref(n, d, 1), out_eig(n, d, 1);
    ref.embedding_forward(table.cview(), ids, out_ref.view());
    eig.embedding_forward(table.cview(), ids, out_eig.view());
    CHECK(out_eig.values() == out_ref.values());
    CHECK(out_eig.padding_intact());
    const auto dout = padded<T>::random(n, d, 5, 3);
    auto dt_ref = padded<T>::random(vocab, d, 6, 1);  // non-zero: backward accumulates
    auto dt_eig = dt_ref;
    ref.embedding_backward(dout.cview(), ids, dt_ref.view());
    eig.embedding_backward(dout.cview(), ids, dt_eig.view());
    check_matches(dt_eig, dt_ref, "embedding_backward");
  }
}

TEST_CASE_TEMPLATE("eigen rmsnorm forward and backward (dw and no dw, accumulation)", T, float,
                   double) {
  eigen_backend<T> eig;
  reference_backend<T> ref;
  for (const auto& case_ :
       {std::pair<index_t, index_t>{1, 1}, {1, 64}, {7, 13}, {300, 37}, {65, 1000}}) {
    const auto n = std::get<0>(case_);
    const auto d = std::get<1>(case_);
    CAPTURE(n);
    CAPTURE(d);
    const auto x = padded<T>::random(n, d, 10, 2);
    const auto w = uniform<T>(d, 11, 0.5, 1.5);
    const T eps = T(1e-5);
    padded<T> y_ref(n, d, 1), y_eig(n, d, 1);
    std::vector<T> r_ref(static_cast<std::size_t>(n)), r_eig(static_cast<std::size_t>(n));
    ref.rmsnorm_forward(x.cview(), w, eps, y_ref.view(), r_ref);
    eig.rmsnorm_forward(x.cview(), w, eps, y_eig.view(), r_eig);
    check_matches(y_eig, y_ref, "rmsnorm y");
    check_matches(r_eig, r_ref, "rmsnorm rstd");
    const auto dy = padded<T>::random(n, d, 12, 3);
    auto dx_ref = padded<T>::random(n, d, 13, 1);
    auto dx_eig = dx_ref;
    auto dw_ref = uniform<T>(d, 14);
    auto dw_eig = dw_ref;
    ref.rmsnorm_backward(x.cview(), w, r_ref, dy.cview(), dx_ref.view(), dw_ref);
    eig.rmsnorm_backward(x.cview(), w, r_ref, dy.cview(), dx_eig.view(), dw_eig);
    check_matches(dx_eig, dx_ref, "rmsnorm dx", 4);
    check_matches(dw_eig, dw_ref, "rmsnorm dw", 4);
    // empty dw: skipped, dx still accumulates
    ref.rmsnorm_backward(x.cview(), w, r_ref, dy.cview(), dx_ref.view(), std::span<T>{});
    eig.rmsnorm_backward(x.cview(), w, r_ref, dy.cview(), dx_eig.view(), std::span<T>{});
    check_matches(dx_eig, dx_ref, "rmsnorm dx (no dw)", 4);
  }
}

TEST_CASE_TEMPLATE("eigen rmsnorm and embedding weight gradients do not depend on the thread count",
                   T, float, double) {
  const index_t n = 1000, d = 48, vocab = 9;
  const auto x = padded<T>::random(n, d, 20);
  const auto dy = padded<T>::random(n, d, 21);
  const auto w = uniform<T>(d, 22);
  std::vector<T> rstd(static_cast<std::size_t>(n));
  std::vector<token_id> ids(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = (i * 5) % vocab;
  auto run = [&](int threads) {
    eigen_backend_options opt;
    opt.threads = threads;  // the backend's own arena
    eigen_backend<T> eig(opt);
    padded<T> y(n, d), dx(n, d), dtable(vocab, d);
    std::vector<T> dw(static_cast<std::size_t>(d));
    eig.rmsnorm_forward(x.cview(), w, T(1e-6), y.view(), rstd);
    eig.rmsnorm_backward(x.cview(), w, rstd, dy.cview(), dx.view(), dw);
    eig.embedding_backward(dy.cview(), ids, dtable.view());
    std::vector<T> all = dw;
    const auto dt = dtable.values();
    all.insert(all.end(), dt.begin(), dt.end());
    return all;
  };
  const auto one = run(1);
  CHECK(run(2) == one);  // bitwise
}

TEST_CASE_TEMPLATE("eigen rope forward and backward (pos0, strided, heads)", T, float, double) {
  eigen_backend<T> eig;
  reference_backend<T> ref;
  for (const auto& case_ :
       {std::tuple<index_t, index_t, index_t>{1, 2, 0}, {3, 6, 5}, {2, 64, 1000}, {4, 10, 77}}) {
    const auto heads = std::get<0>(case_);
    const auto hd = std::get<1>(case_);
    const auto pos0 = std::get<2>(case_);
    CAPTURE(heads);
    CAPTURE(hd);
    const index_t n = 23;
    auto x_ref = padded<T>::random(n, heads * hd, 30, 3);
    auto x_eig = x_ref;
    const auto x0 = x_ref;
    ref.rope_forward(x_ref.view(), heads, hd, {pos0, {}, {}, 10000.0});
    eig.rope_forward(x_eig.view(), heads, hd, {pos0, {}, {}, 10000.0});
    check_matches(x_eig, x_ref, "rope_forward");
    ref.rope_backward(x_ref.view(), heads, hd, {pos0 + 3, {}, {}, 1e6});
    eig.rope_backward(x_eig.view(), heads, hd, {pos0 + 3, {}, {}, 1e6});
    check_matches(x_eig, x_ref, "rope_backward");
    // backward undoes forward at the same positions
    eig.rope_backward(x_eig.view(), heads, hd, {pos0, {}, {}, 10000.0});
    eig.rope_forward(x_eig.view(), heads, hd, {pos0 + 3, {}, {}, 1e6});
    check_matches(x_eig, x0, "rope backward o forward", 10);
  }
}

TEST_CASE_TEMPLATE("eigen swiglu forward and backward", T, float, double) {
  eigen_backend<T> eig;
  reference_backend<T> ref;
  for (const auto& case_ : {std::pair<index_t, index_t>{1, 1}, {9, 35}, {70, 600}}) {
    const auto n = std::get<0>(case_);
    const auto f = std::get<1>(case_);
    const auto gate = padded<T>::random(n, f, 40, 2, -8, 8);
    const auto up = padded<T>::random(n, f, 41, 1);
    padded<T> o_ref(n, f, 3), o_eig(n, f, 3);
    ref.swiglu_forward(gate.cview(), up.cview(), o_ref.view());
    eig.swiglu_forward(gate.cview(), up.cview(), o_eig.view());
    check_matches(o_eig, o_ref, "swiglu_forward");
    const auto dout = padded<T>::random(n, f, 42);
    auto dg_ref = padded<T>::random(n, f, 43, 1);
    auto du_ref = padded<T>::random(n, f, 44, 2);
    auto dg_eig = dg_ref;
    auto du_eig = du_ref;
    ref.swiglu_backward(gate.cview(), up.cview(), dout.cview(), dg_ref.view(), du_ref.view());
    eig.swiglu_backward(gate.cview(), up.cview(), dout.cview(), dg_eig.view(), du_eig.view());
    check_matches(dg_eig, dg_ref, "swiglu dgate");
    check_matches(du_eig, du_ref, "swiglu dup");
  }
}

TEST_CASE_TEMPLATE("eigen geglu and logit soft-capping match the reference", T, float, double) {
  eigen_backend<T> eig;
  reference_backend<T> ref;
  for (const auto& case_ : {std::pair<index_t, index_t>{1, 1}, {9, 35}, {70, 600}}) {
    const auto n = std::get<0>(case_);
    const auto f = std::get<1>(case_);
    const auto gate = padded<T>::random(n, f, 40, 2, -8, 8);
    const auto up = padded<T>::random(n, f, 41, 1);
    padded<T> o_ref(n, f, 3), o_eig(n, f, 3);
    ref.geglu_forward(gate.cview(), up.cview(), o_ref.view());
    eig.geglu_forward(gate.cview(), up.cview(), o_eig.view());
    check_matches(o_eig, o_ref, "geglu_forward");
    const auto dout = padded<T>::random(n, f, 42);
    auto dg_ref = padded<T>::random(n, f, 43, 1);
    auto du_ref = padded<T>::random(n, f, 44, 2);
    auto dg_eig = dg_ref;
    auto du_eig = du_ref;
    ref.geglu_backward(gate.cview(), up.cview(), dout.cview(), dg_ref.view(), du_ref.view());
    eig.geglu_backward(gate.cview(), up.cview(), dout.cview(), dg_eig.view(), du_eig.view());
    check_matches(dg_eig, dg_ref, "geglu dgate");
    check_matches(du_eig, du_ref, "geglu dup");
    // soft-capping in place (logits of +-40 against cap 30 reach the flat part of tanh)
    auto z_ref = padded<T>::random(n, f, 45, 2, -40, 40);
    auto z_eig = z_ref;
    ref.logit_softcap_forward(z_ref.view(), T(30));
    eig.logit_softcap_forward(z_eig.view(), T(30));
    check_matches(z_eig, z_ref, "logit_softcap_forward");
    auto dz_ref = padded<T>::random(n, f, 46, 1);
    auto dz_eig = dz_ref;
    ref.logit_softcap_backward(z_ref.cview(), dz_ref.view(), T(30));
    eig.logit_softcap_backward(z_ref.cview(), dz_eig.view(), T(30));
    check_matches(dz_eig, dz_ref, "logit_softcap_backward");
  }
}

TEST_CASE_TEMPLATE("eigen cross-entropy forward and backward (tau, ignored rows, big logits)", T,
                   float, double) {
  eigen_backend<T> eig;
  reference_backend<T> ref;
  for (const auto& case_ : {std::tuple<index_t, index_t, double, double>{1, 1, 1.0, 1.0},
                            {6, 13, 0.7, 3.0},
                            {37, 1001, 1.0, 20.0},
                            {5, 4099, 2.5, 300.0}}) {
    const auto n = std::get<0>(case_);
    const auto vocab = std::get<1>(case_);
    const auto tau = std::get<2>(case_);
    const auto spread = std::get<3>(case_);
    CAPTURE(n);
    CAPTURE(vocab);
    const auto logits = padded<T>::random(n, vocab, 50, 2, -spread, spread);
    std::vector<token_id> labels(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i)
      labels[static_cast<std::size_t>(i)] = i % 4 == 2 ? ignore_index : (i * 31 + 7) % vocab;
    const auto t = static_cast<T>(tau);
    std::vector<T> lse_ref(static_cast<std::size_t>(n)), lp_ref(lse_ref.size());
    std::vector<T> lse_eig(lse_ref.size()), lp_eig(lse_ref.size());
    ref.xent_forward(logits.cview(), labels, t, lse_ref, lp_ref);
    eig.xent_forward(logits.cview(), labels, t, lse_eig, lp_eig);
    check_matches(lse_eig, lse_ref, "xent lse");
    check_matches(lp_eig, lp_ref, "xent logprob", 4);
    const auto coeff = uniform<T>(n, 51, -2, 2);
    auto g_ref = logits;
    auto g_eig = logits;
    ref.xent_backward(g_ref.view(), labels, lse_ref, coeff, t);
    eig.xent_backward(g_eig.view(), labels, lse_ref, coeff, t);
    check_matches(g_eig, g_ref, "xent dlogits", 4);
  }
}

TEST_CASE_TEMPLATE("eigen adam, adamw and sgd updates match the reference over several steps", T,
                   float, double) {
  eigen_backend<T> eig;
  reference_backend<T> ref;
  const index_t n = 40000;  // several parallel blocks
  for (const bool decoupled : {false, true}) {
    auto p_ref = uniform<T>(n, 60), m_ref = std::vector<T>(static_cast<std::size_t>(n));
    auto v_ref = m_ref;
    auto p_eig = p_ref, m_eig = m_ref, v_eig = v_ref;
    adam_hyper<T> h;
    h.lr = T(1e-2);
    h.weight_decay = T(0.1);
    h.decoupled = decoupled;
    for (std::int64_t step = 1; step <= 3; ++step) {
      h.step = step;
      const auto g = uniform<T>(n, 61 + static_cast<std::uint64_t>(step));
      ref.adam_update(p_ref, g, m_ref, v_ref, h);
      eig.adam_update(p_eig, g, m_eig, v_eig, h);
    }
    check_matches(p_eig, p_ref, decoupled ? "adamw param" : "adam param", 10);
    check_matches(m_eig, m_ref, "adam m", 10);
    check_matches(v_eig, v_ref, "adam v", 10);
  }
  for (const auto& case_ :
       {std::tuple<double, double, bool>{0.0, 0.0, false}, {0.9, 0.01, false}, {0.5, 0.0, true}}) {
    const auto momentum = std::get<0>(case_);
    const auto wd = std::get<1>(case_);
    const auto use_sign = std::get<2>(case_);
    auto p_ref = uniform<T>(n, 70);
    auto p_eig = p_ref;
    std::vector<T> buf_ref(momentum != 0 ? static_cast<std::size_t>(n) : 0), buf_eig = buf_ref;
    sgd_hyper<T> h;
    h.momentum = static_cast<T>(momentum);
    h.weight_decay = static_cast<T>(wd);
    h.use_sign = use_sign;
    for (int step = 0; step < 3; ++step) {
      const auto g = uniform<T>(n, 71 + static_cast<std::uint64_t>(step));
      ref.sgd_update(p_ref, g, buf_ref, h);
      eig.sgd_update(p_eig, g, buf_eig, h);
    }
    check_matches(p_eig, p_ref, "sgd param", 10);
    check_matches(buf_eig, buf_ref, "sgd momentum", 10);
  }
}

TEST_CASE("eigen kernels reject bad input with messages naming the shapes") {
  eigen_backend<double> be;
  padded<double> a(3, 4), b(5, 2), c(3, 2), x(3, 4), y(4, 3);
  check_error(
      [&] { be.gemm(transpose::no, transpose::no, 1.0, a.cview(), b.cview(), 0.0, c.view()); },
      {"gemm", "(3 x 4)", "(5 x 2)"});
  check_error([&] { be.axpy(1.0, x.cview(), y.view()); }, {"axpy", "(4 x 3)", "(3 x 4)"});
  check_error([&] { be.copy(x.cview(), y.view()); }, {"copy", "(4 x 3)"});
  std::vector<token_id> ids = {0, 2, 9};
  padded<double> table(5, 4), out(3, 4);
  check_error([&] { be.embedding_forward(table.cview(), ids, out.view()); },
              {"embedding_forward", "ids[2]", "9", "5"});
  std::vector<double> w(3), rstd(3);
  check_error([&] { be.rmsnorm_forward(x.cview(), w, 1e-6, x.view(), rstd); },
              {"rmsnorm_forward", "w", "3", "4"});
  check_error(
      [&] {
        be.rope_forward(x.view(), 2, 3, {0, {}, {}, 1e4});
      },
      {"rope_forward", "head_dim", "3"});
  check_error([&] { be.swiglu_forward(x.cview(), y.cview(), x.view()); },
              {"swiglu_forward", "(4 x 3)", "(3 x 4)"});
  std::vector<token_id> labels = {1, ignore_index, 4};
  std::vector<double> lse(3), lp(3);
  check_error([&] { be.xent_forward(x.cview(), labels, 1.0, lse, lp); },
              {"xent_forward", "label 4", "row 2", "[0, 4)"});
  labels[2] = 0;
  check_error([&] { be.xent_forward(x.cview(), labels, 0.0, lse, lp); }, {"xent_forward", "tau"});
  std::vector<double> p(4), g(3), m(4), v(4);
  adam_hyper<double> h;
  check_error([&] { be.adam_update(p, g, m, v, h); }, {"adam_update", "grad", "3", "4"});
  h.step = 0;
  g.resize(4);
  check_error([&] { be.adam_update(p, g, m, v, h); }, {"adam_update", "step", "0"});
  check_error(
      [] {
        eigen_backend<float> bad(eigen_backend_options{0, 64});
      },
      {"attention_tile_q", "0"});
}

#endif  // __has_include(<Eigen/Core>)

TEST_CASE("eigen_backend runs its kernels in its own arena of options.threads workers") {
  CHECK_THROWS_WITH_AS(eigen_backend<float>(eigen_backend_options{.threads = -1}),
                       doctest::Contains("threads is -1"), error);
  eigen_backend<float> all;
  CHECK(all.threads() >= 1);
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
  for (int n : {1, 2, 3}) {
    eigen_backend<float> be(eigen_backend_options{.threads = n});
    CHECK(be.threads() == n);
    // a kernel sees the backend's arena, whatever arena the caller runs in
    tbb::task_arena outer(1);
    int seen = 0;
    outer.execute([&] { seen = be.threads(); });
    CHECK(seen == n);
  }
  CHECK(all.threads() == tbb::info::default_concurrency());
#endif
}
