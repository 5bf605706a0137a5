"""Three "hosts" as network namespaces joined by a bridge (kbroker.perf.replication_bench's NetnsNet),
each running one broker that advertises its own address (not loopback), with broker.rack = its host;
ZooKeeper and the clients stay in the root namespace and reach the brokers over the bridge.

Invariant: a topic's replicas land on three different hosts; with an idempotent acks=all producer
running, cutting the leader's host off the network (its veth down: brokers and ZooKeeper session
unreachable) moves leadership to another host, and after the host returns and rejoins the ISR the
history checker finds acked-but-lost 0, duplicates 0."""
from __future__ import annotations

import contextlib
import os
import subprocess

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import METADATA, History, RawConn, read_all_confluent
from kbroker.perf.replication_bench import NetnsCluster, NetnsNet, ZkForwarder
from kbroker.testing import wait_until
from kbroker.zk.local import start_zookeeper
from test_replication import TOPIC, LoadProducer, wait_acks_grow


def _can_make_namespaces() -> bool:
    name = f"kbprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True)
    if r.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return True


pytestmark = pytest.mark.skipif(not _can_make_namespaces(),
                                reason="this machine cannot create network namespaces (needs root and ip netns)")


def state(c):
    """(leader, leader_epoch, isr) of TOPIC-0 as a reachable broker's Metadata reports it, over the bridge."""
    for i, b in c.brokers.items():
        try:
            with RawConn(f"{c.net.addr(i)}:{b.port}", timeout=3) as conn:
                resp = conn.request(METADATA, 8, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False,
                                                    "include_cluster_authorized_operations": False,
                                                    "include_topic_authorized_operations": False}, timeout=3)
        except OSError:
            continue
        for t in resp["topics"]:
            for p in t["partitions"]:
                if t["error_code"] == 0 and p["partition_index"] == 0:
                    return p["leader_id"], p["leader_epoch"], sorted(p["isr_nodes"])
    return -1, -1, []


def test_three_hosts_with_their_own_addresses_survive_a_host_cut(tmp_path):
    with contextlib.ExitStack() as stack:
        net = NetnsNet(3, 7)
        stack.callback(net.close)
        zk = start_zookeeper(tmp_path / "zookeeper", port=0, tick_time_ms=1000, die_with_parent=True)
        stack.callback(zk.stop)
        fwd = ZkForwarder(net.gateway, zk.port)
        stack.callback(fwd.close)
        c = NetnsCluster(tmp_path / "c", net, f"{net.gateway}:{zk.port}", session_timeout_ms=6000,
                         overrides={"replica.lag.time.max.ms": 3000})
        for i, b in c.brokers.items():
            b.extra = {"broker.rack": f"host-{i}"}
        stack.enter_context(c)
        assert all(net.addr(i) in c.bootstrap for i in range(3)) and "127.0.0.1" not in c.bootstrap

        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(30)
        leader, _epoch, isr = wait_until(lambda: (lambda s: s if len(s[2]) == 3 else None)(state(c)), 30, "ISR of 3")
        md = admin.list_topics(TOPIC, timeout=10)
        hosts = {md.brokers[r].host for r in md.topics[TOPIC].partitions[0].replicas}
        assert hosts == {net.addr(i) for i in range(3)}      # one replica per host, each its own address

        hist = History()
        load = LoadProducer(c.bootstrap, hist, rate=300, **{
            "enable.idempotence": True, "acks": "all", "request.timeout.ms": 5000, "socket.timeout.ms": 5000})
        load.start()
        cut = f"{net.tag}v{leader}"
        try:
            wait_acks_grow(load, 300, timeout=60)
            subprocess.run(["ip", "link", "set", cut, "down"], check=True)
            moved = wait_until(lambda: (lambda s: s if s[0] not in (leader, -1) else None)(state(c)), 60,
                               "leadership to leave the cut host")
            wait_acks_grow(load, 300, timeout=60)
            subprocess.run(["ip", "link", "set", cut, "up"], check=True)
            wait_until(lambda: len(state(c)[2]) == 3, 90, "the cut host back in the ISR")
        finally:
            subprocess.run(["ip", "link", "set", cut, "up"], capture_output=True)
            load.finish()
        read_all_confluent(c.bootstrap, TOPIC, 1, hist)
        report = hist.check()
        print(report.line(), f"; leader {leader} -> {moved[0]}")
        assert report.acked >= 600
        assert report.acked_lost == 0, report.line()
        assert report.duplicates == 0, report.line()
        assert report.inconsistent_offsets == 0, report.line()
