"""The network layer's native request bookkeeping (ext/request.pyx: ``begin_native``, ``end_native``,
``Slot``, ``observe_slots``) on its own: what kbroker.network.connection relies on for every native
Produce/Fetch. Fast: no broker."""
from __future__ import annotations

import asyncio
import struct
import time
from collections import deque

import pytest

from kbroker._native.request import Slot, begin_native, end_native, observe_slots, parse_fetch, parse_produce
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
