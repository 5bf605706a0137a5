"""Client quotas (Kafka's ZooKeeper mode): set with ``kbroker configs`` and AlterClientQuotas, stored in
ZooKeeper in Kafka's JSON with a change notification, described (DescribeClientQuotas), and enforced
on real clients.

Invariants (the broker's windows are 2 x 1 s so a fresh client's allowance is about one second's
worth of its bound, then the average holds):
- a confluent-kafka producer over its producer_byte_rate is held within +-15% of the bound once past
  that first allowance, while an unthrottled producer on the same broker at the same time goes at
  least 3 times faster and its answers carry no throttle time;
- a confluent-kafka consumer over its consumer_byte_rate likewise, beside an unthrottled consumer
  reading the same topic; its upper bound adds what the windows let through at once (one idle window's
  worth and one whole fetch), since a fetch's bytes are counted only as its answer leaves.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kazoo.client import KazooClient

from kbroker.protocol import api
from kbroker.testing import LocalCluster, wait_until
from kbroker.zk.quotas import alter_entity
from checkers import RawConn

QUOTA = 256 * 1024            # bytes/s
VALUE = b"v" * 1024
WARMUP_S, RUN_S = 2.0, 6.0
WINDOWS = (2, 1)              # quota.window.num, quota.window.size.seconds
FETCH_MAX = 65536


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    overrides = {"quota.window.num": str(WINDOWS[0]), "quota.window.size.seconds": str(WINDOWS[1])}
    with LocalCluster(tmp_path_factory.mktemp("quotas"), brokers=1, overrides=overrides) as c:
        yield c


@pytest.fixture(scope="module")
def zk(cluster):
    client = KazooClient(hosts=cluster.zk_connect)
    client.start(10)
    yield client
    client.stop()
    client.close()


def _configs(cluster, *args) -> str:
    done = subprocess.run([sys.executable, "-m", "kbroker", "configs", "--bootstrap-server", cluster.bootstrap,
                           *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _produce_for(bootstrap, topic, client_id, seconds, out):
    """Produce 1 KiB records as fast as the client can for ``seconds``; out: [(ack time, bytes)]."""
    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, "acks": 1,
                  "batch.size": 16384})

    def acked(err, msg):
        if err is None:
            out.append((time.monotonic(), len(msg.value())))

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            p.produce(topic, VALUE, callback=acked)
        except BufferError:
            p.poll(0.01)
            continue
        p.poll(0)
    p.purge(in_queue=True)
    p.flush(10)


def _rate(samples, start, end) -> float:
    return sum(n for t, n in samples if start <= t < end) / (end - start)


def test_quota_stored_as_kafka_and_described(cluster, zk):
    out = _configs(cluster, "--entity-type", "users", "--entity-name", "al ice", "--entity-type", "clients",
                   "--entity-default", "--alter", "--add-config", "producer_byte_rate=1000,request_percentage=25")
    assert "Completed updating config" in out
    data, _ = zk.get("/config/users/al%20ice/clients/<default>")
    assert json.loads(data) == {"version": 1, "config": {"producer_byte_rate": "1000",
                                                         "request_percentage": "25.0"}}
    notes = [json.loads(zk.get(f"/config/changes/{c}")[0]) for c in zk.get_children("/config/changes")]
    assert {"version": 2, "entity_path": "users/al%20ice/clients/<default>"} in notes
    out = _configs(cluster, "--entity-type", "users", "--entity-name", "al ice", "--entity-type", "clients",
                   "--entity-default", "--describe")
    assert "Quota configs for user-principal 'al ice', the default client-id are " \
           "producer_byte_rate=1000.0, request_percentage=25.0" in out
    with RawConn(cluster.bootstrap) as c:       # any user with a client-id part: not strict
        resp = c.request(48, 0, {"components": [{"entity_type": "user", "match_type": 2, "match": None}],
                                 "strict": False})
    assert resp["entries"] == [{
        "entity": [{"entity_type": "user", "entity_name": "al ice"}, {"entity_type": "client-id", "entity_name": None}],
        "values": [{"key": "producer_byte_rate", "value": 1000.0}, {"key": "request_percentage", "value": 25.0}]}]
    _configs(cluster, "--entity-type", "users", "--entity-name", "al ice", "--entity-type", "clients",
             "--entity-default", "--alter", "--delete-config", "producer_byte_rate,request_percentage")
    with RawConn(cluster.bootstrap) as c:
        resp = c.request(48, 1, {"components": [{"entity_type": "user", "match_type": 0, "match": "al ice"}],
                                 "strict": False})
    assert resp["error_code"] == 0 and resp["entries"] == []
    # Kafka's answers to bad entries: one entry's error does not fail the others
    with RawConn(cluster.bootstrap) as c:
        resp = c.request(49, 0, {"entries": [
            {"entity": [{"entity_type": "user", "entity_name": "x"}],
             "ops": [{"key": "no_such_quota", "value": 1.0, "remove": False}]},
            {"entity": [{"entity_type": "client-id", "entity_name": "y"}],
             "ops": [{"key": "consumer_byte_rate", "value": -5.0, "remove": False}]},
            {"entity": [{"entity_type": "user", "entity_name": "x"}, {"entity_type": "user", "entity_name": "z"}],
             "ops": [{"key": "consumer_byte_rate", "value": 5.0, "remove": False}]},
            {"entity": [{"entity_type": "client-id", "entity_name": "y"}],
             "ops": [{"key": "consumer_byte_rate", "value": 5000.0, "remove": False}]}], "validate_only": True})
    assert [e["error_code"] for e in resp["entries"]] == [42, 42, 42, 0]
    assert not zk.exists("/config/clients/y")      # validate_only wrote nothing


def _produce_throttle_ms(bootstrap, client_id) -> int:
    """throttle_time_ms of an empty Produce v7 sent with ``client_id`` on a fresh connection."""
    with RawConn(bootstrap) as c:
        c.send(api.encode_request(0, 7, 1, client_id, {"transactional_id": None, "acks": 1, "timeout_ms": 5000,
                                                       "topic_data": []}))
        _cid, resp = api.decode_response(0, 7, c.recv_frame())
    return resp["throttle_time_ms"]


def test_a_change_written_to_zookeeper_applies_within_a_second(cluster, zk):
    """Written as another broker or Kafka's tools would (znode + notification), not through this broker's
    API: it learns of it from /config/changes."""
    assert _produce_throttle_ms(cluster.bootstrap, "zk-set") == 0
    alter_entity(zk, None, "zk-set", {"producer_byte_rate": "1"})
    t0 = time.monotonic()
    wait_until(lambda: _produce_throttle_ms(cluster.bootstrap, "zk-set") > 0, timeout=5, what="quota applied")
    assert time.monotonic() - t0 < 1.0
    alter_entity(zk, None, "zk-set", {}, ["producer_byte_rate"])
    wait_until(lambda: _produce_throttle_ms(cluster.bootstrap, "zk-set") == 0, timeout=5, what="quota removed")


def test_request_percentage_throttles_every_answer_that_can_say_so(cluster, zk):
    """request_percentage: handling time over the bound gives Metadata (not only Produce/Fetch) a
    throttle time, and the connection is muted: its next request waits about that long."""
    alter_entity(zk, None, "busy", {"request_percentage": "0.01"})    # 100 us of handling per second

    def metadata_throttle_ms():
        with RawConn(cluster.bootstrap) as c:
            c.send(api.encode_request(3, 8, 1, "busy", {"topics": None, "allow_auto_topic_creation": False,
                                                        "include_cluster_authorized_operations": False,
                                                        "include_topic_authorized_operations": False}))
            return api.decode_response(3, 8, c.recv_frame())[1]["throttle_time_ms"]
    try:
        wait_until(lambda: metadata_throttle_ms() > 0, timeout=5, what="request quota applied")
        with RawConn(cluster.bootstrap) as c:
            body = {"topics": None, "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
                    "include_topic_authorized_operations": False}
            c.send(api.encode_request(3, 8, 1, "busy", body))
            first = api.decode_response(3, 8, c.recv_frame())[1]["throttle_time_ms"]
            assert first > 0
            t0 = time.monotonic()
            c.send(api.encode_request(3, 8, 2, "busy", body))
            c.recv_frame(timeout=first / 1000 + 10)
            assert time.monotonic() - t0 >= 0.9 * min(first, 5000) / 1000     # muted meanwhile (KIP-219)
    finally:
        alter_entity(zk, None, "busy", {}, ["request_percentage"])


def test_producer_held_at_its_quota_beside_an_unthrottled_one(cluster):
    topic = f"pq-{uuid.uuid4().hex[:6]}"
    _configs(cluster, "--entity-type", "clients", "--entity-name", "throttled-producer", "--alter",
             "--add-config", f"producer_byte_rate={QUOTA}")
    held, free = [], []
    threads = [threading.Thread(target=_produce_for, args=(cluster.bootstrap, topic, cid, RUN_S, out))
               for cid, out in (("throttled-producer", held), ("free-producer", free))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    end = start + RUN_S
    held_rate = _rate(held, start + WARMUP_S, end)
    free_rate = _rate(free, start + WARMUP_S, end)
    print(f"throttled {held_rate / 1024:.0f} KiB/s (quota {QUOTA / 1024:.0f}), unthrottled {free_rate / 1024:.0f} KiB/s")
    assert 0.85 * QUOTA <= held_rate <= 1.15 * QUOTA, held_rate
    assert free_rate >= 3 * QUOTA, free_rate
    # the answers say so: the throttled client-id's Produce carries the throttle time, the other's none
    with RawConn(cluster.bootstrap) as c:
        c.request(18, 0, {})   # identifies the connection as "checkers": no quota
        body = {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": []}
        assert c.request(0, 7, body)["throttle_time_ms"] == 0


def test_consumer_held_at_its_quota_beside_an_unthrottled_one(cluster):
    topic = f"fq-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": cluster.bootstrap, "client.id": "loader", "linger.ms": 20,
                  "batch.size": 16384})
    total = 3 * QUOTA * int(RUN_S)
    for _ in range(total // len(VALUE)):
        while True:
            try:
                p.produce(topic, VALUE)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    del p
    _configs(cluster, "--entity-type", "clients", "--entity-name", "throttled-consumer", "--alter",
             "--add-config", f"consumer_byte_rate={QUOTA}")
    held, free = [], []

    def consume(client_id, out):
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "client.id": client_id, "group.id": f"g-{client_id}",
                      "enable.auto.commit": False, "fetch.max.bytes": FETCH_MAX, "message.max.bytes": FETCH_MAX,
                      "max.partition.fetch.bytes": FETCH_MAX,
                      "enable.partition.eof": False})
        c.assign([TopicPartition(topic, 0, 0)])
        end = time.monotonic() + RUN_S
        try:
            while time.monotonic() < end:
                m = c.poll(0.1)
                if m is not None and m.error() is None:
                    out.append((time.monotonic(), len(m.value())))
        finally:
            c.close()

    threads = [threading.Thread(target=consume, args=(cid, out))
               for cid, out in (("throttled-consumer", held), ("free-consumer", free))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    end = start + RUN_S
    held_rate = _rate(held, start + WARMUP_S, end)
    free_bytes = sum(n for _t, n in free)
    print(f"throttled {held_rate / 1024:.0f} KiB/s (quota {QUOTA / 1024:.0f}), unthrottled read {free_bytes} bytes")
    # Fetched bytes are counted when the answer leaves and a throttled Fetch answers nothing, so in any span
    # the broker can hand out its bound for the span plus what the older window left unused (up to one
    # window's worth when the client sat idle in it) plus one whole fetch: the upper bound allows that.
    span = RUN_S - WARMUP_S
    upper = (QUOTA * (span + WINDOWS[1] * (WINDOWS[0] - 1)) + FETCH_MAX) / span
    assert 0.85 * QUOTA <= held_rate <= upper, (held_rate, upper)
    # the unthrottled consumer read the whole topic, three times what the quota allows in that time
    assert free_bytes == total // len(VALUE) * len(VALUE)
