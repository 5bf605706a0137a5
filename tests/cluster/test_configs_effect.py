"""Kafka 3.9 configs on a real broker: every broker key at Kafka's default plus Kafka's sample
server.properties starts a broker that serves clients and logs each key without effect once, with why;
and each key kbroker gives effect to changes what real clients see:

- ``compression.type`` (topic and broker): a codec recompresses every producer batch on the leader
  (the batches on disk carry it, CRC valid, records intact); ``producer`` keeps each batch as sent.
- ``message.timestamp.before.max.ms`` / ``after.max.ms`` (KIP-937, topic and broker): a CreateTime record
  outside the bounds is refused INVALID_TIMESTAMP, the partition unchanged.

Broker 0 runs every Kafka default; broker 1 sets the broker-level keys under test (topics pinned to it
by replica assignment)."""
from __future__ import annotations

import re
import time
import uuid

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import CODECS, all_batches, consume_confluent, crc_ok
from kbroker.config import BROKER_CONFIGS, parse_properties
from kbroker.testing import LocalCluster
import paths

DEFAULTS = parse_properties((paths.DATA / "kafka39_broker_defaults.properties").read_text())
SAMPLE = parse_properties((paths.DATA / "kafka39_server.properties").read_text())
# What LocalCluster sets for a test broker (ports, dirs, ZooKeeper, one broker's replication factors).
OWN = {"broker.id", "listeners", "log.dirs", "log.dir", "zookeeper.connect", "zookeeper.session.timeout.ms",
       "offsets.topic.replication.factor", "num.partitions"}
BROKER1 = {"compression.type": "zstd", "log.message.timestamp.after.max.ms": 60_000}
HOUR = 3_600_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    overrides = {k: v for k, v in {**DEFAULTS, **SAMPLE}.items() if k not in OWN}
    c = LocalCluster(tmp_path_factory.mktemp("cfgeffect"), brokers=2, overrides=overrides)
    c.brokers[1].extra = dict(BROKER1)
    with c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def create(admin, config=None, broker=0) -> str:
    topic = f"eff-{uuid.uuid4().hex[:8]}"
    fut = admin.create_topics([NewTopic(topic, 1, replica_assignment=[[broker]], config=config or {})])
    fut[topic].result(30)
    return topic


def produce(bootstrap, topic, values, *, codec="none", timestamp=None) -> list:
    """-> each record's delivery error (None when acked)."""
    errors = {}
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 50,
                  "message.timeout.ms": 30000, "retries": 0})
    for i, v in enumerate(values):
        kw = {} if timestamp is None else {"timestamp": timestamp}
        p.produce(topic, v, key=b"k%d" % i, partition=0,
                  on_delivery=lambda err, msg, i=i: errors.__setitem__(i, err), **kw)
    assert p.flush(60) == 0
    return [errors[i] for i in range(len(values))]


def stored_codecs(cluster, broker, topic) -> set[int]:
    batches = all_batches(cluster.brokers[broker].data_dir, topic, 0)
    assert batches and all(crc_ok(path, b) for path, b in batches)
    return {b.attributes & 7 for _, b in batches}


def test_every_kafka_key_at_its_default_starts_and_each_without_effect_is_logged_once(cluster):
    log = cluster.brokers[0].log_path.read_text(errors="replace")
    logged = re.findall(r"The configuration (\S+) = .* is accepted, no effect in kbroker: (.+)", log)
    keys = [k for k, _ in logged]
    given = set(DEFAULTS) | set(SAMPLE)
    assert sorted(keys) == sorted({k for k in given if not BROKER_CONFIGS[k].implemented})
    reasons = dict(logged)
    for key in ("num.network.threads", "num.io.threads", "num.replica.fetchers", "background.threads"):
        assert "one event loop per broker" in reasons[key]
    # ... and it serves.
    topic = create(AdminClient({"bootstrap.servers": cluster.bootstrap}))
    assert produce(cluster.bootstrap, topic, [b"a", b"b"]) == [None, None]
    assert [c.rec.value for c in consume_confluent(cluster.bootstrap, topic, {0: 2})] == [b"a", b"b"]


@pytest.mark.parametrize("topic_codec, sent", [("gzip", "none"), ("snappy", "lz4"), ("uncompressed", "zstd"),
                                               ("lz4", "lz4")])
def test_topic_compression_type_recompresses_on_the_leader(cluster, admin, topic_codec, sent):
    topic = create(admin, {"compression.type": topic_codec})
    values = [b"value-%d " % i * 20 for i in range(300)]
    assert produce(cluster.bootstrap, topic, values, codec=sent) == [None] * 300
    want = 0 if topic_codec == "uncompressed" else CODECS[topic_codec]
    assert stored_codecs(cluster, 0, topic) == {want}
    got = consume_confluent(cluster.bootstrap, topic, {0: 300})
    assert [c.rec.value for c in got] == values
    assert [c.rec.key for c in got] == [b"k%d" % i for i in range(300)]


def test_producer_keeps_the_codec_as_sent(cluster, admin):
    topic = create(admin)                                   # compression.type=producer (Kafka's default)
    assert produce(cluster.bootstrap, topic, [b"x" * 100] * 50, codec="snappy") == [None] * 50
    assert stored_codecs(cluster, 0, topic) == {CODECS["snappy"]}


def test_broker_compression_type_is_the_default_of_its_topics(cluster, admin):
    topic = create(admin, broker=1)
    values = [b"%d" % i * 30 for i in range(100)]
    assert produce(cluster.bootstrap, topic, values, codec="gzip") == [None] * 100
    assert stored_codecs(cluster, 1, topic) == {CODECS["zstd"]}
    assert [c.rec.value for c in consume_confluent(cluster.bootstrap, topic, {0: 100})] == values
    # a topic's own value wins over the broker's
    topic = create(admin, {"compression.type": "producer"}, broker=1)
    assert produce(cluster.bootstrap, topic, values, codec="gzip") == [None] * 100
    assert stored_codecs(cluster, 1, topic) == {CODECS["gzip"]}


def test_topic_timestamp_bounds_refuse_records_outside_them(cluster, admin):
    topic = create(admin, {"message.timestamp.before.max.ms": str(HOUR), "message.timestamp.after.max.ms": "1000"})
    now = int(time.time() * 1000)
    assert produce(cluster.bootstrap, topic, [b"ok"], timestamp=now - HOUR + 60_000) == [None]
    [old] = produce(cluster.bootstrap, topic, [b"old"], timestamp=now - 2 * HOUR)
    [future] = produce(cluster.bootstrap, topic, [b"future"], timestamp=now + 600_000)
    assert old.code() == future.code() == KafkaError.INVALID_TIMESTAMP
    assert [c.rec.value for c in consume_confluent(cluster.bootstrap, topic, {0: 1})] == [b"ok"]
    # kafka-python sees the same refusal
    from kafka import KafkaProducer
    from kafka.errors import InvalidTimestampError
    kp = KafkaProducer(bootstrap_servers=cluster.bootstrap, retries=0)
    try:
        with pytest.raises(InvalidTimestampError):
            kp.send(topic, b"old", partition=0, timestamp_ms=now - 3 * HOUR).get(timeout=30)
    finally:
        kp.close()


def test_broker_timestamp_after_bound_applies_to_its_topics(cluster, admin):
    topic = create(admin, broker=1)
    now = int(time.time() * 1000)
    [future] = produce(cluster.bootstrap, topic, [b"future"], timestamp=now + 10 * 60_000)
    assert future.code() == KafkaError.INVALID_TIMESTAMP
    assert produce(cluster.bootstrap, topic, [b"past"], timestamp=now - 30 * 24 * HOUR) == [None]
    # the same record on broker 0 (Kafka's defaults: no bound) is taken
    assert produce(cluster.bootstrap, create(admin), [b"future"], timestamp=now + 10 * 60_000) == [None]
