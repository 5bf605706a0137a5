"""The suite's ``--baseline-tree`` option: a broker built from another tree runs as ``<name>@base``.

The wiring is checked with a real broker, using this tree as its own baseline (its interpreter, started
through the baseline's command prefix), and the before/after table on a summary built by hand."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from paths import ROOT

from kbroker.perf import report, suite
from kbroker.perf.targets import Baseline, make_targets, role


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


def test_base_target_runs_the_trees_broker_and_serves(tmp_path):
    base = Baseline(ROOT, sys.executable)
    [t] = make_targets(tmp_path, ["kbroker-shm@base"], base)
    assert t.name == "kbroker-shm@base" and role(t.name) == "kbroker-shm"
    assert str(t.root).startswith("/dev/shm/")          # the same log-dir storage as kbroker-shm
    t.start()
    try:
        argv = _cmdline(t.pid)
        # the measured PID is the baseline interpreter running the broker itself, not a wrapper
        assert argv[:3] == [sys.executable, "-P", "-c"], argv
        assert argv[-6:-1] == [sys.executable, "-m", "kbroker", "serve", "--config"], argv
        assert t.create_topic("base-smoke", 4) in ("admin", "auto")
        from confluent_kafka import Consumer, Producer
        p = Producer({"bootstrap.servers": t.bootstrap})
        p.produce("base-smoke", b"v", partition=2)
        assert p.flush(20) == 0
        c = Consumer({"bootstrap.servers": t.bootstrap, "group.id": "base-smoke", "auto.offset.reset": "earliest"})
        try:
            from confluent_kafka import TopicPartition
            c.assign([TopicPartition("base-smoke", 2, 0)])
            msg = c.poll(20)
            assert msg is not None and msg.error() is None and msg.value() == b"v"
        finally:
            c.close()
    finally:
        pid = t.pid
        t.stop()
    assert not Path(f"/proc/{pid}").exists()


def test_baseline_refuses_an_interpreter_that_imports_another_tree(tmp_path):
    with pytest.raises(RuntimeError, match="imports kbroker from"):
        Baseline(tmp_path, sys.executable)
    with pytest.raises(ValueError, match="no interpreter"):
        Baseline(tmp_path)
    with pytest.raises(ValueError, match="needs a baseline"):
        make_targets(tmp_path, ["kbroker-disk@base"])


def test_plan_runs_base_targets_wherever_their_counterpart_runs():
    names = ["kbroker-shm", "tansu", "kbroker-shm@base"]
    pts = [p["point"] for p in suite.plan(False, dict(suite.FOUNDATION_FULL), names, [],
                                          {"latency": object(), "connections": object()})]
    for ours in [p for p in pts if p.endswith("@ kbroker-shm") or "@ kbroker-shm " in p]:
        assert ours.replace("@ kbroker-shm", "@ kbroker-shm@base", 1) in pts, ours
    assert "capacity @ kbroker-shm@base" in pts and "capacity @ tansu" not in pts
    assert not any("disk baseline" in p and "@base" in p for p in pts)   # same filesystem as its counterpart


def _s(*vals):
    return {"median": sorted(vals)[len(vals) // 2], "min": min(vals), "max": max(vals), "n": len(vals),
            "values": list(vals)}


def test_before_after_flags_only_a_clear_regression_in_the_better_direction():
    shm, base = "kbroker-shm", "kbroker-shm@base"
    summ = {"foundation": {"figures": {
        # higher is better: 10% lower, ranges apart -> regression
        "clients.records_per_s": {"unit": "records/s", shm: _s(90, 91, 92), base: _s(100, 101, 102)},
        # lower is better: 10% more CPU but the ranges overlap -> worse, not a regression
        "clients.cpu_s_per_million": {"unit": "s", shm: _s(1.0, 1.1, 1.3), base: _s(0.9, 1.0, 1.05)},
        # lower is better and lower: better
        "kcat.produce.cpu_s_per_gb": {"unit": "s", shm: _s(5, 5, 5), base: _s(6, 6, 6)}}},
        "record_size": {"figures": {shm: {"100": {"mb_per_s": _s(10, 10.1, 10.2)}},
                                    base: {"100": {"mb_per_s": _s(10, 10.2, 10.3)}}}},
        "peak_rss_mib": {shm: _s(80, 81, 82), base: _s(60, 61, 62)},
        # the load generator's CPU is context, and one round has no range to be apart from
        "helpers": {"latency": {"targets": {shm: {"points": {"50%": {"producer_cpu_cores": _s(2, 2.1, 2.2),
                                                                       "p99": _s(9)}}},
                                            base: {"points": {"50%": {"producer_cpu_cores": _s(1, 1.1, 1.2),
                                                                        "p99": _s(3)}}}}}},
        "goals": [{"goal": "g", "value": 1.0}]}
    rows = {r["figure"]: r for r in report.before_after(summ, [shm, base])}
    assert set(rows) == {"foundation.figures.clients.records_per_s", "foundation.figures.clients.cpu_s_per_million",
                         "foundation.figures.kcat.produce.cpu_s_per_gb", "record_size.figures.100.mb_per_s",
                         "peak_rss_mib", "helpers.latency.targets.points.50%.producer_cpu_cores",
                         "helpers.latency.targets.points.50%.p99"}
    r = rows["helpers.latency.targets.points.50%.producer_cpu_cores"]
    assert r["direction"] == 0 and r["verdict"] == "context" and not r["regression"]
    r = rows["helpers.latency.targets.points.50%.p99"]
    assert r["verdict"] == "worse" and r["ranges_apart"] is None and not r["regression"]
    r = rows["foundation.figures.clients.records_per_s"]
    assert r["target"] == shm and r["direction"] == 1 and r["regression"] and r["ranges_apart"]
    assert r["ratio"] == pytest.approx(91 / 101)
    r = rows["foundation.figures.clients.cpu_s_per_million"]
    assert r["direction"] == -1 and r["verdict"] == "worse" and not r["regression"] and r["ranges_apart"] is False
    assert rows["foundation.figures.kcat.produce.cpu_s_per_gb"]["verdict"] == "better"
    assert rows["record_size.figures.100.mb_per_s"]["verdict"] == "same"
    assert rows["peak_rss_mib"]["direction"] == -1 and rows["peak_rss_mib"]["regression"]
    meta = {"baseline": {"tree": "/tmp/before", "commit": "f" * 40, "python": "/tmp/before/.venv/bin/python"}}
    md = report.before_after_markdown(report.before_after(summ, [shm, base]), meta)
    assert "**2 regression(s)**" in md[1]
    assert sum(1 for line in md if line.startswith("| kbroker") and "**regression**" in line) == 2
    assert md[2].count("|") == md[3].count("|") == md[4].count("|")
