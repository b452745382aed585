#!/usr/bin/env bash
# Prints the data-parallel traffic table of docs/distributed.md: bench_dist under mpirun with
# 1, 2 and 4 ranks (oversubscribed on a 2-core machine), all layers trained (Adam) and one
# layer trained (BAdam).
#   bench/distributed/run.sh BUILD_DIR [bench_dist options...]
set -euo pipefail
build=${1:?usage: bench/distributed/run.sh BUILD_DIR [options]}
shift
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
  --mca oob_tcp_if_include lo)
echo "ranks,mode,bytes_per_step_rank,messages_per_step,gradient_reductions,backward_s,wait_after_backward_s,peak_activation_bytes"
for n in 1 2 4; do
  "${mpirun[@]}" -np "$n" "$build/bench/distributed/bench_dist" "$@"
  "${mpirun[@]}" -np "$n" "$build/bench/distributed/bench_dist" --active-layer 3 "$@"
done
