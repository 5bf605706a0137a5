"""The segment files are Kafka's on-disk format, readable by other implementations' record code.

After kcat, confluent-kafka, kafka-python and aiokafka write one partition with several codecs
(log.segment.bytes=1 MiB, log.index.interval.bytes=4096, so several segments), every ``.log`` file
is parsed with kafka-python's ``MemoryRecords`` and aiokafka's (C) ``MemoryRecords`` over the raw file
bytes. Invariants:
- each file is a whole number of batches; every batch's CRC32C checks (both libraries);
- records decode to exactly what a consumer read at the same offsets (aiokafka: every codec;
  kafka-python: the codecs it has libraries for, batch-level checks for the others);
- segment base offsets are the file names, and batches tile the offsets without gaps;
- ``.index``: 8-byte entries (relative offset u32, position u32); entries sit exactly where Kafka's
  rule puts them (an entry for a batch when more than index.interval.bytes were appended since the
  previous entry), each pointing at a batch start whose last offset is base + relative offset;
  a rolled segment's index has no preallocated tail (size == entries x 8);
- ``.timeindex``: 12-byte entries, timestamps and offsets non-decreasing and inside the segment,
  no preallocated tail on rolled segments.
"""
from __future__ import annotations

import asyncio
import random
import struct
import uuid

from checkers import (consume_confluent, kcat_produce, log_end_offset, scan_log, segment_files, wait_for_topic)
from kbroker.testing import LocalCluster

INDEX_INTERVAL = 4096
SEGMENT_BYTES = 1 << 20


def _values(tag, n, rng):
    return [b"%s-%d-" % (tag.encode(), i) + rng.randbytes(rng.randint(0, 600)) for i in range(n)]


def _produce_all(bootstrap, topic, rng):
    import confluent_kafka as ck
    from kafka import KafkaProducer
    from aiokafka import AIOKafkaProducer

    for codec in ["gzip", "snappy", "zstd", None]:
        lines = [b"kc%d\t" % i + b"kcat-%s-%d-" % ((codec or "none").encode(), i) + b"y" * rng.randint(0, 400)
                 for i in range(1500)]
        kcat_produce(bootstrap, topic, lines, codec=codec, partition=0)
    for codec in ["none", "gzip", "zstd", "snappy"]:
        p = ck.Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 10})
        for v in _values(f"ck-{codec}", 1500, rng):
            p.produce(topic, value=v, key=v[:6], partition=0)
        assert p.flush(30) == 0
    for codec in [None, "gzip"]:
        p = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=10)
        fs = [p.send(topic, value=v, key=v[:5], partition=0) for v in _values(f"kp-{codec}", 1500, rng)]
        p.flush(30)
        [f.get(30) for f in fs]
        p.close(10)

    async def aio():
        for codec in ["lz4", "snappy", "zstd"]:
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=10)
            await p.start()
            try:
                fs = [await p.send(topic, value=v, key=v[:5], partition=0) for v in _values(f"aio-{codec}", 1500, rng)]
                await asyncio.gather(*fs)
            finally:
                await p.stop()
    asyncio.run(aio())


def _kafka_python_codecs():
    import kafka.codec as kc
    return {0} | {c for c, ok in [(1, kc.has_gzip()), (2, kc.has_snappy()), (3, kc.has_lz4()), (4, kc.has_zstd())]
                  if ok}


def _parse_kafka_python(data):
    from kafka.record.memory_records import MemoryRecords

    usable = _kafka_python_codecs()
    mr = MemoryRecords(data)
    batches, records = [], []
    while mr.has_next():
        b = mr.next_batch()
        if b is None:
            break
        assert b.validate_crc(), f"kafka-python: CRC mismatch in batch at offset {b.base_offset}"
        batches.append((b.base_offset, b.last_offset_delta, b.compression_type))
        if b.compression_type in usable:
            records.extend((r.offset, r.key, r.value) for r in b)
    return batches, records, mr.valid_bytes() if hasattr(mr, "valid_bytes") else None


def _parse_aiokafka(data):
    from aiokafka.record.memory_records import MemoryRecords

    mr = MemoryRecords(data)
    batches, records = [], []
    while mr.has_next():
        b = mr.next_batch()
        if b is None:
            break
        assert b.validate_crc(), f"aiokafka: CRC mismatch in batch at offset {b.base_offset}"
        batches.append((b.base_offset, b.last_offset_delta, b.compression_type))
        records.extend((r.offset, r.key, r.value) for r in b)
    return batches, records


def _index_entries(path, esize, fmt, rolled):
    data = path.read_bytes()
    assert len(data) % esize == 0, f"{path.name}: size {len(data)} not a multiple of {esize}"
    entries = [struct.unpack_from(fmt, data, i) for i in range(0, len(data), esize)]
    if rolled:
        assert all(e != (0, 0) for e in entries), f"{path.name}: zero-filled tail on a rolled segment"
    else:
        # the active segment may be preallocated: keep the prefix before the zero fill
        n = next((i for i, e in enumerate(entries) if e == (0, 0)), len(entries))
        assert all(e == (0, 0) for e in entries[n:]), f"{path.name}: data after the zero fill"
        entries = entries[:n]
    return entries


def _expected_index(batches, interval):
    """Kafka's LogSegment.append rule over the batches of one segment."""
    since = 0
    out = []
    for b in batches:
        if since > interval:
            out.append((b.last_offset, b.position))
            since = 0
        since += b.size
    return out


def test_segments_readable_by_other_implementations(tmp_path):
    rng = random.Random(11)
    with LocalCluster(tmp_path / "cluster", num_partitions=1, overrides={
            "log.segment.bytes": SEGMENT_BYTES, "log.index.interval.bytes": INDEX_INTERVAL}) as c:
        topic = f"format-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, 1)
        _produce_all(c.bootstrap, topic, rng)
        leo = log_end_offset(c.bootstrap, topic, 0)
        consumed = consume_confluent(c.bootstrap, topic, {0: leo}, timeout=120)
        data_dir = c.brokers[0].data_dir
        logs = segment_files(data_dir, topic, 0)
        assert len(logs) >= 4, f"expected several segments, got {len(logs)}"
        seen = {m.offset: (m.offset, m.rec.key, m.rec.value) for m in consumed}
        assert sorted(seen) == list(range(leo))

        next_offset = 0
        stats = {"batches": 0, "kp_records": 0, "aio_records": 0, "index_entries": 0, "time_entries": 0,
                 "codecs": set()}
        for i, log in enumerate(logs):
            rolled = i < len(logs) - 1
            base = int(log.name[:20])
            data = log.read_bytes()
            ours, tail = scan_log(log)
            assert tail == 0, f"{log.name}: {tail} trailing bytes"
            assert ours and ours[0].base_offset == base == next_offset, (log.name, ours[0].base_offset, next_offset)
            for b in ours:
                assert b.base_offset == next_offset, f"{log.name}: batch at {b.base_offset}, expected {next_offset}"
                next_offset = b.last_offset + 1

            kp_batches, kp_records, _ = _parse_kafka_python(data)
            aio_batches, aio_records = _parse_aiokafka(data)
            mine = [(b.base_offset, b.last_offset_delta, b.codec) for b in ours]
            assert kp_batches == mine, f"{log.name}: kafka-python sees other batches"
            assert aio_batches == mine, f"{log.name}: aiokafka sees other batches"
            assert [r[0] for r in aio_records] == list(range(base, next_offset))
            bad = [r for r in aio_records if seen.get(r[0]) != r]
            assert bad == [], f"{log.name}: aiokafka records differ from the consumer's: {bad[:2]}"
            bad = [r for r in kp_records if seen.get(r[0]) != r]
            assert bad == [], f"{log.name}: kafka-python records differ from the consumer's: {bad[:2]}"
            stats["batches"] += len(ours)
            stats["kp_records"] += len(kp_records)
            stats["aio_records"] += len(aio_records)
            stats["codecs"] |= {b.codec for b in ours}

            # .index
            idx = _index_entries(log.with_suffix(".index"), 8, ">II", rolled)
            by_pos = {b.position: b for b in ours}
            for rel, pos in idx:
                assert pos in by_pos, f"{log.name}: index position {pos} is not a batch start"
                assert by_pos[pos].last_offset == base + rel, (log.name, rel, pos, by_pos[pos].last_offset)
            assert [(base + r, p) for r, p in idx] == _expected_index(ours, INDEX_INTERVAL), \
                f"{log.name}: index entries not where Kafka's rule puts them"
            if rolled:
                assert idx, f"{log.name}: a 1 MiB segment with no index entry"
            stats["index_entries"] += len(idx)

            # .timeindex
            tidx = _index_entries(log.with_suffix(".timeindex"), 12, ">qI", rolled)
            ts = [t for t, _r in tidx]
            rels = [r for _t, r in tidx]
            assert ts == sorted(ts), f"{log.name}: timestamps decrease"
            assert rels == sorted(rels), f"{log.name}: time index offsets decrease"
            assert all(base + r < next_offset for r in rels)
            seg_max = max(b.max_timestamp for b in ours)
            assert all(t <= seg_max for t in ts)
            stats["time_entries"] += len(tidx)
        assert next_offset == leo
        assert stats["aio_records"] == leo
        assert {1, 2, 4} <= stats["codecs"], stats["codecs"]   # gzip, snappy, zstd made it to disk compressed
        print(f"T-format segments={len(logs)} " + " ".join(f"{k}={v}" for k, v in stats.items()))


def test_index_rule_model():
    """The index expectation model follows Kafka's rule (entry once more than interval bytes went by)."""
    from checkers import StoredBatch

    def b(pos, base, size):
        return StoredBatch(pos, base, size - 12, 0, 2, 0, 0, 0, 0, 0, -1, 1)
    batches = [b(0, 0, 3000), b(3000, 1, 3000), b(6000, 2, 100), b(6100, 3, 5000), b(11100, 4, 10)]
    # since before batch 2 = 6000 > 4096 -> entry at batch 2; then 100, 5100 > 4096 -> entry at batch 4
    assert _expected_index(batches, 4096) == [(2, 6000), (4, 11100)]
