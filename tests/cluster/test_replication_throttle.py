"""Reassignment under a replication throttle, on three real brokers (LocalCluster, real ZooKeeper,
`kbroker reassign-partitions` as a subprocess, confluent-kafka clients).

`--execute --throttle R` sets leader/follower.replication.throttled.rate = R on the brokers involved
(/config/brokers/<id>) and the topic's throttled replica lists, as kafka-reassign-partitions.sh does;
the new replica then copies the partition at about R (asserted loosely: the move takes at least half
of size / R), while the same move without a throttle takes well under that; `--verify` removes the
throttle once the move completed. An acks=all producer runs through the throttled move and the
history checker counts acked-but-lost (must be 0).

replication.quota.window.num=2 (Kafka's default 11 would let ~10 s worth of bytes through before the
average binds; the rule is the same, the test just gets there sooner)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from checkers import History, RawConn, fill_partition, partition_dir, read_all_confluent
from kbroker.testing import LocalCluster, wait_until
from kbroker.zk import layout as L
from test_replication import TOPIC, LoadProducer

RATE = 1_000_000            # B/s
RECORDS, VALUE = 8000, 1000  # ~8 MB per topic


def tool(c, *args):
    return subprocess.run([sys.executable, "-m", "kbroker", "reassign-partitions", "--zookeeper", c.zk_connect,
                           *args], capture_output=True, text=True, timeout=60)


def fill(c, name):
    fill_partition(c.bootstrap, name, RECORDS, VALUE)


def stored_bytes(c, broker, name):
    return sum(f.stat().st_size for f in partition_dir(c.brokers[broker].data_dir, name, 0).glob("*.log"))


def reassign_and_time(c, zk, tmp_path, name, target, *extra):
    plan = tmp_path / f"{name}.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": name, "partition": 0, "replicas": target}]}))
    t0 = time.monotonic()
    ex = tool(c, "--execute", "--reassignment-json-file", str(plan), *extra)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    wait_until(lambda: zk.exists(L.REASSIGN_PARTITIONS) is None, 120, f"the move of {name} to complete",
               interval=0.05)
    return time.monotonic() - t0, plan, ex.stdout


@pytest.mark.slow
def test_throttled_reassignment_moves_data_at_about_the_rate(tmp_path):
    overrides = {"replica.lag.time.max.ms": 3000, "replication.quota.window.num": 2,
                 "replication.quota.window.size.seconds": 1}
    with LocalCluster(tmp_path / "c", brokers=3, overrides=overrides) as c:
        zk = KazooClient(hosts=c.zk_connect)
        zk.start(timeout=10)
        try:
            admin = AdminClient({"bootstrap.servers": c.bootstrap})
            for name in ("free", TOPIC):
                admin.create_topics([NewTopic(name, 1, replica_assignment=[[0, 1]])])[name].result(30)
            for name in ("free", TOPIC):
                fill(c, name)
            size = stored_bytes(c, 0, TOPIC)
            assert size >= RECORDS * VALUE

            free_s, _plan, _out = reassign_and_time(c, zk, tmp_path, "free", [0, 1, 2])

            hist = History()
            load = LoadProducer(c.bootstrap, hist, rate=200, acks="all").start()
            try:
                slow_s, plan, out = reassign_and_time(c, zk, tmp_path, TOPIC, [0, 1, 2], "--throttle", str(RATE))
                assert f"The inter-broker throttle limit was set to {RATE} B/s" in out
                for b in (0, 1, 2):     # what --execute wrote, as kafka-reassign-partitions.sh writes it
                    conf = L.decode_config(zk.get(L.broker_config_path(str(b)))[0])
                    assert conf == {"leader.replication.throttled.rate": str(RATE),
                                    "follower.replication.throttled.rate": str(RATE)}
                topic_conf = L.decode_config(zk.get(L.topic_config_path(TOPIC))[0])
                assert topic_conf["leader.replication.throttled.replicas"] == "0:0,0:1"
                assert topic_conf["follower.replication.throttled.replicas"] == "0:2"
                verify = tool(c, "--verify", "--reassignment-json-file", str(plan))
                assert verify.returncode == 0, verify.stdout + verify.stderr
                assert "Throttle was removed." in verify.stdout
                for b in (0, 1, 2):
                    assert L.decode_config(zk.get(L.broker_config_path(str(b)))[0]) == {}
                assert not set(L.decode_config(zk.get(L.topic_config_path(TOPIC))[0])) & {
                    "leader.replication.throttled.replicas", "follower.replication.throttled.replicas"}
            finally:
                load.finish()
            expected = size / RATE
            print(f"{size} B: throttled to {RATE} B/s in {slow_s:.1f}s (size/rate {expected:.1f}s), "
                  f"unthrottled in {free_s:.1f}s")
            assert slow_s >= 0.5 * expected, (slow_s, expected)
            assert free_s < 0.5 * expected and free_s < slow_s / 2, (free_s, slow_s)
            # The new replica holds the whole log.
            wait_until(lambda: stored_bytes(c, 2, TOPIC) >= size, 30, "broker 2's copy")
            read_all_confluent(c.bootstrap, TOPIC, 1, hist)
            report = hist.check()
            print(report.line())
            assert report.acked > 0
            assert report.acked_lost == 0 and report.inconsistent_offsets == 0, report.line()

            # An in-sync follower is never held back: every replica of "isr" is follower-throttled
            # ("*") at RATE on broker 1, yet acks=all with min.insync.replicas=2 (which needs broker
            # 1's copy of every batch) writes the same ~8 MB far faster than RATE allows.
            admin.create_topics([NewTopic("isr", 1, replica_assignment=[[0, 1]],
                                          config={"min.insync.replicas": "2"})])["isr"].result(30)
            from kbroker.zk.client import BrokerZk
            admin_zk = BrokerZk(c.zk_connect, -1)
            admin_zk.start()
            try:
                admin_zk.set_topic_config("isr", {"min.insync.replicas": "2",
                                                  "follower.replication.throttled.replicas": "*"})
                admin_zk.alter_broker_config("1", {"follower.replication.throttled.rate": str(RATE)})
            finally:
                admin_zk.close()

            def seen_by_broker_1():      # its topic view (DescribeConfigs) and its logs change together
                with RawConn(f"127.0.0.1:{c.brokers[1].port}") as conn:
                    resp = conn.request(32, 1, {"resources": [{"resource_type": 2, "resource_name": "isr",
                                                               "configuration_keys": None}],
                                                "include_synonyms": False})
                return any(e["name"] == "follower.replication.throttled.replicas" and e["value"] == "*"
                           for e in resp["results"][0]["configs"])
            wait_until(seen_by_broker_1, 20, "broker 1 to apply the throttled replica list")
            t0 = time.monotonic()
            fill(c, "isr")
            isr_s = time.monotonic() - t0
            print(f"acks=all through a follower-throttled in-sync replica: {isr_s:.1f}s")
            assert isr_s < 0.5 * expected, (isr_s, expected)
        finally:
            zk.stop()
            zk.close()


# Without the leader-side calls in the Fetch handler (ReplicaManager.leader_throttled /
# record_leader_bytes) the move is as fast as unthrottled (0.9 s) and this test fails.
@pytest.mark.slow
def test_leader_side_throttle_alone_slows_the_move_but_not_isr_followers(tmp_path):
    """Only the leader side is throttled (rates on brokers 0 and 1, leader.replication.throttled.replicas
    = 0:0,0:1, no follower list): the new replica on broker 2 is held to about the rate, while the
    in-sync follower keeps acks=all going (history checker: acked-but-lost 0)."""
    overrides = {"replica.lag.time.max.ms": 3000, "replication.quota.window.num": 2,
                 "replication.quota.window.size.seconds": 1}
    with LocalCluster(tmp_path / "c", brokers=3, overrides=overrides) as c:
        zk = KazooClient(hosts=c.zk_connect)
        zk.start(timeout=10)
        try:
            admin = AdminClient({"bootstrap.servers": c.bootstrap})
            admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[0, 1]],
                                          config={"min.insync.replicas": "2"})])[TOPIC].result(30)
            fill(c, TOPIC)
            size = stored_bytes(c, 0, TOPIC)
            from kbroker.zk.client import BrokerZk
            admin_zk = BrokerZk(c.zk_connect, -1)
            admin_zk.start()
            try:
                admin_zk.set_topic_config(TOPIC, {"min.insync.replicas": "2",
                                                  "leader.replication.throttled.replicas": "0:0,0:1"})
                for b in (0, 1):
                    admin_zk.alter_broker_config(str(b), {"leader.replication.throttled.rate": str(RATE)})
            finally:
                admin_zk.close()
            hist = History()
            load = LoadProducer(c.bootstrap, hist, rate=200, acks="all").start()
            try:
                slow_s, _plan, _out = reassign_and_time(c, zk, tmp_path, TOPIC, [0, 1, 2])
            finally:
                load.finish()
            print(f"{size} B with the leader side throttled to {RATE} B/s: {slow_s:.1f}s "
                  f"(size/rate {size / RATE:.1f}s)")
            read_all_confluent(c.bootstrap, TOPIC, 1, hist)
            report = hist.check()
            print(report.line())
            assert report.acked_lost == 0 and report.inconsistent_offsets == 0, report.line()
            assert slow_s >= 0.5 * size / RATE, (slow_s, size / RATE)
        finally:
            zk.stop()
            zk.close()
