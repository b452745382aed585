#!/usr/bin/env bash
# Prints the sequence-parallel tables of docs/distributed.md:
#  1. real runs: bench_seqpar in one process (compute_gradients) and under mpirun with 2 and 4
#     ranks (oversubscribed on a 2-core machine), contiguous and zig-zag, for each T of REAL_T;
#  2. dry runs (meta backend, exact bytes, no compute) of every rank for N = 2, 4, 8 at each T
#     of DRY_T.
#   bench/distributed/run_seqpar.sh BUILD_DIR ["REAL_T..."] ["DRY_T..."] [bench_seqpar options...]
set -euo pipefail
build=${1:?usage: bench/distributed/run_seqpar.sh BUILD_DIR ["REAL_T..."] ["DRY_T..."] [options]}
real_t=${2:-"512 1024"}
dry_t=${3:-"1024 4096 16384 65536"}
shift $(($# < 3 ? $# : 3))
bin="$build/bench/distributed/bench_seqpar"
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
  --mca oob_tcp_if_include lo)
echo "ranks,assignment,T,peak_activation_bytes,attention_max_over_mean,payload_bytes_per_rank,messages_per_rank,seconds"
for t in $real_t; do
  "${mpirun[@]}" -np 1 "$bin" --seq "$t" --one-process 1 "$@"
  for n in 2 4; do
    for a in contiguous zigzag; do
      "${mpirun[@]}" -np "$n" "$bin" --seq "$t" --assignment "$a" "$@"
    done
  done
done
echo "dry,ranks,assignment,T,rank_peak_activation_bytes,one_process_peak_activation_bytes,ratio"
for t in $dry_t; do
  for n in 2 4 8; do
    for a in contiguous zigzag; do
      "$bin" --dry-ranks "$n" --seq "$t" --assignment "$a" "$@"
    done
  done
done
