"""Fuzzing the native Produce and Fetch parsers (kbroker._native.request), bounded in count and time.

Invariants:
- in process: any byte string handed to ``parse_produce`` / ``parse_fetch`` either parses or raises
  ProtocolError —
  no other exception, no crash, no read outside the frame (frames are exact-size copies, so an
  over-read would hit the following heap bytes, not the test's; the parsed records must lie inside the
  frame), and parsing is linear (a 1 MiB frame of garbage is refused quickly, counted not timed);
- on the wire: a real broker with the native path closes every connection that sent a malformed
  Produce or Fetch frame (or answers it, if the mutation left it valid) within a deadline, keeps answering other
  connections, and is still running at the end.
"""
from __future__ import annotations

import random
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkers import API_VERSIONS, RawConn, wait_for_topic
from kbroker._native import request as native
from kbroker.protocol import api
from kbroker.protocol.types import ProtocolError
from kbroker.testing import LocalCluster
from test_native_differential import fetch_frame, mutate, produce_frame


def _check(frame: bytes):
    buf = bytearray(frame)
    try:
        req = native.parse_produce(memoryview(buf))
    except ProtocolError:
        return "refused"
    for _name, parts in req.topics:
        for _index, rec in parts:
            if rec is not None:
                assert rec.obj is buf and len(rec) <= len(buf)
    return "ok"


def _check_fetch(frame: bytes):
    try:
        req = native.parse_fetch(memoryview(bytearray(frame)))
    except ProtocolError:
        return "refused"
    assert all(len(p) == 5 for _n, parts in req.topics for p in parts)
    return "ok"


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=0, max_size=512))
def test_random_bytes_never_crash(data):
    _check(data)
    _check_fetch(data)


@settings(max_examples=1500, deadline=None)
@given(st.integers(min_value=4, max_value=17), st.binary(min_size=0, max_size=256))
def test_fetch_valid_header_random_body(version, body):
    _check_fetch(struct.pack(">hhih", 1, version, 1, 1) + b"c" + body)


def test_mutated_fetch_seeded():
    rng = random.Random(98)
    seen = {"ok": 0, "refused": 0}
    for i in range(20000):
        seen[_check_fetch(mutate(rng, fetch_frame(rng, i))[4:])] += 1
    assert seen["refused"] > 5000 and seen["ok"] > 1000, seen


@settings(max_examples=1500, deadline=None)
@given(st.integers(min_value=3, max_value=11), st.binary(min_size=0, max_size=256))
def test_valid_header_random_body(version, body):
    _check(struct.pack(">hhih", 0, version, 1, 1) + b"c" + body)


def test_mutated_requests_seeded():
    rng = random.Random(99)
    seen = {"ok": 0, "refused": 0}
    for i in range(20000):
        frame = mutate(rng, produce_frame(rng, i))[4:]
        seen[_check(frame)] += 1
    assert seen["refused"] > 5000 and seen["ok"] > 1000, seen


def test_large_garbage_refused():
    rng = random.Random(5)
    # A header claiming a million topics followed by 1 MiB: refused by the array bound, not walked.
    frame = struct.pack(">hhihhhi", 0, 8, 1, -1, -1, 1, 30000) + struct.pack(">i", 1_000_000) \
        + bytes(rng.randrange(256) for _ in range(1 << 20))
    assert _check(frame) == "refused"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("native-fuzz"), num_partitions=2) as c:
        wait_for_topic(c.bootstrap, "d0", 2)
        wait_for_topic(c.bootstrap, "d1", 2)
        yield c


def test_wire_malformed_produce_closes(broker):
    rng = random.Random(4242)
    hung, answered, closed = [], 0, 0
    for i in range(300):
        frame = mutate(rng, fetch_frame(rng, i) if i % 3 == 2 else produce_frame(rng, i))
        with RawConn(broker.bootstrap, timeout=5) as c:
            c.send(frame)
            deadline = time.monotonic() + 5
            try:
                c.recv_frame(timeout=5)
                answered += 1
            except socket.timeout:
                hung.append(frame.hex())
            except (ConnectionError, OSError):
                closed += 1
            assert time.monotonic() <= deadline + 1
    assert hung == [] or all(_may_wait(bytes.fromhex(h)) for h in hung), hung[:2]
    assert closed > 100, (closed, answered)
    assert broker.brokers[0].running()
    with RawConn(broker.bootstrap) as c:
        assert c.request(API_VERSIONS, 3, {})["error_code"] == 0


def _may_wait(frame: bytes) -> bool:
    """A mutated frame that still parses as acks=0 Produce gets no answer by design (and no close); one
    that parses as a Fetch with max_wait_ms above the 5 s deadline is a legitimate long poll."""
    try:
        if frame[5] == 1:
            return native.parse_fetch(memoryview(frame)[4:]).max_wait_ms > 4000
        return native.parse_produce(memoryview(frame)[4:]).acks == 0
    except ProtocolError:
        return False


@pytest.mark.parametrize("parse,make", [(native.parse_produce, produce_frame), (native.parse_fetch, fetch_frame)])
def test_parsers_let_go_of_the_frame(parse, make):
    """A parsed (or refused) frame's buffer is released once nothing the parser returned refers to it:
    the connection reuses and may resize its receive buffers, which a leaked export would forbid."""
    rng = random.Random(7)
    buf = bytearray(make(rng, 1)[4:])
    with memoryview(buf) as view:
        req = parse(view)
    assert req.correlation_id == 1
    del req
    buf.append(0)                      # BufferError while any export of buf is left
    bad = bytearray(make(rng, 2)[4:])[:-1]     # truncated: refused
    with memoryview(bad) as view:
        with pytest.raises(ProtocolError):
            parse(view)
    bad.append(0)
