"""Appends whose bytes are written on a writer thread (Log.begin_append_as_leader / WriteJob.run /
finish_append): readers never see offsets whose bytes are not written, anything that
changes the log first settles the write in flight, duplicates and refusals never reach the writer."""
import os
import threading

import pytest

from kbroker.log import AppendResult, LogAppendError
from kbroker.log.log import WriteJob
from kbroker.protocol.errors import Errors

from test_log import T0, batch, open_log, read_offsets


def test_offsets_visible_only_after_the_write(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), 1, T0)
    job = log.begin_append_as_leader(batch(4, value_size=5000), 1, T0)
    assert isinstance(job, WriteJob) and (job.base, job.last) == (3, 6)
    # stamped but not written: LEO, HW, segment size and reads are those before the batch
    assert log.log_end_offset == log.high_watermark == 3
    assert log.active_segment.size == os.path.getsize(log.active_segment.log_path)
    assert read_offsets(log, log.read(0, 1 << 20)) == [0, 1, 2]
    t = threading.Thread(target=job.run)
    t.start()
    t.join()
    assert job.done.is_set() and job.error is None
    assert log.log_end_offset == 3                      # still: the loop has not finished it
    r = log.finish_append(job)
    assert (r.base_offset, r.last_offset) == (3, 6)
    assert log.log_end_offset == log.high_watermark == 7
    assert read_offsets(log, log.read(0, 1 << 20)) == [0, 1, 2, 3, 4, 5, 6]
    assert log.finish_append(job) == r                  # finishing twice is the same outcome
    r2 = log.append_as_leader(batch(2), 1, T0)          # the next append continues after it
    assert r2.base_offset == 7
    log.close()
    reopened = open_log(tmp_path)
    assert reopened.log_end_offset == 9
    reopened.close()


@pytest.mark.parametrize("change", ["truncate_to", "append_as_leader", "roll", "close_for_delete"])
def test_changes_settle_the_write_in_flight(tmp_path, change):
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), 1, T0)
    job = log.begin_append_as_leader(batch(4, value_size=20_000), 1, T0)
    gate = threading.Event()

    def slow_write():
        gate.wait(5)
        job.run()

    t = threading.Thread(target=slow_write)
    t.start()
    threading.Timer(0.2, gate.set).start()
    # The change waits for the write (bounded by one batch) and finishes the append first.
    if change == "truncate_to":
        assert log.truncate_to(5)
        assert log.log_end_offset == 3                  # the whole batch 3-6 goes, as Kafka truncates
        seg = log.active_segment
        assert seg.size == os.path.getsize(seg.log_path)
    elif change == "append_as_leader":
        assert log.append_as_leader(batch(1), 1, T0).base_offset == 7
        assert read_offsets(log, log.read(0, 1 << 20)) == list(range(8))
    elif change == "roll":
        log.roll(T0)
        assert [s.base_offset for s in log.segments] == [0, 7]
    else:
        log.close_for_delete()
    t.join()
    assert job.outcome is not None and job.done.is_set()
    assert log.finish_append(job).last_offset == 6      # the caller still learns its offsets
    if change != "close_for_delete":
        log.close()


def test_duplicate_and_refused_batches_never_reach_the_writer(tmp_path):
    log = open_log(tmp_path)
    first = log.append_as_leader(batch(3, pid=7, epoch=0, seq=0), 1, T0)
    dup = log.begin_append_as_leader(batch(3, pid=7, epoch=0, seq=0), 1, T0)
    assert type(dup) is AppendResult and (dup.base_offset, dup.last_offset) == (first.base_offset, first.last_offset)
    torn = batch(3)
    torn[20] ^= 0xFF                                      # CRC no longer matches
    with pytest.raises(LogAppendError) as e:
        log.begin_append_as_leader(torn, 1, T0)
    assert e.value.error_code == Errors.CORRUPT_MESSAGE
    assert log._write_job is None and log.log_end_offset == 3
    log.close()


def test_failed_write_leaves_the_log_as_it_was(tmp_path):
    """A write error on the writer thread (here: the descriptor refuses writes) is reported as
    KAFKA_STORAGE_ERROR by finish_append and nothing of the batch stays."""
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), 1, T0)
    seg = log.active_segment
    job = log.begin_append_as_leader(batch(4, value_size=5000), 1, T0)
    ro = os.open(seg.log_path, os.O_RDONLY)
    real, seg._append_fd = seg._append_fd, ro
    try:
        job.run()
    finally:
        seg._append_fd = real
        os.close(ro)
    assert job.error is not None
    with pytest.raises(LogAppendError) as e:
        log.finish_append(job)
    assert e.value.error_code == Errors.KAFKA_STORAGE_ERROR
    assert log.log_end_offset == 3 and seg.size == os.path.getsize(seg.log_path)
    assert log.append_as_leader(batch(1), 1, T0).base_offset == 3
    log.close()
