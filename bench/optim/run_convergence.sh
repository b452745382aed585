#!/usr/bin/env bash
# Every convergence table of docs/benchmarks.md ("## Optimizers"): the symmetric tuning sweep of
# Adam and BAdam, the tuned curves from scratch, the label-noise variant with a known loss floor,
# the fine-tuning experiment, and the plot. One process at a time (each run takes 40-120 s on
# 2 shared cores; the whole script about 55 minutes).
#   bash bench/optim/run_convergence.sh BUILD_DIR OUT_DIR
# Writes OUT_DIR/optim_sweep_*.csv, optim_convergence_*.csv, optim_summary_*.csv and
# OUT_DIR/optim_convergence.png.
set -euo pipefail
build=${1:?usage: run_convergence.sh BUILD_DIR OUT_DIR}
out=${2:?usage: run_convergence.sh BUILD_DIR OUT_DIR}
bin="$build/bench/optim/bench_optim"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
run() { "$bin" --out "$out" "$@" 2>/dev/null | tee -a "$out/convergence.log"; }

# 1. Tuning sweep on the zero-floor copy task (600 steps): 11 runs per method.
#    learning rate (8 values for Adam, 6 for BAdam: BAdam diverges from 3e-2 on) ...
run --part sweep --methods adam,badam --adam-lr 1e-3,2e-3,3e-3,5e-3,1e-2,2e-2,3e-2,5e-2 \
  --block-lr 1e-3,3e-3,5e-3,1e-2,2e-2,3e-2 --tag lr
#    ... then, at each method's best lr, one knob at a time: BAdam's K, order, blocks, per-block
#    warmup; Adam's schedule warmup, final factor, beta2.
run --part sweep --methods badam --block-lr 1e-2 --switch-every 1,20 --tag badam_k
run --part sweep --methods badam --block-lr 1e-2 --order descending --tag badam_order
run --part sweep --methods badam --block-lr 1e-2 --blocks merged --tag badam_blocks
run --part sweep --methods badam --block-lr 1e-2 --block-warmup 5 --tag badam_bwarm
run --part sweep --methods adam --adam-lr 3e-2 --warmup-frac 0.2 --tag adam_warm
run --part sweep --methods adam --adam-lr 3e-2 --min-factor 0.01 --tag adam_min
run --part sweep --methods adam --adam-lr 3e-2 --beta2 0.99 --tag adam_beta2
#    (the schedule warmup helped Adam, so BAdam gets it too: 11 Adam runs, 12 BAdam runs)
run --part sweep --methods badam --block-lr 1e-2 --warmup-frac 0.2 --tag badam_warm

# 2. Tuned curves of the four methods (BREAD uses BAdam's tuned block lr), zero-floor copy.
tuned=(--adam-lr 3e-2 --block-lr 1e-2 --warmup-frac 0.2)
run --part convergence "${tuned[@]}" --tag scratch
#    ... and Adam vs BAdam over three seeds (mean curves, min/max of the final losses)
run --part convergence "${tuned[@]}" --methods adam,badam --seeds 3 --tag seeds3
# 3. The same with 20 % label noise: loss floor 1.1496 nats, excess over it reported.
run --part convergence "${tuned[@]}" --noise 0.2 --tag noisy
# 4. Fine-tuning: Adam pre-trains on the copy task (600 steps), each method fine-tunes the
#    checkpoint for 300 steps on the mapped copy (answer = a fixed permutation of the prefix).
run --part convergence "${tuned[@]}" --pretrain-steps 600 --pretrain-lr 3e-2 --task map \
  --steps 300 --tag finetune
#    ... and a check of the lrs on this task (the other lrs of each method).
run --part sweep --methods adam,badam --adam-lr 1e-2,3e-3 --block-lr 3e-3 --warmup-frac 0.2 \
  --pretrain-steps 600 --pretrain-lr 3e-2 --task map --steps 300 --tag finetune_lr

# 5. The untuned status (lr 3e-3 for all), kept for the record.
run --part convergence --tag untuned

/usr/bin/python3 "$here/plot_convergence.py" "$out/optim_convergence.png" \
  "$out/optim_convergence_untuned.csv@copy from scratch, untuned (lr 3e-3 for all)" \
  "$out/optim_convergence_scratch.csv@copy from scratch, tuned lrs (Adam 3e-2, blocks 1e-2)" \
  "$out/optim_convergence_noisy.csv@copy with 20% label noise, tuned lrs@1.1496" \
  "$out/optim_convergence_finetune.csv@fine-tuning an Adam checkpoint on the mapped copy"
