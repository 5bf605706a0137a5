"""Server-side TLS of ours on a plain TCP transport (both loops), reading records natively.

``TlsTransport`` is the protocol of the accepted socket's plain transport and the transport its
``Connection`` sees. Ciphertext arrives in a buffer the server's TLS connections share (each read's bytes
are appended to the connection's incoming ``ssl.MemoryBIO`` before the next read can land there). The
handshake, writes (``SSLObject.write``, the outgoing BIO drained to the socket's transport) and
close_notify are Python's ``ssl``. Reads, once the handshake is done, go through
``kbroker._native.tls.TlsReader``: one call per socket read decrypts every record it completed straight
into the connection's receive views and calls its ``buffer_updated`` (the native read path) per filled
view; the loop's own TLS transport took a Python call, a copy and OpenSSL's per-call work per record of
at most 16 KiB. Where the native reader cannot be used (``TlsReads.problem``: not built, a Python
outside ``SSL_INTERNALS_VERSIONS``, another libssl; or a connection's pointer proof failing) the same
transport reads with ``SSLObject.read``, one record per call.

Outcomes as the loops' TLS transport had them: a handshake that fails or does not finish within the
frame deadline closes the socket (``handshake`` fails: the server logs it); a record OpenSSL refuses
closes the connection (logged, rate-limited); the peer's close_notify is its EOF (the connection
closes); closing sends our close_notify and closes the socket once what is buffered has gone.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import sys

log = logging.getLogger(__name__)

# CPython versions whose private _ssl object heads (``_SSLSocket``: PyObject *Socket, SSL *ssl;
# ``MemoryBIO``: BIO *bio) the native reader reads; elsewhere reads go through SSLObject.read.
SSL_INTERNALS_VERSIONS = ((3, 8), (3, 13))

# Answers of several chunks up to this size are joined into one TLS write; larger ones are written a chunk
# at a time (the join would copy every byte once more)
JOIN_BYTES = 64 * 1024

# Ciphertext per socket read: a read of this size holds ~16 records of 16 KiB
RECEIVE_BYTES = 256 * 1024

try:
    from .._native import tls as _native
except ImportError:          # built without OpenSSL's headers
    _native = None


class TlsReads:
    """What a server's TLS connections share: the ciphertext buffer, whether the native reader may
    be used (decided once: ``problem`` is why not, None when it may) and read counters."""

    def __init__(self, native: bool = True):
        self.buffer = bytearray(RECEIVE_BYTES)
        self.view = memoryview(self.buffer)
        self.native = 0            # socket reads decrypted by the native reader
        self.python = 0            # socket reads decrypted through SSLObject.read
        self.fallbacks = 0         # connections whose pointer proof failed
        self.problem = self._problem() if native else "switched off (KBROKER_NATIVE_TLS=0)"

    @staticmethod
    def _problem() -> str | None:
        if _native is None:
            return "kbroker._native.tls was not built (no OpenSSL headers)"
        lo, hi = SSL_INTERNALS_VERSIONS
        if not lo <= sys.version_info[:2] <= hi:
            return "Python %d.%d is outside the checked %d.%d-%d.%d" % (*sys.version_info[:2], *lo, *hi)
        import _ssl
        problem = _native.library_problem(_ssl.__file__, ssl.OPENSSL_VERSION_NUMBER)
        if problem is not None:
            return problem
        probe_in, probe_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).wrap_bio(probe_in, probe_out, server_side=True)
        try:
            _native.TlsReader(probe, probe_in, probe_out)
        except _native.TlsUnsupported as e:
            return str(e)
        return None

    def describe(self) -> str:
        if self.problem is None:
            return "TLS records read natively (%s)" % ssl.OPENSSL_VERSION
        return "TLS records read through Python's ssl: %s" % self.problem


class TlsTransport(asyncio.BufferedProtocol):
    """One accepted TLS connection: the plain transport's protocol, and the transport of the
    ``Connection`` that ``app_factory`` makes once the handshake is done. ``handshake`` is a future
    done when the connection is set up (its exception: why it was not)."""

    def __init__(self, ctx: ssl.SSLContext, reads: TlsReads, app_factory, handshake_timeout_s, loop, hostile_log):
        self._ctx = ctx
        self._reads = reads
        self._app_factory = app_factory
        self._timeout_s = handshake_timeout_s
        self._loop = loop
        self._hostile_log = hostile_log
        self.handshake = loop.create_future()
        self._app = None
        self._transport = None
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._sslobj = None
        self.reader = None           # the native reader, once set up (None: SSLObject.read)
        self._timer = None
        self._paused = False         # the connection asked not to be read
        self._closing = False

    # ---- the plain transport's protocol ----------------------------------------------------------------
    def connection_made(self, transport):
        self._transport = transport
        self._sslobj = self._ctx.wrap_bio(self._incoming, self._outgoing, server_side=True)
        if self._timeout_s:
            self._timer = self._loop.call_later(self._timeout_s, self._handshake_timed_out)

    def get_buffer(self, sizehint):
        return self._reads.view

    def buffer_updated(self, nbytes):
        reader = self.reader
        if reader is not None:
            self._reads.native += 1
            try:
                code = reader.receive(self._reads.view, nbytes, self._app)
            except _native.TlsError as e:
                self._fatal(e)
                return
            self._after_read(code == _native.CLOSE_NOTIFY)
            return
        self._incoming.write(self._reads.view[:nbytes])
        if self._app is None:
            self._handshake_step()
        else:
            self._reads.python += 1
            self._drain_py()

    def eof_received(self):
        if self._app is not None:
            return self._app.eof_received()
        self._handshake_failed(ConnectionResetError("the peer closed during the TLS handshake"))
        return False

    def connection_lost(self, exc):
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        app, self._app = self._app, None
        if app is not None:
            app.connection_lost(exc)
        elif not self.handshake.done():
            self.handshake.set_exception(exc or ConnectionResetError("closed during the TLS handshake"))
        self.reader = None

    def pause_writing(self):
        if self._app is not None:
            self._app.pause_writing()

    def resume_writing(self):
        if self._app is not None:
            self._app.resume_writing()

    # ---- handshake -------------------------------------------------------------------------------------
    def _handshake_step(self):
        try:
            self._sslobj.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except (ssl.SSLError, OSError, ValueError) as e:
            self._flush()           # the alert that tells the peer why
            self._handshake_failed(e)
            return
        self._flush()               # the last flight (TLS 1.3: and the session tickets)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._reads.problem is None:
            try:
                self.reader = _native.TlsReader(self._sslobj, self._incoming, self._outgoing)
            except _native.TlsUnsupported as e:
                self._reads.fallbacks += 1
                if self._reads.fallbacks == 1:
                    log.warning("TLS records of a connection read through Python's ssl: %s", e)
        self._app = app = self._app_factory()
        app.connection_made(self)
        if not self.handshake.done():
            self.handshake.set_result(None)
        if not app.closed:
            self._drain()           # application data that came with the client's last flight

    def _handshake_failed(self, exc):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.handshake.done():
            self.handshake.set_exception(exc)
        self._closing = True
        self._transport.close()

    def _handshake_timed_out(self):
        self._timer = None
        if self._app is None and not self.handshake.done():
            self.handshake.set_exception(ConnectionAbortedError(
                "TLS handshake not finished within %.1f s" % self._timeout_s))
            self._closing = True
            self._transport.abort()

    # ---- reads -----------------------------------------------------------------------------------------
    def _drain(self):
        """Deliver what the incoming BIO holds (after the handshake, or once reading resumes)."""
        app = self._app
        if app is None or self._closing:
            return
        if self.reader is None:
            self._drain_py()
            return
        try:
            code = self.reader.drain(app)
        except _native.TlsError as e:
            self._fatal(e)
            return
        self._after_read(code == _native.CLOSE_NOTIFY)

    def _drain_py(self):
        # the reference: SSLObject.read, one record per call, into the connection's receive views
        app, sslobj = self._app, self._sslobj
        peer_closed = False
        while not self._paused and not app.closed:
            view = app._next
            if view is None or not len(view):
                break
            try:
                n = sslobj.read(len(view), view)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError as e:
                self._fatal(e)
                return
            if n == 0:              # close_notify
                peer_closed = True
                break
            app.buffer_updated(n)
        self._after_read(peer_closed)

    def _after_read(self, peer_closed):
        if self._outgoing.pending:          # what reading made OpenSSL answer (a KeyUpdate, tickets)
            self._flush()
        if peer_closed and self._app is not None and not self._app.closed:
            if not self._app.eof_received():
                self._app.close()

    def _fatal(self, exc):
        self._hostile_log(logging.WARNING, "closing %s: TLS: %s", self._transport.get_extra_info("peername"), exc)
        self._flush()                       # OpenSSL's alert, if it wrote one
        self._closing = True                # no close_notify after a fatal error
        if self._app is not None:
            self._app.close()               # nothing more is read or answered
        self._transport.close()

    # ---- the connection's transport ----------------------------------------------------------------
    def _flush(self):
        data = self._outgoing.read()
        if data and not self._transport.is_closing():
            self._transport.write(data)

    def write(self, data):
        if self._closing or not data:
            return
        try:
            self._sslobj.write(data)
        except ssl.SSLError as e:
            self._fatal(e)
            return
        self._flush()

    def writelines(self, chunks):
        if len(chunks) == 1:
            self.write(chunks[0])
            return
        if sum(map(len, chunks)) <= JOIN_BYTES:
            # small answers share records instead of one record (and its overhead) each
            self.write(b"".join(chunks))
            return
        # a large answer (a fetch's file ranges read in): each chunk encrypted from where it is, not
        # copied into one joined buffer first; the ciphertext leaves in one transport write
        if self._closing:
            return
        write = self._sslobj.write
        try:
            for c in chunks:
                if c:
                    write(c)
        except ssl.SSLError as e:
            self._fatal(e)
            return
        self._flush()

    def close(self):
        if self._closing:
            return
        self._closing = True
        if self._app is not None:
            try:
                self._sslobj.unwrap()       # our close_notify; the peer's is not awaited
            except (ssl.SSLError, OSError, ValueError):
                pass
            self._flush()
        self._transport.close()

    def abort(self):
        self._closing = True
        self._transport.abort()

    def is_closing(self):
        return self._closing or self._transport.is_closing()

    def pause_reading(self):
        self._paused = True
        if self.reader is not None:
            self.reader.paused = True
        if not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_reading(self):
        if not self._paused:
            return
        self._paused = False
        if self.reader is not None:
            self.reader.paused = False
        if self._transport.is_closing():
            return
        self._transport.resume_reading()
        # records already in the incoming BIO are not announced by the socket again
        self._loop.call_soon(self._drain)

    def is_reading(self):
        return not self._paused and self._transport.is_reading()

    def get_write_buffer_size(self):
        return self._transport.get_write_buffer_size()

    def set_write_buffer_limits(self, high=None, low=None):
        self._transport.set_write_buffer_limits(high, low)

    def get_extra_info(self, name, default=None):
        if name == "ssl_object":
            return self._sslobj
        if name == "sslcontext":
            return self._ctx
        if name == "peercert":
            return self._sslobj.getpeercert()
        if name == "cipher":
            return self._sslobj.cipher()
        return self._transport.get_extra_info(name, default)
