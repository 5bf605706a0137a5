"""Log: leader appends, rolls, KIP-74 reads bounded by the high watermark, retention,
timestamps, leader epochs, storage errors."""
import os
import subprocess
import threading

import pytest
from kafka.record import MemoryRecords

from kbroker._native import segment as _native
from kbroker.log import Log, LogAppendError, LogConfig, OffsetOutOfRange, validate_batch
from kbroker.log import errors

from builders import T0, batch


def open_log(path, **cfg):
    return Log(str(path / "t-0"), "t", 0, LogConfig(cfg))


def read_offsets(log, fd_data):
    out = []
    for fd, pos, length in fd_data.regions:
        recs = MemoryRecords(os.pread(fd, length, pos))
        while recs.has_next():
            b = recs.next_batch()
            assert b.validate_crc()
            out += [r.offset for r in b]
    return out


def test_append_assigns_offsets_and_files_parse(tmp_path):
    log = open_log(tmp_path)
    r1 = log.append_as_leader(batch(3), 5, T0)
    r2 = log.append_as_leader(batch(4), 5, T0)
    assert (r1.base_offset, r1.last_offset, r1.log_append_time_ms, r1.log_start_offset) == (0, 2, -1, 0)
    assert (r2.base_offset, r2.last_offset) == (3, 6)
    assert log.log_end_offset == log.high_watermark == 7
    data = open(tmp_path / "t-0" / "00000000000000000000.log", "rb").read()
    recs = MemoryRecords(data)
    b = recs.next_batch()
    assert b.base_offset == 0 and [r.offset for r in b] == [0, 1, 2]
    assert int.from_bytes(data[12:16], "big") == 5      # partitionLeaderEpoch stamped
    assert [r.offset for r in recs.next_batch()] == [3, 4, 5, 6]
    log.close()


def test_roll_by_size_names_segments_by_base_offset(tmp_path):
    log = open_log(tmp_path, **{"segment.bytes": 2000})
    for _ in range(12):
        log.append_as_leader(batch(5), 0, T0)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 2
    names = sorted(n for n in os.listdir(tmp_path / "t-0") if n.endswith(".log"))
    assert names == [f"{b:020d}.log" for b in bases]
    assert all(s.size <= 2000 for s in log.segments)
    # Closed segments' indexes were trimmed on roll.
    for s in log.segments[:-1]:
        assert os.path.getsize(s.index.path) == s.index.entries * 8
        assert os.path.getsize(s.time_index.path) == s.time_index.entries * 12
    assert read_offsets(log, log.read(0, 1 << 20)) == list(range(bases[1]))
    log.close()


def test_roll_by_time(tmp_path):
    log = open_log(tmp_path, **{"segment.ms": 1000})
    log.append_as_leader(batch(1, ts=T0), 0, T0)
    log.append_as_leader(batch(1, ts=T0 + 500), 0, T0 + 500)
    assert len(log.segments) == 1
    log.append_as_leader(batch(1, ts=T0 + 1000), 0, T0 + 1000)
    assert len(log.segments) == 1          # Kafka rolls when strictly more than segment.ms passed
    log.append_as_leader(batch(1, ts=T0 + 1001), 0, T0 + 1001)
    assert [s.base_offset for s in log.segments] == [0, 3]
    log.close()


def test_read_kip74_and_high_watermark(tmp_path):
    log = open_log(tmp_path)
    sizes = []
    for i in range(10):
        before = log.active_segment.size
        log.append_as_leader(batch(2, value_size=500), 0, T0)
        sizes.append(log.active_segment.size - before)
    # The first batch comes back whole even when max_bytes is smaller.
    d = log.read(0, 10)
    assert d.size == sizes[0] and read_offsets(log, d) == [0, 1]
    assert log.read(0, 10, min_one_batch=False).size == 0
    # Only whole batches: a limit of 2.5 batches gives 2.
    d = log.read(0, sizes[0] * 2 + sizes[0] // 2)
    assert read_offsets(log, d) == [0, 1, 2, 3]
    # Reading from the middle of a batch starts at that batch.
    assert read_offsets(log, log.read(3, sizes[0]))[:2] == [2, 3]
    # The high watermark bounds reads: batch [6,7] is withheld when HW = 7.
    log.hw_follows_leo = False
    log.high_watermark = 7
    assert read_offsets(log, log.read(0, 1 << 20)) == list(range(6))
    assert log.read(7, 1 << 20).size == 0                  # in [hw, leo]: empty
    assert log.read(20, 1 << 20).size == 0                 # == leo: empty
    with pytest.raises(OffsetOutOfRange):
        log.read(21, 100)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 100)
    d = log.read(0, 1 << 20)
    assert (d.high_watermark, d.log_start_offset, d.log_end_offset) == (7, 0, 20)
    log.close()


def test_read_continues_in_next_segment(tmp_path):
    log = open_log(tmp_path, **{"segment.bytes": 1500})
    for _ in range(10):
        log.append_as_leader(batch(3), 0, T0)
    second = log.segments[1].base_offset
    d = log.read(second, 1 << 20)
    assert read_offsets(log, d)[0] == second
    assert d.regions[0][0] == log.segments[1].read_fd
    log.close()


def test_retention_by_bytes_never_deletes_active(tmp_path):
    log = open_log(tmp_path, **{"segment.bytes": 1500, "retention.bytes": 0})
    for _ in range(12):
        log.append_as_leader(batch(3), 0, T0)
    n = len(log.segments)
    active = log.active_segment
    deleted = log.delete_old_segments(T0)
    assert deleted == n - 1 and log.segments == [active]
    assert log.log_start_offset == active.base_offset
    with pytest.raises(OffsetOutOfRange):
        log.read(0, 100)
    assert read_offsets(log, log.read(active.base_offset, 1 << 20))[0] == active.base_offset
    # Deleted files are renamed, then removed after file.delete.delay.ms.
    names = os.listdir(tmp_path / "t-0")
    assert any(n.endswith(".log.deleted") for n in names)
    log.remove_deleted_files(T0 + 60_000)
    assert sorted(n for n in os.listdir(tmp_path / "t-0") if ".log" in n) == [f"{active.base_offset:020d}.log"]
    log.close()


def test_retention_by_bytes_keeps_newest_within_limit(tmp_path):
    log = open_log(tmp_path, **{"segment.bytes": 1500})
    for _ in range(12):
        log.append_as_leader(batch(3), 0, T0)
    sizes = [s.size for s in log.segments]
    log.config = LogConfig({"segment.bytes": 1500, "retention.bytes": sum(sizes[-3:])})
    log.delete_old_segments(T0)
    assert [s.size for s in log.segments] == sizes[-3:]
    log.close()


def test_retention_by_time(tmp_path):
    log = open_log(tmp_path, **{"segment.bytes": 1500, "retention.ms": 10_000})
    for i in range(12):
        log.append_as_leader(batch(3, ts=T0 + i * 1000), 0, T0 + i * 1000)
    segs = list(log.segments)
    # Only segments whose newest timestamp is older than retention.ms go.
    now = segs[1].max_timestamp + 10_001
    log.delete_old_segments(now)
    assert log.segments == segs[2:]
    assert log.log_start_offset == segs[2].base_offset
    log.delete_old_segments(now + 10 ** 9)
    assert log.segments == segs[-1:]
    log.close()


def test_delete_records_moves_start(tmp_path):
    log = open_log(tmp_path, **{"segment.bytes": 1500})
    for _ in range(12):
        log.append_as_leader(batch(3), 0, T0)
    second = log.segments[1].base_offset
    assert log.delete_records(second + 1) == second + 1
    with pytest.raises(OffsetOutOfRange):
        log.read(second, 100)
    assert read_offsets(log, log.read(second + 1, 1 << 20))[:2] == [second, second + 1]
    assert log.delete_old_segments(T0) == 1              # the wholly-below segment goes
    assert log.segments[0].base_offset == second
    log.close()


def test_offset_for_timestamp(tmp_path):
    log = open_log(tmp_path, **{"segment.bytes": 3000, "index.interval.bytes": 300})
    for i in range(30):
        log.append_as_leader(batch(2, ts=T0 + i * 100), 0, T0)
    assert len(log.segments) > 2
    assert log.offset_for_timestamp(0) == (0, T0)
    for i in range(30):
        # Batch i holds offsets 2i and 2i+1 with timestamps T0+100i and T0+100i+1: the answer is the
        # first *record* at or after the target, as in Kafka, not the batch's base offset.
        assert log.offset_for_timestamp(T0 + i * 100) == (2 * i, T0 + i * 100)
        assert log.offset_for_timestamp(T0 + i * 100 + 1) == (2 * i + 1, T0 + i * 100 + 1)
    assert log.offset_for_timestamp(T0 + 30 * 100) is None
    log.close()


def test_log_append_time(tmp_path):
    log = open_log(tmp_path, **{"message.timestamp.type": "LogAppendTime"})
    r = log.append_as_leader(batch(2, ts=5), 0, T0 + 42)
    assert r.log_append_time_ms == T0 + 42
    b = MemoryRecords(open(tmp_path / "t-0" / "00000000000000000000.log", "rb").read()).next_batch()
    assert b.timestamp_type == 1 and b.max_timestamp == T0 + 42 and b.validate_crc()
    log.close()


def test_invalid_batches_refused_and_nothing_written(tmp_path):
    log = open_log(tmp_path, **{"max.message.bytes": 1000})
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(batch(3, value_size=2000), 0, T0)
    assert e.value.error_code == errors.MESSAGE_TOO_LARGE
    bad = batch(3)
    bad[-1] ^= 0xFF
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(bad, 0, T0)
    assert e.value.error_code == errors.CORRUPT_MESSAGE
    assert log.log_end_offset == 0 and log.active_segment.size == 0
    log.close()


def test_leader_epoch_cache(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), 1, T0)
    log.append_as_leader(batch(3), 1, T0)
    log.append_as_leader(batch(3), 4, T0)
    assert log.epoch_cache.entries == [(1, 0), (4, 6)]
    # A new epoch costs no checkpoint write on the append path; the log flush writes it (before
    # the recovery point passes those batches).
    assert not (tmp_path / "t-0" / "leader-epoch-checkpoint").exists() and log.epoch_cache.dirty
    log.flush()
    assert open(tmp_path / "t-0" / "leader-epoch-checkpoint").read() == "0\n2\n1 0\n4 6\n"
    assert not log.epoch_cache.dirty
    assert log.end_offset_for_epoch(1) == (1, 6)
    assert log.end_offset_for_epoch(2) == (1, 6)       # unknown epoch: the floor's end
    assert log.end_offset_for_epoch(4) == (4, 9)
    assert log.end_offset_for_epoch(0) == (0, 0)       # below the first epoch
    assert log.end_offset_for_epoch(5) == (-1, -1)
    log.close()


def test_flush_messages_policy(tmp_path):
    log = open_log(tmp_path, **{"flush.messages": 5})
    log.append_as_leader(batch(3), 0, T0)
    assert log.recovery_point == 0 and log.dirty
    log.append_as_leader(batch(3), 0, T0)
    assert log.recovery_point == 6 and not log.dirty
    log.close()


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                        capture_output=True)
    if rc.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {rc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill_until_enospc(small_tmpfs, batches):
    """Appends ``batches`` (an iterable of producer batches) to a new log on the small tmpfs until the
    filesystem is full. Checks that the failure is KAFKA_STORAGE_ERROR after some batches were taken,
    that the log end follows the last acknowledged batch and that the partial write was truncated
    away. -> (log, acked AppendResults, log end offset)."""
    # Small index preallocation so the log data is what fills the filesystem.
    log = Log(str(small_tmpfs / "t-0"), "t", 0, LogConfig({"segment.index.bytes": 4096}))
    acked = []
    with pytest.raises(LogAppendError) as e:
        for b in batches:
            acked.append(log.append_as_leader(b, 0, T0))
    assert e.value.error_code == errors.KAFKA_STORAGE_ERROR
    assert acked, "the filesystem should have taken some batches first"
    leo = log.log_end_offset
    assert leo == acked[-1].last_offset + 1
    seg = log.active_segment
    assert os.path.getsize(seg.log_path) == seg.size       # partial write truncated away
    return log, acked, leo


def test_enospc_is_storage_error_and_leaves_no_partial_write(small_tmpfs):
    log, _acked, leo = _fill_until_enospc(small_tmpfs, (batch(10, value_size=900) for _ in range(10_000)))
    # Every byte in the file is a whole, valid batch, and the log still reads.
    assert read_offsets(log, log.read(0, 1 << 30)) == list(range(leo))
    log.close_for_delete()


def test_enospc_on_an_idempotent_batch_keeps_log_and_producer_state(small_tmpfs):
    # The idempotent path writes after the producer-state check (SegmentState.append_stamped): a
    # failed write must leave no bytes, no offsets and no sequence behind.
    log, acked, leo = _fill_until_enospc(
        small_tmpfs, (batch(10, value_size=900, pid=5, epoch=0, seq=seq) for seq in range(0, 100_000, 10)))
    assert log.producer_state.producers[5].batches[-1].last_seq == 10 * len(acked) - 1
    assert read_offsets(log, log.read(0, 1 << 30)) == list(range(leo))
    log.close_for_delete()


def test_disk_full_across_rolls_then_restart(small_tmpfs):
    # Small segments so rolls, index entries and snapshots all meet the full disk; the
    # 10 MiB sparse index preallocation must not turn into a SIGBUS (which would kill pytest).
    cfg = {"segment.bytes": 8000, "index.interval.bytes": 500}
    path = str(small_tmpfs / "t-0")
    log = Log(path, "t", 0, LogConfig(cfg))
    acked, failures = [], 0
    for _ in range(2000):
        try:
            acked.append(log.append_as_leader(batch(1, value_size=700), 0, T0))
        except LogAppendError as e:
            assert e.error_code == errors.KAFKA_STORAGE_ERROR
            failures += 1
            if failures > 20:
                break
    assert failures > 20 and len(log.segments) > 3
    leo = log.log_end_offset
    assert leo == acked[-1].last_offset + 1 == len(acked)
    assert sum(len(read_offsets(log, log.read(s.base_offset, 1 << 30))) for s in log.segments) == leo
    # Crash (no close) and recover: exactly the acknowledged batches come back.
    log = _crash_and_reopen(log, cfg)
    assert log.log_end_offset == leo
    log.close_for_delete()


def _crash_and_reopen(log, cfg):
    """Drop ``log`` as a kill -9 would (descriptors closed, nothing flushed or trimmed) and load it
    again from its files (recovery)."""
    for s in log.segments:
        for fd in (s._append_fd, s.read_fd):
            if fd >= 0:
                os.close(fd)
    return Log(log.dir, log.topic, log.partition, LogConfig(cfg), clean_shutdown=False)


# -- write-behind runs (LeaderAppender: one writev per log for the plain appends of a receive chunk) --

def test_write_behind_run_commits_now_and_writes_at_its_end(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), 0, T0)                      # outside a run: written at once
    seg = log.active_segment
    written = os.path.getsize(seg.log_path)
    assert written == seg.size
    _native.open_run()
    try:
        results = [log.append_as_leader(batch(2), 0, T0) for _ in range(5)]
        # committed (offsets, log end, size, high watermark), not yet in the file
        assert [r.base_offset for r in results] == [2, 4, 6, 8, 10]
        assert log.log_end_offset == log.high_watermark == 12
        assert os.path.getsize(seg.log_path) == written < seg.size
        assert log._appender.pending == 5
    finally:
        assert _native.close_run() == 0
    assert log._appender.pending == 0
    assert os.path.getsize(seg.log_path) == seg.size
    assert read_offsets(log, log.read(0, 1 << 30)) == list(range(12))
    log = _crash_and_reopen(log, {})
    assert log.log_end_offset == 12
    log.close_for_delete()


def test_write_behind_run_defers_only_the_opening_threads_appends(tmp_path):
    # A run belongs to the thread that opened it (the loop's dispatch_frames): an append on any other
    # thread meanwhile (a second broker's loop in the same process, a worker) is written at once,
    # never left for the run's owner to write.
    log = open_log(tmp_path)
    seg = log.active_segment
    _native.open_run()
    try:
        t = threading.Thread(target=log.append_as_leader, args=(batch(2), 0, T0))
        t.start()
        t.join(10)
        assert not t.is_alive()
        assert log._appender.pending == 0
        assert os.path.getsize(seg.log_path) == seg.size > 0
        log.append_as_leader(batch(2), 0, T0)                 # the opening thread's: deferred
        assert log._appender.pending == 1
    finally:
        assert _native.close_run() == 0
    assert read_offsets(log, log.read(0, 1 << 30)) == list(range(4))
    log.close_for_delete()


def test_write_behind_run_writes_pending_before_roll_idempotent_and_flush(tmp_path):
    # Roll, an idempotent batch and a due flush each write what the run deferred first: the file
    # keeps the offsets in order (a batch written ahead of deferred ones would be out of order).
    cfg = {"segment.bytes": 1500, "flush.messages": 9}
    log = open_log(tmp_path, **cfg)
    _native.open_run()
    try:
        for i in range(12):
            if i % 4 == 3:
                log.append_as_leader(batch(2, value_size=200, pid=7, epoch=0, seq=2 * (i // 4)), 0, T0)
            else:
                log.append_as_leader(batch(2, value_size=200), 0, T0)
    finally:
        assert _native.close_run() == 0
    assert len(log.segments) > 2
    for s in log.segments:
        assert os.path.getsize(s.log_path) == s.size
    assert [o for s in log.segments for o in read_offsets(log, log.read(s.base_offset, 1 << 30))] == \
        list(range(24))
    log = _crash_and_reopen(log, cfg)
    assert log.log_end_offset == 24
    log.close_for_delete()


def test_write_behind_failure_cuts_the_run_back(tmp_path):
    log = open_log(tmp_path)
    for _ in range(3):
        log.append_as_leader(batch(2), 0, T0)
    seg = log.active_segment
    before = seg.size
    bad = os.open(seg.log_path, os.O_RDONLY)                   # writes fail with EBADF
    _native.open_run()
    try:
        for _ in range(4):
            log.append_as_leader(batch(2), 0, T0)
        assert log.log_end_offset == log.high_watermark == 14
        seg._st.fd = bad
    finally:
        failed = _native.close_run()
        seg._st.fd = seg._append_fd
        os.close(bad)
    assert failed == 1
    # as before the run: nothing of it is in the file, the log, its indexes or the high watermark
    assert (log.log_end_offset, log.high_watermark, seg.size) == (6, 6, before)
    assert os.path.getsize(seg.log_path) == before and not log.offline
    assert read_offsets(log, log.read(0, 1 << 30)) == list(range(6))
    assert log.append_as_leader(batch(2), 0, T0).base_offset == 6
    assert read_offsets(log, log.read(0, 1 << 30)) == list(range(8))
    log.close_for_delete()


def test_enospc_at_write_behind_flush_loses_no_acked_batch(small_tmpfs):
    # Runs of 4 batches until the small tmpfs refuses one run's writev (possibly after part of it):
    # that run is cut back whole and everything before it (acknowledged) stays, also after a crash.
    cfg = {"segment.index.bytes": 4096}
    log = Log(str(small_tmpfs / "t-0"), "t", 0, LogConfig(cfg))
    acked = []
    for _ in range(1000):
        _native.open_run()
        try:
            run = [log.append_as_leader(batch(10, value_size=900), 0, T0) for _ in range(4)]
        finally:
            failed = _native.close_run()
        if failed:
            break
        acked += run
    assert failed == 1 and acked, "the filesystem should take some runs, then refuse one"
    leo = log.log_end_offset
    seg = log.active_segment
    assert leo == log.high_watermark == acked[-1].last_offset + 1
    assert os.path.getsize(seg.log_path) == seg.size and not log.offline
    assert read_offsets(log, log.read(0, 1 << 30)) == list(range(leo))
    log = _crash_and_reopen(log, cfg)
    assert log.log_end_offset == leo
    log.close_for_delete()


def test_validate_batch_then_append_prevalidated(tmp_path):
    """Contract 4: validate_batch off the loop, then append_as_leader(prevalidated=True)."""
    from kbroker._native.batch import BatchBuilder
    b = BatchBuilder(codec=4)
    for i in range(5):
        b.append(T0 + i, b"k%d" % i, b"v" * 100)
    good = b.build()
    log = open_log(tmp_path, **{"cleanup.policy": "compact"})
    validate_batch(good, log.config.max_message_bytes, True)
    r = log.append_as_leader(bytearray(good), 2, T0, prevalidated=True)
    assert (r.base_offset, r.last_offset) == (0, 4) and log.log_end_offset == 5
    keyless = BatchBuilder(codec=4)
    keyless.append(T0, None, b"v")
    with pytest.raises(LogAppendError) as e:
        validate_batch(keyless.build(), log.config.max_message_bytes, True)
    assert e.value.error_code == errors.INVALID_RECORD
    with pytest.raises(LogAppendError) as e:
        validate_batch(good, 100, False)
    assert e.value.error_code == errors.MESSAGE_TOO_LARGE
    # Header and CRC checks still run on the prevalidated append; nothing is appended.
    torn = bytearray(good)
    torn[-1] ^= 1
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(torn, 2, T0, prevalidated=True)
    assert e.value.error_code == errors.CORRUPT_MESSAGE and log.log_end_offset == 5
    log.close()
