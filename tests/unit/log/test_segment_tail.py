"""Tail reads from the segment's recent-batch list (LogSegment.batch_position): the answer must be the
one the index + file scan gives (translate_offset), whatever happened to the log: leader appends of
varied sizes, rolls, follower truncation, a reload from disk, and far more batches than the list keeps.
The checker is shown to see a wrong position first."""
import random

import pytest

from kbroker.log import Log, LogConfig
from kbroker.log import segment as segment_mod

from test_log import T0, batch


def _scan_position(seg, offset, start=0):
    r = seg.translate_offset(offset, start)
    return -1 if r is None else r[0]


def _mismatches(log, rng, probes=300):
    """Probe offsets around every segment's range (and past the end) against the file scan."""
    bad = []
    for seg in log.segments:
        hi = seg.next_offset
        for off in {seg.base_offset, hi - 1, hi, hi + 1} | {rng.randrange(seg.base_offset, hi + 2)
                                                            for _ in range(probes // len(log.segments))}:
            if off < seg.base_offset:
                continue
            want = _scan_position(seg, off)
            got = seg.batch_position(off)
            if got != want:
                bad.append((seg.base_offset, off, got, want))
            if want < 0:
                continue
            # Where a read from that batch ends, for byte limits below, around and above one batch
            # and a high watermark inside the segment: with the list and from the index + file.
            for max_bytes in (1, 60, 200, 900, 5000, 1 << 20):
                max_offset = rng.randrange(off, hi + 2)
                for one in (True, False):
                    got = seg.end_position(want, max_bytes, max_offset, one)
                    saved = seg._tail_last, seg._tail_pos
                    seg._tail_last, seg._tail_pos = [], []
                    try:
                        ref = seg.end_position(want, max_bytes, max_offset, one)
                    finally:
                        seg._tail_last, seg._tail_pos = saved
                    if got != ref:
                        bad.append(("end", seg.base_offset, off, max_bytes, max_offset, one, got, ref))
    return bad


def _grow(log, rng, n):
    for _ in range(n):
        log.append_as_leader(batch(rng.randint(1, 5), rng.choice((10, 100, 700))), 0, T0)


def test_tail_positions_equal_the_file_scan_through_appends_rolls_truncation_and_reload(tmp_path):
    rng = random.Random(7)
    cfg = {"segment.bytes": 64 * 1024, "index.interval.bytes": 4096}
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig(cfg))
    _grow(log, rng, 40)                         # fewer batches than the list keeps
    assert _mismatches(log, rng) == []
    _grow(log, rng, 600)                        # several rolls, the list trimmed many times
    assert len(log.segments) > 2
    assert _mismatches(log, rng) == []
    end = log.log_end_offset
    log.truncate_to(end - 37)                   # a follower's truncation inside the tail
    assert _mismatches(log, rng) == []
    _grow(log, rng, 50)
    assert _mismatches(log, rng) == []
    log.close()
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig(cfg))     # reloaded: the list starts empty
    assert _mismatches(log, rng) == []
    _grow(log, rng, 10)
    assert _mismatches(log, rng) == []
    log.close()


def test_follower_appends_of_the_leaders_bytes(tmp_path):
    rng = random.Random(11)
    leader = Log(str(tmp_path / "l" / "t-0"), "t", 0, LogConfig({}))
    follower = Log(str(tmp_path / "f" / "t-0"), "t", 0, LogConfig({}))
    _grow(leader, rng, 300)
    seg = leader.segments[0]
    data = open(seg.log_path, "rb").read()
    cut = [0] + sorted(rng.sample(range(1, 300), 40)) + [300]   # fetches of several batches each
    bounds = [b.position for b in seg.headers()] + [len(data)]
    for a, b in zip(cut, cut[1:]):
        follower.append_as_follower(memoryview(data)[bounds[a]:bounds[b]])
    assert follower.log_end_offset == leader.log_end_offset
    assert _mismatches(follower, rng) == []
    leader.close()
    follower.close()


def test_reads_at_the_tail_touch_no_headers_in_the_file(tmp_path, monkeypatch):
    """A consumer at the log end: Log.read finds the batch without the native header scan."""
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({}))
    for _ in range(20):
        log.append_as_leader(batch(2, 50), 0, T0)
    calls = []
    real = segment_mod._native.seek_batch
    monkeypatch.setattr(segment_mod._native, "seek_batch", lambda *a: calls.append(a) or real(*a))
    last = log.log_end_offset - 2
    data = log.read(last, 1 << 20, log.log_end_offset)
    assert data.size > 0 and calls == []
    small = log.read(last - 6, 10, log.log_end_offset)      # below one batch: KIP-74's first batch
    assert small.size == data.size and calls == []             # one batch, as big as the last one
    log.close()


def test_the_checker_sees_a_wrong_position(tmp_path):
    rng = random.Random(3)
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({}))
    _grow(log, rng, 30)
    seg = log.segments[-1]
    pos = seg._tail_pos                         # a copy of the native list
    pos[5] += 1                                 # one remembered position off by a byte
    seg._tail_pos = pos
    bad = _mismatches(log, rng, probes=2000)
    assert any(b[0] != "end" for b in bad) and any(b[0] == "end" for b in bad)
    log.close()
