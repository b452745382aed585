#!/usr/bin/env bash
# Prints the attention / GEMM FLOP/s ratio of one bench_kernels run: causal flash attention
# forward+backward (T = 4096, head_dim 64, 8 query / 2 KV heads, float) against the float GEMM
# 4096x512x512 (split across threads, and as one serial Eigen call), all in the same process.
#
#   bench/kernels/ratio.sh BUILD_DIR [--clock=cpu] [--reps=N] [extra Google Benchmark flags]
#   bench/kernels/ratio.sh --csv FILE      the ratio from an existing CSV output of bench_kernels
#
# --clock=cpu rates work per CPU-second of the process (robust to other load on the machine);
# the default is wall-clock. The N repetitions (--reps=N, default 3) of the three benchmarks are
# interleaved at random, so a change of the machine's load hits them alike; the ratio is printed
# for the median and for the best (max) rate of each.
set -euo pipefail

ratio_from_csv() {
  awk -F, '
    /^name,/ { for (i = 1; i <= NF; i++) if ($i == "\"FLOP/s\"") col = i; header = 1; next }
    !header { next }  # the context lines before the header
    {
      name = $1; gsub(/"/, "", name)
      stat = "once"
      if (match(name, /_(mean|median|stddev|cv|max)$/)) stat = substr(name, RSTART + 1)
      if (stat == "mean" || stat == "stddev" || stat == "cv") next
      if (name ~ /^attention_fwd_bwd<float>/) att[stat] = $col
      else if (name ~ /^gemm<float>\/m:4096\/n:512\/k:512/) gemm[stat] = $col
      else if (name ~ /^gemm_single<float>\/m:4096\/n:512\/k:512/) single[stat] = $col
    }
    END {
      if (col == 0) { print "ratio.sh: no FLOP/s column in the CSV" > "/dev/stderr"; exit 1 }
      n = 0
      for (s in att) {
        if (!(s in gemm)) continue
        n++
        printf "%-7s attention fwd+bwd %7.2f GFLOP/s | gemm 4096x512x512 %7.2f GFLOP/s (split), %7.2f GFLOP/s (one Eigen call) | ratio %.2f (vs split), %.2f (vs one call)\n",
          s, att[s] / 1e9, gemm[s] / 1e9, single[s] / 1e9, att[s] / gemm[s], (single[s] > 0 ? att[s] / single[s] : 0)
      }
      if (n == 0) { print "ratio.sh: attention or gemm rows missing in the CSV" > "/dev/stderr"; exit 1 }
    }' "$1"
}

if [ "${1:-}" = "--csv" ]; then
  ratio_from_csv "$2"
  exit 0
fi

build=${1:?usage: bench/kernels/ratio.sh BUILD_DIR [--clock=cpu] [--reps=N] [benchmark flags]}
shift
bin="$build/bench/kernels/bench_kernels"
[ -x "$bin" ] || { echo "ratio.sh: $bin not built (target bench_kernels)" >&2; exit 1; }
reps=3
args=()
for arg in "$@"; do
  case "$arg" in
    --reps=*) reps=${arg#--reps=} ;;
    *) args+=("$arg") ;;
  esac
done
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
"$bin" "${args[@]}" \
  --benchmark_filter='^(gemm|gemm_single)<float>/m:4096/n:512/k:512/|^attention_fwd_bwd<float>/' \
  --benchmark_repetitions="$reps" --benchmark_enable_random_interleaving=true \
  --benchmark_report_aggregates_only=true \
  --benchmark_out="$csv" --benchmark_out_format=csv
echo
ratio_from_csv "$csv"
