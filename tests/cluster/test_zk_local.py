"""kbroker.zk.local against Debian's real ZooKeeper: start, readiness, re-attach, stop."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest
from kazoo.client import KazooClient

from kbroker.zk import local
from kbroker.zk.local import (ZooKeeperNotInstalled, ZooKeeperStartError, find_running, four_letter_word,
                              start_zookeeper)


def _connectable(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_start_port0_ready_find_running_stop(tmp_path):
    proc = start_zookeeper(tmp_path, port=0, tick_time_ms=1000)
    try:
        assert proc.port > 0 and proc.connect_string == f"127.0.0.1:{proc.port}"
        assert proc.is_running()
        assert "Mode: standalone" in four_letter_word(proc.port, "srvr")
        conf = four_letter_word(proc.port, "conf")
        assert f"dataDir={tmp_path.resolve()}/version-2" in conf and "tickTime=1000" in conf
        cfg = (tmp_path / "zoo.cfg").read_text()
        for line in ("clientPortAddress=127.0.0.1", "admin.enableServer=false", "maxClientCnxns=0",
                     "4lw.commands.whitelist=ruok,srvr,stat,mntr,conf", f"clientPort={proc.port}"):
            assert line in cfg.splitlines()
        assert int((tmp_path / "zookeeper.pid").read_text()) == proc.pid

        found = find_running(tmp_path)
        assert found is not None and (found.pid, found.port, found.tick_time_ms) == (proc.pid, proc.port, 1000)
        assert found.is_running()

        # A second server on the same data dir would corrupt it.
        with pytest.raises(ZooKeeperStartError, match="already runs"):
            start_zookeeper(tmp_path)
    finally:
        proc.stop()
    assert not proc.is_running()
    assert not (tmp_path / "zookeeper.pid").exists()
    assert find_running(tmp_path) is None
    assert not _connectable(proc.port)
    proc.stop()  # idempotent


def test_reattach_and_stop_from_another_process(tmp_path):
    # The starting process exits (like `kbroker cluster up`); a later one stops it (`cluster down`).
    script = textwrap.dedent(f"""
        from kbroker.zk.local import start_zookeeper
        p = start_zookeeper({str(tmp_path)!r})
        print(p.pid, p.port)
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         timeout=60).stdout
    pid, port = map(int, out.split())
    found = find_running(tmp_path)
    try:
        assert found is not None and (found.pid, found.port) == (pid, port)
        assert "Mode: standalone" in four_letter_word(port, "srvr")
    finally:
        if found is not None:
            found.stop()
    assert not found.is_running()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert find_running(tmp_path) is None


def test_stale_pid_file_is_ignored(tmp_path):
    (tmp_path / "zookeeper.pid").write_text(f"{os.getpid()}\n")  # alive, but not a ZooKeeper
    (tmp_path / "zoo.cfg").write_text("clientPort=1\n")
    assert find_running(tmp_path) is None


def test_data_survives_restart(tmp_path):
    proc = start_zookeeper(tmp_path, tick_time_ms=1000)
    try:
        zk = KazooClient(proc.connect_string)
        zk.start(timeout=10)
        zk.create("/durable", b"kept")
        zk.stop(), zk.close()
    finally:
        proc.stop()
    proc = start_zookeeper(tmp_path, tick_time_ms=1000)
    try:
        zk = KazooClient(proc.connect_string)
        zk.start(timeout=10)
        assert zk.get("/durable")[0] == b"kept"
        zk.stop(), zk.close()
    finally:
        proc.stop()


def test_explicit_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ZooKeeperStartError, match="already in use"):
            start_zookeeper(tmp_path, port=busy.getsockname()[1])
    assert find_running(tmp_path) is None


def test_failed_start_reports_log_tail(tmp_path):
    with pytest.raises(ZooKeeperStartError) as info:
        start_zookeeper(tmp_path, tick_time_ms=0)  # ZooKeeper rejects the config and exits
    assert "tickTime is not set" in str(info.value)
    assert not (tmp_path / "zookeeper.pid").exists()


def test_missing_jar_or_java(tmp_path, monkeypatch):
    with pytest.raises(ZooKeeperNotInstalled, match="install Debian's zookeeper package"):
        start_zookeeper(tmp_path, zookeeper_jar=str(tmp_path / "nope.jar"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ZooKeeperNotInstalled, match="java not found"):
        start_zookeeper(tmp_path)
    assert not (tmp_path / "zookeeper.pid").exists()


def test_session_fixture(zk_server):
    assert zk_server.is_running()
    assert "Mode: standalone" in four_letter_word(zk_server.port, "srvr")
    assert local.find_running(zk_server.data_dir).pid == zk_server.pid
