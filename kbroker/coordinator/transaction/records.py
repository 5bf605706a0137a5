"""Record formats of ``__transaction_state``, as Kafka writes them (its TransactionLogKey/Value schemas).

Key, version 0: int16 version, string transactional id. Value: int16 version, then version 0
(non-flexible): producer id int64, producer epoch int16, timeout int32, status int8, partitions
(nullable array of {topic string, partition ids [int32]}), last update time int64, start time int64.
Version 1 (KIP-890 part 2) is the same fields in the flexible encoding (compact strings and arrays,
tag buffers) with tagged previous/next producer id and client transaction version. We write version 0,
which every Kafka since 0.11 reads, and read both. A null value (tombstone) removes the id.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

KEY_VERSION = 0
VALUE_VERSION = 0

# Kafka's TransactionState ids, as stored in the status byte.
EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT, DEAD, PREPARE_EPOCH_FENCE = range(8)
STATE_NAMES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead",
               "PrepareEpochFence")

_h = struct.Struct(">h")
_i = struct.Struct(">i")
_q = struct.Struct(">q")


class RecordFormatError(ValueError):
    pass


@dataclass
class TxnValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: int
    partitions: dict[str, list[int]] = field(default_factory=dict)   # topic -> partition ids
    last_update_ms: int = -1
    start_ms: int = -1
    previous_producer_id: int = -1      # v1 tagged fields; -1 when absent
    next_producer_id: int = -1


def _str(out: bytearray, s: str) -> None:
    b = s.encode()
    out += _h.pack(len(b))
    out += b


def encode_key(transactional_id: str) -> bytes:
    out = bytearray(_h.pack(KEY_VERSION))
    _str(out, transactional_id)
    return bytes(out)


def encode_value(v: TxnValue) -> bytes:
    out = bytearray(_h.pack(VALUE_VERSION))
    out += _q.pack(v.producer_id)
    out += _h.pack(v.producer_epoch)
    out += _i.pack(v.timeout_ms)
    out += bytes((v.state,))
    # Kafka writes an empty array (not null) for a transaction with no partitions.
    out += _i.pack(len(v.partitions))
    for topic, parts in v.partitions.items():
        _str(out, topic)
        out += _i.pack(len(parts))
        for p in parts:
            out += _i.pack(p)
    out += _q.pack(v.last_update_ms)
    out += _q.pack(v.start_ms)
    return bytes(out)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf):
        self.buf = bytes(buf)
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise RecordFormatError("truncated record")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def int8(self):
        return self.take(1)[0]

    def int16(self):
        return _h.unpack(self.take(2))[0]

    def int32(self):
        return _i.unpack(self.take(4))[0]

    def int64(self):
        return _q.unpack(self.take(8))[0]

    def varuint(self) -> int:
        shift = value = 0
        while True:
            b = self.int8()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise RecordFormatError("varint too long")

    def string(self, flexible: bool) -> str:
        n = self.varuint() - 1 if flexible else self.int16()
        if n < 0:
            raise RecordFormatError("null string")
        try:
            return self.take(n).decode()
        except UnicodeDecodeError as e:
            raise RecordFormatError(str(e)) from None

    def array_len(self, flexible: bool) -> int:
        return self.varuint() - 1 if flexible else self.int32()

    def tags(self) -> dict[int, bytes]:
        out = {}
        for _ in range(self.varuint()):
            tag = self.varuint()
            out[tag] = self.take(self.varuint())
        return out


def decode_key(buf) -> str:
    r = _Reader(buf)
    version = r.int16()
    if version != KEY_VERSION:
        raise RecordFormatError(f"unknown transaction log key version {version}")
    return r.string(False)


def decode_value(buf) -> TxnValue:
    r = _Reader(buf)
    version = r.int16()
    if version not in (0, 1):
        raise RecordFormatError(f"unknown transaction log value version {version}")
    flex = version >= 1
    pid = r.int64()
    epoch = r.int16()
    timeout = r.int32()
    state = r.int8()
    if state >= len(STATE_NAMES):
        raise RecordFormatError(f"unknown transaction state {state}")
    parts: dict[str, list[int]] = {}
    n = r.array_len(flex)
    for _ in range(max(n, 0)):
        topic = r.string(flex)
        ids = [r.int32() for _ in range(max(r.array_len(flex), 0))]
        if flex:
            r.tags()
        parts.setdefault(topic, []).extend(ids)
    last_update = r.int64()
    start = r.int64()
    v = TxnValue(pid, epoch, timeout, state, parts, last_update, start)
    if flex:
        tags = r.tags()
        if 0 in tags and len(tags[0]) == 8:
            v.previous_producer_id = _q.unpack(tags[0])[0]
        if 1 in tags and len(tags[1]) == 8:
            v.next_producer_id = _q.unpack(tags[1])[0]
    return v
