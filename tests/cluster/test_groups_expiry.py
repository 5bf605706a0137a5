"""offsets.retention.minutes: the offsets of a group without members expire (tombstones in
__consumer_offsets, so they stay gone after a broker restart); a Stable group keeps its offsets.
retention 1 minute (the smallest Kafka accepts), checked every second."""
import threading
import time
import uuid

import pytest

from kbroker.testing import LocalCluster, wait_until

from test_groups import coordinator_ready, create_topic, request


def fetch(bs, group):
    r = request(bs, 9, {"group_id": group, "topics": None}, 5)
    assert r["error_code"] == 0
    return {(t["name"], p["partition_index"]): p["committed_offset"] for t in r["topics"] for p in t["partitions"]}


@pytest.mark.slow
def test_empty_group_offsets_expire_and_stay_expired(tmp_path):
    overrides = {"offsets.topic.num.partitions": 2, "group.initial.rebalance.delay.ms": 0,
                 "offsets.retention.minutes": 1, "offsets.retention.check.interval.ms": 1000}
    with LocalCluster(tmp_path, brokers=1, num_partitions=1, overrides=overrides) as c:
        bs = c.bootstrap
        topic = f"exp-{uuid.uuid4().hex[:8]}"
        create_topic(bs, topic, 1)
        lone, active = f"lone-{uuid.uuid4().hex[:6]}", f"active-{uuid.uuid4().hex[:6]}"
        for g in (lone, active):
            wait_until(lambda: coordinator_ready(bs, g), 30, "coordinator")
        r = request(bs, 8, {"group_id": lone, "generation_id_or_member_epoch": -1, "member_id": "",
                            "topics": [{"name": topic, "partitions": [
                                {"partition_index": 0, "committed_offset": 3, "committed_metadata": ""}]}]}, 7)
        assert r["topics"][0]["partitions"][0]["error_code"] == 0
        t_commit = time.monotonic()

        from kafka import KafkaConsumer, TopicPartition
        from kafka.structs import OffsetAndMetadata
        stop = threading.Event()
        joined = threading.Event()

        def member():
            k = KafkaConsumer(topic, bootstrap_servers=bs, group_id=active, session_timeout_ms=6000,
                              heartbeat_interval_ms=1000, enable_auto_commit=False)
            try:
                while not stop.is_set():
                    k.poll(200)
                    if k.assignment() and not joined.is_set():
                        k.commit({TopicPartition(topic, 0): OffsetAndMetadata(1, "", -1)})
                        joined.set()
            finally:
                k.close()
        t = threading.Thread(target=member, daemon=True)
        t.start()
        try:
            wait_until(joined.is_set, 60, "active group member committed")
            assert fetch(bs, lone) == {(topic, 0): 3}
            wait_until(lambda: fetch(bs, lone) == {}, 90, "lone group's offsets expired")
            assert time.monotonic() - t_commit >= 55      # not before the retention (minus clock slack)
            assert fetch(bs, active) == {(topic, 0): 1}   # a Stable group keeps its offsets
        finally:
            stop.set()
            t.join(30)
        c.kill(0)
        c.start_broker(0)
        # Both groups' offsets partitions loaded (they may differ; a load answers 14 meanwhile).
        wait_until(lambda: coordinator_ready(bs, lone) and coordinator_ready(bs, active), 60,
                   "coordinator after restart")
        assert fetch(bs, lone) == {}                      # the tombstones were replayed
        assert fetch(bs, active) == {(topic, 0): 1}


def test_initial_rebalance_delay_gathers_the_first_members(tmp_path):
    """group.initial.rebalance.delay.ms: members joining an empty group within the delay form one
    generation together (one rebalance, not one per member), answered no earlier than the delay."""
    import asyncio

    from kbroker.client.connection import BrokerConnection
    from kbroker.client.group import encode_subscription
    delay_ms = 2000
    with LocalCluster(tmp_path, brokers=1, num_partitions=1,
                      overrides={"offsets.topic.num.partitions": 1, "group.initial.rebalance.delay.ms": delay_ms}) as c:
        bs = c.bootstrap
        group = "delayed"
        wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")

        async def join(i):
            await asyncio.sleep(0.3 * i)
            conn = await BrokerConnection.open("127.0.0.1", c.brokers[0].port)
            try:
                _, r = await conn.send(11, {"group_id": group, "session_timeout_ms": 6000,
                                            "rebalance_timeout_ms": 10000, "member_id": "",
                                            "protocol_type": "consumer",
                                            "protocols": [{"name": "range", "metadata": encode_subscription(["t"])}]},
                                       3, timeout=30)
                return r
            finally:
                conn.close()

        async def go():
            t0 = time.monotonic()
            rs = await asyncio.gather(*(join(i) for i in range(3)))
            return rs, time.monotonic() - t0
        rs, took = asyncio.run(go())
        assert [r["error_code"] for r in rs] == [0, 0, 0]
        assert {r["generation_id"] for r in rs} == {1}
        assert len(next(r for r in rs if r["leader"] == r["member_id"])["members"]) == 3
        assert took >= delay_ms / 1000
