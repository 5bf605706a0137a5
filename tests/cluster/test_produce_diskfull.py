"""A full disk under producers: every failed append answers KAFKA_STORAGE_ERROR, the
broker logs one error line per log dir for the whole streak (not one per retry), and one line when
appends there succeed again; a second streak is reported again. Real broker on a small tmpfs this test
mounts (a ballast file fills it; deleting the ballast gives the space back), raw Produce requests on
the synchronous path and on the writer-thread path (batches above kbroker.log.writer.offload.bytes)."""
from __future__ import annotations

import os
import subprocess
import tempfile
import uuid

import pytest

from checkers import RawConn, create_topic, wait_until
from kbroker.testing import LocalCluster
from kbroker.protocol.errors import Errors
from test_hostile_attacks import _batch, _produce, _record

KAFKA_STORAGE_ERROR = Errors.KAFKA_STORAGE_ERROR
TMPFS_MIB = 24
FAIL_LINE = "fail (first:"
OK_LINE = "succeed again"


@pytest.fixture
def tmpfs():
    path = tempfile.mkdtemp(prefix="kbroker-appendfull-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


def _fill(path: str) -> None:
    """Write a ballast file until the filesystem refuses, leaving (almost) nothing free."""
    with open(os.path.join(path, "ballast"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * (256 << 10))
                f.flush()
        except OSError:
            pass


def _fill_to_last_page(path: str) -> None:
    """``_fill``, then the ballast grown page by page until not even one more page fits."""
    _fill(path)
    fd = os.open(os.path.join(path, "ballast"), os.O_WRONLY | os.O_APPEND)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def _lines(c, needle: str) -> int:
    return c.brokers[0].log_tail(100000).count(needle)


@pytest.mark.slow
def test_full_disk_logs_one_line_per_dir_per_streak(tmp_path, tmpfs):
    data = os.path.join(tmpfs, "data")
    with LocalCluster(tmp_path / "cluster", num_partitions=2, overrides={
            "log.dirs": data, "kbroker.log.writer.offload.bytes": 512 << 10}) as c:
        topic = f"full-{uuid.uuid4().hex[:6]}"
        create_topic(c.bootstrap, topic, 2)
        small = _batch(0, [_record(0, b"k", os.urandom(200_000))])      # written on the loop
        large = _batch(0, [_record(0, b"k", os.urandom(700_000))])      # written on the writer thread
        with RawConn(c.bootstrap, timeout=30) as conn:
            assert _produce(conn, topic, small)["error_code"] == 0
            for streak in (1, 2):
                _fill(tmpfs)
                codes = [_produce(conn, topic, b)["error_code"] for b in (small, large) * 10]
                assert set(codes) == {KAFKA_STORAGE_ERROR}, codes
                wait_until(lambda: _lines(c, FAIL_LINE) >= streak, 10, "the error line")
                assert _lines(c, FAIL_LINE) == streak, f"{_lines(c, FAIL_LINE)} error lines after streak {streak}"
                assert _lines(c, OK_LINE) == streak - 1
                os.unlink(os.path.join(tmpfs, "ballast"))
                assert _produce(conn, topic, large)["error_code"] == 0
                assert _produce(conn, topic, small)["error_code"] == 0
                wait_until(lambda: _lines(c, OK_LINE) >= streak, 10, "the recovery line")
        print(f"full-disk: 2 streaks x 20 failed appends -> {_lines(c, FAIL_LINE)} error lines, "
              f"{_lines(c, OK_LINE)} recovery lines")
        assert _lines(c, FAIL_LINE) == 2 and _lines(c, OK_LINE) == 2
        # whatever the wording: no other error line about appends (the old storm was one per failure)
        append_errors = [ln for ln in c.brokers[0].log_tail(100000).splitlines()
                         if " ERROR " in ln and "append" in ln]
        assert len(append_errors) == 2, append_errors[:5]
