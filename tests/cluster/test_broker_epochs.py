"""Leader epochs on the wire: batches are stamped with the partition's leader epoch, Metadata reports it,
OffsetForLeaderEpoch (v2/v3) answers Kafka's way, and a librdkafka consumer validating its position with
an epoch (KIP-320) reads on."""
import urllib.request
import uuid

import confluent_kafka as ck
import pytest

from kbroker._native import batch as native_batch
from kbroker.protocol.errors import Errors

from checkers import RawConn, metered_cluster

OFFSET_FOR_LEADER_EPOCH, METADATA, FETCH = 23, 3, 1


def _produce(bootstrap, topic, n):
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(n):
        p.produce(topic, key=b"k", value=b"v%d" % i, partition=0)
        p.poll(0)
    assert p.flush(30) == 0


@pytest.fixture
def topic(bootstrap):
    name = f"epochs-{uuid.uuid4().hex[:8]}"
    _produce(bootstrap, name, 10)
    return name


@pytest.mark.parametrize("version", [2, 3])
def test_offset_for_leader_epoch(bootstrap, topic, version):
    with RawConn(bootstrap) as raw:
        md = raw.request(METADATA, 8, {"topics": [{"name": topic}]})
        (part0,) = [p for p in md["topics"][0]["partitions"] if p["partition_index"] == 0]
        epoch = part0["leader_epoch"]
        assert epoch == 0

        def ask(leader_epoch, current=-1, name=topic):
            r = raw.request(OFFSET_FOR_LEADER_EPOCH, version, {"replica_id": -1, "topics": [
                {"topic": name, "partitions": [{"partition": 0, "current_leader_epoch": current,
                                                "leader_epoch": leader_epoch}]}]})
            return r["topics"][0]["partitions"][0]

        # The current epoch ends at the log end offset (10 records produced).
        got = ask(epoch)
        assert (got["error_code"], got["leader_epoch"], got["end_offset"]) == (0, 0, 10)
        # An epoch newer than any we know: undefined epoch and offset.
        got = ask(epoch + 5)
        assert (got["error_code"], got["leader_epoch"], got["end_offset"]) == (0, -1, -1)
        # KIP-320 fencing on current_leader_epoch.
        assert ask(epoch, current=epoch + 1)["error_code"] == Errors.UNKNOWN_LEADER_EPOCH
        assert ask(epoch, current=epoch)["error_code"] == 0
        assert ask(epoch, name="no-such-topic-" + topic)["error_code"] == Errors.UNKNOWN_TOPIC_OR_PARTITION


def test_batches_carry_the_leader_epoch(bootstrap, topic):
    with RawConn(bootstrap) as raw:
        r = raw.request(FETCH, 11, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                    "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                                        {"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": 0,
                                                                         "fetch_offset": 0, "log_start_offset": -1,
                                                                         "partition_max_bytes": 1 << 20}]}],
                                    "forgotten_topics_data": [], "rack_id": ""})
    data = bytes(r["responses"][0]["partitions"][0]["records"])
    batches = native_batch.iter_batches(data, check_crc=True)
    assert batches and all(b.partition_leader_epoch == 0 for b in batches)


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    with metered_cluster(tmp_path_factory, "epochs") as cluster:
        yield cluster


def _epoch_requests(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('kafka_network_requestmetrics_requests_total{request="OffsetForLeaderEpoch"'))


def test_librdkafka_consumer_validates_position_with_epoch(metered):
    """A seek to a position carrying a leader epoch makes librdkafka validate it with
    OffsetForLeaderEpoch v2 (KIP-320) before fetching; with a correct answer it reads on from there
    (no truncation detected, no reset, no error). The broker's request counter proves the request ran."""
    cluster, port = metered
    name = f"epochs-{uuid.uuid4().hex[:8]}"
    _produce(cluster.bootstrap, name, 10)
    before = _epoch_requests(port)
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "unused-" + name,
                     "enable.auto.commit": False, "auto.offset.reset": "error"})
    try:
        c.assign([ck.TopicPartition(name, 0, 0)])
        got, errors = [], []
        for _ in range(20):
            if c.consume(1, timeout=0.5):
                break
        c.seek(ck.TopicPartition(name, 0, 4, leader_epoch=0))
        for _ in range(40):
            for m in c.consume(10, timeout=0.5):
                (errors if m.error() else got).append(m.error() or m.offset())
            if got and got[-1] == 9:
                break
        assert errors == [] and got == list(range(4, 10)), (got, errors)
    finally:
        c.close()
    assert _epoch_requests(port) > before
