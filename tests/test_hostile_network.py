"""The network layer's guarantees against a real KafkaServer on 127.0.0.1 with real client sockets
(issue 9, items 1 and 2). The handlers here are the server's real dispatch table filled with small
handlers that fail on purpose: they are what a failing broker handler looks like to the network layer.

Invariants:
- a request whose handler raises, whose long-poll task raises, or whose answer cannot be encoded
  (over 2^31-1 bytes) gets its connection closed promptly, logged once; other connections keep working;
- a request that never completes is closed by the sweeper after connections.max.idle.ms;
- a frame that does not complete within the frame deadline closes its connection;
- max.connections.per.ip closes the extra connection at once; max.connections makes new clients wait
  in the backlog until a slot frees (then they are served);
- a large frame reserves pool memory only as its bytes arrive.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
import time

import pytest

from kbroker.network.connection import FRAME_STEP
from kbroker.network.server import KafkaServer
from kbroker.protocol import api

CLOSE_BOUND_S = 3.0


class ServerThread:
    def __init__(self, handlers, **kw):
        self.loop = asyncio.new_event_loop()
        self.handlers = handlers
        self.kw = dict(max_request_bytes=8 << 20, pool_bytes=32 << 20, idle_ms=60_000) | kw
        self.server = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = KafkaServer("127.0.0.1", 0, self.handlers, **self.kw)
        self.loop.run_until_complete(self.server.start())
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        fut.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def call(self, fn):
        return asyncio.run_coroutine_threadsafe(_call(fn), self.loop).result(10)

    @property
    def port(self):
        return self.server.port


async def _call(fn):
    return fn()


def _api_versions(conn, header, body):
    return {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}],
            "throttle_time_ms": 0}


async def _long_poll_fails(conn, header, body):
    await asyncio.sleep(0.2)
    raise RuntimeError("long-poll failed on purpose")


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


def _conn(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _answered(s, timeout=5.0) -> bool:
    """An ApiVersions round trip on ``s``, the whole response frame read."""
    s.sendall(api.encode_request(18, 0, 1, "t", {}))
    s.settimeout(timeout)
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = s.recv(65536)
        if not chunk:
            return False
        data += chunk
    return struct.unpack(">i", data[4:8])[0] == 1


def _closed_within(s, bound) -> float | None:
    t0 = time.monotonic()
    s.settimeout(bound)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return time.monotonic() - t0
    except (socket.timeout, TimeoutError):
        return None
    except OSError:
        return time.monotonic() - t0


FETCH_BODY = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
              "session_id": 0, "session_epoch": -1, "topics": [], "forgotten_topics_data": [], "rack_id": ""}


@pytest.mark.parametrize("case", ["long-poll-raises", "handler-raises", "answer-too-big"])
def test_failing_request_closes_its_connection_only(case, caplog):
    handlers = {18: _api_versions, 1: _long_poll_fails, 19: _raises, 3: _too_big}
    request = {"long-poll-raises": (1, 11, FETCH_BODY),
               "handler-raises": (19, 4, {"topics": [], "timeout_ms": 1000, "validate_only": False}),
               "answer-too-big": (3, 1, {"topics": []})}[case]
    with caplog.at_level(logging.WARNING), ServerThread(handlers) as srv:
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


def test_incomplete_frame_closed_at_the_frame_deadline():
    with ServerThread({18: _api_versions}, frame_timeout_ms=1000) as srv:
        with _conn(srv.port) as slow, _conn(srv.port) as ok:
            slow.sendall(struct.pack(">i", 100_000) + b"\0" * 10)
            t0 = time.monotonic()
            for _ in range(3):               # trickling bytes does not extend the deadline
                time.sleep(0.3)
                slow.sendall(b"\0")
            took = _closed_within(slow, 3.0)
            assert took is not None and 0.8 <= time.monotonic() - t0 <= 2.5
            assert _answered(ok)
        assert srv.server.metrics.frame_timeouts == 1


def test_large_frame_reserves_only_what_arrived():
    with ServerThread({18: _api_versions}) as srv:
        socks = [_conn(srv.port) for _ in range(20)]
        try:
            for s in socks:
                s.sendall(struct.pack(">i", (8 << 20) - 100) + b"\1" * 200_000)
            time.sleep(0.5)
            used = srv.call(lambda: srv.server.pool.used)
            # each: a 32 KiB chunk + what arrived + at most one step ahead (plus growth of half)
            bound = 20 * (32 * 1024 + 200_000 + max(FRAME_STEP, 100_000) + FRAME_STEP)
            assert used <= bound, (used, bound)
            assert used < 20 * (8 << 20) / 4        # nowhere near the announced sizes
        finally:
            for s in socks:
                s.close()
        wait = time.monotonic() + 5
        while srv.call(lambda: srv.server.pool.used) and time.monotonic() < wait:
            time.sleep(0.05)
        assert srv.call(lambda: srv.server.pool.used) == 0


def test_max_connections_per_ip_and_total():
    with ServerThread({18: _api_versions}, max_connections_per_ip=3) as srv:
        socks = [_conn(srv.port) for _ in range(3)]
        for s in socks:
            assert _answered(s)
        extra = _conn(srv.port)
        assert _closed_within(extra, CLOSE_BOUND_S) is not None, "4th connection from one address stayed open"
        socks[0].close()
        time.sleep(0.2)
        again = _conn(srv.port)
        assert _answered(again)
        for s in socks[1:] + [again, extra]:
            s.close()
    with ServerThread({18: _api_versions}, max_connections=2) as srv:
        a, b = _conn(srv.port), _conn(srv.port)
        assert _answered(a) and _answered(b)
        waiting = _conn(srv.port)          # connects (kernel backlog) but is not accepted yet
        waiting.sendall(api.encode_request(18, 0, 1, "t", {}))
        waiting.settimeout(0.7)
        with pytest.raises((socket.timeout, TimeoutError)):
            waiting.recv(8)
        a.close()                          # a slot frees: the waiting client is accepted and served
        waiting.settimeout(5)
        head = waiting.recv(8)
        assert len(head) == 8 and struct.unpack(">i", head[4:])[0] == 1, head
        for s in (b, waiting):
            s.close()


def test_accept_backs_off_before_the_descriptor_limit():
    """With RLIMIT_NOFILE = open + 120 when the server starts, accepting stops 30 descriptors before the
    limit (a quarter of it here; 64 normally): a flood of 140 clients (another process) never takes the
    last descriptors, so this process can still open files (as the ZooKeeper session, rolls and
    checkpoints must); a client waiting in the backlog is served once descriptors are free again."""
    import os
    import resource
    import subprocess
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    base = len(os.listdir("/proc/self/fd"))
    limit = base + 120
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    flood = None
    try:
        with ServerThread({18: _api_versions}) as srv:
            flood = subprocess.Popen([sys.executable, "-c", (
                "import resource, socket, sys\n"
                "h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
                "resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))\n"       # not our lowered limit
                f"s = [socket.create_connection(('127.0.0.1', {srv.port})) for _ in range(140)]\n"
                "print('connected', flush=True)\n"
                "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert flood.stdout.readline().strip() == "connected"
            time.sleep(1.0)
            open_now = len(os.listdir("/proc/self/fd"))
            served = srv.call(lambda: len(srv.server.connections))
            with open(os.devnull) as f:            # the reserve is there: files can still be opened
                assert f.fileno() < limit
            assert served < 140 and open_now <= limit - 20, (served, open_now, limit)
            assert srv.server.metrics.accept_pauses >= 1
            with _conn(srv.port) as waiting:        # queued behind the flood
                waiting.sendall(api.encode_request(18, 0, 1, "t", {}))
                flood.stdin.close()                 # the flood hangs up: descriptors come back
                flood.wait(10)
                waiting.settimeout(10)
                head = waiting.recv(8)
                assert len(head) == 8 and struct.unpack(">i", head[4:])[0] == 1, head
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


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
