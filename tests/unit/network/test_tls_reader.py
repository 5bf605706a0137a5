"""The native TLS reader (kbroker._native.tls) against Python's ssl on memory BIOs, no sockets: a client
SSLObject writes, the server's ciphertext is handed to ``TlsReader.receive`` in the chunks a socket
could deliver, and the plaintext must arrive in the connection's receive views exactly as sent."""
from __future__ import annotations

import ssl

import pytest

from kbroker.network.tlsconn import TlsReads
from kbroker.security.certs import loopback_pki

tls = pytest.importorskip("kbroker._native.tls")


class Receiver:
    """What the reader needs of a connection: the next receive view (``_next``), ``closed`` and
    ``buffer_updated``; it collects the bytes and hands out views of ``view_size`` bytes."""

    def __init__(self, view_size=32 * 1024):
        self.buf = bytearray(view_size)
        self._next = memoryview(self.buf)
        self.closed = False
        self.got = bytearray()
        self.calls = 0

    def buffer_updated(self, n):
        self.calls += 1
        self.got += self.buf[:n]


@pytest.fixture(scope="module")
def server_ctx(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    loopback_pki(d)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(d / "broker.pem"))
    ctx.ca_path = d / "ca.pem"
    return ctx


class Pair:
    """A client and a server SSLObject, handshake done; ``send`` gives the ciphertext of the client's writes."""

    def __init__(self, server_ctx):
        cctx = ssl.create_default_context(cafile=str(server_ctx.ca_path))
        self.c_in, self.c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.s_in, self.s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.client = cctx.wrap_bio(self.c_in, self.c_out, server_hostname="localhost")
        self.server = server_ctx.wrap_bio(self.s_in, self.s_out, server_side=True)
        for _ in range(10):
            done = 0
            for side, out, peer_in in ((self.client, self.c_out, self.s_in), (self.server, self.s_out, self.c_in)):
                try:
                    side.do_handshake()
                    done += 1
                except ssl.SSLWantReadError:
                    pass
                peer_in.write(out.read())
            if done == 2:
                break
        assert done == 2
        self.reader = tls.TlsReader(self.server, self.s_in, self.s_out)

    def send(self, *chunks) -> bytes:
        for c in chunks:
            self.client.write(c)
        return self.c_out.read()


def payload(n, seed=0):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def test_the_library_and_pointer_proofs_hold_here():
    import _ssl
    assert tls.library_problem(_ssl.__file__, ssl.OPENSSL_VERSION_NUMBER) is None
    assert TlsReads().problem is None


def test_many_records_in_one_chunk_arrive_in_one_call(server_ctx):
    p = Pair(server_ctx)
    data = payload(200_000)
    wire = p.send(*(data[i:i + 10_000] for i in range(0, len(data), 10_000)))     # 20 writes, 20+ records
    conn = Receiver(view_size=48 * 1024)
    buf = bytearray(wire)
    assert p.reader.receive(buf, len(wire), conn) == tls.WANT_READ
    assert bytes(conn.got) == data
    assert conn.calls == -(-len(data) // (48 * 1024))      # every view filled before it was handed over
    assert p.reader.calls == 1 and p.reader.bytes_read == len(data)


@pytest.mark.parametrize("step", [1, 7, 5000, 16_389])
def test_records_split_across_chunks(server_ctx, step):
    p = Pair(server_ctx)
    data = payload(60_000, seed=step)
    wire = p.send(data[:20_000], data[20_000:])
    conn = Receiver()
    shared = bytearray(step)        # one buffer reused for every chunk, as the server's shared buffer
    for i in range(0, len(wire), step):
        chunk = wire[i:i + step]
        shared[:len(chunk)] = chunk
        assert p.reader.receive(shared, len(chunk), conn) == tls.WANT_READ
        shared[:] = b"\xee" * step      # overwritten by the next read: nothing may still point into it
    assert bytes(conn.got) == data


def test_paused_keeps_the_ciphertext_until_drained(server_ctx):
    p = Pair(server_ctx)
    data = payload(50_000, seed=3)
    wire = p.send(data)
    conn = Receiver()
    shared = bytearray(wire)
    p.reader.paused = True
    assert p.reader.receive(shared, len(wire), conn) == tls.STOPPED
    assert conn.got == b""
    shared[:] = b"\0" * len(shared)
    more = p.send(b"tail")          # arrives while paused: appended behind what is kept
    shared[:len(more)] = more
    assert p.reader.receive(shared, len(more), conn) == tls.STOPPED
    p.reader.paused = False
    assert p.reader.drain(conn) == tls.WANT_READ
    assert bytes(conn.got) == data + b"tail"


def test_no_buffer_stops_and_a_later_drain_delivers(server_ctx):
    p = Pair(server_ctx)
    wire = p.send(b"abc" * 1000)
    conn = Receiver()
    view, conn._next = conn._next, None          # waiting for pool memory
    assert p.reader.receive(bytearray(wire), len(wire), conn) == tls.STOPPED
    conn._next = view
    assert p.reader.drain(conn) == tls.WANT_READ
    assert bytes(conn.got) == b"abc" * 1000


def test_close_notify_after_data(server_ctx):
    p = Pair(server_ctx)
    p.client.write(b"last words")
    try:
        p.client.unwrap()
    except ssl.SSLWantReadError:
        pass
    wire = p.c_out.read()
    conn = Receiver()
    assert p.reader.receive(bytearray(wire), len(wire), conn) == tls.CLOSE_NOTIFY
    assert bytes(conn.got) == b"last words"


def test_corrupted_record_is_a_clear_error_and_python_ssl_is_unaffected(server_ctx):
    p = Pair(server_ctx)
    good = p.send(b"fine")
    bad = bytearray(p.send(b"x" * 1000))
    bad[100] ^= 0x01                 # inside the record's ciphertext: its authentication tag fails
    conn = Receiver()
    with pytest.raises(tls.TlsError, match="(?i)bad record mac|decrypt"):
        p.reader.receive(bytearray(good + bad), len(good) + len(bad), conn)
    assert bytes(conn.got) == b"fine"   # the records before it were delivered
    # OpenSSL's error queue was cleared: another connection's Python ssl does not see our error
    q = Pair(server_ctx)
    q.s_in.write(q.send(b"ok"))
    assert q.server.read(10) == b"ok"


def test_the_pointer_proof_refuses_what_it_cannot_prove(server_ctx):
    p = Pair(server_ctx)
    with pytest.raises(tls.TlsUnsupported, match="not the memory BIOs"):
        tls.TlsReader(p.server, p.s_out, p.s_in)           # the BIOs swapped
    other_in, other_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    with pytest.raises(tls.TlsUnsupported, match="not the memory BIOs"):
        tls.TlsReader(p.server, other_in, other_out)       # BIOs of another SSL object

    class NotSsl:
        _sslobj = b"\0" * 64
    with pytest.raises(tls.TlsUnsupported, match="expected layout"):
        tls.TlsReader(NotSsl(), p.s_in, p.s_out)
    with pytest.raises(tls.TlsUnsupported, match="expected layout"):
        tls.TlsReader(p.server, bytearray(64), p.s_out)


def test_a_library_mismatch_is_reported():
    import _ssl
    assert "differs" in tls.library_problem(_ssl.__file__, ssl.OPENSSL_VERSION_NUMBER ^ 0x10) or \
        "reports" in tls.library_problem(_ssl.__file__, ssl.OPENSSL_VERSION_NUMBER ^ 0x10)
    assert "not loaded" in tls.library_problem("/nonexistent/_ssl.so", ssl.OPENSSL_VERSION_NUMBER)


def test_tls_reads_name_why_the_native_reader_is_off(monkeypatch):
    from kbroker.network import tlsconn
    assert "switched off" in TlsReads(native=False).problem
    monkeypatch.setattr(tlsconn, "SSL_INTERNALS_VERSIONS", ((3, 0), (3, 1)))
    assert "outside the checked 3.0-3.1" in TlsReads().problem
    monkeypatch.setattr(tlsconn, "_native", None)
    assert "not built" in TlsReads().problem and "Python's ssl" in TlsReads().describe()
