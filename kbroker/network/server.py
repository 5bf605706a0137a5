"""The listening socket: accepts connections and owns what they share (memory pool, handlers, metrics).

Limits, with Kafka's semantics where Kafka has the key:
- ``max.connections``: at the limit the broker stops accepting (new clients wait in the listen backlog)
  until a connection closes; the few that one accept burst takes beyond it are closed at once.
- ``max.connections.per.ip``: a connection beyond its address's limit is closed right after accept.
- ``max.connection.creation.rate``, ``listener.name.<l>.max.connection.creation.rate`` and the
  ``connection_creation_rate`` of ``ips`` entities (KIP-612, kbroker/security/connection_quotas.py): over
  the broker-wide rate a connection is served late and accepting waits, over its listener's rate it is
  served late and that listener's accepting waits; over its address's rate it is closed after the
  throttle time, never served.
- descriptors: accepting stops ``FD_RESERVE`` descriptors before RLIMIT_NOFILE (as set when the
  server starts), so the ZooKeeper session, segment rolls and checkpoints always find one (asyncio's
  accept loop would survive EMFILE, but everything else in the process would fail with it); new
  clients wait in the listen backlog until descriptors are free again.
- ``kbroker.socket.request.frame.timeout.ms`` (kbroker's own: Kafka has no such deadline): a request
  frame must arrive in full within this time of its first byte, or its connection is closed.
- ``connections.max.idle.ms`` closes idle connections and also connections whose oldest request has
  been pending that long (an answer that will never come must end in a close, not a hang).

Loops (``kbroker.event.loop``): on asyncio's selector loop the listening sockets come from
``create_server`` and the accept loop is swapped in through the selector loop's own reader hooks; on any
other loop (uvloop) the server binds its own listening sockets, watches them with the public
``loop.add_reader`` and hands each accepted socket to ``loop.connect_accepted_socket``. The same limits
apply on both. asyncio's private transport internals (the native readable callback, writing straight to the
socket) are used only on the CPython version they were checked against (``ASYNCIO_INTERNALS_VERSION``);
on any other version readable events and answers go through asyncio's public paths.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import errno
import gc
import logging
import os
import resource
import select
import socket
import sys

from .. import switches
from .._native.request import ReadStats
from .connection import Connection, hostile_log
from .pool import FrameCache, MemoryPool
from .tlsconn import TlsReads, TlsTransport
from ..switches import ASYNCIO_INTERNALS_VERSION

log = logging.getLogger(__name__)

FD_RESERVE = 64        # descriptors kept free for everything that is not a client connection

try:
    _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):   # not glibc
    _malloc_trim = None


# Record ranges below this many bytes are copied into the Fetch response (pread on the loop) and
# larger ones go out with sendfile; a response copies at most this much in all. Measured with
# perf.request_bench sendfile-threshold (docs/perf/sendfile-threshold.md): copying costs less broker CPU
# per fetch than sendfile up to 32 KiB (0.6-0.85x with 1 and with 8 in flight), the same at 64 KiB,
# and sendfile wins beyond (0.26x of copy's CPU at 256 KiB with 8 in flight, 0.9x at 1 MiB with 1).
SENDFILE_MIN_BYTES = 64 * 1024

# Every request allocates a few dozen container objects (slots, tuples, lists), so the default
# generation-0 threshold (700) started a collection every ~20 small requests: 8% of the loop thread's busy
# samples in a one-record Produce profile. Most of those objects die young (refcounting frees them);
# cycles are rare on the request path. A higher threshold makes the collections that do run rarer, and
# freezing what start-up allocated keeps the older generations' collections from walking it.
GC_GEN0_THRESHOLD = 20_000


def _tune_gc() -> None:
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0 and gen0 < GC_GEN0_THRESHOLD:
        gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)
    gc.freeze()


class NetworkMetrics:
    """Counters the network layer keeps; the metrics endpoint exports them."""

    def __init__(self):
        self.requests: dict[tuple[int, int], int] = {}
        self.invalid_frames = 0
        self.memory_waits = 0
        self.idle_closed = 0
        self.hangups_while_paused = 0
        self.frame_timeouts = 0
        self.stuck_requests_closed = 0
        self.connections_rejected = 0     # per-ip or max.connections overflow, closed at accept
        self.accept_pauses = 0
        self.accept_delays = 0            # max.connection.creation.rate: accepting waited
        self.connections_throttled = 0    # over their address's connection_creation_rate, closed late
        self.fetch_sendfile_calls = 0
        self.fetch_sendfile_bytes = 0
        self.fetch_copy_bytes = 0
        self.reads = ReadStats()          # readable events served natively (on_read) / by Python

    def count_request(self, key, version):
        k = (key, version)
        self.requests[k] = self.requests.get(k, 0) + 1


class Listener:
    """One named listener (Kafka's ``listeners`` entry): where it binds and what its connections speak.
    ``port`` is the bound port once the server started (0 before, when any free port was asked for)."""

    def __init__(self, name: str, security_protocol: str, host: str, port: int, ssl_context=None,
                 principal_mapper=None, sasl=None):
        self.name = name                      # upper-case, e.g. PLAINTEXT, INTERNAL
        self.security_protocol = security_protocol
        self.host = host
        self.port = port
        self.ssl_context = ssl_context        # SSL and SASL_SSL listeners (kbroker.security.tls)
        self.principal_mapper = principal_mapper   # mTLS principals (ssl.principal.mapping.rules)
        self.sasl = sasl                      # SASL listeners: security.sasl.server.SaslListener
        self.socks: list[socket.socket] = []
        self.server = None                    # asyncio's Server (selector loop)

    def __repr__(self):
        return f"{self.name}://{self.host or '*'}:{self.port}"


class KafkaServer:
    def __init__(self, host: str, port: int, handlers: dict, *, max_request_bytes: int,
                 pool_bytes: int, idle_ms: int, sendfile_min_bytes: int = SENDFILE_MIN_BYTES,
                 send_buffer_bytes: int = -1, receive_buffer_bytes: int = -1,
                 max_connections: int = 2**31 - 1, max_connections_per_ip: int = 2**31 - 1,
                 frame_timeout_ms: int = 30000, native_handlers: dict | None = None,
                 listeners: list[Listener] | None = None, authorizing: bool = False, quotas=None):
        """``listeners``: every listener to bind (the connection limits and the pool are shared by all);
        without it, one PLAINTEXT listener on ``host``:``port``. ``authorizing``: an authorizer decides,
        so connections keep its decisions. ``quotas``: the client quotas' throttling (``any``,
        ``lookup``, ``request_in``, ``answer_out``: kbroker/server/apis/quotas.py), or None."""
        if pool_bytes < max_request_bytes:
            raise ValueError("queued.max.request.bytes must be at least socket.request.max.bytes")
        self.listeners = listeners or [Listener("PLAINTEXT", "PLAINTEXT", host, port)]
        self.host = self.listeners[0].host
        self.port = self.listeners[0].port      # the first listener's (set once bound)
        self.authorizing = authorizing
        self.quotas = quotas
        # KIP-612 connection creation rates (kbroker/security/connection_quotas.py); the inter-broker
        # listener is not bound by the broker-wide one
        self.connection_quotas = getattr(quotas, "connections", None)
        self.protected_listener = getattr(quotas, "protected_listener", None)
        self.handlers = handlers
        # Produce v3-8 through the native request path (kbroker._native.request) when the broker
        # passes its handler; native_requests off keeps every request on the schema codec (the
        # reference path) for side-by-side measurement and differential tests.
        native = dict(native_handlers or {})
        if not switches.current.native_requests and native:
            native.clear()
            log.info("native request path off (KBROKER_NATIVE_REQUESTS=0): every request uses the generic codec")
        self.native_produce = native.get(0)
        self.native_fetch = native.get(1)
        self.max_request_bytes = max_request_bytes
        # A quarter of the pool (never so much that a maximum-size frame could not arrive) is kept
        # for complete requests and receive chunks: frames still arriving cannot take it.
        keep = min(pool_bytes // 4, pool_bytes - max_request_bytes)
        self.pool = MemoryPool(pool_bytes, partial_limit=pool_bytes - keep)
        self.frames = FrameCache()       # recycled buffers of large frames (pool.py)
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.frame_timeout_ms = frame_timeout_ms
        self.per_ip: dict[str, int] = {}
        self._accepting = True
        # listener name -> loop time until which it does not accept (a connection creation rate is over)
        self._held: dict[str, float] = {}
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.fd_reserve = min(FD_RESERVE, soft // 4)
        self.fd_limit = soft - self.fd_reserve if soft != resource.RLIM_INFINITY else 2**31
        self._fd_paused = False
        self._accept_failing = False     # in an EMFILE episode (reported once)
        self._listen: list[tuple[socket.socket, Listener]] = []
        self.idle_ms = idle_ms
        # the sendfile_min_bytes switch overrides the threshold for measurements (perf.request_bench
        # sendfile-threshold runs one broker that always copies beside one that always uses sendfile).
        if switches.current.sendfile_min_bytes is not None:
            sendfile_min_bytes = switches.current.sendfile_min_bytes
            log.info("sendfile threshold from KBROKER_SENDFILE_MIN_BYTES: %d", sendfile_min_bytes)
        self.sendfile_min_bytes = sendfile_min_bytes
        self.send_buffer_bytes = send_buffer_bytes
        self.receive_buffer_bytes = receive_buffer_bytes
        self.metrics = NetworkMetrics()
        # One thread for the byte work of very large requests (decode/encode): serialised, so a flood
        # of them queues here (bounded by the request pool) rather than occupying every thread.
        self.heavy_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kbroker-heavy")
        self.connections: set[Connection] = set()
        self.memory_paused: set[Connection] = set()   # stopped reading until pool memory frees up
        self.loop = None
        self.selector_loop = False   # asyncio's selector loop (its private reader/writer hooks are used)
        self.native_read = False     # readable events in one native call (set in start: KBROKER_NATIVE_READ)
        # asyncio's private transport internals may be used (checked once: ASYNCIO_INTERNALS_VERSION)
        self.asyncio_internals = switches.current.asyncio_internals
        self._serving = False
        self._handshakes = 0         # accepted sockets whose connection_made has not run yet (uvloop)
        # TLS listeners: our TLS transport's shared state (native record reads when they may be used)
        self.tls_reads = TlsReads() if any(l.ssl_context is not None for l in self.listeners) else None
        self._sweeper = None
        self._hangup_watch = None
        self._loop_lag = None        # looplag.LoopLagSampler when KBROKER_LOOP_LAG_LOG is set

    async def start(self):
        self.loop = loop = asyncio.get_running_loop()
        _tune_gc()
        log.info("switches: %s", switches.current.describe())
        lag_log = switches.current.loop_lag_log
        if lag_log:
            from .looplag import LoopLagSampler
            self._loop_lag = LoopLagSampler(loop, lag_log.replace("{pid}", str(os.getpid())))
            self._loop_lag.start()
            log.info("loop-lag sampler writing to %s", self._loop_lag.file.name)
        self.selector_loop = all(hasattr(loop, a) for a in ("_add_reader", "_remove_reader", "_add_writer",
                                                             "_remove_writer", "_make_socket_transport"))
        # Connection.buffer_updated natively (ext/request.pyx on_read) on either loop (on asyncio's selector
        # loop its readable callback too: recv_ready); KBROKER_NATIVE_READ=0 keeps the Python reference
        # path (Connection._read_py)
        self.native_read = switches.current.native_read
        if not self.native_read:
            log.info("native read path off (KBROKER_NATIVE_READ=0): readable events in Python")
        if self.selector_loop and not self.asyncio_internals:
            log.info("asyncio transport internals checked on Python %d.%d only, this is %d.%d: readable "
                     "events through asyncio's own callback, answers through transport.write",
                     *ASYNCIO_INTERNALS_VERSION, *sys.version_info[:2])
        try:
            for listener in self.listeners:
                await self._open(listener)
        except BaseException:
            self._close_listeners()
            raise
        self.port = self.listeners[0].port
        self._serving = True
        add = loop._add_reader if self.selector_loop else loop.add_reader
        for sock, listener in self._listen:
            add(sock.fileno(), self._accept_ready, sock, listener)
        self._sweeper = loop.create_task(self._sweep())
        self._hangup_watch = loop.create_task(self._watch_hangups())
        for listener in self.listeners:
            log.info("listening on %s (%s, %s)", listener, listener.security_protocol, type(loop).__module__)
        if self.tls_reads is not None:
            log.info("%s", self.tls_reads.describe())

    async def _open(self, listener: Listener) -> None:
        if not self.selector_loop:
            listener.socks = self._bind(listener.host, listener.port)
        else:
            listener.server = await self.loop.create_server(
                # backlog also bounds how many accepts asyncio tries per readiness event
                lambda: Connection(self, listener), listener.host or None, listener.port, reuse_address=True,
                backlog=128)
            # Our own accept loop instead of asyncio's: that one accepts up to the backlog (128) per wake-up
            # before any limit can be checked, and logs every EMFILE; ours checks max.connections and the
            # descriptor reserve after each accept and reports descriptor exhaustion once per episode.
            listener.socks = [getattr(sk, "_sock", sk) for sk in listener.server.sockets]
            for sock in listener.socks:
                self.loop._remove_reader(sock.fileno())
        listener.port = listener.socks[0].getsockname()[1]
        self._listen.extend((sock, listener) for sock in listener.socks)

    def _close_listeners(self) -> None:
        for listener in self.listeners:
            if listener.server is not None:
                listener.server.close()
            else:
                for sock in listener.socks:
                    sock.close()

    @staticmethod
    def _bind(host: str, port: int) -> list[socket.socket]:
        """Listening sockets as create_server makes them: one per address of the host (all interfaces
        when it is empty), SO_REUSEADDR, IPv6 sockets v6-only, backlog 128, non-blocking. With port 0
        the first socket's port is reused for the others."""
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        socks, seen = [], set()
        try:
            for family, type_, proto, _name, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, type_, proto)
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(socks) > 1:
                    addr = (addr[0], socks[0].getsockname()[1]) + tuple(addr[2:])
                sock.bind(addr)
                sock.listen(128)
                sock.setblocking(False)
        except OSError:
            for sock in socks:
                sock.close()
            raise
        return socks

    async def _adopt(self, conn: socket.socket, addr, listener: Listener) -> None:
        """uvloop, and TLS on either loop: the accepted socket becomes a transport (TLS: a plain one under
        our TlsTransport, tlsconn.py, after the handshake, which must end within the frame deadline);
        connection_made (which counts it) has run when this returns."""
        try:
            if listener.ssl_context is None:
                await self.loop.connect_accepted_socket(lambda: Connection(self, listener), conn)
            else:
                tls = TlsTransport(listener.ssl_context, self.tls_reads, lambda: Connection(self, listener),
                                   self.frame_timeout_ms / 1000 if self.frame_timeout_ms > 0 else None,
                                   self.loop, hostile_log)
                await self.loop.connect_accepted_socket(lambda: tls, conn)
                try:
                    await tls.handshake
                except Exception as e:      # the transport has closed the socket
                    hostile_log(logging.WARNING, "cannot set up the connection from %s: %s", addr, e)
        except Exception as e:
            conn.close()
            hostile_log(logging.WARNING, "cannot set up the connection from %s: %s", addr, e)
        finally:
            self._handshakes -= 1
            if not self._accepting and not self._fd_paused:
                self._resume_accepting()

    # ---- connection accounting and accept control ------------------------------------------------
    def connection_opened(self, conn) -> None:
        ip = conn.peer[0] if conn.peer else None
        if len(self.connections) >= self.max_connections:
            self._reject(conn, "max.connections=%d reached" % self.max_connections)
            self._pause_accepting()
            return
        if self.per_ip.get(ip, 0) >= self.max_connections_per_ip:
            self._reject(conn, "max.connections.per.ip=%d reached for %s" % (self.max_connections_per_ip, ip))
            return
        conn.counted_ip = ip
        self.per_ip[ip] = self.per_ip.get(ip, 0) + 1
        self.connections.add(conn)
        if len(self.connections) >= self.max_connections:
            self._pause_accepting()

    def connection_closed(self, conn) -> None:
        if conn not in self.connections:
            return
        self.connections.discard(conn)
        ip = conn.counted_ip
        n = self.per_ip.get(ip, 0) - 1
        if n > 0:
            self.per_ip[ip] = n
        else:
            self.per_ip.pop(ip, None)
        if not self._accepting and len(self.connections) < self.max_connections:
            self._resume_accepting()

    def _reject(self, conn, why: str) -> None:
        self.metrics.connections_rejected += 1
        # One line per rejection would be an attacker-driven log storm: log every 1000th.
        if self.metrics.connections_rejected % 1000 == 1:
            log.warning("closing new connection from %s: %s (%d rejected so far)", conn.peer, why,
                        self.metrics.connections_rejected)
        conn.close()

    ACCEPT_BURST = 16    # accepts per wake-up of the listening socket (then other work gets a turn)

    def _accept_ready(self, sock, listener: Listener) -> None:
        selector = self.selector_loop
        for i in range(self.ACCEPT_BURST):
            # connection_made (which counts a connection) runs after this burst (after the adoption task
            # on uvloop): count the burst (the adoptions in flight) too
            if not self._accepting or \
                    len(self.connections) + (i if selector else 0) + self._handshakes >= self.max_connections:
                return
            try:
                conn, addr = sock.accept()
                conn.setblocking(False)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                if not self._accept_failing:
                    self._accept_failing = True
                    log.warning("cannot accept connections: %s; retrying every second until it works", e)
                self._pause_accepting(retry_s=1.0)
                return
            self._accept_failing = False
            rates = self.connection_quotas
            if rates is not None:
                broker_ms, listener_ms = rates.accept_delay_ms(listener.name, listener.name == self.protected_listener)
                if broker_ms or listener_ms:
                    # max.connection.creation.rate: this one is served late, and nothing is accepted meanwhile
                    # (on every listener but the inter-broker one for the broker-wide rate, as Kafka's
                    # acceptors wait; on this one for its own)
                    self.metrics.accept_delays += 1
                    for held in self.listeners:
                        ms = listener_ms if held is listener else 0
                        if broker_ms and held.name != self.protected_listener:
                            ms = max(ms, broker_ms)
                        if ms:
                            self._hold_listener(held, ms / 1000)
                    self.loop.call_later(max(broker_ms, listener_ms) / 1000, self._serve_accepted, conn, addr,
                                         listener)
                    return
            if not self._serve_accepted(conn, addr, listener):
                return

    def _serve_accepted(self, conn: socket.socket, addr, listener: Listener) -> bool:
        """An accepted socket becomes a connection (unless its address is over its connection rate);
        False when accepting must stop (descriptors nearly exhausted)."""
        if not self._serving:           # stopped while this one waited out the broker-wide rate
            conn.close()
            return False
        rates = self.connection_quotas
        if rates is not None:
            hold_ms = rates.ip_throttle_ms(addr[0]) if isinstance(addr, tuple) else 0
            if hold_ms > 0:
                # KIP-612: not served, closed after the throttle time so the client does not retry at once
                self.metrics.connections_throttled += 1
                if self.metrics.connections_throttled % 1000 == 1:
                    log.warning("closing new connection from %s in %d ms: over its connection_creation_rate "
                                "(%d so far)", addr[0], hold_ms, self.metrics.connections_throttled)
                self.loop.call_later(hold_ms / 1000, conn.close)
                return True
        if self.selector_loop and listener.ssl_context is None:
            self.loop._make_socket_transport(conn, Connection(self, listener), extra={"peername": addr},
                                             server=listener.server)
        else:
            self._handshakes += 1
            self.loop.create_task(self._adopt(conn, addr, listener))
        if conn.fileno() >= self.fd_limit:
            # this one is served; nothing more is accepted until descriptors are free again
            log.warning("descriptors nearly exhausted (fd %d of %d): not accepting until some close",
                        conn.fileno(), self.fd_limit + self.fd_reserve)
            self._fd_paused = True
            self._pause_accepting()
            self.loop.call_later(0.5, self._recheck_fds)
            return False
        return True

    def _pause_accepting(self, retry_s: float | None = None) -> None:
        if self._accepting and self._serving:
            self._accepting = False
            self.metrics.accept_pauses += 1
            remove = self.loop._remove_reader if self.selector_loop else self.loop.remove_reader
            for sock, _listener in self._listen:
                remove(sock.fileno())
        if retry_s is not None:
            self.loop.call_later(retry_s, self._resume_accepting)

    def _hold_listener(self, listener: Listener, seconds: float) -> None:
        """Stop accepting on one listener for ``seconds`` (a connection creation rate is over)."""
        until = self.loop.time() + seconds
        if listener.name in self._held:
            if until <= self._held[listener.name]:
                return
        elif self._accepting and self._serving:
            remove = self.loop._remove_reader if self.selector_loop else self.loop.remove_reader
            for sock in listener.socks:
                remove(sock.fileno())
        self._held[listener.name] = until
        self.loop.call_at(until, self._release_listener, listener, until)

    def _release_listener(self, listener: Listener, until: float) -> None:
        if self._held.get(listener.name) != until:
            return      # released already, or held longer since
        del self._held[listener.name]
        if self._accepting and self._serving:
            add = self.loop._add_reader if self.selector_loop else self.loop.add_reader
            for sock in listener.socks:
                add(sock.fileno(), self._accept_ready, sock, listener)

    def _recheck_fds(self) -> None:
        try:
            open_fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            open_fds = 0
        if open_fds < self.fd_limit - 8:        # a little below the mark, so accept does not flap
            log.info("descriptors available again (%d open): accepting", open_fds)
            self._fd_paused = False
            self._resume_accepting()
        else:
            self.loop.call_later(0.5, self._recheck_fds)

    def _resume_accepting(self) -> None:
        if self._accepting or not self._serving:
            return
        if len(self.connections) >= self.max_connections or self._fd_paused:
            return   # connection_closed resumes us
        self._accepting = True
        add = self.loop._add_reader if self.selector_loop else self.loop.add_reader
        for sock, listener in self._listen:
            if listener.name not in self._held:
                add(sock.fileno(), self._accept_ready, sock, listener)

    async def _sweep(self):
        """connections.max.idle.ms: a connection with no request for that long is closed, and so is one
        whose oldest request has been pending that long. A frame still incomplete
        kbroker.socket.request.frame.timeout.ms after its first byte closes its connection."""
        periods = [p for p in (self.idle_ms, self.frame_timeout_ms) if p > 0]
        if not periods:
            return
        interval = max(min(periods) / 20_000, 0.05)
        pool_high = False
        while True:
            await asyncio.sleep(interval)
            # After a burst that took much of the pool (an attack, a flood of large requests), hand the
            # freed heap back to the OS once the pool has drained: glibc keeps it otherwise.
            if self.pool.used > self.pool.capacity // 8:
                pool_high = True
            elif pool_high and self.pool.used < self.pool.capacity // 64 and _malloc_trim is not None:
                pool_high = False
                _malloc_trim(0)
            now = self.loop.time()
            self.frames.trim(now)
            idle_deadline = now - self.idle_ms / 1000 if self.idle_ms > 0 else None
            frame_deadline = now - self.frame_timeout_ms / 1000 if self.frame_timeout_ms > 0 else None
            for conn in list(self.connections):
                if conn.closed:
                    continue
                if frame_deadline is not None and conn.partial_since is not None \
                        and conn.partial_since < frame_deadline:
                    self.metrics.frame_timeouts += 1
                    hostile_log(logging.INFO, "closing %s: request frame incomplete after %d ms", conn.peer,
                                self.frame_timeout_ms)
                    conn.transport.abort()
                    continue
                if idle_deadline is None:
                    continue
                if conn._pending:
                    if conn._pending[0].since < idle_deadline:
                        self.metrics.stuck_requests_closed += 1
                        log.warning("closing %s: a request has been pending for connections.max.idle.ms",
                                    conn.peer)
                        conn.transport.abort()
                elif conn.last_active < idle_deadline and not conn._writing:
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
        if self._loop_lag is not None:
            self._loop_lag.stop()
        if self._serving:
            self._serving = False
            if self._accepting:
                remove = self.loop._remove_reader if self.selector_loop else self.loop.remove_reader
                for sock, _listener in self._listen:
                    remove(sock.fileno())
            self._close_listeners()
        for conn in list(self.connections):
            conn.close()
        self.heavy_executor.shutdown(wait=False, cancel_futures=True)
        for listener in self.listeners:
            if listener.server is not None:
                await listener.server.wait_closed()
