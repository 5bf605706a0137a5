"""Certificate reload without restart: IncrementalAlterConfigs / AlterConfigs on this broker's BROKER
resource replace the SSL listener's keystore (a new key and certificate from the same CA). New TLS
connections see the new certificate, a connection opened before keeps working, confluent-kafka still
produces and consumes; a keystore that does not load is refused naming the key and changes nothing;
the keystore password is stored encoded in /config/brokers/<id>, a restart keeps the new keystore,
and deleting the dynamic keys serves the static one again."""
from __future__ import annotations

import ssl
import uuid

import pytest

from checkers import RawConn
from kbroker.security.certs import CA, LOOPBACK
from kbroker.testing import LocalCluster, free_port
from secure_clients import confluent_round_trip

TIMEOUT_S = 30
INVALID_REQUEST = 42
SECRET = "encoder-secret"


@pytest.fixture
def cluster(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = CA.create()
    (pki / "ca.pem").write_bytes(ca.pem())
    certs = {}
    for name in ("old", "new"):
        _key, cert = ca.issue_to(pki / f"{name}.pem", {"CN": "broker"}, list(LOOPBACK), password="keypw",
                                 pkcs12_password="storepw")
        certs[name] = cert.serial_number
    c = LocalCluster(tmp_path / "cluster", brokers=1, overrides={
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL",
        "password.encoder.secret": SECRET})
    c.ssl_port = free_port()
    b = c.brokers[0]
    b.extra = {"listeners": f"PLAINTEXT://127.0.0.1:{b.port},SSL://127.0.0.1:{c.ssl_port}",
               "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki / "old.pem"),
               "ssl.key.password": "keypw"}
    c.pki, c.serials, c.ca = pki, certs, ca
    with c:
        yield c


def tls_conn(c) -> RawConn:
    """A Kafka connection to the SSL listener, verifying the broker's certificate and host name."""
    conn = RawConn(f"127.0.0.1:{c.ssl_port}")
    ctx = ssl.create_default_context(cafile=str(c.pki / "ca.pem"))
    conn.sock = ctx.wrap_socket(conn.sock, server_hostname="127.0.0.1")
    return conn


def serial(conn: RawConn) -> int:
    return int(conn.sock.getpeercert()["serialNumber"], 16)


def served_serial(c) -> int:
    with tls_conn(c) as conn:
        return serial(conn)


def incremental(c, configs: dict[str, str | None]):
    """IncrementalAlterConfigs through confluent-kafka: SET each key, DELETE it where the value is None."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    res = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry(k, v or "", incremental_operation=AlterConfigOpType.SET if v is not None else
                    AlterConfigOpType.DELETE) for k, v in configs.items()])
    return admin.incremental_alter_configs([res])[res].result(TIMEOUT_S)


def stored_config(c) -> dict:
    import json
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=c.zk_connect, timeout=5)
    zk.start(timeout=5)
    try:
        data, _ = zk.get("/config/brokers/0")
    finally:
        zk.stop()
        zk.close()
    return json.loads(data)["config"]


def round_trip(c):
    topic = f"reload-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": f"127.0.0.1:{c.ssl_port}", "security.protocol": "SSL",
            "ssl.ca.location": str(c.pki / "ca.pem")}
    want = [b"%04d" % i for i in range(50)]
    assert confluent_round_trip(conf, topic, want) == want


def test_keystore_reload(cluster):
    from confluent_kafka import KafkaException
    c = cluster
    assert served_serial(c) == c.serials["old"]
    before = tls_conn(c)
    try:
        # a wrong keystore password is refused, naming the keys, and nothing changes
        with pytest.raises(KafkaException) as bad:
            incremental(c, {"listener.name.ssl.ssl.keystore.type": "PKCS12",
                            "listener.name.ssl.ssl.keystore.location": str(c.pki / "new.p12"),
                            "listener.name.ssl.ssl.keystore.password": "wrong"})
        assert bad.value.args[0].code() == INVALID_REQUEST
        assert "listener.name.ssl.ssl.keystore.password" in bad.value.args[0].str()
        assert served_serial(c) == c.serials["old"]

        incremental(c, {"listener.name.ssl.ssl.keystore.type": "PKCS12",
                        "listener.name.ssl.ssl.keystore.location": str(c.pki / "new.p12"),
                        "listener.name.ssl.ssl.keystore.password": "storepw"})
        assert served_serial(c) == c.serials["new"]
        # the connection accepted before the reload keeps its context and is served
        assert serial(before) == c.serials["old"]
        assert before.request(18, 0, {})["error_code"] == 0
    finally:
        before.close()
    round_trip(c)

    stored = stored_config(c)
    assert stored["listener.name.ssl.ssl.keystore.location"] == str(c.pki / "new.p12")
    assert "storepw" not in stored["listener.name.ssl.ssl.keystore.password"]
    assert "encyrptedPassword:" in stored["listener.name.ssl.ssl.keystore.password"]

    # kafka-python's AlterConfigs (33) with a keystore that does not exist: refused, the new one still served
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=c.bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        resp = admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "0", configs={
            "listener.name.ssl.ssl.keystore.location": str(c.pki / "missing.p12")})], incremental=False)
    finally:
        admin.close()
    result = str(resp["broker"]["0"])
    assert "[Error 42]" in result
    assert "listener.name.ssl.ssl.keystore.location" in result and "missing.p12" in result
    assert stored_config(c) == stored
    assert served_serial(c) == c.serials["new"]

    # a restart reads the dynamic keystore back from ZooKeeper
    c.stop_broker(0)
    c.start_broker(0)
    assert served_serial(c) == c.serials["new"]
    round_trip(c)

    # deleting the dynamic keys brings the static keystore back
    incremental(c, {"listener.name.ssl.ssl.keystore.type": None, "listener.name.ssl.ssl.keystore.location": None,
                    "listener.name.ssl.ssl.keystore.password": None})
    assert served_serial(c) == c.serials["old"]


def test_keystore_is_per_broker(cluster):
    """The cluster-wide default resource ("") cannot carry a keystore, as in Kafka. A raw request: both
    clients refuse an empty broker name (kafka-configs.sh --entity-default sends it)."""
    c = cluster
    with RawConn(f"127.0.0.1:{c.brokers[0].port}") as conn:
        resp = conn.request(44, 1, {"resources": [{"resource_type": 4, "resource_name": "", "configs": [
            {"name": "ssl.keystore.location", "config_operation": 0, "value": str(c.pki / "new.pem")}]}],
            "validate_only": False})
    r = resp["responses"][0]
    assert r["error_code"] == INVALID_REQUEST
    assert "broker id must be specified: ssl.keystore.location" in r["error_message"]
    assert served_serial(c) == c.serials["old"]


def test_a_new_certificate_keeps_the_subject_and_names(cluster):
    """As Kafka's keystore update check: a certificate of another subject, or one that drops a
    SubjectAltName of the served one, is refused (INVALID_REQUEST naming the key that would allow it)
    and nothing changes; one that adds a name is taken; with ssl.allow.dn.changes and
    ssl.allow.san.changes set on the listener both changes are taken."""
    from confluent_kafka import KafkaException
    c = cluster
    serials = {}
    for name, dn, hosts in (("other-dn", "other", ["127.0.0.1", "localhost"]), ("fewer", "broker", ["127.0.0.1"]),
                            ("more", "broker", ["127.0.0.1", "localhost", "broker.example"]),
                            ("free", "other", ["127.0.0.1"])):
        key, cert = c.ca.issue({"CN": dn}, hosts)
        serials[name] = cert.serial_number
        c.ca.write_pem_keystore(c.pki / f"{name}.pem", key, cert, password="keypw")

    def reload(name):
        incremental(c, {"listener.name.ssl.ssl.keystore.type": "PEM",
                        "listener.name.ssl.ssl.keystore.location": str(c.pki / f"{name}.pem")})

    for name, key in (("other-dn", "ssl.allow.dn.changes"), ("fewer", "ssl.allow.san.changes")):
        with pytest.raises(KafkaException) as bad:
            reload(name)
        assert bad.value.args[0].code() == INVALID_REQUEST
        assert key in bad.value.args[0].str(), bad.value.args[0].str()
        assert served_serial(c) == c.serials["old"]
    reload("more")
    assert served_serial(c) == serials["more"]
    round_trip(c)
    c.stop_broker(0)
    c.brokers[0].extra.update({"listener.name.ssl.ssl.allow.dn.changes": "true",
                               "listener.name.ssl.ssl.allow.san.changes": "true"})
    c.start_broker(0)
    assert served_serial(c) == serials["more"]      # the dynamic keystore, read back at start
    reload("free")
    assert served_serial(c) == serials["free"]
