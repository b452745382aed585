// tightfit/backend/detail/reference_checks.hpp: argument checks of the Backend kernels.
//
// One function per kernel validates every extent of its arguments and throws tightfit::error
// with a message that names the kernel, the argument and both extents, e.g.
//   "gemm: C is (3 x 5), expected (3 x 4) from op(A) (3 x 7) and op(B) (7 x 4)".
// The reference backend calls them; any other backend may call the same functions so that all
// backends reject the same input with the same message. They never touch tensor elements
// except ids/labels (range checks), which are O(n).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::detail {

inline std::string shape_str(index_t rows, index_t cols) {
  return concat("(", rows, " x ", cols, ")");
}

template <class T>
std::string shape_str(const matrix_view<T>& v) {
  return shape_str(v.rows, v.cols);
}

/// Extents non-negative and rows not overlapping (stride >= cols unless there is one row).
template <class T>
void check_layout(const char* kernel, const char* what, const matrix_view<T>& v) {
  check(v.rows >= 0 && v.cols >= 0, kernel, ": ", what, " has negative extents ", shape_str(v));
  check(v.rows <= 1 || v.stride >= v.cols, kernel, ": ", what, " has stride ", v.stride,
        ", expected >= cols ", v.cols);
  check(v.empty() || v.data != nullptr, kernel, ": ", what, " ", shape_str(v),
        " has a null data pointer");
}

template <class T>
void check_layout(const char* kernel, const char* what, const tensor3_view<T>& v) {
  check(v.batch >= 0 && v.rows >= 0 && v.cols >= 0, kernel, ": ", what, " has negative extents (",
        v.batch, " x ", v.rows, " x ", v.cols, ")");
  check(v.rows <= 1 || v.row_stride >= v.cols, kernel, ": ", what, " has row stride ", v.row_stride,
        ", expected >= cols ", v.cols);
  check(v.size() == 0 || v.data != nullptr, kernel, ": ", what, " has a null data pointer");
}

/// "<kernel>: <what> is (r x c), expected (R x C) <why>".
template <class T>
void check_shape(const char* kernel, const char* what, const matrix_view<T>& v, index_t rows,
                 index_t cols, const char* why) {
  check_layout(kernel, what, v);
  check(v.rows == rows && v.cols == cols, kernel, ": ", what, " is ", shape_str(v), ", expected ",
        shape_str(rows, cols), " ", why);
}

/// "<kernel>: <what>.size is n, expected N <why>".
template <class S>
void check_size(const char* kernel, const char* what, const S& s, index_t want, const char* why) {
  const auto got = static_cast<index_t>(s.size());
  check(got == want, kernel, ": ", what, ".size is ", got, ", expected ", want, " ", why);
}

/// Every id in [0, limit): "<kernel>: ids[i] is 57, expected in [0, 50) (<why>)".
inline void check_ids(const char* kernel, const char* what, std::span<const token_id> ids,
                      index_t limit, const char* why) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    check(ids[i] >= 0 && ids[i] < limit, kernel, ": ", what, "[", i, "] is ", ids[i],
          ", expected in [0, ", limit, ") (", why, ")");
}

/// Every label in [0, vocab) or equal to ignore_index.
inline void check_labels(const char* kernel, std::span<const token_id> labels, index_t vocab) {
  for (std::size_t i = 0; i < labels.size(); ++i)
    check(labels[i] == ignore_index || (labels[i] >= 0 && labels[i] < vocab), kernel, ": label ",
          labels[i], " of row ", i, " is outside [0, ", vocab,
          ") (logits.cols) and is not ignore_index (", ignore_index, ")");
}

/// op(X) extents for a transpose flag.
inline std::pair<index_t, index_t> op_shape(transpose t, index_t rows, index_t cols) {
  return t == transpose::no ? std::pair{rows, cols} : std::pair{cols, rows};
}

/// Extents of a gemm: op(A) is (m, k), op(B) is (k, n), C is (m, n).
struct gemm_dims {
  index_t m, n, k;
};

inline gemm_dims check_gemm_dims(const char* kernel, transpose ta, index_t a_rows, index_t a_cols,
                                 transpose tb, index_t b_rows, index_t b_cols, index_t c_rows,
                                 index_t c_cols) {
  const auto [m, ka] = op_shape(ta, a_rows, a_cols);
  const auto [kb, n] = op_shape(tb, b_rows, b_cols);
  check(ka == kb, kernel, ": op(A) is ", shape_str(m, ka), " and op(B) is ", shape_str(kb, n),
        ": inner extents ", ka, " and ", kb, " differ");
  check(c_rows == m && c_cols == n, kernel, ": C is ", shape_str(c_rows, c_cols), ", expected ",
        shape_str(m, n), " from op(A) ", shape_str(m, ka), " and op(B) ", shape_str(kb, n));
  return {m, n, ka};
}

template <class T>
gemm_dims check_gemm(transpose ta, transpose tb, const matrix_view<const T>& a,
                     const matrix_view<const T>& b, const matrix_view<T>& c) {
  check_layout("gemm", "A", a);
  check_layout("gemm", "B", b);
  check_layout("gemm", "C", c);
  return check_gemm_dims("gemm", ta, a.rows, a.cols, tb, b.rows, b.cols, c.rows, c.cols);
}

template <class T>
gemm_dims check_gemm_batched(transpose ta, transpose tb, const tensor3_view<const T>& a,
                             const tensor3_view<const T>& b, const tensor3_view<T>& c) {
  check_layout("gemm_batched", "A", a);
  check_layout("gemm_batched", "B", b);
  check_layout("gemm_batched", "C", c);
  check(a.batch == c.batch && b.batch == c.batch, "gemm_batched: batch sizes differ: A has ",
        a.batch, ", B has ", b.batch, ", C has ", c.batch);
  return check_gemm_dims("gemm_batched", ta, a.rows, a.cols, tb, b.rows, b.cols, c.rows, c.cols);
}

/// y has the shape of x: "<kernel>: y is (..), expected (..) like x".
template <class T>
void check_like(const char* kernel, const char* what, const matrix_view<T>& v, const char* ref_name,
                index_t rows, index_t cols) {
  check_layout(kernel, what, v);
  check(v.rows == rows && v.cols == cols, kernel, ": ", what, " is ", shape_str(v), ", expected ",
        shape_str(rows, cols), " like ", ref_name);
}

template <class T>
void check_embedding_forward(const matrix_view<const T>& table, std::span<const token_id> ids,
                             const matrix_view<T>& out) {
  const char* k = "embedding_forward";
  check_layout(k, "table", table);
  check_shape(k, "out", out, static_cast<index_t>(ids.size()), table.cols,
              "(ids.size x table.cols)");
  check_ids(k, "ids", ids, table.rows, "table.rows");
}

template <class T>
void check_embedding_backward(const matrix_view<const T>& dout, std::span<const token_id> ids,
                              const matrix_view<T>& dtable) {
  const char* k = "embedding_backward";
  check_layout(k, "dtable", dtable);
  check_shape(k, "dout", dout, static_cast<index_t>(ids.size()), dtable.cols,
              "(ids.size x dtable.cols)");
  check_ids(k, "ids", ids, dtable.rows, "dtable.rows");
}

template <class T>
void check_rmsnorm_forward(const matrix_view<const T>& x, std::span<const T> w, T eps,
                           const matrix_view<T>& y, std::span<T> rstd) {
  const char* k = "rmsnorm_forward";
  check_layout(k, "x", x);
  check(x.cols >= 1, k, ": x is ", shape_str(x), ", expected at least one column");
  check(eps >= T(0), k, ": eps is ", eps, ", expected >= 0");
  check_size(k, "w", w, x.cols, "(x.cols)");
  check_like(k, "y", y, "x", x.rows, x.cols);
  check_size(k, "rstd", rstd, x.rows, "(x.rows)");
}

template <class T>
void check_rmsnorm_backward(const matrix_view<const T>& x, std::span<const T> w,
                            std::span<const T> rstd, const matrix_view<const T>& dy,
                            const matrix_view<T>& dx, std::span<T> dw) {
  const char* k = "rmsnorm_backward";
  check_layout(k, "x", x);
  check_size(k, "w", w, x.cols, "(x.cols)");
  check_size(k, "rstd", rstd, x.rows, "(x.rows)");
  check_like(k, "dy", dy, "x", x.rows, x.cols);
  check_like(k, "dx", dx, "x", x.rows, x.cols);
  if (!dw.empty()) check_size(k, "dw", dw, x.cols, "(x.cols, or empty to skip)");
}

template <class T>
void check_rope(const char* k, const matrix_view<T>& x, index_t heads, index_t head_dim,
                const rope_args& r) {
  check_layout(k, "x", x);
  check(heads >= 1, k, ": heads is ", heads, ", expected >= 1");
  check(head_dim >= 2 && head_dim % 2 == 0, k, ": head_dim is ", head_dim,
        ", expected an even number >= 2");
  check(x.cols == heads * head_dim, k, ": x.cols is ", x.cols, ", expected ", heads * head_dim,
        " (heads ", heads, " x head_dim ", head_dim, ")");
  check(r.pos0 >= 0, k, ": pos0 is ", r.pos0, ", expected >= 0");
  if (!r.positions.empty()) {
    check(r.pos0 == 0, k, ": pos0 is ", r.pos0, " with positions given, expected 0");
    check_size(k, "positions", r.positions, x.rows, "(x.rows)");
    for (std::size_t i = 0; i < r.positions.size(); ++i)
      check(r.positions[i] >= 0, k, ": positions[", i, "] is ", r.positions[i], ", expected >= 0");
  }
  if (r.inv_freq.empty()) {
    check(r.theta > 0 && std::isfinite(r.theta), k, ": theta is ", r.theta,
          ", expected a finite value > 0");
  } else {
    check_size(k, "inv_freq", r.inv_freq, head_dim / 2, "(head_dim / 2)");
    for (std::size_t i = 0; i < r.inv_freq.size(); ++i)
      check(std::isfinite(r.inv_freq[i]), k, ": inv_freq[", i, "] is ", r.inv_freq[i],
            ", expected a finite value");
  }
  check(std::isfinite(r.attention_scaling), k, ": attention_scaling is ", r.attention_scaling,
        ", expected a finite value");
}

template <class T>
void check_swiglu_forward(const matrix_view<const T>& gate, const matrix_view<const T>& up,
                          const matrix_view<T>& out, const char* k = "swiglu_forward") {
  check_layout(k, "gate", gate);
  check_like(k, "up", up, "gate", gate.rows, gate.cols);
  check_like(k, "out", out, "gate", gate.rows, gate.cols);
}

template <class T>
void check_swiglu_backward(const matrix_view<const T>& gate, const matrix_view<const T>& up,
                           const matrix_view<const T>& dout, const matrix_view<T>& dgate,
                           const matrix_view<T>& dup, const char* k = "swiglu_backward") {
  check_layout(k, "gate", gate);
  check_like(k, "up", up, "gate", gate.rows, gate.cols);
  check_like(k, "dout", dout, "gate", gate.rows, gate.cols);
  check_like(k, "dgate", dgate, "gate", gate.rows, gate.cols);
  check_like(k, "dup", dup, "gate", gate.rows, gate.cols);
}

/// A logit soft-capping call: a finite cap > 0; backward: capped and dx of one shape.
template <class T>
void check_softcap(const char* k, const matrix_view<T>& x, double cap) {
  check_layout(k, "x", x);
  check(cap > 0 && std::isfinite(cap), k, ": cap is ", cap, ", expected a finite value > 0");
}
template <class T>
void check_softcap_backward(const matrix_view<const T>& capped, const matrix_view<T>& dx,
                            double cap) {
  const char* k = "logit_softcap_backward";
  check_softcap(k, capped, cap);
  check_like(k, "dx", dx, "capped", capped.rows, capped.cols);
}

/// The mask of an attention call over nq queries: q0 >= 0, valid_len >= 1, window >= 0, and
/// doc_start (when given) covering every query position, non-decreasing, in [0, p].
inline void check_attention_mask(const char* k, const attention_mask& m, index_t nq) {
  check(m.q0 >= 0, k, ": q0 is ", m.q0, ", expected >= 0");
  check(m.valid_len >= 1, k, ": valid_len is ", m.valid_len, ", expected >= 1");
  check(m.window >= 0, k, ": window is ", m.window, ", expected >= 0 (0: no sliding window)");
  check(m.softcap >= 0 && std::isfinite(m.softcap), k, ": softcap is ", m.softcap,
        ", expected a finite value >= 0 (0: no soft-capping)");
  if (m.doc_start.empty()) return;
  const index_t need = m.q0 + nq;
  check(static_cast<index_t>(m.doc_start.size()) >= need, k, ": doc_start.size is ",
        m.doc_start.size(), ", expected >= q0 + Q.rows = ", need);
  index_t prev = 0;
  for (index_t p = 0; p < need; ++p) {
    const index_t s = m.doc_start[static_cast<std::size_t>(p)];
    check(s >= prev && s <= p, k, ": doc_start[", p, "] is ", s, ", expected in [", prev, ", ", p,
          "] (non-decreasing, at most the position)");
    prev = s;
  }
}

/// Checks shared by attention_forward/backward: shape, Q, K, V, the mask.
template <class T>
void check_attention_inputs(const char* k, const attention_shape& s, const matrix_view<const T>& q,
                            const matrix_view<const T>& kk, const matrix_view<const T>& v,
                            const attention_mask& mask, T scale) {
  check(s.heads >= 1 && s.kv_heads >= 1 && s.head_dim >= 1, k, ": shape (heads ", s.heads,
        ", kv_heads ", s.kv_heads, ", head_dim ", s.head_dim, ") has an extent < 1");
  check(s.heads % s.kv_heads == 0, k, ": heads ", s.heads, " is not a multiple of kv_heads ",
        s.kv_heads);
  check_layout(k, "Q", q);
  check(q.cols == s.heads * s.head_dim, k, ": Q.cols is ", q.cols, ", expected ",
        s.heads * s.head_dim, " (heads ", s.heads, " x head_dim ", s.head_dim, ")");
  check_layout(k, "K", kk);
  check(kk.cols == s.kv_heads * s.head_dim, k, ": K.cols is ", kk.cols, ", expected ",
        s.kv_heads * s.head_dim, " (kv_heads ", s.kv_heads, " x head_dim ", s.head_dim, ")");
  check(kk.rows >= 1, k, ": K.rows is ", kk.rows, ", expected >= 1 (key 0 must exist)");
  check_like(k, "V", v, "K", kk.rows, kk.cols);
  check_attention_mask(k, mask, q.rows);
  check(mask.k0 >= 0, k, ": k0 is ", mask.k0, ", expected >= 0");
  check(mask.key_end == 0 || mask.key_end >= mask.k0 + kk.rows, k, ": key_end is ", mask.key_end,
        ", expected 0 or >= k0 + K.rows = ", mask.k0 + kk.rows);
  check(std::isfinite(static_cast<double>(scale)), k, ": scale is ", scale,
        ", expected a finite value");
}

template <class T>
void check_attention_forward(const attention_shape& s, const matrix_view<const T>& q,
                             const matrix_view<const T>& kk, const matrix_view<const T>& v,
                             const attention_mask& mask, T scale, const matrix_view<T>& o,
                             const matrix_view<T>& lse) {
  const char* k = "attention_forward";
  check_attention_inputs(k, s, q, kk, v, mask, scale);
  check_shape(k, "O", o, q.rows, q.cols, "(Q.rows x heads*head_dim)");
  check_shape(k, "lse", lse, q.rows, s.heads, "(Q.rows x heads)");
}

template <class T>
void check_attention_backward(const attention_shape& s, const matrix_view<const T>& q,
                              const matrix_view<const T>& kk, const matrix_view<const T>& v,
                              const matrix_view<const T>& o, const matrix_view<const T>& dout,
                              const matrix_view<const T>& lse, const attention_mask& mask, T scale,
                              const matrix_view<T>& dq, const matrix_view<T>& dk,
                              const matrix_view<T>& dv) {
  const char* k = "attention_backward";
  check_attention_inputs(k, s, q, kk, v, mask, scale);
  check_shape(k, "O", o, q.rows, q.cols, "(Q.rows x heads*head_dim)");
  check_shape(k, "dO", dout, q.rows, q.cols, "(Q.rows x heads*head_dim)");
  check_shape(k, "lse", lse, q.rows, s.heads, "(Q.rows x heads)");
  check_shape(k, "dQ", dq, q.rows, q.cols, "(Q.rows x heads*head_dim)");
  check_shape(k, "dK", dk, kk.rows, kk.cols, "(K.rows x kv_heads*head_dim)");
  check_shape(k, "dV", dv, kk.rows, kk.cols, "(K.rows x kv_heads*head_dim)");
}

template <class T>
void check_tau(const char* k, T tau) {
  check(tau > T(0) && std::isfinite(static_cast<double>(tau)), k, ": tau is ", tau,
        ", expected a finite value > 0");
}

template <class T>
void check_xent_forward(const matrix_view<const T>& logits, std::span<const token_id> labels, T tau,
                        std::span<T> lse, std::span<T> logprob) {
  const char* k = "xent_forward";
  check_layout(k, "logits", logits);
  check(logits.cols >= 1, k, ": logits is ", shape_str(logits), ", expected at least one column");
  check_tau(k, tau);
  check_size(k, "labels", labels, logits.rows, "(logits.rows)");
  check_size(k, "lse", lse, logits.rows, "(logits.rows)");
  check_size(k, "logprob", logprob, logits.rows, "(logits.rows)");
  check_labels(k, labels, logits.cols);
}

template <class T>
void check_xent_backward(const matrix_view<T>& logits, std::span<const token_id> labels,
                         std::span<const T> lse, std::span<const T> coeff, T tau) {
  const char* k = "xent_backward";
  check_layout(k, "logits", logits);
  check(logits.cols >= 1, k, ": logits is ", shape_str(logits), ", expected at least one column");
  check_tau(k, tau);
  check_size(k, "labels", labels, logits.rows, "(logits.rows)");
  check_size(k, "lse", lse, logits.rows, "(logits.rows)");
  check_size(k, "coeff", coeff, logits.rows, "(logits.rows)");
  check_labels(k, labels, logits.cols);
}

template <class T>
void check_adam(std::span<T> param, std::span<const T> grad, std::span<T> m, std::span<T> v,
                const adam_hyper<T>& h) {
  const char* k = "adam_update";
  const auto n = static_cast<index_t>(param.size());
  check_size(k, "grad", grad, n, "(param.size)");
  check_size(k, "m", m, n, "(param.size)");
  check_size(k, "v", v, n, "(param.size)");
  check(h.step >= 1, k, ": step is ", h.step, ", expected >= 1");
  check(h.beta1 >= T(0) && h.beta1 < T(1), k, ": beta1 is ", h.beta1, ", expected in [0, 1)");
  check(h.beta2 >= T(0) && h.beta2 < T(1), k, ": beta2 is ", h.beta2, ", expected in [0, 1)");
  check(h.eps >= T(0), k, ": eps is ", h.eps, ", expected >= 0");
}

template <class T>
void check_sgd(std::span<T> param, std::span<const T> grad, std::span<T> buf,
               const sgd_hyper<T>& h) {
  const char* k = "sgd_update";
  const auto n = static_cast<index_t>(param.size());
  check_size(k, "grad", grad, n, "(param.size)");
  check(h.momentum >= T(0), k, ": momentum is ", h.momentum, ", expected >= 0");
  if (h.momentum != T(0))
    check_size(k, "momentum_buf", buf, n, "(param.size, since momentum != 0)");
}

}  // namespace tightfit::detail
