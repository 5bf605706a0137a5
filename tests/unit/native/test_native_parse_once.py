"""A Produce or Fetch the fast path declines is walked once (ext/produce_path.pxi ``_produce_fast``,
ext/fetch_path.pxi ``_fetch_fast``): the handler gets the request the walk recorded (or, for a shape the
walk does not take, finished by parse_produce's / parse_fetch's own loop from where it stopped), which must
be exactly what ``parse_produce`` / ``parse_fetch`` give for the same frame; a malformed frame still gets
the generic outcome. In process: ``dispatch_frames`` with a FastProduce / FastFetch that leads nothing, so
every request is declined. Fast: no broker."""
from __future__ import annotations

import struct
from collections import deque

import pytest

from kbroker._native.request import ConnState, FastFetch, FastProduce, dispatch_frames, parse_fetch, parse_produce
from kbroker._native.segment import ReadBlocks
from kbroker.protocol.types import ProtocolError, uvarint_bytes
from builders import batch

NO_RESPONSE, CLOSE = object(), object()
ANSWER = [b"answer"]


def _s(b: bytes | None) -> bytes:
    return struct.pack(">h", -1) if b is None else struct.pack(">h", len(b)) + b


def _cs(b: bytes | None) -> bytes:
    return uvarint_bytes(0) if b is None else uvarint_bytes(len(b) + 1) + b


def _produce(version: int, topics, txn: bytes | None = None, acks: int = 1, part_tags: bytes = b"\0") -> bytes:
    """A Produce frame (size prefix removed): ``topics`` [(name bytes, [(index, records bytes or None)])]."""
    flex = version >= 9
    out = struct.pack(">hhi", 0, version, 41) + _s(b"client")
    if flex:
        out += b"\0" + _cs(txn)
    else:
        out += _s(txn)
    out += struct.pack(">hi", acks, 1500)
    out += uvarint_bytes(len(topics) + 1) if flex else struct.pack(">i", len(topics))
    for name, parts in topics:
        out += _cs(name) if flex else _s(name)
        out += uvarint_bytes(len(parts) + 1) if flex else struct.pack(">i", len(parts))
        for index, records in parts:
            out += struct.pack(">i", index)
            if flex:
                out += uvarint_bytes(0 if records is None else len(records) + 1) + (records or b"") + part_tags
            else:
                out += struct.pack(">i", -1 if records is None else len(records)) + (records or b"")
        if flex:
            out += b"\0"
    if flex:
        out += b"\0"
    return out


class _Chunk:
    def __init__(self, frame: bytes):
        self.buf = bytearray(struct.pack(">i", len(frame)) + frame)
        self.view = memoryview(self.buf)
        self.refs = 0


class _Conn(ConnState):
    def __init__(self):
        self.closed, self._in_read, self._start = False, True, 0
        self._pending, self._request_counts = deque(), {}
        self.last_active, self._read_at = 1.0, 2.0
        self._acl_write = self._acl_read = None
        self.generic = []

    def _dispatch(self, frame, chunk):
        self.generic.append(bytes(frame))

    def _dispatch_later(self, slot, result, chunk):
        raise AssertionError("the reference path answered at once")

    def _handler_raised(self, slot):
        raise AssertionError("the handler raised")

    def _flush(self):
        pass


def _declined(frame: bytes):
    """dispatch_frames of one frame with a FastProduce leading no partition -> (the request its reference
    path got or None, the frames handed to the generic path, the FastProduce)."""
    got = []

    def reference(conn, req):
        got.append((req, [(name, [(i, None if r is None else bytes(r)) for i, r in parts])
                          for name, parts in req.topics]))
        return ANSWER

    fp = FastProduce(reference, lambda tp: None, None, {}, {}, {}, {}, None, {}, 1 << 20, False)
    conn, chunk = _Conn(), _Chunk(frame)
    code = dispatch_frames(conn, chunk, 0, len(chunk.buf), 1 << 20, fp, None, {0: (3, 11)}, NO_RESPONSE, CLOSE)
    assert code == 0
    assert len(got) <= 1
    if got:
        assert conn._pending[0].header is got[0][0] and conn._pending[0].chunks is ANSWER
    return (got[0] if got else None), conn.generic, fp


def _same_as_parse(frame: bytes):
    (req, topics), generic, fp = _declined(frame)
    ref = parse_produce(frame)
    assert not generic
    assert fp.reference == 1 and fp.fast == 0
    for field in ("api_key", "api_version", "correlation_id", "client_id", "transactional_id", "acks", "timeout_ms"):
        assert getattr(req, field) == getattr(ref, field), field
    assert topics == [(name, [(i, None if r is None else bytes(r)) for i, r in parts]) for name, parts in ref.topics]
    return req, topics


B = batch(1)


@pytest.mark.parametrize("version", [3, 7, 8, 9, 11])
def test_a_declined_produce_gets_what_parse_produce_gives(version):
    # a topic this broker does not lead natively: the walk's request, whole
    _req, topics = _same_as_parse(_produce(version, [(b"orders", [(0, B), (3, B)]), (b"audit", [(1, B)])]))
    assert [(name, [i for i, _ in parts]) for name, parts in topics] == [("orders", [0, 3]), ("audit", [1])]


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_shapes_the_fast_path_never_takes_parse_the_same(version):
    # transactional, acks out of range, null and empty records: declined, parsed by the same walk
    req, _ = _same_as_parse(_produce(version, [(b"t", [(0, B)])], txn=b"txn-1"))
    assert req.transactional_id == "txn-1"
    _same_as_parse(_produce(version, [(b"t", [(0, B)])], acks=2))
    _same_as_parse(_produce(version, [(b"t", [(0, None), (1, b""), (2, B)])]))


@pytest.mark.parametrize("version", [7, 11])
def test_the_walk_resumes_where_it_stopped(version):
    # more than 64 partitions: the first topics as walked, the rest by parse_produce's loop
    _same_as_parse(_produce(version, [(b"a", [(i, B) for i in range(40)]), (b"b", [(i, B) for i in range(40)])]))
    # a non-UTF-8 name in a later topic is malformed, as parse_produce says
    frame = _produce(version, [(b"a", [(0, B)]), (b"\xff\xfe", [(0, B)])])
    with pytest.raises(ProtocolError):
        parse_produce(frame)
    req, generic, fp = _declined(frame)
    assert req is None and generic == [frame] and fp.reference == 0


def test_tagged_fields_resume_and_parse_the_same():
    # a partition's unknown tagged field (tag 7, 2 bytes): skipped as the reference codec skips it
    _same_as_parse(_produce(11, [(b"a", [(0, B)]), (b"b", [(5, B)])], part_tags=b"\x01\x07\x02xy"))


@pytest.mark.parametrize("version", [7, 11])
def test_malformed_frames_get_the_generic_outcome(version):
    good = _produce(version, [(b"orders", [(0, B)])])
    for frame in (good[:-1], good + b"\0", good[:30], good[:12]):
        with pytest.raises(ProtocolError):
            parse_produce(frame)
        req, generic, fp = _declined(frame)
        assert req is None and generic == [frame] and fp.reference == 0


# ---- Fetch -------------------------------------------------------------------------------------------------
TID = bytes(range(16))


def _fetch(version: int, topics, session=(0, -1), forgotten=(), rack: bytes = b"", replica_id: int = -1,
           tags: bytes = b"\0") -> bytes:
    """A Fetch frame: ``topics`` [(name bytes or 16-byte id, [(partition, fetch_offset)])]."""
    flex = version >= 12
    out = struct.pack(">hhi", 1, version, 77) + _s(b"client") + (b"\0" if flex else b"")
    if version < 15:
        out += struct.pack(">i", replica_id)
    out += struct.pack(">iiib", 500, 1, 1 << 20, 0)
    if version >= 7:
        out += struct.pack(">ii", *session)

    def count(n):
        return uvarint_bytes(n + 1) if flex else struct.pack(">i", n)

    def topic(name):
        return name if version >= 13 else (_cs(name) if flex else _s(name))
    out += count(len(topics))
    for name, parts in topics:
        out += topic(name) + count(len(parts))
        for index, offset in parts:
            out += struct.pack(">i", index) + (struct.pack(">i", 4) if version >= 9 else b"")
            out += struct.pack(">q", offset) + (struct.pack(">i", 3) if flex else b"")
            out += (struct.pack(">q", 0) if version >= 5 else b"") + struct.pack(">i", 1 << 16)
            out += b"\0" if flex else b""
        out += b"\0" if flex else b""
    if version >= 7:
        out += count(len(forgotten))
        for name, indexes in forgotten:
            out += topic(name) + count(len(indexes)) + b"".join(struct.pack(">i", i) for i in indexes)
            out += b"\0" if flex else b""
    if version >= 11:
        out += _cs(rack) if flex else _s(rack)
    if flex:
        out += tags
    return out


def _fetch_declined(frame: bytes, selector=None):
    got = []

    def reference(conn, req):
        got.append(req)
        return ANSWER

    cfg = {"fetch.max.bytes": 1 << 20, "replica.fetch.response.max.bytes": 1 << 20, "replica.selector.class": selector}
    ff = FastFetch(reference, lambda tp: None, {}, {}, cfg, ReadBlocks(0, 1 << 16), 1, {}, None, None, {TID: "t"})
    conn, chunk = _Conn(), _Chunk(frame)
    code = dispatch_frames(conn, chunk, 0, len(chunk.buf), 1 << 20, None, ff, {1: (4, 17)}, NO_RESPONSE, CLOSE)
    assert code == 0 and len(got) <= 1
    return (got[0] if got else None), conn.generic, ff


FETCH_FIELDS = ("api_key", "api_version", "correlation_id", "client_id", "replica_id", "max_wait_ms", "min_bytes",
                "max_bytes", "isolation_level", "session_id", "session_epoch", "topics", "forgotten", "rack_id",
                "ids", "unknown", "recorded", "frame")


def _fetch_same_as_parse(frame: bytes, selector=None):
    req, generic, ff = _fetch_declined(frame, selector)
    ref = parse_fetch(frame)
    assert not generic and ff.reference == 1 and ff.fast == 0
    for field in FETCH_FIELDS:
        assert getattr(req, field) == getattr(ref, field), field
    return req


@pytest.mark.parametrize("version", [4, 7, 11, 12, 13, 15, 17])
def test_a_declined_fetch_gets_what_parse_fetch_gives(version):
    name = TID if version >= 13 else b"orders"
    # a topic this broker does not lead natively: the walked layout, read once
    req = _fetch_same_as_parse(_fetch(version, [(name, [(0, 5), (2, 1 << 40)]), (name, [(1, 0)])]))
    assert [p[0] for p in req.topics[0][1]] == [0, 2]
    if version >= 7:
        # a session (full and incremental), forgotten topics: the rest parsed from the topic count
        assert _fetch_same_as_parse(_fetch(version, [(name, [(0, 5)])], session=(0, 0))).session_epoch == 0
        _fetch_same_as_parse(_fetch(version, [(name, [(0, 5)])], session=(123, 4), forgotten=[(name, [1, 2])]))
    if version >= 11:
        assert _fetch_same_as_parse(_fetch(version, [(name, [(0, 5)])], rack=b"r1"), selector="x").rack_id == "r1"
    if version >= 12:
        # the request's tagged fields: v15+'s replica_state names a follower
        tagged = _fetch(version, [(name, [(0, 5)])], tags=b"\x01\x01\x0d" + struct.pack(">iq", 2, 9) + b"\0")
        assert _fetch_same_as_parse(tagged).replica_id == (2 if version >= 15 else -1)


@pytest.mark.parametrize("version", [4, 11, 12, 13])
def test_a_malformed_fetch_gets_the_generic_outcome(version):
    name = TID if version >= 13 else b"orders"
    good = _fetch(version, [(name, [(0, 5)])])
    for frame in (good[:-1], good + b"\0", good[:20], good[:9]):
        with pytest.raises(ProtocolError):
            parse_fetch(frame)
        req, generic, ff = _fetch_declined(frame)
        assert req is None and generic == [frame] and ff.reference == 0
