#!/usr/bin/env bash
# Demo step: tightfit against PyTorch (Debian python3-torch, when installed) on the identical
# model, weights and batch at one T: checkpoint and stream against PyTorch's checkpointing, each
# row in its own process (seconds, peak RSS, losses equal to 1e-4). The T = 1k .. 16k table and
# plot are in docs/benchmarks.md ("PyTorch side by side"): bench/peers/peers.py.
#   bash bench/demo.d/25-peers.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: 25-peers.sh BUILD_DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
tool="$build/tools/tightfit/tightfit"
echo
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "== PyTorch side by side: python3-torch is not installed (scripts/deps --torch), skipped"
  exit 0
fi
echo "== PyTorch side by side: qwen3-bench, T = 2048, one forward+backward step, float, 2 threads"
/usr/bin/python3 "$here/peers/peers.py" "$tool" --seq 2048 \
  --rows checkpoint,stream,torch-checkpoint
