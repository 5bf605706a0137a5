"""Smoke test of perf/fetch_latency.py with librdkafka's mock cluster beside a kbroker (our
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


@pytest.mark.parametrize("mode", ["block", "epoll"])
def test_floor_server_answers_every_fetch_as_a_broker_would(mode):
    """The floor target passes request_bench's own answer checks (correlation id in order, one
    one-record batch at the asked offset, no error) at 1 and 8 in flight, for offsets it never saw."""
    from kbroker.perf.fetch_floor import FloorTarget
    from kbroker.perf.request_bench import fetch_run
    t = FloorTarget(mode)
    t.start()
    try:
        for depth in (1, 8):
            r = fetch_run(t.bootstrap, "floor-topic", t.pid, 1000 + depth, 400, 10, depth, 30.0)
            assert r["requests"] == 400 and 200 < r["response_bytes_max"] < 300, r
    finally:
        t.stop()
    assert t.proc is None


def test_floor_answers_only_complete_frames_and_patches_each():
    """Frames split across reads: only complete ones are answered, each with its own correlation id and
    offset (fetch_run's check would see a wrong one: the base offset is read back here the same way)."""
    from kbroker._native.batch import iter_batches
    from kbroker.perf import fetch_floor
    from kbroker.protocol.api import decode_response, encode_request

    def frame(corr, offset):
        return encode_request(1, 11, corr, "t", {
            "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": "x", "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "log_start_offset": -1,
                "partition_max_bytes": 200}]}]})
    template, at = fetch_floor.answer_template()
    data = bytearray(frame(7, 123) + frame(8, 1 << 33))
    out = bytearray()
    used = fetch_floor._answers(data, len(data) - 5, template, at, out)    # the second frame incomplete
    assert used == len(frame(7, 123)) and len(out) == len(template)
    out2 = bytearray()
    assert fetch_floor._answers(data[used:], len(data) - used, template, at, out2) == len(data) - used
    for answer, (corr, offset) in ((out, (7, 123)), (out2, (8, 1 << 33))):
        got_corr, body = decode_response(1, 11, memoryview(answer[4:]))
        (batch,) = iter_batches(body["responses"][0]["partitions"][0]["records"])
        assert (got_corr, batch.base_offset, batch.record_count) == (corr, offset, 1)
