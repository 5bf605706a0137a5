"""Smoke test of perf/fetch_latency.py with librdkafka's mock cluster beside a kbroker (issue 10: our
CPU per small Fetch ÷ the C mock's, same run): both are driven, every figure is positive, and the
report prints the ratios against the mock. Benchmark plumbing only: no timing assertion."""
from __future__ import annotations

import json
import math

import pytest

import confluent_kafka  # noqa: F401  (the mock cluster's host: a missing one must fail)

from kbroker.perf import fetch_latency


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fetch_latency_drives_the_mock_beside_kbroker(tmp_path, capsys):
    out = tmp_path / "fl.json"
    rc = fetch_latency.main(["--targets", "asyncio,mock", "--rounds", "1", "--count", "300",
                             "--max-seconds", "60", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert sorted(doc) == ["asyncio", "mock"]
    for name, by_depth in doc.items():
        assert sorted(by_depth) == [str(d) for d in fetch_latency.DEPTHS]
        for runs in by_depth.values():
            (run,) = runs
            for key in ("us_per_fetch", "fetches_per_s"):
                assert math.isfinite(run[key]) and run[key] > 0, (name, run)
    text = capsys.readouterr().out
    for d in fetch_latency.DEPTHS:
        assert f"depth {d} us_per_fetch asyncio" in text
        line = next(x for x in text.splitlines() if x.startswith(f"depth {d} us_per_fetch asyncio"))
        assert "÷ mock: median" in line, line


def test_unknown_target_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown target 'tansu'"):
        fetch_latency.make_targets(["tansu"], None, tmp_path)
    (mock,) = fetch_latency.make_targets(["mock"], None, tmp_path)
    assert mock.name == "mock" and mock.partitions == 4
