"""Smoke tests of the latency and connections curves (perf/curve_latency.py, perf/curve_connections.py).

Each curve runs in quick mode against a one-broker kbroker target on tmpfs and must return a
well-formed, JSON-serializable result. No timing assertions: the figures of a quick run on a shared
machine mean nothing.
"""
from __future__ import annotations

import json
import math

import pytest

import confluent_kafka  # noqa: E402,F401  (installed by scripts/setup.sh: a missing one must fail)
import numpy  # noqa: E402,F401

from kbroker.perf import curve_connections, curve_latency  # noqa: E402
from kbroker.perf.targets import KbrokerTarget  # noqa: E402


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    t = KbrokerTarget("shm", tmp_path_factory.mktemp("curves"))
    t.start()
    yield t
    t.stop()


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _common(result: dict, name: str, unit: str) -> None:
    assert result["name"] == name and result["unit"] == unit
    assert isinstance(result["notes"], str) and result["notes"]
    assert isinstance(result["points"], list) and result["points"]
    assert json.loads(json.dumps(result)) == result      # plain JSON values only


@pytest.mark.timeout(120)
def test_latency_quick_is_well_formed(target):
    r = curve_latency.run(target, quick=True)
    _common(r, "latency", "ms")
    peak = r["peak"]
    assert _num(peak["records_per_s"]) and peak["records_per_s"] > 0 and peak["errors"] == 0
    assert [p["fraction"] for p in r["points"]] == list(curve_latency.QUICK["fractions"])
    for p in r["points"]:
        assert p["produce_errors"] == 0 and p["consumer_errors"] == 0
        assert p["sent"] == p["delivered"] > 0
        assert 0 < p["samples"] <= p["delivered"]
        assert p["offered_records_per_s"] > 0 and p["achieved_records_per_s"] > 0
        qs = [p[k] for k in ("p50", "p90", "p99", "p99_9", "max")]
        assert all(_num(q) and q >= 0 for q in qs)
        assert qs == sorted(qs)                                  # percentiles are monotone
        assert p["p99"] < 60_000                                 # latencies are in ms, not ns
        assert all(_num(p["ack"][k]) for k in ("p50", "p99"))
        assert p["broker_cpu_cores"] >= 0
    goal = r["goal"]
    assert isinstance(goal["met"], bool) and goal["p99_ms"] == r["points"][1]["p99"]


@pytest.mark.timeout(120)
def test_connections_quick_is_well_formed(target):
    r = curve_connections.run(target, quick=True)
    _common(r, "connections", "records/s")
    assert r["skipped"] == []
    assert [p["connections"] for p in r["points"]] == list(curve_connections.QUICK["connections"])
    for p in r["points"]:
        assert p["connections_open"] == p["connections"] and p["open_failures"] == 0
        assert p["produce_errors"] == 0 and p["connections_dropped"] == 0, p["first_error"]
        assert p["requests"] > 0 and p["records_per_s"] > 0 and p["mb_per_s"] > 0
        assert p["broker_cpu_cores"] >= 0 and p["client_cpu_cores"] >= 0
        assert p["rtt_ms_p50"] <= p["rtt_ms_p99"]
        assert p["broker_rss_max_kib"] > 0 and p["broker_hwm_kib"] >= p["broker_rss_after_kib"] > 0
        assert p["broker_open_fds"] >= p["connections"]
    soft, _hard = r["broker_nofile"]
    assert soft is None or soft >= max(curve_connections.QUICK["connections"])


def test_proc_readers_on_self():
    import os
    soft, hard = curve_connections.open_files_limit(os.getpid())
    assert soft is None or soft > 0
    mem = curve_connections.memory_kib(os.getpid())
    assert mem["VmHWM"] >= mem["VmRSS"] > 0
    assert curve_connections.open_fds(os.getpid()) > 0
