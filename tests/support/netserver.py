"""A real KafkaServer on 127.0.0.1 in a thread of its own, and raw-socket helpers, for the network
layer's tests (tests/test_hostile_network.py, tests/test_event_loop_network.py)."""
from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

from kbroker.network.server import KafkaServer
from kbroker.protocol import api

LOOPS = ["asyncio", "uvloop"]


def _new_loop(name):
    if name == "uvloop":
        import uvloop
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class ServerThread:
    """A KafkaServer with ``handlers`` on its own event loop (``loop_name``: asyncio or uvloop) in a thread."""

    def __init__(self, handlers, loop_name="asyncio", **kw):
        self.loop_name = loop_name
        self.loop = _new_loop(loop_name)
        self.handlers = handlers
        self.kw = dict(max_request_bytes=8 << 20, pool_bytes=32 << 20, idle_ms=60_000) | kw
        self.server = None
        self.error = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        try:
            self.server = KafkaServer("127.0.0.1", 0, self.handlers, **self.kw)
            self.loop.run_until_complete(self.server.start())
        except BaseException as e:     # reported by __enter__
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(10)
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc):
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        fut.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def call(self, fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    @property
    def port(self):
        return self.server.port


def _conn(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _answered(s, timeout=5.0) -> bool:
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
            if not s.recv(65536):
                return time.monotonic() - t0
    except (socket.timeout, TimeoutError):
        return None
    except OSError:
        return time.monotonic() - t0
