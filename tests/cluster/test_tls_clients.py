"""SSL listeners with real clients: confluent-kafka, kafka-python, aiokafka and kcat each produce and
consume over SSL and over mTLS (ssl.client.auth=required), verifying the broker's certificate and its
host name (127.0.0.1 in subjectAltName). Two brokers replicate over an SSL inter-broker listener
(security.inter.broker.protocol=SSL, the broker's own outgoing TLS with host-name verification);
broker 0 reads a PEM keystore with an encrypted key, broker 1 a PKCS12 keystore. Answers larger than
the sendfile threshold are copied through TLS, not sent with sendfile."""
from __future__ import annotations

import uuid

import pytest

from kbroker.security.certs import loopback_pki
from kbroker.testing import LocalCluster, free_port, wait_until
from secure_clients import aiokafka_round_trip, confluent_round_trip, kafka_python_round_trip, kcat_round_trip

TIMEOUT_S = 30
N = 200


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    pki = root / "pki"
    pki.mkdir()
    ca = loopback_pki(pki, password="keypw", pkcs12_password="storepw")
    ca.issue_to(pki / "client.pem", {"CN": "alice"}, client=True)
    c = LocalCluster(root / "cluster", brokers=2, overrides={
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
        "security.inter.broker.protocol": "SSL",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki / "ca.pem"),
        "listener.name.mtls.ssl.client.auth": "required",
        "offsets.topic.replication.factor": 1})
    c.ssl_ports, c.mtls_ports, c.metrics_ports = {}, {}, {}
    for b in c.brokers.values():
        s, m = free_port(), free_port()
        c.ssl_ports[b.broker_id], c.mtls_ports[b.broker_id] = s, m
        c.metrics_ports[b.broker_id] = free_port()
        b.extra = {"listeners": f"PLAINTEXT://127.0.0.1:{b.port},SSL://127.0.0.1:{s},MTLS://127.0.0.1:{m}",
                   "kbroker.metrics.port": c.metrics_ports[b.broker_id]}
        if b.broker_id == 0:
            b.extra |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki / "broker.pem"),
                        "ssl.key.password": "keypw"}
        else:
            b.extra |= {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(pki / "broker.p12"),
                        "ssl.keystore.password": "storepw"}
    c.pki = pki
    with c:
        yield c


def bootstrap(c, mtls):
    ports = c.mtls_ports if mtls else c.ssl_ports
    return ",".join(f"127.0.0.1:{p}" for p in ports.values())


def make_topic(c, mtls):
    from confluent_kafka.admin import AdminClient, NewTopic
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(confluent_conf(c, mtls))
    admin.create_topics([NewTopic(topic, 1, 2)])[topic].result(TIMEOUT_S)
    return topic


def confluent_conf(c, mtls):
    conf = {"bootstrap.servers": bootstrap(c, mtls), "security.protocol": "SSL",
            "ssl.ca.location": str(c.pki / "ca.pem")}
    if mtls:
        conf |= {"ssl.certificate.location": str(c.pki / "client.pem"),
                 "ssl.key.location": str(c.pki / "client.pem")}
    return conf


def values(n=N, size=10):
    return [(b"%06d-" % i) + b"x" * size for i in range(n)]


def run_confluent(c, topic, mtls, want):
    return confluent_round_trip(confluent_conf(c, mtls), topic, want)


def _python_kw(c, mtls):
    kw = dict(bootstrap_servers=bootstrap(c, mtls), security_protocol="SSL", ssl_cafile=str(c.pki / "ca.pem"))
    if mtls:
        kw |= dict(ssl_certfile=str(c.pki / "client.pem"), ssl_keyfile=str(c.pki / "client.pem"))
    return kw


def run_kafka_python(c, topic, mtls, want):
    return kafka_python_round_trip(_python_kw(c, mtls), topic, want)


def run_aiokafka(c, topic, mtls, want):
    from aiokafka.helpers import create_ssl_context
    ctx = create_ssl_context(cafile=str(c.pki / "ca.pem"), **(dict(certfile=str(c.pki / "client.pem")) if mtls else {}))
    return aiokafka_round_trip(dict(bootstrap_servers=bootstrap(c, mtls), security_protocol="SSL", ssl_context=ctx),
                               topic, want)


def run_kcat(c, topic, mtls, want):
    x = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={c.pki / 'ca.pem'}"]
    if mtls:
        x += ["-X", f"ssl.certificate.location={c.pki / 'client.pem'}",
              "-X", f"ssl.key.location={c.pki / 'client.pem'}"]
    return kcat_round_trip(bootstrap(c, mtls), x, topic, want)


CLIENTS = {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka,
           "kcat": run_kcat}


@pytest.mark.parametrize("mtls", [False, True], ids=["ssl", "mtls"])
@pytest.mark.parametrize("client", list(CLIENTS))
def test_client_round_trip(tls_cluster, client, mtls):
    topic = make_topic(tls_cluster, mtls)
    want = values()
    assert CLIENTS[client](tls_cluster, topic, mtls, want) == want


def test_mtls_refuses_a_client_without_certificate(tls_cluster):
    from confluent_kafka.admin import AdminClient
    conf = confluent_conf(tls_cluster, False) | {"bootstrap.servers": bootstrap(tls_cluster, True)}
    with pytest.raises(Exception):
        AdminClient(conf).list_topics(timeout=5)


def test_large_fetch_over_tls_and_replicated(tls_cluster):
    """Fetch answers above the sendfile threshold (64 KiB) go through TLS as copies; RF=2 replicated
    over the SSL inter-broker listener: both replicas in the ISR."""
    from confluent_kafka.admin import AdminClient
    topic = make_topic(tls_cluster, False)
    want = values(300, 4000)       # ~1.2 MB
    assert run_confluent(tls_cluster, topic, False, want) == want
    admin = AdminClient(confluent_conf(tls_cluster, False))
    wait_until(lambda: sorted(admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions[0].isrs) == [0, 1],
               TIMEOUT_S, "both replicas in the ISR over SSL")


def tls_reads(c) -> dict[str, float]:
    """kbroker_network_tls_reads by path, summed over the brokers' /metrics."""
    import urllib.request
    out = {"native": 0.0, "python": 0.0}
    for port in c.metrics_ports.values():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith("kbroker_network_tls_reads_total{"):
                name, value = line.rsplit(" ", 1)
                out[name.split('path="')[1].split('"')[0]] += float(value)
    return out


def test_confluent_over_ssl_on_the_native_tls_read_path(tls_cluster):
    """The brokers decrypt TLS records natively (kbroker._native.tls): a confluent-kafka round trip of
    ~1 MB over SSL grows the native read count and leaves the Python one where it was."""
    topic = make_topic(tls_cluster, False)
    before = tls_reads(tls_cluster)
    want = values(250, 4000)
    assert run_confluent(tls_cluster, topic, False, want) == want
    after = tls_reads(tls_cluster)
    assert after["native"] - before["native"] >= 10, (before, after)
    assert after["python"] == before["python"] == 0, (before, after)
