"""ZooKeeper client TLS: Debian's ZooKeeper serves a secureClientPort (Netty, PEM keystore, client
certificates required) and a broker configured with Kafka's zookeeper.ssl.* keys (its key encrypted
with zookeeper.ssl.keystore.password) registers through it and serves clients; a plaintext client,
and a TLS client without a certificate, are refused on the secure port. A LocalCluster and the ZooKeeper
tools (--zk-tls-config-file) work through the TLS port alone. With host-name verification
(zookeeper.ssl.endpoint.identification.algorithm=HTTPS, the default) a ZooKeeper whose certificate names
another host is refused at once with a log line that says why; with the key empty it is accepted."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from kbroker.security.certs import loopback_pki
from kbroker.testing import LocalCluster
from kbroker.zk.client import NETTY_SOCKET, BrokerZk, ZkClientError, kazoo_tls
from kbroker.zk.local import ServerTls, start_zookeeper


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("zkpki")
    ca = loopback_pki(d, name="zookeeper")
    ca.issue_to(d / "zk-misnamed.pem", {"CN": "zookeeper"}, ["zookeeper.invalid"])
    ca.issue_to(d / "broker.pem", {"CN": "broker"}, client=True, password="zkpw")
    return d


def _tls_zookeeper(pki, tmp_path_factory, keystore: str):
    proc = start_zookeeper(tmp_path_factory.mktemp("zk"), tick_time_ms=1000, die_with_parent=True,
                           tls=ServerTls(str(pki / keystore), str(pki / "ca.pem")))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def zk(pki, tmp_path_factory):
    yield from _tls_zookeeper(pki, tmp_path_factory, "zookeeper.pem")


@pytest.fixture(scope="module")
def misnamed_zk(pki, tmp_path_factory):
    """A ZooKeeper whose certificate (from the trusted CA) names only zookeeper.invalid."""
    yield from _tls_zookeeper(pki, tmp_path_factory, "zk-misnamed.pem")


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
    """A LocalCluster given only the TLS port and Kafka's zookeeper.ssl.* keys: its brokers and its own
    ZooKeeper clients (the readiness wait) use TLS; then kbroker reassign-partitions --zk-tls-config-file
    reads the topic's assignment through the same port."""
    tls = {"zookeeper.ssl.client.enable": "true", "zookeeper.clientCnxnSocket": NETTY_SOCKET,
           "zookeeper.ssl.keystore.location": str(pki / "broker.pem"), "zookeeper.ssl.keystore.password": "zkpw",
           "zookeeper.ssl.truststore.location": str(pki / "ca.pem")}
    with LocalCluster(tmp_path / "cluster", zookeeper_connect=zk.secure_connect_string, zk_tls=tls) as c:
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
        tls_file = tmp_path / "zk-tls.properties"
        tls_file.write_text("".join(f"{k}={v}\n" for k, v in tls.items()) + "bootstrap.servers=ignored:1\n")
        moves = tmp_path / "topics.json"
        moves.write_text(json.dumps({"version": 1, "topics": [{"topic": topic}]}))
        done = subprocess.run([sys.executable, "-m", "kbroker", "reassign-partitions", "--zookeeper",
                               zk.secure_connect_string, "--zk-tls-config-file", str(tls_file), "--generate",
                               "--topics-to-move-json-file", str(moves), "--broker-list", "0"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "Current partition replica assignment" in done.stdout and topic in done.stdout
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


def client_keys(pki, **more) -> dict:
    return {"zookeeper.ssl.client.enable": True, "zookeeper.ssl.keystore.location": str(pki / "broker.pem"),
            "zookeeper.ssl.keystore.password": "zkpw", "zookeeper.ssl.truststore.location": str(pki / "ca.pem"),
            **more}


def test_a_certificate_for_another_host_is_refused(misnamed_zk, pki, caplog):
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="kbroker.zk"):
        with pytest.raises(ZkClientError, match="zookeeper.ssl.endpoint.identification.algorithm"):
            BrokerZk(misnamed_zk.secure_connect_string, 0, connect_timeout_s=30,
                     tls=kazoo_tls(client_keys(pki).get)).start()
    assert time.monotonic() - t0 < 10      # at once, not after the connect timeout
    lines = [r.getMessage() for r in caplog.records if r.name == "kbroker.zk"]
    assert any(f"ZooKeeper at {misnamed_zk.secure_connect_string} presented a TLS certificate that failed "
               "verification" in m and "127.0.0.1" in m for m in lines), lines
    # kazoo itself, with the same keys, never gets a session
    assert refused(hosts=misnamed_zk.secure_connect_string, **kazoo_tls(client_keys(pki).get))
    # host-name verification off (an explicit empty value, as Kafka): the CA's certificate is enough
    z = BrokerZk(misnamed_zk.secure_connect_string, 0, connect_timeout_s=30,
                 tls=kazoo_tls(client_keys(pki, **{"zookeeper.ssl.endpoint.identification.algorithm": ""}).get))
    z.start()
    try:
        assert z.kazoo.exists("/brokers") is not None
    finally:
        z.close()


def test_endpoint_identification_values(pki):
    assert kazoo_tls(client_keys(pki).get)["check_hostname"] is True
    assert kazoo_tls(client_keys(pki, **{"zookeeper.ssl.endpoint.identification.algorithm": "https"}).get)[
        "check_hostname"] is True
    with pytest.raises(ValueError, match="zookeeper.ssl.endpoint.identification.algorithm: HTTPS .* not SHA"):
        kazoo_tls(client_keys(pki, **{"zookeeper.ssl.endpoint.identification.algorithm": "SHA"}).get)
