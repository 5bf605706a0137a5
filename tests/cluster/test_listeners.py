"""Named listeners as Kafka: every listener bound, every endpoint registered in Kafka's JSON, Metadata
answering each client with the addresses of the listener it came in on, replication and the
controller channel over the inter-broker listener.

Two brokers, each with INTERNAL on 127.0.0.1 (the inter-broker listener) and EXTERNAL on 127.0.0.2,
advertised under different hosts: clients bootstrapping on either address must be told only that
listener's addresses, and a topic with RF=2 replicates over INTERNAL.
"""
from __future__ import annotations

import json
import socket
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from kbroker.testing import LocalCluster, free_port, wait_until
from checkers import tcp_ports

EXTERNAL_HOST = "127.0.0.2"
TIMEOUT_S = 30


def _loopback_alias_works() -> bool:
    try:
        with socket.socket() as s:
            s.bind((EXTERNAL_HOST, 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _loopback_alias_works(), reason="127.0.0.2 cannot be bound here")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("listeners"), brokers=2,
                     overrides={"listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
                                "inter.broker.listener.name": "INTERNAL",
                                "offsets.topic.replication.factor": 1})
    c.external = {}
    for b in c.brokers.values():
        ext = free_port()
        c.external[b.broker_id] = ext
        b.extra = {"listeners": f"INTERNAL://127.0.0.1:{b.port},EXTERNAL://{EXTERNAL_HOST}:{ext}",
                   # the external listener advertised under a name of its own: clients that bootstrap
                   # there must be sent to that name, never to the internal address
                   "advertised.listeners": f"INTERNAL://127.0.0.1:{b.port},EXTERNAL://{EXTERNAL_HOST}:{ext}"}
    with c:
        yield c


def internal(c):
    return ",".join(f"127.0.0.1:{b.port}" for b in c.brokers.values())


def external(c):
    return ",".join(f"{EXTERNAL_HOST}:{p}" for p in c.external.values())


def test_registration_carries_every_endpoint(cluster):
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zk_connect, timeout=5)
    zk.start(timeout=5)
    try:
        for bid, b in cluster.brokers.items():
            data, _ = zk.get(f"/brokers/ids/{bid}")
            reg = json.loads(data)
            assert reg["endpoints"] == [f"INTERNAL://127.0.0.1:{b.port}",
                                        f"EXTERNAL://{EXTERNAL_HOST}:{cluster.external[bid]}"]
            assert reg["listener_security_protocol_map"] == {"INTERNAL": "PLAINTEXT", "EXTERNAL": "PLAINTEXT"}
            # Kafka's host/port fields: the first PLAINTEXT endpoint
            assert (reg["host"], reg["port"]) == ("127.0.0.1", b.port)
    finally:
        zk.stop()
        zk.close()


@pytest.mark.parametrize("side", ["internal", "external"])
def test_kafka_python_sees_its_listeners_addresses(cluster, side):
    bootstrap = internal(cluster) if side == "internal" else external(cluster)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        got = admin.describe_cluster()
        seen = {(b.get("node_id", b.get("broker_id")), b["host"], b["port"]) for b in got["brokers"]}
    finally:
        admin.close()
    if side == "internal":
        want = {(bid, "127.0.0.1", b.port) for bid, b in cluster.brokers.items()}
    else:
        want = {(bid, EXTERNAL_HOST, p) for bid, p in cluster.external.items()}
    assert seen == want


@pytest.mark.parametrize("side", ["internal", "external"])
def test_confluent_kafka_sees_its_listeners_addresses(cluster, side):
    bootstrap = internal(cluster) if side == "internal" else external(cluster)
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=TIMEOUT_S)
    seen = {(b.id, b.host, b.port) for b in md.brokers.values()}
    if side == "internal":
        want = {(bid, "127.0.0.1", b.port) for bid, b in cluster.brokers.items()}
    else:
        want = {(bid, EXTERNAL_HOST, p) for bid, p in cluster.external.items()}
    assert seen == want


def test_replication_over_the_inter_broker_listener(cluster):
    """RF=2 with acks=all through the external listener: the follower's fetches (and the controller's
    LeaderAndIsr that started them) go over INTERNAL; both replicas end in the ISR with every record."""
    topic = f"listeners-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": external(cluster)})
    admin.create_topics([NewTopic(topic, 1, 2)])[topic].result(TIMEOUT_S)
    p = Producer({"bootstrap.servers": external(cluster), "acks": "all"})
    for i in range(100):
        p.produce(topic, value=b"v%d" % i)
    assert p.flush(TIMEOUT_S) == 0

    def full_isr():
        t = admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic]
        part = t.partitions[0]
        return sorted(part.isrs) == [0, 1] and part

    wait_until(full_isr, TIMEOUT_S, "both replicas in the ISR")
    # kafka-python reads them back through the internal listener, confluent-kafka through the external one
    kc = KafkaConsumer(bootstrap_servers=internal(cluster), consumer_timeout_ms=10000, auto_offset_reset="earliest")
    tp = TopicPartition(topic, 0)
    kc.assign([tp])
    kc.seek_to_beginning(tp)
    values = [m.value for m in kc][:100]
    kc.close()
    assert values == [b"v%d" % i for i in range(100)]
    c = Consumer({"bootstrap.servers": external(cluster), "group.id": topic, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = []
    end = time.monotonic() + TIMEOUT_S
    while len(got) < 100 and time.monotonic() < end:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == [b"v%d" % i for i in range(100)]


def test_brokers_talk_over_the_internal_listener(cluster):
    """Follower fetches and controller requests leave each broker for the other broker's INTERNAL port,
    never for its EXTERNAL one (checked on the sockets the broker processes hold)."""
    topic = f"listeners-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": external(cluster)})
    admin.create_topics([NewTopic(topic, 2, 2)])[topic].result(TIMEOUT_S)
    for bid, b in cluster.brokers.items():
        other = cluster.brokers[1 - bid]
        ports = wait_until(lambda: (lambda p: p if other.port in p else None)(tcp_ports(b.pid, "01", remote=True)), TIMEOUT_S,
                           f"broker {bid} connected to broker {other.broker_id}'s internal listener")
        assert cluster.external[other.broker_id] not in ports
