"""A loopback TCP proxy for fault tests: put it on a broker's advertised address (the path followers
fetch over and the controller sends on) or in front of ZooKeeper, then ``cut()`` the link and
``heal()`` it — a network partition without root, iptables or netns.

    with TcpProxy(target_port) as px:     # listens on 127.0.0.1:px.port, forwards to target_port
        px.cut()                          # drop every open connection, refuse new ones (closed at once)
        px.heal()                         # forward again

Runs its own asyncio loop in a daemon thread so blocking test code can drive it. Bounded: at most
``max_conns`` connections at a time, 64 KiB reads; loopback only.
"""
from __future__ import annotations

import asyncio
import threading

LOOPBACK = "127.0.0.1"


class TcpProxy:
    def __init__(self, target_port: int, *, listen_port: int = 0, max_conns: int = 256):
        self.target_port = target_port
        self.max_conns = max_conns
        self._listen_port = listen_port
        self.port: int | None = None
        self.cut_active = False
        self.accepted = 0
        self.refused = 0
        self._loop = asyncio.new_event_loop()
        self._server = None
        self._writers: set = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy->{target_port}",
                                        daemon=True)

    # ---- control (from the test's thread) -------------------------------------------------------
    def start(self) -> "TcpProxy":
        self._thread.start()
        self._call(self._start_server())
        return self

    def cut(self) -> None:
        """Stop forwarding: close every open connection; new ones are accepted and closed at once."""
        self._call(self._cut())

    def heal(self) -> None:
        self.cut_active = False

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def _call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ---- the loop's side ------------------------------------------------------------------------
    async def _start_server(self):
        self._server = await asyncio.start_server(self._accept, LOOPBACK, self._listen_port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _cut(self):
        self.cut_active = True
        for w in list(self._writers):
            w.transport.abort()          # RST-like: no orderly FIN handshake for the peer to wait on
        self._writers.clear()

    async def _shutdown(self):
        await self._cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader, writer):
        if self.cut_active or len(self._writers) >= 2 * self.max_conns:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        if self.cut_active:              # cut while we were connecting
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self.accepted += 1
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer, writer), self._pipe(up_reader, writer, up_writer))

    async def _pipe(self, reader, writer, other):
        try:
            while True:
                data = await reader.read(65536)
                if not data or self.cut_active:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side ended: end both so neither peer keeps a half-open connection.
            for w in (writer, other):
                self._writers.discard(w)
                w.transport.abort()
