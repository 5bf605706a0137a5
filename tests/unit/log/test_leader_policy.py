"""The leader's rewrites of producer batches: compression.type (recompression as Kafka's LogValidator)
and the KIP-937 timestamp bounds, on a real Log and its files."""
import os

import pytest
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from kbroker.log import Log, LogAppendError, LogConfig
from kbroker.log import errors

from builders import T0, batch

CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def open_log(path, **cfg):
    return Log(str(path / "t-0"), "t", 0, LogConfig(cfg))


def compressed_batch(codec: int, n=5, ts=T0, pid=-1, epoch=-1, seq=-1):
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=1 << 22)
    for i in range(n):
        b.append(i, timestamp=ts + i, key=b"k%d" % i, value=b"v" * 200, headers=[("h", b"x")])
    return memoryview(bytearray(b.build()))


def batches_on_disk(log):
    data = open(log.segments[-1].log_path, "rb").read()
    recs, out = MemoryRecords(data), []
    while recs.has_next():
        b = recs.next_batch()
        assert b.validate_crc()
        out.append((b.compression_type, b.producer_id, b.base_sequence,
                    [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in b]))
    return out


@pytest.mark.parametrize("target", ["gzip", "snappy", "lz4", "zstd", "uncompressed"])
def test_a_codec_recompresses_every_batch_keeping_records_and_producer_fields(tmp_path, target):
    log = open_log(tmp_path, **{"compression.type": target})
    assert log.config.leader_rewrites
    log.append_as_leader(batch(3), 0, T0)                                      # uncompressed in
    log.append_as_leader(compressed_batch(1, pid=7, epoch=0, seq=0), 0, T0)   # gzip in, idempotent
    want = CODEC_IDS.get(target, 0)
    on_disk = batches_on_disk(log)
    assert [b[0] for b in on_disk] == [want, want]
    assert [r[0] for r in on_disk[0][3]] == [0, 1, 2]
    assert on_disk[1][1:3] == (7, 0)
    assert [(r[0], r[1], r[2], r[4]) for r in on_disk[1][3]] == [
        (3 + i, T0 + i, b"k%d" % i, [("h", b"x")]) for i in range(5)]
    assert all(r[3] == b"v" * 200 for r in on_disk[1][3])
    # The retried idempotent batch is answered from producer state with its first offsets.
    dup = log.append_as_leader(compressed_batch(1, pid=7, epoch=0, seq=0), 0, T0)
    assert (dup.base_offset, dup.last_offset) == (3, 7)
    log.close()


def test_producer_keeps_each_batch_as_sent(tmp_path):
    log = open_log(tmp_path)                     # Kafka's default: compression.type=producer
    assert not log.config.leader_rewrites
    sent = bytes(compressed_batch(3))
    log.append_as_leader(compressed_batch(3), 0, T0)
    data = open(log.segments[-1].log_path, "rb").read()
    assert [b[0] for b in batches_on_disk(log)] == [3]
    assert data[61:] == sent[61:]                # the records section byte for byte
    log.close()


def test_the_same_codec_is_not_recompressed(tmp_path):
    log = open_log(tmp_path, **{"compression.type": "lz4"})
    sent = bytes(compressed_batch(3))
    log.append_as_leader(compressed_batch(3), 0, T0)
    assert open(log.segments[-1].log_path, "rb").read()[61:] == sent[61:]
    log.close()


def test_a_recompressed_batch_over_max_message_bytes_is_refused(tmp_path):
    # 50 KB of one byte compresses to little; stored uncompressed it passes max.message.bytes.
    b = DefaultRecordBatchBuilder(magic=2, compression_type=1, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
    b.append(0, timestamp=T0, key=None, value=b"a" * 50_000, headers=[])
    log = open_log(tmp_path, **{"compression.type": "uncompressed", "max.message.bytes": 10_000})
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(memoryview(bytearray(b.build())), 0, T0)
    assert e.value.error_code == errors.MESSAGE_TOO_LARGE
    assert log.log_end_offset == 0
    log.close()


@pytest.mark.parametrize("keys, ts, ok", [
    ({"message.timestamp.before.max.ms": 1000}, T0 - 1000, True),
    ({"message.timestamp.before.max.ms": 1000}, T0 - 1001, False),
    ({"message.timestamp.after.max.ms": 500}, T0 + 500, True),
    ({"message.timestamp.after.max.ms": 500}, T0 + 501, False),
    ({"message.timestamp.after.max.ms": 500}, T0 - 10**9, True),     # only the future is bounded
    # the deprecated difference bounds both sides while before/after keep their defaults
    ({"message.timestamp.difference.max.ms": 100}, T0 - 101, False),
    ({"message.timestamp.difference.max.ms": 100}, T0 + 101, False),
    ({"message.timestamp.difference.max.ms": 100, "message.timestamp.before.max.ms": 10**6}, T0 - 101, True),
    # LogAppendTime topics stamp the broker's time: the producer's is not checked
    ({"message.timestamp.before.max.ms": 0, "message.timestamp.type": "LogAppendTime"}, 0, True),
])
def test_timestamp_bounds(tmp_path, keys, ts, ok):
    log = open_log(tmp_path, **keys)
    # the last record of the batch carries the timestamp under test (ts_step)
    b = batch(2, ts=T0, ts_step=ts - T0)
    if ok:
        log.append_as_leader(b, 0, T0)
        assert log.log_end_offset == 2
    else:
        with pytest.raises(LogAppendError) as e:
            log.append_as_leader(b, 0, T0)
        assert e.value.error_code == errors.INVALID_TIMESTAMP
        assert f"Timestamp {ts} of message with offset 1 is out of range" in e.value.message
        assert log.log_end_offset == 0
        assert os.path.getsize(log.segments[-1].log_path) == 0
    log.close()


def test_timestamp_bounds_check_every_record_of_a_compressed_batch(tmp_path):
    log = open_log(tmp_path, **{"message.timestamp.before.max.ms": 2})
    log.append_as_leader(compressed_batch(4, n=3, ts=T0 - 2), 0, T0)             # T0-2 .. T0
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(compressed_batch(4, n=3, ts=T0 - 3), 0, T0)         # T0-3 first
    assert e.value.error_code == errors.INVALID_TIMESTAMP
    assert log.log_end_offset == 3
    log.close()


def test_begin_append_as_leader_applies_the_same_rewrite(tmp_path):
    log = open_log(tmp_path, **{"compression.type": "zstd"})
    job = log.begin_append_as_leader(batch(3), 0, T0)
    job.run()
    log.finish_append(job)
    assert [b[0] for b in batches_on_disk(log)] == [4]
    log.close()
