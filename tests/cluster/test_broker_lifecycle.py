"""Broker process lifecycle against real ZooKeeper: the registration znode (format, expiry after
kill -9, re-registration after a forced session expiry), log-dir guards (.lock, cluster id),
starting from Kafka's sample server.properties, surviving descriptor exhaustion, and clean
shutdown (marker written, no recovery scan at the next start, data intact).
"""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kbroker.procutil import die_with_parent
from kbroker.testing import LocalCluster, api_versions_ok, free_port
from kbroker.zk.local import start_zookeeper
import paths
from test_broker_fetch import (LATEST, NONE, Raw, create_topic, list_offset, produce, read_all, unique,
                               wait_for)

from kbroker._native import batch as native_batch


def kazoo(connect: str):
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=connect, timeout=10)
    zk.start(timeout=10)
    return zk


def zk_conf(zk_proc) -> dict:
    """The server's `conf` four-letter answer (session timeout bounds, tick)."""
    with socket.create_connection(("127.0.0.1", zk_proc.port), timeout=5) as s:
        s.sendall(b"conf")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)


def negotiated_timeout_s(cluster) -> tuple[float, float]:
    """(session timeout ZooKeeper grants the broker, tick) in seconds: the requested
    zookeeper.session.timeout.ms clamped to the server's [minSessionTimeout, maxSessionTimeout]."""
    conf = zk_conf(cluster.zk)
    lo, hi = int(conf["minSessionTimeout"]), int(conf["maxSessionTimeout"])
    return min(max(cluster.session_timeout_ms, lo), hi) / 1000, int(conf["tickTime"]) / 1000


def roundtrip(bootstrap: str, n: int = 10) -> None:
    """Produce n records with confluent-kafka and read them back by assignment."""
    import confluent_kafka as ck

    topic = unique("rt")
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 30000})
    for i in range(n):
        p.produce(topic, value=b"rt-%d" % i, partition=0)
    assert p.flush(30) == 0
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "enable.auto.commit": False,
                     "log_level": 0})
    try:
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                got.append((m.offset(), m.value()))
        assert got == [(i, b"rt-%d" % i) for i in range(n)]
    finally:
        c.close()


# ---- /brokers/ids/<id> ----------------------------------------------------------------------------------

def test_registration_znode_is_kafkas_json(kafka_cluster):
    """Invariant: while the broker runs, /brokers/ids/<id> is an ephemeral znode holding Kafka's v5
    registration JSON for the listener clients use."""
    b = kafka_cluster.brokers[0]
    zk = kazoo(kafka_cluster.zk.connect_string)
    try:
        data, stat = zk.get("/brokers/ids/0")
    finally:
        zk.stop()
        zk.close()
    assert stat.ephemeralOwner != 0
    reg = json.loads(data)
    assert reg["version"] == 5
    assert (reg["host"], reg["port"]) == ("127.0.0.1", b.port)
    assert reg["endpoints"] == [f"PLAINTEXT://127.0.0.1:{b.port}"]
    assert reg["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"}
    assert reg["jmx_port"] == -1
    assert isinstance(reg["timestamp"], str) and abs(int(reg["timestamp"]) - time.time() * 1000) < 86_400_000
    assert reg["features"] == {}
    assert "rack" not in reg or reg["rack"] is None


def test_registration_disappears_after_kill9_within_session_timeout(tmp_path):
    """Invariant: after kill -9 the registration is removed by ZooKeeper's session expiry: not before
    about the session timeout, and within the negotiated timeout plus one tick."""
    with LocalCluster(tmp_path, session_timeout_ms=4000) as c:
        timeout_s, tick_s = negotiated_timeout_s(c)
        assert c.registration_czxid(0) is not None
        zk = kazoo(c.zk.connect_string)
        try:
            os.kill(c.brokers[0].pid, signal.SIGKILL)
            killed = time.monotonic()
            c.brokers[0].proc.wait(timeout=10)
            wait_for(lambda: zk.exists("/brokers/ids/0") is None, timeout_s + tick_s + 5,
                     "the registration to expire", interval=0.02)
            gone_after = time.monotonic() - killed
        finally:
            zk.stop()
            zk.close()
        assert timeout_s / 2 <= gone_after <= timeout_s + tick_s + 0.3, (
            f"registration gone {gone_after:.2f}s after kill -9 (session {timeout_s}s, tick {tick_s}s)")


def test_forced_session_expiry_reregisters_and_serves(tmp_path):
    """Invariant: when the broker's ZooKeeper session expires under it (SIGSTOP for longer than the
    session timeout, then SIGCONT), it re-registers with a new session (new czxid = new broker epoch,
    new ephemeralOwner) and keeps serving: produce and consume work."""
    with LocalCluster(tmp_path, session_timeout_ms=4000) as c:
        timeout_s, tick_s = negotiated_timeout_s(c)
        b = c.brokers[0]
        roundtrip(c.bootstrap)
        zk = kazoo(c.zk.connect_string)
        try:
            before = zk.exists("/brokers/ids/0")
            os.kill(b.pid, signal.SIGSTOP)
            try:
                wait_for(lambda: zk.exists("/brokers/ids/0") is None, timeout_s + tick_s + 5,
                         "the paused broker's session to expire", interval=0.05)
            finally:
                os.kill(b.pid, signal.SIGCONT)
            after = wait_for(lambda: zk.exists("/brokers/ids/0"), 30, "the broker to re-register")
            data, _ = zk.get("/brokers/ids/0")
        finally:
            zk.stop()
            zk.close()
        assert after.czxid > before.czxid
        assert after.ephemeralOwner not in (0, before.ephemeralOwner)
        assert json.loads(data)["port"] == b.port
        assert b.running()
        roundtrip(c.bootstrap)
        assert "re-registered" in b.log_path.read_text(errors="replace")


# ---- log-dir guards --------------------------------------------------------------------------------------

def serve(config: Path, *overrides: str, timeout: float = 60) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "kbroker", "serve", "--config", str(config)]
    for o in overrides:
        args += ["--override", o]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def test_second_broker_on_same_log_dir_is_refused(tmp_path):
    """Invariant: a second broker process on a log dir in use exits non-zero naming the .lock, and the
    first broker keeps its registration and keeps serving."""
    with LocalCluster(tmp_path) as c:
        b = c.brokers[0]
        czxid = c.registration_czxid(0)
        r = serve(b.config_path, f"listeners=PLAINTEXT://127.0.0.1:{free_port()}")
        out = r.stdout + r.stderr
        assert r.returncode != 0
        assert ".lock" in out and "locked by another broker" in out, out[-2000:]
        assert str(b.data_dir) in out
        assert c.registration_czxid(0) == czxid and b.running() and api_versions_ok(b.port)
        roundtrip(c.bootstrap, 3)


def test_cluster_id_mismatch_is_refused(tmp_path):
    """Invariant: a broker whose meta.properties names another cluster than ZooKeeper's /cluster/id
    exits non-zero with a message naming both ids, and does not touch its log dir's meta.properties."""
    with LocalCluster(tmp_path / "cluster") as c:
        b = c.brokers[0]
        c.stop_broker(0)
        meta = (b.data_dir / "meta.properties").read_text()
        ours = re.search(r"^cluster\.id=(.+)$", meta, re.M).group(1).strip()
        fresh = start_zookeeper(tmp_path / "fresh-zk", port=0, tick_time_ms=1000)
        try:
            r = serve(b.config_path, f"zookeeper.connect={fresh.connect_string}")
            zk = kazoo(fresh.connect_string)
            try:
                theirs = json.loads(zk.get("/cluster/id")[0])["id"]
                assert zk.exists("/brokers/ids/0") is None, "registered despite the mismatch"
            finally:
                zk.stop()
                zk.close()
        finally:
            fresh.stop()
        out = r.stdout + r.stderr
        assert r.returncode != 0
        assert theirs != ours
        assert ours in out and theirs in out, out[-2000:]
        assert (b.data_dir / "meta.properties").read_text() == meta


# ---- Kafka's sample server.properties ---------------------------------------------------------------------

# Kafka 3.9's sample config/server.properties (active keys and values; commented ones as shipped).
KAFKA_39_SERVER_PROPERTIES = (paths.DATA / "kafka39_server.properties").read_text()


def test_kafka_sample_server_properties_starts_and_serves(tmp_path, zk_server):
    """Invariant: Kafka 3.9's sample server.properties, with only zookeeper.connect, log.dirs and
    listeners overridden, starts a broker that warns about the keys it does not implement (and only
    those), answers clients, and exits 0 on SIGTERM."""
    sample = tmp_path / "server.properties"
    sample.write_text(KAFKA_39_SERVER_PROPERTIES)
    port = free_port()
    out_path = tmp_path / "broker.out"
    chroot = f"/sample-{uuid.uuid4().hex[:8]}"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbroker", "serve", "--config", str(sample),
             "--override", f"zookeeper.connect={zk_server.connect_string}{chroot}",
             "--override", f"log.dirs={tmp_path / 'logs'}",
             "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent())
    try:
        def up():
            if proc.poll() is not None:
                raise AssertionError(f"broker exited {proc.returncode}:\n{out_path.read_text()[-3000:]}")
            return api_versions_ok(port) and "started" in out_path.read_text(errors="replace")
        wait_for(up, 60, "the sample-config broker to answer")
        roundtrip(f"127.0.0.1:{port}", 5)
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = out_path.read_text(errors="replace")
    warned = [line for line in text.splitlines() if "no effect in kbroker" in line]
    # The sample's thread counts: one event loop does that work, so kbroker reads none of them.
    keys = ["num.network.threads", "num.io.threads", "num.recovery.threads.per.data.dir"]
    assert [next(k for k in keys if k in line) for line in warned] == keys, warned
    assert all("WARN" in line for line in warned), warned
    assert (tmp_path / "logs" / "meta.properties").exists()


# ---- descriptor exhaustion -------------------------------------------------------------------------------------

def test_accept_loop_survives_fd_exhaustion(tmp_path):
    """Invariant: when the broker runs out of file descriptors, connections wait in the backlog
    (unanswered) but the accept loop does not die: once descriptors are free again, a waiting
    connection is answered and new clients connect and work."""
    with LocalCluster(tmp_path) as c:
        b = c.brokers[0]
        roundtrip(c.bootstrap, 2)
        fd_dir = Path(f"/proc/{b.pid}/fd")
        in_use = len(os.listdir(fd_dir))
        limit = in_use + 12
        resource.prlimit(b.pid, resource.RLIMIT_NOFILE, (limit, limit))
        socks = []
        try:
            for _ in range(40):
                socks.append(socket.create_connection(("127.0.0.1", b.port), timeout=5))
            wait_for(lambda: len(os.listdir(fd_dir)) >= limit - 1, 10, "the broker to use up its descriptors")
            # This connection is queued behind the ones the broker could not accept: no answer.
            probe = socket.create_connection(("127.0.0.1", b.port), timeout=5)
            probe.sendall(struct_api_versions(7))
            probe.settimeout(1.5)
            with pytest.raises(socket.timeout):
                probe.recv(1)
            assert b.running()
        finally:
            for s in socks:
                s.close()
        # Descriptors come back as the broker sees the closes; the accept loop resumes by itself.
        probe.settimeout(20)
        head = probe.recv(8)
        probe.close()
        assert len(head) == 8 and head[4:8] == (7).to_bytes(4, "big"), head
        wait_for(lambda: api_versions_ok(b.port), 20, "a new connection to be answered")
        roundtrip(c.bootstrap, 3)
        assert b.running()
        # asyncio reports EMFILE once per backlog slot per retry; the broker reports it once per episode
        # (unfiltered this was thousands of tracebacks within seconds). Episodes: under load the closes
        # arrive over several accept retries, and each accept that works in between ends one, so there
        # are at most as many as connections came in (4, 13 and 30 reports seen): the bound is that.
        reports = b.log_path.read_text(errors="replace").count("Too many open files")
        assert 1 <= reports <= len(socks) + 1, f"{reports} EMFILE reports in the broker log"


def struct_api_versions(correlation_id: int) -> bytes:
    """A raw ApiVersions v0 request."""
    body = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + correlation_id.to_bytes(4, "big") + (0).to_bytes(2, "big")
    return len(body).to_bytes(4, "big") + body


# ---- clean shutdown ----------------------------------------------------------------------------------------------

def _flip_last_record_value(segment: Path, marker: bytes) -> None:
    """Change one byte of ``marker`` inside the last batch of the segment (CRC-covered bytes)."""
    data = segment.read_bytes()
    last = native_batch.iter_batches(data)[-1]
    pos = data.index(marker, last.position, last.position + last.size)
    with open(segment, "r+b") as f:
        f.seek(pos)
        f.write(b"V")


def test_clean_shutdown_marker_and_no_recovery_scan(tmp_path):
    """Invariants: SIGTERM exits 0 and leaves the clean-shutdown marker; the next start consumes it and
    serves every record unchanged; a clean start does not CRC-scan the log (a batch whose bytes were
    altered while the broker was down is still there), whereas a start after kill -9 does (the
    altered batch is truncated away) - which shows the probe can tell the two apart."""
    n = 20
    with LocalCluster(tmp_path, session_timeout_ms=4000) as c:
        b = c.brokers[0]
        topic = create_topic(c.bootstrap, "durable")
        expected = []
        now = int(time.time() * 1000)
        with Raw(c.bootstrap) as raw:
            for i in range(n):
                value = b"value-%02d" % i
                assert produce(raw, topic, 0, [(now + i, b"k", value)])["base_offset"] == i
                expected.append((i, now + i, b"k", value))
        marker = b.data_dir / ".kafka_cleanshutdown"
        segment = max((b.data_dir / f"{topic}-0").glob("*.log"))      # the active (last) segment

        c.stop_broker(0)
        assert b.proc.returncode == 0
        assert marker.exists(), "SIGTERM shutdown left no clean-shutdown marker"
        assert "shut down completed" in b.log_tail(20)
        c.start_broker(0)
        assert not marker.exists(), "the marker must be consumed at startup (a later crash is unclean)"
        with Raw(c.bootstrap) as raw:
            assert read_all(raw, topic, 0) == expected

        # Clean restart over an altered last batch: no scan, so the batch stays.
        c.stop_broker(0)
        assert marker.exists()
        _flip_last_record_value(segment, b"value-%02d" % (n - 1))
        c.start_broker(0)
        with Raw(c.bootstrap) as raw:
            assert list_offset(raw, topic, 0, LATEST)["offset"] == n, "a clean start truncated the log (it scanned)"

        # Unclean restart over the same bytes: the scan finds the bad CRC and truncates there.
        c.kill(0)
        assert not marker.exists()
        c.start_broker(0)
        with Raw(c.bootstrap) as raw:
            assert list_offset(raw, topic, 0, LATEST)["offset"] == n - 1
            assert read_all(raw, topic, 0) == expected[:-1]
            assert produce(raw, topic, 0, [(None, None, b"after")])["error_code"] == NONE
