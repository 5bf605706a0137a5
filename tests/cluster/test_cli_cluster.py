"""`kbroker cluster up/down/status` against a real ZooKeeper and real broker processes.

Every test that creates a cluster runs `cluster down` in a finally block, so no process outlives it.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbroker.cli import cluster
from kbroker.localcluster import pid_alive
from kbroker.ports import free_ports
from kbroker.zk import local


def kbroker(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "kbroker", *args], capture_output=True, text=True,
                          timeout=timeout)


def down(root: Path):
    result = kbroker("cluster", "down", "--dir", str(root))
    assert result.returncode == 0, result.stderr
    return result


def broker_pid(root: Path, broker_id: int) -> int:
    return int((root / f"broker-{broker_id}" / "broker.pid").read_text())


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.05)


def test_zookeeper_start_reattach_and_stop(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    zk, started = cluster.ensure_zookeeper(root / "zookeeper", 0)
    try:
        assert started and zk.is_running()
        again, started_again = cluster.ensure_zookeeper(root / "zookeeper", zk.port)
        assert not started_again and again.pid == zk.pid
        with pytest.raises(cluster.ClusterError, match="runs on port"):
            cluster.ensure_zookeeper(root / "zookeeper", zk.port + 1)

        # A layout whose brokers were never started: status shows them stopped, ZooKeeper running.
        cluster.Layout(root, zk.port, [cluster.BrokerSlot(0, 19092), cluster.BrokerSlot(1, 19093)]).save()
        status = kbroker("cluster", "status", "--dir", str(root))
        assert status.returncode == 1, status.stdout + status.stderr
        lines = status.stdout.splitlines()
        assert lines[0].split() == ["BROKER", "PORT", "PID", "STATE"]
        assert lines[1].split() == ["0", "19092", "-", "stopped"]
        assert lines[2].split() == ["1", "19093", "-", "stopped"]
        assert lines[3] == f"zookeeper 127.0.0.1:{zk.port} pid {zk.pid} running"

        result = down(root)
        assert f"ZooKeeper stopped (pid {zk.pid})" in result.stdout
        wait_gone(zk.pid)
        assert local.find_running(root / "zookeeper") is None
        status = kbroker("cluster", "status", "--dir", str(root))
        assert status.returncode == 1
        assert status.stdout.splitlines()[-1] == f"zookeeper 127.0.0.1:{zk.port} stopped"
    finally:
        zk.stop()


def test_status_and_down_without_a_cluster(tmp_path):
    for action in ("status", "down"):
        result = kbroker("cluster", action, "--dir", str(tmp_path))
        assert result.returncode == 1
        assert "cluster.json not found" in result.stderr


def test_up_refuses_an_invalid_broker_config_naming_file_and_key(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    cluster.Layout(root, 0, [cluster.BrokerSlot(0, 0)]).save()
    (root / "broker-0").mkdir()
    cfg = root / "broker-0" / "server.properties"
    cfg.write_text("zookeeper.connect=127.0.0.1:1\nnum.partitions=many\n")
    try:
        result = kbroker("cluster", "up", "--dir", str(root))
        assert result.returncode == 1
        assert str(cfg) in result.stderr and "num.partitions" in result.stderr
        assert not (root / "broker-0" / "broker.pid").exists()
    finally:
        down(root)


def test_up_reports_a_broker_that_dies_with_its_log(tmp_path):
    # The broker's config listens on a port this test holds, so the broker cannot start.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy_port = taken.getsockname()[1]
        root = tmp_path / "c"
        root.mkdir()
        (root / "broker-0").mkdir()
        free_port = free_ports(1)[0]
        layout = cluster.Layout(root, 0, [cluster.BrokerSlot(0, free_port)])
        layout.save()
        try:
            # Start ZooKeeper through `up` itself, then point the broker at the busy port.
            zk, _ = cluster.ensure_zookeeper(root / "zookeeper", 0)
            layout.zk_port = zk.port
            layout.save()
            text = cluster.broker_properties(layout, layout.brokers[0]).replace(
                f"127.0.0.1:{free_port}", f"127.0.0.1:{busy_port}")
            (root / "broker-0" / "server.properties").write_text(text)
            result = kbroker("cluster", "up", "--dir", str(root), "--timeout", "60")
            assert result.returncode == 1, result.stdout
            assert "broker 0" in result.stderr and "exited with status" in result.stderr
            assert "broker.log ends with" in result.stderr
            assert "bootstrap.servers" not in result.stdout
        finally:
            down(root)


def test_cluster_up_status_restart_and_down(tmp_path):
    """Needs the broker: two brokers on free ports, registered and answering ApiVersions."""
    root = tmp_path / "c"
    try:
        result = kbroker("cluster", "up", "--brokers", "2", "--dir", str(root), "--port", "0", "--zk-port", "0")
        assert result.returncode == 0, result.stdout + result.stderr
        layout = json.loads((root / "cluster.json").read_text())
        ports = [b["port"] for b in layout["brokers"]]
        assert [b["id"] for b in layout["brokers"]] == [0, 1]
        assert 0 not in ports and layout["zookeeper"]["port"] != 0
        assert result.stdout.splitlines()[-1] == f"bootstrap.servers=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
        for port in ports:
            assert cluster.api_versions_probe(port) is None
        config = (root / "broker-1" / "server.properties").read_text()
        assert "broker.id=1\n" in config and f"listeners=PLAINTEXT://127.0.0.1:{ports[1]}\n" in config
        assert "offsets.topic.replication.factor=2\n" in config
        assert "default.replication.factor=2\n" in config and "min.insync.replicas=1\n" in config

        status = kbroker("cluster", "status", "--dir", str(root))
        assert status.returncode == 0, status.stdout
        rows = [line.split() for line in status.stdout.splitlines()[1:3]]
        assert rows == [["0", str(ports[0]), str(broker_pid(root, 0)), "registered"],
                        ["1", str(ports[1]), str(broker_pid(root, 1)), "registered"]]

        # Kill broker 1 hard; `up` again restarts only it, on the same port, keeping broker 0.
        pid0, pid1 = broker_pid(root, 0), broker_pid(root, 1)
        os.kill(pid1, signal.SIGKILL)
        wait_gone(pid1)
        again = kbroker("cluster", "up", "--dir", str(root))
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"broker 0 already running: pid {pid0}" in again.stdout
        assert again.stdout.splitlines()[-1] == result.stdout.splitlines()[-1]
        assert broker_pid(root, 0) == pid0 and broker_pid(root, 1) != pid1
        assert cluster.api_versions_probe(ports[1]) is None

        pids = [broker_pid(root, 0), broker_pid(root, 1)]
        zk_pid = local.find_running(root / "zookeeper").pid
        stopped = down(root)
        assert "broker 0 stopped" in stopped.stdout and "broker 1 stopped" in stopped.stdout
        for pid in pids + [zk_pid]:
            wait_gone(pid)
        status = kbroker("cluster", "status", "--dir", str(root))
        assert status.returncode == 1
        assert [line.split()[-1] for line in status.stdout.splitlines()[1:3]] == ["stopped", "stopped"]
    finally:
        if (root / "cluster.json").exists():
            down(root)


def test_down_escalates_to_sigkill_and_spares_foreign_pids(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    layout = cluster.Layout(root, 0, [cluster.BrokerSlot(0, 0), cluster.BrokerSlot(1, 0)])
    layout.save()
    for slot in layout.brokers:
        layout.broker_dir(slot.id).mkdir()
    # Broker 0's pid file names a process started with broker 0's command line that ignores SIGTERM.
    ignores_term = "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); sys.stdin.read()"
    stubborn = subprocess.Popen([sys.executable, "-c", ignores_term, "kbroker", "serve", "--config",
                                 str(layout.config_path(0))], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    # Broker 1's pid file names an unrelated process (a recycled pid): it must survive.
    foreign = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert stubborn.stdout.readline() == b"up\n"  # SIGTERM handler installed
        layout.pid_path(0).write_text(f"{stubborn.pid}\n")
        layout.pid_path(1).write_text(f"{foreign.pid}\n")
        result = kbroker("cluster", "down", "--dir", str(root), "--timeout", "1")
        assert result.returncode == 0, result.stderr
        assert f"broker 0 killed after 1s (pid {stubborn.pid})" in result.stdout
        assert "broker 1 not running" in result.stdout
        assert stubborn.wait(10) == -signal.SIGKILL
        assert foreign.poll() is None
        assert not layout.pid_path(0).exists() and not layout.pid_path(1).exists()
    finally:
        for proc in (stubborn, foreign):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
