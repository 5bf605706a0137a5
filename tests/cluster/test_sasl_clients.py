"""SASL with real clients: confluent-kafka, kafka-python, aiokafka and kcat each produce and consume
over SASL_PLAINTEXT and SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512. PLAIN's users come from
the listener's JAAS config; SCRAM credentials from ZooKeeper /config/users/<user> in Kafka's format.
Two brokers replicate over a SASL_SSL inter-broker listener (PLAIN, the admin user). Bad input: a
wrong password gets SASL_AUTHENTICATION_FAILED and the connection closes after the delay; an unknown
mechanism gets UNSUPPORTED_SASL_MECHANISM; a request before authentication closes the connection; an
oversized token is refused."""
from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
from kazoo.client import KazooClient

from kbroker.protocol import api
from kbroker.security.certs import loopback_pki
from kbroker.security.sasl.scram import ScramCredential
from kbroker.testing import LocalCluster, free_port, wait_until
from kbroker.zk.credentials import alter_user_config
from secure_clients import aiokafka_round_trip, confluent_round_trip, kafka_python_round_trip, kcat_round_trip

TIMEOUT_S = 30
N = 100
FAILED_DELAY_MS = 800
USERS = {"alice": "alice-secret", "admin": "admin-secret"}
PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("sasl")
    loopback_pki(root)
    props = {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
             "security.inter.broker.protocol": "SASL_SSL", "sasl.mechanism.inter.broker.protocol": "PLAIN",
             "sasl.enabled.mechanisms": ",".join(MECHANISMS),
             "connection.failed.authentication.delay.ms": FAILED_DELAY_MS,
             "ssl.keystore.type": "PEM", "ssl.keystore.location": str(root / "broker.pem"),
             "ssl.truststore.type": "PEM", "ssl.truststore.location": str(root / "ca.pem"),
             "offsets.topic.replication.factor": 1}
    for listener in ("sasl_plaintext", "sasl_ssl"):
        props[f"listener.name.{listener}.plain.sasl.jaas.config"] = PLAIN_JAAS
    c = LocalCluster(root / "cluster", brokers=2, overrides=props)
    c.ports = {"SASL_PLAINTEXT": {}, "SASL_SSL": {}}
    for b in c.brokers.values():
        sp, ss = free_port(), free_port()
        c.ports["SASL_PLAINTEXT"][b.broker_id], c.ports["SASL_SSL"][b.broker_id] = sp, ss
        b.extra = {"listeners": f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{sp},"
                                f"SASL_SSL://127.0.0.1:{ss}"}
    c.ca = root / "ca.pem"
    with c:
        zk = KazooClient(hosts=c.zk_connect, timeout=5)
        zk.start(timeout=5)
        try:
            for user, pw in USERS.items():
                alter_user_config(zk, user, {m: ScramCredential.from_password(m, pw, 4096).encode()
                                             for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")})
        finally:
            zk.stop()
            zk.close()
        yield c


def bootstrap(c, protocol):
    return ",".join(f"127.0.0.1:{p}" for p in c.ports[protocol].values())


def confluent_conf(c, protocol, mechanism, password=USERS["alice"]):
    conf = {"bootstrap.servers": bootstrap(c, protocol), "security.protocol": protocol,
            "sasl.mechanism": mechanism, "sasl.username": "alice", "sasl.password": password}
    if protocol == "SASL_SSL":
        conf["ssl.ca.location"] = str(c.ca)
    return conf


def make_topic(c, protocol, mechanism):
    from confluent_kafka.admin import AdminClient, NewTopic
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(confluent_conf(c, protocol, mechanism))
    admin.create_topics([NewTopic(topic, 1, 2)])[topic].result(TIMEOUT_S)
    return topic


def run_confluent(c, protocol, mechanism, topic, want):
    return confluent_round_trip(confluent_conf(c, protocol, mechanism), topic, want)


def _python_kw(c, protocol, mechanism):
    kw = dict(bootstrap_servers=bootstrap(c, protocol), security_protocol=protocol, sasl_mechanism=mechanism,
              sasl_plain_username="alice", sasl_plain_password=USERS["alice"])
    if protocol == "SASL_SSL":
        kw["ssl_cafile"] = str(c.ca)
    return kw


def run_kafka_python(c, protocol, mechanism, topic, want):
    return kafka_python_round_trip(_python_kw(c, protocol, mechanism), topic, want)


def run_aiokafka(c, protocol, mechanism, topic, want):
    from aiokafka.helpers import create_ssl_context
    kw = _python_kw(c, protocol, mechanism)
    if kw.pop("ssl_cafile", None):
        kw["ssl_context"] = create_ssl_context(cafile=str(c.ca))
    return aiokafka_round_trip(kw, topic, want)


def run_kcat(c, protocol, mechanism, topic, want):
    x = ["-X", f"security.protocol={protocol}", "-X", f"sasl.mechanisms={mechanism}",
         "-X", "sasl.username=alice", "-X", f"sasl.password={USERS['alice']}"]
    if protocol == "SASL_SSL":
        x += ["-X", f"ssl.ca.location={c.ca}"]
    return kcat_round_trip(bootstrap(c, protocol), x, topic, want)


CLIENTS = {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka,
           "kcat": run_kcat}


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("client", list(CLIENTS))
def test_client_round_trip(sasl_cluster, client, protocol, mechanism):
    topic = make_topic(sasl_cluster, protocol, mechanism)
    want = [b"%05d-%s" % (i, mechanism.encode()) for i in range(N)]
    assert CLIENTS[client](sasl_cluster, protocol, mechanism, topic, want) == want


# ---- bad input, on raw sockets -----------------------------------------------------------------

def _send(s, key, version, body, cid=1):
    s.sendall(api.encode_request(key, version, cid, "t", body))


def _recv_frame(s):
    head = b""
    while len(head) < 4:
        got = s.recv(4 - len(head))
        if not got:
            return None
        head += got
    size = struct.unpack(">i", head)[0]
    body = b""
    while len(body) < size:
        got = s.recv(size - len(body))
        if not got:
            return None
        body += got
    return body


def _plaintext_sasl_port(c):
    return c.ports["SASL_PLAINTEXT"][0]


def test_wrong_password_fails_then_closes_after_the_delay(sasl_cluster):
    from confluent_kafka.admin import AdminClient
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError as KPError
    # confluent-kafka: the metadata request never gets through
    bad = AdminClient(confluent_conf(sasl_cluster, "SASL_PLAINTEXT", "SCRAM-SHA-512", password="wrong"))
    with pytest.raises(Exception):
        bad.list_topics(timeout=5)
    with pytest.raises(KPError):
        KafkaAdminClient(bootstrap_servers=bootstrap(sasl_cluster, "SASL_PLAINTEXT"), security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism="PLAIN", sasl_plain_username="alice", sasl_plain_password="wrong",
                         request_timeout_ms=5000)
    # raw: error 58 in the answer, then the close, no earlier than the delay
    with socket.create_connection(("127.0.0.1", _plaintext_sasl_port(sasl_cluster)), timeout=5) as s:
        _send(s, 17, 1, {"mechanism": "PLAIN"})
        assert _recv_frame(s) is not None
        _send(s, 36, 1, {"auth_bytes": b"\0alice\0wrong"}, cid=2)
        t0 = time.monotonic()
        frame = _recv_frame(s)
        assert frame is not None and struct.unpack_from(">h", frame, 4)[0] == 58
        s.settimeout(10)
        assert s.recv(10) == b""
        assert time.monotonic() - t0 >= FAILED_DELAY_MS / 1000 * 0.9


def test_unknown_mechanism_and_requests_before_authentication(sasl_cluster):
    port = _plaintext_sasl_port(sasl_cluster)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        _send(s, 17, 1, {"mechanism": "GSSAPI"})
        frame = _recv_frame(s)
        assert struct.unpack_from(">h", frame, 4)[0] == 33      # UNSUPPORTED_SASL_MECHANISM
        s.settimeout(10)
        assert s.recv(10) == b""
    # Metadata before authentication: closed at once, no answer
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        _send(s, 3, 1, {"topics": None})
        s.settimeout(10)
        assert s.recv(10) == b""
    # ApiVersions is answered before authentication
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        _send(s, 18, 0, {})
        assert _recv_frame(s) is not None
    # a Produce between the handshake and the authentication: closed
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        _send(s, 17, 1, {"mechanism": "PLAIN"})
        assert _recv_frame(s) is not None
        _send(s, 3, 1, {"topics": None}, cid=2)
        s.settimeout(10)
        assert s.recv(10) == b""


def test_oversized_token_and_scram_nonce_mismatch(sasl_cluster):
    port = _plaintext_sasl_port(sasl_cluster)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        _send(s, 17, 1, {"mechanism": "SCRAM-SHA-256"})
        assert _recv_frame(s) is not None
        s.sendall(struct.pack(">i", 10 << 20) + b"\0" * 1024)   # a 10 MiB frame before authentication
        s.settimeout(10)
        assert s.recv(10) == b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        _send(s, 17, 1, {"mechanism": "SCRAM-SHA-256"})
        assert _recv_frame(s) is not None
        _send(s, 36, 1, {"auth_bytes": b"n,,n=alice,r=abc"}, cid=2)
        frame = _recv_frame(s)
        assert struct.unpack_from(">h", frame, 4)[0] == 0
        _send(s, 36, 1, {"auth_bytes": b"c=biws,r=abcWRONG,p=AAAA"}, cid=3)
        frame = _recv_frame(s)
        assert struct.unpack_from(">h", frame, 4)[0] == 58
        s.settimeout(10)
        assert s.recv(10) == b""


def test_inter_broker_over_sasl_ssl(sasl_cluster):
    """RF=2 over the SASL_SSL inter-broker listener: both replicas in the ISR."""
    from confluent_kafka.admin import AdminClient
    topic = make_topic(sasl_cluster, "SASL_SSL", "PLAIN")
    want = [b"r%d" % i for i in range(50)]
    assert run_confluent(sasl_cluster, "SASL_SSL", "PLAIN", topic, want) == want
    admin = AdminClient(confluent_conf(sasl_cluster, "SASL_SSL", "PLAIN"))
    wait_until(lambda: sorted(admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions[0].isrs) == [0, 1],
               TIMEOUT_S, "both replicas in the ISR over SASL_SSL")
