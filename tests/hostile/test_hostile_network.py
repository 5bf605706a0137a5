"""The network layer's guarantees against a real KafkaServer on 127.0.0.1 with real client sockets.
The handlers here are the server's real dispatch table filled with small
handlers that fail on purpose: they are what a failing broker handler looks like to the network layer.

Invariants:
- a request whose handler raises, whose long-poll task raises, or whose answer cannot be encoded
  (over 2^31-1 bytes) gets its connection closed promptly, logged once; other connections keep working;
- a request that never completes is closed by the sweeper after connections.max.idle.ms;
- a connection paused for pool memory wakes when its own chunk frees.
The frame deadline, max.connections(.per.ip), pool reservation of large frames and the descriptor
reserve are tested on both event loops in tests/test_event_loop_network.py.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time

import pytest

from kbroker.protocol import api

from netserver import ServerThread, _answered, _closed_within, _conn

CLOSE_BOUND_S = 3.0


def _api_versions(conn, header, body):
    return {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}],
            "throttle_time_ms": 0}


async def _long_poll_fails(conn, header, body):
    await asyncio.sleep(0.2)
    raise RuntimeError("long-poll failed on purpose")


def _native_long_poll_fails(conn, req):
    # the native Fetch handler's long poll: a future of encoded chunks that fails (replica/longpoll.py
    # fails it when a read raises)
    fut = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.2, fut.set_exception, RuntimeError("long-poll failed on purpose"))
    return fut


def _raises(conn, header, body):
    raise KeyError("handler failed on purpose")


def _too_big(conn, header, body):
    # a Metadata answer the encoder cannot frame (a string longer than int16 allows)
    return {"throttle_time_ms": 0, "brokers": [], "cluster_id": "c", "controller_id": 0,
            "topics": [{"error_code": 0, "name": "x" * 70_000, "partitions": []}]}


def _never(conn, header, body):
    return asyncio.get_running_loop().create_future()     # a request that never completes


@pytest.fixture(autouse=True)
def _advertise():
    saved = dict(api.SUPPORTED)
    for k, hi in ((18, 3), (1, 11), (3, 8), (19, 4), (32, 4)):
        api.advertise(k, 0, hi)
    yield
    api.SUPPORTED.clear()
    api.SUPPORTED.update(saved)


FETCH_BODY = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
              "session_id": 0, "session_epoch": -1, "topics": [], "forgotten_topics_data": [], "rack_id": ""}


@pytest.mark.parametrize("case", ["long-poll-raises", "native-long-poll-fails", "handler-raises", "answer-too-big"])
def test_failing_request_closes_its_connection_only(case, caplog):
    handlers = {18: _api_versions, 1: _long_poll_fails, 19: _raises, 3: _too_big}
    native = {1: _native_long_poll_fails} if case == "native-long-poll-fails" else None
    request = {"long-poll-raises": (1, 11, FETCH_BODY), "native-long-poll-fails": (1, 11, FETCH_BODY),
               "handler-raises": (19, 4, {"topics": [], "timeout_ms": 1000, "validate_only": False}),
               "answer-too-big": (3, 1, {"topics": []})}[case]
    with caplog.at_level(logging.WARNING), ServerThread(handlers, native_handlers=native) as srv:
        with _conn(srv.port) as bystander, _conn(srv.port) as victim:
            assert _answered(bystander)
            victim.sendall(api.encode_request(request[0], request[1], 5, "t", request[2]))
            took = _closed_within(victim, CLOSE_BOUND_S)
            assert took is not None, f"{case}: no answer and no close within {CLOSE_BOUND_S}s"
            assert _answered(bystander), "the failure spilled onto another connection"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]


def test_request_that_never_completes_is_swept():
    with ServerThread({18: _api_versions, 32: _never}, idle_ms=1000) as srv:
        with _conn(srv.port) as s:
            s.sendall(api.encode_request(32, 0, 5, "t", {"resources": []}))
            took = _closed_within(s, 5.0)
            assert took is not None and took >= 0.9, took
        assert srv.server.metrics.stuck_requests_closed == 1


def test_connection_paused_for_memory_wakes_when_its_own_chunk_frees():
    """A's receive chunk is pinned by its own slow request and nearly full, so A needs a fresh chunk;
    B's partial frame and chunk leave the pool without one. Nobody else will free memory: only the
    completion of A's own request can (its chunk becomes reusable). A must wake then and answer its
    next request (before the fix it waited for a pool release that never came)."""
    async def slow_if_long(conn, header, body):
        if len(header.client_id or "") > 1000:
            await asyncio.sleep(1.0)
        return _api_versions(conn, header, body)

    with ServerThread({18: slow_if_long}, max_request_bytes=60 << 10, pool_bytes=80 << 10) as srv:
        a = _conn(srv.port)
        b = _conn(srv.port)
        try:
            time.sleep(0.2)
            b.sendall(struct.pack(">i", 50 << 10) + b"\1" * 10_000)      # B: chunk + a frame it cannot reserve
            time.sleep(0.2)
            a.sendall(api.encode_request(18, 0, 1, "x" * 29_500, {}))    # pins A's chunk for 1 s, fills it
            time.sleep(0.2)
            assert srv.call(lambda: srv.server.pool.available) < 32 << 10, "the pool is not short here"
            a.sendall(api.encode_request(18, 0, 2, "t", {}))
            a.settimeout(5)
            got = b""
            t0 = time.monotonic()
            while got.count(b"\0\0\0\2") == 0 and time.monotonic() - t0 < 5:
                chunk = a.recv(65536)
                if not chunk:
                    break
                got += chunk
            assert b"\0\0\0\2" in got, "A never woke after its own request completed"
            assert time.monotonic() - t0 < 3
        finally:
            a.close()
            b.close()
