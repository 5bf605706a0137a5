"""Record formats of ``__consumer_offsets``, as Kafka writes them (its group-coordinator JSON schemas
OffsetCommitKey/Value and GroupMetadataKey/Value). Keys and values start with an int16 schema
version. We write offset key v1 + value v3 (offset, leader epoch, metadata, commit timestamp), or
value v1 for a commit with its own expiry, and
group key v2 + value v3 (with static members' instance ids); we read every non-flexible version
(0-3), which is what Kafka and tools such as Burrow read and write.

A tombstone (null value) deletes the key: an expired or deleted offset, a deleted group.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

OFFSET_KEY_VERSION = 1
OFFSET_VALUE_VERSION = 3
GROUP_KEY_VERSION = 2
GROUP_VALUE_VERSION = 3

_h = struct.Struct(">h")
_i = struct.Struct(">i")
_q = struct.Struct(">q")


class RecordFormatError(ValueError):
    pass


def _str(out: bytearray, s: str | None) -> None:
    if s is None:
        out += _h.pack(-1)
        return
    b = s.encode()
    out += _h.pack(len(b))
    out += b


def _bytes(out: bytearray, b: bytes | None) -> None:
    if b is None:
        out += _i.pack(-1)
        return
    out += _i.pack(len(b))
    out += b


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf):
        self.buf = bytes(buf)
        self.pos = 0

    def _take(self, n):
        if n < 0 or self.pos + n > len(self.buf):
            raise RecordFormatError("truncated record")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def int16(self):
        return _h.unpack(self._take(2))[0]

    def int32(self):
        return _i.unpack(self._take(4))[0]

    def int64(self):
        return _q.unpack(self._take(8))[0]

    def string(self, nullable=False):
        n = self.int16()
        if n < 0:
            if nullable:
                return None
            raise RecordFormatError("null string in a non-nullable field")
        return self._take(n).decode()

    def bytes_(self):
        n = self.int32()
        return None if n < 0 else self._take(n)


# ---- keys ------------------------------------------------------------------------------------------

def offset_key(group: str, topic: str, partition: int) -> bytes:
    out = bytearray(_h.pack(OFFSET_KEY_VERSION))
    _str(out, group)
    _str(out, topic)
    out += _i.pack(partition)
    return bytes(out)


def group_key(group: str) -> bytes:
    out = bytearray(_h.pack(GROUP_KEY_VERSION))
    _str(out, group)
    return bytes(out)


def decode_key(buf):
    """('offset', group, topic, partition) for key v0/v1, ('group', group) for v2."""
    r = _Reader(buf)
    version = r.int16()
    if version in (0, 1):
        return ("offset", r.string(), r.string(), r.int32())
    if version == 2:
        return ("group", r.string())
    raise RecordFormatError(f"unknown __consumer_offsets key version {version}")


# ---- offset commit value ----------------------------------------------------------------------------

@dataclass(slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1


def offset_value(v: OffsetValue) -> bytes:
    """Value v3, or v1 (the only version with an expire timestamp, and without a leader epoch) when the
    commit fixed its own expiry, as Kafka writes them."""
    if v.expire_timestamp >= 0:
        out = bytearray(_h.pack(1))
        out += _q.pack(v.offset)
        _str(out, v.metadata or "")
        out += _q.pack(v.commit_timestamp)
        out += _q.pack(v.expire_timestamp)
        return bytes(out)
    out = bytearray(_h.pack(OFFSET_VALUE_VERSION))
    out += _q.pack(v.offset)
    out += _i.pack(v.leader_epoch)
    _str(out, v.metadata or "")
    out += _q.pack(v.commit_timestamp)
    return bytes(out)


def decode_offset_value(buf) -> OffsetValue:
    r = _Reader(buf)
    version = r.int16()
    if not 0 <= version <= 3:
        raise RecordFormatError(f"unknown offset commit value version {version}")
    offset = r.int64()
    epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    ts = r.int64()
    expire = r.int64() if version == 1 else -1
    return OffsetValue(offset, epoch, metadata, ts, expire)


# ---- group metadata value ---------------------------------------------------------------------------

@dataclass(slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: list


def group_value(v: GroupValue) -> bytes:
    out = bytearray(_h.pack(GROUP_VALUE_VERSION))
    _str(out, v.protocol_type)
    out += _i.pack(v.generation)
    _str(out, v.protocol)
    _str(out, v.leader)
    out += _q.pack(v.current_state_timestamp)
    out += _i.pack(len(v.members))
    for m in v.members:
        _str(out, m.member_id)
        _str(out, m.group_instance_id)
        _str(out, m.client_id)
        _str(out, m.client_host)
        out += _i.pack(m.rebalance_timeout)
        out += _i.pack(m.session_timeout)
        _bytes(out, m.subscription)
        _bytes(out, m.assignment)
    return bytes(out)


def decode_group_value(buf) -> GroupValue:
    r = _Reader(buf)
    version = r.int16()
    if not 0 <= version <= 3:
        raise RecordFormatError(f"unknown group metadata value version {version}")
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.string(nullable=True)
    leader = r.string(nullable=True)
    ts = r.int64() if version >= 2 else -1
    n = r.int32()
    if n < 0 or n > len(r.buf):
        raise RecordFormatError("bad member count")
    members = []
    for _ in range(n):
        member_id = r.string()
        instance = r.string(nullable=True) if version >= 3 else None
        client_id = r.string()
        host = r.string()
        rebalance = r.int32() if version >= 1 else -1
        session = r.int32()
        sub = r.bytes_() or b""
        assignment = r.bytes_() or b""
        if rebalance < 0:
            rebalance = session
        members.append(MemberValue(member_id, instance, client_id, host, rebalance, session, sub, assignment))
    return GroupValue(protocol_type, generation, protocol, leader, ts, members)
