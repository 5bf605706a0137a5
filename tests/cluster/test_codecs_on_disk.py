"""Compressed batches are stored exactly as the producer sent them.

Invariant: after ``kcat -z <codec>`` produces to one partition, every batch in that partition's
``.log`` files carries the codec in its attribute bits 0-2 (it arrived compressed and the broker
stored it without recompressing), its CRC32C is valid, the batches' record counts add up to what was
sent, and a consumer reads back exactly the records that went in.
"""
from __future__ import annotations

import random
import uuid
import zlib

import cramjam
import pytest

from checkers import (API_VERSIONS, CODECS, RawConn, Rec, all_batches, check_content, consume_confluent, crc_ok, end_offsets,
                      kcat_produce, scan_log, segment_files)

N = 5000


def _records(seed):
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"kafka", b"broker", b"\xff\xfe", b"0123456789"]
    lines, recs = [], []
    for i in range(N):
        key = b"k%d" % (i % 50)
        value = b"%d " % i + b" ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
        lines.append(key + b"\t" + value)
        recs.append(Rec(key, value, (("codec", b"x"),), None))
    return lines, recs


def _advertised(bootstrap) -> dict:
    with RawConn(bootstrap) as c:
        resp = c.request(API_VERSIONS, 0, {})
    return {k["api_key"]: (k["min_version"], k["max_version"]) for k in resp["api_keys"]}


def _client_kept_plain(path, batch, codec) -> bool:
    """librdkafka sends a batch uncompressed when the codec would make its records larger (small batches,
    e.g. one short record when the machine is slow enough to flush each line alone). True when this
    uncompressed batch is one: its records, compressed as librdkafka does at its default level, do not
    shrink. A batch the broker decompressed would shrink, and is still caught."""
    with open(path, "rb") as f:
        f.seek(batch.position + 61)
        records = f.read(batch.size - 61)
    if codec == "gzip":
        z = zlib.compressobj(6, zlib.DEFLATED, 31)          # zlib's default level, gzip framing
        packed = len(z.compress(records) + z.flush())
    elif codec == "lz4":
        packed = len(bytes(cramjam.lz4.compress(records)))    # the frame format
    elif codec == "snappy":
        packed = len(bytes(cramjam.snappy.compress_raw(records)))
    elif codec == "zstd":
        packed = len(bytes(cramjam.zstd.compress(records)))
    else:
        return False
    return packed > len(records)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_codec_stored_as_sent(kafka_cluster, codec):
    bootstrap = kafka_cluster.bootstrap
    data_dir = kafka_cluster.brokers[0].data_dir
    topic = f"codec-{codec}-{uuid.uuid4().hex[:8]}"
    lines, recs = _records(sum(codec.encode()))
    kcat_produce(bootstrap, topic, lines, codec=None if codec == "none" else codec, partition=0,
                 headers=["codec=x"], extra=["-X", "linger.ms=20"])

    batches = all_batches(data_dir, topic, 0)
    assert batches, f"no batches on disk for {topic}-0"
    wrong_codec = [(p.name, b.position, b.codec) for p, b in batches
                   if b.codec != CODECS[codec] and not (b.codec == 0 and _client_kept_plain(p, b, codec))]
    bad_crc = [(p.name, b.position) for p, b in batches if not crc_ok(p, b)]
    records_on_disk = sum(b.record_count for _p, b in batches)
    print(f"codec={codec} batches={len(batches)} records={records_on_disk} wrong_codec={len(wrong_codec)} "
          f"bad_crc={len(bad_crc)}")
    if wrong_codec:
        advertised = _advertised(bootstrap)
        hint = ""
        if codec == "lz4" and 10 not in advertised:
            hint = (" -- librdkafka enables its LZ4 feature only when the broker advertises FindCoordinator "
                    "(api key 10), which this broker does not: kcat logs 'Broker does not support compression "
                    "type lz4: not compressing batch'")
        raise AssertionError(f"{len(wrong_codec)} of {len(batches)} batches stored with another codec: "
                             f"{wrong_codec[:3]}{hint}")
    assert bad_crc == [], bad_crc[:5]
    assert records_on_disk == N
    assert all(b.magic == 2 for _p, b in batches)
    # offsets: batches tile [0, N) without gaps or overlaps
    expect = 0
    for _p, b in batches:
        assert b.base_offset == expect, (b.base_offset, expect)
        assert b.record_count == b.last_offset_delta + 1
        expect = b.last_offset + 1
    assert expect == N
    if codec != "none":
        # compressed for real: the stored batches are smaller than the raw records
        raw = sum(len(line) for line in lines)
        assert sum(b.size for _p, b in batches) < raw

    ends = end_offsets(bootstrap, topic, 1)
    assert ends == {0: N}
    got = consume_confluent(bootstrap, topic, ends)
    report = check_content(recs, got, with_ts=False)
    assert report.ok, (report.line(), report.samples)
    # order within the partition is the order kcat sent (one partition, one producer)
    assert [c.rec.value for c in got] == [r.value for r in recs]


def test_scan_sees_wrong_codec_and_crc(kafka_cluster, tmp_path):
    """The on-disk checks can fail: a copied segment with its codec bits changed is reported, and
    its CRC no longer matches."""
    bootstrap = kafka_cluster.bootstrap
    topic = f"codec-check-{uuid.uuid4().hex[:8]}"
    lines, _recs = _records(7)
    kcat_produce(bootstrap, topic, lines[:200], codec="lz4", partition=0)
    src = segment_files(kafka_cluster.brokers[0].data_dir, topic, 0)[0]
    data = bytearray(src.read_bytes())
    batches, tail = scan_log(src)
    assert batches and tail == 0
    pos = batches[0].position + 21 + 1          # low byte of attributes
    data[pos] = (data[pos] & ~0x7) | CODECS["gzip"]
    copy = tmp_path / src.name
    copy.write_bytes(bytes(data))
    b2, _ = scan_log(copy)
    assert b2[0].codec == CODECS["gzip"] != CODECS["lz4"]
    assert not crc_ok(copy, b2[0])
