"""``--timeline``: after an xdist run, when each worker went idle and what it ran last (scripts/test.sh asks for it).

A run's wall time is set by its last worker. When one long file is handed out late, the other workers
finish early and the cores idle while it runs on: the report shows that tail as the gap between the
first and the last worker to finish, and the files each worker ran last; and how busy the machine's cores
were over the run (from /proc/stat: every process counts, ours and anything else running).
Each worker records, per test file, when its first test started and its last test ended (wall clock,
seconds since the epoch, shared by the processes of one machine) and sends them to the controller.
"""
from __future__ import annotations

import os
import time

import pytest

_SPANS = pytest.StashKey[dict]()        # this process: file -> (first start, last end)
_WORKERS = pytest.StashKey[dict]()      # xdist controller: worker id -> its spans
_STARTED = pytest.StashKey[float]()
_CPU_AT_START = pytest.StashKey[tuple]()


def machine_cpu() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all cores since boot, or None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            # user nice system idle iowait irq softirq steal (guest time is already in user and nice)
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def pytest_addoption(parser):
    parser.addoption("--timeline", action="store_true",
                     help="after an xdist run, each worker's busy time, when it finished, and its last files")


def pytest_sessionstart(session):
    session.config.stash[_STARTED] = time.time()
    session.config.stash[_CPU_AT_START] = machine_cpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.time()
    yield
    if item.config.getoption("--timeline"):
        spans = item.config.stash.setdefault(_SPANS, {})
        name = item.nodeid.split("::")[0]
        first, _last = spans.get(name, (start, start))
        spans[name] = (first, time.time())


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)       # set on an xdist worker
    if workeroutput is not None and session.config.getoption("--timeline"):
        workeroutput["timeline"] = session.config.stash.get(_SPANS, {})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: keep a finished worker's spans under its id."""
    spans = getattr(node, "workeroutput", {}).get("timeline")
    if spans:
        node.config.stash.setdefault(_WORKERS, {})[node.gateway.id] = spans


def worker_summary(workers: dict[str, dict[str, tuple[float, float]]], started: float) -> list[str]:
    """One line per worker: files run, busy seconds, when it finished (seconds after ``started``) and its
    last three files with their spans; then the tail, the gap between the first and last to finish."""
    lines, finishes = [], []
    for worker, spans in sorted(workers.items()):
        busy = sum(end - first for first, end in spans.values())
        finish = max(end for _first, end in spans.values()) - started
        finishes.append(finish)
        last = sorted(spans.items(), key=lambda kv: kv[1][1])[-3:]
        tail = ", ".join(f"{name.rsplit('/', 1)[-1]} {first - started:.0f}-{end - started:.0f}"
                         for name, (first, end) in last)
        lines.append(f"{worker}: {len(spans)} files, busy {busy:.0f} s, done at {finish:.0f} s; last: {tail}")
    if finishes:
        lines.append(f"tail: workers finished between {min(finishes):.0f} s and {max(finishes):.0f} s "
                     f"({max(finishes) - min(finishes):.0f} s apart)")
    return lines


def pytest_terminal_summary(terminalreporter, config):
    workers = config.stash.get(_WORKERS, {})
    if not config.getoption("--timeline") or not workers:
        return
    terminalreporter.write_sep("=", "workers' timeline (seconds after the run started)")
    for line in worker_summary(workers, config.stash[_STARTED]):
        terminalreporter.write_line(line)
    start, end = config.stash.get(_CPU_AT_START, None), machine_cpu()
    if start and end and end[1] > start[1]:
        busy = (end[0] - start[0]) / (end[1] - start[1])
        terminalreporter.write_line(f"machine: cores {busy:.0%} busy over the run ({os.cpu_count()} cores)")
