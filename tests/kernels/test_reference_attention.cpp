// Tests of reference_backend<double> attention: forward against a naive masked softmax with
// repeated K/V heads (HF repeat_kv), backward against finite differences (GQA ratios 1/2/4,
// q0 > 0, valid_len < K.rows), and the chunking identities StreamBP relies on: attention of a
// query range against its key prefix equals rows of full causal attention, and backward over
// ranges sums to the full backward.
#include <doctest/doctest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "reference_testing.hpp"
#include "tightfit/backend/reference.hpp"

using namespace tightfit;
using namespace tightfit::testing;

namespace {

/// K or V (nk, kv_heads*hd) with each kv head repeated heads/kv_heads times, as HF repeat_kv:
/// query head kv * group + r reads kv head kv.
dmat repeat_kv(const dmat& k, index_t heads, index_t kv_heads, index_t hd) {
  const index_t group = heads / kv_heads;
  dmat r(k.rows, heads * hd);
  for (index_t j = 0; j < k.rows; ++j)
    for (index_t kv = 0; kv < kv_heads; ++kv)
      for (index_t g = 0; g < group; ++g)
        for (index_t c = 0; c < hd; ++c) r(j, (kv * group + g) * hd + c) = k(j, kv * hd + c);
  return r;
}

/// Masked softmax attention written out directly (no max subtraction: inputs are small).
std::pair<dmat, dmat> naive_attention(const attention_shape& s, const dmat& q, const dmat& k,
                                      const dmat& v, index_t q0, index_t valid_len, double scale) {
  const index_t hd = s.head_dim;
  const dmat kr = repeat_kv(k, s.heads, s.kv_heads, hd), vr = repeat_kv(v, s.heads, s.kv_heads, hd);
  dmat o(q.rows, s.heads * hd), lse(q.rows, s.heads);
  for (index_t i = 0; i < q.rows; ++i)
    for (index_t h = 0; h < s.heads; ++h) {
      std::vector<double> w(static_cast<std::size_t>(k.rows), 0.0);
      double z = 0;
      for (index_t j = 0; j < k.rows; ++j) {
        const bool visible = j <= q0 + i && j < valid_len;
        if (!visible) continue;
        double dot = 0;
        for (index_t c = 0; c < hd; ++c) dot += q(i, h * hd + c) * kr(j, h * hd + c);
        w[static_cast<std::size_t>(j)] = std::exp(scale * dot);
        z += w[static_cast<std::size_t>(j)];
      }
      for (index_t j = 0; j < k.rows; ++j)
        for (index_t c = 0; c < hd; ++c)
          o(i, h * hd + c) += w[static_cast<std::size_t>(j)] / z * vr(j, h * hd + c);
      lse(i, h) = std::log(z);
    }
  return {o, lse};
}

struct attn_case {
  index_t heads, kv_heads, hd, nq, nk, q0, valid_len;
};

}  // namespace

TEST_CASE("attention forward equals the naive masked softmax (GQA, q0, padding, short K)") {
  reference_backend<double> be;
  const attn_case cases[] = {
      {2, 2, 4, 6, 6, 0, 6},   // plain causal self-attention
      {4, 2, 3, 5, 9, 3, 6},   // GQA 2, q0 > 0, padded queries (positions 6, 7)
      {4, 1, 5, 7, 11, 2, 9},  // GQA 4 (MQA)
      {3, 3, 2, 4, 5, 4, 20},  // K shorter than the query positions: nk = 5 < q0 + nq = 8
      {6, 2, 4, 1, 1, 0, 1},   // a single key
  };
  for (const auto& tc : cases) {
    CAPTURE(tc.heads);
    CAPTURE(tc.kv_heads);
    CAPTURE(tc.q0);
    CAPTURE(tc.valid_len);
    const attention_shape s{tc.heads, tc.kv_heads, tc.hd};
    const dmat q = dmat::random(tc.nq, tc.heads * tc.hd, 40);
    const dmat k = dmat::random(tc.nk, tc.kv_heads * tc.hd, 41);
    const dmat v = dmat::random(tc.nk, tc.kv_heads * tc.hd, 42);
    const double scale = 1 / std::sqrt(static_cast<double>(tc.hd));
    dmat o(tc.nq, tc.heads * tc.hd, 99.0), lse(tc.nq, tc.heads, 99.0);
    be.attention_forward(s, q.cview(), k.cview(), v.cview(), {tc.q0, tc.valid_len}, scale, o.view(),
                         lse.view());
    const auto [o_ref, lse_ref] = naive_attention(s, q, k, v, tc.q0, tc.valid_len, scale);
    CHECK(max_rel_diff(o.v, o_ref.v) < 1e-13);
    CHECK(max_rel_diff(lse.v, lse_ref.v) < 1e-13);
  }
}

TEST_CASE("attention: a padded query attends every valid key, like the last valid position") {
  reference_backend<double> be;
  const attention_shape s{2, 1, 4};
  const index_t nk = 10, valid_len = 6;
  const dmat q = dmat::random(1, 8, 43);
  const dmat k = dmat::random(nk, 4, 44), v = dmat::random(nk, 4, 45);
  dmat o_pad(1, 8), lse_pad(1, 2), o_last(1, 8), lse_last(1, 2);
  be.attention_forward(s, q.cview(), k.cview(), v.cview(), {8, valid_len}, 0.5, o_pad.view(),
                       lse_pad.view());
  be.attention_forward(s, q.cview(), k.cview(), v.cview(), {valid_len - 1, valid_len}, 0.5,
                       o_last.view(), lse_last.view());
  for (double x : o_pad.v) CHECK(std::isfinite(x));
  CHECK(max_rel_diff(o_pad.v, o_last.v) < 1e-15);
  CHECK(max_rel_diff(lse_pad.v, lse_last.v) < 1e-15);
}

TEST_CASE("attention stats count computed (query, key, head) triples") {
  reference_backend<double> be;
  const attn_case tc{4, 2, 3, 5, 9, 3, 6};
  const attention_shape s{tc.heads, tc.kv_heads, tc.hd};
  const dmat q = dmat::random(tc.nq, tc.heads * tc.hd, 46);
  const dmat k = dmat::random(tc.nk, tc.kv_heads * tc.hd, 47);
  dmat o(tc.nq, tc.heads * tc.hd), lse(tc.nq, tc.heads);
  be.attention_forward(s, q.cview(), k.cview(), k.cview(), {tc.q0, tc.valid_len}, 0.3, o.view(),
                       lse.view());
  double triples = 0;
  for (index_t i = 0; i < tc.nq; ++i)
    for (index_t j = 0; j < tc.nk; ++j)
      if (j <= tc.q0 + i && j < tc.valid_len) triples += static_cast<double>(tc.heads);
  CHECK(be.stats().attention_forward_calls == 1);
  CHECK(be.stats().attention_flops == doctest::Approx(4.0 * static_cast<double>(tc.hd) * triples));
  dmat dq(tc.nq, tc.heads * tc.hd), dk(tc.nk, tc.kv_heads * tc.hd), dv = dk;
  be.attention_backward(s, q.cview(), k.cview(), k.cview(), o.cview(), o.cview(), lse.cview(),
                        {tc.q0, tc.valid_len}, 0.3, dq.view(), dk.view(), dv.view());
  CHECK(be.stats().attention_backward_calls == 1);
  CHECK(be.stats().attention_flops == doctest::Approx(14.0 * static_cast<double>(tc.hd) * triples));
}

TEST_CASE("attention backward matches finite differences (GQA 1/2/4, q0 > 0, valid_len < nk)") {
  reference_backend<double> be;
  const attn_case cases[] = {
      {4, 4, 3, 5, 9, 3, 6},  // GQA 1
      {4, 2, 3, 5, 9, 3, 6},  // GQA 2
      {4, 1, 2, 7, 8, 1, 5},  // GQA 4, nq = 7
  };
  for (const auto& tc : cases) {
    CAPTURE(tc.kv_heads);
    const attention_shape s{tc.heads, tc.kv_heads, tc.hd};
    dmat q = dmat::random(tc.nq, tc.heads * tc.hd, 50);
    dmat k = dmat::random(tc.nk, tc.kv_heads * tc.hd, 51);
    dmat v = dmat::random(tc.nk, tc.kv_heads * tc.hd, 52);
    const dmat w = dmat::random(tc.nq, tc.heads * tc.hd, 53);
    const double scale = 0.8;
    auto forward = [&](dmat& o, dmat& lse) {
      be.attention_forward(s, q.cview(), k.cview(), v.cview(), {tc.q0, tc.valid_len}, scale,
                           o.view(), lse.view());
    };
    auto f = [&] {
      dmat o(tc.nq, tc.heads * tc.hd), lse(tc.nq, tc.heads);
      forward(o, lse);
      return weighted_sum(w.v, o.v);
    };
    dmat o(tc.nq, tc.heads * tc.hd), lse(tc.nq, tc.heads);
    forward(o, lse);
    // accumulate onto non-zero buffers: the kernel must add, not overwrite
    dmat dq = dmat::random(tc.nq, tc.heads * tc.hd, 54);
    dmat dk = dmat::random(tc.nk, tc.kv_heads * tc.hd, 55);
    dmat dv = dmat::random(tc.nk, tc.kv_heads * tc.hd, 56);
    const dmat dq0 = dq, dk0 = dk, dv0 = dv;
    be.attention_backward(s, q.cview(), k.cview(), v.cview(), o.cview(), w.cview(), lse.cview(),
                          {tc.q0, tc.valid_len}, scale, dq.view(), dk.view(), dv.view());
    auto minus = [](const dmat& a, const dmat& b) {
      std::vector<double> r(a.v.size());
      for (std::size_t i = 0; i < r.size(); ++i) r[i] = a.v[i] - b.v[i];
      return r;
    };
    CHECK(max_rel_diff(minus(dq, dq0), numeric_grad(q.v, f)) < grad_tol);
    CHECK(max_rel_diff(minus(dk, dk0), numeric_grad(k.v, f)) < grad_tol);
    CHECK(max_rel_diff(minus(dv, dv0), numeric_grad(v.v, f)) < grad_tol);
    // keys at or beyond valid_len get no gradient
    const auto ddk = minus(dk, dk0);
    for (index_t j = tc.valid_len; j < tc.nk; ++j)
      for (index_t c = 0; c < k.cols; ++c)
        CHECK(ddk[static_cast<std::size_t>(j * k.cols + c)] == 0.0);
  }
}

TEST_CASE("attention over query ranges against key prefixes equals full causal attention") {
  reference_backend<double> be;
  const index_t total = 13, heads = 4, kv_heads = 2, hd = 4;
  const attention_shape s{heads, kv_heads, hd};
  const double scale = 0.5;
  const dmat q = dmat::random(total, heads * hd, 60);
  const dmat k = dmat::random(total, kv_heads * hd, 61);
  const dmat v = dmat::random(total, kv_heads * hd, 62);
  const dmat dout = dmat::random(total, heads * hd, 63);
  const std::vector<std::vector<index_t>> splits = {
      {0, 13}, {0, 4, 9, 13}, {0, 1, 2, 7, 13}, {0, 5, 6, 12, 13}};
  for (index_t valid_len : {index_t{13}, index_t{10}}) {
    CAPTURE(valid_len);
    dmat o(total, heads * hd), lse(total, heads);
    be.attention_forward(s, q.cview(), k.cview(), v.cview(), {0, valid_len}, scale, o.view(),
                         lse.view());
    dmat dq(total, heads * hd), dk(total, kv_heads * hd), dv(total, kv_heads * hd);
    be.attention_backward(s, q.cview(), k.cview(), v.cview(), o.cview(), dout.cview(), lse.cview(),
                          {0, valid_len}, scale, dq.view(), dk.view(), dv.view());
    for (const auto& cuts : splits) {
      CAPTURE(cuts.size());
      dmat o_r(total, heads * hd), lse_r(total, heads);
      dmat dq_r(total, heads * hd), dk_r(total, kv_heads * hd), dv_r(total, kv_heads * hd);
      // last range first, as StreamBP runs them (order does not matter for the sums)
      for (std::size_t c = cuts.size() - 1; c >= 1; --c) {
        const index_t q0 = cuts[c - 1], q1 = cuts[c];
        auto rows = [&](dmat& m) { return m.view().row_range(q0, q1); };
        auto crows = [&](const dmat& m) { return m.cview().row_range(q0, q1); };
        auto prefix = [&](const dmat& m) { return m.cview().row_range(0, q1); };
        be.attention_forward(s, crows(q), prefix(k), prefix(v), {q0, valid_len}, scale, rows(o_r),
                             rows(lse_r));
        be.attention_backward(s, crows(q), prefix(k), prefix(v), crows(o_r), crows(dout),
                              crows(lse_r), {q0, valid_len}, scale, rows(dq_r),
                              dk_r.view().row_range(0, q1), dv_r.view().row_range(0, q1));
      }
      CHECK(max_rel_diff(o_r.v, o.v) < 1e-14);
      CHECK(max_rel_diff(lse_r.v, lse.v) < 1e-14);
      CHECK(max_rel_diff(dq_r.v, dq.v) < 1e-13);
      CHECK(max_rel_diff(dk_r.v, dk.v) < 1e-13);
      CHECK(max_rel_diff(dv_r.v, dv.v) < 1e-13);
    }
  }
}

TEST_CASE("attention on strided views (Q, K, V inside one fused QKV buffer)") {
  reference_backend<double> be;
  const index_t n = 6, heads = 2, kv_heads = 1, hd = 4;
  const attention_shape s{heads, kv_heads, hd};
  const index_t qc = heads * hd, kc = kv_heads * hd;
  const dmat qkv = dmat::random(n, qc + 2 * kc, 64);  // (n, H*hd + 2*Hkv*hd)
  dmat q(n, qc), k(n, kc), v(n, kc);
  for (index_t i = 0; i < n; ++i) {
    for (index_t c = 0; c < qc; ++c) q(i, c) = qkv(i, c);
    for (index_t c = 0; c < kc; ++c) k(i, c) = qkv(i, qc + c);
    for (index_t c = 0; c < kc; ++c) v(i, c) = qkv(i, qc + kc + c);
  }
  dmat o1(n, qc), l1(n, heads), o2(n, qc), l2(n, heads);
  be.attention_forward(s, q.cview(), k.cview(), v.cview(), {0, n}, 0.4, o1.view(), l1.view());
  be.attention_forward(s, qkv.cview().col_range(0, qc), qkv.cview().col_range(qc, qc + kc),
                       qkv.cview().col_range(qc + kc, qc + 2 * kc), {0, n}, 0.4, o2.view(),
                       l2.view());
  CHECK(max_rel_diff(o1.v, o2.v) == 0.0);
  CHECK(max_rel_diff(l1.v, l2.v) == 0.0);
}
