"""What the jobs share: a SparkSession that works under spark-submit and plain python, a progress
bar fed by Spark's status tracker, and phase timing."""
from __future__ import annotations

import os
import sys
import threading
import time


def session(app: str, master: str | None = None, conf: dict | None = None):
    """Under spark-submit, its master and settings win; run with plain python, ``master``
    (default local[*]) is used. Executors run this interpreter unless PYSPARK_PYTHON says else."""
    from . import ensure_python_env, register
    ensure_python_env()
    from pyspark.sql import SparkSession
    # our own bar replaces Spark's console progress
    b = SparkSession.builder.appName(app).config("spark.ui.showConsoleProgress", "false")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master or not under_submit:
        b = b.master(master or "local[*]")
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    register(spark)
    return spark


def tree_cpu_seconds(root: int | None = None) -> float | None:
    """CPU seconds (user + system) of process ``root`` (default: this one) and every live
    descendant, plus what their reaped children used; None where /proc is missing. Run with a
    local master this covers the whole of Spark (driver JVM, executors, Python workers) and any
    broker this process started: a cost that, unlike wall time, does not grow when other work
    takes the cores."""
    root = os.getpid() if root is None else root
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    parent, ticks = {}, {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue        # exited meanwhile
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])   # utime stime cutime cstime
    if root not in ticks:
        return None
    children: dict = {}
    for pid, pp in parent.items():
        children.setdefault(pp, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


class Progress:
    """Prints ``phase [#####.....] done/total tasks, MB/s`` to stderr while a phase runs, from
    the status tracker of the stages started since ``start``. Quiet when stderr is not a tty
    unless ``force``."""

    def __init__(self, spark, phase: str, nbytes: int | None = None, interval: float = 0.5,
                 stream=None, force: bool = False):
        self.sc = spark.sparkContext
        self.phase = phase
        self.nbytes = nbytes
        self.interval = interval
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self._stop = threading.Event()
        self._thread = None
        self.t0 = 0.0
        self.seconds = 0.0
        self.cpu0 = None
        self.cpu_seconds = None     # tree_cpu_seconds() over the phase, when /proc tells

    def __enter__(self):
        self.cpu0 = tree_cpu_seconds()
        self.t0 = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _line(self) -> str:
        tracker = self.sc.statusTracker()
        done = total = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        width = 30
        filled = int(width * done / total) if total else 0
        elapsed = time.monotonic() - self.t0
        rate = ""
        if self.nbytes and total:
            rate = f", ~{self.nbytes * done / total / 1e6 / max(elapsed, 1e-9):.1f} MB/s"
        return f"\r{self.phase:<10} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} tasks, {elapsed:.0f}s{rate}"

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                self.stream.write(self._line())
                self.stream.flush()
            except Exception:       # the tracker can race with SparkContext shutdown
                return

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.t0
        cpu1 = tree_cpu_seconds()
        if self.cpu0 is not None and cpu1 is not None:
            self.cpu_seconds = cpu1 - self.cpu0
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write(f"\r{self.phase:<10} done in {self.seconds:.1f}s" + " " * 40 + "\n")
            self.stream.flush()
        return False
