// tightfit/optim/schedule.hpp: learning-rate schedules (policies) and gradient clipping.
//
// A schedule maps the optimizer step s (0 for the first step) to a factor multiplying every
// base learning rate: constant (1), linear warmup (s+1)/W up to W then 1, and cosine (linear
// warmup, then 0.5 (1 + cos(pi p)) decayed to min_factor over the remaining steps). The
// training loop sets the factor before each step; any callable double(int64) is a schedule.
//
// clip_grad_norm scales the given gradients by min(1, max_norm / ||g||) where ||g|| is the
// global 2-norm over all of them (torch.nn.utils.clip_grad_norm_, eps 1e-6).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// A learning-rate schedule: the factor of step s (0-based).
template <class S>
concept LrSchedule = requires(const S& s, std::int64_t step) {
  { s(step) } -> std::convertible_to<double>;
};

/// Factor 1 at every step.
struct constant_schedule {
  double operator()(std::int64_t /*step*/) const { return 1.0; }
};

/// Linear warmup over `warmup` steps ((s+1)/warmup), then 1.
struct linear_warmup_schedule {
  std::int64_t warmup = 0;
  double operator()(std::int64_t s) const {
    if (warmup <= 0 || s >= warmup) return 1.0;
    return static_cast<double>(s + 1) / static_cast<double>(warmup);
  }
};

/// Linear warmup, then cosine decay from 1 to min_factor at step total_steps - 1.
struct cosine_schedule {
  std::int64_t warmup = 0;
  std::int64_t total_steps = 1;
  double min_factor = 0.0;
  double operator()(std::int64_t s) const {
    if (warmup > 0 && s < warmup) return static_cast<double>(s + 1) / static_cast<double>(warmup);
    const std::int64_t span = std::max<std::int64_t>(1, total_steps - 1 - warmup);
    const double p =
        std::clamp(static_cast<double>(s - warmup) / static_cast<double>(span), 0.0, 1.0);
    return min_factor + (1 - min_factor) * 0.5 * (1 + std::cos(std::numbers::pi * p));
  }
};

/// A schedule chosen at run time (the command-line tool): "constant", "warmup:W",
/// "cosine" or "cosine:W" (W warmup steps), over `total_steps`.
struct runtime_schedule {
  enum class kind { constant, warmup, cosine } what = kind::constant;
  std::int64_t warmup = 0;
  std::int64_t total_steps = 1;
  double min_factor = 0.0;

  static runtime_schedule parse(const std::string& spec, std::int64_t total_steps) {
    runtime_schedule r;
    r.total_steps = total_steps;
    const auto colon = spec.find(':');
    const std::string head = spec.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string tail = spec.substr(colon + 1);
      std::size_t used = 0;
      long long w = -1;
      try {
        w = std::stoll(tail, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      check(used == tail.size() && w >= 0, "schedule '", spec, "': warmup steps are '", tail,
            "', expected an integer >= 0");
      r.warmup = w;
    }
    if (head == "constant" && colon == std::string::npos)
      r.what = kind::constant;
    else if (head == "warmup")
      r.what = kind::warmup;
    else if (head == "cosine")
      r.what = kind::cosine;
    else
      fail("unknown schedule '", spec, "', expected constant, warmup:W, cosine or cosine:W");
    return r;
  }
  double operator()(std::int64_t s) const {
    switch (what) {
      case kind::constant:
        return 1.0;
      case kind::warmup:
        return linear_warmup_schedule{warmup}(s);
      case kind::cosine:
        return cosine_schedule{warmup, total_steps, min_factor}(s);
    }
    return 1.0;
  }
};

static_assert(LrSchedule<constant_schedule> && LrSchedule<cosine_schedule> &&
              LrSchedule<runtime_schedule>);

/// Global 2-norm of the gradients of parameters `ids` (those without a gradient are skipped).
template <StorageBackend B>
double grad_norm(parameter_set<B>& params, std::span<const std::size_t> ids) {
  using T = typename B::value_type;
  double sum = 0;
  std::vector<T> host;
  for (std::size_t id : ids) {
    if (!params.has_grad(id)) continue;
    auto g = params.grad(id);
    host.resize(g.size());
    params.backend().download(std::span<const T>(g), std::span<T>(host));
    for (T x : host) sum += static_cast<double>(x) * static_cast<double>(x);
  }
  return std::sqrt(sum);
}

/// Scales the gradients of `ids` so that their global norm is at most max_norm; returns the
/// norm before clipping. max_norm must be > 0.
template <DenseBackend B>
double clip_grad_norm(parameter_set<B>& params, std::span<const std::size_t> ids, double max_norm) {
  using T = typename B::value_type;
  check(max_norm > 0, "clip_grad_norm: max_norm is ", max_norm, ", expected > 0");
  const double norm = grad_norm(params, ids);
  const double factor = max_norm / (norm + 1e-6);
  if (factor < 1)
    for (std::size_t id : ids)
      if (params.has_grad(id))
        params.backend().scale(static_cast<T>(factor), as_row(params.grad(id)));
  return norm;
}

}  // namespace tightfit
