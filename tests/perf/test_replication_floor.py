"""perf/replication_floor.py: the acks=all floor is only a floor if its leader answers acks=all after
both followers hold the records, and acks=1 at once. A real producer (confluent-kafka) against the
floor's processes; a stopped follower must hold acks=all back (the check is shown able to fail)."""
from __future__ import annotations

import os
import signal

from confluent_kafka import Producer

from kbroker.perf.replication_floor import Floor


def produce(bootstrap, acks, n, wait_s):
    """-> (records acknowledged, records not acknowledged within wait_s, the producer)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0, "enable.idempotence": False,
                  "message.timeout.ms": 60000})
    acked = []
    for i in range(n):
        p.produce("floor", b"v%d" % i, partition=0, on_delivery=lambda e, m: e is None and acked.append(m.offset()))
    left = p.flush(wait_s)
    return acked, left, p


def test_acks_all_waits_for_both_followers_and_acks_1_does_not(tmp_path):
    with Floor(tmp_path) as f:
        acked, left, _p = produce(f.bootstrap, "all", 200, 30)
        assert (len(acked), left) == (200, 0)
        assert sorted(acked) == list(range(200))         # base offsets count records, in order
        follower = f.brokers[2].pid
        os.kill(follower, signal.SIGSTOP)
        try:
            acked1, left1, _p1 = produce(f.bootstrap, "1", 50, 30)
            assert (len(acked1), left1) == (50, 0)       # acks=1 needs no follower
            acked_all, left_all, p = produce(f.bootstrap, "all", 50, 1.0)
            assert (len(acked_all), left_all) == (0, 50)  # held back: one follower does not fetch
        finally:
            os.kill(follower, signal.SIGCONT)
        assert p.flush(30) == 0                          # the follower catches up: all acknowledged
    # each process appended what it received: the followers' files are the leader's
    logs = [(tmp_path / f"floor-{i}.log").read_bytes() for i in range(3)]
    assert len(logs[0]) > 300 * 15 and logs[1] == logs[0] and logs[2] == logs[0]   # 300 records, >= 15 B each
