#!/usr/bin/env bash
# Whole-process throughput of `tightfit measure` (binary PLY read + measure, end to end): one
# process per scan over every *.ply of a folder, timed as one wall-clock run; RUNS runs per
# binary, the binaries alternating so that they see the same machine load. Prints per binary
# the wall seconds (min / median / max) and the median points per second (the points are the
# vertex counts of the PLY headers). Used for docs/benchmarks.md (issue 13, "the whole process").
#
#   bench/geometry/measure_throughput.sh FOLDER RUNS TOOL [TOOL...]
#   e.g. bench/geometry/measure_throughput.sh ../shared/fixtures/mebb-independent 12 \
#          build/base/tools/tightfit/tightfit build/rel/tools/tightfit/tightfit
set -euo pipefail
if (($# < 3)); then
  echo "usage: $0 FOLDER RUNS TOOL [TOOL...]" >&2
  exit 2
fi
folder=$1 runs=$2
shift 2
shopt -s nullglob
scans=("$folder"/*.ply)
((${#scans[@]} > 0)) || { echo "$0: no .ply files in '$folder'" >&2; exit 2; }
declare -A seen
for tool in "$@"; do
  [[ -x $tool ]] || { echo "$0: '$tool' is not an executable" >&2; exit 2; }
  [[ -z ${seen[$tool]:-} ]] || { echo "$0: '$tool' is given twice" >&2; exit 2; }
  seen[$tool]=1
done
points=0
for f in "${scans[@]}"; do
  n=$(head -c 4096 "$f" | tr -d '\r' | awk '/^element vertex / {print $3; exit}')
  [[ $n =~ ^[0-9]+$ ]] || { echo "$0: '$f' has no 'element vertex' line" >&2; exit 2; }
  points=$((points + n))
done
declare -A walls
for ((i = 0; i < runs; ++i)); do
  for tool in "$@"; do
    t0=$(date +%s.%N)  # a light shell runs the processes (bash's own fork costs show otherwise)
    sh -c 'tool=$1; shift; for f; do "$tool" measure --json "$f" >/dev/null || [ $? = 3 ]; done' \
      sh "$tool" "${scans[@]}"
    t1=$(date +%s.%N)
    walls[$tool]+="$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", b - a}') "
  done
done
echo "${#scans[@]} scans, $points points, $runs runs per tool (one process per scan)"
printf '%-50s %8s %8s %8s %12s\n' tool min_s median_s max_s 'M points/s'
for tool in "$@"; do
  tr ' ' '\n' <<<"${walls[$tool]}" | grep . | sort -g |
    awk -v tool="$tool" -v pts="$points" '{w[NR] = $1}
      END {m = NR % 2 ? w[(NR + 1) / 2] : (w[NR / 2] + w[NR / 2 + 1]) / 2
           printf "%-50s %8.3f %8.3f %8.3f %12.2f\n", tool, w[1], m, w[NR], pts / m / 1e6}'
done
