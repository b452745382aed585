// The subcommands of the tightfit tool. Each returns the process exit code:
// 0 success, 1 bad input (one line on stderr naming the problem), 2 wrong arguments (usage).
// Each declares its options once (args.hpp's command_spec): its parser, its --help and
// docs/tool.md's table (`tightfit help CMD --markdown`) come from that declaration.
#pragma once

#include "args.hpp"

namespace tightfit::cli {

int grad(int argc, char** argv);      // tightfit grad ...     (cmd_grad.cpp)
int logprobs(int argc, char** argv);  // tightfit logprobs ... (cmd_logprobs.cpp)
int bench(int argc, char** argv);     // tightfit bench ...   (cmd_bench.cpp)
int plan(int argc, char** argv);      // tightfit plan ...    (cmd_plan.cpp)
int measure(int argc, char** argv);   // tightfit measure ... (cmd_measure.cpp)
int train(int argc, char** argv);     // tightfit train ...   (cmd_train.cpp)
int prepare(int argc, char** argv);   // tightfit prepare ... (cmd_prepare.cpp)
int eval(int argc, char** argv);      // tightfit eval ...    (cmd_eval.cpp)

const command_spec& grad_command();
const command_spec& logprobs_command();
const command_spec& bench_command();  // bench stream
const command_spec& plan_command();
const command_spec& measure_command();
const command_spec& train_command();
const command_spec& prepare_command();
const command_spec& eval_command();

}  // namespace tightfit::cli
