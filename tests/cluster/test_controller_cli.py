"""Operators' view of a replicated cluster: `kbroker cluster up --brokers 3` gives three brokers that
see each other (an RF=3 topic is created at once), `kbroker topics --describe` shows the real
Leader/Replicas/Isr, and its --under-replicated-partitions / --unavailable-partitions filters follow
a kill -9 of a broker (session timeout 6 s in `cluster up`'s configs)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from kbroker.cli import cluster
from kbroker.testing import wait_until


def kbroker(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "kbroker", *args], capture_output=True, text=True,
                          timeout=timeout)


def _partition_lines(text):
    """{partition: {"Leader": .., "Replicas": .., "Isr": ..}} of --describe's partition lines."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("\t"):
            continue
        fields = dict(f.split(": ", 1) for f in line.strip().split("\t"))
        out[int(fields["Partition"])] = fields
    return out


@pytest.mark.slow
def test_three_broker_cluster_up_describe_and_filters(tmp_path):
    root = tmp_path / "c3"
    try:
        up = kbroker("cluster", "up", "--brokers", "3", "--dir", str(root), "--port", "0", "--zk-port", "0")
        assert up.returncode == 0, up.stdout + up.stderr
        bootstrap = up.stdout.splitlines()[-1].split("=", 1)[1]
        ports = [int(hp.rsplit(":", 1)[1]) for hp in bootstrap.split(",")]
        for port in ports:           # every broker already knows all three (and the controller)
            brokers, controller = cluster.metadata_probe(port)
            assert brokers == {0, 1, 2} and controller in brokers

        created = kbroker("topics", "--bootstrap-server", bootstrap, "--create", "--topic", "rf3",
                          "--partitions", "3", "--replication-factor", "3")
        assert created.returncode == 0 and created.stdout.strip() == "Created topic rf3.", created.stdout
        desc = kbroker("topics", "--bootstrap-server", bootstrap, "--describe", "--topic", "rf3")
        assert desc.returncode == 0, desc.stdout + desc.stderr
        assert "PartitionCount: 3\tReplicationFactor: 3" in desc.stdout
        parts = _partition_lines(desc.stdout)
        assert sorted(parts) == [0, 1, 2]
        for f in parts.values():
            replicas = [int(r) for r in f["Replicas"].split(",")]
            assert sorted(replicas) == [0, 1, 2] and int(f["Leader"]) == replicas[0]
            assert sorted(int(r) for r in f["Isr"].split(",")) == [0, 1, 2]
        leaders = {int(f["Leader"]) for f in parts.values()}
        assert leaders == {0, 1, 2}

        def filtered(flag, port=None):
            r = kbroker("topics", "--bootstrap-server", bootstrap if port is None else f"127.0.0.1:{port}",
                        "--describe", "--topic", "rf3", flag)
            assert r.returncode == 0, r.stdout + r.stderr
            return _partition_lines(r.stdout), r.stdout

        assert filtered("--under-replicated-partitions") == ({}, "")
        assert filtered("--unavailable-partitions") == ({}, "")

        # kill -9 broker 2: once its session expires, the controller moves its leadership and
        # takes it out of every ISR -> all three partitions under-replicated, none unavailable.
        pid = int((root / "broker-2" / "broker.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()

        def under():
            got, _ = filtered("--under-replicated-partitions", ports[0])
            return len(got) == 3 and got

        got = wait_until(under, 40, "three under-replicated partitions")
        for f in got.values():
            assert f["Leader"] != "2" and "2" not in f["Isr"].split(",")
        assert filtered("--unavailable-partitions", ports[0])[0] == {}
        print(f"kill -9 -> describe shows the ISR without broker 2 after {time.monotonic() - t0:.1f}s")
    finally:
        if (root / "cluster.json").exists():
            kbroker("cluster", "down", "--dir", str(root))


@pytest.mark.slow
def test_cluster_up_with_a_three_node_zookeeper_ensemble(tmp_path):
    """`--zookeepers 3`: brokers connect to the whole ensemble; one ZooKeeper node killed goes
    unnoticed (an RF=3 topic is still created and written); `up` restarts just that node."""
    import confluent_kafka as ck

    from kbroker.zk import local

    root = tmp_path / "ens"
    try:
        up = kbroker("cluster", "up", "--brokers", "3", "--zookeepers", "3", "--dir", str(root),
                     "--port", "0", "--zk-port", "0")
        assert up.returncode == 0, up.stdout + up.stderr
        bootstrap = up.stdout.splitlines()[-1].split("=", 1)[1]
        nodes = [local.find_running(root / "zookeeper" / f"node-{i}") for i in (1, 2, 3)]
        assert all(nodes) and sorted(local.quorum_mode(n.port) for n in nodes) == ["follower", "follower", "leader"]
        config = (root / "broker-0" / "server.properties").read_text()
        assert "zookeeper.connect=" + ",".join(f"127.0.0.1:{n.port}" for n in nodes) + "\n" in config

        # The ZooKeeper leader dies: the ensemble elects another, the brokers notice nothing.
        leader = next(n for n in nodes if local.quorum_mode(n.port) == "leader")
        os.kill(leader.pid, signal.SIGKILL)
        created = kbroker("topics", "--bootstrap-server", bootstrap, "--create", "--topic", "rf3zk",
                          "--partitions", "2", "--replication-factor", "3")
        assert created.returncode == 0, created.stdout + created.stderr
        p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(20):
            p.produce("rf3zk", b"%d" % i)
        assert p.flush(30) == 0

        status = kbroker("cluster", "status", "--dir", str(root))
        zk_lines = [line for line in status.stdout.splitlines() if line.startswith("zookeeper")]
        assert status.returncode == 1 and sum(line.endswith("stopped") for line in zk_lines) == 1, status.stdout
        again = kbroker("cluster", "up", "--dir", str(root))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "ZooKeeper ensemble started" in again.stdout
        status = kbroker("cluster", "status", "--dir", str(root))
        assert status.returncode == 0, status.stdout
        assert sum("running" in line for line in status.stdout.splitlines() if line.startswith("zookeeper")) == 3
    finally:
        if (root / "cluster.json").exists():
            down = kbroker("cluster", "down", "--dir", str(root))
            assert down.returncode == 0, down.stdout + down.stderr
