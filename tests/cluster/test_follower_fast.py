"""Followers' fetches on the native Fetch fast path (ext/request.pyx ``_fetch_fast`` with
replica_id >= 0, ``_record_followers``): three real brokers, a topic with replicas 0, 1, 2 led by 0, a
confluent-kafka producer with acks=all and a confluent-kafka consumer. The leader's
``kbroker_fetch_native_requests_total{path=fast|reference}`` counters show which path took the followers'
fetches (no consumer reads the leader while they are counted: every Fetch it gets is a follower's; a
caught-up follower's fetch recorded natively and long-polled by Python counts as neither).

Counter-checks (each broken on purpose, this file failed, then restored): followers refused by the
native path again (``return 0`` for replica_id >= 0: fast 0, reference > 0); the follower's position not
recorded on the native path (no HW move: the acks=all producer timed out).
tests/test_native_differential.py holds fast-on and fast-off answers and HWs to each other, byte for
byte; tests/test_replication.py (T1: leader killed repeatedly, acked-but-lost 0; T2: a follower killed,
the ISR shrinks and expands) runs with this path on (it is on by default).
"""
from __future__ import annotations

import threading
import time

import pytest

from checkers import LIST_OFFSETS, METADATA
from kbroker.testing import wait_until
from test_fetch_fast import Fetches
from test_produce_fast import (_part_leo, consume_values, leader_conn, produce_confluent, rf3_topic,  # noqa: F401
                               three)  # (three: the fixture)


def _isr(conn, topic):
    resp = conn.request(METADATA, 4, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    return sorted(resp["topics"][0]["partitions"][0]["isr_nodes"])


def _hw(conn, topic):
    resp = conn.request(LIST_OFFSETS, 1, {"replica_id": -1, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
    return resp["topics"][0]["partitions"][0]["offset"]


class _HwWatch:
    """While the block runs: the leader's HW read, then its ISR, then each ISR follower's log end on
    disk (_part_leo). A follower in the ISR after the HW was read held every offset below it when the
    HW got there (it was in the ISR then, or joined later at or past it), and logs only grow here: its
    log end must be >= that HW. ``samples``: checks made, ``bad``: the ones that failed."""

    def __init__(self, c, topic):
        self.c, self.topic = c, topic
        self.samples, self.bad = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def _run(self):
        deadline = time.monotonic() + 120       # bounded whatever the producer does
        with leader_conn(self.c, 0) as conn:
            while not self._stop.is_set() and time.monotonic() < deadline:
                hw = _hw(conn, self.topic)
                for bid in _isr(conn, self.topic):
                    if bid != 0:
                        leo = _part_leo(self.c, bid, self.topic, 0)
                        if leo < hw:
                            self.bad.append((bid, hw, leo))
                self.samples += 1
                self._stop.wait(0.01)


# n one-record acks=all requests, one in flight (each answered once the followers fetched it: the
# steady state of a replicated partition, two follower fetches per request); -> delivery errors
ACKS_ALL_ONE_IN_FLIGHT = {"acks": "all", "max.in.flight.requests.per.connection": 1, "message.timeout.ms": 60000}


def _full_isr_then_native(c, ports, topic, start, n, wait_s, what, min_fast, min_samples):
    """Once the ISR is [0, 1, 2]: n acks=all records from value-<start>, every one acknowledged; the
    leader's followers' fetches mostly native (fast > 4 x reference) and the HW never past an ISR follower's
    log end while they ran."""
    with leader_conn(c, 0) as conn:
        wait_until(lambda: _isr(conn, topic) == [0, 1, 2], wait_s, what)
    with Fetches(ports[0]) as d, _HwWatch(c, topic) as watch:
        assert produce_confluent(c.bootstrap, topic, n, start, **ACKS_ALL_ONE_IN_FLIGHT) == []
    assert d.fast > min_fast and d.fast > 4 * d.reference, (d.fast, d.reference)
    # the followers' own counter: answered or recorded natively, hardly ever left to Python (its
    # first fetches after a restart are the ISR expansion's)
    native = d.follower_fast + d.follower_polled
    assert d.follower_fast > min_fast and native > 10 * d.follower_reference, vars(d)
    assert watch.samples > min_samples and watch.bad == [], (watch.samples, watch.bad[:5])


@pytest.mark.slow
def test_rf3_followers_fetch_natively_acks_all_reads_back_and_isr_survives_a_follower_kill(three):
    """acks=all at RF=3: the followers' fetches are taken by the native path (fast > reference), the HW
    never passes an ISR follower's log end, everything reads back in order; a follower killed by PID
    leaves the ISR (produce goes on), restarted it catches up, rejoins the ISR and its fetches are
    native again; everything still reads back in order."""
    c, ports = three
    topic = rf3_topic(c)                # leader 0, replicas 0, 1, 2; one warm-up record
    _full_isr_then_native(c, ports, topic, 0, 400, 30, "full ISR", min_fast=100, min_samples=5)

    # a follower killed: the leader shrinks the ISR (replica.lag.time.max.ms 3000), acks=all goes on
    c.kill(2)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: _isr(conn, topic) == [0, 1], 60, "ISR without the killed follower")
    assert produce_confluent(c.bootstrap, topic, 100, 400, **ACKS_ALL_ONE_IN_FLIGHT) == []
    # restarted, it catches up and rejoins (its first fetches: Python's expansion), then is served
    # natively again
    c.start_broker(2)
    _full_isr_then_native(c, ports, topic, 500, 200, 60, "the restarted follower back in the ISR",
                          min_fast=50, min_samples=2)
    end = _part_leo(c, 0, topic, 0)
    assert end == 701
    for bid in (1, 2):
        wait_until(lambda b=bid: _part_leo(c, b, topic, 0) == end, 30, f"broker {bid} caught up")
    got = consume_values(c.bootstrap, topic, end)
    assert [o for o, _v, _t in got] == list(range(end))
    assert [v for _o, v, _t in got[1:]] == [b"value-%d" % i for i in range(700)]
