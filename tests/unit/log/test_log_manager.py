"""LogManager: dir lock, meta.properties, checkpoints in Kafka's format, clean-shutdown marker,
partition create/load/delete, and the periodic jobs."""
import os
import subprocess
import sys

import pytest

from kbroker.log import LogDirError, LogManager
from kbroker.log.segment import STATS
import builders

T0 = builders.T0
CLUSTER = "Yk3Zc1pTQmW2bXJ0aWNsZQ"


def batch(n=3, ts=T0):
    return builders.batch(n, ts=ts, key=None, fill=b"m", ts_step=0)


@pytest.fixture
def mgr(tmp_path):
    m = LogManager([str(tmp_path / "d1")], {"log.segment.bytes": "1500"})
    m.startup(1, CLUSTER)
    yield m
    m.shutdown()


def test_layout_meta_and_checkpoints(tmp_path, mgr):
    d = tmp_path / "d1"
    log = mgr.get_or_create("orders", 3, {"retention.ms": "3600000"})
    assert log.config.retention_ms == 3_600_000 and log.config.segment_bytes == 1500
    for _ in range(4):
        log.append_as_leader(batch(), 0, T0)
    assert mgr.get(("orders", 3)) is log and mgr.all_logs() == [log]
    assert (d / "orders-3" / "00000000000000000000.log").exists()
    meta = (d / "meta.properties").read_text()
    assert "version=0\n" in meta and "broker.id=1\n" in meta and f"cluster.id={CLUSTER}\n" in meta
    mgr.checkpoint()
    assert (d / "replication-offset-checkpoint").read_text() == "0\n1\norders 3 12\n"
    assert (d / "log-start-offset-checkpoint").read_text() == "0\n1\norders 3 0\n"
    assert (d / "recovery-point-offset-checkpoint").read_text() == "0\n1\norders 3 0\n"
    assert not (d / ".kafka_cleanshutdown").exists()


def test_a_topics_partitions_share_one_config_until_it_changes(mgr):
    a0, a1 = mgr.get_or_create("a", 0, {"retention.ms": "1000"}), mgr.get_or_create("a", 1)
    b0 = mgr.get_or_create("b", 0)
    assert a0.config is a1.config and a0.config is not b0.config
    assert (a0.config.retention_ms, b0.config.segment_bytes) == (1000, 1500)
    old = a0.config
    mgr.set_topic_config("a", {"retention.ms": "2000"})
    assert a0.config is a1.config and a0.config is not old and a1.config.retention_ms == 2000
    assert old.retention_ms == 1000                              # the old one is left as it was
    mgr.set_topic_config("a", {"retention.ms": "2000"})         # the same overrides: the same config
    assert a0.config is a1.config and a1.config.retention_ms == 2000
    assert mgr.get_or_create("a", 2).config is a0.config         # a new partition: the same one


def test_a_deleted_topics_config_is_forgotten(mgr):
    a0 = mgr.get_or_create("a", 0, {"retention.ms": "1000"})
    mgr.get_or_create("b", 0, {"retention.ms": "5000"})
    mgr.forget_topic("a")
    assert "a" not in mgr.topic_configs and "a" not in mgr._log_configs
    assert a0.config.retention_ms == 1000                       # an open log keeps the config it holds
    assert mgr.get_or_create("b", 1).config.retention_ms == 5000  # other topics keep theirs
    again = mgr.get_or_create("a", 1)                            # created again, without overrides
    assert again.config.retention_ms != 1000 and again.config is not a0.config
    mgr.forget_topic("never-known")                              # nothing to forget: no error


def test_second_manager_on_same_dir_refused(tmp_path, mgr):
    other = LogManager([str(tmp_path / "d1")], {})
    with pytest.raises(LogDirError, match="locked"):
        other.startup(1, CLUSTER)
    # Also from another process, the way a second broker would try.
    code = ("import sys; from kbroker.log import LogManager, LogDirError\n"
            f"m = LogManager([{str(tmp_path / 'd1')!r}], {{}})\n"
            "try:\n    m.startup(1, 'x')\nexcept LogDirError as e:\n    print(e); sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 3 and "locked" in p.stdout


def test_meta_properties_mismatch_refused(tmp_path):
    m = LogManager([str(tmp_path / "d")], {})
    m.startup(1, CLUSTER)
    m.shutdown()
    with pytest.raises(LogDirError) as e:
        LogManager([str(tmp_path / "d")], {}).startup(2, CLUSTER)
    assert "broker.id=1" in str(e.value) and "broker.id=2" in str(e.value)
    with pytest.raises(LogDirError) as e:
        LogManager([str(tmp_path / "d")], {}).startup(1, "another-cluster")
    assert CLUSTER in str(e.value) and "another-cluster" in str(e.value)
    # A refused startup releases its lock: the right identity still starts.
    m = LogManager([str(tmp_path / "d")], {})
    m.startup(1, CLUSTER)
    m.shutdown()


def test_clean_restart_restores_logs_without_scan(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    m = LogManager(dirs, {"segment.bytes": 1500})
    m.startup(5, CLUSTER)
    for p in range(4):
        log = m.get_or_create("t", p, {})
        for _ in range(5):
            log.append_as_leader(batch(), 0, T0)
    assert {m._dir_of[("t", p)] for p in range(4)} == set(dirs)   # spread over dirs
    m.shutdown()
    for d in dirs:
        assert os.path.exists(os.path.join(d, ".kafka_cleanshutdown"))
        assert open(os.path.join(d, "recovery-point-offset-checkpoint")).read().count(" 15\n") == 2
    scans = STATS["recovery_scans"]
    m = LogManager(dirs, {"segment.bytes": 1500})
    m.startup(5, CLUSTER)
    assert m.clean_startup and STATS["recovery_scans"] == scans
    for d in dirs:
        assert not os.path.exists(os.path.join(d, ".kafka_cleanshutdown"))   # removed at startup
    for p in range(4):
        log = m.get(("t", p))
        assert log.log_end_offset == 15 and log.high_watermark == 15
        assert log.append_as_leader(batch(), 0, T0).base_offset == 15
    m.shutdown()


def test_unclean_restart_recovers(tmp_path):
    d = str(tmp_path / "d")
    m = LogManager([d], {})
    m.startup(1, CLUSTER)
    log = m.get_or_create("t", 0, {})
    for _ in range(5):
        log.append_as_leader(batch(), 0, T0)
    m.checkpoint()                                  # HW 15 on disk
    path = log.active_segment.log_path
    # Crash: release the lock as process death would, leave everything else.
    m._unlock()
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    m2 = LogManager([d], {})
    m2.startup(1, CLUSTER)
    assert not m2.clean_startup
    log2 = m2.get(("t", 0))
    assert log2.log_end_offset == 12 and log2.high_watermark == 12
    assert open(os.path.join(d, "replication-offset-checkpoint")).read() == "0\n1\nt 0 12\n"
    m2.shutdown()


def test_epoch_checkpoints_written_at_flush_and_shutdown_only(tmp_path):
    """New epochs cost no fsync on the append nor in the periodic checkpoint; the log's flush
    and the clean shutdown write them, and a clean restart (no scan) has them all."""
    d = tmp_path / "d1"
    m = LogManager([str(d)], {})
    m.startup(1, CLUSTER)
    logs = [m.get_or_create("e", p, {}) for p in range(3)]
    for lg in logs[:2]:
        lg.append_as_leader(batch(), 4, T0)
    m.checkpoint()
    assert not any((d / f"e-{p}" / "leader-epoch-checkpoint").exists() for p in range(3))
    logs[0].flush()
    assert (d / "e-0" / "leader-epoch-checkpoint").read_text() == "0\n1\n4 0\n"
    logs[2].append_as_leader(batch(), 6, T0)
    m.delete("e", 2, now=T0)
    snap = logs[2].epoch_cache.snapshot()
    logs[2].epoch_cache.write_snapshot(*snap)          # closed by the delete: no write
    assert not (d / "e-2" / "leader-epoch-checkpoint").exists()
    m.shutdown()
    assert (d / "e-1" / "leader-epoch-checkpoint").read_text() == "0\n1\n4 0\n"
    m2 = LogManager([str(d)], {})
    m2.startup(1, CLUSTER)
    assert m2.clean_startup and m2.get(("e", 1)).epoch_cache.entries == [(4, 0)]
    m2.shutdown()


def test_delete_partition(tmp_path, mgr):
    d = tmp_path / "d1"
    log = mgr.get_or_create("gone", 0, {})
    log.append_as_leader(batch(), 0, T0)
    fd = log.active_segment.read_fd
    assert mgr.delete("gone", 0, now=T0)
    assert mgr.get(("gone", 0)) is None
    assert not any(n.startswith("gone-0") for n in os.listdir(d))
    os.fstat(fd)                                     # still open for in-flight sendfiles
    mgr.cleanup_expired(T0 + 60_000)
    with pytest.raises(OSError):
        os.fstat(fd)
    assert "gone" not in (d / "replication-offset-checkpoint").read_text()
    # Leftover -delete dirs from a crash are removed at startup.
    (d / "x-0.0123abcd-delete").mkdir()
    (d / "x-0.0123abcd-delete" / "00000000000000000000.log").write_bytes(b"junk")
    mgr.shutdown()
    m = LogManager([str(d)], {})
    m.startup(1, CLUSTER)
    assert not (d / "x-0.0123abcd-delete").exists() and m.all_logs() == []
    m.shutdown()


def test_periodic_jobs(tmp_path, mgr):
    log = mgr.get_or_create("r", 0, {"retention.bytes": "0", "flush.ms": "1000"})
    for _ in range(10):
        log.append_as_leader(batch(), 0, T0)
    n = len(log.segments)
    assert n > 1
    assert mgr.cleanup_expired(T0) == n - 1
    assert len(log.segments) == 1 and log.log_start_offset == log.active_segment.base_offset
    assert log.recovery_point == log.log_start_offset       # never below the log start
    assert mgr.flush_dirty(log.last_flush_ms + 999) == 0
    assert mgr.flush_dirty(log.last_flush_ms + 1000) == 1
    assert log.recovery_point == log.log_end_offset
    assert mgr.flush_dirty(log.last_flush_ms + 5000) == 0     # nothing new: no flush


def test_a_failed_dir_goes_offline_a_full_one_does_not(tmp_path):
    import shutil
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2], {})
    m.startup(1, CLUSTER)
    told = []
    m.on_dir_failure = lambda d, tps: told.append((d, tps))
    a, b = m.get_or_create("t", 0), m.get_or_create("t", 1)
    failed, healthy = m.dir_of(a), m.dir_of(b)
    assert {failed, healthy} == {d1, d2}
    assert m.check_dir(failed) is False and told == []           # a dir that takes a write is fine
    # the dir is gone from under the broker: the probe fails (ENOENT), the dir goes offline
    shutil.rmtree(failed)
    assert m.check_dir(failed) is True
    assert told == [(failed, [("t", 0)])] and a.offline and not b.offline
    assert m.in_offline_dir(("t", 0)) and not m.in_offline_dir(("t", 1))
    assert m.check_dir(failed) is True and len(told) == 1           # reported once
    # new partitions go to the online dir; the periodic jobs and the cleaner leave the offline log alone
    assert m.dir_of(m.get_or_create("u", 0)) == healthy
    assert [d for d, _ in m.checkpoint_snapshot()] == [healthy]
    assert a not in m.cleaner._logs() and b in m.cleaner._logs()
    m.flush_dirty()
    m.cleanup_expired()
    m.shutdown()                     # no clean-shutdown marker in the failed dir, one in the other
    assert not os.path.exists(os.path.join(failed, ".kafka_cleanshutdown"))
    assert os.path.exists(os.path.join(healthy, ".kafka_cleanshutdown"))


def test_a_full_disk_is_not_a_failed_dir():
    import errno
    from kbroker.log.manager import is_dir_failure
    assert not is_dir_failure(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_dir_failure(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert all(is_dir_failure(OSError(e, "x")) for e in (errno.EIO, errno.EROFS, errno.EACCES, errno.ENOENT))
