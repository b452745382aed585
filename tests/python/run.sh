#!/usr/bin/env bash
# Runs the PyTorch cross-checks of `tightfit grad` and of `tightfit train --optimizer lora`
# (scripts/test calls it).
#   tests/python/run.sh BUILD_DIR
# Needs Debian's python3-torch (scripts/deps --torch installs it). Without it: under CI=true it
# fails naming the package; elsewhere it says it skipped and exits 77 (CTest's skip code).
set -euo pipefail
build=${1:?usage: tests/python/run.sh BUILD_DIR}
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  if [ "${CI:-}" = "true" ]; then
    echo "PyTorch cross-check: python3-torch is not installed (CI=true: failing; scripts/deps --torch installs it)" >&2
    exit 1
  fi
  echo "PyTorch cross-check skipped: python3-torch is not installed (scripts/test --torch installs it)"
  exit 77
fi
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 cross_check.py "$build/tools/tightfit/tightfit" "$work"
/usr/bin/python3 cross_check_lora.py "$build/tools/tightfit/tightfit" "$work/lora"
