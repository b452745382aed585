#!/usr/bin/env bash
# Demo step: the three backward schedules on one long sequence, side by side in one process:
# peak activation memory, time, and the largest gradient difference to full backprop.
set -euo pipefail
build=${1:?usage: 20-stream.sh BUILD_DIR}
echo
echo "== StreamBP: full backprop vs gradient checkpointing vs StreamBP (one process, float)"
"$build/bench/stream/bench_stream" --preset small --seq 2048 --chunk 256 --compare
echo "== planner: the longest sequence each schedule fits in 2 GiB of activations (qwen3-bench)"
"$build/tools/tightfit/tightfit" plan --preset qwen3-bench --seq 8192 --budget 2G
