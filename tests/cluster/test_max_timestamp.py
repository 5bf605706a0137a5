"""A produced batch's header maxTimestamp is set from its records on the leader, as Kafka's
LogValidator does: clients send -1 there (Sarama), or a value too small or too large. Batches with
such headers (compressed and not, built by kafka-python's encoder) go to a real broker over raw
Produce requests (the native path, and the off-loop validation of compressed batches); then:
the stored header carries the records' largest timestamp with a valid CRC, ListOffsets by time
answers the first offset whose record is at or past the time (kafka-python and confluent-kafka),
consumers read the records back unchanged (kafka-python checks CRCs), time-based retention deletes
segments whose records are old, and segments already stored with -1 (written before this) are
restamped when the broker recovers them, so they become searchable by time."""
from __future__ import annotations

import time
import uuid

import pytest

from kbroker.testing import LocalCluster, wait_until

from builders import batch, set_max_timestamp
from checkers import (PRODUCE, RawConn, all_batches, consume_kafka_python, create_topic, crc_ok,
                      log_end_offset, segment_files)

T0 = 1_700_000_000_000
N = 6


def offset_ts(i):
    """Record i's timestamp offset from the batch's first: steps back on odd records."""
    return i * 10 - (35 if i % 2 else 0)


RECORDS_MAX = max(offset_ts(i) for i in range(N))
WRONG = {"minus-one": lambda t: -1, "too-small": lambda t: t - 5000, "too-large": lambda t: t + 10**6}
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("maxts"), brokers=1,
                      overrides={"log.retention.check.interval.ms": 300}) as c:
        yield c


def produce(bootstrap, topic, buf):
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": bytes(buf)}]}]}
    with RawConn(bootstrap) as c:
        r = c.request(PRODUCE, 7, body, timeout=30)["responses"][0]["partition_responses"][0]
    assert r["error_code"] == 0, r
    return r["base_offset"]


def wrong_batch(codec, first_ts, wrong):
    b = batch(N, 40, ts=first_ts, codec=codec, ts_step=offset_ts, key=lambda i: b"key-%d" % i)
    return set_max_timestamp(b, WRONG[wrong](first_ts + RECORDS_MAX))


def _first_at_or_after(records, t):
    return min((off for off, ts in records if ts >= t), default=-1)


def _kafka_python_offsets_for_times(bootstrap, topic, times):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap)
    tp = TopicPartition(topic, 0)
    try:
        out = []
        for t in times:
            r = c.offsets_for_times({tp: t})[tp]
            out.append(-1 if r is None else r.offset)
        return out
    finally:
        c.close()


def _confluent_offsets_for_times(bootstrap, topic, times):
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"maxts-{uuid.uuid4().hex[:6]}"})
    try:
        return [c.offsets_for_times([ck.TopicPartition(topic, 0, t)], timeout=30)[0].offset for t in times]
    finally:
        c.close()


def _check_stored(cluster, topic, expected_max):
    data_dir = cluster.brokers[0].data_dir
    stored = [(path, b) for path, b in all_batches(data_dir, topic, 0)]
    assert [b.max_timestamp for _p, b in stored] == expected_max
    assert all(crc_ok(path, b) for path, b in stored)


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
def test_stored_header_carries_the_records_max_timestamp(cluster, codec):
    topic = f"maxts-{codec}-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic, 1)
    records, expected_max = [], []
    for k, wrong in enumerate(WRONG):
        first = T0 + k * 1000
        base = produce(cluster.bootstrap, topic, wrong_batch(codec, first, wrong))
        records += [(base + i, first + offset_ts(i)) for i in range(N)]
        expected_max.append(first + RECORDS_MAX)
    _check_stored(cluster, topic, expected_max)

    got = consume_kafka_python(cluster.bootstrap, topic, {0: len(records)})     # checks CRCs
    assert [(c.offset, c.rec.timestamp, c.rec.key) for c in got] == \
        [(off, ts, b"key-%d" % (off % N)) for off, ts in records]
    stamps = sorted({ts for _o, ts in records})
    times = [T0 - 1] + stamps + [stamps[-1] + 1]
    want = [_first_at_or_after(records, t) for t in times]
    assert [log_end_offset(cluster.bootstrap, topic, 0, t) for t in times] == want     # ListOffsets v1
    assert _kafka_python_offsets_for_times(cluster.bootstrap, topic, times) == want
    assert _confluent_offsets_for_times(cluster.bootstrap, topic, times[::3]) == want[::3]


def test_time_retention_deletes_segments_of_old_records(cluster):
    """Records two days old in batches whose header says -1, retention.ms one day: once a newer
    segment exists, the old ones go (a -1 header would have left them to the file's mtime)."""
    topic = f"maxts-retention-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic, 1, config={"retention.ms": 86_400_000, "segment.bytes": 600})
    old = int(time.time() * 1000) - 2 * 86_400_000
    for k in range(4):          # one batch per segment (each is larger than half of segment.bytes)
        produce(cluster.bootstrap, topic, wrong_batch(0, old + k, "minus-one"))
    produce(cluster.bootstrap, topic, wrong_batch(0, int(time.time() * 1000), "minus-one"))
    wait_until(lambda: log_end_offset(cluster.bootstrap, topic, 0, -2) == 4 * N, timeout=30,
               what="the segments of old records deleted by time retention")
    assert len(segment_files(cluster.brokers[0].data_dir, topic, 0)) == 1


def test_segments_stored_with_minus_one_are_restamped_on_load(cluster):
    """Batches as brokers before this stored Sarama's (header maxTimestamp -1, CRC matching, no
    time index entry): after a restart they are searchable by time and their headers are right."""
    topic = f"maxts-stored-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic, 1)
    records, expected_max = [], []
    for k, codec in enumerate((0, 1, 3, 0)):
        first = T0 + k * 1000
        base = produce(cluster.bootstrap, topic, wrong_batch(codec, first, "minus-one"))
        records += [(base + i, first + offset_ts(i)) for i in range(N)]
        expected_max.append(first + RECORDS_MAX)
    data_dir = cluster.brokers[0].data_dir
    cluster.stop_broker(0)
    for path, b in all_batches(data_dir, topic, 0):          # the old broker's bytes
        with open(path, "r+b") as f:
            f.seek(b.position)
            raw = bytearray(f.read(b.size))
            f.seek(b.position)
            f.write(set_max_timestamp(raw, -1))
    for path in segment_files(data_dir, topic, 0, ".timeindex"):
        path.write_bytes(b"")                               # it never indexed a -1 batch
    assert {b.max_timestamp for _p, b in all_batches(data_dir, topic, 0)} == {-1}

    cluster.start_broker(0)
    wait_until(lambda: _searchable(cluster.bootstrap, topic), timeout=30, what=f"{topic} served")
    _check_stored(cluster, topic, expected_max)
    stamps = sorted({ts for _o, ts in records})
    times = [T0 - 1] + stamps + [stamps[-1] + 1]
    assert [log_end_offset(cluster.bootstrap, topic, 0, t) for t in times] == \
        [_first_at_or_after(records, t) for t in times]


def _searchable(bootstrap, topic):
    try:
        return log_end_offset(bootstrap, topic, 0, -1) == 4 * N
    except (OSError, RuntimeError):
        return False
