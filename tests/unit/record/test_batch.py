"""kbroker._native.batch against real client libraries and the pure-Python
reference decoder: validate-and-stamp, Kafka's error codes, reading,
building for every codec, and fuzzing."""
import random
import struct

import aiokafka.record.default_records as aio_records
import kafka.codec as kp_codec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KpBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder

from kbroker._native import batch as B
from kbroker._native.crc import crc32c
from kbroker.record import decode_records as decode_any
from kbroker.record import reference
from kbroker.record.compression import CompressionError
from kbroker.protocol.errors import Errors

CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, INVALID_TIMESTAMP = (Errors.CORRUPT_MESSAGE, Errors.MESSAGE_TOO_LARGE, Errors.INVALID_TIMESTAMP)
UNSUPPORTED_FOR_MESSAGE_FORMAT, UNSUPPORTED_COMPRESSION_TYPE, INVALID_RECORD = (Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT, Errors.UNSUPPORTED_COMPRESSION_TYPE, Errors.INVALID_RECORD)
MAX = 1048588
CODECS = [0, 1, 2, 3, 4]

RECORDS = [
    (1_700_000_000_000, b"key-0", b"value-0", []),
    (1_700_000_000_005, None, b"null key", [("h1", b"v1")]),
    (1_699_999_999_990, b"null value", None, [("h-null", None), ("h2", b"")]),
    (1_700_000_000_001, b"", b"", []),
    (1_700_000_000_002, b"k" * 300, b"\x00\xff" * 2000, [("\u00e9t\u00e9", b"\x01" * 200)]),
]


def kp_batch(records=RECORDS, codec=0, producer_id=-1, epoch=-1, seq=-1,
             transactional=False):
    b = KpBuilder(2, codec, transactional, producer_id, epoch, seq, 1 << 24)
    for i, (ts, k, v, h) in enumerate(records):
        b.append(i, ts, k, v, h)
    return bytearray(b.build())


def aio_batch(records=RECORDS, codec=0, producer_id=-1, epoch=-1, seq=-1):
    b = aio_records.DefaultRecordBatchBuilder(2, codec, 0, producer_id, epoch, seq, 1 << 24)
    for i, (ts, k, v, h) in enumerate(records):
        assert b.append(i, ts, k, v, h) is not None
    return bytearray(b.build())


def our_batch(records=RECORDS, codec=0, **build):
    b = B.BatchBuilder(codec, 1 << 24)
    for ts, k, v, h in records:
        assert b.append(ts, k, v, h)
    return b.build(**build)


def expected(records, base_offset=0, append_time=-1):
    return [(base_offset + i, append_time if append_time >= 0 else ts, k, v, list(h))
            for i, (ts, k, v, h) in enumerate(records)]


def kp_read(buf):
    batch = KpBatch(bytes(buf))
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


def aio_read(buf):
    batch = aio_records.DefaultRecordBatch(bytes(buf))
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


def ref_read(buf):
    return [tuple(r) for r in reference.decode_batch(buf)[1]]


def refresh_crc(buf):
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return buf


def patch(buf, fmt, offset, value, fix_crc=True):
    struct.pack_into(fmt, buf, offset, value)
    return refresh_crc(buf) if fix_crc else buf


def stamp_error(buf, max_bytes=MAX):
    before = bytes(buf)
    with pytest.raises(B.BatchError) as e:
        B.validate_and_stamp(memoryview(buf), 42, 3, max_bytes, -1)
    assert bytes(buf) == before, "a rejected batch must not be stamped"
    return e.value.error_code


# ------------------------------------------------------------ validate + stamp

@pytest.mark.parametrize("make", [kp_batch, aio_batch])
def test_stamp_create_time(make):
    buf = make(producer_id=77, epoch=2, seq=10)
    crc_before = struct.unpack_from(">I", buf, 17)[0]
    info = B.validate_and_stamp(memoryview(buf), 1000, 9, MAX, -1)
    assert (info.size, info.base_offset, info.partition_leader_epoch) == (len(buf), 1000, 9)
    assert (info.record_count, info.last_offset_delta, info.last_offset) == (5, 4, 1004)
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (77, 2, 10)
    assert info.first_timestamp == RECORDS[0][0]
    assert info.max_timestamp == max(r[0] for r in RECORDS)
    assert (info.codec, info.timestamp_type, info.is_control, info.is_transactional) == (0, 0, False, False)
    assert info.crc == crc_before == struct.unpack_from(">I", buf, 17)[0]
    assert struct.unpack_from(">qii", buf, 0) == (1000, len(buf) - 12, 9)
    want = expected(RECORDS, 1000)
    assert B.decode_records(buf, True) == want
    assert ref_read(buf) == want
    assert kp_read(buf) == want
    assert aio_read(buf) == want


@pytest.mark.parametrize("make", [kp_batch, aio_batch])
def test_stamp_log_append_time(make):
    buf = make()
    info = B.validate_and_stamp(memoryview(buf), 5, 1, MAX, 1_800_000_000_000)
    assert info.timestamp_type == 1 and info.attributes & 0x08
    assert info.max_timestamp == 1_800_000_000_000
    assert info.crc == crc32c(memoryview(buf)[21:]) == struct.unpack_from(">I", buf, 17)[0]
    want = expected(RECORDS, 5, 1_800_000_000_000)
    assert B.decode_records(buf, True) == want
    assert ref_read(buf) == want
    assert kp_read(buf) == want
    assert aio_read(buf) == want
    kp = KpBatch(bytes(buf))
    assert kp.timestamp_type == 1 and kp.max_timestamp == 1_800_000_000_000


@pytest.mark.parametrize("codec", CODECS)
def test_stamp_compressed_from_aiokafka(codec):
    buf = aio_batch(codec=codec)
    info = B.validate_and_stamp(memoryview(buf)[0:], 200, 4, MAX, -1)
    assert info.codec == codec and info.base_offset == 200
    want = expected(RECORDS, 200)
    assert decode_any(buf, check_crc=True) == want
    assert aio_read(buf) == want
    assert ref_read(buf) == want


def test_stamp_slice_of_larger_buffer():
    one = kp_batch()
    frame = bytearray(b"HEAD" + bytes(one) + b"TAIL")
    B.validate_and_stamp(memoryview(frame)[4:4 + len(one)], 7, 0, MAX, -1)
    assert frame[:4] == b"HEAD" and frame[-4:] == b"TAIL"
    assert kp_read(frame[4:-4])[0][0] == 7


def test_read_only_buffer_refused():
    with pytest.raises((BufferError, TypeError)):
        B.validate_and_stamp(bytes(kp_batch()), 0, 0, MAX, -1)


def test_large_batch_releases_gil_path():
    records = [(1, b"k%d" % i, bytes(1000), []) for i in range(200)]
    buf = kp_batch(records)
    assert len(buf) > 4096
    info = B.validate_and_stamp(memoryview(buf), 1, 1, MAX, 99)
    assert info.record_count == 200 and kp_read(buf)[199][0] == 200


# ------------------------------------------------------------ error codes

def test_error_magic():
    buf = kp_batch()
    buf[16] = 1
    assert stamp_error(buf) == UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert stamp_error(bytearray(b"\x00" * 16 + b"\x00" + b"\x00" * 20)) == UNSUPPORTED_FOR_MESSAGE_FORMAT


def test_error_too_short_and_bad_length():
    buf = kp_batch()
    assert stamp_error(bytearray(10)) == CORRUPT_MESSAGE
    assert stamp_error(buf[:-1]) == CORRUPT_MESSAGE                 # batchLength + 12 > len
    assert stamp_error(buf[:60]) == CORRUPT_MESSAGE
    short = patch(bytearray(buf), ">i", 8, 48, fix_crc=False)         # < 61-byte header
    assert stamp_error(short) == CORRUPT_MESSAGE


def test_error_more_than_one_batch_or_trailing_bytes():
    assert stamp_error(kp_batch() + kp_batch()) == INVALID_RECORD
    assert stamp_error(kp_batch() + b"\x00") == INVALID_RECORD


def test_error_too_large():
    buf = kp_batch()
    assert stamp_error(buf, max_bytes=len(buf) - 1) == MESSAGE_TOO_LARGE
    B.validate_and_stamp(memoryview(buf), 0, 0, len(buf), -1)


def test_error_crc():
    buf = kp_batch()
    buf[-1] ^= 0x40
    assert stamp_error(buf) == CORRUPT_MESSAGE
    buf = kp_batch()
    buf[17] ^= 1
    assert stamp_error(buf) == CORRUPT_MESSAGE


def test_baseoffset_and_leader_epoch_are_outside_crc():
    buf = kp_batch()
    struct.pack_into(">i", buf, 12, 1234)   # clients may send any epoch
    B.validate_and_stamp(memoryview(buf), 0, 0, MAX, -1)
    buf = patch(kp_batch(), ">q", 0, 5, fix_crc=False)
    assert stamp_error(buf) == INVALID_RECORD


def test_error_counts():
    assert stamp_error(patch(kp_batch(), ">i", 57, 0)) == INVALID_RECORD
    assert stamp_error(patch(kp_batch(), ">i", 57, -1)) == INVALID_RECORD
    assert stamp_error(patch(kp_batch(), ">i", 23, 3)) == INVALID_RECORD
    # Header consistent (count 4, delta 3) but 5 records inside.
    buf = patch(kp_batch(), ">i", 57, 4)
    assert stamp_error(patch(buf, ">i", 23, 3)) == INVALID_RECORD
    # Header says 6 records, only 5 inside.
    buf = patch(kp_batch(), ">i", 57, 6)
    assert stamp_error(patch(buf, ">i", 23, 5)) == INVALID_RECORD


def test_error_control_batch():
    buf = kp_batch()
    attrs = struct.unpack_from(">h", buf, 21)[0]
    assert stamp_error(patch(buf, ">h", 21, attrs | 0x20)) == INVALID_RECORD


def test_error_producer_without_sequence():
    assert stamp_error(kp_batch(producer_id=5, epoch=0, seq=-1)) == INVALID_RECORD
    B.validate_and_stamp(memoryview(kp_batch(producer_id=5, epoch=0, seq=0)), 0, 0, MAX, -1)


def test_error_client_log_append_time():
    buf = kp_batch()
    attrs = struct.unpack_from(">h", buf, 21)[0]
    assert stamp_error(patch(buf, ">h", 21, attrs | 0x08)) == INVALID_TIMESTAMP


def test_error_unknown_codec():
    assert stamp_error(patch(kp_batch(), ">h", 21, 6)) == UNSUPPORTED_COMPRESSION_TYPE


def test_error_offset_deltas_not_sequential():
    records = [(1, b"a", b"x", []), (2, b"b", b"y", [])]
    b = KpBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    b.append(0, 1, b"a", b"x", [])
    b.append(5, 2, b"b", b"y", [])  # offsetDelta 5 instead of 1
    buf = bytearray(b.build())
    struct.pack_into(">i", buf, 23, 1)  # kafka-python derives lastOffsetDelta from it
    refresh_crc(buf)
    assert stamp_error(buf) == INVALID_RECORD
    B.validate_and_stamp(memoryview(kp_batch(records)), 0, 0, MAX, -1)


def test_error_records_do_not_fill_batch():
    buf = kp_batch()
    extra = buf + b"\x00"
    struct.pack_into(">i", extra, 8, len(extra) - 12)
    assert stamp_error(refresh_crc(extra)) == INVALID_RECORD
    # A record whose length runs past the batch end.
    rec_start = 61
    buf2 = bytearray(kp_batch([(1, b"a", b"b", [])]))
    buf2[rec_start] = 0x7E  # zigzag 63: far longer than the record
    assert stamp_error(refresh_crc(buf2)) == INVALID_RECORD


# ------------------------------------------------------------ reading

def test_iter_batches_positions_and_partial_tail():
    parts = [our_batch(RECORDS[:i + 1]) for i in range(3)]
    stream = bytearray()
    positions = []
    for i, p in enumerate(parts):
        p = bytearray(p)
        B.validate_and_stamp(memoryview(p), 10 * i, 0, MAX, -1)
        positions.append(len(stream))
        stream += p
    infos = B.iter_batches(stream + parts[0][:40], check_crc=True)
    assert [i.position for i in infos] == positions
    assert [i.base_offset for i in infos] == [0, 10, 20]
    assert [i.record_count for i in infos] == [1, 2, 3]
    assert [i.position for i in B.iter_batches(stream, positions[1])] == positions[1:]
    assert B.iter_batches(stream[:positions[1] + 11]) [-1].position == 0
    assert B.iter_batches(b"") == []


def test_iter_batches_rejects_corruption():
    stream = bytearray(our_batch() + our_batch())
    stream[-1] ^= 1
    assert len(B.iter_batches(stream)) == 2
    with pytest.raises(B.BatchError) as e:
        B.iter_batches(stream, check_crc=True)
    assert e.value.error_code == CORRUPT_MESSAGE
    struct.pack_into(">i", stream, 8, 10)
    with pytest.raises(B.BatchError):
        B.iter_batches(stream)


def test_native_decode_refuses_compressed():
    with pytest.raises(B.BatchError) as e:
        B.decode_records(our_batch(codec=1))
    assert e.value.error_code == UNSUPPORTED_COMPRESSION_TYPE


def test_decompression_cap_applies_to_batches():
    buf = our_batch([(1, None, bytes(3_000_000), [])], codec=4)
    assert len(buf) < 10_000
    with pytest.raises(B.BatchError) as e:
        decode_any(buf, max_decompressed=1 << 20)
    assert e.value.error_code == CORRUPT_MESSAGE
    assert decode_any(buf)[0][3] == bytes(3_000_000)


# ------------------------------------------------------------ building

@pytest.mark.parametrize("codec", CODECS)
def test_builder_readable_by_clients(codec):
    buf = our_batch(codec=codec, producer_id=9, producer_epoch=1, base_sequence=3,
                    partition_leader_epoch=-1)
    want = expected(RECORDS)
    assert aio_read(buf) == want
    assert ref_read(buf) == want
    assert decode_any(buf, check_crc=True) == want
    kp_has = {0: True, 1: kp_codec.has_gzip(), 2: kp_codec.has_snappy(),
              3: kp_codec.has_lz4(), 4: kp_codec.has_zstd()}[codec]
    if kp_has:
        assert kp_read(buf) == want
    kp = KpBatch(bytes(buf))
    assert (kp.producer_id, kp.producer_epoch, kp.base_sequence) == (9, 1, 3)
    assert kp.compression_type == codec and kp.last_offset_delta == 4
    assert kp.first_timestamp == RECORDS[0][0]
    assert kp.max_timestamp == max(r[0] for r in RECORDS)
    info = B.validate_and_stamp(memoryview(bytearray(buf)), 0, 0, MAX, -1)
    assert info.codec == codec and info.record_count == 5


def test_builder_matches_kafka_python_bytes_uncompressed():
    # Same records, same header fields => identical bytes (format is canonical).
    # kafka-python writes partitionLeaderEpoch 0 where we default to -1.
    ours = our_batch(partition_leader_epoch=0)
    theirs = kp_batch()
    assert bytes(ours) == bytes(theirs)


def test_builder_batch_size_and_flags():
    b = B.BatchBuilder(0, 200)
    assert b.append(1, None, bytes(500))      # first record always fits
    assert not b.append(2, None, b"x")
    assert b.record_count == 1
    b = B.BatchBuilder(0, 200)
    n = 0
    while b.append(5, b"k", b"v" * 10):
        n += 1
    assert b.size_in_bytes() <= 200 and b.record_count == n > 1
    out = b.build(is_transactional=True, partition_leader_epoch=4)
    assert len(out) == b.size_in_bytes()
    kp = KpBatch(out)
    assert kp.is_transactional and kp.leader_epoch == 4
    with pytest.raises(RuntimeError):
        b.append(1, None, b"x")
    with pytest.raises(ValueError):
        B.BatchBuilder(5)


def test_builder_accepts_buffers_and_current_time():
    b = B.BatchBuilder()
    assert b.append(None, memoryview(b"key"), bytearray(b"val"), [(b"hk", memoryview(b"hv"))])
    (rec,) = B.decode_records(b.build())
    assert rec[2:] == (b"key", b"val", [("hk", b"hv")])
    assert rec[1] > 1_600_000_000_000


# ------------------------------------------------------------ properties / fuzz

record_st = st.tuples(
    st.integers(0, 1 << 42),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.one_of(st.none(), st.binary(max_size=200)),
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
             max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=20), st.sampled_from(CODECS))
def test_property_build_decode_agree(records, codec):
    buf = our_batch(records, codec)
    want = expected(records)
    assert decode_any(buf, check_crc=True) == want
    assert ref_read(buf) == want
    assert aio_read(buf) == want
    if codec == 0:
        kp = kp_batch(records)
        assert bytes(kp) == bytes(our_batch(records, 0, partition_leader_epoch=0))


def _verdict(fn, *args):
    try:
        fn(*args)
    except B.BatchError as e:
        return e.error_code
    return 0


def _check_mutant(buf):
    # validate_batch (read-only, any thread) must give exactly validate_and_stamp's verdict.
    before = bytes(buf)
    pre = _verdict(B.validate_batch, bytes(buf), MAX)
    try:
        info = B.validate_and_stamp(memoryview(buf), 3, 1, MAX, -1)
    except B.BatchError as e:
        assert e.error_code in (2, 10, 32, 43, 76, 87)
        assert pre == e.error_code
        return
    assert pre == 0, before
    # Accepted: the oracle must agree it is a well-formed batch. Like Kafka,
    # the leader does not check that header keys are UTF-8; readers do.
    try:
        h, records = reference.decode_batch(buf)
    except UnicodeDecodeError:
        with pytest.raises(B.BatchError):
            B.decode_records(buf)
        return
    except CompressionError:
        # Compressed batches are stored as sent (the leader does not decompress them), so a mutant
        # whose codec bits now name a codec its bytes are not in is accepted here; readers reject it.
        assert info.codec != 0
        with pytest.raises(B.BatchError):
            decode_any(bytes(buf))
        return
    assert info.record_count == len(records) == h.records_count
    if h.codec == 0:
        assert [r.offset for r in records] == list(range(3, 3 + len(records)))


def _check_decode_mutant(buf):
    try:
        got = B.decode_records(buf)
    except B.BatchError:
        return
    assert got == [tuple(r) for r in reference.decode_batch(buf, check_crc=False)[1]]


BASE = bytes(kp_batch(RECORDS[:3]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(BASE) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.booleans(), st.integers(-3, 3))
def test_fuzz_mutations(edits, fix_crc, resize):
    buf = bytearray(BASE)
    for pos, val in edits:
        buf[pos] = val
    if resize > 0:
        buf += bytes(resize)
    elif resize < 0:
        del buf[resize:]
    if fix_crc and len(buf) >= 21:
        refresh_crc(buf)
    _check_mutant(bytearray(buf))
    if fix_crc and len(buf) >= 61:
        _check_decode_mutant(bytes(buf))


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=200))
def test_fuzz_random_bytes(data):
    _check_mutant(bytearray(data))
    try:
        B.iter_batches(data, check_crc=True)
    except B.BatchError:
        pass
    try:
        B.decode_record_data(data, 3, 0, 0)
    except B.BatchError:
        pass


# ------------------------------------------------------------ validate_batch / prevalidated

def lying_compressed(codec, claimed=1_000_000):
    """A valid compressed batch whose header claims ``claimed`` records (CRC fixed up)."""
    buf = bytearray(our_batch(RECORDS[:1], codec=codec))
    struct.pack_into(">i", buf, 57, claimed)
    struct.pack_into(">i", buf, 23, claimed - 1)
    return refresh_crc(buf)


@pytest.mark.parametrize("codec", CODECS)
def test_validate_batch_same_verdicts_and_reads_only(codec):
    good = bytes(our_batch(codec=codec))
    assert B.validate_batch(good, MAX) is None              # bytes: read-only buffers are fine
    cases = {
        "lie": bytes(lying_compressed(codec)) if codec else None,
        "crc": bytes(patch(bytearray(good), ">B", len(good) - 1, good[-1] ^ 1, fix_crc=False)),
        "big": good,
        "nullkey": bytes(our_batch(codec=codec)),            # RECORDS[1] has a null key
    }
    for name, buf in cases.items():
        if buf is None:
            continue
        kw = {"compacted": name == "nullkey"}
        max_bytes = 100 if name == "big" else MAX
        want = _verdict(B.validate_and_stamp, bytearray(buf), 0, 0, max_bytes, -1, kw["compacted"])
        assert want != 0, name
        got = _verdict(B.validate_batch, buf, max_bytes, kw["compacted"])
        assert got == want, (name, got, want)


def test_validate_batch_threads_and_bombs():
    # Many threads at once, each codec, good and lying batches: every verdict as on one thread.
    from concurrent.futures import ThreadPoolExecutor
    jobs = []
    for codec in CODECS:
        jobs.append((bytes(our_batch(codec=codec)), 0))
        if codec:
            jobs.append((bytes(lying_compressed(codec, 2)), INVALID_RECORD))
    bomb = B.BatchBuilder(4, 1 << 30)
    for _ in range(40):
        bomb.append(0, None, bytes(1 << 20))
    jobs.append((bomb.build(), CORRUPT_MESSAGE))             # 40 MiB of zeros, cap 16 MiB
    def run(job):
        buf, want = job
        return _verdict(B.validate_batch, buf, 1 << 30, False, 16 << 20) == want
    with ThreadPoolExecutor(8) as ex:
        assert all(ex.map(run, jobs * 8))


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_prevalidated_skips_only_the_record_walk(codec):
    # A lying compressed batch passes when prevalidated (the record walk is what was skipped) ...
    buf = lying_compressed(codec, 5)
    info = B.validate_and_stamp(buf, 100, 7, MAX, -1, prevalidated=True)
    assert info.base_offset == 100 and info.partition_leader_epoch == 7
    assert stamp_error(lying_compressed(codec, 5)) == INVALID_RECORD
    # ... but the header checks and the CRC still run.
    bad_crc = lying_compressed(codec, 5)
    bad_crc[-1] ^= 1
    with pytest.raises(B.BatchError) as e:
        B.validate_and_stamp(bad_crc, 0, 0, MAX, -1, prevalidated=True)
    assert e.value.error_code == CORRUPT_MESSAGE
    with pytest.raises(B.BatchError) as e:
        B.validate_and_stamp(bytearray(our_batch(codec=codec)), 0, 0, 100, -1, prevalidated=True)
    assert e.value.error_code == MESSAGE_TOO_LARGE


def test_layout_exposed_to_python_matches_the_wire():
    L = B.LAYOUT
    assert (L["HEADER_SIZE"], L["LOG_OVERHEAD"], L["CRC_START"]) == (61, 12, 21)
    buf = bytearray(our_batch(producer_id=9, producer_epoch=2, base_sequence=4))
    info = B.read_batch(buf)
    assert struct.unpack_from(">q", buf, L["OFF_PRODUCER_ID"])[0] == info.producer_id == 9
    assert struct.unpack_from(">h", buf, L["OFF_PRODUCER_EPOCH"])[0] == 2
    assert struct.unpack_from(">i", buf, L["OFF_BASE_SEQUENCE"])[0] == 4
    assert struct.unpack_from(">i", buf, L["OFF_RECORDS_COUNT"])[0] == info.record_count
    assert struct.unpack_from(">q", buf, L["OFF_MAX_TIMESTAMP"])[0] == info.max_timestamp
