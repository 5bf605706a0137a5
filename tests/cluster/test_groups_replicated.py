"""Durable offsets on three brokers: __consumer_offsets with RF=3 and min.insync.replicas=2. Commits
are acknowledged only once replicated; kill -9 of the coordinator's broker right after acknowledged
commits, and the new coordinator (another broker, after loading the partition) returns every one
(acked-but-lost: 0 of N; the checker's ability to see a loss is shown in test_groups_faults)."""
import asyncio
import time

import pytest

from kbroker.client.group import GroupClient
from kbroker.testing import LocalCluster, wait_until

from test_groups import request
from test_groups_faults import lost_commits


@pytest.mark.slow
def test_coordinator_kill9_loses_no_acknowledged_commit(tmp_path):
    overrides = {"offsets.topic.num.partitions": 3, "offsets.topic.replication.factor": 3,
                 "min.insync.replicas": 2, "default.replication.factor": 3,
                 "group.initial.rebalance.delay.ms": 0}
    with LocalCluster(tmp_path, brokers=3, num_partitions=2, overrides=overrides) as c:
        bs = ",".join(f"127.0.0.1:{b.port}" for b in c.brokers.values())
        group, topic = "durable-rf3", "t-rf3"

        async def phase1():
            async with GroupClient(bs) as gc:
                from kbroker.client.admin import Admin, NewTopic
                async with Admin(cluster=gc.cluster) as admin:
                    await admin.create_topics([NewTopic(topic, 2, 3)])
                node = await gc.coordinator(group)
                acked, n = {}, 0
                for rnd in range(25):
                    offs = {(topic, p): (rnd * 10 + p, -1, f"r{rnd}") for p in range(2)}
                    codes = await gc.commit_offsets(group, offs)
                    for tp, code in codes.items():
                        if code == 0:
                            acked[(group,) + tp] = offs[tp][0]   # the latest acknowledged commit wins
                            n += 1
                return node, acked, n

        def isr_full():
            md = request(bs.split(",")[0], 3, {"topics": [{"name": "__consumer_offsets"}]}, 4)
            t = md["topics"][0]
            return t["error_code"] == 0 and t["partitions"] and all(len(p["isr_nodes"]) == 3 for p in t["partitions"])
        # FindCoordinator creates the offsets topic; wait until every replica is in sync
        wait_until(lambda: request(bs.split(",")[0], 10, {"key": group, "key_type": 0}, 1)["error_code"] == 0,
                   60, "coordinator")
        wait_until(isr_full, 60, "__consumer_offsets fully in sync")
        node, acked, n = asyncio.run(phase1())
        assert n == 50 and acked == {(group, topic, 0): 240, (group, topic, 1): 241}
        c.kill(node)
        t0 = time.monotonic()
        survivors = ",".join(f"127.0.0.1:{b.port}" for i, b in c.brokers.items() if i != node)

        async def phase2():
            async with GroupClient(survivors, retries=600) as gc:
                # until the controller notices the death (ZooKeeper session), the dead broker is named
                deadline = time.monotonic() + 60
                while (new := await gc.coordinator(group)) == node and time.monotonic() < deadline:
                    gc._coordinators.clear()
                    await asyncio.sleep(0.2)
                return new, await gc.fetch_offsets(group)
        new, fetched = asyncio.run(phase2())
        failover = time.monotonic() - t0
        assert new != node
        got = {(group,) + tp: v[0] for tp, v in fetched.items()}
        lost = lost_commits(acked, got)
        assert lost == [], f"acked-but-lost {len(lost)} of {n}"
        print(f"failover to broker {new} answered in {failover:.1f} s; acked-but-lost 0 of {n}")


@pytest.mark.slow
def test_commit_not_acknowledged_while_followers_are_held_back(tmp_path):
    """Both followers of the group's offsets partition stopped (SIGSTOP): a commit is not acknowledged
    (COORDINATOR_NOT_AVAILABLE after offsets.commit.timeout.ms); then kill -9 of the leader and the
    followers resume: the new coordinator still has every commit that was acknowledged before."""
    import os
    import signal
    from kbroker.client.connection import BrokerConnection
    from kbroker.coordinator.group_coordinator import partition_for
    overrides = {"offsets.topic.num.partitions": 3, "offsets.topic.replication.factor": 3,
                 "min.insync.replicas": 2, "default.replication.factor": 3, "offsets.commit.timeout.ms": 2000,
                 "group.initial.rebalance.delay.ms": 0}
    with LocalCluster(tmp_path, brokers=3, num_partitions=2, overrides=overrides) as c:
        bs = ",".join(f"127.0.0.1:{b.port}" for b in c.brokers.values())
        one = bs.split(",")[0]
        group, topic = "held-back", "t-held"
        wait_until(lambda: request(one, 10, {"key": group, "key_type": 0}, 1)["error_code"] == 0, 60, "coordinator")

        def partition_state():
            md = request(one, 3, {"topics": [{"name": "__consumer_offsets"}]}, 4)
            return md["topics"][0]["partitions"]

        wait_until(lambda: all(len(p["isr_nodes"]) == 3 for p in partition_state()), 60, "offsets topic in sync")

        async def commits():
            async with GroupClient(bs) as gc:
                from kbroker.client.admin import Admin, NewTopic
                async with Admin(cluster=gc.cluster) as admin:
                    await admin.create_topics([NewTopic(topic, 2, 3)])
                acked = {}
                for rnd in range(10):
                    offs = {(topic, p): rnd * 10 + p for p in range(2)}
                    for tp, code in (await gc.commit_offsets(group, offs)).items():
                        if code == 0:
                            acked[(group,) + tp] = offs[tp]
                return await gc.coordinator(group), acked
        leader, acked = asyncio.run(commits())
        assert len(acked) == 2
        p = next(x for x in partition_state() if x["partition_index"] == partition_for(group, 3))
        assert p["leader_id"] == leader
        followers = [r for r in p["replica_nodes"] if r != leader]
        pids = [c.brokers[f].pid for f in followers]

        async def unacked_commit():
            conn = await BrokerConnection.open("127.0.0.1", c.brokers[leader].port)
            try:
                t0 = time.monotonic()
                _, r = await conn.send(8, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                                           "topics": [{"name": topic, "partitions": [
                                               {"partition_index": 0, "committed_offset": 999,
                                                "committed_metadata": ""}]}]}, 7, timeout=20)
                return r["topics"][0]["partitions"][0]["error_code"], time.monotonic() - t0
            finally:
                conn.close()
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            code, took = asyncio.run(unacked_commit())
            assert code == 15, code                  # COORDINATOR_NOT_AVAILABLE: not acknowledged
            assert took >= 1.9, took                 # it waited for the followers, offsets.commit.timeout.ms
            c.kill(leader)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        survivors = ",".join(f"127.0.0.1:{c.brokers[f].port}" for f in followers)

        async def after():
            async with GroupClient(survivors, retries=600) as gc:
                deadline = time.monotonic() + 60
                while await gc.coordinator(group) == leader and time.monotonic() < deadline:
                    gc._coordinators.clear()
                    await asyncio.sleep(0.2)
                return await gc.fetch_offsets(group)
        fetched = {(group,) + tp: v[0] for tp, v in asyncio.run(after()).items()}
        # the unacknowledged 999 may or may not have survived; every acknowledged commit must have
        lost = [k for k, v in acked.items() if fetched.get(k) not in (v, 999 if k[2] == 0 else v)]
        assert lost == [], f"acked-but-lost {len(lost)} of {len(acked)}"
