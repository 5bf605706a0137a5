"""Slow, obviously-correct pure-Python RecordBatch v2 decoder and table CRC-32C.

This is the *test oracle*: differential tests feed the same bytes to it and to
the Cython path in ``kbroker._native.batch``. It favours plain code over
speed and never runs in the broker.

Batch layout (big-endian, Kafka's RecordBatch v2, header = 61 bytes):
  0 baseOffset i64 | 8 batchLength i32 | 12 partitionLeaderEpoch i32 |
  16 magic i8 | 17 crc u32 (CRC-32C of bytes [21, end)) | 21 attributes i16 |
  23 lastOffsetDelta i32 | 27 baseTimestamp i64 | 35 maxTimestamp i64 |
  43 producerId i64 | 51 producerEpoch i16 | 53 baseSequence i32 |
  57 recordsCount i32 | 61 records (compressed as one blob when codec != 0)
Record: length varint | attributes i8 | timestampDelta varlong |
  offsetDelta varint | keyLen varint, key | valueLen varint, value |
  headerCount varint | [hKeyLen varint, hKey utf8, hValLen varint, hVal]
All varints are zigzag-encoded (protobuf sint32/sint64).
"""
from __future__ import annotations

import struct
from typing import NamedTuple

_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _make_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C of ``data`` continuing from ``value`` (0 to start)."""
    c = value ^ 0xFFFFFFFF
    for byte in bytes(data):
        c = (c >> 8) ^ _TABLE[(c ^ byte) & 0xFF]
    return c ^ 0xFFFFFFFF


_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = 61
assert _HEADER.size == HEADER_SIZE


class Header(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return self.batch_length + 12

    @property
    def codec(self) -> int:
        return self.attributes & 0x07

    @property
    def timestamp_type(self) -> int:
        return (self.attributes >> 3) & 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & 0x10)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & 0x20)


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def read_header(buf: bytes, pos: int = 0) -> Header:
    return Header(*_HEADER.unpack_from(buf, pos))


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Zigzag varint/varlong at ``pos`` -> (value, next position)."""
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (raw >> 1) ^ -(raw & 1), pos


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = read_varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise ValueError("field runs past the record")
    return bytes(buf[pos:pos + n]), pos + n


def decode_records(data: bytes, count: int, base_offset: int,
                   base_timestamp: int, log_append_time: int = -1) -> list[Record]:
    """Decode ``count`` records from an uncompressed records section that
    they must fill exactly; ``log_append_time`` >= 0 overrides timestamps."""
    out = []
    pos = 0
    for _ in range(count):
        length, pos = read_varint(data, pos)
        end = pos + length
        if length < 0 or end > len(data):
            raise ValueError("record length out of range")
        body = bytes(data[pos:end])
        p = 1  # skip the unused attributes byte
        ts_delta, p = read_varint(body, p)
        off_delta, p = read_varint(body, p)
        key, p = _read_bytes(body, p)
        value, p = _read_bytes(body, p)
        nheaders, p = read_varint(body, p)
        if nheaders < 0:
            raise ValueError("negative header count")
        headers = []
        for _ in range(nheaders):
            hkey, p = _read_bytes(body, p)
            if hkey is None:
                raise ValueError("null header key")
            hval, p = _read_bytes(body, p)
            headers.append((hkey.decode("utf-8"), hval))
        if p != len(body):
            raise ValueError("record length does not match its fields")
        ts = log_append_time if log_append_time >= 0 else base_timestamp + ts_delta
        out.append(Record(base_offset + off_delta, ts, key, value, headers))
        pos = end
    if pos != len(data):
        raise ValueError("records do not fill the batch")
    return out


def decode_batch(buf: bytes, pos: int = 0,
                 check_crc: bool = True) -> tuple[Header, list[Record]]:
    """Header and records of the (uncompressed, or compressed via
    kbroker.record.compression) batch at ``pos``."""
    buf = bytes(buf)
    h = read_header(buf, pos)
    end = pos + h.size
    if h.magic != 2 or h.size < HEADER_SIZE or end > len(buf):
        raise ValueError("not a complete magic-2 batch")
    if check_crc and crc32c(buf[pos + 21:end]) != h.crc:
        raise ValueError("CRC mismatch")
    data = buf[pos + HEADER_SIZE:end]
    if h.codec:
        from kbroker.record.compression import decompress
        data = decompress(h.codec, data, 1 << 30)
    append_time = h.max_timestamp if h.timestamp_type else -1
    return h, decode_records(data, h.records_count, h.base_offset, h.base_timestamp,
                             append_time)
