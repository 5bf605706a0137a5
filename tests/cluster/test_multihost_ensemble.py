"""Five "hosts" as network namespaces joined by a bridge (kbroker.perf.replication_bench's NetnsNet): a
3-node ZooKeeper ensemble with one server on each of hosts 0-2, and two broker hosts (3 and 4) with two
brokers each. Every broker advertises its host's address (not loopback) and has broker.rack = its host;
the clients stay in the root namespace and reach everything over the bridge.

Invariants, each counted:
- placement: no partition of a topic created without an assignment has two replicas on one host
  (rack-aware assignment at CreateTopics, as Kafka's);
- a whole broker host cut off the network (its veth down: both its brokers lose their ZooKeeper sessions
  and their peers) under an idempotent acks=all producer: every partition led there is led from the other
  host within the session timeout plus the controller's work, ZooKeeper keeps its quorum (its hosts are
  not cut), and once the host is back and its replicas rejoin the ISR the history checker finds
  acked-but-lost 0, duplicates 0 and no inconsistent offset."""
from __future__ import annotations

import contextlib
import subprocess
import threading
import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import History, read_all_confluent
from kbroker.perf.replication_bench import NetnsCluster, NetnsNet, in_netns
from kbroker.testing import wait_until
from kbroker.zk.local import CONFIG_FILE, MYID_FILE, quorum_mode, start_nodes
from test_multihost_netns import _can_make_namespaces
from test_replication import TOPIC, LoadProducer, wait_acks_grow

ZK_HOSTS = (0, 1, 2)
BROKER_HOST = {0: 3, 1: 3, 2: 4, 3: 4}     # broker id -> the host (namespace index) it runs on
ZK_PORT = 2181
SESSION_MS = 6000
PARTITIONS = 4

pytestmark = pytest.mark.skipif(not _can_make_namespaces(),
                                reason="this machine cannot create network namespaces (needs root and ip netns)")


class NetnsEnsemble:
    """One ZooKeeper server in each of ``hosts``' namespaces, peers on the namespaces' addresses. Each
    node is started by a thread inside its namespace that lives until ``close``: the nodes die with
    their starting thread (die_with_parent), so a test process killed outright leaves none behind."""

    def __init__(self, root, net: NetnsNet, hosts, tick_time_ms: int = 1000):
        self.net, self.hosts = net, hosts
        servers = "".join(f"server.{i + 1}={net.addr(h)}:2888:3888\n" for i, h in enumerate(hosts))
        dirs = []
        for i, _h in enumerate(hosts):
            d = root / f"zk-{i + 1}"
            d.mkdir(parents=True)
            (d / MYID_FILE).write_text(f"{i + 1}\n")
            (d / CONFIG_FILE).write_text(
                f"tickTime={tick_time_ms}\ninitLimit=10\nsyncLimit=5\ndataDir={d}\nclientPort={ZK_PORT}\n"
                "maxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n" + servers)
            dirs.append(d)
        self.nodes: dict = {}
        self.errors: list = []
        self._release = threading.Event()
        started = threading.Semaphore(0)
        self.threads = [threading.Thread(target=self._keep, args=(h, d, started), daemon=True)
                        for h, d in zip(hosts, dirs)]
        for t in self.threads:
            t.start()
        for _ in self.threads:
            started.acquire()
        if self.errors:
            self.close()
            raise self.errors[0]

    def _keep(self, host, data_dir, started) -> None:
        try:
            with in_netns(self.net.names[host]):
                self.nodes[host] = start_nodes([data_dir], die_with_parent=True)[0]    # in a quorum
        except BaseException as e:
            self.errors.append(e)
        finally:
            started.release()
        self._release.wait()

    @property
    def connect(self) -> str:
        return ",".join(f"{self.net.addr(h)}:{ZK_PORT}" for h in self.hosts)

    def modes(self) -> list:
        out = []
        for h in self.hosts:
            with in_netns(self.net.names[h]):
                out.append(quorum_mode(ZK_PORT))
        return out

    def close(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self._release.set()
        for t in self.threads:
            t.join(timeout=10)


class BrokerHosts:
    """NetnsCluster's view of the network with brokers mapped onto hosts: broker b runs in the namespace
    of host BROKER_HOST[b] and advertises that host's address."""

    def __init__(self, net: NetnsNet, hosts: dict):
        self.net, self.hosts = net, hosts
        self.names = [net.names[hosts[b]] for b in sorted(hosts)]

    def addr(self, broker_id: int) -> str:
        return self.net.addr(self.hosts[broker_id])


def metadata(admin) -> dict:
    """{partition: (leader, replicas, isr)}; empty while no broker answers (its host may be cut off)."""
    try:
        md = admin.list_topics(TOPIC, timeout=5)
    except KafkaException:
        return {}
    return {p: (pm.leader, list(pm.replicas), list(pm.isrs)) for p, pm in md.topics[TOPIC].partitions.items()}


def test_two_hosts_of_two_brokers_and_an_ensemble_survive_a_host_cut(tmp_path):
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        net = NetnsNet(5, 9)
        stack.callback(net.close)
        zk = NetnsEnsemble(tmp_path / "zk", net, ZK_HOSTS)
        stack.callback(zk.close)
        view = BrokerHosts(net, BROKER_HOST)
        c = NetnsCluster(tmp_path / "c", view, zk.connect, session_timeout_ms=SESSION_MS,
                         overrides={"replica.lag.time.max.ms": 3000, "default.replication.factor": 2})
        for b in c.brokers.values():
            b.extra = {"broker.rack": f"host-{BROKER_HOST[b.broker_id]}"}
        stack.enter_context(c)
        assert "127.0.0.1" not in c.bootstrap
        # a request on a connection into the cut host gets no answer and no reset: give up on it after 5 s
        # (as the load producer does) so the next Metadata goes to a broker that answers
        admin = AdminClient({"bootstrap.servers": c.bootstrap, "socket.timeout.ms": 5000})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 2, config={"min.insync.replicas": "1"})])[TOPIC].result(30)
        md = wait_until(lambda: (lambda m: m if len(m) == PARTITIONS and all(
            len(isr) == 2 for _l, _r, isr in m.values()) else None)(metadata(admin)), 30, "every ISR of 2")
        shared = [p for p, (_l, replicas, _i) in md.items() if len({BROKER_HOST[r] for r in replicas}) < 2]
        print(f"placement: {len(shared)} of {PARTITIONS} partitions with two replicas on one host")
        assert shared == []

        hist = History()
        load = LoadProducer(c.bootstrap, hist, rate=300, **{
            "enable.idempotence": True, "acks": "all", "request.timeout.ms": 5000, "socket.timeout.ms": 5000})
        load.start()
        cut_host = BROKER_HOST[md[0][0]]             # the host leading the loaded partition
        cut = f"{net.tag}v{cut_host}"
        try:
            wait_acks_grow(load, 300, timeout=60)
            subprocess.run(["ip", "link", "set", cut, "down"], check=True)
            cut_at = time.monotonic()

            def moved():
                m = metadata(admin)
                return m if len(m) == PARTITIONS and all(leader >= 0 and BROKER_HOST[leader] != cut_host for leader, _r, _i in m.values()) \
                    else None
            after = wait_until(moved, 60, "every leader on the other host")
            moved_s = time.monotonic() - cut_at
            assert zk.modes().count("leader") == 1      # the ensemble kept its quorum
            wait_acks_grow(load, 300, timeout=60)
            subprocess.run(["ip", "link", "set", cut, "up"], check=True)
            wait_until(lambda: (lambda m: len(m) == PARTITIONS and all(len(isr) == 2 for _l, _r, isr in m.values()))(
                metadata(admin)), 90,
                       "the cut host's replicas back in every ISR")
        finally:
            subprocess.run(["ip", "link", "set", cut, "up"], capture_output=True)
            load.finish()
        read_all_confluent(c.bootstrap, TOPIC, 1, hist)
        report = hist.check()
        print(report.line(), f"; host {cut_host} cut, leaders moved in {moved_s:.1f} s: "
              f"{ {p: leader for p, (leader, _r, _i) in after.items()} }; wall {time.monotonic() - started:.0f} s")
        assert report.acked >= 600
        assert report.acked_lost == 0, report.line()
        assert report.duplicates == 0, report.line()
        assert report.inconsistent_offsets == 0, report.line()
