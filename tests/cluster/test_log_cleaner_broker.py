"""Compaction end to end on a real broker (ZooKeeper + broker processes via LocalCluster).

confluent-kafka (idempotent) writes many versions of a few keys, some ending in a tombstone, to a
topic with cleanup.policy=compact, small segments and min.cleanable.dirty.ratio=0.01; the broker's
cleaner thread (log.cleaner.backoff.ms=100) compacts it while the test keeps producing marker
records (unique keys) so segments roll. Invariants, read from the start by confluent-kafka and
kafka-python:
- every key's latest value (or tombstone, delete.retention.ms being an hour) is there, at its
  original offset, and no key appears twice once the cleaner has caught up;
- on a second topic with delete.retention.ms=500 the tombstones (and so their keys) are gone later;
- a keyless record produced to the compacted topic is refused with INVALID_RECORD (87).
"""
from __future__ import annotations

import uuid

from checkers import consume_confluent, consume_kafka_python, create_topic, log_end_offset
from kbroker.testing import LocalCluster, wait_until

KEYS = 12
VERSIONS = 60


def test_compacted_topic_end_to_end(tmp_path):
    import confluent_kafka as ck

    overrides = {"log.cleaner.backoff.ms": 100, "log.cleaner.dedupe.buffer.size": 1 << 20}
    with LocalCluster(tmp_path, overrides=overrides) as cluster:
        bs = cluster.bootstrap
        topic = f"compact-{uuid.uuid4().hex[:8]}"
        create_topic(bs, topic, 1, {"cleanup.policy": "compact", "segment.bytes": 2048, "segment.ms": 200,
                                    "min.cleanable.dirty.ratio": 0.01, "delete.retention.ms": 3600000})
        p = ck.Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 2,
                         "compression.type": "lz4"})
        latest = {}
        offsets = {}

        def on_delivery(err, msg):
            assert err is None, err
            offsets[msg.key()] = msg.offset()

        for v in range(VERSIONS):
            for k in range(KEYS):
                key = b"key-%d" % k
                value = None if (v == VERSIONS - 1 and k < 3) else b"value-%d-%d" % (k, v) + b"x" * 40
                p.produce(topic, key=key, value=value, partition=0, on_delivery=on_delivery)
                latest[key] = value
            p.poll(0)
        assert p.flush(30) == 0
        produced = KEYS * VERSIONS
        marker_no = [0]

        def compacted():
            # A marker per check moves record time on, so the active segment rolls (segment.ms).
            marker_no[0] += 1
            p.produce(topic, key=b"marker-%d" % marker_no[0], value=b"m", partition=0)
            assert p.flush(10) == 0
            end = log_end_offset(bs, topic, 0)
            recs = consume_confluent(bs, topic, {0: end})
            main = [r for r in recs if r.rec.key.startswith(b"key-")]
            return len(main) == KEYS and recs

        recs = wait_until(compacted, timeout=90, what="the cleaner to compact the topic")
        main = {r.rec.key: (r.offset, r.rec.value) for r in recs if r.rec.key.startswith(b"key-")}
        assert {k: v for k, (_o, v) in main.items()} == latest
        assert {k: o for k, (o, _v) in main.items()} == offsets, "compaction renumbered offsets"
        assert sum(1 for v in latest.values() if v is None) == 3
        assert len(recs) < produced / 4
        offs = [r.offset for r in recs]
        assert offs == sorted(set(offs))
        # kafka-python decodes the cleaned batches the broker serves too.
        end = log_end_offset(bs, topic, 0)
        kp = consume_kafka_python(bs, topic, {0: end})
        assert [(r.offset, r.rec.key, r.rec.value) for r in kp] == [(r.offset, r.rec.key, r.rec.value) for r in recs
                                                                   if r.offset < end]
        p.flush(10)

        # With a short delete.retention.ms the tombstones go too, on a later pass.
        short = f"compact-short-{uuid.uuid4().hex[:8]}"
        create_topic(bs, short, 1, {"cleanup.policy": "compact", "segment.bytes": 2048, "segment.ms": 200,
                                    "min.cleanable.dirty.ratio": 0.01, "delete.retention.ms": 500})
        expect = {}
        for v in range(20):
            for k in range(KEYS):
                key = b"key-%d" % k
                value = None if (v == 19 and k < 3) else b"v-%d-%d" % (k, v) + b"y" * 40
                p.produce(short, key=key, value=value, partition=0)
                expect[key] = value
        assert p.flush(30) == 0
        survivors = {k: v for k, v in expect.items() if v is not None}

        def tombstones_gone():
            marker_no[0] += 1
            p.produce(short, key=b"marker-%d" % marker_no[0], value=b"m", partition=0)
            assert p.flush(10) == 0
            recs = consume_confluent(bs, short, {0: log_end_offset(bs, short, 0)})
            main = {r.rec.key: r.rec.value for r in recs if r.rec.key.startswith(b"key-")}
            return main == survivors

        wait_until(tombstones_gone, timeout=90, what="expired tombstones to be cleaned away")

        # Keyless records have no place in a compacted topic.
        plain = ck.Producer({"bootstrap.servers": bs, "enable.idempotence": False, "retries": 0})
        errors = []
        plain.produce(topic, value=b"no key", partition=0, on_delivery=lambda err, msg: errors.append(err))
        plain.flush(30)
        assert len(errors) == 1 and errors[0] is not None and errors[0].code() == ck.KafkaError.INVALID_RECORD, errors
