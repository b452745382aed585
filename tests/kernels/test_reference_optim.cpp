// Tests of reference_backend<double> optimizer updates against loops written in the test from
// torch.optim.Adam / AdamW / SGD (torch 1.13 single-tensor code paths), over several steps.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "reference_testing.hpp"
#include "tightfit/backend/reference.hpp"

using namespace tightfit;
using namespace tightfit::testing;

namespace {

/// torch.optim.Adam (weight_decay as L2) or AdamW (decoupled), one step, written from torch's
/// _single_tensor_adam / _single_tensor_adamw.
struct torch_adam {
  double lr, beta1, beta2, eps, weight_decay;
  bool adamw;
  std::vector<double> exp_avg, exp_avg_sq;
  int step = 0;

  void update(std::vector<double>& param, const std::vector<double>& grad) {
    if (exp_avg.empty()) {
      exp_avg.assign(param.size(), 0.0);
      exp_avg_sq.assign(param.size(), 0.0);
    }
    ++step;
    for (std::size_t i = 0; i < param.size(); ++i) {
      double g = grad[i];
      if (adamw)
        param[i] *= 1 - lr * weight_decay;  // param.mul_(1 - lr * weight_decay)
      else if (weight_decay != 0)
        g += weight_decay * param[i];  // grad = grad.add(param, alpha=weight_decay)
      exp_avg[i] = exp_avg[i] * beta1 + g * (1 - beta1);
      exp_avg_sq[i] = exp_avg_sq[i] * beta2 + (1 - beta2) * g * g;
      const double bias_correction1 = 1 - std::pow(beta1, step);
      const double bias_correction2 = 1 - std::pow(beta2, step);
      const double step_size = lr / bias_correction1;
      const double denom = std::sqrt(exp_avg_sq[i]) / std::sqrt(bias_correction2) + eps;
      param[i] += -step_size * exp_avg[i] / denom;
    }
  }
};

/// torch.optim.SGD (dampening 0, no nesterov); with use_sign the gradient (after weight decay)
/// is replaced by its sign before momentum.
struct torch_sgd {
  double lr, momentum, weight_decay;
  bool use_sign;
  std::vector<double> buf;  // momentum_buffer; empty until the first step

  void update(std::vector<double>& param, const std::vector<double>& grad) {
    std::vector<double> d_p(param.size());
    for (std::size_t i = 0; i < param.size(); ++i) {
      d_p[i] = grad[i] + weight_decay * param[i];
      if (use_sign) d_p[i] = d_p[i] > 0 ? 1.0 : (d_p[i] < 0 ? -1.0 : 0.0);
    }
    if (momentum != 0) {
      if (buf.empty()) {
        buf = d_p;  // torch.clone(d_p).detach()
      } else {
        for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = buf[i] * momentum + d_p[i];
      }
      d_p = buf;
    }
    for (std::size_t i = 0; i < param.size(); ++i) param[i] += -lr * d_p[i];
  }
};

}  // namespace

TEST_CASE("adam and adamw match torch's update over several steps") {
  reference_backend<double> be;
  const index_t n = 17;
  for (bool decoupled : {false, true})
    for (double wd : {0.0, 0.1}) {
      CAPTURE(decoupled);
      CAPTURE(wd);
      std::vector<double> p = uniform<double>(n, 70), p_ref = p;
      std::vector<double> m(static_cast<std::size_t>(n)), v(static_cast<std::size_t>(n));
      torch_adam ref{2e-2, 0.85, 0.99, 1e-8, wd, decoupled, {}, {}};
      adam_hyper<double> h;
      h.lr = 2e-2;
      h.beta1 = 0.85;
      h.beta2 = 0.99;
      h.eps = 1e-8;
      h.weight_decay = wd;
      h.decoupled = decoupled;
      for (int step = 1; step <= 4; ++step) {
        const std::vector<double> g = uniform<double>(n, 71 + static_cast<std::uint64_t>(step));
        h.step = step;
        be.adam_update(std::span(p), std::span<const double>(g), std::span(m), std::span(v), h);
        ref.update(p_ref, g);
        CHECK(max_rel_diff(p, p_ref) < 1e-14);
        CHECK(max_rel_diff(m, ref.exp_avg) < 1e-14);
        CHECK(max_rel_diff(v, ref.exp_avg_sq) < 1e-14);
      }
    }
}

TEST_CASE("adam's first step moves every parameter by about lr against the gradient") {
  reference_backend<double> be;
  std::vector<double> p = uniform<double>(8, 75), g = uniform<double>(8, 76);
  const std::vector<double> p0 = p;
  std::vector<double> m(8), v(8);
  adam_hyper<double> h;
  h.lr = 1e-3;
  h.eps = 1e-12;
  be.adam_update(std::span(p), std::span<const double>(g), std::span(m), std::span(v), h);
  for (std::size_t i = 0; i < p.size(); ++i)
    CHECK(p[i] - p0[i] == doctest::Approx(g[i] > 0 ? -1e-3 : 1e-3).epsilon(1e-6));
}

TEST_CASE("sgd, momentum, weight decay and sign-SGD match torch's update") {
  reference_backend<double> be;
  const index_t n = 11;
  struct cfg {
    double momentum, wd;
    bool sign;
  };
  for (const cfg c : {cfg{0, 0, false}, cfg{0.9, 0, false}, cfg{0.9, 0.05, false},
                      cfg{0, 0.05, true}, cfg{0.8, 0.01, true}}) {
    CAPTURE(c.momentum);
    CAPTURE(c.wd);
    CAPTURE(c.sign);
    std::vector<double> p = uniform<double>(n, 80), p_ref = p;
    std::vector<double> buf(c.momentum != 0 ? static_cast<std::size_t>(n) : 0);
    torch_sgd ref{0.1, c.momentum, c.wd, c.sign, {}};
    sgd_hyper<double> h;
    h.lr = 0.1;
    h.momentum = c.momentum;
    h.weight_decay = c.wd;
    h.use_sign = c.sign;
    for (int step = 1; step <= 3; ++step) {
      std::vector<double> g = uniform<double>(n, 81 + static_cast<std::uint64_t>(step));
      if (step == 2) g[3] = -c.wd * p[3];  // g + wd p == 0 exactly: sign(0) == 0
      be.sgd_update(std::span(p), std::span<const double>(g), std::span(buf), h);
      ref.update(p_ref, g);
      CHECK(max_rel_diff(p, p_ref) < 1e-15);
      if (c.momentum != 0) CHECK(max_rel_diff(buf, ref.buf) < 1e-15);
    }
  }
}

TEST_CASE("optimizer updates in float follow the double ones") {
  reference_backend<float> bf;
  reference_backend<double> bd;
  const std::vector<double> pd0 = uniform<double>(9, 90), g = uniform<double>(9, 91);
  std::vector<double> pd = pd0, md(9), vd(9);
  std::vector<float> pf(pd0.begin(), pd0.end()), gf(g.begin(), g.end()), mf(9), vf(9);
  adam_hyper<double> hd;
  adam_hyper<float> hf;
  hd.weight_decay = 0.01;
  hf.weight_decay = 0.01f;
  bd.adam_update(std::span(pd), std::span<const double>(g), std::span(md), std::span(vd), hd);
  bf.adam_update(std::span(pf), std::span<const float>(gf), std::span(mf), std::span(vf), hf);
  std::vector<double> dd(9), df(9);
  for (std::size_t i = 0; i < 9; ++i) {
    dd[i] = pd[i] - pd0[i];
    df[i] = static_cast<double>(pf[i]) - static_cast<double>(static_cast<float>(pd0[i]));
  }
  CHECK(max_rel_diff(df, dd) < 1e-3);
}
