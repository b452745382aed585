// The objectives' options of the tightfit tool, shared by `grad` (one batch) and `train` (a
// run): TRL's names (--beta, --loss-type, --epsilon-low, ...), their ranges checked as argument
// errors (exit 2) before any file is read, an option of another objective refused by name, and
// the library's grpo_options / dpo_options built from them.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "args.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"

namespace tightfit::cli {

/// The objectives' options, TRL's names (their defaults depend on the objective, so the text
/// says them).
inline std::vector<option_spec> objective_options() {
  return {
      {"--beta", "B",
       "grpo: the KL term's weight (default 0); dpo: the preference temperature (default 0.1; "
       "ORPO's lambda)",
       "", "beta"},
      {"--loss-type", "NAME",
       "grpo: grpo, bnpo, dapo or dr_grpo (default grpo); dpo: sigmoid, ipo, hinge, simpo or orpo "
       "(default sigmoid; simpo and orpo need no reference)",
       "", "loss_type"},
      {"--epsilon-low", "E", "grpo: the ratio's lower clip 1 - E, E in [0, 1) (default 0.2)", "",
       "epsilon"},
      {"--epsilon-high", "E", "grpo: the ratio's upper clip 1 + E (default: --epsilon-low)", "",
       "epsilon_high"},
      {"--max-completion-length", "L",
       "grpo, dr_grpo: the constant the loss divides by (default T)", "", "max_completion_length"},
      {"--importance-sampling-level", "LEVEL",
       "grpo: token (default) or sequence (GSPO: one ratio per completion)", "",
       "importance_sampling_level"},
      {"--delta", "D", "grpo: the ratio's upper bound, D > 1 (default none)", "", "delta"},
      {"--mask-truncated-completions", "",
       "grpo: a completion whose last token is not one of --eos-token-id adds no loss", "",
       "mask_truncated_completions"},
      {"--eos-token-id", "ID[,ID...]", "grpo: the tokens that end a complete completion"},
      {"--label-smoothing", "S", "dpo: sigmoid and simpo's label smoothing in [0, 0.5] (default 0)",
       "", "label_smoothing"},
      {"--rpo-alpha", "A", "dpo: the weight of an NLL term on the chosen tokens (default 0)", "",
       "rpo_alpha"},
      {"--simpo-gamma", "G", "dpo, simpo: the target reward margin (default 0.5)", "",
       "simpo_gamma"},
  };
}

/// A comma-separated list of token ids (--eos-token-id 2 or 2,151645), each in [0, 2^31).
inline std::vector<token_id> parse_token_ids(const std::string& key, const std::string& text) {
  std::vector<token_id> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    out.push_back(static_cast<token_id>(parse_integer(key, item, 0, (1LL << 31) - 1)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

/// Every objective option of `a` checked for `objective` (sft, grpo, dpo): names, ranges, and
/// no option of another objective. Throws usage_error.
inline void check_objective_arguments(const arguments& a, const std::string& objective) {
  if (objective != "sft" && objective != "grpo" && objective != "dpo")
    throw usage_error{"--objective expects sft, grpo or dpo, got '" + objective + "'"};
  try {
    if (a.has("--loss-type")) {
      if (objective == "grpo") parse_grpo_aggregation(a.get("--loss-type"));
      if (objective == "dpo") parse_dpo_loss_type(a.get("--loss-type"));
    }
    if (a.has("--importance-sampling-level"))
      parse_importance_sampling_level(a.get("--importance-sampling-level"));
  } catch (const error& e) {
    throw usage_error{e.what()};
  }
  // an option of another objective would be silently ignored: refuse it by name
  auto only_for = [&](const std::string& which, std::initializer_list<const char*> keys) {
    for (const char* k : keys)
      if (a.has(k) && objective != which)
        throw usage_error{std::string(k) + " applies to --objective " + which + ", not " +
                          objective};
  };
  only_for("grpo", {"--epsilon-low", "--epsilon-high", "--max-completion-length",
                    "--importance-sampling-level", "--delta", "--mask-truncated-completions",
                    "--eos-token-id"});
  only_for("dpo", {"--label-smoothing", "--rpo-alpha", "--simpo-gamma"});
  if (objective == "sft" && (a.has("--loss-type") || a.has("--beta")))
    throw usage_error{std::string(a.has("--loss-type") ? "--loss-type" : "--beta") +
                      " applies to --objective grpo or dpo, not sft"};
  if (a.has("--delta")) {
    const double delta = a.real("--delta", 0.0, 0, 1e6);
    if (!(delta > 1))
      throw usage_error{"--delta is " + a.get("--delta") +
                        ", expected > 1 (the upper bound of the importance ratio)"};
  }
  if (a.has("--mask-truncated-completions") != a.has("--eos-token-id"))
    throw usage_error{a.has("--eos-token-id")
                          ? "--eos-token-id is used only with --mask-truncated-completions"
                          : "--mask-truncated-completions needs --eos-token-id ID[,ID...] "
                            "(the tokens that end a complete completion)"};
  if (a.has("--eos-token-id")) (void)parse_token_ids("--eos-token-id", a.get("--eos-token-id"));
  (void)a.real("--rpo-alpha", 0.0, 0, 1e6);
  (void)a.real("--simpo-gamma", 0.5, -1e6, 1e6);
  (void)a.integer("--max-completion-length", 0, 0, 1LL << 40);
  for (const char* k : {"--beta", "--epsilon-low", "--epsilon-high"}) (void)a.real(k, 0.0, 0, 1e6);
  (void)a.real("--label-smoothing", 0.0, 0, 0.5);
  // the objectives' own ranges, as arguments (exit 2) rather than after the model is loaded
  if (a.has("--epsilon-low") && !(a.real("--epsilon-low", 0.2, 0, 1e6) < 1))
    throw usage_error{"--epsilon-low is " + a.get("--epsilon-low") +
                      ", expected in [0, 1) (the ratio's lower clip is 1 - epsilon-low)"};
  if (objective == "dpo" && a.has("--beta") && !(a.real("--beta", 0.1, 0, 1e6) > 0))
    throw usage_error{"--beta is " + a.get("--beta") + ", expected > 0 for --objective dpo"};
}

/// GRPO's options from `a` (TRL's defaults: beta 0, epsilon 0.2, loss type grpo).
inline grpo_options grpo_options_from(const arguments& a) {
  grpo_options go;
  go.beta = a.real("--beta", 0.0, 0, 1e6);
  go.epsilon_low = a.real("--epsilon-low", 0.2, 0, 1e6);
  go.epsilon_high = a.real("--epsilon-high", go.epsilon_low, 0, 1e6);
  go.aggregation = parse_grpo_aggregation(a.get("--loss-type", "grpo"));
  go.max_completion_length = a.integer("--max-completion-length", 0, 0, 1LL << 40);
  go.level = parse_importance_sampling_level(a.get("--importance-sampling-level", "token"));
  go.delta = a.real("--delta", 0.0, 0, 1e6);
  return go;
}

/// DPO's options from `a` (TRL's defaults: beta 0.1, sigmoid).
inline dpo_options dpo_options_from(const arguments& a) {
  dpo_options d;
  d.beta = a.real("--beta", 0.1, 0, 1e6);
  d.label_smoothing = a.real("--label-smoothing", 0.0, 0, 0.5);
  d.rpo_alpha = a.real("--rpo-alpha", 0.0, 0, 1e6);
  d.simpo_gamma = a.real("--simpo-gamma", 0.5, -1e6, 1e6);
  d.loss = parse_dpo_loss_type(a.get("--loss-type", "sigmoid"));
  return d;
}

}  // namespace tightfit::cli
