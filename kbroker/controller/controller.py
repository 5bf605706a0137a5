"""The controller's event loop and state changes (Kafka's KafkaController in ZooKeeper mode, kept small).

Runs on the broker's asyncio loop while this broker holds /controller. ZooKeeper watches only hand an
event to the queue (kazoo's threads never call ZooKeeper); one task takes events in order, reads and
writes ZooKeeper on worker threads (every write a multi-op fenced by /controller_epoch's version and,
for state znodes, the version read), then tells the brokers through their channels:
LeaderAndIsr to the replicas of changed partitions, UpdateMetadata to every live broker.

Partition state machine, as small as correctness allows:
  new (assignment, no state znode) --first live replica leads, ISR = live replicas, epoch 0--> online
  online --leader gone: first live ISR member (unclean: any live replica), epoch+1--> online
         \\--no eligible replica: leader -1, last ISR member kept, epoch+1--> offline
  offline --an ISR member (unclean: any replica) comes back--> online
Replica side: a dead or shutting-down follower leaves the ISR (epoch+1); its return is the
leader's business (ISR expansion).

A broker restart (new czxid) is a failure then a start-up: full UpdateMetadata and LeaderAndIsr for its
replicas. A new term first treats brokers missing from /brokers/ids but present in states as failed.
Deletion: StopReplica(delete) to live replicas (answers awaited, bounded), znodes removed (fenced), then
UpdateMetadata with leader -2, so the name is free once brokers hear of it; replicas on brokers that were
down get StopReplica(delete) when they return (remembered for this controller's term only).
Reassignment (/admin/reassign_partitions): replicas := target + original, epoch+1; once every target
replica is in the ISR: leader from the targets, ISR ∩ targets, replicas := targets, StopReplica(delete)
to the removed; added replicas get LeaderAndIsr with is_new=True (a leftover log there is deleted). A
changed target re-targets a move in progress; a cancel writes the original replicas back (KIP-455 order).
Preferred leader election: ElectLeaders (API 43), /admin/preferred_replica_election, and
auto.leader.rebalance.enable (every leader.imbalance.check.interval.seconds, for brokers above
leader.imbalance.per.broker.percentage).
"""
from __future__ import annotations

import asyncio
import logging

from ..protocol.errors import Errors
from ..zk import layout as L
from ..zk.client import NotControllerError, StaleVersionError
from . import election
from . import requests as broker_requests
from .channel import BrokerChannel
from .context import ControllerContext, LiveBroker

# Events that carry a future the caller awaits (answered None when the event fails).
ANSWERED_EVENTS = ("controlled_shutdown", "elect_leaders", "alter_reassignments", "list_reassignments")


def _scala_list(ids, kind: str = "List") -> str:
    """How Kafka's messages print a Seq/Set of ids: List(1, 2)."""
    return f"{kind}({', '.join(map(str, ids))})"

log = logging.getLogger(__name__)

STOP_REPLICA_WAIT_S = 30.0
CONTROLLED_SHUTDOWN_WAIT_S = 10.0


def _bool(v) -> bool:
    return str(v).strip().lower() == "true"


class Controller:
    """Started by the broker when it wins /controller (``start(epoch)``), stopped when it loses it."""

    def __init__(self, zk, broker_id: int, config_get, metrics=None, inter_broker_listener: str = "PLAINTEXT",
                 security=None):
        self.zk = zk
        self.inter_broker_listener = inter_broker_listener   # which endpoint of each broker the channel uses
        self.security = security                             # and how it connects there (TLS/SASL)
        self.broker_id = broker_id
        self.config_get = config_get          # broker config lookup by Kafka key
        self.metrics = metrics
        self.ctx = ControllerContext()
        self.channels: dict[int, BrokerChannel] = {}
        self.active = False
        self._generation = 0
        self._events: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self.elections = 0                    # leader elections made (LeaderElectionRate)
        self._watched_topics: set[str] = set()   # topic znodes with a data watch in this term

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self, epoch: int) -> None:
        if self.active and self.ctx.epoch == epoch:
            return
        self.stop()
        self._generation += 1
        self.active = True
        self._watched_topics = set()
        self.ctx = ControllerContext(epoch=epoch)
        self._events = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run(self._generation),
                                                            name=f"controller-{self.broker_id}")
        self._events.put_nowait(("startup",))
        log.info("controller %d started (epoch %d)", self.broker_id, epoch)

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        self._generation += 1          # disarms every watch of this term
        if self._task is not None:
            self._task.cancel()
        for ch in self.channels.values():
            ch.stop()
        self.channels.clear()
        log.info("controller %d stopped (epoch %d)", self.broker_id, self.ctx.epoch)

    def offline_partition_count(self) -> int:
        return len(self.ctx.offline_partitions()) if self.active else 0

    # ---- events ---------------------------------------------------------------------------------
    def _post(self, generation, *event) -> None:
        if self.active and generation == self._generation and self._events is not None:
            self._events.put_nowait(event)

    async def elect_leaders(self, parts, unclean: bool):
        """Served for ElectLeaders: ``parts`` [(topic, partition)] or None for all ->
        {tp: (error code, message or None)}."""
        if not self.active:
            return None
        fut = asyncio.get_running_loop().create_future()
        self._events.put_nowait(("elect_leaders", parts, unclean, fut))
        return await fut

    async def controlled_shutdown(self, broker_id: int, broker_epoch: int):
        """Served for the ControlledShutdown handler: -> (error code, [(topic, partition)] remaining)."""
        if not self.active:
            return Errors.NOT_CONTROLLER, []
        fut = asyncio.get_running_loop().create_future()
        self._events.put_nowait(("controlled_shutdown", broker_id, broker_epoch, fut))
        return await fut

    async def alter_reassignments(self, targets: dict):
        """Served for AlterPartitionReassignments: ``targets`` {tp: target replicas, or None to cancel}
        -> {tp: (error code, message or None)}; None when not the controller."""
        return await self._ask("alter_reassignments", targets)

    async def list_reassignments(self, parts):
        """Served for ListPartitionReassignments: ``parts`` [tp] or None for every one ->
        {tp: (replicas, adding, removing)} of those being reassigned; None when not the controller."""
        return await self._ask("list_reassignments", parts)

    async def _ask(self, kind: str, arg):
        if not self.active:
            return None
        fut = asyncio.get_running_loop().create_future()
        self._events.put_nowait((kind, arg, fut))
        return await fut

    async def _run(self, generation) -> None:
        handlers = {
            "startup": self._on_startup, "brokers": self._on_brokers, "topics": self._on_topics,
            "topic_data": self._on_topic_data, "delete": self._on_delete, "isr": self._on_isr_change,
            "preferred": self._on_preferred, "controlled_shutdown": self._on_controlled_shutdown,
            "elect_leaders": self._on_elect_leaders, "rebalance": self._on_rebalance,
            "reassign": self._on_reassign, "alter_reassignments": self._on_alter_reassignments,
            "list_reassignments": self._on_list_reassignments,
        }
        while True:
            event = await self._events.get()
            try:
                await handlers[event[0]](generation, *event[1:])
            except asyncio.CancelledError:
                raise
            except NotControllerError as e:
                log.warning("controller %d fenced: %s", self.broker_id, e)
                self._fail_pending(event)
                self.stop()
                return
            except Exception:
                log.exception("controller event %s failed; retrying in 1s", event[0])
                if event[0] in ANSWERED_EVENTS:
                    self._fail_pending(event)
                else:
                    asyncio.get_running_loop().call_later(1.0, self._post, generation, *event)

    @staticmethod
    def _fail_pending(event) -> None:
        if event[0] == "controlled_shutdown" and not event[-1].done():
            event[-1].set_result((Errors.NOT_CONTROLLER, []))
        elif event[0] in ANSWERED_EVENTS and not event[-1].done():
            event[-1].set_result(None)

    def _watch(self, generation, kind: str, path: str, data: bool = False, arg=None) -> None:
        active = lambda: self.active and generation == self._generation  # noqa: E731
        if data:
            self.zk.watch_data(path, lambda exists: self._post(generation, kind, arg), active)
        else:
            self.zk.watch_children(path, lambda children: self._post(generation, kind), active)

    async def _zk(self, fn, *args):
        return await asyncio.to_thread(fn, *args)

    # ---- start-up -------------------------------------------------------------------------------
    async def _on_startup(self, generation) -> None:
        ctx = self.ctx
        brokers = await self._zk(self.zk.get_live_brokers)
        for bid, (reg, czxid) in brokers.items():
            self._add_broker(reg, czxid)
        names = await self._zk(self.zk.get_topics)
        for name in names:
            await self._load_topic(generation, name)
        for kind, path in (("brokers", L.BROKER_IDS), ("topics", L.BROKER_TOPICS), ("delete", L.DELETE_TOPICS),
                           ("isr", L.ISR_CHANGE_NOTIFICATION)):
            self._watch(generation, kind, path)
        self._watch(generation, "preferred", L.PREFERRED_REPLICA_ELECTION, data=True)
        self._watch(generation, "reassign", L.REASSIGN_PARTITIONS, data=True)
        # Partitions left without a state (their creator died) and partitions without a live leader.
        for name in list(ctx.assignments):
            await self._init_new_partitions(name, send=False)
        # Brokers that died before this term (often with the previous controller) still sit in
        # ISRs and lead partitions: treat them as just failed.
        dead = {r for st, _ in ctx.states.values() for r in [st.leader, *st.isr] if r >= 0} - ctx.live()
        changed = await self._without_dead(dead)
        changed += await self._elect_offline(ctx.offline_partitions())
        for bid in sorted(ctx.brokers):
            self._send_leader_and_isr(ctx.partitions_with_replica(bid), only=bid)
        self._send_update_metadata(list(ctx.states))
        self._start_rebalance_timer(generation)
        log.info("controller %d: %d brokers, %d topics, %d partitions (%d elected at start-up)", self.broker_id,
                 len(ctx.brokers), len(ctx.assignments), len(ctx.states), len(changed))

    async def _load_topic(self, generation, name: str) -> bool:
        from ..zk.client import TopicNotFoundError
        try:
            topic_id, assignment = await self._zk(self.zk.get_topic, name)
        except TopicNotFoundError:
            return False
        states = await self._zk(self.zk.get_partition_states, name, sorted(assignment))
        ctx = self.ctx
        ctx.topic_ids[name] = topic_id
        ctx.assignments[name] = assignment
        for p, sv in states.items():
            ctx.states[(name, p)] = sv
        if name not in self._watched_topics:    # a watch outlives its znode: one per name is enough
            self._watched_topics.add(name)
            self._watch(generation, "topic_data", L.topic_path(name), data=True, arg=name)
        return True

    def _add_broker(self, reg: L.BrokerRegistration, czxid: int) -> None:
        # As Kafka's controller: the endpoint of our own inter-broker listener name (the first one when
        # the broker has no such listener; its channel then fails and retries, as Kafka's would).
        _, host, port = next((e for e in reg.endpoints if e[0] == self.inter_broker_listener), reg.endpoints[0])
        b = LiveBroker(reg.broker_id, host, port, reg.rack, czxid, list(reg.endpoints),
                       dict(reg.security_protocol_map))
        self.ctx.brokers[b.broker_id] = b
        old = self.channels.pop(b.broker_id, None)
        if old is not None:
            old.stop()
        self.channels[b.broker_id] = BrokerChannel(b, self.broker_id, security=self.security)

    # ---- sending ----------------------------------------------------------------------------------
    def _send_leader_and_isr(self, parts, only: int | None = None, is_new=frozenset(),
                             new_replicas: dict | None = None) -> list:
        """LeaderAndIsr for ``parts`` to each of their live replicas (or only to broker ``only``);
        ``is_new``: partitions new on every replica (creation), ``new_replicas``: {tp: brokers}
        added to a partition (reassignment): is_new=True only in the request to those brokers.
        Returns the answers' futures."""
        ctx = self.ctx
        per_broker: dict[int, list] = {}
        for tp in parts:
            if tp not in ctx.states:
                continue
            for r in ctx.replicas(tp):
                if r in ctx.brokers and (only is None or r == only):
                    per_broker.setdefault(r, []).append(tp)
        futs = []
        for bid, tps in per_broker.items():
            fresh = is_new
            if new_replicas:
                fresh = frozenset(is_new) | {tp for tp in tps if bid in new_replicas.get(tp, ())}
            body = broker_requests.leader_and_isr(ctx, self.broker_id, ctx.brokers[bid].epoch, tps, fresh)
            futs.append(self.channels[bid].send(broker_requests.LEADER_AND_ISR, body))
        return futs

    def _send_update_metadata(self, parts, to=None, deleted=None) -> list:
        ctx = self.ctx
        futs = []
        for bid in sorted(ctx.brokers if to is None else to):
            if bid not in ctx.brokers:
                continue
            body = broker_requests.update_metadata(ctx, self.broker_id, ctx.brokers[bid].epoch,
                                                   [tp for tp in parts if tp in ctx.states], deleted)
            futs.append(self.channels[bid].send(broker_requests.UPDATE_METADATA, body))
        return futs

    # ---- writing states -----------------------------------------------------------------------------
    async def _update(self, changes: dict) -> list:
        """``changes``: {tp: new state} computed from ctx.states; CAS write in one fenced multi.
        On a version conflict the moved states are re-read and the caller must plan again:
        returns None then."""
        ctx = self.ctx
        if not changes:
            return []
        updates = {tp: (st, ctx.states[tp][1]) for tp, st in changes.items()}
        try:
            versions = await self._zk(self.zk.update_partition_states, updates)
        except StaleVersionError:
            for t in {t for t, _ in changes}:
                fresh = await self._zk(self.zk.get_partition_states, t, sorted(ctx.assignments.get(t, {})))
                for p, sv in fresh.items():
                    ctx.states[(t, p)] = sv
            return None
        for tp, st in changes.items():
            if st.leader != ctx.states[tp][0].leader and st.leader >= 0:
                self.elections += 1
            ctx.states[tp] = (st, versions[tp])
        return list(changes)

    async def _apply(self, parts, planner) -> list:
        """Plan new states for ``parts`` with ``planner(tp, state) -> state or None`` and write them,
        re-planning after a conflicting write (a leader's ISR change) up to a few times."""
        for _ in range(5):
            changes = {}
            for tp in parts:
                if tp in self.ctx.states:
                    new = planner(tp, self.ctx.states[tp][0])
                    if new is not None:
                        changes[tp] = new
            done = await self._update(changes)
            if done is not None:
                return done
        raise StaleVersionError(f"partition states kept changing under the controller: {sorted(parts)[:5]}")

    def _state(self, leader, isr, old: L.PartitionState) -> L.PartitionState:
        return L.PartitionState(leader=leader, leader_epoch=old.leader_epoch + 1, isr=list(isr),
                                controller_epoch=self.ctx.epoch)

    async def _unclean_allowed(self, topic: str) -> bool:
        overrides = await self._zk(self.zk.get_topic_config, topic)
        if "unclean.leader.election.enable" in overrides:
            return _bool(overrides["unclean.leader.election.enable"])
        return bool(self.config_get("unclean.leader.election.enable"))

    async def _elect_offline(self, parts) -> list:
        """Elect leaders for partitions whose leader is not alive (write, then tell the brokers)."""
        ctx = self.ctx
        if not parts:
            return []
        unclean = {}
        for t in {t for t, _ in parts}:
            if any(not election.offline(ctx.replicas(tp), ctx.states[tp][0].isr, ctx.live())
                   for tp in parts if tp[0] == t and tp in ctx.states):
                unclean[t] = await self._unclean_allowed(t)
        live = ctx.live() - ctx.shutting_down

        def plan(tp, st):
            if st.leader in live:
                return None
            got = election.offline(ctx.replicas(tp), st.isr, live, unclean.get(tp[0], False))
            if got is None:
                if st.leader == election.NO_LEADER:
                    return None          # already offline: nothing to record
                leader, isr = election.without_replica(st.leader, st.isr, st.leader)
                log.warning("%s-%d is offline: no live in-sync replica (isr %s)", tp[0], tp[1], st.isr)
                return self._state(leader, isr, st)
            if got[1] == [got[0]] and got[0] not in st.isr:
                log.warning("unclean leader election for %s-%d: %d (isr was %s)", tp[0], tp[1], got[0], st.isr)
            return self._state(got[0], got[1], st)

        changed = await self._apply(parts, plan)
        self._send_leader_and_isr(changed)
        return changed

    # ---- brokers --------------------------------------------------------------------------------
    async def _on_brokers(self, generation) -> None:
        ctx = self.ctx
        now = await self._zk(self.zk.get_live_brokers)
        gone = [b for b in ctx.brokers if b not in now]
        bounced = [b for b, (_, czxid) in now.items() if b in ctx.brokers and ctx.brokers[b].epoch != czxid]
        new = [b for b in now if b not in ctx.brokers]
        if not (gone or bounced or new):
            return
        log.info("controller %d: brokers gone %s, restarted %s, new %s", self.broker_id, gone, bounced, new)
        if gone or bounced:
            await self._on_broker_failure(gone + bounced)
        if new or bounced:
            for b in new + bounced:
                self._add_broker(now[b][0], now[b][1])
            await self._on_broker_startup(new + bounced)
        await self._advance_reassignments()

    async def _on_broker_failure(self, dead) -> None:
        ctx = self.ctx
        for b in dead:
            ctx.brokers.pop(b, None)
            ctx.shutting_down.discard(b)
            ch = self.channels.pop(b, None)
            if ch is not None:
                ch.stop()
        changed = await self._without_dead(set(dead))
        # Everyone learns the new broker list, even when no partition changed.
        self._send_update_metadata(changed)

    async def _without_dead(self, dead: set) -> list:
        """Partitions led by ``dead`` brokers get new leaders; dead followers leave ISRs (epoch+1
        each). LeaderAndIsr goes out; returns the changed partitions for UpdateMetadata."""
        ctx = self.ctx
        affected = [tp for tp, (st, _) in ctx.states.items() if st.leader in dead or dead & set(st.isr)]
        led = [tp for tp in affected if ctx.states[tp][0].leader in dead]
        changed = await self._elect_offline(led)

        def drop_followers(tp, st):
            if st.leader in dead or not dead & set(st.isr):
                return None
            isr = [r for r in st.isr if r not in dead] or st.isr
            return self._state(st.leader, isr, st) if isr != st.isr else None

        shrunk = await self._apply([tp for tp in affected if tp not in led], drop_followers)
        self._send_leader_and_isr(shrunk)
        return changed + shrunk

    async def _on_broker_startup(self, new) -> None:
        ctx = self.ctx
        others = [b for b in ctx.brokers if b not in new]
        self._send_update_metadata([], to=others)                 # the new broker list
        self._send_update_metadata(list(ctx.states), to=new)      # everything, to the newcomers
        for b in new:
            self._send_leader_and_isr(ctx.partitions_with_replica(b), only=b)
            # Replicas of topics deleted while it was down (unless the name was taken again:
            # then the new topic's id tells its replica manager the old log is stale).
            stray = sorted(tp for tp in ctx.stray.pop(b, ()) if tp[0] not in ctx.assignments)
            if stray:
                body = broker_requests.stop_replica(ctx, self.broker_id, ctx.brokers[b].epoch, stray, delete=True)
                self.channels[b].send(broker_requests.STOP_REPLICA, body)
                log.info("controller %d: deleting %d replicas of deleted topics on returning broker %d",
                         self.broker_id, len(stray), b)
        for name in list(ctx.assignments):
            await self._init_new_partitions(name)
        changed = await self._elect_offline(ctx.offline_partitions())
        if changed:
            self._send_update_metadata(changed)

    # ---- topics ---------------------------------------------------------------------------------
    async def _on_topics(self, generation) -> None:
        ctx = self.ctx
        names = set(await self._zk(self.zk.get_topics))
        for name in sorted(names - set(ctx.assignments)):
            if await self._load_topic(generation, name):
                log.info("controller %d: new topic %s", self.broker_id, name)
                created = await self._init_new_partitions(name, send=False)
                # States written by someone else (a tool, an older controller) are announced too.
                parts = [(name, p) for p in sorted(ctx.assignments[name]) if (name, p) in ctx.states]
                self._send_leader_and_isr(parts, is_new=frozenset(created))
                self._send_update_metadata(parts)
        gone = sorted(set(ctx.assignments) - names)
        if gone:   # removed from ZooKeeper behind the controller's back: brokers drop it too
            deleted = {}
            for name in gone:
                deleted.update({(name, p): (r, ctx.topic_ids.get(name)) for p, r in ctx.assignments[name].items()})
                ctx.remove_topic(name)
            self._send_update_metadata([], deleted=deleted)

    async def _on_topic_data(self, generation, name) -> None:
        ctx = self.ctx
        if name not in ctx.assignments:
            return
        from ..zk.client import TopicNotFoundError
        try:
            topic_id, assignment = await self._zk(self.zk.get_topic, name)
        except TopicNotFoundError:
            return     # the children watch handles a deletion
        if topic_id != ctx.topic_ids.get(name):
            # Deleted and recreated behind our back (the children watch may have seen no change):
            # brokers drop the old topic, then it is taken in as a new one.
            old = ctx.assignments[name]
            deleted = {(name, p): (r, ctx.topic_ids.get(name)) for p, r in old.items()}
            ctx.remove_topic(name)
            self._send_update_metadata([], deleted=deleted)
            await self._on_topics(generation)
            return
        added = {p: r for p, r in assignment.items() if p not in ctx.assignments[name]}
        if added:
            ctx.assignments[name] = {**ctx.assignments[name], **added}
            log.info("controller %d: topic %s gained partitions %s", self.broker_id, name, sorted(added))
            await self._init_new_partitions(name)

    async def _init_new_partitions(self, name: str, send: bool = True) -> list:
        """Create state znodes for partitions of ``name`` that have none and a live replica."""
        ctx = self.ctx
        live = ctx.live() - ctx.shutting_down
        states = {}
        for p, replicas in sorted(ctx.assignments.get(name, {}).items()):
            if (name, p) in ctx.states:
                continue
            alive = [r for r in replicas if r in live]
            if not alive:
                log.warning("%s-%d has no live replica (%s): left without a leader", name, p, replicas)
                continue
            states[p] = L.PartitionState(leader=alive[0], leader_epoch=0, isr=alive, controller_epoch=ctx.epoch)
        if not states:
            return []
        try:
            versions = await self._zk(self.zk.create_partition_states, name, states)
        except StaleVersionError:
            # Someone (an older controller, a tool) created them meanwhile: take what is there.
            fresh = await self._zk(self.zk.get_partition_states, name, sorted(states))
            for p, sv in fresh.items():
                ctx.states[(name, p)] = sv
            return await self._init_new_partitions(name, send)
        created = []
        for p, st in states.items():
            ctx.states[(name, p)] = (st, versions[p])
            created.append((name, p))
        self.elections += len(created)
        if send:
            self._send_leader_and_isr(created, is_new=frozenset(created))
            self._send_update_metadata(created)
        return created

    async def _on_delete(self, generation) -> None:
        ctx = self.ctx
        marked = await self._zk(self.zk.get_topic_deletions)
        for name in marked:
            if not self.config_get("delete.topic.enable"):
                log.warning("topic %s marked for deletion but delete.topic.enable=false; unmarked", name)
                await self._zk(self.zk.remove_topic_deletion, name)
                continue
            if name not in ctx.assignments:
                if not await self._load_topic(generation, name):
                    await self._zk(self.zk.remove_topic_deletion, name)
                    continue
            await self._delete_topic(name)

    async def _delete_topic(self, name: str) -> None:
        from ..zk.client import TopicNotFoundError
        ctx = self.ctx
        assignment = ctx.assignments[name]
        topic_id = ctx.topic_ids.get(name)
        # 1. Replicas stop and delete their logs (live ones; we wait for their answers, bounded).
        futs = []
        for bid in sorted(ctx.brokers):
            parts = [(name, p) for p, r in assignment.items() if bid in r]
            if parts:
                body = broker_requests.stop_replica(ctx, self.broker_id, ctx.brokers[bid].epoch, parts, delete=True)
                futs.append(self.channels[bid].send(broker_requests.STOP_REPLICA, body))
        if futs:
            await asyncio.wait(futs, timeout=STOP_REPLICA_WAIT_S)
        for p, replicas in assignment.items():
            for r in replicas:
                if r not in ctx.brokers:
                    ctx.stray.setdefault(r, set()).add((name, p))
        # 2. The znodes go (fenced), so the name is free the moment brokers hear of the deletion.
        try:
            await self._zk(self.zk.delete_topic, name)
        except TopicNotFoundError:
            await self._zk(self.zk.remove_topic_deletion, name)
        ctx.remove_topic(name)
        # 3. Every broker drops it from its metadata (leader -2).
        self._send_update_metadata([], deleted={(name, p): (r, topic_id) for p, r in assignment.items()})
        log.info("controller %d: deleted topic %s", self.broker_id, name)

    # ---- ISR changes made by leaders ----------------------------------------------------------
    async def _on_isr_change(self, generation) -> None:
        ctx = self.ctx
        notes = await self._zk(self.zk.read_partition_list_children, L.ISR_CHANGE_NOTIFICATION)
        if not notes:
            return
        parts = sorted({tp for lst in notes.values() for tp in lst if tp[0] in ctx.assignments})
        for t in {t for t, _ in parts}:
            fresh = await self._zk(self.zk.get_partition_states, t, sorted({p for tt, p in parts if tt == t}))
            for p, sv in fresh.items():
                ctx.states[(t, p)] = sv
        self._send_update_metadata(parts)
        await self._zk(self.zk.delete_nodes, [f"{L.ISR_CHANGE_NOTIFICATION}/{c}" for c in notes])
        await self._advance_reassignments()

    # ---- partition reassignment (/admin/reassign_partitions) --------------------------------------
    # Kafka's steps, kept small: 1. replicas := target + original (adding/removing recorded in the
    # topic znode), leader epoch+1 so every replica hears of it; 2. when every target replica is in
    # the ISR: leader from the target set, ISR ∩ target, replicas := target, StopReplica(delete) to
    # the removed ones; 3. the partition leaves the request znode (deleted once empty).
    async def _on_reassign(self, generation, _arg=None) -> None:
        ctx = self.ctx
        got = await self._zk(self.zk.get_reassignments)
        if got is None:
            return
        refused = []
        for t, p, target in got[0]:
            tp = (t, p)
            if ctx.reassigning.get(tp) == list(target):
                continue
            if tp in ctx.reassigning:
                # A new target for a move in progress; --cancel writes the original replicas
                # (KIP-455): the added replicas leave at completion, which is at once when the
                # original ones are still in the ISR.
                log.info("controller %d: reassignment of %s-%d now targets %s (was %s)", self.broker_id,
                         t, p, target, ctx.reassigning[tp])
            if tp not in ctx.states or not target or len(set(target)) != len(target):
                log.warning("reassignment of %s-%d to %s refused: unknown partition or bad replica list",
                            t, p, target)
                refused.append(tp)
            elif any(r not in ctx.brokers for r in target):
                log.warning("reassignment of %s-%d to %s refused: not every target broker is alive", t, p, target)
                refused.append(tp)
            else:
                await self._start_reassignment(tp, target)
        await self._advance_reassignments(refused)

    async def _start_reassignment(self, tp, target) -> None:
        ctx = self.ctx
        current = ctx.replicas(tp)
        ctx.reassigning[tp] = list(target)
        full = list(target) + [r for r in current if r not in target]
        if full == current:
            return      # resumed after a controller change, or nothing to add
        added = [r for r in target if r not in current]
        await self._write_assignment(tp[0], {tp[1]: full}, {tp[1]: added},
                                     {tp[1]: [r for r in current if r not in target]})
        changed = await self._apply([tp], lambda _tp, st: self._state(st.leader, st.isr, st))
        # The added replicas hear is_new=True: they start with an empty log.
        self._send_leader_and_isr(changed, new_replicas={tp: set(added)})
        self._send_update_metadata(changed)
        log.info("controller %d: reassigning %s-%d from %s to %s", self.broker_id, tp[0], tp[1], current, target)

    async def _write_assignment(self, topic, parts, adding, removing) -> None:
        a, version = await self._zk(self.zk.get_topic_assignment, topic)
        keep = lambda m: {p: r for p, r in m.items() if p not in parts}   # noqa: E731
        new = L.TopicAssignment(a.topic_id, {**a.partitions, **parts},
                                {**keep(a.adding_replicas), **{p: r for p, r in adding.items() if r}},
                                {**keep(a.removing_replicas), **{p: r for p, r in removing.items() if r}})
        await self._zk(self.zk.set_topic_assignment, topic, new, version)
        self.ctx.assignments[topic] = dict(new.partitions)

    async def _advance_reassignments(self, finished=()) -> None:
        ctx = self.ctx
        done = list(finished)
        for tp, target in list(ctx.reassigning.items()):
            if tp not in ctx.states:            # the topic went away meanwhile
                del ctx.reassigning[tp]
                done.append(tp)
                continue
            if not all(r in ctx.states[tp][0].isr for r in target):
                continue                        # the new replicas are still catching up
            live = ctx.live() - ctx.shutting_down

            def plan(_tp, st):
                isr = [r for r in st.isr if r in target]
                leader = st.leader
                if leader not in target or leader not in live:
                    candidates = [r for r in target if r in isr and r in live]
                    if not candidates:
                        return None
                    leader = candidates[0]
                return self._state(leader, isr, st)

            if not await self._apply([tp], plan):
                continue
            removed = [r for r in ctx.replicas(tp) if r not in target]
            await self._write_assignment(tp[0], {tp[1]: list(target)}, {}, {})
            self._send_leader_and_isr([tp])
            for r in removed:
                if r in ctx.brokers:
                    body = broker_requests.stop_replica(ctx, self.broker_id, ctx.brokers[r].epoch, [tp], delete=True)
                    self.channels[r].send(broker_requests.STOP_REPLICA, body)
            self._send_update_metadata([tp])
            del ctx.reassigning[tp]
            done.append(tp)
            log.info("controller %d: reassignment of %s-%d to %s completed", self.broker_id, tp[0], tp[1], target)
        if done:
            got = await self._zk(self.zk.get_reassignments)
            if got is not None:
                keep = [e for e in got[0] if (e[0], e[1]) not in set(done)]
                try:
                    await self._zk(self.zk.set_reassignments, keep, got[1])
                except StaleVersionError:
                    pass    # rewritten meanwhile: its watch brings us back here

    # ---- reassignment through the API (AlterPartitionReassignments / List...) ---------------------
    # As Kafka's ZooKeeper-mode controller: the target is validated (not empty, no duplicates, no
    # negative id, every added replica alive), None cancels (back to the original replicas: the full
    # list minus the adding ones), the latest request replaces a /admin/reassign_partitions entry of
    # the same partition, and the move then runs as one started from that znode.
    async def _topic_assignments(self, topics) -> dict:
        out = {}
        for t in sorted(topics):
            if t in self.ctx.assignments:
                out[t] = (await self._zk(self.zk.get_topic_assignment, t))[0]
        return out

    def _check_target(self, target, origin) -> tuple[int, str] | None:
        if not target:
            return Errors.INVALID_REPLICA_ASSIGNMENT, "Empty replica list specified in partition reassignment."
        if len(set(target)) != len(target):
            return (Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"Duplicate replica ids in partition reassignment replica list: {_scala_list(target)}")
        if any(r < 0 for r in target):
            return Errors.INVALID_REPLICA_ASSIGNMENT, f"Invalid broker id in replica list: {_scala_list(target)}"
        adding = [r for r in target if r not in origin]
        live = self.ctx.live() - self.ctx.shutting_down
        if not set(adding) <= live:
            return (Errors.INVALID_REPLICA_ASSIGNMENT, "Replica assignment has brokers that are not alive. "
                    f"Replica list: {_scala_list(adding)}, live broker list: {_scala_list(sorted(live), 'Set')}")
        return None

    async def _on_alter_reassignments(self, generation, targets, fut) -> None:
        ctx = self.ctx
        assignments = await self._topic_assignments({t for t, _ in targets})
        results, start = {}, {}
        for tp, target in targets.items():
            a = assignments.get(tp[0])
            full = ctx.replicas(tp)
            adding = a.adding_replicas.get(tp[1], []) if a is not None else []
            removing = a.removing_replicas.get(tp[1], []) if a is not None else []
            origin = [r for r in full if r not in adding]
            err = self._check_target(target, origin) if target is not None else None
            if err is not None:
                results[tp] = err
            elif target is None and not (adding or removing):
                results[tp] = (Errors.NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress.")
            elif not full:
                results[tp] = (Errors.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")
            else:
                start[tp] = list(target) if target is not None else origin
        if start:
            await self._drop_znode_reassignments(set(start))
        for tp, target in start.items():
            await self._start_reassignment(tp, target)
            results[tp] = (Errors.NONE, None)
        if start:
            await self._advance_reassignments()
        fut.set_result(results)

    async def _drop_znode_reassignments(self, parts: set) -> None:
        while True:
            got = await self._zk(self.zk.get_reassignments)
            if got is None or not any((t, p) in parts for t, p, _ in got[0]):
                return
            try:
                await self._zk(self.zk.set_reassignments, [e for e in got[0] if (e[0], e[1]) not in parts], got[1])
                return
            except StaleVersionError:
                continue        # rewritten meanwhile: read it again

    async def _on_list_reassignments(self, generation, parts, fut) -> None:
        wanted = sorted(self.ctx.reassigning) if parts is None else list(parts)
        assignments = await self._topic_assignments({t for t, _ in wanted})
        out = {}
        for t, p in wanted:
            a = assignments.get(t)
            if a is None or p not in a.partitions:
                continue
            adding, removing = a.adding_replicas.get(p, []), a.removing_replicas.get(p, [])
            if adding or removing:
                out[(t, p)] = (list(a.partitions[p]), list(adding), list(removing))
        fut.set_result(out)

    # ---- preferred replica election ------------------------------------------------------------
    async def _on_preferred(self, generation, _arg=None) -> None:
        ctx = self.ctx
        parts = await self._zk(self.zk.read_partition_list, L.PREFERRED_REPLICA_ELECTION)
        if parts is None:
            return
        changed = await self.elect_preferred([tp for tp in parts if tp in ctx.states])
        log.info("controller %d: preferred replica election moved %d partitions", self.broker_id, len(changed))
        await self._zk(self.zk.delete_nodes, [L.PREFERRED_REPLICA_ELECTION])

    async def elect_preferred(self, parts) -> list:
        ctx = self.ctx
        live = ctx.live() - ctx.shutting_down

        def plan(tp, st):
            got = election.preferred(ctx.replicas(tp), st.isr, live)
            if got is None or got[0] == st.leader:
                return None
            return self._state(got[0], got[1], st)

        changed = await self._apply(parts, plan)
        self._send_leader_and_isr(changed)
        self._send_update_metadata(changed)
        return changed

    async def _on_elect_leaders(self, generation, parts, unclean, fut) -> None:
        ctx = self.ctx
        wanted = sorted(ctx.states) if parts is None else sorted(set(parts))
        results = {tp: (Errors.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")
                   for tp in wanted if tp not in ctx.states}
        known = [tp for tp in wanted if tp in ctx.states]
        if unclean:
            # Only leaderless partitions need (and get) an election, any live replica allowed.
            live = ctx.live() - ctx.shutting_down
            need = [tp for tp in known if ctx.states[tp][0].leader not in live]

            def plan(tp, st):
                got = election.offline(ctx.replicas(tp), st.isr, live, unclean=True)
                return None if got is None else self._state(got[0], got[1], st)

            changed = await self._apply(need, plan)
            self._send_leader_and_isr(changed)
            self._send_update_metadata(changed)
        else:
            need = known
            changed = await self.elect_preferred(known)
        for tp in known:
            st = ctx.states[tp][0]
            if tp in changed:
                results[tp] = (0, None)
            elif tp not in need or (not unclean and st.leader == ctx.replicas(tp)[0]):
                results[tp] = (Errors.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")
            elif unclean:
                results[tp] = (Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE, "No live replica to lead.")
            else:
                results[tp] = (Errors.PREFERRED_LEADER_NOT_AVAILABLE,
                               f"Failed to elect leader for partition {tp[0]}-{tp[1]} under strategy "
                               f"PreferredReplicaPartitionLeaderElectionStrategy")
        fut.set_result(results)

    # ---- automatic preferred-leader rebalancing (auto.leader.rebalance.enable) -------------------
    def _start_rebalance_timer(self, generation) -> None:
        if not self.config_get("auto.leader.rebalance.enable"):
            return
        interval = self.config_get("leader.imbalance.check.interval.seconds")
        loop = asyncio.get_running_loop()

        def tick():
            if self.active and generation == self._generation:
                self._post(generation, "rebalance")
                loop.call_later(interval, tick)

        loop.call_later(interval, tick)

    async def _on_rebalance(self, generation) -> None:
        """Kafka's checkAndTriggerAutoLeaderRebalance: per preferred broker, the share of its
        partitions it does not lead; above leader.imbalance.per.broker.percentage, give them back."""
        ctx = self.ctx
        limit = self.config_get("leader.imbalance.per.broker.percentage") / 100
        by_preferred: dict[int, list] = {}
        for tp, (st, _) in ctx.states.items():
            replicas = ctx.replicas(tp)
            if replicas:
                by_preferred.setdefault(replicas[0], []).append(tp)
        todo = []
        for b, tps in by_preferred.items():
            if b not in ctx.brokers or b in ctx.shutting_down:
                continue
            imbalanced = [tp for tp in tps if ctx.states[tp][0].leader != b]
            if imbalanced and len(imbalanced) / len(tps) > limit:
                todo += imbalanced
        if todo:
            changed = await self.elect_preferred(todo)
            log.info("controller %d: auto leader rebalance moved %d of %d partitions", self.broker_id,
                     len(changed), len(todo))

    # ---- controlled shutdown -----------------------------------------------------------------------
    async def _on_controlled_shutdown(self, generation, broker_id, broker_epoch, fut) -> None:
        ctx = self.ctx
        b = ctx.brokers.get(broker_id)
        if b is None:
            fut.set_result((Errors.BROKER_NOT_AVAILABLE, []))
            return
        if broker_epoch != -1 and broker_epoch != b.epoch:
            fut.set_result((Errors.STALE_BROKER_EPOCH, []))
            return
        ctx.shutting_down.add(broker_id)
        live = ctx.live() - ctx.shutting_down
        mine = [tp for tp in ctx.partitions_with_replica(broker_id) if tp in ctx.states]

        def plan(tp, st):
            replicas = ctx.replicas(tp)
            if len(replicas) <= 1:
                return None
            if st.leader == broker_id:
                got = election.controlled_shutdown(replicas, st.isr, live, ctx.shutting_down)
                return None if got is None else self._state(got[0], got[1], st)
            if broker_id in st.isr and len(st.isr) > 1:
                return self._state(st.leader, [r for r in st.isr if r != broker_id], st)
            return None

        changed = await self._apply(mine, plan)
        futs = self._send_leader_and_isr(changed)
        followers = [tp for tp in mine if ctx.states[tp][0].leader != broker_id]
        if followers:
            body = broker_requests.stop_replica(ctx, self.broker_id, b.epoch, followers, delete=False)
            self.channels[broker_id].send(broker_requests.STOP_REPLICA, body)
        futs += self._send_update_metadata(changed)
        # Answer once the new leaders lead (bounded): the stopping broker closes its listener next,
        # and, when it is this controller's broker, its channels go with it.
        if futs:
            await asyncio.wait(futs, timeout=CONTROLLED_SHUTDOWN_WAIT_S)
        remaining = sorted(tp for tp in ctx.partitions_led_by(broker_id) if len(ctx.replicas(tp)) > 1)
        log.info("controller %d: controlled shutdown of broker %d moved %d partitions, %d remain",
                 self.broker_id, broker_id, len(changed), len(remaining))
        fut.set_result((0, remaining))
