"""The group coordinator's TxnOffsetCommit batches in the offsets partition's log, as Kafka writes and
checks them (AppendOrigin.COORDINATOR): each carries the producer's id and epoch with base sequence 0,
the log checks the epoch only, and two such batches are two appends, never a retried duplicate or an
out-of-order sequence. A client's batches on its own partitions keep every sequence check."""
import pytest

from kbroker.coordinator.store import build_batch
from kbroker.log import Log, LogAppendError, LogConfig
from kbroker.log import errors
from builders import T0

PID = 4000


def offsets_batch(epoch: int, n: int):
    """What txn_commit_offsets appends: ``n`` offset records in a transactional batch at sequence 0."""
    return memoryview(build_batch([(b"key-%d" % i, b"value") for i in range(n)], T0, (PID, epoch, 0)))


def open_log(tmp_path):
    return Log(str(tmp_path / "__consumer_offsets-0"), "__consumer_offsets", 0, LogConfig({}), clean_shutdown=True)


def test_coordinator_batches_are_each_appended(tmp_path):
    log = open_log(tmp_path)
    log.producer_state.coordinator_appends = True
    a = log.append_as_leader(offsets_batch(0, 2), 0, T0)          # offsets of two partitions
    b = log.append_as_leader(offsets_batch(0, 2), 0, T0)          # the same shape again: not a duplicate
    c = log.append_as_leader(offsets_batch(0, 1), 0, T0)          # sequence 0 again: not out of order
    assert [(r.base_offset, r.last_offset) for r in (a, b, c)] == [(0, 1), (2, 3), (4, 4)]
    assert log.log_end_offset == 5
    assert log.last_stable_offset == 0                             # one open transaction from offset 0
    log.append_control(PID, 0, True, 0, 0, now=T0)
    assert log.last_stable_offset == log.high_watermark == 6
    log.append_as_leader(offsets_batch(1, 1), 0, T0)               # the producer's next epoch
    with pytest.raises(LogAppendError) as e:                       # the epoch is still checked
        log.append_as_leader(offsets_batch(0, 1), 0, T0)
    assert e.value.error_code == errors.INVALID_PRODUCER_EPOCH


def test_client_batches_keep_the_sequence_checks(tmp_path):
    log = open_log(tmp_path)                                       # coordinator_appends off: a client's log
    a = log.append_as_leader(offsets_batch(0, 2), 0, T0)
    b = log.append_as_leader(offsets_batch(0, 2), 0, T0)           # a retried batch: answered, not written
    assert (b.base_offset, b.last_offset) == (a.base_offset, a.last_offset) == (0, 1)
    assert log.log_end_offset == 2
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(offsets_batch(0, 1), 0, T0)           # sequence 0 after 0..1: out of order
    assert e.value.error_code == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
