"""One client connection: framing into pooled buffers, dispatch, and in-order responses.

Receiving (``asyncio.BufferedProtocol``): the kernel copies straight into a 32 KiB receive chunk; each
complete frame inside it is handed to the handler as a memoryview slice of the chunk (no copy). A frame
larger than what is left of the chunk gets a buffer of its own (an anonymous mmap: its pages cost
memory only once written; recycled through the server's FrameCache once no view of it is left, so a
stream of large Produce requests does not fault in fresh pages for each) which the kernel fills
directly; its size prefix is kept in front, so once complete it goes through the same native dispatch
as a chunk's frames (a chunk of one frame: ``_OwnFrame``). Pool memory for such a frame is reserved as
its bytes arrive, a step ahead of them (``FRAME_STEP``, then half of what has arrived), never for the
size it announces: a client that announces 100 MiB and sends 2 KB holds about ``FRAME_STEP``. The size
prefix is checked before anything is reserved: a frame over ``socket.request.max.bytes`` or a
non-positive size closes the connection. A chunk is reused from its start once no request still holds a
view into it; when its last view goes, a connection paused for memory is woken (it may need no more).
A frame must complete within ``kbroker.socket.request.frame.timeout.ms`` of its first byte (the server's
sweeper closes the connection otherwise).

One native call per readable event: ``buffer_updated`` is ``_native.request.on_read`` (the frames
dispatched, the chunk prepared for the next read, the one-chunk answers sent in one write, their slots
observed), which calls back into the methods here for every uncommon case; on asyncio's selector loop the
transport's readable callback is native too (``recv_ready``), on uvloop its own C calls ``on_read``.
``_read_py`` is the same in Python, the reference (``KBROKER_NATIVE_READ=0``). The native read calls
back here only where ``_read_py`` would do the same step: a large frame's own buffer (``_read_rest``), a
refused size prefix (``_chunk_code``), a chunk to rotate or pool memory to reserve (``_prepare`` /
``_wait_for_memory``), an answer of several chunks or ``CLOSE`` (``_flush``). The fields a read touches
are C fields of ``ConnState``, the native base class, which also holds copies of the server's fixed
values a request needs (native handlers, request counts, sendfile threshold), so none is an attribute
lookup.

Sending: requests may complete out of order (a long-polling Fetch, an acks=all Produce), but their
responses leave in request order (clients match correlation ids FIFO). Response chunks are bytes or
``FileRegions``; an answer with regions goes out through a native send step (ext/sendio.pyx
``SendCursor``: send/sendfile with the GIL released until the answer is out or the socket is full;
the would-block is a return code and the cursor an index and offset) once the transport's buffer is
empty. When the socket is full the rest goes out from a writability callback registered once for the
whole answer (asyncio's selector loop: the socket's own descriptor through its writer hook; uvloop,
which refuses a writer on a descriptor its transport owns: a dup() of it, registered with the public
``add_writer``). When earlier bytes are still in the transport's buffer, asyncio's ``loop.sendfile``
orders them (tiny ranges through an explicit counted copy); uvloop has no ``loop.sendfile``, so there
the same callback first waits for the buffer to drain. A short sendfile (file truncated underneath)
closes the connection because the response's size was already promised.
"""
from __future__ import annotations

import asyncio
import inspect
import io
import logging
import os
import struct
import time
from collections import deque

from .._native.sendio import SendCursor
from .._native.request import (ConnState, ReadStats, Slot, bind_read, dispatch_frames, lost_answer, next_buffer, observe_slots,
                               on_read, recv_ready, take_answers)
from ..protocol import api
from ..protocol.types import FileRegions, ProtocolError
from .. import request_metrics  # noqa: F401  (binds the slots' RequestStats registry)

_now = time.monotonic
_SUPPORTED = api.SUPPORTED      # mutated in place (advertise), never replaced

log = logging.getLogger(__name__)


class _LimitedLog:
    """What hostile input makes us say (malformed frames, failed handlers) goes through here: at most
    ``per_window`` lines per ``window_s``, then one line counting the rest, so an attacker or a fuzzer
    cannot turn the broker log into a disk-filling storm."""

    def __init__(self, per_window: int = 20, window_s: float = 10.0):
        self.per_window, self.window_s = per_window, window_s
        self.start, self.count, self.suppressed = -1e9, 0, 0

    def __call__(self, level, msg, *args, exc_info=False):
        now = time.monotonic()
        if now - self.start >= self.window_s:
            if self.suppressed:
                log.warning("%d more network warnings/errors like the above suppressed in %.0f s",
                            self.suppressed, self.window_s)
            self.start, self.count, self.suppressed = now, 0, 0
        if self.count < self.per_window:
            self.count += 1
            log.log(level, msg, *args, exc_info=exc_info)
        else:
            self.suppressed += 1


hostile_log = _LimitedLog()

CHUNK_SIZE = 32 * 1024
OFFLOAD_BYTES = 256 * 1024  # non-Produce requests this large are decoded and answered off the loop
FRAME_STEP = 64 * 1024      # pool memory a large frame may hold beyond the bytes it has sent
_MIN_TAIL = 4096            # below this much free tail space, rotate the chunk rather than read in dribbles
_SIZE = struct.Struct(">i")

# Kafka's sasl.server.max.receive.size: the largest frame a connection may send before it authenticated
SASL_MAX_RECEIVE_BYTES = 524288
SASL_AUTHENTICATE = 36
_BEFORE_AUTHENTICATION = frozenset((api.API_VERSIONS, 17, SASL_AUTHENTICATE))   # ApiVersions, SaslHandshake

NO_RESPONSE = object()      # acks=0 produce: nothing is sent back
CLOSE = object()            # handler asks to close the connection (e.g. acks=0 produce with an error)

bind_read(_SUPPORTED, NO_RESPONSE, CLOSE, _MIN_TAIL)


def _timed_call(fn, *args):
    """(fn(*args), the seconds it took): work the heavy thread does for a request, for its quota."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


class EncodeOffLoop:
    """A response body a handler knows to be large (an answer it built in slices: ListOffsets,
    DescribeConfigs, CreateTopics naming thousands of entries). The connection encodes it on the
    server's heavy thread, as it does for requests over OFFLOAD_BYTES: encoding a 12 MB DescribeConfigs
    answer on the loop held every other client for 0.4 s even though the answer was built in slices."""

    __slots__ = ("body",)

    def __init__(self, body):
        self.body = body


class _Chunk:
    __slots__ = ("buf", "view", "refs", "retired", "pool", "owner")

    def __init__(self, pool, size, owner):
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self.refs = 0          # frames dispatched from this chunk and not yet completed
        self.retired = False   # no longer read into; its memory goes back when refs reaches 0
        self.pool = pool
        self.owner = owner

    def unref(self):
        self.refs -= 1
        if self.refs == 0:
            if self.retired:
                self.pool.release(len(self.buf))
            elif self.owner._paused_mem:
                # Its owner may be waiting for a fresh chunk only because this one was in use.
                self.owner.loop.call_soon(self.owner._on_memory)


class _OwnFrame:
    """A frame too large for the receive chunk, complete in a buffer of its own (size prefix in
    front): dispatch_frames serves it as a chunk of one frame. ``refs`` as a chunk's; ``done`` gives
    the buffer and its pool memory back once the dispatch returned (``retire``) and no request holds
    a view of it."""
    __slots__ = ("buf", "view", "refs", "retired", "done")

    def __init__(self, buf, done):
        self.buf = buf
        self.view = memoryview(buf)
        self.refs = 0
        self.retired = False
        self.done = done

    def unref(self):
        self.refs -= 1
        if self.refs == 0 and self.retired:
            self._free()

    def retire(self):
        self.retired = True
        if self.refs == 0:
            self._free()

    def _free(self):
        self.buf = self.view = None     # the FrameCache reuses a buffer only once no view is left
        self.done()


# One request from its frame to its answer's last byte (its metrics' times too): a C type
# (ext/request.pyx), counted into REQUEST_STATS by ``observe``/``observe_slots``.
_Slot = Slot


class Connection(ConnState, asyncio.BufferedProtocol):
    # ConnState (ext/request.pyx): the fields every read touches, as C fields (on_read)
    def __init__(self, server, listener):
        self.server = server
        self.listener = listener
        # Who the client is, for the authorizer: "User:ANONYMOUS" until authenticated (and for good on
        # PLAINTEXT, or SSL without a client certificate); the listener it came in on; its address.
        self.listener_name = listener.name
        self.principal = "User:ANONYMOUS"
        self.client_host = ""
        # Under TLS the bytes on the socket are records of our TLS transport (tlsconn.py, which decrypts
        # into this connection's receive views): nothing may read or send on the socket itself (no direct
        # send, no sendfile, no native recv); answers go through transport.write, file ranges copied
        # (_write_copied).
        self.tls = listener.ssl_context is not None
        # SASL listeners: nothing but ApiVersions, SaslHandshake and SaslAuthenticate until the client
        # authenticated (set up in _await_authentication)
        self.authenticated = listener.sasl is None
        self.sasl_server = None   # the mechanism's server side once SaslHandshake chose it
        self.sasl_raw = False     # after a v0 SaslHandshake: the tokens come as bare size-prefixed frames
        self._auth_failed = False
        self._session_timer = None    # the end of a SASL session (connections.max.reauth.ms)
        self.pool = server.pool
        self.max_frame = server.max_request_bytes
        self.loop = server.loop
        # asyncio's own loops read time.monotonic() in loop.time(): one clock read per wake-up serves both
        # the sweeper's idle clock and the request metrics (other loops, e.g. uvloop, keep loop.time()).
        self._loop_clock_is_monotonic = getattr(type(self.loop), "time", None) is asyncio.BaseEventLoop.time
        self.transport = None
        self.peer = None
        self.closed = False
        self.last_active = self.loop.time()
        self.counted_ip = None    # set once the server counted us against max.connections.per.ip
        self._chunk: _Chunk | None = None
        self._start = 0           # first unparsed byte in the chunk
        self._end = 0             # end of received bytes in the chunk
        self._frame = None        # dedicated buffer (mmap) of a large frame being received
        self._frame_size = 0
        self._frame_fill = 0
        self._frame_reserved = 0  # partial pool memory held for it (fill <= reserved <= size)
        self._frame_need = 0      # size of a large frame waiting for pool memory
        self.partial_since = None # loop time of the first byte of a frame not yet complete
        self._waiting_mem = False # queued in the pool's waiters
        self._next = None         # memoryview handed to the kernel by get_buffer
        self._paused_mem = False
        self._paused_write = False
        self._pending: deque[_Slot] = deque()
        self._writing = False
        self._write_fd = -1       # fd we registered for writability (-1: none; a dup of ours on uvloop)
        self._selector = server.selector_loop
        # on_read may send on the socket itself (asyncio's transport, whose internals it checks first)
        self._direct_write = server.selector_loop and server.asyncio_internals and not self.tls
        self._send_rest = None    # (slot, SendCursor) of an answer waiting for the socket (_on_writable)
        self._sock_fd = -1        # the socket's descriptor (direct sends)
        self._in_read = False     # dispatching the frames of one read: defer writes to its end
        self._read_at = 0.0       # monotonic time of the last read (when its frames became complete)
        self._reads: ReadStats = server.metrics.reads
        # the server's constants the native read uses, as C fields of ConnState (fixed at its start)
        self._native_produce = server.native_produce      # None when the native path is off
        self._native_fetch = server.native_fetch
        self._request_counts = server.metrics.requests
        self._sendfile_min = server.sendfile_min_bytes
        self._native_read = server.native_read
        # What the client may do: the authorizer's decisions so far (kbroker/server/apis/authz.py); the
        # native sets are None when the server has no authorizer.
        self.acl_decisions = {}
        self._acl_write = set() if server.authorizing else None
        self._acl_read = set() if server.authorizing else None
        self._acl_cluster = False
        # Client quotas: the client-id of the last request (``_identified`` once there was one) and the
        # bounds that apply (None: none); a connection with bounds takes the reference path for
        # Produce and Fetch so every byte is counted. Muted (not read) until ``_muted_until`` when over.
        self.client_id = None
        self._identified = False
        self.quota = None
        self._muted_until = 0.0
        self._mute_timer = None
        if server.quotas is not None and server.quotas.any():
            self._native_produce = self._native_fetch = None    # until its client-id is known
        if not self.authenticated:
            self._await_authentication()
        if not server.native_read:
            # the reference path (KBROKER_NATIVE_READ=0)
            self.get_buffer = self._get_buffer_py
            self.buffer_updated = self._read_py

    # ---- asyncio callbacks ---------------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        self.client_host = self.peer[0] if self.peer else ""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.server.tune_socket(sock)
            if not self.tls:
                self._sock_fd = sock.fileno()
        if self.tls and not self._tls_principal(transport):
            return
        if (self._native_read and self._sock_fd >= 0 and self.server.asyncio_internals
                and hasattr(transport, "_read_ready_cb")):
            # asyncio's selector transport: its readable callback's recv into our buffer made native too
            # (ext/conn.pxi recv_ready: asyncio's _read_ready__get_buffer, then on_read)
            transport._read_ready_cb = self._recv_ready
        self.server.connection_opened(self)
        if not self._prepare():
            self._wait_for_memory()

    def connection_lost(self, exc):
        self.closed = True
        # Drop a writability registration of ours while the fd is still ours: asyncio closes the socket
        # right after this returns, and its _force_close only removes writers it registered itself. A
        # stale selector key would break the next connection that gets the same fd number.
        self._unregister_writer()
        self._send_rest = None
        if self._session_timer is not None:
            self._session_timer.cancel()
            self._session_timer = None
        if self._mute_timer is not None:
            self._mute_timer.cancel()
            self._mute_timer = None
        self.server.connection_closed(self)
        self.server.memory_paused.discard(self)
        if self._waiting_mem:
            self._waiting_mem = False
            self.pool.forget(self._on_pool_memory)
        if self._chunk is not None:
            self._retire_chunk()
        if self._frame is not None:
            self.pool.release(self._frame_reserved, partial=True)
            self._frame = None
        self._next = None         # the last view handed to the kernel keeps a frame's mmap alive

    def pause_writing(self):
        # The client is not reading its responses: stop taking new requests (Kafka mutes the channel).
        self._paused_write = True
        self.transport.pause_reading()

    def resume_writing(self):
        self._paused_write = False
        if not self._paused_mem and self._mute_timer is None and not self.closed:
            self.transport.resume_reading()

    # ---- client quotas (kbroker/server/apis/quotas.py) -----------------------------------------------
    def refresh_quota(self):
        """Look up the bounds of this connection's principal and client-id again (either changed, or
        the quotas did): with bounds, Produce and Fetch take the reference path."""
        quotas = self.server.quotas
        self.quota = quotas.lookup(self.principal, self.client_id) if self._identified else None
        native = self.authenticated and self.quota is None and (self._identified or not quotas.any())
        self._native_produce = self.server.native_produce if native else None
        self._native_fetch = self.server.native_fetch if native else None

    def throttle(self, ms: int):
        """Stop reading this connection for ``ms`` (KIP-219; answers already due still go out)."""
        if self.closed or ms <= 0:
            return
        until = self.loop.time() + ms / 1000
        if until <= self._muted_until:
            return
        self._muted_until = until
        if self._mute_timer is None:
            self.transport.pause_reading()
            self._mute_timer = self.loop.call_at(until, self._unmute)

    def _unmute(self):
        self._mute_timer = None
        if self.closed:
            return
        if self.loop.time() < self._muted_until:        # extended meanwhile
            self._mute_timer = self.loop.call_at(self._muted_until, self._unmute)
        elif not self._paused_mem and not self._paused_write:
            self.transport.resume_reading()

    # A readable event in one native call (ext/request.pyx ``on_read``: the frames dispatched, the
    # chunk prepared, the answers taken and sent, the slots observed), which calls the methods below
    # for every uncommon case. ``_read_py`` is the same in Python: the reference path.
    get_buffer = next_buffer
    buffer_updated = on_read
    _recv_ready = recv_ready

    def _get_buffer_py(self, sizehint):
        return self._next

    def _read_py(self, nbytes):
        self._read_at = now = _now()
        self.last_active = now if self._loop_clock_is_monotonic else self.loop.time()
        self._reads.reference += 1
        self._read_rest(nbytes)

    def _read_rest(self, nbytes):
        self._in_read = True      # responses of the frames in this read are flushed together, below
        try:
            self._consume(nbytes)
        finally:
            self._in_read = False
        self._flush()

    def _consume(self, nbytes):
        self._next = None
        if self._frame is not None:
            self._frame_fill += nbytes
            if self._frame_fill == self._frame_size:
                self._complete_frame()
        else:
            self._end += nbytes
            self._parse_chunk()
        if self.closed:
            return
        if self._frame is not None or self._frame_need or self._end > self._start:
            if self.partial_since is None:
                self.partial_since = self.last_active
        else:
            self.partial_since = None
        if not self._prepare():
            self._wait_for_memory()

    def _complete_frame(self):
        frame, self._frame = self._frame, None
        size = self._frame_size
        self.pool.settle(size)            # arrived in full: no longer a partial reservation
        frames, pool, loop = self.server.frames, self.pool, self.loop

        def done():
            pool.release(size)
            frames.give(frame, loop.time())     # reused only once no view of it is left

        own = _OwnFrame(frame, done)
        start = self._start       # the receive chunk's (all of it went into the frame: start == end)
        try:
            self._dispatch_frames(own, 0, 4 + size)
        finally:
            self._start = start   # dispatch_frames moved it through the frame's own buffer
            own.retire()

    def eof_received(self):
        return False  # close our side too

    # ---- receive path ----------------------------------------------------------------------------
    def _dispatch_frames(self, chunk, start, end):
        # every complete frame from start to end in one native call (ext/request.pyx dispatch_frames:
        # the native Produce/Fetch path inline, every other frame through _dispatch)
        return dispatch_frames(self, chunk, start, end, self.max_frame, self._native_produce, self._native_fetch,
                               _SUPPORTED, NO_RESPONSE, CLOSE)

    def _parse_chunk(self):
        chunk = self._chunk
        code = self._dispatch_frames(chunk, self._start, self._end)
        if not code or self.closed:
            return
        self._chunk_code(code)

    def _chunk_code(self, code):
        """dispatch_frames stopped at a size prefix: refused (1) or a frame for a buffer of its own (2)."""
        size = _SIZE.unpack_from(self._chunk.buf, self._start)[0]
        if code == 1:
            self._refuse("request size %d outside (0, %d]", size, self.max_frame)
        else:
            # Will not fit in this chunk: give the frame a buffer of its own; the kernel fills
            # the rest of it directly. Only the prefix already received is copied.
            self._frame_need = size

    def _prepare(self) -> bool:
        """Set up the buffer for the next read. False if pool memory is needed and not available."""
        if self._frame is not None:
            if self._frame_fill == self._frame_reserved:
                grow = min(self._frame_size - self._frame_reserved, max(FRAME_STEP, self._frame_reserved // 2))
                if not self.pool.try_reserve(grow, partial=True):
                    return False
                self._frame_reserved += grow
            self._next = memoryview(self._frame)[4 + self._frame_fill:4 + self._frame_reserved]
            return True
        if self._frame_need:
            size = self._frame_need
            have = self._end - self._start - 4
            first = min(size, have + FRAME_STEP)
            if not self.pool.try_reserve(first, partial=True):
                return False
            self._frame_need = 0
            # the size prefix is kept in front: the complete frame is dispatched as a chunk of one frame
            frame = self.server.frames.take(4 + size, self.last_active)
            frame[:4 + have] = self._chunk.buf[self._start:self._end]
            self._start = self._end
            self._frame, self._frame_size, self._frame_fill, self._frame_reserved = frame, size, have, first
            self._next = memoryview(frame)[4 + have:4 + first]
            return True
        chunk = self._chunk
        if chunk is not None and self._start == self._end and chunk.refs == 0:
            self._start = self._end = 0          # nothing outstanding: reuse from the beginning
        if chunk is None or len(chunk.buf) - self._end < _MIN_TAIL:
            partial = self._end - self._start
            if chunk is not None and chunk.refs == 0:
                chunk.buf[:partial] = chunk.buf[self._start:self._end]   # < 1 frame header or small frame prefix
            else:
                if not self.pool.try_reserve(CHUNK_SIZE):
                    return False
                fresh = _Chunk(self.pool, CHUNK_SIZE, self)
                if chunk is not None:
                    fresh.buf[:partial] = chunk.buf[self._start:self._end]
                    self._retire_chunk()
                self._chunk = chunk = fresh
            self._start, self._end = 0, partial
        self._next = chunk.view[self._end:]
        return True

    def _retire_chunk(self):
        chunk, self._chunk = self._chunk, None
        chunk.retired = True
        if chunk.refs == 0:
            self.pool.release(len(chunk.buf))

    def _wait_for_memory(self):
        if not self._paused_mem:
            self._paused_mem = True
            self.server.metrics.memory_waits += 1
            self.transport.pause_reading()
            # A paused transport would never notice the peer hanging up; the server watches for it.
            self.server.memory_paused.add(self)
        if not self._waiting_mem:
            self._waiting_mem = True
            self.pool.wait(self._on_pool_memory)

    def _on_pool_memory(self):
        self._waiting_mem = False      # the pool dequeued us to call this
        self._on_memory()

    def _on_memory(self):
        """Called by the pool when memory was released, or by our own chunk when its last request
        completed (then we may still be queued in the pool)."""
        if self.closed or not self._paused_mem:
            return
        if self._prepare():
            if self._waiting_mem:
                self._waiting_mem = False
                self.pool.forget(self._on_pool_memory)
            self._paused_mem = False
            self.server.memory_paused.discard(self)
            if not self._paused_write and self._mute_timer is None:
                self.transport.resume_reading()
        elif not self._waiting_mem:
            self._waiting_mem = True
            self.pool.wait(self._on_pool_memory)

    # ---- dispatch --------------------------------------------------------------------------------
    def _dispatch(self, frame, chunk):
        """A frame that dispatch_frames does not serve natively (another API, an unadvertised version,
        the native path off, a malformed Produce/Fetch): the generic schema path, which gives a
        malformed frame its outcome (logged, connection closed). ``frame`` is a view of ``chunk`` (a
        receive chunk or an ``_OwnFrame``), referenced until the request no longer needs it."""
        chunk.refs += 1
        self._dispatch_generic(frame, chunk.unref)

    def _refuse(self, reason, *args):
        """A frame this connection cannot serve (bad size, malformed, unsupported version): counted as
        an invalid frame, logged (rate-limited) and the connection closed."""
        self.server.metrics.invalid_frames += 1
        hostile_log(logging.WARNING, "closing %s: " + reason, self.peer, *args)
        self.close()

    def _handler_raised(self, slot):
        """A native handler raised (called from its except clause: the traceback is logged). Its frame
        took no reference on its chunk."""
        h = slot.header
        hostile_log(logging.ERROR, "error handling %s v%d from %s", api.API_NAMES[h.api_key], h.api_version,
                    self.peer, exc_info=True)
        self.close()

    def _dispatch_later(self, slot, result, chunk):
        """A native handler's answer is an awaitable: queued once it is done; the frame holds a
        reference on its chunk until then."""
        chunk.refs += 1
        release = chunk.unref
        if asyncio.isfuture(result):
            # A Fetch long poll (replica/longpoll.py): its answer is encoded in the poll's last callback;
            # a done-callback queues it, with no Task and coroutine per poll.
            result.add_done_callback(lambda fut: self._future_done(slot, fut, release))
        else:
            self.loop.create_task(self._await(slot, result, release, encoded=True))

    def _dispatch_generic(self, frame, release):
        server = self.server
        if self.sasl_raw:
            self._raw_sasl_token(frame, release)
            return
        try:
            header, pos = api.parse_request_header(frame)
        except ProtocolError as e:
            release()
            self._refuse("%s", e)
            return
        if not self.authenticated and (self._auth_failed or header.api_key not in _BEFORE_AUTHENTICATION):
            release()
            self._refuse("%s before SASL authentication completed", api.API_NAMES.get(header.api_key, header.api_key))
            return
        if header.client_id != self.client_id or not self._identified:
            self.client_id = header.client_id
            self._identified = True
            if server.quotas is not None:
                self.refresh_quota()
        slot = _Slot(header, self.last_active, self._read_at)
        self._pending.append(slot)
        key, version = header.api_key, header.api_version
        supported = api.SUPPORTED.get(key)
        if supported is None or not supported[0] <= version <= supported[1]:
            release()
            if key == api.API_VERSIONS:
                self._finish(slot, [api.encode_api_versions_fallback(header.correlation_id)])
            else:
                self._refuse("unsupported %s v%d", api.API_NAMES.get(key, key), version)
            return
        if len(frame) >= OFFLOAD_BYTES and key != 0:      # Produce: records stay views, decoding is cheap
            # Decoding (and later encoding) work proportional to a large request's size runs on the
            # server's worker thread: the loop keeps serving others (it gets the GIL back every switch
            # interval) instead of waiting for, e.g., a 100,000-topic Metadata request.
            self.loop.create_task(self._dispatch_large(slot, header, frame, pos, release))
            return
        try:
            body = api.decode_request(key, version, frame, pos)
        except ProtocolError as e:
            release()
            self._refuse("malformed %s v%d: %s", api.API_NAMES[key], version, e)
            return
        server.metrics.count_request(key, version)
        if key == 1:
            slot.follower = body.get("replica_id", -1) >= 0
        slot.started = t0 = _now()
        try:
            result = server.handlers[key](self, header, body)
        except Exception:
            release()
            hostile_log(logging.ERROR, "error handling %s v%d from %s", api.API_NAMES[key], version, self.peer,
                        exc_info=True)
            self.close()
            return
        slot.local = _now() - t0
        if self.quota is not None:
            server.quotas.request_in(self.quota, key, len(frame))
        if inspect.isawaitable(result):
            if self.quota is not None:
                result = server.quotas.timed(self.quota, slot, result)
            self.loop.create_task(self._await(slot, result, release))
        else:
            release()
            self._complete(slot, result)

    def _future_done(self, slot, fut, release):
        """``_await`` for a future of encoded chunks, as its done-callback: the same outcomes (a failed
        or cancelled future closes the connection; the frame's memory goes back either way)."""
        release()
        try:
            result = fut.result()
        except BaseException as e:  # noqa: BLE001 - a callback's exception would reach no one
            if not isinstance(e, (Exception, asyncio.CancelledError)):
                raise
            result = self._handler_failed(slot, exc_info=not isinstance(e, asyncio.CancelledError))
        self._finish(slot, result)

    def _handler_failed(self, slot, exc_info=True):
        """A handler (or what it returned to wait on) failed: logged, and the connection closes."""
        h = slot.header
        hostile_log(logging.ERROR, "error handling %s v%d from %s", api.API_NAMES[h.api_key], h.api_version,
                    self.peer, exc_info=exc_info)
        return CLOSE

    async def _dispatch_large(self, slot, header, frame, pos, release):
        server = self.server
        key, version = header.api_key, header.api_version
        name = api.API_NAMES[key]
        try:
            try:
                body, spent = await self.loop.run_in_executor(server.heavy_executor, _timed_call,
                                                              api.decode_request, key, version, frame, pos)
            except ProtocolError as e:
                self._refuse("malformed %s v%d: %s", name, version, e)
                return
            if self.quota is not None:
                server.quotas.offloop(self.quota, slot, spent)
            server.metrics.count_request(key, version)
            slot.started = t0 = _now()
            result = server.handlers[key](self, header, body)
            slot.local = _now() - t0
            if inspect.isawaitable(result):
                if self.quota is not None:
                    result = server.quotas.timed(self.quota, slot, result)
                result = await result
            if type(result) is EncodeOffLoop:
                result = result.body
            if result is not NO_RESPONSE and result is not CLOSE:
                result = await self._encode_off_loop(slot, result)
        except Exception:
            hostile_log(logging.ERROR, "error handling %s v%d from %s; closing", name, version, self.peer,
                        exc_info=True)
            result = CLOSE
        finally:
            release()
        if not self.closed:
            self._finish(slot, result)

    async def _await(self, slot, awaitable, release, encoded=False):
        try:
            result = await awaitable
            if type(result) is EncodeOffLoop:
                result = await self._encode_off_loop(slot, result.body)
                encoded = True
        except Exception:
            result = self._handler_failed(slot)
        finally:
            release()
        if encoded:
            self._finish(slot, result)
        else:
            self._complete(slot, result)

    async def _encode_off_loop(self, slot, body):
        """A large answer encoded on the server's heavy thread. Under a client quota it is throttled
        first, as every answer is, and the encoding counts as handling time."""
        quotas = self.server.quotas if self.quota is not None else None
        if quotas is not None:
            body = quotas.answer_out(self, self.quota, slot, body)
            if type(body) is list:          # encoded already (a Fetch the quota had to size)
                return body
        h = slot.header
        chunks, spent = await self.loop.run_in_executor(self.server.heavy_executor, _timed_call, api.encode_response,
                                                        h.api_key, h.api_version, h.correlation_id, body)
        if quotas is not None and self.quota is not None:
            quotas.offloop(self.quota, slot, spent)
        return chunks

    def _complete(self, slot, result):
        if type(result) is EncodeOffLoop:     # returned without awaiting: encoded here all the same
            result = result.body
        if self.quota is not None and result is not CLOSE:
            result = self.server.quotas.answer_out(self, self.quota, slot, result)
            if type(result) is list:        # encoded already (a Fetch the quota had to size)
                self._finish(slot, result)
                return
        if result is NO_RESPONSE or result is CLOSE:
            self._finish(slot, result)
            return
        h = slot.header
        try:
            chunks = api.encode_response(h.api_key, h.api_version, h.correlation_id, result)
        except Exception:
            # e.g. a response over 2^31-1 bytes: no answer is possible, so the client must see a close
            # (not a hang); logged once per failure.
            hostile_log(logging.ERROR, "cannot encode %s v%d response for %s; closing",
                        api.API_NAMES.get(h.api_key, h.api_key), h.api_version, self.peer, exc_info=True)
            chunks = CLOSE
        self._finish(slot, chunks)

    def _finish(self, slot, chunks, now=None):
        if slot.lost is not None:      # a Produce whose batch a write-behind run's failed write cut away
            chunks = lost_answer(slot, chunks, NO_RESPONSE, CLOSE)
        slot.chunks = chunks
        slot.done = True
        slot.queued = _now() if now is None else now
        self._flush()

    # ---- send path -------------------------------------------------------------------------------
    def _flush(self):
        """Write every response that is next in request order. While one read's frames are being
        dispatched nothing is written; then the responses they produced leave in one write (one
        syscall, one wake-up for the client) instead of one per request."""
        if self._writing or self.closed or self._in_read:
            return
        pending = self._pending
        out = []
        answered = []            # slots whose responses leave with ``out`` (metrics once written)
        while True:
            # the common answers (one chunk, or none) in one native call; the head it stops at, if
            # done, is handled here
            take_answers(pending, out, answered, NO_RESPONSE)
            if not pending or not pending[0].done:
                break
            slot = pending.popleft()
            chunks = slot.chunks
            if chunks is NO_RESPONSE:
                answered.append(slot)
                continue
            if chunks is CLOSE:
                if out:
                    self.transport.writelines(out)
                    observe_slots(answered, _now())
                self.close()
                return
            if len(chunks) == 1:
                out.append(chunks[0])
                answered.append(slot)
                continue
            if out:
                self.transport.writelines(out)
                out = []
            if answered:
                observe_slots(answered, _now())
                answered = []
            if self.tls:
                if not self._write_copied(chunks):
                    return
                slot.observe(_now())
                continue
            if self._direct_ok():
                # Most sendfile responses fit in the socket buffer: send them now, from this callback;
                # what is left (socket full) goes out from writability callbacks, registered once for
                # the whole answer (a 4 MiB answer through a 200 KiB socket buffer waits ~10 times).
                cursor = SendCursor(chunks)     # (a malformed chunk raises here, before _writing is set)
                self._writing = True
                if not self._send_step(slot, cursor):
                    return
                continue
            if self._selector:
                self._writing = True
                self.loop.create_task(self._write_regions(slot, chunks))
            else:
                # uvloop has no loop.sendfile: its transport drains its buffer first (_on_writable waits
                # for that), then the same direct send
                cursor = SendCursor(chunks)
                self._writing = True
                self._send_rest = (slot, cursor)
                self._register_writer(self._on_writable)
            return
        if out:
            if len(out) == 1 and self._selector:
                # asyncio's writelines is Python that joins (a copy of the answer) and calls write
                self.transport.write(out[0])
            else:
                self.transport.writelines(out)
        if answered:
            observe_slots(answered, _now())

    def _send_step(self, slot, cursor) -> bool:
        """One native send step of the answer ``cursor`` holds (``_writing`` is set). -> True when the
        answer went out in full (the slot observed, ``_writing`` cleared); False when the socket is full
        (the answer waits in ``_send_rest`` with the writer registered, left registered if it already
        was) or the send failed (the connection is closing)."""
        try:
            if cursor.send(self._sock_fd, self.server.metrics):
                self._writing = False
                slot.observe(_now())
                return True
        except OSError as e:      # ConnectionError too: a short sendfile
            self._send_rest = None
            self._unregister_writer()
            self._writing = False
            hostile_log(logging.WARNING, "closing %s: fetch send failed: %s", self.peer, e)
            self.close()
            return False
        if self._send_rest is None:
            self._send_rest = (slot, cursor)
            self._register_writer(self._on_writable)
        return False

    def _on_writable(self):
        state = self._send_rest
        if state is None or self.closed:
            self._send_rest = None
            self._unregister_writer()
            return
        if not self._selector and self.transport.get_write_buffer_size():
            return                # uvloop is still draining its transport's buffer into the socket
        if self._send_step(*state):
            self._send_rest = None
            self._unregister_writer()
            self._flush()

    def _direct_ok(self):
        return self.transport.get_write_buffer_size() == 0

    def _register_writer(self, callback):
        sock_fd = self._sock_fd
        if self._selector:
            self.loop._add_writer(sock_fd, callback)
            self._write_fd = sock_fd
            return
        # uvloop refuses add_writer on the transport's descriptor; a dup() shares the socket (epoll
        # reports its writability the same) and is ours to register and close.
        fd = os.dup(sock_fd)
        try:
            self.loop.add_writer(fd, callback)
        except BaseException:
            os.close(fd)
            raise
        self._write_fd = fd

    async def _write_regions(self, slot, chunks):
        """asyncio's loop, earlier bytes still in the transport's buffer: the answer goes through the
        transport (``_write_via_transport``), as a task."""
        try:
            await self._write_via_transport(chunks)
        except (OSError, ConnectionError, RuntimeError) as e:
            hostile_log(logging.WARNING, "closing %s: fetch send failed: %s", self.peer, e)
            self.close()
            return
        finally:
            self._writing = False
        slot.observe(_now())
        self._flush()

    def _unregister_writer(self):
        fd = self._write_fd
        if fd >= 0:
            self._write_fd = -1
            if self._selector:
                self.loop._remove_writer(fd)
            else:
                self.loop.remove_writer(fd)
                os.close(fd)

    async def _write_via_transport(self, chunks):
        """Earlier responses are still in the transport's buffer: let asyncio order the bytes
        (``loop.sendfile`` drains the buffer first). Tiny ranges go through a counted copy."""
        transport = self.transport
        metrics = self.server.metrics
        for c in chunks:
            if self.closed:
                return
            if not isinstance(c, FileRegions):
                transport.write(c)
                continue
            for fd, pos, length in c.regions:
                file_fd = fd if isinstance(fd, int) else fd.fileno()
                if length < self.server.sendfile_min_bytes:
                    data = os.pread(file_fd, length, pos)
                    metrics.fetch_copy_bytes += len(data)
                    if len(data) != length:
                        raise ConnectionError(f"segment shrank under a fetch ({len(data)} < {length})")
                    transport.write(data)
                    continue
                f = io.FileIO(file_fd, "rb", closefd=False)
                sent = await self.loop.sendfile(transport, f, pos, length, fallback=False)
                metrics.fetch_sendfile_calls += 1
                metrics.fetch_sendfile_bytes += sent
                if sent != length:
                    raise ConnectionError(f"short sendfile ({sent} < {length})")

    # ---- SASL -----------------------------------------------------------------------------------------
    def _await_authentication(self):
        # The native Produce/Fetch path is off until authenticated (every frame reaches _dispatch_generic,
        # which refuses them), and frames are bounded by sasl.server.max.receive.size meanwhile.
        self._native_produce = self._native_fetch = None
        self.max_frame = min(self.max_frame, SASL_MAX_RECEIVE_BYTES)

    def authenticated_as(self, user: str) -> bool:
        """The SASL exchange succeeded: the principal is the user; every API (and the native path) opens.
        With connections.max.reauth.ms (KIP-368) the session ends that long after, unless the client
        authenticates again before (as the same user: False for another one, which fails the exchange)."""
        principal = "User:" + user
        if self._session_timer is not None:          # a re-authentication
            if principal != self.principal:
                return False
            self._session_timer.cancel()
            self._session_timer = None
        if principal != self.principal:
            self.forget_decisions()     # decided for the principal it had before
        self.principal = principal
        self.authenticated = True
        self.sasl_server = None
        self.sasl_raw = False
        self._native_produce = self.server.native_produce
        self._native_fetch = self.server.native_fetch
        if self.server.quotas is not None:
            self.refresh_quota()        # the principal's bounds
        self.max_frame = self.server.max_request_bytes
        lifetime_s = self.listener.sasl.reauth_ms / 1000
        if lifetime_s > 0:
            self._session_timer = self.loop.call_later(lifetime_s, self._session_expired)
        return True

    def forget_decisions(self) -> None:
        """Drop the authorizer's decisions kept for this connection (its principal or the ACLs changed)."""
        self.acl_decisions.clear()
        if self._acl_write is not None:
            self._acl_write.clear()
            self._acl_read.clear()
        self._acl_cluster = False

    def _session_expired(self):
        """KIP-368: the session ran out without a re-authentication: from now on only SaslHandshake and
        SaslAuthenticate may come (anything else closes the connection), as before the first login."""
        self.authenticated = False
        self._await_authentication()

    def authentication_failed(self, delay_s: float):
        """The answer (SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM) still goes out; nothing more
        is read, and the connection closes after connection.failed.authentication.delay.ms, as Kafka
        slows password guessing."""
        self._auth_failed = True
        self.sasl_server = None
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self.loop.call_later(delay_s, self.close)

    def _raw_sasl_token(self, frame, release):
        """A SASL token after a v0 SaslHandshake: the frame is the token, the answer a bare
        size-prefixed token; a failure closes the connection (this framing has no error field)."""
        token = bytes(frame)
        release()
        slot = _Slot(api.RequestHeader(SASL_AUTHENTICATE, 0, 0, None), self.last_active, self._read_at)
        self._pending.append(slot)
        self.loop.create_task(self._raw_sasl_step(slot, token))

    async def _raw_sasl_step(self, slot, token):
        server_side = self.sasl_server
        try:
            answer = await server_side.step(token)
        except Exception as e:     # AuthenticationFailed and anything malformed alike
            hostile_log(logging.INFO, "SASL authentication of %s failed: %s", self.peer, e)
            self._finish(slot, CLOSE)
            return
        if server_side.complete and not self.authenticated_as(server_side.user):
            self._finish(slot, CLOSE)
            return
        self._finish(slot, [_SIZE.pack(len(answer)) + answer])

    def _tls_principal(self, transport) -> bool:
        """mTLS: the client certificate's subject, through ssl.principal.mapping.rules, is the principal
        (none sent: ANONYMOUS). False when no rule maps it (the connection is closed, as Kafka fails
        the authentication)."""
        from ..security.tls import peer_dn
        dn = peer_dn(transport.get_extra_info("ssl_object"))
        if dn is None:
            return True
        mapper = self.listener.principal_mapper
        try:
            self.principal = "User:" + (mapper.name(dn) if mapper is not None else dn)
        except ValueError as e:
            hostile_log(logging.WARNING, "closing %s: %s", self.peer, e)
            self.close()
            return False
        return True

    def _write_copied(self, chunks) -> bool:
        """An answer with file ranges on a TLS connection: the ranges are read (pread) and written
        through the TLS transport, in order. False when the file shrank under it (closing)."""
        metrics = self.server.metrics
        out = []
        for c in chunks:
            if not isinstance(c, FileRegions):
                out.append(c)
                continue
            for fd, pos, length in c.regions:
                data = os.pread(fd if isinstance(fd, int) else fd.fileno(), length, pos)
                metrics.fetch_copy_bytes += len(data)
                if len(data) != length:
                    hostile_log(logging.WARNING, "closing %s: segment shrank under a fetch (%d < %d)", self.peer,
                                len(data), length)
                    self.close()
                    return False
                out.append(data)
        self.transport.writelines(out)
        return True

    def close(self):
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
