"""Reassignment cancellation and new replicas on three real brokers (LocalCluster, real ZooKeeper,
`kbroker reassign-partitions` as a subprocess, confluent-kafka clients).

- --cancel (KIP-455 semantics in ZooKeeper mode): a move held slow by a throttle is cancelled half
  way; the partition reverts to its original replicas, the added replica's log is deleted, the
  /admin/reassign_partitions entry is gone, the throttle removed, and every record is still there.
- is_new: a broker removed from a partition while it was down keeps a leftover log; when a later
  reassignment adds it back, LeaderAndIsr carries is_new=True to it alone and it starts that
  replica with an empty log (the leftover, and a marker file planted in it, are gone) and copies the
  whole partition again."""
from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from checkers import partition_dir
from kbroker.testing import LocalCluster, wait_until
from kbroker.zk import layout as L
from test_replication_throttle import fill, stored_bytes, tool


@pytest.fixture
def cluster(tmp_path):
    overrides = {"replica.lag.time.max.ms": 3000, "replication.quota.window.num": 2,
                 "replication.quota.window.size.seconds": 1}
    with LocalCluster(tmp_path / "c", brokers=3, overrides=overrides) as c:
        zk = KazooClient(hosts=c.zk_connect)
        zk.start(timeout=10)
        c.kazoo = zk
        try:
            yield c
        finally:
            zk.stop()
            zk.close()


def count_records(c, name, expect, timeout=30.0):
    from confluent_kafka import Consumer, TopicPartition
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"n-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        cons.assign([TopicPartition(name, 0, 0)])
        offsets = set()
        deadline = time.monotonic() + timeout
        while len(offsets) < expect and time.monotonic() < deadline:
            for m in cons.consume(500, timeout=0.5):
                if m.error() is None:
                    offsets.add(m.offset())
        return len(offsets)
    finally:
        cons.close()


def plan_file(tmp_path, name, replicas):
    plan = tmp_path / f"{name}-{'-'.join(map(str, replicas))}.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": name, "partition": 0, "replicas": replicas}]}))
    return plan


@pytest.mark.slow
def test_cancel_reverts_to_the_original_replicas(cluster, tmp_path):
    c, zk = cluster, cluster.kazoo
    name = "cancelme"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[[0, 1]])])[name].result(30)
    fill(c, name)                                    # ~8 MB: at 200 kB/s the move would take ~40 s
    plan = plan_file(tmp_path, name, [1, 2])
    ex = tool(c, "--execute", "--reassignment-json-file", str(plan), "--throttle", "200000")
    assert ex.returncode == 0, ex.stdout + ex.stderr
    wait_until(lambda: stored_bytes(c, 2, name) > 0 if partition_dir(c.brokers[2].data_dir, name, 0).exists()
               else False, 30, "broker 2 to start copying")
    a = L.decode_topic(zk.get(L.topic_path(name))[0])
    assert a.partitions[0] == [1, 2, 0] and a.adding_replicas == {0: [2]} and a.removing_replicas == {0: [0]}

    cancel = tool(c, "--cancel", "--reassignment-json-file", str(plan))
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert f"Successfully cancelled partition reassignments for: {name}-0" in cancel.stdout
    wait_until(lambda: zk.exists(L.REASSIGN_PARTITIONS) is None, 30, "the entry to be deleted")
    a = L.decode_topic(zk.get(L.topic_path(name))[0])
    # Original replicas = the full list minus the adding ones, in the full list's order ([1, 2, 0]
    # minus [2]), as Kafka's ReplicaAssignment.originReplicas computes them.
    assert a.partitions == {0: [1, 0]} and a.adding_replicas == {} and a.removing_replicas == {}
    st = L.decode_partition_state(zk.get(L.partition_state_path(name, 0))[0])
    assert st.leader in (0, 1) and set(st.isr) <= {0, 1}, st
    assert stored_bytes(c, 2, name) < stored_bytes(c, 0, name), "the move was not cancelled half way"
    wait_until(lambda: not partition_dir(c.brokers[2].data_dir, name, 0).exists(), 30,
               "the added replica's log to be deleted")
    for b in (0, 1, 2):                              # --cancel removed the throttle too
        assert L.decode_config(zk.get(L.broker_config_path(str(b)))[0]) == {}
    again = tool(c, "--cancel", "--reassignment-json-file", str(plan))
    assert again.returncode == 0 and "None of the specified partition reassignments are active." in again.stdout
    n = count_records(c, name, 8000)
    assert n == 8000, f"{8000 - n} records missing after the cancellation"


@pytest.mark.slow
def test_a_replica_added_back_starts_with_an_empty_log(cluster, tmp_path):
    c, zk = cluster, cluster.kazoo
    name = "renew"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[[0, 1, 2]])])[name].result(30)
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
    for i in range(100):
        p.produce(name, value=b"a%d" % i, partition=0)
    assert p.flush(30) == 0
    d2 = partition_dir(c.brokers[2].data_dir, name, 0)
    wait_until(lambda: stored_bytes(c, 2, name) == stored_bytes(c, 0, name), 20, "broker 2's copy")
    c.stop_broker(2)
    # Broker 2 leaves the partition while it is down: no StopReplica reaches it.
    ex = tool(c, "--execute", "--reassignment-json-file", str(plan_file(tmp_path, name, [0, 1])))
    assert ex.returncode == 0, ex.stdout + ex.stderr
    wait_until(lambda: zk.exists(L.REASSIGN_PARTITIONS) is None, 30, "the removal to complete")
    for i in range(100):
        p.produce(name, value=b"b%d" % i, partition=0)
    assert p.flush(30) == 0
    assert d2.exists()
    (d2 / "leftover-marker").write_text("written while broker 2 was down")
    c.start_broker(2)
    assert (d2 / "leftover-marker").exists()         # not a replica: nobody touches it

    ex = tool(c, "--execute", "--reassignment-json-file", str(plan_file(tmp_path, name, [0, 1, 2])))
    assert ex.returncode == 0, ex.stdout + ex.stderr
    wait_until(lambda: zk.exists(L.REASSIGN_PARTITIONS) is None, 60, "the addition to complete")
    assert not (d2 / "leftover-marker").exists(), "the leftover log was kept: is_new not applied"
    assert "new replica (is_new) over a leftover log ending at 100" in c.brokers[2].log_path.read_text()
    wait_until(lambda: stored_bytes(c, 2, name) == stored_bytes(c, 0, name), 30, "broker 2's fresh copy")
    assert count_records(c, name, 200) == 200
