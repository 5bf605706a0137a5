"""kbroker.security.certs: the loopback PKI the local cluster and the TLS tests use."""
import socket
import ssl
import threading

from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from kbroker.security.certs import loopback_pki


def test_loopback_pki_serves_a_tls_handshake_verified_by_host_name(tmp_path):
    ca = loopback_pki(tmp_path, password="kpw", pkcs12_password="spw")
    ca.issue_to(tmp_path / "alice.pem", {"CN": "alice"}, client=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(tmp_path / "broker.pem"), password="kpw")
    server.load_verify_locations(str(tmp_path / "ca.pem"))
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))   # checks the host name
    client.load_cert_chain(str(tmp_path / "alice.pem"))
    hosts = ("127.0.0.1", "localhost")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        seen = []

        def serve():
            for _ in hosts:
                conn, _ = listener.accept()
                with server.wrap_socket(conn, server_side=True) as tls:
                    seen.append(tls.getpeercert()["subject"])
                    tls.sendall(b"ok")
        t = threading.Thread(target=serve)
        t.start()
        for host in hosts:
            with socket.create_connection(listener.getsockname()) as raw, \
                    client.wrap_socket(raw, server_hostname=host) as tls:
                assert tls.recv(2) == b"ok"
        t.join(10)
        assert seen == [((("commonName", "alice"),),)] * 2


def test_pkcs12_beside_the_pem_keystore_holds_the_same_certificate(tmp_path):
    loopback_pki(tmp_path, name="zookeeper", pkcs12_password="spw")
    pem_cert = x509.load_pem_x509_certificates((tmp_path / "zookeeper.pem").read_bytes())[0]
    _key, p12_cert, chain = pkcs12.load_key_and_certificates((tmp_path / "zookeeper.p12").read_bytes(), b"spw")
    assert p12_cert == pem_cert
    assert chain[0] == x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    assert pem_cert.subject.rfc4514_string() == "CN=zookeeper"
