"""The leader append in one native call (kbroker._native.segment.append_leader via
LogSegment.append_leader / Log.append_as_leader) against the stepwise reference the writer-thread
path still uses (Log._stamp: validate_and_stamp + producer-state check, Log._append: should_roll +
LogSegment.append, Log._appended): the same results, errors and files byte for byte over random
batches, rolls (size, time, index full), idempotent duplicates, LogAppendTime, refused batches."""
import os
import random

import pytest

from kbroker._native import segment as native
from kbroker._native.batch import BatchError, validate_and_stamp
from kbroker.log import Log, LogAppendError, LogConfig
from kbroker.log.log import AppendResult
import builders
from builders import T0



def batch(n=1, *args, **kw):
    return bytes(builders.batch(n, *args, **kw))


def reference_append(log, buf, leader_epoch, now):
    """Log.append_as_leader as it was before the native call: the stepwise methods."""
    r = log._stamp(buf, leader_epoch, now, False)
    if type(r) is AppendResult:
        return r
    info, base, last, append_time = r
    log._append(buf, info.size, base, last, info.max_timestamp, now)
    return log._appended(info, base, last, leader_epoch, append_time, now)


def outcome(fn):
    try:
        return tuple(fn())
    except LogAppendError as e:
        return ("error", e.error_code, e.message)


def files(log):
    out = {}
    for name in sorted(os.listdir(log.dir)):
        if name.endswith((".log", ".index", ".timeindex")):
            with open(os.path.join(log.dir, name), "rb") as f:
                out[name] = f.read()
    return out


def assert_same(a, b):
    assert [s.base_offset for s in a.segments] == [s.base_offset for s in b.segments]
    assert (a.log_end_offset, a.high_watermark, a.unflushed_messages) == \
           (b.log_end_offset, b.high_watermark, b.unflushed_messages)
    for sa, sb in zip(a.segments, b.segments):
        assert (sa.size, sa.next_offset, sa.max_timestamp, sa.offset_of_max_timestamp, sa.bytes_since_index,
                sa.first_batch_ms, sa._tail_last, sa._tail_pos) == \
               (sb.size, sb.next_offset, sb.max_timestamp, sb.offset_of_max_timestamp, sb.bytes_since_index,
                sb.first_batch_ms, sb._tail_last, sb._tail_pos)
    fa, fb = files(a), files(b)
    assert fa.keys() == fb.keys()
    for name in fa:
        assert fa[name] == fb[name], name


def random_run(tmp_path, seed, cfg, steps=400, ref_cfg=None, tamper=None, changes=()):
    """``changes``: configs both logs switch to (a new LogConfig each, as an AlterConfigs does)
    one after another, evenly spread over the run."""
    rng = random.Random(seed)
    every = steps // (len(changes) + 1) if changes else steps + 1
    a = Log(str(tmp_path / f"a{seed}" / "t-0"), "t", 0, LogConfig(cfg))
    b = Log(str(tmp_path / f"b{seed}" / "t-0"), "t", 0, LogConfig(ref_cfg or cfg))
    now = T0
    ts = T0
    seqs = {}
    sent = []
    try:
        for step in range(1, steps + 1):
            if step % every == 0 and step // every <= len(changes):
                new = changes[step // every - 1]
                a.config = LogConfig(new)
                b.config = LogConfig(new)
            now += rng.choice((0, 1, 7, 300))
            ts += rng.choice((0, 1, 50, 400, -30))
            n = rng.choice((1, 1, 1, 2, 5, 40))
            kind = rng.random()
            if kind < 0.15 and sent:
                buf = rng.choice(sent)                          # an idempotent retry (duplicate)
            elif kind < 0.35:
                pid = rng.choice((7, 8))
                seq = seqs.get(pid, 0)
                buf = batch(n, rng.choice((10, 100, 900)), ts, pid=pid, epoch=0, seq=seq)
                seqs[pid] = seq + n
                sent.append(buf)
            else:
                buf = batch(n, rng.choice((10, 100, 900, 5000)), ts)
                if kind > 0.97:                                 # refused: a flipped byte (CRC)
                    buf = bytearray(buf)
                    buf[-1] ^= 0x5A
                    buf = bytes(buf)
            epoch = 3 if rng.random() < 0.9 else 4
            ra = outcome(lambda: a.append_as_leader(bytearray(buf), epoch, now))
            rb = outcome(lambda: reference_append(b, bytearray(buf), epoch, now))
            assert ra == rb
        if tamper is not None:
            tamper(b)
        assert_same(a, b)
        return len(a.segments)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("seed,cfg", [
    (1, {"segment.bytes": 20_000, "index.interval.bytes": 700}),
    (2, {"segment.bytes": 8_000, "segment.ms": 2_000, "index.interval.bytes": 0}),
    (3, {"message.timestamp.type": "LogAppendTime", "segment.ms": 900, "segment.bytes": 50_000}),
    (4, {"segment.index.bytes": 64, "index.interval.bytes": 0}),    # rolls because the index is full
    (5, {"max.message.bytes": 3_000, "segment.bytes": 30_000}),    # some batches too large
])
def test_native_append_matches_stepwise_reference(tmp_path, seed, cfg):
    assert random_run(tmp_path, seed, cfg) > 1          # every case rolls at least once


def test_config_changes_reach_the_native_append(tmp_path):
    # A replaced LogConfig (dynamic topic config) is what the next native append checks against:
    # roll size/time, max.message.bytes, LogAppendTime, compaction's key rule, flush.messages.
    changes = [
        {"segment.bytes": 6_000, "max.message.bytes": 2_500, "flush.messages": 7},
        {"message.timestamp.type": "LogAppendTime", "segment.ms": 700, "segment.bytes": 40_000},
        {"segment.bytes": 15_000, "flush.messages": 3},
    ]
    assert random_run(tmp_path, 6, {"segment.bytes": 60_000, "index.interval.bytes": 700}, steps=600,
                      changes=changes) > 2


def test_flush_messages_counted_natively(tmp_path):
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({"flush.messages": 3}))
    try:
        for i in range(5):
            log.append_as_leader(bytearray(batch()), 0, T0 + i)
            assert log.unflushed_messages == (i + 1) % 3
        assert log.recovery_point == 3           # flushed once, after the third message
        log.append_as_leader(bytearray(batch(n=4)), 0, T0 + 9)      # 2 + 4: due, flushed
        assert (log.unflushed_messages, log.recovery_point) == (0, 9)
    finally:
        log.close()


def _flip_index_byte(log):
    seg = log.segments[0]
    seg.index.flush()
    with open(seg.index.path, "r+b") as f:
        f.seek(5)
        b = f.read(1)
        f.seek(5)
        f.write(bytes([b[0] ^ 1]))


@pytest.mark.parametrize("ref_cfg,tamper", [
    ({"segment.bytes": 19_000, "index.interval.bytes": 700}, None),     # rolls elsewhere
    (None, _flip_index_byte),                                           # one index byte differs
])
def test_comparison_sees_a_difference(tmp_path, ref_cfg, tamper):
    # The checker is not blind: a reference that rolls elsewhere, or one byte of its files changed.
    with pytest.raises(AssertionError):
        random_run(tmp_path, 1, {"segment.bytes": 20_000, "index.interval.bytes": 700}, ref_cfg=ref_cfg,
                   tamper=tamper)


def test_roll_rule_agrees_with_should_roll(tmp_path):
    """append_leader's None (roll first) exactly when should_roll says so, at the edges."""
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({}))
    log.append_as_leader(bytearray(batch(1, ts=T0)), 0, T0)
    seg = log.active_segment
    size = len(batch(1, ts=T0))
    checked = 0
    for seg_bytes in (seg.size + size - 1, seg.size + size, seg.size + size + 1):
        for seg_ms, ts in ((1000, T0 + 999), (1000, T0 + 1000), (1000, T0 + 1001)):
            buf = bytearray(batch(1, ts=ts))
            want = seg.should_roll(size, seg.next_offset, ts, T0, seg_bytes, seg_ms)
            snapshot = bytes(buf)
            # a read-only fd: a batch that would be written fails instead, so no state moves here
            fd = os.open(seg.log_path, os.O_RDONLY)
            try:
                got = native.append_leader(fd, buf, seg.size, seg.next_offset, 0, 1 << 20, -1, False, False,
                                           seg_bytes - seg.size, seg.first_batch_ms + seg_ms,
                                           seg.base_offset + (1 << 31) - 1)
                rolled = got is None
            except OSError:
                rolled = False
            finally:
                os.close(fd)
            assert rolled == want, (seg_bytes, seg_ms, ts)
            if rolled:
                assert bytes(buf) == snapshot                   # nothing stamped
            checked += want
    assert 0 < checked < 9
    log.close()


def test_refused_batch_same_error_nothing_stamped_or_written(tmp_path):
    path = tmp_path / "x.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for mutate in (lambda b: b.__setitem__(-1, b[-1] ^ 1),      # CRC
                       lambda b: b.__setitem__(16, 1),               # magic
                       lambda b: b.extend(b"xx"),                    # trailing bytes
                       lambda b: b.__setitem__(7, 5)):               # baseOffset != 0
            buf = bytearray(batch(2))
            mutate(buf)
            before = bytes(buf)
            with pytest.raises(BatchError) as e1:
                native.append_leader(fd, buf, 0, 10, 1, 1 << 20, -1, False, False, 1 << 40, 1 << 62, 1 << 62)
            assert bytes(buf) == before
            with pytest.raises(BatchError) as e2:
                validate_and_stamp(bytearray(before), 10, 1, 1 << 20, -1)
            assert (e1.value.error_code, str(e1.value)) == (e2.value.error_code, str(e2.value))
        assert os.path.getsize(path) == 0
    finally:
        os.close(fd)


def test_written_batch_is_the_stamped_batch(tmp_path):
    path = tmp_path / "x.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        buf = bytearray(batch(3))
        ref = bytearray(buf)
        want = validate_and_stamp(ref, 42, 7, 1 << 20, T0 + 5)
        info = native.append_leader(fd, buf, 0, 42, 7, 1 << 20, T0 + 5, False, False, 1 << 40, 1 << 62, 1 << 62)
        assert info.position == 0 and info.size == len(ref) == want.size
        assert (info.base_offset, info.max_timestamp, info.record_count) == (42, T0 + 5, 3)
        assert open(path, "rb").read() == bytes(ref) == bytes(buf)
        idem = bytearray(batch(1, pid=9, epoch=0, seq=0))
        info = native.append_leader(fd, idem, len(ref), 45, 7, 1 << 20, -1, False, False, 1 << 40, 1 << 62, 1 << 62)
        assert info.position == -1 and info.base_offset == 45 and info.producer_id == 9
        assert os.path.getsize(path) == len(ref)                   # not written: the caller checks first
    finally:
        os.close(fd)


# A failed write through the native call (truncated away, storage error, later appends fine) is
# covered on a real full tmpfs by test_log.py's ENOSPC tests and test_produce_diskfull.py.
