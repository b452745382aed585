#!/usr/bin/env bash
# Runs the pytest suite of the Python module (ctest `python`, and so scripts/test).
#   python/tests/run.sh PYTHON BUILD_PYTHON_DIR TIGHTFIT_CLI MEBB_FIXTURES [PYTEST_ARGS...]
# PYTHON is the interpreter the module was built for; BUILD_PYTHON_DIR holds the assembled
# package (<build>/python/tightfit). Without pytest or numpy for PYTHON: under CI=true it fails
# naming the packages; elsewhere it says it skipped and exits 77 (CTest's skip code).
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: python/tests/run.sh PYTHON BUILD_PYTHON_DIR TIGHTFIT_CLI MEBB_FIXTURES [PYTEST_ARGS...]" >&2
  exit 2
fi
python=$1
package=$(cd "$2" && pwd)
TIGHTFIT_CLI=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
export TIGHTFIT_CLI TIGHTFIT_MEBB_FIXTURES=$4  # fixtures: an empty or missing folder skips them
shift 4
if ! "$python" -c "import pytest, numpy" 2>/dev/null; then
  if [ "${CI:-}" = "true" ]; then
    echo "python tests: $python cannot import pytest and numpy (CI=true: failing; scripts/deps --python installs python3-pytest python3-numpy)" >&2
    exit 1
  fi
  echo "python tests skipped: $python cannot import pytest and numpy (scripts/deps --python)"
  exit 77
fi
export PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")"
exec "$python" -m pytest -q -p no:cacheprovider "$@" .
