#!/usr/bin/env bash
# Demo step: the kernel table of eigen_backend (bench_kernels with short runs: GEMM, flash
# attention, RMSNorm, cross-entropy) and the attention / GEMM FLOP/s ratio of the same run.
# docs/benchmarks.md ("Kernels") has the figures of longer, repeated runs.
set -euo pipefail
build=${1:?usage: bash bench/demo.d/10-kernels.sh BUILD_DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
bin="$build/bench/kernels/bench_kernels"
echo
if [ ! -x "$bin" ]; then
  echo "== kernels: $bin not built (needs Eigen and Google Benchmark), skipped"
  exit 0
fi
echo "== kernels: eigen_backend on $(nproc) cores, wall-clock (bench_kernels, short runs)"
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
"$bin" --benchmark_filter='^(gemm|gemm_single)<|^attention_|^rmsnorm|^xent' \
  --benchmark_min_time=0.05 --benchmark_out="$csv" --benchmark_out_format=csv
echo "== attention fwd+bwd (T 4096, hd 64, 8/2 heads) against the float GEMM 4096x512x512:"
bash "$here/kernels/ratio.sh" --csv "$csv"
