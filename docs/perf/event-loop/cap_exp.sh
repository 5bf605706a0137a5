#!/bin/bash
# Experiment (not part of kbroker): capacity + kcat on asyncio vs uvloop, alternating 1-round runs, both with
# PYTHONPATH=$UVLOOP_PATCH_DIR (uvloop_experiment_sitecustomize.py copied there as sitecustomize.py).
# Run from the repository root; results in /tmp/cap-<loop>-<i>/foundation.json.
for i in 1 2 3; do
  for loop in asyncio uvloop; do
    KBROKER_EVENT_LOOP=$loop PYTHONPATH=$UVLOOP_PATCH_DIR timeout 600 .venv/bin/python -m kbroker.perf.broker_bench \
      --targets kbroker-shm --workloads capacity,kcat --rounds 1 --kcat-seconds 3 --out /tmp/cap-$loop-$i \
      > /tmp/cap-$loop-$i.log 2>&1
    echo "$loop $i rc=$?"
  done
done
