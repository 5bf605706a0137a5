"""ZooKeeper client TLS: Debian's ZooKeeper serves a secureClientPort (Netty, PEM keystore, client
certificates required) and a broker configured with Kafka's zookeeper.ssl.* keys (its key encrypted
with zookeeper.ssl.keystore.password) registers through it and serves clients; a plaintext client,
and a TLS client without a certificate, are refused on the secure port."""
from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from kbroker.security.certs import CA
from kbroker.testing import LocalCluster
from kbroker.zk.client import NETTY_SOCKET, kazoo_tls
from kbroker.zk.local import ServerTls, start_zookeeper


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("zkpki")
    ca = CA.create()
    (d / "ca.pem").write_bytes(ca.pem())
    key, cert = ca.issue({"CN": "zookeeper"}, ["127.0.0.1", "localhost"])
    ca.write_pem_keystore(d / "zk.pem", key, cert)
    key, cert = ca.issue({"CN": "broker"}, client=True)
    ca.write_pem_keystore(d / "broker.pem", key, cert, password="zkpw")
    return d


@pytest.fixture(scope="module")
def zk(pki, tmp_path_factory):
    proc = start_zookeeper(tmp_path_factory.mktemp("zk"), tick_time_ms=1000, die_with_parent=True,
                           tls=ServerTls(str(pki / "zk.pem"), str(pki / "ca.pem")))
    yield proc
    proc.stop()


def refused(**kw) -> bool:
    z = KazooClient(timeout=3, connection_retry=KazooRetry(max_tries=1), **kw)
    try:
        z.start(timeout=5)
        return False
    except Exception:
        return True
    finally:
        z.stop()
        z.close()


def test_broker_registers_over_tls(zk, pki, tmp_path):
    tls = {"zookeeper.ssl.client.enable": "true", "zookeeper.clientCnxnSocket": NETTY_SOCKET,
           "zookeeper.ssl.keystore.location": str(pki / "broker.pem"), "zookeeper.ssl.keystore.password": "zkpw",
           "zookeeper.ssl.truststore.location": str(pki / "ca.pem")}
    # The broker knows only the secure port; LocalCluster waits for it through the plaintext one.
    with LocalCluster(tmp_path / "cluster", zookeeper_connect=zk.connect_string,
                      overrides={"zookeeper.connect": zk.secure_connect_string} | tls) as c:
        plain = KazooClient(hosts=zk.connect_string, timeout=5)
        plain.start(timeout=5)
        try:
            assert plain.exists("/brokers/ids/0") is not None
        finally:
            plain.stop()
            plain.close()
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic
        admin = KafkaAdminClient(bootstrap_servers=c.bootstrap, request_timeout_ms=30000)
        try:
            topic = f"zktls-{uuid.uuid4().hex[:8]}"
            admin.create_topics([NewTopic(topic, 1, 1)])
            assert topic in admin.list_topics()
        finally:
            admin.close()
    # the same keys give kazoo a working TLS session
    z = KazooClient(hosts=zk.secure_connect_string, timeout=5, **kazoo_tls(tls.get))
    z.start(timeout=10)
    try:
        assert z.exists("/brokers/topics/" + topic) is not None
    finally:
        z.stop()
        z.close()


def test_secure_port_refuses_plaintext_and_anonymous_tls(zk, pki):
    assert refused(hosts=zk.secure_connect_string)
    assert refused(hosts=zk.secure_connect_string, use_ssl=True, ca=str(pki / "ca.pem"))


def test_only_pem_stores(pki):
    keys = {"zookeeper.ssl.client.enable": True, "zookeeper.ssl.keystore.location": str(pki / "broker.p12")}
    with pytest.raises(ValueError, match="zookeeper.ssl.keystore.type: .* PEM files only, not P12"):
        kazoo_tls(keys.get)
    keys |= {"zookeeper.ssl.keystore.location": str(pki / "broker.pem"), "zookeeper.clientCnxnSocket": "x.Nio"}
    with pytest.raises(ValueError, match="zookeeper.clientCnxnSocket must be"):
        kazoo_tls(keys.get)
    assert kazoo_tls({}.get) is None
