#!/usr/bin/env bash
# Demo step: MEBB against the baseline boxes on generated raw scans (belt detected, status and
# 95 % intervals; a few seconds).
#   bash bench/demo.d/40-mebb.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: 40-mebb.sh BUILD_DIR}
bench="$build/bench/geometry/tightfit_mebb_bench"
cli="$build/tools/tightfit/tightfit"
echo "== MEBB: minimum elastic bounding box (suitcases with handles, wheels, straps and tags)"
if [ ! -x "$bench" ]; then
  echo "(skipped: $bench not built; needs Eigen and nanoflann)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bench" --bags 0 --seed 10 --write-scene "$tmp/bag.ply"
if [ -x "$cli" ]; then
  # exit 3: the measurement is not trustworthy (status and reasons printed); not a demo failure
  for method in mebb pca trimmed; do
    "$cli" measure "$tmp/bag.ply" --method "$method" || echo "(exit $?)"
  done
  "$cli" measure "$tmp/bag.ply" --json | grep -E '"(status|length|width|height)"|uncertainty' -A3 |
    head -12 || true
fi
echo
"$bench" --bags 12 --noise 1 --seed 4242 --brief --no-cgal
