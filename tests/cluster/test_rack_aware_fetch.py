"""KIP-392 on 3 brokers in 3 racks with Kafka's RackAwareReplicaSelector: the leader names an in-sync
follower in a consumer's rack as its preferred read replica, followers serve Fetch v11+ consumers up to their
high watermark, and a confluent-kafka consumer with client.rack reads everything."""
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.protocol.api import ApiKey
from kbroker.protocol.errors import Errors
from kbroker.record import decode_records
from kbroker.testing import LocalCluster, wait_until

from checkers import RawConn, wait_for_topic

TOPIC = "racky"
N = 200
SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("rack-aware"), brokers=3, overrides={"replica.selector.class": SELECTOR})
    for b in c.brokers.values():
        b.extra["broker.rack"] = f"rack-{b.broker_id}"
    with c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 3)], operation_timeout=30)[TOPIC].result(30)
        wait_for_topic(c.bootstrap, TOPIC, 1)
        p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
        for i in range(N):
            p.produce(TOPIC, value=b"v%d" % i, partition=0)
        assert p.flush(30) == 0
        yield c


def _partition(c):
    with RawConn(c.bootstrap) as raw:
        r = raw.request(ApiKey.METADATA, 8, {"topics": [{"name": TOPIC}]})
    return r["topics"][0]["partitions"][0]


def _fetch(c, broker_id, version, rack, offset=0):
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "topics": [{"topic": TOPIC, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [], "rack_id": rack}
    with RawConn(f"127.0.0.1:{c.brokers[broker_id].port}") as raw:
        return raw.request(ApiKey.FETCH, version, body)["responses"][0]["partitions"][0]


def _offsets(p):
    return [r[0] for r in decode_records(bytes(p["records"]))] if p["records"] else []


def test_leader_names_the_follower_in_the_consumers_rack(cluster):
    part = _partition(cluster)
    leader = part["leader_id"]
    wait_until(lambda: len(_partition(cluster)["isr_nodes"]) == 3, 30, "full ISR")
    follower = next(r for r in part["replica_nodes"] if r != leader)
    # the followers' log ends are known to the leader after their next fetch
    wait_until(lambda: _fetch(cluster, leader, 11, f"rack-{follower}")["preferred_read_replica"] == follower,
               30, "preferred read replica")
    p = _fetch(cluster, leader, 11, f"rack-{follower}")
    assert (p["error_code"], p["high_watermark"], p["records"] or b"") == (0, N, b"")
    # the consumer in the leader's rack, without a rack or in an unknown one reads from the leader
    for rack in (f"rack-{leader}", "", "rack-elsewhere"):
        p = _fetch(cluster, leader, 11, rack)
        assert (p["error_code"], p["preferred_read_replica"]) == (0, -1)
        assert _offsets(p)[:1] == [0]


def test_a_follower_serves_v11_consumers_up_to_its_high_watermark(cluster):
    part = _partition(cluster)
    follower = next(r for r in part["replica_nodes"] if r != part["leader_id"])
    wait_until(lambda: _fetch(cluster, follower, 11, "")["high_watermark"] == N, 30, "follower's HW")
    p = _fetch(cluster, follower, 11, f"rack-{follower}")
    assert (p["error_code"], p["high_watermark"], p["preferred_read_replica"]) == (0, N, -1)
    assert _offsets(p)[0] == 0 and _offsets(p)[-1] < N
    # before v11 consumers read from the leader only
    assert _fetch(cluster, follower, 10, "")["error_code"] == Errors.NOT_LEADER_OR_FOLLOWER


def test_confluent_consumer_with_client_rack_reads_everything(cluster):
    part = _partition(cluster)
    follower = next(r for r in part["replica_nodes"] if r != part["leader_id"])
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "rack-g", "client.rack": f"rack-{follower}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < N and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got.append(m.offset())
    finally:
        consumer.close()
    assert got == list(range(N))
