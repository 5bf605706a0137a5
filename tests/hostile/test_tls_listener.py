"""TLS listeners of the network layer against real sockets, on both event loops: a TLS client is
served (ApiVersions round trip), mTLS principals come from ssl.principal.mapping.rules, and hostile
peers - plaintext bytes on the TLS port, TLS on the plaintext port, a handshake that never finishes -
are closed within the deadline while another client keeps being answered."""
from __future__ import annotations

import socket
import ssl
import time

import pytest

from kbroker.network.server import Listener
from kbroker.protocol import api
from kbroker.security import tls
from kbroker.security.certs import loopback_pki
from kbroker.config import ConfigError
from netserver import LOOPS, ServerThread

FRAME_TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = loopback_pki(d, password="kpw", pkcs12_password="spw")
    ca.issue_to(d / "alice.pem", {"CN": "alice", "OU": "eng", "O": "example"}, client=True)
    return d


def api_versions_handler(conn, header, body):
    return {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}],
            "throttle_time_ms": 0}


def server_ctx(pki, **extra):
    values = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki / "broker.pem"),
              "ssl.key.password": "kpw", "ssl.truststore.type": "PEM",
              "ssl.truststore.location": str(pki / "ca.pem"), "ssl.client.auth": "none",
              "ssl.enabled.protocols": ["TLSv1.2", "TLSv1.3"]} | extra
    return tls.server_context(values.get)


def start(pki, loop_name, **extra):
    ctx = server_ctx(pki, **extra)
    mapper = tls.PrincipalMapper("RULE:^CN=([a-z]+),OU=eng,.*$/$1/U,DEFAULT")
    listeners = [Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0),
                 Listener("SSL", "SSL", "127.0.0.1", 0, ctx, mapper)]
    return ServerThread({18: api_versions_handler}, loop_name, listeners=listeners,
                        frame_timeout_ms=FRAME_TIMEOUT_MS)


def client_ctx(pki, cert=None):
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / cert))
    return ctx


def _read(sock, n) -> bytes | None:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            return None
        out += got
    return out


def round_trip(sock) -> bool:
    """One ApiVersions request answered in full, with its correlation id."""
    sock.sendall(api.encode_request(18, 0, 7, "t", {}))
    size = _read(sock, 4)
    body = size and _read(sock, int.from_bytes(size, "big"))
    return bool(body) and body[:4] == (7).to_bytes(4, "big")


def closed_within(sock, seconds) -> float | None:
    """Seconds until the peer closed ``sock`` (reads and drops what arrives), None if it did not."""
    sock.settimeout(0.2)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            if not sock.recv(4096):
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


@pytest.mark.parametrize("loop_name", LOOPS)
def test_tls_client_served_and_principal_mapped(pki, loop_name):
    with start(pki, loop_name, **{"ssl.client.auth": "requested"}) as srv:
        ssl_port = srv.server.listeners[1].port
        with socket.create_connection(("127.0.0.1", ssl_port), timeout=5) as raw, \
                client_ctx(pki, "alice.pem").wrap_socket(raw, server_hostname="localhost") as s:
            assert round_trip(s)
            principals = srv.call(lambda: {(c.listener_name, c.principal, c.client_host)
                                           for c in srv.server.connections})
            assert ("SSL", "User:ALICE", "127.0.0.1") in principals
        # without a client certificate: anonymous
        with socket.create_connection(("127.0.0.1", ssl_port), timeout=5) as raw, \
                client_ctx(pki).wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert round_trip(s)
            assert srv.call(lambda: {c.principal for c in srv.server.connections}) == {"User:ANONYMOUS"}


@pytest.mark.parametrize("loop_name", LOOPS)
def test_client_auth_required_refuses_a_client_without_certificate(pki, loop_name):
    with start(pki, loop_name, **{"ssl.client.auth": "required"}) as srv:
        port = srv.server.listeners[1].port
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                with client_ctx(pki).wrap_socket(raw, server_hostname="localhost") as s:
                    round_trip(s)       # TLS 1.3 reports the refusal at the first read
                    raise ConnectionError("answered")  # not reached when refused at the handshake
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                client_ctx(pki, "alice.pem").wrap_socket(raw, server_hostname="localhost") as s:
            assert round_trip(s)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_hostile_peers_closed_while_others_served(pki, loop_name):
    with start(pki, loop_name) as srv:
        plain_port, ssl_port = srv.server.listeners[0].port, srv.server.listeners[1].port
        good = client_ctx(pki).wrap_socket(socket.create_connection(("127.0.0.1", ssl_port), timeout=5),
                                           server_hostname="localhost")
        # plaintext Kafka bytes on the TLS port: the handshake fails, the connection closes
        garbage = socket.create_connection(("127.0.0.1", ssl_port), timeout=5)
        garbage.sendall(api.encode_request(18, 0, 1, "t", {}))
        # TLS on the plaintext port: the ClientHello's first bytes are an impossible frame size
        tls_on_plain = socket.create_connection(("127.0.0.1", plain_port), timeout=5)
        outgoing = ssl.MemoryBIO()
        hello = client_ctx(pki).wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="localhost")
        with pytest.raises(ssl.SSLWantReadError):
            hello.do_handshake()
        tls_on_plain.sendall(outgoing.read())     # a real ClientHello
        # a handshake that never finishes: connect, send nothing
        stalled = socket.create_connection(("127.0.0.1", ssl_port), timeout=5)
        half = socket.create_connection(("127.0.0.1", ssl_port), timeout=5)
        half.sendall(b"\x16\x03\x01\x02\x00\x01")      # the start of a ClientHello, then silence
        try:
            assert round_trip(good)
            for s in (garbage, tls_on_plain):
                assert closed_within(s, 5) is not None
            deadline = FRAME_TIMEOUT_MS / 1000 + 3
            for s in (stalled, half):
                assert closed_within(s, deadline) is not None
            assert round_trip(good)         # still served after all of it
        finally:
            for s in (good, garbage, tls_on_plain, stalled, half):
                s.close()


def _bio_client(pki, port):
    """A raw socket with a client SSLObject on memory BIOs, handshake done: its records can be altered."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_ctx(pki).wrap_bio(incoming, outgoing, server_hostname="localhost")
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            sock.sendall(outgoing.read())
            incoming.write(sock.recv(65536))
    sock.sendall(outgoing.read())
    return sock, obj, outgoing


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("loop_name", LOOPS)
def test_tls_reads_native_or_python_and_a_corrupted_record_closes(pki, loop_name, native):
    """The TLS transport reads records natively (or, when the native reader is not usable, through
    Python's ssl: the same answers); a record that fails authentication closes its connection while
    another client is served."""
    with start(pki, loop_name) as srv:
        if not native:
            srv.call(lambda: setattr(srv.server.tls_reads, "problem", "switched off by the test"))
        port = srv.server.listeners[1].port
        good = client_ctx(pki).wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                           server_hostname="localhost")
        try:
            many = b"".join(api.encode_request(18, 0, i, "t", {}) for i in range(300))
            for _ in range(3):
                good.sendall(many)        # many requests, several records per socket read
                for i in range(300):
                    size = _read(good, 4)
                    assert _read(good, int.from_bytes(size, "big"))[:4] == i.to_bytes(4, "big")
            counts = srv.call(lambda: (srv.server.tls_reads.native, srv.server.tls_reads.python))
            assert (counts[0] > 0, counts[1] > 0) == (native, not native), counts
            sock, obj, outgoing = _bio_client(pki, port)
            with sock:
                obj.write(api.encode_request(18, 0, 1, "t", {}))
                record = bytearray(outgoing.read())
                record[-5] ^= 0x40           # in the authentication tag
                sock.sendall(record)
                assert closed_within(sock, 5) is not None
            assert round_trip(good)
        finally:
            good.close()


def test_keystore_types_and_refusals(pki):
    p12 = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(pki / "broker.p12"),
           "ssl.keystore.password": "spw"}
    assert isinstance(tls.server_context(p12.get), ssl.SSLContext)
    with pytest.raises(ConfigError) as e:
        tls.server_context((p12 | {"ssl.keystore.password": "wrong"}).get)
    assert e.value.key == "ssl.keystore.location"
    with pytest.raises(ConfigError) as e:
        tls.server_context({"ssl.keystore.type": "JKS", "ssl.keystore.location": str(pki / "broker.p12")}.get)
    assert e.value.key == "ssl.keystore.type" and "JKS" in str(e.value)
    with pytest.raises(ConfigError) as e:
        tls.server_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki / "broker.pem"),
                            "ssl.key.password": "wrong"}.get)
    assert e.value.key == "ssl.keystore.location"
    with pytest.raises(ConfigError) as e:
        server_ctx(pki, **{"ssl.enabled.protocols": ["TLSv9"]})
    assert e.value.key == "ssl.enabled.protocols"
    with pytest.raises(ConfigError) as e:
        server_ctx(pki, **{"ssl.cipher.suites": ["NO-SUCH-CIPHER"]})
    assert e.value.key == "ssl.cipher.suites"
    ctx = server_ctx(pki, **{"ssl.enabled.protocols": ["TLSv1.2"]})
    assert ctx.maximum_version == ssl.TLSVersion.TLSv1_2


def test_principal_mapping_rules():
    m = tls.PrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/L,"
                            "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U,DEFAULT")
    assert m.name("CN=kafka-svc,OU=ServiceUsers,O=Org") == "kafka-svc"
    assert m.name("CN=Duke,OU=JavaSoft,O=Sun") == "duke@javasoft"
    assert m.name("OU=x,cn=bob.smith") == "BOB.SMITH"
    assert m.name("O=only") == "O=only"
    assert tls.PrincipalMapper(None).name("CN=a,O=b") == "CN=a,O=b"
    strict = tls.PrincipalMapper("RULE:^CN=(.*)$/$1/")
    with pytest.raises(ValueError):
        strict.name("O=nobody")
    assert tls.PrincipalMapper(r"RULE:^CN=(.*)$/a\/$1/").name("CN=x") == "a/x"
    with pytest.raises(ConfigError):
        tls.PrincipalMapper("RULE:broken")
