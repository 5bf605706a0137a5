"""The common Produce (one or several partitions) served without a Python frame (issue 10; ext/request.pyx FastProduce,
kbroker/replica/manager.py ``_fast_refresh``): real brokers, real clients (confluent-kafka) and raw
requests. The broker's ``kbroker_produce_native_requests_total{path=fast|slow}`` counters show which
path served each Produce; every reason the native path must leave a request to Python is shown to do
so (and to give Python's answer), and the plain requests to be served natively again afterwards.

Counter-checks (each was broken on purpose and this file failed): arming a partition whose ISR is
larger than one for acks=-1 (the acks=all waiter test saw an answer before the followers had the
batch), skipping the disarm in become_follower together with the per-request epoch and config-identity guards
(the leadership move test saw the old leader append; with any one of the three left, it refuses),
dropping the consumers' notifier wake (the long-poll test waited for its max wait), ignoring the
log's config identity (LogAppendTime missing in the answer); refusing requests of more than one
partition (the keyed kafka-python/aiokafka producers, the RF=3 leaders and the write-behind run saw them
served slow); not ending the write-behind run before a Fetch of the same chunk (the run test's fetch);
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
from kbroker.testing import LocalCluster, free_port, wait_until
from test_hostile_attacks import _batch, _record
from test_produce_diskfull import _fill, tmpfs  # noqa: F401 (tmpfs: the fixture)

NOT_LEADER_OR_FOLLOWER = 6
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
UNKNOWN_TOPIC_OR_PARTITION = 3
KAFKA_STORAGE_ERROR = 56


def counts(port: int) -> dict:
    """{"fast": n, "slow": n} from the broker's metrics endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kbroker_produce_native_requests_total{"):
            path = line.split('path="', 1)[1].split('"', 1)[0]
            out[path] = int(float(line.rsplit(" ", 1)[1]))
    return out


class Delta:
    """Fast/slow Produce requests served between entering and leaving the block."""

    def __init__(self, port):
        self.port = port

    def __enter__(self):
        self.before = counts(self.port)
        return self

    def __exit__(self, *exc):
        after = counts(self.port)
        self.fast = after["fast"] - self.before["fast"]
        self.slow = after["slow"] - self.before["slow"]


def produce_raw(conn, topic, batch, acks=1, version=7, index=0):
    """-> the partition's answer dict (None for acks=0)."""
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": index, "records": batch}]}]}
    if acks == 0:
        from kbroker.protocol import api
        conn.send(api.encode_request(PRODUCE, version, 99, "fast-test", body))
        return None
    return conn.request(PRODUCE, version, body, timeout=30)["responses"][0]["partition_responses"][0]


def one(value=b"v", i=0, codec=0):
    return _batch(codec, [_record(i, b"k", value)])


def produce_confluent(bootstrap, topic, n, **conf):
    """n one-record Produce requests (linger 0, one record per batch); -> delivery errors."""
    errors = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": 1, **conf})
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"value-%d" % i, partition=0,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(60) == 0
    return errors


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
    assert d.fast >= 299 and d.fast + d.slow == 300, (d.fast, d.slow)
    got = consume_values(c.bootstrap, topic, 301)
    assert [(o, v) for o, v, _ts in got[1:]] == [(i + 1, b"value-%d" % i) for i in range(300)]


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_every_version_and_acks_native(single, acks):
    """v3-8, acks 0/1/-1 (an ISR of this leader alone: answered at once): all native, offsets in order,
    and the answer carries what the Python path's would (base offset, no append time, log start)."""
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
    assert d.fast == 6 and d.slow == 0, (d.fast, d.slow)


def test_idempotent_producer_takes_python_path(single):
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d:
        assert produce_confluent(c.bootstrap, topic, 50, **{"enable.idempotence": True, "acks": "all"}) == []
    assert d.slow >= 50 and d.fast == 0, (d.fast, d.slow)
    assert len(consume_values(c.bootstrap, topic, 51)) == 51


def test_compressed_batch_validated_off_the_loop_takes_python_path(single):
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for i in range(5):
            assert produce_raw(conn, topic, one(b"z" * 500, codec=1))["error_code"] == 0
    assert d.slow == 5 and d.fast == 0, (d.fast, d.slow)
    assert [o for o, _v, _t in consume_values(c.bootstrap, topic, 6)] == list(range(6))


def test_flush_messages_one_takes_python_path(single):
    c, port = single
    topic = new_topic(c, {"flush.messages": 1}, warm=False)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for i in range(5):
            assert produce_raw(conn, topic, one())["error_code"] == 0
    assert d.slow == 5 and d.fast == 0, (d.fast, d.slow)


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
        assert d.fast == 1, (d.fast, d.slow)

        alter_topic(c.bootstrap, topic, max_message_bytes=2000)
        wait_until(lambda: produce_raw(conn, topic, one(b"m" * 3000))["error_code"] == MESSAGE_TOO_LARGE, 20,
                   "max.message.bytes")
        with Delta(port) as d:
            assert produce_raw(conn, topic, one(b"m" * 3000))["error_code"] == MESSAGE_TOO_LARGE
            assert produce_raw(conn, topic, one(b"s"))["error_code"] == 0
        assert (d.fast, d.slow) == (1, 1), (d.fast, d.slow)

        alter_topic(c.bootstrap, topic, segment_bytes=1024)
        wait_until(lambda: produce_raw(conn, topic, one(b"r" * 400))["error_code"] == 0 and
                   len(segment_files(c.brokers[0].data_dir, topic, 0)) > 1, 20, "a roll")
        with Delta(port) as d:
            for i in range(20):
                assert produce_raw(conn, topic, one(b"r" * 400))["error_code"] == 0
        # every other batch or so rolls (Python), the others append natively to the new segment
        assert d.fast >= 5 and d.slow >= 5 and d.fast + d.slow == 20, (d.fast, d.slow)
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
    assert d.fast == 0 and d.slow == 50, (d.fast, d.slow)


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
        assert (d.fast, d.slow) == (0, 1)
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


def keyed_confluent(bootstrap, topic, n):
    acked = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1})
    for i in range(n):
        p.produce(topic, key=b"key-%d" % (i % 97), value=b"value-%d" % i,
                  on_delivery=lambda err, m: acked.append(err or (m.partition(), m.offset(), m.value())))
        p.poll(0)
    assert p.flush(60) == 0
    return acked


def keyed_kafka_python(bootstrap, topic, n):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    try:
        futures = [(p.send(topic, key=b"key-%d" % (i % 97), value=b"value-%d" % i), b"value-%d" % i)
                   for i in range(n)]
        p.flush(60)
        return [(f.get(30).partition, f.get(30).offset, v) for f, v in futures]
    finally:
        p.close(10)


def keyed_aiokafka(bootstrap, topic, n):
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
        await p.start()
        try:
            futures = [(await p.send(topic, key=b"key-%d" % (i % 97), value=b"value-%d" % i), b"value-%d" % i)
                       for i in range(n)]
            return [(m.partition, m.offset, v) for m, v in [(await f, v) for f, v in futures]]
        finally:
            await p.stop()
    return asyncio.run(run())


def check_multi(c, topic, n_parts, acked, brokers=(0,)):
    """Every acknowledged record reads back at its offset, and each partition holds them in the order
    they were sent; -> the number of batches the producer's requests stored (the warm-up ones left out)."""
    assert all(type(a) is tuple for a in acked), [a for a in acked if type(a) is not tuple][:3]
    sent = {v: i for i, (_p, _o, v) in enumerate(acked)}
    by_part = {}
    for part, offset, v in acked:
        by_part.setdefault(part, []).append((offset, sent[v]))
    assert len(by_part) == n_parts, sorted(by_part)
    for part, rows in by_part.items():
        rows.sort()
        assert [o for o, _i in rows] == list(range(1, len(rows) + 1)), part     # after the warm-up record
        assert [i for _o, i in rows] == sorted(i for _o, i in rows), part       # in send order
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "multi-" + uuid.uuid4().hex[:6],
                     "enable.auto.commit": False})
    got = set()
    try:
        cons.assign([TopicPartition(topic, p, 1) for p in range(n_parts)])
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
                batches += len(stored) - 1
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
    assert d.slow == 0 and d.fast > 0, (d.fast, d.slow)
    if client != "confluent":       # librdkafka (2.16) sends one partition per Produce request
        assert batches >= 2 * d.fast, (batches, d.fast)   # two partitions or more per request, on average


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
    assert (d.fast, d.slow) == (20, 0), (d.fast, d.slow)
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
    finisher), the dir is then failing and appends take the Python path until one succeeds there;
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
            # (counted slow); then the failing dir keeps the rest on the Python path
            assert (d.fast, d.slow) == (0, 4), (d.fast, d.slow)
            os.unlink(os.path.join(tmpfs, "ballast"))
            with Delta(port) as d:
                for _ in range(3):
                    assert produce_raw(conn, topic, one())["error_code"] == 0
            assert (d.fast, d.slow) == (2, 1), (d.fast, d.slow)
        assert end_offsets(c.bootstrap, topic, 1) == {0: 4}      # the warm-up record and these 3


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
            spare = os.path.join(tmpfs, "spare")
            with open(spare, "wb") as f:
                f.write(b"\0" * 100_000)
            _fill(tmpfs)
            fd = os.open(os.path.join(tmpfs, "ballast"), os.O_WRONLY | os.O_APPEND)
            try:
                while os.write(fd, b"\0" * 4096):                      # to the last page
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
            os.unlink(spare)                                        # room for one 60 KB batch
            with Delta(port) as d:
                rows = produce_multi(conn, topic, {p: one(b"f" * 60_000) for p in (0, 1, 2)})
            assert rows == [(0, 0, 1), (1, KAFKA_STORAGE_ERROR, -1), (2, KAFKA_STORAGE_ERROR, -1)], rows
            assert (d.fast, d.slow) == (0, 1), (d.fast, d.slow)
            os.unlink(os.path.join(tmpfs, "ballast"))
            with Delta(port) as d:
                for k in range(2):
                    rows = produce_multi(conn, topic, {p: one() for p in (2, 1, 0)})
                    assert rows == [(2, 0, 1 + k), (1, 0, 1 + k), (0, 0, 2 + k)], rows
            assert (d.fast, d.slow) == (1, 1), (d.fast, d.slow)
        assert end_offsets(c.bootstrap, topic, 3) == {0: 4, 1: 3, 2: 3}


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
    assert d.fast >= 30, (d.fast, d.slow)
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
    fast, slow = sum(d.fast for d in deltas), sum(d.slow for d in deltas)
    assert all(d.fast > 0 for d in deltas) and slow <= 3, [(d.fast, d.slow) for d in deltas]
    assert batches > 1.5 * (fast + slow), (batches, fast, slow)     # each broker leads three partitions
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
    """acks=-1 with an ISR of three: the Python path (a waiter), answered once the followers have it."""
    c, ports = three
    topic = rf3_topic(c)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one(), acks=-1)["error_code"] == 0, 30, "leader ready")
        with Delta(ports[0]) as d:
            r = produce_raw(conn, topic, one(b"all"), acks=-1)
        assert r["error_code"] == 0
        assert (d.fast, d.slow) == (0, 1), (d.fast, d.slow)
        for bid in (1, 2):
            assert _leo(c, bid, topic) >= r["base_offset"] + 1
        with Delta(ports[0]) as d:
            assert produce_raw(conn, topic, one(), acks=1)["error_code"] == 0
        assert (d.fast, d.slow) == (1, 0)


@pytest.mark.slow
def test_rf3_isr_shrink_arms_acks_all(three):
    """An ISR shrinking to the leader alone (followers stopped, min.insync.replicas=1): acks=-1 is then
    answered natively at once; the followers back in the ISR: acks=-1 waits again (Python)."""
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

        def expanded():
            with Delta(ports[0]) as d:
                r = produce_raw(conn, topic, one(), acks=-1)
            return r["error_code"] == 0 and d.slow == 1
        wait_until(expanded, 60, "acks=-1 back on the Python path after the ISR grew")


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
        assert (d.fast, d.slow) == (0, 1)
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
