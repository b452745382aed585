// The CUDA attention engines, feature by feature, against reference_backend<double> (bf16
// storage; the float path is test_cuda.cu's):
//  - "cuda_host": the tensor-core eligibility test (detail::cuda_k::mma::refusal) and the
//    TIGHTFIT_CUDA_ATTENTION parsing, no device needed;
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

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
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

}  // namespace

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
