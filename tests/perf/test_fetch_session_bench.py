"""Smoke test of the fetch session benchmark (perf/fetch_session_bench.py): one quick round on 40
partitions. No timing assertions (a quick run's CPU figures on a shared machine mean nothing): every
client's fetches are answered without errors, a session's incremental requests and answers are smaller
than the sessionless ones that list every partition, and the result is well formed."""
from __future__ import annotations

from kbroker.perf import fetch_session_bench


def test_one_round():
    lines = []
    res = fetch_session_bench.run(partitions=40, rounds=1, fetches=3, max_wait_ms=50, out=lines.append)
    (got,) = res["rounds"]
    for who in ("consumer", "follower"):
        sessionless, session = got[(who, False)], got[(who, True)]
        assert session["request_bytes"] * 10 < sessionless["request_bytes"], (who, got)
        assert session["answer_bytes"] * 10 < sessionless["answer_bytes"], (who, got)
        assert set(res["summary"][who]) >= {"median_ratio", "sessionless_us", "session_us"}
    assert lines[-1].startswith("follower: median")
