"""The network layer's rules on each event loop (kbroker.event.loop: asyncio's selector loop and uvloop),
against a real KafkaServer on 127.0.0.1 with real client sockets.

Invariants, on both loops:
- the server runs the loop it was given (uvloop: its own listening socket, connect_accepted_socket), and
  its accepted sockets have TCP_NODELAY;
- max.connections.per.ip closes the extra connection at once; max.connections keeps new clients in the
  listen backlog until a slot frees (then they are served);
- a frame that does not complete within kbroker.socket.request.frame.timeout.ms closes its connection,
  and trickled bytes do not extend the deadline;
- a large frame reserves pool memory only as its bytes arrive, and all of it comes back;
- accepting stops a reserve of descriptors before RLIMIT_NOFILE and resumes once they are free;
- the listening socket is closed at stop (a new connection is refused).
"""
from __future__ import annotations

import socket
import struct
import time

import pytest

from kbroker.network.connection import FRAME_STEP
from kbroker.protocol import api

from netserver import LOOPS, ServerThread, _answered, _closed_within, _conn


def _api_versions(conn, header, body):
    return {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}],
            "throttle_time_ms": 0}


@pytest.fixture(autouse=True)
def _advertise():
    saved = dict(api.SUPPORTED)
    api.advertise(18, 0, 3)
    yield
    api.SUPPORTED.clear()
    api.SUPPORTED.update(saved)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_runs_on_the_given_loop_and_closes_its_listener(loop_name):
    with ServerThread({18: _api_versions}, loop_name=loop_name) as srv:
        assert type(srv.loop).__module__.split(".")[0] == loop_name
        assert srv.server.selector_loop == (loop_name == "asyncio")
        socks = [_conn(srv.port) for _ in range(5)]
        assert all(_answered(s) for s in socks)
        assert srv.call(lambda: len(srv.server.connections)) == 5
        # Nagle off on every accepted socket: a small answer must not wait for the client's ACK
        nodelay = srv.call(lambda: [c.transport.get_extra_info("socket").getsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY) for c in srv.server.connections])
        assert len(nodelay) == 5 and all(nodelay), nodelay
        for s in socks:
            s.close()
        port = srv.port
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_max_connections_per_ip_and_total(loop_name):
    with ServerThread({18: _api_versions}, loop_name=loop_name, max_connections_per_ip=3) as srv:
        socks = [_conn(srv.port) for _ in range(3)]
        for s in socks:
            assert _answered(s)
        extra = _conn(srv.port)
        assert _closed_within(extra, 3.0) is not None, "4th connection from one address stayed open"
        assert srv.server.metrics.connections_rejected == 1
        socks[0].close()
        time.sleep(0.2)
        again = _conn(srv.port)
        assert _answered(again)
        for s in socks[1:] + [again, extra]:
            s.close()
    with ServerThread({18: _api_versions}, loop_name=loop_name, max_connections=2) as srv:
        a, b = _conn(srv.port), _conn(srv.port)
        assert _answered(a) and _answered(b)
        waiting = _conn(srv.port)          # connects (kernel backlog) but is not accepted yet
        waiting.sendall(api.encode_request(18, 0, 1, "t", {}))
        waiting.settimeout(0.7)
        with pytest.raises((socket.timeout, TimeoutError)):
            waiting.recv(8)
        assert srv.server.metrics.connections_rejected == 0   # it waited; it was not accepted and closed
        a.close()                          # a slot frees: the waiting client is accepted and served
        waiting.settimeout(5)
        head = waiting.recv(8)
        assert len(head) == 8 and struct.unpack(">i", head[4:])[0] == 1, head
        for s in (b, waiting):
            s.close()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_max_connections_holds_under_a_burst(loop_name):
    """20 clients connect at once to a server allowing 4: never more than 4 are served at a time (the
    burst is counted before connection_made runs), and the rest are served as slots free up."""
    with ServerThread({18: _api_versions}, loop_name=loop_name, max_connections=4) as srv:
        socks = [_conn(srv.port) for _ in range(20)]
        try:
            time.sleep(0.5)
            assert srv.call(lambda: len(srv.server.connections)) == 4
            assert srv.server.metrics.connections_rejected == 0
            served = 0
            for s in socks:
                assert _answered(s)           # served once the ones before it have gone
                s.close()
                served += 1
                assert srv.call(lambda: len(srv.server.connections)) <= 4
            assert served == 20
        finally:
            for s in socks:
                s.close()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_incomplete_frame_closed_at_the_frame_deadline(loop_name):
    with ServerThread({18: _api_versions}, loop_name=loop_name, frame_timeout_ms=1000) as srv:
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


@pytest.mark.parametrize("loop_name", LOOPS)
def test_large_frame_reserves_only_what_arrived(loop_name):
    with ServerThread({18: _api_versions}, loop_name=loop_name) as srv:
        socks = [_conn(srv.port) for _ in range(10)]
        try:
            for s in socks:
                s.sendall(struct.pack(">i", (8 << 20) - 100) + b"\1" * 200_000)
            time.sleep(0.5)
            used = srv.call(lambda: srv.server.pool.used)
            bound = 10 * (32 * 1024 + 200_000 + max(FRAME_STEP, 100_000) + FRAME_STEP)
            assert 0 < used <= bound, (used, bound)
        finally:
            for s in socks:
                s.close()
        wait = time.monotonic() + 5
        while srv.call(lambda: srv.server.pool.used) and time.monotonic() < wait:
            time.sleep(0.05)
        assert srv.call(lambda: srv.server.pool.used) == 0


@pytest.mark.parametrize("loop_name", LOOPS)
def test_accept_backs_off_before_the_descriptor_limit(loop_name):
    """RLIMIT_NOFILE = open + 120 at start: accepting stops a reserve (30 here) before the limit, so a
    flood of 140 clients (another process) leaves this process able to open files; a client waiting in
    the backlog is served once the flood hangs up."""
    import os
    import resource
    import subprocess
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = len(os.listdir("/proc/self/fd")) + 120
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    flood = None
    try:
        with ServerThread({18: _api_versions}, loop_name=loop_name) as srv:
            flood = subprocess.Popen([sys.executable, "-c", (
                "import resource, socket, sys\n"
                "h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
                "resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))\n"
                f"s = [socket.create_connection(('127.0.0.1', {srv.port})) for _ in range(140)]\n"
                "print('connected', flush=True)\n"
                "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert flood.stdout.readline().strip() == "connected"
            time.sleep(1.0)
            open_now = len(os.listdir("/proc/self/fd"))
            served = srv.call(lambda: len(srv.server.connections))
            with open(os.devnull) as f:
                assert f.fileno() < limit
            assert 0 < served < 140 and open_now <= limit - 20, (served, open_now, limit)
            assert srv.server.metrics.accept_pauses >= 1
            with _conn(srv.port) as waiting:
                waiting.sendall(api.encode_request(18, 0, 1, "t", {}))
                flood.stdin.close()
                flood.wait(10)
                waiting.settimeout(10)
                head = waiting.recv(8)
                assert len(head) == 8 and struct.unpack(">i", head[4:])[0] == 1, head
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
