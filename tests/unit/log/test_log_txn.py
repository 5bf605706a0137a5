"""Transactions in the log: ongoing transactions bound the last stable offset, COMMIT/ABORT markers
end them, aborts go to the ``.txnindex`` (Kafka's 34-byte entries), and all of it survives clean and
unclean restarts, truncation, followers' copies and retention."""
import os
import struct

import pytest
from kafka.record import MemoryRecords

from kbroker.log import Log, LogAppendError, LogConfig
from kbroker.log import errors
from kbroker.log import txn_index
from kbroker.log.producer_state import ProducerStateManager
import builders

T0 = builders.T0


def tx(pid, seq, n=2, epoch=0):
    return builders.batch(n, 20, T0, pid, epoch, seq, key=None, fill=b"t", ts_step=0, transactional=True)


def plain(n=2):
    return builders.batch(n, 20, T0, key=None, fill=b"p", ts_step=0)


def open_log(path, clean=True, **cfg):
    log = Log(str(path / "t-0"), "t", 0, LogConfig(cfg), clean_shutdown=clean)
    return log


def crash(log):
    for s in log.segments:
        for fd in (s._append_fd, s.read_fd):
            if fd >= 0:
                os.close(fd)
        s._append_fd = s.read_fd = -1


def index_entries(path):
    out = []
    d = path / "t-0"
    for name in sorted(os.listdir(d)):
        if name.endswith(".txnindex"):
            data = open(d / name, "rb").read()
            assert len(data) % 34 == 0
            out += [(int(name[:20]),) + e for e in struct.iter_unpack(">hqqqq", data)]
    return out


def test_lso_follows_ongoing_transactions(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(plain(), 0, T0)                    # 0-1
    log.append_as_leader(tx(7, 0), 0, T0)                   # 2-3: producer 7's transaction starts at 2
    log.append_as_leader(tx(8, 0), 0, T0)                   # 4-5: producer 8's at 4
    log.append_as_leader(tx(7, 2), 0, T0)                   # 6-7
    assert log.high_watermark == 8 and log.last_stable_offset == 2
    r = log.append_control(7, 0, True, 3, 0, now=T0)                # COMMIT at 8
    assert (r.base_offset, r.last_offset) == (8, 8)
    assert log.last_stable_offset == 4
    log.append_control(8, 0, False, 3, 0, now=T0)                   # ABORT at 9
    assert log.last_stable_offset == log.high_watermark == 10
    assert log.aborted_transactions(0, 10) == [txn_index.AbortedTxn(8, 4, 9, 10)]
    assert log.aborted_transactions(10, 20) == []
    assert log.aborted_transactions(0, 4) == []             # starts at 4: nothing of it below
    assert index_entries(tmp_path) == [(0, 0, 8, 4, 9, 10)]
    log.close()


def test_markers_on_disk_are_kafkas_control_batches(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(tx(7, 0), 3, T0)
    log.append_control(7, 0, False, 11, 3, now=T0 + 5)
    log.close()
    recs = MemoryRecords(open(tmp_path / "t-0" / f"{0:020d}.log", "rb").read())
    recs.next_batch()
    marker = recs.next_batch()
    assert marker.validate_crc()
    assert marker.is_control_batch and marker.is_transactional
    assert (marker.base_offset, marker.producer_id, marker.producer_epoch) == (2, 7, 0)
    (rec,) = list(marker)
    assert rec.key == struct.pack(">hh", 0, 0)              # version 0, ABORT
    assert rec.value == struct.pack(">hi", 0, 11)           # version 0, coordinator epoch
    assert rec.timestamp == T0 + 5


def test_marker_fencing(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(tx(7, 0, epoch=2), 0, T0)
    with pytest.raises(LogAppendError) as e:
        log.append_control(7, 1, True, 0, 0, now=T0)                # an older producer epoch
    assert e.value.error_code == errors.INVALID_PRODUCER_EPOCH
    log.append_control(7, 2, True, 5, 0, now=T0)
    log.append_as_leader(tx(7, 2, epoch=2), 0, T0)
    with pytest.raises(LogAppendError) as e:
        log.append_control(7, 2, True, 4, 0, now=T0)                # an older coordinator epoch
    assert e.value.error_code == errors.TRANSACTION_COORDINATOR_FENCED
    assert log.log_end_offset == 5 and log.last_stable_offset == 3
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(tx(7, 4, epoch=1), 0, T0)      # a zombie's transactional batch
    assert e.value.error_code == errors.INVALID_PRODUCER_EPOCH
    # A marker with a bumped epoch (the coordinator fencing the producer) ends the transaction.
    log.append_control(7, 3, False, 5, 0, now=T0)
    assert log.last_stable_offset == log.log_end_offset == 6
    assert log.producer_state.producers[7].epoch == 3
    log.close()


def test_client_control_batch_refused(tmp_path):
    log = open_log(tmp_path)
    buf = bytearray(txn_index.control_batch(7, 0, True, 0, 0, -1))
    with pytest.raises(LogAppendError) as e:
        log.append_as_leader(buf, 0, T0)
    assert e.value.error_code == errors.INVALID_RECORD
    assert log.log_end_offset == 0
    log.close()


def state(log):
    ps = log.producer_state
    return ({pid: (e.epoch, e.current_txn_first_offset, e.coordinator_epoch) for pid, e in ps.producers.items()},
            dict(ps.ongoing), log.txn_index.entries, log.last_stable_offset)


def scenario(log):
    log.append_as_leader(tx(7, 0), 0, T0)                   # 0-1
    log.append_as_leader(tx(8, 0), 0, T0)                   # 2-3
    log.append_control(7, 0, False, 1, 0, now=T0)                   # 4 ABORT
    log.roll()
    log.append_as_leader(tx(7, 2), 0, T0)                   # 5-6
    log.append_control(8, 0, True, 1, 0, now=T0)                    # 7 COMMIT
    log.append_as_leader(tx(9, 0), 0, T0)                   # 8-9 (ongoing)
    log.append_control(7, 0, False, 2, 0, now=T0)                   # 10 ABORT


@pytest.mark.parametrize("how", ["clean", "crash", "crash-no-snapshots"])
def test_restart_rebuilds_state_and_index(tmp_path, how):
    log = open_log(tmp_path)
    scenario(log)
    before = state(log)
    assert before[1] == {9: 8} and before[3] == 8
    assert [e[:3] for e in before[2]] == [(7, 0, 4), (7, 5, 10)]
    if how == "clean":
        log.close()
    else:
        crash(log)
        d = tmp_path / "t-0"
        os.unlink(d / f"{5:020d}.txnindex")                 # the tail's index entry is rebuilt
        if how == "crash-no-snapshots":
            for n in os.listdir(d):
                if n.endswith(".snapshot"):
                    os.unlink(d / n)
    log = open_log(tmp_path, clean=how == "clean")
    assert state(log) == before
    assert [e[0] for e in index_entries(tmp_path)] == [0, 5]
    log.close()


def test_snapshot_keeps_ongoing_transaction_and_markers(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    ps = ProducerStateManager(str(d))
    ps.update(7, 0, 0, 1, 10, T0, transactional=True)
    ps.complete_txn(8, 3, 4, 12, True, T0)                  # a producer known from a marker only
    ps.write_snapshot(13)
    other = ProducerStateManager(str(d))
    assert other.load_snapshot(13)
    assert other.ongoing == {7: 10}
    assert other.producers[8].epoch == 3 and other.producers[8].coordinator_epoch == 4
    assert not other.producers[8].batches
    assert other.first_unstable_offset() == 10


def test_truncation_drops_later_aborts(tmp_path):
    log = open_log(tmp_path)
    scenario(log)
    log.truncate_to(8)
    assert [e[:3] for e in log.txn_index.entries] == [(7, 0, 4)]
    assert log.producer_state.ongoing == {7: 5}
    assert [e[0] for e in index_entries(tmp_path)] == [0]
    log.close()


def test_follower_copy_rebuilds_transactions(tmp_path):
    leader = open_log(tmp_path)
    scenario(leader)
    leader.close()
    data = b"".join(open(tmp_path / "t-0" / n, "rb").read()
                    for n in sorted(os.listdir(tmp_path / "t-0")) if n.endswith(".log"))
    fdir = tmp_path / "f"
    follower = Log(str(fdir / "t-0"), "t", 0, LogConfig({}), hw_follows_leo=False)
    follower.append_as_follower(data)
    follower.high_watermark = follower.log_end_offset
    assert follower.producer_state.ongoing == {9: 8}
    assert follower.last_stable_offset == 8
    assert [e[:3] for e in follower.txn_index.entries] == [(7, 0, 4), (7, 5, 10)]
    follower.close()


def test_retention_drops_index_of_deleted_segments(tmp_path):
    log = open_log(tmp_path, **{"retention.ms": 1})
    scenario(log)
    log.roll()
    log.delete_records(5)
    log.delete_old_segments(T0)
    assert log.log_start_offset == 5
    assert [e[:3] for e in log.txn_index.entries] == [(7, 5, 10)]
    assert [e[0] for e in index_entries(tmp_path)] == [5]
    log.close()


def test_verification_guard(tmp_path):
    """KIP-890 part 1's guard: taken before the leader asks the coordinator, dropped by a marker for the
    producer (the answer is then stale) and by the batch that starts the transaction."""
    log = open_log(tmp_path)
    ps = log.producer_state
    assert ps.needs_verification(7)
    guard = ps.begin_verification(7)
    assert ps.verified(7, guard)
    log.append_control(7, 0, False, 0, 0, now=T0)          # the transaction ended while verifying
    assert not ps.verified(7, guard)
    guard = ps.begin_verification(7)
    log.append_as_leader(tx(7, 0), 0, T0)
    assert not ps.needs_verification(7) and not ps.verified(7, guard)
    log.append_control(7, 0, True, 0, 0, now=T0)
    assert ps.needs_verification(7)
    log.close()


# ---- compaction -----------------------------------------------------------------------------------

NOW = 10_000_000
DAY = 86_400_000


def keyed(records, pid=-1, seq=-1, transactional=False):
    from kbroker.record import BatchBuilder
    b = BatchBuilder(0, batch_size=1 << 20)
    for i, (k, v) in enumerate(records):
        b.append(NOW + i, k, v)
    return bytearray(b.build(producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=seq,
                             is_transactional=transactional))


def file_batches(lg):
    from kbroker.record import decode_records, iter_batches
    out = []
    for seg in lg.segments:
        data = open(seg.log_path, "rb").read()
        for b in iter_batches(data, 0, True):
            if b.is_control:
                out.append((b.base_offset, "marker", b.producer_id))
            else:
                out += [(o, k, v) for o, _ts, k, v, _h in
                        decode_records(memoryview(data)[b.position:b.position + b.size], check_crc=True)]
    return out


def test_cleaner_drops_aborted_data_then_markers_after_delete_retention(tmp_path):
    from kbroker.log.cleaner import LogCleaner
    lg = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({"cleanup.policy": "compact", "file.delete.delay.ms": 0}),
             now=NOW)
    lg.append_as_leader(keyed([(b"k1", b"p1"), (b"k2", b"p2")]), 0, NOW)            # 0-1
    lg.append_as_leader(keyed([(b"k1", b"a1")], 7, 0, True), 0, NOW)                 # 2: aborted below
    lg.append_as_leader(keyed([(b"k2", b"b2")], 8, 0, True), 0, NOW)                 # 3: committed
    lg.append_control(7, 0, False, 0, 0, now=NOW)                                    # 4 ABORT
    lg.append_control(8, 0, True, 0, 0, now=NOW)                                     # 5 COMMIT
    lg.append_as_leader(keyed([(b"k3", b"a3")], 7, 1, True), 0, NOW)                 # 6
    lg.append_control(7, 0, True, 0, 0, now=NOW)                                     # 7 COMMIT
    lg.append_as_leader(keyed([(b"k4", b"x")]), 0, NOW)                              # 8 (ongoing below)
    lg.append_as_leader(keyed([(b"k5", b"c5")], 9, 0, True), 0, NOW)                 # 9: ongoing
    lg.roll(NOW)
    lg.append_as_leader(keyed([(b"k6", b"y")]), 0, NOW)                              # 10: active segment
    assert lg.last_stable_offset == 9
    cleaner = LogCleaner()
    t0 = NOW + 5 * DAY
    assert cleaner.clean_log(lg, t0) is None            # the segment reaches past the LSO: not cleanable
    lg.append_control(9, 0, False, 0, 0, now=NOW)        # 11: ABORT of the ongoing one
    lg.roll(NOW)
    assert cleaner.clean_log(lg, t0) is not None
    # a1 is dropped and does not shadow p1; p2 is shadowed by the committed b2; every marker stays (the
    # aborted transactions' until delete.retention.ms); c5 (aborted) is gone.
    want = [(0, b"k1", b"p1"), (3, b"k2", b"b2"), (4, "marker", 7), (5, "marker", 8), (6, b"k3", b"a3"),
            (7, "marker", 7), (8, b"k4", b"x"), (10, b"k6", b"y"), (11, "marker", 9)]
    assert file_batches(lg) == want
    cleaner.clean_log(lg, t0 + DAY - 1)
    assert file_batches(lg) == want
    assert cleaner.clean_log(lg, t0 + DAY + 1) is not None
    assert file_batches(lg) == [w for w in want if w[0] not in (4, 11)]
    # the cleaned log reloads to the same producer state (the retained COMMIT markers end nothing new)
    lg.close()
    again = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({"cleanup.policy": "compact"}), clean_shutdown=False,
                now=NOW)
    assert again.producer_state.ongoing == {} and again.last_stable_offset == again.log_end_offset
    again.close()


def test_aborted_transactions_are_bounded_by_the_segment_and_the_lso(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(tx(7, 0), 0, T0)                   # 0-1: A, aborted at 4
    log.append_as_leader(tx(8, 0), 0, T0)                   # 2-3: B, open across A's abort, aborted at 7
    log.append_control(7, 0, False, 0, 0, now=T0)           # 4 (LSO then: 2, B's start)
    log.append_as_leader(tx(9, 0), 0, T0)                   # 5-6: C, aborted at 8
    log.append_control(8, 0, False, 0, 0, now=T0)           # 7
    log.append_control(9, 0, False, 0, 0, now=T0)           # 8
    log.roll(T0)
    log.append_as_leader(tx(7, 2), 0, T0)                   # 9-10: A again, aborted at 11
    log.append_control(7, 0, False, 0, 0, now=T0)           # 11
    got = lambda s, e: [(a.producer_id, a.first_offset) for a in log.aborted_transactions(s, e)]
    assert got(0, 12) == [(7, 0), (8, 2), (9, 5)]           # stops at the segment end (9)
    assert got(3, 12) == [(7, 0), (8, 2), (9, 5)]
    assert got(5, 12) == [(8, 2), (9, 5)]
    assert got(0, 2) == [(7, 0)]                            # B's entry is still read (LSO 2 < its range)
    assert got(9, 12) == [(7, 9)]
    assert [e.last_stable_offset for e in log.txn_index.entries] == [2, 5, 9, 12]
    log.close()
