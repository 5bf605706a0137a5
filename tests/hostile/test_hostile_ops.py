"""Operations under hostile conditions: a full disk, recovery that truncates, deletes.

- Disk full (a small tmpfs this test mounts and unmounts): produce fails with KAFKA_STORAGE_ERROR (no
  crash), the checkpoint failure is reported once per log dir (no periodic error storm), and the space a
  DeleteTopics frees is back within log.segment.delete.delay.ms + 1 s (its own timer, not the retention
  pass); then produce works again and the checkpoint recovery is reported.
- Recovery that cuts a corrupted tail off a log says so once, naming the partition, the offset and bytes.
- A topic with a 249-character name (Kafka's maximum) can be deleted (the -delete dir name is cut to fit).
"""
from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
import uuid

import pytest

from checkers import RawConn, create_topic, log_end_offset, wait_until
from kbroker.testing import LocalCluster
from kbroker.protocol.errors import Errors
from test_hostile_attacks import _batch, _produce, _record

KAFKA_STORAGE_ERROR = Errors.KAFKA_STORAGE_ERROR
DELETE_DELAY_MS = 2000
TMPFS_MIB = 24


@pytest.fixture
def tmpfs():
    path = tempfile.mkdtemp(prefix="kbroker-diskfull-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


def _free_mib(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / (1 << 20)


@pytest.mark.slow
def test_disk_full_then_delete_topic_frees_space_in_delay(tmp_path, tmpfs):
    data = os.path.join(tmpfs, "data")
    with LocalCluster(tmp_path / "cluster", num_partitions=1, overrides={
            "log.dirs": data, "log.segment.delete.delay.ms": DELETE_DELAY_MS,
            "log.flush.offset.checkpoint.interval.ms": 500}) as c:
        filler = f"filler-{uuid.uuid4().hex[:6]}"
        other = f"other-{uuid.uuid4().hex[:6]}"
        create_topic(c.bootstrap, filler, 1)
        create_topic(c.bootstrap, other, 1)
        big = _batch(0, [_record(0, b"k", os.urandom(900_000))])
        codes = []
        with RawConn(c.bootstrap, timeout=30) as conn:
            for _ in range(4 * TMPFS_MIB):
                r = _produce(conn, filler, big)
                codes.append(r["error_code"])
                if r["error_code"]:
                    break
            assert codes[-1] == KAFKA_STORAGE_ERROR, codes
            small = _batch(0, [_record(0, b"k", os.urandom(3000))])
            for _ in range(2000):          # then the last pages, so checkpoints cannot be written either
                if _produce(conn, filler, small)["error_code"]:
                    break
            full_leo = log_end_offset(c.bootstrap, filler, 0)
            # a few more attempts and checkpoint rounds while full: still one error line per dir
            for _ in range(3):
                assert _produce(conn, filler, big)["error_code"] == KAFKA_STORAGE_ERROR
            wait_until(lambda: "cannot write checkpoints" in c.brokers[0].log_tail(100000), 10,
                       "the checkpoint failure report")
            time.sleep(2.0)               # four more checkpoint rounds (every 500 ms) while full
            assert log_end_offset(c.bootstrap, filler, 0) == full_leo, "an append failing for space moved the LEO"
        free_before = _free_mib(tmpfs)
        assert free_before < 2, f"the disk is not full ({free_before:.1f} MiB free)"

        from confluent_kafka.admin import AdminClient
        t0 = time.monotonic()
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.delete_topics([filler], operation_timeout=10)[filler].result(15)
        wait_until(lambda: _free_mib(tmpfs) > TMPFS_MIB / 2, DELETE_DELAY_MS / 1000 + 10, "space to come back")
        back_s = time.monotonic() - t0
        print(f"T-diskfull produced={len(codes) - 1} batches, space back {back_s:.2f}s after DeleteTopics "
              f"(delay {DELETE_DELAY_MS} ms), free {_free_mib(tmpfs):.1f} MiB")
        assert back_s <= DELETE_DELAY_MS / 1000 + 1.0, f"space back after {back_s:.2f}s"

        with RawConn(c.bootstrap, timeout=30) as conn:
            r = _produce(conn, other, big)
            assert r["error_code"] == 0, r
        wait_until(lambda: "are written again" in c.brokers[0].log_tail(100000), 10, "checkpoint recovery report")
        logtext = c.brokers[0].log_tail(100000)
        failing = logtext.count("cannot write checkpoints in log dir")
        storms = logtext.count("periodic checkpoint failed")
        print(f"T-diskfull checkpoint_error_lines={failing} periodic_failures={storms}")
        assert failing == 1, f"{failing} checkpoint error lines for one dir"
        assert storms == 0


def test_recovery_truncation_is_logged(tmp_path, caplog):
    """A torn tail found by recovery is reported once with partition, offset and bytes; the checker
    sees nothing when nothing was truncated (so it can tell the two apart)."""
    from kbroker.log.log import Log, LogConfig

    d = tmp_path / "t-0"
    d.mkdir()
    lg = Log(str(d), "t", 0, LogConfig({}))
    for i in range(5):
        lg.append_as_leader(bytearray(_batch(0, [_record(0, b"k", b"v" * 100)])), 0, 1000 + i)
    lg.flush()
    lg.close()
    with caplog.at_level(logging.WARNING, logger="kbroker.log.log"):
        Log(str(d), "t", 0, LogConfig({}), clean_shutdown=False, recovery_point=0).close()
    assert not [r for r in caplog.records if "recovery truncated" in r.getMessage()]
    seg = d / f"{0:020d}.log"
    size = seg.stat().st_size
    with open(seg, "r+b") as f:            # corrupt the last batch's records (CRC now wrong)
        f.seek(size - 20)
        f.write(b"\xff" * 10)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kbroker.log.log"):
        lg = Log(str(d), "t", 0, LogConfig({}), clean_shutdown=False, recovery_point=0)
    msgs = [r.getMessage() for r in caplog.records if "recovery truncated" in r.getMessage()]
    assert len(msgs) == 1, msgs
    assert "t-0" in msgs[0] and "at offset 4" in msgs[0] and "bytes of segment" in msgs[0], msgs[0]
    assert lg.log_end_offset == 4
    lg.close()


@pytest.mark.slow
def test_delete_topic_with_longest_name(tmp_path):
    with LocalCluster(tmp_path / "cluster", num_partitions=1) as c:
        name = "L" * 249
        create_topic(c.bootstrap, name, 1)
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.delete_topics([name], operation_timeout=10)[name].result(15)
        wait_until(lambda: not any(p.name.startswith("LLLL") and not p.name.endswith("-delete")
                                   for p in c.brokers[0].data_dir.iterdir()), 15, "the partition dir to go")
        assert "File name too long" not in c.brokers[0].log_tail(100000)


@pytest.mark.slow
def test_list_offsets_by_timestamp_over_a_stored_bomb_answers_an_error(tmp_path):
    """A zstd bomb already on disk (written before produce validated compressed batches, here appended
    to the segment while the broker was down): ListOffsets by timestamp reaching it answers
    CORRUPT_MESSAGE for that partition and the connection stays usable (it used to close)."""
    import struct as _struct

    from checkers import LIST_OFFSETS
    from kbroker._native.crc import crc32c
    from kbroker.record.compression import compress

    with LocalCluster(tmp_path / "cluster", num_partitions=1) as c:
        topic = f"bombed-{uuid.uuid4().hex[:6]}"
        create_topic(c.bootstrap, topic, 1)
        with RawConn(c.bootstrap) as conn:
            assert _produce(conn, topic, _batch(0, [_record(0, b"k", b"v")]))["error_code"] == 0
        c.stop_broker(0)
        seg = c.brokers[0].data_dir / f"{topic}-0" / f"{0:020d}.log"
        now = int(time.time() * 1000) + 60_000
        section = compress(4, _record(0, b"k", b"\0" * (80 << 20)))
        after = _struct.pack(">hiqqqhii", 4, 0, now, now, -1, -1, -1, 1) + section
        bomb = _struct.pack(">qiibI", 1, 9 + len(after), 0, 2, crc32c(after)) + after
        with open(seg, "ab") as f:
            f.write(bomb)
        c.start_broker(0)
        with RawConn(c.bootstrap) as conn:
            resp = conn.request(LIST_OFFSETS, 1, {"replica_id": -1, "topics": [
                {"name": topic, "partitions": [{"partition_index": 0, "timestamp": now}]}]})
            code = resp["topics"][0]["partitions"][0]["error_code"]
            assert code == 2, resp
            assert conn.request(18, 0, {})["error_code"] == 0       # still open
