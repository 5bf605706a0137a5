"""``--cpu-by-file=N``: after the run, the N test files that used the most CPU (scripts/test.sh asks for it).

The suite is CPU-bound on two cores, so a file's wall time says little: four workers share the cores,
and a test waiting on a session timeout takes wall time but no CPU. A file's CPU is counted as the
test process's own CPU plus that of its children reaped meanwhile (the brokers, ZooKeeper servers and
clients it started and stopped) over its tests' setup, call and teardown. A child's CPU is known only
once it is reaped: processes nobody waits for (a JVM's own children once it is killed) are not counted,
and the session fixtures' processes (a worker's shared ZooKeeper and broker, whose work for every file
of the worker shows there) are counted apart when they stop, not charged to the file that runs last.
Under pytest-xdist each worker counts its own files and sends them to the controller, which prints
the table.
"""
from __future__ import annotations

import contextlib
import resource
import time

import pytest

_FILES = pytest.StashKey[dict]()
_APART = "(session fixtures' teardown)"
_apart_cpu = 0.0        # CPU counted apart by counted_apart() in this process


def cpu_seconds() -> float:
    """User + system CPU of this process and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def counted_apart():
    """CPU used inside is charged to no test file (a session fixture's teardown)."""
    global _apart_cpu
    start = cpu_seconds()
    try:
        yield
    finally:
        _apart_cpu += cpu_seconds() - start


def pytest_addoption(parser):
    parser.addoption("--cpu-by-file", type=int, default=0, metavar="N",
                     help="after the run, list the N test files that used the most CPU (this process and "
                          "its reaped children: brokers, ZooKeeper, clients)")


def _add(table: dict, name: str, cpu: float, wall: float) -> None:
    old_cpu, old_wall = table.get(name, (0.0, 0.0))
    table[name] = (old_cpu + cpu, old_wall + wall)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not item.config.getoption("--cpu-by-file"):
        yield
        return
    apart, cpu, wall = _apart_cpu, cpu_seconds(), time.monotonic()
    yield
    table = item.config.stash.setdefault(_FILES, {})
    spent_apart = _apart_cpu - apart
    _add(table, item.nodeid.split("::")[0], cpu_seconds() - cpu - spent_apart, time.monotonic() - wall)
    if spent_apart:
        _add(table, _APART, spent_apart, 0.0)


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)       # set on an xdist worker
    if workeroutput is not None and session.config.getoption("--cpu-by-file"):
        workeroutput["cpu_by_file"] = session.config.stash.get(_FILES, {})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: merge a finished worker's table."""
    table = node.config.stash.setdefault(_FILES, {})
    for name, (cpu, wall) in getattr(node, "workeroutput", {}).get("cpu_by_file", {}).items():
        _add(table, name, cpu, wall)


def pytest_terminal_summary(terminalreporter, config):
    n = config.getoption("--cpu-by-file")
    table = config.stash.get(_FILES, {})
    if not n or not table:
        return
    total = sum(cpu for cpu, _wall in table.values())
    terminalreporter.write_sep("=", f"{n} test files by CPU ({total:.0f} CPU-s counted in all)")
    for name, (cpu, wall) in sorted(table.items(), key=lambda kv: -kv[1][0])[:n]:
        terminalreporter.write_line(f"{cpu:8.1f} CPU-s {wall:8.1f} s  {name}")
