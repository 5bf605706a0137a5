"""``__transaction_state`` record formats (Kafka's TransactionLogKey v0 / TransactionLogValue v0-1) and the
coordinator's state machine rules, in-process."""
import struct

import pytest

from kbroker.coordinator.transaction import records as R
from kbroker.coordinator.transaction.metadata import IllegalTransition, TxnMetadata


def test_key_bytes_are_kafkas():
    assert R.encode_key("tx") == b"\x00\x00\x00\x02tx"
    assert R.decode_key(R.encode_key("é-id")) == "é-id"


def test_value_v0_bytes_and_round_trip():
    v = R.TxnValue(7, 3, 60000, R.ONGOING, {"a": [0, 2], "b": [1]}, 1000, 900)
    raw = R.encode_value(v)
    want = (struct.pack(">hqhib", 0, 7, 3, 60000, 1) + struct.pack(">i", 2)
             + struct.pack(">h", 1) + b"a" + struct.pack(">iii", 2, 0, 2)
             + struct.pack(">h", 1) + b"b" + struct.pack(">ii", 1, 1)
             + struct.pack(">qq", 1000, 900))
    assert raw == want
    assert R.decode_value(raw) == v


def _uvarint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_value_v1_flexible_with_tagged_fields():
    raw = (struct.pack(">hqhib", 1, 9, 0, 1000, R.PREPARE_COMMIT)
           + _uvarint(2) + _uvarint(2) + b"t" + _uvarint(2) + struct.pack(">i", 4) + _uvarint(0)
           + struct.pack(">qq", 50, 40)
           + _uvarint(2) + _uvarint(0) + _uvarint(8) + struct.pack(">q", 5)
           + _uvarint(2) + _uvarint(2) + struct.pack(">h", 2))
    v = R.decode_value(raw)
    assert (v.producer_id, v.state, v.partitions, v.last_update_ms, v.start_ms, v.previous_producer_id) == \
        (9, R.PREPARE_COMMIT, {"t": [4]}, 50, 40, 5)


@pytest.mark.parametrize("raw", [b"", b"\x00\x05", struct.pack(">hqhib", 0, 1, 0, 1, 9), b"\x00\x00\x00"])
def test_bad_values_are_refused(raw):
    with pytest.raises(R.RecordFormatError):
        R.decode_value(raw)


def test_transitions_follow_kafkas_table():
    m = TxnMetadata("x", 1, -1, 0, -1, 1000, R.EMPTY)
    with pytest.raises(IllegalTransition):
        m.value(R.PREPARE_COMMIT, now_ms=1)
    m.apply(m.value(R.ONGOING, partitions={("t", 0)}, start_ms=5, now_ms=5))
    assert m.state == R.ONGOING and m.partitions == {("t", 0)}
    with pytest.raises(IllegalTransition):
        m.value(R.COMPLETE_COMMIT, now_ms=6)
    m.apply(m.value(R.PREPARE_ABORT, epoch=1, now_ms=6))
    assert (m.producer_epoch, m.last_producer_epoch) == (1, 0)
    m.apply(m.value(R.COMPLETE_ABORT, partitions=set(), now_ms=7))
    assert m.state == R.COMPLETE_ABORT and not m.partitions and m.start_ms == 5
    m.apply(m.value(R.EMPTY, producer_id=2, epoch=0, now_ms=8))
    assert (m.producer_id, m.last_producer_id, m.producer_epoch) == (2, 1, 0)
