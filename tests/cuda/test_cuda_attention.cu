// The CUDA attention engines, feature by feature, against reference_backend<double> (bf16
// storage; the float path is test_cuda.cu's):
//  - "cuda_host": the tensor-core eligibility test (detail::cuda_k::mma::refusal), the
//    TIGHTFIT_CUDA_ATTENTION parsing, the ldmatrix lane addresses against the mma fragment
//    layouts (emulated), and the tensor-core kernels' schedules replayed on the host in double
//    (replay_mma: their tiles, masks, pairs and online softmax through the headers' own
//    helpers) against the reference on the feature cases and 600 random geometries; no device
//    needed;
//  - "gpu": one case per feature the backend contract has (GQA, StreamBP's chunk with q0 > 0,
//    right padding, sliding window, document masks, soft-capping, key blocks merged by their
//    lse, tail tiles, one query row), each run by the CUDA-core kernels and by the tensor-core
//    kernels (atomic and deterministic dQ), with an fp32 lse. Every (case, engine, tensor) prints
//    one line: max |got - want| / max |want|, where the largest difference is (row, column),
//    the two values there, and the count of non-finite values, so that one GPU run shows which
//    feature of which kernel disagrees and by how much. Then: deterministic reruns bit-identical,
//    backward accumulating (+=), the bf16-lse path (lse recomputed in fp32), and the engine
//    forced on a call it cannot run throwing.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/backend/cuda.hpp"
#include "tightfit/backend/reference.hpp"

using namespace tightfit;
using bf16 = __nv_bfloat16;

TEST_SUITE("cuda_host") {
  TEST_CASE("the tensor-core attention takes bf16, head_dim 64 / 128, sm_80+, aligned rows") {
    namespace mk = detail::cuda_k::mma;
    alignas(16) static unsigned char buf[64];
    const void* ok = buf;
    const void* off = buf + 2;  // bf16-aligned, not 16-byte aligned
    CHECK(mk::refusal(true, 128, 9, 1000, {{ok, 4096}, {ok, 1024}}) == nullptr);
    CHECK(mk::refusal(true, 64, 8, 1000, {{ok, 64}}) == nullptr);
    CHECK(std::string(mk::refusal(false, 128, 9, 1000, {{ok, 4096}})).find("float") !=
          std::string::npos);
    CHECK(std::string(mk::refusal(true, 96, 9, 1000, {{ok, 96}})).find("head_dim") !=
          std::string::npos);
    CHECK(std::string(mk::refusal(true, 256, 9, 1000, {{ok, 256}})).find("head_dim") !=
          std::string::npos);
    CHECK(std::string(mk::refusal(true, 128, 7, 1000, {{ok, 128}})).find("sm_80") !=
          std::string::npos);
    CHECK(std::string(mk::refusal(true, 128, 9, 1000, {{ok, 128}, {off, 128}})).find("aligned") !=
          std::string::npos);
    CHECK(std::string(mk::refusal(true, 128, 9, 1000, {{ok, 132}})).find("stride") !=
          std::string::npos);
    CHECK(std::string(mk::refusal(true, 128, 9, index_t{1} << 31, {{ok, 128}})).find("2^31") !=
          std::string::npos);
    CHECK(mk::refusal(true, 128, 9, (index_t{1} << 31) - 2, {{ok, 128}}) == nullptr);
    // shared memory of the tile sets fits an sm_80 block (163 KiB opt-in) at head_dim 128, and
    // two blocks of each fit an sm_90 SM (228 KiB, 1 KiB reserved per block)
    for (std::size_t b : {mk::fwd_smem(128), mk::dkdv_smem(128), mk::dq_smem(128)}) {
      CHECK(b <= 163 * 1024);
      CHECK(2 * (b + 1024) <= 228 * 1024);
    }
  }

  TEST_CASE("ldmatrix lane addresses give the mma.m16n8k16 fragment layouts (emulated)") {
    // ldmatrix.x4 as the PTX ISA defines it: lanes 8m .. 8m + 7 give the addresses of rows 0-7
    // of matrix m (8 consecutive 16-bit elements each); register m of lane l then holds row
    // l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (low half first), or with .trans
    // rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4. The fragments mma expects (lane l,
    // g = l / 4, t = l % 4): A (16 x 16) a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g,
    // 2t + 8..), a3 = (g + 8, 2t + 8..); B (16 x 8, by k, n) b0 = (2t..2t+1, g), b1 = (2t + 8..,
    // g). Here a stored element is named by its (row, column) in the stored tile and mapped back
    // to the logical matrix, so the offsets of cuda_attention_mma.cuh are checked end to end.
    namespace mk = detail::cuda_k::mma;
    struct rc {
      int r, c;
      bool operator==(const rc&) const = default;
    };
    // stored (row, col) of half h of register m of lane l
    auto load = [](auto offset, bool trans, int l, int m, int h) {
      if (!trans) {
        const auto o = offset(8 * m + l / 4);
        return rc{o.r, o.c + 2 * (l % 4) + h};
      }
      const auto o = offset(8 * m + 2 * (l % 4) + h);
      return rc{o.r, o.c + l / 4};
    };
    auto a_expected = [](int l, int m, int h) {  // logical (row, k) of A's register m
      const int g = l / 4, t = l % 4;
      return rc{g + 8 * (m & 1), 2 * t + h + 8 * (m >> 1)};
    };
    auto b_expected = [](int l, int m, int h) {  // logical (k, n) of B: regs 0-1 n-block 0
      const int g = l / 4, t = l % 4;
      return rc{2 * t + h + 8 * (m & 1), g + 8 * (m >> 1)};
    };
    int mismatches = 0;
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m)
        for (int h = 0; h < 2; ++h) {
          // A row-major: stored (r, c) = A (r, c)
          const rc a = load(mk::ldsm_a, false, l, m, h);
          mismatches += !(a == a_expected(l, m, h));
          // A stored transposed (k, m) with .trans: stored (r, c) = A (c, r)
          const rc at = load(mk::ldsm_a_t, true, l, m, h);
          mismatches += !(rc{at.c, at.r} == a_expected(l, m, h));
          // B stored (n, k): stored (r, c) = B (k = c, n = r)
          const rc bnk = load(mk::ldsm_b_nk, false, l, m, h);
          mismatches += !(rc{bnk.c, bnk.r} == b_expected(l, m, h));
          // B stored (k, n) with .trans: stored (r, c) = B (r, c)
          const rc bkn = load(mk::ldsm_b_kn, true, l, m, h);
          mismatches += !(bkn == b_expected(l, m, h));
        }
    CHECK(mismatches == 0);
    // and every lane addresses a row inside the 16 x 16 block, on a 16-byte boundary
    for (int l = 0; l < 32; ++l)
      for (auto o : {mk::ldsm_a(l), mk::ldsm_a_t(l), mk::ldsm_b_nk(l), mk::ldsm_b_kn(l)}) {
        CHECK(o.r >= 0);
        CHECK(o.r < 16);
        CHECK((o.c == 0 || o.c == 8));
      }
  }

  TEST_CASE("TIGHTFIT_CUDA_ATTENTION picks the engine when the options leave it automatic") {
    using E = attention_engine;
    CHECK(detail::resolve_attention_engine(E::automatic, nullptr) == E::automatic);
    CHECK(detail::resolve_attention_engine(E::automatic, "") == E::automatic);
    CHECK(detail::resolve_attention_engine(E::automatic, "auto") == E::automatic);
    CHECK(detail::resolve_attention_engine(E::automatic, "cuda_cores") == E::cuda_cores);
    CHECK(detail::resolve_attention_engine(E::automatic, "tensor_cores") == E::tensor_cores);
    CHECK(detail::resolve_attention_engine(E::tensor_cores, "cuda_cores") == E::tensor_cores);
    CHECK_THROWS_WITH_AS(detail::resolve_attention_engine(E::automatic, "tensor"),
                         doctest::Contains("TIGHTFIT_CUDA_ATTENTION is 'tensor'"), tightfit::error);
    cuda_backend<bf16> forced(cuda_backend_options{0, false, false, E::cuda_cores});
    CHECK(forced.attention() == E::cuda_cores);
    CHECK(forced.tensor_core_attention_calls() == 0);
  }
}

namespace {

bool have_gpu() {
  static const bool yes = cuda_backend<float>::device_count() > 0;
  return yes;
}

template <class T>
T to_t(double x) {
  if constexpr (std::is_same_v<T, float>)
    return static_cast<float>(x);
  else
    return __float2bfloat16(static_cast<float>(x));
}
template <class T>
double to_d(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return static_cast<double>(__bfloat162float(x));
}
/// x rounded to bf16.
double bf(double x) {
  return to_d(to_t<bf16>(x));
}

/// Uniform values in [lo, hi), rounded to bf16.
std::vector<double> rnd(index_t n, std::uint64_t seed, double lo, double hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = bf(u(g));
  return v;
}

/// One attention call of the contract (one sequence).
struct attn_case {
  std::string name;
  attention_shape shape;
  index_t nq = 0, nk = 0, q0 = 0, valid = 0, window = 0;
  std::vector<index_t> doc;  ///< doc_start of positions [0, q0 + nq); empty: one document
  double softcap = 0;
  double range = 2;           ///< q, k uniform in [-range, range)
  std::vector<index_t> cuts;  ///< key blocks [cuts[b], cuts[b + 1]), merged; empty: one call
};

struct attn_io {
  std::vector<double> o, lse, dq, dk, dv;
};

struct attn_inputs {
  std::vector<double> q, k, v, dout;
};

attention_mask mask_of(const attn_case& c) {
  attention_mask m{c.q0, c.valid, c.window};
  m.doc_start = c.doc;
  m.softcap = c.softcap;
  return m;
}

attn_inputs inputs_of(const attn_case& c) {
  const index_t qc = c.shape.heads * c.shape.head_dim, kc = c.shape.kv_heads * c.shape.head_dim;
  return {rnd(c.nq * qc, 1, -c.range, c.range), rnd(c.nk * kc, 2, -c.range, c.range),
          rnd(c.nk * kc, 3, -1, 1), rnd(c.nq * qc, 4, -1, 1)};
}

double scale_of(const attn_case& c) {
  return 1.0 / std::sqrt(static_cast<double>(c.shape.head_dim));
}

attn_io reference(const attn_case& c, const attn_inputs& in) {
  reference_backend<double> rb;
  const index_t qc = c.shape.heads * c.shape.head_dim, kc = c.shape.kv_heads * c.shape.head_dim;
  const index_t hs = c.shape.heads;
  auto q = in.q, k = in.k, v = in.v, dout = in.dout;
  attn_io r{std::vector<double>(static_cast<std::size_t>(c.nq * qc)),
            std::vector<double>(static_cast<std::size_t>(c.nq * hs)),
            std::vector<double>(static_cast<std::size_t>(c.nq * qc)),
            std::vector<double>(static_cast<std::size_t>(c.nk * kc)),
            std::vector<double>(static_cast<std::size_t>(c.nk * kc))};
  auto mv = [](std::vector<double>& x, index_t rows, index_t cols) {
    return matrix_view<double>(x.data(), rows, cols);
  };
  const auto m = mask_of(c);
  rb.attention_forward(c.shape, mv(q, c.nq, qc), mv(k, c.nk, kc), mv(v, c.nk, kc), m, scale_of(c),
                       mv(r.o, c.nq, qc), mv(r.lse, c.nq, hs));
  rb.attention_backward(c.shape, mv(q, c.nq, qc), mv(k, c.nk, kc), mv(v, c.nk, kc),
                        mv(r.o, c.nq, qc), mv(dout, c.nq, qc), mv(r.lse, c.nq, hs), m, scale_of(c),
                        mv(r.dq, c.nq, qc), mv(r.dk, c.nk, kc), mv(r.dv, c.nk, kc));
  return r;
}

/// Device buffers of one backend.
template <class T>
struct dbuf {
  cuda_backend<bf16>* be;
  detail::cuda_buffer<T> buf;
  dbuf(cuda_backend<bf16>& b, const std::vector<double>& h)
      : be(&b), buf(b.template allocate<T>(static_cast<index_t>(h.size()))) {
    std::vector<T> s(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) s[i] = to_t<T>(h[i]);
    b.upload(std::span<const T>(s), buf.span());
  }
  std::vector<double> get() const {
    std::vector<T> s(static_cast<std::size_t>(buf.size()));
    be->download(std::span<const T>(buf.span()), std::span<T>(s));
    std::vector<double> out(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) out[i] = to_d(s[i]);
    return out;
  }
  matrix_view<T> m(index_t r, index_t c) const { return {buf.data(), r, c}; }
};

/// The device's O, lse, dQ, dK, dV for a case: forward (per key block, merged) then backward
/// (per key block, with the merged O and lse); lse of type L (float: fp32 statistics).
template <class L = float>
attn_io run_device(const attn_case& c, const attn_inputs& in, cuda_backend<bf16>& cb,
                   int backward_runs = 1) {
  const index_t qc = c.shape.heads * c.shape.head_dim, kc = c.shape.kv_heads * c.shape.head_dim;
  const index_t hs = c.shape.heads;
  const auto sc = static_cast<float>(scale_of(c));
  dbuf<bf16> q(cb, in.q), k(cb, in.k), v(cb, in.v), dout(cb, in.dout);
  const auto zq = std::vector<double>(static_cast<std::size_t>(c.nq * qc));
  const auto zk = std::vector<double>(static_cast<std::size_t>(c.nk * kc));
  const auto zl = std::vector<double>(static_cast<std::size_t>(c.nq * hs));
  dbuf<bf16> o(cb, zq), dq(cb, zq), dk(cb, zk), dv(cb, zk);
  dbuf<L> lse(cb, zl);
  const auto m = mask_of(c);
  std::vector<index_t> cuts = c.cuts;
  if (cuts.empty()) cuts = {0, c.nk};
  if (cuts.size() > 2) {
    cb.fill(matrix_view<bf16>(o.m(c.nq, qc)), 0.f);
    if constexpr (std::is_same_v<L, float>)
      cb.template upload<float>(
          std::vector<float>(zl.size(), -std::numeric_limits<float>::infinity()), lse.buf.span());
  }
  for (std::size_t b = 0; b + 1 < cuts.size(); ++b) {
    attention_mask mb = m;
    if (cuts.size() > 2) {
      mb.k0 = cuts[b];
      mb.key_end = c.nk;
    }
    const auto kb = k.m(c.nk, kc).row_range(cuts[b], cuts[b + 1]);
    const auto vb = v.m(c.nk, kc).row_range(cuts[b], cuts[b + 1]);
    if (cuts.size() == 2) {
      cb.attention_forward(c.shape, q.m(c.nq, qc), kb, vb, mb, sc, o.m(c.nq, qc), lse.m(c.nq, hs));
      continue;
    }
    dbuf<bf16> ob(cb, zq);
    dbuf<L> lb(cb, zl);
    cb.attention_forward(c.shape, q.m(c.nq, qc), kb, vb, mb, sc, ob.m(c.nq, qc), lb.m(c.nq, hs));
    cb.attention_merge(hs, c.shape.head_dim, o.m(c.nq, qc), lse.m(c.nq, hs), ob.m(c.nq, qc),
                       lb.m(c.nq, hs));
  }
  for (int run = 0; run < backward_runs; ++run)
    for (std::size_t b = 0; b + 1 < cuts.size(); ++b) {
      attention_mask mb = m;
      if (cuts.size() > 2) {
        mb.k0 = cuts[b];
        mb.key_end = c.nk;
      }
      cb.attention_backward(c.shape, q.m(c.nq, qc), k.m(c.nk, kc).row_range(cuts[b], cuts[b + 1]),
                            v.m(c.nk, kc).row_range(cuts[b], cuts[b + 1]), o.m(c.nq, qc),
                            dout.m(c.nq, qc), lse.m(c.nq, hs), mb, sc, dq.m(c.nq, qc),
                            dk.m(c.nk, kc).row_range(cuts[b], cuts[b + 1]),
                            dv.m(c.nk, kc).row_range(cuts[b], cuts[b + 1]));
    }
  return {o.get(), lse.get(), dq.get(), dk.get(), dv.get()};
}

/// max |got - want| / max |want|, printing where the largest difference is.
double compare(const std::string& label, const char* tensor, const std::vector<double>& got,
               const std::vector<double>& want, index_t cols) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 1e-30;
  std::size_t at = 0, bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(want[i])) ++bad;
    const double d = std::abs(got[i] - want[i]);
    if (d > num || (std::isnan(d) && !std::isnan(num))) {
      num = d;
      at = i;
    }
    den = std::max(den, std::abs(want[i]));
  }
  const double rel = bad > 0 ? std::numeric_limits<double>::infinity() : num / den;
  std::printf(
      "attention-check %-44s %-4s rel %.3e  max|d| %.3e at (%zu, %zu) got %.6g want %.6g"
      "  non-finite %zu\n",
      label.c_str(), tensor, rel, num, at / static_cast<std::size_t>(cols),
      at % static_cast<std::size_t>(cols), got.empty() ? 0.0 : got[at],
      want.empty() ? 0.0 : want[at], bad);
  std::fflush(stdout);
  return rel;
}

/// Compares the five tensors; returns the largest relative error.
double compare_all(const std::string& label, const attn_case& c, const attn_io& got,
                   const attn_io& want) {
  const index_t qc = c.shape.heads * c.shape.head_dim, kc = c.shape.kv_heads * c.shape.head_dim;
  // lse: the difference is absolute-ish (lse ~ log of the key count); normalise by max |lse|
  double worst = 0;
  worst = std::max(worst, compare(label, "O", got.o, want.o, qc));
  worst = std::max(worst, compare(label, "lse", got.lse, want.lse, c.shape.heads));
  worst = std::max(worst, compare(label, "dQ", got.dq, want.dq, qc));
  worst = std::max(worst, compare(label, "dK", got.dk, want.dk, kc));
  worst = std::max(worst, compare(label, "dV", got.dv, want.dv, kc));
  return worst;
}

attn_case make_case(std::string name, attention_shape shape, index_t nq, index_t nk, index_t q0,
                    index_t valid, index_t window = 0) {
  attn_case c;
  c.name = std::move(name);
  c.shape = shape;
  c.nq = nq;
  c.nk = nk;
  c.q0 = q0;
  c.valid = valid;
  c.window = window;
  return c;
}

/// doc_start of positions [0, n) for documents starting at `starts` (starts[0] == 0).
std::vector<index_t> docs(index_t n, std::vector<index_t> starts) {
  std::vector<index_t> d(static_cast<std::size_t>(n));
  std::size_t s = 0;
  for (index_t p = 0; p < n; ++p) {
    while (s + 1 < starts.size() && starts[s + 1] <= p) ++s;
    d[static_cast<std::size_t>(p)] = starts[s];
  }
  return d;
}

std::vector<attn_case> feature_cases() {
  std::vector<attn_case> cs;
  cs.push_back(make_case("causal hd64 GQA 4/2 T=200", {4, 2, 64}, 200, 200, 0, 200));
  cs.push_back(
      make_case("causal hd128 8/2 q0=34 pad (StreamBP chunk)", {8, 2, 128}, 96, 130, 34, 129));
  cs.push_back(make_case("last chunk hd128 4/1 q0=448 nq=64", {4, 1, 128}, 64, 512, 448, 512));
  cs.push_back(make_case("one query row hd64 q0=150", {4, 4, 64}, 1, 151, 150, 151));
  cs.push_back(make_case("window 16 + padding 100/160 hd64", {4, 2, 64}, 160, 160, 0, 100, 16));
  {
    attn_case c = make_case("documents (packing) hd128 4/2", {4, 2, 128}, 200, 200, 0, 200);
    c.doc = docs(200, {0, 37, 38, 100, 171});
    cs.push_back(c);
  }
  {
    attn_case c = make_case("documents + window 40, q0=60 hd64", {4, 2, 64}, 140, 200, 60, 195, 40);
    c.doc = docs(200, {0, 90, 91, 150});
    cs.push_back(c);
  }
  {
    attn_case c = make_case("soft-capping 5 hd64 (scores up to ~70)", {4, 2, 64}, 130, 130, 0, 130);
    c.softcap = 5;
    c.range = 3;
    cs.push_back(c);
  }
  {
    attn_case c = make_case("key blocks merged, window 50, pad 190, hd128", {4, 2, 128}, 200, 200,
                            0, 190, 50);
    c.cuts = {0, 64, 65, 130, 200};
    cs.push_back(c);
  }
  {
    attn_case c = make_case("key blocks + q0=70 (rows with no key in a block)", {4, 1, 64}, 130,
                            200, 70, 200);
    c.cuts = {0, 100, 200};
    cs.push_back(c);
  }
  cs.push_back(make_case("long causal hd128 4/1 T=512", {4, 1, 128}, 512, 512, 0, 512));
  return cs;
}

/// The tensor-core kernels' schedules (cuda_attention_mma.cuh) replayed on the host at tile
/// granularity in double, without fragments: the same query and key tiles, the same tile
/// classification (tile_full over row_keys, int32 bounds in the dK/dV kernel), the dK/dV
/// kernel's (head, query tile) pairs, the online softmax in log2 units with its -inf rule, and
/// the zero-filled rows past a tile's end, all through the headers' own helpers. Against the
/// reference it checks the schedules' index logic, not the hardware or the fragments.
attn_io replay_mma(const attn_case& c, const attn_inputs& in, bool deterministic) {
  namespace ck = detail::cuda_k;
  namespace mk = detail::cuda_k::mma;
  const index_t H = c.shape.heads, hd = c.shape.head_dim, qc = H * hd;
  const index_t kc = c.shape.kv_heads * hd, group = H / c.shape.kv_heads;
  const double scale = scale_of(c), log2e = 1.4426950408889634, ln2 = 0.6931471805599453;
  auto score2 = [&](double qk) {
    const double x = scale * qk;
    return (c.softcap > 0 ? c.softcap * std::tanh(x / c.softcap) : x) * log2e;
  };
  auto dot = [&](const std::vector<double>& a, index_t ra, index_t ca, index_t sa,
                 const std::vector<double>& b, index_t rb, index_t cb, index_t sb) {
    double acc = 0;
    for (index_t d = 0; d < hd; ++d)
      acc += a[static_cast<std::size_t>(ra * sa + ca + d)] *
             b[static_cast<std::size_t>(rb * sb + cb + d)];
    return acc;
  };
  attn_io r{std::vector<double>(static_cast<std::size_t>(c.nq * qc)),
            std::vector<double>(static_cast<std::size_t>(c.nq * H), -INFINITY),
            std::vector<double>(static_cast<std::size_t>(c.nq * qc)),
            std::vector<double>(static_cast<std::size_t>(c.nk * kc)),
            std::vector<double>(static_cast<std::size_t>(c.nk * kc))};
  std::vector<index_t> cuts = c.cuts.empty() ? std::vector<index_t>{0, c.nk} : c.cuts;
  const bool blocks = cuts.size() > 2;
  auto args = [&](std::size_t b) {
    ck::attn_args a;
    a.nq = c.nq;
    a.q0 = c.q0;
    a.k0 = blocks ? cuts[b] : 0;
    a.nk = cuts[b + 1] - cuts[b];
    a.kmax = std::min(blocks ? c.nk : a.k0 + a.nk, c.valid);
    a.window = c.window;
    a.doc = c.doc.empty() ? nullptr : c.doc.data();
    a.heads = H;
    a.group = group;
    a.hd = hd;
    a.scale = static_cast<float>(scale);
    a.softcap = static_cast<float>(c.softcap);
    return a;
  };
  // forward per key block (fwd_kernel's loops), merged by log-sum-exp
  for (std::size_t b = 0; b + 1 < cuts.size(); ++b) {
    const ck::attn_args a = args(b);
    const index_t kb = cuts[b];  // K/V row j of the block is row kb + j of the case
    for (index_t i0 = 0; i0 < a.nq; i0 += mk::br)
      for (index_t h = 0; h < H; ++h) {
        const index_t ilast = std::min(i0 + mk::br, a.nq) - 1;
        const index_t kbegin = ck::attn_local_begin(a, i0), kend = ck::attn_local_end(a, ilast);
        index_t lo_max, hi_min, unused;
        mk::row_keys(a, ilast, lo_max, unused);
        mk::row_keys(a, i0, unused, hi_min);
        if (i0 + mk::br > a.nq) lo_max = mk::none_lo;
        for (index_t i = i0; i < std::min(i0 + mk::br, a.nq); ++i) {
          index_t lo, hi;
          mk::row_keys(a, i, lo, hi);
          double m = -INFINITY, l = 0;
          std::vector<double> acc(static_cast<std::size_t>(hd));
          for (index_t j0 = kbegin; j0 < kend; j0 += mk::bc) {
            const bool full = mk::tile_full(j0, lo_max, hi_min);
            std::vector<double> s(mk::bc, -INFINITY);
            double mt = -INFINITY;
            for (index_t cc = 0; cc < mk::bc; ++cc) {
              const index_t j = j0 + cc;
              if (!(full || (j >= lo && j <= hi))) continue;
              // rows at or past kend are zero-filled in shared memory
              s[static_cast<std::size_t>(cc)] =
                  j < kend ? score2(dot(in.q, i, h * hd, qc, in.k, kb + j, (h / group) * hd, kc))
                           : score2(0);
              mt = std::max(mt, s[static_cast<std::size_t>(cc)]);
            }
            const double mnew = std::max(m, mt), mu = mnew == -INFINITY ? 0 : mnew;
            const double alpha = std::exp2(m - mu);
            l *= alpha;
            for (auto& x : acc) x *= alpha;
            for (index_t cc = 0; cc < mk::bc; ++cc) {
              const double p = std::exp2(s[static_cast<std::size_t>(cc)] - mu);
              l += p;
              const index_t j = j0 + cc;
              if (p != 0 && j < kend)
                for (index_t d = 0; d < hd; ++d)
                  acc[static_cast<std::size_t>(d)] +=
                      p * in.v[static_cast<std::size_t>((kb + j) * kc + (h / group) * hd + d)];
            }
            m = mnew;
          }
          const double lb = l > 0 ? m * ln2 + std::log(l) : -INFINITY;
          double& lr = r.lse[static_cast<std::size_t>(i * H + h)];
          double* orow = r.o.data() + i * qc + h * hd;
          if (lb == -INFINITY) continue;  // this block adds nothing (merge_attention_blocks)
          const double mm = std::max(lr, lb), wa = lr == -INFINITY ? 0 : std::exp(lr - mm);
          const double wb = std::exp(lb - mm), sum = wa + wb;
          for (index_t d = 0; d < hd; ++d)
            orow[d] = (wa * orow[d] + wb * acc[static_cast<std::size_t>(d)] / l) / sum;
          lr = mm + std::log(sum);
        }
      }
  }
  // D = rowsum(dO * O)
  std::vector<double> dvec(static_cast<std::size_t>(c.nq * H));
  for (index_t i = 0; i < c.nq; ++i)
    for (index_t h = 0; h < H; ++h)
      dvec[static_cast<std::size_t>(i * H + h)] = dot(in.dout, i, h * hd, qc, r.o, i, h * hd, qc);
  // backward per key block: dkdv_kernel's pairs (dK, dV, and dQ as its atomics add it)
  for (std::size_t b = 0; b + 1 < cuts.size(); ++b) {
    const ck::attn_args a = args(b);
    const index_t kb = cuts[b], kloc = ck::attn_local_keys(a);
    for (index_t j0 = 0; j0 < kloc; j0 += mk::bc)
      for (index_t g = 0; g < c.shape.kv_heads; ++g) {
        const index_t jlastpos = a.k0 + std::min(j0 + mk::bc, kloc) - 1;
        const index_t ifirst = std::max<index_t>(a.k0 + j0 - a.q0, 0);
        auto sees = [&](index_t i0) {
          return i0 < a.nq && ck::attn_first(a, a.q0 + i0) <= jlastpos;
        };
        const index_t hend = (g + 1) * group;
        index_t h = sees(ifirst) ? g * group : hend, i0 = ifirst;
        while (h < hend) {
          std::vector<std::int32_t> lo(mk::br), hi(mk::br);
          for (index_t rr = 0; rr < mk::br; ++rr) {
            index_t l64, h64;
            mk::row_keys(a, i0 + rr, l64, h64);  // saturated to int32 as the kernel stores them
            lo[static_cast<std::size_t>(rr)] =
                static_cast<std::int32_t>(std::min<index_t>(l64, INT32_MAX));
            hi[static_cast<std::size_t>(rr)] =
                static_cast<std::int32_t>(std::max<index_t>(h64, INT32_MIN));
          }
          const bool full = mk::tile_full(j0, lo[mk::br - 1], hi[0]);
          for (index_t jj = 0; jj < mk::bc; ++jj)
            for (index_t rr = 0; rr < mk::br; ++rr) {
              const index_t j = j0 + jj, i = i0 + rr;
              if (!(full || (j >= lo[static_cast<std::size_t>(rr)] &&
                             j <= hi[static_cast<std::size_t>(rr)])))
                continue;
              if (i >= a.nq) throw std::logic_error("replay: a row past nq is visible");
              const bool key = j < kloc;  // zero-filled past kloc
              const double x =
                  key ? score2(dot(in.q, i, h * hd, qc, in.k, kb + j, g * hd, kc)) : score2(0);
              const double l0 = r.lse[static_cast<std::size_t>(i * H + h)];
              const double p = std::exp2(x - (l0 == -INFINITY ? INFINITY : l0 * log2e));
              const double dp = key ? dot(in.dout, i, h * hd, qc, in.v, kb + j, g * hd, kc) : 0;
              double ds = p * (dp - dvec[static_cast<std::size_t>(i * H + h)]);
              if (c.softcap > 0) {
                const double u = x * ln2 / c.softcap;
                ds *= 1 - u * u;
              }
              if (!key) continue;  // never written (j >= kloc)
              for (index_t d = 0; d < hd; ++d) {
                const auto qi = static_cast<std::size_t>(i * qc + h * hd + d);
                const auto kj = static_cast<std::size_t>((kb + j) * kc + g * hd + d);
                r.dv[kj] += p * in.dout[qi];
                r.dk[kj] += scale * ds * in.q[qi];
                if (!deterministic) r.dq[qi] += scale * ds * in.k[kj];  // the atomic dQ
              }
            }
          index_t hn = h, in0 = i0 + mk::br;
          if (!sees(in0)) {
            ++hn;
            in0 = ifirst;
          }
          h = hn;
          i0 = in0;
        }
      }
    if (!deterministic) continue;
    // dq_kernel's loops: a query tile and head over its key tiles [kbegin, kend)
    for (index_t i0 = 0; i0 < a.nq; i0 += mk::br)
      for (index_t h = 0; h < H; ++h) {
        const index_t ilast = std::min(i0 + mk::br, a.nq) - 1;
        const index_t kbegin = ck::attn_local_begin(a, i0), kend = ck::attn_local_end(a, ilast);
        index_t lo_max, hi_min, unused;
        mk::row_keys(a, ilast, lo_max, unused);
        mk::row_keys(a, i0, unused, hi_min);
        if (i0 + mk::br > a.nq) lo_max = mk::none_lo;
        for (index_t i = i0; i < std::min(i0 + mk::br, a.nq); ++i) {
          index_t lo, hi;
          mk::row_keys(a, i, lo, hi);
          const double l0 = r.lse[static_cast<std::size_t>(i * H + h)];
          for (index_t j0 = kbegin; j0 < kend; j0 += mk::bc) {
            const bool full = mk::tile_full(j0, lo_max, hi_min);
            for (index_t j = j0; j < j0 + mk::bc; ++j) {
              if (!(full || (j >= lo && j <= hi)) || j >= kend) continue;  // zero K past kend
              const index_t g = h / group;
              const double x = score2(dot(in.q, i, h * hd, qc, in.k, kb + j, g * hd, kc));
              const double p = std::exp2(x - (l0 == -INFINITY ? INFINITY : l0 * log2e));
              const double dp = dot(in.dout, i, h * hd, qc, in.v, kb + j, g * hd, kc);
              double ds = p * (dp - dvec[static_cast<std::size_t>(i * H + h)]);
              if (c.softcap > 0) {
                const double u = x * ln2 / c.softcap;
                ds *= 1 - u * u;
              }
              for (index_t d = 0; d < hd; ++d)
                r.dq[static_cast<std::size_t>(i * qc + h * hd + d)] +=
                    scale * ds * in.k[static_cast<std::size_t>((kb + j) * kc + g * hd + d)];
            }
          }
        }
      }
  }
  return r;
}

/// Random geometries for the host replay (head_dim 16: the schedules do not depend on it):
/// query chunks at random q0 with keys past them or short of them, padding, windows up to 260
/// (past two key tiles: full tiles whose rows' first keys are clamped at 0), packed documents,
/// key blocks, soft-capping, GQA; tile edges fall everywhere.
std::vector<attn_case> random_cases(int n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto u = [&](index_t lo, index_t hi) {
    return std::uniform_int_distribution<index_t>(lo, hi)(gen);
  };
  std::vector<attn_case> cs;
  for (int k = 0; k < n; ++k) {
    const index_t kv = u(1, 2), heads = kv * u(1, 2);
    // near tile multiples (64) half of the time: tiles full up to one row or key
    const index_t nq = std::max<index_t>(1, u(0, 1) ? u(1, 200) : 64 * u(1, 3) + u(-3, 3));
    const index_t q0 =
        u(0, 3) == 0 ? 0 : std::max<index_t>(0, u(0, 1) ? u(1, 150) : 64 * u(0, 2) + u(-3, 3));
    const index_t nk = std::max<index_t>(1, q0 + nq + (u(0, 2) == 0 ? u(-20, 60) : 0));
    const index_t valid = u(0, 2) == 0 ? u(1, nk) : nk;
    attn_case c = make_case("random #" + std::to_string(k), {heads, kv, 16}, nq, nk, q0, valid,
                            u(0, 2) == 0 ? u(1, 260) : 0);
    if (u(0, 3) == 0) {
      std::vector<index_t> starts{0};
      if (q0 + nq > 1)
        for (index_t d = u(1, 4); d > 0; --d) starts.push_back(u(1, q0 + nq - 1));
      std::sort(starts.begin(), starts.end());
      starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
      c.doc = docs(q0 + nq, starts);
    }
    if (u(0, 4) == 0) c.softcap = 3;
    if (u(0, 3) == 0 && nk > 2) {
      c.cuts = {0, nk};
      for (index_t d = u(1, 3); d > 0; --d) c.cuts.push_back(u(1, nk - 1));
      std::sort(c.cuts.begin(), c.cuts.end());
      c.cuts.erase(std::unique(c.cuts.begin(), c.cuts.end()), c.cuts.end());
    }
    c.name += " (nq " + std::to_string(nq) + ", q0 " + std::to_string(q0) + ", nk " +
              std::to_string(nk) + ", valid " + std::to_string(valid) + ", window " +
              std::to_string(c.window) + ", docs " + std::to_string(!c.doc.empty()) + ", blocks " +
              std::to_string(c.cuts.empty() ? 1 : c.cuts.size() - 1) + ")";
    cs.push_back(std::move(c));
  }
  return cs;
}

}  // namespace

TEST_SUITE("cuda_host") {
  TEST_CASE("the tensor-core kernels' schedules, replayed on the host, at random geometries") {
    // 600 random calls (tile edges everywhere, see random_cases) replayed in double against
    // reference_backend<double> to 1e-9; only failures print
    int failures = 0;
    for (const auto& c : random_cases(600, 30)) {
      const auto in = inputs_of(c);
      const auto want = reference(c, in);
      for (bool det : {false, true}) {
        const auto got = replay_mma(c, in, det);
        double worst = 0;
        for (auto [g, w] : {std::pair{&got.o, &want.o}, std::pair{&got.lse, &want.lse},
                            std::pair{&got.dq, &want.dq}, std::pair{&got.dk, &want.dk},
                            std::pair{&got.dv, &want.dv}}) {
          double num = 0, den = 1e-30;
          for (std::size_t i = 0; i < g->size(); ++i) {
            num = std::max(num, std::abs((*g)[i] - (*w)[i]));
            den = std::max(den, std::abs((*w)[i]));
          }
          worst = std::max(worst, std::isfinite(num) ? num / den : INFINITY);
        }
        if (!(worst < 1e-9)) {
          ++failures;
          compare_all(c.name + (det ? " | replay det" : " | replay"), c, got, want);
        }
      }
    }
    CHECK(failures == 0);
  }

  TEST_CASE("the tensor-core kernels' schedules, replayed on the host, equal the reference") {
    // every feature case: the same tiles, masks and pairs as the kernels (replay_mma), in
    // double, against reference_backend<double> to 1e-9
    for (const auto& c : feature_cases()) {
      CAPTURE(c.name);
      const auto in = inputs_of(c);
      const auto want = reference(c, in);
      for (bool det : {false, true}) {
        CAPTURE(det);
        const auto got = replay_mma(c, in, det);
        CHECK(compare_all(c.name + (det ? " | host replay, deterministic dQ" : " | host replay"), c,
                          got, want) < 1e-9);
      }
    }
  }
}

TEST_SUITE("gpu") {
  TEST_CASE("attention engines feature by feature against the reference (bf16, fp32 lse)") {
    if (!have_gpu()) return;
    struct engine {
      const char* name;
      attention_engine e;
      bool det;
      double tol;
    };
    // bf16 inputs and outputs; the tensor-core kernels also round P and dS to bf16 as mma
    // operands (FlashAttention does the same): 2e-2 of the largest value per tensor
    const engine engines[] = {{"cuda_cores", attention_engine::cuda_cores, true, 2e-2},
                              {"tensor_cores", attention_engine::tensor_cores, false, 2e-2},
                              {"tensor_cores det", attention_engine::tensor_cores, true, 2e-2}};
    for (const auto& c : feature_cases()) {
      CAPTURE(c.name);
      const auto in = inputs_of(c);
      const auto want = reference(c, in);
      attn_io cc_out;
      for (const auto& eng : engines) {
        CAPTURE(eng.name);
        // a crash (a kernel fault ends the process) leaves this line as the last one printed
        std::printf("attention-check start %s | %s\n", c.name.c_str(), eng.name);
        std::fflush(stdout);
        cuda_backend<bf16> cb(cuda_backend_options{0, false, eng.det, eng.e});
        const auto got = run_device(c, in, cb);
        const double err = compare_all(c.name + " | " + eng.name, c, got, want);
        CHECK(err < eng.tol);
        const std::size_t calls = c.cuts.empty() ? 2 : 2 * (c.cuts.size() - 1);
        CHECK(cb.tensor_core_attention_calls() ==
              static_cast<std::int64_t>(eng.e == attention_engine::tensor_cores ? calls : 0));
        if (eng.e == attention_engine::cuda_cores)
          cc_out = got;
        else  // informative: the two engines against each other
          compare_all(c.name + " | " + eng.name + " vs cuda_cores", c, got, cc_out);
      }
    }
  }

  TEST_CASE("tensor-core attention: deterministic reruns, +=, a bf16 lse, forced refusals") {
    if (!have_gpu()) return;
    const auto cases = feature_cases();
    const attn_case& c = cases[1];  // StreamBP chunk, hd 128, GQA
    const auto in = inputs_of(c);
    const auto want = reference(c, in);
    {
      cuda_backend<bf16> cb(cuda_backend_options{0, false, true, attention_engine::tensor_cores});
      const auto a = run_device(c, in, cb), b = run_device(c, in, cb);
      CHECK(a.dq == b.dq);  // bit-identical
      CHECK(a.dk == b.dk);
      CHECK(a.dv == b.dv);
      CHECK(a.o == b.o);
    }
    {  // two backward calls accumulate twice the gradient
      cuda_backend<bf16> cb(cuda_backend_options{0, false, false, attention_engine::tensor_cores});
      auto twice = want;
      for (auto* t : {&twice.dq, &twice.dk, &twice.dv})
        for (auto& x : *t) x *= 2;
      CHECK(compare_all(c.name + " | tensor_cores, backward twice", c, run_device(c, in, cb, 2),
                        twice) < 2e-2);
    }
    {  // a bf16 lse: the backward recomputes an fp32 lse on tensor cores (LseOnly forward)
      cuda_backend<bf16> cb(cuda_backend_options{0, false, false, attention_engine::tensor_cores});
      const auto got = run_device<bf16>(c, in, cb);
      auto w = want;
      for (auto& x : w.lse) x = bf(x);
      CHECK(compare_all(c.name + " | tensor_cores, bf16 lse", c, got, w) < 2e-2);
    }
    {  // forced on a call it cannot run: throws; automatic falls back to the CUDA cores
      attn_case c96 = c;
      c96.shape.head_dim = 96;
      c96.name = "hd96 (not instantiated: CUDA-core fallback)";
      const auto in96 = inputs_of(c96);
      cuda_backend<bf16> forced(
          cuda_backend_options{0, false, false, attention_engine::tensor_cores});
      CHECK_THROWS_WITH_AS(run_device(c96, in96, forced), doctest::Contains("head_dim"),
                           tightfit::error);
      cuda_backend<bf16> automatic(
          cuda_backend_options{0, false, false, attention_engine::automatic});
      const auto got = run_device(c96, in96, automatic);
      CHECK(compare_all(c96.name + " | automatic", c96, got, reference(c96, in96)) < 2e-2);
      CHECK(automatic.tensor_core_attention_calls() == 0);
    }
  }
}
