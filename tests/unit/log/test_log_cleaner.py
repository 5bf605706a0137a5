"""Log compaction on real segment files (kbroker.log.cleaner).

Invariants checked after every cleaning:
- offsets are preserved and strictly increasing, every batch's CRC checks, and the log reloads
  (clean and unclean restart) to the same records;
- the key -> latest value map equals the one read from the uncompacted log;
- below the cleaned end each key appears once (its latest record);
- a tombstone stays until delete.retention.ms after the cleaning that first saw it, then goes;
- the active segment and segments younger than min.compaction.lag.ms are never rewritten;
- a producer's last batch survives (empty if need be), so a retried batch is still a duplicate;
- kafka-python's and aiokafka's decoders parse the cleaned files to the same records.
"""
from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbroker._native import cleaner as native
from kbroker.log import cleaner as cleaner_mod
from kbroker.log.cleaner import CleanerConfig, LogCleaner
from kbroker.log.log import Log, LogConfig
from kbroker.record import BatchBuilder, decode_records, iter_batches

NOW = 10_000_000
DAY = 86_400_000


def make_log(path, **cfg):
    conf = {"cleanup.policy": "compact", "segment.bytes": 1500, "index.interval.bytes": 200,
            "file.delete.delay.ms": 0}
    conf.update(cfg)
    return Log(str(path), "t", 0, LogConfig(conf), now=NOW)


def append(lg, records, codec=0, pid=-1, epoch=0, seq=-1, ts=None):
    b = BatchBuilder(codec, batch_size=1 << 20)
    for i, (k, v) in enumerate(records):
        b.append((ts if ts is not None else NOW) + i, k, v)
    return lg.append_as_leader(bytearray(b.build(producer_id=pid, producer_epoch=epoch, base_sequence=seq)),
                               0, NOW)


def file_records(lg, check=True):
    """Every record of every segment file, with batch checks; [(offset, key, value)]."""
    out, batches = [], []
    for seg in lg.segments:
        with open(seg.log_path, "rb") as f:
            data = f.read()
        infos = iter_batches(data, 0, check)
        assert sum(b.size for b in infos) == len(data), "a segment is not a whole number of batches"
        for b in infos:
            batches.append(b)
            recs = decode_records(memoryview(data)[b.position:b.position + b.size], check_crc=check)
            for off, _ts, k, v, _h in recs:
                assert b.base_offset <= off <= b.last_offset
                out.append((off, k, v))
    offs = [o for o, _k, _v in out]
    assert offs == sorted(set(offs)), "offsets not strictly increasing"
    ends = [(b.base_offset, b.last_offset) for b in batches]
    for (b0, l0), (b1, _l1) in zip(ends, ends[1:]):
        assert b1 > l0, "batches overlap"
    return out


def latest(records):
    m = {}
    for off, k, v in records:
        m[k] = (off, v)
    return m


def fetched(lg):
    """Records through Log.read (the fetch path), to be sure reads see the swapped segments."""
    out, off = [], lg.log_start_offset
    while off < lg.log_end_offset:
        f = lg.read(off, 1 << 20)
        if not f.regions:
            break
        fd, pos, n = f.regions[0]
        data = os.pread(fd, n, pos)
        for b in iter_batches(data):
            for o, _ts, k, v, _h in decode_records(memoryview(data)[b.position:b.position + b.size]):
                if o >= off:
                    out.append((o, k, v))
            off = b.last_offset + 1
    return out


def check_cleaned(lg, before, result, tombstones_kept=True):
    after = file_records(lg)
    assert fetched(lg) == after
    want = latest(before)
    got = latest(after)
    end = result.end_offset if result is not None else -1
    if tombstones_kept:
        assert got == want
    else:
        # Keys whose latest record is a cleaned-away tombstone are simply gone.
        for k, (off, v) in want.items():
            if v is None and off < end:
                assert k not in got or got[k] == (off, v) and off >= end
            else:
                assert got[k] == (off, v)
        assert set(got) <= set(want)
    below = [k for off, k, v in after if off < end]
    assert len(below) == len(set(below)), "a key appears twice in the cleaned range"
    for off, k, v in after:
        if off < end:
            assert want[k][0] == off or any(o > off and o >= end for o, kk, _ in before if kk == k)
    return after


# ------------------------------------------------------------------------------------------ native

def test_native_map_and_filter_units():
    b = BatchBuilder(0)
    for i in range(10):
        b.append(1000 + i, b"k%d" % (i % 3), None if i == 8 else b"v%d" % i)
    raw = b.build()
    m = native.OffsetMap(64)
    m.put_section(memoryview(raw)[61:], 10, 100)
    assert (m.size, m.latest_offset, m.get(b"k0"), m.get(b"k2"), m.get(b"zz")) == (3, 109, 109, 108, -1)
    sec, kept, tomb, max_ts = native.filter_section(m, memoryview(raw)[61:], 10, 100, 1000, True)
    assert (kept, tomb, max_ts) == (3, 1, 1009)
    sec2, kept2, tomb2, _ = native.filter_section(m, memoryview(raw)[61:], 10, 100, 1000, False)
    assert (kept2, tomb2) == (2, 0)
    nb = native.finish_batch(raw[:61], sec, kept, 0, 1000, max_ts)
    recs = decode_records(nb, check_crc=True)
    assert [(o, k, v) for o, _t, k, v, _h in recs] == [(7, b"k1", b"v7"), (8, b"k2", None), (9, b"k0", b"v9")]  # header base 0
    # Rebased timestamps (a delete horizon) keep every record's absolute timestamp.
    sec3, *_ = native.filter_section(m, memoryview(raw)[61:], 10, 100, 1000, True, 5_000_000_000)
    nb3 = native.finish_batch(raw[:61], sec3, 3, 0x40, 5_000_000_000, 1009)
    assert [t for _o, t, *_ in decode_records(nb3, check_crc=True)] == [1007, 1008, 1009]
    assert native.key_hash(b"a") != native.key_hash(b"b") and len(native.key_hash(b"")) == 16
    with pytest.raises(ValueError):
        native.filter_section(m, b"\x01\x02", 1, 0, 0, True)
    full = native.OffsetMap(2, 0.5)
    with pytest.raises(OverflowError):
        full.put_section(memoryview(raw)[61:], 10, 0)


# ------------------------------------------------------------------------------------------ property

RECORD = st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"key-f" * 3]),
                   st.one_of(st.none(), st.binary(min_size=0, max_size=40)))
# (records, codec, producer id or -1)
BATCH = st.tuples(st.lists(RECORD, min_size=1, max_size=6), st.sampled_from([0, 1, 2, 3, 4]),
                  st.sampled_from([-1, -1, 101, 202]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(BATCH, min_size=1, max_size=60), seg_bytes=st.sampled_from([400, 1200, 5000]),
       dedupe=st.sampled_from([48 * 24, 1 << 20]))
def test_property_compaction_keeps_latest_per_key(tmp_path_factory, batches, seg_bytes, dedupe):
    d = tmp_path_factory.mktemp("prop")
    lg = make_log(d / "t-0", **{"segment.bytes": seg_bytes})
    seqs, last_of = {}, {}
    for recs, codec, pid in batches:
        r = append(lg, recs, codec, pid=pid, seq=seqs.get(pid, 0) if pid >= 0 else -1)
        if pid >= 0:
            seqs[pid] = seqs.get(pid, 0) + len(recs)
            last_of[pid] = r.last_offset
    lg.roll(NOW)                     # everything but an empty active segment is cleanable
    before = file_records(lg)
    cleaner = LogCleaner(CleanerConfig({"log.cleaner.dedupe.buffer.size": dedupe}))
    # A small map needs several passes; each one must leave a correct log.
    for _ in range(50):
        result = cleaner.clean_log(lg, NOW)
        if result is None:
            break
        check_cleaned(lg, before, result)
        if result.end_offset >= lg.log_end_offset:
            break
    after = file_records(lg)
    keys_latest = latest(before)
    # Fully cleaned: exactly one record per key, its latest, tombstones included (within horizon).
    assert sorted(after) == sorted((off, k, v) for k, (off, v) in keys_latest.items())
    # Each producer's last batch is still there (empty if all its records were superseded).
    kept = {(b.producer_id, b.last_offset) for seg in lg.segments
            for b in iter_batches(open(seg.log_path, "rb").read(), 0, True)}
    assert all((pid, off) in kept for pid, off in last_of.items())
    # Restart (unclean: CRC scan) reads the same.
    lg.close()
    lg2 = Log(str(d / "t-0"), "t", 0, lg.config, clean_shutdown=False, now=NOW)
    assert file_records(lg2) == after
    # Past the horizon the tombstones go, and nothing else does.
    result = cleaner.clean_log(lg2, NOW + DAY + 1)
    assert result is not None
    gone = file_records(lg2)
    assert sorted(gone) == sorted((off, k, v) for k, (off, v) in keys_latest.items() if v is not None)
    lg2.close()


# ------------------------------------------------------------------------------------------ rules

def test_tombstone_horizon_counts_from_the_first_cleaning(tmp_path):
    lg = make_log(tmp_path / "t-0")
    append(lg, [(b"k", b"v1")])
    append(lg, [(b"k", None)])
    append(lg, [(b"x", b"1")])
    lg.roll(NOW)
    cleaner = LogCleaner()
    t0 = NOW + 5 * DAY              # old records: the horizon starts at the cleaning, not at produce
    cleaner.clean_log(lg, t0)
    assert file_records(lg) == [(1, b"k", None), (2, b"x", b"1")]
    assert cleaner.clean_log(lg, t0 + DAY - 1) is None or (1, b"k", None) in file_records(lg)
    assert (1, b"k", None) in file_records(lg)
    assert cleaner.clean_log(lg, t0 + DAY + 1) is not None
    assert file_records(lg) == [(2, b"x", b"1")]
    lg.close()


def test_active_segment_and_compaction_lag(tmp_path):
    lg = make_log(tmp_path / "t-0", **{"min.compaction.lag.ms": 60_000})
    for i in range(30):
        append(lg, [(b"k", b"%d" % i)], ts=NOW)
    active_before = open(lg.active_segment.log_path, "rb").read()
    cleaner = LogCleaner()
    # Every closed segment is younger than the lag: nothing to clean.
    assert cleaner.clean_log(lg, NOW + 1000) is None
    assert len(file_records(lg)) == 30
    result = cleaner.clean_log(lg, NOW + 120_000)
    assert result is not None
    after = file_records(lg)
    assert open(lg.active_segment.log_path, "rb").read() == active_before
    assert after[-1] == (29, b"k", b"29")
    assert len([r for r in after if r[0] < lg.active_segment.base_offset]) == 1
    lg.close()


def test_uncleanable_past_high_watermark(tmp_path):
    lg = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({"cleanup.policy": "compact", "segment.bytes": 300}),
             now=NOW, hw_follows_leo=False)
    for i in range(20):
        append(lg, [(b"k", b"%d" % i)])
    lg.high_watermark = 0
    assert LogCleaner().clean_log(lg, NOW) is None
    lg.high_watermark = lg.log_end_offset
    assert LogCleaner().clean_log(lg, NOW) is not None
    lg.close()


def test_producer_last_batch_survives_empty(tmp_path):
    lg = make_log(tmp_path / "t-0")
    pid = 77
    append(lg, [(b"k", b"a"), (b"k", b"b")], pid=pid, seq=0)
    append(lg, [(b"k", b"c")], pid=pid, seq=2)
    append(lg, [(b"k", b"d")])          # supersedes every record of the producer
    append(lg, [(b"j", b"e")])
    lg.roll(NOW)
    LogCleaner().clean_log(lg, NOW)
    with open(lg.segments[0].log_path, "rb") as f:
        data = f.read()
    infos = iter_batches(data, 0, True)
    pid_batches = [b for b in infos if b.producer_id == pid]
    assert [(b.base_offset, b.last_offset, b.record_count, b.base_sequence) for b in pid_batches] == [(2, 2, 0, 2)]
    assert file_records(lg) == [(3, b"k", b"d"), (4, b"j", b"e")]
    lg.close()
    # Producer state rebuilt from the cleaned log (no snapshots) still knows the last batch.
    for f in os.listdir(tmp_path / "t-0"):
        if f.endswith(".snapshot"):
            os.unlink(tmp_path / "t-0" / f)
    lg2 = make_log(tmp_path / "t-0")
    b = BatchBuilder(0)
    b.append(NOW, b"k", b"c")
    dup = lg2.append_as_leader(bytearray(b.build(producer_id=pid, producer_epoch=0, base_sequence=2)), 0, NOW)
    assert (dup.base_offset, dup.last_offset) == (2, 2), "retry of the producer's last batch not seen as duplicate"
    lg2.close()


def test_bounded_dedupe_buffer_cleans_in_rounds(tmp_path):
    lg = make_log(tmp_path / "t-0", **{"segment.bytes": 600})
    rng = random.Random(5)
    for i in range(300):
        append(lg, [(b"k%d" % rng.randrange(200), b"v%d" % i)])
    lg.roll(NOW)
    before = file_records(lg)
    cleaner = LogCleaner(CleanerConfig({"log.cleaner.dedupe.buffer.size": 60 * 24}))   # ~54 entries
    ends = []
    while True:
        r = cleaner.clean_log(lg, NOW)
        if r is None:
            break
        check_cleaned(lg, before, r)
        ends.append(r.end_offset)
        if r.end_offset >= lg.log_end_offset:
            break
    assert len(ends) > 3 and ends == sorted(ends), ends
    assert lg.cleaner_checkpoint == lg.log_end_offset
    assert sorted(file_records(lg)) == sorted((o, k, v) for k, (o, v) in latest(before).items())
    lg.close()


def test_dirty_ratio_and_checkpoint_file(tmp_path):
    from kbroker.log.manager import CLEANER_FILE, LogManager

    m = LogManager([str(tmp_path / "d")], {"log.cleaner.min.cleanable.ratio": 0.5})
    m.startup(1, "c")
    lg = m.get_or_create("t", 0, {"cleanup.policy": "compact", "segment.bytes": 400})
    for i in range(40):
        append(lg, [(b"k%d" % (i % 4), b"%d" % i)])
    cleaner = m.cleaner
    assert cleaner._dirty_ratio(lg, NOW) == pytest.approx(1.0)          # all dirty
    assert cleaner._clean_one()
    assert cleaner._dirty_ratio(lg, NOW) is None
    m.checkpoint()
    text = open(tmp_path / "d" / CLEANER_FILE).read()
    assert f"t 0 {lg.cleaner_checkpoint}" in text and lg.cleaner_checkpoint > 0
    m.shutdown()
    m2 = LogManager([str(tmp_path / "d")])
    m2.startup(1, "c", {"t": {"cleanup.policy": "compact", "segment.bytes": 400}})
    assert m2.get(("t", 0)).cleaner_checkpoint == lg.cleaner_checkpoint
    m2.shutdown()


def test_delete_policy_logs_are_not_cleaned(tmp_path):
    from kbroker.log.manager import LogManager

    m = LogManager([str(tmp_path / "d")])
    m.startup(1, "c")
    lg = m.get_or_create("t", 0, {"segment.bytes": 300})
    for i in range(30):
        append(lg, [(b"k", b"%d" % i)])
    assert not m.cleaner._clean_one()
    assert len(file_records(lg)) == 30
    m.shutdown()


# ------------------------------------------------------------------------------------------ interop

def test_cleaned_segments_parse_with_kafka_python_and_aiokafka(tmp_path):
    from test_log_format_interop import _kafka_python_codecs, _parse_aiokafka, _parse_kafka_python

    lg = make_log(tmp_path / "t-0", **{"segment.bytes": 3000})
    rng = random.Random(11)
    for i in range(200):
        recs = [(b"key-%d" % rng.randrange(12), None if rng.random() < 0.1 else rng.randbytes(rng.randrange(60)))
                for _ in range(rng.randint(1, 5))]
        append(lg, recs, codec=i % 5)
    lg.roll(NOW)
    before = file_records(lg)
    LogCleaner().clean_log(lg, NOW)
    after = check_cleaned(lg, before, None)
    assert len(after) < len(before)
    usable = _kafka_python_codecs()
    kp_all, aio_all = [], []
    for seg in lg.segments:
        data = open(seg.log_path, "rb").read()
        kp_batches, kp_records, _ = _parse_kafka_python(data)
        aio_batches, aio_records = _parse_aiokafka(data)
        assert kp_batches == aio_batches
        kp_all += [(b, r) for b in kp_batches for r in []]
        aio_all += aio_records
        kp_all += kp_records
        ours = [r for r in after if seg.base_offset <= r[0] < seg.next_offset]
        assert aio_records == ours
        if all(c in usable for _b, _d, c in kp_batches):
            assert kp_records == ours
    assert aio_all == after


# ------------------------------------------------------------------------------------------ crash safety

CRASH_SCRIPT = r"""
import os, signal, sys
sys.path.insert(0, {tests!r})
from kbroker.log import cleaner as cm
from kbroker.log.log import Log, LogConfig
step = {step!r}
def hook(name):
    if name == step:
        os.kill(os.getpid(), signal.SIGKILL)
cm.crash_hook = hook
lg = Log({path!r}, "t", 0, LogConfig({conf!r}), now={now})
cm.LogCleaner().clean_log(lg, {now})
print("finished without reaching", step)
"""


@pytest.mark.parametrize("step", ["cleaned", "swap", "mid_rename", "renamed_indexes"])
def test_kill9_at_each_cleaning_step_leaves_a_consistent_log(tmp_path, step):
    import subprocess
    import sys

    conf = {"cleanup.policy": "compact", "segment.bytes": 800, "index.interval.bytes": 100,
            "file.delete.delay.ms": 0}
    path = str(tmp_path / "t-0")
    lg = Log(path, "t", 0, LogConfig(conf), now=NOW)
    rng = random.Random(3)
    for i in range(150):
        key = b"u%d" % i if i < 15 else b"k%d" % rng.randrange(10)     # u*: never superseded
        append(lg, [(key, None if i % 17 == 0 else b"v%d" % i)], codec=i % 3)
    lg.roll(NOW)
    before = file_records(lg)
    lg.close()
    script = CRASH_SCRIPT.format(tests=os.path.dirname(__file__), step=step, path=path, conf=conf, now=NOW)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, f"the cleaner was not killed at {step}: rc={p.returncode} {p.stdout} {p.stderr}"
    names = os.listdir(path)
    assert any(n.endswith((".cleaned", ".swap", ".deleted")) for n in names), \
        f"the kill at {step} left no intermediate file: the check could not see a half-done swap"
    lg2 = Log(path, "t", 0, LogConfig(conf), clean_shutdown=False, now=NOW)
    leftovers = [n for n in os.listdir(path) if n.endswith((".cleaned", ".swap", ".deleted"))]
    assert leftovers == []
    after = file_records(lg2)
    assert latest(after) == latest(before), f"key -> value map changed by a kill at {step}"
    assert set(after) <= set(before)
    bases = [s.base_offset for s in lg2.segments]
    assert bases == sorted(set(bases))
    # Finishing the cleaning after recovery still gives the fully compacted log.
    LogCleaner().clean_log(lg2, NOW)
    assert sorted(file_records(lg2)) == sorted((o, k, v) for k, (o, v) in latest(before).items())
    lg2.close()


def test_kill9_checker_sees_a_lost_swap(tmp_path, monkeypatch):
    """Control: without swap recovery (the loader just deletes .swap files, as before
    compaction existed) a kill between the old segments' rename and the swap's rename loses
    data, and the checks above see it."""
    import subprocess
    import sys

    conf = {"cleanup.policy": "compact", "segment.bytes": 800, "file.delete.delay.ms": 0}
    path = str(tmp_path / "t-0")
    lg = Log(path, "t", 0, LogConfig(conf), now=NOW)
    for i in range(100):
        # The first segment's keys are never superseded: losing it changes the map.
        append(lg, [(b"u%d" % i if i < 20 else b"k%d" % (i % 10), b"v%d" % i)])
    lg.roll(NOW)
    before = file_records(lg)
    lg.close()
    script = CRASH_SCRIPT.format(tests=os.path.dirname(__file__), step="mid_rename", path=path, conf=conf, now=NOW)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == -9
    monkeypatch.setattr("kbroker.log.log.recover_swaps", lambda d: None)
    lg2 = Log(path, "t", 0, LogConfig(conf), clean_shutdown=False, now=NOW)
    assert latest(file_records(lg2)) != latest(before)
    lg2.close()


def test_in_flight_read_survives_the_swap(tmp_path):
    """A fetch's (fd, position, length) region taken before a swap still reads the old bytes
    until file.delete.delay.ms has passed (the fd stays open, its number is not reused)."""
    lg = make_log(tmp_path / "t-0", **{"file.delete.delay.ms": 60_000})
    for i in range(40):
        append(lg, [(b"k%d" % (i % 3), b"value-%d" % i)])
    lg.roll(NOW)
    region = lg.read(0, 1 << 20).regions[0]
    fd, pos, n = region
    old = os.pread(fd, n, pos)
    assert LogCleaner().clean_log(lg, NOW) is not None
    assert os.pread(fd, n, pos) == old
    assert os.fstat(fd).st_nlink == 1          # renamed .deleted, not yet unlinked
    lg.remove_deleted_files(NOW + 59_000)
    assert os.pread(fd, n, pos) == old
    lg.remove_deleted_files(NOW + 60_001)
    with pytest.raises(OSError):
        os.fstat(fd)
    lg.close()


def test_compact_delete_policy_cleans_and_retains(tmp_path):
    lg = make_log(tmp_path / "t-0", **{"cleanup.policy": "compact,delete", "retention.ms": 1000})
    for i in range(30):
        append(lg, [(b"k%d" % (i % 2), b"%d" % i)], ts=NOW)
    lg.roll(NOW)
    r = LogCleaner().clean_log(lg, NOW)
    assert r is not None and sorted(v for _o, _k, v in file_records(lg)) == [b"28", b"29"]
    assert lg.delete_old_segments(NOW + 5000) > 0
    assert file_records(lg) == []
    lg.close()


def test_empty_cleaned_segments_do_not_hold_back_the_lag(tmp_path):
    """Segments emptied by a cleaning have no record time; with min.compaction.lag.ms their
    fresh mtime must not stop the next cleaning from reaching the older-enough segments."""
    lg = make_log(tmp_path / "t-0", **{"min.compaction.lag.ms": 1000})
    old = NOW - 10_000
    for i in range(40):
        append(lg, [(b"k", b"%d" % i)], ts=old)
    lg.roll(NOW)
    cleaner = LogCleaner()
    assert cleaner.clean_log(lg, NOW) is not None
    assert any(s.size == 0 for s in lg.segments[:-1])
    for i in range(40, 80):
        append(lg, [(b"k", b"%d" % i)], ts=old)
    lg.roll(NOW)
    r = cleaner.clean_log(lg, NOW)
    assert r is not None and r.end_offset == 80
    assert file_records(lg) == [(79, b"k", b"79")]
    lg.close()


def test_io_throttle(tmp_path):
    """log.cleaner.io.max.bytes.per.second bounds the pass's read + written bytes per second."""
    import time as _time

    lg = make_log(tmp_path / "t-0", **{"segment.bytes": 4000})
    for i in range(200):
        append(lg, [(b"k%d" % (i % 5), b"x" * 100)])
    lg.roll(NOW)
    total = lg.size_bytes
    cleaner = LogCleaner(CleanerConfig({"log.cleaner.io.max.bytes.per.second": total / 0.5}))
    t0 = _time.monotonic()
    r = cleaner.clean_log(lg, NOW)
    took = _time.monotonic() - t0
    assert r is not None and took >= 0.45, took     # read alone is `total` bytes: >= ~0.5 s
    lg.close()


def test_shutdown_mid_pass_on_the_event_loop(tmp_path):
    """LogManager.shutdown() on the event loop stops a cleaner thread in the middle of a pass
    (throttled to be slow): no deadlock, no .cleaned leftovers, the log reloads intact."""
    import asyncio
    import time as _time

    from kbroker.log.manager import LogManager

    async def main():
        m = LogManager([str(tmp_path / "d")], {},
                       cleaner_config={"log.cleaner.backoff.ms": 10,
                                       "log.cleaner.io.max.bytes.per.second": 20000})
        m.startup(1, "c")               # on a running loop: the cleaner thread starts
        assert [t for t in m.cleaner._threads if t.is_alive()]
        lg = m.get_or_create("t", 0, {"cleanup.policy": "compact", "segment.bytes": 2000,
                                      "min.cleanable.dirty.ratio": 0.01})
        for i in range(300):
            append(lg, [(b"k%d" % (i % 7), b"x" * 50)])
        lg.roll()
        before = latest(file_records(lg))
        m.cleaner.wakeup()
        deadline = _time.monotonic() + 20
        while not m.cleaner._busy and _time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert m.cleaner._busy, "the cleaner never started a pass"
        threads = list(m.cleaner._threads)
        t0 = _time.monotonic()
        m.shutdown()
        assert _time.monotonic() - t0 < 10
        assert not any(t.is_alive() for t in threads)
        return before

    before = asyncio.run(main())
    part = tmp_path / "d" / "t-0"
    assert not [n for n in os.listdir(part) if n.endswith((".cleaned", ".swap"))]
    lg = Log(str(part), "t", 0, LogConfig({"cleanup.policy": "compact"}), now=NOW)
    assert latest(file_records(lg)) == before
    lg.close()


def test_restart_finds_stamped_horizons_without_a_pass(tmp_path):
    """After a restart the cleaner reads the delete horizons stamped in the batches: nothing is
    rewritten before the earliest one, and the tombstone goes once it has passed."""
    lg = make_log(tmp_path / "t-0", **{"min.cleanable.dirty.ratio": 0.9})
    for i in range(20):
        append(lg, [(b"k%d" % (i % 4), None if i == 17 else b"%d" % i)])
    lg.roll(NOW)
    assert LogCleaner().clean_log(lg, NOW) is not None
    lg.close()
    lg2 = make_log(tmp_path / "t-0", **{"min.cleanable.dirty.ratio": 0.9})
    lg2.cleaner_checkpoint = lg.cleaner_checkpoint        # as LogManager loads it from its file
    fresh = LogCleaner(logs=lambda: [lg2])
    assert fresh._discover_horizon(lg2, NOW) == NOW + DAY
    fresh._horizons[id(lg2)] = NOW + DAY
    assert fresh._dirty_ratio(lg2, NOW + 1000) is None      # clean, horizon ahead: nothing to do
    assert fresh._dirty_ratio(lg2, NOW + DAY) is not None
    assert (17, b"k1", None) in file_records(lg2)
    assert fresh.clean_log(lg2, NOW + DAY) is not None
    assert b"k1" not in {k for _o, k, _v in file_records(lg2)}
    lg2.close()
