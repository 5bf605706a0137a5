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
  worth and one whole fetch), since a fetch's bytes are counted only as its answer leaves;
- a Fetch answer counts whole (correlation id and body), as Kafka records it; a throttled full fetch
  makes no fetch session (session id 0), a throttled incremental one keeps its own;
- controller_mutation_rate (KIP-599): the versions that can say so (CreateTopics v6+, CreatePartitions
  v3+, DeleteTopics v5+) refuse a topic with THROTTLING_QUOTA_EXCEEDED once the token bucket is below
  zero and answer the time it takes to refill; older versions (confluent-kafka's) create every topic
  and are throttled by the debt.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kazoo.client import KazooClient

from kbroker.protocol import api
from kbroker.testing import LocalCluster, free_port, wait_until
from kbroker.zk.quotas import alter_entity
from checkers import RawConn

QUOTA = 256 * 1024            # bytes/s
VALUE = b"v" * 1024
WARMUP_S, RUN_S = 2.0, 6.0
WINDOWS = (2, 1)              # quota.window.num, quota.window.size.seconds
FETCH_MAX = 65536


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    overrides = {"quota.window.num": str(WINDOWS[0]), "quota.window.size.seconds": str(WINDOWS[1]),
                 "controller.quota.window.num": str(WINDOWS[0]),
                 "controller.quota.window.size.seconds": str(WINDOWS[1]),
                 "max.incremental.fetch.session.cache.slots": "1"}
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


def _list_offsets(n: int) -> tuple[int, int, dict]:
    return 2, 4, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "no-such-topic", "partitions": [{"partition_index": i, "current_leader_epoch": -1, "timestamp": -1}
                                                  for i in range(n)]}]}


# (API key, version, request body) of answers built in slices over loop turns and encoded on the heavy thread
# (ListOffsets over 2,000 partitions, CreateTopics over 500 topics, DescribeConfigs over 20 resources),
# and a ListOffsets over 256 KiB (decoded and answered off the loop as a whole)
OFF_LOOP = {
    "list_offsets_sliced": _list_offsets(2500),
    "list_offsets_large_request": _list_offsets(20000),
    "create_topics": (19, 4, {"topics": [{"name": f"never-{i}", "num_partitions": 1, "replication_factor": 1,
                                       "assignments": [], "configs": []} for i in range(600)],
                           "timeout_ms": 10000, "validate_only": True}),
    "describe_configs": (32, 3, {"resources": [{"resource_type": 2, "resource_name": f"no-topic-{i}",
                                             "configuration_keys": None} for i in range(200)],
                              "include_synonyms": True, "include_documentation": False}),
}


@pytest.mark.parametrize("what", sorted(OFF_LOOP))
def test_request_percentage_counts_answers_made_off_the_loop(cluster, zk, what):
    """The handling time of an answer built over several loop turns and encoded on the heavy thread
    counts in the request quota: a client sending only such requests under request_percentage=1 (10 ms
    of handling per second; their first call on the loop takes microseconds) gets throttle_time_ms > 0.
    Before, those answers skipped the quota and always said 0."""
    key, version, body = OFF_LOOP[what]
    client = f"offloop-{uuid.uuid4().hex[:6]}"
    alter_entity(zk, None, client, {"request_percentage": "1"})

    def throttle_ms():
        with RawConn(cluster.bootstrap, timeout=30) as c:    # a fresh connection: never a muted one
            c.send(api.encode_request(key, version, 7, client, body))
            return api.decode_response(key, version, c.recv_frame(timeout=30))[1]["throttle_time_ms"]
    try:
        wait_until(lambda: throttle_ms() > 0, timeout=15, what=f"a throttled {what} answer")
    finally:
        alter_entity(zk, None, client, {}, ["request_percentage"])


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


def _fetch_request(version, correlation, client_id, topic) -> bytes:
    return api.encode_request(1, version, correlation, client_id, {
        "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
        "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                    "partition_max_bytes": 1 << 20}]}]})


@pytest.mark.parametrize("newest", [False, True])
def test_fetch_quota_counts_the_whole_answer(cluster, newest):
    """Kafka records a Fetch answer's whole size (correlation id and body), not only its records. With a
    bound of 1 B/s over 2 x 1 s windows, the first answer's throttle time is (size - 1 - dt) s for the few
    ms dt between the client's first request and its answer, so it gives the size counted to the byte.
    Fetch v4, and the newest version the broker serves that names topics (up to 12: flexible)."""
    version = 4
    if newest:
        with RawConn(cluster.bootstrap) as c:
            served = {k["api_key"]: k["max_version"] for k in c.request(18, 0, {})["api_keys"]}
        version = min(served[1], 12)
    topic = f"fsz-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": cluster.bootstrap})
    p.produce(topic, VALUE)
    assert p.flush(30) == 0
    with RawConn(cluster.bootstrap) as c:       # client-id "checkers": no quota, the answer in full
        c.request(18, 0, {})
        c.send(_fetch_request(version, 1, "checkers", topic))
        frame = c.recv_frame()
    _cid, full = api.decode_response(1, version, frame)
    assert full["throttle_time_ms"] == 0 and full["responses"][0]["partitions"][0]["records"]
    kafka_size = len(frame) - (1 if version >= 12 else 0)      # less the flexible header's tag buffer
    client_id = f"one-byte-{version}-{uuid.uuid4().hex[:6]}"
    _configs(cluster, "--entity-type", "clients", "--entity-name", client_id, "--alter",
             "--add-config", "consumer_byte_rate=1")
    with RawConn(cluster.bootstrap) as c:
        c.send(_fetch_request(version, 1, client_id, topic))
        _cid, throttled = api.decode_response(1, version, c.recv_frame())
    assert throttled["responses"] == []         # throttled: answered empty, as Kafka
    counted = math.ceil(throttled["throttle_time_ms"] / 1000 + 1)
    assert abs(counted - kafka_size) <= 1, (counted, kafka_size)


def _session_fetch(client_id, topic, session_id, epoch, offset=0, listed=True) -> bytes:
    """Fetch v11 of partition 0 from ``offset`` (``listed``), in fetch session ``session_id`` at ``epoch``."""
    parts = [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": offset,
                                              "partition_max_bytes": 1 << 20}]}] if listed else []
    return api.encode_request(1, 11, 7, client_id, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": session_id, "session_epoch": epoch, "rack_id": "", "forgotten_topics_data": [],
        "topics": parts})


def test_a_throttled_full_fetch_makes_no_session_and_an_incremental_one_keeps_its_own(cluster):
    """Throttled Fetch answers and sessions (KIP-227), as Kafka: a full fetch (epoch 0) answers no
    partitions and session id 0, and makes no session (the broker keeps one session here: had it made
    one, the next full fetch would find no slot); an incremental fetch answers its session's id and no
    partitions, and the session stays (its next epoch is served, the records still to come)."""
    topic = f"fsq-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": cluster.bootstrap})
    p.produce(topic, VALUE)
    assert p.flush(30) == 0
    client_id = f"sess-throttled-{uuid.uuid4().hex[:6]}"
    _configs(cluster, "--entity-type", "clients", "--entity-name", client_id, "--alter",
             "--add-config", "consumer_byte_rate=1")

    def fetch(cid, *args, **kw):
        with RawConn(cluster.bootstrap) as c:       # a connection each: a throttled one is muted
            c.send(_session_fetch(cid, topic, *args, **kw))
            return api.decode_response(1, 11, c.recv_frame())[1]

    full = fetch(client_id, 0, 0)
    assert full["throttle_time_ms"] > 0 and full["responses"] == [] and full["session_id"] == 0
    made = fetch("checkers", 0, 0)              # client-id "checkers": no quota
    sid = made["session_id"]
    assert sid and made["throttle_time_ms"] == 0 and made["responses"][0]["partitions"][0]["records"]
    try:
        p.produce(topic, VALUE)
        assert p.flush(30) == 0
        inc = fetch(client_id, sid, 1, offset=1)
        assert inc["throttle_time_ms"] > 0 and inc["error_code"] == 0
        assert inc["responses"] == [] and inc["session_id"] == sid
        nxt = fetch("checkers", sid, 2, listed=False)
        assert nxt["error_code"] == 0 and nxt["session_id"] == sid
        assert [p["partition_index"] for t in nxt["responses"] for p in t["partitions"] if p["records"]] == [0]
    finally:
        fetch("checkers", sid, -1, listed=False)     # closed: the slot is free again


def test_a_fetch_throttled_by_the_request_quota_alone_is_answered_empty(cluster, zk):
    """A Fetch whose client is over its request_percentage (and has no byte-rate quota) is answered as
    Kafka answers a throttled one: throttle_time_ms and no partitions; the client's next Fetch after the
    quota is lifted reads the records."""
    topic = f"frq-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": cluster.bootstrap})
    p.produce(topic, VALUE)
    assert p.flush(30) == 0
    client_id = f"req-throttled-{uuid.uuid4().hex[:6]}"
    alter_entity(zk, None, client_id, {"request_percentage": "0.01"})     # 100 us of handling per second

    def fetch():
        with RawConn(cluster.bootstrap) as c:       # a connection each: a throttled one is muted
            c.send(_session_fetch(client_id, topic, 0, -1))
            return api.decode_response(1, 11, c.recv_frame(timeout=30))[1]
    try:
        wait_until(lambda: fetch()["throttle_time_ms"] > 0, timeout=10, what="request quota applied")
        throttled = fetch()
        assert throttled["throttle_time_ms"] > 0 and throttled["responses"] == [], throttled
    finally:
        alter_entity(zk, None, client_id, {}, ["request_percentage"])
    wait_until(lambda: fetch()["throttle_time_ms"] == 0, timeout=10, what="request quota lifted")
    served = fetch()
    assert [q["partition_index"] for t in served["responses"] for q in t["partitions"] if q["records"]] == [0]


MUTATION_RATE = 10      # partitions/s: a token bucket of WINDOWS[0] x WINDOWS[1] s x 10 = 20


def _raw(cluster, client_id, key, version, body, conn=None):
    own = conn is None
    conn = RawConn(cluster.bootstrap, timeout=60) if own else conn
    try:
        conn.send(api.encode_request(key, version, 1, client_id, body))
        return api.decode_response(key, version, conn.recv_frame(timeout=60))[1]
    finally:
        if own:
            conn.close()


def _new_topic(name, partitions):
    return {"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}


def _mutation_quota(cluster, client_id):
    _configs(cluster, "--entity-type", "clients", "--entity-name", client_id, "--alter",
             "--add-config", f"controller_mutation_rate={MUTATION_RATE}")


def test_strict_versions_refuse_topics_over_the_mutation_rate(cluster):
    a, b, c = (f"mq-{uuid.uuid4().hex[:6]}-{i}" for i in range(3))
    for cid in ("strict-creator", "strict-partitioner", "strict-deleter"):
        _mutation_quota(cluster, cid)
    # CreateTopics v6: 15 of 20 tokens, then 10 (the bucket goes below zero: allowed), then refused
    with RawConn(cluster.bootstrap, timeout=60) as conn:
        topics = [_new_topic(a, 15), _new_topic(b, 10), _new_topic(c, 1)]
        resp = _raw(cluster, "strict-creator", 19, 6, {"topics": topics, "timeout_ms": 30000, "validate_only": False},
                    conn)
        assert [(t["name"], t["error_code"]) for t in resp["topics"]] == [(a, 0), (b, 0), (c, 89)]
        assert resp["topics"][2]["error_message"] == "The throttling quota has been exceeded."
        ms = resp["throttle_time_ms"]
        assert 400 < ms <= 500, ms          # 5 partitions of debt at 10/s
        t0 = time.monotonic()
        assert _raw(cluster, "strict-creator", 18, 0, {}, conn)["error_code"] == 0
        assert time.monotonic() - t0 >= 0.9 * ms / 1000       # the connection was muted meanwhile
    with RawConn(cluster.bootstrap, timeout=60) as conn:        # no quota for client-id "checkers"
        assert conn.request(19, 6, {"topics": [_new_topic(c, 1)], "timeout_ms": 30000,
                                    "validate_only": False})["topics"][0]["error_code"] == 0
    # CreatePartitions v3: +15, +10, then +1 refused
    resp = _raw(cluster, "strict-partitioner", 37, 3, {"topics": [{"name": n, "count": k, "assignments": None}
                                                                  for n, k in ((a, 30), (b, 20), (c, 2))],
                                                       "timeout_ms": 30000, "validate_only": False})
    assert [(r["name"], r["error_code"]) for r in resp["results"]] == [(a, 0), (b, 0), (c, 89)]
    assert 400 < resp["throttle_time_ms"] <= 500
    # DeleteTopics v5: a's 30 partitions take the bucket to -10; b and c refused
    resp = _raw(cluster, "strict-deleter", 20, 5, {"topic_names": [a, b, c], "timeout_ms": 30000})
    assert [(r["name"], r["error_code"]) for r in resp["responses"]] == [(a, 0), (b, 89), (c, 89)]
    assert 900 < resp["throttle_time_ms"] <= 1000
    with RawConn(cluster.bootstrap) as conn:
        names = {t["name"] for t in conn.request(3, 8, {"topics": None, "allow_auto_topic_creation": False,
                                                       "include_cluster_authorized_operations": False,
                                                       "include_topic_authorized_operations": False})["topics"]}
    assert a not in names and {b, c} <= names


def test_older_versions_create_every_topic_and_are_throttled(cluster):
    """confluent-kafka's CreateTopics (a version before 6): nothing refused, the answer throttled by the
    debt (librdkafka reports it to throttle_cb) and the connection muted that long."""
    from confluent_kafka.admin import AdminClient, NewTopic
    _mutation_quota(cluster, "lenient-creator")
    throttles = []
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "client.id": "lenient-creator",
                         "throttle_cb": lambda e: throttles.append(e.throttle_time)})
    x, y = (f"mql-{uuid.uuid4().hex[:6]}-{i}" for i in range(2))
    admin.create_topics([NewTopic(x, 25, 1)], operation_timeout=30)[x].result(60)     # 20 - 25: 5 of debt
    answered = time.monotonic()
    # below zero again: between 5 and 30 of debt, as the bucket held -5 to 20 (it refills while the first
    # topic's leaders are elected: how far varies)
    admin.create_topics([NewTopic(y, 25, 1)], operation_timeout=30)[y].result(60)
    second = time.monotonic() - answered
    # librdkafka also reports the end of a throttle (0)
    wait_until(lambda: admin.poll(0.1) >= 0 and len([t for t in throttles if t > 0]) >= 2, timeout=10,
               what="throttles reported")
    first, again = [t for t in throttles if t > 0][:2]
    assert 0.4 < first <= 0.5 and 0.5 <= again <= 3.0, throttles
    assert second >= 0.9 * first     # muted from the first answer on (KIP-219)


def _served(bootstrap, source) -> tuple[bool, float]:
    """(whether a connection from ``source`` got its ApiVersions answer, seconds until answer or close)."""
    t0 = time.monotonic()
    try:
        with RawConn(bootstrap, timeout=10, source=source) as c:
            c.request(18, 0, {})
        return True, time.monotonic() - t0
    except OSError:             # ConnectionError included: closed without an answer
        return False, time.monotonic() - t0


def test_connection_rate_of_an_ip(cluster, zk):
    """KIP-612: connection_creation_rate of ips/<ip>, set with kbroker configs --entity-type ips: within
    the first second two connections from that address are served, the third is held for its throttle
    time and closed unserved; another address is served; removed, the bound is gone at once."""
    ip, other = "127.0.0.7", "127.0.0.8"
    out = _configs(cluster, "--entity-type", "ips", "--entity-name", ip, "--alter",
                   "--add-config", "connection_creation_rate=2")
    assert f"Completed updating config for ip {ip}." in out
    data, _ = zk.get(f"/config/ips/{ip}")
    assert json.loads(data) == {"version": 1, "config": {"connection_creation_rate": "2"}}
    assert f"Quota configs for ip '{ip}' are connection_creation_rate=2.0" in \
        _configs(cluster, "--entity-type", "ips", "--entity-name", ip, "--describe")
    try:
        got = [_served(cluster.bootstrap, ip) for _ in range(3)]
        assert [ok for ok, _s in got] == [True, True, False], got
        assert got[2][1] >= 0.3, got        # held (about 500 ms), not closed at once
        assert _served(cluster.bootstrap, other)[0]
        # an ip entity takes no other key, and no user or client-id beside it (Kafka's answers)
        with RawConn(cluster.bootstrap) as c:
            resp = c.request(49, 1, {"entries": [
                {"entity": [{"entity_type": "ip", "entity_name": ip}],
                 "ops": [{"key": "producer_byte_rate", "value": 5.0, "remove": False}]},
                {"entity": [{"entity_type": "ip", "entity_name": ip}, {"entity_type": "user", "entity_name": "u"}],
                 "ops": [{"key": "connection_creation_rate", "value": 5.0, "remove": False}]},
                {"entity": [{"entity_type": "ip", "entity_name": "not-an-ip"}],
                 "ops": [{"key": "connection_creation_rate", "value": 5.0, "remove": False}]}],
                "validate_only": True})
            assert [e["error_code"] for e in resp["entries"]] == [42, 42, 42]
            resp = c.request(48, 1, {"components": [{"entity_type": "ip", "match_type": 2, "match": None}],
                                     "strict": False})
            assert {"entity": [{"entity_type": "ip", "entity_name": ip}],
                    "values": [{"key": "connection_creation_rate", "value": 2.0}]} in resp["entries"]
    finally:
        _configs(cluster, "--entity-type", "ips", "--entity-name", ip, "--alter",
                 "--delete-config", "connection_creation_rate")
    assert all(_served(cluster.bootstrap, ip)[0] for _ in range(4))


@pytest.fixture(scope="module")
def rate_limited(tmp_path_factory):
    """Clients on CLIENT (the bootstrap port), brokers on REPLICATION (the inter-broker listener)."""
    overrides = {"quota.window.num": "2", "quota.window.size.seconds": "1", "max.connection.creation.rate": "5",
                 "listener.security.protocol.map": "CLIENT:PLAINTEXT,REPLICATION:PLAINTEXT",
                 "inter.broker.listener.name": "REPLICATION",
                 "listener.name.replication.max.connection.creation.rate": "1000"}
    c = LocalCluster(tmp_path_factory.mktemp("conn-rate"), brokers=1, overrides=overrides)
    b = c.brokers[0]
    c.replication = f"127.0.0.1:{free_port()}"
    b.extra = {"listeners": f"CLIENT://127.0.0.1:{b.port},REPLICATION://{c.replication}"}
    with c:
        yield c


def test_broker_wide_connection_rate_delays_and_serves(rate_limited):
    """max.connection.creation.rate=5: connections over it are served late, never refused; 12 connections
    take at least (12 - 5) / 5 s beyond the first second's allowance to be served."""
    t0 = time.monotonic()
    got = [_served(rate_limited.bootstrap, None) for _ in range(12)]
    spent = time.monotonic() - t0
    assert all(ok for ok, _s in got), got
    assert spent >= 1.0, spent
    assert max(s for _ok, s in got) >= 0.15, got     # one of them waited its throttle time


def _serve_many(bootstrap: str, n: int, first: threading.Event | None = None) -> float:
    """Seconds until ``n`` connections made one after another were each served (ApiVersions answered);
    ``first`` is set once the first one was."""
    t0 = time.monotonic()
    for i in range(n):
        ok, _spent = _served(bootstrap, None)
        assert ok
        if first is not None and i == 0:
            first.set()
    return time.monotonic() - t0


def _held_beside(held: str, free: str) -> dict[str, float]:
    """4 connections to ``held`` and, once the first of them was served (the next ones wait out the rate),
    4 to ``free``: the seconds each 4 took."""
    took, first = {}, threading.Event()
    t = threading.Thread(target=lambda: took.update(held=_serve_many(held, 4, first)))
    t.start()
    assert first.wait(30)
    took["free"] = _serve_many(free, 4)
    t.join(30)
    return took


def test_connection_rates_altered_at_run_time(rate_limited):
    """max.connection.creation.rate and listener.name.<l>.max.connection.creation.rate as Kafka's dynamic
    broker configs: set with IncrementalAlterConfigs on this broker (confluent-kafka's AdminClient) or
    <default> (kbroker configs --entity-default, as kafka-configs.sh), applied at once (no
    restart), shown by DescribeConfigs with their source. A listener's rate holds that listener alone (the
    other keeps accepting meanwhile) and binds the inter-broker listener too; the broker-wide one spares
    the inter-broker listener. 4 connections under a rate of 1/s take 2 s or more to be served; 4 on an
    unbound listener well under 1 s."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource
    c = rate_limited
    admin = AdminClient({"bootstrap.servers": c.bootstrap})

    def alter(name: str, key: str, value: str | None):
        if name == "":      # librdkafka refuses the default entity's empty name: kafka-configs.sh's way
            change = ["--add-config", f"{key}={value}"] if value is not None else ["--delete-config", key]
            _configs(c, "--entity-type", "brokers", "--entity-default", "--alter", *change)
            return
        op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
        res = ConfigResource("BROKER", name, incremental_configs=[ConfigEntry(key, value, incremental_operation=op)])
        admin.incremental_alter_configs([res])[res].result(30)

    def described():
        res = ConfigResource("BROKER", "0")
        return {k: (e.value, e.source) for k, e in admin.describe_configs([res])[res].result(30).items()}
    client_key, replication_key = "listener.name.client.max.connection.creation.rate", \
        "listener.name.replication.max.connection.creation.rate"
    static = {"max.connection.creation.rate": ("5", ConfigSource.STATIC_BROKER_CONFIG.value),
              replication_key: ("1000", ConfigSource.STATIC_BROKER_CONFIG.value)}
    assert static.items() <= described().items()
    try:
        # this broker's CLIENT listener at 1/s: held, while REPLICATION accepts meanwhile
        alter("0", client_key, "1")
        assert described()[client_key] == ("1", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        took = _held_beside(c.bootstrap, c.replication)
        assert took["held"] >= 2.0 and took["free"] < 1.0, took
        # the cluster default for REPLICATION (the inter-broker listener is bound by its own rate)
        alter("0", client_key, None)
        alter("", replication_key, "1")
        got = described()
        assert client_key not in got and got[replication_key] == ("1", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        assert _serve_many(c.replication, 4) >= 2.0
        assert _serve_many(c.bootstrap, 4) < 1.0
        # the broker-wide rate, this broker's: CLIENT held, REPLICATION (inter-broker) spared
        alter("", replication_key, None)
        alter("0", "max.connection.creation.rate", "1")
        assert described()["max.connection.creation.rate"] == ("1", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        took = _held_beside(c.bootstrap, c.replication)
        assert took["held"] >= 2.0 and took["free"] < 1.0, took
    finally:
        for name, key in (("0", client_key), ("", replication_key), ("0", "max.connection.creation.rate")):
            try:
                alter(name, key, None)
            except Exception:       # noqa: BLE001 - not set (the test failed before setting it)
                pass
    got = described()
    assert static.items() <= got.items() and client_key not in got


def test_dynamic_connection_rate_kept_across_a_restart(rate_limited):
    """A dynamic listener rate stored in /config/brokers/<default> binds the listener of a restarted broker
    (read back at start), and its removal frees it."""
    c = rate_limited
    key = "listener.name.replication.max.connection.creation.rate"
    _configs(c, "--entity-type", "brokers", "--entity-default", "--alter", "--add-config", f"{key}=1")
    try:
        c.stop_broker(0)
        c.start_broker(0)
        assert _serve_many(c.replication, 4) >= 2.0
    finally:
        _configs(c, "--entity-type", "brokers", "--entity-default", "--alter", "--delete-config", key)
    wait_until(lambda: _serve_many(c.replication, 4) < 1.0, timeout=10, what="the default rate removed")
