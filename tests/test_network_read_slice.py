"""Once a frame it dispatched woke someone (``LoopWakes``: an append that resolved long-poll waiters),
one receive callback dispatches a chunk's frames for at most the server's read slice (connection.py
READ_SLICE_US, KBROKER_READ_SLICE_US), then hands the loop back and dispatches the rest later; on both
loops, against a real KafkaServer on 127.0.0.1 with a real client socket:

- what the first frame scheduled on the loop (a long poll's wake-up) runs before the chunk's last frame
  is dispatched; with no limit (0), or when nobody was woken, it runs only after all of them;
- every request is still answered, in request order, and the connection reads again afterwards;
- a frame that closes the connection mid-chunk ends the dispatch (no frame after it is handled; answers
  not yet written are dropped, as they are without slices).
"""
from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from kbroker.network.connection import LoopWakes
from kbroker.protocol import api
from kbroker.server.notify import AppendNotifier

from netserver import LOOPS, ServerThread, _conn

N = 60
BURN_S = 200e-6        # each request's handler CPU: N of them are 12 ms, many 1 ms slices


@pytest.fixture(autouse=True)
def _advertise():
    saved = dict(api.SUPPORTED)
    api.advertise(18, 0, 3)
    yield
    api.SUPPORTED.clear()
    api.SUPPORTED.update(saved)


class _Recorder:
    """ApiVersions handler that burns CPU per request; the first request queues a loop callback that
    notes how many requests had been handled when it ran (and, with ``wake``, counts as a wake-up as
    AppendNotifier.appended does)."""

    def __init__(self, wake=True):
        self.handled = 0
        self.woken_after = None
        self.wake = wake

    def __call__(self, conn, header, body):
        if self.handled == 0:
            conn.loop.call_soon(self._woken)
            if self.wake:
                LoopWakes.count += 1
        end = time.perf_counter() + BURN_S
        while time.perf_counter() < end:
            pass
        self.handled += 1
        return {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}],
                "throttle_time_ms": 0}

    def _woken(self):
        self.woken_after = self.handled


def _burst(s, first_id, n):
    s.sendall(b"".join(api.encode_request(18, 0, first_id + i, "t", {}) for i in range(n)))


def _read_ids(s, n, timeout=10.0):
    s.settimeout(timeout)
    data, ids = b"", []
    while len(ids) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        while len(data) >= 4 and len(data) >= 4 + struct.unpack(">i", data[:4])[0]:
            size = struct.unpack(">i", data[:4])[0]
            ids.append(struct.unpack(">i", data[4:8])[0])
            data = data[4 + size:]
    return ids


def _run(loop_name, slice_us, monkeypatch, wake=True):
    monkeypatch.setenv("KBROKER_READ_SLICE_US", str(slice_us))
    rec = _Recorder(wake)
    with ServerThread({18: rec}, loop_name=loop_name) as srv:
        s = _conn(srv.port)
        try:
            _burst(s, 1, N)
            ids = _read_ids(s, N)
            _burst(s, 1000, 3)          # reading resumed after the backlog
            more = _read_ids(s, 3)
        finally:
            s.close()
        slices = srv.call(lambda: srv.server.metrics.read_slices)
    return rec, ids, more, slices


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_chunk_is_dispatched_in_slices_and_answered_in_order(loop_name, monkeypatch):
    rec, ids, more, slices = _run(loop_name, 1000, monkeypatch)
    assert ids == list(range(1, N + 1))
    assert more == [1000, 1001, 1002]
    assert slices >= 1
    # the loop ran other callbacks well before the chunk's last frame (the burst may arrive in a few
    # reads; a 1 ms slice holds ~5 of these requests)
    assert rec.woken_after is not None and rec.woken_after < N // 2, rec.woken_after


@pytest.mark.parametrize("loop_name", LOOPS)
def test_without_a_slice_one_read_dispatches_its_whole_chunk(loop_name, monkeypatch):
    """The reference: with no limit, the callback queued by the first frame waits for every frame that
    arrived with it (when the whole burst came in one read, which a loopback sendall of 2 KB gives)."""
    rec, ids, more, slices = _run(loop_name, 0, monkeypatch)
    assert ids == list(range(1, N + 1))
    assert more == [1000, 1001, 1002]
    assert slices == 0
    assert rec.woken_after is not None and rec.woken_after > N // 2, rec.woken_after


@pytest.mark.parametrize("loop_name", LOOPS)
def test_nobody_woken_no_slices(loop_name, monkeypatch):
    """A saturating producer with no long poll to wake: the whole chunk in one callback (no loop turns,
    writes and epoll_ctl spent per slice)."""
    rec, ids, more, slices = _run(loop_name, 1000, monkeypatch, wake=False)
    assert ids == list(range(1, N + 1))
    assert more == [1000, 1001, 1002]
    assert slices == 0
    assert rec.woken_after is not None and rec.woken_after > N // 2, rec.woken_after


def test_an_append_counts_a_wake_only_when_it_resolves_waiters():
    async def main():
        notifier = AppendNotifier()
        before = LoopWakes.count
        notifier.appended(("t", 0))                 # nobody waiting
        assert LoopWakes.count == before
        fut = notifier.waiter([("t", 0), ("t", 1)])
        notifier.appended(("t", 1))
        assert fut.done() and LoopWakes.count == before + 1
        notifier.appended(("t", 0))                 # only the resolved future was left there
        assert LoopWakes.count == before + 1
        notifier.waiter([("t", 0)])
        notifier.appended(("t", 0))
        assert LoopWakes.count == before + 2

    asyncio.run(main())


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_close_mid_chunk_stops_the_dispatch(loop_name, monkeypatch):
    monkeypatch.setenv("KBROKER_READ_SLICE_US", "1000")
    rec = _Recorder()
    with ServerThread({18: rec}, loop_name=loop_name) as srv:
        s = _conn(srv.port)
        try:
            # 20 requests, then one of an unknown api key (closes the connection), then 20 more
            bad = bytearray(api.encode_request(18, 0, 99, "t", {}))
            struct.pack_into(">h", bad, 4, 32000)
            s.sendall(b"".join(api.encode_request(18, 0, 1 + i, "t", {}) for i in range(20)) + bytes(bad)
                      + b"".join(api.encode_request(18, 0, 100 + i, "t", {}) for i in range(20)))
            ids = _read_ids(s, 40)
            s.settimeout(5)
            assert s.recv(65536) == b""
        except (ConnectionResetError, socket.timeout) as e:      # pragma: no cover - reported below
            pytest.fail(f"connection not closed cleanly: {e!r}")
        finally:
            s.close()
        assert srv.call(lambda: len(srv.server.connections)) == 0
    # answers still unwritten when the bad frame closed the connection are dropped (as without slices)
    assert ids == list(range(1, len(ids) + 1)) and len(ids) <= 20, ids
    assert rec.handled == 20
