"""ReplicaManager on real parts: a LogManager on real files, BrokerZk on the session's real ZooKeeper
(tests/conftest.py zk_server), driven on an asyncio loop. Delayed produce outcomes (HW reached,
REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND, NOT_LEADER_OR_FOLLOWER), ISR changes as
version-checked writes with an isr_change_notification, and a fenced write making the leader stale."""
import asyncio
import inspect
import uuid

import pytest

from kbroker.config import BrokerConfig
from kbroker.log import LogConfig, LogManager
from kbroker.metrics import BrokerMetrics
from kbroker.protocol.errors import Errors
from kbroker.replica import LeaderAndIsrState, ReplicaManager
from kbroker.server.metadata import MetadataCache
from kbroker.server.notify import AppendNotifier
from kbroker.zk import layout as L
from kbroker.zk.client import BrokerZk

from test_log import batch

TP = ("t", 0)


class Node:
    """The parts of a broker a ReplicaManager uses, each the real one."""

    def __init__(self, tmp_path, connect, lag_ms):
        self.broker_id = 0
        self.config = BrokerConfig.from_text(f"broker.id=0\nzookeeper.connect={connect}\n"
                                             f"replica.lag.time.max.ms={lag_ms}\n")
        self.logs = LogManager([str(tmp_path / "data")], self.config.topic_defaults(), hw_follows_leo=False)
        self.metadata = MetadataCache()
        self.metrics = BrokerMetrics()
        self.notifier = AppendNotifier()
        self.zk = BrokerZk(connect, 0, 6000)


@pytest.fixture
def node(tmp_path, zk_server):
    n = Node(tmp_path, f"{zk_server.connect_string}/rm{uuid.uuid4().hex[:10]}", lag_ms=300)
    n.zk.start()
    n.logs.startup(0, n.zk.cluster_id)
    state = L.PartitionState(leader=0, leader_epoch=4, isr=[0, 1], controller_epoch=1)
    n.zk.kazoo.create(L.partition_state_path(*TP), L.encode_partition_state(state), makepath=True)
    yield n
    n.logs.shutdown()
    n.zk.close()


def lead(rm, isr=(0, 1), min_isr=2, epoch=4, version=0):
    rm.become_leader(TP, LeaderAndIsrState(0, epoch, list(isr), [0, 1], version, 1),
                     {"min.insync.replicas": min_isr})
    return rm.partitions[TP]


def run(coro):
    return asyncio.run(coro)


def test_acks_all_waits_for_the_follower_and_times_out_without_it(node):
    async def go():
        rm = ReplicaManager(node)
        rm.loop = asyncio.get_running_loop()
        p = lead(rm, min_isr=1)
        r1 = rm.append_records({TP: batch(3)}, 1, 1000)
        assert isinstance(r1, dict) and r1[TP].error_code == 0 and r1[TP].base_offset == 0
        assert p.log.high_watermark == 0                 # follower 1 has not fetched
        fut = rm.append_records({TP: batch(2)}, -1, 5000)
        assert inspect.isawaitable(fut)
        rm.record_follower_fetch(p, 1, 3, 4)            # follower has the acks=1 batch
        assert p.log.high_watermark == 3 and not fut.done()
        rm.record_follower_fetch(p, 1, 5, 4)
        res = await fut
        assert res[TP].error_code == 0 and res[TP].base_offset == 3
        slow = rm.append_records({TP: batch(2)}, -1, 200)
        res = await slow
        assert res[TP].error_code == Errors.REQUEST_TIMED_OUT and res[TP].base_offset == -1
        await rm.stop()
    run(go())


def test_isr_shrink_is_a_fenced_write_and_fails_waiters_below_min_isr(node):
    async def go():
        rm = ReplicaManager(node)
        rm.start()
        p = lead(rm, min_isr=2)
        rm.record_follower_fetch(p, 1, 0, 4)
        fut = rm.append_records({TP: batch(2)}, -1, 30_000)
        res = await asyncio.wait_for(fut, 10)            # follower 1 never fetches again: shrink
        assert res[TP].error_code == Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        state, version = node.zk.get_partition_state(*TP)
        assert state.isr == [0] and state.leader_epoch == 4 and version == 1 == p.partition_epoch
        # The waiters fail as soon as the shrink is written; the notification follows it.
        for _ in range(200):
            notes = node.zk.kazoo.get_children(L.ISR_CHANGE_NOTIFICATION)
            if notes:
                break
            await asyncio.sleep(0.05)
        assert len(notes) == 1
        assert L.decode_partition_list(node.zk.kazoo.get(f"{L.ISR_CHANGE_NOTIFICATION}/{notes[0]}")[0]) == [TP]
        assert rm.isr_shrinks == 1 and rm.under_min_isr() == 1
        r = rm.append_records({TP: batch(1)}, -1, 1000)
        assert r[TP].error_code == Errors.NOT_ENOUGH_REPLICAS
        # The follower comes back in the current epoch at the HW: it rejoins.
        rm.record_follower_fetch(p, 1, p.log.log_end_offset, 4)
        for _ in range(100):
            if p.isr == [0, 1]:
                break
            await asyncio.sleep(0.05)
        assert p.isr == [0, 1] and rm.isr_expands == 1
        assert node.zk.get_partition_state(*TP)[0].isr == [0, 1]
        await rm.stop()
    run(go())


def test_a_moved_state_znode_makes_the_leader_stale(node):
    async def go():
        rm = ReplicaManager(node)
        rm.start()
        p = lead(rm, min_isr=1)
        # The controller moved the partition on (a newer version): this leader's write must fail.
        node.zk.set_partition_state(*TP, L.PartitionState(1, 5, [1], 2), expected_version=0)
        for _ in range(100):
            if p.stale:
                break
            await asyncio.sleep(0.05)
        assert p.stale
        assert node.zk.get_partition_state(*TP)[0].leader == 1      # nothing overwritten
        r = rm.append_records({TP: batch(1)}, -1, 1000)
        assert r[TP].error_code == Errors.NOT_LEADER_OR_FOLLOWER
        await rm.stop()
    run(go())


def test_leadership_change_fails_waiters_and_old_epochs_are_refused(node):
    async def go():
        rm = ReplicaManager(node)
        rm.loop = asyncio.get_running_loop()
        lead(rm, min_isr=1)
        fut = rm.append_records({TP: batch(1)}, -1, 30_000)
        assert rm.become_leader(TP, LeaderAndIsrState(0, 3, [0, 1], [0, 1], 0)) == Errors.STALE_CONTROLLER_EPOCH
        assert rm.become_follower(TP, LeaderAndIsrState(1, 5, [0, 1], [0, 1], 1)) == Errors.NONE
        res = await asyncio.wait_for(fut, 5)
        assert res[TP].error_code == Errors.NOT_LEADER_OR_FOLLOWER
        r = rm.append_records({TP: batch(1)}, 1, 1000)
        assert r[TP].error_code == Errors.NOT_LEADER_OR_FOLLOWER
        await rm.stop()
    run(go())


def test_log_of_an_earlier_topic_with_the_same_name_is_replaced(node):
    """LeaderAndIsr names topic id B while the log on disk (partition.metadata) belongs to topic id
    A: a topic deleted while this broker was away and recreated. The stale log goes; the replica
    starts empty under B."""
    async def go():
        rm = ReplicaManager(node)
        rm.loop = asyncio.get_running_loop()
        st = LeaderAndIsrState(0, 0, [0], [0], 0, 1)
        assert rm.apply_leader_and_isr(TP, st, {}, "AAAAAAAAAAAAAAAAAAAAAA") == Errors.NONE
        rm.append_records({TP: batch(5)}, 1, 1000)
        old = rm.partitions[TP].log
        assert old.log_end_offset == 5 and old.read_topic_id() == "AAAAAAAAAAAAAAAAAAAAAA"
        assert rm.apply_leader_and_isr(TP, LeaderAndIsrState(0, 0, [0], [0], 0, 2), {},
                                       "BBBBBBBBBBBBBBBBBBBBBB") == Errors.NONE
        new = rm.partitions[TP].log
        assert new is not old and new.log_end_offset == 0
        assert new.read_topic_id() == "BBBBBBBBBBBBBBBBBBBBBB"
        # The same id again is no change.
        rm.append_records({TP: batch(2)}, 1, 1000)
        rm.apply_leader_and_isr(TP, LeaderAndIsrState(0, 1, [0], [0], 0, 2), {}, "BBBBBBBBBBBBBBBBBBBBBB")
        assert rm.partitions[TP].log is new and new.log_end_offset == 2
        await rm.stop()
    run(go())


def test_a_follower_outside_the_isr_rechecks_an_hw_freed_by_a_lowered_min_isr(node):
    """record_follower_fetch skips the HW check for an ISR follower fetching at or below the HW (it
    cannot move it); a follower outside the ISR still runs it at any offset, which is what moves an HW
    held only by min.insync.replicas once that is lowered (no append needed)."""
    async def go():
        rm = ReplicaManager(node)
        rm.loop = asyncio.get_running_loop()
        p = lead(rm, isr=(0,), min_isr=2)
        r = rm.append_records({TP: batch(3)}, 1, 1000)
        assert r[TP].error_code == 0 and p.log.high_watermark == 0     # ISR [0] < min.insync.replicas 2
        # Follower 1 at offset 0 (no leader epoch in its fetch: it cannot join the ISR here).
        rm.record_follower_fetch(p, 1, 0, -1)
        assert p.log.high_watermark == 0 and p.isr == [0]
        node.logs.set_topic_config("t", {"min.insync.replicas": 1})
        rm.record_follower_fetch(p, 1, 0, -1)
        assert p.log.high_watermark == 3
        await rm.stop()
    run(go())


def test_a_leader_alone_in_the_isr_moves_the_hw_on_each_append(node):
    """The append path's shortcut for an ISR of the leader alone: the HW follows the log end at
    once, a consumer's long poll wakes, acks=all is answered without waiting; with
    min.insync.replicas above the ISR's size the HW stays (maybe_increment_hw's rule)."""
    async def go():
        rm = ReplicaManager(node)
        rm.loop = asyncio.get_running_loop()
        p = lead(rm, isr=(0,), min_isr=1)
        poll = node.notifier.waiter([TP])
        r = rm.append_records({TP: batch(3)}, 1, 1000)
        assert r[TP].error_code == 0 and r[TP].base_offset == 0
        assert p.log.high_watermark == 3 == p.log.log_end_offset
        assert poll.done()
        r = rm.append_records({TP: batch(2)}, -1, 1000)
        assert isinstance(r, dict) and r[TP].error_code == 0 and r[TP].base_offset == 3
        assert p.log.high_watermark == 5
        poll = node.notifier.waiter([TP])
        p.log.config = LogConfig({**p.log.config.values, "min.insync.replicas": 2})   # as AlterConfigs does
        r = rm.append_records({TP: batch(1)}, 1, 1000)
        assert r[TP].error_code == 0 and r[TP].base_offset == 5
        assert p.log.high_watermark == 5 and p.log.log_end_offset == 6 and not poll.done()
        node.notifier.forget([TP], poll)
        # MessagesInPerSec / BytesInPerSec of the three appends
        assert node.metrics.messages_in == {"t": 6}
        assert node.metrics.bytes_in == {"t": len(batch(3)) + len(batch(2)) + len(batch(1))}
        await rm.stop()
    run(go())
