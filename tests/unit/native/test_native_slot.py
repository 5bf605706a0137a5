"""The network layer's native request bookkeeping (ext/request.pyx: ``begin_native``, ``end_native``,
``Slot``, ``observe_slots``) on its own: what kbroker.network.connection relies on for every native
Produce/Fetch. Fast: no broker."""
from __future__ import annotations

import asyncio
import struct
import time
from collections import deque

import pytest

from kbroker._native.request import (ConnState, Slot, begin_native, dispatch_frames, end_native, observe_slots, parse_fetch,
                                     parse_produce, take_answers)
from kbroker.protocol.types import ProtocolError
from kbroker.request_metrics import REQUEST_STATS

NO_RESPONSE, CLOSE = object(), object()


def _s(b: bytes) -> bytes:
    return struct.pack(">h", len(b)) + b


def _fetch(replica_id: int) -> bytes:
    return (struct.pack(">hhi", 1, 4, 3) + _s(b"c") + struct.pack(">iiiib", replica_id, 500, 1, 1 << 20, 0)
            + struct.pack(">i", 1) + _s(b"t") + struct.pack(">i", 1) + struct.pack(">iqi", 0, 0, 1 << 20))


def _produce() -> bytes:
    return (struct.pack(">hhi", 0, 7, 9) + _s(b"c") + struct.pack(">h", -1) + struct.pack(">hi", 1, 1000)
            + struct.pack(">i", 1) + _s(b"t") + struct.pack(">i", 1) + struct.pack(">ii", 0, 3) + b"abc")


@pytest.fixture
def stats():
    REQUEST_STATS.clear()
    yield REQUEST_STATS
    REQUEST_STATS.clear()


def test_begin_queues_counts_and_tells_followers_apart(stats):
    pending, counts = deque(), {}
    arrived = time.monotonic()
    consumer = begin_native(_fetch(-1), parse_fetch, pending, counts, 5.0, arrived)
    follower = begin_native(_fetch(2), parse_fetch, pending, counts, 5.0, arrived)
    produce = begin_native(_produce(), parse_produce, pending, counts, 5.0, arrived)
    assert list(pending) == [consumer, follower, produce]
    assert counts == {(1, 4): 2, (0, 7): 1}
    assert (consumer.follower, follower.follower, produce.follower) == (False, True, False)
    assert produce.api_key == 0 and produce.header.correlation_id == 9 and produce.since == 5.0
    assert arrived <= produce.started <= time.monotonic()      # the same clock as time.monotonic
    for slot in (consumer, follower, produce):
        assert end_native(slot, [b"answer"], NO_RESPONSE, CLOSE)
        assert slot.done and slot.chunks == [b"answer"] and slot.queued >= slot.started
    observe_slots([consumer, follower, produce], time.monotonic())
    assert {s.name: s.count for s in stats.all()} == {"FetchConsumer": 1, "FetchFollower": 1, "Produce": 1}


def test_malformed_frame_queues_and_counts_nothing():
    pending, counts = deque(), {}
    with pytest.raises(ProtocolError):
        begin_native(_produce()[:-1], parse_produce, pending, counts, 0.0, 0.0)
    assert not pending and not counts


def test_end_native_leaves_an_awaitable_to_the_caller():
    slot = begin_native(_produce(), parse_produce, deque(), {}, 0.0, time.monotonic())
    loop = asyncio.new_event_loop()
    try:
        assert not end_native(slot, loop.create_future(), NO_RESPONSE, CLOSE)
        assert not slot.done and slot.chunks is None and slot.local >= 0.0
        assert end_native(slot, NO_RESPONSE, NO_RESPONSE, CLOSE) and slot.chunks is NO_RESPONSE
    finally:
        loop.close()


def test_slot_observe_counts_its_times(stats):
    slot = Slot(parse_produce(_produce()), 0.0, 10.0)
    slot.started, slot.local, slot.queued = 10.5, 0.25, 11.0
    slot.observe(12.0)
    s = stats.get(0)
    assert s.count == 1 and s.queue.sum_s == 0.5 and s.local.sum_s == 0.25
    assert s.send.sum_s == 1.0 and s.total.sum_s == 2.0 and s.remote.sum_s == pytest.approx(0.25)


# ---- dispatch_frames: the receive chunk's frame loop ---------------------------------------------------
class _Metrics:
    def __init__(self):
        self.requests = {}


class _Server:
    def __init__(self):
        self.metrics = _Metrics()


class _Chunk:
    def __init__(self, data: bytes, size: int = 4096):
        self.buf = bytearray(size)
        self.buf[:len(data)] = data
        self.view = memoryview(self.buf)
        self.refs = 0


class _Conn(ConnState):
    """What dispatch_frames reads and calls on a Connection (a ConnState, as the connection), recording
    the calls."""

    def __init__(self):
        self.closed, self._in_read, self._start = False, True, 0
        self._pending, self.server = deque(), _Server()
        self._request_counts = self.server.metrics.requests
        self.last_active, self._read_at = 1.0, 2.0
        self.generic, self.later, self.raised = [], [], []

    def _dispatch(self, frame, chunk):
        self.generic.append(bytes(frame[:2]))

    def _dispatch_later(self, slot, result, chunk):
        self.later.append(slot)

    def _handler_raised(self, slot):
        self.raised.append(slot)
        self.closed = True

    def _flush(self):
        raise AssertionError("no flush inside a read")


def _framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _run(conn, data, handler=None, end=None, supported=None):
    chunk = _Chunk(data)
    answers = {"p": handler or (lambda c, req: [b"ok"])}
    code = dispatch_frames(conn, chunk, 0, len(data) if end is None else end, 1 << 20, answers["p"], None,
                           {0: (3, 8)} if supported is None else supported, NO_RESPONSE, CLOSE)
    return code, chunk


def test_dispatch_frames_answers_native_frames_and_hands_on_the_rest():
    conn = _Conn()
    other = struct.pack(">hhi", 18, 0, 1) + _s(b"c")      # ApiVersions: not native
    data = _framed(_produce()) + _framed(other) + _framed(_produce()) + _framed(_produce())[:10]
    code, _ = _run(conn, data)
    assert code == 0 and conn._start == len(data) - 10             # stops before the partial frame
    assert conn.generic == [b"\x00\x12"] and len(conn._pending) == 2
    assert all(s.done and s.chunks == [b"ok"] for s in conn._pending)
    assert conn.server.metrics.requests == {(0, 7): 2}


def test_dispatch_frames_codes_for_bad_sizes_and_frames_too_large_for_the_chunk():
    conn = _Conn()
    assert _run(conn, _framed(_produce()) + struct.pack(">i", 0))[0] == 1
    assert conn._start == len(_framed(_produce()))                  # the bad prefix is at _start
    assert _run(_Conn(), struct.pack(">i", (1 << 20) + 1) + b"x")[0] == 1
    assert _run(_Conn(), struct.pack(">i", 5000) + b"x" * 10)[0] == 2     # 5000 B > the 4096 B chunk
    assert _run(_Conn(), struct.pack(">i", 3000) + b"x" * 10)[0] == 0     # fits: wait for the rest


def test_dispatch_frames_falls_back_and_stops_on_close():
    conn = _Conn()
    bad = _produce()[:-1]                                              # malformed: the generic outcome
    _run(conn, _framed(bad))
    assert conn.generic == [b"\x00\x00"] and not conn._pending
    conn = _Conn()
    _run(conn, _framed(_produce()), supported={0: (3, 6)})            # v7 not advertised: generic
    assert conn.generic == [b"\x00\x00"] and not conn._pending

    def boom(c, req):
        raise ValueError("handler failed")
    conn = _Conn()
    _run(conn, _framed(_produce()) * 3, handler=boom)
    assert len(conn.raised) == 1 and conn._start == len(_framed(_produce()))   # closed: no more frames
    conn = _Conn()
    loop = asyncio.new_event_loop()
    try:
        _run(conn, _framed(_produce()), handler=lambda c, req: loop.create_future())
    finally:
        loop.close()
    assert len(conn.later) == 1 and not conn.later[0].done


def test_take_answers_takes_the_common_head_and_leaves_the_rest():
    def slot(chunks, done=True):
        s = Slot(parse_produce(_produce()), 0.0, 0.0)
        s.chunks, s.done = chunks, done
        return s
    a, b, n, c, multi, tail = slot([b"a"]), slot([b"b"]), slot(NO_RESPONSE), slot(CLOSE), slot([b"x", b"y"]), slot([b"t"])
    pending, out, answered = deque([a, n, b, c, tail]), [], []
    take_answers(pending, out, answered, NO_RESPONSE)
    assert out == [b"a", b"b"] and answered == [a, n, b] and list(pending) == [c, tail]
    pending, out, answered = deque([multi, tail]), [], []
    take_answers(pending, out, answered, NO_RESPONSE)
    assert not out and not answered and list(pending) == [multi, tail]
    waiting = slot(None, done=False)
    pending, out, answered = deque([a, waiting, b]), [], []
    take_answers(pending, out, answered, NO_RESPONSE)
    assert out == [b"a"] and list(pending) == [waiting, b]
