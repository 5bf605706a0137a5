"""Followers' fetches on the native Fetch fast path (issue 10; ext/request.pyx ``_fetch_fast`` with
replica_id >= 0, ``_record_followers``): three real brokers, a topic with replicas 0, 1, 2 led by 0, a
confluent-kafka producer with acks=all and a confluent-kafka consumer. The leader's
``kbroker_fetch_native_requests_total{path=fast|slow}`` counters show which path took the followers'
fetches (no consumer reads the leader while they are counted: every Fetch it gets is a follower's; a
caught-up follower's fetch recorded natively and long-polled by Python counts as neither).

Counter-checks (each broken on purpose, this file failed, then restored): followers refused by the
native path again (``return 0`` for replica_id >= 0: fast 0, slow > 0); the follower's position not
recorded on the native path (no HW move: the acks=all producer timed out).
tests/test_native_differential.py holds fast-on and fast-off answers and HWs to each other, byte for
byte; tests/test_replication.py (T1: leader killed repeatedly, acked-but-lost 0; T2: a follower killed,
the ISR shrinks and expands) runs with this path on (it is on by default).
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from checkers import LIST_OFFSETS, METADATA, RawConn
from kbroker.testing import wait_until
from test_fetch_fast import Fetches
from test_produce_fast import _part_leo, leader_conn, rf3_topic, three  # noqa: F401  (three: fixture)


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


def _produce_all(bootstrap, topic, start, n):
    """n one-record acks=all requests, one in flight (each answered once the followers fetched it: the
    steady state of a replicated partition, two follower fetches per request); -> delivery errors."""
    errors = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": "all",
                  "max.in.flight.requests.per.connection": 1, "message.timeout.ms": 60000})
    for i in range(start, start + n):
        p.produce(topic, key=b"k%d" % i, value=b"v-%d" % i, partition=0,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(90) == 0
    return errors


def _consume(bootstrap, topic, end, timeout=60.0):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "follow-" + uuid.uuid4().hex[:6],
                  "enable.auto.commit": False})
    out = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while len(out) < end and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                assert not m.error(), m.error()
                out.append((m.offset(), m.value()))
    finally:
        c.close()
    return out


@pytest.mark.slow
def test_rf3_followers_fetch_natively_acks_all_reads_back_and_isr_survives_a_follower_kill(three):
    """acks=all at RF=3: the followers' fetches are taken by the native path (fast > slow), the HW
    never passes an ISR follower's log end, everything reads back in order; a follower killed by PID
    leaves the ISR (produce goes on), restarted it catches up, rejoins the ISR and its fetches are
    native again; everything still reads back in order."""
    c, ports = three
    topic = rf3_topic(c)                # leader 0, replicas 0, 1, 2; one warm-up record
    with leader_conn(c, 0) as conn:
        wait_until(lambda: _isr(conn, topic) == [0, 1, 2], 30, "full ISR")
    with Fetches(ports[0]) as d, _HwWatch(c, topic) as watch:
        assert _produce_all(c.bootstrap, topic, 0, 400) == []
    assert d.fast > 100 and d.fast > 4 * d.slow, (d.fast, d.slow)
    assert watch.samples > 5 and watch.bad == [], (watch.samples, watch.bad[:5])

    # a follower killed: the leader shrinks the ISR (replica.lag.time.max.ms 3000), acks=all goes on
    c.kill(2)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: _isr(conn, topic) == [0, 1], 60, "ISR without the killed follower")
    assert _produce_all(c.bootstrap, topic, 400, 100) == []
    # restarted, it catches up and rejoins (its first fetches: Python's expansion), then is served
    # natively again
    c.start_broker(2)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: _isr(conn, topic) == [0, 1, 2], 60, "the restarted follower back in the ISR")
    with Fetches(ports[0]) as d2, _HwWatch(c, topic) as watch:
        assert _produce_all(c.bootstrap, topic, 500, 200) == []
    assert d2.fast > 50 and d2.fast > 4 * d2.slow, (d2.fast, d2.slow)
    assert watch.samples > 2 and watch.bad == [], (watch.samples, watch.bad[:5])
    end = _part_leo(c, 0, topic, 0)
    assert end == 701
    for bid in (1, 2):
        wait_until(lambda b=bid: _part_leo(c, b, topic, 0) == end, 30, f"broker {bid} caught up")
    got = _consume(c.bootstrap, topic, end)
    assert [o for o, _v in got] == list(range(end))
    assert [v for _o, v in got[1:]] == [b"v-%d" % i for i in range(700)]
