"""The shape of the peer latency report (curve_latency.summarize, report.latency_section / plot_latency) from
hand-made per-round results; the curve itself runs in test_perf_curves and by hand (latency_peers --quick)."""
from __future__ import annotations

from kbroker.perf import curve_latency as CL
from kbroker.perf import report


def _pt(label, frac, rate, p99, ack_p99, fixed=False):
    return {"label": label, "fraction": frac, "fixed_rate": fixed, "offered_records_per_s": rate,
            "achieved_records_per_s": rate, "p50": p99 / 10, "p99": p99, "p99_9": p99 * 2, "max": p99 * 3,
            "ack_p50": ack_p99 / 10, "ack_p99": ack_p99, "broker_cpu_cores": 0.5, "producer_cpu_cores": 0.8,
            "consumer_cpu_cores": 0.2, "others_cpu_cores": 0.1, "lost": 0}


def _run(peak, points):
    return {"peak": {"records_per_s": peak}, "points": points, "notes": "hand-made", "pinned": None}


def test_latency_summary_compares_kbroker_and_mock_round_by_round():
    k = [_run(100_000, [_pt("50%", 0.5, 50_000, 4.0, 2.0), _pt("90%", 0.9, 90_000, 50.0, 40.0),
                        _pt("40,000/s", 0.4, 40_000, 3.0, 1.0, fixed=True),
                        _pt("80,000/s", 0.8, 80_000, 90.0, 90.0, fixed=True)]),
         _run(100_000, [_pt("50%", 0.5, 50_000, 8.0, 3.0), _pt("90%", 0.9, 90_000, 9.0, 9.0),
                        _pt("40,000/s", 0.4, 40_000, 2.0, 1.0, fixed=True),
                        _pt("80,000/s", 0.8, 80_000, 1.0, 1.0, fixed=True)])]
    m = [_run(200_000, [_pt("50%", 0.5, 100_000, 5.0, 2.0), _pt("90%", 0.9, 180_000, 5.0, 5.0),
                        _pt("40,000/s", 0.2, 40_000, 4.0, 2.0, fixed=True),
                        _pt("80,000/s", 0.4, 80_000, 5.0, 5.0, fixed=True)]),
         None]
    s = CL.summarize({"kbroker-shm": k, "mock": m})
    assert s["labels"] == ["50%", "90%", "40,000/s", "80,000/s"]
    assert s["targets"]["kbroker-shm"]["points"]["50%"]["p99"]["median"] == 6.0
    assert s["targets"]["mock"]["points"]["50%"]["p99"]["n"] == 1
    # only round 1 has both: 4.0 / 5.0
    assert s["peer"]["50%"]["p99"]["per_round"] == [0.8]
    goals = {g["goal"].split(",")[0]: g for g in s["goals"]}
    e2e, ack = goals["latency: end-to-end p99"], goals["latency: produce-ack p99"]
    # points up to 75% of kbroker's peak: 50% (0.8) and 40,000/s (0.75); 90% and 80,000/s are left out
    assert e2e["value"] == 0.8 and e2e["met"] is True and e2e["rounds_met"] == "1/1"
    assert ack["value"] == 1.0 and ack["met"] is True
    lines = report.latency_section(s, {"kbroker-shm": k, "mock": m}, "not run")
    assert lines[0].startswith("| target | point | offered rec/s | p50 ms | p99 ms |")
    assert any(line.startswith("| 40,000/s | 0.75 |") for line in lines), lines
    assert lines[0].count("|") == lines[2].count("|")


def test_latency_plot_is_a_png(tmp_path):
    k = [_run(100_000, [_pt("10%", 0.1, 10_000, 1.0, 0.5), _pt("20,000/s", 0.2, 20_000, 2.0, 1.0, fixed=True)])]
    assert report.plot_latency(tmp_path, CL.summarize({"kbroker-shm": k}), "today", "lat.png")
    assert (tmp_path / "lat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not report.plot_latency(tmp_path, CL.summarize({}), "today", "none.png")
