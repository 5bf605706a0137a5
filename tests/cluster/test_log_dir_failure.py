"""Log dirs as Kafka's JBOD, on real brokers and real file systems:

- A log dir that fails under acks=all load (made unusable: mode 000 on it, with the broker running without
  CAP_DAC_OVERRIDE so the mode binds it as it binds any user) goes offline on its broker: the broker tells
  the controller (/log_dir_event_notification), leadership of its partitions moves to another in-sync
  replica within the session timeout, the broker keeps serving its other dir, DescribeLogDirs reports the
  dir KAFKA_STORAGE_ERROR, and the history checker finds acked-but-lost 0 and duplicates 0.
- Every dir failed: the broker stops with exit code 1, as Kafka.
- A broker killed -9 on a 100% full disk starts again: it serves reads and deletions and refuses appends
  with KAFKA_STORAGE_ERROR until space returns, then takes them again."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import History, RawConn, read_all_confluent
from kbroker.protocol.errors import Errors
from kbroker.testing import LocalCluster, wait_until
from test_replication import TOPIC, LoadProducer, state, wait_acks_grow

DESCRIBE_LOG_DIRS = 35
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
SESSION_MS = 6000


def _can_drop_dac() -> bool:
    probe = tempfile.mkdtemp()
    try:
        os.chmod(probe, 0)
        r = subprocess.run([*NO_DAC, "sh", "-c", f"ls {probe}"], capture_output=True)
        return r.returncode != 0
    except FileNotFoundError:
        return False
    finally:
        os.chmod(probe, 0o755)
        os.rmdir(probe)


pytestmark = pytest.mark.skipif(not _can_drop_dac(), reason="needs setpriv and root to drop CAP_DAC_OVERRIDE")


def describe_log_dirs(port) -> dict:
    with RawConn(f"127.0.0.1:{port}") as c:
        resp = c.request(DESCRIBE_LOG_DIRS, 1, {"topics": None})
    return {r["log_dir"]: r for r in resp["results"]}


def dir_holding(data_dirs, tp) -> str:
    [d] = [d for d in data_dirs if os.path.isdir(os.path.join(d, f"{tp[0]}-{tp[1]}"))]
    return d


def produce_one(bootstrap, topic, value) -> KafkaError | None:
    out = []
    # no retries: a refusal is the answer itself (KAFKA_STORAGE_ERROR is retriable)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 15000, "retries": 0})
    p.produce(topic, value, partition=0, on_delivery=lambda err, msg: out.append(err))
    p.flush(30)
    return out[0]


def read_values(bootstrap, topic, n, timeout=30.0) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rd-{time.monotonic_ns()}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append(m.value())
    finally:
        c.close()
    return out


def test_a_failed_log_dir_goes_offline_and_its_leaders_move(tmp_path):
    root = tmp_path / "c"
    c = LocalCluster(root, brokers=3, session_timeout_ms=SESSION_MS, overrides={
        "replica.lag.time.max.ms": 3000, "log.flush.offset.checkpoint.interval.ms": 500})
    victim = c.brokers[2]
    dirs = [str(victim.data_dir / "a"), str(victim.data_dir / "b")]
    victim.extra = {"log.dirs": ",".join(dirs)}
    victim.command_prefix = NO_DAC
    failed = None
    with c:
        try:
            admin = AdminClient({"bootstrap.servers": c.bootstrap})
            admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[2, 0, 1]],
                                          config={"min.insync.replicas": "2"})])[TOPIC].result(30)
            admin.create_topics([NewTopic("other", 1, replica_assignment=[[2]])])["other"].result(30)
            wait_until(lambda: state(c)[0] == 2 and len(state(c)[2]) == 3, 30, "broker 2 leading, ISR of 3")
            failed = dir_holding(dirs, (TOPIC, 0))
            wait_until(lambda: produce_one(c.bootstrap, "other", b"before") is None, 30, "topic other to take writes")
            healthy = dir_holding(dirs, ("other", 0))
            assert failed != healthy
            hist = History()
            load = LoadProducer(c.bootstrap, hist, rate=500, **{
                "enable.idempotence": True, "acks": "all", "request.timeout.ms": 5000,
                "socket.timeout.ms": 5000}).start()
            try:
                wait_acks_grow(load, 500, timeout=60)
                os.chmod(failed, 0)
                cut_at = time.monotonic()
                moved = wait_until(lambda: (lambda s: s if s[0] not in (2, -1) else None)(state(c)), 30,
                                   "leadership to move off broker 2")
                moved_after = time.monotonic() - cut_at
                wait_acks_grow(load, 500, timeout=60)
            finally:
                load.finish()
            log_text = victim.log_path.read_text(errors="replace")
            assert f"log dir {failed} failed" in log_text
            assert moved_after < SESSION_MS / 1000, moved_after
            assert 2 not in moved[2]                       # the offline replica left the ISR
            # The broker keeps serving its other dir, and is still registered.
            assert victim.running() and c.registration_czxid(2) is not None
            assert produce_one(c.bootstrap, "other", b"after") is None
            assert read_values(c.bootstrap, "other", 2) == [b"before", b"after"]
            res = describe_log_dirs(victim.port)
            assert res[failed]["error_code"] == Errors.KAFKA_STORAGE_ERROR and res[failed]["topics"] == []
            assert res[healthy]["error_code"] == 0
            # the healthy dir reports its partitions (internal topics may live there too), the failed one's not
            names = [t["name"] for t in res[healthy]["topics"]]
            assert "other" in names and TOPIC not in names, names
            read_all_confluent(c.bootstrap, TOPIC, 1, hist)
            report = hist.check()
            print(report.line(), f"; leadership moved {moved_after:.1f}s after the dir failed")
            assert report.acked > 1000
            assert report.acked_lost == 0, report.line()
            assert report.duplicates == 0, report.line()
            assert report.inconsistent_offsets == 0, report.line()
        finally:
            if failed is not None:
                os.chmod(failed, 0o755)


def test_every_log_dir_failed_stops_the_broker(tmp_path):
    c = LocalCluster(tmp_path / "c", brokers=1, overrides={"log.flush.offset.checkpoint.interval.ms": 500})
    b = c.brokers[0]
    b.command_prefix = NO_DAC
    with c:
        try:
            os.chmod(b.data_dir, 0)
            assert b.proc.wait(timeout=30) == 1
        finally:
            os.chmod(b.data_dir, 0o755)
    assert "every log dir failed" in b.log_path.read_text(errors="replace")


@pytest.fixture
def tmpfs():
    path = tempfile.mkdtemp(prefix="kbroker-fulldisk-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


def fill(path) -> None:
    """A ballast file grown until the file system refuses one more byte."""
    fd = os.open(os.path.join(path, "ballast"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (256 << 10, 4096, 1):
            try:
                while os.write(fd, b"\0" * chunk):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


def test_a_broker_killed_on_a_full_disk_starts_again(tmp_path, tmpfs):
    c = LocalCluster(tmp_path / "c", brokers=1)
    b = c.brokers[0]
    b.extra = {"log.dirs": os.path.join(tmpfs, "logs")}
    with c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        for t in ("keep", "doomed"):
            admin.create_topics([NewTopic(t, 1, 1)])[t].result(30)
        for i in range(20):
            assert produce_one(c.bootstrap, "keep", b"r%d" % i) is None
        fill(tmpfs)
        big = b"x" * (64 << 10)          # more than the page the segment's tail may still have free
        assert produce_one(c.bootstrap, "keep", big).code() == KafkaError.KAFKA_STORAGE_ERROR
        c.kill(0)
        assert os.statvfs(tmpfs).f_bavail == 0
        c.start_broker(0)                                    # the disk is still full
        assert read_values(c.bootstrap, "keep", 20) == [b"r%d" % i for i in range(20)]
        assert produce_one(c.bootstrap, "keep", big).code() == KafkaError.KAFKA_STORAGE_ERROR
        admin.delete_topics(["doomed"])["doomed"].result(30)
        wait_until(lambda: not os.path.exists(os.path.join(tmpfs, "logs", "doomed-0")), 30, "doomed-0 removed")
        os.unlink(os.path.join(tmpfs, "ballast"))
        wait_until(lambda: produce_one(c.bootstrap, "keep", b"again") is None, 30, "appends to work again")
        assert read_values(c.bootstrap, "keep", 21)[-1] == b"again"
