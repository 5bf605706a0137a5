"""Log operations a follower needs: append_as_follower of already-stamped batches, truncate_to,
truncate_fully (real segment files)."""
import os

import pytest

from kbroker.log import Log, LogAppendError, LogConfig
from kbroker.log import errors

from test_log import T0, batch, read_offsets


def leader_bytes(tmp_path, specs, **cfg):
    """Stamp batches on a 'leader' log: specs = [(leader_epoch, n_records, pid, seq)].
    Returns the leader log and the raw bytes of its batches in order."""
    leader = Log(str(tmp_path / "leader" / "t-0"), "t", 0, LogConfig(cfg))
    raw = []
    for epoch, n, pid, seq in specs:
        b = batch(n, pid=pid, epoch=0 if pid >= 0 else -1, seq=seq)
        leader.append_as_leader(b, epoch, T0)
        raw.append(bytes(b))
    return leader, raw


def all_offsets(log, end):
    """Every offset below ``end``, reading segment after segment."""
    out = []
    while not out or out[-1] + 1 < end:
        got = read_offsets(log, log.read(out[-1] + 1 if out else log.log_start_offset, 1 << 20, end))
        if not got:
            break
        out += got
    return out


def follower_log(tmp_path, **cfg):
    return Log(str(tmp_path / "follower" / "t-0"), "t", 0, LogConfig(cfg), hw_follows_leo=False)


def test_append_as_follower_copies_bytes_epochs_and_producer_state(tmp_path):
    leader, raw = leader_bytes(tmp_path, [(0, 3, 7, 0), (0, 2, 7, 3), (2, 4, 7, 5), (3, 1, -1, -1)])
    f = follower_log(tmp_path)
    assert f.append_as_follower(b"".join(raw[:2])) == (0, 4)
    assert f.append_as_follower(b"".join(raw[2:]) + raw[0][:20]) == (5, 9)   # partial tail ignored
    assert f.log_end_offset == leader.log_end_offset == 10
    assert f.high_watermark == 0                       # the leader moves it, not the append
    assert f.epoch_cache.entries == leader.epoch_cache.entries == [(0, 0), (2, 5), (3, 9)]
    with open(os.path.join(f.dir, "00000000000000000000.log"), "rb") as a, \
            open(os.path.join(leader.dir, "00000000000000000000.log"), "rb") as b:
        assert a.read() == b.read()                    # byte for byte the leader's batches
    # A retry of producer 7's batch (seq 5..8) on this replica as a new leader: original offsets.
    retry = batch(4, pid=7, epoch=0, seq=5)
    r = f.append_as_leader(retry, 4, T0)
    assert (r.base_offset, r.last_offset) == (5, 8)
    assert f.log_end_offset == 10


def test_append_as_follower_refuses_overlaps_and_corruption(tmp_path):
    _leader, raw = leader_bytes(tmp_path, [(0, 3, -1, -1), (0, 3, -1, -1)])
    f = follower_log(tmp_path)
    f.append_as_follower(raw[0])
    with pytest.raises(LogAppendError) as e:
        f.append_as_follower(raw[0])                   # overlaps
    assert e.value.error_code == errors.INVALID_RECORD
    bad = bytearray(raw[1])
    bad[-1] ^= 0xFF
    with pytest.raises(LogAppendError) as e:
        f.append_as_follower(bytes(bad))
    assert e.value.error_code == errors.CORRUPT_MESSAGE
    assert f.log_end_offset == 3
    assert f.append_as_follower(b"") is None


def test_append_as_follower_takes_offset_gaps_of_a_compacted_leader(tmp_path):
    """A compacted leader serves batches with offset gaps (cleaned-away records): the follower keeps
    the leader's offsets, as Kafka's follower does, instead of refusing to replicate."""
    _leader, raw = leader_bytes(tmp_path, [(0, 3, -1, -1), (0, 3, -1, -1), (1, 2, -1, -1)])
    f = follower_log(tmp_path)
    assert f.append_as_follower(raw[1]) == (3, 5)      # offsets 0..2 were cleaned away on the leader
    assert f.append_as_follower(raw[2]) == (6, 7)
    assert f.log_end_offset == 8
    assert all_offsets(f, 8) == [3, 4, 5, 6, 7]
    assert f.epoch_cache.entries == [(0, 3), (1, 6)]


def test_follower_append_rolls_segments(tmp_path):
    _leader, raw = leader_bytes(tmp_path, [(0, 5, -1, -1)] * 6, **{"segment.bytes": 1200})
    f = follower_log(tmp_path, **{"segment.bytes": 1200})
    f.append_as_follower(b"".join(raw))
    assert len(f.segments) > 1
    assert f.log_end_offset == 30
    assert all_offsets(f, 30) == list(range(30))


def test_truncate_to_mid_segment_and_across_segments(tmp_path):
    specs = [(0, 3, 9, 0), (0, 3, 9, 3), (1, 3, 9, 6), (1, 3, 9, 9), (2, 3, 9, 12), (2, 3, 9, 15)]
    _leader, raw = leader_bytes(tmp_path, specs, **{"segment.bytes": 1000, "index.interval.bytes": 1})
    f = follower_log(tmp_path, **{"segment.bytes": 1000, "index.interval.bytes": 1})
    for r in raw:
        f.append_as_follower(r)
    assert len(f.segments) >= 3
    f.high_watermark = 18
    assert f.truncate_to(10)                           # mid-batch: the batch 9..11 goes whole
    assert f.log_end_offset == 9
    assert f.high_watermark == 9
    assert f.epoch_cache.entries == [(0, 0), (1, 6)]
    assert all_offsets(f, 9) == list(range(9))
    assert not f.truncate_to(9)
    # Producer 9's state is the surviving batches': its next batch continues at seq 9 again.
    r = f.append_as_leader(batch(3, pid=9, epoch=0, seq=9), 3, T0)
    assert r.base_offset == 9
    # Reopen: the truncated log loads clean and identical.
    f.close()
    g = follower_log(tmp_path, **{"segment.bytes": 1000, "index.interval.bytes": 1})
    assert g.log_end_offset == 12
    assert all_offsets(g, 12) == list(range(12))
    assert g.epoch_cache.entries == [(0, 0), (1, 6), (3, 9)]


def test_truncate_to_segment_boundary_and_zero(tmp_path):
    _leader, raw = leader_bytes(tmp_path, [(0, 4, -1, -1)] * 5, **{"segment.bytes": 500})
    f = follower_log(tmp_path, **{"segment.bytes": 500})
    for r in raw:
        f.append_as_follower(r)
    second = f.segments[1].base_offset
    f.truncate_to(second)
    assert f.log_end_offset == second
    assert f.active_segment is f.segments[-1] and f.active_segment.active
    f.append_as_follower(raw[second // 4])             # appends continue at the new end
    assert f.log_end_offset == second + 4
    f.truncate_to(0)
    assert f.log_end_offset == 0 and len(f.segments) == 1
    assert f.epoch_cache.entries == []
    f.append_as_follower(raw[0])
    assert f.log_end_offset == 4


def test_truncate_fully_restarts_at_offset(tmp_path):
    _leader, raw = leader_bytes(tmp_path, [(0, 4, 5, 0)] * 1 + [(1, 4, 5, 4)])
    f = follower_log(tmp_path)
    for r in raw:
        f.append_as_follower(r)
    f.truncate_fully(100)
    assert (f.log_start_offset, f.log_end_offset, f.high_watermark) == (100, 100, 100)
    assert f.epoch_cache.entries == [] and f.producer_state.producers == {}
    f.close()
    g = Log(f.dir, "t", 0, LogConfig(), log_start_offset=100, hw_follows_leo=False)
    assert g.log_end_offset == 100
