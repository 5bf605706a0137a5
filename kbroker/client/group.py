"""Consumer groups on the client side: Kafka's consumer protocol (ConsumerProtocolSubscription /
ConsumerProtocolAssignment, embedded as bytes in JoinGroup and SyncGroup) and the range and
round-robin assignors.

The group-joining consumer (``GroupConsumer``) is below the codecs.
"""
from __future__ import annotations

import struct

_h = struct.Struct(">h")
_i = struct.Struct(">i")


def _w_str(out: bytearray, s: str) -> None:
    b = s.encode()
    out += _h.pack(len(b))
    out += b


def encode_subscription(topics, user_data: bytes | None = None, owned=None, version: int = 1) -> bytes:
    """ConsumerProtocolSubscription v0/v1 (v1 adds owned partitions: cooperative rebalancing)."""
    out = bytearray(_h.pack(version))
    out += _i.pack(len(topics))
    for t in topics:
        _w_str(out, t)
    if user_data is None:
        out += _i.pack(-1)
    else:
        out += _i.pack(len(user_data)) + user_data
    if version >= 1:
        owned = owned or {}
        out += _i.pack(len(owned))
        for t, parts in owned.items():
            _w_str(out, t)
            out += _i.pack(len(parts))
            for p in parts:
                out += _i.pack(p)
    return bytes(out)


def encode_assignment(assignment: dict, user_data: bytes | None = None) -> bytes:
    """ConsumerProtocolAssignment v0: {topic: [partitions]}."""
    out = bytearray(_h.pack(0))
    out += _i.pack(len(assignment))
    for t, parts in assignment.items():
        _w_str(out, t)
        out += _i.pack(len(parts))
        for p in parts:
            out += _i.pack(p)
    out += _i.pack(-1 if user_data is None else len(user_data))
    if user_data:
        out += user_data
    return bytes(out)


class _R:
    def __init__(self, b):
        self.b, self.p = bytes(b), 0

    def i16(self):
        v = _h.unpack_from(self.b, self.p)[0]
        self.p += 2
        return v

    def i32(self):
        v = _i.unpack_from(self.b, self.p)[0]
        self.p += 4
        return v

    def s(self):
        n = self.i16()
        v = self.b[self.p:self.p + n].decode()
        self.p += n
        return v


def decode_subscription(b) -> list[str]:
    """Topics of a ConsumerProtocolSubscription of any version ([] if it does not parse)."""
    try:
        r = _R(b)
        r.i16()
        return [r.s() for _ in range(r.i32())]
    except (struct.error, UnicodeDecodeError):
        return []


def decode_assignment(b) -> dict:
    """{topic: [partitions]} of a ConsumerProtocolAssignment of any version ({} if empty/invalid)."""
    if not b:
        return {}
    try:
        r = _R(b)
        r.i16()
        out = {}
        for _ in range(r.i32()):
            t = r.s()
            out[t] = [r.i32() for _ in range(r.i32())]
        return out
    except (struct.error, UnicodeDecodeError):
        return {}


def assign_range(members: dict, partitions: dict) -> dict:
    """Kafka's RangeAssignor. ``members`` {member_id: [topics]}, ``partitions`` {topic: count}
    -> {member_id: {topic: [partitions]}}."""
    out = {m: {} for m in members}
    for topic in sorted({t for ts in members.values() for t in ts}):
        subs = sorted(m for m, ts in members.items() if topic in ts)
        n = partitions.get(topic, 0)
        if not subs or n == 0:
            continue
        per, extra = divmod(n, len(subs))
        start = 0
        for i, m in enumerate(subs):
            count = per + (1 if i < extra else 0)
            if count:
                out[m][topic] = list(range(start, start + count))
            start += count
    return out


def assign_roundrobin(members: dict, partitions: dict) -> dict:
    """Kafka's RoundRobinAssignor (members sorted, partitions of all topics sorted)."""
    out = {m: {} for m in members}
    ordered = sorted(members)
    if not ordered:
        return out
    i = 0
    for topic in sorted({t for ts in members.values() for t in ts}):
        for p in range(partitions.get(topic, 0)):
            for _ in range(len(ordered)):
                m = ordered[i % len(ordered)]
                i += 1
                if topic in members[m]:
                    out[m].setdefault(topic, []).append(p)
                    break
    return out


ASSIGNORS = {"range": assign_range, "roundrobin": assign_roundrobin}


# ---- coordinator requests (used by the group consumer and ``kbroker consumer-groups``) -----------------

import asyncio  # noqa: E402

from kbroker.protocol.errors import Errors  # noqa: E402

from .cluster import Cluster, ClusterClient  # noqa: E402
from .connection import KafkaConnectionError, KafkaError, raise_for_error  # noqa: E402

FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH = 10, 8, 9
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 15, 16, 42
_RETRY_COORDINATOR = {int(Errors.COORDINATOR_LOAD_IN_PROGRESS), int(Errors.COORDINATOR_NOT_AVAILABLE),
                      int(Errors.NOT_COORDINATOR)}


class GroupClient(ClusterClient):
    """Coordinator lookup and the group requests an operator tool or a consumer sends."""

    def __init__(self, bootstrap_servers=None, *, cluster: Cluster | None = None, client_id: str = "kbroker-groups",
                 request_timeout_ms: int = 30000, retry_backoff_ms: int = 100, retries: int = 50, security=None):
        super().__init__(bootstrap_servers, cluster, client_id, request_timeout_ms, retry_backoff_ms, security)
        self.retry_backoff = retry_backoff_ms / 1000
        self.retries = retries
        self._coordinators: dict[str, int] = {}

    async def coordinator(self, group: str) -> int:
        node = self._coordinators.get(group)
        if node is not None:
            return node
        for _ in range(self.retries):
            _, r = await self.cluster.send_any(FIND_COORDINATOR, {"key": group, "key_type": 0})
            if r["error_code"] == 0:
                self._coordinators[group] = r["node_id"]
                return r["node_id"]
            if r["error_code"] not in _RETRY_COORDINATOR:
                raise_for_error(r["error_code"], r.get("error_message"), f"FindCoordinator({group})")
            await asyncio.sleep(self.retry_backoff)
        raise KafkaError(Errors.COORDINATOR_NOT_AVAILABLE, None, f"no coordinator for group {group}")

    async def send_to_coordinator(self, group: str, api_key: int, body: dict, error_of=lambda r: r.get("error_code", 0)):
        """Send to the group's coordinator; on coordinator errors find it again and retry."""
        for _ in range(self.retries):
            try:
                conn = await self.cluster.connection(await self.coordinator(group))
                version, r = await conn.send(api_key, body)
            except KafkaConnectionError:
                self._coordinators.pop(group, None)
                await asyncio.sleep(self.retry_backoff)
                continue
            if error_of(r) in _RETRY_COORDINATOR:
                self._coordinators.pop(group, None)
                await asyncio.sleep(self.retry_backoff)
                continue
            return version, r
        raise KafkaError(Errors.COORDINATOR_NOT_AVAILABLE, None, f"group {group}: coordinator unavailable")

    async def list_groups(self) -> list[dict]:
        await self.cluster.refresh_metadata([])
        out = []
        for node in list(self.cluster.brokers):
            conn = await self.cluster.connection(node)
            for _ in range(self.retries):
                _, r = await conn.send(LIST_GROUPS, {})
                if r["error_code"] != Errors.COORDINATOR_LOAD_IN_PROGRESS:
                    break
                await asyncio.sleep(self.retry_backoff)
            raise_for_error(r["error_code"], None, "ListGroups")
            out += r["groups"]
        return out

    async def describe_group(self, group: str) -> dict:
        _, r = await self.send_to_coordinator(group, DESCRIBE_GROUPS, {"groups": [group]},
                                              lambda r: r["groups"][0]["error_code"])
        g = r["groups"][0]
        raise_for_error(g["error_code"], None, f"DescribeGroups({group})")
        return g

    async def fetch_offsets(self, group: str, partitions=None) -> dict:
        """{(topic, partition): (offset, leader_epoch, metadata)} of the committed offsets (all of them
        when ``partitions`` is None)."""
        topics = None
        if partitions is not None:
            by: dict = {}
            for t, p in partitions:
                by.setdefault(t, []).append(p)
            topics = [{"name": t, "partition_indexes": ps} for t, ps in by.items()]
        _, r = await self.send_to_coordinator(group, OFFSET_FETCH, {"group_id": group, "topics": topics})
        raise_for_error(r.get("error_code", 0), None, f"OffsetFetch({group})")
        out = {}
        for t in r["topics"]:
            for p in t["partitions"]:
                raise_for_error(p["error_code"], None, f"OffsetFetch({group})")
                if p["committed_offset"] >= 0:
                    out[(t["name"], p["partition_index"])] = (p["committed_offset"], p.get("committed_leader_epoch", -1),
                                                             p["metadata"])
        return out

    async def commit_offsets(self, group: str, offsets: dict, generation: int = -1, member_id: str = "",
                             instance_id: str | None = None) -> dict:
        """``offsets`` {(topic, partition): offset or (offset, leader_epoch, metadata)} -> {tp: error code}."""
        by: dict = {}
        for (t, p), v in offsets.items():
            off, epoch, meta = v if isinstance(v, tuple) else (v, -1, "")
            by.setdefault(t, []).append({"partition_index": p, "committed_offset": off,
                                         "committed_leader_epoch": epoch, "committed_metadata": meta})
        body = {"group_id": group, "generation_id_or_member_epoch": generation, "member_id": member_id,
                "group_instance_id": instance_id, "retention_time_ms": -1,
                "topics": [{"name": t, "partitions": ps} for t, ps in by.items()]}

        def first_error(r):
            codes = [p["error_code"] for t in r["topics"] for p in t["partitions"]]
            return next((c for c in codes if c in _RETRY_COORDINATOR), 0)
        _, r = await self.send_to_coordinator(group, OFFSET_COMMIT, body, first_error)
        return {(t["name"], p["partition_index"]): p["error_code"] for t in r["topics"] for p in t["partitions"]}

    async def delete_groups(self, groups) -> dict:
        out = {}
        for g in groups:
            _, r = await self.send_to_coordinator(g, DELETE_GROUPS, {"groups_names": [g]},
                                                  lambda r: r["results"][0]["error_code"])
            out[g] = r["results"][0]["error_code"]
        return out


# ---- the group-joining consumer ------------------------------------------------------------------------

import logging  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

from .consumer import Consumer  # noqa: E402

log = logging.getLogger(__name__)


class GroupConsumer:
    """A consumer that joins ``group_id`` (classic protocol, eager rebalancing), reads the partitions
    the group leader's assignor gives it, and commits its positions.

    Kafka's consumer configs by their Python names: session_timeout_ms (default 45000),
    rebalance_timeout_ms (max.poll.interval.ms, 300000), heartbeat_interval_ms (3000), assignor
    ("range" or "roundrobin"), auto_offset_reset ("latest"/"earliest"), enable_auto_commit,
    auto_commit_interval_ms (5000), group_instance_id (static membership)."""

    def __init__(self, bootstrap_servers=None, group_id: str = "", topics=(), *, cluster: Cluster | None = None,
                 client_id: str = "kbroker-consumer", session_timeout_ms: int = 45000,
                 rebalance_timeout_ms: int = 300000, heartbeat_interval_ms: int = 3000, assignor: str = "range",
                 auto_offset_reset: str = "latest", enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000, group_instance_id: str | None = None,
                 isolation_level: str = "read_uncommitted", retry_backoff_ms: int = 100, security=None):
        if assignor not in ASSIGNORS:
            raise ValueError(f"partition.assignment.strategy must be one of {sorted(ASSIGNORS)}, not {assignor!r}")
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto.offset.reset must be earliest or latest, not {auto_offset_reset!r}")
        self._own_cluster = cluster is None
        self.cluster = cluster or Cluster(bootstrap_servers, client_id=client_id, retry_backoff_ms=retry_backoff_ms,
                                          security=security)
        self.groups = GroupClient(cluster=self.cluster, retry_backoff_ms=retry_backoff_ms)
        self.consumer = Consumer(cluster=self.cluster, isolation_level=isolation_level, client_id=client_id)
        self.group_id = group_id
        self.topics = list(topics)
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval = heartbeat_interval_ms / 1000
        self.assignor = assignor
        self.auto_offset_reset = auto_offset_reset
        self.auto_commit = enable_auto_commit
        self.auto_commit_interval = auto_commit_interval_ms / 1000
        self.instance_id = group_instance_id
        self.backoff = retry_backoff_ms / 1000
        self.member_id = ""
        self.generation = -1
        self.assignment: dict = {}          # {topic: [partitions]}
        self.positions: dict = {}           # {(topic, partition): next offset}
        self._committed: dict = {}
        self._need_rejoin = True
        self._hb_task: asyncio.Task | None = None
        self._last_commit = time.monotonic()
        self._cursor = 0

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # ---- membership ----------------------------------------------------------------------------------
    async def _coordinator_conn(self):
        return await self.cluster.connection(await self.groups.coordinator(self.group_id))

    async def _ensure_member(self) -> None:
        while self._need_rejoin:
            await self._join_and_sync()

    async def _join_and_sync(self) -> None:
        if self._hb_task is not None:
            self._hb_task.cancel()
            self._hb_task = None
        self.assignment, self.positions = {}, {}    # eager: give everything up before rejoining
        await self.cluster.refresh_metadata(self.topics)
        meta = encode_subscription(self.topics, version=0)
        body = {"group_id": self.group_id, "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms, "member_id": self.member_id,
                "group_instance_id": self.instance_id, "protocol_type": "consumer",
                "protocols": [{"name": self.assignor, "metadata": meta}]}
        timeout = self.rebalance_timeout_ms / 1000 + 5
        try:
            conn = await self._coordinator_conn()
            _, r = await conn.send(JOIN_GROUP, body, timeout=timeout)
        except (KafkaConnectionError, KafkaError) as e:
            log.info("JoinGroup of %s failed (%s); retrying", self.group_id, e)
            self.groups._coordinators.pop(self.group_id, None)
            await asyncio.sleep(self.backoff)
            return
        code = r["error_code"]
        if code == Errors.MEMBER_ID_REQUIRED:
            self.member_id = r["member_id"]
            return
        if code in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
            self.member_id = ""
            return
        if code in _RETRY_COORDINATOR or code == Errors.REBALANCE_IN_PROGRESS:
            self.groups._coordinators.pop(self.group_id, None)
            await asyncio.sleep(self.backoff)
            return
        raise_for_error(code, None, f"JoinGroup({self.group_id})")
        self.member_id, self.generation = r["member_id"], r["generation_id"]
        assignments = []
        if r["leader"] == self.member_id:
            subs = {m["member_id"]: decode_subscription(m["metadata"]) for m in r["members"]}
            wanted = sorted({t for ts in subs.values() for t in ts})
            await self.cluster.refresh_metadata(wanted)
            counts = {t: len(self.cluster.partitions_for(t) or []) for t in wanted}
            plan = ASSIGNORS[r["protocol_name"]](subs, counts)
            assignments = [{"member_id": m, "assignment": encode_assignment(a)} for m, a in plan.items()]
        sync = {"group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
                "group_instance_id": self.instance_id, "protocol_type": "consumer",
                "protocol_name": r["protocol_name"], "assignments": assignments}
        try:
            _, s = await conn.send(SYNC_GROUP, sync, timeout=timeout)
        except (KafkaConnectionError, KafkaError):
            await asyncio.sleep(self.backoff)
            return
        if s["error_code"]:
            if s["error_code"] in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
                self.member_id = ""
            await asyncio.sleep(self.backoff if s["error_code"] != Errors.REBALANCE_IN_PROGRESS else 0)
            return
        self.assignment = decode_assignment(s["assignment"])
        tps = [(t, p) for t, ps in self.assignment.items() for p in ps]
        committed = await self.groups.fetch_offsets(self.group_id, tps) if tps else {}
        for tp in tps:
            c = committed.get(tp)
            self.positions[tp] = c[0] if c else await self.consumer.list_offsets(tp[0], tp[1], self.auto_offset_reset)
        self._committed = {tp: c[0] for tp, c in committed.items()}
        self._need_rejoin = False
        self._hb_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        log.info("joined group %s generation %d as %s: %s", self.group_id, self.generation, self.member_id,
                 self.assignment)

    async def _heartbeat_loop(self) -> None:
        while not self._need_rejoin:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                conn = await self._coordinator_conn()
                _, r = await conn.send(HEARTBEAT, {"group_id": self.group_id, "generation_id": self.generation,
                                                   "member_id": self.member_id,
                                                   "group_instance_id": self.instance_id})
            except (KafkaConnectionError, KafkaError):
                self.groups._coordinators.pop(self.group_id, None)
                continue
            code = r["error_code"]
            if code in (Errors.REBALANCE_IN_PROGRESS, Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID,
                        Errors.FENCED_INSTANCE_ID):
                if code != Errors.REBALANCE_IN_PROGRESS:
                    self.member_id = "" if code != Errors.FENCED_INSTANCE_ID else self.member_id
                self._need_rejoin = True
                if code == Errors.FENCED_INSTANCE_ID:
                    raise_for_error(code, None, "Heartbeat")
            elif code in _RETRY_COORDINATOR:
                self.groups._coordinators.pop(self.group_id, None)

    # ---- reading and committing ---------------------------------------------------------------------
    async def poll(self, max_wait_ms: int = 500) -> list:
        """Records from the assigned partitions (one fetch per partition, in turn)."""
        if self._need_rejoin:
            if self.auto_commit and self.generation >= 0 and self.positions:
                await self._commit_quietly()
            await self._ensure_member()
        if self.auto_commit and time.monotonic() - self._last_commit >= self.auto_commit_interval:
            await self._commit_quietly()
        tps = sorted(self.positions)
        if not tps:
            await asyncio.sleep(max_wait_ms / 1000)
            return []
        wait = max(10, max_wait_ms // len(tps))
        for i in range(len(tps)):
            tp = tps[(self._cursor + i) % len(tps)]
            try:
                r = await self.consumer.fetch(tp[0], tp[1], self.positions[tp], max_wait_ms=wait)
            except KafkaError as e:
                if e.error != Errors.OFFSET_OUT_OF_RANGE:
                    raise
                # the committed position fell out of the log (retention): auto.offset.reset
                self.positions[tp] = await self.consumer.list_offsets(tp[0], tp[1], self.auto_offset_reset)
                continue
            if tp in self.positions:
                self.positions[tp] = max(self.positions[tp], r.next_offset)
            if r.records:
                self._cursor = (self._cursor + i + 1) % len(tps)
                return r.records
            if self._need_rejoin:
                break
        return []

    def mark(self, record) -> None:
        """Restart from after ``record`` (when the caller stops mid-batch)."""
        tp = (record.topic, record.partition)
        if tp in self.positions:
            self.positions[tp] = record.offset + 1

    async def commit(self, offsets: dict | None = None) -> None:
        """Commit ``offsets`` {(topic, partition): offset} (default: the current positions) in this
        member's generation; raises KafkaError (e.g. REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION)."""
        offsets = dict(self.positions if offsets is None else offsets)
        if not offsets:
            return
        codes = await self.groups.commit_offsets(self.group_id, offsets, self.generation, self.member_id,
                                                 self.instance_id)
        self._last_commit = time.monotonic()
        for tp, c in codes.items():
            if c:
                if c in (Errors.REBALANCE_IN_PROGRESS, Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID):
                    self._need_rejoin = True
                raise_for_error(c, None, f"OffsetCommit {tp[0]}-{tp[1]}")
        self._committed.update(offsets)

    async def _commit_and_leave(self) -> None:
        if self.generation >= 0 and not self._need_rejoin:
            if self.auto_commit:
                await self._commit_quietly()
            if self.instance_id is None and self.member_id:
                # static members do not leave: a restart within the session keeps the assignment
                conn = await self._coordinator_conn()
                await conn.send(LEAVE_GROUP, {"group_id": self.group_id, "member_id": self.member_id,
                                              "members": [{"member_id": self.member_id}]})

    async def _commit_quietly(self) -> None:
        pending = {tp: o for tp, o in self.positions.items() if self._committed.get(tp) != o}
        if not pending:
            self._last_commit = time.monotonic()
            return
        try:
            await self.commit(pending)
        except KafkaError as e:
            log.info("auto-commit for group %s failed: %s", self.group_id, e)

    async def close(self, timeout_ms: int = 30000) -> None:
        """Commit (auto-commit) and leave the group, within ``timeout_ms`` as Kafka's
        ``KafkaConsumer.close(Duration)`` (default 30 s): a coordinator that does not answer in time
        (moving, overloaded) must not keep the process from exiting; the session timeout then
        removes the member."""
        if self._hb_task is not None:
            self._hb_task.cancel()
        try:
            await asyncio.wait_for(self._commit_and_leave(), timeout_ms / 1000)
        except asyncio.TimeoutError:
            log.warning("closing consumer of group %s: commit/leave not answered within %d ms",
                        self.group_id, timeout_ms)
        except (KafkaError, KafkaConnectionError, socket.error) as e:
            log.info("leaving group %s failed: %s", self.group_id, e)
        finally:
            self._need_rejoin = True
            if self._own_cluster:
                await self.cluster.close()
