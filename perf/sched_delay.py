"""Run-queue delays of chosen processes over a window (``perf sched``, root): for every time a thread was
woken, how long it waited for a CPU before it ran. When the machine's cores are all busy, a request
whose path needs several processes to wake in turn (a follower, then the leader, then the client) pays
one such wait per hop; their tail beside the request's latency tail says whether the tail is the
machine's scheduling or work of the processes.

    with SchedRecord(path):
        ...                                   # the window
    waits = sched_delays(path, {"leader": (pid, True), "producer": (pid, False)})
    # -> {"leader": [ms, ...], ...}; True: that process's main thread only (an event loop's)
"""
from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

# perf sched timehist: "  time [cpu]  comm[tid/pid]  wait-time  sch-delay  run-time" (ms; [tid] alone
# for a process's main thread)
_LINE = re.compile(r"^\s*\d+\.\d+\s+\[\d+\]\s+.*?\[(\d+)(?:/(\d+))?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


class SchedRecord:
    """``perf sched record -a`` into ``path`` from entry to exit (stopped with SIGINT, as perf expects)."""

    def __init__(self, path: Path, start_timeout: float = 10.0):
        self.path = Path(path)
        self.start_timeout = start_timeout
        self.proc = None

    def __enter__(self):
        self.path.unlink(missing_ok=True)
        self.proc = subprocess.Popen(["perf", "sched", "record", "-a", "-o", str(self.path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.start_timeout
        while not (self.path.exists() and self.path.stat().st_size > 0):
            if self.proc.poll() is not None:
                raise RuntimeError(f"perf sched record exited {self.proc.returncode}: "
                                   f"{self.proc.stderr.read().decode(errors='replace')[-300:]}")
            if time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"perf sched record wrote nothing within {self.start_timeout} s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self._stop()
        return False

    def _stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)       # perf finishes writing its buffers
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def sched_delays(path: Path, roles: dict[str, tuple[int, bool]]) -> dict[str, list[float]]:
    """Each role's run-queue waits in ms (one per time a thread of it was switched in after a wake-up
    or a preemption) in the record at ``path``. ``roles``: name -> (pid, main thread only)."""
    pids = ",".join(str(pid) for pid, _main in roles.values())
    out = subprocess.run(["perf", "sched", "timehist", "-i", str(path), "-p", pids],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"perf sched timehist exited {out.returncode}: {out.stderr[-300:]}")
    return parse_timehist(out.stdout, roles)


def parse_timehist(text: str, roles: dict[str, tuple[int, bool]]) -> dict[str, list[float]]:
    """``perf sched timehist`` text -> each role's sch-delay column (ms); other lines are skipped."""
    by_pid = {pid: (name, main) for name, (pid, main) in roles.items()}
    waits: dict[str, list[float]] = {name: [] for name in roles}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        tid = int(m.group(1))
        pid = int(m.group(2)) if m.group(2) else tid
        role = by_pid.get(pid)
        if role is None or (role[1] and tid != pid):
            continue
        waits[role[0]].append(float(m.group(4)))
    return waits


def percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def summary(waits: dict[str, list[float]]) -> dict[str, dict]:
    """Each role's run count and wait p50 / p99 / max (ms)."""
    out = {}
    for name, xs in waits.items():
        xs = sorted(xs)
        out[name] = {"runs": len(xs), "p50_ms": percentile(xs, 0.5), "p99_ms": percentile(xs, 0.99),
                     "max_ms": xs[-1] if xs else float("nan")}
    return out


def describe(summaries: dict[str, dict]) -> str:
    """``summary``'s figures as 'role: n runs, wait p50 / p99 / max ms', in one line."""
    return "; ".join(f"{name}: {s['runs']} runs, wait p50 {s['p50_ms']:.3f} / p99 {s['p99_ms']:.2f} / "
                     f"max {s['max_ms']:.2f} ms" for name, s in summaries.items())
