// Bad input to reference_backend: every kernel rejects mismatched shapes, out-of-range ids and
// labels and invalid scalars with a tightfit::error whose message names the kernel and the
// extents involved.
#include <doctest/doctest.h>

#include <vector>

#include "reference_testing.hpp"
#include "tightfit/backend/reference.hpp"

using namespace tightfit;
using namespace tightfit::testing;

TEST_CASE("dense kernels reject mismatched shapes") {
  reference_backend<double> be;
  dmat a(3, 7), b(7, 4), c(3, 5), b_bad(6, 4), c_ok(3, 4);
  check_error(
      [&] { be.gemm(transpose::no, transpose::no, 1.0, a.cview(), b.cview(), 0.0, c.view()); },
      {"gemm: C is (3 x 5), expected (3 x 4) from op(A) (3 x 7) and op(B) (7 x 4)"});
  check_error(
      [&] {
        be.gemm(transpose::no, transpose::no, 1.0, a.cview(), b_bad.cview(), 0.0, c_ok.view());
      },
      {"gemm", "(3 x 7)", "(6 x 4)", "7", "6"});
  // with a transpose flag the error shows op(A), not A
  check_error(
      [&] { be.gemm(transpose::yes, transpose::no, 1.0, a.cview(), b.cview(), 0.0, c_ok.view()); },
      {"gemm", "op(A) is (7 x 3)", "(7 x 4)"});
  CHECK(be.stats().gemm_calls == 0);  // rejected calls are not counted

  std::vector<double> buf(3 * 2 * 4 * 2);
  check_error(
      [&] {
        be.gemm_batched(transpose::no, transpose::no, 1.0, {buf.data(), 3, 2, 4},
                        {buf.data(), 2, 4, 2}, 0.0, {buf.data(), 3, 2, 2});
      },
      {"gemm_batched", "A has 3", "B has 2", "C has 3"});
  check_error(
      [&] {
        be.gemm_batched(transpose::no, transpose::no, 1.0, {buf.data(), 2, 2, 4},
                        {buf.data(), 2, 4, 2}, 0.0, {buf.data(), 2, 2, 3});
      },
      {"gemm_batched", "C is (2 x 3), expected (2 x 2)"});

  dmat x(3, 4), y(4, 3);
  check_error([&] { be.axpy(1.0, x.cview(), y.view()); },
              {"axpy: y is (4 x 3), expected (3 x 4) like x"});
  check_error([&] { be.copy(x.cview(), y.view()); }, {"copy", "(4 x 3)", "(3 x 4)"});
  // a view whose rows overlap
  check_error([&] { be.fill(matrix_view<double>(x.v.data(), 2, 4, 3), 0.0); },
              {"fill", "stride 3", "4"});
  check_error([&] { be.scale(2.0, matrix_view<double>(x.v.data(), 2, 4, 3)); },
              {"scale", "stride 3"});

  std::vector<double> h3(3), h4(4);
  check_error([&] { be.upload(std::span<const double>(h3), std::span(h4)); }, {"upload", "4", "3"});
  check_error([&] { be.download(std::span<const double>(h4), std::span(h3)); },
              {"download", "3", "4"});
}

TEST_CASE("embedding rejects bad shapes and ids, and writes nothing then") {
  reference_backend<double> be;
  const dmat table = dmat::random(5, 3, 1);
  const std::vector<token_id> ids = {1, 4, 5};
  dmat out(3, 3, 42.0), out_bad(2, 3);
  check_error([&] { be.embedding_forward(table.cview(), ids, out.view()); },
              {"embedding_forward", "ids[2] is 5", "[0, 5)"});
  for (double v : out.v) CHECK(v == 42.0);
  check_error(
      [&] {
        be.embedding_forward(table.cview(), std::vector<token_id>{0, -1}, out_bad.view());
      },
      {"embedding_forward", "ids[1] is -1"});
  check_error(
      [&] {
        be.embedding_forward(table.cview(), std::vector<token_id>{0, 1, 2}, out_bad.view());
      },
      {"embedding_forward", "out is (2 x 3), expected (3 x 3)"});
  dmat dtable(5, 3), dout(3, 3), dout_bad(3, 2);
  check_error([&] { be.embedding_backward(dout.cview(), ids, dtable.view()); },
              {"embedding_backward", "ids[2] is 5", "[0, 5)"});
  check_error(
      [&] {
        be.embedding_backward(dout_bad.cview(), std::vector<token_id>{0, 1, 2}, dtable.view());
      },
      {"embedding_backward", "dout is (3 x 2), expected (3 x 3)"});
}

TEST_CASE("rmsnorm, rope, swiglu reject mismatched shapes") {
  reference_backend<double> be;
  dmat x(4, 6), y(4, 6), y_bad(4, 5);
  std::vector<double> w(6), w_bad(5), rstd(4), rstd_bad(3);
  auto cw = [](const std::vector<double>& v) { return std::span<const double>(v); };
  check_error([&] { be.rmsnorm_forward(x.cview(), cw(w_bad), 1e-6, y.view(), std::span(rstd)); },
              {"rmsnorm_forward", "w.size is 5, expected 6"});
  check_error([&] { be.rmsnorm_forward(x.cview(), cw(w), 1e-6, y_bad.view(), std::span(rstd)); },
              {"rmsnorm_forward", "y is (4 x 5), expected (4 x 6)"});
  check_error([&] { be.rmsnorm_forward(x.cview(), cw(w), 1e-6, y.view(), std::span(rstd_bad)); },
              {"rmsnorm_forward", "rstd.size is 3, expected 4"});
  check_error([&] { be.rmsnorm_forward(x.cview(), cw(w), -1.0, y.view(), std::span(rstd)); },
              {"rmsnorm_forward", "eps is -1"});
  check_error(
      [&] {
        be.rmsnorm_backward(x.cview(), cw(w), cw(rstd), y.cview(), y_bad.view(), std::span(w));
      },
      {"rmsnorm_backward", "dx is (4 x 5), expected (4 x 6)"});
  check_error(
      [&] {
        be.rmsnorm_backward(x.cview(), cw(w), cw(rstd_bad), y.cview(), y.view(), std::span(w));
      },
      {"rmsnorm_backward", "rstd.size is 3, expected 4"});
  check_error(
      [&] {
        be.rmsnorm_backward(x.cview(), cw(w), cw(rstd), y.cview(), y.view(), std::span(w_bad));
      },
      {"rmsnorm_backward", "dw.size is 5, expected 6"});

  check_error(
      [&] {
        be.rope_forward(x.view(), 2, 4, {0, {}, {}, 1e4});
      },
      {"rope_forward", "x.cols is 6, expected 8", "heads 2", "head_dim 4"});
  check_error(
      [&] {
        be.rope_backward(x.view(), 3, 2, {-1, {}, {}, 1e4});
      },
      {"rope_backward", "pos0 is -1"});
  check_error(
      [&] {
        be.rope_forward(x.view(), 3, 2, {0, {}, {}, 0.0});
      },
      {"rope_forward", "theta is 0"});

  dmat g(3, 5), u_bad(3, 4), o(3, 5);
  check_error([&] { be.swiglu_forward(g.cview(), u_bad.cview(), o.view()); },
              {"swiglu_forward", "up is (3 x 4), expected (3 x 5)"});
  check_error([&] { be.swiglu_backward(g.cview(), g.cview(), g.cview(), o.view(), u_bad.view()); },
              {"swiglu_backward", "dup is (3 x 4), expected (3 x 5)"});
}

TEST_CASE("attention rejects inconsistent shapes, valid_len 0 and bad head counts") {
  reference_backend<double> be;
  const attention_shape s{4, 2, 3};
  dmat q(5, 12), k(7, 6), v(7, 6), o(5, 12), lse(5, 4);
  auto fwd = [&](attention_shape sh, const dmat& qq, const dmat& kk, const dmat& vv, index_t q0,
                 index_t valid, dmat& oo, dmat& ll) {
    be.attention_forward(sh, qq.cview(), kk.cview(), vv.cview(), {q0, valid}, 1.0, oo.view(),
                         ll.view());
  };
  CHECK_NOTHROW(fwd(s, q, k, v, 0, 7, o, lse));
  dmat q_bad(5, 10), k_bad(7, 8), v_bad(6, 6), o_bad(5, 8), lse_bad(5, 2), k_empty(0, 6);
  check_error([&] { fwd(s, q_bad, k, v, 0, 7, o, lse); },
              {"attention_forward", "Q.cols is 10, expected 12"});
  check_error([&] { fwd(s, q, k_bad, v, 0, 7, o, lse); },
              {"attention_forward", "K.cols is 8, expected 6"});
  check_error([&] { fwd(s, q, k, v_bad, 0, 7, o, lse); },
              {"attention_forward", "V is (6 x 6), expected (7 x 6) like K"});
  check_error([&] { fwd(s, q, k, v, 0, 7, o_bad, lse); },
              {"attention_forward", "O is (5 x 8), expected (5 x 12)"});
  check_error([&] { fwd(s, q, k, v, 0, 7, o, lse_bad); },
              {"attention_forward", "lse is (5 x 2), expected (5 x 4)"});
  check_error([&] { fwd(s, q, k, v, 0, 0, o, lse); },
              {"attention_forward", "valid_len is 0, expected >= 1"});
  check_error([&] { fwd(s, q, k, v, -2, 7, o, lse); }, {"attention_forward", "q0 is -2"});
  check_error([&] { fwd(s, q, k_empty, k_empty, 0, 7, o, lse); },
              {"attention_forward", "K.rows is 0"});
  check_error(
      [&] {
        fwd({4, 3, 3}, q, dmat(7, 9), dmat(7, 9), 0, 7, o, lse);
      },
      {"attention_forward", "heads 4", "kv_heads 3"});

  dmat dq(5, 12), dk(7, 6), dv(7, 6), dk_bad(6, 6), dq_bad(4, 12);
  auto bwd = [&](const dmat& lse_in, index_t valid, dmat& dqq, dmat& dkk, dmat& dvv) {
    be.attention_backward(s, q.cview(), k.cview(), v.cview(), o.cview(), o.cview(), lse_in.cview(),
                          {0, valid}, 1.0, dqq.view(), dkk.view(), dvv.view());
  };
  CHECK_NOTHROW(bwd(lse, 7, dq, dk, dv));
  check_error([&] { bwd(lse, 7, dq, dk_bad, dv); },
              {"attention_backward", "dK is (6 x 6), expected (7 x 6)"});
  check_error([&] { bwd(lse, 7, dq, dk, dk_bad); },
              {"attention_backward", "dV is (6 x 6), expected (7 x 6)"});
  check_error([&] { bwd(lse, 7, dq_bad, dk, dv); },
              {"attention_backward", "dQ is (4 x 12), expected (5 x 12)"});
  check_error([&] { bwd(lse_bad, 7, dq, dk, dv); },
              {"attention_backward", "lse is (5 x 2), expected (5 x 4)"});
  check_error([&] { bwd(lse, 0, dq, dk, dv); }, {"attention_backward", "valid_len is 0"});
}

TEST_CASE("xent rejects bad labels, sizes and temperatures") {
  reference_backend<double> be;
  dmat logits(3, 5);
  std::vector<double> lse(3), lp(3), lse_bad(2), coeff(3);
  const std::vector<token_id> labels = {0, ignore_index, 4}, bad = {0, 5, 1}, neg = {-1, 0, 0};
  CHECK_NOTHROW(be.xent_forward(logits.cview(), labels, 1.0, std::span(lse), std::span(lp)));
  check_error([&] { be.xent_forward(logits.cview(), bad, 1.0, std::span(lse), std::span(lp)); },
              {"xent_forward", "label 5 of row 1", "[0, 5)"});
  check_error([&] { be.xent_forward(logits.cview(), neg, 1.0, std::span(lse), std::span(lp)); },
              {"xent_forward", "label -1 of row 0"});
  check_error([&] { be.xent_forward(logits.cview(), labels, 0.0, std::span(lse), std::span(lp)); },
              {"xent_forward", "tau is 0"});
  check_error(
      [&] { be.xent_forward(logits.cview(), labels, 1.0, std::span(lse_bad), std::span(lp)); },
      {"xent_forward", "lse.size is 2, expected 3"});
  check_error(
      [&] {
        be.xent_forward(logits.cview(), std::vector<token_id>{0, 1}, 1.0, std::span(lse),
                        std::span(lp));
      },
      {"xent_forward", "labels.size is 2, expected 3"});
  auto c = [](const std::vector<double>& v) { return std::span<const double>(v); };
  check_error([&] { be.xent_backward(logits.view(), bad, c(lse), c(coeff), 1.0); },
              {"xent_backward", "label 5 of row 1"});
  check_error([&] { be.xent_backward(logits.view(), labels, c(lse), c(lse_bad), 1.0); },
              {"xent_backward", "coeff.size is 2, expected 3"});
  check_error([&] { be.xent_backward(logits.view(), labels, c(lse), c(coeff), -0.5); },
              {"xent_backward", "tau is -0.5"});
}

TEST_CASE("optimizer updates reject mismatched sizes and bad hyper-parameters") {
  reference_backend<double> be;
  std::vector<double> p(4), g(4), m(4), v(4), short3(3);
  auto c = [](const std::vector<double>& x) { return std::span<const double>(x); };
  adam_hyper<double> h;
  check_error([&] { be.adam_update(std::span(p), c(short3), std::span(m), std::span(v), h); },
              {"adam_update", "grad.size is 3, expected 4"});
  check_error([&] { be.adam_update(std::span(p), c(g), std::span(m), std::span(short3), h); },
              {"adam_update", "v.size is 3, expected 4"});
  h.step = 0;
  check_error([&] { be.adam_update(std::span(p), c(g), std::span(m), std::span(v), h); },
              {"adam_update", "step is 0"});
  sgd_hyper<double> s;
  s.momentum = 0.9;
  check_error([&] { be.sgd_update(std::span(p), c(g), std::span(short3), s); },
              {"sgd_update", "momentum_buf.size is 3, expected 4"});
  s.momentum = 0;
  CHECK_NOTHROW(be.sgd_update(std::span(p), c(g), std::span<double>(), s));
  check_error([&] { be.sgd_update(std::span(p), c(short3), std::span<double>(), s); },
              {"sgd_update", "grad.size is 3, expected 4"});
}
