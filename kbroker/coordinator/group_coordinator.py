"""GroupCoordinator: the classic group protocol (eager and cooperative rebalancing are both the
client's business; the coordinator only runs generations) and committed offsets.

Ownership: this broker coordinates the groups of the ``__consumer_offsets`` partitions it leads.
A periodic reconcile (and any request for such a group) loads a newly led partition from its log
(COORDINATOR_LOAD_IN_PROGRESS meanwhile) and unloads partitions it no longer leads (their pending
requests get NOT_COORDINATOR). Everything runs on the broker's asyncio loop; timers (sessions,
rebalance, pending member ids) are ``loop.call_later`` handles, never threads.

JoinGroup and SyncGroup answers are futures the handlers await (long polls); the network layer keeps
the responses of one connection in request order.
"""
from __future__ import annotations

import asyncio
import logging
import uuid

from ..protocol.errors import Errors
from . import records as consumer_offsets
from .ownership import PartitionLoader, periodic
from .group import (COMPLETING_REBALANCE, DEAD, EMPTY, PREPARING_REBALANCE, STABLE, Group, Member,
                    OffsetEntry)
from .store import OFFSETS_TOPIC, OffsetsStore

log = logging.getLogger(__name__)

E = Errors


def java_string_hash(s: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions   # Kafka's Utils.abs


class GroupCoordinator:
    def __init__(self, broker):
        self.broker = broker
        self.store = OffsetsStore(broker)
        self.groups: dict[str, Group] = {}
        self.owned = PartitionLoader(broker, OFFSETS_TOPIC, self.store, "offsets.load.buffer.size", "groups",
                                     self._read_record, self._install, self._drop_partition,
                                     consumer_offsets.RecordFormatError)
        self.partitions = self.owned.partitions       # {partition: LoadedPartition}, keys: its group ids
        self._tasks: list[asyncio.Task] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    # ---- configuration ---------------------------------------------------------------------------
    def _cfg(self, key):
        return self.broker.config.get(key)

    def now_ms(self) -> int:
        return self.broker.now_ms()

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self.loop is not None:
            return
        self.loop = self.owned.loop = asyncio.get_running_loop()
        self._tasks.append(self.loop.create_task(periodic(1.0, self.reconcile, "group coordinator")))
        interval = self._cfg("offsets.retention.check.interval.ms") / 1000
        self._tasks.append(self.loop.create_task(periodic(interval, self.expire_offsets, "group coordinator")))

    def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        self._tasks.clear()
        self.owned.unload_all()

    def _ensure_started(self) -> None:
        if self.loop is None:
            self.start()

    # ---- partition ownership -----------------------------------------------------------------------
    def reconcile(self) -> None:
        self.owned.reconcile()

    def _read_record(self, groups: dict, key, value, pending_pid: int) -> None:
        """Fold one ``__consumer_offsets`` record into ``groups`` {group id: Group} while loading."""
        k = consumer_offsets.decode_key(key)
        if k[0] == "offset":
            _, gid, topic, part = k
            g = groups.get(gid) or groups.setdefault(gid, Group(gid))
            if pending_pid >= 0:
                if value is not None:
                    v = consumer_offsets.decode_offset_value(value)
                    g.pending_txn_offsets.setdefault(pending_pid, {})[(topic, part)] = OffsetEntry(
                        v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp)
            elif value is None:
                g.offsets.pop((topic, part), None)
            else:
                v = consumer_offsets.decode_offset_value(value)
                g.offsets[(topic, part)] = OffsetEntry(v.offset, v.leader_epoch, v.metadata,
                                                       v.commit_timestamp, v.expire_timestamp)
        else:
            gid = k[1]
            if value is None:
                old = groups.pop(gid, None)
                if old is not None and old.offsets:
                    # offsets written after the group tombstone stay (standalone commits)
                    fresh = groups[gid] = Group(gid)
                    fresh.offsets = old.offsets
                return
            g = groups.get(gid) or groups.setdefault(gid, Group(gid))
            self._apply_group_value(g, consumer_offsets.decode_group_value(value))

    def _install(self, ps, groups: dict) -> None:
        for gid, g in groups.items():
            if not g.members and not g.offsets and not g.pending_txn_offsets and g.protocol_type is None:
                continue
            self.groups[gid] = g
            ps.keys.add(gid)
            for m in g.members.values():
                self._schedule_heartbeat(g, m)

    def _apply_group_value(self, g: Group, v: consumer_offsets.GroupValue) -> None:
        for m in g.members.values():
            self._cancel(m.heartbeat_handle)
        g.protocol_type = v.protocol_type or None
        g.generation = v.generation
        g.protocol_name = v.protocol
        g.leader_id = v.leader
        g.members = {}
        g.static_members = {}
        for mv in v.members:
            m = Member(mv.member_id, mv.group_instance_id, mv.client_id, mv.client_host,
                       mv.rebalance_timeout, mv.session_timeout, g.protocol_type or "",
                       [(v.protocol or "", mv.subscription)], mv.assignment, is_new=False)
            g.members[m.member_id] = m
            if m.group_instance_id is not None:
                g.static_members[m.group_instance_id] = m.member_id
        g.transition(STABLE if g.members else EMPTY, v.current_state_timestamp)

    def _unload(self, p: int) -> None:
        self.owned.unload(p)

    def _drop_partition(self, ps) -> None:
        """An unloaded partition's groups: timers cancelled, waiting joins and syncs answered NOT_COORDINATOR."""
        for gid in ps.keys:
            g = self.groups.pop(gid, None)
            if g is None:
                continue
            self._cancel(g.rebalance_handle)
            for h in g.pending_members.values():
                self._cancel(h)
            for m in g.members.values():
                self._cancel(m.heartbeat_handle)
                if m.awaiting_join():
                    m.join_future.set_result(self._join_error(E.NOT_COORDINATOR, m.member_id))
                if m.awaiting_sync():
                    m.sync_future.set_result(_sync_result(E.NOT_COORDINATOR))
            g.state = DEAD

    def _partition_of(self, group_id: str) -> tuple[int, int]:
        """(error code, offsets partition) for coordinating ``group_id`` here."""
        self._ensure_started()
        t = self.broker.metadata.topics.get(OFFSETS_TOPIC)
        if t is None or not t.partitions:
            return int(E.COORDINATOR_NOT_AVAILABLE), -1
        p = partition_for(group_id, len(t.partitions))
        err, _ps = self.owned.owner(p)
        return err, p

    def _get_or_create(self, group_id: str, p: int) -> Group:
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id, state_timestamp=self.now_ms())
            self.partitions[p].keys.add(group_id)
        return g

    def _drop_group(self, g: Group) -> None:
        g.state = DEAD
        if self.groups.get(g.group_id) is g:
            del self.groups[g.group_id]
        for ps in self.partitions.values():
            ps.keys.discard(g.group_id)

    # ---- timers ------------------------------------------------------------------------------------
    @staticmethod
    def _cancel(handle) -> None:
        if handle is not None:
            handle.cancel()

    def _schedule_heartbeat(self, g: Group, m: Member) -> None:
        self._cancel(m.heartbeat_handle)
        m.heartbeat_handle = self.loop.call_later(m.session_timeout_ms / 1000, self._session_expired, g, m)

    def _session_expired(self, g: Group, m: Member) -> None:
        m.heartbeat_handle = None
        if g.members.get(m.member_id) is not m or g.state == DEAD:
            return
        if m.awaiting_join() or m.awaiting_sync():
            self._schedule_heartbeat(g, m)   # waiting on us, not on the client: keep it alive
            return
        log.info("member %s of group %s failed (session timeout %d ms)", m.member_id, g.group_id,
                 m.session_timeout_ms)
        self._remove_member(g, m)

    def _pending_expired(self, g: Group, member_id: str) -> None:
        if g.pending_members.pop(member_id, None) is not None and g.state == PREPARING_REBALANCE:
            self._try_complete_join(g)

    # ---- rebalance ---------------------------------------------------------------------------------
    def _prepare_rebalance(self, g: Group, reason: str) -> None:
        if g.state == COMPLETING_REBALANCE:
            for m in g.members.values():
                m.assignment = b""
            self._propagate_sync(g, E.REBALANCE_IN_PROGRESS)
        self._cancel(g.rebalance_handle)
        delay = self._cfg("group.initial.rebalance.delay.ms")
        if g.state == EMPTY and delay > 0:
            g.initial_delay = True
            g.new_member_added = False
            remaining = max(g.max_rebalance_timeout_ms() - delay, 0)
            g.rebalance_handle = self.loop.call_later(delay / 1000, self._initial_delay_done, g, delay, remaining)
        else:
            g.initial_delay = False
            g.rebalance_handle = self.loop.call_later(g.max_rebalance_timeout_ms() / 1000, self._complete_join, g)
        g.transition(PREPARING_REBALANCE, self.now_ms())
        log.info("preparing to rebalance group %s in generation %d (%s)", g.group_id, g.generation, reason)
        self._try_complete_join(g)   # everyone may already be waiting (e.g. the last other member left)

    def _initial_delay_done(self, g: Group, delay: int, remaining: int) -> None:
        g.rebalance_handle = None
        if g.new_member_added and remaining > 0:
            g.new_member_added = False
            step = min(delay, remaining)
            g.rebalance_handle = self.loop.call_later(step / 1000, self._initial_delay_done, g, delay,
                                                      remaining - step)
            return
        g.initial_delay = False
        self._complete_join(g)

    def _try_complete_join(self, g: Group) -> None:
        if g.state == PREPARING_REBALANCE and not g.initial_delay and g.all_joined():
            self._complete_join(g)

    def _complete_join(self, g: Group) -> None:
        if g.state != PREPARING_REBALANCE:
            return
        self._cancel(g.rebalance_handle)
        g.rebalance_handle = None
        g.initial_delay = False
        # Dynamic members that did not rejoin in time are gone; static ones stay until their
        # session times out.
        for m in list(g.members.values()):
            if not m.awaiting_join() and m.group_instance_id is None:
                self._remove_member(g, m, rebalance=False)
        g.generation += 1
        now = self.now_ms()
        if not g.members:
            g.protocol_name = None
            g.leader_id = None
            g.transition(EMPTY, now)
            log.info("group %s is empty in generation %d", g.group_id, g.generation)
            self.loop.create_task(self._store_group(g, {}))
            return
        g.protocol_name = g.select_protocol()
        g.transition(COMPLETING_REBALANCE, now)
        leader = g.members.get(g.leader_id)
        if leader is None or not leader.awaiting_join():
            joined = [m for m in g.members.values() if m.awaiting_join()]
            g.leader_id = (joined[0] if joined else next(iter(g.members.values()))).member_id
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", g.group_id, g.generation,
                 len(g.members), g.protocol_name, g.leader_id)
        for m in g.members.values():
            if m.awaiting_join():
                m.join_future.set_result(self._join_result(g, m))
                m.join_future = None
                m.is_new = False
            self._schedule_heartbeat(g, m)

    def _join_result(self, g: Group, m: Member) -> dict:
        members = []
        if m.member_id == g.leader_id:
            members = [{"member_id": x.member_id, "group_instance_id": x.group_instance_id,
                        "metadata": x.metadata_for(g.protocol_name)} for x in g.members.values()]
        return {"throttle_time_ms": 0, "error_code": 0, "generation_id": g.generation,
                "protocol_type": g.protocol_type, "protocol_name": g.protocol_name, "leader": g.leader_id or "",
                "skip_assignment": False, "member_id": m.member_id, "members": members}

    @staticmethod
    def _join_error(code, member_id="") -> dict:
        return {"throttle_time_ms": 0, "error_code": int(code), "generation_id": -1, "protocol_type": None,
                "protocol_name": None, "leader": "", "skip_assignment": False, "member_id": member_id,
                "members": []}

    def _propagate_sync(self, g: Group, code) -> None:
        for m in g.members.values():
            if m.awaiting_sync():
                m.sync_future.set_result(_sync_result(code, m.assignment if not code else b"", g))
                m.sync_future = None
                self._schedule_heartbeat(g, m)

    def _remove_member(self, g: Group, m: Member, rebalance: bool = True, code=E.UNKNOWN_MEMBER_ID) -> None:
        self._cancel(m.heartbeat_handle)
        m.heartbeat_handle = None
        if m.awaiting_join():
            m.join_future.set_result(self._join_error(code, m.member_id))
        if m.awaiting_sync():
            m.sync_future.set_result(_sync_result(code))
        g.members.pop(m.member_id, None)
        if m.group_instance_id is not None and g.static_members.get(m.group_instance_id) == m.member_id:
            del g.static_members[m.group_instance_id]
        if g.leader_id == m.member_id:
            g.leader_id = next(iter(g.members), None)
        if not rebalance:
            return
        if g.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(g, f"removing member {m.member_id}")
        elif g.state == PREPARING_REBALANCE:
            self._try_complete_join(g)

    def _add_member_and_rebalance(self, g: Group, m: Member) -> asyncio.Future:
        fut = m.join_future = self.loop.create_future()
        if not g.members:
            g.protocol_type = m.protocol_type   # the first member of an empty group sets the type
        g.members[m.member_id] = m
        if m.group_instance_id is not None:
            g.static_members[m.group_instance_id] = m.member_id
        if g.leader_id is None:
            g.leader_id = m.member_id
        g.new_member_added = True
        self._schedule_heartbeat(g, m)
        self._update_and_rebalance(g, f"adding member {m.member_id}")
        return fut

    def _update_and_rebalance(self, g: Group, reason: str) -> None:
        if g.state in (EMPTY, STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(g, reason)
        elif g.state == PREPARING_REBALANCE:
            self._try_complete_join(g)

    # ---- JoinGroup -----------------------------------------------------------------------------------
    async def join_group(self, body: dict, version: int, client_id: str, client_host: str) -> dict:
        group_id = body["group_id"]
        member_id = body["member_id"] or ""
        instance_id = body.get("group_instance_id")
        if not group_id:
            return self._join_error(E.INVALID_GROUP_ID, member_id)
        err, p = self._partition_of(group_id)
        if err:
            return self._join_error(err, member_id)
        session = body["session_timeout_ms"]
        if not self._cfg("group.min.session.timeout.ms") <= session <= self._cfg("group.max.session.timeout.ms"):
            return self._join_error(E.INVALID_SESSION_TIMEOUT, member_id)
        rebalance = body.get("rebalance_timeout_ms", -1)
        if rebalance is None or rebalance < 0:
            rebalance = session       # v0 has no rebalance timeout
        protocol_type = body["protocol_type"]
        protocols = [(pr["name"], bytes(pr["metadata"])) for pr in body["protocols"]]
        g = self.groups.get(group_id)
        if g is None:
            if member_id:
                return self._join_error(E.UNKNOWN_MEMBER_ID, member_id)
            g = self._get_or_create(group_id, p)
        if g.state == DEAD:
            return self._join_error(E.COORDINATOR_NOT_AVAILABLE, member_id)
        if not g.all_protocols_supported(protocol_type, protocols):
            return self._join_error(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if len(g.members) >= self._cfg("group.max.size") and member_id not in g.members:
            return self._join_error(E.GROUP_MAX_SIZE_REACHED, member_id)
        fut = None
        if not member_id:
            new_id = f"{instance_id or client_id}-{uuid.uuid4()}"
            if instance_id is not None:
                fut = await self._join_static_new_id(g, new_id, instance_id, client_id, client_host, rebalance,
                                                     session, protocol_type, protocols)
                if isinstance(fut, dict):
                    return fut
            elif version >= 4:
                # KIP-394: hand out the id first; the member joins with it in a second request.
                g.pending_members[new_id] = self.loop.call_later(session / 1000, self._pending_expired, g, new_id)
                return self._join_error(E.MEMBER_ID_REQUIRED, new_id)
            else:
                m = Member(new_id, None, client_id, client_host, rebalance, session, protocol_type, protocols)
                fut = self._add_member_and_rebalance(g, m)
        else:
            if instance_id is not None and g.static_members.get(instance_id, member_id) != member_id:
                return self._join_error(E.FENCED_INSTANCE_ID, member_id)
            handle = g.pending_members.pop(member_id, None)
            if handle is not None:
                self._cancel(handle)
                m = Member(member_id, instance_id, client_id, client_host, rebalance, session, protocol_type,
                           protocols)
                fut = self._add_member_and_rebalance(g, m)
            else:
                m = g.members.get(member_id)
                if m is None or g.state in (EMPTY, DEAD):
                    return self._join_error(E.UNKNOWN_MEMBER_ID, member_id)
                fut = self._join_existing(g, m, rebalance, session, protocols)
                if isinstance(fut, dict):
                    return fut
        return await fut

    def _join_existing(self, g: Group, m: Member, rebalance, session, protocols):
        if m.awaiting_join():
            # a retried join replaces the earlier request, which gets no useful answer any more
            m.join_future.set_result(self._join_error(E.REBALANCE_IN_PROGRESS, m.member_id))
        if g.state == PREPARING_REBALANCE:
            self._update_member(m, rebalance, session, protocols)
            fut = m.join_future = self.loop.create_future()
            self._schedule_heartbeat(g, m)
            self._try_complete_join(g)
            return fut
        if g.state == COMPLETING_REBALANCE:
            if m.same_protocols(protocols):
                return self._join_result(g, m)   # the JoinGroup answer was lost: send it again
            self._update_member(m, rebalance, session, protocols)
            fut = m.join_future = self.loop.create_future()
            self._prepare_rebalance(g, f"member {m.member_id} changed its protocols")
            return fut
        # Stable
        if m.member_id == g.leader_id or not m.same_protocols(protocols):
            self._update_member(m, rebalance, session, protocols)
            fut = m.join_future = self.loop.create_future()
            self._prepare_rebalance(g, f"leader or changed member {m.member_id} rejoined")
            return fut
        self._schedule_heartbeat(g, m)
        return self._join_result(g, m)

    @staticmethod
    def _update_member(m: Member, rebalance, session, protocols) -> None:
        m.rebalance_timeout_ms = rebalance
        m.session_timeout_ms = session
        m.protocols = protocols

    async def _join_static_new_id(self, g: Group, new_id, instance_id, client_id, client_host, rebalance, session,
                                  protocol_type, protocols):
        old_id = g.static_members.get(instance_id)
        if old_id is None or old_id not in g.members:
            m = Member(new_id, instance_id, client_id, client_host, rebalance, session, protocol_type, protocols)
            return self._add_member_and_rebalance(g, m)
        # A known static member restarted: it takes over its old identity (and assignment) under a
        # new member id; the old id is fenced.
        old = g.members.pop(old_id)
        self._cancel(old.heartbeat_handle)
        if old.awaiting_join():
            old.join_future.set_result(self._join_error(E.FENCED_INSTANCE_ID, old_id))
        if old.awaiting_sync():
            old.sync_future.set_result(_sync_result(E.FENCED_INSTANCE_ID))
        m = Member(new_id, instance_id, client_id, client_host, rebalance, session, protocol_type, protocols,
                   assignment=old.assignment, is_new=False)
        g.members[new_id] = m
        g.static_members[instance_id] = new_id
        was_leader = g.leader_id == old_id
        if was_leader:
            g.leader_id = new_id
        if g.state == STABLE and old.same_protocols(protocols):
            gen = g.generation
            code = await self._store_group(g, {x.member_id: x.assignment for x in g.members.values()})
            if code and g.members.get(new_id) is m and g.generation == gen:
                # could not persist the new id: put the old member back, as Kafka does
                del g.members[new_id]
                g.members[old_id] = old
                g.static_members[instance_id] = old_id
                if was_leader:
                    g.leader_id = old_id
                self._schedule_heartbeat(g, old)
                return self._join_error(code, "")
            self._schedule_heartbeat(g, m)
            return self._join_result(g, m)
        fut = m.join_future = self.loop.create_future()
        self._schedule_heartbeat(g, m)
        self._update_and_rebalance(g, f"static member {instance_id} rejoined")
        return fut

    # ---- SyncGroup -----------------------------------------------------------------------------------
    async def sync_group(self, body: dict) -> dict:
        group_id = body["group_id"]
        member_id = body["member_id"]
        err, _p = self._partition_of(group_id)
        if err:
            return _sync_result(err)
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return _sync_result(E.UNKNOWN_MEMBER_ID)
        instance_id = body.get("group_instance_id")
        if instance_id is not None and g.static_members.get(instance_id, member_id) != member_id:
            return _sync_result(E.FENCED_INSTANCE_ID)
        m = g.members.get(member_id)
        if m is None:
            return _sync_result(E.UNKNOWN_MEMBER_ID)
        if body["generation_id"] != g.generation:
            return _sync_result(E.ILLEGAL_GENERATION)
        ptype, pname = body.get("protocol_type"), body.get("protocol_name")
        if (ptype is not None and ptype != g.protocol_type) or (pname is not None and pname != g.protocol_name):
            return _sync_result(E.INCONSISTENT_GROUP_PROTOCOL)
        if g.state == EMPTY:
            return _sync_result(E.UNKNOWN_MEMBER_ID)
        if g.state == PREPARING_REBALANCE:
            return _sync_result(E.REBALANCE_IN_PROGRESS)
        self._schedule_heartbeat(g, m)
        if g.state == STABLE:
            return _sync_result(0, m.assignment, g)
        # CompletingRebalance: wait for the leader's assignment to be stored.
        if m.awaiting_sync():
            m.sync_future.set_result(_sync_result(E.REBALANCE_IN_PROGRESS))
        fut = m.sync_future = self.loop.create_future()
        if member_id == g.leader_id:
            given = {a["member_id"]: bytes(a["assignment"]) for a in body["assignments"]}
            assignments = {mid: given.get(mid, b"") for mid in g.members}
            gen = g.generation
            code = await self._store_group(g, assignments)
            if g.state == COMPLETING_REBALANCE and g.generation == gen:
                if code:
                    for x in g.members.values():
                        x.assignment = b""
                    self._propagate_sync(g, code)
                    self._prepare_rebalance(g, "storing the assignment failed")
                else:
                    for mid, a in assignments.items():
                        g.members[mid].assignment = a
                    self._propagate_sync(g, 0)
                    g.transition(STABLE, self.now_ms())
                    log.info("group %s is stable in generation %d", g.group_id, g.generation)
        return await fut

    async def _store_group(self, g: Group, assignments: dict) -> int:
        p = self._partition_number(g.group_id)
        members = [consumer_offsets.MemberValue(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                                m.rebalance_timeout_ms, m.session_timeout_ms,
                                                m.metadata_for(g.protocol_name), assignments.get(m.member_id, b""))
                   for m in g.members.values()]
        value = consumer_offsets.group_value(consumer_offsets.GroupValue(
            g.protocol_type or "", g.generation, g.protocol_name, g.leader_id, g.state_timestamp, members))
        code, _ = await self.store.append(p, [(consumer_offsets.group_key(g.group_id), value)], for_commit=False)
        if code:
            log.warning("storing group %s failed: %s", g.group_id, E(code).name)
        return code

    def _partition_number(self, group_id: str) -> int:
        t = self.broker.metadata.topics.get(OFFSETS_TOPIC)
        return partition_for(group_id, len(t.partitions)) if t is not None and t.partitions else 0

    # ---- Heartbeat / LeaveGroup ----------------------------------------------------------------------
    def heartbeat(self, body: dict) -> int:
        group_id = body["group_id"]
        err, _p = self._partition_of(group_id)
        if err:
            return err
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return int(E.UNKNOWN_MEMBER_ID)
        instance_id = body.get("group_instance_id")
        member_id = body["member_id"]
        if instance_id is not None and g.static_members.get(instance_id, member_id) != member_id:
            return int(E.FENCED_INSTANCE_ID)
        m = g.members.get(member_id)
        if m is None or g.state == EMPTY:
            return int(E.UNKNOWN_MEMBER_ID)
        if body["generation_id"] != g.generation:
            return int(E.ILLEGAL_GENERATION)
        self._schedule_heartbeat(g, m)
        if g.state == PREPARING_REBALANCE:
            return int(E.REBALANCE_IN_PROGRESS)
        return 0

    def leave_group(self, group_id: str, leaving: list) -> tuple[int, list]:
        """``leaving`` [(member_id, group_instance_id)] -> (top-level error, per-member errors)."""
        err, _p = self._partition_of(group_id)
        if err:
            return err, []
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return 0, [int(E.UNKNOWN_MEMBER_ID)] * len(leaving)
        codes = []
        for member_id, instance_id in leaving:
            if instance_id is not None:
                known = g.static_members.get(instance_id)
                if known is None:
                    codes.append(int(E.UNKNOWN_MEMBER_ID))
                    continue
                if member_id and member_id != known:
                    codes.append(int(E.FENCED_INSTANCE_ID))
                    continue
                member_id = known
            handle = g.pending_members.pop(member_id, None)
            if handle is not None:
                self._cancel(handle)
                codes.append(0)
                if g.state == PREPARING_REBALANCE:
                    self._try_complete_join(g)
                continue
            m = g.members.get(member_id)
            if m is None:
                codes.append(int(E.UNKNOWN_MEMBER_ID))
                continue
            log.info("member %s left group %s", member_id, group_id)
            self._remove_member(g, m)
            codes.append(0)
        return 0, codes

    # ---- OffsetCommit --------------------------------------------------------------------------------
    async def commit_offsets(self, group_id: str, generation: int, member_id: str, instance_id, topics,
                             retention_ms: int = -1, timestamps: dict | None = None) -> dict:
        """``topics`` {(topic, partition): (offset, leader_epoch, metadata)} -> {(topic, partition): code}.
        ``retention_ms`` >= 0 (OffsetCommit v2-4) fixes the offsets' expiry at now + retention_ms;
        ``timestamps`` {(topic, partition): commit time} (OffsetCommit v1) replaces now as commit time."""
        err, p = self._partition_of(group_id)
        if not err and not group_id:
            err = int(E.INVALID_GROUP_ID)
        if err:
            return {tp: err for tp in topics}
        g = self.groups.get(group_id)
        if g is None:
            if generation >= 0:
                return {tp: int(E.ILLEGAL_GENERATION) for tp in topics}
            g = self._get_or_create(group_id, p)   # standalone commits (no group management)
        elif g.state == DEAD:
            return {tp: int(E.COORDINATOR_NOT_AVAILABLE) for tp in topics}
        elif instance_id is not None and g.static_members.get(instance_id, member_id) != member_id:
            return {tp: int(E.FENCED_INSTANCE_ID) for tp in topics}
        elif generation < 0 and g.state == EMPTY:
            pass
        elif member_id not in g.members:
            return {tp: int(E.UNKNOWN_MEMBER_ID) for tp in topics}
        elif generation != g.generation:
            return {tp: int(E.ILLEGAL_GENERATION) for tp in topics}
        elif g.state == COMPLETING_REBALANCE:
            return {tp: int(E.REBALANCE_IN_PROGRESS) for tp in topics}
        else:
            self._schedule_heartbeat(g, g.members[member_id])
        result, recs, entries = self._offset_records(group_id, topics, retention_ms, timestamps)
        if recs:
            code, _ = await self.store.append(p, recs, for_commit=True)
            if not code and self.groups.get(group_id) is g:
                g.offsets.update(entries)
            for tp in entries:
                result[tp] = code
        return result

    def _offset_records(self, group_id: str, topics, retention_ms: int, timestamps) -> tuple[dict, list, dict]:
        """(codes of the refused partitions, records to write, {(topic, partition): OffsetEntry}) for a commit."""
        now = self.now_ms()
        max_meta = self._cfg("offset.metadata.max.bytes")
        md = self.broker.metadata
        result, recs, entries = {}, [], {}
        for (topic, part), (offset, epoch, metadata) in topics.items():
            t = md.topics.get(topic)
            if t is None or part not in t.partitions:
                result[(topic, part)] = int(E.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if metadata is not None and len(metadata.encode()) > max_meta:
                result[(topic, part)] = int(E.OFFSET_METADATA_TOO_LARGE)
                continue
            ts = timestamps.get((topic, part), now) if timestamps else now
            expire = now + retention_ms if retention_ms >= 0 else -1
            e = OffsetEntry(offset, epoch, metadata or "", ts, expire)
            entries[(topic, part)] = e
            recs.append((consumer_offsets.offset_key(group_id, topic, part),
                         consumer_offsets.offset_value(consumer_offsets.OffsetValue(offset, epoch, e.metadata, ts, expire))))
        return result, recs, entries

    # ---- TxnOffsetCommit -------------------------------------------------------------------------------
    async def txn_commit_offsets(self, group_id: str, producer_id: int, producer_epoch: int, generation: int,
                                 member_id: str, instance_id, topics) -> dict:
        """``topics`` {(topic, partition): (offset, leader_epoch, metadata)} -> {(topic, partition): code}.
        The offsets are written in a transactional batch of the producer and stay pending in the group
        until the transaction's marker on the offsets partition commits or aborts them. KIP-447: a
        generation >= 0 and a member id are checked like an OffsetCommit's."""
        err, p = self._partition_of(group_id)
        if not err and not group_id:
            err = int(E.INVALID_GROUP_ID)
        if err:
            return {tp: err for tp in topics}
        g = self.groups.get(group_id)
        if g is None:
            g = self._get_or_create(group_id, p)
        if g.state == DEAD:
            return {tp: int(E.COORDINATOR_NOT_AVAILABLE) for tp in topics}
        if not (generation < 0 and g.state == EMPTY):
            if instance_id is not None and g.static_members.get(instance_id, member_id) != member_id:
                return {tp: int(E.FENCED_INSTANCE_ID) for tp in topics}
            if member_id and member_id not in g.members:
                return {tp: int(E.UNKNOWN_MEMBER_ID) for tp in topics}
            if generation >= 0 and generation != g.generation:
                return {tp: int(E.ILLEGAL_GENERATION) for tp in topics}
        result, recs, entries = self._offset_records(group_id, topics, -1, None)
        if recs:
            # Base sequence 0, as Kafka's coordinator writes it: the offsets partition checks only the
            # producer's epoch of its coordinator's batches (ProducerStateManager.coordinator_appends).
            code, _ = await self.store.append(p, recs, for_commit=True, producer=(producer_id, producer_epoch, 0))
            if not code and self.groups.get(group_id) is g:
                g.pending_txn_offsets.setdefault(producer_id, {}).update(entries)
            for tp in entries:
                result[tp] = code
        return result

    def on_transaction_completed(self, producer_id: int, offsets_partitions, committed: bool) -> None:
        """The marker of ``producer_id``'s transaction is written to these ``__consumer_offsets``
        partitions: its pending TxnOffsetCommit offsets become committed, or are dropped."""
        for p in offsets_partitions:
            ps = self.partitions.get(p)
            if ps is None:
                continue
            for gid in ps.keys:
                g = self.groups.get(gid)
                pending = g.pending_txn_offsets.pop(producer_id, None) if g is not None else None
                if pending and committed:
                    g.offsets.update(pending)

    def has_pending_txn_offsets(self, group_id: str, tp) -> bool:
        """An offset of ``tp`` waits for a transaction (OffsetFetch require_stable: UNSTABLE_OFFSET_COMMIT)."""
        g = self.groups.get(group_id)
        return g is not None and any(tp in offs for offs in g.pending_txn_offsets.values())

    # ---- OffsetFetch ---------------------------------------------------------------------------------
    def fetch_offsets(self, group_id: str, wanted) -> tuple[int, dict]:
        """``wanted`` [(topic, partition)] or None for all -> (error, {(topic, partition): entry or None})."""
        err, _p = self._partition_of(group_id)
        if err:
            return err, {}
        g = self.groups.get(group_id)
        offsets = g.offsets if g is not None else {}
        if wanted is None:
            return 0, dict(offsets)
        return 0, {tp: offsets.get(tp) for tp in wanted}

    # ---- DescribeGroups / ListGroups -------------------------------------------------------------------
    def describe_group(self, group_id: str) -> dict:
        out = {"error_code": 0, "group_id": group_id, "group_state": DEAD, "protocol_type": "",
               "protocol_data": "", "members": []}
        err, _p = self._partition_of(group_id)
        if err:
            out["error_code"] = err
            return out
        g = self.groups.get(group_id)
        if g is None:
            return out
        stable = g.state == STABLE
        out.update(group_state=g.state, protocol_type=g.protocol_type or "",
                   protocol_data=(g.protocol_name or "") if stable else "")
        out["members"] = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                           "client_id": m.client_id, "client_host": m.client_host,
                           "member_metadata": m.metadata_for(g.protocol_name) if stable else b"",
                           "member_assignment": m.assignment if stable else b""}
                          for m in g.members.values()]
        return out

    async def list_groups(self, states=None) -> tuple[int, list]:
        self._ensure_started()
        # a partition led but not yet loaded (e.g. right after a restart) starts loading
        if not await self.owned.all_loaded():
            return int(E.COORDINATOR_LOAD_IN_PROGRESS), []
        wanted = {s.lower() for s in states} if states else None
        out = []
        for g in self.groups.values():
            if g.state == DEAD or (wanted is not None and g.state.lower() not in wanted):
                continue
            out.append({"group_id": g.group_id, "protocol_type": g.protocol_type or "", "group_state": g.state,
                        "group_type": "classic"})
        return 0, out

    # ---- DeleteGroups / OffsetDelete ---------------------------------------------------------------------
    async def delete_group(self, group_id: str) -> int:
        err, p = self._partition_of(group_id)
        if err:
            return err
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return int(E.GROUP_ID_NOT_FOUND)
        if g.state != EMPTY:
            return int(E.NON_EMPTY_GROUP)
        recs = [(consumer_offsets.offset_key(group_id, t, q), None) for (t, q) in g.offsets]
        recs.append((consumer_offsets.group_key(group_id), None))
        code, _ = await self.store.append(p, recs, for_commit=False)
        if code:
            return code
        if self.groups.get(group_id) is g and g.state == EMPTY:
            self._drop_group(g)
        return 0

    async def delete_offsets(self, group_id: str, tps) -> tuple[int, dict]:
        err, p = self._partition_of(group_id)
        if err:
            return err, {}
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return int(E.GROUP_ID_NOT_FOUND), {}
        subscribed = set()
        if g.state != EMPTY:
            subscribed = g.subscribed_topics()
            if subscribed is None:
                return int(E.NON_EMPTY_GROUP), {}
        result, recs = {}, []
        for tp in tps:
            if tp[0] in subscribed:
                result[tp] = int(E.GROUP_SUBSCRIBED_TO_TOPIC)
            else:
                result[tp] = 0
                if tp in g.offsets:
                    recs.append((consumer_offsets.offset_key(group_id, tp[0], tp[1]), None))
        if recs:
            code, _ = await self.store.append(p, recs, for_commit=True)
            if code:
                return code, {}
            for k, _v in recs:
                _, _g, t, q = consumer_offsets.decode_key(k)
                g.offsets.pop((t, q), None)
        return 0, result

    # ---- retention -----------------------------------------------------------------------------------------
    async def expire_offsets(self, now: int | None = None) -> int:
        """Tombstone the offsets of empty groups older than ``offsets.retention.minutes`` (from when the
        group became empty; standalone commits from their own commit time). Returns how many."""
        now = self.now_ms() if now is None else now
        retention = self._cfg("offsets.retention.minutes") * 60_000
        total = 0
        for g in list(self.groups.values()):
            if g.state != EMPTY:
                continue
            # An offset committed with its own retention (OffsetCommit v2-4) expires at that time.
            base = g.state_timestamp if g.protocol_type else None
            expired = [tp for tp, e in g.offsets.items()
                       if (e.expire_timestamp if e.expire_timestamp >= 0
                           else (e.commit_timestamp if base is None else base) + retention) <= now]
            # a member between its two KIP-394 joins is about to make the group non-empty: keep the group
            dead = len(expired) == len(g.offsets) and not g.pending_members
            if not expired and not dead:
                continue
            recs = [(consumer_offsets.offset_key(g.group_id, t, q), None) for t, q in expired]
            if dead:
                recs.append((consumer_offsets.group_key(g.group_id), None))
            code, _ = await self.store.append(self._partition_number(g.group_id), recs, for_commit=False)
            if code or self.groups.get(g.group_id) is not g or g.state != EMPTY:
                continue
            for tp in expired:
                g.offsets.pop(tp, None)
            total += len(expired)
            if dead and not g.offsets:
                self._drop_group(g)
                log.info("group %s expired: %d offsets removed", g.group_id, len(expired))
        return total


def _sync_result(code, assignment=b"", g: Group | None = None) -> dict:
    return {"throttle_time_ms": 0, "error_code": int(code),
            "protocol_type": g.protocol_type if g is not None else None,
            "protocol_name": g.protocol_name if g is not None else None, "assignment": assignment}
