"""Round trip through the broker with each client we support, read back by each of them.

Invariant (per producer x consumer): what the producer wrote is what every consumer reads, byte for
byte (keys, null keys, empty/null values, headers incl. null header values, explicit timestamps),
offsets are contiguous from 0 in every partition, each keyed record sits in the partition the
producer's own partitioner chose, and — where the producer reports offsets — the record at each
acknowledged (partition, offset) is exactly the one acknowledged there.

Producers: kcat (Debian's librdkafka 2.0, one run per codec gzip/snappy/lz4/zstd plus -Z runs for
NULLs), confluent-kafka, kafka-python with its defaults (idempotent, acks=all), aiokafka.
Consumers: the same four, by partition assignment (no groups). 20,000 records per producer.
"""
from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest

from checkers import (CONSUMERS, Rec, check_content, end_offsets, kcat_produce, librdkafka_partition,
                      murmur2_partition, wait_for_topic)

N = 20_000
PARTITIONS = 3          # the session cluster auto-creates topics with 3 partitions
TS_BASE = 1_600_000_000_000


def _rand_bytes(rng, lo, hi):
    return rng.randbytes(rng.randint(lo, hi))


def make_records(n: int, seed: int, null_headers: bool, both_null: bool = True) -> list[Rec]:
    """Keys: null, empty, repeating and binary; values: null, empty, binary of 1..300 bytes, and a
    few of 20-60 KiB; headers: an id, null/empty values; explicit, non-monotonic timestamps."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 5 == 0:
            key = None
        elif i % 13 == 1:
            key = b""
        elif i % 3 == 0:
            key = _rand_bytes(rng, 1, 40)
        else:
            key = b"key-%d" % (i % 101)
        if i % 7 == 3:
            value = None
        elif i % 11 == 4:
            value = b""
        elif i % 1999 == 5:
            value = _rand_bytes(rng, 20_000, 60_000)
        else:
            value = b"%d:" % i + _rand_bytes(rng, 0, 300)
        if key is None and value is None and not both_null:
            key = b"both-null-refused"       # kafka-python and aiokafka refuse a record with neither
        headers = [("id", b"%d" % i)]
        if i % 3 == 0:
            headers.append(("nul", None) if null_headers else ("three", b"3"))
        if i % 4 == 0:
            headers.append(("empty", b""))
        if i % 17 == 0:
            headers.append(("id", b"dup-key-%d" % i))      # repeated header keys are legal
        ts = TS_BASE + i * 10 - (5000 if i % 9 == 0 else 0)
        out.append(Rec(key, value, tuple(headers), ts))
    return out


def produce_confluent(bootstrap, topic, recs):
    import confluent_kafka as ck

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "message.timeout.ms": 60000})
    acked = {}
    errors = []

    def on_delivery(err, msg, rec):
        if err is not None:
            errors.append(err)
        else:
            acked[(msg.partition(), msg.offset())] = rec

    for rec in recs:
        while True:
            try:
                p.produce(topic, value=rec.value, key=rec.key, headers=list(rec.headers), timestamp=rec.timestamp,
                          on_delivery=lambda err, msg, rec=rec: on_delivery(err, msg, rec))
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(60)
    assert left == 0 and not errors, (left, errors[:5])
    return acked


def produce_kafka_python(bootstrap, topic, recs):
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap)          # defaults: idempotent, acks=all
    try:
        futures = [(p.send(topic, key=r.key, value=r.value, headers=list(r.headers), timestamp_ms=r.timestamp), r)
                   for r in recs]
        p.flush(60)
        acked = {}
        for f, r in futures:
            md = f.get(timeout=60)
            acked[(md.partition, md.offset)] = r
    finally:
        p.close(10)
    return acked


def produce_aiokafka(bootstrap, topic, recs):
    from aiokafka import AIOKafkaProducer

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await p.start()
        try:
            futures = []
            for r in recs:
                futures.append((await p.send(topic, value=r.value, key=r.key, headers=list(r.headers),
                                             timestamp_ms=r.timestamp), r))
            acked = {}
            for f, r in futures:
                md = await asyncio.wait_for(f, 60)
                acked[(md.partition, md.offset)] = r
            return acked
        finally:
            await p.stop()

    return asyncio.run(run())


KCAT_PLAN_ALL = [("gzip", False, 4500), ("snappy", False, 4500), ("lz4", False, 4500), ("zstd", False, 4500),
                 (None, True, 1000), ("zstd", True, 1000)]
# kafka-python in our venv has only gzip (no python-snappy/lz4/zstandard): it reads a kcat topic
# written with the codecs it can decode instead (same 20,000-record shape).
KCAT_PLAN_GZIP = [("gzip", False, 9000), (None, False, 9000), (None, True, 1000), ("gzip", True, 1000)]


def _kafka_python_codecs():
    import kafka.codec as kc
    have = {"gzip": kc.has_gzip(), "snappy": kc.has_snappy(), "lz4": kc.has_lz4(), "zstd": kc.has_zstd()}
    return {c for c, ok in have.items() if ok}


def kcat_runs(seed: int, plan):
    """(codec, -Z?, lines, expected records) for each kcat invocation; 20,000 records in all.
    kcat has no per-message headers or timestamps: headers are per run, timestamps are not checked."""
    rng = random.Random(seed)
    printable = bytes(c for c in range(32, 127)) + bytes(range(128, 256))   # no TAB / LF
    runs = []
    serial = 0
    for codec, null_empty, count in plan:
        headers = (("src", b"kcat"), ("codec", (codec or "none").encode()))
        lines, recs = [], []
        for _ in range(count):
            serial += 1
            k = b"" if serial % 6 == 0 else (b"key-%d" % (serial % 97) if serial % 2 else
                                           bytes(rng.choice(printable) for _ in range(rng.randint(1, 20))))
            v = b"" if serial % 10 == 0 else (b"%d:" % serial + bytes(rng.choice(printable)
                                                                     for _ in range(rng.randint(0, 200))))
            lines.append(k + b"\t" + v)
            if null_empty:
                recs.append(Rec(k or None, v or None, headers, None))
            else:
                recs.append(Rec(k, v, headers, None))
        runs.append((codec, null_empty, lines, recs, ["%s=%s" % (a, b.decode()) for a, b in headers]))
    return runs


@pytest.fixture(scope="module")
def produced(kafka_cluster):
    """One topic per producer on the session cluster; returns name -> (topic, expected, acked_at,
    partitioner, timestamps checked?)."""
    bootstrap = kafka_cluster.bootstrap
    uid = uuid.uuid4().hex[:8]
    out = {}

    for name, plan in [("kcat", KCAT_PLAN_ALL), ("kcat-gzip", KCAT_PLAN_GZIP)]:
        if name == "kcat-gzip" and {"snappy", "lz4", "zstd"} <= _kafka_python_codecs():
            continue
        topic = f"rt-{name}-{uid}"
        expected = []
        for codec, null_empty, lines, recs, headers in kcat_runs(1, plan):
            kcat_produce(bootstrap, topic, lines, codec=codec, null_empty=null_empty, headers=headers)
            expected.extend(recs)
        out[name] = (topic, expected, None, librdkafka_partition, False)

    for name, fn, part, null_hdr, seed in [
            ("confluent", produce_confluent, librdkafka_partition, True, 2),
            ("kafka-python", produce_kafka_python, murmur2_partition, False, 3),
            ("aiokafka", produce_aiokafka, murmur2_partition, True, 4)]:
        topic = f"rt-{name}-{uid}"
        recs = make_records(N, seed, null_hdr, both_null=name == "confluent")
        t0 = time.monotonic()
        acked = fn(bootstrap, topic, recs)
        assert len(acked) == N, f"{name}: {len(acked)} distinct acked offsets for {N} records"
        print(f"{name}: produced {N} in {time.monotonic() - t0:.1f}s")
        out[name] = (topic, recs, acked, part, True)

    for name, (topic, recs, *_rest) in out.items():
        wait_for_topic(bootstrap, topic, PARTITIONS)
        ends = end_offsets(bootstrap, topic, PARTITIONS)
        assert sum(ends.values()) == len(recs), f"{name}: log end offsets {ends} for {len(recs)} records"
    return out


@pytest.mark.parametrize("consumer", list(CONSUMERS))
@pytest.mark.parametrize("producer", ["kcat", "confluent", "kafka-python", "aiokafka"])
def test_round_trip(kafka_cluster, produced, producer, consumer):
    bootstrap = kafka_cluster.bootstrap
    if producer == "kcat" and consumer == "kafka-python" and "kcat-gzip" in produced:
        producer = "kcat-gzip"
    topic, expected, acked_at, partitioner, with_ts = produced[producer]
    ends = end_offsets(bootstrap, topic, PARTITIONS)
    t0 = time.monotonic()
    got = CONSUMERS[consumer](bootstrap, topic, ends)
    elapsed = time.monotonic() - t0
    report = check_content(expected, got, partitioner=partitioner, n_partitions=PARTITIONS,
                           acked_at=acked_at, with_ts=with_ts)
    print(f"T-roundtrip producer={producer} consumer={consumer} {report.line()} read_s={elapsed:.1f}")
    assert report.ok, (report.line(), report.samples[:6])
    assert report.consumed == N
    assert all(ends[p] > 0 for p in ends), f"a partition got nothing: {ends}"


def test_checker_sees_violations(produced):
    """The content checker must flag a changed byte, a dropped record, a gap and a misplaced key."""
    topic, expected, acked_at, partitioner, _ = produced["confluent"]
    from checkers import Consumed

    consumed = [Consumed(p, o, r) for (p, o), r in sorted(acked_at.items())]
    assert check_content(expected, consumed, partitioner=partitioner, n_partitions=PARTITIONS,
                         acked_at=acked_at).ok
    # flip one byte of one value
    i = next(i for i, c in enumerate(consumed) if c.rec.value)
    c = consumed[i]
    bad = consumed[:i] + [Consumed(c.partition, c.offset, Rec(c.rec.key, bytes([c.rec.value[0] ^ 1]) + c.rec.value[1:],
                                                               c.rec.headers, c.rec.timestamp))] + consumed[i + 1:]
    r = check_content(expected, bad, acked_at=acked_at)
    assert r.missing == 1 and r.unexpected == 1 and r.order == 1
    # drop one record in the middle of a partition: missing + gap
    r = check_content(expected, consumed[:100] + consumed[101:])
    assert r.missing == 1 and r.gaps >= 1
    # a keyed record reported in another partition
    j = next(i for i, c in enumerate(consumed) if c.rec.key)
    c = consumed[j]
    moved = consumed[:j] + [Consumed((c.partition + 1) % PARTITIONS, c.offset, c.rec)] + consumed[j + 1:]
    r = check_content(expected, moved, partitioner=partitioner, n_partitions=PARTITIONS)
    assert r.misplaced == 1
