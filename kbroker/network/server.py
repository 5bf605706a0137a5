"""The listening socket: accepts connections and owns what they share (memory pool, handlers, metrics).

asyncio's accept loop already survives running out of file descriptors (on EMFILE/ENFILE it logs and
retries after a second instead of stopping), so a descriptor storm degrades service, not the broker.
"""
from __future__ import annotations

import asyncio
import logging
import select
import socket

from .connection import Connection
from .pool import MemoryPool

log = logging.getLogger(__name__)


class NetworkMetrics:
    """Counters the network layer keeps; the metrics endpoint exports them."""

    def __init__(self):
        self.requests: dict[tuple[int, int], int] = {}
        self.invalid_frames = 0
        self.memory_waits = 0
        self.idle_closed = 0
        self.hangups_while_paused = 0
        self.fetch_sendfile_calls = 0
        self.fetch_sendfile_bytes = 0
        self.fetch_copy_bytes = 0

    def count_request(self, key, version):
        k = (key, version)
        self.requests[k] = self.requests.get(k, 0) + 1


class KafkaServer:
    def __init__(self, host: str, port: int, handlers: dict, *, max_request_bytes: int,
                 pool_bytes: int, idle_ms: int, sendfile_min_bytes: int = 4096,
                 send_buffer_bytes: int = -1, receive_buffer_bytes: int = -1):
        if pool_bytes < max_request_bytes:
            raise ValueError("queued.max.request.bytes must be at least socket.request.max.bytes")
        self.host = host
        self.port = port
        self.handlers = handlers
        self.max_request_bytes = max_request_bytes
        self.pool = MemoryPool(pool_bytes)
        self.idle_ms = idle_ms
        self.sendfile_min_bytes = sendfile_min_bytes
        self.send_buffer_bytes = send_buffer_bytes
        self.receive_buffer_bytes = receive_buffer_bytes
        self.metrics = NetworkMetrics()
        self.connections: set[Connection] = set()
        self.memory_paused: set[Connection] = set()   # stopped reading until pool memory frees up
        self.loop = None
        self._server = None
        self._sweeper = None
        self._hangup_watch = None

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            # backlog also bounds how many accepts asyncio tries per readiness event
            self._new_connection, self.host or None, self.port, reuse_address=True, backlog=128)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.idle_ms > 0:
            self._sweeper = self.loop.create_task(self._sweep_idle())
        self._hangup_watch = self.loop.create_task(self._watch_hangups())
        log.info("listening on %s:%d", self.host or "*", self.port)

    def _new_connection(self):
        return Connection(self)

    async def _sweep_idle(self):
        # connections.max.idle.ms: a connection with no request for that long is closed.
        interval = max(self.idle_ms / 10_000, 0.05)
        while True:
            await asyncio.sleep(interval)
            deadline = self.loop.time() - self.idle_ms / 1000
            for conn in list(self.connections):
                if conn.last_active < deadline and not conn._pending and not conn._writing:
                    self.metrics.idle_closed += 1
                    conn.close()

    async def _watch_hangups(self, interval_s: float = 0.2):
        """Close memory-paused connections whose peer has gone. Their reservations (a receive chunk, a
        partial frame) would otherwise stay taken until connections.max.idle.ms, starving everyone
        else of pool memory. POLLRDHUP reports the peer's FIN without reading the pending data."""
        mask = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR
        while True:
            await asyncio.sleep(interval_s)
            if not self.memory_paused:
                continue
            poller = select.poll()
            by_fd = {}
            for conn in list(self.memory_paused):
                sock = conn.transport.get_extra_info("socket") if conn.transport else None
                if sock is None or sock.fileno() < 0:
                    continue
                by_fd[sock.fileno()] = conn
                poller.register(sock.fileno(), mask)
            for fd, _events in poller.poll(0):
                conn = by_fd[fd]
                self.metrics.hangups_while_paused += 1
                conn.transport.abort()   # nothing can be answered; release its memory now

    def tune_socket(self, sock: socket.socket):
        if self.send_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
        if self.receive_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer_bytes)

    async def stop(self):
        for task in (self._sweeper, self._hangup_watch):
            if task:
                task.cancel()
        if self._server:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server:
            await self._server.wait_closed()
