#!/usr/bin/env bash
# Runs the PyTorch cross-check when Debian's python3-torch is installed (scripts/test calls it).
#   tests/python/run.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: tests/python/run.sh BUILD_DIR}
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "PyTorch cross-check skipped: python3-torch is not installed (scripts/test --torch installs it)"
  exit 0
fi
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 cross_check.py "$build/examples/tightfit/tightfit" "$work"
