"""Recovery: every corruption is cut back to the last valid batch, later segments go, indexes,
leader epochs and the high watermark follow; a clean restart does no CRC scan."""
import os
import signal
import subprocess
import sys

import pytest
from kafka.record import MemoryRecords

from kbroker.log import Log, LogConfig
from kbroker.log.segment import STATS
import builders
import paths

T0 = builders.T0


def batch(n=3, value_size=100, ts=T0):
    return builders.batch(n, value_size, ts, key=None, fill=b"r")


def reopen(path, clean, **kw):
    cfg = kw.pop("cfg", {})
    return Log(str(path / "t-0"), "t", 0, LogConfig(cfg), clean_shutdown=clean, **kw)


def populate(path, batches=10, cfg=None, epochs=None):
    log = Log(str(path / "t-0"), "t", 0, LogConfig(cfg or {}))
    ends = []
    for i in range(batches):
        r = log.append_as_leader(batch(3, ts=T0 + i), (epochs or {}).get(i, 0), T0)
        ends.append((log.active_segment.size, r.last_offset + 1))
    return log, ends


def crash(log):
    """Drop the log without a clean close: no trim, no snapshot, no flush of anything."""
    for s in log.segments:
        for fd in (s._append_fd, s.read_fd):
            if fd >= 0:
                os.close(fd)
        s._append_fd = s.read_fd = -1


def file_offsets(path):
    data = open(path, "rb").read()
    recs = MemoryRecords(data)
    out = []
    while recs.has_next():
        b = recs.next_batch()
        assert b.validate_crc()
        out += [r.offset for r in b]
    return out


def log_file(path, base=0):
    return str(path / "t-0" / f"{base:020d}.log")


@pytest.mark.parametrize("damage", ["torn_tail", "garbage", "flipped_byte", "bad_length"])
def test_unclean_restart_cuts_to_last_valid_batch(tmp_path, damage):
    log, ends = populate(tmp_path)
    crash(log)
    path = log_file(tmp_path)
    good_size, good_leo = ends[-2]                 # the last batch will be damaged (or garbage follows)
    with open(path, "r+b") as f:
        if damage == "torn_tail":
            f.truncate(ends[-1][0] - 7)
        elif damage == "garbage":
            f.seek(0, 2)
            f.write(os.urandom(300))
            good_size, good_leo = ends[-1]
        elif damage == "flipped_byte":
            f.seek(ends[-1][0] - 3)
            b = f.read(1)
            f.seek(ends[-1][0] - 3)
            f.write(bytes([b[0] ^ 0x40]))
        elif damage == "bad_length":
            f.seek(good_size + 8)
            f.write((10 ** 6).to_bytes(4, "big"))
    scans = STATS["recovery_scans"]
    log = reopen(tmp_path, clean=False)
    assert STATS["recovery_scans"] > scans
    assert log.log_end_offset == good_leo
    assert os.path.getsize(path) == good_size
    assert file_offsets(path) == list(range(good_leo))
    # Appends continue at the right offset and the file stays readable by a real client.
    r = log.append_as_leader(batch(2), 0, T0)
    assert (r.base_offset, r.last_offset) == (good_leo, good_leo + 1)
    log.close()
    assert file_offsets(path) == list(range(good_leo + 2))


def test_corruption_in_earlier_segment_deletes_later_ones(tmp_path):
    log, _ = populate(tmp_path, batches=12, cfg={"segment.bytes": 1200})
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3
    crash(log)
    second = log_file(tmp_path, bases[1])
    with open(second, "r+b") as f:                 # flip a byte in the second segment's first batch
        f.seek(70)
        b = f.read(1)
        f.seek(70)
        f.write(bytes([b[0] ^ 1]))
    log = reopen(tmp_path, clean=False, cfg={"segment.bytes": 1200})
    assert [s.base_offset for s in log.segments] == bases[:2]
    assert log.log_end_offset == bases[1]
    assert os.path.getsize(second) == 0
    assert not any(os.path.exists(log_file(tmp_path, b)) for b in bases[2:])
    assert log.append_as_leader(batch(1), 0, T0).base_offset == bases[1]
    log.close()


def test_recovery_rebuilds_index_identical(tmp_path):
    cfg = {"index.interval.bytes": 300}
    log, _ = populate(tmp_path, batches=30, cfg=cfg)
    log.close()
    idx = open(tmp_path / "t-0" / "00000000000000000000.index", "rb").read()
    tidx = open(tmp_path / "t-0" / "00000000000000000000.timeindex", "rb").read()
    assert idx
    os.unlink(tmp_path / "t-0" / "00000000000000000000.index")   # lost index
    log = reopen(tmp_path, clean=False, cfg=cfg)
    log.close()
    assert open(tmp_path / "t-0" / "00000000000000000000.index", "rb").read() == idx
    assert open(tmp_path / "t-0" / "00000000000000000000.timeindex", "rb").read() == tidx


def test_clean_restart_does_not_scan(tmp_path):
    log, ends = populate(tmp_path, batches=20, cfg={"segment.bytes": 1500})
    leo = log.log_end_offset
    log.close()
    scans = STATS["recovery_scans"]
    log = reopen(tmp_path, clean=True, cfg={"segment.bytes": 1500})
    assert STATS["recovery_scans"] == scans and log.recovered_segments == 0
    assert log.log_end_offset == leo
    assert log.append_as_leader(batch(1), 0, T0).base_offset == leo
    log.close()


def test_clean_restart_with_corrupt_index_rebuilds_it(tmp_path):
    cfg = {"index.interval.bytes": 200}
    log, _ = populate(tmp_path, batches=20, cfg=cfg)
    leo = log.log_end_offset
    log.close()
    p = tmp_path / "t-0" / "00000000000000000000.index"
    raw = bytearray(open(p, "rb").read())
    raw[-8:] = (0).to_bytes(4, "big") + (10 ** 8).to_bytes(4, "big")    # position past the file
    open(p, "wb").write(raw)
    log = reopen(tmp_path, clean=True, cfg=cfg)
    assert log.recovered_segments == 1 and log.log_end_offset == leo
    for off in range(leo):
        assert off in file_offsets_from(log, off)
    log.close()


def file_offsets_from(log, offset):
    d = log.read(offset, 1, max_offset=log.log_end_offset)
    fd, pos, length = d.regions[0]
    b = MemoryRecords(os.pread(fd, length, pos)).next_batch()
    return [r.offset for r in b]


def test_recovery_point_limits_scan(tmp_path):
    cfg = {"segment.bytes": 1200}
    log, _ = populate(tmp_path, batches=15, cfg=cfg)
    log.flush()
    rp = log.recovery_point
    log.append_as_leader(batch(3), 0, T0)
    log.append_as_leader(batch(3), 0, T0)
    n_segments = len(log.segments)
    crash(log)
    log = reopen(tmp_path, clean=False, cfg=cfg, recovery_point=rp)
    # Only the segment holding the recovery point and later ones were scanned.
    assert 1 <= log.recovered_segments < n_segments
    log.close()


def test_hw_clamped_and_epochs_rebuilt(tmp_path):
    log, ends = populate(tmp_path, batches=6, epochs={0: 1, 1: 1, 2: 3, 3: 3, 4: 5, 5: 5})
    assert log.epoch_cache.entries == [(1, 0), (3, 6), (5, 12)]
    hw = log.high_watermark
    log.epoch_cache.flush()
    crash(log)
    os.unlink(tmp_path / "t-0" / "leader-epoch-checkpoint")   # lost: rebuilt from the batches
    with open(log_file(tmp_path), "r+b") as f:
        f.truncate(ends[3][0] + 20)                   # torn 5th batch: epoch 5 disappears
    log = reopen(tmp_path, clean=False, high_watermark=hw)
    assert log.log_end_offset == 12
    assert log.high_watermark == 12                   # clamped from 18
    assert log.epoch_cache.entries == [(1, 0), (3, 6)]
    assert open(tmp_path / "t-0" / "leader-epoch-checkpoint").read() == "0\n2\n1 0\n3 6\n"
    log.close()


def test_stale_epoch_checkpoint_truncated_to_log_end(tmp_path):
    log, ends = populate(tmp_path, batches=4, epochs={0: 1, 1: 1, 2: 2, 3: 7})
    crash(log)
    with open(log_file(tmp_path), "r+b") as f:
        f.truncate(ends[2][0] + 1)
    log = reopen(tmp_path, clean=False)
    assert log.log_end_offset == 9
    assert log.epoch_cache.entries == [(1, 0), (2, 6)]
    log.close()


def test_missing_index_rebuilt_on_clean_load(tmp_path):
    cfg = {"index.interval.bytes": 300}
    log, _ = populate(tmp_path, batches=20, cfg=cfg)
    log.close()
    p = tmp_path / "t-0" / "00000000000000000000.index"
    want = open(p, "rb").read()
    assert want
    os.unlink(p)
    log = reopen(tmp_path, clean=True, cfg=cfg)
    assert log.recovered_segments == 1
    log.close()
    assert open(p, "rb").read() == want


def test_hw_checkpoint_kept_when_replication_owns_it(tmp_path):
    log, _ = populate(tmp_path, batches=5)
    log.close()
    log = reopen(tmp_path, clean=True, high_watermark=6, hw_follows_leo=False)
    assert log.high_watermark == 6 and log.log_end_offset == 15
    assert log.read(6, 1 << 20).size == 0
    log.close()
    log = reopen(tmp_path, clean=True, high_watermark=6)       # single broker: HW = LEO
    assert log.high_watermark == 15
    log.close()


_KILLED_WRITER = r"""
import os, signal, sys
sys.path[:0] = {path!r}
from test_log_recovery import batch, T0
from kbroker.log import Log, LogConfig
log = Log({dir!r}, "t", 0, LogConfig({{"segment.bytes": 2000}}))
for i, epoch in enumerate([1, 1, 2, 2, 2, 3, 3, 5, 5, 8]):
    log.append_as_leader(batch(3, ts=T0 + i), epoch, T0)
    if i == 4:
        log.flush()               # epochs 1, 2 written, recovery point 15
print(log.recovery_point, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_epochs_written_lazily_survive_kill_9(tmp_path):
    """Invariant: after kill -9, the epoch cache rebuilt at restart equals the one the leader held,
    although new epochs are no longer written (fsync) on the append that starts them."""
    d = str(tmp_path / "t-0")
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER.format(path=[os.path.dirname(__file__), str(paths.TESTS / "support")], dir=d)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    recovery_point = int(proc.stdout.split()[0])
    assert recovery_point == 15
    expected = [(1, 0), (2, 6), (3, 15), (5, 21), (8, 27)]
    # The file is stale (what the flush wrote): epochs 3, 5 and 8 exist only in their batches.
    on_disk = open(os.path.join(d, "leader-epoch-checkpoint")).read()
    assert on_disk == "0\n2\n1 0\n2 6\n"
    log = reopen(tmp_path, clean=False, recovery_point=recovery_point, cfg={"segment.bytes": 2000})
    assert len(log.segments) > 1 and log.recovered_segments < len(log.segments)  # not a full scan
    violations = [e for e in expected if e not in log.epoch_cache.entries] + \
                 [e for e in log.epoch_cache.entries if e not in expected]
    assert violations == [] and log.log_end_offset == 30
    assert open(os.path.join(d, "leader-epoch-checkpoint")).read() == \
        "0\n5\n1 0\n2 6\n3 15\n5 21\n8 27\n"
    log.close()


def test_stale_epoch_file_below_recovery_point_would_be_seen(tmp_path):
    """The checker above can see a violation: when the flush did not write the epochs (as if the
    recovery point had moved without them), the restart cannot know epoch 2 began at 6."""
    cfg = {"segment.bytes": 500}       # one batch per segment
    log, _ = populate(tmp_path, batches=5, cfg=cfg, epochs={0: 1, 1: 1, 2: 2, 3: 2, 4: 2})
    for s in log.segments:
        s.flush()
    rp = log.log_end_offset            # recovery point moved, epoch file never written
    crash(log)
    log = reopen(tmp_path, clean=False, recovery_point=rp, cfg=cfg)
    assert log.recovered_segments == 1
    assert (2, 6) not in log.epoch_cache.entries
    log.close()
