#!/usr/bin/env bash
# Demo step: BAdam / BREAD optimizer state, peak memory and backward time on a small model, and
# fine-tuning from an Adam-pre-trained checkpoint, the papers' regime (docs/benchmarks.md,
# "Convergence", part 4): each method at its own tuned lr, the same 300 steps and batches, the
# seconds each took beside the loss (about a minute on 2 cores).
#   bash bench/demo.d/30-optim.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: 30-optim.sh BUILD_DIR}
bin="$build/bench/optim/bench_optim"
if [ ! -x "$bin" ]; then
  echo "30-optim: $bin not built (needs Eigen), skipped"
  exit 0
fi
out="$build/demo-optim"
echo "== optim: BAdam / BREAD against Adam: memory, then fine-tuning a pre-trained checkpoint on a new task"
"$bin" --quick --adam-lr 3e-2 --block-lr 1e-2 --warmup-frac 0.2 --pretrain-steps 300 \
  --pretrain-lr 3e-2 --task map --steps 300 --out "$out" 2>/dev/null
