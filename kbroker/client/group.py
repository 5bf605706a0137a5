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
