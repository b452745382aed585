// tightfit/stream/head.hpp: the LM head (final RMSNorm, logits, token log-probs) run over row
// chunks, so that the (B*T, V) logits are never materialised (StreamBP's streaming head,
// docs/streambp.md). With chunk_rows >= B*T it is the materialised head of frameworks.
//
// Per chunk of rows [r0, r1): hf = RMSNorm(H rows) (n, d); z = hf W^T (n, V); lse and label
// log-probs; then, in the gradient pass, dz = coeff (onehot - softmax(z/tau)) / tau in place,
// dW += dz^T hf (beta = 1, the one (V, d) gradient buffer), dhf = dz W, and the final-norm
// backward adds into dH rows. The chunk's logits are freed before the next chunk.
// The config's architecture facts: the final norm scales by norm_offset() + w (Gemma: 1 + w,
// nn/norm_weight.hpp) and, with final_logit_softcapping = cap > 0 (Gemma 2), the logits are
// z -> cap tanh(z / cap) before the log-softmax; the backward keeps a copy of the chunk's capped
// logits (n, V) for the exact derivative dz *= 1 - (capped / cap)^2.
//
// Host synchronisation: the label log-probs stay on the backend for the whole pass and come to
// the host in one download at its end (token_logprobs, the statistics pass of a two-pass
// objective, and the gradient pass of an objective whose coefficients do not read the
// log-probs, such as SFT and DPO: coefficients_use_logprobs() == false). Only the gradient pass
// of an objective whose coefficients read them (GRPO) downloads each chunk's log-probs before
// its backward. The objective sees the same calls, in the same order, with the same values
// either way; the (B*T) log-probs held on the backend are counted in the activation peak.
// The statistics (rstd, lse, log-probs, coefficients) are accum_t<B> buffers (fp32 for a bf16
// backend).
#pragma once

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/loss/objective.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/norm_weight.hpp"

namespace tightfit {

/// How the head walks the rows.
struct head_options {
  index_t chunk_rows = 1024;  ///< rows per logits chunk; >= B*T materialises all logits
  double temperature = 1.0;   ///< tau: log-probs of softmax(z / tau)
};

namespace detail {

/// True when objective O declares that coefficients() writes coeff without reading the
/// log-probs (they only enter the returned loss part) and is free of side effects, so that the
/// head may call it before the log-probs reach the host, and again once they have.
template <class O>
constexpr bool logprob_free_coefficients() {
  if constexpr (requires { O::coefficients_use_logprobs(); })
    return !O::coefficients_use_logprobs();
  else
    return false;
}

/// The row chunks [r0, r1) of the head, in order.
template <class F>
void for_each_chunk(index_t rows, index_t chunk_rows, F&& f) {
  for (index_t r0 = 0; r0 < rows; r0 += chunk_rows) f(r0, std::min(rows, r0 + chunk_rows));
}

/// The log-probs of `rows` (backend memory, accum_t) on the host in double: one download.
template <class B>
std::vector<double> download_logprobs(B& be, std::span<const accum_t<B>> lp) {
  std::vector<accum_t<B>> host(lp.size());
  be.download(lp, std::span<accum_t<B>>(host));
  return std::vector<double>(host.begin(), host.end());
}

/// Runs the head over row chunks: for each chunk, visit(r0, r1, logits (n,V), hf (n,d),
/// rstd (n), lse (n), lp (n, backend memory)); rstd, lse and lp are accum_t. Logits hold z on
/// entry to visit. lp_rows: the (B*T) backend buffer that receives every chunk's log-probs (lp
/// is its rows [r0, r1)); empty: each chunk allocates its own, freed after visit.
template <DecoderModel M, class Visit>
void head_chunks(M& model, matrix_view<const storage_t<typename M::backend_type>> hidden,
                 const token_layout& layout, const head_options& opt,
                 std::span<accum_t<typename M::backend_type>> lp_rows, Visit&& visit) {
  using B = typename M::backend_type;
  using T = storage_t<B>;
  using A = accum_t<B>;
  B& be = model.backend();
  const auto& cfg = model.config();
  const index_t d = cfg.hidden_size, v = cfg.vocab_size, rows = layout.rows();
  check_extent("lm_head", "hidden rows", hidden.rows, rows);
  check_extent("lm_head", "hidden cols", hidden.cols, d);
  check(opt.chunk_rows >= 1, "lm_head: chunk_rows is ", opt.chunk_rows, ", expected >= 1");
  check(opt.temperature > 0, "lm_head: temperature is ", opt.temperature, ", expected > 0");
  auto& params = model.parameters();
  const auto w = as_matrix(std::span<const T>(params.value(model.lm_head_id())), v, d);
  const norm_scale<B> g(be, params.value(model.final_norm_id()), cfg.norm_offset());
  const double cap = cfg.final_logit_softcapping;
  if constexpr (!GemmaBackend<B>)
    check(cap == 0, "lm_head: final_logit_softcapping ", cap,
          " needs a backend with logit_softcap_forward (GemmaBackend)");
  if (!lp_rows.empty())
    check_extent("lm_head", "log-prob rows", static_cast<index_t>(lp_rows.size()), rows);
  for (index_t r0 = 0; r0 < rows; r0 += opt.chunk_rows) {
    const index_t r1 = std::min(rows, r0 + opt.chunk_rows), n = r1 - r0;
    auto hf = be.template allocate<T>(n * d);  // (n, d)
    auto rstd = be.template allocate<A>(n);    // (n)
    be.rmsnorm_forward(hidden.row_range(r0, r1), g.scale(), A(cfg.rms_norm_eps), hf.view(n, d),
                       rstd.span());
    auto logits = be.template allocate<T>(n * v);  // (n, V)
    be.gemm(transpose::no, transpose::yes, A(1), hf.view(n, d), w, A(0), logits.view(n, v));
    if constexpr (GemmaBackend<B>)
      if (cap > 0) be.logit_softcap_forward(logits.view(n, v), A(cap));
    auto lse = be.template allocate<A>(n);                                      // (n)
    auto own = lp_rows.empty() ? be.template allocate<A>(n) : decltype(lse){};  // (n)
    const std::span<A> lp = lp_rows.empty() ? own.span()
                                            : lp_rows.subspan(static_cast<std::size_t>(r0),
                                                              static_cast<std::size_t>(n));
    const auto targets =
        layout.targets.subspan(static_cast<std::size_t>(r0), static_cast<std::size_t>(n));
    be.xent_forward(logits.view(n, v), targets, A(opt.temperature), lse.span(), lp);
    visit(r0, r1, logits, hf, rstd, lse, std::span<const A>(lp));
  }
}

}  // namespace detail

/// Forward-only per-token label log-probs (B*T; 0 where the target is ignored), with the same
/// streaming memory bound as the gradient pass.
template <DecoderModel M>
std::vector<double> token_logprobs(M& model,
                                   matrix_view<const storage_t<typename M::backend_type>> hidden,
                                   const token_layout& layout, const head_options& opt) {
  using B = typename M::backend_type;
  using A = accum_t<B>;
  B& be = model.backend();
  auto lp = be.template allocate<A>(layout.rows());  // (B*T) log-probs, one download
  detail::head_chunks(model, hidden, layout, opt, lp.span(),
                      [](index_t, index_t, auto&, auto&, auto&, auto&, auto) {});
  return detail::download_logprobs(be, std::span<const A>(lp.span()));
}

/// The head's gradient pass (after the objective's statistics pass when it has one).
/// dhidden (B*T, d): the final-norm backward ADDS into it (empty view: not needed).
/// weight_grads: accumulate into the gradients of lm_head (or the tied embedding) and the
/// final norm, which must be allocated. Returns the loss; statistics_seconds (optional)
/// receives the wall time of the objective's statistics pass.
template <DecoderModel M, Objective O>
double lm_head_backward(M& model, matrix_view<const storage_t<typename M::backend_type>> hidden,
                        const token_layout& layout, O& objective, const head_options& opt,
                        matrix_view<storage_t<typename M::backend_type>> dhidden, bool weight_grads,
                        double* statistics_seconds = nullptr) {
  using B = typename M::backend_type;
  using T = storage_t<B>;
  using A = accum_t<B>;
  B& be = model.backend();
  const auto& cfg = model.config();
  const index_t d = cfg.hidden_size, v = cfg.vocab_size;
  auto& params = model.parameters();
  objective.begin(layout);
  if (objective.statistics_pass()) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<double> lpd;
    {
      auto lp = be.template allocate<A>(layout.rows());  // (B*T) log-probs, one download
      detail::head_chunks(model, hidden, layout, opt, lp.span(),
                          [](index_t, index_t, auto&, auto&, auto&, auto&, auto) {});
      lpd = detail::download_logprobs(be, std::span<const A>(lp.span()));
    }
    detail::for_each_chunk(layout.rows(), opt.chunk_rows, [&](index_t r0, index_t r1) {
      objective.statistics(layout, r0,
                           std::span<const double>(lpd).subspan(static_cast<std::size_t>(r0),
                                                                static_cast<std::size_t>(r1 - r0)));
    });
    objective.end_statistics(layout);
    if (statistics_seconds != nullptr)
      *statistics_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const bool need_dh = !dhidden.empty();
  if (need_dh) {
    check_extent("lm_head_backward", "dhidden rows", dhidden.rows, layout.rows());
    check_extent("lm_head_backward", "dhidden cols", dhidden.cols, d);
  }
  const auto w = as_matrix(std::span<const T>(params.value(model.lm_head_id())), v, d);
  const norm_scale<B> g(be, params.value(model.final_norm_id()), cfg.norm_offset());
  const double cap = cfg.final_logit_softcapping;
  // deferred: coefficients from the layout now, the loss parts once the log-probs are here
  constexpr bool deferred = detail::logprob_free_coefficients<O>();
  accum_buffer_t<B> lp_rows;  // (B*T) when deferred
  if constexpr (deferred) lp_rows = be.template allocate<A>(layout.rows());
  std::vector<double> coeff, no_lp;
  std::vector<A> coeff_t;
  double sum = 0;
  detail::head_chunks(
      model, hidden, layout, opt, lp_rows.span(),
      [&](index_t r0, index_t r1, auto& logits, auto& hf, auto& rstd, auto& lse, auto lp) {
        const index_t n = r1 - r0;
        coeff.assign(static_cast<std::size_t>(n), 0.0);
        if constexpr (deferred) {
          no_lp.assign(static_cast<std::size_t>(n), 0.0);
          (void)objective.coefficients(layout, r0, std::span<const double>(no_lp),
                                       std::span<double>(coeff));
        } else {
          const auto lpd = detail::download_logprobs(be, lp);
          sum += objective.coefficients(layout, r0, std::span<const double>(lpd),
                                        std::span<double>(coeff));
        }
        if (!need_dh && !weight_grads) return;
        coeff_t.assign(coeff.begin(), coeff.end());
        auto coeff_dev = be.template allocate<A>(n);  // (n)
        be.upload(std::span<const A>(coeff_t), coeff_dev.span());
        const auto targets =
            layout.targets.subspan(static_cast<std::size_t>(r0), static_cast<std::size_t>(n));
        std::remove_reference_t<decltype(logits)>
            capped;  // (n, V) the capped logits (soft-capping only)
        if (cap > 0) {
          capped = be.template allocate<T>(n * v);
          be.copy(logits.view(n, v), capped.view(n, v));
        }
        be.xent_backward(logits.view(n, v), targets, std::span<const A>(lse.span()),
                         std::span<const A>(coeff_dev.span()), A(opt.temperature));
        if constexpr (GemmaBackend<B>)
          if (cap > 0) {
            be.logit_softcap_backward(capped.view(n, v), logits.view(n, v), A(cap));
            capped.reset();
          }
        if (weight_grads)
          be.gemm(transpose::yes, transpose::no, A(1), logits.view(n, v), hf.view(n, d), A(1),
                  as_matrix(params.grad(model.lm_head_id()), v, d));
        auto dhf = be.template allocate<T>(n * d);  // (n, d)
        be.gemm(transpose::no, transpose::no, A(1), logits.view(n, v), w, A(0), dhf.view(n, d));
        logits.reset();
        auto scratch = need_dh ? decltype(dhf){} : be.template allocate<T>(n * d);
        auto dx = need_dh ? dhidden.row_range(r0, r1) : scratch.view(n, d);
        be.rmsnorm_backward(hidden.row_range(r0, r1), g.scale(), std::span<const A>(rstd.span()),
                            dhf.view(n, d), dx,
                            weight_grads ? params.grad(model.final_norm_id()) : std::span<T>{});
      });
  if constexpr (deferred) {
    const auto lpd = detail::download_logprobs(be, std::span<const A>(lp_rows.span()));
    lp_rows.reset();
    detail::for_each_chunk(layout.rows(), opt.chunk_rows, [&](index_t r0, index_t r1) {
      const auto n = static_cast<std::size_t>(r1 - r0);
      coeff.assign(n, 0.0);
      sum += objective.coefficients(
          layout, r0, std::span<const double>(lpd).subspan(static_cast<std::size_t>(r0), n),
          std::span<double>(coeff));
    });
  }
  return objective.finish(sum);
}

}  // namespace tightfit
