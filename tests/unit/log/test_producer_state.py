"""Idempotent producers: duplicates answered with the original offsets, sequence gaps (45),
fenced epochs (47), wrap-around, and state that survives clean and unclean restarts."""
import os
import struct

import pytest

from kbroker.log import Log, LogAppendError, LogConfig
from kbroker.log import errors
from kbroker.log.producer_state import INT32_MAX, ProducerStateManager, last_sequence
from kbroker.log.segment import STATS
import builders

T0 = builders.T0
PID = 4242


def batch(seq, n=3, pid=PID, epoch=0):
    return builders.batch(n, 50, T0, pid, epoch, seq, key=None, fill=b"p", ts_step=0)


def open_log(path, clean=True, **cfg):
    return Log(str(path / "t-0"), "t", 0, LogConfig(cfg), clean_shutdown=clean)


def code_of(log, buf):
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(buf, 0, T0)
    return e.value.error_code


def test_duplicate_returns_original_offsets(tmp_path):
    log = open_log(tmp_path)
    first = log.append_as_leader(batch(0), 0, T0)
    log.append_as_leader(batch(3), 0, T0)
    size = log.active_segment.size
    again = log.append_as_leader(batch(0), 0, T0)           # a retry of the first batch
    assert (again.base_offset, again.last_offset) == (first.base_offset, first.last_offset) == (0, 2)
    assert log.log_end_offset == 6 and log.active_segment.size == size
    log.close()


def test_only_last_five_batches_are_deduplicated(tmp_path):
    log = open_log(tmp_path)
    for k in range(6):
        log.append_as_leader(batch(3 * k), 0, T0)
    assert log.append_as_leader(batch(3), 0, T0).base_offset == 3       # 5th newest: dup
    assert code_of(log, batch(0)) == errors.OUT_OF_ORDER_SEQUENCE_NUMBER  # evicted
    log.close()


def test_sequence_gap_and_epoch_rules(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(0, epoch=2), 0, T0)
    assert code_of(log, batch(4, epoch=2)) == errors.OUT_OF_ORDER_SEQUENCE_NUMBER  # gap (want 3)
    assert code_of(log, batch(1, epoch=2)) == errors.OUT_OF_ORDER_SEQUENCE_NUMBER  # overlaps, not exact
    assert code_of(log, batch(3, epoch=1)) == errors.INVALID_PRODUCER_EPOCH
    assert code_of(log, batch(5, epoch=3)) == errors.OUT_OF_ORDER_SEQUENCE_NUMBER  # new epoch not at 0
    assert log.append_as_leader(batch(0, epoch=3), 0, T0).base_offset == 3
    assert code_of(log, batch(3, epoch=2)) == errors.INVALID_PRODUCER_EPOCH        # now fenced
    # Non-idempotent batches and other producers are independent.
    assert log.append_as_leader(batch(-1, pid=-1, epoch=-1), 0, T0).base_offset == 6
    assert log.append_as_leader(batch(77, pid=9), 0, T0).base_offset == 9        # unknown pid: any seq
    assert log.log_end_offset == 12
    log.close()


def test_sequence_wraps_at_int32_max(tmp_path):
    assert last_sequence(INT32_MAX - 1, 2) == 0
    log = open_log(tmp_path)
    log.append_as_leader(batch(INT32_MAX - 2, n=3), 0, T0)       # seqs MAX-2 .. MAX
    assert log.append_as_leader(batch(0, n=2), 0, T0).base_offset == 3
    log.append_as_leader(batch(2, n=3), 0, T0)
    log.close()
    log = open_log(tmp_path)
    ps = ProducerStateManager(str(tmp_path / "t-0"))
    assert ps.load_snapshot(8)
    assert [b.last_seq for b in ps.producers[PID].batches] == [INT32_MAX, 1, 4]
    assert log.append_as_leader(batch(0, n=2), 0, T0).base_offset == 3   # still a duplicate
    log.close()


@pytest.mark.parametrize("clean", [True, False])
def test_retry_after_restart_is_deduplicated(tmp_path, clean):
    log = open_log(tmp_path, **{"segment.bytes": 800})
    results = [log.append_as_leader(batch(3 * k), 0, T0) for k in range(8)]
    assert len(log.segments) > 1
    if clean:
        log.close()
    else:
        for s in log.segments:                                   # crash: nothing closed
            for fd in (s._append_fd, s.read_fd):
                if fd >= 0:
                    os.close(fd)
    scans = STATS["recovery_scans"]
    log = open_log(tmp_path, clean=clean, **{"segment.bytes": 800})
    assert (STATS["recovery_scans"] == scans) == clean
    # Each of the last five batches is still recognised.
    for k in range(3, 8):
        r = log.append_as_leader(batch(3 * k), 0, T0)
        assert (r.base_offset, r.last_offset) == (results[k].base_offset, results[k].last_offset)
    assert code_of(log, batch(3 * 9)) == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.append_as_leader(batch(24), 0, T0).base_offset == 24
    log.close()


def test_snapshot_is_kafka_v1_layout(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    ps = ProducerStateManager(str(d))
    for k in range(3):
        ps.update(7, 1, 10 * k, 9, 100 + 10 * k, T0 + k)
    ps.update(8, 0, 0, 0, 200, T0)
    ps.write_snapshot(201)
    raw = open(d / f"{201:020d}.snapshot", "rb").read()
    version, crc, count = struct.unpack_from(">hIi", raw)
    assert version == 1 and count == 4
    entries = list(struct.iter_unpack(">qhiqiqiq", raw[10:]))
    # Kafka keeps the last entry per producer id: ours is the newest batch.
    last_by_pid = {e[0]: e for e in entries}
    assert last_by_pid[7][:6] == (7, 1, 29, 129, 9, T0 + 2)
    assert last_by_pid[8][:4] == (8, 0, 0, 200)
    from kbroker._native.crc import crc32c
    assert crc32c(raw[6:]) == crc
    # A torn snapshot is refused, not half-loaded.
    open(d / f"{300:020d}.snapshot", "wb").write(raw[:-5])
    other = ProducerStateManager(str(d))
    assert not other.load_snapshot(300)
    assert other.load_snapshot(201) and len(other.producers[7].batches) == 3
