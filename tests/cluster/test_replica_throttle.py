"""Replication throttle parts (kbroker/replica/throttle.py) on real parts: the sampled rate and its
minimum window, the throttled-replica lists, the leader-side rule of ReplicaManager (ISR members are
never throttled), and the dynamic rates followed from ZooKeeper (/config/brokers/<id> over
<default> over the static config) through the session's real ZooKeeper."""
import asyncio
import uuid

import pytest

from kbroker.replica import LeaderAndIsrState, ReplicaManager
from kbroker.replica.throttle import (ALL, LONG_MAX, ReplicationQuota, SampledRate, format_throttled_replicas,
                                      parse_throttled_replicas)
from kbroker.zk import layout as L

from test_replica_manager import TP, Node


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_rate_counts_at_least_num_minus_one_windows_and_forgets_old_samples():
    clock = Clock()
    r = SampledRate(3, 1.0, clock)
    r.record(4000)
    # Elapsed 0 s counts as 2 full windows (Kafka's Rate): 4000 B / 2 s.
    assert r.rate() == pytest.approx(2000)
    clock.t += 1.5
    r.record(2000)
    assert r.rate() == pytest.approx(6000 / 2.5)     # 1.5 s elapsed + the missing full window
    clock.t += 2.0                       # t = 3.5 s: the first sample (t = 0) is past 3 windows
    assert r.rate() == pytest.approx(2000 / 2.0)
    clock.t += 5
    assert r.rate() == 0


def test_throttled_replica_lists():
    key = "leader.replication.throttled.replicas"
    assert parse_throttled_replicas(key, ["0:1", "1:2", "2:1"], 1) == {0, 2}
    assert parse_throttled_replicas(key, "0:1, 3:1", 1) == {0, 3}
    assert parse_throttled_replicas(key, ["*"], 5) is ALL
    assert parse_throttled_replicas(key, [], 5) == frozenset()
    with pytest.raises(ValueError, match=key):
        parse_throttled_replicas(key, ["0-1"], 1)
    assert format_throttled_replicas([(1, 2), (0, 1), (1, 2)]) == "0:1,1:2"


def test_quota_is_exceeded_only_for_a_bound_and_above_it():
    clock = Clock()
    configs = {"t": {"follower.replication.throttled.replicas": ["0:7"]}}
    q = ReplicationQuota("follower.replication.throttled.rate", "follower.replication.throttled.replicas", 7,
                         LONG_MAX, 2, 1.0, configs.get, clock)
    assert q.is_throttled(("t", 0)) and not q.is_throttled(("t", 1)) and not q.is_throttled(("u", 0))
    q.record(10_000_000)
    assert not q.is_exceeded()           # no bound: never exceeded
    q.set_bound(1000)
    assert q.is_exceeded()
    clock.t += 3                          # the samples age out
    assert not q.is_exceeded()
    configs["t"] = {"follower.replication.throttled.replicas": ["*"]}
    assert q.is_throttled(("t", 5))      # a changed list is read again


@pytest.fixture
def node(tmp_path, zk_server):
    n = Node(tmp_path, f"{zk_server.connect_string}/thr{uuid.uuid4().hex[:10]}", lag_ms=300)
    n.zk.start()
    n.logs.startup(0, n.zk.cluster_id)
    state = L.PartitionState(leader=0, leader_epoch=4, isr=[0, 1], controller_epoch=1)
    n.zk.kazoo.create(L.partition_state_path(*TP), L.encode_partition_state(state), makepath=True)
    yield n
    n.logs.shutdown()
    n.zk.close()


def test_leader_side_rule_spares_isr_members(node):
    async def go():
        rm = ReplicaManager(node)
        rm.loop = asyncio.get_running_loop()
        rm.become_leader(TP, LeaderAndIsrState(0, 4, [0, 1], [0, 1, 2], 0, 1),
                         {"leader.replication.throttled.replicas": ["0:0"]})
        p = rm.partitions[TP]
        q = rm.leader_quota
        assert q.is_throttled(TP)
        assert not rm.leader_throttled(p, 2)          # no bound set: never
        q.set_bound(1000)
        rm.record_leader_bytes(p, 50_000)
        assert q.throttled_bytes == 50_000 and q.is_exceeded()
        assert rm.leader_throttled(p, 2)              # out of the ISR, throttled, over quota
        assert not rm.leader_throttled(p, 1)          # in the ISR: never held back
        # A list naming another broker as the leader-side replica does not throttle this one.
        node.logs.set_topic_config(TP[0], {"leader.replication.throttled.replicas": ["0:1"]})
        assert not rm.leader_throttled(p, 2)
        await rm.stop()

    asyncio.run(go())


def test_dynamic_rates_follow_zookeeper(node):
    async def go():
        rm = ReplicaManager(node)
        rm.start()
        try:
            assert rm.leader_quota.bound == LONG_MAX and rm.follower_quota.bound == LONG_MAX

            async def until(cond, what):
                for _ in range(200):
                    if cond():
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(what)

            await asyncio.to_thread(node.zk.alter_broker_config, "<default>",
                                    {"leader.replication.throttled.rate": "5000",
                                     "follower.replication.throttled.rate": "7000"})
            await until(lambda: rm.leader_quota.bound == 5000 and rm.follower_quota.bound == 7000, "defaults")
            await asyncio.to_thread(node.zk.alter_broker_config, "0", {"follower.replication.throttled.rate": "100"})
            await until(lambda: rm.follower_quota.bound == 100 and rm.leader_quota.bound == 5000, "per broker")
            await asyncio.to_thread(node.zk.alter_broker_config, "0", {},
                                    ("follower.replication.throttled.rate",))
            await asyncio.to_thread(node.zk.alter_broker_config, "<default>", {},
                                    ("leader.replication.throttled.rate", "follower.replication.throttled.rate"))
            await until(lambda: rm.leader_quota.bound == LONG_MAX and rm.follower_quota.bound == LONG_MAX,
                        "removed")
            # Kafka's change notifications were written with each change.
            changes = node.zk.kazoo.get_children(L.CONFIG_CHANGES)
            kinds = node.zk.read_config_changes(changes)
            assert ("brokers", "0") in kinds and ("brokers", "<default>") in kinds
        finally:
            await rm.stop()

    asyncio.run(go())
