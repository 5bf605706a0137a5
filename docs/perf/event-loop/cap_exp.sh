#!/bin/bash
# Capacity + kcat on asyncio vs uvloop (KBROKER_EVENT_LOOP), alternating 1-round runs of perf.broker_bench,
# pairs START..PAIRS (default 1..3), the order swapped each pair. Run from the repository root; results in
# /tmp/cap-<loop>-<i>/foundation.json, summarised by cap_summary.py.
PAIRS=${PAIRS:-3}
START=${START:-1}
for i in $(seq "$START" "$PAIRS"); do
  if [ $((i % 2)) -eq 1 ]; then order="asyncio uvloop"; else order="uvloop asyncio"; fi
  for loop in $order; do
    KBROKER_EVENT_LOOP=$loop timeout 600 .venv/bin/python -m kbroker.perf.broker_bench \
      --targets kbroker-shm --workloads capacity,kcat --rounds 1 --kcat-seconds 3 --out /tmp/cap-$loop-$i \
      > /tmp/cap-$loop-$i.log 2>&1
    echo "$loop $i rc=$?"
  done
done
