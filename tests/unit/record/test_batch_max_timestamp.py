"""The leader sets a CreateTime batch's maxTimestamp from its records, as Kafka's LogValidator does
(clients such as Sarama write -1 there): header corrected and CRC rewritten, compressed or not, on
validate_and_stamp, on validate_batch (whose caller then appends ``prevalidated``), and through the
general decompression path as through the streaming one. Batches from kafka-python's builder."""
import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch as KpBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder

from kbroker._native import batch as B
from kbroker._native import codec as C
from kbroker._native.crc import crc32c

MAX = 1 << 22
T0 = 1_700_000_000_000
# Not monotonic: the largest timestamp is neither the first nor the last record's.
STAMPS = [T0, T0 + 40, T0 - 25, T0 + 90, T0 + 15]
RECORDS_MAX = max(STAMPS)


def batch(codec, header_max=None):
    b = KpBuilder(2, codec, False, -1, -1, -1, 1 << 24)
    for i, ts in enumerate(STAMPS):
        b.append(i, ts, b"key-%d" % i, b"value-%d-" % i + b"x" * 200, [("h", b"%d" % i)])
    buf = bytearray(b.build())
    assert struct.unpack_from(">q", buf, 35)[0] == RECORDS_MAX      # the builder writes it right
    if header_max is not None:
        struct.pack_into(">q", buf, 35, header_max)
        struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return buf


def stored(buf):
    """(maxTimestamp, CRC valid, the records as kafka-python reads them)."""
    kp = KpBatch(bytes(buf))
    return (struct.unpack_from(">q", buf, 35)[0], kp.validate_crc(),
            [(r.offset, r.timestamp, r.key, r.value) for r in kp])


WRONG = {"minus-one": -1, "too-small": T0 - 1000, "too-large": T0 + 10_000, "first": T0}
CODECS = [0, 1, 2, 3, 4]


@pytest.fixture(params=[True, False], ids=["streaming", "general"])
def streaming(request):
    old = C.set_streaming(request.param)
    yield request.param
    C.set_streaming(old)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("wrong", WRONG.values(), ids=WRONG.keys())
def test_stamp_sets_max_timestamp_from_the_records(codec, wrong, streaming):
    right = batch(codec)
    B.validate_and_stamp(memoryview(right), 100, 3, MAX, -1)
    buf = batch(codec, wrong)
    info = B.validate_and_stamp(memoryview(buf), 100, 3, MAX, -1)
    assert info.max_timestamp == RECORDS_MAX and info.first_timestamp == T0
    assert info.crc == crc32c(memoryview(buf)[21:])
    assert stored(buf) == stored(right) and stored(buf)[:2] == (RECORDS_MAX, True)
    assert bytes(buf) == bytes(right)


@pytest.mark.parametrize("codec", CODECS)
def test_a_right_batch_is_left_as_sent(codec, streaming):
    buf = batch(codec)
    before = bytes(buf)
    info = B.validate_and_stamp(memoryview(buf), 7, 1, MAX, -1)
    assert info.max_timestamp == RECORDS_MAX
    assert bytes(buf[16:]) == before[16:] and bytes(buf[8:12]) == before[8:12]   # only baseOffset, epoch
    assert bytes(buf[:8]) + bytes(buf[12:16]) == struct.pack(">qi", 7, 1)


@pytest.mark.parametrize("codec", CODECS)
def test_log_append_time_still_wins(codec):
    buf = batch(codec, -1)
    info = B.validate_and_stamp(memoryview(buf), 0, 0, MAX, T0 + 5_000_000)
    assert info.max_timestamp == T0 + 5_000_000 and info.timestamp_type == 1
    assert KpBatch(bytes(buf)).validate_crc()


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("wrong", WRONG.values(), ids=WRONG.keys())
def test_validate_batch_sets_it_for_a_prevalidated_append(codec, wrong, streaming):
    buf = batch(codec, wrong)
    B.validate_batch(memoryview(buf), MAX)
    assert stored(buf)[:2] == (RECORDS_MAX, True)
    info = B.validate_and_stamp(memoryview(buf), 55, 2, MAX, -1, prevalidated=True)
    assert info.max_timestamp == RECORDS_MAX and stored(buf)[:2] == (RECORDS_MAX, True)


def test_validate_batch_on_read_only_bytes_only_reads():
    buf = bytes(batch(1, -1))
    B.validate_batch(buf, MAX)
    assert struct.unpack_from(">q", buf, 35)[0] == -1


def test_an_invalid_batch_is_not_corrected():
    buf = batch(0, -1)
    struct.pack_into(">I", buf, 17, 0)               # bad CRC: refused, untouched
    before = bytes(buf)
    with pytest.raises(B.BatchError):
        B.validate_and_stamp(memoryview(buf), 0, 0, MAX, -1)
    with pytest.raises(B.BatchError):
        B.validate_batch(memoryview(buf), MAX)
    assert bytes(buf) == before


def test_check_section_ts_reports_the_largest_delta():
    buf = batch(4)
    outcome, delta = C.check_section_ts(memoryview(buf)[61:], 4, len(STAMPS), False, MAX)
    assert (outcome, delta) == (C.OK, RECORDS_MAX - T0)
    assert C.check_section(memoryview(buf)[61:], 4, len(STAMPS), False, MAX) == C.OK
