"""The shape of scaleout_bench's summary and report from hand-made rounds (the bench itself starts three
brokers and two ZooKeepers: run by hand, `python -m kbroker.perf.scaleout_bench --quick`)."""
from __future__ import annotations

import json

from kbroker.perf import scaleout_bench


def _phase(mb, cores):
    return {"mb_per_s": mb, "brokers_cpu_cores": cores, "client_cpu_cores": 0.5, "kcat_cpu_cores": 0.6,
            "machine_busy_cores": 1.9}


def test_scaleout_summary_and_report(tmp_path):
    rounds = [{"one": {"produce": _phase(700, 0.9), "fetch": _phase(400, 0.5)},
               "two": {"produce": _phase(1050, 1.3), "fetch": _phase(520, 0.8)}},
              {"one": {"produce": _phase(600, 0.9), "fetch": _phase(400, 0.5)},
               "two": {"produce": _phase(1200, 1.3), "fetch": None}}]
    s = scaleout_bench.summarize(rounds)
    assert s["produce"]["ratio_two_over_one"]["values"] == [1.5, 2.0]
    assert s["produce"]["goal"]["met"] is True
    assert s["fetch"]["ratio_two_over_one"]["values"] == [1.3]
    assert s["fetch"]["goal"]["met"] is False
    doc = {"meta": {"command": "x", "finished_utc": "now", "config": {"rounds": 2, "batches": 8, "fetch_s": 1.0},
                    "wall_seconds": 1.0, "git_commit": "abc", "machine": {"nproc": 2}, "started_load_avg": [1, 1, 1],
                    "finished_load_avg": [1, 1, 1], "batch_bytes": 524_000, "records_per_batch": 500},
           "failures": [], "rounds": rounds, "summary": s}
    json.dumps(doc)
    scaleout_bench.write_markdown(tmp_path / "so.md", doc)
    md = (tmp_path / "so.md").read_text().splitlines()
    assert md[0].startswith("# Scale-out")
    assert sum(1 for line in md if line.startswith("| capacity produce |")) == 2
    assert any("**met**" in line for line in md) and any("**missed**" in line for line in md)
