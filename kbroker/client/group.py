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
                 request_timeout_ms: int = 30000, retry_backoff_ms: int = 100, retries: int = 50):
        super().__init__(bootstrap_servers, cluster, client_id, request_timeout_ms, retry_backoff_ms)
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
