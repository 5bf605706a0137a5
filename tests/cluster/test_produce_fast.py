"""The common Produce (one or several partitions) served without a Python frame (ext/request.pyx FastProduce,
kbroker/replica/manager.py ``_fast_refresh``): real brokers, real clients (confluent-kafka) and raw
requests. The broker's ``kbroker_produce_native_requests_total{path=fast|reference}`` counters show which
path served each Produce; every reason the native path must leave a request to Python is shown to do
so (and to give Python's answer), and the plain requests to be served natively again afterwards.

Counter-checks (each was broken on purpose and this file failed): arming a partition whose ISR is
larger than one for acks=-1 (the acks=all waiter test saw an answer before the followers had the
batch), skipping the disarm in become_follower together with the per-request epoch and config-identity guards
(the leadership move test saw the old leader append; with any one of the three left, it refuses),
dropping the consumers' notifier wake (the long-poll test waited for its max wait), ignoring the
log's config identity (LogAppendTime missing in the answer); refusing requests of more than one
partition (the keyed kafka-python/aiokafka producers, the RF=3 leaders and the write-behind run saw them
served by the reference path); not ending the write-behind run before a Fetch of the same chunk (the run test's fetch);
not handing the partitions after a failed write to append_records (the mid-request log-dir failure
answered the last partition "no error, offset -1").

Several partitions per request: librdkafka (2.16) sends one Produce per partition, so confluent-kafka
only shows the fast path keeps serving it; kafka-python and aiokafka carry every ready partition in one
request per broker.
"""
from __future__ import annotations

import os
import struct
import threading
import time
import urllib.request
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from checkers import (FETCH, PRODUCE, RawConn, all_batches, create_topic, end_offsets, metered_cluster, segment_files,
                      wait_for_topic)
from kbroker._native.crc import crc32c
from kbroker.testing import LocalCluster, free_port, wait_until
from kbroker.protocol.errors import Errors
from test_hostile_attacks import _batch, _record
from test_produce_diskfull import _fill, _fill_to_last_page, tmpfs  # noqa: F401 (tmpfs: the fixture)

NOT_LEADER_OR_FOLLOWER = Errors.NOT_LEADER_OR_FOLLOWER
MESSAGE_TOO_LARGE = Errors.MESSAGE_TOO_LARGE
INVALID_TOPIC_EXCEPTION = Errors.INVALID_TOPIC_EXCEPTION
UNKNOWN_TOPIC_OR_PARTITION = Errors.UNKNOWN_TOPIC_OR_PARTITION
KAFKA_STORAGE_ERROR = Errors.KAFKA_STORAGE_ERROR


def counts(port: int) -> dict:
    """{"fast": n, "reference": n} from the broker's metrics endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kbroker_produce_native_requests_total{"):
            path = line.split('path="', 1)[1].split('"', 1)[0]
            out[path] = int(float(line.rsplit(" ", 1)[1]))
    return out


class Delta:
    """Fast/reference Produce requests served between entering and leaving the block."""

    def __init__(self, port):
        self.port = port

    def __enter__(self):
        self.before = counts(self.port)
        return self

    def __exit__(self, *exc):
        after = counts(self.port)
        self.fast = after["fast"] - self.before["fast"]
        self.reference = after["reference"] - self.before["reference"]


def produce_raw(conn, topic, batch, acks=1, version=7, index=0, timeout_ms=10000):
    """-> the partition's answer dict (None for acks=0)."""
    body = {"transactional_id": None, "acks": acks, "timeout_ms": timeout_ms,
            "topic_data": [{"name": topic, "partition_data": [{"index": index, "records": batch}]}]}
    if acks == 0:
        from kbroker.protocol import api
        conn.send(api.encode_request(PRODUCE, version, 99, "fast-test", body))
        return None
    return conn.request(PRODUCE, version, body, timeout=30)["responses"][0]["partition_responses"][0]


def one(value=b"v", i=0, codec=0):
    return _batch(codec, [_record(i, b"k", value)])


def produce_confluent(bootstrap, topic, n, start=0, **conf):
    """n one-record Produce requests (linger 0, one record per batch), values value-<start>..; -> delivery
    errors."""
    errors = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": 1, **conf})
    for i in range(start, start + n):
        p.produce(topic, key=b"k%d" % i, value=b"value-%d" % i, partition=0,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(60) == 0
    return errors


def _room_for_one_batch(tmpfs):
    """The tmpfs filled to its last page, then ~100 KB freed: room for one 60 KB batch."""
    spare = os.path.join(tmpfs, "spare")
    with open(spare, "wb") as f:
        f.write(b"\0" * 100_000)
    _fill_to_last_page(tmpfs)
    os.unlink(spare)


def consume_values(bootstrap, topic, end, timeout=60.0):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fast-" + uuid.uuid4().hex[:6],
                  "enable.auto.commit": False})
    out = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while len(out) < end and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                assert not m.error(), m.error()
                out.append((m.offset(), m.value(), m.timestamp()))
    finally:
        c.close()
    return out


def alter_topic(bootstrap, topic, **config):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={k.replace("_", "."): str(v)
                                                                        for k, v in config.items()})
    for f in admin.alter_configs([res]).values():
        f.result(30)


def new_topic(c, config=None, warm=True):
    """A one-partition topic; ``warm``: one record appended first (the first append after creation
    may see a config the slot was not armed with and re-arm it: served by Python)."""
    name = f"fast-{uuid.uuid4().hex[:8]}"
    create_topic(c.bootstrap, name, 1, config)
    if warm:
        with RawConn(c.bootstrap) as conn:
            wait_until(lambda: produce_raw(conn, name, one())["error_code"] == 0, 30, "the first append")
    return name


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    with metered_cluster(tmp_path_factory, "fast") as cluster:
        yield cluster


# ---- RF=1 -------------------------------------------------------------------------------------------
def test_plain_produce_is_served_natively_and_reads_back(single):
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d:
        assert produce_confluent(c.bootstrap, topic, 300) == []
    # one may re-arm: the topic's config from its creation can reach the log after the warm-up append
    assert d.fast >= 299 and d.fast + d.reference == 300, (d.fast, d.reference)
    got = consume_values(c.bootstrap, topic, 301)
    assert [(o, v) for o, v, _ts in got[1:]] == [(i + 1, b"value-%d" % i) for i in range(300)]


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_every_version_and_acks_native(single, acks):
    """v3-8, acks 0/1/-1 (an ISR of this leader alone: answered at once): all native, offsets in order,
    and the answer carries what the reference path's would (base offset, no append time, log start)."""
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for i, version in enumerate(range(3, 9)):
            r = produce_raw(conn, topic, one(b"x%d" % i), acks=acks, version=version)
            if acks:
                assert r["error_code"] == 0 and r["base_offset"] == i + 1, r
                assert r["log_append_time_ms"] == -1
                if version >= 5:
                    assert r["log_start_offset"] == 0
        # acks=0 has no answer to wait for: the last request may still be in flight here
        wait_until(lambda: end_offsets(c.bootstrap, topic, 1) == {0: 7}, 30, "all six appended")
    assert d.fast == 6 and d.reference == 0, (d.fast, d.reference)


def test_idempotent_producer_native_in_steady_state(single):
    """confluent-kafka with enable.idempotence (acks=all): the producer's first batch (a new producer
    id) is Python's, its next ones in sequence are native; every record reads back once, in order."""
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d:
        assert produce_confluent(c.bootstrap, topic, 300, **{"enable.idempotence": True, "acks": "all"}) == []
    assert d.fast >= 290 and d.fast + d.reference == 300, (d.fast, d.reference)
    got = consume_values(c.bootstrap, topic, 301)
    assert [(o, v) for o, v, _ts in got[1:]] == [(i + 1, b"value-%d" % i) for i in range(300)]


def idem(batch, pid, epoch, seq):
    """``batch`` from producer ``pid`` (``epoch``) at sequence ``seq``, its CRC recomputed."""
    b = bytearray(batch)
    struct.pack_into(">qhi", b, 43, pid, epoch, seq)
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    return bytes(b)


def test_compressed_batch_validated_off_the_loop_takes_python_path(single):
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for i in range(5):
            assert produce_raw(conn, topic, one(b"z" * 500, codec=1))["error_code"] == 0
    assert d.reference == 5 and d.fast == 0, (d.fast, d.reference)
    assert [o for o, _v, _t in consume_values(c.bootstrap, topic, 6)] == list(range(6))


def test_flush_messages_one_takes_python_path(single):
    c, port = single
    topic = new_topic(c, {"flush.messages": 1}, warm=False)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for i in range(5):
            assert produce_raw(conn, topic, one())["error_code"] == 0
    assert d.reference == 5 and d.fast == 0, (d.fast, d.reference)


def test_config_changes_are_seen(single):
    """LogAppendTime in the answer, max.message.bytes refusing a batch, segment.bytes rolling: each
    after an AlterConfigs on a topic already served natively; plain appends stay native around them."""
    c, port = single
    topic = new_topic(c)
    with RawConn(c.bootstrap) as conn:
        assert produce_raw(conn, topic, one())["log_append_time_ms"] == -1
        alter_topic(c.bootstrap, topic, message_timestamp_type="LogAppendTime")
        wait_until(lambda: produce_raw(conn, topic, one())["log_append_time_ms"] > 0, 20, "LogAppendTime")
        with Delta(port) as d:
            before = int(time.time() * 1000)
            r = produce_raw(conn, topic, one())
        assert r["error_code"] == 0 and r["log_append_time_ms"] >= before - 1000, r
        assert d.fast == 1, (d.fast, d.reference)

        alter_topic(c.bootstrap, topic, max_message_bytes=2000)
        wait_until(lambda: produce_raw(conn, topic, one(b"m" * 3000))["error_code"] == MESSAGE_TOO_LARGE, 20,
                   "max.message.bytes")
        with Delta(port) as d:
            assert produce_raw(conn, topic, one(b"m" * 3000))["error_code"] == MESSAGE_TOO_LARGE
            assert produce_raw(conn, topic, one(b"s"))["error_code"] == 0
        assert (d.fast, d.reference) == (1, 1), (d.fast, d.reference)

        alter_topic(c.bootstrap, topic, segment_bytes=1024)
        wait_until(lambda: produce_raw(conn, topic, one(b"r" * 400))["error_code"] == 0 and
                   len(segment_files(c.brokers[0].data_dir, topic, 0)) > 1, 20, "a roll")
        with Delta(port) as d:
            for i in range(20):
                assert produce_raw(conn, topic, one(b"r" * 400))["error_code"] == 0
        # every other batch or so rolls (Python), the others append natively to the new segment
        assert d.fast >= 5 and d.reference >= 5 and d.fast + d.reference == 20, (d.fast, d.reference)
    end = end_offsets(c.bootstrap, topic, 1)[0]
    assert [o for o, _v, _t in consume_values(c.bootstrap, topic, end)] == list(range(end))


def test_internal_topic_rejected(single):
    c, port = single
    g = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "fast-int-" + uuid.uuid4().hex[:6]})
    try:
        topic = new_topic(c)
        g.subscribe([topic])
        wait_until(lambda: g.poll(0.2) is None and g.assignment(), 30, "a group assignment")
    finally:
        g.close()
    wait_for_topic(c.bootstrap, "__consumer_offsets", 50)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for index in range(50):
            r = produce_raw(conn, "__consumer_offsets", one(), index=index)
            assert r["error_code"] in (INVALID_TOPIC_EXCEPTION, NOT_LEADER_OR_FOLLOWER), r
    assert d.fast == 0 and d.reference == 50, (d.fast, d.reference)


def test_long_poll_woken_by_native_append(single):
    """A consumer's Fetch waiting at the log end (max wait 20 s) returns with the record a natively
    served Produce appended."""
    c, port = single
    topic = new_topic(c)
    result = {}

    def fetch():
        with RawConn(c.bootstrap, timeout=30) as f:
            t0 = time.monotonic()
            r = f.request(FETCH, 11, {"replica_id": -1, "max_wait_ms": 20000, "min_bytes": 1, "max_bytes": 1 << 20,
                                      "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                                          {"topic": topic, "partitions": [
                                              {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 1,
                                               "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                                      "forgotten_topics_data": [], "rack_id": ""}, timeout=30)
            result["waited"] = time.monotonic() - t0
            result["records"] = bytes(r["responses"][0]["partitions"][0]["records"] or b"")

    t = threading.Thread(target=fetch)
    t.start()
    time.sleep(1.0)             # the fetch is parked (nothing to read at offset 1)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        assert produce_raw(conn, topic, one(b"wake"))["error_code"] == 0
    t.join(40)
    assert d.fast == 1
    assert b"wake" in result["records"]
    assert result["waited"] < 15, result["waited"]      # woken, not timed out (20 s)


def test_topic_delete_and_recreate(single):
    c, port = single
    topic = new_topic(c)
    with RawConn(c.bootstrap) as conn:
        for _ in range(3):
            assert produce_raw(conn, topic, one())["error_code"] == 0
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.delete_topics([topic])[topic].result(30)
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == UNKNOWN_TOPIC_OR_PARTITION, 30,
                   "the topic gone")
        with Delta(port) as d:
            assert produce_raw(conn, topic, one())["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
        assert (d.fast, d.reference) == (0, 1)
    create_topic(c.bootstrap, topic, 1)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "the topic back")
        r = produce_raw(conn, topic, one())
    assert r["error_code"] == 0 and d.fast >= 1
    assert r["base_offset"] == end_offsets(c.bootstrap, topic, 1)[0] - 1


# ---- several partitions per request ----------------------------------------------------------------
def multi_topic(c, n, replicas=None):
    """An ``n``-partition topic (``replicas``: its replica assignment, leaders first), each partition
    warmed through its leader (see new_topic)."""
    name = f"multi-{uuid.uuid4().hex[:8]}"
    if replicas:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(name, n, replica_assignment=replicas)])[name].result(30)
    else:
        create_topic(c.bootstrap, name, n)
    wait_for_topic(c.bootstrap, name, n)
    for index in range(n):
        with leader_conn(c, replicas[index][0] if replicas else 0) as conn:
            wait_until(lambda: produce_raw(conn, name, one(), index=index)["error_code"] == 0, 30, "the first append")
    return name


def keyed_confluent(bootstrap, topic, n, acks=1, idempotent=False):
    acked = []
    # idempotent: small batches (else 3000 records leave in one batch per partition: no steady state)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all" if idempotent else acks,
                  "enable.idempotence": idempotent, "batch.num.messages": 20 if idempotent else 10000})
    for i in range(n):
        p.produce(topic, key=b"key-%d" % (i % 97), value=b"value-%d" % i,
                  on_delivery=lambda err, m: acked.append(err or (m.partition(), m.offset(), m.value())))
        p.poll(0)
    assert p.flush(60) == 0
    return acked


def keyed_kafka_python(bootstrap, topic, n, acks=1, idempotent=False):
    from kafka import KafkaProducer
    # kafka-python 3 makes acks="all" idempotent unless told not to
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all" if idempotent else acks,
                      enable_idempotence=idempotent, batch_size=512 if idempotent else 16384)
    try:
        futures = [(p.send(topic, key=b"key-%d" % (i % 97), value=b"value-%d" % i), b"value-%d" % i)
                   for i in range(n)]
        p.flush(60)
        return [(f.get(30).partition, f.get(30).offset, v) for f, v in futures]
    finally:
        p.close(10)


def keyed_aiokafka(bootstrap, topic, n, acks=1, idempotent=False):
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all" if idempotent else acks,
                             enable_idempotence=idempotent, max_batch_size=512 if idempotent else 16384)
        await p.start()
        try:
            futures = [(await p.send(topic, key=b"key-%d" % (i % 97), value=b"value-%d" % i), b"value-%d" % i)
                       for i in range(n)]
            return [(m.partition, m.offset, v) for m, v in [(await f, v) for f, v in futures]]
        finally:
            await p.stop()
    return asyncio.run(run())


def check_multi(c, topic, n_parts, acked, brokers=(0,), warm=1):
    """Every acknowledged record reads back at its offset, and each partition holds them in the order
    they were sent (after ``warm`` warm-up records, or {partition: warm-up records}); -> the number of
    batches the producer's requests stored (the warm-up ones left out)."""
    warm = warm if isinstance(warm, dict) else dict.fromkeys(range(n_parts), warm)
    assert all(type(a) is tuple for a in acked), [a for a in acked if type(a) is not tuple][:3]
    sent = {v: i for i, (_p, _o, v) in enumerate(acked)}
    by_part = {}
    for part, offset, v in acked:
        by_part.setdefault(part, []).append((offset, sent[v]))
    assert len(by_part) == n_parts, sorted(by_part)
    for part, rows in by_part.items():
        rows.sort()
        assert [o for o, _i in rows] == list(range(warm[part], len(rows) + warm[part])), part   # after the warm-up
        assert [i for _o, i in rows] == sorted(i for _o, i in rows), part       # in send order
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "multi-" + uuid.uuid4().hex[:6],
                     "enable.auto.commit": False})
    got = set()
    try:
        cons.assign([TopicPartition(topic, p, warm[p]) for p in range(n_parts)])
        deadline = time.monotonic() + 60
        while len(got) < len(acked) and time.monotonic() < deadline:
            for m in cons.consume(1000, timeout=0.5):
                assert not m.error(), m.error()
                got.add((m.partition(), m.offset(), m.value()))
    finally:
        cons.close()
    assert got == set(acked)
    batches = 0
    for part in range(n_parts):
        for bid in brokers:
            stored = all_batches(c.brokers[bid].data_dir, topic, part)
            if stored and stored[0][1].base_offset == 0:     # this broker leads or follows it
                batches += len(stored) - warm[part]
                break
    return batches


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_keyed_producer_several_partitions_native(single, client):
    """A client producing keyed records over 6 partitions with linger.ms=5 sends one request per
    broker carrying every partition with a batch: those requests are served natively (all of them,
    and fewer requests than stored batches), every record reads back in order per partition."""
    c, port = single
    topic = multi_topic(c, 6)
    produce = {"confluent": keyed_confluent, "kafka-python": keyed_kafka_python, "aiokafka": keyed_aiokafka}[client]
    with Delta(port) as d:
        acked = produce(c.bootstrap, topic, 3000)
    batches = check_multi(c, topic, 6, acked)
    assert d.reference == 0 and d.fast > 0, (d.fast, d.reference)
    if client != "confluent":       # librdkafka (2.16) sends one partition per Produce request
        assert batches >= 2 * d.fast, (batches, d.fast)   # two partitions or more per request, on average


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_idempotent_keyed_producer_several_partitions_native(single, client):
    """The keyed producers with idempotence on (acks=all): once each partition has the producer's first
    batch (Python's: a new producer id there), its requests are native; every record reads back exactly
    once, in order per partition."""
    c, port = single
    topic = multi_topic(c, 6)
    produce = {"confluent": keyed_confluent, "kafka-python": keyed_kafka_python, "aiokafka": keyed_aiokafka}[client]
    with Delta(port) as d:
        acked = produce(c.bootstrap, topic, 3000, idempotent=True)
    check_multi(c, topic, 6, acked)
    # confluent: one request per partition, the first of each Python's; the others carry several
    assert d.fast > 3 * d.reference and d.reference <= 8, (d.fast, d.reference)


def test_write_behind_run_over_several_partitions(single):
    """Produce frames of 6 partitions each, sent in one write (one receive chunk: a write-behind run)
    and followed by a Fetch in the same write: every frame served natively, answered with consecutive
    offsets per partition, and the Fetch (after the run ended) sees all of them."""
    from kbroker.protocol import api
    c, port = single
    topic = multi_topic(c, 6)
    frames = []
    for k in range(20):
        body = {"transactional_id": None, "acks": 1, "timeout_ms": 10000, "topic_data": [
            {"name": topic, "partition_data": [{"index": p, "records": one(b"wb-%d-%d" % (k, p))}
                                               for p in (5, 0, 3)]},
            {"name": topic, "partition_data": [{"index": p, "records": one(b"wb-%d-%d" % (k, p))}
                                               for p in (1, 4, 2)]}]}
        frames.append(api.encode_request(PRODUCE, 3 + k % 6, k + 1, "wb", body))
    fetch = api.encode_request(FETCH, 11, 999, "wb", {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{"partition": 4, "current_leader_epoch": -1, "fetch_offset": 1,
                                                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    with Delta(port) as d, RawConn(c.bootstrap, timeout=30) as conn:
        conn.send(b"".join(frames) + fetch)
        answers = [api.decode_response(PRODUCE, 3 + k % 6, conn.recv_frame(timeout=30))[1] for k in range(20)]
        fetched = api.decode_response(FETCH, 11, conn.recv_frame(timeout=30))[1]
    assert (d.fast, d.reference) == (20, 0), (d.fast, d.reference)
    for k, body in enumerate(answers):
        rows = [(t["name"], p["index"], p["error_code"], p["base_offset"])
                for t in body["responses"] for p in t["partition_responses"]]
        assert rows == [(topic, p, 0, k + 1) for p in (5, 0, 3, 1, 4, 2)], rows
    records = bytes(fetched["responses"][0]["partitions"][0]["records"])
    assert all(b"wb-%d-4" % k in records for k in range(20))
    for p in range(6):
        stored = [b for _path, b in all_batches(c.brokers[0].data_dir, topic, p)]
        assert [b.base_offset for b in stored] == list(range(21)), p


@pytest.mark.slow
def test_log_dir_failure(tmp_path, tmpfs):
    """A full log dir: a native append whose write fails answers KAFKA_STORAGE_ERROR (the Python
    finisher), the dir is then failing and appends take the reference path until one succeeds there;
    then they are native again. The log holds exactly the batches that were acknowledged."""
    port = free_port()
    with LocalCluster(tmp_path / "c", overrides={"kbroker.metrics.port": port,
                                                 "log.dirs": os.path.join(tmpfs, "data")}) as c:
        topic = new_topic(c)
        with RawConn(c.bootstrap, timeout=30) as conn:
            _fill(tmpfs)
            with Delta(port) as d:
                codes = [produce_raw(conn, topic, one(b"f" * 60_000))["error_code"] for _ in range(4)]
            assert codes == [KAFKA_STORAGE_ERROR] * 4, codes
            # the first: native, its write fails and Python's storage-failure finisher answers it
            # (counted reference); then the failing dir keeps the rest on the reference path
            assert (d.fast, d.reference) == (0, 4), (d.fast, d.reference)
            os.unlink(os.path.join(tmpfs, "ballast"))
            with Delta(port) as d:
                for _ in range(3):
                    assert produce_raw(conn, topic, one())["error_code"] == 0
            assert (d.fast, d.reference) == (2, 1), (d.fast, d.reference)
        assert end_offsets(c.bootstrap, topic, 1) == {0: 4}      # the warm-up record and these 3


@pytest.mark.slow
def test_log_dir_failure_idempotent(tmp_path, tmpfs):
    """An idempotent producer's native append whose write fails (a full log dir): KAFKA_STORAGE_ERROR
    and nothing recorded in producer state, so its retry, once there is room, is appended (not answered
    as a duplicate of the lost batch); the log holds exactly the acknowledged batches, in sequence."""
    port = free_port()
    with LocalCluster(tmp_path / "c", overrides={"kbroker.metrics.port": port,
                                                 "log.dirs": os.path.join(tmpfs, "data")}) as c:
        topic = new_topic(c)
        with RawConn(c.bootstrap, timeout=30) as conn:
            batches = [idem(one(b"i%d" % k + b"f" * (60_000 if k == 2 else 0)), 4242, 0, k) for k in range(4)]
            with Delta(port) as d:
                rows = [produce_raw(conn, topic, batches[k], acks=-1) for k in (0, 1)]
            assert [(r["error_code"], r["base_offset"]) for r in rows] == [(0, 1), (0, 2)], rows
            assert (d.fast, d.reference) == (1, 1), (d.fast, d.reference)        # the new producer id is Python's
            _fill(tmpfs)
            with Delta(port) as d:
                r = produce_raw(conn, topic, batches[2], acks=-1)
            assert r["error_code"] == KAFKA_STORAGE_ERROR and d.fast == 0, (r, d.fast, d.reference)
            os.unlink(os.path.join(tmpfs, "ballast"))
            rows = [produce_raw(conn, topic, batches[k], acks=-1) for k in (2, 2, 3)]
            # the retry appended at 3, its second retry answered from producer state, then the next in sequence
            assert [(r["error_code"], r["base_offset"]) for r in rows] == [(0, 3), (0, 3), (0, 4)], rows
        assert end_offsets(c.bootstrap, topic, 1) == {0: 5}
        values = [v for _o, v, _ts in consume_values(c.bootstrap, topic, 5)]
        assert [v[:2] for v in values[1:]] == [b"i0", b"i1", b"i2", b"i3"], values


def produce_multi(conn, topic, batches, acks=1):
    """One request carrying ``batches`` ({partition: batch}) -> [(partition, error code, base offset)]."""
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 10000, "topic_data": [
        {"name": topic, "partition_data": [{"index": p, "records": b} for p, b in batches.items()]}]}
    r = conn.request(PRODUCE, 7, body, timeout=30)
    return [(p["index"], p["error_code"], p["base_offset"]) for t in r["responses"] for p in t["partition_responses"]]


@pytest.mark.slow
def test_log_dir_failure_mid_request(tmp_path, tmpfs):
    """A log dir with room for one batch of three: the native path appends the first partition, the
    second's write fails (KAFKA_STORAGE_ERROR, Python's finisher, its log cut back) and the third goes
    through append_records (which fails it too); the answer keeps the request's order and the log holds
    exactly what was acknowledged. With room again, the dir's first success is Python's and the next
    request is native."""
    port = free_port()
    with LocalCluster(tmp_path / "c", overrides={"kbroker.metrics.port": port,
                                                 "log.dirs": os.path.join(tmpfs, "data")}) as c:
        topic = multi_topic(c, 3)
        with RawConn(c.bootstrap, timeout=30) as conn:
            _room_for_one_batch(tmpfs)
            with Delta(port) as d:
                rows = produce_multi(conn, topic, {p: one(b"f" * 60_000) for p in (0, 1, 2)})
            assert rows == [(0, 0, 1), (1, KAFKA_STORAGE_ERROR, -1), (2, KAFKA_STORAGE_ERROR, -1)], rows
            assert (d.fast, d.reference) == (0, 1), (d.fast, d.reference)
            os.unlink(os.path.join(tmpfs, "ballast"))
            with Delta(port) as d:
                for k in range(2):
                    rows = produce_multi(conn, topic, {p: one() for p in (2, 1, 0)})
                    assert rows == [(2, 0, 1 + k), (1, 0, 1 + k), (0, 0, 2 + k)], rows
            assert (d.fast, d.reference) == (1, 1), (d.fast, d.reference)
        assert end_offsets(c.bootstrap, topic, 3) == {0: 4, 1: 3, 2: 3}


@pytest.mark.slow
def test_log_dir_failure_mid_request_acks_all_rf3(tmp_path, tmpfs):
    """The mid-request write failure with acks=-1 on RF=3 partitions (the leader's log dir on a full
    tmpfs, room for one batch of three): the first partition, appended natively, waits for its
    followers (produce.fast_write_failed's DelayedProduce) and is answered with its offset once they
    have it; the second answers KAFKA_STORAGE_ERROR and the third fails in append_records, as on the
    reference path."""
    c = LocalCluster(tmp_path / "c", brokers=3, overrides={"replica.lag.time.max.ms": 3000})
    port = free_port()
    c.brokers[0].extra = {"kbroker.metrics.port": port, "log.dirs": os.path.join(tmpfs, "data")}
    with c:
        topic = multi_topic(c, 3, replicas=[[0, 1, 2], [0, 2, 1], [0, 1, 2]])
        for p in range(3):
            wait_until(lambda p=p: isr_of(c, topic, 0, p) == [0, 1, 2], 30, f"a full ISR of {p}")
        with leader_conn(c, 0) as conn:
            _room_for_one_batch(tmpfs)
            with Delta(port) as d:
                rows = produce_multi(conn, topic, {p: one(b"f" * 60_000) for p in (0, 1, 2)}, acks=-1)
            assert rows == [(0, 0, 1), (1, KAFKA_STORAGE_ERROR, -1), (2, KAFKA_STORAGE_ERROR, -1)], rows
            assert (d.fast, d.reference) == (0, 1), (d.fast, d.reference)
            for bid in (1, 2):                                      # answered once both followers had it
                assert _part_leo(c, bid, topic, 0) >= 2, bid
            os.unlink(os.path.join(tmpfs, "ballast"))


# ---- RF=3 -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def three(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("fast3"), brokers=3, overrides={"replica.lag.time.max.ms": 3000})
    ports = {}
    for bid, b in c.brokers.items():
        ports[bid] = free_port()
        b.extra = {"kbroker.metrics.port": ports[bid]}
    c.start()
    try:
        yield c, ports
    finally:
        c.stop()


def rf3_topic(c, min_isr=1, leader=0):
    name = f"fast3-{uuid.uuid4().hex[:8]}"
    replicas = [leader] + [b for b in (0, 1, 2) if b != leader]
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[replicas],
                                  config={"min.insync.replicas": str(min_isr)})])[name].result(30)
    wait_for_topic(c.bootstrap, name, 1)
    with leader_conn(c, leader) as conn:      # warm: see new_topic
        wait_until(lambda: produce_raw(conn, name, one())["error_code"] == 0, 30, "the first append")
    return name


def leader_conn(c, bid):
    return RawConn(f"127.0.0.1:{c.brokers[bid].port}", timeout=30)


@pytest.mark.slow
def test_rf3_leader_native_followers_replicate(three):
    c, ports = three
    topic = rf3_topic(c)
    with Delta(ports[0]) as d, leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "leader ready")
        for i in range(30):
            assert produce_raw(conn, topic, one(b"r%d" % i))["error_code"] == 0
    assert d.fast >= 30, (d.fast, d.reference)
    # followers' long polls were woken: every replica's log reaches the leader's end
    for bid in (1, 2):
        wait_until(lambda b=bid: _leo(c, b, topic) == _leo(c, 0, topic), 30, f"broker {bid} replicated")


def _leo(c, bid, topic):
    return _part_leo(c, bid, topic, 0)


@pytest.mark.slow
def test_rf3_leaders_several_partitions_acks1(three):
    """9 partitions led by the three brokers in turn (RF=3), a keyed kafka-python producer, acks=1:
    each leader serves its requests of several partitions natively, the followers replicate them."""
    c, ports = three
    replicas = [[p % 3, (p + 1) % 3, (p + 2) % 3] for p in range(9)]
    topic = multi_topic(c, 9, replicas=replicas)
    deltas = [Delta(ports[bid]) for bid in (0, 1, 2)]
    for d in deltas:
        d.__enter__()
    acked = keyed_kafka_python(c.bootstrap, topic, 3000)
    for d in deltas:
        d.__exit__(None, None, None)
    batches = check_multi(c, topic, 9, acked, brokers=(0, 1, 2))
    # a leader may leave a request or so to Python while its followers join the ISR (as rf3_topic's)
    fast, reference = sum(d.fast for d in deltas), sum(d.reference for d in deltas)
    assert all(d.fast > 0 for d in deltas) and reference <= 3, [(d.fast, d.reference) for d in deltas]
    assert batches > 1.5 * (fast + reference), (batches, fast, reference)     # each broker leads three partitions
    for p in range(9):
        leader = replicas[p][0]
        end = [b for _path, b in all_batches(c.brokers[leader].data_dir, topic, p)][-1].last_offset + 1
        for bid in replicas[p][1:]:
            wait_until(lambda b=bid: _part_leo(c, b, topic, p) == end, 30, f"broker {bid} replicated {p}")


def _part_leo(c, bid, topic, p):
    batches = all_batches(c.brokers[bid].data_dir, topic, p)
    return batches[-1][1].last_offset + 1 if batches else 0


@pytest.mark.slow
def test_rf3_acks_all_waits_for_followers(three):
    """acks=-1 with an ISR of three: served natively (a ParkedProduce), answered once the followers
    have it."""
    c, ports = three
    topic = rf3_topic(c)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one(), acks=-1)["error_code"] == 0, 30, "leader ready")
        with Delta(ports[0]) as d:
            r = produce_raw(conn, topic, one(b"all"), acks=-1)
        assert r["error_code"] == 0
        assert (d.fast, d.reference) == (1, 0), (d.fast, d.reference)
        for bid in (1, 2):
            assert _leo(c, bid, topic) >= r["base_offset"] + 1
        with Delta(ports[0]) as d:
            assert produce_raw(conn, topic, one(), acks=1)["error_code"] == 0
        assert (d.fast, d.reference) == (1, 0)


@pytest.mark.slow
def test_rf3_isr_shrink_arms_acks_all(three):
    """An ISR shrinking to the leader alone (followers stopped, min.insync.replicas=1): acks=-1 is then
    answered natively at once; the followers back in the ISR: acks=-1 waits for them again (natively)."""
    c, ports = three
    topic = rf3_topic(c)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one(), acks=-1)["error_code"] == 0, 30, "leader ready")
        for bid in (1, 2):
            os.kill(c.brokers[bid].pid, 19)       # SIGSTOP
        try:
            def shrunk():
                with Delta(ports[0]) as d:
                    r = produce_raw(conn, topic, one(), acks=-1)
                return r["error_code"] == 0 and d.fast == 1
            wait_until(shrunk, 40, "acks=-1 served natively after the ISR shrank")
        finally:
            for bid in (1, 2):
                os.kill(c.brokers[bid].pid, 18)   # SIGCONT

        wait_until(lambda: isr_of(c, topic) == [0, 1, 2], 60, "the followers back in the ISR")
        with Delta(ports[0]) as d:
            r = produce_raw(conn, topic, one(), acks=-1)
        assert r["error_code"] == 0 and (d.fast, d.reference) == (1, 0), (r, d.fast, d.reference)
        for bid in (1, 2):          # answered only once both had it
            assert _leo(c, bid, topic) >= r["base_offset"] + 1


@pytest.mark.slow
def test_rf3_leadership_move(three):
    """The preferred leader takes the partition back (ElectLeaders): the old leader, still running,
    answers NOT_LEADER_OR_FOLLOWER (its slot disarmed), the new one serves natively, epoch bumped."""
    from confluent_kafka import ElectionType
    c, ports = three
    topic = rf3_topic(c, leader=1)
    with leader_conn(c, 1) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "leader ready")
    # broker 1 steps down (controlled shutdown) and comes back as a follower: broker 0 leads
    c.stop_broker(1)
    c.start_broker(1)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "broker 0 leads")
        with Delta(ports[0]) as d:
            assert produce_raw(conn, topic, one())["error_code"] == 0
        assert d.fast == 1
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    seen = []

    def elected():
        try:
            errors = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(30)
        except Exception as e:
            errors = {None: e}
        errors = {tp: e for tp, e in errors.items() if e is not None}
        if errors:                  # e.g. the preferred replica not yet back in the ISR
            seen.append(repr(errors))
            time.sleep(0.5)
            return False
        return True
    try:
        wait_until(elected, 60, "the preferred leader elected")
    except TimeoutError:
        raise AssertionError(seen[-3:]) from None
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == NOT_LEADER_OR_FOLLOWER, 30,
                   "the old leader refuses")
        with Delta(ports[0]) as d:
            assert produce_raw(conn, topic, one())["error_code"] == NOT_LEADER_OR_FOLLOWER
        assert (d.fast, d.reference) == (0, 1)
    with leader_conn(c, 1) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "the new leader")
        with Delta(ports[1]) as d:
            r = produce_raw(conn, topic, one())
        assert r["error_code"] == 0 and d.fast == 1
    # the batches the new leader stamped carry its (bumped) epoch
    batches = [b for _p, b in all_batches(c.brokers[1].data_dir, topic, 0)]
    assert batches[-1].last_offset == r["base_offset"]
    epochs = [b.leader_epoch for b in batches]
    assert epochs == sorted(epochs) and epochs[-1] > epochs[0], epochs


# ---- acks=-1 with followers: appended natively, parked until the HW covers it (ParkedProduce) ----------
REQUEST_TIMED_OUT = Errors.REQUEST_TIMED_OUT
NOT_ENOUGH_REPLICAS = Errors.NOT_ENOUGH_REPLICAS
NOT_ENOUGH_REPLICAS_AFTER_APPEND = Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def _metadata(c, bid, topic):
    from checkers import METADATA
    with leader_conn(c, bid) as conn:
        return conn.request(METADATA, 8, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                          "include_cluster_authorized_operations": False,
                                          "include_topic_authorized_operations": False})


def isr_of(c, topic, bid=0, partition=0):
    """The ISR of ``topic``-``partition`` as broker ``bid`` (its leader: its cache follows its own ISR
    writes) says."""
    for t in _metadata(c, bid, topic)["topics"]:
        for p in t["partitions"]:
            if p["partition_index"] == partition:
                return sorted(p["isr_nodes"])
    return None


def _fast_once(conn, port, topic, index):
    """One acks=-1 record to ``topic``-``index`` -> whether it was appended by the native path."""
    with Delta(port) as d:
        r = produce_raw(conn, topic, one(), acks=-1, index=index)
    return r["error_code"] == 0 and d.fast == 1


def _failed_row(r, code):
    """A failed acks=-1 row as Python's path answers it: no offset, append time or log start."""
    return (r["error_code"], r["base_offset"], r["log_append_time_ms"], r["log_start_offset"],
            r.get("error_message")) == (code, -1, -1, -1, None)


def _send_parked(conn, topic, batch, timeout_ms, correlation=4242):
    """An acks=-1 Produce v8 sent without waiting for its answer (read it with _parked_answer)."""
    from kbroker.protocol import api
    body = {"transactional_id": None, "acks": -1, "timeout_ms": timeout_ms,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}
    conn.send(api.encode_request(PRODUCE, 8, correlation, "parked", body))


def _parked_answer(conn, timeout=40):
    from kbroker.protocol import api
    _cid, body = api.decode_response(PRODUCE, 8, conn.recv_frame(timeout=timeout))
    return body["responses"][0]["partition_responses"][0]


@pytest.mark.slow
def test_rf3_confluent_default_acks_all_native(three):
    """confluent-kafka with its defaults (acks=all, not idempotent) to an RF=3 leader: every record
    acknowledged, read back at its offset, and the leader served every request natively."""
    c, ports = three
    topic = rf3_topic(c)
    n = 300
    acked = []
    p = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    assert p.list_topics(topic, timeout=10).topics[topic].error is None
    with Delta(ports[0]) as d:
        for i in range(n):
            p.produce(topic, value=b"all-%d" % i, partition=0,
                      on_delivery=lambda err, m: acked.append(err or (m.offset(), m.value())))
            p.poll(0)
        assert p.flush(60) == 0
    assert all(type(a) is tuple for a in acked) and len(acked) == n, [a for a in acked if type(a) is not tuple][:3]
    assert d.fast >= n and d.reference == 0, (d.fast, d.reference)
    got = {(o, v) for o, v, _ts in consume_values(c.bootstrap, topic, n + 1)}
    assert set(acked) <= got
    for bid in (1, 2):
        assert _leo(c, bid, topic) >= max(o for o, _v in acked) + 1


@pytest.mark.slow
def test_rf3_acks_all_follower_answers_are_their_own(three):
    """Invariant: every answer a follower reads on its fetch connection is the answer to its own request
    (mismatched correlation ids counted in the followers' logs: 0). A follower's fast fetch that moves
    the HW decides parked acks=all produces, whose answers are encoded meanwhile; when both shared one
    buffer, the follower got the produce answer (seen: 3 mismatches and a 1 s fetch backoff each, in 3 s)."""
    c, ports = three
    topic = rf3_topic(c, min_isr=2)
    n, step, per = 10000, 0.005, 25          # 5,000 records/s, one small request each few: followers park
    acked = []
    p = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0, "acks": "all", "enable.idempotence": False})
    assert p.list_topics(topic, timeout=10).topics[topic].error is None
    due = time.monotonic()
    for i in range(0, n, per):
        for j in range(per):
            p.produce(topic, value=b"own-%d" % (i + j), partition=0, on_delivery=lambda err, m: acked.append(err))
        due += step
        while (left := due - time.monotonic()) > 0:
            p.poll(left)
    assert p.flush(60) == 0
    assert acked.count(None) == n, [a for a in acked if a is not None][:3]
    mismatched = [line for bid in (1, 2) for line in c.brokers[bid].log_path.read_text(errors="replace").splitlines()
                  if "correlation id" in line and "expected" in line]
    assert mismatched == [], mismatched[:3]


@pytest.mark.slow
@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_rf3_keyed_acks_all_several_partitions_native(three, client):
    """Keyed acks=all producers over 6 RF=3 partitions led by the three brokers in turn: every record
    acknowledged and read back at its offset, in order; each leader parks its requests of several
    partitions natively."""
    c, ports = three
    replicas = [[p % 3, (p + 1) % 3, (p + 2) % 3] for p in range(6)]
    topic = multi_topic(c, 6, replicas=replicas)
    for p in range(6):
        wait_until(lambda p=p: isr_of(c, topic, replicas[p][0], p) == [0, 1, 2], 30, f"a full ISR of {p}")
        # settled: a late config znode event re-arms a new topic's slot once (see new_topic)
        with leader_conn(c, replicas[p][0]) as conn:
            wait_until(lambda p=p: _fast_once(conn, ports[replicas[p][0]], topic, p), 30, f"{p} served natively")
    warm = {p: _part_leo(c, replicas[p][0], topic, p) for p in range(6)}
    deltas = [Delta(ports[bid]) for bid in (0, 1, 2)]
    for d in deltas:
        d.__enter__()
    acks = -1 if client == "confluent" else "all"
    acked = {"confluent": keyed_confluent, "kafka-python": keyed_kafka_python,
             "aiokafka": keyed_aiokafka}[client](c.bootstrap, topic, 1500, acks=acks)
    for d in deltas:
        d.__exit__(None, None, None)
    check_multi(c, topic, 6, acked, brokers=(0, 1, 2), warm=warm)
    assert all(d.fast > 0 for d in deltas) and sum(d.reference for d in deltas) == 0, [(d.fast, d.reference) for d in deltas]


@pytest.mark.slow
def test_rf3_acks_all_timeout_and_not_enough_replicas_after_append(three):
    """A follower paused (SIGSTOP): a parked acks=-1 request whose timeout passes first answers
    REQUEST_TIMED_OUT; with min.insync.replicas=3 one still parked when the ISR shrinks answers
    NOT_ENOUGH_REPLICAS_AFTER_APPEND (both as DelayedProduce decides, no offset); the next request is
    refused NOT_ENOUGH_REPLICAS before any append, by Python; the follower back: served natively."""
    c, ports = three
    topic = rf3_topic(c, min_isr=3)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one(), acks=-1)["error_code"] == 0, 30, "leader ready")
        wait_until(lambda: isr_of(c, topic) == [0, 1, 2], 30, "a full ISR")
        end = _leo(c, 0, topic)
        os.kill(c.brokers[2].pid, 19)           # SIGSTOP
        try:
            with Delta(ports[0]) as d:
                r = produce_raw(conn, topic, one(b"late"), acks=-1, timeout_ms=300)
            assert _failed_row(r, REQUEST_TIMED_OUT), r
            assert (d.fast, d.reference) == (1, 0), (d.fast, d.reference)
            with Delta(ports[0]) as d:
                r = produce_raw(conn, topic, one(b"shrunk"), acks=-1, timeout_ms=30000)
            assert _failed_row(r, NOT_ENOUGH_REPLICAS_AFTER_APPEND), r
            assert (d.fast, d.reference) == (1, 0), (d.fast, d.reference)
            assert _leo(c, 0, topic) == end + 2         # both were appended
            with Delta(ports[0]) as d:
                r = produce_raw(conn, topic, one(b"refused"), acks=-1)
            assert r["error_code"] == NOT_ENOUGH_REPLICAS and (d.fast, d.reference) == (0, 1), (r, d.fast, d.reference)
            assert _leo(c, 0, topic) == end + 2
        finally:
            os.kill(c.brokers[2].pid, 18)       # SIGCONT
        wait_until(lambda: isr_of(c, topic) == [0, 1, 2], 60, "the follower back in the ISR")
        with Delta(ports[0]) as d:
            r = produce_raw(conn, topic, one(b"back"), acks=-1)
        assert r["error_code"] == 0 and (d.fast, d.reference) == (1, 0), (r, d.fast, d.reference)


@pytest.mark.slow
def test_rf3_leadership_moves_while_parked(three):
    """A request parked on broker 0 (follower 2 paused, so the HW cannot pass it) when the preferred
    leader 1 takes the partition: NOT_LEADER_OR_FOLLOWER, no offset (as Python's _fail_waiters)."""
    from confluent_kafka import ElectionType
    c, ports = three
    topic = rf3_topic(c, leader=1)
    with leader_conn(c, 1) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "leader ready")
    c.stop_broker(1)                            # broker 0 leads; 1 comes back as a follower
    c.start_broker(1)
    controller = _metadata(c, 0, topic)["controller_id"]
    assert controller != 2, "broker 2 is paused below: the controller must be another broker"
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one(), acks=-1)["error_code"] == 0, 30, "broker 0 leads")
        wait_until(lambda: isr_of(c, topic) == [0, 1, 2], 60, "a full ISR")
        # the admin knows only the controller: a bootstrap or metadata request to the paused broker
        # would wait out librdkafka's socket timeout (60 s) past the election's 30 s
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{c.brokers[controller].port}"})
        assert admin.list_topics(timeout=10).controller_id == controller
        os.kill(c.brokers[2].pid, 19)           # SIGSTOP
        try:
            with Delta(ports[0]) as d:
                _send_parked(conn, topic, one(b"parked"), 30000)
                wait_until(lambda: counts(ports[0])["fast"] > d.before["fast"], 10, "the request parked")
            errors = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(30)
            assert all(e is None for e in errors.values()), errors
            r = _parked_answer(conn)
        finally:
            os.kill(c.brokers[2].pid, 18)       # SIGCONT
    assert (d.fast, d.reference) == (1, 0), (d.fast, d.reference)
    assert _failed_row(r, NOT_LEADER_OR_FOLLOWER), r


@pytest.mark.slow
def test_leader_kill_acks_all_native_loses_no_acked_record(tmp_path):
    """test_replication's T1 with a producer the fast path serves (acks=all, not idempotent): kill -9
    the leader twice under load. Invariant: acked-but-lost 0 of N, inconsistent offsets 0 (retries may
    duplicate: not idempotent); the leaders served the load natively."""
    from checkers import History, read_all_confluent
    from test_replication import LoadProducer, make_topic, state, wait_acks_grow, wait_isr, wait_unregistered
    c = LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": 3000})
    ports = {}
    for bid, b in c.brokers.items():
        ports[bid] = free_port()
        b.extra = {"kbroker.metrics.port": ports[bid]}
    with c:
        make_topic(c)
        hist = History()
        load = LoadProducer(c.bootstrap, hist, rate=800, **{"enable.idempotence": False, "acks": "all"}).start()
        served = []
        try:
            for _round in range(2):
                wait_acks_grow(load, 300)
                leader, _epoch, _isr = wait_isr(c, 3, timeout=60)
                wait_acks_grow(load, 300)
                served.append(counts(ports[leader]))
                c.kill(leader)
                wait_unregistered(c, leader)
                wait_until(lambda: (lambda s: s if s[0] >= 0 and s[0] != leader else None)(state(c)), 30,
                           "a new leader")
                wait_acks_grow(load, 300)
                c.start_broker(leader)
        finally:
            load.finish()
        read_all_confluent(c.bootstrap, "rep", 1, hist)
        report = hist.check()
    print(report.line(), served)
    assert report.acked > 1500
    assert report.acked_lost == 0, report.line()
    assert report.inconsistent_offsets == 0, report.line()
    # the load's requests (linger.ms 5: a few records each) to each killed leader, mostly native
    assert all(n["fast"] >= 30 and n["fast"] > 5 * n["reference"] for n in served), served
