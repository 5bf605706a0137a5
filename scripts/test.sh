#!/usr/bin/env bash
# Runs the whole test suite (fast and slow tests) after making sure the environment is set up.
# Three pytest runs: the tests that wait on ZooKeeper, brokers and sockets on KBROKER_TEST_WORKERS
# processes (pytest-xdist; whole files per worker, so module-scoped clusters start once), then the
# `heavy` tests (benchmark smoke runs, Spark jobs) on two, then the `serial` (timing-sensitive) ones
# alone. The exit code is non-zero if any fails.
# Extra arguments go to both runs, e.g. scripts/test.sh tests/unit or scripts/test.sh -m "not slow" -x
# KBROKER_TEST_WORKERS=0 runs everything in one serial pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ulimit -n 20000 2>/dev/null || true
# Bytecode is kept (some environments set PYTHONDONTWRITEBYTECODE): otherwise every broker, tool and xdist
# worker the suite starts compiles kbroker from source again (~0.3 s of CPU each) and every pytest process
# rewrites the test modules' assertions again (~12 s each).
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 kbroker zk spark perf >/dev/null
workers=${KBROKER_TEST_WORKERS:-5}
# --durations, --cpu-by-file and --timeline: the CI log names the slowest tests, the test files that used the
# most CPU (the runs are CPU-bound: CPU is what a file costs the others) and when each worker went idle
pytest=(.venv/bin/python -m pytest -ra -p no:cacheprovider --durations=25 --cpu-by-file=25 --timeline)
if [ "$workers" = 0 ]; then
  exec "${pytest[@]}" "$@"
fi
# Exit code 5 is "no tests collected": a selection may hold no serial (or only serial) tests.
ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }
set +e
"${pytest[@]}" -n "$workers" --dist loadgroup --no-loadscope-reorder --serial-tests=skip "$@"
parallel=$?
"${pytest[@]}" -n 2 --dist loadgroup --no-loadscope-reorder --serial-tests=heavy "$@"
heavy=$?
"${pytest[@]}" -p no:xdist --serial-tests=serial "$@"
serial=$?
set -e
echo "== parallel run (${workers} workers): exit ${parallel}; heavy run (2 workers): exit ${heavy}; serial run: exit ${serial}"
if [ "$parallel" = 5 ] && [ "$heavy" = 5 ] && [ "$serial" = 5 ]; then exit 5; fi
ok "$parallel" && ok "$heavy" && ok "$serial"
