// The subcommands of the tightfit tool. Each returns the process exit code:
// 0 success, 1 bad input (one line on stderr naming the problem), 2 wrong arguments (usage).
#pragma once

namespace tightfit::cli {

int grad(int argc, char** argv);      // tightfit grad ...     (cmd_grad.cpp)
int logprobs(int argc, char** argv);  // tightfit logprobs ... (cmd_logprobs.cpp)
int bench(int argc, char** argv);     // tightfit bench ...   (cmd_bench.cpp)
int plan(int argc, char** argv);      // tightfit plan ...    (cmd_plan.cpp)
int measure(int argc, char** argv);   // tightfit measure ... (cmd_measure.cpp)
int train(int argc, char** argv);     // tightfit train ...   (cmd_train.cpp)
int prepare(int argc, char** argv);   // tightfit prepare ... (cmd_prepare.cpp)
int eval(int argc, char** argv);      // tightfit eval ...    (cmd_eval.cpp)

}  // namespace tightfit::cli
