"""Loop-lag sampler, a diagnostic for latency work (docs/perf/latency-tail.md), off unless
``KBROKER_LOOP_LAG_LOG`` names a file (``{pid}`` in it is replaced by the broker's pid).

A timer chain on the server's loop every ``period_s``; each tick later than ``threshold_s`` past due
is written as ``<monotonic s> <lag ms> <wall ms> <thread cpu ms>`` (wall and the loop thread's
``time.thread_time()`` since the previous tick): a stall with the thread on the CPU for most of it is a
long callback, one with the thread off the CPU is preemption or a blocking call. It works on any loop
(asyncio's handle wrappers do not reach uvloop's callbacks); uvloop's timers count whole milliseconds,
so lateness under ~1 ms there is the clock's, hence the 2 ms default threshold. Lines are buffered and
written once a second (and at stop); ``n=<ticks>`` lines mark the sampler's progress. Monotonic time is
the clock the benchmarks stamp records with, so a stall lines up with a latency phase's records.
"""
from __future__ import annotations

import time

_now = time.monotonic
_cpu = time.thread_time


class LoopLagSampler:
    def __init__(self, loop, path: str, period_s: float = 0.001, threshold_s: float = 0.002):
        self.loop = loop
        self.period_s = period_s
        self.threshold_s = threshold_s
        self.file = open(path, "w", buffering=1)
        self.file.write(f"# loop {type(loop).__module__.split('.')[0]} period_ms {period_s * 1e3:g} "
                        f"threshold_ms {threshold_s * 1e3:g}\n")
        self.ticks = 0
        self.stalls = 0
        self._lines: list[str] = []
        self._handle = None
        self._due = self._last = self._flushed = _now()
        self._cpu = _cpu()

    def start(self) -> None:
        self._last, self._cpu = _now(), _cpu()
        self._due = self._last + self.period_s
        self._handle = self.loop.call_later(self.period_s, self._tick)

    def _tick(self) -> None:
        t, c = _now(), _cpu()
        lag = t - self._due
        self.ticks += 1
        if lag >= self.threshold_s:
            self.stalls += 1
            self._lines.append(f"{t:.6f} {lag * 1e3:.3f} {(t - self._last) * 1e3:.3f} {(c - self._cpu) * 1e3:.3f}\n")
        self._last, self._cpu = t, c
        if t - self._flushed >= 1.0:
            self._flush(t)
        self._due = t + self.period_s
        self._handle = self.loop.call_later(self.period_s, self._tick)

    def _flush(self, t: float) -> None:
        self._lines.append(f"{t:.6f} n={self.ticks}\n")
        self.file.writelines(self._lines)
        self._lines.clear()
        self._flushed = t

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self.file.closed:
            self._flush(_now())
            self.file.close()
