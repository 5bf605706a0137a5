"""Produce v9-11 and Fetch v12-17 (the flexible versions; Fetch v13+ names topics by id) as real clients
pick them from ApiVersions, served by the native request path: confluent-kafka (librdkafka), kafka-python 3,
aiokafka and kcat produce (acks=all to RF=3 with min.insync.replicas 2, compressed and not) and read back
every record. Each test checks which versions the clients sent (the broker's per-version request counters)
and that the native fast paths served them (kbroker_{produce,fetch}_native_requests_total)."""
from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import urllib.request
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import FETCH, METADATA, PRODUCE, RawConn, consume_aiokafka, wait_for_topic
from kbroker.protocol.api import ApiKey
from kbroker.protocol.errors import Errors
from kbroker.testing import wait_until
from test_produce_fast import one, three  # noqa: F401 (three: the RF=3 cluster fixture)

_REQUESTS = re.compile(r'^kafka_network_requestmetrics_requests_total\{request="(\w+)",version="(\d+)"\} (\S+)$', re.M)
_NATIVE = re.compile(r'^kbroker_(produce|fetch)_native_(?:(follower)_)?requests_total\{path="(\w+)"\} (\S+)$', re.M)


def _counters(port: int) -> dict:
    """{("Produce", version): n, ..., ("produce", "fast"): n, ("consumer", "fast"): n, ...} from the broker's
    metrics (the Fetch counters count the followers' fetches too: "consumer" is the rest)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {(name, int(v)): int(float(n)) for name, v, n in _REQUESTS.findall(text)}
    for api, follower, path, n in _NATIVE.findall(text):
        out[("follower" if follower else api, path)] = int(float(n))
    for path in ("fast", "reference"):
        out[("consumer", path)] = out.get(("fetch", path), 0) - out.get(("follower", path), 0)
    return out


@contextlib.contextmanager
def _served(port):
    """The counters' growth while the block ran: a dict as _counters'."""
    got = {}
    before = _counters(port)
    yield got
    after = _counters(port)
    got.update({k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0)})


def _versions(d, name):
    return {v for (n, v) in d if n == name}


def _topic(c):
    """One partition led by broker 0, replicas 0, 1, 2, min.insync.replicas 2: acks=all waits for a follower."""
    name = f"flex-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[[0, 1, 2]],
                                  config={"min.insync.replicas": "2"})])[name].result(30)
    wait_for_topic(c.bootstrap, name, 1)
    with RawConn(f"127.0.0.1:{c.brokers[0].port}", timeout=30) as conn:   # the first append arms the slot
        body = {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                "topic_data": [{"name": name, "partition_data": [{"index": 0, "records": one(b"warm")}]}]}
        wait_until(lambda: conn.request(PRODUCE, 11, body)["responses"][0]["partition_responses"][0]["error_code"] == 0,
                   30, "the first append")
    return name


def _confluent_consume(bootstrap, topic, n):
    # small fetches (a batch or two each): below the sendfile threshold, the fast path's answers
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "flex-" + uuid.uuid4().hex[:6],
                     "enable.auto.commit": False, "max.partition.fetch.bytes": 512})
    out = []
    try:
        cons.assign([TopicPartition(topic, 0, 0)])
        wait_until(lambda: out.extend(m.value() for m in cons.consume(500, timeout=0.5) if not m.error())
                   or len(out) >= n, 60, "every record read")
    finally:
        cons.close()
    return out


def test_newest_versions_advertised(three):
    c, _ports = three
    with RawConn(c.bootstrap) as raw:
        r = raw.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    got = {k["api_key"]: (k["min_version"], k["max_version"]) for k in r["api_keys"]}
    assert (got[PRODUCE], got[FETCH]) == ((0, 11), (0, 17))


def test_confluent_kafka_acks_all_compressed_and_plain(three):
    """librdkafka picks its newest Produce (v9+) and Fetch (v12+: by topic id from v13): acks=all to
    RF=3, lz4 and uncompressed, one record per request; every record read back in order, the plain
    requests and the consumer's fetches served natively."""
    c, ports = three
    port = ports[0]
    topic = _topic(c)
    with _served(port) as d:
        errors = []
        for codec, start in (("lz4", 0), ("none", 100)):
            p = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": "all",
                          "compression.type": codec})
            for i in range(start, start + 100):
                p.produce(topic, value=b"c-%d" % i, partition=0,
                          on_delivery=lambda err, _m: errors.append(err) if err else None)
                p.poll(0)
            assert p.flush(60) == 0
        assert errors == []
        got = _confluent_consume(c.bootstrap, topic, 201)
    assert got[1:201] == [b"c-%d" % i for i in range(200)]
    # (the followers fetch with v11)
    assert min(_versions(d, "Produce")) >= 9 and max(_versions(d, "Fetch")) >= 12, d
    # the 100 plain requests (parked until a follower has them) natively; lz4 is checked off the loop
    assert d.get(("produce", "fast"), 0) >= 95, d
    assert d.get(("consumer", "fast"), 0) >= 10, d


def test_kafka_python_produce_v9_fetch_v12(three):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP
    c, ports = three
    port = ports[0]
    topic = _topic(c)
    with _served(port) as d:
        for codec, start in (("gzip", 0), (None, 50)):
            p = KafkaProducer(bootstrap_servers=c.bootstrap, acks="all", compression_type=codec, linger_ms=0)
            try:
                for i in range(start, start + 50):
                    p.send(topic, value=b"k-%d" % i, partition=0).get(30)
            finally:
                p.close()
        kc = KafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000,
                           enable_incremental_fetch_sessions=False, max_partition_fetch_bytes=512,
                           fetch_max_bytes=4096)
        try:
            kc.assign([KTP(topic, 0)])
            kc.seek(KTP(topic, 0), 0)
            got = []
            for m in kc:
                got.append(m.value)
                if len(got) == 101:
                    break
        finally:
            kc.close()
    assert got[1:] == [b"k-%d" % i for i in range(100)]
    assert 9 in _versions(d, "Produce") and 12 in _versions(d, "Fetch"), d
    assert d.get(("produce", "fast"), 0) >= 45 and d.get(("consumer", "fast"), 0) >= 10, d


def test_aiokafka_and_kcat_round_trip(three):
    c, _ports = three
    topic = _topic(c)

    async def produce():
        from aiokafka import AIOKafkaProducer
        p = AIOKafkaProducer(bootstrap_servers=c.bootstrap, acks="all", compression_type="gzip")
        await p.start()
        try:
            for i in range(50):
                await p.send_and_wait(topic, b"a-%d" % i, partition=0)
        finally:
            await p.stop()
    asyncio.run(produce())
    got = consume_aiokafka(c.bootstrap, topic, {0: 51})
    assert [x.rec.value for x in got][1:] == [b"a-%d" % i for i in range(50)]
    subprocess.run(["kcat", "-P", "-b", c.bootstrap, "-t", topic, "-p", "0", "-z", "snappy",
                    "-X", "acks=all"], input=b"".join(b"kc-%d\n" % i for i in range(30)), timeout=60, check=True)
    out = subprocess.run(["kcat", "-C", "-b", c.bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e",
                          "-f", "%s\\n"], capture_output=True, timeout=60, check=True)
    assert out.stdout.split(b"\n")[51:81] == [b"kc-%d" % i for i in range(30)]


def _fetch_body(tid, offset, partition_max=1 << 20):
    return {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": "", "topic_id": tid, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
                 "log_start_offset": -1, "partition_max_bytes": partition_max}]}]}


def test_every_flexible_version_raw_natively(three):
    """Produce v9-11 with acks 1 and all, Fetch v12-17 of each batch: all served by the fast paths,
    offsets in order, each fetch answered with its batch under the topic's name (v12) or id (v13+);
    an unknown id answers UNKNOWN_TOPIC_ID (the reference path)."""
    c, ports = three
    port = ports[0]
    topic = _topic(c)
    with RawConn(f"127.0.0.1:{c.brokers[0].port}", timeout=30) as conn:
        tid = conn.request(METADATA, 12, {"topics": [{"name": topic, "topic_id": bytes(16)}]})["topics"][0]["topic_id"]
        with _served(port) as d:
            for i, (version, acks) in enumerate((v, a) for v in (9, 10, 11) for a in (1, -1)):
                r = conn.request(PRODUCE, version, {"transactional_id": None, "acks": acks, "timeout_ms": 10000,
                                                    "topic_data": [{"name": topic, "partition_data": [
                                                        {"index": 0, "records": one(b"r%d" % i)}]}]})
                p = r["responses"][0]["partition_responses"][0]
                assert (p["error_code"], p["base_offset"], p["log_start_offset"]) == (0, i + 1, 0), (version, p)
            for version in range(12, 18):
                r = conn.request(FETCH, version, dict(_fetch_body(tid, version - 11), topics=[
                    {"topic": topic, "topic_id": tid, "partitions": _fetch_body(tid, version - 11)["topics"][0]["partitions"]}]))
                t = r["responses"][0]
                assert (t["topic_id"] if version >= 13 else t["topic"]) == (tid if version >= 13 else topic)
                part = t["partitions"][0]
                assert (part["error_code"], part["high_watermark"]) == (0, 7), part
                assert int.from_bytes(bytes(part["records"])[:8], "big") == version - 11
        assert d.get(("produce", "fast"), 0) == 6 and d.get(("consumer", "fast"), 0) == 6, d
        with _served(port) as d:
            r = conn.request(FETCH, 17, _fetch_body(b"\x07" * 16, 0))
        assert r["responses"][0]["partitions"][0]["error_code"] == Errors.UNKNOWN_TOPIC_ID
        assert d.get(("consumer", "reference"), 0) == 1, d
