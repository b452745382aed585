#!/usr/bin/env bash
# Demo step: BAdam / BREAD optimizer state, peak memory and backward time on a small model,
# and a short copy-task convergence comparison (tables; under a minute on 2 cores).
#   bash bench/demo.d/30-optim.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: 30-optim.sh BUILD_DIR}
bin="$build/bench/optim/bench_optim"
if [ ! -x "$bin" ]; then
  echo "30-optim: $bin not built (needs Eigen), skipped"
  exit 0
fi
out="$build/demo-optim"
echo "== optim: BAdam / BREAD (bench_optim --quick, 200 steps: the block methods are still catching up; the 600-step runs are in docs/benchmarks.md)"
"$bin" --quick --steps 200 --adam-lr 3e-2 --block-lr 1e-2 --warmup-frac 0.2 --out "$out" 2>/dev/null
