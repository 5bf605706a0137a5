"""A read task survives its partition leader's death: the range is fetched from the leader, the
leader is killed with SIGKILL between two fetches, and the task goes on from the new leader
(three brokers, RF 3, acks=all writes). Invariant: the task yields every offset of its range
exactly once (lost 0, duplicated 0), which the checker shows it can see on a damaged list."""
from __future__ import annotations

import asyncio
import signal

import pytest

from kbroker.testing import LocalCluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def offsets_violations(offsets, start, end):
    seen = set(offsets)
    return len(set(range(start, end)) - seen), len(offsets) - len(seen)


def test_checker_sees_violations():
    assert offsets_violations([0, 1, 2], 0, 3) == (0, 0)
    assert offsets_violations([0, 1, 1], 0, 3) == (1, 1)


def _leader(bootstrap, topic):
    from kbroker.client import Cluster

    async def go():
        c = Cluster(bootstrap)
        try:
            await c.wait_for_topic(topic)
            return c.leader_for(topic, 0)
        finally:
            await c.close()
    return asyncio.run(go())


def test_read_task_follows_a_leader_move(tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from kbroker.spark.kafka import read_range
    from kbroker.spark.options import ClientConfig

    with LocalCluster(tmp_path, brokers=3) as cluster:
        bs = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bs})
        admin.create_topics([NewTopic("failover", 1, 3, config={"min.insync.replicas": "2"})])["failover"].result(30)
        wait_until(lambda: _leader(bs, "failover") >= 0, timeout=30, what="a leader")
        p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 5})
        n = 20000
        for i in range(n):
            p.produce("failover", value=b"%06d" % i + b"x" * 200, partition=0)
            if i % 5000 == 0:
                p.poll(0)
        assert p.flush(60) == 0
        old = _leader(bs, "failover")
        # small fetches and batches: many round trips, so the kill lands between two of them
        client = ClientConfig(bs, max_partition_fetch_bytes=64 * 1024, retries=30, retry_backoff_ms=200)
        offsets, killed = [], False
        for rb in read_range(client, "failover", 0, 0, n, False, True, 1000, 1 << 20):
            offsets += rb.column("offset").to_pylist()
            if not killed and len(offsets) >= n // 4:
                cluster.kill(old, signal.SIGKILL)
                killed = True
        new = _leader(bs, "failover")
    lost, dup = offsets_violations(offsets, 0, n)
    print(f"leader {old} killed mid-range, new leader {new}: lost {lost}, duplicated {dup} of {n}")
    assert killed and new != old
    assert (lost, dup) == (0, 0)
    assert offsets == sorted(offsets)
