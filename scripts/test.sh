#!/usr/bin/env bash
# Runs the whole test suite (fast and slow tests) after making sure the environment is set up.
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow" -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ulimit -n 20000 2>/dev/null || true
# --durations: the CI log names the slowest tests (its budget is 45 min on 2 cores)
exec .venv/bin/python -m pytest -ra -p no:cacheprovider --durations=25 "$@"
