"""read_committed in kbroker's client over one Fetch answer, as Kafka's consumers do it (KIP-98): the
batches of aborted transactions listed in the answer are skipped up to their producer's marker, a
later transaction of the same producer is read, control batches never show; read_uncommitted reads
every data batch. Batches come from kafka-python's encoder, markers from the log's own builder."""
import struct

import pytest

from builders import batch
from kbroker.client import AbortedFilter, Consumer
from kbroker.log.txn_index import control_batch
from kbroker.record import iter_batches


def _at(buf, base_offset: int) -> bytes:
    b = bytearray(buf)
    struct.pack_into(">q", b, 0, base_offset)      # the base offset is outside the CRC
    return bytes(b)


def _answer() -> bytes:
    """pid 1 commits [0, 2]; pid 2 aborts [3, 5] and later commits [8, 10]; [12, 14] is not transactional."""
    return b"".join([
        _at(batch(3, 4, pid=1, epoch=0, seq=0, transactional=True), 0),
        _at(batch(3, 4, pid=2, epoch=0, seq=0, transactional=True), 3),
        control_batch(1, 0, True, 0, 6, 0),
        control_batch(2, 0, False, 0, 7, 0),
        _at(batch(3, 4, pid=2, epoch=0, seq=3, transactional=True), 8),
        control_batch(2, 0, True, 0, 11, 0),
        _at(batch(3, 4), 12),
    ])


ABORTED = [{"producer_id": 2, "first_offset": 3}]
COMMITTED = [0, 1, 2, 8, 9, 10, 12, 13, 14]


def test_filter_skips_aborted_batches_and_markers():
    f = AbortedFilter(ABORTED)
    kept = [i.base_offset for i in iter_batches(memoryview(_answer()), 0, True) if not f.skip(i)]
    assert kept == [0, 8, 12]


def test_filter_without_aborted_transactions_skips_only_markers():
    f = AbortedFilter(None)
    kept = [i.base_offset for i in iter_batches(memoryview(_answer()), 0, True) if not f.skip(i)]
    assert kept == [0, 3, 8, 12]


@pytest.mark.parametrize("isolation,expected", [
    ("read_committed", COMMITTED),
    ("read_uncommitted", [0, 1, 2, 3, 4, 5, 8, 9, 10, 12, 13, 14]),
])
def test_consumer_decode_honours_its_isolation_level(isolation, expected):
    c = Consumer("127.0.0.1:1", isolation_level=isolation)
    answer = {"aborted_transactions": ABORTED}
    records, next_offset = c._decode("t", 0, _answer(), 0, c.aborted_of(answer))
    assert [r.offset for r in records] == expected
    assert next_offset == 15
    # a fetch from inside the aborted range still skips the rest of it
    records, _ = c._decode("t", 0, _answer(), 4, c.aborted_of(answer))
    assert [r.offset for r in records] == [o for o in expected if o >= 4]
